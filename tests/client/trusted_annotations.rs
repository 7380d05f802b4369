//! Trusted annotations end to end: the guard reads a trusted server's `tools/list` answer as it
//! passes, and an unlisted tool that the list annotates `idempotentHint: true` is then re-sent
//! under its `Idempotency-Key` after a lost response. The same tool from a server the registry
//! does not trust stays irreversible: held for review, never re-sent. rmcp's own Streamable
//! HTTP server on 127.0.0.1; its side-effect counter is the ground truth.

use crate::support;

use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use mcp_replay_guard::{
    Target,
    contract::ContractRegistry,
    execution::{ExecutionState, RetryClass},
    fingerprint::FingerprintKey,
    guard::{Guard, GuardLayer, GuardRequestBody},
    ledger::{Ledger, MemoryLedger},
};
use serde_json::{Value, json};
use support::*;
use tower::{Layer, retry::Retry};

type Inner = Client<HttpConnector, GuardRequestBody>;

const TARGET: &str = "payments.internal.example/mcp";

/// A guard for `TARGET` whose registry declares no contract for `create_payment`, trusting
/// `TARGET`'s annotations or not.
fn guarded(ledger: &MemoryLedger, trusted: bool) -> Guard<Inner> {
    let mut registry = ContractRegistry::builder();
    if trusted {
        registry = registry.trust_server(Target::from(TARGET));
    }
    GuardLayer::new(
        ledger.clone(),
        registry.build().unwrap(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
    .target(Target::from(TARGET))
    .layer(hyper_client_with_body::<GuardRequestBody>())
}

/// `tools/list` through the guard, read to its end; returns `create_payment`'s annotations.
async fn list_tools(
    client: &mut Guard<Inner>,
    server: &TestServer,
    session: Option<&str>,
) -> Value {
    let id = json!(9);
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}});
    let request: Request<Full<bytes::Bytes>> = post(&server.url, session, PROTOCOL_VERSION, body);
    let response = send(client, request).await.expect("tools/list");
    let listed = read_jsonrpc_response(response, &id).await.expect("a list");
    listed["result"]["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == "create_payment"))
        .map(|t| t["annotations"].clone())
        .expect("create_payment is listed")
}

/// A lost response to `create_payment`, retried by a blind retry policy below the caller.
async fn pay_with_a_lost_response(trusted: bool) -> (TestServer, MemoryLedger, Value) {
    let server = TestServer::start().await;
    let session = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let ledger = MemoryLedger::new();
    let mut guard = guarded(&ledger, trusted);
    let annotations = list_tools(&mut guard, &server, session.as_deref()).await;
    assert_eq!(annotations["idempotentHint"], true, "{annotations}");
    server.state.lose_next_response("create_payment");
    let mut client = Retry::new(RetryEveryError(3), guard);
    let response = call_tool(
        &mut client,
        &server.url,
        session.as_deref(),
        2,
        "create_payment",
        json!({"amount": 1200, "currency": "EUR"}),
    )
    .await
    .unwrap_or_else(|e| panic!("tools/call failed: {}", error_chain(&*e)));
    (server, ledger, response)
}

#[tokio::test]
async fn a_trusted_servers_idempotent_annotation_resends_an_unlisted_tool_under_its_key() {
    let (server, ledger, response) = pay_with_a_lost_response(true).await;

    assert_ne!(response["result"]["isError"], true, "{response}");
    let keys = server.state.idempotency_keys("create_payment");
    assert_eq!(keys.len(), 2, "the server saw both sends: {keys:?}");
    assert_eq!(keys[0], keys[1]);
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    let record = &records[0];
    assert_eq!(record.retry_class(), RetryClass::Idempotent);
    assert_eq!(record.attempts(), 2);
    assert_eq!(
        keys[0].as_deref(),
        Some(record.execution_id().to_string().as_str())
    );
}

#[tokio::test]
async fn the_same_annotation_from_an_untrusted_server_is_held_as_irreversible() {
    let (server, ledger, response) = pay_with_a_lost_response(false).await;

    assert_eq!(server.state.side_effects("create_payment"), 1);
    assert_eq!(server.state.tool_call_requests("create_payment").len(), 1);
    assert_eq!(response["result"]["isError"], true, "{response}");
    let records = ledger.list().await.unwrap();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0].retry_class(), RetryClass::Irreversible);
    assert_eq!(records[0].state(), ExecutionState::NeedsReview);
}
