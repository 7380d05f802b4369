//! Finding the JSON-RPC response to one request inside a response body, JSON or SSE, while it
//! streams. The client guard and the server-side Idempotency-Key layer both watch bodies with
//! it, so there is one place that knows how an answer is found (and one SSE parser under it).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

use super::{
    RequestId,
    sse::SseParser,
    tap::{EventTap, TapReader},
};

/// Watches response bytes as they pass: SSE is parsed event by event (never buffered whole);
/// a JSON body is one message, kept up to a bound until its end. Over a
/// [`ResumeLayer`](crate::resume::ResumeLayer) the SSE events come parsed, from its
/// [`EventTap`], and the bytes are not parsed again.
#[derive(Debug)]
pub(crate) struct ResponseScanner {
    format: Format,
    oversize: bool,
}

#[derive(Debug)]
enum Format {
    Sse(SseParser),
    Json(BytesMut, usize),
    Tapped(Tapped),
}

/// SSE events read from a tap, with the bound on one event and the last event id as of the
/// last read.
#[derive(Debug)]
struct Tapped {
    reader: TapReader,
    max: usize,
    last_event_id: String,
    batch: VecDeque<Bytes>,
}

/// What the reader of a message made of it, for a [`EventTap`]'s producer that would
/// otherwise parse it to know whether the stream's response has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Examined {
    /// A JSON-RPC response (a `result` or an `error`, no `method`): [`is_response`].
    Response,
    /// Parsed, and not a response.
    NotResponse,
    /// Not parsed (or not parsed as JSON-RPC): the scanner judges it itself when it must.
    Unread,
}

impl ResponseScanner {
    /// A scanner for an SSE (`sse`) or JSON body; `max` bounds one SSE event or the JSON body.
    pub(crate) fn new(sse: bool, max: usize) -> Self {
        let format = if sse {
            Format::Sse(SseParser::with_max_event_size(max))
        } else {
            Format::Json(BytesMut::new(), max)
        };
        Self {
            format,
            oversize: false,
        }
    }

    /// A scanner of SSE events parsed by the producer of `tap`; `max` bounds one event's data.
    pub(crate) fn tapped(tap: EventTap, max: usize) -> Self {
        Self {
            format: Format::Tapped(Tapped {
                reader: tap.reader(),
                max,
                last_event_id: String::new(),
                batch: VecDeque::new(),
            }),
            oversize: false,
        }
    }

    /// No more messages are wanted (the answer was found): a tap's producer stops queueing.
    pub(crate) fn stop(&self) {
        if let Format::Tapped(tapped) = &self.format {
            tapped.reader.stop();
        }
    }

    /// Whether a response's `Content-Type` says SSE.
    pub(crate) fn is_sse(headers: &HeaderMap) -> bool {
        super::is_event_stream(headers)
    }

    /// Feeds response bytes. `on_message` gets the data of each complete SSE event (of each
    /// event the tap holds, in tapped mode, where `chunk` is not read) and says what it made
    /// of it; JSON bytes are kept (see [`json_body`](Self::json_body)).
    pub(crate) fn feed(&mut self, chunk: &[u8], mut on_message: impl FnMut(&[u8]) -> Examined) {
        match &mut self.format {
            Format::Sse(parser) => {
                if parser
                    .push(chunk, |event| {
                        on_message(event.data.as_bytes());
                    })
                    .is_err()
                {
                    self.oversize = true;
                }
            }
            Format::Tapped(tapped) => {
                self.oversize |= tapped.read(on_message);
            }
            Format::Json(buffer, max) => {
                if buffer.len() + chunk.len() <= *max {
                    buffer.extend_from_slice(chunk);
                } else {
                    self.oversize = true;
                }
            }
        }
    }

    /// The id of the last SSE event seen, if any.
    pub(crate) fn last_event_id(&self) -> Option<&str> {
        match &self.format {
            Format::Sse(parser) if !parser.reconnect_id().is_empty() => Some(parser.reconnect_id()),
            Format::Tapped(tapped) if !tapped.last_event_id.is_empty() => {
                Some(&tapped.last_event_id)
            }
            _ => None,
        }
    }

    /// Whether part of the body could not be observed (an event or a JSON body over the bound).
    pub(crate) fn is_oversize(&self) -> bool {
        self.oversize
    }

    /// The kept bytes of a JSON body (complete once the body ended); `None` for SSE or when
    /// the body went over the bound.
    pub(crate) fn json_body(&self) -> Option<&[u8]> {
        match &self.format {
            Format::Json(buffer, _) if !self.oversize => Some(buffer),
            _ => None,
        }
    }
}

impl Tapped {
    /// Reads the events the producer queued; says whether one was over a bound. Once one
    /// was, no more messages go to `on_message` (as a parser that refused an event reads no
    /// more); every event is still judged for the producer, which needs to know when the
    /// response has come.
    fn read(&mut self, mut on_message: impl FnMut(&[u8]) -> Examined) -> bool {
        let mut oversize = {
            let mut state = self.reader.lock();
            self.last_event_id.clone_from(&state.last_event_id);
            self.batch.clear();
            std::mem::swap(&mut self.batch, &mut state.events);
            state.oversize
        };
        let mut response = false;
        for data in &self.batch {
            // The producer's parser bounds the whole event; this bound is the guard's.
            oversize |= data.len() >= self.max;
            let examined = if oversize {
                Examined::Unread
            } else {
                on_message(data)
            };
            response |= match examined {
                Examined::Response => true,
                Examined::NotResponse => false,
                Examined::Unread => !response && is_response(data),
            };
        }
        self.batch.clear();
        if response {
            self.reader.lock().response_seen = true;
        }
        oversize
    }
}

/// Whether a JSON-RPC message is a response (a `result` or an `error`, no `method`) rather than
/// a request or a notification: on a `POST`'s SSE stream, the event that ends it.
pub(crate) fn is_response(message: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Shape {
        method: Option<IgnoredAny>,
        result: Option<IgnoredAny>,
        error: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Shape>(message)
        .is_ok_and(|m| m.method.is_none() && (m.result.is_some() || m.error.is_some()))
}

/// The JSON-RPC response to the request `id` in a body read whole (JSON, or SSE events), as
/// a tree; `None` when no message in it answers `id`.
pub(crate) fn find_response(body: &[u8], id: &RequestId) -> Option<serde_json::Value> {
    let answer = |m: &[u8]| response_to(m, id).and_then(|_| serde_json::from_slice(m).ok());
    if serde_json::from_slice::<IgnoredAny>(body).is_ok() {
        return answer(body);
    }
    let mut found = None;
    let _ = SseParser::new().push(body, |event| {
        if found.is_none() {
            found = answer(event.data.as_bytes());
        }
    });
    found
}

/// The answer a JSON-RPC response message gives to a request.
#[derive(Debug)]
pub(crate) enum ResponseTo<'a> {
    /// A `result`, as the exact bytes the server sent.
    Result(&'a RawValue),
    /// An `error`, by its code only (a server's message may echo arguments, secrets included).
    Error {
        /// The JSON-RPC error code.
        code: i64,
    },
}

/// Whether `message` (one JSON-RPC message) is the response, a `result` or an `error`, to the
/// request `id`. Ids compare as JSON-RPC ids: `1` and `"1"` differ.
///
/// ```
/// use mcp_replay_guard::protocol::{RequestId, is_response_to};
///
/// let id = RequestId::from(7);
/// assert!(is_response_to(br#"{"jsonrpc":"2.0","id":7,"result":{}}"#, &id));
/// assert!(is_response_to(br#"{"jsonrpc":"2.0","id":7,"error":{"code":-32600,"message":"no"}}"#, &id));
/// assert!(!is_response_to(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#, &id));
/// assert!(!is_response_to(br#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#, &id));
/// ```
pub fn is_response_to(message: &[u8], id: &RequestId) -> bool {
    response_to(message, id).is_some()
}

/// The answer in `message` if it is the JSON-RPC response to the request `id`. Parsed without
/// building a tree.
pub(crate) fn response_to<'a>(message: &'a [u8], id: &RequestId) -> Option<ResponseTo<'a>> {
    read_message(message, id).1
}

/// One parse of `message`: whether it is a JSON-RPC response at all (as [`is_response`] says;
/// [`Examined::Unread`] when it does not parse as an envelope), and the answer in it if it is
/// the response to the request `id`.
pub(crate) fn read_message<'a>(
    message: &'a [u8],
    id: &RequestId,
) -> (Examined, Option<ResponseTo<'a>>) {
    #[derive(serde::Deserialize)]
    struct Envelope<'a> {
        id: Option<RequestId>,
        method: Option<IgnoredAny>,
        #[serde(borrow)]
        result: Option<&'a RawValue>,
        error: Option<ErrorObject>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorObject {
        #[serde(default)]
        code: i64,
    }
    let Ok(envelope) = serde_json::from_slice::<Envelope<'a>>(message) else {
        return (Examined::Unread, None);
    };
    // An envelope that parses has every field `is_response` reads, with the same presence.
    let examined =
        if envelope.method.is_none() && (envelope.result.is_some() || envelope.error.is_some()) {
            Examined::Response
        } else {
            Examined::NotResponse
        };
    if envelope.id.as_ref() != Some(id) {
        return (examined, None);
    }
    let answer = match (envelope.result, envelope.error) {
        (Some(raw), _) => Some(ResponseTo::Result(raw)),
        (None, Some(error)) => Some(ResponseTo::Error { code: error.code }),
        (None, None) => None,
    };
    (examined, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_response_among_sse_events_split_anywhere() {
        let stream = b"id: 0\nretry: 3000\ndata: \n\n\
            data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n\
            id: 7\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[]}}\n\n";
        for split in 1..stream.len() {
            let mut scanner = ResponseScanner::new(true, 1024);
            let mut found = Vec::new();
            for chunk in [&stream[..split], &stream[split..]] {
                scanner.feed(chunk, |m| {
                    if let Some(ResponseTo::Result(raw)) = response_to(m, &RequestId::from(3)) {
                        found.push(raw.get().to_owned());
                    }
                    Examined::Unread
                });
            }
            assert_eq!(found, ["{\"content\":[]}"], "split at {split}");
            assert_eq!(scanner.last_event_id(), Some("7"));
        }
    }

    #[test]
    fn json_bodies_are_kept_up_to_the_bound() {
        let mut scanner = ResponseScanner::new(false, 8);
        scanner.feed(b"{\"a\":", |_| unreachable!("JSON has no events"));
        assert_eq!(scanner.json_body(), Some(&b"{\"a\":"[..]));
        scanner.feed(b"12345}", |_| Examined::Unread);
        assert!(scanner.is_oversize());
        assert_eq!(scanner.json_body(), None);
    }

    #[test]
    fn other_ids_errors_and_garbage_are_told_apart() {
        let id = RequestId::from("a");
        assert!(response_to(br#"{"jsonrpc":"2.0","id":"b","result":{}}"#, &id).is_none());
        assert!(response_to(b"not json", &id).is_none());
        assert!(matches!(
            response_to(
                br#"{"jsonrpc":"2.0","id":"a","error":{"code":-32602,"message":"x"}}"#,
                &id
            ),
            Some(ResponseTo::Error { code: -32602 })
        ));
    }

    #[test]
    fn responses_are_told_from_requests_and_notifications() {
        assert!(is_response(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#));
        assert!(is_response(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"}}"#
        ));
        assert!(!is_response(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#));
        assert!(!is_response(
            br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#
        ));
        assert!(!is_response(b""));
        assert!(!is_response(b"not json"));
    }

    #[test]
    fn a_whole_body_yields_the_response_to_its_id_in_json_or_sse() {
        let id = RequestId::from("p");
        let json = br#"{"jsonrpc":"2.0","id":"p","result":{"status":"completed"}}"#;
        assert_eq!(
            find_response(json, &id).unwrap()["result"]["status"],
            "completed"
        );
        let sse = b"data: {\"jsonrpc\":\"2.0\",\"method\":\"n\"}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":\"p\",\"result\":{}}\n\n";
        assert!(find_response(sse, &id).is_some());
        assert!(find_response(sse, &RequestId::from("q")).is_none());
    }
}
