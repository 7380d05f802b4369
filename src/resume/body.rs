//! [`ResumeBody`]: the target's stream, spliced across breaks.

use std::{
    collections::{HashSet, VecDeque},
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};

use super::{
    layer::Config,
    service::{GetFuture, Reconnect},
};
use crate::{
    BoxError,
    protocol::{
        sse::{SseEvent, SseParser},
        tap::EventTap,
    },
};

/// The response body of [`Resume`](super::Resume): the target's stream, continued across breaks.
pub struct ResumeBody<RB> {
    kind: Kind<RB>,
}

enum Kind<RB> {
    Passthrough(Pin<Box<RB>>),
    Resumable(Box<Splice<RB>>),
}

struct Splice<RB> {
    current: Option<Pin<Box<RB>>>,
    reconnect: Reconnect<RB>,
    phase: Phase<RB>,
    parser: SseParser,
    /// Event ids already handed to the caller (bounded).
    delivered: HashSet<String>,
    last_event_id: String,
    out: VecDeque<Bytes>,
    response_seen: bool,
    /// Events are written anew, de-duplicated: from the first resume on (a replay may repeat
    /// what was delivered) until the response is seen at an event's end. Before, the
    /// target's frames go on as they came.
    reencode: bool,
    /// The stream broke inside an event whose first bytes went on (`Some(mid_line)`): the
    /// resumed stream first ends it so that the caller's parser drops it.
    torn: Option<bool>,
    attempts: u32,
    config: Config,
    /// The break being recovered from, returned if recovery fails.
    broken: Option<BoxError>,
    /// The events, for a guard above that reads them instead of parsing the stream again.
    tap: EventTap,
}

enum Phase<RB> {
    Streaming,
    Waiting(Pin<Box<tokio::time::Sleep>>),
    Connecting(GetFuture<RB>),
    Done,
}

/// How many delivered ids a splice remembers for de-duplication.
const MAX_REMEMBERED_IDS: usize = 4096;

/// The type of the event that ends an event torn by a break: clients take only `message`
/// events (rmcp's and the TypeScript SDK's do) as JSON-RPC.
pub(crate) const TORN_EVENT: &str = "mcp-replay-guard-torn";

impl<RB> ResumeBody<RB> {
    pub(super) fn passthrough(body: RB) -> Self {
        Self {
            kind: Kind::Passthrough(Box::pin(body)),
        }
    }

    pub(super) fn resumable(
        body: RB,
        reconnect: Reconnect<RB>,
        config: Config,
        tap: EventTap,
    ) -> Self {
        Self {
            kind: Kind::Resumable(Box::new(Splice {
                current: Some(Box::pin(body)),
                reconnect,
                phase: Phase::Streaming,
                parser: SseParser::with_max_event_size(config.max_event_size),
                delivered: HashSet::new(),
                last_event_id: String::new(),
                out: VecDeque::new(),
                response_seen: false,
                reencode: false,
                torn: None,
                attempts: 0,
                config,
                broken: None,
                tap,
            })),
        }
    }
}

impl<RB> std::fmt::Debug for ResumeBody<RB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Passthrough(_) => f.write_str("ResumeBody::Passthrough"),
            Kind::Resumable(s) => f
                .debug_struct("ResumeBody::Resumable")
                .field("last_event_id", &s.last_event_id)
                .field("attempts", &s.attempts)
                .finish_non_exhaustive(),
        }
    }
}

/// A stream that could not be resumed.
#[derive(Debug, thiserror::Error)]
#[error("the response stream broke and could not be resumed: {reason}")]
pub struct ResumeFailed {
    reason: String,
    #[source]
    source: Option<BoxError>,
}

impl<RB> Splice<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    fn can_resume(&self) -> bool {
        !self.response_seen
            && !self.last_event_id.is_empty()
            && self.attempts < self.config.max_attempts
    }

    fn delay(&self) -> Duration {
        let backoff = self
            .config
            .backoff
            .saturating_mul(1 << self.attempts.min(16));
        self.parser
            .retry()
            .unwrap_or(backoff)
            .min(self.config.max_delay)
    }

    /// Parses a chunk of the current stream: the cursor, the delivered ids, whether the
    /// response came; when re-encoding, each event not delivered before, written anew. An
    /// event's data goes to the tap's reader when there is one (which then says whether it
    /// was the response), else it is parsed here.
    fn feed(&mut self, chunk: &[u8]) -> Result<(), BoxError> {
        let Self {
            parser,
            delivered,
            out,
            response_seen,
            reencode,
            tap,
            last_event_id,
            ..
        } = self;
        let mut tap = tap.lock();
        let pushed = parser.push(chunk, |event| {
            if let Some(id) = &event.id
                && !id.is_empty()
                && !delivered.insert(id.clone())
                && *reencode
            {
                return; // replayed: already delivered
            }
            if delivered.len() > MAX_REMEMBERED_IDS {
                delivered.clear();
            }
            if *reencode {
                out.push_back(encode(&event));
            }
            if !*response_seen {
                if tap.wanted {
                    tap.events.push_back(Bytes::from(event.data));
                } else {
                    *response_seen = is_response(&event.data);
                }
            }
        });
        // The cursor follows the stream's own, a reset (`id` with no value) included: a
        // resume from the id before it would have the target replay what came after it, which
        // went on without ids and cannot be told apart. A fresh stream that has ended no
        // block yet leaves the cursor alone.
        let id = parser.reconnect_id();
        if parser.has_ended_a_block() && id != last_event_id {
            last_event_id.clear();
            last_event_id.push_str(id);
        }
        if tap.wanted && tap.last_event_id != *last_event_id {
            tap.last_event_id.clone_from(last_event_id);
        }
        if pushed.is_err() {
            tap.oversize = true;
        }
        pushed.map_err(Into::into)
    }

    /// What the tap's reader found; the events it no longer wants, judged here. Once the
    /// response is seen at an event's end, nothing is re-encoded any more.
    fn sync_tap(&mut self) {
        if !self.response_seen {
            let mut tap = self.tap.lock();
            let mut seen = tap.response_seen;
            if !tap.wanted {
                for data in tap.events.drain(..) {
                    seen = seen || crate::protocol::response::is_response(&data);
                }
            }
            self.response_seen = seen;
        }
        if self.response_seen && self.reencode && self.parser.is_between_events() {
            self.reencode = false;
        }
    }

    /// The stream broke (`error`) or ended without a response: resume, or give up.
    fn on_break(&mut self, error: Option<BoxError>) -> Option<Result<(), BoxError>> {
        self.current = None;
        if !self.can_resume() {
            self.phase = Phase::Done;
            return error.map(Err);
        }
        if self.broken.is_none() {
            self.broken = error;
        }
        if !self.reencode && self.torn.is_none() && !self.parser.is_between_events() {
            self.torn = Some(self.parser.is_mid_line());
        }
        tracing::debug!(last_event_id = %self.last_event_id, attempt = self.attempts + 1, "resuming a broken response stream");
        self.phase = Phase::Waiting(Box::pin(tokio::time::sleep(self.delay())));
        Some(Ok(()))
    }

    /// Ends an event torn by the break, whose first bytes went on, so that the caller's
    /// parser dispatches it as an event no client reads (the data buffer cannot be emptied
    /// otherwise), and sets its last event id back to the resume's.
    fn end_torn_event(&self, mid_line: bool) -> Bytes {
        let mut out = String::with_capacity(self.last_event_id.len() + 48);
        if mid_line {
            out.push('\n');
        }
        out.push_str("event: ");
        out.push_str(TORN_EVENT);
        out.push_str("\nid: ");
        out.push_str(&self.last_event_id);
        out.push_str("\n\n");
        Bytes::from(out)
    }

    fn give_up(&mut self, reason: String, source: Option<BoxError>) -> BoxError {
        self.phase = Phase::Done;
        tracing::debug!(%reason, "resumption failed");
        Box::new(ResumeFailed {
            reason,
            source: self.broken.take().or(source),
        })
    }

    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(bytes) = self.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            match &mut self.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Streaming => {
                    self.sync_tap();
                    let Some(current) = self.current.as_mut() else {
                        self.phase = Phase::Done;
                        continue;
                    };
                    match ready!(current.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            // Once the response came no resume can follow: nothing to parse.
                            let parse = self.reencode || !self.response_seen;
                            if let Some(data) = frame.data_ref().filter(|_| parse)
                                && let Err(error) = self.feed(data.chunk())
                            {
                                self.phase = Phase::Done;
                                return Poll::Ready(Some(Err(error)));
                            }
                            if !self.reencode {
                                return Poll::Ready(Some(Ok(frame)));
                            }
                        }
                        Some(Err(error)) => {
                            if let Some(Err(error)) = self.on_break(Some(error.into())) {
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                        None if self.response_seen => self.phase = Phase::Done,
                        None => {
                            if let Some(Err(error)) = self.on_break(None) {
                                return Poll::Ready(Some(Err(error)));
                            }
                        }
                    }
                }
                Phase::Waiting(sleep) => {
                    ready!(sleep.as_mut().poll(cx));
                    self.attempts += 1;
                    let get = (self.reconnect)(&self.last_event_id);
                    self.phase = Phase::Connecting(get);
                }
                Phase::Connecting(get) => match ready!(get.as_mut().poll(cx)) {
                    Ok(response) if response.status().is_success() => {
                        // A fresh stream: a new parser, the same de-duplication and cursor.
                        if let Some(mid_line) = self.torn.take() {
                            let end = self.end_torn_event(mid_line);
                            self.out.push_back(end);
                        }
                        self.reencode = true;
                        self.parser = SseParser::with_max_event_size(self.config.max_event_size);
                        self.current = Some(Box::pin(response.into_body()));
                        self.phase = Phase::Streaming;
                    }
                    Ok(response) => {
                        let status = response.status();
                        let error =
                            self.give_up(format!("the resume GET was answered {status}"), None);
                        return Poll::Ready(Some(Err(error)));
                    }
                    Err(error) if self.attempts < self.config.max_attempts => {
                        tracing::debug!(%error, "resume GET failed; trying again");
                        self.phase = Phase::Waiting(Box::pin(tokio::time::sleep(self.delay())));
                    }
                    Err(error) => {
                        let error = self.give_up("the resume GET failed".into(), Some(error));
                        return Poll::Ready(Some(Err(error)));
                    }
                },
            }
        }
    }
}

/// Whether an event's data is a JSON-RPC response (not a request or notification): the end of
/// a POST's stream.
fn is_response(data: &str) -> bool {
    crate::protocol::response::is_response(data.as_bytes())
}

/// Writes an event back as SSE text.
fn encode(event: &SseEvent) -> Bytes {
    let mut out = String::with_capacity(event.data.len() + 32);
    if let Some(id) = &event.id {
        out.push_str("id: ");
        out.push_str(id);
        out.push('\n');
    }
    if event.event != "message" {
        out.push_str("event: ");
        out.push_str(&event.event);
        out.push('\n');
    }
    if let Some(retry) = event.retry {
        out.push_str(&format!("retry: {}\n", retry.as_millis()));
    }
    for line in event.data.split('\n') {
        out.push_str("data: ");
        out.push_str(line);
        out.push('\n');
    }
    out.push('\n');
    Bytes::from(out)
}

impl<RB> Body for ResumeBody<RB>
where
    RB: Body<Data = Bytes>,
    RB::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Passthrough(body) => body.as_mut().poll_frame(cx).map_err(Into::into),
            Kind::Resumable(splice) => splice.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Passthrough(body) => body.is_end_stream(),
            Kind::Resumable(splice) => matches!(splice.phase, Phase::Done) && splice.out.is_empty(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Passthrough(body) => body.size_hint(),
            Kind::Resumable(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};

    use super::*;

    type Stream = UnsyncBoxBody<Bytes, std::io::Error>;

    fn stream(frames: Vec<Bytes>, cut: bool) -> Stream {
        let mut frames: Vec<Result<Frame<Bytes>, std::io::Error>> =
            frames.into_iter().map(|f| Ok(Frame::data(f))).collect();
        if cut {
            frames.push(Err(std::io::ErrorKind::ConnectionReset.into()));
        }
        UnsyncBoxBody::new(StreamBody::new(tokio_stream::iter(frames)))
    }

    fn config() -> Config {
        Config {
            max_attempts: 2,
            max_delay: Duration::from_millis(5),
            backoff: Duration::from_millis(1),
            max_event_size: 1 << 20,
        }
    }

    /// A splice whose resume GETs answer `get`, each with the `Last-Event-ID` it was sent.
    fn resumable(
        first: Stream,
        get: Vec<&'static str>,
    ) -> (
        ResumeBody<Stream>,
        std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        let reconnect: Reconnect<Stream> = Box::new(move |last_event_id| {
            log.lock().unwrap().push(last_event_id.to_owned());
            let frames = get
                .iter()
                .map(|f| Bytes::from_static(f.as_bytes()))
                .collect();
            let response = http::Response::new(stream(frames, false));
            Box::pin(async move { Ok(response) })
        });
        let body = ResumeBody::resumable(first, reconnect, config(), EventTap::default());
        (body, asked)
    }

    const NOTE: &str = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{}}"#;
    const ANSWER: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#;

    /// Every event was parsed and written anew into a frame of its own, even on a stream that
    /// never broke. Now, until a resume, the target's frames go on as they are: the same
    /// bytes (the same buffers), split where the target split them.
    #[tokio::test]
    async fn an_unbroken_stream_goes_on_frame_for_frame() {
        let text = format!("id: 1\nretry: 10\ndata: {NOTE}\n\nid: 2\ndata: {ANSWER}\n\n");
        let text = Bytes::from(text);
        let frames = vec![text.slice(..7), text.slice(7..90), text.slice(90..)];
        let (mut body, asked) = resumable(stream(frames.clone(), false), vec![]);
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            got.push(frame.unwrap().into_data().unwrap());
        }
        assert_eq!(got, frames);
        for (got, sent) in got.iter().zip(&frames) {
            assert_eq!(got.as_ptr(), sent.as_ptr(), "the target's own buffer");
        }
        assert!(asked.lock().unwrap().is_empty());
        assert!(body.is_end_stream());
    }

    /// A stream torn inside an event (mid-line, and at a line's end) and resumed: the caller's
    /// parser reads each message once, in order; the torn event's first bytes end in an event
    /// of a type no client reads as JSON-RPC.
    #[tokio::test]
    async fn a_stream_torn_inside_an_event_gives_each_message_once_in_order() {
        for torn in ["id: 2\ndata: {\"jsonrpc\":", "id: 2\n", "data: x\n", "da"] {
            let first = format!("id: 1\ndata: {NOTE}\n\n{torn}");
            let first = stream(vec![Bytes::from(first)], true);
            let replay = vec![
                "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"replayed\"}\n\n",
                "id: 2\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",",
                "\"params\":{}}\n\nid: 3\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n",
            ];
            let (body, asked) = resumable(first, replay);
            let text = body.collect().await.unwrap().to_bytes();
            let events = SseParser::parse_all(&text, 1 << 20).unwrap();
            let messages: Vec<_> = events
                .iter()
                .filter(|e| e.event == "message")
                .map(|e| e.data.as_str())
                .collect();
            assert_eq!(messages, [NOTE, NOTE, ANSWER], "torn after {torn:?}");
            assert!(
                events
                    .iter()
                    .all(|e| e.event == "message" || e.event == TORN_EVENT),
                "{events:?}"
            );
            // The torn block's `id: 2` ends no block: the resume asks from 1, so the event
            // the block was carrying is replayed, not skipped.
            assert_eq!(*asked.lock().unwrap(), ["1"], "torn after {torn:?}");
        }
    }

    /// An `id` line with no value resets the cursor (WHATWG: the next reconnection sends no
    /// `Last-Event-ID`). The splice took the cursor once per frame and skipped an empty one:
    /// when the reset came in a frame of its own it resumed from the id before the reset, and
    /// the target replayed the event after it, which the caller had: it read it twice.
    /// Found by the attack15 helper.
    #[tokio::test]
    async fn a_reset_id_is_no_cursor_to_resume_from_however_the_frames_fall() {
        let text = format!("id: 1\ndata: {NOTE}\n\nid\ndata: {ANSWER_B}\n\ndata: {{");
        let split = text.find("id\n").unwrap();
        for frames in [
            vec![Bytes::from(text.clone())],
            vec![
                Bytes::from(text[..split].to_owned()),
                Bytes::from(text[split..].to_owned()),
            ],
        ] {
            let replay = vec![
                "data: {\"jsonrpc\":\"2.0\",\"method\":\"b\"}\n\n",
                "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"content\":[]}}\n\n",
            ];
            let (mut body, asked) = resumable(stream(frames, true), replay);
            let mut text = Vec::new();
            let mut failed = false;
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => text.extend_from_slice(&frame.into_data().unwrap()),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let events = SseParser::parse_all(&text, 1 << 20).unwrap();
            let b = events.iter().filter(|e| e.data == ANSWER_B).count();
            assert_eq!(b, 1, "{events:?}");
            assert!(asked.lock().unwrap().is_empty(), "no cursor, no resume");
            assert!(failed, "the break reaches the caller");
        }
    }

    const ANSWER_B: &str = r#"{"jsonrpc":"2.0","method":"b"}"#;

    #[test]
    fn encoded_events_parse_back_to_themselves() {
        let events = [
            SseEvent {
                event: "message".into(),
                data: String::new(),
                id: Some("0/0".into()),
                retry: Some(Duration::from_millis(3000)),
            },
            SseEvent {
                event: "message".into(),
                data: "{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}".into(),
                id: Some("0/1".into()),
                retry: None,
            },
            SseEvent {
                event: "custom".into(),
                data: "a\nb\n".into(),
                id: None,
                retry: None,
            },
        ];
        let mut text = Vec::new();
        for event in &events {
            text.extend_from_slice(&encode(event));
        }
        assert_eq!(SseParser::parse_all(&text, 1 << 20).unwrap(), events);
        assert!(is_response(&events[1].data));
        assert!(!is_response(&events[0].data));
        assert!(!is_response(
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}"
        ));
    }
}
