//! A hyper client stacked with the guard and the resume layer, against an rmcp server this
//! example starts on 127.0.0.1.
//!
//! The agent calls `deploy_release`, then "crashes" before reading the answer (it drops the
//! response body). It starts again and makes the same call: the guard hands back the result the
//! server already produced instead of deploying a second time. Then it deploys again on purpose,
//! after it got the first answer: that is a new execution.
//!
//! Run with `cargo run --example hyper_client`.

#[path = "support/deploy_server.rs"]
mod deploy_server;
#[path = "support/mcp_http.rs"]
mod mcp_http;

use std::time::Duration;

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
    resume::ResumeLayer,
};
use tower::{ServiceBuilder, ServiceExt};

use mcp_http::BoxError;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let ledger = MemoryLedger::new();
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(
            GuardLayer::new(ledger.clone(), contracts, FingerprintKey::generate()?)
                .actor(Actor::from("signed-process:com.example.agent"))
                .intent_scope(IntentScope::from("run:5f8097")),
        )
        .layer(ResumeLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());

    // initialize + initialized pass through the guard untouched.
    let session = mcp_http::open_session(&mut client, &server.url, "hyper-client-example").await?;

    // 1. The agent sends the call and crashes before reading the answer.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(1),
        ))
        .await?;
    drop(response);
    // The guard reads the abandoned stream on in the background and keeps the result.
    for _ in 0..100 {
        if ledger
            .list()
            .await?
            .iter()
            .any(|r| r.result_reference().is_some())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let record = ledger.list().await?.remove(0);
    println!(
        "after the crash:\n{}",
        serde_json::to_string_pretty(&record)?
    );

    // 2. The agent restarts and makes the same call with a new JSON-RPC id.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(7),
        ))
        .await?;
    let answer = mcp_http::messages(response.into_body()).await?;
    println!("\nthe repeat got: {}", serde_json::to_string(&answer)?);
    println!("deployments after the repeat: {}", server.count());
    let after_repeat = server.count();

    // 3. A deliberate second deployment, after the first answer was delivered.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(8),
        ))
        .await?;
    mcp_http::messages(response.into_body()).await?;
    println!(
        "deployments after a deliberate second call: {}",
        server.count()
    );

    if after_repeat != 1 || server.count() != 2 {
        return Err(format!(
            "expected 1 then 2 deployments, saw {after_repeat} then {}",
            server.count()
        )
        .into());
    }
    Ok(())
}
