//! `TaskProbe`: the built-in status probe of a call that became an MCP task, `tasks/get` (a
//! read) with the call's session, protocol version and `_meta`; sent by the call like any request.

use bytes::Bytes;
use http::Request;

use super::{GuardRequestBody, ProbeOutcome, answer, intent::Intent};

use crate::{
    ExecutionId, IDEMPOTENCY_KEY,
    protocol::{self, Era, RequestId},
};

/// One `tasks/get` about `task_id`, under a request id of its own.
pub(super) struct TaskProbe {
    probe_id: String,
    task_id: String,
}

impl TaskProbe {
    pub(super) fn new(task_id: String) -> Self {
        Self {
            probe_id: format!("mcp-replay-guard-probe-{}", ExecutionId::new().ulid()),
            task_id,
        }
    }

    /// The `tasks/get` request, on the call's URI and headers (without its key).
    pub(super) fn request(
        &self,
        parts: &http::request::Parts,
        intent: &Intent,
    ) -> Request<GuardRequestBody> {
        let body =
            protocol::headers::tasks_get(&self.probe_id, &self.task_id, intent.call.meta.as_ref());
        let mut request = Request::new(GuardRequestBody::new(body).0);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        let headers = request.headers_mut();
        headers.remove(IDEMPOTENCY_KEY);
        headers.remove(http::header::CONTENT_LENGTH);
        protocol::headers::retarget_to_tasks_get(headers, &self.task_id);
        request
    }

    /// The probe's outcome when `tasks/get` could not be asked or answered.
    pub(super) fn unknown(reason: String) -> ProbeOutcome {
        ProbeOutcome::Unknown { reason }
    }

    /// What the task's status, in the answer `bytes`, says of the call.
    pub(super) fn outcome(&self, bytes: &Bytes, intent: &Intent) -> ProbeOutcome {
        task_outcome(
            bytes,
            &RequestId::String(self.probe_id.clone()),
            &self.task_id,
            intent.era,
        )
    }
}

/// What the answer to a `tasks/get` about `task_id` (the JSON-RPC response under the id
/// `probe_id`, a JSON body or one SSE event's data) says of the call that became the task:
/// `completed` → applied, with the task's result; `failed` → applied (the tool ran and failed,
/// and running it again could repeat what it did before failing), with an error result in
/// `era`'s shape; `working` or `input_required` → in progress; anything else, and no answer
/// under `probe_id`, → unknown, with the reason.
///
/// The guard reads its own `tasks/get` probe with it, and so does a front end that asks a
/// target about a task for an operator (`replay-guard resolve --probe`).
pub fn task_outcome(bytes: &[u8], probe_id: &RequestId, task_id: &str, era: Era) -> ProbeOutcome {
    let Some(task) =
        protocol::response::find_response(bytes, probe_id).and_then(|m| m.get("result").cloned())
    else {
        return TaskProbe::unknown("no answer to tasks/get".into());
    };
    match task.get("status").and_then(serde_json::Value::as_str) {
        Some("completed") => ProbeOutcome::Applied {
            result: task.get("result").cloned(),
        },
        // The tool ran and failed: that is an outcome, and running it again could repeat
        // whatever it did before failing.
        Some("failed") => ProbeOutcome::Applied {
            result: Some(answer::result_for(
                era,
                serde_json::json!({
                    "content": [{"type": "text", "text": format!("task {task_id} failed")}],
                    "isError": true,
                }),
            )),
        },
        Some("working" | "input_required") => ProbeOutcome::InProgress,
        other => TaskProbe::unknown(format!("task status {other:?}")),
    }
}
