//! Object metadata accessors over JSON objects (`metav1.Object` for untyped data).

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// The value at a path of field names, if every step is an object that has it.
pub fn at<'a, S: AsRef<str>>(obj: &'a Value, path: &[S]) -> Option<&'a Value> {
    path.iter().try_fold(obj, |v, key| v.get(key.as_ref()))
}

/// The string at a path, if it is one.
pub fn str_at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(obj, path).and_then(Value::as_str)
}

/// A mutable reference to the object at `path`, creating empty objects on the way.
/// Returns `None` if a non-object value is in the way.
pub fn object_at_mut<'a, S: AsRef<str>>(
    obj: &'a mut Value,
    path: &[S],
) -> Option<&'a mut Map<String, Value>> {
    let mut current = obj;
    for key in path {
        let map = current.as_object_mut()?;
        current = map
            .entry(key.as_ref().to_string())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    current.as_object_mut()
}

/// Sets the value at a path, creating intermediate objects. No-op if a non-object is in the way.
pub fn set_at<S: AsRef<str>>(obj: &mut Value, path: &[S], value: Value) {
    if let Some((last, parents)) = path.split_last()
        && let Some(parent) = object_at_mut(obj, parents)
    {
        parent.insert(last.as_ref().to_string(), value);
    }
}

/// Removes the value at a path, returning it.
pub fn remove_at(obj: &mut Value, path: &[&str]) -> Option<Value> {
    let (last, parents) = path.split_last()?;
    let mut current = obj;
    for key in parents {
        current = current.get_mut(*key)?;
    }
    current.as_object_mut()?.remove(*last)
}

/// `metadata.name`, or "".
pub fn name(obj: &Value) -> &str {
    str_at(obj, &["metadata", "name"]).unwrap_or("")
}

/// `metadata.namespace`, or "".
pub fn namespace(obj: &Value) -> &str {
    str_at(obj, &["metadata", "namespace"]).unwrap_or("")
}

/// `metadata.uid`, or "".
pub fn uid(obj: &Value) -> &str {
    str_at(obj, &["metadata", "uid"]).unwrap_or("")
}

/// `metadata.resourceVersion`, or "".
pub fn resource_version(obj: &Value) -> &str {
    str_at(obj, &["metadata", "resourceVersion"]).unwrap_or("")
}

/// The object's `metadata` map, created if missing. `None` if the object is not a JSON object.
pub fn metadata_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    object_at_mut(obj, &["metadata"])
}

/// `metadata.labels` as a map (non-string values are skipped; validation reports them).
pub fn labels(obj: &Value) -> BTreeMap<String, String> {
    string_map(at(obj, &["metadata", "labels"]))
}

/// A JSON object of strings as a map.
pub fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// `metadata.finalizers` as strings.
pub fn finalizers(obj: &Value) -> Vec<String> {
    at(obj, &["metadata", "finalizers"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `metadata.deletionTimestamp` is set.
pub fn is_terminating(obj: &Value) -> bool {
    at(obj, &["metadata", "deletionTimestamp"]).is_some_and(|v| !v.is_null())
}

/// The current time as a `metav1.Time` string (second precision, UTC).
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn set_and_remove_create_and_drop_paths() {
        let mut obj = json!({});
        set_at(&mut obj, &["metadata", "labels", "a"], json!("b"));
        assert_eq!(labels(&obj).get("a").map(String::as_str), Some("b"));
        assert_eq!(
            remove_at(&mut obj, &["metadata", "labels", "a"]),
            Some(json!("b"))
        );
        assert!(labels(&obj).is_empty());
        let mut scalar = json!({"spec": 3});
        set_at(&mut scalar, &["spec", "x"], json!(1));
        assert_eq!(scalar, json!({"spec": 3}));
    }
}
