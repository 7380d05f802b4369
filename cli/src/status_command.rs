//! `resolve --probe`: the status command a policy names for a tool, asked whether a held
//! execution took effect, before anything is settled.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{Context, bail};
use mcp_replay_guard::{contract::ContractRegistry, execution::ExecutionRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the status command may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The most of its answer that is read and shown.
const MAX_ANSWER: u64 = 4096;

/// What the status command answered: its verdict (`applied`, `not_applied`, `unknown`) and
/// the whole of what it said, as shown to the operator and kept in the resolving event.
#[derive(Debug)]
pub(crate) struct StatusAnswer {
    pub(crate) verdict: String,
    pub(crate) said: String,
}

/// Runs the status command of `record`'s tool in the policy at `policy`, with the execution as
/// JSON on its stdin (the notice a held execution is told with: no arguments, no credentials).
pub(crate) async fn ask(
    policy: Option<&Path>,
    record: &ExecutionRecord,
) -> anyhow::Result<StatusAnswer> {
    let policy = policy.context(
        "--probe runs the status command the policy names for the tool: give --policy FILE",
    )?;
    let registry = ContractRegistry::from_path(policy)
        .with_context(|| format!("cannot read the policy {}", policy.display()))?;
    let argv = registry
        .tools()
        .find(|(tool, _)| *tool == record.tool())
        .and_then(|(_, contract)| contract.status_command_argv())
        .map(<[String]>::to_vec)
        .with_context(|| {
            format!(
                "the policy names no status command for the tool {}: add `status_command = [\"PROGRAM\", …]` to [tools.{}]",
                mcp_replay_guard::ledger::audit::printable(record.tool()),
                mcp_replay_guard::ledger::audit::printable(record.tool()),
            )
        })?;
    let (program, args) = argv.split_first().context("an empty status command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("the status command {program} did not start"))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let notice = crate::on_held::notice(record).to_string();
    let asked = async {
        // A command that does not read its stdin still answers: a closed pipe is no failure.
        let _ = stdin.write_all(notice.as_bytes()).await;
        drop(stdin);
        let mut said = String::new();
        (&mut stdout)
            .take(MAX_ANSWER)
            .read_to_string(&mut said)
            .await?;
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, said))
    };
    let (status, said) = match tokio::time::timeout(TIMEOUT, asked).await {
        Ok(answer) => answer.context("the status command could not be read")?,
        Err(_) => bail!("the status command did not answer within 30 s; nothing was settled"),
    };
    if !status.success() {
        bail!("the status command exited with {status}; nothing was settled");
    }
    let verdict = said.lines().next().unwrap_or_default().trim().to_owned();
    if !matches!(verdict.as_str(), "applied" | "not_applied" | "unknown") {
        bail!(
            "the status command's first line is {:?}, not applied, not_applied or unknown; nothing was settled",
            mcp_replay_guard::ledger::audit::printable(&verdict)
        );
    }
    Ok(StatusAnswer {
        verdict,
        said: said.trim_end().to_owned(),
    })
}
