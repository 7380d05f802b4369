//! A bearer-token gate in front of the test server ([`ServerOptions::bearer_token`]), as an
//! OAuth-protected MCP server (RFC 9728) answers: a request without the token gets 401 with
//! `WWW-Authenticate: Bearer resource_metadata="…"`, and the metadata documents are served on
//! their well-known paths to anyone.
//!
//! [`ServerOptions::bearer_token`]: super::ServerOptions::bearer_token

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use tower::Service;

use super::{BoxError, faults::FaultBody};

/// Path of the protected-resource metadata of the `/mcp` endpoint (RFC 9728 §3.1).
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource/mcp";
/// Path of the authorization-server metadata (RFC 8414).
pub const AUTHORIZATION_SERVER_METADATA_PATH: &str = "/.well-known/oauth-authorization-server";
/// The body of the gate's 401.
pub const UNAUTHORIZED_BODY: &str =
    r#"{"error":"invalid_token","error_description":"a bearer token is required"}"#;

/// The gate: `token` required, metadata of `origin` (`http://127.0.0.1:PORT`) served.
#[derive(Clone)]
pub struct BearerGate<S> {
    pub(super) inner: S,
    pub(super) token: Arc<str>,
    pub(super) origin: Arc<str>,
}

impl<S> BearerGate<S> {
    /// The `WWW-Authenticate` value of the gate's 401.
    pub fn challenge(origin: &str) -> String {
        format!(r#"Bearer resource_metadata="{origin}{RESOURCE_METADATA_PATH}""#)
    }

    fn answer(&self, path: &str, authorized: bool) -> Option<Response<FaultBody>> {
        let origin = &*self.origin;
        let json = |status: StatusCode, body: String| {
            let mut response = Response::new(
                Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            );
            *response.status_mut() = status;
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        };
        if path == RESOURCE_METADATA_PATH {
            let document = serde_json::json!({
                "resource": format!("{origin}/mcp"),
                "authorization_servers": [origin],
                "bearer_methods_supported": ["header"],
            });
            return Some(json(StatusCode::OK, document.to_string()));
        }
        if path == AUTHORIZATION_SERVER_METADATA_PATH {
            let document = serde_json::json!({
                "issuer": origin,
                "authorization_endpoint": format!("{origin}/authorize"),
                "token_endpoint": format!("{origin}/token"),
                "response_types_supported": ["code"],
            });
            return Some(json(StatusCode::OK, document.to_string()));
        }
        if authorized {
            return None;
        }
        let mut response = json(StatusCode::UNAUTHORIZED, UNAUTHORIZED_BODY.to_owned());
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_str(&Self::challenge(origin)).expect("a valid header value"),
        );
        Some(response)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> Service<Request<B>> for BearerGate<S>
where
    S: Service<Request<B>, Response = Response<FaultBody>, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<FaultBody>;
    type Error = BoxError;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let expected = format!("Bearer {}", self.token);
        let authorized = request
            .headers()
            .get(header::AUTHORIZATION)
            .is_some_and(|value| value.as_bytes() == expected.as_bytes());
        match self.answer(request.uri().path(), authorized) {
            Some(response) => Box::pin(async move { Ok(response) }),
            None => Box::pin(self.inner.call(request)),
        }
    }
}
