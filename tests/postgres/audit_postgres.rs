//! Tamper evidence of the PostgreSQL ledger's chain: every byte of a stored line is covered,
//! a chain that starts at a forged checkpoint is refused (this ledger never compacts), and the
//! ledger logs its head on connect and every `HEAD_LOG_EVERY` lines. Against the server named by
//! `MCP_REPLAY_GUARD_POSTGRES_URL`, each test in a schema of its own.

use crate::support;

use std::time::Duration;

use mcp_replay_guard::{
    ExecutionId,
    execution::{Claim, EventKind},
    ledger::{
        Ledger, PostgresLedger,
        chain::{
            ChainHash, ChainHead, ChainProblem, ChainedLine, Checkpoint, HEAD_LOG_EVERY, LineBody,
            parse_line,
        },
    },
};
use support::{
    TestSchema, captured_log, deploy_claim, event_now, fingerprint_of, head_log_lines, log_field,
};

fn claim(n: u32) -> Claim {
    let mut claim = deploy_claim(fingerprint_of(n), "run:audit", "guard:audit-pg");
    claim.link_window = Duration::from_secs(60);
    claim
}

/// Three executions, claimed and authorised: 6 lines.
async fn six_lines(ledger: &PostgresLedger) -> Vec<ExecutionId> {
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = ledger
            .claim(claim(n))
            .await
            .unwrap()
            .record()
            .execution_id();
        ledger
            .append(event_now(id, EventKind::Authorized))
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

pub(crate) async fn a_stored_line_with_an_extra_field_is_edited() {
    let Some(schema) = TestSchema::new("extra_field") else {
        return;
    };
    let ledger = schema.replica().await;
    let ids = six_lines(&ledger).await;
    let mut lines = schema.lines(&ledger).await;
    assert!(ledger.verify().await.unwrap().is_ok());
    // Columns untouched: only the line gains a field the typed event does not have.
    lines[3] = format!(
        "{},\"approved_by\":\"mallory\"}}",
        lines[3].strip_suffix('}').unwrap()
    );
    schema.replace_chain(&ledger, &lines).await;
    let report = ledger.verify().await.unwrap();
    assert_eq!(
        report.first_bad,
        Some((4, ChainProblem::Edited)),
        "{report}"
    );
    assert_eq!((report.verified, report.head_seq), (3, 3));
    // Reading the execution's events refuses the line too.
    let error = ledger.events(ids[1]).await.unwrap_err().to_string();
    assert!(error.contains("seq 4"), "{error}");
    schema.drop(&ledger).await;
}

pub(crate) async fn a_chain_that_starts_at_a_forged_checkpoint_is_refused() {
    let Some(schema) = TestSchema::new("forged_checkpoint") else {
        return;
    };
    let ledger = schema.replica().await;
    six_lines(&ledger).await;
    let lines = schema.lines(&ledger).await;
    // The first two lines dropped, a checkpoint in their place with any `prev`, and the rest
    // re-sealed after it: every line has its own hash and follows the one before it.
    let checkpoint = ChainedLine::seal(
        3,
        format!("sha256:{}", "5".repeat(64)).parse().unwrap(),
        LineBody::Checkpoint {
            checkpoint: Checkpoint {
                compacted_through: 2,
                removed: 2,
            },
        },
    );
    let mut forged = vec![checkpoint.to_json_line()];
    let mut prev = checkpoint.hash;
    for text in &lines[3..] {
        let line = ChainedLine::seal(
            parse_line(text).unwrap().seq,
            prev,
            parse_line(text).unwrap().body,
        );
        prev = line.hash;
        forged.push(line.to_json_line());
    }
    schema.replace_chain(&ledger, &forged).await;
    let report = ledger.verify().await.unwrap();
    assert_eq!(
        report.first_bad,
        Some((3, ChainProblem::Deleted { missing: 2 })),
        "{report}"
    );
    schema.drop(&ledger).await;
}

fn logged_anchors(ledger: &str) -> Vec<ChainHead> {
    head_log_lines(ledger)
        .iter()
        .map(|l| {
            log_field(l, "anchor")
                .unwrap_or_else(|| panic!("{l}"))
                .parse()
                .unwrap()
        })
        .collect()
}

pub(crate) async fn the_head_is_logged_on_connect_and_every_thousand_lines() {
    captured_log();
    let Some(schema) = TestSchema::new("head_log") else {
        return;
    };
    let label = format!("postgres:{}", schema.name);
    let ledger = schema.replica().await;
    let claims: Vec<_> = (0..1_100)
        .map(|n| {
            let ledger = ledger.clone();
            tokio::spawn(async move { ledger.claim(claim(n)).await.unwrap() })
        })
        .collect();
    for claimed in claims {
        claimed.await.unwrap();
    }
    let head = ledger.verify().await.unwrap().head();
    assert_eq!(head.seq, 1_100);
    let second = schema.replica().await;
    let anchors = logged_anchors(&label);
    assert_eq!(
        anchors.first(),
        Some(&ChainHead::GENESIS),
        "on connect: {anchors:?}"
    );
    assert_eq!(
        anchors.last(),
        Some(&head),
        "on the second connect: {anchors:?}"
    );
    let marks: Vec<u64> = anchors[1..anchors.len() - 1]
        .iter()
        .map(|a| a.seq / HEAD_LOG_EVERY)
        .collect();
    assert_eq!(marks, [1], "{anchors:?}");
    // The logged mark is in the chain as logged.
    let lines = schema.lines(&ledger).await;
    let mark = anchors[1];
    let line = parse_line(&lines[mark.seq as usize - 1]).unwrap();
    assert_eq!(line.head(), mark);
    assert_ne!(mark.hash, ChainHash::GENESIS);
    drop(second);
    schema.drop(&ledger).await;
}
