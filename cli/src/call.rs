//! `replay-guard call`: one guarded `tools/call`, with exit codes a script can act on.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | completed, `isError` false |
//! | 1 | completed with `isError` true, a JSON-RPC error, a refusal by HTTP status, or a denial |
//! | 2 | usage, configuration or connection error before anything was sent |
//! | 3 | outcome unknown, held for review, or still in progress (stdout carries the guard's answer with the execution ID); also every error after the request may have been sent |
//!
//! # When the answer counts as delivered
//!
//! Once it is printed and stdout is flushed: only then is `delivered` recorded, and only then
//! does the session DELETE go out. A `call` killed before that leaves the execution
//! `completed_result_not_delivered`, and the next identical call prints the kept result
//! instead of running the tool again.

use std::{
    io::Write as _,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::Uri;
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    ExecutionId,
    execution::ExecutionState,
    guard::{Delivery, GuardError, GuardRequestBody, GuardResponseBody, STRUCTURED_KEY},
    ledger::Ledger,
    resume::ResumeLayer,
    tools::redact_url,
};
use serde_json::{Value, json};
use tower::{Service, ServiceBuilder, ServiceExt, timeout::TimeoutLayer, util::MapRequestLayer};

use crate::{
    mcp_http::{self, BoxError, Endpoint, ProtocolChoice, ReadError, Reply},
    options::{ClassArg, GuardOptions},
    tls::{self, ClientTls},
};

/// How many times the call is put to the guard. The first attempt sends; each later one is the
/// agent asking again after an unknown outcome, and the guard decides from the ledger what that
/// means for this tool's class (resume, re-send under the same key, probe, or hold for review).
const ATTEMPTS: i64 = 3;

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The MCP endpoint (`http://host:port/mcp` or `https://…`).
    #[arg(long)]
    url: String,
    /// The tool to call.
    #[arg(long)]
    tool: String,
    /// The tool's arguments, a JSON object.
    #[arg(long, default_value = "{}")]
    args: String,
    /// The tool's retry class (overrides the policy file; tools without a contract are
    /// irreversible).
    #[arg(long, value_enum)]
    class: Option<ClassArg>,
    /// An extra request header, `'Name: value'` (repeatable). Never recorded or logged.
    #[arg(long = "header", value_name = "'K: V'")]
    headers: Vec<String>,
    /// The protocol era to speak.
    #[arg(long, value_enum, default_value = "auto")]
    protocol: ProtocolChoice,
    /// How long to wait for the tool's answer (e.g. `30s`, `2m`), and for the handshake before
    /// it (`server/discover` or `initialize`).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    tls: ClientTls,
    #[command(flatten)]
    guard: GuardOptions,
}

/// How the call ended, with what the caller gets on stdout.
#[derive(Debug)]
enum Outcome {
    Completed(Value),
    ToolError(Value),
    JsonRpcError(Value),
    Refused {
        status: u16,
        body: String,
    },
    /// The guard answered instead of the target (held for review, in progress, denied, …).
    GuardAnswer(Value),
    /// No answer could be had; the record says where the execution stands.
    Unknown(Value),
}

impl Outcome {
    fn name(&self) -> &'static str {
        match self {
            Self::Completed(_) => "completed",
            Self::ToolError(_) => "tool_error",
            Self::JsonRpcError(_) => "jsonrpc_error",
            Self::Refused { .. } => "refused",
            Self::GuardAnswer(_) => "guard_answer",
            Self::Unknown(_) => "unknown",
        }
    }

    fn exit_code(&self) -> u8 {
        match self {
            Self::Completed(_) => 0,
            Self::ToolError(_) | Self::JsonRpcError(_) | Self::Refused { .. } => 1,
            // A repeated denial is final, like a refusal; every other answer of the guard
            // means the outcome is not (yet) known to the caller.
            Self::GuardAnswer(result) if guard_state(result) == Some("denied") => 1,
            Self::GuardAnswer(_) | Self::Unknown(_) => 3,
        }
    }

    /// The execution's state as far as the answer tells it.
    fn state(&self) -> Option<&str> {
        match self {
            Self::Completed(_) | Self::ToolError(_) => Some("completed"),
            Self::GuardAnswer(result) => guard_state(result),
            Self::Unknown(payload) => payload["state"].as_str(),
            Self::JsonRpcError(_) | Self::Refused { .. } => None,
        }
    }

    fn payload(&self) -> Value {
        match self {
            Self::Completed(v)
            | Self::ToolError(v)
            | Self::JsonRpcError(v)
            | Self::GuardAnswer(v)
            | Self::Unknown(v) => v.clone(),
            Self::Refused { status, body } => json!({"http_status": status, "body": body}),
        }
    }
}

fn guard_state(result: &Value) -> Option<&str> {
    result["structuredContent"][STRUCTURED_KEY]["state"].as_str()
}

/// Whether `message` is a JSON-RPC error that leaves open that the tool ran (the guard
/// recorded it `unknown`): the library's rule, read from the code (an error without an
/// integer code proves nothing either).
fn may_have_run(message: &Value) -> bool {
    message.get("error").is_some_and(|error| {
        error["code"]
            .as_i64()
            .is_none_or(mcp_replay_guard::guard::jsonrpc_error_may_have_run)
    })
}

fn from_message(message: Value) -> Outcome {
    if let Some(error) = message.get("error") {
        return Outcome::JsonRpcError(error.clone());
    }
    let result = message.get("result").cloned().unwrap_or(Value::Null);
    if result["structuredContent"].get(STRUCTURED_KEY).is_some() {
        Outcome::GuardAnswer(result)
    } else if result["isError"] == true {
        Outcome::ToolError(result)
    } else {
        Outcome::Completed(result)
    }
}

/// A `call` that ended without an answer to print.
#[derive(Debug)]
struct Failure {
    error: anyhow::Error,
    /// The request may have left: the exit is 3 (outcome unknown), never 2.
    sent: bool,
}

impl Failure {
    fn before_sending(error: anyhow::Error) -> Self {
        Self { error, sent: false }
    }

    fn after_sending(error: anyhow::Error) -> Self {
        Self { error, sent: true }
    }
}

/// What `call_tool` got: the outcome and, for the target's own answer, the delivery to record
/// once it is printed.
#[derive(Debug)]
struct Called {
    outcome: Outcome,
    execution: Option<ExecutionId>,
    delivery: Option<Delivery>,
}

// Longer than most functions: the command's steps (options, ledger, stack, handshake, call,
// print) in the order a reader follows them, each short.
pub async fn run(args: CallArgs, json_output: bool) -> anyhow::Result<ExitCode> {
    let arguments: Value = serde_json::from_str(&args.args).with_context(|| {
        "--args is not JSON: give the tool's arguments as an object, e.g. '{\"service\":\"api\"}'"
    })?;
    let Some(object) = arguments.as_object() else {
        bail!("--args must be a JSON object, e.g. '{{\"service\":\"api\"}}'");
    };
    // Parsed, such a literal becomes the nearest double: the tool would get another number.
    if mcp_replay_guard::tools::has_inexact_number(object, args.args.as_bytes()) {
        bail!(
            "--args: {}. Nothing was sent",
            mcp_replay_guard::tools::INEXACT_NUMBER
        );
    }
    // The URL may carry a credential (`user:secret@`, `?token=`): only its redacted form is
    // ever printed.
    let shown_url = redact_url(&args.url);
    let url: Uri = args
        .url
        .parse()
        .with_context(|| format!("--url {shown_url:?} is not a URL"))?;
    let (url, had_userinfo) = mcp_http::without_userinfo(url).context("--url")?;
    if had_userinfo {
        eprintln!("warning: {}", mcp_http::USERINFO_NOT_SENT);
    }
    let connector = args.tls.connector(&url, "--url")?;
    let headers = mcp_http::parse_headers(&args.headers)?;
    let contracts = args
        .guard
        .contracts(args.class.map(|class| (args.tool.as_str(), class)))?;
    // A body this command drops is never read again: the process ends.
    let layer = args
        .guard
        .layer(contracts, args.timeout)
        .await?
        .drain_timeout(Duration::ZERO);
    let ledger = layer.ledger().clone();

    // Set whenever the guard hands a POST to the transport: after that, an error means the
    // call may have been sent.
    let handed_over = Arc::new(AtomicBool::new(false));
    let flag = handed_over.clone();
    let connector = Client::builder(TokioExecutor::new()).build::<_, GuardRequestBody>(connector);
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .layer(MapRequestLayer::new(
            move |request: http::Request<GuardRequestBody>| {
                if request.method() == http::Method::POST {
                    flag.store(true, Ordering::Release);
                }
                request
            },
        ))
        .layer(ResumeLayer::new())
        .layer(TimeoutLayer::new(args.timeout))
        .service(connector);

    let mut endpoint = Endpoint::new(url, headers);
    // The handshake's answers are read whole: a server that starts one and never ends it
    // would hold the command forever.
    let opened = tokio::time::timeout(args.timeout, endpoint.open(&mut client, args.protocol))
        .await
        .unwrap_or_else(|_| {
            Err(format!("no answer to the handshake within {:?}", args.timeout).into())
        });
    if let Err(error) = opened {
        bail!(
            "cannot open an MCP connection to {shown_url}: {}. Nothing was sent. {}",
            mcp_http::describe(&*error),
            tls::hint(&*error).unwrap_or("Check --url, that the server runs, and --protocol")
        );
    }
    handed_over.store(false, Ordering::Release);
    let called = call_tool(
        &mut client,
        &endpoint,
        &args.tool,
        &arguments,
        args.timeout,
        &*ledger,
        &handed_over,
    )
    .await;
    let code = match called {
        Ok(called) => finish(called, json_output).await,
        Err(Failure { error, sent: false }) => Err(error),
        Err(Failure { error, sent: true }) => {
            let message = format!(
                "{error:#}. The request may have been sent: the outcome is unknown (exit 3); `replay-guard ledger list` shows where the execution stands"
            );
            eprintln!("error: {message}");
            Ok(crate::say_failed(&message, 3, true, json_output))
        }
    };
    // Teardown last: the answer is printed and its delivery recorded.
    if let Some(delete) = endpoint.delete() {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), mcp_http::send(&mut client, delete)).await;
    }
    code
}

/// Prints the answer and flushes stdout; only then records the delivery; then the summary.
async fn finish(called: Called, json_output: bool) -> anyhow::Result<ExitCode> {
    let Called {
        outcome,
        execution,
        delivery,
    } = called;
    let execution = execution
        .map(|id| id.to_string())
        .or_else(|| match &outcome {
            Outcome::GuardAnswer(result) => {
                result["structuredContent"][STRUCTURED_KEY]["execution_id"]
                    .as_str()
                    .map(str::to_owned)
            }
            _ => None,
        });
    if let Err(error) = print(&outcome, execution.as_deref(), json_output) {
        // The caller does not hold the answer: it stays undelivered, and kept.
        eprintln!(
            "error: cannot print the answer: {error}. It is not recorded as delivered: the next identical call gets the kept result"
        );
        return Ok(ExitCode::from(3));
    }
    if let Some(delivery) = delivery
        && let Err(error) = delivery.record().await
    {
        tracing::warn!(execution_id = %delivery.execution_id(), %error, "could not record the delivery");
    }
    if !json_output {
        summarize(&outcome, execution.as_deref());
    }
    Ok(ExitCode::from(outcome.exit_code()))
}

// Longer than most functions: the three attempts and what each outcome prints and exits with,
// kept together so that every exit code is decided in one place.
async fn call_tool<S, RB>(
    client: &mut S,
    endpoint: &Endpoint,
    tool: &str,
    arguments: &Value,
    timeout: Duration,
    ledger: &dyn Ledger,
    handed_over: &AtomicBool,
) -> Result<Called, Failure>
where
    S: Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<GuardResponseBody<RB>>,
            Error = GuardError,
        >,
    RB: http_body::Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut execution = None;
    let mut passthrough_error = None;
    // The last JSON-RPC error that left the outcome open, printed if nothing better comes.
    let mut open_error = None;
    let shown_url = redact_url(&endpoint.url.to_string());
    for attempt in 1..=ATTEMPTS {
        let id = json!(attempt);
        let request = endpoint.post(json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        }));
        let response = match client.ready().await {
            Ok(client) => client.call(request).await,
            Err(error) => Err(error),
        };
        let mut response = match response {
            Ok(response) => response,
            Err(error) if error.is_not_sent() && execution.is_none() => {
                return Err(Failure::before_sending(anyhow::anyhow!(
                    "cannot reach {shown_url}: {}. Nothing was sent (execution {} is recorded as not sent){}",
                    mcp_http::describe(&error),
                    error
                        .execution_id()
                        .map_or_else(|| "-".to_owned(), |id| id.to_string()),
                    tls::hint(&error).map_or_else(String::new, |hint| format!("; {hint}"))
                )));
            }
            Err(error) if error.is_unknown() || error.is_not_sent() => {
                execution = error.execution_id().or(execution);
                tracing::warn!(attempt, %error, "the outcome is unknown; asking the guard again");
                continue;
            }
            // A call the guard passed through (a read-only tool): re-sent freely.
            Err(error) if error.is_inner() => {
                tracing::warn!(attempt, error = %mcp_http::describe(&error), "a read-only call failed; sending it again");
                passthrough_error = Some(error);
                continue;
            }
            // The guard failed (its ledger, say): before sending, unless a request of this
            // call already went to the transport.
            Err(error) => {
                let sent = handed_over.load(Ordering::Acquire) || execution.is_some();
                let error = anyhow::anyhow!(
                    "the guard failed {}: {}",
                    if sent {
                        "after the call may have been sent"
                    } else {
                        "before sending"
                    },
                    mcp_http::describe(&error)
                );
                return Err(Failure { error, sent });
            }
        };
        execution = response
            .extensions()
            .get::<ExecutionId>()
            .copied()
            .or(execution);
        let delivery = response.body_mut().defer_delivery();
        match tokio::time::timeout(timeout, mcp_http::read_reply(response, &id)).await {
            Ok(Ok(Reply::Message(message))) if may_have_run(&message) => {
                tracing::warn!(
                    attempt,
                    code = %message["error"]["code"],
                    "a JSON-RPC error that does not prove the tool did not run: the outcome is unknown; asking the guard again"
                );
                open_error = Some(message["error"].clone());
            }
            Ok(Ok(Reply::Message(message))) => {
                return Ok(Called {
                    outcome: from_message(message),
                    execution,
                    delivery,
                });
            }
            Ok(Ok(Reply::Http { status, .. })) if status.is_server_error() => {
                tracing::warn!(attempt, %status, "HTTP {status} on tools/call: the outcome is unknown");
            }
            Ok(Ok(Reply::Http { status, body })) => {
                return Ok(Called {
                    outcome: Outcome::Refused {
                        status: status.as_u16(),
                        body,
                    },
                    execution,
                    delivery: None,
                });
            }
            Ok(Ok(Reply::Accepted)) => {
                tracing::warn!(
                    attempt,
                    "202 Accepted on tools/call: no answer; the outcome is unknown"
                );
            }
            Ok(Err(error @ (ReadError::Broken(_) | ReadError::NoAnswer))) => {
                tracing::warn!(attempt, %error, "the outcome is unknown; asking the guard again");
            }
            Ok(Err(error @ ReadError::TooLarge)) => {
                return Err(Failure::after_sending(anyhow::anyhow!(
                    "{error}: the tool ran; its answer is too large to print (execution {})",
                    execution.map_or_else(|| "-".to_owned(), |id| id.to_string())
                )));
            }
            Err(_) => {
                // The body is gone with the read: the guard records the outcome as unknown.
                if let Some(id) = execution {
                    settled_record(ledger, id).await;
                }
                break;
            }
        }
    }
    if let (None, Some(error)) = (execution, passthrough_error) {
        return Err(Failure::before_sending(anyhow::anyhow!(
            "cannot reach {shown_url}: {}. The call is read-only, so nothing can have changed",
            mcp_http::describe(&error)
        )));
    }
    // No answer: say where the execution stands, from the ledger.
    let record = match execution {
        Some(id) => ledger
            .get(id)
            .await
            .map_err(|e| Failure::after_sending(e.into()))?,
        None => None,
    };
    let payload = json!({
        "execution_id": execution.map(|id| id.to_string()),
        "state": record.as_ref().map(|r| r.state_label()),
        "record": record,
        "jsonrpc_error": open_error,
        "why": "no answer arrived within the timeout and the attempts the tool's class allows; the outcome is unknown",
    });
    Ok(Called {
        outcome: Outcome::Unknown(payload),
        execution,
        delivery: None,
    })
}

/// Waits (bounded) until the guard has recorded what became of an execution whose answer
/// this command stopped waiting for, so that what is printed is what the ledger says.
async fn settled_record(ledger: &dyn Ledger, id: ExecutionId) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        match ledger.get(id).await {
            Ok(Some(record)) if record.state() != ExecutionState::Dispatched => return,
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(_) => return,
        }
    }
}

/// The answer on stdout, flushed.
fn print(outcome: &Outcome, execution: Option<&str>, json_output: bool) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json_output {
        // One shape for every answer: a script reads `state` whether the call completed, was
        // held, or is unknown.
        let line = json!({
            "outcome": outcome.name(),
            "exit_code": outcome.exit_code(),
            "execution_id": execution,
            "state": outcome.state(),
            "result": outcome.payload(),
        });
        writeln!(stdout, "{line}")?;
    } else {
        let text = serde_json::to_string_pretty(&outcome.payload())?;
        writeln!(stdout, "{text}")?;
    }
    stdout.flush()
}

/// The human summary on stderr (after the delivery is recorded).
fn summarize(outcome: &Outcome, execution: Option<&str>) {
    let what = match outcome {
        Outcome::Completed(_) => "completed",
        Outcome::ToolError(_) => "completed with isError: true",
        Outcome::JsonRpcError(_) => "the server answered with a JSON-RPC error",
        Outcome::Refused { .. } => "the server refused the call by HTTP status (not run)",
        Outcome::GuardAnswer(_) if outcome.exit_code() == 1 => "denied (not run)",
        Outcome::GuardAnswer(_) => {
            "the guard answered: the outcome is not known to this caller (see the text)"
        }
        Outcome::Unknown(_) => "outcome unknown",
    };
    match execution {
        Some(id) => eprintln!("{what}: execution {id}"),
        // Read-only calls need no execution identity.
        None => eprintln!("{what}"),
    }
}
