use std::{
    borrow::Cow,
    collections::HashSet,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use async_trait::async_trait;
use bytes::Bytes;

use super::{
    Claim, Claimed, EventKind, ExecutionRecord, Ledger, LedgerError, LedgerEvent, Timestamp,
    index::{Entry, IndexOf},
    result_reference,
};
use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target, contract::RetryClass,
    fingerprint::Fingerprint, ledger::ClientInfo, protocol::RequestId,
};

/// A ledger in memory: fast, shared by every clone, and gone when the process exits. Records
/// leave it when their contract's retention ends, so memory stays bounded by the number of
/// executions inside their retention.
///
/// # What it costs as it fills
///
/// Expired executions are found in `retain_until` order, so a sweep visits only what expired:
/// a ledger that retains many executions is as fast as an empty one. Each execution is kept in
/// a compact form (names shared between executions, events encoded in a few bytes) and its
/// record is rebuilt through the state machine when asked for.
///
/// # Clone
///
/// Clones share the same ledger.
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    // One lock over the index: every operation is short and never awaits under it, and a
    // claim holds it until the new execution is in place (one winner per intent). Measured
    // against an index sharded by intent (benches/memory_ledger.rs, `concurrency` group):
    // at 1 and at 64 concurrent callers the single lock was as fast or faster on the 2-core
    // CI machine (BENCHMARKS.md); sharding would also need a second map from execution ID to
    // shard for every append.
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

    /// Removes every execution whose retention ended before `now`; returns how many.
    pub fn purge_expired(&self, now: Timestamp) -> usize {
        self.index().purge_expired(now)
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

#[async_trait]
impl Ledger for MemoryLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        let mut index = self.index();
        index.count_claim(claim.at);
        // The process that holds this ledger is the owner: nothing to take before creating.
        Ok(index.claim(&claim, || Ok(()))?.0)
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.index().append(&event)
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

/// The names an execution is filed under, kept once for every execution that has the same
/// (most calls of one run do): the memory ledger's interned strings.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct Names {
    tool: Box<str>,
    actor: Actor,
    intent_scope: IntentScope,
    target: Target,
    credential_ref: Option<CredentialRef>,
    /// The owner that accepted the execution.
    owner: Box<str>,
}

/// An execution as the memory ledger keeps it: the `accepted` event's fields, with shared
/// names, and the later events encoded ([`encode`]). The record is the fold of these through
/// the state machine, rebuilt when asked for: there is one home for what a record says.
#[derive(Debug)]
pub(crate) struct Compact(Box<Head>);

#[derive(Debug)]
struct Head {
    fingerprint: Fingerprint,
    names: Arc<Names>,
    retry_class: RetryClass,
    accepted_at: Timestamp,
    link_until: Timestamp,
    retain_until: Timestamp,
    /// The events after `accepted`, oldest first, encoded.
    later: Box<[u8]>,
}

impl Compact {
    fn accepted_event(&self, execution_id: ExecutionId) -> LedgerEvent {
        let head = &self.0;
        let names = &*head.names;
        LedgerEvent {
            execution_id,
            at: head.accepted_at,
            kind: EventKind::Accepted {
                fingerprint: head.fingerprint,
                tool: names.tool.to_string(),
                actor: names.actor.clone(),
                intent_scope: names.intent_scope.clone(),
                target: names.target.clone(),
                credential_ref: names.credential_ref.clone(),
                retry_class: head.retry_class,
                link_until: head.link_until,
                retain_until: head.retain_until,
                owner: names.owner.to_string(),
            },
        }
    }

    /// Every event of execution `id`, oldest first.
    pub(crate) fn events(&self, id: ExecutionId) -> Vec<LedgerEvent> {
        let mut events = vec![self.accepted_event(id)];
        let mut reader = Reader(&self.0.later);
        while !reader.0.is_empty() {
            events.push(decode(&mut reader, id, &self.0));
        }
        events
    }
}

impl Entry for Compact {
    type Shared = HashSet<Arc<Names>>;

    fn accepted(_: &LedgerEvent, record: &ExecutionRecord, names: &mut Self::Shared) -> Self {
        let new = Names {
            tool: record.tool.as_str().into(),
            actor: record.actor.clone(),
            intent_scope: record.intent_scope.clone(),
            target: record.target.clone(),
            credential_ref: record.credential_ref.clone(),
            owner: record.owner.as_str().into(),
        };
        let shared = match names.get(&new) {
            Some(shared) => shared.clone(),
            None => {
                let shared = Arc::new(new);
                names.insert(shared.clone());
                shared
            }
        };
        Self(Box::new(Head {
            fingerprint: record.fingerprint,
            names: shared,
            retry_class: record.retry_class,
            accepted_at: record.accepted_at,
            link_until: record.link_until,
            retain_until: record.retain_until,
            later: Box::new([]),
        }))
    }

    fn record(&self, id: ExecutionId) -> Cow<'_, ExecutionRecord> {
        let mut events = self.events(id).into_iter();
        let accepted = events.next().expect("the accepted event comes first");
        let mut record =
            ExecutionRecord::from_accepted(&accepted).expect("the first event is `accepted`");
        for event in events {
            // Only events the state machine took were kept: they apply again, in order.
            record.apply(&event).expect("a kept event applies again");
        }
        Cow::Owned(record)
    }

    fn apply(&mut self, event: &LedgerEvent) -> Result<(Timestamp, ExecutionRecord), LedgerError> {
        let mut record = self.record(event.execution_id).into_owned();
        let before = record.retain_until;
        record.apply(event)?;
        let mut later = Vec::from(std::mem::take(&mut self.0.later));
        encode(&mut later, event, &self.0);
        self.0.later = later.into_boxed_slice();
        Ok((before, record))
    }

    fn removed(self, names: &mut Self::Shared) {
        // The set and this execution: nobody else has these names.
        if Arc::strong_count(&self.0.names) == 2 {
            names.remove(&*self.0.names);
        }
    }
}

// The encoding of a later event: a tag, the milliseconds since `accepted` (zigzag varint),
// then the fields. The events every execution has (authorized, dispatched, completed,
// delivered) take a few bytes each, with the values they usually hold (the execution's own
// key and result reference, the accepting owner) as one byte; the others, rarer and carrying
// text anyway, are their JSON.
const AUTHORIZED: u8 = 0;
const DISPATCHED: u8 = 1;
const COMPLETED: u8 = 2;
const DELIVERED: u8 = 3;
const JSON: u8 = 4;

fn encode(out: &mut Vec<u8>, event: &LedgerEvent, head: &Head) {
    let id = event.execution_id;
    let since = event
        .at
        .as_millis()
        .wrapping_sub(head.accepted_at.as_millis()) as i64;
    let put_tag = |out: &mut Vec<u8>, tag| {
        out.push(tag);
        put_u64(out, ((since << 1) ^ (since >> 63)) as u64);
    };
    match &event.kind {
        EventKind::Authorized => put_tag(out, AUTHORIZED),
        EventKind::Dispatched {
            attempt,
            idempotency_key,
            key_from_caller,
            jsonrpc_id,
            session_id,
            client_info,
            owner,
        } => {
            put_tag(out, DISPATCHED);
            put_u64(out, u64::from(*attempt));
            out.push(u8::from(*key_from_caller));
            let own_key = *idempotency_key == IdempotencyKey::from(id);
            put_str(out, (!own_key).then_some(idempotency_key.as_str()));
            put_request_id(out, jsonrpc_id.as_ref());
            put_str(out, session_id.as_deref());
            put_str(out, client_info.as_ref().map(|c| c.name.as_str()));
            put_str(out, client_info.as_ref().and_then(|c| c.version.as_deref()));
            match owner {
                None => out.push(0),
                Some(owner) if **owner == *head.names.owner => out.push(1),
                Some(owner) => {
                    out.push(2);
                    put_str(out, Some(owner.as_str()));
                }
            }
        }
        EventKind::Completed {
            target_status,
            is_error,
            result_reference: reference,
        } => {
            put_tag(out, COMPLETED);
            put_u64(out, u64::from(*target_status));
            out.push(u8::from(*is_error));
            match reference {
                None => out.push(0),
                Some(r) if *r == result_reference(id) => out.push(1),
                Some(r) => {
                    out.push(2);
                    put_str(out, Some(r.as_str()));
                }
            }
        }
        EventKind::Delivered { jsonrpc_id } => {
            put_tag(out, DELIVERED);
            put_request_id(out, jsonrpc_id.as_ref());
        }
        other => {
            put_tag(out, JSON);
            let json = serde_json::to_string(other).expect("an event kind is JSON");
            put_str(out, Some(json.as_str()));
        }
    }
}

fn decode(reader: &mut Reader<'_>, id: ExecutionId, head: &Head) -> LedgerEvent {
    let tag = reader.byte();
    let since = reader.u64();
    let since = ((since >> 1) as i64) ^ -((since & 1) as i64);
    let at = Timestamp::from_millis(head.accepted_at.as_millis().wrapping_add(since as u64));
    let kind = match tag {
        AUTHORIZED => EventKind::Authorized,
        DISPATCHED => {
            let attempt = u32::try_from(reader.u64()).expect("an attempt is a u32");
            let key_from_caller = reader.byte() == 1;
            let idempotency_key = match reader.str() {
                None => IdempotencyKey::from(id),
                Some(key) => IdempotencyKey::new(key).expect("a kept key is valid"),
            };
            let jsonrpc_id = reader.request_id();
            let session_id = reader.str().map(str::to_owned);
            let name = reader.str().map(str::to_owned);
            let version = reader.str().map(str::to_owned);
            let client_info = name.map(|name| ClientInfo { name, version });
            let owner = match reader.byte() {
                0 => None,
                1 => Some(head.names.owner.to_string()),
                _ => reader.str().map(str::to_owned),
            };
            EventKind::Dispatched {
                attempt,
                idempotency_key,
                key_from_caller,
                jsonrpc_id,
                session_id,
                client_info,
                owner,
            }
        }
        COMPLETED => EventKind::Completed {
            target_status: u16::try_from(reader.u64()).expect("a status is a u16"),
            is_error: reader.byte() == 1,
            result_reference: match reader.byte() {
                0 => None,
                1 => Some(result_reference(id)),
                _ => reader.str().map(str::to_owned),
            },
        },
        DELIVERED => EventKind::Delivered {
            jsonrpc_id: reader.request_id(),
        },
        _ => serde_json::from_str(reader.str().expect("an encoded event"))
            .expect("a kept event kind reads back"),
    };
    LedgerEvent {
        execution_id: id,
        at,
        kind,
    }
}

fn put_u64(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `None` as 0; a string as its length + 1, then its bytes.
fn put_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        None => put_u64(out, 0),
        Some(text) => {
            put_u64(out, text.len() as u64 + 1);
            out.extend_from_slice(text.as_bytes());
        }
    }
}

/// None, an unsigned or a negative integer, another number as its text, a string.
fn put_request_id(out: &mut Vec<u8>, id: Option<&RequestId>) {
    match id {
        None => out.push(0),
        Some(RequestId::Number(n)) => {
            if let Some(n) = n.as_u64() {
                out.push(1);
                put_u64(out, n);
            } else if let Some(n) = n.as_i64() {
                out.push(2);
                put_u64(out, n.unsigned_abs());
            } else {
                out.push(3);
                put_str(out, Some(&n.to_string()));
            }
        }
        Some(RequestId::String(s)) => {
            out.push(4);
            put_str(out, Some(s.as_str()));
        }
    }
}

/// Reads what the `put_*` functions wrote.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().expect("an encoded event is whole");
        self.0 = rest;
        *first
    }

    fn u64(&mut self) -> u64 {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte();
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                break;
            }
        }
        value
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u64().checked_sub(1)?).expect("a length fits");
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(std::str::from_utf8(text).expect("a kept string is UTF-8"))
    }

    fn request_id(&mut self) -> Option<RequestId> {
        let number = |n: serde_json::Number| Some(RequestId::Number(n));
        match self.byte() {
            0 => None,
            1 => number(self.u64().into()),
            2 => number(
                0i64.checked_sub_unsigned(self.u64())
                    .expect("a negative id fits an i64")
                    .into(),
            ),
            3 => number(
                self.str()
                    .and_then(|n| n.parse().ok())
                    .expect("a kept number reads back"),
            ),
            _ => self.str().map(|s| RequestId::String(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::{
        IdempotencyKey,
        contract::RetryClass,
        ledger::fixtures::{dispatched, event_at, event_at as event},
        ledger::{EventKind, ExecutionState},
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

    /// The compact form gives back every event as appended, and the record the full form
    /// folds, for every kind of event and the unusual values the encoding has a case for.
    #[test]
    fn the_compact_form_keeps_every_event_and_record_exactly() {
        use crate::ledger::{ClientInfo, index::Index};
        let reason = |r: &str| r.to_owned();
        let id = ExecutionId::new();
        let accepted = claim(1, 5_000).accepted_event(id);
        let mut kinds = vec![
            (
                4_000,
                EventKind::KeyBound {
                    request_fingerprint: claim(9, 0).fingerprint,
                },
            ),
            (5_001, EventKind::Authorized),
            (
                5_002,
                EventKind::Dispatched {
                    attempt: 1,
                    idempotency_key: IdempotencyKey::new("caller-key-1").unwrap(),
                    key_from_caller: true,
                    jsonrpc_id: Some(RequestId::String("req-\u{e9}".into())),
                    session_id: Some("session-1".into()),
                    client_info: Some(ClientInfo {
                        name: "agent".into(),
                        version: Some("1.2".into()),
                    }),
                    owner: Some("guard:other".into()),
                },
            ),
            (
                5_003,
                EventKind::EventSeen {
                    last_event_id: "ev-1".into(),
                },
            ),
            (
                5_004,
                EventKind::TaskCreated {
                    task_id: "task-1".into(),
                },
            ),
            (
                5_005,
                EventKind::Unknown {
                    target_status: Some(502),
                    reason: reason("reset"),
                    attempt: Some(1),
                },
            ),
            (
                u64::MAX,
                EventKind::Dispatched {
                    attempt: 2,
                    idempotency_key: IdempotencyKey::from(id),
                    key_from_caller: false,
                    jsonrpc_id: Some(RequestId::from(i64::MIN)),
                    session_id: None,
                    client_info: Some(ClientInfo {
                        name: "agent".into(),
                        version: None,
                    }),
                    owner: Some("test".into()),
                },
            ),
            (
                0,
                EventKind::NotSent {
                    reason: reason("refused"),
                },
            ),
            (
                6_000,
                EventKind::NeedsReview {
                    reason: reason("irreversible"),
                },
            ),
            (
                7_000,
                EventKind::Resolved {
                    applied: true,
                    by: "operator:ana".into(),
                    note: "applied".into(),
                    result_reference: Some("elsewhere".into()),
                    attempt: None,
                },
            ),
            (
                7_001,
                EventKind::Delivered {
                    jsonrpc_id: Some(RequestId::Number(u64::MAX.into())),
                },
            ),
        ];
        let second = ExecutionId::new();
        let second_kinds = vec![
            (
                1,
                EventKind::Dispatched {
                    attempt: 1,
                    idempotency_key: IdempotencyKey::from(second),
                    key_from_caller: false,
                    jsonrpc_id: Some(RequestId::Number(
                        serde_json::Number::from_f64(1.5).unwrap(),
                    )),
                    session_id: None,
                    client_info: None,
                    owner: None,
                },
            ),
            (
                2,
                EventKind::Completed {
                    target_status: 200,
                    is_error: true,
                    result_reference: Some(result_reference(second)),
                },
            ),
            (3, EventKind::Delivered { jsonrpc_id: None }),
        ];
        let mut compact = IndexOf::<Compact>::default();
        let mut full = Index::default();
        let mut all = vec![(id, accepted)];
        all.extend(
            kinds
                .drain(..)
                .map(|(ms, kind)| (id, event_at(id, ms, kind))),
        );
        all.push((second, claim(2, 0).accepted_event(second)));
        all.extend(
            second_kinds
                .into_iter()
                .map(|(ms, kind)| (second, event_at(second, ms, kind))),
        );
        for (_, e) in &all {
            assert_eq!(compact.apply(e).unwrap(), full.apply(e).unwrap(), "{e:?}");
        }
        for id in [id, second] {
            let stored = &full.executions[&id];
            let kept = &compact.executions[&id];
            assert_eq!(kept.events(id), stored.events);
            assert_eq!(*kept.record(id), stored.record);
        }
        assert_eq!(compact.records(), full.records());
        // A refused event leaves the compact form as it was.
        let before = compact.executions[&second].events(second);
        assert!(
            compact
                .apply(&event(second, 9, EventKind::Authorized))
                .is_err()
        );
        assert_eq!(compact.executions[&second].events(second), before);
    }

    /// Executions with the same names share them; the last one to leave takes them along.
    #[test]
    fn names_are_shared_and_released() {
        let mut index = IndexOf::<Compact>::default();
        for n in 0..3 {
            index.claim(&claim(n, 0), || Ok(())).unwrap();
        }
        let mut other = claim(3, 0);
        other.intent_scope = "run:other".into();
        index.claim(&other, || Ok(())).unwrap();
        assert_eq!(index.shared().len(), 2);
        assert_eq!(index.purge_expired(Timestamp::from_millis(3_600_001)), 4);
        assert_eq!(index.shared().len(), 0);
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
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(3_600_001)), 1);
        assert!(ledger.get(first).await.unwrap().is_none());
        assert_eq!(ledger.purge_expired(Timestamp::from_millis(10_000_000)), 1);
        assert!(ledger.is_empty());
    }

    /// Issue 12, item 1, in the memory ledger: an unknown outcome holds its intent past the
    /// link window (a repeat gets the same execution), until its retention ends.
    #[tokio::test]
    async fn an_unknown_outcome_holds_its_intent_past_the_window_until_retention() {
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
        for at in [60_001, 3_599_999, 3_600_000] {
            assert!(
                matches!(ledger.claim(claim(1, at)).await.unwrap(), Claimed::Existing(r) if r.execution_id == id),
                "at {at}"
            );
        }
        assert!(matches!(
            ledger.claim(claim(1, 3_600_001)).await.unwrap(),
            Claimed::New(r) if r.execution_id != id
        ));
    }
}
