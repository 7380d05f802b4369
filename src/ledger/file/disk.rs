//! Where the ledger's appends meet the disk: the one I/O seam of the writer.
//!
//! Every byte the writer adds to the ledger file, every `fdatasync` that makes it durable,
//! every cut of a torn tail and every directory sync that makes a new file's name durable goes
//! through a [`Disk`]. The operating system's is the only one
//! a user gets; the deterministic simulator (feature `simulation`) brings one that remembers
//! what was synced and, when it crashes, loses the rest and may tear the last write.

use std::{
    fs::File,
    io::{self, Write},
    path::Path,
};

/// The writes of a [`FileLedger`](super::FileLedger) to its file (feature `simulation`).
///
/// An implementation must do what the operating system does, or model a failure of it: the
/// writer treats an error from any method as "this write may or may not be on disk" and
/// rebuilds its index from the file.
#[cfg_attr(not(feature = "simulation"), allow(unreachable_pub))]
pub trait Disk: Send + Sync + 'static {
    /// Appends `bytes` to `file` (opened for append).
    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()>;
    /// Makes what was written to `file` durable (`fdatasync`).
    fn sync(&self, file: &File) -> io::Result<()>;
    /// Cuts `file` to `len` bytes and makes the cut durable.
    fn truncate(&self, file: &File, len: u64) -> io::Result<()>;
    /// Makes the entries of the directory `dir` durable (`fsync` of the directory): a file
    /// created, linked or renamed there is still there after a power loss. Without it, a new
    /// ledger's first synced `dispatched` can be lost with the file's name.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

/// The operating system's disk.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct OsDisk;

impl Disk for OsDisk {
    fn write(&self, mut file: &File, bytes: &[u8]) -> io::Result<()> {
        file.write_all(bytes)
    }

    fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        file.set_len(len).and_then(|()| file.sync_all())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// The directory a file at `path` is in (`.` for a bare file name).
pub(super) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}
