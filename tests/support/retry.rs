//! A generic retry policy of the kind this crate replaces: re-send the same request on any
//! error, a bounded number of times, blind to whether the request left or what it does.

use std::{future::Future, pin::Pin};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

/// Retries every error, up to `.0` more times.
#[derive(Debug, Clone)]
pub struct RetryEveryError(pub usize);

impl<Res, E> tower::retry::Policy<Request<Full<Bytes>>, Res, E> for RetryEveryError {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn retry(
        &mut self,
        _req: &mut Request<Full<Bytes>>,
        result: &mut Result<Res, E>,
    ) -> Option<Self::Future> {
        if result.is_err() && self.0 > 0 {
            self.0 -= 1;
            Some(Box::pin(async {}))
        } else {
            None
        }
    }

    fn clone_request(&mut self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.headers_mut() = req.headers().clone();
        *clone.extensions_mut() = req.extensions().clone();
        Some(clone)
    }
}
