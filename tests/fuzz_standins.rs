//! Proptest stand-ins for the cargo-fuzz targets in `fuzz/`: the same invariants (the very same
//! code, `fuzz/src/lib.rs`), fed by generators that know the input formats, so CI checks them
//! on every run whether or not cargo-fuzz can be installed. The seed corpus in
//! `fuzz/corpus/<target>/` runs through them too, and every input a fuzzer found that broke an
//! invariant stays here as a named regression test.

#[path = "../fuzz/src/lib.rs"]
mod invariants;

use std::path::Path;

use proptest::{collection::vec, prelude::*, sample::select};
use serde_json::Value;

/// Runs every seed file of a target's corpus through its invariant.
fn run_corpus(target: &str, check: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("the seed corpus is in the repository") {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        count += 1;
    }
    count
}

#[test]
fn the_seed_corpus_holds_every_invariant() {
    for (target, check) in [
        ("sse_parser", invariants::sse_parser as fn(&[u8])),
        ("classify", invariants::classify),
        ("canonicalise", invariants::canonicalise),
        ("ledger_line", invariants::ledger_line),
    ] {
        assert!(run_corpus(target, check) >= 3, "{target} has a seed corpus");
    }
}

/// Concatenates generated pieces behind the selector bytes a target reads first.
fn framed(head: &[u8], pieces: Vec<Vec<u8>>) -> Vec<u8> {
    let mut data = head.to_vec();
    data.extend(pieces.concat());
    data
}

/// Bytes of an SSE stream: field names, values, every line ending, a BOM, comments, non-UTF-8.
fn sse_piece() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        select(&[
            "data:",
            "data: ",
            "data",
            "event:",
            "event: ping",
            "id:",
            "id: 7",
            "id: 0/3",
            "retry:",
            "retry: 3000",
            "retry: 12x",
            ":",
            ": comment",
            "\n",
            "\r",
            "\r\n",
            "\n\n",
            "\u{FEFF}",
            "x",
            "é",
            "\0",
            "{\"jsonrpc\":\"2.0\"}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..4),
    ]
}

/// A header value or a body part for the classifier.
fn classify_part() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        select(&[
            "",
            "2025-03-26",
            "2025-06-18",
            "2025-11-25",
            "2026-07-28",
            "1999-01-01",
            "tools/call",
            "tools/list",
            "deploy_release",
            "0/1",
            "session-1",
            "\u{7f}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        vec(
            any::<u8>().prop_filter("not the separator", |&b| b != 0xFF),
            0..8
        ),
    ]
}

/// A JSON-RPC body: a message or a batch built from real shapes, sometimes bent.
fn classify_body() -> impl Strategy<Value = Vec<u8>> {
    let id = prop_oneof![
        Just(Value::from(7)),
        Just(Value::from("a")),
        Just(Value::Null),
        Just(Value::from(1.5))
    ];
    let method = select(&[
        "tools/call",
        "tools/list",
        "initialize",
        "notifications/x",
        "",
    ]);
    let name = prop_oneof![
        select(&["deploy_release", "create_payment", ""]).prop_map(Value::from),
        Just(Value::from(3)),
    ];
    let message = (id, method, name, arb_json(), any::<u8>()).prop_map(
        |(id, method, name, arguments, shape)| {
            let mut message = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method,
                "params": {"name": name, "arguments": arguments, "_meta": {"progressToken": 1}}});
            let object = message.as_object_mut().unwrap();
            match shape % 6 {
                0 => drop(object.remove("id")),
                1 => drop(object.remove("method")),
                2 => drop(object.insert("result".into(), Value::from(1))),
                3 => drop(object.insert("jsonrpc".into(), Value::from("1.0"))),
                _ => {}
            }
            message
        },
    );
    (vec(message, 1..3), any::<u8>()).prop_map(|(messages, shape)| {
        let mut text = match shape % 4 {
            0 => serde_json::to_vec(&messages).unwrap(),
            1 => serde_json::to_string(&messages[0])
                .unwrap()
                .replacen("\"params\":{", "\"params\":{\"name\":\"twice\",", 1)
                .into_bytes(),
            _ => serde_json::to_vec(&messages[0]).unwrap(),
        };
        if shape % 4 == 2 {
            text.truncate(text.len() / 2);
        }
        text
    })
}

/// Any JSON value: every kind of key and string, numbers over the whole range.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// JSON text for the canonicaliser: generated values, and number literals of every spelling.
fn canonicalise_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        arb_json().prop_map(|v| serde_json::to_vec_pretty(&v).unwrap()),
        "-?[0-9]{1,25}(\\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?".prop_map(String::into_bytes),
        "\\[(-?[0-9]{1,20}(\\.[0-9]{0,5})?,){0,4}0\\]".prop_map(String::into_bytes),
        "\\{\"[a-z\u{e9}\u{1f600}\u{ff61}]{0,3}\":1(,\"[a-z\u{e9}\u{1f600}\u{ff61}]{0,3}\":2){0,4}\\}"
            .prop_map(String::into_bytes),
    ]
}

/// Bytes for the ledger reader: real chain lines bent by one edit, blanks, and noise.
fn ledger_bytes() -> impl Strategy<Value = Vec<u8>> {
    let mut lines = invariants::valid_chain();
    lines.push(String::new());
    let edit = (
        select(lines),
        any::<prop::sample::Index>(),
        any::<u8>(),
        0u8..5,
    );
    prop_oneof![
        edit.prop_map(|(line, at, byte, how)| {
            let mut bytes = line.into_bytes();
            if bytes.is_empty() {
                return vec![byte];
            }
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] ^= 1 << (byte % 8),
                1 => bytes.truncate(i),
                2 => bytes.insert(i, byte),
                3 => bytes[i] = b'\n',
                _ => drop(bytes.remove(i)),
            }
            bytes
        }),
        select(&["", " ", "\t", "\u{3000}", "\r", "{}", "null", "[]"])
            .prop_map(|s| s.as_bytes().to_vec()),
        vec(any::<u8>(), 0..64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sse_parser_is_split_invariant_and_bounded(
        head in any::<[u8; 2]>(),
        pieces in vec(sse_piece(), 0..40),
    ) {
        invariants::sse_parser(&framed(&head, pieces));
    }

    #[test]
    fn classify_gives_a_typed_answer_that_agrees_with_the_request(
        selector in any::<u8>(),
        parts in vec(classify_part(), 5),
        body in prop_oneof![classify_body(), vec(any::<u8>(), 0..32)],
    ) {
        let mut data = vec![selector];
        for part in parts {
            data.extend(part);
            data.push(0xFF);
        }
        data.extend(body);
        invariants::classify(&data);
    }

    #[test]
    fn canonical_json_roundtrips_is_a_fixed_point_and_matches_serde_jcs(
        input in canonicalise_input(),
    ) {
        invariants::canonicalise(&input);
    }
}

proptest! {
    // Each case writes a ledger file and opens it (a writer thread, a few fsyncs).
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_corrupt_ledger_line_is_reported_never_accepted(
        selector in any::<u8>(),
        bytes in ledger_bytes(),
    ) {
        let mut data = vec![selector];
        data.extend(bytes);
        invariants::ledger_line(&data);
    }
}

// Regressions: inputs the stand-ins above found, each against the fix it led to.

#[test]
fn a_tools_call_notification_is_refused_not_passed_through_unguarded() {
    // Without an `id` it classified as a plain notification, which the guard passes through.
    let body = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"deploy_release"}}"#;
    let result =
        mcp_replay_guard::protocol::classify(&http::Method::POST, &http::HeaderMap::new(), body);
    assert!(
        matches!(
            result,
            Err(mcp_replay_guard::protocol::ClassifyError::InvalidEnvelope(
                _
            ))
        ),
        "{result:?}"
    );
}

/// The valid chain with `inserted` as an extra line before line `at` (0-based).
fn chain_with(at: usize, inserted: &str) -> Vec<String> {
    let mut lines = invariants::valid_chain();
    lines.insert(at, inserted.to_owned());
    lines
}

/// Writes `lines` as a ledger file, opens it, and returns the outcome of the open and the
/// file's bytes before and after.
fn open_lines(name: &str, lines: &[String]) -> (Result<(), String>, Vec<u8>, Vec<u8>) {
    let path = invariants::scratch_path(name);
    let before = (lines.join("\n") + "\n").into_bytes();
    std::fs::write(&path, &before).unwrap();
    let opened = mcp_replay_guard::ledger::FileLedger::open(&path)
        .map(drop)
        .map_err(|e| e.to_string());
    let after = std::fs::read(&path).unwrap();
    invariants::remove_scratch(&path);
    (opened, before, after)
}

#[test]
fn a_garbled_line_inside_the_ledger_is_refused_not_cut_with_every_line_after_it() {
    // Opening used to cut the file at the first unreadable line, acknowledged lines after it
    // included (here the `authorized` and `dispatched` of an execution).
    let (opened, before, after) = open_lines("garbled", &chain_with(1, "{\"seq\":2,\"prev\":"));
    let error = opened.unwrap_err();
    assert!(error.contains("seq 2"), "{error}");
    assert_eq!(before, after, "the file is left as it is");
}

#[test]
fn an_edited_ledger_line_is_refused_on_open() {
    // Opening used to take a line without checking its hash or link: a forged event entered
    // the index and the next append chained onto it.
    let mut lines = invariants::valid_chain();
    lines[1] = lines[1].replace("\"authorized\"", "\"not_sent\",\"reason\":\"forged\"");
    let (opened, before, after) = open_lines("edited", &lines);
    let error = opened.unwrap_err();
    assert!(
        error.contains("seq 2") && error.contains("edited"),
        "{error}"
    );
    assert_eq!(before, after, "the file is left as it is");
}

#[test]
fn a_whitespace_only_line_does_not_cut_the_ledger() {
    // `audit verify` skips it; opening used to take it for a torn tail and cut every line
    // after it.
    let (opened, before, after) = open_lines("whitespace", &chain_with(1, " \t"));
    opened.unwrap();
    assert!(
        after.starts_with(&before),
        "every line is kept (recovery may append after them)"
    );
}
