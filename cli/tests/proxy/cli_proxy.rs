//! `replay-guard proxy`, run as the built binary between rmcp's own client (over
//! `TowerHttpClient` and a plain hyper client: no guard in the client) and rmcp's own server.

use crate::support;

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
    server.state.lose_next_response("deploy_release");

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
    let dir = proxy_temp_dir("resume");
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
    let verify = replay_guard_blocking(&["audit", "verify", &ledger.to_string_lossy()]);
    assert_eq!(verify.code, 0, "{verify:?}");
    let _ = std::fs::remove_dir_all(dir);
}

fn proxy_temp_dir(name: &str) -> std::path::PathBuf {
    temp_dir("cli-proxy", name)
}

/// Polls the ledger (every 20 ms, up to 10 s) until `done` holds for its records.
async fn wait_for_records(ledger: &std::path::Path, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let records = ledger_list(ledger);
        if done(&records) || tokio::time::Instant::now() >= deadline {
            return records;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn deploy_body(id: i64) -> Value {
    stateless_tool_call_body(
        id,
        "deploy_release",
        json!({"service": "catalog", "version": "2026.07.22"}),
    )
}

/// JSON. A JSON answer the client read is recorded delivered once the client
/// is done with it: its next request on the connection (recorded before that request is
/// decided) or its clean close. A repeat after that is a new execution, as for any delivered
/// call. (Before, a JSON answer was never delivered, and every repeat got the old result.)
#[tokio::test]
async fn a_json_answer_is_delivered_once_the_client_is_done_with_it() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let dir = proxy_temp_dir("json-delivered");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;

    // The repeat comes on the same connection: the first answer was delivered before it.
    let mut client = hyper_client();
    for id in [1, 2] {
        let request = post(
            &proxy.url,
            None,
            STATELESS_PROTOCOL_VERSION,
            deploy_body(id),
        );
        let response = send(&mut client, request).await.unwrap();
        assert_eq!(
            response.headers()[http::header::CONTENT_TYPE],
            "application/json"
        );
        let message = read_jsonrpc_response(response, &json!(id)).await.unwrap();
        assert_eq!(
            message["result"]["structuredContent"]["deployment"],
            json!(id),
            "{message}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 2);
    // The client closes its connection: the second answer is delivered too.
    drop(client);
    let records = wait_for_records(&ledger, |records| {
        records.len() == 2 && records.iter().all(|r| r["state"] == "delivered")
    })
    .await;
    assert_eq!(records.len(), 2, "{records:#?}");
    for record in &records {
        assert_eq!(record["state"], "delivered", "{records:#?}");
    }

    // A client that asks the proxy to close the connection, reads the answer and closes too.
    let authority = proxy
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let body = deploy_body(3).to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {STATELESS_PROTOCOL_VERSION}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: deploy_release\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer)
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&answer).contains("\"deployment\":3"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    drop(stream);
    assert_eq!(server.state.side_effects("deploy_release"), 3);

    let records = wait_for_records(&ledger, |records| {
        records.len() == 3 && records.iter().all(|r| r["state"] == "delivered")
    })
    .await;
    assert_eq!(records.len(), 3, "{records:#?}");
    for record in &records {
        assert_eq!(record["state"], "delivered", "{records:#?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// SSE. The proxy wrote an SSE answer to the connection, and the client
/// resets it without reading (what its TCP stack does when it closes a connection with unread
/// data): not delivered, and the client's repeat gets the kept result; the tool ran once.
/// (Before, the end of the body counted as delivered, and the repeat deployed again.)
#[tokio::test]
async fn an_sse_answer_the_client_resets_unread_is_not_delivered_and_the_repeat_gets_it() {
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let dir = proxy_temp_dir("sse-reset");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;

    // Raw HTTP/1.1, so that the test owns the socket.
    let authority = proxy
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let body = deploy_body(1).to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {STATELESS_PROTOCOL_VERSION}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: deploy_release\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    assert_eq!(
        server
            .state
            .wait_for_side_effects("deploy_release", 1, Duration::from_secs(10))
            .await,
        1
    );
    // The proxy recorded the answer and wrote it to the connection; none of it is read.
    let records = wait_for_records(&ledger, |records| {
        records.len() == 1 && records[0]["state"] != "dispatched"
    })
    .await;
    assert_eq!(records.len(), 1, "{records:#?}");
    drop(stream);

    let mut client = hyper_client();
    let request = post(&proxy.url, None, STATELESS_PROTOCOL_VERSION, deploy_body(7));
    let response = send(&mut client, request).await.unwrap();
    let message = read_jsonrpc_response(response, &json!(7)).await.unwrap();
    assert_eq!(
        message["result"]["content"][0]["text"], "deployed catalog 2026.07.22",
        "{message}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// For the proxy: an upstream URL with credentials is never printed.
#[tokio::test]
async fn the_proxy_never_prints_the_credentials_of_its_upstream_url() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let dir = proxy_temp_dir("upstream-secret");
    let ledger = dir.join("ledger.jsonl");
    let upstream = server.url.replace("http://", "http://agent:pw-s3cr3t@") + "?token=tok-s3cr3t";
    let (_proxy, line) = spawn_proxy(&upstream, &["--ledger", &ledger.to_string_lossy()]).await;
    assert!(!line.contains("s3cr3t"), "{line}");
    let address = line.split_whitespace().nth(2).unwrap().to_owned();
    let mut client = hyper_client();
    let request = post(
        &format!("{address}/mcp"),
        None,
        STATELESS_PROTOCOL_VERSION,
        deploy_body(1),
    );
    let response = send(&mut client, request).await.unwrap();
    read_jsonrpc_response(response, &json!(1)).await.unwrap();
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    drop(client);
    let text = std::fs::read_to_string(&ledger).unwrap();
    assert!(!text.contains("s3cr3t"), "{text}");
    let bad = replay_guard_blocking(&[
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "http://agent:pw-s3cr3t@bad host/mcp?token=tok-s3cr3t",
    ]);
    assert_eq!(bad.code, 2, "{bad:?}");
    let stderr = &bad.stderr;
    assert!(
        stderr.contains("is not a URL") && !stderr.contains("s3cr3t"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// For the proxy: Ctrl-C while the guard still drains a response its client
/// abandoned. The proxy exits 0 (before: the cancelled drain respawned itself until the stack
/// overflowed, exit 134), and the ledger says unknown.
#[tokio::test]
async fn the_proxy_stops_cleanly_while_it_drains_an_abandoned_response() {
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(120),
        ..ServerOptions::default()
    })
    .await;
    let dir = proxy_temp_dir("ctrl-c");
    let ledger = dir.join("ledger.jsonl");
    // The abandoned drain may take the shutdown's whole grace: keep it short.
    let (mut child, line) = spawn_proxy(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--shutdown-timeout",
            "2s",
        ],
    )
    .await;
    let url = format!("{}/mcp", line.split_whitespace().nth(2).unwrap());

    let mut client = hyper_client();
    let session = initialize(&mut client, &url).await.unwrap();
    let request = post(
        &url,
        session.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(2, "slow_deploy", json!({"service": "catalog"})),
    );
    let response = send(&mut client, request).await.unwrap();
    assert!(response.status().is_success());
    assert_eq!(
        server
            .state
            .wait_for_started("slow_deploy", 1, Duration::from_secs(10))
            .await,
        1
    );
    // The client goes away; the proxy's guard keeps reading for the outcome.
    drop(response);
    drop(client);

    let pid = child.id().unwrap().to_string();
    let interrupt = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(interrupt.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the proxy stops")
        .unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "unknown", "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A client that half-closes its side after the request (`shutdown(Write)`, as `nc -N` does)
/// and then reads gets its answer whole, and the tool runs once. Its close came before the
/// answer (the tool takes 300 ms), so it proves nothing about reading it (a client that closed
/// its socket outright looks the same): the answer is not recorded delivered, and a plain
/// client's repeat gets the kept result (the tool still ran once) and, once it closes
/// cleanly, the execution is delivered. (Before, hyper dropped a half-closed client's
/// request: no answer, the tool never ran, and the execution stayed `accepted`.)
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer_but_proves_no_delivery() {
    for json_response in [true, false] {
        let server = TestServer::start_with(ServerOptions {
            json_response,
            ..ServerOptions::stateless()
        })
        .await;
        let dir = proxy_temp_dir("half-close");
        let ledger = dir.join("ledger.jsonl");
        let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
        let authority = proxy
            .url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_owned();
        let call =
            |id: i64| stateless_tool_call_body(id, "slow_deploy", json!({"service": "catalog"}));
        let body = call(1).to_string();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {STATELESS_PROTOCOL_VERSION}\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: slow_deploy\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
            .await
            .unwrap();
        tokio::io::AsyncWriteExt::shutdown(&mut stream)
            .await
            .unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut answer),
        )
        .await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(
            matches!(read, Ok(Ok(_)))
                && answer.contains("\"id\":1")
                && answer.contains("slow deployed catalog"),
            "json={json_response}: {read:?} {answer:?}"
        );
        drop(stream);
        assert_eq!(server.state.side_effects("slow_deploy"), 1);
        let records = wait_for_records(&ledger, |records| {
            records.len() == 1 && records[0]["state"] != "dispatched"
        })
        .await;
        assert_eq!(records.len(), 1, "json={json_response}: {records:#?}");
        assert_eq!(
            records[0]["state"], "completed_result_not_delivered",
            "json={json_response}: {records:#?}"
        );

        let mut client = hyper_client();
        let request = post(&proxy.url, None, STATELESS_PROTOCOL_VERSION, call(9));
        let response = send(&mut client, request).await.unwrap();
        let message = read_jsonrpc_response(response, &json!(9)).await.unwrap();
        assert_eq!(
            message["result"]["content"][0]["text"], "slow deployed catalog",
            "{message}"
        );
        drop(client);
        let records = wait_for_records(&ledger, |records| {
            records.len() == 1 && records[0]["state"] == "delivered"
        })
        .await;
        assert_eq!(
            records[0]["state"], "delivered",
            "json={json_response}: {records:#?}"
        );
        assert_eq!(server.state.side_effects("slow_deploy"), 1);
        assert_eq!(server.state.tool_call_requests("slow_deploy").len(), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Two `tools/call`s pipelined in one write: the client reads both answers in order and closes
/// cleanly, so both are delivered (each tool ran once). Two more pipelined, then a reset
/// without reading: neither is delivered, and each repeat gets its kept result.
#[tokio::test]
async fn pipelined_calls_are_answered_in_order_and_a_reset_delivers_none() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let dir = proxy_temp_dir("pipelined");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(&server.url, &["--ledger", &ledger.to_string_lossy()]).await;
    let authority = proxy
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned();
    let request = |id: i64, version: &str| {
        let body = stateless_tool_call_body(
            id,
            "deploy_release",
            json!({"service": "catalog", "version": version}),
        )
        .to_string();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {STATELESS_PROTOCOL_VERSION}\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: deploy_release\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // Read both answers, then close cleanly.
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let both = format!("{}{}", request(1, "a"), request(2, "b"));
    tokio::io::AsyncWriteExt::write_all(&mut stream, both.as_bytes())
        .await
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 65536];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !(seen.contains("deployed catalog a") && seen.contains("deployed catalog b")) {
        let n = tokio::time::timeout_at(
            deadline,
            tokio::io::AsyncReadExt::read(&mut stream, &mut buf),
        )
        .await
        .expect("both answers arrive")
        .unwrap();
        assert!(n > 0, "closed early: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(
        seen.find("deployed catalog a") < seen.find("deployed catalog b"),
        "{seen}"
    );
    drop(stream);
    let records = wait_for_records(&ledger, |records| {
        records.len() == 2 && records.iter().all(|r| r["state"] == "delivered")
    })
    .await;
    assert!(
        records.len() == 2 && records.iter().all(|r| r["state"] == "delivered"),
        "{records:#?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 2);

    // Two more, and a close with the answers unread (the client's stack resets it).
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        format!("{}{}", request(3, "c"), request(4, "d")).as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(
        server
            .state
            .wait_for_side_effects("deploy_release", 4, Duration::from_secs(10))
            .await,
        4
    );
    let records = wait_for_records(&ledger, |records| {
        records.len() == 4 && records.iter().all(|r| r["state"] != "dispatched")
    })
    .await;
    assert_eq!(records.len(), 4, "{records:#?}");
    drop(stream);
    let mut client = hyper_client();
    for (id, version) in [(13, "c"), (14, "d")] {
        let body = stateless_tool_call_body(
            id,
            "deploy_release",
            json!({"service": "catalog", "version": version}),
        );
        let response = send(
            &mut client,
            post(&proxy.url, None, STATELESS_PROTOCOL_VERSION, body),
        )
        .await
        .unwrap();
        let message = read_jsonrpc_response(response, &json!(id)).await.unwrap();
        assert_eq!(
            message["result"]["content"][0]["text"],
            format!("deployed catalog {version}"),
            "{message}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 4);
    let _ = std::fs::remove_dir_all(dir);
}

/// The proxy is killed (SIGKILL) after its client read an answer but before the client showed
/// it was done with it (the delivery is not recorded yet). A proxy restarted on the same ledger
/// hands the client's repeat the kept result: the tool ran once, in both content types.
#[tokio::test]
async fn a_proxy_killed_before_it_records_a_delivery_hands_the_repeat_the_kept_result() {
    for json_response in [true, false] {
        let server = TestServer::start_with(ServerOptions {
            json_response,
            ..ServerOptions::stateless()
        })
        .await;
        let dir = proxy_temp_dir("killed-before-delivery");
        let ledger = dir.join("ledger.jsonl");
        let ledger_arg = ledger.to_string_lossy().into_owned();
        let mut proxy = start_proxy(&server.url, &["--ledger", &ledger_arg]).await;
        let mut client = hyper_client();
        let request = post(&proxy.url, None, STATELESS_PROTOCOL_VERSION, deploy_body(1));
        let response = send(&mut client, request).await.unwrap();
        let message = read_jsonrpc_response(response, &json!(1)).await.unwrap();
        assert_eq!(
            message["result"]["structuredContent"]["deployment"],
            json!(1),
            "{message}"
        );
        // The connection stays open and idle: the answer waits for the client's next move.
        proxy.child.start_kill().unwrap();
        proxy.child.wait().await.unwrap();
        drop(client);
        let records = ledger_list(&ledger);
        assert_eq!(records.len(), 1, "{records:#?}");
        assert_eq!(
            records[0]["state"], "completed_result_not_delivered",
            "json={json_response}: {records:#?}"
        );

        let proxy = start_proxy(&server.url, &["--ledger", &ledger_arg]).await;
        let mut client = hyper_client();
        let request = post(&proxy.url, None, STATELESS_PROTOCOL_VERSION, deploy_body(2));
        let response = send(&mut client, request).await.unwrap();
        let message = read_jsonrpc_response(response, &json!(2)).await.unwrap();
        assert_eq!(
            message["result"]["structuredContent"]["deployment"],
            json!(1),
            "the kept result: {message}"
        );
        drop(client);
        let records = wait_for_records(&ledger, |records| {
            records.len() == 1 && records[0]["state"] == "delivered"
        })
        .await;
        assert_eq!(records[0]["state"], "delivered", "{records:#?}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// At `RUST_LOG=trace`, nothing secret reaches the proxy's stdout, stderr or ledger: not the
/// upstream URL's userinfo and query, not a client's `Authorization` or `X-Api-Key` header,
/// not a client's `?token=`, on an answer, a lost response (the outcome unknown) and the
/// repeat the guard answers itself.
#[tokio::test]
async fn no_secret_reaches_the_proxy_output_at_trace() {
    const SECRETS: [&str; 5] = [
        "pw-S3CRET1",
        "tok-S3CRET2",
        "bearer-S3CRET3",
        "key-S3CRET4",
        "q-S3CRET5",
    ];
    let server = TestServer::start_with(ServerOptions::stateless()).await;
    let dir = proxy_temp_dir("trace-secrets");
    let ledger = dir.join("ledger.jsonl");
    let stderr_path = dir.join("stderr.log");
    let upstream = server
        .url
        .replace("http://", &format!("http://agent:{}@", SECRETS[0]))
        + &format!("?token={}", SECRETS[1]);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", &upstream])
        .args(["--ledger", &ledger.to_string_lossy()])
        .env("RUST_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(20), stdout.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    let address = line.split_whitespace().nth(2).unwrap().to_owned();
    let url = format!("{address}/mcp?token={}", SECRETS[4]);
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);
    let mut client = hyper_client();
    for id in [1, 2, 3] {
        let mut request = post(&url, None, STATELESS_PROTOCOL_VERSION, deploy_body(id));
        let headers = request.headers_mut();
        headers.insert(
            http::header::AUTHORIZATION,
            format!("Bearer {}", SECRETS[2]).parse().unwrap(),
        );
        headers.insert("x-api-key", SECRETS[3].parse().unwrap());
        if let Ok(response) = send(&mut client, request).await {
            let _ = read_jsonrpc_response(response, &json!(id)).await;
        }
    }
    drop(client);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = wait_for_records(&ledger, |records| {
        records.len() == 1 && records[0]["state"] != "dispatched"
    })
    .await;
    assert_eq!(records.len(), 1, "{records:#?}");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let mut rest = String::new();
    let _ = tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut rest).await;
    let stderr = std::fs::read_to_string(&stderr_path).unwrap();
    assert!(stderr.contains("TRACE"), "the log ran at trace");
    let ledger_text = std::fs::read_to_string(&ledger).unwrap();
    let leaks: Vec<&str> = [
        line.as_str(),
        rest.as_str(),
        stderr.as_str(),
        ledger_text.as_str(),
    ]
    .into_iter()
    .flat_map(str::lines)
    .filter(|l| SECRETS.iter().any(|s| l.contains(s)))
    .collect();
    assert!(
        leaks.is_empty(),
        "{} lines leak:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An upstream URL with a query (`?key=…`, as hosted MCP servers hand out) keeps it when the
/// client adds a query of its own: the upstream gets both, its own first. (Before, the
/// client's query replaced the upstream's, and with it the key.)
#[tokio::test]
async fn a_client_query_is_added_to_the_upstreams_query_not_put_in_its_place() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/mcp?key=held-1", listener.local_addr().unwrap());
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let seen_tx = seen_tx.clone();
            tokio::spawn(async move {
                let mut request = vec![0u8; 65536];
                let n = tokio::io::AsyncReadExt::read(&mut stream, &mut request)
                    .await
                    .unwrap_or(0);
                let head = String::from_utf8_lossy(&request[..n]);
                let _ = seen_tx.send(head.lines().next().unwrap_or_default().to_owned());
                let answer = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, answer.as_bytes()).await;
            });
        }
    });
    let proxy = start_proxy(&upstream, &[]).await;

    let request = get_stream(
        &format!("{}?trace=1", proxy.url),
        None,
        STATELESS_PROTOCOL_VERSION,
        None,
    );
    let _ = send(&mut hyper_client(), request).await.unwrap();

    let line = tokio::time::timeout(Duration::from_secs(30), seen.recv())
        .await
        .expect("the upstream is asked")
        .unwrap();
    assert_eq!(line, "GET /mcp?key=held-1&trace=1 HTTP/1.1");
    server.abort();
}
