//! The response future of [`Resume`](super::Resume).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{ResumeBody, layer::Config, service::GetTemplate};
use crate::{BoxError, protocol::tap::EventTap};

pin_project_lite::pin_project! {
    /// The future of [`Resume`].
    pub struct ResponseFuture<F, S, B> {
        #[pin]
        inner: F,
        get: Option<GetTemplate<S>>,
        config: Config,
        _body: std::marker::PhantomData<fn(B)>,
    }
}

impl<F, S, B> ResponseFuture<F, S, B> {
    pub(super) fn new(inner: F, get: Option<GetTemplate<S>>, config: Config) -> Self {
        Self {
            inner,
            get,
            config,
            _body: std::marker::PhantomData,
        }
    }
}

impl<F, S, B, RB, E> Future for ResponseFuture<F, S, B>
where
    F: Future<Output = Result<Response<RB>, E>>,
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Default + Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<ResumeBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let sse = crate::protocol::is_event_stream(response.headers());
        let get = this
            .get
            .take()
            .filter(|_| sse && response.status().is_success());
        let config = *this.config;
        let Some(get) = get else {
            return Poll::Ready(Ok(response.map(ResumeBody::passthrough)));
        };
        // The events, for a guard above. A tap from below describes the body this one
        // wraps, not this one: it is replaced (no caller can set one, it is crate-private).
        let tap = EventTap::default();
        let mut response = response;
        response.extensions_mut().insert(tap.clone());
        let reconnect = get.into_reconnect();
        Poll::Ready(Ok(
            response.map(|body| ResumeBody::resumable(body, reconnect, config, tap))
        ))
    }
}
