//! Where the `stdio_server` example's binary is, built on first use.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

/// `target/<profile>/examples/stdio_server`, built once per run of this test binary with the
/// features this test was built with (so only the example is linked).
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
        // Every feature of the package: one left out builds the library and its dependencies
        // again under another feature set (minutes), where the same set is a no-op.
        let features: Vec<&str> = [
            ("rmcp", cfg!(feature = "rmcp")),
            ("reqwest", cfg!(feature = "reqwest")),
            ("postgres", cfg!(feature = "postgres")),
            ("server", cfg!(feature = "server")),
            ("simulation", cfg!(feature = "simulation")),
            ("ssh", cfg!(feature = "ssh")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = std::process::Command::new(cargo);
        build
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "build",
                "-p",
                "mcp-replay-guard",
                "--example",
                "stdio_server",
            ])
            .arg("--features")
            .arg(features.join(","))
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
