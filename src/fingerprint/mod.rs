//! The intent fingerprint: which earlier execution, if any, a request belongs to.
//!
//! A fingerprint is `hmac-sha256:<64 hex>` over the **canonical action record**: actor, tool,
//! channel, target, credential reference, method, arguments and intent scope, serialised with
//! RFC 8785 (JCS) so that key order, whitespace and number spelling never change it.
//!
//! ```
//! use mcp_replay_guard::fingerprint::{ActionRecord, Channel, FingerprintKey, FingerprintRules};
//! use serde_json::json;
//!
//! let key = FingerprintKey::from_bytes(&[7; 32])?;
//! let record = ActionRecord::new(
//!     "signed-process:com.example.agent".into(),
//!     "run:5f8097".into(),
//!     "deploy_release",
//!     Channel::mcp("deploy-api.internal.example/mcp".into()),
//! )
//! .credential_ref("deploy-service".into())
//! .arguments(json!({"service": "catalog", "version": "2026.07.22", "region": "us-east-1"}));
//! let fingerprint = key.fingerprint(record, &FingerprintRules::default());
//! assert!(fingerprint.to_string().starts_with("hmac-sha256:"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What never enters the record
//!
//! The JSON-RPC id, `_meta`, progress tokens and HTTP headers (so no `Authorization` value and
//! no bearer token) are not fields of [`ActionRecord`]. An argument path marked secret in the
//! tool's [`FingerprintRules`] is replaced by a keyed HMAC of its value under a key derived from
//! the fingerprint key, so equal secrets still match and the secret itself never appears.
//!
//! # Numbers
//!
//! RFC 8785 prints every number as the IEEE-754 double it is, and a double cannot hold every
//! integer past 2^53. Following the RFC (§3.2.2.3, Appendix D), an integer of magnitude above
//! 2^53 enters the record as a JSON string of its exact decimal digits, so the order ids
//! `9007199254740993` and `9007199254740992` are two intents (and so are any two 64-bit
//! integers); an integral double in that range names the same integer and is written alike.
//! The JSON parser rounds an integer literal beyond 64 bits before anyone sees it, so the guard
//! and the server half refuse such a `tools/call` ("send it as a string"), and nothing is sent.
//!
//! # A fingerprint is not an idempotency key
//!
//! It finds a possibly related execution; it is never sent to a server. The key sent is the
//! [`ExecutionId`](crate::ExecutionId).

mod path;
mod rules;

use std::{borrow::Cow, fmt, str::FromStr};

use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

pub use path::{ArgPath, InvalidArgPath};
pub use rules::{FingerprintRules, Normalizer};

use crate::{
    context::{Actor, CredentialRef, IntentScope, Target},
    protocol::{ToolCall, jcs},
};

type HmacSha256 = Hmac<Sha256>;

/// Label of the key derivation for secret argument values (HMAC(fingerprint key, label)).
const SECRET_KEY_LABEL: &[u8] = b"mcp-replay-guard/v1/secret-argument";

/// The secret key of the intent fingerprint HMAC.
///
/// Keep it stable for as long as fingerprints must match (a new key makes every earlier
/// execution unlinkable) and out of the ledger. `Debug` never prints it.
#[derive(Clone)]
pub struct FingerprintKey {
    bytes: Box<[u8]>,
    record_mac: HmacSha256,
    secret_mac: HmacSha256,
}

/// Key material that cannot be a fingerprint key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidFingerprintKey {
    /// Too short or too long.
    #[error("a fingerprint key must be 32 to 128 bytes long, not {0}")]
    Length(usize),
    /// The operating system's random source failed.
    #[error("could not draw a random fingerprint key: {0}")]
    Random(String),
    /// Text that is not hex digits (the error never repeats it).
    #[error("a fingerprint key in text is hex digits (64 for a key of 32 bytes), and this is not")]
    NotHex,
}

impl FingerprintKey {
    /// Length of a key made by [`generate`](Self::generate).
    pub const GENERATED_LEN: usize = 32;

    /// A key from 32 to 128 bytes of secret material.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidFingerprintKey> {
        if !(32..=128).contains(&bytes.len()) {
            return Err(InvalidFingerprintKey::Length(bytes.len()));
        }
        let record_mac = HmacSha256::new_from_slice(bytes).expect("HMAC takes keys of any length");
        let mut derive = record_mac.clone();
        derive.update(SECRET_KEY_LABEL);
        let secret_mac = HmacSha256::new_from_slice(&derive.finalize().into_bytes())
            .expect("HMAC takes keys of any length");
        Ok(Self {
            bytes: bytes.into(),
            record_mac,
            secret_mac,
        })
    }

    /// A key from its hex form, the form a key file holds: 64 hex digits for a key of 32
    /// bytes (up to 256 for 128), surrounding whitespace ignored. The file ledger keeps its
    /// key beside it in this form ([`FileLedger::fingerprint_key`](crate::ledger::FileLedger::fingerprint_key)),
    /// and reads it back with this function; a key shared by the replicas of a PostgreSQL
    /// ledger is given the same way. No error repeats the text.
    ///
    /// ```
    /// use mcp_replay_guard::fingerprint::FingerprintKey;
    ///
    /// let key = FingerprintKey::from_hex(&format!("{}\n", "07".repeat(32)))?;
    /// assert_eq!(key.expose_bytes(), [7; 32]);
    /// assert!(FingerprintKey::from_hex("s3cret").is_err());
    /// # Ok::<(), mcp_replay_guard::fingerprint::InvalidFingerprintKey>(())
    /// ```
    pub fn from_hex(text: &str) -> Result<Self, InvalidFingerprintKey> {
        let bytes = hex::decode(text.trim()).map_err(|_| InvalidFingerprintKey::NotHex)?;
        Self::from_bytes(&bytes)
    }

    /// A new random key from the operating system.
    pub fn generate() -> Result<Self, InvalidFingerprintKey> {
        let mut bytes = [0; Self::GENERATED_LEN];
        getrandom::fill(&mut bytes).map_err(|e| InvalidFingerprintKey::Random(e.to_string()))?;
        Self::from_bytes(&bytes)
    }

    /// The key material, to persist it (a durable ledger keeps it beside its file).
    pub fn expose_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Applies the rules and canonicalises the record (RFC 8785): the exact bytes the
    /// fingerprint is computed over.
    pub fn canonicalize(
        &self,
        record: ActionRecord<'_>,
        rules: &FingerprintRules,
    ) -> CanonicalRecord {
        let ActionRecord {
            actor,
            tool,
            channel,
            credential_ref,
            mut arguments,
            intent_scope,
            continuation,
        } = record;
        // A call's canonical arguments are used as they are unless a rule has to change them;
        // borrowed arguments are copied only then.
        if !rules.is_empty() {
            if let Arguments::Call(call) = arguments {
                arguments = Arguments::Tree(Cow::Borrowed(call.arguments()));
            }
            if let Arguments::Tree(tree) = &mut arguments {
                rules.apply(tree.to_mut(), |secret| self.seal_secret(secret));
            }
        }
        let arguments = match &arguments {
            Arguments::Call(call) => jcs::Field::Canonical(call.canonical_arguments()),
            Arguments::Tree(tree) => jcs::Field::Object(tree),
        };
        let mut fields = vec![
            ("actor", jcs::Field::Str(actor.as_str())),
            ("arguments", arguments),
            ("intent_scope", jcs::Field::Str(intent_scope.as_str())),
            ("tool", jcs::Field::Str(&tool)),
        ];
        if let Some(credential_ref) = &credential_ref {
            fields.push(("credential_ref", jcs::Field::Str(credential_ref.as_str())));
        }
        let continuation = continuation.map(|mut value| {
            self.seal_secret(&mut value);
            value
        });
        if let Some(Value::String(sealed)) = &continuation {
            fields.push(("continuation", jcs::Field::Str(sealed)));
        }
        channel.fields(&mut fields);
        // Every name is ASCII, so byte order is JCS order.
        fields.sort_unstable_by_key(|(name, _)| *name);
        let mut out = Vec::with_capacity(256);
        jcs::write_fields(&fields, &mut out);
        CanonicalRecord(out)
    }

    /// The fingerprint of canonical bytes.
    pub fn digest(&self, canonical: &CanonicalRecord) -> Fingerprint {
        let mut mac = self.record_mac.clone();
        mac.update(&canonical.0);
        Fingerprint(mac.finalize().into_bytes().into())
    }

    /// Canonicalises the record under the rules and digests it.
    pub fn fingerprint(&self, record: ActionRecord<'_>, rules: &FingerprintRules) -> Fingerprint {
        self.digest(&self.canonicalize(record, rules))
    }

    fn seal_secret(&self, value: &mut Value) {
        let mut mac = self.secret_mac.clone();
        mac.update(&canonical_json(value));
        let digest = mac.finalize().into_bytes();
        *value = Value::String(format!("secret:hmac-sha256:{}", hex::encode(digest)));
    }
}

impl fmt::Debug for FingerprintKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FingerprintKey(<redacted>)")
    }
}

/// RFC 8785 (JCS) serialisation of a JSON value.
pub fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    jcs::write(value, &mut out);
    out
}

/// The canonical bytes of an action record (RFC 8785 JSON).
#[derive(Clone, PartialEq, Eq)]
pub struct CanonicalRecord(Vec<u8>);

impl CanonicalRecord {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for CanonicalRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CanonicalRecord({})", String::from_utf8_lossy(&self.0))
    }
}

/// An intent fingerprint: `hmac-sha256:<64 hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint([u8; 32]);

const FINGERPRINT_PREFIX: &str = "hmac-sha256:";

impl Fingerprint {
    /// The first 12 hex digits, enough to tell fingerprints apart in a log line.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..6])
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{FINGERPRINT_PREFIX}{}", hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// Text that is not `hmac-sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid fingerprint: expected `hmac-sha256:` followed by 64 hex digits")]
pub struct InvalidFingerprint;

impl FromStr for Fingerprint {
    type Err = InvalidFingerprint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex_digits = s
            .strip_prefix(FINGERPRINT_PREFIX)
            .ok_or(InvalidFingerprint)?;
        let mut bytes = [0; 32];
        hex::decode_to_slice(hex_digits, &mut bytes).map_err(|_| InvalidFingerprint)?;
        Ok(Self(bytes))
    }
}

crate::serde_display_fromstr!(Fingerprint);

/// How the action reaches its target. Each channel puts its own identifying fields into the
/// canonical record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Channel {
    /// An MCP tool call: `{"channel":"mcp","target":…,"method":"tools/call"}`.
    Mcp {
        /// The MCP server.
        target: Target,
        /// The MCP method, `tools/call`.
        method: String,
    },
    /// An HTTP API call: `{"channel":"http","target":host,"method":…,"path":…}`.
    Http {
        /// The API host (and port when it is not the default).
        target: Target,
        /// The HTTP method.
        method: http::Method,
        /// The request path (without query noise the caller does not want matched).
        path: String,
    },
    /// A command on a host over SSH.
    Ssh {
        /// The host's identity (its host key fingerprint, not just a name that DNS may move).
        host_identity: String,
        /// The account the command runs as.
        account: String,
        /// The command line.
        command: String,
        /// The working directory, when it matters.
        working_directory: Option<String>,
    },
}

impl Channel {
    /// An MCP `tools/call` on a server.
    pub fn mcp(target: Target) -> Self {
        Self::Mcp {
            target,
            method: crate::protocol::TOOLS_CALL.to_owned(),
        }
    }

    fn fields<'a>(&'a self, fields: &mut Vec<(&'static str, jcs::Field<'a>)>) {
        use jcs::Field::Str;
        match self {
            Self::Mcp { target, method } => fields.extend([
                ("channel", Str("mcp")),
                ("target", Str(target.as_str())),
                ("method", Str(method)),
            ]),
            Self::Http {
                target,
                method,
                path,
            } => fields.extend([
                ("channel", Str("http")),
                ("target", Str(target.as_str())),
                ("method", Str(method.as_str())),
                ("path", Str(path)),
            ]),
            Self::Ssh {
                host_identity,
                account,
                command,
                working_directory,
            } => {
                fields.extend([
                    ("channel", Str("ssh")),
                    ("target", Str(host_identity)),
                    ("method", Str("exec")),
                    ("account", Str(account)),
                    ("command", Str(command)),
                ]);
                if let Some(dir) = working_directory {
                    fields.push(("working_directory", Str(dir)));
                }
            }
        }
    }
}

/// The canonical action record: everything that makes two requests the same intent.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionRecord<'a> {
    actor: Actor,
    tool: String,
    channel: Channel,
    credential_ref: Option<CredentialRef>,
    arguments: Arguments<'a>,
    intent_scope: IntentScope,
    continuation: Option<Value>,
}

/// The arguments of a record.
#[derive(Debug, Clone, PartialEq)]
enum Arguments<'a> {
    /// As a tree.
    Tree(Cow<'a, Map<String, Value>>),
    /// A parsed `tools/call`'s: canonical already, the tree built only if a rule needs it.
    Call(&'a ToolCall),
}

impl<'a> ActionRecord<'a> {
    /// A record with no credential reference and empty arguments.
    pub fn new(
        actor: Actor,
        intent_scope: IntentScope,
        tool: impl Into<String>,
        channel: Channel,
    ) -> Self {
        Self {
            actor,
            tool: tool.into(),
            channel,
            credential_ref: None,
            arguments: Arguments::Tree(Cow::Owned(Map::new())),
            intent_scope,
            continuation: None,
        }
    }

    /// Sets the credential reference (a name for the credential, never the credential).
    pub fn credential_ref(mut self, credential_ref: CredentialRef) -> Self {
        self.credential_ref = Some(credential_ref);
        self
    }

    /// Sets the arguments. A value that is not an object is taken as `{"": value}` so that it
    /// still counts, though MCP tool arguments are always objects.
    pub fn arguments(mut self, arguments: impl Into<Value>) -> Self {
        self.arguments = Arguments::Tree(Cow::Owned(match arguments.into() {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            other => Map::from_iter([(String::new(), other)]),
        }));
        self
    }

    /// Sets the arguments from a parsed `tools/call`.
    pub fn argument_map(mut self, arguments: Map<String, Value>) -> Self {
        self.arguments = Arguments::Tree(Cow::Owned(arguments));
        self
    }

    /// Marks the call as the continuation of an earlier one (MCP multi-round-trip requests carry
    /// `inputResponses` / `requestState`): it is a new intent, not a re-issue of the call it
    /// continues. Only a keyed HMAC of the continuation enters the record.
    pub fn continuation(mut self, continuation: Value) -> Self {
        self.continuation = Some(continuation);
        self
    }

    /// Borrows the arguments (of a parsed `tools/call` the caller still needs): they are
    /// copied only if the tool's rules change them.
    pub fn borrowed_arguments(mut self, arguments: &'a Map<String, Value>) -> Self {
        self.arguments = Arguments::Tree(Cow::Borrowed(arguments));
        self
    }

    /// Sets the arguments of a classified `tools/call`: its
    /// [canonical arguments](crate::protocol::ToolCall::canonical_arguments), written while
    /// the body was parsed, go into the record as they are (no tree is built unless the
    /// tool's rules change them).
    pub fn call_arguments(mut self, call: &'a ToolCall) -> Self {
        self.arguments = Arguments::Call(call);
        self
    }

    /// The record of a parsed `tools/call` to an MCP endpoint, as both halves build it: the
    /// arguments borrowed, and a multi-round-trip continuation made a new intent (not a
    /// re-issue of the call it continues). The credential reference, if any, is the caller's
    /// to add.
    pub(crate) fn of_tool_call(
        actor: Actor,
        intent_scope: IntentScope,
        call: &'a ToolCall,
        target: Target,
    ) -> Self {
        let record = Self::new(actor, intent_scope, call.name.clone(), Channel::mcp(target))
            .call_arguments(call);
        match call.continuation() {
            Some(continuation) => record.continuation(continuation),
            None => record,
        }
    }
}

#[cfg(test)]
mod tests;
