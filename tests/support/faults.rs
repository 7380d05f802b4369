//! Fault injection: a tower layer in front of rmcp's service, driven by a
//! thread-safe [`FaultPlan`].
//!
//! The layer buffers each request body (to learn the JSON-RPC method and the
//! tool name), logs the request, consumes a scheduled fault if one matches,
//! and then:
//! - `DropResponseAfterTool`: forwards to rmcp, reads the inner response until
//!   the JSON-RPC response has appeared (so the tool has run), then returns an
//!   error from the hyper service: hyper closes the connection without
//!   writing any response, and the client sees "connection closed before
//!   message completed".
//! - `CutStreamAfterFirstEvent`: forwards to rmcp and returns its response
//!   head plus the first SSE event (the priming event, which carries an event
//!   id), then fails the body: hyper aborts the chunked stream and the client
//!   sees a body error. The inner body is dropped, exactly as a real cut; rmcp
//!   keeps running the tool (its handler is a detached task).
//! - `Status(code)`: answers `code` itself; rmcp never sees the request.
//! - `RefuseBeforeRead`: closes the connection without answering and without
//!   forwarding. See [`Fault::RefuseBeforeRead`] for how "before read" is
//!   approximated.

use std::{
    collections::{HashMap, VecDeque},
    fmt,
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use tower::{Layer, Service, ServiceExt};

use super::{
    BoxError, IDEMPOTENCY_KEY_HEADER,
    server::{LoggedRequest, ServerState},
    sse::{SseEvent, SseReader, find_event_boundary, is_jsonrpc_response},
};

/// A fault to inject into one `tools/call` exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The tool runs; the client gets no response at all (the server closes
    /// the connection without writing a status line).
    DropResponseAfterTool,
    /// The client gets the response head and the first SSE event (rmcp's
    /// priming event with an event id), then the connection is cut. The tool
    /// still runs to completion. If the first event would already carry the
    /// JSON-RPC response (a server without priming events), nothing is
    /// forwarded before the cut: the cut always loses the response. For a
    /// non-SSE response the head is sent and the body fails immediately.
    CutStreamAfterFirstEvent,
    /// Answer with this HTTP status (body: a short text); the tool does not
    /// run.
    Status(u16),
    /// Close the connection without a response; the tool does not run.
    ///
    /// hyper has already parsed the request head when a service sees it, so
    /// a true "refuse before reading" is impossible at this layer. When the
    /// request carries SEP-2243 headers (`Mcp-Method: tools/call` and
    /// `Mcp-Name: <tool>`, as 2026-07-28 clients send) the fault fires without
    /// reading the body at all; otherwise the body is read (to learn the tool
    /// name) but never forwarded to rmcp.
    RefuseBeforeRead,
}

/// A fault that was consumed by an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiredFault {
    /// The tool name (for `schedule`) or JSON-RPC method (for
    /// `schedule_for_method`) it was scheduled for.
    pub target: String,
    pub fault: Fault,
}

#[derive(Default)]
struct PlanInner {
    by_tool: HashMap<String, VecDeque<Fault>>,
    by_method: HashMap<String, VecDeque<Fault>>,
    fired: Vec<FiredFault>,
}

/// Thread-safe queue of faults, per tool.
#[derive(Default)]
pub struct FaultPlan {
    inner: Mutex<PlanInner>,
}

impl FaultPlan {
    /// Queue `fault` for the next `tools/call` POST of `tool`. Several faults
    /// for one tool fire in the order they were scheduled, one per call.
    pub fn schedule(&self, tool: &str, fault: Fault) {
        self.inner
            .lock()
            .unwrap()
            .by_tool
            .entry(tool.to_owned())
            .or_default()
            .push_back(fault);
    }

    /// Queue `fault` for the next `n` `tools/call` POSTs of `tool`.
    pub fn schedule_n(&self, tool: &str, fault: Fault, n: usize) {
        for _ in 0..n {
            self.schedule(tool, fault.clone());
        }
    }

    /// Queue `fault` for the next POST whose JSON-RPC method is `method`
    /// (e.g. `"initialize"`, `"tools/list"`). Tool-specific faults take
    /// precedence for `tools/call`.
    pub fn schedule_for_method(&self, method: &str, fault: Fault) {
        self.inner
            .lock()
            .unwrap()
            .by_method
            .entry(method.to_owned())
            .or_default()
            .push_back(fault);
    }

    /// Faults not yet consumed, per tool: `(tool, fault)` in schedule order
    /// per tool.
    pub fn pending(&self) -> Vec<(String, Fault)> {
        let inner = self.inner.lock().unwrap();
        let mut out: Vec<(String, Fault)> = inner
            .by_tool
            .iter()
            .flat_map(|(tool, q)| q.iter().map(move |f| (tool.clone(), f.clone())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Faults not yet consumed that were scheduled by JSON-RPC method.
    pub fn pending_for_methods(&self) -> Vec<(String, Fault)> {
        let inner = self.inner.lock().unwrap();
        let mut out: Vec<(String, Fault)> = inner
            .by_method
            .iter()
            .flat_map(|(m, q)| q.iter().map(move |f| (m.clone(), f.clone())))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Number of unconsumed faults for `tool`.
    pub fn pending_for(&self, tool: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .by_tool
            .get(tool)
            .map_or(0, VecDeque::len)
    }

    /// True when no fault is waiting.
    pub fn is_empty(&self) -> bool {
        let inner = self.inner.lock().unwrap();
        inner.by_tool.values().all(VecDeque::is_empty)
            && inner.by_method.values().all(VecDeque::is_empty)
    }

    /// Drop every unconsumed fault.
    pub fn clear(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.by_tool.clear();
        inner.by_method.clear();
    }

    /// Faults consumed so far, in the order they fired.
    pub fn fired(&self) -> Vec<FiredFault> {
        self.inner.lock().unwrap().fired.clone()
    }

    fn take(&self, tool: Option<&str>, method: Option<&str>) -> Option<Fault> {
        let mut inner = self.inner.lock().unwrap();
        let inner = &mut *inner;
        let (target, fault) = if let Some(fault) = tool
            .and_then(|t| inner.by_tool.get_mut(t))
            .and_then(VecDeque::pop_front)
        {
            (tool.unwrap_or_default().to_owned(), fault)
        } else {
            let fault = method
                .and_then(|m| inner.by_method.get_mut(m))
                .and_then(VecDeque::pop_front)?;
            (method.unwrap_or_default().to_owned(), fault)
        };
        inner.fired.push(FiredFault {
            target,
            fault: fault.clone(),
        });
        Some(fault)
    }

    fn take_refusal(&self, tool: &str) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let Some(queue) = inner.by_tool.get_mut(tool) else {
            return false;
        };
        if queue.front() != Some(&Fault::RefuseBeforeRead) {
            return false;
        }
        queue.pop_front();
        inner.fired.push(FiredFault {
            target: tool.to_owned(),
            fault: Fault::RefuseBeforeRead,
        });
        true
    }
}

/// The error an injected fault makes the hyper service (or body) return.
#[derive(Debug, Clone)]
pub struct InjectedFault(pub &'static str);

impl fmt::Display for InjectedFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "injected fault: {}", self.0)
    }
}

impl std::error::Error for InjectedFault {}

/// Tower layer that puts [`FaultService`] in front of a service.
#[derive(Clone)]
pub struct FaultLayer {
    state: Arc<ServerState>,
}

impl FaultLayer {
    pub fn new(state: Arc<ServerState>) -> Self {
        FaultLayer { state }
    }
}

impl<S> Layer<S> for FaultLayer {
    type Service = FaultService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FaultService {
            inner,
            state: self.state.clone(),
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub struct FaultService<S> {
    inner: S,
    state: Arc<ServerState>,
}

pub type FaultBody = UnsyncBoxBody<Bytes, BoxError>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for FaultService<S>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<FaultBody>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // The inner service is driven to readiness per call (on a clone).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let state = self.state.clone();
        Box::pin(handle(inner, state, request))
    }
}

fn header(headers: &http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn log_entry(parts: &http::request::Parts) -> LoggedRequest {
    LoggedRequest {
        method: parts.method.clone(),
        jsonrpc_method: None,
        tool: None,
        idempotency_key: header(&parts.headers, IDEMPOTENCY_KEY_HEADER),
        last_event_id: header(&parts.headers, "last-event-id"),
        session_id: header(&parts.headers, "mcp-session-id"),
        jsonrpc_id: None,
        protocol_version: header(&parts.headers, "mcp-protocol-version"),
        body: None,
        fault: None,
        headers: parts.headers.clone(),
    }
}

fn boxed<RB>(response: Response<RB>) -> Response<FaultBody>
where
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    response.map(|body| body.map_err(Into::into).boxed_unsync())
}

async fn handle<S, B, RB>(
    mut inner: S,
    state: Arc<ServerState>,
    request: Request<B>,
) -> Result<Response<FaultBody>, BoxError>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let mut entry = log_entry(&parts);

    // RefuseBeforeRead without touching the body, when the head names the tool.
    if parts.method == http::Method::POST
        && header(&parts.headers, "mcp-method").as_deref() == Some("tools/call")
        && let Some(tool) = header(&parts.headers, "mcp-name")
        && state.faults().take_refusal(&tool)
    {
        entry.jsonrpc_method = Some("tools/call".to_owned());
        entry.tool = Some(tool);
        entry.fault = Some(Fault::RefuseBeforeRead);
        state.log_request(entry, false);
        return Err(InjectedFault("RefuseBeforeRead").into());
    }

    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    let json: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    if let Some(json) = &json {
        entry.jsonrpc_method = json
            .get("method")
            .and_then(|m| m.as_str())
            .map(str::to_owned);
        entry.jsonrpc_id = json.get("id").cloned();
        if entry.jsonrpc_method.as_deref() == Some("tools/call") {
            entry.tool = json
                .pointer("/params/name")
                .and_then(|n| n.as_str())
                .map(str::to_owned);
        }
    }
    entry.body = json;

    let fault = if parts.method == http::Method::POST {
        state
            .faults()
            .take(entry.tool.as_deref(), entry.jsonrpc_method.as_deref())
    } else {
        None
    };
    entry.fault = fault.clone();
    let request_id = entry.jsonrpc_id.clone();

    match fault {
        Some(Fault::Status(code)) => {
            state.log_request(entry, false);
            let status = http::StatusCode::from_u16(code).map_err(|e| Box::new(e) as BoxError)?;
            let body = Full::new(Bytes::from(format!("injected fault: status {code}")))
                .map_err(|never| match never {})
                .boxed_unsync();
            return Ok(Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, "text/plain")
                .body(body)
                .expect("valid response"));
        }
        Some(Fault::RefuseBeforeRead) => {
            state.log_request(entry, false);
            return Err(InjectedFault("RefuseBeforeRead").into());
        }
        _ => {}
    }

    state.log_request(entry, true);
    let request = Request::from_parts(parts, Full::new(bytes));
    let response = inner
        .ready()
        .await
        .map_err(Into::into)?
        .call(request)
        .await
        .map_err(Into::into)?;

    match fault {
        Some(Fault::DropResponseAfterTool) => {
            let timeout = state.options().drop_wait_timeout;
            let _ = tokio::time::timeout(timeout, drain_until_response(response, request_id)).await;
            Err(InjectedFault("DropResponseAfterTool").into())
        }
        Some(Fault::CutStreamAfterFirstEvent) => {
            let is_sse = response
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            Ok(response.map(|body| CutBody::new(body, is_sse).boxed_unsync()))
        }
        _ => Ok(boxed(response)),
    }
}

/// Read the inner response until the JSON-RPC response (for `id`, if known)
/// has been produced, or the body ends or fails.
async fn drain_until_response<RB>(response: Response<RB>, id: Option<serde_json::Value>)
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    let is_sse = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = response.into_body();
    if !is_sse {
        let _ = body.collect().await;
        return;
    }
    let matches = |event: &SseEvent| {
        event.json().is_some_and(|v| {
            is_jsonrpc_response(&v) && id.as_ref().is_none_or(|id| v.get("id") == Some(id))
        })
    };
    let mut reader = SseReader::new(body);
    while let Ok(Some(event)) = reader.next_event().await {
        if matches(&event) {
            return;
        }
    }
}

enum CutState {
    /// Looking for the end of the first SSE event.
    Reading,
    /// Control was handed back to hyper so it flushes the response head and
    /// whatever was forwarded; then the body fails.
    Flushing(Pin<Box<tokio::time::Sleep>>),
    /// The error was returned.
    Done,
}

impl CutState {
    fn flushing() -> Self {
        CutState::Flushing(Box::pin(tokio::time::sleep(Duration::from_millis(20))))
    }
}

/// Body that forwards the first SSE event of `inner` and then fails.
struct CutBody<B> {
    inner: Pin<Box<B>>,
    buf: BytesMut,
    is_sse: bool,
    state: CutState,
}

impl<B> CutBody<B> {
    fn new(inner: B, is_sse: bool) -> Self {
        CutBody {
            inner: Box::pin(inner),
            buf: BytesMut::new(),
            is_sse,
            state: CutState::Reading,
        }
    }
}

fn cut_error() -> BoxError {
    InjectedFault("CutStreamAfterFirstEvent").into()
}

impl<B> Body for CutBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                CutState::Done => return Poll::Ready(None),
                CutState::Flushing(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.state = CutState::Done;
                    return Poll::Ready(Some(Err(cut_error())));
                }
                CutState::Reading => {
                    if !this.is_sse {
                        // Not a stream: send the head only, then cut.
                        this.state = CutState::flushing();
                        continue;
                    }
                    if let Some((len, delim)) = find_event_boundary(&this.buf) {
                        let block = this.buf.split_to(len + delim).freeze();
                        let event = SseEvent::parse(&String::from_utf8_lossy(&block[..len]));
                        let Some(event) = event else {
                            // Comment-only block (keep-alive): forward, keep looking.
                            return Poll::Ready(Some(Ok(Frame::data(block))));
                        };
                        this.state = CutState::flushing();
                        if event.is_jsonrpc_response() {
                            // Never deliver the response itself: cut with
                            // only the head sent.
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(block))));
                    }
                    match this.inner.as_mut().poll_frame(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(None) => this.state = CutState::flushing(),
                        Poll::Ready(Some(Err(error))) => {
                            this.state = CutState::Done;
                            return Poll::Ready(Some(Err(error.into())));
                        }
                        Poll::Ready(Some(Ok(frame))) => {
                            if let Ok(mut data) = frame.into_data() {
                                let bytes = data.copy_to_bytes(data.remaining());
                                this.buf.extend_from_slice(&bytes);
                            }
                        }
                    }
                }
            }
        }
    }
}
