//! An in-memory rmcp [`EventStore`] so that SSE streams stay resumable
//! (`GET` + `Last-Event-ID`) even after the tool's response was produced.
//!
//! Without an event store, rmcp's `LocalSessionManager` only replays a
//! request stream while the request is still in flight: once the response has
//! been routed, the request-wise channel is removed and a resume returns an
//! empty stream. With this store, every event is persisted and a replay of an
//! unfinished stream stays open and delivers events appended later.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};

use rmcp::{
    model::ServerJsonRpcMessage,
    transport::streamable_http_server::session::{
        EventStore, EventStoreError, EventStream, ServerSseMessage,
    },
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

struct StoredEvent {
    stream_id: String,
    event: ServerSseMessage,
}

#[derive(Default)]
struct Inner {
    events: Vec<StoredEvent>,
    subscribers: Vec<(String, mpsc::UnboundedSender<ServerSseMessage>)>,
}

/// Thread-safe in-memory event store. Event ids are `ev-<n>`, globally unique.
#[derive(Default, Clone)]
pub struct InMemoryEventStore {
    inner: Arc<Mutex<Inner>>,
    next_id: Arc<AtomicU64>,
}

fn is_terminal(event: &ServerSseMessage) -> bool {
    matches!(
        event.message.as_deref(),
        Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
    )
}

impl InMemoryEventStore {
    /// Number of events stored so far (all streams).
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap().events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait::async_trait]
impl EventStore for InMemoryEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<String, EventStoreError> {
        let event_id = format!("ev-{}", self.next_id.fetch_add(1, Ordering::SeqCst));
        let mut event = event.clone();
        event.event_id = Some(event_id.clone());
        let terminal = is_terminal(&event);
        let mut inner = self.inner.lock().unwrap();
        inner.subscribers.retain(|(sid, tx)| {
            if sid != stream_id {
                return !tx.is_closed();
            }
            // Deliver, then end live replays of a finished request stream.
            tx.send(event.clone()).is_ok() && !terminal
        });
        inner.events.push(StoredEvent {
            stream_id: stream_id.to_owned(),
            event,
        });
        Ok(event_id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let mut inner = self.inner.lock().unwrap();
        let position = inner
            .events
            .iter()
            .position(|stored| stored.event.event_id.as_deref() == Some(last_event_id))
            .ok_or_else(|| std::io::Error::other(format!("unknown event id {last_event_id}")))?;
        let stream_id = inner.events[position].stream_id.clone();
        let finished = inner
            .events
            .iter()
            .any(|stored| stored.stream_id == stream_id && is_terminal(&stored.event));
        let replay: Vec<ServerSseMessage> = inner
            .events
            .iter()
            .skip(position + 1)
            .filter(|stored| stored.stream_id == stream_id)
            .map(|stored| stored.event.clone())
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        for event in replay {
            let _ = tx.send(event);
        }
        if !finished {
            // Keep the replay open: later events of this stream follow live.
            inner.subscribers.push((stream_id, tx));
        }
        Ok(Box::pin(UnboundedReceiverStream::new(rx)))
    }
}
