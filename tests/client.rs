//! The client half against real servers, in one test binary: both protocol eras (`eras`),
//! resumption (`resume`, `resume_link`), trusted annotations, TLS, `ReplayPolicy`, rmcp's
//! client (feature `rmcp`) and reqwest-middleware (feature `reqwest`).

use mcp_replay_guard_test_support as support;

#[path = "client/eras.rs"]
mod eras;
#[path = "client/replay_policy.rs"]
mod replay_policy;
#[cfg(feature = "reqwest")]
#[path = "client/reqwest_middleware.rs"]
mod reqwest_middleware;
#[path = "client/resume.rs"]
mod resume;
#[path = "client/resume_link.rs"]
mod resume_link;
#[cfg(feature = "rmcp")]
#[path = "client/rmcp_client.rs"]
mod rmcp_client;
#[path = "client/tls_client.rs"]
mod tls_client;
#[path = "client/trusted_annotations.rs"]
mod trusted_annotations;
