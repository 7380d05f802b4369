//! Classification fixtures built from the specification's own examples.

use http::{HeaderMap, HeaderValue, Method};
use serde_json::json;

use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(k, v)| {
            (
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            )
        })
        .collect()
}

const SESSION: &str = "1868a90c-2f4b-4a3e-bd0d-8a9e6bd5ae41";

/// The `tools/call` example of the 2025-11-25 "Tools" page.
const SPEC_TOOLS_CALL: &[u8] = br#"{
  "jsonrpc": "2.0",
  "id": 2,
  "method": "tools/call",
  "params": {
    "name": "get_weather",
    "arguments": {
      "location": "New York"
    }
  }
}"#;

fn tool_call(request: ClassifiedRequest) -> ToolCall {
    match request.kind {
        RequestKind::Message(Message::ToolCall(call)) => call,
        other => panic!("not a tools/call: {other:?}"),
    }
}

#[test]
fn post_tools_call_2025_11_25_with_session() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Session-Id", SESSION),
        ("Accept", "application/json, text/event-stream"),
    ]);
    let request = classify(&Method::POST, &h, SPEC_TOOLS_CALL).unwrap();
    assert_eq!(request.version, ProtocolVersion::V2025_11_25);
    assert_eq!(request.version.era(), Era::Sessions);
    assert_eq!(request.session_id.as_deref(), Some(SESSION));
    let call = tool_call(request);
    assert_eq!(call.id, RequestId::from(2));
    assert_eq!(call.name, "get_weather");
    assert_eq!(json!(call.arguments()), json!({"location": "New York"}));
    assert_eq!(call.meta, None);
    assert_eq!(call.task, None);
}

#[test]
fn post_tools_call_keeps_meta_task_and_other_params_apart_from_arguments() {
    let body = br#"{"jsonrpc":"2.0","id":"req-9","method":"tools/call","params":{
        "name":"deploy_release","arguments":{"service":"catalog"},
        "_meta":{"progressToken":"p-1"},"task":{"ttl":60000},"requestState":"opaque"}}"#;
    let call = tool_call(classify(&Method::POST, &HeaderMap::new(), body).unwrap());
    assert_eq!(call.id, RequestId::from("req-9"));
    assert_eq!(json!(call.meta), json!({"progressToken": "p-1"}));
    assert_eq!(call.task, Some(json!({"ttl": 60000})));
    assert_eq!(json!(call.other_params), json!({"requestState": "opaque"}));
    assert_eq!(json!(call.arguments()), json!({"service": "catalog"}));
}

#[test]
fn absent_arguments_read_as_an_empty_object() {
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ping"}}"#;
    let call = tool_call(classify(&Method::POST, &HeaderMap::new(), body).unwrap());
    assert!(call.arguments().is_empty());
}

#[test]
fn get_with_last_event_id_is_a_resume_even_with_a_stale_mcp_method() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Session-Id", SESSION),
        ("Last-Event-ID", "0/3"),
        // What rmcp sends on its resume GETs in stateless mode.
        ("Mcp-Method", "server/discover"),
    ]);
    let request = classify(&Method::GET, &h, b"").unwrap();
    assert_eq!(
        request.kind,
        RequestKind::Resume {
            last_event_id: "0/3".into()
        }
    );
    assert_eq!(request.kind.tool_calls().count(), 0);
}

#[test]
fn get_without_last_event_id_opens_a_listen_stream() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Session-Id", SESSION),
    ]);
    assert_eq!(
        classify(&Method::GET, &h, b"").unwrap().kind,
        RequestKind::Listen
    );
    let empty = headers(&[("Last-Event-ID", "")]);
    assert_eq!(
        classify(&Method::GET, &empty, b"").unwrap().kind,
        RequestKind::Listen
    );
}

#[test]
fn delete_ends_the_session() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Session-Id", SESSION),
    ]);
    let request = classify(&Method::DELETE, &h, b"").unwrap();
    assert_eq!(request.kind, RequestKind::EndSession);
    assert_eq!(request.session_id.as_deref(), Some(SESSION));
}

#[test]
fn batch_2025_03_26_classifies_each_message() {
    let body = br#"[
      {"jsonrpc":"2.0","method":"notifications/initialized"},
      {"jsonrpc":"2.0","id":3,"method":"tools/list"},
      {"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_weather","arguments":{"location":"Paris"}}},
      {"jsonrpc":"2.0","id":"srv-1","result":{"action":"accept"}}
    ]"#;
    // No MCP-Protocol-Version header: 2025-03-26, as the specification says.
    let request = classify(&Method::POST, &HeaderMap::new(), body).unwrap();
    assert_eq!(request.version, ProtocolVersion::V2025_03_26);
    let RequestKind::Batch(messages) = &request.kind else {
        panic!("not a batch: {:?}", request.kind)
    };
    assert_eq!(
        messages[0],
        Message::Notification {
            method: "notifications/initialized".into()
        }
    );
    assert_eq!(
        messages[1],
        Message::Request {
            id: 3.into(),
            method: "tools/list".into()
        }
    );
    assert!(matches!(&messages[2], Message::ToolCall(c) if c.name == "get_weather"));
    assert_eq!(messages[3], Message::Response { id: "srv-1".into() });
    assert_eq!(request.kind.tool_calls().count(), 1);
}

#[test]
fn batches_are_refused_after_2025_03_26_and_when_empty() {
    let h = headers(&[("MCP-Protocol-Version", "2025-06-18")]);
    let err = classify(&Method::POST, &h, br#"[{"jsonrpc":"2.0","method":"x"}]"#).unwrap_err();
    assert!(matches!(err, ClassifyError::InvalidBatch(_)), "{err}");
    let err = classify(&Method::POST, &HeaderMap::new(), b"[]").unwrap_err();
    assert!(matches!(err, ClassifyError::InvalidBatch(_)), "{err}");
}

#[test]
fn post_2026_07_28_with_matching_standard_headers() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "get_weather"),
    ]);
    let request = classify(&Method::POST, &h, SPEC_TOOLS_CALL).unwrap();
    assert_eq!(request.version.era(), Era::Stateless);
    assert_eq!(request.session_id, None);
    assert_eq!(tool_call(request).name, "get_weather");

    // A name that cannot travel bare arrives Base64-wrapped.
    let body =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"météo"}}"#.as_bytes();
    let h = headers(&[
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "=?base64?bcOpdMOpbw==?="),
    ]);
    assert_eq!(
        tool_call(classify(&Method::POST, &h, body).unwrap()).name,
        "météo"
    );
}

#[test]
fn mismatched_standard_headers_are_typed_errors() {
    let h = headers(&[
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/list"),
        ("Mcp-Name", "get_weather"),
    ]);
    let err = classify(&Method::POST, &h, SPEC_TOOLS_CALL).unwrap_err();
    assert!(
        matches!(&err, ClassifyError::HeaderMismatch { header, header_value, body_value }
            if header == MCP_METHOD && header_value == "tools/list" && body_value == "tools/call"),
        "{err:?}"
    );
    let h = headers(&[
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "delete_everything"),
    ]);
    let err = classify(&Method::POST, &h, SPEC_TOOLS_CALL).unwrap_err();
    assert!(
        matches!(&err, ClassifyError::HeaderMismatch { header, .. } if header == MCP_NAME),
        "{err:?}"
    );
    // The same headers in a 2025 revision are not checked: they mean nothing there.
    let h = headers(&[
        ("MCP-Protocol-Version", "2025-11-25"),
        ("Mcp-Method", "tools/list"),
    ]);
    assert!(classify(&Method::POST, &h, SPEC_TOOLS_CALL).is_ok());
}

#[test]
fn a_relay_requires_the_standard_headers_and_each_refusal_has_the_eras_code() {
    let both = [
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/call"),
        ("Mcp-Name", "get_weather"),
    ];
    assert!(require_standard_headers(&Method::POST, &headers(&both), SPEC_TOOLS_CALL).is_ok());
    for (missing, expected) in [(1, MCP_METHOD), (2, MCP_NAME)] {
        let mut pairs = both.to_vec();
        pairs.remove(missing);
        let err =
            require_standard_headers(&Method::POST, &headers(&pairs), SPEC_TOOLS_CALL).unwrap_err();
        assert!(
            matches!(&err, ClassifyError::MissingHeader(name) if *name == expected),
            "{err:?}"
        );
        assert_eq!(err.jsonrpc_code(), HEADER_MISMATCH);
    }
    // A request that names nothing needs only Mcp-Method; a response needs none; a 2025
    // revision none; a GET none.
    let list = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let h = headers(&[
        ("MCP-Protocol-Version", "2026-07-28"),
        ("Mcp-Method", "tools/list"),
    ]);
    assert!(require_standard_headers(&Method::POST, &h, list).is_ok());
    let h = headers(&[("MCP-Protocol-Version", "2026-07-28")]);
    assert!(require_standard_headers(&Method::POST, &h, list).is_err());
    let answer = br#"{"jsonrpc":"2.0","id":1,"result":{}}"#;
    assert!(require_standard_headers(&Method::POST, &h, answer).is_ok());
    assert!(require_standard_headers(&Method::GET, &h, b"").is_ok());
    let h = headers(&[("MCP-Protocol-Version", "2025-11-25")]);
    assert!(require_standard_headers(&Method::POST, &h, SPEC_TOOLS_CALL).is_ok());

    let mismatch = classify(
        &Method::POST,
        &headers(&[both[0], both[1], ("Mcp-Name", "x")]),
        SPEC_TOOLS_CALL,
    )
    .unwrap_err();
    assert_eq!(mismatch.jsonrpc_code(), -32020);
    let unsupported = classify(
        &Method::POST,
        &headers(&[("MCP-Protocol-Version", "2099-01-01")]),
        SPEC_TOOLS_CALL,
    )
    .unwrap_err();
    assert_eq!(unsupported.jsonrpc_code(), -32022);
    assert_eq!(ClassifyError::ToolCallWithoutName.jsonrpc_code(), -32600);
}

#[test]
fn a_body_of_an_unknown_revision_may_call_a_tool_unless_it_plainly_cannot() {
    assert!(may_call_a_tool(SPEC_TOOLS_CALL));
    for body in [
        &br#"[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]"#[..],
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call"}"#,
        br#"{"jsonrpc":"2.0","id":1,"method":"tools\/call"}"#,
        b"not json",
    ] {
        assert!(may_call_a_tool(body), "{}", String::from_utf8_lossy(body));
    }
    for body in [
        &br#"{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"method":"tools/call"}}"#
            [..],
        br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
    ] {
        assert!(!may_call_a_tool(body), "{}", String::from_utf8_lossy(body));
    }
}

#[test]
fn malformed_bodies_are_typed_errors() {
    let none = HeaderMap::new();
    type Expect = fn(&ClassifyError) -> bool;
    let cases: &[(&[u8], Expect)] = &[
        (b"\xff\xfe{}", |e| matches!(e, ClassifyError::InvalidUtf8 { valid_up_to: 0 })),
        (b"{\"jsonrpc\":", |e| matches!(e, ClassifyError::InvalidJson(_))),
        (b"{} trailing", |e| matches!(e, ClassifyError::InvalidJson(_))),
        (b"\"tools/call\"", |e| matches!(e, ClassifyError::NotAnObject("a string"))),
        (b"42", |e| matches!(e, ClassifyError::NotAnObject("a number"))),
        (b"null", |e| matches!(e, ClassifyError::NotAnObject("null"))),
        (br#"{"id":1,"method":"tools/list"}"#, |e| matches!(e, ClassifyError::InvalidEnvelope(_))),
        (br#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#, |e| matches!(e, ClassifyError::InvalidEnvelope(_))),
        (br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#, |e| matches!(e, ClassifyError::InvalidEnvelope(_))),
        (br#"{"jsonrpc":"2.0","method":7}"#, |e| matches!(e, ClassifyError::InvalidEnvelope(_))),
        (br#"{"jsonrpc":"2.0","id":1}"#, |e| matches!(e, ClassifyError::InvalidEnvelope(_))),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#, |e| matches!(e, ClassifyError::ToolCallWithoutName)),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#, |e| matches!(e, ClassifyError::ToolCallWithoutName)),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":[1]}}"#, |e| matches!(e, ClassifyError::InvalidArguments("an array"))),
        (br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"amount":1,"amount":1000}}}"#, |e| matches!(e, ClassifyError::DuplicateKey(k) if k == "amount")),
        (br#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"x"}}"#, |e| matches!(e, ClassifyError::DuplicateKey(k) if k == "id")),
        (br#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","name":"y"}}]"#, |e| matches!(e, ClassifyError::DuplicateKey(k) if k == "name")),
        (b"[1]", |e| matches!(e, ClassifyError::NotAnObject("a number"))),
    ];
    for (body, expected) in cases {
        let err = classify(&Method::POST, &none, body).unwrap_err();
        assert!(
            expected(&err),
            "{}: unexpected {err:?}",
            String::from_utf8_lossy(body)
        );
        assert!(!err.to_string().is_empty());
    }
}

#[test]
fn duplicate_keys_outside_a_tools_call_pass() {
    let body =
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"a","cursor":"b"}}"#;
    assert!(classify(&Method::POST, &HeaderMap::new(), body).is_ok());
}

#[test]
fn deeply_nested_input_is_an_error_not_a_stack_overflow() {
    let mut body =
        br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":"#
            .to_vec();
    body.extend(std::iter::repeat_n(b'[', 100_000));
    let err = classify(&Method::POST, &HeaderMap::new(), &body).unwrap_err();
    assert!(matches!(err, ClassifyError::InvalidJson(_)), "{err:?}");
}

#[test]
fn bad_headers_and_methods_are_typed_errors() {
    let h = headers(&[("MCP-Protocol-Version", "2099-01-01")]);
    assert!(matches!(
        classify(&Method::POST, &h, SPEC_TOOLS_CALL),
        Err(ClassifyError::UnsupportedProtocolVersion(_))
    ));
    let mut h = HeaderMap::new();
    h.insert(MCP_SESSION_ID, HeaderValue::from_bytes(b"caf\xe9").unwrap());
    assert!(matches!(
        classify(&Method::GET, &h, b""),
        Err(ClassifyError::InvalidHeader(name)) if name == MCP_SESSION_ID
    ));
    assert!(matches!(
        classify(&Method::PUT, &HeaderMap::new(), b""),
        Err(ClassifyError::UnsupportedHttpMethod(m)) if m == Method::PUT
    ));
}

#[test]
fn header_values_that_cannot_travel_bare_are_base64_wrapped_and_read_back() {
    for name in ["deploy_release", "météo", " padded", "=?base64?x?="] {
        let encoded = encode_header_value(name);
        let text = encoded.to_str().unwrap();
        assert_eq!(decode_header_value(text).as_deref(), Some(name), "{text}");
    }
    assert_eq!(encode_header_value("deploy_release"), "deploy_release");
    assert_eq!(encode_header_value("météo"), "=?base64?bcOpdMOpbw==?=");
}

fn call_with(params: serde_json::Value) -> ToolCall {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let request = classify(
        &Method::POST,
        &HeaderMap::new(),
        body.to_string().as_bytes(),
    )
    .unwrap();
    match request.kind {
        RequestKind::Message(Message::ToolCall(call)) => call,
        other => panic!("not a tool call: {other:?}"),
    }
}

#[test]
fn only_the_continuation_params_make_a_call_a_continuation() {
    // The server half once took any extra member of `params` as a continuation, the guard only
    // these two: one rule now, for both.
    let extra = call_with(json!({"name": "deploy", "arguments": {}, "traceHint": "x"}));
    assert_eq!(extra.continuation(), None);
    let plain = call_with(json!({"name": "deploy", "arguments": {}}));
    assert_eq!(plain.continuation(), None);
    let continued = call_with(json!({
        "name": "deploy", "arguments": {}, "requestState": "s1", "traceHint": "x"
    }));
    assert_eq!(
        continued.continuation(),
        Some(json!({"requestState": "s1"}))
    );
}

#[test]
fn the_version_header_default_and_trim_are_one_rule() {
    assert_eq!(
        ProtocolVersion::from_header(None).unwrap(),
        ProtocolVersion::WITHOUT_HEADER
    );
    assert_eq!(
        ProtocolVersion::from_header(Some(" 2025-11-25 ")).unwrap(),
        ProtocolVersion::V2025_11_25
    );
    assert!(ProtocolVersion::from_header(Some("1999-01-01")).is_err());
    // `ResumeLayer` read the header untrimmed: a padded 2025-11-25 was not resumable there.
    let padded = headers(&[("MCP-Protocol-Version", " 2025-11-25")]);
    assert_eq!(
        ProtocolVersion::of_headers(&padded),
        Some(ProtocolVersion::V2025_11_25)
    );
    assert_eq!(
        ProtocolVersion::of_headers(&HeaderMap::new()),
        Some(ProtocolVersion::WITHOUT_HEADER)
    );
}

#[test]
fn a_target_never_carries_userinfo_or_query() {
    // `ReplayPolicy` once recorded the whole authority, `user:secret@` included.
    let uri: http::Uri = "http://agent:s3cr3t@127.0.0.1:8000/mcp?token=t"
        .parse()
        .unwrap();
    assert_eq!(target_of(&uri).as_str(), "127.0.0.1:8000/mcp");
    let uri: http::Uri = "/mcp".parse().unwrap();
    assert_eq!(target_of(&uri).as_str(), "/mcp");
}

#[test]
fn a_resume_key_is_the_stream_and_the_event_id() {
    let key = |target: &str, session: Option<&str>, id: &str| {
        ResumeKey::new(crate::Target::new(target), session.map(str::to_owned), id)
    };
    let a = key("h/mcp", Some("s1"), "0/3");
    assert_eq!(a, key("h/mcp", Some("s1"), "0/3"));
    assert_ne!(a, key("h/mcp", Some("s2"), "0/3"));
    assert_ne!(a, key("other/mcp", Some("s1"), "0/3"));
    assert_ne!(a, key("h/mcp", None, "0/3"));
    assert_ne!(a, key("h/mcp", Some("s1"), "0/4"));
}

/// Found by attacking it: `result` / `error` members and a non-object `params` were
/// skipped with `IgnoredAny`, which checks neither the recursion limit, nor a number's range,
/// nor lone surrogates, nor duplicate keys. The body then classified, but the tree of its
/// arguments (a re-parse of the whole body) failed and read as `{}`: fingerprint rules and
/// hooks saw no arguments, and two different calls fingerprinted alike.
#[test]
fn every_member_of_a_tools_call_body_is_parsed_as_a_value_would_be() {
    let call =
        r#""jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":{"a":1}}"#;
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let skipped_values = [
        "1E400".to_owned(),
        deep.clone(),
        r#""\ud800""#.to_owned(),
        r#"{"k":1,"k":2}"#.to_owned(),
    ];
    let mut bodies = Vec::new();
    for junk in &skipped_values {
        bodies.push(format!(r#"{{{call},"result":{junk}}}"#));
        bodies.push(format!(r#"{{{call},"error":{junk}}}"#));
        // Another message of a batch, its `params` an array.
        bodies.push(format!(
            r#"[{{{call}}},{{"jsonrpc":"2.0","id":2,"method":"ping","params":[{junk}]}}]"#
        ));
    }
    let h = headers(&[("MCP-Protocol-Version", "2025-03-26")]);
    for body in &bodies {
        match classify(&Method::POST, &h, body.as_bytes()) {
            Err(_) => {}
            Ok(request) => {
                let call = match request.kind {
                    RequestKind::Message(Message::ToolCall(call)) => call,
                    RequestKind::Batch(messages) => match messages.into_iter().next() {
                        Some(Message::ToolCall(call)) => call,
                        other => panic!("{body}: {other:?}"),
                    },
                    other => panic!("{body}: {other:?}"),
                };
                assert_eq!(
                    serde_json::Value::Object(call.arguments().clone()),
                    json!({"a": 1}),
                    "{body}"
                );
            }
        }
    } // A duplicate key anywhere in a tools/call's message is refused, `result` included.
    let body = format!(r#"{{{call},"result":{{"k":1,"k":2}}}}"#);
    let err = classify(&Method::POST, &h, body.as_bytes()).unwrap_err();
    assert!(matches!(err, ClassifyError::DuplicateKey(_)), "{err:?}");
}

/// A duplicate key in any member of a tools/call, however it is spelled, is refused; keys
/// that differ (UTF-16 order unlike UTF-8 order) are canonicalised as the tree writer does.
#[test]
fn duplicate_keys_in_odd_places_and_spellings_are_refused() {
    let call = |rest: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t",{rest}}}}}"#
        )
    };
    for body in [
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"t"}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","\u0069d":1,"id":1,"method":"tools/call","params":{"name":"t"}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"},"params":{"name":"t"}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/call","params":{"name":"t"}}"#.to_owned(),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"},"x":{"a":1,"a":1}}"#.to_owned(),
        call(r#""arguments":{},"arguments":{}"#),
        call(r#""argument\u0073":{},"arguments":{}"#),
        call(r#""name":"u""#),
        call(r#""arguments":{"😀":1,"\ud83d\ude00":2}"#),
        call(r#""arguments":{"x":[[{"":1,"":2}]]}"#),
        call(r#""_meta":{"a":1,"\u0061":2}"#),
        call(r#""_meta":[{"a":1,"a":2}]"#),
        call(r#""task":{"ttl":1,"ttl":2}"#),
        call(r#""requestState":{"a":{"b":1,"b":1}}"#),
        call(r#""requestState":1,"requestState":2"#),
    ] {
        let err = classify(&Method::POST, &HeaderMap::new(), body.as_bytes()).unwrap_err();
        assert!(matches!(err, ClassifyError::DuplicateKey(_)), "{body}: {err:?}");
    }
    let body = call(r#""arguments":{"😀":1,"\uffff":2,"é":3,"a":4,"":5}"#);
    let request = classify(&Method::POST, &HeaderMap::new(), body.as_bytes()).unwrap();
    let call = tool_call(request);
    assert_eq!(
        call.canonical_arguments(),
        crate::fingerprint::canonical_json(&serde_json::Value::Object(call.arguments().clone()))
    );
}

/// Numbers at the edges, and nesting at serde_json's limit: the canonical arguments are the
/// tree's, and the wide-integer rule is the old one (the tree and the body).
#[test]
fn edge_numbers_and_nesting_agree_with_the_tree_path() {
    let mut arguments: Vec<String> = [
        "9007199254740992",
        "9007199254740993",
        "-9007199254740993",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "-18446744073709551617",
        "-0",
        "-0.0",
        "1e19",
        "1.8446744073709552e19",
        "0.1",
        "5e-324",
        "1.7976931348623157e308",
    ]
    .iter()
    .map(|n| format!(r#"{{"n":[{n}],"m":{{"k":{n}}}}}"#))
    .collect();
    for depth in [100, 124, 125, 126, 127] {
        arguments.push(format!(
            r#"{{"d":{}1{}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        ));
    }
    for arguments in &arguments {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{arguments}}}}}"#
        );
        let old = serde_json::from_str::<serde_json::Value>(&body);
        let new = classify(&Method::POST, &HeaderMap::new(), body.as_bytes());
        let (Ok(old), Ok(new)) = (old, new.as_ref()) else {
            assert_eq!(
                serde_json::from_str::<serde_json::Value>(&body).is_ok(),
                new.is_ok(),
                "{arguments}"
            );
            continue;
        };
        let call = match &new.kind {
            RequestKind::Message(Message::ToolCall(call)) => call,
            other => panic!("{other:?}"),
        };
        let tree = old["params"]["arguments"].as_object().unwrap();
        assert_eq!(call.arguments(), tree, "{arguments}");
        assert_eq!(
            call.canonical_arguments(),
            crate::fingerprint::canonical_json(&serde_json::Value::Object(tree.clone())),
            "{arguments}"
        );
        assert_eq!(
            call.has_inexact_number(),
            numbers::has_inexact_number(tree, body.as_bytes()),
            "{arguments}"
        );
    }
}
