//! The outcome recorder: what a dispatched call's answer (or its absence) writes to the ledger.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;

use super::probe::ResultProbe;
use crate::{
    ExecutionId,
    execution::{EventKind, LedgerEvent, Timestamp},
    ledger::{Ledger, retry},
    protocol::{
        self, RequestId,
        response::{Examined, ResponseTo, read_message, response_to},
    },
};

/// A ledger write, run to its end by whoever holds it.
pub(crate) type Write = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A ledger write under way as a task of its own (it finishes even when its body is dropped
/// meanwhile); `None` when it already ran in place.
pub(crate) type Pending = Option<tokio::task::JoinHandle<()>>;

/// Waits for a ledger write started with [`spawn_finishing`].
pub(crate) async fn written(write: Pending) {
    if let Some(handle) = write {
        // A write that failed was logged by the write itself.
        let _ = handle.await;
    }
}

/// The outcome of an execution as its attached waiters need it.
#[derive(Debug, Clone)]
pub(crate) enum Settlement {
    /// The execution completed (or was resolved as applied): its result (kept bytes of the
    /// JSON-RPC `result`), when kept.
    Completed {
        execution_id: ExecutionId,
        result: Option<Bytes>,
    },
    /// Anything else: waiters decide again from the ledger.
    Other,
}

/// Who else learns of an observed call's outcome, besides the ledger (the guard's single
/// flight and resume links; the server half has none).
pub(crate) trait Watchers: Send + Sync + 'static {
    /// The stream broke after the event `last_event_id`: a resume of it belongs to the call.
    fn broke_at(&self, last_event_id: &str, recorder: &Recorder);
    /// `write`, counted as work that outlives the call until it finishes.
    fn track(&self, write: Write) -> Write;
    /// A drain of a dropped body starts: its place in the background work (held until it
    /// ends), and a future that resolves when it must stop.
    fn drain(&self) -> (Box<dyn Send>, Write);
}

/// Tells the waiters of an execution its outcome, once (the guard's single-flight owner).
pub(crate) type Settle = Box<dyn FnOnce(Settlement) + Send + Sync>;

/// Records the outcome of one dispatched call, exactly once. Dropped unrecorded (the call's
/// future or its body went away before the answer was seen), it records `unknown`: the tool
/// may have run.
pub(crate) struct Recorder {
    pub(crate) ledger: Arc<dyn Ledger>,
    pub(crate) execution_id: ExecutionId,
    pub(crate) request_id: RequestId,
    /// The HTTP status of the answer (`0` until it arrived).
    pub(crate) status: u16,
    /// The attempt observed; `unknown` marks only it (none for a resume stream).
    pub(crate) attempt: Option<u32>,
    pub(crate) keep_results: bool,
    pub(crate) max_result_bytes: usize,
    /// How long a body the caller dropped is read on for its outcome.
    pub(crate) drain_timeout: Duration,
    /// Observing a resume stream: breaking again leaves the outcome as unknown as it was.
    pub(crate) resume: bool,
    /// Whether reading the body to its end records `delivered`.
    pub(crate) deliver_at_end: bool,
    pub(crate) last_event_id: Option<String>,
    pub(crate) oversize: bool,
    pub(crate) settle: Option<Settle>,
    pub(crate) watchers: Option<Arc<dyn Watchers>>,
    /// The call's span: held open until the outcome is recorded, and the writes run in it
    /// (the ledger names the outcome in it).
    pub(crate) span: tracing::Span,
    recorded: bool,
    /// The recorded answer carried the call's result: only such an answer is delivered. A
    /// JSON-RPC error (an unknown outcome, a refusal) hands the caller no outcome; recording
    /// it delivered would let an execution settled meanwhile by someone else (a twin's probe,
    /// an operator) read as handed back, and a repeat run the action again.
    carries_result: bool,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("execution_id", &self.execution_id)
            .field("recorded", &self.recorded)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder of the call `request_id` of `execution_id`, armed: dropped before it
    /// recorded anything, it records `unknown`.
    pub(crate) fn new(
        ledger: Arc<dyn Ledger>,
        execution_id: ExecutionId,
        request_id: RequestId,
    ) -> Self {
        Self {
            ledger,
            execution_id,
            request_id,
            status: 0,
            attempt: None,
            keep_results: true,
            max_result_bytes: usize::MAX,
            drain_timeout: Duration::ZERO,
            resume: false,
            deliver_at_end: false,
            last_event_id: None,
            oversize: false,
            settle: None,
            watchers: None,
            span: tracing::Span::none(),
            recorded: false,
            carries_result: false,
        }
    }

    /// The answer to the call, if `message` is the JSON-RPC response with the call's id.
    pub(crate) fn answer(&self, message: &[u8]) -> Option<TargetAnswer> {
        TargetAnswer::find(message, &self.request_id)
    }

    /// [`answer`](Self::answer), from the same parse that tells whether `message` is a
    /// JSON-RPC response at all (to any request).
    pub(crate) fn read(&self, message: &[u8]) -> (Examined, Option<TargetAnswer>) {
        let (examined, response) = read_message(message, &self.request_id);
        (examined, response.and_then(TargetAnswer::from_response))
    }

    /// Whether the outcome is recorded (or being recorded).
    pub(crate) fn has_outcome(&self) -> bool {
        self.recorded
    }

    /// Whether the recorded answer carried the call's result, the one answer that is
    /// delivered.
    pub(crate) fn carries_result(&self) -> bool {
        self.carries_result
    }

    /// The JSON-RPC response was seen: keep the result and record `completed` (or `failed`
    /// for a JSON-RPC error) before the caller sees it.
    pub(crate) fn completed(&mut self, answer: TargetAnswer) -> Write {
        self.recorded = true;
        self.carries_result = matches!(answer, TargetAnswer::Result { .. });
        let ledger = self.ledger.clone();
        let (id, status) = (self.execution_id, self.status);
        let (keep, max) = (self.keep_results, self.max_result_bytes);
        let attempt = self.attempt;
        let settle = self.settle.take();
        self.in_span(async move {
            let settlement = record_outcome(&ledger, id, status, attempt, keep, max, answer).await;
            if let Some(settle) = settle {
                settle(settlement);
            }
        })
    }

    /// Records an outcome other than an answer (a refusal, which frees the intent).
    #[cfg(feature = "server")]
    pub(crate) fn settle(&mut self, kind: EventKind) -> Write {
        self.recorded = true;
        let ledger = self.ledger.clone();
        let id = self.execution_id;
        let settle = self.settle.take();
        self.in_span(async move {
            append_logged(&ledger, id, kind).await;
            if let Some(settle) = settle {
                settle(Settlement::Other);
            }
        })
    }

    /// No answer can be recorded: the outcome is unknown.
    pub(crate) fn unknown(&mut self, reason: String) -> Write {
        self.recorded = true;
        let ledger = self.ledger.clone();
        let id = self.execution_id;
        let last_event_id = self.last_event_id.clone();
        if let (Some(last_event_id), Some(watchers)) = (&last_event_id, &self.watchers) {
            watchers.broke_at(last_event_id, self);
        }
        // Only the observed attempt: one dispatched meanwhile is not marked.
        let unknown = (!self.resume).then(|| EventKind::Unknown {
            target_status: Some(self.status).filter(|s| *s != 0),
            attempt: self.attempt,
            reason,
        });
        let settle = self.settle.take();
        self.in_span(async move {
            if let Some(last_event_id) = last_event_id {
                append_logged(&ledger, id, EventKind::EventSeen { last_event_id }).await;
            }
            if let Some(unknown) = unknown {
                append_logged(&ledger, id, unknown).await;
            }
            if let Some(settle) = settle {
                settle(Settlement::Other);
            }
        })
    }

    /// The body ended: `delivered` when the answer carrying the result is recorded (and the
    /// reader delivers), else `unknown` if nothing is recorded.
    pub(crate) fn ended(&mut self, deliver: bool) -> Write {
        if self.recorded {
            if !deliver || !self.carries_result {
                return Box::pin(async {});
            }
            let ledger = self.ledger.clone();
            let id = self.execution_id;
            let jsonrpc_id = Some(self.request_id.clone());
            return self.in_span(async move {
                let delivered = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::now(),
                    kind: EventKind::Delivered { jsonrpc_id },
                };
                // Losing it in a crash only makes a repeat more careful: no sync of its own.
                if let Err(error) = ledger.append_unsynced(delivered).await {
                    tracing::warn!(execution_id = %id, event = "delivered", %error, "could not record");
                }
            });
        }
        let reason = if self.oversize {
            "the response was too large to observe"
        } else {
            "the response ended before the JSON-RPC response to the call"
        };
        self.unknown(reason.into())
    }

    /// The body failed before the answer: `unknown` (nothing when the answer is recorded:
    /// completed, not delivered, the record already says so).
    pub(crate) fn broken(&mut self, error: &dyn std::fmt::Display) -> Write {
        if self.recorded {
            return Box::pin(async {});
        }
        self.unknown(format!(
            "the response stream broke before the JSON-RPC response: {error}"
        ))
    }

    /// A write run in the call's span.
    fn in_span(&self, write: impl Future<Output = ()> + Send + 'static) -> Write {
        use tracing::Instrument;
        Box::pin(write.instrument(self.span.clone()))
    }

    /// `write`, counted as background work when the recorder's watchers count it.
    pub(crate) fn track(&self, write: Write) -> Write {
        match &self.watchers {
            Some(watchers) => watchers.track(write),
            None => write,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.recorded {
            let write = self
                .unknown("the caller dropped the call before its JSON-RPC response arrived".into());
            write_from_drop(self.track(write));
        }
    }
}

/// How long a ledger write from a `Drop` that no runtime can run is driven in place.
const IN_PLACE_WRITE_BOUND: Duration = Duration::from_secs(1);

/// Runs a ledger write that a `Drop` must not lose, without ever letting a `Drop` spawn in a
/// loop: on the current runtime when there is one; when its task is dropped before it finished
/// (the runtime is shutting down, which drops every task), or there is no runtime, the write is
/// driven in place on the dropping thread, bounded by [`IN_PLACE_WRITE_BOUND`]. The file and
/// memory ledgers finish there; a ledger that needs the runtime's I/O cannot, and the record
/// stays as it was (`dispatched` under an owner that is gone, which every later decision reads
/// as unknown).
pub(crate) fn write_from_drop(write: Write) {
    drop(spawn_finishing(write));
}

/// [`write_from_drop`], with the task's handle when there is a runtime.
///
/// The write is polled once in place first: one done at once (a memory ledger's) needs no task
/// of its own, since nothing is left that a dropped body could cut, and the caller is spared a
/// spawn and a wake-up from another worker thread. One that is not done goes on as a task.
pub(crate) fn spawn_finishing(mut write: Write) -> Pending {
    let mut in_place = Context::from_waker(std::task::Waker::noop());
    if write.as_mut().poll(&mut in_place).is_ready() {
        return None;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => Some(handle.spawn(FinishOnDrop(Some(write)))),
        Err(_) => {
            drive_in_place(write);
            None
        }
    }
}

/// A write that its task may drop unfinished; then it is driven in place.
struct FinishOnDrop(Option<Write>);

impl Future for FinishOnDrop {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(write) = self.0.as_mut() {
            std::task::ready!(write.as_mut().poll(cx));
            self.0 = None;
        }
        Poll::Ready(())
    }
}

impl Drop for FinishOnDrop {
    fn drop(&mut self) {
        if let Some(write) = self.0.take() {
            drive_in_place(write);
        }
    }
}

/// Polls `write` on this thread until it finishes or [`IN_PLACE_WRITE_BOUND`] passes. A write
/// that panics here (it needed a runtime that is gone) is caught and logged: a `Drop` must not
/// unwind into a runtime's shutdown.
fn drive_in_place(mut write: Write) {
    #[cfg(feature = "simulation")]
    if crate::simulation::killing() {
        return;
    }
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = std::time::Instant::now() + IN_PLACE_WRITE_BOUND;
    let finished = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        loop {
            if write.as_mut().poll(&mut cx).is_ready() {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::park_timeout(deadline - now);
        }
    }));
    if !matches!(finished, Ok(true)) {
        tracing::warn!(
            "a ledger write at shutdown could not finish; the execution stays `dispatched` and reads as unknown"
        );
    }
}

/// Appends `kind`; a failure is logged (the record then stays as it was, which every later
/// decision reads conservatively).
pub(crate) async fn append_logged(ledger: &Arc<dyn Ledger>, id: ExecutionId, kind: EventKind) {
    let name = kind.name();
    let event = LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind,
    };
    // An outcome is retried on a storage failure, as every ledger write of an outcome is.
    if let Err(error) = retry::record_outcome_event(ledger, event, None).await {
        tracing::warn!(execution_id = %id, event = name, %error, "could not record");
    }
}

/// The target's answer to a call.
#[derive(Debug)]
pub(crate) enum TargetAnswer {
    /// A `result` (its exact bytes), with the tool's `isError`, and the task id when the call
    /// became an MCP task.
    Result {
        raw: Bytes,
        is_error: bool,
        task_id: Option<String>,
        /// The one pass over the result saw a double that may be an integer literal beyond
        /// 64 bits: the text is scanned for one before the result is kept.
        maybe_wide: bool,
    },
    /// A JSON-RPC `error`: a refusal, or a failure perhaps after the tool ran, as its code
    /// says. Only its code is recorded (a server's
    /// message may echo arguments, secrets included).
    Error { code: i64 },
}

impl TargetAnswer {
    /// The answer in `message` if it is the JSON-RPC response to the request `id`. The result
    /// is kept as the exact bytes the target sent, and read once more, in one pass, for what
    /// the record needs ([`ResultProbe`]).
    pub(crate) fn find(message: &[u8], id: &RequestId) -> Option<Self> {
        Self::from_response(response_to(message, id)?)
    }

    /// The answer a response gives.
    pub(crate) fn from_response(response: ResponseTo<'_>) -> Option<Self> {
        match response {
            ResponseTo::Result(raw) => {
                let ResultProbe {
                    is_error,
                    task_id,
                    maybe_wide,
                } = ResultProbe::read(raw.get());
                let raw = Bytes::copy_from_slice(raw.get().as_bytes());
                Some(Self::Result {
                    raw,
                    is_error,
                    task_id,
                    maybe_wide,
                })
            }
            ResponseTo::Error { code } => Some(Self::Error { code }),
        }
    }
}

/// Records the target's answer: for a JSON-RPC error, `failed` when its code proves the tool
/// did not run and `unknown` otherwise ([`error_may_have_run`](crate::decide::classify::error_may_have_run)); else the result kept (when
/// `keep`, it fits `max`, and it holds no integer beyond 64 bits, which a ledger would hand
/// back rewritten as the nearest double) and `completed`.
pub(crate) async fn record_outcome(
    ledger: &Arc<dyn Ledger>,
    id: ExecutionId,
    status: u16,
    attempt: Option<u32>,
    keep: bool,
    max: usize,
    answer: TargetAnswer,
) -> Settlement {
    let (raw, is_error, maybe_wide) = match answer {
        TargetAnswer::Result {
            raw,
            is_error,
            task_id,
            maybe_wide,
        } => {
            if let Some(task_id) = task_id {
                append_logged(ledger, id, EventKind::TaskCreated { task_id }).await;
            }
            (raw, is_error, maybe_wide)
        }
        TargetAnswer::Error { code } => {
            let kind = if crate::decide::classify::error_may_have_run(code) {
                EventKind::Unknown {
                    target_status: Some(status),
                    attempt,
                    reason: format!(
                        "the server answered the call with JSON-RPC error {code}, which does not \
                         prove the tool did not run"
                    ),
                }
            } else {
                EventKind::Failed {
                    target_status: Some(status),
                    reason: format!("the server answered the call with JSON-RPC error {code}"),
                }
            };
            append_logged(ledger, id, kind).await;
            return Settlement::Other;
        }
    };
    // The text is scanned only when the probe saw a double that may stand for a wide literal.
    let keep = keep && raw.len() <= max && !(maybe_wide && protocol::json_has_inexact_number(&raw));
    let completed = LedgerEvent {
        execution_id: id,
        at: Timestamp::now(),
        kind: EventKind::Completed {
            target_status: status,
            is_error,
            result_reference: None,
        },
    };
    // One write: the result is kept with its `completed`, or not at all.
    let kept = match retry::record_outcome_event(ledger, completed, keep.then(|| raw.clone())).await
    {
        Ok(record) => record.result_reference.is_some(),
        Err(error) => {
            tracing::warn!(execution_id = %id, event = "completed", %error, "could not record");
            false
        }
    };
    Settlement::Completed {
        execution_id: id,
        result: kept.then_some(raw),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        execution::{Claim, ExecutionState, RetryClass, fixtures},
        ledger::MemoryLedger,
        protocol::LEXICAL_SCANS,
    };

    /// A dispatched call (attempt 1) in `ledger`.
    pub(crate) async fn dispatched(ledger: &dyn Ledger) -> ExecutionId {
        let claim = Claim {
            at: Timestamp::now(),
            ..fixtures::claim(RetryClass::Idempotent, "test")
        };
        let id = ledger.claim(claim).await.unwrap().record().execution_id;
        for kind in [
            EventKind::Authorized,
            fixtures::dispatched(id, 1, Some("test")),
        ] {
            let event = LedgerEvent {
                execution_id: id,
                at: Timestamp::now(),
                kind,
            };
            ledger.append(event).await.unwrap();
        }
        id
    }

    /// Delivered is recorded for an answer that carried the result, never for a JSON-RPC
    /// error read to its end: that answer hands the caller no outcome. Recorded, it let an
    /// execution that a twin's probe resolved meanwhile read as handed back, and the next
    /// repeat ran the action again (found by the simulator).
    #[tokio::test(flavor = "current_thread")]
    async fn only_an_answer_that_carries_the_result_is_delivered() {
        for (message, delivered) in [
            (
                r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}"#,
                false,
            ),
            (r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#, true),
        ] {
            let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
            let id = dispatched(&*ledger).await;
            let mut recorder = Recorder::new(ledger.clone(), id, RequestId::from(1));
            recorder.status = 200;
            let answer = TargetAnswer::find(message.as_bytes(), &RequestId::from(1)).unwrap();
            recorder.completed(answer).await;
            if !delivered {
                // The outcome is unknown; a twin's probe settles it before the caller reads
                // the end of the answer.
                crate::guard::resolve(&*ledger, id, true, "probe:test", "applied")
                    .await
                    .unwrap();
            }
            recorder.ended(true).await;
            let events = ledger.events(id).await.unwrap();
            assert_eq!(
                events.iter().any(|e| e.kind.name() == "delivered"),
                delivered,
                "{message}"
            );
        }
    }

    /// Records the answer in `message` and says whether its result was kept, with the
    /// record and how many lexical scans it took.
    async fn record_answer(message: &str) -> (bool, crate::execution::ExecutionRecord, usize) {
        let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
        let id = dispatched(&*ledger).await;
        let answer = TargetAnswer::find(message.as_bytes(), &RequestId::from(1)).unwrap();
        let before = LEXICAL_SCANS.with(std::cell::Cell::get);
        let settlement = record_outcome(&ledger, id, 200, None, true, usize::MAX, answer).await;
        let scans = LEXICAL_SCANS.with(std::cell::Cell::get) - before;
        let kept = matches!(
            settlement,
            Settlement::Completed {
                result: Some(_),
                ..
            }
        );
        let record = ledger.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, ExecutionState::Completed);
        (kept, record, scans)
    }

    /// The result was parsed three times (the envelope, a struct of its fields, a lexical
    /// scan for wide integers); now the fields and the sign of a wide integer come from one
    /// pass, and the text is scanned only when that pass saw a double that may be one.
    #[tokio::test(flavor = "current_thread")]
    async fn a_result_is_read_in_one_pass_and_scanned_only_for_a_possible_wide_integer() {
        let (kept, record, scans) = record_answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"18446744073709551617"}],"n":18446744073709551615,"isError":true}}"#,
        )
        .await;
        assert!(kept && record.is_error);
        assert_eq!(scans, 0, "a normal result is not scanned again");

        let (kept, record, scans) = record_answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"n":18446744073709551617}}"#,
        )
        .await;
        assert!(!kept, "a wide integer literal is still not kept");
        assert!(!record.is_error);
        assert_eq!(scans, 1);

        let (kept, _, scans) =
            record_answer(r#"{"jsonrpc":"2.0","id":1,"result":{"content":[],"d":1e20}}"#).await;
        assert!(kept, "a double spelled as a double is kept");
        assert_eq!(
            scans, 1,
            "scanned: a double of that size may have been a literal"
        );

        let (kept, record, _) = record_answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","taskId":"t-9","isError":false}}"#,
        )
        .await;
        assert!(kept && !record.is_error);
        assert_eq!(record.correlation.task_id.as_deref(), Some("t-9"));
    }

    /// Found by attacking it: a lone surrogate the one pass refused (the envelope
    /// and the struct skip it unread) ended the pass before the wide integer after it, and the
    /// memory ledger kept that result; the tool's `isError` read as `false` too.
    #[tokio::test(flavor = "current_thread")]
    async fn a_result_the_one_pass_cannot_finish_is_still_checked_for_wide_integers() {
        let (kept, record, _) = record_answer(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"\ud800"}],"isError":true,"n":18446744073709551617}}"#,
        )
        .await;
        assert!(!kept, "a wide integer literal is not kept");
        assert!(record.is_error);
    }

    /// Over every channel the recorder is the same: a JSON-RPC error is `unknown` unless its
    /// code proves the tool did not run. `-32603` (an exception after the commit), the
    /// `-32000..=-32099` range (a gateway's error after forwarding, the server half's "may have
    /// run") and codes nobody defined used to be `failed`, which freed the intent for a second
    /// run.
    #[tokio::test(flavor = "current_thread")]
    async fn a_json_rpc_error_is_failed_only_when_its_code_proves_the_tool_did_not_run() {
        use crate::decide::classify::{KEY_IN_FLIGHT, KEY_OUTCOME_UNKNOWN};
        const KEY_REUSED: i64 = -32081;
        const KEY_NOT_RECORDED: i64 = -32084;
        for (code, state) in [
            (KEY_OUTCOME_UNKNOWN, ExecutionState::Unknown),
            (KEY_IN_FLIGHT, ExecutionState::Unknown),
            (KEY_REUSED, ExecutionState::Unknown),
            (KEY_NOT_RECORDED, ExecutionState::Unknown),
            (-32603, ExecutionState::Unknown),
            (-32000, ExecutionState::Unknown),
            (7, ExecutionState::Unknown),
            (-32700, ExecutionState::Failed),
            (-32600, ExecutionState::Failed),
            (-32601, ExecutionState::Failed),
            (-32602, ExecutionState::Failed),
        ] {
            let ledger: Arc<dyn Ledger> = Arc::new(MemoryLedger::new());
            let id = dispatched(&*ledger).await;
            let message =
                format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{code},"message":"m"}}}}"#);
            let answer = TargetAnswer::find(message.as_bytes(), &RequestId::from(1)).unwrap();
            record_outcome(&ledger, id, 200, Some(1), true, usize::MAX, answer).await;
            let record = ledger.get(id).await.unwrap().unwrap();
            assert_eq!(record.state, state, "JSON-RPC error {code}");
        }
    }
}
