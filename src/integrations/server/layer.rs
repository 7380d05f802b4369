//! `IdempotencyLayer`: configuration.

use std::{fmt, sync::Arc, time::Duration};

use tower_layer::Layer;

use super::Idempotency;
use crate::{
    Actor, DEFAULT_MAX_BODY_BYTES, ExecutionId, Target, fingerprint::FingerprintKey, ledger::Ledger,
};

/// Who is calling, from the request (an extension an authentication layer put there, say).
/// Keys are scoped to the principal: two principals never share a key.
///
/// Any `Fn(&http::request::Parts) -> Option<Actor>` is one. Return a stable identity (a user
/// or client id), never a credential: the principal is written to the ledger. Unauthenticated
/// callers share the actor `anonymous`, so give principals a prefix (`user:alice`) that cannot
/// be that.
pub trait ExtractPrincipal: Send + Sync + 'static {
    /// The principal of the request; `None` when it is unauthenticated.
    fn principal(&self, request: &http::request::Parts) -> Option<Actor>;
}

impl<F> ExtractPrincipal for F
where
    F: Fn(&http::request::Parts) -> Option<Actor> + Send + Sync + 'static,
{
    fn principal(&self, request: &http::request::Parts) -> Option<Actor> {
        self(request)
    }
}

/// What a repeat gets while the first request with its key is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InFlight {
    /// HTTP 409 Conflict at once, as the IETF draft says (the default).
    #[default]
    Conflict,
    /// Wait up to this long for the first request and answer with its result; 409 if it is
    /// still running then.
    Wait(Duration),
}

#[derive(Clone)]
pub(super) struct Config {
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) key: FingerprintKey,
    pub(super) principal: Option<Arc<dyn ExtractPrincipal>>,
    pub(super) retention: Duration,
    pub(super) in_flight: InFlight,
    pub(super) max_body_bytes: usize,
    pub(super) key_from_meta: bool,
    pub(super) drain_timeout: Duration,
    pub(super) target: Target,
    pub(super) owner: String,
}

/// A [`Layer`] that makes an MCP server honour `Idempotency-Key` on `tools/call`; see the
/// [module docs](super).
///
/// # Clone
///
/// Clones share the ledger and the configuration.
#[derive(Clone)]
pub struct IdempotencyLayer {
    pub(super) config: Arc<Config>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("ledger", &self.config.ledger)
            .field("retention", &self.config.retention)
            .field("in_flight", &self.config.in_flight)
            .field("target", &self.config.target)
            .field("owner", &self.config.owner)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// Default retention of a key: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

    /// The name of the server in the ledger (and in a key's slot) when [`target`](Self::target)
    /// is not set: `/mcp`, the path rmcp's Streamable HTTP examples serve on, and the name keys
    /// of a server at that path were recorded under before the slot stopped following the
    /// request path (so those keys stay honoured).
    pub const DEFAULT_TARGET: &'static str = "/mcp";

    /// A layer keeping keys in `ledger`, fingerprinting calls under `key` (keep it stable, like
    /// the ledger: a new key makes every kept call look different, so repeats get 422).
    ///
    /// Defaults: no principal (keys are shared by all unauthenticated callers), 24 h
    /// retention, 409 while the first request runs, 4 MiB request and kept-response limit,
    /// 60 s to read on a response whose caller went away, [`DEFAULT_TARGET`](Self::DEFAULT_TARGET)
    /// as the server's name.
    pub fn new(ledger: impl Ledger, key: FingerprintKey) -> Self {
        Self::with_shared_ledger(Arc::new(ledger), key)
    }

    /// Like [`new`](Self::new), with a ledger shared with other parts of the program.
    pub fn with_shared_ledger(ledger: Arc<dyn Ledger>, key: FingerprintKey) -> Self {
        Self {
            config: Arc::new(Config {
                ledger,
                key,
                principal: None,
                retention: Self::DEFAULT_RETENTION,
                in_flight: InFlight::Conflict,
                max_body_bytes: DEFAULT_MAX_BODY_BYTES,
                key_from_meta: false,
                drain_timeout: Duration::from_secs(60),
                target: Target::new(Self::DEFAULT_TARGET),
                owner: format!("server:{}", ExecutionId::new().ulid()),
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Scopes keys to the principal `extract` finds in each request.
    pub fn principal(mut self, extract: impl ExtractPrincipal) -> Self {
        self.config().principal = Some(Arc::new(extract));
        self
    }

    /// How long a key (and its kept response) is honoured. A repeat after that runs again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config().retention = retention;
        self
    }

    /// What a repeat gets while the first request runs.
    pub fn in_flight(mut self, in_flight: InFlight) -> Self {
        self.config().in_flight = in_flight;
        self
    }

    /// Bound on a keyed request body and on a response that is kept for replay.
    pub fn max_body_bytes(mut self, max: usize) -> Self {
        self.config().max_body_bytes = max;
        self
    }

    /// Also honour a key carried in a `tools/call`'s `params._meta` under
    /// [`EXECUTION_ID_META_KEY`](crate::EXECUTION_ID_META_KEY), as the client guard sends it
    /// to a target without headers ([`GuardLayer::execution_id_in_meta`](crate::guard::GuardLayer::execution_id_in_meta)).
    /// The header wins when a call carries both. Off by default: with it on, every `POST` body
    /// is read, not only those that carry the header.
    pub fn key_from_meta(mut self, read: bool) -> Self {
        self.config().key_from_meta = read;
        self
    }

    /// How long the layer keeps reading a response whose caller went away, so that its answer
    /// is still kept for the repeat.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.config().drain_timeout = timeout;
        self
    }

    /// The name of this server in the ledger (default: [`DEFAULT_TARGET`](Self::DEFAULT_TARGET)).
    ///
    /// A key's slot is (principal, key, target): the request path never enters it, because an
    /// MCP endpoint (rmcp's service among them) answers the same on every path it is mounted
    /// at, so `/mcp`, `/mcp/`, `//mcp` and `/MCP` reach one server and one key is one call on
    /// all of them. Give each layer its own target only when two different servers keep their
    /// keys in one ledger.
    pub fn target(mut self, target: Target) -> Self {
        self.config().target = target;
        self
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.config.ledger
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            config: self.config.clone(),
        }
    }
}
