//! What `call` and `proxy` share: which ledger, which contracts, and who is acting.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use clap::{Args, ValueEnum};
use mcp_replay_guard::{
    Actor, CredentialRef, IntentScope,
    contract::ContractRegistry,
    execution::RetryClass,
    fingerprint::FingerprintKey,
    guard::GuardLayer,
    ledger::{Ledger, MemoryLedger},
};

use crate::ledger_location::{KeyOptions, LedgerLocation, LedgerParser, OpenLedger};

/// The actor of `call` without `--actor`.
const DEFAULT_ACTOR: &str = "replay-guard";

/// The guard's configuration on the command line.
#[derive(Debug, Args)]
pub struct GuardOptions {
    /// The ledger, shared by every invocation and process that names it: a file, or a
    /// PostgreSQL database (`postgres://user@host/db`, `?schema=NAME` for a schema other than
    /// `public`; its fingerprint key from --key-file or REPLAY_GUARD_FINGERPRINT_KEY). Without
    /// it the ledger lives in memory and ends with the process.
    #[arg(long, value_name = "LEDGER", value_parser = LedgerParser)]
    pub ledger: Option<LedgerLocation>,
    #[command(flatten)]
    pub key: KeyOptions,
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
    /// kept beside it, with a PostgreSQL ledger the one given (which the ledger is bound to),
    /// so every process that shares the ledger recognises the same intents; a wait for another
    /// process's lock on a file is bounded by `attach_timeout`.
    pub async fn layer(
        &self,
        contracts: ContractRegistry,
        attach_timeout: Duration,
    ) -> anyhow::Result<GuardLayer> {
        Ok(self.layer_and_key(contracts, attach_timeout).await?.0)
    }

    /// [`Self::layer`] and the fingerprint key it uses (the proxy derives its actor tags from
    /// it).
    pub async fn layer_and_key(
        &self,
        contracts: ContractRegistry,
        attach_timeout: Duration,
    ) -> anyhow::Result<(GuardLayer, FingerprintKey)> {
        let (layer, key, _) = self.layer_key_and_ledger(contracts, attach_timeout).await?;
        Ok((layer, key))
    }

    /// [`Self::layer_and_key`], and the ledger a serving command keeps small (none in memory).
    pub async fn layer_key_and_ledger(
        &self,
        contracts: ContractRegistry,
        attach_timeout: Duration,
    ) -> anyhow::Result<(GuardLayer, FingerprintKey, Option<OpenLedger>)> {
        let (layer, key, compacted) = match &self.ledger {
            Some(location) => {
                // The cause says what went wrong (a full disk, a foreign file, a held lock, a
                // missing key, a database that does not answer): no guess about permissions on
                // top of it. The location is shown without a password.
                let context = || format!("cannot use the ledger {location}; nothing was sent");
                // Waiting for another process's lock is bounded by the call's own timeout.
                let (opened, key) = location
                    .open_for_guard(attach_timeout, &self.key)
                    .await
                    .with_context(context)?;
                let compacted = Some(opened.clone());
                let ledger: Arc<dyn Ledger> = opened.ledger();
                (
                    GuardLayer::new(ledger, contracts, key.clone()),
                    key,
                    compacted,
                )
            }
            None => {
                self.key.refuse_file_ledger()?;
                let key = FingerprintKey::generate()?;
                (
                    GuardLayer::new(MemoryLedger::new(), contracts, key.clone()),
                    key,
                    None,
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
        Ok((layer, key, compacted))
    }
}
