//! `replay-guard`: the guard as a command, a sidecar proxy, and the tools to inspect and
//! settle its ledger.
//!
//! ```text
//! replay-guard demo                          # the main job on an embedded server: exit 0 iff the guard deployed once
//! replay-guard call --url URL --tool NAME --args JSON [--ledger PATH] [--policy FILE] [--class C] [--ca-cert PEM] …
//! replay-guard proxy --listen ADDR --upstream URL [--ledger PATH] [--policy FILE] [--ca-cert PEM] [--tls-cert PEM --tls-key PEM] [--actor-header NAME | --actor A | --credential-header NAME …] [--allowed-host H …] [--allowed-origin O …] [--header K:V …]
//! replay-guard stdio [--ledger PATH] [--policy FILE] [--restart] [--execution-id-in-meta] -- COMMAND [ARGS…]
//! replay-guard audit verify PATH [--expect-head SEQ:HASH]  # exit 0: "ok: N events, head sha256:…"; exit 1 names the first bad seq
//! replay-guard audit head PATH               # the head to anchor elsewhere: SEQ:sha256:HEX
//! replay-guard audit show PATH [EXECUTION]   # the investigation timeline (all executions without an id)
//! replay-guard ledger list PATH [--state S]  # one line per execution
//! replay-guard resolve PATH EXECUTION (--applied | --not-applied) --note TEXT
//! ```
//!
//! `audit verify`, `audit show` and `ledger list` only read: they write nothing (no recovery
//! line, no cut tail) and work on a file they cannot write.
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
mod mcp_http;
mod options;
#[doc(hidden)]
pub mod proxy;
mod stdio;
mod tls;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use mcp_replay_guard::{
    ExecutionId,
    execution::ExecutionState,
    guard::resolve,
    ledger::{FileLedger, Ledger, audit, chain::ChainHead, verify_file, verify_file_anchored},
};

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
    Resolve(ResolveArgs),
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Verify the hash chain of a ledger file, through the archives its compactions left
    /// (`<ledger>.<seq>.archive`), and optionally that it still holds an anchored head.
    ///
    /// Without an anchor the chain cannot show a tail that was cut, or a file rewritten and
    /// re-sealed as a whole: keep the head (`audit head`, or the `ledger head` lines the guard
    /// logs at info level) somewhere else and check it with `--expect-head`.
    Verify {
        #[command(flatten)]
        ledger: LedgerFile,
        /// A head recorded earlier (`SEQ:sha256:HEX`, as `audit head` prints it): line SEQ must
        /// still have that hash, and the chain must verify through it.
        #[arg(long, value_name = "SEQ:HASH")]
        expect_head: Option<ChainHead>,
    },
    /// Print the head of a ledger that verifies (`SEQ:sha256:HEX`), to keep as an anchor.
    Head {
        #[command(flatten)]
        ledger: LedgerFile,
    },
    /// The investigation timeline of one execution, or of every execution.
    Show {
        /// The ledger file.
        path: PathBuf,
        /// The execution (`act_…`).
        execution: Option<ExecutionId>,
    },
}

/// The ledger file an audit command reads: positional or `--ledger`.
#[derive(Debug, Args)]
struct LedgerFile {
    /// The ledger file.
    #[arg(required_unless_present = "ledger", value_name = "PATH")]
    path: Option<PathBuf>,
    /// The ledger file (the same as the positional PATH).
    #[arg(long = "ledger", value_name = "PATH", conflicts_with = "path")]
    ledger: Option<PathBuf>,
}

impl LedgerFile {
    fn path(self) -> anyhow::Result<PathBuf> {
        let path = self
            .ledger
            .or(self.path)
            .context("give the ledger file (PATH or --ledger PATH)")?;
        existing(&path)?;
        Ok(path)
    }
}

#[derive(Debug, Subcommand)]
enum LedgerCommand {
    /// One line per execution.
    List {
        /// The ledger file.
        path: PathBuf,
        /// Only executions in this state (as the record reads: `needs_review`,
        /// `completed_result_not_delivered`, …).
        #[arg(long)]
        state: Option<String>,
    },
}

#[derive(Debug, Args)]
struct ResolveArgs {
    /// The ledger file.
    path: PathBuf,
    /// The execution (`act_…`).
    execution: ExecutionId,
    /// The action took effect.
    #[arg(
        long,
        conflicts_with = "not_applied",
        required_unless_present = "not_applied"
    )]
    applied: bool,
    /// The action did not take effect (a repeat of the intent may run it).
    #[arg(long)]
    not_applied: bool,
    /// What the operator checked.
    #[arg(long)]
    note: String,
    /// Who resolves it.
    #[arg(long, default_value = "operator")]
    operator: String,
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

fn existing(path: &Path) -> anyhow::Result<()> {
    if !path.exists() {
        bail!(
            "no ledger at {}: give the path of a ledger file written by the guard",
            path.display()
        );
    }
    Ok(())
}

// Longer than most functions: one `match` arm per subcommand, each a few lines.
async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Demo(args) => demo::run(args, cli.json).await,
        Command::Call(args) => call::run(args, cli.json).await,
        Command::Proxy(args) => proxy::run(args).await,
        Command::Stdio(args) => stdio::run(args).await,
        Command::Audit(AuditCommand::Verify {
            ledger,
            expect_head,
        }) => {
            let path = ledger.path()?;
            let report = verify_file_anchored(&path, expect_head)
                .with_context(|| format!("verifying {}", path.display()))?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", audit::printable(&report.to_string()));
            }
            Ok(if report.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Command::Audit(AuditCommand::Head { ledger }) => {
            let path = ledger.path()?;
            let report =
                verify_file(&path).with_context(|| format!("verifying {}", path.display()))?;
            if !report.is_ok() {
                eprintln!(
                    "error: {} does not verify, so it has no head to anchor: {}",
                    path.display(),
                    audit::printable(&report.to_string())
                );
                return Ok(ExitCode::from(1));
            }
            let head = report.head();
            if cli.json {
                let json = serde_json::json!({
                    "head": head,
                    "seq": head.seq,
                    "hash": head.hash,
                });
                println!("{}", serde_json::to_string_pretty(&json)?);
            } else {
                println!("{head}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(AuditCommand::Show { path, execution }) => {
            existing(&path)?;
            let ledger = FileLedger::open_read_only(&path)?;
            let ids = match execution {
                Some(id) => vec![id],
                None => ledger
                    .list()
                    .await?
                    .into_iter()
                    .map(|r| r.execution_id())
                    .collect(),
            };
            for id in ids {
                let events = ledger.events(id).await?;
                if events.is_empty() {
                    bail!(
                        "no execution {id} in {}: `replay-guard ledger list {}` shows the ones there are",
                        path.display(),
                        path.display()
                    );
                }
                let timeline = audit::Timeline::of(id, events);
                if cli.json {
                    println!("{}", serde_json::to_string_pretty(&timeline)?);
                } else {
                    println!("{timeline}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ledger(LedgerCommand::List { path, state }) => {
            existing(&path)?;
            let ledger = FileLedger::open_read_only(&path)?;
            let records = ledger.list().await?;
            let records: Vec<_> = records
                .into_iter()
                .filter(|r| {
                    state
                        .as_deref()
                        .is_none_or(|s| r.state_label() == s || r.state().as_str() == s)
                })
                .collect();
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&records)?);
            } else {
                for r in &records {
                    // Read-only: an orphaned dispatch is not marked `unknown` here (the next
                    // process that writes does it); say so rather than hide it.
                    let label = if r.state() == ExecutionState::Dispatched
                        && !ledger.is_owner_alive(r.owner()).await
                    {
                        "dispatched (owner gone)".to_owned()
                    } else {
                        r.state_label().to_string()
                    };
                    println!(
                        "{}  {:<32} {:<14} {:<20} accepted {}",
                        r.execution_id(),
                        label,
                        r.retry_class(),
                        audit::printable(r.tool()),
                        r.accepted_at()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Resolve(args) => {
            existing(&args.path)?;
            let ledger = FileLedger::open_with_lock_timeout(&args.path, LOCK_TIMEOUT)?;
            let record = resolve(&ledger, args.execution, args.applied, &format!("operator:{}", args.operator), &args.note)
                .await
                .with_context(|| format!("resolving {} (only an execution that is unknown or needs review can be resolved; `replay-guard audit show` tells where it stands)", args.execution))?;
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&record)?);
            } else {
                println!("{} is now {}", record.execution_id(), record.state_label());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
