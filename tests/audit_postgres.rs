//! Tamper evidence of the PostgreSQL ledger's chain: every byte of a stored line is covered,
//! a chain that starts at a forged checkpoint is refused (this ledger never compacts), and the
//! ledger logs its head on connect and every `HEAD_LOG_EVERY` lines. Against the server named by
//! `MCP_REPLAY_GUARD_POSTGRES_URL`, each test in a schema of its own.
#![cfg(feature = "postgres")]

mod support;

use std::{
    io::Write,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use mcp_replay_guard::{
    ExecutionId,
    contract::RetryClass,
    ledger::{
        Claim, EventKind, Ledger, LedgerEvent, PostgresLedger, Timestamp,
        chain::{
            ChainHash, ChainHead, ChainProblem, ChainedLine, Checkpoint, HEAD_LOG_EVERY, LineBody,
            parse_line,
        },
    },
};
use support::{POSTGRES_URL_VAR, postgres_url};

struct TestSchema {
    url: String,
    name: String,
}

impl TestSchema {
    fn new(test: &str) -> Option<Self> {
        let url = postgres_url()?;
        let name = format!(
            "mrg_t_{test}_{}",
            ExecutionId::new().ulid().to_string().to_lowercase()
        );
        Some(Self { url, name })
    }

    async fn replica(&self) -> PostgresLedger {
        PostgresLedger::connect_with_schema(&self.url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("connecting to {POSTGRES_URL_VAR}: {e}"))
    }

    /// The stored lines, in `seq` order.
    async fn lines(&self, ledger: &PostgresLedger) -> Vec<String> {
        let client = ledger.pool().get().await.unwrap();
        let statement = format!("SELECT line FROM \"{}\".mrg_events ORDER BY seq", self.name);
        client
            .query(statement.as_str(), &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// Replaces the whole chain with `lines`, columns and all (as an attacker with write
    /// access to the table would).
    async fn replace_chain(&self, ledger: &PostgresLedger, lines: &[String]) {
        let client = ledger.pool().get().await.unwrap();
        let s = format!("\"{}\"", self.name);
        client
            .execute(format!("DELETE FROM {s}.mrg_events").as_str(), &[])
            .await
            .unwrap();
        for text in lines {
            // The columns from the line as it is (it may not parse as a chain line any more).
            let line: serde_json::Value = serde_json::from_str(text).unwrap();
            let execution_id = line["execution_id"].as_str().map(str::to_owned);
            client
                .execute(
                    format!(
                        "INSERT INTO {s}.mrg_events (seq, prev, hash, execution_id, line) \
                         VALUES ($1, $2, $3, $4, $5)"
                    )
                    .as_str(),
                    &[
                        &line["seq"].as_i64().unwrap(),
                        &line["prev"].as_str().unwrap(),
                        &line["hash"].as_str().unwrap(),
                        &execution_id,
                        text,
                    ],
                )
                .await
                .unwrap();
        }
    }

    async fn drop(self, ledger: &PostgresLedger) {
        let client = ledger.pool().get().await.unwrap();
        client
            .execute(
                format!("DROP SCHEMA \"{}\" CASCADE", self.name).as_str(),
                &[],
            )
            .await
            .unwrap();
    }
}

fn claim(n: u32) -> Claim {
    Claim {
        fingerprint: format!("hmac-sha256:{n:064x}").parse().unwrap(),
        tool: "deploy_release".into(),
        actor: "signed-process:com.example.agent".into(),
        intent_scope: "run:audit".into(),
        target: "deploy-api.internal.example/mcp".into(),
        credential_ref: None,
        retry_class: RetryClass::Irreversible,
        link_window: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        owner: "guard:audit-pg".into(),
        at: Timestamp::now(),
    }
}

/// Three executions, claimed and authorised: 6 lines.
async fn six_lines(ledger: &PostgresLedger) -> Vec<ExecutionId> {
    let mut ids = Vec::new();
    for n in 0..3 {
        let id = ledger.claim(claim(n)).await.unwrap().record().execution_id;
        ledger
            .append(LedgerEvent {
                execution_id: id,
                at: Timestamp::now(),
                kind: EventKind::Authorized,
            })
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn a_stored_line_with_an_extra_field_is_edited() {
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

#[tokio::test]
async fn a_chain_that_starts_at_a_forged_checkpoint_is_refused() {
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

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn captured_log() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .with_writer(move || writer.clone())
                .finish(),
        )
        .unwrap();
        captured
    })
}

fn logged_anchors(ledger: &str) -> Vec<ChainHead> {
    let text = String::from_utf8(captured_log().0.lock().unwrap().clone()).unwrap();
    let field = format!("ledger={ledger}");
    text.lines()
        .filter(|l| l.contains("ledger head") && l.split_whitespace().any(|w| w == field))
        .map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("anchor="))
                .unwrap_or_else(|| panic!("{l}"))
                .parse()
                .unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_is_logged_on_connect_and_every_thousand_lines() {
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
