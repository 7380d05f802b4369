//! Honest first answers: a `tools/call` whose upstream exchange failed after dispatch is put
//! to the guard again on the same client request, as `replay-guard call` does, and the guard
//! decides from its ledger (re-send an idempotent call under its key, probe a recoverable one,
//! hold an irreversible one and answer that it is held). A client gets a `502` only when
//! nothing was sent, and then as a JSON-RPC error for its request id.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode, request::Parts};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    ExecutionId,
    guard::{DEFAULT_MAX_BODY_BYTES, Delivery, GuardError, GuardResponseBody, jsonrpc_error},
    protocol::{self, Era, Message, RequestId, RequestKind},
};
use tower::ServiceExt;

use super::{
    ProxyBody, Upstream,
    delivery::{Deliveries, Written},
};
use crate::mcp_http::{BoxError, describe, is_event_stream};

/// How many times one client request is put to the guard: the first attempt sends; each later
/// one asks the guard again after an unknown outcome (as `replay-guard call` does).
const ATTEMPTS: usize = 3;

/// JSON-RPC error code of the proxy's own answers (the server-error range).
const PROXY_ERROR: i64 = -32000;

/// What the proxy knows of a client request, from the one classifier.
struct Asked {
    tool_call: bool,
    id: Option<RequestId>,
    era: Era,
    /// A JSON-RPC request (a POST): its failures are answered as JSON-RPC errors.
    jsonrpc: bool,
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
                }
            }
            Err(_) => Self {
                tool_call: false,
                id: jsonrpc.then(|| protocol::request_id_of(bytes)).flatten(),
                era: Era::Sessions,
                jsonrpc,
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
) -> Response<ProxyBody> {
    let asked = Asked::of(&parts, &bytes);
    let mut execution: Option<ExecutionId> = None;
    let mut last_error = None;
    for attempt in 1..=ATTEMPTS {
        let error = match guard.clone().oneshot(again(&parts, &bytes)).await {
            Ok(response) => match ready(asked.tool_call, response).await {
                Ok(ready) => return streamed(ready, deliveries),
                // The guard recorded the cut before it reported it: it decides again.
                Err(cut) => {
                    execution = cut.execution.or(execution);
                    tracing::warn!(attempt, error = %describe(&*cut.error), "the upstream answer was cut; asking the guard again");
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
            return failed(&asked, &error, execution);
        }
        execution = error.execution_id().or(execution);
        tracing::warn!(attempt, error = %describe(&error), "the upstream exchange failed; asking the guard again");
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
struct Ready {
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
async fn ready(
    tool_call: bool,
    response: Response<GuardResponseBody<hyper::body::Incoming>>,
) -> Result<Ready, Cut> {
    let (mut parts, mut body) = response.into_parts();
    super::strip_hop_by_hop(&mut parts.headers);
    let delivery = body.defer_delivery();
    if !tool_call || is_event_stream(&parts.headers) {
        let body = body.map_err(Into::into).boxed_unsync();
        return Ok(Ready {
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
                return Ok(Ready {
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
    Ok(Ready {
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

/// The guard's answer (the target's, or its own), streamed to the client; delivered when
/// the client showed it took it (see the module docs of `proxy`).
fn streamed(ready: Ready, deliveries: Arc<Deliveries>) -> Response<ProxyBody> {
    let body = Written::new(ready.body, ready.delivery, deliveries);
    Response::from_parts(ready.parts, body.boxed_unsync())
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
pub(super) fn own(response: Response<Bytes>) -> Response<ProxyBody> {
    response.map(|bytes| {
        Full::new(bytes)
            .map_err(|never| match never {})
            .boxed_unsync()
    })
}
