//! The status probe of a recoverable tool: "was this unknown execution applied?".
//!
//! A probe belongs to the tool it answers for, so it is part of the tool's [`ToolContract`]
//! (`ToolContract::recoverable().status_probe(probe)`), and
//! [`ContractRegistryBuilder::build`] refuses one on a contract that is not recoverable.
//!
//! [`ToolContract`]: super::ToolContract
//! [`ContractRegistryBuilder::build`]: super::ContractRegistryBuilder::build

use std::fmt;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::execution::ExecutionRecord;

/// What a status probe is asked: did this execution, whose outcome is unknown, take effect?
#[derive(Debug)]
#[non_exhaustive]
pub struct ProbeRequest<'a> {
    /// The execution (its id is the `Idempotency-Key` the target saw).
    pub execution: &'a ExecutionRecord,
    /// The arguments of the call being retried (the same intent, so the same action).
    pub arguments: &'a Map<String, Value>,
}

/// A status probe's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeOutcome {
    /// The action took effect. `result` is the tool result to hand back (a `CallToolResult`
    /// JSON), if the probe can tell it.
    Applied {
        /// The result, if known.
        result: Option<Value>,
    },
    /// The action did not take effect: the guard sends it again under the same execution ID.
    ///
    /// Answer it only when the action cannot take effect later either. A request sent just
    /// before (by a process that then died, say) may still be on its way to the target, and
    /// against a target that does not honour `Idempotency-Key` the re-send would run beside
    /// it: answer [`ProbeOutcome::Unknown`] while that may be.
    NotApplied,
    /// The action is still running (an MCP task that is `working`): nothing is re-sent and the
    /// caller is told to ask again later.
    InProgress,
    /// The probe cannot tell: the execution waits for review.
    Unknown {
        /// Why.
        reason: String,
    },
}

/// Answers "was it applied?" for a recoverable tool after an unknown outcome.
#[async_trait]
pub trait StatusProbe: Send + Sync + fmt::Debug + 'static {
    /// Probe the target.
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome;
}
