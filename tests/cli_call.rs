//! `replay-guard call` and `replay-guard demo`, run as the built binary against rmcp's own
//! server on 127.0.0.1 (tests/support), with faults injected in front of the server. The
//! server's side-effect counters are the ground truth.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_replay-guard");

/// One finished run of the binary.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The `--json` line of `call`.
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON line ({e}): {self:#?}"))
    }

    fn execution_id(&self) -> String {
        self.json()["execution_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no execution id: {self:#?}"))
            .to_owned()
    }
}

async fn replay_guard(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("the binary runs");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `replay-guard --json call --url URL --tool TOOL --args ARGS EXTRA…`
async fn call(url: &str, tool: &str, args: Value, extra: &[&str]) -> Run {
    let args = args.to_string();
    let mut argv = vec![
        "--json", "call", "--url", url, "--tool", tool, "--args", &args,
    ];
    argv.extend_from_slice(extra);
    replay_guard(&argv).await
}

fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

fn ledger_path(dir: &Path) -> String {
    dir.join("ledger.jsonl").to_string_lossy().into_owned()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "mrg-cli-call-{name}-{}-{}",
        std::process::id(),
        mcp_replay_guard::ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn a_completed_call_exits_0_with_the_tool_result_in_both_eras() {
    let server = TestServer::start().await;
    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--protocol", "2025-11-25"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    let out = run.json();
    assert_eq!(out["outcome"], "completed");
    assert_eq!(
        out["result"]["content"][0]["text"],
        "deployed catalog 2026.07.22"
    );
    assert!(out["execution_id"].as_str().unwrap().starts_with("act_"));
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    // The dispatch carried the execution ID as its Idempotency-Key.
    assert_eq!(
        server.state.idempotency_keys("deploy_release"),
        vec![Some(out["execution_id"].as_str().unwrap().to_owned())]
    );

    // `auto` discovers a 2026-07-28 server and calls it statelessly.
    let stateless = TestServer::start_with(ServerOptions::stateless()).await;
    let run = call(&stateless.url, "deploy_release", deploy_args(), &[]).await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(stateless.state.side_effects("deploy_release"), 1);
    let calls = stateless.state.tool_call_requests("deploy_release");
    assert_eq!(
        calls[0].protocol_version.as_deref(),
        Some(STATELESS_PROTOCOL_VERSION)
    );
    assert_eq!(calls[0].session_id, None);

    // The shipped policy file is read: deploy_release is irreversible there, list_branches read-only.
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/policy.toml");
    let run = call(
        &server.url,
        "list_branches",
        json!({}),
        &["--policy", policy],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        run.json()["execution_id"],
        Value::Null,
        "read-only calls need no execution"
    );

    // Human output: the result JSON on stdout, a summary on stderr.
    let human = replay_guard(&[
        "call",
        "--url",
        &server.url,
        "--tool",
        "list_branches",
        "--args",
        "{}",
        "--class",
        "read-only",
    ])
    .await;
    assert_eq!(human.code, 0, "{human:#?}");
    let result: Value = serde_json::from_str(&human.stdout).unwrap();
    assert!(result["content"].is_array(), "{human:#?}");
    assert!(human.stderr.starts_with("completed"), "{human:#?}");
}

#[tokio::test]
async fn a_cut_stream_is_resumed_and_the_call_completes() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--protocol", "2025-11-25"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        run.json()["result"]["content"][0]["text"],
        "deployed catalog 2026.07.22"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let resumes = server.state.resume_requests().len();
    assert_eq!(resumes, 1);
}

#[tokio::test]
async fn a_tool_error_or_a_json_rpc_error_exits_1() {
    let server = TestServer::start().await;
    // deploy_release without its required arguments: rmcp answers with `isError: true`.
    let run = call(&server.url, "deploy_release", json!({}), &[]).await;
    assert_eq!(run.code, 1, "{run:#?}");
    assert_eq!(run.json()["outcome"], "tool_error");
    assert_eq!(run.json()["result"]["isError"], true);
    // A tool the server does not have: a JSON-RPC error.
    let run = call(&server.url, "no_such_tool", json!({}), &[]).await;
    assert_eq!(run.code, 1, "{run:#?}");
    assert_eq!(run.json()["outcome"], "jsonrpc_error", "{run:#?}");
    assert!(run.json()["result"]["code"].is_i64(), "{run:#?}");
    assert_eq!(server.state.total_side_effects(), 0);
}

#[tokio::test]
async fn a_refusal_by_http_status_exits_1_and_nothing_ran() {
    let server = TestServer::start().await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::Status(403));
    let run = call(&server.url, "deploy_release", deploy_args(), &[]).await;
    assert_eq!(run.code, 1, "{run:#?}");
    assert_eq!(run.json()["outcome"], "refused");
    assert_eq!(run.json()["result"]["http_status"], 403);
    assert_eq!(server.state.side_effects("deploy_release"), 0);
}

#[tokio::test]
async fn usage_and_connection_errors_exit_2_and_say_what_to_do() {
    let server = TestServer::start().await;
    let run = replay_guard(&[
        "call",
        "--url",
        &server.url,
        "--tool",
        "deploy_release",
        "--args",
        "not json",
    ])
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("--args is not JSON"), "{run:#?}");

    let run = call(&server.url, "deploy_release", json!([1]), &[]).await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("must be a JSON object"), "{run:#?}");

    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--class", "sometimes"],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");

    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--header", "Authorization Bearer s3cr3t"],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        !run.stderr.contains("s3cr3t"),
        "a credential leaked into an error: {run:#?}"
    );

    // A policy file with a bad class: the error names the key.
    let dir = temp_dir("policy");
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "[tools.deploy_release]\nclass = \"sometimes\"\n").unwrap();
    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--policy", &policy.to_string_lossy()],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("tools.deploy_release.class"),
        "{run:#?}"
    );
    let _ = std::fs::remove_dir_all(dir);

    // Nobody listens: nothing can be sent, in either era.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/mcp", listener.local_addr().unwrap())
    };
    for protocol in ["2025-11-25", "2026-07-28", "auto"] {
        let run = call(
            &closed,
            "deploy_release",
            deploy_args(),
            &["--protocol", protocol],
        )
        .await;
        assert_eq!(run.code, 2, "{protocol}: {run:#?}");
        assert!(
            run.stderr.contains("Nothing was sent"),
            "{protocol}: {run:#?}"
        );
    }
    // A read-only call to nobody: re-sent freely, then a connection error.
    let run = call(
        &closed,
        "list_branches",
        json!({}),
        &["--protocol", "2026-07-28", "--class", "read-only"],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("cannot reach"), "{run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 0);
}

#[tokio::test]
async fn a_lost_response_exits_3_and_a_second_call_with_the_same_ledger_attaches_to_it() {
    let dir = temp_dir("lost");
    let ledger = ledger_path(&dir);
    let server = TestServer::start().await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);

    let first = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(first.code, 3, "{first:#?}");
    let id = first.execution_id();
    let out = first.json();
    assert_eq!(out["outcome"], "guard_answer");
    assert_eq!(
        out["result"]["structuredContent"]["mcp_replay_guard"]["state"],
        "needs_review"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    let second = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(second.code, 3, "{second:#?}");
    assert_eq!(
        second.execution_id(),
        id,
        "the repeat names the first execution"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    // The ledger the calls wrote verifies; one changed byte is found and named.
    let verify = replay_guard(&["audit", "verify", &ledger]).await;
    assert_eq!(verify.code, 0, "{verify:#?}");
    assert!(verify.stdout.starts_with("ok: "), "{verify:#?}");
    let text = std::fs::read_to_string(&ledger).unwrap();
    let line = text.lines().nth(2).expect("at least three lines");
    let seq = serde_json::from_str::<Value>(line).unwrap()["seq"]
        .as_u64()
        .unwrap();
    // One byte: the first digit of the event's time.
    let tampered = line.replacen("\"at\":\"2", "\"at\":\"3", 1);
    assert_ne!(tampered, line, "the line has a time");
    std::fs::write(&ledger, text.replacen(line, &tampered, 1)).unwrap();
    let verify = replay_guard(&["audit", "verify", &ledger]).await;
    assert_eq!(verify.code, 1, "{verify:#?}");
    assert!(verify.stdout.contains(&format!("seq {seq}")), "{verify:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Twenty processes make the same call at once over one ledger file, and the response is lost:
/// one dispatch, and every process names the same execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_calls_sharing_a_ledger_dispatch_once() {
    let dir = temp_dir("twenty");
    let ledger = ledger_path(&dir);
    let server = TestServer::start().await;
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::DropResponseAfterTool);
    let args = deploy_args().to_string();
    let argv = [
        "--json",
        "call",
        "--url",
        &server.url,
        "--tool",
        "deploy_release",
        "--args",
        &args,
        "--ledger",
        &ledger,
    ];
    let runs = concurrently(20, &argv).await;
    let ids: std::collections::BTreeSet<String> = runs.iter().map(Run::execution_id).collect();
    for run in &runs {
        assert_eq!(run.code, 3, "{run:#?}");
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// The same without a fault, on a slow tool: the other processes attach to the running
/// execution and all get its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_in_other_processes_attach_and_get_the_same_result() {
    let dir = temp_dir("attach");
    let ledger = ledger_path(&dir);
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(3),
        ..ServerOptions::default()
    })
    .await;
    let argv = [
        "--json",
        "call",
        "--url",
        &server.url,
        "--tool",
        "slow_deploy",
        "--args",
        r#"{"service":"catalog"}"#,
        "--ledger",
        &ledger,
        "--class",
        "irreversible",
    ];
    let runs = concurrently(20, &argv).await;
    for run in &runs {
        assert_eq!(run.code, 0, "{run:#?}");
    }
    let results: std::collections::BTreeSet<String> = runs
        .iter()
        .map(|r| r.json()["result"].to_string())
        .collect();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_demo_deploys_twice_without_the_guard_and_once_with_it() {
    let dir = temp_dir("demo");
    let ledger = ledger_path(&dir);
    let run = replay_guard(&["--json", "demo", "--ledger", &ledger]).await;
    assert_eq!(run.code, 0, "{run:#?}");
    let out = run.json();
    assert_eq!(out["generic_retry"]["deployments"], 2, "{out:#}");
    assert_eq!(out["guard"]["deployments"], 1, "{out:#}");
    assert_eq!(out["guard"]["decision"], "needs_review", "{out:#}");
    assert_eq!(out["audit"]["ok"], true, "{out:#}");
    let verify = replay_guard(&["audit", "verify", &ledger]).await;
    assert_eq!(verify.code, 0, "{verify:#?}");

    let human = replay_guard(&[
        "demo",
        "--ledger",
        &dir.join("human.jsonl").to_string_lossy(),
    ])
    .await;
    assert_eq!(human.code, 0, "{human:#?}");
    assert!(
        human
            .stdout
            .contains("deployments: generic retry 2, guard 1 -> ok"),
        "{human:#?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `n` copies of `replay-guard ARGV…` at once, as separate processes.
async fn concurrently(n: usize, argv: &[&str]) -> Vec<Run> {
    let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let argv = argv.clone();
        set.spawn(async move {
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            replay_guard(&argv).await
        });
    }
    set.join_all().await
}

/// `replay-guard --json ledger list PATH`, parsed.
async fn ledger_records(ledger: &str) -> Vec<Value> {
    let list = replay_guard(&["--json", "ledger", "list", ledger]).await;
    assert_eq!(list.code, 0, "{list:#?}");
    serde_json::from_str(&list.stdout).unwrap_or_else(|e| panic!("{e}: {list:#?}"))
}

/// Issue 12, item 2. A `call` killed once its teardown began (the session DELETE, which this
/// server never answers) has printed its answer; and whenever stdout is empty, the ledger does
/// not say delivered and the repeat prints the kept result without running the tool again.
#[tokio::test]
async fn the_answer_is_printed_before_delivery_is_recorded_and_before_teardown() {
    let dir = temp_dir("delivered-before-print");
    let ledger = ledger_path(&dir);
    let server = TestServer::start().await;
    let front = FrontServer::start(
        &server.url,
        FrontOptions {
            hang_delete: true,
            ..FrontOptions::default()
        },
    )
    .await;
    let args = deploy_args().to_string();
    let child = tokio::process::Command::new(BIN)
        .args([
            "--json",
            "call",
            "--url",
            &front.url,
            "--tool",
            "deploy_release",
        ])
        .args([
            "--args",
            &args,
            "--ledger",
            &ledger,
            "--protocol",
            "2025-11-25",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the binary runs");
    // The tool ran, the answer came back, and the teardown began: kill -9 now.
    assert_eq!(front.wait_for_deletes(1, Duration::from_secs(30)).await, 1);
    let mut child = child;
    child.start_kill().expect("SIGKILL");
    let output = child.wait_with_output().await.unwrap();
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    if stdout.trim().is_empty() {
        assert_ne!(
            records[0]["state"], "delivered",
            "delivered recorded with nothing printed: {records:#?}"
        );
        let repeat = call(
            &server.url,
            "deploy_release",
            deploy_args(),
            &["--ledger", &ledger, "--protocol", "2025-11-25"],
        )
        .await;
        assert_eq!(repeat.code, 0, "{repeat:#?}");
        assert_eq!(server.state.side_effects("deploy_release"), 1);
    }
    // Printing and flushing come before the teardown.
    let printed: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("the answer was not printed before the DELETE ({e}): {output:#?}")
    });
    assert_eq!(printed["outcome"], "completed", "{printed:#}");
    assert_eq!(
        printed["result"]["content"][0]["text"],
        "deployed catalog 2026.07.22"
    );
    assert_eq!(records[0]["state"], "delivered", "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 12, item 12. A stream that never brings the answer: `--timeout` ends the call with
/// exit 3 (not a stack overflow at shutdown, exit 134), and the ledger says unknown.
#[tokio::test]
async fn a_stream_without_an_answer_exits_3_at_the_timeout_and_the_ledger_says_unknown() {
    let dir = temp_dir("never-ends");
    let ledger = ledger_path(&dir);
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(120),
        ..ServerOptions::default()
    })
    .await;
    let run = call(
        &server.url,
        "slow_deploy",
        json!({"service": "catalog"}),
        &[
            "--ledger",
            &ledger,
            "--class",
            "irreversible",
            "--timeout",
            "3s",
            "--protocol",
            "2025-11-25",
        ],
    )
    .await;
    assert_eq!(run.code, 3, "{run:#?}");
    assert_eq!(run.json()["outcome"], "unknown", "{run:#?}");
    assert_eq!(server.state.started("slow_deploy"), 1);
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "unknown", "{records:#?}");
    assert_eq!(run.json()["result"]["state"], "unknown", "{run:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 12, items 12 and 15. A JSON answer over the CLI's 16 MiB bound: the tool ran, so the
/// exit is 3 (never 2, "nothing was sent"; never 134), and the ledger says unknown, not
/// delivered.
#[tokio::test]
async fn an_answer_over_the_size_bound_exits_3_and_is_not_delivered() {
    let dir = temp_dir("too-large");
    let ledger = ledger_path(&dir);
    let server = TestServer::start_with(ServerOptions {
        json_response: true,
        ..ServerOptions::stateless()
    })
    .await;
    let front = FrontServer::start(
        &server.url,
        FrontOptions {
            pad_answer: Some(17 * 1024 * 1024),
            ..FrontOptions::default()
        },
    )
    .await;
    let run = call(
        &front.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger, "--protocol", "2026-07-28"],
    )
    .await;
    assert_eq!(run.code, 3, "{run:#?}");
    assert!(run.stderr.contains("too large"), "{run:#?}");
    assert!(run.stderr.contains("act_"), "names the execution: {run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = ledger_records(&ledger).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["state"], "unknown", "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Issue 12, item 13. Credentials in the URL (userinfo, query) reach neither the ledger nor
/// stdout nor stderr: not on a call that completes, not on one that cannot connect, not on a URL
/// that does not parse.
#[tokio::test]
async fn credentials_in_the_url_reach_no_ledger_no_output_and_no_error() {
    let dir = temp_dir("url-secrets");
    let ledger = ledger_path(&dir);
    let server = TestServer::start().await;
    let secret_url = server.url.replace("http://", "http://agent:pw-s3cr3t@") + "?token=tok-s3cr3t";
    let leaked = |text: &str| text.contains("s3cr3t");

    let run = call(
        &secret_url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger, "--protocol", "2025-11-25"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert!(!leaked(&run.stdout) && !leaked(&run.stderr), "{run:#?}");
    let text = std::fs::read_to_string(&ledger).unwrap();
    assert!(!leaked(&text), "a credential reached the ledger: {text}");
    let records = ledger_records(&ledger).await;
    let target = records[0]["target"].as_str().unwrap();
    assert!(
        target.starts_with("127.0.0.1:") && target.ends_with("/mcp"),
        "{records:#?}"
    );

    // Nobody listens: the error names the endpoint without its credentials.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!(
            "http://agent:pw-s3cr3t@{}/mcp?token=tok-s3cr3t",
            listener.local_addr().unwrap()
        )
    };
    for protocol in ["2025-11-25", "2026-07-28"] {
        let run = call(
            &closed,
            "deploy_release",
            deploy_args(),
            &["--ledger", &ledger, "--protocol", protocol],
        )
        .await;
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(run.stderr.contains("127.0.0.1"), "{run:#?}");
        assert!(!leaked(&run.stdout) && !leaked(&run.stderr), "{run:#?}");
    }
    // A URL that does not parse.
    let run = call(
        "http://agent:pw-s3cr3t@bad host/mcp?token=tok-s3cr3t",
        "deploy_release",
        deploy_args(),
        &[],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("is not a URL"), "{run:#?}");
    assert!(!leaked(&run.stdout) && !leaked(&run.stderr), "{run:#?}");
    let text = std::fs::read_to_string(&ledger).unwrap();
    assert!(!leaked(&text), "a credential reached the ledger: {text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `replay-guard --json call …` with stdout a pipe whose reader is gone: every print fails.
async fn call_with_stdout_closed(url: &str, extra: &[&str]) -> Run {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let args = deploy_args().to_string();
    let output = tokio::process::Command::new(BIN)
        .args(["--json", "call", "--url", url, "--tool", "deploy_release"])
        .args(["--args", &args])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::from(writer))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .wait_with_output()
        .await
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::new(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Issue 12, item 2, the kept result too. An answer that cannot be printed (stdout is gone) is
/// not delivered: the exit is 3, and the repeat gets the kept result, whether the first answer
/// came from the tool or was itself a kept result handed back; the tool ran once.
#[tokio::test]
async fn an_answer_that_cannot_be_printed_is_not_delivered_and_stays_kept() {
    let dir = temp_dir("unprintable");
    let ledger = ledger_path(&dir);
    let server = TestServer::start().await;
    let extra = ["--ledger", ledger.as_str(), "--protocol", "2025-11-25"];
    for round in ["the tool's answer", "the kept result handed back"] {
        let run = call_with_stdout_closed(&server.url, &extra).await;
        assert_eq!(run.code, 3, "{round}: {run:#?}");
        assert!(run.stderr.contains("cannot print"), "{round}: {run:#?}");
        let records = ledger_records(&ledger).await;
        assert_eq!(records.len(), 1, "{round}: {records:#?}");
        assert_eq!(
            records[0]["state"], "completed_result_not_delivered",
            "{round}: {records:#?}"
        );
    }
    let run = call(&server.url, "deploy_release", deploy_args(), &extra).await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(
        run.json()["result"]["content"][0]["text"],
        "deployed catalog 2026.07.22"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let records = ledger_records(&ledger).await;
    assert_eq!(records[0]["state"], "delivered", "{records:#?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--args` with an integer literal beyond 64 bits is refused before anything is sent (exit 2):
/// parsed into a double it would reach the tool rewritten (`1.8446744073709552e19`), and two
/// such literals that round to one double would be one intent.
#[tokio::test]
async fn args_with_an_integer_beyond_64_bits_are_refused_unsent_not_rewritten() {
    let server = TestServer::start().await;
    let dir = temp_dir("wide-int");
    let ledger = ledger_path(&dir);
    for literal in [
        "18446744073709551617",
        "-9223372036854775809",
        "[18446744073709551616]",
    ] {
        let args = format!(r#"{{"service":"catalog","version":"1","build":{literal}}}"#);
        let run = replay_guard(&[
            "--json",
            "call",
            "--url",
            &server.url,
            "--tool",
            "deploy_release",
            "--args",
            &args,
            "--ledger",
            &ledger,
        ])
        .await;
        assert_eq!(run.code, 2, "{literal}: {run:#?}");
        assert!(run.stderr.contains("64 bits"), "{literal}: {run:#?}");
        assert!(
            run.stderr.contains("Nothing was sent"),
            "{literal}: {run:#?}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    // An integer that fits is sent exactly as given.
    let run = replay_guard(&[
        "--json",
        "call",
        "--url",
        &server.url,
        "--tool",
        "deploy_release",
        "--args",
        r#"{"service":"catalog","version":"1","build":18446744073709551615}"#,
        "--ledger",
        &ledger,
    ])
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let calls = server.state.tool_call_requests("deploy_release");
    assert_eq!(
        calls[0].body.as_ref().unwrap()["params"]["arguments"]["build"],
        json!(18446744073709551615_u64)
    );
}

/// URL userinfo, a `?token=` and `--header` values never reach stdout, stderr (at
/// `RUST_LOG=trace`, on an answer, an unknown outcome, a refusal and an unreachable server)
/// or any file beside the ledger.
#[tokio::test]
async fn secrets_in_the_url_and_headers_reach_no_output_even_at_trace() {
    const SECRETS: [&str; 4] = ["pw-S3CRET1", "tok-S3CRET2", "bearer-S3CRET3", "key-S3CRET4"];
    let server = TestServer::start().await;
    let dir = temp_dir("secrets");
    let ledger = ledger_path(&dir);
    let authority = server.url.strip_prefix("http://").unwrap();
    let url = format!(
        "http://user:{}@{authority}?token={}",
        SECRETS[0], SECRETS[1]
    );
    let dead = format!(
        "http://user:{}@127.0.0.1:9/mcp?token={}",
        SECRETS[0], SECRETS[1]
    );
    let auth = format!("Authorization: Bearer {}", SECRETS[2]);
    let key = format!("X-Api-Key: {}", SECRETS[3]);
    let faults = [
        None,
        Some(Fault::DropResponseAfterTool),
        Some(Fault::Status(403)),
        Some(Fault::CutStreamAfterFirstEvent),
    ];
    let mut outputs = Vec::new();
    for (i, fault) in faults.into_iter().enumerate() {
        if let Some(fault) = fault {
            server.state.faults().schedule("deploy_release", fault);
        }
        let args = json!({"service": "catalog", "version": format!("v{i}")}).to_string();
        // Typed without `//` (a `\\` for a `/`): no authority parses, the userinfo is still one.
        let malformed = format!(
            "http:/\\user:{}@{authority}?token={}",
            SECRETS[0], SECRETS[1]
        );
        for target in [&url, &dead, &malformed] {
            for json_flag in [true, false] {
                let mut argv = vec![];
                if json_flag {
                    argv.push("--json");
                }
                argv.extend_from_slice(&[
                    "call",
                    "--url",
                    target,
                    "--tool",
                    "deploy_release",
                    "--args",
                    &args,
                    "--header",
                    &auth,
                    "--header",
                    &key,
                    "--ledger",
                    &ledger,
                    "--timeout",
                    "5s",
                ]);
                let output = tokio::process::Command::new(BIN)
                    .args(&argv)
                    .env("RUST_LOG", "trace")
                    .output()
                    .await
                    .unwrap();
                outputs.push(String::from_utf8_lossy(&output.stdout).into_owned());
                outputs.push(String::from_utf8_lossy(&output.stderr).into_owned());
            }
        }
    }
    for argv in [
        vec!["ledger", "list", "--ledger", &ledger],
        vec!["--json", "ledger", "list", "--ledger", &ledger],
        vec!["audit", "verify", "--ledger", &ledger],
    ] {
        let output = tokio::process::Command::new(BIN)
            .args(&argv)
            .env("RUST_LOG", "trace")
            .output()
            .await
            .unwrap();
        outputs.push(String::from_utf8_lossy(&output.stdout).into_owned());
        outputs.push(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let mut dirs = vec![dir.clone()];
    while let Some(next) = dirs.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                outputs.push(String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned());
            }
        }
    }
    assert!(server.state.side_effects("deploy_release") >= 3);
    assert!(
        outputs
            .iter()
            .any(|o| o.contains("TRACE") || o.contains("trace"))
    );
    let leaks: Vec<&str> = outputs
        .iter()
        .flat_map(|o| o.lines())
        .filter(|line| SECRETS.iter().any(|s| line.contains(s)))
        .collect();
    assert!(
        leaks.is_empty(),
        "{} lines leak a secret:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
}
