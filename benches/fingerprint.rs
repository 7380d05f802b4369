//! Intent fingerprint of a `tools/call` with 1 KiB of arguments, against its floor: SHA-256 of
//! the same body bytes, measured in the same run.
//!
//! `cargo bench --bench fingerprint`

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{HeaderMap, Method};
use mcp_replay_guard::{
    fingerprint::FingerprintRules,
    protocol::{self, Message, RequestKind},
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

mod support;
use support::tools_call::{body, key, record};

fn parsed_arguments(body: &[u8]) -> Map<String, Value> {
    match protocol::classify(&Method::POST, &HeaderMap::new(), body)
        .unwrap()
        .kind
    {
        RequestKind::Message(Message::ToolCall(call)) => call.arguments().clone(),
        other => panic!("{other:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let body = body();
    let key = key();
    let rules = FingerprintRules::new();
    let headers = HeaderMap::new();
    let arguments = parsed_arguments(&body);

    let mut group = c.benchmark_group("fingerprint_1KiB");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("baseline_sha256_of_body", |b| {
        b.iter(|| Sha256::digest(black_box(&body)))
    });
    // What any one JSON parse of the body costs at least: serde_json reading it through,
    // keeping nothing. The classify + fingerprint path cannot go below it.
    group.bench_function("serde_json_skim_of_body", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).unwrap())
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
            key.fingerprint(record(Map::new()).call_arguments(&call), &rules)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
