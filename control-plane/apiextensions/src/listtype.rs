//! Uniqueness of `x-kubernetes-list-type: set` items and of `x-kubernetes-list-type: map`
//! keys (upstream `pkg/apiserver/schema/listtype`).

use std::collections::HashMap;

use flotilla_api_machinery::field::{FieldError, Path};
use serde_json::{Map, Value};

use crate::gofmt::go_json;
use crate::structural::Structural;

/// Upstream `ValidateListSetsAndMaps`: every set item and every map key appears once.
pub(crate) fn validate_list_sets_and_maps(
    path: &Path,
    schema: &Structural,
    object: &Map<String, Value>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_object(path, schema, object, &mut errors);
    errors
}

fn validate_object(
    path: &Path,
    schema: &Structural,
    object: &Map<String, Value>,
    errors: &mut Vec<FieldError>,
) {
    if let Some(additional) = schema.additional_properties_schema() {
        for (key, value) in object {
            validate_value(&path.key(key), additional, value, errors);
        }
    }
    for (key, value) in object {
        if let Some(prop) = schema.properties.get(key) {
            validate_value(&path.child(key), prop, value, errors);
        }
    }
}

fn validate_value(path: &Path, schema: &Structural, value: &Value, errors: &mut Vec<FieldError>) {
    match value {
        Value::Array(items) => validate_array(path, schema, items, errors),
        Value::Object(object) => validate_object(path, schema, object, errors),
        _ => {}
    }
}

fn validate_array(path: &Path, schema: &Structural, items: &[Value], errors: &mut Vec<FieldError>) {
    match schema.extensions.list_type.as_deref() {
        Some("set") => {
            let keys: Vec<Key> = items.iter().map(|v| Key::Value(v.clone())).collect();
            for i in non_unique(&keys) {
                errors.push(FieldError::duplicate(&path.index(i), items[i].clone()));
            }
        }
        Some("map") => errors.extend(validate_list_map(path, schema, items)),
        _ => {}
    }
    if let Some(item_schema) = schema.items.as_deref() {
        for (i, item) in items.iter().enumerate() {
            validate_value(&path.index(i), item_schema, item, errors);
        }
    }
}

/// A list-map key, or the marker for an item that does not set it (distinct from `null`).
#[derive(Clone)]
enum Key {
    Unspecified,
    Value(Value),
}

/// The identity upstream compares by: scalars by Go value (so `1` and `1.0` differ), compound
/// values by their JSON encoding.
fn identity(key: &Key) -> String {
    match key {
        Key::Unspecified => "u".to_string(),
        Key::Value(v @ (Value::Object(_) | Value::Array(_))) => format!("c{}", go_json(v)),
        Key::Value(Value::Number(n)) if n.is_f64() => format!("f{n}"),
        Key::Value(v) => format!("s{v}"),
    }
}

/// Upstream `validateListSet`: the index of the second occurrence of every repeated value.
fn non_unique(keys: &[Key]) -> Vec<usize> {
    if keys.len() <= 1 {
        return Vec::new();
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut repeated = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let times = seen.entry(identity(key)).or_insert(0);
        *times += 1;
        if *times == 2 {
            repeated.push(i);
        }
    }
    repeated
}

fn validate_list_map(path: &Path, schema: &Structural, items: &[Value]) -> Vec<FieldError> {
    for (i, item) in items.iter().enumerate() {
        if !item.is_null() && !item.is_object() {
            return vec![FieldError::invalid(
                &path.index(i),
                item.clone(),
                "must be an object for an array of list-type map",
            )];
        }
    }
    if items.len() <= 1 {
        return Vec::new();
    }
    let key_fields = &schema.extensions.list_map_keys;
    if let [key_field] = key_fields.as_slice() {
        let keys: Vec<Key> = items
            .iter()
            .map(|item| match item.get(key_field) {
                Some(v) => Key::Value(v.clone()),
                None => Key::Unspecified,
            })
            .collect();
        return non_unique(&keys)
            .into_iter()
            .map(|i| {
                let mut shown = Map::new();
                if let Key::Value(v) = &keys[i] {
                    shown.insert(key_field.clone(), v.clone());
                }
                FieldError::duplicate(&path.index(i), Value::Object(shown))
            })
            .collect();
    }
    let keys: Vec<Key> = items
        .iter()
        .map(|item| {
            let mut key = Map::new();
            for field in key_fields {
                if let Some(v) = item.get(field) {
                    key.insert(field.clone(), v.clone());
                }
            }
            Key::Value(Value::Object(key))
        })
        .collect();
    non_unique(&keys)
        .into_iter()
        .filter_map(|i| match &keys[i] {
            Key::Value(v) => Some(FieldError::duplicate(&path.index(i), v.clone())),
            Key::Unspecified => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_machinery::field::aggregate;
    use serde_json::json;

    fn schema() -> Structural {
        let props: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps =
            serde_json::from_value(json!({
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "x-kubernetes-list-type": "set",
                             "items": {"type": "string"}},
                    "ports": {"type": "array", "x-kubernetes-list-type": "map",
                              "x-kubernetes-list-map-keys": ["name"],
                              "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
                    "routes": {"type": "array", "x-kubernetes-list-type": "map",
                               "x-kubernetes-list-map-keys": ["host", "port"],
                               "items": {"type": "object"}},
                    "byName": {"type": "object", "additionalProperties": {
                        "type": "array", "x-kubernetes-list-type": "set", "items": {"type": "integer"}}}
                }
            }))
            .expect("schema");
        Structural::new(&props).expect("structural")
    }

    #[test]
    fn finds_duplicates() {
        let cases = [
            (json!({"tags": ["a", "b"]}), ""),
            (
                json!({"tags": ["a", "b", "a", "a"]}),
                r#"tags[2]: Duplicate value: "a""#,
            ),
            (
                json!({"byName": {"x": [1, 1.0, 1]}}),
                "byName[x][2]: Duplicate value: 1",
            ),
            (
                json!({"ports": [{"name": "a"}, {"name": "b"}, {"name": "a"}]}),
                r#"ports[2]: Duplicate value: {"name":"a"}"#,
            ),
            (json!({"ports": [{}, {}]}), "ports[1]: Duplicate value: {}"),
            (
                json!({"ports": [{"name": "a"}, 3]}),
                "ports[1]: Invalid value: 3: must be an object for an array of list-type map",
            ),
            (
                json!({"routes": [{"host": "h", "port": 1}, {"port": 1, "host": "h"}, {"host": "h"}]}),
                r#"routes[1]: Duplicate value: {"host":"h","port":1}"#,
            ),
        ];
        for (value, want) in cases {
            let Value::Object(object) = &value else {
                unreachable!()
            };
            let errors = validate_list_sets_and_maps(&Path::none(), &schema(), object);
            assert_eq!(aggregate(&errors), want, "{value}");
        }
    }
}
