//! An agent process as `replay-guard proxy`: the command's own proxy code serves the
//! connections of the process's callers (plain HTTP clients on the same host, over simulated
//! loopback TCP) and guards their calls to the target.
//!
//! The callers are what the proxy's clients are: a pooled HTTP/1.1 client that reads an answer
//! and goes on (its next request on the connection, or its close, tells the proxy the answer
//! was read), one that drops an answer unread (its stack resets the connection), and one that
//! half-closes right after its request and reads the answer to the end (its close came before
//! the answer, so it says nothing about reading it).

use std::{
    future::Future,
    pin::Pin,
    rc::Rc,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper_util::client::legacy::Client;
use mcp_replay_guard::{IntentScope, fingerprint::FingerprintKey, guard::GuardLayer};
use replay_guard::proxy::SimulatedProxy;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::world::{Io, LocalExecutor, Shared, connector};

/// Where the proxy of each agent process listens.
pub const PORT: u16 = 8080;
/// The most of an answer a half-closing caller reads.
const MAX_ANSWER: usize = 1 << 20;
/// How long a half-closing caller waits for more of its answer.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// Runs the proxy of agent process `p`, guarded by `layer`, until the host dies.
pub async fn serve(p: usize, layer: GuardLayer, key: FingerprintKey, shared: Arc<Mutex<Shared>>) {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT))
        .await
        .expect("the proxy's port is free");
    let local = listener
        .local_addr()
        .expect("a bound listener has an address");
    let proxy = Rc::new(SimulatedProxy::new(
        local,
        &layer,
        "http://target/mcp".parse().expect("a valid URL"),
        connector(),
        LocalExecutor,
        &key,
        IntentScope::new("run:sim"),
    ));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tracing::debug!("p{p}: the proxy's listener failed");
            continue;
        };
        let (proxy, stream) = (proxy.clone(), Arrivals::new(stream, shared.clone()));
        let (written, shared) = (stream.written.clone(), shared.clone());
        // What the caller's end acknowledged: every byte it read.
        let received_all =
            move || shared.lock().unwrap().read_by_client(peer) >= written.load(Ordering::SeqCst);
        tokio::task::spawn_local(async move { proxy.serve(stream, peer, received_all).await });
    }
}

/// The callers of agent process `p`: plain HTTP clients of its proxy.
#[derive(Clone)]
pub struct ProxyClients {
    host: String,
    shared: Arc<Mutex<Shared>>,
    pooled: Client<ToProxy, Full<Bytes>>,
}

/// On a request, how its caller deviates from a pooled client that reads its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Closes its side of the connection right after the request, reads the answer to the end.
    HalfCloses,
    /// Reads the answer's first bytes and closes the connection with the rest unread (its
    /// stack resets the connection; a pooled client would have read the whole answer off the
    /// socket into its buffer, and a close after that is a clean one).
    DropsUnread,
}

/// What a caller that drops its answer reads of it before it closes the connection.
const READ_OF_UNREAD: usize = 12;

impl ProxyClients {
    pub fn new(p: usize, shared: Arc<Mutex<Shared>>) -> Self {
        let host = format!("p{p}");
        Self {
            pooled: Client::builder(LocalExecutor).build(to_proxy(host.clone(), shared.clone())),
            host,
            shared,
        }
    }

    /// One request on a connection of its own, as `caller` sends it and reads its answer.
    async fn raw(
        host: String,
        shared: Arc<Mutex<Shared>>,
        caller: Caller,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Body>, BoxError> {
        let mut stream = Counted::connect(&host, shared).await?;
        let (parts, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: {host}\r\ncontent-length: {}\r\n",
            parts.method,
            parts.uri.path_and_query().map_or("/", |p| p.as_str()),
            body.len()
        );
        for (name, value) in &parts.headers {
            head.push_str(&format!("{name}: {}\r\n", value.to_str()?));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        if caller == Caller::DropsUnread {
            let mut prefix = [0; READ_OF_UNREAD];
            tokio::time::timeout(READ_TIMEOUT, stream.read(&mut prefix))
                .await
                .map_err(|_| "the connection timed out")??;
            // Dropped with what else came unread.
            return Err("dropped the answer unread".into());
        }
        stream.shutdown().await?;
        let mut answer = BytesMut::new();
        loop {
            let mut chunk = [0; 4096];
            let n = tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk))
                .await
                .map_err(|_| "the half-closed connection timed out")??;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&chunk[..n]);
            if answer.len() > MAX_ANSWER {
                return Err("the answer is too long".into());
            }
        }
        parse_answer(&answer)
    }
}

/// An HTTP/1.1 answer read to the end of its connection: its status and body (whole, or
/// chunked).
fn parse_answer(bytes: &[u8]) -> Result<Response<Body>, BoxError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(at) = response.parse(bytes)? else {
        return Err("the connection ended inside the answer's head".into());
    };
    let status = StatusCode::from_u16(response.code.unwrap_or(502))?;
    let header = |name: &str| {
        response
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
    };
    let rest = &bytes[at..];
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        dechunk(rest)?
    } else if let Some(length) = header("content-length") {
        let length: usize = length.trim().parse()?;
        rest.get(..length)
            .ok_or("the connection ended inside the answer's body")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    let mut answer = Response::new(full(Bytes::from(body)));
    *answer.status_mut() = status;
    Ok(answer)
}

/// A chunked body's data; an error where the connection ended before its last chunk.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, BoxError> {
    let mut body = Vec::new();
    loop {
        let line = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("the connection ended inside a chunk")?;
        let size = std::str::from_utf8(&rest[..line])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)?;
        rest = &rest[line + 2..];
        if size == 0 {
            return Ok(body);
        }
        body.extend_from_slice(
            rest.get(..size)
                .ok_or("the connection ended inside a chunk")?,
        );
        rest = rest
            .get(size + 2..)
            .ok_or("the connection ended inside a chunk")?;
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

type ToProxy = tower::util::BoxCloneSyncService<http::Uri, Io<Counted>, std::io::Error>;

/// Connects to the proxy on `host` (the caller's own host: loopback).
fn to_proxy(host: String, shared: Arc<Mutex<Shared>>) -> ToProxy {
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |_uri: http::Uri| {
        let (host, shared) = (host.clone(), shared.clone());
        Box::pin(async move { Counted::connect(&host, shared).await.map(Io::new) })
    }))
}

/// A caller's end of a proxy connection, counting what it reads (for the proxy's question
/// whether the caller took every byte).
pub struct Counted {
    stream: turmoil::net::TcpStream,
    local: std::net::SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

impl Counted {
    async fn connect(host: &str, shared: Arc<Mutex<Shared>>) -> std::io::Result<Self> {
        let stream = turmoil::net::TcpStream::connect((host, PORT)).await?;
        let local = stream.local_addr()?;
        Ok(Self {
            stream,
            local,
            shared,
        })
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            this.shared.lock().unwrap().client_read(this.local, read);
        }
        polled
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl tower::Service<Request<Full<Bytes>>> for ProxyClients {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Full<Bytes>>) -> Self::Future {
        if let Some(caller) = request.extensions().get::<Caller>().copied() {
            return Box::pin(Self::raw(
                self.host.clone(),
                self.shared.clone(),
                caller,
                request,
            ));
        }
        let pooled = self.pooled.clone();
        Box::pin(async move {
            let response = pooled.request(request).await?;
            Ok(response.map(|body| body.map_err(Into::into).boxed_unsync()))
        })
    }
}

/// A client connection as the proxy reads it, watched by the oracle: when a request's head
/// reaches the proxy, the attempt it carries (its `x-sim-tag`) counts as asked of the guard
/// then, not when its caller asked its own HTTP client (which may queue it behind another
/// request on a pooled connection, where the proxy sees it only after that one's answer).
struct Arrivals {
    stream: turmoil::net::TcpStream,
    shared: Arc<Mutex<Shared>>,
    /// What the proxy wrote on the connection.
    written: Arc<AtomicU64>,
    /// What came since the last complete line (bounded).
    partial: Vec<u8>,
}

/// The header the callers name their attempt with, as their HTTP client writes it.
const TAG_HEADER: &[u8] = b"x-sim-tag: ";
/// The longest line `Arrivals` keeps looking at.
const MAX_LINE: usize = 256;

impl Arrivals {
    fn new(stream: turmoil::net::TcpStream, shared: Arc<Mutex<Shared>>) -> Self {
        Self {
            stream,
            shared,
            written: Arc::default(),
            partial: Vec::new(),
        }
    }

    fn read(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            if byte != b'\n' {
                if self.partial.len() < MAX_LINE {
                    self.partial.push(byte);
                }
                continue;
            }
            if let Some(tag) = self.partial.strip_prefix(TAG_HEADER) {
                let tag = String::from_utf8_lossy(tag).trim().to_owned();
                self.shared.lock().unwrap().arrived(&tag);
            }
            self.partial.clear();
        }
    }
}

impl AsyncRead for Arrivals {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = buf.filled()[before..].to_vec();
            this.read(&new);
        }
        polled
    }
}

impl AsyncWrite for Arrivals {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.written.fetch_add(n as u64, Ordering::SeqCst);
        }
        written
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
