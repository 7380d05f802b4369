//! An MCP server that honours `Idempotency-Key`: rmcp's Streamable HTTP server behind
//! `IdempotencyLayer`, on 127.0.0.1, with a `deploy_release` tool that counts deployments.
//!
//! A client sends `deploy_release` with an `Idempotency-Key` (as the client guard does) and
//! crashes before it reads the answer. It starts again and sends the same call under the same
//! key: the layer answers with the kept response, re-keyed to the new JSON-RPC id, and the tool
//! does not run again. The same key for another call is refused with HTTP 422.
//!
//! Run with `cargo run --features server --example idempotent_server`.

#[path = "support/deploy_server.rs"]
#[allow(dead_code)]
// this example serves rmcp itself, behind the layer: it needs only `rmcp_service`
mod deploy_server;

use std::{
    sync::{Arc, atomic::AtomicUsize},
    time::Duration,
};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use mcp_replay_guard::{
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    integrations::server::IdempotencyLayer,
    ledger::{Ledger, MemoryLedger},
};
use serde_json::{Value, json};
use tower::Layer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEY: &str = "\"deploy-catalog-2026.07.22\""; // the draft's structured-field spelling

fn post(url: &str, session: Option<&str>, key: Option<&str>, body: Value) -> Request<Full<Bytes>> {
    let mut request = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The JSON-RPC response in a body (JSON, or the `data:` of an SSE event), read to its end.
async fn message(body: hyper::body::Incoming) -> Result<Value, BoxError> {
    let bytes = body.collect().await?.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let data = text.lines().filter_map(|l| l.strip_prefix("data:"));
    std::iter::once(text.as_ref())
        .chain(data)
        .filter_map(|s| serde_json::from_str::<Value>(s.trim()).ok())
        .find(|m| m.get("result").is_some() || m.get("error").is_some())
        .ok_or_else(|| format!("no JSON-RPC response in {text}").into())
}

fn deploy(id: i64, version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
        "name": "deploy_release", "arguments": {"service": "catalog", "version": version}}})
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // The server: rmcp behind the layer.
    let deployments = Arc::new(AtomicUsize::new(0));
    let ledger = MemoryLedger::new();
    let layer = IdempotencyLayer::new(ledger.clone(), FingerprintKey::generate()?);
    let service = layer.layer(deploy_server::rmcp_service(deployments.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    // A client.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "idempotent-server-example", "version": "0"}}});
    let response = client.request(post(&url, None, None, initialize)).await?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    message(response.into_body()).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = client
        .request(post(&url, session.as_deref(), None, initialized))
        .await?;
    response.into_body().collect().await?;

    // 1. The call, and a client crash before it reads the answer.
    let first = post(&url, session.as_deref(), Some(KEY), deploy(1, "2026.07.22"));
    drop(client.request(first).await?);
    // The layer reads the abandoned answer on and keeps it.
    for _ in 0..200 {
        let records = ledger.list().await?;
        if records
            .iter()
            .any(|r| r.state() == ExecutionState::Completed)
        {
            println!("kept:\n{}", serde_json::to_string_pretty(&records[0])?);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // 2. The client restarts and sends the same call under the same key, with a new id.
    let repeat = post(&url, session.as_deref(), Some(KEY), deploy(7, "2026.07.22"));
    let response = client.request(repeat).await?;
    let replayed = response.headers().contains_key("idempotent-replayed");
    let answer = message(response.into_body()).await?;
    println!("\nthe repeat (replayed: {replayed}): {answer}");

    // 3. The same key for another call.
    let other = post(&url, session.as_deref(), Some(KEY), deploy(8, "2026.08.01"));
    let response = client.request(other).await?;
    let status = response.status();
    println!(
        "\nanother call under the key: HTTP {status} {}",
        message(response.into_body()).await?
    );

    let runs = deployments.load(std::sync::atomic::Ordering::SeqCst);
    println!("\ndeployments: {runs}");
    if runs != 1
        || !replayed
        || answer["id"] != 7
        || status != http::StatusCode::UNPROCESSABLE_ENTITY
    {
        return Err("the layer did not honour the key".into());
    }
    Ok(())
}
