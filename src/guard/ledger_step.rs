//! `LedgerStep`: what one call writes to and reads from the ledger, between its intent and
//! its send: the claim (tried again on a storage failure), the dispatch recorded before
//! anything leaves, the writes the decision asks for, and the one hand-back of a finished
//! execution's result.

use std::sync::Arc;

use bytes::Bytes;

use super::{
    Authorization, AuthorizationRequest, Delivery, GuardError, UncertainReason, answer,
    config::Config, intent::Intent, lost_answer, owner::Owner, reply::Reply,
};

use crate::{
    ExecutionId, IdempotencyKey,
    execution::{
        self, Claim, Claimed, Dispatch, EventKind, ExecutionRecord, LedgerEvent, Timestamp,
    },
    ledger::{IntentKey, retry::Retry},
    observe::{self, Settlement},
};

/// One call's ledger work: the guard's configuration and the call's intent.
#[derive(Clone, Copy)]
pub(super) struct LedgerStep<'a> {
    pub(super) config: &'a Config,
    pub(super) intent: &'a Intent,
}

impl<'a> LedgerStep<'a> {
    pub(super) fn new(config: &'a Config, intent: &'a Intent) -> Self {
        Self { config, intent }
    }

    /// Claims as a call about to start: with no authorization hook to ask first, a new
    /// execution is created already `dispatched` (one write before the request leaves).
    pub(super) async fn claim_to_start(&self) -> Result<Claimed, GuardError> {
        let dispatch = self
            .config
            .authorizer
            .is_none()
            .then(|| self.intent.dispatch());
        self.claim_retrying(dispatch).await
    }

    pub(super) async fn claim(&self) -> Result<Claimed, GuardError> {
        self.claim_retrying(None).await
    }

    /// Claims (with the first dispatch, when given), trying again on a storage failure until
    /// the call's deadline: the same claim, under the time the call was asked, so that what it
    /// links to is what it would have linked to at once (a result delivered meanwhile to a
    /// twin is still handed back, not run again). Nothing was sent, so nothing is lost by
    /// trying again; the caller hears of the failure only once the deadline passed.
    ///
    /// A try whose answer was lost may have created the execution: the next try finds it,
    /// accepted by this guard at this claim's time and not yet sent, and takes it as created
    /// ([`Claimed::New`]). An unsent attempt of an earlier call's claim, found before the
    /// ledger recorded it `not_sent`, is recorded so first.
    async fn claim_retrying(&self, dispatch: Option<Dispatch>) -> Result<Claimed, GuardError> {
        let claim = self.claim_of();
        let key = IntentKey::of_claim(&claim);
        let mut retry = Retry::until(self.ledger_deadline());
        loop {
            let claimed = match &dispatch {
                Some(dispatch) => {
                    self.config
                        .ledger
                        .claim_dispatched(claim.clone(), dispatch.clone())
                        .await
                }
                None => self.config.ledger.claim(claim.clone()).await,
            };
            match claimed {
                Ok(Claimed::Existing(record))
                    if retry.failed_before()
                        && lost_answer::made_by(
                            &record,
                            &claim.owner,
                            claim.at,
                            dispatch.is_some(),
                        ) =>
                {
                    tracing::info!(execution_id = %record.execution_id, "a claim whose answer was lost had created the execution: going on with it");
                    return Ok(Claimed::New(record));
                }
                Ok(Claimed::Existing(record)) => {
                    let unsent = self.config.unanswered_claims.get(&key).map(|at| *at);
                    return match unsent {
                        Some(at) if lost_answer::made_by(&record, &self.config.owner, at, true) => {
                            let record = lost_answer::not_sent(&self.config.ledger, record).await?;
                            self.config.unanswered_claims.remove(&key);
                            Ok(Claimed::Existing(record))
                        }
                        _ => Ok(Claimed::Existing(record)),
                    };
                }
                Ok(claimed) => return Ok(claimed),
                Err(error) if retry.again(&error).await => {}
                Err(error) => {
                    if let (true, Some(dispatch)) = (retry.failed_before(), dispatch) {
                        lost_answer::settle_unanswered_claim(
                            &self.config.ledger,
                            &self.config.unanswered_claims,
                            key,
                            claim,
                            dispatch,
                        );
                    }
                    return Err(GuardError::ledger(error));
                }
            }
        }
    }

    /// Until when a call's ledger writes are tried again: its attach wait, counted from when
    /// it was asked.
    fn ledger_deadline(&self) -> tokio::time::Instant {
        let waited = std::time::Duration::from_millis(
            Timestamp::now()
                .as_millis()
                .saturating_sub(self.intent.asked_at.as_millis()),
        );
        tokio::time::Instant::now() + self.config.attach_timeout.saturating_sub(waited)
    }

    /// Whether an attempt that may still be running ([`execution::is_running`]: the core's
    /// rule) belongs to another guard; its owner is asked only about an execution in flight.
    pub(super) async fn attempt_elsewhere(&self, claimed: &Claimed) -> bool {
        let Claimed::Existing(record) = claimed else {
            return false;
        };
        record.owner != self.config.owner
            && execution::is_running(record, true)
            && execution::is_running(
                record,
                self.config.ledger.is_owner_alive(&record.owner).await,
            )
    }

    /// Waits until the execution leaves its in-flight state or its owner dies; `None` when
    /// the attach wait ran out.
    pub(super) async fn wait_for_other_attempt(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let deadline = tokio::time::Instant::now() + self.config.attach_timeout;
        observe::until_changed(&*self.config.ledger, record, &self.config.owner, deadline)
            .await
            .map_err(GuardError::ledger)
    }

    /// The result kept for `record`, if one was.
    pub(super) async fn kept_result(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<Bytes>, GuardError> {
        match &record.result_reference {
            Some(reference) => self
                .config
                .ledger
                .load_result(reference)
                .await
                .map_err(GuardError::ledger),
            None => Ok(None),
        }
    }

    /// The one place a finished execution's answer is handed to a caller: its kept result
    /// (delivered when the caller reads it), or honestly that it finished and its result was not kept.
    ///
    /// `None`, and nothing handed back, when the execution is not this caller's: another
    /// actor's execution is no link, whatever path led to it (the intent key holds the actor,
    /// so no claim and no in-process attach ever leads there; this is the last check).
    pub(super) fn hand_back(
        &self,
        record: &ExecutionRecord,
        result: Option<Bytes>,
        owner: Option<&mut Owner>,
    ) -> Option<Reply> {
        if record.actor != self.intent.actor
            || record.intent_scope != self.intent.intent_scope
            || record.fingerprint != self.intent.fingerprint
        {
            tracing::error!(execution_id = %record.execution_id, "an execution of another intent or actor was linked to this call; its result is not handed back");
            return None;
        }
        let reply_id = &self.intent.call.id;
        let settled = Settlement::Completed {
            execution_id: record.execution_id,
            result: result.clone(),
        };
        let Some(result) = result else {
            if let Some(owner) = owner {
                owner.settle(settled);
            }
            let mut response = answer::uncertain(
                reply_id,
                self.intent.era,
                record,
                UncertainReason::ResultNotKept,
            );
            response.extensions_mut().insert(record.execution_id);
            return Some(Reply::Written(response));
        };
        // Delivered once the caller holds it: read to its end, or when a caller that took
        // the delivery over records it.
        let delivery = Delivery {
            ledger: self.config.ledger.clone(),
            execution_id: record.execution_id,
            request_id: reply_id.clone(),
            answered: Arc::default(),
        };
        if let Some(owner) = owner {
            owner.settle(settled);
        }
        // As on a target's answer: the caller can tell which execution it belongs to.
        let mut response = answer::stored_result(reply_id, self.intent.era, &result);
        response.extensions_mut().insert(record.execution_id);
        Some(Reply::Kept(response, delivery))
    }

    /// Records `dispatched` for the next attempt of `record`, before anything is sent, with
    /// this guard as the owner. `None` when the ledger refused it because another attempt
    /// moved the execution on since `record` was read: then nothing may be sent.
    ///
    /// Tried again on a storage failure until the call's deadline; a try refused after one
    /// whose answer was lost finds that try's attempt recorded (the attempt, this owner, this
    /// dispatch's time) and goes on with it. Given up, the attempt it may have recorded is
    /// settled as never sent once the ledger answers.
    pub(super) async fn record_dispatch(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<(ExecutionRecord, IdempotencyKey)>, GuardError> {
        let dispatch = self.intent.dispatch();
        let event = dispatch.event(record, &self.config.owner, Timestamp::now());
        let key = dispatch.key(record);
        let mut retry = Retry::until(self.ledger_deadline());
        loop {
            let error = match self.config.ledger.append(event.clone()).await {
                Ok(record) => return Ok(Some((record, key))),
                Err(error) => error,
            };
            if error.is_invalid_transition() {
                if !retry.failed_before() {
                    return Ok(None);
                }
                let current = self
                    .config
                    .ledger
                    .get(record.execution_id)
                    .await
                    .map_err(GuardError::ledger)?;
                let ours = match current {
                    Some(current)
                        if lost_answer::is_this_dispatch(
                            &*self.config.ledger,
                            &current,
                            &event,
                        )
                        .await =>
                    {
                        Some((current, key))
                    }
                    _ => None,
                };
                return Ok(ours);
            }
            if !retry.again(&error).await {
                if retry.failed_before() {
                    lost_answer::settle_unsent_dispatch(&self.config.ledger, event);
                }
                return Err(GuardError::ledger(error));
            }
        }
    }

    fn claim_of(&self) -> Claim {
        Claim {
            fingerprint: self.intent.fingerprint,
            tool: self.intent.call.name.clone(),
            actor: self.intent.actor.clone(),
            intent_scope: self.intent.intent_scope.clone(),
            target: self.intent.target.clone(),
            credential_ref: self.intent.credential_ref.clone(),
            retry_class: self.intent.class,
            link_window: self.intent.link_window,
            retention: self.intent.retention,
            owner: self.config.owner.clone(),
            at: Timestamp::now(),
            asked_at: Some(self.intent.asked_at),
            waited: self
                .intent
                .waited
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    pub(super) async fn append(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<ExecutionRecord, GuardError> {
        self.config
            .ledger
            .append(LedgerEvent {
                execution_id: id,
                at: Timestamp::now(),
                kind,
            })
            .await
            .map_err(GuardError::ledger)
    }

    /// A repeat of execution `id` answered from the ledger with `answer`, nothing sent: one
    /// metric, and one event of the execution, so that its timeline counts how often an agent
    /// asked again. Unsynced (a count lost in a crash changes no decision); a failed write is
    /// logged and never fails the answer.
    pub(super) async fn note_repeat(&self, id: ExecutionId, answer: &'static str) {
        crate::metrics::repeat(&self.intent.call.name, answer);
        let repeated = LedgerEvent {
            execution_id: id,
            at: Timestamp::now(),
            kind: EventKind::Repeated {
                answer: answer.to_owned(),
            },
        };
        if let Err(error) = self.config.ledger.append_unsynced(repeated).await {
            tracing::warn!(execution_id = %id, %error, "could not record a repeat");
        }
    }

    /// Records that the attempt of `record` (dispatched by an owner that is gone) has an
    /// unknown outcome. `None` when that attempt is no longer the latest (another attempt was
    /// dispatched meanwhile, or it settled): nothing is written then.
    pub(super) async fn mark_unknown(
        &self,
        record: &ExecutionRecord,
        reason: &str,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let kind = EventKind::Unknown {
            target_status: None,
            reason: reason.into(),
            attempt: Some(record.attempts),
        };
        self.append_moved(record.execution_id, kind).await
    }

    /// Appends `kind`; `None` when the state machine refused it because another attempt moved
    /// the execution on meanwhile (nothing was written).
    pub(super) async fn append_moved(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        match self.append(id, kind).await {
            Ok(record) => Ok(Some(record)),
            Err(e) if e.is_ledger_transition() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Appends `kind`; when another attempt (in this process or another) moved the execution
    /// on meanwhile so that `kind` no longer applies, takes the record as it now is.
    pub(super) async fn append_or_current(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<ExecutionRecord, GuardError> {
        match self.append(id, kind).await {
            Ok(record) => Ok(record),
            Err(e) if e.is_ledger_transition() => self
                .config
                .ledger
                .get(id)
                .await
                .map_err(GuardError::ledger)?
                .ok_or_else(|| GuardError::ledger(crate::ledger::LedgerError::NotFound(id))),
            Err(e) => Err(e),
        }
    }

    /// Runs the hook; returns the denied record, or `None` when allowed.
    pub(super) async fn authorize(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let Some(authorizer) = &self.config.authorizer else {
            return Ok(None);
        };
        let request = AuthorizationRequest {
            execution: record,
            arguments: self.intent.call.arguments(),
        };
        match authorizer.authorize(request).await {
            Authorization::Allow => Ok(None),
            Authorization::Deny { reason } => {
                tracing::info!(%reason, "authorization denied");
                self.append(record.execution_id, EventKind::Denied { reason })
                    .await
                    .map(Some)
            }
        }
    }
}
