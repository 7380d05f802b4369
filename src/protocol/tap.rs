//! [`EventTap`]: the SSE events of one response stream, parsed once for two layers.
//!
//! A [`ResumeLayer`](crate::resume::ResumeLayer) parses the stream it may have to splice; a
//! [`GuardLayer`](crate::guard::GuardLayer) above it looks for the answer in the same events.
//! The resume layer's response carries a tap (an extension); the guard takes it out and reads
//! each event's data from it instead of parsing the bytes a second time, and says back what
//! it found (whether an event was a JSON-RPC response), so that the resume layer need not parse
//! the JSON itself. Nobody taking the tap costs one lock per frame: events are queued only
//! while a reader wants them.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use bytes::Bytes;

/// The shared end of a tap: the producer (the resume body) and the reader (the guard's
/// scanner) each hold one. Crate-private: it travels in a response's extensions.
#[derive(Clone, Default)]
pub(crate) struct EventTap(Arc<Mutex<TapState>>);

impl std::fmt::Debug for EventTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventTap")
    }
}

/// What the two ends share.
#[derive(Debug, Default)]
pub(crate) struct TapState {
    /// The data of each complete event the producer handed on, not yet read.
    pub(crate) events: VecDeque<Bytes>,
    /// A reader reads the events: the producer queues them (and leaves their JSON to it).
    pub(crate) wanted: bool,
    /// The reader saw a JSON-RPC response among the events it read.
    pub(crate) response_seen: bool,
    /// An event was over the producer's bound (its stream fails).
    pub(crate) oversize: bool,
    /// The producer's last event id (across resumes).
    pub(crate) last_event_id: String,
}

impl EventTap {
    /// The shared state; a panic elsewhere while it was held leaves it usable (it holds
    /// plain values).
    pub(crate) fn lock(&self) -> MutexGuard<'_, TapState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A reader's end: from now on the producer queues events, until the reader stops (or
    /// is dropped).
    pub(crate) fn reader(self) -> TapReader {
        self.lock().wanted = true;
        TapReader(self)
    }
}

/// The reading end of a tap; dropped, it stops the queueing.
#[derive(Debug)]
pub(crate) struct TapReader(EventTap);

impl TapReader {
    /// The shared state.
    pub(crate) fn lock(&self) -> MutexGuard<'_, TapState> {
        self.0.lock()
    }

    /// No more events are wanted: the producer stops queueing (and judges events itself).
    pub(crate) fn stop(&self) {
        self.lock().wanted = false;
    }
}

impl Drop for TapReader {
    fn drop(&mut self) {
        self.stop();
    }
}
