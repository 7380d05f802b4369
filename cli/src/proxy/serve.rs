//! The proxy's listener: accepting client connections (bounded, backing off when accepting
//! fails), serving each over HTTP/1.1 with a header timeout and a body deadline
//! (`request_body`), watching it for the client's close (`client_close`), and the graceful
//! shutdown on SIGTERM or SIGINT.
//!
//! # Shutdown
//!
//! On the first SIGTERM or SIGINT the proxy stops accepting (the listening socket closes),
//! tells every connection to close once its answer is written (an idle one closes at once),
//! and lets the calls in flight finish for up to `--shutdown-timeout`. A listen stream (a GET
//! without `Last-Event-ID`) carries no call: it ends at once, so that a connected client does
//! not hold the shutdown to its deadline. At that deadline the connections still open are cut: a call whose outcome was not seen yet is recorded `unknown`
//! (never left `dispatched`, never a made-up failure), and the proxy exits 0 only once those
//! ledger writes are done. A second signal exits at once, with 128 + the signal's number (130
//! for SIGINT, 143 for SIGTERM); the ledger stays valid (every append is whole or absent) and
//! a call cut that way reads as unknown to every later decision.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    process::ExitCode,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use clap::Args;
use http::Request;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::{GracefulShutdown, Watcher},
};
use mcp_replay_guard::guard::GuardLayer;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{
    Connection, ProxyBody,
    authentication::ClientCertificate,
    client_close::{ClientClose, ClientLeft},
    delivery::{Deliveries, ReceivedAll, Watched},
    request_body::{BodyDeadline, RequestBody},
};
use crate::{
    mcp_http::{BoxError, describe},
    tls,
};

/// How the proxy holds up under many, slow or stuck clients, and how it shuts down.
#[derive(Debug, Args)]
pub(super) struct ServeOptions {
    /// How long a client connection may take to send a request's head, counted from when the
    /// proxy waits for it: a new connection's first request, and the next one on a kept-alive
    /// connection, so a connection idle that long is closed too. An answer that waited on that
    /// connection for the client's next request stays undelivered (kept for a repeat).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = positive_duration)]
    header_timeout: Duration,
    /// How long a client may take to send a request's body, counted from the end of its head;
    /// a body sent at `--request-body-min-rate` or faster gets the time that rate needs for it.
    /// A body not sent in time is answered `408`, its connection closed, and it is logged and
    /// counted.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = positive_duration)]
    request_body_timeout: Duration,
    /// The slowest a request body may arrive, in bytes a second, once it takes longer than
    /// `--request-body-timeout`.
    #[arg(long, default_value_t = DEFAULT_MIN_RATE, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    request_body_min_rate: u64,
    /// The most client connections open at once; at the bound the proxy accepts no more until
    /// one closes (the kernel's backlog holds the rest).
    #[arg(long, default_value_t = 1024, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// After SIGTERM or SIGINT, how long calls in flight may take to finish; what is still in
    /// flight then is recorded `unknown`.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    shutdown_timeout: Duration,
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be longer than 0s".into()),
        Ok(duration) => Ok(duration),
        Err(error) => Err(error.to_string()),
    }
}

/// How long the guard's last ledger writes may take after the drain deadline before the proxy
/// exits anyway.
const FINAL_WRITES_BOUND: Duration = Duration::from_secs(10);

/// Serves `listener` until a signal, then shuts down (see the module docs). `handler` makes
/// the service of one connection from that connection's deliveries.
pub(super) async fn serve<F>(
    listener: TcpListener,
    tls: tls::Listener,
    mut signals: Signals,
    options: &ServeOptions,
    guard: &GuardLayer,
    stopping: CancellationToken,
    handler: F,
) -> ExitCode
where
    F: Fn(Arc<Deliveries>) -> Connection + Send + Sync + 'static,
{
    let handler = Arc::new(handler);
    let limit = Arc::new(Semaphore::new(options.max_connections as usize));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut errors = AcceptErrors::default();
    let header_timeout = options.header_timeout;
    let body_deadline = Arc::new(BodyDeadline::new(
        options.request_body_timeout,
        options.request_body_min_rate,
    ));
    let signal = loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer, permit) = tokio::select! {
            accepted = accept(&listener, &limit, &mut errors) => accepted,
            signal = signals.recv() => break signal,
        };
        let handler = handler.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        let body_deadline = body_deadline.clone();
        connections.spawn(async move {
            let _permit = permit;
            let close = ClientClose::of(&stream);
            // The TLS handshake runs here, bounded: a client that stalls it holds only this task.
            let stream = match tls.accept(stream).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::debug!(%error, "TLS handshake with a client failed");
                    return;
                }
            };
            let received_all: ReceivedAll = {
                let close = close.clone();
                Arc::new(move || close.received_all())
            };
            let certificate = tls::client_identity(&stream).map(ClientCertificate);
            let client = Client {
                peer,
                close,
                header_timeout,
                body_deadline,
                received_all,
                certificate,
            };
            serve_connection(stream, &*handler, watcher, client).await;
        });
    };
    drop(listener);
    stopping.cancel();
    let deadline = Instant::now() + options.shutdown_timeout;
    tracing::info!(
        signal = signal.name(),
        connections = connections.len(),
        slow_requests = body_deadline.refused(),
        "shutting down: no new connections; calls in flight may finish for up to {:?}",
        options.shutdown_timeout
    );
    tokio::spawn(async move {
        let second = signals.recv().await;
        tracing::warn!(
            signal = second.name(),
            "second signal: exiting at once, calls in flight are cut"
        );
        std::process::exit(128 + second.number());
    });
    let deadline = tokio::time::Instant::from_std(deadline);
    if tokio::time::timeout_at(deadline, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            connections = connections.len(),
            "shutdown deadline: cutting the connections still open; their calls in flight are recorded unknown"
        );
        connections.abort_all();
    }
    // Every connection's task has ended, and with it every call it carried: what a cut call
    // records is now the guard's background work.
    while connections.join_next().await.is_some() {}
    let grace = deadline.saturating_duration_since(tokio::time::Instant::now());
    if tokio::time::timeout(grace + FINAL_WRITES_BOUND, guard.handle().shut_down(grace))
        .await
        .is_err()
    {
        tracing::warn!("the ledger's last writes did not finish; exiting without them");
    }
    ExitCode::SUCCESS
}

/// `body`, ended once `stopping` is cancelled (a listen stream, at shutdown).
pub(super) fn until_stopping(body: ProxyBody, stopping: &CancellationToken) -> ProxyBody {
    UntilStopping {
        body,
        stopped: stopping.clone(),
        stopping: Box::pin(stopping.clone().cancelled_owned()),
    }
    .boxed_unsync()
}

struct UntilStopping {
    body: ProxyBody,
    stopped: CancellationToken,
    stopping: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Body for UntilStopping {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.stopping.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.stopped.is_cancelled() || self.body.is_end_stream()
    }
}

/// The next client connection, with its place under the connection bound. Waits for a place
/// before it accepts, so at the bound nothing is accepted (and nothing spins).
async fn accept(
    listener: &TcpListener,
    limit: &Arc<Semaphore>,
    errors: &mut AcceptErrors,
) -> (TcpStream, SocketAddr, OwnedSemaphorePermit) {
    let Ok(permit) = limit.clone().acquire_owned().await else {
        unreachable!("the connection bound is never closed")
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                errors.recovered();
                return (stream, peer, permit);
            }
            Err(error) => tokio::time::sleep(errors.failed(&error)).await,
        }
    }
}

/// One client connection: who it is and how long its requests may take.
struct Client {
    peer: SocketAddr,
    /// Watches the socket for the client's close.
    close: Arc<ClientClose>,
    header_timeout: Duration,
    body_deadline: Arc<BodyDeadline>,
    /// Whether the client's end took every byte written to it.
    received_all: ReceivedAll,
    /// The certificate the client presented in its TLS handshake (`--client-ca`), verified.
    certificate: Option<ClientCertificate>,
}

/// Serves one client connection over HTTP/1.1 until it closes, or the shutdown closes it.
async fn serve_connection<IO, F>(io: IO, handler: &F, shutdown: Watcher, client: Client)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Arc<Deliveries>) -> Connection,
{
    let deliveries = Arc::new(Deliveries::default());
    let io = TokioIo::new(Watched::new(
        io,
        deliveries.clone(),
        client.received_all.clone(),
    ));
    let service = handler(deliveries);
    // Each request's body is read under the body deadline, and knows how to see its client
    // leave.
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request
            .extensions_mut()
            .insert(ClientLeft::new(&client.close));
        if let Some(certificate) = &client.certificate {
            request.extensions_mut().insert(certificate.clone());
        }
        let deadline = client.body_deadline.clone();
        hyper::service::Service::call(
            &service,
            request.map(|body| RequestBody::new(body, deadline, client.peer)),
        )
    });
    let connection = hyper::server::conn::http1::Builder::new()
        // A half-closed client still gets its answer (see the module docs).
        .half_close(true)
        .timer(TokioTimer::new())
        .header_read_timeout(client.header_timeout)
        .serve_connection(io, service);
    if let Err(error) = shutdown.watch(connection).await {
        tracing::debug!(error = %describe(&error), "client connection ended");
    }
}

/// Serves one connection a simulated listener accepted from `peer`, as `serve` serves one:
/// with the flags' default timeouts, no look at its socket (it has none: `received_all` says
/// what the simulated client's end took), and no shutdown.
pub(super) async fn serve_simulated<IO, F>(
    io: IO,
    handler: &F,
    peer: SocketAddr,
    received_all: ReceivedAll,
    shutdown: Watcher,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(Arc<Deliveries>) -> Connection,
{
    let client = Client {
        peer,
        close: ClientClose::unwatched(),
        header_timeout: DEFAULT_TIMEOUT,
        body_deadline: Arc::new(BodyDeadline::new(DEFAULT_TIMEOUT, DEFAULT_MIN_RATE)),
        received_all,
        certificate: None,
    };
    serve_connection(io, handler, shutdown, client).await;
}

/// `--header-timeout` and `--request-body-timeout` by default (their flags say `10s`).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// `--request-body-min-rate` by default.
const DEFAULT_MIN_RATE: u64 = 8192;

/// Accept errors, reported once per spell rather than once per error: a warning when a spell
/// starts, one at most every [`REPEAT_WARNING`] while it lasts, and a summary when it ends.
#[derive(Debug, Default)]
struct AcceptErrors {
    /// Errors in this spell.
    count: u64,
    backoff: Duration,
    last_warning: Option<Instant>,
}

const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const REPEAT_WARNING: Duration = Duration::from_secs(60);

impl AcceptErrors {
    /// An accept failed: how long to wait before accepting again.
    fn failed(&mut self, error: &io::Error) -> Duration {
        if is_one_connection(error) {
            // That client's connection failed, not the listener: take the next one.
            tracing::debug!(%error, "a client connection failed while it was accepted");
            return Duration::ZERO;
        }
        self.count += 1;
        let now = Instant::now();
        if self.count == 1 {
            tracing::warn!(
                %error,
                "cannot accept connections; retrying with a backoff of up to {MAX_BACKOFF:?} (a summary follows when it stops)"
            );
            self.last_warning = Some(now);
        } else if self
            .last_warning
            .is_none_or(|at| now.duration_since(at) >= REPEAT_WARNING)
        {
            tracing::warn!(%error, errors = self.count, "still cannot accept connections");
            self.last_warning = Some(now);
        }
        self.backoff = (self.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
        self.backoff
    }

    /// A connection was accepted: the spell, if there was one, is over.
    fn recovered(&mut self) {
        if self.count > 0 {
            tracing::warn!(
                errors = self.count,
                "accepting connections again: accept errors stopped after {}",
                self.count
            );
            *self = Self::default();
        }
    }
}

/// An accept error that belongs to one client's connection (it was reset or aborted before
/// it was accepted), not to the listener or the process (out of descriptors or memory).
fn is_one_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

/// The signals that shut the proxy down.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Terminate,
    Interrupt,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Self::Terminate => "SIGTERM",
            Self::Interrupt => "SIGINT",
        }
    }

    /// The signal's number, for the exit code of a second signal.
    fn number(self) -> i32 {
        match self {
            Self::Terminate => 15,
            Self::Interrupt => 2,
        }
    }
}

/// SIGTERM and SIGINT, caught from the moment this is made (before the proxy says it listens,
/// so an early signal shuts down instead of killing).
#[derive(Debug)]
pub(super) struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn catch() -> io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn recv(&mut self) -> Stop {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.terminate.recv() => Stop::Terminate,
                _ = self.interrupt.recv() => Stop::Interrupt,
            }
        }
        #[cfg(not(unix))]
        {
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
            Stop::Interrupt
        }
    }
}
