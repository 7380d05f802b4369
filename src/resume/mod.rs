//! `ResumeLayer`: recovers a broken SSE response stream with GET + `Last-Event-ID` instead of
//! letting the break turn into a re-POST.
//!
//! For servers of the 2025-03-26 … 2025-11-25 revisions a disconnect is not a cancellation: the
//! server keeps running the tool and can replay the stream from the last event the client saw.
//! When a POST's SSE stream breaks (an error, or an end before any JSON-RPC response) and an
//! event id was seen, the layer waits the server's `retry:` (capped) or a backoff, sends
//! `GET` with `Last-Event-ID`, `Mcp-Session-Id` and `MCP-Protocol-Version`, and splices the
//! resumed events into the same response body: the caller sees one stream. Events whose id was
//! already delivered are dropped (a server may replay the event named by `Last-Event-ID`).
//!
//! It never re-POSTs. When resumption is refused (404: the session is gone; 405: the server
//! offers no GET stream), fails, or runs out of attempts, the original break reaches the caller,
//! and a [`GuardLayer`](crate::guard::GuardLayer) above records the outcome as unknown. In the
//! 2026-07-28 revision there is no resumption and the layer passes everything through.
//!
//! ```no_run
//! use std::time::Duration;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{guard::GuardRequestBody, resume::ResumeLayer};
//! use tower::ServiceBuilder;
//!
//! let client = ServiceBuilder::new()
//!     .layer(ResumeLayer::new().max_attempts(3).max_delay(Duration::from_secs(2)))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//! # let _ = client;
//! ```

mod body;
mod future;
mod layer;
mod service;

pub use body::{ResumeBody, ResumeFailed};
pub use future::ResponseFuture;
pub use layer::ResumeLayer;
pub use service::Resume;

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use bytes::Bytes;
    use http::{Method, Request, Response, header::CONTENT_TYPE};
    use http_body::Frame;
    use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
    use tower::{Layer, ServiceExt};

    use super::ResumeLayer;
    use crate::BoxError;

    type TestBody = UnsyncBoxBody<Bytes, std::io::Error>;

    fn body(chunks: Vec<Result<&'static str, ()>>) -> TestBody {
        let frames = chunks.into_iter().map(|c| {
            c.map(|s| Frame::data(Bytes::from_static(s.as_bytes())))
                .map_err(|()| std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        });
        UnsyncBoxBody::new(StreamBody::new(tokio_stream::iter(frames)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_mixed_case_event_stream_is_resumed_like_any_other() {
        // The layer once took only a lowercase `text/event-stream` for SSE: this answer
        // passed through, and its break reached the caller unresumed.
        let gets = Arc::new(AtomicUsize::new(0));
        let seen = gets.clone();
        let target = tower::service_fn(move |request: Request<String>| {
            let seen = seen.clone();
            async move {
                let body = if request.method() == Method::GET {
                    seen.fetch_add(1, Ordering::SeqCst);
                    body(vec![Ok(
                        "id: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
                    )])
                } else {
                    body(vec![
                        Ok("id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\n"),
                        Err(()),
                    ])
                };
                let response = Response::builder()
                    .header(CONTENT_TYPE, "Text/Event-Stream; charset=utf-8")
                    .body(body)
                    .unwrap();
                Ok::<_, BoxError>(response)
            }
        });
        let service = ResumeLayer::new().layer(target);
        let request = Request::post("http://127.0.0.1/mcp")
            .header("mcp-protocol-version", "2025-11-25")
            .body(String::new())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let text = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(gets.load(Ordering::SeqCst), 1, "one resume GET");
        assert!(String::from_utf8_lossy(&text).contains("\"result\""));
    }
    #[test]
    fn the_inner_service_is_reachable_through_the_layer() {
        let mut service = ResumeLayer::new().layer(7_u32);
        assert_eq!(*service.get_ref(), 7);
        *service.get_mut() = 8;
        assert_eq!(service.into_inner(), 8);
    }
}
