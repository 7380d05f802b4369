//! A full disk after the request left: `replay-guard call` never says
//! "nothing was sent" (exit 2) once `dispatched` is on disk, the read-only commands still work
//! on the full disk, and the repeat after space returns is decided from the ledger, never sent
//! blindly. The ledger lives on a small tmpfs that the test fills while the tool runs; the
//! server's side-effect counter is the ground truth.

use crate::support;

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use support::*;

/// A 1 MiB tmpfs mounted for one test, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// `None` (with the reason printed) where this process may not mount; under CI that is a
    /// failure, not a skip.
    fn mount(name: &str) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!("mrg-disk-full-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&dir)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Self(dir)),
            other => {
                let why = format!("cannot mount a tmpfs (needs root): {other:?}");
                assert!(std::env::var_os("CI").is_none(), "under CI: {why}");
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    /// Writes zeros until the disk is full.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0_u8; 4096];
        while file.write_all(&block).is_ok() {}
        let _ = file.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn call_argv<'a>(url: &'a str, ledger: &'a str) -> Vec<&'a str> {
    vec![
        "--json",
        "call",
        "--url",
        url,
        "--tool",
        "slow_deploy",
        "--args",
        r#"{"service":"catalog"}"#,
        "--class",
        "irreversible",
        "--ledger",
        ledger,
        "--protocol",
        "2025-11-25",
        "--timeout",
        "20s",
    ]
}

/// Starts `call` in the background.
fn spawn_call(url: &str, ledger: &str, scope: &str) -> tokio::process::Child {
    let mut argv = call_argv(url, ledger);
    argv.extend(["--scope", scope]);
    replay_guard_command(argv).spawn().expect("the binary runs")
}

async fn wait_until_started(server: &TestServer, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.state.started("slow_deploy") < n {
        assert!(Instant::now() < deadline, "the tool never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn finish(child: tokio::process::Child) -> Run {
    Run::from_output(&child.wait_with_output().await.expect("the binary ends"))
}

const PAGE: u64 = 4096;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_after_dispatch_never_reads_as_not_sent_and_is_never_resent() {
    let Some(disk) = SmallDisk::mount("after-dispatch") else {
        return;
    };
    let server = TestServer::start_with(ServerOptions {
        slow_tool_delay: Duration::from_secs(2),
        ..ServerOptions::default()
    })
    .await;
    let url = server.url.clone();

    // A tmpfs hands out whole pages, so an append fails only when it needs a new one. Measure
    // what a ledger holds once `dispatched` is written (the intent scope is the one part of it
    // whose length the test picks), then pick a scope that leaves the last page all but full.
    let calibration = disk.0.join("calibration.jsonl");
    let calibration = calibration.to_str().unwrap().to_owned();
    let child = spawn_call(&url, &calibration, "s");
    wait_until_started(&server, 1).await;
    let with_one_char_scope = std::fs::metadata(&calibration).unwrap().len();
    let first = finish(child).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    let fixed = with_one_char_scope - 1;
    let scope_len = (PAGE - 16 - fixed % PAGE) % PAGE;
    let scope = format!(
        "s{}",
        "x".repeat(usize::try_from(scope_len).unwrap().max(1) - 1)
    );

    let ledger = disk.0.join("ledger.jsonl");
    let ledger = ledger.to_str().unwrap().to_owned();
    let child = spawn_call(&url, &ledger, &scope);
    wait_until_started(&server, 2).await;
    let size = std::fs::metadata(&ledger).unwrap().len();
    assert!(
        PAGE - size % PAGE <= 64,
        "the last page has room: {size} bytes"
    );
    // `dispatched` is on disk and the tool runs; now the disk fills up.
    let filler = disk.fill();
    let first = finish(child).await;
    let code = first.code;
    eprintln!(
        "after dispatch, disk full: exit {code}\n{}\n{}",
        first.stdout, first.stderr
    );
    assert_ne!(code, 2, "exit 2 claims nothing was sent: {}", first.stderr);
    assert!(
        code == 3 || (code == 0 && first.stdout.contains("slow deployed catalog")),
        "exit {code}: {} / {}",
        first.stdout,
        first.stderr
    );
    assert_eq!(server.state.side_effects("slow_deploy"), 2);

    // The read-only commands work on the full disk.
    for argv in [
        vec!["--json", "ledger", "list", ledger.as_str()],
        vec!["audit", "verify", ledger.as_str()],
    ] {
        let run = replay_guard_blocking(&argv);
        assert_eq!(run.code, 0, "{argv:?}: {}", run.stderr);
    }

    // Space returns; the repeat is decided from the ledger. It runs again only if the first
    // call's answer was recorded delivered, which the full disk prevented.
    std::fs::remove_file(&filler).unwrap();
    let mut argv = call_argv(&url, &ledger);
    argv.extend(["--scope", scope.as_str()]);
    let repeat = replay_guard_blocking(&argv);
    let repeat_code = repeat.code;
    eprintln!(
        "repeat: exit {repeat_code}\n{}\n{}",
        repeat.stdout, repeat.stderr
    );
    assert_eq!(repeat_code, 3, "{}", repeat.stderr);
    assert_eq!(server.state.side_effects("slow_deploy"), 2);
    assert_eq!(server.state.tool_call_requests("slow_deploy").len(), 2);
    drop(disk);
}
