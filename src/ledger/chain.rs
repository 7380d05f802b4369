//! The tamper-evident form of the ledger: every event is a line that carries `seq`, `prev`
//! (the hash of the line before it) and `hash`, a SHA-256 over the RFC 8785 form of the whole
//! line except `hash` itself. Every field is covered, so no field can be changed unnoticed;
//! `seq` and `prev` make a deleted, inserted or reordered line visible.
//!
//! Durable ledgers (the file ledger, the PostgreSQL ledger) store these lines; [`verify`] checks
//! any sequence of them and names the first bad `seq` and why.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::LedgerEvent;
use crate::fingerprint::canonical_json;

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

/// A compaction checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The `seq` of the last line removed.
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
    /// SHA-256 of this line's RFC 8785 form without `hash`.
    pub hash: ChainHash,
    /// What the line records.
    #[serde(flatten)]
    pub body: LineBody,
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

    /// The hash the line should carry.
    pub fn compute_hash(&self) -> ChainHash {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.remove("hash");
        }
        ChainHash(Sha256::digest(canonical_json(&value)).into())
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
    /// A line's content does not match its hash: a field was edited (or forged).
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
}

impl fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Edited => f.write_str("its content does not match its hash (edited or forged)"),
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
        }
    }
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Lines that verified before the first problem (all of them when `first_bad` is `None`).
    pub verified: u64,
    /// The hash of the last verified line.
    pub head: ChainHash,
    /// The first bad line: its `seq` (the expected one when the line could not be read) and
    /// what is wrong.
    pub first_bad: Option<(u64, ChainProblem)>,
}

impl VerifyReport {
    /// Whether the whole chain verified.
    pub fn is_ok(&self) -> bool {
        self.first_bad.is_none()
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.first_bad {
            None => write!(f, "ok: {} events, head {}", self.verified, self.head),
            Some((seq, problem)) => write!(f, "seq {seq}: {problem}"),
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
    } else {
        Ok(())
    }
}

/// Verifies a chain given as raw lines (the file form). A chain may start with a checkpoint.
pub fn verify<'a>(lines: impl IntoIterator<Item = &'a str>) -> VerifyReport {
    let mut report = VerifyReport {
        verified: 0,
        head: ChainHash::GENESIS,
        first_bad: None,
    };
    let mut last_seq = 0;
    for text in lines {
        if text.trim().is_empty() {
            continue;
        }
        let line: ChainedLine = match parse_line(text) {
            Ok(line) => line,
            Err(detail) => {
                report.first_bad = Some((last_seq + 1, ChainProblem::Unreadable { detail }));
                return report;
            }
        };
        if let Err(problem) = check_follows((last_seq, report.head), &line) {
            report.first_bad = Some((line.seq, problem));
            return report;
        }
        report.verified += 1;
        report.head = line.hash;
        last_seq = line.seq;
    }
    report
}

/// Parses one line, rejecting duplicate keys (two readers must never see two lines).
pub fn parse_line(text: &str) -> Result<ChainedLine, String> {
    let (value, duplicate) = crate::protocol::parse_tracking_duplicates(text)?;
    if let Some(key) = duplicate {
        return Err(format!("the key {key:?} appears twice"));
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ExecutionId,
        ledger::{EventKind, Timestamp},
    };

    fn chain(n: u64) -> Vec<String> {
        let id = ExecutionId::new();
        let mut prev = ChainHash::GENESIS;
        (1..=n)
            .map(|seq| {
                let event = LedgerEvent {
                    execution_id: id,
                    at: Timestamp::from_millis(seq),
                    kind: EventKind::NotSent {
                        reason: format!("attempt {seq}"),
                    },
                };
                let line = ChainedLine::seal(seq, prev, LineBody::Event(event));
                prev = line.hash;
                line.to_json_line()
            })
            .collect()
    }

    fn check(lines: &[String]) -> VerifyReport {
        verify(lines.iter().map(String::as_str))
    }

    #[test]
    fn an_intact_chain_verifies_and_lines_roundtrip() {
        let lines = chain(5);
        let report = check(&lines);
        assert!(report.is_ok(), "{report}");
        assert_eq!(report.verified, 5);
        assert!(report.to_string().starts_with("ok: 5 events, head sha256:"));
        let line = parse_line(&lines[2]).unwrap();
        assert_eq!(line.to_json_line(), lines[2]);
    }

    #[test]
    fn tampering_is_named_by_seq_and_kind() {
        let lines = chain(6);
        let mut edited = lines.clone();
        edited[2] = edited[2].replace("attempt 3", "attempt 9");
        assert_eq!(check(&edited).first_bad, Some((3, ChainProblem::Edited)));

        let mut deleted = lines.clone();
        deleted.remove(3);
        assert_eq!(
            check(&deleted).first_bad,
            Some((5, ChainProblem::Deleted { missing: 1 }))
        );

        let mut swapped = lines.clone();
        swapped.swap(1, 2);
        assert_eq!(
            check(&swapped).first_bad,
            Some((3, ChainProblem::Deleted { missing: 1 }))
        );

        let mut cut = lines.clone();
        let half = cut[5].len() / 2;
        cut[5].truncate(half);
        assert!(matches!(
            check(&cut).first_bad,
            Some((6, ChainProblem::Unreadable { .. }))
        ));

        // A forged line that carries a hash of its own content but not the right `prev`.
        let mut forged = lines.clone();
        let mut line = parse_line(&forged[4]).unwrap();
        line.prev = ChainHash::GENESIS;
        line.hash = line.compute_hash();
        forged[4] = line.to_json_line();
        assert_eq!(
            check(&forged).first_bad,
            Some((5, ChainProblem::BrokenLink))
        );

        let mut twice = lines.clone();
        twice[1] = twice[1].replacen("{", "{\"seq\":99,", 1);
        assert!(matches!(
            check(&twice).first_bad,
            Some((2, ChainProblem::Unreadable { .. }))
        ));

        let mut duplicated = lines;
        duplicated.insert(3, duplicated[2].clone());
        assert_eq!(
            check(&duplicated).first_bad,
            Some((3, ChainProblem::Reordered))
        );
    }

    #[test]
    fn a_compacted_chain_starting_at_a_checkpoint_verifies() {
        let lines = chain(4);
        let head = parse_line(&lines[3]).unwrap().hash;
        let checkpoint = ChainedLine::seal(
            5,
            head,
            LineBody::Checkpoint {
                checkpoint: Checkpoint {
                    compacted_through: 4,
                    removed: 4,
                },
            },
        );
        let next = ChainedLine::seal(
            6,
            checkpoint.hash,
            LineBody::Event(LedgerEvent {
                execution_id: ExecutionId::new(),
                at: Timestamp::from_millis(9),
                kind: EventKind::Authorized,
            }),
        );
        let compacted = [checkpoint.to_json_line(), next.to_json_line()];
        let report = check(&compacted);
        assert!(report.is_ok(), "{report}");
        assert_eq!(report.head, next.hash);
    }
}
