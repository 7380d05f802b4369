//! A small HTTP front in front of a [`TestServer`](super::TestServer): it forwards every
//! request to the real rmcp server (so the side-effect counters stay the ground truth) and
//! changes what the client sees in ways the fault layer cannot: a session DELETE that never
//! answers, an answer padded past a size, a raw request whose response the client resets.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio_util::sync::CancellationToken;

use super::{BoxError, hyper_client, sse::SseReader};

/// What the front changes.
#[derive(Debug, Clone, Default)]
pub struct FrontOptions {
    /// A DELETE (the end of a session) is counted and never answered.
    pub hang_delete: bool,
    /// The JSON-RPC response to a `tools/call` (JSON or SSE) gets a `padding` string of this
    /// many bytes in its `result`.
    pub pad_answer: Option<usize>,
    /// A server that speaks this one revision of the session era and nothing else: it
    /// answers `server/discover` with -32022 naming it in `data.supported`, and refuses an
    /// `initialize` for any other revision the same way (HTTP 400).
    pub only_version: Option<&'static str>,
}

/// A running front; dropping it stops accepting.
pub struct FrontServer {
    /// `http://127.0.0.1:PORT/mcp`
    pub url: String,
    deletes: Arc<AtomicUsize>,
    shutdown: CancellationToken,
}

type FrontBody = UnsyncBoxBody<Bytes, BoxError>;

impl FrontServer {
    /// A front forwarding to `upstream` (an `http://…/mcp` URL).
    pub async fn start(upstream: &str, options: FrontOptions) -> FrontServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let deletes = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let upstream: Arc<str> = upstream.into();
        let (accept_deletes, accept_shutdown) = (deletes.clone(), shutdown.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = accept_shutdown.cancelled() => break,
                    accepted = listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let (upstream, options, deletes) =
                    (upstream.clone(), options.clone(), accept_deletes.clone());
                let service = hyper::service::service_fn(move |request| {
                    forward(request, upstream.clone(), options.clone(), deletes.clone())
                });
                tokio::spawn(async move {
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FrontServer {
            url: format!("http://{addr}/mcp"),
            deletes,
            shutdown,
        }
    }

    /// How many DELETEs arrived.
    pub fn deletes(&self) -> usize {
        self.deletes.load(Ordering::SeqCst)
    }

    /// Polls (every 5 ms, up to `timeout`) until `n` DELETEs arrived; returns the count.
    pub async fn wait_for_deletes(&self, n: usize, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.deletes() < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.deletes()
    }
}

impl Drop for FrontServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn forward(
    request: Request<hyper::body::Incoming>,
    upstream: Arc<str>,
    options: FrontOptions,
    deletes: Arc<AtomicUsize>,
) -> Result<Response<FrontBody>, Infallible> {
    if request.method() == http::Method::DELETE {
        deletes.fetch_add(1, Ordering::SeqCst);
        if options.hang_delete {
            std::future::pending::<()>().await;
        }
    }
    let (mut parts, body) = request.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let is_tool_call = serde_json::from_slice::<serde_json::Value>(&bytes)
        .is_ok_and(|m| m["method"] == "tools/call");
    if let Some(only) = options.only_version
        && let Some(refusal) = refuse_other_versions(only, &bytes)
    {
        return Ok(refusal);
    }
    parts.uri = upstream.parse().expect("the upstream URL parses");
    parts.headers.remove(http::header::HOST);
    let response = match hyper_client()
        .request(Request::from_parts(parts, Full::new(bytes)))
        .await
    {
        Ok(response) => response,
        Err(error) => {
            let mut response = Response::new(
                Full::new(Bytes::from(format!("front: upstream failed: {error}")))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            );
            *response.status_mut() = http::StatusCode::BAD_GATEWAY;
            return Ok(response);
        }
    };
    let is_sse = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let Some(padding) = options.pad_answer.filter(|_| is_tool_call) else {
        return Ok(response.map(|b| b.map_err(Into::into).boxed_unsync()));
    };
    let (mut parts, body) = response.into_parts();
    if !is_sse {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut message: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if let Some(result) = message.get_mut("result").and_then(|r| r.as_object_mut()) {
            result.insert("padding".into(), "x".repeat(padding).into());
        }
        parts.headers.remove(http::header::CONTENT_LENGTH);
        let body = Full::new(Bytes::from(message.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync();
        return Ok(Response::from_parts(parts, body));
    }
    let (sender, receiver) =
        tokio::sync::mpsc::channel::<Result<http_body::Frame<Bytes>, BoxError>>(4);
    tokio::spawn(async move {
        let mut reader = SseReader::new(body);
        while let Ok(Some(event)) = reader.next_event().await {
            let block = match event.json() {
                Some(mut message) if super::sse::is_jsonrpc_response(&message) => {
                    if let Some(result) = message.get_mut("result").and_then(|r| r.as_object_mut())
                    {
                        result.insert("padding".into(), "x".repeat(padding).into());
                    }
                    let id = event.id.map(|id| format!("id: {id}\n")).unwrap_or_default();
                    format!("{id}data: {message}\n\n")
                }
                _ => format!("{}\n\n", event.raw),
            };
            if sender
                .send(Ok(http_body::Frame::data(Bytes::from(block))))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(receiver);
    Ok(Response::from_parts(
        parts,
        StreamBody::new(stream).boxed_unsync(),
    ))
}

/// The answer of a server that speaks only `only` to a discovery or an `initialize` for
/// another revision: HTTP 400, -32022, `data.supported = [only]`.
fn refuse_other_versions(only: &str, body: &[u8]) -> Option<Response<FrontBody>> {
    let message: serde_json::Value = serde_json::from_slice(body).ok()?;
    let refused = match message["method"].as_str()? {
        "server/discover" => true,
        "initialize" => message["params"]["protocolVersion"] != only,
        _ => false,
    };
    if !refused {
        return None;
    }
    let answer = serde_json::json!({
        "jsonrpc": "2.0",
        "id": message["id"],
        "error": {
            "code": -32022,
            "message": "Unsupported protocol version",
            "data": {"supported": [only], "requested": message["params"]["protocolVersion"]},
        },
    });
    let mut response = Response::new(
        Full::new(Bytes::from(answer.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = http::StatusCode::BAD_REQUEST;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Some(response)
}
