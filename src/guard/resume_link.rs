//! `ResumeLink`: what a broken stream's resume needs of the call it answered.

use crate::{Actor, ExecutionId, protocol::RequestId};

/// A broken response stream of an execution, by its target, session and the last event id the
/// caller saw ([`ResumeKey`]): a GET of that stream with that `Last-Event-ID` (from a resume layer, or from a client that resumes by itself) belongs
/// to the execution, and a result that arrives on it completes the execution.
#[derive(Debug, Clone)]
pub(super) struct ResumeLink {
    pub(super) actor: Actor,
    pub(super) execution_id: ExecutionId,
    pub(super) request_id: RequestId,
    pub(super) keep_results: bool,
    pub(super) max_result_bytes: usize,
}
