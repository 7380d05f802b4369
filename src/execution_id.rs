//! Execution IDs and the `Idempotency-Key` header that carries them.
//!
//! An [`ExecutionId`] names one accepted attempt to perform a tool action: `act_` followed by a
//! ULID. It is created by the guard, never by the caller's JSON-RPC layer, and it is stable for
//! the life of that execution: a recovery of the same execution re-sends it, a new execution gets
//! a new one. It is not the intent fingerprint (which finds a related execution) and not the
//! JSON-RPC id (which is renumbered on every re-issue).

use std::{
    fmt,
    str::FromStr,
    sync::{Mutex, PoisonError},
    time::SystemTime,
};

use http::HeaderValue;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use ulid::{Generator, Ulid};

/// The name of the header that carries an execution's key on a dispatch.
pub const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// The `params._meta` key that carries an execution's key where there are no headers (stdio,
/// any transport that is not HTTP), when a contract or the guard asks for it
/// ([`ToolContract::execution_id_in_meta`](crate::contract::ToolContract::execution_id_in_meta),
/// [`GuardLayer::execution_id_in_meta`](crate::guard::GuardLayer::execution_id_in_meta)).
///
/// Named by the `_meta` key rules of the MCP specification: a prefix of dot-separated labels
/// and a slash, outside the reserved `io.modelcontextprotocol/` and `dev.mcp/`. Its value is
/// the key as a string (`act_01J…`). `_meta` never enters a fingerprint, so the key does not
/// either; the server half reads it when a `tools/call` carries no `Idempotency-Key` header.
pub const EXECUTION_ID_META_KEY: &str = "io.github.mcp-replay-guard/execution-id";

const PREFIX: &str = "act_";

/// The identity of one execution of a tool action: `act_` + a ULID.
///
/// IDs made in one process are strictly increasing, also within one millisecond (a monotonic
/// ULID generator), so they sort in creation order.
///
/// ```
/// use mcp_replay_guard::ExecutionId;
///
/// let id = ExecutionId::new();
/// assert!(id.to_string().starts_with("act_"));
/// let parsed: ExecutionId = id.to_string().parse()?;
/// assert_eq!(parsed, id);
/// # Ok::<(), mcp_replay_guard::InvalidExecutionId>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutionId(Ulid);

impl ExecutionId {
    /// A new execution ID, greater than every ID made before it in this process.
    pub fn new() -> Self {
        #[cfg(feature = "simulation")]
        if let Some(ulid) = crate::simulation::next_id() {
            return Self(ulid);
        }
        static GENERATOR: Mutex<Generator> = Mutex::new(Generator::new());
        let mut generator = GENERATOR.lock().unwrap_or_else(PoisonError::into_inner);
        let ulid = match generator.generate() {
            Ok(ulid) => ulid,
            // 2^80 IDs within one millisecond: take the next millisecond's space instead of
            // failing. Ordering is preserved because the timestamp part grows.
            Err(overflow) => overflow.commit_overflow_increment(),
        };
        Self(ulid)
    }

    /// The ULID inside the ID.
    pub fn ulid(&self) -> Ulid {
        self.0
    }

    /// When the ID was made, to the millisecond.
    pub fn created_at(&self) -> SystemTime {
        self.0.datetime()
    }

    /// The ID as an `Idempotency-Key` header value in the chosen spelling.
    pub fn to_idempotency_key(&self, format: IdempotencyKeyFormat) -> HeaderValue {
        IdempotencyKey::from(*self).to_header_value(format)
    }
}

impl Default for ExecutionId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0; ulid::ULID_LEN];
        write!(f, "{PREFIX}{}", self.0.array_to_str(&mut buf))
    }
}

impl fmt::Debug for ExecutionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExecutionId({self})")
    }
}

/// The text is not `act_` followed by a valid ULID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid execution ID {value:?}: expected `act_` followed by a 26-character ULID")]
pub struct InvalidExecutionId {
    value: String,
}

impl FromStr for ExecutionId {
    type Err = InvalidExecutionId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidExecutionId {
            // Bounded so that a hostile header cannot blow up an error message.
            value: s.chars().take(64).collect(),
        };
        let ulid = s.strip_prefix(PREFIX).ok_or_else(invalid)?;
        Ulid::from_string(ulid).map(Self).map_err(|_| invalid())
    }
}

crate::serde_display_fromstr!(ExecutionId);

impl From<ExecutionId> for HeaderValue {
    fn from(id: ExecutionId) -> Self {
        id.to_idempotency_key(IdempotencyKeyFormat::Raw)
    }
}

/// How an `Idempotency-Key` header value is spelled on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum IdempotencyKeyFormat {
    /// `Idempotency-Key: act_01J…`, what most APIs (Stripe-style) expect.
    #[default]
    Raw,
    /// `Idempotency-Key: "act_01J…"`, the structured-field string of the IETF httpapi draft.
    StructuredField,
}

/// An `Idempotency-Key` value: either an execution ID the guard made or a key the caller set.
///
/// Both spellings are read: a raw token (`act_01J…`) and the draft's quoted structured-field
/// string (`"act_01J…"`). Two spellings of the same key compare equal.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Longest key accepted. The draft sets no limit; this keeps a hostile header out of memory
    /// and out of the ledger.
    pub const MAX_LEN: usize = 255;

    /// Wraps a key value (unquoted). It must be 1 to [`MAX_LEN`](Self::MAX_LEN) visible ASCII
    /// characters (a structured-field string cannot carry anything else).
    pub fn new(value: impl Into<String>) -> Result<Self, InvalidIdempotencyKey> {
        let value = value.into();
        if value.is_empty() {
            return Err(InvalidIdempotencyKey::Empty);
        }
        if value.len() > Self::MAX_LEN {
            return Err(InvalidIdempotencyKey::TooLong { len: value.len() });
        }
        if !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(InvalidIdempotencyKey::NotVisibleAscii);
        }
        Ok(Self(value))
    }

    /// Reads a header value in either spelling.
    pub fn from_header(value: &HeaderValue) -> Result<Self, InvalidIdempotencyKey> {
        let bytes = value.as_bytes();
        if bytes.first() == Some(&b'"') {
            let item: sfv::Item = sfv::Parser::new(bytes)
                .parse()
                .map_err(|_| InvalidIdempotencyKey::MalformedString)?;
            let sfv::BareItem::String(s) = item.bare_item else {
                return Err(InvalidIdempotencyKey::MalformedString);
            };
            return Self::new(s.as_str());
        }
        let text = value
            .to_str()
            .map_err(|_| InvalidIdempotencyKey::NotVisibleAscii)?;
        Self::new(text.trim())
    }

    /// The key without any quoting.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The execution ID inside the key, when the key is one.
    pub fn execution_id(&self) -> Option<ExecutionId> {
        self.0.parse().ok()
    }

    /// The key as a header value in the chosen spelling.
    pub fn to_header_value(&self, format: IdempotencyKeyFormat) -> HeaderValue {
        let text = match format {
            IdempotencyKeyFormat::Raw => self.0.clone(),
            IdempotencyKeyFormat::StructuredField => {
                // `new` admits only what a structured-field string can carry.
                let s =
                    sfv::StringRef::from_str(&self.0).expect("validated in IdempotencyKey::new");
                sfv::ItemSerializer::new().bare_item(s).finish()
            }
        };
        HeaderValue::try_from(text).expect("visible ASCII is a valid header value")
    }
}

impl From<ExecutionId> for IdempotencyKey {
    fn from(id: ExecutionId) -> Self {
        Self(id.to_string())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey({:?})", self.0)
    }
}

impl Serialize for IdempotencyKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::new(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// An `Idempotency-Key` value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidIdempotencyKey {
    /// The key is empty.
    #[error("the Idempotency-Key is empty")]
    Empty,
    /// The key is longer than [`IdempotencyKey::MAX_LEN`].
    #[error("the Idempotency-Key is {len} bytes long; at most 255 are accepted")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The key has a byte outside visible ASCII and space.
    #[error("the Idempotency-Key must be visible ASCII")]
    NotVisibleAscii,
    /// The value starts with `"` but is not a valid structured-field string.
    #[error("the Idempotency-Key starts with a quote but is not a valid structured-field string")]
    MalformedString,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_prefix_and_roundtrip_through_text_serde_and_headers() {
        let id = ExecutionId::new();
        let text = id.to_string();
        assert_eq!(text.len(), 4 + 26);
        assert!(text.starts_with("act_"));
        assert_eq!(text.parse::<ExecutionId>().unwrap(), id);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        assert_eq!(serde_json::from_str::<ExecutionId>(&json).unwrap(), id);
        assert_eq!(HeaderValue::from(id), text.as_str());
    }

    #[test]
    fn ids_are_strictly_increasing_within_a_millisecond() {
        let ids: Vec<ExecutionId> = (0..10_000).map(|_| ExecutionId::new()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.windows(2).all(|w| w[0].to_string() < w[1].to_string()));
    }

    #[test]
    fn malformed_ids_are_typed_errors() {
        for bad in [
            "",
            "act_",
            "01J4K8J7DX7V0000000000000",
            "act_not-a-ulid",
            "act_01J4K8J7DX7V00000000000000000",
        ] {
            assert!(bad.parse::<ExecutionId>().is_err(), "{bad:?} parsed");
        }
        let err = serde_json::from_str::<ExecutionId>("\"nope\"").unwrap_err();
        assert!(err.to_string().contains("act_"), "{err}");
    }

    #[test]
    fn idempotency_key_is_raw_by_default_and_quoted_on_request() {
        let id: ExecutionId = "act_01J4K8J7DX7V3Y8Z9A0B1C2D3E".parse().unwrap();
        assert_eq!(HeaderValue::from(id), "act_01J4K8J7DX7V3Y8Z9A0B1C2D3E");
        assert_eq!(
            id.to_idempotency_key(IdempotencyKeyFormat::StructuredField),
            "\"act_01J4K8J7DX7V3Y8Z9A0B1C2D3E\""
        );
    }

    #[test]
    fn both_key_spellings_read_as_the_same_key() {
        let raw = IdempotencyKey::from_header(&HeaderValue::from_static(
            "act_01J4K8J7DX7V3Y8Z9A0B1C2D3E",
        ))
        .unwrap();
        let quoted = IdempotencyKey::from_header(&HeaderValue::from_static(
            "\"act_01J4K8J7DX7V3Y8Z9A0B1C2D3E\"",
        ))
        .unwrap();
        assert_eq!(raw, quoted);
        assert_eq!(
            raw.execution_id().unwrap().to_string(),
            "act_01J4K8J7DX7V3Y8Z9A0B1C2D3E"
        );
        let foreign = IdempotencyKey::from_header(&HeaderValue::from_static(
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
        ))
        .unwrap();
        assert_eq!(foreign.execution_id(), None);
        let escaped = IdempotencyKey::from_header(&HeaderValue::from_static(r#""a\"b""#)).unwrap();
        assert_eq!(escaped.as_str(), "a\"b");
        assert_eq!(
            escaped.to_header_value(IdempotencyKeyFormat::StructuredField),
            r#""a\"b""#
        );
    }

    #[test]
    fn unusable_keys_are_typed_errors() {
        assert_eq!(
            IdempotencyKey::from_header(&HeaderValue::from_static("")),
            Err(InvalidIdempotencyKey::Empty)
        );
        assert_eq!(
            IdempotencyKey::from_header(&HeaderValue::from_static("\"unterminated")),
            Err(InvalidIdempotencyKey::MalformedString)
        );
        assert!(matches!(
            IdempotencyKey::new("x".repeat(256)),
            Err(InvalidIdempotencyKey::TooLong { len: 256 })
        ));
        assert_eq!(
            IdempotencyKey::new("é"),
            Err(InvalidIdempotencyKey::NotVisibleAscii)
        );
        let opaque = HeaderValue::from_bytes(b"\xff\xfe").unwrap();
        assert_eq!(
            IdempotencyKey::from_header(&opaque),
            Err(InvalidIdempotencyKey::NotVisibleAscii)
        );
    }
}
