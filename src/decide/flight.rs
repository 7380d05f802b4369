//! Single flight (DESIGN §4, the rows "still owned by a live attempt" and "dispatched, still in
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_attempt_is_attached_to_and_a_free_intent_is_owned() {
        assert_eq!(single_flight(Some("wait")), Flight::Attach("wait"));
        assert_eq!(single_flight::<&str>(None), Flight::Own);
    }
}
