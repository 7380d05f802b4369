//! The memory ledger against its floor, in the same run.
//!
//! - `ledger_execution`: one execution as the guard writes it: claim (`accepted`) and four
//!   appends (`authorized`, `dispatched`, `completed`, `delivered`), each awaited in turn;
//! - `floor_dashmap_insert`: the floor, one `DashMap` insert of the same `ExecutionRecord`
//!   under a new execution ID (what keeping a record costs at the very least).
//!
//! Both keep their maps small the same way: records expire at once and the ledger sweeps them
//! every 1,024 claims, the floor clears its map every 1,024 inserts.
//!
//! `cargo bench --bench memory_ledger`

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dashmap::DashMap;
use mcp_replay_guard::{
    ExecutionId,
    ledger::{ExecutionRecord, Ledger, MemoryLedger},
};

mod support;

/// Records leave the ledger at its next sweep. (Retained records would make the comparison
/// drift: the ledger's sweep visits every retained record, see BENCHMARKS.md.)
const RETENTION: Duration = Duration::ZERO;
/// The ledger's sweep cadence (`SWEEP_EVERY` in `src/ledger/memory.rs`), copied by the floor.
const SWEEP_EVERY: u64 = 1024;

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("memory_ledger");
    group.throughput(Throughput::Elements(1));

    // The record the floor keeps: the ledger's own record of a completed, delivered execution.
    let template: ExecutionRecord = rt.block_on(async {
        let ledger = MemoryLedger::new();
        support::execution(&ledger, 0, RETENTION).await;
        ledger.list().await.unwrap().remove(0)
    });
    let floor: DashMap<ExecutionId, ExecutionRecord> = DashMap::new();
    let mut inserted = 0u64;
    group.bench_function("floor_dashmap_insert", |b| {
        b.iter(|| {
            inserted += 1;
            if inserted.is_multiple_of(SWEEP_EVERY) {
                floor.clear();
            }
            let mut record = template.clone();
            record.execution_id = ExecutionId::new();
            floor.insert(record.execution_id, record);
        })
    });

    let ledger = MemoryLedger::new();
    let mut next = 1u64;
    group.bench_function("ledger_execution", |b| {
        b.to_async(&rt).iter(|| {
            next += 1;
            support::execution(&ledger, next, RETENTION)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
