//! `GuardLayer`: the guard's builder; what it builds shares one [`Config`].

use std::{sync::Arc, time::Duration};

use tower_layer::Layer;

use super::{
    Authorize, GuardHandle, config::Config, inflight::Inflight, metered::Metered, service::Guard,
};

use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKeyFormat, IntentScope, Target,
    contract::{AnnotationCache, ContractRegistry},
    fingerprint::FingerprintKey,
    ledger::Ledger,
};

/// A [`Layer`] that puts the guard in front of an MCP client transport.
///
/// # When a call is re-sent
///
/// Only as its tool's contract and the ledger allow: see the [module docs](super).
///
/// # Clone
///
/// Clones share the ledger and the in-flight table, so two services built from one layer
/// single-flight the same intents.
#[derive(Clone)]
pub struct GuardLayer {
    pub(super) config: Arc<Config>,
    pub(super) inflight: Arc<Inflight>,
}

impl std::fmt::Debug for GuardLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardLayer")
            .field("ledger", &self.config.ledger)
            .field("actor", &self.config.actor)
            .field("intent_scope", &self.config.intent_scope)
            .field("owner", &self.config.owner)
            .finish_non_exhaustive()
    }
}

impl GuardLayer {
    /// A guard recording into `ledger`, governed by `contracts`, fingerprinting under `key`.
    ///
    /// Defaults: actor `anonymous`, intent scope `process:<random>` (links repeats within this
    /// guard's life only), target from each request's URI, no authorization hook, 4 MiB body
    /// limit, 30 s attach wait, raw `Idempotency-Key`.
    pub fn new(ledger: impl Ledger, contracts: ContractRegistry, key: FingerprintKey) -> Self {
        crate::metrics::name_tools(contracts.tools().map(|(tool, _)| tool));
        let owner = format!("guard:{}", ExecutionId::new().ulid());
        let held = super::held::SharedHeldHook::default();
        Self {
            config: Arc::new(Config {
                ledger: Arc::new(Metered::new(Arc::new(ledger), held.clone())),
                contracts: Arc::new(contracts),
                key,
                actor: Actor::new("anonymous"),
                intent_scope: IntentScope::new(format!("process:{owner}")),
                credential_ref: None,
                target: None,
                authorizer: None,
                annotations: AnnotationCache::default(),
                max_body_bytes: crate::DEFAULT_MAX_BODY_BYTES,
                attach_timeout: Duration::from_secs(30),
                drain_timeout: Duration::from_secs(60),
                key_format: IdempotencyKeyFormat::Raw,
                execution_id_in_meta: false,
                owner,
                unanswered_claims: Arc::default(),
                held,
            }),
            inflight: Arc::default(),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Put each dispatch's key into the request's `params._meta` too, under
    /// [`EXECUTION_ID_META_KEY`](crate::EXECUTION_ID_META_KEY), for every tool whose contract
    /// does not say otherwise ([`ToolContract::execution_id_in_meta`](crate::contract::ToolContract::execution_id_in_meta)).
    /// Off by default: the `Idempotency-Key` header carries it over HTTP, and only a target
    /// that sees no headers (a stdio server behind [`crate::relay`]) needs it in the body.
    pub fn execution_id_in_meta(mut self, send: bool) -> Self {
        self.config().execution_id_in_meta = send;
        self
    }

    /// The tool contracts, in place of those given to [`GuardLayer::new`]: a layer that guards
    /// another target under another policy, sharing this one's ledger and in-flight table.
    pub fn contracts(mut self, contracts: ContractRegistry) -> Self {
        crate::metrics::name_tools(contracts.tools().map(|(tool, _)| tool));
        self.config().contracts = Arc::new(contracts);
        self
    }

    /// The default actor (a request's [`Actor`] extension overrides it).
    pub fn actor(mut self, actor: Actor) -> Self {
        self.config().actor = actor;
        self
    }

    /// The default intent scope (a request's [`IntentScope`] extension overrides it).
    pub fn intent_scope(mut self, scope: IntentScope) -> Self {
        self.config().intent_scope = scope;
        self
    }

    /// The default credential reference (a request's [`CredentialRef`] extension overrides it).
    pub fn credential_ref(mut self, credential_ref: CredentialRef) -> Self {
        self.config().credential_ref = Some(credential_ref);
        self
    }

    /// The target; by default each request's URI authority and path.
    pub fn target(mut self, target: Target) -> Self {
        self.config().target = Some(target);
        self
    }

    /// The authorization hook, asked once per new execution.
    pub fn authorizer(mut self, authorizer: impl Authorize) -> Self {
        self.config().authorizer = Some(Arc::new(authorizer));
        self
    }

    /// The largest request body buffered; a larger `tools/call` is refused before sending.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.config().max_body_bytes = max;
        self
    }

    /// How long a repeat waits for an in-flight attempt of the same execution.
    pub fn attach_timeout(mut self, timeout: Duration) -> Self {
        self.config().attach_timeout = timeout;
        self
    }

    /// How long a response body the caller dropped before its JSON-RPC response is still read
    /// in the background to learn the outcome (after that, the outcome is `unknown`).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config().drain_timeout = timeout;
        self
    }

    /// How the `Idempotency-Key` header is spelled.
    pub fn idempotency_key_format(mut self, format: IdempotencyKeyFormat) -> Self {
        self.config().key_format = format;
        self
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.config.ledger
    }

    /// Tells `hook` of each execution that becomes held (its outcome unknown and nothing
    /// re-sent: `unknown` or `needs_review`), once per attempt, for every guard that shares
    /// this layer's ledger. It runs where the outcome is recorded: it must return at once
    /// (queue any work on a task of its own). A record holds no arguments and no credentials.
    pub fn on_held(
        self,
        hook: impl Fn(&crate::execution::ExecutionRecord) + Send + Sync + 'static,
    ) -> Self {
        self.config.held.set(Arc::new(hook));
        self
    }

    /// The operator's handle on the guards this layer builds: settle a held execution, end
    /// the background work before the process exits. The layer itself stays configuration.
    pub fn handle(&self) -> GuardHandle {
        GuardHandle {
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        }
    }
}

impl<S> Layer<S> for GuardLayer {
    type Service = Guard<S>;

    fn layer(&self, inner: S) -> Guard<S> {
        Guard {
            inner,
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        }
    }
}
