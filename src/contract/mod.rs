//! Tool contracts: what may happen, per tool, when a response is lost.
//!
//! A [`ToolContract`] is written in code (or a policy file) next to the tool it governs. It
//! names the tool's [`RetryClass`], how long a repeat of the same intent links to the earlier
//! execution, how long the record is kept, how the arguments are fingerprinted, and whether the
//! result is kept so that an undelivered answer can be handed back.
//!
//! ```
//! use std::time::Duration;
//! use mcp_replay_guard::contract::{ContractRegistry, ToolContract};
//! use mcp_replay_guard::fingerprint::FingerprintRules;
//!
//! let registry = ContractRegistry::builder()
//!     .tool("list_branches", ToolContract::read_only())
//!     .tool("create_payment", ToolContract::idempotent().link_window(Duration::from_secs(3600)))
//!     .tool(
//!         "deploy_release",
//!         ToolContract::irreversible()
//!             .fingerprint(FingerprintRules::new().drop("/note").secret("/approval_token")),
//!     )
//!     .strict(true)
//!     .build()?;
//! assert!(registry.resolve("deploy_release", &"deploy-api/mcp".into(), None).is_ok());
//! assert!(registry.resolve("rm_rf", &"deploy-api/mcp".into(), None).is_err());
//! # Ok::<(), mcp_replay_guard::contract::InvalidContract>(())
//! ```
//!
//! # Tools without a contract
//!
//! MCP tool annotations are hints from the server, and the specification says a client must
//! treat them as untrusted unless it trusts the server. So an unlisted tool is
//! [`RetryClass::Irreversible`], unless its server is marked trusted: then `readOnlyHint: true`
//! makes it read-only and `idempotentHint: true` idempotent. In strict mode an unlisted tool is
//! refused outright: if nobody can write its contract, the tool is not ready.
//!
//! The guard learns a trusted server's annotations from the `tools/list` answers that pass
//! through it (kept per server and tool, bounded); an untrusted server's list is not read.
//!
//! # Status probes
//!
//! A recoverable tool's [`StatusProbe`] is part of its contract
//! ([`ToolContract::status_probe`]); [`ContractRegistryBuilder::build`] refuses one on any
//! other class. A recoverable tool without a probe is still probed when its call became an MCP
//! task (`tasks/get`); otherwise its unknown outcome waits for review.

mod annotations;
mod error;
mod policy;
mod probe;
mod registry;
mod tool;

use crate::execution::RetryClass;
use crate::protocol::ToolAnnotations;
pub(crate) use annotations::AnnotationCache;
pub use error::{InvalidContract, NoContract};
pub use policy::{Policy, ToolPolicy, UnlistedPolicy};
pub use probe::{ProbeOutcome, ProbeRequest, StatusProbe};
pub use registry::{ContractRegistry, ContractRegistryBuilder, ContractSource, ResolvedContract};
pub use tool::ToolContract;

#[cfg(test)]
mod tests;
