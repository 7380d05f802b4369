//! The proxy for the simulator: its own code, from the request a connection carries to the
//! answer and its delivery, serving connections the simulation makes, in front of an upstream
//! it reaches over simulated TCP. Only the listener, TLS and signals are left out.

use std::{net::SocketAddr, pin::Pin, sync::Arc};

use http::{HeaderMap, Uri};
use hyper::rt::Executor;
use hyper_util::{client::legacy::connect::Connect, server::graceful::GracefulShutdown};
use mcp_replay_guard::{IntentScope, fingerprint::FingerprintKey, guard::GuardLayer};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    Proxy,
    origins::Origins,
    principals::{Principals, ScopeSource},
    serve,
};

/// One proxy process, as `replay-guard proxy --upstream URL --scope SCOPE` runs it: each
/// client's actor read from the credentials it sends.
pub struct SimulatedProxy {
    proxy: Proxy,
    /// Never shut down: a simulated proxy ends with its host.
    shutdown: GracefulShutdown,
}

impl SimulatedProxy {
    /// The proxy listening on `local`, guarded by `layer`, forwarding to `upstream` over
    /// `connector` (its connection tasks spawned on `executor`); actors are tagged under `key`.
    pub fn new<C, E>(
        local: SocketAddr,
        layer: &GuardLayer,
        upstream: Uri,
        connector: C,
        executor: E,
        key: &FingerprintKey,
        scope: IntentScope,
    ) -> Self
    where
        C: Connect + Clone + Send + Sync + 'static,
        E: Executor<Pin<Box<dyn Future<Output = ()> + Send>>> + Clone + Send + Sync + 'static,
    {
        let principals = Principals::new(None, None, Vec::new(), ScopeSource::Fixed(scope), key);
        let origins = Origins::new(local, "http", &[], &[]);
        let proxy = Proxy::new(
            layer,
            upstream,
            connector,
            executor,
            origins,
            principals,
            HeaderMap::new(),
        );
        Self {
            proxy,
            shutdown: GracefulShutdown::new(),
        }
    }

    /// Serves one client connection from `peer` until it closes; `received_all` says whether
    /// the client's end took every byte written to it so far (what a real socket's
    /// acknowledgements say).
    pub async fn serve<IO>(
        &self,
        io: IO,
        peer: SocketAddr,
        received_all: impl Fn() -> bool + Send + Sync + 'static,
    ) where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let handler = Arc::new(self.proxy.handler());
        let received_all = Arc::new(received_all);
        serve::serve_simulated(io, &*handler, peer, received_all, self.shutdown.watcher()).await;
    }
}
