//! When an answer counts as delivered: one rule for every channel that hands a guarded call's
//! answer to a peer it cannot see into (a connection, a pipe, another task).
//!
//! An answer is delivered once it was written whole to the channel, flushed, **and** the peer
//! then proved it read on: its next message on that channel (for HTTP, its next request on the
//! connection or a clean close). A write into a pipe or a socket buffer proves nothing (the
//! peer may die before reading it), and neither does a pipe's end (a crash closes it too).
//! Until the proof comes the execution stays completed and undelivered, so that a repeat is
//! handed the kept result instead of running again.

use std::{
    future::Future,
    pin::Pin,
    sync::{Mutex, MutexGuard, PoisonError},
};

use super::Delivery;

/// The deliveries of one channel to one peer, on their way to being recorded: written whole,
/// then flushed, then confirmed by the peer: the peer's next message (or a clean close) proves it
/// read on; a write into a pipe or a socket proves nothing.
///
/// A channel driver calls [`written`](Self::written) once an answer's last byte was handed to
/// the channel, [`flushed`](Self::flushed) once the channel flushed what it was handed, and
/// [`confirm`](Self::confirm) when the peer's next message (or clean close) arrives, before
/// that message is acted on; [`discard`](Self::discard) when the channel broke.
#[derive(Debug, Default)]
pub struct Deliveries {
    stages: Mutex<Stages>,
}

#[derive(Debug, Default)]
struct Stages {
    /// The whole answer was handed to the channel.
    written: Vec<Delivery>,
    /// ... and the channel flushed it: the peer's next message confirms it.
    flushed: Vec<Delivery>,
}

impl Deliveries {
    fn stages(&self) -> MutexGuard<'_, Stages> {
        self.stages.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer of `delivery` was handed whole to the channel.
    pub fn written(&self, delivery: Delivery) {
        self.stages().written.push(delivery);
    }

    /// The channel flushed everything it was handed: what was written is now on its way to
    /// the peer, and waits for the peer's proof.
    pub fn flushed(&self) {
        let mut stages = self.stages();
        let written = std::mem::take(&mut stages.written);
        stages.flushed.extend(written);
    }

    /// Whether a flushed answer waits for the peer's proof.
    pub fn awaiting_client(&self) -> bool {
        !self.stages().flushed.is_empty()
    }

    /// The peer proved it read on (its next message, or a clean close of a connection):
    /// records every flushed answer `delivered`. Await it before the peer's message is acted
    /// on, so that a repeat in that message is decided with the delivery known.
    pub fn confirm(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let confirmed = std::mem::take(&mut self.stages().flushed);
        Box::pin(async move {
            for delivery in confirmed {
                if let Err(error) = delivery.record().await {
                    tracing::warn!(execution_id = %delivery.execution_id(), %error, "could not record the delivery");
                }
            }
        })
    }

    /// The channel broke, or ended without the peer's proof: nothing that waited on it was
    /// delivered (each stays completed and undelivered, kept for the repeat).
    pub fn discard(&self) {
        let mut stages = self.stages();
        stages.written.clear();
        stages.flushed.clear();
    }
}
