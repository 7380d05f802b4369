//! What every request of the review page shares, and where each request goes.
//!
//! - `GET /`: the held queue ([`queue`]).
//! - `GET /executions/act_…`: one execution ([`execution`]).
//! - `POST /executions/act_…/resolve`: the resolve form ([`resolve`]).
//!
//! Before any of them, the `Host` must be one the page serves, the proxy's defence against DNS
//! rebinding (`proxy::origins`): a page elsewhere whose name was pointed at 127.0.0.1 never
//! reads the ledger through a browser on this host.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body::Body;
use mcp_replay_guard::{ExecutionId, ledger::Ledger};

use super::{
    answer::{self, Answer},
    execution, layout, queue, resolve,
    token::Token,
};
use crate::{
    ledger_location::{KeyOptions, LedgerLocation},
    mcp_http::BoxError,
    proxy::origins::{Foreign, Origins},
};

/// The review page's state, for the life of the process.
#[derive(Debug)]
pub(super) struct Site {
    /// The ledger, read live: a file opened read-only (each read takes in what other
    /// processes appended), or PostgreSQL.
    pub(super) ledger: Arc<dyn Ledger>,
    /// Where it is, to open it for writing when an execution is resolved.
    pub(super) location: LedgerLocation,
    /// The fingerprint key given for a PostgreSQL ledger, checked as `resolve` checks it.
    pub(super) key: KeyOptions,
    /// The token the resolve form must carry; without one the page is read-only.
    pub(super) token: Option<Token>,
    /// The `Host`s and `Origin`s served.
    pub(super) origins: Origins,
}

impl Site {
    /// Whether the page can resolve (it was given a token).
    pub(super) fn resolving(&self) -> bool {
        self.token.is_some()
    }

    /// The answer to `request`.
    pub(super) async fn answer<B>(&self, request: Request<B>) -> Answer
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        if let Err(foreign) = self.origins.check_host(request.headers(), request.uri()) {
            return answer::text(StatusCode::FORBIDDEN, format!("{}\n", said(&foreign)));
        }
        let path = request.uri().path().to_owned();
        let route = match path.strip_prefix("/executions/") {
            _ if path == "/" => Route::Queue,
            Some(rest) => match rest.strip_suffix("/resolve") {
                Some(id) => Route::Resolve(id.parse().ok()),
                None => Route::Execution(rest.parse().ok()),
            },
            None => Route::Unknown,
        };
        let method = request.method().clone();
        let read = method == Method::GET || method == Method::HEAD;
        match route {
            Route::Queue if read => queue::page(self).await,
            Route::Execution(Some(id)) if read => execution::page(self, id, None).await,
            Route::Resolve(Some(id)) if method == Method::POST => {
                resolve::post(self, id, request).await
            }
            Route::Queue | Route::Execution(Some(_)) | Route::Resolve(Some(_)) => {
                let mut refused = self.problem(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Method not allowed",
                    "This address is read with GET; the resolve form posts to its own address.",
                );
                let allow = match route {
                    Route::Resolve(_) => "POST",
                    _ => "GET, HEAD",
                };
                refused
                    .headers_mut()
                    .insert(header::ALLOW, http::HeaderValue::from_static(allow));
                refused
            }
            Route::Execution(None) | Route::Resolve(None) => self.problem(
                StatusCode::NOT_FOUND,
                "Not an execution",
                "An execution's address ends in its id, `act_…`, as the held queue links it.",
            ),
            Route::Unknown => self.problem(
                StatusCode::NOT_FOUND,
                "Not found",
                "The review page has the held queue at / and a page per execution.",
            ),
        }
    }

    /// A refusal or failure as a page.
    pub(super) fn problem(&self, status: StatusCode, heading: &str, message: &str) -> Answer {
        answer::html(status, layout::problem(heading, message, self.resolving()))
    }

    /// The page for a ledger that did not answer.
    pub(super) fn unreadable(&self, error: &dyn std::fmt::Display) -> Answer {
        self.problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "The ledger did not answer",
            &format!("Reading the ledger {} failed: {error}", self.location),
        )
    }
}

/// What to say of a foreign `Host` or `Origin` (the proxy's own words speak of the proxy).
pub(super) fn said(foreign: &Foreign) -> String {
    match foreign {
        Foreign::Host(host) => {
            format!("the Host {host:?} is not one this page serves (give it with --allowed-host)")
        }
        Foreign::Origin(origin) => format!(
            "the Origin {origin:?} is not one this page serves (give it with --allowed-origin)"
        ),
    }
}

/// Where a request goes; an id that does not parse is `None`.
enum Route {
    Queue,
    Execution(Option<ExecutionId>),
    Resolve(Option<ExecutionId>),
    Unknown,
}
