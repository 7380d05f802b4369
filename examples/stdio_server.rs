//! A stdio MCP server that honours the execution ID in `params._meta`: rmcp's server run
//! in-process on one end of a `tokio::io::duplex`, with `IdempotencyLayer::serve_lines`
//! between it and the process's stdin and stdout.
//!
//! A client (the client guard with `execution_id_in_meta`, say) sends a `tools/call` with
//! `params._meta["io.github.mcp-replay-guard/execution-id"]`, loses the answer, and sends the
//! same call again under the same key: the kept answer comes back, re-keyed to the new
//! JSON-RPC id, and the tool does not run again.
//!
//! Tools: `deploy`, `set_flag` and `charge` each append one line (`deploy {"service":…}`) to the
//! file `EFFECTS_FILE` names, fsynced before the tool answers: that file counts the side
//! effects. `read_flag` has none.
//!
//! Environment:
//!
//! - `LEDGER`: a `FileLedger` path (the key kept beside it); a memory ledger without it.
//! - `EFFECTS_FILE`: where the effects go (required).
//! - `FAULT`, one-shot while the file `FAULT_ONCE_FILE` names does not exist (the fault
//!   creates it; without `FAULT_ONCE_FILE`, every time): `hang_after_effect` (write the pid to
//!   `PID_FILE` after the effect and never answer), `huge_answer` (answer with `HUGE_BYTES`
//!   bytes of text, 8 MiB by default), `garbage` (print `this is not json` on stdout before
//!   serving), `exit_at_once` (exit with code 3 before reading anything).
//! - `ANSWER_DELAY_MS`: after each effect, write the pid to `PID_FILE` (when set) and wait that
//!   long before answering (a call that is in flight for a while).
//!
//! Logs go to stderr; stdout carries only JSON-RPC lines. Run with
//! `EFFECTS_FILE=/tmp/effects cargo run --features server --example stdio_server`.

use std::{
    io::Write,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use mcp_replay_guard::{
    fingerprint::FingerprintKey,
    integrations::server::IdempotencyLayer,
    ledger::{FileLedger, MemoryLedger},
};
use rmcp::{
    ErrorData, ServerHandler, ServiceExt,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig},
    tool, tool_handler, tool_router,
};
use serde::{Deserialize, Serialize};
use tokio::io::{BufReader, duplex, split, stdin, stdout};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The arguments of `deploy`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct DeployArgs {
    /// Service to deploy.
    service: String,
    /// Version to deploy.
    version: String,
}

/// The arguments of `set_flag`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct SetFlagArgs {
    /// The flag.
    name: String,
    /// Its new value.
    value: bool,
}

/// The arguments of `charge`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The account charged.
    account: String,
    /// How much, in cents.
    cents: u64,
}

/// The arguments of `read_flag`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
struct ReadFlagArgs {
    /// The flag.
    name: String,
}

/// Whether the fault `name` is to happen now: `FAULT` names it, and it has not happened yet
/// (the file `FAULT_ONCE_FILE` names is created by the first one).
fn fault(name: &str) -> bool {
    if std::env::var("FAULT").ok().as_deref() != Some(name) {
        return false;
    }
    match std::env::var_os("FAULT_ONCE_FILE") {
        None => true,
        Some(once) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(once)
            .is_ok(),
    }
}

#[derive(Clone)]
struct Tools {
    effects: PathBuf,
    /// One effect written at a time, each line whole.
    writing: Arc<Mutex<()>>,
}

#[tool_router]
impl Tools {
    fn new(effects: PathBuf) -> Self {
        Self {
            effects,
            writing: Arc::default(),
        }
    }

    /// Appends `<tool> <args json>` to the effects file and fsyncs it; then the faults that
    /// come after an effect.
    async fn effect(&self, tool: &str, args: &impl Serialize) -> Result<String, ErrorData> {
        let args = serde_json::to_string(args).map_err(|e| internal(&e))?;
        let line = format!("{tool} {args}\n");
        {
            let _writing = self
                .writing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.effects)
                .map_err(|e| internal(&e))?;
            file.write_all(line.as_bytes()).map_err(|e| internal(&e))?;
            file.sync_all().map_err(|e| internal(&e))?;
        }
        tracing::info!(tool, %args, "effect written");
        if fault("hang_after_effect") {
            if let Some(pid_file) = std::env::var_os("PID_FILE") {
                let _ = std::fs::write(pid_file, std::process::id().to_string());
            }
            tracing::warn!("FAULT=hang_after_effect: never answering");
            std::future::pending::<()>().await;
        }
        if let Some(delay) = std::env::var("ANSWER_DELAY_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
        {
            if let Some(pid_file) = std::env::var_os("PID_FILE") {
                let _ = std::fs::write(pid_file, std::process::id().to_string());
            }
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        if fault("huge_answer") {
            let bytes = std::env::var("HUGE_BYTES")
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(8 << 20);
            tracing::warn!(bytes, "FAULT=huge_answer");
            return Ok("x".repeat(bytes));
        }
        Ok(format!("{tool} {args}: done"))
    }

    #[tool(
        description = "Deploy a release of a service (irreversible)",
        annotations(destructive_hint = true, idempotent_hint = false)
    )]
    async fn deploy(
        &self,
        Parameters(args): Parameters<DeployArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = self.effect("deploy", &args).await?;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    #[tool(
        description = "Set a feature flag (idempotent)",
        annotations(destructive_hint = false, idempotent_hint = true)
    )]
    async fn set_flag(
        &self,
        Parameters(args): Parameters<SetFlagArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = self.effect("set_flag", &args).await?;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    #[tool(
        description = "Charge an account",
        annotations(destructive_hint = true, idempotent_hint = false)
    )]
    async fn charge(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let text = self.effect("charge", &args).await?;
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    #[tool(
        description = "Read a feature flag (no side effect)",
        annotations(read_only_hint = true)
    )]
    async fn read_flag(
        &self,
        Parameters(args): Parameters<ReadFlagArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let effects = std::fs::read_to_string(&self.effects).unwrap_or_default();
        let value = effects
            .lines()
            .rev()
            .filter_map(|line| line.strip_prefix("set_flag "))
            .filter_map(|json| serde_json::from_str::<SetFlagArgs>(json).ok())
            .find(|set| set.name == args.name)
            .is_some_and(|set| set.value);
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "{} is {value}",
            args.name
        ))]))
    }
}

fn internal(error: &dyn std::error::Error) -> ErrorData {
    ErrorData::internal_error(error.to_string(), None)
}

#[tool_handler]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    if fault("exit_at_once") {
        tracing::warn!("FAULT=exit_at_once");
        std::process::exit(3);
    }
    let effects = std::env::var_os("EFFECTS_FILE").ok_or("EFFECTS_FILE is not set")?;
    let layer = match std::env::var_os("LEDGER") {
        Some(path) => {
            let ledger = FileLedger::open(PathBuf::from(path))?;
            let key = ledger.fingerprint_key()?;
            IdempotencyLayer::new(ledger, key)
        }
        None => IdempotencyLayer::new(MemoryLedger::new(), FingerprintKey::generate()?),
    };
    if fault("garbage") {
        let mut out = std::io::stdout().lock();
        out.write_all(b"this is not json\n")?;
        out.flush()?;
    }

    // The rmcp server on one end of an in-process pipe; the layer between the other end and
    // stdio.
    let (server_end, relay_end) = duplex(64 * 1024);
    let tools = Tools::new(PathBuf::from(effects));
    let server = tokio::spawn(async move {
        match tools.serve(server_end).await {
            Ok(running) => {
                let _ = running.waiting().await;
            }
            Err(error) => tracing::error!(%error, "the MCP server did not start"),
        }
    });
    let (from_server, to_server) = split(relay_end);
    layer
        .serve_lines(
            (BufReader::new(stdin()), stdout()),
            (BufReader::new(from_server), to_server),
        )
        .await?;
    tracing::info!("stdin ended; shutting down");
    let _ = server.await;
    Ok(())
}
