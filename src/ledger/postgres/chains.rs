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
/// `prev`, `hash`, `execution_id`, `line`) and the rows of `mrg_chains` (`chain`, `seq`,
/// `hash`), read in one snapshot.
///
/// `seq` is one sequence for the whole ledger: each chain's lines have increasing `seq`s
/// with the other chains' in between (and the gaps a rolled-back write leaves). A line
/// belongs to the chain whose last line its `prev` names (or whose genesis, for a chain's
/// first line), so a line that follows no chain's last line was inserted, replaced or
/// forked off an older line; when `seq`s are missing right before it, the lines there were
/// deleted. Every line is also checked against its own hash and its columns. Then each
/// chain must end where its head row says: a head past the chain's last line is a cut tail,
/// a line past the head was added behind the writers' back.
pub(super) fn verify_rows(lines: &[Row], heads: &[Row]) -> VerifyReport {
    let mut report = chain::Verifier::new().finish();
    // What a next line may follow: each chain's last line (or its genesis while it has
    // none), and the chain that is.
    let mut open: HashMap<ChainHash, u16> = (0..PARTITIONS).map(|c| (genesis(c), c)).collect();
    let mut tips: Vec<(u64, ChainHash)> = (0..PARTITIONS).map(|c| (0, genesis(c))).collect();
    let mut firsts: Vec<u64> = vec![0; usize::from(PARTITIONS)];
    for row in lines {
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
        let followed = open.remove(&line.prev);
        let verdict = if line.compute_hash() != line.hash || !columns_agree {
            // The columns are a copy of the line, for queries: one that disagrees was edited.
            Err(ChainProblem::Edited)
        } else {
            match followed {
                None if line.seq > report.head_seq + 1 => Err(ChainProblem::Deleted {
                    missing: line.seq - report.head_seq - 1,
                }),
                None => Err(ChainProblem::BrokenLink),
                Some(_) if matches!(line.body, LineBody::Checkpoint { .. }) => {
                    Err(ChainProblem::BadCheckpoint {
                        detail: "this ledger never compacts".into(),
                    })
                }
                Some(chain) => Ok(chain),
            }
        };
        let chain = match verdict {
            Ok(chain) => chain,
            Err(problem) => {
                report.first_bad = Some((line.seq, problem));
                return report;
            }
        };
        open.insert(line.hash, chain);
        let c = usize::from(chain);
        tips[c] = (line.seq, line.hash);
        if firsts[c] == 0 {
            firsts[c] = line.seq;
        }
        report.verified += 1;
        report.head = line.hash;
        report.head_seq = line.seq;
    }
    report.first_bad = check_heads(heads, &tips, &firsts);
    report
}

/// Whether each chain ends where its head row in `mrg_chains` says; the first that does not.
fn check_heads(
    heads: &[Row],
    tips: &[(u64, ChainHash)],
    firsts: &[u64],
) -> Option<(u64, ChainProblem)> {
    let mut seen = vec![false; tips.len()];
    for row in heads {
        let chain = usize::try_from(row.get::<_, i32>(0)).unwrap_or(usize::MAX);
        let seq = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let Some(&(tip_seq, tip_hash)) = tips.get(chain) else {
            return Some((
                seq,
                ChainProblem::Unreadable {
                    detail: format!("mrg_chains names chain {chain}, which this build does not"),
                },
            ));
        };
        seen[chain] = true;
        let Ok(hash) = row.get::<_, &str>(2).parse::<ChainHash>() else {
            return Some((seq, ChainProblem::Edited));
        };
        if seq > tip_seq {
            return Some((
                seq,
                ChainProblem::AnchorNotFound {
                    first: firsts[chain],
                    last: tip_seq,
                },
            ));
        } else if seq < tip_seq {
            return Some((tip_seq, ChainProblem::BrokenLink));
        } else if hash != tip_hash {
            return Some((
                seq,
                ChainProblem::AnchorMismatch {
                    expected: hash,
                    found: tip_hash,
                },
            ));
        }
    }
    seen.iter().position(|seen| !seen).map(|chain| {
        (
            tips[chain].0,
            ChainProblem::Unreadable {
                detail: format!("chain {chain} has no head row in mrg_chains"),
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_stable_and_spread() {
        // Fixed values: another build must put the same intent in the same partition.
        assert_eq!(partition_of("a", "b", "c"), 252);
        let used: HashSet<u16> = (0..4000)
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
