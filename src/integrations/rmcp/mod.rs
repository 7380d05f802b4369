//! The guard for rmcp clients: [`GuardedTransport`] around any rmcp client transport (a child
//! process over stdio, an in-memory duplex, Streamable HTTP), and an rmcp
//! [`StreamableHttpClient`] over any tower service, so that an rmcp client runs over a tower
//! stack: [`GuardLayer`](crate::guard::GuardLayer) in front of a hyper client, say.
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
//! incrementally by this crate's [`SseParser`](crate::protocol::sse::SseParser); an `application/json` body is read whole.
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

use std::{collections::HashMap, future::Future, sync::Arc};

use bytes::Bytes;
use futures_core::stream::BoxStream;
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body::Body;
use http_body_util::Full;
use rmcp::{
    model::ClientJsonRpcMessage,
    transport::streamable_http_client::{
        SseError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
        StreamableHttpResponseLimits,
    },
};
use sse_stream::Sse;
use tower_service::Service;

use crate::BoxError;

use crate::protocol::{
    ACCEPT_BOTH, EVENT_STREAM, JSON, LAST_EVENT_ID, MCP_SESSION_ID as SESSION_ID, media_type_is,
};
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

mod error;
mod request;
mod response;
mod sse;
#[cfg(test)]
mod tests;
mod transport;

pub use error::TowerClientError;
use request::{Outgoing, send};
use response::{auth_challenge, read_post_response, status_error, unexpected_content_type};
use sse::{RefusedResumes, SseBody, StreamKey};
pub use transport::{GuardedTransport, GuardedTransportError};
