//! Responses the crate writes itself, instead of the target's: the guard's uncertain answers
//! and both halves' JSON-RPC errors.
//!
//! The guard never invents a failure: a model that sees a fake failure tries again. When it
//! cannot hand back the target's result it answers the caller's request id with a
//! `CallToolResult` whose `isError` is true, a plain-language text, and `structuredContent`
//! holding the execution record and why nothing was re-sent.
//!
//! # Valid MCP in both eras
//!
//! Every answer is written for the caller's era ([`ClassifiedRequest::era`]): a 2026-07-28
//! result carries `resultType` (`"complete"` for a `CallToolResult`), an earlier one has no
//! such field. `tests/server/mcp_schema.rs` validates every kind against the official schemas.
//!
//! [`ClassifiedRequest::era`]: crate::protocol::ClassifiedRequest::era

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use serde_json::{Value, json};

use crate::{
    decide::call::UncertainReason,
    execution::ExecutionRecord,
    protocol::{ClassifyError, Era, ProtocolVersion, RequestId},
};

/// The field a 2026-07-28 result must carry, and earlier eras do not know.
const RESULT_TYPE: &str = "resultType";

/// The key under `structuredContent` that holds the guard's record.
pub const STRUCTURED_KEY: &str = "mcp_replay_guard";

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The target's kept result, re-keyed to the caller's JSON-RPC id, in the caller's era.
///
/// A byte splice when the kept result is already of that era; only a result kept from the
/// other era is parsed and rewritten (`resultType` added or removed).
pub(crate) fn stored_result(id: &RequestId, era: Era, result: &[u8]) -> Response<Bytes> {
    let converted = in_era(era, result);
    let result = converted.as_deref().unwrap_or(result);
    let mut body = Vec::with_capacity(result.len() + 48);
    body.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    body.extend_from_slice(&serde_json::to_vec(id).unwrap_or_else(|_| b"null".to_vec()));
    body.extend_from_slice(b",\"result\":");
    body.extend_from_slice(result);
    body.push(b'}');
    let mut response = Response::new(Bytes::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A kept result rewritten for `era`, or `None` when it already is of that era (or is not a
/// JSON object, which no rewrite could make valid).
fn in_era(era: Era, result: &[u8]) -> Option<Vec<u8>> {
    // Most kept results never mention the field: no parse for them in the older era, and a
    // certain mismatch in the newer one.
    let needle = b"\"resultType\"";
    let mentioned = result.windows(needle.len()).any(|w| w == needle);
    let has_field = mentioned && has_top_level_result_type(result)?;
    let mut object = match (era, has_field) {
        (Era::Stateless, false) | (Era::Sessions, true) => {
            serde_json::from_slice::<serde_json::Map<String, Value>>(result).ok()?
        }
        _ => return None,
    };
    match era {
        Era::Stateless => object.insert(RESULT_TYPE.into(), "complete".into()),
        Era::Sessions => object.remove(RESULT_TYPE),
    };
    serde_json::to_vec(&object).ok()
}

/// Whether a JSON object has `resultType` among its own members (not nested), read without
/// building the object.
fn has_top_level_result_type(result: &[u8]) -> Option<bool> {
    #[derive(serde::Deserialize)]
    struct Top {
        #[serde(rename = "resultType")]
        result_type: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Top>(result)
        .ok()
        .map(|top| top.result_type.is_some())
}

/// Adds `resultType` to a result the guard writes itself for a 2026-07-28 caller.
pub(crate) fn result_for(era: Era, mut result: Value) -> Value {
    if era == Era::Stateless
        && let Value::Object(map) = &mut result
    {
        map.insert(RESULT_TYPE.into(), "complete".into());
    }
    result
}

/// The honest answer when the outcome is not known or not kept.
pub(crate) fn uncertain(
    id: &RequestId,
    era: Era,
    record: &ExecutionRecord,
    reason: UncertainReason,
) -> Response<Bytes> {
    let (text, why) = match reason {
        UncertainReason::NeedsReview => (
            format!(
                "The outcome of {tool} is unknown: it was dispatched (execution {id}) and the response was lost. \
                 It was NOT sent again, because {tool} is {class} and sending it again could repeat its effect. \
                 It is held for review; do not retry it — ask an operator to check the target and resolve execution {id}.",
                tool = record.tool,
                id = record.execution_id,
                class = record.retry_class,
            ),
            "unknown outcome on a tool that may not be re-sent",
        ),
        UncertainReason::InProgress => (
            format!(
                "{tool} is still in progress (execution {id}). It was not sent again; retry later to get its result.",
                tool = record.tool,
                id = record.execution_id,
            ),
            "an attempt of the same execution is still in flight",
        ),
        UncertainReason::ResultNotKept => (
            format!(
                "{tool} completed (execution {id}, target status {status}) but its result was not kept, so it cannot be shown again. \
                 It was NOT run again.",
                tool = record.tool,
                id = record.execution_id,
                status = record
                    .target_status
                    .map_or_else(|| "unknown".to_owned(), |s| s.to_string()),
            ),
            "the result was not kept (contract or size cap) and re-running could repeat the effect",
        ),
    };
    tool_error(id, era, record, text, why)
}

/// The answer when a caller stops asking and the outcome is still unknown: every attempt
/// it allowed lost its answer.
pub(crate) fn unanswered(id: &RequestId, era: Era, record: &ExecutionRecord) -> Response<Bytes> {
    if record.state == crate::execution::ExecutionState::NeedsReview {
        return uncertain(id, era, record, UncertainReason::NeedsReview);
    }
    let text = format!(
        "The outcome of {tool} is unknown: it was sent ({attempts} attempt(s), execution {id}) and every answer was lost. \
         It was not sent again now. Asking again with the same call lets the guard decide from its ledger \
         ({class}: {next}).",
        tool = record.tool,
        attempts = record.attempts,
        id = record.execution_id,
        class = record.retry_class,
        next = match record.retry_class {
            crate::execution::RetryClass::ReadOnly | crate::execution::RetryClass::Idempotent =>
                "it is sent again under the same Idempotency-Key",
            crate::execution::RetryClass::Recoverable => "its status is probed first",
            crate::execution::RetryClass::Irreversible => "it is held for review, never sent again",
        },
    );
    tool_error(
        id,
        era,
        record,
        text,
        "every attempt the caller allowed lost its answer",
    )
}

/// The recorded denial, repeated.
pub(crate) fn denied(id: &RequestId, era: Era, record: &ExecutionRecord) -> Response<Bytes> {
    let reason = record.reason.as_deref().unwrap_or("denied");
    let text = format!(
        "{} was not run: authorization denied it ({reason}). Execution {}.",
        record.tool, record.execution_id
    );
    tool_error(id, era, record, text, "authorization denied this execution")
}

fn tool_error(
    id: &RequestId,
    era: Era,
    record: &ExecutionRecord,
    text: String,
    why: &str,
) -> Response<Bytes> {
    let mut structured = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut structured {
        map.insert("why_not_resent".into(), why.into());
    }
    json_response(
        StatusCode::OK,
        &json!({
            "jsonrpc": "2.0",
            "id": id,
            "result": result_for(era, json!({
                "content": [{"type": "text", "text": text}],
                "isError": true,
                "structuredContent": {STRUCTURED_KEY: structured},
            })),
        }),
    )
}

/// The answer to a request refused unsent because it is not one the crate can pass on (see
/// [`ClassifyError::jsonrpc_code`]): HTTP 400 with the era's code; for an unsupported
/// revision, `data.supported` (the revisions this crate speaks) and `data.requested`.
pub fn refused_request(error: &ClassifyError, id: Option<&RequestId>) -> Response<Bytes> {
    let code = error.jsonrpc_code();
    let mut error_object = json!({"code": code, "message": format!("{error}; nothing was sent")});
    if let ClassifyError::UnsupportedProtocolVersion(unsupported) = error {
        let supported: Vec<&str> = ProtocolVersion::ALL.iter().map(|v| v.as_str()).collect();
        error_object["data"] = json!({"supported": supported, "requested": unsupported.0});
    }
    let body = match id {
        Some(id) => json!({"jsonrpc": "2.0", "id": id, "error": error_object}),
        None => json!({"jsonrpc": "2.0", "error": error_object}),
    };
    json_response(StatusCode::BAD_REQUEST, &body)
}

/// A JSON-RPC error response (`application/json`) for the request `id`.
///
/// Without a known id the response has no `id` member: MCP's schema allows that and not
/// `"id": null`. The error object is the same in every era.
pub fn jsonrpc_error(
    status: StatusCode,
    id: Option<&RequestId>,
    code: i64,
    message: String,
) -> Response<Bytes> {
    let error = json!({"code": code, "message": message});
    let body = match id {
        Some(id) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
        None => json!({"jsonrpc": "2.0", "error": error}),
    };
    json_response(status, &body)
}
