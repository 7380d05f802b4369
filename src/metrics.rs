//! What the guard counts and times, through the [`metrics`](https://docs.rs/metrics) facade:
//! nothing is recorded until the application installs a recorder (the exporter of its
//! choice), and a process without one pays one relaxed atomic load per measurement.
//!
//! | Name | Kind | Labels | What |
//! |---|---|---|---|
//! | `mcp_replay_guard_calls_total` | counter | `tool`, `decision` | guarded `tools/call`s by what the ledger decided (`start`, `continue`, `attach`, `resend`, `probe`, `return_stored`, `repeat_denial`, `uncertain`) |
//! | `mcp_replay_guard_outcomes_total` | counter | `tool`, `outcome` | outcomes recorded: `completed`, `failed`, `unknown`, `not_sent`, `denied`, `delivered`, `needs_review`, `resolved` |
//! | `mcp_replay_guard_held_executions` | gauge | `tool` | executions held now (`unknown` or `needs_review`): the number to alert on; set by [`GuardHandle::record_held`](crate::guard::GuardHandle::record_held) from the ledger, so a resolution by another process counts |
//! | `mcp_replay_guard_repeats_total` | counter | `tool`, `answer` | repeats answered from the ledger: `attached` (to a live attempt), `kept_result`, `held` |
//! | `mcp_replay_guard_added_latency_seconds` | histogram | `tool` | the guard's own time before a call is sent or answered without the target |
//! | `mcp_replay_guard_ledger_write_seconds` | histogram | `durability` | one ledger write: `synced` (on disk before it is acknowledged) or `unsynced` |
//!
//! Label values are bounded: a tool is named by the first [`MAX_TOOL_LABELS`] tool names this
//! process sees (the policy's first), every other one is `other`. No actor, key, fingerprint
//! or argument is ever a label.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex, OnceLock},
    time::Instant,
};

use crate::execution::EventKind;

/// Guarded `tools/call`s by decision.
pub const CALLS: &str = "mcp_replay_guard_calls_total";
/// Recorded outcomes.
pub const OUTCOMES: &str = "mcp_replay_guard_outcomes_total";
/// Executions held now.
pub const HELD: &str = "mcp_replay_guard_held_executions";
/// Repeats answered from the ledger.
pub const REPEATS: &str = "mcp_replay_guard_repeats_total";
/// The guard's own time on a call.
pub const ADDED_LATENCY: &str = "mcp_replay_guard_added_latency_seconds";
/// One ledger write.
pub const LEDGER_WRITE: &str = "mcp_replay_guard_ledger_write_seconds";

/// How many distinct tool names are labels; every later one is `other`.
pub const MAX_TOOL_LABELS: usize = 100;

/// The label of the tools past [`MAX_TOOL_LABELS`].
const OTHER: &str = "other";

/// The longest tool label, in bytes (a longer name is cut at a character boundary).
const MAX_LABEL_BYTES: usize = 128;

/// The tool names that are labels, shared by every guard of the process (as the recorder is).
fn labels() -> &'static Mutex<HashSet<Arc<str>>> {
    static LABELS: OnceLock<Mutex<HashSet<Arc<str>>>> = OnceLock::new();
    LABELS.get_or_init(Mutex::default)
}

/// The label of `tool`: its name while fewer than [`MAX_TOOL_LABELS`] are taken, else `other`.
pub(crate) fn tool_label(tool: &str) -> Arc<str> {
    let mut cut = tool.len().min(MAX_LABEL_BYTES);
    while !tool.is_char_boundary(cut) {
        cut -= 1;
    }
    let tool = &tool[..cut];
    let mut labels = labels()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(label) = labels.get(tool) {
        return label.clone();
    }
    if labels.len() >= MAX_TOOL_LABELS {
        return Arc::from(OTHER);
    }
    let label: Arc<str> = Arc::from(tool);
    labels.insert(label.clone());
    label
}

/// Takes the labels of a policy's tools first (while the cap allows).
pub(crate) fn name_tools<'a>(tools: impl Iterator<Item = &'a str>) {
    for tool in tools {
        tool_label(tool);
    }
}

/// The tool labels taken so far (the held gauge sets each, so one that went to zero reads 0).
fn taken_labels() -> Vec<Arc<str>> {
    let labels = labels()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    labels.iter().cloned().collect()
}

/// A guarded call decided.
pub(crate) fn decided(tool: &str, decision: &'static str) {
    metrics::counter!(CALLS, "tool" => tool_label(tool), "decision" => decision).increment(1);
}

/// A repeat answered from the ledger.
pub(crate) fn repeat(tool: &str, answer: &'static str) {
    metrics::counter!(REPEATS, "tool" => tool_label(tool), "answer" => answer).increment(1);
}

/// The guard's own time on a call that started at `started`.
pub(crate) fn added(tool: &str, started: Instant) {
    metrics::histogram!(ADDED_LATENCY, "tool" => tool_label(tool))
        .record(started.elapsed().as_secs_f64());
}

/// The outcome an event records, when it records one (its name, the metric's label).
pub(crate) fn outcome_of(kind: &EventKind) -> Option<&'static str> {
    match kind {
        EventKind::Completed { .. }
        | EventKind::Failed { .. }
        | EventKind::Unknown { .. }
        | EventKind::NotSent { .. }
        | EventKind::Denied { .. }
        | EventKind::Delivered { .. }
        | EventKind::NeedsReview { .. }
        | EventKind::Resolved { .. } => Some(kind.name()),
        _ => None,
    }
}

/// An outcome recorded for an execution of `tool`.
pub(crate) fn recorded(tool: &str, outcome: &'static str) {
    metrics::counter!(OUTCOMES, "tool" => tool_label(tool), "outcome" => outcome).increment(1);
}

/// One ledger write that took from `started` until now.
pub(crate) fn ledger_write(synced: bool, started: Instant) {
    let durability = if synced { "synced" } else { "unsynced" };
    metrics::histogram!(LEDGER_WRITE, "durability" => durability)
        .record(started.elapsed().as_secs_f64());
}

/// Sets the held gauge of every tool label from `held` (the tool of each held execution).
pub(crate) fn set_held<'a>(held: impl Iterator<Item = &'a str>) {
    let mut counts: std::collections::HashMap<Arc<str>, u32> = std::collections::HashMap::new();
    for tool in held {
        *counts.entry(tool_label(tool)).or_default() += 1;
    }
    for label in taken_labels().into_iter().chain([Arc::from(OTHER)]) {
        let count = counts.get(&label).copied().unwrap_or(0);
        metrics::gauge!(HELD, "tool" => label).set(f64::from(count));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_label_is_cut_at_a_character_boundary_and_reused() {
        let long = "é".repeat(100);
        let label = tool_label(&long);
        assert!(label.len() <= MAX_LABEL_BYTES);
        assert!(long.starts_with(&*label));
        assert!(Arc::ptr_eq(&label, &tool_label(&long)));
    }

    #[test]
    fn past_the_cap_every_new_tool_is_other() {
        for n in 0..MAX_TOOL_LABELS + 5 {
            tool_label(&format!("cap-test-{n}"));
        }
        assert_eq!(&*tool_label("a-tool-seen-after-the-cap"), OTHER);
        assert!(labels().lock().unwrap().len() <= MAX_TOOL_LABELS);
    }
}
