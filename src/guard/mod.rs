//! The guard: the retry decision and the tower layer that applies it.
//!
//! [`GuardLayer`] wraps any `Service<http::Request<GuardRequestBody>>` that speaks MCP
//! Streamable HTTP (a hyper client, say). Every `tools/call` that passes through it is
//! classified, fingerprinted, given an execution ID and a ledger record, and every repeat of
//! The same intent is decided from that record instead of being sent blindly.
//! Everything else (initialize, tools/list, notifications, GET, DELETE) and every read-only
//! tool passes through untouched.
//!
//! # Example
//!
//! The layer over a `service_fn` target: the one `tools/call` is dispatched once, under the
//! execution ID the ledger holds, sent as its `Idempotency-Key`.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use mcp_replay_guard::{
//!     ExecutionId,
//!     contract::{ContractRegistry, ToolContract},
//!     fingerprint::FingerprintKey,
//!     execution::ExecutionState,
//!     guard::{GuardLayer, GuardRequestBody},
//!     ledger::{Ledger, MemoryLedger},
//! };
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // The target: records the Idempotency-Key of every request it is sent, answers the call.
//! let keys = Arc::new(Mutex::new(Vec::new()));
//! let seen = keys.clone();
//! let target = service_fn(move |request: Request<GuardRequestBody>| {
//!     let seen = seen.clone();
//!     async move {
//!         seen.lock().unwrap().push(request.headers()["idempotency-key"].clone());
//!         let _ = request.into_body().collect().await?;
//!         let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"deployed"}]}}"#;
//!         let response = Response::builder()
//!             .header("content-type", "application/json")
//!             .body(Full::new(Bytes::from_static(answer.as_bytes())))?;
//!         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
//!     }
//! });
//!
//! let ledger = MemoryLedger::new();
//! let contracts = ContractRegistry::builder()
//!     .tool("deploy_release", ToolContract::irreversible())
//!     .build()?;
//! let guarded = ServiceBuilder::new()
//!     .layer(GuardLayer::new(ledger.clone(), contracts, FingerprintKey::generate()?))
//!     .service(target);
//!
//! let call = Request::post("http://127.0.0.1:9/mcp")
//!     .header("content-type", "application/json")
//!     .header("accept", "application/json, text/event-stream")
//!     .header("mcp-protocol-version", "2025-11-25")
//!     .body(Full::new(Bytes::from_static(
//!         br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"deploy_release","arguments":{"service":"catalog"}}}"#,
//!     )))?;
//! let response = guarded.oneshot(call).await?;
//! let body = response.into_body().collect().await?.to_bytes();
//! assert!(body.starts_with(br#"{"jsonrpc":"2.0","id":1,"result""#));
//!
//! // One dispatch, under the execution ID the ledger holds, sent as the Idempotency-Key.
//! let keys = keys.lock().unwrap().clone();
//! assert_eq!(keys.len(), 1);
//! let execution: ExecutionId = keys[0].to_str()?.parse()?;
//! let record = ledger.get(execution).await?.expect("recorded");
//! assert_eq!(record.state, ExecutionState::Completed);
//! # Ok(())
//! # }
//! ```
//!
//! # When a call is re-sent
//!
//! | prior execution | what the guard does |
//! |---|---|
//! | none, delivered, failed | a new execution: `accepted` → authorize → `dispatched` (recorded before the bytes leave) → send with `Idempotency-Key` |
//! | in flight in this process, or in another process sharing the ledger | wait for it (bounded) and return its result |
//! | never sent (accepted, authorized, `not_sent`) | continue it under the same execution ID |
//! | unknown, idempotent | re-send under the same execution ID and key |
//! | unknown, recoverable | ask the status probe: applied → its result; not applied → re-send same key; unknown → review |
//! | unknown, irreversible | never re-send: `needs_review` and an honest uncertain answer |
//! | completed, not delivered | the kept result, re-keyed to the caller's JSON-RPC id |
//! | denied | the same denial, no new authorization |
//!
//! # What is recorded
//!
//! See [`crate::ledger`]. A send error before the transport read the request body, or a
//! connect error, is `not_sent`; any other send error, a broken response stream, or a status
//! that does not prove a refusal (a 5xx, a 408, 409 or 410) is `unknown`;
//! 400/401/403/404/405/406/415/422/429 are `failed` (refused before running).
//!
//! A response the target produced for a guarded call carries the call's
//! [`ExecutionId`] in its extensions, so a caller can name the execution
//! even when the answer is not the guard's own.

mod body;
mod call;
mod claim;
mod deliveries;
mod dispatch;
mod future;
mod handle;
mod hooks;
mod inflight;
mod intent;
mod layer;
mod listing;
mod probe;
mod redact;
mod service;
mod steps;
#[cfg(test)]
mod tests;

use std::fmt;

use crate::contract::{ProbeOutcome, ProbeRequest};
pub(crate) use crate::decide::call::UncertainReason;
// The answers both halves write live at the crate root; these are public here.
use crate::answer;
pub use crate::answer::{STRUCTURED_KEY, jsonrpc_error, refused_request};
pub use body::{Delivery, GuardRequestBody, GuardResponseBody};
pub use deliveries::Deliveries;
pub use future::ResponseFuture;
pub use handle::GuardHandle;
pub use hooks::{Authorization, AuthorizationRequest, Authorize};
pub use layer::{GuardLayer, resolve};
pub use redact::redact_url;
pub use service::Guard;

use crate::{ExecutionId, ledger::LedgerError, protocol::RequestId};

use crate::BoxError;

/// Whether a JSON-RPC error with this `code`, answering a `tools/call`, leaves open that the
/// tool ran: the rule the guard records by (`unknown`, held by the tool's class), for a caller
/// that reads the answer itself.
///
/// Only the codes that prove the request was refused before any tool ran say no: `-32700`,
/// `-32600`, `-32601` and `-32602` (MCP's answer to an unknown tool or invalid arguments).
/// `-32603`, the `-32000..=-32099` range and every other code may come after the effect.
///
/// ```
/// use mcp_replay_guard::guard::jsonrpc_error_may_have_run;
///
/// assert!(jsonrpc_error_may_have_run(-32603));
/// assert!(jsonrpc_error_may_have_run(-32000));
/// assert!(!jsonrpc_error_may_have_run(-32602));
/// ```
pub fn jsonrpc_error_may_have_run(code: i64) -> bool {
    crate::decide::classify::error_may_have_run(code)
}

/// An error of the guarded service.
#[derive(Debug)]
pub struct GuardError {
    kind: ErrorKind,
    execution_id: Option<ExecutionId>,
    /// The call a failed resume continued (with `execution_id`, its execution).
    resumed: Option<RequestId>,
    source: BoxError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    NotSent,
    Unknown,
    Ledger,
    RequestBody,
    Inner,
}

impl GuardError {
    pub(crate) fn not_sent(id: ExecutionId, source: BoxError) -> Self {
        Self {
            kind: ErrorKind::NotSent,
            execution_id: Some(id),
            resumed: None,
            source,
        }
    }
    pub(crate) fn unknown(id: ExecutionId, source: BoxError) -> Self {
        Self {
            kind: ErrorKind::Unknown,
            execution_id: Some(id),
            resumed: None,
            source,
        }
    }
    pub(crate) fn ledger(source: LedgerError) -> Self {
        Self {
            kind: ErrorKind::Ledger,
            execution_id: None,
            resumed: None,
            source: source.into(),
        }
    }
    pub(crate) fn request_body(source: BoxError) -> Self {
        Self {
            kind: ErrorKind::RequestBody,
            execution_id: None,
            resumed: None,
            source,
        }
    }
    pub(crate) fn inner(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Inner,
            execution_id: None,
            resumed: None,
            source: source.into(),
        }
    }

    /// The transport failed before the request was sent: safe to send again (the guard
    /// continues the same execution).
    pub fn is_not_sent(&self) -> bool {
        self.kind == ErrorKind::NotSent
    }

    /// The transport failed after the request may have been sent: the outcome is unknown.
    pub fn is_unknown(&self) -> bool {
        self.kind == ErrorKind::Unknown
    }

    /// The ledger failed; nothing was sent if the failure was on `dispatched`.
    pub fn is_ledger(&self) -> bool {
        self.kind == ErrorKind::Ledger
    }

    /// Reading the caller's request body failed; nothing was sent.
    pub fn is_request_body(&self) -> bool {
        self.kind == ErrorKind::RequestBody
    }

    /// The inner service failed on a request the guard passed through.
    pub fn is_inner(&self) -> bool {
        self.kind == ErrorKind::Inner
    }

    pub(crate) fn is_ledger_transition(&self) -> bool {
        self.source
            .downcast_ref::<LedgerError>()
            .is_some_and(LedgerError::is_invalid_transition)
    }

    /// A resume (GET with `Last-Event-ID`) of the broken stream of execution `id`, answering
    /// the call `request`, failed: the stream stays linked to its execution for a later
    /// resume.
    pub(crate) fn resuming(mut self, id: ExecutionId, request: RequestId) -> Self {
        self.execution_id = Some(id);
        self.resumed = Some(request);
        self
    }

    /// The execution the error belongs to, for `not_sent` and `unknown`, and for a failed
    /// resume of an execution's stream.
    pub fn execution_id(&self) -> Option<ExecutionId> {
        self.execution_id
    }

    /// For a resume of an execution's broken stream that failed (the target could not be
    /// reached, say): the JSON-RPC id of the call that stream answers, whose answer is still
    /// owed to the caller ([`Guard::unanswered`] gives the guard's own for it).
    pub fn resumed_call(&self) -> Option<&RequestId> {
        self.resumed.as_ref()
    }
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::NotSent => "not sent",
            ErrorKind::Unknown => "outcome unknown",
            ErrorKind::Ledger => "ledger failed",
            ErrorKind::RequestBody => "could not read the request body",
            ErrorKind::Inner => "inner service failed",
        };
        match self.execution_id {
            Some(id) => write!(f, "{what} (execution {id})"),
            None => f.write_str(what),
        }
    }
}

impl std::error::Error for GuardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
