//! Issue 12 item 11 in the PostgreSQL ledger: a result kept before its `completed` is recorded
//! survives what removes rows in between (a purge), and loads after the `completed`. PostgreSQL
//! keeps results in `mrg_results`, keyed by the execution and removed only with it (at the end
//! of its retention), so the file ledger's compaction gap has no counterpart here; this test
//! holds that line. Needs `MCP_REPLAY_GUARD_POSTGRES_URL` (skips without it, fails under CI).
#![cfg(feature = "postgres")]

mod support;

use std::time::Duration;

use bytes::Bytes;
use mcp_replay_guard::{
    ExecutionId, IdempotencyKey,
    contract::RetryClass,
    ledger::{Claim, EventKind, Ledger, LedgerEvent, PostgresLedger, Timestamp},
};
use support::*;

#[tokio::test]
async fn a_result_stored_before_a_purge_loads_after_its_completion() {
    let Some(url) = postgres_url() else {
        return;
    };
    let schema = format!(
        "mrg_t_results_{}",
        ExecutionId::new().ulid().to_string().to_lowercase()
    );
    let ledger = PostgresLedger::connect_with_schema(&url, &schema)
        .await
        .unwrap();
    let claim = Claim {
        fingerprint: format!("hmac-sha256:{}", "5a".repeat(32)).parse().unwrap(),
        tool: "deploy_release".into(),
        actor: "signed-process:com.example.agent".into(),
        intent_scope: "run:results".into(),
        target: "deploy-api.internal.example/mcp".into(),
        credential_ref: None,
        retry_class: RetryClass::Irreversible,
        link_window: Duration::from_secs(600),
        retention: Duration::from_secs(3600),
        owner: "guard:pg-results".into(),
        at: Timestamp::now(),
    };
    let id = ledger.claim(claim).await.unwrap().record().execution_id;
    let event = |kind| LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    };
    ledger.append(event(EventKind::Authorized)).await.unwrap();
    ledger
        .append(event(EventKind::Dispatched {
            attempt: 1,
            idempotency_key: IdempotencyKey::from(id),
            key_from_caller: false,
            jsonrpc_id: None,
            session_id: None,
            owner: None,
        }))
        .await
        .unwrap();
    let reference = ledger
        .store_result(id, Bytes::from_static(br#"{"content":[]}"#))
        .await
        .unwrap();
    // Between the two writes: a purge (what the file ledger's compaction is to it).
    ledger.purge_expired(Timestamp::now()).await.unwrap();
    ledger
        .append(event(EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: Some(reference.clone()),
        }))
        .await
        .unwrap();
    drop(ledger);
    let replica = PostgresLedger::connect_with_schema(&url, &schema)
        .await
        .unwrap();
    assert!(replica.load_result(&reference).await.unwrap().is_some());
    let client = replica.pool().get().await.unwrap();
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
