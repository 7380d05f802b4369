//! What one JSON-RPC message on a message transport (a stdio line) is, read without building a
//! tree: enough to route it, never enough to guard it (the guard classifies requests itself).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::RequestId;

/// The shape of one message.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Shape {
    /// A request: it has a `method` and an `id`, and waits for its answer.
    Request(RequestId),
    /// A notification: a `method`, no `id`.
    Notification,
    /// A `tools/call` without an `id`, or with `"id": null`: no request, yet a lenient server
    /// would run it, unrecorded and unanswerable. Refused unsent with `-32600`
    /// ([`TOOL_CALL_WITHOUT_ID`]), as over HTTP.
    ToolCallWithoutId,
    /// A response or an error: an `id` (null for an error to an unreadable request), no
    /// `method`.
    Response(Option<RequestId>),
    /// A JSON array: a batch, with the id of each request in it.
    Batch(Vec<RequestId>),
    /// Not a JSON-RPC message: why, for a log line (never the bytes, which may hold secrets).
    Unreadable(String),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
}

/// Why a `tools/call` without an id is refused (every channel says the same).
pub(crate) const TOOL_CALL_WITHOUT_ID: &str = "a tools/call must be a request with a string or \
     integer `id` (not null, not missing); nothing was sent";

/// Whether a message's `method` (as written, escapes and all) names `tools/call`.
fn is_tool_call(method: &RawValue) -> bool {
    serde_json::from_str::<String>(method.get()).is_ok_and(|m| m == super::TOOLS_CALL)
}

/// The shape of `bytes`.
pub(crate) fn shape_of(bytes: &[u8]) -> Shape {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return match serde_json::from_slice::<Vec<Envelope<'_>>>(bytes) {
            Ok(batch) => Shape::Batch(
                batch
                    .into_iter()
                    .filter(|m| m.method.is_some())
                    .filter_map(|m| m.id)
                    .collect(),
            ),
            Err(error) => Shape::Unreadable(format!("not a JSON-RPC batch: {error}")),
        };
    }
    match serde_json::from_slice::<Envelope<'_>>(bytes) {
        Ok(Envelope {
            id: Some(id),
            method: Some(_),
        }) => Shape::Request(id),
        Ok(Envelope {
            id: None,
            method: Some(method),
        }) if is_tool_call(method) => Shape::ToolCallWithoutId,
        Ok(Envelope {
            id: None,
            method: Some(_),
        }) => Shape::Notification,
        Ok(Envelope { id, method: None }) => Shape::Response(id),
        Err(error) => Shape::Unreadable(format!("not a JSON-RPC message: {error}")),
    }
}

/// The request a `notifications/cancelled` cancels (`params.requestId`), when `bytes` is one.
pub(crate) fn cancelled_request(bytes: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct Cancelled<'a> {
        #[serde(borrow)]
        method: &'a str,
        params: Params,
    }
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "requestId")]
        request_id: RequestId,
    }
    let message: Cancelled<'_> = serde_json::from_slice(bytes).ok()?;
    (message.method == "notifications/cancelled").then_some(message.params.request_id)
}

/// The `id` of a message of which only the first bytes are at hand (a line over the size
/// bound): found when it comes among the top-level members before the cut, as rmcp and most
/// servers write it (`{"jsonrpc":"2.0","id":7,"result":…`).
///
/// Written by hand because no parser hands out a member of an unfinished object: serde_json
/// reads members in order, so the seed below keeps the id as it passes and the error of the
/// cut that follows is ignored.
pub(crate) fn id_in_prefix(prefix: &[u8]) -> Option<RequestId> {
    use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

    struct Seek<'a>(&'a mut Option<RequestId>);
    impl<'de> DeserializeSeed<'de> for Seek<'_> {
        type Value = ();
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON-RPC message")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    *self.0 = map.next_value::<Option<RequestId>>()?;
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut id = None;
    let _ = Seek(&mut id).deserialize(&mut serde_json::Deserializer::from_slice(prefix));
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cancellation_names_its_request() {
        let cancel = br#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"r","reason":"x"}}"#;
        assert_eq!(cancelled_request(cancel), Some("r".into()));
        let other =
            br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"requestId":1}}"#;
        assert_eq!(cancelled_request(other), None);
        assert_eq!(cancelled_request(b"{}"), None);
    }

    #[test]
    fn an_id_is_found_before_the_cut_and_only_there() {
        let full =
            br#"{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"xxxxxxxx"}]}}"#;
        for cut in 25..full.len() {
            assert_eq!(id_in_prefix(&full[..cut]), Some(7.into()), "cut at {cut}");
        }
        assert_eq!(id_in_prefix(&full[..20]), None);
        assert_eq!(
            id_in_prefix(br#"{"result":{"a":1},"id":"x""#),
            Some("x".into())
        );
        assert_eq!(id_in_prefix(br#"{"result":{"a":"#), None);
        assert_eq!(id_in_prefix(b"garbage"), None);
        assert_eq!(id_in_prefix(br#"{"id":1.5,"#), None);
    }

    use super::*;

    #[test]
    fn each_shape_is_told_apart() {
        let shape = |s: &str| shape_of(s.as_bytes());
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#),
            Shape::Request(1.into())
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Shape::Notification
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            Shape::Response(Some("a".into()))
        );
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#),
            Shape::Response(None)
        );
        assert_eq!(
            shape(r#" [{"jsonrpc":"2.0","id":2,"method":"ping"},{"jsonrpc":"2.0","method":"n"}]"#),
            Shape::Batch(vec![2.into()])
        );
        assert!(matches!(shape("not json"), Shape::Unreadable(_)));
        assert!(matches!(
            shape(r#"{"id":1.5,"method":"m"}"#),
            Shape::Unreadable(_)
        ));
        assert!(matches!(shape("[1"), Shape::Unreadable(_)));
        assert!(matches!(shape(""), Shape::Unreadable(_)));
    }

    /// A `tools/call` with a null or missing id is no notification to pass on: a lenient
    /// server runs it. Its method is read as JSON reads it (escapes included).
    #[test]
    fn a_tools_call_without_an_id_is_told_apart_from_a_notification() {
        let shape = |s: &str| shape_of(s.as_bytes());
        for call in [
            r#"{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools\/call","params":{"name":"t"}}"#,
            r#"{"jsonrpc":"2.0","method":"tools\u002fcall","params":{"name":"t"}}"#,
        ] {
            assert_eq!(shape(call), Shape::ToolCallWithoutId, "{call}");
        }
        assert_eq!(
            shape(r#"{"jsonrpc":"2.0","method":"tools/list"}"#),
            Shape::Notification
        );
    }
}
