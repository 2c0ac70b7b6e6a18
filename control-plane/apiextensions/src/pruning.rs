//! Pruning of fields a structural schema does not specify (upstream
//! `pkg/apiserver/schema/pruning`), together with the ObjectMeta coercion the custom resource
//! decoder runs next to it, so that the caller gets every unknown field path for
//! `fieldValidation=Strict/Warn` (`unknown field "spec.foo"`).

use flotilla_api_machinery::field::Path;
use serde_json::{Map, Value};

use crate::objectmeta;
use crate::structural::Structural;

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Removes from `value` every field `schema` does not specify and returns the removed paths.
///
/// This is what the custom resource decoder does (upstream `unstructuredSchemaCoercer.apply`):
/// with `is_resource_root`, `apiVersion`, `kind` and `metadata` are kept and the metadata is
/// reduced to ObjectMeta's fields (`metadata.foo`); values under
/// `x-kubernetes-preserve-unknown-fields` are kept (but pruned again below nested
/// `properties`); every `x-kubernetes-embedded-resource` keeps its TypeMeta and has its
/// metadata reduced to ObjectMeta. The paths are upstream's: ObjectMeta's unknown fields
/// first, then the sorted pruned paths (`spec.foo`, `spec.list[0].bar`), then the sorted
/// unknown fields of embedded metadata. Malformed metadata is left for validation to report.
pub fn prune(value: &mut Value, schema: &Structural, is_resource_root: bool) -> Vec<String> {
    let mut unknown = Vec::new();
    if is_resource_root
        && let Value::Object(object) = value
        && let Ok(paths) = objectmeta::coerce_metadata(object, &Path::none(), false)
    {
        unknown.extend(paths);
    }
    unknown.extend(prune_with_options(
        value,
        Some(schema),
        is_resource_root,
        true,
    ));
    if let Ok(paths) = objectmeta::coerce(&Path::none(), value, schema, false, false) {
        unknown.extend(paths);
    }
    unknown
}

/// Upstream `pruning.PruneWithOptions`: structural pruning only. `schema` may be absent for the
/// resource root (everything but TypeMeta and ObjectMeta is pruned). Returns the sorted pruned
/// paths when `track` is set.
pub(crate) fn prune_with_options(
    value: &mut Value,
    schema: Option<&Structural>,
    is_resource_root: bool,
    track: bool,
) -> Vec<String> {
    let empty = Structural::default();
    let schema = match schema {
        None if is_resource_root => Some(&empty),
        other => other,
    };
    let mut pruner = Pruner {
        path: String::new(),
        unknown: Vec::new(),
        track,
    };
    pruner.prune(value, schema, is_resource_root);
    pruner.unknown.sort();
    pruner.unknown
}

struct Pruner {
    /// The dotted path of the value being pruned, as upstream's `ParentPath` joins it.
    path: String,
    unknown: Vec<String>,
    track: bool,
}

impl Pruner {
    fn with_key<T>(&mut self, key: &str, f: impl FnOnce(&mut Self) -> T) -> T {
        let len = self.path.len();
        if self.track {
            if !self.path.is_empty() {
                self.path.push('.');
            }
            self.path.push_str(key);
        }
        let result = f(self);
        self.path.truncate(len);
        result
    }

    fn with_index(&mut self, index: usize, f: impl FnOnce(&mut Self)) {
        let len = self.path.len();
        if self.track {
            self.path.push_str(&format!("[{index}]"));
        }
        f(self);
        self.path.truncate(len);
    }

    fn record(&mut self, key: &str) {
        if self.track {
            self.with_key(key, |p| {
                let path = p.path.clone();
                p.unknown.push(path);
            });
        }
    }

    /// `embedded` marks the resource root, which upstream treats as an embedded resource.
    fn prune(&mut self, value: &mut Value, schema: Option<&Structural>, embedded: bool) {
        if let Some(s) = schema
            && s.extensions.preserve_unknown_fields
        {
            self.skip_prune(value, s, embedded);
            return;
        }
        match value {
            Value::Object(object) => {
                let Some(s) = schema else {
                    for key in object.keys().cloned().collect::<Vec<_>>() {
                        self.record(&key);
                    }
                    object.clear();
                    return;
                };
                let embedded = embedded || s.extensions.embedded_resource;
                self.prune_object(object, s, embedded);
            }
            Value::Array(items) => {
                let item_schema = schema.and_then(|s| s.items.as_deref());
                for (i, item) in items.iter_mut().enumerate() {
                    self.with_index(i, |p| p.prune(item, item_schema, false));
                }
            }
            _ => {}
        }
    }

    fn prune_object(&mut self, object: &mut Map<String, Value>, s: &Structural, embedded: bool) {
        object.retain(|key, child| {
            if embedded && META_FIELDS.contains(&key.as_str()) {
                return true;
            }
            if let Some(prop) = s.properties.get(key) {
                self.with_key(key, |p| p.prune(child, Some(prop), false));
                true
            } else if let Some(additional) = &s.additional_properties {
                self.with_key(key, |p| p.prune(child, additional.schema(), false));
                true
            } else {
                // Meta fields at the root are never reported: upstream keeps them elsewhere.
                if !META_FIELDS.contains(&key.as_str()) || !self.path.is_empty() {
                    self.record(key);
                }
                false
            }
        });
    }

    /// Upstream `skipPrune`: under `x-kubernetes-preserve-unknown-fields` unknown fields stay,
    /// but specified ones are pruned normally.
    fn skip_prune(&mut self, value: &mut Value, s: &Structural, embedded: bool) {
        match value {
            Value::Object(object) => {
                let embedded = embedded || s.extensions.embedded_resource;
                for (key, child) in object.iter_mut() {
                    if embedded && META_FIELDS.contains(&key.as_str()) {
                        continue;
                    }
                    if let Some(prop) = s.properties.get(key) {
                        self.with_key(key, |p| p.prune(child, Some(prop), false));
                    } else if let Some(additional) = &s.additional_properties {
                        self.with_key(key, |p| p.prune(child, additional.schema(), false));
                    }
                }
            }
            Value::Array(items) => {
                if let Some(item_schema) = s.items.as_deref() {
                    for (i, item) in items.iter_mut().enumerate() {
                        self.with_index(i, |p| p.skip_prune(item, item_schema, false));
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    use serde_json::json;

    fn schema(value: Value) -> Structural {
        let props: JSONSchemaProps = serde_json::from_value(value).expect("schema");
        Structural::new(&props).expect("structural")
    }

    fn crd_schema() -> Structural {
        schema(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "items": {"type": "array", "items": {
                            "type": "object", "properties": {"a": {"type": "string"}}}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "closed": {"type": "object", "additionalProperties": false},
                        "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                "properties": {"typed": {"type": "object",
                                    "properties": {"x": {"type": "string"}}}}},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                     "x-kubernetes-preserve-unknown-fields": true}
                    }
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        }))
    }

    #[test]
    fn prunes_unknown_fields() {
        let mut value = json!({
            "apiVersion": "example.com/v1",
            "kind": "Thing",
            "metadata": {"name": "a", "bogus": true},
            "spec": {
                "name": "n",
                "extra": 1,
                "items": [{"a": "x", "b": "y"}],
                "labels": {"k": "v"},
                "closed": {"k": {"deep": 1}},
                "raw": {"anything": {"goes": 1}, "typed": {"x": "1", "y": "2"}},
                "template": {"apiVersion": "v1", "kind": "Pod", "spec": {"kept": true},
                             "metadata": {"name": "t", "junk": 1}}
            },
            "top": 1
        });
        let unknown = prune(&mut value, &crd_schema(), true);
        assert_eq!(
            unknown,
            vec![
                "metadata.bogus",
                "spec.closed.k.deep",
                "spec.extra",
                "spec.items[0].b",
                "spec.raw.typed.y",
                "top",
                "spec.template.metadata.junk",
            ]
        );
        assert_eq!(
            value,
            json!({
                "apiVersion": "example.com/v1",
                "kind": "Thing",
                "metadata": {"name": "a"},
                "spec": {
                    "name": "n",
                    "items": [{"a": "x"}],
                    "labels": {"k": "v"},
                    "closed": {"k": {}},
                    "raw": {"anything": {"goes": 1}, "typed": {"x": "1"}},
                    "template": {"apiVersion": "v1", "kind": "Pod", "spec": {"kept": true},
                                 "metadata": {"name": "t"}}
                }
            })
        );
    }

    #[test]
    fn prunes_without_schema_at_the_root() {
        let mut value = json!({"apiVersion": "v1", "kind": "X", "metadata": {}, "spec": {"a": 1}});
        let unknown = prune_with_options(&mut value, None, true, true);
        assert_eq!(unknown, vec!["spec"]);
        assert_eq!(
            value,
            json!({"apiVersion": "v1", "kind": "X", "metadata": {}})
        );
    }

    #[test]
    fn meta_fields_below_the_root_are_pruned() {
        let s = schema(json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {}}}}));
        let mut value = json!({"spec": {"metadata": {}, "kind": "x"}});
        let unknown = prune(&mut value, &s, true);
        assert_eq!(unknown, vec!["spec.kind", "spec.metadata"]);
    }
}
