//! The retry decision of both halves, as plain code: no HTTP types, no I/O.
//!
//! The guard and the server half gather facts (a ledger claim, a live attempt, a status, an
//! error chain, a probe's answer) and act on what these functions return; neither re-derives a
//! rule of its own.
//!
//! - `call`: what the guard does with a repeated `tools/call` (the README's table).
//! - `class`: what a retry class allows after an unknown outcome, for the guard
//!   and for `ReplayPolicy`.
//! - `flight`: single flight, attach to a live attempt or own the intent, and what follows
//!   the wait.
//! - `classify`: the one outcome classifier, status or error chain → outcome.
//! - `probe`: a status probe's answer → the next step.
//! - `server`: what a keyed call gets in the server half.
//! - `link`: whether a ledger record links to a repeat (the link window), how long it stays in
//!   retention (never while its attempt may still run), whether an attempt may still be
//!   running (an operator may not settle it then), and an orphan (an execution `dispatched` by
//!   an owner that is gone) becomes `unknown`; every ledger asks it.

pub(crate) mod call;
pub(crate) mod class;
pub(crate) mod classify;
pub(crate) mod flight;
mod link;
pub(crate) mod probe;
#[cfg(feature = "server")]
pub(crate) mod server;

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use link::ORPHAN_REASON;
pub(crate) use link::{is_linkable, is_orphaned, is_retained, is_running, orphan_unknown};
