//! The execution model every layer speaks: an execution's record, its events and states, the
//! state machine that folds one into the other, the link rule with its two clocks, the retry
//! classes, and the claim that finds or creates the execution of an intent. Plain values and
//! plain functions: no I/O.
//!
//! The [`ledger`](crate::ledger) stores, indexes and verifies these values; the decision
//! (`decide`) and the contracts read them. None of them decides what is linkable, retained or
//! orphaned on its own: the rules are in `link`.

mod claim;
mod class;
pub(crate) mod link;
mod record;

pub use claim::{Claim, Claimed, Dispatch};
pub(crate) use claim::{DEFAULT_LINK_WINDOW, DEFAULT_RETENTION};
pub use class::RetryClass;
#[cfg(test)]
pub(crate) use link::ORPHAN_REASON;
pub(crate) use link::{is_linkable, is_orphaned, is_retained, is_running, orphan_unknown};
#[cfg(test)]
pub(crate) use record::fixtures;
pub use record::{
    ClientInfo, Correlation, EventKind, ExecutionRecord, ExecutionState, InvalidTimestamp,
    InvalidTransition, LedgerEvent, Timestamp,
};
