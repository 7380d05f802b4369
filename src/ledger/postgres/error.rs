//! The ledger's errors from PostgreSQL, with the server's message and the error as source.

use super::*;

/// What PostgreSQL said, with the server's message when there is one.
pub(super) fn describe(what: &str, error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!(
            "{what}: PostgreSQL answered {} ({})",
            db.message(),
            db.code().code()
        ),
        None => format!("{what}: {error}"),
    }
}

pub(super) fn read_failed(what: &str, error: tokio_postgres::Error) -> LedgerError {
    LedgerError::caused(
        format!(
            "{}; check that the server is reachable and the ledger's tables exist",
            describe(what, &error)
        ),
        error,
    )
}

pub(super) fn write_failed(error: tokio_postgres::Error) -> StorageError {
    StorageError::caused(
        format!(
            "{}; nothing was recorded, so nothing may be sent: try again once the database \
             answers",
            describe("recording in the PostgreSQL ledger failed", &error)
        ),
        error,
    )
}

/// The storage failure of a ledger error, for a batch that fails as a whole.
pub(super) fn storage_of(error: LedgerError) -> StorageError {
    match error {
        LedgerError::Storage(storage) => storage,
        other => StorageError::from(other.to_string()),
    }
}

pub(super) fn writer_gone() -> LedgerError {
    LedgerError::storage(
        "the PostgreSQL ledger's writer has stopped (the tokio runtime that connected it shut \
         down?); connect the ledger again on a running runtime",
    )
}

pub(super) fn mismatch() -> LedgerError {
    LedgerError::storage(
        "the PostgreSQL ledger's writer lost track of a call; this is a bug: please report it",
    )
}
