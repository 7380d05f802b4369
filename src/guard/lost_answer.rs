//! Attempts a ledger write whose answer was lost may have recorded without the guard ever
//! sending them.
//!
//! A ledger write whose answer was lost (a COMMIT made, its answer cut) may have recorded what
//! it wrote; the guard, which sends nothing until it has that answer, knows that what it may
//! have recorded never left. A claim that created its execution with the first dispatch is
//! found again by the next try and taken as created; once the tries are given up, the attempt
//! is recorded `not_sent` as soon as the ledger answers, so that a repeat continues it (runs
//! once) instead of reading an unsent attempt as one whose outcome is unknown.

use std::sync::Arc;

use dashmap::DashMap;

use super::GuardError;

use crate::{
    execution::{
        Claim, Dispatch, EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp,
    },
    ledger::{
        IntentKey, Ledger,
        retry::{self, OUTCOME_TRIED_AFTER_ANSWER, Retry},
    },
};

/// Why an attempt is recorded `not_sent` here.
const NOT_SENT_REASON: &str =
    "the ledger's answer to its dispatch was lost, so the guard never sent it";

/// A claim with its first dispatch whose tries were given up after a storage failure: the
/// first attempt it may have recorded was never sent. Once the ledger answers, the same
/// claim finds it (or creates it) and it is recorded `not_sent`; meanwhile a call of this
/// guard that finds it records that itself.
pub(super) fn settle_unanswered_claim(
    ledger: &Arc<dyn Ledger>,
    unanswered: &Arc<DashMap<IntentKey, Timestamp>>,
    key: IntentKey,
    claim: Claim,
    dispatch: Dispatch,
) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    unanswered.insert(key.clone(), claim.at);
    let (ledger, unanswered) = (ledger.clone(), unanswered.clone());
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + OUTCOME_TRIED_AFTER_ANSWER;
        let mut retry = Retry::until(deadline);
        loop {
            match ledger
                .claim_dispatched(claim.clone(), dispatch.clone())
                .await
            {
                Ok(claimed) => {
                    let record = claimed.record();
                    if made_by(record, &claim.owner, claim.at, true)
                        && let Err(error) = not_sent(&ledger, record.clone()).await
                    {
                        tracing::warn!(execution_id = %record.execution_id, %error, "could not record an unsent attempt");
                    }
                    break;
                }
                Err(error) if retry.again(&error).await => {}
                Err(error) => {
                    tracing::warn!(%error, "could not settle a claim whose answer was lost");
                    break;
                }
            }
        }
        unanswered.remove_if(&key, |_, at| *at == claim.at);
    });
}

/// A `dispatched` whose tries were given up after a storage failure: once the ledger
/// answers, the attempt it may have recorded is recorded `not_sent` if it is there.
pub(super) fn settle_unsent_dispatch(ledger: &Arc<dyn Ledger>, event: LedgerEvent) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let ledger = ledger.clone();
    tokio::spawn(async move {
        let id = event.execution_id;
        let mut retry = Retry::until(tokio::time::Instant::now() + OUTCOME_TRIED_AFTER_ANSWER);
        loop {
            match ledger.get(id).await {
                Ok(Some(record)) => {
                    if is_this_dispatch(&*ledger, &record, &event).await
                        && let Err(error) = not_sent(&ledger, record).await
                    {
                        tracing::warn!(execution_id = %id, %error, "could not record an unsent attempt");
                    }
                    break;
                }
                Ok(None) => break,
                Err(error) if retry.again(&error).await => {}
                Err(error) => {
                    tracing::warn!(execution_id = %id, %error, "could not settle a dispatch whose answer was lost");
                    break;
                }
            }
        }
    });
}

/// Whether `record` is as a claim by `owner` at `at` left it: accepted then, and with its
/// first attempt recorded and not yet sent (`dispatched`), or only accepted. Only one call of
/// an intent claims to start at a time in a guard, so no other call of this guard made it.
pub(super) fn made_by(
    record: &ExecutionRecord,
    owner: &str,
    at: Timestamp,
    dispatched: bool,
) -> bool {
    let as_left = if dispatched {
        record.state == ExecutionState::Dispatched && record.attempts == 1
    } else {
        record.state == ExecutionState::Accepted
    };
    as_left && record.owner == owner && record.accepted_at == at
}

/// Whether the latest attempt of `record`, still in flight, is the one `dispatched` recorded:
/// same attempt, same owner, and the chain holds that very event (its time and request).
pub(super) async fn is_this_dispatch(
    ledger: &dyn Ledger,
    record: &ExecutionRecord,
    dispatched: &LedgerEvent,
) -> bool {
    let EventKind::Dispatched { attempt, owner, .. } = &dispatched.kind else {
        return false;
    };
    if record.state != ExecutionState::Dispatched
        || record.attempts != *attempt
        || owner.as_deref() != Some(record.owner.as_str())
    {
        return false;
    }
    ledger
        .events(record.execution_id)
        .await
        .is_ok_and(|events| events.iter().any(|event| event == dispatched))
}

/// Records that the attempt in flight of `record` was never sent; refused (another writer
/// moved it on), the record as it now is.
pub(super) async fn not_sent(
    ledger: &Arc<dyn Ledger>,
    record: ExecutionRecord,
) -> Result<ExecutionRecord, GuardError> {
    let event = LedgerEvent {
        execution_id: record.execution_id,
        at: Timestamp::now(),
        kind: EventKind::NotSent {
            reason: NOT_SENT_REASON.into(),
        },
    };
    match retry::record_outcome_event(ledger, event, None).await {
        Ok(record) => Ok(record),
        Err(error) if error.is_invalid_transition() => Ok(ledger
            .get(record.execution_id)
            .await
            .map_err(GuardError::ledger)?
            .unwrap_or(record)),
        Err(error) => Err(GuardError::ledger(error)),
    }
}
