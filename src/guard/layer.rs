//! `GuardLayer`: the guard's configuration and its builder.

use std::{sync::Arc, time::Duration};

use tower_layer::Layer;

use super::{Authorize, GuardHandle, inflight::Inflight, service::Guard};

use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKeyFormat, IntentScope, Target,
    contract::{AnnotationCache, ContractRegistry},
    execution::{EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp},
    fingerprint::FingerprintKey,
    ledger::Ledger,
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
    pub(super) unanswered_claims: Arc<dashmap::DashMap<crate::ledger::IntentKey, Timestamp>>,
}

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
        let owner = format!("guard:{}", ExecutionId::new().ulid());
        Self {
            config: Arc::new(Config {
                ledger: Arc::new(ledger),
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

    /// The operator's handle on the guards this layer builds: settle a held execution, end
    /// the background work before the process exits. The layer itself stays configuration.
    pub fn handle(&self) -> GuardHandle {
        GuardHandle {
            config: self.config.clone(),
            inflight: self.inflight.clone(),
        }
    }
}

/// Records an operator's (or any settler's) resolution.
///
/// # When it is refused
///
/// - The execution is in flight (accepted, authorized, dispatched) and its owner is alive
///   ([`Ledger::is_owner_alive`]): the call may still be running, and only its own answer
///   settles it ([`LedgerError::StillRunning`](crate::ledger::LedgerError::StillRunning)).
/// - The state machine does not allow it (a settled execution is not settled again).
///
/// An answer the target gives after a resolution is still recorded: a `completed` follows
/// the `resolved`, and both stay in the execution's events.
pub async fn resolve(
    ledger: &dyn Ledger,
    execution_id: ExecutionId,
    applied: bool,
    by: &str,
    note: &str,
) -> Result<ExecutionRecord, crate::ledger::LedgerError> {
    let record = ledger
        .get(execution_id)
        .await?
        .ok_or(crate::ledger::LedgerError::NotFound(execution_id))?;
    // The owner is asked only about an execution in flight.
    let alive =
        crate::execution::is_running(&record, true) && ledger.is_owner_alive(&record.owner).await;
    if crate::execution::is_running(&record, alive) {
        return Err(crate::ledger::LedgerError::StillRunning {
            execution_id,
            state: record.state,
            owner: record.owner,
        });
    }
    ledger
        .append(LedgerEvent {
            execution_id,
            at: Timestamp::now(),
            kind: EventKind::Resolved {
                applied,
                by: by.to_owned(),
                note: note.to_owned(),
                result_reference: None,
                // An attempt dispatched since the record was read refuses the event (it names the
                // attempt it settles); an orphan's own attempt is the one in flight.
                attempt: (record.state != ExecutionState::Dispatched).then_some(record.attempts),
            },
        })
        .await
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
