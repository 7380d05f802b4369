//! What `replay-guard proxy` (the built binary) tells its operator: `/metrics` on the admin
//! listener (the held gauge from the ledger, outcomes, refusals), OTLP traces received by a
//! real receiver that decodes them, and one log line per call.

use crate::support;

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest, common::v1::any_value, trace::v1::Span,
};
use prost::Message;
use serde_json::json;
use support::*;

/// The value of the sample `name{labels}` in Prometheus text (labels in the exporter's order,
/// sorted by name), if present.
fn sample(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let key = format!("{name}{{{labels}}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&key))
        .map(|value| value.trim().parse().expect("a number"))
}

/// Ends the proxy as an operator would (SIGTERM: it finishes and flushes), with its stderr.
async fn terminate(mut proxy: Proxy) -> String {
    let pid = nix::unistd::Pid::from_raw(proxy.child.id().expect("running") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(20), proxy.child.wait())
        .await
        .expect("the proxy ends after SIGTERM")
        .unwrap();
    let mut stderr = String::new();
    if let Some(mut pipe) = proxy.child.stderr.take() {
        tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr)
            .await
            .unwrap();
    }
    stderr
}

/// A lost response on an irreversible tool: `/metrics` shows it held (gauge 1) with the
/// outcome `unknown` counted; after `resolve` from another process the gauge is 0. Refusals are
/// counted by reason; no actor, key or argument is a label.
#[tokio::test]
async fn metrics_show_a_held_execution_until_it_is_resolved() {
    let server = json_server().await;
    let dir = temp_dir("cli-proxy-telemetry", "metrics");
    let ledger = dir.join("ledger.jsonl");
    let admin = format!("127.0.0.1:{}", free_port());
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(proxy_args(
            &server.url,
            &[
                "--ledger",
                &ledger.to_string_lossy(),
                "--admin-listen",
                &admin,
            ],
        ))
        .env_remove("RUST_LOG")
        .stderr(std::process::Stdio::piped());
    let proxy = start_proxy_command(command).await;
    let metrics_url = format!("http://{admin}/metrics");
    server.state.lose_next_response("deploy_release");

    let mut client = hyper_client();
    let secret = "Bearer s3cret-never-a-label";
    let response = send(
        &mut client,
        deploy_request(&proxy.url, 1, &[("authorization", secret)]),
    )
    .await
    .unwrap();
    let held = read_jsonrpc_response(response, &json!(1)).await.unwrap();
    let record = &structured(&held).expect("the guard's answer")["mcp_replay_guard"];
    assert_eq!(record["state"], "needs_review", "{held:#}");
    let execution = record["execution_id"].as_str().unwrap().to_owned();
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let (status, metrics) = get_text(&metrics_url).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    let held_gauge = |metrics: &str| {
        sample(
            metrics,
            "mcp_replay_guard_held_executions",
            "tool=\"deploy_release\"",
        )
    };
    assert_eq!(held_gauge(&metrics), Some(1.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "mcp_replay_guard_outcomes_total",
            "tool=\"deploy_release\",outcome=\"unknown\""
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "mcp_replay_guard_calls_total",
            "tool=\"deploy_release\",decision=\"start\""
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metrics.contains("mcp_replay_guard_ledger_write_seconds_bucket"),
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            "replay_guard_proxy_requests_total",
            "status=\"200\""
        )
        .is_some(),
        "{metrics}"
    );

    // A request from a page elsewhere is refused by the proxy, counted by its reason.
    let request = deploy_request(&proxy.url, 2, &[("origin", "https://elsewhere.example")]);
    let refused = send(&mut client, request).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let (_, metrics) = get_text(&metrics_url).await;
    assert!(
        sample(
            &metrics,
            "replay_guard_proxy_refused_total",
            "reason=\"origin\""
        )
        .is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    for never in ["s3cret", "actor", "anonymous", "catalog", "2026.07.22"] {
        assert!(
            !metrics.contains(never),
            "{never} in the metrics:\n{metrics}"
        );
    }

    // An operator settles it from another process: the next scrape reads the ledger.
    let resolve = replay_guard(&[
        "resolve",
        &ledger.to_string_lossy(),
        &execution,
        "--applied",
        "--note",
        "deployment seen in the release log",
    ])
    .await;
    assert_eq!(resolve.code, 0, "{resolve:#?}");
    let (_, metrics) = get_text(&metrics_url).await;
    assert_eq!(held_gauge(&metrics), Some(0.0), "{metrics}");
    assert_eq!(
        sample(
            &metrics,
            "mcp_replay_guard_outcomes_total",
            "tool=\"deploy_release\",outcome=\"unknown\""
        ),
        Some(1.0),
        "{metrics}"
    );

    // One line per call at the default level, with what an operator greps for: the lost
    // first attempt, and the proxy's second ask, answered held.
    let stderr = terminate(proxy).await;
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("mcp_replay_guard::call") && line.contains(&execution))
        .collect();
    for expected in [
        ["decision=start", "outcome=unknown"],
        ["decision=uncertain", "outcome=needs_review"],
    ] {
        let line = lines
            .iter()
            .find(|line| expected.iter().all(|field| line.contains(field)))
            .unwrap_or_else(|| panic!("no call line with {expected:?}:\n{stderr}"));
        for field in ["method=tools/call", "tool=deploy_release", "duration_ms="] {
            assert!(line.contains(field), "{field} not in {line}");
        }
    }
    assert!(!stderr.contains("s3cret"), "{stderr}");
}

/// Every span a [`post_receiver`] was sent over OTLP/HTTP: each body decoded as the
/// `ExportTraceServiceRequest` (protobuf) the exporter posts to `/v1/traces`.
fn spans(posted: &Posted) -> Vec<Span> {
    let posted = posted.lock().unwrap().clone();
    let mut spans = Vec::new();
    for (path, body) in posted {
        assert_eq!(path, "/v1/traces");
        let export = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
        for resource in export.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }
    spans
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|value| match value {
            any_value::Value::StringValue(s) => s,
            other => format!("{other:?}"),
        })
}

/// A call that carries a W3C `traceparent`: the spans exported over OTLP are in the caller's
/// trace, the proxy's request span a child of the caller's span, the guard's call span (with
/// its execution id, tool, decision and outcome) below it, and the upstream is sent the guard's
/// span as its parent. The same through `params._meta` of a call without the header.
#[tokio::test]
async fn the_guards_spans_sit_in_the_callers_trace_and_reach_an_otlp_receiver() {
    let server = json_server().await;
    let (endpoint, received) = post_receiver().await;
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(proxy_args(&server.url, &["--otlp-endpoint", &endpoint]))
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .stderr(std::process::Stdio::piped());
    let proxy = start_proxy_command(command).await;

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    let mut client = hyper_client();
    let response = send(
        &mut client,
        deploy_request(&proxy.url, 1, &[("traceparent", &traceparent)]),
    )
    .await
    .unwrap();
    let answer = read_jsonrpc_response(response, &json!(1)).await.unwrap();
    assert!(answer.get("result").is_some(), "{answer:#}");

    // The same trace context in `_meta` only, on a call of another tool.
    let meta_trace = "0af7651916cd43dd8448eb211c80319c";
    let meta_parent = "b7ad6b7169203331";
    let mut body = stateless_tool_call_body(
        2,
        "deploy_release",
        json!({"service": "search", "version": "1"}),
    );
    body["params"]["_meta"]["traceparent"] = json!(format!("00-{meta_trace}-{meta_parent}-01"));
    let mut request = deploy_request(&proxy.url, 2, &[]);
    *request.body_mut() = Full::new(Bytes::from(body.to_string()));
    let response = send(&mut client, request).await.unwrap();
    read_jsonrpc_response(response, &json!(2)).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let calls = loop {
        let spans = spans(&received);
        let calls: Vec<Span> = spans
            .iter()
            .filter(|span| span.name == "tools_call")
            .cloned()
            .collect();
        if calls.len() >= 2 || tokio::time::Instant::now() > deadline {
            break calls;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let spans = spans(&received);
    for (trace, parent, service) in [
        (trace_id, caller_span, "catalog"),
        (meta_trace, meta_parent, "search"),
    ] {
        let call = calls
            .iter()
            .find(|span| hex::encode(&span.trace_id) == trace)
            .unwrap_or_else(|| panic!("no tools_call span in trace {trace}: {spans:#?}"));
        assert_eq!(attribute(call, "tool").as_deref(), Some("deploy_release"));
        assert_eq!(attribute(call, "decision").as_deref(), Some("start"));
        assert!(attribute(call, "outcome").is_some(), "{call:#?}");
        let execution = attribute(call, "execution_id").expect("an execution id");
        assert!(execution.starts_with("act_"), "{execution}");
        let request_span = spans
            .iter()
            .find(|span| span.span_id == call.parent_span_id)
            .unwrap_or_else(|| panic!("the call span's parent was not exported: {spans:#?}"));
        assert_eq!(request_span.name, "mcp_request");
        assert_eq!(hex::encode(&request_span.parent_span_id), parent);

        // The upstream was sent the guard's span as its parent, in the caller's trace.
        let sent = server
            .state
            .tool_call_requests("deploy_release")
            .into_iter()
            .find(|r| {
                r.body
                    .as_ref()
                    .is_some_and(|b| b["params"]["arguments"]["service"] == service)
            })
            .expect("the call reached the upstream");
        let upstream_parent = sent
            .headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .expect("a traceparent upstream")
            .to_owned();
        assert_eq!(
            upstream_parent,
            format!("00-{trace}-{}-01", hex::encode(&call.span_id)),
        );
    }
    // Each call's line says how it ended, with the upstream's status (the client still holds
    // its connection, so neither answer counts as delivered yet).
    let stderr = terminate(proxy).await;
    let completed = stderr
        .lines()
        .filter(|line| {
            line.contains("mcp_replay_guard::call")
                && line.contains("outcome=completed")
                && line.contains("status=200")
        })
        .count();
    assert_eq!(completed, 2, "{stderr}");
}

/// `--json`: the proxy's start line is one JSON object (where it listens, the upstream with no
/// credential, the admin listener), the line a script waits for.
#[tokio::test]
async fn the_start_line_is_one_json_object_with_json() {
    let server = json_server().await;
    let upstream = server.url.replace("http://", "http://user:s3cret@");
    let (child, line) = spawn_proxy(&upstream, &["--json", "--admin-listen", "127.0.0.1:0"]).await;
    let start: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert!(
        start["listening"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{start}"
    );
    assert!(
        start["admin"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:"),
        "{start}"
    );
    assert!(!line.contains("s3cret"), "{line}");
    let (status, body) = get_text(&format!("{}/healthz", start["admin"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    drop(child);
}
