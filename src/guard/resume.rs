//! `Resume`: a GET with `Last-Event-ID` that continues the broken stream of an execution. It is
//! never a re-issue: the answer it brings completes that execution.

use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::Body;

use super::{
    BoxError, GuardError, GuardResponseBody, answer, config::Config, future::Answer,
    inflight::Inflight, local::Local, resume_link::ResumeLink,
};

use crate::{
    Actor, Target,
    protocol::{ResumeKey, tap::EventTap},
};

/// A resume GET taken over from its stream's link: the guard observes its answer.
pub(super) struct Resume {
    key: ResumeKey,
    link: ResumeLink,
    stream: (Target, Option<String>),
    last_event_id: String,
}

impl Resume {
    /// Takes the link of the stream a resume GET continues, if its actor's call broke it.
    /// `Ok(None)`: no execution's stream (it passes through untouched).
    ///
    /// A broken stream belongs to the actor whose call it answered: another actor's GET with
    /// its event id is refused unsent (the target would replay that call's answer to it), and
    /// neither takes nor completes the execution. The same event id on another endpoint or
    /// session is another stream.
    pub(super) fn take(
        config: &Config,
        inflight: &Inflight,
        parts: &http::request::Parts,
        last_event_id: &str,
        session_id: Option<String>,
    ) -> Result<Option<Self>, Box<Response<Bytes>>> {
        let actor = parts.extensions.get::<Actor>().unwrap_or(&config.actor);
        let target = config.target_of(parts);
        let key = ResumeKey::new(target.clone(), session_id.clone(), last_event_id);
        let Some((_, link)) = inflight
            .resume_links
            .remove_if(&key, |_, link| link.actor == *actor)
        else {
            if inflight.resume_links.contains_key(&key) {
                tracing::warn!("a resume of another actor's stream was refused");
                return Err(Box::new(answer::jsonrpc_error(
                    StatusCode::FORBIDDEN,
                    None,
                    -32600,
                    "this stream answers another caller's call: it is not resumed for this one; \
                     nothing was sent"
                        .into(),
                )));
            }
            return Ok(None);
        };
        tracing::info!(execution_id = %link.execution_id, %last_event_id, "a resume stream continues an execution");
        Ok(Some(Self {
            key,
            link,
            stream: (target, session_id),
            last_event_id: last_event_id.to_owned(),
        }))
    }

    /// Nothing came of this resume: the stream is still the execution's to resume, and the
    /// caller still owes its call an answer.
    pub(super) fn failed(self, inflight: &Inflight, error: BoxError) -> GuardError {
        let (execution_id, request_id) = (self.link.execution_id, self.link.request_id.clone());
        inflight.link(self.key, self.link);
        GuardError::inner(error).resuming(execution_id, request_id)
    }

    /// The target's answer to the resume, observed: the result it carries completes the
    /// execution.
    pub(super) fn answered<RB>(
        self,
        config: &Config,
        inflight: &Arc<Inflight>,
        mut response: Response<RB>,
    ) -> Answer<RB>
    where
        RB: Body<Data = Bytes> + Send + 'static,
        RB::Error: Into<BoxError>,
    {
        if !response.status().is_success() {
            return Ok(response.map(GuardResponseBody::passthrough));
        }
        let tap = response.extensions_mut().remove::<EventTap>();
        let link = self.link;
        let mut recorder = Local::recorder(
            config,
            inflight,
            link.actor,
            link.execution_id,
            link.request_id,
            response.status().as_u16(),
            self.stream,
        );
        recorder.keep_results = link.keep_results;
        recorder.max_result_bytes = link.max_result_bytes;
        recorder.last_event_id = Some(self.last_event_id);
        recorder.resume = true;
        let max = config.max_body_bytes.max(link.max_result_bytes);
        Ok(response.map(|b| GuardResponseBody::observed(b, recorder, true, max, tap)))
    }
}
