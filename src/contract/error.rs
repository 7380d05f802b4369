//! The errors of contracts and registries.

/// Strict mode refused a tool without a contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tool {tool:?} has no contract and the registry is strict; write a ToolContract for it (its retry class, at least) before an agent may call it"
)]
#[non_exhaustive]
pub struct NoContract {
    /// The tool.
    pub tool: String,
}

/// A contract or policy that cannot be used; the message names the bad key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool policy: {0}")]
pub struct InvalidContract(pub(super) String);
