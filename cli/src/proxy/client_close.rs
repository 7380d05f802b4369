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
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{Interest, ReadBuf};

use super::ProxyBody;
use crate::mcp_http::BoxError;

/// One client connection's socket, looked at (never read from) for the client's close.
#[derive(Debug)]
pub(super) struct ClientClose {
    /// A second descriptor of the connection's socket: `None` where it could not be made (the
    /// connection is then never seen to close early).
    socket: Option<tokio::net::TcpStream>,
}

impl ClientClose {
    /// The probe of `stream`'s socket. It holds a descriptor of the socket: the connection
    /// keeps the only strong reference, and requests carry a [`ClientLeft`] (weak).
    pub(super) fn of(stream: &tokio::net::TcpStream) -> Arc<Self> {
        match second_descriptor(stream) {
            Ok(socket) => Arc::new(Self {
                socket: Some(socket),
            }),
            Err(error) => {
                tracing::debug!(%error, "cannot watch a client connection for its close");
                Arc::new(Self { socket: None })
            }
        }
    }

    /// Ready once the client closed (FIN) or reset its connection. Bytes the client sent
    /// (a pipelined request) are left where they are, for hyper.
    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(socket) = &self.socket else {
            return Poll::Pending;
        };
        loop {
            let mut byte = [0u8; 1];
            let mut peeked = ReadBuf::new(&mut byte);
            match ready!(socket.poll_peek(cx, &mut peeked)) {
                Ok(0) | Err(_) => return Poll::Ready(()),
                // Bytes wait: not a close. Forget this readiness and wait for the next change
                // (more bytes, or the close, which the reactor keeps until it is seen).
                Ok(_) => {
                    let _ = socket.try_io(Interest::READABLE, || {
                        Err::<(), _>(io::ErrorKind::WouldBlock.into())
                    });
                }
            }
        }
    }
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
        left: false,
    }
    .boxed_unsync()
}

struct UntilClientLeft {
    body: ProxyBody,
    client: ClientLeft,
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
        let left = match self.client.0.upgrade() {
            Some(close) => close.poll_closed(cx).is_ready(),
            None => true,
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
