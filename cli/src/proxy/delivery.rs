//! When a proxied answer counts as delivered (the rule is in the `proxy` module docs): the
//! client connection and the response bodies, watched.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context as TaskContext, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use mcp_replay_guard::guard::Delivery;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::ProxyBody;
use crate::mcp_http::BoxError;

/// The deliveries of one client connection, on their way to being recorded: the library's one
/// delivery rule (written whole, flushed, then confirmed by the client's next request or clean
/// close), which every channel uses.
pub(super) use mcp_replay_guard::guard::Deliveries;

/// A response body on its way to the client: once its last byte was handed to the connection,
/// its delivery waits for the connection's flush.
pub(super) struct Written {
    inner: ProxyBody,
    delivery: Option<Delivery>,
    deliveries: Arc<Deliveries>,
    sent: u64,
    /// The exact length hyper announced (it stops polling a body at that length).
    length: Option<u64>,
}

impl Written {
    pub(super) fn new(
        inner: ProxyBody,
        delivery: Option<Delivery>,
        deliveries: Arc<Deliveries>,
    ) -> Self {
        Self {
            inner,
            delivery,
            deliveries,
            sent: 0,
            length: None,
        }
    }

    fn ended(&mut self) {
        if let Some(delivery) = self.delivery.take() {
            self.deliveries.written(delivery);
        }
    }
}

impl Body for Written {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.length.is_none() {
            self.length = self.inner.size_hint().exact();
        }
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            None => self.ended(),
            Some(Ok(frame)) => {
                self.sent += frame.data_ref().map_or(0, |d| d.len() as u64);
                if self.inner.is_end_stream() || self.length == Some(self.sent) {
                    self.ended();
                }
            }
            // A broken answer is not delivered.
            Some(Err(_)) => self.delivery = None,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether the client's end took every byte written to it (it acknowledged them), asked when
/// it closed the connection cleanly: only then does its close confirm what was written.
pub(super) type ReceivedAll = Arc<dyn Fn() -> bool + Send + Sync>;

/// The client connection, watched for what the delivery rule needs: a successful flush, and
/// the client's next bytes (or clean close, once it took every byte) after it.
pub(super) struct Watched<T> {
    inner: T,
    deliveries: Arc<Deliveries>,
    received_all: ReceivedAll,
    /// Deliveries being recorded before the client's next bytes are handed on.
    confirming: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// What the client sent meanwhile (empty: it closed the connection).
    stash: Option<Bytes>,
    /// The proxy closed its side of the connection.
    shut_down: bool,
    /// How long, after closing, the proxy waits for the client's clean close.
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The client closed its side before an answer was flushed: its close confirms nothing.
    closed_before_answer: bool,
}

impl<T> Watched<T> {
    pub(super) fn new(inner: T, deliveries: Arc<Deliveries>, received_all: ReceivedAll) -> Self {
        Self {
            inner,
            deliveries,
            received_all,
            confirming: None,
            stash: None,
            shut_down: false,
            linger: None,
            closed_before_answer: false,
        }
    }
}

impl<T: AsyncRead + Unpin> Watched<T> {
    /// Before a response's bytes go out, looks whether the client already closed its side
    /// (hyper, serving half-closed clients, reads that only after the answer): a close seen
    /// now came before the answer was whole. What it reads (a pipelined request) is kept for
    /// hyper; a wake-up it registers is this connection task's own.
    fn notice_early_close(&mut self, cx: &mut TaskContext<'_>) {
        if self.stash.is_some() || self.closed_before_answer || self.shut_down {
            return;
        }
        let mut scratch = [0u8; 8192];
        let mut read = ReadBuf::new(&mut scratch);
        match Pin::new(&mut self.inner).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => {
                self.closed_before_answer = true;
                self.stash = Some(Bytes::new());
            }
            Poll::Ready(Ok(())) => self.stash = Some(Bytes::copy_from_slice(read.filled())),
            // A reset: whatever is being written is not delivered; hyper sees the error on
            // its next read or write.
            Poll::Ready(Err(_)) => self.closed_before_answer = true,
            Poll::Pending => {}
        }
    }
}

impl<T> Watched<T> {
    /// The client closed the connection after the flushed answers: they are delivered, unless
    /// that close came before them, or crossed them on the way (the client's end did not take
    /// every byte).
    fn client_closed(&mut self) {
        if self.closed_before_answer || !(self.received_all)() {
            self.deliveries.discard();
        } else {
            self.confirming = Some(self.deliveries.confirm());
        }
    }
}

/// The longest wait for a client's clean close after the proxy closed a connection whose last
/// answer waits for it.
const LINGER: Duration = Duration::from_secs(10);

impl<T> Drop for Watched<T> {
    fn drop(&mut self) {
        self.deliveries.discard();
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if let Some(confirming) = self.confirming.as_mut() {
                ready!(confirming.as_mut().poll(cx));
                self.confirming = None;
            }
            if let Some(mut stash) = self.stash.take() {
                let n = stash.len().min(buf.remaining());
                buf.put_slice(&stash.split_to(n));
                if !stash.is_empty() {
                    self.stash = Some(stash);
                }
                return Poll::Ready(Ok(()));
            }
            if !self.deliveries.awaiting_client() {
                let before = buf.filled().len();
                let read = ready!(Pin::new(&mut self.inner).poll_read(cx, buf));
                if read.is_ok() && buf.filled().len() == before && buf.remaining() > 0 {
                    self.closed_before_answer = true;
                }
                return Poll::Ready(read);
            }
            let mut scratch = [0u8; 8192];
            let mut read = ReadBuf::new(&mut scratch);
            match ready!(Pin::new(&mut self.inner).poll_read(cx, &mut read)) {
                Ok(()) if read.filled().is_empty() => {
                    // A clean close: the client is done with what it got.
                    self.stash = Some(Bytes::new());
                    self.client_closed();
                }
                Ok(()) => {
                    // Next bytes: the client is done with what it got.
                    self.stash = Some(Bytes::copy_from_slice(read.filled()));
                    self.confirming = Some(self.deliveries.confirm());
                }
                Err(error) => {
                    self.deliveries.discard();
                    return Poll::Ready(Err(error));
                }
            }
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.notice_early_close(cx);
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.notice_early_close(cx);
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    /// hyper flushes only once everything it buffered was written: what was handed to it
    /// before is now on the connection.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let flushed = ready!(Pin::new(&mut self.inner).poll_flush(cx));
        match &flushed {
            Ok(()) => self.deliveries.flushed(),
            Err(_) => self.deliveries.discard(),
        }
        Poll::Ready(flushed)
    }

    /// After a `Connection: close` answer: close, then wait (bounded) for the client's clean
    /// close, which says it read the answer; a reset says it did not.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.shut_down {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.shut_down = true;
        }
        loop {
            if let Some(confirming) = this.confirming.as_mut() {
                ready!(confirming.as_mut().poll(cx));
                this.confirming = None;
            }
            if !this.deliveries.awaiting_client() {
                return Poll::Ready(Ok(()));
            }
            let mut scratch = [0u8; 1024];
            let mut read = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.client_closed(),
                Poll::Ready(Ok(())) => {} // bytes after the close: not an answer to anything
                Poll::Ready(Err(_)) => {
                    this.deliveries.discard();
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending => {
                    let linger = this
                        .linger
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
                    ready!(linger.as_mut().poll(cx));
                    this.deliveries.discard();
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}
