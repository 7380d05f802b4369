//! What `call` and `proxy` share: which ledger, which contracts, and who is acting.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use mcp_replay_guard::{
    Actor, CredentialRef, IntentScope,
    contract::ContractRegistry,
    execution::RetryClass,
    fingerprint::FingerprintKey,
    guard::GuardLayer,
    ledger::{FileLedger, MemoryLedger},
};

/// The actor of `call` without `--actor`.
const DEFAULT_ACTOR: &str = "replay-guard";

/// The guard's configuration on the command line.
#[derive(Debug, Args)]
pub struct GuardOptions {
    /// A file ledger, shared by every invocation and process that names it. Without it the
    /// ledger lives in memory and ends with the process.
    #[arg(long, value_name = "PATH")]
    pub ledger: Option<PathBuf>,
    /// A policy file (TOML, or JSON by its extension): tool contracts, link windows, retention,
    /// fingerprint rules, secret paths, trusted servers. Tools it does not list are irreversible.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Who acts: part of every intent, so another actor's identical call is another execution.
    /// `call`: default `replay-guard`. `proxy`: one fixed actor for every client (without it,
    /// each client's `Authorization` decides, see `proxy --help`).
    #[arg(long, value_name = "A")]
    pub actor: Option<String>,
    /// The window of meaning of a repeat (e.g. one agent run, `run:5f8097`): identical calls in
    /// one scope are one intent.
    #[arg(long, value_name = "S", default_value = "cli")]
    pub scope: String,
    /// The credential the call acts with, by reference (never the credential itself).
    #[arg(long, value_name = "R")]
    pub credential_ref: Option<String>,
}

/// A retry class as the command line spells it.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ClassArg {
    /// Re-send freely.
    #[value(alias = "read_only")]
    ReadOnly,
    /// Re-send under the same Idempotency-Key.
    Idempotent,
    /// Ask a status probe (or MCP `tasks/get`) before anything else.
    Recoverable,
    /// Never re-send after an unknown outcome: held for review.
    Irreversible,
}

impl From<ClassArg> for RetryClass {
    fn from(class: ClassArg) -> Self {
        match class {
            ClassArg::ReadOnly => RetryClass::ReadOnly,
            ClassArg::Idempotent => RetryClass::Idempotent,
            ClassArg::Recoverable => RetryClass::Recoverable,
            ClassArg::Irreversible => RetryClass::Irreversible,
        }
    }
}

impl GuardOptions {
    /// The tool contracts: the policy file's, with `class` set for one tool when given.
    pub fn contracts(&self, class: Option<(&str, ClassArg)>) -> anyhow::Result<ContractRegistry> {
        let registry = match &self.policy {
            Some(path) => ContractRegistry::from_path(path).with_context(
                || "fix the policy file (examples/policy.toml is a full commented example)",
            )?,
            None => ContractRegistry::default(),
        };
        Ok(match class {
            Some((tool, class)) => registry.with_class(tool, class.into()),
            None => registry,
        })
    }

    /// The guard layer over the chosen ledger. With a file ledger the fingerprint key is the one
    /// kept beside it, so every process that shares the ledger recognises the same intents, and
    /// a wait for another process's lock on it is bounded by `attach_timeout`.
    pub fn layer(
        &self,
        contracts: ContractRegistry,
        attach_timeout: Duration,
    ) -> anyhow::Result<GuardLayer> {
        Ok(self.layer_and_key(contracts, attach_timeout)?.0)
    }

    /// [`Self::layer`] and the fingerprint key it uses (the proxy derives its actor tags from
    /// it).
    pub fn layer_and_key(
        &self,
        contracts: ContractRegistry,
        attach_timeout: Duration,
    ) -> anyhow::Result<(GuardLayer, FingerprintKey)> {
        let (layer, key) = match &self.ledger {
            Some(path) => {
                // The cause says what went wrong (a full disk, a foreign file, a held lock, a
                // missing key): no guess about permissions on top of it.
                let context =
                    || format!("cannot use the ledger {}; nothing was sent", path.display());
                // Waiting for another process's lock is bounded by the call's own timeout.
                let ledger = FileLedger::open_with_lock_timeout(path, attach_timeout)
                    .with_context(context)?;
                let key = ledger.fingerprint_key().with_context(context)?;
                (GuardLayer::new(ledger, contracts, key.clone()), key)
            }
            None => {
                let key = FingerprintKey::generate()?;
                (
                    GuardLayer::new(MemoryLedger::new(), contracts, key.clone()),
                    key,
                )
            }
        };
        let actor = self.actor.as_deref().unwrap_or(DEFAULT_ACTOR);
        let mut layer = layer
            .actor(Actor::new(actor))
            .intent_scope(IntentScope::new(self.scope.as_str()))
            .attach_timeout(attach_timeout);
        if let Some(reference) = &self.credential_ref {
            layer = layer.credential_ref(CredentialRef::new(reference.as_str()));
        }
        Ok((layer, key))
    }
}
