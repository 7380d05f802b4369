//! The held queue: every execution held now ([`ExecutionState::is_held`]: its outcome is
//! unknown and nothing but a probe or a person settles it), oldest first, each linked to its
//! page.
//!
//! [`ExecutionState::is_held`]: mcp_replay_guard::execution::ExecutionState::is_held

use http::StatusCode;
use maud::html;
use mcp_replay_guard::execution::{ExecutionRecord, Timestamp};

use super::{
    answer::{self, Answer},
    layout,
    site::Site,
    span::span,
};

/// The queue page, read from the ledger now.
pub(super) async fn page(site: &Site) -> Answer {
    let records = match site.ledger.list().await {
        Ok(records) => records,
        Err(error) => return site.unreadable(&error),
    };
    let held = held(records);
    let now = Timestamp::now();
    let body = html! {
        h1 { "Held executions" }
        p {
            "An execution is held when its outcome is unknown and its tool may not be sent \
             again: only a person (or a status probe) settles it, as applied or not applied."
        }
        @if held.is_empty() {
            p.notice { "Nothing is held." }
        } @else {
            table {
                thead { tr {
                    th { "Execution" } th { "Tool" } th { "Actor" } th { "Target" }
                    th { "State" } th { "Accepted" } th { "First dispatch" } th { "Age" }
                } }
                tbody {
                    @for record in &held {
                        @let id = record.execution_id();
                        tr.held-row {
                            td { a.id href={ "/executions/" (id) } { (id) } }
                            td.tool { (record.tool()) }
                            td { (record.actor()) }
                            td { (record.target()) }
                            td.state.held { (record.state_label()) }
                            td { (record.accepted_at()) }
                            td {
                                @match record.dispatched_at() {
                                    Some(at) => (at),
                                    None => "never dispatched",
                                }
                            }
                            td { (span(now.as_millis().saturating_sub(record.accepted_at().as_millis()))) }
                        }
                    }
                }
            }
        }
    };
    let title = format!("{} held", held.len());
    answer::html(StatusCode::OK, layout::page(&title, site.resolving(), body))
}

/// The held executions of `records`, oldest first (then by id, for one order every time).
fn held(records: Vec<ExecutionRecord>) -> Vec<ExecutionRecord> {
    let mut held: Vec<_> = records
        .into_iter()
        .filter(|record| record.state().is_held())
        .collect();
    held.sort_by_key(|record| (record.accepted_at(), record.execution_id()));
    held
}
