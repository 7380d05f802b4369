//! What the hyper examples send and read over MCP's Streamable HTTP: a POST, the JSON-RPC
//! messages of an answer (JSON or SSE), the session handshake and the `deploy_release` call.
//! Shared with `#[path = "support/mcp_http.rs"] mod mcp_http;`.
#![allow(dead_code)] // each example uses a part of it

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::{Service, ServiceExt};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A POST of one JSON-RPC message, in the 2025-11-25 era, inside `session` if there is one.
pub fn post(url: &str, session: Option<&str>, body: Value) -> Request<Full<Bytes>> {
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
pub async fn messages<B>(body: B) -> Result<Vec<Value>, BoxError>
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

/// `initialize` and `notifications/initialized` through `client` (the guard passes both
/// through untouched); the session the server opened, if it did.
pub async fn open_session<S, B>(
    client: &mut S,
    url: &str,
    name: &str,
) -> Result<Option<String>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": name, "version": "0"}}});
    let response = client
        .ready()
        .await
        .map_err(Into::into)?
        .call(post(url, None, initialize))
        .await
        .map_err(Into::into)?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    messages(response.into_body()).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = client
        .ready()
        .await
        .map_err(Into::into)?
        .call(post(url, session.as_deref(), initialized))
        .await
        .map_err(Into::into)?;
    messages(response.into_body()).await?;
    Ok(session)
}

/// The `tools/call` of `deploy_release` the examples make, under JSON-RPC id `id`.
pub fn deploy(id: i64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "deploy_release", "arguments": {"service": "catalog", "version": "2026.07.22"}}})
}

/// The text of a `CallToolResult` answer's first content block, or the error it carries.
pub fn answer_text(messages: &[Value]) -> String {
    let Some(message) = messages.iter().find(|m| m.get("id").is_some()) else {
        return "(no answer)".into();
    };
    match message["result"]["content"][0]["text"].as_str() {
        Some(text) => text.to_owned(),
        None => message.to_string(),
    }
}

/// What a call came back with, for the examples' printouts: its HTTP status, or the error.
pub fn outcome<B, E: std::fmt::Display>(result: &Result<http::Response<B>, E>) -> String {
    match result {
        Ok(response) => response.status().to_string(),
        Err(error) => error.to_string(),
    }
}
