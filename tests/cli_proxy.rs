//! `replay-guard proxy`, run as the built binary between rmcp's own client (over
//! `TowerHttpClient` and a plain hyper client: no guard in the client) and rmcp's own server.

mod support;

use std::{process::Stdio, time::Duration};

use mcp_replay_guard::integrations::rmcp::TowerHttpClient;
use rmcp::{
    RoleClient, ServiceError, ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use support::*;
use tokio::io::AsyncBufReadExt;

/// A running proxy process, killed when dropped.
struct Proxy {
    url: String,
    _child: tokio::process::Child,
}

async fn start_proxy(upstream: &str, extra: &[&str]) -> Proxy {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .args(extra)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the proxy starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("the proxy says where it listens")
    .unwrap();
    // "listening on http://127.0.0.1:PORT -> upstream"
    let address = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    Proxy {
        url: format!("{address}/mcp"),
        _child: child,
    }
}

type McpClient = RunningService<RoleClient, ()>;

async fn connect(url: &str) -> McpClient {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    let transport =
        StreamableHttpClientTransport::with_client(TowerHttpClient::new(hyper_client()), config);
    ().serve(transport)
        .await
        .expect("rmcp client initialises through the proxy")
}

async fn deploy(client: &McpClient) -> Result<CallToolResult, ServiceError> {
    let arguments = json!({"service": "catalog", "version": "2026.07.22"});
    let params = CallToolRequestParams::new("deploy_release")
        .with_arguments(arguments.as_object().cloned().unwrap());
    tokio::time::timeout(Duration::from_secs(30), client.call_tool(params))
        .await
        .expect("the call settles")
}

fn text(result: &CallToolResult) -> Value {
    serde_json::to_value(&result.content).unwrap()[0]["text"].clone()
}

#[tokio::test]
async fn a_repeat_after_a_lost_response_attaches_through_the_proxy() {
    let server = TestServer::start().await;
    let proxy = start_proxy(&server.url, &[]).await;
    let client = connect(&proxy.url).await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);

    // The response is lost after the tool ran: the client sees an error.
    let first = deploy(&client).await;
    assert!(
        first.is_err() || first.as_ref().is_ok_and(|r| r.is_error == Some(true)),
        "{first:?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // The agent asks again: the proxy's guard answers from the ledger (deploy_release has no
    // contract, so it is irreversible) and does not deploy again.
    let second = deploy(&client).await.expect("the guard answers");
    assert_eq!(second.is_error, Some(true));
    let structured = second.structured_content.clone().unwrap();
    assert_eq!(
        structured["mcp_replay_guard"]["state"], "needs_review",
        "{structured:#}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    // Sessions pass through: the client's session is the server's.
    let sessions = server.state.session_ids();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    let calls = server.state.tool_call_requests("deploy_release");
    assert_eq!(calls[0].session_id.as_deref(), Some(sessions[0].as_str()));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn a_cut_stream_is_resumed_with_get_through_the_proxy() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let dir = std::env::temp_dir().join(format!("mrg-cli-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let client = connect(&proxy.url).await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);

    // rmcp resumes the cut stream with GET + Last-Event-ID, through the proxy.
    let result = deploy(&client)
        .await
        .expect("the resumed stream carries the result");
    assert_eq!(text(&result), "deployed catalog 2026.07.22");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let resumes = server.state.resume_requests();
    assert_eq!(resumes.len(), 1, "{resumes:#?}");
    client.cancel().await.unwrap();
    drop(proxy);

    // The proxy's ledger recorded the execution, and it verifies.
    let verify = std::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args(["audit", "verify", &ledger.to_string_lossy()])
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    let _ = std::fs::remove_dir_all(dir);
}
