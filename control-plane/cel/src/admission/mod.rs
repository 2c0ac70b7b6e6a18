//! CEL in admission (upstream `k8s.io/apiserver/pkg/admission/plugin/cel`): expressions over
//! `object`, `oldObject`, `request`, `params`, `namespaceObject` and composed `variables`,
//! compiled once and evaluated per request under upstream's cost limits.
//!
//! On top of it sit webhook `matchConditions` ([`MatchConditions`]) and
//! ValidatingAdmissionPolicy ([`Policy`]). Where upstream declares `authorizer` (everywhere
//! but a validation's `messageExpression`), its checks are answered by the
//! [`RequestAuthorizer`] of [`AdmissionInputs::authorizer`], synchronously.

mod activation;
mod declarations;
mod match_conditions;
mod policy;
mod spec;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use cel::Program;
use serde_json::Value;

use crate::check::{self, Declared, Scope};
use crate::cost::{DeclSizes, Seg, Size, Sizes};
use crate::schema::DeclType;
use crate::types::Ty;

pub use crate::library::authz::{AuthorizerDecision, RequestAuthorizer};
pub use match_conditions::{MatchConditions, MatchResult, validate_match_conditions};
pub use policy::{
    AuditAnnotationAction, Decision, FailurePolicy, Policy, PolicyAuditAnnotation, PolicyDecision,
    PolicyDecisionAction, PolicyDecisionEvaluation, reason_to_code,
};

/// The data one admission request binds to the expression variables.
#[derive(Clone, Copy)]
pub struct AdmissionInputs<'a> {
    /// The object being admitted; `None` (CEL `null`) on DELETE.
    pub object: Option<&'a Value>,
    /// The existing object; `None` (CEL `null`) on CREATE.
    pub old_object: Option<&'a Value>,
    /// The `AdmissionRequest` as JSON: `kind`, `resource`, `subResource`, `requestKind`,
    /// `requestResource`, `requestSubResource`, `name`, `namespace`, `operation`, `userInfo`,
    /// `dryRun`, `options`. Fields left out are absent to `has()`, as upstream's `omitempty`.
    pub request: &'a Value,
    /// The policy's parameter resource, if the binding has one.
    pub params: Option<&'a Value>,
    /// The request's namespace, for namespaced requests.
    pub namespace_object: Option<&'a Value>,
    /// What answers `authorizer`'s checks, made as `request.userInfo` (upstream binds the
    /// request's user with the authorizer). `None` binds an `authorizer` whose checks are not
    /// allowed and errored.
    pub authorizer: Option<&'a Arc<dyn RequestAuthorizer>>,
}

impl fmt::Debug for AdmissionInputs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionInputs")
            .field("object", &self.object)
            .field("old_object", &self.old_object)
            .field("request", &self.request)
            .field("params", &self.params)
            .field("namespace_object", &self.namespace_object)
            .field("authorizer", &self.authorizer.is_some())
            .finish()
    }
}

/// Which upstream expression an expression is, which decides what it may refer to and what it
/// must evaluate to (upstream's `ExpressionAccessor` implementations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressionKind {
    /// A validation or a match condition: `bool`.
    Condition,
    /// A validation's `messageExpression`: `string`, without `authorizer`.
    Message,
    /// An audit annotation's `valueExpression`: `string` or `null`.
    AuditValue,
    /// A composed variable: any type.
    Variable,
}

impl ExpressionKind {
    fn return_types(self) -> &'static [Ty] {
        match self {
            ExpressionKind::Condition => &[Ty::Bool],
            ExpressionKind::Message => &[Ty::String],
            ExpressionKind::AuditValue => &[Ty::String, Ty::Null],
            ExpressionKind::Variable => &[],
        }
    }

    fn declares_authorizer(self) -> bool {
        self != ExpressionKind::Message
    }
}

/// Why an expression did not compile (upstream `apiservercel.Error` from
/// `CompileCELExpression`); the detail reads as upstream's, e.g.
/// `compilation failed: ERROR: <input>:1:3: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    /// The expression as written.
    pub expression: String,
    /// Upstream's message.
    pub detail: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for CompileError {}

/// A runtime cost budget ran out (upstream's `ErrOutOfBudget`): no further expression runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBudget;

impl fmt::Display for OutOfBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "validation failed due to running out of cost budget, no further validation rules will be run",
        )
    }
}

impl std::error::Error for OutOfBudget {}

/// What an expression evaluated to, in the shapes admission acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum ExpressionValue {
    /// A `bool`.
    Bool(bool),
    /// A `string`.
    String(String),
    /// `null`.
    Null,
    /// Any other value, by its CEL type name (`int`, `list`, ...).
    Other(String),
}

/// The results of evaluating a set of expressions, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// One per expression: its value, or upstream's error text (`expression '...' resulted
    /// in error: ...`, `compilation error: ...`).
    pub results: Vec<Result<ExpressionValue, String>>,
    /// What is left of the budget.
    pub remaining_budget: i64,
}

/// One compiled expression.
pub(crate) struct Compiled {
    pub source: String,
    pub program: Option<Program>,
    pub error: Option<CompileError>,
    pub ty: Ty,
    /// What the expression was checked against, which the runtime cost estimate reuses.
    pub declared: Arc<[Declared]>,
    /// The static cost estimate; unbounded through the schemaless variables.
    pub estimated_cost: u64,
}

/// A named variable (upstream `Variable`), compiled in declaration order.
pub(crate) struct CompiledVariable {
    pub name: String,
    pub compiled: Compiled,
}

/// The declarations expressions compile against, with the variables composed so far
/// (upstream's `CompositedCompiler` and its `compositionState`).
pub struct Composition {
    has_params: bool,
    /// Whether `variables` is declared at all: upstream only composes for policies with
    /// variables, elsewhere `variables` is an undeclared reference.
    composited: bool,
    variables: Vec<CompiledVariable>,
    variable_types: BTreeMap<String, Arc<DeclType>>,
    variables_decl: Option<Arc<DeclType>>,
}

/// Sizes for the static estimate: the fixed shapes of `request` and `namespaceObject`, and
/// nothing known of the rest.
struct StaticSizes;

impl Sizes for StaticSizes {
    fn size(&self, path: &[Seg]) -> Option<Size> {
        let Some(Seg::Var(name)) = path.first() else {
            return None;
        };
        let root = declarations::static_root(name)?;
        DeclSizes { root }.size(path)
    }

    fn unknown(&self) -> Size {
        Size::UNKNOWN
    }
}

impl Composition {
    /// Declarations without `variables` (upstream's plain `Compiler`), as webhook match
    /// conditions and policies without variables have.
    pub fn new(has_params: bool) -> Composition {
        Composition {
            has_params,
            composited: false,
            variables: Vec::new(),
            variable_types: BTreeMap::new(),
            variables_decl: None,
        }
    }

    /// Declarations with `variables`, to be composed with [`Composition::add_variable`].
    pub fn composited(has_params: bool) -> Composition {
        Composition {
            composited: true,
            variables_decl: Some(declarations::variables_decl(&BTreeMap::new())),
            ..Composition::new(has_params)
        }
    }

    /// Compiles a variable and makes it visible to what compiles after it as
    /// `variables.<name>` (upstream `CompileAndStoreVariable`). A variable that does not
    /// compile is still declared, as `dyn`, and fails when evaluated.
    pub fn add_variable(&mut self, name: &str, expression: &str) -> Result<(), CompileError> {
        let compiled = self.compile_one(expression, ExpressionKind::Variable);
        let decl = declarations::variable_decl(&compiled.ty);
        let error = compiled.error.clone();
        self.variable_types.insert(name.to_string(), decl);
        if self.composited {
            self.variables_decl = Some(declarations::variables_decl(&self.variable_types));
        }
        self.variables.push(CompiledVariable {
            name: name.to_string(),
            compiled,
        });
        error.map_or(Ok(()), Err)
    }

    /// Whether `params` is declared.
    pub fn has_params(&self) -> bool {
        self.has_params
    }

    /// Compiles `expressions` against these declarations and the variables added so far.
    pub fn compile(
        self: &Arc<Self>,
        expressions: &[&str],
        kind: ExpressionKind,
    ) -> AdmissionExpressions {
        AdmissionExpressions {
            composition: self.clone(),
            compiled: expressions
                .iter()
                .map(|e| self.compile_one(e, kind))
                .collect(),
        }
    }

    /// Compiles one expression (upstream `CompileCELExpression`).
    pub(crate) fn compile_one(&self, source: &str, kind: ExpressionKind) -> Compiled {
        let declared: Arc<[Declared]> = declarations::declared(
            self.has_params,
            kind.declares_authorizer(),
            self.variables_decl.as_ref(),
        )
        .into();
        let mut compiled = Compiled {
            source: source.to_string(),
            program: None,
            error: None,
            ty: Ty::Dyn,
            declared: declared.clone(),
            estimated_cost: 0,
        };
        let fail = |compiled: &mut Compiled, detail: String| {
            compiled.error = Some(CompileError {
                expression: source.to_string(),
                detail,
            });
        };
        let program = match crate::env::env().compile(source) {
            Ok(program) => program,
            Err(errors) => {
                let issues = crate::compilation::parse_issues(source, &errors);
                fail(&mut compiled, format!("compilation failed: {issues}"));
                return compiled;
            }
        };
        let analysis = check::analyze(
            program.expression(),
            source,
            program.source_info(),
            Scope::Named(&declared),
            &StaticSizes,
        );
        if !analysis.issues.is_empty() {
            let issues = analysis.issues.join("\n");
            fail(&mut compiled, format!("compilation failed: {issues}"));
            return compiled;
        }
        // upstream wants the exact type: a `dyn` result is refused where a bool is expected
        let wanted = kind.return_types();
        let exact = |t: &Ty| std::mem::discriminant(t) == std::mem::discriminant(&analysis.ty);
        if !wanted.is_empty() && !wanted.iter().any(exact) {
            let got = analysis.ty.name();
            let reason = match wanted {
                [one] => format!("must evaluate to {} but got {got}", one.name()),
                many => {
                    let names: Vec<String> = many.iter().map(Ty::name).collect();
                    format!(
                        "must evaluate to one of [{}] but got {got}",
                        names.join(" ")
                    )
                }
            };
            fail(&mut compiled, reason);
            return compiled;
        }
        compiled.ty = analysis.ty;
        compiled.estimated_cost = analysis.cost;
        compiled.program = Some(program);
        compiled
    }
}

/// Expressions compiled once against the admission variables (upstream `ConditionEvaluator`
/// of a `CompositedCompiler`), evaluated together per request with one lazy, cached
/// evaluation of each variable they use.
pub struct AdmissionExpressions {
    composition: Arc<Composition>,
    compiled: Vec<Compiled>,
}

impl AdmissionExpressions {
    /// Compiles `expressions` of one `kind`, with `variables` (name, expression) composed in
    /// declaration order; compile errors are reported by
    /// [`AdmissionExpressions::compile_errors`] and when evaluated.
    pub fn compile(
        expressions: &[&str],
        kind: ExpressionKind,
        variables: &[(&str, &str)],
        has_params: bool,
    ) -> AdmissionExpressions {
        let mut composition = if variables.is_empty() {
            Composition::new(has_params)
        } else {
            Composition::composited(has_params)
        };
        for (name, expression) in variables {
            // a variable's error is reported by every expression that uses it
            let _ = composition.add_variable(name, expression);
        }
        Arc::new(composition).compile(expressions, kind)
    }

    /// The compile errors, by expression index.
    pub fn compile_errors(&self) -> Vec<(usize, &CompileError)> {
        self.compiled
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.error.as_ref().map(|e| (i, e)))
            .collect()
    }

    /// The compile errors of the composed variables, by variable name.
    pub fn variable_errors(&self) -> Vec<(&str, &CompileError)> {
        self.composition
            .variables
            .iter()
            .filter_map(|v| v.compiled.error.as_ref().map(|e| (v.name.as_str(), e)))
            .collect()
    }

    /// The static cost estimate of expression `index` (cel-go's estimate; unbounded through
    /// `object`, `oldObject` and `params`, which have no schema). Upstream does not limit it
    /// for admission; the runtime per-call limit applies instead.
    pub fn estimated_cost(&self, index: usize) -> Option<u64> {
        self.compiled.get(index).map(|c| c.estimated_cost)
    }

    /// How many expressions there are.
    pub fn len(&self) -> usize {
        self.compiled.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.compiled.is_empty()
    }

    /// Evaluates every expression in order under `budget` (upstream `ForInput`): each one's
    /// value or error, or [`OutOfBudget`] once the budget runs out.
    pub fn evaluate(
        &self,
        inputs: &AdmissionInputs<'_>,
        budget: i64,
    ) -> Result<Evaluation, OutOfBudget> {
        activation::evaluate(&self.composition, &self.compiled, inputs, budget)
    }
}

#[cfg(test)]
mod tests;
