//! Sending a dispatched attempt, and recording what became of it.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, call::Call, future::Answer,
    inflight::Owner, intent::Intent, layer::Config,
};

use crate::{
    EXECUTION_ID_META_KEY, IDEMPOTENCY_KEY, IdempotencyKey,
    decide::classify::{ErrorClass, classify_error, refused_before_running},
    execution::{EventKind, ExecutionRecord, ExecutionState},
    observe::{Polled, Settlement},
    protocol::{self, response::ResponseScanner, tap::EventTap},
};

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    /// Sends an attempt whose `dispatched` is recorded ([`Config::record_dispatch`]), with
    /// the `Idempotency-Key`.
    pub(super) async fn send_dispatched(
        mut self,
        mut parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
        record: ExecutionRecord,
        key: IdempotencyKey,
        mut owner: Owner,
    ) -> Answer<RB> {
        let id = record.execution_id;
        let key_from_caller = intent.caller_key.is_some();
        owner.dispatched(self.config.ledger.clone(), id, record.attempts);
        if !key_from_caller {
            parts
                .headers
                .insert(IDEMPOTENCY_KEY, key.to_header_value(self.config.key_format));
        }
        // Never part of the fingerprint, which was taken from the caller's body.
        let bytes = match intent.key_in_meta {
            true => protocol::meta::with_meta_string(&bytes, EXECUTION_ID_META_KEY, key.as_str())
                .unwrap_or(bytes),
            false => bytes,
        };
        tracing::info!(attempt = record.attempts, "dispatched");
        let (body, polled) = GuardRequestBody::new(bytes);
        let mut response = match self.send(Request::from_parts(parts, body)).await {
            Ok(response) => response,
            Err(error) => {
                return send_failed(&self.config, &record, &polled, error, owner).await;
            }
        };
        // The caller can tell which execution a target's answer belongs to.
        response.extensions_mut().insert(id);
        // A resume layer's events, read instead of parsed again (never the caller's).
        let tap = response.extensions_mut().remove::<EventTap>();
        let status = response.status();
        if status.is_success() {
            let sse = ResponseScanner::is_sse(response.headers());
            let mut recorder = self.recorder(
                intent.actor.clone(),
                id,
                intent.call.id,
                status.as_u16(),
                (intent.target.clone(), intent.session_id.clone()),
            );
            recorder.attempt = Some(record.attempts);
            recorder.keep_results = intent.keep_results;
            recorder.max_result_bytes = intent.max_result_bytes;
            recorder.settle = Some(Box::new(move |settlement| owner.settle(settlement)));
            let max = self.config.max_body_bytes.max(intent.max_result_bytes);
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
        self.config.append(id, kind).await?;
        owner.settle(Settlement::Other);
        Ok(response.map(GuardResponseBody::passthrough))
    }
}

pub(super) async fn send_failed<RB>(
    config: &Config,
    record: &ExecutionRecord,
    polled: &Polled,
    error: BoxError,
    owner: Owner,
) -> Answer<RB> {
    let id = record.execution_id;
    {
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
        tracing::warn!(outcome = kind.name(), "send failed");
        let now = config.append(id, kind).await?;
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
