//! Request and response bodies of the guard.

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::listing::ListWatch;
use crate::{
    BoxError, ExecutionId,
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::{Ledger, LedgerError},
    observe::{BufferedBody, Observed, Polled, Recorder, Write},
    protocol::{RequestId, tap::EventTap},
};

/// The body the guard sends to the inner service: the buffered request bytes, plus a flag that
/// tells whether the transport ever read them (a body never read proves the request was not
/// sent).
#[derive(Debug)]
pub struct GuardRequestBody(BufferedBody);

impl GuardRequestBody {
    pub(super) fn new(data: Bytes) -> (Self, Polled) {
        let (body, polled) = BufferedBody::new(data);
        (Self(body), polled)
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
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

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

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Observed {
            watch: Observed<B, BoxError>,
        },
        Passthrough {
            #[pin]
            inner: B,
        },
        // A trusted target's `tools/list` answer, passed on untouched while its tools'
        // annotations are read.
        Listed {
            #[pin]
            inner: B,
            watch: ListWatch,
        },
        Answer {
            data: Option<Bytes>,
        },
        // A kept result handed back: delivered once read to its end (or when the caller that
        // deferred the delivery says so).
        Kept {
            data: Option<Bytes>,
            delivery: Option<Delivery>,
            recording: Option<Write>,
        },
    }
}

impl<B> GuardResponseBody<B> {
    /// The target's body, observed; `tap` is the event tap of a resume layer below, when
    /// there is one.
    pub(super) fn observed(
        inner: B,
        recorder: Recorder,
        sse: bool,
        max_event: usize,
        tap: Option<EventTap>,
    ) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let describe = |e: &BoxError| e.to_string();
        let watch = Observed::new(inner, recorder, sse, max_event, describe, tap);
        Self {
            kind: Kind::Observed { watch },
        }
    }

    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: Kind::Passthrough { inner },
        }
    }

    pub(super) fn listed(inner: B, watch: ListWatch) -> Self {
        Self {
            kind: Kind::Listed { inner, watch },
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
        let (recorder, answered) = watch.defer_delivery()?;
        Some(Delivery {
            ledger: recorder.ledger.clone(),
            execution_id: recorder.execution_id,
            request_id: recorder.request_id.clone(),
            answered,
        })
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
            .append_unsynced(LedgerEvent {
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
            Kind::Listed { inner, .. } => f.debug_tuple("Listed").field(inner).finish(),
            Kind::Answer { data } | Kind::Kept { data, .. } => {
                f.debug_tuple("Answer").field(data).finish()
            }
        }
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
            KindProj::Listed { inner, watch } => {
                let frame = ready!(inner.poll_frame(cx)).map(|f| f.map_err(Into::into));
                match &frame {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            watch.feed(data);
                        }
                    }
                    None => watch.end(),
                    Some(Err(_)) => {}
                }
                Poll::Ready(frame)
            }
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
            // A JSON list is read at its end, so the end must be polled.
            Kind::Listed { inner, watch } => watch.is_done() && inner.is_end_stream(),
            // The end must be polled when it records something (the outcome, the delivery).
            Kind::Observed { watch } => watch.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Answer { data } | Kind::Kept { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Passthrough { inner } | Kind::Listed { inner, .. } => inner.size_hint(),
            Kind::Observed { watch } => watch.size_hint(),
        }
    }
}
