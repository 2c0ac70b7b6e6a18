//! Protobuf → Kubernetes JSON: walks a message with its schema and produces the value Go's
//! `json.Marshal` would produce for the struct the protobuf decodes into.
//!
//! Presence rules, chosen so the JSON means exactly what the Go struct means:
//! - Go's generated marshaller writes every value (non-pointer) field, zero or not. A zero
//!   scalar in such a field is therefore dropped (Go's JSON has it `omitempty`, and where it
//!   does not, an absent field decodes to the same zero); a non-zero one is kept.
//! - A pointer scalar is only on the wire when set, so it is kept even when zero: `replicas: 0`,
//!   `automountServiceAccountToken: false`, `storageClassName: ""` all mean something.
//! - Messages present on the wire are always emitted (Go never omits a struct), so
//!   `"resources": {}` and `"creationTimestamp": null` appear just as in kubectl's JSON.
//! - Empty repeated and map fields are absent on the wire and absent in the JSON.

use base64::Engine as _;
use serde_json::{Map, Number, Value};

use crate::error::{Path, ProtobufError};
use crate::gotime;
use crate::schema::{Schema, Shape, Special, Type};
use crate::wire::{Reader, WireValue};
use crate::{MAGIC, MAX_DEPTH};

/// Decodes an enveloped body into the JSON object of the kind it names.
pub(crate) fn envelope(schema: &Schema, body: &[u8], depth: usize) -> Result<Value, ProtobufError> {
    let unknown = body.strip_prefix(MAGIC).ok_or(ProtobufError::BadMagic)?;
    let (mut api_version, mut kind) = (String::new(), String::new());
    let mut raw: &[u8] = &[];
    let root = Path::Root;
    let mut reader = Reader::new(unknown);
    // runtime.Unknown: typeMeta = 1 {apiVersion = 1, kind = 2}, raw = 2, contentEncoding = 3,
    // contentType = 4.
    while let Some((number, value)) = reader.next_field(&root)? {
        match number {
            1 => {
                let path = Path::Field(&root, "typeMeta");
                let mut type_meta = Reader::new(bytes(value, &path)?);
                while let Some((number, value)) = type_meta.next_field(&path)? {
                    match number {
                        1 => api_version = string(value, &Path::Field(&path, "apiVersion"))?,
                        2 => kind = string(value, &Path::Field(&path, "kind"))?,
                        _ => {}
                    }
                }
            }
            2 => raw = bytes(value, &Path::Field(&root, "raw"))?,
            3 => {
                let encoding = string(value, &Path::Field(&root, "contentEncoding"))?;
                if !encoding.is_empty() {
                    return Err(ProtobufError::UnsupportedContentEncoding(encoding));
                }
            }
            4 => {
                let content_type = string(value, &Path::Field(&root, "contentType"))?;
                if !content_type.is_empty() && !crate::is_protobuf(&content_type) {
                    return Err(ProtobufError::UnsupportedContentType(content_type));
                }
            }
            _ => {}
        }
    }
    if api_version.is_empty() || kind.is_empty() {
        return Err(ProtobufError::MissingTypeMeta);
    }
    let message = schema
        .kind(&api_version, &kind)
        .ok_or_else(|| ProtobufError::UnknownKind {
            gvk: format!("{api_version}, Kind={kind}"),
        })?;
    let Value::Object(fields) = self::message(schema, message, raw, &root, depth)? else {
        // Schema::kind never returns a special type, so a plain message is always an object.
        return Err(ProtobufError::Schema(format!(
            "{kind} did not decode to an object"
        )));
    };
    // Go's TypeMeta puts kind first; keep that order for readable output.
    let mut object = Map::with_capacity(fields.len() + 2);
    object.insert("kind".into(), Value::String(kind));
    object.insert("apiVersion".into(), Value::String(api_version));
    object.extend(fields);
    Ok(Value::Object(object))
}

/// Decodes one message of type `index`.
fn message(
    schema: &Schema,
    index: usize,
    data: &[u8],
    path: &Path<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    if depth >= MAX_DEPTH {
        return Err(ProtobufError::TooDeep {
            limit: MAX_DEPTH,
            path: path.render(),
        });
    }
    let message = &schema.messages[index];
    if let Some(special) = message.special {
        if special.is_schema_union() {
            return schema_union(schema, index, special, data, path, depth);
        }
        return self::special(schema, special, data, path, depth);
    }

    // Gather first, emit second: repeated elements need not be contiguous, and a message field
    // sent twice is merged (protobuf's rule), which concatenating its occurrences achieves.
    let mut slots: Vec<Vec<WireValue<'_>>> = vec![Vec::new(); message.fields.len()];
    let mut reader = Reader::new(data);
    while let Some((number, value)) = reader.next_field(path)? {
        // Unknown fields are skipped, as Go's generated unmarshaller does: a newer client may
        // send fields this schema predates.
        if let Some(slot) = message.field_index(number) {
            slots[slot].push(value);
        }
    }

    let mut object = Map::new();
    for (field, values) in message.fields.iter().zip(&slots) {
        if values.is_empty() {
            continue;
        }
        let path = Path::Field(path, &field.name);
        let value = match field.shape {
            Shape::Map { key, value } => map(schema, key, value, values, &path, depth)?,
            Shape::Repeated => {
                let mut items = Vec::with_capacity(values.len());
                for value in values {
                    match (field.ty.is_packable(), value) {
                        (true, WireValue::Bytes(packed)) => {
                            unpack(field.ty, packed, &path, &mut items)?;
                        }
                        _ => {
                            let path = Path::Index(&path, items.len());
                            items.push(single(
                                schema,
                                field.ty,
                                std::slice::from_ref(value),
                                &path,
                                depth,
                            )?);
                        }
                    }
                }
                Value::Array(items)
            }
            Shape::Single if field.inline => {
                let Type::Message(inner) = field.ty else {
                    continue;
                };
                let data = concat(values, &path)?;
                if let Value::Object(fields) =
                    self::message(schema, inner, &data, path_of_inline(&path), depth + 1)?
                {
                    object.extend(fields);
                }
                continue;
            }
            Shape::Single => {
                let value = single(schema, field.ty, values, &path, depth)?;
                if !field.nullable && is_zero_scalar(field.ty, &value) {
                    continue;
                }
                value
            }
        };
        object.insert(field.name.clone(), value);
    }
    Ok(Value::Object(object))
}

/// Inline fields have no JSON key of their own: errors inside them name the parent's path.
fn path_of_inline<'a>(path: &'a Path<'a>) -> &'a Path<'a> {
    match path {
        Path::Field(parent, _) => parent,
        other => other,
    }
}

/// True for the zero value of a scalar type (bytes excluded: Go keeps a non-nil empty slice).
fn is_zero_scalar(ty: Type, value: &Value) -> bool {
    match (ty, value) {
        (Type::Message(_) | Type::Bytes, _) => false,
        (_, Value::Bool(b)) => !b,
        (_, Value::String(s)) => s.is_empty(),
        (_, Value::Number(n)) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// Decodes a non-repeated field from all its occurrences: the last one wins for scalars, and
/// messages are merged.
fn single(
    schema: &Schema,
    ty: Type,
    values: &[WireValue<'_>],
    path: &Path<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    match ty {
        Type::Message(index) => {
            let data = concat(values, path)?;
            message(schema, index, &data, path, depth + 1)
        }
        _ => match values.last() {
            Some(value) => scalar(ty, *value, path),
            None => Ok(Value::Null),
        },
    }
}

/// Concatenates the occurrences of a message field (protobuf merge semantics).
fn concat<'a>(
    values: &[WireValue<'a>],
    path: &Path<'_>,
) -> Result<std::borrow::Cow<'a, [u8]>, ProtobufError> {
    match values {
        [value] => Ok(std::borrow::Cow::Borrowed(bytes(*value, path)?)),
        _ => {
            let mut joined = Vec::new();
            for value in values {
                joined.extend_from_slice(bytes(*value, path)?);
            }
            Ok(std::borrow::Cow::Owned(joined))
        }
    }
}

/// Decodes a map field from its entry messages (key = 1, value = 2).
fn map(
    schema: &Schema,
    key_type: Type,
    value_type: Type,
    entries: &[WireValue<'_>],
    path: &Path<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    let mut object = Map::new();
    for entry in entries {
        let mut key = None;
        let mut value = Vec::new();
        let mut reader = Reader::new(bytes(*entry, path)?);
        while let Some((number, field)) = reader.next_field(path)? {
            match number {
                1 => key = Some(field),
                2 => value.push(field),
                _ => {}
            }
        }
        // A missing key or value is the type's default, per the protobuf map spec.
        let key = match key {
            Some(key) => scalar(key_type, key, path)?,
            None => default_scalar(key_type),
        };
        let key = match key {
            Value::String(key) => key,
            other => other.to_string(),
        };
        let value_path = Path::Key(path, &key);
        let value = if value.is_empty() {
            match value_type {
                Type::Message(index) => message(schema, index, &[], &value_path, depth + 1)?,
                _ => default_scalar(value_type),
            }
        } else {
            single(schema, value_type, &value, &value_path, depth)?
        };
        // Later entries replace earlier ones with the same key, as in every protobuf runtime.
        object.insert(key, value);
    }
    Ok(Value::Object(object))
}

/// The JSON of a scalar type's default value.
fn default_scalar(ty: Type) -> Value {
    match ty {
        Type::String | Type::Bytes => Value::String(String::new()),
        Type::Bool => Value::Bool(false),
        _ => Value::Number(0.into()),
    }
}

/// Decodes packed repeated scalars.
fn unpack(
    ty: Type,
    packed: &[u8],
    path: &Path<'_>,
    out: &mut Vec<Value>,
) -> Result<(), ProtobufError> {
    let mut reader = Reader::new(packed);
    while !reader.is_empty() {
        let value = match ty {
            Type::Fixed64 | Type::Sfixed64 | Type::Double => {
                let mut le = [0u8; 8];
                le.copy_from_slice(reader.take(8, path)?);
                WireValue::Fixed64(u64::from_le_bytes(le))
            }
            Type::Fixed32 | Type::Sfixed32 | Type::Float => {
                let mut le = [0u8; 4];
                le.copy_from_slice(reader.take(4, path)?);
                WireValue::Fixed32(u32::from_le_bytes(le))
            }
            _ => WireValue::Varint(reader.varint(path)?),
        };
        let element = Path::Index(path, out.len());
        out.push(scalar(ty, value, &element)?);
    }
    Ok(())
}

/// The error for a value whose wire type does not fit its field.
fn wrong_wire_type(expected: &'static str, found: WireValue<'_>, path: &Path<'_>) -> ProtobufError {
    ProtobufError::WrongWireType {
        path: path.render(),
        expected,
        found: found.type_name(),
    }
}

/// The bytes of a length-delimited value.
fn bytes<'a>(value: WireValue<'a>, path: &Path<'_>) -> Result<&'a [u8], ProtobufError> {
    match value {
        WireValue::Bytes(bytes) => Ok(bytes),
        other => Err(wrong_wire_type("length-delimited", other, path)),
    }
}

/// A string value. Go does not validate UTF-8 in proto2 strings, but JSON cannot carry
/// invalid UTF-8 faithfully, so it is rejected rather than silently replaced.
fn string(value: WireValue<'_>, path: &Path<'_>) -> Result<String, ProtobufError> {
    String::from_utf8(bytes(value, path)?.to_vec()).map_err(|_| ProtobufError::InvalidUtf8 {
        path: path.render(),
    })
}

/// A varint value.
fn varint(value: WireValue<'_>, path: &Path<'_>) -> Result<u64, ProtobufError> {
    match value {
        WireValue::Varint(v) => Ok(v),
        other => Err(wrong_wire_type("varint", other, path)),
    }
}

/// A JSON number from a float, which JSON cannot hold when NaN or infinite. A whole number is
/// written without a fraction, as Go's encoder writes a float64 (`0`, not `0.0`).
fn float(value: f64, path: &Path<'_>) -> Result<Value, ProtobufError> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every whole number below is exact
    if value.fract() == 0.0 && value.abs() < EXACT {
        return Ok(Value::from(value as i64));
    }
    Number::from_f64(value)
        .map(Value::Number)
        .ok_or_else(|| ProtobufError::InvalidValue {
            path: path.render(),
            reason: format!("{value} cannot be represented in JSON"),
        })
}

/// Decodes a scalar field value.
fn scalar(ty: Type, value: WireValue<'_>, path: &Path<'_>) -> Result<Value, ProtobufError> {
    // Truncating casts below are protobuf's own rules: an int32 is sent sign-extended to 64
    // bits, and readers take the low 32.
    Ok(match ty {
        Type::String => Value::String(string(value, path)?),
        Type::Bytes => {
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes(value, path)?))
        }
        Type::Bool => Value::Bool(varint(value, path)? != 0),
        Type::Int32 | Type::Enum => Value::from(varint(value, path)? as i32),
        Type::Int64 => Value::from(varint(value, path)? as i64),
        Type::Uint32 => Value::from(varint(value, path)? as u32),
        Type::Uint64 => Value::from(varint(value, path)?),
        Type::Sint32 => Value::from(crate::wire::unzigzag(varint(value, path)?) as i32),
        Type::Sint64 => Value::from(crate::wire::unzigzag(varint(value, path)?)),
        Type::Fixed32 | Type::Sfixed32 | Type::Float => {
            let WireValue::Fixed32(bits) = value else {
                return Err(wrong_wire_type("fixed32", value, path));
            };
            match ty {
                Type::Fixed32 => Value::from(bits),
                Type::Sfixed32 => Value::from(bits as i32),
                _ => float(f64::from(f32::from_bits(bits)), path)?,
            }
        }
        Type::Fixed64 | Type::Sfixed64 | Type::Double => {
            let WireValue::Fixed64(bits) = value else {
                return Err(wrong_wire_type("fixed64", value, path));
            };
            match ty {
                Type::Fixed64 => Value::from(bits),
                Type::Sfixed64 => Value::from(bits as i64),
                _ => float(f64::from_bits(bits), path)?,
            }
        }
        Type::Message(_) => return Err(wrong_wire_type("scalar", value, path)),
    })
}

/// Decodes a CustomResourceDefinition schema union into its JSON form, as its Go
/// `MarshalJSON` writes it: `JSONSchemaPropsOrArray` the array when it has items, else the
/// schema; `JSONSchemaPropsOrBool` the schema when set, else the boolean;
/// `JSONSchemaPropsOrStringArray` the strings when there are any, else the schema.
fn schema_union(
    schema: &Schema,
    index: usize,
    special: Special,
    data: &[u8],
    path: &Path<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    let message = &schema.messages[index];
    let (mut single, mut list, mut allows) = (None, Vec::new(), false);
    let mut reader = Reader::new(data);
    while let Some((number, value)) = reader.next_field(path)? {
        let Some(field) = message.field_index(number).map(|i| &message.fields[i]) else {
            continue;
        };
        match field.ty {
            Type::Message(target) => {
                let decoded = self::message(schema, target, bytes(value, path)?, path, depth + 1)?;
                match field.shape {
                    Shape::Repeated => list.push(decoded),
                    _ => single = Some(decoded),
                }
            }
            Type::Bool => allows = varint(value, path)? != 0,
            Type::String => list.push(Value::String(string(value, path)?)),
            _ => {}
        }
    }
    Ok(match (special, single) {
        (Special::SchemaOrBool, Some(schema)) => schema,
        (Special::SchemaOrBool, None) => Value::Bool(allows),
        (_, _) if !list.is_empty() => Value::Array(list),
        (_, single) => single.unwrap_or(Value::Null),
    })
}

/// Decodes one of the types with a custom JSON form.
fn special(
    schema: &Schema,
    special: Special,
    data: &[u8],
    path: &Path<'_>,
    depth: usize,
) -> Result<Value, ProtobufError> {
    let invalid = |reason: String| ProtobufError::InvalidValue {
        path: path.render(),
        reason,
    };
    // Every special type is a handful of scalar fields; read them by number. Their layout was
    // checked against the descriptors when the schema loaded.
    let mut varints = [0u64; 3];
    let mut text = None;
    let mut raw = None;
    let mut items = Vec::new();
    let mut reader = Reader::new(data);
    while let Some((number, value)) = reader.next_field(path)? {
        match (special, number) {
            (Special::Quantity, 1) | (Special::IntOrString, 3) => text = Some(string(value, path)?),
            (Special::RawJson, 1) => raw = Some(bytes(value, path)?),
            (Special::StringList, 1) => items.push(Value::String(string(value, path)?)),
            // IntOrString type and intVal, Time / MicroTime seconds and nanos, Duration.
            (Special::IntOrString | Special::Time | Special::MicroTime, 1 | 2)
            | (Special::Duration, 1) => varints[number as usize] = varint(value, path)?,
            _ => {}
        }
    }
    Ok(match special {
        // Go's zero Quantity prints as "0"; its marshaller always writes the string anyway.
        Special::Quantity => Value::String(text.unwrap_or_else(|| "0".to_owned())),
        Special::IntOrString => match varints[1] {
            0 => Value::from(varints[2] as i32),
            1 => Value::String(text.unwrap_or_default()),
            other => {
                return Err(invalid(format!(
                    "IntOrString type {other} is neither 0 (int) nor 1 (string)"
                )));
            }
        },
        // metav1.Time marshals the zero time as nothing at all and unmarshals nothing as the
        // zero time, which its JSON form writes as null. Go reads only the seconds of a Time.
        Special::Time | Special::MicroTime if data.is_empty() => Value::Null,
        Special::Time => {
            Value::String(gotime::format_rfc3339(varints[1] as i64, 0, false).map_err(invalid)?)
        }
        Special::MicroTime => {
            let nanos = u32::try_from(varints[2] as i32)
                .ok()
                .filter(|n| *n < 1_000_000_000)
                .ok_or_else(|| invalid(format!("nanos {} out of range", varints[2] as i32)))?;
            Value::String(gotime::format_rfc3339(varints[1] as i64, nanos, true).map_err(invalid)?)
        }
        Special::Duration => Value::String(gotime::format_duration(varints[1] as i64)),
        Special::StringList => Value::Array(items),
        // Decoded by `schema_union` before this is reached.
        Special::SchemaOrArray | Special::SchemaOrBool | Special::SchemaOrStringArray => {
            Value::Null
        }
        Special::RawJson => match raw {
            None | Some([]) => Value::Null,
            // An embedded object may itself be protobuf-encoded (runtime.Unknown inside a
            // RawExtension); everything else Kubernetes puts there is JSON.
            Some(raw) if raw.starts_with(MAGIC) => envelope(schema, raw, depth + 1)?,
            Some(raw) => serde_json::from_slice(raw)
                .map_err(|err| invalid(format!("embedded json: {err}")))?,
        },
    })
}
