//! The writer task: queued writes in batches, one transaction each (the chain lock, the
//! index the batch is decided from, the sealed lines), and the owner leases between them.

use super::*;

/// How many scheduler turns the writer gives answered callers to come back before it starts
/// the next transaction.
pub(super) const GATHER_TURNS: usize = 8;

/// The most calls one write transaction takes.
pub(super) const MAX_BATCH: usize = 512;

/// Calls waiting for the writer before callers wait to enqueue.
pub(super) const QUEUE: usize = 4096;

/// How many claims pass between two purges of expired records.
pub(super) const SWEEP_EVERY: u64 = 1024;

/// Settings of a write transaction: a lock wait that cannot hang forever; a transaction that
/// cannot stay open (holding the chain lock) if its writer stalls; and index lookups for the
/// batch's reads whatever the tables' size (a prepared statement keeps a generic plan, and one
/// made while the tables were small scans them whole once they are not; custom plans would
/// avoid that too, at the price of planning every batch under the lock).
pub(super) const WRITE_SETTINGS: &str = "SET LOCAL lock_timeout = '30s'; \
     SET LOCAL idle_in_transaction_session_timeout = '60s'; \
     SET LOCAL enable_seqscan = off";

/// What is shared by a ledger's clones and its writer.
pub(super) struct Core {
    pub(super) pool: Pool,
    pub(super) schema: String,
    pub(super) sql: Sql,
    pub(super) chain_lock: i64,
    /// Owners that claimed through this ledger: their leases are renewed while it lives.
    pub(super) owners: Mutex<HashSet<String>>,
    pub(super) claims: AtomicU64,
}

/// A write for the writer task.
pub(super) enum Write {
    Claim(Claim, oneshot::Sender<Result<Claimed, LedgerError>>),
    Append(
        LedgerEvent,
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
}

/// The writer: takes the queued writes in batches, one transaction each, and renews the
/// owner leases between them. Ends (releasing the leases) when every ledger clone is gone.
pub(super) async fn run_writer(core: Arc<Core>, mut queue: mpsc::Receiver<Write>) {
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

    /// How the head log names this ledger.
    pub(super) fn schema_label(&self) -> String {
        format!("postgres:{}", self.schema)
    }

    /// Logs the head as the ledger opens (see [`chain::log_head`]); a head that cannot be read
    /// is only a warning here, as the first write reads it again.
    pub(super) async fn log_head(&self) {
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

    pub(super) async fn renew_leases(&self, owners: &[String]) -> Result<u64, LedgerError> {
        let client = self.client().await?;
        client
            .execute(self.sql.renew_owners.as_str(), &[&owners, &lease_seconds()])
            .await
            .map_err(|e| read_failed("renewing owner leases", e))
    }

    /// Runs one batch and answers every caller in it.
    pub(super) async fn write_batch(&self, batch: Vec<Write>) {
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
    ///
    /// Longer than most functions here: its steps (read, decide, write, commit) share one
    /// connection, its prepared statements and the borrowed parameters of one pipeline; the
    /// deciding is [`apply_batch`], the reading [`into_index`].
    pub(super) async fn transact(
        &self,
        client: &Object,
        batch: &[Write],
    ) -> Result<Vec<Done>, StorageError> {
        let sql = &self.sql;
        let read_stmt = client
            .prepare_cached(&sql.read)
            .await
            .map_err(write_failed)?;

        let (append_ids, actors, scopes, fingerprints) = what_it_reads(batch);

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

        let (head, mut index) = into_index(&rows)?;
        let head_before = head.0;
        let Applied {
            done,
            sealed,
            touched,
            accepted_seq,
            last_seq,
            new_owners,
            head: (seq, prev),
        } = apply_batch(batch, &mut index, head, &self.registered_owners());

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

/// What a batch reads under the lock: the records it appends to, and the intents it claims
/// (actors, scopes, fingerprints, column by column).
fn what_it_reads(batch: &[Write]) -> (Vec<String>, Vec<String>, Vec<String>, Vec<String>) {
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

    (append_ids, actors, scopes, fingerprints)
}

/// The rows read under the lock, into the chain's head and the index the batch's claims and
/// appends are decided from.
fn into_index(rows: &[Row]) -> Result<((i64, ChainHash), Index), StorageError> {
    // The head (kind 0), the records appended to (1), each claimed intent's latest (2):
    // into the index the batch's claims and appends are decided from.
    let (mut seq, mut prev) = (0, ChainHash::GENESIS);
    let mut index = Index::default();
    for row in rows {
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

    Ok(((seq, prev), index))
}

/// What a batch decided: each call's outcome, in arrival order, and what to write for it.
struct Applied {
    done: Vec<Done>,
    sealed: Vec<Sealed>,
    /// The executions the batch changed, in the order it first changed them.
    touched: Vec<ExecutionId>,
    accepted_seq: HashMap<ExecutionId, i64>,
    last_seq: HashMap<ExecutionId, i64>,
    /// Owners whose lease the transaction takes (or renews).
    new_owners: Vec<String>,
    /// The chain's head after the batch's lines.
    head: (i64, ChainHash),
}

/// Decides every call of a batch from the index ([`Index::claim`], [`Index::append`]), in
/// arrival order, and seals the lines to write. `registered` are the owners this ledger
/// already renews.
fn apply_batch(
    batch: &[Write],
    index: &mut Index,
    head: (i64, ChainHash),
    registered: &HashSet<String>,
) -> Applied {
    let (mut seq, mut prev) = head;
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

    Applied {
        done,
        sealed,
        touched,
        accepted_seq,
        last_seq,
        new_owners,
        head: (seq, prev),
    }
}
