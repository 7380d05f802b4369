//! A client's request body, read under a deadline: a client that trickles its body (a
//! `content-length` it never fills, a byte now and then) would otherwise hold its connection,
//! and its place under `--max-connections`, for as long as it keeps trickling.
//!
//! The rule: a body may take `--request-body-timeout` from the end of its head, and longer
//! only as fast as `--request-body-min-rate` covers what it sent (a large body sent at that
//! rate or faster is read whole). Past that the read fails with [`TooSlow`], the proxy answers
//! `408` and closes the connection, and the slow request is logged and counted.

use std::{
    fmt,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use mcp_replay_guard::tools::jsonrpc_error;
use tokio::time::{Instant, Sleep};

use super::{ProxyBody, answers};
use crate::mcp_http::{BoxError, describe};

/// How long a request's body may take, shared by every connection of the proxy, with the
/// count of requests refused for it.
#[derive(Debug)]
pub(super) struct BodyDeadline {
    /// The time any body may take.
    pub(super) timeout: Duration,
    /// Bytes a second a body must average once it takes longer than `timeout`.
    pub(super) min_rate: u64,
    /// Requests refused as too slow since the proxy started.
    refused: AtomicU64,
}

impl BodyDeadline {
    pub(super) fn new(timeout: Duration, min_rate: u64) -> Self {
        Self {
            timeout,
            min_rate: min_rate.max(1),
            refused: AtomicU64::new(0),
        }
    }

    /// How many requests were refused as too slow so far.
    pub(super) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// How long a body that sent `received` bytes may take in all.
    fn allowed(&self, received: u64) -> Duration {
        let at_min_rate = Duration::from_secs_f64(received as f64 / self.min_rate as f64);
        self.timeout.max(at_min_rate)
    }
}

/// The error of a body read past its deadline (see the module docs).
#[derive(Debug)]
pub(super) struct TooSlow {
    received: u64,
    elapsed: Duration,
}

impl fmt::Display for TooSlow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the request body was not sent in time ({} bytes in {:?})",
            self.received, self.elapsed
        )
    }
}

impl std::error::Error for TooSlow {}

/// The proxy's answer to a request whose body was [`TooSlow`]: `408` with a JSON-RPC error
/// (its id is in the body that did not come), and the connection closed, since the rest of
/// the body may still be on its way.
pub(super) fn too_slow(error: &BoxError) -> Response<ProxyBody> {
    let message = format!(
        "replay-guard proxy: {}; nothing was sent",
        describe(&**error)
    );
    let mut response = answers::own(jsonrpc_error(
        StatusCode::REQUEST_TIMEOUT,
        None,
        -32600,
        message,
    ));
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body read under the [`BodyDeadline`], from the end of the request's head.
pub(super) struct RequestBody {
    inner: Incoming,
    deadline: Arc<BodyDeadline>,
    peer: SocketAddr,
    started: Instant,
    received: u64,
    /// Armed while the body waits for the client.
    timer: Option<Pin<Box<Sleep>>>,
    failed: bool,
}

impl RequestBody {
    pub(super) fn new(inner: Incoming, deadline: Arc<BodyDeadline>, peer: SocketAddr) -> Self {
        Self {
            inner,
            deadline,
            peer,
            started: Instant::now(),
            received: 0,
            timer: None,
            failed: false,
        }
    }

    fn due(&self) -> Instant {
        self.started + self.deadline.allowed(self.received)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(Ok(frame)) = &frame {
                    this.received += frame.data_ref().map_or(0, |d| d.len() as u64);
                }
                // The next wait gets the time the bytes so far earned.
                this.timer = None;
                return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
            }
            Poll::Pending => {}
        }
        let due = this.due();
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.failed = true;
        let refused = this.deadline.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let slow = TooSlow {
            received: this.received,
            elapsed: this.started.elapsed(),
        };
        tracing::warn!(
            peer = %this.peer,
            received = slow.received,
            slow_requests = refused,
            "a client sent its request body too slowly; answered 408 and closed"
        );
        Poll::Ready(Some(Err(Box::new(slow))))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
