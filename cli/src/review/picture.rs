//! One execution's timeline as a picture (inline SVG, no script): each event a mark on a time
//! axis, in the order the ledger recorded them, with its name, its time, and the gap since the
//! one before labelled between them. Marks are spaced by the logarithm of their gap, so that
//! milliseconds and hours both stay readable, and the labels say the real gap.
//!
//! Every event is drawn (a kind this page does not know, by its name). A run of events of one
//! kind in a row (the event ids seen on an answer's stream, an agent asking again and again)
//! is one mark, `×N`, so that the picture stays as wide as the story: the table of events
//! under it lists each one.

use maud::{Markup, html};
use mcp_replay_guard::execution::{EventKind, LedgerEvent};

use super::span::span;

/// Where the axis runs, and the room each mark's labels take.
const AXIS_Y: u32 = 70;
const FIRST_X: f64 = 70.0;
const MIN_STEP: f64 = 120.0;
/// Pixels per tenfold longer gap.
const PER_DECADE: f64 = 18.0;
const HEIGHT: u32 = 124;

/// One event as drawn, or a run of events of one kind.
struct Mark<'a> {
    event: &'a LedgerEvent,
    /// How many events of its kind in a row it stands for, and the last of them.
    count: usize,
    last: &'a LedgerEvent,
    x: f64,
    /// The milliseconds since the mark before (none for the first).
    gap: Option<u64>,
}

/// The picture of `events` (oldest first).
pub(super) fn picture(events: &[LedgerEvent]) -> Markup {
    let marks = marks(events);
    let width = marks.last().map_or(FIRST_X, |m| m.x) + 90.0;
    let drawn = marks.len();
    html! {
        svg xmlns="http://www.w3.org/2000/svg" class="timeline" width=(px(width)) height=(HEIGHT)
            viewBox={ "0 0 " (px(width)) " " (HEIGHT) } role="img"
            aria-label={ "Timeline of " (drawn) " events" } {
            line.axis x1=(px(FIRST_X - 30.0)) y1=(AXIS_Y) x2=(px(width - 40.0)) y2=(AXIS_Y) {}
            @for (i, mark) in marks.iter().enumerate() {
                @if let Some(gap) = mark.gap {
                    text.gap x=(px(mark.x - step(gap) / 2.0)) y=(AXIS_Y - 6) text-anchor="middle" {
                        "+" (span(gap))
                    }
                }
                (draw(mark, i == 0 || day_changed(&marks, i)))
            }
        }
    }
}

/// The marks of `events`, each placed after the one before by its gap.
fn marks(events: &[LedgerEvent]) -> Vec<Mark<'_>> {
    let mut marks: Vec<Mark<'_>> = Vec::new();
    for event in events {
        if let Some(run) = marks.last_mut()
            && run.event.kind.name() == event.kind.name()
            && !matches!(event.kind, EventKind::Dispatched { .. })
        {
            run.count += 1;
            run.last = event;
            continue;
        }
        let (x, gap) = match marks.last() {
            None => (FIRST_X, None),
            Some(before) => {
                // A clock stepped back is drawn as no gap, never as a step left.
                let gap = event
                    .at
                    .as_millis()
                    .saturating_sub(before.last.at.as_millis());
                (before.x + step(gap), Some(gap))
            }
        };
        marks.push(Mark {
            event,
            count: 1,
            last: event,
            x,
            gap,
        });
    }
    marks
}

/// A position in whole pixels.
fn px(position: f64) -> i64 {
    position.round() as i64
}

/// How far apart two marks `gap` milliseconds apart are drawn.
fn step(gap: u64) -> f64 {
    MIN_STEP + PER_DECADE * (1.0 + gap as f64).log10()
}

/// Whether mark `i` falls on another day than the one before (its date is then written).
fn day_changed(marks: &[Mark<'_>], i: usize) -> bool {
    let day = |mark: &Mark<'_>| mark.event.at.as_millis() / 86_400_000;
    i > 0 && day(&marks[i]) != day(&marks[i - 1])
}

fn draw(mark: &Mark<'_>, with_date: bool) -> Markup {
    let event = mark.event;
    let name = event.kind.name();
    // `2026-07-22T14:03:18.512Z`: the date, and the time of day to the millisecond.
    let at = event.at.to_string();
    let date = at.get(..10).unwrap_or(&at);
    let time = time_of(&at);
    html! {
        g class={ "mark " (tone(&event.kind)) } data-event=(name) {
            title { (name) " at " (at) }
            circle cx=(px(mark.x)) cy=(AXIS_Y) r="7" {}
            text.name x=(px(mark.x)) y=(AXIS_Y - 24) text-anchor="middle" { (name) }
            @if mark.count > 1 {
                text.detail x=(px(mark.x)) y=(AXIS_Y - 40) text-anchor="middle" {
                    "×" (mark.count) ", the last at " (time_of(&mark.last.at.to_string()))
                }
            } @else if let Some(detail) = detail(&event.kind) {
                text.detail x=(px(mark.x)) y=(AXIS_Y - 40) text-anchor="middle" { (detail) }
            }
            text.time x=(px(mark.x)) y=(AXIS_Y + 24) text-anchor="middle" { (time) }
            @if with_date {
                text.time x=(px(mark.x)) y=(AXIS_Y + 40) text-anchor="middle" { (date) " UTC" }
            }
        }
    }
}

/// The time of day of a timestamp as it is written (`14:03:18.512`).
fn time_of(at: &str) -> &str {
    at.get(11..23).unwrap_or(at)
}

/// The colour class of an event: an answer that settles, a doubt, or a refusal.
fn tone(kind: &EventKind) -> &'static str {
    match kind {
        EventKind::Completed { .. } | EventKind::Delivered { .. } => "good",
        EventKind::Unknown { .. } | EventKind::NeedsReview { .. } => "doubt",
        EventKind::Failed { .. } | EventKind::Denied { .. } | EventKind::NotSent { .. } => "bad",
        _ => "plain",
    }
}

/// A few words over an event's name: which attempt, what status, which settlement.
fn detail(kind: &EventKind) -> Option<String> {
    match kind {
        EventKind::Dispatched { attempt, .. } => Some(format!("attempt {attempt}")),
        EventKind::Completed {
            target_status,
            is_error,
            ..
        } => Some(match is_error {
            true => format!("HTTP {target_status}, tool error"),
            false => format!("HTTP {target_status}"),
        }),
        EventKind::Failed {
            target_status: Some(status),
            ..
        }
        | EventKind::Unknown {
            target_status: Some(status),
            ..
        } => Some(format!("HTTP {status}")),
        EventKind::Resolved { applied, .. } => Some(
            match applied {
                true => "applied",
                false => "not applied",
            }
            .to_owned(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use mcp_replay_guard::{
        ExecutionId,
        execution::{EventKind, LedgerEvent, Timestamp},
    };

    use super::*;

    fn event(millis: u64, kind: EventKind) -> LedgerEvent {
        LedgerEvent {
            execution_id: ExecutionId::new(),
            at: Timestamp::from_millis(millis),
            kind,
        }
    }

    #[test]
    fn a_run_of_one_kind_is_one_mark_and_gaps_count_from_its_last() {
        let seen = |millis, id: &str| {
            event(
                millis,
                EventKind::EventSeen {
                    last_event_id: id.into(),
                },
            )
        };
        let events = [
            event(1_000, EventKind::Authorized),
            seen(1_100, "1"),
            seen(1_200, "2"),
            seen(1_300, "3"),
            event(61_300, EventKind::Delivered { jsonrpc_id: None }),
            // A clock stepped back: no gap, never a step left.
            event(500, EventKind::Delivered { jsonrpc_id: None }),
        ];
        let marks = marks(&events);
        let drawn: Vec<_> = marks
            .iter()
            .map(|m| (m.event.kind.name(), m.count, m.gap))
            .collect();
        assert_eq!(
            drawn,
            [
                ("authorized", 1, None),
                ("event_seen", 3, Some(100)),
                ("delivered", 2, Some(60_000)),
            ]
        );
        assert!(marks.windows(2).all(|w| w[0].x < w[1].x));
        assert!(
            marks[2].x - marks[1].x > marks[1].x - marks[0].x,
            "a longer gap is drawn longer"
        );
        let svg = picture(&events).into_string();
        assert!(svg.contains("×3, the last at 00:00:01.300"), "{svg}");
        assert!(svg.contains("+1 min 0 s"), "{svg}");
    }
}
