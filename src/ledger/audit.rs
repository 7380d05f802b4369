//! The investigation of one execution: [`Timeline::of`] answers, in order, the questions an
//! incident review asks.
//!
//! 1. One agent process or two? (the guards that accepted and dispatched it)
//! 2. Did the first call get authorised and dispatched?
//! 3. Did the target answer?
//! 4. Did delivery fail after the target finished?
//! 5. Did the second call reuse the execution ID, carry a key, or start a new attempt?

use std::{borrow::Cow, fmt};

use serde::Serialize;

use super::{ClientInfo, EventKind, LedgerEvent, Timestamp};
use crate::{ExecutionId, IdempotencyKey};

/// The answers for one execution.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Timeline {
    /// The execution.
    pub execution_id: ExecutionId,
    /// The agent processes (guard owners) that accepted or dispatched it, in order of
    /// appearance.
    pub processes: Vec<String>,
    /// When it was authorised, if it was; the denial, if it was denied.
    pub authorized_at: Option<Timestamp>,
    /// Why it was denied.
    pub denied: Option<String>,
    /// Its first dispatch.
    pub first_dispatch: Option<Dispatch>,
    /// What the target said: `completed` (with status), `failed`, `unknown`, `not_sent`, or
    /// nothing yet.
    pub target_answer: Option<String>,
    /// An operator (or a probe) settled it, and then the target's own answer said otherwise
    /// or came anyway: both are recorded, and this says what disagrees.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    /// The target finished but the result never reached the caller.
    pub delivery_failed_after_completion: bool,
    /// The dispatches after the first: each reused the execution ID; the key tells whether it
    /// was the same.
    pub later_dispatches: Vec<Dispatch>,
    /// Repeats answered without sending (a kept result handed back, a denial repeated, an
    /// uncertain answer): deliveries after the first.
    pub answered_without_sending: usize,
    /// Every event, oldest first.
    pub events: Vec<LedgerEvent>,
}

/// One dispatch of the execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Dispatch {
    /// When.
    pub at: Timestamp,
    /// Attempt number.
    pub attempt: u32,
    /// The key sent.
    pub idempotency_key: IdempotencyKey,
    /// Whether the caller chose the key.
    pub key_from_caller: bool,
    /// The guard that sent it.
    pub process: Option<String>,
    /// The `Mcp-Session-Id` it was sent in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The client that sent it, as it named itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_info: Option<ClientInfo>,
}

impl Dispatch {
    /// ` (session S, client NAME VERSION)`, or nothing when neither is known.
    fn correlation(&self) -> String {
        let parts: Vec<String> = [
            self.session_id.as_ref().map(|s| format!("session {s}")),
            self.client_info.as_ref().map(|c| format!("client {c}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    }
}

impl Timeline {
    /// The timeline of one execution, from its events (oldest first).
    pub fn of(execution_id: ExecutionId, events: Vec<LedgerEvent>) -> Self {
        let mut t = Timeline {
            execution_id,
            processes: Vec::new(),
            authorized_at: None,
            denied: None,
            first_dispatch: None,
            target_answer: None,
            conflict: None,
            delivery_failed_after_completion: false,
            later_dispatches: Vec::new(),
            answered_without_sending: 0,
            events: Vec::new(),
        };
        let mut completed = false;
        let mut deliveries: usize = 0;
        // The latest resolution, until an answer of the target follows it.
        let mut settled: Option<String> = None;
        for event in &events {
            match &event.kind {
                EventKind::Accepted { owner, .. } => note_process(&mut t.processes, owner),
                EventKind::Authorized => t.authorized_at = Some(event.at),
                EventKind::Denied { reason } => t.denied = Some(reason.clone()),
                EventKind::Dispatched {
                    attempt,
                    idempotency_key,
                    key_from_caller,
                    owner,
                    session_id,
                    client_info,
                    ..
                } => {
                    if let Some(owner) = owner {
                        note_process(&mut t.processes, owner);
                    }
                    // A new attempt after a resolution (not applied): its answer is its own.
                    settled = None;
                    let dispatch = Dispatch {
                        at: event.at,
                        attempt: *attempt,
                        idempotency_key: idempotency_key.clone(),
                        key_from_caller: *key_from_caller,
                        process: owner.clone(),
                        session_id: session_id.clone(),
                        client_info: client_info.clone(),
                    };
                    if t.first_dispatch.is_none() {
                        t.first_dispatch = Some(dispatch);
                    } else {
                        t.later_dispatches.push(dispatch);
                    }
                }
                EventKind::Completed {
                    target_status,
                    is_error,
                    ..
                } => {
                    completed = true;
                    let tool_error = if *is_error {
                        ", the tool reported an error"
                    } else {
                        ""
                    };
                    let answer = format!("completed (HTTP {target_status}{tool_error})");
                    if let Some(settled) = settled.take() {
                        t.conflict = Some(format!(
                            "{settled}, then the target answered: {answer} at {}",
                            event.at
                        ));
                    }
                    t.target_answer = Some(answer);
                }
                EventKind::Failed {
                    target_status,
                    reason,
                } => {
                    let status = target_status
                        .map(|s| format!("HTTP {s}: "))
                        .unwrap_or_default();
                    t.target_answer = Some(format!("failed ({status}{reason})"));
                }
                EventKind::Unknown { reason, .. } => {
                    t.target_answer = Some(format!("unknown ({reason})"))
                }
                EventKind::NotSent { reason } => {
                    t.target_answer = Some(format!("not sent ({reason})"))
                }
                EventKind::Resolved {
                    applied, by, note, ..
                } => {
                    completed |= *applied;
                    let what = if *applied { "applied" } else { "not applied" };
                    t.target_answer = Some(format!("settled as {what} by {by} ({note})"));
                    settled = Some(format!("settled as {what} by {by} at {}", event.at));
                }
                EventKind::Delivered { .. } => deliveries += 1,
                _ => {}
            }
        }
        t.delivery_failed_after_completion = completed && deliveries == 0;
        t.answered_without_sending = deliveries.saturating_sub(1);
        t.events = events;
        t
    }
}

/// `text` as it may be printed on a terminal: every control character escaped (`\n`,
/// `\u{1b}`), every invisible character that reorders or hides text escaped (`\u{202e}`), and
/// backslashes doubled so that an escape is never ambiguous. What a ledger records (tool names,
/// reasons, owners, notes, targets) comes from callers, servers and operators: printed raw, a
/// newline forges a line of the report and an escape sequence reaches the terminal. Every
/// text report of a ledger prints recorded text through this one function.
pub fn printable(text: &str) -> Cow<'_, str> {
    fn hidden(c: char) -> bool {
        c.is_control()
            || matches!(c,
                '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    }
    if !text.chars().any(|c| c == '\\' || hidden(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' | '\r' | '\t' => out.extend(c.escape_default()),
            c if hidden(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn note_process(processes: &mut Vec<String>, owner: &str) {
    if !processes.iter().any(|p| p == owner) {
        processes.push(owner.to_owned());
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "execution {}", self.execution_id)?;
        let processes = match self.processes.len() {
            0 => "none recorded".to_owned(),
            1 => format!("one ({})", printable(&self.processes[0])),
            n => format!("{n} ({})", printable(&self.processes.join(", "))),
        };
        writeln!(f, "1. agent processes: {processes}")?;
        let authorized = match (&self.denied, self.authorized_at) {
            (Some(reason), _) => format!("denied ({})", printable(reason)),
            (None, Some(at)) => format!("authorised at {at}"),
            (None, None) => "not authorised".to_owned(),
        };
        let dispatched = match &self.first_dispatch {
            Some(d) => format!(
                "dispatched at {} with Idempotency-Key {}{}",
                d.at,
                printable(&d.idempotency_key.to_string()),
                printable(&d.correlation())
            ),
            None => "never dispatched".to_owned(),
        };
        writeln!(f, "2. first call: {authorized}; {dispatched}")?;
        writeln!(
            f,
            "3. target: {}",
            printable(
                self.target_answer
                    .as_deref()
                    .unwrap_or("no answer recorded")
            )
        )?;
        if let Some(conflict) = &self.conflict {
            writeln!(f, "   conflict: {conflict}")?;
        }
        let delivery = if self.delivery_failed_after_completion {
            "yes: the target finished but the result never reached the caller"
        } else {
            "no"
        };
        writeln!(
            f,
            "4. delivery failed after the target finished: {delivery}"
        )?;
        if self.later_dispatches.is_empty() && self.answered_without_sending == 0 {
            writeln!(f, "5. later calls: none")?;
        } else {
            let first_key = self.first_dispatch.as_ref().map(|d| &d.idempotency_key);
            for d in &self.later_dispatches {
                let key = if Some(&d.idempotency_key) == first_key {
                    "the same key"
                } else {
                    "another key"
                };
                writeln!(
                    f,
                    "5. attempt {} reused execution {} with {key} ({}) at {}{}",
                    d.attempt,
                    self.execution_id,
                    printable(&d.idempotency_key.to_string()),
                    d.at,
                    printable(&d.correlation())
                )?;
            }
            if self.answered_without_sending > 0 {
                writeln!(
                    f,
                    "5. {} repeat(s) answered by the guard without sending",
                    self.answered_without_sending
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::{Claim, RetryClass, fixtures};

    /// An operator settled the call as not applied, and then the target's own answer came:
    /// both are in the timeline, and the conflict is said in so many words.
    #[test]
    fn a_resolution_the_target_contradicted_shows_as_a_conflict() {
        let id = ExecutionId::new();
        let claim = fixtures::claim(RetryClass::Irreversible, "guard:one");
        let at = |ms, kind| fixtures::event_at(id, ms, kind);
        let events = vec![
            claim.accepted_event(id),
            at(1, fixtures::dispatched(id, 1, Some("guard:one"))),
            at(
                2,
                EventKind::NeedsReview {
                    reason: "held".into(),
                },
            ),
            at(
                3,
                EventKind::Resolved {
                    applied: false,
                    by: "operator:bob".into(),
                    note: "nothing deployed".into(),
                    result_reference: None,
                    attempt: Some(1),
                },
            ),
            at(
                4,
                EventKind::Completed {
                    target_status: 200,
                    is_error: false,
                    result_reference: None,
                },
            ),
        ];
        let t = Timeline::of(id, events);
        let conflict = t.conflict.as_deref().expect("a conflict");
        assert!(
            conflict.starts_with("settled as not applied by operator:bob")
                && conflict.contains("then the target answered: completed (HTTP 200)"),
            "{conflict}"
        );
        assert_eq!(t.events.len(), 5, "both kept");
        assert!(
            t.to_string()
                .contains("   conflict: settled as not applied")
        );
        // A re-send after the resolution answers for itself: no conflict.
        let mut resent = t.events.clone();
        resent.insert(4, at(4, fixtures::dispatched(id, 2, Some("guard:two"))));
        assert_eq!(Timeline::of(id, resent).conflict, None);
    }

    #[test]
    fn the_timeline_answers_the_five_questions() {
        let id = ExecutionId::new();
        let claim = Claim {
            tool: "deploy_release".into(),
            target: "t".into(),
            at: Timestamp::from_millis(1_000),
            ..fixtures::claim(RetryClass::Idempotent, "guard:one")
        };
        let at = |ms, kind| fixtures::event_at(id, ms, kind);
        let dispatched = |owner, attempt| fixtures::dispatched(id, attempt, Some(owner));
        let events = vec![
            claim.accepted_event(id),
            at(1_001, EventKind::Authorized),
            at(1_002, dispatched("guard:one", 1)),
            at(
                2_000,
                EventKind::Unknown {
                    target_status: None,
                    attempt: None,
                    reason: "stream cut".into(),
                },
            ),
            at(3_000, dispatched("guard:two", 2)),
            at(
                3_100,
                EventKind::Completed {
                    target_status: 200,
                    is_error: false,
                    result_reference: None,
                },
            ),
        ];
        let t = Timeline::of(id, events);
        assert_eq!(t.processes, ["guard:one", "guard:two"]);
        assert_eq!(t.authorized_at, Some(Timestamp::from_millis(1_001)));
        assert_eq!(t.first_dispatch.as_ref().unwrap().attempt, 1);
        assert_eq!(t.target_answer.as_deref(), Some("completed (HTTP 200)"));
        assert!(t.delivery_failed_after_completion);
        assert_eq!(t.later_dispatches.len(), 1);
        let text = t.to_string();
        assert!(
            text.contains("1. agent processes: 2 (guard:one, guard:two)"),
            "{text}"
        );
        assert!(
            text.contains("4. delivery failed after the target finished: yes"),
            "{text}"
        );
        assert!(text.contains("with the same key"), "{text}");
    }
}
