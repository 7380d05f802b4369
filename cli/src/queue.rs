//! Which executions `ledger list` shows: the held queue (`--held`), a state named as the
//! record reads, a tool, an actor, a time window; oldest first.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use mcp_replay_guard::execution::{ExecutionRecord, Timestamp};

/// Every state a record reads as (`state_label`): the states, and a completed execution's two
/// readings.
const STATE_NAMES: [&str; 12] = [
    "accepted",
    "authorized",
    "dispatched",
    "completed_result_not_delivered",
    "delivered",
    "failed",
    "unknown",
    "denied",
    "not_sent",
    "needs_review",
    "resolved_applied",
    "resolved_not_applied",
];

/// The filters of `ledger list`.
#[derive(Debug, Clone, Args)]
pub(crate) struct Filter {
    /// Only the held executions (`unknown` and `needs_review`: an outcome nobody knows, waiting
    /// for a probe or a person), oldest first.
    #[arg(long, conflicts_with = "state")]
    held: bool,
    /// Only executions in this state, as the record reads it (a wrong name is refused and the
    /// names listed).
    #[arg(long, value_name = "STATE", value_parser = clap::builder::PossibleValuesParser::new(STATE_NAMES))]
    state: Option<String>,
    /// Only executions of this tool.
    #[arg(long, value_name = "TOOL")]
    tool: Option<String>,
    /// Only executions of this actor (as the record names it: `principal:alice`, …).
    #[arg(long, value_name = "ACTOR")]
    actor: Option<String>,
    /// Only executions accepted at or after this time: RFC 3339 (`2026-12-05T10:00:00Z`) or an
    /// age (`2h`: accepted in the last two hours).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    since: Option<Timestamp>,
    /// Only executions accepted before this time (RFC 3339, or an age: `30m` ago).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    until: Option<Timestamp>,
}

impl Filter {
    /// Whether `record` is shown.
    pub(crate) fn shows(&self, record: &ExecutionRecord) -> bool {
        let accepted = record.accepted_at();
        (!self.held || record.state().is_held())
            && self
                .state
                .as_deref()
                .is_none_or(|state| record.state_label() == state)
            && self
                .tool
                .as_deref()
                .is_none_or(|tool| record.tool() == tool)
            && self
                .actor
                .as_deref()
                .is_none_or(|actor| record.actor().as_str() == actor)
            && self.since.is_none_or(|since| accepted >= since)
            && self.until.is_none_or(|until| accepted < until)
    }

    /// The records shown, oldest first.
    pub(crate) fn select(&self, records: Vec<ExecutionRecord>) -> Vec<ExecutionRecord> {
        let mut shown: Vec<_> = records.into_iter().filter(|r| self.shows(r)).collect();
        shown.sort_by_key(|r| (r.accepted_at(), r.execution_id()));
        shown
    }
}

/// `2026-12-05T10:00:00Z` (RFC 3339), or an age before now (`2h`, `30m`, `7days`).
fn parse_when(text: &str) -> Result<Timestamp, String> {
    let at = match humantime::parse_rfc3339_weak(text) {
        Ok(at) => at,
        Err(_) => {
            let age: Duration = humantime::parse_duration(text).map_err(|_| {
                format!("{text:?} is neither a time (2026-12-05T10:00:00Z) nor an age (2h)")
            })?;
            SystemTime::now()
                .checked_sub(age)
                .ok_or_else(|| format!("{text:?} reaches before 1970"))?
        }
    };
    let millis = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?
        .as_millis();
    u64::try_from(millis)
        .map(Timestamp::from_millis)
        .map_err(|_| format!("{text:?} is too far ahead"))
}

#[cfg(test)]
mod tests {
    use mcp_replay_guard::execution::ExecutionState;

    use super::*;

    /// Every name a state is read as, checked against the states themselves.
    #[test]
    fn every_state_is_named_and_held_means_unknown_or_needs_review() {
        for state in [
            ExecutionState::Accepted,
            ExecutionState::Authorized,
            ExecutionState::Dispatched,
            ExecutionState::Failed,
            ExecutionState::Unknown,
            ExecutionState::Denied,
            ExecutionState::NotSent,
            ExecutionState::NeedsReview,
            ExecutionState::ResolvedApplied,
            ExecutionState::ResolvedNotApplied,
        ] {
            assert!(STATE_NAMES.contains(&state.as_str()), "{state:?}");
        }
        let held: Vec<&str> = [ExecutionState::Unknown, ExecutionState::NeedsReview]
            .iter()
            .map(|s| s.as_str())
            .collect();
        assert_eq!(held, ["unknown", "needs_review"]);
    }

    #[test]
    fn a_time_is_rfc_3339_or_an_age() {
        let at = parse_when("2026-12-05T10:00:00Z").unwrap();
        assert_eq!(at.as_millis(), 1_796_464_800_000);
        let an_hour_ago = parse_when("1h").unwrap().as_millis();
        let now = Timestamp::now().as_millis();
        assert!((now - an_hour_ago).abs_diff(3_600_000) < 5_000);
        assert!(parse_when("yesterday-ish").unwrap_err().contains("neither"));
    }
}
