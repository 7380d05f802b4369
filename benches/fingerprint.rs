//! Intent fingerprint of a `tools/call` with 1 KiB of arguments, against its floor: SHA-256 of
//! the same body bytes, measured in the same run.
//!
//! `cargo bench --bench fingerprint`

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use mcp_replay_guard::{
    fingerprint::{ActionRecord, Channel, FingerprintKey, FingerprintRules},
    protocol::{self, Message, RequestKind},
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// A `tools/call` body whose arguments serialise to about 1 KiB.
fn body() -> Vec<u8> {
    let mut arguments = Map::new();
    for i in 0..16 {
        arguments.insert(format!("field_{i:02}"), json!({"name": format!("value-{i:04}"), "n": i * 1000 + 7, "flag": i % 2 == 0, "tags": ["a", "b"]}));
    }
    let arguments = Value::Object(arguments);
    let size = serde_json::to_vec(&arguments).unwrap().len();
    assert!((900..=1200).contains(&size), "arguments are {size} bytes");
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "deploy_release", "arguments": arguments}}))
    .unwrap()
}

fn record(arguments: Map<String, Value>) -> ActionRecord<'static> {
    ActionRecord::new(
        "signed-process:com.example.agent".into(),
        "run:5f8097".into(),
        "deploy_release",
        Channel::mcp("deploy-api.internal.example/mcp".into()),
    )
    .credential_ref("deploy-service".into())
    .argument_map(arguments)
}

fn parsed_arguments(body: &[u8]) -> Map<String, Value> {
    match protocol::classify(&Method::POST, &HeaderMap::new(), body)
        .unwrap()
        .kind
    {
        RequestKind::Message(Message::ToolCall(call)) => call.arguments,
        other => panic!("{other:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let body = body();
    let key = FingerprintKey::from_bytes(&[7; 32]).unwrap();
    let rules = FingerprintRules::new();
    let headers = HeaderMap::new();
    let arguments = parsed_arguments(&body);

    let mut group = c.benchmark_group("fingerprint_1KiB");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("baseline_sha256_of_body", |b| {
        b.iter(|| Sha256::digest(black_box(&body)))
    });
    group.bench_function("fingerprint_parsed_call", |b| {
        b.iter_batched(
            || record(arguments.clone()),
            |record| key.fingerprint(black_box(record), &rules),
            BatchSize::SmallInput,
        )
    });
    // The same canonical record through the serde_jcs crate (the test oracle), which the crate
    // used first: re-parses every key and buffers every member.
    let canonical_value: Value = serde_json::from_slice(
        key.canonicalize(record(arguments.clone()), &rules)
            .as_bytes(),
    )
    .unwrap();
    group.bench_function("fingerprint_via_serde_jcs", |b| {
        b.iter(|| {
            use hmac::{Hmac, KeyInit, Mac};
            let mut mac = <Hmac<Sha256>>::new_from_slice(&[7; 32]).unwrap();
            mac.update(&serde_jcs::to_vec(black_box(&canonical_value)).unwrap());
            mac.finalize().into_bytes()
        })
    });
    group.bench_function("classify_and_fingerprint", |b| {
        b.iter(|| {
            let request = protocol::classify(&Method::POST, &headers, black_box(&body)).unwrap();
            let RequestKind::Message(Message::ToolCall(call)) = request.kind else {
                unreachable!()
            };
            key.fingerprint(record(call.arguments), &rules)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
