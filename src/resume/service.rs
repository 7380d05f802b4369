//! [`Resume`], and the GET it sends to resume a stream.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri, header};
use http_body::Body;
use tower_service::Service;

use super::{ResponseFuture, ResumeBody, layer::Config};
use crate::{
    BoxError,
    protocol::{LAST_EVENT_ID, MCP_METHOD, MCP_NAME, ProtocolVersion},
};

/// The resume middleware; see [`ResumeLayer`](super::ResumeLayer).
#[derive(Debug, Clone)]
pub struct Resume<S> {
    inner: S,
    config: Config,
}

impl<S> Resume<S> {
    pub(super) fn new(inner: S, config: Config) -> Self {
        Self { inner, config }
    }

    crate::define_inner_service_accessors!();
}

pub(super) type GetFuture<RB> =
    Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;
pub(super) type Reconnect<RB> = Box<dyn FnMut(&str) -> GetFuture<RB> + Send>;

impl<S, B, RB> Service<Request<B>> for Resume<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Default + Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResumeBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let resumable = request.method() == Method::POST
            && ProtocolVersion::of_headers(request.headers())
                .is_some_and(ProtocolVersion::supports_resumption);
        let get = resumable.then(|| GetTemplate {
            uri: request.uri().clone(),
            headers: get_headers(request.headers()),
            service: self.inner.clone(),
        });
        ResponseFuture::new(self.inner.call(request), get, self.config)
    }
}

/// Headers of the resume GET: the POST's (session, protocol version, authorization, custom
/// ones) without those that describe the POST body.
fn get_headers(post: &HeaderMap) -> HeaderMap {
    let mut headers = post.clone();
    for name in [
        header::CONTENT_TYPE,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        MCP_METHOD,
        MCP_NAME,
        crate::IDEMPOTENCY_KEY,
    ] {
        headers.remove(name);
    }
    headers.insert(
        header::ACCEPT,
        HeaderValue::from_static(crate::protocol::EVENT_STREAM),
    );
    headers
}

pub(super) struct GetTemplate<S> {
    uri: Uri,
    headers: HeaderMap,
    service: S,
}

impl<S> GetTemplate<S> {
    pub(super) fn into_reconnect<B, RB>(self) -> Reconnect<RB>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Default + Send + 'static,
        RB: Send + 'static,
    {
        Box::new(move |last_event_id| {
            let mut request = Request::new(B::default());
            *request.method_mut() = Method::GET;
            *request.uri_mut() = self.uri.clone();
            *request.headers_mut() = self.headers.clone();
            if let Ok(value) = HeaderValue::from_str(last_event_id) {
                request.headers_mut().insert(LAST_EVENT_ID, value);
            }
            let mut service = self.service.clone();
            Box::pin(async move {
                std::future::poll_fn(|cx| service.poll_ready(cx))
                    .await
                    .map_err(Into::into)?;
                service.call(request).await.map_err(Into::into)
            })
        })
    }
}
