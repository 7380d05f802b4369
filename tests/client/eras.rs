//! Both protocol eras through the guard: a client that resumes by itself (2025-11-25), and the
//! re-issue with a new JSON-RPC id that 2026-07-28 demands.

use crate::support;

use std::{future::Future, pin::Pin};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::Full;
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{Guard, GuardLayer, GuardRequestBody, GuardResponseBody},
    ledger::{Ledger, MemoryLedger},
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, retry::Retry};

type Client = Guard<
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        GuardRequestBody,
    >,
>;

fn guarded(ledger: &MemoryLedger) -> Client {
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .tool("create_payment", ToolContract::idempotent())
        .build()
        .unwrap();
    GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[3; 32]).unwrap(),
    )
    .layer(hyper_client_with_body::<GuardRequestBody>())
}

#[tokio::test]
async fn a_resume_the_client_issues_itself_completes_the_execution() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..Default::default()
    })
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let ledger = MemoryLedger::new();
    let mut client = guarded(&ledger);
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);

    // The POST's stream breaks after the priming event: the outcome is unknown.
    let request = post(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(
            2,
            "deploy_release",
            json!({"service": "catalog", "version": "3"}),
        ),
    );
    let response = send(&mut client, request).await.unwrap();
    let mut reader = SseReader::new(response.into_body());
    let priming = reader.next_event().await.unwrap().unwrap();
    let last_event_id = priming.id.clone().expect("the priming event has an id");
    assert!(reader.next_event().await.is_err());
    drop(reader);
    let record = wait_for_state(&ledger, ExecutionState::Unknown).await;
    assert_eq!(
        record.correlation().last_event_id.as_deref(),
        Some(last_event_id.as_str())
    );

    // The client resumes by itself, through the guard: the result on the GET completes it.
    let resume = get_stream(
        &server.url,
        session.as_deref(),
        PROTOCOL_VERSION,
        Some(&last_event_id),
    );
    let response = send(&mut client, resume).await.unwrap();
    let text = body_text(response.into_body()).await.unwrap();
    assert!(text.contains("deployed catalog 3"), "{text}");
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert!(record.delivered_at().is_some());
    assert!(record.result_reference().is_some());
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let posts = server.state.tool_call_requests("deploy_release");
    assert_eq!(posts.len(), 1);
    assert_eq!(
        server
            .state
            .all_requests()
            .iter()
            .filter(|r| r.method == Method::GET)
            .count(),
        1
    );
}

/// A 2026-07-28 client: on an error it re-issues the call with a new JSON-RPC id, as the
/// specification demands (the request is rebuilt, not replayed byte for byte).
#[derive(Clone)]
struct ReissueWithNewId {
    left: usize,
    next_id: i64,
}

impl<E>
    tower::retry::Policy<
        Request<Full<Bytes>>,
        Response<GuardResponseBody<hyper::body::Incoming>>,
        E,
    > for ReissueWithNewId
{
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        request: &mut Request<Full<Bytes>>,
        result: &mut Result<Response<GuardResponseBody<hyper::body::Incoming>>, E>,
    ) -> Option<Self::Future> {
        if result.is_ok() || self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.next_id += 1;
        let mut body: Value = serde_json::from_slice(&body_bytes(request)).unwrap();
        body["id"] = json!(self.next_id);
        *request = reissue(request, body);
        Some(Box::pin(async {}))
    }

    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let body: Value = serde_json::from_slice(&body_bytes(request)).unwrap();
        Some(reissue(request, body))
    }
}

/// The bytes of a `Full` body, which yields its one frame at once.
fn body_bytes(request: &Request<Full<Bytes>>) -> Bytes {
    use http_body::Body;
    let mut body = request.body().clone();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match Pin::new(&mut body).poll_frame(&mut cx) {
        std::task::Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    }
}

fn reissue(original: &Request<Full<Bytes>>, body: Value) -> Request<Full<Bytes>> {
    // No Mcp-Method / Mcp-Name: the guard adds them for 2026-07-28.
    Request::post(original.uri())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", STATELESS_PROTOCOL_VERSION)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

async fn stateless_call(
    client: &mut Retry<ReissueWithNewId, Client>,
    server: &TestServer,
    tool: &str,
    args: Value,
) -> Value {
    let request = reissue(
        &Request::post(&server.url)
            .body(Full::new(Bytes::new()))
            .unwrap(),
        stateless_tool_call_body(1, tool, args),
    );
    let response = send(client, request).await.unwrap();
    read_response_to_end(response).await
}

#[tokio::test]
async fn a_2026_reissue_with_a_new_id_attaches_and_an_irreversible_tool_runs_once() {
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let ledger = MemoryLedger::new();
    let mut client = Retry::new(
        ReissueWithNewId {
            left: 2,
            next_id: 100,
        },
        guarded(&ledger),
    );
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);

    let answer = stateless_call(
        &mut client,
        &server,
        "deploy_release",
        json!({"service": "catalog", "version": "4"}),
    )
    .await;

    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(
        answer["id"], 101,
        "answered under the re-issue's id: {answer}"
    );
    assert_eq!(answer["result"]["isError"], true);
    assert_eq!(
        answer["result"]["structuredContent"]["mcp_replay_guard"]["state"],
        "needs_review"
    );
    let posts = server.state.tool_call_requests("deploy_release");
    assert_eq!(posts.len(), 1);
    assert_eq!(
        posts[0].protocol_version.as_deref(),
        Some(STATELESS_PROTOCOL_VERSION)
    );
}

#[tokio::test]
async fn a_2026_reissue_of_an_idempotent_tool_carries_the_same_key() {
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let ledger = MemoryLedger::new();
    let mut client = Retry::new(
        ReissueWithNewId {
            left: 2,
            next_id: 100,
        },
        guarded(&ledger),
    );
    server
        .state
        .faults()
        .schedule("create_payment", Fault::DropResponseAfterTool);

    let answer = stateless_call(
        &mut client,
        &server,
        "create_payment",
        json!({"amount": 70, "currency": "eur"}),
    )
    .await;

    assert!(answer["result"]["isError"] != true, "{answer}");
    let keys = server.state.idempotency_keys("create_payment");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1]);
    let record = ledger.list().await.unwrap().remove(0);
    assert_eq!(
        keys[0].as_deref(),
        Some(record.execution_id().to_string().as_str())
    );
    assert_eq!(record.state(), ExecutionState::Completed);
}

#[tokio::test]
async fn an_unknown_outcome_of_a_call_that_became_a_task_is_settled_by_tasks_get() {
    use mcp_replay_guard::execution::{EventKind, LedgerEvent, Timestamp};
    let (url, seen) = task_server("completed").await;
    let ledger = MemoryLedger::new();
    let mut client = guarded(&ledger);
    let call = || {
        reissue(
            &Request::post(&url).body(Full::new(Bytes::new())).unwrap(),
            stateless_tool_call_body(
                1,
                "deploy_release",
                json!({"service": "catalog", "version": "5"}),
            ),
        )
    };
    assert!(send(&mut client, call()).await.is_err());
    let record = wait_for_state(&ledger, ExecutionState::Unknown).await;
    // The task id of the execution is known (its `task_created` event landed before the
    // outcome was lost, as after a crash between the two writes).
    ledger
        .append(LedgerEvent {
            execution_id: record.execution_id(),
            at: Timestamp::now(),
            kind: EventKind::TaskCreated {
                task_id: "t-1".into(),
            },
        })
        .await
        .unwrap();

    let response = send(&mut client, call()).await.unwrap();
    let text = body_text(response.into_body()).await.unwrap();

    assert!(text.contains("deployed by task t-1"), "{text}");
    assert_eq!(
        *seen.lock().unwrap(),
        ["tools/call", "tasks/get"],
        "the call was never re-sent"
    );
    let record = ledger.get(record.execution_id()).await.unwrap().unwrap();
    assert_eq!(record.state(), ExecutionState::ResolvedApplied);
    assert_eq!(record.correlation().task_id.as_deref(), Some("t-1"));
}
