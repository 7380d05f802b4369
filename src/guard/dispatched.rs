//! `Dispatched`: an attempt whose `dispatched` is recorded, on its way out, and what became of
//! it once sent.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, config::Config, future::Answer,
    inflight::Inflight, intent::Intent, ledger_step::LedgerStep, local::Local, owner::Owner,
};

use crate::{
    EXECUTION_ID_META_KEY, IDEMPOTENCY_KEY, IdempotencyKey,
    decide::classify::{ErrorClass, classify_error, refused_before_running},
    execution::{EventKind, ExecutionRecord, ExecutionState},
    observe::{Polled, Settlement},
    protocol::{self, response::ResponseScanner, tap::EventTap},
};

/// An attempt recorded `dispatched` ([`LedgerStep::record_dispatch`]), owned by this call.
pub(super) struct Dispatched {
    pub(super) record: ExecutionRecord,
    pub(super) key: IdempotencyKey,
    pub(super) owner: Owner,
}

impl Dispatched {
    /// The request that carries the attempt: the caller's, with the attempt's
    /// `Idempotency-Key` (unless the caller sent its own) and, when the contract says so, the
    /// key in `params._meta`. From here on, dropping the call records the attempt `unknown`.
    pub(super) fn request(
        &mut self,
        config: &Config,
        intent: &Intent,
        mut parts: http::request::Parts,
        bytes: Bytes,
    ) -> (Request<GuardRequestBody>, Polled) {
        let record = &self.record;
        self.owner
            .dispatched(config.ledger.clone(), record.execution_id, record.attempts);
        if intent.caller_key.is_none() {
            parts
                .headers
                .insert(IDEMPOTENCY_KEY, self.key.to_header_value(config.key_format));
        }
        // Never part of the fingerprint, which was taken from the caller's body.
        let bytes = match intent.key_in_meta {
            true => {
                protocol::meta::with_meta_string(&bytes, EXECUTION_ID_META_KEY, self.key.as_str())
                    .unwrap_or(bytes)
            }
            false => bytes,
        };
        tracing::info!(attempt = record.attempts, "dispatched");
        let (body, polled) = GuardRequestBody::new(bytes);
        (Request::from_parts(parts, body), polled)
    }

    /// The target answered: a success is observed on its way to the caller (its outcome is
    /// recorded from what it carries); any other status is recorded at once.
    pub(super) async fn answered<RB>(
        self,
        step: LedgerStep<'_>,
        inflight: &Arc<Inflight>,
        mut response: Response<RB>,
    ) -> Answer<RB>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        let Self {
            record, mut owner, ..
        } = self;
        let (config, intent) = (step.config, step.intent);
        let id = record.execution_id;
        // The caller can tell which execution a target's answer belongs to.
        response.extensions_mut().insert(id);
        // A resume layer's events, read instead of parsed again (never the caller's).
        let tap = response.extensions_mut().remove::<EventTap>();
        let status = response.status();
        if status.is_success() {
            let sse = ResponseScanner::is_sse(response.headers());
            let mut recorder = Local::recorder(
                config,
                inflight,
                intent.actor.clone(),
                id,
                intent.call.id.clone(),
                status.as_u16(),
                (intent.target.clone(), intent.session_id.clone()),
            );
            recorder.attempt = Some(record.attempts);
            recorder.keep_results = intent.keep_results;
            recorder.max_result_bytes = intent.max_result_bytes;
            recorder.settle = Some(Box::new(move |settlement| owner.settle(settlement)));
            let max = config.max_body_bytes.max(intent.max_result_bytes);
            let observed = |b| GuardResponseBody::observed(b, recorder, sse, max, tap);
            return Ok(response.map(observed));
        }
        let kind = if refused_before_running(status.as_u16()) {
            EventKind::Failed {
                target_status: Some(status.as_u16()),
                reason: format!("the target refused the call with HTTP {status}"),
            }
        } else {
            EventKind::Unknown {
                target_status: Some(status.as_u16()),
                attempt: Some(record.attempts),
                reason: format!("HTTP {status} on tools/call: the tool may have run"),
            }
        };
        step.append(id, kind).await?;
        owner.settle(Settlement::Other);
        Ok(response.map(GuardResponseBody::passthrough))
    }

    /// The send failed: `not_sent` when the request provably never left, else `unknown`.
    pub(super) async fn failed<RB>(
        self,
        step: LedgerStep<'_>,
        polled: &Polled,
        error: BoxError,
    ) -> Answer<RB> {
        let Self {
            record, mut owner, ..
        } = self;
        let id = record.execution_id;
        let sent = classify_error(
            polled.was_polled(),
            protocol::transport::nothing_was_sent(&*error),
        ) == ErrorClass::Unknown;
        let kind = if sent {
            EventKind::Unknown {
                target_status: None,
                attempt: Some(record.attempts),
                reason: format!("transport error after the request may have been sent: {error}"),
            }
        } else {
            EventKind::NotSent {
                reason: format!("transport error before the request was sent: {error}"),
            }
        };
        // A lost answer is what the guard is for: the call line says how it ended.
        tracing::info!(outcome = kind.name(), "send failed");
        let now = step.append(id, kind).await?;
        owner.settle(Settlement::Other);
        // This attempt never left, but an earlier one may have: the execution is unknown,
        // and the caller is never told that nothing was sent.
        if now.state == ExecutionState::NotSent {
            Err(GuardError::not_sent(id, error))
        } else {
            Err(GuardError::unknown(id, error))
        }
    }
}
