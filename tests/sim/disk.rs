//! The simulated disk under the `FileLedger`: real files, with the durability of a real disk.
//!
//! Every append, sync and cut of the ledger goes through [`ProcessDisk`] (the ledger's one I/O
//! seam, `mcp_replay_guard::ledger::Disk`). The machine remembers, per file, how much of it
//! was synced and which bytes the ledger was told are on disk (the acknowledged prefix). A
//! process crash (SIGKILL) keeps what was written, as the kernel does; a power loss keeps only
//! what was synced, plus a torn piece of the last write, and may damage the last synced line
//! (a torn sector). A cut of an acknowledged byte is recorded as a violation the moment it is
//! tried.

use std::{
    collections::HashMap,
    fs::File,
    io::{self, Write},
    os::unix::fs::{FileExt, MetadataExt},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
};

use mcp_replay_guard::ledger::Disk;

use crate::plan::Phase;

#[derive(Debug, Default)]
struct FileState {
    path: PathBuf,
    durable: u64,
    /// The bytes every ledger on this machine was told are on disk.
    acked: Vec<u8>,
}

/// The disk of the agents' machine, shared by its processes.
#[derive(Debug, Default)]
pub struct Machine {
    files: Mutex<HashMap<u64, FileState>>,
    /// What a disk operation saw that a ledger must never do.
    pub violations: Mutex<Vec<String>>,
    /// The acknowledged bytes of a ledger file were damaged by a power loss: opening it
    /// must fail from now on.
    pub corrupted: AtomicBool,
    /// Where the damage is and the byte it replaced.
    damage: Mutex<Option<(PathBuf, u64, u8)>>,
}

/// A crash planned inside a disk operation.
#[derive(Debug, Clone, Copy)]
pub struct PlannedCrash {
    pub op: u32,
    pub phase: Phase,
    pub machine: bool,
}

/// One life of one process's view of the disk.
#[derive(Debug)]
pub struct ProcessDisk {
    machine: Arc<Machine>,
    /// Disk operations of this process, over all its lives.
    ops: Arc<AtomicU32>,
    planned: Option<PlannedCrash>,
    /// Set when this life crashed (planned, or killed by the simulation): nothing it does
    /// reaches the disk any more.
    pub dead: AtomicBool,
    /// A planned crash that fired, for the simulation to carry out.
    pub fired: Mutex<Option<PlannedCrash>>,
}

fn dead() -> io::Error {
    io::Error::other("the process crashed")
}

impl ProcessDisk {
    pub fn new(machine: Arc<Machine>, ops: Arc<AtomicU32>, planned: Option<PlannedCrash>) -> Self {
        Self {
            machine,
            ops,
            planned,
            dead: AtomicBool::new(false),
            fired: Mutex::new(None),
        }
    }

    fn check(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(dead())
        } else {
            Ok(())
        }
    }

    /// Whether the planned crash falls at this point of the current operation.
    fn crash_here(&self, op: u32, phase: Phase) -> bool {
        match self.planned {
            Some(planned) if planned.op == op && planned.phase == phase => {
                self.dead.store(true, Ordering::SeqCst);
                *self.fired.lock().unwrap() = Some(planned);
                true
            }
            _ => false,
        }
    }

    fn current_op(&self) -> u32 {
        self.ops.load(Ordering::SeqCst)
    }
}

fn inode(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.ino())
}

impl Disk for ProcessDisk {
    fn write(&self, mut file: &File, bytes: &[u8]) -> io::Result<()> {
        self.check()?;
        let op = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_here(op, Phase::BeforeWrite) {
            return Err(dead());
        }
        file.write_all(bytes)?;
        if self.crash_here(op, Phase::AfterWrite) {
            return Err(dead());
        }
        Ok(())
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        self.check()?;
        let len = file.metadata()?.len();
        let mut content = vec![0; len as usize];
        file.read_exact_at(&mut content, 0)?;
        let mut files = self.machine.files.lock().unwrap();
        let state = files.entry(inode(file)?).or_default();
        state.durable = len;
        if self.crash_here(self.current_op(), Phase::AfterSync) {
            return Err(dead());
        }
        state.acked = content;
        Ok(())
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        self.check()?;
        let mut files = self.machine.files.lock().unwrap();
        let state = files.entry(inode(file)?).or_default();
        if len < state.acked.len() as u64 {
            self.machine.violations.lock().unwrap().push(format!(
                "the ledger cut acknowledged bytes: {} acknowledged, cut to {len}",
                state.acked.len()
            ));
        }
        file.set_len(len)?;
        state.durable = len;
        state.acked.truncate(len as usize);
        Ok(())
    }

    /// Directory entries are not modelled (the machine follows files by inode, and a power loss
    /// keeps every file's name): a dead process syncs nothing, a live one always succeeds.
    fn sync_dir(&self, _dir: &std::path::Path) -> io::Result<()> {
        self.check()
    }
}

impl Machine {
    /// Remembers where a ledger file lives (so a power loss can find it).
    pub fn track(&self, path: PathBuf) -> io::Result<()> {
        let Ok(meta) = std::fs::metadata(&path) else {
            return Ok(());
        };
        let mut files = self.files.lock().unwrap();
        files.entry(meta.ino()).or_default().path = path;
        Ok(())
    }

    /// A power loss: every file keeps what was synced and `tear` thousandths of what was not
    /// (its first bytes: any suffix of the unsynced writes is lost, a torn one too); with
    /// `corrupt`, a byte in the middle of the last synced line is damaged. Returns what
    /// happened, for the timeline.
    pub fn power_loss(&self, tear: u64, corrupt: bool) -> io::Result<String> {
        let files = self.files.lock().unwrap();
        let mut told = Vec::new();
        for state in files.values() {
            if state.path.as_os_str().is_empty() || !state.path.exists() {
                continue;
            }
            let len = std::fs::metadata(&state.path)?.len();
            let unsynced = len.saturating_sub(state.durable);
            let kept = len.min(state.durable + unsynced * tear.min(1_000) / 1_000);
            let file = std::fs::OpenOptions::new().write(true).open(&state.path)?;
            file.set_len(kept)?;
            told.push(format!(
                "{} of {} unsynced bytes survive",
                kept - state.durable.min(kept),
                len - state.durable.min(len)
            ));
            if corrupt && let Some(at) = last_line_middle(&state.acked) {
                file.write_all_at(b"#", at as u64)?;
                *self.damage.lock().unwrap() =
                    Some((state.path.clone(), at as u64, state.acked[at]));
                self.corrupted.store(true, Ordering::SeqCst);
                told.push(format!("the synced byte at {at} is damaged"));
            }
        }
        Ok(told.join(", "))
    }

    /// The ledger at `path` was compacted: a new file, written whole and synced, took its
    /// name; the old one (kept as the archive) is no longer the ledger.
    pub fn compacted(&self, path: &PathBuf) {
        let Ok(content) = std::fs::read(path) else {
            return;
        };
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        let mut files = self.files.lock().unwrap();
        files.retain(|_, state| &state.path != path);
        files.insert(
            meta.ino(),
            FileState {
                path: path.clone(),
                durable: content.len() as u64,
                acked: content,
            },
        );
    }

    /// Puts back the damaged byte (for the checks at the end, which read the records).
    pub fn repair_damage(&self) {
        if let Some((path, at, byte)) = self.damage.lock().unwrap().take()
            && let Ok(file) = std::fs::OpenOptions::new().write(true).open(path)
        {
            let _ = file.write_all_at(&[byte], at);
        }
    }

    /// Checks a reopened file against what was acknowledged: every acknowledged byte is
    /// still there, unchanged.
    pub fn check_acked(&self, path: &PathBuf) -> Option<String> {
        let files = self.files.lock().unwrap();
        let state = files.values().find(|s| &s.path == path)?;
        let now = std::fs::read(path).ok()?;
        if now.len() < state.acked.len() || now[..state.acked.len()] != state.acked[..] {
            return Some(format!(
                "acknowledged ledger bytes were lost or rewritten ({} acknowledged, {} on disk)",
                state.acked.len(),
                now.len()
            ));
        }
        None
    }
}

/// A byte in the middle of the last complete line of `bytes`.
fn last_line_middle(bytes: &[u8]) -> Option<usize> {
    let end = bytes.iter().rposition(|&b| b == b'\n')?;
    let start = bytes[..end]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    (end > start + 2).then(|| start + (end - start) / 2)
}
