//! The wire, parsing only: what an HTTP request to an MCP Streamable HTTP endpoint is.
//!
//! [`classify`] reads the HTTP method, the headers and the body bytes of a request and says what
//! the request is. The split that matters most to this crate is between a **stream resumption**
//! (GET with `Last-Event-ID`, which recovers the same response and can never run a tool again)
//! and a **POST of a `tools/call`** (which may run the action again).
//!
//! ```
//! use http::{HeaderMap, Method};
//! use mcp_replay_guard::protocol::{self, Message, RequestKind};
//!
//! let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call",
//!                 "params":{"name":"deploy_release","arguments":{"service":"catalog"}}}"#;
//! let mut headers = HeaderMap::new();
//! headers.insert("mcp-protocol-version", "2025-11-25".parse()?);
//! let request = protocol::classify(&Method::POST, &headers, body)?;
//! let RequestKind::Message(Message::ToolCall(call)) = request.kind else { unreachable!() };
//! assert_eq!(call.name, "deploy_release");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Rules that hold whatever the headers say:
//!
//! - A GET with a non-empty `Last-Event-ID` is a resume, even when it carries a stale
//!   `Mcp-Method` header (rmcp sends `server/discover` on its resume GETs).
//! - The body is validated as UTF-8 and parsed once; nothing is copied to parse it again.
//! - Malformed input is a [`ClassifyError`], never a panic.

pub(crate) mod headers;
pub(crate) mod jcs;
mod jsonrpc;
mod media;
pub(crate) mod meta;
pub(crate) mod numbers;
pub(crate) mod response;
pub(crate) mod shape;
pub(crate) mod sse;
pub(crate) mod tap;
pub(crate) mod tools_list;
pub(crate) mod transport;
mod version;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Method};

pub use jsonrpc::{CONTINUATION_PARAMS, Message, RequestId, TOOLS_CALL, ToolCall};
pub use media::{ACCEPT_BOTH, EVENT_STREAM, JSON, is_event_stream, media_type_is};
pub(crate) use numbers::INEXACT_NUMBER;
#[cfg(test)]
pub(crate) use numbers::LEXICAL_SCANS;
pub(crate) use numbers::{json_has_inexact_number, may_be_inexact};
pub use response::is_response_to;
pub use tools_list::ToolAnnotations;
pub use version::{Era, ProtocolVersion, UnsupportedProtocolVersion};

pub(crate) use jsonrpc::parse_tracking_duplicates;
use jsonrpc::{Parsed, message_from_envelope};

/// `MCP-Protocol-Version`: the negotiated revision.
pub const MCP_PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
/// `Mcp-Session-Id`: the session (2025-era servers).
pub const MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// `Last-Event-ID`: the SSE cursor a resume GET continues from.
pub const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
/// `Mcp-Method`: the body's method mirrored in a header (2026-07-28).
pub const MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`: the body's tool name, resource URI or task id mirrored in a header (2026-07-28).
pub const MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// JSON-RPC error code (2026-07-28) for a request whose `Mcp-Method` / `Mcp-Name` header is
/// missing, malformed or disagrees with its body; answered with HTTP 400.
pub const HEADER_MISMATCH: i64 = -32020;
/// JSON-RPC error code (2026-07-28) for an `MCP-Protocol-Version` the server does not speak;
/// answered with HTTP 400 and `data.supported`, the revisions it does speak.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// A classified request to an MCP endpoint.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ClassifiedRequest {
    /// The revision from `MCP-Protocol-Version` (2025-03-26 when absent).
    pub version: ProtocolVersion,
    /// `Mcp-Session-Id`, when the request carries one.
    pub session_id: Option<String>,
    /// What the request is.
    pub kind: RequestKind,
    /// Whether `version` came from the `MCP-Protocol-Version` header.
    version_from_header: bool,
}

/// The key of a 2026-07-28 request's `_meta` that names its protocol revision.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";

impl ClassifiedRequest {
    /// The era the caller speaks: the one place that decides the shape of an answer written
    /// for this request (a 2026-07-28 result carries `resultType`, an earlier one has none).
    ///
    /// The `MCP-Protocol-Version` header decides; a request without it may name its revision
    /// in a `tools/call`'s `_meta` ([`META_PROTOCOL_VERSION`]), as a stateless request does.
    pub fn era(&self) -> Era {
        if self.version_from_header {
            return self.version.era();
        }
        let named = match &self.kind {
            RequestKind::Message(Message::ToolCall(call)) => call
                .meta
                .as_ref()
                .and_then(|meta| meta.get(META_PROTOCOL_VERSION))
                .and_then(serde_json::Value::as_str)
                .and_then(|v| v.parse::<ProtocolVersion>().ok()),
            _ => None,
        };
        named.unwrap_or(self.version).era()
    }
}

/// The JSON-RPC id of a request body, read leniently: for an answer to a request that could
/// not be classified (a header that disagrees with the body, a duplicate key), so that the
/// caller can still match it to its request. `None` when the body has no readable id.
pub fn request_id_of(body: &[u8]) -> Option<RequestId> {
    #[derive(serde::Deserialize)]
    struct Envelope {
        id: Option<RequestId>,
    }
    serde_json::from_slice::<Envelope>(body).ok()?.id
}

/// What a request to an MCP endpoint is.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestKind {
    /// A POST carrying one JSON-RPC message.
    Message(Message),
    /// A POST carrying a JSON-RPC batch (2025-03-26 only).
    Batch(Vec<Message>),
    /// A GET with `Last-Event-ID`: resumes a broken response stream. Never a re-issue.
    Resume {
        /// The last event id the client saw.
        last_event_id: String,
    },
    /// A GET without `Last-Event-ID`: opens a stream for server-initiated messages.
    Listen,
    /// A DELETE: the client ends its session.
    EndSession,
}

impl RequestKind {
    /// The `tools/call` messages in the request (one for a single message, any number for a
    /// batch).
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        let messages: &[Message] = match self {
            Self::Message(message) => std::slice::from_ref(message),
            Self::Batch(messages) => messages,
            _ => &[],
        };
        messages.iter().filter_map(|m| match m {
            Message::ToolCall(call) => Some(call),
            _ => None,
        })
    }
}

/// Why a request could not be classified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClassifyError {
    /// The HTTP method is not one Streamable HTTP uses (POST, GET, DELETE).
    #[error("HTTP method {0} is not part of MCP Streamable HTTP (POST, GET, DELETE)")]
    UnsupportedHttpMethod(Method),
    /// `MCP-Protocol-Version` names a revision this crate does not speak.
    #[error(transparent)]
    UnsupportedProtocolVersion(#[from] UnsupportedProtocolVersion),
    /// A header MCP defines is not visible ASCII.
    #[error("the {0} header is not visible ASCII")]
    InvalidHeader(HeaderName),
    /// The body is not UTF-8.
    #[error("the body is not valid UTF-8 (first bad byte at offset {valid_up_to})")]
    InvalidUtf8 {
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// The body is not JSON.
    #[error("the body is not valid JSON: {0}")]
    InvalidJson(String),
    /// A message is a JSON value other than an object.
    #[error("a JSON-RPC message must be an object, not {0}")]
    NotAnObject(&'static str),
    /// The object is not a valid JSON-RPC 2.0 message.
    #[error("invalid JSON-RPC message: {0}")]
    InvalidEnvelope(String),
    /// A batch in a revision that has none, or an empty batch.
    #[error("{0}")]
    InvalidBatch(String),
    /// A `tools/call` without a string `params.name`.
    #[error("a tools/call needs a string `params.name`")]
    ToolCallWithoutName,
    /// A `tools/call` whose `params.arguments` is not an object.
    #[error("the arguments of a tools/call must be an object, not {0}")]
    InvalidArguments(&'static str),
    /// The same object key twice inside a `tools/call`: two readers could see two calls.
    #[error("a tools/call has the key {0:?} twice")]
    DuplicateKey(String),
    /// A 2026-07-28 request without a standard header its body needs: `Mcp-Method` on every
    /// request and notification, `Mcp-Name` on `tools/call`, `resources/read` and
    /// `prompts/get`. Only [`require_standard_headers`] reports it: the crate's own client
    /// path adds what is missing.
    #[error("the {0} header is missing (a 2026-07-28 request mirrors its body in it)")]
    MissingHeader(HeaderName),
    /// A 2026-07-28 `Mcp-Method` / `Mcp-Name` header that disagrees with the body.
    #[error("the {header} header says {header_value:?} but the body says {body_value:?}")]
    HeaderMismatch {
        /// The header that disagrees.
        header: HeaderName,
        /// What the header says.
        header_value: String,
        /// What the body says.
        body_value: String,
    },
}

impl ClassifyError {
    /// The JSON-RPC error code a server answers the request with: the era's own where it has
    /// one ([`HEADER_MISMATCH`] for a missing, malformed or disagreeing `Mcp-Method` /
    /// `Mcp-Name`, [`UNSUPPORTED_PROTOCOL_VERSION`]), else `-32600` (invalid request).
    pub fn jsonrpc_code(&self) -> i64 {
        match self {
            Self::MissingHeader(_) | Self::HeaderMismatch { .. } => HEADER_MISMATCH,
            Self::InvalidHeader(name) if *name == MCP_METHOD || *name == MCP_NAME => {
                HEADER_MISMATCH
            }
            Self::UnsupportedProtocolVersion(_) => UNSUPPORTED_PROTOCOL_VERSION,
            _ => -32600,
        }
    }
}

/// Checks a 2026-07-28 POST's standard headers as a server must: present
/// ([`ClassifyError::MissingHeader`]) and, as [`classify`] checks, agreeing with the body. For
/// a relay, which passes on what its client sent and never fills a header in (the guard fills
/// them on the crate's own client path). Any other request, and one that cannot be
/// classified, is `Ok`: its classification answers for it.
pub fn require_standard_headers(
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(), ClassifyError> {
    let Ok(request) = classify(method, headers, body) else {
        return Ok(());
    };
    let RequestKind::Message(message) = &request.kind else {
        return Ok(());
    };
    if !request.version.has_standard_headers() {
        return Ok(());
    }
    let Some(method) = message.method() else {
        return Ok(());
    };
    if !headers.contains_key(MCP_METHOD) {
        return Err(ClassifyError::MissingHeader(MCP_METHOD));
    }
    let named = [TOOLS_CALL, "resources/read", "prompts/get"].contains(&method);
    if named && !headers.contains_key(MCP_NAME) {
        return Err(ClassifyError::MissingHeader(MCP_NAME));
    }
    Ok(())
}

/// Whether a POST body may carry a `tools/call`, read without knowing its revision (its
/// `MCP-Protocol-Version` is one this crate does not speak): `false` only for one JSON object
/// whose `method`, given once, is another method, or that has none (a response).
pub(crate) fn may_call_a_tool(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
    }
    // A duplicate `method` is an error here: two readers could see two methods.
    match serde_json::from_slice::<Envelope<'_>>(body) {
        Ok(envelope) => envelope.method.is_some_and(|method| method == TOOLS_CALL),
        Err(_) => true,
    }
}

/// Classifies a request from its HTTP method, headers and body bytes.
///
/// The body is only read for POST. See the [module docs](self) for the rules.
pub fn classify(
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<ClassifiedRequest, ClassifyError> {
    classify_request(method, headers, body, || Bytes::copy_from_slice(body))
}

/// [`classify`] of a body the caller holds as [`Bytes`]: a `tools/call` keeps it (for its
/// arguments' tree form on demand) without a copy.
pub(crate) fn classify_bytes(
    method: &Method,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<ClassifiedRequest, ClassifyError> {
    classify_request(method, headers, body, || body.clone())
}

fn classify_request(
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
    source: impl FnOnce() -> Bytes,
) -> Result<ClassifiedRequest, ClassifyError> {
    let header = header_str(headers, &MCP_PROTOCOL_VERSION)?;
    let version = ProtocolVersion::from_header(header)?;
    let session_id = header_str(headers, &MCP_SESSION_ID)?.map(str::to_owned);
    let kind = match *method {
        Method::POST => classify_post(version, headers, body, source)?,
        // A GET is classified by its method and `Last-Event-ID` alone: a stale `Mcp-Method`
        // header on it never makes it a re-issue.
        Method::GET => match header_str(headers, &LAST_EVENT_ID)? {
            Some(id) if !id.is_empty() => RequestKind::Resume {
                last_event_id: id.to_owned(),
            },
            _ => RequestKind::Listen,
        },
        Method::DELETE => RequestKind::EndSession,
        ref other => return Err(ClassifyError::UnsupportedHttpMethod(other.clone())),
    };
    Ok(ClassifiedRequest {
        version,
        session_id,
        kind,
        version_from_header: header.is_some(),
    })
}

fn classify_post(
    version: ProtocolVersion,
    headers: &HeaderMap,
    body: &[u8],
    source: impl FnOnce() -> Bytes,
) -> Result<RequestKind, ClassifyError> {
    let text = std::str::from_utf8(body).map_err(|e| ClassifyError::InvalidUtf8 {
        valid_up_to: e.valid_up_to(),
    })?;
    let parsed = jsonrpc::parse_body(text)?;
    let source = source();
    match parsed {
        Parsed::Single(envelope) => {
            let message = message_from_envelope(*envelope, &source, None)?;
            if version.has_standard_headers() {
                check_standard_headers(headers, &message)?;
            }
            Ok(RequestKind::Message(message))
        }
        Parsed::Batch(_) if !version.allows_batches() => Err(ClassifyError::InvalidBatch(format!(
            "JSON-RPC batches are not allowed in MCP {version}"
        ))),
        Parsed::Batch(values) if values.is_empty() => Err(ClassifyError::InvalidBatch(
            "an empty JSON-RPC batch".into(),
        )),
        Parsed::Batch(values) => values
            .into_iter()
            .enumerate()
            .map(|(i, envelope)| message_from_envelope(envelope, &source, Some(i)))
            .collect::<Result<_, _>>()
            .map(RequestKind::Batch),
    }
}

/// Checks `Mcp-Method` / `Mcp-Name` against the body. An absent header is not a mismatch: the
/// guard adds the headers itself when it forwards a 2026-07-28 request.
fn check_standard_headers(headers: &HeaderMap, message: &Message) -> Result<(), ClassifyError> {
    let Some(method) = message.method() else {
        return Ok(());
    };
    if let Some(value) = header_str(headers, &MCP_METHOD)?
        && value != method
    {
        return Err(mismatch(MCP_METHOD, value, method));
    }
    if let (Message::ToolCall(call), Some(raw)) = (message, header_str(headers, &MCP_NAME)?) {
        let decoded = decode_header_value(raw);
        if decoded.as_deref() != Some(call.name.as_str()) {
            return Err(mismatch(MCP_NAME, raw, &call.name));
        }
    }
    Ok(())
}

fn mismatch(header: HeaderName, header_value: &str, body_value: &str) -> ClassifyError {
    // Both sides come from the request: bound them so an error message stays small.
    let bounded = |s: &str| s.chars().take(128).collect();
    ClassifyError::HeaderMismatch {
        header,
        header_value: bounded(header_value),
        body_value: bounded(body_value),
    }
}

/// Writes an `Mcp-Name`-style value: plain when it can travel as a bare header value, else
/// Base64 inside the `=?base64?…?=` sentinel.
pub fn encode_header_value(value: &str) -> http::HeaderValue {
    let bare = !value.is_empty()
        && value.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !value.starts_with([' ', '\t'])
        && !value.ends_with([' ', '\t'])
        && (!value.starts_with("=?base64?") || !value.ends_with("?="));
    let text = if bare {
        value.to_owned()
    } else {
        format!(
            "=?base64?{}?=",
            base64::engine::general_purpose::STANDARD.encode(value)
        )
    };
    http::HeaderValue::from_str(&text).unwrap_or_else(|_| http::HeaderValue::from_static(""))
}

/// Reads an `Mcp-Name`-style value: plain, or Base64 inside the `=?base64?…?=` sentinel that
/// 2026-07-28 uses for values that cannot travel as a bare header.
pub(crate) fn decode_header_value(raw: &str) -> Option<String> {
    match raw
        .strip_prefix("=?base64?")
        .and_then(|inner| inner.strip_suffix("?="))
    {
        Some(inner) => base64::engine::general_purpose::STANDARD
            .decode(inner)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(raw.to_owned()),
    }
}

/// The recorded target of a request: host, port and path, never the URI's userinfo or query
/// (either may carry a credential).
pub(crate) fn target_of(uri: &http::Uri) -> crate::Target {
    let host = uri.host().unwrap_or("");
    let port = uri.port().map(|p| format!(":{p}")).unwrap_or_default();
    crate::Target::new(format!("{host}{port}{}", uri.path()))
}

/// A resume GET's link to the broken stream it continues: the same event id on another
/// endpoint or session is another stream (event ids are only unique per stream, and a server
/// may number every stream from 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ResumeKey {
    target: crate::Target,
    session_id: Option<String>,
    last_event_id: String,
}

impl ResumeKey {
    pub(crate) fn new(
        target: crate::Target,
        session_id: Option<String>,
        last_event_id: impl Into<String>,
    ) -> Self {
        Self {
            target,
            session_id,
            last_event_id: last_event_id.into(),
        }
    }
}

fn header_str<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a str>, ClassifyError> {
    headers
        .get(name)
        .map(|v| {
            v.to_str()
                .map_err(|_| ClassifyError::InvalidHeader(name.clone()))
        })
        .transpose()
}

#[cfg(test)]
mod tests;
