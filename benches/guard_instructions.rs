//! Instructions per `tools/call` under valgrind's callgrind: exact counts that the load of a
//! shared machine does not move, for the in-process guard path of `benches/guard.rs` and the
//! classify + fingerprint path of `benches/fingerprint.rs`, each next to its floor.
//!
//! `cargo bench --bench guard_instructions` (needs valgrind and
//! `cargo install gungraun-runner --version 0.20.0 --locked`)
//!
//! Each function below is one call: callgrind counts only inside it, so the setup functions
//! (runtime, ledger, layer, key) and the teardown that drops their state are not counted. Every
//! setup makes the same call once first, so that one-time work (thread-locals, CPU feature
//! detection, the ledger's first allocations) is not counted either: what is counted is a call
//! in steady state, as criterion measures it.
//!
//! Under valgrind, `sha2` runs its software SHA-256: valgrind does not emulate the SHA
//! extensions that `sha2` uses natively when the CPU has them. Every SHA-256 here (the floors'
//! and the fingerprint's) is therefore the software one, and the ratio of classify + fingerprint
//! to SHA-256 is far lower in instructions than in criterion's wall time.

use std::hint::black_box;

use bytes::Bytes;
use gungraun::prelude::*;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, Method};
use http_body_util::Full;
use mcp_replay_guard::{
    fingerprint::{FingerprintKey, FingerprintRules},
    protocol::{self, Message, RequestKind},
};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use tokio::runtime::{Handle, Runtime};
use tower::Layer;

mod support;
use support::tools_call::{InProcessServer, body, call_and_read, guard_layer, key, record};

type HmacSha256 = Hmac<Sha256>;

/// The floor of the guard: one parse of the body into a `Value` and an HMAC-SHA256 of it (the
/// MAC keyed once, as `FingerprintKey` keys it, and cloned per call).
fn parse_and_mac(body: &[u8], mac: &HmacSha256) -> [u8; 32] {
    let parsed: Value = serde_json::from_slice(body).unwrap();
    black_box(&parsed);
    let mut mac = mac.clone();
    mac.update(body);
    mac.finalize().into_bytes().into()
}

fn setup_floor() -> (Bytes, HmacSha256) {
    let state = (body(), HmacSha256::new_from_slice(&[7; 32]).unwrap());
    parse_and_mac(&state.0, &state.1);
    state
}

#[library_benchmark]
#[bench::once(setup = setup_floor)]
fn floor_parse_and_hmac(state: (Bytes, HmacSha256)) -> (Bytes, HmacSha256) {
    black_box(parse_and_mac(black_box(&state.0), &state.1));
    state
}

/// A current-thread runtime, as criterion's `to_async` runs `benches/guard.rs`.
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `call`, then the tasks it spawned (the guard records some ledger writes in tasks of
/// their own) until none is left: all the work of one call is counted in that call, none of it
/// in the next.
fn run_to_quiet(rt: &Runtime, call: impl Future<Output = ()>) {
    rt.block_on(async {
        call.await;
        for _ in 0..100 {
            if Handle::current().metrics().num_alive_tasks() == 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the call left tasks running");
    });
}

fn bare_call(rt: &Runtime, body: &Bytes) {
    run_to_quiet(
        rt,
        call_and_read(&mut InProcessServer, Full::new(body.clone())),
    );
}

fn setup_bare() -> (Runtime, Bytes) {
    let state = (runtime(), body());
    bare_call(&state.0, &state.1);
    state
}

#[library_benchmark]
#[bench::once(setup = setup_bare)]
fn bare_service(state: (Runtime, Bytes)) -> (Runtime, Bytes) {
    bare_call(&state.0, black_box(&state.1));
    state
}

type Guarded = mcp_replay_guard::guard::Guard<InProcessServer>;

/// A new execution each call, through a clone of the guarded service (as `benches/guard.rs`).
fn guarded_call(rt: &Runtime, guarded: &Guarded, body: &Bytes) {
    let mut guarded = guarded.clone();
    run_to_quiet(rt, call_and_read(&mut guarded, Full::new(body.clone())));
}

fn setup_guarded() -> (Runtime, Guarded, Bytes) {
    let state = (runtime(), guard_layer().layer(InProcessServer), body());
    guarded_call(&state.0, &state.1, &state.2);
    state
}

#[library_benchmark]
#[bench::once(setup = setup_guarded)]
fn guarded(state: (Runtime, Guarded, Bytes)) -> (Runtime, Guarded, Bytes) {
    guarded_call(&state.0, &state.1, black_box(&state.2));
    state
}

fn setup_body() -> Bytes {
    let body = body();
    black_box(Sha256::digest(&body));
    body
}

#[library_benchmark]
#[bench::once(setup = setup_body)]
fn sha256_of_body(body: Bytes) -> Bytes {
    black_box(Sha256::digest(black_box(&body)));
    body
}

/// The guard's path from bytes to fingerprint, as `benches/fingerprint.rs` measures it.
fn classify_and_fingerprint_call(body: &[u8], key: &FingerprintKey, rules: &FingerprintRules) {
    let request = protocol::classify(&Method::POST, &HeaderMap::new(), body).unwrap();
    let RequestKind::Message(Message::ToolCall(call)) = request.kind else {
        unreachable!()
    };
    black_box(key.fingerprint(record(Map::new()).call_arguments(&call), rules));
}

fn setup_fingerprint() -> (Bytes, FingerprintKey, FingerprintRules) {
    let state = (body(), key(), FingerprintRules::new());
    classify_and_fingerprint_call(&state.0, &state.1, &state.2);
    state
}

#[library_benchmark]
#[bench::once(setup = setup_fingerprint)]
fn classify_and_fingerprint(
    state: (Bytes, FingerprintKey, FingerprintRules),
) -> (Bytes, FingerprintKey, FingerprintRules) {
    classify_and_fingerprint_call(black_box(&state.0), &state.1, &state.2);
    state
}

library_benchmark_group!(
    name = guard_in_process_1kib,
    benchmarks = [floor_parse_and_hmac, bare_service, guarded]
);

library_benchmark_group!(
    name = fingerprint_1kib,
    benchmarks = [sha256_of_body, classify_and_fingerprint]
);

main!(
    library_benchmark_groups = guard_in_process_1kib,
    fingerprint_1kib
);
