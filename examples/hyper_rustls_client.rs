//! The guard and the resume layer over a hyper-rustls client, against an rmcp server this
//! example starts behind TLS on 127.0.0.1, with a private CA and a certificate it makes with
//! rcgen.
//!
//! The server loses the response of the first `deploy_release` after the tool ran (a cut
//! connection). The agent asks again: the guard does not send the irreversible call a second
//! time, it answers that the outcome is unknown and names the execution. One deployment.
//!
//! Run with `cargo run --example hyper_rustls_client`.

#[path = "support/deploy_server.rs"]
mod deploy_server;
#[path = "support/mcp_http.rs"]
mod mcp_http;

use std::sync::Arc;

use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody, STRUCTURED_KEY},
    ledger::MemoryLedger,
    resume::ResumeLayer,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    crypto::ring,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tower::{ServiceBuilder, ServiceExt};

use mcp_http::BoxError;

/// A private CA and a server certificate for 127.0.0.1 it signed: the server's config, and
/// the CA a client must trust.
fn certificates() -> Result<(ServerConfig, CertificateDer<'static>), BoxError> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &ca)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let server = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)?;
    Ok((server, ca.der().clone()))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (server_config, ca) = certificates()?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let server = deploy_server::DeployServer::start_tls(acceptor).await?;

    // The client trusts the private CA only (a public server: the platform's roots, e.g.
    // rustls-native-certs or hyper-rustls's `native-tokio` feature).
    let mut roots = RootCertStore::empty();
    roots.add(ca)?;
    let tls = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let https = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()?;
    let mut client = ServiceBuilder::new()
        .layer(
            GuardLayer::new(MemoryLedger::new(), contracts, FingerprintKey::generate()?)
                .actor(Actor::from("signed-process:com.example.agent"))
                .intent_scope(IntentScope::from("run:5f8097")),
        )
        .layer(ResumeLayer::new())
        .service(Client::builder(TokioExecutor::new()).build::<_, GuardRequestBody>(https));

    // initialize + initialized pass through the guard untouched.
    let session = mcp_http::open_session(&mut client, &server.url, "hyper-rustls-example").await?;

    // 1. The tool runs; its response is lost on the way back.
    server.lose_next_responses(1);
    let first = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(1),
        ))
        .await;
    let first = match first {
        Ok(response) => mcp_http::messages(response.into_body()).await.map(|_| ()),
        Err(error) => Err(error.into()),
    };
    println!("the first attempt: {first:?}");

    // 2. The agent asks again: the guard answers from its ledger, without sending.
    let response = (&mut client)
        .oneshot(mcp_http::post(
            &server.url,
            session.as_deref(),
            mcp_http::deploy(2),
        ))
        .await?;
    let answer = mcp_http::messages(response.into_body()).await?;
    let state = answer
        .iter()
        .find_map(|m| m["result"]["structuredContent"][STRUCTURED_KEY]["state"].as_str())
        .unwrap_or("-")
        .to_owned();
    println!("the repeat got: {}", serde_json::to_string(&answer)?);
    println!("deployments: {}", server.count());

    if first.is_ok() || state != "needs_review" || server.count() != 1 {
        return Err(format!(
            "expected a lost first answer, a held repeat and 1 deployment; saw {first:?}, {state}, {}",
            server.count()
        )
        .into());
    }
    Ok(())
}
