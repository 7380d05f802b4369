//! The guard end to end: a hyper client stacked with `GuardLayer` against rmcp's own
//! Streamable HTTP server on 127.0.0.1, with faults injected between them. The server's
//! side-effect counters are the ground truth.

use mcp_replay_guard_test_support as support;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::{FingerprintKey, FingerprintRules},
    guard::{Authorization, AuthorizationRequest, Authorize, Guard, GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, retry::Retry};

type Inner = Client<HttpConnector, GuardRequestBody>;

fn registry() -> ContractRegistry {
    ContractRegistry::builder()
        .tool(
            "deploy_release",
            ToolContract::irreversible()
                .fingerprint(FingerprintRules::new().secret("/approval_token")),
        )
        .tool("create_payment", ToolContract::idempotent())
        .tool("rotate_credential", ToolContract::recoverable())
        .tool("slow_deploy", ToolContract::irreversible())
        .tool("list_branches", ToolContract::read_only())
        .build()
        .unwrap()
}

fn layer(ledger: &MemoryLedger) -> GuardLayer {
    layer_with(ledger, registry())
}

fn layer_with(ledger: &MemoryLedger, registry: ContractRegistry) -> GuardLayer {
    GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:5f8097"))
}

fn guarded(layer: &GuardLayer) -> Guard<Inner> {
    layer.layer(hyper_client_with_body::<GuardRequestBody>())
}

fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

async fn session(server: &TestServer) -> Option<String> {
    initialize(&mut hyper_client(), &server.url).await.unwrap()
}

/// A server with an initialized session and an empty ledger.
struct Fixture {
    server: TestServer,
    session: Option<String>,
    ledger: MemoryLedger,
}

impl Fixture {
    async fn start() -> Self {
        Self::on(TestServer::start().await).await
    }

    /// A fixture whose slow tool takes `delay`.
    async fn with_slow_tool(delay: std::time::Duration) -> Self {
        Self::on(
            TestServer::start_with(ServerOptions {
                slow_tool_delay: delay,
                ..ServerOptions::default()
            })
            .await,
        )
        .await
    }

    async fn on(server: TestServer) -> Self {
        let session = session(&server).await;
        Self {
            server,
            session,
            ledger: MemoryLedger::new(),
        }
    }
}

/// A `tools/call` in the fixture's session; panics if the exchange fails.
async fn call<S, RB>(
    client: &mut S,
    server: &TestServer,
    session: &Option<String>,
    id: i64,
    tool: &str,
    args: Value,
) -> Value
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: http_body::Body,
    RB::Error: Into<BoxError>,
{
    let response = call_tool(client, &server.url, session.as_deref(), id, tool, args).await;
    response.unwrap_or_else(|e| panic!("tools/call {tool} failed: {}", error_chain(&*e)))
}

/// [`call`] of `deploy_release` with [`deploy_args`].
async fn deploy<S, RB>(
    client: &mut S,
    server: &TestServer,
    session: &Option<String>,
    id: i64,
) -> Value
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: http_body::Body,
    RB::Error: Into<BoxError>,
{
    call(client, server, session, id, "deploy_release", deploy_args()).await
}

fn guard_answer(response: &Value) -> &Value {
    response
        .pointer("/result/structuredContent/mcp_replay_guard")
        .unwrap_or_else(|| panic!("not a guard answer: {response}"))
}

/// Reads a response body to its end and returns the JSON-RPC response, checking its id.
async fn read_to_end(
    response: Response<impl http_body::Body<Error = impl Into<BoxError>>>,
    id: i64,
) -> Value {
    let message = read_response_to_end(response).await;
    assert_eq!(message["id"], json!(id), "{message}");
    message
}

#[tokio::test]
async fn unknown_outcome_on_irreversible_tool_is_never_resent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(3), guarded(&layer(&ledger)));
    server.state.lose_next_response("deploy_release");

    let response = deploy(&mut client, &server, &session, 2).await;

    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(response["result"]["isError"], true, "{response}");
    let record = guard_answer(&response);
    assert_eq!(record["state"], "needs_review");
    assert_eq!(
        record["why_not_resent"],
        "unknown outcome on a tool that may not be re-sent"
    );
    assert!(
        first_text(&response).unwrap().contains("NOT sent again"),
        "{response}"
    );
    let stored = only_record(&ledger).await;
    assert_eq!(stored.state(), ExecutionState::NeedsReview);
    assert_eq!(
        record["execution_id"],
        json!(stored.execution_id().to_string())
    );
    assert_eq!(stored.attempts(), 1);
    // Asking again gives the same answer, still without sending.
    let again = deploy(&mut client, &server, &session, 3).await;
    assert_eq!(guard_answer(&again)["execution_id"], record["execution_id"]);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
}

/// rmcp's `ErrorData::internal_error` after the tool made its effect (an exception after the
/// commit): the outcome is unknown, never `failed`, so the repeat (a new JSON-RPC id) is held
/// instead of running the tool again. A JSON-RPC error used to free the intent.
#[tokio::test]
async fn a_json_rpc_error_after_the_effect_is_unknown_and_the_repeat_is_not_run() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    server.state.fail_next_after_effect("deploy_release");

    let first = deploy(&mut client, &server, &session, 1).await;
    assert_eq!(first["error"]["code"], -32603, "{first}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let stored = wait_for_state(&ledger, ExecutionState::Unknown).await;
    assert!(
        stored.reason().is_some_and(|r| r.contains("-32603")),
        "{stored:?}"
    );

    let again = deploy(&mut client, &server, &session, 2).await;
    let record = guard_answer(&again);
    assert_eq!(record["state"], "needs_review", "{again}");
    assert_eq!(
        record["execution_id"],
        json!(stored.execution_id().to_string())
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
}

#[tokio::test]
async fn unknown_outcome_on_idempotent_tool_is_resent_under_the_same_key() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(3), guarded(&layer(&ledger)));
    server.state.lose_next_response("create_payment");

    let response = call(
        &mut client,
        &server,
        &session,
        2,
        "create_payment",
        json!({"amount": 500, "currency": "eur"}),
    )
    .await;

    assert!(
        response.get("result").is_some() && response["result"]["isError"] != true,
        "{response}"
    );
    let keys = server.state.idempotency_keys("create_payment");
    assert_eq!(keys.len(), 2, "the server saw both sends: {keys:?}");
    assert_eq!(keys[0], keys[1]);
    let record = only_record(&ledger).await;
    assert_eq!(
        keys[0].as_deref(),
        Some(record.execution_id().to_string().as_str())
    );
    assert_eq!(record.attempts(), 2);
}

#[tokio::test]
async fn unknown_outcome_on_recoverable_tool_is_settled_by_its_probe() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let probe = CredentialStatusProbe::new(&server.url, Era::Sessions);
    let mut client = Retry::new(
        RetryEveryError(3),
        guarded(&layer_with(
            &ledger,
            registry()
                .with_status_probe("rotate_credential", probe.clone())
                .unwrap(),
        )),
    );
    server.state.lose_next_response("rotate_credential");

    let response = call(
        &mut client,
        &server,
        &session,
        2,
        "rotate_credential",
        json!({"name": "db-password"}),
    )
    .await;

    assert_eq!(server.state.side_effects("rotate_credential"), 1);
    assert_eq!(probe.asked(), 1);
    assert_eq!(
        first_text(&response),
        Some("rotated db-password (confirmed by status probe)")
    );
    let record = only_record(&ledger).await;
    assert_eq!(record.state(), ExecutionState::ResolvedApplied);
    assert!(record.delivered_at().is_some());
}

#[tokio::test]
async fn recoverable_tool_found_not_applied_is_resent_under_the_same_key() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let probe = CredentialStatusProbe::new(&server.url, Era::Sessions);
    let mut client = Retry::new(
        RetryEveryError(3),
        guarded(&layer_with(
            &ledger,
            registry()
                .with_status_probe("rotate_credential", probe.clone())
                .unwrap(),
        )),
    );
    // 502 before the tool runs is an unknown outcome for the guard; the probe finds nothing.
    server
        .state
        .faults()
        .schedule("rotate_credential", Fault::Status(502));

    let first = send(
        &mut client,
        post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(2, "rotate_credential", json!({"name": "api-key"})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(first.status(), 502);
    drop(first);
    let response = call(
        &mut client,
        &server,
        &session,
        3,
        "rotate_credential",
        json!({"name": "api-key"}),
    )
    .await;

    assert_eq!(probe.asked(), 1);
    assert_eq!(server.state.side_effects("rotate_credential"), 1);
    assert!(response["result"]["isError"] != true, "{response}");
    let record = only_record(&ledger).await;
    let keys = server.state.idempotency_keys("rotate_credential");
    assert_eq!(keys, [Some(record.execution_id().to_string())]);
    assert_eq!(record.attempts(), 2);
}

#[tokio::test]
async fn a_deliberate_repeat_after_delivery_is_a_new_execution() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    for id in [2, 3] {
        let request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(id, "deploy_release", deploy_args()),
        );
        let response = send(&mut client, request).await.unwrap();
        let message = read_to_end(response, id).await;
        assert!(message.get("result").is_some(), "{message}");
    }
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 2);
    assert!(
        records
            .iter()
            .all(|r| r.state() == ExecutionState::Completed && r.delivered_at().is_some())
    );
    let keys = server.state.idempotency_keys("deploy_release");
    assert_ne!(keys[0], keys[1]);
}

#[tokio::test]
async fn a_result_the_caller_dropped_is_handed_back_without_running_again() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    let request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "deploy_release", deploy_args()),
    );
    let response = send(&mut client, request).await.unwrap();
    drop(response); // the agent crashed before reading its answer

    // The guard reads the dropped stream on in the background until the result is recorded.
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert_eq!(
        serde_json::to_value(&record).unwrap()["state"],
        "completed_result_not_delivered"
    );

    let again = deploy(&mut client, &server, &session, 7).await;
    assert_eq!(again["id"], 7, "re-keyed to the new JSON-RPC id");
    assert_eq!(
        first_text(&again),
        Some("deployed catalog 2026.07.22"),
        "{again}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let record = only_record(&ledger).await;
    assert!(record.delivered_at().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_calls_dispatch_once() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let client = guarded(&layer(&ledger));
    let call = |id: i64, actor: Option<&str>, scope: Option<&str>| {
        let mut client = client.clone();
        let mut request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(id, "slow_deploy", json!({"service": "catalog"})),
        );
        if let Some(actor) = actor {
            request.extensions_mut().insert(Actor::from(actor));
        }
        if let Some(scope) = scope {
            request.extensions_mut().insert(IntentScope::from(scope));
        }
        tokio::spawn(async move {
            let response = send(&mut client, request).await.unwrap();
            read_jsonrpc_response(response, &json!(id)).await.unwrap()
        })
    };
    let tasks: Vec<_> = (0..100).map(|id| call(id, None, None)).collect();
    let mut texts = Vec::new();
    for (id, task) in tasks.into_iter().enumerate() {
        let response = task.await.unwrap();
        assert_eq!(response["id"], id, "{response}");
        texts.push(first_text(&response).map(str::to_owned));
    }
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    assert!(
        texts[0].is_some() && texts.iter().all(|t| t == &texts[0]),
        "{texts:?}"
    );

    // Another actor, or another scope, is another intent.
    call(200, Some("signed-process:other-agent"), None)
        .await
        .unwrap();
    call(201, None, Some("run:another-run")).await.unwrap();
    assert_eq!(server.state.side_effects("slow_deploy"), 3);
    assert_eq!(ledger.list().await.unwrap().len(), 3);
}

#[derive(Debug, Default, Clone)]
struct DenyDeploys {
    asked: Arc<AtomicUsize>,
}

#[async_trait]
impl Authorize for DenyDeploys {
    async fn authorize(&self, request: AuthorizationRequest<'_>) -> Authorization {
        self.asked.fetch_add(1, Ordering::SeqCst);
        assert_eq!(request.execution.state(), ExecutionState::Accepted);
        Authorization::Deny {
            reason: "deploys are frozen until Monday".into(),
        }
    }
}

#[tokio::test]
async fn a_denied_call_gets_the_same_denial_without_asking_again() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let authorizer = DenyDeploys::default();
    let mut client = guarded(&layer(&ledger).authorizer(authorizer.clone()));
    for id in [2, 3] {
        let response = deploy(&mut client, &server, &session, id).await;
        assert_eq!(response["result"]["isError"], true);
        assert!(
            first_text(&response)
                .unwrap()
                .contains("deploys are frozen until Monday"),
            "{response}"
        );
        assert_eq!(guard_answer(&response)["state"], "denied");
    }
    assert_eq!(authorizer.asked.load(Ordering::SeqCst), 1);
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    assert!(server.state.tool_call_requests("deploy_release").is_empty());
}

/// Sends `message` through the guard and expects a 400: the JSON body of the answer.
async fn answered_400(
    client: &mut Guard<Inner>,
    server: &TestServer,
    session: &Option<String>,
    message: Value,
) -> Value {
    let response = send(
        client,
        post(&server.url, session.as_deref(), PROTOCOL_VERSION, message),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 400);
    serde_json::from_str(&body_text(response.into_body()).await.unwrap()).unwrap()
}

#[tokio::test]
async fn oversize_and_malformed_calls_are_refused_before_anything_is_sent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger).max_body_bytes(1024));
    let requests_before = server.state.requests().len();

    let big = json!({"service": "x".repeat(2000), "version": "1"});
    let response = send(
        &mut client,
        post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(2, "deploy_release", big),
        ),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 413);
    let text = body_text(response.into_body()).await.unwrap();
    assert!(
        text.contains("1024-byte limit") && text.contains("nothing was sent"),
        "{text}"
    );

    for malformed in [
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "deploy_release", "arguments": [1]}}),
    ] {
        let body = answered_400(&mut client, &server, &session, malformed).await;
        assert_eq!(body["error"]["code"], -32600, "{body}");
    }
    // A tools/call without a usable id is no request: a lenient server would run it and
    // nobody could be answered. Refused unsent, -32600.
    for id in [Some(json!(null)), None] {
        let mut body = json!({"jsonrpc": "2.0", "method": "tools/call",
            "params": {"name": "deploy_release", "arguments": deploy_args()}});
        if let Some(id) = id {
            body["id"] = id;
        }
        let body = answered_400(&mut client, &server, &session, body).await;
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert_eq!(body["id"], Value::Null, "{body}");
    }
    let duplicate = "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":\"deploy_release\",\"arguments\":{\"service\":\"a\",\"service\":\"b\",\"version\":\"1\"}}}";
    let mut request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        json!(null),
    );
    *request.body_mut() = Full::new(Bytes::from_static(duplicate.as_bytes()));
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(response.status(), 400);
    assert!(
        body_text(response.into_body())
            .await
            .unwrap()
            .contains("twice")
    );

    assert_eq!(
        server.state.requests().len(),
        requests_before,
        "something reached the server"
    );
    assert!(ledger.is_empty());
}

#[tokio::test]
async fn statuses_that_refuse_the_call_are_failed_and_5xx_is_unknown() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::Status(429));
    let response = send(
        &mut client,
        post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(2, "deploy_release", deploy_args()),
        ),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(only_record(&ledger).await.state(), ExecutionState::Failed);
    // A failed execution does not link: the next call is a new one, and it runs.
    deploy(&mut client, &server, &session, 3).await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    server
        .state
        .faults()
        .schedule("create_payment", Fault::Status(503));
    let response = send(
        &mut client,
        post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(4, "create_payment", json!({"amount": 1, "currency": "eur"})),
        ),
    )
    .await
    .unwrap();
    assert_eq!(response.status(), 503);
    let records = ledger.list().await.unwrap();
    let payment = records
        .iter()
        .find(|r| r.tool() == "create_payment")
        .unwrap();
    assert_eq!(
        (payment.state(), payment.target_status()),
        (ExecutionState::Unknown, Some(503))
    );
}

#[tokio::test]
async fn an_operator_settles_a_held_execution() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let layer = layer(&ledger);
    let mut client = Retry::new(RetryEveryError(1), guarded(&layer));
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::Status(500));
    let _ = send(
        &mut client,
        post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(2, "deploy_release", deploy_args()),
        ),
    )
    .await
    .unwrap();
    let held = deploy(&mut client, &server, &session, 3).await;
    assert_eq!(guard_answer(&held)["state"], "needs_review");
    let id = only_record(&ledger).await.execution_id();

    let record = layer
        .handle()
        .resolve(
            id,
            false,
            "alice",
            "checked the deploy API: nothing deployed",
        )
        .await
        .unwrap();
    assert_eq!(record.state(), ExecutionState::ResolvedNotApplied);
    let events = ledger.events(id).await.unwrap();
    let last = serde_json::to_value(events.last().unwrap()).unwrap();
    assert_eq!(last["event"], "resolved");
    assert_eq!(last["by"], "operator:alice");
    assert_eq!(last["note"], "checked the deploy API: nothing deployed");

    // Settled as not applied: the intent may run now.
    deploy(&mut client, &server, &session, 4).await;
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert!(
        layer
            .handle()
            .resolve(id, true, "bob", "again")
            .await
            .is_err(),
        "a settled execution cannot be settled twice"
    );
}

/// An operator cannot settle a call while its attempt may still run (in flight, its owner
/// alive): `resolve` is refused naming the owner, nothing is recorded, and the call's own
/// answer settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_cannot_settle_a_call_still_running() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::with_slow_tool(std::time::Duration::from_secs(2)).await;
    let layer = layer(&ledger);
    let mut client = guarded(&layer);
    let running = tokio::spawn({
        let url = server.url.clone();
        let session = session.clone();
        async move {
            call_tool(
                &mut client,
                &url,
                session.as_deref(),
                1,
                "slow_deploy",
                json!({"service": "catalog"}),
            )
            .await
            .map_err(|e| error_chain(&*e))
        }
    });
    let wait = std::time::Duration::from_secs(30);
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, wait).await,
        1
    );
    let id = wait_for_state(&ledger, ExecutionState::Dispatched)
        .await
        .execution_id();
    let refused = layer
        .handle()
        .resolve(id, false, "bob", "looks stuck")
        .await
        .unwrap_err();
    assert!(refused.is_still_running(), "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("still running") && text.contains("guard:"),
        "{text}"
    );
    let answer = running.await.unwrap().unwrap();
    assert_eq!(answer["result"]["structuredContent"]["deployment"], 1);
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert_eq!(record.execution_id(), id);
    let events = ledger.events(id).await.unwrap();
    assert!(
        events.iter().all(|e| e.kind.name() != "resolved"),
        "{events:?}"
    );
}

#[tokio::test]
async fn read_only_tools_and_other_traffic_pass_through() {
    let server = TestServer::start().await;
    let ledger = MemoryLedger::new();
    let mut client = guarded(&layer(&ledger));
    let session = initialize(&mut client, &server.url).await.unwrap();
    assert!(session.is_some());
    for id in [2, 3] {
        call(
            &mut client,
            &server,
            &session,
            id,
            "list_branches",
            json!({}),
        )
        .await;
    }
    assert_eq!(server.state.side_effects("list_branches"), 2);
    assert!(ledger.is_empty());
    assert_eq!(server.state.idempotency_keys("list_branches"), [None, None]);
}

/// The child's task for [`secrets_reach_neither_the_ledger_nor_the_logs`].
const SECRETS_IN_LOGS: &str = "secrets-in-logs";

/// Run in a child process of its own: a thread-local log subscriber in a test binary whose other
/// tests register the same callsites on other threads at the same time can miss this test's
/// lines (tracing caches a callsite's interest), which made the test flaky.
#[test]
fn secrets_reach_neither_the_ledger_nor_the_logs() {
    let output = child_process(SECRETS_IN_LOGS)
        .output()
        .expect("the child runs");
    assert!(output.status.success(), "the child failed: {output:?}");
    assert_child_ran(&output);
}

async fn check_that_secrets_reach_neither_the_ledger_nor_the_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    // This crate's own log lines, at every level. (The in-process test server and hyper log
    // request bodies at TRACE themselves; they are not this crate's to police.)
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt};
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone()),
        )
        .with(Targets::new().with_target("mcp_replay_guard", tracing::Level::TRACE));
    let _guard = tracing::subscriber::set_default(subscriber);

    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(2), guarded(&layer(&ledger)));
    server.state.lose_next_response("deploy_release");
    let args = json!({"service": "catalog", "version": "1", "approval_token": "SECRET-ARG-4f1c"});
    let mut request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "deploy_release", args),
    );
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_static("Bearer SECRET-BEARER-9a7e"),
    );
    let response = send(&mut client, request).await.unwrap();
    let answer = read_jsonrpc_response(response, &json!(2)).await.unwrap();
    assert_eq!(guard_answer(&answer)["state"], "needs_review");

    let mut recorded = String::new();
    for record in ledger.list().await.unwrap() {
        recorded.push_str(&serde_json::to_string(&record).unwrap());
        for event in ledger.events(record.execution_id()).await.unwrap() {
            recorded.push_str(&serde_json::to_string(&event).unwrap());
        }
    }
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("dispatched") && logs.contains("execution_id"),
        "the logs were not captured: {logs}"
    );
    assert!(recorded.contains("needs_review"), "{recorded}");
    for secret in ["SECRET-ARG-4f1c", "SECRET-BEARER-9a7e"] {
        assert!(
            !recorded.contains(secret),
            "{secret} in the ledger: {recorded}"
        );
        assert!(!logs.contains(secret), "{secret} in the logs: {logs}");
        assert!(
            !answer.to_string().contains(secret),
            "{secret} in the answer"
        );
    }
}

#[tokio::test]
async fn a_key_the_caller_set_is_kept_and_recorded() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    let request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "create_payment", json!({"amount": 9, "currency": "usd"})),
    );
    let request = with_idempotency_key(request, "\"order-1234\"");
    let response = send(&mut client, request).await.unwrap();
    read_to_end(response, 2).await;
    assert_eq!(
        server.state.idempotency_keys("create_payment"),
        [Some("\"order-1234\"".to_owned())]
    );
    let record = only_record(&ledger).await;
    assert_eq!(
        record.idempotency_key().as_ref().map(|k| k.as_str()),
        Some("order-1234")
    );
    let events = ledger.events(record.execution_id()).await.unwrap();
    let names: Vec<_> = events.iter().map(|e| e.kind.name()).collect();
    // No authorization hook: no `authorized` (three appends per execution).
    assert_eq!(names, ["accepted", "dispatched", "completed", "delivered"]);
    let dispatched = serde_json::to_value(&events[1]).unwrap();
    assert_eq!(dispatched["key_from_caller"], true);
}

#[tokio::test]
async fn a_result_over_the_size_cap_is_not_kept_and_the_tool_is_not_run_again() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let registry = ContractRegistry::builder()
        .tool(
            "deploy_release",
            ToolContract::irreversible().max_result_bytes(16),
        )
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    );
    let mut client = guarded(&layer);
    let request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "deploy_release", deploy_args()),
    );
    drop(send(&mut client, request).await.unwrap());
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert_eq!(record.result_reference(), None);

    let again = deploy(&mut client, &server, &session, 3).await;
    assert_eq!(
        guard_answer(&again)["state"],
        "completed_result_not_delivered"
    );
    assert!(
        first_text(&again).unwrap().contains("was NOT run again"),
        "{again}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

#[tokio::test]
async fn a_multi_round_trip_continuation_is_a_new_intent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(1), guarded(&layer(&ledger)));
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::Status(500));
    let first = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "deploy_release", deploy_args()),
    );
    let _ = send(&mut client, first).await.unwrap();
    // The same tool and arguments, continuing with the input the server asked for.
    let mut body = tool_call_body(3, "deploy_release", deploy_args());
    body["params"]["requestState"] = json!("state-from-server");
    body["params"]["inputResponses"] = json!({"confirm": {"action": "accept"}});
    let response = send(
        &mut client,
        post(&server.url, session.as_deref(), PROTOCOL_VERSION, body),
    )
    .await
    .unwrap();
    let message = read_jsonrpc_response(response, &json!(3)).await.unwrap();
    assert!(
        message
            .pointer("/result/structuredContent/mcp_replay_guard")
            .is_none(),
        "the continuation was answered by the guard: {message}"
    );
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 2, "{records:#?}");
    assert_ne!(records[0].fingerprint(), records[1].fingerprint());
    assert_eq!(
        server.state.tool_call_requests("deploy_release").len(),
        1,
        "the 500 never reached rmcp; the continuation did"
    );
}

#[tokio::test]
async fn a_refused_connection_is_not_sent_and_the_retry_continues_the_same_execution() {
    // A port nobody listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    drop(listener);
    let ledger = MemoryLedger::new();
    let mut client = guarded(&layer(&ledger));
    let request = || {
        post(
            &url,
            None,
            PROTOCOL_VERSION,
            tool_call_body(2, "deploy_release", deploy_args()),
        )
    };

    let error = send(&mut client, request()).await.unwrap_err();
    let error = error
        .downcast::<mcp_replay_guard::guard::GuardError>()
        .unwrap();
    assert!(error.is_not_sent(), "{error}");
    let first = only_record(&ledger).await;
    assert_eq!(
        (first.state(), first.attempts()),
        (ExecutionState::NotSent, 1)
    );
    assert_eq!(error.execution_id(), Some(first.execution_id()));

    let error = send(&mut client, request()).await.unwrap_err();
    assert!(
        error
            .downcast_ref::<mcp_replay_guard::guard::GuardError>()
            .unwrap()
            .is_not_sent()
    );
    let second = only_record(&ledger).await;
    assert_eq!(
        second.execution_id(),
        first.execution_id(),
        "the same execution continued"
    );
    assert_eq!(second.attempts(), 2);
}

#[tokio::test]
async fn integers_past_2_pow_53_are_two_intents_and_past_64_bits_are_refused_unsent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(3), guarded(&layer(&ledger)));
    server.state.lose_next_response("deploy_release");
    let order =
        |order_id: u64| json!({"service": "catalog", "version": "v1", "order_id": order_id});

    // The first order's response is lost: it is held for review.
    let held = call(
        &mut client,
        &server,
        &session,
        2,
        "deploy_release",
        order(9007199254740993),
    )
    .await;
    assert_eq!(guard_answer(&held)["state"], "needs_review", "{held}");
    // An order id a double cannot tell from the first one is another intent: it runs.
    let other = call(
        &mut client,
        &server,
        &session,
        3,
        "deploy_release",
        order(9007199254740992),
    )
    .await;
    assert_eq!(other["result"]["isError"], json!(false), "{other}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    assert_eq!(ledger.list().await.unwrap().len(), 2);

    // An integer literal beyond 64 bits cannot be fingerprinted exactly: refused, not sent.
    let request = post(
        &server.url,
        session.as_deref(),
        "2025-11-25",
        tool_call_body(4, "deploy_release", order(0)),
    );
    let (parts, body) = request.into_parts();
    let raw = body_text(body)
        .await
        .unwrap()
        .replace("\"order_id\":0", "\"order_id\":18446744073709551617");
    let response = send(
        &mut client,
        Request::from_parts(parts, Full::new(Bytes::from(raw))),
    )
    .await
    .unwrap();
    let refused = read_to_end(response, 4).await;
    assert_eq!(refused["error"]["code"], json!(-32602), "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("beyond 64 bits") && message.contains("nothing was sent"),
        "{message}"
    );
    assert!(
        !message.contains("18446744073709551617"),
        "the value is never echoed: {message}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    assert_eq!(ledger.list().await.unwrap().len(), 2);
}

/// `1e-400` is read by the JSON parser as 0, as `1e400` is refused as out of range: a call
/// holding one would be fingerprinted (and sent) as another number. Refused unsent, as an
/// integer beyond 64 bits is; a zero spelled `0e-400`, and a small number a double holds, run.
#[tokio::test]
async fn a_nonzero_number_that_reads_as_zero_is_refused_unsent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = Retry::new(RetryEveryError(3), guarded(&layer(&ledger)));
    let mut sent = 0;
    for (n, (literal, refused)) in [
        ("1e-400", true),
        ("-1e-400", true),
        ("0e-400", false),
        ("1e-300", false),
    ]
    .into_iter()
    .enumerate()
    {
        let id = n as i64 + 2;
        let request = post(
            &server.url,
            session.as_deref(),
            "2025-11-25",
            tool_call_body(
                id,
                "deploy_release",
                json!({"service": "catalog", "version": format!("v{n}"), "amount": 7}),
            ),
        );
        let (parts, body) = request.into_parts();
        let raw = body_text(body)
            .await
            .unwrap()
            .replace("\"amount\":7", &format!("\"amount\":{literal}"));
        let response = send(
            &mut client,
            Request::from_parts(parts, Full::new(Bytes::from(raw))),
        )
        .await
        .unwrap();
        let answer = read_to_end(response, id).await;
        if refused {
            assert_eq!(
                answer["error"]["code"],
                json!(-32602),
                "{literal}: {answer}"
            );
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("too small for a double") && message.contains("nothing was sent"),
                "{literal}: {message}"
            );
        } else {
            sent += 1;
            assert_eq!(
                answer["result"]["isError"],
                json!(false),
                "{literal}: {answer}"
            );
        }
        assert_eq!(
            server.state.side_effects("deploy_release"),
            sent,
            "{literal}"
        );
        assert_eq!(ledger.list().await.unwrap().len(), sent, "{literal}");
    }
}

/// The child's task for [`dropping_the_runtime_with_an_abandoned_body_does_not_abort`].
const ABANDONED_BODY: &str = "abandoned-body:";

/// A library user drops a runtime while a guarded call's body is abandoned
/// (its drain task still waiting for an answer that never comes): the process does not abort
/// (before: every cancelled drain dropped a `Watch` that spawned a drain again, until the stack
/// overflowed), and the ledger says unknown. Run in a child process, because a stack overflow
/// aborts the whole process.
#[test]
fn dropping_the_runtime_with_an_abandoned_body_does_not_abort() {
    let dir = std::env::temp_dir().join(format!(
        "mrg-guard-abandoned-{}-{}",
        std::process::id(),
        mcp_replay_guard::ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.jsonl");
    let output = child_process(&format!("{ABANDONED_BODY}{}", path.display()))
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the child aborted: {output:?}");
    assert!(stdout.contains("runtime dropped"), "{stdout}");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let records = runtime.block_on(async {
        let ledger = mcp_replay_guard::ledger::FileLedger::open(&path).unwrap();
        ledger.list().await.unwrap()
    });
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].state(), ExecutionState::Unknown, "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The child's task for [`dropping_the_runtime_with_an_abandoned_keyed_response_does_not_abort`].
const ABANDONED_KEYED: &str = "abandoned-keyed";

/// On the server side: the Idempotency-Key layer's drain of a response its
/// client abandoned is cancelled by a runtime that is dropped; the process does not abort (its
/// drained copy used to drain again on every drop, without end).
#[test]
fn dropping_the_runtime_with_an_abandoned_keyed_response_does_not_abort() {
    let output = child_process(ABANDONED_KEYED)
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the child aborted: {output:?}");
    assert!(stdout.contains("runtime dropped"), "{stdout}");
}

fn abandon_a_keyed_response() {
    use mcp_replay_guard::integrations::server::IdempotencyLayer;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = TestServer::start_with(ServerOptions {
            slow_tool_delay: std::time::Duration::from_secs(120),
            idempotency: Some(IdempotencyLayer::new(
                MemoryLedger::new(),
                FingerprintKey::from_bytes(&[5; 32]).unwrap(),
            )),
            ..ServerOptions::default()
        })
        .await;
        let session = session(&server).await;
        let request = with_idempotency_key(
            post(
                &server.url,
                session.as_deref(),
                PROTOCOL_VERSION,
                tool_call_body(2, "slow_deploy", json!({"service": "catalog"})),
            ),
            "key-abandoned",
        );
        let mut client = hyper_client();
        let response = send(&mut client, request).await.unwrap();
        assert!(response.status().is_success());
        server
            .state
            .wait_for_started("slow_deploy", 1, std::time::Duration::from_secs(10))
            .await;
        drop(response);
        drop(client);
        std::mem::forget(server);
    });
    drop(runtime);
    println!("runtime dropped");
}

/// Runs a child's task (see tests/support/child.rs); does nothing in a normal test run.
#[test]
#[ignore = "a child process's entry point, run by the tests that start it (with MRG_CHILD set)"]
fn child_entry() {
    let Ok(task) = std::env::var(CHILD_TASK) else {
        return;
    };
    if task == ABANDONED_KEYED {
        return abandon_a_keyed_response();
    }
    if task == SECRETS_IN_LOGS {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(check_that_secrets_reach_neither_the_ledger_nor_the_logs());
    }
    let Some(path) = task.strip_prefix(ABANDONED_BODY) else {
        panic!("unknown child task {task:?}");
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = TestServer::start_with(ServerOptions {
            slow_tool_delay: std::time::Duration::from_secs(120),
            ..ServerOptions::default()
        })
        .await;
        let session = session(&server).await;
        let ledger = mcp_replay_guard::ledger::FileLedger::open(path).unwrap();
        let key = ledger.fingerprint_key().unwrap();
        let mut client = GuardLayer::new(ledger, registry(), key)
            .layer(hyper_client_with_body::<GuardRequestBody>());
        let request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(2, "slow_deploy", json!({"service": "catalog"})),
        );
        let response = send(&mut client, request).await.unwrap();
        assert!(response.status().is_success());
        server
            .state
            .wait_for_started("slow_deploy", 1, std::time::Duration::from_secs(10))
            .await;
        // The body is abandoned: its drain task waits for the answer; the server lives on until
        // the runtime goes.
        drop(response);
        std::mem::forget(server);
    });
    drop(runtime);
    println!("runtime dropped");
}

/// A body dropped where no runtime runs (a plain thread) cannot drain, so it
/// records `unknown` in place and stops; before, nothing was recorded and the execution stayed
/// `dispatched`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_dropped_outside_a_runtime_records_unknown_in_place() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::with_slow_tool(std::time::Duration::from_secs(120)).await;
    let mut client = guarded(&layer(&ledger));
    let request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "slow_deploy", json!({"service": "catalog"})),
    );
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(
        only_record(&ledger).await.state(),
        ExecutionState::Dispatched
    );
    std::thread::spawn(move || drop(response)).join().unwrap();
    let record = only_record(&ledger).await;
    assert_eq!(record.state(), ExecutionState::Unknown, "{record:#?}");
}

/// Concurrent identical calls in one process to a tool whose results are not
/// kept. The waiters take the completed execution's answer (honestly: finished, result not
/// kept), as a waiter in another process does; none of them decides again and starts a second
/// execution once the first answer was delivered. The server answers with JSON, so the first
/// caller's delivery is recorded right after its outcome, before any waiter runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_tool_whose_results_are_not_kept_never_dispatch_again() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let ledger = MemoryLedger::new();
    let registry = ContractRegistry::builder()
        .tool(
            "slow_deploy",
            ToolContract::idempotent().keep_results(false),
        )
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    );
    let client = guarded(&layer);
    let tasks: Vec<_> = (0..20)
        .map(|id| {
            let mut client = client.clone();
            let request = post(
                &server.url,
                None,
                STATELESS_PROTOCOL_VERSION,
                stateless_tool_call_body(id, "slow_deploy", json!({"service": "catalog"})),
            );
            tokio::spawn(async move {
                let response = send(&mut client, request).await.unwrap();
                read_jsonrpc_response(response, &json!(id)).await.unwrap()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(server.state.started("slow_deploy"), 1, "{answers:#?}");
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    let record = only_record(&ledger).await;
    assert_eq!(record.attempts(), 1);
    // One caller got the tool's answer; every other one was told it finished and that its
    // result was not kept (never a made-up failure, never a second run).
    let is_guard_answer = |a: &&Value| {
        a["result"]["structuredContent"]
            .get("mcp_replay_guard")
            .is_some()
    };
    assert_eq!(
        answers.iter().filter(|a| !is_guard_answer(a)).count(),
        1,
        "{answers:#?}"
    );
    for answer in answers.iter().filter(is_guard_answer) {
        assert_eq!(
            guard_answer(answer)["execution_id"],
            json!(record.execution_id().to_string())
        );
        assert!(
            first_text(answer).unwrap().contains("was NOT run again"),
            "{answer}"
        );
    }
}

/// Two actors make the identical call, and the first actor's answer is
/// lost after its tool ran (its result is kept). The second actor's call is its own execution:
/// it runs, and gets its own result; the first actor's repeat gets the first result back. No
/// kept result crosses actors.
#[tokio::test]
async fn a_kept_result_is_never_handed_to_another_actor() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let layer = layer(&ledger);
    let mut client = guarded(&layer);
    let request = |id: i64, actor: &str| {
        let mut request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(id, "deploy_release", deploy_args()),
        );
        request.extensions_mut().insert(Actor::from(actor));
        request
    };
    // Actor A: the caller drops the body unread; the guard reads on and keeps the result.
    drop(send(&mut client, request(1, "actor:a")).await.unwrap());
    let first = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert!(first.result_reference().is_some());
    assert_eq!(first.actor().as_str(), "actor:a");

    // Actor B, the identical call: its own execution, its own effect, its own result.
    let response = send(&mut client, request(2, "actor:b")).await.unwrap();
    let b = read_jsonrpc_response(response, &json!(2)).await.unwrap();
    assert!(
        b["result"]["structuredContent"]
            .get("mcp_replay_guard")
            .is_none(),
        "{b}"
    );
    assert_eq!(b["result"]["structuredContent"]["deployment"], 2, "{b}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // Actor A repeats: its kept result (deployment 1), not B's, and nothing runs.
    let response = send(&mut client, request(3, "actor:a")).await.unwrap();
    let a = read_jsonrpc_response(response, &json!(3)).await.unwrap();
    assert_eq!(a["result"]["structuredContent"]["deployment"], 1, "{a}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 2, "{records:#?}");
    let actors: std::collections::BTreeSet<&str> =
        records.iter().map(|r| r.actor().as_str()).collect();
    assert_eq!(actors, ["actor:a", "actor:b"].into_iter().collect());
}

/// The resume path: a broken stream is remembered by its last event id, and
/// only a GET of the same actor continues (and completes) its execution. Another actor's GET
/// With that event id is refused unsent, without touching it (passed through, the
/// server replayed A's answer to B).
#[tokio::test]
async fn another_actors_resume_never_takes_over_a_broken_stream() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let session = session(&server).await;
    let ledger = MemoryLedger::new();
    let layer = layer(&ledger);
    let mut client = guarded(&layer);
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let mut request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(1, "deploy_release", deploy_args()),
    );
    request.extensions_mut().insert(Actor::from("actor:a"));
    let response = send(&mut client, request).await.unwrap();
    assert!(read_jsonrpc_response(response, &json!(1)).await.is_err());
    assert_eq!(
        server
            .state
            .wait_for_side_effects("deploy_release", 1, std::time::Duration::from_secs(5))
            .await,
        1
    );
    let cut = wait_for_state(&ledger, ExecutionState::Unknown).await;
    let last_event_id = cut
        .correlation()
        .last_event_id
        .clone()
        .expect("an event id");

    let resume = |actor: &str| {
        let mut request = get_stream(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            Some(&last_event_id),
        );
        request.extensions_mut().insert(Actor::from(actor));
        request
    };
    // Actor B resumes A's stream: refused unsent (the server would replay A's answer to B),
    // and A's execution is not B's.
    let response = send(&mut client, resume("actor:b")).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::FORBIDDEN);
    let _ = body_text(response.into_body()).await;
    assert!(server.state.resume_requests().is_empty());
    let record = only_record(&ledger).await;
    assert_eq!(record.state(), ExecutionState::Unknown, "{record:#?}");

    // Actor A resumes: the answer completes A's execution.
    let response = send(&mut client, resume("actor:a")).await.unwrap();
    let answer = read_response_to_end(response).await;
    assert_eq!(
        answer["result"]["structuredContent"]["deployment"], 1,
        "{answer}"
    );
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert_eq!(record.execution_id(), cut.execution_id());
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

/// A caller's own `Idempotency-Key` that is another actor's execution id is refused
/// unsent. Sent, it would let a server that honours keys (and sees both actors as one
/// principal, behind a proxy that holds the token) hand A's result to B.
#[tokio::test]
async fn another_actors_execution_id_as_a_callers_key_is_refused_unsent() {
    let server = TestServer::start().await;
    let session = session(&server).await;
    let ledger = MemoryLedger::new();
    let layer = layer(&ledger);
    let mut client = guarded(&layer);
    let call = |id: i64, actor: &str| {
        let mut request = post(
            &server.url,
            session.as_deref(),
            PROTOCOL_VERSION,
            tool_call_body(id, "deploy_release", deploy_args()),
        );
        request.extensions_mut().insert(Actor::from(actor));
        request
    };
    let response = send(&mut client, call(1, "actor:a")).await.unwrap();
    let _ = read_response_to_end(response).await;
    let a = only_record(&ledger).await.execution_id().to_string();

    let response = send(&mut client, with_idempotency_key(call(2, "actor:b"), &a))
        .await
        .unwrap();
    assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
    let refusal = read_response_to_end(response).await;
    assert_eq!(refusal["error"]["code"], -32600, "{refusal}");
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    // Actor A's own key is its own to send again.
    let response = send(&mut client, with_idempotency_key(call(3, "actor:a"), &a))
        .await
        .unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    let _ = read_response_to_end(response).await;
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 2);
}

/// A kept result must read back as the target sent it. A result holding an integer beyond 64
/// bits (an `order_id` of 18446744073709551617) cannot: the ledger line holds a JSON value,
/// and after a restart it would come back as `1.8446744073709552e+19`, the same as its
/// neighbour 18446744073709551616. So it is not kept: after a lost response and a restart
/// (the file ledger reopened by a new guard), the repeat gets the guard's honest answer, never
/// a rewritten number, and the tool ran once. (A target on 127.0.0.1 would not change what is
/// tested here: the ledger's reading of a result; `service_fn` counts the runs.)
#[tokio::test]
async fn a_result_with_an_integer_beyond_64_bits_is_never_handed_back_rewritten() {
    use http_body_util::BodyExt;
    let dir = std::env::temp_dir().join(format!(
        "mrg-guard-wide-result-{}-{}",
        std::process::id(),
        mcp_replay_guard::ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.jsonl");
    let runs = Arc::new(AtomicUsize::new(0));
    let target = {
        let runs = runs.clone();
        tower::service_fn(move |request: Request<GuardRequestBody>| {
            let runs = runs.clone();
            async move {
                let body = request.into_body().collect().await?.to_bytes();
                let call: Value = serde_json::from_slice(&body)?;
                runs.fetch_add(1, Ordering::SeqCst);
                let answer = format!(
                    r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":"ordered"}}],"isError":false,"structuredContent":{{"order_id":18446744073709551617}}}}}}"#,
                    call["id"]
                );
                let mut response = Response::new(Full::new(Bytes::from(answer)));
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Ok::<_, BoxError>(response)
            }
        })
    };
    let guard_over = |ledger: mcp_replay_guard::ledger::FileLedger| {
        GuardLayer::new(
            ledger,
            registry(),
            FingerprintKey::from_bytes(&[9; 32]).unwrap(),
        )
        .actor(Actor::from("signed-process:com.example.agent"))
        .intent_scope(IntentScope::from("run:wide-result"))
        .layer(target.clone())
    };
    let url = "http://127.0.0.1:9/mcp";
    let call = |id: i64| {
        post(
            url,
            None,
            STATELESS_PROTOCOL_VERSION,
            tool_call_body(id, "deploy_release", deploy_args()),
        )
    };
    {
        let ledger = mcp_replay_guard::ledger::FileLedger::open(&path).unwrap();
        let mut guard = guard_over(ledger.clone());
        let response = send(&mut guard, call(1)).await.unwrap();
        // The response is lost: the body is dropped unread.
        drop(response);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let records = ledger.list().await.unwrap();
            if records.len() == 1 && records[0].state() == ExecutionState::Completed {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{records:#?}");
            tokio::task::yield_now().await;
        }
    }
    let ledger = mcp_replay_guard::ledger::FileLedger::open(&path).unwrap();
    let mut guard = guard_over(ledger);
    let response = send(&mut guard, call(2)).await.unwrap();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{text}");
    assert!(
        !text.contains("e+19") && !text.contains("1.8446744073709552"),
        "the repeat got a rewritten result: {text}"
    );
    assert!(
        text.contains(mcp_replay_guard::guard::STRUCTURED_KEY) && text.contains("\"isError\":true"),
        "the guard's own answer (the result was not kept): {text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_batch_carrying_a_tools_call_is_refused_and_nothing_is_sent() {
    let Fixture {
        server,
        session,
        ledger,
    } = Fixture::start().await;
    let mut client = guarded(&layer(&ledger));
    let batch = json!([
        tool_call_body(2, "deploy_release", deploy_args()),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    ]);
    let request = post(&server.url, session.as_deref(), "2025-03-26", batch);
    let response = send(&mut client, request).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
    let message = read_response_to_end(response).await;
    assert_eq!(message["error"]["code"], json!(-32600), "{message}");
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    assert!(ledger.list().await.unwrap().is_empty());
}
