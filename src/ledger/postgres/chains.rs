//! The ledger's chains: one per partition of the intent space, so that writes of different
//! intents take different locks, and the verification of all of them in one read of
//! `mrg_events`.

use super::*;

const PARTITIONS: u16 = PostgresLedger::PARTITIONS;

/// The partition of an intent, from its key's text (as its columns hold it): FNV-1a, so that
/// every build and replica puts an intent in the same partition.
pub(super) fn partition_of(actor: &str, intent_scope: &str, fingerprint: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [actor, intent_scope, fingerprint] {
        // 0xff never occurs in UTF-8: it separates the parts unambiguously.
        for byte in part.as_bytes().iter().chain([&0xff]) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (hash % u64::from(PARTITIONS)) as u16
}

/// The partition of an intent.
pub(super) fn partition_of_key(key: &IntentKey) -> u16 {
    partition_of(
        key.actor.as_str(),
        key.intent_scope.as_str(),
        &key.fingerprint.to_string(),
    )
}

/// The `prev` of a chain's first line: [`ChainHash::GENESIS`] for chain 0 (the single chain
/// of the ledgers made before partitions, which chain 0 continues), a hash of the chain's
/// number for the others, so that each chain starts once and no line can start two.
pub(super) fn genesis(chain: u16) -> ChainHash {
    if chain == 0 {
        return ChainHash::GENESIS;
    }
    let digest =
        <sha2::Sha256 as sha2::Digest>::digest(format!("mcp-replay-guard:postgres:chain:{chain}"));
    format!("sha256:{}", hex::encode(digest))
        .parse()
        .unwrap_or(ChainHash::GENESIS)
}

/// Verifies every chain at once from the rows of `mrg_events` in `seq` order (`seq`,
/// `prev`, `hash`, `execution_id`, `line`).
///
/// `seq` is one sequence for the whole ledger: each chain's lines have increasing `seq`s
/// with the other chains' in between (and the gaps a rolled-back write leaves). A line
/// belongs to the chain whose last line its `prev` names (or whose genesis, for a chain's
/// first line), so a line that follows no chain's last line was inserted, replaced or
/// forked off an older line; when `seq`s are missing right before it, the lines there were
/// deleted. Every line is also checked against its own hash and its columns.
pub(super) fn verify_rows(rows: &[Row]) -> VerifyReport {
    let mut report = chain::Verifier::new().finish();
    // What a next line may follow: each chain's last line, or its genesis while it has none.
    let mut open: HashSet<ChainHash> = (0..PARTITIONS).map(genesis).collect();
    for row in rows {
        let column_seq = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let text: &str = row.get(4);
        let line = match chain::read(text) {
            Ok(line) => line,
            Err(problem) => {
                report.first_bad = Some((column_seq, problem));
                return report;
            }
        };
        let columns_agree = line.seq == column_seq
            && row.get::<_, String>(1) == line.prev.to_string()
            && row.get::<_, String>(2) == line.hash.to_string()
            && row.get::<_, Option<String>>(3) == line.event().map(|e| e.execution_id.to_string());
        let problem = if line.compute_hash() != line.hash || !columns_agree {
            // The columns are a copy of the line, for queries: one that disagrees was edited.
            Some(ChainProblem::Edited)
        } else if !open.remove(&line.prev) {
            if line.seq > report.head_seq + 1 {
                Some(ChainProblem::Deleted {
                    missing: line.seq - report.head_seq - 1,
                })
            } else {
                Some(ChainProblem::BrokenLink)
            }
        } else if matches!(line.body, LineBody::Checkpoint { .. }) {
            Some(ChainProblem::BadCheckpoint {
                detail: "this ledger never compacts".into(),
            })
        } else {
            None
        };
        if let Some(problem) = problem {
            report.first_bad = Some((line.seq, problem));
            return report;
        }
        open.insert(line.hash);
        report.verified += 1;
        report.head = line.hash;
        report.head_seq = line.seq;
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        // Fixed values: another build must put the same intent in the same partition.
        assert_eq!(partition_of("a", "b", "c"), 12);
        let used: HashSet<u16> = (0..200)
            .map(|n| partition_of("actor", "run:1", &format!("hmac-sha256:{n:064x}")))
            .collect();
        assert_eq!(used.len(), usize::from(PARTITIONS));
    }

    #[test]
    fn every_chain_has_its_own_genesis() {
        let geneses: HashSet<ChainHash> = (0..PARTITIONS).map(genesis).collect();
        assert_eq!(geneses.len(), usize::from(PARTITIONS));
        assert_eq!(genesis(0), ChainHash::GENESIS);
    }
}
