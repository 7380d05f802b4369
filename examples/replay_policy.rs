//! `ReplayPolicy` under `tower::retry`, in place of a generic retry policy, against an rmcp
//! server this example starts on 127.0.0.1.
//!
//! The server loses the answer of the first `deploy_release` after the deployment ran (a cut
//! connection). A generic policy would send the call again and deploy twice. `ReplayPolicy`
//! sees an irreversible tool whose outcome is unknown and hands the error back instead; the
//! agent's own repeat then reaches the guard, which answers from its ledger that the outcome is
//! unknown. One deployment.
//!
//! Run with `cargo run --example replay_policy`.

#[path = "support/deploy_server.rs"]
mod deploy_server;
#[path = "support/mcp_http.rs"]
mod mcp_http;

use std::time::Duration;

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::MemoryLedger,
    replay_policy::{Backoff, ReplayPolicy},
    resume::ResumeLayer,
};
use tower::{ServiceBuilder, ServiceExt, retry::RetryLayer};

use mcp_http::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    // The policy reads the same contracts as the guard, so both agree on what may be re-sent.
    let policy = ReplayPolicy::new(contracts.clone())
        .max_attempts(3)
        .backoff(Backoff::exponential(
            Duration::from_millis(50),
            Duration::from_secs(1),
        ));
    let mut client = ServiceBuilder::new()
        .layer(RetryLayer::new(policy))
        .layer(GuardLayer::new(
            MemoryLedger::new(),
            contracts,
            FingerprintKey::generate()?,
        ))
        .layer(ResumeLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let session = mcp_http::open_session(&mut client, &server.url, "replay-policy-example").await?;

    // 1. The deployment runs and its answer is lost. The policy does not re-send it.
    server.lose_next_responses(1);
    let error = match (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(1),
        ))
        .await
    {
        Ok(response) => {
            return Err(format!("expected a lost answer, got {}", response.status()).into());
        }
        Err(error) => error,
    };
    println!(
        "the call failed: {error}\n  outcome unknown: {}, execution: {}",
        error.is_unknown(),
        error
            .execution_id()
            .map_or_else(|| "none".to_owned(), |id| id.to_string()),
    );
    println!("deployments: {}", server.count());

    // 2. The agent asks again. The guard answers from the ledger: unknown, held for review.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(2),
        ))
        .await?;
    let answer = mcp_http::messages(response.into_body()).await?;
    println!("\nthe repeat got: {}", mcp_http::answer_text(&answer));
    println!("deployments after the repeat: {}", server.count());

    if server.count() != 1 {
        return Err(format!("expected 1 deployment, saw {}", server.count()).into());
    }
    Ok(())
}
