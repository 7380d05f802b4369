//! The guard's claim, tried again on a storage failure, and the attempts a write whose answer
//! was lost may have recorded without the guard ever sending them.
//!
//! A ledger write whose answer was lost (a COMMIT made, its answer cut) may have recorded what
//! it wrote; the guard, which sends nothing until it has that answer, knows that what it may
//! have recorded never left. A claim that created its execution with the first dispatch is
//! found again by the next try and taken as created; once the tries are given up, the attempt
//! is recorded `not_sent` as soon as the ledger answers, so that a repeat continues it (runs
//! once) instead of reading an unsent attempt as one whose outcome is unknown.

use std::sync::Arc;

use super::{GuardError, intent::Intent, layer::Config};

use crate::{
    execution::{
        Claim, Claimed, Dispatch, EventKind, ExecutionRecord, ExecutionState, LedgerEvent,
        Timestamp,
    },
    ledger::{
        IntentKey, Ledger,
        retry::{self, OUTCOME_TRIED_AFTER_ANSWER, Retry},
    },
};

/// Why an attempt is recorded `not_sent` here.
const NOT_SENT_REASON: &str =
    "the ledger's answer to its dispatch was lost, so the guard never sent it";

impl Config {
    /// Claims as a call about to start: with no authorization hook to ask first, a new
    /// execution is created already `dispatched` (one write before the request leaves).
    pub(super) async fn claim_to_start(&self, intent: &Intent) -> Result<Claimed, GuardError> {
        let dispatch = self.authorizer.is_none().then(|| intent.dispatch());
        self.claim_retrying(intent, dispatch).await
    }

    pub(super) async fn claim(&self, intent: &Intent) -> Result<Claimed, GuardError> {
        self.claim_retrying(intent, None).await
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
    async fn claim_retrying(
        &self,
        intent: &Intent,
        dispatch: Option<Dispatch>,
    ) -> Result<Claimed, GuardError> {
        let claim = self.claim_of(intent);
        let key = IntentKey::of_claim(&claim);
        let mut retry = Retry::until(self.ledger_deadline(intent));
        loop {
            let claimed = match &dispatch {
                Some(dispatch) => {
                    self.ledger
                        .claim_dispatched(claim.clone(), dispatch.clone())
                        .await
                }
                None => self.ledger.claim(claim.clone()).await,
            };
            match claimed {
                Ok(Claimed::Existing(record))
                    if retry.failed_before()
                        && made_by(&record, &claim.owner, claim.at, dispatch.is_some()) =>
                {
                    tracing::info!(execution_id = %record.execution_id, "a claim whose answer was lost had created the execution: going on with it");
                    return Ok(Claimed::New(record));
                }
                Ok(Claimed::Existing(record)) => {
                    let unsent = self.unanswered_claims.get(&key).map(|at| *at);
                    return match unsent {
                        Some(at) if made_by(&record, &self.owner, at, true) => {
                            let record = not_sent(&self.ledger, record).await?;
                            self.unanswered_claims.remove(&key);
                            Ok(Claimed::Existing(record))
                        }
                        _ => Ok(Claimed::Existing(record)),
                    };
                }
                Ok(claimed) => return Ok(claimed),
                Err(error) if retry.again(&error).await => {}
                Err(error) => {
                    if let (true, Some(dispatch)) = (retry.failed_before(), dispatch) {
                        self.settle_unanswered_claim(key, claim, dispatch);
                    }
                    return Err(GuardError::ledger(error));
                }
            }
        }
    }

    /// Until when a call's ledger writes are tried again: its attach wait, counted from when
    /// it was asked.
    pub(super) fn ledger_deadline(&self, intent: &Intent) -> tokio::time::Instant {
        let waited = std::time::Duration::from_millis(
            Timestamp::now()
                .as_millis()
                .saturating_sub(intent.asked_at.as_millis()),
        );
        tokio::time::Instant::now() + self.attach_timeout.saturating_sub(waited)
    }

    /// A claim with its first dispatch whose tries were given up after a storage failure: the
    /// first attempt it may have recorded was never sent. Once the ledger answers, the same
    /// claim finds it (or creates it) and it is recorded `not_sent`; meanwhile a call of this
    /// guard that finds it records that itself.
    fn settle_unanswered_claim(&self, key: IntentKey, claim: Claim, dispatch: Dispatch) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.unanswered_claims.insert(key.clone(), claim.at);
        let (ledger, unanswered) = (self.ledger.clone(), self.unanswered_claims.clone());
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
    pub(super) fn settle_unsent_dispatch(&self, event: LedgerEvent) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let ledger = self.ledger.clone();
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
}

/// Whether `record` is as a claim by `owner` at `at` left it: accepted then, and with its
/// first attempt recorded and not yet sent (`dispatched`), or only accepted. Only one call of
/// an intent claims to start at a time in a guard, so no other call of this guard made it.
fn made_by(record: &ExecutionRecord, owner: &str, at: Timestamp, dispatched: bool) -> bool {
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
async fn not_sent(
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
