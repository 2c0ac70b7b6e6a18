//! Custom resource versions' schemas, compiled once and shared by content: a thousand tenants
//! that install the same operator's definitions hold one copy of each schema (kcp shares
//! APIExport schemas for the same reason; upstream keeps one per apiserver and definition).

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use flotilla_api_machinery::field::FieldError;
use flotilla_apiextensions::CompiledSchema;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::Value;

/// One version's `openAPIV3Schema`, ready to default, prune and validate objects.
pub struct VersionSchema {
    source: Value,
    /// The compiled schema, or why it could not be compiled (a definition stored before a
    /// check it fails existed): its objects are then refused rather than let through.
    compiled: Result<CompiledSchema, String>,
    /// The schema's `x-kubernetes-validations` rules, compiled.
    rules: Option<flotilla_cel::Validator>,
}

impl VersionSchema {
    fn compile(source: &Value) -> VersionSchema {
        let props = serde_json::from_value::<JSONSchemaProps>(source.clone());
        let rules = props
            .as_ref()
            .ok()
            .map(flotilla_cel::Validator::new)
            .filter(flotilla_cel::Validator::has_rules);
        let compiled = props
            .map_err(|err| err.to_string())
            .and_then(|props| CompiledSchema::new(&props).map_err(|err| err.to_string()));
        VersionSchema {
            source: source.clone(),
            compiled,
            rules,
        }
    }

    /// The schema as the definition wrote it (the OpenAPI documents publish it).
    pub fn openapi(&self) -> &Value {
        &self.source
    }

    /// Fills in the schema's defaults.
    pub fn apply_defaults(&self, obj: &mut Value) {
        if let Ok(schema) = &self.compiled {
            schema.apply_defaults(obj);
        }
    }

    /// Drops the fields the schema does not have (at the object's root `apiVersion`, `kind`
    /// and `metadata` stay, the last pruned to ObjectMeta's fields).
    pub fn prune(&self, obj: &mut Value) {
        if let Ok(schema) = &self.compiled {
            schema.prune(obj, true);
        }
    }

    /// The schema's and its `x-kubernetes-validations` rules' findings on `obj` (with `old`,
    /// the object before an update, for transition rules).
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        match &self.compiled {
            Ok(schema) => {
                let mut errors = schema.validate(obj);
                // Rules run on values the schema accepts (upstream skips CEL when the
                // OpenAPI validation already failed, so rules see the types they expect).
                if errors.is_empty()
                    && let Some(rules) = &self.rules
                {
                    errors.extend(rules.validate(obj, old));
                }
                errors
            }
            Err(why) => vec![FieldError::invalid(
                &flotilla_api_machinery::field::Path::none(),
                Value::Null,
                format!("the definition's schema cannot be used: {why}"),
            )],
        }
    }
}

/// The compiled schemas in use, by content.
#[derive(Default)]
pub struct Interner {
    schemas: crate::interning::Shared<VersionSchema>,
}

impl Interner {
    /// The compiled form of `source`: the one already in use when any tenant has the same
    /// schema, else a new one.
    pub fn intern(&self, source: &Value) -> Arc<VersionSchema> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        hash_value(source, &mut hasher);
        self.schemas.get_or_make(
            hasher.finish(),
            |schema| schema.source == *source,
            || VersionSchema::compile(source),
        )
    }

    /// How many distinct schemas are alive.
    pub fn live(&self) -> usize {
        self.schemas.live()
    }
}

/// Hashes a JSON value by content (object keys in their order, which serde keeps).
fn hash_value(value: &Value, hasher: &mut impl Hasher) {
    match value {
        Value::Null => 0u8.hash(hasher),
        Value::Bool(b) => (1u8, b).hash(hasher),
        Value::Number(n) => (2u8, n.to_string()).hash(hasher),
        Value::String(s) => (3u8, s).hash(hasher),
        Value::Array(items) => {
            (4u8, items.len()).hash(hasher);
            items.iter().for_each(|item| hash_value(item, hasher));
        }
        Value::Object(map) => {
            (5u8, map.len()).hash(hasher);
            for (key, item) in map {
                key.hash(hasher);
                hash_value(item, hasher);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn identical_schemas_are_one_and_go_when_unused() {
        let interner = Interner::default();
        let a =
            interner.intern(&json!({"type": "object", "properties": {"x": {"type": "string"}}}));
        let b =
            interner.intern(&json!({"type": "object", "properties": {"x": {"type": "string"}}}));
        let c = interner.intern(&json!({"type": "object"}));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(interner.live(), 2);
        drop((a, b));
        assert_eq!(interner.live(), 1);
    }
}
