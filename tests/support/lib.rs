//! Shared end-to-end test support: a real rmcp Streamable HTTP MCP server on
//! 127.0.0.1 whose tools count their side effects, a fault-injection tower
//! layer in front of it, and small generic client helpers.
//!
//! A crate of its own, built once for every test binary of both packages; a test file names it
//! `use mcp_replay_guard_test_support as support;`. The ground truth of every duplicate test is
//! [`ServerState::side_effects`]: how many times a tool's body actually ran on the server.

mod bearer;
mod child;
mod client;
mod era;
mod event_store;
mod faults;
mod front;
mod ledger;
mod log;
mod pg_relay;
mod postgres;
mod retry;
mod schema;
pub mod seeds;
mod server;
mod sse;
pub mod sshd;
pub mod stdio_example;
mod task_server;
mod temp;
mod tls;
mod tools;

/// The repository's root (the library package's directory), two levels above this crate.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub use bearer::{
    AUTHORIZATION_SERVER_METADATA_PATH, BearerGate, RESOURCE_METADATA_PATH, UNAUTHORIZED_BODY,
};
pub use child::{CHILD_TASK, assert_child_ran, child_process};
pub use client::*;
pub use era::{CredentialStatusProbe, Era, TOLD_PROBE_RESULT, TOLD_RESULT, Told, agent_call};
pub use event_store::InMemoryEventStore;
pub use faults::{
    Fault, FaultBody, FaultLayer, FaultPlan, FaultService, FiredFault, InjectedFault,
};
pub use front::{FrontOptions, FrontServer};
pub use ledger::{
    deploy_claim, dispatched, dispatched_as, event_names, event_now, fingerprint_of,
    fingerprint_of_byte, only_record, wait_for_state,
};
pub use log::{Captured, captured_log, head_log_lines, log_field};
pub use pg_relay::{Cut, PgRelay};
pub use postgres::TestSchema;
pub use postgres::{POSTGRES_URL_VAR, postgres_url};
pub use retry::RetryEveryError;
pub use schema::{assert_valid_message, assert_valid_tool_answer};
pub use seeds::env_u64;
pub use server::{LoggedRequest, ServerOptions, ServerState, TestServer, ToolRun};
pub use sse::{SseEvent, SseReader};
pub use task_server::{SeenMethods, task_server, task_server_speaking};
pub use temp::{shm_temp_dir, temp_dir};
pub use tls::{SERVER_NAMES, TestCerts};
pub use tools::{TOOL_NAMES, TestTools, one_contract_per_class};

/// The error type every helper returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The session-era protocol version (initialize handshake, `Mcp-Session-Id`).
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// The stateless-era protocol version (no handshake; per-request `_meta`,
/// `Mcp-Method` / `Mcp-Name` headers).
pub const STATELESS_PROTOCOL_VERSION: &str = "2026-07-28";

/// Header a guard uses to carry its idempotency key; the test tools record it.
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";
