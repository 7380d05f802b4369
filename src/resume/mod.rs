//! `ResumeLayer`: recovers a broken SSE response stream with GET + `Last-Event-ID` instead of
//! letting the break turn into a re-POST.
//!
//! For servers of the 2025-03-26 … 2025-11-25 revisions a disconnect is not a cancellation: the
//! server keeps running the tool and can replay the stream from the last event the client saw.
//! When a POST's SSE stream breaks (an error, or an end before any JSON-RPC response) and an
//! event id was seen, the layer waits the server's `retry:` (capped) or a backoff, sends
//! `GET` with `Last-Event-ID`, `Mcp-Session-Id` and `MCP-Protocol-Version`, and splices the
//! resumed events into the same response body: the caller sees one stream. Events whose id was
//! already delivered are dropped (a server may replay the event named by `Last-Event-ID`).
//!
//! It never re-POSTs. When resumption is refused (404: the session is gone; 405: the server
//! offers no GET stream), fails, or runs out of attempts, the original break reaches the caller,
//! and a [`GuardLayer`](crate::guard::GuardLayer) above records the outcome as unknown. In the
//! 2026-07-28 revision there is no resumption and the layer passes everything through.
//!
//! ```no_run
//! use std::time::Duration;
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{guard::GuardRequestBody, resume::ResumeLayer};
//! use tower::ServiceBuilder;
//!
//! let client = ServiceBuilder::new()
//!     .layer(ResumeLayer::new().max_attempts(3).max_delay(Duration::from_secs(2)))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//! # let _ = client;
//! ```

mod body;
mod future;
mod layer;
mod service;

pub use body::{ResumeBody, ResumeFailed};
pub use future::ResponseFuture;
pub use layer::ResumeLayer;
pub use service::Resume;
