//! `TaskProbe`: the built-in status probe of a call that became an MCP task, `tasks/get` (a
//! read) with the call's session, protocol version and `_meta`; sent by the call like any request.

use bytes::Bytes;
use http::Request;

use super::{GuardRequestBody, ProbeOutcome, answer, intent::Intent};

use crate::{
    ExecutionId, IDEMPOTENCY_KEY,
    protocol::{self, RequestId},
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
        let task_id = &self.task_id;
        let Some(task) =
            protocol::response::find_response(bytes, &RequestId::String(self.probe_id.clone()))
                .and_then(|m| m.get("result").cloned())
        else {
            return Self::unknown("no answer to tasks/get".into());
        };
        match task.get("status").and_then(serde_json::Value::as_str) {
            Some("completed") => ProbeOutcome::Applied {
                result: task.get("result").cloned(),
            },
            // The tool ran and failed: that is an outcome, and running it again could repeat
            // whatever it did before failing.
            Some("failed") => ProbeOutcome::Applied {
                result: Some(answer::result_for(
                    intent.era,
                    serde_json::json!({
                        "content": [{"type": "text", "text": format!("task {task_id} failed")}],
                        "isError": true,
                    }),
                )),
            },
            Some("working" | "input_required") => ProbeOutcome::InProgress,
            other => Self::unknown(format!("task status {other:?}")),
        }
    }
}
