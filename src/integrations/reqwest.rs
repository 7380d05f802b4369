//! reqwest-middleware: carry the execution's `Idempotency-Key` to the HTTP APIs a tool calls,
//! and retry without ever re-sending blindly.
//!
//! The guard gives each `tools/call` an execution ID and sends it as `Idempotency-Key`. The
//! tool on the other side, or a gateway that performs the action, calls an HTTP API with
//! reqwest; these two middlewares carry the guarantee one hop further:
//!
//! - [`IdempotencyKeyMiddleware`] attaches the current execution's key to every outbound
//!   request that may change something (all methods but GET, HEAD, OPTIONS and TRACE). The key
//!   comes from the request's extensions ([`IdempotencyKey`] or [`ExecutionId`], set with
//!   [`RequestBuilder::with_extension`](reqwest_middleware::RequestBuilder::with_extension)) or
//!   from the task-local set by [`with_execution`]. A key the request already has is never
//!   replaced.
//! - [`ReplaySafeRetryMiddleware`] replaces reqwest-retry's `RetryTransientMiddleware`, which
//!   re-sends a POST after a reset or a timeout. It re-sends only what cannot repeat a side
//!   effect, and marks an error whose outcome is unknown and that it would not re-send as an
//!   [`AmbiguousOutcome`] (see [`is_ambiguous`]).
//!
//! Attach the key middleware **before** the retry middleware, so that the retry middleware sees
//! the key and every re-send carries it:
//!
//! ```no_run
//! use mcp_replay_guard::{
//!     ExecutionId,
//!     integrations::reqwest::{
//!         IdempotencyKeyMiddleware, ReplaySafeRetryMiddleware, is_ambiguous, with_execution,
//!     },
//! };
//! use reqwest_middleware::ClientBuilder;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = ClientBuilder::new(reqwest::Client::new())
//!     .with(IdempotencyKeyMiddleware::new())
//!     .with(ReplaySafeRetryMiddleware::new().max_attempts(3))
//!     .build();
//!
//! // In the tool: the key arrived on the incoming `tools/call` as `Idempotency-Key`.
//! let execution = ExecutionId::new();
//! let charged = with_execution(execution, async {
//!     client
//!         .post("http://payments.internal.example/charges")
//!         .body(r#"{"amount": 500, "currency": "EUR"}"#)
//!         .send()
//!         .await
//! })
//! .await;
//! match charged {
//!     Ok(response) => println!("charged: {}", response.status()),
//!     Err(error) if is_ambiguous(&error) => println!("may have been charged: {error}"),
//!     Err(error) => println!("not charged: {error}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # One key, one action
//!
//! A server that honours `Idempotency-Key` answers a second request under the same key with the
//! first one's result (or 422 when the payload differs). A tool that makes several changing
//! calls to one API within one execution must give each its own key, for instance
//! `with_extension(IdempotencyKey::new(format!("{execution}:refund"))?)`; otherwise the second
//! call is answered with the first one's result.

use std::{error::Error as StdError, fmt, future::Future};

use http::{Extensions, Method, StatusCode};
use reqwest::{Request, Response, Url};
use reqwest_middleware::{Middleware, Next};

use crate::{
    ExecutionId, IDEMPOTENCY_KEY, IdempotencyKey, IdempotencyKeyFormat,
    replay_policy::{Backoff, Outcome, is_idempotent_method},
};

tokio::task_local! {
    static CURRENT_EXECUTION: IdempotencyKey;
}

/// Runs `f` with `key` as the current execution's key: every request that
/// [`IdempotencyKeyMiddleware`] sees while `f` runs (on this task) carries it, unless the request
/// names a key of its own.
///
/// The key is task-local: a task spawned inside `f` does not inherit it (wrap that task's
/// future in `with_execution` too).
pub async fn with_execution<F: Future>(key: impl Into<IdempotencyKey>, f: F) -> F::Output {
    CURRENT_EXECUTION.scope(key.into(), f).await
}

/// The key set by the innermost [`with_execution`] around the current task, if any.
pub fn current_execution() -> Option<IdempotencyKey> {
    CURRENT_EXECUTION.try_with(IdempotencyKey::clone).ok()
}

/// Attaches the current execution's `Idempotency-Key` to outbound requests.
///
/// The key is, in order: the header the request already has (never replaced), an
/// [`IdempotencyKey`] in the request's extensions, an [`ExecutionId`] in them, the key of the
/// enclosing [`with_execution`]. Requests with a safe method (GET, HEAD, OPTIONS, TRACE) change
/// nothing and get no key. A request without any key is sent as it is.
///
/// ```
/// use mcp_replay_guard::{IdempotencyKeyFormat, integrations::reqwest::IdempotencyKeyMiddleware};
///
/// let middleware =
///     IdempotencyKeyMiddleware::new().idempotency_key_format(IdempotencyKeyFormat::StructuredField);
/// # let _ = middleware;
/// ```
#[derive(Clone, Debug, Default)]
pub struct IdempotencyKeyMiddleware {
    format: IdempotencyKeyFormat,
}

impl IdempotencyKeyMiddleware {
    /// A middleware that spells the key raw (`Idempotency-Key: act_01J…`).
    pub fn new() -> Self {
        Self::default()
    }

    /// How the header is spelled: raw, or the IETF draft's structured-field string.
    pub fn idempotency_key_format(mut self, format: IdempotencyKeyFormat) -> Self {
        self.format = format;
        self
    }

    fn key_for(&self, request: &Request, extensions: &Extensions) -> Option<IdempotencyKey> {
        if is_safe_method(request.method()) || request.headers().contains_key(IDEMPOTENCY_KEY) {
            return None;
        }
        extensions
            .get::<IdempotencyKey>()
            .cloned()
            .or_else(|| extensions.get::<ExecutionId>().map(|&id| id.into()))
            .or_else(current_execution)
    }
}

#[async_trait::async_trait]
impl Middleware for IdempotencyKeyMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if let Some(key) = self.key_for(&request, extensions) {
            tracing::debug!(idempotency_key = %key, "attached Idempotency-Key");
            request
                .headers_mut()
                .insert(IDEMPOTENCY_KEY, key.to_header_value(self.format));
        }
        next.run(request, extensions).await
    }
}

/// A retry middleware that re-sends a request only when that cannot repeat a side effect.
///
/// # When a call is re-sent
///
/// At most [`max_attempts`](Self::max_attempts) attempts in all, with
/// [`backoff`](Self::backoff) between them, and only for a request whose body can be cloned
/// (a streaming body is sent once):
///
/// | the attempt ended in | re-sent when |
/// |---|---|
/// | a connect error (reqwest's `is_connect()`, a refused connection): nothing was sent | always |
/// | another error (reset, timeout, body cut short): the outcome is unknown | the method is idempotent (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) or the request carries an `Idempotency-Key` |
/// | a 5xx or 429 response | the same condition |
///
/// Otherwise the result is returned as it is, except an error whose outcome is unknown on a
/// request that may not be re-sent: that one is wrapped in an [`AmbiguousOutcome`], so the caller
/// can tell "failed" from "may have happened" with [`is_ambiguous`]. A 5xx answer to such a
/// request is returned untouched: it is an answer from the server, which knows what it did.
#[derive(Clone, Debug)]
pub struct ReplaySafeRetryMiddleware {
    max_attempts: u32,
    backoff: Backoff,
}

impl Default for ReplaySafeRetryMiddleware {
    fn default() -> Self {
        Self {
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
        }
    }
}

impl ReplaySafeRetryMiddleware {
    /// Default bound on attempts, the first one included.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// [`DEFAULT_MAX_ATTEMPTS`](Self::DEFAULT_MAX_ATTEMPTS) attempts with
    /// [`Backoff::default`].
    pub fn new() -> Self {
        Self::default()
    }

    /// The most attempts of one request, the first one included (`1` never re-sends; `0` counts
    /// as `1`).
    pub fn max_attempts(mut self, max: u32) -> Self {
        self.max_attempts = max.max(1);
        self
    }

    /// The wait before each re-send.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

#[async_trait::async_trait]
impl Middleware for ReplaySafeRetryMiddleware {
    async fn handle(
        &self,
        mut request: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let method = request.method().clone();
        let url = request.url().clone();
        let replay_safe =
            is_idempotent_method(&method) || request.headers().contains_key(IDEMPOTENCY_KEY);
        let mut attempt = 1;
        loop {
            // The copy for the next attempt, made before this one consumes the request.
            let spare = (attempt < self.max_attempts)
                .then(|| request.try_clone())
                .flatten();
            let result = next.clone().run(request, extensions).await;
            let resend = match &result {
                Ok(response) => {
                    let status = response.status();
                    replay_safe
                        && (status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS)
                }
                Err(error) => outcome_of(error) == Outcome::NotSent || replay_safe,
            };
            match spare {
                Some(spare) if resend => {
                    let delay = self.backoff.delay(attempt);
                    match &result {
                        Ok(response) => tracing::info!(
                            %method, attempt, status = %response.status(), ?delay, "re-sending"
                        ),
                        Err(error) => {
                            let error = without_credentials(error, &url);
                            tracing::info!(%method, attempt, %error, ?delay, "re-sending")
                        }
                    }
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    request = spare;
                    attempt += 1;
                }
                _ => {
                    return result
                        .map_err(|error| AmbiguousOutcome::mark(error, &method, url, replay_safe));
                }
            }
        }
    }
}

/// What an error of the middleware stack says about whether the request left the process.
fn outcome_of(error: &reqwest_middleware::Error) -> Outcome {
    match error {
        reqwest_middleware::Error::Reqwest(e) => Outcome::of(e),
        reqwest_middleware::Error::Middleware(e) => Outcome::of(&**e),
    }
}

fn is_safe_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// A request may have been applied, and re-sending it could apply it twice, so it was not
/// re-sent: the method is not idempotent and the request carries no `Idempotency-Key`.
///
/// [`ReplaySafeRetryMiddleware`] returns it inside
/// [`reqwest_middleware::Error::Middleware`]; find it with [`AmbiguousOutcome::find`] or
/// [`is_ambiguous`]. The transport's own error is its [`source`](StdError::source) and
/// [`get_ref`](Self::get_ref).
#[derive(Debug)]
pub struct AmbiguousOutcome {
    method: Method,
    url: Url,
    source: reqwest_middleware::Error,
}

impl AmbiguousOutcome {
    /// Wraps `error` when it leaves the outcome unknown on a request that was not re-sent.
    fn mark(
        error: reqwest_middleware::Error,
        method: &Method,
        url: Url,
        replay_safe: bool,
    ) -> reqwest_middleware::Error {
        if replay_safe || outcome_of(&error) == Outcome::NotSent || is_ambiguous(&error) {
            return error;
        }
        tracing::warn!(method = %method, error = %without_credentials(&error, &url), "outcome unknown; not re-sent");
        // reqwest's error prints its URL, credentials and query included: this error names
        // the URL itself (without them), so its source does not.
        let source = match error {
            reqwest_middleware::Error::Reqwest(error) => {
                reqwest_middleware::Error::Reqwest(error.without_url())
            }
            other => other,
        };
        reqwest_middleware::Error::middleware(Self {
            method: method.clone(),
            url,
            source,
        })
    }

    /// The ambiguous outcome inside an error of the middleware stack, if it is one.
    pub fn find(error: &reqwest_middleware::Error) -> Option<&Self> {
        match error {
            reqwest_middleware::Error::Middleware(e) => {
                e.chain().find_map(|e| e.downcast_ref::<Self>())
            }
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// The request's method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// The request's URL (query included: strip it before logging if it can carry secrets).
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The error the attempt ended with.
    pub fn get_ref(&self) -> &reqwest_middleware::Error {
        &self.source
    }

    /// The error the attempt ended with, by value.
    pub fn into_inner(self) -> reqwest_middleware::Error {
        self.source
    }
}

/// `error` as text with `url` in its redacted form (reqwest prints the URL whole, userinfo and
/// query included).
fn without_credentials(error: &reqwest_middleware::Error, url: &Url) -> String {
    error.to_string().replace(
        url.as_str(),
        &crate::guard::redact::redact_url(url.as_str()),
    )
}

impl fmt::Display for AmbiguousOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Without credentials, query or fragment, which may carry secrets.
        let mut url = self.url.clone();
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        write!(
            f,
            "outcome unknown: {} {url} may have been applied; not re-sent, because it is not idempotent and carries no Idempotency-Key",
            self.method
        )
    }
}

impl StdError for AmbiguousOutcome {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// Whether `error` is an [`AmbiguousOutcome`]: the request may have been applied, and nothing
/// re-sent it.
pub fn is_ambiguous(error: &reqwest_middleware::Error) -> bool {
    AmbiguousOutcome::find(error).is_some()
}
