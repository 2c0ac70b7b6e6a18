//! Upstream's CEL cost and size limits (`k8s.io/apiserver/pkg/apis/cel/config.go`,
//! `apiextensions/validation`): the numbers the static estimate and the runtime guard enforce.

/// The largest runtime cost one rule may spend (`PerCallLimit`, about 0.1s).
pub const PER_CALL_LIMIT: u64 = 1_000_000;

/// The runtime cost all rules of one custom resource may spend together
/// (`RuntimeCELCostBudget`, about 1s).
pub const RUNTIME_CEL_COST_BUDGET: i64 = 10_000_000;

/// The largest estimated cost of one rule times the number of times it can run
/// (`StaticEstimatedCostLimit`).
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;

/// The largest estimated cost of all the rules of a CRD (`StaticEstimatedCRDCostLimit`).
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;

/// The largest request the API server accepts, which bounds unbounded lists, maps and strings
/// (`MaxRequestSizeBytes`).
pub const MAX_REQUEST_SIZE_BYTES: i64 = 3 * 1024 * 1024;

/// The longest message a `messageExpression` may produce
/// (`MaxEvaluatedMessageExpressionSizeBytes`).
pub const MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES: usize = 5 * 1024;

/// The runtime cost the `matchConditions` of one webhook or policy binding may spend together
/// (`RuntimeCELCostBudgetMatchConditions`, about 0.25s).
pub const RUNTIME_CEL_COST_BUDGET_MATCH_CONDITIONS: i64 = 2_500_000;
