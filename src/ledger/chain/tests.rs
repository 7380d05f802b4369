//! The chain's unit tests.

use super::*;
use crate::{
    ExecutionId,
    execution::{EventKind, Timestamp},
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

fn result_line(seq: u64, prev: ChainHash, result: &str) -> ChainedLine {
    ChainedLine::seal(
        seq,
        prev,
        LineBody::Result(StoredResult {
            result_of: ExecutionId::new(),
            reference: "result_x".into(),
            result: serde_json::from_str(result).unwrap(),
        }),
    )
}

#[test]
fn a_line_with_an_extra_field_is_edited() {
    let lines = chain(4);
    let mut extra = lines.clone();
    extra[1] = extra[1].replacen(
        ",\"execution_id\"",
        ",\"note\":\"forged\",\"execution_id\"",
        1,
    );
    assert_ne!(extra[1], lines[1]);
    let report = check(&extra);
    assert_eq!(
        report.first_bad,
        Some((2, ChainProblem::Edited)),
        "{report}"
    );
    // At the very end too, where the head would otherwise not change.
    let mut last = lines.clone();
    last[3] = last[3].replacen('}', ",\"z\":1}", 1);
    assert_eq!(check(&last).first_bad, Some((4, ChainProblem::Edited)));
    assert!(parse_line(&last[3]).is_err(), "the reader refuses it too");
    // An extra field under a hash of its own bytes (a newer writer, or a forger who
    // re-hashed the line) is still refused: this build cannot read what it says.
    let line = parse_line(&lines[3]).unwrap();
    let unsealed = format!(
        "{{\"seq\":4,\"prev\":\"{}\",\"z\":1,{}",
        line.prev,
        &lines[3][lines[3].find("\"execution_id\"").unwrap()..]
    );
    let hash = ChainHash(Sha256::digest(unsealed.as_bytes()).into());
    let rehashed = unsealed.replacen(",\"z\"", &format!(",\"hash\":\"{hash}\",\"z\""), 1);
    let report = check(&[
        lines[0].clone(),
        lines[1].clone(),
        lines[2].clone(),
        rehashed,
    ]);
    assert!(
        matches!(&report.first_bad, Some((4, ChainProblem::Unreadable { detail })) if detail.contains("newer format")),
        "{report}"
    );
}

#[test]
fn any_change_of_bytes_is_edited_even_when_the_value_is_the_same() {
    let lines = chain(3);
    let spaced = |from: &str, to: &str| {
        let mut edited = lines.clone();
        edited[1] = edited[1].replacen(from, to, 1);
        assert_ne!(edited[1], lines[1], "{from} -> {to}");
        check(&edited).first_bad
    };
    assert_eq!(
        spaced("\"seq\":2", "\"seq\": 2"),
        Some((2, ChainProblem::Edited))
    );
    assert_eq!(spaced("{", "{ "), Some((2, ChainProblem::Edited)));
    // Keys in another order: the same JSON object, other bytes.
    let line = parse_line(&lines[1]).unwrap();
    let mut value = serde_json::to_value(&line).unwrap();
    let reordered = {
        let map = value.as_object_mut().unwrap();
        let mut text = String::from("{");
        let mut keys: Vec<_> = map.keys().cloned().collect();
        keys.reverse();
        for (i, k) in keys.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&format!("{}:{}", Value::from(k.as_str()), map[k]));
        }
        text + "}"
    };
    let mut edited = lines.clone();
    edited[1] = reordered;
    assert_eq!(check(&edited).first_bad, Some((2, ChainProblem::Edited)));
}

#[test]
fn numbers_in_a_kept_result_are_covered_exactly_and_honest_ones_verify() {
    // Honest lines with numbers JSON can hold but f64 or JCS would blur verify as written.
    let results = [
        r#"{"big":18446744073709551615,"neg":-9223372036854775808}"#,
        r#"{"past_u64":18446744073709551616,"huge":1e300,"tiny":5e-324}"#,
        r#"{"f":0.1,"negzero":-0.0,"one":1.0,"int":1,"exp":1.5e-7}"#,
        r#"{"id":9007199254740993,"deep":[[[{"a":[1,2.5,-3]}]]]}"#,
    ];
    let mut prev = ChainHash::GENESIS;
    let mut lines = Vec::new();
    for (i, result) in results.iter().enumerate() {
        let line = result_line(i as u64 + 1, prev, result);
        prev = line.hash;
        let text = line.to_json_line();
        assert_eq!(
            parse_line(&text).unwrap().to_json_line(),
            text,
            "round trip"
        );
        lines.push(text);
    }
    let report = check(&lines);
    assert!(report.is_ok(), "{report}");
    // Edits that keep the number's value for f64 or RFC 8785 are edits all the same.
    for (line, from, to) in [
        (3, "9007199254740993", "9007199254740992"),
        (2, "\"one\":1.0", "\"one\":1"),
        (2, "\"int\":1,", "\"int\":1.0,"),
        (2, "-0.0", "0.0"),
    ] {
        let mut edited = lines.clone();
        edited[line] = edited[line].replacen(from, to, 1);
        assert_ne!(edited[line], lines[line], "{from} -> {to}");
        assert_eq!(
            check(&edited).first_bad,
            Some((line as u64 + 1, ChainProblem::Edited)),
            "{from} -> {to} went unnoticed"
        );
    }
}

fn arb_result() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        // Integers past u64 and other spellings, as a target may send them.
        "-?[1-9][0-9]{19,40}(\\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?"
            .prop_filter_map("in f64 range", |text| serde_json::from_str(&text).ok()),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    /// An honest line verifies whatever its result holds, and any one changed byte in it
    /// does not.
    #[test]
    fn honest_result_lines_verify_and_every_changed_byte_is_caught(
        result in arb_result(),
        at in proptest::prelude::any::<proptest::sample::Index>(),
        byte in proptest::prelude::any::<u8>(),
    ) {
        let head = parse_line(&chain(1)[0]).unwrap();
        let line = ChainedLine::seal(
            2,
            head.hash,
            LineBody::Result(StoredResult {
                result_of: ExecutionId::new(),
                reference: "result_x".into(),
                result,
            }),
        );
        let text = line.to_json_line();
        let first = head.to_json_line();
        let report = verify([first.as_str(), text.as_str()]);
        proptest::prop_assert!(report.is_ok(), "{}", report);
        proptest::prop_assert_eq!(report.head, line.hash);
        let mut bytes = text.clone().into_bytes();
        let i = at.index(bytes.len());
        proptest::prop_assume!(bytes[i] != byte && byte != b'\n');
        bytes[i] = byte;
        let edited = String::from_utf8_lossy(&bytes).into_owned();
        // A byte that breaks a UTF-8 sequence can decode back to the very text it was in (a
        // U+FFFD the result already held): then nothing changed that a reader could see.
        proptest::prop_assume!(edited != text);
        let report = verify([first.as_str(), edited.as_str()]);
        proptest::prop_assert!(!report.is_ok(), "byte {} -> {:?} went unnoticed", i, byte as char);
    }
}

#[test]
fn a_forged_checkpoint_is_refused() {
    // A checkpoint that does not sit right after the line it says it compacted through.
    let forged = ChainedLine::seal(
        5,
        ChainHash::GENESIS,
        LineBody::Checkpoint {
            checkpoint: Checkpoint {
                compacted_through: 9,
                removed: 9,
            },
        },
    );
    let report = check(&[forged.to_json_line()]);
    assert!(
        matches!(
            report.first_bad,
            Some((5, ChainProblem::BadCheckpoint { .. }))
        ),
        "{report}"
    );

    // A checkpoint after an archive whose head it does not carry (re-sealed with another
    // `prev`): the archive's lines, then the compacted file's.
    let archived = chain(4);
    let head = parse_line(&archived[3]).unwrap();
    let checkpoint = |prev| {
        ChainedLine::seal(
            5,
            prev,
            LineBody::Checkpoint {
                checkpoint: Checkpoint {
                    compacted_through: 4,
                    removed: 4,
                },
            },
        )
        .to_json_line()
    };
    let mut verifier = Verifier::new();
    verifier.segment(archived.iter().map(String::as_str));
    assert!(verifier.report().is_ok());
    verifier.segment([checkpoint(ChainHash([7; 32])).as_str()]);
    let report = verifier.report();
    assert!(
        matches!(report.first_bad, Some((5, ChainProblem::BrokenLink))),
        "{report}"
    );
    let mut verifier = Verifier::new();
    verifier.segment(archived.iter().map(String::as_str));
    verifier.segment([checkpoint(head.hash).as_str()]);
    assert!(verifier.report().is_ok(), "{}", verifier.report());
    assert_eq!(
        verifier.report().head(),
        ChainHead {
            seq: 5,
            hash: parse_line(&checkpoint(head.hash)).unwrap().hash
        }
    );
}

#[test]
fn a_chain_head_reads_and_prints_as_seq_colon_hash() {
    let head = ChainHead {
        seq: 42,
        hash: ChainHash([0xab; 32]),
    };
    let text = head.to_string();
    assert_eq!(text, format!("42:sha256:{}", "ab".repeat(32)));
    assert_eq!(text.parse::<ChainHead>().unwrap(), head);
    for bad in ["", "42", "x:sha256:00", "42:sha256:00", "-1:sha256:ab"] {
        assert!(bad.parse::<ChainHead>().is_err(), "{bad}");
    }
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
