//! Media types on the wire: the one comparison every part of the crate uses to tell an SSE
//! answer from a JSON one.
//!
//! A `Content-Type` is compared as a media type (RFC 9110 §8.3.1): type and subtype without
//! regard to case, parameters (`; charset=utf-8`) ignored. `Text/Event-Stream` is SSE;
//! `text/event-streams` is not.

use http::{HeaderMap, HeaderValue, header::CONTENT_TYPE};

/// `text/event-stream`: a Streamable HTTP answer as an SSE stream.
pub const EVENT_STREAM: &str = "text/event-stream";
/// `application/json`: a Streamable HTTP answer as one JSON-RPC message.
pub const JSON: &str = "application/json";
/// The `Accept` a Streamable HTTP `POST` sends: both answer forms.
pub const ACCEPT_BOTH: &str = "text/event-stream, application/json";

/// Whether a `Content-Type` value names the media type `expected` (`type/subtype`), ignoring
/// case and parameters.
///
/// ```
/// use http::HeaderValue;
/// use mcp_replay_guard::protocol::{EVENT_STREAM, media_type_is};
///
/// assert!(media_type_is(&HeaderValue::from_static("Text/Event-Stream; charset=utf-8"), EVENT_STREAM));
/// assert!(!media_type_is(&HeaderValue::from_static("text/event-streams"), EVENT_STREAM));
/// ```
pub fn media_type_is(content_type: &HeaderValue, expected: &str) -> bool {
    let essence = content_type.as_bytes().split(|&b| b == b';').next();
    essence.is_some_and(|essence| {
        essence
            .trim_ascii()
            .eq_ignore_ascii_case(expected.as_bytes())
    })
}

/// Whether a response's `Content-Type` says SSE ([`EVENT_STREAM`], compared as a media type).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|ct| media_type_is(ct, EVENT_STREAM))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(value: &'static str) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
        is_event_stream(&headers)
    }

    #[test]
    fn content_types_are_compared_as_media_types() {
        for yes in [
            "text/event-stream",
            "Text/Event-Stream",
            "TEXT/EVENT-STREAM; charset=utf-8",
            " text/event-stream ;charset=utf-8",
        ] {
            assert!(sse(yes), "{yes}");
        }
        for no in [
            "text/event-streams",
            "text/event",
            "application/json",
            "text/event-stream-x; a=b",
            "",
        ] {
            assert!(!sse(no), "{no}");
        }
        assert!(!is_event_stream(&HeaderMap::new()));
        assert!(media_type_is(
            &HeaderValue::from_static("Application/JSON; charset=utf-8"),
            JSON
        ));
    }
}
