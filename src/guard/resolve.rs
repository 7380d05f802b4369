//! An operator's (or any settler's) resolution of a held execution.

use crate::{
    ExecutionId,
    execution::{self, EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp},
    ledger::{Ledger, LedgerError},
};

/// Records an operator's (or any settler's) resolution.
///
/// # When it is refused
///
/// - The execution is in flight (accepted, authorized, dispatched) and its owner is alive
///   ([`Ledger::is_owner_alive`]): the call may still be running, and only its own answer
///   settles it ([`LedgerError::StillRunning`](LedgerError::StillRunning)).
/// - The state machine does not allow it (a settled execution is not settled again).
///
/// An answer the target gives after a resolution is still recorded: a `completed` follows
/// the `resolved`, and both stay in the execution's events.
pub async fn resolve(
    ledger: &dyn Ledger,
    execution_id: ExecutionId,
    applied: bool,
    by: &str,
    note: &str,
) -> Result<ExecutionRecord, LedgerError> {
    resolve_after_probe(ledger, execution_id, applied, by, note, None).await
}

/// [`resolve`], with what a status probe the settler ran answered (`probe`), recorded in the
/// same event as the verdict, the settler's name and note.
pub async fn resolve_after_probe(
    ledger: &dyn Ledger,
    execution_id: ExecutionId,
    applied: bool,
    by: &str,
    note: &str,
    probe: Option<&str>,
) -> Result<ExecutionRecord, LedgerError> {
    let record = ledger
        .get(execution_id)
        .await?
        .ok_or(LedgerError::NotFound(execution_id))?;
    // The owner is asked only about an execution in flight.
    let alive = execution::is_running(&record, true) && ledger.is_owner_alive(&record.owner).await;
    if execution::is_running(&record, alive) {
        return Err(LedgerError::StillRunning {
            execution_id,
            state: record.state,
            owner: record.owner,
        });
    }
    ledger
        .append(LedgerEvent {
            execution_id,
            at: Timestamp::now(),
            kind: EventKind::Resolved {
                applied,
                by: by.to_owned(),
                note: note.to_owned(),
                result_reference: None,
                // An attempt dispatched since the record was read refuses the event (it names the
                // attempt it settles); an orphan's own attempt is the one in flight.
                attempt: (record.state != ExecutionState::Dispatched).then_some(record.attempts),
                probe: probe.map(str::to_owned),
            },
        })
        .await
}
