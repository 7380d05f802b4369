//! What the guard does with a `tools/call`, decided from its ledger claim.
//!
//! There is no "resume" decision: a broken response stream is resumed by `ResumeLayer` on the
//! call's own body before the caller sees an error, and a GET with `Last-Event-ID` that a
//! client issues itself is linked to its execution by the guard's resume links. A repeated
//! `tools/call` is a new POST, which no `Last-Event-ID` continues, so it never decides to
//! resume (`Facts::resumable` was never fed and `Decision::Resume` never taken).

use super::class::AfterUnknown;
use crate::execution::{self, Claimed, ExecutionRecord, ExecutionState, RetryClass};

/// What the guard does with a `tools/call`, decided from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// A new execution: authorize, record `dispatched`, send with its `Idempotency-Key`.
    Start,
    /// An execution that never left (accepted, authorized or provably not sent) whose attempt
    /// is gone: continue it under the same execution ID (authorizing it first if it never was).
    Continue,
    /// A live attempt owns the execution: wait for it (bounded) and answer with its outcome.
    Attach,
    /// The outcome is unknown and the class allows it: send again under the same execution ID
    /// and key (read-only and idempotent tools).
    Resend,
    /// The outcome is unknown: ask the contract's status probe (recoverable tools).
    Probe,
    /// The target answered but the caller never got it: hand back the kept result.
    ReturnStored,
    /// The same denial as before; no new approval.
    RepeatDenial,
    /// Answer honestly that the outcome is not known, and why nothing was re-sent.
    Uncertain(UncertainReason),
}

impl Decision {
    /// The decision's name in metrics and logs.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Continue => "continue",
            Self::Attach => "attach",
            Self::Resend => "resend",
            Self::Probe => "probe",
            Self::ReturnStored => "return_stored",
            Self::RepeatDenial => "repeat_denial",
            Self::Uncertain(_) => "uncertain",
        }
    }

    /// What a repeat answered from the ledger was answered with, when it was one.
    pub(crate) fn repeat_answer(self) -> Option<&'static str> {
        match self {
            Self::Attach | Self::Uncertain(UncertainReason::InProgress) => Some("attached"),
            Self::ReturnStored => Some("kept_result"),
            Self::Uncertain(UncertainReason::ResultNotKept) => Some("result_not_kept"),
            Self::Uncertain(UncertainReason::NeedsReview) => Some("held"),
            _ => None,
        }
    }
}

/// Why the guard answers with an uncertain result instead of the target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UncertainReason {
    /// Unknown outcome on a tool that may not be re-sent: held for review (recorded as
    /// `needs_review` if it is not already).
    NeedsReview,
    /// The execution is still running and did not finish within the attach wait.
    InProgress,
    /// The target finished, but its result was not kept (contract or size cap).
    ResultNotKept,
}

/// The facts the decision needs beyond the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// A live attempt (this process's, or another's with a valid lease) owns the execution.
    pub(crate) attempt_alive: bool,
    /// The tool's contract has a status probe.
    pub(crate) has_probe: bool,
    /// The call became an MCP task whose id is known: `tasks/get` can tell its outcome,
    /// whatever the tool's class (asking re-sends nothing).
    pub(crate) task_known: bool,
}

/// Decides what to do with a `tools/call` given what its claim found.
pub(crate) fn decide(claimed: &Claimed, facts: Facts) -> Decision {
    match claimed {
        Claimed::New(_) => Decision::Start,
        Claimed::Existing(record) => decide_existing(record, facts),
    }
}

fn decide_existing(record: &ExecutionRecord, facts: Facts) -> Decision {
    use ExecutionState as S;
    match record.state {
        S::Accepted | S::Authorized | S::NotSent | S::Dispatched if facts.attempt_alive => {
            Decision::Attach
        }
        S::Accepted | S::Authorized | S::NotSent => Decision::Continue,
        // Dispatched with no live attempt: the attempt died after the bytes may have left.
        // That is an unknown outcome.
        S::Dispatched | S::Unknown => decide_unknown(record.retry_class, facts),
        S::NeedsReview => Decision::Uncertain(UncertainReason::NeedsReview),
        S::Completed | S::ResolvedApplied if record.result_reference.is_some() => {
            Decision::ReturnStored
        }
        // A read-only result that was not kept is simply fetched again.
        S::Completed | S::ResolvedApplied if record.retry_class == RetryClass::ReadOnly => {
            Decision::Resend
        }
        S::Completed | S::ResolvedApplied => Decision::Uncertain(UncertainReason::ResultNotKept),
        S::Denied => Decision::RepeatDenial,
        // Not linkable: a claim never returns these as existing. Treat a caller that passes one
        // as a new intent.
        S::Failed | S::ResolvedNotApplied => Decision::Start,
    }
}

fn decide_unknown(class: RetryClass, facts: Facts) -> Decision {
    if facts.task_known {
        return Decision::Probe;
    }
    // The guard re-sends only under the execution's own key, so both re-sends are one.
    match AfterUnknown::of(class) {
        AfterUnknown::ResendFreely | AfterUnknown::ResendUnderKey => Decision::Resend,
        AfterUnknown::Probe if facts.has_probe => Decision::Probe,
        AfterUnknown::Probe | AfterUnknown::Review => {
            Decision::Uncertain(UncertainReason::NeedsReview)
        }
    }
}

/// Whether the attempt of `record` is recorded `unknown` before the guard acts on `decision`:
/// a dispatched execution whose attempt is gone has an unknown outcome (a new execution's
/// own first dispatch is not such an attempt).
pub(crate) fn settles_orphan_first(
    record: &ExecutionRecord,
    attempt_alive: bool,
    decision: Decision,
) -> bool {
    execution::is_orphaned(record, attempt_alive) && decision != Decision::Start
}

/// Whether `decision` asks the authorization hook before it sends: an execution that starts or
/// continues and was never authorized (still `accepted`).
pub(crate) fn authorizes_first(record: &ExecutionRecord, decision: Decision) -> bool {
    matches!(decision, Decision::Start | Decision::Continue)
        && record.state == ExecutionState::Accepted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::{ExecutionRecord, Timestamp, fixtures};

    const CLASSES: [RetryClass; 4] = [
        RetryClass::ReadOnly,
        RetryClass::Idempotent,
        RetryClass::Recoverable,
        RetryClass::Irreversible,
    ];

    fn record(class: RetryClass, state: ExecutionState, kept: bool) -> ExecutionRecord {
        let mut r = fixtures::accepted(&fixtures::claim(class, "me"));
        r.state = state;
        r.result_reference = kept.then(|| "result_x".into());
        r
    }

    fn facts(attempt_alive: bool, has_probe: bool) -> Facts {
        Facts {
            attempt_alive,
            has_probe,
            task_known: false,
        }
    }

    /// Row by row, for every retry class.
    #[test]
    fn the_decision_table() {
        use Decision as D;
        use ExecutionState as S;
        use UncertainReason as U;
        let idle = facts(false, false);
        for class in CLASSES {
            let by_class =
                |read_only: D, idempotent: D, recoverable: D, irreversible: D| match class {
                    RetryClass::ReadOnly => read_only,
                    RetryClass::Idempotent => idempotent,
                    RetryClass::Recoverable => recoverable,
                    RetryClass::Irreversible => irreversible,
                };
            let rows: Vec<(&str, Claimed, Facts, D)> = vec![
                (
                    "no prior execution",
                    Claimed::New(record(class, S::Accepted, false)),
                    idle,
                    D::Start,
                ),
                (
                    "accepted, owner alive",
                    Claimed::Existing(record(class, S::Accepted, false)),
                    facts(true, false),
                    D::Attach,
                ),
                (
                    "authorized, owner alive",
                    Claimed::Existing(record(class, S::Authorized, false)),
                    facts(true, false),
                    D::Attach,
                ),
                (
                    "accepted, owner gone",
                    Claimed::Existing(record(class, S::Accepted, false)),
                    idle,
                    D::Continue,
                ),
                (
                    "authorized, owner gone",
                    Claimed::Existing(record(class, S::Authorized, false)),
                    idle,
                    D::Continue,
                ),
                (
                    "not sent, owner gone",
                    Claimed::Existing(record(class, S::NotSent, false)),
                    idle,
                    D::Continue,
                ),
                (
                    "dispatched, in flight",
                    Claimed::Existing(record(class, S::Dispatched, false)),
                    facts(true, false),
                    D::Attach,
                ),
                (
                    "unknown, no probe",
                    Claimed::Existing(record(class, S::Unknown, false)),
                    idle,
                    by_class(
                        D::Resend,
                        D::Resend,
                        D::Uncertain(U::NeedsReview),
                        D::Uncertain(U::NeedsReview),
                    ),
                ),
                (
                    "unknown, with probe",
                    Claimed::Existing(record(class, S::Unknown, false)),
                    facts(false, true),
                    by_class(D::Resend, D::Resend, D::Probe, D::Uncertain(U::NeedsReview)),
                ),
                (
                    "dispatched, attempt died",
                    Claimed::Existing(record(class, S::Dispatched, false)),
                    facts(false, true),
                    by_class(D::Resend, D::Resend, D::Probe, D::Uncertain(U::NeedsReview)),
                ),
                (
                    "completed, not delivered, kept",
                    Claimed::Existing(record(class, S::Completed, true)),
                    idle,
                    D::ReturnStored,
                ),
                (
                    "completed, not delivered, not kept",
                    Claimed::Existing(record(class, S::Completed, false)),
                    idle,
                    by_class(
                        D::Resend,
                        D::Uncertain(U::ResultNotKept),
                        D::Uncertain(U::ResultNotKept),
                        D::Uncertain(U::ResultNotKept),
                    ),
                ),
                (
                    "resolved applied, kept",
                    Claimed::Existing(record(class, S::ResolvedApplied, true)),
                    idle,
                    D::ReturnStored,
                ),
                (
                    "denied",
                    Claimed::Existing(record(class, S::Denied, false)),
                    facts(false, true),
                    D::RepeatDenial,
                ),
                (
                    "needs review",
                    Claimed::Existing(record(class, S::NeedsReview, false)),
                    facts(false, true),
                    D::Uncertain(U::NeedsReview),
                ),
            ];
            for (row, claimed, facts, expected) in rows {
                assert_eq!(decide(&claimed, facts), expected, "{class}: {row}");
            }
        }
    }

    /// The writes before an action: an orphaned attempt is settled `unknown` first (except by
    /// a new execution's own dispatch), and only a start or continue of an `accepted`
    /// execution asks the authorization hook.
    #[test]
    fn the_writes_before_an_action() {
        use Decision as D;
        use ExecutionState as S;
        let every = [
            D::Start,
            D::Continue,
            D::Attach,
            D::Resend,
            D::Probe,
            D::ReturnStored,
            D::RepeatDenial,
            D::Uncertain(UncertainReason::NeedsReview),
        ];
        let dispatched = record(RetryClass::Idempotent, S::Dispatched, false);
        for decision in every {
            let first = settles_orphan_first(&dispatched, false, decision);
            assert_eq!(first, decision != D::Start, "{decision:?}, attempt gone");
            assert!(
                !settles_orphan_first(&dispatched, true, decision),
                "{decision:?}, attempt alive"
            );
        }
        for state in [
            S::Accepted,
            S::Authorized,
            S::NotSent,
            S::Unknown,
            S::Completed,
        ] {
            let record = record(RetryClass::Idempotent, state, false);
            for decision in every {
                let expected = state == S::Accepted && matches!(decision, D::Start | D::Continue);
                assert_eq!(
                    authorizes_first(&record, decision),
                    expected,
                    "{state:?}, {decision:?}"
                );
                if state != S::Dispatched {
                    assert!(!settles_orphan_first(&record, false, decision), "{state:?}");
                }
            }
        }
    }

    /// Two clocks: every state, inside and past its link window (60 s here),
    /// delivered or not, and past its retention. An unsettled outcome links until retention;
    /// the window limits only settled results and never-sent executions.
    #[test]
    fn what_links_inside_and_past_the_window() {
        use ExecutionState as S;
        let inside = Timestamp::from_millis(1_000);
        let past_window = Timestamp::from_millis(60_001);
        // Retention here is max(retention, link window) = 60 s: keep it longer.
        let past_retention = Timestamp::from_millis(3_600_001);
        // (state, delivered, links inside the window, links past it)
        let rows = [
            (S::Accepted, false, true, true),
            (S::Authorized, false, true, true),
            (S::Dispatched, false, true, true),
            (S::Unknown, false, true, true),
            (S::NeedsReview, false, true, true),
            (S::Completed, false, true, false),
            (S::Completed, true, false, false),
            (S::ResolvedApplied, false, true, false),
            (S::ResolvedApplied, true, false, false),
            (S::Denied, false, true, false),
            (S::Denied, true, true, false),
            (S::NotSent, false, true, false),
            (S::Failed, false, false, false),
            (S::Failed, true, false, false),
            (S::ResolvedNotApplied, false, false, false),
        ];
        for class in CLASSES {
            for (state, delivered, in_window, after_window) in rows {
                let mut r = record(class, state, true);
                r.retain_until = Timestamp::from_millis(3_600_000);
                if delivered {
                    // Delivered before the repeat was asked (a result delivered after it
                    // was asked is a twin's: see `link.rs`).
                    r.delivered_at = Some(Timestamp::from_millis(inside.as_millis() - 1));
                }
                let row = format!("{class}: {state}, delivered {delivered}");
                assert_eq!(r.is_linkable(inside), in_window, "{row}, inside the window");
                assert_eq!(
                    r.is_linkable(past_window),
                    after_window,
                    "{row}, past the window"
                );
                // Past retention only an unsettled execution links (its owner is taken to be
                // alive here: a caller that gave up leaves an attempt that may still run).
                let may_run = state.is_unsettled();
                assert_eq!(
                    r.is_linkable(past_retention),
                    may_run,
                    "{row}, past retention"
                );
                assert_eq!(state.is_unsettled(), after_window && !delivered, "{row}");
            }
        }
    }

    /// Past the window, an unsettled execution still decides as it did inside it: never a
    /// new execution (a claim returns it, and the table answers as for any repeat).
    #[test]
    fn an_unknown_outcome_past_the_window_is_held_not_started_again() {
        let past_window = Timestamp::from_millis(60_001);
        let idle = facts(false, false);
        for class in CLASSES {
            for state in [ExecutionState::Unknown, ExecutionState::NeedsReview] {
                let mut r = record(class, state, false);
                r.retain_until = Timestamp::from_millis(3_600_000);
                assert!(r.is_linkable(past_window), "{class}: {state}");
                let decision = decide(&Claimed::Existing(r), idle);
                assert_ne!(decision, Decision::Start, "{class}: {state}");
                if class == RetryClass::Irreversible {
                    assert_eq!(
                        decision,
                        Decision::Uncertain(UncertainReason::NeedsReview),
                        "{state}"
                    );
                }
            }
        }
    }
}
