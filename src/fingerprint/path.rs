//! `ArgPath`: a path into a call's arguments, as the fingerprint rules name them.

use std::{fmt, str::FromStr};

use serde_json::{Map, Value};

/// A path into a call's arguments: an RFC 6901 JSON Pointer (`/payment/card/number`,
/// `~0` for `~`, `~1` for `/`) where a segment `*` matches every member of an object or
/// every element of an array.
///
/// ```
/// use mcp_replay_guard::fingerprint::ArgPath;
///
/// let path: ArgPath = "/items/*/note".parse()?;
/// assert_eq!(path.to_string(), "/items/*/note");
/// # Ok::<(), mcp_replay_guard::fingerprint::InvalidArgPath>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ArgPath {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Segment {
    Key(String),
    Any,
}

/// A string that is not a usable argument path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid argument path {path:?}: {reason}")]
pub struct InvalidArgPath {
    path: String,
    reason: &'static str,
}

impl FromStr for ArgPath {
    type Err = InvalidArgPath;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = |reason| InvalidArgPath {
            path: s.to_owned(),
            reason,
        };
        let rest = s
            .strip_prefix('/')
            .ok_or_else(|| invalid("it must start with `/` (a JSON Pointer into the arguments)"))?;
        let segments = rest
            .split('/')
            .map(|raw| match raw {
                "*" => Ok(Segment::Any),
                _ => unescape(raw).map(Segment::Key).ok_or_else(|| {
                    invalid("`~` must be followed by `0` or `1` (RFC 6901 escapes)")
                }),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            text: s.to_owned(),
            segments,
        })
    }
}

fn unescape(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        match c {
            '~' => match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

impl fmt::Display for ArgPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for ArgPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ArgPath({:?})", self.text)
    }
}

impl ArgPath {
    /// Calls `f` on every value the path reaches.
    pub(crate) fn for_each_mut(
        &self,
        arguments: &mut Map<String, Value>,
        f: &mut dyn FnMut(&mut Value),
    ) {
        let Some((first, rest)) = self.segments.split_first() else {
            return;
        };
        for child in object_children(arguments, first) {
            visit(child, rest, f);
        }
    }

    /// Removes every value the path reaches (array elements are removed, not nulled).
    pub(crate) fn remove(&self, arguments: &mut Map<String, Value>) {
        let Some((last, parents)) = self.segments.split_last() else {
            return;
        };
        let mut remove_in = |parent: &mut Value| match (parent, last) {
            (Value::Object(map), Segment::Key(key)) => {
                map.remove(key);
            }
            (Value::Object(map), Segment::Any) => map.clear(),
            (Value::Array(items), Segment::Key(key)) => {
                if let Some(index) = array_index(key, items.len()) {
                    items.remove(index);
                }
            }
            (Value::Array(items), Segment::Any) => items.clear(),
            _ => {}
        };
        match parents.split_first() {
            None => match last {
                Segment::Key(key) => {
                    arguments.remove(key);
                }
                Segment::Any => arguments.clear(),
            },
            Some((first, rest)) => {
                for child in object_children(arguments, first) {
                    visit(child, rest, &mut remove_in);
                }
            }
        }
    }

    /// Inserts `default` wherever the path's parent exists (or can be created as objects) and
    /// the last key is absent. Wildcards fill in the default in every member they reach.
    pub(crate) fn materialize(&self, arguments: &mut Map<String, Value>, default: &Value) {
        fn fill(map: &mut Map<String, Value>, segments: &[Segment], default: &Value) {
            match segments {
                [] => {}
                [Segment::Key(key)] => {
                    map.entry(key.clone()).or_insert_with(|| default.clone());
                }
                [Segment::Any] => {}
                [Segment::Key(key), rest @ ..] => {
                    let child = map
                        .entry(key.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    fill_value(child, rest, default);
                }
                [Segment::Any, rest @ ..] => {
                    for child in map.values_mut() {
                        fill_value(child, rest, default);
                    }
                }
            }
        }
        fn fill_value(value: &mut Value, segments: &[Segment], default: &Value) {
            match value {
                Value::Object(map) => fill(map, segments, default),
                Value::Array(items) => match segments.split_first() {
                    Some((Segment::Any, rest)) if !rest.is_empty() => {
                        for item in items {
                            fill_value(item, rest, default);
                        }
                    }
                    Some((Segment::Key(key), rest)) if !rest.is_empty() => {
                        if let Some(index) = array_index(key, items.len()) {
                            fill_value(&mut items[index], rest, default);
                        }
                    }
                    _ => {}
                },
                _ => {}
            }
        }
        fill(arguments, &self.segments, default);
    }
}

fn object_children<'a>(
    map: &'a mut Map<String, Value>,
    segment: &Segment,
) -> Box<dyn Iterator<Item = &'a mut Value> + 'a> {
    match segment {
        Segment::Key(key) => Box::new(map.get_mut(key).into_iter()),
        Segment::Any => Box::new(map.values_mut()),
    }
}

fn visit(value: &mut Value, segments: &[Segment], f: &mut dyn FnMut(&mut Value)) {
    let Some((first, rest)) = segments.split_first() else {
        return f(value);
    };
    match (value, first) {
        (Value::Object(map), segment) => {
            for child in object_children(map, segment) {
                visit(child, rest, f);
            }
        }
        (Value::Array(items), Segment::Any) => {
            for item in items {
                visit(item, rest, f);
            }
        }
        (Value::Array(items), Segment::Key(key)) => {
            if let Some(index) = array_index(key, items.len()) {
                visit(&mut items[index], rest, f);
            }
        }
        _ => {}
    }
}

fn array_index(key: &str, len: usize) -> Option<usize> {
    // RFC 6901: decimal digits without a leading zero.
    if key.is_empty() || (key.len() > 1 && key.starts_with('0')) {
        return None;
    }
    key.parse().ok().filter(|&i| i < len)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn paths_parse_rfc_6901_escapes_and_reject_bad_ones() {
        let path: ArgPath = "/a~1b/c~0d".parse().unwrap();
        assert_eq!(
            path.segments,
            [Segment::Key("a/b".into()), Segment::Key("c~d".into())]
        );
        assert!("a/b".parse::<ArgPath>().is_err());
        assert!("".parse::<ArgPath>().is_err());
        assert!("/a~2".parse::<ArgPath>().is_err());
        let err = "nope".parse::<ArgPath>().unwrap_err();
        assert!(err.to_string().contains("\"nope\""), "{err}");
    }

    #[test]
    fn remove_reaches_nested_keys_wildcards_and_array_indexes() {
        let mut a = args(
            json!({"a": {"b": 1, "c": 2}, "items": [{"note": "x", "n": 1}, {"note": "y"}], "list": [1, 2, 3]}),
        );
        "/a/b".parse::<ArgPath>().unwrap().remove(&mut a);
        "/items/*/note".parse::<ArgPath>().unwrap().remove(&mut a);
        "/list/1".parse::<ArgPath>().unwrap().remove(&mut a);
        "/missing/deep".parse::<ArgPath>().unwrap().remove(&mut a);
        assert_eq!(
            json!(a),
            json!({"a": {"c": 2}, "items": [{"n": 1}, {}], "list": [1, 3]})
        );
    }

    #[test]
    fn materialize_fills_only_absent_values() {
        let mut a = args(json!({"region": "eu", "items": [{"qty": 3}, {}]}));
        "/region"
            .parse::<ArgPath>()
            .unwrap()
            .materialize(&mut a, &json!("us"));
        "/dry_run"
            .parse::<ArgPath>()
            .unwrap()
            .materialize(&mut a, &json!(false));
        "/items/*/qty"
            .parse::<ArgPath>()
            .unwrap()
            .materialize(&mut a, &json!(1));
        "/opts/retries"
            .parse::<ArgPath>()
            .unwrap()
            .materialize(&mut a, &json!(0));
        assert_eq!(
            json!(a),
            json!({"region": "eu", "dry_run": false, "items": [{"qty": 3}, {"qty": 1}], "opts": {"retries": 0}})
        );
    }

    #[test]
    fn for_each_mut_visits_every_match() {
        let mut a = args(json!({"users": [{"name": "A"}, {"name": "B"}], "x": {"name": "C"}}));
        let mut seen = vec![];
        "/users/*/name"
            .parse::<ArgPath>()
            .unwrap()
            .for_each_mut(&mut a, &mut |v| seen.push(v.clone()));
        "/*/name"
            .parse::<ArgPath>()
            .unwrap()
            .for_each_mut(&mut a, &mut |v| seen.push(v.clone()));
        assert_eq!(seen, [json!("A"), json!("B"), json!("C")]);
    }
}
