//! The marker on the host: run a command under it, read it back, and the status probe.

use async_trait::async_trait;
use serde_json::{Value, json};

use super::{SshConfig, SshError, SshSession, quote::sh_join, session::Exec};
use crate::{
    ExecutionId,
    contract::{ProbeOutcome, ProbeRequest, StatusProbe},
};

/// The wrapper sent with every marked command (`sh -c`), a POSIX `sh` script.
const WRAPPER: &str = include_str!("marker.sh");

/// How much of stdout and of stderr the marker keeps by default: 64 KiB each.
pub const DEFAULT_MAX_OUTPUT: u64 = 64 * 1024;

/// The most [`MarkedCommand::max_output`] accepts: 32 MiB each of stdout and stderr (a record is
/// read back whole, into memory).
pub const MAX_OUTPUT_LIMIT: u64 = 32 << 20;

/// A command to run under a marker: the command line, where, and where markers live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkedCommand {
    command: String,
    cwd: Option<String>,
    state_dir: Option<String>,
    max_output: u64,
}

impl MarkedCommand {
    /// `command`, run by `sh -c` on the host.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            cwd: None,
            state_dir: None,
            max_output: DEFAULT_MAX_OUTPUT,
        }
    }

    /// Run in this working directory (it must exist, or nothing runs).
    pub fn cwd(mut self, dir: impl Into<String>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Keep markers under this directory on the host instead of
    /// `$HOME/.mcp-replay-guard/markers`. A probe must be given the same directory.
    pub fn state_dir(mut self, dir: impl Into<String>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Keep at most this many bytes of stdout and of stderr (the digests cover all of it),
    /// up to [`MAX_OUTPUT_LIMIT`].
    pub fn max_output(mut self, bytes: u64) -> Self {
        self.max_output = bytes.min(MAX_OUTPUT_LIMIT);
        self
    }

    /// The command line.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// The working directory, if set.
    pub fn working_directory(&self) -> Option<&str> {
        self.cwd.as_deref()
    }
}

/// A finished execution as its marker records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarkerRecord {
    /// The wrapper's pid on the host.
    pub pid: Option<u32>,
    /// The command's pid on the host.
    pub child: Option<u32>,
    /// When the wrapper started the command (Unix seconds, the host's clock).
    pub started_at: Option<u64>,
    /// When it ended.
    pub ended_at: Option<u64>,
    /// The command's exit status (128 + n when signal n ended it).
    pub exit_status: i32,
    /// SHA256 (hex) of all of stdout, or `unavailable` when the host has no sha256 tool.
    pub stdout_sha256: String,
    /// SHA256 (hex) of all of stderr.
    pub stderr_sha256: String,
    /// How many bytes the command wrote to stdout.
    pub stdout_bytes: u64,
    /// How many bytes the command wrote to stderr.
    pub stderr_bytes: u64,
    /// Stdout, kept up to the bound.
    pub stdout: Vec<u8>,
    /// Stderr, kept up to the bound.
    pub stderr: Vec<u8>,
}

impl MarkerRecord {
    /// The record as an MCP `CallToolResult`: stdout as text content, `isError` when the exit
    /// status is not 0, everything in `structuredContent`.
    pub fn to_call_tool_result(&self) -> Value {
        let stdout = String::from_utf8_lossy(&self.stdout);
        let stderr = String::from_utf8_lossy(&self.stderr);
        json!({
            "content": [{"type": "text", "text": stdout}],
            "isError": self.exit_status != 0,
            "structuredContent": {
                "exit_status": self.exit_status,
                "stdout": stdout,
                "stderr": stderr,
                "stdout_sha256": self.stdout_sha256,
                "stderr_sha256": self.stderr_sha256,
                "stdout_bytes": self.stdout_bytes,
                "stderr_bytes": self.stderr_bytes,
                "stdout_truncated": (self.stdout.len() as u64) < self.stdout_bytes,
                "stderr_truncated": (self.stderr.len() as u64) < self.stderr_bytes,
                "started_at": self.started_at,
                "ended_at": self.ended_at,
            }
        })
    }
}

/// What the marker of one execution says.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MarkerStatus {
    /// No marker: the command never started under this execution ID.
    Absent,
    /// The marker directory exists but `started` was never written: the wrapper died right
    /// after the claim, or is about to write it. The command did not start yet, but may.
    Claimed,
    /// Started, and the wrapper or the command is still alive (`kill -0`).
    Running {
        /// The wrapper's pid.
        pid: Option<u32>,
        /// The command's pid.
        child: Option<u32>,
    },
    /// Started, no exit recorded, and neither process is alive: it may or may not have done
    /// its work.
    Gone {
        /// The wrapper's pid.
        pid: Option<u32>,
        /// The command's pid.
        child: Option<u32>,
    },
    /// The exit status is recorded.
    Exited(MarkerRecord),
    /// Neither a marker nor its absence can be read: the state directory is not under the
    /// account's sole control (another account owns it or may write it, it is shared, it has
    /// an access control list) or it cannot be read and searched. A marker there may have been
    /// moved away after its command ran, so no marker proves nothing.
    Unverifiable {
        /// What the wrapper found.
        reason: String,
    },
}

impl MarkerStatus {
    /// The status as a probe's answer: absent → not applied (safe to send); running → in
    /// progress; exited → applied, with the record as the result; claimed, gone or
    /// unverifiable → unknown.
    pub fn to_probe_outcome(&self) -> ProbeOutcome {
        match self {
            Self::Absent => ProbeOutcome::NotApplied,
            Self::Claimed => ProbeOutcome::Unknown {
                reason: "the marker was claimed but its start was never recorded".to_owned(),
            },
            Self::Running { .. } => ProbeOutcome::InProgress,
            Self::Gone { pid, child } => ProbeOutcome::Unknown {
                reason: format!(
                    "the command started (wrapper pid {}, command pid {}) and its process is gone \
                     without a recorded exit status",
                    show(*pid),
                    show(*child)
                ),
            },
            Self::Exited(record) => ProbeOutcome::Applied {
                result: Some(record.to_call_tool_result()),
            },
            Self::Unverifiable { reason } => ProbeOutcome::Unknown {
                reason: format!("the marker cannot be read as present or absent: {reason}"),
            },
        }
    }
}

fn show(pid: Option<u32>) -> String {
    pid.map_or_else(|| "unknown".to_owned(), |p| p.to_string())
}

/// Run `command` on the host under the marker of `execution_id`.
///
/// The wrapper claims the marker (`mkdir`), records `started`, runs the command, then records
/// the exit status, the digests and the kept output, and sends the record back.
///
/// # Errors
///
/// [`SshError::is_not_started`] holds when the command did not run because of this call: the
/// state directory is not writable or not under the account's sole control
/// ([`SshError::StateDirUnsafe`]), the working directory is missing, or the marker already
/// exists ([`SshError::AlreadyStarted`]: another run of this execution claimed it; probe
/// it). [`SshError::OutcomeUnknown`] means the command was sent and its end was not seen: the
/// command may still be running on the host; read the marker ([`read_marker`]) before sending
/// anything again.
pub async fn run_marked(
    session: &SshSession,
    execution_id: ExecutionId,
    command: &MarkedCommand,
) -> Result<MarkerRecord, SshError> {
    let id = execution_id.to_string();
    let max = command.max_output.to_string();
    let line = wrapper_line(&[
        "run",
        command.state_dir.as_deref().unwrap_or(""),
        &id,
        command.cwd.as_deref().unwrap_or(""),
        &max,
        &command.command,
    ])?;
    let mut channel = session.open().await.map_err(SshError::Channel)?;
    let mut exec = Exec::default();
    let sent = SshSession::exec(&mut channel, line, &mut exec).await;
    let answer = parse_answer(&exec.stdout);
    match (answer, sent) {
        (Ok(Answer::Refused(refusal)), _) => Err(refusal.into_error(execution_id)),
        (Ok(Answer::Started(Some(MarkerStatus::Exited(record)))), _) => Ok(record),
        (answer, sent) => Err(SshError::OutcomeUnknown {
            started: matches!(answer, Ok(Answer::Started(_))),
            message: match sent {
                Err(e) => e.to_string(),
                Ok(()) if exec.overflowed => "the answer passed the size bound".to_owned(),
                Ok(()) => format!(
                    "the wrapper's answer ended early (exit status {})",
                    exec.exit_status
                        .map_or_else(|| "none".to_owned(), |s| s.to_string())
                ),
            },
        }),
    }
}

/// Read the marker of `execution_id` under `state_dir` (`None`: the default directory). Sends
/// nothing but the read.
pub async fn read_marker(
    session: &SshSession,
    execution_id: ExecutionId,
    state_dir: Option<&str>,
) -> Result<MarkerStatus, SshError> {
    let id = execution_id.to_string();
    let line = wrapper_line(&["status", state_dir.unwrap_or(""), &id])?;
    let mut channel = session.open().await.map_err(SshError::Channel)?;
    let mut exec = Exec::default();
    SshSession::exec(&mut channel, line, &mut exec)
        .await
        .map_err(SshError::Channel)?;
    match parse_answer(&exec.stdout)? {
        Answer::Status(status) => Ok(status),
        _ => Err(SshError::Protocol(
            String::from_utf8_lossy(&exec.stdout).into_owned(),
        )),
    }
}

fn wrapper_line(args: &[&str]) -> Result<String, SshError> {
    let mut words = vec!["sh", "-c", WRAPPER, "mcp-replay-guard"];
    words.extend_from_slice(args);
    sh_join(words).map_err(|_| SshError::Unquotable)
}

/// The status probe of a tool that runs its command with [`run_marked`]: it connects (a fresh
/// connection each time: the one that broke is gone) and reads the marker of the execution.
#[derive(Debug, Clone)]
pub struct MarkerProbe {
    config: SshConfig,
    state_dir: Option<String>,
}

impl MarkerProbe {
    /// Probe markers on the host `config` connects to, in the default state directory.
    pub fn new(config: SshConfig) -> Self {
        Self {
            config,
            state_dir: None,
        }
    }

    /// Read markers under this state directory (the one the commands were run with).
    pub fn state_dir(mut self, dir: impl Into<String>) -> Self {
        self.state_dir = Some(dir.into());
        self
    }

    /// Connect and read the marker of `execution_id`.
    pub async fn status(&self, execution_id: ExecutionId) -> Result<MarkerStatus, SshError> {
        let session = self.config.connect().await?;
        let status = read_marker(&session, execution_id, self.state_dir.as_deref()).await;
        session.disconnect().await;
        status
    }
}

#[async_trait]
impl StatusProbe for MarkerProbe {
    async fn probe(&self, request: ProbeRequest<'_>) -> ProbeOutcome {
        match self.status(request.execution.execution_id).await {
            Ok(status) => status.to_probe_outcome(),
            // No answer from the host is not "not applied": the execution waits for review.
            Err(e) => ProbeOutcome::Unknown {
                reason: format!("the marker could not be read: {e}"),
            },
        }
    }
}

/// Why the wrapper did not run the command.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    Exists,
    Unwritable(String),
    Unsafe(String),
    NoCwd(String),
    Error(String),
}

impl Refusal {
    fn into_error(self, execution_id: ExecutionId) -> SshError {
        match self {
            Self::Exists => SshError::AlreadyStarted(execution_id),
            Self::Unwritable(dir) => SshError::StateDirUnwritable(dir),
            Self::Unsafe(reason) => SshError::StateDirUnsafe(reason),
            Self::NoCwd(dir) => SshError::NoWorkingDirectory(dir),
            Self::Error(message) => SshError::Protocol(message),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// `run` started the command; the report that follows, if it arrived whole.
    Started(Option<MarkerStatus>),
    Refused(Refusal),
    Status(MarkerStatus),
}

/// Parse the wrapper's stdout: `MRG <word> …` lines, `key=value` fields, then after `--` the
/// kept stdout and stderr, raw.
fn parse_answer(out: &[u8]) -> Result<Answer, SshError> {
    let protocol = || SshError::Protocol(String::from_utf8_lossy(out).chars().take(200).collect());
    let (first, rest) = split_line(out).ok_or_else(protocol)?;
    let first = std::str::from_utf8(first).map_err(|_| protocol())?;
    let (word, arg) = first
        .strip_prefix("MRG ")
        .map(|w| w.split_once(' ').unwrap_or((w, "")))
        .ok_or_else(protocol)?;
    match word {
        "started" => Ok(Answer::Started(parse_report(rest).ok())),
        "exists" => Ok(Answer::Refused(Refusal::Exists)),
        "unwritable" => Ok(Answer::Refused(Refusal::Unwritable(arg.to_owned()))),
        "unsafe" => Ok(Answer::Refused(Refusal::Unsafe(arg.to_owned()))),
        "nocwd" => Ok(Answer::Refused(Refusal::NoCwd(arg.to_owned()))),
        "error" => Ok(Answer::Refused(Refusal::Error(arg.to_owned()))),
        _ => parse_report(out)
            .map(Answer::Status)
            .map_err(|_| protocol()),
    }
}

fn split_line(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = bytes.iter().position(|&b| b == b'\n')?;
    Some((&bytes[..end], &bytes[end + 1..]))
}

/// A report: `MRG none|claimed|running|gone|exited|unknown`, fields, and for `exited` the
/// output.
fn parse_report(out: &[u8]) -> Result<MarkerStatus, ()> {
    let (first, mut rest) = split_line(out).ok_or(())?;
    if let Some(reason) = first.strip_prefix(b"MRG unknown") {
        return Ok(MarkerStatus::Unverifiable {
            reason: String::from_utf8_lossy(reason).trim().to_owned(),
        });
    }
    let mut fields = Vec::new();
    let mut body = None;
    while let Some((line, after)) = split_line(rest) {
        rest = after;
        if line == b"--" {
            body = Some(after);
            break;
        }
        let line = std::str::from_utf8(line).map_err(|_| ())?;
        if let Some((k, v)) = line.split_once('=') {
            fields.push((k.to_owned(), v.to_owned()));
        }
    }
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let num = |key: &str| get(key).and_then(|v| v.trim().parse::<u64>().ok());
    let pid = |key: &str| get(key).and_then(|v| v.trim().parse::<u32>().ok());
    match first {
        b"MRG none" => Ok(MarkerStatus::Absent),
        b"MRG claimed" => Ok(MarkerStatus::Claimed),
        b"MRG running" => Ok(MarkerStatus::Running {
            pid: pid("pid"),
            child: pid("child"),
        }),
        b"MRG gone" => Ok(MarkerStatus::Gone {
            pid: pid("pid"),
            child: pid("child"),
        }),
        b"MRG exited" => {
            let body = body.ok_or(())?;
            let kept_out = usize::try_from(num("stdout_kept").ok_or(())?).map_err(|_| ())?;
            let kept_err = usize::try_from(num("stderr_kept").ok_or(())?).map_err(|_| ())?;
            if body.len() != kept_out.checked_add(kept_err).ok_or(())? {
                return Err(());
            }
            let (stdout, stderr) = body.split_at(kept_out);
            Ok(MarkerStatus::Exited(MarkerRecord {
                pid: pid("pid"),
                child: pid("child"),
                started_at: num("time"),
                ended_at: num("ended"),
                exit_status: get("status")
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or(())?,
                stdout_sha256: get("stdout_sha256").unwrap_or("").to_owned(),
                stderr_sha256: get("stderr_sha256").unwrap_or("").to_owned(),
                stdout_bytes: num("stdout_bytes").unwrap_or(0),
                stderr_bytes: num("stderr_bytes").unwrap_or(0),
                stdout: stdout.to_vec(),
                stderr: stderr.to_vec(),
            }))
        }
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// The wrapper run by the local `sh`, as the host would run it.
    fn wrapper(args: &[&str]) -> Vec<u8> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(WRAPPER)
            .arg("mcp-replay-guard")
            .args(args)
            .output()
            .unwrap();
        out.stdout
    }

    /// A fresh directory only this account may write (whatever the umask), as a state
    /// directory must be.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mrg-marker-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn a_state_dir_others_may_write_is_refused_and_reads_unverifiable() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("shared");
        let state = dir.join("markers");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o770)).unwrap();
        let flag = dir.join("ran");
        let cmd = format!("touch {}", flag.display());
        let out = wrapper(&["run", state.to_str().unwrap(), "act_01X", "", "9", &cmd]);
        let Answer::Refused(Refusal::Unsafe(reason)) = parse_answer(&out).unwrap() else {
            panic!("{}", String::from_utf8_lossy(&out));
        };
        assert!(reason.contains("writable by other accounts"), "{reason}");
        assert!(!flag.exists());
        let SshError::StateDirUnsafe(why) = Refusal::Unsafe(reason).into_error(ExecutionId::new())
        else {
            panic!("not StateDirUnsafe");
        };
        assert!(why.contains(state.to_str().unwrap()), "{why}");

        let out = wrapper(&["status", state.to_str().unwrap(), "act_01X"]);
        let Answer::Status(status @ MarkerStatus::Unverifiable { .. }) =
            parse_answer(&out).unwrap()
        else {
            panic!("{}", String::from_utf8_lossy(&out));
        };
        assert!(matches!(
            status.to_probe_outcome(),
            ProbeOutcome::Unknown { .. }
        ));
    }

    #[test]
    fn a_run_records_status_digests_and_bounded_output() {
        let dir = temp_dir("run");
        let state = dir.join("markers");
        let out = wrapper(&[
            "run",
            state.to_str().unwrap(),
            "act_01TEST",
            "/",
            "5",
            "printf 'hello world'; printf oops >&2; exit 3",
        ]);
        let Answer::Started(Some(MarkerStatus::Exited(record))) = parse_answer(&out).unwrap()
        else {
            panic!("{}", String::from_utf8_lossy(&out));
        };
        assert_eq!(record.exit_status, 3);
        assert_eq!(record.stdout, b"hello");
        assert_eq!(record.stdout_bytes, 11);
        assert_eq!(record.stderr, b"oops");
        assert_eq!(
            record.stdout_sha256,
            "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9"
        );
        let result = record.to_call_tool_result();
        assert_eq!(result["isError"], true);
        assert_eq!(result["structuredContent"]["stdout_truncated"], true);

        // The same execution again: refused by the marker, nothing run.
        let again = wrapper(&[
            "run",
            state.to_str().unwrap(),
            "act_01TEST",
            "",
            "5",
            "exit 9",
        ]);
        assert_eq!(
            parse_answer(&again).unwrap(),
            Answer::Refused(Refusal::Exists)
        );
        let status = parse_answer(&wrapper(&["status", state.to_str().unwrap(), "act_01TEST"]));
        assert!(
            matches!(status, Ok(Answer::Status(MarkerStatus::Exited(r))) if r.exit_status == 3)
        );
        let none = parse_answer(&wrapper(&[
            "status",
            state.to_str().unwrap(),
            "act_01OTHER",
        ]));
        assert_eq!(none.unwrap(), Answer::Status(MarkerStatus::Absent));
    }

    #[test]
    fn binary_output_with_newlines_and_dashes_survives() {
        let dir = temp_dir("binary");
        let out = wrapper(&[
            "run",
            dir.to_str().unwrap(),
            "act_01BIN",
            "",
            "100",
            "printf -- '--\\nMRG none\\n\\001\\377'",
        ]);
        let Answer::Started(Some(MarkerStatus::Exited(record))) = parse_answer(&out).unwrap()
        else {
            panic!("{}", String::from_utf8_lossy(&out));
        };
        assert_eq!(record.stdout, b"--\nMRG none\n\x01\xff");
    }

    #[test]
    fn refusals_run_nothing() {
        let dir = temp_dir("refuse");
        let file = dir.join("file");
        std::fs::write(&file, "").unwrap();
        let flag = dir.join("ran");
        let cmd = format!("touch {}", flag.display());
        let state = file.join("markers");
        let out = wrapper(&["run", state.to_str().unwrap(), "act_01X", "", "9", &cmd]);
        assert!(matches!(
            parse_answer(&out).unwrap(),
            Answer::Refused(Refusal::Unwritable(_))
        ));
        let out = wrapper(&[
            "run",
            dir.to_str().unwrap(),
            "act_01X",
            "/nonexistent-dir",
            "9",
            &cmd,
        ]);
        assert!(matches!(
            parse_answer(&out).unwrap(),
            Answer::Refused(Refusal::NoCwd(_))
        ));
        let out = wrapper(&["run", dir.to_str().unwrap(), "act_../x", "", "9", &cmd]);
        assert!(matches!(
            parse_answer(&out).unwrap(),
            Answer::Refused(Refusal::Error(_))
        ));
        assert!(!flag.exists());
    }

    #[test]
    fn a_claim_without_a_start_is_claimed_and_a_dead_start_is_gone() {
        let dir = temp_dir("claimed");
        // The wrapper killed between `mkdir` and writing `started`.
        std::fs::create_dir_all(dir.join("act_01CLAIM")).unwrap();
        let out = wrapper(&["status", dir.to_str().unwrap(), "act_01CLAIM"]);
        assert_eq!(
            parse_answer(&out).unwrap(),
            Answer::Status(MarkerStatus::Claimed)
        );
        // Killed after `started`: pids that are not alive, no exit.
        let marker = dir.join("act_01GONE");
        std::fs::create_dir_all(&marker).unwrap();
        std::fs::write(marker.join("started"), "pid=999999999\ntime=1\n").unwrap();
        let out = wrapper(&["status", dir.to_str().unwrap(), "act_01GONE"]);
        let status = parse_answer(&out).unwrap();
        assert_eq!(
            status,
            Answer::Status(MarkerStatus::Gone {
                pid: Some(999_999_999),
                child: None
            })
        );
    }

    #[tokio::test]
    async fn a_probe_that_cannot_reach_the_host_says_unknown_never_not_applied() {
        use crate::execution::{RetryClass, fixtures};
        let record = fixtures::accepted(&fixtures::claim(RetryClass::Recoverable, "me"));
        let arguments = serde_json::Map::new();
        // Port 1 on 127.0.0.1: nothing listens; and no client key either.
        let config = SshConfig::new(
            "127.0.0.1",
            1,
            "nobody",
            crate::integrations::ssh::HostKeyPin::fingerprint("SHA256:x"),
        );
        let outcome = MarkerProbe::new(config)
            .probe(ProbeRequest {
                execution: &record,
                arguments: &arguments,
            })
            .await;
        assert!(
            matches!(outcome, ProbeOutcome::Unknown { .. }),
            "{outcome:?}"
        );
    }

    #[test]
    fn max_output_is_bounded() {
        assert_eq!(
            MarkedCommand::new("x").max_output(u64::MAX).max_output,
            MAX_OUTPUT_LIMIT
        );
    }

    #[test]
    fn a_truncated_report_is_not_a_record() {
        let out = b"MRG started 1\nMRG exited\nstatus=0\nstdout_kept=5\nstderr_kept=0\n--\nab";
        assert_eq!(parse_answer(out).unwrap(), Answer::Started(None));
        assert!(parse_answer(b"").is_err());
        assert!(parse_answer(b"garbage\n").is_err());
    }

    #[test]
    fn statuses_map_onto_probe_outcomes() {
        assert_eq!(
            MarkerStatus::Absent.to_probe_outcome(),
            ProbeOutcome::NotApplied
        );
        assert_eq!(
            MarkerStatus::Running {
                pid: Some(1),
                child: None
            }
            .to_probe_outcome(),
            ProbeOutcome::InProgress
        );
        assert!(matches!(
            MarkerStatus::Gone {
                pid: Some(1),
                child: Some(2)
            }
            .to_probe_outcome(),
            ProbeOutcome::Unknown { .. }
        ));
        assert!(matches!(
            MarkerStatus::Claimed.to_probe_outcome(),
            ProbeOutcome::Unknown { .. }
        ));
    }
}
