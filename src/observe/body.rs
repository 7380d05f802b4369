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

use super::recorder::{Pending, Recorder, Watchers, Write, spawn_finishing, written};
use crate::protocol::{
    response::{Examined, ResponseScanner},
    tap::EventTap,
};

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
    /// The recorder's watchers, kept past the recorder (the last write outlives it).
    watchers: Option<Arc<dyn Watchers>>,
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
    /// With the `tap` of a resume layer below, an SSE stream's events are read from it, not
    /// parsed again.
    pub(crate) fn new(
        inner: B,
        recorder: Recorder,
        sse: bool,
        max: usize,
        describe: fn(&E) -> String,
        tap: Option<EventTap>,
    ) -> Self {
        let drain = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (sender, receiver) = oneshot::channel();
            drop(runtime.spawn(drain(receiver)));
            sender
        });
        Self {
            body: Some(Box::pin(inner)),
            watchers: recorder.watchers.clone(),
            recorder: Some(recorder),
            scanner: match tap.filter(|_| sse) {
                Some(tap) => ResponseScanner::tapped(tap, max),
                None => ResponseScanner::new(sse, max),
            },
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

    /// Starts a ledger write; held frames wait for it. It counts as background work of the
    /// recorder's watchers until it ends (a process that shuts down waits for it).
    fn start(&mut self, write: Write) {
        let write = match &self.watchers {
            Some(watchers) => watchers.track(write),
            None => write,
        };
        let previous = self.pending.take();
        self.pending = spawn_finishing(Box::pin(async move {
            written(previous).await;
            write.await;
        }));
    }

    /// The recording of the target's answer, then the mark that a deferred delivery has
    /// something to deliver: only when the answer carried the result (`carries`).
    fn answered(&self, write: Write, carries: bool) -> Write {
        let Some(flag) = self.answered.clone().filter(|_| carries) else {
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
            if found.is_some() {
                return Examined::Unread;
            }
            let (examined, answer) = recorder.read(message);
            found = answer;
            examined
        });
        if let Some(id) = scanner.last_event_id() {
            recorder.last_event_id = Some(id.to_owned());
        }
        if scanner.is_oversize() {
            recorder.oversize = true;
        }
        if let Some(answer) = found {
            scanner.stop();
            let write = recorder.completed(answer);
            let carries = recorder.carries_result();
            let write = self.answered(write, carries);
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
        let carries = recorder.carries_result();
        let write = self.answered(write, carries);
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
    pub(crate) fn poll_next(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
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
            watchers: self.watchers.clone(),
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

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, convert::Infallible, sync::Arc};

    use super::*;
    use crate::{
        ExecutionId,
        execution::ExecutionState,
        ledger::{FileLedger, Ledger, MemoryLedger},
        observe::recorder::tests::dispatched,
        protocol::RequestId,
    };

    /// A target's body that never says it ended before its `None` (as a chunked response).
    struct Frames(VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    fn frames(parts: &[&'static str]) -> Frames {
        Frames(
            parts
                .iter()
                .map(|p| Bytes::from_static(p.as_bytes()))
                .collect(),
        )
    }

    fn observed(
        ledger: Arc<dyn Ledger>,
        id: ExecutionId,
        body: Frames,
        sse: bool,
    ) -> Observed<Frames, Infallible> {
        let mut recorder = Recorder::new(ledger, id, RequestId::Number(1.into()));
        recorder.status = 200;
        recorder.drain_timeout = std::time::Duration::from_secs(5);
        Observed::new(body, recorder, sse, 1 << 20, |_| String::new(), None)
    }

    async fn state(ledger: &dyn Ledger, id: ExecutionId) -> ExecutionState {
        ledger.get(id).await.unwrap().unwrap().state
    }

    /// The guard's copy handed a JSON body's frames on as they came and recorded the answer
    /// only at the end, so a caller could hold the whole answer while the ledger still said
    /// `dispatched` (the server half's copy held them). Now neither half gives a frame of a
    /// JSON answer before the answer is recorded.
    #[tokio::test]
    async fn a_json_answer_is_recorded_before_any_of_its_frames_goes_on() {
        let ledger = MemoryLedger::new();
        let id = dispatched(&ledger).await;
        let body = frames(&[
            r#"{"jsonrpc":"2.0","id":1,"#,
            r#""result":{"content":[],"isError":false}}"#,
        ]);
        let mut body = observed(Arc::new(ledger.clone()), id, body, false);
        let first = std::future::poll_fn(|cx| body.poll_next(cx)).await;
        assert!(matches!(first, Some(Ok(_))));
        assert_eq!(state(&ledger, id).await, ExecutionState::Completed);
    }

    /// The guard's copy polled its ledger write inside the body: a caller that dropped the
    /// body while the write of the answer ran cut it, and the execution was recorded
    /// `unknown` though its answer had arrived (the server half's copy ran writes as tasks).
    /// Now every write is a task of its own and finishes.
    #[tokio::test]
    async fn a_body_dropped_while_its_answer_is_recorded_still_records_it() {
        let path = std::env::temp_dir().join(format!("mrg-observe-{}", ExecutionId::new().ulid()));
        let ledger: Arc<dyn Ledger> = Arc::new(FileLedger::open(&path).unwrap());
        let id = dispatched(&*ledger).await;
        let body = frames(&[
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n",
        ]);
        let mut body = observed(ledger.clone(), id, body, true);
        let waker = std::task::Waker::noop();
        let polled = body.poll_next(&mut Context::from_waker(waker));
        assert!(polled.is_pending(), "the answer's write is under way");
        drop(body);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while state(&*ledger, id).await == ExecutionState::Dispatched
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(state(&*ledger, id).await, ExecutionState::Completed);
        drop(ledger);
        let _ = std::fs::remove_file(&path);
    }

    /// A body the caller dropped before the answer is read on by the task started with it:
    /// the answer the target still sends is recorded, undelivered.
    #[tokio::test]
    async fn a_body_dropped_early_is_drained_for_its_answer() {
        let ledger = MemoryLedger::new();
        let id = dispatched(&ledger).await;
        let body = frames(&[
            ": keep-alive\n\n",
            "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n",
        ]);
        let body = observed(Arc::new(ledger.clone()), id, body, true);
        drop(body);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while state(&ledger, id).await == ExecutionState::Dispatched
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(state(&ledger, id).await, ExecutionState::Completed);
    }

    /// The body ended without the answer: `unknown`, recorded before the end is reported.
    #[tokio::test]
    async fn a_body_that_ends_without_the_answer_records_unknown() {
        let ledger = MemoryLedger::new();
        let id = dispatched(&ledger).await;
        let body =
            frames(&["data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\n"]);
        let mut body = observed(Arc::new(ledger.clone()), id, body, true);
        while std::future::poll_fn(|cx| body.poll_next(cx))
            .await
            .is_some()
        {}
        assert!(body.is_end_stream());
        assert_eq!(state(&ledger, id).await, ExecutionState::Unknown);
    }
}
