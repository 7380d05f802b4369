//! The retry class of a tool.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What may be done after the outcome of a call is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryClass {
    /// Re-send freely: the tool changes nothing.
    #[serde(alias = "read-only")]
    ReadOnly,
    /// Re-send under the same execution ID and `Idempotency-Key`. Only valid when the target
    /// honours the key.
    Idempotent,
    /// Ask the contract's status probe whether the action was applied, and act on the answer.
    /// Without a probe an unknown outcome waits for review, as for an irreversible tool.
    Recoverable,
    /// Never re-send: an unknown outcome waits for a person or a probe to settle it.
    Irreversible,
}

impl RetryClass {
    /// The name used in policy files, logs and ledger records (`read_only`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::Idempotent => "idempotent",
            Self::Recoverable => "recoverable",
            Self::Irreversible => "irreversible",
        }
    }

    /// Whether the tool has side effects at all.
    pub fn has_side_effects(self) -> bool {
        self != Self::ReadOnly
    }
}

impl fmt::Display for RetryClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
