//! W3C trace context through the proxy and the stdio wrapper: the span of a request takes its
//! parent from the client (over HTTP the `traceparent` and `tracestate` headers, or else the
//! same keys in the request's `params._meta`; over stdio `_meta`), and over HTTP the request the
//! guard sends upstream carries the guard's span as its parent, so the guard sits in the
//! agent's trace between the agent and the server (over stdio the message, its `_meta`
//! included, passes on as it came).
//!
//! Without a trace exporter the spans have no trace context: nothing is taken or replaced, and
//! the client's headers pass on as they came.

use std::collections::HashMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use serde::Deserialize;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The trace context keys of the W3C specification (the header names, and the `_meta` keys the
/// MCP specification reserves for them).
const KEYS: [&str; 2] = ["traceparent", "tracestate"];

/// The span of one client request, its parent the client's trace context when it sent one.
pub(crate) fn request_span(headers: &HeaderMap, body: &[u8]) -> tracing::Span {
    if !crate::telemetry::traces_exported() {
        return tracing::info_span!("mcp_request");
    }
    let message = Message::of(body);
    let span = tracing::info_span!(
        "mcp_request",
        rpc.method = message.method.as_deref().unwrap_or(""),
    );
    let propagator = TraceContextPropagator::new();
    let from_headers = propagator.extract(&Headers(headers));
    let parent = if from_headers.span().span_context().is_valid() {
        from_headers
    } else {
        propagator.extract(&message.meta)
    };
    if parent.span().span_context().is_valid() {
        // Fails only without a trace exporter, when there is no trace to join.
        let _ = span.set_parent(parent);
    }
    span
}

/// Names the current span (the guard's) as the parent of the request going upstream, in place
/// of what the client sent; nothing when spans are not exported.
pub(crate) fn inject(headers: &mut HeaderMap) {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return;
    }
    TraceContextPropagator::new().inject_context(&context, &mut HeadersMut(headers));
}

/// What the proxy reads of a JSON-RPC request for its trace: the method, and the trace
/// context in `params._meta`. Anything else (a batch, not JSON) has neither.
#[derive(Default, Deserialize)]
struct Message {
    method: Option<String>,
    #[serde(default)]
    params: Params,
    #[serde(skip)]
    meta: Meta,
}

#[derive(Default, Deserialize)]
struct Params {
    #[serde(default, rename = "_meta")]
    meta: HashMap<String, serde_json::Value>,
}

impl Message {
    fn of(body: &[u8]) -> Self {
        let mut message: Self = serde_json::from_slice(body).unwrap_or_default();
        message.meta = Meta(
            KEYS.iter()
                .filter_map(|key| {
                    let value = message.params.meta.get(*key)?.as_str()?;
                    Some(((*key).to_owned(), value.to_owned()))
                })
                .collect(),
        );
        message
    }
}

/// The trace context keys of `params._meta`.
#[derive(Default)]
struct Meta(HashMap<String, String>);

impl Extractor for Meta {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meta_trace_context_of_a_request_is_read_and_nothing_else_is_kept() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"traceparent":"no"},"_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","other":"x"}}}"#;
        let message = Message::of(body);
        assert_eq!(message.method.as_deref(), Some("tools/call"));
        assert_eq!(
            message.meta.get("traceparent"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(message.meta.keys(), vec!["traceparent"]);
        assert!(Message::of(b"[1,2]").meta.0.is_empty());
        assert!(Message::of(b"not json").method.is_none());
    }
}
