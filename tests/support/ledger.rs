//! Waiting on a ledger's state in end-to-end tests (the guard records some outcomes from a
//! background task, e.g. after a caller dropped a body).

use std::time::Duration;

use mcp_replay_guard::ledger::{ExecutionRecord, ExecutionState, Ledger};

/// The first execution that reaches `state`, polling for up to 5 s.
pub async fn wait_for_state(ledger: &impl Ledger, state: ExecutionState) -> ExecutionRecord {
    for _ in 0..250 {
        let records = ledger.list().await.expect("the ledger lists");
        if let Some(record) = records.into_iter().find(|r| r.state == state) {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no execution reached {state}: {:#?}", ledger.list().await);
}
