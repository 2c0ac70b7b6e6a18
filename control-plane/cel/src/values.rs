//! JSON data as CEL values, typed by the schema (upstream `UnstructuredToVal`): integers as
//! `int`, `format: date-time`/`date` as `timestamp`, `duration` as `duration`, `byte` as
//! `bytes`, objects as maps keyed by escaped property names without their absent or null fields.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use cel::objects::{Key, Map};
use cel::{Context, Program, Value};
use serde_json::Value as Json;

use crate::escaping;
use crate::schema::Structural;

/// CEL's own parsers for the string formats that become timestamps and durations: the
/// `chrono` types behind `Value::Timestamp` are only reachable through them.
struct Parsers {
    timestamp: Program,
    duration: Program,
}

static PARSERS: LazyLock<Option<Parsers>> = LazyLock::new(|| {
    let env = crate::env::env();
    Some(Parsers {
        timestamp: env.compile("timestamp(s)").ok()?,
        duration: env.compile("duration(s)").ok()?,
    })
});

fn parse_with(program: impl Fn(&Parsers) -> &Program, text: &str) -> Option<Value> {
    let parsers = PARSERS.as_ref()?;
    let mut context = Context::with_env(crate::env::env().clone());
    context.add_variable_from_value("s", text.to_string());
    program(parsers).execute(&context).ok()
}

/// `timestamp(text)`, or `None` when CEL does not read it as RFC 3339.
pub(crate) fn parse_timestamp(text: &str) -> Option<Value> {
    parse_with(|p| &p.timestamp, text)
}

/// `duration(text)`, or `None` when CEL does not read it as a duration.
pub(crate) fn parse_duration(text: &str) -> Option<Value> {
    parse_with(|p| &p.duration, text)
}

/// The value of `data` as CEL sees it through `schema`.
///
/// Data that does not fit its schema cannot reach here (the OpenAPI validation that runs first
/// rejects it), so where upstream would build an error value this falls back to the plain JSON
/// reading instead of failing.
pub(crate) fn to_cel(data: &Json, schema: &Structural) -> Value {
    if data.is_null() {
        return Value::Null;
    }
    if schema.int_or_string {
        return untyped(data);
    }
    match (schema.type_.as_str(), data) {
        ("object", Json::Object(fields)) => {
            if schema.embedded_resource || schema.properties.is_some() {
                let with_meta;
                let schema = if schema.embedded_resource {
                    with_meta = schema.with_type_and_object_meta();
                    &with_meta
                } else {
                    schema
                };
                let properties = schema.properties.as_ref();
                let mut map = HashMap::with_capacity(fields.len());
                for (name, value) in fields {
                    // absent and null fields alike make `has()` false
                    let Some(property) = properties.and_then(|p| p.get(name)) else {
                        continue;
                    };
                    if value.is_null() {
                        continue;
                    }
                    let key = escaping::escape(name).unwrap_or_else(|| name.clone());
                    map.insert(Key::String(Arc::new(key)), to_cel(value, property));
                }
                Value::Map(Map { map: Arc::new(map) })
            } else if let Some(values) = &schema.additional_properties {
                let map = fields
                    .iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), to_cel(v, values)))
                    .collect();
                Value::Map(Map { map: Arc::new(map) })
            } else {
                // an object without declared fields exposes none of them
                Value::Map(Map {
                    map: Arc::new(HashMap::new()),
                })
            }
        }
        ("array", Json::Array(items)) => match &schema.items {
            Some(item_schema) => Value::List(Arc::new(
                items.iter().map(|i| to_cel(i, item_schema)).collect(),
            )),
            None => Value::List(Arc::new(Vec::new())),
        },
        ("string", Json::String(text)) => string_value(text, &schema.format),
        ("number", Json::Number(n)) => n.as_f64().map_or(Value::Null, Value::Float),
        ("integer", Json::Number(_)) | ("boolean", Json::Bool(_)) => untyped(data),
        _ => untyped(data),
    }
}

fn string_value(text: &str, format: &str) -> Value {
    let parsed = match format {
        "duration" => parse_duration(text),
        "date" => parse_timestamp(&format!("{text}T00:00:00Z")),
        "date-time" => parse_timestamp(text),
        "byte" => decode_base64(text).map(|bytes| Value::Bytes(Arc::new(bytes))),
        _ => None,
    };
    parsed.unwrap_or_else(|| Value::String(Arc::new(text.to_string())))
}

/// Go's `base64.StdEncoding` decoding (line breaks ignored), or `None` for anything else.
pub(crate) fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let body: Vec<u8> = text
        .bytes()
        .filter(|b| *b != b'\r' && *b != b'\n')
        .collect();
    if !body.len().is_multiple_of(4) {
        return None;
    }
    let padding = body.iter().rev().take_while(|b| **b == b'=').count();
    if padding > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3);
    let mut bits: u32 = 0;
    let mut count = 0;
    for &b in &body[..body.len() - padding] {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    Some(out)
}

/// The JSON reading of a value with no schema to go by (`x-kubernetes-int-or-string`,
/// preserved unknown fields): whole numbers are `int`, other numbers `double`.
pub(crate) fn untyped(data: &Json) -> Value {
    match data {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => match n.as_u64() {
                Some(u) => Value::UInt(u),
                None => n.as_f64().map_or(Value::Null, Value::Float),
            },
        },
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(items) => Value::List(Arc::new(items.iter().map(untyped).collect())),
        Json::Object(fields) => {
            let map = fields
                .iter()
                .map(|(k, v)| (Key::String(Arc::new(k.clone())), untyped(v)))
                .collect();
            Value::Map(Map { map: Arc::new(map) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    use serde_json::json;

    fn schema(s: Json) -> Structural {
        let props: JSONSchemaProps = serde_json::from_value(s).unwrap_or_else(|e| panic!("{e}"));
        Structural::from_props(&props)
    }

    fn field(value: &Value, name: &str) -> Option<Value> {
        match value {
            Value::Map(m) => m.map.get(&Key::String(Arc::new(name.to_string()))).cloned(),
            _ => None,
        }
    }

    #[test]
    fn types_values_by_schema() {
        let s = schema(json!({
            "type": "object",
            "properties": {
                "count": {"type": "integer"},
                "ratio": {"type": "number"},
                "when": {"type": "string", "format": "date-time"},
                "day": {"type": "string", "format": "date"},
                "wait": {"type": "string", "format": "duration"},
                "blob": {"type": "string", "format": "byte"},
                "port": {"x-kubernetes-int-or-string": true},
                "foo-bar": {"type": "string"},
                "gone": {"type": "string", "nullable": true},
            }
        }));
        let data = json!({
            "count": 3, "ratio": 1, "when": "2011-08-18T19:03:37.01+01:00", "day": "1997-07-16",
            "wait": "1h2m", "blob": "QUI=", "port": "http", "foo-bar": "x", "gone": null,
            "unknown": 1,
        });
        let value = to_cel(&data, &s);
        assert_eq!(field(&value, "count"), Some(Value::Int(3)));
        assert_eq!(field(&value, "ratio"), Some(Value::Float(1.0)));
        assert!(matches!(field(&value, "when"), Some(Value::Timestamp(_))));
        assert!(matches!(field(&value, "day"), Some(Value::Timestamp(_))));
        assert!(matches!(field(&value, "wait"), Some(Value::Duration(_))));
        assert_eq!(
            field(&value, "blob"),
            Some(Value::Bytes(Arc::new(b"AB".to_vec())))
        );
        assert_eq!(
            field(&value, "port"),
            Some(Value::String(Arc::new("http".into())))
        );
        assert_eq!(
            field(&value, "foo__dash__bar"),
            Some(Value::String(Arc::new("x".into())))
        );
        assert_eq!(field(&value, "gone"), None);
        assert_eq!(field(&value, "unknown"), None);
    }

    #[test]
    fn map_keys_are_not_escaped() {
        let s = schema(json!({"type": "object", "additionalProperties": {"type": "string"}}));
        let value = to_cel(&json!({"a-b": "x"}), &s);
        assert_eq!(
            field(&value, "a-b"),
            Some(Value::String(Arc::new("x".into())))
        );
    }
}
