//! [`ReplayPolicy`]: a [`tower::retry::Policy`] that re-sends a request only when that cannot
//! repeat a side effect.
//!
//! A generic retry policy sees a reset or a timeout and sends the bytes again. For
//! `tools/list` that is harmless; for a `tools/call` of `deploy_release` it is a second deploy.
//! `ReplayPolicy` is the drop-in replacement: it tells an error that proves nothing was sent
//! from one whose outcome is unknown, and it looks up the called tool's
//! [`RetryClass`] before it re-sends anything whose outcome is unknown.
//!
//! Put it *above* the [`GuardLayer`](crate::guard::GuardLayer): the guard turns each error into
//! a [`GuardError`] that says whether the request left the process, and answers a re-send of an
//! unknown idempotent call by re-sending the same execution under its `Idempotency-Key`.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{
//!     contract::{ContractRegistry, ToolContract},
//!     fingerprint::FingerprintKey,
//!     guard::{GuardLayer, GuardRequestBody},
//!     ledger::MemoryLedger,
//!     replay_policy::{Backoff, ReplayPolicy},
//! };
//! use tower::{ServiceBuilder, ServiceExt, retry::RetryLayer};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let contracts = ContractRegistry::builder()
//!     .tool("list_branches", ToolContract::read_only())
//!     .tool("create_payment", ToolContract::idempotent())
//!     .tool("deploy_release", ToolContract::irreversible())
//!     .build()?;
//! let policy = ReplayPolicy::new(contracts.clone())
//!     .max_attempts(3)
//!     .backoff(Backoff::exponential(Duration::from_millis(100), Duration::from_secs(2)));
//! let client = ServiceBuilder::new()
//!     .layer(RetryLayer::new(policy))
//!     .layer(GuardLayer::new(MemoryLedger::new(), contracts, FingerprintKey::generate()?))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//!
//! let request = http::Request::post("http://127.0.0.1:8080/mcp")
//!     .header("content-type", "application/json")
//!     .header("accept", "application/json, text/event-stream")
//!     .body(Full::new(Bytes::from_static(
//!         br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"deploy_release","arguments":{}}}"#,
//!     )))?;
//! // A reset after the request left is returned, never re-sent: deploy_release is irreversible.
//! let response = client.oneshot(request).await?;
//! # let _ = response;
//! # Ok(())
//! # }
//! ```
//!
//! # When a call is re-sent
//!
//! Only after an error, never after a response (an HTTP status is an answer), at most
//! [`max_attempts`](ReplayPolicy::max_attempts) times in all, and only when a withdrawal from
//! the optional shared [`budget`](ReplayPolicy::budget) succeeds:
//!
//! | the request | nothing was sent | outcome unknown |
//! |---|---|---|
//! | MCP traffic other than `tools/call` (initialize, `tools/list`, notifications, GET, DELETE) | re-sent | re-sent |
//! | `tools/call` of a [`ReadOnly`](RetryClass::ReadOnly) tool | re-sent | re-sent |
//! | `tools/call` of an [`Idempotent`](RetryClass::Idempotent) tool | re-sent | re-sent only under its original key: the request carries an `Idempotency-Key`, or the error is the guard's with an execution ID (the guard re-sends that execution under its key) |
//! | `tools/call` of a [`Recoverable`](RetryClass::Recoverable) or [`Irreversible`](RetryClass::Irreversible) tool, or an unlisted one | re-sent | **never** |
//! | not MCP (the body does not parse, another HTTP method) | re-sent | only an idempotent HTTP method or a request with an `Idempotency-Key` |
//!
//! "Nothing was sent" needs proof in the error's source chain: a [`GuardError`] that
//! [`is_not_sent`](GuardError::is_not_sent) (or that failed reading the caller's body), a
//! hyper-util `client::legacy::Error` that `is_connect()`, or an I/O error of kind
//! `ConnectionRefused`. Every other error (reset, timeout, a stream cut short) leaves the outcome
//! unknown. The tool's class comes from the [`ContractRegistry`] the policy holds, so it
//! agrees with the guard's: an unlisted tool is irreversible, and in strict mode a tool without
//! a contract is never re-sent either.
//!
//! A recoverable call is not re-sent here even though the guard could probe it: its status probe
//! runs when the caller asks again, where the caller sees the answer.
//!
//! # Request bodies
//!
//! To find the tool, the policy reads the body of a request whose outcome is unknown. It reads a
//! clone of the body without waiting, which works for bodies that hold their bytes
//! (`Full<Bytes>`, `String`, `Empty`); a body that would have to wait is treated as a request
//! that is not MCP. The answer is kept in the request's extensions, so the body is parsed once
//! per request, not once per attempt, and only when an error makes it matter.
//!
//! # Errors
//!
//! The policy reads the source chain of the service's error through [`AsDynError`], which is
//! implemented for [`GuardError`], hyper-util's client error, [`std::io::Error`] and boxed
//! errors (`tower::BoxError`). Implement it for an error type of your own in one line.

use std::{
    error::Error as StdError,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::retry::{
    Policy,
    budget::{Budget as _, TpsBudget},
};

use crate::{
    IDEMPOTENCY_KEY, Target,
    contract::ContractRegistry,
    decide::class::AfterUnknown,
    execution::RetryClass,
    guard::GuardError,
    protocol::{self, RequestKind},
};

/// A [`tower::retry::Policy`] that re-sends a request only when that cannot repeat a side
/// effect. See the [module docs](self).
///
/// # When a call is re-sent
///
/// After an error that proves nothing was sent, always (within the attempt bound). After an
/// error whose outcome is unknown: MCP traffic other than `tools/call` and read-only tools,
/// always; idempotent tools, only under their original `Idempotency-Key`; recoverable,
/// irreversible and unlisted tools, never. Responses are never re-sent. The full table is in
/// the [module docs](self#when-a-call-is-re-sent).
///
/// # Clone
///
/// Clones share the contract registry and the budget. Tower clones the policy for every request;
/// the attempt count of a request travels in the request's extensions, so one policy value can
/// also drive a hand-written retry loop.
#[derive(Clone, Debug)]
pub struct ReplayPolicy {
    contracts: Arc<ContractRegistry>,
    max_attempts: u32,
    backoff: Backoff,
    budget: Option<Arc<TpsBudget>>,
}

impl ReplayPolicy {
    /// Default bound on attempts, the first one included.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// A policy that reads retry classes from `contracts` (the registry the guard uses).
    ///
    /// Defaults: [`DEFAULT_MAX_ATTEMPTS`](Self::DEFAULT_MAX_ATTEMPTS) attempts,
    /// [`Backoff::default`], no shared budget.
    pub fn new(contracts: impl Into<Arc<ContractRegistry>>) -> Self {
        Self {
            contracts: contracts.into(),
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            budget: None,
        }
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

    /// A budget shared by every request the policy (and its clones) sees: each request deposits
    /// once, each re-send withdraws, and a re-send the budget cannot pay for is not made. It
    /// keeps a failing server from receiving `max_attempts` times the traffic.
    pub fn budget(mut self, budget: Arc<TpsBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The contract registry the policy reads retry classes from.
    pub fn contracts(&self) -> &Arc<ContractRegistry> {
        &self.contracts
    }

    /// What the request is, as far as re-sending goes.
    fn replay_kind<B>(&self, request: &Request<B>) -> ReplayKind
    where
        B: Body + Clone,
    {
        let Some(bytes) = body_bytes(request.body()) else {
            return ReplayKind::Http;
        };
        let Ok(classified) = protocol::classify(request.method(), request.headers(), &bytes) else {
            return ReplayKind::Http;
        };
        let target = request
            .extensions()
            .get::<Target>()
            .cloned()
            .unwrap_or_else(|| crate::protocol::target_of(request.uri()));
        let strictest = |classes: &mut dyn Iterator<Item = RetryClass>| {
            classes.max_by_key(|class| match class {
                RetryClass::ReadOnly => 0,
                RetryClass::Idempotent => 1,
                RetryClass::Recoverable => 2,
                RetryClass::Irreversible => 3,
            })
        };
        let mut classes = classified.kind.tool_calls().map(|call| {
            self.contracts
                .resolve(&call.name, &target, None)
                // Strict mode refuses the tool: nothing may re-send it.
                .map_or(RetryClass::Irreversible, |r| r.contract.class())
        });
        match strictest(&mut classes) {
            Some(class) => ReplayKind::Tool(class),
            // initialize, tools/list, notifications, responses, GET (listen or resume), DELETE.
            None if matches!(
                classified.kind,
                RequestKind::Message(_)
                    | RequestKind::Batch(_)
                    | RequestKind::Resume { .. }
                    | RequestKind::Listen
                    | RequestKind::EndSession
            ) =>
            {
                ReplayKind::Read
            }
            None => ReplayKind::Http,
        }
    }
}

impl<B, RB, E> Policy<Request<B>, Response<RB>, E> for ReplayPolicy
where
    B: Body + Clone,
    E: AsDynError,
{
    type Future = BackoffFuture;

    fn retry(
        &mut self,
        request: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<BackoffFuture> {
        let state = request
            .extensions_mut()
            .get_or_insert_default::<ReplayState>();
        state.attempts += 1;
        let attempts = state.attempts;
        if attempts == 1
            && let Some(budget) = &self.budget
        {
            budget.deposit();
        }
        let error = match result {
            Ok(_) => return None,
            Err(error) => error.as_dyn_error(),
        };
        if attempts >= self.max_attempts {
            tracing::debug!(attempts, "not re-sent: attempts exhausted");
            return None;
        }
        let outcome = Outcome::of(error);
        let kind = match request
            .extensions()
            .get::<ReplayState>()
            .and_then(|s| s.kind)
        {
            Some(kind) => kind,
            None => {
                let kind = self.replay_kind(request);
                if let Some(state) = request.extensions_mut().get_mut::<ReplayState>() {
                    state.kind = Some(kind);
                }
                kind
            }
        };
        let has_key = request.headers().contains_key(IDEMPOTENCY_KEY);
        let reason = match resend_reason(kind, request.method(), outcome, has_key) {
            Ok(reason) => reason,
            Err(refusal) => {
                tracing::info!(attempts, %error, why = refusal, "not re-sent: the outcome is unknown");
                return None;
            }
        };
        if let Some(budget) = &self.budget
            && !budget.withdraw()
        {
            tracing::debug!(attempts, "not re-sent: the retry budget is spent");
            return None;
        }
        let delay = self.backoff.delay(attempts);
        tracing::info!(attempts, ?delay, %error, reason, "re-sending");
        Some(BackoffFuture::new(delay))
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        // Headers (an Idempotency-Key among them) and extensions (the attempt count and the
        // classification) go with the clone.
        Some(request.clone())
    }
}

/// Per-request state, carried from attempt to attempt in the request's extensions.
#[derive(Clone, Debug, Default)]
struct ReplayState {
    attempts: u32,
    kind: Option<ReplayKind>,
}

/// What a request is, as far as re-sending goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplayKind {
    /// MCP traffic that runs no tool.
    Read,
    /// A `tools/call` (for a batch, the strictest class among its calls).
    Tool(RetryClass),
    /// Not an MCP request this crate can read: HTTP semantics.
    Http,
}

/// What an error says about whether the request left the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Provably nothing was sent.
    NotSent,
    /// The request may have been sent.
    Unknown {
        /// The error is the guard's for an execution it will re-send under the same key.
        guard_execution: bool,
    },
}

impl Outcome {
    /// Reads an error's source chain. The first [`GuardError`] in the chain that knows the
    /// outcome decides; otherwise a connect error or a refused connection proves nothing was
    /// sent.
    pub(crate) fn of(error: &(dyn StdError + 'static)) -> Self {
        let mut current = Some(error);
        while let Some(e) = current {
            if let Some(guard) = e.downcast_ref::<GuardError>() {
                if guard.is_not_sent() || guard.is_request_body() {
                    return Self::NotSent;
                }
                if guard.is_unknown() || guard.is_ledger() {
                    return Self::Unknown {
                        guard_execution: guard.is_unknown() && guard.execution_id().is_some(),
                    };
                }
                // `is_inner`: a request the guard passed through; its source decides.
            }
            // The wire-level proof, link by link: a guard error nearer the top decides first.
            if crate::protocol::transport::nothing_was_sent_here(e) {
                return Self::NotSent;
            }
            current = e.source();
        }
        Self::Unknown {
            guard_execution: false,
        }
    }
}

/// Why a request may be re-sent, or why it may not.
fn resend_reason(
    kind: ReplayKind,
    method: &Method,
    outcome: Outcome,
    has_key: bool,
) -> Result<&'static str, &'static str> {
    let guard_execution = match outcome {
        Outcome::NotSent => return Ok("nothing was sent"),
        Outcome::Unknown { guard_execution } => guard_execution,
    };
    match kind {
        ReplayKind::Read => Ok("MCP traffic that runs no tool"),
        ReplayKind::Tool(class) => match AfterUnknown::of(class) {
            AfterUnknown::ResendFreely => Ok("read-only tool"),
            AfterUnknown::ResendUnderKey if has_key => {
                Ok("idempotent tool, re-sent under its Idempotency-Key")
            }
            AfterUnknown::ResendUnderKey if guard_execution => {
                Ok("idempotent tool, re-sent by the guard under its execution's key")
            }
            AfterUnknown::ResendUnderKey => {
                Err("idempotent tool without an Idempotency-Key or a guard execution")
            }
            AfterUnknown::Probe => {
                Err("recoverable tool: its status probe decides on the next call")
            }
            AfterUnknown::Review => Err("irreversible or unlisted tool"),
        },
        ReplayKind::Http if is_idempotent_method(method) => Ok("idempotent HTTP method"),
        ReplayKind::Http if has_key => Ok("request with an Idempotency-Key"),
        ReplayKind::Http => Err("not idempotent and no Idempotency-Key"),
    }
}

/// The methods HTTP defines as idempotent (RFC 9110 §9.2.2).
pub(crate) fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// The bytes of a body that holds them: read from a clone without waiting. `None` when the
/// body would wait or fails.
fn body_bytes<B: Body + Clone>(body: &B) -> Option<Bytes> {
    let mut body = std::pin::pin!(body.clone());
    let mut cx = Context::from_waker(Waker::noop());
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    loop {
        let frame = match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(None) => break,
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(_))) | Poll::Pending => return None,
        };
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers carry no JSON
        };
        let chunk = data.copy_to_bytes(data.remaining());
        match (&mut first, &mut joined) {
            (None, _) => first = Some(chunk),
            (Some(first), None) => {
                let mut all = BytesMut::from(&first[..]);
                all.extend_from_slice(&chunk);
                joined = Some(all);
            }
            (Some(_), Some(all)) => all.extend_from_slice(&chunk),
        }
    }
    Some(match (first, joined) {
        (_, Some(all)) => all.freeze(),
        (first, None) => first.unwrap_or_default(),
    })
}

/// The wait before each re-send: exponential from an initial delay, capped.
///
/// ```
/// use std::time::Duration;
/// use mcp_replay_guard::replay_policy::Backoff;
///
/// let backoff = Backoff::exponential(Duration::from_millis(100), Duration::from_millis(250));
/// assert_eq!(backoff.delay(1), Duration::from_millis(100));
/// assert_eq!(backoff.delay(2), Duration::from_millis(200));
/// assert_eq!(backoff.delay(3), Duration::from_millis(250));
/// assert_eq!(Backoff::none().delay(7), Duration::ZERO);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Backoff {
    /// No wait: re-send at once.
    pub const fn none() -> Self {
        Self {
            initial: Duration::ZERO,
            max: Duration::ZERO,
        }
    }

    /// `initial` before the first re-send, doubling before each further one, never more than
    /// `max`.
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Self { initial, max }
    }

    /// The wait before re-send number `resend` (counted from 1).
    pub fn delay(&self, resend: u32) -> Duration {
        let factor = 1u32
            .checked_shl(resend.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

impl Default for Backoff {
    /// 100 ms, doubling, at most 2 s.
    fn default() -> Self {
        Self::exponential(Duration::from_millis(100), Duration::from_secs(2))
    }
}

pin_project! {
    /// The wait before a re-send, returned by [`ReplayPolicy`]'s `retry`. It needs a tokio
    /// runtime with time enabled when the wait is not zero.
    #[derive(Debug)]
    pub struct BackoffFuture {
        #[pin]
        sleep: Option<tokio::time::Sleep>,
    }
}

impl BackoffFuture {
    fn new(delay: Duration) -> Self {
        Self {
            sleep: (!delay.is_zero()).then(|| tokio::time::sleep(delay)),
        }
    }
}

impl Future for BackoffFuture {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.project().sleep.as_pin_mut() {
            Some(sleep) => sleep.poll(cx),
            None => Poll::Ready(()),
        }
    }
}

/// An error whose source chain [`ReplayPolicy`] can read.
///
/// `Box<dyn Error + Send + Sync>` does not implement [`std::error::Error`], so the policy
/// cannot simply ask for `E: Error`. Implement this for your own error type:
///
/// ```
/// use mcp_replay_guard::replay_policy::AsDynError;
///
/// #[derive(Debug)]
/// struct MyError;
/// impl std::fmt::Display for MyError {
///     fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
///         f.write_str("my error")
///     }
/// }
/// impl std::error::Error for MyError {}
///
/// impl AsDynError for MyError {
///     fn as_dyn_error(&self) -> &(dyn std::error::Error + 'static) {
///         self
///     }
/// }
/// ```
pub trait AsDynError {
    /// The error as a trait object, to walk its source chain.
    fn as_dyn_error(&self) -> &(dyn StdError + 'static);
}

macro_rules! as_dyn_error_by_ref {
    ($($type:ty),* $(,)?) => {$(
        impl AsDynError for $type {
            fn as_dyn_error(&self) -> &(dyn StdError + 'static) {
                self
            }
        }
    )*};
}

as_dyn_error_by_ref!(
    GuardError,
    hyper_util::client::legacy::Error,
    std::io::Error
);

macro_rules! as_dyn_error_boxed {
    ($($type:ty),* $(,)?) => {$(
        impl AsDynError for $type {
            fn as_dyn_error(&self) -> &(dyn StdError + 'static) {
                &**self
            }
        }
    )*};
}

as_dyn_error_boxed!(
    Box<dyn StdError + Send + Sync>,
    Box<dyn StdError + Send>,
    Box<dyn StdError>,
);

#[cfg(test)]
mod tests {
    use http_body_util::Full;

    use super::*;
    use crate::contract::ToolContract;

    fn policy() -> ReplayPolicy {
        let contracts = ContractRegistry::builder()
            .tool("list_branches", ToolContract::read_only())
            .tool("create_payment", ToolContract::idempotent())
            .tool("rotate_credential", ToolContract::recoverable())
            .tool("deploy_release", ToolContract::irreversible())
            .build()
            .unwrap();
        ReplayPolicy::new(contracts).backoff(Backoff::none())
    }

    fn call(tool: &str) -> Request<Full<Bytes>> {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        );
        Request::post("http://mcp.example/mcp")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    }

    #[test]
    fn the_decision_table() {
        use Outcome::*;
        use ReplayKind::*;
        use RetryClass::*;
        let unknown = Unknown {
            guard_execution: false,
        };
        let guard_unknown = Unknown {
            guard_execution: true,
        };
        let post = Method::POST;
        let rows: &[(ReplayKind, &Method, Outcome, bool, bool)] = &[
            // kind, method, outcome, has key, re-sent
            (Tool(Irreversible), &post, NotSent, false, true),
            (Tool(Irreversible), &post, unknown, true, false),
            (Tool(Irreversible), &post, guard_unknown, false, false),
            (Tool(Recoverable), &post, guard_unknown, true, false),
            (Tool(Idempotent), &post, unknown, false, false),
            (Tool(Idempotent), &post, unknown, true, true),
            (Tool(Idempotent), &post, guard_unknown, false, true),
            (Tool(ReadOnly), &post, unknown, false, true),
            (Read, &Method::GET, unknown, false, true),
            (Http, &post, unknown, false, false),
            (Http, &post, unknown, true, true),
            (Http, &Method::PUT, unknown, false, true),
            (Http, &Method::PATCH, NotSent, false, true),
        ];
        for &(kind, method, outcome, key, resent) in rows {
            assert_eq!(
                resend_reason(kind, method, outcome, key).is_ok(),
                resent,
                "{kind:?} {method} {outcome:?} key={key}"
            );
        }
    }

    #[test]
    fn requests_are_classified_from_the_body_and_registry() {
        let policy = policy();
        for (tool, class) in [
            ("list_branches", RetryClass::ReadOnly),
            ("create_payment", RetryClass::Idempotent),
            ("rotate_credential", RetryClass::Recoverable),
            ("deploy_release", RetryClass::Irreversible),
            ("never_heard_of_it", RetryClass::Irreversible),
        ] {
            assert_eq!(policy.replay_kind(&call(tool)), ReplayKind::Tool(class));
        }
        let list = Request::post("http://mcp.example/mcp")
            .body(Full::new(Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            )))
            .unwrap();
        assert_eq!(policy.replay_kind(&list), ReplayKind::Read);
        let get = Request::get("http://mcp.example/mcp")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(policy.replay_kind(&get), ReplayKind::Read);
        let not_json = Request::post("http://api.example/payments")
            .body(Full::new(Bytes::from_static(b"amount=5")))
            .unwrap();
        assert_eq!(policy.replay_kind(&not_json), ReplayKind::Http);
    }

    #[test]
    fn a_batch_takes_its_strictest_class() {
        let body = br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_branches"}},
                        {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_payment"}}]"#;
        let request = Request::post("http://mcp.example/mcp")
            .header("mcp-protocol-version", "2025-03-26")
            .body(Full::new(Bytes::from_static(body)))
            .unwrap();
        assert_eq!(
            policy().replay_kind(&request),
            ReplayKind::Tool(RetryClass::Idempotent)
        );
    }

    #[test]
    fn bodies_are_read_without_waiting_or_not_at_all() {
        assert_eq!(
            body_bytes(&Full::new(Bytes::from_static(b"abc"))).unwrap(),
            "abc"
        );
        assert_eq!(body_bytes(&String::from("xyz")).unwrap(), "xyz");
        assert_eq!(
            body_bytes(&http_body_util::Empty::<Bytes>::new()).unwrap(),
            ""
        );
        #[derive(Clone)]
        struct Pending;
        impl Body for Pending {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
                Poll::Pending
            }
        }
        assert!(body_bytes(&Pending).is_none());
    }

    #[test]
    fn the_classification_is_made_once_and_travels_with_the_clones() {
        let mut policy = policy();
        let original = call("deploy_release");
        let mut kept =
            Policy::<_, Response<()>, std::io::Error>::clone_request(&mut policy, &original)
                .unwrap();
        let mut result: Result<Response<()>, _> =
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(policy.retry(&mut kept, &mut result).is_none());
        let state = kept.extensions().get::<ReplayState>().unwrap();
        assert_eq!(state.attempts, 1);
        assert_eq!(state.kind, Some(ReplayKind::Tool(RetryClass::Irreversible)));
        let next =
            Policy::<_, Response<()>, std::io::Error>::clone_request(&mut policy, &kept).unwrap();
        assert_eq!(
            next.extensions().get::<ReplayState>().unwrap().kind,
            state.kind
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_without_overflow() {
        let b = Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1));
        let delays: Vec<_> = (1..=9).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
