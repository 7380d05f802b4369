//! The server half and what the crate writes, in one test binary: `IdempotencyLayer` in front
//! of rmcp's server (`server_idempotency`), and every kind of answer the crate writes checked
//! against the official MCP schemas of both eras (`mcp_schema`). Feature `server`.

use mcp_replay_guard_test_support as support;

#[path = "server/mcp_schema.rs"]
mod mcp_schema;
#[path = "server/server_idempotency.rs"]
mod server_idempotency;
