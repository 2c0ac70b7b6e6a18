//! Kubernetes' use of the Common Expression Language (upstream `k8s.io/apiserver/pkg/cel` and
//! `apiextensions-apiserver/pkg/apiserver/schema/cel`): `x-kubernetes-validations` rules compiled
//! once per schema and evaluated against custom resources.
//!
//! [`Validator::compile`] is what a CRD write runs: every rule is compiled, type-checked against
//! the schema and its cost estimated, and problems come back as the field errors upstream
//! reports. [`Validator::validate`] is what a custom resource write runs.
//!
//! [`admission`] is CEL in admission: webhook `matchConditions` and ValidatingAdmissionPolicy.

pub mod admission;
mod check;
mod compilation;
mod comprehensions;
mod cost;
mod env;
pub mod escaping;
mod fieldpath;
mod library;
pub mod limits;
mod schema;
mod types;
mod validation;
mod values;

use flotilla_api_machinery::field::{FieldError, Path};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::Value;

use crate::compilation::{Node, Place, Report};
use crate::schema::{Structural, schema_decl_type};
pub use crate::validation::Outcome;
use crate::validation::{Ratchet, Run};

/// The compiled `x-kubernetes-validations` of one CRD version's schema (upstream `Validator`).
pub struct Validator {
    root: Option<Node>,
}

impl Validator {
    /// Compiles the rules of a stored schema (upstream `NewValidator`). Rules that do not
    /// compile are kept and reported when they would run, as upstream does for a CRD that was
    /// accepted under other rules.
    pub fn new(schema: &JSONSchemaProps) -> Validator {
        Validator::build(schema, None).0
    }

    /// Compiles the rules of a schema being written, with the checks a CRD write runs, errors
    /// at `spec.validation.openAPIV3Schema...` paths.
    pub fn compile(schema: &JSONSchemaProps) -> Result<Validator, Vec<FieldError>> {
        Validator::compile_at(
            schema,
            &Path::new("spec")
                .child("validation")
                .child("openAPIV3Schema"),
        )
    }

    /// [`Validator::compile`] for a schema at `path`, e.g.
    /// `spec.versions[0].schema.openAPIV3Schema`.
    pub fn compile_at(schema: &JSONSchemaProps, path: &Path) -> Result<Validator, Vec<FieldError>> {
        let (validator, errors) = Validator::build(schema, Some(path));
        if errors.is_empty() {
            Ok(validator)
        } else {
            Err(errors)
        }
    }

    fn build(schema: &JSONSchemaProps, path: Option<&Path>) -> (Validator, Vec<FieldError>) {
        let structural = Structural::from_props(schema);
        let mut report = Report::new();
        if !structural.has_validations() {
            return (Validator { root: None }, Vec::new());
        }
        let decl = schema_decl_type(&structural, true);
        let place = path.map(|p| Place {
            path: p.clone(),
            cardinality: Some(1),
            uncorrelatable: None,
        });
        let root = compilation::build(&structural, &structural, true, decl, place, &mut report);
        if let Some(path) = path {
            report.finish(path);
        }
        (Validator { root }, report.errors)
    }

    /// Whether the schema has any rule.
    pub fn has_rules(&self) -> bool {
        self.root.is_some()
    }

    /// Validates `new` (the whole object), with `old` on update, under upstream's per-request
    /// budget; errors at paths from the object's root (`spec.replicas`, or `<nil>` for a rule
    /// on the root itself). Failures that ratcheting turns into warnings are left out: see
    /// [`Validator::validate_with`].
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
        self.validate_with(&Path::none(), new, old, limits::RUNTIME_CEL_COST_BUDGET)
            .errors
    }

    /// Validates `new` found at `path` with a cost `budget`, returning the errors, the
    /// warnings of ratcheted failures and what is left of the budget.
    pub fn validate_with(
        &self,
        path: &Path,
        new: &Value,
        old: Option<&Value>,
        budget: i64,
    ) -> Outcome {
        let mut run = Run {
            errors: Vec::new(),
            warnings: Vec::new(),
            budget,
        };
        if let Some(root) = &self.root {
            validation::validate_node(root, path, new, old, Ratchet::root(new, old), &mut run);
        }
        Outcome {
            errors: run.errors,
            warnings: run.warnings,
            remaining_budget: run.budget,
        }
    }
}

#[cfg(test)]
mod tests;
