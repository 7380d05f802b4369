//! Temporary directories of a test's own: `mrg-<prefix>-<name>-<pid>-<ulid>`, created empty.

use std::path::{Path, PathBuf};

use mcp_replay_guard::ExecutionId;

/// A new directory under the system's temp dir.
pub fn temp_dir(prefix: &str, name: &str) -> PathBuf {
    temp_dir_in(&std::env::temp_dir(), prefix, name)
}

/// A new directory under `/dev/shm` where there is one (fsyncs cost nothing there), else under
/// the system's temp dir.
pub fn shm_temp_dir(prefix: &str, name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        temp_dir_in(shm, prefix, name)
    } else {
        temp_dir(prefix, name)
    }
}

fn temp_dir_in(base: &Path, prefix: &str, name: &str) -> PathBuf {
    let dir = base.join(format!(
        "mrg-{prefix}-{name}-{}-{}",
        std::process::id(),
        ExecutionId::new().ulid()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
