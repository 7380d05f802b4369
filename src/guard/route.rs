//! `Route`: what the guard does with a request, from the request alone: pass it through,
//! resume a stream, watch a `tools/list`, guard a `tools/call`, or answer it unsent.

use bytes::Bytes;
use http::{Response, StatusCode};

use super::{GuardError, answer, config::Config, intent::Intent};

use crate::{
    IdempotencyKey,
    execution::RetryClass,
    protocol::{self, Era, Message, RequestId, RequestKind},
};

/// Where one request goes.
pub(super) enum Route {
    /// Not the guard's business: sent untouched, its answer untouched.
    PassThrough,
    /// A GET with `Last-Event-ID`: never a re-issue.
    Resume {
        last_event_id: String,
        session_id: Option<String>,
    },
    /// A `tools/list` to a trusted target: passed through, its answer's annotations read.
    ListTools(RequestId),
    /// A `tools/call` the guard decides about.
    ToolCall(Box<Intent>),
    /// Answered by the guard, nothing sent.
    Refused(Response<Bytes>),
}

impl Route {
    /// Classifies the request (adding the standard MCP headers a classified request implies).
    pub(super) async fn of(
        config: &Config,
        parts: &mut http::request::Parts,
        bytes: &Bytes,
    ) -> Result<Self, GuardError> {
        let classified = protocol::classify_bytes(&parts.method, &parts.headers, bytes);
        if let Ok(c) = &classified {
            protocol::headers::add_standard_headers(&mut parts.headers, c);
        }
        let era = classified.as_ref().map_or(Era::Sessions, |c| c.era());
        let (call, session_id) = match classified {
            Ok(c) => match c.kind {
                RequestKind::Message(Message::ToolCall(call)) => (call, c.session_id),
                RequestKind::Resume { last_event_id } => {
                    return Ok(Route::Resume {
                        last_event_id,
                        session_id: c.session_id,
                    });
                }
                ref kind @ RequestKind::Batch(_) if kind.tool_calls().next().is_some() => {
                    return Ok(Route::Refused(answer::jsonrpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        -32600,
                        "a JSON-RPC batch carrying tools/call cannot be guarded; send each tools/call in its own request".into(),
                    )));
                }
                RequestKind::Message(Message::Request { id, method })
                    if method == protocol::tools_list::TOOLS_LIST
                        && config.watches_list_of(parts) =>
                {
                    return Ok(Route::ListTools(id));
                }
                _ => return Ok(Route::PassThrough),
            },
            // A revision this crate does not speak: the server answers what cannot run a
            // tool (its refusal names the revisions it speaks); a possible call is refused.
            Err(protocol::ClassifyError::UnsupportedProtocolVersion(_))
                if !protocol::may_call_a_tool(bytes) =>
            {
                return Ok(Route::PassThrough);
            }
            Err(error) if parts.method == http::Method::POST => {
                return Ok(Route::Refused(answer::refused_request(
                    &error,
                    protocol::request_id_of(bytes).as_ref(),
                )));
            }
            Err(_) => return Ok(Route::PassThrough),
        };
        let intent = match Intent::of(config, parts, call, session_id, era) {
            Ok(intent) => intent,
            Err(response) => return Ok(Route::Refused(*response)),
        };
        if intent.class == RetryClass::ReadOnly {
            return Ok(Route::PassThrough);
        }
        if intent.call.has_inexact_number() {
            return Ok(Route::Refused(answer::jsonrpc_error(
                StatusCode::OK,
                Some(&intent.call.id),
                -32602,
                format!("{}; nothing was sent", protocol::INEXACT_NUMBER),
            )));
        }
        if key_of_another_actor(config, &intent).await? {
            return Ok(Route::Refused(answer::jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Some(&intent.call.id),
                -32600,
                "the Idempotency-Key names an execution this caller did not start; send the call \
                 without it, or with a key of its own; nothing was sent"
                    .into(),
            )));
        }
        Ok(Route::ToolCall(Box::new(intent)))
    }
}

/// Whether the caller's `Idempotency-Key` is the key of another actor's execution: sent, it
/// would let a target that honours keys hand that execution's result to this caller.
async fn key_of_another_actor(config: &Config, intent: &Intent) -> Result<bool, GuardError> {
    let Some(id) = intent
        .caller_key
        .as_ref()
        .and_then(IdempotencyKey::execution_id)
    else {
        return Ok(false);
    };
    let record = config.ledger.get(id).await.map_err(GuardError::ledger)?;
    Ok(record.is_some_and(|record| record.actor != intent.actor))
}
