//! Remote commands over SSH under a durable marker on the host (feature `ssh`).
//!
//! A tool that ends in a remote command has a worse failure than a lost HTTP response: when
//! the connection breaks after the remote shell started the command, the command may go on
//! after the local process is gone. Without something on the host that remembers, the only
//! honest class for such a tool is irreversible. With a marker it can be recoverable:
//!
//! 1. [`run_marked`] sends the command with a small POSIX `sh` wrapper (`marker.sh` in this
//!    crate, sent with every command: nothing to install on the host). The wrapper claims
//!    `<state dir>/<execution id>` with `mkdir` (atomic; a second run of the same execution is
//!    refused), records `started` with its pid and the time, runs the command, then records
//!    the exit status, the time, the SHA256 digests of stdout and stderr, and the output up to
//!    a bound ([`MarkedCommand::max_output`]). The state directory is
//!    `$HOME/.mcp-replay-guard/markers` unless [`MarkedCommand::state_dir`] says otherwise;
//!    one the account cannot write, or does not control alone, is an error before the command
//!    runs (below).
//! 2. On reconnect, [`MarkerProbe`] (a [`StatusProbe`](crate::contract::StatusProbe) for
//!    `ToolContract::recoverable().status_probe(..)`) reads the marker before anything is
//!    sent: no marker → not applied (safe to send); started and its process alive → in
//!    progress; started, process gone, no exit recorded → unknown (the execution waits for
//!    review); exit recorded → applied, with the exit status and kept output as the result;
//!    a state directory the account does not control alone → unknown
//!    ([`MarkerStatus::Unverifiable`]).
//! 3. [`SshSession::channel`] is the action record's [`Channel::Ssh`](crate::fingerprint::Channel):
//!    the host is identified by its host key's SHA256 fingerprint, as OpenSSH prints it, not by
//!    the name typed.
//!
//! ```no_run
//! use mcp_replay_guard::{
//!     ExecutionId,
//!     contract::{ContractRegistry, ToolContract},
//!     integrations::ssh::{HostKeyPin, MarkedCommand, MarkerProbe, SshConfig, run_marked},
//! };
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let config = SshConfig::new(
//!     "db1.example.net",
//!     22,
//!     "deploy",
//!     HostKeyPin::fingerprint("SHA256:uaC3p9p25xHCp/Z2bAXsE7M6pW9Bia2RuyaPtRzcFfQ"),
//! )
//! .private_key_file("/etc/mcp/deploy_ed25519")?;
//!
//! // The client side: the tool is recoverable, and the marker is its status probe.
//! let contracts = ContractRegistry::builder()
//!     .tool(
//!         "restart_service",
//!         ToolContract::recoverable().status_probe(MarkerProbe::new(config.clone())),
//!     )
//!     .build()?;
//!
//! // The tool's body: the execution ID of the call, and the command under its marker.
//! let execution_id: ExecutionId = "act_01KBD3M4000000000000000000".parse()?;
//! let session = config.connect().await?;
//! let command = MarkedCommand::new("systemctl restart x").cwd("/srv");
//! let fingerprint_channel = session.channel(&command); // host key, account, command, cwd
//! match run_marked(&session, execution_id, &command).await {
//!     Ok(record) => println!("exit status {}", record.exit_status),
//!     Err(e) if e.is_outcome_unknown() => { /* read the marker before anything else */ }
//!     Err(e) => return Err(e.into()),
//! }
//! # let _ = (contracts, fingerprint_channel);
//! # Ok(())
//! # }
//! ```
//!
//! # Host keys
//!
//! The client is [russh](https://docs.rs/russh). Its `Handler::check_server_key` is the only
//! thing between this crate and a man in the middle, who would receive the command, could
//! answer any marker read with "not applied" and so make the guard send the action again. So
//! the handler here accepts exactly the key the caller pinned ([`HostKeyPin`]: a fingerprint,
//! a public key, or a `known_hosts` file); any other key, and any host certificate, is
//! [`SshError::HostKeyMismatch`] before anything is sent. There is no "accept on first use"
//! and no switch to skip the check.
//!
//! # Who controls the state directory
//!
//! "No marker" sends the command again, so it must mean the command never ran, not that a
//! marker was moved away. The wrapper says "no marker" only for a state directory that the
//! account owns, that no other account can write (no group or other write bit, not sticky, no
//! access control list), that its owner bits let it read and search, and whose whole listing
//! was read without error and does not hold the execution. A state directory that does not
//! exist says "no marker" only when its nearest existing parent is the account's or root's
//! and no other account can remove an entry from it (no group or other write bit, or sticky),
//! and that parent's listing holds no entry on the way to it. Anything else (a directory
//! another account owns, a shared `1777` one, one made unreadable, a listing that fails with
//! `EACCES`, `ESTALE`, `EIO`) is [`MarkerStatus::Unverifiable`]: the probe answers unknown and
//! the execution waits for review. A run in such a directory is refused
//! ([`SshError::StateDirUnsafe`]) and nothing starts. Ownership decides, not access: root can
//! read any directory, and a directory another account owns is still refused.
//!
//! # Marker retention
//!
//! A marker removed while the ledger still keeps its execution reads "no marker", and a
//! repeat of that execution runs the command again. Markers are never removed by the crate;
//! when you clean `<state dir>`, remove only markers older than the ledger's retention of the
//! execution plus the longest a call can run: marker retention must outlast the ledger's.
//!
//! # What is not covered
//!
//! - The liveness check is `kill -0` on the recorded pids: a pid reused by an unrelated
//!   process after a reboot reads as "in progress" until that process ends.
//! - The remote login shell parses the command line the crate sends (single-quoted words):
//!   it must be a POSIX-family shell (`sh`, `bash`, `dash`, `zsh`, `ksh`), not `csh` or `fish`.
//! - Output is written to the marker in full while the command runs and cut to the bound when
//!   it ends (the digests cover all of it), so a command that prints gigabytes uses that much
//!   disk for a while. `head -c` and one of `sha256sum`, `shasum` or `openssl` are used; without
//!   a digest tool the digest reads `unavailable`.
//! - Markers are never removed by the crate; clean `<state dir>` only past the ledger's
//!   retention (above).
//! - The directories above the state directory are not checked, except the nearest existing
//!   parent of one that does not exist yet: keep them writable by the account and root only,
//!   as OpenSSH asks of `~/.ssh`.

mod marker;
mod quote;
mod session;

pub use marker::{
    DEFAULT_MAX_OUTPUT, MAX_OUTPUT_LIMIT, MarkedCommand, MarkerProbe, MarkerRecord, MarkerStatus,
    read_marker, run_marked,
};
pub use quote::{UnquotableWord, sh_quote};
pub use session::{HostKeyPin, SshConfig, SshSession};

use crate::ExecutionId;

/// Why an SSH operation failed, and whether the command may have run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SshError {
    /// A key could not be read or parsed.
    #[error("ssh: cannot use {what}: {message}")]
    Key {
        /// Which key.
        what: String,
        /// Why.
        message: String,
    },
    /// The host presented a key other than the pinned one. Nothing was sent.
    #[error(
        "ssh: the host key of {host} does not match the pin (expected {expected}, presented {presented}): {reason}"
    )]
    HostKeyMismatch {
        /// `host:port` as configured.
        host: String,
        /// The pin.
        expected: String,
        /// The presented key's SHA256 fingerprint.
        presented: String,
        /// Why it was refused.
        reason: String,
    },
    /// The connection or authentication failed before any command was sent.
    #[error("ssh: connecting to {host}: {message}")]
    Connect {
        /// `host:port`.
        host: String,
        /// What failed.
        message: String,
    },
    /// The server refused the key for this account.
    #[error("ssh: the server refused public key authentication for {account}")]
    AuthRejected {
        /// The account.
        account: String,
    },
    /// A session channel could not be opened or used before the command was sent.
    #[error("ssh: channel: {0}")]
    Channel(#[source] russh::Error),
    /// The state directory cannot be written by the account; the command was not run.
    #[error("ssh: the marker state directory {0} is not writable; the command was not run")]
    StateDirUnwritable(String),
    /// The state directory is not under the account's sole control (another account owns it
    /// or may write it, it is shared or cannot be read), so its marker could be moved away
    /// after the command ran and read as "not applied"; the command was not run.
    #[error(
        "ssh: the marker state directory is not under this account's sole control ({0}); the \
         command was not run: use a directory the account owns that no other account can write"
    )]
    StateDirUnsafe(String),
    /// The working directory does not exist; the command was not run.
    #[error("ssh: the working directory {0} does not exist; the command was not run")]
    NoWorkingDirectory(String),
    /// The marker of this execution already exists: another run claimed it, so this one did
    /// not run the command. Read the marker for its outcome.
    #[error("ssh: execution {0} already has a marker on the host; the command was not run again")]
    AlreadyStarted(ExecutionId),
    /// The command was sent and its end was not seen (the connection broke, or the answer was
    /// cut). It may be running or have run: read the marker before sending anything again.
    #[error("ssh: the outcome of the command is unknown (wrapper started: {started}): {message}")]
    OutcomeUnknown {
        /// Whether the wrapper said it started the command before the answer stopped.
        started: bool,
        /// What was seen.
        message: String,
    },
    /// The wrapper answered something this crate does not understand.
    #[error("ssh: unexpected answer from the marker wrapper: {0:?}")]
    Protocol(String),
    /// The command or a path holds a NUL byte, which no shell word can carry.
    #[error("ssh: the command or a path contains a NUL byte")]
    Unquotable,
}

impl SshError {
    /// The command did not run because of this call: nothing was sent, or the wrapper refused
    /// before starting it. (For [`AlreadyStarted`](Self::AlreadyStarted) another run may have
    /// run it.)
    pub fn is_not_started(&self) -> bool {
        !matches!(self, Self::OutcomeUnknown { .. } | Self::Protocol(_))
    }

    /// The command was sent and may have run: probe the marker.
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, Self::OutcomeUnknown { .. })
    }

    /// The host key did not match the pin.
    pub fn is_host_key_mismatch(&self) -> bool {
        matches!(self, Self::HostKeyMismatch { .. })
    }

    /// The marker of this execution already existed.
    pub fn is_already_started(&self) -> bool {
        matches!(self, Self::AlreadyStarted(_))
    }

    /// The state directory could not be written.
    pub fn is_state_dir_unwritable(&self) -> bool {
        matches!(self, Self::StateDirUnwritable(_))
    }

    /// The state directory is not under the account's sole control.
    pub fn is_state_dir_unsafe(&self) -> bool {
        matches!(self, Self::StateDirUnsafe(_))
    }
}
