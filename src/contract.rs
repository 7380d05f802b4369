//! Tool contracts: what may happen, per tool, when a response is lost.
//!
//! A [`ToolContract`] is written in code (or a policy file) next to the tool it governs. It
//! names the tool's [`RetryClass`], how long a repeat of the same intent links to the earlier
//! execution, how long the record is kept, how the arguments are fingerprinted, and whether the
//! result is kept so that an undelivered answer can be handed back.
//!
//! ```
//! use std::time::Duration;
//! use mcp_replay_guard::contract::{ContractRegistry, ToolContract};
//! use mcp_replay_guard::fingerprint::FingerprintRules;
//!
//! let registry = ContractRegistry::builder()
//!     .tool("list_branches", ToolContract::read_only())
//!     .tool("create_payment", ToolContract::idempotent().link_window(Duration::from_secs(3600)))
//!     .tool(
//!         "deploy_release",
//!         ToolContract::irreversible()
//!             .fingerprint(FingerprintRules::new().drop("/note").secret("/approval_token")),
//!     )
//!     .strict(true)
//!     .build()?;
//! assert!(registry.resolve("deploy_release", &"deploy-api/mcp".into(), None).is_ok());
//! assert!(registry.resolve("rm_rf", &"deploy-api/mcp".into(), None).is_err());
//! # Ok::<(), mcp_replay_guard::contract::InvalidContract>(())
//! ```
//!
//! # Tools without a contract
//!
//! MCP tool annotations are hints from the server, and the specification says a client must
//! treat them as untrusted unless it trusts the server. So an unlisted tool is
//! [`RetryClass::Irreversible`], unless its server is marked trusted: then `readOnlyHint: true`
//! makes it read-only and `idempotentHint: true` idempotent. In strict mode an unlisted tool is
//! refused outright: if nobody can write its contract, the tool is not ready.

use std::{
    collections::{HashMap, HashSet},
    fmt,
    path::Path,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{context::Target, fingerprint::FingerprintRules};

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

/// The contract of one tool.
///
/// # Defaults
///
/// Link window 10 minutes, retention 24 hours, results kept up to 1 MiB, no fingerprint rules.
#[derive(Debug, Clone)]
pub struct ToolContract {
    class: RetryClass,
    link_window: Duration,
    retention: Duration,
    fingerprint: FingerprintRules,
    keep_results: bool,
    max_result_bytes: usize,
}

impl ToolContract {
    /// Default link window.
    pub const DEFAULT_LINK_WINDOW: Duration = Duration::from_secs(10 * 60);
    /// Default retention.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
    /// Default bound on a kept result.
    pub const DEFAULT_MAX_RESULT_BYTES: usize = 1024 * 1024;

    /// A contract of the given class with the defaults.
    pub fn new(class: RetryClass) -> Self {
        Self {
            class,
            link_window: Self::DEFAULT_LINK_WINDOW,
            retention: Self::DEFAULT_RETENTION,
            fingerprint: FingerprintRules::new(),
            keep_results: true,
            max_result_bytes: Self::DEFAULT_MAX_RESULT_BYTES,
        }
    }

    /// A read-only tool.
    pub fn read_only() -> Self {
        Self::new(RetryClass::ReadOnly)
    }

    /// An idempotent tool whose target honours `Idempotency-Key`.
    pub fn idempotent() -> Self {
        Self::new(RetryClass::Idempotent)
    }

    /// A recoverable tool (give it a status probe).
    pub fn recoverable() -> Self {
        Self::new(RetryClass::Recoverable)
    }

    /// An irreversible tool.
    pub fn irreversible() -> Self {
        Self::new(RetryClass::Irreversible)
    }

    /// How long after an execution was accepted an identical request still links to it.
    /// Past the window the same intent is a new execution.
    pub fn link_window(mut self, window: Duration) -> Self {
        self.link_window = window;
        self
    }

    /// How long the execution's record stays in the ledger's index.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How the tool's arguments are fingerprinted.
    pub fn fingerprint(mut self, rules: FingerprintRules) -> Self {
        self.fingerprint = rules;
        self
    }

    /// Whether completed results are kept so that an undelivered one can be handed back.
    pub fn keep_results(mut self, keep: bool) -> Self {
        self.keep_results = keep;
        self
    }

    /// The largest result kept, in bytes of its JSON; a larger one is not kept (a repeat then
    /// gets an honest "completed, result not kept" answer).
    pub fn max_result_bytes(mut self, max: usize) -> Self {
        self.max_result_bytes = max;
        self
    }

    /// The retry class.
    pub fn class(&self) -> RetryClass {
        self.class
    }

    /// The link window.
    pub fn link_window_duration(&self) -> Duration {
        self.link_window
    }

    /// The retention.
    pub fn retention_duration(&self) -> Duration {
        self.retention
    }

    /// The fingerprint rules.
    pub fn fingerprint_rules(&self) -> &FingerprintRules {
        &self.fingerprint
    }

    /// Whether results are kept.
    pub fn keeps_results(&self) -> bool {
        self.keep_results
    }

    /// The largest result kept, in bytes.
    pub fn max_result_size(&self) -> usize {
        self.max_result_bytes
    }

    fn check(&self, tool: &str) -> Result<(), InvalidContract> {
        self.fingerprint
            .check()
            .map_err(|e| InvalidContract(format!("tools.{tool}.fingerprint: {e}")))?;
        if self.link_window > self.retention {
            return Err(InvalidContract(format!(
                "tools.{tool}: link_window ({}) is longer than retention ({}); a record must outlive its window",
                humantime::format_duration(self.link_window),
                humantime::format_duration(self.retention)
            )));
        }
        Ok(())
    }
}

/// The MCP annotations of a tool, as `tools/list` reports them. Untrusted hints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// `readOnlyHint` (the specification's default is false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// `destructiveHint` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// `idempotentHint` (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// `openWorldHint` (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

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
pub struct ResolvedContract<'a> {
    /// The contract.
    pub contract: &'a ToolContract,
    /// Where it came from.
    pub source: ContractSource,
}

/// Strict mode refused a tool without a contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tool {tool:?} has no contract and the registry is strict; write a ToolContract for it (its retry class, at least) before an agent may call it"
)]
pub struct NoContract {
    /// The tool.
    pub tool: String,
}

/// A contract or policy that cannot be used; the message names the bad key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool policy: {0}")]
pub struct InvalidContract(String);

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
    pub fn with_class(mut self, tool: &str, class: RetryClass) -> Self {
        let contract = self.tools.entry(tool.to_owned()).or_insert_with(|| {
            let [.., unlisted] = &self.unlisted;
            unlisted.clone()
        });
        contract.class = class;
        self
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

    /// Reads a policy from TOML. See [`Policy`] for the format.
    pub fn from_toml_str(text: &str) -> Result<Self, InvalidContract> {
        let deserializer =
            toml::Deserializer::parse(text).map_err(|e| InvalidContract(e.to_string()))?;
        Self::from_deserializer(deserializer)
    }

    /// Reads a policy from JSON. See [`Policy`] for the format.
    pub fn from_json_str(text: &str) -> Result<Self, InvalidContract> {
        let mut deserializer = serde_json::Deserializer::from_str(text);
        Self::from_deserializer(&mut deserializer)
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
    ) -> Result<Self, InvalidContract>
    where
        D::Error: fmt::Display,
    {
        let policy: Policy = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            InvalidContract(format!("at `{path}`: {}", e.into_inner()))
        })?;
        policy.into_registry()
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
///
/// [tools.deploy_release.fingerprint]
/// drop = ["/note"]
/// secrets = ["/approval_token"]
/// defaults = { "/region" = "us-east-1" }
/// normalize = { "/service" = ["trim", "lowercase"] }
/// ```
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Fingerprint rules.
    #[serde(default)]
    pub fingerprint: FingerprintRules,
}

impl Policy {
    /// Turns the policy into a registry, checking every contract.
    pub fn into_registry(self) -> Result<ContractRegistry, InvalidContract> {
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
            builder = builder.tool(name, contract);
        }
        builder.build()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn target() -> Target {
        "deploy-api.internal.example/mcp".into()
    }

    #[test]
    fn declared_contracts_win_and_unlisted_tools_are_irreversible() {
        let registry = ContractRegistry::builder()
            .tool("list_branches", ToolContract::read_only())
            .build()
            .unwrap();
        let r = registry.resolve("list_branches", &target(), None).unwrap();
        assert_eq!(
            (r.contract.class(), r.source),
            (RetryClass::ReadOnly, ContractSource::Declared)
        );
        let r = registry.resolve("deploy_release", &target(), None).unwrap();
        assert_eq!(
            (r.contract.class(), r.source),
            (RetryClass::Irreversible, ContractSource::UnlistedDefault)
        );
    }

    #[test]
    fn with_class_overrides_the_class_and_keeps_the_other_terms() {
        let registry = ContractRegistry::builder()
            .tool(
                "deploy_release",
                ToolContract::irreversible().link_window(Duration::from_secs(90)),
            )
            .build()
            .unwrap()
            .with_class("deploy_release", RetryClass::Idempotent)
            .with_class("list_branches", RetryClass::ReadOnly);
        let r = registry.resolve("deploy_release", &target(), None).unwrap();
        assert_eq!(r.contract.class(), RetryClass::Idempotent);
        assert_eq!(r.contract.link_window_duration(), Duration::from_secs(90));
        let r = registry.resolve("list_branches", &target(), None).unwrap();
        assert_eq!(
            (r.contract.class(), r.source),
            (RetryClass::ReadOnly, ContractSource::Declared)
        );
    }

    #[test]
    fn annotations_count_only_for_trusted_servers() {
        let read_only: ToolAnnotations =
            serde_json::from_value(json!({"readOnlyHint": true})).unwrap();
        let idempotent: ToolAnnotations =
            serde_json::from_value(json!({"idempotentHint": true, "destructiveHint": false}))
                .unwrap();
        let untrusted = ContractRegistry::default();
        for a in [&read_only, &idempotent] {
            let r = untrusted.resolve("t", &target(), Some(a)).unwrap();
            assert_eq!(r.contract.class(), RetryClass::Irreversible);
        }
        let trusted = ContractRegistry::builder()
            .trust_server(target())
            .build()
            .unwrap();
        let r = trusted.resolve("t", &target(), Some(&read_only)).unwrap();
        assert_eq!(
            (r.contract.class(), r.source),
            (RetryClass::ReadOnly, ContractSource::TrustedAnnotations)
        );
        let r = trusted.resolve("t", &target(), Some(&idempotent)).unwrap();
        assert_eq!(r.contract.class(), RetryClass::Idempotent);
        // Trust is per server.
        let r = trusted
            .resolve("t", &"elsewhere/mcp".into(), Some(&read_only))
            .unwrap();
        assert_eq!(r.contract.class(), RetryClass::Irreversible);
        // Default annotations (all hints absent) mean nothing is promised.
        let r = trusted
            .resolve("t", &target(), Some(&ToolAnnotations::default()))
            .unwrap();
        assert_eq!(r.contract.class(), RetryClass::Irreversible);
    }

    #[test]
    fn strict_mode_refuses_tools_without_a_contract() {
        let registry = ContractRegistry::builder()
            .tool("deploy_release", ToolContract::irreversible())
            .trust_server(target())
            .strict(true)
            .build()
            .unwrap();
        assert!(registry.resolve("deploy_release", &target(), None).is_ok());
        let err = registry
            .resolve(
                "drop_database",
                &target(),
                Some(&ToolAnnotations {
                    read_only_hint: Some(true),
                    ..Default::default()
                }),
            )
            .unwrap_err();
        assert_eq!(err.tool, "drop_database");
        assert!(err.to_string().contains("no contract"), "{err}");
    }

    #[test]
    fn invalid_contracts_are_reported_by_build() {
        let err = ContractRegistry::builder()
            .tool(
                "t",
                ToolContract::idempotent().fingerprint(FingerprintRules::new().drop("note")),
            )
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("tools.t.fingerprint"), "{err}");
        let err = ContractRegistry::builder()
            .tool(
                "t",
                ToolContract::idempotent()
                    .link_window(Duration::from_secs(7200))
                    .retention(Duration::from_secs(60)),
            )
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("link_window"), "{err}");
    }

    const POLICY: &str = r#"
        strict = true
        trusted_servers = ["docs.internal.example/mcp"]

        [unlisted]
        link_window = "5m"

        [tools.deploy_release]
        class = "irreversible"
        link_window = "15m"
        retention = "7d"
        max_result_bytes = 65536

        [tools.deploy_release.fingerprint]
        drop = ["/note"]
        secrets = ["/approval_token"]

        [tools.list_branches]
        class = "read-only"
        keep_results = false
    "#;

    #[test]
    fn a_toml_policy_loads() {
        let registry = ContractRegistry::from_toml_str(POLICY).unwrap();
        assert!(registry.is_strict());
        let deploy = registry
            .resolve("deploy_release", &target(), None)
            .unwrap()
            .contract;
        assert_eq!(deploy.class(), RetryClass::Irreversible);
        assert_eq!(deploy.link_window_duration(), Duration::from_secs(900));
        assert_eq!(deploy.retention_duration(), Duration::from_secs(7 * 86400));
        assert_eq!(deploy.max_result_size(), 65536);
        assert_eq!(deploy.fingerprint_rules().secret_paths().count(), 1);
        let list = registry
            .resolve("list_branches", &target(), None)
            .unwrap()
            .contract;
        assert_eq!(list.class(), RetryClass::ReadOnly);
        assert!(!list.keeps_results());
        assert_eq!(registry.max_retention(), Duration::from_secs(7 * 86400));
    }

    #[test]
    fn a_json_policy_loads() {
        let registry = ContractRegistry::from_json_str(
            r#"{"tools": {"create_payment": {"class": "idempotent", "link_window": "1h", "fingerprint": {"drop": ["/memo"]}}}}"#,
        )
        .unwrap();
        let c = registry
            .resolve("create_payment", &target(), None)
            .unwrap()
            .contract;
        assert_eq!(
            (c.class(), c.link_window_duration()),
            (RetryClass::Idempotent, Duration::from_secs(3600))
        );
    }

    #[test]
    fn policy_errors_name_the_bad_key() {
        let cases = [
            (
                r#"[tools.t]
                class = "sometimes""#,
                "tools.t.class",
            ),
            (
                r#"[tools.t]
                class = "idempotent"
                link_windw = "5m""#,
                "link_windw",
            ),
            (
                r#"[tools.t]
                class = "idempotent"
                link_window = "soon""#,
                "tools.t.link_window",
            ),
            (
                r#"[tools.t]
                class = "idempotent"
                fingerprint = { drop = ["note"] }"#,
                "tools.t.fingerprint",
            ),
            (
                r#"[tools.t]
                class = "idempotent"
                fingerprint = { normalize = { "/x" = "shout" } }"#,
                "shout",
            ),
            ("strict = \"yes\"", "strict"),
            ("[tools.t]\nclass = ", "class"),
        ];
        for (text, needle) in cases {
            let err = ContractRegistry::from_toml_str(text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{needle:?} not in {err:?}");
        }
        let err = ContractRegistry::from_json_str(
            r#"{"tools": {"t": {"class": "idempotent", "retention": 5}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tools.t.retention"), "{err}");
    }

    #[test]
    fn from_path_reads_toml_and_json_and_names_the_file() {
        let dir = std::env::temp_dir().join(format!("mrg-policy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let toml_path = dir.join("policy.toml");
        std::fs::write(&toml_path, POLICY).unwrap();
        assert!(ContractRegistry::from_path(&toml_path).unwrap().is_strict());
        let json_path = dir.join("policy.json");
        std::fs::write(&json_path, r#"{"strict": true, "tools": {}}"#).unwrap();
        assert!(ContractRegistry::from_path(&json_path).unwrap().is_strict());
        let missing = ContractRegistry::from_path(dir.join("missing.toml")).unwrap_err();
        assert!(missing.to_string().contains("missing.toml"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
