//! A ledger behind an `Arc` is a ledger.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{Claim, Claimed, Dispatch, ExecutionRecord, Ledger, LedgerError, LedgerEvent};
use crate::ExecutionId;

/// A shared ledger is a ledger: every method goes to the one behind the `Arc`, the methods
/// with a default included, so that a bundled ledger's own one-write `claim_dispatched`,
/// atomic `complete` and unsynced `append_unsynced` run, never the defaults built from the
/// other methods.
#[async_trait]
impl<L: Ledger + ?Sized> Ledger for Arc<L> {
    async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
        (**self).claim(claim).await
    }

    async fn claim_dispatched(
        &self,
        claim: Claim,
        dispatch: Dispatch,
    ) -> Result<Claimed, LedgerError> {
        (**self).claim_dispatched(claim, dispatch).await
    }

    async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        (**self).append(event).await
    }

    async fn append_unsynced(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
        (**self).append_unsynced(event).await
    }

    async fn complete(
        &self,
        event: LedgerEvent,
        result: Option<Bytes>,
    ) -> Result<ExecutionRecord, LedgerError> {
        (**self).complete(event, result).await
    }

    async fn get(&self, execution_id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
        (**self).get(execution_id).await
    }

    async fn events(&self, execution_id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
        (**self).events(execution_id).await
    }

    async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
        (**self).list().await
    }

    async fn store_result(
        &self,
        execution_id: ExecutionId,
        result: Bytes,
    ) -> Result<String, LedgerError> {
        (**self).store_result(execution_id, result).await
    }

    async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
        (**self).load_result(reference).await
    }

    async fn is_owner_alive(&self, owner: &str) -> bool {
        (**self).is_owner_alive(owner).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{
        execution::{
            EventKind, RetryClass,
            fixtures::{claim, event_at},
        },
        ledger::MemoryLedger,
    };

    /// A memory ledger that notes which of its own methods ran.
    #[derive(Debug, Default)]
    struct Noting {
        inner: MemoryLedger,
        ran: Mutex<Vec<&'static str>>,
    }

    impl Noting {
        fn ran(&self, method: &'static str) {
            self.ran.lock().unwrap().push(method);
        }
    }

    #[async_trait]
    impl Ledger for Noting {
        async fn claim(&self, claim: Claim) -> Result<Claimed, LedgerError> {
            self.ran("claim");
            self.inner.claim(claim).await
        }
        async fn claim_dispatched(
            &self,
            claim: Claim,
            dispatch: Dispatch,
        ) -> Result<Claimed, LedgerError> {
            self.ran("claim_dispatched");
            self.inner.claim_dispatched(claim, dispatch).await
        }
        async fn append(&self, event: LedgerEvent) -> Result<ExecutionRecord, LedgerError> {
            self.ran("append");
            self.inner.append(event).await
        }
        async fn append_unsynced(
            &self,
            event: LedgerEvent,
        ) -> Result<ExecutionRecord, LedgerError> {
            self.ran("append_unsynced");
            self.inner.append_unsynced(event).await
        }
        async fn complete(
            &self,
            event: LedgerEvent,
            result: Option<Bytes>,
        ) -> Result<ExecutionRecord, LedgerError> {
            self.ran("complete");
            self.inner.complete(event, result).await
        }
        async fn get(&self, id: ExecutionId) -> Result<Option<ExecutionRecord>, LedgerError> {
            self.ran("get");
            self.inner.get(id).await
        }
        async fn events(&self, id: ExecutionId) -> Result<Vec<LedgerEvent>, LedgerError> {
            self.ran("events");
            self.inner.events(id).await
        }
        async fn list(&self) -> Result<Vec<ExecutionRecord>, LedgerError> {
            self.ran("list");
            self.inner.list().await
        }
        async fn store_result(
            &self,
            id: ExecutionId,
            result: Bytes,
        ) -> Result<String, LedgerError> {
            self.ran("store_result");
            self.inner.store_result(id, result).await
        }
        async fn load_result(&self, reference: &str) -> Result<Option<Bytes>, LedgerError> {
            self.ran("load_result");
            self.inner.load_result(reference).await
        }
        async fn is_owner_alive(&self, owner: &str) -> bool {
            self.ran("is_owner_alive");
            self.inner.is_owner_alive(owner).await
        }
    }

    /// Every method called through an `Arc` (of the type, and of `dyn Ledger`) runs the
    /// ledger's own method of that name, never the trait's default built from the others:
    /// a default that ran would note `claim`, `append` or `store_result` instead.
    #[tokio::test]
    async fn every_method_reaches_the_ledger_behind_the_arc() {
        let noting = Arc::new(Noting::default());
        let shared: Arc<dyn Ledger> = noting.clone();
        for ledger in [&noting as &dyn Ledger, &shared as &dyn Ledger] {
            noting.ran.lock().unwrap().clear();
            // A fingerprint of its own each round: the second claim must create an execution.
            let mut claim = claim(RetryClass::Irreversible, "owner");
            claim.tool = format!("t{}", noting.ran.lock().unwrap().len());
            claim.intent_scope = format!("{:p}", ledger).into();
            let id = match ledger
                .claim_dispatched(claim, Dispatch::default())
                .await
                .unwrap()
            {
                Claimed::New(record) => record.execution_id,
                other => panic!("{other:?}"),
            };
            let _ = ledger.get(id).await.unwrap();
            let _ = ledger.events(id).await.unwrap();
            let _ = ledger.list().await.unwrap();
            let reference = ledger
                .store_result(id, Bytes::from_static(b"{}"))
                .await
                .unwrap();
            let _ = ledger.load_result(&reference).await.unwrap();
            let _ = ledger.is_owner_alive("owner").await;
            let completed = EventKind::Completed {
                target_status: 200,
                is_error: false,
                result_reference: None,
            };
            ledger
                .complete(event_at(id, 1, completed), Some(Bytes::from_static(b"{}")))
                .await
                .unwrap();
            let delivered = || EventKind::Delivered { jsonrpc_id: None };
            ledger
                .append_unsynced(event_at(id, 2, delivered()))
                .await
                .unwrap();
            let _ = ledger.append(event_at(id, 3, delivered())).await;
            assert_eq!(
                *noting.ran.lock().unwrap(),
                [
                    "claim_dispatched",
                    "get",
                    "events",
                    "list",
                    "store_result",
                    "load_result",
                    "is_owner_alive",
                    "complete",
                    "append_unsynced",
                    "append",
                ]
            );
        }
    }
}
