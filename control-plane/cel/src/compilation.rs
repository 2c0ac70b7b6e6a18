//! Compiling a schema's `x-kubernetes-validations` once into a tree of programs mirroring the
//! schema (upstream `compilation.go` and `NewValidator`), and the checks a CRD write runs on
//! them (`ValidateCustomResourceDefinitionOpenAPISchema`): compile errors, `fieldPath`,
//! `reason` and `message` shape, `oldSelf` placement, and the estimated cost limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::{ParseErrors, Program};
use flotilla_api_machinery::field::{ErrorType, FieldError, Path, go_quote};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::ValidationRule;
use serde_json::json;

use crate::check::{self, OldSelf, Scope};
use crate::cost::{DeclSizes, cost_error_message};
use crate::escaping;
use crate::fieldpath::valid_field_path;
use crate::limits::{
    MAX_REQUEST_SIZE_BYTES, STATIC_ESTIMATED_COST_LIMIT, STATIC_ESTIMATED_CRD_COST_LIMIT,
};
use crate::schema::{DeclKind, DeclType, Structural, schema_decl_type};
use crate::types::Ty;

/// The reasons a rule may name (`supportedValidationReason`), sorted as upstream lists them.
const SUPPORTED_REASONS: &[&str] = &[
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];

/// One compiled rule.
pub(crate) struct Rule {
    pub source: ValidationRule,
    pub program: Option<Program>,
    /// Why the rule did not compile; reported when the rule would run.
    pub error: Option<String>,
    pub uses_old_self: bool,
    pub message_program: Option<Program>,
    pub message_error: Option<String>,
    pub field_path: Option<String>,
    /// The estimated worst-case cost of one evaluation.
    pub max_cost: u64,
    pub message_max_cost: u64,
}

impl Rule {
    pub fn optional_old_self(&self) -> bool {
        self.source.optional_old_self.unwrap_or(false)
    }

    /// Upstream `ruleErrorString`: the message if there is one, else the rule.
    pub fn error_string(&self) -> String {
        match self.source.message.as_deref().map(str::trim) {
            Some(message) if !message.is_empty() => message.to_string(),
            _ => self.source.rule.trim().to_string(),
        }
    }

    /// Upstream `ruleMessageOrDefault`.
    pub fn message_or_default(&self) -> String {
        match self.source.message.as_deref() {
            Some(message) if !message.is_empty() => message.trim().to_string(),
            _ => format!("failed rule: {}", self.error_string()),
        }
    }

    pub fn error_type(&self) -> ErrorType {
        match self.source.reason.as_deref() {
            Some("FieldValueForbidden") => ErrorType::Forbidden,
            Some("FieldValueRequired") => ErrorType::Required,
            Some("FieldValueDuplicate") => ErrorType::Duplicate,
            _ => ErrorType::Invalid,
        }
    }
}

/// The validator of one schema node and of the nodes below it that carry rules.
pub(crate) struct Node {
    /// The schema's `type`, which upstream reports as the invalid value.
    pub type_: String,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub map_type: Option<String>,
    pub rules: Vec<Rule>,
    /// The declared type of `self`; `None` only when rules cannot see this node.
    pub decl: Option<Arc<DeclType>>,
    /// The schema `self` is converted through (with type and object meta at resource roots).
    pub value_schema: Option<Arc<Structural>>,
    pub properties: BTreeMap<String, Node>,
    pub additional_properties: Option<Box<Node>>,
    pub items: Option<Box<Node>>,
    pub all_of: Vec<Node>,
}

/// What a CRD write reports while the tree is built.
pub(crate) struct Report {
    pub errors: Vec<FieldError>,
    schema_errors: usize,
    total: u64,
    most_expensive: Vec<(Path, u64)>,
}

impl Report {
    pub fn new() -> Report {
        Report {
            errors: Vec::new(),
            schema_errors: 0,
            total: 0,
            most_expensive: Vec::new(),
        }
    }

    fn schema_error(&mut self, error: FieldError) {
        self.schema_errors += 1;
        self.errors.push(error);
    }

    /// `TotalCost.ObserveExpressionCost`: keeps the four costliest rules above 1% of the limit.
    fn observe(&mut self, path: Path, cost: u64) {
        self.total = self.total.saturating_add(cost);
        if cost < STATIC_ESTIMATED_CRD_COST_LIMIT / 100 {
            return;
        }
        self.most_expensive.push((path, cost));
        self.most_expensive.sort_by_key(|b| std::cmp::Reverse(b.1));
        self.most_expensive.truncate(4);
    }

    /// The whole-schema cost errors, once every rule is observed.
    pub fn finish(&mut self, root: &Path) {
        if self.total <= STATIC_ESTIMATED_CRD_COST_LIMIT {
            return;
        }
        for (path, _) in std::mem::take(&mut self.most_expensive) {
            self.errors.push(FieldError::forbidden(
                &path,
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        self.errors.push(FieldError::forbidden(
            root,
            cost_error_message(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                self.total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
}

/// Where a node sits, for the CRD-write checks; `None` below `allOf`, which upstream does not
/// check at write time.
#[derive(Clone)]
pub(crate) struct Place<'p> {
    pub path: Path,
    /// How many times the node can occur (`MaxCardinality`); `None` when unbounded.
    pub cardinality: Option<u64>,
    /// The closest list or map above that cannot correlate old and new values.
    pub uncorrelatable: Option<&'p Path>,
}

/// Builds the validator of `validation`'s rules applied to values of `node` (upstream
/// `validator()`); `None` when no rule is at or below it.
pub(crate) fn build(
    validation: &Structural,
    node: &Structural,
    is_resource_root: bool,
    decl: Option<Arc<DeclType>>,
    place: Option<Place<'_>>,
    report: &mut Report,
) -> Option<Node> {
    if !validation.has_validations() {
        return None;
    }
    let mut properties = BTreeMap::new();
    let mut items = None;
    let uncorrelatable_items = place.as_ref().map(|p| p.uncorrelatable.unwrap_or(&p.path));
    if let (Some(v_items), Some(n_items)) = (&validation.items, &node.items) {
        let elem = decl.as_ref().and_then(|d| match &d.kind {
            DeclKind::List(elem) => Some(elem.clone()),
            _ => None,
        });
        let child_place = place.as_ref().map(|p| Place {
            path: p.path.child("items"),
            cardinality: child_cardinality(p.cardinality, node),
            // only map lists correlate their items
            uncorrelatable: if node.list_type.as_deref() == Some("map") {
                p.uncorrelatable
            } else {
                uncorrelatable_items
            },
        });
        items = build(
            v_items,
            n_items,
            n_items.embedded_resource,
            elem,
            child_place,
            report,
        )
        .map(Box::new);
    }
    for (name, v_property) in validation.properties.iter().flatten() {
        let Some(n_property) = node.properties.as_ref().and_then(|p| p.get(name)) else {
            continue;
        };
        let field_type = match escaping::escape(name) {
            Some(escaped) => decl.as_ref().and_then(|d| match &d.kind {
                DeclKind::Object(fields) => fields.get(&escaped).map(|f| f.ty.clone()),
                _ => None,
            }),
            None => schema_decl_type(n_property, n_property.embedded_resource),
        };
        let child_place = place.as_ref().map(|p| Place {
            path: p.path.child("properties").key(name.clone()),
            cardinality: child_cardinality(p.cardinality, node),
            uncorrelatable: p.uncorrelatable,
        });
        // fields hidden from CEL (unknown types) are not validated at all
        let Some(field_type) = field_type else {
            continue;
        };
        if let Some(child) = build(
            v_property,
            n_property,
            n_property.embedded_resource,
            Some(field_type),
            child_place,
            report,
        ) {
            properties.insert(name.clone(), child);
        }
    }
    let mut additional_properties = None;
    if let (Some(v_values), Some(n_values)) = (
        &validation.additional_properties,
        &node.additional_properties,
    ) {
        let elem = decl.as_ref().and_then(|d| match &d.kind {
            DeclKind::Map(elem) => Some(elem.clone()),
            _ => None,
        });
        let child_place = place.as_ref().map(|p| Place {
            path: p.path.child("additionalProperties"),
            cardinality: child_cardinality(p.cardinality, node),
            uncorrelatable: p.uncorrelatable,
        });
        additional_properties = build(
            v_values,
            n_values,
            n_values.embedded_resource,
            elem,
            child_place,
            report,
        )
        .map(Box::new);
    }
    let all_of = validation
        .all_of
        .iter()
        .filter_map(|branch| build(branch, node, is_resource_root, decl.clone(), None, report))
        .collect();

    let rules = compile_rules(
        &validation.validations,
        node,
        decl.as_ref(),
        place.as_ref(),
        report,
    );
    let value_schema = (!rules.is_empty()).then(|| {
        Arc::new(if is_resource_root {
            node.with_type_and_object_meta()
        } else {
            node.clone()
        })
    });
    Some(Node {
        type_: node.type_.clone(),
        list_type: node.list_type.clone(),
        list_map_keys: node.list_map_keys.clone(),
        map_type: node.map_type.clone(),
        rules,
        decl,
        value_schema,
        properties,
        additional_properties,
        items,
        all_of,
    })
}

/// How often a child of `node` can occur, given how often `node` can (`childContext`).
fn child_cardinality(parent: Option<u64>, node: &Structural) -> Option<u64> {
    let parent = parent?;
    let factor = match node.type_.as_str() {
        "object" if node.additional_properties.is_some() => node.max_properties?.max(0) as u64,
        "array" => node.max_items?.max(0) as u64,
        _ => 1,
    };
    Some(parent.saturating_mul(factor))
}

fn compile_rules(
    rules: &[ValidationRule],
    node: &Structural,
    decl: Option<&Arc<DeclType>>,
    place: Option<&Place<'_>>,
    report: &mut Report,
) -> Vec<Rule> {
    let schema_errors_before = report.schema_errors;
    if let Some(place) = place {
        for (i, rule) in rules.iter().enumerate() {
            check_rule_shape(
                rule,
                node,
                &place.path.child("x-kubernetes-validations").index(i),
                report,
            );
        }
    }
    let compiled: Vec<Rule> = rules.iter().map(|r| compile_rule(r, node, decl)).collect();
    // upstream skips the CEL checks while the schema itself is wrong: their errors would not
    // be actionable yet
    let Some(place) = place else {
        return compiled;
    };
    if report.schema_errors > schema_errors_before {
        return compiled;
    }
    if decl.is_none() && !rules.is_empty() {
        report.errors.push(FieldError {
            error_type: ErrorType::Internal,
            field: place.path.child("x-kubernetes-validations").to_string(),
            bad_value: None,
            detail: "internal error: failed to construct type information for x-kubernetes-validations rules: unable to convert structural schema to CEL declarations".to_string(),
        });
        return compiled;
    }
    for (i, rule) in compiled.iter().enumerate() {
        let rule_path = place.path.child("x-kubernetes-validations").index(i);
        let cardinality = place.cardinality.unwrap_or_else(|| {
            let min_size = decl.map_or(0, |d| d.min_serialized_size);
            (MAX_REQUEST_SIZE_BYTES / (min_size + 1)) as u64
        });
        let cost = if rule.max_cost == 0 {
            0
        } else {
            rule.max_cost.saturating_mul(cardinality)
        };
        if cost > STATIC_ESTIMATED_COST_LIMIT {
            report.errors.push(FieldError::forbidden(
                &rule_path.child("rule"),
                cost_error_message("estimated rule cost", cost, STATIC_ESTIMATED_COST_LIMIT),
            ));
        }
        report.observe(rule_path.child("rule"), cost);
        if let Some(error) = &rule.error {
            report
                .errors
                .push(invalid_rule(&rule_path.child("rule"), &rule.source, error));
        }
        if let Some(error) = &rule.message_error {
            report.errors.push(invalid_rule(
                &rule_path.child("messageExpression"),
                &rule.source,
                error,
            ));
        } else if rule.message_program.is_some() {
            if rule.message_max_cost > STATIC_ESTIMATED_COST_LIMIT {
                report.errors.push(FieldError::forbidden(
                    &rule_path.child("messageExpression"),
                    cost_error_message(
                        "estimated messageExpression cost",
                        rule.message_max_cost,
                        STATIC_ESTIMATED_COST_LIMIT,
                    ),
                ));
            }
            report.observe(rule_path.child("messageExpression"), rule.message_max_cost);
        }
        if rule.uses_old_self {
            if let Some(uncorrelatable) = place.uncorrelatable {
                report.errors.push(FieldError::invalid(
                    &rule_path.child("rule"),
                    rule.source.rule.clone(),
                    format!(
                        "oldSelf cannot be used on the uncorrelatable portion of the schema within {uncorrelatable}"
                    ),
                ));
            }
        } else if let Some(optional) = rule.source.optional_old_self {
            report.errors.push(FieldError::invalid(
                &rule_path.child("optionalOldSelf"),
                json!(optional),
                "may not be set if oldSelf is not used in rule",
            ));
        }
    }
    compiled
}

/// The rule's own shape, checked before any CEL (upstream's schema errors).
fn check_rule_shape(rule: &ValidationRule, node: &Structural, path: &Path, report: &mut Report) {
    let has_newlines = |s: &str| s.contains(['\n', '\r']);
    let trimmed_rule = rule.rule.trim();
    let message = rule.message.as_deref().unwrap_or("");
    let trimmed_message = message.trim();
    if trimmed_rule.is_empty() {
        report.schema_error(FieldError::required(
            &path.child("rule"),
            "rule is not specified",
        ));
    } else if !message.is_empty() && trimmed_message.is_empty() {
        report.schema_error(FieldError::invalid(
            &path.child("message"),
            message,
            "message must be non-empty if specified",
        ));
    } else if has_newlines(trimmed_message) {
        report.schema_error(FieldError::invalid(
            &path.child("message"),
            message,
            "message must not contain line breaks",
        ));
    } else if has_newlines(trimmed_rule) && trimmed_message.is_empty() {
        report.schema_error(FieldError::required(
            &path.child("message"),
            "message must be specified if rule contains line breaks",
        ));
    }
    if let Some(expression) = &rule.message_expression
        && !expression.is_empty()
        && expression.trim().is_empty()
    {
        report.schema_error(FieldError::required(
            &path.child("messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
    }
    if let Some(reason) = &rule.reason
        && !SUPPORTED_REASONS.contains(&reason.as_str())
    {
        report.schema_error(FieldError::not_supported(
            &path.child("reason"),
            reason.clone(),
            SUPPORTED_REASONS,
        ));
    }
    if let Some(field_path) = &rule.field_path {
        let at = path.child("fieldPath");
        if !field_path.is_empty() && field_path.trim().is_empty() {
            report.schema_error(FieldError::invalid(
                &at,
                field_path.clone(),
                "fieldPath must be non-empty if specified",
            ));
        }
        if has_newlines(field_path) {
            report.schema_error(FieldError::invalid(
                &at,
                field_path.clone(),
                "fieldPath must not contain line breaks",
            ));
        }
        if !field_path.is_empty() && valid_field_path(field_path, node).is_err() {
            report.schema_error(FieldError::invalid(
                &at,
                field_path.clone(),
                "fieldPath must be a valid path",
            ));
        }
    }
}

/// `field.Invalid(path, rule, detail)`: upstream prints the rule with Go's `%#v`. The value is
/// kept in the detail so the message reads exactly as upstream's (a JSON value would be
/// rendered differently).
fn invalid_rule(path: &Path, rule: &ValidationRule, detail: &str) -> FieldError {
    fn optional(v: &Option<String>) -> &str {
        v.as_deref().unwrap_or("")
    }
    let reason = match &rule.reason {
        None => "(*apiextensions.FieldValueErrorReason)(nil)".to_string(),
        Some(r) => format!("(*apiextensions.FieldValueErrorReason)({})", go_quote(r)),
    };
    let optional_old_self = match rule.optional_old_self {
        None => "(*bool)(nil)".to_string(),
        Some(b) => format!("(*bool)({b})"),
    };
    let rendered = format!(
        "apiextensions.ValidationRule{{Rule:{}, Message:{}, MessageExpression:{}, Reason:{reason}, FieldPath:{}, OptionalOldSelf:{optional_old_self}}}",
        go_quote(&rule.rule),
        go_quote(optional(&rule.message)),
        go_quote(optional(&rule.message_expression)),
        go_quote(optional(&rule.field_path)),
    );
    FieldError {
        error_type: ErrorType::Invalid,
        field: path.to_string(),
        bad_value: None,
        detail: format!("{rendered}: {detail}"),
    }
}

/// cel-go's rendering of parse errors.
pub(crate) fn parse_issues(source: &str, errors: &ParseErrors) -> String {
    errors
        .errors
        .iter()
        .map(|e| {
            let (line, column) = (e.pos.0.max(1) as usize, e.pos.1.max(1) as usize);
            let line_start: usize = source
                .split_inclusive('\n')
                .take(line - 1)
                .map(str::len)
                .sum();
            let offset = source[line_start.min(source.len())..]
                .char_indices()
                .nth(column - 1)
                .map_or(source.len(), |(i, _)| line_start + i);
            check::issue(source, offset, &e.msg)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Compiles one expression against `self`'s type: the program, its static type and cost, or
/// the cel-go-style issues.
fn compile_expression(
    source: &str,
    decl: &Arc<DeclType>,
    old_self: OldSelf,
) -> Result<(Program, check::Analysis), String> {
    let program = crate::env::env()
        .compile(source)
        .map_err(|e| parse_issues(source, &e))?;
    let sizes = DeclSizes { root: decl.clone() };
    let analysis = check::analyze(
        program.expression(),
        source,
        program.source_info(),
        Scope::Rule {
            self_type: decl,
            old_self,
        },
        &sizes,
    );
    if !analysis.issues.is_empty() {
        return Err(analysis.issues.join("\n"));
    }
    Ok((program, analysis))
}

fn compile_rule(rule: &ValidationRule, node: &Structural, decl: Option<&Arc<DeclType>>) -> Rule {
    let mut compiled = Rule {
        source: rule.clone(),
        program: None,
        error: None,
        uses_old_self: false,
        message_program: None,
        message_error: None,
        field_path: None,
        max_cost: 0,
        message_max_cost: 0,
    };
    if rule.rule.trim().is_empty() {
        return compiled;
    }
    let Some(decl) = decl else {
        compiled.error = Some("failed to convert to declType for CEL validation rules".to_string());
        return compiled;
    };
    let old_self = if rule.optional_old_self == Some(true) {
        OldSelf::Optional
    } else {
        OldSelf::Plain
    };
    match compile_expression(&rule.rule, decl, old_self) {
        Err(issues) => {
            compiled.error = Some(format!("compilation failed: {issues}"));
            return compiled;
        }
        Ok((_, analysis)) if !matches!(analysis.ty, Ty::Bool | Ty::Dyn) => {
            compiled.error = Some("cel expression must evaluate to a bool".to_string());
            return compiled;
        }
        Ok((program, analysis)) => {
            compiled.program = Some(program);
            compiled.uses_old_self = analysis.uses_old_self;
            compiled.max_cost = analysis.cost;
        }
    }
    if let Some(expression) = rule.message_expression.as_deref().filter(|e| !e.is_empty()) {
        match compile_expression(expression, decl, old_self) {
            Err(issues) => {
                compiled.message_error =
                    Some(format!("messageExpression compilation failed: {issues}"));
            }
            Ok((_, analysis)) if !matches!(analysis.ty, Ty::String | Ty::Dyn) => {
                compiled.message_error =
                    Some("messageExpression must evaluate to a string".to_string());
            }
            Ok((program, analysis)) => {
                compiled.message_program = Some(program);
                compiled.message_max_cost = analysis.cost;
            }
        }
    }
    if let Some(field_path) = rule.field_path.as_deref().filter(|p| !p.is_empty()) {
        compiled.field_path = valid_field_path(field_path, node).ok();
    }
    compiled
}
