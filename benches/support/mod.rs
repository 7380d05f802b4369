//! What the benches share: one execution as the guard writes it (the ledger benches), and the
//! 1 KiB `tools/call` with the in-process service it is sent to ([`tools_call`]).
//!
//! Included by each bench with `mod support;` (criterion benches are separate crates).

#![allow(dead_code)] // each bench uses the part it needs

pub mod tools_call;

use std::time::Duration;

use mcp_replay_guard::{
    IdempotencyKey,
    contract::RetryClass,
    ledger::{Claim, EventKind, Ledger, LedgerEvent, Timestamp},
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

/// The four events after the claim of a call that completes and is delivered.
pub fn lifecycle(id: mcp_replay_guard::ExecutionId) -> [LedgerEvent; 4] {
    let kinds = [
        EventKind::Authorized,
        EventKind::Dispatched {
            attempt: 1,
            idempotency_key: IdempotencyKey::from(id),
            key_from_caller: false,
            jsonrpc_id: Some(7.into()),
            session_id: None,
            client_info: None,
            owner: Some("guard:bench".into()),
        },
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        },
        EventKind::Delivered {
            jsonrpc_id: Some(7.into()),
        },
    ];
    kinds.map(|kind| LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    })
}

/// One execution of the `n`th intent: claim (`accepted`) + `authorized`, `dispatched`,
/// `completed`, `delivered`, each awaited in turn as the guard does.
pub async fn execution<L: Ledger + ?Sized>(ledger: &L, n: u64, retention: Duration) {
    let claimed = ledger.claim(claim(n, retention)).await.unwrap();
    assert!(
        matches!(claimed, mcp_replay_guard::ledger::Claimed::New(_)),
        "every intent of a bench is new"
    );
    for event in lifecycle(claimed.record().execution_id) {
        std::hint::black_box(ledger.append(event).await.unwrap());
    }
}
