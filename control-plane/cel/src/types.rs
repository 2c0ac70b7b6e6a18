//! The static types of the compile-time check and the declarations it checks calls against:
//! which functions exist (globally or as methods), what they return, and which operand types
//! cel-go's checker would refuse.

use std::sync::{Arc, LazyLock};

use cel::Context;

use crate::library::{FORMAT_NAMES, FUNCTIONS};
use crate::schema::{DeclKind, DeclType};

pub(crate) const URL: &str = "kubernetes.URL";
pub(crate) const QUANTITY: &str = "kubernetes.Quantity";
pub(crate) const IP: &str = "net.IP";
pub(crate) const CIDR: &str = "net.CIDR";
pub(crate) const FORMAT: &str = "kubernetes.NamedFormat";
pub(crate) const AUTHORIZER: &str = "kubernetes.authorization.Authorizer";
pub(crate) const PATH_CHECK: &str = "kubernetes.authorization.PathCheck";
pub(crate) const GROUP_CHECK: &str = "kubernetes.authorization.GroupCheck";
pub(crate) const RESOURCE_CHECK: &str = "kubernetes.authorization.ResourceCheck";
pub(crate) const DECISION: &str = "kubernetes.authorization.Decision";

/// A static type; `Dyn` where nothing is known and checking is left to runtime.
#[derive(Debug, Clone)]
pub(crate) enum Ty {
    Dyn,
    Null,
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    Type,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Object(Arc<DeclType>),
    Opaque(&'static str),
    Optional(Box<Ty>),
}

impl Ty {
    pub fn from_decl(decl: &Arc<DeclType>) -> Ty {
        match &decl.kind {
            DeclKind::Dyn => Ty::Dyn,
            DeclKind::Bool => Ty::Bool,
            DeclKind::Int => Ty::Int,
            DeclKind::Uint => Ty::Uint,
            DeclKind::Double => Ty::Double,
            DeclKind::String => Ty::String,
            DeclKind::Bytes => Ty::Bytes,
            DeclKind::Duration => Ty::Duration,
            DeclKind::Timestamp => Ty::Timestamp,
            DeclKind::List(elem) => Ty::List(Box::new(Ty::from_decl(elem))),
            DeclKind::Map(elem) => Ty::Map(Box::new(Ty::String), Box::new(Ty::from_decl(elem))),
            DeclKind::Object(_) => Ty::Object(decl.clone()),
        }
    }

    /// The name cel-go prints in its messages.
    pub fn name(&self) -> String {
        match self {
            Ty::Dyn => "dyn".to_string(),
            Ty::Null => "null_type".to_string(),
            Ty::Bool => "bool".to_string(),
            Ty::Int => "int".to_string(),
            Ty::Uint => "uint".to_string(),
            Ty::Double => "double".to_string(),
            Ty::String => "string".to_string(),
            Ty::Bytes => "bytes".to_string(),
            Ty::Duration => "google.protobuf.Duration".to_string(),
            Ty::Timestamp => "google.protobuf.Timestamp".to_string(),
            Ty::Type => "type".to_string(),
            Ty::List(elem) => format!("list({})", elem.name()),
            Ty::Map(key, value) => format!("map({}, {})", key.name(), value.name()),
            Ty::Object(decl) => decl.type_name(),
            Ty::Opaque(name) => name.to_string(),
            Ty::Optional(inner) => format!("optional_type({})", inner.name()),
        }
    }

    pub fn is_dyn(&self) -> bool {
        matches!(self, Ty::Dyn)
    }

    /// The value type of an optional (`[?x]`, `{?k: v}` entries), or the type itself.
    pub fn optional_inner(self) -> Ty {
        match self {
            Ty::Optional(inner) => *inner,
            other => other,
        }
    }

    /// Whether the two types unify, `dyn` unifying with everything.
    pub fn same_as(&self, other: &Ty) -> bool {
        match (self, other) {
            (Ty::Dyn, _) | (_, Ty::Dyn) => true,
            (Ty::List(a), Ty::List(b)) | (Ty::Optional(a), Ty::Optional(b)) => a.same_as(b),
            (Ty::Map(ka, va), Ty::Map(kb, vb)) => ka.same_as(kb) && va.same_as(vb),
            (Ty::Object(_), Ty::Object(_)) => true,
            (Ty::Opaque(a), Ty::Opaque(b)) => a == b,
            (a, b) => std::mem::discriminant(a) == std::mem::discriminant(b),
        }
    }

    /// cel-go's `isScalar`: a type whose values all have size 1 in the cost estimate.
    pub fn is_scalar(&self) -> bool {
        match self {
            Ty::Bool | Ty::Double | Ty::Duration | Ty::Int | Ty::Timestamp | Ty::Uint => true,
            Ty::Optional(inner) => inner.is_scalar(),
            _ => false,
        }
    }

    fn is_number(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }
}

const TYPE_NAMES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "optional_type",
    "google.protobuf.Duration",
    "google.protobuf.Timestamp",
    URL,
    QUANTITY,
    IP,
    CIDR,
    FORMAT,
    AUTHORIZER,
    PATH_CHECK,
    GROUP_CHECK,
    RESOURCE_CHECK,
    DECISION,
];

/// Whether `name` names a type (`type(x) == int`).
pub(crate) fn is_type_name(name: &str) -> bool {
    TYPE_NAMES.contains(&name)
}

/// Global functions of the standard library and cel-go's strings extension.
const STANDARD_GLOBALS: &[&str] = &[
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "duration",
    "timestamp",
    "dyn",
    "type",
    "matches",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
    "strings.quote",
];

/// Member functions of the standard library and cel-go's strings extension (version 2, as
/// Kubernetes 1.33 declares it).
const STANDARD_MEMBERS: &[&str] = &[
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getFullYear",
    "getHours",
    "getMilliseconds",
    "getMinutes",
    "getMonth",
    "getSeconds",
    "hasValue",
    "value",
    "orValue",
    "or",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "format",
];

/// The Kubernetes library functions that are called globally; the others are methods.
const LIBRARY_GLOBALS: &[&str] = &[
    "url",
    "isURL",
    "quantity",
    "isQuantity",
    "ip",
    "isIP",
    "ip.isCanonical",
    "cidr",
    "isCIDR",
    "format.named",
    "sets.contains",
    "sets.equivalent",
    "sets.intersects",
];

/// Whether `name` is a global function, namespaced ones included (`format.dns1123Label`).
pub(crate) fn is_global_function(name: &str) -> bool {
    STANDARD_GLOBALS.contains(&name)
        || LIBRARY_GLOBALS.contains(&name)
        || name
            .strip_prefix("format.")
            .is_some_and(|f| FORMAT_NAMES.contains(&f))
}

/// Whether a call to `name` (as a method when `member`) is declared.
pub(crate) fn is_declared(name: &str, member: bool) -> bool {
    if name.starts_with('_') || name.starts_with('@') || name == "!_" || name == "-_" {
        return true;
    }
    if member {
        STANDARD_MEMBERS.contains(&name)
            || (FUNCTIONS.contains(&name) && !LIBRARY_GLOBALS.contains(&name))
            // `cidr(...).ip()` is a method, `ip(...)` a function
            || name == "ip"
    } else {
        is_global_function(name)
    }
}

/// The result type of a call, `Dyn` where it depends on runtime types.
pub(crate) fn result_type(name: &str, target: Option<&Ty>, args: Vec<&Ty>) -> Ty {
    let arg = |i: usize| args.get(i).map_or(Ty::Dyn, |t| (*t).clone());
    match name {
        "_==_"
        | "_!=_"
        | "_<_"
        | "_<=_"
        | "_>_"
        | "_>=_"
        | "@in"
        | "!_"
        | "_&&_"
        | "_||_"
        | "@not_strictly_false"
        | "matches"
        | "contains"
        | "startsWith"
        | "endsWith"
        | "hasValue"
        | "isSorted"
        | "isURL"
        | "isQuantity"
        | "isGreaterThan"
        | "isLessThan"
        | "isInteger"
        | "isIP"
        | "ip.isCanonical"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast"
        | "isCIDR"
        | "containsIP"
        | "containsCIDR"
        | "sets.contains"
        | "sets.equivalent"
        | "sets.intersects"
        | "allowed"
        | "errored"
        | "bool" => Ty::Bool,
        "size" | "int" | "indexOf" | "lastIndexOf" | "sign" | "compareTo" | "asInteger"
        | "family" | "prefixLength" | "getDate" | "getDayOfMonth" | "getDayOfWeek"
        | "getDayOfYear" | "getFullYear" | "getHours" | "getMilliseconds" | "getMinutes"
        | "getMonth" | "getSeconds" => Ty::Int,
        "uint" => Ty::Uint,
        "double" | "asApproximateFloat" => Ty::Double,
        "string" | "charAt" | "lowerAscii" | "upperAscii" | "replace" | "substring" | "trim"
        | "join" | "format" | "strings.quote" | "find" | "getScheme" | "getHost"
        | "getHostname" | "getPort" | "getEscapedPath" | "reason" | "error" => Ty::String,
        "bytes" => Ty::Bytes,
        "duration" => Ty::Duration,
        "timestamp" => Ty::Timestamp,
        "type" => Ty::Type,
        "split" | "findAll" => Ty::List(Box::new(Ty::String)),
        "getQuery" => Ty::Map(
            Box::new(Ty::String),
            Box::new(Ty::List(Box::new(Ty::String))),
        ),
        "url" => Ty::Opaque(URL),
        "quantity" | "add" | "sub" => Ty::Opaque(QUANTITY),
        "ip" => Ty::Opaque(IP),
        "cidr" | "masked" => Ty::Opaque(CIDR),
        "validate" => Ty::Optional(Box::new(Ty::List(Box::new(Ty::String)))),
        "path" => Ty::Opaque(PATH_CHECK),
        "group" => Ty::Opaque(GROUP_CHECK),
        "serviceAccount" => Ty::Opaque(AUTHORIZER),
        "resource" | "subresource" | "namespace" | "name" | "fieldSelector" | "labelSelector" => {
            Ty::Opaque(RESOURCE_CHECK)
        }
        "check" => Ty::Opaque(DECISION),
        "format.named" => Ty::Optional(Box::new(Ty::Opaque(FORMAT))),
        f if f.starts_with("format.") => Ty::Opaque(FORMAT),
        "optional.of" | "optional.ofNonZeroValue" => Ty::Optional(Box::new(arg(0))),
        "optional.none" => Ty::Optional(Box::new(Ty::Dyn)),
        "value" | "orValue" => match target {
            Some(Ty::Optional(inner)) => (**inner).clone(),
            _ => Ty::Dyn,
        },
        "or" => target.cloned().unwrap_or(Ty::Dyn),
        "sum" | "min" | "max" => match target {
            Some(Ty::List(elem)) => (**elem).clone(),
            _ => Ty::Dyn,
        },
        "_?_:_" => {
            let (t, f) = (arg(1), arg(2));
            if t.is_dyn() { f } else { t }
        }
        "_[_]" => match arg(0) {
            Ty::List(elem) => *elem,
            Ty::Map(_, value) => *value,
            _ => Ty::Dyn,
        },
        "_[?_]" => match arg(0) {
            Ty::List(elem) => Ty::Optional(elem),
            Ty::Map(_, value) => Ty::Optional(value),
            _ => Ty::Dyn,
        },
        // a `dyn` operand takes the other's type where a single overload fits it, as cel-go
        // resolves `object.name + '-suffix'` to a string; durations fit several
        "_+_" => match (arg(0), arg(1)) {
            (Ty::Timestamp, _) | (_, Ty::Timestamp) => Ty::Timestamp,
            (Ty::List(a), Ty::List(b)) => Ty::List(if a.is_dyn() { b } else { a }),
            (Ty::Dyn, Ty::Duration) => Ty::Dyn,
            (Ty::Dyn, b) => b,
            (a, _) => a,
        },
        "_-_" => match (arg(0), arg(1)) {
            (Ty::Timestamp, Ty::Timestamp) => Ty::Duration,
            (Ty::Dyn, b @ (Ty::Int | Ty::Uint | Ty::Double)) => b,
            (a, _) => a,
        },
        "_*_" | "_/_" | "_%_" => match (arg(0), arg(1)) {
            (Ty::Dyn, b) => b,
            (a, _) => a,
        },
        "-_" => arg(0),
        "@entries" => Ty::List(Box::new(Ty::List(Box::new(Ty::Dyn)))),
        "@mapInsert" => Ty::Map(Box::new(arg(1)), Box::new(arg(2))),
        "@mapMerge" => arg(1),
        _ => Ty::Dyn,
    }
}

/// cel-go's `found no matching overload` for operand types it can rule out statically.
pub(crate) fn overload_mismatch(name: &str, target: Option<&Ty>, args: &[Ty]) -> Option<String> {
    if target.is_some_and(Ty::is_dyn) || args.iter().any(|a| a.is_dyn() || matches!(a, Ty::Null)) {
        return None;
    }
    let ok = match (name, target, args) {
        ("_==_" | "_!=_", None, [a, b]) => a.same_as(b),
        ("_<_" | "_<=_" | "_>_" | "_>=_", None, [a, b]) => {
            (a.is_number() && b.is_number())
                || (matches!(
                    a,
                    Ty::String | Ty::Bytes | Ty::Bool | Ty::Duration | Ty::Timestamp
                ) && a.same_as(b))
        }
        ("_+_", None, [a, b]) => match (a, b) {
            (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => true,
            (Ty::Int | Ty::Uint | Ty::Double | Ty::String | Ty::Bytes | Ty::Duration, _)
            | (Ty::List(_), Ty::List(_)) => a.same_as(b),
            _ => false,
        },
        ("_-_", None, [a, b]) => match (a, b) {
            (Ty::Timestamp, Ty::Timestamp | Ty::Duration) => true,
            (Ty::Int | Ty::Uint | Ty::Double | Ty::Duration, _) => a.same_as(b),
            _ => false,
        },
        ("_*_" | "_/_", None, [a, b]) => a.is_number() && a.same_as(b),
        ("_%_", None, [a, b]) => matches!(a, Ty::Int | Ty::Uint) && a.same_as(b),
        ("_&&_" | "_||_", None, [a, b]) => matches!(a, Ty::Bool) && matches!(b, Ty::Bool),
        ("!_", None, [a]) => matches!(a, Ty::Bool),
        ("_[_]", None, [container, _]) => matches!(container, Ty::List(_) | Ty::Map(_, _)),
        (_, Some(t), args) => member_target_ok(name, t) && member_args_ok(name, args),
        _ => true,
    };
    if ok {
        return None;
    }
    let names: Vec<String> = args.iter().map(Ty::name).collect();
    let signature = match target {
        Some(t) => format!("{}.({})", t.name(), names.join(", ")),
        None => format!("({})", names.join(", ")),
    };
    Some(format!(
        "found no matching overload for '{name}' applied to '{signature}'"
    ))
}

fn member_target_ok(name: &str, target: &Ty) -> bool {
    match name {
        "contains" | "startsWith" | "endsWith" | "matches" | "charAt" | "lowerAscii"
        | "upperAscii" | "replace" | "split" | "substring" | "trim" | "find" | "findAll"
        | "format" => matches!(target, Ty::String),
        "indexOf" | "lastIndexOf" => matches!(target, Ty::String | Ty::List(_)),
        "size" => matches!(target, Ty::String | Ty::Bytes | Ty::List(_) | Ty::Map(_, _)),
        "join" | "isSorted" | "sum" | "min" | "max" => matches!(target, Ty::List(_)),
        "getScheme" | "getHost" | "getHostname" | "getPort" | "getEscapedPath" | "getQuery" => {
            matches!(target, Ty::Opaque(URL))
        }
        "sign" | "isGreaterThan" | "isLessThan" | "compareTo" | "asApproximateFloat"
        | "asInteger" | "isInteger" | "add" | "sub" => matches!(target, Ty::Opaque(QUANTITY)),
        "family"
        | "isUnspecified"
        | "isLoopback"
        | "isLinkLocalMulticast"
        | "isLinkLocalUnicast"
        | "isGlobalUnicast" => matches!(target, Ty::Opaque(IP)),
        "containsIP" | "containsCIDR" | "masked" | "prefixLength" | "ip" => {
            matches!(target, Ty::Opaque(CIDR))
        }
        "validate" => matches!(target, Ty::Opaque(FORMAT)),
        "hasValue" | "value" | "orValue" | "or" => matches!(target, Ty::Optional(_)),
        "path" | "group" | "serviceAccount" => matches!(target, Ty::Opaque(AUTHORIZER)),
        "resource" => matches!(target, Ty::Opaque(GROUP_CHECK)),
        "subresource" | "namespace" | "name" | "fieldSelector" | "labelSelector" => {
            matches!(target, Ty::Opaque(RESOURCE_CHECK))
        }
        "check" => matches!(target, Ty::Opaque(PATH_CHECK | RESOURCE_CHECK)),
        "allowed" | "reason" | "errored" | "error" => matches!(target, Ty::Opaque(DECISION)),
        "getDate" | "getDayOfMonth" | "getDayOfWeek" | "getDayOfYear" | "getFullYear"
        | "getMonth" => matches!(target, Ty::Timestamp),
        "getHours" | "getMilliseconds" | "getMinutes" | "getSeconds" => {
            matches!(target, Ty::Timestamp | Ty::Duration)
        }
        _ => true,
    }
}

/// The arguments of the authorizer library's methods, which all take strings: one, two for
/// `serviceAccount`, none for a `Decision`'s accessors.
fn member_args_ok(name: &str, args: &[Ty]) -> bool {
    let strings = match name {
        "path" | "group" | "resource" | "subresource" | "namespace" | "name" | "fieldSelector"
        | "labelSelector" | "check" => 1,
        "serviceAccount" => 2,
        "allowed" | "reason" | "errored" | "error" => 0,
        _ => return true,
    };
    args.len() == strings && args.iter().all(|a| matches!(a, Ty::String))
}

static REGEX_CHECK: LazyLock<Option<cel::Program>> =
    LazyLock::new(|| crate::env::env().compile("''.matches(p)").ok());

/// Whether CEL's regex engine accepts `pattern`.
pub(crate) fn regex_compiles(pattern: &str) -> bool {
    let Some(program) = REGEX_CHECK.as_ref() else {
        return true;
    };
    let mut context = Context::with_env(crate::env::env().clone());
    context.add_variable_from_value("p", pattern.to_string());
    program.execute(&context).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_cel_go_refuses() {
        let cases: &[(&str, Option<Ty>, Vec<Ty>, bool)] = &[
            ("_==_", None, vec![Ty::Int, Ty::String], false),
            ("_==_", None, vec![Ty::Int, Ty::Double], false),
            ("_==_", None, vec![Ty::Int, Ty::Dyn], true),
            ("_<_", None, vec![Ty::Int, Ty::Double], true),
            ("_+_", None, vec![Ty::Int, Ty::Double], false),
            ("_+_", None, vec![Ty::Timestamp, Ty::Duration], true),
            ("startsWith", Some(Ty::Int), vec![Ty::String], false),
            ("size", Some(Ty::List(Box::new(Ty::Int))), vec![], true),
        ];
        for (name, target, args, ok) in cases {
            assert_eq!(
                overload_mismatch(name, target.as_ref(), args).is_none(),
                *ok,
                "{name} {target:?} {args:?}"
            );
        }
        assert_eq!(
            overload_mismatch("_==_", None, &[Ty::Int, Ty::String]).as_deref(),
            Some("found no matching overload for '_==_' applied to '(int, string)'")
        );
    }

    #[test]
    fn knows_declared_functions() {
        assert!(is_declared("format.dns1123Label", false));
        assert!(is_declared("isSorted", true));
        assert!(is_declared("ip", true) && is_declared("ip", false));
        assert!(!is_declared("isSorted", false));
        assert!(
            !is_declared("reverse", true),
            "strings v3 is not in Kubernetes 1.33"
        );
        assert!(regex_compiles("^[a-z]+$") && !regex_compiles("("));
    }
}
