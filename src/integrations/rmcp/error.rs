//! [`TowerClientError`], the error of the adapter.

use std::fmt;

use http::StatusCode;

use crate::BoxError;

/// The error of [`TowerHttpClient`](super::TowerHttpClient), carried in
/// [`StreamableHttpError::Client`](rmcp::transport::streamable_http_client::StreamableHttpError::Client)
/// (and, for a failed response stream, in
/// [`SseError::Body`](rmcp::transport::streamable_http_client::SseError::Body)).
#[derive(Debug)]
pub struct TowerClientError {
    kind: ErrorKind,
    source: Option<BoxError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorKind {
    Request,
    Service,
    Body,
    Status(StatusCode),
    EventTooLarge(usize),
}

impl TowerClientError {
    pub(super) fn request(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Request,
            source: Some(source.into()),
        }
    }

    pub(super) fn service(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Service,
            source: Some(source.into()),
        }
    }

    pub(super) fn body(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Body,
            source: Some(source.into()),
        }
    }

    pub(super) fn unexpected_status(status: StatusCode) -> Self {
        Self {
            kind: ErrorKind::Status(status),
            source: None,
        }
    }

    pub(super) fn event_too_large(limit: usize, source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::EventTooLarge(limit),
            source: Some(source.into()),
        }
    }

    /// The request could not be built (an invalid URI, header value or message); nothing
    /// was sent.
    pub fn is_request(&self) -> bool {
        self.kind == ErrorKind::Request
    }

    /// The tower service failed; its error (a
    /// [`GuardError`](crate::guard::GuardError), say) is the [`source`](std::error::Error::source).
    pub fn is_service(&self) -> bool {
        self.kind == ErrorKind::Service
    }

    /// Reading the response body failed.
    pub fn is_body(&self) -> bool {
        self.kind == ErrorKind::Body
    }

    /// A `GET` or `DELETE` was answered with an unexpected status (see [`status`](Self::status)).
    pub fn is_status(&self) -> bool {
        matches!(self.kind, ErrorKind::Status(_))
    }

    /// An SSE event was larger than the transport's `max_sse_event_size`.
    pub fn is_event_too_large(&self) -> bool {
        matches!(self.kind, ErrorKind::EventTooLarge(_))
    }

    /// The unexpected status, for [`is_status`](Self::is_status).
    pub fn status(&self) -> Option<StatusCode> {
        match self.kind {
            ErrorKind::Status(status) => Some(status),
            _ => None,
        }
    }
}

impl fmt::Display for TowerClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Request => f.write_str("could not build the HTTP request; nothing was sent"),
            ErrorKind::Service => f.write_str("the HTTP service failed"),
            ErrorKind::Body => f.write_str("could not read the response body"),
            ErrorKind::Status(status) => write!(f, "unexpected HTTP status {status}"),
            ErrorKind::EventTooLarge(limit) => {
                write!(
                    f,
                    "an SSE event exceeded the {limit}-byte max_sse_event_size"
                )
            }
        }
    }
}

impl std::error::Error for TowerClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
