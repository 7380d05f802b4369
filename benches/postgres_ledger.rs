//! PostgreSQL ledger throughput at 32 concurrent callers, on one replica and two, next to its
//! floor in the same run.
//!
//! One execution is what the guard writes for a call that completes and is delivered: the
//! claim with its first `dispatched` (one transaction), `completed` and `delivered`
//! (`benches/support`), each caller running its executions one after the other, 8 per iteration;
//! criterion reports the time per iteration and, as throughput, executions per second.
//!
//! - `ledger/1 replica`: 32 callers on one `PostgresLedger` (256 executions);
//! - `ledger/2 replicas, 16 callers each`: the same 32 callers over two `PostgresLedger`s
//!   (separate pools and writers) sharing one ledger's tables, as two guard replicas would
//!   (256 executions);
//! - `ledger/2 replicas, 32 callers each`: each replica as loaded as the one above, 64
//!   callers in all (512 executions): what a second replica adds;
//! - `floor/insert transaction`: the baseline, one trivial single-row INSERT transaction
//!   (`BEGIN; INSERT; COMMIT`) per execution, at the same concurrency, over a pool of 32
//!   connections.
//!
//! ```text
//! MCP_REPLAY_GUARD_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/mrg_dev \
//!     cargo bench --features postgres --bench postgres_ledger
//! ```
//!
//! Without the variable the bench says so and measures nothing. It works in a schema of its
//! own (`mrg_bench_<ulid>`), dropped at the end.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deadpool_postgres::{Pool, PoolConfig, Runtime};
use mcp_replay_guard::{ExecutionId, ledger::PostgresLedger};
use tokio_postgres::NoTls;

mod support;

const URL_VAR: &str = "MCP_REPLAY_GUARD_POSTGRES_URL";
const CALLERS: usize = 32;
/// Executions per caller per iteration.
const EACH: usize = 8;

static NEXT_INTENT: AtomicU64 = AtomicU64::new(1);

/// One execution of a new intent, as the guard writes it.
async fn execution(ledger: &PostgresLedger) {
    let n = NEXT_INTENT.fetch_add(1, Ordering::Relaxed);
    support::execution(ledger, n, Duration::from_secs(3600)).await;
}

/// `EACH` executions for each of `callers` callers, spread over the replicas.
async fn ledger_batch(replicas: &[PostgresLedger], callers: usize) {
    let callers: Vec<_> = (0..callers)
        .map(|caller| {
            let ledger = replicas[caller % replicas.len()].clone();
            tokio::spawn(async move {
                for _ in 0..EACH {
                    execution(&ledger).await;
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
}

/// The floor: one single-row INSERT transaction per execution, same concurrency.
async fn floor_batch(pool: &Pool, table: &str) {
    let callers: Vec<_> = (0..CALLERS)
        .map(|_| {
            let pool = pool.clone();
            let insert = format!("INSERT INTO {table} (execution_id) VALUES ($1)");
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let mut client = pool.get().await.unwrap();
                    let statement = client.prepare_cached(&insert).await.unwrap();
                    let tx = client.transaction().await.unwrap();
                    tx.execute(&statement, &[&ExecutionId::new().to_string()])
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.unwrap();
    }
}

fn postgres_ledger(c: &mut Criterion) {
    let Some(url) = std::env::var(URL_VAR).ok().filter(|u| !u.trim().is_empty()) else {
        eprintln!(
            "postgres_ledger bench skipped: {URL_VAR} is not set \
             (e.g. {URL_VAR}=postgres://postgres@127.0.0.1:5432/mrg_dev)"
        );
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let schema = format!(
        "mrg_bench_{}",
        ExecutionId::new().ulid().to_string().to_lowercase()
    );
    let (one, two, pool) = runtime.block_on(async {
        let one = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        let two = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        let mut config = deadpool_postgres::Config::new();
        config.url = Some(url.clone());
        config.pool = Some(PoolConfig::new(CALLERS));
        let pool = config.create_pool(Some(Runtime::Tokio1), NoTls).unwrap();
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!(
                "CREATE TABLE \"{schema}\".bench_floor (id BIGSERIAL PRIMARY KEY, \
                 execution_id TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT now())"
            ))
            .await
            .unwrap();
        (one, two, pool)
    });
    let floor_table = format!("\"{schema}\".bench_floor");

    let mut group = c.benchmark_group("postgres executions");
    let executions = |callers: usize| Throughput::Elements((callers * EACH) as u64);
    group.throughput(executions(CALLERS));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(15));
    let replicas = [one.clone()];
    group.bench_function("ledger/1 replica", |b| {
        b.to_async(&runtime)
            .iter(|| ledger_batch(&replicas, CALLERS))
    });
    let replicas = [one.clone(), two.clone()];
    group.bench_function("ledger/2 replicas, 16 callers each", |b| {
        b.to_async(&runtime)
            .iter(|| ledger_batch(&replicas, CALLERS))
    });
    group.throughput(executions(2 * CALLERS));
    group.bench_function("ledger/2 replicas, 32 callers each", |b| {
        b.to_async(&runtime)
            .iter(|| ledger_batch(&replicas, 2 * CALLERS))
    });
    group.throughput(executions(CALLERS));
    group.bench_function("floor/insert transaction", |b| {
        b.to_async(&runtime)
            .iter(|| floor_batch(&pool, &floor_table))
    });
    group.finish();

    runtime.block_on(async {
        let report = one.verify().await.unwrap();
        assert!(report.is_ok(), "{report}");
        eprintln!("chain after the bench: {report}");
        pool.get()
            .await
            .unwrap()
            .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
            .await
            .unwrap();
    });
}

criterion_group!(benches, postgres_ledger);
criterion_main!(benches);
