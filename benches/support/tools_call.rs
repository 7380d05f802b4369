//! The 1 KiB `tools/call` the guard and fingerprint benches send, the in-process MCP-like
//! service that answers it, and the guard over a `MemoryLedger` as those benches configure it.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, header::CONTENT_TYPE};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    contract::{ContractRegistry, ToolContract},
    fingerprint::{ActionRecord, Channel, FingerprintKey},
    guard::GuardLayer,
    ledger::MemoryLedger,
};
use serde_json::{Map, Value, json};
use tower::{Service, ServiceExt};

/// A `tools/call` body whose arguments serialise to about 1 KiB (1,148 bytes; 1,242 in all).
pub fn body() -> Bytes {
    let mut arguments = Map::new();
    for i in 0..16 {
        arguments.insert(format!("field_{i:02}"), json!({"name": format!("value-{i:04}"), "n": i * 1000 + 7, "flag": i % 2 == 0, "tags": ["a", "b"]}));
    }
    let arguments = Value::Object(arguments);
    let size = serde_json::to_vec(&arguments).unwrap().len();
    assert!((900..=1200).contains(&size), "arguments are {size} bytes");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy_release", "arguments": arguments}});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

/// The key every bench fingerprints with.
pub fn key() -> FingerprintKey {
    FingerprintKey::from_bytes(&[7; 32]).unwrap()
}

/// The action record of the bench's call, as the guard builds it.
pub fn record(arguments: Map<String, Value>) -> ActionRecord<'static> {
    ActionRecord::new(
        "signed-process:com.example.agent".into(),
        "run:5f8097".into(),
        "deploy_release",
        Channel::mcp("deploy-api.internal.example/mcp".into()),
    )
    .credential_ref("deploy-service".into())
    .argument_map(arguments)
}

pub fn request<B>(body: B) -> Request<B> {
    Request::post("http://127.0.0.1/mcp")
        .header(CONTENT_TYPE, "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .body(body)
        .unwrap()
}

/// Answers a `tools/call` with a JSON result for its id, as a server in JSON-response mode.
pub async fn answer(body: Bytes) -> Response<Full<Bytes>> {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let response = json!({"jsonrpc": "2.0", "id": request["id"], "result": {"content": [{"type": "text", "text": "deployed"}]}});
    let mut response = Response::new(Full::new(Bytes::from(response.to_string())));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, "application/json".parse().unwrap());
    response
}

/// The in-process MCP-like server: reads the body, answers it.
#[derive(Clone, Copy)]
pub struct InProcessServer;

impl<B> Service<Request<B>> for InProcessServer
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        Box::pin(async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            Ok(answer(body).await)
        })
    }
}

pub fn guard_layer() -> GuardLayer {
    // Every call is a new execution that completes and is delivered: the full path
    // (the claim with its dispatched, completed, delivered). Records expire at once so that
    // the ledger stays small over millions of iterations.
    let contract = ToolContract::irreversible()
        .link_window(Duration::ZERO)
        .retention(Duration::from_millis(1));
    let registry = ContractRegistry::builder()
        .tool("deploy_release", contract)
        .build()
        .unwrap();
    GuardLayer::new(MemoryLedger::new(), registry, key())
}

/// Sends the call through `service` and reads the whole answer.
pub async fn call_and_read<S, B, RB>(service: &mut S, body: B)
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: std::fmt::Debug,
    RB: Body,
    RB::Error: std::fmt::Debug,
{
    let response = service
        .ready()
        .await
        .unwrap()
        .call(request(body))
        .await
        .unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.len() > 40);
}
