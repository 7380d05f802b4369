//! `Idempotency<S>`: the keyed `tools/call` path.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{
    HeaderMap, HeaderValue, Method, Request, Response, StatusCode,
    header::{ACCEPT, CONTENT_TYPE},
};
use http_body::Body;
use tower_service::Service;

use super::{
    IdempotencyRequestBody, IdempotencyResponseBody,
    layer::{Config, InFlight},
};
use crate::{
    Actor, BoxError, EXECUTION_ID_META_KEY, IDEMPOTENCY_KEY, IdempotencyKey, IntentScope, Target,
    answer,
    decide::{
        classify::refused_before_running,
        server::{KeyDecision, decide},
    },
    execution::{Claim, Claimed, EventKind, ExecutionRecord, LedgerEvent, RetryClass, Timestamp},
    fingerprint::{ActionRecord, Channel, Fingerprint, FingerprintRules},
    ledger::LedgerError,
    observe::{self, Recorder, Unread, spawn_finishing, written},
    protocol::{
        self, Era, MCP_SESSION_ID, Message, RequestId, RequestKind, ToolCall,
        response::ResponseScanner,
    },
};

/// JSON-RPC error code: the `Idempotency-Key` was first used for another call (HTTP 422).
pub const KEY_REUSED: i64 = -32081;
/// JSON-RPC error code: the first request with the `Idempotency-Key` is still running
/// (HTTP 409).
pub const KEY_IN_FLIGHT: i64 = crate::decide::classify::KEY_IN_FLIGHT;
/// JSON-RPC error code: the first request with the `Idempotency-Key` may have run but its
/// answer was not kept; it is not run again under this key (HTTP 409).
pub const KEY_OUTCOME_UNKNOWN: i64 = crate::decide::classify::KEY_OUTCOME_UNKNOWN;
/// JSON-RPC error code: the key could not be recorded, so the call was not run (HTTP 503).
pub const KEY_NOT_RECORDED: i64 = -32084;

/// Header on a replayed answer: `Idempotent-Replayed: true`.
pub const IDEMPOTENT_REPLAYED: http::HeaderName =
    http::HeaderName::from_static("idempotent-replayed");

/// The actor of keyed calls without a principal.
const ANONYMOUS: &str = "anonymous";
/// The tool name of a key's own fingerprint (the claim on a key is atomic per principal and
/// key, whatever the call).
const KEY_SLOT: &str = "idempotency-key";

/// The server-side Idempotency-Key middleware; see [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Clone)]
pub struct Idempotency<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
}

impl<S> Idempotency<S> {
    crate::define_inner_service_accessors!();
}

impl<S: std::fmt::Debug> std::fmt::Debug for Idempotency<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

type Answer<RB, E> = Result<Response<IdempotencyResponseBody<RB>>, E>;

/// The future of [`Idempotency`]. Boxed inside: a keyed call awaits the ledger several times,
/// and a hand-written state machine would hide the decision.
pub struct ResponseFuture<RB: Body, E> {
    inner: observe::BoxFuture<Answer<RB, E>>,
}

impl<RB: Body, E> std::fmt::Debug for ResponseFuture<RB, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl<RB: Body, E> Future for ResponseFuture<RB, E> {
    type Output = Answer<RB, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl<S, B, RB> Service<Request<B>> for Idempotency<S>
where
    S: Service<Request<IdempotencyRequestBody<B>>, Response = Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Send,
{
    type Response = Response<IdempotencyResponseBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Readiness is spent right before the send, not here: the ready service is dropped,
        // which gives back what it reserved below (a `Buffer` or `ConcurrencyLimit` slot), so
        // the body collect and the ledger writes hold no slot. The call polls its own clone.
        let inner = self.inner.clone();
        drop(std::mem::replace(&mut self.inner, inner.clone()));
        let call = Call {
            inner,
            config: self.config.clone(),
        };
        ResponseFuture {
            inner: observe::BoxFuture::new(call.run(request)),
        }
    }
}

struct Call<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Call<S> {
    /// Calls the inner service, polled ready right before: a ready service held across the
    /// body collect and the ledger writes would pin a slot of a `Buffer` or
    /// `ConcurrencyLimit` below.
    async fn send<R>(&mut self, request: R) -> Result<S::Response, S::Error>
    where
        S: Service<R>,
    {
        std::future::poll_fn(|cx| self.inner.poll_ready(cx)).await?;
        self.inner.call(request).await
    }
}

/// A keyed `tools/call`, fingerprinted.
struct Keyed {
    call: ToolCall,
    /// The caller's era: the shape of a replayed result.
    era: Era,
    key: IdempotencyKey,
    actor: Actor,
    scope: IntentScope,
    target: Target,
    slot: Fingerprint,
    fingerprint: Fingerprint,
}

fn answered<RB: Body, E>(response: Response<Bytes>) -> Answer<RB, E> {
    Ok(response.map(IdempotencyResponseBody::answer))
}

impl<S> Call<S> {
    async fn run<B, RB>(mut self, request: Request<B>) -> Answer<RB, S::Error>
    where
        S: Service<Request<IdempotencyRequestBody<B>>, Response = Response<RB>> + Send + 'static,
        S::Future: Send,
        S::Error: Send + 'static,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Send,
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let may_be_keyed =
            request.headers().contains_key(IDEMPOTENCY_KEY) || self.config.key_from_meta;
        if request.method() != Method::POST || !may_be_keyed {
            let response = self
                .send(request.map(IdempotencyRequestBody::passthrough))
                .await?;
            return Ok(response.map(IdempotencyResponseBody::passthrough));
        }
        let (parts, body) = request.into_parts();
        let bytes = match observe::collect(body, self.config.max_body_bytes).await {
            Ok(bytes) => bytes,
            Err(unread) => return answered(unreadable_body(&unread)),
        };
        let classified = protocol::classify_bytes(&parts.method, &parts.headers, &bytes);
        // The caller's era: the shape of a replayed result.
        let era = classified.as_ref().map_or(Era::Sessions, |c| c.era());
        let call = match classified {
            Ok(classified) => match classified.kind {
                RequestKind::Message(Message::ToolCall(call)) => Some(call),
                ref kind @ RequestKind::Batch(_) if kind.tool_calls().next().is_some() => {
                    return answered(answer::jsonrpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        -32600,
                        "a JSON-RPC batch carrying tools/call cannot be keyed; send each tools/call in its own request; the call was not run".into(),
                    ));
                }
                _ => None,
            },
            // A keyed request this layer cannot read as MCP (a key twice in a tools/call, a
            // header that disagrees with the body, an unknown protocol version, bad JSON) is
            // refused: passed on, the server might still run it, unkeyed, on every repeat.
            Err(error) => {
                return answered(answer::jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    protocol::request_id_of(&bytes).as_ref(),
                    -32600,
                    format!("{error}; the call was not run"),
                ));
            }
        };
        // Not a single tools/call (initialize, a notification, a batch without one): the key
        // means nothing here.
        let Some(call) = call else {
            let request = Request::from_parts(parts, IdempotencyRequestBody::buffered(bytes));
            let response = self.send(request).await?;
            return Ok(response.map(IdempotencyResponseBody::passthrough));
        };
        let key = match parts.headers.get(IDEMPOTENCY_KEY) {
            Some(header) => IdempotencyKey::from_header(header),
            None => match protocol::meta::meta_string(call.meta.as_ref(), EXECUTION_ID_META_KEY) {
                Some(key) => IdempotencyKey::new(key),
                // Neither spelling of a key: an unkeyed call, run as it is.
                None => {
                    let request =
                        Request::from_parts(parts, IdempotencyRequestBody::buffered(bytes));
                    let response = self.send(request).await?;
                    return Ok(response.map(IdempotencyResponseBody::passthrough));
                }
            },
        };
        let key = match key {
            Ok(key) => key,
            Err(error) => {
                return answered(answer::jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    Some(&call.id),
                    -32600,
                    format!("{error}; the call was not run"),
                ));
            }
        };
        if call.has_inexact_number() {
            return answered(answer::jsonrpc_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(&call.id),
                -32602,
                format!("{}; the call was not run", protocol::INEXACT_NUMBER),
            ));
        }
        let keyed = self.config.keyed(&parts, call, key, era);
        let request_id = keyed.call.id.clone();
        // From the claim on, a keyed call runs as a task of its own: a client that goes away
        // does not cancel it half-way (a claimed key left without its binding or dispatch
        // would answer 409 until its retention ends). The answer is kept for the repeat.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.keyed(parts, bytes, keyed).await;
        };
        match runtime.spawn(self.keyed(parts, bytes, keyed)).await {
            Ok(answer) => answer,
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            Err(_) => answered(answer::jsonrpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                Some(&request_id),
                KEY_NOT_RECORDED,
                "the server is shutting down; retry with the same key".into(),
            )),
        }
    }

    async fn keyed<B, RB>(
        self,
        parts: http::request::Parts,
        bytes: Bytes,
        keyed: Keyed,
    ) -> Answer<RB, S::Error>
    where
        S: Service<Request<IdempotencyRequestBody<B>>, Response = Response<RB>>,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Send,
    {
        let config = self.config.clone();
        let id = &keyed.call.id;
        let deadline = match config.in_flight {
            InFlight::Conflict => None,
            InFlight::Wait(wait) => Some(tokio::time::Instant::now() + wait),
        };
        loop {
            let claimed = match config.ledger.claim(config.claim(&keyed)).await {
                Ok(claimed) => claimed,
                Err(error) => return answered(not_recorded(id, &error)),
            };
            let owner_alive = match &claimed {
                Claimed::Existing(r) if r.owner != config.owner => {
                    config.ledger.is_owner_alive(&r.owner).await
                }
                _ => true,
            };
            let record = match decide(claimed, keyed.fingerprint, owner_alive) {
                KeyDecision::Run { record, bind } => {
                    return self.dispatch(parts, bytes, keyed, record, bind).await;
                }
                // A kept result goes back only to the principal whose call it answers (the
                // key's slot holds the principal, so a claim never links another's).
                KeyDecision::Replay { record, .. } if record.actor != keyed.actor => {
                    tracing::error!(execution_id = %record.execution_id, "a key's record of another principal was linked to this call; not replayed");
                    return answered(not_recorded(
                        id,
                        &LedgerError::Storage("linked to another principal's record".into()),
                    ));
                }
                KeyDecision::Replay { record, reference } => {
                    return match config.ledger.load_result(&reference).await {
                        Ok(Some(result)) => {
                            tracing::info!(execution_id = %record.execution_id, "replayed a kept response");
                            answered(replay(&parts.headers, id, keyed.era, &result))
                        }
                        Ok(None) => answered(outcome_unknown(id, &record)),
                        Err(error) => answered(not_recorded(id, &error)),
                    };
                }
                KeyDecision::KeyReused { record } => return answered(key_reused(id, &record)),
                KeyDecision::NotReplayable { record } => {
                    return answered(outcome_unknown(id, &record));
                }
                KeyDecision::InFlight { record } => record,
            };
            let Some(deadline) = deadline else {
                return answered(in_flight(id, &record));
            };
            match config.wait_for_change(&record, deadline).await {
                Ok(true) => {} // decide again
                Ok(false) => return answered(in_flight(id, &record)),
                Err(error) => return answered(not_recorded(id, &error)),
            }
        }
    }

    /// Binds the key to the call, records `dispatched`, and runs the call.
    async fn dispatch<B, RB>(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        keyed: Keyed,
        record: ExecutionRecord,
        bind: bool,
    ) -> Answer<RB, S::Error>
    where
        S: Service<Request<IdempotencyRequestBody<B>>, Response = Response<RB>>,
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Send,
    {
        let config = self.config.clone();
        let execution_id = record.execution_id;
        let session_id = parts
            .headers
            .get(MCP_SESSION_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let mut events = Vec::with_capacity(2);
        if bind {
            events.push(EventKind::KeyBound {
                request_fingerprint: keyed.fingerprint,
            });
        }
        events.push(EventKind::Dispatched {
            attempt: record.attempts + 1,
            idempotency_key: keyed.key.clone(),
            key_from_caller: true,
            jsonrpc_id: Some(keyed.call.id.clone()),
            session_id,
            client_info: None,
            owner: Some(config.owner.clone()),
        });
        for kind in events {
            let event = LedgerEvent {
                execution_id,
                at: Timestamp::now(),
                kind,
            };
            if let Err(error) = config.ledger.append(event).await {
                return answered(not_recorded(&keyed.call.id, &error));
            }
        }
        tracing::info!(%execution_id, tool = %keyed.call.name, "running a keyed call");
        let mut recorder =
            Recorder::new(config.ledger.clone(), execution_id, keyed.call.id.clone());
        recorder.max_result_bytes = config.max_body_bytes;
        recorder.drain_timeout = config.drain_timeout;
        let request = Request::from_parts(parts, IdempotencyRequestBody::buffered(bytes));
        // A readiness error counts as a failed call: recorded unknown, never run again.
        let response = match self.send(request).await {
            Ok(response) => response,
            Err(error) => {
                let write = recorder.unknown("the inner service failed on the call".into());
                written(spawn_finishing(write)).await;
                return Err(error);
            }
        };
        let status = response.status();
        recorder.status = status.as_u16();
        if status.is_success() {
            let sse = ResponseScanner::is_sse(response.headers());
            return Ok(response.map(|b| IdempotencyResponseBody::observed(b, sse, recorder)));
        }
        let write = if refused_before_running(status.as_u16()) {
            // Refused before the tool ran: the key is free again.
            recorder.settle(EventKind::Failed {
                target_status: Some(status.as_u16()),
                reason: format!("the server refused the call with HTTP {status}"),
            })
        } else {
            recorder.unknown(format!(
                "HTTP {status} on tools/call: the tool may have run"
            ))
        };
        written(spawn_finishing(write)).await;
        Ok(response.map(IdempotencyResponseBody::passthrough))
    }
}

impl Config {
    fn keyed(
        &self,
        parts: &http::request::Parts,
        call: ToolCall,
        key: IdempotencyKey,
        era: Era,
    ) -> Keyed {
        let actor = self
            .principal
            .as_ref()
            .and_then(|p| p.principal(parts))
            .unwrap_or_else(|| Actor::new(ANONYMOUS));
        let scope = IntentScope::new(format!("idempotency-key:{key}"));
        // The layer's own name for the server, never the request path: the inner service
        // answers the same on every path, so a path must not make a key's repeat a new call.
        let target = self.target.clone();
        let rules = FingerprintRules::default();
        let slot = self.key.fingerprint(
            ActionRecord::new(
                actor.clone(),
                scope.clone(),
                KEY_SLOT,
                Channel::mcp(target.clone()),
            ),
            &rules,
        );
        let record =
            ActionRecord::of_tool_call(actor.clone(), scope.clone(), &call, target.clone());
        let fingerprint = self.key.fingerprint(record, &rules);
        Keyed {
            call,
            era,
            key,
            actor,
            scope,
            target,
            slot,
            fingerprint,
        }
    }

    fn claim(&self, keyed: &Keyed) -> Claim {
        Claim {
            fingerprint: keyed.slot,
            tool: keyed.call.name.clone(),
            actor: keyed.actor.clone(),
            intent_scope: keyed.scope.clone(),
            target: keyed.target.clone(),
            credential_ref: None,
            retry_class: RetryClass::Idempotent,
            link_window: self.retention,
            retention: self.retention,
            owner: self.owner.clone(),
            at: Timestamp::now(),
            asked_at: None,
            waited: false,
        }
    }

    /// Waits until the record moves on (or its owner dies); `false` when the deadline came
    /// first.
    async fn wait_for_change(
        &self,
        record: &ExecutionRecord,
        deadline: tokio::time::Instant,
    ) -> Result<bool, LedgerError> {
        observe::until_changed(&*self.ledger, record, &self.owner, deadline)
            .await
            .map(|changed| changed.is_some())
    }
}

/// The kept result re-keyed to the repeat's id: JSON, or one SSE event when the client
/// accepts only SSE.
fn replay(headers: &HeaderMap, id: &RequestId, era: Era, result: &[u8]) -> Response<Bytes> {
    let mut response = answer::stored_result(id, era, result);
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    if accepts_json(headers) {
        return response;
    }
    let (mut parts, json) = response.into_parts();
    let mut sse = Vec::with_capacity(json.len() + 16);
    sse.extend_from_slice(b"event: message\n");
    for line in json.split(|b| *b == b'\n') {
        sse.extend_from_slice(b"data: ");
        sse.extend_from_slice(line);
        sse.push(b'\n');
    }
    sse.push(b'\n');
    parts.headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(protocol::EVENT_STREAM),
    );
    Response::from_parts(parts, Bytes::from(sse))
}

/// Whether the client takes an `application/json` answer (no `Accept` means anything).
fn accepts_json(headers: &HeaderMap) -> bool {
    let mut any = false;
    for value in headers.get_all(ACCEPT) {
        any = true;
        let Ok(text) = value.to_str() else { continue };
        for range in text.split(',') {
            let media = range.split(';').next().unwrap_or("").trim();
            if matches!(media, "application/json" | "application/*" | "*/*") {
                return true;
            }
        }
    }
    !any
}

fn key_reused(id: &RequestId, record: &ExecutionRecord) -> Response<Bytes> {
    answer::jsonrpc_error(
        StatusCode::UNPROCESSABLE_ENTITY,
        Some(id),
        KEY_REUSED,
        format!(
            "this Idempotency-Key was already used for a different call (execution {}); \
             the call was not run. Use a new key for a new call.",
            record.execution_id
        ),
    )
}

fn in_flight(id: &RequestId, record: &ExecutionRecord) -> Response<Bytes> {
    answer::jsonrpc_error(
        StatusCode::CONFLICT,
        Some(id),
        KEY_IN_FLIGHT,
        format!(
            "the first request with this Idempotency-Key is still running (execution {}); \
             this one was not run. Retry later with the same key to get its result.",
            record.execution_id
        ),
    )
}

fn outcome_unknown(id: &RequestId, record: &ExecutionRecord) -> Response<Bytes> {
    answer::jsonrpc_error(
        StatusCode::CONFLICT,
        Some(id),
        KEY_OUTCOME_UNKNOWN,
        format!(
            "the first request with this Idempotency-Key (execution {}, {}) may have run, \
             but its response was not kept; it is not run again under this key. Check the \
             effect of {} before sending it with a new key.",
            record.execution_id,
            record.state_label(),
            record.tool
        ),
    )
}

fn not_recorded(id: &RequestId, error: &LedgerError) -> Response<Bytes> {
    tracing::warn!(%error, "the idempotency ledger failed");
    answer::jsonrpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        Some(id),
        KEY_NOT_RECORDED,
        "the Idempotency-Key could not be recorded, so the call was not run; retry with the \
         same key"
            .into(),
    )
}

fn unreadable_body(unread: &Unread) -> Response<Bytes> {
    let (status, message) = if matches!(unread, Unread::TooLarge) {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body is larger than this server keeps for an Idempotency-Key",
        )
    } else {
        (
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )
    };
    answer::jsonrpc_error(
        status,
        None,
        -32600,
        format!("{message}; the call was not run"),
    )
}
