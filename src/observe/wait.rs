//! Waiting, bounded, for another attempt to move an execution on.

use std::time::Duration;

use crate::{
    execution::ExecutionRecord,
    ledger::{Ledger, LedgerError},
};

/// How often a waiting call looks at the ledger (no ledger notifies a change).
const POLL: Duration = Duration::from_millis(10);

/// Looks at the ledger every [`POLL`] until the execution of `record` moves on: another state,
/// another request fingerprint, or an owner (other than `own`) whose process is gone.
///
/// `Ok(Some(current))` with the record as it now is (`record` itself when the ledger no
/// longer has it); `Ok(None)` when `deadline` came first.
pub(crate) async fn until_changed(
    ledger: &dyn Ledger,
    record: &ExecutionRecord,
    own: &str,
    deadline: tokio::time::Instant,
) -> Result<Option<ExecutionRecord>, LedgerError> {
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(POLL).await;
        match ledger.get(record.execution_id).await? {
            Some(current)
                if current.state == record.state
                    && current.request_fingerprint == record.request_fingerprint
                    && (current.owner == own || ledger.is_owner_alive(&current.owner).await) => {}
            Some(current) => return Ok(Some(current)),
            None => return Ok(Some(record.clone())),
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        execution::{
            Claim, EventKind, ExecutionState, LedgerEvent, RetryClass, Timestamp, fixtures,
        },
        ledger::MemoryLedger,
    };

    async fn accepted(ledger: &MemoryLedger, owner: &str) -> ExecutionRecord {
        let claim = Claim {
            at: Timestamp::now(),
            ..fixtures::claim(RetryClass::Idempotent, owner)
        };
        ledger.claim(claim).await.unwrap().record().clone()
    }

    #[tokio::test]
    async fn a_record_that_stays_as_it_is_waits_until_the_deadline() {
        let ledger = MemoryLedger::new();
        let record = accepted(&ledger, "guard:self").await;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
        let changed = until_changed(&ledger, &record, "guard:self", deadline).await;
        assert!(changed.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_record_that_moves_on_ends_the_wait_with_its_new_state() {
        let ledger = MemoryLedger::new();
        let record = accepted(&ledger, "guard:self").await;
        let id = record.execution_id;
        let moved = {
            let ledger = ledger.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let event = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::now(),
                    kind: EventKind::Authorized,
                };
                ledger.append(event).await.unwrap();
            }
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let (changed, ()) = tokio::join!(
            until_changed(&ledger, &record, "guard:self", deadline),
            moved
        );
        let current = changed.unwrap().expect("changed before the deadline");
        assert_eq!(current.state, ExecutionState::Authorized);
    }
}
