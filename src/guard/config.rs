//! `Config`: what every guard a layer builds shares, and what it reads from it.

use std::{sync::Arc, time::Duration};

use super::Authorize;

use crate::{
    Actor, CredentialRef, IdempotencyKeyFormat, IntentScope, Target,
    contract::{AnnotationCache, ContractRegistry},
    execution::Timestamp,
    fingerprint::FingerprintKey,
    ledger::{IntentKey, Ledger},
    protocol::ToolAnnotations,
};

#[derive(Clone)]
pub(super) struct Config {
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) contracts: Arc<ContractRegistry>,
    pub(super) key: FingerprintKey,
    pub(super) actor: Actor,
    pub(super) intent_scope: IntentScope,
    pub(super) credential_ref: Option<CredentialRef>,
    pub(super) target: Option<Target>,
    pub(super) authorizer: Option<Arc<dyn Authorize>>,
    /// What trusted targets' `tools/list` answers said of their tools (shared by clones).
    pub(super) annotations: AnnotationCache,
    pub(super) max_body_bytes: usize,
    pub(super) attach_timeout: Duration,
    pub(super) drain_timeout: Duration,
    pub(super) key_format: IdempotencyKeyFormat,
    pub(super) execution_id_in_meta: bool,
    pub(super) owner: String,
    /// Claims of this guard whose answer never came and that may have recorded a first
    /// attempt it never sent (by intent: the claim's time), until that attempt is recorded
    /// `not_sent`.
    pub(super) unanswered_claims: Arc<dashmap::DashMap<IntentKey, Timestamp>>,
    /// Who is told when an execution becomes held (shared with the metered ledger).
    pub(super) held: super::held::SharedHeldHook,
}

impl Config {
    /// The annotations `target` published for `tool`, if the registry trusts `target` and its
    /// list passed through this guard.
    pub(super) fn annotations_of(&self, target: &Target, tool: &str) -> Option<ToolAnnotations> {
        if !self.contracts.trusts(target) {
            return None;
        }
        self.annotations.get(target, tool)
    }

    /// Whether a `tools/list` request is worth watching: its target is trusted.
    pub(super) fn watches_list_of(&self, parts: &http::request::Parts) -> bool {
        self.contracts.trusts(&self.target_of(parts))
    }

    /// The target a request is recorded under: the caller's [`Target`] extension, the layer's,
    /// else the request URI's host, port and path.
    pub(super) fn target_of(&self, parts: &http::request::Parts) -> Target {
        parts
            .extensions
            .get::<Target>()
            .or(self.target.as_ref())
            .cloned()
            .unwrap_or_else(|| crate::protocol::target_of(&parts.uri))
    }
}
