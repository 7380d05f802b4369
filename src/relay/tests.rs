//! The relay over a wire driven by hand: what the transport's driver sees, and what the
//! client is answered.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use super::*;
use crate::{
    contract::{ContractRegistry, ToolContract},
    execution::ExecutionState,
    fingerprint::FingerprintKey,
    ledger::{Ledger, MemoryLedger},
};

const WAIT: Duration = Duration::from_secs(10);

fn relay() -> (Relay, WireQueue, ClientQueue, MemoryLedger) {
    let ledger = MemoryLedger::new();
    let contracts = ContractRegistry::builder()
        .tool("deploy", ToolContract::irreversible())
        .build()
        .unwrap();
    let layer = GuardLayer::new(
        ledger.clone(),
        contracts,
        FingerprintKey::generate().unwrap(),
    );
    let (relay, wire, client) = Relay::new(&layer);
    (relay, wire, client, ledger)
}

fn line(value: &Value) -> Bytes {
    Bytes::from(value.to_string())
}

async fn next_for_client(client: &mut ClientQueue) -> Value {
    let message = tokio::time::timeout(WAIT, client.next())
        .await
        .expect("an answer for the client in time")
        .expect("the relay is open");
    serde_json::from_slice(message.message()).unwrap()
}

/// The next message the transport's driver is given, in time.
async fn next_on_wire(wire: &mut WireQueue) -> Outgoing {
    tokio::time::timeout(WAIT, wire.next())
        .await
        .expect("a message for the wire in time")
        .expect("the relay is open")
}

/// A client message that the relay puts on the wire: sent on its own task (it returns once
/// written), and written by the driver here.
async fn from_client_written(relay: &Relay, wire: &mut WireQueue, message: Value) {
    let sending = tokio::spawn({
        let relay = relay.clone();
        async move { relay.from_client(line(&message)).await }
    });
    next_on_wire(wire).await.written();
    sending.await.unwrap();
}

/// Found by attacking it: a server need not answer a request the client cancelled
/// (MCP's `notifications/cancelled`), so the guarded call waited for an answer that never
/// came; its execution stayed in flight and every repeat waited for it.
#[tokio::test]
async fn a_cancelled_call_is_unknown_not_left_waiting() {
    let (relay, mut wire, mut client, ledger) = relay();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"v": 1}}});
    relay.from_client(line(&call)).await;
    let written = next_on_wire(&mut wire).await;
    written.written();

    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 1, "reason": "the user stopped it"}});
    let sending = tokio::spawn({
        let relay = relay.clone();
        async move { relay.from_client(line(&cancel)).await }
    });
    let cancel = next_on_wire(&mut wire).await;
    assert_eq!(
        serde_json::from_slice::<Value>(cancel.message()).unwrap()["method"],
        "notifications/cancelled",
        "the cancellation goes to the server untouched"
    );
    cancel.written();
    sending.await.unwrap();

    let answer = next_for_client(&mut client).await;
    assert_eq!(answer["id"], 1, "{answer}");
    let execution = answer["result"]["structuredContent"]["mcp_replay_guard"]["execution_id"]
        .as_str()
        .expect("the guard's own answer, with the execution")
        .parse()
        .unwrap();
    let record = ledger.get(execution).await.unwrap().unwrap();
    assert_eq!(record.state, ExecutionState::Unknown);
}

#[tokio::test]
async fn a_call_written_before_its_server_went_away_is_answered_unknown() {
    let (relay, mut wire, mut client, ledger) = relay();
    let call = json!({"jsonrpc": "2.0", "id": "a", "method": "tools/call",
        "params": {"name": "deploy", "arguments": {}}});
    relay.from_client(line(&call)).await;
    next_on_wire(&mut wire).await.written();
    // Wait until the exchange waits for its answer, then the server goes.
    while !relay.wire.is_waiting(&"a".into()) {
        tokio::task::yield_now().await;
    }
    relay.server_gone();
    let answer = next_for_client(&mut client).await;
    let guard = &answer["result"]["structuredContent"]["mcp_replay_guard"];
    assert_eq!(guard["state"], "unknown", "{answer}");
    let execution = guard["execution_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        ledger.get(execution).await.unwrap().unwrap().state,
        ExecutionState::Unknown
    );
}

/// Found by the simulator, which had to write one request at a time: when the server went
/// away, the calls written and unanswered were failed in the order of a hash map (its keys
/// drawn anew for every table), so their `unknown` writes and answers came in an order that
/// changed from run to run, and a seed was no longer one schedule. They fail in the order they
/// were sent: two runs answer in one order.
#[tokio::test]
async fn calls_written_before_their_server_went_away_fail_in_one_order() {
    async fn answered_after_server_gone(ids: &[String]) -> Vec<String> {
        let (relay, mut wire, mut client, _ledger) = relay();
        for (n, id) in ids.iter().enumerate() {
            let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "deploy", "arguments": {"n": n}}});
            relay.from_client(line(&call)).await;
            next_on_wire(&mut wire).await.written();
            while !relay.wire.is_waiting(&id.as_str().into()) {
                tokio::task::yield_now().await;
            }
        }
        relay.server_gone();
        let mut answered = Vec::new();
        for _ in ids {
            let answer = next_for_client(&mut client).await;
            answered.push(answer["id"].as_str().unwrap().to_owned());
        }
        answered
    }
    let ids: Vec<String> = (0..16).map(|n| format!("call-{n}")).collect();
    let first = answered_after_server_gone(&ids).await;
    let mut every = first.clone();
    every.sort();
    let mut sent = ids.clone();
    sent.sort();
    assert_eq!(every, sent, "each call answered once");
    assert_eq!(answered_after_server_gone(&ids).await, first);
}

#[tokio::test]
async fn a_call_the_transport_never_wrote_is_not_sent_and_says_so() {
    let (relay, wire, mut client, ledger) = relay();
    drop(wire);
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {}}});
    relay.from_client(line(&call)).await;
    let answer = next_for_client(&mut client).await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("not sent"), "{answer}");
    let executions = ledger.list().await.unwrap();
    assert_eq!(executions.len(), 1);
    assert_eq!(executions[0].state, ExecutionState::NotSent);
}

/// A `tools/call` without an id (or with `"id": null`) is no request: passed on as a
/// notification, a lenient server would run it unrecorded. Refused unsent with -32600: the
/// first thing the wire carries is the notification sent after the two calls.
#[tokio::test]
async fn a_tools_call_without_an_id_is_refused_unsent() {
    let (relay, mut wire, mut client, ledger) = relay();
    let sending = tokio::spawn({
        let relay = relay.clone();
        async move {
            for id in [Some(Value::Null), None] {
                let mut call = json!({"jsonrpc": "2.0", "method": "tools/call",
                    "params": {"name": "deploy", "arguments": {}}});
                if let Some(id) = id {
                    call["id"] = id;
                }
                relay.from_client(line(&call)).await;
            }
            let after = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            relay.from_client(line(&after)).await;
        }
    });
    let written = next_on_wire(&mut wire).await;
    let first = serde_json::from_slice::<Value>(written.message()).unwrap();
    written.written();
    assert_eq!(first["method"], "notifications/initialized", "{first}");
    sending.await.unwrap();
    for _ in 0..2 {
        let answer = next_for_client(&mut client).await;
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
        assert!(answer["id"].is_null(), "{answer}");
    }
    assert!(ledger.list().await.unwrap().is_empty());
}

/// A call written to the wire, then cancelled by the client: the cancellation is on the wire.
async fn call_then_cancel(relay: &Relay, wire: &mut WireQueue, id: i64) {
    let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"v": id}}});
    relay.from_client(line(&call)).await;
    next_on_wire(wire).await.written();
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": id}});
    from_client_written(relay, wire, cancel).await;
}

fn server_answer(id: i64) -> Bytes {
    line(&json!({"jsonrpc": "2.0", "id": id,
        "result": {"content": [{"type": "text", "text": "deployed"}]}}))
}

/// After a cancellation, the server's answer (a server that did not stop the tool) settles the
/// call, and it is the client's one answer for the id.
#[tokio::test]
async fn the_servers_answer_after_a_cancel_settles_the_call_and_is_the_one_answer() {
    let (relay, mut wire, mut client, ledger) = relay();
    call_then_cancel(&relay, &mut wire, 1).await;
    relay.from_server(server_answer(1)).await;
    let answer = next_for_client(&mut client).await;
    assert_eq!(
        answer["result"]["content"][0]["text"], "deployed",
        "{answer}"
    );
    // Nothing else for id 1: the next message is the one pushed after.
    relay
        .refuse(Some(&RequestId::from(99)), "the next message")
        .await;
    let next = next_for_client(&mut client).await;
    assert_eq!(next["id"], 99, "a second answer for id 1: {next}");
    let records = ledger.list().await.unwrap();
    assert_eq!(records[0].state, ExecutionState::Completed, "{records:?}");
}

/// A cancelled call whose answer comes only after its wait ended: the client got the guard's
/// answer for the id when the wait ended, and the late answer is not handed on as a second.
#[tokio::test]
async fn an_answer_after_the_cancelled_wait_ended_is_not_a_second_answer() {
    let (relay, mut wire, mut client, _ledger) = relay();
    call_then_cancel(&relay, &mut wire, 1).await;
    let answer = next_for_client(&mut client).await;
    assert_eq!(answer["id"], 1, "{answer}");
    assert!(
        answer["result"]["structuredContent"]["mcp_replay_guard"]["execution_id"].is_string(),
        "the guard's answer once the wait ended: {answer}"
    );
    relay.from_server(server_answer(1)).await;
    relay
        .refuse(Some(&RequestId::from(99)), "the next message")
        .await;
    let next = next_for_client(&mut client).await;
    assert_eq!(next["id"], 99, "a second answer for id 1: {next}");
}

/// Every answer written to the client is delivered only once the client's next message
/// proves it read on; an answer with no message after it stays undelivered (kept).
#[tokio::test]
async fn an_answer_is_delivered_only_when_the_clients_next_message_comes() {
    let (relay, mut wire, mut client, ledger) = relay();
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"v": 1}}});
    relay.from_client(line(&call)).await;
    next_on_wire(&mut wire).await.written();
    relay.from_server(server_answer(1)).await;
    let answer = tokio::time::timeout(WAIT, client.next())
        .await
        .unwrap()
        .unwrap();
    answer.written();
    let records = ledger.list().await.unwrap();
    assert_eq!(records[0].state, ExecutionState::Completed);
    assert_eq!(records[0].delivered_at, None, "written is not delivered");

    let ping = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": 1, "progress": 1}});
    from_client_written(&relay, &mut wire, ping).await;
    let records = ledger.list().await.unwrap();
    assert!(records[0].delivered_at.is_some(), "{records:?}");
}
