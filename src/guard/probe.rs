//! Status probes: the tool's own, or `tasks/get` for a call that became an MCP task.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use tower_service::Service;

use super::{
    BoxError, GuardError, GuardRequestBody, ProbeOutcome, ProbeRequest, UncertainReason, answer,
    call::Call, intent::Intent,
};

use crate::{
    ExecutionId, IDEMPOTENCY_KEY,
    decide::probe::AfterProbe,
    execution::{EventKind, ExecutionRecord},
    protocol::{self, RequestId},
};

/// What a status probe led to.
pub(super) enum Probed {
    /// Applied, recorded as resolved: hand back its result (when kept).
    Applied(ExecutionRecord, Option<Bytes>),
    /// Not applied, recorded as resolved: send again under the same key.
    NotApplied(ExecutionRecord),
    /// The guard's own answer (in progress, held for review).
    Answer(Response<Bytes>),
    /// Another attempt settled or moved the execution meanwhile: decide again.
    Moved,
}

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    pub(super) async fn probe(
        &mut self,
        parts: &http::request::Parts,
        intent: &Intent,
        record: ExecutionRecord,
    ) -> Result<Probed, GuardError> {
        let outcome = match (&record.correlation.task_id, &intent.probe) {
            (Some(task_id), _) => {
                let task_id = task_id.clone();
                self.probe_task(parts, intent, &task_id).await
            }
            (None, Some(probe)) => {
                let request = ProbeRequest {
                    execution: &record,
                    arguments: intent.call.arguments(),
                };
                probe.clone().probe(request).await
            }
            (None, None) => ProbeOutcome::Unknown {
                reason: "no status probe".into(),
            },
        };
        tracing::info!(?outcome, "status probe answered");
        let id = record.execution_id;
        let reply_id = &intent.call.id;
        match AfterProbe::of(outcome) {
            AfterProbe::HandBack { result } => {
                let stored = match result.as_ref().map(serde_json::to_vec) {
                    Some(Ok(bytes))
                        if intent.keep_results && bytes.len() <= intent.max_result_bytes =>
                    {
                        let bytes = Bytes::from(bytes);
                        let reference = self
                            .config
                            .ledger
                            .store_result(id, bytes.clone())
                            .await
                            .map_err(GuardError::ledger)?;
                        Some((reference, bytes))
                    }
                    _ => None,
                };
                let resolved = EventKind::Resolved {
                    applied: true,
                    by: "probe".into(),
                    note: "the status probe found the action applied".into(),
                    result_reference: stored.as_ref().map(|(r, _)| r.clone()),
                    attempt: Some(record.attempts),
                };
                Ok(match self.config.append_moved(id, resolved).await? {
                    Some(record) => Probed::Applied(record, stored.map(|(_, result)| result)),
                    None => Probed::Moved,
                })
            }
            AfterProbe::Resend => {
                let resolved = EventKind::Resolved {
                    applied: false,
                    by: "probe".into(),
                    note: "the status probe found the action not applied; sent again under the same key".into(),
                    result_reference: None,
                    attempt: Some(record.attempts),
                };
                Ok(match self.config.append_moved(id, resolved).await? {
                    Some(record) => Probed::NotApplied(record),
                    None => Probed::Moved,
                })
            }
            AfterProbe::InProgress => Ok(Probed::Answer(answer::uncertain(
                reply_id,
                intent.era,
                &record,
                UncertainReason::InProgress,
            ))),
            AfterProbe::Review { reason } => {
                let review = EventKind::NeedsReview {
                    reason: format!("status probe: {reason}"),
                };
                Ok(match self.config.append_moved(id, review).await? {
                    Some(record) => Probed::Answer(answer::uncertain(
                        reply_id,
                        intent.era,
                        &record,
                        UncertainReason::NeedsReview,
                    )),
                    None => Probed::Moved,
                })
            }
        }
    }

    /// The built-in status probe of a call that became an MCP task: `tasks/get` (a read) through
    /// the inner service, with the call's session, protocol version and `_meta`.
    pub(super) async fn probe_task(
        &mut self,
        parts: &http::request::Parts,
        intent: &Intent,
        task_id: &str,
    ) -> ProbeOutcome {
        let probe_id = format!("mcp-replay-guard-probe-{}", ExecutionId::new().ulid());
        let body = protocol::headers::tasks_get(&probe_id, task_id, intent.call.meta.as_ref());
        let mut request = Request::new(GuardRequestBody::new(body).0);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = parts.uri.clone();
        *request.headers_mut() = parts.headers.clone();
        let headers = request.headers_mut();
        headers.remove(IDEMPOTENCY_KEY);
        headers.remove(http::header::CONTENT_LENGTH);
        protocol::headers::retarget_to_tasks_get(headers, task_id);
        let unknown = |reason: String| ProbeOutcome::Unknown { reason };
        let response = match self.send(request).await {
            Ok(response) if response.status().is_success() => response,
            Ok(response) => {
                return unknown(format!("tasks/get answered HTTP {}", response.status()));
            }
            Err(error) => return unknown(format!("tasks/get failed: {error}")),
        };
        let limit = self.config.max_body_bytes.max(intent.max_result_bytes);
        let bytes = match Limited::new(response.into_body(), limit).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => return unknown(format!("tasks/get answer unreadable: {error}")),
        };
        let Some(task) = protocol::response::find_response(&bytes, &RequestId::String(probe_id))
            .and_then(|m| m.get("result").cloned())
        else {
            return unknown("no answer to tasks/get".into());
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
            other => unknown(format!("task status {other:?}")),
        }
    }
}
