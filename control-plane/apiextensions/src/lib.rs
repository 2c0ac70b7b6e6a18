//! Sans-IO machinery of `apiextensions.k8s.io` (upstream `k8s.io/apiextensions-apiserver`):
//! structural schemas and what they do to a custom resource — validation, pruning of unknown
//! fields and defaulting — as pure functions over `serde_json::Value`.
//!
//! A CRD version's `openAPIV3Schema` is first checked with [`validate_structural`] when the
//! CRD is written, then compiled once into a [`CompiledSchema`] that requests share. For each
//! custom resource the apiserver runs, in upstream's order: [`prune`] while decoding (its
//! paths answer `fieldValidation=Strict/Warn`), [`apply_defaults`], then [`validate`].

mod defaulting;
mod gofmt;
mod goregex;
mod listtype;
mod objectmeta;
mod pruning;
mod structural;
mod validation;

use std::hash::{Hash, Hasher};

use flotilla_api_machinery::field::FieldError;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::Value;

pub use defaulting::{apply_defaults, prune_non_nullable_nulls_without_defaults};
pub use pruning::prune;
pub use structural::{
    AdditionalProperties, Extensions, Pattern, Structural, StructuralError, ValueValidation,
    validate_structural,
};
pub use validation::{validate, validate_custom_resource};

/// A CRD version's schema compiled for serving: the [`Structural`] tree (patterns compiled,
/// defaults pruned as upstream's handler prunes them) and the canonical JSON it came from.
///
/// Equality and hashing go by that canonical JSON, so identical schemas from different tenants
/// can be interned and shared behind an `Arc`.
#[derive(Debug, Clone)]
pub struct CompiledSchema {
    structural: Structural,
    source: String,
}

impl CompiledSchema {
    /// Compiles a schema (upstream `NewStructural` followed by `PruneDefaults`). Schemas that
    /// passed [`validate_structural`] compile.
    pub fn new(schema: &JSONSchemaProps) -> Result<CompiledSchema, StructuralError> {
        let mut structural = Structural::new(schema)?;
        defaulting::prune_defaults(&mut structural)?;
        // JSONSchemaProps always serializes; the fallback only guards the impossible case
        // without panicking.
        let value = serde_json::to_value(schema).unwrap_or(Value::Null);
        Ok(CompiledSchema {
            structural,
            source: gofmt::canonical_json(&value),
        })
    }

    /// The compiled tree.
    pub fn structural(&self) -> &Structural {
        &self.structural
    }

    /// The schema as canonical JSON (object keys sorted), which identifies it.
    pub fn source_json(&self) -> &str {
        &self.source
    }

    /// [`prune`] against this schema.
    pub fn prune(&self, value: &mut Value, is_resource_root: bool) -> Vec<String> {
        prune(value, &self.structural, is_resource_root)
    }

    /// [`apply_defaults`] from this schema.
    pub fn apply_defaults(&self, value: &mut Value) {
        apply_defaults(value, &self.structural);
    }

    /// [`validate`] against this schema.
    pub fn validate(&self, value: &Value) -> Vec<FieldError> {
        validate(&self.structural, value)
    }
}

impl PartialEq for CompiledSchema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for CompiledSchema {}

impl Hash for CompiledSchema {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.source.hash(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn props(value: Value) -> JSONSchemaProps {
        serde_json::from_value(value).expect("schema")
    }

    #[test]
    fn compiled_schemas_are_shareable_and_interned_by_source() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<CompiledSchema>();
        assert_send_sync::<Arc<CompiledSchema>>();

        let a = CompiledSchema::new(&props(json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "default": {"b": 1, "a": 2},
                                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
        })))
        .expect("compiles");
        let b = CompiledSchema::new(&props(json!({
            "properties": {"spec": {"properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
                                    "default": {"a": 2, "b": 1}, "type": "object"}},
            "type": "object"
        })))
        .expect("compiles");
        let c = CompiledSchema::new(&props(json!({"type": "object"}))).expect("compiles");
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The regex cache inside is the interior mutability the lint sees; Hash and Eq only
        // read the immutable source text.
        #[allow(clippy::mutable_key_type)]
        let interned: HashSet<Arc<CompiledSchema>> = [a, b, c].into_iter().map(Arc::new).collect();
        assert_eq!(interned.len(), 2);
    }

    #[test]
    fn compiling_prunes_defaults() {
        let schema = CompiledSchema::new(&props(json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "default": {"a": 1, "junk": true},
                                    "properties": {"a": {"type": "integer"}}}}
        })))
        .expect("compiles");
        let mut value = json!({"apiVersion": "x/v1", "kind": "X"});
        schema.apply_defaults(&mut value);
        assert_eq!(value["spec"], json!({"a": 1}));
    }

    #[test]
    fn rejects_uncompilable_schemas() {
        let err = CompiledSchema::new(&props(json!({"type": "object", "default": "x"})))
            .expect_err("a root default must be an object");
        assert_eq!(
            err.to_string(),
            "failed to prune default value: object root default value must be of object type"
        );
    }
}
