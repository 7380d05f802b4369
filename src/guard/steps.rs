//! The guard's ledger steps: claim, append, wait, hand back, authorize.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::{
    Authorization, AuthorizationRequest, GuardError, GuardResponseBody, UncertainReason, answer,
    claim::is_this_dispatch, inflight::Owner, intent::Intent, layer::Config,
};

use crate::{
    ExecutionId, IdempotencyKey,
    execution::{self, Claim, Claimed, EventKind, ExecutionRecord, LedgerEvent, Timestamp},
    ledger::retry::Retry,
    observe::{self, Settlement},
};

impl Config {
    /// Whether the caller's `Idempotency-Key` is the key of another actor's execution: sent,
    /// it would let a target that honours keys hand that execution's result to this caller.
    pub(super) async fn key_of_another_actor(&self, intent: &Intent) -> Result<bool, GuardError> {
        let Some(id) = intent
            .caller_key
            .as_ref()
            .and_then(IdempotencyKey::execution_id)
        else {
            return Ok(false);
        };
        let record = self.ledger.get(id).await.map_err(GuardError::ledger)?;
        Ok(record.is_some_and(|record| record.actor != intent.actor))
    }

    /// Whether an attempt that may still be running ([`execution::is_running`]: the core's
    /// rule) belongs to another guard; its owner is asked only about an execution in flight.
    pub(super) async fn attempt_elsewhere(&self, claimed: &Claimed) -> bool {
        let Claimed::Existing(record) = claimed else {
            return false;
        };
        record.owner != self.owner
            && execution::is_running(record, true)
            && execution::is_running(record, self.ledger.is_owner_alive(&record.owner).await)
    }

    /// Waits until the execution leaves its in-flight state or its owner dies; `None` when
    /// the attach wait ran out.
    pub(super) async fn wait_for_other_attempt(
        &self,
        record: &ExecutionRecord,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let deadline = tokio::time::Instant::now() + self.attach_timeout;
        observe::until_changed(&*self.ledger, record, &self.owner, deadline)
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
    pub(super) async fn hand_back<RB>(
        &self,
        record: &ExecutionRecord,
        intent: &Intent,
        result: Option<Bytes>,
        owner: Option<Owner>,
    ) -> Result<Option<Response<GuardResponseBody<RB>>>, GuardError> {
        if record.actor != intent.actor
            || record.intent_scope != intent.intent_scope
            || record.fingerprint != intent.fingerprint
        {
            tracing::error!(execution_id = %record.execution_id, "an execution of another intent or actor was linked to this call; its result is not handed back");
            return Ok(None);
        }
        let reply_id = &intent.call.id;
        let settled = Settlement::Completed {
            execution_id: record.execution_id,
            result: result.clone(),
        };
        let Some(result) = result else {
            if let Some(owner) = owner {
                owner.settle(settled);
            }
            let mut response =
                answer::uncertain(reply_id, intent.era, record, UncertainReason::ResultNotKept);
            response.extensions_mut().insert(record.execution_id);
            return Ok(Some(response.map(GuardResponseBody::answer)));
        };
        // Delivered once the caller holds it: read to its end, or when a caller that took
        // the delivery over records it.
        let delivery = super::Delivery {
            ledger: self.ledger.clone(),
            execution_id: record.execution_id,
            request_id: reply_id.clone(),
            answered: Arc::default(),
        };
        if let Some(owner) = owner {
            owner.settle(settled);
        }
        // As on a target's answer: the caller can tell which execution it belongs to.
        let mut response = answer::stored_result(reply_id, intent.era, &result);
        response.extensions_mut().insert(record.execution_id);
        Ok(Some(
            response.map(|data| GuardResponseBody::kept(data, delivery)),
        ))
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
        intent: &Intent,
        record: &ExecutionRecord,
    ) -> Result<Option<(ExecutionRecord, IdempotencyKey)>, GuardError> {
        let dispatch = intent.dispatch();
        let event = dispatch.event(record, &self.owner, Timestamp::now());
        let key = dispatch.key(record);
        let mut retry = Retry::until(self.ledger_deadline(intent));
        loop {
            let error = match self.ledger.append(event.clone()).await {
                Ok(record) => return Ok(Some((record, key))),
                Err(error) => error,
            };
            if error.is_invalid_transition() {
                if !retry.failed_before() {
                    return Ok(None);
                }
                let current = self
                    .ledger
                    .get(record.execution_id)
                    .await
                    .map_err(GuardError::ledger)?;
                let ours = match current {
                    Some(current) if is_this_dispatch(&*self.ledger, &current, &event).await => {
                        Some((current, key))
                    }
                    _ => None,
                };
                return Ok(ours);
            }
            if !retry.again(&error).await {
                if retry.failed_before() {
                    self.settle_unsent_dispatch(event);
                }
                return Err(GuardError::ledger(error));
            }
        }
    }

    pub(super) fn claim_of(&self, intent: &Intent) -> Claim {
        Claim {
            fingerprint: intent.fingerprint,
            tool: intent.call.name.clone(),
            actor: intent.actor.clone(),
            intent_scope: intent.intent_scope.clone(),
            target: intent.target.clone(),
            credential_ref: intent.credential_ref.clone(),
            retry_class: intent.class,
            link_window: intent.link_window,
            retention: intent.retention,
            owner: self.owner.clone(),
            at: Timestamp::now(),
            asked_at: Some(intent.asked_at),
            waited: intent.waited.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    pub(super) async fn append(
        &self,
        id: ExecutionId,
        kind: EventKind,
    ) -> Result<ExecutionRecord, GuardError> {
        self.ledger
            .append(LedgerEvent {
                execution_id: id,
                at: Timestamp::now(),
                kind,
            })
            .await
            .map_err(GuardError::ledger)
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
        intent: &Intent,
    ) -> Result<Option<ExecutionRecord>, GuardError> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(None);
        };
        let request = AuthorizationRequest {
            execution: record,
            arguments: intent.call.arguments(),
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
