//! The README's decision table ("What the guard does"), one test row per table
//! row, named as the README names it, for every retry class.

use super::{
    call::{Decision, Facts, UncertainReason, decide},
    flight::{Flight, single_flight},
    probe::AfterProbe,
};
use crate::{
    contract::ProbeOutcome,
    execution::{Claimed, ExecutionRecord, ExecutionState, RetryClass, Timestamp, fixtures},
};

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

fn existing(class: RetryClass, state: ExecutionState, kept: bool) -> Claimed {
    Claimed::Existing(record(class, state, kept))
}

/// No live attempt; a recoverable tool has its status probe.
fn idle(class: RetryClass) -> Facts {
    Facts {
        attempt_alive: false,
        has_probe: class == RetryClass::Recoverable,
        task_known: false,
    }
}

fn alive() -> Facts {
    Facts {
        attempt_alive: true,
        has_probe: false,
        task_known: false,
    }
}

/// README, "What the guard does": every row for the class it names (or every class).
#[test]
fn the_readme_table() {
    use Decision as D;
    use ExecutionState as S;
    let review = D::Uncertain(UncertainReason::NeedsReview);
    for class in CLASSES {
        let mut rows: Vec<(&str, Claimed, Facts, D)> = vec![
            (
                "none, or delivered, or refused by the target: none",
                Claimed::New(record(class, S::Accepted, false)),
                idle(class),
                D::Start,
            ),
            (
                "none, or delivered, or refused by the target: refused by the target",
                existing(class, S::Failed, false),
                idle(class),
                D::Start,
            ),
            (
                "still in flight (in another process)",
                existing(class, S::Dispatched, false),
                alive(),
                D::Attach,
            ),
            (
                "never left the process (`not_sent`)",
                existing(class, S::NotSent, false),
                idle(class),
                D::Continue,
            ),
            (
                "completed, but the caller never got it",
                existing(class, S::Completed, true),
                idle(class),
                D::ReturnStored,
            ),
            (
                "denied by the authorization hook",
                existing(class, S::Denied, false),
                idle(class),
                D::RepeatDenial,
            ),
        ];
        let unknown = match class {
            RetryClass::ReadOnly => None,
            RetryClass::Idempotent => Some(("outcome unknown, **idempotent** tool", D::Resend)),
            RetryClass::Recoverable => Some(("outcome unknown, **recoverable** tool", D::Probe)),
            RetryClass::Irreversible => Some(("outcome unknown, **irreversible** tool", review)),
        };
        if let Some((row, expected)) = unknown {
            rows.push((
                row,
                existing(class, S::Unknown, false),
                idle(class),
                expected,
            ));
        }
        for (row, claimed, facts, expected) in rows {
            assert_eq!(decide(&claimed, facts), expected, "{class}: {row}");
        }
    }
    // "none, or delivered": a delivered execution is not linkable, so a claim starts anew.
    let mut delivered = record(RetryClass::Irreversible, S::Completed, true);
    delivered.delivered_at = Some(Timestamp::from_millis(1));
    assert!(!delivered.is_linkable(Timestamp::from_millis(2)));
}

/// README, "still in flight (in this process)": the call attaches before it decides.
#[test]
fn the_readme_table_still_in_flight_in_this_process() {
    assert_eq!(single_flight(Some(())), Flight::Attach(()));
    assert_eq!(single_flight::<()>(None), Flight::Own);
}

/// README, "outcome unknown, **recoverable** tool": "asks its status probe: applied → that
/// result; not applied → re-send same key; can't tell → review".
#[test]
fn the_readme_table_recoverable_probe() {
    let rows = [
        (
            "applied → that result",
            ProbeOutcome::Applied { result: None },
            AfterProbe::HandBack { result: None },
        ),
        (
            "not applied → re-send same key",
            ProbeOutcome::NotApplied,
            AfterProbe::Resend,
        ),
        (
            "can't tell → review",
            ProbeOutcome::Unknown { reason: "?".into() },
            AfterProbe::Review { reason: "?".into() },
        ),
    ];
    for (row, outcome, expected) in rows {
        assert_eq!(AfterProbe::of(outcome), expected, "{row}");
    }
    // Without a probe, a recoverable tool is held like an irreversible one.
    let facts = Facts {
        has_probe: false,
        ..idle(RetryClass::Recoverable)
    };
    assert_eq!(
        decide(
            &existing(RetryClass::Recoverable, ExecutionState::Unknown, false),
            facts
        ),
        Decision::Uncertain(UncertainReason::NeedsReview)
    );
}

/// The table under "The decision (the heart)", for every class.
#[test]
fn the_design_table() {
    use Decision as D;
    use ExecutionState as S;
    for class in CLASSES {
        let unknown = match class {
            RetryClass::ReadOnly | RetryClass::Idempotent => D::Resend,
            RetryClass::Recoverable => D::Probe,
            RetryClass::Irreversible => D::Uncertain(UncertainReason::NeedsReview),
        };
        let rows: Vec<(&str, Claimed, Facts, D)> = vec![
            (
                "none",
                Claimed::New(record(class, S::Accepted, false)),
                idle(class),
                D::Start,
            ),
            (
                "`failed`",
                existing(class, S::Failed, false),
                idle(class),
                D::Start,
            ),
            (
                "`accepted`/`authorized`, still owned by a live attempt: accepted",
                existing(class, S::Accepted, false),
                alive(),
                D::Attach,
            ),
            (
                "`accepted`/`authorized`, still owned by a live attempt: authorized",
                existing(class, S::Authorized, false),
                alive(),
                D::Attach,
            ),
            (
                "`accepted`/`authorized`, owner gone (crash, expired lease): accepted",
                existing(class, S::Accepted, false),
                idle(class),
                D::Continue,
            ),
            (
                "`accepted`/`authorized`, owner gone (crash, expired lease): authorized",
                existing(class, S::Authorized, false),
                idle(class),
                D::Continue,
            ),
            (
                "`dispatched`, still in flight",
                existing(class, S::Dispatched, false),
                alive(),
                D::Attach,
            ),
            (
                "`unknown`",
                existing(class, S::Unknown, false),
                idle(class),
                unknown,
            ),
            (
                "`completed`, not delivered",
                existing(class, S::Completed, true),
                idle(class),
                D::ReturnStored,
            ),
            (
                "`denied`",
                existing(class, S::Denied, false),
                idle(class),
                D::RepeatDenial,
            ),
            (
                "`needs_review`",
                existing(class, S::NeedsReview, false),
                idle(class),
                D::Uncertain(UncertainReason::NeedsReview),
            ),
        ];
        for (row, claimed, facts, expected) in rows {
            assert_eq!(decide(&claimed, facts), expected, "{class}: {row}");
        }
    }
}
