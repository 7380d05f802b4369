//! `Guard<S>`: the tower service; each call runs as a [`Call`](super::call::Call).

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    BoxError, GuardError, GuardRequestBody, GuardResponseBody, answer, call::Call, config::Config,
    future::ResponseFuture, inflight::Inflight,
};

use crate::{
    ExecutionId, observe,
    protocol::{Era, RequestId},
};

/// The guard middleware; see [`GuardLayer`](super::GuardLayer).
#[derive(Clone)]
pub struct Guard<S> {
    pub(super) inner: S,
    pub(super) config: Arc<Config>,
    pub(super) inflight: Arc<Inflight>,
}

impl<S> Guard<S> {
    crate::define_inner_service_accessors!();

    /// The guard's own answer to a `tools/call` whose every attempt lost its answer, for a
    /// caller that stops asking (the proxy, after the attempts it allows): a `CallToolResult`
    /// with `isError: true`, the execution record as it stands in the ledger, and what asking
    /// again would do, for the caller's request `id` and `era`. Never a second send.
    ///
    /// `None` when the ledger has no such execution.
    pub async fn unanswered(
        &self,
        execution_id: ExecutionId,
        id: &RequestId,
        era: Era,
    ) -> Result<Option<Response<Bytes>>, GuardError> {
        let record = self
            .config
            .ledger
            .get(execution_id)
            .await
            .map_err(GuardError::ledger)?;
        Ok(record.map(|record| {
            let mut response = answer::unanswered(id, era, &record);
            response.extensions_mut().insert(execution_id);
            response
        }))
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Guard<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, RB> Service<Request<B>> for Guard<S>
where
    S: Service<Request<GuardRequestBody>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<GuardResponseBody<RB>>;
    type Error = GuardError;
    type Future = ResponseFuture<RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(GuardError::inner)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Readiness is spent right before each send, not here: the ready service is dropped,
        // which gives back what it reserved below (a `Buffer` or `ConcurrencyLimit` slot), so
        // the body collect, the ledger writes and an attach wait hold no slot. The call polls
        // its own clone ready right before it sends.
        let inner = self.inner.clone();
        drop(std::mem::replace(&mut self.inner, inner.clone()));
        let call = Call {
            inner,
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        };
        ResponseFuture {
            inner: observe::BoxFuture::new(call.run(request)),
        }
    }
}
