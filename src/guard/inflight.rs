//! In-process state: single flight, resume links, background work, and the watchers of an
//! observed response.

use std::{future::Future, sync::Arc};

use dashmap::{DashMap, mapref::entry::Entry};
use tokio::sync::watch;

use crate::{
    Actor, ExecutionId, Target,
    decide::flight::{Flight, single_flight},
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::Ledger,
    observe::{Recorder, Settlement, Watchers, Write, write_from_drop},
    protocol::{RequestId, ResumeKey},
};

use super::call::Call;

use crate::ledger::IntentKey;

/// In-process state: single flight (one owner per intent at a time), and the broken streams a
/// resume GET may continue.
#[derive(Debug, Default)]
pub(super) struct Inflight {
    pub(super) intents: DashMap<IntentKey, watch::Sender<Option<Settlement>>>,
    pub(super) resume_links: DashMap<ResumeKey, ResumeLink>,
    pub(super) background: Background,
}

/// The guard's work that outlives a call: ledger writes started from a `Drop` (a call dropped
/// between dispatch and outcome) and drains of response bodies a caller dropped. Counted, so
/// that a process can wait for it before it exits ([`GuardHandle::shut_down`](super::GuardHandle::shut_down)).
#[derive(Debug)]
pub(super) struct Background {
    pub(super) running: watch::Sender<usize>,
    pub(super) stop: watch::Sender<bool>,
}

impl Default for Background {
    fn default() -> Self {
        Self {
            running: watch::Sender::new(0),
            stop: watch::Sender::new(false),
        }
    }
}

/// One piece of background work, counted until it is dropped.
pub(super) struct BackgroundTask(Arc<Inflight>);

impl Drop for BackgroundTask {
    fn drop(&mut self) {
        self.0.background.running.send_modify(|n| *n -= 1);
    }
}

/// Bound on remembered broken streams (each is a few dozen bytes).
pub(super) const MAX_RESUME_LINKS: usize = 10_000;

/// A broken response stream of an execution, by its target, session and the last event id the
/// caller saw ([`ResumeKey`]): a GET of that stream with that `Last-Event-ID` (from a resume layer, or from a client that resumes by itself) belongs
/// to the execution, and a result that arrives on it completes the execution.
#[derive(Debug, Clone)]
pub(super) struct ResumeLink {
    pub(super) actor: Actor,
    pub(super) execution_id: ExecutionId,
    pub(super) request_id: RequestId,
    pub(super) keep_results: bool,
    pub(super) max_result_bytes: usize,
}

impl Inflight {
    pub(super) fn background_task(self: &Arc<Self>) -> BackgroundTask {
        self.background.running.send_modify(|n| *n += 1);
        BackgroundTask(self.clone())
    }

    /// `write`, counted as background work until it finishes (or is dropped).
    pub(super) fn tracked(self: &Arc<Self>, write: Write) -> Write {
        let task = self.background_task();
        Box::pin(async move {
            write.await;
            drop(task);
        })
    }

    /// Resolves once [`GuardHandle::shut_down`](super::GuardHandle::shut_down) tells background drains to stop.
    pub(super) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.background.stop.subscribe();
        async move {
            // The sender lives as long as the `Inflight` a background task holds.
            let _ = stop.wait_for(|stop| *stop).await;
        }
    }

    pub(super) fn link(&self, key: ResumeKey, link: ResumeLink) {
        if self.resume_links.len() >= MAX_RESUME_LINKS {
            self.resume_links.clear();
        }
        self.resume_links.insert(key, link);
    }
}

pub(super) enum Acquired {
    Owner(Owner),
    Waiter(watch::Receiver<Option<Settlement>>),
}

impl Inflight {
    pub(super) fn acquire(self: &Arc<Self>, key: IntentKey) -> Acquired {
        // The entry stays locked from the look to the insert: one owner per intent.
        let entry = self.intents.entry(key.clone());
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
                    inflight: self.clone(),
                    key,
                    sender,
                    abandoned: None,
                })
            }
        }
    }
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
    pub(super) fn dispatched(&mut self, ledger: Arc<dyn Ledger>, id: ExecutionId, attempt: u32) {
        self.abandoned = Some((ledger, id, attempt));
    }

    /// Publishes the outcome to attached waiters; the intent is released first, so a waiter
    /// that must decide again becomes the next owner instead of waiting on a settled channel.
    pub(super) fn settle(mut self, settlement: Settlement) {
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

impl<S> Call<S> {
    /// The recorder of a response the guard observes for `actor`'s call, with this process's
    /// single flight and resume links as its watchers.
    pub(super) fn recorder(
        &self,
        actor: Actor,
        execution_id: ExecutionId,
        request_id: RequestId,
        status: u16,
        stream: (Target, Option<String>),
    ) -> Recorder {
        let mut recorder = Recorder::new(self.config.ledger.clone(), execution_id, request_id);
        recorder.status = status;
        recorder.drain_timeout = self.config.drain_timeout;
        recorder.deliver_at_end = true;
        recorder.watchers = Some(Arc::new(Local {
            actor,
            inflight: self.inflight.clone(),
            stream,
        }));
        recorder
    }
}

/// What this process learns of an observed call's outcome: a broken stream becomes a resume
/// link of the call's actor; writes from a `Drop` and drains count as background work.
pub(super) struct Local {
    pub(super) actor: Actor,
    pub(super) inflight: Arc<Inflight>,
    /// The stream's target and session: with an event id, the key a resume GET links by.
    pub(super) stream: (Target, Option<String>),
}

impl Watchers for Local {
    fn broke_at(&self, last_event_id: &str, recorder: &Recorder) {
        let link = ResumeLink {
            actor: self.actor.clone(),
            execution_id: recorder.execution_id,
            request_id: recorder.request_id.clone(),
            keep_results: recorder.keep_results,
            max_result_bytes: recorder.max_result_bytes,
        };
        let (target, session_id) = self.stream.clone();
        let key = ResumeKey::new(target, session_id, last_event_id.to_owned());
        self.inflight.link(key, link);
    }

    fn track(&self, write: Write) -> Write {
        self.inflight.tracked(write)
    }

    fn drain(&self) -> (Box<dyn Send>, Write) {
        let work = self.inflight.background_task();
        (Box::new(work), Box::pin(self.inflight.stopped()))
    }
}
