//! The guard links a resume GET to a broken stream by target, session and event id.
//! The same event id on another session is another stream: it neither takes nor completes the
//! execution (keyed by the event id alone, it did, and the right GET then found no link).

use crate::support;

use mcp_replay_guard::{
    Actor, IntentScope,
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    guard::{GuardLayer, GuardRequestBody},
    ledger::MemoryLedger,
};
use serde_json::json;
use support::*;
use tower::Layer;

#[tokio::test]
async fn the_same_event_id_on_another_session_does_not_link() {
    let server = TestServer::start_with(ServerOptions {
        event_store: true,
        ..ServerOptions::default()
    })
    .await;
    let session_a = initialize(&mut hyper_client(), &server.url).await.unwrap();
    let session_b = initialize(&mut hyper_client(), &server.url).await.unwrap();
    assert_ne!(session_a, session_b);
    let ledger = MemoryLedger::new();
    let registry = ContractRegistry::builder()
        .tool("deploy_release", ToolContract::irreversible())
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        registry,
        FingerprintKey::from_bytes(&[9; 32]).unwrap(),
    )
    .actor(Actor::from("signed-process:com.example.agent"))
    .intent_scope(IntentScope::from("run:5f8097"));
    let mut client = layer.layer(hyper_client_with_body::<GuardRequestBody>());
    server
        .state
        .faults()
        .schedule("deploy_release", Fault::CutStreamAfterFirstEvent);
    let args = json!({"service": "catalog", "version": "2026.07.22"});
    let request = post(
        &server.url,
        session_a.as_deref(),
        PROTOCOL_VERSION,
        tool_call_body(1, "deploy_release", args),
    );
    let response = send(&mut client, request).await.unwrap();
    assert!(read_jsonrpc_response(response, &json!(1)).await.is_err());
    let cut = wait_for_state(&ledger, ExecutionState::Unknown).await;
    let last_event_id = cut
        .correlation()
        .last_event_id
        .clone()
        .expect("an event id");

    // Session B's GET with A's event id: not A's stream; whatever the server answers, A's
    // execution stays as unknown as it was.
    let other = get_stream(
        &server.url,
        session_b.as_deref(),
        PROTOCOL_VERSION,
        Some(&last_event_id),
    );
    let response = send(&mut client, other).await.unwrap();
    let _ = body_text(response.into_body()).await;
    let record = wait_for_state(&ledger, ExecutionState::Unknown).await;
    assert_eq!(record.state(), ExecutionState::Unknown, "{record:#?}");

    // A's own GET still finds its stream, and the answer completes the execution.
    let own = get_stream(
        &server.url,
        session_a.as_deref(),
        PROTOCOL_VERSION,
        Some(&last_event_id),
    );
    let response = send(&mut client, own).await.unwrap();
    let answer = read_response_to_end(response).await;
    assert_eq!(
        answer["result"]["structuredContent"]["deployment"], 1,
        "{answer}"
    );
    let record = wait_for_state(&ledger, ExecutionState::Completed).await;
    assert_eq!(record.execution_id(), cut.execution_id());
    assert_eq!(server.state.side_effects("deploy_release"), 1);
}
