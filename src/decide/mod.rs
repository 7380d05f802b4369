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
//!
//! Whether a record links to a repeat, how long it stays in retention and what an orphan
//! becomes are the execution model's rules (`execution::link`), which every ledger asks too.

pub(crate) mod call;
pub(crate) mod class;
pub(crate) mod classify;
pub(crate) mod flight;
pub(crate) mod probe;
#[cfg(feature = "server")]
pub(crate) mod server;

#[cfg(test)]
mod tests;
