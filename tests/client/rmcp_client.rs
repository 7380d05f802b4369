//! rmcp's own client over `TowerHttpClient`, stacked on `GuardLayer` and a hyper client,
//! against rmcp's own Streamable HTTP server on 127.0.0.1 (tests/support). The server's
//! side-effect counters and the guard's ledger are the ground truth.

use crate::support;

use std::time::Duration;

use hyper_util::client::legacy::{Client, connect::HttpConnector};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    execution::{ExecutionRecord, ExecutionState},
    fingerprint::FingerprintKey,
    guard::{Guard, GuardLayer, GuardRequestBody},
    integrations::rmcp::TowerHttpClient,
    ledger::{Ledger, MemoryLedger},
};
use rmcp::{
    ClientServiceExt, RoleClient, ServiceError, ServiceExt,
    model::{CallToolRequestParams, CallToolResult, ProtocolVersion},
    service::{ClientLifecycleMode, RunningService},
    transport::{
        StreamableHttpClientTransport,
        streamable_http_client::{StreamableHttpClientTransportConfig, StreamableHttpError},
    },
};
use serde_json::{Value, json};
use support::*;
use tower::Layer;

type Stack = Guard<Client<HttpConnector, GuardRequestBody>>;
type Transport = StreamableHttpClientTransport<TowerHttpClient<Stack>>;
type McpClient = RunningService<RoleClient, ()>;

fn registry() -> ContractRegistry {
    ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .tool("list_branches", ToolContract::read_only())
        .build()
        .unwrap()
}

fn transport(
    url: &str,
    ledger: &MemoryLedger,
    config: StreamableHttpClientTransportConfig,
) -> Transport {
    let guard = GuardLayer::new(
        ledger.clone(),
        registry(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    );
    let stack = guard.layer(hyper_client_with_body::<GuardRequestBody>());
    let mut config = config;
    config.uri = url.into();
    StreamableHttpClientTransport::with_client(TowerHttpClient::new(stack), config)
}

/// rmcp's client with the classic `initialize` handshake (2025-11-25, sessions).
async fn connect(server: &TestServer, ledger: &MemoryLedger) -> McpClient {
    connect_with(
        server,
        ledger,
        StreamableHttpClientTransportConfig::default(),
    )
    .await
}

async fn connect_with(
    server: &TestServer,
    ledger: &MemoryLedger,
    config: StreamableHttpClientTransportConfig,
) -> McpClient {
    ().serve(transport(&server.url, ledger, config))
        .await
        .expect("rmcp client initialises through the guard")
}

/// rmcp's client in the 2026-07-28 era: `server/discover`, no session, per-request `_meta`.
async fn connect_stateless(
    server: &TestServer,
    ledger: &MemoryLedger,
    config: StreamableHttpClientTransportConfig,
) -> McpClient {
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    ().serve_with_lifecycle(transport(&server.url, ledger, config), lifecycle)
        .await
        .expect("rmcp client discovers the server through the guard")
}

async fn deploy(
    client: &McpClient,
    service: &str,
    version: &str,
) -> Result<CallToolResult, ServiceError> {
    let arguments = json!({"service": service, "version": version});
    let params = CallToolRequestParams::new("deploy_release")
        .with_arguments(arguments.as_object().cloned().unwrap());
    tokio::time::timeout(Duration::from_secs(20), client.call_tool(params))
        .await
        .expect("the call settles")
}

fn text(result: &CallToolResult) -> Value {
    serde_json::to_value(&result.content).unwrap()[0]["text"].clone()
}

/// Polls the ledger (the guard records `delivered` as the body's end is read, which rmcp
/// does after it has handed the response on) until a record matches.
async fn wait_for_record(
    ledger: &MemoryLedger,
    what: &str,
    matches: impl Fn(&ExecutionRecord) -> bool,
) -> ExecutionRecord {
    for _ in 0..200 {
        if let Some(record) = ledger.list().await.unwrap().into_iter().find(&matches) {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no record {what}: {:#?}", ledger.list().await.unwrap());
}

fn completed_and_delivered(record: &ExecutionRecord) -> bool {
    record.state() == ExecutionState::Completed && record.delivered_at().is_some()
}

#[tokio::test]
async fn a_call_through_the_guard_runs_once_and_is_delivered() {
    let server = TestServer::start().await;
    let ledger = MemoryLedger::new();
    let client = connect(&server, &ledger).await;

    let result = deploy(&client, "catalog", "2026.07.22").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 2026.07.22");
    assert_eq!(result.structured_content, Some(json!({"deployment": 1})));
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let record = wait_for_record(&ledger, "completed and delivered", completed_and_delivered).await;
    assert_eq!(ledger.list().await.unwrap().len(), 1);
    assert_eq!(record.tool(), "deploy_release");
    assert_eq!(record.attempts(), 1);
    assert_eq!(record.target_status(), Some(200));

    // What reached the server: the session-era headers rmcp asks for, and the guard's key.
    let [call] = server
        .state
        .tool_call_requests("deploy_release")
        .try_into()
        .unwrap();
    let session = server.state.session_ids().pop().expect("one session");
    assert_eq!(call.session_id.as_deref(), Some(session.as_str()));
    assert_eq!(call.protocol_version.as_deref(), Some(PROTOCOL_VERSION));
    let key = record.execution_id().to_string();
    assert_eq!(call.idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(server.state.idempotency_keys("deploy_release"), [Some(key)]);
    assert_eq!(
        record.correlation().session_id.as_deref(),
        Some(session.as_str())
    );

    // Closing the client ends the session with a DELETE through the same stack.
    client.cancel().await.unwrap();
    let deletes: Vec<_> = server
        .state
        .all_requests()
        .into_iter()
        .filter(|r| r.method == http::Method::DELETE)
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:#?}");
    assert_eq!(deletes[0].session_id.as_deref(), Some(session.as_str()));
}

#[tokio::test]
async fn an_expired_session_is_reinitialised_and_the_call_sent_once_more() {
    let server = TestServer::start().await;
    let ledger = MemoryLedger::new();
    let client = connect(&server, &ledger).await;
    deploy(&client, "catalog", "1.0.0").await.unwrap();
    let first = wait_for_record(&ledger, "first delivered", completed_and_delivered).await;
    let old_session = server.state.session_ids().pop().unwrap();

    server.state.clear_sessions();
    let result = deploy(&client, "catalog", "2.0.0").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 2.0.0");

    // The tool ran exactly once for the second call.
    let runs = server.state.tool_runs("deploy_release");
    let second_runs: Vec<_> = runs
        .iter()
        .filter(|run| run.arguments["version"] == "2.0.0")
        .collect();
    assert_eq!(second_runs.len(), 1, "{runs:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // On the wire: the 404'd POST in the old session, a new handshake, the same message again
    // in the new session.
    let calls: Vec<_> = server
        .state
        .tool_call_requests("deploy_release")
        .into_iter()
        .filter(|r| r.body.as_ref().unwrap()["params"]["arguments"]["version"] == "2.0.0")
        .collect();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    assert_eq!(calls[0].session_id.as_deref(), Some(old_session.as_str()));
    let new_session = server.state.session_ids().pop().unwrap();
    assert_ne!(new_session, old_session);
    assert_eq!(calls[1].session_id.as_deref(), Some(new_session.as_str()));
    assert_eq!(
        calls[0].jsonrpc_id, calls[1].jsonrpc_id,
        "the same message re-sent"
    );
    let initializes = server
        .state
        .requests()
        .iter()
        .filter(|r| r.jsonrpc_method.as_deref() == Some("initialize"))
        .count();
    assert_eq!(initializes, 2);

    // In the ledger: the refused attempt failed (404, the tool never ran), then a new
    // execution completed under its own key.
    let delivered = wait_for_record(&ledger, "second delivered", |r| {
        r.execution_id() != first.execution_id() && completed_and_delivered(r)
    })
    .await;
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 3, "{records:#?}");
    let failed: Vec<_> = records
        .iter()
        .filter(|r| r.state() == ExecutionState::Failed)
        .collect();
    assert_eq!(failed.len(), 1, "{records:#?}");
    assert_eq!(failed[0].target_status(), Some(404));
    assert_eq!(
        failed[0].correlation().session_id.as_deref(),
        Some(old_session.as_str())
    );
    assert_eq!(
        calls[0].idempotency_key.as_deref(),
        Some(failed[0].execution_id().to_string().as_str())
    );
    let key = delivered.execution_id().to_string();
    assert_eq!(calls[1].idempotency_key.as_deref(), Some(key.as_str()));
    assert_eq!(
        second_runs[0].idempotency_key.as_deref(),
        Some(key.as_str())
    );
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn the_stateless_era_works_through_the_guard() {
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let ledger = MemoryLedger::new();
    let client = connect_stateless(
        &server,
        &ledger,
        StreamableHttpClientTransportConfig::default(),
    )
    .await;

    let result = deploy(&client, "catalog", "2026.07.28").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 2026.07.28");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let record = wait_for_record(&ledger, "completed and delivered", completed_and_delivered).await;
    assert_eq!(ledger.list().await.unwrap().len(), 1);
    let requests = server.state.requests();
    assert!(
        requests
            .iter()
            .all(|r| r.jsonrpc_method.as_deref() != Some("initialize")),
        "no handshake in the 2026 era: {requests:#?}"
    );
    let [call] = server
        .state
        .tool_call_requests("deploy_release")
        .try_into()
        .unwrap();
    assert_eq!(
        call.protocol_version.as_deref(),
        Some(STATELESS_PROTOCOL_VERSION)
    );
    assert_eq!(call.session_id, None);
    assert_eq!(
        call.body.as_ref().unwrap()["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"],
        STATELESS_PROTOCOL_VERSION
    );
    let key = record.execution_id().to_string();
    assert_eq!(call.idempotency_key.as_deref(), Some(key.as_str()));
    client.cancel().await.unwrap();
}

/// A `deploy_release` whose result (it echoes the service name) is about 5 KiB.
async fn deploy_large(client: &McpClient) -> Result<CallToolResult, ServiceError> {
    deploy(client, &"x".repeat(4096), "9.9.9").await
}

#[tokio::test]
async fn an_sse_event_over_the_limit_fails_the_call_and_nothing_is_resent() {
    let server = TestServer::start().await;
    let ledger = MemoryLedger::new();
    let config = StreamableHttpClientTransportConfig::default().max_sse_event_size(2048);
    let client = connect_with(&server, &ledger, config).await;

    let error = deploy_large(&client).await.unwrap_err();
    assert!(matches!(error, ServiceError::TransportClosed), "{error:?}");
    // The limit is on reading: the tool ran once, and was neither re-sent nor resumed.
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let resumes: Vec<_> = server
        .state
        .all_requests()
        .into_iter()
        .filter(|r| r.last_event_id.is_some())
        .collect();
    assert!(resumes.is_empty(), "{resumes:#?}");

    // The guard read the rest of the body itself: completed, but never delivered.
    let record = wait_for_record(&ledger, "completed", |r| {
        r.state() == ExecutionState::Completed
    })
    .await;
    assert_eq!(record.delivered_at(), None);

    // The transport is still usable.
    let result = deploy(&client, "catalog", "1.0.0").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 1.0.0");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_json_body_over_the_limit_fails_the_call() {
    let options = ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    };
    let server = TestServer::start_with(options).await;
    let ledger = MemoryLedger::new();
    let config = StreamableHttpClientTransportConfig::default().max_json_response_size(2048);
    let client = connect_stateless(&server, &ledger, config).await;

    let error = deploy_large(&client).await.unwrap_err();
    let ServiceError::TransportSend(error) = error else {
        panic!("{error:?}");
    };
    let error = error
        .error
        .downcast_ref::<StreamableHttpError<mcp_replay_guard::integrations::rmcp::TowerClientError>>()
        .unwrap_or_else(|| panic!("{error:?}"));
    assert!(
        matches!(
            error,
            StreamableHttpError::ResponseBodyTooLarge { max_size: 2048 }
        ),
        "{error:?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let record = wait_for_record(&ledger, "completed", |r| {
        r.state() == ExecutionState::Completed
    })
    .await;
    assert_eq!(record.delivered_at(), None);

    let result = deploy(&client, "catalog", "1.0.0").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 1.0.0");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_broken_stream_is_resumed_with_last_event_id_and_not_resent() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let ledger = MemoryLedger::new();
    let client = connect(&server, &ledger).await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);

    let result = deploy(&client, "catalog", "3.0.0").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 3.0.0");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let resumes = server.state.resume_requests();
    assert_eq!(resumes.len(), 1, "{resumes:#?}");

    // The guard followed the resume: one execution, completed from the replayed stream.
    let record = wait_for_record(&ledger, "completed and delivered", completed_and_delivered).await;
    assert_eq!(ledger.list().await.unwrap().len(), 1);
    assert_eq!(record.attempts(), 1);
    assert_eq!(record.correlation().last_event_id, resumes[0].last_event_id);
    client.cancel().await.unwrap();
}

/// `GuardedTransport` is transport-neutral: around rmcp's own Streamable HTTP transport (over a
/// plain hyper client, no guard below it), a guarded call runs once, is recorded delivered, and
/// a repeat inside its link window while it is in the ledger is decided there.
#[tokio::test]
async fn the_guarded_transport_works_around_rmcps_streamable_http_transport() {
    use http_body_util::Full;
    use mcp_replay_guard::integrations::rmcp::GuardedTransport;

    let server = TestServer::start().await;
    let ledger = MemoryLedger::new();
    let guard = GuardLayer::new(
        ledger.clone(),
        registry(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    );
    let http = StreamableHttpClientTransport::with_client(
        TowerHttpClient::new(hyper_client_with_body::<Full<bytes::Bytes>>()),
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()),
    );
    let client = ().serve(GuardedTransport::new(&guard, http)).await.unwrap();

    let result = deploy(&client, "catalog", "2026.12.01").await.unwrap();
    assert_eq!(text(&result), "deployed catalog 2026.12.01");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    // Over a transport of messages, the answer is delivered once rmcp sends its next message
    // (a write into the transport proves nothing): until then it is kept.
    let kept = ledger.list().await.unwrap();
    assert!(kept.iter().all(|r| r.delivered_at().is_none()), "{kept:#?}");
    client.list_all_tools().await.unwrap();
    let record = wait_for_record(&ledger, "completed and delivered", completed_and_delivered).await;
    assert_eq!(record.tool(), "deploy_release");
    assert_eq!(record.attempts(), 1);
    client.cancel().await.unwrap();
}
