//! The PostgreSQL ledger (in progress).

/// A ledger in PostgreSQL (in progress).
#[derive(Debug)]
pub struct PostgresLedger;
