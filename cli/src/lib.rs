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
//! replay-guard resolve --ledger LEDGER [--key-file PATH] EXECUTION (--applied | --not-applied) --note TEXT
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
mod demo;
#[path = "../../examples/support/deploy_server.rs"]
mod deploy_server;
#[cfg(test)]
mod guide_blocks;
mod inspect;
mod ledger_location;
mod mcp_http;
mod options;
#[doc(hidden)]
pub mod proxy;
mod stdio;
mod tls;

use std::process::ExitCode;

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
    /// shippers. `RUST_LOG` sets the level (default `warn`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
}

#[derive(Debug, Subcommand)]
enum LedgerCommand {
    /// One line per execution.
    List(inspect::ListArgs),
}

/// The form of the log lines on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Text for people (coloured on a terminal).
    Text,
    /// One JSON object per line.
    Json,
}

fn init_logging(format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}

/// The command: parses the arguments, runs what they ask for, and says how it ended.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    init_logging(log_format);
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
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) if log_format == LogFormat::Json => {
            tracing::error!("{error:#}");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// How long `resolve` waits for another process that holds the ledger's lock. The read-only
/// commands (`audit show`, `audit verify`, `ledger list`) take no lock and write nothing.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args, cli.json).await,
        Command::Call(args) => call::run(args, cli.json).await,
        Command::Proxy(args) => proxy::run(args).await,
        Command::Stdio(args) => stdio::run(args).await,
        Command::Audit(AuditCommand::Verify {
            ledger,
            expect_head,
        }) => inspect::verify(ledger, expect_head, cli.json).await,
        Command::Audit(AuditCommand::Head { ledger }) => inspect::head(ledger, cli.json),
        Command::Audit(AuditCommand::Show(args)) => inspect::show(args, cli.json).await,
        Command::Ledger(LedgerCommand::List(args)) => inspect::list(args, cli.json).await,
        Command::Resolve(args) => inspect::settle(args, cli.json).await,
    }
}
