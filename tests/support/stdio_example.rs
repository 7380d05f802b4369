//! Where the `stdio_server` example's binary is, built on first use.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// `target/<profile>/examples/stdio_server`, built once per run of this test binary (a no-op
/// after `cargo test --all-features`, which built it).
pub fn example_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary");
        // target/<profile>/deps/stdio_server-<hash>
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>");
        let binary = profile_dir
            .join("examples")
            .join(format!("stdio_server{}", std::env::consts::EXE_SUFFIX));
        if let Some(given) = std::env::var_os("STDIO_SERVER_BIN") {
            return PathBuf::from(given);
        }
        let target_dir = profile_dir.parent().expect("the target directory");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // The workspace with every feature, as `cargo test --all-features` builds it (the
            // README's test command, which builds the examples too): the same feature set is
            // a no-op, where another (this package's features alone, or the command package's)
            // would build the library and its dependencies a second time.
            .args([
                "build",
                "--workspace",
                "--all-features",
                "--example",
                "stdio_server",
            ])
            .arg("--target-dir")
            .arg(target_dir);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(other) => {
                build.args(["--profile", other]);
            }
            None => {}
        }
        let status = build.status().expect("running cargo to build the example");
        assert!(
            status.success() && binary.is_file(),
            "`cargo build --example stdio_server` failed ({status}); build it by hand, or set \
             STDIO_SERVER_BIN to its path"
        );
        binary
    })
}
