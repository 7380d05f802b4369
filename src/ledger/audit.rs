//! The investigation of one execution: [`Timeline::of`] answers, in order, the questions an
//! incident review asks.
//!
//! 1. One agent process or two? (the guards that accepted and dispatched it)
//! 2. Did the first call cross the dispatch boundary? (authorised, or no hook; dispatched)
//! 3. Did the target answer?
//! 4. Did delivery fail after the target finished?
//! 5. Did a later call reuse the execution, carry a key, or start a new one? (and how often
//!    a repeat was answered from the ledger, with what)
//!
//! [`Timeline::answers`] says them in words; every report of a timeline uses those words.

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
    /// The authorization in words: `authorised at …`, `denied (…)`, `no authorization hook
    /// configured` (dispatched without an `authorized` event: the guard authorises before it
    /// dispatches whenever it has a hook), or `not authorised yet`.
    pub authorization: String,
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
    /// Repeats answered from the ledger without sending (attached to a live attempt, a kept
    /// result handed back, held): how often an agent asked again, and what it was told.
    pub repeats: Vec<Repeat>,
    /// Every event, oldest first.
    pub events: Vec<LedgerEvent>,
}

/// One repeat answered from the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Repeat {
    /// When.
    pub at: Timestamp,
    /// `attached`, `kept_result`, `held` or `result_not_kept`.
    pub answer: String,
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
            authorization: String::new(),
            denied: None,
            first_dispatch: None,
            target_answer: None,
            conflict: None,
            delivery_failed_after_completion: false,
            later_dispatches: Vec::new(),
            repeats: Vec::new(),
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
                    applied,
                    by,
                    note,
                    probe,
                    ..
                } => {
                    completed |= *applied;
                    let what = if *applied { "applied" } else { "not applied" };
                    let probed = probe
                        .as_ref()
                        .map(|said| format!("; the probe answered: {said}"))
                        .unwrap_or_default();
                    t.target_answer = Some(format!("settled as {what} by {by} ({note}){probed}"));
                    settled = Some(format!("settled as {what} by {by} at {}", event.at));
                }
                EventKind::Delivered { .. } => deliveries += 1,
                EventKind::Repeated { answer } => t.repeats.push(Repeat {
                    at: event.at,
                    answer: answer.clone(),
                }),
                _ => {}
            }
        }
        t.delivery_failed_after_completion = completed && deliveries == 0;
        t.authorization = match (&t.denied, t.authorized_at, &t.first_dispatch) {
            (Some(reason), _, _) => format!("denied ({})", printable(reason)),
            (None, Some(at), _) => format!("authorised at {at}"),
            (None, None, Some(_)) => "no authorization hook configured".to_owned(),
            (None, None, None) => "not authorised yet".to_owned(),
        };
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

/// One of the five questions, with its answer as lines of raw text (a report escapes them for
/// where it shows them: [`printable`] on a terminal, HTML escaping on a page).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Answer {
    /// The question, as an incident review asks it.
    pub question: &'static str,
    /// The answer.
    pub lines: Vec<String>,
}

impl Timeline {
    /// The five questions of an incident review, in their order, answered: every report of a
    /// timeline (the text of `audit show`, its JSON, the review page) says these words.
    pub fn answers(&self) -> [Answer; 5] {
        let answer = |question, lines| Answer { question, lines };
        let processes = match self.processes.len() {
            0 => "none recorded".to_owned(),
            1 => format!("one ({})", self.processes[0]),
            n => format!("{n} ({})", self.processes.join(", ")),
        };
        let dispatched = match &self.first_dispatch {
            Some(d) => format!(
                "dispatched at {} with Idempotency-Key {}{}",
                d.at,
                d.idempotency_key,
                d.correlation()
            ),
            None => "never dispatched".to_owned(),
        };
        let mut target = vec![
            self.target_answer
                .clone()
                .unwrap_or_else(|| "no answer recorded".to_owned()),
        ];
        if let Some(conflict) = &self.conflict {
            target.push(format!("conflict: {conflict}"));
        }
        let delivery = if self.delivery_failed_after_completion {
            "yes: the target finished but the result never reached the caller"
        } else {
            "no"
        };
        [
            answer("One agent process or two?", vec![processes]),
            answer(
                "Did the first call cross the dispatch boundary?",
                vec![format!("{}; {dispatched}", self.authorization)],
            ),
            answer("Did the target answer?", target),
            answer(
                "Did delivery fail after the target finished?",
                vec![delivery.to_owned()],
            ),
            answer(
                "Did a later call reuse the execution, carry a key, or start a new one?",
                self.later_calls(),
            ),
        ]
    }

    /// The fifth answer: each later dispatch (the same execution, and which key), then the
    /// repeats answered from the ledger, counted by answer.
    fn later_calls(&self) -> Vec<String> {
        let first_key = self.first_dispatch.as_ref().map(|d| &d.idempotency_key);
        let mut lines: Vec<String> = self
            .later_dispatches
            .iter()
            .map(|d| {
                let key = if Some(&d.idempotency_key) == first_key {
                    "the same key"
                } else {
                    "another key"
                };
                format!(
                    "attempt {} reused execution {} with {key} ({}) at {}{}",
                    d.attempt,
                    self.execution_id,
                    d.idempotency_key,
                    d.at,
                    d.correlation()
                )
            })
            .collect();
        if let Some(last) = self.repeats.last() {
            let mut counts: Vec<(&str, usize)> = Vec::new();
            for repeat in &self.repeats {
                match counts.iter_mut().find(|(a, _)| *a == repeat.answer) {
                    Some((_, n)) => *n += 1,
                    None => counts.push((&repeat.answer, 1)),
                }
            }
            let counts: Vec<String> = counts.iter().map(|(a, n)| format!("{a} {n}")).collect();
            lines.push(format!(
                "asked again {} time(s), answered from the ledger without sending ({}), the last at {}",
                self.repeats.len(),
                counts.join(", "),
                last.at
            ));
        }
        if lines.is_empty() {
            lines.push("none".to_owned());
        }
        lines
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "execution {}", self.execution_id)?;
        for (n, answer) in self.answers().iter().enumerate() {
            let mut lines = answer.lines.iter();
            let first = lines.next().map(String::as_str).unwrap_or_default();
            writeln!(f, "{}. {} {}", n + 1, answer.question, printable(first))?;
            for line in lines {
                writeln!(f, "   {}", printable(line))?;
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
                    probe: None,
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
            text.contains("1. One agent process or two? 2 (guard:one, guard:two)"),
            "{text}"
        );
        assert!(
            text.contains("4. Did delivery fail after the target finished? yes"),
            "{text}"
        );
        assert!(text.contains("with the same key"), "{text}");
        assert!(text.contains("2. Did the first call cross the dispatch boundary? authorised at"));
    }

    /// Dispatched with no `authorized` event: the guard had no authorization hook (it
    /// authorises before dispatching whenever it has one), never "not authorised". Repeats
    /// answered from the ledger are counted by what they were told.
    #[test]
    fn no_hook_is_said_as_such_and_held_repeats_are_counted() {
        let id = ExecutionId::new();
        let claim = Claim {
            at: Timestamp::from_millis(1_000),
            ..fixtures::claim(RetryClass::Irreversible, "guard:one")
        };
        let at = |ms, kind| fixtures::event_at(id, ms, kind);
        let repeated = |answer: &str| EventKind::Repeated {
            answer: answer.into(),
        };
        let events = vec![
            claim.accepted_event(id),
            at(1_002, fixtures::dispatched(id, 1, Some("guard:one"))),
            at(
                2_000,
                EventKind::Unknown {
                    target_status: None,
                    attempt: None,
                    reason: "stream cut".into(),
                },
            ),
            at(
                2_001,
                EventKind::NeedsReview {
                    reason: "irreversible".into(),
                },
            ),
            at(2_001, repeated("held")),
            at(5_000, repeated("held")),
            at(9_000, repeated("held")),
        ];
        let t = Timeline::of(id, events);
        assert_eq!(t.authorization, "no authorization hook configured");
        assert_eq!(t.repeats.len(), 3);
        let text = t.to_string();
        assert!(
            text.contains("2. Did the first call cross the dispatch boundary? no authorization hook configured; dispatched at"),
            "{text}"
        );
        assert!(
            text.contains("asked again 3 time(s), answered from the ledger without sending (held 3), the last at 1970-01-01T00:00:09.000Z"),
            "{text}"
        );
        assert!(!text.contains("none"), "{text}");
        let accepted_only = Timeline::of(id, vec![claim.accepted_event(id)]);
        assert_eq!(accepted_only.authorization, "not authorised yet");
        assert_eq!(accepted_only.answers()[4].lines, ["none"]);
    }
}
