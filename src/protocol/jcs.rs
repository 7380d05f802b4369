//! RFC 8785 (JCS) serialisation of a `serde_json::Value`.
//!
//! Written here rather than taken from `serde_jcs` because of speed on the guard's hot path:
//! serde_jcs re-parses every object key into a `Value` to sort it and buffers every member in
//! its own `Vec`, which made a 1 KiB fingerprint ~48× slower than SHA-256 of the same bytes
//! (see BENCHMARKS.md). A `Value` is already parsed, so canonical output is a plain walk. The
//! number formatting, the delicate part, is `ryu-js` (ECMAScript `Number.prototype.toString`),
//! the crate serde_jcs uses too, and serde_jcs stays the oracle of a differential property test.

use std::{borrow::Cow, cmp::Ordering, fmt, ops::Range};

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Appends the canonical form of `value` to `out`.
pub(crate) fn write(value: &Value, out: &mut Vec<u8>) {
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
pub(crate) enum Field<'a> {
    /// A string.
    Str(&'a str),
    /// A JSON object.
    Object(&'a Map<String, Value>),
    /// Bytes already in canonical form (arguments canonicalised while they were parsed).
    Canonical(&'a [u8]),
}

/// Writes an object from fields already sorted in canonical order.
pub(crate) fn write_fields(fields: &[(&str, Field<'_>)], out: &mut Vec<u8>) {
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
            Field::Canonical(bytes) => out.extend_from_slice(bytes),
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

/// 2^53: every integer of at most this magnitude is a double of its own; past it, doubles skip
/// integers.
const MAX_EXACT_DOUBLE_INTEGER: u64 = 1 << 53;

/// Numbers as RFC 8785 writes them, with its rule for integers outside the I-JSON range.
///
/// JCS treats every number as an IEEE-754 double, which cannot hold every integer past 2^53:
/// `9007199254740993` and `9007199254740992` would print alike, so two different order ids
/// would be one intent. RFC 8785 (§3.2.2.3 and Appendix D) says such numbers are carried as
/// JSON strings; so an integer whose magnitude exceeds 2^53 enters the record as a string
/// of its exact decimal digits (`"9007199254740993"`), which keeps every integer the JSON
/// parser holds exactly (the 64-bit range) distinct; a double of such an integral value (any
/// double between 2^53 and 2^64 is one) is written the same way. Every other number prints as ECMAScript
/// prints its double, as JCS says. Integer literals beyond 64 bits reach this writer already
/// rounded to a double by the parser, and nonzero literals too small for a double reach it as
/// 0; the guard refuses to fingerprint those (see [`crate::protocol::has_inexact_number`]).
fn write_number(n: &Number, out: &mut Vec<u8>) {
    if let Some(u) = n.as_u64() {
        write_u64(u, out)
    } else if let Some(i) = n.as_i64() {
        write_i64(i, out)
    } else {
        write_f64(n.as_f64().unwrap_or(0.0), out)
    }
}

// An integer of magnitude up to 2^53 is the double it names, and ECMAScript prints an integral
// double below 10^21 as its plain decimal digits: `itoa` writes those without the float
// formatter.
fn write_u64(u: u64, out: &mut Vec<u8>) {
    if u > MAX_EXACT_DOUBLE_INTEGER {
        return write_wide_integer(&u.to_string(), out);
    }
    out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
}

fn write_i64(i: i64, out: &mut Vec<u8>) {
    if i.unsigned_abs() > MAX_EXACT_DOUBLE_INTEGER {
        return write_wide_integer(&i.to_string(), out);
    }
    out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
}

fn write_f64(double: f64, out: &mut Vec<u8>) {
    // Number spelling never changes a fingerprint: a double past 2^53 is an integer, and
    // `9007199254740994.0` names the same value as `9007199254740994`.
    if double.fract() == 0.0
        && double.abs() > MAX_EXACT_DOUBLE_INTEGER as f64
        && double.abs() < TWO_POW_64
    {
        return write_wide_integer(&(double as i128).to_string(), out);
    }
    write_double(double, out);
}

/// 2^64: the doubles below it that are integers are the ones a 64-bit integer can name.
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

fn write_wide_integer(digits: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    out.extend_from_slice(digits.as_bytes());
    out.push(b'"');
}

fn write_double(double: f64, out: &mut Vec<u8>) {
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

/// What parsing a value into canonical form noticed besides the bytes.
#[derive(Debug, Default)]
pub(crate) struct Noticed {
    /// The first object key seen twice (in canonical order), if any: serde_json's `Value`
    /// would keep only the last, so two readers could see two calls.
    pub(crate) duplicate_key: Option<String>,
    /// A double that may stand for a literal the parser could not keep stands in the value
    /// (an integer beyond 64 bits it rounded, a nonzero literal it read as 0; see
    /// `protocol::numbers`).
    pub(crate) maybe_inexact: bool,
    /// What the value is (`"an object"`, `"null"`, …, as error messages name it).
    pub(crate) kind: Option<&'static str>,
}

/// Parses one JSON value straight into its RFC 8785 form, appended to `out`: keys and
/// strings are borrowed from the input (copied only when they hold escapes), no tree is built,
/// and the output is byte for byte what [`write`] gives for the same value parsed into a
/// `Value` (a differential property test holds the two together).
///
/// Hand-written because no crate canonicalises from a borrowed parse: serde_jcs and
/// json-canon serialise a value that already exists.
pub(crate) struct CanonicalSeed<'s> {
    pub(crate) out: &'s mut Vec<u8>,
    pub(crate) noticed: &'s mut Noticed,
}

impl<'de> DeserializeSeed<'de> for CanonicalSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl CanonicalSeed<'_> {
    /// Notes what the outermost value is (its visitor is the first one called) and hands
    /// back its output.
    fn entered(&mut self, kind: &'static str) -> &mut Vec<u8> {
        self.noticed.kind.get_or_insert(kind);
        self.out
    }

    fn again(&mut self) -> CanonicalSeed<'_> {
        CanonicalSeed {
            out: self.out,
            noticed: self.noticed,
        }
    }
}

impl<'de> Visitor<'de> for CanonicalSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(mut self, v: bool) -> Result<(), E> {
        let out = self.entered("a boolean");
        out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn visit_i64<E>(mut self, v: i64) -> Result<(), E> {
        write_i64(v, self.entered("a number"));
        Ok(())
    }
    fn visit_u64<E>(mut self, v: u64) -> Result<(), E> {
        write_u64(v, self.entered("a number"));
        Ok(())
    }
    fn visit_f64<E>(mut self, v: f64) -> Result<(), E> {
        self.noticed.maybe_inexact |= super::may_be_inexact(v);
        // serde_json turns a non-finite number into an error before any visitor sees it.
        write_f64(v, self.entered("a number"));
        Ok(())
    }
    fn visit_str<E>(mut self, v: &str) -> Result<(), E> {
        write_string(v, self.entered("a string"));
        Ok(())
    }
    fn visit_unit<E>(mut self) -> Result<(), E> {
        self.entered("null").extend_from_slice(b"null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.entered("an array").push(b'[');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(b',');
            }
            if seq.next_element_seed(self.again())?.is_none() {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        // Members are written where they stand, each `"name":value` with its byte range
        // noted; when the names did not arrive in canonical order they are moved into it.
        let start = self.out.len();
        self.entered("an object").push(b'{');
        let mut members: Vec<(Cow<'de, str>, Range<usize>)> = Vec::new();
        let mut in_order = true;
        while let Some(name) = map.next_key_seed(BorrowedKey)? {
            if let Some((previous, _)) = members.last() {
                self.out.push(b',');
                in_order &= utf16_cmp(previous, &name) == Ordering::Less;
            }
            let member = self.out.len();
            write_string(&name, self.out);
            self.out.push(b':');
            map.next_value_seed(self.again())?;
            members.push((name, member..self.out.len()));
        }
        if !in_order {
            members.sort_by(|a, b| utf16_cmp(&a.0, &b.0));
            if let Some(pair) = members.windows(2).find(|pair| pair[0].0 == pair[1].0) {
                self.noticed
                    .duplicate_key
                    .get_or_insert_with(|| pair[0].0.clone().into_owned());
            }
            let written = self.out[start..].to_vec();
            self.out.truncate(start + 1);
            for (i, (_, range)) in members.iter().enumerate() {
                if i > 0 {
                    self.out.push(b',');
                }
                self.out
                    .extend_from_slice(&written[range.start - start..range.end - start]);
            }
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// An object key, borrowed from the input unless it holds escapes.
pub(crate) struct BorrowedKey;

impl<'de> DeserializeSeed<'de> for BorrowedKey {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for BorrowedKey {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}
