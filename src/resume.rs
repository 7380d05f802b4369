//! `ResumeLayer`: recovers a broken SSE response stream with GET + `Last-Event-ID` instead of
//! letting the break turn into a re-POST.
//!
//! For servers of the 2025-03-26 … 2025-11-25 revisions a disconnect is not a cancellation: the
//! server keeps running the tool and can replay the stream from the last event the client saw.
//! When a POST's SSE stream breaks (an error, or an end before any JSON-RPC response) and an
//! event id was seen, the layer waits the server's `retry:` (capped) or a backoff, sends
//! `GET` with `Last-Event-ID`, `Mcp-Session-Id` and `MCP-Protocol-Version`, and splices the
//! resumed events into the same response body: the caller sees one stream. Events whose id was
//! already delivered are dropped (a server may replay the event named by `Last-Event-ID`).
//!
//! It never re-POSTs. When resumption is refused (404: the session is gone; 405: the server
//! offers no GET stream), fails, or runs out of attempts, the original break reaches the caller,
//! and a [`GuardLayer`](crate::guard::GuardLayer) above records the outcome as unknown. In the
//! 2026-07-28 revision there is no resumption and the layer passes everything through.
//!
//! ```no_run
//! use std::time::Duration;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{guard::GuardRequestBody, resume::ResumeLayer};
//! use tower::ServiceBuilder;
//!
//! let client = ServiceBuilder::new()
//!     .layer(ResumeLayer::new().max_attempts(3).max_delay(Duration::from_secs(2)))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//! # let _ = client;
//! ```

use std::{
    collections::{HashSet, VecDeque},
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, header};
use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

use crate::{
    guard::BoxError,
    protocol::{
        LAST_EVENT_ID, MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, ProtocolVersion,
        sse::{SseEvent, SseParser},
    },
};

/// Builds [`Resume`]; see the [module docs](self).
///
/// Defaults: 3 attempts per broken stream, the server's `retry:` capped at 5 s, a 250 ms
/// backoff (doubling) when the server sent none, 4 MiB per event.
#[derive(Debug, Clone)]
pub struct ResumeLayer {
    config: Config,
}

#[derive(Debug, Clone, Copy)]
struct Config {
    max_attempts: u32,
    max_delay: Duration,
    backoff: Duration,
    max_event_size: usize,
}

impl Default for ResumeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl ResumeLayer {
    /// The layer with its defaults.
    pub fn new() -> Self {
        Self {
            config: Config {
                max_attempts: 3,
                max_delay: Duration::from_secs(5),
                backoff: Duration::from_millis(250),
                max_event_size: crate::protocol::sse::DEFAULT_MAX_EVENT_SIZE,
            },
        }
    }

    /// How many GETs one broken stream may take.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts;
        self
    }

    /// The longest wait before a GET, whatever the server's `retry:` says.
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.config.max_delay = delay;
        self
    }

    /// The first wait when the server sent no `retry:` (doubles per attempt).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// The largest SSE event accepted on a stream.
    pub fn max_event_size(mut self, max: usize) -> Self {
        self.config.max_event_size = max;
        self
    }
}

impl<S> Layer<S> for ResumeLayer {
    type Service = Resume<S>;

    fn layer(&self, inner: S) -> Resume<S> {
        Resume {
            inner,
            config: self.config,
        }
    }
}

/// The resume middleware; see [`ResumeLayer`].
#[derive(Debug, Clone)]
pub struct Resume<S> {
    inner: S,
    config: Config,
}

type GetFuture<RB> = Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;
type Reconnect<RB> = Box<dyn FnMut(&str) -> GetFuture<RB> + Send>;

impl<S, B, RB> Service<Request<B>> for Resume<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Default + Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResumeBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let resumable = request.method() == Method::POST
            && request
                .headers()
                .get(&MCP_PROTOCOL_VERSION)
                .map_or(Some(ProtocolVersion::WITHOUT_HEADER), |v| {
                    v.to_str().ok().and_then(|v| v.parse().ok())
                })
                .is_some_and(ProtocolVersion::supports_resumption);
        let get = resumable.then(|| GetTemplate {
            uri: request.uri().clone(),
            headers: get_headers(request.headers()),
            service: self.inner.clone(),
        });
        ResponseFuture {
            inner: self.inner.call(request),
            get,
            config: self.config,
            _body: std::marker::PhantomData,
        }
    }
}

/// Headers of the resume GET: the POST's (session, protocol version, authorization, custom
/// ones) without those that describe the POST body.
fn get_headers(post: &HeaderMap) -> HeaderMap {
    let mut headers = post.clone();
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        MCP_METHOD,
        MCP_NAME,
        crate::IDEMPOTENCY_KEY,
    ] {
        headers.remove(name);
    }
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static("text/event-stream"),
    );
    headers
}

struct GetTemplate<S> {
    uri: Uri,
    headers: HeaderMap,
    service: S,
}

impl<S> GetTemplate<S> {
    fn into_reconnect<B, RB>(self) -> Reconnect<RB>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Default + Send + 'static,
        RB: Send + 'static,
    {
        Box::new(move |last_event_id| {
            let mut request = Request::new(B::default());
            *request.method_mut() = Method::GET;
            *request.uri_mut() = self.uri.clone();
            *request.headers_mut() = self.headers.clone();
            if let Ok(value) = HeaderValue::from_str(last_event_id) {
                request.headers_mut().insert(LAST_EVENT_ID, value);
            }
            let mut service = self.service.clone();
            Box::pin(async move {
                std::future::poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                service.call(request).await.map_err(Into::into)
            })
        })
    }
}

pin_project_lite::pin_project! {
    /// The future of [`Resume`].
    pub struct ResponseFuture<F, S, B> {
        #[pin]
        inner: F,
        get: Option<GetTemplate<S>>,
        config: Config,
        _body: std::marker::PhantomData<fn(B)>,
    }
}

impl<F, S, B, RB, E> Future for ResponseFuture<F, S, B>
where
    F: Future<Output = Result<Response<RB>, E>>,
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Default + Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<ResumeBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let sse = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let get = this
            .get
            .take()
            .filter(|_| sse && response.status().is_success());
        let config = *this.config;
        Poll::Ready(Ok(response.map(|body| match get {
            Some(get) => ResumeBody::resumable(body, get.into_reconnect(), config),
            None => ResumeBody::passthrough(body),
        })))
    }
}

/// The response body of [`Resume`]: the target's stream, continued across breaks.
pub struct ResumeBody<RB> {
    kind: Kind<RB>,
}

enum Kind<RB> {
    Passthrough(Pin<Box<RB>>),
    Resumable(Box<Splice<RB>>),
}

struct Splice<RB> {
    current: Option<Pin<Box<RB>>>,
    reconnect: Reconnect<RB>,
    phase: Phase<RB>,
    parser: SseParser,
    /// Event ids already handed to the caller (bounded).
    delivered: HashSet<String>,
    last_event_id: String,
    out: VecDeque<Bytes>,
    response_seen: bool,
    attempts: u32,
    config: Config,
    /// The break being recovered from, returned if recovery fails.
    broken: Option<BoxError>,
}

enum Phase<RB> {
    Streaming,
    Waiting(Pin<Box<tokio::time::Sleep>>),
    Connecting(GetFuture<RB>),
    Done,
}

/// How many delivered ids a splice remembers for de-duplication.
const MAX_REMEMBERED_IDS: usize = 4096;

impl<RB> ResumeBody<RB> {
    fn passthrough(body: RB) -> Self {
        Self {
            kind: Kind::Passthrough(Box::pin(body)),
        }
    }

    fn resumable(body: RB, reconnect: Reconnect<RB>, config: Config) -> Self {
        Self {
            kind: Kind::Resumable(Box::new(Splice {
                current: Some(Box::pin(body)),
                reconnect,
                phase: Phase::Streaming,
                parser: SseParser::with_max_event_size(config.max_event_size),
                delivered: HashSet::new(),
                last_event_id: String::new(),
                out: VecDeque::new(),
                response_seen: false,
                attempts: 0,
                config,
                broken: None,
            })),
        }
    }
}

impl<RB> std::fmt::Debug for ResumeBody<RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Passthrough(_) => f.write_str("ResumeBody::Passthrough"),
            Kind::Resumable(s) => f
                .debug_struct("ResumeBody::Resumable")
                .field("last_event_id", &s.last_event_id)
                .field("attempts", &s.attempts)
                .finish_non_exhaustive(),
        }
    }
}

/// A stream that could not be resumed.
#[derive(Debug, thiserror::Error)]
#[error("the response stream broke and could not be resumed: {reason}")]
pub struct ResumeFailed {
    reason: String,
    #[source]
    source: Option<BoxError>,
}

impl<RB> Splice<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    fn can_resume(&self) -> bool {
        !self.response_seen
            && !self.last_event_id.is_empty()
            && self.attempts < self.config.max_attempts
    }

    fn delay(&self) -> Duration {
        let backoff = self
            .config
            .backoff
            .saturating_mul(1 << self.attempts.min(16));
        self.parser
            .retry()
            .unwrap_or(backoff)
            .min(self.config.max_delay)
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<(), BoxError> {
        let Self {
            parser,
            delivered,
            out,
            response_seen,
            ..
        } = self;
        parser.push(chunk, |event| {
            if let Some(id) = &event.id
                && !id.is_empty()
                && !delivered.insert(id.clone())
            {
                return; // replayed: already delivered
            }
            if delivered.len() > MAX_REMEMBERED_IDS {
                delivered.clear();
            }
            *response_seen |= is_response(&event);
            out.push_back(encode(&event));
        })?;
        if !self.parser.last_event_id().is_empty() {
            self.last_event_id = self.parser.last_event_id().to_owned();
        }
        Ok(())
    }

    /// The stream broke (`error`) or ended without a response: resume, or give up.
    fn on_break(&mut self, error: Option<BoxError>) -> Option<Result<(), BoxError>> {
        self.current = None;
        if !self.can_resume() {
            self.phase = Phase::Done;
            return error.map(Err);
        }
        if self.broken.is_none() {
            self.broken = error;
        }
        tracing::debug!(last_event_id = %self.last_event_id, attempt = self.attempts + 1, "resuming a broken response stream");
        self.phase = Phase::Waiting(Box::pin(tokio::time::sleep(self.delay())));
        Some(Ok(()))
    }

    fn give_up(&mut self, reason: String, source: Option<BoxError>) -> BoxError {
        self.phase = Phase::Done;
        tracing::debug!(%reason, "resumption failed");
        Box::new(ResumeFailed {
            reason,
            source: self.broken.take().or(source),
        })
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            match &mut self.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Streaming => {
                    let Some(current) = self.current.as_mut() else {
                        self.phase = Phase::Done;
                        continue;
                    };
                    match ready!(current.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref()
                                && let Err(error) = self.feed(data.chunk())
                            {
                                self.phase = Phase::Done;
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                        Some(Err(error)) => {
                            if let Some(Err(error)) = self.on_break(Some(error.into())) {
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                        None if self.response_seen => self.phase = Phase::Done,
                        None => {
                            if let Some(Err(error)) = self.on_break(None) {
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                    }
                }
                Phase::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.attempts += 1;
                    let get = (self.reconnect)(&self.last_event_id);
                    self.phase = Phase::Connecting(get);
                }
                Phase::Connecting(get) => match ready!(get.as_mut().poll(cx)) {
                    Ok(response) if response.status().is_success() => {
                        // A fresh stream: a new parser, the same de-duplication and cursor.
                        self.parser = SseParser::with_max_event_size(self.config.max_event_size);
                        self.current = Some(Box::pin(response.into_body()));
                        self.phase = Phase::Streaming;
                    }
                    Ok(response) => {
                        let status = response.status();
                        let error =
                            self.give_up(format!("the resume GET was answered {status}"), None);
                        return Poll::Ready(Some(Err(error)));
                    }
                    Err(error) if self.attempts < self.config.max_attempts => {
                        tracing::debug!(%error, "resume GET failed; trying again");
                        self.phase = Phase::Waiting(Box::pin(tokio::time::sleep(self.delay())));
                    }
                    Err(error) => {
                        let error = self.give_up("the resume GET failed".into(), Some(error));
                        return Poll::Ready(Some(Err(error)));
                    }
                },
            }
        }
    }
}

/// Whether an event carries a JSON-RPC response (not a request or notification): the end of a
/// POST's stream.
fn is_response(event: &SseEvent) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<serde::de::IgnoredAny>,
        result: Option<serde::de::IgnoredAny>,
        error: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<Probe>(&event.data)
        .is_ok_and(|p| p.method.is_none() && (p.result.is_some() || p.error.is_some()))
}

/// Writes an event back as SSE text.
fn encode(event: &SseEvent) -> Bytes {
    let mut out = String::with_capacity(event.data.len() + 32);
    if let Some(id) = &event.id {
        out.push_str("id: ");
        out.push_str(id);
        out.push('\n');
    }
    if event.event != "message" {
        out.push_str("event: ");
        out.push_str(&event.event);
        out.push('\n');
    }
    if let Some(retry) = event.retry {
        out.push_str(&format!("retry: {}\n", retry.as_millis()));
    }
    for line in event.data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

impl<RB> Body for ResumeBody<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Passthrough(body) => body.as_mut().poll_frame(cx).map_err(Into::into),
            Kind::Resumable(splice) => splice.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passthrough(body) => body.is_end_stream(),
            Kind::Resumable(splice) => matches!(splice.phase, Phase::Done) && splice.out.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passthrough(body) => body.size_hint(),
            Kind::Resumable(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::sse::SseParser;

    #[test]
    fn encoded_events_parse_back_to_themselves() {
        let events = [
            SseEvent {
                event: "message".into(),
                data: String::new(),
                id: Some("0/0".into()),
                retry: Some(Duration::from_millis(3000)),
            },
            SseEvent {
                event: "message".into(),
                data: "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}".into(),
                id: Some("0/1".into()),
                retry: None,
            },
            SseEvent {
                event: "custom".into(),
                data: "a\nb\n".into(),
                id: None,
                retry: None,
            },
        ];
        let mut text = Vec::new();
        for event in &events {
            text.extend_from_slice(&encode(event));
        }
        assert_eq!(SseParser::parse_all(&text, 1 << 20).unwrap(), events);
        assert!(is_response(&events[1]));
        assert!(!is_response(&events[0]));
        assert!(!is_response(&SseEvent {
            event: "message".into(),
            data: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}".into(),
            id: None,
            retry: None
        }));
    }
}
