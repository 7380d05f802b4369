//! Single flight (the rows "still owned by a live attempt" and "dispatched, still in
//! flight"): a call whose intent a live attempt owns waits for that attempt instead of starting
//! its own. The guard keeps the state (which intents are owned in this process, and the
//! notifiers waiters listen on); this is the rule it applies to that state.

/// What a call does with an intent.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flight<W> {
    /// No live attempt owns the intent: this call owns it and decides from the ledger.
    Own,
    /// A live attempt owns it: wait on `W` (bounded) and take that attempt's answer.
    Attach(W),
}

/// Decides from the live attempt that owns the intent, if any (`W`: how to wait for it).
pub(crate) fn single_flight<W>(live_attempt: Option<W>) -> Flight<W> {
    match live_attempt {
        Some(wait) => Flight::Attach(wait),
        None => Flight::Own,
    }
}

/// How a wait for a live attempt ended (in this process, or in another one through the ledger).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Waited<T> {
    /// The attempt completed (`T`: what the waiter knows of its result).
    Completed(T),
    /// The attempt settled otherwise (failed, unknown, not sent), or its owner went away.
    Moved,
    /// The bounded wait ran out with the attempt still in flight.
    TimedOut,
}

/// What a call that waited for a live attempt does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AfterWait<T> {
    /// The attempt's answer is this call's answer, kept or not, even when another caller
    /// already received it: deciding again would find the execution delivered and start a
    /// second one.
    HandBack(T),
    /// Decide again from the ledger.
    DecideAgain,
    /// Answer "in progress", uncertain: the attempt still runs.
    InProgress,
}

/// The next step after an attach wait, the same in process and across processes.
pub(crate) fn after_wait<T>(waited: Waited<T>) -> AfterWait<T> {
    match waited {
        Waited::Completed(result) => AfterWait::HandBack(result),
        Waited::Moved => AfterWait::DecideAgain,
        Waited::TimedOut => AfterWait::InProgress,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_attempt_is_handed_back_a_moved_one_decided_again_a_running_one_in_progress() {
        assert_eq!(after_wait(Waited::Completed(7)), AfterWait::HandBack(7));
        assert_eq!(after_wait::<u8>(Waited::Moved), AfterWait::DecideAgain);
        assert_eq!(after_wait::<u8>(Waited::TimedOut), AfterWait::InProgress);
    }

    #[test]
    fn a_live_attempt_is_attached_to_and_a_free_intent_is_owned() {
        assert_eq!(single_flight(Some("wait")), Flight::Attach("wait"));
        assert_eq!(single_flight::<&str>(None), Flight::Own);
    }
}
