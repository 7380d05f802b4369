//! `GuardedTransport` around an rmcp client transport: a stdio MCP server launched as a child
//! process (`TokioChildProcess`), killed after its side effect and before its answer, then
//! launched again.
//!
//! The server is this repository's `stdio_server` example, which appends a line to a file for
//! every effect. Its first `deploy` hangs after the effect; the example kills it with SIGKILL.
//! The guard answers the call that was in flight with "outcome unknown" (never a made-up
//! failure), and after the restart it holds the same call for review instead of deploying
//! again. One effect.
//!
//! Your own client needs rmcp's `transport-child-process` feature:
//! `rmcp = { version = "3.11", features = ["client", "transport-child-process"] }`.
//! Run with
//! `cargo build --features server --example stdio_server && cargo run --features rmcp,server --example guarded_child_process`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, STRUCTURED_KEY},
    integrations::rmcp::GuardedTransport,
    ledger::MemoryLedger,
};
use rmcp::{
    RoleClient, ServiceExt,
    model::{CallToolRequestParams, CallToolResult},
    service::RunningService,
    transport::TokioChildProcess,
};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Duration = Duration::from_secs(30);

/// The `stdio_server` example, built beside this one.
fn server_binary() -> Result<PathBuf, BoxError> {
    let path = std::env::current_exe()?.with_file_name("stdio_server");
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: build it first with `cargo build --features server --example stdio_server`",
            path.display()
        )
        .into())
    }
}

/// The server as a child process, behind the guard; `fault` is its one-shot fault.
async fn connect(
    guard: &GuardLayer,
    dir: &Path,
    fault: Option<&str>,
) -> Result<RunningService<RoleClient, ()>, BoxError> {
    let mut command = tokio::process::Command::new(server_binary()?);
    command
        .env("EFFECTS_FILE", dir.join("effects"))
        .env("FAULT_ONCE_FILE", dir.join("fault-once"))
        .env("PID_FILE", dir.join("pid"));
    if let Some(fault) = fault {
        command.env("FAULT", fault);
    }
    let child = TokioChildProcess::new(command)?;
    Ok(().serve(GuardedTransport::new(guard, child)).await?)
}

/// What the guard or the server answered: the text, and the state of the guard's record.
fn describe(result: &CallToolResult) -> String {
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map_or("", |t| t.text.as_str());
    let state = result
        .structured_content
        .as_ref()
        .and_then(|s| s[STRUCTURED_KEY]["state"].as_str())
        .unwrap_or("none");
    format!("{text}\n  (record state: {state})")
}

/// Kills the server once it wrote its pid: after the effect, before the answer.
async fn kill_when_hung(pid_file: &Path) -> Result<(), BoxError> {
    let deadline = Instant::now() + WAIT;
    let pid = loop {
        if let Ok(pid) = std::fs::read_to_string(pid_file)
            && !pid.trim().is_empty()
        {
            break pid.trim().to_owned();
        }
        if Instant::now() > deadline {
            return Err("the tool never ran".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let dir = std::env::temp_dir().join(format!("guarded-child-process-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let contracts = ContractRegistry::builder()
        .tool("deploy", ToolContract::irreversible())
        .build()?;
    let guard = GuardLayer::new(MemoryLedger::new(), contracts, FingerprintKey::generate()?)
        .execution_id_in_meta(true);
    let deploy = || {
        CallToolRequestParams::new("deploy").with_arguments(
            json!({"service": "catalog", "version": "2026.07.22"})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        )
    };

    // 1. The server runs the deployment and is killed before it answers.
    let first = connect(&guard, &dir, Some("hang_after_effect")).await?;
    let peer = first.peer().clone();
    let pending = tokio::spawn(async move { peer.call_tool(deploy()).await });
    kill_when_hung(&dir.join("pid")).await?;
    let lost = tokio::time::timeout(WAIT, pending).await???;
    println!("the call in flight got: {}", describe(&lost));
    let _ = first.cancel().await;

    // 2. The host launches the server again and the agent makes the same call.
    let second = connect(&guard, &dir, None).await?;
    let held = tokio::time::timeout(WAIT, second.call_tool(deploy())).await??;
    println!("\nthe repeat got: {}", describe(&held));
    second.cancel().await?;

    let effects = std::fs::read_to_string(dir.join("effects"))?
        .lines()
        .count();
    println!("\ndeployments: {effects}");
    std::fs::remove_dir_all(&dir)?;
    if effects != 1 || lost.is_error != Some(true) || held.is_error != Some(true) {
        return Err(format!("expected 1 deployment and two honest answers, saw {effects}").into());
    }
    Ok(())
}
