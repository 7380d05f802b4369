//! `replay-guard call`: one guarded `tools/call`, with exit codes a script can act on.
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | completed, `isError` false |
//! | 1 | completed with `isError` true, a JSON-RPC error, a refusal by HTTP status, or a denial |
//! | 2 | usage, configuration or connection error before anything was sent |
//! | 3 | outcome unknown, held for review, or still in progress (stdout carries the guard's answer with the execution ID) |

use std::{process::ExitCode, time::Duration};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    ExecutionId,
    guard::{GuardError, GuardRequestBody, STRUCTURED_KEY},
    ledger::Ledger,
    resume::ResumeLayer,
};
use serde_json::{Value, json};
use tower::{Service, ServiceBuilder, ServiceExt, timeout::TimeoutLayer};

use crate::{
    mcp_http::{self, BoxError, Endpoint, ProtocolChoice, ReadError, Reply},
    options::{ClassArg, GuardOptions},
};

/// How many times the call is put to the guard. The first attempt sends; each later one is the
/// agent asking again after an unknown outcome, and the guard decides from the ledger what that
/// means for this tool's class (resume, re-send under the same key, probe, or hold for review).
const ATTEMPTS: i64 = 3;

#[derive(Debug, Args)]
pub struct CallArgs {
    /// The MCP endpoint (`http://host:port/mcp`).
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
    /// How long to wait for the tool's answer (e.g. `30s`, `2m`).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
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

fn parse_headers(headers: &[String]) -> anyhow::Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for header in headers {
        let Some((name, value)) = header.split_once(':') else {
            bail!("--header wants 'Name: value'; got a value without a colon");
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .with_context(|| format!("--header: {:?} is not a header name", name.trim()))?;
        // The value may be a credential: it never appears in an error.
        let value = HeaderValue::from_str(value.trim()).map_err(|_| {
            anyhow::anyhow!("--header {name}: the value is not a valid header value")
        })?;
        map.append(name, value);
    }
    Ok(map)
}

pub async fn run(args: CallArgs, json_output: bool) -> anyhow::Result<ExitCode> {
    let arguments: Value = serde_json::from_str(&args.args).with_context(|| {
        "--args is not JSON: give the tool's arguments as an object, e.g. '{\"service\":\"api\"}'"
    })?;
    if !arguments.is_object() {
        bail!("--args must be a JSON object, e.g. '{{\"service\":\"api\"}}'");
    }
    let url: Uri = args
        .url
        .parse()
        .with_context(|| format!("--url {:?} is not a URL", args.url))?;
    if url.scheme_str() != Some("http") {
        bail!(
            "--url must be http://…: this build speaks plain HTTP (run `replay-guard proxy` beside a TLS terminator for https)"
        );
    }
    let headers = parse_headers(&args.headers)?;
    let contracts = args
        .guard
        .contracts(args.class.map(|class| (args.tool.as_str(), class)))?;
    let layer = args.guard.layer(contracts, args.timeout)?;
    let ledger = layer.ledger().clone();

    let connector = Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>();
    let mut client = ServiceBuilder::new()
        .layer(layer)
        .layer(ResumeLayer::new())
        .layer(TimeoutLayer::new(args.timeout))
        .service(connector);

    let mut endpoint = Endpoint::new(url, headers);
    if let Err(error) = endpoint.open(&mut client, args.protocol).await {
        bail!(
            "cannot open an MCP connection to {}: {}. Nothing was sent. Check --url, that the server runs, and --protocol",
            args.url,
            mcp_http::describe(&*error)
        );
    }
    let outcome = call_tool(
        &mut client,
        &endpoint,
        &args.tool,
        &arguments,
        args.timeout,
        &*ledger,
    )
    .await;
    if let Some(delete) = endpoint.delete() {
        let _ =
            tokio::time::timeout(Duration::from_secs(2), mcp_http::send(&mut client, delete)).await;
    }
    let (outcome, execution) = outcome?;
    print(&outcome, execution, json_output)?;
    Ok(ExitCode::from(outcome.exit_code()))
}

async fn call_tool<S, RB>(
    client: &mut S,
    endpoint: &Endpoint,
    tool: &str,
    arguments: &Value,
    timeout: Duration,
    ledger: &dyn Ledger,
) -> anyhow::Result<(Outcome, Option<ExecutionId>)>
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<RB>, Error = GuardError>,
    RB: http_body::Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut execution = None;
    let mut passthrough_error = None;
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
        let response = match response {
            Ok(response) => response,
            Err(error) if error.is_not_sent() && execution.is_none() => bail!(
                "cannot reach {}: {}. Nothing was sent (execution {} is recorded as not sent)",
                endpoint.url,
                mcp_http::describe(&error),
                error
                    .execution_id()
                    .map_or_else(|| "-".to_owned(), |id| id.to_string()),
            ),
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
            Err(error) => bail!(
                "the guard failed before sending: {}",
                mcp_http::describe(&error)
            ),
        };
        execution = response
            .extensions()
            .get::<ExecutionId>()
            .copied()
            .or(execution);
        match tokio::time::timeout(timeout, mcp_http::read_reply(response, &id)).await {
            Ok(Ok(Reply::Message(message))) => return Ok((from_message(message), execution)),
            Ok(Ok(Reply::Http { status, .. })) if status.is_server_error() => {
                tracing::warn!(attempt, %status, "HTTP {status} on tools/call: the outcome is unknown");
            }
            Ok(Ok(Reply::Http { status, body })) => {
                return Ok((
                    Outcome::Refused {
                        status: status.as_u16(),
                        body,
                    },
                    execution,
                ));
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
                bail!("{error}: the tool ran; its answer is too large to print")
            }
            Err(_) => break,
        }
    }
    if let (None, Some(error)) = (execution, passthrough_error) {
        bail!(
            "cannot reach {}: {}. The call is read-only, so nothing can have changed",
            endpoint.url,
            mcp_http::describe(&error)
        );
    }
    // No answer: say where the execution stands, from the ledger.
    let record = match execution {
        Some(id) => ledger.get(id).await?,
        None => None,
    };
    let payload = json!({
        "execution_id": execution.map(|id| id.to_string()),
        "state": record.as_ref().map(|r| r.state_label()),
        "record": record,
        "why": "no answer arrived within the timeout and the attempts the tool's class allows; the outcome is unknown",
    });
    Ok((Outcome::Unknown(payload), execution))
}

fn print(
    outcome: &Outcome,
    execution: Option<ExecutionId>,
    json_output: bool,
) -> anyhow::Result<()> {
    let execution = execution
        .map(|id| id.to_string())
        .or_else(|| match outcome {
            Outcome::GuardAnswer(result) => {
                result["structuredContent"][STRUCTURED_KEY]["execution_id"]
                    .as_str()
                    .map(str::to_owned)
            }
            _ => None,
        });
    if json_output {
        let line = json!({
            "outcome": outcome.name(),
            "exit_code": outcome.exit_code(),
            "execution_id": execution,
            "result": outcome.payload(),
        });
        println!("{line}");
    } else {
        println!("{}", serde_json::to_string_pretty(&outcome.payload())?);
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
    Ok(())
}
