//! The built `replay-guard` binary, run as a child process: to its end, within a time limit,
//! or blocking (for tests without a runtime).

use std::{process::Output, time::Duration};

use serde_json::Value;

/// The built binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_replay-guard");

/// One finished run of the binary.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The run an `output` describes.
    pub fn from_output(output: &Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// `(code, stdout, stderr)`.
    pub fn into_parts(self) -> (i32, String, String) {
        (self.code, self.stdout, self.stderr)
    }

    /// The `--json` line of `call`.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("stdout is not one JSON line ({e}): {self:#?}"))
    }

    pub fn execution_id(&self) -> String {
        self.json()["execution_id"]
            .as_str()
            .unwrap_or_else(|| panic!("no execution id: {self:#?}"))
            .to_owned()
    }
}

/// `replay-guard ARGS…` with `RUST_LOG=warn`, to its end.
pub async fn replay_guard(args: &[&str]) -> Run {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("the binary runs");
    Run::from_output(&output)
}

/// The argv of `replay-guard --json call --url URL --tool TOOL --args ARGS`, then `extra`.
pub fn call_argv(url: &str, tool: &str, args: &str, extra: &[&str]) -> Vec<String> {
    [
        "--json", "call", "--url", url, "--tool", tool, "--args", args,
    ]
    .iter()
    .chain(extra)
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// `replay-guard --json call --url URL --tool TOOL --args ARGS EXTRA…`, to its end, with
/// `args` passed as written.
pub async fn call_text(url: &str, tool: &str, args: &str, extra: &[&str]) -> Run {
    let argv = call_argv(url, tool, args, extra);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    replay_guard(&argv).await
}

/// [`call_text`] with `args` serialised.
pub async fn call(url: &str, tool: &str, args: Value, extra: &[&str]) -> Run {
    call_text(url, tool, &args.to_string(), extra).await
}

/// [`replay_guard`] on its own task, with owned arguments.
pub fn spawn_replay_guard(argv: &[String]) -> tokio::task::JoinHandle<Run> {
    let argv = argv.to_vec();
    tokio::spawn(async move {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        replay_guard(&argv).await
    })
}

/// Runs `n` copies of `replay-guard ARGV…` at once, as separate processes.
pub async fn concurrently(n: usize, argv: &[&str]) -> Vec<Run> {
    let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
    let runs: Vec<_> = (0..n).map(|_| spawn_replay_guard(&argv)).collect();
    let mut done = Vec::with_capacity(n);
    for run in runs {
        done.push(run.await.expect("the run's task ends"));
    }
    done
}

/// `replay-guard ARGS…` to spawn: `RUST_LOG=warn`, stdout and stderr piped, killed when
/// dropped.
pub fn replay_guard_command<I, S>(args: I) -> tokio::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the binary (`RUST_LOG=warn`), killing it if it has not ended within `limit` (a hang is
/// a failure, not a stuck test run). `None` when it had not.
pub async fn replay_guard_within(args: &[&str], limit: Duration) -> Option<(Run, Duration)> {
    let started = std::time::Instant::now();
    let child = replay_guard_command(args).spawn().expect("the binary runs");
    let output = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .ok()?
        .expect("the binary ends");
    Some((Run::from_output(&output), started.elapsed()))
}

/// `replay-guard ARGS…` to its end, blocking the thread, with the environment as it is.
pub fn replay_guard_blocking(args: &[&str]) -> Run {
    let output = std::process::Command::new(BIN)
        .args(args)
        .output()
        .expect("the binary runs");
    Run::from_output(&output)
}

/// `(code, stdout, stderr)` of [`replay_guard_blocking`].
pub fn replay_guard_parts(args: &[&str]) -> (i32, String, String) {
    replay_guard_blocking(args).into_parts()
}

/// `replay-guard --json ledger list PATH`, parsed: one record per execution.
pub async fn ledger_records(ledger: &str) -> Vec<Value> {
    let list = replay_guard(&["--json", "ledger", "list", ledger]).await;
    assert_eq!(list.code, 0, "{list:#?}");
    serde_json::from_str(&list.stdout).unwrap_or_else(|e| panic!("{e}: {list:#?}"))
}

/// [`ledger_records`], blocking the thread: for a poll loop or a sync helper.
pub fn ledger_list(ledger: &std::path::Path) -> Vec<Value> {
    let list = replay_guard_blocking(&["--json", "ledger", "list", &ledger.to_string_lossy()]);
    assert_eq!(list.code, 0, "{list:#?}");
    serde_json::from_str(&list.stdout).unwrap_or_else(|e| panic!("{e}: {list:#?}"))
}

/// A running proxy process, killed when dropped.
pub struct Proxy {
    pub url: String,
    pub child: tokio::process::Child,
}

/// Starts `replay-guard proxy` on a free port of 127.0.0.1 in front of `upstream`, then
/// `extra`; returns the process (killed when dropped) and the first line it printed.
pub async fn spawn_proxy(upstream: &str, extra: &[&str]) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::new(BIN);
    command.args(proxy_args(upstream, extra));
    spawn_listening(command).await
}

/// Spawns `command` with stdout piped, killed when dropped, and reads its first line.
async fn spawn_listening(mut command: tokio::process::Command) -> (tokio::process::Child, String) {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the proxy starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(stdout), &mut line),
    )
    .await
    .expect("the proxy says where it listens")
    .unwrap();
    (child, line)
}

/// The arguments of `replay-guard proxy` on a free port of 127.0.0.1 in front of `upstream`,
/// then `extra`: for a proxy run through another program (`prlimit`, say).
pub fn proxy_args(upstream: &str, extra: &[&str]) -> Vec<String> {
    ["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream]
        .iter()
        .chain(extra)
        .map(|arg| (*arg).to_owned())
        .collect()
}

/// Starts `command` (a proxy, maybe through another program; stdout is piped, the rest as the
/// command says) and waits for the line that says where it listens.
pub async fn start_proxy_command(command: tokio::process::Command) -> Proxy {
    let (child, line) = spawn_listening(command).await;
    proxy_listening(child, &line)
}

pub async fn start_proxy(upstream: &str, extra: &[&str]) -> Proxy {
    let (child, line) = spawn_proxy(upstream, extra).await;
    proxy_listening(child, &line)
}

/// [`start_proxy`] at `RUST_LOG=log`, its stderr kept for [`Proxy::stop`].
pub async fn start_proxy_logged(upstream: &str, extra: &[&str], log: &str) -> Proxy {
    let mut command = tokio::process::Command::new(BIN);
    command
        .args(proxy_args(upstream, extra))
        .env("RUST_LOG", log)
        .stderr(std::process::Stdio::piped());
    start_proxy_command(command).await
}

impl Proxy {
    /// Kills the proxy; returns what it wrote to stderr (with [`start_proxy_logged`]).
    pub async fn stop(mut self) -> String {
        self.child.kill().await.expect("the proxy is killed");
        let mut stderr = String::new();
        if let Some(mut pipe) = self.child.stderr.take() {
            tokio::io::AsyncReadExt::read_to_string(&mut pipe, &mut stderr)
                .await
                .expect("the proxy's stderr reads");
        }
        stderr
    }
}

fn proxy_listening(child: tokio::process::Child, line: &str) -> Proxy {
    // "listening on http://127.0.0.1:PORT -> upstream"
    let address = line
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
    Proxy {
        url: format!("{address}/mcp"),
        child,
    }
}
