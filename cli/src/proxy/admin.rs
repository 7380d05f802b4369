//! The admin listener (`--admin-listen` of `proxy` and `stdio`), apart from the clients':
//! `/healthz` (the process serves), `/readyz` (the ledger answers and takes appends, and each
//! upstream answered recently) and `/metrics` (Prometheus text). Nothing on it is forwarded
//! upstream; the proxy's clients' listener forwards nothing under these paths either
//! ([`is_admin_path`]).

use std::{
    convert::Infallible,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};
use mcp_replay_guard::{ExecutionId, guard::GuardHandle, ledger::Ledger};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{Live, routes::Route};

/// How long a check of the ledger or the upstream may take before it counts as failed.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How recent an answer of the upstream counts as "answered recently"; past it, `/readyz` asks.
const RECENT: Duration = Duration::from_secs(30);

/// The paths the admin listener serves, never forwarded from the clients' listener.
const ADMIN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whether `path` is one of the admin listener's.
pub(super) fn is_admin_path(path: &str) -> bool {
    ADMIN_PATHS.contains(&path.trim_end_matches('/'))
}

/// When the upstream last answered (any HTTP answer), as milliseconds since the epoch.
#[derive(Debug, Default)]
pub(super) struct LastAnswer(AtomicU64);

impl LastAnswer {
    pub(super) fn now(&self) {
        self.0.store(millis_now(), Ordering::Relaxed);
    }

    fn within(&self, window: Duration) -> bool {
        let last = self.0.load(Ordering::Relaxed);
        last != 0 && millis_now().saturating_sub(last) <= window.as_millis() as u64
    }
}

fn millis_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What `/readyz` checks and `/metrics` renders.
pub(crate) struct Readiness {
    pub(crate) ledger: Arc<dyn Ledger>,
    /// The file ledger's path: it must still take appends.
    pub(crate) ledger_file: Option<PathBuf>,
    /// The proxy's routes now: each one's upstream must have answered.
    pub(crate) live: Option<Arc<std::sync::RwLock<Arc<Live>>>>,
    /// The metrics recorder's handle, and the guard whose held executions are counted before
    /// each scrape.
    pub(crate) metrics: (PrometheusHandle, GuardHandle),
}

impl Readiness {
    /// What the admin listener of a guard over `layer` checks and renders: its ledger (the
    /// file `ledger` names must take appends), the proxy's routes when `live` is given, and
    /// `metrics` with the held gauge read from the ledger.
    pub(crate) fn of(
        layer: &mcp_replay_guard::guard::GuardLayer,
        ledger: Option<&crate::ledger_location::LedgerLocation>,
        live: Option<Arc<std::sync::RwLock<Arc<Live>>>>,
        metrics: PrometheusHandle,
    ) -> Arc<Self> {
        Arc::new(Self {
            ledger: layer.ledger().clone(),
            ledger_file: ledger
                .and_then(|ledger| ledger.file())
                .map(std::path::Path::to_path_buf),
            live,
            metrics: (metrics, layer.handle()),
        })
    }

    /// What is not ready, each a sentence; empty when all is.
    async fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let read = tokio::time::timeout(CHECK_TIMEOUT, self.ledger.get(ExecutionId::new())).await;
        match read {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => problems.push(format!("the ledger does not answer: {error}")),
            Err(_) => problems.push("the ledger did not answer within 2 s".to_owned()),
        }
        if let Some(path) = &self.ledger_file
            && let Err(error) = std::fs::OpenOptions::new().append(true).open(path)
        {
            problems.push(format!(
                "the ledger file cannot be opened for appending: {}",
                error.kind()
            ));
        }
        let Some(live) = &self.live else {
            return problems;
        };
        let live = live
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for route in live.routes.iter() {
            if !route.last_answer.within(RECENT) && !ask_upstream(route).await {
                problems.push(format!(
                    "the upstream of route {} has not answered recently, and did not answer now",
                    route.prefix()
                ));
            }
        }
        problems
    }

    /// The metrics as Prometheus text, the held gauge read from the ledger first.
    async fn metrics(&self) -> Result<String, String> {
        let (handle, guard) = &self.metrics;
        match tokio::time::timeout(CHECK_TIMEOUT, guard.record_held()).await {
            Ok(Ok(_)) => Ok(handle.render()),
            Ok(Err(error)) => Err(format!("the ledger does not answer: {error}")),
            Err(_) => Err("the ledger did not answer within 2 s".to_owned()),
        }
    }
}

/// A HEAD request to the route's upstream endpoint: any HTTP answer counts (a 405 says it is
/// there); nothing of a client's goes with it.
async fn ask_upstream(route: &Route) -> bool {
    let Ok(request) = Request::builder()
        .method(Method::HEAD)
        .uri(route.upstream.clone())
        .body(Full::new(Bytes::new()))
    else {
        return false;
    };
    // The metadata client records the answer as the route's last.
    tokio::time::timeout(CHECK_TIMEOUT, route.metadata.clone().oneshot(request))
        .await
        .is_ok_and(|response| response.is_ok())
}

/// Serves the admin listener until `stopping` is cancelled.
pub(crate) async fn serve(
    listener: TcpListener,
    readiness: Arc<Readiness>,
    stopping: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::debug!(%error, "an admin connection failed while it was accepted");
                    continue;
                }
            },
            () = stopping.cancelled() => return,
        };
        let readiness = readiness.clone();
        let stopping = stopping.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let readiness = readiness.clone();
                async move { Ok::<_, Infallible>(answer(&readiness, request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = stopping.cancelled() => {}
            }
        });
    }
}

async fn answer<B>(readiness: &Readiness, request: Request<B>) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String| {
        Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let problems = readiness.problems().await;
            if problems.is_empty() {
                text(StatusCode::OK, "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready:\n{}\n", problems.join("\n")),
                )
            }
        }
        "/metrics" => match readiness.metrics().await {
            Ok(body) => Response::builder()
                .header(
                    http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )
                .body(Full::new(Bytes::from(body)))
                .expect("a valid response"),
            // A scrape that cannot count what is held fails, rather than report zero.
            Err(problem) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{problem}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not an admin path\n".into()),
    }
}
