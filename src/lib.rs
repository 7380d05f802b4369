//! mcp-replay-guard (docs written below)
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod context;
mod execution_id;
pub mod protocol;

pub use context::{Actor, CredentialRef, IntentScope, Target};
pub use execution_id::{
    ExecutionId, IDEMPOTENCY_KEY, IdempotencyKey, IdempotencyKeyFormat, InvalidExecutionId,
    InvalidIdempotencyKey,
};
pub mod fingerprint;
