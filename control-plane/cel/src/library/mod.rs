//! The Kubernetes CEL function libraries (upstream `k8s.io/apiserver/pkg/cel/library`) as
//! cel-rust overloads, and the helpers they share to read arguments and build results.

pub(crate) mod authz;
mod format;
mod lists;
mod net;
mod quantity;
mod regex;
mod sets;
mod urls;

use cel::common::types::{CelBool, CelInt, CelList, CelString, Type};
use cel::common::value::{CowVal, FromVal, StaticVal, Val};
use cel::{DeclarationError, Env, ExecutionError};

/// The signature every overload here has: cel-rust passes the receiver of a member call first.
pub(crate) type Overload =
    for<'b, 'v> fn(Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError>;

/// Registers every Kubernetes library on `env` (upstream's base environment for 1.33). The
/// authorizer library's functions are declared everywhere, as upstream's base environment
/// does; only admission expressions have an `authorizer` to call them on.
pub(crate) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    authz::register(env)?;
    lists::register(env)?;
    regex::register(env)?;
    urls::register(env)?;
    quantity::register(env)?;
    net::register(env)?;
    format::register(env)?;
    sets::register(env)?;
    Ok(())
}

/// The names of the functions these libraries add, global and member: what the compile-time
/// check accepts as declared beyond the standard library.
pub(crate) const FUNCTIONS: &[&str] = &[
    "isSorted",
    "sum",
    "min",
    "max",
    "indexOf",
    "lastIndexOf",
    "find",
    "findAll",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
    "quantity",
    "isQuantity",
    "sign",
    "isGreaterThan",
    "isLessThan",
    "compareTo",
    "asApproximateFloat",
    "asInteger",
    "isInteger",
    "add",
    "sub",
    "ip",
    "isIP",
    "ip.isCanonical",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "masked",
    "prefixLength",
    "validate",
    "format.named",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
    "path",
    "group",
    "serviceAccount",
    "resource",
    "subresource",
    "namespace",
    "name",
    "fieldSelector",
    "labelSelector",
    "check",
    "allowed",
    "reason",
    "errored",
    "error",
];

/// The zero-argument `format.<name>()` constructors.
pub(crate) use format::FORMAT_NAMES;

/// Argument `index` as a `T`, or the error cel-go raises for a call no overload matches.
pub(crate) fn arg<'a, 'b, 'v, T>(
    args: &'a [CowVal<'b, 'v>],
    index: usize,
    function: &str,
) -> Result<&'a T, ExecutionError>
where
    T: FromVal<'a, 'v> + Val,
{
    args.get(index)
        .and_then(|value| value.downcast_ref::<T>())
        .ok_or_else(|| no_such_overload(function, args))
}

/// Argument `index` as a string.
pub(crate) fn str_arg<'a, 'b, 'v>(
    args: &'a [CowVal<'b, 'v>],
    index: usize,
    function: &str,
) -> Result<&'a str, ExecutionError> {
    arg::<CelString>(args, index, function).map(|s| s.inner())
}

/// Argument `index` as an int.
pub(crate) fn int_arg(
    args: &[CowVal<'_, '_>],
    index: usize,
    function: &str,
) -> Result<i64, ExecutionError> {
    arg::<CelInt>(args, index, function).map(|i| *i.inner())
}

pub(crate) fn no_such_overload(function: &str, args: &[CowVal<'_, '_>]) -> ExecutionError {
    ExecutionError::no_such_overload(
        function,
        args.iter()
            .map(|a| a.get_type().name().to_string())
            .collect(),
    )
}

/// A runtime error carrying upstream's message; the validator prints the message alone.
pub(crate) fn error(function: &str, message: impl Into<String>) -> ExecutionError {
    ExecutionError::function_error(function, message.into())
}

pub(crate) fn bool_val<'b, 'v>(b: bool) -> CowVal<'b, 'v> {
    CowVal::owned(CelBool::from(b))
}

pub(crate) fn int_val<'b, 'v>(i: i64) -> CowVal<'b, 'v> {
    CowVal::owned(CelInt::from(i))
}

pub(crate) fn string_val<'b, 'v>(s: String) -> CowVal<'b, 'v> {
    CowVal::owned(CelString::from(s))
}

pub(crate) fn string_list<'b, 'v>(items: Vec<String>) -> CowVal<'b, 'v> {
    let items: Vec<Box<dyn Val + 'v>> = items
        .into_iter()
        .map(|s| Box::new(CelString::from(s)) as Box<dyn Val + 'v>)
        .collect();
    CowVal::owned(CelList::from(items))
}

/// Declares a `'static` Rust type as an opaque CEL value of the given type name, compared by
/// `PartialEq`.
macro_rules! opaque_value {
    ($rust:ty, $cel_type:ident, $name:literal) => {
        pub(crate) static $cel_type: cel::common::types::Type =
            cel::common::types::Type::new_unspecified_type($name);

        impl cel::common::value::Val for $rust {
            fn get_type(&self) -> &cel::common::types::Type {
                &$cel_type
            }

            fn cel_type() -> &'static cel::common::types::Type {
                &$cel_type
            }

            fn equals(&self, other: &dyn cel::common::value::Val) -> bool {
                other.downcast_ref::<$rust>().is_some_and(|o| o == self)
            }

            fn clone_as_boxed<'v>(&self) -> Box<dyn cel::common::value::Val + 'v> {
                Box::new(self.clone())
            }

            fn as_any(&self) -> Option<&dyn std::any::Any> {
                Some(self)
            }
        }

        impl cel::common::value::StaticVal for $rust {}
    };
}
pub(crate) use opaque_value;

/// A copy of a value of these libraries that outlives the evaluation it came from (what a
/// composed variable keeps), `None` for any other value: cel-rust's `Value`, through which
/// other values are kept, has no form for them.
pub(crate) fn to_static(value: &dyn Val) -> Option<Box<dyn Val>> {
    fn copy<T: StaticVal + Clone>(value: &dyn Val) -> Option<Box<dyn Val>> {
        value
            .downcast_ref::<T>()
            .map(|v| Box::new(v.clone()) as Box<dyn Val>)
    }
    copy::<urls::Url>(value)
        .or_else(|| copy::<quantity::Quantity>(value))
        .or_else(|| copy::<net::Ip>(value))
        .or_else(|| copy::<net::Cidr>(value))
        .or_else(|| copy::<format::Format>(value))
        .or_else(|| copy::<authz::AuthorizerValue>(value))
        .or_else(|| copy::<authz::PathCheck>(value))
        .or_else(|| copy::<authz::GroupCheck>(value))
        .or_else(|| copy::<authz::ResourceCheck>(value))
        .or_else(|| copy::<authz::Decision>(value))
}

/// Registers a member overload `target.name(args...)`.
pub(crate) fn member(
    env: &mut Env,
    name: &str,
    target: &Type,
    args: &[&Type],
    op: Overload,
) -> Result<(), DeclarationError> {
    let id = overload_id(name, Some(target), args);
    env.add_member_overload(
        name,
        &id,
        target.to_owned(),
        args.iter().map(|t| (*t).to_owned()).collect(),
        op,
    )
}

/// Registers a global overload `name(args...)`.
pub(crate) fn global(
    env: &mut Env,
    name: &str,
    args: &[&Type],
    op: Overload,
) -> Result<(), DeclarationError> {
    let id = overload_id(name, None, args);
    env.add_overload(
        name,
        &id,
        args.iter().map(|t| (*t).to_owned()).collect(),
        op,
    )
}

fn overload_id(name: &str, target: Option<&Type>, args: &[&Type]) -> String {
    let args: Vec<&str> = args.iter().map(|t| t.name()).collect();
    match target {
        Some(target) => format!("k8s_{}.{name}({})", target.name(), args.join(",")),
        None => format!("k8s_{name}({})", args.join(",")),
    }
}
