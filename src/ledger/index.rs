//! The one index every ledger decides claims from: executions by id, the latest execution of
//! each intent, and kept results. The memory and file ledgers keep one for their lifetime;
//! the PostgreSQL ledger fills one, in its write transaction, with the rows a batch touches.
//! Claim-or-link asks [`decide`](crate::decide); the index only stores and finds.

use std::{
    borrow::Cow,
    collections::{BTreeSet, HashMap},
    hash::{BuildHasher, RandomState},
};

use bytes::Bytes;

use super::{
    Claim, Claimed, ExecutionRecord, LedgerError, LedgerEvent, Timestamp, result_reference,
};
use crate::{Actor, ExecutionId, IntentScope, execution, fingerprint::Fingerprint};

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

/// How an index keeps one execution. The PostgreSQL ledger keeps [`Stored`] (the record and
/// the events of a batch as they are); the memory and file ledgers keep a compact form for
/// their lifetime and materialise records when asked (see `compact.rs`).
pub(crate) trait Entry: Sized {
    /// What every entry of one index shares (the compact form's interned names).
    type Shared: Default + std::fmt::Debug;

    /// The entry an `accepted` event creates, with the record it made.
    fn accepted(event: &LedgerEvent, record: &ExecutionRecord, shared: &mut Self::Shared) -> Self;

    /// The record of execution `id` (this entry's).
    fn record(&self, id: ExecutionId) -> Cow<'_, ExecutionRecord>;

    /// The intent it belongs to.
    fn intent_key(&self) -> IntentKey;

    /// Applies `event` through the state machine ([`ExecutionRecord::apply`]) and keeps it;
    /// returns the record's `retain_until` before and the record after. A refused event
    /// leaves the entry as it was.
    fn apply(&mut self, event: &LedgerEvent) -> Result<(Timestamp, ExecutionRecord), LedgerError>;

    /// Called once the entry left the index.
    fn removed(self, shared: &mut Self::Shared) {
        let _ = shared;
    }
}

/// An execution in the index: its record and the events it was folded from (a ledger that
/// reads its events elsewhere, as PostgreSQL does, keeps only those of the batch).
#[cfg(any(test, feature = "postgres"))]
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) record: ExecutionRecord,
    pub(crate) events: Vec<LedgerEvent>,
}

#[cfg(any(test, feature = "postgres"))]
impl Entry for Stored {
    type Shared = ();

    fn accepted(event: &LedgerEvent, record: &ExecutionRecord, (): &mut ()) -> Self {
        Self {
            record: record.clone(),
            events: vec![event.clone()],
        }
    }

    fn record(&self, _: ExecutionId) -> Cow<'_, ExecutionRecord> {
        Cow::Borrowed(&self.record)
    }

    fn intent_key(&self) -> IntentKey {
        IntentKey::of_record(&self.record)
    }

    fn apply(&mut self, event: &LedgerEvent) -> Result<(Timestamp, ExecutionRecord), LedgerError> {
        let before = self.record.retain_until;
        self.record.apply(event)?;
        self.events.push(event.clone());
        Ok((before, self.record.clone()))
    }
}

/// The latest execution of each intent, found by a keyed 64-bit hash of the intent: a slot
/// A third the size of one keyed by the intent itself (the memory ledger's bytes
/// per record). Two intents whose hashes meet (the hasher's keys are random per index, so
/// only by chance: about one pair in 2^64 / n) are told apart by their executions; the one
/// that finds the slot taken by another intent is kept in `collided`, by the whole intent.
#[derive(Debug, Default)]
struct Intents {
    by_hash: HashMap<u64, ExecutionId>,
    collided: HashMap<IntentKey, ExecutionId>,
    hasher: RandomState,
    /// Every intent hashes alike (for the tests of `collided`).
    #[cfg(test)]
    collide_all: bool,
}

impl Intents {
    fn hash(&self, key: &IntentKey) -> u64 {
        #[cfg(test)]
        if self.collide_all {
            return 0;
        }
        self.hasher.hash_one(key)
    }

    /// The latest execution of `key`'s intent.
    fn get<E: Entry>(
        &self,
        key: &IntentKey,
        executions: &HashMap<ExecutionId, E>,
    ) -> Option<ExecutionId> {
        match self.by_hash.get(&self.hash(key)) {
            Some(id) if executions.get(id).is_some_and(|e| e.intent_key() == *key) => Some(*id),
            _ => self.collided.get(key).copied(),
        }
    }

    /// Makes `id` the latest execution of `key`'s intent.
    fn set<E: Entry>(
        &mut self,
        key: IntentKey,
        id: ExecutionId,
        executions: &HashMap<ExecutionId, E>,
    ) {
        let slot = self.by_hash.entry(self.hash(&key));
        if let std::collections::hash_map::Entry::Occupied(taken) = &slot
            && *taken.get() != id
            && executions
                .get(taken.get())
                .is_some_and(|e| e.intent_key() != key)
        {
            self.collided.insert(key, id);
            return;
        }
        slot.insert_entry(id);
        self.collided.remove(&key);
    }

    /// Forgets `id` as the latest execution of `key`'s intent, if it is.
    fn remove(&mut self, key: &IntentKey, id: ExecutionId) {
        let hash = self.hash(key);
        if self.by_hash.get(&hash) == Some(&id) {
            self.by_hash.remove(&hash);
        } else if self.collided.get(key) == Some(&id) {
            self.collided.remove(key);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_hash.len() + self.collided.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How many claims pass between two sweeps of expired executions. A sweep visits only what
/// expired (executions are ordered by `retain_until`), so this only batches the work.
const SWEEP_EVERY: u64 = 1024;

/// The index of the PostgreSQL ledger's batches.
#[cfg(any(test, feature = "postgres"))]
pub(crate) type Index = IndexOf<Stored>;

/// The index (see the module docs), over entries of kind `E`.
#[derive(Debug)]
pub(crate) struct IndexOf<E: Entry> {
    pub(crate) executions: HashMap<ExecutionId, E>,
    /// The latest execution of each intent.
    intents: Intents,
    /// Every execution by `retain_until`, earliest first: a sweep takes from the front what
    /// expired and never visits the rest.
    expiry: BTreeSet<(Timestamp, ExecutionId)>,
    /// Kept results, by reference.
    pub(crate) results: HashMap<String, Bytes>,
    shared: E::Shared,
    claims: u64,
    /// Entries the sweeps visited (for the tests that prove a sweep visits only what expired).
    #[cfg(test)]
    visited: usize,
}

impl<E: Entry> Default for IndexOf<E> {
    fn default() -> Self {
        Self {
            executions: HashMap::new(),
            intents: Intents::default(),
            expiry: BTreeSet::new(),
            results: HashMap::new(),
            shared: E::Shared::default(),
            claims: 0,
            #[cfg(test)]
            visited: 0,
        }
    }
}

#[cfg(any(test, feature = "postgres"))]
impl Index {
    /// Puts a record read from storage in the index; `latest` when it is its intent's latest
    /// execution (the one a claim links to).
    #[cfg(feature = "postgres")]
    pub(crate) fn load(&mut self, record: ExecutionRecord, latest: bool) {
        if latest {
            let key = IntentKey::of_record(&record);
            self.intents.set(key, record.execution_id, &self.executions);
        }
        if let std::collections::hash_map::Entry::Vacant(vacant) =
            self.executions.entry(record.execution_id)
        {
            self.expiry
                .insert((record.retain_until, record.execution_id));
            vacant.insert(Stored {
                record,
                events: Vec::new(),
            });
        }
    }

    /// The record of an execution (the PostgreSQL ledger's rows are written from it).
    pub(crate) fn record(&self, id: ExecutionId) -> Option<&ExecutionRecord> {
        self.executions.get(&id).map(|s| &s.record)
    }
}

impl<E: Entry> IndexOf<E> {
    /// Whether `id` is its intent's latest execution (the one a claim links to).
    pub(crate) fn is_latest(&self, id: ExecutionId) -> bool {
        self.executions.get(&id).is_some_and(|entry| {
            self.intents.get(&entry.intent_key(), &self.executions) == Some(id)
        })
    }

    /// Claim-or-link: the linkable execution of the claim's intent
    /// ([`execution::is_linkable`], which asks `owner_alive` about an execution past its
    /// `retain_until` that may still run), or a new one, in state `accepted`. For a new one,
    /// `before_create` runs first (a ledger takes the owner's liveness signal there; if it
    /// fails, nothing is created), and the `accepted` event it returns is the one to store.
    pub(crate) fn claim(
        &mut self,
        claim: &Claim,
        owner_alive: impl Fn(&str) -> bool,
        before_create: impl FnOnce() -> Result<(), LedgerError>,
    ) -> Result<(Claimed, Option<LedgerEvent>), LedgerError> {
        let key = IntentKey::of_claim(claim);
        let linked = self
            .intents
            .get(&key, &self.executions)
            .and_then(|id| Some(self.executions.get(&id)?.record(id)))
            .filter(|record| {
                let asked_at = claim.asked_at.unwrap_or(claim.at);
                execution::is_linkable(record, claim.at, asked_at, claim.waited, &owner_alive)
            });
        if let Some(record) = linked {
            return Ok((Claimed::Existing(record.into_owned()), None));
        }
        before_create()?;
        let event = claim.accepted_event(ExecutionId::new());
        let record = self.apply(&event)?;
        Ok((Claimed::New(record), Some(event)))
    }

    /// Counts a claim; every [`SWEEP_EVERY`]th purges what expired at `at` (as
    /// [`purge_expired`](Self::purge_expired)). Returns how many executions left.
    pub(crate) fn count_claim(
        &mut self,
        at: Timestamp,
        owner_alive: impl Fn(&str) -> bool,
    ) -> usize {
        self.claims += 1;
        if self.claims.is_multiple_of(SWEEP_EVERY) {
            self.purge_expired(at, owner_alive)
        } else {
            0
        }
    }

    /// Applies an event: an `accepted` one creates its execution (and makes it its intent's
    /// latest); any other goes through the state machine ([`ExecutionRecord::apply`]), and a
    /// refused one leaves the record untouched.
    pub(crate) fn apply(&mut self, event: &LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        if let Some(record) = ExecutionRecord::from_accepted(event) {
            let id = record.execution_id;
            self.intents
                .set(IntentKey::of_record(&record), id, &self.executions);
            let entry = E::accepted(event, &record, &mut self.shared);
            if let Some(old) = self.executions.insert(id, entry) {
                // The same `accepted` twice (a file read again): the first one's place goes.
                let before = old.record(id).retain_until;
                self.expiry.remove(&(before, id));
                old.removed(&mut self.shared);
            }
            self.expiry.insert((record.retain_until, id));
            return Ok(record);
        }
        self.append(event)
    }

    /// Appends an event to an existing execution through the state machine (an `accepted`
    /// event is refused by it: only a claim creates an execution); a refused one leaves the
    /// record untouched.
    pub(crate) fn append(&mut self, event: &LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        let id = event.execution_id;
        let entry = self
            .executions
            .get_mut(&id)
            .ok_or(LedgerError::NotFound(id))?;
        let (before, record) = entry.apply(event)?;
        self.reschedule(id, before, record.retain_until);
        Ok(record)
    }

    /// What the entries share.
    #[cfg(test)]
    pub(crate) fn shared(&self) -> &E::Shared {
        &self.shared
    }

    /// Keeps the expiry order when an execution's `retain_until` moved.
    fn reschedule(&mut self, id: ExecutionId, before: Timestamp, after: Timestamp) {
        if before != after {
            self.expiry.remove(&(before, id));
            self.expiry.insert((after, id));
        }
    }

    /// Every record, in execution id order.
    pub(crate) fn records(&self) -> Vec<ExecutionRecord> {
        let mut records: Vec<_> = self
            .executions
            .iter()
            .map(|(id, e)| e.record(*id).into_owned())
            .collect();
        records.sort_by_key(|r| r.execution_id);
        records
    }

    /// The `unknown` events of every orphaned execution ([`execution::orphan_unknown`]), applied
    /// to the index; the caller stores them.
    pub(crate) fn settle_orphans(
        &mut self,
        owner_alive: impl Fn(&str) -> bool,
        at: Timestamp,
    ) -> Result<Vec<LedgerEvent>, LedgerError> {
        let mut orphans: Vec<LedgerEvent> = self
            .executions
            .iter()
            .filter_map(|(id, e)| {
                let record = e.record(*id);
                execution::orphan_unknown(&record, owner_alive(&record.owner), at)
            })
            .collect();
        orphans.sort_by_key(|e| e.execution_id);
        for event in &orphans {
            self.apply(event)?;
        }
        Ok(orphans)
    }

    /// Removes every execution whose retention ended before `now` ([`execution::is_retained`],
    /// which asks `owner_alive` about one that may still run), with its kept results; returns
    /// how many. Visits only those past their `retain_until`.
    pub(crate) fn purge_expired(
        &mut self,
        now: Timestamp,
        owner_alive: impl Fn(&str) -> bool,
    ) -> usize {
        let mut purged = 0;
        // Past `retain_until` and still retained (an attempt that may still run): kept in the
        // order, visited again by the next sweep.
        let mut kept = Vec::new();
        while let Some(&(until, id)) = self.expiry.first()
            && until < now
        {
            self.expiry.pop_first();
            #[cfg(test)]
            {
                self.visited += 1;
            }
            let retained = self
                .executions
                .get(&id)
                .is_some_and(|e| execution::is_retained(&e.record(id), now, &owner_alive));
            if retained {
                kept.push((until, id));
                continue;
            }
            let Some(entry) = self.executions.remove(&id) else {
                continue;
            };
            purged += 1;
            // A result is kept under its execution's reference, referenced yet or not.
            self.results.remove(&result_reference(id));
            if !self.results.is_empty()
                && let Some(reference) = entry.record(id).result_reference.clone()
            {
                self.results.remove(&reference);
            }
            self.intents.remove(&entry.intent_key(), id);
            entry.removed(&mut self.shared);
        }
        self.expiry.extend(kept);
        purged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::{
        ExecutionState, RetryClass,
        fixtures::{claim, dispatched, event_at},
    };

    #[test]
    fn a_claim_links_the_latest_linkable_execution_or_creates_one() {
        let mut index = Index::default();
        let c = claim(RetryClass::Idempotent, "o");
        let (first, event) = index.claim(&c, |_| false, || Ok(())).unwrap();
        assert!(matches!(first, Claimed::New(_)) && event.is_some());
        let id = first.record().execution_id;
        let (again, event) = index
            .claim(&c, |_| false, || panic!("no creation"))
            .unwrap();
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
        let refused = index.claim(&c, |_| false, || Err(LedgerError::NotFound(id)));
        assert!(refused.is_err());
        assert_eq!(index.executions.len(), 1);
    }

    /// A claim of the `n`th intent, kept for `retention_s` seconds (the link window is capped
    /// by it), at `at` ms.
    fn claim_n(n: u64, retention_s: u64, at: u64) -> Claim {
        let mut c = claim(RetryClass::Idempotent, "o");
        c.fingerprint = format!("hmac-sha256:{n:064x}").parse().unwrap();
        c.retention = std::time::Duration::from_secs(retention_s);
        c.link_window = c.link_window.min(c.retention);
        c.at = Timestamp::from_millis(at);
        c
    }

    /// A sweep visits the executions that expired, not every retained one (the old
    /// sweep scanned them all: with 1,000,000 retained, 6,682 executions/s instead of 125,000).
    fn a_sweep_visits_only_what_expired<E: Entry>() {
        let mut index = IndexOf::<E>::default();
        for n in 0..1_000 {
            index
                .claim(&claim_n(n, 3_600, 0), |_| false, || Ok(()))
                .unwrap();
        }
        let short: Vec<_> = (1_000..1_010)
            .map(|n| {
                let (claimed, _) = index
                    .claim(&claim_n(n, 1, 0), |_| false, || Ok(()))
                    .unwrap();
                claimed.record().execution_id
            })
            .collect();
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(1_000), |_| false),
            0
        );
        assert_eq!(index.visited, 0);
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(1_001), |_| false),
            10
        );
        assert_eq!(index.visited, 10, "only the ten that expired");
        assert!(short.iter().all(|id| !index.executions.contains_key(id)));
        assert_eq!(
            (index.executions.len(), index.intents.len()),
            (1_000, 1_000)
        );
        assert_eq!(index.expiry.len(), 1_000);
        // Every claim counts; the sweep it triggers visits nothing that is retained.
        for n in 2_000..2_000 + SWEEP_EVERY {
            index.count_claim(Timestamp::from_millis(2_000), |_| false);
            index
                .claim(&claim_n(n, 3_600, 2_000), |_| false, || Ok(()))
                .unwrap();
        }
        assert_eq!(index.visited, 10);
    }

    /// Intents whose hashes meet each link their own execution, before and after one of
    /// them leaves.
    fn intents_whose_hashes_meet_are_told_apart<E: Entry>() {
        let mut index = IndexOf::<E>::default();
        index.intents.collide_all = true;
        let claim_of = |index: &mut IndexOf<E>, n, retention, at| {
            let (claimed, _) = index
                .claim(&claim_n(n, retention, at), |_| false, || Ok(()))
                .unwrap();
            (
                matches!(claimed, Claimed::New(_)),
                claimed.record().execution_id,
            )
        };
        let (_, short) = claim_of(&mut index, 0, 1, 0);
        let ids: Vec<_> = (1..3).map(|n| claim_of(&mut index, n, 60, 0).1).collect();
        assert_eq!(claim_of(&mut index, 0, 1, 1), (false, short));
        for (n, id) in (1..3).zip(&ids) {
            assert_eq!(claim_of(&mut index, n, 60, 1), (false, *id));
        }
        assert_eq!(index.intents.collided.len(), 2);
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(1_001), |_| false),
            1
        );
        for (n, id) in (1..3).zip(&ids) {
            assert_eq!(claim_of(&mut index, n, 60, 1_002), (false, *id));
        }
        let (new, again) = claim_of(&mut index, 0, 600, 1_002);
        assert!(new && again != short);
        assert_eq!(claim_of(&mut index, 0, 600, 1_003), (false, again));
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_001), |_| false),
            2
        );
        assert_eq!(claim_of(&mut index, 0, 600, 60_002), (false, again));
        assert_eq!(index.intents.len(), 1);
    }

    #[test]
    fn intents_whose_hashes_meet_are_told_apart_in_every_kind_of_index() {
        intents_whose_hashes_meet_are_told_apart::<Stored>();
        intents_whose_hashes_meet_are_told_apart::<super::super::compact::Compact>();
    }

    #[test]
    fn a_sweep_visits_only_what_expired_in_every_kind_of_index() {
        a_sweep_visits_only_what_expired::<Stored>();
        a_sweep_visits_only_what_expired::<super::super::compact::Compact>();
    }

    /// An execution leaves at its `retain_until` (not at it: after it), with its intent and
    /// kept results; one whose `retain_until` moved later stays until the later time.
    #[test]
    fn an_execution_leaves_when_its_retention_passes_and_not_before() {
        let mut index = Index::default();
        let (first, _) = index
            .claim(&claim_n(1, 60, 0), |_| false, || Ok(()))
            .unwrap();
        let first = first.record().execution_id;
        let (moved, _) = index
            .claim(&claim_n(2, 60, 0), |_| false, || Ok(()))
            .unwrap();
        let moved = moved.record().execution_id;
        index
            .results
            .insert(result_reference(first), Bytes::from_static(b"{}"));
        // Every event moves `retain_until` to its retention past the event; the order follows.
        index
            .executions
            .get_mut(&moved)
            .unwrap()
            .record
            .retain_until = Timestamp::from_millis(120_000);
        index.reschedule(
            moved,
            Timestamp::from_millis(60_000),
            Timestamp::from_millis(120_000),
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_000), |_| false),
            0
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_001), |_| false),
            1
        );
        assert!(index.record(first).is_none() && index.results.is_empty());
        assert!(
            index.record(moved).is_some(),
            "moved later: not purged early"
        );
        assert_eq!(index.intents.len(), 1);
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(120_000), |_| false),
            0
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(120_001), |_| false),
            1
        );
        assert!(index.executions.is_empty() && index.intents.is_empty());
        assert!(index.expiry.is_empty());
        // A later execution of the same intent keeps the intent when the older one leaves.
        let (old, _) = index
            .claim(&claim_n(3, 60, 0), |_| false, || Ok(()))
            .unwrap();
        let old = old.record().execution_id;
        index
            .apply(&event_at(old, 1, dispatched(old, 1, None)))
            .unwrap();
        let failed = super::super::EventKind::Failed {
            target_status: Some(400),
            reason: "bad".into(),
        };
        index.apply(&event_at(old, 2, failed)).unwrap();
        let (new, _) = index
            .claim(&claim_n(3, 600, 30_000), |_| false, || Ok(()))
            .unwrap();
        let new = new.record().execution_id;
        assert_ne!(old, new);
        // Its retention counts from its last event (2 ms).
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_002), |_| false),
            0
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_003), |_| false),
            1
        );
        let (again, _) = index
            .claim(&claim_n(3, 600, 60_004), |_| false, || panic!("linked"))
            .unwrap();
        assert_eq!(again.record().execution_id, new);
    }

    /// A sweep never removes an execution whose attempt may still run: in flight with its
    /// owner alive, or dispatched by an owner that is gone (until its `unknown` is recorded,
    /// whose own retention then counts). It stays in the order and is asked again next time.
    #[test]
    fn a_sweep_keeps_what_may_still_run_past_its_retention() {
        let mut index = Index::default();
        let (accepted, _) = index
            .claim(&claim_n(1, 60, 0), |_| false, || Ok(()))
            .unwrap();
        let accepted = accepted.record().execution_id;
        let (sent, _) = index
            .claim(&claim_n(2, 60, 0), |_| false, || Ok(()))
            .unwrap();
        let sent = sent.record().execution_id;
        index
            .apply(&event_at(sent, 0, dispatched(sent, 1, Some("gone"))))
            .unwrap();
        let day = Timestamp::from_millis(86_400_000);
        assert_eq!(index.purge_expired(day, |_| true), 0);
        assert_eq!(index.expiry.len(), 2, "both stay in the order");
        // A repeat a day later still links to the one in flight.
        let (linked, _) = index
            .claim(&claim_n(1, 60, 86_400_000), |_| true, || panic!("linked"))
            .unwrap();
        assert_eq!(linked.record().execution_id, accepted);
        // Its owner gone, the accepted one leaves; the dispatched one waits for its `unknown`.
        assert_eq!(index.purge_expired(day, |_| false), 1);
        assert!(index.record(accepted).is_none());
        let orphan = index.settle_orphans(|_| false, day).unwrap();
        assert_eq!(orphan.len(), 1);
        let record = index.record(sent).unwrap();
        assert_eq!(record.state, ExecutionState::Unknown);
        assert_eq!(record.retain_until, Timestamp::from_millis(86_460_000));
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(86_460_000), |_| false),
            0
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(86_460_001), |_| false),
            1
        );
    }

    #[test]
    fn orphans_are_settled_unknown_and_purge_drops_results() {
        let mut index = Index::default();
        let c = claim(RetryClass::Idempotent, "gone");
        let (claimed, _) = index.claim(&c, |_| false, || Ok(())).unwrap();
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
        // Its retention counts from its `unknown` (2 ms).
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_002), |_| false),
            0
        );
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(60_003), |_| false),
            1
        );
        assert!(index.results.is_empty() && index.intents.is_empty());
    }
}
