//! Kubernetes JSON → protobuf, writing the bytes Go's generated marshaller would write for the
//! struct the JSON decodes into: fields in number order, every value (non-pointer) field
//! written even when zero or absent, pointer fields only when present, map entries sorted by
//! key. For objects Go produced, decode followed by encode gives back the original bytes.

use base64::Engine as _;
use serde_json::{Map, Value};

use crate::error::{Path, ProtobufError};
use crate::gotime;
use crate::schema::{Schema, Shape, Special, Type};
use crate::wire::{self, put_bytes, put_varint_field};
use crate::{MAGIC, MAX_DEPTH};

/// Encodes a JSON object of a built-in kind into an enveloped body.
pub(crate) fn envelope(schema: &Schema, value: &Value) -> Result<Vec<u8>, ProtobufError> {
    let root = Path::Root;
    let object = value
        .as_object()
        .ok_or_else(|| mismatch("object", value, &root))?;
    let text = |key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    let (Some(api_version), Some(kind)) = (text("apiVersion"), text("kind")) else {
        return Err(ProtobufError::MissingTypeMeta);
    };
    let index = schema
        .kind(api_version, kind)
        .ok_or_else(|| ProtobufError::UnknownKind {
            gvk: format!("{api_version}, Kind={kind}"),
        })?;
    let mut raw = Vec::new();
    message(schema, index, Some(value), &mut raw, &root, 0)?;

    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = Vec::with_capacity(MAGIC.len() + raw.len() + type_meta.len() + 16);
    out.extend_from_slice(MAGIC);
    // runtime.Unknown; Go writes the empty contentEncoding and contentType too.
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, &raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    Ok(out)
}

/// The JSON type name of a value, for errors.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The error for a JSON value of the wrong type.
fn mismatch(expected: &'static str, found: &Value, path: &Path<'_>) -> ProtobufError {
    ProtobufError::TypeMismatch {
        path: path.render(),
        expected,
        found: json_type(found),
    }
}

/// Appends the fields of message `index` for `value` (`None` or null: the zero value).
fn message(
    schema: &Schema,
    index: usize,
    value: Option<&Value>,
    out: &mut Vec<u8>,
    path: &Path<'_>,
    depth: usize,
) -> Result<(), ProtobufError> {
    if depth >= MAX_DEPTH {
        return Err(ProtobufError::TooDeep {
            limit: MAX_DEPTH,
            path: path.render(),
        });
    }
    let value = value.filter(|v| !v.is_null());
    let message = &schema.messages[index];
    if let Some(special) = message.special {
        if special.is_schema_union() {
            return schema_union(schema, index, special, value, out, path, depth);
        }
        return self::special(special, value, out, path);
    }
    let object: Option<&Map<String, Value>> = match value {
        None => None,
        Some(Value::Object(object)) => Some(object),
        Some(other) => return Err(mismatch("object", other, path)),
    };
    // Keys the schema does not know are dropped, as decoding JSON into the Go struct would.
    for field in message.wire_order.iter().map(|&i| &message.fields[i]) {
        let field_path = Path::Field(path, &field.name);
        if field.inline {
            // The inline struct's fields live in this same JSON object.
            let mut inner = Vec::new();
            if let Type::Message(inner_index) = field.ty {
                self::message(schema, inner_index, value, &mut inner, path, depth + 1)?;
            }
            put_bytes(out, field.number, &inner);
            continue;
        }
        let value = object
            .and_then(|o| o.get(&field.name))
            .filter(|v| !v.is_null());
        match (field.shape, value) {
            (
                Shape::Map {
                    key,
                    value: value_type,
                },
                Some(value),
            ) => {
                let entries = value
                    .as_object()
                    .ok_or_else(|| mismatch("object", value, &field_path))?;
                // Go sorts map keys so that equal objects encode to equal bytes.
                let mut keys: Vec<&String> = entries.keys().collect();
                keys.sort();
                for key_text in keys {
                    let entry_path = Path::Key(&field_path, key_text);
                    let mut entry = Vec::new();
                    let key_value = map_key(key, key_text, &entry_path)?;
                    self::value(
                        schema,
                        key,
                        1,
                        Some(&key_value),
                        &mut entry,
                        &entry_path,
                        depth,
                    )?;
                    let item = entries.get(key_text).filter(|v| !v.is_null());
                    self::value(schema, value_type, 2, item, &mut entry, &entry_path, depth)?;
                    put_bytes(out, field.number, &entry);
                }
            }
            (Shape::Repeated, Some(value)) => {
                let items = value
                    .as_array()
                    .ok_or_else(|| mismatch("array", value, &field_path))?;
                for (i, item) in items.iter().enumerate() {
                    let item_path = Path::Index(&field_path, i);
                    let item = Some(item).filter(|v| !v.is_null());
                    self::value(schema, field.ty, field.number, item, out, &item_path, depth)?;
                }
            }
            (Shape::Single, Some(value)) => {
                self::value(
                    schema,
                    field.ty,
                    field.number,
                    Some(value),
                    out,
                    &field_path,
                    depth,
                )?;
            }
            // Go writes a value field whatever it holds; a pointer, slice or map only when set.
            (Shape::Single, None) if !field.nullable => {
                self::value(
                    schema,
                    field.ty,
                    field.number,
                    None,
                    out,
                    &field_path,
                    depth,
                )?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Turns a JSON object key back into the map's key type.
fn map_key(key: Type, text: &str, path: &Path<'_>) -> Result<Value, ProtobufError> {
    match key {
        Type::String => Ok(Value::String(text.to_owned())),
        Type::Bool => text
            .parse::<bool>()
            .map(Value::Bool)
            .map_err(|_| invalid(path, format!("map key {text:?} is not a boolean"))),
        _ => serde_json::from_str::<serde_json::Number>(text)
            .map(Value::Number)
            .map_err(|_| invalid(path, format!("map key {text:?} is not a number"))),
    }
}

/// An invalid-value error.
fn invalid(path: &Path<'_>, reason: String) -> ProtobufError {
    ProtobufError::InvalidValue {
        path: path.render(),
        reason,
    }
}

/// Appends one value as field `number` (`None`: the type's zero value).
fn value(
    schema: &Schema,
    ty: Type,
    number: u32,
    value: Option<&Value>,
    out: &mut Vec<u8>,
    path: &Path<'_>,
    depth: usize,
) -> Result<(), ProtobufError> {
    match ty {
        Type::Message(index) => {
            let mut inner = Vec::new();
            message(schema, index, value, &mut inner, path, depth + 1)?;
            put_bytes(out, number, &inner);
        }
        Type::String => {
            let text = match value {
                None => "",
                Some(Value::String(s)) => s,
                Some(other) => return Err(mismatch("string", other, path)),
            };
            put_bytes(out, number, text.as_bytes());
        }
        Type::Bytes => {
            let data = match value {
                None => Vec::new(),
                Some(Value::String(s)) => base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|err| invalid(path, format!("invalid base64: {err}")))?,
                Some(other) => return Err(mismatch("base64 string", other, path)),
            };
            put_bytes(out, number, &data);
        }
        Type::Bool => {
            let flag = match value {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => return Err(mismatch("boolean", other, path)),
            };
            put_varint_field(out, number, u64::from(flag));
        }
        Type::Double | Type::Float => {
            let float = match value {
                None => 0.0,
                Some(Value::Number(n)) => n.as_f64().unwrap_or_default(),
                Some(other) => return Err(mismatch("number", other, path)),
            };
            if ty == Type::Double {
                wire::put_tag(out, number, wire::FIXED64);
                out.extend_from_slice(&float.to_le_bytes());
            } else {
                wire::put_tag(out, number, wire::FIXED32);
                out.extend_from_slice(&(float as f32).to_le_bytes());
            }
        }
        _ => {
            let int = match value {
                None => 0,
                Some(v) => integer(ty, v, path)?,
            };
            match ty {
                Type::Fixed32 | Type::Sfixed32 => {
                    wire::put_tag(out, number, wire::FIXED32);
                    out.extend_from_slice(&(int as u32).to_le_bytes());
                }
                Type::Fixed64 | Type::Sfixed64 => {
                    wire::put_tag(out, number, wire::FIXED64);
                    out.extend_from_slice(&(int as u64).to_le_bytes());
                }
                Type::Sint32 | Type::Sint64 => {
                    put_varint_field(out, number, wire::zigzag(int as i64));
                }
                // int32 and enums are sign-extended to 64 bits on the wire, per the spec.
                Type::Uint32 | Type::Uint64 => put_varint_field(out, number, int as u64),
                _ => put_varint_field(out, number, int as i64 as u64),
            }
        }
    }
    Ok(())
}

/// Reads a JSON integer for an integer field, range-checked against the field's type.
fn integer(ty: Type, value: &Value, path: &Path<'_>) -> Result<i128, ProtobufError> {
    let Value::Number(number) = value else {
        return Err(mismatch("integer", value, path));
    };
    let int = if let Some(i) = number.as_i64() {
        i128::from(i)
    } else if let Some(u) = number.as_u64() {
        i128::from(u)
    } else {
        // 1e3 and 3.0 are integers written as floats; 1.5 is not.
        match number.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 1.9e19 => f as i128,
            _ => return Err(invalid(path, format!("{number} is not an integer"))),
        }
    };
    let (min, max): (i128, i128) = match ty {
        Type::Int32 | Type::Sint32 | Type::Sfixed32 | Type::Enum => {
            (i32::MIN.into(), i32::MAX.into())
        }
        Type::Uint32 | Type::Fixed32 => (0, u32::MAX.into()),
        Type::Uint64 | Type::Fixed64 => (0, u64::MAX.into()),
        _ => (i64::MIN.into(), i64::MAX.into()),
    };
    if (min..=max).contains(&int) {
        Ok(int)
    } else {
        Err(invalid(
            path,
            format!("{int} is out of range for the field"),
        ))
    }
}

/// Appends a CustomResourceDefinition schema union from its JSON form (its Go
/// `UnmarshalJSON`): an object is the schema (for `JSONSchemaPropsOrBool` with `allows` true),
/// an array the list, a boolean `allows`.
fn schema_union(
    schema: &Schema,
    index: usize,
    special: Special,
    value: Option<&Value>,
    out: &mut Vec<u8>,
    path: &Path<'_>,
    depth: usize,
) -> Result<(), ProtobufError> {
    let message = &schema.messages[index];
    let field = |number: u32| {
        message
            .field_index(number)
            .map(|i| &message.fields[i])
            .ok_or_else(|| invalid(path, format!("{} lacks field {number}", message.name)))
    };
    let schema_field = field(if special == Special::SchemaOrBool {
        2
    } else {
        1
    })?;
    match value {
        None => {}
        Some(object @ Value::Object(_)) => {
            if special == Special::SchemaOrBool {
                put_varint_field(out, 1, 1);
            }
            self::value(
                schema,
                schema_field.ty,
                schema_field.number,
                Some(object),
                out,
                path,
                depth,
            )?;
        }
        Some(Value::Bool(allows)) if special == Special::SchemaOrBool => {
            put_varint_field(out, 1, u64::from(*allows));
        }
        Some(Value::Array(items)) if special != Special::SchemaOrBool => {
            let list = field(2)?;
            for (i, item) in items.iter().enumerate() {
                let item_path = Path::Index(path, i);
                self::value(
                    schema,
                    list.ty,
                    list.number,
                    Some(item),
                    out,
                    &item_path,
                    depth,
                )?;
            }
        }
        Some(other) => return Err(mismatch("schema or its alternative", other, path)),
    }
    Ok(())
}

/// Appends the fields of one of the types with a custom JSON form.
fn special(
    special: Special,
    value: Option<&Value>,
    out: &mut Vec<u8>,
    path: &Path<'_>,
) -> Result<(), ProtobufError> {
    match special {
        Special::Quantity => {
            let text = match value {
                // Go's zero Quantity marshals as "0".
                None => "0".to_owned(),
                Some(Value::String(s)) => s.clone(),
                // Quantity's JSON decoder takes bare numbers too.
                Some(Value::Number(n)) => n.to_string(),
                Some(other) => return Err(mismatch("quantity string", other, path)),
            };
            put_bytes(out, 1, text.as_bytes());
        }
        Special::IntOrString => {
            // Go writes all three fields whichever the type.
            let (kind, int, text) = match value {
                None => (0, 0, ""),
                Some(Value::String(s)) => (1, 0, s.as_str()),
                Some(number @ Value::Number(_)) => (0, integer(Type::Int32, number, path)?, ""),
                Some(other) => return Err(mismatch("integer or string", other, path)),
            };
            put_varint_field(out, 1, kind);
            put_varint_field(out, 2, int as i64 as u64);
            put_bytes(out, 3, text.as_bytes());
        }
        Special::Time | Special::MicroTime => {
            // The zero time marshals as an empty message.
            let Some(value) = value else {
                return Ok(());
            };
            let text = value
                .as_str()
                .ok_or_else(|| mismatch("RFC 3339 time string", value, path))?;
            let (seconds, nanos) = gotime::parse_rfc3339(text).map_err(|e| invalid(path, e))?;
            // metav1.Time keeps whole seconds only; MicroTime keeps microseconds.
            let nanos = if special == Special::Time {
                0
            } else {
                nanos / 1_000 * 1_000
            };
            put_varint_field(out, 1, seconds as u64);
            put_varint_field(out, 2, u64::from(nanos));
        }
        Special::Duration => {
            let nanos = match value {
                None => 0,
                Some(Value::String(s)) => {
                    gotime::parse_duration(s).map_err(|e| invalid(path, e))?
                }
                Some(other) => return Err(mismatch("duration string", other, path)),
            };
            put_varint_field(out, 1, nanos as u64);
        }
        Special::RawJson => {
            if let Some(value) = value {
                let raw = serde_json::to_vec(value)
                    .map_err(|err| invalid(path, format!("embedded json: {err}")))?;
                put_bytes(out, 1, &raw);
            }
        }
        // Encoded by `schema_union` before this is reached.
        Special::SchemaOrArray | Special::SchemaOrBool | Special::SchemaOrStringArray => {}
        Special::StringList => {
            if let Some(value) = value {
                let items = value
                    .as_array()
                    .ok_or_else(|| mismatch("array", value, path))?;
                for (i, item) in items.iter().enumerate() {
                    let text = item
                        .as_str()
                        .ok_or_else(|| mismatch("string", item, &Path::Index(path, i)))?;
                    put_bytes(out, 1, text.as_bytes());
                }
            }
        }
    }
    Ok(())
}
