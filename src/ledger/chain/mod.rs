//! The tamper-evident form of the ledger: every event is a line that carries `seq`, `prev`
//! (the hash of the line before it) and `hash`.
//!
//! # What the hash covers
//!
//! `hash` is the SHA-256 of the line's own bytes with its `"hash":"…",` member taken out: the
//! line exactly as the writer serialises it, `{"seq":…,"prev":"…",<the body>}`. A reader accepts
//! a line only when its text is, byte for byte, what this build writes for the value it holds,
//! so every byte is covered: an extra (unknown) field, another key order, other spacing, another
//! spelling of a number (`1` for `1.0`, an integer past 2^53 that `f64` or RFC 8785 would round)
//! all fail as [`ChainProblem::Edited`]. Numbers in a kept result stay as written (`serde_json`
//! with `float_roundtrip`), so an honest line always reads back to its own bytes. `seq` and
//! `prev` make a deleted, inserted or reordered line visible; a checkpoint (the first line of a
//! compacted file) names the archive that holds the lines before it, and
//! [`verify_file`](super::verify_file) follows it (see [`verify_file_anchored`](super::verify_file_anchored)).
//!
//! Durable ledgers (the file ledger, the PostgreSQL ledger) store these lines; [`verify`] checks
//! any sequence of them and names the first bad `seq` and why; [`Verifier`] checks several
//! files as one chain, and against an anchored [`ChainHead`].
//!
//! # What the chain cannot prove without an anchor
//!
//! The chain is not keyed: anyone who can rewrite the whole file (or table) can rewrite every
//! line after an edit and re-seal it, and the result verifies. Cutting lines off the end leaves
//! a shorter chain that verifies too. Both are visible only against a head recorded somewhere
//! the attacker cannot rewrite: `replay-guard audit head` prints the head (`SEQ:sha256:HEX`),
//! the guard logs it (tracing, level `info`, fields `seq` and `hash`) when a ledger opens and
//! every [`HEAD_LOG_EVERY`] lines, and `replay-guard audit verify --expect-head SEQ:HASH` proves
//! the ledger still holds that head (line `SEQ` has that hash, and the chain verifies through
//! it). Lines appended after the last anchor can still be cut or re-sealed unnoticed: anchor
//! as often as that matters. Nor does the chain say anything about a file replaced as a whole
//! by an older copy of itself, other than that its head is older than an anchor.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::LedgerEvent;

/// How many lines pass between two logs of the head (besides the one when a ledger opens).
pub const HEAD_LOG_EVERY: u64 = 1_000;

/// A chain hash: `sha256:<64 hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChainHash([u8; 32]);

impl ChainHash {
    /// The `prev` of the first line of a chain.
    pub const GENESIS: Self = Self([0; 32]);
}

impl fmt::Display for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", hex::encode(self.0))
    }
}

impl fmt::Debug for ChainHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHash({self})")
    }
}

/// Text that is not `sha256:` followed by 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid chain hash: expected `sha256:` followed by 64 hex digits")]
pub struct InvalidChainHash;

impl std::str::FromStr for ChainHash {
    type Err = InvalidChainHash;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = s.strip_prefix("sha256:").ok_or(InvalidChainHash)?;
        let mut bytes = [0; 32];
        hex::decode_to_slice(digits, &mut bytes).map_err(|_| InvalidChainHash)?;
        Ok(Self(bytes))
    }
}

crate::serde_display_fromstr!(ChainHash);

/// A position in a chain: a line's `seq` and its hash, written `SEQ:sha256:HEX` (`0:` and the
/// genesis hash for an empty chain). Recorded outside the ledger, it is an anchor that a later
/// [`Verifier::expect`] (`replay-guard audit verify --expect-head`) checks.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ChainHead {
    /// The line's `seq`.
    pub seq: u64,
    /// The line's hash.
    pub hash: ChainHash,
}

impl ChainHead {
    /// The head of an empty chain.
    pub const GENESIS: Self = Self {
        seq: 0,
        hash: ChainHash::GENESIS,
    };
}

impl From<(u64, ChainHash)> for ChainHead {
    fn from((seq, hash): (u64, ChainHash)) -> Self {
        Self { seq, hash }
    }
}

impl fmt::Display for ChainHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.seq, self.hash)
    }
}

impl fmt::Debug for ChainHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChainHead({self})")
    }
}

/// Text that is not `SEQ:sha256:HEX`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid chain head: expected SEQ:sha256:HEX (a line number, `:`, then `sha256:` and 64 hex \
     digits), as `replay-guard audit head` prints it"
)]
pub struct InvalidChainHead;

impl std::str::FromStr for ChainHead {
    type Err = InvalidChainHead;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (seq, hash) = s.trim().split_once(':').ok_or(InvalidChainHead)?;
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err(InvalidChainHead);
        }
        Ok(Self {
            seq: seq.parse().map_err(|_| InvalidChainHead)?,
            hash: hash.parse().map_err(|_| InvalidChainHead)?,
        })
    }
}

crate::serde_display_fromstr!(ChainHead);

/// Logs `head` at `info` (fields `ledger`, `seq`, `hash`, `anchor`) when the lines from
/// `before + 1` to `head.seq` cross a multiple of [`HEAD_LOG_EVERY`], or always when `before`
/// is `None` (a ledger that opens): an external log of these lines anchors the chain.
pub(crate) fn log_head(ledger: &dyn fmt::Display, before: Option<u64>, head: ChainHead) {
    let crossed = before.is_none_or(|before| head.seq / HEAD_LOG_EVERY > before / HEAD_LOG_EVERY);
    if crossed {
        tracing::info!(
            ledger = %ledger,
            seq = head.seq,
            hash = %head.hash,
            anchor = %head,
            "ledger head (keep it outside the ledger's host: `replay-guard audit verify --expect-head` checks it)"
        );
    }
}

/// What a line of the chain holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LineBody {
    /// A compaction checkpoint: the lines before it were removed; `head` is the hash of the
    /// last removed line (this line's `prev` is that hash too), so the chain still verifies.
    Checkpoint {
        /// The checkpoint itself.
        checkpoint: Checkpoint,
    },
    /// The fingerprint key the ledger's records are fingerprinted with, named by its id (a
    /// keyed digest of the key, never the key). Recorded once, when a key is first bound to
    /// the ledger, and carried over by compaction right after its checkpoint.
    FingerprintKey {
        /// The binding.
        fingerprint_key: KeyBinding,
    },
    /// A kept result, chained like the events so that it cannot be altered unnoticed either.
    Result(StoredResult),
    /// An execution's event.
    Event(LedgerEvent),
}

/// A kept result in the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResult {
    /// The execution it belongs to.
    pub result_of: crate::ExecutionId,
    /// Its reference (`result_…`).
    pub reference: String,
    /// The JSON-RPC `result`, as the target sent it.
    pub result: Value,
}

/// The key a ledger is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyBinding {
    /// `hmac-sha256:<64 hex>`: HMAC-SHA256 under the key of a fixed label, so that it names the
    /// key without revealing it.
    pub id: String,
}

/// A compaction checkpoint: the first line of a compacted file. The lines before it are in
/// the archive `<ledger>.<compacted_through>.archive`, whose last line has `seq`
/// `compacted_through` and the hash this line carries as `prev`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The `seq` of the last line removed (the checkpoint's own `seq` is the next one).
    pub compacted_through: u64,
    /// How many lines were removed.
    pub removed: u64,
}

/// One line of the chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainedLine {
    /// Position in the chain, from 1, without gaps.
    pub seq: u64,
    /// The hash of the previous line ([`ChainHash::GENESIS`] for the first).
    pub prev: ChainHash,
    /// SHA-256 of this line's bytes without its `hash` member (see the module docs).
    pub hash: ChainHash,
    /// What the line records.
    #[serde(flatten)]
    pub body: LineBody,
}

/// A line as it is hashed: the line without `hash`, in the writer's field order.
#[derive(Serialize)]
struct Unsealed<'a> {
    seq: u64,
    prev: ChainHash,
    #[serde(flatten)]
    body: &'a LineBody,
}

impl ChainedLine {
    /// Seals a body as the line after `(seq - 1, prev)`.
    pub fn seal(seq: u64, prev: ChainHash, body: LineBody) -> Self {
        let mut line = Self {
            seq,
            prev,
            hash: ChainHash::GENESIS,
            body,
        };
        line.hash = line.compute_hash();
        line
    }

    /// The hash the line should carry: the SHA-256 of [`to_json_line`](Self::to_json_line)
    /// without its `"hash":"…",` member.
    pub fn compute_hash(&self) -> ChainHash {
        let unsealed = Unsealed {
            seq: self.seq,
            prev: self.prev,
            body: &self.body,
        };
        let bytes = serde_json::to_vec(&unsealed).unwrap_or_default();
        ChainHash(Sha256::digest(bytes).into())
    }

    /// The event, if the line is one.
    pub fn event(&self) -> Option<&LedgerEvent> {
        match &self.body {
            LineBody::Event(event) => Some(event),
            LineBody::Checkpoint { .. } | LineBody::FingerprintKey { .. } | LineBody::Result(_) => {
                None
            }
        }
    }

    /// Where the line sits and its hash.
    pub fn head(&self) -> ChainHead {
        ChainHead {
            seq: self.seq,
            hash: self.hash,
        }
    }

    /// The line as one line of JSON (no newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Why a chain does not verify.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChainProblem {
    /// A line's content does not match its hash: a field was edited (or forged), or its bytes
    /// are not the ones the writer wrote (an extra field, other spacing or key order).
    Edited,
    /// A line's `prev` does not match the hash of the line before it: a line was replaced or
    /// inserted.
    BrokenLink,
    /// `seq` jumped forward: lines were deleted.
    Deleted {
        /// How many `seq` values are missing.
        missing: u64,
    },
    /// `seq` went backwards or repeated: lines were reordered or duplicated.
    Reordered,
    /// A line is not valid JSON of a chain line: cut short or garbled.
    Unreadable {
        /// What the parser said.
        detail: String,
    },
    /// A checkpoint that contradicts itself: it does not sit right after the line it says it
    /// compacted through (forged, then re-sealed).
    BadCheckpoint {
        /// What is wrong.
        detail: String,
    },
    /// The archive a checkpoint names (`<ledger>.<seq>.archive`) is not there: deleted or moved.
    ArchiveMissing {
        /// The archive's path.
        archive: String,
    },
    /// A checkpoint does not follow the last line of the archive it names: the checkpoint was
    /// forged, or the archive swapped, replaced or cut.
    ArchiveMismatch {
        /// The archive's path.
        archive: String,
        /// What does not match.
        detail: String,
    },
    /// The line at an anchored head's `seq` has another hash: the chain was rewritten and
    /// re-sealed since the anchor was taken.
    AnchorMismatch {
        /// The anchored hash.
        expected: ChainHash,
        /// The hash of the line now at that `seq`.
        found: ChainHash,
    },
    /// An anchored head's `seq` is not in the chain: the tail was cut since the anchor was
    /// taken (or the lines before a checkpoint are not there to check).
    AnchorNotFound {
        /// The first `seq` the chain holds (0 when it is empty).
        first: u64,
        /// The last `seq` it holds (0 when it is empty).
        last: u64,
    },
}

impl fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Edited => f.write_str(
                "its content does not match its hash (edited or forged: a changed or added \
                 field, or bytes the writer did not write)",
            ),
            Self::BrokenLink => f.write_str(
                "its `prev` does not match the line before it (a line was replaced or inserted)",
            ),
            Self::Deleted { missing } => {
                write!(f, "{missing} line(s) before it are missing (deleted)")
            }
            Self::Reordered => f.write_str("its `seq` is out of order (reordered or duplicated)"),
            Self::Unreadable { detail } => {
                write!(f, "it cannot be read ({detail}): cut short or garbled")
            }
            Self::BadCheckpoint { detail } => {
                write!(
                    f,
                    "it is a checkpoint that contradicts itself ({detail}): forged"
                )
            }
            Self::ArchiveMissing { archive } => write!(
                f,
                "it is a checkpoint whose archive {archive} is missing (deleted or moved): the \
                 lines before it cannot be checked"
            ),
            Self::ArchiveMismatch { archive, detail } => write!(
                f,
                "it is a checkpoint that does not follow its archive {archive} ({detail}): the \
                 checkpoint was forged, or the archive swapped, replaced or cut"
            ),
            Self::AnchorMismatch { expected, found } => write!(
                f,
                "it has the hash {found}, not the anchored {expected}: the ledger was rewritten \
                 and re-sealed since the anchor was taken"
            ),
            Self::AnchorNotFound { first: 0, last: 0 } => f.write_str(
                "the anchored head is not in the ledger, which holds no lines: it was emptied \
                 or replaced since the anchor was taken",
            ),
            Self::AnchorNotFound { first, last } => write!(
                f,
                "the anchored head is not in the ledger, whose chain runs from seq {first} to \
                 {last}: its tail was cut (truncated) since the anchor was taken"
            ),
        }
    }
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct VerifyReport {
    /// Lines that verified before the first problem (all of them when `first_bad` is `None`).
    pub verified: u64,
    /// The hash of the last verified line.
    pub head: ChainHash,
    /// The `seq` of the last verified line (0 when none did).
    pub head_seq: u64,
    /// The first bad line: its `seq` (the expected one when the line could not be read) and
    /// what is wrong.
    pub first_bad: Option<(u64, ChainProblem)>,
    /// The file that holds the first bad line, when a file (or an archive) was verified.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<std::path::PathBuf>,
    /// The files verified as one chain, oldest first (archives, then the live file); empty
    /// when the lines did not come from files.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<std::path::PathBuf>,
    /// The anchored head the chain was checked against, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor: Option<ChainHead>,
}

impl VerifyReport {
    /// Whether the whole chain verified.
    pub fn is_ok(&self) -> bool {
        self.first_bad.is_none()
    }

    /// The head of what verified: `SEQ:sha256:HEX`, the form `audit head` prints.
    pub fn head(&self) -> ChainHead {
        ChainHead {
            seq: self.head_seq,
            hash: self.head,
        }
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first_bad {
            None => {
                write!(
                    f,
                    "ok: {} events, head {} (seq {})",
                    self.verified, self.head, self.head_seq
                )?;
                if self.files.len() > 1 {
                    write!(
                        f,
                        ", through {} archive(s) and the live file",
                        self.files.len() - 1
                    )?;
                }
                if let Some(anchor) = self.anchor {
                    write!(f, "; it holds the anchored head {anchor}")?;
                }
                Ok(())
            }
            Some((seq, problem)) => {
                write!(f, "seq {seq}: {problem}")?;
                if let Some(file) = &self.file {
                    write!(f, " (in {})", file.display())?;
                }
                Ok(())
            }
        }
    }
}

/// Checks that `line` follows `head`, the `(seq, hash)` of the last line read (`(0,
/// GENESIS)` before the first line, when a checkpoint may also start a compacted chain).
///
/// The one check both [`verify`] and the file ledger's reader apply to every line.
pub(crate) fn check_follows(
    head: (u64, ChainHash),
    line: &ChainedLine,
) -> Result<(), ChainProblem> {
    let (last_seq, last_hash) = head;
    // A compacted chain starts at its checkpoint, whose `prev` is the removed head.
    let starts_compacted = last_seq == 0 && matches!(line.body, LineBody::Checkpoint { .. });
    let (expected_seq, expected_prev) = if starts_compacted {
        (line.seq, line.prev)
    } else {
        (last_seq + 1, last_hash)
    };
    if line.seq > expected_seq {
        Err(ChainProblem::Deleted {
            missing: line.seq - expected_seq,
        })
    } else if line.seq < expected_seq {
        Err(ChainProblem::Reordered)
    } else if line.compute_hash() != line.hash {
        Err(ChainProblem::Edited)
    } else if line.prev != expected_prev {
        Err(ChainProblem::BrokenLink)
    } else if let LineBody::Checkpoint { checkpoint } = &line.body
        && (checkpoint.compacted_through.checked_add(1) != Some(line.seq)
            || checkpoint.removed > checkpoint.compacted_through)
    {
        Err(ChainProblem::BadCheckpoint {
            detail: format!(
                "at seq {} it says it compacted through seq {} and removed {} line(s)",
                line.seq, checkpoint.compacted_through, checkpoint.removed
            ),
        })
    } else {
        Ok(())
    }
}

/// Checks lines as one chain, in order, across as many pieces as it is given (the files of a
/// compacted ledger: its archives oldest first, then the live file), and optionally against an
/// anchored head.
///
/// A chain may start with a checkpoint (a compacted file checked on its own: the lines it
/// compacted are not checked); a later piece must follow the one before it exactly, its
/// checkpoint included.
#[derive(Debug, Clone)]
pub struct Verifier {
    report: VerifyReport,
    first_seq: Option<u64>,
    anchor_seen: bool,
    from_genesis: bool,
}

impl Default for Verifier {
    fn default() -> Self {
        Self::new()
    }
}

impl Verifier {
    /// A verifier at the start of a chain.
    pub fn new() -> Self {
        Self {
            report: VerifyReport {
                verified: 0,
                head: ChainHash::GENESIS,
                head_seq: 0,
                first_bad: None,
                file: None,
                files: Vec::new(),
                anchor: None,
            },
            first_seq: None,
            anchor_seen: false,
            from_genesis: false,
        }
    }

    /// A verifier of a whole chain, which starts at seq 1 after [`ChainHash::GENESIS`]: a
    /// leading checkpoint is reported like any other line that does not follow (the lines it
    /// compacted are not there). For ledgers that never compact, or once every archive was
    /// found.
    pub fn from_genesis() -> Self {
        Self {
            from_genesis: true,
            ..Self::new()
        }
    }

    /// Also checks that the chain holds `anchor`: the line at its `seq` has its hash.
    pub fn expect(mut self, anchor: ChainHead) -> Self {
        self.report.anchor = Some(anchor);
        self.anchor_seen = anchor == ChainHead::GENESIS;
        self
    }

    /// Verifies the next piece of the chain (blank lines are skipped). Returns whether every
    /// line so far verified; after the first problem, further pieces are not read.
    pub fn segment<'a>(&mut self, lines: impl IntoIterator<Item = &'a str>) -> bool {
        if !self.report.is_ok() {
            return false;
        }
        for text in lines {
            if text.trim().is_empty() {
                continue;
            }
            if let Err(bad) = self.line(text) {
                self.report.first_bad = Some(bad);
                return false;
            }
        }
        true
    }

    /// Reports the next line as unreadable (`detail` says why) without reading it: a reader
    /// could not take it as a line (longer than any line, or bytes no line starts with).
    /// Returns `false`, as [`segment`](Self::segment) does after a problem.
    pub(crate) fn unreadable(&mut self, detail: String) -> bool {
        if self.report.is_ok() {
            let next = self.report.head_seq + 1;
            self.report.first_bad = Some((next, ChainProblem::Unreadable { detail }));
        }
        false
    }

    fn line(&mut self, text: &str) -> Result<(), (u64, ChainProblem)> {
        let next = self.report.head_seq + 1;
        let line = read_line(text).map_err(|(seq, problem)| (seq.unwrap_or(next), problem))?;
        if self.from_genesis && self.report.verified == 0 && line.seq > 1 {
            return Err((
                line.seq,
                ChainProblem::Deleted {
                    missing: line.seq - 1,
                },
            ));
        }
        check_follows((self.report.head_seq, self.report.head), &line)
            .map_err(|problem| (line.seq, problem))?;
        if let Some(anchor) = self.report.anchor
            && anchor.seq == line.seq
        {
            if anchor.hash != line.hash {
                return Err((
                    line.seq,
                    ChainProblem::AnchorMismatch {
                        expected: anchor.hash,
                        found: line.hash,
                    },
                ));
            }
            self.anchor_seen = true;
        }
        self.first_seq.get_or_insert(line.seq);
        self.report.verified += 1;
        self.report.head = line.hash;
        self.report.head_seq = line.seq;
        Ok(())
    }

    /// The report so far.
    pub fn report(&self) -> &VerifyReport {
        &self.report
    }

    /// The final report: with an anchor, a chain that verified but does not reach (or no
    /// longer holds) the anchored `seq` is reported too.
    pub fn finish(mut self) -> VerifyReport {
        if let Some(anchor) = self.report.anchor
            && self.report.is_ok()
            && !self.anchor_seen
        {
            self.report.first_bad = Some((
                anchor.seq,
                ChainProblem::AnchorNotFound {
                    first: self.first_seq.unwrap_or(0),
                    last: self.report.head_seq,
                },
            ));
        }
        self.report
    }
}

/// Verifies a chain given as raw lines (the file form). A chain may start with a checkpoint.
pub fn verify<'a>(lines: impl IntoIterator<Item = &'a str>) -> VerifyReport {
    let mut verifier = Verifier::new();
    verifier.segment(lines);
    verifier.finish()
}

/// Parses one line, rejecting duplicate keys (two readers must never see two lines) and any
/// text that is not exactly the line the writer wrote for what it holds (see the module docs).
pub fn parse_line(text: &str) -> Result<ChainedLine, String> {
    read_line(text).map_err(|(_, problem)| match problem {
        ChainProblem::Unreadable { detail } => detail,
        other => other.to_string(),
    })
}

/// Reads one line as [`parse_line`] does, saying what is wrong as a [`ChainProblem`]: an
/// intact line this build cannot read is `Unreadable`, one whose bytes were changed `Edited`.
/// The file ledger's reader uses it, so that an edit is never taken for a torn write.
pub(crate) fn read(text: &str) -> Result<ChainedLine, ChainProblem> {
    read_line(text).map_err(|(_, problem)| problem)
}

/// Reads one line: `Unreadable` (with no `seq`) when it is not a chain line, `Edited` (with its
/// `seq`) when its bytes are not the writer's form of what it holds.
fn read_line(text: &str) -> Result<ChainedLine, (Option<u64>, ChainProblem)> {
    let unreadable = |detail| (None, ChainProblem::Unreadable { detail });
    let (value, duplicate) =
        crate::protocol::parse_tracking_duplicates(text).map_err(unreadable)?;
    if let Some(key) = duplicate {
        return Err(unreadable(format!("the key {key:?} appears twice")));
    }
    let line: ChainedLine = serde_json::from_value(value).map_err(|e| unreadable(e.to_string()))?;
    if line.to_json_line() != text {
        // Intact bytes that this build would not write: a line of a newer format.
        if hash_of_text(text) == Some(line.hash) {
            return Err((
                Some(line.seq),
                ChainProblem::Unreadable {
                    detail: format!(
                        "seq {} holds fields this build does not write: a newer format, or \
                         forged",
                        line.seq
                    ),
                },
            ));
        }
        return Err((Some(line.seq), ChainProblem::Edited));
    }
    Ok(line)
}

/// The hash of a line's text with its `"hash":"sha256:…",` member taken out, when the member
/// sits where the writer puts it (right after `prev`).
fn hash_of_text(text: &str) -> Option<ChainHash> {
    let start = text.find(",\"hash\":\"sha256:")? + 1;
    let end = start + "\"hash\":\"sha256:".len() + 64 + "\",".len();
    let member = text.get(start..end)?;
    if !member.ends_with("\",") {
        return None;
    }
    let mut digest = Sha256::new();
    digest.update(&text.as_bytes()[..start]);
    digest.update(&text.as_bytes()[end..]);
    Some(ChainHash(digest.finalize().into()))
}

#[cfg(test)]
mod tests;
