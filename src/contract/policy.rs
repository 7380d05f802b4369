//! Policy files (TOML or JSON) that declare a registry.

use std::{collections::HashMap, fmt, path::Path, time::Duration};

use serde::Deserialize;

use super::{ContractRegistry, InvalidContract, RetryClass, ToolContract};
use crate::fingerprint::FingerprintRules;

impl ContractRegistry {
    /// Reads a policy from TOML. See [`Policy`] for the format. A contract it refuses is
    /// named with its line.
    pub fn from_toml_str(text: &str) -> Result<Self, InvalidContract> {
        let deserializer =
            toml::Deserializer::parse(text).map_err(|e| InvalidContract(e.to_string()))?;
        Self::from_deserializer(deserializer, &|path| toml_line(text, path))
    }

    /// Reads a policy from JSON. See [`Policy`] for the format.
    pub fn from_json_str(text: &str) -> Result<Self, InvalidContract> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Self::from_deserializer(&mut deserializer, &|_| None)
    }

    /// Reads a policy file: TOML, or JSON when the name ends in `.json`.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, InvalidContract> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| InvalidContract(format!("cannot read {}: {e}", path.display())))?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            Self::from_json_str(&text)
        } else {
            Self::from_toml_str(&text)
        };
        parsed.map_err(|InvalidContract(e)| InvalidContract(format!("{}: {e}", path.display())))
    }

    fn from_deserializer<'de, D: serde::Deserializer<'de>>(
        deserializer: D,
        line: &Line<'_>,
    ) -> Result<Self, InvalidContract>
    where
        D::Error: fmt::Display,
    {
        let policy: Policy = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            InvalidContract(format!("at `{path}`: {}", e.into_inner()))
        })?;
        policy.into_registry_at(line)
    }
}

/// The line of the deepest table or key of `path` that the policy text writes, if known.
type Line<'a> = dyn Fn(&[&str]) -> Option<usize> + 'a;

/// The line (from 1) of the deepest of `path`'s keys written in the TOML `text`.
fn toml_line(text: &str, path: &[&str]) -> Option<usize> {
    let document = toml::de::DeTable::parse(text).ok()?;
    let root = toml::de::DeValue::Table(document.into_inner());
    let mut value = &root;
    let mut span = None;
    for key in path {
        let Some(next) = value.get(*key) else {
            break;
        };
        span = Some(next.span());
        value = next.get_ref();
    }
    let start = span?.start;
    Some(text.get(..start)?.matches('\n').count() + 1)
}

/// The policy file format (TOML or JSON), read by [`ContractRegistry::from_toml_str`] and
/// friends. Durations are humantime strings (`"90s"`, `"15m"`, `"7d"`).
///
/// ```toml
/// strict = false
/// trusted_servers = ["docs.internal.example/mcp"]
///
/// [unlisted]            # tools without a contract (irreversible unless trusted annotations say otherwise)
/// link_window = "10m"
/// retention = "24h"
///
/// [tools.deploy_release]
/// class = "irreversible"
/// link_window = "15m"
/// retention = "7d"
/// keep_results = true
/// max_result_bytes = 65536
/// execution_id_in_meta = true
///
/// [tools.deploy_release.fingerprint]
/// drop = ["/note"]
/// secrets = ["/approval_token"]
/// defaults = { "/region" = "us-east-1" }
/// normalize = { "/service" = ["trim", "lowercase"] }
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Policy {
    /// Refuse tools without a contract.
    #[serde(default)]
    pub strict: bool,
    /// Servers whose annotations are trusted.
    #[serde(default)]
    pub trusted_servers: Vec<String>,
    /// Settings for tools without a contract.
    #[serde(default)]
    pub unlisted: UnlistedPolicy,
    /// Contracts by tool name.
    #[serde(default)]
    pub tools: HashMap<String, ToolPolicy>,
}

/// The `[unlisted]` table of a policy file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct UnlistedPolicy {
    /// Link window.
    #[serde(default, with = "humantime_serde")]
    pub link_window: Option<Duration>,
    /// Retention.
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
}

/// One `[tools.NAME]` table of a policy file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ToolPolicy {
    /// The retry class (`read_only`, `idempotent`, `recoverable`, `irreversible`).
    pub class: RetryClass,
    /// Link window.
    #[serde(default, with = "humantime_serde")]
    pub link_window: Option<Duration>,
    /// Retention.
    #[serde(default, with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// Keep completed results.
    #[serde(default)]
    pub keep_results: Option<bool>,
    /// Largest kept result.
    #[serde(default)]
    pub max_result_bytes: Option<usize>,
    /// Send the execution's key in `params._meta` too
    /// ([`ToolContract::execution_id_in_meta`]).
    #[serde(default)]
    pub execution_id_in_meta: Option<bool>,
    /// Fingerprint rules.
    #[serde(default)]
    pub fingerprint: FingerprintRules,
    /// The program an operator runs to ask whether a held execution took effect
    /// ([`ToolContract::status_command`]): `["/usr/local/bin/deploy-status", "--json"]`.
    #[serde(default)]
    pub status_command: Option<Vec<String>>,
}

impl Policy {
    /// Turns the policy into a registry, checking every contract.
    pub fn into_registry(self) -> Result<ContractRegistry, InvalidContract> {
        self.into_registry_at(&|_| None)
    }

    /// [`into_registry`](Self::into_registry), naming the line (`line` finds it) of a
    /// contract that is refused.
    fn into_registry_at(self, line: &Line<'_>) -> Result<ContractRegistry, InvalidContract> {
        // Where a contract's terms are written: its retention when it has one (the term a
        // refusal is most often about), else its table.
        let at = |table: &[&str]| {
            let retention: Vec<&str> = table.iter().copied().chain(["retention"]).collect();
            line(&retention)
                .or_else(|| line(table))
                .map_or_else(String::new, |n| format!(" (line {n})"))
        };
        let mut unlisted = ToolContract::new(RetryClass::Irreversible);
        if let Some(window) = self.unlisted.link_window {
            unlisted = unlisted.link_window(window);
        }
        if let Some(retention) = self.unlisted.retention {
            unlisted = unlisted.retention(retention);
        }
        unlisted
            .check("<unlisted>")
            .map_err(|InvalidContract(e)| InvalidContract(format!("{e}{}", at(&["unlisted"]))))?;
        let mut builder = ContractRegistry::builder().strict(self.strict);
        for server in self.trusted_servers {
            builder = builder.trust_server(server.into());
        }
        if let Some(window) = self.unlisted.link_window {
            builder = builder.unlisted_link_window(window);
        }
        if let Some(retention) = self.unlisted.retention {
            builder = builder.unlisted_retention(retention);
        }
        for (name, tool) in self.tools {
            let mut contract = ToolContract::new(tool.class).fingerprint(tool.fingerprint);
            if let Some(window) = tool.link_window {
                contract = contract.link_window(window);
            }
            if let Some(retention) = tool.retention {
                contract = contract.retention(retention);
            }
            if let Some(keep) = tool.keep_results {
                contract = contract.keep_results(keep);
            }
            if let Some(max) = tool.max_result_bytes {
                contract = contract.max_result_bytes(max);
            }
            if let Some(send) = tool.execution_id_in_meta {
                contract = contract.execution_id_in_meta(send);
            }
            if let Some(argv) = tool.status_command {
                if argv.first().is_none_or(String::is_empty) {
                    return Err(InvalidContract(format!(
                        "tools.{name}.status_command: give the program first, then its arguments{}",
                        at(&["tools", &name])
                    )));
                }
                contract = contract.status_command(argv);
            }
            contract.check(&name).map_err(|InvalidContract(e)| {
                InvalidContract(format!("{e}{}", at(&["tools", &name])))
            })?;
            builder = builder.tool(name, contract);
        }
        builder.build()
    }
}
