//! The variables admission expressions are checked against (upstream `compile.go`:
//! `BuildRequestType`, `BuildNamespaceType`, `createEnvForOpts`, and composition's
//! `convertCelTypeToDeclType` for `variables`).
//!
//! `object`, `oldObject` and `params` have no schema here, so they are `dyn` and checked at
//! runtime only; `request` and `namespaceObject` have upstream's fixed shapes, so their
//! undefined fields are compile errors. `authorizer` and `authorizer.requestResource` are the
//! authorizer library's `Authorizer` and `ResourceCheck`.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use crate::check::Declared;
use crate::limits::MAX_REQUEST_SIZE_BYTES;
use crate::schema::{DeclField, DeclKind, DeclType};
use crate::types::{self, Ty};

pub(crate) const OBJECT: &str = "object";
pub(crate) const OLD_OBJECT: &str = "oldObject";
pub(crate) const PARAMS: &str = "params";
pub(crate) const REQUEST: &str = "request";
pub(crate) const NAMESPACE_OBJECT: &str = "namespaceObject";
pub(crate) const AUTHORIZER: &str = "authorizer";
/// A `ResourceCheck` of the request's own resource (upstream
/// `RequestResourceAuthorizerVarName`).
pub(crate) const REQUEST_RESOURCE_AUTHORIZER: &str = "authorizer.requestResource";
pub(crate) const VARIABLES: &str = "variables";

fn decl(kind: DeclKind) -> Arc<DeclType> {
    // no bounds are known: the data's own sizes are what the runtime cost uses
    DeclType::simple(kind, 1, MAX_REQUEST_SIZE_BYTES)
}

fn object(fields: &[(&str, Arc<DeclType>)]) -> Arc<DeclType> {
    let fields = fields
        .iter()
        .map(|(name, ty)| {
            (
                (*name).to_string(),
                DeclField {
                    ty: ty.clone(),
                    required: false,
                },
            )
        })
        .collect();
    decl(DeclKind::Object(fields))
}

fn string() -> Arc<DeclType> {
    decl(DeclKind::String)
}

fn strings() -> Arc<DeclType> {
    decl(DeclKind::List(string()))
}

/// `kubernetes.AdmissionRequest` without `uid`, `object` and `oldObject`.
static REQUEST_TYPE: LazyLock<Arc<DeclType>> = LazyLock::new(|| {
    let gvk = object(&[
        ("group", string()),
        ("version", string()),
        ("kind", string()),
    ]);
    let gvr = object(&[
        ("group", string()),
        ("version", string()),
        ("resource", string()),
    ]);
    let user_info = object(&[
        ("username", string()),
        ("uid", string()),
        ("groups", strings()),
        ("extra", decl(DeclKind::Map(strings()))),
    ]);
    object(&[
        ("kind", gvk.clone()),
        ("resource", gvr.clone()),
        ("subResource", string()),
        ("requestKind", gvk),
        ("requestResource", gvr),
        ("requestSubResource", string()),
        ("name", string()),
        ("namespace", string()),
        ("operation", string()),
        ("userInfo", user_info),
        ("dryRun", decl(DeclKind::Bool)),
        ("options", decl(DeclKind::Dyn)),
    ])
});

/// `kubernetes.Namespace`: the metadata, spec and status fields upstream exposes.
static NAMESPACE_TYPE: LazyLock<Arc<DeclType>> = LazyLock::new(|| {
    let timestamp = || decl(DeclKind::Timestamp);
    let int = || decl(DeclKind::Int);
    let string_map = || decl(DeclKind::Map(string()));
    let condition = object(&[
        ("status", string()),
        ("type", string()),
        ("lastTransitionTime", timestamp()),
        ("message", string()),
        ("reason", string()),
    ]);
    object(&[
        (
            "metadata",
            object(&[
                ("name", string()),
                ("generateName", string()),
                ("namespace", string()),
                ("labels", string_map()),
                ("annotations", string_map()),
                ("UID", string()),
                ("creationTimestamp", timestamp()),
                ("deletionGracePeriodSeconds", int()),
                ("deletionTimestamp", timestamp()),
                ("generation", int()),
                ("resourceVersion", string()),
                ("finalizers", strings()),
            ]),
        ),
        ("spec", object(&[("finalizers", strings())])),
        (
            "status",
            object(&[
                ("conditions", decl(DeclKind::List(condition))),
                ("phase", string()),
            ]),
        ),
    ])
});

/// The declared type of a variable's value: upstream keeps primitives, lists and maps and
/// turns everything else (objects, optionals, library types) into `dyn`.
pub(crate) fn variable_decl(ty: &Ty) -> Arc<DeclType> {
    let kind = match ty {
        Ty::Bool => DeclKind::Bool,
        Ty::Int => DeclKind::Int,
        Ty::Uint => DeclKind::Uint,
        Ty::Double => DeclKind::Double,
        Ty::String => DeclKind::String,
        Ty::Bytes => DeclKind::Bytes,
        Ty::Duration => DeclKind::Duration,
        Ty::Timestamp => DeclKind::Timestamp,
        Ty::List(elem) => DeclKind::List(variable_decl(elem)),
        // declarations only have string-keyed maps; other keys are rare enough to leave to
        // runtime
        Ty::Map(key, value) if matches!(**key, Ty::String) => DeclKind::Map(variable_decl(value)),
        _ => DeclKind::Dyn,
    };
    decl(kind)
}

/// The type of `variables`: one field per variable compiled so far.
pub(crate) fn variables_decl(fields: &BTreeMap<String, Arc<DeclType>>) -> Arc<DeclType> {
    let fields = fields
        .iter()
        .map(|(name, ty)| {
            (
                name.clone(),
                DeclField {
                    ty: ty.clone(),
                    required: true,
                },
            )
        })
        .collect();
    decl(DeclKind::Object(fields))
}

/// What one expression may refer to (upstream `OptionalVariableDeclarations` plus
/// composition).
pub(crate) fn declared(
    has_params: bool,
    authorizer: bool,
    variables: Option<&Arc<DeclType>>,
) -> Vec<Declared> {
    let mut declared = vec![
        Declared {
            name: OBJECT,
            ty: Ty::Dyn,
        },
        Declared {
            name: OLD_OBJECT,
            ty: Ty::Dyn,
        },
        Declared {
            name: NAMESPACE_OBJECT,
            ty: Ty::from_decl(&NAMESPACE_TYPE),
        },
        Declared {
            name: REQUEST,
            ty: Ty::from_decl(&REQUEST_TYPE),
        },
    ];
    if has_params {
        declared.push(Declared {
            name: PARAMS,
            ty: Ty::Dyn,
        });
    }
    if authorizer {
        declared.push(Declared {
            name: AUTHORIZER,
            ty: Ty::Opaque(types::AUTHORIZER),
        });
        declared.push(Declared {
            name: REQUEST_RESOURCE_AUTHORIZER,
            ty: Ty::Opaque(types::RESOURCE_CHECK),
        });
    }
    if let Some(variables) = variables {
        declared.push(Declared {
            name: VARIABLES,
            ty: Ty::from_decl(variables),
        });
    }
    declared
}

/// The declared type a static size estimate can use for a variable's paths.
pub(crate) fn static_root(name: &str) -> Option<Arc<DeclType>> {
    match name {
        REQUEST => Some(REQUEST_TYPE.clone()),
        NAMESPACE_OBJECT => Some(NAMESPACE_TYPE.clone()),
        _ => None,
    }
}
