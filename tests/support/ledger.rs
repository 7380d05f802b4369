//! Waiting on a ledger's state in end-to-end tests (the guard records some outcomes from a
//! background task, e.g. after a caller dropped a body), and the records tests build by hand.

use std::time::Duration;

use mcp_replay_guard::{
    execution::{ExecutionRecord, ExecutionState},
    ledger::Ledger,
};

/// The first execution that reaches `state`, polling for up to 5 s.
pub async fn wait_for_state(ledger: &impl Ledger, state: ExecutionState) -> ExecutionRecord {
    for _ in 0..250 {
        let records = ledger.list().await.expect("the ledger lists");
        if let Some(record) = records.into_iter().find(|r| r.state() == state) {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no execution reached {state}: {:#?}", ledger.list().await);
}

/// The ledger's one execution (asserted to be the only one).
pub async fn only_record(ledger: &impl Ledger) -> ExecutionRecord {
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    records.into_iter().next().unwrap()
}

/// The names of an execution's events, oldest first (`accepted`, `dispatched`, …).
pub async fn event_names(ledger: &impl Ledger, id: ExecutionId) -> Vec<&'static str> {
    let events = ledger
        .events(id)
        .await
        .expect("the ledger reads the events");
    events.iter().map(|e| e.kind.name()).collect()
}

// ---- record builders ----------------------------------------------------------------------

use mcp_replay_guard::{
    ExecutionId, IdempotencyKey,
    execution::{Claim, EventKind, LedgerEvent, RetryClass, Timestamp},
    fingerprint::Fingerprint,
};

/// `hmac-sha256:` and `byte` 32 times.
pub fn fingerprint_of_byte(byte: u8) -> Fingerprint {
    format!("hmac-sha256:{}", format!("{byte:02x}").repeat(32))
        .parse()
        .unwrap()
}

/// `hmac-sha256:` and `n` in 64 hex digits.
pub fn fingerprint_of(n: u32) -> Fingerprint {
    format!("hmac-sha256:{n:064x}").parse().unwrap()
}

/// An irreversible `deploy_release` claim by the example agent, made now, with a 600 s link
/// window and an hour's retention (set the rest on the claim it returns).
pub fn deploy_claim(fingerprint: Fingerprint, intent_scope: &str, owner: &str) -> Claim {
    let mut claim = Claim::new(
        fingerprint,
        "deploy_release",
        "signed-process:com.example.agent".into(),
        intent_scope.into(),
        "deploy-api.internal.example/mcp".into(),
        RetryClass::Irreversible,
        owner,
    );
    claim.link_window = Duration::from_secs(600);
    claim.retention = Duration::from_secs(3600);
    claim
}

/// An event of `id`, now.
pub fn event_now(id: ExecutionId, kind: EventKind) -> LedgerEvent {
    LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    }
}

/// Attempt `attempt` of `id` sent under its own key (no JSON-RPC id, no session), by `owner`.
pub fn dispatched(id: ExecutionId, attempt: u32, owner: Option<&str>) -> EventKind {
    dispatched_as(id, attempt, owner, None)
}

/// [`dispatched`] of a request with JSON-RPC id `jsonrpc_id`.
pub fn dispatched_as(
    id: ExecutionId,
    attempt: u32,
    owner: Option<&str>,
    jsonrpc_id: Option<i64>,
) -> EventKind {
    EventKind::Dispatched {
        attempt,
        idempotency_key: IdempotencyKey::from(id),
        key_from_caller: false,
        jsonrpc_id: jsonrpc_id.map(Into::into),
        session_id: None,
        client_info: None,
        owner: owner.map(Into::into),
    }
}
