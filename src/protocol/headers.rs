//! The standard headers of a request and the requests the crate writes itself: what a layer
//! adds to a `POST`, and the `tasks/get` a status probe sends.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use super::{ClassifiedRequest, MCP_METHOD, MCP_NAME, Message, RequestKind, encode_header_value};

/// The method of the MCP Tasks extension's status read.
pub(crate) const TASKS_GET: &str = "tasks/get";

/// In 2026-07-28 a POST mirrors its body's method (and a tool call's name) in `Mcp-Method` /
/// `Mcp-Name`. Headers the caller set are kept (classification already checked them against
/// the body).
pub(crate) fn add_standard_headers(headers: &mut HeaderMap, request: &ClassifiedRequest) {
    let RequestKind::Message(message) = &request.kind else {
        return;
    };
    if !request.version.has_standard_headers() {
        return;
    }
    if let Some(method) = message.method()
        && !headers.contains_key(MCP_METHOD)
        && let Ok(value) = HeaderValue::from_str(method)
    {
        headers.insert(MCP_METHOD, value);
    }
    if let Message::ToolCall(call) = message
        && !headers.contains_key(MCP_NAME)
    {
        headers.insert(MCP_NAME, encode_header_value(&call.name));
    }
}

/// The body of a `tasks/get` for `task_id` under the JSON-RPC id `probe_id`, with the call's
/// `_meta` (its protocol version and client, in 2026-07-28).
pub(crate) fn tasks_get(probe_id: &str, task_id: &str, meta: Option<&Map<String, Value>>) -> Bytes {
    let mut params = serde_json::json!({ "taskId": task_id });
    if let Some(meta) = meta {
        params["_meta"] = Value::Object(meta.clone());
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": probe_id, "method": TASKS_GET, "params": params});
    Bytes::from(body.to_string())
}

/// Turns a call's headers into those of its `tasks/get`: where the call mirrored its method
/// in `Mcp-Method` (2026-07-28), the probe mirrors its own, and the task id in `Mcp-Name`.
pub(crate) fn retarget_to_tasks_get(headers: &mut HeaderMap, task_id: &str) {
    if headers.contains_key(MCP_METHOD) {
        headers.insert(MCP_METHOD, HeaderValue::from_static(TASKS_GET));
        headers.insert(MCP_NAME, encode_header_value(task_id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_get_carries_the_task_and_the_calls_meta() {
        let mut meta = Map::new();
        meta.insert("k".into(), Value::from(1));
        let body: Value = serde_json::from_slice(&tasks_get("p1", "t1", Some(&meta))).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"jsonrpc": "2.0", "id": "p1", "method": "tasks/get",
                "params": {"taskId": "t1", "_meta": {"k": 1}}})
        );
        let mut headers = HeaderMap::new();
        retarget_to_tasks_get(&mut headers, "t1");
        assert!(
            headers.is_empty(),
            "a 2025-era call has no Mcp-Method to mirror"
        );
        headers.insert(MCP_METHOD, HeaderValue::from_static("tools/call"));
        retarget_to_tasks_get(&mut headers, "t1");
        assert_eq!(headers[MCP_METHOD], "tasks/get");
        assert_eq!(headers[MCP_NAME], "t1");
    }
}
