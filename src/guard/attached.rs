//! `Attached`: single flight in this process. One call of an intent owns it at a time; a
//! repeat that arrives meanwhile waits (bounded) for the owner's outcome and takes its answer.

use std::sync::Arc;

use super::{
    GuardError, UncertainReason, answer,
    inflight::Inflight,
    ledger_step::LedgerStep,
    owner::{Acquired, Owner},
    reply::Reply,
};

use crate::{
    decide::flight::{AfterWait, Waited, after_wait},
    ledger::IntentKey,
    observe::Settlement,
};

/// Where single flight put a call.
pub(super) enum Attached {
    /// The call owns its intent in this process: it decides and acts.
    Owner(Owner),
    /// The owner it waited for finished, or is still busy: its answer.
    Reply(Reply),
}

impl Attached {
    /// Owns the intent, or waits for its owner and answers from what the owner settled (a
    /// repeat attached, counted).
    pub(super) async fn of(
        step: LedgerStep<'_>,
        inflight: &Arc<Inflight>,
    ) -> Result<Self, GuardError> {
        let attached = Self::acquire_or_wait(step, inflight).await;
        if let Ok((Attached::Reply(_), Some(id))) = &attached {
            crate::metrics::decided(&step.intent.call.name, "attach");
            step.note_repeat(*id, "attached").await;
        }
        attached.map(|(attached, _)| attached)
    }

    /// [`of`](Self::of), with the execution a reply answers from.
    async fn acquire_or_wait(
        step: LedgerStep<'_>,
        inflight: &Arc<Inflight>,
    ) -> Result<(Self, Option<crate::ExecutionId>), GuardError> {
        let intent = step.intent;
        let key = IntentKey::new(
            intent.actor.clone(),
            intent.intent_scope.clone(),
            intent.fingerprint,
        );
        loop {
            let mut settled = match Owner::acquire(inflight, key.clone()) {
                Acquired::Owner(owner) => return Ok((Attached::Owner(owner), None)),
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
            let waited = match tokio::time::timeout(step.config.attach_timeout, wait).await {
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
                    let record = step
                        .config
                        .ledger
                        .get(execution_id)
                        .await
                        .map_err(GuardError::ledger)?;
                    if let Some(record) = record
                        && let Some(reply) = step.hand_back(&record, result, None)
                    {
                        return Ok((Attached::Reply(reply), Some(execution_id)));
                    }
                    // Gone from the index (or not this caller's): decide again.
                }
                AfterWait::DecideAgain => {}
                AfterWait::InProgress => {
                    let claimed = step.claim().await?;
                    let reply = Reply::from(answer::uncertain(
                        &intent.call.id,
                        intent.era,
                        claimed.record(),
                        UncertainReason::InProgress,
                    ));
                    return Ok((Attached::Reply(reply), Some(claimed.record().execution_id)));
                }
            }
        }
    }
}
