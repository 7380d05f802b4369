//! `Turn`: the owner of an intent decides from the ledger and turns the decision into an
//! [`Action`], writing first what the decision needs written.
//!
//! Every write between the decision and the send is conditional on what the decision saw (the
//! state machine refuses a second `authorized`, a `dispatched` whose attempt is not new, an
//! `unknown` for an attempt that is no longer the latest). When one is refused, another
//! attempt (in another process) moved the execution on meanwhile: nothing was sent, and the
//! turn decides again from the ledger, which then attaches to that attempt.

use super::{
    GuardError, UncertainReason, action::Action, answer, dispatched::Dispatched,
    ledger_step::LedgerStep, owner::Owner, probe::Probed, reply::Reply, task_probe::TaskProbe,
};

use crate::{
    IdempotencyKey,
    contract::ProbeOutcome,
    decide::{
        call::{Decision, Facts, authorizes_first, decide, settles_orphan_first},
        flight::{AfterWait, Waited, after_wait},
    },
    execution::{EventKind, ExecutionRecord, ExecutionState},
    observe::Settlement,
};

/// A call answered from `record` without the target: its outcome is the execution's state.
fn answered_from(record: &ExecutionRecord) {
    tracing::Span::current().record("outcome", record.state.as_str());
}

/// How many times one call decides again because another attempt moved its execution on
/// between its decision and its write, before it answers "in progress".
const MAX_DECISIONS: usize = 8;

/// A ledger that linked another actor's (or intent's) execution to a call: never handed back.
fn foreign_link() -> GuardError {
    GuardError::ledger(crate::ledger::LedgerError::Storage(
        "the ledger linked an execution of another actor or intent to this call; nothing was \
         handed back or sent"
            .into(),
    ))
}

/// One owned call deciding: its ledger step, its ownership of the intent, and how many more
/// times it may decide again.
pub(super) struct Turn<'a> {
    step: LedgerStep<'a>,
    owner: Owner,
    decisions_left: usize,
    /// The last decision and its execution, counted once when the call acts on it.
    decided: Option<(Decision, crate::ExecutionId)>,
}

/// What [`Turn::decide_or_wait`] acts on: a decision, or the end of a wait for another
/// process's attempt.
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

/// What a status probe's answer leaves to do.
enum AfterProbe {
    Act(Action),
    /// Not applied: dispatch `record` again under its key.
    Send(ExecutionRecord),
    /// Another attempt moved the execution: decide again.
    DecideAgain,
}

impl<'a> Turn<'a> {
    pub(super) fn new(step: LedgerStep<'a>, owner: Owner) -> Self {
        Self {
            step,
            owner,
            decisions_left: MAX_DECISIONS,
            decided: None,
        }
    }

    /// The attempt an [`Action::Send`] names, owned by this call from here on.
    pub(super) fn into_dispatched(
        self,
        record: ExecutionRecord,
        key: IdempotencyKey,
    ) -> Dispatched {
        Dispatched {
            record,
            key,
            owner: self.owner,
        }
    }

    /// Decides (again while another attempt moves the execution under it) and writes what the
    /// decision needs before its action; the decision it acts on is counted.
    pub(super) async fn next(&mut self) -> Result<Action, GuardError> {
        let action = self.decide_and_write().await;
        if let Some((decision, id)) = self.decided.take() {
            crate::metrics::decided(&self.step.intent.call.name, decision.label());
            if let Some(answer) = decision.repeat_answer()
                && action.is_ok()
            {
                self.step.note_repeat(id, answer).await;
            }
        }
        action
    }

    async fn decide_and_write(&mut self) -> Result<Action, GuardError> {
        let step = self.step;
        while self.decisions_left > 0 {
            self.decisions_left -= 1;
            let (decision, mut record, attempt_alive) = match self.decide_or_wait().await? {
                Decided::On {
                    decision,
                    record,
                    attempt_alive,
                } => (decision, record, attempt_alive),
                Decided::Completed(current) => {
                    self.decided = Some((Decision::Attach, current.execution_id));
                    let stored = step.kept_result(&current).await?;
                    return self.hand_back(&current, stored);
                }
                Decided::InProgress(record) => {
                    self.decided = Some((Decision::Attach, record.execution_id));
                    return Ok(self.in_progress(&record));
                }
            };
            self.decided = Some((decision, record.execution_id));
            let span = tracing::Span::current();
            span.record("execution_id", tracing::field::display(record.execution_id));
            span.record("decision", decision.label());
            tracing::info!(state = record.state.as_str(), "decided");
            let id = record.execution_id;
            if settles_orphan_first(&record, attempt_alive, decision) {
                match step
                    .mark_unknown(&record, "the attempt ended before its outcome was observed")
                    .await?
                {
                    Some(unknown) => record = unknown,
                    None => continue,
                }
            }
            if authorizes_first(&record, decision) {
                match step.authorize(&record).await {
                    Ok(Some(denied)) => {
                        self.owner.settle(Settlement::Other);
                        return Ok(self.reply(answer::denied(
                            &step.intent.call.id,
                            step.intent.era,
                            &denied,
                        )));
                    }
                    Ok(None) => match step.append_moved(id, EventKind::Authorized).await? {
                        Some(authorized) => record = authorized,
                        None => continue,
                    },
                    Err(e) if e.is_ledger_transition() => continue,
                    Err(e) => return Err(e),
                }
            }
            let to_send = match decision {
                // Created with its first dispatch recorded ([`LedgerStep::claim_to_start`]).
                Decision::Start if record.state == ExecutionState::Dispatched => {
                    let key = step.intent.dispatch().key(&record);
                    return Ok(Action::Send { record, key });
                }
                Decision::Start | Decision::Continue | Decision::Resend => record,
                // Attachment happened before the claim; it never turns into a re-send here.
                Decision::Attach => return Ok(self.in_progress(&record)),
                Decision::Probe => {
                    // A call that became an MCP task is asked about with `tasks/get`, which
                    // the call sends.
                    if let Some(task_id) = &record.correlation.task_id {
                        let probe = TaskProbe::new(task_id.clone());
                        return Ok(Action::AskTask { record, probe });
                    }
                    let outcome = Probed::ask_tool(step, &record).await;
                    match self.after_probe(record, outcome).await? {
                        AfterProbe::Act(action) => return Ok(action),
                        AfterProbe::Send(record) => record,
                        AfterProbe::DecideAgain => continue,
                    }
                }
                Decision::ReturnStored => {
                    let stored = step.kept_result(&record).await?;
                    return self.hand_back(&record, stored);
                }
                Decision::RepeatDenial => {
                    answered_from(&record);
                    return Ok(self.reply(answer::denied(
                        &step.intent.call.id,
                        step.intent.era,
                        &record,
                    )));
                }
                Decision::Uncertain(reason) => return self.uncertain(record, reason).await,
            };
            if let Some(action) = self.dispatch(&to_send).await? {
                return Ok(action);
            }
        }
        // Moved on under this call every time it decided: another attempt is busy with it.
        let claimed = step.claim().await?;
        Ok(self.in_progress(claimed.record()))
    }

    /// Goes on from the outcome of the `tasks/get` an [`Action::AskTask`] asked.
    pub(super) async fn probed(
        &mut self,
        record: ExecutionRecord,
        outcome: ProbeOutcome,
    ) -> Result<Action, GuardError> {
        match self.after_probe(record, outcome).await? {
            AfterProbe::Act(action) => Ok(action),
            AfterProbe::Send(record) => match self.dispatch(&record).await? {
                Some(action) => Ok(action),
                None => self.next().await,
            },
            AfterProbe::DecideAgain => self.next().await,
        }
    }

    /// Records `dispatched` before anything leaves; `None` when another attempt moved the
    /// execution on since this call decided: then nothing is sent, and it decides again.
    async fn dispatch(&mut self, record: &ExecutionRecord) -> Result<Option<Action>, GuardError> {
        Ok(self
            .step
            .record_dispatch(record)
            .await?
            .map(|(record, key)| Action::Send { record, key }))
    }

    async fn after_probe(
        &mut self,
        record: ExecutionRecord,
        outcome: ProbeOutcome,
    ) -> Result<AfterProbe, GuardError> {
        Ok(match Probed::of(self.step, record, outcome).await? {
            Probed::Applied(record, result) => AfterProbe::Act(self.hand_back(&record, result)?),
            Probed::NotApplied(record) => AfterProbe::Send(record),
            Probed::Answer(response) => AfterProbe::Act(self.reply(response)),
            Probed::Moved => AfterProbe::DecideAgain,
        })
    }

    /// Claims and decides; while another process's guard owns the execution, waits (bounded)
    /// for it to move on and decides again.
    async fn decide_or_wait(&mut self) -> Result<Decided, GuardError> {
        let step = self.step;
        let has_probe = step.intent.probe.is_some();
        let mut claimed = step.claim_to_start().await?;
        loop {
            let task_known = claimed.record().correlation.task_id.is_some();
            let attempt_alive = step.attempt_elsewhere(&claimed).await;
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
            step.intent
                .waited
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let waited = match step.wait_for_other_attempt(claimed.record()).await? {
                Some(current) if current.state == ExecutionState::Completed => {
                    Waited::Completed(current)
                }
                Some(_) => Waited::Moved,
                None => Waited::TimedOut,
            };
            match after_wait(waited) {
                AfterWait::HandBack(current) => return Ok(Decided::Completed(current)),
                AfterWait::DecideAgain => claimed = step.claim_to_start().await?,
                AfterWait::InProgress => {
                    return Ok(Decided::InProgress(claimed.record().clone()));
                }
            }
        }
    }

    fn hand_back(
        &mut self,
        record: &ExecutionRecord,
        result: Option<bytes::Bytes>,
    ) -> Result<Action, GuardError> {
        answered_from(record);
        self.step
            .hand_back(record, result, Some(&mut self.owner))
            .map(Action::Reply)
            .ok_or_else(foreign_link)
    }

    fn reply(&self, response: http::Response<bytes::Bytes>) -> Action {
        Action::Reply(Reply::from(response))
    }

    fn in_progress(&self, record: &ExecutionRecord) -> Action {
        answered_from(record);
        let intent = self.step.intent;
        self.reply(answer::uncertain(
            &intent.call.id,
            intent.era,
            record,
            UncertainReason::InProgress,
        ))
    }

    /// The honest answer of an execution whose outcome is unknown; one that is not re-sent is
    /// recorded `needs_review` first.
    async fn uncertain(
        &mut self,
        mut record: ExecutionRecord,
        reason: UncertainReason,
    ) -> Result<Action, GuardError> {
        if reason == UncertainReason::NeedsReview && record.state != ExecutionState::NeedsReview {
            let why = format!(
                "unknown outcome; a tool of class {} is not re-sent",
                record.retry_class
            );
            record = self
                .step
                .append_or_current(record.execution_id, EventKind::NeedsReview { reason: why })
                .await?;
        }
        tracing::info!(
            state = record.state_label(),
            "answered with an uncertain result"
        );
        answered_from(&record);
        let intent = self.step.intent;
        Ok(self.reply(answer::uncertain(
            &intent.call.id,
            intent.era,
            &record,
            reason,
        )))
    }
}
