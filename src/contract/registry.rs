//! The registry of tool contracts, its builder, and how a call resolves to a contract.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use serde::Serialize;

use super::{InvalidContract, NoContract, RetryClass, StatusProbe, ToolAnnotations, ToolContract};
use crate::context::Target;

/// Where a resolved contract came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContractSource {
    /// Written for the tool, in code or a policy file.
    Declared,
    /// Derived from the annotations of a trusted server.
    TrustedAnnotations,
    /// No contract and no trusted annotation: irreversible.
    UnlistedDefault,
}

/// The contract that governs one call, and where it came from.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ResolvedContract<'a> {
    /// The contract.
    pub contract: &'a ToolContract,
    /// Where it came from.
    pub source: ContractSource,
}

/// The tool contracts of an agent.
#[derive(Debug, Clone)]
pub struct ContractRegistry {
    tools: HashMap<String, ToolContract>,
    trusted_servers: HashSet<Target>,
    strict: bool,
    unlisted: [ToolContract; 3],
}

impl Default for ContractRegistry {
    fn default() -> Self {
        ContractRegistryBuilder::default()
            .build()
            .expect("the default registry is valid")
    }
}

impl ContractRegistry {
    /// A builder.
    pub fn builder() -> ContractRegistryBuilder {
        ContractRegistryBuilder::default()
    }

    /// The contract that governs a call of `tool` on `server`, given the annotations the server
    /// published for it (if the caller has them).
    pub fn resolve(
        &self,
        tool: &str,
        server: &Target,
        annotations: Option<&ToolAnnotations>,
    ) -> Result<ResolvedContract<'_>, NoContract> {
        if let Some(contract) = self.tools.get(tool) {
            return Ok(ResolvedContract {
                contract,
                source: ContractSource::Declared,
            });
        }
        if self.strict {
            return Err(NoContract { tool: tool.into() });
        }
        let [read_only, idempotent, irreversible] = &self.unlisted;
        let trusted = annotations.filter(|_| self.trusted_servers.contains(server));
        let (contract, source) = match trusted {
            Some(a) if a.read_only_hint == Some(true) => {
                (read_only, ContractSource::TrustedAnnotations)
            }
            Some(a) if a.idempotent_hint == Some(true) => {
                (idempotent, ContractSource::TrustedAnnotations)
            }
            _ => (irreversible, ContractSource::UnlistedDefault),
        };
        Ok(ResolvedContract { contract, source })
    }

    /// The registry with `tool`'s retry class set to `class`: a contract the tool already has
    /// keeps its other terms (link window, retention, fingerprint rules); a tool without one gets
    /// the unlisted defaults. This is how a command line's `--class` overrides a policy file.
    /// A status probe stays only while the class is recoverable (no other class uses one).
    pub fn with_class(mut self, tool: &str, class: RetryClass) -> Self {
        let contract = self.tools.entry(tool.to_owned()).or_insert_with(|| {
            let [.., unlisted] = &self.unlisted;
            unlisted.clone()
        });
        contract.class = class;
        if class != RetryClass::Recoverable {
            contract.probe = None;
        }
        self
    }

    /// The registry with `probe` as the status probe of `tool`'s declared contract, for a
    /// registry read from a policy file (which names no probe). Refused unless `tool` has a
    /// declared [`RetryClass::Recoverable`] contract: a probe for a misspelled or a
    /// non-recoverable tool would never be asked.
    pub fn with_status_probe(
        mut self,
        tool: &str,
        probe: impl StatusProbe,
    ) -> Result<Self, InvalidContract> {
        match self.tools.get_mut(tool) {
            Some(contract) if contract.class == RetryClass::Recoverable => {
                contract.probe = Some(Arc::new(probe));
                Ok(self)
            }
            Some(contract) => Err(InvalidContract(format!(
                "tools.{tool}: a status probe is only used by a recoverable tool, and this one is {}",
                contract.class
            ))),
            None => Err(InvalidContract(format!(
                "tools.{tool}: a status probe for a tool without a contract would never be asked"
            ))),
        }
    }

    /// Whether `server`'s tool annotations are trusted (its `tools/list` is worth reading).
    pub(crate) fn trusts(&self, server: &Target) -> bool {
        self.trusted_servers.contains(server)
    }

    /// Whether the registry refuses tools without a contract.
    pub fn is_strict(&self) -> bool {
        self.strict
    }

    /// The declared contracts.
    pub fn tools(&self) -> impl Iterator<Item = (&str, &ToolContract)> {
        self.tools.iter().map(|(name, c)| (name.as_str(), c))
    }

    /// The longest retention of any contract the registry can resolve to: how long a ledger
    /// must keep records for this registry.
    pub fn max_retention(&self) -> Duration {
        self.tools
            .values()
            .chain(&self.unlisted)
            .map(ToolContract::retention_duration)
            .max()
            .unwrap_or(ToolContract::DEFAULT_RETENTION)
    }
}

/// Builds a [`ContractRegistry`]; [`build`](Self::build) reports the first invalid contract.
#[derive(Debug, Clone, Default)]
pub struct ContractRegistryBuilder {
    tools: HashMap<String, ToolContract>,
    trusted_servers: HashSet<Target>,
    strict: bool,
    unlisted_link_window: Option<Duration>,
    unlisted_retention: Option<Duration>,
}

impl ContractRegistryBuilder {
    /// Declares the contract of a tool (replacing an earlier one for the same name).
    pub fn tool(mut self, name: impl Into<String>, contract: ToolContract) -> Self {
        self.tools.insert(name.into(), contract);
        self
    }

    /// Trusts a server's tool annotations (`readOnlyHint`, `idempotentHint`).
    pub fn trust_server(mut self, server: Target) -> Self {
        self.trusted_servers.insert(server);
        self
    }

    /// Refuses calls to tools without a contract.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The link window of tools without a contract.
    pub fn unlisted_link_window(mut self, window: Duration) -> Self {
        self.unlisted_link_window = Some(window);
        self
    }

    /// The retention of tools without a contract.
    pub fn unlisted_retention(mut self, retention: Duration) -> Self {
        self.unlisted_retention = Some(retention);
        self
    }

    /// Checks every contract and builds the registry.
    pub fn build(self) -> Result<ContractRegistry, InvalidContract> {
        let unlisted = |class| {
            let mut contract = ToolContract::new(class);
            if let Some(window) = self.unlisted_link_window {
                contract = contract.link_window(window);
            }
            if let Some(retention) = self.unlisted_retention {
                contract = contract.retention(retention);
            }
            contract
        };
        let unlisted = [
            unlisted(RetryClass::ReadOnly),
            unlisted(RetryClass::Idempotent),
            unlisted(RetryClass::Irreversible),
        ];
        unlisted[0].check("<unlisted>")?;
        let mut names: Vec<_> = self.tools.keys().collect();
        names.sort();
        for name in names {
            self.tools[name].check(name)?;
        }
        Ok(ContractRegistry {
            tools: self.tools,
            trusted_servers: self.trusted_servers,
            strict: self.strict,
            unlisted,
        })
    }
}
