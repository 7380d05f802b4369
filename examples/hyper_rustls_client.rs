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

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
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
use serde_json::{Value, json};
use tower::{ServiceBuilder, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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

fn post(url: &str, session: Option<&str>, body: Value) -> Request<Full<Bytes>> {
    let mut request = Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    request
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid request")
}

/// The JSON-RPC messages of a response body (JSON or SSE), read to its end.
async fn messages<B>(body: B) -> Result<Vec<Value>, BoxError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    let text = String::from_utf8_lossy(&bytes);
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim);
    Ok(std::iter::once(text.trim())
        .chain(data)
        .filter_map(|s| serde_json::from_str(s).ok())
        .collect())
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

    let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "hyper-rustls-example", "version": "0"}}});
    let response = (&mut client)
        .oneshot(post(&server.url, None, initialize))
        .await?;
    let session = response
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    messages(response.into_body()).await?;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), initialized))
        .await?;
    messages(response.into_body()).await?;

    let deploy = |id: i64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "deploy_release", "arguments": {"service": "catalog", "version": "2026.07.22"}}})
    };

    // 1. The tool runs; its response is lost on the way back.
    server.lose_next_responses(1);
    let first = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), deploy(1)))
        .await;
    let first = match first {
        Ok(response) => messages(response.into_body()).await.map(|_| ()),
        Err(error) => Err(error.into()),
    };
    println!("the first attempt: {first:?}");

    // 2. The agent asks again: the guard answers from its ledger, without sending.
    let response = (&mut client)
        .oneshot(post(&server.url, session.as_deref(), deploy(2)))
        .await?;
    let answer = messages(response.into_body()).await?;
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
