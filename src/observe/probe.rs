//! One pass over a tool call's raw `result`: the fields the recorder reads (`isError`,
//! `resultType`, `taskId`) and whether a number in it may be a literal the parser cannot keep.
//!
//! The fields are read as `#[derive(Deserialize)] struct { isError: Option<bool>, resultType:
//! Option<String>, taskId: Option<String> }` (all `default`) would read them, quirks included: a
//! field of the wrong type or given twice makes the whole result unreadable, and a JSON array
//! is read by position. The number check is the first half of the two-step rule of
//! [`has_inexact_number`](crate::protocol::has_inexact_number): serde_json hands a literal
//! outside the 64-bit range to `visit_f64`, and one too small for a double as 0, so an integral
//! double of magnitude 2^63 or more, or a double zero, is the only sign that one may be there;
//! only then is the text scanned for it.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::protocol::may_be_inexact as is_wide;

/// What one pass over a `result` found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ResultProbe {
    /// The tool's `isError` (`false` when absent or unreadable).
    pub(crate) is_error: bool,
    /// The task id of a 2026-07-28 `CreateTaskResult` (`resultType: "task"`).
    pub(crate) task_id: Option<String>,
    /// An integral double of magnitude 2^63 or more stands somewhere in the result: it may
    /// hold an integer literal beyond 64 bits (scan the text to know).
    pub(crate) maybe_wide: bool,
}

impl ResultProbe {
    /// Reads `raw`, one JSON value (the exact bytes of a `result`).
    pub(crate) fn read(raw: &str) -> Self {
        let mut fields = Fields::default();
        let mut wide = false;
        let mut deserializer = serde_json::Deserializer::from_str(raw);
        let readable = TopSeed {
            fields: &mut fields,
            wide: &mut wide,
        }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end())
        .is_ok();
        if !readable {
            // serde_json refused a value the struct skips unread (`IgnoredAny` checks neither
            // strings, nor a number's range, nor the nesting limit): rare, so read the fields
            // as the struct does, and have the text scanned (the pass stopped before its end).
            return Self::by_struct(raw);
        }
        let fields = if fields.malformed {
            Fields::default()
        } else {
            fields
        };
        Self {
            is_error: fields.is_error.unwrap_or(false),
            task_id: fields
                .task_id
                .filter(|_| fields.result_type.as_deref() == Some("task")),
            maybe_wide: wide,
        }
    }
}

impl ResultProbe {
    /// The fields as `#[derive(Deserialize)]` reads them, and `maybe_wide` set: the reading
    /// of a result the one pass could not finish.
    fn by_struct(raw: &str) -> Self {
        #[derive(serde::Deserialize)]
        struct ToolResult {
            #[serde(rename = "isError", default)]
            is_error: Option<bool>,
            #[serde(rename = "resultType", default)]
            result_type: Option<String>,
            #[serde(rename = "taskId", default)]
            task_id: Option<String>,
        }
        let result = serde_json::from_str::<ToolResult>(raw).ok();
        Self {
            is_error: result.as_ref().and_then(|r| r.is_error).unwrap_or(false),
            task_id: result
                .filter(|r| r.result_type.as_deref() == Some("task"))
                .and_then(|r| r.task_id),
            maybe_wide: true,
        }
    }
}

#[derive(Default)]
struct Fields {
    is_error: Option<bool>,
    result_type: Option<String>,
    task_id: Option<String>,
    /// A field of the wrong type, or given twice.
    malformed: bool,
}

/// A value as far as the fields need it.
enum Seen {
    Null,
    Bool(bool),
    Str(Option<String>),
    Other,
}

impl Seen {
    fn bool(self, malformed: &mut bool) -> Option<bool> {
        match self {
            Self::Null => None,
            Self::Bool(b) => Some(b),
            _ => {
                *malformed = true;
                None
            }
        }
    }

    fn string(self, malformed: &mut bool) -> Option<String> {
        match self {
            Self::Null => None,
            Self::Str(s) => s,
            _ => {
                *malformed = true;
                None
            }
        }
    }
}

/// Any value: notes wide doubles anywhere in it, keeps a string only when asked.
struct ValueSeed<'w> {
    keep_string: bool,
    wide: &'w mut bool,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Seen;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Seen, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Seen;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Seen, E> {
        Ok(Seen::Bool(b))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Seen, E> {
        Ok(Seen::Other)
    }

    fn visit_f64<E>(self, d: f64) -> Result<Seen, E> {
        *self.wide |= is_wide(d);
        Ok(Seen::Other)
    }

    fn visit_str<E>(self, s: &str) -> Result<Seen, E> {
        Ok(Seen::Str(self.keep_string.then(|| s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Seen, E> {
        Ok(Seen::Str(self.keep_string.then_some(s)))
    }

    fn visit_unit<E>(self) -> Result<Seen, E> {
        Ok(Seen::Null)
    }

    fn visit_none<E>(self) -> Result<Seen, E> {
        Ok(Seen::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Seen, A::Error> {
        while seq
            .next_element_seed(ValueSeed {
                keep_string: false,
                wide: &mut *self.wide,
            })?
            .is_some()
        {}
        Ok(Seen::Other)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Seen, A::Error> {
        while map.next_key::<de::IgnoredAny>()?.is_some() {
            map.next_value_seed(ValueSeed {
                keep_string: false,
                wide: &mut *self.wide,
            })?;
        }
        Ok(Seen::Other)
    }
}

/// The result itself: an object (or, as serde reads a struct, an array by position).
struct TopSeed<'a> {
    fields: &'a mut Fields,
    wide: &'a mut bool,
}

impl TopSeed<'_> {
    fn value(&mut self, keep_string: bool) -> ValueSeed<'_> {
        ValueSeed {
            keep_string,
            wide: &mut *self.wide,
        }
    }

    fn set(&mut self, field: Field, seen: Seen) {
        let fields = &mut *self.fields;
        let malformed = &mut fields.malformed;
        match field {
            Field::IsError => fields.is_error = seen.bool(malformed),
            Field::ResultType => fields.result_type = seen.string(malformed),
            Field::TaskId => fields.task_id = seen.string(malformed),
            Field::Other => {}
        }
    }
}

impl<'de> DeserializeSeed<'de> for TopSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tool result")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let mut given = [false; 3];
        while let Some(field) = map.next_key::<Field>()? {
            if let Some(index) = field.index() {
                self.fields.malformed |= std::mem::replace(&mut given[index], true);
            }
            let seen = map.next_value_seed(self.value(field.is_string()))?;
            self.set(field, seen);
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        for field in [
            Field::IsError,
            Field::ResultType,
            Field::TaskId,
            Field::Other,
        ] {
            let Some(seen) = seq.next_element_seed(self.value(field.is_string()))? else {
                return Ok(());
            };
            if field == Field::Other {
                // More elements than fields: serde refuses the struct. Read on for numbers.
                self.fields.malformed = true;
                while seq.next_element_seed(self.value(false))?.is_some() {}
                return Ok(());
            }
            self.set(field, seen);
        }
        Ok(())
    }

    // Any other JSON value is no struct: unreadable, and it holds no number but itself.
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        self.fields.malformed = true;
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        self.fields.malformed = true;
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        self.fields.malformed = true;
        Ok(())
    }

    fn visit_f64<E>(self, d: f64) -> Result<(), E> {
        self.fields.malformed = true;
        *self.wide |= is_wide(d);
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        self.fields.malformed = true;
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.fields.malformed = true;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    IsError,
    ResultType,
    TaskId,
    Other,
}

impl Field {
    fn index(self) -> Option<usize> {
        match self {
            Self::IsError => Some(0),
            Self::ResultType => Some(1),
            Self::TaskId => Some(2),
            Self::Other => None,
        }
    }

    fn is_string(self) -> bool {
        matches!(self, Self::ResultType | Self::TaskId)
    }
}

impl<'de> de::Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = Field;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a field name")
            }

            fn visit_str<E>(self, name: &str) -> Result<Field, E> {
                Ok(match name {
                    "isError" => Field::IsError,
                    "resultType" => Field::ResultType,
                    "taskId" => Field::TaskId,
                    _ => Field::Other,
                })
            }
        }
        deserializer.deserialize_identifier(Name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the recorder read before: a second parse of the result into a struct.
    fn by_struct(raw: &str) -> (bool, Option<String>) {
        #[derive(serde::Deserialize)]
        struct ToolResult {
            #[serde(rename = "isError", default)]
            is_error: Option<bool>,
            #[serde(rename = "resultType", default)]
            result_type: Option<String>,
            #[serde(rename = "taskId", default)]
            task_id: Option<String>,
        }
        let result = serde_json::from_str::<ToolResult>(raw).ok();
        let is_error = result.as_ref().and_then(|r| r.is_error).unwrap_or(false);
        let task_id = result
            .filter(|r| r.result_type.as_deref() == Some("task"))
            .and_then(|r| r.task_id);
        (is_error, task_id)
    }

    #[test]
    fn the_probe_reads_the_fields_as_the_struct_did() {
        for raw in [
            r#"{"content":[],"isError":true}"#,
            r#"{"content":[{"type":"text","text":"ok"}],"isError":false}"#,
            r#"{"resultType":"task","taskId":"t-1","content":[]}"#,
            r#"{"resultType":"complete","taskId":"t-1"}"#,
            r#"{"taskId":"t-1"}"#,
            r#"{"isError":null,"resultType":null}"#,
            r#"{"isError":"yes","resultType":"task","taskId":"t"}"#,
            r#"{"isError":true,"isError":false}"#,
            r#"{"resultType":"task","taskId":7}"#,
            r#"{"is\u0045rror":true,"result\u0054ype":"task","taskId":"\u0074"}"#,
            r#"{"nested":{"isError":true,"taskId":"x"}}"#,
            r#"[true,"task","t-2"]"#,
            r#"[true]"#,
            r#"[true,"task","t-2",1]"#,
            r#"[1]"#,
            r#""text""#,
            "7",
            "null",
            "{}",
        ] {
            let probe = ResultProbe::read(raw);
            assert_eq!((probe.is_error, probe.task_id), by_struct(raw), "{raw}");
        }
    }

    /// Found by attacking it: the struct skips members it does not name unread
    /// (`IgnoredAny` checks neither strings, nor a number's range, nor the nesting limit),
    /// the probe parsed them and gave up on the whole result: a tool error whose text held a
    /// lone surrogate (what JavaScript's `JSON.stringify` writes for a string cut inside a
    /// pair) read as no error, and a wide integer after such a member went unnoticed.
    #[test]
    fn members_the_struct_skips_unread_change_nothing_the_probe_reads() {
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for skipped in [r#""\ud800""#, "1E400", deep.as_str()] {
            for raw in [
                format!(r#"{{"isError":true,"content":[{{"type":"text","text":{skipped}}}]}}"#),
                format!(r#"{{"x":{skipped},"resultType":"task","taskId":"t-1"}}"#),
            ] {
                let probe = ResultProbe::read(&raw);
                assert_eq!((probe.is_error, probe.task_id), by_struct(&raw), "{raw}");
            }
            let raw = format!(r#"{{"x":{skipped},"n":18446744073709551617}}"#);
            assert!(ResultProbe::read(&raw).maybe_wide, "{raw}");
        }
    }

    #[test]
    fn the_probe_notes_doubles_that_may_be_wide_integers_anywhere() {
        for raw in [
            r#"{"n":18446744073709551616}"#,
            r#"{"content":[{"n":[1,-9223372036854775809]}]}"#,
            r#"{"isError":18446744073709551617}"#,
            r#"[1,2,3,99999999999999999999999]"#,
            "1e20",
        ] {
            assert!(ResultProbe::read(raw).maybe_wide, "{raw}");
        }
        for raw in [
            r#"{"n":18446744073709551615,"m":-9223372036854775808}"#,
            r#"{"n":1.5e3,"s":"18446744073709551617"}"#,
            r#"{"content":[]}"#,
        ] {
            assert!(!ResultProbe::read(raw).maybe_wide, "{raw}");
        }
    }
}
