//! `replay-guard demo`: the crate's main job on an embedded server, with no setup.
//!
//! An in-process MCP server (rmcp's own Streamable HTTP server) has a `deploy_release` tool
//! that counts deployments. The response to the first `tools/call` is lost after the tool ran.
//! The agent retries the same call twice over: once through a generic retry stack, once through
//! the guard (under the same retry). The generic stack deploys twice; the guard deploys once and
//! tells the agent honestly that the outcome is unknown and held for review.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, Request};
use http_body_util::Full;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    Actor, ExecutionId, IntentScope,
    contract::{ContractRegistry, ToolContract},
    guard::{GuardLayer, GuardRequestBody, STRUCTURED_KEY},
    ledger::{FileLedger, Ledger, verify_file},
    resume::ResumeLayer,
};
use serde_json::{Value, json};
use tower::{Service, ServiceBuilder, retry::RetryLayer};

use crate::{
    deploy_server::DeployServer,
    mcp_http::{self, BoxError, Endpoint, ProtocolChoice, Reply},
};

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where the guarded run keeps its ledger (default: a new file in the temp directory, kept
    /// so that `replay-guard audit show` can read it afterwards).
    #[arg(long, value_name = "PATH")]
    ledger: Option<PathBuf>,
}

/// The generic retry most stacks have: re-send the same request on any error, a bounded number
/// of times. It cannot tell a request that never left from one whose response was lost.
#[derive(Debug, Clone)]
struct RetryEveryError {
    remaining: usize,
}

impl<Res, E> tower::retry::Policy<Request<Full<Bytes>>, Res, E> for RetryEveryError {
    type Future = std::future::Ready<()>;

    fn retry(
        &mut self,
        _request: &mut Request<Full<Bytes>>,
        result: &mut Result<Res, E>,
    ) -> Option<Self::Future> {
        if result.is_err() && self.remaining > 0 {
            self.remaining -= 1;
            Some(std::future::ready(()))
        } else {
            None
        }
    }

    fn clone_request(&mut self, request: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(request.body().clone());
        *clone.method_mut() = request.method().clone();
        *clone.uri_mut() = request.uri().clone();
        *clone.headers_mut() = request.headers().clone();
        Some(clone)
    }
}

fn retry_layer() -> RetryLayer<RetryEveryError> {
    RetryLayer::new(RetryEveryError { remaining: 2 })
}

fn deploy() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "deploy_release",
        "arguments": {"service": "catalog", "version": "2026.07.22"}}})
}

/// Opens a session on `server`, loses the response of the next call, makes the deploy call
/// through `client`, and returns what the agent got.
async fn deploy_through<S, RB>(client: &mut S, server: &DeployServer) -> anyhow::Result<Value>
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
    RB: http_body::Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let mut endpoint = Endpoint::new(server.url.parse()?, HeaderMap::new());
    endpoint
        .open(client, ProtocolChoice::Sessions)
        .await
        .map_err(|e| anyhow::anyhow!("the demo server refused the session: {e}"))?;
    server.lose_next_responses(1);
    let answer = match mcp_http::send(client, endpoint.post(deploy())).await {
        Ok(response) => match mcp_http::read_reply(response, &json!(1)).await {
            Ok(Reply::Message(message)) => message,
            Ok(other) => json!({"no_answer": format!("{other:?}")}),
            Err(error) => json!({"error": error.to_string()}),
        },
        Err(error) => json!({"error": mcp_http::describe(&*error)}),
    };
    if let Some(delete) = endpoint.delete() {
        let _ = mcp_http::send(client, delete).await;
    }
    Ok(answer)
}

fn first_text(answer: &Value) -> &str {
    answer["result"]["content"][0]["text"]
        .as_str()
        .or_else(|| answer["error"].as_str())
        .unwrap_or("(no text)")
}

// Longer than most functions: the demo is a script (server, the generic run, the guarded run,
// the ledger, the verdict), read top to bottom as it prints.
pub async fn run(args: DemoArgs, json_output: bool) -> anyhow::Result<ExitCode> {
    // 1. A generic retry stack straight over the HTTP client.
    let generic_server = DeployServer::start().await?;
    let mut generic = ServiceBuilder::new()
        .layer(retry_layer())
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());
    let generic_answer = deploy_through(&mut generic, &generic_server).await?;
    let generic_count = generic_server.count();

    // 2. The same retry, with the guard under it.
    let guarded_server = DeployServer::start().await?;
    let path = args.ledger.unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "replay-guard-demo-{}.jsonl",
            ExecutionId::new().ulid()
        ))
    });
    let ledger = FileLedger::open(&path).with_context(|| {
        format!(
            "cannot open the demo ledger {}: pass --ledger PATH",
            path.display()
        )
    })?;
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    let guard = GuardLayer::new(ledger.clone(), contracts, ledger.fingerprint_key()?)
        .actor(Actor::new("agent:demo"))
        .intent_scope(IntentScope::new("run:demo"));
    let mut guarded = ServiceBuilder::new()
        .layer(retry_layer())
        .layer(guard)
        .layer(ResumeLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let guarded_answer = deploy_through(&mut guarded, &guarded_server).await?;
    let guarded_count = guarded_server.count();

    let record = ledger
        .list()
        .await?
        .into_iter()
        .find(|r| r.tool() == "deploy_release")
        .context("the guard recorded no execution of deploy_release")?;
    let why = guarded_answer["result"]["structuredContent"][STRUCTURED_KEY]["why_not_resent"]
        .as_str()
        .unwrap_or("-")
        .to_owned();
    drop(guarded);
    drop(ledger); // flushes the ledger file before it is verified
    let audit = verify_file(&path)?;
    let passed = guarded_count == 1;

    if json_output {
        println!(
            "{}",
            json!({
                "generic_retry": {"deployments": generic_count, "agent_got": generic_answer},
                "guard": {
                    "deployments": guarded_count,
                    "agent_got": guarded_answer,
                    "record": record,
                    "decision": record.state_label(),
                    "why": why,
                },
                "audit": {"ledger": path, "ok": audit.is_ok(), "report": audit.to_string()},
                "passed": passed,
            })
        );
    } else {
        println!(
            "replay-guard demo: the response to deploy_release is lost after the deployment ran,"
        );
        println!("and the agent retries (rmcp server on 127.0.0.1, protocol 2025-11-25, session).");
        println!();
        println!("1. Generic retry (tower::retry, re-send on any error)");
        println!("   the agent got: {}", first_text(&generic_answer));
        println!("   deployments:   {generic_count}");
        println!();
        println!("2. The guard, under the same retry (deploy_release is irreversible)");
        println!("   the agent got: {}", first_text(&guarded_answer));
        println!("   deployments:   {guarded_count}");
        println!();
        println!("The ledger record:");
        println!("{}", serde_json::to_string_pretty(&record)?);
        println!();
        println!(
            "The decision: {} ({why}). Nothing was sent again; an operator finds it in the held \
             queue, reads its timeline, and settles it:",
            record.state_label()
        );
        println!(
            "  replay-guard ledger list --ledger {} --held",
            path.display()
        );
        println!(
            "  replay-guard audit show --ledger {} {}",
            path.display(),
            record.execution_id()
        );
        println!(
            "  replay-guard resolve --ledger {} {} --applied --note \"checked the deploy log\"",
            path.display(),
            record.execution_id()
        );
        println!();
        println!("Audit: replay-guard audit verify {}", path.display());
        println!("  {audit}");
        println!();
        println!(
            "deployments: generic retry {generic_count}, guard {guarded_count} -> {}",
            if passed {
                "ok"
            } else {
                "FAILED: the guard let a second deployment through"
            }
        );
    }
    Ok(if passed && audit.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
