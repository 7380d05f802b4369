//! Server-side Idempotency-Key layer overhead per `tools/call` (1 KiB of arguments, memory
//! ledger), next to the bare service in the same run: an in-process MCP-like service that reads
//! the body and answers `application/json`.
//!
//! - `baseline_bare_service`: the service alone;
//! - `unkeyed_passthrough`: the layer, no `Idempotency-Key` (untouched);
//! - `keyed_first_call`: a new key each call: classify, fingerprint, claim, `key_bound`,
//!   `dispatched`, observe, keep the result, `completed`;
//! - `keyed_replay`: the same key and call again: classify, fingerprint, claim, load the kept
//!   result, answer re-keyed (the inner service is not called).
//!
//! `cargo bench --features server --bench server_idempotency`

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::atomic::{AtomicU64, Ordering},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, header::CONTENT_TYPE};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use mcp_replay_guard::{
    fingerprint::FingerprintKey, integrations::server::IdempotencyLayer, ledger::MemoryLedger,
};
use serde_json::{Map, json};
use tower::{Layer, Service, ServiceExt};

/// A `tools/call` (id 1) with 1 KiB of arguments.
fn call_body() -> Bytes {
    let mut arguments = Map::new();
    for i in 0..16 {
        arguments.insert(
            format!("field_{i:02}"),
            json!({"name": format!("value-{i:04}"), "n": i * 1000 + 7, "flag": i % 2 == 0, "tags": ["a", "b"]}),
        );
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy_release", "arguments": arguments}});
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

const ANSWER: &str =
    r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"deployed"}]}}"#;

/// Reads the body and answers id 1 with a JSON result.
#[derive(Clone, Copy)]
struct Tool;

impl<B> Service<Request<B>> for Tool
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
            request.into_body().collect().await.unwrap();
            let mut response = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, "application/json".parse().unwrap());
            Ok(response)
        })
    }
}

async fn call_and_read<S, RB>(service: &mut S, body: Bytes, key: Option<String>)
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: std::fmt::Debug,
    RB: Body,
    RB::Error: std::fmt::Debug,
{
    let mut request = Request::post("http://127.0.0.1/mcp")
        .header(CONTENT_TYPE, "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let request = request.body(Full::new(body)).unwrap();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    assert!(response.status().is_success());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(bytes.len() > 40);
}

fn server_idempotency(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = call_body();
    // Keys expire at once so that the ledger stays small over millions of first calls.
    let layer = IdempotencyLayer::new(
        MemoryLedger::new(),
        FingerprintKey::from_bytes(&[7; 32]).unwrap(),
    );
    let fresh = layer.clone().retention(Duration::from_millis(1));
    let kept = layer.retention(Duration::from_secs(3600));
    let mut group = c.benchmark_group("server_idempotency_1KiB");

    group.bench_function("baseline_bare_service", |b| {
        b.to_async(&rt)
            .iter(|| async { call_and_read(&mut Tool, body.clone(), None).await });
    });
    group.bench_function("unkeyed_passthrough", |b| {
        let service = fresh.layer(Tool);
        b.to_async(&rt).iter(|| {
            let mut service = service.clone();
            let body = body.clone();
            async move { call_and_read(&mut service, body, None).await }
        });
    });
    group.bench_function("keyed_first_call", |b| {
        let service = fresh.layer(Tool);
        let n = AtomicU64::new(0);
        b.to_async(&rt).iter(|| {
            let mut service = service.clone();
            let body = body.clone();
            let key = format!("k-{}", n.fetch_add(1, Ordering::Relaxed));
            async move { call_and_read(&mut service, body, Some(key)).await }
        });
    });
    group.bench_function("keyed_replay", |b| {
        let service = kept.layer(Tool);
        b.to_async(&rt).iter(|| {
            let mut service = service.clone();
            let body = body.clone();
            async move { call_and_read(&mut service, body, Some("k-replay".into())).await }
        });
    });
    group.finish();
}

criterion_group!(benches, server_idempotency);
criterion_main!(benches);
