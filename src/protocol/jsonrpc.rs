//! JSON-RPC 2.0 envelopes as MCP uses them, parsed once from the body bytes.

use std::fmt;

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{DeserializeSeed, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Value};

use super::ClassifyError;

/// A JSON-RPC request id: a string or an integer.
///
/// It is protocol correlation only: clients reuse ids across processes and renumber them on a
/// re-issue, so an id never identifies an execution.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(untagged)]
pub enum RequestId {
    /// An integer id, kept exactly as sent.
    Number(serde_json::Number),
    /// A string id.
    String(String),
}

impl RequestId {
    fn from_value(value: Value) -> Result<Self, ClassifyError> {
        match value {
            Value::String(s) => Ok(Self::String(s)),
            Value::Number(n) if n.is_i64() || n.is_u64() => Ok(Self::Number(n)),
            other => Err(ClassifyError::InvalidEnvelope(format!(
                "the id must be a string or an integer, not {}",
                json_kind(&other)
            ))),
        }
    }
}

impl From<i64> for RequestId {
    fn from(id: i64) -> Self {
        Self::Number(id.into())
    }
}

impl From<&str> for RequestId {
    fn from(id: &str) -> Self {
        Self::String(id.to_owned())
    }
}

impl<'de> Deserialize<'de> for RequestId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::from_value(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Number(n) => write!(f, "{n}"),
            Self::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// One JSON-RPC message of a POST body.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A `tools/call` request: the only message the guard treats as an action.
    ToolCall(ToolCall),
    /// Any other request (`initialize`, `tools/list`, `tasks/get`, …).
    Request {
        /// The JSON-RPC id.
        id: RequestId,
        /// The method name.
        method: String,
    },
    /// A notification (no id).
    Notification {
        /// The method name.
        method: String,
    },
    /// A response the client sends to a server request (sampling, elicitation, …).
    Response {
        /// The id of the server request it answers.
        id: RequestId,
    },
}

impl Message {
    /// The method name, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        match self {
            Self::ToolCall(_) => Some(TOOLS_CALL),
            Self::Request { method, .. } | Self::Notification { method } => Some(method),
            Self::Response { .. } => None,
        }
    }

    /// The JSON-RPC id, for requests and responses.
    pub fn id(&self) -> Option<&RequestId> {
        match self {
            Self::ToolCall(call) => Some(&call.id),
            Self::Request { id, .. } | Self::Response { id } => Some(id),
            Self::Notification { .. } => None,
        }
    }
}

/// The method name of a tool call.
pub const TOOLS_CALL: &str = "tools/call";

/// A parsed `tools/call` request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The JSON-RPC id (protocol correlation, not identity).
    pub id: RequestId,
    /// `params.name`: the tool.
    pub name: String,
    /// `params.arguments` (an absent `arguments` reads as an empty object: the two mean the
    /// same call).
    pub arguments: Map<String, Value>,
    /// `params._meta`, if present (progress tokens and other noise; never fingerprinted).
    pub meta: Option<Map<String, Value>>,
    /// `params.task`, if present: the caller asks for a task-augmented call.
    pub task: Option<Value>,
    /// Every other member of `params` (for example MRTR `inputResponses` / `requestState`).
    pub other_params: Map<String, Value>,
}

/// The members of a `tools/call`'s `params` that make it the continuation of an earlier call
/// (MCP multi-round-trip requests): part of the intent. No other member of `params` is.
pub const CONTINUATION_PARAMS: [&str; 2] = ["inputResponses", "requestState"];

impl ToolCall {
    /// The call's continuation members ([`CONTINUATION_PARAMS`]) as one object, `None` when it
    /// has none. A continuation is a new intent, not a re-issue of the call it continues; any
    /// other extra member of `params` leaves the intent alone, on the client and server side
    /// alike.
    pub fn continuation(&self) -> Option<Value> {
        let continuation: Map<String, Value> = CONTINUATION_PARAMS
            .into_iter()
            .filter_map(|k| self.other_params.get(k).map(|v| (k.to_owned(), v.clone())))
            .collect();
        (!continuation.is_empty()).then_some(Value::Object(continuation))
    }
}

/// Parses a POST body: one message, or a batch of messages. The body is parsed exactly once;
/// duplicate object keys are noted while parsing and are an error inside a `tools/call`.
pub(super) fn parse_body(text: &str) -> Result<Parsed, ClassifyError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = TopLevel
        .deserialize(&mut de)
        .and_then(|parsed| de.end().map(|()| parsed))
        .map_err(|e| ClassifyError::InvalidJson(e.to_string()))?;
    Ok(parsed)
}

/// Parses one JSON value and returns the first object key seen twice anywhere in it.
pub(crate) fn parse_tracking_duplicates(text: &str) -> Result<(Value, Option<String>), String> {
    let mut duplicate = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let value = TrackDuplicates(&mut duplicate)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| e.to_string())?;
    Ok((value, duplicate))
}

/// A body as parsed: each top-level message with the first duplicate key found inside it.
#[derive(Debug)]
pub(super) enum Parsed {
    Single(Value, Option<String>),
    Batch(Vec<(Value, Option<String>)>),
}

pub(super) fn message_from_value(
    value: Value,
    duplicate_key: Option<String>,
) -> Result<Message, ClassifyError> {
    let Value::Object(mut object) = value else {
        return Err(ClassifyError::NotAnObject(json_kind(&value)));
    };
    match object.remove("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        _ => {
            return Err(ClassifyError::InvalidEnvelope(
                "`jsonrpc` must be \"2.0\"".into(),
            ));
        }
    }
    let id = object.remove("id").map(RequestId::from_value).transpose()?;
    let method = match object.remove("method") {
        None => None,
        Some(Value::String(method)) => Some(method),
        Some(other) => {
            return Err(ClassifyError::InvalidEnvelope(format!(
                "`method` must be a string, not {}",
                json_kind(&other)
            )));
        }
    };
    match (method, id) {
        (Some(method), Some(id)) if method == TOOLS_CALL => {
            if let Some(key) = duplicate_key {
                return Err(ClassifyError::DuplicateKey(key));
            }
            tool_call(id, object.remove("params")).map(Message::ToolCall)
        }
        (Some(method), Some(id)) => Ok(Message::Request { id, method }),
        // Found by fuzzing: as a notification it would pass the guard unguarded, and a lenient
        // server could still run it.
        (Some(method), None) if method == TOOLS_CALL => Err(ClassifyError::InvalidEnvelope(
            "a tools/call must be a request with an `id`, not a notification".into(),
        )),
        (Some(method), None) => Ok(Message::Notification { method }),
        (None, Some(id)) if object.contains_key("result") || object.contains_key("error") => {
            Ok(Message::Response { id })
        }
        (None, _) => Err(ClassifyError::InvalidEnvelope(
            "a message needs a `method`, or an `id` with a `result` or `error`".into(),
        )),
    }
}

fn tool_call(id: RequestId, params: Option<Value>) -> Result<ToolCall, ClassifyError> {
    let Some(Value::Object(mut params)) = params else {
        return Err(ClassifyError::ToolCallWithoutName);
    };
    let Some(Value::String(name)) = params.remove("name") else {
        return Err(ClassifyError::ToolCallWithoutName);
    };
    let arguments = match params.remove("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(arguments)) => arguments,
        Some(other) => return Err(ClassifyError::InvalidArguments(json_kind(&other))),
    };
    let meta = match params.remove("_meta") {
        Some(Value::Object(meta)) => Some(meta),
        _ => None,
    };
    let task = params.remove("task");
    Ok(ToolCall {
        id,
        name,
        arguments,
        meta,
        task,
        other_params: params,
    })
}

pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses the top level: an object or an array of them, each with its duplicate-key note.
struct TopLevel;

impl<'de> DeserializeSeed<'de> for TopLevel {
    type Value = Parsed;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Parsed, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel {
    type Value = Parsed;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message or a batch of them")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Parsed, A::Error> {
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            let mut duplicate = None;
            match seq.next_element_seed(TrackDuplicates(&mut duplicate))? {
                Some(value) => messages.push((value, duplicate)),
                None => return Ok(Parsed::Batch(messages)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Parsed, A::Error> {
        let mut duplicate = None;
        let value = TrackDuplicates(&mut duplicate).visit_map(map)?;
        Ok(Parsed::Single(value, duplicate))
    }

    // Scalars at the top level parse fine and are rejected as "not an object" afterwards.
    fn visit_bool<E>(self, v: bool) -> Result<Parsed, E> {
        Ok(Parsed::Single(Value::Bool(v), None))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Parsed, E> {
        Ok(Parsed::Single(v.into(), None))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Parsed, E> {
        Ok(Parsed::Single(v.into(), None))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Parsed, E> {
        Ok(Parsed::Single(v.into(), None))
    }
    fn visit_str<E>(self, v: &str) -> Result<Parsed, E> {
        Ok(Parsed::Single(v.into(), None))
    }
    fn visit_unit<E>(self) -> Result<Parsed, E> {
        Ok(Parsed::Single(Value::Null, None))
    }
}

/// Builds a [`Value`] like serde_json does, and notes the first object key seen twice
/// (serde_json's own `Value` silently keeps the last one, which would let two readers of one
/// body see two different calls).
struct TrackDuplicates<'a>(&'a mut Option<String>);

impl<'de> DeserializeSeed<'de> for TrackDuplicates<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TrackDuplicates<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(item) = seq.next_element_seed(TrackDuplicates(&mut *self.0))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(TrackDuplicates(&mut *self.0))?;
            match object.entry(key) {
                serde_json::map::Entry::Vacant(vacant) => {
                    vacant.insert(value);
                }
                serde_json::map::Entry::Occupied(mut occupied) => {
                    self.0.get_or_insert_with(|| occupied.key().clone());
                    occupied.insert(value);
                }
            }
        }
        Ok(Value::Object(object))
    }
}
