//! The fingerprint rules of a tool: arguments dropped, defaulted, normalised or kept secret.

use std::{collections::BTreeMap, fmt, sync::Arc};

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::path::{ArgPath, InvalidArgPath};

/// How a string argument is normalised before it is fingerprinted, so that spellings a tool
/// treats as equal match.
#[derive(Clone)]
pub enum Normalizer {
    /// Strip leading and trailing whitespace.
    Trim,
    /// Lowercase (Unicode).
    Lowercase,
    /// A function of your own, applied to whatever value the path reaches.
    Custom {
        /// A name for `Debug` output and errors.
        name: Arc<str>,
        /// The function.
        function: Arc<dyn Fn(&mut Value) + Send + Sync>,
    },
}

impl Normalizer {
    /// A custom normaliser.
    pub fn custom(name: &str, function: impl Fn(&mut Value) + Send + Sync + 'static) -> Self {
        Self::Custom {
            name: name.into(),
            function: Arc::new(function),
        }
    }

    fn apply(&self, value: &mut Value) {
        match (self, value) {
            (Self::Trim, Value::String(s)) => {
                let trimmed = s.trim();
                if trimmed.len() != s.len() {
                    *s = trimmed.to_owned();
                }
            }
            (Self::Lowercase, Value::String(s)) if s.chars().any(char::is_uppercase) => {
                *s = s.to_lowercase();
            }
            (Self::Custom { function, .. }, value) => function(value),
            _ => {}
        }
    }
}

impl fmt::Debug for Normalizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trim => f.write_str("Trim"),
            Self::Lowercase => f.write_str("Lowercase"),
            Self::Custom { name, .. } => write!(f, "Custom({name:?})"),
        }
    }
}

impl<'de> Deserialize<'de> for Normalizer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match String::deserialize(deserializer)?.as_str() {
            "trim" => Ok(Self::Trim),
            "lowercase" => Ok(Self::Lowercase),
            other => Err(serde::de::Error::custom(format!(
                "unknown normaliser {other:?}; expected \"trim\" or \"lowercase\" (custom ones are set in code)"
            ))),
        }
    }
}

/// Per-tool rules that shape the arguments before they are fingerprinted.
///
/// Applied in this order: materialise defaults, normalise, drop, seal secrets.
///
/// - **defaults**: a value the tool assumes when an argument is absent is filled in, so that a
///   call that omits it and a call that spells it out match. Materialise a default always or
///   never: a tool whose rules list some defaults but not others makes false negatives.
/// - **normalise**: spellings the tool treats as equal become equal (`" Catalog "` →
///   `"catalog"`).
/// - **drop**: arguments that carry no meaning for the action (a free-text note, a client
///   timestamp) leave the record.
/// - **secrets**: the value is replaced by a keyed HMAC of it, never stored or hashed raw.
///
/// Paths are [`ArgPath`]s. Builder methods take strings; a bad path is reported when the
/// contract registry is built (see
/// [`ContractRegistryBuilder::build`](crate::contract::ContractRegistryBuilder::build)).
#[derive(Debug, Clone, Default)]
pub struct FingerprintRules {
    defaults: Vec<(ArgPath, Value)>,
    normalize: Vec<(ArgPath, Normalizer)>,
    drop: Vec<ArgPath>,
    secrets: Vec<ArgPath>,
    errors: Vec<InvalidArgPath>,
}

impl FingerprintRules {
    /// No rules: every argument counts as given.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fills in `value` at `path` when the argument is absent.
    pub fn default_value(mut self, path: &str, value: impl Into<Value>) -> Self {
        if let Some(path) = self.parse(path) {
            self.defaults.push((path, value.into()));
        }
        self
    }

    /// Normalises the value at `path`.
    pub fn normalize(mut self, path: &str, normalizer: Normalizer) -> Self {
        if let Some(path) = self.parse(path) {
            self.normalize.push((path, normalizer));
        }
        self
    }

    /// Leaves the value at `path` out of the fingerprint.
    pub fn drop(mut self, path: &str) -> Self {
        if let Some(path) = self.parse(path) {
            self.drop.push(path);
        }
        self
    }

    /// Marks the value at `path` secret: only a keyed HMAC of it is fingerprinted.
    pub fn secret(mut self, path: &str) -> Self {
        if let Some(path) = self.parse(path) {
            self.secrets.push(path);
        }
        self
    }

    /// Whether there are no rules (the arguments are fingerprinted as given).
    pub fn is_empty(&self) -> bool {
        self.defaults.is_empty()
            && self.normalize.is_empty()
            && self.drop.is_empty()
            && self.secrets.is_empty()
    }

    /// The paths marked secret.
    pub fn secret_paths(&self) -> impl Iterator<Item = &ArgPath> {
        self.secrets.iter()
    }

    /// The first invalid path given to a builder method, if any.
    pub fn check(&self) -> Result<(), InvalidArgPath> {
        self.errors.first().cloned().map_or(Ok(()), Err)
    }

    fn parse(&mut self, path: &str) -> Option<ArgPath> {
        path.parse().map_err(|e| self.errors.push(e)).ok()
    }

    pub(super) fn apply(
        &self,
        arguments: &mut Map<String, Value>,
        mut seal: impl FnMut(&mut Value),
    ) {
        for (path, value) in &self.defaults {
            path.materialize(arguments, value);
        }
        for (path, normalizer) in &self.normalize {
            path.for_each_mut(arguments, &mut |v| normalizer.apply(v));
        }
        for path in &self.drop {
            path.remove(arguments);
        }
        for path in &self.secrets {
            path.for_each_mut(arguments, &mut seal);
        }
    }
}

/// The policy-file form:
///
/// ```toml
/// drop = ["/note"]
/// secrets = ["/card/number"]
/// defaults = { "/region" = "us-east-1" }
/// normalize = { "/service" = ["trim", "lowercase"] }
/// ```
impl<'de> Deserialize<'de> for FingerprintRules {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            drop: Vec<String>,
            #[serde(default)]
            secrets: Vec<String>,
            #[serde(default)]
            defaults: BTreeMap<String, Value>,
            #[serde(default)]
            normalize: BTreeMap<String, Value>,
        }

        let raw = Raw::deserialize(deserializer)?;
        let mut rules = Self::new();
        for path in &raw.drop {
            rules = rules.drop(path);
        }
        for path in &raw.secrets {
            rules = rules.secret(path);
        }
        for (path, value) in raw.defaults {
            rules = rules.default_value(&path, value);
        }
        for (path, normalizers) in raw.normalize {
            // One name or a list of names; parsed by hand so that a bad name is named in the
            // error (an untagged enum would only say "did not match any variant").
            let names = match normalizers {
                Value::Array(names) => names,
                one => vec![one],
            };
            for name in names {
                let normalizer = Normalizer::deserialize(name).map_err(serde::de::Error::custom)?;
                rules = rules.normalize(&path, normalizer);
            }
        }
        rules.check().map_err(serde::de::Error::custom)?;
        Ok(rules)
    }
}
