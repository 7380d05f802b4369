//! The PostgreSQL ledger (feature `postgres`): one ledger shared by every replica of a guard.
//!
//! The module is private; its one public item, [`PostgresLedger`], is re-exported as
//! `mcp_replay_guard::ledger::PostgresLedger` and carries the documentation: the example, the
//! tables, how the chain stays linear across replicas, owner liveness and retention.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    future::Future,
    pin::Pin,
    str::FromStr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    task::Poll,
    time::Duration,
};

use async_trait::async_trait;
use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{NoTls, Row, types::ToSql};

use super::{
    Claim, Claimed, Correlation, EventKind, ExecutionRecord, ExecutionState, Ledger, LedgerError,
    LedgerEvent, StorageError, Timestamp,
    chain::{self, ChainHash, ChainProblem, ChainedLine, LineBody, VerifyReport},
    index::{Index, IntentKey},
    result_reference,
};
use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target, contract::RetryClass,
    fingerprint::Fingerprint,
};

/// The schema used when none is named.
const DEFAULT_SCHEMA: &str = "public";
/// The schema version this build writes.
const SCHEMA_VERSION: i32 = 1;
/// The migrations, in order; `{s}` is the quoted schema.
const MIGRATIONS: &[&str] = &[r#"
CREATE TABLE IF NOT EXISTS {s}.mrg_events (
    seq BIGINT PRIMARY KEY CHECK (seq > 0),
    prev TEXT NOT NULL,
    hash TEXT NOT NULL,
    execution_id TEXT,
    line TEXT NOT NULL,
    recorded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS mrg_events_execution ON {s}.mrg_events (execution_id, seq);
CREATE TABLE IF NOT EXISTS {s}.mrg_executions (
    execution_id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    intent_scope TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    tool TEXT NOT NULL,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    accepted_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    link_until_ms BIGINT NOT NULL,
    retain_until_ms BIGINT NOT NULL,
    record JSON NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
CREATE INDEX IF NOT EXISTS mrg_executions_intent
    ON {s}.mrg_executions (actor, intent_scope, fingerprint, accepted_seq DESC);
CREATE INDEX IF NOT EXISTS mrg_executions_retain ON {s}.mrg_executions (retain_until_ms);
CREATE INDEX IF NOT EXISTS mrg_executions_owner ON {s}.mrg_executions (owner);
CREATE TABLE IF NOT EXISTS {s}.mrg_results (
    reference TEXT PRIMARY KEY,
    execution_id TEXT NOT NULL REFERENCES {s}.mrg_executions (execution_id) ON DELETE CASCADE,
    bytes BYTEA NOT NULL,
    stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS mrg_results_execution ON {s}.mrg_results (execution_id);
CREATE TABLE IF NOT EXISTS {s}.mrg_owners (
    owner TEXT PRIMARY KEY,
    first_seen TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);
"#];

/// Connections in a pool made by [`PostgresLedger::connect`].
const POOL_SIZE: usize = 16;
/// Connect timeout when the URL sets none.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a call waits for a pooled connection.
const POOL_WAIT: Duration = Duration::from_secs(30);
/// How many scheduler turns the writer gives answered callers to come back before it starts
/// the next transaction.
const GATHER_TURNS: usize = 8;
/// The most calls one write transaction takes.
const MAX_BATCH: usize = 512;
/// Calls waiting for the writer before callers wait to enqueue.
const QUEUE: usize = 4096;
/// How many claims pass between two purges of expired records.
const SWEEP_EVERY: u64 = 1024;
/// Settings of a write transaction: a lock wait that cannot hang forever; a transaction that
/// cannot stay open (holding the chain lock) if its writer stalls; and index lookups for the
/// batch's reads whatever the tables' size (a prepared statement keeps a generic plan, and one
/// made while the tables were small scans them whole once they are not; custom plans would
/// avoid that too, at the price of planning every batch under the lock).
const WRITE_SETTINGS: &str = "SET LOCAL lock_timeout = '30s'; \
     SET LOCAL idle_in_transaction_session_timeout = '60s'; \
     SET LOCAL enable_seqscan = off";

/// A ledger in PostgreSQL, shared by every replica of a guard that connects to the same
/// database and schema. It keeps the same two things as the file ledger, in tables:
///
/// - `mrg_events`, the tamper-evident chain: one row per event, holding the exact JSON text of
///   its sealed [`ChainedLine`](super::chain::ChainedLine) (`seq`, `prev`, `hash` and the event),
///   so that [`PostgresLedger::verify`] re-hashes exactly what was sealed;
/// - `mrg_executions`, the index the guard decides from: one row per execution still inside its
///   retention, with its record.
///
/// ```no_run
/// use mcp_replay_guard::{
///     contract::{ContractRegistry, ToolContract},
///     fingerprint::FingerprintKey,
///     guard::GuardLayer,
///     ledger::PostgresLedger,
/// };
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// // Creates (or migrates) the tables on first use; every replica connects the same way.
/// let ledger = PostgresLedger::connect("postgres://guard@db.internal/guard").await?;
/// let contracts = ContractRegistry::builder()
///     .tool("deploy_release", ToolContract::irreversible())
///     .build()?;
/// let layer = GuardLayer::new(ledger.clone(), contracts, FingerprintKey::generate()?);
/// # let _ = layer;
///
/// // An audit, at any time, from any replica.
/// let report = ledger.verify().await?;
/// assert!(report.is_ok(), "{report}");
/// # Ok(())
/// # }
/// ```
///
/// # Tables
///
/// In the ledger's schema (`public` unless [`PostgresLedger::connect_with_schema`] names one):
///
/// | table | what it holds |
/// |---|---|
/// | `mrg_schema_version` | one row per applied migration (`version`, `applied_at`) |
/// | `mrg_events` | the chain: `seq` (primary key), `prev`, `hash`, `execution_id`, `line` (the sealed JSON text) |
/// | `mrg_executions` | the index: `execution_id` (primary key), `actor`, `intent_scope`, `fingerprint`, `tool`, `state` (as the JSON form spells it), `owner`, `accepted_seq`, `last_seq`, `link_until_ms`, `retain_until_ms`, `record` (JSON text with every field of the record; cast it to `jsonb` to query it) |
/// | `mrg_results` | kept results: `reference` (primary key), `execution_id`, `bytes` |
/// | `mrg_owners` | owner leases: `owner` (primary key), `lease_until` |
///
/// The tables are created, or migrated, when a ledger connects, under a transaction-scoped
/// advisory lock, so replicas that start together do not race each other.
///
/// # How the chain stays linear
///
/// Every write (the `accepted` event of a new execution and every appended event) happens in
/// one transaction that first takes a transaction-scoped advisory lock of the schema's chain
/// (`pg_advisory_xact_lock`), then reads the chain's head and the records it changes, applies
/// the events through the state machine ([`ExecutionRecord::apply`]), inserts the sealed lines
/// and upserts the index rows, and commits. Only one transaction holds the lock at a time,
/// whichever replica runs it, so `seq` has no gaps and no forks, and a claim that finds no
/// linkable execution creates one before any other claim can look: exactly one
/// [`Claimed::New`] per intent.
///
/// Writes from one ledger (and its clones) are batched: while a transaction runs, the calls
/// that arrive queue, and the next transaction takes all of them (up to 512), after giving
/// the callers it just answered a few scheduler turns to come back (no timer: under load one
/// commit serves every caller; a lone call never waits). Each event is still checked on its
/// own: a refused event writes nothing and fails only its own call. The batch commits as a
/// whole; when the commit fails, every call in it fails and nothing was recorded. The writes run on a task spawned on the tokio runtime that connected, so a caller
/// that gives up never leaves a transaction half done.
///
/// # Owner liveness
///
/// An execution's `owner` is the guard that claimed it, then the guard that dispatched its
/// latest attempt (ownership moves with every `dispatched`, so a continuation in another
/// replica belongs to that replica's guard). Owners hold a lease in `mrg_owners`, taken (or
/// renewed) in the claim's or the dispatch's own transaction and renewed every
/// [`OWNER_HEARTBEAT`](Self::OWNER_HEARTBEAT) (10 s) by the ledger they claimed through, for
/// [`OWNER_LEASE`](Self::OWNER_LEASE) (30 s); when that ledger (every clone) is dropped, the
/// leases are released. [`Ledger::is_owner_alive`] answers from the lease, on the database's
/// clock; an owner that never claimed is not alive, and when the database cannot be read the
/// answer is "alive", which makes a repeat wait (bounded) rather than continue someone else's
/// attempt.
///
/// # Retention
///
/// [`PostgresLedger::purge_expired`] removes the executions whose retention ended (and their
/// kept results) from the index; their events stay in the chain, which is never rewritten. A
/// ledger also purges on its own, as the memory ledger does, once every 1024 claims, at the
/// claim's time.
///
/// # What is recorded
///
/// What every ledger records (see [the ledger module](crate::ledger)); in PostgreSQL, no
/// connection URL and no password appear in a row, a log line, an error or the `Debug`
/// output.
///
/// # Clone
///
/// Clones share the pool, the writer and the owner leases.
#[derive(Clone)]
pub struct PostgresLedger {
    core: Arc<Core>,
    writes: mpsc::Sender<Write>,
}

impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the URL or the pool's configuration: they may carry a password.
        f.debug_struct("PostgresLedger")
            .field("schema", &self.core.schema)
            .field("pool", &self.core.pool.status())
            .finish_non_exhaustive()
    }
}

impl PostgresLedger {
    /// How long an owner's lease lasts without renewal.
    pub const OWNER_LEASE: Duration = Duration::from_secs(30);

    /// How often a ledger renews the leases of the owners that claimed through it.
    pub const OWNER_HEARTBEAT: Duration = Duration::from_secs(10);

    /// Connects to `url` (`postgres://user[:password]@host[:port]/database`, or the key=value
    /// form; without TLS: use [`from_pool`](Self::from_pool) with your own pool for TLS), and
    /// creates or migrates the ledger's tables in the `public` schema.
    ///
    /// The pool holds up to 16 connections; a connect timeout of 10 s applies unless the URL
    /// sets `connect_timeout`.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with_schema(url, DEFAULT_SCHEMA).await
    }

    /// As [`connect`](Self::connect), in `schema` (created if missing). Ledgers in different
    /// schemas of one database are independent: separate chains, indexes and locks. A schema
    /// name is lower-case ASCII letters, digits and `_`, not starting with a digit, at most 63
    /// bytes.
    pub async fn connect_with_schema(url: &str, schema: &str) -> Result<Self, LedgerError> {
        let password = url_password(url);
        let redact = |message: String| match &password {
            Some(p) if !p.is_empty() => message.replace(p.as_str(), "***"),
            _ => message,
        };
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            LedgerError::storage(redact(format!(
                "the PostgreSQL URL is not valid ({e}); expected \
                 postgres://user[:password]@host[:port]/database"
            )))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("mcp-replay-guard");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| {
                LedgerError::storage(redact(format!(
                    "could not build the PostgreSQL connection pool ({e}); this is a bug: \
                     please report it"
                )))
            })?;
        Self::from_pool_with_schema(pool, schema)
            .await
            .map_err(|e| match e {
                LedgerError::Storage(message) => LedgerError::Storage(message.map_message(redact)),
                other => other,
            })
    }

    /// A ledger over an existing `deadpool_postgres::Pool` (deadpool-postgres 0.14: for TLS,
    /// another pool size or other timeouts), in the `public` schema; creates or migrates the
    /// tables. The ledger's writer holds one of the pool's connections while it writes.
    pub async fn from_pool(pool: Pool) -> Result<Self, LedgerError> {
        Self::from_pool_with_schema(pool, DEFAULT_SCHEMA).await
    }

    /// A ledger over an existing pool, in `schema` (see
    /// [`connect_with_schema`](Self::connect_with_schema)); creates or migrates the tables.
    ///
    /// Must be called inside a tokio runtime: the ledger's writer runs on it.
    pub async fn from_pool_with_schema(pool: Pool, schema: &str) -> Result<Self, LedgerError> {
        check_schema_name(schema)?;
        let quoted = format!("\"{schema}\"");
        migrate(&pool, schema, &quoted).await?;
        let core = Arc::new(Core {
            sql: Sql::new(&quoted),
            chain_lock: chain_lock_key(schema),
            schema: schema.to_owned(),
            pool,
            owners: Mutex::new(HashSet::new()),
            claims: AtomicU64::new(0),
        });
        core.log_head().await;
        let (writes, queue) = mpsc::channel(QUEUE);
        tokio::spawn(run_writer(core.clone(), queue));
        let ledger = Self { core, writes };
        ledger.settle_orphans().await?;
        Ok(ledger)
    }

    /// On connect, as the file ledger on open: an execution left `dispatched` by an owner
    /// whose lease ended has an unknown outcome
    /// ([`decide::orphan_unknown`](crate::decide::orphan_unknown)). Each `unknown` goes
    /// through the writer like any append and names its attempt, so one that another replica
    /// moved meanwhile is refused by the state machine and left as that replica wrote it.
    async fn settle_orphans(&self) -> Result<(), LedgerError> {
        let rows = {
            let client = self.core.client().await?;
            client
                .query(self.core.sql.dispatched.as_str(), &[])
                .await
                .map_err(|e| read_failed("reading dispatched executions", e))?
        };
        for row in rows {
            let record = record_from_json(row.get(0))?;
            let alive: bool = row.get(1);
            let Some(event) = crate::decide::orphan_unknown(&record, alive, Timestamp::now())
            else {
                continue;
            };
            match self.append(event).await {
                Ok(_) => {
                    tracing::warn!(execution_id = %record.execution_id, "dispatched by a process that is gone: outcome unknown")
                }
                Err(error) if error.is_invalid_transition() => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// The schema the ledger's tables are in.
    pub fn schema(&self) -> &str {
        &self.core.schema
    }

    /// The connection pool (for operators' queries; the ledger's own writes go through its
    /// writer).
    pub fn pool(&self) -> &Pool {
        &self.core.pool
    }

    /// Verifies the whole chain: reads `mrg_events` in `seq` order and checks every stored
    /// line against its hash and the line before it ([`chain::Verifier::from_genesis`]: this
    /// ledger never compacts, so its chain starts at seq 1), then checks that the
    /// `seq`, `prev`, `hash` and `execution_id` columns say what their line says. The report
    /// names the first bad `seq` and why.
    ///
    /// The chain is read into memory at once.
    pub async fn verify(&self) -> Result<VerifyReport, LedgerError> {
        let client = self.core.client().await?;
        let rows = client
            .query(self.core.sql.chain.as_str(), &[])
            .await
            .map_err(|e| read_failed("reading the chain", e))?;
        let lines: Vec<String> = rows.iter().map(|row| row.get(4)).collect();
        // This ledger never compacts: its chain starts at seq 1, a leading checkpoint is forged.
        let mut verifier = chain::Verifier::from_genesis();
        verifier.segment(lines.iter().map(String::as_str));
        let mut report = verifier.finish();
        // The columns are a copy of what the line says, for queries: a copy that disagrees
        // with its line was edited.
        let mut head = chain::ChainHead::GENESIS;
        let mut checked = 0;
        for (row, text) in rows.iter().zip(&lines) {
            if checked == report.verified {
                break;
            }
            if text.trim().is_empty() {
                continue;
            }
            let Ok(line) = serde_json::from_str::<LineColumns>(text) else {
                break;
            };
            let agrees = u64::try_from(row.get::<_, i64>(0)).ok() == Some(line.seq)
                && row.get::<_, String>(1) == line.prev
                && row.get::<_, String>(2) == line.hash
                && row.get::<_, Option<String>>(3) == line.execution_id;
            if !agrees {
                report.first_bad = Some((line.seq, ChainProblem::Edited));
                report.verified = checked;
                report.head = head.hash;
                report.head_seq = head.seq;
                break;
            }
            head = (line.seq, line.hash.parse().unwrap_or(ChainHash::GENESIS)).into();
            checked += 1;
        }
        Ok(report)
    }

    /// Removes from the index every execution whose retention ended before `now`, with its
    /// kept result, and the leases of owners that expired and own nothing left in the index;
    /// returns how many executions. Their events stay in the chain.
    pub async fn purge_expired(&self, now: Timestamp) -> Result<u64, LedgerError> {
        self.core.purge(now).await
    }

    async fn submit<T>(
        &self,
        write: impl FnOnce(oneshot::Sender<Result<T, LedgerError>>) -> Write,
    ) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.writes
            .send(write(reply))
            .await
            .map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }
}

#[async_trait]
impl Ledger for PostgresLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        self.submit(|reply| Write::Claim(claim, reply)).await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.submit(|reply| Write::Append(event, reply)).await
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        let client = self.core.client().await?;
        let row = client
            .query_opt(self.core.sql.get.as_str(), &[&execution_id.to_string()])
            .await
            .map_err(|e| read_failed("reading an execution", e))?;
        row.map(|row| record_from_json(row.get(0))).transpose()
    }

    /// The events of an execution, oldest first, read from the chain. The chain keeps them
    /// after the execution left the index.
    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        let client = self.core.client().await?;
        let rows = client
            .query(self.core.sql.events.as_str(), &[&execution_id.to_string()])
            .await
            .map_err(|e| read_failed("reading an execution's events", e))?;
        let mut events = Vec::with_capacity(rows.len());
        for row in rows {
            let seq: i64 = row.get(0);
            let line = chain::parse_line(row.get(1)).map_err(|detail| {
                LedgerError::storage(format!(
                    "the chain line at seq {seq} cannot be read ({detail}); run \
                     `PostgresLedger::verify` and inspect mrg_events"
                ))
            })?;
            // The execution_id column is an index: the line itself decides.
            if let LineBody::Event(event) = line.body
                && event.execution_id == execution_id
            {
                events.push(event);
            }
        }
        Ok(events)
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        let client = self.core.client().await?;
        let rows = client
            .query(self.core.sql.list.as_str(), &[])
            .await
            .map_err(|e| read_failed("listing executions", e))?;
        rows.iter()
            .map(|row| record_from_json(row.get(0)))
            .collect()
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        let reference = result_reference(execution_id);
        let client = self.core.client().await?;
        let stored = client
            .execute(
                self.core.sql.store_result.as_str(),
                &[&reference, &execution_id.to_string(), &result.as_ref()],
            )
            .await;
        match stored {
            Ok(1) => Ok(reference),
            Ok(_) => Err(LedgerError::NotFound(execution_id)),
            // The execution was purged between the check and the insert.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
                Err(LedgerError::NotFound(execution_id))
            }
            Err(e) => Err(LedgerError::caused(
                format!(
                    "{}; the result was not kept",
                    describe("storing a result", &e)
                ),
                e,
            )),
        }
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        let client = self.core.client().await?;
        let row = client
            .query_opt(self.core.sql.load_result.as_str(), &[&reference])
            .await
            .map_err(|e| read_failed("reading a kept result", e))?;
        Ok(row.map(|row| Bytes::from(row.get::<_, Vec<u8>>(0))))
    }

    /// Whether `owner` holds an unexpired lease (see [Owner liveness](PostgresLedger#owner-liveness)).
    async fn is_owner_alive(&self, owner: &str) -> bool {
        if self.core.registered_owners().contains(owner) {
            return true;
        }
        let alive = async {
            let client = self.core.client().await?;
            client
                .query_opt(self.core.sql.owner_alive.as_str(), &[&owner])
                .await
                .map_err(|e| read_failed("reading an owner's lease", e))
        };
        match alive.await {
            Ok(row) => row.is_some_and(|row| row.get(0)),
            Err(error) => {
                tracing::warn!(%owner, %error, "owner lease unreadable: answering alive");
                true
            }
        }
    }
}

/// What is shared by a ledger's clones and its writer.
struct Core {
    pool: Pool,
    schema: String,
    sql: Sql,
    chain_lock: i64,
    /// Owners that claimed through this ledger: their leases are renewed while it lives.
    owners: Mutex<HashSet<String>>,
    claims: AtomicU64,
}

/// A write for the writer task.
enum Write {
    Claim(Claim, oneshot::Sender<Result<Claimed, LedgerError>>),
    Append(
        LedgerEvent,
        oneshot::Sender<Result<ExecutionRecord, LedgerError>>,
    ),
}

/// The outcome of one write of a batch.
enum Done {
    Claim(Result<Claimed, LedgerError>),
    Append(Result<ExecutionRecord, LedgerError>),
}

/// One sealed line, ready to insert.
struct Sealed {
    seq: i64,
    prev: String,
    hash: String,
    execution_id: String,
    line: String,
}

/// The fields of a chain line that its columns copy.
#[derive(Deserialize)]
struct LineColumns {
    seq: u64,
    prev: String,
    hash: String,
    #[serde(default)]
    execution_id: Option<String>,
}

/// The writer: takes the queued writes in batches, one transaction each, and renews the
/// owner leases between them. Ends (releasing the leases) when every ledger clone is gone.
async fn run_writer(core: Arc<Core>, mut queue: mpsc::Receiver<Write>) {
    let mut next_heartbeat = tokio::time::Instant::now() + PostgresLedger::OWNER_HEARTBEAT;
    let mut answered = 0;
    loop {
        let wait = next_heartbeat.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(wait, queue.recv()).await {
            Ok(Some(first)) => {
                let mut batch = vec![first];
                // The callers just answered usually come back at once: give them a few turns
                // of the scheduler to join this batch (one commit for all, not two).
                let target = (queue.len() + 1 + answered).min(MAX_BATCH);
                let mut turns = 0;
                while answered > 1 && queue.len() + 1 < target && turns < GATHER_TURNS {
                    tokio::task::yield_now().await;
                    turns += 1;
                }
                while batch.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(write) => batch.push(write),
                        Err(_) => break,
                    }
                }
                answered = batch.len();
                core.write_batch(batch).await;
            }
            Ok(None) => break,
            Err(_) => {}
        }
        if tokio::time::Instant::now() >= next_heartbeat {
            let owners: Vec<String> = core.registered_owners().iter().cloned().collect();
            if !owners.is_empty()
                && let Err(error) = core.renew_leases(&owners).await
            {
                tracing::warn!(%error, "could not renew owner leases");
            }
            next_heartbeat = tokio::time::Instant::now() + PostgresLedger::OWNER_HEARTBEAT;
        }
    }
    let owners: Vec<String> = core.registered_owners().iter().cloned().collect();
    if !owners.is_empty() {
        let released = async {
            let client = core.client().await?;
            client
                .execute(core.sql.release_owners.as_str(), &[&owners])
                .await
                .map_err(|e| read_failed("releasing owner leases", e))
        };
        if let Err(error) = released.await {
            tracing::debug!(%error, "could not release owner leases; they expire on their own");
        }
    }
}

impl Core {
    async fn client(&self) -> Result<Object, LedgerError> {
        self.pool.get().await.map_err(|e| {
            LedgerError::caused(
                format!(
                    "could not get a PostgreSQL connection ({e}); check that the server is \
                 reachable and accepts the ledger's connections"
                ),
                e,
            )
        })
    }

    fn registered_owners(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the head log names this ledger.
    fn schema_label(&self) -> String {
        format!("postgres:{}", self.schema)
    }

    /// Logs the head as the ledger opens (see [`chain::log_head`]); a head that cannot be read
    /// is only a warning here, as the first write reads it again.
    async fn log_head(&self) {
        let head = async {
            let client = self.client().await?;
            let row = client
                .query_opt(self.sql.head.as_str(), &[])
                .await
                .map_err(|e| read_failed("reading the chain head", e))?;
            let Some(row) = row else {
                return Ok(chain::ChainHead::GENESIS);
            };
            let seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
            let hash = row
                .get::<_, String>(1)
                .parse::<ChainHash>()
                .map_err(|e| LedgerError::storage(format!("the chain head at seq {seq}: {e}")))?;
            Ok::<_, LedgerError>((seq, hash).into())
        };
        match head.await {
            Ok(head) => chain::log_head(&self.schema_label(), None, head),
            Err(error) => tracing::warn!(%error, "cannot read the ledger head to log it"),
        }
    }

    async fn renew_leases(&self, owners: &[String]) -> Result<u64, LedgerError> {
        let client = self.client().await?;
        client
            .execute(self.sql.renew_owners.as_str(), &[&owners, &lease_seconds()])
            .await
            .map_err(|e| read_failed("renewing owner leases", e))
    }

    /// Runs one batch and answers every caller in it.
    async fn write_batch(&self, batch: Vec<Write>) {
        let claims = batch
            .iter()
            .filter(|w| matches!(w, Write::Claim(..)))
            .count() as u64;
        let latest_claim = batch
            .iter()
            .filter_map(|w| match w {
                Write::Claim(claim, _) => Some(claim.at),
                Write::Append(..) => None,
            })
            .max();
        let outcome = match self.client().await {
            Ok(client) => {
                let outcome = self.transact(&client, &batch).await;
                if outcome.is_err() {
                    // Its transaction may still be open: close the connection rather than
                    // give it back to the pool (the server rolls back and frees the lock).
                    drop(Object::take(client));
                }
                outcome
            }
            Err(error) => Err(storage_of(error)),
        };
        match outcome {
            Ok(done) => {
                for (write, done) in batch.into_iter().zip(done) {
                    match (write, done) {
                        (Write::Claim(_, reply), Done::Claim(result)) => {
                            let _ = reply.send(result);
                        }
                        (Write::Append(_, reply), Done::Append(result)) => {
                            let _ = reply.send(result);
                        }
                        (Write::Claim(_, reply), Done::Append(_)) => {
                            let _ = reply.send(Err(mismatch()));
                        }
                        (Write::Append(_, reply), Done::Claim(_)) => {
                            let _ = reply.send(Err(mismatch()));
                        }
                    }
                }
            }
            Err(message) => {
                for write in batch {
                    let error = LedgerError::Storage(message.clone());
                    match write {
                        Write::Claim(_, reply) => {
                            let _ = reply.send(Err(error));
                        }
                        Write::Append(_, reply) => {
                            let _ = reply.send(Err(error));
                        }
                    }
                }
            }
        }
        let before = self.claims.fetch_add(claims, Ordering::Relaxed);
        if let Some(at) = latest_claim
            && before / SWEEP_EVERY != (before + claims) / SWEEP_EVERY
            && let Err(error) = self.purge(at).await
        {
            tracing::warn!(%error, "could not purge expired executions");
        }
    }

    /// One write transaction: lock the chain, read what the batch needs, apply, write, commit.
    async fn transact(&self, client: &Object, batch: &[Write]) -> Result<Vec<Done>, StorageError> {
        let sql = &self.sql;
        let read_stmt = client
            .prepare_cached(&sql.read)
            .await
            .map_err(write_failed)?;

        // What the batch reads: the records it appends to, the intents it claims.
        let mut append_ids: Vec<String> = Vec::new();
        let mut seen_ids = HashSet::new();
        let (mut actors, mut scopes, mut fingerprints) = (Vec::new(), Vec::new(), Vec::new());
        let mut seen_intents = HashSet::new();
        for write in batch {
            match write {
                Write::Append(event, _) => {
                    if seen_ids.insert(event.execution_id) {
                        append_ids.push(event.execution_id.to_string());
                    }
                }
                Write::Claim(claim, _) => {
                    let key = IntentKey::of_claim(claim);
                    if seen_intents.insert(key.clone()) {
                        actors.push(key.actor.to_string());
                        scopes.push(key.intent_scope.to_string());
                        fingerprints.push(key.fingerprint.to_string());
                    }
                }
            }
        }

        // Pipelined: BEGIN and the lock first, then the reads, whose snapshots are taken
        // once the lock is held (a statement that waited for the lock would see an old one).
        let begin = format!(
            "BEGIN; {WRITE_SETTINGS}; SELECT pg_advisory_xact_lock({})",
            self.chain_lock
        );
        let reads = pipeline(vec![
            Box::pin(async { client.batch_execute(&begin).await.map(|()| Vec::new()) }),
            Box::pin(client.query(&read_stmt, &[&append_ids, &actors, &scopes, &fingerprints])),
        ])
        .await;
        // BEGIN answers first (no rows), the read last.
        let mut rows = Vec::new();
        for read in reads {
            rows = read.map_err(write_failed)?;
        }

        // The head (kind 0), the records appended to (1), each claimed intent's latest (2):
        // into the index the batch's claims and appends are decided from.
        let (mut seq, mut prev) = (0, ChainHash::GENESIS);
        let mut index = Index::default();
        for row in &rows {
            let kind: i32 = row.get(0);
            let text: &str = row.get(2);
            if kind == 0 {
                seq = row.get(1);
                prev = text.parse::<ChainHash>().map_err(|_| {
                    format!(
                        "the chain head (seq {seq}) has an unreadable hash; nothing was \
                         recorded: run `PostgresLedger::verify` and repair mrg_events"
                    )
                })?;
                continue;
            }
            let record = record_from_json(text).map_err(storage_of)?;
            index.load(record, kind == 2);
        }

        let head_before = seq;
        // Apply, in arrival order.
        let mut done = Vec::with_capacity(batch.len());
        let mut sealed: Vec<Sealed> = Vec::new();
        let mut touched: Vec<ExecutionId> = Vec::new();
        let mut accepted_seq: HashMap<ExecutionId, i64> = HashMap::new();
        let mut last_seq: HashMap<ExecutionId, i64> = HashMap::new();
        let mut new_owners: Vec<String> = Vec::new();
        let mut seal = |event: LedgerEvent| {
            seq += 1;
            let line = ChainedLine::seal(seq as u64, prev, LineBody::Event(event));
            prev = line.hash;
            let execution_id = line.event().map(|e| e.execution_id);
            sealed.push(Sealed {
                seq,
                prev: line.prev.to_string(),
                hash: line.hash.to_string(),
                execution_id: execution_id.map(|id| id.to_string()).unwrap_or_default(),
                line: line.to_json_line(),
            });
            if let Some(id) = execution_id {
                if !last_seq.contains_key(&id) {
                    touched.push(id);
                }
                last_seq.insert(id, seq);
            }
            seq
        };
        {
            let registered = self.registered_owners();
            for write in batch {
                match write {
                    Write::Claim(claim, _) => match index.claim(claim, || Ok(())) {
                        Ok((claimed, accepted)) => {
                            if let Some(event) = accepted {
                                accepted_seq.insert(event.execution_id, seal(event));
                                if !registered.contains(&claim.owner)
                                    && !new_owners.contains(&claim.owner)
                                {
                                    new_owners.push(claim.owner.clone());
                                }
                            }
                            done.push(Done::Claim(Ok(claimed)));
                        }
                        Err(error) => done.push(Done::Claim(Err(error))),
                    },
                    Write::Append(event, _) => {
                        // Refused: nothing is written for it, the record stays as it was.
                        let record = match index.append(event) {
                            Ok(record) => record,
                            Err(error) => {
                                done.push(Done::Append(Err(error)));
                                continue;
                            }
                        };
                        // Ownership moves with a dispatch: the dispatching owner's lease is
                        // taken (or renewed) in this same transaction, so no replica that
                        // reads the record can take its owner for gone.
                        if let EventKind::Dispatched {
                            owner: Some(owner), ..
                        } = &event.kind
                            && !new_owners.contains(owner)
                        {
                            new_owners.push(owner.clone());
                        }
                        seal(event.clone());
                        done.push(Done::Append(Ok(record)));
                    }
                }
            }
        }

        if sealed.is_empty() && new_owners.is_empty() {
            client.batch_execute("COMMIT").await.map_err(write_failed)?;
            return Ok(done);
        }

        // The rows: the sealed lines, and the final record of each execution touched.
        let (mut seqs, mut prevs, mut hashes, mut line_ids, mut lines) =
            (vec![], vec![], vec![], vec![], vec![]);
        for s in sealed {
            seqs.push(s.seq);
            prevs.push(s.prev);
            hashes.push(s.hash);
            line_ids.push(s.execution_id);
            lines.push(s.line);
        }
        let mut rows = ExecutionRows::default();
        for id in &touched {
            let Some(record) = index.record(*id) else {
                continue;
            };
            rows.push(
                record,
                accepted_seq.get(id).copied().unwrap_or(0),
                last_seq.get(id).copied().unwrap_or(0),
            )
            .map_err(storage_of)?;
        }
        let write_stmt = client
            .prepare_cached(&sql.write)
            .await
            .map_err(write_failed)?;
        let renew_owners = client
            .prepare_cached(&sql.renew_owners)
            .await
            .map_err(write_failed)?;
        let lease = lease_seconds();
        // Pipelined: the writes, then COMMIT (which rolls back if a write failed).
        let mut write_params: Vec<&(dyn ToSql + Sync)> =
            vec![&seqs, &prevs, &hashes, &line_ids, &lines];
        write_params.extend(rows.params());
        let owner_params: [&(dyn ToSql + Sync); 2] = [&new_owners, &lease];
        let mut writes: Vec<PgFuture<'_>> = Vec::new();
        if !seqs.is_empty() {
            writes.push(Box::pin(client.query(&write_stmt, &write_params)));
        }
        if !new_owners.is_empty() {
            writes.push(Box::pin(client.query(&renew_owners, &owner_params)));
        }
        writes.push(Box::pin(async {
            client.batch_execute("COMMIT").await.map(|()| Vec::new())
        }));
        let mut results = pipeline(writes).await;
        let committed = results.pop();
        for result in results {
            result.map_err(write_failed)?;
        }
        match committed {
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                return Err(StorageError::caused(
                    format!(
                        "{}; whether the batch was recorded is unknown: read the execution \
                         back (`Ledger::get`) before acting on it",
                        describe("the ledger's COMMIT failed", &e)
                    ),
                    e,
                ));
            }
            None => return Err(storage_of(mismatch())),
        }
        self.registered_owners().extend(new_owners);
        chain::log_head(
            &self.schema_label(),
            u64::try_from(head_before).ok(),
            (u64::try_from(seq).unwrap_or(0), prev).into(),
        );
        Ok(done)
    }

    async fn purge(&self, now: Timestamp) -> Result<u64, LedgerError> {
        let mut client = self.client().await?;
        let failed = |e: tokio_postgres::Error| {
            LedgerError::caused(
                format!(
                    "{}; nothing was purged: try again later",
                    describe("purging expired executions", &e)
                ),
                e,
            )
        };
        let tx = client.transaction().await.map_err(failed)?;
        tx.batch_execute(&format!(
            "{WRITE_SETTINGS}; SELECT pg_advisory_xact_lock({})",
            self.chain_lock
        ))
        .await
        .map_err(failed)?;
        let purged = tx
            .execute(self.sql.purge_executions.as_str(), &[&millis(now)])
            .await
            .map_err(failed)?;
        tx.execute(self.sql.purge_owners.as_str(), &[])
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(purged)
    }
}

/// The index rows of a batch, column by column (for `unnest`).
#[derive(Default)]
struct ExecutionRows {
    ids: Vec<String>,
    actors: Vec<String>,
    scopes: Vec<String>,
    fingerprints: Vec<String>,
    tools: Vec<String>,
    states: Vec<String>,
    owners: Vec<String>,
    accepted_seqs: Vec<i64>,
    last_seqs: Vec<i64>,
    link_until: Vec<i64>,
    retain_until: Vec<i64>,
    records: Vec<String>,
}

impl ExecutionRows {
    fn push(
        &mut self,
        record: &ExecutionRecord,
        accepted_seq: i64,
        last_seq: i64,
    ) -> Result<(), LedgerError> {
        self.records.push(record_to_json(record)?);
        self.ids.push(record.execution_id.to_string());
        self.actors.push(record.actor.to_string());
        self.scopes.push(record.intent_scope.to_string());
        self.fingerprints.push(record.fingerprint.to_string());
        self.tools.push(record.tool.clone());
        self.states.push(record.state_label().to_owned());
        self.owners.push(record.owner.clone());
        self.accepted_seqs.push(accepted_seq);
        self.last_seqs.push(last_seq);
        self.link_until.push(millis(record.link_until));
        self.retain_until.push(millis(record.retain_until));
        Ok(())
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 12] {
        [
            &self.ids,
            &self.actors,
            &self.scopes,
            &self.fingerprints,
            &self.tools,
            &self.states,
            &self.owners,
            &self.accepted_seqs,
            &self.last_seqs,
            &self.link_until,
            &self.retain_until,
            &self.records,
        ]
    }
}

/// The ledger's statements, with the schema in place.
struct Sql {
    /// Under the lock: the chain's head, the records a batch appends to, the latest
    /// execution of each intent it claims.
    read: String,
    /// The sealed lines and the index rows, in one statement.
    write: String,
    renew_owners: String,
    release_owners: String,
    owner_alive: String,
    /// Every `dispatched` execution, and whether its owner's lease is unexpired.
    dispatched: String,
    get: String,
    events: String,
    list: String,
    store_result: String,
    load_result: String,
    chain: String,
    head: String,
    purge_executions: String,
    purge_owners: String,
}

impl Sql {
    fn new(s: &str) -> Self {
        Self {
            read: format!(
                "(SELECT 0, seq, hash FROM {s}.mrg_events ORDER BY seq DESC LIMIT 1) \
                 UNION ALL \
                 SELECT 1, 0, record::text FROM {s}.mrg_executions \
                     WHERE execution_id = ANY($1::text[]) \
                 UNION ALL \
                 SELECT 2, 0, latest.record FROM \
                     unnest($2::text[], $3::text[], $4::text[]) AS k(actor, intent_scope, fingerprint) \
                     CROSS JOIN LATERAL (SELECT e.record::text AS record FROM {s}.mrg_executions e \
                         WHERE e.actor = k.actor AND e.intent_scope = k.intent_scope \
                           AND e.fingerprint = k.fingerprint \
                         ORDER BY e.accepted_seq DESC LIMIT 1) AS latest"
            ),
            write: format!(
                "WITH events AS (INSERT INTO {s}.mrg_events (seq, prev, hash, execution_id, line) \
                     SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::text[])) \
                 INSERT INTO {s}.mrg_executions (execution_id, actor, intent_scope, fingerprint, \
                     tool, state, owner, accepted_seq, last_seq, link_until_ms, retain_until_ms, record) \
                 SELECT u.execution_id, u.actor, u.intent_scope, u.fingerprint, u.tool, u.state, \
                     u.owner, u.accepted_seq, u.last_seq, u.link_until_ms, u.retain_until_ms, \
                     u.record::json \
                 FROM unnest($6::text[], $7::text[], $8::text[], $9::text[], $10::text[], \
                     $11::text[], $12::text[], $13::int8[], $14::int8[], $15::int8[], $16::int8[], \
                     $17::text[]) AS u(execution_id, actor, intent_scope, fingerprint, tool, state, \
                     owner, accepted_seq, last_seq, link_until_ms, retain_until_ms, record) \
                 ON CONFLICT (execution_id) DO UPDATE SET state = EXCLUDED.state, \
                     owner = EXCLUDED.owner, last_seq = EXCLUDED.last_seq, \
                     record = EXCLUDED.record, updated_at = now()"
            ),
            renew_owners: format!(
                "INSERT INTO {s}.mrg_owners (owner, lease_until) \
                 SELECT o, now() + make_interval(secs => $2::float8) FROM unnest($1::text[]) AS o \
                 ON CONFLICT (owner) DO UPDATE SET lease_until = EXCLUDED.lease_until, \
                     heartbeat_at = now()"
            ),
            release_owners: format!(
                "UPDATE {s}.mrg_owners SET lease_until = now() WHERE owner = ANY($1::text[])"
            ),
            dispatched: format!(
                "SELECT e.record::text, coalesce(o.lease_until > now(), false) \
                 FROM {s}.mrg_executions e LEFT JOIN {s}.mrg_owners o ON o.owner = e.owner \
                 WHERE e.state = 'dispatched'"
            ),
            owner_alive: format!(
                "SELECT lease_until > now() FROM {s}.mrg_owners WHERE owner = $1::text"
            ),
            get: format!(
                "SELECT record::text FROM {s}.mrg_executions WHERE execution_id = $1::text"
            ),
            events: format!(
                "SELECT seq, line FROM {s}.mrg_events WHERE execution_id = $1::text ORDER BY seq"
            ),
            list: format!("SELECT record::text FROM {s}.mrg_executions ORDER BY execution_id"),
            store_result: format!(
                "INSERT INTO {s}.mrg_results (reference, execution_id, bytes) \
                 SELECT $1::text, $2::text, $3::bytea \
                 WHERE EXISTS (SELECT 1 FROM {s}.mrg_executions WHERE execution_id = $2::text) \
                 ON CONFLICT (reference) DO UPDATE SET bytes = EXCLUDED.bytes, stored_at = now()"
            ),
            load_result: format!("SELECT bytes FROM {s}.mrg_results WHERE reference = $1::text"),
            chain: format!(
                "SELECT seq, prev, hash, execution_id, line FROM {s}.mrg_events ORDER BY seq"
            ),
            head: format!("SELECT seq, hash FROM {s}.mrg_events ORDER BY seq DESC LIMIT 1"),
            purge_executions: format!(
                "DELETE FROM {s}.mrg_executions WHERE retain_until_ms < $1::int8"
            ),
            purge_owners: format!(
                "DELETE FROM {s}.mrg_owners o WHERE o.lease_until < now() \
                 AND NOT EXISTS (SELECT 1 FROM {s}.mrg_executions e WHERE e.owner = o.owner)"
            ),
        }
    }
}

/// Creates or migrates the tables, under an advisory lock so concurrent connects wait for
/// each other instead of racing `CREATE`.
async fn migrate(pool: &Pool, schema: &str, quoted: &str) -> Result<(), LedgerError> {
    let failed = |e: tokio_postgres::Error| {
        LedgerError::caused(
            format!(
                "{}; the role needs CREATE on the database (or on schema {schema}) the first time",
                describe("creating the ledger's tables", &e)
            ),
            e,
        )
    };
    let mut client = pool.get().await.map_err(|e| {
        LedgerError::caused(
            format!(
                "could not connect to PostgreSQL ({e}); check the URL, that the server is \
             reachable, and that the role may log in"
            ),
            e,
        )
    })?;
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    let exists = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[&schema])
        .await
        .map_err(failed)?
        .is_some();
    if !exists {
        tx.batch_execute(&format!("CREATE SCHEMA {quoted}"))
            .await
            .map_err(failed)?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {quoted}.mrg_schema_version (\
             version INT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .await
    .map_err(failed)?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {quoted}.mrg_schema_version"),
            &[],
        )
        .await
        .map_err(failed)?
        .get(0);
    if current > SCHEMA_VERSION {
        return Err(LedgerError::storage(format!(
            "the ledger's tables in schema {schema} are at version {current}, newer than this \
             build knows ({SCHEMA_VERSION}): upgrade mcp-replay-guard on this replica"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as i32 + 1;
        tx.batch_execute(&migration.replace("{s}", quoted))
            .await
            .map_err(failed)?;
        tx.execute(
            &format!("INSERT INTO {quoted}.mrg_schema_version (version) VALUES ($1)"),
            &[&version],
        )
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}

/// The advisory lock key of migrations (any schema, one database).
const MIGRATION_LOCK: i64 = 0x6d72_675f_6d69_6772; // "mrg_migr"

/// The advisory lock key of a schema's chain.
fn chain_lock_key(schema: &str) -> i64 {
    // FNV-1a, so that every build computes the same key for the same schema.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"mcp-replay-guard:chain:".iter().chain(schema.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

fn check_schema_name(schema: &str) -> Result<(), LedgerError> {
    let mut chars = schema.chars();
    let valid = schema.len() <= 63
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(LedgerError::storage(format!(
            "{schema:?} is not a schema name the ledger uses: lower-case ASCII letters, digits \
             and `_`, not starting with a digit, at most 63 bytes"
        )))
    }
}

/// The password of a connection URL or key=value string, to keep it out of messages.
fn url_password(url: &str) -> Option<String> {
    if let Some((_, rest)) = url.split_once("://") {
        let authority = rest.split(['/', '?']).next().unwrap_or(rest);
        let (userinfo, _) = authority.rsplit_once('@')?;
        return userinfo.split_once(':').map(|(_, p)| p.to_owned());
    }
    url.split_whitespace()
        .find_map(|pair| pair.strip_prefix("password="))
        .map(|p| p.trim_matches('\'').to_owned())
}

fn lease_seconds() -> f64 {
    PostgresLedger::OWNER_LEASE.as_secs_f64()
}

fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

/// A boxed query future, so that different statements can be pipelined together.
type PgFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<Row>, tokio_postgres::Error>> + Send + 'a>>;

/// Runs the futures together and returns their outputs in order. Each is first polled in
/// order, which sends its request then: the requests leave on the connection in order, one
/// after the other, without waiting for the answers (pipelining).
async fn pipeline(mut futures: Vec<PgFuture<'_>>) -> Vec<Result<Vec<Row>, tokio_postgres::Error>> {
    let mut outputs: Vec<Option<Result<Vec<Row>, tokio_postgres::Error>>> =
        futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(result) => *output = Some(result),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Every field of a record, as the `record` column keeps it (the JSON form that
/// [`ExecutionRecord`]'s `Serialize` writes is for people, and leaves some fields out).
#[derive(Serialize, Deserialize)]
#[serde(remote = "ExecutionRecord")]
struct StoredRecord {
    execution_id: ExecutionId,
    fingerprint: Fingerprint,
    tool: String,
    actor: Actor,
    intent_scope: IntentScope,
    target: Target,
    credential_ref: Option<CredentialRef>,
    retry_class: RetryClass,
    state: ExecutionState,
    correlation: Correlation,
    idempotency_key: Option<IdempotencyKey>,
    // Added with the server-side Idempotency-Key layer: rows written before it have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request_fingerprint: Option<Fingerprint>,
    accepted_at: Timestamp,
    authorized_at: Option<Timestamp>,
    dispatched_at: Option<Timestamp>,
    completed_at: Option<Timestamp>,
    delivered_at: Option<Timestamp>,
    target_status: Option<u16>,
    is_error: bool,
    result_reference: Option<String>,
    attempts: u32,
    reason: Option<String>,
    link_until: Timestamp,
    retain_until: Timestamp,
    owner: String,
}

fn record_to_json(record: &ExecutionRecord) -> Result<String, LedgerError> {
    let mut text = Vec::new();
    StoredRecord::serialize(record, &mut serde_json::Serializer::new(&mut text)).map_err(|e| {
        LedgerError::caused(
            format!("a record could not be written as JSON ({e}); this is a bug: please report it"),
            e,
        )
    })?;
    String::from_utf8(text).map_err(|e| {
        LedgerError::caused(
            format!("a record's JSON is not UTF-8 ({e}); this is a bug: please report it"),
            e,
        )
    })
}

fn record_from_json(text: &str) -> Result<ExecutionRecord, LedgerError> {
    StoredRecord::deserialize(&mut serde_json::Deserializer::from_str(text)).map_err(|e| {
        LedgerError::caused(
            format!(
                "a stored record cannot be read ({e}); run `PostgresLedger::verify` and inspect \
             the record column of mrg_executions"
            ),
            e,
        )
    })
}

/// What PostgreSQL said, with the server's message when there is one.
fn describe(what: &str, error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!(
            "{what}: PostgreSQL answered {} ({})",
            db.message(),
            db.code().code()
        ),
        None => format!("{what}: {error}"),
    }
}

fn read_failed(what: &str, error: tokio_postgres::Error) -> LedgerError {
    LedgerError::caused(
        format!(
            "{}; check that the server is reachable and the ledger's tables exist",
            describe(what, &error)
        ),
        error,
    )
}

fn write_failed(error: tokio_postgres::Error) -> StorageError {
    StorageError::caused(
        format!(
            "{}; nothing was recorded, so nothing may be sent: try again once the database \
             answers",
            describe("recording in the PostgreSQL ledger failed", &error)
        ),
        error,
    )
}

/// The storage failure of a ledger error, for a batch that fails as a whole.
fn storage_of(error: LedgerError) -> StorageError {
    match error {
        LedgerError::Storage(storage) => storage,
        other => StorageError::from(other.to_string()),
    }
}

fn writer_gone() -> LedgerError {
    LedgerError::storage(
        "the PostgreSQL ledger's writer has stopped (the tokio runtime that connected it shut \
         down?); connect the ledger again on a running runtime",
    )
}

fn mismatch() -> LedgerError {
    LedgerError::storage(
        "the PostgreSQL ledger's writer lost track of a call; this is a bug: please report it",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        contract::RetryClass,
        ledger::fixtures::{claim, dispatched, event_at},
    };

    /// A schema of its own in the database of `MCP_REPLAY_GUARD_POSTGRES_URL`; `None` (the
    /// test skips) when it is unset.
    fn test_schema(test: &str) -> Option<(String, String)> {
        let Ok(url) = std::env::var("MCP_REPLAY_GUARD_POSTGRES_URL") else {
            eprintln!("skipped: MCP_REPLAY_GUARD_POSTGRES_URL is unset");
            return None;
        };
        let ulid = ExecutionId::new().ulid().to_string().to_lowercase();
        Some((url, format!("mrg_u_{test}_{ulid}")))
    }

    async fn drop_schema(ledger: &PostgresLedger) {
        let client = ledger.pool().get().await.unwrap();
        let statement = format!("DROP SCHEMA \"{}\" CASCADE", ledger.schema());
        client.batch_execute(&statement).await.unwrap();
    }

    /// Issue 14: an execution left `dispatched` by an owner whose lease ended reads `unknown`
    /// from a ledger that connects afterwards, as it does in a file ledger reopened; it used
    /// to read `dispatched` in PostgreSQL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dispatched_execution_whose_owner_is_gone_reads_unknown_from_another_replica() {
        let Some((url, schema)) = test_schema("orphan") else {
            return;
        };
        let observer = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        let first = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        let id = first
            .claim(claim(RetryClass::Idempotent, "guard:orphan-one"))
            .await
            .unwrap()
            .record()
            .execution_id;
        first
            .append(event_at(id, 1, dispatched(id, 1, Some("guard:orphan-one"))))
            .await
            .unwrap();
        drop(first);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while observer.is_owner_alive("guard:orphan-one").await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the lease outlived its ledger"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The observer connected while the owner lived: it reads what was written.
        let before = observer.get(id).await.unwrap().unwrap();
        assert_eq!(before.state, ExecutionState::Dispatched);

        let second = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        for ledger in [&second, &observer] {
            let record = ledger.get(id).await.unwrap().unwrap();
            assert_eq!(record.state, ExecutionState::Unknown);
            assert_eq!(record.reason.as_deref(), Some(crate::decide::ORPHAN_REASON));
        }
        // Settled once: a third replica writes nothing more.
        let third = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        assert_eq!(third.events(id).await.unwrap().len(), 3);
        assert!(third.verify().await.unwrap().is_ok());
        drop_schema(&third).await;
    }

    /// A failed query keeps the PostgreSQL error as its source.
    #[tokio::test]
    async fn a_postgres_failure_keeps_its_source() {
        let Some((url, schema)) = test_schema("source") else {
            return;
        };
        let ledger = PostgresLedger::connect_with_schema(&url, &schema)
            .await
            .unwrap();
        drop_schema(&ledger).await;
        let error = ledger.get(ExecutionId::new()).await.unwrap_err();
        assert!(matches!(error, LedgerError::Storage(_)), "{error}");
        let source = std::error::Error::source(&error).expect("a source");
        assert!(
            source.downcast_ref::<tokio_postgres::Error>().is_some(),
            "{source:?}"
        );
    }

    #[test]
    fn passwords_are_found_in_both_url_forms() {
        assert_eq!(
            url_password("postgres://u:s3cret@db:5432/x").as_deref(),
            Some("s3cret")
        );
        assert_eq!(url_password("postgres://u@db/x"), None);
        assert_eq!(url_password("postgres://db/x?user=u"), None);
        assert_eq!(
            url_password("host=db user=u password='s3cret' dbname=x").as_deref(),
            Some("s3cret")
        );
    }

    #[test]
    fn schema_names_are_checked_and_chain_locks_differ_by_schema() {
        assert!(check_schema_name("public").is_ok());
        assert!(check_schema_name("mrg_t_01j4").is_ok());
        for bad in [
            "",
            "Public",
            "1x",
            "a-b",
            "x\"; DROP TABLE y; --",
            &"a".repeat(64),
        ] {
            assert!(check_schema_name(bad).is_err(), "{bad}");
        }
        assert_ne!(chain_lock_key("a"), chain_lock_key("b"));
        assert_eq!(chain_lock_key("public"), chain_lock_key("public"));
    }
}
