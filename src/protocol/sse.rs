//! Incremental `text/event-stream` parser following the WHATWG HTML
//! "Server-sent events" parsing rules.
//!
//! Hand-written rather than reusing `sse-stream` (what rmcp uses): that crate is a
//! `Stream` adapter with no maximum event size, while this crate needs a push parser
//! fed from inside an `http_body::Body` wrapper with bounded memory.
//!
//! Memory is bounded by [`SseParser::max_event_size`]: the bytes of the event being built
//! (the pending line plus the block's data, event type and id buffers) never exceed it,
//! however the input is split into chunks.

use std::time::Duration;

/// Default bound on the size of one event: 4 MiB.
pub const DEFAULT_MAX_EVENT_SIZE: usize = 4 * 1024 * 1024;

/// UTF-8 byte order mark, skipped once at the very start of the stream.
const BOM: &[u8; 3] = b"\xEF\xBB\xBF";

/// Line-buffer capacity kept for reuse after a line completes; larger buffers are released.
const LINE_KEEP: usize = 8 * 1024;

/// Result of the internal parsing steps.
type Res<T = ()> = Result<T, SseError>;
/// Event callback as passed through the internal parsing steps.
type Sink<'a> = &'a mut dyn FnMut(SseEvent);

#[cfg(test)]
thread_local! {
    /// How many bytes this thread's parsers were fed: one pass over a stream feeds its length.
    pub(crate) static PUSHED_BYTES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One dispatched server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SseEvent {
    /// The `event` field; `"message"` when the block set none (the WHATWG default type).
    pub event: String,
    /// The data lines joined with `'\n'` (the trailing LF removed, as WHATWG says).
    pub data: String,
    /// The last valid `id` field set inside this block, `None` when the block had none.
    ///
    /// An `id` with an empty value gives `Some("")` (a reset); an id containing U+0000
    /// is ignored. WHATWG's `lastEventId` is [`SseParser::last_event_id`] instead.
    pub id: Option<String>,
    /// The `retry` field set inside this block (only all-ASCII-digit values count).
    pub retry: Option<Duration>,
}

/// Error returned by [`SseParser::push`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// One event (its pending line plus the data/event/id buffers of the block being
    /// built) exceeded the limit.
    #[error("SSE event exceeds the {limit}-byte limit")]
    EventTooLarge {
        /// The configured maximum event size in bytes.
        limit: usize,
    },
}

impl SseError {
    /// Whether this is [`SseError::EventTooLarge`].
    pub fn is_event_too_large(&self) -> bool {
        matches!(self, Self::EventTooLarge { .. })
    }
}

/// Incremental (push) parser for a `text/event-stream` body.
///
/// Feed it chunks with [`push`](Self::push); complete events are handed to a callback.
/// After an error the parser is poisoned and every later `push` returns the same error.
#[derive(Debug, Clone)]
pub struct SseParser {
    max_event_size: usize,
    /// Bytes of a line whose terminator has not arrived yet.
    line: Vec<u8>,
    /// WHATWG data buffer: each `data` value followed by LF.
    data: String,
    /// WHATWG event type buffer (empty means "message").
    event_type: String,
    /// The `id` set inside the current block.
    block_id: Option<String>,
    /// The `retry` set inside the current block.
    block_retry: Option<Duration>,
    /// WHATWG last event ID buffer; persists across blocks.
    last_event_id: String,
    /// WHATWG "last event ID string" of the event source: the buffer as it was at the end of
    /// the last block, what a reconnection sends.
    reconnect_id: String,
    /// A block has ended on this stream: [`reconnect_id`](Self::reconnect_id) is the stream's
    /// own word (an empty one is a reset), not the parser's initial state.
    block_ended: bool,
    /// Latest valid reconnection time seen on the stream.
    retry: Option<Duration>,
    /// `Some(n)` while still at the start of the stream with `n` BOM bytes matched.
    bom_matched: Option<usize>,
    /// The previous chunk ended with a CR line ending, so a leading LF belongs to it.
    after_cr: bool,
    poisoned: Option<SseError>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::with_max_event_size(DEFAULT_MAX_EVENT_SIZE)
    }
}

impl SseParser {
    /// Creates a parser bounded by [`DEFAULT_MAX_EVENT_SIZE`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a parser whose events (pending line plus the block's data, event type and
    /// id) may not exceed `max_event_size` bytes.
    pub fn with_max_event_size(max_event_size: usize) -> Self {
        Self {
            max_event_size,
            line: Vec::new(),
            data: String::new(),
            event_type: String::new(),
            block_id: None,
            block_retry: None,
            last_event_id: String::new(),
            reconnect_id: String::new(),
            block_ended: false,
            retry: None,
            bom_matched: Some(0),
            after_cr: false,
            poisoned: None,
        }
    }

    /// The configured maximum event size in bytes.
    pub fn max_event_size(&self) -> usize {
        self.max_event_size
    }

    /// The WHATWG "last event ID buffer".
    ///
    /// It persists across events and is also updated by blocks that are not dispatched.
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// Whether the input so far ends between events: no line, and no field of a block,
    /// pending.
    pub(crate) fn is_between_events(&self) -> bool {
        !self.is_mid_line()
            && self.data.is_empty()
            && self.event_type.is_empty()
            && self.block_id.is_none()
            && self.block_retry.is_none()
    }

    /// Whether the input so far ends inside a line (a CR that may still get its LF is a
    /// line's end).
    pub(crate) fn is_mid_line(&self) -> bool {
        !self.line.is_empty() || self.bom_matched.is_some_and(|n| n > 0)
    }

    /// The id a reconnection sends as `Last-Event-ID` (WHATWG's "last event ID string"): the
    /// [`last_event_id`](Self::last_event_id) buffer as it stood at the end of the last
    /// block. An `id` line of a block the stream broke inside does not move it, so a resume
    /// never skips the event that block was carrying.
    pub fn reconnect_id(&self) -> &str {
        &self.reconnect_id
    }

    /// Whether a block has ended on this stream, so that [`reconnect_id`](Self::reconnect_id)
    /// is what the stream set (an empty one after an `id` line with no value: a reset, no
    /// cursor), not the nothing a parser starts with.
    pub(crate) fn has_ended_a_block(&self) -> bool {
        self.block_ended
    }

    /// The latest valid `retry` (reconnection time) seen on the stream.
    pub fn retry(&self) -> Option<Duration> {
        self.retry
    }

    /// Feeds a chunk, which may be split anywhere (mid-line, mid-CRLF, mid-UTF-8
    /// sequence), calling `on_event` for each event dispatched per WHATWG.
    ///
    /// Blocks whose data buffer is empty are not dispatched, but their `id`/`retry` still
    /// update the parser state. Events completed earlier in the chunk are delivered even
    /// when a later line makes this call fail.
    ///
    /// # Errors
    ///
    /// [`SseError::EventTooLarge`] when the event being built would exceed
    /// [`max_event_size`](Self::max_event_size). The parser is then poisoned: its buffers
    /// are released and every later call returns the same error.
    pub fn push(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(SseEvent),
    ) -> Result<(), SseError> {
        if let Some(err) = &self.poisoned {
            return Err(err.clone());
        }
        #[cfg(test)]
        PUSHED_BYTES.with(|n| n.set(n.get() + chunk.len()));
        let result = self.push_inner(chunk, &mut on_event);
        if let Err(err) = &result {
            self.poisoned = Some(err.clone());
            self.line = Vec::new();
            self.data = String::new();
            self.event_type = String::new();
            self.block_id = None;
        }
        result
    }

    /// Parses a whole input and returns its events; an incomplete final block is
    /// discarded, as at end of stream.
    ///
    /// # Errors
    ///
    /// [`SseError::EventTooLarge`] when an event exceeds `max_event_size` bytes.
    pub fn parse_all(input: &[u8], max_event_size: usize) -> Result<Vec<SseEvent>, SseError> {
        let mut parser = Self::with_max_event_size(max_event_size);
        let mut events = Vec::new();
        parser.push(input, |event| events.push(event))?;
        Ok(events)
    }

    fn push_inner(&mut self, mut chunk: &[u8], on_event: Sink<'_>) -> Res {
        if let Some(matched) = self.bom_matched {
            let rest = &BOM[matched..];
            let n = rest.len().min(chunk.len());
            if chunk[..n] != rest[..n] {
                // Not a BOM after all: the held bytes are ordinary line content.
                self.bom_matched = None;
                self.feed(&BOM[..matched], on_event)?;
            } else if n == rest.len() {
                self.bom_matched = None;
                chunk = &chunk[n..];
            } else {
                // Still a possible BOM prefix: hold it (at most two bytes) for the next chunk.
                self.bom_matched = Some(matched + n);
                return Ok(());
            }
        }
        self.feed(chunk, on_event)
    }

    fn feed(&mut self, mut input: &[u8], on_event: Sink<'_>) -> Res {
        if self.after_cr && !input.is_empty() {
            self.after_cr = false;
            if input[0] == b'\n' {
                input = &input[1..];
            }
        }
        while let Some(end) = input.iter().position(|&b| b == b'\n' || b == b'\r') {
            let line = &input[..end];
            if self.line.is_empty() {
                // The whole line lies in this chunk: parse it in place.
                self.check(self.event_bytes() + line.len())?;
                self.process_line(line, on_event)?;
            } else {
                self.append_partial(line)?;
                let mut buffered = std::mem::take(&mut self.line);
                let result = self.process_line(&buffered, on_event);
                if buffered.capacity() <= LINE_KEEP {
                    buffered.clear();
                    self.line = buffered;
                }
                result?;
            }
            let is_cr = input[end] == b'\r';
            input = &input[end + 1..];
            if is_cr {
                match input.first() {
                    Some(b'\n') => input = &input[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        if input.is_empty() {
            Ok(())
        } else {
            self.append_partial(input)
        }
    }

    /// Appends bytes of a not yet terminated line, checking the limit before growing.
    fn append_partial(&mut self, bytes: &[u8]) -> Res {
        self.check(self.event_bytes() + bytes.len())?;
        let extra = self.growth(self.line.len(), self.line.capacity(), bytes.len());
        self.line.reserve_exact(extra);
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn process_line(&mut self, line: &[u8], on_event: Sink<'_>) -> Res {
        if line.is_empty() {
            self.dispatch(on_event);
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return Ok(()), // comment
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        // Field names are compared as bytes: lossy decoding never yields ASCII from
        // non-ASCII bytes, so this matches comparing decoded names.
        match field {
            b"data" => {
                let value = String::from_utf8_lossy(value);
                self.check(self.event_bytes() + value.len() + 1)?;
                let extra = self.growth(self.data.len(), self.data.capacity(), value.len() + 1);
                self.data.reserve_exact(extra);
                self.data.push_str(&value);
                self.data.push('\n');
            }
            b"event" => {
                let value = String::from_utf8_lossy(value);
                self.check(self.event_bytes() - self.event_type.len() + value.len())?;
                self.event_type = value.into_owned();
            }
            b"id" if !value.contains(&0) => {
                let value = String::from_utf8_lossy(value).into_owned();
                let old = self.block_id.as_ref().map_or(0, String::len);
                self.check(self.event_bytes() - old + value.len())?;
                self.last_event_id.clone_from(&value);
                self.block_id = Some(value);
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let digits = value.iter().map(|d| u64::from(d - b'0'));
                let millis = digits.fold(0u64, |acc, d| acc.saturating_mul(10).saturating_add(d));
                let retry = Some(Duration::from_millis(millis));
                self.retry = retry;
                self.block_retry = retry;
            }
            _ => {}
        }
        Ok(())
    }

    /// Handles an empty line: dispatches the block's event if its data buffer is non-empty.
    fn dispatch(&mut self, on_event: Sink<'_>) {
        self.block_ended = true;
        if self.reconnect_id != self.last_event_id {
            self.reconnect_id.clone_from(&self.last_event_id);
        }
        let id = self.block_id.take();
        let retry = self.block_retry.take();
        let event_type = std::mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        let event = Some(event_type).filter(|t| !t.is_empty());
        let event = event.unwrap_or_else(|| "message".to_owned());
        on_event(SseEvent {
            event,
            data,
            id,
            retry,
        });
    }

    /// Bytes held for the event being built.
    fn event_bytes(&self) -> usize {
        self.line.len()
            + self.data.len()
            + self.event_type.len()
            + self.block_id.as_ref().map_or(0, String::len)
    }

    fn check(&self, total: usize) -> Res {
        let limit = self.max_event_size;
        if total > limit {
            Err(SseError::EventTooLarge { limit })
        } else {
            Ok(())
        }
    }

    /// How much to `reserve_exact` so that `additional` more bytes fit in a buffer: grows
    /// geometrically like `Vec`, but never past the limit (callers have checked that
    /// `len + additional` fits).
    fn growth(&self, len: usize, capacity: usize, additional: usize) -> usize {
        let needed = len + additional;
        if needed <= capacity {
            return 0;
        }
        needed.max(capacity.saturating_mul(2).max(64).min(self.max_event_size)) - len
    }

    /// Capacity of all per-event buffers, for the memory-bound tests.
    #[cfg(test)]
    fn buffered_capacity(&self) -> usize {
        self.line.capacity()
            + self.data.capacity()
            + self.event_type.capacity()
            + self.block_id.as_ref().map_or(0, String::capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The id a reconnection sends moves at a block's end, not at its `id` line: a stream
    /// broken inside the block of event 2 resumes from 1 and gets event 2 again.
    #[test]
    fn the_reconnect_id_moves_only_when_a_block_ends() {
        let mut parser = SseParser::new();
        let mut events = 0;
        parser
            .push(
                b"id: 1
data: a

id: 2
data: b",
                |_| events += 1,
            )
            .unwrap();
        assert_eq!(
            (events, parser.last_event_id(), parser.reconnect_id()),
            (1, "2", "1")
        );
        parser
            .push(
                b"

",
                |_| events += 1,
            )
            .unwrap();
        assert_eq!((events, parser.reconnect_id()), (2, "2"));
        // A block without data moves it too (WHATWG sets the event source's id first).
        parser
            .push(
                b"id: 3

",
                |_| events += 1,
            )
            .unwrap();
        assert_eq!((events, parser.reconnect_id()), (2, "3"));
    }
    use proptest::collection::vec;
    use proptest::option::of;
    use proptest::prelude::*;
    use proptest::sample::{Index, select};

    fn ev(event: &str, data: &str, id: Option<&str>, retry_ms: Option<u64>) -> SseEvent {
        let (event, data, id) = (event.to_owned(), data.to_owned(), id.map(str::to_owned));
        let retry = retry_ms.map(Duration::from_millis);
        SseEvent {
            event,
            data,
            id,
            retry,
        }
    }

    fn msg(data: &str) -> SseEvent {
        ev("message", data, None, None)
    }

    fn msg_id(data: &str, id: &str) -> SseEvent {
        ev("message", data, Some(id), None)
    }

    #[derive(Debug, PartialEq)]
    struct Outcome {
        events: Vec<SseEvent>,
        last_id: String,
        retry: Option<Duration>,
        error: Option<SseError>,
    }

    fn run_with_limit(chunks: &[&[u8]], limit: usize) -> Outcome {
        let mut parser = SseParser::with_max_event_size(limit);
        let (mut events, mut error) = (Vec::new(), None);
        for chunk in chunks {
            if let Err(err) = parser.push(chunk, |event| events.push(event)) {
                error = Some(err);
                break;
            }
        }
        let (last_id, retry) = (parser.last_event_id().to_owned(), parser.retry());
        Outcome {
            events,
            last_id,
            retry,
            error,
        }
    }

    fn run(chunks: &[&[u8]]) -> Outcome {
        run_with_limit(chunks, DEFAULT_MAX_EVENT_SIZE)
    }

    /// Checks the expected result for the whole input, then that every 2-way and 3-way
    /// split and byte-at-a-time feeding give the same outcome.
    fn fixture(input: &[u8], expected: &[SseEvent], last_id: &str) -> Outcome {
        let whole = run(&[input]);
        assert_eq!(whole.events, expected, "whole input {input:?}");
        assert_eq!(whole.last_id, last_id, "last_event_id for {input:?}");
        assert_eq!(whole.error, None);
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(run(&[a, b]), whole, "split at {i} of {input:?}");
            for j in i..=input.len() {
                let chunks = [&input[..i], &input[i..j], &input[j..]];
                assert_eq!(run(&chunks), whole, "split at {i},{j} of {input:?}");
            }
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&bytes), whole, "byte at a time: {input:?}");
        whole
    }

    #[test]
    fn typical_mcp_stream() {
        let json = r#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
        let input = format!("id: 0\nretry: 5000\ndata:\n\nid: 1\ndata: {json}\n\n");
        let priming = ev("message", "", Some("0"), Some(5000));
        let out = fixture(input.as_bytes(), &[priming, msg_id(json, "1")], "1");
        assert_eq!(out.retry, Some(Duration::from_millis(5000)));
    }

    #[test]
    fn whatwg_spec_examples() {
        let input = b"data: YHOO\ndata: +2\ndata: 10\n\n";
        fixture(input, &[msg("YHOO\n+2\n10")], "");
        let input = concat!(
            ": test stream\n\ndata: first event\nid: 1\n\n",
            "data:second event\nid\n\ndata:  third event\n\n",
        );
        let (first, second) = (msg_id("first event", "1"), msg_id("second event", ""));
        fixture(input.as_bytes(), &[first, second, msg(" third event")], "");
        fixture(b"data\n\ndata\ndata\n\ndata:", &[msg(""), msg("\n")], "");
        let (input, test) = (b"data:test\n\ndata: test\n\n", msg("test"));
        fixture(input, &[test.clone(), test], "");
    }

    #[test]
    fn event_types() {
        let input =
            b"event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent:\ndata: x\n\n";
        let add = ev("add", "73857293", None, None);
        let remove = ev("remove", "2153", None, None);
        fixture(input, &[add, remove, msg("x")], "");
    }

    #[test]
    fn field_and_value_splitting() {
        // One leading space is removed; later colons belong to the value.
        fixture(b"data:x\n\ndata:  y: z\n\n", &[msg("x"), msg(" y: z")], "");
        // `data` without a colon appends an empty line.
        let input = b"data\ndata\ndata: x\n\ndata\n\n";
        fixture(input, &[msg("\n\nx"), msg("")], "");
        // Comments and unknown (case-sensitive) fields are ignored.
        let input = b":hi\ndata: a\n: x\n:\nfoo: bar\nData: x\nevents: e\ndata: b\n\n:only\n\n";
        fixture(input, &[msg("a\nb")], "");
    }

    #[test]
    fn line_endings_cr_lf_crlf_and_mixed() {
        fixture(b"data: a\r\rdata: b\r\r", &[msg("a"), msg("b")], "");
        fixture(b"data: a\n\ndata: b\n\n", &[msg("a"), msg("b")], "");
        fixture(b"data: a\r\n\r\ndata: b\r\n\r\n", &[msg("a"), msg("b")], "");
        let mixed = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\n\r";
        fixture(mixed, &[msg("a\nb\nc"), msg("d")], "");
        // CR at the end of one push and LF at the start of the next form one line ending.
        let out = run(&[b"data: a\r", b"\ndata: b\r", b"", b"\n\r\n"]);
        assert_eq!(out.events, [msg("a\nb")]);
    }

    #[test]
    fn byte_order_mark() {
        fixture(b"\xEF\xBB\xBFdata: a\n\n", &[msg("a")], "");
        // Only the first BOM is skipped: a second one makes the field name unknown.
        let input = b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\ndata: b\n\n";
        fixture(input, &[msg("b")], "");
        // A BOM later in the stream is not special.
        let input = b"data: a\n\n\xEF\xBB\xBFdata: b\n\ndata: \xEF\xBB\xBFc\n\n";
        fixture(input, &[msg("a"), msg("\u{FEFF}c")], "");
        // A partial BOM at the start is ordinary line content.
        fixture(b"\xEF\xBBdata: a\n\ndata: b\n\n", &[msg("b")], "");
        fixture(b"\xEF\n\xEF\xBB\xBFdata: a\n\ndata: b\n\n", &[msg("b")], "");
    }

    #[test]
    fn id_field() {
        // An id containing NUL is ignored: the buffer keeps "1".
        let input = b"id: 1\ndata: a\n\nid: 2\0x\ndata: b\n\n";
        fixture(input, &[msg_id("a", "1"), msg("b")], "1");
        // `id` without a colon resets the buffer.
        let input = b"id: 7\ndata: a\n\nid\ndata: b\n\n";
        fixture(input, &[msg_id("a", "7"), msg_id("b", "")], "");
        fixture(b"id: 1\nid: 2\ndata: a\n\n", &[msg_id("a", "2")], "2");
    }

    #[test]
    fn block_without_data_is_not_dispatched_but_updates_state() {
        let input = b"id: 42\nretry: 7\nevent: ping\n\ndata: a\n\n";
        let out = fixture(input, &[msg("a")], "42");
        assert_eq!(out.retry, Some(Duration::from_millis(7)));
    }

    #[test]
    fn retry_field() {
        let input = b"retry: 12a\ndata: a\n\nretry:\nretry: -5\nretry: 1 \ndata: b\n\n";
        assert_eq!(fixture(input, &[msg("a"), msg("b")], "").retry, None);
        let expected = ev("message", "a", None, Some(1500));
        let out = fixture(b"retry: 1500\ndata: a\n\n", &[expected], "");
        assert_eq!(out.retry, Some(Duration::from_millis(1500)));
        let out = fixture(b"retry: 99999999999999999999999\n\n", &[], "");
        assert_eq!(out.retry, Some(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn incomplete_final_block_is_discarded() {
        fixture(b"data: a\n\ndata: b\n", &[msg("a")], "");
        fixture(b"data: a\n\ndata: b", &[msg("a")], "");
        fixture(b"data: a\n\nid: 3\ndata: b\r", &[msg("a")], "3");
    }

    #[test]
    fn utf8_is_decoded_per_line_with_replacement() {
        fixture("data: é€😀\n\n".as_bytes(), &[msg("é€😀")], "");
        let input = b"data: \xFF\xC3\n\nevent: \xE2\x82\ndata: x\n\n";
        let expected = [msg("\u{FFFD}\u{FFFD}"), ev("\u{FFFD}", "x", None, None)];
        fixture(input, &expected, "");
    }

    #[test]
    fn parse_all_matches_push() {
        let input = b"data: a\n\nid: 1\ndata: b\n\ndata: c";
        let events = SseParser::parse_all(input, 64).unwrap();
        assert_eq!(events, [msg("a"), msg_id("b", "1")]);
        let err = SseError::EventTooLarge { limit: 5 };
        assert_eq!(SseParser::parse_all(input, 5), Err(err));
        assert_eq!(SseParser::new().max_event_size(), DEFAULT_MAX_EVENT_SIZE);
        assert_eq!(SseParser::with_max_event_size(9).max_event_size(), 9);
    }

    #[test]
    fn huge_line_without_newline_errors_with_bounded_memory() {
        let limit = DEFAULT_MAX_EVENT_SIZE;
        let mut parser = SseParser::new();
        parser.push(b"data: ", |_| panic!("no event")).unwrap();
        let chunk = [b'x'; 1024];
        let mut fed = 6;
        let error = loop {
            assert!(fed < 100 << 20, "never errored within 100 MiB");
            if let Err(err) = parser.push(&chunk, |_| panic!("no event")) {
                break err;
            }
            fed += chunk.len();
            assert!(fed <= limit && parser.buffered_capacity() <= limit);
        };
        assert_eq!(error, SseError::EventTooLarge { limit });
        assert!(fed + chunk.len() > limit, "errored early: {fed}");
        assert_eq!(parser.buffered_capacity(), 0, "buffers released on error");
    }

    #[test]
    fn many_small_data_lines_error() {
        let limit = 1000; // not a power of two, so uncapped doubling would overshoot
        let mut parser = SseParser::with_max_event_size(limit);
        let mut lines = 0;
        let error = loop {
            match parser.push(b"data: x\n", |_| panic!("no event expected")) {
                Ok(()) => lines += 1,
                Err(err) => break err,
            }
            assert!(parser.buffered_capacity() <= limit);
            assert!(lines < limit, "never errored");
        };
        assert!(error.is_event_too_large());
        // Each line adds "x\n" to the data buffer; the failing line needs 8 more bytes.
        assert_eq!(lines, (limit - 8) / 2 + 1);
    }

    #[test]
    fn event_exactly_at_limit_succeeds() {
        let limit = 64;
        let mut at_limit = b"data: ".to_vec();
        at_limit.resize(limit, b'x');
        at_limit.extend_from_slice(b"\n\n");
        let out = run_with_limit(&at_limit.chunks(1).collect::<Vec<_>>(), limit);
        assert_eq!(out.error, None);
        assert_eq!(out.events, [msg(&"x".repeat(limit - 6))]);
        assert_eq!(run_with_limit(&[&at_limit], limit), out);

        let mut over = at_limit.clone();
        over.insert(6, b'x');
        let expected = Some(SseError::EventTooLarge { limit });
        assert_eq!(run_with_limit(&[&over], limit).error, expected);
        let bytes: Vec<&[u8]> = over.chunks(1).collect();
        assert_eq!(run_with_limit(&bytes, limit).error, expected);
    }

    #[test]
    fn limit_counts_event_type_id_data_and_pending_line_together() {
        // Event type "ab" and id "cd" (4 bytes) plus the 16-byte data line need 20 bytes.
        let input = b"event: ab\nid: cd\ndata: 0123456789\n\n";
        let err = SseParser::parse_all(input, 19).unwrap_err();
        assert!(err.is_event_too_large());
        let expected = [ev("ab", "0123456789", Some("cd"), None)];
        assert_eq!(SseParser::parse_all(input, 20).unwrap(), expected);
        // A long comment counts while pending even when it arrives whole in one chunk.
        let input = format!(":{}\ndata: a\n\n", "c".repeat(100));
        assert!(SseParser::parse_all(input.as_bytes(), 100).is_err());
        assert!(SseParser::parse_all(input.as_bytes(), 101).is_ok());
    }

    #[test]
    fn parser_is_poisoned_after_error() {
        let mut parser = SseParser::with_max_event_size(8);
        let mut events = Vec::new();
        let input = b"data: a\n\ndata: 0123456789";
        let err = parser.push(input, |e| events.push(e)).unwrap_err();
        assert_eq!(events, [msg("a")], "events before the error are delivered");
        assert_eq!(err, SseError::EventTooLarge { limit: 8 });
        assert_eq!(err.to_string(), "SSE event exceeds the 8-byte limit");
        for chunk in [&b""[..], b"\n\n", b"data: b\n\n"] {
            assert_eq!(parser.push(chunk, |e| events.push(e)), Err(err.clone()));
        }
        assert_eq!(events.len(), 1);
    }

    /// event type, data lines, id, retry, leading comment, preceding id-only block.
    type Gen = (Opt, Vec<String>, Opt, Option<u32>, bool, Opt);
    type Opt = Option<String>;

    /// Encodes events as SSE text, choosing each line ending from `eols` (0 = LF, 1 = CR,
    /// 2 = CRLF). Returns the bytes, the expected events and the expected last event id.
    fn encode(events: &[Gen], eols: &[u8]) -> (Vec<u8>, Vec<SseEvent>, String) {
        let (mut lines, mut expected, mut last_id) = (Vec::new(), Vec::new(), String::new());
        for (event, data, id, retry, comment, id_only_block) in events {
            if let Some(id) = id_only_block {
                lines.extend([format!("id:{id}"), String::new()]);
                last_id.clone_from(id);
            }
            if *comment {
                lines.push(": keep-alive".to_owned());
            }
            lines.extend(event.iter().map(|t| format!("event: {t}")));
            lines.extend(data.iter().map(|d| format!("data: {d}")));
            lines.extend(id.iter().map(|id| format!("id: {id}")));
            lines.extend(retry.iter().map(|r| format!("retry: {r}")));
            lines.push(String::new());
            if let Some(id) = id {
                last_id.clone_from(id);
            }
            let event = event.clone().filter(|t| !t.is_empty());
            expected.push(SseEvent {
                event: event.unwrap_or_else(|| "message".to_owned()),
                data: data.join("\n"),
                id: id.clone(),
                retry: retry.map(|r| Duration::from_millis(r.into())),
            });
        }
        let (mut out, mut prev_cr) = (Vec::new(), false);
        for (i, line) in lines.iter().enumerate() {
            out.extend_from_slice(line.as_bytes());
            let mut eol = eols[i % eols.len()];
            if prev_cr && line.is_empty() && eol == 0 {
                eol = 2; // a lone LF right after a CR would merge into one CRLF line ending
            }
            out.extend_from_slice([&b"\n"[..], b"\r", b"\r\n"][usize::from(eol)]);
            prev_cr = eol == 1;
        }
        (out, expected, last_id)
    }

    fn split<'a>(input: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        cuts.sort_unstable();
        let mut start = 0;
        let mut chunks: Vec<&[u8]> = cuts
            .into_iter()
            .map(|cut| &input[std::mem::replace(&mut start, cut)..cut])
            .collect();
        chunks.push(&input[start..]);
        chunks
    }

    fn tokens() -> Vec<&'static [u8]> {
        let all =
            b"data|id|event|retry|:| |\r|\n|\r\n|\xEF\xBB\xBF|\xEF|\xEF\xBB|x|5|\0|\xC3\xA9|\xC3";
        all.split(|&b| b == b'|').collect()
    }

    proptest! {
        #[test]
        fn encoder_roundtrip_under_random_chunking(
            events in vec((of("[a-z]{0,6}"), vec("[^\r\n]{0,12}", 1..4), of("[^\r\n\0]{0,8}"),
                of(any::<u32>()), any::<bool>(), of("[0-9a-z]{0,4}")), 0..6),
            eols in vec(0u8..3, 1..16),
            cuts in vec(any::<Index>(), 0..8),
        ) {
            let (input, expected, last_id) = encode(&events, &eols);
            let whole = run(&[&input]);
            prop_assert_eq!(&whole.events, &expected);
            prop_assert_eq!(&whole.last_id, &last_id);
            let retry = events.iter().rev().find_map(|e| e.3);
            prop_assert_eq!(whole.retry, retry.map(|r| Duration::from_millis(r.into())));
            prop_assert_eq!(run(&split(&input, &cuts)), whole);
        }

        #[test]
        fn arbitrary_bytes_same_outcome_under_chunking(
            tokens in vec(select(tokens()), 0..80),
            cuts in vec(any::<Index>(), 0..8),
            limit in prop_oneof![0usize..24, Just(DEFAULT_MAX_EVENT_SIZE)],
        ) {
            let input = tokens.concat();
            let whole = run_with_limit(&[&input], limit);
            prop_assert_eq!(run_with_limit(&split(&input, &cuts), limit), whole);
        }
    }
}
