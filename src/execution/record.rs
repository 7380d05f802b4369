//! The execution record, its events, and the state machine that folds one into the other.

use std::{
    fmt,
    str::FromStr,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::{
    Actor, CredentialRef, ExecutionId, IdempotencyKey, IntentScope, Target, execution::RetryClass,
    fingerprint::Fingerprint, protocol::RequestId,
};

/// A point in time, to the millisecond, written as RFC 3339 UTC (`2026-07-22T14:03:18.512Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(u64);

impl Timestamp {
    /// Now (with feature `simulation`, the simulated clock where one is installed).
    pub fn now() -> Self {
        #[cfg(feature = "simulation")]
        if let Some(now) = crate::simulation::now() {
            return now;
        }
        Self::from(SystemTime::now())
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// From milliseconds since the Unix epoch.
    pub fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// This time plus `duration` (saturating).
    pub fn saturating_add(self, duration: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)),
        )
    }
}

impl From<SystemTime> for Timestamp {
    fn from(time: SystemTime) -> Self {
        let millis = time
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        Self(u64::try_from(millis).unwrap_or(u64::MAX))
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> Self {
        UNIX_EPOCH + Duration::from_millis(t.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}",
            humantime::format_rfc3339_millis(SystemTime::from(*self))
        )
    }
}

/// Text that is not an RFC 3339 timestamp.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid timestamp: {0}")]
pub struct InvalidTimestamp(String);

impl FromStr for Timestamp {
    type Err = InvalidTimestamp;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_rfc3339_weak(s)
            .map(Self::from)
            .map_err(|e| InvalidTimestamp(e.to_string()))
    }
}

crate::serde_display_fromstr!(Timestamp);

/// Where an execution stands.
///
/// `delivered` is not a state of its own: a record carries `delivered_at`. A completed record
/// that was never delivered reads as `completed_result_not_delivered` in its JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// The guard accepted the call and gave it an execution ID.
    Accepted,
    /// The authorization hook allowed it.
    Authorized,
    /// Recorded before the request bytes left: the target may have run it from here on.
    Dispatched,
    /// The target answered with a result (which may be a tool-level error, `isError: true`).
    Completed,
    /// The target refused the call before running the tool (HTTP 4xx, JSON-RPC error).
    Failed,
    /// Nobody can tell whether the target ran it.
    Unknown,
    /// The authorization hook refused it.
    Denied,
    /// Provably never left the process (connect error, request body never read).
    NotSent,
    /// Unknown on a tool that may not be re-sent: a person or a probe must settle it.
    NeedsReview,
    /// Settled: the action was applied.
    ResolvedApplied,
    /// Settled: the action was not applied.
    ResolvedNotApplied,
}

impl ExecutionState {
    /// Held: the outcome is unknown, and nothing settles it but a status probe or a person
    /// (`unknown` or `needs_review`). The number of held executions is the one to alert on.
    pub fn is_held(self) -> bool {
        matches!(self, Self::Unknown | Self::NeedsReview)
    }

    /// The state's name in records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Authorized => "authorized",
            Self::Dispatched => "dispatched",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
            Self::Denied => "denied",
            Self::NotSent => "not_sent",
            Self::NeedsReview => "needs_review",
            Self::ResolvedApplied => "resolved_applied",
            Self::ResolvedNotApplied => "resolved_not_applied",
        }
    }

    /// Whether the outcome is not settled: the execution is in flight (accepted, authorized,
    /// dispatched), its outcome is unknown, or it waits for review. An unsettled execution
    /// blocks every new execution of its intent until it is settled or leaves retention,
    /// whatever its link window says (see [`ExecutionRecord::is_linkable`]).
    pub fn is_unsettled(self) -> bool {
        matches!(
            self,
            Self::Accepted
                | Self::Authorized
                | Self::Dispatched
                | Self::Unknown
                | Self::NeedsReview
        )
    }
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Protocol correlation of the latest attempt: never identity, only where to look.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Correlation {
    /// JSON-RPC id of the latest request that carried this execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonrpc_id: Option<RequestId>,
    /// `Mcp-Session-Id` of the latest attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The last SSE event id seen on the response stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_id: Option<String>,
    /// The MCP task id, when the call became a task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The client that sent the latest attempt, as it named itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<ClientInfo>,
}

/// The MCP client that sent a call, as it named itself (`clientInfo` of its `initialize`, or
/// of a 2026-07-28 request's `_meta`): `name` and `version` only, each bounded.
///
/// Never identity (any client can claim any name): only where to look. It can travel in
/// [`http::Extensions`] next to a request, as the proxy sets it for a session's calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ClientInfo {
    /// `clientInfo.name`.
    pub name: String,
    /// `clientInfo.version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl ClientInfo {
    /// A client that names itself `name`, at `version` when it says.
    pub fn new(name: impl Into<String>, version: Option<String>) -> Self {
        Self {
            name: name.into(),
            version,
        }
    }

    /// The longest `name` or `version` kept, in bytes; longer ones are cut at a character
    /// boundary.
    pub const MAX_LEN: usize = 128;

    /// The name and version of a `clientInfo` object; `None` when it has no string `name`.
    /// Control characters become U+FFFD: a client's name never drives an operator's terminal.
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        let bounded = |text: &str| {
            let mut end = text.len().min(Self::MAX_LEN);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text[..end]
                .chars()
                .map(|c| if c.is_control() { '\u{fffd}' } else { c })
                .collect()
        };
        Some(Self {
            name: bounded(value.get("name")?.as_str()?),
            version: value
                .get("version")
                .and_then(serde_json::Value::as_str)
                .map(bounded),
        })
    }
}

impl fmt::Display for ClientInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.version {
            Some(version) => write!(f, "{} {version}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// What happened to an execution: one appended, timestamped event per transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The execution was created by a claim.
    Accepted {
        /// The intent fingerprint.
        fingerprint: Fingerprint,
        /// The tool.
        tool: String,
        /// Who acts.
        actor: Actor,
        /// The intent scope.
        intent_scope: IntentScope,
        /// The target.
        target: Target,
        /// The credential reference.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential_ref: Option<CredentialRef>,
        /// The contract's class.
        retry_class: RetryClass,
        /// Until when a repeat links to it.
        link_until: Timestamp,
        /// Until when the record is kept in the index.
        retain_until: Timestamp,
        /// The process that accepted it.
        owner: String,
    },
    /// The authorization hook allowed it.
    Authorized,
    /// A server-side Idempotency-Key layer bound the key of this execution to the fingerprint
    /// of the call that first carried it; a later call with the same key and another fingerprint
    /// is refused. Only in state `accepted`, once.
    KeyBound {
        /// The fingerprint of the call (tool, canonical arguments, principal).
        request_fingerprint: Fingerprint,
    },
    /// The authorization hook refused it.
    Denied {
        /// Why.
        reason: String,
    },
    /// An attempt is about to leave the process.
    Dispatched {
        /// 1 for the first attempt.
        attempt: u32,
        /// The key sent.
        idempotency_key: IdempotencyKey,
        /// Whether the caller set the key (the guard keeps a caller's key).
        #[serde(default)]
        key_from_caller: bool,
        /// JSON-RPC id of the request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jsonrpc_id: Option<RequestId>,
        /// Session of the request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<String>,
        /// The client that sent the request, as it named itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client_info: Option<ClientInfo>,
        /// The guard (one per agent process) that sent it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// An SSE event id was seen on the response (or resume) stream.
    EventSeen {
        /// The event id.
        last_event_id: String,
    },
    /// The call became an MCP task.
    TaskCreated {
        /// The task id.
        task_id: String,
    },
    /// The target answered.
    Completed {
        /// HTTP status of the answer.
        target_status: u16,
        /// Whether the tool reported an error (`isError: true`).
        is_error: bool,
        /// Where the result is kept, if it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result_reference: Option<String>,
    },
    /// The target refused the call before running the tool.
    Failed {
        /// HTTP status, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target_status: Option<u16>,
        /// Why.
        reason: String,
    },
    /// The outcome cannot be known.
    Unknown {
        /// HTTP status, when there was one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target_status: Option<u16>,
        /// Why.
        reason: String,
        /// The attempt whose outcome is unknown, when the writer is not that attempt's owner
        /// (a repeat that found it dispatched by a process that is gone). The event is then
        /// refused unless that attempt is still the latest: a newer attempt, dispatched
        /// meanwhile by a live owner, is never marked unknown by someone who saw the older one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
    },
    /// Provably never sent.
    NotSent {
        /// Why.
        reason: String,
    },
    /// The result reached the caller.
    Delivered {
        /// The JSON-RPC id it was delivered under.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        jsonrpc_id: Option<RequestId>,
    },
    /// A repeat of the call was answered from the ledger, nothing sent: how often an agent
    /// asked again, and what it was told. Changes nothing else.
    Repeated {
        /// `attached` (to a live attempt), `kept_result` (handed back), `held` (the outcome is
        /// unknown and nothing was re-sent), `result_not_kept`.
        answer: String,
    },
    /// The outcome is unknown and the tool may not be re-sent.
    NeedsReview {
        /// Why.
        reason: String,
    },
    /// A probe or an operator settled an unknown outcome.
    Resolved {
        /// Whether the action was applied.
        applied: bool,
        /// Who settled it (`probe`, `operator:<name>`).
        by: String,
        /// Why.
        note: String,
        /// The result, when the probe returned one and it was kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result_reference: Option<String>,
        /// The attempt a status probe was asked about. The event is then refused unless that
        /// attempt is still the latest and nothing is in flight: a probe's verdict on an
        /// older attempt never settles (or re-opens for a re-send) one dispatched meanwhile.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        /// What a status probe the operator ran answered before settling it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        probe: Option<String>,
    },
}

impl EventKind {
    /// The event's name (`dispatched`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Accepted { .. } => "accepted",
            Self::Authorized => "authorized",
            Self::KeyBound { .. } => "key_bound",
            Self::Denied { .. } => "denied",
            Self::Dispatched { .. } => "dispatched",
            Self::EventSeen { .. } => "event_seen",
            Self::TaskCreated { .. } => "task_created",
            Self::Completed { .. } => "completed",
            Self::Failed { .. } => "failed",
            Self::Unknown { .. } => "unknown",
            Self::NotSent { .. } => "not_sent",
            Self::Delivered { .. } => "delivered",
            Self::Repeated { .. } => "repeated",
            Self::NeedsReview { .. } => "needs_review",
            Self::Resolved { .. } => "resolved",
        }
    }
}

/// One appended event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEvent {
    /// The execution.
    pub execution_id: ExecutionId,
    /// When.
    pub at: Timestamp,
    /// What.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl LedgerEvent {
    /// Names where a `completed` event's result is kept (nothing for another event).
    pub(crate) fn set_result_reference(&mut self, reference: String) {
        if let EventKind::Completed {
            result_reference, ..
        } = &mut self.kind
        {
            *result_reference = Some(reference);
        }
    }
}

/// An execution as its events describe it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ExecutionRecord {
    /// The execution ID.
    pub(crate) execution_id: ExecutionId,
    /// The intent fingerprint.
    pub(crate) fingerprint: Fingerprint,
    /// The tool.
    pub(crate) tool: String,
    /// Who acts.
    pub(crate) actor: Actor,
    /// The intent scope.
    pub(crate) intent_scope: IntentScope,
    /// The target.
    pub(crate) target: Target,
    /// The credential reference.
    pub(crate) credential_ref: Option<CredentialRef>,
    /// The retry class of its contract.
    pub(crate) retry_class: RetryClass,
    /// Where it stands.
    pub(crate) state: ExecutionState,
    /// Protocol correlation of the latest attempt.
    pub(crate) correlation: Correlation,
    /// The key sent with its dispatches.
    pub(crate) idempotency_key: Option<IdempotencyKey>,
    /// The fingerprint of the call its key is bound to (server-side Idempotency-Key layer).
    pub(crate) request_fingerprint: Option<Fingerprint>,
    /// When it was accepted.
    pub(crate) accepted_at: Timestamp,
    /// When it was authorized.
    pub(crate) authorized_at: Option<Timestamp>,
    /// When it was first dispatched.
    pub(crate) dispatched_at: Option<Timestamp>,
    /// When the target's answer (or a settlement) was recorded.
    pub(crate) completed_at: Option<Timestamp>,
    /// When the result reached the caller.
    pub(crate) delivered_at: Option<Timestamp>,
    /// HTTP status of the target's answer.
    pub(crate) target_status: Option<u16>,
    /// Whether the tool reported an error.
    pub(crate) is_error: bool,
    /// Where the result is kept.
    pub(crate) result_reference: Option<String>,
    /// Number of dispatches.
    pub(crate) attempts: u32,
    /// Why the latest non-success state was entered (denial, failure, unknown, review).
    pub(crate) reason: Option<String>,
    /// Until when a repeat links to it.
    pub(crate) link_until: Timestamp,
    /// Until when it stays in the index: its retention counted from its last event (every
    /// event moves it), and never while an attempt may still be running (see
    /// [`is_linkable`](Self::is_linkable)).
    pub(crate) retain_until: Timestamp,
    /// How long it is retained after its last event, in milliseconds: what `retain_until` was
    /// past acceptance.
    pub(crate) retention_ms: u64,
    /// The guard that owns it: the one that accepted it, then the one that dispatched its
    /// latest attempt (ownership moves with every `dispatched` that names an owner).
    pub(crate) owner: String,
    /// The owners of earlier attempts that were still in doubt (`unknown`) when a later one
    /// was sent, each once: such an attempt may still be running at the target, so any of its
    /// owners alive holds the execution in retention as the owner does.
    pub(crate) earlier_owners: Vec<String>,
    /// The latest attempt was sent while an earlier one's outcome was unknown. If the latest
    /// then turns out `not_sent` or refused (`failed`), the execution is still `unknown`:
    /// that attempt never ran, the earlier one may have.
    pub(crate) earlier_attempt_unknown: bool,
}

/// What the record holds: read through these (the record is rebuilt from its events, never
/// edited by hand).
impl ExecutionRecord {
    /// The execution ID.
    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    /// The intent fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The tool.
    pub fn tool(&self) -> &str {
        &self.tool
    }

    /// Who acts.
    pub fn actor(&self) -> &Actor {
        &self.actor
    }

    /// The intent scope.
    pub fn intent_scope(&self) -> &IntentScope {
        &self.intent_scope
    }

    /// The target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The credential reference.
    pub fn credential_ref(&self) -> Option<&CredentialRef> {
        self.credential_ref.as_ref()
    }

    /// The retry class of its contract.
    pub fn retry_class(&self) -> RetryClass {
        self.retry_class
    }

    /// Where it stands.
    pub fn state(&self) -> ExecutionState {
        self.state
    }

    /// Protocol correlation of the latest attempt.
    pub fn correlation(&self) -> &Correlation {
        &self.correlation
    }

    /// The key sent with its dispatches.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.idempotency_key.as_ref()
    }

    /// The fingerprint of the call its key is bound to (server-side Idempotency-Key layer).
    pub fn request_fingerprint(&self) -> Option<&Fingerprint> {
        self.request_fingerprint.as_ref()
    }

    /// When it was accepted.
    pub fn accepted_at(&self) -> Timestamp {
        self.accepted_at
    }

    /// When it was authorized.
    pub fn authorized_at(&self) -> Option<Timestamp> {
        self.authorized_at
    }

    /// When it was first dispatched.
    pub fn dispatched_at(&self) -> Option<Timestamp> {
        self.dispatched_at
    }

    /// When the target's answer (or a settlement) was recorded.
    pub fn completed_at(&self) -> Option<Timestamp> {
        self.completed_at
    }

    /// When the result reached the caller.
    pub fn delivered_at(&self) -> Option<Timestamp> {
        self.delivered_at
    }

    /// HTTP status of the target's answer.
    pub fn target_status(&self) -> Option<u16> {
        self.target_status
    }

    /// Whether the tool reported an error.
    pub fn is_error(&self) -> bool {
        self.is_error
    }

    /// Where the result is kept.
    pub fn result_reference(&self) -> Option<&str> {
        self.result_reference.as_deref()
    }

    /// Number of dispatches.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Why the latest non-success state was entered (denial, failure, unknown, review).
    pub fn reason(&self) -> Option<&str> {
        self.reason.as_deref()
    }

    /// Until when a repeat links to it.
    pub fn link_until(&self) -> Timestamp {
        self.link_until
    }

    /// Until when it stays in the index: its retention counted from its last event (every
    /// event moves it), and never while an attempt may still be running (see
    /// [`is_linkable`](Self::is_linkable)).
    pub fn retain_until(&self) -> Timestamp {
        self.retain_until
    }

    /// The guard that owns it: the one that accepted it, then the one that dispatched its
    /// latest attempt (ownership moves with every `dispatched` that names an owner).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The owners of earlier attempts that were still in doubt (`unknown`) when a later one
    /// was sent, each once: such an attempt may still be running at the target, so any of its
    /// owners alive holds the execution in retention as the owner does.
    pub fn earlier_owners(&self) -> &[String] {
        &self.earlier_owners
    }

    /// The latest attempt was sent while an earlier one's outcome was unknown. If the latest
    /// then turns out `not_sent` or refused (`failed`), the execution is still `unknown`:
    /// that attempt never ran, the earlier one may have.
    pub fn earlier_attempt_unknown(&self) -> bool {
        self.earlier_attempt_unknown
    }
}

/// An event that the record's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("execution {execution_id} is {state}; a `{event}` event is not allowed there")]
#[non_exhaustive]
pub struct InvalidTransition {
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its state.
    pub state: ExecutionState,
    /// The refused event.
    pub event: &'static str,
}

impl ExecutionRecord {
    /// The record an `accepted` event creates.
    pub fn from_accepted(event: &LedgerEvent) -> Option<Self> {
        let EventKind::Accepted {
            fingerprint,
            tool,
            actor,
            intent_scope,
            target,
            credential_ref,
            retry_class,
            link_until,
            retain_until,
            owner,
        } = &event.kind
        else {
            return None;
        };
        Some(Self {
            execution_id: event.execution_id,
            fingerprint: *fingerprint,
            tool: tool.clone(),
            actor: actor.clone(),
            intent_scope: intent_scope.clone(),
            target: target.clone(),
            credential_ref: credential_ref.clone(),
            retry_class: *retry_class,
            state: ExecutionState::Accepted,
            correlation: Correlation::default(),
            idempotency_key: None,
            request_fingerprint: None,
            accepted_at: event.at,
            authorized_at: None,
            dispatched_at: None,
            completed_at: None,
            delivered_at: None,
            target_status: None,
            is_error: false,
            result_reference: None,
            attempts: 0,
            reason: None,
            link_until: *link_until,
            retain_until: *retain_until,
            retention_ms: retain_until
                .as_millis()
                .saturating_sub(event.at.as_millis()),
            owner: owner.clone(),
            earlier_owners: Vec::new(),
            earlier_attempt_unknown: false,
        })
    }

    /// Applies one event: the state machine. An event the state does not allow is refused and
    /// the record is left as it was. An event it takes moves `retain_until` to its retention
    /// past the event, if that is later: retention counts from the last event.
    pub fn apply(&mut self, event: &LedgerEvent) -> Result<(), InvalidTransition> {
        self.transition(event)?;
        let until = Timestamp::from_millis(event.at.as_millis().saturating_add(self.retention_ms));
        self.retain_until = self.retain_until.max(until);
        Ok(())
    }

    /// The state machine of [`apply`](Self::apply).
    ///
    /// Longer than most functions: one `match` over (state, event) with an arm per allowed
    /// transition, kept whole so that the machine reads in one place.
    fn transition(&mut self, event: &LedgerEvent) -> Result<(), InvalidTransition> {
        use ExecutionState as S;
        let refuse = || InvalidTransition {
            execution_id: self.execution_id,
            state: self.state,
            event: event.kind.name(),
        };
        let at = event.at;
        match &event.kind {
            EventKind::Accepted { .. } => return Err(refuse()),
            EventKind::Authorized => {
                if self.state != S::Accepted {
                    return Err(refuse());
                }
                self.state = S::Authorized;
                self.authorized_at = Some(at);
            }
            EventKind::KeyBound {
                request_fingerprint,
            } => {
                if self.state != S::Accepted || self.request_fingerprint.is_some() {
                    return Err(refuse());
                }
                self.request_fingerprint = Some(*request_fingerprint);
            }
            EventKind::Denied { reason } => {
                if !matches!(self.state, S::Accepted | S::Authorized) {
                    return Err(refuse());
                }
                self.state = S::Denied;
                self.reason = Some(reason.clone());
            }
            EventKind::Dispatched {
                attempt,
                idempotency_key,
                jsonrpc_id,
                session_id,
                client_info,
                owner,
                ..
            } => {
                // A dispatch starts an execution, continues one that never left, re-sends an
                // idempotent or read-only one, or re-sends after a probe said "not applied".
                // Its attempt number must be new: of two processes that both saw attempt n
                // and both try attempt n + 1, only the first is recorded (and may send).
                if !matches!(
                    self.state,
                    S::Accepted | S::Authorized | S::NotSent | S::Unknown | S::ResolvedNotApplied
                ) || *attempt <= self.attempts
                {
                    return Err(refuse());
                }
                // Re-sent over an unknown outcome (a settled one, not applied, is no longer a
                // doubt; a never-sent one never was).
                self.earlier_attempt_unknown = self.state == S::Unknown;
                self.state = S::Dispatched;
                // Ownership moves with every dispatch: the dispatching guard owns the attempt
                // in flight, and its liveness is what a repeat asks about.
                // The owner of an attempt in doubt is kept: that attempt may still run.
                if let Some(owner) = owner {
                    if self.earlier_attempt_unknown
                        && self.owner != *owner
                        && !self.earlier_owners.contains(&self.owner)
                    {
                        self.earlier_owners.push(self.owner.clone());
                    }
                    self.owner = owner.clone();
                }
                self.dispatched_at.get_or_insert(at);
                self.attempts = (*attempt).max(self.attempts + 1);
                self.idempotency_key = Some(idempotency_key.clone());
                self.correlation.jsonrpc_id = jsonrpc_id.clone();
                self.correlation.session_id = session_id.clone();
                self.correlation.client_info = client_info.clone();
                self.correlation.last_event_id = None;
                self.reason = None;
            }
            EventKind::EventSeen { last_event_id } => {
                self.correlation.last_event_id = Some(last_event_id.clone());
            }
            // A count in the events, in any state: nothing of the record changes.
            EventKind::Repeated { .. } => {}
            EventKind::TaskCreated { task_id } => {
                self.correlation.task_id = Some(task_id.clone());
            }
            EventKind::Completed {
                target_status,
                is_error,
                result_reference,
            } => {
                // After a resolution too: the target's own answer outranks an operator's (or a
                // probe's) judgement, and both stay in the events, where the conflict shows.
                if !matches!(
                    self.state,
                    S::Dispatched
                        | S::Unknown
                        | S::NeedsReview
                        | S::ResolvedApplied
                        | S::ResolvedNotApplied
                ) {
                    return Err(refuse());
                }
                self.state = S::Completed;
                self.completed_at = Some(at);
                self.target_status = Some(*target_status);
                self.is_error = *is_error;
                self.result_reference = result_reference.clone();
                self.reason = None;
            }
            EventKind::Failed {
                target_status,
                reason,
            } => {
                if self.state != S::Dispatched {
                    return Err(refuse());
                }
                self.target_status = *target_status;
                self.attempt_did_not_run("was refused", reason, S::Failed, at);
            }
            EventKind::Unknown {
                target_status,
                reason,
                attempt,
            } => {
                if self.state != S::Dispatched || attempt.is_some_and(|a| a != self.attempts) {
                    return Err(refuse());
                }
                self.state = S::Unknown;
                self.target_status = *target_status;
                self.reason = Some(reason.clone());
            }
            EventKind::NotSent { reason } => {
                if self.state != S::Dispatched {
                    return Err(refuse());
                }
                self.attempt_did_not_run("was not sent", reason, S::NotSent, at);
            }
            EventKind::Delivered { .. } => {
                if !matches!(
                    self.state,
                    S::Completed | S::Failed | S::ResolvedApplied | S::Denied
                ) {
                    return Err(refuse());
                }
                self.delivered_at.get_or_insert(at);
            }
            EventKind::NeedsReview { reason } => {
                if !matches!(self.state, S::Unknown | S::Dispatched) {
                    return Err(refuse());
                }
                self.state = S::NeedsReview;
                self.reason = Some(reason.clone());
            }
            EventKind::Resolved {
                applied,
                note,
                result_reference,
                attempt,
                ..
            } => {
                if !matches!(self.state, S::Unknown | S::NeedsReview | S::Dispatched)
                    || attempt.is_some_and(|a| a != self.attempts || self.state == S::Dispatched)
                {
                    return Err(refuse());
                }
                self.state = if *applied {
                    S::ResolvedApplied
                } else {
                    S::ResolvedNotApplied
                };
                self.completed_at = Some(at);
                self.reason = Some(note.clone());
                if result_reference.is_some() {
                    self.result_reference = result_reference.clone();
                }
            }
        }
        Ok(())
    }

    /// The latest attempt did not run (`what`: "was not sent", "was refused"): the execution
    /// is `settled`, unless an earlier attempt's outcome is unknown, which it then still is
    /// (that one may have run).
    fn attempt_did_not_run(
        &mut self,
        what: &str,
        reason: &str,
        settled: ExecutionState,
        at: Timestamp,
    ) {
        if self.earlier_attempt_unknown {
            self.state = ExecutionState::Unknown;
            self.reason = Some(format!(
                "attempt {} {what} ({reason}); the outcome of an earlier attempt is still unknown",
                self.attempts
            ));
        } else {
            self.state = settled;
            if settled == ExecutionState::Failed {
                self.completed_at = Some(at);
            }
            self.reason = Some(reason.to_owned());
        }
    }

    /// Whether a repeat of the same intent at `now` links to this execution (two clocks: the
    /// link window and retention).
    ///
    /// - Nothing links once the record's retention ended, but an execution whose attempt may
    ///   still be running never leaves retention: here its owner is taken to be alive (a
    ///   ledger asks its owners when it claims).
    /// - An unsettled execution ([`ExecutionState::is_unsettled`]: in flight, dispatched by an
    ///   owner that is gone, unknown, needs review) links whatever its link window says: no
    ///   window may turn an unknown outcome into a second dispatch.
    /// - The link window limits only how long a settled result is handed back (completed or
    ///   resolved as applied and not yet delivered, a repeated denial) and how long a never-sent
    ///   (`not_sent`) execution is continued.
    /// - Never linkable: failed (the target refused it), settled as not applied, and a result
    ///   that reached the caller (a repeat after that is a new intent).
    ///
    /// The rule is the execution model's link rule; the record only answers it.
    pub fn is_linkable(&self, now: Timestamp) -> bool {
        crate::execution::is_linkable(self, now, now, false, |_| true)
    }

    /// The state as the JSON form spells it: a completed record without delivery is
    /// `completed_result_not_delivered`; a delivered one `delivered`.
    pub fn state_label(&self) -> &'static str {
        match (self.state, self.delivered_at) {
            (ExecutionState::Completed, None) => "completed_result_not_delivered",
            (ExecutionState::Completed, Some(_)) => "delivered",
            (state, _) => state.as_str(),
        }
    }
}

/// The JSON form of a record, as incident reports show it.
impl Serialize for ExecutionRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("execution_id", &self.execution_id)?;
        map.serialize_entry("fingerprint", &self.fingerprint)?;
        map.serialize_entry("tool", &self.tool)?;
        map.serialize_entry("actor", &self.actor)?;
        map.serialize_entry("intent_scope", &self.intent_scope)?;
        map.serialize_entry("target", &self.target)?;
        if let Some(c) = &self.credential_ref {
            map.serialize_entry("credential_ref", c)?;
        }
        map.serialize_entry("retry_class", &self.retry_class)?;
        map.serialize_entry("state", self.state_label())?;
        map.serialize_entry("correlation", &self.correlation)?;
        if let Some(k) = &self.idempotency_key {
            map.serialize_entry("idempotency_key", k)?;
        }
        if let Some(f) = &self.request_fingerprint {
            map.serialize_entry("request_fingerprint", f)?;
        }
        map.serialize_entry("accepted_at", &self.accepted_at)?;
        for (name, value) in [
            ("authorized_at", self.authorized_at),
            ("dispatched_at", self.dispatched_at),
            ("completed_at", self.completed_at),
            ("delivered_at", self.delivered_at),
        ] {
            if let Some(t) = value {
                map.serialize_entry(name, &t)?;
            }
        }
        if let Some(s) = self.target_status {
            map.serialize_entry("target_status", &s)?;
        }
        if self.is_error {
            map.serialize_entry("is_error", &true)?;
        }
        if let Some(r) = &self.result_reference {
            map.serialize_entry("result_reference", r)?;
        }
        map.serialize_entry("attempts", &self.attempts)?;
        if let Some(r) = &self.reason {
            map.serialize_entry("reason", r)?;
        }
        map.end()
    }
}

/// Records the unit tests of the ledger and the guard build by hand.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::time::Duration;

    use super::*;
    use crate::execution::Claim;

    /// A claim of `retry_class` by `owner`: zero fingerprint, placeholder names, a 60 s link
    /// window and retention, at 0 ms.
    pub(crate) fn claim(retry_class: RetryClass, owner: &str) -> Claim {
        Claim {
            fingerprint:
                "hmac-sha256:0000000000000000000000000000000000000000000000000000000000000000"
                    .parse()
                    .unwrap(),
            tool: "t".into(),
            actor: "a".into(),
            intent_scope: "s".into(),
            target: "srv".into(),
            credential_ref: None,
            retry_class,
            link_window: Duration::from_secs(60),
            retention: Duration::from_secs(60),
            owner: owner.into(),
            at: Timestamp::from_millis(0),
            asked_at: None,
            waited: false,
        }
    }

    /// The record `claim` starts, under a new execution id.
    pub(crate) fn accepted(claim: &Claim) -> ExecutionRecord {
        ExecutionRecord::from_accepted(&claim.accepted_event(ExecutionId::new())).unwrap()
    }

    /// An event of `id` at `ms`.
    pub(crate) fn event_at(id: ExecutionId, ms: u64, kind: EventKind) -> LedgerEvent {
        LedgerEvent {
            execution_id: id,
            at: Timestamp::from_millis(ms),
            kind,
        }
    }

    /// Attempt `attempt` of `id` sent under its own key (no JSON-RPC id, no session), by
    /// `owner`.
    pub(crate) fn dispatched(id: ExecutionId, attempt: u32, owner: Option<&str>) -> EventKind {
        EventKind::Dispatched {
            attempt,
            idempotency_key: IdempotencyKey::from(id),
            key_from_caller: false,
            jsonrpc_id: None,
            session_id: None,
            client_info: None,
            owner: owner.map(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fixtures::event_at, *};

    #[test]
    fn client_info_is_bounded_and_never_carries_control_characters() {
        let long = "é".repeat(ClientInfo::MAX_LEN);
        let info = ClientInfo::from_json(&serde_json::json!({
            "name": format!("agent\u{1b}[2J{long}"), "version": 7,
        }))
        .unwrap();
        assert!(info.name.starts_with("agent\u{fffd}[2J"), "{info:?}");
        assert!(
            info.name.len() <= ClientInfo::MAX_LEN + 2,
            "{}",
            info.name.len()
        );
        assert_eq!(info.version, None);
        assert_eq!(
            ClientInfo::from_json(&serde_json::json!({"version": "1"})),
            None
        );
        // A record written before client info existed reads as before.
        let old: Correlation = serde_json::from_str(r#"{"session_id":"s"}"#).unwrap();
        assert_eq!(old.client_info, None);
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"session_id":"s"}"#
        );
    }

    fn accepted(owner: &str) -> ExecutionRecord {
        fixtures::accepted(&fixtures::claim(RetryClass::Idempotent, owner))
    }

    fn apply(record: &mut ExecutionRecord, kind: EventKind) -> Result<(), InvalidTransition> {
        record.apply(&event_at(record.execution_id, 1, kind))
    }

    fn dispatched(id: ExecutionId, attempt: u32, owner: &str) -> EventKind {
        fixtures::dispatched(id, attempt, Some(owner))
    }

    fn unknown(attempt: Option<u32>) -> EventKind {
        EventKind::Unknown {
            target_status: None,
            reason: "gone".into(),
            attempt,
        }
    }

    /// The dispatching guard owns the attempt in flight, whoever accepted the
    /// execution.
    #[test]
    fn ownership_moves_with_every_dispatch() {
        let mut r = accepted("guard:one");
        let id = r.execution_id;
        apply(&mut r, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut r, unknown(None)).unwrap();
        apply(&mut r, dispatched(id, 2, "guard:two")).unwrap();
        assert_eq!((r.owner.as_str(), r.attempts), ("guard:two", 2));
        // The first attempt was in doubt when the second was sent: its owner is kept.
        assert_eq!(r.earlier_owners, ["guard:one"]);
        // A dispatch that names no owner (an older writer) leaves the owner as it was.
        apply(&mut r, unknown(None)).unwrap();
        let mut anonymous = dispatched(id, 3, "x");
        if let EventKind::Dispatched { owner, .. } = &mut anonymous {
            *owner = None;
        }
        apply(&mut r, anonymous).unwrap();
        assert_eq!(r.owner, "guard:two");
        // Each owner once, in the order their attempts were sent.
        apply(&mut r, unknown(None)).unwrap();
        apply(&mut r, dispatched(id, 4, "guard:one")).unwrap();
        assert_eq!(r.earlier_owners, ["guard:one", "guard:two"]);
        apply(&mut r, unknown(None)).unwrap();
        apply(&mut r, dispatched(id, 5, "guard:two")).unwrap();
        assert_eq!(r.earlier_owners, ["guard:one", "guard:two"]);
    }

    fn not_sent() -> EventKind {
        EventKind::NotSent {
            reason: "refused".into(),
        }
    }

    /// Found by the simulator (seed 1592590567): a re-send of an execution whose first
    /// attempt's outcome is unknown fails before a byte leaves. That attempt was not sent, but
    /// the first may have run: the execution stays `unknown` (a `not_sent` would be continued,
    /// or past its link window replaced by a new execution: a second effect).
    #[test]
    fn a_resend_that_was_not_sent_leaves_an_unknown_execution_unknown() {
        let mut r = accepted("guard:one");
        let id = r.execution_id;
        apply(&mut r, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut r, unknown(Some(1))).unwrap();
        apply(&mut r, dispatched(id, 2, "guard:two")).unwrap();
        apply(&mut r, not_sent()).unwrap();
        assert_eq!(r.state, ExecutionState::Unknown);
        assert!(r.is_linkable(Timestamp::from_millis(59_000)));
        // A third attempt that is not sent either: still unknown.
        apply(&mut r, dispatched(id, 3, "guard:two")).unwrap();
        apply(&mut r, not_sent()).unwrap();
        assert_eq!(r.state, ExecutionState::Unknown);
        // Once a probe settled the first attempt as not applied, a re-send that was not
        // sent is what it says.
        let mut settled = accepted("guard:one");
        let id = settled.execution_id;
        apply(&mut settled, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut settled, unknown(Some(1))).unwrap();
        let verdict = EventKind::Resolved {
            applied: false,
            by: "probe".into(),
            note: "not applied".into(),
            result_reference: None,
            attempt: Some(1),
            probe: None,
        };
        apply(&mut settled, verdict).unwrap();
        apply(&mut settled, dispatched(id, 2, "guard:one")).unwrap();
        apply(&mut settled, not_sent()).unwrap();
        assert_eq!(settled.state, ExecutionState::NotSent);
        // An execution that never left, continued and not sent again, is not sent.
        let mut never = accepted("guard:one");
        let id = never.execution_id;
        apply(&mut never, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut never, not_sent()).unwrap();
        apply(&mut never, dispatched(id, 2, "guard:one")).unwrap();
        apply(&mut never, not_sent()).unwrap();
        assert_eq!(never.state, ExecutionState::NotSent);
    }

    /// Found by the simulator (seed 1592590620): the re-send of an unknown execution is
    /// refused (429). The refusal proves that attempt did not run, not the first: the
    /// execution stays `unknown` (a `failed` is never linked, so the next repeat ran as a new
    /// execution: a second effect).
    #[test]
    fn a_resend_that_was_refused_leaves_an_unknown_execution_unknown() {
        let refused = || EventKind::Failed {
            target_status: Some(429),
            reason: "refused before running".into(),
        };
        let mut r = accepted("guard:one");
        let id = r.execution_id;
        apply(&mut r, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut r, unknown(Some(1))).unwrap();
        apply(&mut r, dispatched(id, 2, "guard:one")).unwrap();
        apply(&mut r, refused()).unwrap();
        assert_eq!(r.state, ExecutionState::Unknown);
        assert_eq!(r.target_status, Some(429));
        assert!(r.is_linkable(Timestamp::from_millis(59_000)));
        // Refused on its first attempt: failed, as before.
        let mut first = accepted("guard:one");
        let id = first.execution_id;
        apply(&mut first, dispatched(id, 1, "guard:one")).unwrap();
        apply(&mut first, refused()).unwrap();
        assert_eq!(first.state, ExecutionState::Failed);
    }

    /// Two processes that both saw attempt 1 end with a dead owner: the first to record
    /// attempt 2 wins; the second's `unknown` for attempt 1 and its own attempt 2 are refused,
    /// and the record is left as the winner wrote it.
    #[test]
    fn only_one_of_two_continuations_of_one_attempt_is_recorded() {
        let mut r = accepted("guard:one");
        let id = r.execution_id;
        apply(&mut r, dispatched(id, 1, "guard:one")).unwrap();
        let seen = r.clone();
        // The winner: attempt 1 is unknown, attempt 2 is its own.
        apply(&mut r, unknown(Some(seen.attempts))).unwrap();
        apply(&mut r, dispatched(id, seen.attempts + 1, "guard:two")).unwrap();
        let won = r.clone();
        // The loser, from what it saw: both refused.
        let error = apply(&mut r, unknown(Some(seen.attempts))).unwrap_err();
        assert_eq!(error.event, "unknown");
        assert_eq!(r, won);
        apply(&mut r, unknown(None)).unwrap();
        let error = apply(&mut r, dispatched(id, seen.attempts + 1, "guard:three")).unwrap_err();
        assert_eq!(error.event, "dispatched");
        assert_eq!((r.owner.as_str(), r.attempts), ("guard:two", 2));
        // A status probe's verdict on attempt 1, asked before attempt 2 left, settles nothing.
        for applied in [true, false] {
            let verdict = EventKind::Resolved {
                applied,
                by: "probe".into(),
                note: "asked about attempt 1".into(),
                result_reference: None,
                attempt: Some(1),
                probe: None,
            };
            let error = apply(&mut r, verdict).unwrap_err();
            assert_eq!(error.event, "resolved");
        }
        // An `unknown` for the latest attempt applies.
        let mut fresh = won.clone();
        apply(&mut fresh, unknown(Some(2))).unwrap();
        assert_eq!(fresh.state, ExecutionState::Unknown);
    }
}

#[cfg(test)]
mod retention_and_resolution {
    use super::{fixtures::event_at, *};

    fn resolved(applied: bool) -> EventKind {
        EventKind::Resolved {
            applied,
            by: "operator:bob".into(),
            note: "checked".into(),
            result_reference: None,
            attempt: Some(1),
            probe: None,
        }
    }

    fn completed() -> EventKind {
        EventKind::Completed {
            target_status: 200,
            is_error: false,
            result_reference: None,
        }
    }

    /// Retention counts from the last event: the fixture's 60 s moves with every event the
    /// state machine takes, never back, and a refused event moves nothing.
    #[test]
    fn every_event_moves_retention_to_its_span_past_the_event() {
        let mut r = fixtures::accepted(&fixtures::claim(RetryClass::Irreversible, "o"));
        let id = r.execution_id;
        assert_eq!(r.retain_until, Timestamp::from_millis(60_000));
        r.apply(&event_at(
            id,
            90_000,
            fixtures::dispatched(id, 1, Some("o")),
        ))
        .unwrap();
        assert_eq!(r.retain_until, Timestamp::from_millis(150_000));
        let unknown = EventKind::Unknown {
            target_status: None,
            reason: "cut".into(),
            attempt: Some(1),
        };
        r.apply(&event_at(id, 86_400_000, unknown)).unwrap();
        assert_eq!(r.retain_until, Timestamp::from_millis(86_460_000));
        // An event stamped earlier (another process's clock) never shortens it.
        let review = EventKind::NeedsReview {
            reason: "held".into(),
        };
        r.apply(&event_at(id, 1_000, review)).unwrap();
        assert_eq!(r.retain_until, Timestamp::from_millis(86_460_000));
        assert!(
            r.apply(&event_at(id, 99_999_999, EventKind::Authorized))
                .is_err()
        );
        assert_eq!(r.retain_until, Timestamp::from_millis(86_460_000));
        // The link window does not move: it bounds only how long a result is handed back.
        assert_eq!(r.link_until, Timestamp::from_millis(60_000));
    }

    /// An operator who settled a call before its real answer came is not the last word: the
    /// target's `completed` is recorded after the `resolved` (it used to be refused and lost).
    #[test]
    fn the_targets_answer_after_a_resolution_is_recorded() {
        for applied in [false, true] {
            let mut r = fixtures::accepted(&fixtures::claim(RetryClass::Irreversible, "o"));
            let id = r.execution_id;
            r.apply(&event_at(id, 1, fixtures::dispatched(id, 1, Some("o"))))
                .unwrap();
            let review = EventKind::NeedsReview {
                reason: "held".into(),
            };
            r.apply(&event_at(id, 2, review)).unwrap();
            r.apply(&event_at(id, 3, resolved(applied))).unwrap();
            r.apply(&event_at(id, 4, completed())).unwrap();
            assert_eq!(r.state, ExecutionState::Completed, "applied={applied}");
            assert_eq!(r.target_status, Some(200));
            // Settled for good now: no second resolution.
            assert!(r.apply(&event_at(id, 5, resolved(!applied))).is_err());
        }
    }
}
