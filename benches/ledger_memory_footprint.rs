//! Bytes per retained record with 1,000,000 executions in a `MemoryLedger` and in a
//! `FileLedger` (the index a long-running process keeps of its file, as it filled it and as a
//! reopen rebuilds it), next to their floor: the same `ExecutionRecord`s in a bare `DashMap`.
//!
//! Each execution is what the guard writes for a call that completes and is delivered (the
//! claim with its `dispatched`, `completed`, `delivered`), retained for an hour. Kept
//! results are not included: a stored result adds its own bytes. The file ledger is filled by
//! 64 callers at once (group commit), in a file under the system's temp dir (about 1.6 KB of
//! file per execution; `MRG_BENCH_DIR` names another directory), removed at the end.
//!
//! Heap bytes are counted by a global allocator that wraps the system one and keeps a running
//! total of live bytes (requested sizes, not the allocator's rounding).
//!
//! Not a criterion bench (it measures bytes, not time), but kept with the benches so that it
//! runs with their build profile:
//!
//! `cargo bench --bench ledger_memory_footprint` (`-- 100000` for fewer records; `-- file` or
//! `-- memory` for one ledger).

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
    ledger::{FileLedger, Ledger, MemoryLedger},
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

/// Callers at once while a file ledger fills.
const FILE_CALLERS: u64 = 64;

fn main() {
    // `cargo bench` passes `--bench`; a bare number is the record count, a word the ledger.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let records: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let only = |which: &str| {
        !args.iter().any(|a| a == "file" || a == "memory") || args.iter().any(|a| a == which)
    };
    if only("memory") {
        memory_ledger(records);
    }
    if only("file") {
        file_ledger(records);
    }
}

/// The file ledger, filled, then reopened: bytes per record, against the same records' floor.
fn file_ledger(records: u64) {
    let retention = Duration::from_secs(3600);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let dir = std::env::var_os("MRG_BENCH_DIR")
        .map_or_else(std::env::temp_dir, std::path::PathBuf::from)
        .join(format!("mrg-footprint-{}", ExecutionId::new().ulid()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.jsonl");

    let base = live();
    let ledger = FileLedger::open(&path).unwrap();
    let started = std::time::Instant::now();
    rt.block_on(async {
        let callers: Vec<_> = (0..FILE_CALLERS)
            .map(|caller| {
                let ledger = ledger.clone();
                tokio::spawn(async move {
                    for n in (caller..records).step_by(FILE_CALLERS as usize) {
                        support::execution(&ledger, n, retention).await;
                    }
                })
            })
            .collect();
        for caller in callers {
            caller.await.unwrap();
        }
    });
    let filled_in = started.elapsed();
    let filled = live() - base;
    drop(ledger);
    let file_bytes = std::fs::metadata(&path).unwrap().len();

    let base = live();
    let started = std::time::Instant::now();
    let reopened = FileLedger::open(&path).unwrap();
    let reopened_in = started.elapsed();
    let reopened_bytes = live() - base;
    let count = rt.block_on(reopened.list()).unwrap().len() as u64;
    assert_eq!(count, records, "every record is retained");
    drop(reopened);
    std::fs::remove_dir_all(&dir).unwrap();

    let per = |bytes: usize| bytes as f64 / records as f64;
    println!(
        "file ledger: {records} executions retained (filled by {FILE_CALLERS} callers in {:.1} s, \
         {:.0} executions/s; {:.0} bytes of file each); reopened in {:.1} s",
        filled_in.as_secs_f64(),
        records as f64 / filled_in.as_secs_f64(),
        file_bytes as f64 / records as f64,
        reopened_in.as_secs_f64()
    );
    println!(
        "file ledger, as filled: {:.0} bytes/record ({:.1} MiB)",
        per(filled),
        filled as f64 / (1024.0 * 1024.0)
    );
    println!(
        "file ledger, reopened: {:.0} bytes/record ({:.1} MiB) (target: <= 400 bytes/record)",
        per(reopened_bytes),
        reopened_bytes as f64 / (1024.0 * 1024.0)
    );
}

/// The memory ledger and the floor.
fn memory_ledger(records: u64) {
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
