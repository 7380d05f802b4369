//! The writer thread: the only code that touches the file and the index (the lock, catch-up,
//! crash recovery, group commit, compaction).

use super::{
    disk::parent_dir,
    lines::{
        MAX_LINE_BYTES, Piece, could_be_torn, foreign_detail, newer_format, next_line,
        not_a_ledger, read_line, regular_file, starts_like_a_line,
    },
    *,
};

/// The most appends one group commit takes.
pub(super) const MAX_BATCH: usize = 4096;

/// How long a group commit waits for concurrent callers to join it.
pub(super) const LINGER: std::time::Duration = std::time::Duration::from_micros(150);

/// Takes what waits into `batch`, up to [`MAX_BATCH`].
fn drain(mut next: impl FnMut() -> Option<Op>, batch: &mut Vec<Op>) {
    while batch.len() < MAX_BATCH {
        match next() {
            Some(op) => batch.push(op),
            None => break,
        }
    }
}

/// Group commit: when callers are concurrent (the last batch had several), a batch lingers a
/// moment so that the ones being woken by the last sync join it. A lone caller never waits.
fn lingers(last_batch: usize, batch: &[Op]) -> bool {
    last_batch > 1 && batch.len() < MAX_BATCH
}

/// The writer's loop as a task on a tokio runtime (see `FileLedger::open_batched_on`): the
/// batches of the writer thread, lingering on the runtime's clock.
#[cfg(feature = "simulation")]
pub(super) async fn run_on_task(
    writer: Arc<Mutex<Writer>>,
    mut ops: tokio::sync::mpsc::UnboundedReceiver<Op>,
) {
    let mut last_batch = 0;
    while let Some(first) = ops.recv().await {
        let mut batch = vec![first];
        drain(|| ops.try_recv().ok(), &mut batch);
        if lingers(last_batch, &batch) {
            tokio::time::sleep(LINGER).await;
            drain(|| ops.try_recv().ok(), &mut batch);
        }
        last_batch = batch.len();
        writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .serve(batch);
    }
}

/// How a ledger was opened; the writer keeps it across reopens.
#[derive(Clone)]
pub(super) struct Mode {
    pub(super) read_only: bool,
    pub(super) lock_timeout: Duration,
    /// Where appends, syncs and cuts go.
    pub(super) disk: Arc<dyn Disk>,
}

impl Mode {
    /// A ledger that writes through `disk`, waiting at most `lock_timeout` for the lock.
    pub(super) fn writing(disk: Arc<dyn Disk>, lock_timeout: Duration) -> Self {
        Self {
            read_only: false,
            lock_timeout,
            disk,
        }
    }
}

/// Takes the exclusive lock on the ledger, waiting at most `timeout` for another process to
/// release it. `flock(2)` has no timed wait, so this polls with a short backoff.
pub(super) fn lock_within(file: &File, path: &Path, timeout: Duration) -> Result<(), LedgerError> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(fs::TryLockError::WouldBlock) => {}
            Err(fs::TryLockError::Error(e)) => return Err(failed("cannot lock the ledger", e)),
        }
        let now = Instant::now();
        if now >= deadline {
            let holder = lock_holder(file).map_or_else(
                || "another process".to_owned(),
                |pid| format!("another process (pid {pid})"),
            );
            return Err(LedgerError::storage(format!(
                "the ledger {} is locked by {holder}, which did not release it within {}: \
                 nothing was recorded; wait for that process to finish, or stop it",
                path.display(),
                humantime::format_duration(timeout)
            )));
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// The pid of the process that holds the `flock(2)` lock on `file`, from `/proc/locks`
/// (Linux; `None` elsewhere). The kernel knows the holder, so nothing has to be written
/// beside the ledger to name it, and the answer is never stale.
pub(super) fn lock_holder(file: &File) -> Option<u32> {
    let meta = file.metadata().ok()?;
    let dev = meta.dev();
    // The encoding of `dev_t` glibc and the kernel use.
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let wanted = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5875183 0 EOF`; waiters' lines have `->`.
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            // A holder in another pid namespace shows as pid 0: not a pid to name.
            [_, "FLOCK", _, _, pid, inode, ..] if inode == wanted => {
                pid.parse().ok().filter(|&pid| pid != 0)
            }
            _ => None,
        }
    })
}

/// The writer thread: the only code that touches the file and the index.
pub(super) struct Writer {
    path: PathBuf,
    file: File,
    /// Bytes of the file read into the index.
    offset: u64,
    head: (u64, ChainHash),
    /// What decisions need of every retained execution, a few hundred bytes each (the
    /// events come back exactly as written), and the kept results.
    index: IndexOf<Compact>,
    /// The id of the fingerprint key the chain names.
    key_id: Option<String>,
    owners: Arc<Owners>,
    mode: Mode,
    /// The last [`locked`](Self::locked) failed to take the lock (so `f` never ran and the
    /// index holds nothing unwritten).
    lock_failed: bool,
}

impl Writer {
    pub(super) fn open(path: &Path, owners: Arc<Owners>, mode: Mode) -> Result<Self, LedgerError> {
        regular_file(path)?;
        let mut options = OpenOptions::new();
        options.read(true);
        let opened = if mode.read_only {
            options.open(path).map(|file| (file, false))
        } else {
            options.append(true).mode(0o600);
            // Created here, or there already (made by another process in between, perhaps).
            match options.clone().create_new(true).open(path) {
                Ok(file) => Ok((file, true)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    options.create(true).open(path).map(|file| (file, false))
                }
                Err(e) => Err(e),
            }
        };
        let (file, created) = opened.map_err(|e| {
            if mode.read_only && e.kind() == io::ErrorKind::NotFound {
                LedgerError::storage(format!("no ledger at {}", path.display()))
            } else {
                failed(&format!("cannot open the ledger {}", path.display()), e)
            }
        })?;
        // A file's name is durable only once its directory is synced. Synced at every open for
        // writing, not only at creation: a process killed between putting a name in place (a
        // compaction's rename, a creation) and syncing the directory leaves a name a power
        // loss may take back, and every write acknowledged under it with the name.
        if !mode.read_only {
            mode.disk.sync_dir(parent_dir(path)).map_err(|e| {
                let what = if created { "new ledger" } else { "ledger" };
                failed(
                    &format!("cannot make the {what} {} durable", path.display()),
                    e,
                )
            })?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            offset: 0,
            head: (0, ChainHash::GENESIS),
            index: IndexOf::default(),
            key_id: None,
            owners,
            mode,
            lock_failed: false,
        })
    }

    /// Runs `f` holding the exclusive lock, after catching up with the file.
    fn locked<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        if self.mode.read_only {
            return Err(storage("internal", "a write on a read-only ledger"));
        }
        let deadline = Instant::now() + self.mode.lock_timeout;
        loop {
            self.reopen_if_replaced()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if let Err(error) = lock_within(&self.file, &self.path, left) {
                self.lock_failed = true;
                return Err(error);
            }
            // Compaction may have replaced the file while this process waited for the lock.
            if !self.is_replaced()? {
                break;
            }
            let _ = self.file.unlock();
        }
        let result = self.catch_up(true).and_then(|()| f(self));
        let _ = self.file.unlock();
        result
    }

    /// Compaction replaces the file: a file whose inode is no longer at the path is reopened.
    fn reopen_if_replaced(&mut self) -> Result<(), LedgerError> {
        if self.is_replaced()? {
            let owners = self.owners.clone();
            *self = Self::open(&self.path.clone(), owners, self.mode.clone())?;
        }
        Ok(())
    }

    fn is_replaced(&self) -> Result<bool, LedgerError> {
        let current = self
            .file
            .metadata()
            .map_err(|e| failed("cannot stat the ledger", e))?;
        match fs::metadata(&self.path) {
            Ok(at_path) => Ok(current.ino() != at_path.ino() || current.dev() != at_path.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(failed("cannot stat the ledger", e)),
        }
    }

    /// Reads the lines other processes appended, checking that each one follows the chain.
    ///
    /// A torn append (a writer died mid-line) can only leave bytes after the last newline.
    /// Holding the exclusive lock, those are cut away when they can be the start of a line;
    /// without the lock they are just not read yet. Any complete line that does not read or
    /// does not verify is an error and the file is left as it is: it may be an acknowledged
    /// line (a `dispatched` whose request left), and cutting it would send the call again;
    /// reading past it would build on a line nobody wrote. So are bytes after the last
    /// newline that cannot be part of a line, and a file that does not start with a line.
    pub(super) fn catch_up(&mut self, locked: bool) -> Result<(), LedgerError> {
        let len = self
            .file
            .metadata()
            .map_err(|e| failed("cannot stat the ledger", e))?
            .len();
        if len <= self.offset {
            return Ok(());
        }
        // Line by line, each bounded: the file may be anything, of any size. (Through a handle
        // of its own, so that the index can take each line as it is read.)
        let mut file = self
            .file
            .try_clone()
            .map_err(|e| failed("cannot read the ledger", e))?;
        file.seek(SeekFrom::Start(self.offset))
            .map_err(|e| failed("cannot read the ledger", e))?;
        let mut reader = io::BufReader::new(file.take(len - self.offset));
        loop {
            let piece = next_line(&mut reader).map_err(|e| failed("cannot read the ledger", e))?;
            let line = match piece {
                Piece::Line(line) => line,
                Piece::Tail(tail) if tail.is_empty() => return Ok(()),
                Piece::Tail(tail) if could_be_torn(&tail) => {
                    if locked {
                        tracing::warn!(path = %self.path.display(), bytes = tail.len(), "cutting a torn last ledger line (a crash mid-write)");
                        return self.truncate_at(self.offset);
                    }
                    return Ok(());
                }
                Piece::Tail(tail) => {
                    let problem = ChainProblem::Unreadable {
                        detail: "the file ends with bytes that cannot start a ledger line".into(),
                    };
                    return Err(self.refusal(&tail, problem));
                }
                Piece::Foreign(start) => {
                    let detail = foreign_detail(&start);
                    return Err(self.refusal(&start, ChainProblem::Unreadable { detail }));
                }
            };
            match read_line(&line, self.head) {
                Ok(None) => {}
                Ok(Some(chained)) => self.take_line(chained),
                // The lines before it are in the index: they are not read again.
                Err(problem) => return Err(self.refusal(&line, problem)),
            }
            self.offset += line.len() as u64 + 1;
        }
    }

    /// The error for a line at `self.offset` that cannot be taken (`line` is what was read of
    /// it). Nothing of the line is quoted: the file may not be a ledger at all.
    fn refusal(&self, line: &[u8], problem: ChainProblem) -> LedgerError {
        let at = self.offset;
        let seq = self.head.0 + 1;
        let path = self.path.display();
        if let Some(what) = newer_format(line) {
            return LedgerError::storage(format!(
                "the ledger line at byte {at} (seq {seq}) of {path} is of a newer format than \
                 this build reads ({what}), or garbled: the file is left as it is; use the \
                 replay-guard that wrote it"
            ));
        }
        if self.head.0 == 0
            && !starts_like_a_line(line)
            && matches!(problem, ChainProblem::Unreadable { .. })
        {
            return not_a_ledger(&self.path, line);
        }
        LedgerError::storage(format!(
            "the ledger line at byte {at} (seq {seq}) of {path}: {problem}; the file is left as \
             it is (nothing was cut or written): `replay-guard audit verify {path}` names the \
             line, and an operator decides what to do with it"
        ))
    }

    fn truncate_at(&mut self, offset: u64) -> Result<(), LedgerError> {
        self.mode
            .disk
            .truncate(&self.file, offset)
            .map_err(|e| failed("cannot cut the torn ledger tail", e))?;
        self.offset = offset;
        Ok(())
    }

    fn take_line(&mut self, line: ChainedLine) {
        self.head = (line.seq, line.hash);
        match line.body {
            LineBody::Checkpoint { .. } => {}
            LineBody::FingerprintKey { fingerprint_key } => match &self.key_id {
                None => self.key_id = Some(fingerprint_key.id),
                Some(bound) if *bound == fingerprint_key.id => {}
                Some(_) => {
                    tracing::warn!(
                        seq = line.seq,
                        "a ledger line names a second fingerprint key; the first one stays"
                    )
                }
            },
            LineBody::Result(stored) => {
                let bytes = Bytes::from(stored.result.to_string());
                self.index.results.insert(stored.reference, bytes);
            }
            LineBody::Event(event) => {
                if let Err(error) = self.index.apply(&event) {
                    tracing::warn!(seq = line.seq, %error, "a ledger line does not apply to its execution");
                }
            }
        }
    }

    /// The writer of the file the ledger's name holds now, its index read from it, locked.
    /// Another process may compact that file between this one's open and its lock (the lock
    /// was free): a file no longer at the path is opened again, since a line written there
    /// would go to an archive, acknowledged and missing from the ledger.
    fn reopen(&mut self) -> Result<(), LedgerError> {
        let _ = self.file.unlock();
        let deadline = Instant::now() + self.mode.lock_timeout;
        loop {
            let owners = self.owners.clone();
            *self = Self::open(&self.path.clone(), owners, self.mode.clone())?;
            let left = deadline.saturating_duration_since(Instant::now());
            lock_within(&self.file, &self.path, left)?;
            if !self.is_replaced()? {
                return self.catch_up(true);
            }
        }
    }

    /// Writes lines (already applied to the index) and syncs them.
    fn write(&mut self, bodies: Vec<LineBody>) -> Result<(), LedgerError> {
        self.write_flushed(bodies, Flush::Now)
    }

    /// Writes lines (already applied to the index), and syncs them with everything written
    /// before unless `flush` lets them wait for the next sync.
    fn write_flushed(&mut self, bodies: Vec<LineBody>, flush: Flush) -> Result<(), LedgerError> {
        if bodies.is_empty() {
            return Ok(());
        }
        let (text, head) = seal_lines(self.head, bodies)?;
        let disk = &self.mode.disk;
        disk.write(&self.file, text.as_bytes())
            .and_then(|()| match flush {
                Flush::Now => disk.sync(&self.file),
                Flush::WithNext => Ok(()),
            })
            .map_err(|e| failed("cannot write the ledger", e))?;
        self.offset += text.len() as u64;
        let before = self.head.0;
        self.head = head;
        chain::log_head(&self.path.display(), Some(before), self.head.into());
        Ok(())
    }

    /// On open: an execution left `dispatched` by an owner that is gone has an unknown outcome
    /// ([`execution::orphan_unknown`](crate::execution::orphan_unknown)).
    pub(super) fn recover(&mut self) -> Result<(), LedgerError> {
        self.locked(|w| {
            let owners = w.owners.clone();
            let orphans = w
                .index
                .settle_orphans(|owner| owners.is_alive(owner), Timestamp::now())?;
            for event in &orphans {
                tracing::warn!(execution_id = %event.execution_id, "dispatched by a process that is gone: outcome unknown");
            }
            w.write(orphans.into_iter().map(LineBody::Event).collect())?;
            w.owners.prune();
            Ok(())
        })
    }

    /// The writer thread's loop.
    pub(super) fn run(mut self, ops: mpsc::Receiver<Op>) {
        chain::log_head(&self.path.display(), None, self.head.into());
        let mut last_batch = 0;
        while let Ok(first) = ops.recv() {
            let mut batch = vec![first];
            drain(|| ops.try_recv().ok(), &mut batch);
            if lingers(last_batch, &batch) {
                thread::sleep(LINGER);
                drain(|| ops.try_recv().ok(), &mut batch);
            }
            last_batch = batch.len();
            self.serve(batch);
        }
    }

    /// Serves one batch: reads without the lock, writes under it, every reply held until the
    /// batch is on disk. A match over the batch's operations, one arm each: longer than
    /// most functions, because each arm is where its operation's lines are made.
    pub(super) fn serve(&mut self, batch: Vec<Op>) {
        let writes = batch.iter().any(Op::writes);
        if !writes {
            // Reads only: catch up without the lock (an incomplete tail is simply not read).
            let caught_up = self
                .reopen_if_replaced()
                .and_then(|()| self.catch_up(false));
            for op in batch {
                self.answer_read(op, caught_up.as_ref().err());
            }
            return;
        }
        // One sync for the batch unless every write in it may wait for the next one.
        let flush = if batch
            .iter()
            .all(|op| !op.writes() || matches!(op, Op::Append(_, Flush::WithNext, _)))
        {
            Flush::WithNext
        } else {
            Flush::Now
        };
        let mut replies: Vec<PendingReply> = Vec::new();
        let outcome = self.locked(|w| {
            let mut bodies = Vec::new();
            for op in batch {
                match op {
                    Op::Claim(claim, reply) => {
                        let (claim, dispatch) = *claim;
                        // Expired executions leave the index; their lines stay until
                        // compaction.
                        let owners = &w.owners;
                        let alive = |owner: &str| owners.is_alive(owner);
                        w.index.count_claim(claim.at, alive);
                        let claimed = w
                            .index
                            .claim(&claim, alive, || owners.hold(&claim.owner))
                            .and_then(|(claimed, accepted)| {
                                bodies.extend(accepted.map(LineBody::Event));
                                match (claimed, dispatch) {
                                    // The first dispatch goes in the same write as the
                                    // `accepted`: one sync before the request leaves.
                                    (Claimed::New(record), Some(dispatch)) => {
                                        let event = dispatch.event(&record, &claim.owner, claim.at);
                                        let record = w.index.apply(&event)?;
                                        bodies.push(LineBody::Event(event));
                                        Ok(Claimed::New(record))
                                    }
                                    (claimed, _) => Ok(claimed),
                                }
                            });
                        replies.push(Box::new(move |failed| send(reply, claimed, failed)));
                    }
                    Op::Complete(mut event, result, reply) => {
                        let id = event.execution_id;
                        let kept = result.and_then(|bytes| {
                            match serde_json::from_slice(&bytes)
                                .map_err(|e| failed("a result to keep is not JSON", e))
                                .and_then(|result| fits_in_a_line(result, &bytes))
                            {
                                Ok(result) => Some((bytes, result)),
                                Err(error) => {
                                    tracing::warn!(execution_id = %id, %error, "could not keep the result");
                                    None
                                }
                            }
                        });
                        let reference = result_reference(id);
                        if kept.is_some() {
                            event.set_result_reference(reference.clone());
                        }
                        let applied = w.index.apply(&event);
                        if applied.is_ok() {
                            if let Some((bytes, result)) = kept {
                                w.index.results.insert(reference.clone(), bytes);
                                bodies.push(LineBody::Result(StoredResult {
                                    result_of: id,
                                    reference,
                                    result,
                                }));
                            }
                            bodies.push(LineBody::Event(event));
                        }
                        replies.push(Box::new(move |failed| send(reply, applied, failed)));
                    }
                    Op::Append(event, _, reply) => {
                        // Ownership moves with a dispatch: this process holds the dispatching
                        // owner's lock before the `dispatched` line is written, so no process
                        // that reads the line can take its owner for gone.
                        let applied = match &event.kind {
                            EventKind::Dispatched {
                                owner: Some(owner), ..
                            } => w.owners.hold(owner),
                            _ => Ok(()),
                        }
                        .and_then(|()| w.index.apply(&event));
                        if applied.is_ok() {
                            bodies.push(LineBody::Event(event));
                        }
                        replies.push(Box::new(move |failed| send(reply, applied, failed)));
                    }
                    Op::StoreResult(id, bytes, reply) => {
                        let stored = serde_json::from_slice(&bytes)
                            .map_err(|e| failed("a result to keep is not JSON", e))
                            .and_then(|result| fits_in_a_line(result, &bytes))
                            .map(|result| {
                                let reference = result_reference(id);
                                w.index.results.insert(reference.clone(), bytes);
                                bodies.push(LineBody::Result(StoredResult {
                                    result_of: id,
                                    reference: reference.clone(),
                                    result,
                                }));
                                reference
                            });
                        replies.push(Box::new(move |failed| send(reply, stored, failed)));
                    }
                    Op::Compact(now, above, reply) => {
                        // Whatever this batch appended goes first, into the archived file. A
                        // write that fails fails the batch: every write of it is told it was
                        // not recorded (its compaction too), and the index is rebuilt from the
                        // file. It used to be the compaction's failure alone, and the writes
                        // before it were acknowledged unwritten.
                        if let Err(error) = w.write(std::mem::take(&mut bodies)) {
                            replies.push(Box::new(move |failed| {
                                send(reply, Err(storage("the compaction did not run", "")), failed)
                            }));
                            return Err(error);
                        }
                        // Another process may have compacted it while this one waited.
                        if above.is_some_and(|bytes| w.offset <= bytes) {
                            replies.push(Box::new(move |failed| send(reply, Ok(None), failed)));
                            continue;
                        }
                        let report = w.compact(now).map(Some);
                        if report.is_err() {
                            // Its file may have been swapped in under the name before it
                            // failed: what comes next is written to the file the name holds.
                            w.reopen()?;
                        }
                        replies.push(Box::new(move |failed| send(reply, report, failed)));
                    }
                    Op::BindKey(id, reply) => {
                        let bound = check_key(w.key_id.as_deref(), &id);
                        if bound.is_ok() && w.key_id.is_none() {
                            w.key_id = Some(id.clone());
                            bodies.push(LineBody::FingerprintKey {
                                fingerprint_key: KeyBinding { id },
                            });
                        }
                        replies.push(Box::new(move |failed| {
                            let _ = reply.send(match failed {
                                Some(error) => {
                                    Err(storage("the key binding was not recorded", error))
                                }
                                None => bound,
                            });
                        }));
                    }
                    read => w.answer_read(read, None),
                }
            }
            w.write_flushed(bodies, flush)
        });
        // A lock that was not had: nothing ran, nothing to rebuild (and no second wait).
        if outcome.is_err() && !std::mem::take(&mut self.lock_failed) {
            // The index may hold what was not written: rebuild it from the file.
            let owners = self.owners.clone();
            match Self::open(&self.path.clone(), owners, self.mode.clone()) {
                Ok(fresh) => *self = fresh,
                Err(error) => {
                    tracing::error!(%error, "cannot reopen the ledger after a failed write")
                }
            }
            let _ = self.locked(|_| Ok(()));
        }
        for reply in replies {
            reply(outcome.as_ref().err());
        }
    }

    fn answer_read(&mut self, op: Op, failed: Option<&LedgerError>) {
        let index = &self.index;
        match op {
            Op::Get(id, reply) => send(
                reply,
                Ok(index.executions.get(&id).map(|e| e.record(id).into_owned())),
                failed,
            ),
            Op::Events(id, reply) => send(
                reply,
                Ok(index
                    .executions
                    .get(&id)
                    .map(|e| e.events(id))
                    .unwrap_or_default()),
                failed,
            ),
            Op::List(reply) => send(reply, Ok(index.records()), failed),
            Op::LoadResult(reference, reply) => {
                send(reply, Ok(index.results.get(&reference).cloned()), failed)
            }
            Op::KeyState(reply) => {
                let state = (self.key_id.clone(), self.head.0 > 0);
                let _ = reply.send(match failed {
                    Some(error) => Err(storage("cannot read the ledger", error)),
                    None => Ok(state),
                });
            }
            Op::BindKey(_, reply) => {
                let _ = reply.send(Err(storage(
                    "internal",
                    "a key binding was answered as a read",
                )));
            }
            Op::Claim(_, reply) => send(
                reply,
                Err(storage("internal", "a claim was answered as a read")),
                None,
            ),
            Op::Append(_, _, reply) | Op::Complete(_, _, reply) => send(
                reply,
                Err(storage("internal", "an append was answered as a read")),
                None,
            ),
            Op::StoreResult(_, _, reply) => send(
                reply,
                Err(storage("internal", "a result was answered as a read")),
                None,
            ),
            Op::Compact(_, _, reply) => send(
                reply,
                Err(storage("internal", "a compaction was answered as a read")),
                None,
            ),
        }
    }

    /// Archives the file; the new one starts with a checkpoint carrying the archived head.
    fn compact(&mut self, now: Timestamp) -> Result<CompactReport, LedgerError> {
        let before = self.index.executions.len();
        let bytes_before = self.offset;
        let owners = &self.owners;
        self.index
            .purge_expired(now, |owner| owners.is_alive(owner));
        let kept = self.index.executions.len();
        let mut bodies = vec![LineBody::Checkpoint {
            checkpoint: Checkpoint {
                compacted_through: self.head.0,
                removed: self.head.0,
            },
        }];
        if let Some(id) = &self.key_id {
            bodies.push(LineBody::FingerprintKey {
                fingerprint_key: KeyBinding { id: id.clone() },
            });
        }
        // Reopened, the file names each intent's latest execution by the order of the
        // acceptances: each intent's latest is written after the others. Not by ID alone:
        // an ID's time is the clock's, and after the clock stepped back a newer execution
        // has the smaller ID; written first, an older one of its intent would read as the
        // latest, and a claim would pass by the newer one still unsettled.
        let mut executions: Vec<ExecutionId> = self.index.executions.keys().copied().collect();
        executions.sort_by_key(|&id| (self.index.is_latest(id), id));
        for id in executions {
            let entry = &self.index.executions[&id];
            bodies.extend(entry.events(id).into_iter().map(LineBody::Event));
            // Every result of a retained execution, referenced yet or not: the guard keeps a
            // result before it records the `completed` that references it, and a compaction
            // (by any process) may fall between the two.
            let mut references = vec![result_reference(id)];
            if let Some(reference) = entry.record(id).into_owned().result_reference
                && reference != references[0]
            {
                references.push(reference);
            }
            for reference in references {
                if let Some(bytes) = self.index.results.get(&reference)
                    && let Ok(result) = serde_json::from_slice(bytes)
                {
                    bodies.push(LineBody::Result(StoredResult {
                        result_of: id,
                        reference,
                        result,
                    }));
                }
            }
        }
        let archived_to = sibling(&self.path, &format!("{}.archive", self.head.0));
        let next = sibling(&self.path, "compacting");
        // The compacted file's head is read back when it is reopened below.
        let (text, _) = seal_lines(self.head, bodies)?;
        let bytes_after = text.len() as u64;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&next)
            .map_err(|e| failed("cannot create the compacted ledger", e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| failed("cannot write the compacted ledger", e))?;
        // Keep the old chain, then put the new file in place (the lock on the old inode is
        // still held, so no other process appends in between).
        link_archive(&self.path, &archived_to)
            .and_then(|()| fs::rename(&next, &self.path))
            .and_then(|()| self.mode.disk.sync_dir(parent_dir(&self.path)))
            .map_err(|e| failed("cannot swap in the compacted ledger", e))?;
        self.reopen()?;
        Ok(CompactReport {
            archived_to,
            kept_executions: kept,
            dropped_executions: before - kept,
            bytes_before,
            bytes_after,
        })
    }
}

/// The chained lines of `bodies` after `head`, one per line, and the new head; an error, and
/// nothing to write, when a line would be longer than a reader takes ([`MAX_LINE_BYTES`]).
fn seal_lines(
    head: (u64, ChainHash),
    bodies: Vec<LineBody>,
) -> Result<(String, (u64, ChainHash)), LedgerError> {
    let mut text = String::new();
    let (mut seq, mut prev) = head;
    for body in bodies {
        seq += 1;
        let line = ChainedLine::seal(seq, prev, body);
        prev = line.hash;
        let line = line.to_json_line();
        if line.len() > MAX_LINE_BYTES {
            return Err(storage(
                "a ledger line would be longer than a ledger line may be",
                format!(
                    "more than {} MiB; nothing of this write was recorded",
                    MAX_LINE_BYTES >> 20
                ),
            ));
        }
        text.push_str(&line);
        text.push('\n');
    }
    Ok((text, (seq, prev)))
}

/// Links the live file as its archive. A compaction killed between this link and its rename
/// leaves the archive name on the live file's own inode: that link is this one already, so it
/// is taken as it is (any other file of that name is an archive and is never replaced).
pub(super) fn link_archive(live: &Path, archive: &Path) -> io::Result<()> {
    match fs::hard_link(live, archive) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let (live_meta, archive_meta) = (fs::metadata(live)?, fs::metadata(archive)?);
            if live_meta.ino() == archive_meta.ino() && live_meta.dev() == archive_meta.dev() {
                Ok(())
            } else {
                Err(e)
            }
        }
        other => other,
    }
}

pub(super) fn send<T>(
    reply: Reply<T>,
    value: Result<T, LedgerError>,
    failed: Option<&LedgerError>,
) {
    let value = match failed {
        Some(error) => Err(storage(
            "the ledger write failed; nothing of this batch was recorded",
            error,
        )),
        None => value,
    };
    let _ = reply.send(value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_holder_is_named_and_the_wait_is_bounded() {
        let dir = std::env::temp_dir().join(format!("mrg-lock-unit-{}", ExecutionId::new().ulid()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger.jsonl");
        let holder = File::create(&path).unwrap();
        holder.lock().unwrap();
        let waiter = File::open(&path).unwrap();
        let started = Instant::now();
        let error = lock_within(&waiter, &path, Duration::from_millis(200))
            .unwrap_err()
            .to_string();
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_secs(2));
        if Path::new("/proc/locks").exists() {
            assert_eq!(lock_holder(&waiter), Some(std::process::id()));
            assert!(
                error.contains(&format!("pid {}", std::process::id())),
                "{error}"
            );
        }
        assert!(error.contains("200ms"), "{error}");
        holder.unlock().unwrap();
        lock_within(&waiter, &path, Duration::from_millis(200)).unwrap();
        fs::remove_dir_all(dir).unwrap();
    }
}
