//! Unit tests of the guard as a tower service: readiness and the inner-service accessors.

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt, limit::ConcurrencyLimit, service_fn};

use super::{Authorization, AuthorizationRequest, Authorize, GuardLayer, GuardRequestBody};
use crate::{
    BoxError,
    contract::{ContractRegistry, ToolContract},
    fingerprint::FingerprintKey,
    ledger::MemoryLedger,
};

fn layer() -> GuardLayer {
    let contracts = ContractRegistry::builder()
        .tool("deploy", ToolContract::irreversible())
        .build()
        .unwrap();
    GuardLayer::new(
        MemoryLedger::new(),
        contracts,
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
}

fn post(body: Value) -> Request<Full<Bytes>> {
    Request::post("http://127.0.0.1:9/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A target answering every request with an empty JSON-RPC result for its id.
async fn target(request: Request<GuardRequestBody>) -> Result<Response<Full<Bytes>>, BoxError> {
    let body = request.into_body().collect().await?.to_bytes();
    let id = serde_json::from_slice::<Value>(&body)?["id"].clone();
    let answer = json!({"jsonrpc": "2.0", "id": id, "result": {"content": [], "isError": false}});
    let mut response = Response::new(Full::new(Bytes::from(answer.to_string())));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// Allows every call, once told to: holds a call in the guard's ledger work.
#[derive(Debug)]
struct Held {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait]
impl Authorize for Held {
    async fn authorize(&self, _: AuthorizationRequest<'_>) -> Authorization {
        self.entered.notify_one();
        self.release.notified().await;
        Authorization::Allow
    }
}

/// The guard polls its inner service ready right before it sends: a `tools/call` held in its
/// ledger work (here: authorization) holds no `ConcurrencyLimit` slot, so another request
/// gets through meanwhile. (Before, the call took the ready inner service with it and held
/// the only slot until its send.)
#[tokio::test]
async fn a_call_in_its_ledger_work_holds_no_slot_of_the_service_below() {
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let guard = layer()
        .authorizer(Held {
            entered: entered.clone(),
            release: release.clone(),
        })
        .layer(ConcurrencyLimit::new(service_fn(target), 1));
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {"version": "1"}}});
    let held = tokio::spawn(guard.clone().oneshot(post(call)));
    entered.notified().await;

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let listed = tokio::time::timeout(Duration::from_secs(5), guard.clone().oneshot(post(list)))
        .await
        .expect("tools/list waited for the slot a held tools/call pinned")
        .unwrap();
    assert!(listed.status().is_success());

    release.notify_one();
    let answered = held.await.unwrap().unwrap();
    let body = answered.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["id"], 1);
}

#[test]
fn the_inner_service_is_reachable_through_the_guard() {
    let mut guard = layer().layer(7_u32);
    assert_eq!(*guard.get_ref(), 7);
    *guard.get_mut() = 8;
    assert_eq!(guard.into_inner(), 8);
}
