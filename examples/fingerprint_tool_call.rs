//! Classifies and fingerprints real `tools/call` requests the way the guard will.
//!
//! Two requests for the same deployment arrive as an agent retries after a lost response: the
//! second has a new JSON-RPC id, its keys in another order, a progress token and an explicit
//! default. The example shows that the protocol layer sees two `tools/call`s, that both have the
//! same intent fingerprint, what contract governs them, and the `Idempotency-Key` the guard
//! would send. A third request, for another version, is a different intent.
//!
//! Run with `cargo run --example fingerprint_tool_call`.

use http::{HeaderMap, HeaderValue, Method};
use mcp_replay_guard::{
    Actor, CredentialRef, ExecutionId, IdempotencyKeyFormat, IntentScope, Target,
    contract::ContractRegistry,
    fingerprint::{ActionRecord, Channel, FingerprintKey},
    protocol::{self, Message, RequestKind},
};

const FIRST: &str = r#"{"jsonrpc":"2.0","id":41,"method":"tools/call",
  "params":{"name":"deploy_release","arguments":{"service":"catalog","version":"2026.07.22","note":"friday deploy"}}}"#;
const RETRY: &str = r#"{"params":{"_meta":{"progressToken":"p-7"},"name":"deploy_release",
  "arguments":{"region":"us-east-1","version":"2026.07.22","service":"catalog"}},
  "method":"tools/call","id":"retry-1","jsonrpc":"2.0"}"#;
const OTHER: &str = r#"{"jsonrpc":"2.0","id":42,"method":"tools/call",
  "params":{"name":"deploy_release","arguments":{"service":"catalog","version":"2026.07.23"}}}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let registry = ContractRegistry::from_toml_str(include_str!("policy.toml"))?;
    // In production the key is kept beside the ledger; the example draws a fresh one.
    let key = FingerprintKey::generate()?;
    let target = Target::from("deploy-api.internal.example/mcp");

    let mut headers = HeaderMap::new();
    headers.insert(
        "mcp-protocol-version",
        HeaderValue::from_static("2025-11-25"),
    );
    headers.insert(
        "mcp-session-id",
        HeaderValue::from_static("1868a90c-2f4b-4a3e"),
    );
    headers.insert(
        "authorization",
        HeaderValue::from_static("Bearer never-fingerprinted"),
    );

    let mut fingerprints = Vec::new();
    for (label, body) in [
        ("first attempt", FIRST),
        ("agent retry", RETRY),
        ("new version", OTHER),
    ] {
        let request = protocol::classify(&Method::POST, &headers, body.as_bytes())?;
        let RequestKind::Message(Message::ToolCall(call)) = request.kind else {
            return Err("expected a tools/call".into());
        };
        let resolved = registry.resolve(&call.name, &target, None)?;
        let record = ActionRecord::new(
            Actor::from("signed-process:com.example.agent"),
            IntentScope::from("run:5f8097"),
            call.name.clone(),
            Channel::mcp(target.clone()),
        )
        .credential_ref(CredentialRef::from("deploy-service"))
        .call_arguments(&call);
        let canonical = key.canonicalize(record, resolved.contract.fingerprint_rules());
        let fingerprint = key.digest(&canonical);
        println!(
            "{label}: {} {} (JSON-RPC id {}, era {:?}, session {:?})",
            request.version,
            call.name,
            call.id,
            request.version.era(),
            request.session_id
        );
        println!(
            "  contract:    {} ({:?})",
            resolved.contract.class(),
            resolved.source
        );
        println!(
            "  canonical:   {}",
            String::from_utf8_lossy(canonical.as_bytes())
        );
        println!("  fingerprint: {fingerprint}");
        fingerprints.push(fingerprint);
    }

    let same = fingerprints[0] == fingerprints[1];
    println!("\nretry is the same intent as the first attempt: {same}");
    println!(
        "new version is the same intent: {}",
        fingerprints[0] == fingerprints[2]
    );
    let execution = ExecutionId::new();
    println!("execution ID for the first attempt: {execution}");
    println!(
        "Idempotency-Key: {:?}",
        execution.to_idempotency_key(IdempotencyKeyFormat::Raw)
    );
    println!(
        "Idempotency-Key (structured field): {:?}",
        execution.to_idempotency_key(IdempotencyKeyFormat::StructuredField)
    );

    let resume = protocol::classify(
        &Method::GET,
        &{
            let mut h = headers.clone();
            h.insert("last-event-id", HeaderValue::from_static("0/3"));
            h.insert("mcp-method", HeaderValue::from_static("server/discover"));
            h
        },
        b"",
    )?;
    println!(
        "GET with Last-Event-ID is {:?}: a resume, never a re-issue",
        resume.kind
    );

    if !same || fingerprints[0] == fingerprints[2] {
        return Err("fingerprints did not behave as the contract says".into());
    }
    Ok(())
}
