//! The embedded durable ledger: [`FileLedger`].

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, Read, Seek, SeekFrom, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread,
};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::{
    Claim, Claimed, EventKind, ExecutionRecord, ExecutionState, Ledger, LedgerError, LedgerEvent,
    Timestamp,
    chain::{
        self, ChainHash, ChainProblem, ChainedLine, Checkpoint, LineBody, StoredResult,
        VerifyReport,
    },
    result_reference,
};
use crate::{
    Actor, ExecutionId, IntentScope, fingerprint::Fingerprint, fingerprint::FingerprintKey,
};

/// The most appends one group commit takes.
const MAX_BATCH: usize = 4096;

/// How long a group commit waits for concurrent callers to join it.
const LINGER: std::time::Duration = std::time::Duration::from_micros(150);

fn drain(ops: &mpsc::Receiver<Op>, batch: &mut Vec<Op>) {
    while batch.len() < MAX_BATCH {
        match ops.try_recv() {
            Ok(op) => batch.push(op),
            Err(_) => break,
        }
    }
}

/// Reads one line of the file (without its newline): `None` for a blank line (as
/// [`chain::verify`] skips them), the line when it follows `head`, else what is wrong with it.
fn read_line(bytes: &[u8], head: (u64, ChainHash)) -> Result<Option<ChainedLine>, ChainProblem> {
    let text = std::str::from_utf8(bytes).map_err(|e| ChainProblem::Unreadable {
        detail: e.to_string(),
    })?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let line = chain::parse_line(text).map_err(|detail| ChainProblem::Unreadable { detail })?;
    chain::check_follows(head, &line)?;
    Ok(Some(line))
}

/// Whether the bytes are a chain line at all, wherever it belongs.
fn is_chain_line(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok_and(|text| chain::parse_line(text).is_ok())
}

/// The embedded durable ledger: one append-only, hash-chained JSON Lines file.
///
/// - **Write-ahead.** An append returns only after its line is on disk (`fdatasync`): the guard
///   records `dispatched` before the request leaves, so a crash right after the send still
///   leaves the record.
/// - **Group commit.** One writer thread takes every pending append at once and pays one
///   `fdatasync` for all of them.
/// - **Shared by processes.** Every write happens under an exclusive lock on the file, after
///   reading what other processes appended since (so the chain never forks and a claim is
///   atomic across processes). A file replaced by compaction is noticed and reopened.
/// - **Crash recovery.** Reopening rebuilds the index from the file, checking every line
///   against the chain (`seq`, `prev`, `hash`). A torn tail (a crash mid-write: an incomplete
///   last line, or unreadable lines with no readable line after them) is cut away with a
///   warning, never taken as valid. Any other bad line (edited, reordered, unreadable in the
///   middle) makes opening fail and leaves the file as it is, for an operator to inspect. An execution left
///   `dispatched` by a process that is gone becomes `unknown`: never re-sent blindly, never
///   lost. Liveness comes from lock files in `<ledger>.owners/`, held by each live process
///   for the guard owners it serves (the operating system releases them when a process dies,
///   even by SIGKILL).
/// - **Tamper evidence.** Every line is chained (see [`chain`](super::chain)); [`FileLedger::verify`]
///   names the first bad `seq`.
/// - **Compaction.** [`FileLedger::compact`] archives the file and starts a new one with a
///   checkpoint that carries the archived head, followed by the lines of the executions still
///   retained: both files verify.
///
/// Unix only (file locks, `0600` key files).
///
/// # Clone
///
/// Clones share the file, its writer thread and its index.
#[derive(Clone)]
pub struct FileLedger {
    path: Arc<PathBuf>,
    ops: mpsc::Sender<Op>,
    owners: Arc<Owners>,
    // Declared last: dropped after `ops`, so the writer has no sender left and stops.
    _writer: Arc<WriterThread>,
}

/// Joins the writer thread when the last clone of the ledger is dropped, so that its owner
/// locks are released before the drop returns.
struct WriterThread(Option<thread::JoinHandle<()>>);

impl Drop for WriterThread {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            let _ = handle.join();
        }
    }
}

impl std::fmt::Debug for FileLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLedger")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

/// An answer held until the batch it belongs to is on disk (or failed).
type PendingReply = Box<dyn FnOnce(Option<&LedgerError>) + Send>;

enum Op {
    Claim(Box<Claim>, Reply<Claimed>),
    Append(LedgerEvent, Reply<ExecutionRecord>),
    StoreResult(ExecutionId, Bytes, Reply<String>),
    Get(ExecutionId, Reply<Option<ExecutionRecord>>),
    Events(ExecutionId, Reply<Vec<LedgerEvent>>),
    List(Reply<Vec<ExecutionRecord>>),
    LoadResult(String, Reply<Option<Bytes>>),
    Compact(Timestamp, Reply<CompactReport>),
}

/// What [`FileLedger::compact`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactReport {
    /// Where the previous file went.
    pub archived_to: PathBuf,
    /// Executions kept (still inside their retention).
    pub kept_executions: usize,
    /// Executions dropped.
    pub dropped_executions: usize,
}

fn storage(context: &str, error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(format!("{context}: {error}"))
}

impl FileLedger {
    /// Opens (or creates) the ledger at `path`, rebuilding the index and recovering from a
    /// crash as the [`FileLedger`] docs say.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let owners = Arc::new(Owners::new(&path)?);
        let mut writer = Writer::open(&path, owners.clone())?;
        writer.recover()?;
        let (ops, receiver) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("mcp-replay-guard-file-ledger".into())
            .spawn(move || writer.run(receiver))
            .map_err(|e| storage("cannot start the ledger writer thread", e))?;
        Ok(Self {
            path: Arc::new(path),
            ops,
            owners,
            _writer: Arc::new(WriterThread(Some(handle))),
        })
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fingerprint key kept beside the ledger (`<ledger>.key`, mode 0600), created on first
    /// use. Every process that opens the ledger gets the same key, so their fingerprints match.
    pub fn fingerprint_key(&self) -> Result<FingerprintKey, LedgerError> {
        key_beside(&self.path)
    }

    /// Verifies the whole chain of the file.
    pub fn verify(&self) -> Result<VerifyReport, LedgerError> {
        verify_file(&self.path)
    }

    /// Archives the file and starts a new one that keeps only the executions still inside
    /// their retention at `now` (see the [`FileLedger`] docs).
    pub async fn compact(&self, now: Timestamp) -> Result<CompactReport, LedgerError> {
        self.ask(|reply| Op::Compact(now, reply)).await
    }

    async fn ask<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.ops
            .send(op(reply))
            .map_err(|_| storage("the ledger writer stopped", "reopen the ledger"))?;
        answer
            .await
            .map_err(|_| storage("the ledger writer stopped", "reopen the ledger"))?
    }
}

/// Verifies a ledger file without opening it as a ledger.
pub fn verify_file(path: &Path) -> Result<VerifyReport, LedgerError> {
    let text =
        fs::read(path).map_err(|e| storage(&format!("cannot read {}", path.display()), e))?;
    let text = String::from_utf8_lossy(&text);
    Ok(chain::verify(text.split('\n')))
}

/// Reads or creates the 0600 key file beside a ledger.
fn key_beside(path: &Path) -> Result<FingerprintKey, LedgerError> {
    let key_path = sibling(path, "key");
    let read = |p: &Path| -> Result<FingerprintKey, LedgerError> {
        let text = fs::read_to_string(p)
            .map_err(|e| storage(&format!("cannot read the key {}", p.display()), e))?;
        let bytes = hex::decode(text.trim())
            .map_err(|e| storage(&format!("the key file {} is not hex", p.display()), e))?;
        FingerprintKey::from_bytes(&bytes)
            .map_err(|e| storage(&format!("the key file {}", p.display()), e))
    };
    if key_path.exists() {
        return read(&key_path);
    }
    let key =
        FingerprintKey::generate().map_err(|e| storage("cannot make a fingerprint key", e))?;
    // Write a private temporary file, then link it into place: if another process won the
    // race, its key is the one everybody uses.
    let tmp = sibling(path, &format!("key.{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| storage(&format!("cannot create {}", tmp.display()), e))?;
    file.write_all(hex::encode(key.expose_bytes()).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| storage(&format!("cannot write {}", tmp.display()), e))?;
    let linked = fs::hard_link(&tmp, &key_path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read(&key_path),
        Err(e) => Err(storage(&format!("cannot create {}", key_path.display()), e)),
    }
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

/// Liveness of guard owners across processes: each owner this process serves holds an
/// exclusive lock on `<ledger>.owners/<owner>.lock` for as long as the process lives.
struct Owners {
    dir: PathBuf,
    held: Mutex<HashMap<String, File>>,
}

impl Owners {
    fn new(ledger: &Path) -> Result<Self, LedgerError> {
        let dir = sibling(ledger, "owners");
        fs::create_dir_all(&dir)
            .map_err(|e| storage(&format!("cannot create {}", dir.display()), e))?;
        Ok(Self {
            dir,
            held: Mutex::default(),
        })
    }

    fn file(&self, owner: &str) -> PathBuf {
        let safe: String = owner
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(120)
            .collect();
        self.dir.join(format!("{safe}.lock"))
    }

    /// Marks `owner` as served by this process.
    fn hold(&self, owner: &str) -> Result<(), LedgerError> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.contains_key(owner) {
            return Ok(());
        }
        let path = self.file(owner);
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| storage(&format!("cannot create {}", path.display()), e))?;
            file.try_lock()
                .map_err(|e| storage(&format!("owner {owner} is held by another process"), e))?;
            // Another process may have pruned the file between our open and our lock: only a
            // lock on the file that is at the path counts.
            let ours = file
                .metadata()
                .map_err(|e| storage("cannot stat an owner file", e))?;
            let at_path = fs::metadata(&path).ok();
            if at_path.is_some_and(|m| m.ino() == ours.ino() && m.dev() == ours.dev()) {
                held.insert(owner.to_owned(), file);
                return Ok(());
            }
        }
    }

    /// Removes the lock files of owners whose process is gone, so that the directory does not
    /// grow with every run. A missing file reads as a dead owner, which it is.
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if let Ok(file) = File::open(&path)
                && file.try_lock().is_ok()
            {
                let _ = fs::remove_file(&path);
            }
        }
    }

    fn is_alive(&self, owner: &str) -> bool {
        let held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if held.contains_key(owner) {
            return true;
        }
        drop(held);
        let Ok(file) = File::open(self.file(owner)) else {
            return false;
        };
        match file.try_lock_shared() {
            Ok(()) => false, // nobody holds it: its process is gone
            Err(_) => true,
        }
    }
}

/// The in-memory index of the file, owned by the writer thread.
#[derive(Default)]
struct Index {
    executions: HashMap<ExecutionId, Stored>,
    intents: HashMap<(Actor, IntentScope, Fingerprint), ExecutionId>,
    results: HashMap<String, Bytes>,
}

struct Stored {
    record: ExecutionRecord,
    events: Vec<LedgerEvent>,
}

impl Index {
    fn apply(&mut self, event: &LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        if let EventKind::Accepted { .. } = event.kind {
            let record = ExecutionRecord::from_accepted(event)
                .ok_or(LedgerError::NotFound(event.execution_id))?;
            let key = (
                record.actor.clone(),
                record.intent_scope.clone(),
                record.fingerprint,
            );
            self.intents.insert(key, record.execution_id);
            self.executions.insert(
                record.execution_id,
                Stored {
                    record: record.clone(),
                    events: vec![event.clone()],
                },
            );
            return Ok(record);
        }
        let stored = self
            .executions
            .get_mut(&event.execution_id)
            .ok_or(LedgerError::NotFound(event.execution_id))?;
        stored.record.apply(event)?;
        stored.events.push(event.clone());
        Ok(stored.record.clone())
    }

    fn linkable(&self, claim: &Claim) -> Option<ExecutionRecord> {
        let key = (
            claim.actor.clone(),
            claim.intent_scope.clone(),
            claim.fingerprint,
        );
        let id = self.intents.get(&key)?;
        let stored = self.executions.get(id)?;
        stored
            .record
            .is_linkable(claim.at)
            .then(|| stored.record.clone())
    }

    fn purge_expired(&mut self, now: Timestamp) {
        let expired: Vec<ExecutionId> = self
            .executions
            .iter()
            .filter(|(_, s)| s.record.retain_until < now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(stored) = self.executions.remove(&id) {
                if let Some(reference) = &stored.record.result_reference {
                    self.results.remove(reference);
                }
                let r = &stored.record;
                let key = (r.actor.clone(), r.intent_scope.clone(), r.fingerprint);
                if self.intents.get(&key) == Some(&id) {
                    self.intents.remove(&key);
                }
            }
        }
    }
}

/// The writer thread: the only code that touches the file and the index.
struct Writer {
    path: PathBuf,
    file: File,
    /// Bytes of the file read into the index.
    offset: u64,
    head: (u64, ChainHash),
    index: Index,
    owners: Arc<Owners>,
    claims: u64,
}

/// How many claims pass between two purges of expired executions from the index.
const PURGE_EVERY: u64 = 1024;

impl Writer {
    fn open(path: &Path, owners: Arc<Owners>) -> Result<Self, LedgerError> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| storage(&format!("cannot open the ledger {}", path.display()), e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            offset: 0,
            head: (0, ChainHash::GENESIS),
            index: Index::default(),
            owners,
            claims: 0,
        })
    }

    /// Runs `f` holding the exclusive lock, after catching up with the file.
    fn locked<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        loop {
            self.reopen_if_replaced()?;
            self.file
                .lock()
                .map_err(|e| storage("cannot lock the ledger", e))?;
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
            *self = Self::open(&self.path.clone(), owners)?;
        }
        Ok(())
    }

    fn is_replaced(&self) -> Result<bool, LedgerError> {
        let current = self
            .file
            .metadata()
            .map_err(|e| storage("cannot stat the ledger", e))?;
        match fs::metadata(&self.path) {
            Ok(at_path) => Ok(current.ino() != at_path.ino() || current.dev() != at_path.dev()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(storage("cannot stat the ledger", e)),
        }
    }

    /// Reads the lines other processes appended, checking that each one follows the chain.
    ///
    /// Holding the exclusive lock, a torn tail (a writer died mid-line) is cut away: an
    /// incomplete last line, or unreadable lines that no readable line follows. Without the
    /// lock, an incomplete tail is just not read yet. Any other bad line (unreadable with
    /// readable lines after it, edited, out of order, not linked) is an error and the file is
    /// left as it is: cutting there would throw away acknowledged lines, and reading past it
    /// would build on a line nobody wrote.
    fn catch_up(&mut self, locked: bool) -> Result<(), LedgerError> {
        let len = self
            .file
            .metadata()
            .map_err(|e| storage("cannot stat the ledger", e))?
            .len();
        if len <= self.offset {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity((len - self.offset) as usize);
        self.file
            .seek(SeekFrom::Start(self.offset))
            .and_then(|_| (&self.file).take(len - self.offset).read_to_end(&mut bytes))
            .map_err(|e| storage("cannot read the ledger", e))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut consumed = 0;
        for piece in bytes[..complete].split_inclusive(|&b| b == b'\n') {
            match read_line(&piece[..piece.len() - 1], self.head) {
                Ok(None) => {}
                Ok(Some(line)) => self.take_line(line),
                Err(problem) => {
                    let at = self.offset + consumed as u64;
                    let after = &bytes[consumed + piece.len()..];
                    let torn = matches!(problem, ChainProblem::Unreadable { .. })
                        && !after.split(|&b| b == b'\n').any(is_chain_line);
                    if locked && torn {
                        tracing::warn!(path = %self.path.display(), offset = at, %problem, "cutting an unreadable ledger tail (a write torn by a crash)");
                        return self.truncate_at(at);
                    }
                    // The lines before it are in the index: do not read them again.
                    self.offset = at;
                    return Err(storage(
                        &format!(
                            "the ledger line at byte {at} (seq {}) {problem}",
                            self.head.0 + 1
                        ),
                        "the file is left as it is; `replay-guard audit verify` names the line",
                    ));
                }
            }
            consumed += piece.len();
        }
        self.offset += consumed as u64;
        if locked && complete < bytes.len() {
            tracing::warn!(path = %self.path.display(), bytes = bytes.len() - complete, "cutting a torn last ledger line (a crash mid-write)");
            return self.truncate_at(self.offset);
        }
        Ok(())
    }

    fn truncate_at(&mut self, offset: u64) -> Result<(), LedgerError> {
        self.file
            .set_len(offset)
            .and_then(|()| self.file.sync_all())
            .map_err(|e| storage("cannot cut the torn ledger tail", e))?;
        self.offset = offset;
        Ok(())
    }

    fn take_line(&mut self, line: ChainedLine) {
        self.head = (line.seq, line.hash);
        match line.body {
            LineBody::Checkpoint { .. } => {}
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

    /// Writes lines (already applied to the index) and syncs them.
    fn write(&mut self, bodies: Vec<LineBody>) -> Result<(), LedgerError> {
        if bodies.is_empty() {
            return Ok(());
        }
        let mut text = String::new();
        let (mut seq, mut prev) = self.head;
        for body in bodies {
            seq += 1;
            let line = ChainedLine::seal(seq, prev, body);
            prev = line.hash;
            text.push_str(&line.to_json_line());
            text.push('\n');
        }
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| storage("cannot write the ledger", e))?;
        self.offset += text.len() as u64;
        self.head = (seq, prev);
        Ok(())
    }

    /// On open: an execution left `dispatched` by an owner that is gone has an unknown outcome.
    fn recover(&mut self) -> Result<(), LedgerError> {
        self.locked(|w| {
            let orphans: Vec<ExecutionId> = w
                .index
                .executions
                .values()
                .filter(|s| s.record.state == ExecutionState::Dispatched)
                .filter(|s| !w.owners.is_alive(&s.record.owner))
                .map(|s| s.record.execution_id)
                .collect();
            let mut bodies = Vec::new();
            for id in orphans {
                let event = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::now(),
                    kind: EventKind::Unknown {
                        target_status: None,
                        attempt: None,
                        reason: "the process that dispatched it ended before its outcome was observed".into(),
                    },
                };
                w.index.apply(&event)?;
                tracing::warn!(execution_id = %id, "dispatched by a process that is gone: outcome unknown");
                bodies.push(LineBody::Event(event));
            }
            w.write(bodies)?;
            w.owners.prune();
            Ok(())
        })
    }

    fn run(mut self, ops: mpsc::Receiver<Op>) {
        let mut last_batch = 0;
        while let Ok(first) = ops.recv() {
            let mut batch = vec![first];
            drain(&ops, &mut batch);
            // Group commit: when callers are concurrent (the last batch had several), linger a
            // moment so that the ones being woken by the last fsync join this one. A lone
            // caller never waits.
            if last_batch > 1 && batch.len() < MAX_BATCH {
                thread::sleep(LINGER);
                drain(&ops, &mut batch);
            }
            last_batch = batch.len();
            self.serve(batch);
        }
    }

    fn serve(&mut self, batch: Vec<Op>) {
        let writes = batch.iter().any(|op| {
            matches!(
                op,
                Op::Claim(..) | Op::Append(..) | Op::StoreResult(..) | Op::Compact(..)
            )
        });
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
        let mut replies: Vec<PendingReply> = Vec::new();
        let outcome = self.locked(|w| {
            let mut bodies = Vec::new();
            for op in batch {
                match op {
                    Op::Claim(claim, reply) => {
                        w.claims += 1;
                        if w.claims % PURGE_EVERY == 0 {
                            // Expired executions leave the index; their lines stay until
                            // compaction.
                            w.index.purge_expired(claim.at);
                        }
                        let claimed = match w.index.linkable(&claim) {
                            Some(record) => Ok(Claimed::Existing(record)),
                            None => w.owners.hold(&claim.owner).and_then(|()| {
                                let event = claim.accepted_event(ExecutionId::new());
                                let record = w.index.apply(&event)?;
                                bodies.push(LineBody::Event(event));
                                Ok(Claimed::New(record))
                            }),
                        };
                        replies.push(Box::new(move |failed| send(reply, claimed, failed)));
                    }
                    Op::Append(event, reply) => {
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
                            .map_err(|e| storage("a result to keep is not JSON", e))
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
                    Op::Compact(now, reply) => {
                        // Whatever this batch appended goes first, into the archived file.
                        let written = w.write(std::mem::take(&mut bodies));
                        let report = written.and_then(|()| w.compact(now));
                        replies.push(Box::new(move |failed| send(reply, report, failed)));
                    }
                    read => w.answer_read(read, None),
                }
            }
            w.write(bodies)
        });
        if outcome.is_err() {
            // The index may hold what was not written: rebuild it from the file.
            let owners = self.owners.clone();
            match Self::open(&self.path.clone(), owners) {
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
                Ok(index.executions.get(&id).map(|s| s.record.clone())),
                failed,
            ),
            Op::Events(id, reply) => send(
                reply,
                Ok(index
                    .executions
                    .get(&id)
                    .map(|s| s.events.clone())
                    .unwrap_or_default()),
                failed,
            ),
            Op::List(reply) => {
                let mut records: Vec<_> = index
                    .executions
                    .values()
                    .map(|s| s.record.clone())
                    .collect();
                records.sort_by_key(|r| r.execution_id);
                send(reply, Ok(records), failed);
            }
            Op::LoadResult(reference, reply) => {
                send(reply, Ok(index.results.get(&reference).cloned()), failed)
            }
            Op::Claim(_, reply) => send(
                reply,
                Err(storage("internal", "a claim was answered as a read")),
                None,
            ),
            Op::Append(_, reply) => send(
                reply,
                Err(storage("internal", "an append was answered as a read")),
                None,
            ),
            Op::StoreResult(_, _, reply) => send(
                reply,
                Err(storage("internal", "a result was answered as a read")),
                None,
            ),
            Op::Compact(_, reply) => send(
                reply,
                Err(storage("internal", "a compaction was answered as a read")),
                None,
            ),
        }
    }

    /// Archives the file; the new one starts with a checkpoint carrying the archived head.
    fn compact(&mut self, now: Timestamp) -> Result<CompactReport, LedgerError> {
        let before = self.index.executions.len();
        self.index.purge_expired(now);
        let kept = self.index.executions.len();
        let mut bodies = vec![LineBody::Checkpoint {
            checkpoint: Checkpoint {
                compacted_through: self.head.0,
                removed: self.head.0,
            },
        }];
        let mut executions: Vec<&Stored> = self.index.executions.values().collect();
        executions.sort_by_key(|s| s.record.execution_id);
        for stored in executions {
            for event in &stored.events {
                bodies.push(LineBody::Event(event.clone()));
            }
            if let Some(reference) = &stored.record.result_reference
                && let Some(bytes) = self.index.results.get(reference)
                && let Ok(result) = serde_json::from_slice(bytes)
            {
                bodies.push(LineBody::Result(StoredResult {
                    result_of: stored.record.execution_id,
                    reference: reference.clone(),
                    result,
                }));
            }
        }
        let archived_to = sibling(&self.path, &format!("{}.archive", self.head.0));
        let next = sibling(&self.path, "compacting");
        let mut text = String::new();
        let (mut seq, mut prev) = self.head;
        for body in bodies {
            seq += 1;
            let line = ChainedLine::seal(seq, prev, body);
            prev = line.hash;
            text.push_str(&line.to_json_line());
            text.push('\n');
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&next)
            .map_err(|e| storage("cannot create the compacted ledger", e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| storage("cannot write the compacted ledger", e))?;
        // Keep the old chain, then put the new file in place (the lock on the old inode is
        // still held, so no other process appends in between).
        fs::hard_link(&self.path, &archived_to)
            .and_then(|()| fs::rename(&next, &self.path))
            .map_err(|e| storage("cannot swap in the compacted ledger", e))?;
        let owners = self.owners.clone();
        let _ = self.file.unlock();
        *self = Self::open(&self.path.clone(), owners)?;
        self.file
            .lock()
            .map_err(|e| storage("cannot lock the ledger", e))?;
        self.catch_up(true)?;
        Ok(CompactReport {
            archived_to,
            kept_executions: kept,
            dropped_executions: before - kept,
        })
    }
}

fn send<T>(reply: Reply<T>, value: Result<T, LedgerError>, failed: Option<&LedgerError>) {
    let value = match failed {
        Some(error) => Err(storage(
            "the ledger write failed; nothing of this batch was recorded",
            error,
        )),
        None => value,
    };
    let _ = reply.send(value);
}

#[async_trait]
impl Ledger for FileLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        self.ask(|reply| Op::Claim(Box::new(claim), reply)).await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.ask(|reply| Op::Append(event, reply)).await
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        self.ask(|reply| Op::Get(execution_id, reply)).await
    }

    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        self.ask(|reply| Op::Events(execution_id, reply)).await
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        self.ask(Op::List).await
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        self.ask(|reply| Op::StoreResult(execution_id, result, reply))
            .await
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        let reference = reference.to_owned();
        self.ask(|reply| Op::LoadResult(reference, reply)).await
    }

    async fn is_owner_alive(&self, owner: &str) -> bool {
        self.owners.is_alive(owner)
    }
}
