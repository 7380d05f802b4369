//! Waiting, bounded, for another attempt to move an execution on.

use std::time::Duration;

use crate::ledger::{ExecutionRecord, Ledger, LedgerError};

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
