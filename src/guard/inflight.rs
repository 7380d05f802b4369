//! `Inflight`: this process's state shared by the guards of one layer: single flight, resume
//! links, background work.

use std::{future::Future, sync::Arc};

use dashmap::DashMap;
use tokio::sync::watch;

use super::resume_link::ResumeLink;

use crate::{
    ledger::IntentKey,
    observe::{Settlement, Write},
    protocol::ResumeKey,
};

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
