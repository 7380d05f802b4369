//! `MemoryLedger`: the ledger in this process's memory, with per-contract retention.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    Claim, Claimed, Dispatch, ExecutionRecord, Ledger, LedgerError, LedgerEvent, Timestamp,
    compact::Compact,
    index::{Entry, IndexOf},
    result_reference,
};
use crate::ExecutionId;

/// A ledger in memory: fast, shared by every clone, and gone when the process exits. Records
/// leave it when their contract's retention ends, so memory stays bounded by the number of
/// executions inside their retention.
///
/// # What it costs as it fills
///
/// Expired executions are found in `retain_until` order, so a sweep visits only what expired:
/// with 1,000,000 executions retained the ledger runs at about 0.8× an empty one's rate. Each
/// execution is kept in a compact form (names shared between executions, events encoded in a
/// few bytes), about 300 bytes, and its record is rebuilt through the state machine when asked
/// for.
///
/// # Clone
///
/// Clones share the same ledger.
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    // One lock over the index: every operation is short and never awaits under it, and a
    // claim holds it until the new execution is in place (one winner per intent). Measured
    // against 16 such indexes with claims routed by intent and appends by a map from
    // execution ID to shard (benches/memory_ledger.rs, group `concurrency`, BENCHMARKS.md),
    // on the 2-core CI machine, five runs: with 64 callers the shards won 3 (by 1.07x to
    // 1.8x) and lost 2 (by 1.01x and 1.5x); with 1 caller, where the shards do strictly more
    // work, they still won 3 by up to 10%: the spread is the machine's noise, not a winner.
    // The lock stays until a sharded ledger wins clearly: sharding needs that second
    // map (about 60 more bytes per record), cleaned at every purge, and results found across
    // shards.
    inner: Arc<Mutex<IndexOf<Compact>>>,
}

impl MemoryLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn index(&self) -> MutexGuard<'_, IndexOf<Compact>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Removes every execution whose retention ended before `now`; returns how many. An
    /// execution whose attempt may still run stays (its owner, this process, is alive).
    pub fn purge_expired(&self, now: Timestamp) -> usize {
        self.index().purge_expired(now, OWNER_ALIVE)
    }

    /// Number of executions in the index.
    pub fn len(&self) -> usize {
        self.index().executions.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.index().executions.is_empty()
    }
}

/// Every owner of a memory ledger's executions is a guard in the process that holds it, so
/// alive while it is (as [`Ledger::is_owner_alive`] answers).
const OWNER_ALIVE: fn(&str) -> bool = |_| true;

#[async_trait]
impl Ledger for MemoryLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        let mut index = self.index();
        index.count_claim(claim.at, OWNER_ALIVE);
        // The process that holds this ledger is the owner: nothing to take before creating.
        Ok(index.claim(&claim, OWNER_ALIVE, || Ok(()))?.0)
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        let mut index = self.index();
        index.count_claim(claim.at, OWNER_ALIVE);
        match index.claim(&claim, OWNER_ALIVE, || Ok(()))?.0 {
            Claimed::New(record) => index
                .append(&dispatch.event(&record, &claim.owner, claim.at))
                .map(Claimed::New),
            existing => Ok(existing),
        }
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.index().append(&event)
    }

    async fn complete(
        &self,
        mut event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        let mut index = self.index();
        let reference = result_reference(event.execution_id);
        if result.is_some() {
            event.set_result_reference(reference.clone());
        }
        let record = index.append(&event)?;
        if let Some(result) = result {
            index.results.insert(reference, result);
        }
        Ok(record)
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        let index = self.index();
        let entry = index.executions.get(&execution_id);
        Ok(entry.map(|e| e.record(execution_id).into_owned()))
    }

    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        let index = self.index();
        let entry = index.executions.get(&execution_id);
        Ok(entry.map(|e| e.events(execution_id)).unwrap_or_default())
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        Ok(self.index().records())
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        let mut index = self.index();
        if !index.executions.contains_key(&execution_id) {
            return Err(LedgerError::NotFound(execution_id));
        }
        let reference = result_reference(execution_id);
        index.results.insert(reference.clone(), result);
        Ok(reference)
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        Ok(self.index().results.get(reference).cloned())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::{
        IdempotencyKey,
        execution::{
            EventKind, ExecutionState, RetryClass,
            fixtures::{dispatched, event_at as event},
        },
    };

    fn claim(fingerprint_byte: u8, at: u64) -> Claim {
        Claim {
            fingerprint: format!(
                "hmac-sha256:{}",
                format!("{fingerprint_byte:02x}").repeat(32)
            )
            .parse()
            .unwrap(),
            tool: "deploy_release".into(),
            actor: "signed-process:com.example.agent".into(),
            intent_scope: "run:5f8097".into(),
            target: "deploy-api.internal.example/mcp".into(),
            credential_ref: Some("deploy-service".into()),
            retry_class: RetryClass::Irreversible,
            link_window: Duration::from_secs(60),
            retention: Duration::from_secs(3600),
            owner: "test".into(),
            at: Timestamp::from_millis(at),
            asked_at: None,
            waited: false,
        }
    }

    /// A new execution of `claim(fingerprint_byte, at)`.
    async fn new_id(ledger: &MemoryLedger, fingerprint_byte: u8, at: u64) -> ExecutionId {
        ledger
            .claim(claim(fingerprint_byte, at))
            .await
            .unwrap()
            .record()
            .execution_id
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_claims_of_one_intent_have_exactly_one_winner() {
        let ledger = MemoryLedger::new();
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let ledger = ledger.clone();
                tokio::spawn(async move { ledger.claim(claim(1, 1_000)).await.unwrap() })
            })
            .collect();
        let mut new = 0;
        let mut ids = std::collections::HashSet::new();
        for task in tasks {
            let claimed = task.await.unwrap();
            new += usize::from(matches!(claimed, Claimed::New(_)));
            ids.insert(claimed.record().execution_id);
        }
        assert_eq!((new, ids.len()), (1, 1));
        assert!(matches!(
            ledger.claim(claim(2, 1_000)).await.unwrap(),
            Claimed::New(_)
        ));
    }

    #[tokio::test]
    async fn the_lifecycle_reads_as_the_design_record() {
        let ledger = MemoryLedger::new();
        let Claimed::New(record) = ledger.claim(claim(1, 1_000)).await.unwrap() else {
            panic!()
        };
        let id = record.execution_id;
        ledger
            .append(event(id, 1_001, EventKind::Authorized))
            .await
            .unwrap();
        ledger
            .append(event(
                id,
                1_002,
                EventKind::Dispatched {
                    attempt: 1,
                    idempotency_key: IdempotencyKey::from(id),
                    key_from_caller: false,
                    jsonrpc_id: Some(7.into()),
                    session_id: None,
                    client_info: None,
                    owner: None,
                },
            ))
            .await
            .unwrap();
        let reference = ledger
            .store_result(id, Bytes::from_static(b"{\"content\":[]}"))
            .await
            .unwrap();
        let record = ledger
            .append(event(
                id,
                7_000,
                EventKind::Completed {
                    target_status: 201,
                    is_error: false,
                    result_reference: Some(reference.clone()),
                },
            ))
            .await
            .unwrap();
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["state"], "completed_result_not_delivered");
        assert_eq!(json["execution_id"], json!(id.to_string()));
        assert_eq!(json["target_status"], 201);
        assert_eq!(json["result_reference"], json!(reference));
        assert_eq!(json["dispatched_at"], "1970-01-01T00:00:01.002Z");
        assert_eq!(json["attempts"], 1);
        assert_eq!(
            ledger.load_result(&reference).await.unwrap().unwrap(),
            &b"{\"content\":[]}"[..]
        );
        // Still linkable: a repeat gets this execution back.
        assert!(
            matches!(ledger.claim(claim(1, 2_000)).await.unwrap(), Claimed::Existing(r) if r.execution_id == id)
        );
        let record = ledger
            .append(event(id, 7_001, EventKind::Delivered { jsonrpc_id: None }))
            .await
            .unwrap();
        assert_eq!(serde_json::to_value(&record).unwrap()["state"], "delivered");
        // Delivered: the same intent again is a new execution.
        assert!(
            matches!(ledger.claim(claim(1, 8_000)).await.unwrap(), Claimed::New(r) if r.execution_id != id)
        );
        let names: Vec<_> = ledger
            .events(id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.kind.name())
            .collect();
        assert_eq!(
            names,
            [
                "accepted",
                "authorized",
                "dispatched",
                "completed",
                "delivered"
            ]
        );
    }

    #[tokio::test]
    async fn transitions_the_state_machine_refuses_leave_the_record_untouched() {
        let ledger = MemoryLedger::new();
        let id = new_id(&ledger, 1, 0).await;
        let err = ledger
            .append(event(
                id,
                1,
                EventKind::Completed {
                    target_status: 200,
                    is_error: false,
                    result_reference: None,
                },
            ))
            .await
            .unwrap_err();
        assert!(err.is_invalid_transition(), "{err}");
        assert_eq!(
            ledger.get(id).await.unwrap().unwrap().state,
            ExecutionState::Accepted
        );
        assert_eq!(ledger.events(id).await.unwrap().len(), 1);
        let missing = ExecutionId::new();
        assert!(matches!(
            ledger.append(event(missing, 1, EventKind::Authorized)).await,
            Err(LedgerError::NotFound(m)) if m == missing
        ));
    }

    #[tokio::test]
    async fn settled_links_end_with_the_window_unsettled_ones_with_retention() {
        let ledger = MemoryLedger::new();
        let first = new_id(&ledger, 1, 0).await;
        assert!(matches!(
            ledger.claim(claim(1, 60_000)).await.unwrap(),
            Claimed::Existing(_)
        ));
        // In flight (not settled): it holds its intent past the window, until retention.
        assert!(matches!(
            ledger.claim(claim(1, 60_001)).await.unwrap(),
            Claimed::Existing(r) if r.execution_id == first
        ));
        // Never sent: continued only inside the window.
        let dispatched = dispatched(first, 1, None);
        ledger.append(event(first, 10, dispatched)).await.unwrap();
        let not_sent = EventKind::NotSent {
            reason: "connection refused".into(),
        };
        ledger.append(event(first, 11, not_sent)).await.unwrap();
        let second = ledger.claim(claim(1, 60_001)).await.unwrap();
        assert!(matches!(&second, Claimed::New(r) if r.execution_id != first));
        assert_eq!(ledger.len(), 2);
        // Retention counts from the last event (11 ms).
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(3_600_011)), 0);
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(3_600_012)), 1);
        assert!(ledger.get(first).await.unwrap().is_none());
        // In flight, its owner alive: retention never ends the hold.
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(10_000_000)), 0);
        let second = second.record().execution_id;
        let denied = EventKind::Denied {
            reason: "no".into(),
        };
        ledger.append(event(second, 60_002, denied)).await.unwrap();
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(10_000_000)), 1);
        assert!(ledger.is_empty());
    }

    /// An unknown outcome holds its intent past the link window (a repeat gets the same
    /// execution), and past its retention too while its owner lives (a memory ledger's owner
    /// is its own process): the attempt its caller gave up on may still be running.
    #[tokio::test]
    async fn an_unknown_outcome_holds_its_intent_past_the_window_and_retention_while_its_owner_lives()
     {
        let ledger = MemoryLedger::new();
        let id = new_id(&ledger, 1, 0).await;
        let dispatched = dispatched(id, 1, None);
        ledger.append(event(id, 1, dispatched)).await.unwrap();
        let unknown = EventKind::Unknown {
            target_status: None,
            reason: "reset".into(),
            attempt: None,
        };
        ledger.append(event(id, 2, unknown)).await.unwrap();
        for at in [60_001, 3_600_001, 3_600_002, 3_600_003, 86_400_000] {
            assert!(
                matches!(ledger.claim(claim(1, at)).await.unwrap(), Claimed::Existing(r) if r.execution_id == id),
                "at {at}"
            );
        }
    }
}
