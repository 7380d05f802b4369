//! The one rule for a ledger write whose storage failed: the same write is tried again, after
//! a growing pause, until it is recorded, refused, or its deadline passes.
//!
//! A storage failure says nothing of whether the write was recorded (a COMMIT whose answer was
//! lost was made), so every retried write must be one that can be recorded once only: the
//! state machine refuses its second copy, and the caller reads the record to learn whether its
//! first try was the one recorded ([`Retry::failed_before`]).

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use tokio::time::Instant;

use super::{EventKind, ExecutionRecord, Ledger, LedgerError, LedgerEvent};

/// The pause after the first failure.
const FIRST_PAUSE: Duration = Duration::from_millis(20);

/// The longest pause between two tries.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// How long the write of an attempt's outcome is tried before the caller is answered (the
/// answer waits for its outcome to be recorded).
pub(crate) const OUTCOME_TRIED_BEFORE_ANSWER: Duration = Duration::from_secs(5);

/// How long an outcome write still failing then goes on being tried, in the background of
/// the process.
pub(crate) const OUTCOME_TRIED_AFTER_ANSWER: Duration = Duration::from_secs(600);

/// The tries of one ledger write, until a deadline.
#[derive(Debug)]
pub(crate) struct Retry {
    deadline: Instant,
    pause: Duration,
    failed: bool,
}

impl Retry {
    /// Tries until `deadline`.
    pub(crate) fn until(deadline: Instant) -> Self {
        Self {
            deadline,
            pause: FIRST_PAUSE,
            failed: false,
        }
    }

    /// After a try that failed with `error`: whether to try again, after the pause (waited
    /// here). Only a failure of the storage is tried again, and only while the deadline
    /// allows the pause.
    pub(crate) async fn again(&mut self, error: &LedgerError) -> bool {
        // Without a runtime (a write driven in place at shutdown) there is no pause to take.
        if !error.is_transient() || tokio::runtime::Handle::try_current().is_err() {
            return false;
        }
        self.failed = true;
        let now = Instant::now();
        if now + self.pause > self.deadline {
            return false;
        }
        tracing::debug!(%error, pause_ms = self.pause.as_millis() as u64, "ledger write failed: trying again");
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        true
    }

    /// Whether an earlier try failed in the storage: it may have been recorded all the same
    /// (its answer lost), so a refusal of this try may be the first try's success.
    pub(crate) fn failed_before(&self) -> bool {
        self.failed
    }
}

/// Records the outcome of an attempt (`completed` with the result it keeps, or another event
/// that settles the attempt) by the one rule: tried again on a storage failure until
/// [`OUTCOME_TRIED_BEFORE_ANSWER`]; still failing, it goes on in the background until
/// [`OUTCOME_TRIED_AFTER_ANSWER`] (or the process ends) and the failure is returned. A try
/// refused after a storage failure finds its first try recorded (or another writer's outcome):
/// the record as it now is is the answer.
pub(crate) async fn record_outcome_event(
    ledger: &Arc<dyn Ledger>,
    event: LedgerEvent,
    result: Option<Bytes>,
) -> Result<ExecutionRecord, LedgerError> {
    let deadline = Instant::now() + OUTCOME_TRIED_BEFORE_ANSWER;
    match write_until(&**ledger, &event, result.as_ref(), deadline).await {
        Err(error) if error.is_transient() && tokio::runtime::Handle::try_current().is_ok() => {
            let ledger = ledger.clone();
            tokio::spawn(async move {
                let (id, name) = (event.execution_id, event.kind.name());
                let deadline = Instant::now() + OUTCOME_TRIED_AFTER_ANSWER;
                match write_until(&*ledger, &event, result.as_ref(), deadline).await {
                    Ok(_) => {
                        tracing::info!(execution_id = %id, event = name, "recorded once the ledger answered again")
                    }
                    Err(error) => {
                        tracing::warn!(execution_id = %id, event = name, %error, "could not record")
                    }
                }
            });
            Err(error)
        }
        written => written,
    }
}

/// Writes `event` (with `result`, for a `completed`) until it is recorded, refused, or the
/// deadline passes.
async fn write_until(
    ledger: &dyn Ledger,
    event: &LedgerEvent,
    result: Option<&Bytes>,
    deadline: Instant,
) -> Result<ExecutionRecord, LedgerError> {
    let mut retry = Retry::until(deadline);
    loop {
        let written = match &event.kind {
            EventKind::Completed { .. } => ledger.complete(event.clone(), result.cloned()).await,
            _ => ledger.append(event.clone()).await,
        };
        let error = match written {
            Ok(record) => return Ok(record),
            Err(error) => error,
        };
        if error.is_invalid_transition() && retry.failed_before() {
            match ledger.get(event.execution_id).await {
                Ok(Some(record)) => return Ok(record),
                Ok(None) => return Err(error),
                // Unreadable: as a failed try.
                Err(unread) if retry.again(&unread).await => continue,
                Err(_) => return Err(error),
            }
        }
        if !retry.again(&error).await {
            return Err(error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ExecutionId, execution::InvalidTransition};

    #[tokio::test(start_paused = true)]
    async fn only_a_storage_failure_is_tried_again_and_only_until_the_deadline() {
        let mut retry = Retry::until(Instant::now() + Duration::from_millis(100));
        let refused = LedgerError::InvalidTransition(InvalidTransition {
            execution_id: ExecutionId::new(),
            state: crate::execution::ExecutionState::Completed,
            event: "completed",
        });
        assert!(!retry.again(&refused).await);
        assert!(!retry.failed_before());
        assert!(
            !retry
                .again(&LedgerError::NotFound(ExecutionId::new()))
                .await
        );
        let storage = LedgerError::storage("connection closed");
        let mut tries = 0;
        while retry.again(&storage).await {
            tries += 1;
        }
        assert!(retry.failed_before());
        // 20 + 40 ms fit, 80 more does not.
        assert_eq!(tries, 2);
    }
}
