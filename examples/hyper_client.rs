//! A hyper client stacked with the guard and the resume layer, against an rmcp server this
//! example starts on 127.0.0.1.
//!
//! The agent calls `deploy_release`, then "crashes" before reading the answer (it drops the
//! response body). It starts again and makes the same call: the guard hands back the result the
//! server already produced instead of deploying a second time. Then it deploys again on purpose,
//! after it got the first answer: that is a new execution.
//!
//! Run with `cargo run --example hyper_client`.

#[path = "support/deploy_server.rs"]
mod deploy_server;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
    resume::ResumeLayer,
};
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn post(url: &str, session: Option<&str>, body: Value) -> Request<Full<Bytes>> {
    let mut request = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The JSON-RPC messages of a response body (JSON or SSE), read to its end.
async fn messages<B>(body: B) -> Result<Vec<Value>, BoxError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim);
    Ok(std::iter::once(text.trim())
        .chain(data)
        .filter_map(|s| serde_json::from_str(s).ok())
        .collect())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let ledger = MemoryLedger::new();
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(
            GuardLayer::new(ledger.clone(), contracts, FingerprintKey::generate()?)
                .actor(Actor::from("signed-process:com.example.agent"))
                .intent_scope(IntentScope::from("run:5f8097")),
        )
        .layer(ResumeLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());

    // initialize + initialized pass through the guard untouched.
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "hyper-client-example", "version": "0"}}});
    let response = (&mut client)
        .oneshot(post(&server.url, None, initialize))
        .await?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    messages(response.into_body()).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), initialized))
        .await?;
    messages(response.into_body()).await?;

    let deploy = |id: i64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "deploy_release", "arguments": {"service": "catalog", "version": "2026.07.22"}}})
    };

    // 1. The agent sends the call and crashes before reading the answer.
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), deploy(1)))
        .await?;
    drop(response);
    // The guard reads the abandoned stream on in the background and keeps the result.
    for _ in 0..100 {
        if ledger
            .list()
            .await?
            .iter()
            .any(|r| r.result_reference.is_some())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = ledger.list().await?.remove(0);
    println!(
        "after the crash:\n{}",
        serde_json::to_string_pretty(&record)?
    );

    // 2. The agent restarts and makes the same call with a new JSON-RPC id.
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), deploy(7)))
        .await?;
    let answer = messages(response.into_body()).await?;
    println!("\nthe repeat got: {}", serde_json::to_string(&answer)?);
    println!("deployments after the repeat: {}", server.count());
    let after_repeat = server.count();

    // 3. A deliberate second deployment, after the first answer was delivered.
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), deploy(8)))
        .await?;
    messages(response.into_body()).await?;
    println!(
        "deployments after a deliberate second call: {}",
        server.count()
    );

    if after_repeat != 1 || server.count() != 2 {
        return Err(format!(
            "expected 1 then 2 deployments, saw {after_repeat} then {}",
            server.count()
        )
        .into());
    }
    Ok(())
}
