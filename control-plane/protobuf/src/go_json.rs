//! Objects put in the key order, and given the always-written fields, of Go's
//! `encoding/json` over the Go types, which is how the Kubernetes API server writes them:
//! `kind` and `apiVersion` first, then each field in the Go struct's order (the descriptor
//! set's declaration order), value (non-pointer) struct fields always present — `{}` when
//! empty, the zero value's own form for `metav1.Time` (`null`), `IntOrString` (`0`) and the
//! like — and map keys sorted. Objects that are not built-in kinds (custom resources) get
//! every key sorted, as Go writes an unstructured object. The workspace's JSON maps keep
//! insertion order, so the reordered value serializes in this order (escaping is the
//! serializer's: `flotilla_api_machinery::gojson`).

use serde_json::{Map, Value};

use crate::schema::{self, Schema, Shape, Special, Type};

/// Deeper than any real object (see [`crate::MAX_DEPTH`]); past it values are left as they
/// are.
const MAX_DEPTH: usize = crate::MAX_DEPTH;

/// Reorders `value` in place as Go would write it, when it is an object of a built-in kind
/// (or a list of one); anything else is left as it is. Whether it was one.
pub fn order(value: &mut Value) -> bool {
    let Ok(schema) = schema::schema() else {
        return false;
    };
    let Value::Object(map) = value else {
        return false;
    };
    match kind_of(schema, map) {
        // TypeMeta is embedded first in every kind: `kind`, then `apiVersion`. The
        // descriptors carry it as a field only in the few types that embed it themselves.
        Some(message) => {
            let type_meta = !embeds_type_meta(schema, message);
            order_message(schema, message, map, 0, type_meta);
            true
        }
        None => false,
    }
}

/// Sorts every object's keys, as Go writes an unstructured object (a custom resource).
pub fn sort_unstructured(value: &mut Value) {
    sort_plain(value, 0);
}

/// The message of a built-in object by its `apiVersion` and `kind`.
fn kind_of(schema: &Schema, map: &Map<String, Value>) -> Option<usize> {
    let api_version = map.get("apiVersion")?.as_str()?;
    let kind = map.get("kind")?.as_str()?;
    schema.kind(api_version, kind)
}

/// Whether `message` embeds `TypeMeta` (then its fields lead the object by themselves).
fn embeds_type_meta(schema: &Schema, message: usize) -> bool {
    schema.messages[message].fields.iter().any(|field| {
        field.inline
            && matches!(field.ty, Type::Message(target)
                if schema::simple_name(&schema.messages[target].name) == "TypeMeta")
    })
}

fn order_message(
    schema: &Schema,
    message: usize,
    map: &mut Map<String, Value>,
    depth: usize,
    type_meta: bool,
) {
    if depth > MAX_DEPTH {
        return;
    }
    let mut rest = std::mem::take(map);
    if type_meta {
        for key in ["kind", "apiVersion"] {
            if let Some(value) = rest.remove(key) {
                map.insert(key.to_string(), value);
            }
        }
    }
    take_fields(schema, message, &mut rest, map, depth);
    // Keys the Go type does not have (Go would have dropped them) are kept, sorted.
    if !rest.is_empty() {
        let mut unknown: Vec<(String, Value)> = rest.into_iter().collect();
        unknown.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, mut value) in unknown {
            sort_plain(&mut value, depth + 1);
            map.insert(key, value);
        }
    }
}

/// Moves `message`'s fields from `from` into `into` in the Go struct's order, each ordered
/// by its own type, adding the value structs Go always writes.
fn take_fields(
    schema: &Schema,
    message: usize,
    from: &mut Map<String, Value>,
    into: &mut Map<String, Value>,
    depth: usize,
) {
    for field in &schema.messages[message].fields {
        if field.inline
            && let Type::Message(target) = field.ty
        {
            take_fields(schema, target, from, into, depth + 1);
            continue;
        }
        match from.remove(field.name.as_str()) {
            Some(mut value) => {
                order_field(schema, field.ty, field.shape, &mut value, depth);
                into.insert(field.name.clone(), value);
            }
            // Go writes a value struct whatever it holds (`omitempty` does not apply to
            // structs): `{}` with its own value structs inside, or the zero value's JSON
            // form (`null` for a Time, `0` for an IntOrString).
            None if !field.nullable && field.shape == Shape::Single => {
                if let Type::Message(target) = field.ty {
                    let zero = match schema.messages[target].special {
                        None => {
                            let mut empty = Map::new();
                            order_message(schema, target, &mut empty, depth + 1, false);
                            Value::Object(empty)
                        }
                        Some(Special::Time | Special::MicroTime | Special::RawJson) => Value::Null,
                        Some(Special::StringList) => Value::Null,
                        Some(Special::IntOrString) => Value::from(0),
                        Some(Special::Quantity) => Value::from("0"),
                        Some(Special::Duration) => Value::from("0s"),
                    };
                    into.insert(field.name.clone(), zero);
                }
            }
            None => {}
        }
    }
}

/// A message type that is walked (not one with a JSON form of its own).
fn walked(schema: &Schema, ty: Type) -> Option<usize> {
    match ty {
        Type::Message(target) if schema.messages[target].special.is_none() => Some(target),
        _ => None,
    }
}

fn order_field(schema: &Schema, ty: Type, shape: Shape, value: &mut Value, depth: usize) {
    match (shape, value) {
        (Shape::Single, Value::Object(map)) => match walked(schema, ty) {
            Some(target) => order_message(schema, target, map, depth + 1, false),
            None => sort_plain_map(map, depth + 1),
        },
        (Shape::Repeated, Value::Array(items)) => {
            for item in items {
                match (walked(schema, ty), item) {
                    (Some(target), Value::Object(map)) => {
                        order_message(schema, target, map, depth + 1, false);
                    }
                    (_, other) => sort_plain(other, depth + 1),
                }
            }
        }
        (Shape::Map { value: entry, .. }, Value::Object(map)) => {
            map.sort_keys();
            if let Some(target) = walked(schema, entry) {
                for item in map.values_mut() {
                    if let Value::Object(fields) = item {
                        order_message(schema, target, fields, depth + 1, false);
                    }
                }
            }
        }
        (_, other) => sort_plain(other, depth + 1),
    }
}

/// Sorts every object's keys, as Go writes a `map[string]interface{}`.
fn sort_plain(value: &mut Value, depth: usize) {
    match value {
        Value::Object(map) => sort_plain_map(map, depth),
        Value::Array(items) if depth <= MAX_DEPTH => {
            for item in items {
                sort_plain(item, depth + 1);
            }
        }
        _ => {}
    }
}

fn sort_plain_map(map: &mut Map<String, Value>, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    map.sort_keys();
    for item in map.values_mut() {
        sort_plain(item, depth + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(mut value: Value) -> String {
        if !order(&mut value) {
            sort_unstructured(&mut value);
        }
        serde_json::to_string(&value).expect("JSON")
    }

    #[test]
    fn a_status_is_in_upstreams_order() {
        let status = json!({"apiVersion": "v1", "code": 404, "details": {"kind": "pods", "name": "x"},
            "kind": "Status", "message": "pods \"x\" not found", "metadata": {},
            "reason": "NotFound", "status": "Failure"});
        assert_eq!(
            text(status),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"pods"},"code":404}"#
        );
    }

    #[test]
    fn value_structs_are_always_written_and_fields_keep_go_order() {
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "http", "protocol": "TCP"}]}});
        assert_eq!(
            text(service),
            r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"shop","creationTimestamp":null},"spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":0}],"type":"ClusterIP"},"status":{"loadBalancer":{}}}"#
        );
    }

    #[test]
    fn custom_resources_maps_and_unknown_keys_are_sorted() {
        let widget =
            json!({"kind": "Widget", "apiVersion": "example.com/v1", "spec": {"b": 1, "a": 2}});
        assert_eq!(
            text(widget),
            r#"{"apiVersion":"example.com/v1","kind":"Widget","spec":{"a":2,"b":1}}"#
        );
        let config_map = json!({"kind": "ConfigMap", "apiVersion": "v1", "zzz": true,
            "data": {"b": "1", "a": "2"}, "metadata": {"name": "c", "creationTimestamp": "2026-01-01T00:00:00Z"}});
        assert_eq!(
            text(config_map),
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c","creationTimestamp":"2026-01-01T00:00:00Z"},"data":{"a":"2","b":"1"},"zzz":true}"#
        );
    }

    #[test]
    fn a_list_orders_each_item() {
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "5"},
            "items": [{"data": {"k": "v"}, "metadata": {"name": "a", "creationTimestamp": null}}]});
        assert_eq!(
            text(list),
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","creationTimestamp":null},"data":{"k":"v"}}]}"#
        );
    }
}
