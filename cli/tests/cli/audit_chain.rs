//! Tamper evidence end to end: the built `replay-guard audit verify` and `audit head` over a
//! real file ledger compacted twice (two archives and a live file), attacked the ways an
//! operator's shell could: archives swapped or deleted, a checkpoint forged and re-sealed, the
//! tail cut or re-sealed past an anchored head. And the guard's head log, which anchors the
//! chain from outside.

use crate::support;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use mcp_replay_guard::{
    execution::{Claim, EventKind, Timestamp},
    ledger::{
        FileLedger, Ledger,
        chain::{ChainHash, ChainHead, ChainedLine, HEAD_LOG_EVERY, LineBody, parse_line},
    },
};
use support::{
    captured_log, deploy_claim, dispatched_as, event_now, fingerprint_of, head_log_lines,
    log_field, replay_guard_parts as replay_guard, shm_temp_dir,
};

fn claim(n: u32, retention: Duration) -> Claim {
    let mut claim = deploy_claim(fingerprint_of(n), "run:audit", "guard:audit-test");
    claim.link_window = retention;
    claim.retention = retention;
    claim
}

/// One execution run to delivery: 5 lines.
async fn execution(ledger: &FileLedger, n: u32, retention: Duration) {
    let id = ledger
        .claim(claim(n, retention))
        .await
        .unwrap()
        .record()
        .execution_id();
    let event = |kind| event_now(id, kind);
    for kind in [
        EventKind::Authorized,
        dispatched_as(id, 1, Some("guard:audit-test"), Some(1)),
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        },
        EventKind::Delivered {
            jsonrpc_id: Some(1.into()),
        },
    ] {
        ledger.append(event(kind)).await.unwrap();
    }
}

fn later() -> Timestamp {
    Timestamp::from_millis(Timestamp::now().as_millis() + 60_000)
}

/// A ledger compacted twice: `(ledger, older archive, newer archive, the head before the first
/// compaction as `audit head` printed it)`.
struct Compacted {
    dir: PathBuf,
    path: PathBuf,
    first_archive: PathBuf,
    second_archive: PathBuf,
    early_head: String,
}

impl Compacted {
    fn p(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

async fn compacted_twice(name: &str) -> Compacted {
    let dir = shm_temp_dir("audit", name);
    let path = dir.join("ledger.jsonl");
    let ledger = FileLedger::open(&path).unwrap();
    let short = Duration::from_millis(1);
    let long = Duration::from_secs(3600);
    for n in 0..3 {
        execution(&ledger, n, short).await;
    }
    execution(&ledger, 10, long).await;
    let (code, early_head, err) =
        replay_guard(&["audit", "head", "--ledger", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let first_archive = ledger.compact(later()).await.unwrap().archived_to;
    for n in 3..5 {
        execution(&ledger, n, short).await;
    }
    let second_archive = ledger.compact(later()).await.unwrap().archived_to;
    execution(&ledger, 11, long).await;
    drop(ledger);
    assert_ne!(first_archive, second_archive);
    Compacted {
        dir,
        path,
        first_archive,
        second_archive,
        early_head: early_head.trim().to_owned(),
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// Re-seals `lines` from the first one on, as an attacker who can rewrite the file would.
fn reseal(lines: &[String], first_prev: ChainHash) -> Vec<String> {
    let mut prev = first_prev;
    lines
        .iter()
        .map(|text| {
            let line = parse_line(text).unwrap();
            let sealed = ChainedLine::seal(line.seq, prev, line.body);
            prev = sealed.hash;
            sealed.to_json_line()
        })
        .collect()
}

#[tokio::test]
async fn a_compacted_ledger_verifies_through_its_archives_and_its_head_anchors_it() {
    let c = compacted_twice("ok").await;
    let (code, out, err) = replay_guard(&["audit", "verify", "--ledger", c.p()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.starts_with("ok: ") && out.contains("through 2 archive(s) and the live file"),
        "{out}"
    );
    // Every line of the three files, as one chain.
    let total = [&c.first_archive, &c.second_archive, &c.path]
        .iter()
        .map(|p| lines(p).len())
        .sum::<usize>();
    assert!(out.starts_with(&format!("ok: {total} events")), "{out}");

    // `audit head` prints what `verify --expect-head` accepts.
    let (code, head, err) = replay_guard(&["audit", "head", "--ledger", c.p()]);
    assert_eq!(code, 0, "{err}");
    let head = head.trim();
    let parsed: ChainHead = head.parse().unwrap();
    let last = parse_line(lines(&c.path).last().unwrap()).unwrap();
    assert_eq!(parsed, last.head());
    let (code, out, _) =
        replay_guard(&["audit", "verify", "--ledger", c.p(), "--expect-head", head]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!("it holds the anchored head {head}")),
        "{out}"
    );
    // An anchor taken before both compactions is still checked: it is in the first archive.
    let (code, out, _) = replay_guard(&["audit", "verify", c.p(), "--expect-head", &c.early_head]);
    assert_eq!(code, 0, "{out}");
    // The positional path and --json work as before.
    let (code, out, _) = replay_guard(&["--json", "audit", "head", c.p()]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["head"], head);
    assert_eq!(json["seq"], parsed.seq);
    // An archive verifies on its own too, with the archive before it.
    let (code, out, _) = replay_guard(&["audit", "verify", c.second_archive.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("through 1 archive(s)"), "{out}");
    // A malformed anchor is a usage error.
    let (code, _, err) = replay_guard(&["audit", "verify", c.p(), "--expect-head", "12:sha256:00"]);
    assert_eq!(code, 2);
    assert!(err.contains("SEQ:sha256:HEX"), "{err}");
    std::fs::remove_dir_all(&c.dir).unwrap();
}

#[tokio::test]
async fn swapped_archives_are_reported() {
    let c = compacted_twice("swap").await;
    let (first, second) = (
        std::fs::read(&c.first_archive).unwrap(),
        std::fs::read(&c.second_archive).unwrap(),
    );
    std::fs::write(&c.first_archive, &second).unwrap();
    std::fs::write(&c.second_archive, &first).unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 1, "{out}");
    let checkpoint = parse_line(&lines(&c.path)[0]).unwrap();
    assert!(
        out.starts_with(&format!("seq {}: ", checkpoint.seq))
            && out.contains("does not follow its archive")
            && out.contains(c.second_archive.to_str().unwrap()),
        "{out}"
    );
    std::fs::remove_dir_all(&c.dir).unwrap();
}

#[tokio::test]
async fn a_deleted_archive_is_reported() {
    let c = compacted_twice("delete").await;
    let older = std::fs::read(&c.first_archive).unwrap();
    std::fs::remove_file(&c.first_archive).unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 1, "{out}");
    let checkpoint = parse_line(&lines(&c.second_archive)[0]).unwrap();
    assert!(
        out.starts_with(&format!("seq {}: ", checkpoint.seq))
            && out.contains("is missing")
            && out.contains(c.first_archive.to_str().unwrap()),
        "{out}"
    );
    // The newer one, with the older one back.
    std::fs::write(&c.first_archive, older).unwrap();
    std::fs::remove_file(&c.second_archive).unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("is missing") && out.contains(c.second_archive.to_str().unwrap()),
        "{out}"
    );
    // `audit head` refuses to print a head for it.
    let (code, out, err) = replay_guard(&["audit", "head", c.p()]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(err.contains("does not verify"), "{err}");
    std::fs::remove_dir_all(&c.dir).unwrap();
}

#[tokio::test]
async fn a_forged_checkpoint_is_reported() {
    let c = compacted_twice("forge").await;
    let original = lines(&c.path);
    let checkpoint = parse_line(&original[0]).unwrap();
    // Any other `prev`, the whole file re-sealed after it.
    let sevens: ChainHash = format!("sha256:{}", "7".repeat(64)).parse().unwrap();
    for forged_prev in [ChainHash::GENESIS, sevens] {
        write_lines(&c.path, &reseal(&original, forged_prev));
        let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
        assert_eq!(code, 1, "{out}");
        assert!(
            out.starts_with(&format!("seq {}: ", checkpoint.seq))
                && out.contains("does not follow its archive")
                && out.contains(c.second_archive.to_str().unwrap()),
            "{out}"
        );
    }
    // A checkpoint that claims to follow another archive (the older one), re-sealed to match
    // that archive's head: the seq does not follow.
    let older_head = parse_line(lines(&c.first_archive).last().unwrap()).unwrap();
    let mut forged = parse_line(&original[0]).unwrap();
    if let LineBody::Checkpoint { checkpoint } = &mut forged.body {
        checkpoint.compacted_through = older_head.seq;
    }
    let mut rewritten =
        vec![ChainedLine::seal(forged.seq, older_head.hash, forged.body).to_json_line()];
    rewritten.extend(original[1..].iter().cloned());
    let first = parse_line(&rewritten[0]).unwrap().hash;
    let mut rewritten = [vec![rewritten[0].clone()], reseal(&rewritten[1..], first)].concat();
    write_lines(&c.path, &rewritten);
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("checkpoint"), "{out}");
    // An edit of the checkpoint that is not re-sealed is an edit.
    rewritten = original.clone();
    rewritten[0] = rewritten[0].replacen(
        &checkpoint.prev.to_string(),
        &ChainHash::GENESIS.to_string(),
        1,
    );
    write_lines(&c.path, &rewritten);
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with(&format!(
            "seq {}: its content does not match its hash",
            checkpoint.seq
        )),
        "{out}"
    );
    std::fs::remove_dir_all(&c.dir).unwrap();
}

#[tokio::test]
async fn cutting_or_resealing_the_tail_past_an_anchored_head_is_caught() {
    let c = compacted_twice("anchor").await;
    let (code, head, _) = replay_guard(&["audit", "head", "--ledger", c.p()]);
    assert_eq!(code, 0);
    let head = head.trim().to_owned();
    let original = lines(&c.path);

    // The tail cut at a line boundary: the chain alone still verifies (it cannot know).
    write_lines(&c.path, &original[..original.len() - 2]);
    let (code, out, _) = replay_guard(&["audit", "verify", "--ledger", c.p()]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) =
        replay_guard(&["audit", "verify", "--ledger", c.p(), "--expect-head", &head]);
    assert_eq!(code, 1, "{out}");
    let anchor: ChainHead = head.parse().unwrap();
    assert!(
        out.starts_with(&format!(
            "seq {}: the anchored head is not in the ledger",
            anchor.seq
        )) && out.contains(&format!("to {}", anchor.seq - 2))
            && out.contains("truncated"),
        "{out}"
    );
    // Everything cut.
    std::fs::write(&c.path, "").unwrap();
    let (code, out, _) = replay_guard(&["audit", "verify", c.p(), "--expect-head", &head]);
    assert_eq!(code, 1, "{out}");

    // The last line edited and re-sealed: it verifies alone, not against the anchor.
    let mut edited = original.clone();
    let last = edited.len() - 1;
    let prev = parse_line(&edited[last - 1]).unwrap().hash;
    edited[last] = edited[last].replacen("\"delivered\"", "\"needs_review\",\"reason\":\"x\"", 1);
    let mut line: serde_json::Value = serde_json::from_str(&edited[last]).unwrap();
    line.as_object_mut().unwrap().remove("jsonrpc_id");
    let body: LineBody = serde_json::from_value(line).unwrap();
    edited[last] = ChainedLine::seal(anchor.seq, prev, body).to_json_line();
    write_lines(&c.path, &edited);
    let (code, out, _) = replay_guard(&["audit", "verify", c.p()]);
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = replay_guard(&["audit", "verify", c.p(), "--expect-head", &head]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with(&format!("seq {}: it has the hash", anchor.seq))
            && out.contains("re-sealed"),
        "{out}"
    );
    std::fs::remove_dir_all(&c.dir).unwrap();
}

// ---- the head log --------------------------------------------------------------------------

/// The anchors the head log gave for the ledger at `path`, in order.
fn logged_anchors(path: &Path) -> Vec<ChainHead> {
    head_log_lines(&path.display().to_string())
        .iter()
        .map(|l| {
            let anchor = log_field(l, "anchor").unwrap_or_else(|| panic!("{l}"));
            let seq = log_field(l, "seq").unwrap();
            let hash = log_field(l, "hash").unwrap();
            assert_eq!(anchor, format!("{seq}:{hash}"), "{l}");
            anchor.parse().unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_logs_the_head_on_open_and_every_thousand_lines() {
    captured_log();
    let dir = shm_temp_dir("audit", "log");
    let path = dir.join("ledger.jsonl");
    let ledger = FileLedger::open(&path).unwrap();
    // 450 executions × 5 lines, a few at a time (group commits cross the marks mid-batch).
    for chunk in 0..45u32 {
        let runs: Vec<_> = (0..10)
            .map(|i| {
                let ledger = ledger.clone();
                tokio::spawn(async move {
                    execution(&ledger, chunk * 10 + i, Duration::from_secs(60)).await
                })
            })
            .collect();
        for run in runs {
            run.await.unwrap();
        }
    }
    drop(ledger);
    let reopened = FileLedger::open(&path).unwrap();
    let head = parse_line(lines(&path).last().unwrap()).unwrap().head();
    // The reopen logs the head: wait for the writer thread to have started.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while logged_anchors(&path).last() != Some(&head) && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    drop(reopened);
    let anchors = logged_anchors(&path);
    assert_eq!(
        anchors.first(),
        Some(&ChainHead::GENESIS),
        "the first open: {anchors:?}"
    );
    assert_eq!(anchors.last(), Some(&head), "the reopen: {anchors:?}");
    let marks: Vec<u64> = anchors[1..anchors.len() - 1]
        .iter()
        .map(|a| a.seq / HEAD_LOG_EVERY)
        .collect();
    assert_eq!(
        marks,
        [1, 2],
        "one log per {HEAD_LOG_EVERY} lines: {anchors:?}"
    );
    // Each logged head anchors the file: `verify --expect-head` accepts it, and catches a cut
    // past it.
    for anchor in &anchors {
        let (code, out, _) = replay_guard(&[
            "audit",
            "verify",
            path.to_str().unwrap(),
            "--expect-head",
            &anchor.to_string(),
        ]);
        assert_eq!(code, 0, "{anchor}: {out}");
    }
    let all = lines(&path);
    let mark = anchors[2].seq as usize;
    write_lines(&path, &all[..mark - 1]);
    let (code, out, _) = replay_guard(&[
        "audit",
        "verify",
        path.to_str().unwrap(),
        "--expect-head",
        &anchors[2].to_string(),
    ]);
    assert_eq!(code, 1, "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}
