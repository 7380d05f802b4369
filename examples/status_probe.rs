//! A `StatusProbe` for a recoverable tool, against an rmcp server this example starts on
//! 127.0.0.1.
//!
//! `deploy_release` is recoverable here: when its answer is lost, the guard asks the tool's
//! status probe whether the deployment took effect before it does anything else. The server
//! loses the answer of the first call after the deployment ran; the agent asks again; the probe
//! looks at the deployments and says "applied", and the guard hands its result back without
//! deploying a second time. One deployment.
//!
//! Run with `cargo run --example status_probe`.

#[path = "support/deploy_server.rs"]
mod deploy_server;
#[path = "support/mcp_http.rs"]
mod mcp_http;

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    contract::{ContractRegistry, ProbeOutcome, ProbeRequest, StatusProbe, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::MemoryLedger,
};
use serde_json::json;
use tower::{ServiceBuilder, ServiceExt};

use mcp_http::BoxError;

/// Asks the deployment system whether the release was deployed. Here it reads the server's
/// counter; a real probe asks the system of record (`GET /deployments?service=…&version=…`),
/// by the execution ID the target saw as `Idempotency-Key` where it keeps one.
#[derive(Debug)]
struct DeploymentsProbe {
    deployments: Arc<AtomicUsize>,
}

#[async_trait]
impl StatusProbe for DeploymentsProbe {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        let service = request.arguments.get("service").and_then(|s| s.as_str());
        let version = request.arguments.get("version").and_then(|v| v.as_str());
        match (service, version, self.deployments.load(Ordering::SeqCst)) {
            (Some(service), Some(version), 1..) => ProbeOutcome::Applied {
                result: Some(json!({
                    "content": [{"type": "text", "text": format!("{service} {version} is deployed (seen by the status probe)")}],
                    "isError": false,
                })),
            },
            // Say "not applied" only when the action cannot take effect later either: this
            // server runs a deployment before it answers, and its answer is gone, so a
            // deployment that did not happen will not.
            (Some(_), Some(_), 0) => ProbeOutcome::NotApplied,
            _ => ProbeOutcome::Unknown {
                reason: "the call names no service and version".into(),
            },
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let probe = DeploymentsProbe {
        deployments: server.deployments.clone(),
    };
    let contracts = ContractRegistry::builder()
        .tool(
            "deploy_release",
            ToolContract::recoverable().status_probe(probe),
        )
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(GuardLayer::new(
            MemoryLedger::new(),
            contracts,
            FingerprintKey::generate()?,
        ))
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let session = mcp_http::open_session(&mut client, &server.url, "status-probe-example").await?;

    // 1. The deployment runs and its answer is lost.
    server.lose_next_responses(1);
    let lost = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(1),
        ))
        .await;
    println!("the first call: {}", mcp_http::outcome(&lost));

    // 2. The agent asks again: the guard asks the probe, which finds the deployment.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(2),
        ))
        .await?;
    let answer = mcp_http::messages(response.into_body()).await?;
    println!("the repeat got: {}", mcp_http::answer_text(&answer));
    println!("deployments: {}", server.count());

    if server.count() != 1 || !mcp_http::answer_text(&answer).contains("seen by the status probe") {
        return Err(format!(
            "expected the probe's answer and 1 deployment, saw {} deployments",
            server.count()
        )
        .into());
    }
    Ok(())
}
