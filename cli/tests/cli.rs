//! The `replay-guard` command, run as the built binary, in one test binary: its subcommands
//! over a real ledger file (here), the audit chain and its anchored head (`audit_chain`),
//! `stdio` in front of a real child server (`cli_stdio`), HTTPS (`cli_tls`) and a ledger on a
//! full disk (`disk_full`). `call` (`cli_call`), the proxy (`proxy`), the chaos soak and the
//! file ledger's processes have binaries of their own.

use std::path::Path;

mod support;

#[path = "cli/audit_chain.rs"]
mod audit_chain;
#[path = "cli/cli_stdio.rs"]
mod cli_stdio;
#[path = "cli/cli_tls.rs"]
mod cli_tls;
#[path = "cli/disk_full.rs"]
mod disk_full;

use mcp_replay_guard::{
    ExecutionId,
    execution::{Claim, EventKind, ExecutionState},
    ledger::{FileLedger, Ledger},
};
use support::{
    deploy_claim, dispatched_as, event_now, fingerprint_of_byte,
    replay_guard_parts as replay_guard, repo_root,
};

fn claim(byte: u8) -> Claim {
    deploy_claim(fingerprint_of_byte(byte), "run:cli", "guard:cli-test")
}

/// A ledger with one delivered execution and one held for review.
async fn ledger(path: &Path) -> (ExecutionId, ExecutionId) {
    let ledger = FileLedger::open(path).unwrap();
    let mut ids = Vec::new();
    for byte in [1, 2] {
        let id = ledger
            .claim(claim(byte))
            .await
            .unwrap()
            .record()
            .execution_id();
        let event = |kind| event_now(id, kind);
        ledger.append(event(EventKind::Authorized)).await.unwrap();
        let dispatched = dispatched_as(id, 1, Some("guard:cli-test"), Some(1));
        ledger.append(event(dispatched)).await.unwrap();
        if byte == 1 {
            ledger
                .append(event(EventKind::Completed {
                    target_status: 200,
                    is_error: false,
                    result_reference: None,
                }))
                .await
                .unwrap();
            ledger
                .append(event(EventKind::Delivered {
                    jsonrpc_id: Some(1.into()),
                }))
                .await
                .unwrap();
        } else {
            ledger
                .append(event(EventKind::Unknown {
                    target_status: None,
                    attempt: None,
                    reason: "stream cut".into(),
                }))
                .await
                .unwrap();
            ledger
                .append(event(EventKind::NeedsReview {
                    reason: "irreversible".into(),
                }))
                .await
                .unwrap();
        }
        ids.push(id);
    }
    (ids[0], ids[1])
}

#[tokio::test]
async fn verify_list_show_and_resolve_a_ledger() {
    let dir = support::temp_dir("cli", "ledger");
    let path = dir.join("ledger.jsonl");
    let (delivered, held) = ledger(&path).await;
    let p = path.to_str().unwrap();

    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("ok: 10 events, head sha256:"), "{out}");

    let (code, out, _) = replay_guard(&["ledger", "list", p, "--state", "needs_review"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&held.to_string()) && !out.contains(&delivered.to_string()),
        "{out}"
    );

    let (code, out, _) = replay_guard(&["audit", "show", p, &held.to_string()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("1. agent processes: one (guard:cli-test)")
            && out.contains("3. target: unknown (stream cut)"),
        "{out}"
    );

    let (code, out, _) = replay_guard(&[
        "resolve",
        p,
        &held.to_string(),
        "--not-applied",
        "--note",
        "checked the deploy API",
        "--operator",
        "alice",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("resolved_not_applied"), "{out}");
    let reopened = FileLedger::open(&path).unwrap();
    assert_eq!(
        reopened.get(held).await.unwrap().unwrap().state(),
        ExecutionState::ResolvedNotApplied
    );
    drop(reopened);

    // Settling an execution that is not held is refused, with what to do next.
    let (code, _, err) = replay_guard(&[
        "resolve",
        p,
        &delivered.to_string(),
        "--applied",
        "--note",
        "x",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("audit show"), "{err}");

    // One changed byte: exit 1, naming the seq.
    let text = std::fs::read_to_string(&path).unwrap();
    let tampered = text.replacen("stream cut", "stream cUt", 1);
    assert_ne!(text, tampered);
    std::fs::write(&path, tampered).unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 1);
    assert!(out.starts_with("seq 9: "), "{out}");

    let (code, _, err) = replay_guard(&[
        "audit",
        "verify",
        dir.join("missing.jsonl").to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no ledger at"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `ledger compact` keeps the executions still retained, archives the rest of the file where
/// `audit verify` follows it, and says what it did, as text and as JSON.
#[tokio::test]
async fn ledger_compact_keeps_what_is_retained_and_says_what_it_did() {
    let dir = support::temp_dir("cli", "compact");
    let path = dir.join("ledger.jsonl");
    let (delivered, held) = ledger(&path).await;
    let expired = {
        let ledger = FileLedger::open(&path).unwrap();
        let mut short = claim(3);
        short.retention = std::time::Duration::from_millis(1);
        short.link_window = short.retention;
        let id = ledger.claim(short).await.unwrap().record().execution_id();
        let failed = EventKind::Failed {
            target_status: Some(400),
            reason: "refused".into(),
        };
        let dispatched = dispatched_as(id, 1, Some("guard:cli-test"), Some(1));
        for kind in [EventKind::Authorized, dispatched, failed] {
            ledger.append(event_now(id, kind)).await.unwrap();
        }
        id
    };
    std::thread::sleep(std::time::Duration::from_millis(5));
    let p = path.to_str().unwrap();
    let before = std::fs::metadata(&path).unwrap().len();

    let (code, out, err) = replay_guard(&["--json", "ledger", "compact", "--ledger", p]);
    assert_eq!(code, 0, "{out}{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["kept_executions"], 2, "{report:#}");
    assert_eq!(report["dropped_executions"], 1, "{report:#}");
    assert_eq!(report["bytes_before"], before, "{report:#}");
    let after = report["bytes_after"].as_u64().unwrap();
    assert!(after < before, "{report:#}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), after);
    let archive = report["archived_to"].as_str().unwrap();
    assert_eq!(std::fs::metadata(archive).unwrap().len(), before);

    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = replay_guard(&["ledger", "list", p]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&delivered.to_string()) && out.contains(&held.to_string()));
    assert!(!out.contains(&expired.to_string()), "{out}");

    // The positional form, as text: nothing left to drop.
    let (code, out, err) = replay_guard(&["ledger", "compact", p]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("compacted {p}: kept 2 executions, dropped 0; ")),
        "{out}"
    );
    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 0, "{out}");
    let (code, _, err) = replay_guard(&["ledger", "compact", dir.join("none").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no ledger at"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Recorded text is the caller's, the server's or an operator's: a tool name that holds a
/// newline must not forge a line of `ledger list` or `audit show`, and an escape sequence must
/// not reach the terminal. Both print it escaped.
#[tokio::test]
async fn recorded_text_is_printed_escaped_never_raw() {
    let dir = support::temp_dir("cli", "escaped");
    let path = dir.join("ledger.jsonl");
    let forged = "deploy\n01JFORGED0000000000000000  delivered";
    let red = "\u{1b}[31m";
    let id = {
        let ledger = FileLedger::open(&path).unwrap();
        let mut hostile = claim(9);
        hostile.tool = format!("{forged}{red}");
        hostile.owner = format!("guard:one\nguard:two{red}");
        let id = ledger.claim(hostile).await.unwrap().record().execution_id();
        let event = |kind| event_now(id, kind);
        ledger.append(event(EventKind::Authorized)).await.unwrap();
        ledger
            .append(event(dispatched_as(id, 1, None, Some(1))))
            .await
            .unwrap();
        ledger
            .append(event(EventKind::Unknown {
                target_status: None,
                attempt: None,
                reason: format!("cut\n3. target: completed{red}"),
            }))
            .await
            .unwrap();
        id
    };
    let p = path.to_str().unwrap();
    let (code, list, err) = replay_guard(&["ledger", "list", p]);
    assert_eq!(code, 0, "{err}");
    let (code, show, err) = replay_guard(&["audit", "show", p, &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    for (command, out, lines) in [("ledger list", &list, 1), ("audit show", &show, 6)] {
        assert_eq!(
            out.trim_end().lines().count(),
            lines,
            "{command}: no forged line: {out}"
        );
        assert!(
            !out.chars().any(|c| c.is_control() && c != '\n'),
            "{command}: no control character reaches the terminal: {out:?}"
        );
        assert!(out.contains("\\u{1b}[31m"), "{command}: {out}");
    }
    assert!(list.contains("deploy\\n01JFORGED"), "{list}");
    assert!(
        show.contains("one (guard:one\\nguard:two\\u{1b}[31m)")
            && show.contains("3. target: unknown (cut\\n3. target: completed\\u{1b}[31m)"),
        "{show}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// An operator settled a held call as not applied, then the target's own answer came (a
/// resumed stream, a late reply): the `completed` is recorded after the `resolved`, never lost
/// or rewritten, `ledger list` says completed, and `audit show` names the conflict.
#[tokio::test]
async fn an_answer_after_an_operators_resolution_is_kept_and_the_conflict_is_shown() {
    let dir = support::temp_dir("cli", "conflict");
    let path = dir.join("ledger.jsonl");
    let (_, held) = ledger(&path).await;
    let p = path.to_str().unwrap();
    let (code, out, err) = replay_guard(&[
        "resolve",
        p,
        &held.to_string(),
        "--not-applied",
        "--note",
        "nothing deployed",
        "--operator",
        "bob",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let late = FileLedger::open(&path).unwrap();
    let completed = EventKind::Completed {
        target_status: 200,
        is_error: false,
        result_reference: None,
    };
    let record = late.append(event_now(held, completed)).await.unwrap();
    assert_eq!(record.state(), ExecutionState::Completed);
    drop(late);

    let (code, out, _) = replay_guard(&["audit", "show", p, &held.to_string()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("conflict: settled as not applied by operator:bob")
            && out.contains("then the target answered: completed (HTTP 200)"),
        "{out}"
    );
    let (code, out, _) = replay_guard(&["--json", "audit", "show", p, &held.to_string()]);
    assert_eq!(code, 0, "{out}");
    let timeline: serde_json::Value = serde_json::from_str(&out).unwrap();
    let kinds: Vec<&str> = timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert!(kinds.ends_with(&["resolved", "completed"]), "{kinds:?}");
    let (code, out, _) = replay_guard(&["ledger", "list", p]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with(&held.to_string()) && l.contains("completed")),
        "{out}"
    );
    let (code, out, _) = replay_guard(&["audit", "verify", p]);
    assert_eq!(code, 0, "{out}");
}

/// The guide (docs/contracts.md) carries the shipped policy file verbatim, so the documented
/// example is the one that `call --policy` is tested with.
#[test]
fn the_guide_carries_the_example_policy_verbatim() {
    let root = repo_root().display().to_string();
    let guide = std::fs::read_to_string(format!("{root}/docs/contracts.md")).unwrap();
    let policy = std::fs::read_to_string(format!("{root}/examples/policy.toml")).unwrap();
    assert!(
        guide.contains(&format!("```toml\n{policy}```")),
        "docs/contracts.md's policy example differs from examples/policy.toml"
    );
}

/// `stdio` refuses what it cannot run before it starts anything: exit 2 and a message that
/// says so.
#[test]
fn stdio_refuses_a_bound_too_small_and_a_server_it_cannot_start() {
    for (args, says) in [
        (
            vec!["stdio", "--max-line-bytes", "10", "--", "true"],
            "--max-line-bytes must be at least 1024",
        ),
        (
            vec!["stdio", "--", "/nonexistent/mcp-server"],
            "cannot start the server /nonexistent/mcp-server; nothing was sent",
        ),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "stdout stays clean: {args:?}");
    }
}

/// Every error exit with `--json` prints one JSON object on stdout (outcome `error`, the exit
/// code, the message, whether anything was sent) as well as the text on stderr: a ledger that is
/// not there, and a command line clap refuses. `--help` is no error.
#[test]
fn an_error_exit_with_json_prints_one_json_object() {
    let missing = std::env::temp_dir()
        .join("no-such-dir-replay-guard")
        .join("ledger.jsonl");
    for args in [
        vec!["--json", "ledger", "list", missing.to_str().unwrap()],
        vec!["ledger", "list", "--json", "--no-such-flag"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let error: serde_json::Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout:?}"));
        assert_eq!(error["outcome"], "error", "{error}");
        assert_eq!(error["exit_code"], 2, "{error}");
        assert_eq!(error["sent"], false, "{error}");
        assert!(!error["message"].as_str().unwrap().is_empty(), "{error}");
        assert!(
            !out.stderr.is_empty(),
            "the text goes to stderr too: {out:?}"
        );
    }
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args(["--json", "--help"])
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0), "{help:?}");
}
