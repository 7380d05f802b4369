//! Whether a client left its connection while its response waits on the upstream.
//!
//! The proxy serves half-closed clients (see the module docs of `proxy`), so hyper does not
//! read a connection while a response is being written, and a client that leaves a listen
//! stream is noticed only when the upstream next writes on it: until then the proxy's socket
//! sits in CLOSE-WAIT, its upstream connection stays open, and both hold a place under
//! `--max-connections`. A listen stream (no call's answer rides on it) looks at the client's
//! socket itself while it waits, and ends when the client closed or reset it.

use std::{
    io,
    net::TcpStream,
    pin::Pin,
    sync::{Arc, Weak},
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::Interest;

use super::ProxyBody;
use crate::mcp_http::BoxError;

/// One client connection's socket, looked at (never read from) for the client's close.
#[derive(Debug)]
pub(super) struct ClientClose {
    /// A second descriptor of the connection's socket: `None` where it could not be made (the
    /// connection is then never seen to close early).
    socket: Option<Arc<tokio::net::TcpStream>>,
}

/// Resolves once the client closed its connection.
type Closed = Pin<Box<dyn Future<Output = ()> + Send>>;

impl ClientClose {
    /// The probe of `stream`'s socket. It holds a descriptor of the socket: the connection
    /// keeps the only long-lived reference, and requests carry a [`ClientLeft`] (weak).
    pub(super) fn of(stream: &tokio::net::TcpStream) -> Arc<Self> {
        match second_descriptor(stream) {
            Ok(socket) => Arc::new(Self {
                socket: Some(Arc::new(socket)),
            }),
            Err(error) => {
                tracing::debug!(%error, "cannot watch a client connection for its close");
                Arc::new(Self { socket: None })
            }
        }
    }

    /// A connection whose socket is not looked at: it is seen to close only by hyper (a
    /// simulated connection, which has no descriptor).
    pub(super) fn unwatched() -> Arc<Self> {
        Arc::new(Self { socket: None })
    }

    /// Whether the client's end acknowledged every byte the proxy wrote on the connection,
    /// asked when the client closed it cleanly. A client that closes before an answer reached
    /// it (its close crossed the answer on the way) sends a clean close all the same, and
    /// resets only once the answer arrives; by then the proxy read the close. An answer the
    /// client's end acknowledged before its close was read by the client: a close with bytes
    /// unread would have been a reset. Where that cannot be asked (no descriptor, or a system
    /// other than Linux), `true`: the close alone decides, as it did before.
    pub(super) fn received_all(&self) -> bool {
        self.socket
            .as_deref()
            .and_then(unacknowledged)
            .is_none_or(|bytes| bytes == 0)
    }

    /// Resolves once the client closed (FIN) or reset its connection, as the reactor reports
    /// it, also with bytes still unread before the close (a TLS `close_notify`, a pipelined
    /// request): those are left where they are, for hyper.
    fn closed(&self) -> Closed {
        let Some(socket) = self.socket.clone() else {
            return Box::pin(std::future::pending());
        };
        Box::pin(async move {
            loop {
                let Ok(ready) = socket.ready(Interest::READABLE).await else {
                    return;
                };
                if ready.is_read_closed() || ready.is_error() {
                    return;
                }
                // Bytes wait, not a close: forget this readiness and wait for the next change
                // (the close is reported apart, and never forgotten this way).
                let _ = socket.try_io(Interest::READABLE, || {
                    Err::<(), _>(io::ErrorKind::WouldBlock.into())
                });
            }
        })
    }
}

/// How many bytes written on `socket` its peer has not acknowledged yet (Linux's `SIOCOUTQ`:
/// sent or not, not acknowledged), or `None` where that cannot be asked. By hand: no
/// well-kept socket crate exposes this one `ioctl`.
#[cfg(target_os = "linux")]
fn unacknowledged(socket: &tokio::net::TcpStream) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut bytes: nix::libc::c_int = 0;
    // SAFETY: the descriptor is open for as long as `socket` is borrowed, and `TIOCOUTQ`
    // (`SIOCOUTQ` on a TCP socket) writes one `int` to the pointer it is given.
    let status = unsafe { nix::libc::ioctl(socket.as_raw_fd(), nix::libc::TIOCOUTQ, &mut bytes) };
    (status == 0).then(|| u64::try_from(bytes).unwrap_or(0))
}

#[cfg(not(target_os = "linux"))]
fn unacknowledged(_: &tokio::net::TcpStream) -> Option<u64> {
    None
}

/// Another descriptor of `stream`'s socket, registered with the runtime on its own.
#[cfg(unix)]
fn second_descriptor(stream: &tokio::net::TcpStream) -> io::Result<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let socket = TcpStream::from(stream.as_fd().try_clone_to_owned()?);
    tokio::net::TcpStream::from_std(socket)
}

#[cfg(windows)]
fn second_descriptor(stream: &tokio::net::TcpStream) -> io::Result<tokio::net::TcpStream> {
    use std::os::windows::io::AsSocket;
    let socket = TcpStream::from(stream.as_socket().try_clone_to_owned()?);
    tokio::net::TcpStream::from_std(socket)
}

/// A request's handle on its connection's [`ClientClose`] (in the request's extensions).
/// Weak, so that a handle kept anywhere never keeps the client's socket open.
#[derive(Debug, Clone)]
pub(super) struct ClientLeft(Weak<ClientClose>);

impl ClientLeft {
    pub(super) fn new(close: &Arc<ClientClose>) -> Self {
        Self(Arc::downgrade(close))
    }
}

/// `body`, ended once the client left (a listen stream: no answer is lost by ending it).
pub(super) fn until_client_left(body: ProxyBody, client: ClientLeft) -> ProxyBody {
    UntilClientLeft {
        body,
        client,
        closed: None,
        left: false,
    }
    .boxed_unsync()
}

struct UntilClientLeft {
    body: ProxyBody,
    client: ClientLeft,
    /// Made when the stream first waits on the upstream.
    closed: Option<Closed>,
    left: bool,
}

impl Body for UntilClientLeft {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.left {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let this = &mut *self;
        let left = match &mut this.closed {
            Some(closed) => closed.as_mut().poll(cx).is_ready(),
            None => match this.client.0.upgrade() {
                Some(close) => {
                    let closed = this.closed.insert(close.closed());
                    closed.as_mut().poll(cx).is_ready()
                }
                None => true,
            },
        };
        if left {
            self.left = true;
            tracing::debug!(
                "the client left its listen stream; ending it and its upstream exchange"
            );
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.left || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// What a clean close confirms rests on this: bytes the client's end has not taken are
    /// seen as unacknowledged, and once it has taken them all, none are.
    #[tokio::test]
    async fn bytes_the_clients_end_has_not_taken_are_seen() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let close = ClientClose::of(&server);
        assert!(close.received_all(), "nothing written yet");
        // Written until the kernel takes no more: the client reads nothing, so its window
        // closes and what the proxy's end still holds is unacknowledged.
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0;
        loop {
            match server.try_write(&chunk) {
                Ok(n) => written += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) => panic!("{error}"),
            }
        }
        assert!(!close.received_all(), "{written} bytes written, none read");
        let mut read = vec![0u8; written];
        tokio::time::timeout(Duration::from_secs(10), client.read_exact(&mut read))
            .await
            .expect("the client reads every byte in time")
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !close.received_all() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(close.received_all(), "every byte read and acknowledged");
    }
}
