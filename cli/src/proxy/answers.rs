//! Honest first answers: a `tools/call` whose upstream exchange failed after dispatch is put
//! to the guard again on the same client request, as `replay-guard call` does, and the guard
//! decides from its ledger (re-send an idempotent call under its key, probe a recoverable one,
//! hold an irreversible one and answer that it is held). A client gets a `502` only when
//! nothing was sent, and then as a JSON-RPC error for its request id.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
};

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode, request::Parts};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    DEFAULT_MAX_BODY_BYTES, ExecutionId,
    guard::{Delivery, GuardError, GuardResponseBody},
    protocol::{self, Era, Message, RequestId, RequestKind},
    tools::{jsonrpc_error, sse::SseParser},
};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{
    ProxyBody, Upstream,
    authentication::{CHALLENGE, Unauthenticated},
    client_close::{ClientLeft, until_client_left},
    delivery::{Deliveries, Written},
    serve,
};
use crate::mcp_http::{BoxError, describe, is_event_stream};

/// How many times one client request is put to the guard: the first attempt sends; each later
/// one asks the guard again after an unknown outcome (as `replay-guard call` does).
const ATTEMPTS: usize = 3;

/// JSON-RPC error code of the proxy's own answers (the server-error range).
pub(super) const PROXY_ERROR: i64 = -32000;

/// What the proxy knows of a client request, from the one classifier.
struct Asked {
    tool_call: bool,
    id: Option<RequestId>,
    era: Era,
    /// A JSON-RPC request (a POST): its failures are answered as JSON-RPC errors.
    jsonrpc: bool,
    /// A GET that opens a listen stream (no call's answer rides on it).
    listen: bool,
    /// A GET that resumes a stream (`Last-Event-ID`).
    resume: bool,
}

impl Asked {
    fn of(parts: &Parts, bytes: &[u8]) -> Self {
        let jsonrpc = parts.method == http::Method::POST;
        match protocol::classify(&parts.method, &parts.headers, bytes) {
            Ok(classified) => {
                let (tool_call, id) = match &classified.kind {
                    RequestKind::Message(message) => (
                        matches!(message, Message::ToolCall(_)),
                        message.id().cloned(),
                    ),
                    _ => (false, None),
                };
                Self {
                    tool_call,
                    id,
                    era: classified.era(),
                    jsonrpc,
                    listen: matches!(classified.kind, RequestKind::Listen),
                    resume: matches!(classified.kind, RequestKind::Resume { .. }),
                }
            }
            Err(_) => Self {
                tool_call: false,
                id: jsonrpc.then(|| protocol::request_id_of(bytes)).flatten(),
                era: Era::Sessions,
                jsonrpc,
                listen: false,
                resume: false,
            },
        }
    }
}

/// Answers one client request through the guard; never an error of its own.
pub(super) async fn answer(
    guard: Upstream,
    parts: Parts,
    bytes: Bytes,
    deliveries: Arc<Deliveries>,
    stopping: &CancellationToken,
) -> Response<ProxyBody> {
    let asked = Asked::of(&parts, &bytes);
    let client = parts.extensions.get::<ClientLeft>().cloned();
    let mut execution: Option<ExecutionId> = None;
    let mut last_error = None;
    for attempt in 1..=ATTEMPTS {
        let error = match guard.clone().oneshot(again(&parts, &bytes)).await {
            Ok(response) => match prepared(&guard, &asked, response, stopping, &client).await {
                Ok(prepared) => return streamed(prepared, deliveries),
                // The guard recorded the cut before it reported it: it decides again.
                Err(cut) => {
                    execution = cut.execution.or(execution);
                    tracing::info!(attempt, error = %describe(&*cut.error), "the upstream answer was cut; asking the guard again");
                    continue;
                }
            },
            Err(error) => error,
        };
        // An unknown outcome, a later attempt not sent after an earlier one may have been, or
        // a read-only call the guard passed through: the guard decides again from its ledger.
        let ask_again = asked.tool_call
            && (error.is_unknown()
                || error.is_inner()
                || (error.is_not_sent() && execution.is_some()));
        if !ask_again {
            if asked.resume
                && let (Some(execution), Some(id)) = (error.execution_id(), error.resumed_call())
                && let Some(answer) = unreachable_resume(&guard, execution, id, asked.era).await
            {
                return answer;
            }
            return failed(&asked, &error, execution);
        }
        execution = error.execution_id().or(execution);
        tracing::info!(attempt, error = %describe(&error), "the upstream exchange failed; asking the guard again");
        last_error = Some(error);
    }
    match (execution, &asked.id) {
        (Some(execution), Some(id)) => match guard.unanswered(execution, id, asked.era).await {
            Ok(Some(response)) => own(response),
            Ok(None) => own(jsonrpc_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                Some(id),
                PROXY_ERROR,
                format!(
                    "replay-guard proxy: the outcome of execution {execution} is unknown and its record is gone"
                ),
            )),
            Err(error) => failed(&asked, &error, Some(execution)),
        },
        // Only a read-only call (nothing the guard records) ends here: nothing changed.
        _ => match last_error {
            Some(error) => failed(&asked, &error, execution),
            None => own(jsonrpc_error(
                StatusCode::BAD_GATEWAY,
                asked.id.as_ref(),
                PROXY_ERROR,
                "replay-guard proxy: no answer from the upstream".into(),
            )),
        },
    }
}

/// The client's request again, from its parts and buffered body.
fn again(parts: &Parts, bytes: &Bytes) -> Request<Full<Bytes>> {
    let mut request = Request::new(Full::new(bytes.clone()));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    *request.extensions_mut() = parts.extensions.clone();
    request
}

/// A guarded call's answer, ready to go to the client: its head, its body and its delivery.
struct Prepared {
    parts: http::response::Parts,
    body: ProxyBody,
    delivery: Option<Delivery>,
}

/// An answer's body cut before its end, before anything of it went to the client.
struct Cut {
    execution: Option<ExecutionId>,
    error: BoxError,
}

/// The guard's answer, made ready for the client. A JSON answer to a `tools/call` is read
/// whole first (up to the body bound; past it the rest streams): a body cut before its end is
/// then still the exchange's failure, on which the guard decides again for the same request,
/// and never a cut answer the client takes for a failure. An event stream goes on as it comes
/// (a cut one is resumed by the client with GET + `Last-Event-ID`).
async fn prepared(
    guard: &Upstream,
    asked: &Asked,
    response: Response<GuardResponseBody<hyper::body::Incoming>>,
    stopping: &CancellationToken,
    client: &Option<ClientLeft>,
) -> Result<Prepared, Cut> {
    let (mut parts, mut body) = response.into_parts();
    super::strip_hop_by_hop(&mut parts.headers);
    let delivery = body.defer_delivery();
    let sse = is_event_stream(&parts.headers);
    if !asked.tool_call || sse {
        let mut body = body.map_err(Into::into).boxed_unsync();
        if asked.listen {
            body = serve::until_stopping(body, stopping);
            if let Some(client) = client {
                body = until_client_left(body, client.clone());
            }
        }
        if let (true, Some(delivery)) = (sse, &delivery) {
            // The stream may end with one more event than the upstream sent.
            parts.headers.remove(http::header::CONTENT_LENGTH);
            body = Unresumable {
                inner: body,
                delivery: delivery.clone(),
                guard: guard.clone(),
                id: delivery.request_id().clone(),
                era: asked.era,
                events: SseParser::new(),
                tail: Vec::new(),
                lost_track: false,
                asking: None,
                ended: false,
            }
            .boxed_unsync();
        }
        return Ok(Prepared {
            parts,
            body,
            delivery,
        });
    }
    let mut whole = BytesMut::new();
    while whole.len() <= DEFAULT_MAX_BODY_BYTES {
        match body.frame().await {
            None => {
                let body = Full::new(whole.freeze())
                    .map_err(|never| match never {})
                    .boxed_unsync();
                return Ok(Prepared {
                    parts,
                    body,
                    delivery,
                });
            }
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    whole.extend_from_slice(data);
                }
            }
            Some(Err(error)) => {
                return Err(Cut {
                    execution: delivery.map(|d| d.execution_id()),
                    error,
                });
            }
        }
    }
    // Past the bound: what was read, then the rest as it comes.
    let body = ReadAhead {
        read: Some(whole.freeze()),
        rest: body.map_err(Into::into).boxed_unsync(),
    }
    .boxed_unsync();
    Ok(Prepared {
        parts,
        body,
        delivery,
    })
}

/// A body of which `read` was read already: that, then the `rest`.
struct ReadAhead {
    read: Option<Bytes>,
    rest: ProxyBody,
}

impl Body for ReadAhead {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.read.take() {
            Some(read) => Poll::Ready(Some(Ok(Frame::data(read)))),
            None => Pin::new(&mut self.rest).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read = self.read.as_ref().map_or(0, |read| read.len() as u64);
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
    }
}

/// An event stream of a guarded call's answer (or of its resume) that the client could not
/// resume if it broke: one cut (or ended) before the answer, with no new event id (a server
/// without priming events, or one that let go of a finished call's events) and at the end of
/// an event, ends instead with one more event, the guard's uncertain answer for the request
/// (read from the ledger, which recorded the cut before it was reported); never a second
/// send. A stream with an event id is cut for the client too: it resumes it.
struct Unresumable {
    inner: ProxyBody,
    delivery: Delivery,
    guard: Upstream,
    id: RequestId,
    era: Era,
    /// What went to the client, parsed for its event ids.
    events: SseParser,
    /// The last bytes that went to the client: whether they end an event.
    tail: Vec<u8>,
    /// An event was too large to follow: whether it had an id is not known.
    lost_track: bool,
    /// After the cut (or the end): the guard's answer being read, as an SSE event, and the cut
    /// to report if there is none.
    asking: Option<(Asking, Option<BoxError>)>,
    ended: bool,
}

/// The guard's answer for a cut stream, as one SSE event (`None`: there is none).
type Asking = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

impl Unresumable {
    /// Whether a cut now leaves the client nothing to resume and nothing half-sent.
    fn unresumable(&self) -> bool {
        let at_event_end = self.tail.is_empty()
            || [&b"\n\n"[..], b"\r\r", b"\r\n\r\n"]
                .iter()
                .any(|end| self.tail.ends_with(end));
        !self.lost_track
            && !self.delivery.is_answered()
            && self.events.last_event_id().is_empty()
            && at_event_end
    }

    fn sent(&mut self, data: &[u8]) {
        // An oversize event poisons the parser: the stream is then left as it comes.
        if self.events.push(data, |_| {}).is_err() {
            self.lost_track = true;
        }
        self.tail.extend_from_slice(data);
        let keep = self.tail.len().saturating_sub(4);
        self.tail.drain(..keep);
    }
}

impl Body for Unresumable {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some((mut asking, cut)) = this.asking.take() {
            let Poll::Ready(answer) = asking.as_mut().poll(cx) else {
                this.asking = Some((asking, cut));
                return Poll::Pending;
            };
            this.ended = true;
            return Poll::Ready(match answer {
                Some(event) => Some(Ok(Frame::data(event))),
                None => cut.map(Err),
            });
        }
        let next = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        match next {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.sent(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            // Cut, or ended, before the answer with nothing to resume from.
            Some(Err(_)) | None if this.unresumable() => {
                let cut = next.and_then(Result::err);
                tracing::warn!(
                    cut = cut.is_some(),
                    "the upstream stream ended before the answer, with nothing to resume; answering from the ledger"
                );
                let (guard, execution) = (this.guard.clone(), this.delivery.execution_id());
                let (id, era) = (this.id.clone(), this.era);
                let asking = Box::pin(async move {
                    let response = guard.unanswered(execution, &id, era).await.ok()??;
                    Some(message_event(response.body()))
                });
                this.asking = Some((asking, cut));
                self.poll_frame(cx)
            }
            other => {
                this.ended = true;
                Poll::Ready(other)
            }
        }
    }

    /// Not before the guard had its say on how the stream ended.
    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// A JSON-RPC message as one SSE `message` event.
fn message_event(json: &[u8]) -> Bytes {
    let json = String::from_utf8_lossy(json);
    Bytes::from(format!("event: message\ndata: {json}\n\n"))
}

/// A resume of a guarded call's broken stream that could not reach the upstream (it is down):
/// the client waits on that stream for its call's answer, so rather than a bare error it would
/// resume again until its own timeout, the stream carries the guard's answer for the call (the
/// same as on a cut stream) as its one event, and ends. The event has no id: there is nothing
/// the upstream could resume after it. `None` when the ledger has no such execution.
async fn unreachable_resume(
    guard: &Upstream,
    execution: ExecutionId,
    id: &RequestId,
    era: Era,
) -> Option<Response<ProxyBody>> {
    let answer = guard.unanswered(execution, id, era).await.ok()??;
    tracing::warn!(%execution, "the upstream is unreachable for a resume of a call's stream; answering from the ledger");
    let event = Full::new(message_event(answer.body()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(event);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    Some(response)
}

/// The guard's answer (the target's, or its own), streamed to the client; delivered when
/// the client showed it took it (see the module docs of `proxy`).
fn streamed(prepared: Prepared, deliveries: Arc<Deliveries>) -> Response<ProxyBody> {
    let body = Written::new(prepared.body, prepared.delivery, deliveries);
    Response::from_parts(prepared.parts, body.boxed_unsync())
}

/// A failure with no answer to hand on. `502` only when nothing was sent.
fn failed(
    asked: &Asked,
    error: &GuardError,
    execution: Option<ExecutionId>,
) -> Response<ProxyBody> {
    tracing::warn!(error = %describe(error), "upstream exchange failed");
    let (status, message) = if execution.is_none()
        && (error.is_not_sent() || error.is_request_body())
    {
        (
            StatusCode::BAD_GATEWAY,
            format!(
                "replay-guard proxy: the upstream exchange failed ({}); nothing was sent",
                crate::tls::described(error)
            ),
        )
    } else if execution.is_none() && error.is_inner() {
        // Passed through unguarded (not a tools/call, or a read-only one): nothing recorded.
        (
            StatusCode::BAD_GATEWAY,
            format!(
                "replay-guard proxy: the upstream exchange failed ({})",
                describe(error)
            ),
        )
    } else {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "replay-guard proxy: the guard failed ({}); the call may have been sent (execution {})",
                describe(error),
                execution
                    .or(error.execution_id())
                    .map_or_else(|| "-".to_owned(), |id| id.to_string())
            ),
        )
    };
    if !asked.jsonrpc {
        return super::error_response(status, &message);
    }
    own(jsonrpc_error(
        status,
        asked.id.as_ref(),
        PROXY_ERROR,
        message,
    ))
}

/// An answer of the proxy's (or the guard's) own, whole.
/// The 401 of a request that did not authenticate: the challenge names the scheme, the body
/// says why (never the credential).
pub(super) fn unauthenticated(why: &Unauthenticated) -> Response<ProxyBody> {
    let mut response = jsonrpc_error(
        StatusCode::UNAUTHORIZED,
        None,
        PROXY_ERROR,
        format!("replay-guard proxy: {why}; nothing was sent"),
    );
    response.headers_mut().insert(
        http::header::WWW_AUTHENTICATE,
        http::HeaderValue::from_static(CHALLENGE),
    );
    own(response)
}

pub(super) fn own(response: Response<Bytes>) -> Response<ProxyBody> {
    response.map(|bytes| {
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync()
    })
}
