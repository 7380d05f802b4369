//! A deliberately small SSE reader for tests: events are split on blank lines
//! (`\n\n`, `\r\n\r\n` or `\r\r`), fields are `id`, `event`, `data`, `retry`,
//! and lines starting with `:` are comments. It is independent of the crate
//! under test so it can judge the crate's own parser.

use std::pin::Pin;

use bytes::{Buf, Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

use super::BoxError;

/// One parsed SSE event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `id:` field, if the event carried one.
    pub id: Option<String>,
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// All `data:` lines joined with `\n` (empty for a priming event).
    pub data: String,
    /// The `retry:` field in milliseconds, if any.
    pub retry: Option<u64>,
    /// The raw text of the event block (without the terminating blank line).
    pub raw: String,
}

impl SseEvent {
    /// The data parsed as JSON, if it is non-empty valid JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        if self.data.trim().is_empty() {
            return None;
        }
        serde_json::from_str(&self.data).ok()
    }

    /// True when this event carries a JSON-RPC response or error (a message
    /// with an `id` and a `result` or `error` member).
    pub fn is_jsonrpc_response(&self) -> bool {
        self.json().is_some_and(|v| is_jsonrpc_response(&v))
    }

    /// Parse one event block (no trailing blank line). Returns `None` for a
    /// block that holds only comments.
    pub fn parse(block: &str) -> Option<SseEvent> {
        let mut event = SseEvent {
            raw: block.to_owned(),
            ..SseEvent::default()
        };
        let mut data_lines: Vec<&str> = Vec::new();
        let mut any_field = false;
        for line in block.split(['\n', '\r']) {
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let (field, value) = match line.split_once(':') {
                Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
                None => (line, ""),
            };
            any_field = true;
            match field {
                "id" => event.id = Some(value.to_owned()),
                "event" => event.event = Some(value.to_owned()),
                "data" => data_lines.push(value),
                "retry" => event.retry = value.trim().parse().ok(),
                _ => {}
            }
        }
        if !any_field {
            return None;
        }
        event.data = data_lines.join("\n");
        Some(event)
    }
}

/// True when `value` is a JSON-RPC response/error object.
pub fn is_jsonrpc_response(value: &serde_json::Value) -> bool {
    // An error to a request whose id could not be read has no id (MCP's schema allows no
    // `"id": null`).
    (value.get("id").is_some() && value.get("result").is_some()) || value.get("error").is_some()
}

/// Find the end of the first complete event block in `buf`: returns
/// `(block_len, delimiter_len)`.
pub(crate) fn find_event_boundary(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i < buf.len() {
        match buf[i] {
            b'\n' => {
                if buf.get(i + 1) == Some(&b'\n') {
                    return Some((i, 2));
                }
                if buf.get(i + 1) == Some(&b'\r') && buf.get(i + 2) == Some(&b'\n') {
                    return Some((i, 3));
                }
            }
            b'\r' => {
                if buf.get(i + 1) == Some(&b'\n') {
                    if buf.get(i + 2) == Some(&b'\r') && buf.get(i + 3) == Some(&b'\n') {
                        return Some((i, 4));
                    }
                    if buf.get(i + 2) == Some(&b'\n') {
                        return Some((i, 3));
                    }
                } else if buf.get(i + 1) == Some(&b'\r') {
                    return Some((i, 2));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Incremental SSE reader over any `http_body::Body`.
pub struct SseReader<B> {
    body: Pin<Box<B>>,
    buf: BytesMut,
    done: bool,
}

impl<B> SseReader<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub fn new(body: B) -> Self {
        SseReader {
            body: Box::pin(body),
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// The next event. `Ok(None)` at a clean end of the body; `Err` when the
    /// body fails (e.g. the connection was cut mid-stream).
    pub async fn next_event(&mut self) -> Result<Option<SseEvent>, BoxError> {
        loop {
            if let Some((len, delim)) = find_event_boundary(&self.buf) {
                let block = self.buf.split_to(len + delim);
                let text = String::from_utf8_lossy(&block[..len]).into_owned();
                match SseEvent::parse(&text) {
                    Some(event) => return Ok(Some(event)),
                    None => continue,
                }
            }
            if self.done {
                if self.buf.iter().all(|b| b.is_ascii_whitespace()) {
                    return Ok(None);
                }
                // A final event without a terminating blank line.
                let rest = self.buf.split();
                let text = String::from_utf8_lossy(&rest).into_owned();
                return Ok(SseEvent::parse(&text));
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(error)) => {
                    self.done = true;
                    return Err(error.into());
                }
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        let bytes: Bytes = data.copy_to_bytes(data.remaining());
                        self.buf.extend_from_slice(&bytes);
                    }
                }
            }
        }
    }

    /// Read events until the body ends or fails. Returns the events seen and
    /// the terminal error, if the body failed.
    pub async fn read_all(mut self) -> (Vec<SseEvent>, Option<BoxError>) {
        let mut events = Vec::new();
        loop {
            match self.next_event().await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => return (events, None),
                Err(error) => return (events, Some(error)),
            }
        }
    }
}
