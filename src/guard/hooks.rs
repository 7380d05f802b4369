//! The two places where the guard asks code of yours: may this execution start, and was this
//! unknown execution applied.

use std::fmt;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::ledger::ExecutionRecord;

/// What the authorization hook is asked about: a new execution, before anything is sent.
#[derive(Debug)]
#[non_exhaustive]
pub struct AuthorizationRequest<'a> {
    /// The new execution (state `accepted`).
    pub execution: &'a ExecutionRecord,
    /// The call's arguments (secrets included: do not log them).
    pub arguments: &'a Map<String, Value>,
}

/// The hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authorization {
    /// The execution may start.
    Allow,
    /// It may not; the reason is recorded and repeated to every retry of the same intent.
    Deny {
        /// Why, in words the agent and an operator can read.
        reason: String,
    },
}

/// Decides whether the caller may **start** an execution. Called once per execution: a retry
/// that attaches to an existing execution never asks again, and a denied intent gets the same
/// denial back without a new prompt.
#[async_trait]
pub trait Authorize: Send + Sync + fmt::Debug + 'static {
    /// Allow or deny.
    async fn authorize(&self, request: AuthorizationRequest<'_>) -> Authorization;
}

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
