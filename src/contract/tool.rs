//! The contract of one tool.

use std::{sync::Arc, time::Duration};

use super::{InvalidContract, RetryClass, StatusProbe};
use crate::fingerprint::FingerprintRules;

/// The contract of one tool.
///
/// # Defaults
///
/// Link window 10 minutes, retention 24 hours, results kept up to 1 MiB, no fingerprint rules,
/// no status probe.
///
/// # Clone
///
/// Cheap apart from the fingerprint rules; the status probe is shared (an `Arc`).
#[derive(Debug, Clone)]
pub struct ToolContract {
    pub(super) class: RetryClass,
    link_window: Duration,
    retention: Duration,
    fingerprint: FingerprintRules,
    keep_results: bool,
    max_result_bytes: usize,
    execution_id_in_meta: Option<bool>,
    pub(super) probe: Option<Arc<dyn StatusProbe>>,
    status_command: Option<Vec<String>>,
}

impl ToolContract {
    /// Default link window.
    pub const DEFAULT_LINK_WINDOW: Duration = crate::execution::DEFAULT_LINK_WINDOW;
    /// Default retention.
    pub const DEFAULT_RETENTION: Duration = crate::execution::DEFAULT_RETENTION;
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
            execution_id_in_meta: None,
            probe: None,
            status_command: None,
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

    /// Whether each dispatch of this tool also carries its key in the request's
    /// `params._meta` under [`EXECUTION_ID_META_KEY`](crate::EXECUTION_ID_META_KEY), for a
    /// target that sees no headers (a stdio server). Unset, the guard's
    /// [`execution_id_in_meta`](crate::guard::GuardLayer::execution_id_in_meta) decides;
    /// `false` keeps it out even when the guard puts it into every call.
    pub fn execution_id_in_meta(mut self, send: bool) -> Self {
        self.execution_id_in_meta = Some(send);
        self
    }

    /// What [`execution_id_in_meta`](Self::execution_id_in_meta) set, if anything.
    pub fn sends_execution_id_in_meta(&self) -> Option<bool> {
        self.execution_id_in_meta
    }

    /// The status probe that settles an unknown outcome of this (recoverable) tool.
    ///
    /// Only a [`RetryClass::Recoverable`] contract takes one:
    /// [`ContractRegistryBuilder::build`](super::ContractRegistryBuilder::build) refuses a probe
    /// on any other class, so a probe can never be silently unused. A recoverable contract
    /// without a probe is still probed when the call became an MCP task (the guard asks the
    /// target `tasks/get`); otherwise its unknown outcome waits for review.
    pub fn status_probe(mut self, probe: impl StatusProbe) -> Self {
        self.probe = Some(Arc::new(probe));
        self
    }

    /// The status probe, if the contract has one.
    pub fn probe(&self) -> Option<&Arc<dyn StatusProbe>> {
        self.probe.as_ref()
    }

    /// A program (and its arguments) an operator runs to ask whether a held execution of this
    /// tool took effect, before settling it (`replay-guard resolve --probe`): it is given the
    /// execution as JSON on stdin and answers `applied`, `not_applied` or `unknown` on its
    /// first line. The guard itself never runs it; a tool of any class may have one.
    pub fn status_command(mut self, argv: Vec<String>) -> Self {
        self.status_command = Some(argv);
        self
    }

    /// The program of [`status_command`](Self::status_command), if the contract names one.
    pub fn status_command_argv(&self) -> Option<&[String]> {
        self.status_command.as_deref()
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

    pub(super) fn check(&self, tool: &str) -> Result<(), InvalidContract> {
        self.fingerprint
            .check()
            .map_err(|e| InvalidContract(format!("tools.{tool}.fingerprint: {e}")))?;
        if self.probe.is_some() && self.class != RetryClass::Recoverable {
            return Err(InvalidContract(format!(
                "tools.{tool}: a status probe is only used by a recoverable tool, and this one is {}",
                self.class
            )));
        }
        if self.link_window > self.retention {
            return Err(InvalidContract(format!(
                "tools.{tool}: retention ({1}) is shorter than link_window ({0}); a record must outlive its window: make retention at least {0}",
                humantime::format_duration(self.link_window),
                humantime::format_duration(self.retention)
            )));
        }
        Ok(())
    }
}
