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
//! assert_eq!(record.state(), ExecutionState::Completed);
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
//! [`ExecutionId`](crate::ExecutionId) in its extensions, so a caller can name the execution
//! even when the answer is not the guard's own.

mod action;
mod attached;
mod body;
mod call;
mod config;
mod deliveries;
mod dispatched;
mod error;
mod future;
mod handle;
mod held;
mod hooks;
mod inflight;
mod intent;
mod layer;
mod ledger_step;
mod listing;
mod local;
mod lost_answer;
mod metered;
mod owner;
mod probe;
pub(crate) mod redact;
mod reply;
mod resolve;
mod resume;
mod resume_link;
mod route;
mod service;
pub(crate) mod task_probe;
#[cfg(test)]
mod tests;
mod turn;

use crate::contract::{ProbeOutcome, ProbeRequest};
pub(crate) use crate::decide::call::UncertainReason;
// The answers both halves write live at the crate root; these are public here.
use crate::answer;
pub use crate::answer::STRUCTURED_KEY;
pub use body::{Delivery, GuardRequestBody, GuardResponseBody};
pub use deliveries::Deliveries;
pub use error::GuardError;
pub use future::ResponseFuture;
pub use handle::GuardHandle;
pub use held::OnHeld;
pub use hooks::{Authorization, AuthorizationRequest, Authorize};
pub use layer::GuardLayer;
pub use resolve::{resolve, resolve_after_probe};
pub use service::Guard;

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
