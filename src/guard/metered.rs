//! `Metered`: the guard's ledger, counting each outcome it records and timing each write, and
//! telling the held hook of each execution that becomes held.
//!
//! Every event the guard records passes here, whichever step recorded it (the answer, a
//! dropped body, an orphan marked unknown, a refusal), so an outcome is counted in one place.

use std::{sync::Arc, time::Instant};

use async_trait::async_trait;
use bytes::Bytes;

use super::held::SharedHeldHook;
use crate::{
    ExecutionId,
    execution::{Claim, Claimed, Dispatch, ExecutionRecord, LedgerEvent},
    ledger::{Ledger, LedgerError},
    metrics,
};

/// A ledger whose writes are counted and timed, and whose held executions are told.
#[derive(Debug)]
pub(super) struct Metered {
    inner: Arc<dyn Ledger>,
    held: SharedHeldHook,
}

impl Metered {
    pub(super) fn new(inner: Arc<dyn Ledger>, held: SharedHeldHook) -> Self {
        Self { inner, held }
    }

    fn counted(
        &self,
        written: Result<ExecutionRecord, LedgerError>,
        outcome: Option<&'static str>,
        synced: bool,
        started: Instant,
    ) -> Result<ExecutionRecord, LedgerError> {
        metrics::ledger_write(synced, started);
        if let Ok(record) = &written
            && let Some(outcome) = outcome
        {
            metrics::recorded(&record.tool, outcome);
            // The call whose write this is (its span, when it has one) names its outcome.
            tracing::Span::current().record("outcome", outcome);
            self.held.written(record);
        }
        written
    }
}

#[async_trait]
impl Ledger for Metered {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        let started = Instant::now();
        let claimed = self.inner.claim(claim).await;
        metrics::ledger_write(true, started);
        claimed
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        let started = Instant::now();
        let claimed = self.inner.claim_dispatched(claim, dispatch).await;
        metrics::ledger_write(true, started);
        claimed
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        // The outcome's name, read before the event moves: no copy of it per write.
        let (started, outcome) = (Instant::now(), metrics::outcome_of(&event.kind));
        self.counted(self.inner.append(event).await, outcome, true, started)
    }

    async fn append_unsynced(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        // The outcome's name, read before the event moves: no copy of it per write.
        let (started, outcome) = (Instant::now(), metrics::outcome_of(&event.kind));
        self.counted(
            self.inner.append_unsynced(event).await,
            outcome,
            false,
            started,
        )
    }

    async fn complete(
        &self,
        event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        // The outcome's name, read before the event moves: no copy of it per write.
        let (started, outcome) = (Instant::now(), metrics::outcome_of(&event.kind));
        self.counted(
            self.inner.complete(event, result).await,
            outcome,
            true,
            started,
        )
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        self.inner.get(execution_id).await
    }

    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        self.inner.events(execution_id).await
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        self.inner.list().await
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        self.inner.store_result(execution_id, result).await
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        self.inner.load_result(reference).await
    }

    async fn is_owner_alive(&self, owner: &str) -> bool {
        self.inner.is_owner_alive(owner).await
    }
}
