//! What the benches share: one execution as the guard writes it (the ledger benches), and the
//! 1 KiB `tools/call` with the in-process service it is sent to ([`tools_call`]).
//!
//! Included by each bench with `mod support;` (criterion benches are separate crates).

#![allow(dead_code)] // each bench uses the part it needs

pub mod tools_call;

use std::time::Duration;

use mcp_replay_guard::{
    ExecutionId,
    execution::{Claim, Dispatch, EventKind, LedgerEvent, RetryClass, Timestamp},
    ledger::Ledger,
};

/// The claim of the `n`th intent (a fingerprint of its own), kept for `retention` (a record
/// stays at least its link window, so that is capped by `retention` too).
pub fn claim(n: u64, retention: Duration) -> Claim {
    let mut claim = Claim::new(
        format!("hmac-sha256:{n:064x}").parse().unwrap(),
        "deploy_release",
        "signed-process:com.example.agent".into(),
        "run:bench".into(),
        "deploy-api.internal.example/mcp".into(),
        RetryClass::Irreversible,
        "guard:bench",
    );
    claim.credential_ref = Some("deploy-service".into());
    claim.link_window = retention.min(Duration::from_secs(60));
    claim.retention = retention;
    claim
}

/// One execution of the `n`th intent as the guard writes it with no authorization hook: the
/// claim with its first `dispatched` (one write), `completed` (one write; no result kept, so
/// that the footprint bench counts records alone), `delivered` (written, synced with the next
/// write), each awaited in turn.
pub async fn execution<L: Ledger + ?Sized>(ledger: &L, n: u64, retention: Duration) {
    let id = claim_dispatched(ledger, n, retention).await;
    std::hint::black_box(ledger.complete(completed(id), None).await.unwrap());
    std::hint::black_box(ledger.append_unsynced(delivered(id)).await.unwrap());
}

/// The first step of [`execution`]: the claim of a new intent with its first `dispatched`.
pub async fn claim_dispatched<L: Ledger + ?Sized>(
    ledger: &L,
    n: u64,
    retention: Duration,
) -> ExecutionId {
    let mut dispatch = Dispatch::default();
    dispatch.jsonrpc_id = Some(7.into());
    let claimed = ledger
        .claim_dispatched(claim(n, retention), dispatch)
        .await
        .unwrap();
    assert!(
        matches!(claimed, mcp_replay_guard::execution::Claimed::New(_)),
        "every intent of a bench is new"
    );
    claimed.record().execution_id()
}

fn event(id: ExecutionId, kind: EventKind) -> LedgerEvent {
    LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    }
}

/// The `completed` of [`execution`] (its result, if any, goes with it to `Ledger::complete`).
pub fn completed(id: ExecutionId) -> LedgerEvent {
    event(
        id,
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        },
    )
}

/// The `delivered` of [`execution`].
pub fn delivered(id: ExecutionId) -> LedgerEvent {
    event(
        id,
        EventKind::Delivered {
            jsonrpc_id: Some(7.into()),
        },
    )
}
