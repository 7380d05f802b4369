//! A small MCP server for the examples and `replay-guard demo`: rmcp's own Streamable HTTP
//! server on 127.0.0.1 with a `deploy_release` tool that counts deployments, and one fault it
//! can inject on demand: lose the response of a `tools/call` after the tool ran. Shared with
//! `#[path = "support/deploy_server.rs"] mod deploy_server;`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use rmcp::{
    ErrorData, ServerHandler,
    handler::server::wrapper::Parameters,
    model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig},
    tool, tool_handler, tool_router,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};

/// The arguments of `deploy_release`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
pub struct DeployArgs {
    /// Service to deploy.
    pub service: String,
    /// Version to deploy.
    pub version: String,
}

/// The tools, sharing one deployment counter.
#[derive(Clone)]
pub struct DeployTools {
    deployments: Arc<AtomicUsize>,
}

#[tool_router]
impl DeployTools {
    fn new(deployments: Arc<AtomicUsize>) -> Self {
        Self { deployments }
    }

    #[tool(description = "Deploy a release of a service")]
    async fn deploy_release(
        &self,
        Parameters(args): Parameters<DeployArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let n = self.deployments.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "deployed {} {} (deployment #{n})",
            args.service, args.version
        ))]))
    }
}

#[tool_handler]
impl ServerHandler for DeployTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// A running server.
pub struct DeployServer {
    /// `http://127.0.0.1:PORT/mcp`
    pub url: String,
    /// How many times `deploy_release` ran.
    pub deployments: Arc<AtomicUsize>,
    /// How many of the next `tools/call` responses to lose after the tool ran.
    lose_responses: Arc<AtomicUsize>,
}

/// The error the server's connection fails with when it loses a response on purpose: hyper
/// then closes the connection without answering, as a crashed proxy or a reset would.
#[derive(Debug)]
struct LostResponse;

impl std::fmt::Display for LostResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response lost on purpose after the tool ran")
    }
}

impl std::error::Error for LostResponse {}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl DeployServer {
    /// Starts the server on 127.0.0.1 (port 0) in the current tokio runtime.
    #[allow(dead_code)] // the TLS example uses `start_tls`
    pub async fn start() -> std::io::Result<Self> {
        Self::serve(None).await
    }

    /// Starts the server behind TLS: `https://127.0.0.1:PORT/mcp`, each handshake on its
    /// connection's own task.
    #[allow(dead_code)] // an example uses it; the demo does not
    pub async fn start_tls(tls: tokio_rustls::TlsAcceptor) -> std::io::Result<Self> {
        Self::serve(Some(tls)).await
    }

    async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> std::io::Result<Self> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let deployments = Arc::new(AtomicUsize::new(0));
        let lose_responses = Arc::new(AtomicUsize::new(0));
        let service = rmcp_service(deployments.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        let lose = lose_responses.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = service.clone();
                let lose = lose.clone();
                let handler = hyper::service::service_fn(move |request| {
                    serve(service.clone(), lose.clone(), request)
                });
                let tls = tls.clone();
                tokio::spawn(async move {
                    let builder = auto::Builder::new(TokioExecutor::new());
                    let _ = match tls {
                        None => {
                            builder
                                .serve_connection(TokioIo::new(stream), handler)
                                .await
                        }
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                builder
                                    .serve_connection(TokioIo::new(stream), handler)
                                    .await
                            }
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Ok(Self {
            url: format!("{scheme}://{addr}/mcp"),
            deployments,
            lose_responses,
        })
    }

    /// Deployments so far.
    pub fn count(&self) -> usize {
        self.deployments.load(Ordering::SeqCst)
    }

    /// Loses the response of the next `n` `tools/call` requests: the tool runs, then the
    /// connection closes before the client hears anything.
    #[allow(dead_code)] // the demo uses it; the examples do not
    pub fn lose_next_responses(&self, n: usize) {
        self.lose_responses.store(n, Ordering::SeqCst);
    }
}

/// rmcp's response type.
type RmcpResponse =
    http::Response<http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>>;

/// One request: buffered (so a `tools/call` can be recognised), then handed to rmcp.
async fn serve(
    service: StreamableHttpService<DeployTools, LocalSessionManager>,
    lose: Arc<AtomicUsize>,
    request: Request<hyper::body::Incoming>,
) -> Result<RmcpResponse, BoxError> {
    use tower::ServiceExt as _;
    let (parts, body) = request.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let is_tool_call = parts.method == Method::POST
        && serde_json::from_slice::<serde_json::Value>(&bytes)
            .is_ok_and(|message| message["method"] == "tools/call");
    let lost = is_tool_call
        && lose
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    let response = service
        .oneshot(Request::from_parts(parts, Full::new(bytes)))
        .await?;
    if !lost {
        return Ok(response);
    }
    // Let the tool run to its answer, then drop the answer and the connection.
    let mut body = response.into_body();
    while let Some(Ok(frame)) = body.frame().await {
        if frame
            .data_ref()
            .is_some_and(|data| String::from_utf8_lossy(data).contains("\"result\""))
        {
            break;
        }
    }
    Err(LostResponse.into())
}

/// rmcp's Streamable HTTP service (sessions, SSE answers) over the tools, counting into
/// `deployments`: for an example that puts its own layers in front of rmcp.
pub fn rmcp_service(
    deployments: Arc<AtomicUsize>,
) -> StreamableHttpService<DeployTools, LocalSessionManager> {
    let tools = DeployTools::new(deployments);
    StreamableHttpService::new(
        move || Ok(tools.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    )
}
