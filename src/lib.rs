//! Tower middleware for MCP clients that keeps a broken connection from silently turning into a
//! second side effect.
//!
//! An MCP `tools/call` can deploy a release, move money or rotate a credential. When the
//! connection breaks after the server accepted the call but before the agent saw the answer, a
//! generic retry layer re-sends the bytes and the action runs twice. This crate draws the line a
//! generic layer cannot:
//!
//! > Resume a response stream when the protocol allows it. Re-issue a side-effecting action only
//! > when it can be identified as the same execution.
//!
//! # What is here
//!
//! - [`protocol`]: what a request to a Streamable HTTP endpoint is (a `tools/call` POST, a GET
//!   resume with `Last-Event-ID`, a listen stream, a session end), in both protocol eras
//!   (2025-03-26 … 2025-11-25 with sessions and resumable SSE; 2026-07-28, stateless), and an
//!   incremental SSE parser with a bound on event size.
//! - [`ExecutionId`]: `act_` + a ULID, the identity of one accepted attempt, sent as the
//!   `Idempotency-Key` header ([`IdempotencyKey`], raw or structured-field spelling).
//! - [`fingerprint`]: the intent fingerprint, an HMAC-SHA256 over the RFC 8785 canonical action
//!   record, which finds an earlier execution of the same intent. Secrets never enter it raw.
//! - [`contract`]: per-tool contracts ([`RetryClass`](execution::RetryClass): read-only,
//!   idempotent, recoverable, irreversible), built in code or loaded from a TOML/JSON policy.
//! - [`execution`]: the execution model every layer speaks: an execution's record, its events
//!   and states and the state machine between them, the link rule with its two clocks,
//!   [`RetryClass`](execution::RetryClass), and the claim that finds or creates the execution
//!   of an intent.
//! - [`ledger`]: stores, indexes and verifies executions: the atomic claim, appended events,
//!   kept results. [`MemoryLedger`](ledger::MemoryLedger)
//!   in memory; [`FileLedger`](ledger::FileLedger), durable, hash-chained and shared by the
//!   processes of one host; `PostgresLedger` (feature `postgres`) for replicas; tamper
//!   evidence ([`ledger::chain`]) and the investigation timeline ([`ledger::audit`]).
//! - [`guard`]: the retry decision and [`GuardLayer`](guard::GuardLayer), the tower middleware
//!   that applies it to a real MCP client transport.
//! - [`resume`]: [`ResumeLayer`](resume::ResumeLayer) recovers a broken SSE stream with GET +
//!   `Last-Event-ID` (2025-era servers) instead of re-sending.
//! - [`replay_policy`]: [`ReplayPolicy`](replay_policy::ReplayPolicy), a `tower::retry` policy
//!   that replaces a generic one and never re-sends blindly.
//! - [`integrations`]: an rmcp `StreamableHttpClient` over any tower stack (feature `rmcp`),
//!   and reqwest-middleware `Idempotency-Key` propagation plus a replay-safe retry (feature
//!   `reqwest`); the server half, a layer that makes an MCP server honour `Idempotency-Key`
//!   (feature `server`).
//!
//! # Stacking the guard
//!
//! ```no_run
//! use hyper_util::{client::legacy::Client, rt::TokioExecutor};
//! use mcp_replay_guard::{
//!     contract::{ContractRegistry, ToolContract},
//!     fingerprint::FingerprintKey,
//!     guard::{GuardLayer, GuardRequestBody},
//!     ledger::MemoryLedger,
//! };
//! use tower::ServiceBuilder;
//!
//! let contracts = ContractRegistry::builder()
//!     .tool("deploy_release", ToolContract::irreversible())
//!     .build()?;
//! let client = ServiceBuilder::new()
//!     .layer(GuardLayer::new(MemoryLedger::new(), contracts, FingerprintKey::generate()?))
//!     .service(Client::builder(TokioExecutor::new()).build_http::<GuardRequestBody>());
//! # let _ = client;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The parts on their own
//!
//! ```
//! use http::{HeaderMap, Method};
//! use mcp_replay_guard::{
//!     ExecutionId,
//!     contract::{ContractRegistry, ToolContract},
//!     execution::RetryClass,
//!     fingerprint::{ActionRecord, Channel, FingerprintKey},
//!     protocol::{self, Message, RequestKind},
//! };
//!
//! let registry = ContractRegistry::builder()
//!     .tool("deploy_release", ToolContract::irreversible())
//!     .build()?;
//! let key = FingerprintKey::generate()?;
//!
//! let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call",
//!     "params":{"name":"deploy_release","arguments":{"service":"catalog"}}}"#;
//! let request = protocol::classify(&Method::POST, &HeaderMap::new(), body)?;
//! let RequestKind::Message(Message::ToolCall(call)) = request.kind else { unreachable!() };
//!
//! let target = "deploy-api.internal.example/mcp".into();
//! let contract = registry.resolve(&call.name, &target, None)?.contract;
//! assert_eq!(contract.class(), RetryClass::Irreversible);
//!
//! let record = ActionRecord::new("agent:a".into(), "run:1".into(), &*call.name, Channel::mcp(target))
//!     .call_arguments(&call);
//! let fingerprint = key.fingerprint(record, contract.fingerprint_rules());
//! let execution = ExecutionId::new();
//! println!("{execution} {fingerprint}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! | feature | what it adds |
//! |---|---|
//! | `rmcp` | [`integrations::rmcp`]: run an rmcp 3.x client over a guarded tower stack |
//! | `reqwest` | [`integrations::reqwest`]: `Idempotency-Key` propagation and a retry middleware for reqwest-middleware |
//! | `postgres` | `ledger::PostgresLedger`: a ledger shared by replicas through PostgreSQL |
//! | `server` | `integrations::server`: a server-side layer that honours `Idempotency-Key` on `tools/call` |
//! | `ssh` | `integrations::ssh`: remote commands over SSH (russh) under a durable marker on the host, its status probe, host keys pinned |
//! | `simulation` | `simulation`: hooks for the crate's deterministic simulator (a simulated clock, a `FileLedger` on a crashable disk); not for production |
//!
//! None is on by default.
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

/// Serialises a type through `Display` and deserialises it through `FromStr`, so its JSON form
/// is the same string as its text form.
macro_rules! serde_display_fromstr {
    ($type:ty) => {
        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use serde_display_fromstr;

/// `get_ref`, `get_mut` and `into_inner` for a middleware whose inner service `S` is its field
/// `inner` (tower-http's `define_inner_service_accessors!`); used inside `impl<S> Foo<S>`.
macro_rules! define_inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, consuming the middleware.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
pub(crate) use define_inner_service_accessors;

mod answer;
mod context;
pub mod contract;
pub mod credentials;
mod decide;
pub mod execution;
mod execution_id;
pub mod fingerprint;
pub mod guard;
pub mod integrations;
pub mod ledger;
pub mod metrics;
mod observe;
pub mod protocol;
pub mod relay;
pub mod replay_policy;
pub mod resume;
#[cfg(feature = "simulation")]
pub mod simulation;
pub mod tools;

pub use context::{Actor, CredentialRef, IntentScope, Target};
pub use execution_id::{
    EXECUTION_ID_META_KEY, ExecutionId, IDEMPOTENCY_KEY, IdempotencyKey, IdempotencyKeyFormat,
    InvalidExecutionId, InvalidIdempotencyKey,
};

/// Default bound on a buffered request body, in the guard and in the server half.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// A boxed error, as tower uses.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

// The README's and the guide's code blocks are compiled (and the ones not marked `no_run` run)
// as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/channels.md")]
struct ChannelsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/contracts.md")]
struct ContractsDoctests;
