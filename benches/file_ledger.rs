//! The file ledger against its floor, in the same run: raw `write` + `fdatasync` of a line of
//! the same size on the same disk.
//!
//! - `append/1_caller`: one ledger append (one event, durable) vs one raw append + fdatasync.
//! - `executions/{16,64}_callers`: full executions (claim, authorized, dispatched, completed,
//!   delivered: five durable appends each) from concurrent callers sharing fsyncs (group
//!   commit), reported as executions per second.
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
    ExecutionId, IdempotencyKey,
    contract::RetryClass,
    ledger::{Claim, EventKind, FileLedger, Ledger, LedgerEvent, Timestamp},
};

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mrg-bench-{}", ExecutionId::new().ulid()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn claim(n: u64) -> Claim {
    Claim {
        fingerprint: format!("hmac-sha256:{:064x}", n).parse().unwrap(),
        tool: "deploy_release".into(),
        actor: "signed-process:com.example.agent".into(),
        intent_scope: "run:bench".into(),
        target: "deploy-api.internal.example/mcp".into(),
        credential_ref: None,
        retry_class: RetryClass::Irreversible,
        link_window: Duration::from_secs(60),
        retention: Duration::from_secs(60),
        owner: "guard:bench".into(),
        at: Timestamp::now(),
    }
}

async fn execution(ledger: &FileLedger, n: u64) {
    let id = ledger.claim(claim(n)).await.unwrap().record().execution_id;
    let event = |kind| LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    };
    ledger.append(event(EventKind::Authorized)).await.unwrap();
    let dispatched = EventKind::Dispatched {
        attempt: 1,
        idempotency_key: IdempotencyKey::from(id),
        key_from_caller: false,
        jsonrpc_id: Some(1.into()),
        session_id: None,
        owner: Some("guard:bench".into()),
    };
    ledger.append(event(dispatched)).await.unwrap();
    let completed = EventKind::Completed {
        target_status: 200,
        is_error: false,
        result_reference: None,
    };
    ledger.append(event(completed)).await.unwrap();
    ledger
        .append(event(EventKind::Delivered {
            jsonrpc_id: Some(1.into()),
        }))
        .await
        .unwrap();
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
        .block_on(ledger.claim(claim(u64::MAX)))
        .unwrap()
        .record()
        .execution_id;
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
