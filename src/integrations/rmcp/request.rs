//! The requests rmcp describes, built as its reqwest backend builds them, and sent.

use std::collections::HashMap;

use bytes::Bytes;
use http::{
    HeaderName, HeaderValue, Method, Request, Response,
    header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE},
};
use http_body_util::Full;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use tower_service::Service;

use crate::BoxError;

use super::{
    ACCEPT_BOTH, Error, JSON, LAST_EVENT_ID, RESERVED, SESSION_ID, error::TowerClientError,
};

/// Drives `service` to readiness and sends `request`.
pub(super) async fn send<S, RB>(
    mut service: S,
    request: Request<Full<Bytes>>,
) -> Result<Response<RB>, Error>
where
    S: Service<Request<Full<Bytes>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    let client_error = |e: S::Error| StreamableHttpError::Client(TowerClientError::service(e));
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(client_error)?;
    service.call(request).await.map_err(client_error)
}

/// One request as rmcp describes it.
pub(super) struct Outgoing<'a> {
    pub(super) method: Method,
    pub(super) uri: &'a str,
    pub(super) accept: bool,
    pub(super) auth_header: Option<String>,
    pub(super) custom_headers: HashMap<HeaderName, HeaderValue>,
    pub(super) session_id: Option<&'a str>,
    pub(super) last_event_id: Option<&'a str>,
    pub(super) body: Option<Bytes>,
}

impl Outgoing<'_> {
    pub(super) fn build(self) -> Result<Request<Full<Bytes>>, Error> {
        let invalid = |e: http::Error| StreamableHttpError::Client(TowerClientError::request(e));
        if let Some(name) = self
            .custom_headers
            .keys()
            .find(|name| RESERVED.contains(&name.as_str()))
        {
            return Err(StreamableHttpError::ReservedHeaderConflict(
                name.to_string(),
            ));
        }
        let mut request = Request::builder()
            .method(self.method)
            .uri(self.uri)
            .body(Full::new(self.body.clone().unwrap_or_default()))
            .map_err(invalid)?;
        let headers = request.headers_mut();
        if self.accept {
            headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        }
        if let Some(token) = self.auth_header {
            let mut value = header_value(&format!("Bearer {token}"))?;
            value.set_sensitive(true);
            headers.append(AUTHORIZATION, value);
        }
        for (name, value) in self.custom_headers {
            headers.append(name, value);
        }
        if let Some(session_id) = self.session_id {
            headers.insert(SESSION_ID, header_value(session_id)?);
        }
        if let Some(id) = self.last_event_id {
            headers.insert(LAST_EVENT_ID, header_value(id)?);
        }
        if self.body.is_some() && !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(JSON));
        }
        Ok(request)
    }
}

pub(super) fn header_value(value: &str) -> Result<HeaderValue, Error> {
    HeaderValue::from_str(value)
        .map_err(|e| StreamableHttpError::Client(TowerClientError::request(e)))
}
