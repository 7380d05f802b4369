//! `Owner`: a call's ownership of its intent in this process.

use std::sync::Arc;

use dashmap::mapref::entry::Entry;
use tokio::sync::watch;

use super::inflight::Inflight;

use crate::{
    ExecutionId,
    decide::flight::{Flight, single_flight},
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::{IntentKey, Ledger},
    observe::{Settlement, write_from_drop},
};

/// A call's place in single flight: the owner of its intent, or a waiter on the owner's outcome.
pub(super) enum Acquired {
    Owner(Owner),
    Waiter(watch::Receiver<Option<Settlement>>),
}

/// Ownership of an intent in this process. Dropping it releases the intent; if the attempt was
/// dispatched and never settled, the execution is recorded `unknown`.
pub(super) struct Owner {
    pub(super) inflight: Arc<Inflight>,
    pub(super) key: IntentKey,
    pub(super) sender: watch::Sender<Option<Settlement>>,
    pub(super) abandoned: Option<(Arc<dyn Ledger>, ExecutionId, u32)>,
}

impl Owner {
    /// Owns `key` in this process, or waits on its owner: one owner per intent at a time.
    pub(super) fn acquire(inflight: &Arc<Inflight>, key: IntentKey) -> Acquired {
        // The entry stays locked from the look to the insert: one owner per intent.
        let entry = inflight.intents.entry(key.clone());
        let live = match &entry {
            Entry::Occupied(occupied) => Some(occupied.get().subscribe()),
            Entry::Vacant(_) => None,
        };
        match single_flight(live) {
            Flight::Attach(settled) => Acquired::Waiter(settled),
            Flight::Own => {
                let (sender, _) = watch::channel(None);
                entry.insert(sender.clone());
                Acquired::Owner(Owner {
                    inflight: inflight.clone(),
                    key,
                    sender,
                    abandoned: None,
                })
            }
        }
    }

    pub(super) fn dispatched(&mut self, ledger: Arc<dyn Ledger>, id: ExecutionId, attempt: u32) {
        self.abandoned = Some((ledger, id, attempt));
    }

    /// Publishes the outcome to attached waiters; the intent is released first, so a waiter
    /// that must decide again becomes the next owner instead of waiting on a settled channel.
    pub(super) fn settle(&mut self, settlement: Settlement) {
        self.abandoned = None;
        self.release();
        self.sender.send_replace(Some(settlement));
    }

    pub(super) fn release(&self) {
        self.inflight
            .intents
            .remove_if(&self.key, |_, s| s.same_channel(&self.sender));
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.release();
        if let Some((ledger, id, attempt)) = self.abandoned.take() {
            // Dropped between dispatch and outcome (the caller cancelled, or dropped the body
            // before the response arrived): the target may have run it.
            let record = async move {
                let event = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::now(),
                    kind: EventKind::Unknown {
                        target_status: None,
                        // Only this attempt: a later one (re-sent meanwhile) is not marked.
                        attempt: Some(attempt),
                        reason: "the caller dropped the call before its outcome was observed"
                            .into(),
                    },
                };
                if let Err(error) = ledger.append(event).await {
                    tracing::warn!(execution_id = %id, %error, "could not record an abandoned attempt");
                }
            };
            write_from_drop(self.inflight.tracked(Box::pin(record)));
        }
        if self.sender.borrow().is_none() {
            self.sender.send_replace(Some(Settlement::Other));
        }
    }
}
