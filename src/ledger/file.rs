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
    Claim, Claimed, EventKind, ExecutionRecord, Ledger, LedgerError, LedgerEvent, Timestamp,
    chain::{
        self, ChainHash, ChainProblem, ChainedLine, Checkpoint, KeyBinding, LineBody, StoredResult,
        VerifyReport,
    },
    index::{Index, Stored},
    result_reference,
};
use crate::{ExecutionId, fingerprint::FingerprintKey};

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
    let line = chain::read(text)?;
    chain::check_follows(head, &line)?;
    Ok(Some(line))
}

/// How every line of the chain starts (`seq` is its first field).
const LINE_START: &[u8] = br#"{"seq":"#;

/// Whether bytes after the last newline can be an append torn by a crash: a prefix of a
/// chain line (every one starts with [`LINE_START`]), possibly followed by the zeros a file
/// system leaves in blocks it had not written, or blank space.
fn could_be_torn(tail: &[u8]) -> bool {
    let end = tail.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let tail = &tail[..end];
    // Blank space is skipped by every reader (`str::trim`), and loses nothing when cut.
    let blank = std::str::from_utf8(tail).is_ok_and(|t| t.trim().is_empty());
    let tail = tail.trim_ascii_start();
    blank || tail.starts_with(LINE_START) || LINE_START.starts_with(tail)
}

/// What a file that is not a ledger looks like, for the error that refuses it (never its
/// content: it may be anything, secrets included).
fn looks_like(bytes: &[u8]) -> &'static str {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return "binary data (not UTF-8 text)";
    };
    if text.contains('\0') {
        return "binary data";
    }
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(_) => "JSON, but not ledger lines (no `seq`, `prev` and `hash`)",
        Err(_) => "text, not JSON lines",
    }
}

/// Whether a line is a chain line this build cannot read because a newer one wrote it: it
/// has `seq`, `prev` and `hash`, and an event kind (or a body) this build does not know.
/// Returns what is new about it.
fn newer_format(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let serde_json::Value::Object(mut map) = serde_json::from_str(text).ok()? else {
        return None;
    };
    let chained = map.get("seq").is_some_and(serde_json::Value::is_u64)
        && map.get("prev").is_some_and(serde_json::Value::is_string)
        && map.get("hash").is_some_and(serde_json::Value::is_string);
    if !chained {
        return None;
    }
    for field in ["seq", "prev", "hash"] {
        map.remove(field);
    }
    if let Some(kind) = map.get("event").and_then(serde_json::Value::as_str) {
        let kind = kind.to_owned();
        return match serde_json::from_value::<LedgerEvent>(serde_json::Value::Object(map)) {
            Err(e) if e.to_string().contains("unknown variant") => {
                Some(format!("event `{kind}`, unknown to this build"))
            }
            _ => None,
        };
    }
    let known = ["checkpoint", "fingerprint_key", "result_of", "execution_id"];
    if map.keys().any(|k| known.contains(&k.as_str())) {
        return None;
    }
    let mut fields: Vec<&str> = map.keys().map(String::as_str).collect();
    fields.truncate(5);
    Some(format!("fields {fields:?}, unknown to this build"))
}

/// How a ledger was opened; the writer thread keeps it across reopens.
#[derive(Debug, Clone, Copy)]
struct Mode {
    read_only: bool,
    lock_timeout: Duration,
}

/// Takes the exclusive lock on the ledger, waiting at most `timeout` for another process to
/// release it. `flock(2)` has no timed wait, so this polls with a short backoff.
fn lock_within(file: &File, path: &Path, timeout: Duration) -> Result<(), LedgerError> {
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
fn lock_holder(file: &File) -> Option<u32> {
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

/// The id a ledger records for its fingerprint key: HMAC-SHA256 under the key of a fixed
/// label. It names the key without revealing it.
fn key_id(key: &FingerprintKey) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key.expose_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(b"mcp-replay-guard key id");
    format!("hmac-sha256:{}", hex::encode(mac.finalize().into_bytes()))
}

/// The first 16 hex digits of a key id, enough to tell two keys apart in a message.
fn short_id(id: &str) -> &str {
    let end = id.len().min("hmac-sha256:".len() + 16);
    &id[..end]
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
    read_only: bool,
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

/// A reply waited for by a thread that is not async ([`FileLedger::fingerprint_key`]).
type SyncReply<T> = mpsc::Sender<Result<T, LedgerError>>;

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
    /// The key id the ledger names, and whether the chain holds any line.
    KeyState(SyncReply<(Option<String>, bool)>),
    /// Binds the ledger to a key id (records it if it names none), or refuses another one.
    BindKey(String, SyncReply<()>),
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
            Mode {
                read_only: false,
                lock_timeout,
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
            },
        )
    }

    fn start(path: &Path, mode: Mode) -> Result<Self, LedgerError> {
        let path = path.to_path_buf();
        let owners = Arc::new(Owners::new(&path));
        let mut writer = Writer::open(&path, owners.clone(), mode)?;
        if mode.read_only {
            writer.catch_up(false)?;
        } else {
            writer.recover()?;
        }
        let (ops, receiver) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("mcp-replay-guard-file-ledger".into())
            .spawn(move || writer.run(receiver))
            .map_err(|e| failed("cannot start the ledger writer thread", e))?;
        Ok(Self {
            path: Arc::new(path),
            read_only: mode.read_only,
            ops,
            owners,
            _writer: Arc::new(WriterThread(Some(handle))),
        })
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
            None => create_key(&self.path, &key_path)?,
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
        self.ops
            .send(op(reply))
            .map_err(|_| storage("the ledger writer stopped", "reopen the ledger"))?;
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

/// Verifies a ledger file without opening it as a ledger, with the archives its checkpoints
/// name (see [`verify_file_anchored`](super::verify_file_anchored)).
pub fn verify_file(path: &Path) -> Result<VerifyReport, LedgerError> {
    super::verify::verify_file_anchored(path, None)
}

/// Whether a ledger that names `bound` (if any) may be used with the key of id `id`.
fn check_key(bound: Option<&str>, id: &str) -> Result<(), LedgerError> {
    match bound {
        Some(bound) if bound != id => Err(LedgerError::storage(format!(
            "the fingerprint key is not the key this ledger was written with (the ledger names \
             key {}, this one is {}): restore the ledger's own key file; another key would \
             recognise none of its intents",
            short_id(bound),
            short_id(id)
        ))),
        _ => Ok(()),
    }
}

/// Reads the key file, `None` when there is none.
fn read_key(p: &Path) -> Result<Option<FingerprintKey>, LedgerError> {
    let text = match fs::read_to_string(p) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(failed(&format!("cannot read the key {}", p.display()), e)),
    };
    // The errors never carry the file's content.
    let bytes = hex::decode(text.trim())
        .map_err(|_| LedgerError::storage(format!("the key file {} is not hex", p.display())))?;
    FingerprintKey::from_bytes(&bytes)
        .map(Some)
        .map_err(|e| failed(&format!("the key file {}", p.display()), e))
}

/// Creates the 0600 key file beside a ledger (or reads the one a racing process created).
fn create_key(path: &Path, key_path: &Path) -> Result<FingerprintKey, LedgerError> {
    let key = FingerprintKey::generate().map_err(|e| failed("cannot make a fingerprint key", e))?;
    // Write a private temporary file, then link it into place: if another process won the
    // race, its key is the one everybody uses.
    let tmp = sibling(path, &format!("key.{}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| failed(&format!("cannot create {}", tmp.display()), e))?;
    file.write_all(hex::encode(key.expose_bytes()).as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| failed(&format!("cannot write {}", tmp.display()), e))?;
    let linked = fs::hard_link(&tmp, key_path);
    let _ = fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            read_key(key_path)?.ok_or_else(|| {
                storage(
                    &format!("cannot read {}", key_path.display()),
                    "it vanished",
                )
            })
        }
        Err(e) => Err(failed(&format!("cannot create {}", key_path.display()), e)),
    }
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

/// Liveness of guard owners across processes: each owner this process serves holds an
/// exclusive lock on `<ledger>.owners/<owner>.lock` for as long as the process lives.
struct Owners {
    dir: PathBuf,
    held: Mutex<HashMap<String, File>>,
}

impl Owners {
    /// The directory is created by the first [`hold`](Self::hold): opening a ledger (or a
    /// file that turns out not to be one) creates nothing beside it.
    fn new(ledger: &Path) -> Self {
        Self {
            dir: sibling(ledger, "owners"),
            held: Mutex::default(),
        }
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
        fs::create_dir_all(&self.dir)
            .map_err(|e| failed(&format!("cannot create {}", self.dir.display()), e))?;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| failed(&format!("cannot create {}", path.display()), e))?;
            file.try_lock()
                .map_err(|e| failed(&format!("owner {owner} is held by another process"), e))?;
            // Another process may have pruned the file between our open and our lock: only a
            // lock on the file that is at the path counts.
            let ours = file
                .metadata()
                .map_err(|e| failed("cannot stat an owner file", e))?;
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

/// The writer thread: the only code that touches the file and the index.
struct Writer {
    path: PathBuf,
    file: File,
    /// Bytes of the file read into the index.
    offset: u64,
    head: (u64, ChainHash),
    index: Index,
    /// The id of the fingerprint key the chain names.
    key_id: Option<String>,
    owners: Arc<Owners>,
    mode: Mode,
    /// The last [`locked`](Self::locked) failed to take the lock (so `f` never ran and the
    /// index holds nothing unwritten).
    lock_failed: bool,
}

impl Writer {
    fn open(path: &Path, owners: Arc<Owners>, mode: Mode) -> Result<Self, LedgerError> {
        let mut options = OpenOptions::new();
        options.read(true);
        if !mode.read_only {
            options.append(true).create(true).mode(0o600);
        }
        let file = options.open(path).map_err(|e| {
            if mode.read_only && e.kind() == io::ErrorKind::NotFound {
                LedgerError::storage(format!("no ledger at {}", path.display()))
            } else {
                failed(&format!("cannot open the ledger {}", path.display()), e)
            }
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            offset: 0,
            head: (0, ChainHash::GENESIS),
            index: Index::default(),
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
            *self = Self::open(&self.path.clone(), owners, self.mode)?;
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
    fn catch_up(&mut self, locked: bool) -> Result<(), LedgerError> {
        let len = self
            .file
            .metadata()
            .map_err(|e| failed("cannot stat the ledger", e))?
            .len();
        if len <= self.offset {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity((len - self.offset) as usize);
        self.file
            .seek(SeekFrom::Start(self.offset))
            .and_then(|_| (&self.file).take(len - self.offset).read_to_end(&mut bytes))
            .map_err(|e| failed("cannot read the ledger", e))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let mut consumed = 0;
        for piece in bytes[..complete].split_inclusive(|&b| b == b'\n') {
            let line = &piece[..piece.len() - 1];
            match read_line(line, self.head) {
                Ok(None) => {}
                Ok(Some(line)) => self.take_line(line),
                Err(problem) => {
                    // The lines before it are in the index: do not read them again.
                    self.offset += consumed as u64;
                    return Err(self.refusal(line, &bytes[consumed..], problem));
                }
            }
            consumed += piece.len();
        }
        self.offset += consumed as u64;
        let tail = &bytes[complete..];
        if tail.is_empty() {
            return Ok(());
        }
        if !could_be_torn(tail) {
            let problem = ChainProblem::Unreadable {
                detail: "the file ends with bytes that cannot start a ledger line".into(),
            };
            return Err(self.refusal(tail, tail, problem));
        }
        if locked {
            tracing::warn!(path = %self.path.display(), bytes = tail.len(), "cutting a torn last ledger line (a crash mid-write)");
            return self.truncate_at(self.offset);
        }
        Ok(())
    }

    /// The error for a line at `self.offset` that cannot be taken (`rest` is the file from
    /// there on). Nothing of the line is quoted: the file may not be a ledger at all.
    fn refusal(&self, line: &[u8], rest: &[u8], problem: ChainProblem) -> LedgerError {
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
        let chain_like = line.trim_ascii_start().starts_with(LINE_START);
        if self.head.0 == 0 && !chain_like && matches!(problem, ChainProblem::Unreadable { .. }) {
            return LedgerError::storage(format!(
                "{path} is not a replay-guard ledger: it looks like {}, and does not start \
                 with a ledger line. It was left untouched: give the path of a ledger the guard \
                 wrote, or of a new file",
                looks_like(rest)
            ));
        }
        LedgerError::storage(format!(
            "the ledger line at byte {at} (seq {seq}) of {path}: {problem}; the file is left as \
             it is (nothing was cut or written): `replay-guard audit verify {path}` names the \
             line, and an operator decides what to do with it"
        ))
    }

    fn truncate_at(&mut self, offset: u64) -> Result<(), LedgerError> {
        self.file
            .set_len(offset)
            .and_then(|()| self.file.sync_all())
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
            .map_err(|e| failed("cannot write the ledger", e))?;
        self.offset += text.len() as u64;
        let before = self.head.0;
        self.head = (seq, prev);
        chain::log_head(&self.path.display(), Some(before), self.head.into());
        Ok(())
    }

    /// On open: an execution left `dispatched` by an owner that is gone has an unknown outcome
    /// ([`decide::orphan_unknown`](crate::decide::orphan_unknown)).
    fn recover(&mut self) -> Result<(), LedgerError> {
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

    fn run(mut self, ops: mpsc::Receiver<Op>) {
        chain::log_head(&self.path.display(), None, self.head.into());
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
                Op::Claim(..)
                    | Op::Append(..)
                    | Op::StoreResult(..)
                    | Op::Compact(..)
                    | Op::BindKey(..)
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
                        // Expired executions leave the index; their lines stay until
                        // compaction.
                        w.index.count_claim(claim.at);
                        let owners = &w.owners;
                        let claimed = w.index.claim(&claim, || owners.hold(&claim.owner)).map(
                            |(claimed, accepted)| {
                                bodies.extend(accepted.map(LineBody::Event));
                                claimed
                            },
                        );
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
                            .map_err(|e| failed("a result to keep is not JSON", e))
                            .and_then(fits_in_a_line)
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
            w.write(bodies)
        });
        // A lock that was not had: nothing ran, nothing to rebuild (and no second wait).
        if outcome.is_err() && !std::mem::take(&mut self.lock_failed) {
            // The index may hold what was not written: rebuild it from the file.
            let owners = self.owners.clone();
            match Self::open(&self.path.clone(), owners, self.mode) {
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
        if let Some(id) = &self.key_id {
            bodies.push(LineBody::FingerprintKey {
                fingerprint_key: KeyBinding { id: id.clone() },
            });
        }
        let mut executions: Vec<&Stored> = self.index.executions.values().collect();
        executions.sort_by_key(|s| s.record.execution_id);
        for stored in executions {
            for event in &stored.events {
                bodies.push(LineBody::Event(event.clone()));
            }
            // Every result of a retained execution, referenced yet or not: the guard keeps a
            // result before it records the `completed` that references it, and a compaction
            // (by any process) may fall between the two.
            let id = stored.record.execution_id;
            let mut references = vec![result_reference(id)];
            if let Some(reference) = &stored.record.result_reference
                && *reference != references[0]
            {
                references.push(reference.clone());
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
            .map_err(|e| failed("cannot create the compacted ledger", e))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .map_err(|e| failed("cannot write the compacted ledger", e))?;
        // Keep the old chain, then put the new file in place (the lock on the old inode is
        // still held, so no other process appends in between).
        link_archive(&self.path, &archived_to)
            .and_then(|()| fs::rename(&next, &self.path))
            .map_err(|e| failed("cannot swap in the compacted ledger", e))?;
        let owners = self.owners.clone();
        let _ = self.file.unlock();
        *self = Self::open(&self.path.clone(), owners, self.mode)?;
        lock_within(&self.file, &self.path, self.mode.lock_timeout)?;
        self.catch_up(true)?;
        Ok(CompactReport {
            archived_to,
            kept_executions: kept,
            dropped_executions: before - kept,
        })
    }
}

/// Links the live file as its archive. A compaction killed between this link and its rename
/// leaves the archive name on the live file's own inode: that link is this one already, so it
/// is taken as it is (any other file of that name is an archive and is never replaced).
fn link_archive(live: &Path, archive: &Path) -> io::Result<()> {
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

/// How deep a kept result may nest. The JSON parser refuses more than 127 nested levels, and
/// the line around a result adds levels of its own: a result that parses on its own may still
/// make a line that never reads back, so deeper ones are refused here, well short of the limit.
const MAX_RESULT_DEPTH: usize = 100;

/// The result, if its line will read back (see [`MAX_RESULT_DEPTH`]).
fn fits_in_a_line(result: serde_json::Value) -> Result<serde_json::Value, LedgerError> {
    fn depth(value: &serde_json::Value) -> usize {
        match value {
            serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
            serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    if depth(&result) > MAX_RESULT_DEPTH {
        return Err(storage(
            "a result to keep is nested deeper than a ledger line can hold",
            format!("more than {MAX_RESULT_DEPTH} levels; it is not kept"),
        ));
    }
    Ok(result)
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
        self.writable()?;
        self.ask(|reply| Op::Claim(Box::new(claim), reply)).await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.writable()?;
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
    use crate::{
        contract::RetryClass,
        ledger::{
            ExecutionState,
            fixtures::{claim, dispatched, event_at},
        },
    };

    fn temp_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mrg-{test}-{}", ExecutionId::new().ulid()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Issue 14: the orphan rule of every ledger ([`crate::decide::orphan_unknown`]), on open.
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
        assert_eq!(record.reason.as_deref(), Some(crate::decide::ORPHAN_REASON));
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

    #[test]
    fn only_what_can_start_a_line_is_torn() {
        for torn in [
            &b""[..],
            b"{",
            b"{\"se",
            b"{\"seq\":12,\"prev\":\"sha256:ab",
            b"{\"seq\":3\0\0\0\0",
            b"\0\0\0",
            b"  \t",
            "\u{3000}".as_bytes(),
        ] {
            assert!(could_be_torn(torn), "{:?}", String::from_utf8_lossy(torn));
        }
        for foreign in [
            &b"just a note"[..],
            b"root:x:0:0",
            b"{\"a\":1}",
            b"[1,2]",
            b"\x7fELF\x02",
            b"\0\0x",
        ] {
            assert!(
                !could_be_torn(foreign),
                "{:?}",
                String::from_utf8_lossy(foreign)
            );
        }
    }

    #[test]
    fn a_foreign_file_is_described_never_quoted() {
        assert_eq!(looks_like(b"\xff\xfe\x00"), "binary data (not UTF-8 text)");
        assert_eq!(looks_like(b"a\0b"), "binary data");
        assert!(looks_like(b"password = hunter2\n").starts_with("text"));
        assert!(looks_like(b"\n{\"a\":1}\n").starts_with("JSON"));
        assert!(!looks_like(b"password = hunter2\n").contains("hunter2"));
    }

    #[test]
    fn a_newer_line_is_told_from_a_garbled_one() {
        let newer = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","execution_id":"act_01J4K8J7DX7VQ9ZB3N5M2P6R8T","at":"2026-12-01T00:00:00.000Z","event":"teleported"}"#;
        assert_eq!(
            newer_format(newer).as_deref(),
            Some("event `teleported`, unknown to this build")
        );
        let body = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","sealed_by":"hsm"}"#;
        assert!(newer_format(body).unwrap().contains("sealed_by"));
        // A known kind with a bad field, a line without its chain fields, text: not newer.
        let known = br#"{"seq":4,"prev":"sha256:00","hash":"sha256:00","execution_id":"act_01J4K8J7DX7VQ9ZB3N5M2P6R8T","at":"2026-12-01T00:00:00.000Z","event":"dispatched"}"#;
        assert_eq!(newer_format(known), None);
        assert_eq!(newer_format(br#"{"event":"teleported"}"#), None);
        assert_eq!(newer_format(b"hello"), None);
    }

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

    #[test]
    fn a_key_id_names_the_key_without_revealing_it() {
        let key = FingerprintKey::from_bytes(&[7; 32]).unwrap();
        let id = key_id(&key);
        assert!(
            id.starts_with("hmac-sha256:") && id.len() == 12 + 64,
            "{id}"
        );
        assert!(!id.contains(&hex::encode(key.expose_bytes())));
        assert_ne!(id, key_id(&FingerprintKey::from_bytes(&[8; 32]).unwrap()));
        assert_eq!(short_id(&id).len(), 12 + 16);
        assert!(check_key(None, &id).is_ok() && check_key(Some(&id), &id).is_ok());
        assert!(check_key(Some("hmac-sha256:00"), &id).is_err());
    }
}
