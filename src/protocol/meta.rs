//! A request's `params._meta`: putting one string into it, reading one out.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Map, Value, value::RawValue};

/// The body of a JSON-RPC request with `params._meta[key] = value`, every other member as it
/// was (`params` and `_meta` are created when absent). `None` when the body is not a JSON
/// object whose `params`, if present, is an object: such a body is sent as it is.
///
/// Only the two levels on the way to `_meta` are parsed; every other member (the arguments
/// above all) is copied as its raw text, so not one digit of a number changes. Only a call
/// whose contract asked for its execution ID in `_meta` pays for this.
pub(crate) fn with_meta_string(body: &[u8], key: &str, value: &str) -> Option<Bytes> {
    type Raw = Box<RawValue>;
    let mut message: BTreeMap<String, Raw> = serde_json::from_slice(body).ok()?;
    let mut params: BTreeMap<String, Raw> = match message.get("params") {
        Some(params) => serde_json::from_str(params.get()).ok()?,
        None => BTreeMap::new(),
    };
    let mut meta: Map<String, Value> = match params.get("_meta") {
        Some(meta) => serde_json::from_str(meta.get()).ok()?,
        None => Map::new(),
    };
    meta.insert(key.to_owned(), Value::String(value.to_owned()));
    params.insert("_meta".into(), serde_json::value::to_raw_value(&meta).ok()?);
    message.insert(
        "params".into(),
        serde_json::value::to_raw_value(&params).ok()?,
    );
    serde_json::to_vec(&message).ok().map(Bytes::from)
}

/// `_meta[key]` of a request's parsed `_meta`, when it is a string.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn meta_string<'a>(meta: Option<&'a Map<String, Value>>, key: &str) -> Option<&'a str> {
    meta?.get(key)?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_added_and_everything_else_is_kept() {
        let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t","arguments":{"n":18446744073709551617},"_meta":{"progressToken":3}}}"#;
        let out = with_meta_string(body, "x.y/k", "act_1").expect("an object");
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["_meta"]["x.y/k"], "act_1");
        assert_eq!(v["params"]["_meta"]["progressToken"], 3);
        assert_eq!(v["id"], 7);
        // The arguments are copied as text: not one digit changes.
        let text = std::str::from_utf8(&out).unwrap();
        assert!(
            text.contains(r#""arguments":{"n":18446744073709551617}"#),
            "{text}"
        );
    }

    #[test]
    fn params_and_meta_are_created_and_a_foreign_shape_is_left_alone() {
        let out = with_meta_string(br#"{"jsonrpc":"2.0","id":1,"method":"m"}"#, "k", "v").unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["_meta"]["k"], "v");
        assert!(with_meta_string(br#"{"params":[1]}"#, "k", "v").is_none());
        assert!(with_meta_string(br#"{"params":{"_meta":3}}"#, "k", "v").is_none());
        assert!(with_meta_string(b"[1]", "k", "v").is_none());
        assert!(with_meta_string(b"not json", "k", "v").is_none());
    }
}
