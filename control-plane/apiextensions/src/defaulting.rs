//! Defaulting of custom resources (upstream `pkg/apiserver/schema/defaulting`): applying
//! `default`s (`Default`), dropping nulls that may not be null (`PruneNonNullableNulls...`),
//! pruning default values when a schema is compiled (`PruneDefaults`), and checking that
//! defaults are valid and pruned when a CRD is admitted (`ValidateDefaults`).

use flotilla_api_machinery::field::{FieldError, Path, aggregate};
use serde_json::{Map, Value};

use crate::structural::{Structural, StructuralError};
use crate::validation::validate_custom_resource;
use crate::{objectmeta, pruning};

/// Applies the schema's defaults to `value` (upstream `structuraldefaulting.Default`, preceded
/// by `PruneNonNullableNullsWithoutDefaults` as the decoder runs it).
///
/// Absent fields get their default, top-down, including inside list items and
/// `additionalProperties` values; a `null` where the schema is not nullable is replaced by the
/// default, or removed when there is none.
pub fn apply_defaults(value: &mut Value, schema: &Structural) {
    prune_non_nullable_nulls_without_defaults(value, Some(schema));
    default(value, schema);
}

fn is_non_nullable_null(value: &Value, schema: &Structural) -> bool {
    value.is_null() && !schema.nullable
}

/// Upstream `Default`.
fn default(value: &mut Value, s: &Structural) {
    match value {
        Value::Object(object) => {
            for (key, prop) in &s.properties {
                let Some(default) = &prop.default else {
                    continue;
                };
                let missing = object
                    .get(key)
                    .is_none_or(|v| is_non_nullable_null(v, prop));
                if missing {
                    object.insert(key.clone(), default.clone());
                }
            }
            for (key, child) in object.iter_mut() {
                if let Some(prop) = s.properties.get(key) {
                    default(child, prop);
                } else if let Some(additional) = s.additional_properties_schema() {
                    if is_non_nullable_null(child, additional) {
                        *child = additional.default.clone().unwrap_or(Value::Null);
                    }
                    default(child, additional);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = s.items.as_deref() else {
                return;
            };
            for item in items {
                if is_non_nullable_null(item, item_schema) {
                    *item = item_schema.default.clone().unwrap_or(Value::Null);
                }
                default(item, item_schema);
            }
        }
        _ => {}
    }
}

/// Upstream `PruneNonNullableNullsWithoutDefaults`: removes `null` fields whose schema is
/// neither nullable nor defaulted (defaulted ones are left for [`apply_defaults`]).
pub fn prune_non_nullable_nulls_without_defaults(value: &mut Value, schema: Option<&Structural>) {
    match value {
        Value::Object(object) => object.retain(|key, child| {
            let field_schema = schema.and_then(|s| {
                s.properties
                    .get(key)
                    .or_else(|| s.additional_properties_schema())
            });
            let drop = child.is_null()
                && field_schema.is_some_and(|fs| !fs.nullable && fs.default.is_none());
            if !drop {
                prune_non_nullable_nulls_without_defaults(child, field_schema);
            }
            !drop
        }),
        Value::Array(items) => {
            let item_schema = schema.and_then(|s| s.items.as_deref());
            for item in items {
                prune_non_nullable_nulls_without_defaults(item, item_schema);
            }
        }
        _ => {}
    }
}

/// One step from an object to the value a default applies to (upstream
/// `SurroundingObjectFunc`'s `Child` and `Index`).
#[derive(Debug, Clone)]
enum Step {
    Child(String),
    Index,
}

/// Builds the object surrounding `focus` at `steps` (`[{"foo": x}]` for `Index, Child(foo)`).
fn surround(focus: Value, steps: &[Step]) -> Value {
    steps.iter().rev().fold(focus, |inner, step| match step {
        Step::Child(key) => {
            let mut object = Map::new();
            object.insert(key.clone(), inner);
            Value::Object(object)
        }
        Step::Index => Value::Array(vec![inner]),
    })
}

/// The value at `steps` in `root` again, after `root` may have been pruned.
fn extract(root: Value, steps: &[Step]) -> Result<Option<Value>, String> {
    let mut current = root;
    let mut trail = String::new();
    for step in steps {
        current = match (step, current) {
            (Step::Child(key), Value::Object(mut object)) => {
                trail.push_str(&format!(".{key}"));
                match object.remove(key) {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
            (Step::Child(key), _) => return Err(format!("{trail}.{key} must be of object type")),
            (Step::Index, Value::Array(items)) => {
                trail.push_str("[]");
                match items.into_iter().next() {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
            (Step::Index, _) => return Err(format!("{trail}[] must be of array type")),
        };
    }
    Ok(Some(current))
}

/// Upstream `PruneDefaults`: prunes every default as if it were set in a whole object, so that
/// defaulting never adds fields pruning would remove.
pub(crate) fn prune_defaults(schema: &mut Structural) -> Result<(), StructuralError> {
    let root = schema.clone();
    let mut steps = Vec::new();
    prune_defaults_at(schema, &root, &mut steps)
}

fn prune_defaults_at(
    s: &mut Structural,
    root: &Structural,
    steps: &mut Vec<Step>,
) -> Result<(), StructuralError> {
    let fail = |reason: String| StructuralError::PruneDefaults { reason };
    if let Some(default) = s.default.take() {
        let mut object = surround(default, steps);
        if !object.is_object() {
            return Err(fail(
                "object root default value must be of object type".into(),
            ));
        }
        objectmeta::coerce(&Path::none(), &mut object, root, true, true)
            .map_err(|e| fail(e.to_string()))?;
        pruning::prune_with_options(&mut object, Some(root), true, false);
        s.default = extract(object, steps).map_err(fail)?;
    }
    if let Some(additional) = s.additional_properties.as_mut().and_then(|a| match a {
        crate::structural::AdditionalProperties::Schema(schema) => Some(schema),
        crate::structural::AdditionalProperties::Bool(_) => None,
    }) {
        steps.push(Step::Child("*".into()));
        prune_defaults_at(additional, root, steps)?;
        steps.pop();
    }
    if let Some(items) = s.items.as_deref_mut() {
        steps.push(Step::Index);
        prune_defaults_at(items, root, steps)?;
        steps.pop();
    }
    for (key, prop) in s.properties.iter_mut() {
        steps.push(Step::Child(key.clone()));
        prune_defaults_at(prop, root, steps)?;
        steps.pop();
    }
    Ok(())
}

const META_FIELDS: [&str; 3] = ["metadata", "apiVersion", "kind"];

/// The resource a default is checked inside: the schema of its root (the CRD root or the
/// nearest embedded resource) and the steps from there.
struct Surrounding<'a> {
    root: &'a Structural,
    steps: Vec<Step>,
}

impl Surrounding<'_> {
    /// The object around `focus`, with the TypeMeta upstream puts on it for validation.
    fn object(&self, focus: Value) -> Value {
        let mut object = surround(focus, &self.steps);
        if let Value::Object(map) = &mut object {
            map.entry("kind")
                .or_insert_with(|| Value::String("Validation".into()));
            map.entry("apiVersion")
                .or_insert_with(|| Value::String("validation/v1".into()));
        }
        object
    }
}

/// Upstream `ValidateDefaults` with `isResourceRoot` and `requirePrunedDefaults`: every
/// default must pass validation and pruning must leave it unchanged. Defaults below
/// `additionalProperties` are not checked, like upstream.
pub(crate) fn validate_defaults(path: &Path, schema: &Structural) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let surrounding = Surrounding {
        root: schema,
        steps: Vec::new(),
    };
    validate_node(path, schema, true, surrounding, false, &mut errors);
    errors
}

fn validate_node<'a>(
    path: &Path,
    s: &'a Structural,
    is_root: bool,
    mut surrounding: Surrounding<'a>,
    mut inside_meta: bool,
    errors: &mut Vec<FieldError>,
) {
    let embedded = is_root || s.extensions.embedded_resource;
    if embedded {
        inside_meta = false;
        surrounding = Surrounding {
            root: s,
            steps: Vec::new(),
        };
    }
    if let Some(default) = &s.default {
        let default_path = path.child("default");
        if inside_meta {
            let mut object = surrounding.object(default.clone());
            let meta = |detail: String| {
                FieldError::invalid(
                    &default_path,
                    default.clone(),
                    format!("must result in valid metadata: {detail}"),
                )
            };
            if let Err(e) =
                objectmeta::coerce(&Path::none(), &mut object, surrounding.root, true, false)
            {
                errors.push(meta(e.to_string()));
            } else {
                let meta_errors =
                    objectmeta::validate(&Path::none(), &object, surrounding.root, true);
                if !meta_errors.is_empty() {
                    errors.push(meta(aggregate(&meta_errors)));
                } else {
                    errors.extend(validate_custom_resource(&default_path, default, s));
                }
            }
        } else {
            let mut pruned = default.clone();
            pruning::prune_with_options(&mut pruned, Some(s), embedded, false);
            if &pruned != default {
                errors.push(FieldError::invalid(
                    &default_path,
                    default.clone(),
                    "must not have unknown fields",
                ));
            }
            let mut coerced = default.clone();
            if let Err(e) = objectmeta::coerce(&default_path, &mut coerced, s, embedded, false) {
                errors.push(*e);
            } else {
                let meta_errors = objectmeta::validate(&default_path, default, s, embedded);
                if !meta_errors.is_empty() {
                    errors.extend(meta_errors);
                } else {
                    errors.extend(validate_custom_resource(&default_path, default, s));
                }
            }
        }
    }
    if let Some(items) = s.items.as_deref() {
        let mut steps = surrounding.steps.clone();
        steps.push(Step::Index);
        let inner = Surrounding {
            root: surrounding.root,
            steps,
        };
        validate_node(
            &path.child("items"),
            items,
            false,
            inner,
            inside_meta,
            errors,
        );
    }
    for (key, prop) in &s.properties {
        let mut steps = surrounding.steps.clone();
        steps.push(Step::Child(key.clone()));
        let inner = Surrounding {
            root: surrounding.root,
            steps,
        };
        let prop_inside_meta = inside_meta || (embedded && META_FIELDS.contains(&key.as_str()));
        let prop_path = path.child("properties").key(key);
        validate_node(&prop_path, prop, false, inner, prop_inside_meta, errors);
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

    fn defaulted() -> Structural {
        schema(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "replicas": {"type": "integer", "default": 1},
                        "mode": {"type": "string", "default": "auto"},
                        "note": {"type": "string", "nullable": true, "default": "x"},
                        "plain": {"type": "string"},
                        "ports": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"protocol": {"type": "string", "default": "TCP"}}}},
                        "byName": {"type": "object", "additionalProperties": {
                            "type": "object", "default": {"weight": 1},
                            "properties": {"weight": {"type": "integer", "default": 5}}}}
                    }
                }
            }
        }))
    }

    #[test]
    fn applies_defaults() {
        let cases = [
            (
                json!({}),
                json!({"spec": {"replicas": 1, "mode": "auto", "note": "x"}}),
            ),
            (
                json!({"spec": {"replicas": 3, "mode": null, "note": null, "plain": null}}),
                json!({"spec": {"replicas": 3, "mode": "auto", "note": null}}),
            ),
            (
                json!({"spec": {"ports": [{}, {"protocol": "UDP"}],
                                "byName": {"a": {}, "b": null}}}),
                json!({"spec": {"ports": [{"protocol": "TCP"}, {"protocol": "UDP"}],
                                "byName": {"a": {"weight": 5}, "b": {"weight": 1}},
                                "replicas": 1, "mode": "auto", "note": "x"}}),
            ),
        ];
        for (mut value, want) in cases {
            apply_defaults(&mut value, &defaulted());
            assert_eq!(value, want);
        }
    }

    #[test]
    fn prunes_defaults_against_the_whole_schema() {
        let mut s = schema(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "default": {"a": 1, "unknown": 2},
                    "properties": {"a": {"type": "integer"}}
                }
            }
        }));
        prune_defaults(&mut s).expect("prunes");
        assert_eq!(s.properties["spec"].default, Some(json!({"a": 1})));
    }

    #[test]
    fn validates_defaults() {
        let s = schema(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer", "default": "one"},
                        "obj": {"type": "object", "default": {"x": 1},
                                "properties": {"y": {"type": "integer"}}},
                        "name": {"type": "string", "maxLength": 3, "default": "toolong"},
                        "ok": {"type": "string", "enum": ["a"], "default": "a"}
                    }
                }
            }
        }));
        let errors = validate_defaults(&Path::new("schema"), &s);
        let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            rendered,
            vec![
                "schema.properties[spec].properties[name].default: Too long: may not be more than 3 bytes",
                "schema.properties[spec].properties[obj].default: Invalid value: {\"x\":1}: must not have unknown fields",
                "schema.properties[spec].properties[replicas].default: Invalid value: \"string\":  in body must be of type integer: \"string\"",
            ]
        );
    }
}
