//! The one index every ledger decides claims from: executions by id, the latest execution of
//! each intent, and kept results. The memory and file ledgers keep one for their lifetime;
//! the PostgreSQL ledger fills one, in its write transaction, with the rows a batch touches.
//! Claim-or-link asks [`decide`](crate::decide); the index only stores and finds.

use std::collections::HashMap;

use bytes::Bytes;

use super::{
    Claim, Claimed, ExecutionRecord, LedgerError, LedgerEvent, Timestamp, result_reference,
};
use crate::{Actor, ExecutionId, IntentScope, decide, fingerprint::Fingerprint};

/// The intent an execution belongs to: who acts, in which scope, with which fingerprint. Two
/// calls with the same key are the same intent; the ledgers index executions by it and the
/// guard's single flight lets one call per key run in a process.
///
/// It lives here, beside the index that is keyed by it, because the ledger is what gives an
/// intent its identity; the guard borrows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct IntentKey {
    pub(crate) actor: Actor,
    pub(crate) intent_scope: IntentScope,
    pub(crate) fingerprint: Fingerprint,
}

impl IntentKey {
    /// The key of `(actor, intent scope, fingerprint)`.
    pub(crate) fn new(actor: Actor, intent_scope: IntentScope, fingerprint: Fingerprint) -> Self {
        Self {
            actor,
            intent_scope,
            fingerprint,
        }
    }

    /// The intent a claim is for.
    pub(crate) fn of_claim(claim: &Claim) -> Self {
        Self::new(
            claim.actor.clone(),
            claim.intent_scope.clone(),
            claim.fingerprint,
        )
    }

    /// The intent a record belongs to.
    pub(crate) fn of_record(record: &ExecutionRecord) -> Self {
        Self::new(
            record.actor.clone(),
            record.intent_scope.clone(),
            record.fingerprint,
        )
    }
}

/// An execution in the index: its record and the events it was folded from (a ledger that
/// reads its events elsewhere, as PostgreSQL does, keeps only those of the batch).
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) record: ExecutionRecord,
    pub(crate) events: Vec<LedgerEvent>,
}

/// How many claims pass between two sweeps of expired executions.
const SWEEP_EVERY: u64 = 1024;

/// The index (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub(crate) executions: HashMap<ExecutionId, Stored>,
    /// The latest execution of each intent.
    intents: HashMap<IntentKey, ExecutionId>,
    /// Kept results, by reference.
    pub(crate) results: HashMap<String, Bytes>,
    claims: u64,
}

impl Index {
    /// Puts a record read from storage in the index; `latest` when it is its intent's latest
    /// execution (the one a claim links to).
    #[cfg(feature = "postgres")]
    pub(crate) fn load(&mut self, record: ExecutionRecord, latest: bool) {
        if latest {
            self.intents
                .insert(IntentKey::of_record(&record), record.execution_id);
        }
        self.executions
            .entry(record.execution_id)
            .or_insert(Stored {
                record,
                events: Vec::new(),
            });
    }

    /// Claim-or-link: the linkable execution of the claim's intent
    /// ([`decide::is_linkable`]), or a new one, in state `accepted`. For a new one,
    /// `before_create` runs first (a ledger takes the owner's liveness signal there; if it
    /// fails, nothing is created), and the `accepted` event it returns is the one to store.
    pub(crate) fn claim(
        &mut self,
        claim: &Claim,
        before_create: impl FnOnce() -> Result<(), LedgerError>,
    ) -> Result<(Claimed, Option<LedgerEvent>), LedgerError> {
        let key = IntentKey::of_claim(claim);
        let linked = self
            .intents
            .get(&key)
            .and_then(|id| self.executions.get(id))
            .filter(|stored| {
                decide::is_linkable(&stored.record, claim.at, claim.asked_at.unwrap_or(claim.at))
            });
        if let Some(stored) = linked {
            return Ok((Claimed::Existing(stored.record.clone()), None));
        }
        before_create()?;
        let event = claim.accepted_event(ExecutionId::new());
        let record = self.apply(&event)?;
        Ok((Claimed::New(record), Some(event)))
    }

    /// Counts a claim; every [`SWEEP_EVERY`]th purges what expired at `at` (as
    /// [`purge_expired`](Self::purge_expired)). Returns how many executions left.
    pub(crate) fn count_claim(&mut self, at: Timestamp) -> usize {
        self.claims += 1;
        if self.claims.is_multiple_of(SWEEP_EVERY) {
            self.purge_expired(at)
        } else {
            0
        }
    }

    /// Applies an event: an `accepted` one creates its execution (and makes it its intent's
    /// latest); any other goes through the state machine ([`ExecutionRecord::apply`]), and a
    /// refused one leaves the record untouched.
    pub(crate) fn apply(&mut self, event: &LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        if let Some(record) = ExecutionRecord::from_accepted(event) {
            self.intents
                .insert(IntentKey::of_record(&record), record.execution_id);
            self.executions.insert(
                record.execution_id,
                Stored {
                    record: record.clone(),
                    events: vec![event.clone()],
                },
            );
            return Ok(record);
        }
        self.append(event)
    }

    /// Appends an event to an existing execution through the state machine (an `accepted`
    /// event is refused by it: only a claim creates an execution); a refused one leaves the
    /// record untouched.
    pub(crate) fn append(&mut self, event: &LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        let stored = self
            .executions
            .get_mut(&event.execution_id)
            .ok_or(LedgerError::NotFound(event.execution_id))?;
        stored.record.apply(event)?;
        stored.events.push(event.clone());
        Ok(stored.record.clone())
    }

    /// The record of an execution.
    pub(crate) fn record(&self, id: ExecutionId) -> Option<&ExecutionRecord> {
        self.executions.get(&id).map(|s| &s.record)
    }

    /// Every record, in execution id order.
    pub(crate) fn records(&self) -> Vec<ExecutionRecord> {
        let mut records: Vec<_> = self.executions.values().map(|s| s.record.clone()).collect();
        records.sort_by_key(|r| r.execution_id);
        records
    }

    /// The `unknown` events of every orphaned execution ([`decide::orphan_unknown`]), applied
    /// to the index; the caller stores them.
    pub(crate) fn settle_orphans(
        &mut self,
        owner_alive: impl Fn(&str) -> bool,
        at: Timestamp,
    ) -> Result<Vec<LedgerEvent>, LedgerError> {
        let mut orphans: Vec<LedgerEvent> = self
            .executions
            .values()
            .filter_map(|s| decide::orphan_unknown(&s.record, owner_alive(&s.record.owner), at))
            .collect();
        orphans.sort_by_key(|e| e.execution_id);
        for event in &orphans {
            self.apply(event)?;
        }
        Ok(orphans)
    }

    /// Removes every execution whose retention ended before `now`, with its kept results;
    /// returns how many.
    pub(crate) fn purge_expired(&mut self, now: Timestamp) -> usize {
        let expired: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, s)| s.record.retain_until < now)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(stored) = self.executions.remove(id) {
                // A result is kept under its execution's reference, referenced yet or not.
                self.results.remove(&result_reference(*id));
                if let Some(reference) = &stored.record.result_reference {
                    self.results.remove(reference);
                }
                let key = IntentKey::of_record(&stored.record);
                if self.intents.get(&key) == Some(id) {
                    self.intents.remove(&key);
                }
            }
        }
        expired.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        contract::RetryClass,
        ledger::{
            ExecutionState,
            fixtures::{claim, dispatched, event_at},
        },
    };

    #[test]
    fn a_claim_links_the_latest_linkable_execution_or_creates_one() {
        let mut index = Index::default();
        let c = claim(RetryClass::Idempotent, "o");
        let (first, event) = index.claim(&c, || Ok(())).unwrap();
        assert!(matches!(first, Claimed::New(_)) && event.is_some());
        let id = first.record().execution_id;
        let (again, event) = index.claim(&c, || panic!("no creation")).unwrap();
        assert!(matches!(again, Claimed::Existing(r) if r.execution_id == id) && event.is_none());
        // A failed liveness signal creates nothing.
        index
            .apply(&event_at(id, 1, dispatched(id, 1, None)))
            .unwrap();
        index
            .apply(&event_at(
                id,
                2,
                super::super::EventKind::Failed {
                    target_status: Some(400),
                    reason: "bad".into(),
                },
            ))
            .unwrap();
        let refused = index.claim(&c, || Err(LedgerError::NotFound(id)));
        assert!(refused.is_err());
        assert_eq!(index.executions.len(), 1);
    }

    #[test]
    fn orphans_are_settled_unknown_and_purge_drops_results() {
        let mut index = Index::default();
        let c = claim(RetryClass::Idempotent, "gone");
        let (claimed, _) = index.claim(&c, || Ok(())).unwrap();
        let id = claimed.record().execution_id;
        index
            .apply(&event_at(id, 1, dispatched(id, 1, Some("gone"))))
            .unwrap();
        assert!(
            index
                .settle_orphans(|_| true, Timestamp::from_millis(2))
                .unwrap()
                .is_empty()
        );
        let events = index
            .settle_orphans(|_| false, Timestamp::from_millis(2))
            .unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(index.record(id).unwrap().state, ExecutionState::Unknown);
        index
            .results
            .insert(result_reference(id), Bytes::from_static(b"{}"));
        assert_eq!(index.purge_expired(Timestamp::from_millis(60_001)), 1);
        assert!(index.results.is_empty() && index.intents.is_empty());
    }
}
