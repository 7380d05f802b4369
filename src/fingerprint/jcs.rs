//! RFC 8785 (JCS) serialisation of a `serde_json::Value`.
//!
//! Written here rather than taken from `serde_jcs` because of speed on the guard's hot path:
//! serde_jcs re-parses every object key into a `Value` to sort it and buffers every member in
//! its own `Vec`, which made a 1 KiB fingerprint ~48× slower than SHA-256 of the same bytes
//! (see BENCHMARKS.md). A `Value` is already parsed, so canonical output is a plain walk. The
//! number formatting, the delicate part, is `ryu-js` (ECMAScript `Number.prototype.toString`),
//! the crate serde_jcs uses too, and serde_jcs stays the oracle of a differential property test.

use std::cmp::Ordering;

use serde_json::{Map, Number, Value};

/// Appends the canonical form of `value` to `out`.
pub(super) fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(map, out),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) {
    // JCS orders members by the UTF-16 code units of their names. serde_json's map is sorted by
    // UTF-8 bytes (or kept in insertion order when some crate in the build turns on
    // `preserve_order`), so sort only when the order does not already hold.
    let mut names = map.keys();
    let sorted = names.next().is_none_or(|first| {
        names
            .try_fold(first, |prev, name| {
                (utf16_cmp(prev, name) != Ordering::Greater).then_some(name)
            })
            .is_some()
    });
    if sorted {
        write_members(map.iter(), out);
    } else {
        let mut members: Vec<(&String, &Value)> = map.iter().collect();
        members.sort_unstable_by(|a, b| utf16_cmp(a.0, b.0));
        write_members(members.into_iter(), out);
    }
}

/// Writes `{"name":value,…}` from members already in canonical order.
fn write_members<'a>(members: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (name, value)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(name, out);
        out.push(b':');
        write(value, out);
    }
    out.push(b'}');
}

/// A member of an object built without a `Value`: the canonical action record.
#[derive(Debug)]
pub(super) enum Field<'a> {
    /// A string.
    Str(&'a str),
    /// A JSON object.
    Object(&'a Map<String, Value>),
}

/// Writes an object from fields already sorted in canonical order.
pub(super) fn write_fields(fields: &[(&str, Field<'_>)], out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (name, field)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(name, out);
        out.push(b':');
        match field {
            Field::Str(s) => write_string(s, out),
            Field::Object(map) => write_object(map, out),
        }
    }
    out.push(b'}');
}

fn utf16_cmp(a: &str, b: &str) -> Ordering {
    if a.is_ascii() && b.is_ascii() {
        a.cmp(b)
    } else {
        a.encode_utf16().cmp(b.encode_utf16())
    }
}

/// Every JSON number is an IEEE-754 double under JCS: integers beyond 2^53 round to the
/// nearest double (as a JSON parser would) and then print as ECMAScript prints that double.
fn write_number(n: &Number, out: &mut Vec<u8>) {
    let double = if let Some(u) = n.as_u64() {
        u as f64
    } else if let Some(i) = n.as_i64() {
        i as f64
    } else {
        n.as_f64().unwrap_or(0.0)
    };
    let mut buffer = ryu_js::Buffer::new();
    out.extend_from_slice(buffer.format_finite(double).as_bytes());
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &byte) in bytes.iter().enumerate() {
        let escape: &[u8] = match byte {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\x08' => b"\\b",
            b'\x0c' => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(byte >> 4)],
                HEX[usize::from(byte & 0xf)],
            ]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}
