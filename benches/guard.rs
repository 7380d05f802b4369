//! Guard overhead per `tools/call` (1 KiB of arguments, memory ledger), each guarded path next
//! to its bare baseline in the same run:
//!
//! - in process: the guard around an in-memory MCP-like service, against that service alone;
//! - over loopback: a hyper client stacked with the guard against a bare hyper client, both
//!   talking to the same HTTP server on 127.0.0.1.
//!
//! Each group also runs a generic `tower::retry` stack (tower's `Retry` with a policy that
//! re-sends on any error, what a hand-rolled retry layer does) over the same bare service:
//! the cost of the layer the guard replaces, next to the guard's.
//!
//! `cargo bench --bench guard`

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::Client,
    rt::{TokioExecutor, TokioIo},
};
use mcp_replay_guard::guard::GuardRequestBody;
use tower::{
    Layer, Service, ServiceExt,
    retry::{Policy, Retry},
};

mod support;
use support::tools_call::{InProcessServer, answer, body, call_and_read, guard_layer, request};

/// The generic retry policy the guard replaces: re-send on any error, up to three times,
/// whatever the error was and whether the request may have run.
#[derive(Clone, Copy)]
struct RetryOnError {
    left: usize,
}

impl<B: Clone, Res, E> Policy<Request<B>, Res, E> for RetryOnError {
    type Future = std::future::Ready<()>;

    fn retry(&mut self, _: &mut Request<B>, result: &mut Result<Res, E>) -> Option<Self::Future> {
        (result.is_err() && self.left > 0).then(|| {
            self.left -= 1;
            std::future::ready(())
        })
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        Some(request.clone())
    }
}

fn generic_retry<S>(service: S) -> Retry<RetryOnError, S> {
    Retry::new(RetryOnError { left: 3 }, service)
}

fn in_process(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let body = body();
    let mut group = c.benchmark_group("guard_in_process_1KiB");
    group.bench_function("baseline_bare_service", |b| {
        b.to_async(&rt).iter(|| async {
            call_and_read(&mut InProcessServer, Full::new(body.clone())).await;
        })
    });
    let retrying = generic_retry(InProcessServer);
    group.bench_function("tower_retry", |b| {
        b.to_async(&rt).iter(|| {
            let mut retrying = retrying.clone();
            let body = body.clone();
            async move { call_and_read(&mut retrying, Full::new(body)).await }
        })
    });
    let guarded = guard_layer().layer(InProcessServer);
    group.bench_function("guarded", |b| {
        b.to_async(&rt).iter(|| {
            let mut guarded = guarded.clone();
            let body = body.clone();
            async move { call_and_read(&mut guarded, Full::new(body)).await }
        })
    });
    group.finish();
}

fn loopback(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let addr = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        |request: Request<hyper::body::Incoming>| async move {
                            let body = request.into_body().collect().await?.to_bytes();
                            Ok::<_, hyper::Error>(answer(body).await)
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    });
    let uri: http::Uri = format!("http://{addr}/mcp").parse().unwrap();
    let body = body();
    let with_uri = |mut request: Request<_>| {
        *request.uri_mut() = uri.clone();
        request
    };

    let mut group = c.benchmark_group("guard_loopback_1KiB");
    let bare: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    group.bench_function("baseline_bare_hyper", |b| {
        b.to_async(&rt).iter(|| {
            let bare = bare.clone();
            let request = with_uri(request(Full::new(body.clone())));
            async move {
                let response = bare.request(request).await.unwrap();
                response.into_body().collect().await.unwrap();
            }
        })
    });
    let retrying = generic_retry(bare.clone());
    group.bench_function("tower_retry_hyper", |b| {
        b.to_async(&rt).iter(|| {
            let mut retrying = retrying.clone();
            let request = with_uri(request(Full::new(body.clone())));
            async move {
                let response = retrying.ready().await.unwrap().call(request).await.unwrap();
                response.into_body().collect().await.unwrap();
            }
        })
    });
    let client: Client<_, GuardRequestBody> = Client::builder(TokioExecutor::new()).build_http();
    let guarded = guard_layer().layer(client);
    group.bench_function("guarded_hyper", |b| {
        b.to_async(&rt).iter(|| {
            let mut guarded = guarded.clone();
            let request = with_uri(request(Full::new(body.clone())));
            async move {
                let response = ServiceExt::<Request<Full<Bytes>>>::ready(&mut guarded)
                    .await
                    .unwrap()
                    .call(request)
                    .await
                    .unwrap();
                response.into_body().collect().await.unwrap();
            }
        })
    });
    group.finish();
}

criterion_group!(benches, in_process, loopback);
criterion_main!(benches);
