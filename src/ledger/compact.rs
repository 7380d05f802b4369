//! The form the memory and file ledgers keep an execution in: what a decision needs, in a few
//! hundred bytes, and every event back exactly as it was appended.

use std::{borrow::Cow, collections::HashSet, sync::Arc};

use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target,
    execution::{ClientInfo, EventKind, ExecutionRecord, LedgerEvent, RetryClass, Timestamp},
    fingerprint::Fingerprint,
    ledger::{
        LedgerError,
        index::{Entry, IntentKey},
        result_reference,
    },
    protocol::RequestId,
};

/// The names an execution is filed under, kept once for every execution that has the same
/// (most calls of one run do): the ledger's interned strings.
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

/// An execution as the memory and file ledgers keep it: the `accepted` event's fields, with
/// shared names, and the later events encoded ([`encode`]). The record is the fold of these
/// through the state machine, rebuilt when asked for: there is one home for what a record says.
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

    fn intent_key(&self) -> IntentKey {
        let names = &self.0.names;
        IntentKey::new(
            names.actor.clone(),
            names.intent_scope.clone(),
            self.0.fingerprint,
        )
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
const REPEATED: u8 = 5;

/// The answers of a repeat, as one byte each (any other is kept as JSON).
const REPEAT_ANSWERS: [&str; 4] = ["attached", "kept_result", "held", "result_not_kept"];

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
        // An agent that keeps asking adds one of these each time: two or three bytes.
        EventKind::Repeated { answer }
            if let Some(code) = REPEAT_ANSWERS.iter().position(|a| a == answer) =>
        {
            put_tag(out, REPEATED);
            out.push(code as u8);
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
        REPEATED => EventKind::Repeated {
            answer: REPEAT_ANSWERS[usize::from(reader.byte())].to_owned(),
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
    use super::*;
    use crate::{
        execution::{
            Claim,
            fixtures::{event_at, event_at as event},
        },
        ledger::index::IndexOf,
    };

    /// The claim of intent `n` (a fingerprint of its own), retained an hour, by `test`.
    fn claim(n: u8, at: u64) -> Claim {
        let mut claim = crate::execution::fixtures::claim(RetryClass::Irreversible, "test");
        claim.fingerprint = format!("hmac-sha256:{}", format!("{n:02x}").repeat(32))
            .parse()
            .unwrap();
        claim.retention = std::time::Duration::from_secs(3600);
        claim.at = Timestamp::from_millis(at);
        claim
    }

    /// The compact form gives back every event as appended, and the record the full form
    /// folds, for every kind of event and the unusual values the encoding has a case for.
    #[test]
    fn the_compact_form_keeps_every_event_and_record_exactly() {
        use crate::ledger::index::Index;
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
                6_100,
                EventKind::Repeated {
                    answer: "held".into(),
                },
            ),
            (
                6_200,
                EventKind::Repeated {
                    answer: "an answer of a later version".into(),
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
                    probe: None,
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
            index.claim(&claim(n, 0), |_| false, || Ok(())).unwrap();
        }
        let mut other = claim(3, 0);
        other.intent_scope = "run:other".into();
        index.claim(&other, |_| false, || Ok(())).unwrap();
        assert_eq!(index.shared().len(), 2);
        assert_eq!(
            index.purge_expired(Timestamp::from_millis(3_600_001), |_| false),
            4
        );
        assert_eq!(index.shared().len(), 0);
    }
}
