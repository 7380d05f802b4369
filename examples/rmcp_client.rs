//! rmcp's own MCP client, sending through the guard.
//!
//! Starts an rmcp Streamable HTTP server on 127.0.0.1 with one side-effecting tool,
//! `deploy_release`, which counts its runs. Then stacks a hyper client, `GuardLayer` and
//! `TowerHttpClient` under rmcp's client, calls the tool once, and prints the result and the
//! guard's ledger record. Exits non-zero unless the tool ran exactly once.
//!
//! ```text
//! cargo run --example rmcp_client --features rmcp
//! ```

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
    service::TowerToHyperService,
};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    integrations::rmcp::TowerHttpClient,
    ledger::{ExecutionState, Ledger, MemoryLedger},
};
use rmcp::{
    ErrorData, ServerHandler, ServiceExt,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{
        CallToolRequestParams, CallToolResult, ContentBlock, ServerCapabilities, ServerConfig,
    },
    tool, tool_handler, tool_router,
    transport::{
        StreamableHttpClientTransport, StreamableHttpServerConfig, StreamableHttpService,
        streamable_http_client::StreamableHttpClientTransportConfig,
        streamable_http_server::session::local::LocalSessionManager,
    },
};
use tower::ServiceBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The server side: one tool whose runs are counted.
#[derive(Clone)]
struct Deployer {
    deployments: Arc<AtomicUsize>,
    tool_router: ToolRouter<Self>,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct DeployArgs {
    /// Service to deploy.
    service: String,
    /// Version to deploy.
    version: String,
}

#[tool_router]
impl Deployer {
    #[tool(description = "Deploy a release of a service (a side effect)")]
    async fn deploy_release(
        &self,
        Parameters(args): Parameters<DeployArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        let n = self.deployments.fetch_add(1, Ordering::SeqCst) + 1;
        let text = format!(
            "deployed {} {} (deployment {n})",
            args.service, args.version
        );
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Deployer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Serves rmcp's Streamable HTTP service on 127.0.0.1:0; returns the endpoint URL.
async fn start_server(deployments: Arc<AtomicUsize>) -> Result<String, BoxError> {
    let deployer = Deployer {
        deployments,
        tool_router: Deployer::tool_router(),
    };
    let service = StreamableHttpService::new(
        move || Ok(deployer.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let builder = auto::Builder::new(TokioExecutor::new());
                let _ = builder
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(url)
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let deployments = Arc::new(AtomicUsize::new(0));
    let url = start_server(deployments.clone()).await?;

    // The client side: rmcp over TowerHttpClient over the guard over hyper.
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    let ledger = MemoryLedger::new();
    let stack = ServiceBuilder::new()
        .layer(GuardLayer::new(
            ledger.clone(),
            contracts,
            FingerprintKey::generate()?,
        ))
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let transport = StreamableHttpClientTransport::with_client(
        TowerHttpClient::new(stack),
        StreamableHttpClientTransportConfig::with_uri(url),
    );
    let client = ().serve(transport).await?;

    let arguments = serde_json::json!({"service": "catalog", "version": "2026.07.22"});
    let call = CallToolRequestParams::new("deploy_release")
        .with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(call).await?;
    println!("result: {}", serde_json::to_string(&result.content)?);
    client.cancel().await?;

    // The guard records the delivery once the response stream has been read to its end.
    let mut records = ledger.list().await?;
    for _ in 0..100 {
        if records.iter().all(|r| r.delivered_at.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        records = ledger.list().await?;
    }
    for record in &records {
        println!("ledger record: {}", serde_json::to_string_pretty(record)?);
    }

    let runs = deployments.load(Ordering::SeqCst);
    let completed = records
        .iter()
        .filter(|r| r.state == ExecutionState::Completed)
        .count();
    println!("deploy_release ran {runs} time(s); {completed} completed execution(s) in the ledger");
    Ok(if runs == 1 && completed == 1 && records.len() == 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
