//! `resolve --probe`: which probe asks whether a held execution took effect, before anything
//! is settled, and its answer in the words the operator sees and the ledger keeps.
//!
//! One rule chooses, from the record alone:
//! 1. the execution became an MCP task (its task id is known) → `tasks/get` for that task at
//!    its target, read as the guard reads its own probe ([`task_outcome`]);
//! 2. its target is an SSH host key (`SHA256:…`, how the SSH integration names a host) → the
//!    marker of the execution on that host ([`MarkerProbe`]), trusting only that key;
//! 3. otherwise the status command the policy names for the tool ([`status_command`]).

use std::{path::PathBuf, time::Duration};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    ExecutionId,
    contract::ProbeOutcome,
    execution::ExecutionRecord,
    integrations::ssh::{HostKeyPin, MarkerProbe, SshConfig},
    ledger::audit::printable,
    protocol::{self, RequestId},
    tools::{redact_url, task_outcome},
};
use serde_json::json;

use crate::{
    mcp_http::{self, Endpoint, ProtocolChoice, Reply},
    status_command::{self, StatusAnswer},
    tls::{self, ClientTls},
};

/// How long a probe may take, from the first connection to its answer.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a probe's result that is shown and kept.
const MAX_RESULT: usize = 1024;

/// What `resolve --probe` needs to reach the built-in probes.
#[derive(Debug, clap::Args)]
pub(crate) struct ProbeArgs {
    /// The policy file that names the tool's status command (for --probe, when neither
    /// built-in probe applies).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// For an execution that became an MCP task: its MCP endpoint (`http://…` or `https://…`),
    /// whose host, port and path must be the execution's target (the target is recorded
    /// without its scheme). Not needed when the target is a URL.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// For `tasks/get`: an extra request header, `'Name: value'` (repeatable). Never recorded
    /// or printed.
    #[arg(long = "header", value_name = "'K: V'")]
    headers: Vec<String>,
    /// For `tasks/get`: the protocol era to speak.
    #[arg(long, value_enum, default_value = "auto")]
    protocol: ProtocolChoice,
    #[command(flatten)]
    tls: ClientTls,
    /// For an execution on an SSH host: the host to connect to, `HOST[:PORT]` (port 22 by
    /// default). Only the host key the execution's target names is trusted.
    #[arg(long, value_name = "HOST[:PORT]")]
    ssh_host: Option<String>,
    /// For an SSH host: the account the command ran as.
    #[arg(long, value_name = "NAME")]
    ssh_user: Option<String>,
    /// For an SSH host: the account's private key (an unencrypted OpenSSH file).
    #[arg(long, value_name = "PATH")]
    ssh_key: Option<PathBuf>,
    /// For an SSH host: the marker state directory the command ran with (the default one
    /// without it).
    #[arg(long, value_name = "DIR")]
    ssh_state_dir: Option<String>,
}

/// The probe the rule chose.
enum Probe<'a> {
    Task { url: Uri, task_id: &'a str },
    Marker { host_key: &'a str },
    Command,
}

/// Asks the probe the rule chooses for `record`, bounded by [`TIMEOUT`].
pub(crate) async fn ask(args: &ProbeArgs, record: &ExecutionRecord) -> anyhow::Result<Answer> {
    let (by, answer) = match choose(args, record)? {
        Probe::Task { url, task_id } => ("tasks/get", ask_task(args, url, task_id).await?),
        Probe::Marker { host_key } => (
            "the SSH marker",
            ask_marker(args, host_key, record.execution_id()).await?,
        ),
        Probe::Command => (
            "the status command",
            status_command::ask(args.policy.as_deref(), record)
                .await
                .map_err(|e| e.context(NONE_APPLIES))?,
        ),
    };
    Ok(Answer { by, answer })
}

/// What a probe answered, and which probe it was.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) by: &'static str,
    pub(crate) answer: StatusAnswer,
}

const NONE_APPLIES: &str = "--probe asks tasks/get for an execution that became an MCP task, \
    the marker on the host for one whose target is an SSH host key (SHA256:…), and otherwise \
    the status command the policy names for the tool (`status_command` in --policy FILE)";

fn choose<'a>(args: &ProbeArgs, record: &'a ExecutionRecord) -> anyhow::Result<Probe<'a>> {
    let target = record.target().as_str();
    if let Some(task_id) = record.correlation().task_id.as_deref() {
        return Ok(Probe::Task {
            url: task_url(args.url.as_deref(), target)?,
            task_id,
        });
    }
    if target.starts_with("SHA256:") {
        return Ok(Probe::Marker { host_key: target });
    }
    Ok(Probe::Command)
}

/// The URL a task is asked at: the target when it is an http(s) URL, else `--url`, whose host,
/// port and path must be the target (the task id means nothing to another server).
fn task_url(url: Option<&str>, target: &str) -> anyhow::Result<Uri> {
    let is_http = |uri: &Uri| matches!(uri.scheme_str(), Some("http" | "https"));
    if let Ok(uri) = target.parse::<Uri>()
        && is_http(&uri)
        && url.is_none()
    {
        return Ok(uri);
    }
    let Some(url) = url else {
        bail!(
            "the execution became an MCP task: --probe asks its target {} with tasks/get; give \
             --url http(s)://{} (the target is recorded without its scheme)",
            printable(target),
            printable(target)
        );
    };
    let shown = redact_url(url);
    let uri: Uri = url
        .parse()
        .with_context(|| format!("--url {shown:?} is not a URL"))?;
    let (uri, had_userinfo) = mcp_http::without_userinfo(uri).context("--url")?;
    if had_userinfo {
        eprintln!("warning: {}", mcp_http::USERINFO_NOT_SENT);
    }
    let port = uri.port().map(|p| format!(":{p}")).unwrap_or_default();
    let names = format!("{}{port}{}", uri.host().unwrap_or(""), uri.path());
    if !is_http(&uri) || (names != target && uri != *target) {
        bail!(
            "--url {shown} is not the execution's target {}: the task is asked where it was \
             created (give --url http(s)://{})",
            printable(target),
            printable(target)
        );
    }
    Ok(uri)
}

/// `tasks/get` for `task_id` at `url`, after the handshake of the era `--protocol` chooses.
async fn ask_task(args: &ProbeArgs, url: Uri, task_id: &str) -> anyhow::Result<StatusAnswer> {
    let shown = redact_url(&url.to_string());
    let connector = args.tls.connector(&url, "--url")?;
    let mut client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(connector);
    let mut endpoint = Endpoint::new(url, mcp_http::parse_headers(&args.headers)?);
    let probe_id = format!("replay-guard-probe-{}", ExecutionId::new().ulid());
    let asked = async {
        endpoint.open(&mut client, args.protocol).await?;
        let mut request = endpoint.post(json!({
            "jsonrpc": "2.0", "id": probe_id, "method": "tasks/get",
            "params": {"taskId": task_id},
        }));
        if endpoint.is_stateless() {
            let headers = request.headers_mut();
            headers.insert(protocol::MCP_METHOD, HeaderValue::from_static("tasks/get"));
            headers.insert(protocol::MCP_NAME, protocol::encode_header_value(task_id));
        }
        let response = mcp_http::send(&mut client, request).await?;
        let reply = mcp_http::read_reply(response, &json!(probe_id)).await?;
        if let Some(delete) = endpoint.delete() {
            let _ = mcp_http::send(&mut client, delete).await;
        }
        Ok::<_, mcp_http::BoxError>(reply)
    };
    let reply = match tokio::time::timeout(TIMEOUT, asked).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(error)) => bail!(
            "tasks/get could not be asked at {shown}: {}; nothing was settled. {}",
            mcp_http::describe(&*error),
            tls::hint(&*error).unwrap_or("Check --url, that the server runs, and --protocol")
        ),
        Err(_) => bail!("{shown} did not answer tasks/get within 30 s; nothing was settled"),
    };
    let asked = format!("tasks/get of task {} at {shown}", printable(task_id));
    let outcome = match reply {
        Reply::Message(message) => task_outcome(
            &serde_json::to_vec(&message)?,
            &RequestId::String(probe_id),
            task_id,
            if endpoint.is_stateless() {
                protocol::Era::Stateless
            } else {
                protocol::Era::Sessions
            },
        ),
        Reply::Http { status, .. } => ProbeOutcome::Unknown {
            reason: format!("the server answered with HTTP {status}"),
        },
        Reply::Accepted => ProbeOutcome::Unknown {
            reason: "the server answered with 202 and no result".into(),
        },
    };
    Ok(said(&asked, outcome))
}

/// The marker of `execution` on the host `--ssh-host` names, trusting only `host_key`.
async fn ask_marker(
    args: &ProbeArgs,
    host_key: &str,
    execution: ExecutionId,
) -> anyhow::Result<StatusAnswer> {
    let needs = |flag: &str| {
        format!(
            "the execution ran on the SSH host whose key is {}: --probe reads its marker there; \
             give {flag} (with --ssh-host HOST[:PORT], --ssh-user NAME and --ssh-key PATH)",
            printable(host_key)
        )
    };
    let host = args
        .ssh_host
        .as_deref()
        .with_context(|| needs("--ssh-host"))?;
    let user = args
        .ssh_user
        .as_deref()
        .with_context(|| needs("--ssh-user"))?;
    let key = args
        .ssh_key
        .as_deref()
        .with_context(|| needs("--ssh-key"))?;
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') || name.starts_with('[') => {
            let port = port
                .parse()
                .with_context(|| format!("--ssh-host {host:?}: the port is not a number"))?;
            (name.trim_start_matches('[').trim_end_matches(']'), port)
        }
        _ => (host, 22),
    };
    // The pin is the execution's own target: a host that presents another key is refused
    // before anything is read.
    let config = SshConfig::new(name, port, user, HostKeyPin::fingerprint(host_key))
        .private_key_file(key)
        .with_context(|| format!("--ssh-key {}", key.display()))?;
    let mut probe = MarkerProbe::new(config);
    if let Some(dir) = &args.ssh_state_dir {
        probe = probe.state_dir(dir.clone());
    }
    let asked = format!(
        "the marker of {execution} on {} (host key {})",
        printable(host),
        printable(host_key)
    );
    let outcome = match tokio::time::timeout(TIMEOUT, probe.status(execution)).await {
        Ok(Ok(status)) => status.to_probe_outcome(),
        Ok(Err(error)) => bail!("{asked} could not be read: {error}; nothing was settled"),
        Err(_) => bail!("{asked} could not be read within 30 s; nothing was settled"),
    };
    Ok(said(&asked, outcome))
}

/// A probe's outcome as a verdict word and the sentence that is shown and kept.
fn said(asked: &str, outcome: ProbeOutcome) -> StatusAnswer {
    let (verdict, sentence) = match outcome {
        ProbeOutcome::Applied { result } => {
            let result = result.map_or_else(String::new, |r| {
                let text = r.to_string();
                let mut cut: String = text.chars().take(MAX_RESULT).collect();
                if cut.len() < text.len() {
                    cut.push('…');
                }
                format!("; result {cut}")
            });
            ("applied", format!("{asked}: applied{result}"))
        }
        ProbeOutcome::NotApplied => ("not_applied", format!("{asked}: not applied")),
        ProbeOutcome::InProgress => ("in_progress", format!("{asked}: still in progress")),
        ProbeOutcome::Unknown { reason } => ("unknown", format!("{asked}: unknown ({reason})")),
    };
    StatusAnswer {
        verdict: verdict.to_owned(),
        said: sentence,
    }
}
