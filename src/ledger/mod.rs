//! The execution ledger: every accepted action's lifecycle, and the record every retry is
//! decided from.
//!
//! Each transition is an appended, timestamped [`LedgerEvent`]; an [`ExecutionRecord`] is the
//! fold of an execution's events through the state machine ([`ExecutionRecord::apply`]), which
//! refuses transitions its state does not allow. The one operation that must be atomic is
//! [`Ledger::claim`]: find the linkable execution of an intent, or create it, with exactly one
//! winner among concurrent callers.
//!
//! # What is recorded
//!
//! The fingerprint, never the arguments; the credential *reference*, never a credential; no
//! HTTP header except the `Idempotency-Key` the guard itself sent. Results are kept apart,
//! under a `result_reference`, when the tool's contract says so and they fit its size cap.

pub mod audit;
pub mod chain;
mod compact;
mod file;
mod index;
mod key_id;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
pub(crate) mod retry;
mod shared;
mod verify;

use std::{fmt, sync::Arc};

use async_trait::async_trait;
use bytes::Bytes;

#[cfg(feature = "simulation")]
pub use file::Disk;
pub use file::{CompactReport, FileLedger, verify_file};
pub(crate) use index::IntentKey;
pub use memory::MemoryLedger;
#[cfg(feature = "postgres")]
pub use postgres::PostgresLedger;
// The values every ledger stores (the execution model), named here for the ledgers' own files.
use crate::execution::{
    Claim, Claimed, ClientInfo, Dispatch, EventKind, ExecutionRecord, ExecutionState,
    InvalidTransition, LedgerEvent, Timestamp,
};
pub use verify::verify_file_anchored;

use crate::ExecutionId;

/// A ledger operation that failed. The guard never sends a request whose dispatch it could
/// not record.
///
/// A storage failure keeps the error it came from (an I/O, JSON or PostgreSQL error):
/// [`source`](std::error::Error::source) returns it.
#[derive(Debug)]
#[non_exhaustive]
pub enum LedgerError {
    /// The event is not allowed in the execution's state.
    InvalidTransition(InvalidTransition),
    /// No such execution (or it left the index after its retention).
    NotFound(ExecutionId),
    /// The storage failed.
    Storage(StorageError),
    /// An attempt of the execution may still be running: it is in flight and the process
    /// that owns it is alive. Only its own answer settles it; an operator waits for it, or
    /// stops that process first.
    StillRunning {
        /// The execution.
        execution_id: ExecutionId,
        /// Its state (accepted, authorized or dispatched).
        state: ExecutionState,
        /// The guard that owns the attempt.
        owner: String,
    },
}

impl LedgerError {
    /// Whether the event was refused by the state machine.
    pub fn is_invalid_transition(&self) -> bool {
        matches!(self, Self::InvalidTransition(_))
    }

    /// Whether the storage failed (a connection cut, a server that did not answer): the same
    /// write may be recorded when tried again, and whether this try was recorded is unknown.
    /// A refusal of the state machine, or an execution that is not there, is not transient.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Storage(_))
    }

    /// Whether the execution may still be running under a live owner
    /// ([`LedgerError::StillRunning`]).
    pub fn is_still_running(&self) -> bool {
        matches!(self, Self::StillRunning { .. })
    }

    /// A storage failure described by `message`, with no error under it.
    pub(crate) fn storage(message: impl Into<String>) -> Self {
        Self::Storage(StorageError::from(message.into()))
    }

    /// A storage failure caused by `source`, described by `message`.
    pub(crate) fn caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Storage(StorageError::caused(message, source))
    }
}

impl From<InvalidTransition> for LedgerError {
    fn from(error: InvalidTransition) -> Self {
        Self::InvalidTransition(error)
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidTransition(e) => fmt::Display::fmt(e, f),
            Self::NotFound(id) => write!(f, "no execution {id} in the ledger"),
            Self::Storage(e) => write!(f, "ledger storage failed: {e}"),
            Self::StillRunning {
                execution_id,
                state,
                owner,
            } => write!(
                f,
                "execution {execution_id} is {state} and its owner ({owner}) is still running: \
                 the call may be in flight, and only its own answer settles it. Wait for it to \
                 end, or stop that process first (then the outcome is unknown and can be \
                 resolved)"
            ),
        }
    }
}

impl std::error::Error for LedgerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the refusal is the error itself.
            Self::InvalidTransition(e) => std::error::Error::source(e),
            Self::NotFound(_) | Self::StillRunning { .. } => None,
            Self::Storage(e) => std::error::Error::source(e),
        }
    }
}

/// Why the storage failed: a message for people and, when one caused it, the underlying
/// error (its [`source`](std::error::Error::source)).
///
/// # Clone
///
/// Clones share the source: one failed write fails every call of its batch with it.
#[derive(Debug, Clone)]
pub struct StorageError {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl StorageError {
    /// A failure described by `message`, caused by `source`.
    pub(crate) fn caused(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The description.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same failure, its description rewritten (a password redacted, a path added).
    pub(crate) fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        Self {
            message: f(self.message),
            source: self.source,
        }
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for StorageError {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for StorageError {
    fn from(message: &str) -> Self {
        Self::from(message.to_owned())
    }
}

/// Where executions are recorded. Implementations: [`MemoryLedger`]; durable ones arrive with
/// their own features.
#[async_trait]
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Finds the linkable execution of `(actor, intent scope, fingerprint)` (see
    /// [`ExecutionRecord::is_linkable`]: an unsettled one until its retention ends, a settled
    /// one inside its link window), or creates one in state `accepted`. Atomic: among
    /// concurrent claims of one intent exactly one gets [`Claimed::New`].
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError>;

    /// [`claim`](Ledger::claim), and when it creates the execution, its first attempt's
    /// `dispatched` (by the claim's owner) with it: the claim is then
    /// [`Claimed::New`] in state `dispatched`. The bundled ledgers write both events at once
    /// (one sync of the file ledger before the request leaves); the default claims, then
    /// appends.
    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        let owner = claim.owner.clone();
        match self.claim(claim).await? {
            Claimed::New(record) => {
                let event = dispatch.event(&record, &owner, record.accepted_at);
                self.append(event).await.map(Claimed::New)
            }
            existing => Ok(existing),
        }
    }

    /// Appends an event and returns the updated record. Refused (and nothing written) when the
    /// state machine does not allow it.
    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError>;

    /// Appends an event whose loss in a crash can only make later decisions more careful
    /// (`delivered`: without it a repeat is handed the kept result instead of starting a new
    /// execution). A durable ledger may acknowledge it once written and make it durable with
    /// its next sync; the default appends it like any other.
    async fn append_unsynced(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        self.append(event).await
    }

    /// Appends `completed` together with the result it keeps: never a kept result without its
    /// `completed`, never a `completed` naming a result that is not there. `result: None`
    /// keeps none; with a result, the event's `result_reference` is set to its reference. A
    /// result the ledger cannot keep (not JSON, too large for its storage) is left out, with
    /// a warning, and `completed` is still recorded. The bundled ledgers write both at once;
    /// the default keeps the result, then appends.
    async fn complete(
        &self,
        mut event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        if let Some(result) = result {
            match self.store_result(event.execution_id, result).await {
                Ok(reference) => event.set_result_reference(reference),
                Err(error) => {
                    tracing::warn!(execution_id = %event.execution_id, %error, "could not keep the result")
                }
            }
        }
        self.append(event).await
    }

    /// The record of an execution.
    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError>;

    /// The events of an execution, oldest first.
    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError>;

    /// Every execution still in the index.
    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError>;

    /// Keeps a completed result (the JSON of the JSON-RPC `result` member) and returns its
    /// reference.
    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError>;

    /// A kept result.
    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError>;

    /// Whether the owner of an execution (the guard, in some process, that accepted it or
    /// dispatched its latest attempt: ownership moves with every `dispatched`) is still
    /// running, so that its attempt may still finish. Ledgers shared between
    /// processes answer from a liveness signal; the default says yes, which makes a repeat wait
    /// for the attempt (bounded) rather than continue it.
    async fn is_owner_alive(&self, owner: &str) -> bool {
        let _ = owner;
        true
    }
}

/// The reference under which an execution's result is kept.
pub fn result_reference(execution_id: ExecutionId) -> String {
    format!("result_{}", execution_id.ulid())
}
