//! An MCP tool that ends in a remote command over SSH, run under a marker on the host:
//! `restart_service {"service": "nginx"}` runs `systemctl restart nginx` on one pinned host.
//!
//! The execution ID comes from the call's `params._meta`
//! (`io.github.mcp-replay-guard/execution-id`, as the client guard sends it with
//! `execution_id_in_meta`). The tool reads the marker of that execution before it sends
//! anything: a repeat of a call whose answer was lost gets the recorded outcome back, a call
//! still running on the host is reported as such, and a command whose process died without a
//! recorded exit status is an error that asks for review. Only "no marker" runs the command.
//! A call without an execution ID is refused: an unmarked remote command would be irreversible.
//!
//! On the client side the tool is recoverable, with the same marker as its status probe:
//!
//! ```ignore
//! ToolContract::recoverable().status_probe(MarkerProbe::new(ssh_config))
//! ```
//!
//! Environment: `SSH_HOST`, `SSH_PORT` (22), `SSH_USER`, `SSH_KEY` (a private key file),
//! `SSH_HOST_FINGERPRINT` (`SHA256:…`, from `ssh-keygen -lf` on the host's key). Serves MCP on
//! stdin/stdout:
//! `cargo run --features ssh --example ssh_restart_service`.

use mcp_replay_guard::{
    EXECUTION_ID_META_KEY, ExecutionId,
    integrations::ssh::{
        HostKeyPin, MarkedCommand, MarkerStatus, SshConfig, read_marker, run_marked, sh_quote,
    },
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler, ServiceExt,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig},
    service::RequestContext,
    tool, tool_handler, tool_router,
};
use serde::Deserialize;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The arguments of `restart_service`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct RestartArgs {
    /// The systemd unit to restart.
    service: String,
}

#[derive(Clone)]
struct Tools {
    ssh: SshConfig,
}

#[tool_router]
impl Tools {
    #[tool(
        description = "Restart a systemd service on the host (runs under a marker; a repeat reads it)",
        annotations(destructive_hint = true, idempotent_hint = false)
    )]
    async fn restart_service(
        &self,
        Parameters(args): Parameters<RestartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let id: ExecutionId = ctx
            .meta
            .0
            .0
            .get(EXECUTION_ID_META_KEY)
            .and_then(|v| v.as_str())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    format!("no execution ID in _meta[{EXECUTION_ID_META_KEY}]: refusing to run an unmarked remote command"),
                    None,
                )
            })?;
        let service = sh_quote(&args.service).map_err(|e| internal(&e))?;
        let command = MarkedCommand::new(format!("systemctl restart {service}"));
        let session = self.ssh.connect().await.map_err(|e| internal(&e))?;
        // On reconnect, the marker first: never a blind re-send.
        let record = match read_marker(&session, id, None)
            .await
            .map_err(|e| internal(&e))?
        {
            MarkerStatus::Absent => run_marked(&session, id, &command)
                .await
                .map_err(|e| internal(&e))?,
            MarkerStatus::Exited(record) => record,
            MarkerStatus::Running { .. } => {
                return Ok(CallToolResult::success(vec![ContentBlock::text(format!(
                    "execution {id} is still running on the host; ask again later"
                ))]));
            }
            other => {
                return Err(ErrorData::internal_error(
                    format!(
                        "execution {id} needs review: {:?}",
                        other.to_probe_outcome()
                    ),
                    None,
                ));
            }
        };
        let text = format!(
            "systemctl restart {} exited with {}\n{}",
            args.service,
            record.exit_status,
            String::from_utf8_lossy(&record.stderr)
        );
        Ok(if record.exit_status == 0 {
            CallToolResult::success(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::error(vec![ContentBlock::text(text)])
        })
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

fn env(name: &str) -> Result<String, BoxError> {
    std::env::var(name).map_err(|_| format!("{name} is not set (see the example's docs)").into())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let port = std::env::var("SSH_PORT").map_or(Ok(22), |p| p.parse())?;
    let ssh = SshConfig::new(
        env("SSH_HOST")?,
        port,
        env("SSH_USER")?,
        HostKeyPin::fingerprint(env("SSH_HOST_FINGERPRINT")?),
    )
    .private_key_file(env("SSH_KEY")?)?;
    let running = Tools { ssh }
        .serve((tokio::io::stdin(), tokio::io::stdout()))
        .await?;
    running.waiting().await?;
    Ok(())
}
