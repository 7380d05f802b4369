//! Unit tests of the server half as a tower service: readiness and the inner-service accessors.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tower::{Layer, ServiceExt, limit::ConcurrencyLimit, service_fn};

use super::{IdempotencyLayer, IdempotencyRequestBody};
use crate::{BoxError, IDEMPOTENCY_KEY, fingerprint::FingerprintKey, ledger::MemoryLedger};

type Chunks = StreamBody<ReceiverStream<Result<Frame<Bytes>, BoxError>>>;

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new(
        MemoryLedger::new(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    )
}

/// A POST whose body arrives when the caller sends it on the returned channel.
fn post(
    key: Option<&str>,
) -> (
    Request<Chunks>,
    mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
) {
    let (tx, rx) = mpsc::channel(1);
    let mut request = Request::post("http://127.0.0.1:9/mcp")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(key) = key {
        request = request.header(IDEMPOTENCY_KEY, key);
    }
    let request = request
        .body(StreamBody::new(ReceiverStream::new(rx)))
        .unwrap();
    (request, tx)
}

fn frame(body: Value) -> Result<Frame<Bytes>, BoxError> {
    Ok(Frame::data(Bytes::from(body.to_string())))
}

/// A server answering every request with an empty JSON-RPC result for its id.
async fn server(
    request: Request<IdempotencyRequestBody<Chunks>>,
) -> Result<Response<Full<Bytes>>, BoxError> {
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

/// The layer polls the server ready right before it calls it: a keyed `tools/call` whose body
/// is still arriving holds no `ConcurrencyLimit` slot, so another request is served meanwhile.
/// (Before, the call took the ready server with it and held the only slot.)
#[tokio::test]
async fn a_keyed_call_still_being_read_holds_no_slot_of_the_server_below() {
    let service = layer().layer(ConcurrencyLimit::new(service_fn(server), 1));
    let (keyed, body) = post(Some("k-1"));
    let held = tokio::spawn(service.clone().oneshot(keyed));
    tokio::task::yield_now().await;

    let (list, list_body) = post(None);
    list_body
        .send(frame(
            json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        ))
        .await
        .unwrap();
    drop(list_body);
    let listed = tokio::time::timeout(Duration::from_secs(5), service.clone().oneshot(list))
        .await
        .expect("tools/list waited for the slot a keyed call being read pinned")
        .unwrap();
    assert!(listed.status().is_success());

    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy", "arguments": {}}});
    body.send(frame(call)).await.unwrap();
    drop(body);
    let answered = held.await.unwrap().unwrap();
    let bytes = answered.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap()["id"], 1);
}

#[test]
fn the_inner_service_is_reachable_through_the_layer() {
    let mut service = layer().layer(7_u32);
    assert_eq!(*service.get_ref(), 7);
    *service.get_mut() = 8;
    assert_eq!(service.into_inner(), 8);
}
