//! The simulated disk under the `FileLedger`: real files, with the durability of a real disk.
//!
//! Every append, sync, cut and directory sync of the ledger goes through [`ProcessDisk`] (the
//! ledger's one I/O seam, `mcp_replay_guard::ledger::Disk`). The machine remembers, per file
//! (by inode, wherever its name is now), how much of it was synced and which bytes the ledger
//! was told are on disk (the acknowledged prefix), and, per directory, the names it held when
//! it was last synced. A process crash (SIGKILL) keeps what was written, as the kernel does; a
//! power loss keeps only what was synced plus any prefix of the rest (any suffix of the
//! unsynced writes is lost, a torn one too), may damage the last synced line (a torn sector),
//! and takes back every name made since its directory was last synced: a new file is gone, a
//! name renamed over another points at the old file again. A cut of an acknowledged byte is
//! recorded as a violation the moment it is tried.

use std::{
    collections::{BTreeMap, HashMap},
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
    durable: u64,
    /// The bytes every ledger on this machine was told are on disk.
    acked: Vec<u8>,
}

/// The disk of the agents' machine, shared by its processes.
#[derive(Debug, Default)]
pub struct Machine {
    files: Mutex<HashMap<u64, FileState>>,
    /// Per synced directory, the inode of each file name it held at its last sync.
    dirs: Mutex<HashMap<PathBuf, BTreeMap<std::ffi::OsString, u64>>>,
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
    /// Drawn as the plan's crash inside a disk operation (else a kill inside a compaction).
    pub drawn: bool,
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
    /// This life dies at its next directory sync (a compaction killed as it syncs the
    /// directory that holds its file's new name).
    pub die_at_dir_sync: AtomicBool,
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
            die_at_dir_sync: AtomicBool::new(false),
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
        // A file first written here holds only synced bytes so far (a new file, or one written
        // whole and synced by other means, as a compaction writes its file).
        let meta = file.metadata()?;
        self.machine
            .files
            .lock()
            .unwrap()
            .entry(meta.ino())
            .or_insert_with(|| FileState {
                durable: meta.len(),
                ..FileState::default()
            });
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

    /// A disk operation of its own: the names `dir` holds now become durable.
    fn sync_dir(&self, dir: &std::path::Path) -> io::Result<()> {
        self.check()?;
        let op = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if self.die_at_dir_sync.swap(false, Ordering::SeqCst) {
            self.dead.store(true, Ordering::SeqCst);
            *self.fired.lock().unwrap() = Some(PlannedCrash {
                op,
                phase: Phase::BeforeWrite,
                machine: false,
                drawn: false,
            });
            return Err(dead());
        }
        if self.crash_here(op, Phase::BeforeWrite) {
            return Err(dead());
        }
        let names = names_in(dir)?;
        self.machine
            .dirs
            .lock()
            .unwrap()
            .insert(dir.to_path_buf(), names);
        if self.crash_here(op, Phase::AfterWrite) || self.crash_here(op, Phase::AfterSync) {
            return Err(dead());
        }
        Ok(())
    }
}

impl Machine {
    /// A power loss. First every name made since its directory was last synced is taken back
    /// (a name renamed over another points at the old file again, if a name of it is left; a
    /// new name is gone); then every file keeps what was synced and `tear` thousandths of what
    /// was not (its first bytes: any suffix of the unsynced writes is lost, a torn one too);
    /// with `corrupt`, a byte in the middle of the last synced line of the file at `ledger` is
    /// damaged. Returns what happened, for the timeline.
    pub fn power_loss(
        &self,
        ledger: &std::path::Path,
        tear: u64,
        corrupt: bool,
    ) -> io::Result<String> {
        let mut told = self.take_back_names()?;
        let files = self.files.lock().unwrap();
        let on_disk = self.files_on_disk()?;
        // In the order of their names, so that a replay tells it the same way.
        let mut known: Vec<(&PathBuf, &FileState)> = files
            .iter()
            .filter_map(|(ino, state)| Some((on_disk.get(ino)?, state)))
            .collect();
        known.sort_by_key(|(path, _)| *path);
        for (path, state) in known {
            let len = std::fs::metadata(path)?.len();
            let unsynced = len.saturating_sub(state.durable);
            let kept = len.min(state.durable + unsynced * tear.min(1_000) / 1_000);
            let file = std::fs::OpenOptions::new().write(true).open(path)?;
            file.set_len(kept)?;
            told.push(format!(
                "{} of {} unsynced bytes survive",
                kept - state.durable.min(kept),
                len - state.durable.min(len)
            ));
            if corrupt
                && path == ledger
                && let Some(at) = last_line_middle(&state.acked)
            {
                file.write_all_at(b"#", at as u64)?;
                *self.damage.lock().unwrap() = Some((path.clone(), at as u64, state.acked[at]));
                self.corrupted.store(true, Ordering::SeqCst);
                told.push(format!("the synced byte at {at} is damaged"));
            }
        }
        Ok(told.join(", "))
    }

    /// Takes back the names made since each synced directory's last sync.
    fn take_back_names(&self) -> io::Result<Vec<String>> {
        let mut told = Vec::new();
        let dirs = self.dirs.lock().unwrap();
        let mut synced: Vec<_> = dirs.iter().collect();
        synced.sort_by_key(|(dir, _)| *dir);
        for (dir, durable) in synced {
            let now = names_in(dir)?;
            // Renamed over: the name points at its old file again, through a name left of it.
            for (name, ino) in &now {
                let Some(old) = durable.get(name).filter(|old| *old != ino) else {
                    continue;
                };
                let path = dir.join(name);
                std::fs::remove_file(&path)?;
                if let Some((other, _)) = now.iter().find(|(_, i)| *i == old) {
                    std::fs::hard_link(dir.join(other), &path)?;
                    told.push(format!("{} is its old file again", name.to_string_lossy()));
                } else {
                    told.push(format!(
                        "{} is gone with its old file",
                        name.to_string_lossy()
                    ));
                }
            }
            // New names are gone.
            for name in now.keys().filter(|name| !durable.contains_key(*name)) {
                std::fs::remove_file(dir.join(name))?;
                told.push(format!(
                    "{} was never synced into its directory",
                    name.to_string_lossy()
                ));
            }
        }
        Ok(told)
    }

    /// Where each file the machine knows is now, by inode, in the directories it synced.
    fn files_on_disk(&self) -> io::Result<HashMap<u64, PathBuf>> {
        let mut on_disk = HashMap::new();
        for dir in self.dirs.lock().unwrap().keys() {
            for (name, ino) in names_in(dir)? {
                on_disk.entry(ino).or_insert_with(|| dir.join(name));
            }
        }
        Ok(on_disk)
    }

    /// The bytes of the file now at `path` that are written but not synced (none for a file
    /// the machine has not seen written: it was synced whole, as a compaction writes its).
    pub fn unsynced_tail(&self, path: &std::path::Path) -> Vec<u8> {
        let Ok(meta) = std::fs::metadata(path) else {
            return Vec::new();
        };
        let durable = match self.files.lock().unwrap().get(&meta.ino()) {
            Some(state) => state.durable,
            None => return Vec::new(),
        };
        let Ok(bytes) = std::fs::read(path) else {
            return Vec::new();
        };
        bytes
            .get(usize::try_from(durable).unwrap_or(usize::MAX)..)
            .map(<[u8]>::to_vec)
            .unwrap_or_default()
    }

    /// Puts back the damaged byte (for the checks at the end, which read the records).
    pub fn repair_damage(&self) {
        if let Some((path, at, byte)) = self.damage.lock().unwrap().take()
            && let Ok(file) = std::fs::OpenOptions::new().write(true).open(path)
        {
            let _ = file.write_all_at(&[byte], at);
        }
    }

    /// Checks a reopened file against what was acknowledged of the file now at `path`: every
    /// acknowledged byte is still there, unchanged.
    pub fn check_acked(&self, path: &PathBuf) -> Option<String> {
        let ino = std::fs::metadata(path).ok()?.ino();
        let files = self.files.lock().unwrap();
        let state = files.get(&ino)?;
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

/// The regular files `dir` holds, by name, with their inodes (in the order of their names).
fn names_in(dir: &std::path::Path) -> io::Result<BTreeMap<std::ffi::OsString, u64>> {
    let mut names = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_file() {
            names.insert(entry.file_name(), meta.ino());
        }
    }
    Ok(names)
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
