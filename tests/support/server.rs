//! The test server: rmcp's own `StreamableHttpService` behind the fault layer,
//! served by hyper-util's `auto` connection builder on `127.0.0.1:0`.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Full, combinators::BoxBody};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use rmcp::{
    RoleServer,
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
        session::{local::LocalSessionManager, never::NeverSessionManager},
    },
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::{Layer, util::BoxCloneService};

use super::{
    IDEMPOTENCY_KEY_HEADER,
    bearer::BearerGate,
    event_store::InMemoryEventStore,
    faults::{Fault, FaultLayer, FaultPlan},
    tls::TestCerts,
    tools::TestTools,
};

/// How the server is configured. `ServerOptions::default()` is the
/// session-era (2025-11-25) server: `LocalSessionManager`, SSE responses with
/// priming events that carry event ids, no event store.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Stateless mode: `legacy_session_mode = false` with rmcp's
    /// `NeverSessionManager` (or a `LocalSessionManager` that never creates
    /// sessions when `event_store` is set, so resumption still works). No
    /// `Mcp-Session-Id` is issued; requests need no handshake. This is the
    /// 2026-07-28 era; rmcp also serves 2025-era requests statelessly here.
    ///
    /// Note: for 2026-07-28 requests (per-request `_meta`) rmcp holds the
    /// response head until the handler's first message (it must know the
    /// HTTP status), so there the priming event and the response leave
    /// together and every fault that needs the head fires after the tool ran.
    pub stateless: bool,
    /// Stateless mode only: answer simple tool calls with `application/json`
    /// instead of SSE (rmcp's `json_response`).
    pub json_response: bool,
    /// Persist every SSE event in an [`InMemoryEventStore`] so a `GET` with
    /// `Last-Event-ID` replays a request stream even after it completed (and
    /// in stateless mode at all). Without it, rmcp's `LocalSessionManager`
    /// replays a request stream only while the request is still in flight.
    pub event_store: bool,
    /// How long `slow_deploy` sleeps before it counts. Default 300 ms.
    pub slow_tool_delay: Duration,
    /// SSE `retry:` of priming events; `None` disables priming events.
    /// Default: rmcp's default (3 s).
    pub sse_retry: Option<Duration>,
    /// SSE keep-alive comment interval. Default: rmcp's default (15 s).
    pub sse_keep_alive: Option<Duration>,
    /// Longest time `Fault::DropResponseAfterTool` waits for the tool's
    /// JSON-RPC response before it drops the exchange anyway. Default 10 s.
    pub drop_wait_timeout: Duration,
    /// The server-side Idempotency-Key layer, installed between the fault layer and rmcp (so
    /// a fault that loses the response fires after the layer kept it). Default: none.
    pub idempotency: Option<mcp_replay_guard::integrations::server::IdempotencyLayer>,
    /// Require `Authorization: Bearer <token>` on every request, as an OAuth-protected server
    /// does: 401 with `WWW-Authenticate: Bearer resource_metadata="…"` otherwise, and the
    /// metadata documents served on their well-known paths ([`super::bearer`]). Default: none.
    pub bearer_token: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            stateless: false,
            json_response: false,
            event_store: false,
            slow_tool_delay: Duration::from_millis(300),
            sse_retry: Some(Duration::from_secs(3)),
            sse_keep_alive: Some(Duration::from_secs(15)),
            drop_wait_timeout: Duration::from_secs(10),
            idempotency: None,
            bearer_token: None,
        }
    }
}

impl ServerOptions {
    /// Options for a stateless (2026-07-28 era) server.
    pub fn stateless() -> Self {
        ServerOptions {
            stateless: true,
            ..ServerOptions::default()
        }
    }
}

/// One execution of a tool body.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRun {
    /// `Idempotency-Key` header of the HTTP request that carried the call.
    pub idempotency_key: Option<String>,
    /// `Mcp-Session-Id` header of that request.
    pub session_id: Option<String>,
    /// The JSON-RPC request id (as rmcp saw it), rendered as a string.
    pub request_id: String,
    /// The tool arguments as the tool parsed them.
    pub arguments: serde_json::Value,
    /// When the body made its effect: a test that orders effects against what its callers
    /// were told reads it.
    pub at: Instant,
}

/// One HTTP request as seen by the server's fault layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedRequest {
    pub method: http::Method,
    /// JSON-RPC `method` of the POST body (`None` for GET/DELETE).
    pub jsonrpc_method: Option<String>,
    /// `params.name` of a `tools/call`.
    pub tool: Option<String>,
    /// `Idempotency-Key` header.
    pub idempotency_key: Option<String>,
    /// `Last-Event-ID` header.
    pub last_event_id: Option<String>,
    /// `Mcp-Session-Id` header.
    pub session_id: Option<String>,
    /// JSON-RPC `id` of the POST body.
    pub jsonrpc_id: Option<serde_json::Value>,
    /// `MCP-Protocol-Version` header.
    pub protocol_version: Option<String>,
    /// The parsed POST body (`None` if absent, unread or not JSON).
    pub body: Option<serde_json::Value>,
    /// The fault injected into this exchange, if any.
    pub fault: Option<Fault>,
    /// Every header of the request.
    pub headers: http::HeaderMap,
}

#[derive(Default)]
struct StateInner {
    runs: HashMap<String, Vec<ToolRun>>,
    started: HashMap<String, usize>,
    rotations: HashMap<String, usize>,
    requests: Vec<LoggedRequest>,
    all_requests: Vec<LoggedRequest>,
    /// Runs of each tool still to answer `-32603` after their side effect.
    fail_after_effect: HashMap<String, usize>,
}

/// Ground truth of the test server. Shared by the tools, the fault layer and
/// the test.
pub struct ServerState {
    inner: Mutex<StateInner>,
    faults: FaultPlan,
    sessions: Option<Arc<LocalSessionManager>>,
    event_store: Option<InMemoryEventStore>,
    options: ServerOptions,
}

fn header(parts: &http::request::Parts, name: &str) -> Option<String> {
    parts
        .headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

impl ServerState {
    fn new(
        options: ServerOptions,
        sessions: Option<Arc<LocalSessionManager>>,
        event_store: Option<InMemoryEventStore>,
    ) -> Self {
        ServerState {
            inner: Mutex::new(StateInner::default()),
            faults: FaultPlan::default(),
            sessions,
            event_store,
            options,
        }
    }

    // ---- ground truth -------------------------------------------------

    /// How many times `tool`'s body ran to completion (its side effect).
    pub fn side_effects(&self, tool: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .runs
            .get(tool)
            .map_or(0, Vec::len)
    }

    /// How many times `tool`'s body was entered (for `slow_deploy` this is
    /// ahead of [`Self::side_effects`] while a call sleeps).
    pub fn started(&self, tool: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .started
            .get(tool)
            .copied()
            .unwrap_or(0)
    }

    /// The `Idempotency-Key` header seen by each run of `tool`, in order.
    pub fn idempotency_keys(&self, tool: &str) -> Vec<Option<String>> {
        self.tool_runs(tool)
            .into_iter()
            .map(|run| run.idempotency_key)
            .collect()
    }

    /// Every run of `tool`, in order.
    pub fn tool_runs(&self, tool: &str) -> Vec<ToolRun> {
        self.inner
            .lock()
            .unwrap()
            .runs
            .get(tool)
            .cloned()
            .unwrap_or_default()
    }

    /// Total side effects over all tools.
    pub fn total_side_effects(&self) -> usize {
        self.inner.lock().unwrap().runs.values().map(Vec::len).sum()
    }

    /// How many times credential `name` was rotated.
    pub fn rotations(&self, name: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .rotations
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    /// Every HTTP request that passed the fault layer and reached rmcp, in
    /// arrival order (including those whose response a fault then lost; their
    /// `fault` field says so).
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// The stream resumes that reached rmcp: GETs with `Last-Event-ID`.
    pub fn resume_requests(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == http::Method::GET && r.last_event_id.is_some())
            .collect()
    }

    /// Every HTTP request that reached the HTTP server, including the ones
    /// the fault layer answered itself (`Fault::Status`) or refused
    /// (`Fault::RefuseBeforeRead`) without involving rmcp.
    pub fn all_requests(&self) -> Vec<LoggedRequest> {
        self.inner.lock().unwrap().all_requests.clone()
    }

    /// The `tools/call` requests for `tool` that reached rmcp, in order.
    pub fn tool_call_requests(&self, tool: &str) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.tool.as_deref() == Some(tool))
            .collect()
    }

    /// The fault plan: schedule faults here.
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// Loses the next response of `tool` after its body ran (the side effect happened, the
    /// caller never hears of it): [`Fault::DropResponseAfterTool`].
    pub fn lose_next_response(&self, tool: &str) {
        self.faults.schedule(tool, Fault::DropResponseAfterTool);
    }

    /// The next run of `tool` makes its side effect, then answers with rmcp's
    /// `ErrorData::internal_error` (JSON-RPC `-32603`), as a tool that fails after its commit.
    pub fn fail_next_after_effect(&self, tool: &str) {
        *self
            .inner
            .lock()
            .unwrap()
            .fail_after_effect
            .entry(tool.to_owned())
            .or_default() += 1;
    }

    /// Whether this run of `tool`, its effect made, answers with an internal error
    /// ([`fail_next_after_effect`](Self::fail_next_after_effect)).
    pub(crate) fn take_failure_after_effect(&self, tool: &str) -> bool {
        let mut inner = self.inner.lock().unwrap();
        match inner.fail_after_effect.get_mut(tool) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// The options the server was started with.
    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// The event store, when [`ServerOptions::event_store`] is set.
    pub fn event_store(&self) -> Option<&InMemoryEventStore> {
        self.event_store.as_ref()
    }

    /// Ids of the sessions rmcp currently knows (empty in stateless mode).
    pub fn session_ids(&self) -> Vec<String> {
        let Some(manager) = &self.sessions else {
            return Vec::new();
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(map) = manager.sessions.try_read() {
                return map.keys().map(|id| id.to_string()).collect();
            }
            assert!(Instant::now() < deadline, "session map stayed locked");
            std::thread::yield_now();
        }
    }

    /// Forget every session in `LocalSessionManager`'s map, so the next
    /// request carrying an old `Mcp-Session-Id` gets 404 (as after a server
    /// restart). The session workers end once their handles are dropped.
    /// No-op in stateless mode.
    pub fn clear_sessions(&self) {
        let Some(manager) = &self.sessions else {
            return;
        };
        // rmcp never holds this lock across an await, so `try_write` only
        // fails for a moment (and never on a current-thread runtime).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(mut map) = manager.sessions.try_write() {
                map.clear();
                return;
            }
            assert!(Instant::now() < deadline, "session map stayed locked");
            std::thread::yield_now();
        }
    }

    /// Poll (every 5 ms, up to `timeout`) until `tool` has at least `n` side
    /// effects. Returns the count at the end, so
    /// `assert_eq!(state.wait_for_side_effects("t", 1, d).await, 1)` also
    /// catches overshoot.
    pub async fn wait_for_side_effects(&self, tool: &str, n: usize, timeout: Duration) -> usize {
        self.wait_for(|| self.side_effects(tool), n, timeout).await
    }

    /// Like [`Self::wait_for_side_effects`] for [`Self::started`].
    pub async fn wait_for_started(&self, tool: &str, n: usize, timeout: Duration) -> usize {
        self.wait_for(|| self.started(tool), n, timeout).await
    }

    /// Poll until at least `n` requests reached rmcp; returns the count.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> usize {
        self.wait_for(|| self.requests().len(), n, timeout).await
    }

    async fn wait_for(&self, count: impl Fn() -> usize, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let current = count();
            if current >= n || tokio::time::Instant::now() >= deadline {
                return current;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    // ---- recording (used by the tools and the fault layer) --------------

    pub(crate) fn slow_tool_delay(&self) -> Duration {
        self.options.slow_tool_delay
    }

    pub(crate) fn record_start(&self, tool: &str) {
        *self
            .inner
            .lock()
            .unwrap()
            .started
            .entry(tool.to_owned())
            .or_default() += 1;
    }

    /// Record one completed run; returns the new side-effect count of `tool`.
    pub(crate) fn record_run(
        &self,
        tool: &str,
        ctx: &RequestContext<RoleServer>,
        arguments: serde_json::Value,
    ) -> usize {
        let parts = ctx.extensions.get::<http::request::Parts>();
        let run = ToolRun {
            idempotency_key: parts.and_then(|p| header(p, IDEMPOTENCY_KEY_HEADER)),
            session_id: parts.and_then(|p| header(p, "mcp-session-id")),
            request_id: ctx.id.to_string(),
            arguments,
            at: Instant::now(),
        };
        let mut inner = self.inner.lock().unwrap();
        let runs = inner.runs.entry(tool.to_owned()).or_default();
        runs.push(run);
        runs.len()
    }

    pub(crate) fn rotate(&self, name: &str) -> usize {
        let mut inner = self.inner.lock().unwrap();
        let n = inner.rotations.entry(name.to_owned()).or_default();
        *n += 1;
        *n
    }

    pub(crate) fn log_request(&self, request: LoggedRequest, reached_rmcp: bool) {
        let mut inner = self.inner.lock().unwrap();
        if reached_rmcp {
            inner.requests.push(request.clone());
        }
        inner.all_requests.push(request);
    }
}

/// rmcp's service, type-erased so session and stateless configurations share
/// one server loop.
pub type RmcpService =
    BoxCloneService<Request<Full<Bytes>>, Response<BoxBody<Bytes, Infallible>>, Infallible>;

/// Boxes rmcp's service as [`RmcpService`], behind the Idempotency-Key layer when the options
/// ask for it.
fn box_rmcp<S>(service: S, options: &ServerOptions) -> RmcpService
where
    S: tower::Service<
            Request<Full<Bytes>>,
            Response = Response<BoxBody<Bytes, Infallible>>,
            Error = Infallible,
        > + tower::Service<
            Request<mcp_replay_guard::integrations::server::IdempotencyRequestBody<Full<Bytes>>>,
            Response = Response<BoxBody<Bytes, Infallible>>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    <S as tower::Service<Request<Full<Bytes>>>>::Future: Send + 'static,
    <S as tower::Service<
        Request<mcp_replay_guard::integrations::server::IdempotencyRequestBody<Full<Bytes>>>,
    >>::Future: Send + 'static,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    match &options.idempotency {
        None => BoxCloneService::new(service),
        Some(layer) => BoxCloneService::new(
            layer
                .layer(service)
                .map_response(|response| response.map(BodyExt::boxed)),
        ),
    }
}

/// A running test server. Dropping it stops the accept loop, its connections
/// and rmcp's sessions.
pub struct TestServer {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT/mcp`
    pub url: String,
    pub state: Arc<ServerState>,
    shutdown: CancellationToken,
}

impl TestServer {
    /// Session-era server with default options.
    pub async fn start() -> TestServer {
        TestServer::start_with(ServerOptions::default()).await
    }

    pub async fn start_with(options: ServerOptions) -> TestServer {
        TestServer::serve(options, None).await
    }

    /// The server behind rustls, presenting `certs`' server certificate:
    /// `https://127.0.0.1:PORT/mcp`.
    pub async fn start_tls(options: ServerOptions, certs: &TestCerts) -> TestServer {
        TestServer::serve(options, Some(TlsAcceptor::from(certs.server_config()))).await
    }

    async fn serve(options: ServerOptions, tls: Option<TlsAcceptor>) -> TestServer {
        let shutdown = CancellationToken::new();
        let event_store = options.event_store.then(InMemoryEventStore::default);

        let config = StreamableHttpServerConfig::default()
            .with_sse_keep_alive(options.sse_keep_alive)
            .with_sse_retry(options.sse_retry)
            .with_legacy_session_mode(!options.stateless)
            .with_json_response(options.json_response)
            .with_cancellation_token(shutdown.child_token());

        let (state, rmcp_service): (Arc<ServerState>, RmcpService) =
            if options.stateless && event_store.is_none() {
                let state = Arc::new(ServerState::new(options.clone(), None, None));
                let tools_state = state.clone();
                let service = StreamableHttpService::new(
                    move || Ok(TestTools::new(tools_state.clone())),
                    Arc::new(NeverSessionManager::default()),
                    config,
                );
                (state, box_rmcp(service, &options))
            } else if options.stateless {
                let store = event_store.clone().expect("event store");
                let manager = NeverSessionManager::default().with_event_store(Arc::new(store));
                let state = Arc::new(ServerState::new(options.clone(), None, event_store.clone()));
                let tools_state = state.clone();
                let service = StreamableHttpService::new(
                    move || Ok(TestTools::new(tools_state.clone())),
                    Arc::new(manager),
                    config,
                );
                (state, box_rmcp(service, &options))
            } else {
                let mut manager = LocalSessionManager::default();
                manager.session_config.sse_retry = options.sse_retry;
                if let Some(store) = &event_store {
                    manager = manager.with_event_store(Arc::new(store.clone()));
                }
                let manager = Arc::new(manager);
                let state = Arc::new(ServerState::new(
                    options.clone(),
                    Some(manager.clone()),
                    event_store.clone(),
                ));
                let tools_state = state.clone();
                let service = StreamableHttpService::new(
                    move || Ok(TestTools::new(tools_state.clone())),
                    manager,
                    config,
                );
                (state, box_rmcp(service, &options))
            };

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let service = FaultLayer::new(state.clone()).layer(rmcp_service);
        let service = match &options.bearer_token {
            None => tower::util::Either::Left(service),
            Some(token) => tower::util::Either::Right(BearerGate {
                inner: service,
                token: token.as_str().into(),
                origin: format!("http://{addr}").into(),
            }),
        };
        let accept_shutdown = shutdown.clone();
        let scheme = if tls.is_some() { "https" } else { "http" };
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accept_shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _peer)) = accepted else {
                    continue;
                };
                let service = TowerToHyperService::new(service.clone());
                let conn_shutdown = accept_shutdown.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let served = async {
                        match tls {
                            None => {
                                let _ = builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                            // The handshake on the connection's own task, as a real server does.
                            Some(tls) => {
                                if let Ok(stream) = tls.accept(stream).await {
                                    let _ = builder
                                        .serve_connection(TokioIo::new(stream), service)
                                        .await;
                                }
                            }
                        }
                    };
                    tokio::select! {
                        _ = served => {}
                        _ = conn_shutdown.cancelled() => {}
                    }
                });
            }
        });

        TestServer {
            addr,
            url: format!("{scheme}://{addr}/mcp"),
            state,
            shutdown,
        }
    }

    /// Stop the server now (same as dropping it).
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
