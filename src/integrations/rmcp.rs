//! An rmcp [`StreamableHttpClient`] over any tower service, so that an rmcp client runs over a
//! tower stack: [`GuardLayer`](crate::guard::GuardLayer) in front of a hyper client, say.
//!
//! rmcp's Streamable HTTP transport is generic over its HTTP backend, the
//! [`StreamableHttpClient`] trait, and ships backends for reqwest and Unix sockets only.
//! [`TowerHttpClient`] is that backend for any
//! `Service<http::Request<Full<Bytes>>, Response = http::Response<B>>`: it builds the requests
//! rmcp's reqwest backend builds, and turns the responses into what rmcp's worker expects.
//!
//! ```no_run
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{
//!     contract::{ContractRegistry, ToolContract},
//!     fingerprint::FingerprintKey,
//!     guard::{GuardLayer, GuardRequestBody},
//!     integrations::rmcp::TowerHttpClient,
//!     ledger::MemoryLedger,
//! };
//! use rmcp::{
//!     ServiceExt,
//!     model::CallToolRequestParams,
//!     transport::{
//!         StreamableHttpClientTransport,
//!         streamable_http_client::StreamableHttpClientTransportConfig,
//!     },
//! };
//! use tower::ServiceBuilder;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let contracts = ContractRegistry::builder()
//!     .tool("deploy_release", ToolContract::irreversible())
//!     .build()?;
//! let stack = ServiceBuilder::new()
//!     .layer(GuardLayer::new(MemoryLedger::new(), contracts, FingerprintKey::generate()?))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//! let transport = StreamableHttpClientTransport::with_client(
//!     TowerHttpClient::new(stack),
//!     StreamableHttpClientTransportConfig::with_uri("http://127.0.0.1:8000/mcp"),
//! );
//! let client = ().serve(transport).await?;
//!
//! let arguments = serde_json::json!({"service": "catalog", "version": "2026.07.22"});
//! let call = CallToolRequestParams::new("deploy_release")
//!     .with_arguments(arguments.as_object().cloned().unwrap_or_default());
//! let result = client.call_tool(call).await?;
//! println!("{result:?}");
//! client.cancel().await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What goes on the wire
//!
//! What rmcp's own reqwest backend sends, header for header:
//!
//! - `POST`: `Accept: text/event-stream, application/json`, `Content-Type: application/json`
//!   (unless a custom header set one), `Authorization: Bearer …` from the transport's
//!   `auth_header`, `Mcp-Session-Id` once the server issued one, and the transport's custom
//!   headers. rmcp's worker puts `MCP-Protocol-Version` and, from 2026-07-28 on, the SEP-2243
//!   `Mcp-Method` / `Mcp-Name` / `Mcp-Param-*` headers into those custom headers itself, so they
//!   are exactly what rmcp computes.
//! - `GET`: the same `Accept`, `Mcp-Session-Id` when there is a session, `Last-Event-ID` on a
//!   resume, the bearer token and the custom headers.
//! - `DELETE`: `Mcp-Session-Id`, the bearer token and the custom headers.
//!
//! A custom header named `Accept`, `Mcp-Session-Id` or `Last-Event-ID` is refused with
//! [`StreamableHttpError::ReservedHeaderConflict`] before anything is sent, as rmcp does.
//!
//! # How responses are read
//!
//! `202` and `204` are [`StreamableHttpPostResponse::Accepted`]; a `404` to a request that
//! carried a session is [`StreamableHttpError::SessionExpired`], the error on which rmcp
//! re-initialises and re-sends; `401` and `403` with a `WWW-Authenticate` challenge are
//! [`StreamableHttpError::AuthRequired`] and [`StreamableHttpError::InsufficientScope`];
//! `429` and `5xx` are [`StreamableHttpError::HttpStatus`]; a `GET` answered `405` is
//! [`StreamableHttpError::ServerDoesNotSupportSse`]. A `text/event-stream` body is parsed
//! incrementally by this crate's [`SseParser`]; an `application/json` body is read whole.
//!
//! # Limits
//!
//! The transport's [`StreamableHttpResponseLimits`] are enforced before anything is parsed, and
//! a response over a limit is an error, never an unbounded allocation:
//!
//! - a JSON body over `max_json_response_size` (declared or counted) is
//!   [`StreamableHttpError::ResponseBodyTooLarge`];
//! - an SSE event over `max_sse_event_size` ends the stream with an error whose source is a
//!   [`TowerClientError`] for which [`is_event_too_large`](TowerClientError::is_event_too_large)
//!   holds. rmcp recognises only its own backends' oversize error as final, so the adapter
//!   also refuses, without sending it, the `GET` with which rmcp would try to resume that
//!   stream (a replay would carry the same event): the call fails as it does over reqwest;
//! - an error body that is not a JSON-RPC error is kept only up to `max_error_response_size`.
//!
//! # When the rest of a response stream is read
//!
//! A request's SSE stream (a `POST`'s, or a `GET` resuming one) ends right after the request's
//! JSON-RPC response. rmcp means to read on to that end, to return the HTTP/1.1 connection to
//! the pool, but in the session era (2025-11-25 and before) it drops the stream as soon as the
//! response has reached its worker, before the end arrives. When rmcp drops such a stream after
//! it asked for the item that follows the response (so the response is in its hands), the
//! adapter reads the rest of the body in the background, for at most five seconds. A guard
//! below it then sees the body read to its end and records the execution `delivered`, as it
//! does in the 2026-07-28 era, where rmcp reads the end itself. A stream dropped before rmcp
//! took the response is left alone: its execution stays undelivered.
//!
//! # When a call is re-sent
//!
//! Never by the adapter: every method sends one request. rmcp re-sends in two places, both
//! visible to a guard below the adapter: after a `404` session expiry it re-initialises and
//! re-`POST`s the same message once, and on a broken response stream that carried an event id
//! it resumes with `GET` + `Last-Event-ID` (a resume, not a re-issue).

use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes};
use futures_core::{Stream, stream::BoxStream};
use http::{
    HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode,
    header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE},
};
use http_body::Body;
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use rmcp::{
    ErrorData,
    model::{ClientJsonRpcMessage, ClientRequest, ServerJsonRpcMessage},
    transport::streamable_http_client::{
        AuthRequiredError, HttpStatusError, InsufficientScopeError, SseError, StreamableHttpClient,
        StreamableHttpError, StreamableHttpPostResponse, StreamableHttpResponseLimits,
    },
};
use serde::de::IgnoredAny;
use sse_stream::Sse;
use tower_service::Service;

use crate::{
    guard::BoxError,
    protocol::sse::{SseEvent, SseParser},
};

const EVENT_STREAM: &str = "text/event-stream";
const JSON: &str = "application/json";
const ACCEPT_BOTH: &str = "text/event-stream, application/json";
const SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");
/// Headers a custom header may not set (rmcp sets them itself). `MCP-Protocol-Version` is not
/// among them: rmcp's worker injects it as a custom header.
const RESERVED: [&str; 3] = ["accept", "mcp-session-id", "last-event-id"];
/// The longest `Retry-After` kept in an [`HttpStatusError`].
const MAX_RETRY_AFTER: usize = 128;
/// How much of an unparsable JSON body an error message quotes.
const BODY_PREVIEW: usize = 256;
/// How many refused resume points are remembered (see `# Limits` in the module docs).
const REFUSED_RESUMES: usize = 64;
const READ_FAILURE: &str = "<failed to read response body>";

type Error = StreamableHttpError<TowerClientError>;

/// An rmcp [`StreamableHttpClient`] over a tower `Service<http::Request<Full<Bytes>>>`.
///
/// See the [module docs](self) for what it sends and how it reads the answers.
///
/// The inner service need not be `Sync`: each request is sent through its own clone of it,
/// driven to readiness first, as tower expects.
///
/// # Clone
///
/// rmcp clones its client for every request and stream. Clones share one small table: the
/// stream positions whose resumption is refused because the stream carried an oversized event
/// (see `# Limits` in the [module docs](self)).
#[derive(Clone, Debug)]
pub struct TowerHttpClient<S> {
    service: S,
    refused: Arc<RefusedResumes>,
}

impl<S> TowerHttpClient<S> {
    /// An rmcp client backend sending through `service`.
    pub fn new(service: S) -> Self {
        Self {
            service,
            refused: Arc::default(),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.service
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.service
    }
}

impl<S, RB> StreamableHttpClient for TowerHttpClient<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    type Error = TowerClientError;

    fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
    }

    fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
    }

    fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> impl Future<Output = Result<StreamableHttpPostResponse, Error>> + Send + '_ {
        let service = self.service.clone();
        let refused = self.refused.clone();
        async move {
            let body = serde_json::to_vec(&message)
                .map_err(|e| StreamableHttpError::Client(TowerClientError::request(e)))?;
            let request = Outgoing {
                method: Method::POST,
                uri: &uri,
                accept: true,
                auth_header,
                custom_headers,
                session_id: session_id.as_deref(),
                last_event_id: None,
                body: Some(Bytes::from(body)),
            }
            .build()?;
            let response = send(service, request).await?;
            let stream = StreamKey {
                uri,
                session_id: session_id.clone(),
                refused,
            };
            read_post_response(response, &message, session_id.is_some(), limits, stream).await
        }
    }

    fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        let service = self.service.clone();
        async move {
            let request = Outgoing {
                method: Method::DELETE,
                uri: &uri,
                accept: false,
                auth_header,
                custom_headers,
                session_id: Some(&session_id),
                last_event_id: None,
                body: None,
            }
            .build()?;
            let status = send(service, request).await?.status();
            if status == StatusCode::METHOD_NOT_ALLOWED {
                tracing::debug!("the server does not support deleting a session");
                return Ok(());
            }
            if !status.is_success() {
                return Err(StreamableHttpError::Client(
                    TowerClientError::unexpected_status(status),
                ));
            }
            Ok(())
        }
    }

    fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, Error>> + Send + '_
    {
        self.get_stream_with_max_sse_event_size(
            uri,
            session_id,
            last_event_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default().max_sse_event_size,
        )
    }

    fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> impl Future<Output = Result<BoxStream<'static, Result<Sse, SseError>>, Error>> + Send + '_
    {
        let service = self.service.clone();
        let refused = self.refused.clone();
        async move {
            let stream = StreamKey {
                uri,
                session_id,
                refused,
            };
            if let Some(id) = &last_event_id
                && stream.take_refused(id)
            {
                tracing::warn!(
                    last_event_id = %id,
                    "not resuming an SSE stream that carried an event over max_sse_event_size \
                     (a replay would carry it again); ending it"
                );
                // With the two auth errors, the only ones on which rmcp 3.11 stops reconnecting;
                // the request then fails as over rmcp's own backends (transport closed).
                return Err(StreamableHttpError::ServerDoesNotSupportSse);
            }
            let request = Outgoing {
                method: Method::GET,
                uri: &stream.uri,
                accept: true,
                auth_header,
                custom_headers,
                session_id: stream.session_id.as_deref(),
                last_event_id: last_event_id.as_deref(),
                body: None,
            }
            .build()?;
            let response = send(service, request).await?;
            let status = response.status();
            if status == StatusCode::METHOD_NOT_ALLOWED {
                return Err(StreamableHttpError::ServerDoesNotSupportSse);
            }
            auth_challenge(status, response.headers())?;
            if let Some(error) = status_error(status, response.headers()) {
                return Err(error.into());
            }
            if !status.is_success() {
                return Err(StreamableHttpError::Client(
                    TowerClientError::unexpected_status(status),
                ));
            }
            match response.headers().get(CONTENT_TYPE) {
                Some(ct) if media_type_is(ct, EVENT_STREAM) || media_type_is(ct, JSON) => {}
                other => return Err(unexpected_content_type(other)),
            }
            // A resume carries a request's response; a listen stream does not end with one.
            let carries_response = last_event_id.is_some();
            let body = response.into_body();
            Ok(SseBody::new(
                body,
                max_sse_event_size,
                stream,
                last_event_id,
                carries_response,
            )
            .boxed())
        }
    }
}

/// Drives `service` to readiness and sends `request`.
async fn send<S, RB>(mut service: S, request: Request<Full<Bytes>>) -> Result<Response<RB>, Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    let client_error = |e: S::Error| StreamableHttpError::Client(TowerClientError::service(e));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(client_error)?;
    service.call(request).await.map_err(client_error)
}

/// One request as rmcp describes it.
struct Outgoing<'a> {
    method: Method,
    uri: &'a str,
    accept: bool,
    auth_header: Option<String>,
    custom_headers: HashMap<HeaderName, HeaderValue>,
    session_id: Option<&'a str>,
    last_event_id: Option<&'a str>,
    body: Option<Bytes>,
}

impl Outgoing<'_> {
    fn build(self) -> Result<Request<Full<Bytes>>, Error> {
        let invalid = |e: http::Error| StreamableHttpError::Client(TowerClientError::request(e));
        if let Some(name) = self
            .custom_headers
            .keys()
            .find(|name| RESERVED.contains(&name.as_str()))
        {
            return Err(StreamableHttpError::ReservedHeaderConflict(
                name.to_string(),
            ));
        }
        let mut request = Request::builder()
            .method(self.method)
            .uri(self.uri)
            .body(Full::new(self.body.clone().unwrap_or_default()))
            .map_err(invalid)?;
        let headers = request.headers_mut();
        if self.accept {
            headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        }
        if let Some(token) = self.auth_header {
            let mut value = header_value(&format!("Bearer {token}"))?;
            value.set_sensitive(true);
            headers.append(AUTHORIZATION, value);
        }
        for (name, value) in self.custom_headers {
            headers.append(name, value);
        }
        if let Some(session_id) = self.session_id {
            headers.insert(SESSION_ID, header_value(session_id)?);
        }
        if let Some(id) = self.last_event_id {
            headers.insert(LAST_EVENT_ID, header_value(id)?);
        }
        if self.body.is_some() && !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
        }
        Ok(request)
    }
}

fn header_value(value: &str) -> Result<HeaderValue, Error> {
    HeaderValue::from_str(value)
        .map_err(|e| StreamableHttpError::Client(TowerClientError::request(e)))
}

/// Reads the answer to a `POST` the way rmcp's reqwest backend does.
async fn read_post_response<RB>(
    response: Response<RB>,
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    limits: StreamableHttpResponseLimits,
    stream: StreamKey,
) -> Result<StreamableHttpPostResponse, Error>
where
    RB: Body + Send + 'static,
    RB::Data: Send,
    RB::Error: Into<BoxError>,
{
    let status = response.status();
    auth_challenge(status, response.headers())?;
    if matches!(status, StatusCode::ACCEPTED | StatusCode::NO_CONTENT) {
        return Ok(StreamableHttpPostResponse::Accepted);
    }
    if status == StatusCode::NOT_FOUND && session_was_attached {
        return Err(StreamableHttpError::SessionExpired);
    }
    let content_type = response.headers().get(CONTENT_TYPE).cloned();
    let is_json = content_type
        .as_ref()
        .is_some_and(|ct| media_type_is(ct, JSON));
    // A 429, and a 5xx that cannot carry a JSON-RPC error, return without reading the body.
    let status_error = match status_error(status, response.headers()) {
        Some(error) if !is_json || status == StatusCode::TOO_MANY_REQUESTS => {
            return Err(error.into());
        }
        other => other,
    };
    let session_id = response
        .headers()
        .get(&SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Nothing in the answer to a notification, response or error is load-bearing.
    let awaits_no_response = !matches!(message, ClientJsonRpcMessage::Request(_));
    let body = response.into_body();
    if status.is_success() && body.size_hint().exact() == Some(0) && awaits_no_response {
        return Ok(StreamableHttpPostResponse::Accepted);
    }

    if !status.is_success() {
        let is_auth_failure = matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
        let text = if is_json && !is_auth_failure {
            match read_bounded(body, limits.max_json_response_size).await {
                Ok(bytes) => {
                    let full = String::from_utf8_lossy(&bytes);
                    if let Ok(error @ ServerJsonRpcMessage::Error(_)) =
                        serde_json::from_str::<ServerJsonRpcMessage>(&full)
                    {
                        // A rejected `server/discover` must be re-correlated first.
                        if let Some(response) =
                            discover_rejection(message, session_was_attached, status, &full)
                        {
                            return Ok(response);
                        }
                        return Ok(StreamableHttpPostResponse::Json(error, session_id));
                    }
                    tracing::warn!("HTTP {status}: the JSON body is not a JSON-RPC error");
                    truncated(&bytes, limits.max_error_response_size)
                }
                Err(error @ StreamableHttpError::ResponseBodyTooLarge { .. }) => {
                    return Err(status_error.map_or(error, Into::into));
                }
                Err(_) => truncated(READ_FAILURE.as_bytes(), limits.max_error_response_size),
            }
        } else {
            match read_prefix(body, limits.max_error_response_size).await {
                Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Err(_) => truncated(READ_FAILURE.as_bytes(), limits.max_error_response_size),
            }
        };
        if let Some(response) = discover_rejection(message, session_was_attached, status, &text) {
            return Ok(response);
        }
        if let Some(error) = status_error {
            return Err(error.into());
        }
        return Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
            format!("HTTP {status}: {text}"),
        )));
    }

    match content_type {
        Some(ct) if media_type_is(&ct, EVENT_STREAM) => Ok(StreamableHttpPostResponse::Sse(
            SseBody::new(body, limits.max_sse_event_size, stream, None, true).boxed(),
            session_id,
        )),
        Some(ct) if media_type_is(&ct, JSON) => {
            let bytes = read_bounded(body, limits.max_json_response_size).await?;
            match serde_json::from_slice::<ServerJsonRpcMessage>(&bytes) {
                Ok(message) => Ok(StreamableHttpPostResponse::Json(message, session_id)),
                Err(error) if awaits_no_response => {
                    tracing::warn!(
                        "unparsable JSON answer to a notification, taken as accepted: {error}"
                    );
                    Ok(StreamableHttpPostResponse::Accepted)
                }
                Err(error) => Err(StreamableHttpError::UnexpectedServerResponse(Cow::Owned(
                    format!(
                        "could not parse JSON response as ServerJsonRpcMessage: {error}: {}",
                        preview(&bytes)
                    ),
                ))),
            }
        }
        // A POST that awaits no response needs nothing from the body.
        other if awaits_no_response => {
            tracing::warn!(content_type = ?other, "unexpected content type on a POST that awaits no response");
            Ok(StreamableHttpPostResponse::Accepted)
        }
        other => Err(unexpected_content_type(other.as_ref())),
    }
}

/// `401` / `403` with a challenge: the errors rmcp's auth client acts on.
fn auth_challenge(status: StatusCode, headers: &HeaderMap) -> Result<(), Error> {
    let Some(challenge) = headers.get(WWW_AUTHENTICATE) else {
        return Ok(());
    };
    let challenge = || {
        challenge.to_str().map(str::to_owned).map_err(|_| {
            StreamableHttpError::UnexpectedServerResponse(Cow::Borrowed(
                "invalid www-authenticate header value",
            ))
        })
    };
    match status {
        StatusCode::UNAUTHORIZED => Err(StreamableHttpError::AuthRequired(AuthRequiredError::new(
            challenge()?,
        ))),
        StatusCode::FORBIDDEN => {
            let challenge = challenge()?;
            let scope = challenge_scope(&challenge);
            Err(StreamableHttpError::InsufficientScope(
                InsufficientScopeError::new(challenge, scope),
            ))
        }
        _ => Ok(()),
    }
}

/// The `scope` parameter of a `WWW-Authenticate` challenge, quoted or not.
fn challenge_scope(challenge: &str) -> Option<String> {
    // ASCII lowercasing keeps byte offsets.
    let start = challenge.to_ascii_lowercase().find("scope=")? + "scope=".len();
    let rest = &challenge[start..];
    if let Some(quoted) = rest.strip_prefix('"') {
        return quoted.find('"').map(|end| quoted[..end].to_owned());
    }
    let end = rest
        .find(|c: char| c == ',' || c == ';' || c.is_whitespace())
        .unwrap_or(rest.len());
    (end > 0).then(|| rest[..end].to_owned())
}

/// The status metadata rmcp keeps for `429` and `5xx`.
fn status_error(status: StatusCode, headers: &HeaderMap) -> Option<HttpStatusError> {
    if status != StatusCode::TOO_MANY_REQUESTS && !status.is_server_error() {
        return None;
    }
    let retry_after = headers
        .get(RETRY_AFTER)
        .filter(|v| v.len() <= MAX_RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Some(HttpStatusError::new(status.as_u16(), retry_after))
}

/// rmcp tells a legacy server from a modern one by the JSON-RPC error its `server/discover`
/// gets; a 4xx from middleware in front of a legacy server cannot echo the request id, so
/// the error is re-correlated here (and made up when the body has none).
fn discover_rejection(
    message: &ClientJsonRpcMessage,
    session_was_attached: bool,
    status: StatusCode,
    body: &str,
) -> Option<StreamableHttpPostResponse> {
    if session_was_attached
        || !crate::decide::classify::refused_before_running(status.as_u16())
        || matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN)
    {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(
            format!("server/discover rejected with HTTP {status}: {body}"),
            None,
        ),
    };
    Some(StreamableHttpPostResponse::Json(
        ServerJsonRpcMessage::error(error, Some(request.id.clone())),
        None,
    ))
}

fn unexpected_content_type(content_type: Option<&HeaderValue>) -> Error {
    StreamableHttpError::UnexpectedContentType(
        content_type.map(|ct| String::from_utf8_lossy(ct.as_bytes()).into_owned()),
    )
}

/// Whether a `Content-Type` names `expected`, ignoring case and parameters.
fn media_type_is(content_type: &HeaderValue, expected: &str) -> bool {
    let essence = content_type.as_bytes().split(|&b| b == b';').next();
    essence.is_some_and(|essence| {
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(expected.as_bytes())
    })
}

/// A whole body of at most `max` bytes: a larger declared or counted size is
/// [`StreamableHttpError::ResponseBodyTooLarge`], found before the excess is buffered.
async fn read_bounded<B>(body: B, max: usize) -> Result<Vec<u8>, Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let too_large = || StreamableHttpError::ResponseBodyTooLarge { max_size: max };
    if body.size_hint().lower() > max as u64 {
        return Err(too_large());
    }
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| StreamableHttpError::Client(TowerClientError::body(e)))?;
        if let Ok(mut data) = frame.into_data() {
            if data.remaining() > max - bytes.len() {
                return Err(too_large());
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                bytes.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(bytes)
}

/// At most the first `max` bytes of a body, for a diagnostic; the rest is never read.
async fn read_prefix<B>(body: B, max: usize) -> Result<Vec<u8>, Error>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    while bytes.len() < max {
        let Some(frame) = body.frame().await else {
            break;
        };
        let frame = frame.map_err(|e| StreamableHttpError::Client(TowerClientError::body(e)))?;
        if let Ok(mut data) = frame.into_data() {
            while data.has_remaining() && bytes.len() < max {
                let chunk = data.chunk();
                let n = chunk.len().min(max - bytes.len());
                bytes.extend_from_slice(&chunk[..n]);
                data.advance(n);
            }
        }
    }
    Ok(bytes)
}

fn truncated(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

fn preview(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "<empty>".to_owned();
    }
    let mut text = String::from_utf8_lossy(bytes).into_owned();
    if text.len() > BODY_PREVIEW {
        let mut end = BODY_PREVIEW;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A stream position (the last event id rmcp saw) whose resumption is refused.
#[derive(Debug, PartialEq, Eq)]
struct ResumePoint {
    uri: Arc<str>,
    session_id: Option<Arc<str>>,
    last_event_id: String,
}

#[derive(Debug, Default)]
struct RefusedResumes(Mutex<VecDeque<ResumePoint>>);

/// Where a response stream comes from, to refuse its resumption after an oversized event.
struct StreamKey {
    uri: Arc<str>,
    session_id: Option<Arc<str>>,
    refused: Arc<RefusedResumes>,
}

impl StreamKey {
    fn refuse(&self, last_event_id: String) {
        let mut refused = self
            .refused
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if refused.len() == REFUSED_RESUMES {
            refused.pop_front();
        }
        refused.push_back(ResumePoint {
            uri: self.uri.clone(),
            session_id: self.session_id.clone(),
            last_event_id,
        });
    }

    fn take_refused(&self, last_event_id: &str) -> bool {
        let mut refused = self
            .refused
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let found = refused.iter().position(|point| {
            point.uri == self.uri
                && point.session_id == self.session_id
                && point.last_event_id == last_event_id
        });
        found.and_then(|i| refused.remove(i)).is_some()
    }
}

/// A `text/event-stream` body as the [`Sse`] stream rmcp expects, bounded per event. Dropped
/// after rmcp took a request's response, it reads the rest of the body in the background (see
/// `# When the rest of a response stream is read` in the module docs).
struct SseBody {
    body: Option<UnsyncBoxBody<Bytes, BoxError>>,
    parser: SseParser,
    ready: VecDeque<Sse>,
    failed: Option<SseError>,
    /// The last id and retry this stream handed to rmcp.
    announced_id: Option<String>,
    announced_retry: Option<Duration>,
    /// The id rmcp would resume from: the last one announced, else the one this `GET` resumed.
    resume_point: Option<String>,
    key: StreamKey,
    /// This stream carries one request's response (it is not a `GET` listen stream).
    carries_response: bool,
    /// A JSON-RPC response was handed to rmcp; then rmcp asked for the next item.
    response_yielded: bool,
    response_taken: bool,
}

/// How long a request's stream is read on, in the background, once rmcp took the response.
const FINISH_AFTER_RESPONSE: Duration = Duration::from_secs(5);

impl SseBody {
    fn new<B>(
        body: B,
        max_event_size: usize,
        key: StreamKey,
        last_event_id: Option<String>,
        carries_response: bool,
    ) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let body = body
            .map_frame(|frame| frame.map_data(|mut data| data.copy_to_bytes(data.remaining())))
            .map_err(Into::into);
        Self {
            body: Some(UnsyncBoxBody::new(body)),
            parser: SseParser::with_max_event_size(max_event_size),
            ready: VecDeque::new(),
            failed: None,
            announced_id: None,
            announced_retry: None,
            resume_point: last_event_id,
            key,
            carries_response,
            response_yielded: false,
            response_taken: false,
        }
    }

    fn boxed(self) -> BoxStream<'static, Result<Sse, SseError>> {
        Box::pin(self)
    }

    fn push(&mut self, chunk: &[u8]) {
        let Self {
            parser,
            ready,
            announced_id,
            announced_retry,
            ..
        } = self;
        let result = parser.push(chunk, |event| {
            if event.id.is_some() {
                announced_id.clone_from(&event.id);
            }
            if event.retry.is_some() {
                *announced_retry = event.retry;
            }
            ready.push_back(to_sse(event));
        });
        // A block without data is not an event, but its id and retry are: rmcp resumes from
        // the id (rmcp's own parser passes such blocks on as events without data).
        let id = parser.last_event_id();
        let id_changed = announced_id.as_deref().unwrap_or_default() != id;
        let retry_changed = parser.retry() != *announced_retry;
        if id_changed || retry_changed {
            let mut sse = Sse::default();
            if id_changed {
                *announced_id = Some(id.to_owned());
                sse.id = Some(id.to_owned());
            }
            if retry_changed {
                *announced_retry = parser.retry();
                sse.retry = parser.retry().map(millis);
            }
            ready.push_back(sse);
        }
        if announced_id.is_some() {
            self.resume_point.clone_from(announced_id);
        }
        if let Err(error) = result {
            let limit = self.parser.max_event_size();
            self.body = None;
            if let Some(id) = self.resume_point.clone() {
                self.key.refuse(id);
            }
            let error = TowerClientError::event_too_large(limit, error);
            self.failed = Some(SseError::Body(Box::new(error)));
        }
    }
}

fn to_sse(event: SseEvent) -> Sse {
    Sse {
        event: Some(event.event).filter(|e| e != "message"),
        data: Some(event.data),
        id: event.id,
        retry: event.retry.map(millis),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Whether an event's data is a JSON-RPC response or error (not a request or notification).
fn is_response(data: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape {
        method: Option<IgnoredAny>,
        result: Option<IgnoredAny>,
        error: Option<IgnoredAny>,
    }
    serde_json::from_str::<Shape>(data)
        .is_ok_and(|m| m.method.is_none() && (m.result.is_some() || m.error.is_some()))
}

impl Stream for SseBody {
    type Item = Result<Sse, SseError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.response_taken |= this.response_yielded;
        loop {
            if let Some(sse) = this.ready.pop_front() {
                if this.carries_response && !this.response_yielded {
                    this.response_yielded = sse.data.as_deref().is_some_and(is_response);
                }
                return Poll::Ready(Some(Ok(sse)));
            }
            if let Some(error) = this.failed.take() {
                return Poll::Ready(Some(Err(error)));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            match std::task::ready!(Pin::new(body).poll_frame(cx)) {
                None => this.body = None,
                Some(Err(error)) => {
                    this.body = None;
                    let error = TowerClientError::body(error);
                    return Poll::Ready(Some(Err(SseError::Body(Box::new(error)))));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        this.push(&data);
                    }
                }
            }
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if !self.response_taken {
            return;
        }
        let (Some(mut body), Ok(runtime)) =
            (self.body.take(), tokio::runtime::Handle::try_current())
        else {
            return;
        };
        drop(runtime.spawn(async move {
            let rest = async { while let Some(Ok(_)) = body.frame().await {} };
            let _ = tokio::time::timeout(FINISH_AFTER_RESPONSE, rest).await;
        }));
    }
}

/// The error of [`TowerHttpClient`], carried in [`StreamableHttpError::Client`] (and, for a
/// failed response stream, in [`SseError::Body`]).
#[derive(Debug)]
pub struct TowerClientError {
    kind: ErrorKind,
    source: Option<BoxError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    Request,
    Service,
    Body,
    Status(StatusCode),
    EventTooLarge(usize),
}

impl TowerClientError {
    fn request(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Request,
            source: Some(source.into()),
        }
    }

    fn service(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Service,
            source: Some(source.into()),
        }
    }

    fn body(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Body,
            source: Some(source.into()),
        }
    }

    fn unexpected_status(status: StatusCode) -> Self {
        Self {
            kind: ErrorKind::Status(status),
            source: None,
        }
    }

    fn event_too_large(limit: usize, source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::EventTooLarge(limit),
            source: Some(source.into()),
        }
    }

    /// The request could not be built (an invalid URI, header value or message); nothing
    /// was sent.
    pub fn is_request(&self) -> bool {
        self.kind == ErrorKind::Request
    }

    /// The tower service failed; its error (a
    /// [`GuardError`](crate::guard::GuardError), say) is the [`source`](std::error::Error::source).
    pub fn is_service(&self) -> bool {
        self.kind == ErrorKind::Service
    }

    /// Reading the response body failed.
    pub fn is_body(&self) -> bool {
        self.kind == ErrorKind::Body
    }

    /// A `GET` or `DELETE` was answered with an unexpected status (see [`status`](Self::status)).
    pub fn is_status(&self) -> bool {
        matches!(self.kind, ErrorKind::Status(_))
    }

    /// An SSE event was larger than the transport's `max_sse_event_size`.
    pub fn is_event_too_large(&self) -> bool {
        matches!(self.kind, ErrorKind::EventTooLarge(_))
    }

    /// The unexpected status, for [`is_status`](Self::is_status).
    pub fn status(&self) -> Option<StatusCode> {
        match self.kind {
            ErrorKind::Status(status) => Some(status),
            _ => None,
        }
    }
}

impl fmt::Display for TowerClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Request => f.write_str("could not build the HTTP request; nothing was sent"),
            ErrorKind::Service => f.write_str("the HTTP service failed"),
            ErrorKind::Body => f.write_str("could not read the response body"),
            ErrorKind::Status(status) => write!(f, "unexpected HTTP status {status}"),
            ErrorKind::EventTooLarge(limit) => {
                write!(
                    f,
                    "an SSE event exceeded the {limit}-byte max_sse_event_size"
                )
            }
        }
    }
}

impl std::error::Error for TowerClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        convert::Infallible,
        sync::atomic::{AtomicBool, Ordering},
    };

    use http_body::Frame;
    use rmcp::model::RequestId;
    use serde_json::json;
    use tokio::sync::mpsc;
    use tokio_stream::StreamExt;
    use tower::util::BoxCloneService;

    use super::*;

    type Seen = Arc<Mutex<Vec<Request<Bytes>>>>;
    /// Not `Sync`: the adapter does not need it.
    type TestClient<B> =
        TowerHttpClient<BoxCloneService<Request<Full<Bytes>>, Response<B>, Infallible>>;

    /// A client whose service records each request and answers with `respond()`.
    fn client<B, F>(respond: F) -> (TestClient<B>, Seen)
    where
        B: Body + Send + 'static,
        F: Fn() -> Response<B> + Clone + Send + Sync + 'static,
    {
        let seen = Seen::default();
        let record = seen.clone();
        let service = tower::service_fn(move |request: Request<Full<Bytes>>| {
            let (record, respond) = (record.clone(), respond.clone());
            async move {
                let (parts, body) = request.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                record
                    .lock()
                    .unwrap()
                    .push(Request::from_parts(parts, body));
                Ok::<_, Infallible>(respond())
            }
        });
        (TowerHttpClient::new(BoxCloneService::new(service)), seen)
    }

    fn respond(status: u16, headers: &[(&str, &str)], body: &str) -> Response<Full<Bytes>> {
        let mut response = Response::builder().status(status);
        for (name, value) in headers {
            response = response.header(*name, *value);
        }
        response
            .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
            .unwrap()
    }

    fn message(value: serde_json::Value) -> ClientJsonRpcMessage {
        serde_json::from_value(value).unwrap()
    }

    fn tool_call() -> ClientJsonRpcMessage {
        message(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "deploy_release", "arguments": {"service": "catalog"}}}))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HashMap<HeaderName, HeaderValue> {
        pairs
            .iter()
            .map(|(n, v)| (HeaderName::from_static(n), HeaderValue::from_static(v)))
            .collect()
    }

    const URI: &str = "http://127.0.0.1:1/mcp";

    async fn post<B>(
        client: &TestClient<B>,
        message: ClientJsonRpcMessage,
        session: Option<&str>,
    ) -> Result<StreamableHttpPostResponse, Error>
    where
        B: Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
    {
        client
            .post_message(
                URI.into(),
                message,
                session.map(Into::into),
                None,
                HashMap::new(),
            )
            .await
    }

    #[tokio::test]
    async fn a_post_carries_what_rmcps_reqwest_client_sends() {
        let (client, seen) = client(|| respond(202, &[], ""));
        let custom = headers(&[("mcp-protocol-version", "2025-11-25"), ("x-tenant", "a")]);
        let answer = client
            .post_message(
                URI.into(),
                tool_call(),
                Some("s-1".into()),
                Some("t0k".into()),
                custom,
            )
            .await
            .unwrap();
        assert!(matches!(answer, StreamableHttpPostResponse::Accepted));

        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let request = &seen[0];
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), URI);
        let h = request.headers();
        assert_eq!(h[ACCEPT], "text/event-stream, application/json");
        assert_eq!(h[CONTENT_TYPE], "application/json");
        assert_eq!(h[AUTHORIZATION], "Bearer t0k");
        assert!(h[AUTHORIZATION].is_sensitive());
        assert_eq!(h["mcp-session-id"], "s-1");
        assert_eq!(h["mcp-protocol-version"], "2025-11-25");
        assert_eq!(h["x-tenant"], "a");
        assert!(!h.contains_key("last-event-id"));
        let body: serde_json::Value = serde_json::from_slice(request.body()).unwrap();
        assert_eq!(body, serde_json::to_value(tool_call()).unwrap());
    }

    #[tokio::test]
    async fn a_reserved_custom_header_is_refused_before_anything_is_sent() {
        let (client, seen) = client(|| respond(202, &[], ""));
        for name in ["accept", "mcp-session-id", "last-event-id"] {
            let custom =
                HashMap::from([(HeaderName::from_static(name), HeaderValue::from_static("x"))]);
            let error = client
                .post_message(URI.into(), tool_call(), None, None, custom)
                .await
                .unwrap_err();
            assert!(
                matches!(&error, StreamableHttpError::ReservedHeaderConflict(n) if n == name),
                "{error:?}"
            );
        }
        assert!(seen.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn statuses_become_the_errors_rmcp_acts_on() {
        let challenge = (
            "www-authenticate",
            r#"Bearer error="insufficient_scope", scope="a b""#,
        );
        let (c, _) = client(|| respond(404, &[], "no such session"));
        let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
        assert!(
            matches!(error, StreamableHttpError::SessionExpired),
            "{error:?}"
        );
        let error = post(&c, tool_call(), None).await.unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::UnexpectedServerResponse(m) if m == "HTTP 404 Not Found: no such session"),
            "{error:?}"
        );

        let (c, _) = client(|| respond(401, &[("www-authenticate", "Bearer")], ""));
        let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::AuthRequired(e) if e.www_authenticate_header == "Bearer"),
            "{error:?}"
        );

        let (c, _) = client(move || respond(403, &[challenge], ""));
        let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::InsufficientScope(e) if e.get_required_scope() == Some("a b")),
            "{error:?}"
        );

        for status in [429, 503] {
            let (c, _) = client(move || respond(status, &[("retry-after", "7")], "busy"));
            let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
            assert!(
                matches!(&error, StreamableHttpError::HttpStatus(e)
                    if e.status == status && e.retry_after.as_deref() == Some("7")),
                "{error:?}"
            );
        }

        // A JSON-RPC error in a 5xx body is the answer, not a transport failure.
        let rpc_error = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"boom"}}"#;
        let (c, _) = client(move || respond(500, &[("content-type", JSON)], rpc_error));
        let answer = post(&c, tool_call(), Some("s")).await.unwrap();
        assert!(matches!(
            answer,
            StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(_), _)
        ));

        let (c, _) = client(|| respond(204, &[], ""));
        assert!(matches!(
            post(&c, tool_call(), Some("s")).await.unwrap(),
            StreamableHttpPostResponse::Accepted
        ));
    }

    #[tokio::test]
    async fn a_rejected_discover_is_answered_with_its_own_id() {
        let discover = || {
            message(json!({"jsonrpc": "2.0", "id": 9, "method": "server/discover", "params": {}}))
        };
        let (c, _) = client(|| respond(400, &[("content-type", "text/plain")], "legacy server"));
        let answer = post(&c, discover(), None).await.unwrap();
        let StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Error(error), None) = answer
        else {
            panic!("{answer:?}");
        };
        assert_eq!(error.id, Some(RequestId::Number(9)));
        assert!(error.error.message.contains("legacy server"), "{error:?}");
    }

    #[tokio::test]
    async fn json_answers_are_bounded_and_parsed() {
        let ok = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;
        let (c, _) = client(move || {
            respond(
                200,
                &[
                    ("content-type", "Application/JSON; charset=utf-8"),
                    ("mcp-session-id", "s-2"),
                ],
                ok,
            )
        });
        let answer = post(&c, tool_call(), None).await.unwrap();
        assert!(
            matches!(&answer, StreamableHttpPostResponse::Json(ServerJsonRpcMessage::Response(_), Some(s)) if s == "s-2"),
            "{answer:?}"
        );

        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_json_response_size = ok.len() - 1;
        let error = c
            .post_message_with_response_limits(
                URI.into(),
                tool_call(),
                None,
                None,
                HashMap::new(),
                limits,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(error, StreamableHttpError::ResponseBodyTooLarge { max_size } if max_size == ok.len() - 1),
            "{error:?}"
        );

        // Without a declared length the bytes are counted.
        let (c, _) = client(move || {
            let chunks = ok
                .as_bytes()
                .chunks(8)
                .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c))));
            let body =
                http_body_util::StreamBody::new(tokio_stream::iter(chunks.collect::<Vec<_>>()));
            Response::builder()
                .header("content-type", JSON)
                .body(body)
                .unwrap()
        });
        let error = c
            .post_message_with_response_limits(
                URI.into(),
                tool_call(),
                None,
                None,
                HashMap::new(),
                limits,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(error, StreamableHttpError::ResponseBodyTooLarge { .. }),
            "{error:?}"
        );

        // An empty or unusable answer to a notification is an acceptance.
        let initialized =
            || message(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        let (c, _) = client(|| respond(200, &[("content-type", JSON)], ""));
        assert!(matches!(
            post(&c, initialized(), Some("s")).await.unwrap(),
            StreamableHttpPostResponse::Accepted
        ));
        let (c, _) = client(|| respond(200, &[("content-type", "text/html")], "<p>ok</p>"));
        assert!(matches!(
            post(&c, initialized(), Some("s")).await.unwrap(),
            StreamableHttpPostResponse::Accepted
        ));
        let error = post(&c, tool_call(), Some("s")).await.unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::UnexpectedContentType(Some(ct)) if ct == "text/html"),
            "{error:?}"
        );
    }

    async fn sse_events(body: &'static str) -> Vec<Sse> {
        let (c, _) = client(move || respond(200, &[("content-type", EVENT_STREAM)], body));
        let StreamableHttpPostResponse::Sse(stream, _) =
            post(&c, tool_call(), Some("s")).await.unwrap()
        else {
            panic!("not an SSE answer");
        };
        stream.map(Result::unwrap).collect().await
    }

    #[tokio::test]
    async fn sse_blocks_become_the_events_rmcp_reads() {
        let events = sse_events(concat!(
            "data: \nid: 0/0\nretry: 3000\n\n",
            ": keep-alive\n\n",
            "event: message\ndata: {\"a\":\n",
            "data: 1}\nid: 1/0\n\n",
            "event: ping\ndata: x\n\n",
            "id: 2/0\nretry: 10\n\n",
        ))
        .await;
        let expected = [
            Sse::default().data("").id("0/0").retry(3000),
            Sse::default().data("{\"a\":\n1}").id("1/0"),
            Sse::default().event("ping").data("x"),
            // A block without data still moves the resume point (and the retry).
            Sse::default().id("2/0").retry(10),
        ];
        assert_eq!(events, expected);
    }

    fn sse_error_source(error: &SseError) -> &TowerClientError {
        let SseError::Body(source) = error else {
            panic!("{error}");
        };
        source.downcast_ref().unwrap()
    }

    #[tokio::test]
    async fn an_oversized_event_ends_the_stream_and_its_resumption_once() {
        let big: &'static str =
            Box::leak(format!("data: \nid: 0/7\n\ndata: {}\n\n", "x".repeat(100)).into_boxed_str());
        let (c, seen) = client(move || respond(200, &[("content-type", EVENT_STREAM)], big));
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = 64;
        let answer = c
            .post_message_with_response_limits(
                URI.into(),
                tool_call(),
                Some("s".into()),
                None,
                HashMap::new(),
                limits,
            )
            .await
            .unwrap();
        let StreamableHttpPostResponse::Sse(mut stream, _) = answer else {
            panic!("{answer:?}");
        };
        assert_eq!(
            stream.next().await.unwrap().unwrap(),
            Sse::default().data("").id("0/7")
        );
        let error = stream.next().await.unwrap().unwrap_err();
        let source = sse_error_source(&error);
        assert!(source.is_event_too_large(), "{source}");
        assert!(stream.next().await.is_none());

        let resume = || {
            c.get_stream_with_max_sse_event_size(
                URI.into(),
                Some("s".into()),
                Some("0/7".into()),
                None,
                HashMap::new(),
                64,
            )
        };
        let error = resume().await.err().unwrap();
        assert!(
            matches!(error, StreamableHttpError::ServerDoesNotSupportSse),
            "{error:?}"
        );
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "the refused resume was not sent"
        );
        // Refused once: a later resume from the same point is sent.
        assert!(resume().await.is_ok());
        assert_eq!(seen.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_get_carries_the_resume_point_and_reads_its_statuses() {
        let (c, seen) = client(|| respond(200, &[("content-type", EVENT_STREAM)], "data: 1\n\n"));
        let stream = c
            .get_stream(
                URI.into(),
                Some("s-3".into()),
                Some("4/1".into()),
                Some("t".into()),
                headers(&[("mcp-protocol-version", "2025-11-25")]),
            )
            .await
            .unwrap();
        assert_eq!(
            stream.map(Result::unwrap).collect::<Vec<_>>().await,
            [Sse::default().data("1")]
        );
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        let h = seen[0].headers();
        assert_eq!(seen[0].method(), Method::GET);
        assert_eq!(h[ACCEPT], "text/event-stream, application/json");
        assert_eq!(h["mcp-session-id"], "s-3");
        assert_eq!(h["last-event-id"], "4/1");
        assert_eq!(h[AUTHORIZATION], "Bearer t");
        assert_eq!(h["mcp-protocol-version"], "2025-11-25");
        assert!(!h.contains_key(CONTENT_TYPE));

        let get = |status: u16, content_type: &'static str| async move {
            let (c, _) = client(move || respond(status, &[("content-type", content_type)], ""));
            c.get_stream(URI.into(), None, None, None, HashMap::new())
                .await
                .err()
        };
        let error = get(405, EVENT_STREAM).await.unwrap();
        assert!(
            matches!(error, StreamableHttpError::ServerDoesNotSupportSse),
            "{error:?}"
        );
        let error = get(404, EVENT_STREAM).await.unwrap();
        assert!(
            matches!(&error, StreamableHttpError::Client(e) if e.status() == Some(StatusCode::NOT_FOUND)),
            "{error:?}"
        );
        let error = get(502, EVENT_STREAM).await.unwrap();
        assert!(
            matches!(&error, StreamableHttpError::HttpStatus(e) if e.status == 502),
            "{error:?}"
        );
        let error = get(200, "text/plain").await.unwrap();
        assert!(
            matches!(&error, StreamableHttpError::UnexpectedContentType(Some(ct)) if ct == "text/plain"),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_delete_ends_the_session() {
        let (c, seen) = client(|| respond(200, &[], ""));
        c.delete_session(URI.into(), "s-4".into(), None, HashMap::new())
            .await
            .unwrap();
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        assert_eq!(seen[0].method(), Method::DELETE);
        assert_eq!(seen[0].headers()["mcp-session-id"], "s-4");
        assert!(!seen[0].headers().contains_key(ACCEPT));

        let (c, _) = client(|| respond(405, &[], ""));
        c.delete_session(URI.into(), "s".into(), None, HashMap::new())
            .await
            .unwrap();
        let (c, _) = client(|| respond(500, &[], ""));
        let error = c
            .delete_session(URI.into(), "s".into(), None, HashMap::new())
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StreamableHttpError::Client(e) if e.is_status()),
            "{error:?}"
        );
    }

    /// A body fed through a channel that records whether it was read to its end.
    struct ChannelBody {
        rx: mpsc::UnboundedReceiver<Bytes>,
        ended: Arc<AtomicBool>,
    }

    impl Body for ChannelBody {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            let next = std::task::ready!(self.rx.poll_recv(cx));
            if next.is_none() {
                self.ended.store(true, Ordering::SeqCst);
            }
            Poll::Ready(next.map(|data| Ok(Frame::data(data))))
        }
    }

    /// Opens a POST stream whose first chunk is a JSON-RPC response; returns the stream, the
    /// sender of the rest of the body and the "read to its end" flag.
    async fn response_stream() -> (
        BoxStream<'static, Result<Sse, SseError>>,
        mpsc::UnboundedSender<Bytes>,
        Arc<AtomicBool>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let ended = Arc::new(AtomicBool::new(false));
        let body = Arc::new(Mutex::new(Some(ChannelBody {
            rx,
            ended: ended.clone(),
        })));
        let (c, _) = client(move || {
            let body = body.lock().unwrap().take().unwrap();
            Response::builder()
                .header("content-type", EVENT_STREAM)
                .body(body)
                .unwrap()
        });
        tx.send(Bytes::from_static(
            b"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        ))
        .unwrap();
        let StreamableHttpPostResponse::Sse(stream, _) =
            post(&c, tool_call(), Some("s")).await.unwrap()
        else {
            panic!("not an SSE answer");
        };
        (stream, tx, ended)
    }

    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_request_stream_is_read_to_its_end_once_the_response_was_taken() {
        let (mut stream, tx, ended) = response_stream().await;
        assert!(is_response(
            stream
                .next()
                .await
                .unwrap()
                .unwrap()
                .data
                .as_deref()
                .unwrap()
        ));
        // rmcp asks for the next item (the response is in its hands), then drops the stream.
        let next = tokio::time::timeout(Duration::from_millis(10), stream.next()).await;
        assert!(next.is_err(), "nothing more yet");
        drop(stream);
        drop(tx);
        settle().await;
        assert!(
            ended.load(Ordering::SeqCst),
            "read to its end in the background"
        );
    }

    #[tokio::test]
    async fn a_stream_dropped_before_the_response_was_taken_is_left_alone() {
        let (mut stream, tx, ended) = response_stream().await;
        stream.next().await.unwrap().unwrap();
        drop(stream);
        drop(tx);
        settle().await;
        assert!(!ended.load(Ordering::SeqCst));
    }

    #[test]
    fn small_parsers() {
        let ct = |v: &'static str| HeaderValue::from_static(v);
        assert!(media_type_is(&ct("text/event-stream"), EVENT_STREAM));
        assert!(media_type_is(
            &ct(" TEXT/Event-Stream ; charset=utf-8"),
            EVENT_STREAM
        ));
        assert!(!media_type_is(&ct("text/event-streams"), EVENT_STREAM));
        assert!(!media_type_is(&ct("application/json-patch+json"), JSON));

        assert_eq!(
            challenge_scope(r#"Bearer scope="files:read files:write""#).as_deref(),
            Some("files:read files:write")
        );
        assert_eq!(
            challenge_scope("Bearer scope=read:data, error=x").as_deref(),
            Some("read:data")
        );
        assert_eq!(challenge_scope(r#"Bearer SCOPE="""#).as_deref(), Some(""));
        assert_eq!(challenge_scope("Bearer scope=,"), None);
        assert_eq!(challenge_scope(r#"Bearer error="invalid_token""#), None);

        assert!(is_response(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(is_response(
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"m"}}"#
        ));
        assert!(!is_response(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#));
        assert!(!is_response(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#
        ));
        assert!(!is_response(""));
    }

    #[test]
    fn errors_say_what_failed() {
        let error = TowerClientError::service(std::io::Error::other("refused"));
        assert!(error.is_service() && !error.is_body());
        assert_eq!(
            std::error::Error::source(&error).unwrap().to_string(),
            "refused"
        );
        let error = TowerClientError::unexpected_status(StatusCode::GONE);
        assert!(error.is_status());
        assert_eq!(error.status(), Some(StatusCode::GONE));
        assert!(std::error::Error::source(&error).is_none());
        let error = TowerClientError::event_too_large(
            64,
            crate::protocol::sse::SseError::EventTooLarge { limit: 64 },
        );
        assert!(error.is_event_too_large());
        assert_eq!(
            error.to_string(),
            "an SSE event exceeded the 64-byte max_sse_event_size"
        );
    }
}
