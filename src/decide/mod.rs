//! The retry decision, with no HTTP types and no I/O: every ledger and both layers ask it.

mod link;

#[cfg(test)]
pub(crate) use link::ORPHAN_REASON;
pub(crate) use link::{is_linkable, orphan_unknown};
// For the guard's and the server half's "dispatched, owner gone" checks.
#[allow(unused_imports)]
pub(crate) use link::is_orphaned;
