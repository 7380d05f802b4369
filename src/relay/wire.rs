//! The wire: a tower service that writes one JSON-RPC message to a message transport and
//! answers with the response the transport later reads for its id.
//!
//! Whoever drives the transport takes each [`Outgoing`] message from the [`WireQueue`],
//! writes it, and says how that went; and hands every response it reads to
//! [`Wire::answer`]. Over this service the guard (and the server half) run unchanged: a
//! message is an HTTP `POST` of its bytes, a response an `application/json` body.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header::CONTENT_TYPE};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tokio::sync::{mpsc, oneshot};
use tower_service::Service;

use super::order::{Order, Turn};

use crate::{
    BoxError,
    protocol::{
        RequestId,
        shape::{Shape, shape_of},
        transport::NotWritten,
    },
};

/// How many messages wait for the transport before a sender waits too.
const QUEUE: usize = 64;

/// How long a request the client cancelled still waits for the server's answer: a server that
/// does not stop the tool answers when it is done, and that answer settles the call.
pub(crate) const CANCELLED_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// How many cancelled requests whose wait ended are remembered, so that the server's answer
/// coming after all is not handed to the client as a second answer for the id.
const ENDED_CANCELLED: usize = 1024;

/// One message for the transport to write, and the one who waits to hear how that went.
///
/// An `Outgoing` dropped without a word (its writer was cancelled part of the way) counts as
/// [`failed`](Self::failed): its bytes may have left.
#[derive(Debug)]
pub struct Outgoing {
    message: Bytes,
    written: Option<oneshot::Sender<Result<(), BoxError>>>,
    /// The request's entry in the waiting table, marked taken when a transport takes the
    /// message from the queue.
    request: Option<Taken>,
}

/// A request's place in the waiting table: `(table, id, exchange number)`.
#[derive(Debug)]
struct Taken(Arc<Mutex<Waiting>>, RequestId, u64);

impl Drop for Outgoing {
    fn drop(&mut self) {
        if let Some(written) = self.written.take() {
            let dropped = "the transport dropped the message while it was writing it";
            let _ = written.send(Err(dropped.into()));
        }
    }
}

impl Outgoing {
    /// The message, one JSON-RPC object, without a line ending.
    pub fn message(&self) -> &Bytes {
        &self.message
    }

    /// Every byte of the message was written (and flushed).
    pub fn written(self) {
        self.tell(Ok(()));
    }

    fn tell(mut self, result: Result<(), BoxError>) {
        if let Some(written) = self.written.take() {
            let _ = written.send(result);
        }
    }

    /// Not one byte was written: the peer was gone before the write began. A guarded call
    /// that gets this is `not_sent`, safe to continue.
    pub fn not_written(self, why: impl Into<String>) {
        self.tell(Err(NotWritten(why.into()).into()));
    }

    /// The write failed part of the way, or in a way that does not prove nothing left: the
    /// outcome of a guarded call is `unknown`.
    pub fn failed(self, error: impl Into<BoxError>) {
        self.tell(Err(error.into()));
    }
}

/// The messages the wire has for its transport, in the order they are to be written.
///
/// Dropped, it refuses, unwritten, every message still waiting in it.
#[derive(Debug)]
pub struct WireQueue(mpsc::Receiver<Outgoing>);

impl Drop for WireQueue {
    fn drop(&mut self) {
        self.0.close();
        self.refuse_waiting("the transport is closed");
    }
}

impl WireQueue {
    /// The next message to write; `None` once every [`Wire`] is gone. From here on its writer
    /// may write it: a request taken is failed by [`Wire::peer_gone`], one still waiting in the
    /// queue is not (it goes to the next peer, or is refused unwritten).
    pub async fn next(&mut self) -> Option<Outgoing> {
        let mut outgoing = self.0.recv().await?;
        if let Some(Taken(waiting, id, number)) = outgoing.request.take() {
            let mut waiting = waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = waiting.by_id.get_mut(&id)
                && entry.number == number
            {
                entry.taken = true;
            }
        }
        Some(outgoing)
    }

    /// Refuses, unwritten, every message that waits now; for a transport whose peer is gone.
    pub fn refuse_waiting(&mut self, why: &str) {
        while let Ok(outgoing) = self.0.try_recv() {
            outgoing.not_written(why);
        }
    }
}

/// Each waiting request, with the number of its exchange: an exchange that ends takes out only
/// its own entry, never that of a later request that reused the id.
#[derive(Debug, Default)]
struct Waiting {
    by_id: HashMap<RequestId, Entry>,
    next: u64,
    /// Cancelled requests whose wait ended without the server's answer (oldest first): an
    /// answer for one of them that comes after all was already answered for.
    ended_cancelled: VecDeque<RequestId>,
}

#[derive(Debug)]
struct Entry {
    number: u64,
    /// A transport took the message from the queue: it may have been written.
    taken: bool,
    answer: oneshot::Sender<Result<Bytes, BoxError>>,
}

/// The service that sends messages over a transport; clones share the transport.
#[derive(Debug, Clone)]
pub struct Wire {
    queue: mpsc::Sender<Outgoing>,
    waiting: Arc<Mutex<Waiting>>,
    order: Order,
}

/// A request's turn in the client's order, carried to the wire in the request's extensions
/// (the guard hands them on): the request is queued in its turn, and the turn ends once it is
/// (or when the guard answered without sending, and dropped the request).
#[derive(Debug, Clone)]
pub(crate) struct TurnOnWire(Arc<Mutex<Option<Turn>>>);

impl TurnOnWire {
    pub(crate) fn new(turn: Turn) -> Self {
        Self(Arc::new(Mutex::new(Some(turn))))
    }

    fn take(&self) -> Option<Turn> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Why a request that was written got no answer.
#[derive(Debug, thiserror::Error)]
#[error("the peer went away after the request was written and before it answered")]
pub struct PeerGone;

/// Why a request's wait ended without its answer: the client cancelled it.
#[derive(Debug, thiserror::Error)]
#[error("the client cancelled the request after it was written; the server need not answer it")]
pub struct Cancelled;

impl Wire {
    /// A wire, and the queue its transport writes from.
    pub fn new() -> (Self, WireQueue) {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let wire = Self {
            queue,
            waiting: Arc::default(),
            order: Order::default(),
        };
        (wire, WireQueue(receiver))
    }

    /// Hands a response the transport read to the request that waits for it. `Err` gives the
    /// message back when no request waits for its id (it is someone else's).
    pub fn answer(&self, id: &RequestId, message: Bytes) -> Result<(), Bytes> {
        let waiter = {
            let mut waiting = self.lock();
            let waiter = waiting.by_id.remove(id);
            if waiter.is_none()
                && let Some(at) = waiting.ended_cancelled.iter().position(|ended| ended == id)
            {
                // The client was answered for this id when its wait ended: never twice.
                waiting.ended_cancelled.remove(at);
                tracing::warn!(
                    "the server answered a cancelled request after its wait ended; the answer \
                     is not handed on (the client had its answer for the id)"
                );
                return Ok(());
            }
            waiter
        };
        match waiter {
            Some(waiter) => waiter
                .answer
                .send(Ok(message))
                .map_err(|back| back.unwrap_or_default()),
            None => Err(message),
        }
    }

    /// Fails the request that waits for `id`, if one does, with `error`: its answer came but
    /// cannot be handed on (over the size bound, say). A guarded call's outcome is then
    /// `unknown`: the answer was lost, not refused.
    pub fn fail(&self, id: &RequestId, error: impl Into<BoxError>) -> bool {
        let waiter = self.lock().by_id.remove(id);
        waiter.is_some_and(|waiter| waiter.answer.send(Err(error.into())).is_ok())
    }

    /// Whether a request with this id waits for its answer.
    pub fn is_waiting(&self, id: &RequestId) -> bool {
        self.lock().by_id.contains_key(id)
    }

    /// The transport's peer went away: every request written and not answered fails with
    /// [`PeerGone`] (an unknown outcome, for a guarded call). A request still waiting in the
    /// [`WireQueue`] was written to nobody: it stays, for the next peer the queue is written
    /// to, or to be refused unwritten when the queue is dropped.
    pub fn peer_gone(&self) {
        let mut gone: Vec<Entry> = {
            let mut waiting = self.lock();
            let written: Vec<RequestId> = waiting
                .by_id
                .iter()
                .filter(|(_, entry)| entry.taken)
                .map(|(id, _)| id.clone())
                .collect();
            written
                .iter()
                .filter_map(|id| waiting.by_id.remove(id))
                .collect()
        };
        // Failed in the order they were sent, not the table's: each waiter wakes to its
        // unknown outcome (and writes it) in that order, the same order on every run.
        gone.sort_by_key(|entry| entry.number);
        for entry in gone {
            drop(entry.answer);
        }
    }

    /// Writes one message from the client that waits for no answer (a notification, a
    /// response to a server request) at once, in order with every other message queued on
    /// this wire. `Err` when the transport is gone.
    ///
    /// A `notifications/cancelled` also ends the wait of the request it cancels, after
    /// a bounded wait (5 s): the server need not answer it (MCP). An answer that comes
    /// within the wait settles the call as any answer does; without one, its outcome is
    /// unknown (the tool may have run in part). Either way the client gets one answer for the
    /// id: an answer coming after the wait ended is not handed on.
    pub async fn notify(&self, message: Bytes) -> Result<(), BoxError> {
        self.notify_in_turn(message, None).await
    }

    /// The next turn in the client's order: a message queued in it reaches the transport
    /// after every message whose turn came before.
    pub(crate) fn turn(&self) -> Turn {
        self.order.take()
    }

    /// [`Self::notify`], queued in `turn` when there is one.
    pub(crate) async fn notify_in_turn(
        &self,
        message: Bytes,
        turn: Option<Turn>,
    ) -> Result<(), BoxError> {
        let cancelled = crate::protocol::shape::cancelled_request(&message);
        self.send_taken(message, None, turn).await?;
        if let Some(id) = cancelled {
            self.end_wait_later(id);
        }
        Ok(())
    }

    /// Ends the wait of the cancelled request `id` after [`CANCELLED_ANSWER_WAIT`], unless
    /// its answer came first.
    fn end_wait_later(&self, id: RequestId) {
        let Some(number) = self.lock().by_id.get(&id).map(|entry| entry.number) else {
            return;
        };
        let wire = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CANCELLED_ANSWER_WAIT).await;
            let waiter = {
                let mut waiting = wire.lock();
                if waiting
                    .by_id
                    .get(&id)
                    .is_none_or(|entry| entry.number != number)
                {
                    return;
                }
                if waiting.ended_cancelled.len() >= ENDED_CANCELLED {
                    waiting.ended_cancelled.pop_front();
                }
                waiting.ended_cancelled.push_back(id.clone());
                waiting.by_id.remove(&id)
            };
            if let Some(waiter) = waiter {
                let _ = waiter.answer.send(Err(Cancelled.into()));
            }
        });
    }

    /// Writes one message in `turn` (at once without one), in order with every other message
    /// sent through this wire; `Err` when the transport is gone. `request` is the waiting-table
    /// entry of a request, marked taken when a transport takes the message from the queue.
    async fn send_taken(
        &self,
        message: Bytes,
        request: Option<Taken>,
        turn: Option<Turn>,
    ) -> Result<(), BoxError> {
        let (written, result) = oneshot::channel();
        if let Some(turn) = &turn {
            turn.wait().await;
        }
        let queued = self
            .queue
            .send(Outgoing {
                message,
                written: Some(written),
                request,
            })
            .await;
        // In the queue, the message keeps its place: the next turn may begin.
        drop(turn);
        queued.map_err(|_| NotWritten("the transport is closed".into()))?;
        result
            .await
            .unwrap_or_else(|_| Err(NotWritten("the transport dropped the message".into()).into()))
    }

    /// One message the transport read from its peer: handed to the request that waits for it
    /// (`None`), or given back for the other side (a notification, a peer's request, an answer
    /// to nobody's request). A message that is not JSON-RPC is dropped (`None`): a reader of
    /// JSON-RPC lines could take it for anything.
    pub(crate) fn route(&self, message: Bytes) -> Option<Bytes> {
        match shape_of(&message) {
            Shape::Response(Some(id)) => self.answer(&id, message).err(),
            Shape::Unreadable(why) => {
                tracing::warn!(%why, "a message from the peer was dropped");
                None
            }
            _ => Some(message),
        }
    }

    /// A message from the peer over the transport's bound of `max` bytes, of which `prefix`
    /// is the start: never handed on. When it answers a waiting request (its id is in the
    /// prefix), that request fails: its answer was lost (an unknown outcome). Whether one did.
    pub(crate) fn answer_too_large(&self, prefix: &[u8], max: usize) -> bool {
        let id = crate::protocol::shape::id_in_prefix(prefix);
        let failed = id.as_ref().is_some_and(|id| {
            self.fail(
                id,
                format!(
                    "the server's answer is longer than the {max}-byte bound and was not relayed"
                ),
            )
        });
        tracing::warn!(
            max,
            answered_a_request = failed,
            "a message from the server over the size bound was dropped"
        );
        failed
    }

    /// The HTTP request a layer over the wire sees for one message: a `POST` of its bytes to
    /// `uri`, `application/json`, accepting JSON or SSE (as an MCP client's would).
    pub(crate) fn request(uri: &str, message: Bytes) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(message));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = http::Uri::try_from(uri).unwrap_or_default();
        let headers = request.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::ACCEPT,
            http::HeaderValue::from_static("application/json, text/event-stream"),
        );
        request
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn exchange(
        self,
        message: Bytes,
        turn: Option<Turn>,
    ) -> Result<Response<Full<Bytes>>, BoxError> {
        let id = match shape_of(&message) {
            Shape::Request(id) => Some(id),
            _ => None,
        };
        let answer = match &id {
            Some(id) => {
                let (tx, rx) = oneshot::channel();
                let mut waiting = self.lock();
                if waiting.by_id.contains_key(id) {
                    return Err(NotWritten(format!(
                        "a request with JSON-RPC id {} is already waiting for its answer",
                        serde_json::to_string(id).unwrap_or_default()
                    ))
                    .into());
                }
                let number = waiting.next;
                waiting.next += 1;
                // The id is this request's now: its answer is handed on.
                waiting.ended_cancelled.retain(|ended| ended != id);
                waiting.by_id.insert(
                    id.clone(),
                    Entry {
                        number,
                        taken: false,
                        answer: tx,
                    },
                );
                Some((rx, Unwait(self.waiting.clone(), id.clone(), number)))
            }
            None => None,
        };
        let taken = answer
            .as_ref()
            .map(|(_, Unwait(waiting, id, number))| Taken(waiting.clone(), id.clone(), *number));
        self.send_taken(message, taken, turn).await?;
        let Some((answer, _unwait)) = answer else {
            return Ok(respond(StatusCode::ACCEPTED, Bytes::new()));
        };
        let message = answer.await.map_err(|_| PeerGone)??;
        Ok(respond(StatusCode::OK, message))
    }
}

/// Takes a request out of the waiting table when its exchange ends or is dropped.
struct Unwait(Arc<Mutex<Waiting>>, RequestId, u64);

impl Drop for Unwait {
    fn drop(&mut self) {
        let mut waiting = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting
            .by_id
            .get(&self.1)
            .is_some_and(|entry| entry.number == self.2)
        {
            waiting.by_id.remove(&self.1);
        }
    }
}

fn respond(status: StatusCode, message: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(message));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl<B> Service<Request<B>> for Wire
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Full<Bytes>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let wire = self.clone();
        let turn = request
            .extensions()
            .get::<TurnOnWire>()
            .and_then(TurnOnWire::take);
        Box::pin(async move {
            let message = request
                .into_body()
                .collect()
                .await
                .map_err(Into::into)?
                .to_bytes();
            wire.exchange(message, turn).await
        })
    }
}
