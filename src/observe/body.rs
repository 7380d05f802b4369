//! The observed response body: the target's answer on its way to the caller, recorded before
//! the caller holds it.

use std::{
    collections::VecDeque,
    future::Future,
    pin::{Pin, pin},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, ready},
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use tokio::sync::oneshot;

use super::recorder::{Pending, Recorder, Write, spawn_finishing, written};
use crate::protocol::response::ResponseScanner;

/// A response body watched for the JSON-RPC response to one dispatched call.
///
/// Pending, held, finished: a frame that carries the answer (an SSE event; for JSON, every
/// frame, since the answer is known only at the last byte) is held until the outcome is
/// recorded, so the caller never holds an answer the ledger does not. Every ledger write runs
/// as a task of its own: a body dropped while one runs does not cut it.
///
/// # When the caller drops it early
/// A task started with the body waits for it. A body dropped before its outcome is known is
/// sent to that task, which reads it on (bounded by the recorder's drain timeout, stopped by
/// its watchers' shutdown) so that a result the target sent is still recorded, undelivered.
/// Nothing is spawned from `Drop`; dropped where no runtime runs, the recorder records
/// `unknown` in place.
///
/// Generic over the target's body `B` (not boxed: the body is `Sync` when `B` is) and the
/// error `E` it reports (`B::Error`, or the guard's `BoxError`).
pub(crate) struct Observed<B, E> {
    body: Option<Pin<Box<B>>>,
    /// Present until the outcome (and the delivery) is recorded.
    recorder: Option<Recorder>,
    scanner: ResponseScanner,
    sse: bool,
    /// A ledger write that must finish before held frames are handed on.
    pending: Pending,
    held: VecDeque<Frame<Bytes>>,
    /// A body error held back until the break is recorded.
    held_error: Option<E>,
    /// How a body error reads in the record.
    describe: fn(&E) -> String,
    /// The target's body said it ended (`is_end_stream`) with the last frame it gave.
    inner_ended: bool,
    finished: bool,
    /// The caller dropped the body (this is the drain's copy): read on for the outcome, never
    /// record a delivery, never drain again.
    caller_gone: bool,
    /// Set once the target's answer is recorded, for a caller that records the delivery.
    answered: Option<Arc<AtomicBool>>,
    /// The drain task started with the body.
    drain: Option<oneshot::Sender<Observed<B, E>>>,
}

impl<B, E> std::fmt::Debug for Observed<B, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("recorder", &self.recorder)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl<B, E> Observed<B, E>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<E>,
    E: Send + 'static,
{
    /// Observes `inner`, an SSE stream or one JSON message; `max` bounds what is buffered.
    pub(crate) fn new(
        inner: B,
        recorder: Recorder,
        sse: bool,
        max: usize,
        describe: fn(&E) -> String,
    ) -> Self {
        let drain = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (sender, receiver) = oneshot::channel();
            drop(runtime.spawn(drain(receiver)));
            sender
        });
        Self {
            body: Some(Box::pin(inner)),
            recorder: Some(recorder),
            scanner: ResponseScanner::new(sse, max),
            sse,
            pending: None,
            held: VecDeque::new(),
            held_error: None,
            describe,
            inner_ended: false,
            finished: false,
            caller_gone: false,
            answered: None,
            drain,
        }
    }
}

impl<B, E> Observed<B, E> {
    /// Hands the recording of `delivered` to the caller: the recorder, to say where, and the
    /// flag the body sets once the answer is recorded. `None` once the outcome is recorded.
    pub(crate) fn defer_delivery(&mut self) -> Option<(&Recorder, Arc<AtomicBool>)> {
        let recorder = self.recorder.as_mut()?;
        recorder.deliver_at_end = false;
        let answered = self.answered.get_or_insert_with(Arc::default).clone();
        Some((recorder, answered))
    }

    /// Starts a ledger write; held frames wait for it.
    fn start(&mut self, write: Write) {
        let previous = self.pending.take();
        self.pending = spawn_finishing(Box::pin(async move {
            written(previous).await;
            write.await;
        }));
    }

    /// The recording of the target's answer, then the mark that a deferred delivery has
    /// something to deliver.
    fn answered(&self, write: Write) -> Write {
        let Some(flag) = self.answered.clone() else {
            return write;
        };
        Box::pin(async move {
            write.await;
            flag.store(true, Ordering::Release);
        })
    }

    /// Feeds response bytes; records the answer when it is found.
    fn feed(&mut self, chunk: &[u8]) {
        let Self {
            recorder, scanner, ..
        } = self;
        let Some(recorder) = recorder.as_mut().filter(|r| !r.has_outcome()) else {
            return;
        };
        let mut found = None;
        scanner.feed(chunk, |message| {
            if found.is_none() {
                found = recorder.answer(message);
            }
        });
        if let Some(id) = scanner.last_event_id() {
            recorder.last_event_id = Some(id.to_owned());
        }
        if scanner.is_oversize() {
            recorder.oversize = true;
        }
        if let Some(answer) = found {
            let write = recorder.completed(answer);
            let write = self.answered(write);
            self.start(write);
        }
    }

    /// A JSON body whose last byte arrived: its outcome, recorded before its frames go on.
    fn json_outcome(&mut self) {
        let Some(recorder) = self.recorder.as_mut().filter(|r| !r.has_outcome()) else {
            return;
        };
        let Some(answer) = self.scanner.json_body().and_then(|b| recorder.answer(b)) else {
            return;
        };
        let write = recorder.completed(answer);
        let write = self.answered(write);
        self.start(write);
    }

    /// Whether the end of the body records `delivered`.
    fn delivers_at_end(&self) -> bool {
        !self.caller_gone && self.recorder.as_ref().is_some_and(|r| r.deliver_at_end)
    }

    /// Whether polling the end of the body would record nothing more.
    fn end_is_silent(&self) -> bool {
        self.recorder
            .as_ref()
            .is_none_or(|r| r.has_outcome() && !self.delivers_at_end())
    }

    /// At the end of the body: the outcome if it is still open, then the delivery.
    fn finish(&mut self) {
        self.json_outcome();
        let deliver = self.delivers_at_end();
        if let Some(mut recorder) = self.recorder.take() {
            let end = recorder.ended(deliver);
            self.start(end);
        }
    }

    /// Whether the caller has read everything, and the end records nothing more.
    pub(crate) fn is_end_stream(&self) -> bool {
        (self.finished || (self.inner_ended && self.end_is_silent()))
            && self.pending.is_none()
            && self.held.is_empty()
            && self.held_error.is_none()
    }

    /// Whether frames are held back: a JSON body's answer is known only at its end.
    fn holding(&self) -> bool {
        !self.sse
            && !self.finished
            && !self.scanner.is_oversize()
            && self.recorder.as_ref().is_some_and(|r| !r.has_outcome())
    }

}

impl<B, E> Observed<B, E>
where
    B: Body<Data = Bytes>,
    B::Error: Into<E>,
{
    /// Polls the target's body, observing it, until it has a frame for the caller.
    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        loop {
            if let Some(write) = self.pending.as_mut() {
                // A write that failed was logged by the write itself.
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
                    self.held.push_back(frame);
                }
                // Record the break first, then report it.
                Some(Err(error)) => {
                    let error = error.into();
                    if let Some(mut recorder) = self.recorder.take() {
                        let write = recorder.broken(&(self.describe)(&error));
                        self.start(write);
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

    /// The target's size hint.
    pub(crate) fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map(|b| b.size_hint())
            .unwrap_or_default()
    }
}

impl<B, E> Drop for Observed<B, E> {
    fn drop(&mut self) {
        if self.recorder.as_ref().is_none_or(Recorder::has_outcome) {
            return; // recorded (a write under way is a task of its own and finishes)
        }
        // Dropped where no runtime runs (a plain thread), the body is not read on: the
        // recorder's drop records `unknown` in place.
        let Some(drain) = self
            .drain
            .take()
            .filter(|_| tokio::runtime::Handle::try_current().is_ok())
        else {
            return;
        };
        let rest = Observed {
            body: self.body.take(),
            recorder: self.recorder.take(),
            scanner: std::mem::replace(&mut self.scanner, ResponseScanner::new(false, 0)),
            sse: self.sse,
            pending: self.pending.take(),
            held: VecDeque::new(),
            held_error: None,
            describe: self.describe,
            inner_ended: self.inner_ended,
            finished: self.finished,
            caller_gone: true,
            answered: None,
            drain: None,
        };
        // A drain task that is gone hands `rest` back; dropped here, its recorder records
        // `unknown`.
        drop(drain.send(rest));
    }
}

/// The task started with an observed body: reads on a body the caller dropped before its
/// outcome was known, bounded in time; a body finished (or dropped recorded) ends it at once.
async fn drain<B, E>(receiver: oneshot::Receiver<Observed<B, E>>)
where
    B: Body<Data = Bytes>,
    B::Error: Into<E>,
{
    let Ok(mut rest) = receiver.await else {
        return;
    };
    let Some(recorder) = rest.recorder.as_ref() else {
        return;
    };
    let timeout = recorder.drain_timeout;
    let (work, stop): (Option<Box<dyn Send>>, Write) = match &recorder.watchers {
        Some(watchers) => {
            let (work, stop) = watchers.drain();
            (Some(work), stop)
        }
        None => (None, Box::pin(std::future::pending())),
    };
    let drained = {
        let read = async {
            while rest.recorder.as_ref().is_some_and(|r| !r.has_outcome()) {
                match std::future::poll_fn(|cx| rest.poll_next(cx)).await {
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                }
            }
        };
        let mut read = pin!(tokio::time::timeout(timeout, read));
        let mut stop = stop;
        std::future::poll_fn(|cx| match read.as_mut().poll(cx) {
            Poll::Ready(read) => Poll::Ready(read.is_ok()),
            Poll::Pending => stop.as_mut().poll(cx).map(|()| false),
        })
        .await
    };
    // A write under way (the outcome just found) is finished, never cut.
    written(rest.pending.take()).await;
    if let Some(mut recorder) = rest.recorder.take()
        && !recorder.has_outcome()
    {
        debug_assert!(!drained, "a drain ends with the outcome recorded");
        let reason = "the caller dropped the response before the JSON-RPC response arrived";
        recorder.unknown(reason.into()).await;
    }
    drop(work);
}
