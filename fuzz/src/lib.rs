//! The invariants the fuzz targets check, one function per target. Each takes the fuzzer's bytes
//! and panics when an invariant breaks (that is what a fuzzer reports as a crash).
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and by the proptest stand-ins
//! (`tests/fuzz_standins.rs` includes this file as a module), so CI checks the same invariants
//! whether or not cargo-fuzz is installed.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use mcp_replay_guard::{
    ExecutionId,
    execution::{Claim, EventKind, LedgerEvent, RetryClass, Timestamp},
    fingerprint::canonical_json,
    ledger::{
        FileLedger,
        chain::{self, ChainHash, ChainedLine, LineBody},
        verify_file,
    },
    protocol::{
        self, LAST_EVENT_ID, MCP_METHOD, MCP_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID, Message,
        RequestKind,
    },
    tools::sse::{SseError, SseEvent, SseParser},
};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// sse_parser

/// What a parse produced: the events, the error if any, and the state left behind.
#[derive(Debug, PartialEq)]
struct SseOutcome {
    events: Vec<SseEvent>,
    error: Option<SseError>,
    last_event_id: String,
    retry: Option<std::time::Duration>,
}

fn parse_sse_chunks<'a>(max: usize, chunks: impl IntoIterator<Item = &'a [u8]>) -> SseOutcome {
    let mut parser = SseParser::with_max_event_size(max);
    let mut events = Vec::new();
    let mut error = None;
    for chunk in chunks {
        if let Err(e) = parser.push(chunk, |event| events.push(event)) {
            error = Some(e);
            break;
        }
    }
    SseOutcome {
        events,
        error,
        last_event_id: parser.last_event_id().to_owned(),
        retry: parser.retry(),
    }
}

/// Chunk lengths from a seed (a small LCG): 0 to 7 bytes, empty chunks included.
fn chunk_lengths(seed: u8) -> impl Iterator<Item = usize> {
    let mut state = u32::from(seed) | 1;
    std::iter::repeat_with(move || {
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        ((state >> 16) % 8) as usize
    })
}

fn split_by(input: &[u8], lengths: impl Iterator<Item = usize>) -> Vec<&[u8]> {
    let mut chunks = Vec::new();
    let mut rest = input;
    for len in lengths {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at(len.min(rest.len()));
        chunks.push(chunk);
        rest = tail;
    }
    chunks
}

/// `SseParser`: no panic; no event larger than the bound; the same events, error, last event ID
/// and retry however the input is split into chunks (whole, byte by byte, or arbitrary splits).
///
/// Input: byte 0 picks the event size bound, byte 1 seeds the chunk split, the rest is the stream.
pub fn sse_parser(data: &[u8]) {
    let [bound, seed, stream @ ..] = data else {
        return;
    };
    let max = 1 + usize::from(*bound) * 4;
    let whole = parse_sse_chunks(max, [stream]);
    for event in &whole.events {
        // The bound covers the data buffer (with the LF after each data line), the event type
        // and the id of the block being built.
        let event_type = if event.event == "message" {
            0
        } else {
            event.event.len()
        };
        let size = event.data.len() + 1 + event_type + event.id.as_ref().map_or(0, String::len);
        assert!(
            size <= max,
            "an event of {size} bytes passed a {max}-byte bound"
        );
    }
    let bytewise = parse_sse_chunks(max, stream.chunks(1));
    assert_eq!(whole, bytewise, "byte-by-byte parse differs from the whole");
    let split = parse_sse_chunks(max, split_by(stream, chunk_lengths(*seed)));
    assert_eq!(whole, split, "a chunked parse differs from the whole");
    if let Some(error) = &whole.error {
        assert!(error.is_event_too_large());
    }
}

// ---------------------------------------------------------------------------------------------
// classify

/// `protocol::classify`: no panic; a typed error or a classification, the same on a second call;
/// what it says agrees with the HTTP method, the headers and a plain JSON parse of the body.
///
/// Input: byte 0 picks the method (2 bits) and which MCP headers are present (5 bits); the rest
/// is split at `0xFF` bytes (never in UTF-8) into the five header values and the body.
pub fn classify(data: &[u8]) {
    let [selector, rest @ ..] = data else {
        return;
    };
    let method =
        [Method::POST, Method::GET, Method::DELETE, Method::PUT][usize::from(selector & 3)].clone();
    let names: [HeaderName; 5] = [
        MCP_PROTOCOL_VERSION,
        MCP_SESSION_ID,
        LAST_EVENT_ID,
        MCP_METHOD,
        MCP_NAME,
    ];
    let mut parts = rest.splitn(6, |&b| b == 0xFF);
    let mut headers = HeaderMap::new();
    for (i, name) in names.into_iter().enumerate() {
        let value = parts.next().unwrap_or_default();
        if selector >> (2 + i) & 1 == 1
            && let Ok(value) = HeaderValue::from_bytes(value)
        {
            headers.insert(name, value);
        }
    }
    let body = parts.next().unwrap_or_default();

    let result = protocol::classify(&method, &headers, body);
    assert_eq!(
        result,
        protocol::classify(&method, &headers, body),
        "not deterministic"
    );
    let Ok(request) = result else {
        return;
    };
    assert_ne!(method, Method::PUT, "PUT is not part of Streamable HTTP");
    let last_event_id = headers.get(LAST_EVENT_ID).map(|v| v.as_bytes());
    match &request.kind {
        RequestKind::Resume { last_event_id: id } => {
            assert_eq!(method, Method::GET);
            assert!(!id.is_empty());
            assert_eq!(Some(id.as_bytes()), last_event_id);
        }
        RequestKind::Listen => {
            assert_eq!(method, Method::GET);
            assert!(last_event_id.is_none_or(<[u8]>::is_empty));
        }
        RequestKind::EndSession => assert_eq!(method, Method::DELETE),
        RequestKind::Message(message) => {
            assert_eq!(method, Method::POST);
            let value: Value = serde_json::from_slice(body).expect("classified, so it is JSON");
            assert_message_matches(message, &value);
        }
        RequestKind::Batch(messages) => {
            assert_eq!(method, Method::POST);
            let value: Value = serde_json::from_slice(body).expect("classified, so it is JSON");
            let items = value.as_array().expect("a batch is an array");
            assert!(!items.is_empty());
            assert_eq!(items.len(), messages.len());
            for (message, item) in messages.iter().zip(items) {
                assert_message_matches(message, item);
            }
        }
    }
}

/// A classified message says what a plain JSON parse of it says.
fn assert_message_matches(message: &Message, value: &Value) {
    match message {
        Message::ToolCall(call) => {
            assert_eq!(value["method"], protocol::TOOLS_CALL);
            assert_eq!(value["params"]["name"], call.name.as_str());
            let arguments = value["params"].get("arguments").and_then(Value::as_object);
            assert_eq!(&arguments.cloned().unwrap_or_default(), call.arguments());
            // The form written while parsing is the tree writer's form of the same arguments.
            let tree = Value::Object(call.arguments().clone());
            assert_eq!(call.canonical_arguments(), canonical_json(&tree));
        }
        Message::Request { method, .. } | Message::Notification { method } => {
            assert_eq!(value["method"], method.as_str());
            assert_ne!(method, protocol::TOOLS_CALL);
        }
        Message::Response { .. } => assert!(value.get("method").is_none()),
    }
}

// ---------------------------------------------------------------------------------------------
// canonicalise

/// The crate's RFC 8785 writer: on any JSON the parser accepts, the output is UTF-8 JSON that
/// parses back to the same value (numbers compared as the doubles JCS makes of them, and an
/// integer past 2^53 as the string of its exact digits, RFC 8785 Appendix D), writing it again
/// is a fixed point, and it is byte for byte what `serde_jcs` writes wherever the two agree on
/// what a number is.
pub fn canonicalise(data: &[u8]) {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let canonical = canonical_json(&value);
    let text = std::str::from_utf8(&canonical).expect("canonical JSON is UTF-8");
    let reparsed: Value = serde_json::from_str(text).expect("canonical JSON parses");
    assert!(
        same_as_doubles(&value, &reparsed),
        "canonical form changed the value: {text}"
    );
    assert_eq!(
        canonical_json(&reparsed),
        canonical,
        "canonicalising is not a fixed point"
    );
    // Past 2^53 this crate writes integers as strings (RFC 8785 Appendix D); serde_jcs does not.
    if all_integers_exact(&value)
        && let Ok(reference) = serde_jcs::to_vec(&value)
    {
        assert_eq!(
            text,
            String::from_utf8_lossy(&reference),
            "differs from serde_jcs"
        );
    }
}

/// Equal, with every number compared as an IEEE-754 double (what RFC 8785 makes of it), and
/// an integer past 2^53 (an integer literal, or a double between 2^53 and 2^64, all of which
/// are integers) equal to the string of its exact decimal digits.
fn same_as_doubles(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::String(digits)) => {
            wide_integer_digits(x).as_ref() == Some(digits)
        }
        (Value::Number(x), Value::Number(y)) => {
            wide_integer_digits(x).is_none() && x.as_f64() == y.as_f64()
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_as_doubles(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_as_doubles(v, w)))
        }
        _ => a == b,
    }
}

/// The exact digits of a number the canonical writer spells as a string.
fn wide_integer_digits(n: &serde_json::Number) -> Option<String> {
    const EXACT: u64 = 1 << 53;
    if let Some(u) = n.as_u64() {
        return (u > EXACT).then(|| u.to_string());
    }
    if let Some(i) = n.as_i64() {
        return (i.unsigned_abs() > EXACT).then(|| i.to_string());
    }
    let d = n.as_f64()?;
    (d.fract() == 0.0 && d.abs() > EXACT as f64 && d.abs() < 18_446_744_073_709_551_616.0)
        .then(|| (d as i128).to_string())
}

/// Whether every integer in the value is exactly a double (|n| ≤ 2^53).
fn all_integers_exact(value: &Value) -> bool {
    const EXACT: u64 = 1 << 53;
    match value {
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u <= EXACT,
            (None, Some(i)) => i.unsigned_abs() <= EXACT,
            _ => wide_integer_digits(n).is_none(),
        },
        Value::Array(items) => items.iter().all(all_integers_exact),
        Value::Object(map) => map.values().all(all_integers_exact),
        _ => true,
    }
}

// ---------------------------------------------------------------------------------------------
// ledger_line

/// The lines of a real, valid chain: one execution accepted, authorized and dispatched (the
/// state a crash leaves), with fixed ids and times so that every run sees the same bytes.
pub fn valid_chain() -> Vec<String> {
    let id: ExecutionId = "act_01J4K8J7DX7VQ9ZB3N5M2P6R8T"
        .parse()
        .expect("a valid execution id");
    let mut claim = Claim::new(
        format!("hmac-sha256:{:064x}", 42)
            .parse()
            .expect("a valid fingerprint"),
        "deploy_release",
        "signed-process:com.example.agent".into(),
        "run:5f8097".into(),
        "deploy-api.internal.example/mcp".into(),
        RetryClass::Irreversible,
        "guard:fuzz",
    );
    claim.credential_ref = Some("deploy-service".into());
    claim.link_window = std::time::Duration::from_secs(600);
    claim.retention = std::time::Duration::from_secs(86_400);
    claim.at = Timestamp::from_millis(1_780_000_000_000);
    let event = |millis: u64, kind| LedgerEvent {
        execution_id: id,
        at: Timestamp::from_millis(1_780_000_000_000 + millis),
        kind,
    };
    let dispatched = EventKind::Dispatched {
        attempt: 1,
        idempotency_key: id.into(),
        key_from_caller: false,
        jsonrpc_id: Some(7.into()),
        session_id: None,
        client_info: None,
        owner: Some("guard:fuzz".into()),
    };
    let events = [
        claim.accepted_event(id),
        event(1, EventKind::Authorized),
        event(2, dispatched),
    ];
    let mut prev = ChainHash::GENESIS;
    (1..)
        .zip(events)
        .map(|(seq, event)| {
            let line = ChainedLine::seal(seq, prev, LineBody::Event(event));
            prev = line.hash;
            line.to_json_line()
        })
        .collect()
}

/// A reference for `chain::verify`, written as plainly as possible: every non-blank line parses,
/// carries the hash of its own content, and follows the line before it (`seq` + 1, `prev` = its
/// hash); the first may be a checkpoint that starts a compacted chain.
fn chain_is_valid(text: &str) -> bool {
    let mut head: Option<(u64, ChainHash)> = None;
    for line in text.split('\n').filter(|l| !l.trim().is_empty()) {
        let Ok(line) = chain::parse_line(line) else {
            return false;
        };
        let follows = match head {
            None => {
                matches!(line.body, LineBody::Checkpoint { .. })
                    || (line.seq == 1 && line.prev == ChainHash::GENESIS)
            }
            Some((seq, hash)) => line.seq == seq + 1 && line.prev == hash,
        };
        if !follows || line.compute_hash() != line.hash {
            return false;
        }
        head = Some((line.seq, line.hash));
    }
    true
}

/// A scratch path for a ledger file, unique to this process: on tmpfs when there is one (the
/// fsyncs cost nothing). The ledger's `<file>.owners/` directory goes beside it.
pub fn scratch_path(name: &str) -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = base.join("mrg-fuzz");
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir.join(format!("{}-{name}.jsonl", std::process::id()))
}

/// Removes a scratch ledger file and its owners directory.
pub fn remove_scratch(path: &Path) {
    let _ = std::fs::remove_file(path);
    let mut owners = path.as_os_str().to_owned();
    owners.push(".owners");
    let _ = std::fs::remove_dir_all(owners);
}

/// The file ledger's line reader and chain check: arbitrary bytes placed in a real chain (as
/// one or more lines, or a torn tail) are never silently accepted.
///
/// - `chain::verify` (what `replay-guard audit verify` runs) agrees with a plain reference.
/// - `FileLedger::open` on that file does not panic. When it opens, the file it leaves behind
///   verifies and still holds every line of the original chain: a corrupt line was refused or
///   cut as a torn tail, never built upon, and no acknowledged line was thrown away with it.
///   A file that is a valid chain always opens.
///
/// Input: byte 0 picks where the bytes go (bits 0-1: before line 1, 2 or 3, or after the
/// last; bit 2: at the end, whether a newline closes them); the rest are the bytes.
pub fn ledger_line(data: &[u8]) {
    let [selector, inserted @ ..] = data else {
        return;
    };
    let chain = valid_chain();
    let at = usize::from(selector & 3);
    let mut file = Vec::new();
    for line in &chain[..at] {
        file.extend_from_slice(line.as_bytes());
        file.push(b'\n');
    }
    file.extend_from_slice(inserted);
    if at < chain.len() || selector & 4 != 0 {
        file.push(b'\n');
    }
    for line in &chain[at..] {
        file.extend_from_slice(line.as_bytes());
        file.push(b'\n');
    }

    let text = String::from_utf8_lossy(&file);
    let report = chain::verify(text.split('\n'));
    assert_eq!(
        report.is_ok(),
        chain_is_valid(&text),
        "chain::verify disagrees with the reference: {report}"
    );

    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = scratch_path(&format!("l{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&path, &file).expect("write the ledger file");
    let opened = FileLedger::open(&path);
    let opened_ok = opened.is_ok();
    // Dropping the ledger joins its writer thread: the file is final after this.
    drop(opened);
    let after = match verify_file(&path) {
        Ok(after) => Some(after),
        // A file whose first line is no ledger line is refused whole, and left untouched.
        Err(_) => {
            assert!(!opened_ok, "a file audit refuses as no ledger was opened");
            let now = std::fs::read(&path).expect("read the ledger file back");
            assert!(now == file, "a file refused as no ledger was changed");
            None
        }
    };
    remove_scratch(&path);
    if report.is_ok() {
        assert!(opened_ok, "a valid chain did not open");
    }
    if let (true, Some(after)) = (opened_ok, after) {
        assert!(
            after.is_ok(),
            "the ledger opened and left a file that does not verify: {after}"
        );
        assert!(
            after.verified >= chain.len() as u64,
            "the ledger opened but lost acknowledged lines: {after}"
        );
    }
}
