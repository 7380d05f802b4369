//! A small MCP server for the examples: rmcp's own Streamable HTTP server on 127.0.0.1 with a
//! `deploy_release` tool that counts deployments. Shared by the examples with
//! `#[path = "support/deploy_server.rs"] mod deploy_server;`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
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
}

impl DeployServer {
    /// Starts the server on 127.0.0.1 (port 0) in the current tokio runtime.
    pub async fn start() -> std::io::Result<Self> {
        let deployments = Arc::new(AtomicUsize::new(0));
        let tools = DeployTools::new(deployments.clone());
        let service = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr: SocketAddr = listener.local_addr()?;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let service = TowerToHyperService::new(service.clone());
                tokio::spawn(async move {
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            url: format!("http://{addr}/mcp"),
            deployments,
        })
    }

    /// Deployments so far.
    pub fn count(&self) -> usize {
        self.deployments.load(Ordering::SeqCst)
    }
}

/// rmcp's Streamable HTTP service (sessions, SSE answers) over the tools, counting into
/// `deployments`: for an example that puts its own layers in front of rmcp.
#[allow(dead_code)] // idempotent_server uses it; the client examples do not
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
