//! Where the `stdio_server` example's binary is.

use std::path::{Path, PathBuf};

/// `target/<profile>/examples/stdio_server`, which `cargo test --all-features` builds with the
/// tests (it builds every example); `STDIO_SERVER_BIN` names another. A test never runs cargo
/// itself: a second build with other features would build the library again.
pub fn example_binary() -> PathBuf {
    if let Some(given) = std::env::var_os("STDIO_SERVER_BIN") {
        return PathBuf::from(given);
    }
    let exe = std::env::current_exe().expect("the test binary");
    // target/<profile>/deps/<test>-<hash>
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .join("examples")
        .join(format!("stdio_server{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test --all-features` builds it with the tests (a run of one test \
         target does not: `cargo build --all-features --example stdio_server` first), or set \
         STDIO_SERVER_BIN to its path",
        binary.display()
    );
    binary
}
