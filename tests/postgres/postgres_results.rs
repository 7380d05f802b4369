//! In the PostgreSQL ledger: a result kept before its `completed` is recorded
//! survives what removes rows in between (a purge), and loads after the `completed`. PostgreSQL
//! keeps results in `mrg_results`, keyed by the execution and removed only with it (at the end
//! of its retention), so the file ledger's compaction gap has no counterpart here; this test
//! holds that line. Needs `MCP_REPLAY_GUARD_POSTGRES_URL` (reported as ignored without it, failed under CI).

use crate::support;

use bytes::Bytes;
use mcp_replay_guard::{
    execution::{EventKind, Timestamp},
    ledger::Ledger,
};
use support::*;

pub(crate) async fn a_result_stored_before_a_purge_loads_after_its_completion() {
    let Some(schema) = TestSchema::new("results") else {
        return;
    };
    let ledger = schema.replica().await;
    let claim = deploy_claim(fingerprint_of_byte(0x5a), "run:results", "guard:pg-results");
    let id = ledger.claim(claim).await.unwrap().record().execution_id();
    let event = |kind| event_now(id, kind);
    ledger.append(event(EventKind::Authorized)).await.unwrap();
    ledger.append(event(dispatched(id, 1, None))).await.unwrap();
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
    let replica = schema.replica().await;
    assert!(replica.load_result(&reference).await.unwrap().is_some());
    schema.drop(&replica).await;
}

/// `complete` writes the `completed` and its kept result in one transaction: a `completed`
/// the state machine refuses keeps no result either (the trait's default stored the result
/// first and left it behind), and an accepted one names a result that loads.
pub(crate) async fn a_completed_and_its_result_are_one_write_or_neither() {
    let Some(schema) = TestSchema::new("complete") else {
        return;
    };
    let ledger = schema.replica().await;
    let claim = deploy_claim(
        fingerprint_of_byte(0x5b),
        "run:complete",
        "guard:pg-complete",
    );
    let id = ledger.claim(claim).await.unwrap().record().execution_id();
    let event = |kind| event_now(id, kind);
    let completed = || {
        event(EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        })
    };
    let reference = mcp_replay_guard::ledger::result_reference(id);
    // Not dispatched yet: a `completed` is refused, and with it the result.
    let refused = ledger
        .complete(
            completed(),
            Some(Bytes::from_static(br#"{"content":["early"]}"#)),
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(ledger.load_result(&reference).await.unwrap(), None);
    ledger.append(event(dispatched(id, 1, None))).await.unwrap();
    let record = ledger
        .complete(completed(), Some(Bytes::from_static(br#"{"content":[]}"#)))
        .await
        .unwrap();
    assert_eq!(record.result_reference(), Some(reference.as_str()));
    drop(ledger);
    let replica = schema.replica().await;
    assert_eq!(
        replica.load_result(&reference).await.unwrap().as_deref(),
        Some(&br#"{"content":[]}"#[..])
    );
    assert_eq!(
        replica.get(id).await.unwrap().unwrap().result_reference(),
        Some(reference.as_str())
    );
    schema.drop(&replica).await;
}
