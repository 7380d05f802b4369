//! `GuardError`: what a guarded call failed on, and whether anything left.

use std::fmt;

use crate::{BoxError, ExecutionId, ledger::LedgerError, protocol::RequestId};

/// An error of the guarded service.
#[derive(Debug)]
pub struct GuardError {
    kind: ErrorKind,
    execution_id: Option<ExecutionId>,
    /// The call a failed resume continued (with `execution_id`, its execution).
    resumed: Option<RequestId>,
    source: BoxError,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    NotSent,
    Unknown,
    Ledger,
    RequestBody,
    Inner,
}

impl GuardError {
    pub(crate) fn not_sent(id: ExecutionId, source: BoxError) -> Self {
        Self {
            kind: ErrorKind::NotSent,
            execution_id: Some(id),
            resumed: None,
            source,
        }
    }
    pub(crate) fn unknown(id: ExecutionId, source: BoxError) -> Self {
        Self {
            kind: ErrorKind::Unknown,
            execution_id: Some(id),
            resumed: None,
            source,
        }
    }
    pub(crate) fn ledger(source: LedgerError) -> Self {
        Self {
            kind: ErrorKind::Ledger,
            execution_id: None,
            resumed: None,
            source: source.into(),
        }
    }
    pub(crate) fn request_body(source: BoxError) -> Self {
        Self {
            kind: ErrorKind::RequestBody,
            execution_id: None,
            resumed: None,
            source,
        }
    }
    pub(crate) fn inner(source: impl Into<BoxError>) -> Self {
        Self {
            kind: ErrorKind::Inner,
            execution_id: None,
            resumed: None,
            source: source.into(),
        }
    }

    /// The transport failed before the request was sent: safe to send again (the guard
    /// continues the same execution).
    pub fn is_not_sent(&self) -> bool {
        self.kind == ErrorKind::NotSent
    }

    /// The transport failed after the request may have been sent: the outcome is unknown.
    pub fn is_unknown(&self) -> bool {
        self.kind == ErrorKind::Unknown
    }

    /// The ledger failed; nothing was sent if the failure was on `dispatched`.
    pub fn is_ledger(&self) -> bool {
        self.kind == ErrorKind::Ledger
    }

    /// Reading the caller's request body failed; nothing was sent.
    pub fn is_request_body(&self) -> bool {
        self.kind == ErrorKind::RequestBody
    }

    /// The inner service failed on a request the guard passed through.
    pub fn is_inner(&self) -> bool {
        self.kind == ErrorKind::Inner
    }

    pub(crate) fn is_ledger_transition(&self) -> bool {
        self.source
            .downcast_ref::<LedgerError>()
            .is_some_and(LedgerError::is_invalid_transition)
    }

    /// A resume (GET with `Last-Event-ID`) of the broken stream of execution `id`, answering
    /// the call `request`, failed: the stream stays linked to its execution for a later
    /// resume.
    pub(crate) fn resuming(mut self, id: ExecutionId, request: RequestId) -> Self {
        self.execution_id = Some(id);
        self.resumed = Some(request);
        self
    }

    /// The execution the error belongs to, for `not_sent` and `unknown`, and for a failed
    /// resume of an execution's stream.
    pub fn execution_id(&self) -> Option<ExecutionId> {
        self.execution_id
    }

    /// For a resume of an execution's broken stream that failed (the target could not be
    /// reached, say): the JSON-RPC id of the call that stream answers, whose answer is still
    /// owed to the caller ([`Guard::unanswered`](super::Guard::unanswered) gives the guard's own for it).
    pub fn resumed_call(&self) -> Option<&RequestId> {
        self.resumed.as_ref()
    }
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ErrorKind::NotSent => "not sent",
            ErrorKind::Unknown => "outcome unknown",
            ErrorKind::Ledger => "ledger failed",
            ErrorKind::RequestBody => "could not read the request body",
            ErrorKind::Inner => "inner service failed",
        };
        match self.execution_id {
            Some(id) => write!(f, "{what} (execution {id})"),
            None => f.write_str(what),
        }
    }
}

impl std::error::Error for GuardError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
