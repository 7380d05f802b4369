//! What the ledger benches share: one execution as the guard writes it.
//!
//! Included by each ledger bench with `mod support;` (criterion benches are separate crates).

#![allow(dead_code)] // each bench uses the part it needs

use std::time::Duration;

use mcp_replay_guard::{
    contract::RetryClass,
    ledger::{Claim, Dispatch, EventKind, Ledger, LedgerEvent, Timestamp},
};

/// The claim of the `n`th intent (a fingerprint of its own), kept for `retention` (a record
/// stays at least its link window, so that is capped by `retention` too).
pub fn claim(n: u64, retention: Duration) -> Claim {
    Claim {
        fingerprint: format!("hmac-sha256:{n:064x}").parse().unwrap(),
        tool: "deploy_release".into(),
        actor: "signed-process:com.example.agent".into(),
        intent_scope: "run:bench".into(),
        target: "deploy-api.internal.example/mcp".into(),
        credential_ref: Some("deploy-service".into()),
        retry_class: RetryClass::Irreversible,
        link_window: retention.min(Duration::from_secs(60)),
        retention,
        owner: "guard:bench".into(),
        at: Timestamp::now(),
        asked_at: None,
    }
}

/// One execution of the `n`th intent as the guard writes it with no authorization hook: the
/// claim with its first `dispatched` (one write), `completed` (one write; no result kept, so
/// that the footprint bench counts records alone), `delivered` (written, synced with the next
/// write), each awaited in turn.
pub async fn execution<L: Ledger + ?Sized>(ledger: &L, n: u64, retention: Duration) {
    let dispatch = Dispatch {
        jsonrpc_id: Some(7.into()),
        ..Dispatch::default()
    };
    let claimed = ledger
        .claim_dispatched(claim(n, retention), dispatch)
        .await
        .unwrap();
    assert!(
        matches!(claimed, mcp_replay_guard::ledger::Claimed::New(_)),
        "every intent of a bench is new"
    );
    let id = claimed.record().execution_id;
    let event = |kind| LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    };
    let completed = event(EventKind::Completed {
        target_status: 200,
        is_error: false,
        result_reference: None,
    });
    std::hint::black_box(ledger.complete(completed, None).await.unwrap());
    let delivered = event(EventKind::Delivered {
        jsonrpc_id: Some(7.into()),
    });
    std::hint::black_box(ledger.append_unsynced(delivered).await.unwrap());
}
