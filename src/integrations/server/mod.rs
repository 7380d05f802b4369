//! The server half: a tower layer that makes an MCP server honour `Idempotency-Key` on
//! `tools/call` (feature `server`).
//!
//! The client [`GuardLayer`](crate::guard::GuardLayer) re-sends an idempotent call after a
//! lost response under the same `Idempotency-Key`. That is only safe when the server honours
//! the key, and most MCP servers do not. [`IdempotencyLayer`], placed in front of rmcp's
//! `StreamableHttpService` (or any hyper / axum MCP endpoint), follows the IETF httpapi
//! Idempotency-Key draft for `tools/call`:
//!
//! | request | answer |
//! |---|---|
//! | first with a key | runs; its final JSON-RPC response is kept, bound to the key and to the call's fingerprint (tool, canonical arguments, principal) |
//! | same key, same call, first completed | the kept response re-keyed to the repeat's JSON-RPC id (header `Idempotent-Replayed: true`); the tool does not run |
//! | same key, another call | HTTP 422, JSON-RPC error [`KEY_REUSED`] |
//! | same key while the first runs | HTTP 409, [`KEY_IN_FLIGHT`]; or, with [`InFlight::Wait`], the first one's result |
//! | same key, first may have run but its answer was never seen (stream cut, 5xx) | HTTP 409, [`KEY_OUTCOME_UNKNOWN`]: never run again under this key |
//! | same key, first refused (HTTP 4xx, JSON-RPC error) | runs: a refused call did not happen |
//! | no key; not a POST; not a single `tools/call` | passes through untouched |
//!
//! Both spellings of the key are read: a raw token and the draft's quoted structured-field
//! string (`"act_01J…"`). A malformed key is HTTP 400. Keys are scoped to the principal that
//! [`IdempotencyLayer::principal`] extracts (an extension set by an authentication layer, say):
//! two principals never share a key. Without one, all callers share the key space. The request
//! path does not scope a key: the slot is (principal, key, the layer's
//! [`target`](IdempotencyLayer::target)), because an MCP endpoint answers the same on every
//! path that reaches it (`/mcp`, `/mcp/`, `//mcp`, `/MCP`), so a repeat on another path is
//! still the repeat.
//!
//! # Errors are JSON-RPC, not problem+json
//!
//! The draft answers plain HTTP APIs with `application/problem+json`. An MCP client reads
//! JSON-RPC: it matches an answer to its request by id and surfaces `error.message`. So the 409,
//! 422, 400 and 503 answers here are JSON-RPC error objects with the caller's id, a code from
//! the constants of this module, and a message that says what happened and what to do, as
//! `application/json`.
//!
//! # What is recorded
//!
//! Each key is an execution in the crate's [`Ledger`](crate::ledger::Ledger) (memory, file or
//! PostgreSQL): actor = the principal (or `anonymous`), intent scope `idempotency-key:<key>`, a
//! fingerprint of (principal, key) so that the claim is atomic per key, a
//! [`KeyBound`](crate::execution::EventKind::KeyBound) event with the call's own fingerprint, then
//! `dispatched`, and `completed` with the kept result (or `failed` / `unknown`). The kept
//! response is the final JSON-RPC response, found while the body streams (progress events of
//! an SSE answer are not kept), and it is recorded before the frame that carries it is handed
//! on: a response lost on the way to the client is still replayed. A key is honoured for
//! [`IdempotencyLayer::retention`] (24 h by default). Never recorded: the arguments (only
//! their HMAC), any header (an `Authorization` value included) other than the key.
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use hyper_util::{
//!     rt::{TokioExecutor, TokioIo},
//!     server::conn::auto,
//!     service::TowerToHyperService,
//! };
//! use mcp_replay_guard::{
//!     Actor,
//!     fingerprint::FingerprintKey,
//!     integrations::server::{IdempotencyLayer, InFlight},
//!     ledger::FileLedger,
//! };
//! use tower::Layer;
//!
//! # struct AuthenticatedUser(String);
//! # async fn run<S>(mcp: S) -> Result<(), Box<dyn std::error::Error>>
//! # where
//! #     S: tower::Service<
//! #             http::Request<mcp_replay_guard::integrations::server::IdempotencyRequestBody<hyper::body::Incoming>>,
//! #             Response = http::Response<http_body_util::Full<bytes::Bytes>>,
//! #             Error = std::convert::Infallible,
//! #         > + Clone + Send + Sync + 'static,
//! #     S::Future: Send,
//! # {
//! let ledger = FileLedger::open("/var/lib/mcp/idempotency.jsonl")?;
//! let key = ledger.fingerprint_key()?;
//! let layer = IdempotencyLayer::new(ledger, key)
//!     // Keys belong to the authenticated user an auth layer put into the extensions.
//!     .principal(|parts: &http::request::Parts| {
//!         parts.extensions.get::<AuthenticatedUser>().map(|u| Actor::new(u.0.as_str()))
//!     })
//!     .in_flight(InFlight::Wait(std::time::Duration::from_secs(30)));
//! // `mcp` is rmcp's `StreamableHttpService` (or any MCP endpoint as a tower service).
//! let service = layer.layer(mcp);
//!
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! loop {
//!     let (stream, _) = listener.accept().await?;
//!     let service = TowerToHyperService::new(service.clone());
//!     tokio::spawn(async move {
//!         let _ = auto::Builder::new(TokioExecutor::new())
//!             .serve_connection(TokioIo::new(stream), service)
//!             .await;
//!     });
//! }
//! # }
//! ```
//!
//! `examples/idempotent_server.rs` runs rmcp's server behind the layer end to end.

mod body;
mod layer;
mod lines;
mod service;
#[cfg(test)]
mod tests;

pub use body::{IdempotencyRequestBody, IdempotencyResponseBody};
pub use layer::{ExtractPrincipal, IdempotencyLayer, InFlight};
pub use lines::MAX_SERVER_LINE_BYTES;
pub use service::{
    IDEMPOTENT_REPLAYED, Idempotency, KEY_IN_FLIGHT, KEY_NOT_RECORDED, KEY_OUTCOME_UNKNOWN,
    KEY_REUSED, ResponseFuture,
};
