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

#[path = "support/deploy_server.rs"]
mod deploy_server;

use std::{process::ExitCode, time::Duration};

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    integrations::rmcp::TowerHttpClient,
    ledger::{Ledger, MemoryLedger},
};
use rmcp::{
    ServiceExt,
    model::CallToolRequestParams,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use tower::ServiceBuilder;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let url = server.url.clone();

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
        if records.iter().all(|r| r.delivered_at().is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        records = ledger.list().await?;
    }
    for record in &records {
        println!("ledger record: {}", serde_json::to_string_pretty(record)?);
    }

    let runs = server.count();
    let completed = records
        .iter()
        .filter(|r| r.state() == ExecutionState::Completed)
        .count();
    println!("deploy_release ran {runs} time(s); {completed} completed execution(s) in the ledger");
    Ok(if runs == 1 && completed == 1 && records.len() == 1 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
