//! One call through the guard: classify, then pass through, resume, or decide and act.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;
use tracing::Instrument;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, UncertainReason, answer,
    future::{Answer, answered},
    inflight::{Acquired, Inflight, Owner},
    intent::{Intent, request_target},
    layer::Config,
    probe::Probed,
};

use crate::{
    Actor,
    decide::{
        call::{Decision, Facts, decide},
        flight::{AfterWait, Waited, after_wait},
    },
    execution::{self, EventKind, ExecutionRecord, ExecutionState, RetryClass},
    observe::{self, Settlement, Unread},
    protocol::{self, Era, Message, RequestKind, ResumeKey, tap::EventTap},
};

use crate::ledger::IntentKey;

/// How many times one call decides again because another attempt moved its execution on
/// between its decision and its write, before it answers "in progress".
pub(super) const MAX_DECISIONS: usize = 8;

/// A ledger that linked another actor's (or intent's) execution to a call: never handed back.
pub(super) fn foreign_link() -> GuardError {
    GuardError::ledger(crate::ledger::LedgerError::Storage(
        "the ledger linked an execution of another actor or intent to this call; nothing was \
         handed back or sent"
            .into(),
    ))
}

/// One call through the guard, with its own clone of the inner service.
pub(super) struct Call<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
    pub(super) inflight: Arc<Inflight>,
}

/// What [`Call::own`] acts on: a decision, or the end of a wait for another process's attempt.
enum Decided {
    /// Act on `decision` for `record`; `attempt_alive`: a live attempt elsewhere owns it.
    On {
        decision: Decision,
        record: ExecutionRecord,
        attempt_alive: bool,
    },
    /// The other process's attempt completed while this call waited: its answer is this call's.
    Completed(ExecutionRecord),
    /// The wait ran out: the other attempt is still in progress.
    InProgress(ExecutionRecord),
}

impl<S, RB> Call<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    pub(super) async fn run<B>(self, request: Request<B>) -> Answer<RB>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        let (parts, body) = request.into_parts();
        let max = self.config.max_body_bytes;
        let bytes = match observe::collect(body, max).await {
            Ok(bytes) => bytes,
            Err(Unread::TooLarge) => {
                return answered(answer::jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    None,
                    -32600,
                    format!(
                        "the request body is larger than the guard's {max}-byte limit; nothing was sent"
                    ),
                ));
            }
            Err(Unread::Failed(error)) => return Err(GuardError::request_body(error)),
        };
        let classified = protocol::classify_bytes(&parts.method, &parts.headers, &bytes);
        let mut parts = parts;
        if let Ok(c) = &classified {
            protocol::headers::add_standard_headers(&mut parts.headers, c);
        }
        let era = classified.as_ref().map_or(Era::Sessions, |c| c.era());
        let call = match classified {
            Ok(c) => match c.kind {
                RequestKind::Message(Message::ToolCall(call)) => (call, c.session_id),
                RequestKind::Resume { last_event_id } => {
                    return self
                        .resume(parts, bytes, &last_event_id, c.session_id)
                        .await;
                }
                ref kind @ RequestKind::Batch(_) if kind.tool_calls().next().is_some() => {
                    return answered(answer::jsonrpc_error(
                        StatusCode::BAD_REQUEST,
                        None,
                        -32600,
                        "a JSON-RPC batch carrying tools/call cannot be guarded; send each tools/call in its own request".into(),
                    ));
                }
                RequestKind::Message(Message::Request { id, method })
                    if method == protocol::tools_list::TOOLS_LIST
                        && self.config.watches_list_of(&parts) =>
                {
                    return self.list_tools(parts, bytes, id).await;
                }
                _ => return self.pass_through(parts, bytes).await,
            },
            // A revision this crate does not speak: the server answers what cannot run a
            // tool (its refusal names the revisions it speaks); a possible call is refused.
            Err(protocol::ClassifyError::UnsupportedProtocolVersion(_))
                if !protocol::may_call_a_tool(&bytes) =>
            {
                return self.pass_through(parts, bytes).await;
            }
            Err(error) if parts.method == http::Method::POST => {
                return answered(answer::refused_request(
                    &error,
                    protocol::request_id_of(&bytes).as_ref(),
                ));
            }
            Err(_) => return self.pass_through(parts, bytes).await,
        };
        let (call, session_id) = call;
        let intent = match self.intent(&parts, call, session_id, era) {
            Ok(intent) => intent,
            Err(response) => return answered(*response),
        };
        if intent.class == RetryClass::ReadOnly {
            return self.pass_through(parts, bytes).await;
        }
        if intent.call.has_inexact_number() {
            return answered(answer::jsonrpc_error(
                StatusCode::OK,
                Some(&intent.call.id),
                -32602,
                format!("{}; nothing was sent", protocol::INEXACT_NUMBER),
            ));
        }
        if self.config.key_of_another_actor(&intent).await? {
            return answered(answer::jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Some(&intent.call.id),
                -32600,
                "the Idempotency-Key names an execution this caller did not start; send the call \
                 without it, or with a key of its own; nothing was sent"
                    .into(),
            ));
        }
        let span = tracing::info_span!(
            "tools_call",
            tool = %intent.call.name,
            fingerprint = %intent.fingerprint.short(),
            execution_id = tracing::field::Empty,
            decision = tracing::field::Empty,
        );
        self.guarded(parts, bytes, intent).instrument(span).await
    }

    /// A GET with `Last-Event-ID`: never a re-issue. When it continues the broken stream of an
    /// execution, the answer it brings completes that execution.
    pub(super) async fn resume(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        last_event_id: &str,
        session_id: Option<String>,
    ) -> Answer<RB> {
        // A broken stream belongs to the actor whose call it answered: another actor's GET
        // with its event id is refused unsent (the target would replay that call's answer
        // to it), and neither takes nor completes the execution.
        let actor = parts
            .extensions
            .get::<Actor>()
            .unwrap_or(&self.config.actor)
            .clone();
        // The same event id on another endpoint or session is another stream.
        let target = request_target(&parts, self.config.target.as_ref());
        let key = ResumeKey::new(target.clone(), session_id.clone(), last_event_id);
        let Some((_, link)) = self
            .inflight
            .resume_links
            .remove_if(&key, |_, link| link.actor == actor)
        else {
            if self.inflight.resume_links.contains_key(&key) {
                tracing::warn!("a resume of another actor's stream was refused");
                return answered(answer::jsonrpc_error(
                    StatusCode::FORBIDDEN,
                    None,
                    -32600,
                    "this stream answers another caller's call: it is not resumed for this one; \
                     nothing was sent"
                        .into(),
                ));
            }
            return self.pass_through(parts, bytes).await;
        };
        tracing::info!(execution_id = %link.execution_id, %last_event_id, "a resume stream continues an execution");
        let (body, _) = GuardRequestBody::new(bytes);
        let mut response = match self.send(Request::from_parts(parts, body)).await {
            Ok(response) => response,
            Err(error) => {
                // Nothing came of this resume: the stream is still the execution's to resume,
                // and the caller still owes its call an answer.
                let (execution_id, request_id) = (link.execution_id, link.request_id.clone());
                self.inflight.link(key, link);
                return Err(GuardError::inner(error).resuming(execution_id, request_id));
            }
        };
        if !response.status().is_success() {
            return Ok(response.map(GuardResponseBody::passthrough));
        }
        let tap = response.extensions_mut().remove::<EventTap>();
        let mut recorder = self.recorder(
            link.actor,
            link.execution_id,
            link.request_id,
            response.status().as_u16(),
            (target, session_id),
        );
        recorder.keep_results = link.keep_results;
        recorder.max_result_bytes = link.max_result_bytes;
        recorder.last_event_id = Some(last_event_id.to_owned());
        recorder.resume = true;
        let max = self.config.max_body_bytes.max(link.max_result_bytes);
        Ok(response.map(|b| GuardResponseBody::observed(b, recorder, true, max, tap)))
    }

    pub(super) async fn pass_through(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
    ) -> Answer<RB> {
        let (body, _) = GuardRequestBody::new(bytes);
        let response = self
            .send(Request::from_parts(parts, body))
            .await
            .map_err(GuardError::inner)?;
        Ok(response.map(GuardResponseBody::passthrough))
    }

    pub(super) async fn send(
        &mut self,
        request: Request<GuardRequestBody>,
    ) -> Result<Response<RB>, BoxError> {
        // Ready right before the send: no slot below is held across ledger work.
        std::future::poll_fn(|cx| self.inner.poll_ready(cx))
            .await
            .map_err(Into::into)?;
        self.inner.call(request).await.map_err(Into::into)
    }

    pub(super) async fn guarded(
        self,
        parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
    ) -> Answer<RB> {
        let key = IntentKey::new(
            intent.actor.clone(),
            intent.intent_scope.clone(),
            intent.fingerprint,
        );
        loop {
            let mut settled = match self.inflight.acquire(key.clone()) {
                Acquired::Owner(owner) => return self.own(parts, bytes, intent, owner).await,
                Acquired::Waiter(receiver) => receiver,
            };
            tracing::Span::current().record("decision", "attach");
            let wait = async {
                settled
                    .wait_for(Option::is_some)
                    .await
                    .map(|value| value.clone())
            };
            intent
                .waited
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let waited = match tokio::time::timeout(self.config.attach_timeout, wait).await {
                Ok(Ok(Some(Settlement::Completed {
                    execution_id,
                    result,
                }))) => Waited::Completed((execution_id, result)),
                // Any other outcome, or the owner went away without settling.
                Ok(_) => Waited::Moved,
                Err(_) => Waited::TimedOut,
            };
            match after_wait(waited) {
                AfterWait::HandBack((execution_id, result)) => {
                    let record = self
                        .config
                        .ledger
                        .get(execution_id)
                        .await
                        .map_err(GuardError::ledger)?;
                    if let Some(record) = record
                        && let Some(response) = self
                            .config
                            .hand_back(&record, &intent, result, None)
                            .await?
                    {
                        return Ok(response);
                    }
                    // Gone from the index (or not this caller's): decide again.
                }
                AfterWait::DecideAgain => {}
                AfterWait::InProgress => {
                    let claimed = self.config.claim(&intent).await?;
                    return answered(answer::uncertain(
                        &intent.call.id,
                        intent.era,
                        claimed.record(),
                        UncertainReason::InProgress,
                    ));
                }
            }
        }
    }

    /// This call owns the intent in this process: decide and act.
    ///
    /// Every write between the decision and the send is conditional on what the decision saw
    /// (the state machine refuses a second `authorized`, a `dispatched` whose attempt is not
    /// new, an `unknown` for an attempt that is no longer the latest). When one is refused,
    /// another attempt (in another process) moved the execution on meanwhile: nothing was
    /// sent, and the call decides again from the ledger, which then attaches to that attempt.
    ///
    /// Longer than most functions here: it is the decision table's `match`, kept in one piece
    /// so that the path from a claim to a send reads top to bottom.
    pub(super) async fn own(
        mut self,
        parts: http::request::Parts,
        bytes: Bytes,
        intent: Intent,
        owner: Owner,
    ) -> Answer<RB> {
        let has_probe = intent.probe.is_some();
        let reply_id = intent.call.id.clone();
        for _ in 0..MAX_DECISIONS {
            let (decision, mut record, attempt_alive) =
                match self.decide_or_wait(&intent, has_probe).await? {
                    Decided::On {
                        decision,
                        record,
                        attempt_alive,
                    } => (decision, record, attempt_alive),
                    Decided::Completed(current) => {
                        let stored = self.config.kept_result(&current).await?;
                        return self
                            .config
                            .hand_back(&current, &intent, stored, Some(owner))
                            .await?
                            .map_or_else(|| Err(foreign_link()), Ok);
                    }
                    Decided::InProgress(record) => {
                        return answered(answer::uncertain(
                            &reply_id,
                            intent.era,
                            &record,
                            UncertainReason::InProgress,
                        ));
                    }
                };
            let span = tracing::Span::current();
            span.record("execution_id", tracing::field::display(record.execution_id));
            span.record("decision", tracing::field::debug(decision));
            tracing::info!(state = record.state.as_str(), "decided");
            let id = record.execution_id;
            // A dispatched execution whose attempt is gone has an unknown outcome: record it
            // so (only if that attempt is still the latest).
            if execution::is_orphaned(&record, attempt_alive)
                && !matches!(decision, Decision::Start)
            {
                match self
                    .config
                    .mark_unknown(&record, "the attempt ended before its outcome was observed")
                    .await?
                {
                    Some(unknown) => record = unknown,
                    None => continue,
                }
            }
            let to_send = match decision {
                // Created with its first dispatch recorded ([`Config::claim_to_start`]).
                Decision::Start if record.state == ExecutionState::Dispatched => {
                    let key = intent.dispatch().key(&record);
                    return self
                        .send_dispatched(parts, bytes, intent, record, key, owner)
                        .await;
                }
                Decision::Start | Decision::Continue => {
                    if matches!(record.state, ExecutionState::Accepted) {
                        match self.config.authorize(&record, &intent).await {
                            Ok(Some(denied)) => {
                                owner.settle(Settlement::Other);
                                return answered(answer::denied(&reply_id, intent.era, &denied));
                            }
                            Ok(None) => {
                                match self.config.append_moved(id, EventKind::Authorized).await? {
                                    Some(authorized) => record = authorized,
                                    None => continue,
                                }
                            }
                            Err(e) if e.is_ledger_transition() => continue,
                            Err(e) => return Err(e),
                        }
                    }
                    record
                }
                Decision::Resend => record,
                // Attachment happened before the claim; it never turns into a re-send here.
                Decision::Attach => {
                    return answered(answer::uncertain(
                        &reply_id,
                        intent.era,
                        &record,
                        UncertainReason::InProgress,
                    ));
                }
                Decision::Probe => match self.probe(&parts, &intent, record).await? {
                    Probed::Applied(record, result) => {
                        return self
                            .config
                            .hand_back(&record, &intent, result, Some(owner))
                            .await?
                            .map_or_else(|| Err(foreign_link()), Ok);
                    }
                    Probed::NotApplied(record) => record,
                    Probed::Answer(response) => return answered(response),
                    Probed::Moved => continue,
                },
                Decision::ReturnStored => {
                    let stored = self.config.kept_result(&record).await?;
                    return self
                        .config
                        .hand_back(&record, &intent, stored, Some(owner))
                        .await?
                        .map_or_else(|| Err(foreign_link()), Ok);
                }
                Decision::RepeatDenial => {
                    return answered(answer::denied(&reply_id, intent.era, &record));
                }
                Decision::Uncertain(reason) => {
                    return self.uncertain(record, &intent, reason).await;
                }
            };
            // Recorded before anything leaves; refused when another attempt moved the
            // execution on since this call decided: then nothing is sent, and it decides again.
            match self.config.record_dispatch(&intent, &to_send).await? {
                Some((record, key)) => {
                    return self
                        .send_dispatched(parts, bytes, intent, record, key, owner)
                        .await;
                }
                None => continue,
            }
        }
        // Moved on under this call every time it decided: another attempt is busy with it.
        let claimed = self.config.claim(&intent).await?;
        answered(answer::uncertain(
            &reply_id,
            intent.era,
            claimed.record(),
            UncertainReason::InProgress,
        ))
    }

    /// Claims and decides; while another process's guard owns the execution, waits (bounded)
    /// for it to move on and decides again.
    async fn decide_or_wait(
        &mut self,
        intent: &Intent,
        has_probe: bool,
    ) -> Result<Decided, GuardError> {
        let mut claimed = self.config.claim_to_start(intent).await?;
        loop {
            let task_known = claimed.record().correlation.task_id.is_some();
            let attempt_alive = self.config.attempt_elsewhere(&claimed).await;
            let facts = Facts {
                attempt_alive,
                has_probe,
                task_known,
            };
            let decision = decide(&claimed, facts);
            if decision != Decision::Attach {
                let record = claimed.record().clone();
                return Ok(Decided::On {
                    decision,
                    record,
                    attempt_alive,
                });
            }
            intent
                .waited
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let waited = match self.config.wait_for_other_attempt(claimed.record()).await? {
                Some(current) if current.state == ExecutionState::Completed => {
                    Waited::Completed(current)
                }
                Some(_) => Waited::Moved,
                None => Waited::TimedOut,
            };
            match after_wait(waited) {
                AfterWait::HandBack(current) => return Ok(Decided::Completed(current)),
                AfterWait::DecideAgain => claimed = self.config.claim_to_start(intent).await?,
                AfterWait::InProgress => {
                    return Ok(Decided::InProgress(claimed.record().clone()));
                }
            }
        }
    }

    /// The honest answer of an execution whose outcome is unknown; one that is not re-sent is
    /// recorded `needs_review` first.
    async fn uncertain(
        &mut self,
        mut record: ExecutionRecord,
        intent: &Intent,
        reason: UncertainReason,
    ) -> Answer<RB> {
        if reason == UncertainReason::NeedsReview && record.state != ExecutionState::NeedsReview {
            let why = format!(
                "unknown outcome; a tool of class {} is not re-sent",
                record.retry_class
            );
            record = self
                .config
                .append_or_current(record.execution_id, EventKind::NeedsReview { reason: why })
                .await?;
        }
        tracing::warn!(
            state = record.state_label(),
            "answered with an uncertain result"
        );
        answered(answer::uncertain(
            &intent.call.id,
            intent.era,
            &record,
            reason,
        ))
    }
}
