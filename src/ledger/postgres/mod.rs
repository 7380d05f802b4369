//! The PostgreSQL ledger (feature `postgres`): one ledger shared by every replica of a guard.
//!
//! The module is private; its one public item, [`PostgresLedger`], is re-exported as
//! `mcp_replay_guard::ledger::PostgresLedger` and carries the documentation: the example, the
//! tables, the partitions and their chains, owner liveness and retention.

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
    Claim, Claimed, Dispatch, EventKind, ExecutionRecord, ExecutionState, Ledger, LedgerError,
    LedgerEvent, StorageError, Timestamp,
    chain::{self, ChainHash, ChainProblem, ChainedLine, LineBody, VerifyReport},
    index::{Index, IntentKey},
    result_reference,
};
use crate::execution::Correlation;
use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target,
    execution::RetryClass,
    fingerprint::{Fingerprint, FingerprintKey},
};

mod batch;
mod chains;
mod error;
mod schema;
mod stored;
mod writer;

use batch::*;
use chains::*;
use error::*;
use schema::*;
use stored::*;
use writer::*;

/// Connections in a pool made by [`PostgresLedger::connect`].
const POOL_SIZE: usize = 16;

/// Connect timeout when the URL sets none.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a call waits for a pooled connection.
const POOL_WAIT: Duration = Duration::from_secs(30);

/// A ledger in PostgreSQL, shared by every replica of a guard that connects to the same
/// database and schema. It keeps the same two things as the file ledger, in tables:
///
/// - `mrg_events`, the tamper-evident chains: one row per event, holding the exact JSON text
///   of its sealed [`ChainedLine`](super::chain::ChainedLine) (`seq`, `prev`, `hash` and the
///   event), so that [`PostgresLedger::verify`] re-hashes exactly what was sealed; one chain
///   per partition of the intent space (see [Partitions](#partitions));
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
/// // Every replica is given the same fingerprint key (a secret, 64 hex digits) and binds the
/// // ledger to it: a replica started with another key is refused.
/// let key = FingerprintKey::from_hex(&std::env::var("GUARD_FINGERPRINT_KEY")?)?;
/// ledger.bind_fingerprint_key(&key).await?;
/// let layer = GuardLayer::new(ledger.clone(), contracts, key);
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
/// | `mrg_events` | the chains' lines: `seq` (primary key, from the sequence `mrg_events_seq`), `prev`, `hash`, `execution_id`, `line` (the sealed JSON text) |
/// | `mrg_chains` | each chain's head, the row its writers lock: `chain` (primary key), `seq`, `hash` |
/// | `mrg_executions` | the index: `execution_id` (primary key), `actor`, `intent_scope`, `fingerprint`, `tool`, `state` (as the JSON form spells it), `owner`, `accepted_seq`, `last_seq`, `link_until_ms`, `retain_until_ms`, `record` (JSON text with every field of the record; cast it to `jsonb` to query it), `chain` (the chain its `accepted` line is in) |
/// | `mrg_results` | kept results: `reference` (primary key), `execution_id`, `bytes` |
/// | `mrg_owners` | owner leases: `owner` (primary key), `lease_until` |
/// | `mrg_fingerprint_key` | at most one row: the id of the fingerprint key the ledger is bound to (`key_id`, `bound_at`; see [Its fingerprint key](#its-fingerprint-key)) |
///
/// The tables are created, or migrated, when a ledger connects, under a transaction-scoped
/// advisory lock, so replicas that start together do not race each other.
///
/// # Partitions
///
/// An intent (actor, intent scope, fingerprint) belongs to one of
/// [`PARTITIONS`](Self::PARTITIONS) (256) partitions, a hash of its key, and every write of
/// it (the claims of the intent, and every event of its executions) goes into that
/// partition's chain. Each chain is linear on its own: a write is part of one transaction that
/// first locks its chain's row in `mrg_chains` (`SELECT … FOR UPDATE`, which also reads the
/// chain's head), then reads the records it changes and the intent's latest execution,
/// applies the events through the state machine ([`ExecutionRecord::apply`]), takes a `seq`
/// for each line it seals, inserts the lines, upserts the index rows, moves the head, and
/// commits. Only one transaction holds a chain's row at a time, whichever replica runs it,
/// so a chain never forks, and a claim that finds no linkable execution creates one before
/// any other claim of that intent can look: exactly one [`Claimed::New`] per intent. Writes
/// of intents in other partitions take other rows and do not wait for it (a purge, once
/// every 1024 claims, locks every row for the time of its `DELETE`).
///
/// `seq` is one sequence for the whole ledger (`mrg_events_seq`), so `seq` order is the
/// order in which lines were written, and an execution's events read back in order. Each
/// chain's lines have increasing `seq`s, with the other chains' lines between them, and a
/// write that rolls back leaves a gap. Chain 0 starts after [`ChainHash::GENESIS`], every
/// other chain after a hash of its number, so that each chain starts once.
///
/// [`verify`](Self::verify) reads every line in `seq` order and checks each against its
/// hash, its columns, and the chains: a line must follow the last line of a chain (or a
/// chain's genesis, for its first). A line that follows none was inserted, replaced, or
/// forked off a line that already has a successor; when `seq`s are missing right before it,
/// lines were deleted there. Then each chain must end where its row in `mrg_chains` says: a
/// chain that ends before it lost its tail, one that goes past it gained lines its writers
/// did not write (an attacker who rewrites that row too is caught only by an anchor). The head the ledger logs (on connect, and at every 1,000th
/// `seq`, field `ledger=postgres:<schema>`) anchors the chain of the line it names; each
/// chain's head is also logged on connect and each time it passes a 16,000th `seq`
/// (`ledger=postgres:<schema>/<chain>`), so that every chain has anchors of its own.
///
/// A ledger made before partitions (one chain, under an advisory lock) is partitioned when
/// a replica of this build first connects, in the migration's transaction, after the
/// writes in flight of older replicas: its chain becomes chain 0, unchanged, and goes on
/// there for the intents of partition 0; new lines take `seq`s after it; its executions are
/// found as before, their later events going into their intent's chain. An older replica
/// still running then fails its writes (the index gained a column it does not fill) and
/// records nothing: upgrade every replica.
///
/// Writes from one ledger (and its clones) are batched by one writer: while a transaction
/// runs, the calls that arrive queue, and the next transaction takes all of them (up to 512),
/// after giving the callers it just answered a few scheduler turns to come back (no timer:
/// under load one commit serves many callers; a lone call never waits). A batch locks the
/// head rows of the chains it writes, skipping those another transaction holds (another
/// replica's batch, or a purge): the writes of those chains go first into the next batch, so
/// that two replicas' batches run side by side instead of in turns; a write left twice makes
/// its batch wait for the lock (in `chain` order, as every transaction waits, so that no two
/// wait for each other). Each event is still checked on its own: a refused event writes
/// nothing and fails only its own call. The batch commits as a whole; when the commit fails,
/// every call in it fails and nothing was recorded. The writer runs on a task spawned on the
/// tokio runtime that connected, so a caller that gives up never leaves a transaction half
/// done. An append finds its execution's partition from the claims made through this ledger,
/// or reads it from the execution's row.
///
/// # Its fingerprint key
///
/// Every replica must fingerprint with the same [`FingerprintKey`]: under another key no
/// intent matches, and a call held for review would be sent again. The ledger cannot keep the
/// key beside itself as the file ledger does (each replica is given it), so it keeps the key's
/// id instead: [`bind_fingerprint_key`](Self::bind_fingerprint_key) records it the first time
/// and refuses any other key from then on, on every replica.
///
///
/// An execution's `owner` is the guard that claimed it, then the guard that dispatched its
/// latest attempt (ownership moves with every `dispatched`, so a continuation in another
/// replica belongs to that replica's guard). Owners hold a lease in `mrg_owners`, taken (or
/// renewed) in the claim's or the dispatch's own transaction and renewed every
/// [`OWNER_HEARTBEAT`](Self::OWNER_HEARTBEAT) (10 s) by the ledger they claimed through, for
/// [`OWNER_LEASE`](Self::OWNER_LEASE) (30 s); when that ledger (every clone) is dropped, the
/// leases are released once its writer has finished. [`Ledger::is_owner_alive`] answers from the lease, on the database's
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
    writes: mpsc::Sender<Queued>,
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
    /// How many partitions (and chains) a ledger spreads its intents over (see
    /// [Partitions](Self#partitions)). Every replica of a ledger must use the same number: a
    /// ledger refuses to connect to tables made with another.
    pub const PARTITIONS: u16 = 256;

    /// How long an owner's lease lasts without renewal.
    pub const OWNER_LEASE: Duration = Duration::from_secs(30);

    /// How often a ledger renews the leases of the owners that claimed through it.
    pub const OWNER_HEARTBEAT: Duration = Duration::from_secs(10);

    /// Connects to `url` (`postgres://user[:password]@host[:port]/database`, or the key=value
    /// form; without TLS: use [`from_pool`](Self::from_pool) with your own pool for TLS), and
    /// creates or migrates the ledger's tables in the `public` schema.
    ///
    /// The pool holds up to 16 connections (the writer's, and the reads'); a connect timeout of 10 s applies unless the URL
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
            schema: schema.to_owned(),
            pool,
            owners: Mutex::new(HashSet::new()),
            claims: AtomicU64::new(0),
            partitions: Mutex::new(HashMap::new()),
        });
        core.log_head().await;
        let (writes, queue) = mpsc::channel(QUEUE);
        let writer = tokio::spawn(run_writer(core.clone(), queue));
        tokio::spawn(run_leases(core.clone(), writer));
        let ledger = Self { core, writes };
        ledger.settle_orphans().await?;
        Ok(ledger)
    }

    /// On connect, as the file ledger on open: an execution left `dispatched` by an owner
    /// whose lease ended has an unknown outcome
    /// ([`execution::orphan_unknown`](crate::execution::orphan_unknown)). Each `unknown` goes
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
            let Some(event) = crate::execution::orphan_unknown(&record, alive, Timestamp::now())
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

    /// Binds the ledger to `key`, the fingerprint key of the guards that write it: records the
    /// key's id (a keyed digest that names the key without revealing it) if the ledger names
    /// none yet, and fails if it names another key, as
    /// [`FileLedger::bind_fingerprint_key`](crate::ledger::FileLedger::bind_fingerprint_key)
    /// does. Call it on every replica after connecting, before its guard takes a call (see
    /// [Its fingerprint key](PostgresLedger#its-fingerprint-key)).
    ///
    /// # Which key
    ///
    /// The id is one row of `mrg_fingerprint_key`, recorded and read back in one transaction:
    /// replicas that bind at the same moment wait on that row for each other, so exactly one
    /// id is recorded and every other key is refused. A ledger that names no key yet (a new
    /// one, or one written before its replicas bound a key) is bound to the first key given:
    /// bind before the first claim. The row is not part of the hash chain: it stops a replica
    /// started with the wrong key, not someone who can write the tables.
    pub async fn bind_fingerprint_key(&self, key: &FingerprintKey) -> Result<(), LedgerError> {
        let id = super::key_id::key_id(key);
        let failed = |e| read_failed("binding the fingerprint key", e);
        let mut client = self.core.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        tx.execute(self.core.sql.bind_key.as_str(), &[&id])
            .await
            .map_err(failed)?;
        // A new statement, so a new snapshot: it sees the id of a binder that won the race.
        let bound: String = tx
            .query_one(self.core.sql.bound_key.as_str(), &[])
            .await
            .map_err(failed)?
            .get(0);
        tx.commit().await.map_err(failed)?;
        super::key_id::check_key(
            Some(&bound),
            &id,
            "give every replica the key the ledger was first bound with (the same key file or \
             variable)",
        )
    }

    /// Verifies every chain: reads `mrg_events` in `seq` order and checks every stored line
    /// against its hash, against the last line of the chain it follows (or that chain's
    /// genesis: this ledger never compacts, so each chain starts at its genesis), and against
    /// its `seq`, `prev`, `hash` and `execution_id` columns; then that each chain ends where
    /// its head row in `mrg_chains` says (see [Partitions](PostgresLedger#partitions)). The
    /// report counts the lines of every chain, names the first bad `seq` and why, and its
    /// head is the newest line that verified.
    ///
    /// The chains are read into memory at once.
    pub async fn verify(&self) -> Result<VerifyReport, LedgerError> {
        let mut client = self.core.client().await?;
        let failed = |e| read_failed("reading the chains", e);
        // One snapshot: a write that commits between the two reads would move a head past
        // the lines read.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(failed)?;
        let lines = tx
            .query(self.core.sql.chain.as_str(), &[])
            .await
            .map_err(failed)?;
        let heads = tx
            .query(self.core.sql.heads.as_str(), &[])
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(verify_rows(&lines, &heads))
    }

    /// Removes from the index every execution whose retention ended before `now`, with its
    /// kept result, and the leases of owners that expired and own nothing left in the index;
    /// returns how many executions. Their events stay in the chain.
    pub async fn purge_expired(&self, now: Timestamp) -> Result<u64, LedgerError> {
        self.core.purge(now).await
    }

    /// Sends a write of partition `chain` to its writer.
    async fn submit<T>(
        &self,
        chain: u16,
        write: impl FnOnce(oneshot::Sender<Result<T, LedgerError>>) -> Write,
    ) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        let write = Queued {
            chain,
            deferred: 0,
            write: write(reply),
        };
        self.writes.send(write).await.map_err(|_| writer_gone())?;
        answer.await.map_err(|_| writer_gone())?
    }
}

#[async_trait]
impl Ledger for PostgresLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        let chain = partition_of_key(&IntentKey::of_claim(&claim));
        self.submit(chain, |reply| Write::Claim(claim, None, reply))
            .await
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        let chain = partition_of_key(&IntentKey::of_claim(&claim));
        self.submit(chain, |reply| Write::Claim(claim, Some(dispatch), reply))
            .await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.complete(event, None).await
    }

    /// An event and the result it keeps, in one transaction ([`append`](Self::append) is
    /// this without a result).
    async fn complete(
        &self,
        event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        let id = event.execution_id;
        let Some(chain) = self.core.partition_of_execution(id).await? else {
            return Err(LedgerError::NotFound(id));
        };
        self.submit(chain, |reply| Write::Append(event, result, reply))
            .await
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
