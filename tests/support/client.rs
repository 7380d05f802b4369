//! Client helpers, generic over any tower stack whose request body is
//! `Full<Bytes>` (a bare hyper-util client, or that client wrapped in the
//! guard under test).

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use serde_json::{Value, json};
use tower::{Service, ServiceExt};

use super::{
    BoxError, IDEMPOTENCY_KEY_HEADER, PROTOCOL_VERSION, STATELESS_PROTOCOL_VERSION,
    sse::{SseReader, is_jsonrpc_response},
};

/// A plain hyper-util client (HTTP/1, connection pooling as usual).
pub fn hyper_client() -> Client<HttpConnector, Full<Bytes>> {
    hyper_client_with_body()
}

/// The same client for another request body type.
pub fn hyper_client_with_body<B>() -> Client<HttpConnector, B>
where
    B: Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Client::builder(TokioExecutor::new()).build_http()
}

/// A JSON-RPC POST to `url` with the headers a Streamable HTTP client sends:
/// `Content-Type: application/json`, `Accept: application/json,
/// text/event-stream`, `MCP-Protocol-Version: version`, and `Mcp-Session-Id`
/// when `session` is given. For `version >= 2026-07-28` it also sets the
/// SEP-2243 `Mcp-Method` and (for `tools/call`, `prompts/get`,
/// `resources/read`) `Mcp-Name` headers from the body, as rmcp requires.
pub fn post(url: &str, session: Option<&str>, version: &str, body: Value) -> Request<Full<Bytes>> {
    let mut builder = Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", version);
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    if version >= STATELESS_PROTOCOL_VERSION
        && let Some(method) = body.get("method").and_then(Value::as_str)
    {
        builder = builder.header("mcp-method", method);
        let name = match method {
            "tools/call" | "prompts/get" => body.pointer("/params/name"),
            "resources/read" => body.pointer("/params/uri"),
            _ => None,
        };
        if let Some(name) = name.and_then(Value::as_str) {
            builder = builder.header("mcp-name", name);
        }
    }
    builder
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("valid request")
}

/// A `GET` that opens (or, with `last_event_id`, resumes) an SSE stream.
pub fn get_stream(
    url: &str,
    session: Option<&str>,
    version: &str,
    last_event_id: Option<&str>,
) -> Request<Full<Bytes>> {
    let mut builder = Request::get(url)
        .header(http::header::ACCEPT, "text/event-stream")
        .header("mcp-protocol-version", version);
    if let Some(session) = session {
        builder = builder.header("mcp-session-id", session);
    }
    if let Some(id) = last_event_id {
        builder = builder.header("last-event-id", id);
    }
    builder
        .body(Full::new(Bytes::new()))
        .expect("valid request")
}

/// A `DELETE` that ends a session.
pub fn delete_session(url: &str, session: &str, version: &str) -> Request<Full<Bytes>> {
    Request::delete(url)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", version)
        .body(Full::new(Bytes::new()))
        .expect("valid request")
}

/// Add an `Idempotency-Key` header to a request.
pub fn with_idempotency_key<B>(mut request: Request<B>, key: &str) -> Request<B> {
    request.headers_mut().insert(
        IDEMPOTENCY_KEY_HEADER,
        http::HeaderValue::from_str(key).expect("valid header value"),
    );
    request
}

/// `{"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}}`
pub fn tool_call_body(id: impl Into<Value>, tool: &str, args: Value) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.into(),
        "method": "tools/call",
        "params": {"name": tool, "arguments": args},
    })
}

/// The per-request `_meta` a 2026-07-28 (stateless) request carries.
pub fn stateless_meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": STATELESS_PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "support-client", "version": "0.0.0"},
    })
}

/// A 2026-07-28 `tools/call` body: [`tool_call_body`] plus `params._meta`.
pub fn stateless_tool_call_body(id: impl Into<Value>, tool: &str, args: Value) -> Value {
    let mut body = tool_call_body(id, tool, args);
    body["params"]["_meta"] = stateless_meta();
    body
}

/// `initialize` request body for `version`.
pub fn initialize_body(id: impl Into<Value>, version: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.into(),
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "support-client", "version": "0.0.0"},
        },
    })
}

/// Drive `svc` to readiness and send `request`.
pub async fn send<S, RB>(
    svc: &mut S,
    request: Request<Full<Bytes>>,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    let svc = svc.ready().await.map_err(Into::into)?;
    svc.call(request).await.map_err(Into::into)
}

/// Read a whole body as text (errors if the body fails).
pub async fn body_text<B>(body: B) -> Result<String, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn content_type<B>(response: &Response<B>) -> String {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// The JSON-RPC response (or error) object with `id` from an HTTP response:
/// `application/json` bodies are parsed whole (a batch array is searched),
/// `text/event-stream` bodies are read event by event until that message
/// arrives (so an open GET stream is fine). Non-2xx statuses, body errors and
/// streams that end without the message are errors.
pub async fn read_jsonrpc_response<B>(response: Response<B>, id: &Value) -> Result<Value, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    let content_type = content_type(&response);
    if !status.is_success() {
        let text = body_text(response.into_body()).await.unwrap_or_default();
        return Err(format!("HTTP {status}: {text}").into());
    }
    let matches = |v: &Value| is_jsonrpc_response(v) && v.get("id") == Some(id);
    if content_type.starts_with("text/event-stream") {
        let mut reader = SseReader::new(response.into_body());
        while let Some(event) = reader.next_event().await? {
            if let Some(message) = event.json() {
                if matches(&message) {
                    return Ok(message);
                }
                if let Some(found) = message
                    .as_array()
                    .and_then(|batch| batch.iter().find(|m| matches(m)))
                {
                    return Ok(found.clone());
                }
            }
        }
        return Err(format!("SSE stream ended without a response for id {id}").into());
    }
    let text = body_text(response.into_body()).await?;
    let message: Value =
        serde_json::from_str(&text).map_err(|e| format!("bad JSON body {text:?}: {e}"))?;
    if matches(&message) {
        return Ok(message);
    }
    if let Some(found) = message
        .as_array()
        .and_then(|batch| batch.iter().find(|m| matches(m)))
    {
        return Ok(found.clone());
    }
    Err(format!("no JSON-RPC response for id {id} in {text}").into())
}

/// `initialize` (2025-11-25) + `notifications/initialized`; returns the
/// `Mcp-Session-Id` (`None` from a stateless server).
pub async fn initialize<S, RB>(svc: &mut S, url: &str) -> Result<Option<String>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    initialize_with_version(svc, url, PROTOCOL_VERSION).await
}

/// [`initialize`] for another handshake version.
pub async fn initialize_with_version<S, RB>(
    svc: &mut S,
    url: &str,
    version: &str,
) -> Result<Option<String>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let id = json!(0);
    let response = send(svc, post(url, None, version, initialize_body(0, version))).await?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let message = read_jsonrpc_response(response, &id).await?;
    if message.get("error").is_some() {
        return Err(format!("initialize failed: {message}").into());
    }
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = send(svc, post(url, session.as_deref(), version, initialized)).await?;
    let status = response.status();
    let text = body_text(response.into_body()).await?;
    if !status.is_success() {
        return Err(format!("notifications/initialized: HTTP {status}: {text}").into());
    }
    Ok(session)
}

/// `tools/call` (2025-11-25 headers); returns the JSON-RPC response object.
pub async fn call_tool<S, RB>(
    svc: &mut S,
    url: &str,
    session: Option<&str>,
    id: i64,
    tool: &str,
    args: Value,
) -> Result<Value, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let request = post(
        url,
        session,
        PROTOCOL_VERSION,
        tool_call_body(id, tool, args),
    );
    let response = send(svc, request).await?;
    read_jsonrpc_response(response, &json!(id)).await
}

/// `tools/call` the 2026-07-28 way: no session, per-request `_meta`,
/// `Mcp-Method`/`Mcp-Name` headers.
pub async fn call_tool_stateless<S, RB>(
    svc: &mut S,
    url: &str,
    id: i64,
    tool: &str,
    args: Value,
) -> Result<Value, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Error: Into<BoxError>,
{
    let request = post(
        url,
        None,
        STATELESS_PROTOCOL_VERSION,
        stateless_tool_call_body(id, tool, args),
    );
    let response = send(svc, request).await?;
    read_jsonrpc_response(response, &json!(id)).await
}

/// The `structuredContent` of a successful `tools/call` response.
pub fn structured(response: &Value) -> Option<&Value> {
    response.pointer("/result/structuredContent")
}

/// The first text content block of a `tools/call` response.
pub fn first_text(response: &Value) -> Option<&str> {
    response
        .pointer("/result/content/0/text")
        .and_then(Value::as_str)
}

/// True when `error` (or any error in its `source()` chain) is hyper's
/// "connection closed before message completed" / a reset / a body error,
/// i.e. the exchange was lost rather than answered.
pub fn is_lost_exchange(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<hyper::Error>()
            && (h.is_incomplete_message()
                || h.is_canceled()
                || h.is_closed()
                || h.is_body_write_aborted())
        {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Render an error with its whole `source()` chain.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        out.push_str(": ");
        out.push_str(&e.to_string());
        current = e.source();
    }
    out
}

/// Reads a response body to its end, as a client that consumes the whole stream does, and
/// returns the first JSON-RPC response (a message with `result` or `error`) in it, JSON or SSE.
pub async fn read_response_to_end<B>(response: Response<B>) -> Value
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let text = body_text(response.into_body())
        .await
        .expect("the body reads to its end");
    let data_lines = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim);
    std::iter::once(text.trim())
        .chain(data_lines)
        .filter_map(|s| serde_json::from_str::<Value>(s).ok())
        .find(is_jsonrpc_response)
        .unwrap_or_else(|| panic!("no JSON-RPC response in {text}"))
}
