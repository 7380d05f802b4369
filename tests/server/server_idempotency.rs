//! The server-side Idempotency-Key layer end to end: rmcp's own Streamable HTTP server on
//! 127.0.0.1 behind `IdempotencyLayer`, with the fault layer in front of it (so a lost response
//! is lost after the layer kept it). The server's side-effect counters are the ground truth.

use crate::support;

use std::{path::PathBuf, time::Duration};

use http::{HeaderValue, StatusCode, header::AUTHORIZATION};
use mcp_replay_guard::{
    Actor, ExecutionId, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    integrations::server::{
        IDEMPOTENT_REPLAYED, IdempotencyLayer, InFlight, KEY_IN_FLIGHT, KEY_REUSED,
    },
    ledger::{FileLedger, Ledger, MemoryLedger},
};
use serde_json::{Value, json};
use support::*;
use tokio::task::JoinHandle;
use tower::{Layer, retry::Retry};

fn fingerprint_key() -> FingerprintKey {
    FingerprintKey::from_bytes(&[5; 32]).unwrap()
}

async fn keyed_server(layer: IdempotencyLayer, options: ServerOptions) -> TestServer {
    TestServer::start_with(ServerOptions {
        idempotency: Some(layer),
        ..options
    })
    .await
}

/// [`keyed_server`] over `ledger`, with the default options.
async fn keyed_server_over(ledger: impl Ledger) -> TestServer {
    keyed_server(
        IdempotencyLayer::new(ledger, fingerprint_key()),
        ServerOptions::default(),
    )
    .await
}

/// A `tools/call` with an `Idempotency-Key` (and more headers), answered as (status, replayed,
/// JSON-RPC message).
async fn keyed_call(
    server: &TestServer,
    session: Option<&str>,
    id: i64,
    tool: &str,
    args: Value,
    headers: &[(&'static str, &str)],
) -> (StatusCode, bool, Value) {
    keyed_call_at(&server.url, session, id, tool, args, headers).await
}

/// [`keyed_call`] sent to `url` (the same server under another path, say).
async fn keyed_call_at(
    url: &str,
    session: Option<&str>,
    id: i64,
    tool: &str,
    args: Value,
    headers: &[(&'static str, &str)],
) -> (StatusCode, bool, Value) {
    let mut request = post(
        url,
        session,
        PROTOCOL_VERSION,
        tool_call_body(id, tool, args),
    );
    for (name, value) in headers {
        request
            .headers_mut()
            .insert(*name, HeaderValue::from_str(value).unwrap());
    }
    let response = send(&mut hyper_client(), request)
        .await
        .unwrap_or_else(|e| panic!("tools/call {tool}: {}", error_chain(&*e)));
    let status = response.status();
    let replayed = response.headers().get(IDEMPOTENT_REPLAYED).is_some();
    (status, replayed, read_response_to_end(response).await)
}

fn deployment(message: &Value) -> &Value {
    message
        .pointer("/result/structuredContent/deployment")
        .unwrap_or_else(|| panic!("not a deployment result: {message}"))
}

fn error_code(message: &Value) -> i64 {
    message
        .pointer("/error/code")
        .and_then(Value::as_i64)
        .unwrap_or_else(|| panic!("not a JSON-RPC error: {message}"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mrg-server-{name}-{}-{}",
        std::process::id(),
        ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_lost_response_is_replayed_to_the_client_guard_and_the_tool_runs_once() {
    let server_ledger = MemoryLedger::new();
    let server = keyed_server_over(server_ledger.clone()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::idempotent())
        .build()
        .unwrap();
    let client_ledger = MemoryLedger::new();
    let guard = GuardLayer::new(
        client_ledger.clone(),
        contracts,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:5f8097"));
    let mut client = Retry::new(
        RetryEveryError(3),
        guard.layer(hyper_client_with_body::<GuardRequestBody>()),
    );
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);

    let response = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        json!({"service": "catalog", "version": "2026.07.22"}),
    )
    .await
    .unwrap_or_else(|e| panic!("the guarded call failed: {}", error_chain(&*e)));

    // The original result, under the caller's id; the tool ran once.
    assert_eq!(response["id"], 2, "{response}");
    assert_eq!(deployment(&response), 1, "{response}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let sends = server.state.tool_call_requests("deploy_release");
    assert_eq!(sends.len(), 2, "the guard re-sent once: {sends:#?}");
    assert_eq!(sends[0].idempotency_key, sends[1].idempotency_key);
    assert!(sends[0].fault.is_some() && sends[1].fault.is_none());
    // Both halves agree on what happened.
    let kept = wait_for_state(&server_ledger, ExecutionState::Completed).await;
    assert_eq!(
        kept.idempotency_key().as_ref().map(ToString::to_string),
        sends[0].idempotency_key
    );
    assert_eq!(kept.attempts(), 1);
    let client_record = wait_for_state(&client_ledger, ExecutionState::Completed).await;
    assert_eq!(client_record.attempts(), 2);
    assert!(client_record.delivered_at().is_some());
}

#[tokio::test]
async fn a_repeat_in_either_key_spelling_gets_the_kept_response_under_its_own_id() {
    let ledger = MemoryLedger::new();
    let server = keyed_server_over(ledger.clone()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let key = [("idempotency-key", "order-7")];
    let args = json!({"service": "catalog", "version": "1.0.0"});

    let (status, replayed, first) =
        keyed_call(&server, session.as_deref(), 1, "deploy_release", args, &key).await;
    assert_eq!((status, replayed), (StatusCode::OK, false), "{first}");
    // Same call: other key order, other id, the structured-field spelling of the key.
    let reordered = json!({"version": "1.0.0", "service": "catalog"});
    let quoted = [("idempotency-key", "\"order-7\"")];
    let (status, replayed, repeat) = keyed_call(
        &server,
        session.as_deref(),
        "9".parse().unwrap(),
        "deploy_release",
        reordered,
        &quoted,
    )
    .await;

    assert_eq!((status, replayed), (StatusCode::OK, true), "{repeat}");
    assert_eq!(repeat["id"], 9);
    assert_eq!(repeat["result"], first["result"]);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].state(), ExecutionState::Completed);
    assert!(records[0].request_fingerprint().is_some());
}

#[tokio::test]
async fn the_same_key_for_another_call_is_422_and_does_not_run() {
    let server = keyed_server_over(MemoryLedger::new()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let key = [("idempotency-key", "k-422")];
    let first = json!({"service": "catalog", "version": "1.0.0"});
    let (status, _, _) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "deploy_release",
        first,
        &key,
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    for (id, tool, args) in [
        (
            2,
            "deploy_release",
            json!({"service": "catalog", "version": "2.0.0"}),
        ),
        (
            3,
            "create_payment",
            json!({"amount": 500, "currency": "eur"}),
        ),
    ] {
        let (status, replayed, answer) =
            keyed_call(&server, session.as_deref(), id, tool, args, &key).await;
        assert_eq!(
            (status, replayed),
            (StatusCode::UNPROCESSABLE_ENTITY, false)
        );
        assert_eq!(answer["id"], id, "{answer}");
        assert_eq!(error_code(&answer), KEY_REUSED);
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("different call"), "{message}");
    }
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.side_effects("create_payment"), 0);
}

/// A tool that made its effect and then answered `-32603` (rmcp's
/// `ErrorData::internal_error`): the key stays taken. A re-send under the same key is told the
/// first may have run (409, `KEY_OUTCOME_UNKNOWN`) and never runs the tool again; the key was
/// once freed by every JSON-RPC error, and the tool ran twice.
#[tokio::test]
async fn a_json_rpc_error_after_the_effect_keeps_the_key_and_the_tool_is_not_run_again() {
    let server = keyed_server_over(MemoryLedger::new()).await;
    server.state.fail_next_after_effect("deploy_release");
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let key = [("idempotency-key", "k-32603")];
    let args = json!({"service": "catalog", "version": "1.0.0"});
    let (_, _, first) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "deploy_release",
        args.clone(),
        &key,
    )
    .await;
    assert_eq!(error_code(&first), -32603, "{first}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let (status, replayed, again) =
        keyed_call(&server, session.as_deref(), 2, "deploy_release", args, &key).await;
    assert_eq!((status, replayed), (StatusCode::CONFLICT, false), "{again}");
    assert_eq!(
        error_code(&again),
        mcp_replay_guard::integrations::server::KEY_OUTCOME_UNKNOWN
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

/// A keyed server over a memory ledger whose slow tool takes 500 ms, with the slow tool's call
/// (id 1, `{"service": "catalog"}`, under `key`) sent on its own task and begun there. Returns
/// the server, the session and the task, which ends with the first call's answer.
async fn slow_call_running(key: &str) -> (TestServer, Option<String>, JoinHandle<Value>) {
    let server = keyed_server(
        IdempotencyLayer::new(MemoryLedger::new(), fingerprint_key()),
        ServerOptions {
            slow_tool_delay: Duration::from_millis(500),
            ..ServerOptions::default()
        },
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let first = {
        let (server_url, session, key) = (server.url.clone(), session.clone(), key.to_owned());
        tokio::spawn(async move {
            let request = with_idempotency_key(
                post(
                    &server_url,
                    session.as_deref(),
                    PROTOCOL_VERSION,
                    tool_call_body(1, "slow_deploy", json!({"service": "catalog"})),
                ),
                &key,
            );
            let response = send(&mut hyper_client(), request).await.unwrap();
            read_response_to_end(response).await
        })
    };
    assert_eq!(
        server
            .state
            .wait_for_started("slow_deploy", 1, Duration::from_secs(5))
            .await,
        1
    );
    (server, session, first)
}

#[tokio::test]
async fn a_repeat_while_the_first_runs_is_409_and_after_it_is_the_result() {
    let (server, session, first) = slow_call_running("k-409").await;
    let key = [("idempotency-key", "k-409")];
    let args = json!({"service": "catalog"});

    let (status, _, busy) = keyed_call(
        &server,
        session.as_deref(),
        2,
        "slow_deploy",
        args.clone(),
        &key,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{busy}");
    assert_eq!(busy["id"], 2);
    assert_eq!(error_code(&busy), KEY_IN_FLIGHT);

    let first = first.await.unwrap();
    let (status, replayed, later) =
        keyed_call(&server, session.as_deref(), 3, "slow_deploy", args, &key).await;
    assert_eq!((status, replayed), (StatusCode::OK, true), "{later}");
    assert_eq!(later["result"], first["result"]);
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
}

/// Paths that all reach the one MCP endpoint of the test server (it serves every path, as
/// rmcp's service does): a key is one call on all of them.
const SAME_SERVER_PATHS: [&str; 5] = ["/mcp", "/mcp/", "//mcp", "/MCP", "/other"];

#[tokio::test]
async fn one_key_on_every_path_to_the_server_is_one_call() {
    let ledger = MemoryLedger::new();
    let server = keyed_server_over(ledger.clone()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let key = [("idempotency-key", "k-paths")];
    let args = json!({"service": "catalog", "version": "3.0.0"});
    let url = |path: &str| format!("http://{}{path}", server.addr);

    let (status, replayed, first) = keyed_call_at(
        &url(SAME_SERVER_PATHS[0]),
        session.as_deref(),
        1,
        "deploy_release",
        args.clone(),
        &key,
    )
    .await;
    assert_eq!((status, replayed), (StatusCode::OK, false), "{first}");
    // The same call under the same key on each other path: the kept response, not a run.
    for (id, path) in (2..).zip(&SAME_SERVER_PATHS[1..]) {
        let (status, replayed, repeat) = keyed_call_at(
            &url(path),
            session.as_deref(),
            id,
            "deploy_release",
            args.clone(),
            &key,
        )
        .await;
        assert_eq!(
            (status, replayed),
            (StatusCode::OK, true),
            "{path}: {repeat}"
        );
        assert_eq!(repeat["id"], id, "{path}: {repeat}");
        assert_eq!(repeat["result"], first["result"], "{path}");
    }
    // Another call under the key, on each path: 422, not run.
    for (id, path) in (10..).zip(SAME_SERVER_PATHS) {
        let other = json!({"service": "catalog", "version": "4.0.0"});
        let (status, replayed, answer) = keyed_call_at(
            &url(path),
            session.as_deref(),
            id,
            "deploy_release",
            other,
            &key,
        )
        .await;
        assert_eq!(
            (status, replayed),
            (StatusCode::UNPROCESSABLE_ENTITY, false),
            "{path}: {answer}"
        );
        assert_eq!(error_code(&answer), KEY_REUSED, "{path}");
    }
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        records[0].target().as_str(),
        IdempotencyLayer::DEFAULT_TARGET
    );
}

#[tokio::test]
async fn a_repeat_on_another_path_while_the_first_runs_is_409() {
    let (server, session, first) = slow_call_running("k-paths-409").await;
    let key = [("idempotency-key", "k-paths-409")];
    let args = json!({"service": "catalog"});
    for (id, path) in (2..).zip(&SAME_SERVER_PATHS[1..]) {
        let (status, _, busy) = keyed_call_at(
            &format!("http://{}{path}", server.addr),
            session.as_deref(),
            id,
            "slow_deploy",
            args.clone(),
            &key,
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{path}: {busy}");
        assert_eq!(error_code(&busy), KEY_IN_FLIGHT, "{path}");
    }
    first.await.unwrap();
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
}

/// Fifty concurrent requests with one key; returns (status, replayed, message) per request.
async fn fifty_at_once(
    server: &TestServer,
    session: Option<String>,
) -> Vec<(StatusCode, bool, Value)> {
    let calls = (0..50).map(|id| {
        let (url, session) = (server.url.clone(), session.clone());
        tokio::spawn(async move {
            let request = with_idempotency_key(
                post(
                    &url,
                    session.as_deref(),
                    PROTOCOL_VERSION,
                    tool_call_body(100 + id, "slow_deploy", json!({"service": "catalog"})),
                ),
                "k-fifty",
            );
            let response = send(&mut hyper_client(), request).await.unwrap();
            let status = response.status();
            let replayed = response.headers().get(IDEMPOTENT_REPLAYED).is_some();
            (status, replayed, read_response_to_end(response).await)
        })
    });
    let mut answers = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        answers.push(call.await.unwrap());
    }
    answers
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_run_the_tool_once() {
    let server = keyed_server(
        IdempotencyLayer::new(MemoryLedger::new(), fingerprint_key()),
        ServerOptions {
            slow_tool_delay: Duration::from_secs(1),
            ..ServerOptions::default()
        },
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();

    let answers = fifty_at_once(&server, session).await;

    let ran: Vec<_> = answers
        .iter()
        .filter(|(s, replayed, _)| *s == StatusCode::OK && !replayed)
        .collect();
    assert_eq!(ran.len(), 1, "exactly one request ran the tool");
    let conflicts = answers
        .iter()
        .filter(|(s, _, m)| *s == StatusCode::CONFLICT && error_code(m) == KEY_IN_FLIGHT)
        .count();
    let replays = answers
        .iter()
        .filter(|(s, replayed, m)| *s == StatusCode::OK && *replayed && deployment(m) == 1)
        .count();
    assert_eq!(conflicts + replays, 49, "{answers:#?}");
    assert!(conflicts > 0, "the repeats came while the first ran");
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
}

#[tokio::test]
async fn fifty_concurrent_requests_in_wait_mode_all_get_the_one_result() {
    let server = keyed_server(
        IdempotencyLayer::new(MemoryLedger::new(), fingerprint_key())
            .in_flight(InFlight::Wait(Duration::from_secs(20))),
        ServerOptions {
            slow_tool_delay: Duration::from_secs(1),
            ..ServerOptions::default()
        },
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();

    let answers = fifty_at_once(&server, session).await;

    for (i, (status, _, message)) in answers.iter().enumerate() {
        assert_eq!(*status, StatusCode::OK, "{message}");
        assert_eq!(message["id"], 100 + i as i64);
        assert_eq!(deployment(message), 1, "{message}");
    }
    assert_eq!(
        answers.iter().filter(|(_, replayed, _)| !replayed).count(),
        1
    );
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
}

/// The principal, as an authentication layer would establish it: a bearer token looked up in
/// a table. The token itself is a credential and must never be recorded.
fn principal_from_bearer(parts: &http::request::Parts) -> Option<Actor> {
    let token = parts
        .headers
        .get(AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    match token {
        "tok-alice-s3cr3t" => Some(Actor::new("user:alice")),
        "tok-bob-s3cr3t" => Some(Actor::new("user:bob")),
        _ => None,
    }
}

#[tokio::test]
async fn two_principals_with_the_same_key_run_twice_without_cross_talk() {
    let ledger = MemoryLedger::new();
    let server = keyed_server(
        IdempotencyLayer::new(ledger.clone(), fingerprint_key()).principal(principal_from_bearer),
        ServerOptions::default(),
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let args = json!({"service": "catalog", "version": "1.0.0"});
    let as_user =
        |token: &'static str| [("idempotency-key", "shared-key"), ("authorization", token)];
    let alice = as_user("Bearer tok-alice-s3cr3t");
    let bob = as_user("Bearer tok-bob-s3cr3t");

    let (_, replayed_a, a) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "deploy_release",
        args.clone(),
        &alice,
    )
    .await;
    let (_, replayed_b, b) = keyed_call(
        &server,
        session.as_deref(),
        2,
        "deploy_release",
        args.clone(),
        &bob,
    )
    .await;
    assert!(!replayed_a && !replayed_b);
    assert_eq!((deployment(&a), deployment(&b)), (&json!(1), &json!(2)));
    // Each principal's repeat gets its own result.
    let (_, replayed, a_again) = keyed_call(
        &server,
        session.as_deref(),
        3,
        "deploy_release",
        args.clone(),
        &alice,
    )
    .await;
    assert!(replayed);
    assert_eq!(deployment(&a_again), 1);
    let (_, replayed, b_again) =
        keyed_call(&server, session.as_deref(), 4, "deploy_release", args, &bob).await;
    assert!(replayed);
    assert_eq!(deployment(&b_again), 2);
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // Keyed per principal in the ledger; no token anywhere in it.
    let records = ledger.list().await.unwrap();
    let mut actors: Vec<_> = records.iter().map(|r| r.actor().to_string()).collect();
    actors.sort();
    assert_eq!(actors, ["user:alice", "user:bob"]);
    let mut everything = serde_json::to_string(&records).unwrap();
    for record in &records {
        let events = ledger.events(record.execution_id()).await.unwrap();
        everything += &serde_json::to_string(&events).unwrap();
    }
    assert!(!everything.contains("s3cr3t"), "{everything}");
    assert!(!everything.contains("Bearer"), "{everything}");
}

#[tokio::test]
async fn a_kept_response_survives_a_server_restart_over_the_file_ledger() {
    let path = temp_dir("restart").join("idempotency.jsonl");
    let args = json!({"service": "catalog", "version": "3.0.0"});
    let key = [("idempotency-key", "k-restart")];

    let first = {
        let ledger = FileLedger::open(&path).unwrap();
        let fingerprint_key = ledger.fingerprint_key().unwrap();
        let server = keyed_server(
            IdempotencyLayer::new(ledger, fingerprint_key),
            ServerOptions::default(),
        )
        .await;
        let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
        let (status, _, first) = keyed_call(
            &server,
            session.as_deref(),
            1,
            "deploy_release",
            args.clone(),
            &key,
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{first}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
        first
    }; // the server and its ledger are gone

    let ledger = FileLedger::open(&path).unwrap();
    let fingerprint_key = ledger.fingerprint_key().unwrap();
    let server = keyed_server(
        IdempotencyLayer::new(ledger, fingerprint_key),
        ServerOptions::default(),
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let (status, replayed, repeat) =
        keyed_call(&server, session.as_deref(), 7, "deploy_release", args, &key).await;

    assert_eq!((status, replayed), (StatusCode::OK, true), "{repeat}");
    assert_eq!(repeat["id"], 7);
    assert_eq!(repeat["result"], first["result"]);
    assert_eq!(
        server.state.side_effects("deploy_release"),
        0,
        "1 run in total"
    );
    mcp_replay_guard::ledger::verify_file(&path).unwrap();
}

#[tokio::test]
async fn an_sse_only_client_gets_the_replay_as_one_sse_event() {
    let server = keyed_server_over(MemoryLedger::new()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let args = json!({"amount": 100, "currency": "eur"});
    let key = ("idempotency-key", "k-sse");
    let (_, _, first) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "create_payment",
        args.clone(),
        &[key],
    )
    .await;

    let (status, replayed, repeat) = keyed_call(
        &server,
        session.as_deref(),
        2,
        "create_payment",
        args,
        &[key, ("accept", "text/event-stream")],
    )
    .await;

    assert_eq!((status, replayed), (StatusCode::OK, true));
    assert_eq!(repeat["id"], 2);
    assert_eq!(repeat["result"], first["result"]);
    assert_eq!(server.state.side_effects("create_payment"), 1);
}

#[tokio::test]
async fn stateless_json_answers_are_kept_and_replayed() {
    let server = keyed_server(
        IdempotencyLayer::new(MemoryLedger::new(), fingerprint_key()),
        ServerOptions {
            json_response: true,
            ..ServerOptions::stateless()
        },
    )
    .await;
    server
        .state
        .faults()
        .schedule("create_payment", Fault::DropResponseAfterTool);
    let args = json!({"amount": 700, "currency": "usd"});
    let request = |id: i64| {
        with_idempotency_key(
            post(
                &server.url,
                None,
                STATELESS_PROTOCOL_VERSION,
                stateless_tool_call_body(id, "create_payment", args.clone()),
            ),
            "k-stateless",
        )
    };

    let lost = send(&mut hyper_client(), request(1)).await;
    assert!(lost.is_err(), "the fault lost the response");
    let response = send(&mut hyper_client(), request(2)).await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(response.headers().contains_key(IDEMPOTENT_REPLAYED));
    let repeat = read_response_to_end(response).await;

    assert_eq!(repeat["id"], 2);
    assert_eq!(
        repeat["result"]["structuredContent"]["payment"], 1,
        "{repeat}"
    );
    assert_eq!(server.state.side_effects("create_payment"), 1);
}

/// A client that gives up on a keyed call (it drops the exchange after `give_up`) and
/// repeats it once the tool has run: the repeat gets the kept result, the tool ran once.
async fn give_up_then_repeat(options: ServerOptions, version: &str, give_up: Duration) {
    let ledger = MemoryLedger::new();
    let server = keyed_server(
        IdempotencyLayer::new(ledger.clone(), fingerprint_key()),
        ServerOptions {
            slow_tool_delay: Duration::from_millis(400),
            ..options
        },
    )
    .await;
    let session = if version == PROTOCOL_VERSION {
        initialize(&mut hyper_client(), &server.url).await.unwrap()
    } else {
        None
    };
    let request = |id: i64| {
        let body = if version == PROTOCOL_VERSION {
            tool_call_body(id, "slow_deploy", json!({"service": "catalog"}))
        } else {
            stateless_tool_call_body(id, "slow_deploy", json!({"service": "catalog"}))
        };
        with_idempotency_key(
            post(&server.url, session.as_deref(), version, body),
            "k-gone",
        )
    };

    // The client gives up: the response future (and its connection) is dropped, or the body
    // is dropped unread.
    let _ = tokio::time::timeout(give_up, async {
        let response = send(&mut hyper_client(), request(1)).await;
        drop(response);
    })
    .await;
    assert_eq!(
        server
            .state
            .wait_for_side_effects("slow_deploy", 1, Duration::from_secs(5))
            .await,
        1
    );
    wait_for_state(&ledger, ExecutionState::Completed).await;

    let response = send(&mut hyper_client(), request(2)).await.unwrap();
    assert!(response.headers().contains_key(IDEMPOTENT_REPLAYED));
    let repeat = read_response_to_end(response).await;
    assert_eq!(repeat["id"], 2);
    assert_eq!(deployment(&repeat), 1, "{repeat}");
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
}

#[tokio::test]
async fn a_client_that_drops_the_call_before_the_answer_head_gets_the_result_on_its_repeat() {
    // 2026-07-28: rmcp holds the answer's head until the result, so the client gives up
    // while the layer's future is still waiting for it.
    give_up_then_repeat(
        ServerOptions::stateless(),
        STATELESS_PROTOCOL_VERSION,
        Duration::from_millis(100),
    )
    .await;
}

#[tokio::test]
async fn a_client_that_drops_the_answer_stream_unread_gets_the_result_on_its_repeat() {
    // Sessions: the SSE head comes at once; the client drops the stream before the result.
    give_up_then_repeat(
        ServerOptions::default(),
        PROTOCOL_VERSION,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test]
async fn a_key_past_its_retention_runs_again() {
    let server = keyed_server(
        IdempotencyLayer::new(MemoryLedger::new(), fingerprint_key())
            .retention(Duration::from_millis(1)),
        ServerOptions::default(),
    )
    .await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let args = json!({"service": "catalog", "version": "1.0.0"});
    let key = [("idempotency-key", "k-retention")];
    let (_, _, first) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "deploy_release",
        args.clone(),
        &key,
    )
    .await;
    // Let the ledger's wall clock pass the 1 ms window (the ledger keeps wall-clock times).
    std::thread::sleep(Duration::from_millis(5));

    let (status, replayed, again) =
        keyed_call(&server, session.as_deref(), 2, "deploy_release", args, &key).await;

    assert_eq!((status, replayed), (StatusCode::OK, false));
    assert_eq!(
        (deployment(&first), deployment(&again)),
        (&json!(1), &json!(2))
    );
    assert_eq!(server.state.side_effects("deploy_release"), 2);
}

#[tokio::test]
async fn unkeyed_calls_and_other_traffic_pass_through_and_bad_keys_are_refused() {
    let ledger = MemoryLedger::new();
    let server = keyed_server_over(ledger.clone()).await;
    // An initialize with a key is not a tools/call: the key means nothing there.
    let init = with_idempotency_key(
        post(
            &server.url,
            None,
            PROTOCOL_VERSION,
            initialize_body(0, PROTOCOL_VERSION),
        ),
        "k-init",
    );
    let response = send(&mut hyper_client(), init).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let args = json!({"service": "catalog", "version": "1.0.0"});
    for id in [1, 2] {
        let response = call_tool(
            &mut hyper_client(),
            &server.url,
            session.as_deref(),
            id,
            "deploy_release",
            args.clone(),
        )
        .await
        .unwrap();
        assert_eq!(deployment(&response), id);
    }
    assert!(ledger.list().await.unwrap().is_empty());

    let (status, _, refused) = keyed_call(
        &server,
        session.as_deref(),
        3,
        "deploy_release",
        args,
        &[("idempotency-key", "\"unterminated")],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(refused["id"], 3);
    assert_eq!(error_code(&refused), -32600);
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    assert!(ledger.list().await.unwrap().is_empty());
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn two_replicas_share_keys_through_the_postgres_ledger() {
    use mcp_replay_guard::ledger::PostgresLedger;
    let Some(url) = postgres_url() else {
        return;
    };
    let schema = format!(
        "mrg_t_server_{}",
        ExecutionId::new().ulid().to_string().to_lowercase()
    );
    let replica = || async {
        let ledger = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap_or_else(|e| panic!("connecting to {POSTGRES_URL_VAR}: {e}"));
        keyed_server_over(ledger).await
    };
    let (a, b) = (replica().await, replica().await);
    let args = json!({"service": "catalog", "version": "4.0.0"});
    let key = [("idempotency-key", "k-replicas")];
    let session_a = initialize(&mut hyper_client(), &a.url).await.unwrap();
    let session_b = initialize(&mut hyper_client(), &b.url).await.unwrap();

    let (_, _, first) = keyed_call(
        &a,
        session_a.as_deref(),
        1,
        "deploy_release",
        args.clone(),
        &key,
    )
    .await;
    let (status, replayed, repeat) =
        keyed_call(&b, session_b.as_deref(), 2, "deploy_release", args, &key).await;

    assert_eq!((status, replayed), (StatusCode::OK, true), "{repeat}");
    assert_eq!(repeat["result"], first["result"]);
    let runs = a.state.side_effects("deploy_release") + b.state.side_effects("deploy_release");
    assert_eq!(runs, 1);
    let ledger = PostgresLedger::connect_with_schema(&url, &schema)
        .await
        .unwrap();
    let client = ledger.pool().get().await.unwrap();
    client
        .execute(format!("DROP SCHEMA \"{schema}\" CASCADE").as_str(), &[])
        .await
        .unwrap();
}

#[tokio::test]
async fn a_key_reused_for_an_order_id_a_double_cannot_tell_apart_is_422() {
    let server = keyed_server_over(MemoryLedger::new()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let key = [("idempotency-key", "k-wide")];
    let order =
        |order_id: u64| json!({"service": "catalog", "version": "1.0.0", "order_id": order_id});
    let (status, _, _) = keyed_call(
        &server,
        session.as_deref(),
        1,
        "deploy_release",
        order(9007199254740992),
        &key,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, replayed, answer) = keyed_call(
        &server,
        session.as_deref(),
        2,
        "deploy_release",
        order(9007199254740993),
        &key,
    )
    .await;
    assert_eq!(
        (status, replayed),
        (StatusCode::UNPROCESSABLE_ENTITY, false),
        "{answer}"
    );
    assert_eq!(error_code(&answer), KEY_REUSED);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}

/// A keyed `tools/call` the layer cannot classify (here: the key `version` twice in its
/// arguments) never reaches the tool: rmcp would read the last `version` and run it on every
/// repeat of the key, with no binding recorded. Repeated three times with one key, the tool
/// runs zero times and each answer is a 400 that says the call was not run.
#[tokio::test]
async fn a_keyed_call_the_layer_cannot_classify_is_refused_not_run_unkeyed() {
    let ledger = MemoryLedger::new();
    let server = keyed_server_over(ledger.clone()).await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let raw = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"deploy_release","arguments":{"service":"catalog","version":"1.0.0","version":"2.0.0"}}}"#;
    for _ in 0..3 {
        let mut request = post(&server.url, session.as_deref(), PROTOCOL_VERSION, json!({}));
        *request.body_mut() = http_body_util::Full::new(bytes::Bytes::from_static(raw.as_bytes()));
        request
            .headers_mut()
            .insert("idempotency-key", HeaderValue::from_static("k-dup"));
        let response = send(&mut hyper_client(), request).await.unwrap();
        let status = response.status();
        let text = read_response_to_end(response).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(
            text.to_string().contains("not run"),
            "the answer says the call was not run: {text}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    assert!(ledger.list().await.unwrap().is_empty());
}
