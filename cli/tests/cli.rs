//! The `replay-guard` command, run as the built binary, in one test binary: its subcommands
//! over a real ledger file (here), the audit chain and its anchored head (`audit_chain`),
//! `stdio` in front of a real child server (`cli_stdio`), HTTPS (`cli_tls`), a ledger on a
//! full disk (`disk_full`), the built-in probes of `resolve --probe` (`resolve_probe`) and the
//! review page in a headless browser (`review_page`). `call` (`cli_call`), the proxy (`proxy`),
//! the chaos soak and the file ledger's processes have binaries of their own.

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
#[path = "cli/resolve_probe.rs"]
mod resolve_probe;
#[path = "cli/review_page.rs"]
mod review_page;

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
        out.contains("1. One agent process or two? one (guard:cli-test)")
            && out.contains("3. Did the target answer? unknown (stream cut)"),
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
            && show.contains(
                "3. Did the target answer? unknown (cut\\n3. target: completed\\u{1b}[31m)"
            ),
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

/// An execution of intent `byte` in the ledger at `path`, dispatched and then unknown, that no
/// one asked about again.
async fn unknown_execution(path: &Path, byte: u8) -> ExecutionId {
    let ledger = FileLedger::open(path).unwrap();
    let id = ledger
        .claim(claim(byte))
        .await
        .unwrap()
        .record()
        .execution_id();
    let dispatched = dispatched_as(id, 1, Some("guard:cli-test"), Some(1));
    ledger.append(event_now(id, dispatched)).await.unwrap();
    let unknown = EventKind::Unknown {
        target_status: None,
        attempt: None,
        reason: "the caller went away".into(),
    };
    ledger.append(event_now(id, unknown)).await.unwrap();
    id
}

/// The held queue: `--held` shows `unknown` and `needs_review` together, oldest first (an
/// execution that is unknown and nobody repeated is held too); a state name that is not one is
/// refused with exit 2 and the names; `--tool`, `--actor` and the time window filter;
/// `--watch` prints each execution that becomes held, as it does.
#[tokio::test]
async fn the_held_queue_filters_validates_and_follows() {
    let dir = support::temp_dir("cli", "queue");
    let path = dir.join("ledger.jsonl");
    let (_, needs_review) = ledger(&path).await;
    let p = path.to_str().unwrap();
    let unknown = unknown_execution(&path, 3).await;

    let listed = |args: &[&str]| {
        let mut argv = vec!["--json", "ledger", "list", "--ledger", p];
        argv.extend_from_slice(args);
        let (code, out, err) = replay_guard(&argv);
        assert_eq!(code, 0, "{args:?}: {err}");
        let records: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        records
            .iter()
            .map(|r| r["execution_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    let held = listed(&["--held"]);
    assert_eq!(
        held,
        [needs_review.to_string(), unknown.to_string()],
        "oldest first"
    );
    assert_eq!(listed(&["--state", "unknown"]), [unknown.to_string()]);
    assert_eq!(listed(&["--held", "--tool", "deploy_release"]).len(), 2);
    assert!(listed(&["--held", "--tool", "another_tool"]).is_empty());
    assert!(listed(&["--held", "--actor", "nobody"]).is_empty());
    assert_eq!(listed(&["--held", "--since", "1h"]).len(), 2);
    assert!(listed(&["--held", "--until", "1h"]).is_empty());
    assert!(listed(&["--held", "--since", "2099-01-01T00:00:00Z"]).is_empty());

    // A typo is refused, never read as "nothing is held".
    let (code, _, err) =
        replay_guard(&["ledger", "list", "--ledger", p, "--state", "needs_reveiw"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("needs_review") && err.contains("resolved_applied"),
        "{err}"
    );
    let (code, _, err) = replay_guard(&["ledger", "list", "--ledger", p, "--since", "soon"]);
    assert_eq!(code, 2, "{err}");

    // --watch: the two held now, then one that becomes held while it watches.
    let mut watch = tokio::process::Command::new(env!("CARGO_BIN_EXE_replay-guard"))
        .args([
            "--json", "ledger", "list", "--ledger", p, "--held", "--watch",
        ])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(watch.stdout.take().unwrap()));
    let mut next = async || {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
            .await
            .expect("a line in time")
            .unwrap()
            .expect("the watch goes on");
        let record: serde_json::Value = serde_json::from_str(&line).unwrap();
        record["execution_id"].as_str().unwrap().to_owned()
    };
    assert_eq!(next().await, needs_review.to_string());
    assert_eq!(next().await, unknown.to_string());
    let later = unknown_execution(&path, 4).await;
    assert_eq!(next().await, later.to_string());
    let pid = nix::unistd::Pid::from_raw(watch.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(10), watch.wait())
        .await
        .expect("the watch ends on SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0));

    // Without --operator, the resolution names the user the command runs as.
    let user = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let user = String::from_utf8(user.stdout).unwrap().trim().to_owned();
    let (code, out, err) = replay_guard(&[
        "resolve",
        "--ledger",
        p,
        &later.to_string(),
        "--applied",
        "--note",
        "seen in the release log",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let events = FileLedger::open_read_only(&path)
        .unwrap()
        .events(later)
        .await
        .unwrap();
    let by = events.iter().find_map(|e| match &e.kind {
        EventKind::Resolved { by, .. } => Some(by.clone()),
        _ => None,
    });
    assert_eq!(by, Some(format!("operator:{user}")));
    std::fs::remove_dir_all(dir).unwrap();
}
