//! JSON-RPC 2.0 envelopes as MCP uses them, parsed once from the body bytes.

use std::{borrow::Cow, fmt};

use serde::{
    Deserialize, Deserializer, Serialize,
    de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor},
};
use serde_json::{Map, Value};

use super::ClassifyError;
use super::jcs::{BorrowedKey, CanonicalSeed, Noticed};

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
#[non_exhaustive]
pub struct ToolCall {
    /// The JSON-RPC id (protocol correlation, not identity).
    pub id: RequestId,
    /// `params.name`: the tool.
    pub name: String,
    /// `params.arguments`: see [`arguments`](Self::arguments) and
    /// [`canonical_arguments`](Self::canonical_arguments).
    arguments: Box<Arguments>,
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
    /// `params.arguments` as a tree (an absent `arguments` reads as an empty object: the two
    /// mean the same call).
    ///
    /// The guard's own path never needs the tree (it fingerprints
    /// [`canonical_arguments`](Self::canonical_arguments)), so it is built from the body on
    /// first use, for an authorization hook, a status probe or fingerprint rules, and kept.
    pub fn arguments(&self) -> &Map<String, Value> {
        self.arguments.tree()
    }

    /// `params.arguments` in RFC 8785 (JCS) form, written while the body was parsed (keys and
    /// strings borrowed from it, no tree built): the bytes the intent fingerprint covers when
    /// the tool has no fingerprint rules.
    pub fn canonical_arguments(&self) -> &[u8] {
        &self.arguments.canonical
    }

    /// Whether the arguments may hold a number literal the parser could not keep (see
    /// [`has_inexact_number`](crate::tools::has_inexact_number)): the body is scanned only
    /// when the parse saw a double that may stand for one.
    pub fn has_inexact_number(&self) -> bool {
        self.arguments.maybe_inexact && super::json_has_inexact_number(&self.arguments.source)
    }

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

/// `params.arguments` of a `tools/call`: its canonical bytes, and the body it came from for
/// the tree form on demand.
#[derive(Clone)]
struct Arguments {
    canonical: Box<[u8]>,
    maybe_inexact: bool,
    /// The whole request body, and the message's place when the body is a batch.
    source: bytes::Bytes,
    index: Option<usize>,
    tree: std::sync::OnceLock<Map<String, Value>>,
}

impl Arguments {
    fn tree(&self) -> &Map<String, Value> {
        self.tree.get_or_init(|| {
            // The body parsed before, so this parse succeeds and reads the same numbers and
            // strings (a duplicate key was refused then).
            let Ok(mut body) = serde_json::from_slice::<Value>(&self.source) else {
                // Not reached (every member was parsed as a value then); never an empty tree,
                // though, which would make different calls alike under fingerprint rules: the
                // canonical form still tells them apart.
                return serde_json::from_slice(&self.canonical).unwrap_or_default();
            };
            let message = match self.index {
                Some(i) => body.get_mut(i),
                None => Some(&mut body),
            };
            match message.and_then(|m| m.pointer_mut("/params/arguments")) {
                Some(Value::Object(arguments)) => std::mem::take(arguments),
                _ => Map::new(),
            }
        })
    }
}

impl PartialEq for Arguments {
    fn eq(&self, other: &Self) -> bool {
        self.tree() == other.tree()
    }
}

impl fmt::Debug for Arguments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.canonical))
    }
}

/// Parses a POST body: one message, or a batch of messages. The body is parsed exactly once:
/// a `tools/call`'s arguments go straight into their canonical form, and duplicate object keys
/// are noted while parsing (an error inside a `tools/call`).
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

/// A body as parsed: one message, or a batch.
#[derive(Debug)]
pub(super) enum Parsed {
    Single(Box<Envelope>),
    Batch(Vec<Envelope>),
}

/// One top-level message as parsed: the members a message is told by, and the first
/// duplicate key found anywhere inside it.
#[derive(Debug, Default)]
pub(super) struct Envelope {
    /// What the message is when it is not an object.
    not_an_object: Option<&'static str>,
    jsonrpc: Option<Value>,
    id: Option<Value>,
    method: Option<Value>,
    params: Option<Params>,
    /// It has a `result` or an `error` member.
    answers: bool,
    duplicate: Option<String>,
}

#[derive(Debug)]
enum Params {
    Object(ParamsObject),
    Other,
}

#[derive(Debug, Default)]
struct ParamsObject {
    name: Option<Value>,
    arguments: Option<ParsedArguments>,
    meta: Option<Value>,
    task: Option<Value>,
    other: Map<String, Value>,
}

#[derive(Debug)]
struct ParsedArguments {
    canonical: Vec<u8>,
    noticed: Noticed,
}

impl Envelope {
    fn not_an_object(kind: &'static str) -> Self {
        Self {
            not_an_object: Some(kind),
            ..Self::default()
        }
    }
}

/// The message a parsed envelope is. `source` is the body it came from (`index`, its place in
/// a batch), kept by a `tools/call` for its arguments' tree form.
pub(super) fn message_from_envelope(
    envelope: Envelope,
    source: &bytes::Bytes,
    index: Option<usize>,
) -> Result<Message, ClassifyError> {
    if let Some(kind) = envelope.not_an_object {
        return Err(ClassifyError::NotAnObject(kind));
    }
    match envelope.jsonrpc {
        Some(Value::String(v)) if v == "2.0" => {}
        _ => {
            return Err(ClassifyError::InvalidEnvelope(
                "`jsonrpc` must be \"2.0\"".into(),
            ));
        }
    }
    let id = envelope.id.map(RequestId::from_value).transpose()?;
    let method = match envelope.method {
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
            if let Some(key) = envelope.duplicate {
                return Err(ClassifyError::DuplicateKey(key));
            }
            let Some(Params::Object(params)) = envelope.params else {
                return Err(ClassifyError::ToolCallWithoutName);
            };
            tool_call(id, params, source.clone(), index).map(Message::ToolCall)
        }
        (Some(method), Some(id)) => Ok(Message::Request { id, method }),
        // Found by fuzzing: as a notification it would pass the guard unguarded, and a lenient
        // server could still run it.
        (Some(method), None) if method == TOOLS_CALL => Err(ClassifyError::InvalidEnvelope(
            "a tools/call must be a request with an `id`, not a notification".into(),
        )),
        (Some(method), None) => Ok(Message::Notification { method }),
        (None, Some(id)) if envelope.answers => Ok(Message::Response { id }),
        (None, _) => Err(ClassifyError::InvalidEnvelope(
            "a message needs a `method`, or an `id` with a `result` or `error`".into(),
        )),
    }
}

fn tool_call(
    id: RequestId,
    params: ParamsObject,
    source: bytes::Bytes,
    index: Option<usize>,
) -> Result<ToolCall, ClassifyError> {
    let Some(Value::String(name)) = params.name else {
        return Err(ClassifyError::ToolCallWithoutName);
    };
    let (canonical, maybe_inexact) = match params.arguments {
        None => (b"{}".to_vec(), false),
        Some(ParsedArguments { canonical, noticed }) => match noticed.kind {
            Some("null") => (b"{}".to_vec(), false),
            Some("an object") => (canonical, noticed.maybe_inexact),
            other => return Err(ClassifyError::InvalidArguments(other.unwrap_or("nothing"))),
        },
    };
    let meta = match params.meta {
        Some(Value::Object(meta)) => Some(meta),
        _ => None,
    };
    Ok(ToolCall {
        id,
        name,
        arguments: Box::new(Arguments {
            canonical: canonical.into_boxed_slice(),
            maybe_inexact,
            source,
            index,
            tree: std::sync::OnceLock::new(),
        }),
        meta,
        task: params.task,
        other_params: params.other,
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

/// The visitor methods for a JSON value that is not an object or an array: each binds `$kind`
/// to what the value is (as [`json_kind`] names it) and returns `$value`.
macro_rules! visit_scalars {
    ($kind:pat => $value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            let $kind = "a boolean";
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            let $kind = "a number";
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            let $kind = "a number";
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            let $kind = "a number";
            Ok($value)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            let $kind = "a string";
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            let $kind = "null";
            Ok($value)
        }
    };
}

/// Parses the top level: an object or an array of them.
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
        let mut messages = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(message) = seq.next_element_seed(MessageSeed)? {
            messages.push(message);
        }
        Ok(Parsed::Batch(messages))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Parsed, A::Error> {
        MessageSeed
            .visit_map(map)
            .map(|envelope| Parsed::Single(Box::new(envelope)))
    }

    // Scalars at the top level parse fine and are rejected as "not an object" afterwards.
    visit_scalars!(kind => Parsed::Single(Box::new(Envelope::not_an_object(kind))));
}

/// One message: its envelope members read, `params` read member by member.
struct MessageSeed;

impl<'de> DeserializeSeed<'de> for MessageSeed {
    type Value = Envelope;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Envelope, D::Error> {
        deserializer.deserialize_any(self)
    }
}

/// Notes `name` in `seen`, and in `duplicate` when it was there already; hands it back.
fn note_key<'de>(
    seen: &mut Vec<Cow<'de, str>>,
    name: Cow<'de, str>,
    duplicate: &mut Option<String>,
) -> Cow<'de, str> {
    if seen.contains(&name) {
        duplicate.get_or_insert_with(|| name.clone().into_owned());
    } else {
        seen.push(name.clone());
    }
    name
}

impl<'de> Visitor<'de> for MessageSeed {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Envelope, A::Error> {
        let mut envelope = Envelope::default();
        let mut seen = Vec::with_capacity(4);
        while let Some(name) = map.next_key_seed(BorrowedKey)? {
            let name = note_key(&mut seen, name, &mut envelope.duplicate);
            let duplicate = &mut envelope.duplicate;
            match &*name {
                "jsonrpc" => {
                    envelope.jsonrpc = Some(map.next_value_seed(TrackDuplicates(duplicate))?)
                }
                "id" => envelope.id = Some(map.next_value_seed(TrackDuplicates(duplicate))?),
                "method" => {
                    envelope.method = Some(map.next_value_seed(TrackDuplicates(duplicate))?)
                }
                "params" => envelope.params = Some(map.next_value_seed(ParamsSeed(duplicate))?),
                // Parsed as a value, not skipped: `IgnoredAny` checks neither the recursion
                // limit nor a number's range nor lone surrogates, and a body that parses here
                // must parse again when a call's arguments are read as a tree.
                "result" | "error" => {
                    drop(map.next_value_seed(TrackDuplicates(duplicate))?);
                    envelope.answers = true;
                }
                _ => drop(map.next_value_seed(TrackDuplicates(duplicate))?),
            }
        }
        Ok(envelope)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Envelope, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Envelope::not_an_object("an array"))
    }
    visit_scalars!(kind => Envelope::not_an_object(kind));
}

/// A message's `params`: an object read member by member, `arguments` straight into its
/// canonical form; anything else is only parsed.
struct ParamsSeed<'a>(&'a mut Option<String>);

impl<'de> DeserializeSeed<'de> for ParamsSeed<'_> {
    type Value = Params;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Params, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ParamsSeed<'_> {
    type Value = Params;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the params of a JSON-RPC message")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Params, A::Error> {
        let mut params = ParamsObject::default();
        let mut seen = Vec::with_capacity(4);
        while let Some(name) = map.next_key_seed(BorrowedKey)? {
            let name = note_key(&mut seen, name, self.0);
            let duplicate = &mut *self.0;
            match &*name {
                "name" => params.name = Some(map.next_value_seed(TrackDuplicates(duplicate))?),
                "arguments" => {
                    let mut canonical = Vec::with_capacity(256);
                    let mut noticed = Noticed::default();
                    map.next_value_seed(CanonicalSeed {
                        out: &mut canonical,
                        noticed: &mut noticed,
                    })?;
                    if let Some(key) = noticed.duplicate_key.take() {
                        duplicate.get_or_insert(key);
                    }
                    params.arguments = Some(ParsedArguments { canonical, noticed });
                }
                "_meta" => params.meta = Some(map.next_value_seed(TrackDuplicates(duplicate))?),
                "task" => params.task = Some(map.next_value_seed(TrackDuplicates(duplicate))?),
                _ => {
                    let value = map.next_value_seed(TrackDuplicates(duplicate))?;
                    params.other.insert(name.into_owned(), value);
                }
            }
        }
        Ok(Params::Object(params))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Params, A::Error> {
        // Parsed as values, not skipped (see `MessageSeed`'s `result`).
        while seq
            .next_element_seed(TrackDuplicates(&mut *self.0))?
            .is_some()
        {}
        Ok(Params::Other)
    }
    visit_scalars!(_ => Params::Other);
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
