//! Evaluating admission expressions (upstream `activation.go` and composition's lazy
//! `variables`): the request's data bound once per evaluation, each variable evaluated at most
//! once and only when an expression reads it, and the cost of both charged to the budget.
//!
//! cel-rust does not meter cost, so the cost charged is cel-go's estimate computed with the
//! data's actual sizes, as for CRD rules.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use cel::common::traits::Indexer;
use cel::common::types::{CelString, Type};
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, ExecutionError, Program, Value};
use flotilla_api_machinery::field::go_quote;
use flotilla_api_machinery::rbac::UserInfo;
use serde_json::Value as Json;

use super::declarations::{
    AUTHORIZER, NAMESPACE_OBJECT, OBJECT, OLD_OBJECT, PARAMS, REQUEST, REQUEST_RESOURCE_AUTHORIZER,
    VARIABLES,
};
use super::{AdmissionInputs, Compiled, Composition, Evaluation, ExpressionValue, OutOfBudget};
use crate::check::{self, Declared, Scope};
use crate::cost::{Seg, Size, Sizes, count, size_at};
use crate::library::authz::{AuthorizerValue, ResourceTarget};
use crate::limits::PER_CALL_LIMIT;
use crate::validation::runtime_message;
use crate::values::untyped;

/// cel-go's error when one evaluation exceeds `PerCallLimit`.
const COST_LIMIT_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";

/// The request's data as CEL values, converted once per evaluation.
struct Base {
    object: Box<dyn Val>,
    old_object: Box<dyn Val>,
    request: Box<dyn Val>,
    params: Box<dyn Val>,
    namespace_object: Box<dyn Val>,
    authorizer: Box<dyn Val>,
    request_resource: Box<dyn Val>,
}

fn to_val(data: Option<&Json>) -> Box<dyn Val> {
    let value = data.map_or(Value::Null, untyped);
    // JSON only ever makes values that have a `Val` form; null is the honest fallback
    Box::<dyn Val>::try_from(value)
        .unwrap_or_else(|_| Box::new(cel::common::types::CelNull) as Box<dyn Val>)
}

fn strings(value: &Json) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Json::as_str)
        .map(str::to_string)
        .collect()
}

/// `request.userInfo`: who the authorizer's checks are made for.
fn user_info(request: &Json) -> UserInfo {
    let user = &request["userInfo"];
    let text = |field: &str| user[field].as_str().unwrap_or_default().to_string();
    UserInfo {
        name: text("username"),
        uid: text("uid"),
        groups: strings(&user["groups"]),
        extra: user["extra"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(key, values)| (key.clone(), strings(values)))
            .collect(),
    }
}

/// The resource the request is for, as it was asked (`requestResource`, not the equivalent
/// resource a policy matched), for `authorizer.requestResource`.
fn request_target(request: &Json) -> ResourceTarget {
    let text = |value: &Json| value.as_str().unwrap_or_default().to_string();
    let resource = if request["requestResource"].is_object() {
        &request["requestResource"]
    } else {
        &request["resource"]
    };
    let subresource = match request.get("requestSubResource") {
        Some(requested) => requested,
        None => &request["subResource"],
    };
    ResourceTarget {
        group: text(&resource["group"]),
        resource: text(&resource["resource"]),
        subresource: text(subresource),
        namespace: text(&request["namespace"]),
        name: text(&request["name"]),
    }
}

impl Base {
    fn new(inputs: &AdmissionInputs<'_>) -> Base {
        let authorizer =
            AuthorizerValue::new(inputs.authorizer.cloned(), user_info(inputs.request));
        let request_resource = authorizer.resource_check(request_target(inputs.request));
        Base {
            object: to_val(inputs.object),
            old_object: to_val(inputs.old_object),
            request: to_val(Some(inputs.request)),
            params: to_val(inputs.params),
            namespace_object: to_val(inputs.namespace_object),
            authorizer: Box::new(authorizer),
            request_resource: Box::new(request_resource),
        }
    }
}

/// Sizes read off the request's data.
struct DataSizes<'a> {
    inputs: &'a AdmissionInputs<'a>,
    whole: u64,
}

impl<'a> DataSizes<'a> {
    fn new(inputs: &'a AdmissionInputs<'a>) -> DataSizes<'a> {
        let whole = [
            inputs.object,
            inputs.old_object,
            Some(inputs.request),
            inputs.params,
            inputs.namespace_object,
        ]
        .into_iter()
        .flatten()
        .map(count)
        .sum();
        DataSizes { inputs, whole }
    }
}

impl Sizes for DataSizes<'_> {
    fn size(&self, path: &[Seg]) -> Option<Size> {
        let Some(Seg::Var(name)) = path.first() else {
            return None;
        };
        let root = match *name {
            OBJECT => self.inputs.object,
            OLD_OBJECT => self.inputs.old_object,
            REQUEST => Some(self.inputs.request),
            PARAMS => self.inputs.params,
            NAMESPACE_OBJECT => self.inputs.namespace_object,
            // variables are computed: bounded by the data they are computed from
            _ => return None,
        };
        match root {
            Some(root) => size_at(root, &path[1..], false),
            None => Some(Size { min: 0, max: 0 }),
        }
    }

    fn unknown(&self) -> Size {
        Size {
            min: 0,
            max: self.whole,
        }
    }
}

/// The estimated cost of running `program` on this data.
fn runtime_cost(
    program: &Program,
    source: &str,
    declared: &[Declared],
    sizes: &DataSizes<'_>,
) -> i64 {
    let analysis = check::analyze(
        program.expression(),
        source,
        program.source_info(),
        Scope::Named(declared),
        sizes,
    );
    i64::try_from(analysis.cost).unwrap_or(i64::MAX)
}

/// The per-evaluation cache of variables and the cost they ran up.
struct VariableState {
    values: Vec<OnceLock<Result<Box<dyn Val>, String>>>,
    /// Set while a variable is being evaluated, to refuse one that reads itself.
    busy: Vec<AtomicBool>,
    cost: AtomicI64,
}

impl VariableState {
    fn new(n: usize) -> VariableState {
        VariableState {
            values: (0..n).map(|_| OnceLock::new()).collect(),
            busy: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cost: AtomicI64::new(0),
        }
    }

    fn charge(&self, cost: i64) {
        // saturating: the sum is compared with the budget, which it must not wrap past
        let _ = self
            .cost
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(c.saturating_add(cost))
            });
    }

    /// upstream `GetAndResetCost`
    fn take_cost(&self) -> i64 {
        self.cost.swap(0, Ordering::Relaxed)
    }
}

/// Everything one evaluation binds.
struct Activation<'a> {
    base: Base,
    composition: &'a Composition,
    state: VariableState,
    sizes: DataSizes<'a>,
}

/// `variables`: a map whose entries are evaluated on first access (upstream `lazy.MapValue`).
#[derive(Clone, Copy)]
struct LazyVariables<'a> {
    activation: &'a Activation<'a>,
}

static VARIABLES_TYPE: Type = Type::new_unspecified_type("kubernetes.variables");

impl std::fmt::Debug for LazyVariables<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("variables")
    }
}

impl LazyVariables<'_> {
    /// Evaluates variable `index` (upstream `variableAccessor.Callback`).
    fn evaluate(&self, index: usize) -> Result<Box<dyn Val>, String> {
        let activation = self.activation;
        let variable = &activation.composition.variables[index];
        let name = go_quote(&variable.name);
        let compiled = &variable.compiled;
        let Some(program) = &compiled.program else {
            let detail = compiled.error.as_ref().map_or("", |e| e.detail.as_str());
            return Err(format!(
                "composited variable {name} fails to compile: {detail}"
            ));
        };
        let cost = runtime_cost(
            program,
            &compiled.source,
            &compiled.declared,
            &activation.sizes,
        );
        if cost > PER_CALL_LIMIT as i64 {
            activation.state.charge(PER_CALL_LIMIT as i64 + 1);
            return Err(format!(
                "composited variable {name} fails to evaluate: {COST_LIMIT_EXCEEDED}"
            ));
        }
        let result = activation.execute_owned(program);
        activation.state.charge(cost);
        result.map_err(|e| {
            format!(
                "composited variable {name} fails to evaluate: {}",
                runtime_message(&e)
            )
        })
    }
}

impl Indexer for LazyVariables<'_> {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        let activation = self.activation;
        let Some(name) = idx
            .downcast_ref::<CelString>()
            .map(|s| s.inner().to_string())
        else {
            return Err(ExecutionError::no_such_key("variables"));
        };
        // a later variable of the same name replaces an earlier one, as in upstream's map
        let Some(index) = activation
            .composition
            .variables
            .iter()
            .rposition(|v| v.name == name)
        else {
            return Err(ExecutionError::no_such_key(&name));
        };
        let slot = &activation.state.values[index];
        if slot.get().is_none() {
            if activation.state.busy[index].swap(true, Ordering::Relaxed) {
                return Err(ExecutionError::function_error(
                    VARIABLES,
                    format!("composited variable {} refers to itself", go_quote(&name)),
                ));
            }
            let _ = slot.set(self.evaluate(index));
        }
        match slot.get() {
            Some(Ok(value)) => Ok(CowVal::Borrowed(value.as_ref())),
            Some(Err(message)) => Err(ExecutionError::function_error(VARIABLES, message.clone())),
            None => Err(ExecutionError::no_such_key(&name)),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

impl Val for LazyVariables<'_> {
    fn get_type(&self) -> &Type {
        &VARIABLES_TYPE
    }

    fn cel_type() -> &'static Type {
        &VARIABLES_TYPE
    }

    fn as_indexer<'b, 'v>(&'b self) -> Option<&'b (dyn Indexer + 'v)>
    where
        Self: 'v,
    {
        Some(self)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(*self)
    }
}

/// The variables as the interpreter looks them up.
struct Resolver<'a> {
    activation: &'a Activation<'a>,
}

impl VariableResolver for Resolver<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let base = &self.activation.base;
        let value: &dyn Val = match variable {
            OBJECT => base.object.as_ref(),
            OLD_OBJECT => base.old_object.as_ref(),
            REQUEST => base.request.as_ref(),
            PARAMS => base.params.as_ref(),
            NAMESPACE_OBJECT => base.namespace_object.as_ref(),
            AUTHORIZER => base.authorizer.as_ref(),
            REQUEST_RESOURCE_AUTHORIZER => base.request_resource.as_ref(),
            VARIABLES if self.activation.composition.composited => {
                return Some(CowVal::owned(LazyVariables {
                    activation: self.activation,
                }));
            }
            _ => return None,
        };
        Some(CowVal::Borrowed(value))
    }
}

impl<'a> Activation<'a> {
    fn execute(&self, program: &Program) -> Result<Value, ExecutionError> {
        let resolver = Resolver { activation: self };
        let mut context = Context::with_env(crate::env::env().clone());
        context.set_variable_resolver(&resolver);
        program.execute(&context)
    }

    /// Runs `program` for a value kept beyond this evaluation (a variable's): library values
    /// (a `Decision`, a `URL`...) have no `Value` form, so they are kept as they are.
    fn execute_owned(&self, program: &Program) -> Result<Box<dyn Val>, ExecutionError> {
        let resolver = Resolver { activation: self };
        let mut context = Context::with_env(crate::env::env().clone());
        context.set_variable_resolver(&resolver);
        let value = Value::resolve_val(program.expression(), &context)?;
        if let Some(owned) = crate::library::to_static(value.as_ref()) {
            return Ok(owned);
        }
        Box::<dyn Val>::try_from(Value::try_from(value.as_ref())?)
    }

    /// Evaluates one expression (upstream `evaluationActivation.Evaluate`).
    fn evaluate(
        &self,
        compiled: &Compiled,
        remaining: &mut i64,
    ) -> Result<Result<ExpressionValue, String>, OutOfBudget> {
        let Some(program) = compiled
            .program
            .as_ref()
            .filter(|_| compiled.error.is_none())
        else {
            let detail = compiled.error.as_ref().map_or("", |e| e.detail.as_str());
            return Ok(Err(format!("compilation error: {detail}")));
        };
        let cost = runtime_cost(program, &compiled.source, &compiled.declared, &self.sizes);
        let (cost, result) = if cost > PER_CALL_LIMIT as i64 {
            // cel-go stops as soon as the limit is crossed
            (
                PER_CALL_LIMIT as i64 + 1,
                Err(COST_LIMIT_EXCEEDED.to_string()),
            )
        } else {
            (cost, self.execute(program).map_err(|e| runtime_message(&e)))
        };
        // variables read along the way are paid for first
        let composition_cost = self.state.take_cost();
        if composition_cost > *remaining {
            return Err(OutOfBudget);
        }
        *remaining -= composition_cost;
        if cost > *remaining {
            return Err(OutOfBudget);
        }
        *remaining -= cost;
        Ok(match result {
            Ok(value) => Ok(expression_value(&value)),
            Err(message) => Err(format!(
                "expression '{}' resulted in error: {message}",
                compiled.source
            )),
        })
    }
}

fn expression_value(value: &Value) -> ExpressionValue {
    let other = |name: &str| ExpressionValue::Other(name.to_string());
    match value {
        Value::Bool(b) => ExpressionValue::Bool(*b),
        Value::String(s) => ExpressionValue::String(s.to_string()),
        Value::Null => ExpressionValue::Null,
        Value::Int(_) => other("int"),
        Value::UInt(_) => other("uint"),
        Value::Float(_) => other("double"),
        Value::Bytes(_) => other("bytes"),
        Value::List(_) => other("list"),
        Value::Map(_) => other("map"),
        Value::Duration(_) => other("google.protobuf.Duration"),
        Value::Timestamp(_) => other("google.protobuf.Timestamp"),
        Value::Struct(s) => other(s.name()),
        Value::Function(..) | Value::Opaque(_) => other("opaque"),
    }
}

/// Evaluates `compiled` in order against one request (upstream `condition.ForInput`).
pub(super) fn evaluate(
    composition: &Composition,
    compiled: &[Compiled],
    inputs: &AdmissionInputs<'_>,
    budget: i64,
) -> Result<Evaluation, OutOfBudget> {
    let activation = Activation {
        base: Base::new(inputs),
        composition,
        state: VariableState::new(composition.variables.len()),
        sizes: DataSizes::new(inputs),
    };
    let mut remaining = budget;
    let mut results = Vec::with_capacity(compiled.len());
    for expression in compiled {
        results.push(activation.evaluate(expression, &mut remaining)?);
    }
    Ok(Evaluation {
        results,
        remaining_budget: remaining,
    })
}
