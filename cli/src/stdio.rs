//! `replay-guard stdio -- <command> [args…]`: the guard in front of a stdio MCP server.
//!
//! An MCP host launches this in place of the server. It starts the server as its child and
//! relays newline-delimited JSON-RPC both ways ([`mcp_replay_guard::relay`]): every line
//! untouched except `tools/call`, which is guarded (recorded `dispatched`, durably, before its
//! line is written to the child; every repeat decided from the ledger), and the guard's own
//! answers. Logs go to stderr, as the child's stderr does; stdout carries only JSON-RPC.
//!
//! When the child exits with calls in flight, each is answered with the guard's honest answer
//! for its id (outcome unknown, its execution ID, what a repeat will do). Then the wrapper
//! exits with the child's status, or, with `--restart`, starts the child again, replays the
//! host's `initialize` (under an id of its own, its answer kept from the host) and
//! `notifications/initialized`, and goes on: messages waiting to be written go to the new
//! child. With a shared `--ledger`, a host that starts the wrapper again and repeats a call
//! is told the same execution.
//!
//! An answer written to the host is recorded `delivered` only once the host's next line
//! proves it read on (the library's one delivery rule): a host that dies with the answer
//! unread in its pipe leaves it completed and kept, and the repeat gets it.
//!
//! On SIGTERM or SIGINT the wrapper stops reading the host, gives the calls in flight up to
//! ten seconds to be answered (each answer written to the host and recorded), then ends the
//! server's process group (the server runs in a group of its own) and exits with 128 + the
//! signal's number.

use std::{
    ffi::OsString,
    io::Write as _,
    path::Path,
    process::{ExitCode, ExitStatus, Stdio},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use mcp_replay_guard::{
    DEFAULT_MAX_BODY_BYTES, Target,
    relay::{
        Relay, WireQueue,
        lines::{Line, read_line, write_line, write_queue},
    },
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufRead, BufReader},
    process::{Child, ChildStdin, ChildStdout, Command},
    sync::watch,
};
use tracing::Instrument;

use crate::{
    compaction::{self, CompactionOptions},
    options::GuardOptions,
};

/// How long the replayed `initialize` may take on a restarted child.
const INITIALIZE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a child that closed its stdout is given to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// After SIGTERM or SIGINT, how long the calls in flight are given to be answered.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How long the answers owed to the host may take to be written at the end.
const LAST_ANSWERS: Duration = Duration::from_secs(10);

/// A child that lived less than this, `MAX_QUICK_EXITS` times in a row, is not started again.
const QUICK_EXIT: Duration = Duration::from_secs(2);
const MAX_QUICK_EXITS: u32 = 5;

#[derive(Debug, Args)]
pub struct StdioArgs {
    #[command(flatten)]
    pub guard: GuardOptions,
    #[command(flatten)]
    pub on_held: crate::on_held::OnHeldOptions,
    #[command(flatten)]
    pub compaction: CompactionOptions,
    /// Start the server again when it exits (after answering its calls in flight), replaying
    /// the host's `initialize`. Five exits in a row within two seconds of starting end the
    /// wrapper.
    #[arg(long)]
    pub restart: bool,
    /// Also put each dispatch's execution ID into the request's `params._meta`, under
    /// `io.github.mcp-replay-guard/execution-id`, for every tool whose policy entry does not
    /// say otherwise (`execution_id_in_meta`); a server that honours it (the crate's server
    /// half) runs a re-sent call once.
    #[arg(long)]
    pub execution_id_in_meta: bool,
    /// The name of the server in the ledger (default `stdio:<program file name>`). The
    /// arguments never enter it: they may hold secrets.
    #[arg(long, value_name = "NAME")]
    pub target: Option<String>,
    /// The longest line taken from the host or the server, in bytes (at least 1024). A longer
    /// request is refused unsent; a longer answer is not relayed (its call's outcome is
    /// unknown).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_line_bytes: usize,
    /// How long a repeat waits for an attempt of the same execution that is still in flight.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, default_value = "30s")]
    pub attach_timeout: Duration,
    /// Serve `/healthz`, `/readyz` and `/metrics` (Prometheus text) on this address (e.g.
    /// `127.0.0.1:9464`); its address is logged on stderr (stdout is the host's).
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// The server's command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The host's `initialize`, kept to replay on a restarted child.
type Initialize = Arc<Mutex<Option<Bytes>>>;

/// The smallest `--max-line-bytes`: an `initialize` must fit.
const MIN_LINE_BYTES: usize = 1024;

/// Relays until the host or the server ends; `json`: the start line (on stderr: stdout is the
/// host's) as one JSON object.
pub async fn run(args: StdioArgs, json: bool) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.max_line_bytes >= MIN_LINE_BYTES,
        "--max-line-bytes must be at least {MIN_LINE_BYTES} (an initialize must fit); nothing was started"
    );
    let (program, program_args) = args
        .command
        .split_first()
        .context("give the server's command after `--`")?;
    let target = match &args.target {
        Some(target) => target.clone(),
        None => format!(
            "stdio:{}",
            Path::new(program)
                .file_name()
                .unwrap_or(program)
                .to_string_lossy()
        ),
    };
    let contracts = args.guard.contracts(None)?;
    let (layer, _, compacted) = args
        .guard
        .layer_key_and_ledger(contracts, args.attach_timeout)
        .await?;
    let layer = args
        .on_held
        .install(layer, &crate::tls::ClientTls::trusting(None))?;
    if let Some(ledger) = compacted {
        compaction::spawn(&args.compaction, ledger);
    }
    let layer = layer
        .target(Target::from(target.as_str()))
        .execution_id_in_meta(args.execution_id_in_meta)
        .max_body_bytes(args.max_line_bytes);
    let admin = match args.admin_listen {
        Some(address) => Some(serve_admin(address, &args, &layer).await?),
        None => None,
    };
    let max = args.max_line_bytes;
    let (relay, wire_queue, mut client_queue) = Relay::new(&layer);

    // Everything for the host goes out here, one line each, in the order it is ready. An
    // answer written whole and flushed is delivered once the host's next line comes.
    let to_host = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = client_queue.next().await {
            if let Err(error) = write_line(&mut stdout, message.message()).await {
                tracing::warn!(%error, "the host's stdout is closed; answers from now on stay undelivered");
                break;
            }
            message.written();
        }
    });
    let initialize = Initialize::default();
    let (host_done, host_closed) = watch::channel(false);
    let from_host = tokio::spawn(read_host(relay.clone(), initialize.clone(), max, host_done));
    let stopping = stop_on_signal(from_host.abort_handle())?;

    let mut child = Server::start(program, program_args).with_context(|| {
        format!(
            "cannot start the server {}; nothing was sent",
            Path::new(program).display()
        )
    })?;
    say_started(&target, child.child.id(), admin.as_deref(), json);
    let status = supervise(
        &args,
        &relay,
        wire_queue,
        &initialize,
        (host_closed, stopping.clone()),
        &mut child,
    )
    .await;

    // The host gets an answer for every request it sent; then the wrapper ends.
    from_host.abort();
    drop(relay);
    if tokio::time::timeout(LAST_ANSWERS, to_host).await.is_err() {
        tracing::warn!("the host did not take the last answers in time; they stay undelivered");
    }
    let signalled = *stopping.borrow();
    let code = match (signalled, status) {
        (Some(signal), _) => 128 + signal,
        (None, Some(status)) => status
            .code()
            .and_then(|code| u8::try_from(code).ok())
            .unwrap_or(1),
        (None, None) => 1,
    };
    // tokio's stdin reads on a thread of its own that a runtime cannot stop: leave at once,
    // the spans not yet exported sent first.
    tokio::task::spawn_blocking(crate::telemetry::flush_traces)
        .await
        .ok();
    std::process::exit(i32::from(code));
}

/// Serves the admin listener for the life of the wrapper (the metrics recorder installed
/// first, so that no call goes uncounted); its URL.
async fn serve_admin(
    address: std::net::SocketAddr,
    args: &StdioArgs,
    layer: &mcp_replay_guard::guard::GuardLayer,
) -> anyhow::Result<String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on --admin-listen {address}"))?;
    let metrics = crate::telemetry::metrics()?;
    let readiness =
        crate::proxy::admin::Readiness::of(layer, args.guard.ledger.as_ref(), None, metrics);
    let url = format!("http://{}", listener.local_addr()?);
    let forever = tokio_util::sync::CancellationToken::new();
    tokio::spawn(crate::proxy::admin::serve(listener, readiness, forever));
    Ok(url)
}

/// The start line, on stderr: the server relayed, its process, the admin listener.
fn say_started(target: &str, pid: Option<u32>, admin: Option<&str>, json: bool) {
    let line = if json {
        serde_json::json!({"relaying": target, "pid": pid, "admin": admin}).to_string()
    } else {
        let pid = pid.map_or_else(|| "?".to_owned(), |pid| pid.to_string());
        match admin {
            Some(admin) => format!("relaying {target} (pid {pid}); admin listening on {admin}"),
            None => format!("relaying {target} (pid {pid})"),
        }
    };
    // A closed stderr loses the line, never the relay.
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Watches for SIGTERM and SIGINT: the first stops reading the host (`reading`) and is
/// told, by its number, on the channel returned.
fn stop_on_signal(
    reading: tokio::task::AbortHandle,
) -> anyhow::Result<watch::Receiver<Option<u8>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch for SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch for SIGINT")?;
    let (stop, stopping) = watch::channel(None);
    tokio::spawn(async move {
        let number = tokio::select! {
            _ = terminate.recv() => 15,
            _ = interrupt.recv() => 2,
        };
        tracing::warn!(
            signal = number,
            "stopping: no more requests are read; the calls in flight get {SHUTDOWN_GRACE:?} to be answered"
        );
        reading.abort();
        let _ = stop.send(Some(number));
    });
    Ok(stopping)
}

/// Lines from the host, until it closes its stdin.
async fn read_host(
    relay: Relay,
    initialize: Initialize,
    max: usize,
    done: tokio::sync::watch::Sender<bool>,
) {
    let mut stdin = BufReader::new(tokio::io::stdin());
    loop {
        match read_line(&mut stdin, max).await {
            Ok(Some(Line::Message(message))) => {
                if is_initialize(&message) {
                    *initialize.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some(message.clone());
                }
                // A request's span joins the host's trace (`_meta`), and its guarded call in it.
                let span = crate::trace_context::request_span(&http::HeaderMap::new(), &message);
                relay.from_client(message).instrument(span).await;
            }
            Ok(Some(Line::TooLong(prefix))) => relay.client_message_too_large(&prefix, max).await,
            Ok(None) => break,
            Err(error) => {
                tracing::warn!(%error, "reading the host's stdin failed");
                break;
            }
        }
    }
    let _ = done.send(true);
}

/// Whether `message` is an `initialize` request: a JSON object with that method and an id
/// (anything else, an array that happens to hold the word included, is never replayed).
fn is_initialize(message: &[u8]) -> bool {
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(message) else {
        return false;
    };
    message.get("method").and_then(Value::as_str) == Some("initialize")
        && matches!(message.get("id"), Some(Value::String(_) | Value::Number(_)))
}

/// One run of the server process.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    started: Instant,
}

impl Server {
    fn start(program: &OsString, args: &[OsString]) -> std::io::Result<Self> {
        // A process group of its own: the wrapper can end the server and whatever it started,
        // and a terminal's Ctrl-C reaches the wrapper, which decides when the server stops.
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            unreachable!("both pipes were asked for");
        };
        tracing::debug!(pid = child.id(), "the server started");
        Ok(Self {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            started: Instant::now(),
        })
    }

    /// Waits for the child to exit, killing it after a grace period (it closed its stdout
    /// or stopped reading: it can answer nothing more).
    async fn exit(&mut self) -> Option<ExitStatus> {
        drop(self.stdin.take());
        match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = self.child.kill().await;
                self.child.wait().await.ok()
            }
        }
    }

    /// Ends the server's process group: SIGTERM, then SIGKILL after a grace period.
    async fn terminate(&mut self) -> Option<ExitStatus> {
        use nix::{
            sys::signal::{Signal, killpg},
            unistd::Pid,
        };
        drop(self.stdin.take());
        let Some(group) = self.child.id().and_then(|id| i32::try_from(id).ok()) else {
            // Already reaped.
            return self.child.wait().await.ok();
        };
        let group = Pid::from_raw(group);
        let _ = killpg(group, Signal::SIGTERM);
        let status = match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                let _ = killpg(group, Signal::SIGKILL);
                self.child.wait().await.ok()
            }
        };
        // What the server started in its group goes with it.
        let _ = killpg(group, Signal::SIGKILL);
        status
    }
}

/// Why one run of the server ended.
enum Ended {
    /// The server closed its stdout, or writing to its stdin failed: it is gone.
    ServerGone,
    /// The host closed its stdin: the server's stdin is closed too.
    HostClosed,
    /// SIGTERM or SIGINT: the calls in flight are given time to be answered, then the
    /// server's process group is ended.
    Signalled,
}

/// Relays between the host and the child until the host is gone, or the child is and is not
/// to be started again; the last child's exit status.
async fn supervise(
    args: &StdioArgs,
    relay: &Relay,
    mut wire_queue: WireQueue,
    initialize: &Initialize,
    (mut host_closed, mut stopping): (watch::Receiver<bool>, watch::Receiver<Option<u8>>),
    server: &mut Server,
) -> Option<ExitStatus> {
    let max = args.max_line_bytes;
    let mut quick_exits = 0;
    let mut restarts = 0u64;
    loop {
        let ended = match server.stdin.as_mut() {
            Some(stdin) => tokio::select! {
                _ = write_queue(&mut wire_queue, stdin) => Ended::ServerGone,
                _ = read_server(relay, &mut server.stdout, max) => Ended::ServerGone,
                _ = host_closed.wait_for(|closed| *closed) => Ended::HostClosed,
                _ = stopping.wait_for(Option::is_some) => Ended::Signalled,
            },
            None => Ended::ServerGone,
        };
        if matches!(ended, Ended::Signalled) {
            // No more requests are read; those in flight get their answers, up to a bound.
            if let Some(stdin) = server.stdin.as_mut() {
                let answered = async {
                    tokio::select! {
                        _ = write_queue(&mut wire_queue, stdin) => {}
                        _ = read_server(relay, &mut server.stdout, max) => {}
                        _ = relay.answered() => {}
                    }
                };
                if tokio::time::timeout(SHUTDOWN_GRACE, answered)
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "calls still in flight after {SHUTDOWN_GRACE:?}: their outcome is unknown"
                    );
                }
            }
            let status = server.terminate().await;
            relay.server_gone();
            return status;
        }
        drop(server.stdin.take());
        // What the server answered before it went is still in its stdout: read to the end.
        // After the host closed, that is MCP's stdio shutdown (the server sees its stdin close
        // and exits), and the answers to what is still in flight come first.
        match ended {
            Ended::HostClosed => read_server(relay, &mut server.stdout, max).await,
            Ended::ServerGone | Ended::Signalled => {
                let rest = read_server(relay, &mut server.stdout, max);
                let _ = tokio::time::timeout(EXIT_GRACE, rest).await;
            }
        }
        let status = server.exit().await;
        relay.server_gone();
        let lived = server.started.elapsed();
        match status {
            Some(status) => tracing::warn!(%status, ?lived, "the server exited"),
            None => tracing::warn!(?lived, "the server exited; its status is not known"),
        }
        if matches!(ended, Ended::HostClosed)
            || !args.restart
            || *host_closed.borrow()
            || stopping.borrow().is_some()
        {
            return status;
        }
        quick_exits = if lived < QUICK_EXIT {
            quick_exits + 1
        } else {
            0
        };
        if quick_exits >= MAX_QUICK_EXITS {
            tracing::error!(
                exits = quick_exits,
                "the server exited {MAX_QUICK_EXITS} times in a row within {QUICK_EXIT:?} of starting; not starting it again"
            );
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(quick_exits.min(5))).await;
        restarts += 1;
        let (program, program_args) = args.command.split_first()?;
        let replayed = initialize
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match Server::start(program, program_args) {
            Ok(started) => *server = started,
            Err(error) => {
                tracing::error!(%error, "the server could not be started again");
                return status;
            }
        }
        if let Some(initialize) = replayed
            && let Err(error) = replay_initialize(server, &initialize, restarts, max, relay).await
        {
            tracing::error!(%error, "the restarted server did not take the host's initialize");
            // Counted as an exit right after starting: the loop ends it and maybe tries again.
            drop(server.stdin.take());
            continue;
        }
        tracing::warn!(restarts, "the server was started again");
    }
}

/// Lines from the server, to the relay, until its stdout ends.
async fn read_server<R: AsyncBufRead + Unpin>(relay: &Relay, stdout: &mut R, max: usize) {
    loop {
        match read_line(stdout, max).await {
            Ok(Some(Line::Message(message))) => relay.from_server(message).await,
            Ok(Some(Line::TooLong(prefix))) => relay.server_message_too_large(&prefix, max),
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%error, "reading the server's stdout failed");
                return;
            }
        }
    }
}

/// Sends the host's `initialize` to a restarted server under an id of the wrapper's own, waits
/// for its answer (kept from the host, which has its own), and sends
/// `notifications/initialized`. What else the server says meanwhile goes to the host.
async fn replay_initialize(
    server: &mut Server,
    initialize: &[u8],
    restarts: u64,
    max: usize,
    relay: &Relay,
) -> anyhow::Result<()> {
    let id = format!("replay-guard-initialize-{restarts}");
    let Ok(Value::Object(mut message)) = serde_json::from_slice::<Value>(initialize) else {
        anyhow::bail!("the kept initialize is not a JSON object");
    };
    message.insert("id".into(), json!(id));
    let message = Value::Object(message);
    let stdin = server.stdin.as_mut().context("the server has no stdin")?;
    write_line(stdin, message.to_string().as_bytes()).await?;
    let answered = async {
        loop {
            match read_line(&mut server.stdout, max).await? {
                Some(Line::Message(line)) => {
                    let reply: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                    if reply.get("id") == Some(&json!(id)) && reply.get("method").is_none() {
                        if let Some(error) = reply.get("error") {
                            anyhow::bail!("the server refused initialize: {error}");
                        }
                        return Ok(());
                    }
                    relay.from_server(line).await;
                }
                Some(Line::TooLong(_)) => {}
                None => anyhow::bail!("the server closed its stdout before it answered"),
            }
        }
    };
    tokio::time::timeout(INITIALIZE_TIMEOUT, answered)
        .await
        .context("the server did not answer initialize in time")??;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let stdin = server.stdin.as_mut().context("the server has no stdin")?;
    write_line(stdin, initialized.to_string().as_bytes()).await?;
    Ok(())
}
