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
    protocol::sse::{SseEvent, SseParser},
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
    attempts: u32,
    config: Config,
    /// The break being recovered from, returned if recovery fails.
    broken: Option<BoxError>,
}

enum Phase<RB> {
    Streaming,
    Waiting(Pin<Box<tokio::time::Sleep>>),
    Connecting(GetFuture<RB>),
    Done,
}

/// How many delivered ids a splice remembers for de-duplication.
const MAX_REMEMBERED_IDS: usize = 4096;

impl<RB> ResumeBody<RB> {
    pub(super) fn passthrough(body: RB) -> Self {
        Self {
            kind: Kind::Passthrough(Box::pin(body)),
        }
    }

    pub(super) fn resumable(body: RB, reconnect: Reconnect<RB>, config: Config) -> Self {
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
                attempts: 0,
                config,
                broken: None,
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

    fn feed(&mut self, chunk: &[u8]) -> Result<(), BoxError> {
        let Self {
            parser,
            delivered,
            out,
            response_seen,
            ..
        } = self;
        parser.push(chunk, |event| {
            if let Some(id) = &event.id
                && !id.is_empty()
                && !delivered.insert(id.clone())
            {
                return; // replayed: already delivered
            }
            if delivered.len() > MAX_REMEMBERED_IDS {
                delivered.clear();
            }
            *response_seen |= is_response(&event);
            out.push_back(encode(&event));
        })?;
        if !self.parser.last_event_id().is_empty() {
            self.last_event_id = self.parser.last_event_id().to_owned();
        }
        Ok(())
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
        tracing::debug!(last_event_id = %self.last_event_id, attempt = self.attempts + 1, "resuming a broken response stream");
        self.phase = Phase::Waiting(Box::pin(tokio::time::sleep(self.delay())));
        Some(Ok(()))
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
                    let Some(current) = self.current.as_mut() else {
                        self.phase = Phase::Done;
                        continue;
                    };
                    match ready!(current.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            if let Some(data) = frame.data_ref()
                                && let Err(error) = self.feed(data.chunk())
                            {
                                self.phase = Phase::Done;
                                return Poll::Ready(Some(Err(error)));
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

/// Whether an event carries a JSON-RPC response (not a request or notification): the end of a
/// POST's stream.
fn is_response(event: &SseEvent) -> bool {
    crate::protocol::response::is_response(event.data.as_bytes())
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
    use super::*;

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
        assert!(is_response(&events[1]));
        assert!(!is_response(&events[0]));
        assert!(!is_response(&SseEvent {
            event: "message".into(),
            data: "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}".into(),
            id: None,
            retry: None
        }));
    }
}
