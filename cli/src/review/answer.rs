//! Every answer of the review page, and the headers each one carries, whatever its status:
//!
//! - `Content-Security-Policy`: nothing loads but the page's own style sheet (by its hash);
//!   no script runs, even one that got into the page; forms post only to the page itself; no
//!   other site frames it.
//! - `X-Content-Type-Options: nosniff`, `X-Frame-Options: DENY` (for browsers before CSP's
//!   `frame-ancestors`), `Referrer-Policy: no-referrer` (an execution id is not sent on to
//!   anyone), `Cache-Control: no-store` (the ledger changes; a settled page is never served
//!   from a cache, nor kept on disk).

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use maud::Markup;

use super::layout::STYLE_SOURCE;

/// The Content-Security-Policy of every answer.
static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    let policy = format!(
        "default-src 'none'; style-src {}; img-src 'self' data:; form-action 'self'; \
         frame-ancestors 'none'; base-uri 'none'",
        *STYLE_SOURCE
    );
    HeaderValue::from_str(&policy).expect("the policy is ASCII: a hash in base64")
});

/// What the review page answers with.
pub(super) type Answer = Response<Full<Bytes>>;

/// `markup` with `status`.
pub(super) fn html(status: StatusCode, markup: Markup) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(markup.into_string())));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secured(answer)
}

/// `303 See Other` to `location` (a path of the page's own).
pub(super) fn see_other(location: &str) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::new()));
    *answer.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(location) = HeaderValue::from_str(location) {
        answer.headers_mut().insert(header::LOCATION, location);
    }
    secured(answer)
}

/// Plain text with `status`: for a request refused before it reached a page (a foreign
/// `Host`).
pub(super) fn text(status: StatusCode, message: String) -> Answer {
    let mut answer = Response::new(Full::new(Bytes::from(message)));
    *answer.status_mut() = status;
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    secured(answer)
}

/// `answer` with the security headers.
fn secured(mut answer: Answer) -> Answer {
    let headers = answer.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, POLICY.clone());
    for (name, value) in [
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    answer
}
