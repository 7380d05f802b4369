//! Just enough of an MCP Streamable HTTP client for the CLI: build the POSTs of both protocol
//! eras, open the connection the server's era needs, and read one JSON-RPC answer out of a JSON
//! or SSE body.

use std::error::Error as StdError;

use anyhow::bail;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    protocol::{self, Era, ProtocolVersion},
    tools::sse::SseParser,
};
use serde_json::{Value, json};
use tower::{Service, ServiceExt};

pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The session-era version the CLI offers in `initialize`.
pub const SESSION_VERSION: &str = "2025-11-25";
/// The stateless era.
pub const STATELESS_VERSION: &str = "2026-07-28";

/// Bound on one answer the CLI reads (the guard bounds what it keeps separately).
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// `uri` without its `user:password@`, and whether it had one. HTTP never sends userinfo
/// (hyper builds `Host` from the host and port alone), but hyper-util's connection pool logs
/// the whole authority at DEBUG and TRACE: a URI that reaches the client has none.
pub fn without_userinfo(uri: Uri) -> anyhow::Result<(Uri, bool)> {
    let Some((_, host)) = uri.authority().and_then(|a| a.as_str().rsplit_once('@')) else {
        return Ok((uri, false));
    };
    // The message never shows the URI: it holds the credential.
    let host = host
        .parse()
        .map_err(|_| anyhow::anyhow!("the URL's host after its userinfo is not valid"))?;
    let mut parts = uri.into_parts();
    parts.authority = Some(host);
    let uri = Uri::from_parts(parts)
        .map_err(|_| anyhow::anyhow!("the URL without its userinfo is not valid"))?;
    Ok((uri, true))
}

/// What `call` and `proxy` say when a URL carried userinfo.
pub const USERINFO_NOT_SENT: &str = "the URL's `user:password@` is not sent (HTTP has no place for it); give a credential with --header 'Authorization: …'";

/// `--header 'Name: value'` arguments (of `call` and `proxy`), in order. A value may be a
/// credential: it never appears in an error.
pub fn parse_headers(headers: &[String]) -> anyhow::Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for header in headers {
        let Some((name, value)) = header.split_once(':') else {
            bail!("--header wants 'Name: value'; got a value without a colon");
        };
        // Not echoed either: a name typed with a space for its colon holds the credential.
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
            anyhow::anyhow!(
                "--header wants 'Name: value'; the text before the first ':' is not a header name"
            )
        })?;
        // The value may be a credential: it never appears in an error.
        let mut value = HeaderValue::from_str(value.trim()).map_err(|_| {
            anyhow::anyhow!("--header {name}: the value is not a valid header value")
        })?;
        // Never printed by `Debug`, never indexed by HTTP/2 header compression.
        value.set_sensitive(true);
        map.append(name, value);
    }
    Ok(map)
}

/// Which era to speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolChoice {
    /// Ask the server (`server/discover`), fall back to the `initialize` handshake.
    Auto,
    /// Sessions: `initialize` + `notifications/initialized`, `Mcp-Session-Id`, resumable SSE.
    #[value(name = "2025-11-25")]
    Sessions,
    /// Stateless: per-request `_meta`, no session, no resumption.
    #[value(name = "2026-07-28")]
    Stateless,
}

/// An open connection to one MCP endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: Uri,
    pub version: String,
    pub session: Option<String>,
    /// Headers the user asked for (`--header`), sent with every request.
    pub headers: HeaderMap,
}

/// What a POST got back.
#[derive(Debug)]
pub enum Reply {
    /// The JSON-RPC response to the request.
    Message(Value),
    /// An HTTP status other than success, with the start of its body.
    Http { status: StatusCode, body: String },
    /// 202 Accepted: the answer to a notification.
    Accepted,
}

/// Why no answer could be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The body broke before the answer arrived: the outcome is unknown.
    #[error("the response broke before its answer arrived: {0}")]
    Broken(BoxError),
    /// The body ended without an answer for the request.
    #[error("the response ended without an answer for the request")]
    NoAnswer,
    /// The answer is larger than the CLI reads.
    #[error("the answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}

impl Endpoint {
    pub fn new(url: Uri, headers: HeaderMap) -> Self {
        Self {
            url,
            version: SESSION_VERSION.to_owned(),
            session: None,
            headers,
        }
    }

    pub fn is_stateless(&self) -> bool {
        self.version.as_str() >= STATELESS_VERSION
    }

    /// A POST of `message` with the era's headers (and, stateless, its per-request `_meta`).
    pub fn post(&self, mut message: Value) -> Request<Full<Bytes>> {
        if self.is_stateless() && message.get("id").is_some() {
            let params = message
                .as_object_mut()
                .map(|m| m.entry("params").or_insert_with(|| json!({})));
            if let Some(Value::Object(params)) = params {
                params.insert("_meta".into(), stateless_meta(&self.version));
            }
        }
        let mut request = Request::post(self.url.clone())
            .body(Full::new(Bytes::from(message.to_string())))
            .expect("a URI that parsed makes a valid request");
        let headers = request.headers_mut();
        headers.extend(self.headers.clone());
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/json, text/event-stream"),
        );
        self.protocol_headers(headers);
        request
    }

    /// The DELETE that ends the session, if there is one.
    pub fn delete(&self) -> Option<Request<Full<Bytes>>> {
        self.session.as_ref()?;
        let mut request = Request::delete(self.url.clone())
            .body(Full::default())
            .expect("a URI that parsed makes a valid request");
        request.headers_mut().extend(self.headers.clone());
        self.protocol_headers(request.headers_mut());
        Some(request)
    }

    fn protocol_headers(&self, headers: &mut HeaderMap) {
        if let Ok(version) = HeaderValue::from_str(&self.version) {
            headers.insert("mcp-protocol-version", version);
        }
        if let Some(session) = self
            .session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            headers.insert("mcp-session-id", session);
        }
    }

    /// Opens the connection `choice` asks for: nothing to do for the stateless era, the
    /// `initialize` handshake for the session era, and for `auto` a `server/discover` first.
    pub async fn open<S, RB>(
        &mut self,
        client: &mut S,
        choice: ProtocolChoice,
    ) -> Result<(), BoxError>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
    {
        match choice {
            ProtocolChoice::Stateless => {
                self.version = STATELESS_VERSION.to_owned();
                Ok(())
            }
            ProtocolChoice::Sessions => self.initialize(client, SESSION_VERSION).await,
            ProtocolChoice::Auto => match self.discover(client).await? {
                version if version.era() == Era::Stateless => {
                    self.version = version.as_str().to_owned();
                    Ok(())
                }
                version => self.initialize(client, version.as_str()).await,
            },
        }
    }

    /// `server/discover`: which revision to speak. The stateless era when the server names
    /// it; after its answer that it does not speak that revision (`-32022`), the newest of
    /// the revisions it names in `data.supported` that this command speaks; otherwise (a
    /// server of the session era, which knows no `server/discover`) the session era.
    async fn discover<S, RB>(&mut self, client: &mut S) -> Result<ProtocolVersion, BoxError>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
    {
        let probe = Self {
            version: STATELESS_VERSION.to_owned(),
            session: None,
            ..self.clone()
        };
        let request = probe.post(json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover"}));
        let response = send(client, request).await?;
        let message = match read_reply(response, &json!(0)).await {
            Ok(Reply::Message(message)) => message,
            // The era's refusals come with HTTP 400.
            Ok(Reply::Http { body, .. }) => serde_json::from_str(&body).unwrap_or_default(),
            _ => Value::Null,
        };
        let stateless = message["result"]["supportedVersions"]
            .as_array()
            .is_some_and(|versions| versions.iter().any(|v| v == STATELESS_VERSION));
        if stateless {
            return Ok(ProtocolVersion::V2026_07_28);
        }
        let error = &message["error"];
        if error["code"] != protocol::UNSUPPORTED_PROTOCOL_VERSION {
            return Ok(ProtocolVersion::V2025_11_25);
        }
        let supported: Vec<&str> = error["data"]["supported"]
            .as_array()
            .map(|versions| versions.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        ProtocolVersion::ALL
            .into_iter()
            .rev()
            .find(|version| supported.contains(&version.as_str()))
            .ok_or_else(|| {
                let named: Vec<String> = supported
                    .iter()
                    .take(8)
                    .map(|v| format!("{:?}", v.chars().take(32).collect::<String>()))
                    .collect();
                let ours: Vec<&str> = ProtocolVersion::ALL.iter().map(|v| v.as_str()).collect();
                format!(
                    "the server speaks none of the MCP revisions this command speaks ({}): it named [{}]",
                    ours.join(", "),
                    named.join(", ")
                )
                .into()
            })
    }

    /// The session era's `initialize` handshake, asking for `version`.
    async fn initialize<S, RB>(&mut self, client: &mut S, version: &str) -> Result<(), BoxError>
    where
        S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
        S::Error: Into<BoxError>,
        RB: Body<Data = Bytes>,
        RB::Error: Into<BoxError>,
    {
        self.version = version.to_owned();
        self.session = None;
        let request = self.post(json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": version,
                "capabilities": {},
                "clientInfo": client_info(),
            }
        }));
        let response = send(client, request).await?;
        self.session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        match read_reply(response, &json!(0)).await? {
            Reply::Message(message) if message.get("result").is_some() => {
                if let Some(version) = message["result"]["protocolVersion"].as_str() {
                    self.version = version.to_owned();
                }
            }
            Reply::Message(message) => {
                return Err(format!("the server refused initialize: {}", message["error"]).into());
            }
            Reply::Http { status, body } => {
                return Err(
                    format!("the server answered initialize with HTTP {status}: {body}").into(),
                );
            }
            Reply::Accepted => {
                return Err("the server answered initialize with 202 and no result".into());
            }
        }
        let request = self.post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let response = send(client, request).await?;
        if !response.status().is_success() {
            return Err(format!(
                "the server answered notifications/initialized with HTTP {}",
                response.status()
            )
            .into());
        }
        let _ = response.into_body().collect().await;
        Ok(())
    }
}

fn client_info() -> Value {
    json!({"name": "replay-guard", "version": env!("CARGO_PKG_VERSION")})
}

fn stateless_meta(version: &str) -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": client_info(),
    })
}

/// Drives `client` to readiness and sends `request`.
pub async fn send<S, RB>(
    client: &mut S,
    request: Request<Full<Bytes>>,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    client
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)
}

/// Reads the JSON-RPC response for `id` out of a JSON or SSE body. An SSE stream is left as soon
/// as the answer is in: the delivery is the caller's to record, once it holds the answer.
pub async fn read_reply<B>(response: Response<B>, id: &Value) -> Result<Reply, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    let sse = is_event_stream(response.headers());
    let mut body = std::pin::pin!(response.into_body());
    if status == StatusCode::ACCEPTED {
        return Ok(Reply::Accepted);
    }
    if !status.is_success() {
        let bytes = read_to_end(body.as_mut()).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]).into_owned();
        return Ok(Reply::Http { status, body: text });
    }
    let answer = if sse {
        let mut parser = SseParser::with_max_event_size(MAX_ANSWER_BYTES);
        let mut found = None;
        while found.is_none() {
            let Some(frame) = body.frame().await else {
                return Err(ReadError::NoAnswer);
            };
            let frame = frame.map_err(|e| ReadError::Broken(e.into()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            parser
                .push(&data, |event| {
                    if found.is_none()
                        && is_answer_to(event.data.as_bytes(), id)
                        && let Ok(message) = serde_json::from_str::<Value>(&event.data)
                    {
                        found = Some(message);
                    }
                })
                .map_err(|_| ReadError::TooLarge)?;
        }
        found.ok_or(ReadError::NoAnswer)?
    } else {
        let bytes = read_to_end(body.as_mut()).await?;
        is_answer_to(&bytes, id)
            .then(|| serde_json::from_slice::<Value>(&bytes).ok())
            .flatten()
            .ok_or(ReadError::NoAnswer)?
    };
    Ok(Reply::Message(answer))
}

/// Whether `message` answers the request `id` (a result or an error): the library's rule.
fn is_answer_to(message: &[u8], id: &Value) -> bool {
    serde_json::from_value::<protocol::RequestId>(id.clone())
        .is_ok_and(|id| protocol::is_response_to(message, &id))
}

async fn read_to_end<B>(mut body: std::pin::Pin<&mut B>) -> Result<Vec<u8>, ReadError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Broken(e.into()))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > MAX_ANSWER_BYTES {
                return Err(ReadError::TooLarge);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes)
}

/// Whether a response's `Content-Type` says SSE (compared as a media type, in `protocol`).
pub use mcp_replay_guard::protocol::is_event_stream;

/// An error and its sources on one line (`a: b: c`), for messages that say what went wrong.
pub fn describe(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
