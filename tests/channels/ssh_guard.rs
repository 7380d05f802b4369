//! The marker probe used by the guard, end to end: a guarded hyper client against rmcp's own
//! Streamable HTTP server on 127.0.0.1, whose `restart_service` tool runs its command over SSH
//! (a real sshd, `tests/support/sshd.rs`) under the marker of the execution ID the guard sent as
//! `Idempotency-Key`. The first answer is lost after the tool ran; the same call again is
//! settled by `MarkerProbe` over SSH, never re-sent.
//!
//! The ground truth is the file the command appends to on the host (one line per real run) and
//! the count of tool bodies the server entered.

use crate::sshd;
use crate::support;

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use mcp_replay_guard::{
    ExecutionId,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    integrations::ssh::{MarkedCommand, MarkerProbe, MarkerStatus, run_marked, sh_quote},
    ledger::{Ledger, MemoryLedger},
};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ServerCapabilities, ServerConfig},
    service::RequestContext,
    tool, tool_handler, tool_router,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};
use sshd::{Sshd, sshd_or_skip};
use support::{BoxError, IDEMPOTENCY_KEY_HEADER, call_tool, error_chain, initialize};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service};

const TOOL: &str = "restart_service";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct RestartArgs {
    /// The service to restart.
    service: String,
}

/// The tool: `command` (its `{service}` replaced by the quoted argument) over SSH, under the
/// marker of the call's `Idempotency-Key`.
#[derive(Clone)]
struct SshTools {
    sshd: Arc<SshdTarget>,
    entered: Arc<AtomicUsize>,
}

struct SshdTarget {
    config: mcp_replay_guard::integrations::ssh::SshConfig,
    command: String,
    state_dir: String,
}

#[tool_router]
impl SshTools {
    #[tool(description = "Restart a service on the host, under a marker")]
    async fn restart_service(
        &self,
        Parameters(args): Parameters<RestartArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let id: ExecutionId = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get(IDEMPOTENCY_KEY_HEADER))
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ErrorData::invalid_params("no Idempotency-Key", None))?;
        let internal = |e: &dyn std::error::Error| ErrorData::internal_error(e.to_string(), None);
        let session = self.sshd.config.connect().await.map_err(|e| internal(&e))?;
        let service = sh_quote(&args.service).map_err(|e| internal(&e))?;
        let command = MarkedCommand::new(self.sshd.command.replace("{service}", &service))
            .state_dir(self.sshd.state_dir.clone());
        let record = run_marked(&session, id, &command)
            .await
            .map_err(|e| internal(&e))?;
        serde_json::from_value(record.to_call_tool_result()).map_err(|e| internal(&e))
    }
}

#[tool_handler]
impl ServerHandler for SshTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// rmcp's Streamable HTTP server (sessions) with [`SshTools`] on 127.0.0.1.
struct McpServer {
    url: String,
    entered: Arc<AtomicUsize>,
    shutdown: CancellationToken,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn serve(sshd: &Sshd, command: String, state_dir: String) -> McpServer {
    let shutdown = CancellationToken::new();
    let entered = Arc::new(AtomicUsize::new(0));
    let tools = SshTools {
        sshd: Arc::new(SshdTarget {
            config: sshd.config(),
            command,
            state_dir,
        }),
        entered: entered.clone(),
    };
    let service = StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(_) => continue,
                },
            };
            let service = TowerToHyperService::new(service.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                tokio::select! {
                    _ = builder.serve_connection(TokioIo::new(stream), service) => {}
                    _ = stop.cancelled() => {}
                }
            });
        }
    });
    McpServer {
        url: format!("http://{addr}/mcp"),
        entered,
        shutdown,
    }
}

/// Below the guard: while `armed`, the next exchange reaches the server, its whole answer is
/// read (the tool ran) and thrown away, and the guard sees the connection die instead.
#[derive(Clone)]
struct LoseOneAnswer {
    inner: Client<HttpConnector, GuardRequestBody>,
    armed: Arc<AtomicBool>,
}

impl Service<Request<GuardRequestBody>> for LoseOneAnswer {
    type Response = Response<hyper::body::Incoming>;
    type Error = BoxError;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<GuardRequestBody>) -> Self::Future {
        let lose = self.armed.swap(false, Ordering::SeqCst);
        let sent = self.inner.call(request);
        Box::pin(async move {
            let response = sent.await?;
            if !lose {
                return Ok(response);
            }
            let _ = response.into_body().collect().await;
            Err("connection closed before message completed (injected)".into())
        })
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// One cell: the server, a guarded client whose first tool answer is lost, and the ledger.
struct Cell {
    sshd: Sshd,
    server: McpServer,
    session: Option<String>,
    ledger: MemoryLedger,
    client: mcp_replay_guard::guard::Guard<LoseOneAnswer>,
    file: std::path::PathBuf,
}

impl Cell {
    async fn start(name: &str, delay: &str) -> Self {
        let sshd = Sshd::start(name).await;
        let file = sshd.dir.join("f");
        let markers = sshd.dir.join("markers").display().to_string();
        let command = format!("{delay}echo {{service}} >> '{}'", file.display());
        let server = serve(&sshd, command, markers.clone()).await;
        let session = initialize(&mut support::hyper_client(), &server.url)
            .await
            .unwrap();
        let ledger = MemoryLedger::new();
        let contracts = ContractRegistry::builder()
            .tool(
                TOOL,
                ToolContract::recoverable()
                    .status_probe(MarkerProbe::new(sshd.config()).state_dir(markers)),
            )
            .build()
            .unwrap();
        let guard = GuardLayer::new(
            ledger.clone(),
            contracts,
            FingerprintKey::from_bytes(&[7; 32]).unwrap(),
        );
        let client = guard.layer(LoseOneAnswer {
            inner: Client::builder(TokioExecutor::new()).build_http(),
            armed: Arc::new(AtomicBool::new(true)),
        });
        Self {
            sshd,
            server,
            session,
            ledger,
            client,
            file,
        }
    }

    async fn call(&mut self, id: i64) -> Result<Value, BoxError> {
        let mut client = self.client.clone();
        let url = self.server.url.clone();
        let session = self.session.clone();
        tokio::spawn(async move {
            call_tool(
                &mut client,
                &url,
                session.as_deref(),
                id,
                TOOL,
                json!({"service": "nginx"}),
            )
            .await
        })
        .await
        .unwrap()
    }

    /// The one execution in the ledger, once its first attempt lost its answer.
    async fn only_execution(&self) -> mcp_replay_guard::execution::ExecutionRecord {
        let records = self.ledger.list().await.unwrap();
        assert_eq!(records.len(), 1, "{records:#?}");
        records.into_iter().next().unwrap()
    }

    fn probe(&self) -> MarkerProbe {
        MarkerProbe::new(self.sshd.config())
            .state_dir(self.sshd.dir.join("markers").display().to_string())
    }
}

/// The first answer of an exchange whose response was lost: a transport error or the guard's
/// own "unknown" answer, never the tool's result.
fn assert_lost(first: &Result<Value, BoxError>) {
    match first {
        Err(_) => {}
        Ok(response) => assert_eq!(
            response
                .pointer("/result/structuredContent/mcp_replay_guard/state")
                .and_then(Value::as_str),
            Some("unknown"),
            "{response}"
        ),
    }
}

#[tokio::test]
async fn a_lost_answer_is_settled_by_the_marker_probe_over_ssh_and_never_re_sent() {
    let Some(()) = sshd_or_skip() else { return };
    let mut cell = Cell::start("guard-applied", "").await;

    let first = cell.call(2).await;
    assert_lost(&first);
    assert_eq!(lines(&cell.file), 1, "the command ran on the host");
    let lost = cell.only_execution().await;
    assert_eq!(lost.state(), ExecutionState::Unknown, "{lost:#?}");

    // The same call again: the guard asks the marker over SSH and hands back its result.
    let second = cell
        .call(3)
        .await
        .unwrap_or_else(|e| panic!("the repeat is answered: {}", error_chain(&*e)));
    let result = second
        .get("result")
        .unwrap_or_else(|| panic!("a result, not an error: {second}"));
    assert_eq!(result["isError"], false, "{second}");
    assert_eq!(result["structuredContent"]["exit_status"], 0, "{second}");
    assert_eq!(
        std::fs::read_to_string(&cell.file).unwrap(),
        "nginx\n",
        "never re-sent"
    );
    assert_eq!(
        cell.server.entered.load(Ordering::SeqCst),
        1,
        "one tool body"
    );
    let record = cell.only_execution().await;
    assert_eq!(record.execution_id(), lost.execution_id());
    assert_eq!(
        record.state(),
        ExecutionState::ResolvedApplied,
        "{record:#?}"
    );
    assert_eq!(record.attempts(), 1, "{record:#?}");
}

#[tokio::test]
async fn a_command_killed_on_the_host_is_held_for_review_by_the_guard() {
    let Some(()) = sshd_or_skip() else { return };
    let mut cell = Cell::start("guard-killed", "sleep 30; ").await;

    let first = {
        let mut client = cell.client.clone();
        let url = cell.server.url.clone();
        let session = cell.session.clone();
        tokio::spawn(async move {
            call_tool(
                &mut client,
                &url,
                session.as_deref(),
                2,
                TOOL,
                json!({"service": "nginx"}),
            )
            .await
        })
    };
    // Wait for the command on the host, then kill the wrapper and the command (kill -9).
    let probe = cell.probe();
    let mut running = None;
    for _ in 0..150 {
        if let Some(id) = cell
            .ledger
            .list()
            .await
            .unwrap()
            .first()
            .map(|r| r.execution_id())
            && let Ok(MarkerStatus::Running {
                pid: Some(pid),
                child: Some(child),
            }) = probe.status(id).await
        {
            running = Some((pid, child));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (pid, child) = running.expect("the command started on the host");
    for pid in [pid, child] {
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    assert_lost(&first.await.unwrap());
    let lost = cell.only_execution().await;
    assert_eq!(lost.state(), ExecutionState::Unknown);
    // Until the host sees the processes gone the marker says running (the guard would answer
    // "in progress"); wait for that, as an operator asking later would.
    let mut status = None;
    for _ in 0..150 {
        match probe.status(lost.execution_id()).await.unwrap() {
            MarkerStatus::Running { .. } => {}
            other => {
                status = Some(other);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = status.expect("the marker leaves running once the processes are gone");
    assert!(matches!(status, MarkerStatus::Gone { .. }), "{status:?}");

    // The same call again: the marker says the process is gone without an exit status.
    let second = cell
        .call(3)
        .await
        .unwrap_or_else(|e| panic!("the repeat is answered: {}", error_chain(&*e)));
    let guard = second
        .pointer("/result/structuredContent/mcp_replay_guard")
        .unwrap_or_else(|| panic!("the guard's own answer: {second}"));
    assert_eq!(guard["state"], "needs_review", "{second}");
    assert_eq!(second["result"]["isError"], true, "{second}");
    assert!(lines(&cell.file) <= 1);
    assert_eq!(
        cell.server.entered.load(Ordering::SeqCst),
        1,
        "never re-sent"
    );
    let record = cell.only_execution().await;
    assert_eq!(record.state(), ExecutionState::NeedsReview, "{record:#?}");
    assert_eq!(record.attempts(), 1, "{record:#?}");
}
