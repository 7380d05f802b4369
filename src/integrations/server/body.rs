//! Request and response bodies of the server-side Idempotency-Key layer.

use std::{
    collections::VecDeque,
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::{
    ExecutionId,
    guard::service::{TargetAnswer, append_logged, record_outcome},
    ledger::{EventKind, Ledger},
    protocol::{RequestId, response::ResponseScanner},
};

pin_project! {
    /// The body the layer hands to the inner service: the caller's body untouched, or the bytes
    /// the layer read to classify a keyed POST.
    pub struct IdempotencyRequestBody<B> {
        #[pin]
        kind: RequestKind<B>,
    }
}

pin_project! {
    #[project = RequestKindProj]
    enum RequestKind<B> {
        Passthrough { #[pin] inner: B },
        Buffered { data: Option<Bytes> },
    }
}

impl<B> IdempotencyRequestBody<B> {
    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: RequestKind::Passthrough { inner },
        }
    }

    pub(super) fn buffered(data: Bytes) -> Self {
        Self {
            kind: RequestKind::Buffered {
                data: Some(data).filter(|d| !d.is_empty()),
            },
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for IdempotencyRequestBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            RequestKind::Passthrough { inner } => {
                f.debug_tuple("Passthrough").field(inner).finish()
            }
            RequestKind::Buffered { data } => f.debug_tuple("Buffered").field(data).finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for IdempotencyRequestBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            RequestKindProj::Passthrough { inner } => inner.poll_frame(cx),
            RequestKindProj::Buffered { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            RequestKind::Passthrough { inner } => inner.is_end_stream(),
            RequestKind::Buffered { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            RequestKind::Passthrough { inner } => inner.size_hint(),
            RequestKind::Buffered { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A ledger write, run as a task of its own: it finishes even when the body is dropped
/// meanwhile, and a task handle keeps the body `Sync` (a boxed ledger future is not).
pub(super) type Write = Option<tokio::task::JoinHandle<()>>;

/// Spawned so that it finishes even when its task is dropped first (a runtime shutting down
/// drops every task), or, outside a runtime, run in place (bounded): a `Drop` that records
/// through it never loses the write nor spawns in a loop.
fn spawn_write(write: impl Future<Output = ()> + Send + 'static) -> Write {
    crate::guard::service::spawn_finishing(Box::pin(write))
}

/// Waits for a ledger write.
pub(super) async fn written(write: Write) {
    if let Some(handle) = write {
        let _ = handle.await;
    }
}

pin_project! {
    /// The response body of the layer: the inner service's body (watched for the final JSON-RPC
    /// response of a keyed call, which is recorded before the frame carrying it is handed on),
    /// or an answer the layer wrote itself (a replay, a 409, a 422).
    pub struct IdempotencyResponseBody<B: Body> {
        #[pin]
        kind: ResponseKind<B>,
    }
}

pin_project! {
    #[project = ResponseKindProj]
    enum ResponseKind<B: Body> {
        Passthrough { #[pin] inner: B },
        Observed { watch: Watch<B> },
        Answer { data: Option<Bytes> },
    }
}

impl<B: Body> IdempotencyResponseBody<B> {
    pub(super) fn passthrough(inner: B) -> Self {
        Self {
            kind: ResponseKind::Passthrough { inner },
        }
    }

    pub(super) fn answer(data: Bytes) -> Self {
        Self {
            kind: ResponseKind::Answer { data: Some(data) },
        }
    }

    pub(super) fn observed(inner: B, sse: bool, recorder: Recorder) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Send,
    {
        let watch = Watch {
            scanner: ResponseScanner::new(sse, recorder.max_result_bytes),
            body: Some(Box::pin(inner)),
            recorder: Some(recorder),
            hold_all: !sse,
            pending: None,
            held: VecDeque::new(),
            held_error: None,
            finished: false,
            drain: Watch::<B>::drain,
        };
        Self {
            kind: ResponseKind::Observed { watch },
        }
    }
}

impl<B: Body + fmt::Debug> fmt::Debug for IdempotencyResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ResponseKind::Passthrough { inner } => {
                f.debug_tuple("Passthrough").field(inner).finish()
            }
            ResponseKind::Observed { .. } => f.write_str("Observed"),
            ResponseKind::Answer { data } => f.debug_tuple("Answer").field(data).finish(),
        }
    }
}

impl<B> Body for IdempotencyResponseBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            ResponseKindProj::Passthrough { inner } => inner.poll_frame(cx),
            ResponseKindProj::Observed { watch } => watch.poll_next(cx),
            ResponseKindProj::Answer { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            ResponseKind::Passthrough { inner } => inner.is_end_stream(),
            ResponseKind::Observed { watch } => {
                watch.finished
                    && watch.pending.is_none()
                    && watch.held.is_empty()
                    && watch.held_error.is_none()
            }
            ResponseKind::Answer { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            ResponseKind::Passthrough { inner } => inner.size_hint(),
            ResponseKind::Observed { watch } => watch
                .body
                .as_ref()
                .map(|b| b.size_hint())
                .unwrap_or_default(),
            ResponseKind::Answer { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// Records the outcome of one dispatched keyed call, exactly once. Dropped unrecorded (the
/// service future or the body went away before the answer was seen), it records `unknown`:
/// the tool may have run, so the key is never run again.
pub(super) struct Recorder {
    pub(super) ledger: Arc<dyn Ledger>,
    pub(super) execution_id: ExecutionId,
    pub(super) request_id: RequestId,
    pub(super) status: u16,
    pub(super) max_result_bytes: usize,
    pub(super) drain_timeout: Duration,
    pub(super) armed: bool,
}

impl Recorder {
    fn answer(&self, message: &[u8]) -> Option<TargetAnswer> {
        TargetAnswer::find(message, &self.request_id)
    }

    /// The final JSON-RPC response: keep the result and record `completed` (or `failed` for a
    /// JSON-RPC error, which frees the key).
    pub(super) fn record(mut self, answer: TargetAnswer) -> Write {
        self.armed = false;
        let ledger = self.ledger.clone();
        let (id, status, max) = (self.execution_id, self.status, self.max_result_bytes);
        spawn_write(async move {
            record_outcome(&*ledger, id, status, true, max, answer).await;
        })
    }

    /// No answer can be recorded: the outcome is unknown.
    pub(super) fn unknown(mut self, reason: String) -> Write {
        let kind = self.unknown_event(reason);
        self.append(kind)
    }

    /// Records an outcome other than an answer.
    pub(super) fn settle(mut self, kind: EventKind) -> Write {
        self.append(kind)
    }

    fn unknown_event(&self, reason: String) -> EventKind {
        EventKind::Unknown {
            target_status: Some(self.status).filter(|s| *s != 0),
            attempt: None,
            reason,
        }
    }

    fn append(&mut self, kind: EventKind) -> Write {
        self.armed = false;
        let ledger = self.ledger.clone();
        let id = self.execution_id;
        spawn_write(async move { append_logged(&*ledger, id, kind).await })
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.armed {
            let kind = self.unknown_event(
                "the request was dropped before its JSON-RPC response was seen".into(),
            );
            drop(self.append(kind));
        }
    }
}

/// Watches the inner body of a keyed call.
struct Watch<B: Body> {
    body: Option<Pin<Box<B>>>,
    scanner: ResponseScanner,
    /// Present until the outcome is recorded.
    recorder: Option<Recorder>,
    /// A JSON body is one message: every frame is held until the body ended and its answer is
    /// recorded (an SSE frame is held only while the write for the answer it carries runs).
    hold_all: bool,
    /// A ledger write that must finish before held frames are handed on.
    pending: Write,
    held: VecDeque<Frame<Bytes>>,
    held_error: Option<B::Error>,
    finished: bool,
    /// Spawns the rest of the watch when the caller drops the body early. Set where the body's
    /// `Send + 'static` bounds are known, so that the body type itself needs none.
    drain: fn(Watch<B>),
}

impl<B: Body<Data = Bytes>> Watch<B> {
    fn holding(&self) -> bool {
        self.hold_all && self.recorder.is_some() && !self.scanner.is_oversize() && !self.finished
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            if let Some(write) = self.pending.as_mut() {
                // A failed write task was logged by the write itself.
                let _ = ready!(Pin::new(write).poll(cx));
                self.pending = None;
            }
            if !self.holding()
                && let Some(frame) = self.held.pop_front()
            {
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(error) = self.held_error.take() {
                self.finished = true;
                return Poll::Ready(Some(Err(error)));
            }
            let Some(body) = self.body.as_mut().filter(|_| !self.finished) else {
                return Poll::Ready(None);
            };
            match ready!(body.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.feed(data.chunk());
                    }
                    self.held.push_back(frame);
                }
                // Record the break first, then report it.
                Some(Err(error)) => {
                    if let Some(recorder) = self.recorder.take() {
                        self.pending = recorder.unknown(
                            "the response body failed before the JSON-RPC response".into(),
                        );
                    }
                    self.held_error = Some(error);
                }
                None => {
                    self.finish();
                    self.finished = true;
                }
            }
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let Some(recorder) = self.recorder.as_ref() else {
            return;
        };
        let mut found = None;
        self.scanner.feed(chunk, |message| {
            if found.is_none() {
                found = recorder.answer(message);
            }
        });
        if let Some(answer) = found
            && let Some(recorder) = self.recorder.take()
        {
            self.pending = recorder.record(answer);
        }
    }

    fn finish(&mut self) {
        let Some(recorder) = self.recorder.take() else {
            return;
        };
        let answer = self.scanner.json_body().and_then(|b| recorder.answer(b));
        self.pending = match answer {
            Some(answer) => recorder.record(answer),
            None if self.scanner.is_oversize() => {
                recorder.unknown("the response was too large to keep".into())
            }
            None => recorder.unknown("the response ended without the JSON-RPC response".into()),
        };
    }
}

impl<B> Watch<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Send,
{
    /// Reads the rest of a body the caller dropped (bounded in time), so that an answer the
    /// tool still sends is recorded and a repeat of the key replays it.
    fn drain(mut rest: Watch<B>) {
        // The drain's own copy never drains again: dropped unfinished (its task cancelled at
        // shutdown), it records `unknown` and stops.
        rest.drain = Watch::<B>::stop;
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return; // the recorder's drop records `unknown`
        };
        let timeout = rest
            .recorder
            .as_ref()
            .map_or(Duration::ZERO, |r| r.drain_timeout);
        drop(handle.spawn(async move {
            let drain = async {
                while rest.recorder.is_some() || rest.pending.is_some() {
                    match std::future::poll_fn(|cx| rest.poll_next(cx)).await {
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => break,
                    }
                }
                written(rest.pending.take()).await;
            };
            let _ = tokio::time::timeout(timeout, drain).await;
            // Timed out: dropping the recorder records `unknown` (and taking it keeps `rest`'s
            // own drop from draining again).
            drop(rest.recorder.take());
        }));
    }
}

impl<B: Body> Watch<B> {
    /// What a drain's own copy does when it is dropped unfinished: the recorder's drop records
    /// `unknown`; nothing is spawned.
    fn stop(mut rest: Watch<B>) {
        drop(rest.recorder.take());
    }
}

impl<B: Body> Drop for Watch<B> {
    fn drop(&mut self) {
        if self.recorder.is_none() {
            return;
        }
        let rest = Watch {
            body: self.body.take(),
            scanner: std::mem::replace(&mut self.scanner, ResponseScanner::new(false, 0)),
            recorder: self.recorder.take(),
            hold_all: false,
            pending: self.pending.take(),
            held: VecDeque::new(),
            held_error: None,
            finished: self.finished,
            drain: self.drain,
        };
        (self.drain)(rest);
    }
}
