//! Where the guard asks code of yours whether an execution may start. (The other hook, "was
//! this unknown execution applied?", is a tool's [`StatusProbe`](crate::contract::StatusProbe),
//! on its contract.)

use std::fmt;

use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::execution::ExecutionRecord;

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
