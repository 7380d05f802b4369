//! A status probe's answer → the guard's next step (`recoverable`): applied → its
//! result, not applied → re-send under the same key, still running → in progress, can't tell →
//! review.

use serde_json::Value;

use crate::contract::ProbeOutcome;

/// What follows a probe, and what it records.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AfterProbe {
    /// Record `resolved_applied` (keeping `result` when the tool's contract keeps results) and
    /// hand the result back: nothing is re-sent.
    HandBack {
        /// The tool result the probe could tell, if any.
        result: Option<Value>,
    },
    /// Record `resolved_not_applied` and send again under the same execution ID and key.
    Resend,
    /// Record nothing and answer that the execution is still in progress.
    InProgress,
    /// Record `needs_review` and answer that the outcome is not known.
    Review {
        /// Why the probe could not tell.
        reason: String,
    },
}

impl AfterProbe {
    /// The step `outcome` leads to.
    pub(crate) fn of(outcome: ProbeOutcome) -> Self {
        match outcome {
            ProbeOutcome::Applied { result } => Self::HandBack { result },
            ProbeOutcome::NotApplied => Self::Resend,
            ProbeOutcome::InProgress => Self::InProgress,
            ProbeOutcome::Unknown { reason } => Self::Review { reason },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The README's "asks its status probe: applied → that result; not applied → re-send same
    /// key; can't tell → review", row by row, and a task still working.
    #[test]
    fn the_probe_table() {
        let rows = [
            (
                "applied → that result",
                ProbeOutcome::Applied {
                    result: Some(json!({"content": []})),
                },
                AfterProbe::HandBack {
                    result: Some(json!({"content": []})),
                },
            ),
            (
                "applied, result not told",
                ProbeOutcome::Applied { result: None },
                AfterProbe::HandBack { result: None },
            ),
            (
                "not applied → re-send same key",
                ProbeOutcome::NotApplied,
                AfterProbe::Resend,
            ),
            (
                "still running",
                ProbeOutcome::InProgress,
                AfterProbe::InProgress,
            ),
            (
                "can't tell → review",
                ProbeOutcome::Unknown {
                    reason: "timeout".into(),
                },
                AfterProbe::Review {
                    reason: "timeout".into(),
                },
            ),
        ];
        for (row, outcome, expected) in rows {
            assert_eq!(AfterProbe::of(outcome), expected, "{row}");
        }
    }
}
