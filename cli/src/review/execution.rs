//! One execution's page: its timeline as a picture, what the record says (the target, the
//! first dispatch, the known result, why the guard did not send it again), the investigation's
//! five answers as [`Timeline::of`] gives them, every event, and the resolve form.
//!
//! The answers are the `Timeline`'s own ([`Timeline::answers`]), the words `audit show` prints:
//! the page derives none of them, and escapes them as it shows them.

use http::StatusCode;
use maud::{Markup, html};
use mcp_replay_guard::{
    ExecutionId,
    execution::{ExecutionRecord, ExecutionState, LedgerEvent},
    ledger::audit::Timeline,
};

use super::{
    answer::{self, Answer},
    form::{MAX_NOTE, MAX_OPERATOR, ResolveForm},
    layout,
    picture::picture,
    resolve::Refusal,
    site::Site,
};

/// The page of execution `id`, read from the ledger now; with a refused form's message and
/// the form as it was typed, when `refusal` is given (its status is the page's).
pub(super) async fn page(site: &Site, id: ExecutionId, refusal: Option<Refusal>) -> Answer {
    let record = match site.ledger.get(id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return site.problem(
                StatusCode::NOT_FOUND,
                "No such execution",
                &format!(
                    "The ledger has no execution {id} (or it left the ledger after its \
                     retention)."
                ),
            );
        }
        Err(error) => return site.unreadable(&error),
    };
    let events = match site.ledger.events(id).await {
        Ok(events) => events,
        Err(error) => return site.unreadable(&error),
    };
    let timeline = Timeline::of(id, events);
    // Asked only of an execution in flight: whether its call may still be running.
    let owner_alive = match in_flight(record.state()) {
        true => Some(site.ledger.is_owner_alive(record.owner()).await),
        false => None,
    };
    let status = refusal.as_ref().map_or(StatusCode::OK, |r| r.status);
    let body = html! {
        h1 { "Execution " span.id { (id) } }
        @if let Some(refusal) = &refusal {
            p.refused role="alert" { (refusal.message) }
        }
        p {
            "Tool " code.tool { (record.tool()) } ", now "
            span class={ "state" @if record.state().is_held() { " held" } } { (record.state_label()) }
            "."
        }
        div.picture { (picture(&timeline.events)) }
        div.cols {
            section.record { h2 { "What the record says" } (facts(&record, owner_alive)) }
            section.investigation { h2 { "The investigation" } (answers(&timeline)) }
        }
        section.resolve {
            h2 { "Resolve" }
            (resolution(site, &record, owner_alive, refusal.map(|r| r.form)))
        }
        h2 { "Every event" }
        (event_table(&timeline.events))
    };
    let title = format!("{} {}", record.tool(), record.state_label());
    answer::html(status, layout::page(&title, site.resolving(), body))
}

/// Accepted, authorized or dispatched: an attempt may be under way.
fn in_flight(state: ExecutionState) -> bool {
    matches!(
        state,
        ExecutionState::Accepted | ExecutionState::Authorized | ExecutionState::Dispatched
    )
}

/// The record's facts: who, what, where, when, what came back, and why it was not re-sent.
fn facts(record: &ExecutionRecord, owner_alive: Option<bool>) -> Markup {
    html! {
        dl {
            dt { "Tool" } dd.tool { (record.tool()) }
            dt { "Actor" } dd { (record.actor()) }
            dt { "Intent scope" } dd { (record.intent_scope()) }
            dt { "Target" } dd.target { (record.target()) }
            dt { "Retry class" } dd { (record.retry_class()) }
            dt { "State" } dd { (record.state_label()) }
            dt { "Owner" } dd {
                code { (record.owner()) }
                @match owner_alive {
                    Some(true) => " (alive: its call may still be running)",
                    Some(false) => " (gone)",
                    None => "",
                }
            }
            dt { "Accepted" } dd { (record.accepted_at()) }
            dt { "First dispatch" } dd.first-dispatch {
                @match record.dispatched_at() {
                    Some(at) => (at),
                    None => "never dispatched",
                }
            }
            dt { "Attempts" } dd { (record.attempts()) }
            dt { "Known result" } dd.result { (known_result(record)) }
            dt { "Delivered" } dd {
                @match record.delivered_at() {
                    Some(at) => (at),
                    None => "not recorded",
                }
            }
            dt { "Why it was not sent again" } dd.reason {
                @match record.reason() {
                    Some(reason) => (reason),
                    None => "no reason recorded",
                }
                @if record.earlier_attempt_unknown() {
                    " (an earlier attempt's outcome is unknown too)"
                }
            }
        }
    }
}

/// The target's answer as the record keeps it.
fn known_result(record: &ExecutionRecord) -> Markup {
    html! {
        @match record.target_status() {
            Some(status) => {
                "HTTP " (status)
                @if record.is_error() { ", the tool reported an error" }
                @if let Some(at) = record.completed_at() { ", recorded at " (at) }
                @if let Some(reference) = record.result_reference() {
                    ", kept as " code { (reference) }
                }
            }
            None => "none recorded",
        }
    }
}

/// The five answers of the investigation, in its order, in the `Timeline`'s own words.
fn answers(t: &Timeline) -> Markup {
    html! {
        ol.answers {
            @for answer in t.answers() {
                li {
                    div.q { (answer.question) }
                    @for line in &answer.lines {
                        div { (line) }
                    }
                }
            }
        }
    }
}

/// Whether the execution can be resolved here, and the form when it can.
fn resolution(
    site: &Site,
    record: &ExecutionRecord,
    owner_alive: Option<bool>,
    typed: Option<ResolveForm>,
) -> Markup {
    let state = record.state();
    if !state.is_unsettled() {
        return html! {
            p.notice.settled {
                "Nothing to resolve: the execution is " strong { (record.state_label()) } "."
            }
        };
    }
    let typed = typed.unwrap_or_default();
    html! {
        @if owner_alive == Some(true) {
            p.notice {
                "Its owner " code { (record.owner()) } " is alive: the call may still be in \
                 flight, and only its own answer settles it. Resolving is refused until it \
                 ends, or that process is stopped."
            }
        }
        @if !site.resolving() {
            p.notice {
                "This page is read-only: it was started without a token (--token-file or \
                 REPLAY_GUARD_REVIEW_TOKEN). Resolve with "
                code { "replay-guard resolve --ledger LEDGER " (record.execution_id()) " --applied|--not-applied --note TEXT" }
                "."
            }
        } @else {
            form method="post" action={ "/executions/" (record.execution_id()) "/resolve" } {
                fieldset {
                    legend { "Did the action take effect?" }
                    label {
                        input type="radio" name="outcome" value="applied" required
                            checked[typed.applied == Some(true)];
                        " applied: it took effect (a repeat is answered from the ledger, never run)"
                    }
                    br;
                    label {
                        input type="radio" name="outcome" value="not_applied"
                            checked[typed.applied == Some(false)];
                        " not applied: it did not (a repeat may run it)"
                    }
                }
                label { "What you checked" br;
                    textarea name="note" required maxlength=(MAX_NOTE) { (typed.note) }
                }
                label { "Operator" br;
                    input type="text" name="operator" required maxlength=(MAX_OPERATOR)
                        value=(typed.operator) autocomplete="username";
                }
                label { "Token" br;
                    input type="password" name="token" autocomplete="off";
                }
                button type="submit" { "Resolve" }
            }
        }
    }
}

/// Every event, oldest first, with what it carries.
fn event_table(events: &[LedgerEvent]) -> Markup {
    html! {
        table.events {
            thead { tr { th { "At" } th { "Event" } th { "Details" } } }
            tbody {
                @for event in events {
                    tr {
                        td { (event.at) }
                        td.event { (event.kind.name()) }
                        td { code { (details(event)) } }
                    }
                }
            }
        }
    }
}

/// What an event carries besides its name and time, as `field: value` pairs.
fn details(event: &LedgerEvent) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&event.kind) else {
        return String::new();
    };
    fields
        .into_iter()
        .filter(|(name, _)| name != "event")
        .map(|(name, value)| match value {
            serde_json::Value::String(text) => format!("{name}: {text}"),
            value => format!("{name}: {value}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}
