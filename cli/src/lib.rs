//! `replay-guard`: the guard as a command, a sidecar proxy, and the tools to inspect and
//! settle its ledger.
//!
//! ```text
//! replay-guard demo                          # the main job on an embedded server: exit 0 iff the guard deployed once
//! replay-guard call --url URL --tool NAME --args JSON [--ledger LEDGER [--key-file PATH]] [--policy FILE] [--class C] [--ca-cert PEM] …
//! replay-guard proxy --listen ADDR --upstream URL [--ledger LEDGER [--key-file PATH]] [--policy FILE] [--ca-cert PEM] [--tls-cert PEM --tls-key PEM] [--actor-header NAME | --actor A | --credential-header NAME …] [--allowed-host H …] [--allowed-origin O …] [--header K:V …]
//! replay-guard stdio [--ledger LEDGER [--key-file PATH]] [--policy FILE] [--restart] [--execution-id-in-meta] -- COMMAND [ARGS…]
//! replay-guard audit verify --ledger LEDGER [--expect-head SEQ:HASH]  # exit 0: "ok: N events, head sha256:…"; exit 1 names the first bad seq
//! replay-guard audit head --ledger PATH      # the head to anchor elsewhere: SEQ:sha256:HEX
//! replay-guard audit show --ledger LEDGER [EXECUTION]  # the investigation timeline (all executions without an id)
//! replay-guard ledger list --ledger LEDGER [--state S]  # one line per execution
//! replay-guard ledger compact --ledger LEDGER  # a file: archived, what is retained kept; PostgreSQL: expired executions purged
//! replay-guard resolve --ledger LEDGER [--key-file PATH] EXECUTION [--probe …] (--applied | --not-applied) --note TEXT
//! replay-guard review --ledger LEDGER [--listen 127.0.0.1:8080] [--token-file PATH]  # the held queue as a web page, with a resolve form
//! ```
//!
//! LEDGER is a file or a PostgreSQL database (`postgres://user@host/db`, `?schema=NAME`): see
//! `ledger_location`. The reading commands and `resolve` also take it positionally, first, the
//! form scripts used before `--ledger`.
//!
//! `audit verify`, `audit show` and `ledger list` only read a file: they write nothing (no
//! recovery line, no cut tail) and work on a file they cannot write.
//!
//! Every command takes `--json` for scripts. Exit codes: 0 done, 1 the call failed or the
//! ledger does not verify, 2 usage or an error before anything was sent (the message says what
//! to do next), 3 (`call`) the outcome is unknown, held for review, or still in progress.

mod call;
mod call_lines;
mod compact;
mod compaction;
mod demo;
#[path = "../../examples/support/deploy_server.rs"]
mod deploy_server;
#[cfg(test)]
mod guide_blocks;
mod inspect;
mod ledger_location;
mod mcp_http;
mod on_held;
mod options;
mod probe;
#[doc(hidden)]
pub mod proxy;
mod queue;
mod review;
mod status_command;
mod stdio;
mod telemetry;
mod tls;
mod trace_context;

use std::{io::Write as _, process::ExitCode};

use clap::{Parser, Subcommand};
use inspect::AuditCommand;

#[derive(Debug, Parser)]
#[command(
    name = "replay-guard",
    version,
    about = "Guard MCP tool calls against repeated side effects; inspect and settle the ledger"
)]
struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How log lines on stderr are written: `json` is one JSON object per line, for log
    /// shippers. `RUST_LOG` sets what is written (default: warnings, the command's own news
    /// and one line per guarded call, `warn,replay_guard=info,mcp_replay_guard::call=info`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Export traces over OTLP/HTTP to this collector (its base URL; `/v1/traces` is added).
    /// Without it, `OTEL_EXPORTER_OTLP_ENDPOINT` when set; else nothing is exported.
    #[arg(long, global = true, value_name = "URL")]
    otlp_endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up and matched once: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Show the main job on an embedded server: a lost response, a generic retry (2
    /// deployments) and the guard (1 deployment).
    Demo(demo::DemoArgs),
    /// Make one guarded `tools/call` and print its result (exit 0, 1, 2 or 3).
    Call(call::CallArgs),
    /// Run a Streamable HTTP reverse proxy that guards every MCP client behind it.
    Proxy(proxy::ProxyArgs),
    /// Guard a stdio MCP server: run it as a child and relay its JSON-RPC lines, guarding
    /// every `tools/call` (an MCP host launches this in place of the server).
    Stdio(stdio::StdioArgs),
    /// Check and read the audit trail.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// List executions.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Settle an execution held for review, as an operator.
    Resolve(inspect::ResolveArgs),
    /// Serve a web page over a ledger: the held queue, each execution's timeline, and a
    /// form that resolves it with the token given at start-up (loopback only by default).
    Review(review::ReviewArgs),
}

#[derive(Debug, Subcommand)]
enum LedgerCommand {
    /// One line per execution.
    List(inspect::ListArgs),
    /// Keep the ledger small: a file is archived and a new one starts with only the
    /// executions still retained (safe while other processes use it), and what was kept,
    /// dropped and archived is printed; a PostgreSQL ledger's expired executions are purged.
    Compact(compact::CompactArgs),
}

/// The form of the log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Text for people (coloured on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

/// The command: parses the arguments, runs what they ask for, and says how it ended.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    let log_format = cli.log_format;
    let telemetry = telemetry::init(log_format, cli.otlp_endpoint.as_deref());
    let code = run_to_end(cli, log_format);
    telemetry.shut_down();
    code
}

/// A command line clap refused (or `--help`, `--version`): printed as clap prints it, and with
/// `--json` anywhere on it, as one JSON error object on stdout too.
fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    // Help and version are answers, not errors.
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    let _ = error.print();
    let json = std::env::args_os().any(|arg| arg == "--json");
    let message = error.render().to_string();
    let first = message.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    say_failed(first, 2, false, json)
}

/// Runs the command on a runtime of its own and says how it ended.
fn run_to_end(cli: Cli, log_format: LogFormat) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::from(2);
        }
    };
    let json = cli.json;
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            let message = format!("{error:#}");
            if log_format == LogFormat::Json {
                tracing::error!("{message}");
            } else {
                eprintln!("error: {message}");
            }
            say_failed(&message, 2, false, json)
        }
    }
}

/// An error exit: with `--json`, one object on stdout as well as the text on stderr, in the
/// shape of `call`'s answers: `{"outcome": "error", "exit_code", "message", "sent"}` (`sent`:
/// whether anything may have reached a server).
pub(crate) fn say_failed(message: &str, exit_code: u8, sent: bool, json: bool) -> ExitCode {
    if json {
        let line = serde_json::json!({
            "outcome": "error",
            "exit_code": exit_code,
            "message": message,
            "sent": sent,
        });
        // Nothing more can be said when stdout is closed: the exit code still says it.
        let _ = writeln!(std::io::stdout(), "{line}");
    }
    ExitCode::from(exit_code)
}

/// How long `resolve` waits for another process that holds the ledger's lock. The read-only
/// commands (`audit show`, `audit verify`, `ledger list`) take no lock and write nothing.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args, cli.json).await,
        Command::Call(args) => call::run(args, cli.json).await,
        Command::Proxy(args) => proxy::run(args, cli.json).await,
        Command::Stdio(args) => stdio::run(args, cli.json).await,
        Command::Audit(AuditCommand::Verify {
            ledger,
            expect_head,
        }) => inspect::verify(ledger, expect_head, cli.json).await,
        Command::Audit(AuditCommand::Head { ledger }) => inspect::head(ledger, cli.json),
        Command::Audit(AuditCommand::Show(args)) => inspect::show(args, cli.json).await,
        Command::Ledger(LedgerCommand::Compact(args)) => compact::run(args, cli.json).await,
        Command::Ledger(LedgerCommand::List(args)) => inspect::list(args, cli.json).await,
        Command::Resolve(args) => inspect::settle(args, cli.json).await,
        Command::Review(args) => review::run(args, cli.json).await,
    }
}
