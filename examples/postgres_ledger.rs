//! Two replicas of an agent sharing one `PostgresLedger`, against an rmcp server this example
//! starts on 127.0.0.1.
//!
//! Replica A deploys; the server loses the answer after the deployment ran, and replica A goes
//! away. Replica B, another process in production (here another ledger connection and another
//! guard), makes the same call for the same run: the ledger holds A's execution, whose outcome
//! is unknown, and B's guard answers that instead of deploying again. One deployment, one
//! execution, a chain that verifies.
//!
//! Needs a PostgreSQL database the role may create a schema in:
//! `MCP_REPLAY_GUARD_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --features postgres --example postgres_ledger`.
//! The example works in a schema of its own and drops it at the end.

#[path = "support/deploy_server.rs"]
mod deploy_server;
#[path = "support/mcp_http.rs"]
mod mcp_http;

use std::process::ExitCode;

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::{Ledger, PostgresLedger},
};
use tower::{ServiceBuilder, ServiceExt};

use mcp_http::BoxError;

/// The guard of one replica: every replica of the agent uses the same key, actor and intent
/// scope, so the same call is the same intent whichever replica makes it. The ledger is bound
/// to the key: a replica started with another key is refused.
async fn guard(ledger: PostgresLedger, key: &FingerprintKey) -> Result<GuardLayer, BoxError> {
    ledger.bind_fingerprint_key(key).await?;
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    Ok(GuardLayer::new(ledger, contracts, key.clone())
        .actor(Actor::from("signed-process:com.example.agent"))
        .intent_scope(IntentScope::from("run:5f8097")))
}

async fn run(url: &str) -> Result<(), BoxError> {
    let server = deploy_server::DeployServer::start().await?;
    let schema = format!("replay_guard_example_{}", std::process::id());
    // In production the key comes from a secret store, the same for every replica.
    let key = FingerprintKey::generate()?;

    // Replica A: the deployment runs, its answer is lost.
    let ledger_a = PostgresLedger::connect_with_schema(url, &schema).await?;
    let mut replica_a = ServiceBuilder::new()
        .layer(guard(ledger_a, &key).await?)
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let session = mcp_http::open_session(&mut replica_a, &server.url, "replica-a").await?;
    server.lose_next_responses(1);
    let lost = (&mut replica_a)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(1),
        ))
        .await;
    println!("replica A: {}", mcp_http::outcome(&lost));
    drop(replica_a);

    // Replica B: the same call, through its own connection to the ledger.
    let ledger_b = PostgresLedger::connect_with_schema(url, &schema).await?;
    let mut replica_b = ServiceBuilder::new()
        .layer(guard(ledger_b.clone(), &key).await?)
        .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
    let session = mcp_http::open_session(&mut replica_b, &server.url, "replica-b").await?;
    let response = (&mut replica_b)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(2),
        ))
        .await?;
    let answer = mcp_http::messages(response.into_body()).await?;
    println!("replica B got: {}", mcp_http::answer_text(&answer));

    let executions = ledger_b.list().await?;
    for record in &executions {
        println!("{}", serde_json::to_string_pretty(record)?);
    }
    let report = ledger_b.verify().await?;
    println!("verify: {report}");
    println!("deployments: {}", server.count());

    ledger_b
        .pool()
        .get()
        .await?
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await?;
    if server.count() != 1 || executions.len() != 1 || !report.is_ok() {
        return Err(format!(
            "expected 1 deployment, 1 execution and a chain that verifies; saw {} deployments, {} executions, {report}",
            server.count(),
            executions.len()
        )
        .into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let Ok(url) = std::env::var("MCP_REPLAY_GUARD_POSTGRES_URL") else {
        eprintln!(
            "set MCP_REPLAY_GUARD_POSTGRES_URL to a PostgreSQL database, for example \
             postgres://postgres@127.0.0.1:5432/postgres"
        );
        return ExitCode::from(2);
    };
    match run(&url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("postgres_ledger: {error}");
            ExitCode::FAILURE
        }
    }
}
