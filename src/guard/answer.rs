//! Responses the guard writes itself, instead of the target's.
//!
//! The guard never invents a failure: a model that sees a fake failure tries again. When it
//! cannot hand back the target's result it answers the caller's request id with a
//! `CallToolResult` whose `isError` is true, a plain-language text, and `structuredContent`
//! holding the execution record and why nothing was re-sent.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header::CONTENT_TYPE};
use serde_json::{Value, json};

use super::UncertainReason;
use crate::{ledger::ExecutionRecord, protocol::RequestId};

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

/// The target's kept result, re-keyed to the caller's JSON-RPC id.
pub(crate) fn stored_result(id: &RequestId, result: &[u8]) -> Response<Bytes> {
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

/// The honest answer when the outcome is not known or not kept.
pub(super) fn uncertain(
    id: &RequestId,
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
    tool_error(id, record, text, why)
}

/// The recorded denial, repeated.
pub(super) fn denied(id: &RequestId, record: &ExecutionRecord) -> Response<Bytes> {
    let reason = record.reason.as_deref().unwrap_or("denied");
    let text = format!(
        "{} was not run: authorization denied it ({reason}). Execution {}.",
        record.tool, record.execution_id
    );
    tool_error(id, record, text, "authorization denied this execution")
}

fn tool_error(
    id: &RequestId,
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
            "result": {
                "content": [{"type": "text", "text": text}],
                "isError": true,
                "structuredContent": {STRUCTURED_KEY: structured},
            }
        }),
    )
}

/// A JSON-RPC error the guard answers with before anything is sent.
pub(crate) fn jsonrpc_error(
    status: StatusCode,
    id: Option<&RequestId>,
    code: i64,
    message: String,
) -> Response<Bytes> {
    json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    )
}
