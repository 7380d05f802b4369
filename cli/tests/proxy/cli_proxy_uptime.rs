//! `replay-guard proxy` stays up. The built binary on 127.0.0.1 between
//! real clients and rmcp's own server: idle and slowloris connections, the descriptor limit,
//! SIGTERM and SIGINT with calls in flight, and `--log-format json`.

use crate::support;

use std::{path::Path, time::Duration};

use http_body_util::BodyExt;
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
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

type McpClient = RunningService<RoleClient, ()>;

/// A hang guard for waits on events (never an assertion on speed).
const HANG: Duration = Duration::from_secs(60);

async fn connect(url: &str) -> McpClient {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    let transport =
        StreamableHttpClientTransport::with_client(TowerHttpClient::new(hyper_client()), config);
    tokio::time::timeout(HANG, ().serve(transport))
        .await
        .expect("the client initialises in time")
        .expect("rmcp client initialises through the proxy")
}

async fn call(
    client: &McpClient,
    tool: &str,
    arguments: Value,
) -> Result<CallToolResult, ServiceError> {
    let params = CallToolRequestParams::new(tool.to_owned())
        .with_arguments(arguments.as_object().cloned().unwrap());
    tokio::time::timeout(HANG, client.call_tool(params))
        .await
        .expect("the call settles")
}

async fn deploy(client: &McpClient) -> Result<CallToolResult, ServiceError> {
    call(
        client,
        "deploy_release",
        json!({"service": "catalog", "version": "2026.07.22"}),
    )
    .await
}

async fn slow_deploy(client: &McpClient) -> Result<CallToolResult, ServiceError> {
    call(client, "slow_deploy", json!({"service": "catalog"})).await
}

/// A normal client of the proxy, connected: its deploy is answered and ran once.
async fn a_normal_client_is_answered(proxy: &Proxy, server: &TestServer) -> McpClient {
    let client = connect(&proxy.url).await;
    let answer = deploy(&client)
        .await
        .expect("the normal client is answered");
    assert_eq!(answer.is_error, Some(false), "{answer:?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    client
}

fn authority(proxy: &Proxy) -> String {
    proxy
        .url
        .trim_start_matches("http://")
        .trim_end_matches("/mcp")
        .to_owned()
}

fn assert_ledger_verifies(ledger: &Path) {
    let verify = replay_guard_blocking(&["audit", "verify", &ledger.to_string_lossy()]);
    assert_eq!(verify.code, 0, "{verify:?}");
}

/// `kill -SIGNAL pid`.
fn send_signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("the proxy runs").to_string();
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

async fn exit_code(child: &mut tokio::process::Child) -> Option<i32> {
    tokio::time::timeout(HANG, child.wait())
        .await
        .expect("the proxy exits")
        .unwrap()
        .code()
}

/// A proxy whose stderr goes to `stderr` (a file), with `RUST_LOG=log`.
async fn proxy_logging_to(upstream: &str, extra: &[&str], stderr: &Path, log: &str) -> Proxy {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(proxy_args(upstream, extra))
        .env("RUST_LOG", log)
        .stderr(std::fs::File::create(stderr).unwrap());
    start_proxy_command(command).await
}

/// Waits (polling, bounded by [`HANG`]) until `stderr` holds a line containing `text`.
async fn wait_for_log(stderr: &Path, text: &str) -> String {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let log = std::fs::read_to_string(stderr).unwrap_or_default();
        if log.contains(text) {
            return log;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {text:?} in the proxy's log:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads until the peer closes (`Ok(0)`) or resets the connection.
async fn closed_by_peer(stream: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// 200 idle connections and 50 slowloris connections (one header byte a second) do not stop
/// a normal client from getting its answer; the header timeout closes every one of them.
/// (Before: no header timeout, the slowloris connections were held as long as they dripped.)
#[tokio::test]
async fn idle_and_slowloris_connections_do_not_stop_a_normal_client_and_are_closed() {
    let server = TestServer::start().await;
    let proxy = start_proxy(&server.url, &["--header-timeout", "3s"]).await;
    let address = authority(&proxy);

    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    let head =
        format!("POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n");
    let mut slowloris = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (address, head) = (address.clone(), head.clone());
        slowloris.spawn(async move {
            let mut stream = TcpStream::connect(&address).await.unwrap();
            let mut sent = 0;
            let mut ticks = tokio::time::interval(Duration::from_secs(1));
            let mut buf = [0u8; 256];
            // One header byte a second, never the end of the head, until the proxy closes.
            loop {
                tokio::select! {
                    _ = ticks.tick() => {
                        let byte = head.as_bytes()[sent % head.len()];
                        if stream.write_all(&[byte]).await.is_err() {
                            return sent;
                        }
                        sent += 1;
                    }
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => return sent,
                        // A 408 or such before the close: fine, keep reading to the close.
                        Ok(_) => {}
                    },
                }
            }
        });
    }

    // A normal client, meanwhile.
    let client = a_normal_client_is_answered(&proxy, &server).await;

    // Every slowloris connection is closed by the proxy (it sent bytes, never a whole head).
    let closed = tokio::time::timeout(HANG, async {
        let mut closed = 0;
        while let Some(sent) = slowloris.join_next().await {
            assert!(sent.unwrap() > 0);
            closed += 1;
        }
        closed
    })
    .await
    .expect("the header timeout closes the slowloris connections");
    assert_eq!(closed, 50);
    // And every idle one.
    tokio::time::timeout(HANG, async {
        for stream in &mut idle {
            closed_by_peer(stream).await;
        }
    })
    .await
    .expect("the header timeout closes idle connections");
    client.cancel().await.unwrap();
}

/// At the descriptor limit the accept loop backs off instead of spinning: a bounded number of
/// warnings (not millions), little CPU while the condition lasts, a summary when it ends, and
/// a normal client is answered once the extra connections close. (Before: 82% CPU and
/// millions of "accept failed" lines.)
#[tokio::test]
async fn at_the_descriptor_limit_the_proxy_backs_off_and_warns_once() {
    let server = TestServer::start().await;
    let dir = temp_dir("cli-proxy-uptime", "emfile");
    let stderr = dir.join("stderr.log");
    let mut command = tokio::process::Command::new("prlimit");
    command
        .arg("--nofile=64:64")
        .arg(BIN)
        .args(proxy_args(&server.url, &["--header-timeout", "120s"]))
        .env("RUST_LOG", "warn")
        .stderr(std::fs::File::create(&stderr).unwrap());
    let proxy = start_proxy_command(command).await;
    let pid = proxy.child.id().unwrap();
    let address = authority(&proxy);

    // More connections than the proxy has descriptors: the kernel's backlog holds the rest.
    let mut extra = Vec::new();
    for _ in 0..100 {
        extra.push(TcpStream::connect(&address).await.unwrap());
    }
    wait_for_log(&stderr, "cannot accept connections").await;

    let cpu_before = cpu_ticks(pid);
    let wall = Duration::from_secs(3);
    tokio::time::sleep(wall).await;
    let cpu = cpu_ticks(pid) - cpu_before;
    let ticks_per_second = clock_ticks_per_second();
    // A correctness bound on the spin (it used a whole core), not a speed measurement.
    assert!(
        (cpu as f64) < 0.5 * wall.as_secs_f64() * ticks_per_second,
        "{cpu} ticks of CPU in {wall:?} at the descriptor limit"
    );
    let lines = std::fs::read_to_string(&stderr).unwrap().lines().count();
    assert!(lines < 10, "{lines} log lines at the descriptor limit");

    // The extra connections go away; a normal client is answered.
    drop(extra);
    let client = a_normal_client_is_answered(&proxy, &server).await;
    let log = wait_for_log(&stderr, "accept errors stopped after").await;
    assert!(log.lines().count() < 10, "{log}");
    client.cancel().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// utime + stime of a process, in clock ticks (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime are fields 14 and 15 of stat(5); fields[0] is field 3.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// SIGTERM or SIGINT with a call in flight that finishes within `--shutdown-timeout`: the
/// client gets its answer, the proxy exits 0, and the ledger verifies. (Before: SIGTERM killed
/// the proxy mid-call, and SIGINT dropped the call mid-way.)
#[tokio::test]
async fn a_signal_lets_the_call_in_flight_finish_then_exits_0() {
    for signal in ["TERM", "INT"] {
        let server = TestServer::start_with(ServerOptions {
            slow_tool_delay: Duration::from_secs(2),
            ..ServerOptions::default()
        })
        .await;
        let dir = temp_dir("cli-proxy-uptime", &format!("drain-{signal}"));
        let ledger = dir.join("ledger.jsonl");
        let mut proxy = start_proxy(
            &server.url,
            &[
                "--ledger",
                &ledger.to_string_lossy(),
                "--shutdown-timeout",
                "60s",
            ],
        )
        .await;
        let client = connect(&proxy.url).await;
        let in_flight = tokio::spawn(async move { slow_deploy(&client).await });
        assert_eq!(
            server.state.wait_for_started("slow_deploy", 1, HANG).await,
            1
        );
        send_signal(&proxy.child, signal);

        let answer = in_flight
            .await
            .unwrap()
            .expect("the call in flight is answered");
        assert_eq!(answer.is_error, Some(false), "SIG{signal}: {answer:?}");
        assert_eq!(exit_code(&mut proxy.child).await, Some(0), "SIG{signal}");
        assert_eq!(server.state.side_effects("slow_deploy"), 1);
        assert_ledger_verifies(&ledger);
        let records = ledger_list(&ledger);
        assert_eq!(records.len(), 1, "{records:#?}");
        assert!(
            ["delivered", "completed_result_not_delivered"]
                .contains(&records[0]["state"].as_str().unwrap()),
            "SIG{signal}: {records:#?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// SIGTERM with a call that outlasts `--shutdown-timeout`: the proxy exits 0 at the deadline,
/// the execution is recorded `unknown` (not left `dispatched`, not a made-up failure), the
/// ledger verifies, and a repeat through a new proxy is held for review, not run again.
#[tokio::test]
async fn a_call_past_the_shutdown_timeout_is_recorded_unknown_and_a_repeat_is_held() {
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(4),
        ..ServerOptions::default()
    })
    .await;
    let dir = temp_dir("cli-proxy-uptime", "deadline");
    let ledger = dir.join("ledger.jsonl");
    let ledger_arg = ledger.to_string_lossy().into_owned();
    let mut proxy = start_proxy(
        &server.url,
        &["--ledger", &ledger_arg, "--shutdown-timeout", "1s"],
    )
    .await;
    let client = connect(&proxy.url).await;
    let in_flight = tokio::spawn(async move { slow_deploy(&client).await });
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, HANG).await,
        1
    );
    send_signal(&proxy.child, "TERM");
    assert_eq!(exit_code(&mut proxy.child).await, Some(0));
    // The tool was still running when the proxy left.
    assert_eq!(server.state.side_effects("slow_deploy"), 0);
    // What rmcp's client makes of the cut stream (it tries to resume) is its own affair.
    in_flight.abort();

    assert_ledger_verifies(&ledger);
    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "unknown", "{records:#?}");

    // The upstream finishes the tool (a disconnect is not a cancellation in this era).
    assert_eq!(
        server
            .state
            .wait_for_side_effects("slow_deploy", 1, HANG)
            .await,
        1
    );
    let proxy = start_proxy(&server.url, &["--ledger", &ledger_arg]).await;
    let client = connect(&proxy.url).await;
    let repeat = slow_deploy(&client).await.expect("the guard answers");
    assert_eq!(repeat.is_error, Some(true), "{repeat:?}");
    let structured = repeat.structured_content.clone().unwrap();
    assert_eq!(
        structured["mcp_replay_guard"]["state"], "needs_review",
        "{structured:#}"
    );
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    assert_eq!(server.state.started("slow_deploy"), 1);
    client.cancel().await.unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

/// A second signal during the drain exits at once with 128 + its number (130 for SIGINT),
/// while the call is still in flight; the ledger still verifies.
#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(120),
        ..ServerOptions::default()
    })
    .await;
    let dir = temp_dir("cli-proxy-uptime", "second-signal");
    let ledger = dir.join("ledger.jsonl");
    let stderr = dir.join("stderr.log");
    let mut proxy = proxy_logging_to(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--shutdown-timeout",
            "300s",
        ],
        &stderr,
        "info",
    )
    .await;
    let client = connect(&proxy.url).await;
    let _in_flight = tokio::spawn(async move { slow_deploy(&client).await });
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, HANG).await,
        1
    );
    send_signal(&proxy.child, "INT");
    wait_for_log(&stderr, "shutting down").await;
    // The first signal is draining: the proxy is still there, waiting for the call.
    assert!(proxy.child.try_wait().unwrap().is_none());
    send_signal(&proxy.child, "INT");
    assert_eq!(exit_code(&mut proxy.child).await, Some(130));
    assert_eq!(server.state.side_effects("slow_deploy"), 0);
    assert_ledger_verifies(&ledger);
    let _ = std::fs::remove_dir_all(dir);
}

/// The header timeout also closes a kept-alive connection that stays idle, and an answer that
/// waited on it for the client's next request stays undelivered: the repeat gets the kept
/// result, and the tool ran once. (A close by the proxy says nothing about the client having
/// read the answer.)
#[tokio::test]
async fn an_idle_connection_closed_by_the_header_timeout_leaves_its_answer_undelivered() {
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let dir = temp_dir("cli-proxy-uptime", "idle-undelivered");
    let ledger = dir.join("ledger.jsonl");
    let proxy = start_proxy(
        &server.url,
        &[
            "--ledger",
            &ledger.to_string_lossy(),
            "--header-timeout",
            "2s",
        ],
    )
    .await;
    let address = authority(&proxy);
    let body = stateless_tool_call_body(
        1,
        "deploy_release",
        json!({"service": "catalog", "version": "2026.07.22"}),
    )
    .to_string();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {STATELESS_PROTOCOL_VERSION}\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: deploy_release\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(&address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    // Read the whole answer (its Content-Length), then stay idle until the proxy closes.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(HANG, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the idle connection is closed by the header timeout"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.contains("\"deployment\":1"), "{answer}");
    // The client closes cleanly after the proxy's close: still no proof it read the answer.
    drop(stream);
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let records = ledger_list(&ledger);
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        records[0]["state"], "completed_result_not_delivered",
        "{records:#?}"
    );
    let mut client = hyper_client();
    let request = post(
        &proxy.url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(
            2,
            "deploy_release",
            json!({"service": "catalog", "version": "2026.07.22"}),
        ),
    );
    let response = send(&mut client, request).await.unwrap();
    let repeat = read_jsonrpc_response(response, &json!(2)).await.unwrap();
    assert_eq!(
        repeat["result"]["structuredContent"]["deployment"],
        json!(1),
        "{repeat}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--log-format json`: every line the proxy writes to stderr is one JSON object, at trace,
/// through a call, an upstream URL with credentials (warned about) and a shutdown; and no
/// secret is among them.
#[tokio::test]
async fn log_format_json_writes_one_json_object_per_line_and_no_secret() {
    const PASSWORD: &str = "pw-S3CRET-json";
    const TOKEN: &str = "bearer-S3CRET-json";
    let server = TestServer::start().await;
    let dir = temp_dir("cli-proxy-uptime", "json-log");
    let stderr = dir.join("stderr.log");
    let upstream = server
        .url
        .replace("http://", &format!("http://agent:{PASSWORD}@"));
    let mut proxy = proxy_logging_to(&upstream, &["--log-format", "json"], &stderr, "trace").await;
    let config =
        StreamableHttpClientTransportConfig::with_uri(proxy.url.clone()).auth_header(TOKEN);
    let transport =
        StreamableHttpClientTransport::with_client(TowerHttpClient::new(hyper_client()), config);
    let client = ().serve(transport).await.unwrap();
    let answer = deploy(&client).await.unwrap();
    assert_eq!(answer.is_error, Some(false), "{answer:?}");
    client.cancel().await.unwrap();
    send_signal(&proxy.child, "TERM");
    assert_eq!(exit_code(&mut proxy.child).await, Some(0));

    let log = std::fs::read_to_string(&stderr).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() > 10, "the log ran at trace: {log}");
    for line in &lines {
        let object: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(object.is_object(), "{line}");
        assert!(object["level"].is_string(), "{line}");
    }
    assert!(
        log.contains("is not sent"),
        "the userinfo warning is logged: {log}"
    );
    assert!(log.contains("shutting down"), "{log}");
    for secret in [PASSWORD, TOKEN] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A zero `--header-timeout` (it would close every connection at once) is a usage error.
#[tokio::test]
async fn a_zero_header_timeout_is_refused_with_a_clear_error() {
    let (run, _) = replay_guard_within(
        &[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--header-timeout",
            "0s",
        ],
        HANG,
    )
    .await
    .expect("the proxy refuses to start");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--header-timeout"), "{run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
}

/// SIGTERM while a client holds the session's GET listen stream open (as an rmcp client does
/// for as long as it is connected), with no call in flight: the listen stream carries no call,
/// so the proxy ends it and exits 0 at once instead of waiting out `--shutdown-timeout`, and
/// the client sees its stream end.
#[tokio::test]
async fn a_signal_ends_open_listen_streams_instead_of_waiting_out_the_shutdown_timeout() {
    let server = TestServer::start().await;
    let mut proxy = start_proxy(&server.url, &["--shutdown-timeout", "1h"]).await;
    let session = Era::Sessions.open_session(&proxy.url).await.unwrap();
    let mut client = hyper_client();
    let listen = send(
        &mut client,
        get_stream(&proxy.url, Some(&session), PROTOCOL_VERSION, None),
    )
    .await
    .expect("the listen stream opens");
    assert!(listen.status().is_success(), "{listen:?}");

    send_signal(&proxy.child, "TERM");

    assert_eq!(exit_code(&mut proxy.child).await, Some(0));
    let rest = tokio::time::timeout(HANG, listen.into_body().collect())
        .await
        .expect("the listen stream ends");
    assert!(rest.is_ok(), "it ends, not cut: {:?}", rest.err());
}

/// Four connections that send a request head announcing a 100 000-byte body, then one byte
/// every 2 s, while the proxy allows 4 connections: each is answered 408 once its body is
/// late (and its connection closed), so a normal client waiting behind them is answered; the
/// proxy logs each one with its peer and counts them. (Before: the body was read without a
/// deadline, the trickling connections held every place, and the normal client waited for
/// ever.)
#[tokio::test]
async fn trickled_request_bodies_are_answered_408_and_a_normal_client_is_served() {
    let server = TestServer::start().await;
    let dir = temp_dir("cli-proxy-uptime", "trickle");
    let stderr = dir.join("stderr.log");
    let proxy = proxy_logging_to(
        &server.url,
        &[
            "--max-connections",
            "4",
            "--request-body-timeout",
            "2s",
            "--request-body-min-rate",
            "1024",
        ],
        &stderr,
        "warn",
    )
    .await;
    let address = authority(&proxy);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{{"
    );
    let mut tricklers = tokio::task::JoinSet::new();
    let (heads_sent, mut heads) = tokio::sync::mpsc::channel(4);
    for _ in 0..4 {
        let (address, head, heads_sent) = (address.clone(), head.clone(), heads_sent.clone());
        tricklers.spawn(async move {
            let mut stream = TcpStream::connect(&address).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            heads_sent.send(()).await.unwrap();
            let mut ticks = tokio::time::interval(Duration::from_secs(2));
            let mut answer = Vec::new();
            let mut buf = [0u8; 1024];
            // One body byte every 2 s, reading whatever the proxy answers, until it closes.
            loop {
                tokio::select! {
                    _ = ticks.tick() => {
                        if stream.write_all(b" ").await.is_err() {
                            break;
                        }
                    }
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    },
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        });
    }
    for _ in 0..4 {
        heads.recv().await.unwrap();
    }

    // A normal client, behind the four.
    let client = a_normal_client_is_answered(&proxy, &server).await;

    let answers = tokio::time::timeout(HANG, async {
        let mut answers = Vec::new();
        while let Some(answer) = tricklers.join_next().await {
            answers.push(answer.unwrap());
        }
        answers
    })
    .await
    .expect("the proxy closes every trickling connection");
    for answer in &answers {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"jsonrpc\""), "{answer}");
    }
    let log = wait_for_log(&stderr, "slow_requests=4").await;
    assert_eq!(
        log.matches("request body too slowly").count(),
        4,
        "one warning per slow request:\n{log}"
    );
    assert!(log.contains("peer=127.0.0.1:"), "{log}");
    // Nothing of the trickled requests reached the upstream.
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    client.cancel().await.unwrap();
}

/// The proxy's TCP sockets on `port` (local or remote), by state, from `/proc/net/tcp`: the
/// kernel's own view, whatever the proxy believes.
fn sockets_on_port(port: u16, local: bool) -> Vec<&'static str> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let address = if local { fields[1] } else { fields[2] };
            let socket_port = u16::from_str_radix(address.rsplit(':').next()?, 16).ok()?;
            (socket_port == port).then(|| match fields[3] {
                "01" => "ESTABLISHED",
                "06" => "TIME_WAIT",
                "08" => "CLOSE_WAIT",
                "09" => "LAST_ACK",
                "0A" => "LISTEN",
                _ => "OTHER",
            })
        })
        .collect()
}

/// Waits (polling, bounded by [`HANG`]) until `done` holds of `/proc/net/tcp`.
async fn wait_for_sockets(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Five clients open a listen stream (GET without `Last-Event-ID`) and go away while the
/// upstream has nothing to send (it sends no keep-alive comments): the proxy notices each close, ends the stream and its
/// upstream exchange, so no socket of the proxy's port is left (no CLOSE-WAIT), its upstream
/// connections go back to what they were, and SIGTERM then exits at once. (Before: the
/// proxy's sockets stayed in CLOSE-WAIT with their upstream connections open until the
/// upstream next wrote, counted against `--max-connections`.)
#[tokio::test]
async fn abandoned_listen_streams_are_closed_with_their_upstream_exchanges() {
    // No keep-alive comments: the upstream writes nothing on an idle listen stream.
    let server = TestServer::start_with(ServerOptions {
        sse_keep_alive: None,
        ..ServerOptions::default()
    })
    .await;
    let mut proxy = start_proxy(&server.url, &["--shutdown-timeout", "1h"]).await;
    let proxy_port: u16 = authority(&proxy)
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let upstream_port = server.addr.port();
    let open_upstream = || {
        sockets_on_port(upstream_port, false)
            .iter()
            .filter(|state| **state == "ESTABLISHED")
            .count()
    };
    let mut sessions = Vec::new();
    for _ in 0..5 {
        sessions.push(Era::Sessions.open_session(&proxy.url).await.unwrap());
    }
    let upstream_before = open_upstream();

    let mut listens = Vec::new();
    for session in &sessions {
        // A client of its own per stream: dropping it closes its connection.
        let mut client = hyper_client();
        let listen = send(
            &mut client,
            get_stream(&proxy.url, Some(session), PROTOCOL_VERSION, None),
        )
        .await
        .expect("the listen stream opens");
        assert!(listen.status().is_success(), "{listen:?}");
        listens.push((client, listen));
    }
    drop(listens);

    wait_for_sockets(
        "no socket of the proxy's port is left after its clients went away",
        || {
            sockets_on_port(proxy_port, true)
                .iter()
                .all(|state| matches!(*state, "LISTEN" | "TIME_WAIT"))
        },
    )
    .await;
    wait_for_sockets(
        "the upstream exchanges of the abandoned streams end",
        || open_upstream() <= upstream_before,
    )
    .await;

    send_signal(&proxy.child, "TERM");
    assert_eq!(exit_code(&mut proxy.child).await, Some(0));
}
