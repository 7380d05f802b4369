//! Hooks for the crate's deterministic simulator (`cli/tests/sim`, feature `simulation`).
//!
//! The simulator runs the real guard and the real ledgers through seeded schedules on a
//! simulated clock. Two things of the crate must follow that clock and that schedule, and
//! these hooks are how: [`Timestamp::now`] on the simulation's thread reads the clock
//! installed by [`set_clock`] (link windows, leases and retention then pass in simulated
//! time), and [`FileLedger::open_on`](crate::ledger::FileLedger::open_on) serves a ledger on
//! the caller's thread through a [`Disk`](crate::ledger::Disk) the simulation can
//! crash. Nothing here is meant for production use.

use std::cell::Cell;

use crate::execution::Timestamp;

thread_local! {
    static CLOCK: Cell<Option<fn() -> Timestamp>> = const { Cell::new(None) };
    static IDS: Cell<Option<u64>> = const { Cell::new(None) };
    static KILLING: Cell<bool> = const { Cell::new(false) };
}

/// Runs `kill` (the simulation dropping a host's tasks) as a SIGKILL: no destructor of the
/// crate on this thread writes anything meanwhile (a killed process runs none). Without it, a
/// dropped write would be driven in place for its bound in real time, with the whole
/// simulation waiting on a write that a killed process never makes.
pub fn kill<R>(kill: impl FnOnce() -> R) -> R {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            KILLING.with(|k| k.set(false));
        }
    }
    KILLING.with(|k| k.set(true));
    let _reset = Reset;
    kill()
}

/// Whether this thread is killing a simulated host (see [`kill`]).
pub(crate) fn killing() -> bool {
    KILLING.with(Cell::get)
}

/// Makes [`Timestamp::now`] on this thread read `clock` (until [`clear_clock`]).
pub fn set_clock(clock: fn() -> Timestamp) {
    CLOCK.with(|c| c.set(Some(clock)));
}

/// Makes [`Timestamp::now`] on this thread read the system clock again, and
/// [`ExecutionId::new`](crate::ExecutionId::new) use the process's generator again.
pub fn clear_clock() {
    CLOCK.with(|c| c.set(None));
    IDS.with(|c| c.set(None));
}

/// Makes [`ExecutionId::new`](crate::ExecutionId::new) on this thread draw from a sequence
/// that starts at `seed` (its time part from the installed clock), instead of the process's
/// generator, which every thread shares and whose values follow the wall clock: a simulation
/// then makes the same IDs every time it runs, whatever other threads do.
pub fn seed_ids(seed: u64) {
    IDS.with(|c| c.set(Some(seed)));
}

/// The next ID of this thread's seeded sequence, if [`seed_ids`] installed one.
pub(crate) fn next_id() -> Option<ulid::Ulid> {
    IDS.with(|c| {
        let next = c.get()?;
        c.set(Some(next.wrapping_add(1)));
        Some(ulid::Ulid::from_parts(
            Timestamp::now().as_millis(),
            u128::from(next),
        ))
    })
}

/// The installed clock's time, if one is installed on this thread.
pub(crate) fn now() -> Option<Timestamp> {
    CLOCK.with(Cell::get).map(|clock| clock())
}
