//! `replay-guard proxy`: a Streamable HTTP reverse proxy with the whole guard inside, so that
//! an MCP client in any language gets it without a code change.
//!
//! Every request to the proxy (any path) goes to the upstream MCP endpoint: POSTs, GET streams
//! and resumes (`Last-Event-ID`), DELETEs, with their headers except the hop-by-hop ones.
//! `tools/call` POSTs are guarded: a repeat attaches to its execution instead of running again.
//! Responses stream back as they come; a cut upstream stream is cut for the client too, so the
//! client's own resume (GET + `Last-Event-ID`) comes back through the proxy.
//!
//! # When an answer counts as delivered
//!
//! A proxy cannot know that its client read a byte; it knows what its connection tells it. An
//! answer (JSON or SSE, the same rule) is recorded `delivered` when
//!
//! 1. the whole response, to its last byte and the end of the message, was written to the
//!    client connection (hyper took the end of the body and the connection flushed it), and
//! 2. the client then showed it was done with it: it sent its next request on that connection
//!    (recorded before that request is handled), or closed the connection cleanly (after a
//!    `Connection: close` answer the proxy waits up to 10 s for that clean close).
//!
//! A connection that breaks or is reset first leaves the answer undelivered (a client's TCP
//! stack resets a connection it closes with unread data), so the client's repeat gets the kept
//! result instead of a second execution. An answer on a connection the client keeps open and
//! idle is recorded once the client uses or closes that connection; until then a repeat gets
//! the kept result. The proxy serves HTTP/1.1, where those signals are exact.
//!
//! A client that closes its side of the connection right after its request (a half-close,
//! as `nc -N` does) still gets its answer; but its close came before the answer, so it says
//! nothing about reading it (a client that closed its socket outright looks the same until
//! its stack resets): such an answer is never recorded delivered, and a repeat gets the kept
//! result.

use std::{
    convert::Infallible,
    io,
    net::SocketAddr,
    pin::Pin,
    process::ExitCode,
    sync::{Arc, Mutex},
    task::{Context as TaskContext, Poll, ready},
    time::Duration,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Args;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use mcp_replay_guard::guard::{Delivery, Guard, GuardRequestBody, redact_url};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tower::{ServiceBuilder, ServiceExt};

use crate::{
    mcp_http::{BoxError, describe},
    options::GuardOptions,
};

#[derive(Debug, Args)]
#[command(after_long_help = DELIVERY_HELP)]
pub struct ProxyArgs {
    /// Where to listen (`127.0.0.1:8080`; port 0 picks one and prints it).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The upstream MCP endpoint (`http://host:port/mcp`).
    #[arg(long, value_name = "URL")]
    upstream: String,
    /// How long a repeated call waits for the in-flight execution it attaches to.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    attach_timeout: Duration,
    #[command(flatten)]
    guard: GuardOptions,
}

/// `replay-guard proxy --help`: when an answer counts as delivered (the module docs say more).
const DELIVERY_HELP: &str = "\
When an answer counts as delivered: a proxy cannot know that its client read a byte. An answer \
(JSON or SSE alike) is recorded delivered once the whole response was written to the client \
connection and the client then sent its next request on that connection or closed it cleanly. \
A connection that breaks or is reset first leaves the answer undelivered, so the client's repeat \
gets the kept result instead of running the tool again. Served over HTTP/1.1.";

type Upstream = Guard<Client<HttpConnector, GuardRequestBody>>;
type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

pub async fn run(args: ProxyArgs) -> anyhow::Result<ExitCode> {
    // The upstream URL may carry a credential: only its redacted form is printed.
    let shown_upstream = redact_url(&args.upstream);
    let upstream: Uri = args
        .upstream
        .parse()
        .with_context(|| format!("--upstream {shown_upstream:?} is not a URL"))?;
    let (upstream, had_userinfo) =
        crate::mcp_http::without_userinfo(upstream).context("--upstream")?;
    if had_userinfo {
        eprintln!("warning: {}", crate::mcp_http::USERINFO_NOT_SENT);
    }
    if upstream.scheme_str() != Some("http") || upstream.authority().is_none() {
        bail!("--upstream must be http://host:port/path: this build speaks plain HTTP upstream");
    }
    let contracts = args.guard.contracts(None)?;
    let layer = args.guard.layer(contracts, args.attach_timeout)?;
    let guard: Upstream = ServiceBuilder::new()
        .layer(layer)
        .service(Client::builder(TokioExecutor::new()).build_http());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}: is the port free?", args.listen))?;
    let local = listener.local_addr()?;
    // One line on stdout a script (or a test) can wait for.
    println!("listening on http://{local} -> {shown_upstream}");
    let shutdown = tokio::signal::ctrl_c();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let guard = guard.clone();
        let upstream = upstream.clone();
        let deliveries = Arc::new(Deliveries::default());
        let io = TokioIo::new(Watched {
            inner: stream,
            deliveries: deliveries.clone(),
            confirming: None,
            stash: None,
            shut_down: false,
            linger: None,
            closed_before_answer: false,
        });
        let handler = hyper::service::service_fn(move |request| {
            forward(guard.clone(), upstream.clone(), deliveries.clone(), request)
        });
        tokio::spawn(async move {
            // A half-closed client still gets its answer (see the module docs).
            if let Err(error) = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(io, handler)
                .await
            {
                tracing::debug!(error = %describe(&error), "client connection ended");
            }
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// Forwards one request through the guard to the upstream endpoint.
async fn forward(
    guard: Upstream,
    upstream: Uri,
    deliveries: Arc<Deliveries>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let (mut parts, body) = request.into_parts();
    parts.uri = match upstream_uri(&upstream, parts.uri.query()) {
        Some(uri) => uri,
        None => {
            return Ok(error_response(
                StatusCode::BAD_REQUEST,
                "the query string is not valid",
            ));
        }
    };
    parts.version = http::Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::HOST);
    match guard.oneshot(Request::from_parts(parts, body)).await {
        Ok(response) => {
            let (mut parts, mut body) = response.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let delivery = body.defer_delivery();
            let body = Written {
                inner: body.map_err(Into::into).boxed_unsync(),
                delivery,
                deliveries,
                sent: 0,
                length: None,
            };
            Ok(Response::from_parts(parts, body.boxed_unsync()))
        }
        Err(error) => {
            tracing::warn!(error = %describe(&error), "upstream exchange failed");
            let message = format!("replay-guard proxy: {}", describe(&error));
            Ok(error_response(StatusCode::BAD_GATEWAY, &message))
        }
    }
}

/// The upstream endpoint, with the client's query string if it sent one.
fn upstream_uri(upstream: &Uri, query: Option<&str>) -> Option<Uri> {
    let Some(query) = query else {
        return Some(upstream.clone());
    };
    let mut parts = upstream.clone().into_parts();
    let path = upstream.path();
    parts.path_and_query = Some(format!("{path}?{query}").parse().ok()?);
    Uri::from_parts(parts).ok()
}

/// Removes the headers that belong to one connection (RFC 9110 §7.6.1), including those the
/// `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .filter(|name| !name.is_empty())
        .collect();
    for name in named {
        headers.remove(name.as_str());
    }
    for name in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
}

/// An answer of the proxy's own. Plain text, not a JSON-RPC error: the request's id is not
/// known here, and a JSON-RPC error without it would leave a client waiting for its answer.
fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(message.to_owned()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The deliveries of one client connection, on their way to being recorded (see the module
/// docs): handed to the connection whole, then flushed to it, then confirmed by the client.
#[derive(Debug, Default)]
struct Deliveries {
    state: Mutex<Stages>,
}

#[derive(Debug, Default)]
struct Stages {
    /// The whole response was handed to the connection.
    written: Vec<Delivery>,
    /// ... and the connection flushed it.
    flushed: Vec<Delivery>,
}

impl Deliveries {
    fn stages(&self) -> std::sync::MutexGuard<'_, Stages> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn written(&self, delivery: Delivery) {
        self.stages().written.push(delivery);
    }

    fn flushed(&self) {
        let mut stages = self.stages();
        let written = std::mem::take(&mut stages.written);
        stages.flushed.extend(written);
    }

    fn awaiting_client(&self) -> bool {
        !self.stages().flushed.is_empty()
    }

    /// The client showed it holds the flushed answers: record them.
    fn confirm(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let confirmed = std::mem::take(&mut self.stages().flushed);
        Box::pin(async move {
            for delivery in confirmed {
                if let Err(error) = delivery.record().await {
                    tracing::warn!(execution_id = %delivery.execution_id(), %error, "could not record the delivery");
                }
            }
        })
    }

    /// The connection broke: nothing that waited on it was delivered.
    fn discard(&self) {
        let mut stages = self.stages();
        stages.written.clear();
        stages.flushed.clear();
    }
}

/// A response body on its way to the client: once its last byte was handed to the connection,
/// its delivery waits for the connection's flush.
struct Written {
    inner: ProxyBody,
    delivery: Option<Delivery>,
    deliveries: Arc<Deliveries>,
    sent: u64,
    /// The exact length hyper announced (it stops polling a body at that length).
    length: Option<u64>,
}

impl Written {
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

/// The client connection, watched for what the delivery rule needs: a successful flush, and
/// the client's next bytes (or clean close) after it.
struct Watched<T> {
    inner: T,
    deliveries: Arc<Deliveries>,
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
    /// that close came before them.
    fn client_closed(&mut self) {
        if self.closed_before_answer {
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
