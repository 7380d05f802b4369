//! The claim: a request to find or create the execution of an intent, what it found, and what
//! the dispatch of an attempt records.

use std::time::Duration;

use super::{ClientInfo, EventKind, ExecutionRecord, LedgerEvent, RetryClass, Timestamp};
use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target,
    fingerprint::Fingerprint, protocol::RequestId,
};

/// How long a repeat links to a settled execution, unless its contract says otherwise.
pub(crate) const DEFAULT_LINK_WINDOW: Duration = Duration::from_secs(10 * 60);
/// How long an execution stays in the index after its last event, unless its contract says
/// otherwise.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// A request to find or create the execution of an intent.
///
/// Built with [`Claim::new`]; its fields are public to read (a [`Ledger`](crate::ledger::Ledger)
/// implementation stores them) and to adjust after `new`. It may gain fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// The intent fingerprint.
    pub fingerprint: Fingerprint,
    /// The tool.
    pub tool: String,
    /// Who acts.
    pub actor: Actor,
    /// The intent scope.
    pub intent_scope: IntentScope,
    /// The target.
    pub target: Target,
    /// The credential reference.
    pub credential_ref: Option<CredentialRef>,
    /// The contract's class.
    pub retry_class: RetryClass,
    /// The contract's link window.
    pub link_window: Duration,
    /// The contract's retention.
    pub retention: Duration,
    /// Who claims (a process or guard instance id).
    pub owner: String,
    /// When.
    pub at: Timestamp,
    /// When the call this claim is for was asked, if earlier than `at` (a call that waited
    /// for a twin claims again later): a result delivered to another caller after this call
    /// was asked is still this call's to be handed back, never a reason to run the action
    /// again. `None`: asked at `at`.
    pub asked_at: Option<Timestamp>,
    /// The call waited on an attempt of its intent in flight (it attached) before this
    /// claim: an execution of the intent that settled as applied since is its answer,
    /// whatever the link window or the clocks say (after a clock stepped back, a settlement
    /// after the ask reads as earlier).
    pub waited: bool,
}

impl Claim {
    /// `owner`'s claim, made now, for the intent `fingerprint` of `actor`'s call to `tool` at
    /// `target` in `intent_scope`, under a contract of `retry_class`: no credential reference,
    /// the default link window (10 minutes) and retention (24 hours).
    pub fn new(
        fingerprint: Fingerprint,
        tool: impl Into<String>,
        actor: Actor,
        intent_scope: IntentScope,
        target: Target,
        retry_class: RetryClass,
        owner: impl Into<String>,
    ) -> Self {
        Self {
            fingerprint,
            tool: tool.into(),
            actor,
            intent_scope,
            target,
            credential_ref: None,
            retry_class,
            link_window: DEFAULT_LINK_WINDOW,
            retention: DEFAULT_RETENTION,
            owner: owner.into(),
            at: Timestamp::now(),
            asked_at: None,
            waited: false,
        }
    }

    /// The `accepted` event of a new execution for this claim.
    pub fn accepted_event(&self, execution_id: ExecutionId) -> LedgerEvent {
        LedgerEvent {
            execution_id,
            at: self.at,
            kind: EventKind::Accepted {
                fingerprint: self.fingerprint,
                tool: self.tool.clone(),
                actor: self.actor.clone(),
                intent_scope: self.intent_scope.clone(),
                target: self.target.clone(),
                credential_ref: self.credential_ref.clone(),
                retry_class: self.retry_class,
                link_until: self.at.saturating_add(self.link_window),
                retain_until: self.at.saturating_add(self.retention.max(self.link_window)),
                owner: self.owner.clone(),
            },
        }
    }
}

/// What the dispatch of an attempt records besides its number and owner: the key sent and the
/// request it went in. [`Ledger::claim_dispatched`](crate::ledger::Ledger::claim_dispatched) records the first attempt's with the
/// execution it creates; the guard records a later attempt's from the same value.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Dispatch {
    /// The caller's `Idempotency-Key`, kept and sent as it is; `None`: the key is the
    /// execution ID.
    pub caller_key: Option<IdempotencyKey>,
    /// JSON-RPC id of the request.
    pub jsonrpc_id: Option<RequestId>,
    /// Session of the request.
    pub session_id: Option<String>,
    /// The client that sent the request, as it named itself.
    pub client_info: Option<ClientInfo>,
}

impl Dispatch {
    /// The key the next attempt of `record` is sent under.
    pub fn key(&self, record: &ExecutionRecord) -> IdempotencyKey {
        self.caller_key
            .clone()
            .unwrap_or_else(|| IdempotencyKey::from(record.execution_id))
    }

    /// The `dispatched` of the next attempt of `record`, by `owner`, at `at`.
    pub fn event(&self, record: &ExecutionRecord, owner: &str, at: Timestamp) -> LedgerEvent {
        LedgerEvent {
            execution_id: record.execution_id,
            at,
            kind: EventKind::Dispatched {
                attempt: record.attempts + 1,
                idempotency_key: self.key(record),
                key_from_caller: self.caller_key.is_some(),
                jsonrpc_id: self.jsonrpc_id.clone(),
                session_id: self.session_id.clone(),
                client_info: self.client_info.clone(),
                owner: Some(owner.to_owned()),
            },
        }
    }
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// No linkable execution: this one was created (state `accepted`), and the caller owns it.
    New(ExecutionRecord),
    /// A linkable execution of the same intent exists.
    Existing(ExecutionRecord),
}

impl Claimed {
    /// The record, new or existing.
    pub fn record(&self) -> &ExecutionRecord {
        match self {
            Self::New(r) | Self::Existing(r) => r,
        }
    }
}
