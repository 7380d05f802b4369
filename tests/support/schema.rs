//! The official MCP JSON schemas of both eras (`tests/schemas/mcp/<version>/schema.json`,
//! copied from the specification repository), as validators for what the crate writes.

use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

use super::Era;

struct Schemas {
    message: Validator,
    tool_result: Validator,
}

fn schemas(era: Era) -> &'static Schemas {
    static SESSIONS: OnceLock<Schemas> = OnceLock::new();
    static STATELESS: OnceLock<Schemas> = OnceLock::new();
    let (cell, version) = match era {
        Era::Sessions => (&SESSIONS, "2025-11-25"),
        Era::Stateless => (&STATELESS, "2026-07-28"),
    };
    cell.get_or_init(|| {
        let path = super::repo_root().join(format!("tests/schemas/mcp/{version}/schema.json"));
        let schema: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let validator = |definition: &str| {
            let mut schema = schema.clone();
            schema["$ref"] = format!("#/$defs/{definition}").into();
            jsonschema::validator_for(&schema).unwrap()
        };
        Schemas {
            message: validator("JSONRPCMessage"),
            tool_result: validator("CallToolResult"),
        }
    })
}

fn violations(validator: &Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Asserts that `message` is a valid `JSONRPCMessage` of `era`; a JSON-RPC error also carries
/// the request's id when `id` is given.
pub fn assert_valid_message(era: Era, kind: &str, message: &Value, id: Option<&Value>) {
    let found = violations(&schemas(era).message, message);
    assert!(
        found.is_empty(),
        "{kind} ({}) is not a valid JSONRPCMessage: {found:?}\n{message:#}",
        era.label()
    );
    if let Some(id) = id {
        assert_eq!(&message["id"], id, "{kind} ({}): {message}", era.label());
    }
}

/// Asserts that `message` answers a `tools/call` of `era` validly: a valid `JSONRPCMessage`
/// for `id` whose result is a valid `CallToolResult`, with `resultType` exactly in 2026-07-28
/// (the 2025-11-25 schema tolerates unknown members, so the era rule is asserted too).
pub fn assert_valid_tool_answer(era: Era, kind: &str, message: &Value, id: &Value) {
    assert_valid_message(era, kind, message, Some(id));
    let result = message
        .get("result")
        .unwrap_or_else(|| panic!("{kind} ({}) has no result: {message}", era.label()));
    let found = violations(&schemas(era).tool_result, result);
    assert!(
        found.is_empty(),
        "{kind} ({}) is not a valid CallToolResult: {found:?}\n{result:#}",
        era.label()
    );
    let expected = match era {
        Era::Sessions => Value::Null,
        Era::Stateless => "complete".into(),
    };
    assert_eq!(
        result.get("resultType").cloned().unwrap_or(Value::Null),
        expected,
        "{kind} ({}): resultType belongs to 2026-07-28 only\n{result:#}",
        era.label()
    );
}
