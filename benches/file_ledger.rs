//! The file ledger against its floor, in the same run: raw `write` + `fdatasync` of a line of
//! the same size on the same disk.
//!
//! - `append/1_caller`: one ledger append (one event, durable) vs one raw append + fdatasync.
//! - `executions/{1,16,64}_callers`: full executions as the guard writes them (the claim with
//!   its `dispatched`, `completed`, `delivered`: three appends, two of them synced) from
//!   concurrent callers sharing fsyncs (group commit), reported as executions per second.
//!
//! `cargo bench --bench file_ledger`

use std::{
    fs::OpenOptions,
    io::Write,
    path::PathBuf,
    time::{Duration, Instant},
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use mcp_replay_guard::{
    ExecutionId,
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::{FileLedger, Ledger},
};

mod support;

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mrg-bench-{}", ExecutionId::new().ulid()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records stay for a minute, as a guard's would.
const RETENTION: Duration = Duration::from_secs(60);

async fn execution(ledger: &FileLedger, n: u64) {
    support::execution(ledger, n, RETENTION).await;
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = dir();

    let mut group = c.benchmark_group("file_ledger_append");
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(6));
    group.throughput(Throughput::Elements(1));
    // A ledger line is about 330 bytes; the floor writes the same size.
    let line = vec![b'x'; 329]
        .into_iter()
        .chain([b'\n'])
        .collect::<Vec<u8>>();
    let mut raw = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("floor.jsonl"))
        .unwrap();
    group.bench_function("baseline_raw_append_fdatasync", |b| {
        b.iter(|| {
            raw.write_all(&line).unwrap();
            raw.sync_data().unwrap();
        })
    });
    let ledger = FileLedger::open(dir.join("append.jsonl")).unwrap();
    let id = rt
        .block_on(ledger.claim(support::claim(u64::MAX, RETENTION)))
        .unwrap()
        .record()
        .execution_id();
    group.bench_function("ledger_append_1_caller", |b| {
        b.to_async(&rt).iter(|| {
            let ledger = ledger.clone();
            async move {
                let seen = EventKind::EventSeen {
                    last_event_id: "0/1".into(),
                };
                ledger
                    .append(LedgerEvent {
                        execution_id: id,
                        at: Timestamp::now(),
                        kind: seen,
                    })
                    .await
                    .unwrap();
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("file_ledger_executions");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for callers in [1u64, 16, 64] {
        let ledger = FileLedger::open(dir.join(format!("executions-{callers}.jsonl"))).unwrap();
        let per_caller = 4u64;
        group.throughput(Throughput::Elements(callers * per_caller));
        let mut next = 0u64;
        group.bench_function(format!("{callers}_callers"), |b| {
            b.iter_custom(|iterations| {
                let start = Instant::now();
                for _ in 0..iterations {
                    let base = next;
                    next += callers * per_caller;
                    rt.block_on(async {
                        let tasks: Vec<_> = (0..callers)
                            .map(|c| {
                                let ledger = ledger.clone();
                                tokio::spawn(async move {
                                    for k in 0..per_caller {
                                        execution(&ledger, base + c * per_caller + k).await;
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.unwrap();
                        }
                    });
                }
                start.elapsed()
            })
        });
    }
    group.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
