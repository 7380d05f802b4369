//! `GuardLayer` + `ResumeLayer` over a hyper-rustls client, against rmcp's own server behind
//! rustls on 127.0.0.1 (tests/support/tls.rs makes the certificates). The server's side-effect
//! counters are the ground truth.

use crate::support;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{Guard, GuardError, GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
    resume::{Resume, ResumeLayer},
};
use serde_json::{Value, json};
use support::*;
use tower::{ServiceBuilder, retry::Retry};

type Guarded = Guard<Resume<Client<HttpsConnector<HttpConnector>, GuardRequestBody>>>;

/// The guard and the resume layer over a hyper-rustls client that trusts `trusted`'s CA only.
fn guarded(ledger: &MemoryLedger, trusted: &TestCerts) -> Guarded {
    let contracts = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        contracts,
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:tls"));
    let client = Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, GuardRequestBody>(trusted.https_connector());
    ServiceBuilder::new()
        .layer(layer)
        .layer(ResumeLayer::new())
        .service(client)
}

fn deploy_args() -> Value {
    json!({"service": "catalog", "version": "2026.07.22"})
}

#[tokio::test]
async fn a_lost_response_over_https_runs_the_tool_once() {
    let certs = TestCerts::generate("lost");
    let server = TestServer::start_tls(ServerOptions::default(), &certs).await;
    assert!(server.url.starts_with("https://"), "{}", server.url);
    let ledger = MemoryLedger::new();
    let mut client = Retry::new(RetryEveryError(3), guarded(&ledger, &certs));
    let session = initialize(&mut client, &server.url).await.unwrap();
    server.state.lose_next_response("deploy_release");

    let response = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "deploy_release",
        deploy_args(),
    )
    .await
    .unwrap_or_else(|e| panic!("the guard answers: {}", error_chain(&*e)));

    assert_eq!(server.state.side_effects("deploy_release"), 1);
    assert_eq!(server.state.tool_call_requests("deploy_release").len(), 1);
    let answer = structured(&response).unwrap_or_else(|| panic!("{response}"));
    assert_eq!(answer["mcp_replay_guard"]["state"], "needs_review");
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].state(), ExecutionState::NeedsReview);
}

/// A certificate the client does not trust (another CA, an expired one, another name): the
/// handshake fails before a byte of the request leaves, and the guard records it `not_sent`.
#[tokio::test]
async fn a_refused_server_certificate_is_recorded_not_sent() {
    let trusted = TestCerts::generate("trusted");
    let cases = [
        ("another CA", TestCerts::generate("other-ca")),
        ("expired", TestCerts::expired("expired")),
        (
            "another name",
            TestCerts::for_names("name", &["example.invalid"]),
        ),
    ];
    for (case, certs) in cases {
        // The client trusts the server's own CA, except in the first case.
        let client_trusts = if case == "another CA" {
            &trusted
        } else {
            &certs
        };
        let server = TestServer::start_tls(ServerOptions::stateless(), &certs).await;
        let ledger = MemoryLedger::new();
        let mut client = guarded(&ledger, client_trusts);
        let error =
            call_tool_stateless(&mut client, &server.url, 1, "deploy_release", deploy_args())
                .await
                .expect_err(case);
        let error = error
            .downcast_ref::<GuardError>()
            .unwrap_or_else(|| panic!("{case}: {}", error_chain(&*error)));
        assert!(error.is_not_sent(), "{case}: {}", error_chain(error));
        assert!(
            error_chain(error).contains("certificate"),
            "{case}: {}",
            error_chain(error)
        );
        let records = ledger.list().await.unwrap();
        assert_eq!(records.len(), 1, "{case}: {records:#?}");
        assert_eq!(records[0].state(), ExecutionState::NotSent, "{case}");
        assert_eq!(server.state.all_requests().len(), 0, "{case}");
        assert_eq!(server.state.side_effects("deploy_release"), 0, "{case}");
    }
}
