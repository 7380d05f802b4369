//! Bytes per retained record with 1,000,000 executions in a `MemoryLedger`, next to its floor:
//! the same `ExecutionRecord`s in a bare `DashMap`.
//!
//! Each execution is what the guard writes for a call that completes and is delivered (the
//! claim with its `dispatched`, `completed`, `delivered`), retained for an hour. Kept
//! results are not included: a stored result adds its own bytes.
//!
//! Heap bytes are counted by a global allocator that wraps the system one and keeps a running
//! total of live bytes (requested sizes, not the allocator's rounding).
//!
//! Not a criterion bench (it measures bytes, not time), but kept with the benches so that it
//! runs with their build profile:
//!
//! `cargo bench --bench ledger_memory_footprint` (`-- 100000` for fewer records).

mod support;

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use dashmap::DashMap;
use mcp_replay_guard::{
    ExecutionId,
    execution::ExecutionRecord,
    ledger::{Ledger, MemoryLedger},
};

/// Live heap bytes. Hand-written rather than `dhat` or `stats_alloc`: dhat records a backtrace
/// per allocation (far too slow for millions), and a live-bytes counter is all that is needed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counter
// is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn main() {
    // `cargo bench` passes `--bench`; a bare number is the record count.
    let records: u64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|n| n.parse().expect("the argument is a number of records"))
        .unwrap_or(1_000_000);
    let retention = Duration::from_secs(3600);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();

    let base = live();
    let ledger = MemoryLedger::new();
    let started = std::time::Instant::now();
    rt.block_on(async {
        for n in 0..records {
            support::execution(&ledger, n, retention).await;
        }
    });
    let filled_in = started.elapsed();
    assert_eq!(ledger.len() as u64, records, "every record is retained");
    let ledger_bytes = live() - base;

    // The floor: the same records (copies taken before the ledger goes), alone in a map keyed
    // by execution ID. Counted from the same base once the ledger and the copies' vector are
    // gone, so the records' own strings count on both sides.
    let all: Vec<ExecutionRecord> = rt.block_on(ledger.list()).unwrap();
    drop(ledger);
    let floor: DashMap<ExecutionId, ExecutionRecord> = DashMap::new();
    for record in all {
        floor.insert(record.execution_id(), record);
    }
    let floor_bytes = live() - base;
    assert_eq!(floor.len() as u64, records);

    let per = |bytes: usize| bytes as f64 / records as f64;
    println!(
        "records retained: {records} (filled in {:.1} s, {:.0} executions/s)",
        filled_in.as_secs_f64(),
        records as f64 / filled_in.as_secs_f64()
    );
    println!(
        "memory ledger: {:.0} bytes/record ({:.1} MiB)",
        per(ledger_bytes),
        ledger_bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "floor (DashMap<ExecutionId, ExecutionRecord>): {:.0} bytes/record ({:.1} MiB)",
        per(floor_bytes),
        floor_bytes as f64 / (1024.0 * 1024.0)
    );
    println!(
        "ratio: {:.2}x (target: <= 400 bytes/record)",
        ledger_bytes as f64 / floor_bytes.max(1) as f64
    );
    // What a record is made of, for reading the figures.
    println!(
        "size_of: ExecutionRecord {} bytes, LedgerEvent {} bytes (5 events per record)",
        std::mem::size_of::<ExecutionRecord>(),
        std::mem::size_of::<mcp_replay_guard::execution::LedgerEvent>()
    );
}
