//! Request and response bodies of the guard.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::{BoxError, service::Observation};
use crate::{
    ExecutionId,
    ledger::{EventKind, Ledger, LedgerError, LedgerEvent, Timestamp},
    protocol::{RequestId, response::ResponseScanner},
};

/// The body the guard sends to the inner service: the buffered request bytes, plus a flag that
/// tells whether the transport ever read them (a body never read proves the request was not
/// sent).
#[derive(Debug)]
pub struct GuardRequestBody {
    data: Option<Bytes>,
    polled: Arc<AtomicBool>,
}

impl GuardRequestBody {
    pub(super) fn new(data: Bytes) -> (Self, Arc<AtomicBool>) {
        let polled = Arc::new(AtomicBool::new(false));
        let body = Self {
            data: Some(data),
            polled: polled.clone(),
        };
        (body, polled)
    }
}

/// An empty body (what a GET carries).
impl Default for GuardRequestBody {
    fn default() -> Self {
        Self::new(Bytes::new()).0
    }
}

impl Body for GuardRequestBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.polled.store(true, Ordering::Release);
        let data = self.data.take().filter(|d| !d.is_empty());
        Poll::Ready(data.map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.as_ref().is_none_or(Bytes::is_empty)
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

type LedgerWrite = Pin<Box<dyn Future<Output = ()> + Send>>;

pin_project! {
    /// The response body the guard returns: the target's body, observed on its way to the
    /// caller, or an answer the guard wrote itself.
    ///
    /// Observation never buffers a stream: SSE is parsed incrementally. The execution is
    /// recorded `completed` before the frame carrying its result is handed on, and `delivered`
    /// when the caller reads the body to its end, unless the caller records the delivery
    /// itself ([`defer_delivery`](Self::defer_delivery)).
    pub struct GuardResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

/// The observed body, boxed so that a body the caller drops early can be handed to a task
/// that keeps reading it until the outcome is known.
type ObservedBody = Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>;

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Observed {
            watch: Watch,
        },
        Passthrough {
            #[pin]
            inner: B,
        },
        Answer {
            data: Option<Bytes>,
        },
        // A kept result handed back: delivered once read to its end (or when the caller that
        // deferred the delivery says so).
        Kept {
            data: Option<Bytes>,
            delivery: Option<Delivery>,
            recording: Option<LedgerWrite>,
        },
    }
}

impl<B> GuardResponseBody<B> {
    pub(super) fn observed(inner: B, observation: Observation, sse: bool, max_event: usize) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let inner: ObservedBody = Box::pin(http_body_util::BodyExt::map_err(inner, Into::into));
        let watch = Watch {
            body: Some(inner),
            observation: Some(observation),
            scanner: ResponseScanner::new(sse, max_event),
            pending: None,
            held: None,
            held_error: None,
            inner_ended: false,
            finished: false,
            caller_gone: false,
            delivery: None,
        };
        Self {
            kind: Kind::Observed { watch },
        }
    }

    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: Kind::Passthrough { inner },
        }
    }

    pub(super) fn answer(data: Bytes) -> Self {
        Self {
            kind: Kind::Answer { data: Some(data) },
        }
    }

    /// A kept result the guard hands back; `delivery` is recorded when the caller reads it to
    /// its end, unless the caller takes the delivery over.
    pub(super) fn kept(data: Bytes, delivery: Delivery) -> Self {
        delivery.answered.store(true, Ordering::Release);
        Self {
            kind: Kind::Kept {
                data: Some(data),
                delivery: Some(delivery),
                recording: None,
            },
        }
    }

    /// Hands the recording of `delivered` to the caller: the body still records the outcome
    /// (before the frame that carries it is handed on), but never `delivered`; the caller calls
    /// [`Delivery::record`] once it holds the answer (printed and flushed it, wrote it completely
    /// to its own client). `None` when the body is not the target's answer to a guarded call
    /// (a pass-through, or an answer the guard wrote itself); a kept result the guard hands
    /// back is the target's answer and has a delivery too.
    ///
    /// Call it before reading the body.
    pub fn defer_delivery(&mut self) -> Option<Delivery> {
        if let Kind::Kept { delivery, .. } = &mut self.kind {
            return delivery.take();
        }
        let Kind::Observed { watch } = &mut self.kind else {
            return None;
        };
        let observation = watch.observation.as_ref()?;
        let (ledger, execution_id, request_id) = observation.delivery_target();
        let delivery = Delivery {
            ledger,
            execution_id,
            request_id,
            answered: Arc::new(AtomicBool::new(false)),
        };
        watch.delivery = Some(delivery.answered.clone());
        Some(delivery)
    }
}

/// The delivery of a guarded call's answer, recorded by the caller that holds it; see
/// [`GuardResponseBody::defer_delivery`].
#[derive(Clone)]
pub struct Delivery {
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) execution_id: ExecutionId,
    pub(super) request_id: RequestId,
    /// Set once the body recorded the target's answer (`completed`, or `failed` for a JSON-RPC
    /// error): only then is there something to deliver.
    pub(super) answered: Arc<AtomicBool>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("execution_id", &self.execution_id)
            .field("answered", &self.answered.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The execution the answer belongs to.
    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    /// The JSON-RPC id of the request the answer is for (also on a resume stream, whose GET
    /// has none).
    pub fn request_id(&self) -> &RequestId {
        &self.request_id
    }

    /// Whether the body carried the target's answer, so that there is a delivery to record.
    pub fn is_answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// Records `delivered`. Call it only once the caller holds the answer: nothing that can
    /// fail (a log line, a session DELETE) belongs between the two. Records nothing and returns
    /// `Ok(false)` when the body did not carry the target's answer (the record says why).
    pub async fn record(&self) -> Result<bool, LedgerError> {
        if !self.is_answered() {
            return Ok(false);
        }
        self.ledger
            .append(LedgerEvent {
                execution_id: self.execution_id,
                at: Timestamp::now(),
                kind: EventKind::Delivered {
                    jsonrpc_id: Some(self.request_id.clone()),
                },
            })
            .await?;
        Ok(true)
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for GuardResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Observed { .. } => f.write_str("Observed"),
            Kind::Passthrough { inner } => f.debug_tuple("Passthrough").field(inner).finish(),
            Kind::Answer { data } | Kind::Kept { data, .. } => {
                f.debug_tuple("Answer").field(data).finish()
            }
        }
    }
}

struct Watch {
    /// The target's body.
    body: Option<ObservedBody>,
    /// Present until the outcome and the delivery are recorded.
    observation: Option<Observation>,
    scanner: ResponseScanner,
    /// A ledger write that must finish before the next frame is handed on.
    pending: Option<LedgerWrite>,
    /// A frame held back until `pending` is done.
    held: Option<Frame<Bytes>>,
    /// A body error held back until the break is recorded.
    held_error: Option<BoxError>,
    /// The target's body said it ended (`is_end_stream`) with the last frame it gave.
    inner_ended: bool,
    finished: bool,
    /// The caller dropped the body: read on for the outcome, but never record a delivery. Also
    /// marks the copy a drain task owns, which never drains again.
    caller_gone: bool,
    /// The caller records the delivery itself ([`GuardResponseBody::defer_delivery`]); set
    /// once the answer is recorded.
    delivery: Option<Arc<AtomicBool>>,
}

impl Watch {
    /// Feeds response bytes; sets `pending` to the ledger write when the response is found.
    fn feed(&mut self, chunk: &[u8]) {
        let Some(observation) = self.observation.as_mut() else {
            return;
        };
        let mut found = None;
        self.scanner.feed(chunk, |message| {
            if found.is_none() {
                found = observation.match_response(message);
            }
        });
        if let Some(id) = self.scanner.last_event_id() {
            observation.last_event_id = Some(id.to_owned());
        }
        if self.scanner.is_oversize() {
            observation.oversize = true;
        }
        if let Some(message) = found {
            let write = observation.completed(message);
            self.pending = Some(self.answered(write));
        }
    }

    /// `write` (the recording of the target's answer), then the mark that a deferred delivery
    /// has something to deliver.
    fn answered(&self, write: LedgerWrite) -> LedgerWrite {
        let Some(flag) = self.delivery.clone() else {
            return write;
        };
        Box::pin(async move {
            write.await;
            flag.store(true, Ordering::Release);
        })
    }

    /// A JSON body whose last byte arrived: its outcome, recorded before the frame that ends it
    /// is handed on (as for SSE).
    fn json_outcome(&mut self) {
        let Some(observation) = self.observation.as_mut() else {
            return;
        };
        if observation.has_outcome() {
            return;
        }
        let Some(answer) = self
            .scanner
            .json_body()
            .and_then(|body| observation.match_response(body))
        else {
            return;
        };
        let write = observation.completed(answer);
        self.pending = Some(self.answered(write));
    }

    /// Whether the end of the body records `delivered` (the caller reads it, and does not
    /// record the delivery itself).
    fn delivers_at_end(&self) -> bool {
        !self.caller_gone && self.delivery.is_none()
    }

    /// Whether polling the end of the body would record nothing more.
    fn end_is_silent(&self) -> bool {
        self.observation
            .as_ref()
            .is_none_or(|o| o.has_outcome() && !self.delivers_at_end())
    }

    /// At the end of the body: the outcome if it is still open, then the delivery.
    fn finish(&mut self) -> Option<LedgerWrite> {
        self.json_outcome();
        let record = self.pending.take();
        let observation = self.observation.take()?;
        let end = observation.end_of_body(self.delivers_at_end());
        Some(match record {
            Some(record) => Box::pin(async move {
                record.await;
                end.await;
            }),
            None => end,
        })
    }
}

impl Watch {
    /// Polls the target's body, observing it, until it has a frame for the caller.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(write) = self.pending.as_mut() {
                ready!(write.as_mut().poll(cx));
                self.pending = None;
            }
            if let Some(frame) = self.held.take() {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(error) = self.held_error.take() {
                self.finished = true;
                return Poll::Ready(Some(Err(error)));
            }
            let Some(body) = self.body.as_mut().filter(|_| !self.finished) else {
                return Poll::Ready(None);
            };
            let next = if self.inner_ended {
                None
            } else {
                ready!(body.as_mut().poll_frame(cx))
            };
            match next {
                Some(Ok(frame)) => {
                    let ended = body.is_end_stream();
                    if let Some(data) = frame.data_ref() {
                        self.feed(data.chunk());
                    }
                    if ended {
                        self.inner_ended = true;
                        if self.pending.is_none() {
                            self.json_outcome();
                        }
                    }
                    if self.pending.is_none() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    self.held = Some(frame);
                }
                // Record the break first, then report it.
                Some(Err(error)) => {
                    if let Some(observation) = self.observation.take() {
                        self.pending = Some(observation.broken(&*error));
                    }
                    self.held_error = Some(error);
                }
                None => {
                    self.pending = self.finish();
                    self.finished = true;
                }
            }
        }
    }
}

impl Drop for Watch {
    /// A body dropped before its JSON-RPC response was seen: keep reading it in the background
    /// (bounded in time) so that a result the target sent is still recorded, undelivered.
    ///
    /// Never spawns from a drain that is itself being dropped (a runtime shutting down cancels
    /// the drain task): that drain records `unknown` and stops.
    fn drop(&mut self) {
        let Some(observation) = self.observation.take() else {
            return;
        };
        if observation.has_outcome() {
            return; // completed, not delivered: already recorded
        }
        if self.caller_gone {
            // The drain task's own copy, dropped before the outcome was known.
            observation.dropped_early();
            return;
        }
        let drain_for = observation.drain_timeout;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            observation.dropped_early();
            return;
        };
        let (task, stopped) = observation.background();
        let mut rest = Watch {
            body: self.body.take(),
            observation: Some(observation),
            scanner: std::mem::replace(&mut self.scanner, ResponseScanner::new(false, 0)),
            pending: self.pending.take(),
            held: None,
            held_error: None,
            inner_ended: self.inner_ended,
            finished: self.finished,
            caller_gone: true,
            delivery: None,
        };
        drop(handle.spawn(async move {
            let _task = task;
            let drained = {
                let drain = async {
                    while rest.observation.as_ref().is_some_and(|o| !o.has_outcome()) {
                        match std::future::poll_fn(|cx| rest.poll_next(cx)).await {
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => break,
                        }
                    }
                };
                let mut drain = std::pin::pin!(tokio::time::timeout(drain_for, drain));
                let mut stopped = std::pin::pin!(stopped);
                std::future::poll_fn(|cx| match drain.as_mut().poll(cx) {
                    Poll::Ready(drained) => Poll::Ready(drained.is_ok()),
                    Poll::Pending => stopped.as_mut().poll(cx).map(|()| false),
                })
                .await
            };
            // A write under way (the outcome just found) is finished, never cut.
            if let Some(write) = rest.pending.take() {
                write.await;
            }
            if !drained && let Some(observation) = rest.observation.take() {
                observation.dropped_early();
            }
            // Whatever is left (an outcome recorded, not delivered) stays as it is; taking it
            // keeps `rest`'s own drop from recording again.
            rest.observation.take();
        }));
    }
}

impl<B> Body for GuardResponseBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Answer { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            KindProj::Kept {
                data,
                delivery,
                recording,
            } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(delivery) = delivery.take() {
                    *recording = Some(Box::pin(async move {
                        if let Err(error) = delivery.record().await {
                            tracing::warn!(execution_id = %delivery.execution_id, %error, "could not record the delivery");
                        }
                    }));
                }
                if let Some(write) = recording.as_mut() {
                    ready!(write.as_mut().poll(cx));
                    *recording = None;
                }
                Poll::Ready(None)
            }
            KindProj::Passthrough { inner } => inner.poll_frame(cx).map_err(Into::into),
            KindProj::Observed { watch } => watch.poll_next(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Answer { data } => data.is_none(),
            Kind::Kept {
                data,
                delivery,
                recording,
            } => data.is_none() && delivery.is_none() && recording.is_none(),
            Kind::Passthrough { inner } => inner.is_end_stream(),
            // The end must be polled when it records something (the outcome, the delivery).
            Kind::Observed { watch, .. } => {
                (watch.finished || (watch.inner_ended && watch.end_is_silent()))
                    && watch.pending.is_none()
                    && watch.held.is_none()
                    && watch.held_error.is_none()
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Answer { data } | Kind::Kept { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Passthrough { inner } => inner.size_hint(),
            Kind::Observed { watch } => watch
                .body
                .as_ref()
                .map(|b| b.size_hint())
                .unwrap_or_default(),
        }
    }
}
