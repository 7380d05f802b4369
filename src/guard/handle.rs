//! `GuardHandle`: what an operator does with running guards.

use std::{fmt, sync::Arc, time::Duration};

use super::{config::Config, inflight::Inflight, resolve};
use crate::{ExecutionId, execution::ExecutionRecord, ledger::LedgerError};

/// The operator's handle on the guards a [`GuardLayer`](super::GuardLayer) builds, from
/// [`GuardLayer::handle`](super::GuardLayer::handle): settle a held execution, end the
/// background work before the process exits. Clones share the guards' ledger and in-flight
/// state.
#[derive(Clone)]
pub struct GuardHandle {
    pub(super) config: Arc<Config>,
    pub(super) inflight: Arc<Inflight>,
}

impl fmt::Debug for GuardHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardHandle")
            .field("ledger", &self.config.ledger)
            .field("owner", &self.config.owner)
            .finish_non_exhaustive()
    }
}

impl GuardHandle {
    /// Settles a `needs_review` (or unknown) execution as an operator: applied or not applied,
    /// recorded as a `resolved` event with the note. Refused
    /// ([`LedgerError::StillRunning`]) while an attempt may still be running under a live
    /// owner.
    pub async fn resolve(
        &self,
        execution_id: ExecutionId,
        applied: bool,
        operator: &str,
        note: &str,
    ) -> Result<ExecutionRecord, LedgerError> {
        resolve(
            &*self.config.ledger,
            execution_id,
            applied,
            &format!("operator:{operator}"),
            note,
        )
        .await
    }

    /// Sets the gauge of executions held now, by tool, from the ledger (every process's
    /// executions, and those another process resolved): call it before each scrape of the
    /// metrics. Returns how many are held.
    pub async fn record_held(&self) -> Result<usize, LedgerError> {
        let records = self.config.ledger.list().await?;
        let held: Vec<&str> = records
            .iter()
            .filter(|record| record.state.is_held())
            .map(|record| record.tool.as_str())
            .collect();
        crate::metrics::set_held(held.iter().copied());
        Ok(held.len())
    }

    /// Ends the guards' background work, for a process that is about to exit.
    ///
    /// Drains of response bodies that callers dropped before the JSON-RPC response (see
    /// [`GuardLayer::drain_timeout`](super::GuardLayer::drain_timeout)) get up to `grace` to
    /// learn their outcome; then they stop, and their calls are recorded `unknown`. Returns once
    /// every ledger write the guards started in the background has finished, among them the
    /// `unknown` of a call that was dropped between dispatch and outcome. A drain that starts
    /// later stops at once.
    pub async fn shut_down(&self, grace: Duration) {
        let background = &self.inflight.background;
        let mut running = background.running.subscribe();
        if tokio::time::timeout(grace, running.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            background.stop.send_replace(true);
        }
        // The sender lives in the shared in-flight state this handle holds.
        let _ = running.wait_for(|n| *n == 0).await;
    }
}
