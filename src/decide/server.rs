//! What a `tools/call` with an `Idempotency-Key` gets in the server half, decided from the
//! key's ledger record alone (the server half's table in docs/channels.md).

use crate::{
    execution::{Claimed, ExecutionRecord, ExecutionState},
    fingerprint::Fingerprint,
};

/// The answer to a keyed call.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KeyDecision {
    /// Run the call under this execution: a new key, or a first request whose owner died before
    /// it dispatched (provably not run). `bind` says whether the call's fingerprint must still
    /// be bound to the key.
    Run { record: ExecutionRecord, bind: bool },
    /// The first request completed: answer with its kept result, re-keyed.
    Replay {
        record: ExecutionRecord,
        reference: String,
    },
    /// The key was first used for another call (HTTP 422).
    KeyReused { record: ExecutionRecord },
    /// The first request is still running (HTTP 409, or wait for it).
    InFlight { record: ExecutionRecord },
    /// The first request may have run but its answer is not kept (its response was never
    /// observed, or was too large to keep): it is not run again under this key.
    NotReplayable { record: ExecutionRecord },
}

/// Decides from a claim on the key. `owner_alive` says whether the process that claimed an
/// existing record is still running.
pub(crate) fn decide(claimed: Claimed, call: Fingerprint, owner_alive: bool) -> KeyDecision {
    let record = match claimed {
        Claimed::New(record) => return KeyDecision::Run { record, bind: true },
        Claimed::Existing(record) => record,
    };
    match record.request_fingerprint {
        Some(bound) if bound != call => return KeyDecision::KeyReused { record },
        // Not bound yet: its claimer is between the claim and the binding.
        None if record.state == ExecutionState::Accepted && owner_alive => {
            return KeyDecision::InFlight { record };
        }
        _ => {}
    }
    match record.state {
        // Nothing was dispatched and nobody will: the repeat takes the execution over.
        ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::NotSent
            if !owner_alive || record.state == ExecutionState::NotSent =>
        {
            let bind = record.request_fingerprint.is_none();
            KeyDecision::Run { record, bind }
        }
        ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched
            if owner_alive =>
        {
            KeyDecision::InFlight { record }
        }
        ExecutionState::Completed | ExecutionState::ResolvedApplied => {
            match record.result_reference.clone() {
                Some(reference) => KeyDecision::Replay { record, reference },
                None => KeyDecision::NotReplayable { record },
            }
        }
        // Dispatched by a process that is gone, unknown, under review; failed and settled-as-not-
        // applied records are not linkable, so a claim never returns them.
        _ => KeyDecision::NotReplayable { record },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        ExecutionId, IdempotencyKey,
        execution::{Claim, EventKind, LedgerEvent, RetryClass, Timestamp},
    };

    fn fp(byte: u8) -> Fingerprint {
        format!("hmac-sha256:{}", hex::encode([byte; 32]))
            .parse()
            .unwrap()
    }

    fn record(events: &[EventKind]) -> ExecutionRecord {
        let claim = Claim {
            fingerprint: fp(0),
            tool: "deploy_release".into(),
            actor: "anonymous".into(),
            intent_scope: "idempotency-key:k".into(),
            target: "/mcp".into(),
            credential_ref: None,
            retry_class: RetryClass::Idempotent,
            link_window: Duration::from_secs(60),
            retention: Duration::from_secs(60),
            owner: "server:a".into(),
            at: Timestamp::from_millis(0),
            asked_at: None,
            waited: false,
        };
        let id = ExecutionId::new();
        let mut r = ExecutionRecord::from_accepted(&claim.accepted_event(id)).unwrap();
        for kind in events {
            r.apply(&LedgerEvent {
                execution_id: id,
                at: Timestamp::from_millis(1),
                kind: kind.clone(),
            })
            .unwrap();
        }
        r
    }

    fn bound() -> EventKind {
        EventKind::KeyBound {
            request_fingerprint: fp(1),
        }
    }

    fn dispatched() -> EventKind {
        EventKind::Dispatched {
            attempt: 1,
            idempotency_key: IdempotencyKey::new("k").unwrap(),
            key_from_caller: true,
            jsonrpc_id: None,
            session_id: None,
            client_info: None,
            owner: None,
        }
    }

    fn completed(kept: bool) -> EventKind {
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: kept.then(|| "result_x".to_owned()),
        }
    }

    fn existing(events: &[EventKind], call: u8, alive: bool) -> KeyDecision {
        decide(Claimed::Existing(record(events)), fp(call), alive)
    }

    #[test]
    fn a_new_key_runs_and_binds() {
        let d = decide(Claimed::New(record(&[])), fp(1), true);
        assert!(matches!(d, KeyDecision::Run { bind: true, .. }));
    }

    #[test]
    fn the_same_call_after_completion_replays_and_another_call_is_refused() {
        let done = [bound(), dispatched(), completed(true)];
        assert!(matches!(
            existing(&done, 1, true),
            KeyDecision::Replay { reference, .. } if reference == "result_x"
        ));
        assert!(matches!(
            existing(&done, 2, true),
            KeyDecision::KeyReused { .. }
        ));
        // A different call is refused in every state, also while the first runs.
        for events in [&[bound()][..], &[bound(), dispatched()]] {
            assert!(matches!(
                existing(events, 2, true),
                KeyDecision::KeyReused { .. }
            ));
        }
    }

    #[test]
    fn a_running_first_request_is_in_flight_while_its_owner_lives() {
        for events in [&[][..], &[bound()], &[bound(), dispatched()]] {
            assert!(matches!(
                existing(events, 1, true),
                KeyDecision::InFlight { .. }
            ));
        }
    }

    #[test]
    fn a_dead_owner_before_dispatch_is_taken_over_and_after_dispatch_is_not_rerun() {
        assert!(matches!(
            existing(&[], 1, false),
            KeyDecision::Run { bind: true, .. }
        ));
        assert!(matches!(
            existing(&[bound()], 1, false),
            KeyDecision::Run { bind: false, .. }
        ));
        assert!(matches!(
            existing(&[bound(), dispatched()], 1, false),
            KeyDecision::NotReplayable { .. }
        ));
    }

    #[test]
    fn an_unknown_or_unkept_outcome_is_never_rerun() {
        let unknown = EventKind::Unknown {
            target_status: None,
            attempt: None,
            reason: "cut".into(),
        };
        assert!(matches!(
            existing(&[bound(), dispatched(), unknown], 1, true),
            KeyDecision::NotReplayable { .. }
        ));
        assert!(matches!(
            existing(&[bound(), dispatched(), completed(false)], 1, true),
            KeyDecision::NotReplayable { .. }
        ));
    }
}

/// The server half asks the one outcome classifier: a status the inner service answers a
/// keyed call with frees the key only when it means "refused before running".
#[cfg(test)]
mod classified {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::{BodyExt, Full};
    use tower::{Layer, ServiceExt, service_fn};

    use crate::{
        fingerprint::FingerprintKey, integrations::server::IdempotencyLayer, ledger::MemoryLedger,
    };

    /// How many times the inner service runs for two identical keyed calls it answers with
    /// `status`.
    async fn runs_for_two_calls(status: u16) -> usize {
        let runs = Arc::new(AtomicUsize::new(0));
        let layer = IdempotencyLayer::new(MemoryLedger::new(), FingerprintKey::generate().unwrap());
        let counted = runs.clone();
        let inner = service_fn(move |request: Request<_>| {
            let counted = counted.clone();
            async move {
                // Read the body, as a server does.
                let _ = BodyExt::collect(request.into_body()).await;
                counted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
            }
        });
        let service = layer.layer(inner);
        for id in 1..=2 {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"deploy_release","arguments":{{}}}}}}"#
            );
            let request = Request::post("http://127.0.0.1/mcp")
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .header("idempotency-key", "k-1")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let response = service.clone().oneshot(request).await.unwrap();
            let _ = response.into_body().collect().await;
        }
        runs.load(Ordering::SeqCst)
    }

    /// 408, 409 and 410 say nothing about whether the tool ran (a 409 is what this very layer
    /// answers while a first request still runs): the key is held, not run a second time. The
    /// layer used to call every 4xx refused and ran the tool again.
    #[tokio::test]
    async fn a_timeout_conflict_or_gone_status_holds_the_key() {
        for status in [408, 409, 410] {
            assert_eq!(runs_for_two_calls(status).await, 1, "HTTP {status}");
        }
    }

    /// A status that means "refused before running" frees the key for the repeat.
    #[tokio::test]
    async fn a_refusal_before_running_frees_the_key() {
        for status in [400, 422, 429] {
            assert_eq!(runs_for_two_calls(status).await, 2, "HTTP {status}");
        }
    }
}
