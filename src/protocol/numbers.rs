//! Number literals the JSON parser cannot keep exactly.
//!
//! serde_json (without `arbitrary_precision`, which would change every `Value` in a build)
//! parses an integer literal beyond the 64-bit range into the nearest double, so
//! `18446744073709551617` and `18446744073709551616` arrive as one value; and a nonzero literal
//! too small for a double (`1e-400`) arrives as `0`, where one too large (`1e400`) is refused
//! as out of range. A fingerprint over such a value would make two intents one (`1e-400` and
//! `0`). These helpers find such literals so that a caller can refuse to fingerprint them.
//!
//! Other fractions are doubles by RFC 8785, which fingerprints compare: `100` and
//! `100.000000000000001` are one value, and so one intent. Exact amounts travel as strings or as
//! integers of minor units.

use serde_json::{Map, Value};

/// What the guard and the server half say when they refuse such a call (never the value: an
/// argument may be a secret).
pub const INEXACT_NUMBER: &str = "an argument holds a number the JSON parser cannot keep exactly (an integer literal beyond 64 bits, which it rounds, or a nonzero literal too small for a double, which it reads as 0), so it cannot be fingerprinted exactly; send it as a string";

/// 2^63: an integral double of at least this magnitude may be a 64-bit overflow.
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Whether `arguments` may hold a number literal the parser could not keep: a double that may
/// stand for one stands in `arguments` **and** the raw `body` holds such a literal (an integer
/// outside the 64-bit range, or a nonzero literal that reads as 0). The body is scanned only in
/// the rare case that such a double exists.
pub fn has_inexact_number(arguments: &Map<String, Value>, body: &[u8]) -> bool {
    arguments.values().any(holds_inexact_double) && body_has_inexact_literal(body)
}

/// Whether JSON text holds a number literal the parser cannot keep (see
/// [`has_inexact_number`]). A result that does is not kept: the ledger keeps a result as a JSON
/// value, which would hand it back with another number in its place (two such numbers would
/// read back as one).
pub(crate) fn json_has_inexact_number(json: &[u8]) -> bool {
    #[cfg(test)]
    LEXICAL_SCANS.with(|n| n.set(n.get() + 1));
    body_has_inexact_literal(json)
}

/// Whether a parsed double may stand for a literal the parser could not keep: an integral
/// double of magnitude 2^63 or more (a rounded integer), or zero (an underflow; the literal `0`
/// is an integer, not a double). Only then is the text worth a scan.
pub(crate) fn may_be_inexact(double: f64) -> bool {
    double == 0.0 || (double.fract() == 0.0 && double.abs() >= TWO_POW_63)
}

#[cfg(test)]
thread_local! {
    /// How many results this thread scanned with [`json_has_inexact_number`].
    pub(crate) static LEXICAL_SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn holds_inexact_double(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            n.as_u64().is_none() && n.as_i64().is_none() && n.as_f64().is_some_and(may_be_inexact)
        }
        Value::Array(items) => items.iter().any(holds_inexact_double),
        Value::Object(map) => map.values().any(holds_inexact_double),
        Value::Null | Value::Bool(_) | Value::String(_) => false,
    }
}

/// Scans JSON text outside string literals for a number literal the parser cannot keep: an
/// integer literal (no fraction, no exponent) whose value is above `u64::MAX` or below
/// `i64::MIN`, or a nonzero literal that reads as 0. Hand-written because it is a lexical
/// question no JSON parser answers: every parser turns the literal into a number before anyone
/// can ask how it was spelled.
fn body_has_inexact_literal(body: &[u8]) -> bool {
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                i += 1;
                while i < body.len() && body[i] != b'"' {
                    i += if body[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < body.len()
                    && matches!(body[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let token = &body[start..i];
                if is_wide_integer(token) || underflows(token) {
                    return true;
                }
            }
            _ => i += 1,
        }
    }
    false
}

/// Whether a number literal names a nonzero value that a double cannot hold (`1e-400`): its
/// digits before the exponent are not all zero, yet it reads as 0.
fn underflows(token: &[u8]) -> bool {
    let mantissa = token
        .split(|&b| b == b'e' || b == b'E')
        .next()
        .unwrap_or_default();
    mantissa.iter().any(|b| (b'1'..=b'9').contains(b))
        && std::str::from_utf8(token)
            .ok()
            .and_then(|text| text.parse::<f64>().ok())
            == Some(0.0)
}

fn is_wide_integer(token: &[u8]) -> bool {
    let (negative, digits) = match token.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, token),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return false; // a fraction or an exponent: a double by its spelling
    }
    let significant = digits
        .iter()
        .position(|&d| d != b'0')
        .map_or(&digits[digits.len()..], |p| &digits[p..]);
    if significant.len() > 20 {
        return true;
    }
    let Ok(magnitude) = std::str::from_utf8(significant)
        .unwrap_or("0")
        .parse::<u128>()
    else {
        return true;
    };
    if negative {
        magnitude > 1 << 63
    } else {
        magnitude > u128::from(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn args(body: &str) -> Map<String, Value> {
        let value: Value = serde_json::from_str(body).unwrap();
        value["params"]["arguments"].as_object().unwrap().clone()
    }

    fn check(body: &str) -> bool {
        has_inexact_number(&args(body), body.as_bytes())
    }

    /// Every literal of `found`, as the argument of a call, is found; none of `kept` is.
    fn assert_found_and_kept(found: &[&str], kept: &[&str]) {
        let call = |n: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{{"n":{n}}}}}}}"#
            )
        };
        for literal in found {
            assert!(check(&call(literal)), "{literal}");
        }
        for literal in kept {
            assert!(!check(&call(literal)), "{literal}");
        }
    }

    #[test]
    fn literals_beyond_64_bits_are_found_and_64_bit_ones_are_not() {
        assert_found_and_kept(
            &[
                "18446744073709551616",
                "18446744073709551617",
                "-9223372036854775809",
                "123456789012345678901234567890",
                "[1, 99999999999999999999999]",
            ],
            &[
                "18446744073709551615",
                "-9223372036854775808",
                "9007199254740993",
                "1e20",
                "1.8446744073709552e19",
                "\"18446744073709551617\"",
            ],
        );
    }

    #[test]
    fn a_nonzero_literal_that_reads_as_zero_is_found_and_a_zero_is_not() {
        // As `1e400` is refused by the parser (out of range), `1e-400` is refused here: it
        // would be fingerprinted, and sent, as 0.
        assert_found_and_kept(
            &[
                "1e-400",
                "-1e-400",
                "0.0000001e-400",
                "[0.5, 2.5E-999]",
                "{\"a\":{\"b\":1e-324}}",
            ],
            &[
                "0e-400",
                "0",
                "0.0",
                "-0.0",
                "0E+5",
                "1e-300",
                "5e-324",
                "1e-7",
                "\"1e-400\"",
            ],
        );
        // Without a zero among the parsed numbers the text is not scanned at all.
        let arguments = json!({"n": 1}).as_object().unwrap().clone();
        assert!(!has_inexact_number(&arguments, br#"{"m":1e-400}"#));
    }

    #[test]
    fn a_wide_literal_outside_the_arguments_alone_does_not_count() {
        let arguments = json!({"n": 1}).as_object().unwrap().clone();
        let body = br#"{"params":{"arguments":{"n":1},"_meta":{"x":18446744073709551617}}}"#;
        assert!(!has_inexact_number(&arguments, body));
        // A string that spells a wide integer is text, not a number.
        let arguments = json!({"n": 1e20}).as_object().unwrap().clone();
        assert!(!has_inexact_number(
            &arguments,
            br#"{"s":"18446744073709551617","n":1e20}"#
        ));
    }
}
