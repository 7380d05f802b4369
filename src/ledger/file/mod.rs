//! The embedded durable ledger: [`FileLedger`].

use std::{
    collections::HashMap,
    fs::{self, File, OpenOptions},
    io::{self, Read, Seek, SeekFrom, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    thread,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::oneshot;

use super::{
    Claim, Claimed, Dispatch, EventKind, ExecutionRecord, Ledger, LedgerError, LedgerEvent,
    Timestamp,
    chain::{
        self, ChainHash, ChainProblem, ChainedLine, Checkpoint, KeyBinding, LineBody, StoredResult,
        VerifyReport,
    },
    compact::Compact,
    index::{Entry, IndexOf},
    result_reference,
};
use crate::{ExecutionId, fingerprint::FingerprintKey};

mod disk;
mod key;
mod lines;
mod owners;
mod writer;

#[cfg(feature = "simulation")]
pub use disk::Disk;
#[cfg(not(feature = "simulation"))]
use disk::Disk;
use disk::OsDisk;
use key::{check_key, create_key, key_id, read_key, short_id};
use lines::fits_in_a_line;
pub(super) use lines::{
    Piece, foreign_detail, next_line, not_a_ledger, regular_file, starts_like_a_line,
};
use owners::Owners;
use writer::{Mode, Writer};

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
///   against the chain (`seq`, `prev`, `hash`). A torn tail (a crash mid-write) can only be
///   bytes after the last newline: those, when they can be the start of a line, are cut
///   away with a warning, never taken as valid. A complete line (one that ends in a newline)
///   that does not read or does not verify makes opening fail with its `seq` and the reason,
///   and nothing is written: it may be an acknowledged `dispatched`, and cutting it would
///   send the call again. An execution left `dispatched` by a process that is gone becomes
///   `unknown`: never re-sent blindly, never lost. Liveness comes from lock files in
///   `<ledger>.owners/`, held by each live process for the guard owners it serves (the
///   operating system releases them when a process dies, even by SIGKILL).
/// - **Not a ledger, or a newer one.** A file that is not empty and does not start with a
///   ledger line (notes, a policy file, anything) is refused untouched, with what it looks
///   like; so is a line of a newer format (an event kind this build does not know).
/// - **A bounded wait.** Writes wait at most the lock timeout
///   ([`FileLedger::DEFAULT_LOCK_TIMEOUT`], or [`FileLedger::open_with_lock_timeout`]) for a process that
///   holds the file's lock, then fail naming its pid (from `/proc/locks` on Linux).
/// - **Read-only.** [`FileLedger::open_read_only`] reads without writing anything: no
///   recovery line, no cut tail, no pruned owner file, no lock; it works on a file it cannot
///   write.
/// - **Its key.** [`FileLedger::fingerprint_key`] keeps the fingerprint key beside the file
///   and records the key's id in the chain; a ledger that names a key (or holds lines) is
///   never given another one.
/// - **Tamper evidence.** Every line is chained (see [`chain`](super::chain)); [`FileLedger::verify`]
///   names the first bad `seq`.
/// - **Compaction.** [`FileLedger::compact`] archives the file and starts a new one with a
///   checkpoint that carries the archived head, followed by the lines of the executions still
///   retained: both files verify. It runs under the lock every write takes, so processes that
///   share the file compact one at a time ([`FileLedger::compact_if_larger`] lets those that
///   find it compacted already do nothing).
/// - **Memory.** The index keeps each execution inside its retention in the memory ledger's
///   compact form: about 300 bytes with 1,000,000 retained (names shared between executions
///   counted once, the events after `accepted` in a few bytes each), plus its kept result.
///   Every event is given back exactly as it was written, so nothing is read from the file
///   again.
///
/// Unix only (file locks, `0600` key files).
///
/// # Clone
///
/// Clones share the file, its writer thread and its index.
#[derive(Clone)]
pub struct FileLedger {
    path: Arc<PathBuf>,
    read_only: bool,
    /// Where the key file's creation is made durable (the writer's disk).
    disk: Arc<dyn Disk>,
    serve: Serve,
    owners: Arc<Owners>,
}

/// How operations reach the writer.
#[derive(Clone)]
enum Serve {
    /// The writer thread, which commits concurrent appends as one group.
    Thread {
        ops: mpsc::Sender<Op>,
        // Declared last: dropped after `ops`, so the writer has no sender left and stops.
        _writer: Arc<WriterThread>,
    },
    /// On the caller's thread, one operation at a time: no thread, no linger, so a
    /// simulation that drives the ledger is the same schedule every time it runs.
    #[cfg(feature = "simulation")]
    Inline(Arc<Mutex<Writer>>),
    /// A task on the caller's tokio runtime that batches as the writer thread does (group
    /// commit, linger on the runtime's clock): a simulation's schedule on one thread stays
    /// the same every time it runs. The operations that answer a thread that is not async
    /// are served inline, under the same lock.
    #[cfg(feature = "simulation")]
    Task {
        ops: tokio::sync::mpsc::UnboundedSender<Op>,
        writer: Arc<Mutex<Writer>>,
    },
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

/// A reply waited for by a thread that is not async ([`FileLedger::fingerprint_key`]).
type SyncReply<T> = mpsc::Sender<Result<T, LedgerError>>;

/// An answer held until the batch it belongs to is on disk (or failed).
type PendingReply = Box<dyn FnOnce(Option<&LedgerError>) + Send>;

enum Op {
    /// A claim, with the first attempt's dispatch to record if it creates the execution.
    Claim(Box<(Claim, Option<Dispatch>)>, Reply<Claimed>),
    Append(LedgerEvent, Flush, Reply<ExecutionRecord>),
    /// `completed` and the result it keeps, as one write.
    Complete(LedgerEvent, Option<Bytes>, Reply<ExecutionRecord>),
    StoreResult(ExecutionId, Bytes, Reply<String>),
    Get(ExecutionId, Reply<Option<ExecutionRecord>>),
    Events(ExecutionId, Reply<Vec<LedgerEvent>>),
    List(Reply<Vec<ExecutionRecord>>),
    LoadResult(String, Reply<Option<Bytes>>),
    /// A compaction at a time, if the file (read to its end under the lock) is larger than
    /// the bytes given.
    Compact(Timestamp, Option<u64>, Reply<Option<CompactReport>>),
    /// The key id the ledger names, and whether the chain holds any line.
    KeyState(SyncReply<(Option<String>, bool)>),
    /// Binds the ledger to a key id (records it if it names none), or refuses another one.
    BindKey(String, SyncReply<()>),
}

impl Op {
    /// Whether a thread that is not async waits for the answer.
    #[cfg(feature = "simulation")]
    fn answers_a_thread(&self) -> bool {
        matches!(self, Op::KeyState(..) | Op::BindKey(..))
    }

    /// Whether the operation writes to the file (else it only reads).
    fn writes(&self) -> bool {
        matches!(
            self,
            Op::Claim(..)
                | Op::Append(..)
                | Op::Complete(..)
                | Op::StoreResult(..)
                | Op::Compact(..)
                | Op::BindKey(..)
        )
    }
}

/// When an append's line must be on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flush {
    /// Before the append is acknowledged.
    Now,
    /// With the next sync: the next write that syncs (whichever process makes it: they
    /// share the file), or when the kernel writes its pages back on its own. Until then only
    /// a power loss can lose it; no sync of its own, not even when the ledger is dropped (a
    /// process that makes one call and exits pays two `fdatasync`s, not three).
    WithNext,
}

/// What [`FileLedger::compact`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactReport {
    /// Where the previous file went.
    pub archived_to: PathBuf,
    /// Executions kept (still inside their retention).
    pub kept_executions: usize,
    /// Executions dropped.
    pub dropped_executions: usize,
    /// The file's length before (what the archive holds).
    pub bytes_before: u64,
    /// The new file's length as compaction wrote it (before any later append).
    pub bytes_after: u64,
}

/// A storage failure described by `context` and `error`, with no error under it (a
/// statement of the ledger's own, or a failure already told).
fn storage(context: &str, error: impl std::fmt::Display) -> LedgerError {
    LedgerError::storage(format!("{context}: {error}"))
}

/// A storage failure caused by `error` (I/O, JSON), which stays its source.
fn failed(context: &str, error: impl std::error::Error + Send + Sync + 'static) -> LedgerError {
    LedgerError::caused(format!("{context}: {error}"), error)
}

impl FileLedger {
    /// How long [`open`](Self::open) (and every write through it) waits for another process
    /// to release the ledger's lock.
    pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);

    /// Opens (or creates) the ledger at `path`, rebuilding the index and recovering from a
    /// crash as the [`FileLedger`] docs say. Writes wait at most [`Self::DEFAULT_LOCK_TIMEOUT`] for
    /// another process's lock.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Self::open_with_lock_timeout(path, Self::DEFAULT_LOCK_TIMEOUT)
    }

    /// [`open`](Self::open), waiting at most `lock_timeout` (on open, and on every write) for
    /// another process that holds the ledger's lock; past it the operation fails, naming that
    /// process, and nothing is recorded.
    pub fn open_with_lock_timeout(
        path: impl AsRef<Path>,
        lock_timeout: Duration,
    ) -> Result<Self, LedgerError> {
        Self::start(
            path.as_ref(),
            Mode::writing(Arc::new(OsDisk), lock_timeout),
            Self::threaded,
        )
    }

    /// Opens (or creates) the ledger at `path` as [`open`](Self::open) does, writing through
    /// `disk`, with every operation served on the caller's thread instead of a writer
    /// thread (feature `simulation`: for the deterministic simulator, whose disk can crash
    /// between any two writes and whose schedule must not depend on a thread).
    #[cfg(feature = "simulation")]
    pub fn open_on(path: impl AsRef<Path>, disk: Arc<dyn Disk>) -> Result<Self, LedgerError> {
        Self::start(
            path.as_ref(),
            Mode::writing(disk, Self::DEFAULT_LOCK_TIMEOUT),
            |writer| Ok(Serve::Inline(Arc::new(Mutex::new(writer)))),
        )
    }

    /// Opens (or creates) the ledger at `path` as [`open_on`](Self::open_on) does, with
    /// operations served in batches by a task on the current tokio runtime, the way the
    /// writer thread serves them: concurrent callers share one batch and its one sync, and a
    /// batch after a batch of several lingers (on the runtime's clock) for the callers woken
    /// by the last sync (feature `simulation`: the simulator runs the group commit that ships,
    /// on its single-threaded runtime). The task ends once every clone of the ledger is
    /// dropped.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    #[cfg(feature = "simulation")]
    pub fn open_batched_on(
        path: impl AsRef<Path>,
        disk: Arc<dyn Disk>,
    ) -> Result<Self, LedgerError> {
        Self::start(
            path.as_ref(),
            Mode::writing(disk, Self::DEFAULT_LOCK_TIMEOUT),
            |writer| {
                let writer = Arc::new(Mutex::new(writer));
                let (ops, receiver) = tokio::sync::mpsc::unbounded_channel();
                tokio::spawn(writer::run_on_task(writer.clone(), receiver));
                Ok(Serve::Task { ops, writer })
            },
        )
    }

    /// Opens an existing ledger to read it, writing nothing: no recovery line (an execution
    /// left `dispatched` by a process that is gone reads as `dispatched`), no cut tail (a
    /// torn last line is not read), no pruned owner file, and no lock is taken. It works on
    /// a file (and a directory) it cannot write. Writes through it fail.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Self::start(
            path.as_ref(),
            Mode {
                read_only: true,
                lock_timeout: Self::DEFAULT_LOCK_TIMEOUT,
                disk: Arc::new(OsDisk),
            },
            Self::threaded,
        )
    }

    fn start(
        path: &Path,
        mode: Mode,
        serve: impl FnOnce(Writer) -> Result<Serve, LedgerError>,
    ) -> Result<Self, LedgerError> {
        let path = path.to_path_buf();
        let owners = Arc::new(Owners::new(&path));
        let read_only = mode.read_only;
        let disk = mode.disk.clone();
        let mut writer = Writer::open(&path, owners.clone(), mode)?;
        if read_only {
            writer.catch_up(false)?;
        } else {
            writer.recover()?;
        }
        Ok(Self {
            path: Arc::new(path),
            read_only,
            disk,
            serve: serve(writer)?,
            owners,
        })
    }

    /// The writer on a thread of its own.
    fn threaded(writer: Writer) -> Result<Serve, LedgerError> {
        let (ops, receiver) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("mcp-replay-guard-file-ledger".into())
            .spawn(move || writer.run(receiver))
            .map_err(|e| failed("cannot start the ledger writer thread", e))?;
        Ok(Serve::Thread {
            ops,
            _writer: Arc::new(WriterThread(Some(handle))),
        })
    }

    /// Hands `op` to the writer (which answers through the reply inside it).
    fn submit(&self, op: Op) -> Result<(), LedgerError> {
        match &self.serve {
            Serve::Thread { ops, .. } => ops
                .send(op)
                .map_err(|_| storage("the ledger writer stopped", "reopen the ledger")),
            #[cfg(feature = "simulation")]
            Serve::Task { ops, .. } if !op.answers_a_thread() => ops
                .send(op)
                .map_err(|_| storage("the ledger writer stopped", "reopen the ledger")),
            #[cfg(feature = "simulation")]
            Serve::Inline(writer) | Serve::Task { writer, .. } => {
                writer
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .serve(vec![op]);
                Ok(())
            }
        }
    }

    /// Whether the ledger was opened with [`open_read_only`](Self::open_read_only).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn writable(&self) -> Result<(), LedgerError> {
        if self.read_only {
            return Err(storage(
                &format!("the ledger {} was opened read-only", self.path.display()),
                "open it with FileLedger::open to write",
            ));
        }
        Ok(())
    }

    /// The ledger file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fingerprint key kept beside the ledger (`<ledger>.key`, mode 0600). Every process
    /// that opens the ledger gets the same key, so their fingerprints match.
    ///
    /// # Which key
    ///
    /// The ledger records the id of its key (a keyed digest, never the key) in its chain the
    /// first time a key is bound to it, and compaction carries the id over. The key file is
    /// created only for a ledger that holds no line yet. A ledger that names a key, or holds
    /// lines, whose key file is missing is refused with an error that says so: a new key
    /// would recognise none of its intents, and a call held for review would be sent again.
    /// A key file whose key is not the one the ledger names is refused the same way. A ledger
    /// that holds lines but names no key (written before key ids, or through a key of the
    /// caller's own) is bound to the key file it has.
    ///
    /// Blocks the calling thread until the ledger's writer answers (under contention, up to
    /// the lock timeout): call it once, at startup.
    pub fn fingerprint_key(&self) -> Result<FingerprintKey, LedgerError> {
        let key_path = sibling(&self.path, "key");
        // The state first, then the file: a key file is always in place before its id is
        // recorded, so a racing process's binding is never taken for a missing key.
        let (bound, holds_lines) = self.ask_blocking(Op::KeyState)?;
        let key = match read_key(&key_path)? {
            Some(key) => key,
            None if bound.is_some() || holds_lines => {
                let named = bound.as_deref().map_or_else(
                    || "this ledger already holds lines fingerprinted with a key".to_owned(),
                    |id| {
                        format!(
                            "this ledger's records were fingerprinted with key {}",
                            short_id(id)
                        )
                    },
                );
                return Err(LedgerError::storage(format!(
                    "the fingerprint key file {} is missing, and {named}: restore that file (it \
                     was beside the ledger, mode 0600); a new key would recognise none of the \
                     ledger's intents, so none is made",
                    key_path.display()
                )));
            }
            None if self.read_only => {
                return Err(LedgerError::storage(format!(
                    "the fingerprint key file {} is missing (a read-only ledger makes none)",
                    key_path.display()
                )));
            }
            None => create_key(&self.path, &key_path, self.disk.as_ref())?,
        };
        self.bind_fingerprint_key(&key)
            .map_err(|error| match error {
                LedgerError::Storage(storage) => {
                    LedgerError::Storage(storage.map_message(|message| {
                        format!("{message} (the key file is {})", key_path.display())
                    }))
                }
                other => other,
            })?;
        Ok(key)
    }

    /// Binds the ledger to `key`: records the key's id in the chain if the ledger names none
    /// yet, and fails if it names another key. A library user who passes a
    /// [`FingerprintKey`] of their own to the guard (instead of
    /// [`fingerprint_key`](Self::fingerprint_key)) calls this once after opening to have the
    /// same protection: without it the ledger cannot tell which key its records were made
    /// with. On a read-only ledger it only checks.
    pub fn bind_fingerprint_key(&self, key: &FingerprintKey) -> Result<(), LedgerError> {
        let id = key_id(key);
        if self.read_only {
            let (bound, _) = self.ask_blocking(Op::KeyState)?;
            return check_key(bound.as_deref(), &id);
        }
        self.ask_blocking(|reply| Op::BindKey(id, reply))
    }

    fn ask_blocking<T>(&self, op: impl FnOnce(SyncReply<T>) -> Op) -> Result<T, LedgerError> {
        let (reply, answer) = mpsc::channel();
        self.submit(op(reply))?;
        answer
            .recv()
            .map_err(|_| storage("the ledger writer stopped", "reopen the ledger"))?
    }

    /// Verifies the whole chain of the file.
    pub fn verify(&self) -> Result<VerifyReport, LedgerError> {
        verify_file(&self.path)
    }

    /// Archives the file and starts a new one that keeps only the executions still inside
    /// their retention at `now` (see the [`FileLedger`] docs).
    pub async fn compact(&self, now: Timestamp) -> Result<CompactReport, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Compact(now, None, reply))
            .await?
            .ok_or_else(|| storage("internal", "an unconditional compaction did not run"))
    }

    /// [`compact`](Self::compact), if the file is longer than `bytes` once this process holds
    /// its lock and has read it to its end; `None` when it is not. Processes that share the
    /// file take its lock one at a time, so of several that find it too long at once, the
    /// first compacts and the others find it short again and do nothing.
    pub async fn compact_if_larger(
        &self,
        now: Timestamp,
        bytes: u64,
    ) -> Result<Option<CompactReport>, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Compact(now, Some(bytes), reply)).await
    }

    async fn ask<T>(&self, op: impl FnOnce(Reply<T>) -> Op) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.submit(op(reply))?;
        answer
            .await
            .map_err(|_| storage("the ledger writer stopped", "reopen the ledger"))?
    }
}

/// Verifies a ledger file without opening it as a ledger, with the archives its checkpoints
/// name (see [`verify_file_anchored`](super::verify_file_anchored)).
pub fn verify_file(path: &Path) -> Result<VerifyReport, LedgerError> {
    super::verify::verify_file_anchored(path, None)
}

/// `<path>.<suffix>`: a file that belongs to the ledger at `path` (its key, owners directory,
/// archives).
pub(super) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    path.with_file_name(name)
}

#[async_trait]
impl Ledger for FileLedger {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Claim(Box::new((claim, None)), reply))
            .await
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Claim(Box::new((claim, Some(dispatch))), reply))
            .await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Append(event, Flush::Now, reply)).await
    }

    async fn append_unsynced(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Append(event, Flush::WithNext, reply))
            .await
    }

    async fn complete(
        &self,
        event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        self.writable()?;
        self.ask(|reply| Op::Complete(event, result, reply)).await
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
        self.writable()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::{
        ExecutionState, RetryClass,
        fixtures::{claim, dispatched, event_at},
    };

    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mrg-{test}-{}", ExecutionId::new().ulid()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The orphan rule of every ledger ([`crate::execution::orphan_unknown`]), on open.
    #[tokio::test]
    async fn a_dispatched_execution_whose_owner_is_gone_reads_unknown_after_reopen() {
        let dir = temp_dir("orphan-unit");
        let path = dir.join("ledger.jsonl");
        let ledger = FileLedger::open(&path).unwrap();
        let claimed = ledger
            .claim(claim(RetryClass::Idempotent, "guard:file-one"))
            .await
            .unwrap();
        let id = claimed.record().execution_id;
        ledger
            .append(event_at(id, 1, dispatched(id, 1, Some("guard:file-one"))))
            .await
            .unwrap();
        drop(ledger);
        let reopened = FileLedger::open(&path).unwrap();
        let record = reopened.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, ExecutionState::Unknown);
        assert_eq!(
            record.reason.as_deref(),
            Some(crate::execution::ORPHAN_REASON)
        );
        drop(reopened);
        fs::remove_dir_all(dir).unwrap();
    }

    /// After the clock stepped back, a newer execution of an intent has the smaller ID (an
    /// ID's time is the clock's). A compaction wrote executions by ID, so the reopened file
    /// named the older one the intent's latest, and a claim passed by the newer one, still
    /// unsettled, to start another (found by the simulator: a second `deploy`).
    #[cfg(feature = "simulation")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_compaction_after_the_clock_stepped_back_keeps_the_newer_execution_the_latest() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NOW: AtomicU64 = AtomicU64::new(1_784_678_410_000);
        fn clock() -> Timestamp {
            Timestamp::from_millis(NOW.load(Ordering::SeqCst))
        }
        crate::simulation::set_clock(clock);
        crate::simulation::seed_ids(7);
        let dir = temp_dir("compaction-clock");
        let path = dir.join("ledger.jsonl");
        let ledger = FileLedger::open_on(&path, Arc::new(disk::OsDisk)).unwrap();
        let ask = || Claim {
            at: Timestamp::now(),
            ..claim(RetryClass::Irreversible, "guard:one")
        };
        let older = ledger.claim(ask()).await.unwrap().record().execution_id;
        let failed = EventKind::Failed {
            target_status: Some(503),
            reason: "refused".into(),
        };
        for kind in [dispatched(older, 1, Some("guard:one")), failed] {
            let at = Timestamp::now().as_millis();
            ledger.append(event_at(older, at, kind)).await.unwrap();
        }
        NOW.fetch_sub(5_000, Ordering::SeqCst);
        let newer = ledger.claim(ask()).await.unwrap();
        assert!(
            matches!(newer, Claimed::New(_)),
            "a failed execution is settled"
        );
        let newer = newer.record().execution_id;
        assert!(
            newer < older,
            "the clock stepped back: the newer ID is the smaller"
        );
        let unknown = EventKind::Unknown {
            target_status: None,
            attempt: Some(1),
            reason: "the answer was lost".into(),
        };
        for kind in [dispatched(newer, 1, Some("guard:one")), unknown] {
            let at = Timestamp::now().as_millis();
            ledger.append(event_at(newer, at, kind)).await.unwrap();
        }
        ledger.compact(Timestamp::now()).await.unwrap();
        drop(ledger);
        let reopened = FileLedger::open_on(&path, Arc::new(disk::OsDisk)).unwrap();
        let again = reopened.claim(ask()).await.unwrap();
        crate::simulation::clear_clock();
        assert!(
            matches!(&again, Claimed::Existing(r) if r.execution_id == newer),
            "the unknown newer execution holds the intent: {again:?}"
        );
        drop(reopened);
        fs::remove_dir_all(dir).unwrap();
    }

    /// A process that compacted the file opens the new one and waits for its lock; another
    /// process may take that lock first and compact the new file again. The lock of a file
    /// no longer at the path guards nothing: a write there goes to the other's archive,
    /// acknowledged and missing from the ledger, and the chain forks (found by two `stdio`
    /// wrappers compacting one file under traffic: the rest of one's batch was lost).
    #[cfg(feature = "simulation")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_after_a_compaction_goes_to_the_file_another_process_compacted_it_into() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        /// The operating system's disk; at the second directory sync once armed (the one of
        /// opening the new file, after the rename), another process compacts the file.
        struct Racing {
            path: PathBuf,
            since_armed: AtomicUsize,
        }
        impl Disk for Racing {
            fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
                disk::OsDisk.write(file, bytes)
            }
            fn sync(&self, file: &File) -> io::Result<()> {
                disk::OsDisk.sync(file)
            }
            fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
                disk::OsDisk.truncate(file, len)
            }
            fn sync_dir(&self, dir: &Path) -> io::Result<()> {
                disk::OsDisk.sync_dir(dir)?;
                if self.since_armed.fetch_add(1, Ordering::SeqCst) == 1 {
                    let path = self.path.clone();
                    std::thread::spawn(move || {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .unwrap();
                        runtime.block_on(async {
                            let other = FileLedger::open(&path).unwrap();
                            other.compact(Timestamp::now()).await.unwrap();
                        });
                    })
                    .join()
                    .unwrap();
                }
                Ok(())
            }
        }

        let dir = temp_dir("compaction-race");
        let path = dir.join("ledger.jsonl");
        let disk = Arc::new(Racing {
            path: path.clone(),
            since_armed: AtomicUsize::new(usize::MAX / 2),
        });
        let ledger = FileLedger::open_batched_on(&path, disk.clone()).unwrap();
        let id = ledger
            .claim(claim(RetryClass::Idempotent, "guard:racing"))
            .await
            .unwrap()
            .record()
            .execution_id;
        let now = || Timestamp::now().as_millis();
        let sent = event_at(id, now(), dispatched(id, 1, Some("guard:racing")));
        ledger.append(sent).await.unwrap();
        disk.since_armed.store(0, Ordering::SeqCst);
        let completed = EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        };
        // One batch: the compaction, then an append.
        let (compacted, appended) = tokio::join!(
            ledger.compact(Timestamp::now()),
            ledger.append(event_at(id, now(), completed))
        );
        compacted.unwrap();
        appended.unwrap();
        drop(ledger);
        let report = verify_file(&path).unwrap();
        assert!(report.is_ok(), "{report}");
        let reopened = FileLedger::open_read_only(&path).unwrap();
        let record = reopened.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, ExecutionState::Completed);
        drop(reopened);
        fs::remove_dir_all(dir).unwrap();
    }

    /// I/O and JSON failures keep their error as the source.
    #[tokio::test]
    async fn io_and_json_failures_keep_their_source() {
        let dir = temp_dir("source-unit");
        let missing = dir.join("no-such-dir").join("ledger.jsonl");
        let error = FileLedger::open(&missing).unwrap_err();
        let source = std::error::Error::source(&error).expect("a source");
        assert!(source.downcast_ref::<io::Error>().is_some(), "{source:?}");

        let ledger = FileLedger::open(dir.join("ledger.jsonl")).unwrap();
        let error = ledger
            .store_result(ExecutionId::new(), Bytes::from_static(b"not json"))
            .await
            .unwrap_err();
        let source = std::error::Error::source(&error).expect("a source");
        assert!(
            source.downcast_ref::<serde_json::Error>().is_some(),
            "{source:?}"
        );
        drop(ledger);
        fs::remove_dir_all(dir).unwrap();
    }
}
