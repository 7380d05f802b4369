//! Owner liveness across processes: lock files in `<ledger>.owners/`.
//!
//! Every lock taken here is released with an explicit `flock(LOCK_UN)`, never by closing the
//! file alone: a child process forked by any thread of this process shares the lock file's
//! open description from its fork until its exec (close-on-exec closes it only then), and a
//! close releases the lock only once every sharer closed. On a busy machine that window is long
//! enough for another process to read a released owner as alive, or a probed one as held.

use super::*;

/// Liveness of guard owners across processes: each owner this process serves holds an
/// exclusive lock on `<ledger>.owners/<owner>.lock` for as long as the process lives.
pub(super) struct Owners {
    dir: PathBuf,
    held: Mutex<HashMap<String, File>>,
}

impl Owners {
    /// The directory is created by the first [`hold`](Self::hold): opening a ledger (or a
    /// file that turns out not to be one) creates nothing beside it.
    pub(super) fn new(ledger: &Path) -> Self {
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
    pub(super) fn hold(&self, owner: &str) -> Result<(), LedgerError> {
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
            let _ = file.unlock();
        }
    }

    /// Removes the lock files of owners whose process is gone, so that the directory does not
    /// grow with every run. A missing file reads as a dead owner, which it is.
    pub(super) fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if let Ok(file) = File::open(&path)
                && file.try_lock().is_ok()
            {
                let _ = fs::remove_file(&path);
                let _ = file.unlock();
            }
        }
    }

    pub(super) fn is_alive(&self, owner: &str) -> bool {
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
            Ok(()) => {
                // Nobody holds it: its process is gone.
                let _ = file.unlock();
                false
            }
            Err(_) => true,
        }
    }
}

impl Drop for Owners {
    /// The owners this ledger served are gone with it, whatever process was forked meanwhile.
    fn drop(&mut self) {
        let held = self
            .held
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for file in held.values() {
            let _ = file.unlock();
        }
    }
}
