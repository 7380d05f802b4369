//! The review page's listener: HTTP/1.1, a bounded number of connections, a bounded request
//! head read within a timeout (an idle kept-alive connection is closed by the same timeout);
//! the bodies are bounded where they are read (`resolve`). Until SIGTERM or SIGINT, then the
//! requests being answered get a few seconds to end.

use std::{convert::Infallible, io, process::ExitCode, sync::Arc, time::Duration};

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::Semaphore, task::JoinSet};

use super::site::Site;

/// The most connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long a request's head may take (and a kept-alive connection may idle).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head read (hyper's least).
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How long the requests being answered get to end after a signal.
const DRAIN: Duration = Duration::from_secs(5);

/// Serves `site` on `listener` until SIGTERM or SIGINT.
pub(super) async fn serve(listener: TcpListener, site: Arc<Site>) -> io::Result<ExitCode> {
    let stop = stopped()?;
    tokio::pin!(stop);
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = limit.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut stop => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::debug!(%error, "a review connection failed while it was accepted");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let site = site.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request| {
                let site = site.clone();
                async move { Ok::<_, Infallible>(site.answer(request).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "a review connection ended with an error");
            }
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(DRAIN, drained).await;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on the first SIGTERM or SIGINT.
fn stopped() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
