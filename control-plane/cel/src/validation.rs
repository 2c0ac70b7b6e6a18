//! Running the compiled rules against an object (upstream `validation.go`): every rule on
//! every node where a value is present, `oldSelf` correlated as upstream correlates it, the
//! per-call and per-request cost budgets, `message`/`messageExpression`/`reason`/`fieldPath`,
//! and ratcheting of errors on unchanged values into warnings.

use cel::common::types::CelOptional;
use cel::common::value::Val;
use cel::{Context, ExecutionError, Program, Value};
use flotilla_api_machinery::field::{ErrorType, FieldError, Path, go_quote};
use serde_json::Value as Json;

use crate::check::{self, OldSelf, Scope};
use crate::compilation::{Node, Rule};
use crate::cost::DataSizes;
use crate::limits::{MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES, PER_CALL_LIMIT};
use crate::values::to_cel;

/// What validating one object found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The rules the object fails.
    pub errors: Vec<FieldError>,
    /// Failures of rules on values an update left unchanged: upstream (CRD validation
    /// ratcheting) returns these as warnings rather than rejecting the update.
    pub warnings: Vec<String>,
    /// The cost budget left; negative once a budget ran out and validation stopped.
    pub remaining_budget: i64,
}

/// Where the ratcheting of an update stands (upstream `ratchetingOptions`): the correlated
/// old and new value of this node, if any, and of the nearest correlated ancestor.
#[derive(Clone, Copy)]
pub(crate) struct Ratchet<'a> {
    current: Option<(&'a Json, &'a Json)>,
    parent: Option<(&'a Json, &'a Json)>,
}

impl<'a> Ratchet<'a> {
    pub fn root(new: &'a Json, old: Option<&'a Json>) -> Ratchet<'a> {
        Ratchet {
            current: old.map(|old| (new, old)),
            parent: None,
        }
    }

    const OFF: Ratchet<'static> = Ratchet {
        current: None,
        parent: None,
    };

    /// Whether an error raised here is only a warning: this value, or the closest correlated
    /// value above it, is unchanged.
    fn applies(&self) -> bool {
        match (self.current, self.parent) {
            (Some((new, old)), _) | (None, Some((new, old))) => new == old,
            (None, None) => false,
        }
    }

    fn key(self, field: &str) -> Ratchet<'a> {
        let Some((new, old)) = self.current else {
            return self;
        };
        // `apiVersion` and `kind` cannot be ratcheted: both sides are converted to the same
        if self.parent.is_none() && (field == "apiVersion" || field == "kind") {
            return Ratchet::OFF;
        }
        Ratchet {
            current: new.get(field).zip(old.get(field)),
            parent: self.current,
        }
    }

    fn index(self, new_item: &'a Json, old_item: Option<&'a Json>) -> Ratchet<'a> {
        if self.current.is_none() {
            return self;
        }
        Ratchet {
            current: old_item.map(|old| (new_item, old)),
            parent: self.current,
        }
    }

    /// `allOf` branches are not ratcheted on this node, only through its ancestors.
    fn all_of(self) -> Ratchet<'a> {
        Ratchet {
            current: None,
            parent: self.parent,
        }
    }
}

pub(crate) struct Run {
    pub errors: Vec<FieldError>,
    pub warnings: Vec<String>,
    pub budget: i64,
}

/// Upstream `MapIsCorrelatable`: an unknown map type is assumed not to be.
fn map_is_correlatable(map_type: Option<&str>) -> bool {
    matches!(map_type, None | Some("granular") | Some("atomic"))
}

/// The old element a map-list item stands for: the first with the same scalar key values.
fn correlated_item<'a>(node: &Node, old: Option<&'a Json>, item: &Json) -> Option<&'a Json> {
    if node.list_type.as_deref() != Some("map") || node.list_map_keys.is_empty() {
        return None;
    }
    let key = |value: &Json| -> Option<Vec<Json>> {
        node.list_map_keys
            .iter()
            .map(|k| {
                value
                    .get(k)
                    .filter(|v| v.is_string() || v.is_number() || v.is_boolean())
                    .cloned()
            })
            .collect()
    };
    let wanted = key(item)?;
    old?.as_array()?
        .iter()
        .find(|candidate| key(candidate).as_ref() == Some(&wanted))
}

pub(crate) fn validate_node<'a>(
    node: &Node,
    path: &Path,
    new: &'a Json,
    old: Option<&'a Json>,
    ratchet: Ratchet<'a>,
    run: &mut Run,
) {
    if run.budget < 0 || new.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    validate_expressions(node, path, new, old, ratchet, run);
    if run.budget < 0 {
        return;
    }
    for branch in &node.all_of {
        validate_node(branch, path, new, old, ratchet.all_of(), run);
        if run.budget < 0 {
            return;
        }
    }
    match new {
        Json::Array(items) => {
            let Some(item_node) = &node.items else {
                return;
            };
            for (i, item) in items.iter().enumerate() {
                let old_item = correlated_item(node, old, item);
                let ratchet = ratchet.index(item, old_item);
                validate_node(item_node, &path.index(i), item, old_item, ratchet, run);
                if run.budget < 0 {
                    return;
                }
            }
        }
        Json::Object(fields) => {
            let correlatable = map_is_correlatable(node.map_type.as_deref());
            let old_field = |k: &str| {
                if correlatable {
                    old.and_then(|o| o.get(k))
                } else {
                    None
                }
            };
            if let Some(values) = &node.additional_properties {
                for (k, v) in fields {
                    validate_node(
                        values,
                        &path.key(k.clone()),
                        v,
                        old_field(k),
                        ratchet.key(k),
                        run,
                    );
                    if run.budget < 0 {
                        return;
                    }
                }
            }
            for (k, v) in fields {
                if let Some(property) = node.properties.get(k) {
                    validate_node(
                        property,
                        &path.child(k.clone()),
                        v,
                        old_field(k),
                        ratchet.key(k),
                        run,
                    );
                    if run.budget < 0 {
                        return;
                    }
                }
            }
        }
        _ => {}
    }
}

fn budget_exhausted(node: &Node, path: &Path, run: &mut Run) {
    run.errors.push(FieldError::invalid(
        path,
        node.type_.clone(),
        "validation failed due to running out of cost budget, no further validation rules will be run",
    ));
    run.budget = -1;
}

/// The variables of the rules of one node, bound once for the rules that take `oldSelf` as
/// is and once for those that take it as an optional.
struct Bindings {
    new: Value,
    old: Option<Value>,
    plain: Option<Context<'static, 'static>>,
    optional: Option<Context<'static, 'static>>,
}

impl Bindings {
    fn new(new: Value, old: Option<Value>) -> Bindings {
        Bindings {
            new,
            old,
            plain: None,
            optional: None,
        }
    }

    fn context(&mut self, rule: &Rule) -> &Context<'static, 'static> {
        let (new, old) = (&self.new, &self.old);
        if rule.optional_old_self() {
            self.optional.get_or_insert_with(|| {
                let mut context = Context::with_env(crate::env::env().clone());
                context.add_variable_from_value("self", new.clone());
                let old: CelOptional<'static> = match old {
                    Some(old) => match Box::<dyn Val>::try_from(old.clone()) {
                        Ok(val) => CelOptional::of(val),
                        Err(_) => CelOptional::none(),
                    },
                    None => CelOptional::none(),
                };
                context.add_variable_as_val("oldSelf", Box::new(old));
                context
            })
        } else {
            self.plain.get_or_insert_with(|| {
                let mut context = Context::with_env(crate::env::env().clone());
                context.add_variable_from_value("self", new.clone());
                if let Some(old) = old {
                    context.add_variable_from_value("oldSelf", old.clone());
                }
                context
            })
        }
    }
}

fn validate_expressions(
    node: &Node,
    path: &Path,
    new: &Json,
    old: Option<&Json>,
    ratchet: Ratchet<'_>,
    run: &mut Run,
) {
    let (Some(schema), Some(decl)) = (&node.value_schema, &node.decl) else {
        // rules on a node CEL cannot see never compiled; upstream reports that when they
        // would run
        if node.rules.iter().any(|r| r.error.is_some()) {
            run.errors.push(FieldError::invalid(
                path,
                node.type_.clone(),
                "rule compiler initialization error: failed to convert to declType for CEL validation rules",
            ));
        }
        return;
    };
    if node.rules.is_empty() {
        return;
    }
    if run.budget <= 0 {
        budget_exhausted(node, path, run);
        return;
    }
    let mut bindings = Bindings::new(to_cel(new, schema), old.map(|o| to_cel(o, schema)));
    let sizes = DataSizes::new(new, old);
    for rule in &node.rules {
        if let Some(error) = &rule.error {
            run.errors.push(FieldError::invalid(
                path,
                node.type_.clone(),
                format!("rule compile error: {error}"),
            ));
            continue;
        }
        let Some(program) = &rule.program else {
            continue;
        };
        // transition rules only run when there is an old value to compare with, unless they
        // take `oldSelf` as optional
        if rule.uses_old_self && old.is_none() && !rule.optional_old_self() {
            continue;
        }
        let old_self = if rule.optional_old_self() {
            OldSelf::Optional
        } else {
            OldSelf::Plain
        };
        let cost = runtime_cost(program, &rule.source.rule, decl, old_self, &sizes);
        if cost > run.budget {
            budget_exhausted(node, path, run);
            return;
        }
        if cost > PER_CALL_LIMIT as i64 {
            run.errors.push(FieldError::invalid(
                path,
                node.type_.clone(),
                format!(
                    "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                    rule.error_string()
                ),
            ));
            run.budget = -1;
            return;
        }
        run.budget -= cost;
        let context = bindings.context(rule);
        match program.execute(context) {
            Ok(Value::Bool(true)) => continue,
            Ok(_) => {}
            Err(e) => {
                let message = runtime_message(&e);
                let detail = if message.starts_with("no such overload") {
                    format!(
                        "'{message}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                        rule.error_string()
                    )
                } else {
                    format!("{message} evaluating rule: {}", rule.error_string())
                };
                run.errors
                    .push(FieldError::invalid(path, node.type_.clone(), detail));
                continue;
            }
        }

        let at = match &rule.field_path {
            Some(field_path) => path.child(field_path.clone()),
            None => path.clone(),
        };
        let detail = match &rule.message_program {
            None => rule.message_or_default(),
            Some(message_program) => {
                let expression = rule.source.message_expression.as_deref().unwrap_or("");
                let cost = runtime_cost(message_program, expression, decl, old_self, &sizes);
                if cost > run.budget {
                    report(
                        rule,
                        ratchet,
                        run,
                        FieldError::invalid(
                            &at,
                            node.type_.clone(),
                            "messageExpression evaluation failed due to running out of cost budget, no further validation rules will be run",
                        ),
                    );
                    run.budget = -1;
                    return;
                }
                if cost > PER_CALL_LIMIT as i64 {
                    report(
                        rule,
                        ratchet,
                        run,
                        FieldError::invalid(
                            &at,
                            node.type_.clone(),
                            format!(
                                "no further validation rules will be run due to call cost exceeds limit for messageExpression: {}",
                                go_quote(expression)
                            ),
                        ),
                    );
                    run.budget = -1;
                    return;
                }
                run.budget -= cost;
                // a message expression that fails, or yields no usable message, falls back to
                // the rule's message
                evaluated_message(message_program, context)
                    .unwrap_or_else(|| rule.message_or_default())
            }
        };
        let error = match rule.error_type() {
            ErrorType::Forbidden => FieldError::forbidden(&at, detail),
            ErrorType::Required => FieldError::required(&at, detail),
            ErrorType::Duplicate => FieldError::duplicate(&at, node.type_.clone()),
            _ => FieldError::invalid(&at, node.type_.clone(), detail),
        };
        report(rule, ratchet, run, error);
    }
}

/// Records a failure, or a warning when ratcheting lets an unchanged value keep failing a
/// rule that does not compare with the old value.
fn report(rule: &Rule, ratchet: Ratchet<'_>, run: &mut Run, error: FieldError) {
    if !rule.uses_old_self && ratchet.applies() {
        run.warnings.push(error.to_string());
    } else {
        run.errors.push(error);
    }
}

fn evaluated_message(program: &Program, context: &Context<'_, '_>) -> Option<String> {
    let Ok(Value::String(message)) = program.execute(context) else {
        return None;
    };
    let trimmed = message.trim();
    let usable = !trimmed.is_empty()
        && trimmed.len() <= MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES
        && !trimmed.contains('\n');
    usable.then(|| trimmed.to_string())
}

/// The cost of evaluating `program` on this data: cel-go's estimate with the data's actual
/// sizes in place of the schema's bounds, an upper bound of what cel-go would meter.
fn runtime_cost(
    program: &Program,
    source: &str,
    decl: &std::sync::Arc<crate::schema::DeclType>,
    old_self: OldSelf,
    sizes: &DataSizes<'_>,
) -> i64 {
    let analysis = check::analyze(
        program.expression(),
        source,
        program.source_info(),
        Scope::Rule {
            self_type: decl,
            old_self,
        },
        sizes,
    );
    i64::try_from(analysis.cost).unwrap_or(i64::MAX)
}

/// cel-go's text for a runtime error.
pub(crate) fn runtime_message(error: &ExecutionError) -> String {
    match error {
        ExecutionError::NoSuchKey(key) => format!("no such key: {key}"),
        ExecutionError::DivisionByZero(_) => "division by zero".to_string(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".to_string(),
        ExecutionError::Overflow(..) => "integer overflow".to_string(),
        ExecutionError::IndexOutOfBounds(index) => match index {
            Value::Int(i) => format!("index out of bounds: {i}"),
            Value::UInt(u) => format!("index out of bounds: {u}"),
            other => format!("index out of bounds: {other:?}"),
        },
        ExecutionError::FunctionError { message, .. } => message.clone(),
        ExecutionError::InternalError(message) => message.clone(),
        ExecutionError::UndeclaredReference(name) => format!("no such attribute: {name}"),
        ExecutionError::NoSuchOverload(_)
        | ExecutionError::ValuesNotComparable(..)
        | ExecutionError::UnsupportedBinaryOperator(..)
        | ExecutionError::UnexpectedType { .. }
        | ExecutionError::UnsupportedIndex(..)
        | ExecutionError::UnsupportedKeyType(_)
        | ExecutionError::UnsupportedTargetType { .. }
        | ExecutionError::NotSupportedAsMethod { .. } => "no such overload".to_string(),
        other => other.to_string(),
    }
}
