//! Hooks for the crate's deterministic simulator (`tests/sim`, feature `simulation`).
//!
//! The simulator runs the real guard and the real ledgers through seeded schedules on a
//! simulated clock. Two things of the crate must follow that clock and that schedule, and
//! these hooks are how: [`Timestamp::now`] on the simulation's thread reads the clock
//! installed by [`set_clock`] (link windows, leases and retention then pass in simulated
//! time), and [`FileLedger::open_on`](crate::ledger::FileLedger::open_on) serves a ledger on
//! the caller's thread through a [`Disk`](crate::ledger::Disk) the simulation can
//! crash. Nothing here is meant for production use.

use std::cell::Cell;

use crate::ledger::Timestamp;

thread_local! {
    static CLOCK: Cell<Option<fn() -> Timestamp>> = const { Cell::new(None) };
}

/// Makes [`Timestamp::now`] on this thread read `clock` (until [`clear_clock`]).
pub fn set_clock(clock: fn() -> Timestamp) {
    CLOCK.with(|c| c.set(Some(clock)));
}

/// Makes [`Timestamp::now`] on this thread read the system clock again.
pub fn clear_clock() {
    CLOCK.with(|c| c.set(None));
}

/// The installed clock's time, if one is installed on this thread.
pub(crate) fn now() -> Option<Timestamp> {
    CLOCK.with(Cell::get).map(|clock| clock())
}
