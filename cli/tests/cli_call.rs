//! `replay-guard call` and `replay-guard demo`, run as the built binary against rmcp's own
//! server on 127.0.0.1 (tests/support), with faults injected in front of the server. The
//! server's side-effect counters are the ground truth.

mod support;

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use support::*;

/// A new temp dir of this file's and the path of `ledger.jsonl` in it.
fn ledger_dir(name: &str) -> (std::path::PathBuf, String) {
    let dir = temp_dir("cli-call", name);
    let ledger = ledger_path(&dir);
    (dir, ledger)
}

fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

fn ledger_path(dir: &Path) -> String {
    dir.join("ledger.jsonl").to_string_lossy().into_owned()
}

/// `second` repeated `first`, a `deploy_release` held for review: the same execution, still
/// held, and nothing sent again (the tool ran once).
fn assert_repeat_held(server: &TestServer, first: &Run, second: &Run) {
    assert_eq!(second.code, 3, "{second:#?}");
    assert_eq!(second.execution_id(), first.execution_id());
    assert_eq!(
        second.json()["result"]["structuredContent"]["mcp_replay_guard"]["state"],
        "needs_review",
        "{second:#?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
}

/// Writes `toml` as `policy.toml` in `dir`; returns its path.
fn policy_file(dir: &Path, toml: &str) -> String {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, toml).unwrap();
    policy.to_string_lossy().into_owned()
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
    let policy = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/policy.toml");
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

/// The tool made its effect, then rmcp answered `ErrorData::internal_error` (-32603): the
/// outcome is unknown (exit 3), the call is held, and a second `call` over the same ledger is
/// held too, never run again. Both used to exit 1 with the tool run twice.
#[tokio::test]
async fn a_json_rpc_error_after_the_effect_exits_3_and_the_repeat_does_not_run_the_tool() {
    let (dir, ledger) = ledger_dir("internal-error");
    let server = TestServer::start().await;
    server.state.fail_next_after_effect("deploy_release");
    let extra = ["--ledger", ledger.as_str()];
    let first = call(&server.url, "deploy_release", deploy_args(), &extra).await;
    assert_eq!(first.code, 3, "{first:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let second = call(&server.url, "deploy_release", deploy_args(), &extra).await;
    assert_repeat_held(&server, &first, &second);
    let _ = std::fs::remove_dir_all(dir);
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
    let dir = temp_dir("cli-call", "policy");
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
    let (dir, ledger) = ledger_dir("lost");
    let server = TestServer::start().await;
    server.state.lose_next_response("deploy_release");

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
    let (dir, ledger) = ledger_dir("twenty");
    let server = TestServer::start().await;
    server.state.lose_next_response("deploy_release");
    let args = deploy_args().to_string();
    let argv = call_argv(&server.url, "deploy_release", &args, &["--ledger", &ledger]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
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
    let (dir, ledger) = ledger_dir("attach");
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(3),
        ..ServerOptions::default()
    })
    .await;
    let argv = slow_argv(&server.url, &ledger, &["--class", "irreversible"]);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
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
    let (dir, ledger) = ledger_dir("demo");
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
    // What the demo tells the operator to run, run as printed: the queue holds the execution,
    // its timeline reads, and the resolution settles it.
    let advice: Vec<Vec<String>> = human
        .stdout
        .lines()
        .filter_map(|line| line.strip_prefix("  replay-guard "))
        .map(|line| {
            let (head, note) = line.split_once(" --note ").unwrap_or((line, ""));
            let mut argv: Vec<String> = head.split_whitespace().map(str::to_owned).collect();
            if !note.is_empty() {
                argv.push("--note".into());
                argv.push(note.trim_matches('"').to_owned());
            }
            argv
        })
        .collect();
    assert_eq!(advice.len(), 3, "{human:#?}");
    for argv in &advice {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let run = replay_guard(&argv).await;
        assert_eq!(run.code, 0, "{argv:?}: {run:#?}");
        assert!(!run.stdout.trim().is_empty(), "{argv:?}: {run:#?}");
    }
    let list = replay_guard(&[
        "ledger",
        "list",
        "--ledger",
        &dir.join("human.jsonl").to_string_lossy(),
        "--held",
    ])
    .await;
    assert!(
        list.stdout.trim().is_empty(),
        "settled, so no longer held: {list:#?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// A `call` killed once its teardown began (the session DELETE, which this
/// server never answers) has printed its answer; and whenever stdout is empty, the ledger does
/// not say delivered and the repeat prints the kept result without running the tool again.
#[tokio::test]
async fn the_answer_is_printed_before_delivery_is_recorded_and_before_teardown() {
    let (dir, ledger) = ledger_dir("delivered-before-print");
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
    let child = replay_guard_command([
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

/// A stream that never brings the answer: `--timeout` ends the call with
/// exit 3 (not a stack overflow at shutdown, exit 134), and the ledger says unknown.
#[tokio::test]
async fn a_stream_without_an_answer_exits_3_at_the_timeout_and_the_ledger_says_unknown() {
    let (dir, ledger) = ledger_dir("never-ends");
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

/// A JSON answer over the CLI's 16 MiB bound: the tool ran, so the
/// exit is 3 (never 2, "nothing was sent"; never 134), and the ledger says unknown, not
/// delivered.
#[tokio::test]
async fn an_answer_over_the_size_bound_exits_3_and_is_not_delivered() {
    let (dir, ledger) = ledger_dir("too-large");
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

/// Credentials in the URL (userinfo, query) reach neither the ledger nor
/// stdout nor stderr: not on a call that completes, not on one that cannot connect, not on a URL
/// that does not parse.
#[tokio::test]
async fn credentials_in_the_url_reach_no_ledger_no_output_and_no_error() {
    let (dir, ledger) = ledger_dir("url-secrets");
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
    let output = replay_guard_command(["--json", "call", "--url", url, "--tool", "deploy_release"])
        .args(["--args", &args])
        .args(extra)
        .stdout(std::process::Stdio::from(writer))
        .spawn()
        .unwrap()
        .wait_with_output()
        .await
        .unwrap();
    Run::from_output(&output)
}

/// The kept result too. An answer that cannot be printed (stdout is gone) is
/// not delivered: the exit is 3, and the repeat gets the kept result, whether the first answer
/// came from the tool or was itself a kept result handed back; the tool ran once.
#[tokio::test]
async fn an_answer_that_cannot_be_printed_is_not_delivered_and_stays_kept() {
    let (dir, ledger) = ledger_dir("unprintable");
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

// ---- The ledger file (keys, foreign files, read-only commands, a held lock) -------

#[tokio::test]
async fn a_held_call_is_not_resent_when_the_key_file_is_gone() {
    let (dir, ledger) = ledger_dir("key-gone");
    let key = format!("{ledger}.key");
    let server = TestServer::start().await;
    server.state.lose_next_response("deploy_release");
    let first = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(first.code, 3, "{first:#?}");
    assert_eq!(
        first.json()["result"]["structuredContent"]["mcp_replay_guard"]["state"],
        "needs_review"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // The key file is moved away (a copy of the ledger without it, a cleanup, a bad backup).
    let moved = dir.join("moved.key");
    std::fs::rename(&key, &moved).unwrap();
    let repeat = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(repeat.code, 2, "{repeat:#?}");
    assert!(
        repeat.stderr.contains("missing")
            && repeat.stderr.contains(&key)
            && repeat.stderr.contains("nothing was sent"),
        "{repeat:#?}"
    );
    assert!(!std::path::Path::new(&key).exists(), "no key was generated");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);

    // Another key in its place is refused the same way.
    std::fs::write(&key, "ab".repeat(32)).unwrap();
    let repeat = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(repeat.code, 2, "{repeat:#?}");
    assert!(repeat.stderr.contains("not the key"), "{repeat:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // The key restored: the repeat finds the held execution again.
    std::fs::rename(&moved, &key).unwrap();
    let restored = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(restored.code, 3, "{restored:#?}");
    assert_eq!(restored.execution_id(), first.execution_id());
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_foreign_file_given_as_the_ledger_is_refused_untouched() {
    let dir = temp_dir("cli-call", "foreign");
    let server = TestServer::start().await;
    let notes = dir.join("notes.txt");
    let bytes = b"Release checklist\n- tag\n- deploy catalog\n".to_vec();
    std::fs::write(&notes, &bytes).unwrap();
    let p = notes.to_string_lossy().into_owned();
    let runs = [
        call(
            &server.url,
            "deploy_release",
            deploy_args(),
            &["--ledger", &p],
        )
        .await,
        replay_guard(&["ledger", "list", &p]).await,
        replay_guard(&["audit", "show", &p]).await,
        replay_guard(&[
            "resolve",
            &p,
            &mcp_replay_guard::ExecutionId::new().to_string(),
            "--applied",
            "--note",
            "x",
        ])
        .await,
    ];
    for run in &runs {
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(
            run.stderr.contains("not a replay-guard ledger") && run.stderr.contains("text"),
            "{run:#?}"
        );
        assert_eq!(std::fs::read(&notes).unwrap(), bytes, "untouched: {run:#?}");
    }
    assert!(
        runs[0].stderr.contains("nothing was sent"),
        "{:#?}",
        runs[0]
    );
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["notes.txt"],
        "no key, no owners directory beside it"
    );
    assert_eq!(server.state.total_side_effects(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// What a read-only command must leave as it is.
#[derive(Debug, PartialEq)]
struct Snapshot {
    bytes: Vec<u8>,
    modified: std::time::SystemTime,
    owners: Vec<String>,
    siblings: Vec<String>,
}

fn snapshot(ledger: &Path) -> Snapshot {
    let owners = ledger.with_file_name(format!(
        "{}.owners",
        ledger.file_name().unwrap().to_string_lossy()
    ));
    let names = |dir: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    Snapshot {
        bytes: std::fs::read(ledger).unwrap(),
        modified: std::fs::metadata(ledger).unwrap().modified().unwrap(),
        owners: names(&owners),
        siblings: names(ledger.parent().unwrap()),
    }
}

#[tokio::test]
async fn read_only_commands_write_nothing_and_work_on_a_file_they_cannot_write() {
    use mcp_replay_guard::{
        execution::{EventKind, LedgerEvent, Timestamp},
        ledger::{FileLedger, Ledger},
    };
    let (dir, ledger) = ledger_dir("read-only");
    let path = std::path::PathBuf::from(&ledger);
    let server = TestServer::start().await;
    server.state.lose_next_response("deploy_release");
    let held = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(held.code, 3, "{held:#?}");
    // Everything a writing open would change: a dispatch whose owner is gone (it would append
    // `unknown`), the lock file of a dead owner (it would prune it), and a torn tail (it would
    // cut it).
    let orphan = {
        let file = FileLedger::open(&path).unwrap();
        let key = file.fingerprint_key().unwrap();
        drop(key);
        let claimed = file
            .claim(mcp_replay_guard::execution::Claim::new(
                format!("hmac-sha256:{}", "ab".repeat(32)).parse().unwrap(),
                "deploy_release",
                "replay-guard".into(),
                "cli".into(),
                "127.0.0.1/mcp".into(),
                mcp_replay_guard::execution::RetryClass::Irreversible,
                "guard:gone",
            ))
            .await
            .unwrap();
        let id = claimed.record().execution_id();
        let event = |kind| LedgerEvent {
            execution_id: id,
            at: Timestamp::now(),
            kind,
        };
        file.append(event(EventKind::Authorized)).await.unwrap();
        file.append(event(EventKind::Dispatched {
            attempt: 1,
            idempotency_key: mcp_replay_guard::IdempotencyKey::from(id),
            key_from_caller: false,
            jsonrpc_id: None,
            session_id: None,
            client_info: None,
            owner: None,
        }))
        .await
        .unwrap();
        id
    };
    std::fs::write(dir.join("ledger.jsonl.owners/guard_dead.lock"), b"").unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.extend_from_slice(br#"{"seq":99,"prev":"sha256:"#);
    std::fs::write(&path, &bytes).unwrap();
    let before = snapshot(&path);
    assert!(
        before.owners.contains(&"guard_dead.lock".to_owned()),
        "{before:?}"
    );

    let orphan_id = orphan.to_string();
    let commands: [&[&str]; 5] = [
        &["ledger", "list", &ledger],
        &["--json", "ledger", "list", &ledger, "--state", "dispatched"],
        &["audit", "show", &ledger],
        &["audit", "show", &ledger, &orphan_id],
        &["audit", "verify", &ledger],
    ];
    for argv in commands {
        let run = replay_guard(argv).await;
        if argv[0] != "audit" || argv[1] != "verify" {
            assert_eq!(run.code, 0, "{argv:?}: {run:#?}");
        }
        assert_eq!(snapshot(&path), before, "{argv:?} wrote: {run:#?}");
    }
    let list = replay_guard(&["ledger", "list", &ledger]).await;
    assert!(
        list.stdout.contains(&orphan_id) && list.stdout.contains(&held.execution_id()),
        "{list:#?}"
    );
    assert!(
        list.stdout.contains("dispatched (owner gone)"),
        "the orphan is not hidden: {list:#?}"
    );

    // A file and a directory it cannot write: root ignores permission bits, so the command
    // runs as another user who owns them read-only.
    use std::os::unix::{fs::PermissionsExt, process::CommandExt};
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .unwrap()
        .stdout
        == b"0\n";
    let nobody = 65534;
    let set = |p: &Path, mode: u32| {
        if root {
            std::os::unix::fs::chown(p, Some(nobody), Some(nobody)).unwrap();
        }
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set(&path, 0o400);
    set(&dir, 0o500);
    // The other user runs a copy of the command from a directory it can reach: the build's
    // own directory may sit below one only root can enter (a clone in `mktemp -d`, mode 0700).
    let bin = std::env::temp_dir().join(format!("replay-guard-as-nobody-{}", std::process::id()));
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut list = std::process::Command::new(&bin);
    list.args(["ledger", "list", &ledger]);
    if root {
        list.uid(nobody).gid(nobody);
    }
    let output = list.output().unwrap();
    let _ = std::fs::remove_file(&bin);
    set(&dir, 0o700);
    set(&path, 0o600);
    assert!(
        output.status.success(),
        "ledger list on a read-only file: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains(&orphan_id));
    assert_eq!(std::fs::read(&path).unwrap(), before.bytes);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_ledger_lock_bounds_the_call_and_names_the_holder() {
    use tokio::io::AsyncBufReadExt;
    let (dir, ledger) = ledger_dir("lock");
    let server = TestServer::start().await;
    // A ledger that exists, with its key, and a process that holds its lock and never lets go.
    mcp_replay_guard::ledger::FileLedger::open(&ledger)
        .unwrap()
        .fingerprint_key()
        .unwrap();
    let mut holder = tokio::process::Command::from(child_process(&format!("hold_lock|{ledger}")));
    let mut holder = holder
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let holder_pid = holder.id().unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    while let Some(line) = lines.next_line().await.unwrap() {
        if line.contains("LOCKED") {
            break;
        }
    }

    let (run, took) = replay_guard_within(
        &[
            "--json",
            "call",
            "--url",
            &server.url,
            "--tool",
            "deploy_release",
            "--args",
            &deploy_args().to_string(),
            "--ledger",
            &ledger,
            "--timeout",
            "2s",
        ],
        Duration::from_secs(30),
    )
    .await
    .expect("`call` ends although the ledger lock is held");
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(
        run.stderr.contains("locked") && run.stderr.contains(&format!("pid {holder_pid}")),
        "{run:#?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "bounded by --timeout: {took:?}"
    );
    assert_eq!(server.state.side_effects("deploy_release"), 0);

    // Reading needs no lock: `ledger list` answers at once.
    let (run, took) = replay_guard_within(&["ledger", "list", &ledger], Duration::from_secs(30))
        .await
        .expect("`ledger list` ends although the ledger lock is held");
    assert_eq!(run.code, 0, "{run:#?}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // The holder lets go: the call goes through.
    drop(holder.stdin.take());
    assert!(holder.wait().await.unwrap().success());
    let run = call(
        &server.url,
        "deploy_release",
        deploy_args(),
        &["--ledger", &ledger],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// The child side: does nothing unless `MRG_CHILD` names a task.
#[test]
#[ignore = "a child process's entry point, run by the tests that start it (with MRG_CHILD set)"]
fn child_entry() {
    let Ok(task) = std::env::var(CHILD_TASK) else {
        return;
    };
    let parts: Vec<&str> = task.split('|').collect();
    match parts[..] {
        ["hold_lock", path] => {
            use std::io::Read;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .open(path)
                .unwrap();
            file.lock().unwrap();
            println!("LOCKED {}", std::process::id());
            let mut rest = Vec::new();
            std::io::stdin().read_to_end(&mut rest).unwrap();
        }
        _ => panic!("unknown child task {task}"),
    }
}

/// An irreversible call held for review stays held when it is repeated after
/// its link window. The window limits how long a settled result is handed back, never how long
/// an unknown outcome blocks a second dispatch.
#[tokio::test]
async fn a_held_call_repeated_after_its_link_window_is_still_held_and_not_sent_again() {
    let (dir, ledger) = ledger_dir("window");
    let policy = policy_file(
        &dir,
        "[tools.deploy_release]\nclass = \"irreversible\"\nlink_window = \"3s\"\n",
    );
    let server = TestServer::start().await;
    server.state.lose_next_response("deploy_release");
    let extra = ["--ledger", ledger.as_str(), "--policy", policy.as_str()];
    let first = call(&server.url, "deploy_release", deploy_args(), &extra).await;
    assert_eq!(first.code, 3, "{first:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);

    // Nothing to poll for: the wall clock has to pass the 3 s window.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let second = call(&server.url, "deploy_release", deploy_args(), &extra).await;
    assert_repeat_held(&server, &first, &second);
    let _ = std::fs::remove_dir_all(dir);
}

/// The `--json call` argv of the slow tool over `ledger`, then `extra`.
fn slow_argv(url: &str, ledger: &str, extra: &[&str]) -> Vec<String> {
    let extra: Vec<&str> = ["--ledger", ledger].iter().chain(extra).copied().collect();
    call_argv(url, "slow_deploy", r#"{"service":"catalog"}"#, &extra)
}

/// The `--json call` argv of the slow tool as an idempotent call over `ledger`.
fn slow_idempotent_argv(url: &str, ledger: &str) -> Vec<String> {
    slow_argv(url, ledger, &["--class", "idempotent"])
}

/// How many `event` lines of `kind` the ledger file holds.
fn events_of_kind(ledger: &str, kind: &str) -> usize {
    std::fs::read_to_string(ledger)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["event"] == kind)
        .count()
}

/// Process 1 dispatches and is SIGKILLed; process 2 continues the execution
/// (an idempotent re-send under the same key); while process 2's request is in flight, process
/// 3 opens the ledger. Ownership moved with the continuation: process 3 neither marks the
/// record unknown nor re-sends, it attaches and gets process 2's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continued_execution_belongs_to_its_new_owner_and_a_third_process_attaches() {
    let (dir, ledger) = ledger_dir("continue");
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(3),
        ..ServerOptions::default()
    })
    .await;
    let argv = slow_idempotent_argv(&server.url, &ledger);
    let mut first = replay_guard_command(&argv)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let wait = Duration::from_secs(30);
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, wait).await,
        1
    );
    first.kill().await.unwrap(); // SIGKILL, with the execution `dispatched`
    // Its request still runs on the server; let it finish, so that one run at a time is what
    // the guard answers for.
    assert_eq!(
        server
            .state
            .wait_for_side_effects("slow_deploy", 1, wait)
            .await,
        1
    );

    let second = spawn_replay_guard(&argv);
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 2, wait).await,
        2
    );
    assert_eq!(
        server.state.side_effects("slow_deploy"),
        1,
        "process 2 is in flight"
    );
    let argv3: Vec<&str> = argv.iter().map(String::as_str).collect();
    let third = replay_guard(&argv3).await;
    let second = second.await.unwrap();

    assert_eq!(second.code, 0, "{second:#?}");
    assert!(matches!(third.code, 0 | 3), "{third:#?}");
    assert_eq!(third.execution_id(), second.execution_id());
    if third.code == 0 {
        assert_eq!(
            third.json()["result"],
            second.json()["result"],
            "{third:#?}"
        );
    }
    // Process 3 sent nothing: one run per process that owned an attempt, never two at once.
    assert_eq!(server.state.started("slow_deploy"), 2, "{third:#?}");
    assert_eq!(server.state.side_effects("slow_deploy"), 2);
    let keys = server.state.idempotency_keys("slow_deploy");
    assert_eq!(keys[0], keys[1], "the re-send carried the same key");
    // Only process 1's attempt was ever recorded unknown.
    assert_eq!(events_of_kind(&ledger, "unknown"), 1);
    assert_eq!(events_of_kind(&ledger, "dispatched"), 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// Under load: thirty processes make the same idempotent call at once over
/// one ledger, and the first response is lost. Exactly one of them re-sends it; the others
/// attach. None fails with a refused `dispatched` (which used to surface, exit 2, as "nothing
/// was sent" after a request had been sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_processes_continuing_one_execution_resend_it_once_and_never_fail() {
    let (dir, ledger) = ledger_dir("thirty");
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(1),
        ..ServerOptions::default()
    })
    .await;
    server.state.lose_next_response("slow_deploy");
    let argv = slow_idempotent_argv(&server.url, &ledger);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let runs = concurrently(30, &argv).await;
    for run in &runs {
        assert!(
            !run.stderr.contains("is not allowed there"),
            "a refused transition reached the caller: {run:#?}"
        );
        assert!(matches!(run.code, 0 | 3), "{run:#?}");
    }
    // Dispatches per execution, from the ledger file.
    let mut dispatches = std::collections::BTreeMap::<String, usize>::new();
    for line in std::fs::read_to_string(&ledger).unwrap().lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        if line["event"] == "dispatched" {
            *dispatches
                .entry(line["execution_id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    let ids: std::collections::BTreeSet<String> = runs.iter().map(Run::execution_id).collect();
    assert_eq!(ids, dispatches.keys().cloned().collect(), "{dispatches:?}");
    // The execution whose response was lost was sent twice (the lost attempt, then exactly one
    // re-send under its key); a process that started after its answer was delivered made a
    // deliberate repeat, a new execution sent once.
    let first = &server.state.tool_runs("slow_deploy")[0];
    let first = first.idempotency_key.clone().unwrap();
    assert_eq!(dispatches[&first], 2, "{dispatches:?}");
    assert!(
        dispatches.iter().all(|(id, n)| *id == first || *n == 1),
        "{dispatches:?}"
    );
    let sent: usize = dispatches.values().sum();
    assert_eq!(server.state.tool_call_requests("slow_deploy").len(), sent);
    assert_eq!(server.state.side_effects("slow_deploy"), sent);
    let _ = std::fs::remove_dir_all(dir);
}

/// The long deploy: an irreversible call still running when its link window
/// ends is not started again by a repeat from another process; the repeat attaches and gets
/// the running call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_running_after_its_link_window_is_attached_to_not_started_again() {
    a_repeat_while_the_tool_runs_attaches(
        "long",
        "[tools.slow_deploy]\nclass = \"irreversible\"\nlink_window = \"1s\"\n",
        Duration::from_secs(4),
        Duration::from_millis(1500),
    )
    .await;
}

/// Retention never ends the hold of a call still running: with a 1 s link window, a 2 s
/// retention and a 5 s tool, an identical call at 3 s (past both, while the first process
/// still runs the tool) attaches to the first execution and gets its result. Retention used to
/// count from acceptance, and the second call ran the tool again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_still_running_past_its_retention_is_attached_to_not_started_again() {
    a_repeat_while_the_tool_runs_attaches(
        "retention",
        "[tools.slow_deploy]\nclass = \"irreversible\"\nlink_window = \"1s\"\nretention = \"2s\"\n",
        Duration::from_secs(5),
        Duration::from_secs(3),
    )
    .await;
}

/// The slow tool, running for `tool_run` under `policy`, called by one process and repeated by
/// another `repeat_after` its start: the repeat attaches to the running execution and gets its
/// result, and the tool ran once.
async fn a_repeat_while_the_tool_runs_attaches(
    name: &str,
    policy: &str,
    tool_run: Duration,
    repeat_after: Duration,
) {
    let (dir, ledger) = ledger_dir(name);
    let policy = policy_file(&dir, policy);
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: tool_run,
        ..ServerOptions::default()
    })
    .await;
    let argv = slow_argv(&server.url, &ledger, &["--policy", &policy]);
    let first = spawn_replay_guard(&argv);
    let wait = Duration::from_secs(30);
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, wait).await,
        1
    );
    // Nothing to poll for: the wall clock has to pass the policy's window (or retention) while
    // the tool runs.
    tokio::time::sleep(repeat_after).await;
    assert_eq!(server.state.side_effects("slow_deploy"), 0, "still running");
    let argv2: Vec<&str> = argv.iter().map(String::as_str).collect();
    let second = replay_guard(&argv2).await;
    let first = first.await.unwrap();
    assert_eq!(first.code, 0, "{first:#?}");
    assert_eq!(second.code, 0, "{second:#?}");
    assert_eq!(second.execution_id(), first.execution_id());
    assert_eq!(second.json()["result"], first.json()["result"]);
    assert_eq!(server.state.started("slow_deploy"), 1);
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// While another live process has the call dispatched, `resolve --not-applied` is refused
/// (exit 2), naming that process's guard and saying to wait or stop it; nothing is recorded,
/// and the call's own answer settles it. It used to exit 0, and the repeat ran the tool again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_a_call_a_live_process_still_runs_is_refused_naming_its_owner() {
    let (dir, ledger) = ledger_dir("resolve-running");
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(3),
        ..ServerOptions::default()
    })
    .await;
    let first = spawn_replay_guard(&slow_argv(&server.url, &ledger, &[]));
    let wait = Duration::from_secs(30);
    assert_eq!(
        server.state.wait_for_started("slow_deploy", 1, wait).await,
        1
    );
    let records = ledger_records(&ledger).await;
    let id = records[0]["execution_id"].as_str().unwrap().to_owned();
    let owner = std::fs::read_to_string(&ledger)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["event"] == "accepted")
        .and_then(|l| l["owner"].as_str().map(str::to_owned))
        .expect("the accepted event names its owner");
    let resolve = replay_guard(&[
        "resolve",
        &ledger,
        &id,
        "--not-applied",
        "--note",
        "looks stuck",
        "--operator",
        "bob",
    ])
    .await;
    assert_eq!(resolve.code, 2, "{resolve:#?}");
    assert!(
        resolve.stderr.contains(&owner)
            && resolve.stderr.contains("still running")
            && resolve.stderr.contains("stop that process"),
        "{resolve:#?}"
    );
    let first = first.await.unwrap();
    assert_eq!(first.code, 0, "{first:#?}");
    assert_eq!(first.execution_id(), id);
    assert_eq!(events_of_kind(&ledger, "resolved"), 0);
    let records = ledger_records(&ledger).await;
    assert_eq!(records[0]["state"], "delivered", "{records:#?}");
    assert_eq!(server.state.side_effects("slow_deploy"), 1);
    let _ = std::fs::remove_dir_all(dir);
}

/// `--args` with an integer literal beyond 64 bits is refused before anything is sent (exit 2):
/// parsed into a double it would reach the tool rewritten (`1.8446744073709552e19`), and two
/// such literals that round to one double would be one intent.
#[tokio::test]
async fn args_with_an_integer_beyond_64_bits_are_refused_unsent_not_rewritten() {
    let server = TestServer::start().await;
    let dir = temp_dir("cli-call", "wide-int");
    let ledger = ledger_path(&dir);
    for literal in [
        "18446744073709551617",
        "-9223372036854775809",
        "[18446744073709551616]",
    ] {
        let args = format!(r#"{{"service":"catalog","version":"1","build":{literal}}}"#);
        let run = call_text(&server.url, "deploy_release", &args, &["--ledger", &ledger]).await;
        assert_eq!(run.code, 2, "{literal}: {run:#?}");
        assert!(run.stderr.contains("64 bits"), "{literal}: {run:#?}");
        assert!(
            run.stderr.contains("Nothing was sent"),
            "{literal}: {run:#?}"
        );
    }
    assert_eq!(server.state.side_effects("deploy_release"), 0);
    // An integer that fits is sent exactly as given.
    let run = call_text(
        &server.url,
        "deploy_release",
        r#"{"service":"catalog","version":"1","build":18446744073709551615}"#,
        &["--ledger", &ledger],
    )
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
    let dir = temp_dir("cli-call", "secrets");
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

/// A server that answers the handshake (`server/discover`, then `initialize`) with an event
/// stream and then says nothing: `call` gives up at `--timeout` with exit 2 ("Nothing was
/// sent": the `tools/call` never left), instead of waiting for the handshake forever.
#[tokio::test]
async fn a_handshake_answer_that_never_ends_exits_2_at_the_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut request = vec![0u8; 65536];
                let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut request).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, head.as_bytes()).await;
                // Silent from here on, the connection held open.
                std::future::pending::<()>().await;
                drop(stream);
            });
        }
    });
    let (_dir, ledger) = ledger_dir("silent-handshake");
    let args = deploy_args().to_string();
    let argv = [
        "--json",
        "call",
        "--url",
        &url,
        "--tool",
        "deploy_release",
        "--args",
        &args,
        "--timeout",
        "2s",
        "--ledger",
        &ledger,
    ];

    let (run, _) = replay_guard_within(&argv, Duration::from_secs(60))
        .await
        .expect("call gives up on a handshake that never ends");

    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("Nothing was sent"), "{run:#?}");
    silent.abort();
}

/// A `--header` typed with a space where its colon belongs (`Authorization Bearer tok:…`):
/// the error says so without echoing the text, which is a credential.
#[tokio::test]
async fn a_malformed_header_argument_is_refused_without_echoing_the_credential() {
    for header in [
        "Authorization Bearer sk-S3CRET-7:x",
        "Authorization=Bearer sk-S3CRET-7:x",
    ] {
        let run = call(
            "http://127.0.0.1:9/mcp",
            "deploy_release",
            deploy_args(),
            &["--header", header],
        )
        .await;
        assert_eq!(run.code, 2, "{run:#?}");
        assert!(run.stderr.contains("--header"), "{run:#?}");
        assert!(!run.stderr.contains("S3CRET"), "{run:#?}");
        assert!(!run.stdout.contains("S3CRET"), "{run:#?}");
    }
}

/// `--protocol auto` against a server that answers `server/discover` with -32022 and names the
/// revisions it speaks in `data.supported` (here 2025-06-18 only, and it refuses an
/// `initialize` for any other): the call opens with the newest of them this command speaks and
/// runs once. (Before, it fell back to a 2025-11-25 handshake, which such a server refuses.)
#[tokio::test]
async fn auto_opens_with_a_revision_the_servers_unsupported_answer_names() {
    let server = TestServer::start().await;
    let front = FrontServer::start(
        &server.url,
        FrontOptions {
            only_version: Some("2025-06-18"),
            ..FrontOptions::default()
        },
    )
    .await;
    let run = call(
        &front.url,
        "deploy_release",
        deploy_args(),
        &["--protocol", "auto"],
    )
    .await;
    assert_eq!(run.code, 0, "{run:#?}");
    assert_eq!(run.json()["outcome"], "completed", "{run:#?}");
    assert_eq!(server.state.side_effects("deploy_release"), 1);
    let initializes: Vec<_> = server
        .state
        .all_requests()
        .into_iter()
        .filter(|request| request.jsonrpc_method.as_deref() == Some("initialize"))
        .filter(|request| {
            request
                .headers
                .get("mcp-protocol-version")
                .is_some_and(|v| v == "2025-06-18")
        })
        .collect();
    assert_eq!(initializes.len(), 1, "the handshake asked for 2025-06-18");

    // A server that names no revision this command speaks: a clear error, nothing sent.
    let future = FrontServer::start(
        &server.url,
        FrontOptions {
            only_version: Some("2099-01-01"),
            ..FrontOptions::default()
        },
    )
    .await;
    let before = server.state.all_requests().len();
    let run = call(
        &future.url,
        "deploy_release",
        deploy_args(),
        &["--protocol", "auto"],
    )
    .await;
    assert_eq!(run.code, 2, "{run:#?}");
    assert!(run.stderr.contains("2099-01-01"), "{run:#?}");
    assert_eq!(server.state.all_requests().len(), before);
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}
