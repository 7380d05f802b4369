//! Which prior execution a repeat of the same intent links to (the link window and retention,
//! two clocks), how long an execution stays in retention, what an execution whose owner is
//! gone becomes, and whether an attempt may still be running. The ledgers store, index and
//! verify; they ask these functions, and never decide on their own.

use crate::execution::{EventKind, ExecutionRecord, ExecutionState, LedgerEvent, Timestamp};

/// Whether an attempt of `record` may still be running: it is in flight (accepted, authorized
/// or dispatched) and its owner (`owner_alive` says whether that process still runs) is alive.
/// Nothing settles such an execution but its own answer: no operator, no clock, no retention.
pub(crate) fn is_running(record: &ExecutionRecord, owner_alive: bool) -> bool {
    use ExecutionState as S;
    matches!(record.state, S::Accepted | S::Authorized | S::Dispatched) && owner_alive
}

/// Whether `record` is still in retention at `now` (a ledger keeps it, and a repeat may link
/// to it). `owner_alive` is asked only for an execution past its `retain_until` whose attempt
/// may still be running.
///
/// - Retention counts from the execution's last event: every event moves `retain_until`
///   ([`ExecutionRecord::apply`]), so a call answered after a day is kept for its retention
///   from its answer, not from its acceptance.
/// - An unsettled execution ([`ExecutionState::is_unsettled`]: in flight, unknown, needs
///   review) whose owner, or the owner of an earlier attempt still in doubt when a later one
///   was sent ([`ExecutionRecord::earlier_owners`]), is alive never leaves retention, however long the tool runs or however
///   far the wall clock steps (a VM resumed, a host without an RTC): an attempt whose caller
///   gave up (`unknown`) may still be running at the target, which is where its effect lands.
/// - A `dispatched` execution whose owner is gone is an orphan: its `unknown`
///   ([`orphan_unknown`]), recorded when it is found, is its last event, and its retention
///   counts from there. Until then it stays.
pub(crate) fn is_retained(
    record: &ExecutionRecord,
    now: Timestamp,
    owner_alive: impl Fn(&str) -> bool,
) -> bool {
    now <= record.retain_until
        || record.state == ExecutionState::Dispatched
        || (record.state.is_unsettled()
            && std::iter::once(&record.owner)
                .chain(&record.earlier_owners)
                .any(|owner| owner_alive(owner)))
}

/// Whether a repeat of the same intent, asked at `asked_at` and claiming at `now`, links to
/// `record`. `owner_alive` answers for the owner of an execution past its `retain_until`
/// ([`is_retained`]).
///
/// - Nothing links once the record left retention ([`is_retained`]).
/// - An unsettled execution ([`ExecutionState::is_unsettled`]: in flight, dispatched by an
///   owner that is gone, unknown, needs review) links whatever its link window says: no
///   window may turn an unknown outcome into a second dispatch.
/// - The link window limits only how long a settled result is handed back (completed or
///   resolved as applied and not yet delivered, a repeated denial) and how long a never-sent
///   (`not_sent`) execution is continued.
/// - Never linkable: failed (the target refused it), settled as not applied, and a result
///   that reached a caller before this call was asked (a repeat after that is a new intent).
///   A result delivered after it was asked (to a twin that asked at the same time, while this
///   call waited) is handed back to this call too: otherwise the wait would end in a second run.
/// - A result that settled no earlier than this call was asked is handed back whatever the
///   window says: the call was asked while the execution was unsettled, and linked to it then
///   (it waited on it); a second run now would be a second effect of an intent asked for while
///   its first was in doubt. A call that attached and waited (`waited`) is handed back a
///   settled result whatever the clocks say too: after the clock stepped back, a settlement
///   after its ask reads as earlier.
pub(crate) fn is_linkable(
    record: &ExecutionRecord,
    now: Timestamp,
    asked_at: Timestamp,
    waited: bool,
    owner_alive: impl Fn(&str) -> bool,
) -> bool {
    use ExecutionState as S;
    if !is_retained(record, now, owner_alive) {
        return false;
    }
    let inside_window = now <= record.link_until;
    match record.state {
        state if state.is_unsettled() => true,
        S::Completed | S::ResolvedApplied => {
            // Strictly after: a delivery in the same millisecond as the call counts as
            // before it (a deliberate repeat right after its answer is a new execution).
            let settled_since_asked = record.completed_at.is_some_and(|at| at >= asked_at);
            waited
                || record.delivered_at.is_none_or(|at| at > asked_at)
                    && (inside_window || settled_since_asked)
        }
        S::Denied | S::NotSent => inside_window,
        _ => false,
    }
}

/// Why an orphaned execution's outcome is unknown (the `reason` of its `unknown` event).
pub(crate) const ORPHAN_REASON: &str =
    "the process that dispatched it ended before its outcome was observed";

/// Whether `record` is orphaned: `dispatched`, and its owner (`owner_alive` says whether that
/// process still runs) is gone, so nobody will ever observe the attempt's outcome. An
/// orphaned execution's outcome is unknown ([`orphan_unknown`]): never re-sent blindly, never
/// lost.
pub(crate) fn is_orphaned(record: &ExecutionRecord, owner_alive: bool) -> bool {
    record.state == ExecutionState::Dispatched && !owner_alive
}

/// The `unknown` event that settles an orphaned `record` at `at`, or `None` when it is not
/// orphaned. The event names the attempt it is about, so a ledger refuses it if a newer
/// attempt was dispatched meanwhile (by a live owner, in another process).
pub(crate) fn orphan_unknown(
    record: &ExecutionRecord,
    owner_alive: bool,
    at: Timestamp,
) -> Option<LedgerEvent> {
    is_orphaned(record, owner_alive).then(|| LedgerEvent {
        execution_id: record.execution_id,
        at,
        kind: EventKind::Unknown {
            target_status: None,
            reason: ORPHAN_REASON.into(),
            attempt: Some(record.attempts),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::{
        RetryClass,
        fixtures::{accepted, claim, dispatched, event_at},
    };

    fn record_in(state: ExecutionState, delivered: bool) -> ExecutionRecord {
        let mut r = accepted(&claim(RetryClass::Idempotent, "o"));
        r.state = state;
        if delivered {
            r.delivered_at = Some(Timestamp::from_millis(1));
        }
        r
    }

    /// One row per state: linkable inside the window, past the window, past retention.
    #[test]
    fn the_link_rule_has_two_clocks() {
        use ExecutionState as S;
        // The fixture claim: 60 s window and retention from 0 ms; stretch retention.
        let inside = Timestamp::from_millis(30_000);
        let past_window = Timestamp::from_millis(90_000);
        let past_retention = Timestamp::from_millis(200_001);
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
            (S::NotSent, false, true, false),
            (S::Failed, false, false, false),
            (S::ResolvedNotApplied, false, false, false),
        ];
        for (state, delivered, in_window, after_window) in rows {
            let mut r = record_in(state, delivered);
            r.retain_until = Timestamp::from_millis(200_000);
            let row = format!("{state} delivered={delivered}");
            assert_eq!(
                is_linkable(&r, inside, inside, false, |_| true),
                in_window,
                "{row}"
            );
            assert_eq!(
                is_linkable(&r, past_window, past_window, false, |_| true),
                after_window,
                "{row}"
            );
            // Past retention nothing links, except what may still be running.
            let running = matches!(state, S::Dispatched);
            assert_eq!(
                is_linkable(&r, past_retention, past_retention, false, |_| false),
                running,
                "{row}"
            );
        }
    }

    /// Retention never ends the hold of a call that may still run: past `retain_until` (a tool
    /// that runs longer than its retention, a wall clock stepped a day forward), an unsettled
    /// execution (in flight, unknown, needs review) whose owner is alive still links, and a
    /// dispatched one whose owner is gone stays until its `unknown` is recorded. Nothing else
    /// does. Retention used to end every hold at
    /// `retain_until`, fixed at acceptance, so an identical call started a second execution.
    #[test]
    fn an_execution_that_may_still_run_never_leaves_retention() {
        use ExecutionState as S;
        let day_later = Timestamp::from_millis(86_400_000 + 200_000);
        // (state, owner alive, retained and linkable)
        let rows = [
            (S::Accepted, true, true),
            (S::Authorized, true, true),
            (S::Dispatched, true, true),
            (S::Dispatched, false, true),
            (S::Accepted, false, false),
            (S::Authorized, false, false),
            (S::Unknown, true, true),
            (S::NeedsReview, true, true),
            (S::Unknown, false, false),
            (S::NeedsReview, false, false),
            (S::Completed, true, false),
            (S::NotSent, true, false),
        ];
        for (state, alive, linked) in rows {
            let mut r = record_in(state, false);
            r.retain_until = Timestamp::from_millis(200_000);
            let row = format!("{state} owner alive={alive}");
            assert_eq!(is_retained(&r, day_later, |_| alive), linked, "{row}");
            assert_eq!(
                is_linkable(&r, day_later, day_later, false, |_| alive),
                linked,
                "{row}"
            );
            assert_eq!(
                is_running(&r, alive),
                alive && matches!(state, S::Accepted | S::Authorized | S::Dispatched),
                "{row}"
            );
        }
        // Inside retention the owner is not even asked.
        let r = record_in(S::Accepted, false);
        let inside = Timestamp::from_millis(1_000);
        assert!(is_retained(&r, inside, |_| panic!("asked")));
    }

    /// Found by the simulator over stdio: a process's attempt ran slowly at the target and its
    /// outcome became unknown; a second process re-sent it (refused while the first still
    /// ran), became the owner and died. Past retention, counted from the second attempt, the
    /// execution left and a repeat started anew while the first attempt, of a process still
    /// alive, went on to its effect: two effects. Any owner of an attempt in doubt holds it.
    #[test]
    fn the_owner_of_an_earlier_attempt_in_doubt_holds_retention() {
        use ExecutionState as S;
        let day_later = Timestamp::from_millis(86_400_000 + 200_000);
        let mut r = record_in(S::Unknown, false);
        r.retain_until = Timestamp::from_millis(200_000);
        r.owner = "guard:two".into();
        r.earlier_owners = vec!["guard:one".into()];
        // (alive, retained)
        for (alive, retained) in [
            (&[][..], false),
            (&["guard:two"][..], true),
            (&["guard:one"][..], true),
            (&["guard:three"][..], false),
        ] {
            let owner_alive = |owner: &str| alive.contains(&owner);
            assert_eq!(
                is_retained(&r, day_later, owner_alive),
                retained,
                "{alive:?}"
            );
            assert_eq!(
                is_linkable(&r, day_later, day_later, false, owner_alive),
                retained,
                "{alive:?}"
            );
        }
        // Settled, no owner holds it.
        r.state = S::Completed;
        assert!(!is_retained(&r, day_later, |_| true));
    }

    /// Found by the simulator through the proxy: a repeat asked while an execution's outcome
    /// was in doubt waited on it (attached) past its link window; a status probe then settled
    /// it as applied, its result not kept, and the repeat, deciding again, found a completed
    /// execution past its window and started a second run (a second charge). A result that
    /// settled after the call was asked is the call's answer, whatever the window says.
    #[test]
    fn a_result_settled_after_a_call_was_asked_is_handed_back_past_the_window() {
        for state in [ExecutionState::Completed, ExecutionState::ResolvedApplied] {
            let mut r = record_in(state, false);
            r.retain_until = Timestamp::from_millis(200_000);
            r.completed_at = Some(Timestamp::from_millis(85_000));
            let past_window = Timestamp::from_millis(90_000);
            // Asked at 80 s, while it was unsettled; settled at 85 s.
            assert!(
                is_linkable(
                    &r,
                    past_window,
                    Timestamp::from_millis(80_000),
                    false,
                    |_| true
                ),
                "{state}"
            );
            // Asked in the millisecond it settled: it may have been unsettled then.
            assert!(
                is_linkable(
                    &r,
                    past_window,
                    Timestamp::from_millis(85_000),
                    false,
                    |_| true
                ),
                "{state}"
            );
            // Asked once it had settled: the window decides.
            assert!(
                !is_linkable(
                    &r,
                    past_window,
                    Timestamp::from_millis(86_000),
                    false,
                    |_| true
                ),
                "{state}"
            );
            // Delivered to another caller before this one asked: a new intent.
            r.delivered_at = Some(Timestamp::from_millis(85_500));
            assert!(
                !is_linkable(
                    &r,
                    past_window,
                    Timestamp::from_millis(86_000),
                    false,
                    |_| true
                ),
                "{state}"
            );
        }
    }

    /// Found by the simulator's night run, through the proxy: a repeat attached to an
    /// execution in doubt and waited; the machine's clock stepped back 5 s; the execution then
    /// settled as applied, its `completed_at` now earlier than the repeat's ask, past its
    /// window, and the repeat ran a second time. A call that waited is handed back what it
    /// waited on, whatever the clocks say.
    #[test]
    fn a_call_that_waited_is_handed_back_a_result_that_settled_before_its_ask_by_the_clock() {
        for state in [ExecutionState::Completed, ExecutionState::ResolvedApplied] {
            let mut r = record_in(state, false);
            r.retain_until = Timestamp::from_millis(200_000);
            // Settled at 84 s by a clock stepped back, the call asked at 86 s.
            r.completed_at = Some(Timestamp::from_millis(84_000));
            let (now, asked) = (
                Timestamp::from_millis(90_000),
                Timestamp::from_millis(86_000),
            );
            assert!(is_linkable(&r, now, asked, true, |_| true), "{state}");
            assert!(!is_linkable(&r, now, asked, false, |_| true), "{state}");
            // Delivered to a twin meanwhile (by the same stepped clock): still its answer.
            r.delivered_at = Some(Timestamp::from_millis(84_500));
            assert!(is_linkable(&r, now, asked, true, |_| true), "{state}");
        }
        // What the call waited on failed or was settled as not applied: it may run anew.
        for state in [ExecutionState::Failed, ExecutionState::ResolvedNotApplied] {
            let r = record_in(state, false);
            let now = Timestamp::from_millis(90_000);
            assert!(!is_linkable(&r, now, now, true, |_| true), "{state}");
        }
    }

    /// Found by the simulator (seed 7044674): a call that waited while its twin's result was
    /// delivered (to the twin) links to that execution, however its claim comes later; a call
    /// asked after the delivery is a new intent.
    #[test]
    fn a_result_delivered_after_a_call_was_asked_is_still_linked_for_it() {
        for state in [ExecutionState::Completed, ExecutionState::ResolvedApplied] {
            let mut r = record_in(state, true); // delivered at 1 ms
            r.retain_until = Timestamp::from_millis(200_000);
            let now = Timestamp::from_millis(30_000);
            assert!(
                is_linkable(&r, now, Timestamp::from_millis(0), false, |_| true),
                "{state}"
            );
            // Asked in the millisecond of the delivery: after it.
            assert!(
                !is_linkable(&r, now, Timestamp::from_millis(1), false, |_| true),
                "{state}"
            );
            assert!(
                !is_linkable(&r, now, Timestamp::from_millis(2), false, |_| true),
                "{state}"
            );
            // Past the window, even the twin starts over: the window bounds every hand-back.
            let past_window = Timestamp::from_millis(90_000);
            assert!(
                !is_linkable(&r, past_window, Timestamp::from_millis(0), false, |_| true),
                "{state}"
            );
        }
    }

    #[test]
    fn only_a_dispatched_execution_whose_owner_is_gone_is_orphaned() {
        for state in [
            ExecutionState::Accepted,
            ExecutionState::Authorized,
            ExecutionState::Unknown,
            ExecutionState::Completed,
        ] {
            assert!(!is_orphaned(&record_in(state, false), false), "{state}");
        }
        let mut r = accepted(&claim(RetryClass::Idempotent, "o"));
        let id = r.execution_id;
        r.apply(&event_at(id, 1, dispatched(id, 1, Some("o"))))
            .unwrap();
        assert!(!is_orphaned(&r, true));
        assert!(orphan_unknown(&r, true, Timestamp::from_millis(2)).is_none());
        let event = orphan_unknown(&r, false, Timestamp::from_millis(2)).unwrap();
        r.apply(&event).unwrap();
        assert_eq!(r.state, ExecutionState::Unknown);
        assert_eq!(r.reason.as_deref(), Some(ORPHAN_REASON));
    }

    /// The orphan's `unknown` names its attempt: a newer attempt, dispatched meanwhile by a
    /// live owner, is never marked unknown by a ledger that saw the older one.
    #[test]
    fn an_orphan_event_for_an_older_attempt_is_refused() {
        let mut r = accepted(&claim(RetryClass::Idempotent, "o"));
        let id = r.execution_id;
        r.apply(&event_at(id, 1, dispatched(id, 1, Some("o"))))
            .unwrap();
        let seen = r.clone();
        let stale = orphan_unknown(&seen, false, Timestamp::from_millis(2)).unwrap();
        r.apply(&stale).unwrap();
        r.apply(&event_at(id, 3, dispatched(id, 2, Some("p"))))
            .unwrap();
        assert!(r.apply(&stale).is_err());
        assert_eq!((r.state, r.attempts), (ExecutionState::Dispatched, 2));
    }
}
