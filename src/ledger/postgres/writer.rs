//! The writer: the task that takes a ledger's queued writes in batches, one transaction each
//! (the head rows of the batch's chains locked, the index the batch is decided from, the
//! sealed lines); and the task that keeps the owner leases.

use super::*;

/// How many times a write may find its chain locked by another replica's transaction and
/// wait for the next batch; after that, its batch waits for the lock.
pub(super) const DEFER_LIMIT: u8 = 2;

/// How many `seq`s of the ledger pass between two logs of a chain's head: each chain is
/// anchored that often, in a log line per chain (256 lines per 16,000 of the ledger).
pub(super) const CHAIN_LOG_EVERY: u64 = chain::HEAD_LOG_EVERY * 16;

/// How many scheduler turns a writer gives answered callers to come back before it starts
/// the next transaction.
pub(super) const GATHER_TURNS: usize = 8;

/// The most calls one write transaction takes.
pub(super) const MAX_BATCH: usize = 512;

/// Calls waiting for a writer before callers wait to enqueue.
pub(super) const QUEUE: usize = 4096;

/// How many claims pass between two purges of expired records.
pub(super) const SWEEP_EVERY: u64 = 1024;

/// How many executions' partitions a ledger remembers before it forgets them all (an
/// append whose partition is forgotten reads it from the execution's row).
const REMEMBERED: usize = 1 << 16;

/// Settings of a write transaction: a lock wait that cannot hang forever; a transaction that
/// cannot stay open (holding its chain's lock) if its writer stalls; and index lookups for the
/// batch's reads whatever the tables' size (a prepared statement keeps a generic plan, and one
/// made while the tables were small scans them whole once they are not; custom plans would
/// avoid that too, at the price of planning every batch under the lock).
pub(super) const WRITE_SETTINGS: &str = "SET LOCAL lock_timeout = '30s'; \
     SET LOCAL idle_in_transaction_session_timeout = '60s'; \
     SET LOCAL enable_seqscan = off";

/// What is shared by a ledger's clones and its tasks.
pub(super) struct Core {
    pub(super) pool: Pool,
    pub(super) schema: String,
    pub(super) sql: Sql,
    /// Owners that claimed through this ledger: their leases are renewed while it lives.
    pub(super) owners: Mutex<HashSet<String>>,
    pub(super) claims: AtomicU64,
    /// The partitions of the executions this ledger claimed or looked up.
    pub(super) partitions: Mutex<HashMap<ExecutionId, u16>>,
}

/// A write for a writer task.
pub(super) enum Write {
    /// A claim, with the first attempt's dispatch to record if it creates the execution.
    Claim(
        Claim,
        Option<Dispatch>,
        oneshot::Sender<Result<Claimed, LedgerError>>,
    ),
    /// An event, with a result to keep beside it (a `completed`'s, in the same transaction).
    Append(
        LedgerEvent,
        Option<Bytes>,
        oneshot::Sender<Result<ExecutionRecord, LedgerError>>,
    ),
}

/// The outcome of one write of a batch.
pub(super) enum Done {
    Claim(Result<Claimed, LedgerError>),
    Append(Result<ExecutionRecord, LedgerError>),
}

/// One sealed line, ready to insert.
pub(super) struct Sealed {
    pub(super) seq: i64,
    pub(super) prev: String,
    pub(super) hash: String,
    pub(super) execution_id: String,
    pub(super) line: String,
    pub(super) head: chain::ChainHead,
}

/// A write for the writer, with its partition, and how many batches left it for later.
pub(super) struct Queued {
    pub(super) chain: u16,
    pub(super) deferred: u8,
    pub(super) write: Write,
}

/// The writer: takes the queued writes in batches, one transaction each; the writes whose
/// chain another replica holds go first into the next. Ends when every ledger clone is gone.
pub(super) async fn run_writer(core: Arc<Core>, mut queue: mpsc::Receiver<Queued>) {
    let mut answered = 0;
    let mut deferred: Vec<Queued> = Vec::new();
    loop {
        let mut batch = std::mem::take(&mut deferred);
        if batch.is_empty() {
            match queue.recv().await {
                Some(first) => batch.push(first),
                None => break,
            }
        }
        // The callers just answered usually come back at once: give them a few turns of the
        // scheduler to join this batch (one commit for all, not two).
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
        deferred = core.write_batch(batch).await;
    }
}

/// Renews the leases of the owners that claimed through this ledger every
/// [`OWNER_HEARTBEAT`](PostgresLedger::OWNER_HEARTBEAT); once the writer has ended (every
/// ledger clone is gone, and its last batch is done), releases them.
pub(super) async fn run_leases(core: Arc<Core>, mut writer: tokio::task::JoinHandle<()>) {
    loop {
        match tokio::time::timeout(PostgresLedger::OWNER_HEARTBEAT, &mut writer).await {
            Ok(_) => break,
            Err(_) => {
                let owners: Vec<String> = core.registered_owners().iter().cloned().collect();
                if !owners.is_empty()
                    && let Err(error) = core.renew_leases(&owners).await
                {
                    tracing::warn!(%error, "could not renew owner leases");
                }
            }
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
    pub(super) async fn client(&self) -> Result<Object, LedgerError> {
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

    pub(super) fn registered_owners(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.owners.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn known_partitions(&self) -> std::sync::MutexGuard<'_, HashMap<ExecutionId, u16>> {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn remember_partition(&self, id: ExecutionId, chain: u16) {
        let mut known = self.known_partitions();
        if known.len() >= REMEMBERED {
            known.clear();
        }
        known.insert(id, chain);
    }

    /// The partition of an execution: its intent's, remembered or read from its row; `None`
    /// when the index does not hold it.
    pub(super) async fn partition_of_execution(
        &self,
        id: ExecutionId,
    ) -> Result<Option<u16>, LedgerError> {
        if let Some(chain) = self.known_partitions().get(&id) {
            return Ok(Some(*chain));
        }
        let client = self.client().await?;
        let row = client
            .query_opt(self.sql.intent_of.as_str(), &[&id.to_string()])
            .await
            .map_err(|e| read_failed("reading an execution's intent", e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let chain = partition_of(row.get(0), row.get(1), row.get(2));
        self.remember_partition(id, chain);
        Ok(Some(chain))
    }

    /// How the head log names this ledger.
    pub(super) fn schema_label(&self) -> String {
        format!("postgres:{}", self.schema)
    }

    /// How the head log names one of its chains.
    pub(super) fn chain_label(&self, chain: u16) -> String {
        format!("postgres:{}/{chain}", self.schema)
    }

    /// Logs the heads as the ledger opens (see [`chain::log_head`]): the newest line of all,
    /// and the head of each chain that has lines. A head that cannot be read is only a
    /// warning here, as the first write reads it again.
    pub(super) async fn log_head(&self) {
        let heads = async {
            let client = self.client().await?;
            let rows = client
                .query(self.sql.heads.as_str(), &[])
                .await
                .map_err(|e| read_failed("reading the chain heads", e))?;
            rows.iter()
                .map(|row| {
                    let chain = u16::try_from(row.get::<_, i32>(0)).unwrap_or(u16::MAX);
                    Ok((chain, head_of(row.get(1), row.get(2), chain)?))
                })
                .collect::<Result<Vec<_>, StorageError>>()
                .map_err(LedgerError::Storage)
        };
        match heads.await {
            Ok(heads) => {
                let newest = heads
                    .iter()
                    .map(|(_, (seq, hash))| (*seq, *hash))
                    .filter(|(seq, _)| *seq > 0)
                    .max_by_key(|(seq, _)| *seq)
                    .map_or(chain::ChainHead::GENESIS, |(seq, hash)| {
                        (u64::try_from(seq).unwrap_or(0), hash).into()
                    });
                chain::log_head(&self.schema_label(), None, newest);
                for (chain, (seq, hash)) in heads.into_iter().filter(|(_, (seq, _))| *seq > 0) {
                    let head = (u64::try_from(seq).unwrap_or(0), hash).into();
                    chain::log_head(&self.chain_label(chain), None, head);
                }
            }
            Err(error) => tracing::warn!(%error, "cannot read the ledger heads to log them"),
        }
    }

    pub(super) async fn renew_leases(&self, owners: &[String]) -> Result<u64, LedgerError> {
        let client = self.client().await?;
        client
            .execute(self.sql.renew_owners.as_str(), &[&owners, &lease_seconds()])
            .await
            .map_err(|e| read_failed("renewing owner leases", e))
    }

    /// Runs one batch and answers every caller in it but those whose chain another replica
    /// held: those it returns, for the next batch.
    pub(super) async fn write_batch(&self, batch: Vec<Queued>) -> Vec<Queued> {
        let claims = batch
            .iter()
            .filter(|q| matches!(q.write, Write::Claim(..)))
            .count() as u64;
        let latest_claim = batch
            .iter()
            .filter_map(|q| match &q.write {
                Write::Claim(claim, _, _) => Some(claim.at),
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
        let mut deferred = Vec::new();
        match outcome {
            Ok(done) => {
                for (queued, done) in batch.into_iter().zip(done) {
                    let Some(done) = done else {
                        deferred.push(Queued {
                            deferred: queued.deferred.saturating_add(1),
                            ..queued
                        });
                        continue;
                    };
                    let chain = queued.chain;
                    match (queued.write, done) {
                        (Write::Claim(_, _, reply), Done::Claim(result)) => {
                            if let Ok(claimed) = &result {
                                self.remember_partition(claimed.record().execution_id, chain);
                            }
                            let _ = reply.send(result);
                        }
                        (Write::Append(_, _, reply), Done::Append(result)) => {
                            let _ = reply.send(result);
                        }
                        (Write::Claim(_, _, reply), Done::Append(_)) => {
                            let _ = reply.send(Err(mismatch()));
                        }
                        (Write::Append(_, _, reply), Done::Claim(_)) => {
                            let _ = reply.send(Err(mismatch()));
                        }
                    }
                }
            }
            Err(message) => {
                for Queued { write, .. } in batch {
                    let error = LedgerError::Storage(message.clone());
                    match write {
                        Write::Claim(_, _, reply) => {
                            let _ = reply.send(Err(error));
                        }
                        Write::Append(_, _, reply) => {
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
        deferred
    }

    /// One write transaction: lock the head rows of the batch's chains, read what the batch
    /// needs, apply, take the `seq`s, write, commit. A write whose chain another transaction
    /// holds is left for the next batch (`None`), rather than making the whole batch wait,
    /// unless it was left [`DEFER_LIMIT`] times already.
    ///
    /// Longer than most functions here: its steps (read, decide, seal, write, commit) share
    /// one connection, its prepared statements and the borrowed parameters of one pipeline;
    /// the deciding is [`apply_batch`], the sealing [`seal`], the reading [`into_index`].
    pub(super) async fn transact(
        &self,
        client: &Object,
        batch: &[Queued],
    ) -> Result<Vec<Option<Done>>, StorageError> {
        let sql = &self.sql;
        let lock_stmt = client
            .prepare_cached(&sql.lock_chains)
            .await
            .map_err(write_failed)?;
        let try_lock_stmt = client
            .prepare_cached(&sql.try_lock_chains)
            .await
            .map_err(write_failed)?;
        let read_stmt = client
            .prepare_cached(&sql.read)
            .await
            .map_err(write_failed)?;

        let (append_ids, actors, scopes, fingerprints) = what_it_reads(batch);
        // The chains to wait for (of writes left too often), and those to take if free.
        let chains = |waits: bool| {
            let mut chains: Vec<i32> = batch
                .iter()
                .filter(|q| (q.deferred >= DEFER_LIMIT) == waits)
                .map(|q| i32::from(q.chain))
                .collect();
            chains.sort_unstable();
            chains.dedup();
            chains
        };
        let (wait_for, take_free) = (chains(true), chains(false));

        // Pipelined: BEGIN; the chains' locks, those waited for first, in `chain` order as
        // every transaction waits (so that no two wait for each other), then the free ones,
        // never waited for; then the reads, whose snapshot is taken once the locks are held
        // (a statement that waited for a lock would see an old one).
        let begin = format!("BEGIN; {WRITE_SETTINGS}");
        let reads = pipeline(vec![
            Box::pin(async { client.batch_execute(&begin).await.map(|()| Vec::new()) }),
            Box::pin(client.query(&lock_stmt, &[&wait_for])),
            Box::pin(client.query(&try_lock_stmt, &[&take_free])),
            Box::pin(client.query(&read_stmt, &[&append_ids, &actors, &scopes, &fingerprints])),
        ])
        .await;
        let mut reads = reads.into_iter();
        let mut next = || reads.next().unwrap_or(Ok(Vec::new())).map_err(write_failed);
        next()?;
        let mut head_rows = next()?;
        head_rows.extend(next()?);
        let rows = next()?;
        let mut heads = HashMap::new();
        for row in &head_rows {
            let chain = u16::try_from(row.get::<_, i32>(0)).unwrap_or(u16::MAX);
            heads.insert(chain, head_of(row.get(1), row.get(2), chain)?);
        }
        if heads.len() < wait_for.len() {
            return Err(StorageError::from(format!(
                "a chain of {wait_for:?} has no head row in mrg_chains; nothing was recorded: \
                 run `PostgresLedger::verify` and repair mrg_chains"
            )));
        }

        let mut index = into_index(&rows)?;
        let Applied {
            done,
            events,
            new_owners,
            results: kept,
        } = apply_batch(batch, &heads, &mut index, &self.registered_owners());

        if events.is_empty() && new_owners.is_empty() {
            client.batch_execute("COMMIT").await.map_err(write_failed)?;
            return Ok(done);
        }

        // The `seq`s, once the batch knows how many lines it seals (so that an honest chain
        // has gaps only where a write rolled back).
        let mut seqs: Vec<i64> = Vec::new();
        if !events.is_empty() {
            let next_seqs = client
                .prepare_cached(&sql.next_seqs)
                .await
                .map_err(write_failed)?;
            let count = events.len() as i64;
            seqs = client
                .query(&next_seqs, &[&count])
                .await
                .map_err(write_failed)?
                .iter()
                .map(|row| row.get::<_, i64>(0))
                .collect();
            seqs.sort_unstable();
        }
        let before = heads.clone();
        let Lines {
            sealed,
            touched,
            accepted_seq,
            last_seq,
        } = seal(events, &seqs, &mut heads)?;

        // The rows: the sealed lines, the final record of each execution touched, and the
        // chains' new heads.
        let (mut seqs, mut prevs, mut hashes, mut line_ids, mut lines) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut logged = Vec::with_capacity(sealed.len());
        for s in sealed {
            seqs.push(s.seq);
            prevs.push(s.prev);
            hashes.push(s.hash);
            line_ids.push(s.execution_id);
            lines.push(s.line);
            logged.push(s.head);
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
        let moved: Vec<(u16, (i64, ChainHash))> = heads
            .iter()
            .filter(|(chain, head)| before.get(chain) != Some(head))
            .map(|(chain, head)| (*chain, *head))
            .collect();
        let head_chains: Vec<i32> = moved.iter().map(|(c, _)| i32::from(*c)).collect();
        let head_seqs: Vec<i64> = moved.iter().map(|(_, (seq, _))| *seq).collect();
        let head_hashes: Vec<String> = moved.iter().map(|(_, (_, h))| h.to_string()).collect();
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
        write_params.extend([
            &head_chains as &(dyn ToSql + Sync),
            &head_seqs,
            &head_hashes,
        ]);
        let owner_params: [&(dyn ToSql + Sync); 2] = [&new_owners, &lease];
        let store_result = if kept.is_empty() {
            None
        } else {
            Some(
                client
                    .prepare_cached(&sql.store_result)
                    .await
                    .map_err(write_failed)?,
            )
        };
        let result_params: Vec<[&(dyn ToSql + Sync); 3]> = kept
            .iter()
            .map(|(reference, id, bytes)| [reference as &(dyn ToSql + Sync), id, bytes])
            .collect();
        let mut writes: Vec<PgFuture<'_>> = Vec::new();
        if !seqs.is_empty() {
            writes.push(Box::pin(client.query(&write_stmt, &write_params)));
        }
        // After the executions' rows, which the results reference.
        if let Some(store_result) = &store_result {
            for params in &result_params {
                writes.push(Box::pin(client.query(store_result, params)));
            }
        }
        if !new_owners.is_empty() {
            writes.push(Box::pin(client.query(&renew_owners, &owner_params)));
        }
        writes.push(Box::pin(async {
            client.batch_execute("COMMIT").await.map(|()| Vec::new())
        }));
        let mut results = pipeline(writes).await;
        let committed = results.pop();
        let failed = results.into_iter().find_map(Result::err);
        match (committed, failed) {
            (Some(Ok(_)), None) => {}
            // Refused by the server: the COMMIT rolled the batch back.
            (_, Some(e)) if e.as_db_error().is_some() => return Err(write_failed(e)),
            // The connection went before every answer came: the COMMIT may have been made.
            (Some(Err(e)), _) | (_, Some(e)) => {
                return Err(StorageError::caused(
                    format!(
                        "{}; whether the batch was recorded is unknown: read the execution \
                         back (`Ledger::get`) before acting on it",
                        describe("the ledger's COMMIT failed", &e)
                    ),
                    e,
                ));
            }
            (None, None) => return Err(storage_of(mismatch())),
        }
        self.registered_owners().extend(new_owners);
        // Anchors: the line at every HEAD_LOG_EVERY-th `seq` of the ledger, and each chain's
        // head each time its `seq` passes a CHAIN_LOG_EVERY-th.
        for line in logged {
            chain::log_head(&self.schema_label(), Some(line.seq - 1), line);
        }
        for (chain, (seq, hash)) in moved {
            let was = before.get(&chain).map_or(0, |(seq, _)| *seq) as u64;
            let seq = u64::try_from(seq).unwrap_or(0);
            if was / CHAIN_LOG_EVERY != seq / CHAIN_LOG_EVERY {
                chain::log_head(&self.chain_label(chain), None, (seq, hash).into());
            }
        }
        Ok(done)
    }

    pub(super) async fn purge(&self, now: Timestamp) -> Result<u64, LedgerError> {
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
        tx.batch_execute(WRITE_SETTINGS).await.map_err(failed)?;
        // Every chain's lock: a write in flight could otherwise upsert a record back after
        // its purge.
        tx.query(self.sql.lock_all_chains.as_str(), &[])
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

/// A chain's head as its row in `mrg_chains` holds it.
fn head_of(seq: i64, hash: &str, chain: u16) -> Result<(i64, ChainHash), StorageError> {
    let hash = hash.parse::<ChainHash>().map_err(|_| {
        StorageError::from(format!(
            "the head of chain {chain} (seq {seq}) has an unreadable hash; nothing was \
             recorded: run `PostgresLedger::verify` and repair mrg_chains"
        ))
    })?;
    Ok((seq, hash))
}

/// What a batch reads under the lock: the records it appends to, and the intents it claims
/// (actors, scopes, fingerprints, column by column).
fn what_it_reads(batch: &[Queued]) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
    let mut append_ids: Vec<String> = Vec::new();
    let mut seen_ids = HashSet::new();
    let (mut actors, mut scopes, mut fingerprints) = (Vec::new(), Vec::new(), Vec::new());
    let mut seen_intents = HashSet::new();
    for Queued { write, .. } in batch {
        match write {
            Write::Append(event, _, _) => {
                if seen_ids.insert(event.execution_id) {
                    append_ids.push(event.execution_id.to_string());
                }
            }
            Write::Claim(claim, _, _) => {
                let key = IntentKey::of_claim(claim);
                if seen_intents.insert(key.clone()) {
                    actors.push(key.actor.to_string());
                    scopes.push(key.intent_scope.to_string());
                    fingerprints.push(key.fingerprint.to_string());
                }
            }
        }
    }

    (append_ids, actors, scopes, fingerprints)
}

/// The rows read under the lock (the records appended to, kind 1; each claimed intent's
/// latest, kind 2), into the index the batch's claims and appends are decided from.
fn into_index(rows: &[Row]) -> Result<Index, StorageError> {
    let mut index = Index::default();
    for row in rows {
        let kind: i32 = row.get(0);
        let record = record_from_json(row.get(1)).map_err(storage_of)?;
        index.load(record, kind == 2);
    }
    Ok(index)
}

/// What a batch decided: each call's outcome, in arrival order, and what to write for it.
struct Applied {
    /// `None` for a write whose chain the transaction does not hold.
    done: Vec<Option<Done>>,
    /// The events to seal, in order, each with its chain and whether it is an `accepted`.
    events: Vec<(u16, LedgerEvent, bool)>,
    /// Owners whose lease the transaction takes (or renews).
    new_owners: Vec<String>,
    /// Results to keep: reference, execution, bytes (each beside its `completed`).
    results: Vec<(String, String, Vec<u8>)>,
}

/// Decides every call of a batch whose chain is in `held` from the index ([`Index::claim`],
/// [`Index::append`]), in arrival order. `registered` are the owners this ledger already
/// renews.
fn apply_batch(
    batch: &[Queued],
    held: &HashMap<u16, (i64, ChainHash)>,
    index: &mut Index,
    registered: &HashSet<String>,
) -> Applied {
    let mut done = Vec::with_capacity(batch.len());
    let mut events = Vec::new();
    let mut new_owners: Vec<String> = Vec::new();
    let mut results = Vec::new();
    for Queued { chain, write, .. } in batch {
        if !held.contains_key(chain) {
            done.push(None);
            continue;
        }
        match write {
            // An owner is taken to be alive here (its lease is the database's to answer): an
            // execution that may still run links, and the guard asks the lease before it
            // continues one.
            Write::Claim(claim, dispatch, _) => match index.claim(claim, |_| true, || Ok(())) {
                Ok((claimed, accepted)) => {
                    if let Some(event) = accepted {
                        events.push((*chain, event, true));
                        if !registered.contains(&claim.owner) && !new_owners.contains(&claim.owner)
                        {
                            new_owners.push(claim.owner.clone());
                        }
                    }
                    // The first dispatch goes in the same transaction as the `accepted`.
                    let claimed = match (claimed, dispatch) {
                        (Claimed::New(record), Some(dispatch)) => {
                            let event = dispatch.event(&record, &claim.owner, claim.at);
                            index.append(&event).map(|record| {
                                events.push((*chain, event, false));
                                Claimed::New(record)
                            })
                        }
                        (claimed, _) => Ok(claimed),
                    };
                    done.push(Some(Done::Claim(claimed)));
                }
                Err(error) => done.push(Some(Done::Claim(Err(error)))),
            },
            Write::Append(event, result, _) => {
                // A kept result is named by its `completed` and written in its transaction:
                // never one without the other.
                let mut event = event.clone();
                let kept = result.as_ref().map(|bytes| {
                    let reference = result_reference(event.execution_id);
                    event.set_result_reference(reference.clone());
                    (reference, event.execution_id.to_string(), bytes.to_vec())
                });
                // Refused: nothing is written for it, the record stays as it was.
                let record = match index.append(&event) {
                    Ok(record) => record,
                    Err(error) => {
                        done.push(Some(Done::Append(Err(error))));
                        continue;
                    }
                };
                // Ownership moves with a dispatch: the dispatching owner's lease is taken in
                // this same transaction unless this ledger already holds (and renews) it, so
                // no replica that reads the record can take its owner for gone. Not renewed
                // on every dispatch: one owner's row, written by every transaction, is a
                // lock that every dispatch of every replica waits for.
                if let EventKind::Dispatched {
                    owner: Some(owner), ..
                } = &event.kind
                    && !registered.contains(owner)
                    && !new_owners.contains(owner)
                {
                    new_owners.push(owner.clone());
                }
                results.extend(kept);
                events.push((*chain, event, false));
                done.push(Some(Done::Append(Ok(record))));
            }
        }
    }
    Applied {
        done,
        events,
        new_owners,
        results,
    }
}

/// A batch's sealed lines and where they put its executions.
struct Lines {
    sealed: Vec<Sealed>,
    /// The executions the batch changed, in the order it first changed them.
    touched: Vec<ExecutionId>,
    accepted_seq: HashMap<ExecutionId, i64>,
    last_seq: HashMap<ExecutionId, i64>,
}

/// Seals `events` in order, each after the last line of its chain in `heads` (which it
/// moves), one `seq` of `seqs` (in increasing order) each.
fn seal(
    events: Vec<(u16, LedgerEvent, bool)>,
    seqs: &[i64],
    heads: &mut HashMap<u16, (i64, ChainHash)>,
) -> Result<Lines, StorageError> {
    if seqs.len() != events.len() {
        return Err(storage_of(mismatch()));
    }
    let mut lines = Lines {
        sealed: Vec::with_capacity(events.len()),
        touched: Vec::new(),
        accepted_seq: HashMap::new(),
        last_seq: HashMap::new(),
    };
    for ((chain, event, accepted), &seq) in events.into_iter().zip(seqs) {
        let head = heads
            .get_mut(&chain)
            .ok_or_else(|| storage_of(mismatch()))?;
        let id = event.execution_id;
        let line = ChainedLine::seal(
            u64::try_from(seq).unwrap_or(0),
            head.1,
            LineBody::Event(event),
        );
        *head = (seq, line.hash);
        lines.sealed.push(Sealed {
            seq,
            prev: line.prev.to_string(),
            hash: line.hash.to_string(),
            execution_id: id.to_string(),
            line: line.to_json_line(),
            head: line.head(),
        });
        if !lines.last_seq.contains_key(&id) {
            lines.touched.push(id);
        }
        lines.last_seq.insert(id, seq);
        if accepted {
            lines.accepted_seq.insert(id, seq);
        }
    }
    Ok(lines)
}
