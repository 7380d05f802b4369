//! `Local`: what this process learns of an observed call's outcome.

use std::sync::Arc;

use super::{config::Config, inflight::Inflight, resume_link::ResumeLink};

use crate::{
    Actor, ExecutionId, Target,
    observe::{Recorder, Watchers, Write},
    protocol::{RequestId, ResumeKey},
};

impl Local {
    /// The recorder of a response the guard observes for `actor`'s call, with this process's
    /// single flight and resume links as its watchers.
    pub(super) fn recorder(
        config: &Config,
        inflight: &Arc<Inflight>,
        actor: Actor,
        execution_id: ExecutionId,
        request_id: RequestId,
        status: u16,
        stream: (Target, Option<String>),
    ) -> Recorder {
        let mut recorder = Recorder::new(config.ledger.clone(), execution_id, request_id);
        recorder.status = status;
        recorder.drain_timeout = config.drain_timeout;
        recorder.deliver_at_end = true;
        recorder.span = tracing::Span::current();
        recorder.span.record("status", status);
        recorder.watchers = Some(Arc::new(Local {
            actor,
            inflight: inflight.clone(),
            stream,
        }));
        recorder
    }
}

/// What this process learns of an observed call's outcome: a broken stream becomes a resume
/// link of the call's actor; writes from a `Drop` and drains count as background work.
pub(super) struct Local {
    pub(super) actor: Actor,
    pub(super) inflight: Arc<Inflight>,
    /// The stream's target and session: with an event id, the key a resume GET links by.
    pub(super) stream: (Target, Option<String>),
}

impl Watchers for Local {
    fn broke_at(&self, last_event_id: &str, recorder: &Recorder) {
        let link = ResumeLink {
            actor: self.actor.clone(),
            execution_id: recorder.execution_id,
            request_id: recorder.request_id.clone(),
            keep_results: recorder.keep_results,
            max_result_bytes: recorder.max_result_bytes,
        };
        let (target, session_id) = self.stream.clone();
        let key = ResumeKey::new(target, session_id, last_event_id.to_owned());
        self.inflight.link(key, link);
    }

    fn track(&self, write: Write) -> Write {
        self.inflight.tracked(write)
    }

    fn drain(&self) -> (Box<dyn Send>, Write) {
        let work = self.inflight.background_task();
        (Box::new(work), Box::pin(self.inflight.stopped()))
    }
}
