//! Someone is told when an execution becomes held (`--on-held CMD`, `--on-held-url URL` of
//! `proxy` and `stdio`): the execution as JSON, on the command's stdin or POSTed to the URL.
//!
//! Never in the call's way: the guard hands the record over and goes on; a bounded queue feeds
//! one task that runs the command (bounded by [`EACH_TIMEOUT`]) and POSTs (each try bounded,
//! retried with backoff). A full queue drops the notice with a warning, never the call. The JSON
//! carries no argument and no credential: the record holds neither, and the target is shown
//! without the credentials a URL may carry.

use std::{process::Stdio, time::Duration};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{execution::ExecutionRecord, guard::GuardLayer, tools::redact_url};
use serde_json::{Value, json};
use tokio::{io::AsyncWriteExt, sync::mpsc};

use crate::tls::{ClientTls, Connector};

/// How many notices wait at most; past it a notice is dropped (with a warning).
const QUEUE: usize = 1024;

/// The bound of one run of the command, and of one POST.
const EACH_TIMEOUT: Duration = Duration::from_secs(10);

/// The tries of one POST, and the pause before the second (doubled each time).
const TRIES: u32 = 4;
const FIRST_PAUSE: Duration = Duration::from_millis(500);

/// Who is told of a held execution.
#[derive(Debug, Clone, Args)]
pub struct OnHeldOptions {
    /// Run this command (through `sh -c`) for each execution that becomes held, with the
    /// execution as JSON on its stdin (no arguments, no credentials); bounded to 10 s.
    #[arg(long, value_name = "CMD")]
    pub on_held: Option<String>,
    /// POST the same JSON to this URL (`http` or `https`, trusting `--ca-cert` when given):
    /// each try bounded to 10 s, tried up to 4 times with backoff until a 2xx answer.
    #[arg(long, value_name = "URL")]
    pub on_held_url: Option<Uri>,
}

impl OnHeldOptions {
    /// `layer`, telling whoever the options name of each execution that becomes held (as is
    /// when they name none). `tls`: whom an `https` URL is trusted by.
    pub fn install(&self, layer: GuardLayer, tls: &ClientTls) -> anyhow::Result<GuardLayer> {
        if self.on_held.is_none() && self.on_held_url.is_none() {
            return Ok(layer);
        }
        let post = match &self.on_held_url {
            Some(url) => Some((url.clone(), tls.connector(url, "--on-held-url")?)),
            None => None,
        };
        let (queue, notices) = mpsc::channel::<Value>(QUEUE);
        tokio::spawn(tell(notices, self.on_held.clone(), post));
        Ok(layer.on_held(move |record| {
            if queue.try_send(notice(record)).is_err() {
                tracing::warn!(execution_id = %record.execution_id(), "a held execution's notice was dropped: the queue of notices is full");
            }
        }))
    }
}

/// The JSON of a held execution: what a person needs to look, nothing a caller sent.
pub fn notice(record: &ExecutionRecord) -> Value {
    json!({
        "event": "held",
        "execution_id": record.execution_id().to_string(),
        "tool": record.tool(),
        "state": record.state_label(),
        "retry_class": record.retry_class().to_string(),
        "actor": record.actor().as_str(),
        "target": redact_url(record.target().as_str()),
        "accepted_at": record.accepted_at().to_string(),
        "dispatched_at": record.dispatched_at().map(|at| at.to_string()),
        "attempts": record.attempts(),
        "reason": record.reason(),
    })
}

/// Tells each notice, one at a time, until the guard is gone.
async fn tell(
    mut notices: mpsc::Receiver<Value>,
    command: Option<String>,
    post: Option<(Uri, Connector)>,
) {
    let client = post.map(|(url, connector)| {
        let client: Client<Connector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(connector);
        (url, client)
    });
    while let Some(notice) = notices.recv().await {
        let body = notice.to_string();
        if let Some(command) = &command
            && let Err(error) = run(command, &body).await
        {
            tracing::warn!(execution_id = %notice["execution_id"], "--on-held: {error:#}");
        }
        if let Some((url, client)) = &client
            && let Err(error) = post_with_retries(client, url, &body).await
        {
            tracing::warn!(execution_id = %notice["execution_id"], "--on-held-url: {error:#}");
        }
    }
}

/// Runs `command` with `body` on its stdin, bounded.
async fn run(command: &str, body: &str) -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", command])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("the command did not start")?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let finished = async {
        // A command that does not read its stdin still runs: a closed pipe is no failure.
        let _ = stdin.write_all(body.as_bytes()).await;
        drop(stdin);
        child.wait().await
    };
    match tokio::time::timeout(EACH_TIMEOUT, finished).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => anyhow::bail!("the command exited with {status}"),
        Ok(Err(error)) => Err(error).context("the command could not be waited for"),
        Err(_) => anyhow::bail!("the command ran longer than 10 s and was killed"),
    }
}

/// POSTs `body` to `url` until a 2xx answer, up to [`TRIES`] times with backoff.
async fn post_with_retries(
    client: &Client<Connector, Full<Bytes>>,
    url: &Uri,
    body: &str,
) -> anyhow::Result<()> {
    let mut pause = FIRST_PAUSE;
    let mut last = String::new();
    for attempt in 1..=TRIES {
        let request = Request::post(url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .context("the notice request")?;
        match tokio::time::timeout(EACH_TIMEOUT, client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => return Ok(()),
            Ok(Ok(response)) => last = format!("HTTP {}", response.status()),
            Ok(Err(error)) => last = crate::tls::described(&error),
            Err(_) => last = "no answer within 10 s".to_owned(),
        }
        if attempt < TRIES {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    anyhow::bail!(
        "{} did not take the notice after {TRIES} tries (last: {last})",
        redact_url(&url.to_string())
    )
}
