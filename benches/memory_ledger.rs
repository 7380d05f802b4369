//! The memory ledger, empty and full, against its floor, in the same run.
//!
//! - `memory_ledger/ledger_execution_empty`: one execution as the guard writes it: the claim
//!   with its `dispatched`, then `completed` and `delivered`, each awaited in turn, into a ledger that keeps nothing (records expire at once and leave at the
//!   next sweep, every 1,024 claims);
//! - `memory_ledger/ledger_execution_1m_retained`: the same into a ledger prefilled once with
//!   1,000,000 executions retained for an hour (and retaining the new ones too);
//! - `memory_ledger/floor_dashmap_insert`: the floor, one `DashMap` insert of the same
//!   `ExecutionRecord` under a new execution ID (cleared every 1,024 inserts);
//! - `concurrency/{mutex,sharded}/{1,64}`: executions from 1 and from 64 concurrent tasks on a
//!   two-thread runtime (retained an hour: with 64 callers a record that expired at once could
//!   leave between a caller's claim and its appends), into the ledger (one lock over its
//!   index) and into 16 ledgers with claims routed by intent and appends by a map from
//!   execution ID to shard (the sharded alternative `MemoryLedger`'s lock is measured against).
//!
//! Before criterion runs, the bench times both ledgers itself (median of 5 rounds of 20,000
//! executions each) and prints the full/empty ratio: the target is ≥ 0.7.
//!
//! `cargo bench --bench memory_ledger` (`MEMORY_LEDGER_PREFILL=100000` for a smaller prefill).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dashmap::DashMap;
use mcp_replay_guard::{
    ExecutionId,
    execution::ExecutionRecord,
    ledger::{Ledger, MemoryLedger},
};

mod support;

/// Records of the empty ledger leave at its next sweep.
const NOTHING_KEPT: Duration = Duration::ZERO;
/// Records of the full ledger stay an hour: none leaves during the bench.
const AN_HOUR: Duration = Duration::from_secs(3600);
/// The ledger's sweep cadence (`SWEEP_EVERY` in `src/ledger/index.rs`), copied by the floor.
const SWEEP_EVERY: u64 = 1024;

fn prefill() -> u64 {
    std::env::var("MEMORY_LEDGER_PREFILL")
        .ok()
        .map(|n| n.parse().expect("MEMORY_LEDGER_PREFILL is a number"))
        .unwrap_or(1_000_000)
}

/// Executions per second into `ledger` (kept for `retention`), intents numbered from `next`:
/// the median of 5 rounds of 20,000.
fn executions_per_second(
    rt: &tokio::runtime::Runtime,
    ledger: &MemoryLedger,
    next: &mut u64,
    retention: Duration,
) -> f64 {
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            rt.block_on(async {
                for _ in 0..20_000 {
                    *next += 1;
                    support::execution(ledger, *next, retention).await;
                }
            });
            20_000.0 / started.elapsed().as_secs_f64()
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[2]
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let empty = MemoryLedger::new();
    let full = MemoryLedger::new();
    let prefill = prefill();
    let started = Instant::now();
    rt.block_on(async {
        for n in 0..prefill {
            support::execution(&full, n, AN_HOUR).await;
        }
    });
    println!(
        "prefilled {prefill} executions in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (mut next_empty, mut next_full) = (prefill, 2 * prefill);
    let empty_rate = executions_per_second(&rt, &empty, &mut next_empty, NOTHING_KEPT);
    let full_rate = executions_per_second(&rt, &full, &mut next_full, AN_HOUR);
    println!(
        "empty: {empty_rate:.0} executions/s; {prefill} retained: {full_rate:.0} executions/s; \
         ratio {:.2} (target >= 0.7)",
        full_rate / empty_rate
    );

    let mut group = c.benchmark_group("memory_ledger");
    group.throughput(Throughput::Elements(1));

    // The record the floor keeps: the ledger's own record of a completed, delivered execution.
    let template: ExecutionRecord = rt.block_on(async {
        let ledger = MemoryLedger::new();
        support::execution(&ledger, 0, NOTHING_KEPT).await;
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
            // A record-sized value under a fresh key: the map's own cost.
            floor.insert(ExecutionId::new(), template.clone());
        })
    });
    group.bench_function("ledger_execution_empty", |b| {
        b.to_async(&rt).iter(|| {
            next_empty += 1;
            support::execution(&empty, next_empty, NOTHING_KEPT)
        })
    });
    group.bench_function("ledger_execution_1m_retained", |b| {
        b.to_async(&rt).iter(|| {
            next_full += 1;
            support::execution(&full, next_full, AN_HOUR)
        })
    });
    group.finish();
    drop(full);

    concurrency(c);
}

/// The sharded alternative: ledgers chosen by intent for a claim, and by a map from execution
/// ID to shard for an append (an append names only its execution).
struct Sharded {
    shards: Vec<MemoryLedger>,
    route: DashMap<ExecutionId, usize>,
}

impl Sharded {
    async fn execution(&self, n: u64) {
        let shard = &self.shards[(n % self.shards.len() as u64) as usize];
        let id = support::claim_dispatched(shard, n, AN_HOUR).await;
        self.route
            .insert(id, (n % self.shards.len() as u64) as usize);
        let shard = &self.shards[*self.route.get(&id).unwrap()];
        std::hint::black_box(shard.complete(support::completed(id), None).await.unwrap());
        let shard = &self.shards[*self.route.get(&id).unwrap()];
        std::hint::black_box(shard.append_unsynced(support::delivered(id)).await.unwrap());
        // What a sweep would do when the record leaves.
        self.route.remove(&id);
    }
}

fn concurrency(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mutex = MemoryLedger::new();
    let sharded = Arc::new(Sharded {
        shards: (0..16).map(|_| MemoryLedger::new()).collect(),
        route: DashMap::new(),
    });
    let next = Arc::new(AtomicU64::new(0));
    let mut group = c.benchmark_group("concurrency");
    group.throughput(Throughput::Elements(1));
    for callers in [1u64, 64] {
        group.bench_function(BenchmarkId::new("mutex", callers), |b| {
            b.iter_custom(|iters| {
                let tasks = (0..callers).map(|_| {
                    let (ledger, next) = (mutex.clone(), next.clone());
                    tokio::spawn(async move {
                        for _ in 0..iters.div_ceil(callers) {
                            let n = next.fetch_add(1, Ordering::Relaxed);
                            support::execution(&ledger, n, AN_HOUR).await;
                        }
                    })
                });
                let started = Instant::now();
                rt.block_on(async {
                    for task in tasks.collect::<Vec<_>>() {
                        task.await.unwrap();
                    }
                });
                started.elapsed()
            })
        });
        group.bench_function(BenchmarkId::new("sharded", callers), |b| {
            b.iter_custom(|iters| {
                let tasks = (0..callers).map(|_| {
                    let (sharded, next) = (sharded.clone(), next.clone());
                    tokio::spawn(async move {
                        for _ in 0..iters.div_ceil(callers) {
                            sharded
                                .execution(next.fetch_add(1, Ordering::Relaxed))
                                .await;
                        }
                    })
                });
                let started = Instant::now();
                rt.block_on(async {
                    for task in tasks.collect::<Vec<_>>() {
                        task.await.unwrap();
                    }
                });
                started.elapsed()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
