//! The `kubernetes.authz` and `kubernetes.authzSelectors` libraries (upstream
//! `library/authz.go`): authorization checks from admission expressions through the
//! `authorizer` variable, `authorizer.group('apps').resource('deployments').check('create')`,
//! answered by the [`RequestAuthorizer`] the caller binds for the request.
//!
//! Every step of a chain is a value; only `check` asks the authorizer, synchronously. The
//! checks are made as the requesting user unless `serviceAccount(namespace, name)` switched to
//! that service account.

use std::fmt;
use std::sync::Arc;

use cel::common::types::STRING_TYPE;
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};
use flotilla_api_machinery::names::{is_dns1123_label, is_dns1123_subdomain};
use flotilla_api_machinery::rbac::{Attributes, UserInfo};

use super::{arg, bool_val, error, member, opaque_value, str_arg, string_val};

/// What an authorizer answered for one check (upstream's `authorizer.Decision`, reason and
/// error, as `Decision` exposes them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerDecision {
    /// Whether the authorizer allowed it; "no opinion" and "deny" are both `false`.
    pub allowed: bool,
    /// Why, in the authorizer's words (may be empty).
    pub reason: String,
    /// What went wrong while deciding, if anything did.
    pub error: Option<String>,
}

/// Decides the checks of the `authorizer` library (upstream `authorizer.Authorizer`, called
/// synchronously: evaluation never waits).
///
/// The attributes carry no field or label selectors: `fieldSelector` and `labelSelector` are
/// accepted as upstream accepts them, but the authorizers this is implemented by (RBAC) ignore
/// selectors, as upstream's RBAC does.
pub trait RequestAuthorizer: Send + Sync {
    /// The decision for `attributes`, whose `user` is who the check is made for.
    fn check(&self, attributes: &Attributes) -> AuthorizerDecision;
}

/// The error of a `check` with no authorizer bound (upstream always binds the server's); the
/// expression goes on with a decision that is not allowed.
const NO_AUTHORIZER: &str = "no authorizer is available to check this request";

/// The authorizer a chain of checks asks: `None` when the caller bound none.
#[derive(Clone)]
struct Backend(Option<Arc<dyn RequestAuthorizer>>);

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "authorizer"
        } else {
            "no authorizer"
        })
    }
}

impl PartialEq for Backend {
    fn eq(&self, other: &Backend) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)),
            (None, None) => true,
            _ => false,
        }
    }
}

/// `kubernetes.authorization.Authorizer`: who checks are made for, and who answers them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuthorizerValue {
    backend: Backend,
    user: UserInfo,
}

impl AuthorizerValue {
    /// Checks for `user`, answered by `authorizer` (upstream `NewAuthorizerVal`).
    pub(crate) fn new(
        authorizer: Option<Arc<dyn RequestAuthorizer>>,
        user: UserInfo,
    ) -> AuthorizerValue {
        AuthorizerValue {
            backend: Backend(authorizer),
            user,
        }
    }

    /// A `ResourceCheck` of `target` by this authorizer (upstream `resourceCheck`, and
    /// `NewResourceAuthorizerVal` for `authorizer.requestResource`).
    pub(crate) fn resource_check(&self, target: ResourceTarget) -> ResourceCheck {
        ResourceCheck {
            authorizer: self.clone(),
            group: target.group,
            resource: target.resource,
            subresource: target.subresource,
            namespace: target.namespace,
            name: target.name,
            field_selector: String::new(),
            label_selector: String::new(),
        }
    }

    fn decide(&self, attributes: Attributes) -> Decision {
        let decision = match &self.backend.0 {
            Some(authorizer) => authorizer.check(&attributes),
            None => AuthorizerDecision {
                allowed: false,
                reason: String::new(),
                error: Some(NO_AUTHORIZER.to_string()),
            },
        };
        Decision(decision)
    }
}

/// The resource a [`ResourceCheck`] starts from.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResourceTarget {
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// `kubernetes.authorization.PathCheck`: a non-resource path.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PathCheck {
    authorizer: AuthorizerValue,
    path: String,
}

/// `kubernetes.authorization.GroupCheck`: an API group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GroupCheck {
    authorizer: AuthorizerValue,
    group: String,
}

/// `kubernetes.authorization.ResourceCheck`: a resource of a group, narrowed step by step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ResourceCheck {
    authorizer: AuthorizerValue,
    group: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
    field_selector: String,
    label_selector: String,
}

/// `kubernetes.authorization.Decision`: what `check` found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Decision(AuthorizerDecision);

opaque_value!(
    AuthorizerValue,
    AUTHORIZER_TYPE,
    "kubernetes.authorization.Authorizer"
);
opaque_value!(
    PathCheck,
    PATH_CHECK_TYPE,
    "kubernetes.authorization.PathCheck"
);
opaque_value!(
    GroupCheck,
    GROUP_CHECK_TYPE,
    "kubernetes.authorization.GroupCheck"
);
opaque_value!(
    ResourceCheck,
    RESOURCE_CHECK_TYPE,
    "kubernetes.authorization.ResourceCheck"
);
opaque_value!(Decision, DECISION_TYPE, "kubernetes.authorization.Decision");

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    for t in [
        &AUTHORIZER_TYPE,
        &PATH_CHECK_TYPE,
        &GROUP_CHECK_TYPE,
        &RESOURCE_CHECK_TYPE,
        &DECISION_TYPE,
    ] {
        env.add_type(t.to_owned())?;
    }
    member(env, "path", &AUTHORIZER_TYPE, &[&STRING_TYPE], path)?;
    member(env, "group", &AUTHORIZER_TYPE, &[&STRING_TYPE], |args| {
        let authorizer = arg::<AuthorizerValue>(&args, 0, "group")?;
        let group = str_arg(&args, 1, "group")?;
        Ok(CowVal::owned(GroupCheck {
            authorizer: authorizer.clone(),
            group: group.to_string(),
        }))
    })?;
    member(
        env,
        "serviceAccount",
        &AUTHORIZER_TYPE,
        &[&STRING_TYPE, &STRING_TYPE],
        service_account,
    )?;
    member(
        env,
        "resource",
        &GROUP_CHECK_TYPE,
        &[&STRING_TYPE],
        resource,
    )?;
    member(
        env,
        "subresource",
        &RESOURCE_CHECK_TYPE,
        &[&STRING_TYPE],
        |a| set(a, "subresource"),
    )?;
    member(
        env,
        "namespace",
        &RESOURCE_CHECK_TYPE,
        &[&STRING_TYPE],
        |a| set(a, "namespace"),
    )?;
    member(env, "name", &RESOURCE_CHECK_TYPE, &[&STRING_TYPE], |a| {
        set(a, "name")
    })?;
    // `kubernetes.authzSelectors`: AuthorizeWithSelectors is on by default in 1.33
    member(
        env,
        "fieldSelector",
        &RESOURCE_CHECK_TYPE,
        &[&STRING_TYPE],
        |a| set(a, "fieldSelector"),
    )?;
    member(
        env,
        "labelSelector",
        &RESOURCE_CHECK_TYPE,
        &[&STRING_TYPE],
        |a| set(a, "labelSelector"),
    )?;
    member(env, "check", &PATH_CHECK_TYPE, &[&STRING_TYPE], path_check)?;
    member(
        env,
        "check",
        &RESOURCE_CHECK_TYPE,
        &[&STRING_TYPE],
        resource_check,
    )?;
    member(env, "allowed", &DECISION_TYPE, &[], |args| {
        Ok(bool_val(arg::<Decision>(&args, 0, "allowed")?.0.allowed))
    })?;
    member(env, "reason", &DECISION_TYPE, &[], |args| {
        Ok(string_val(
            arg::<Decision>(&args, 0, "reason")?.0.reason.clone(),
        ))
    })?;
    member(env, "errored", &DECISION_TYPE, &[], |args| {
        Ok(bool_val(
            arg::<Decision>(&args, 0, "errored")?.0.error.is_some(),
        ))
    })?;
    member(env, "error", &DECISION_TYPE, &[], |args| {
        let decision = arg::<Decision>(&args, 0, "error")?;
        Ok(string_val(decision.0.error.clone().unwrap_or_default()))
    })?;
    Ok(())
}

fn path<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let authorizer = arg::<AuthorizerValue>(&args, 0, "path")?;
    let path = str_arg(&args, 1, "path")?;
    if path.trim().is_empty() {
        return Err(error("path", "path must not be empty"));
    }
    // upstream checks the path as written: a missing leading '/' is not added
    Ok(CowVal::owned(PathCheck {
        authorizer: authorizer.clone(),
        path: path.to_string(),
    }))
}

fn service_account<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let authorizer = arg::<AuthorizerValue>(&args, 0, "serviceAccount")?;
    let namespace = str_arg(&args, 1, "serviceAccount")?;
    let name = str_arg(&args, 2, "serviceAccount")?;
    // upstream validates the name first: `ValidateServiceAccountName`, then
    // `ValidateNamespaceName`
    if !is_dns1123_subdomain(name).is_empty() {
        return Err(error("serviceAccount", "Invalid service account name"));
    }
    if !is_dns1123_label(namespace).is_empty() {
        return Err(error("serviceAccount", "Invalid service account namespace"));
    }
    Ok(CowVal::owned(AuthorizerValue {
        backend: authorizer.backend.clone(),
        user: UserInfo::service_account(namespace, name),
    }))
}

fn resource<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let group = arg::<GroupCheck>(&args, 0, "resource")?;
    let resource = str_arg(&args, 1, "resource")?;
    if resource.trim().is_empty() {
        return Err(error("resource", "resource must not be empty"));
    }
    Ok(CowVal::owned(group.authorizer.resource_check(
        ResourceTarget {
            group: group.group.clone(),
            resource: resource.to_string(),
            ..ResourceTarget::default()
        },
    )))
}

/// A copy of the `ResourceCheck` with the field `function` names set.
fn set<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut check = arg::<ResourceCheck>(&args, 0, function)?.clone();
    let value = str_arg(&args, 1, function)?.to_string();
    let field = match function {
        "subresource" => &mut check.subresource,
        "namespace" => &mut check.namespace,
        "name" => &mut check.name,
        "fieldSelector" => &mut check.field_selector,
        "labelSelector" => &mut check.label_selector,
        _ => return Err(super::no_such_overload(function, &args)),
    };
    *field = value;
    Ok(CowVal::owned(check))
}

fn path_check<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let check = arg::<PathCheck>(&args, 0, "check")?;
    let verb = str_arg(&args, 1, "check")?;
    let attributes = Attributes {
        user: check.authorizer.user.clone(),
        verb: verb.to_string(),
        resource_request: false,
        path: check.path.clone(),
        ..Attributes::default()
    };
    Ok(CowVal::owned(check.authorizer.decide(attributes)))
}

fn resource_check<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let check = arg::<ResourceCheck>(&args, 0, "check")?;
    let verb = str_arg(&args, 1, "check")?;
    let attributes = Attributes {
        user: check.authorizer.user.clone(),
        verb: verb.to_string(),
        namespace: check.namespace.clone(),
        api_group: check.group.clone(),
        // upstream checks every version of the resource
        api_version: "*".to_string(),
        resource: check.resource.clone(),
        subresource: check.subresource.clone(),
        name: check.name.clone(),
        resource_request: true,
        path: String::new(),
    };
    Ok(CowVal::owned(check.authorizer.decide(attributes)))
}

/// A test authorizer: allows what its list names as `verb group/resource` or `verb path`
/// (reason `allowed to <that>`), remembering every question.
#[cfg(test)]
pub(crate) struct Listed {
    pub(crate) allowed: Vec<&'static str>,
    pub(crate) asked: std::sync::Mutex<Vec<Attributes>>,
}

#[cfg(test)]
impl RequestAuthorizer for Listed {
    fn check(&self, attributes: &Attributes) -> AuthorizerDecision {
        if let Ok(mut asked) = self.asked.lock() {
            asked.push(attributes.clone());
        }
        let key = if attributes.resource_request {
            format!(
                "{} {}/{}",
                attributes.verb, attributes.api_group, attributes.resource
            )
        } else {
            format!("{} {}", attributes.verb, attributes.path)
        };
        let allowed = self.allowed.contains(&key.as_str());
        AuthorizerDecision {
            allowed,
            reason: if allowed {
                format!("allowed to {key}")
            } else {
                String::new()
            },
            error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use cel::{Context, Value};

    use super::*;

    fn run(source: &str, authorizer: Option<Arc<dyn RequestAuthorizer>>) -> Value {
        let program = crate::env::env().compile(source).expect("parses");
        let mut context = Context::with_env(crate::env::env().clone());
        let value = AuthorizerValue::new(authorizer, UserInfo::new("alice", &["dev"]));
        context.add_variable_as_val("authorizer", Box::new(value));
        program
            .execute(&context)
            .unwrap_or_else(|e| Value::String(Arc::new(format!("error: {e}"))))
    }

    #[test]
    fn checks_as_the_user_or_the_service_account() {
        let listed = Arc::new(Listed {
            allowed: vec!["create apps/deployments", "get /healthz"],
            asked: Mutex::new(Vec::new()),
        });
        let shared: Arc<dyn RequestAuthorizer> = listed.clone();
        let run = |source: &str| run(source, Some(shared.clone()));
        assert_eq!(
            run("authorizer.group('apps').resource('deployments').check('create').allowed()"),
            Value::Bool(true)
        );
        assert_eq!(
            run("authorizer.path('/healthz').check('get').reason()"),
            Value::String(Arc::new("allowed to get /healthz".to_string()))
        );
        assert_eq!(
            run(
                "authorizer.serviceAccount('ns', 'sa').group('').resource('pods').subresource('log')\
                 .namespace('ns').name('web').labelSelector('a=b').check('get').allowed()"
            ),
            Value::Bool(false)
        );
        assert_eq!(
            run("authorizer.path('/x').check('get').errored()"),
            Value::Bool(false)
        );
        let asked = listed.asked.lock().map(|a| a.clone()).unwrap_or_default();
        let users: Vec<&str> = asked.iter().map(|a| a.user.name.as_str()).collect();
        assert_eq!(
            users,
            ["alice", "alice", "system:serviceaccount:ns:sa", "alice"]
        );
        assert_eq!(
            asked[2],
            Attributes {
                user: UserInfo::service_account("ns", "sa"),
                verb: "get".into(),
                namespace: "ns".into(),
                api_group: String::new(),
                api_version: "*".into(),
                resource: "pods".into(),
                subresource: "log".into(),
                name: "web".into(),
                resource_request: true,
                path: String::new(),
            }
        );
        assert_eq!(asked[2].user.groups[2], "system:authenticated");
        assert!(!asked[1].resource_request && asked[1].path == "/healthz");
    }

    #[test]
    fn refuses_empty_and_invalid_arguments_as_upstream() {
        let error = |source: &str| match run(source, None) {
            Value::String(s) => s.to_string(),
            other => format!("{other:?}"),
        };
        assert!(error("authorizer.path(' ').check('get')").contains("path must not be empty"));
        assert!(
            error("authorizer.group('').resource('').check('get')")
                .contains("resource must not be empty")
        );
        assert!(
            error("authorizer.serviceAccount('ns', 'Not@Valid')")
                .contains("Invalid service account name")
        );
        assert!(
            error("authorizer.serviceAccount('not.a.label', 'sa')")
                .contains("Invalid service account namespace")
        );
    }

    #[test]
    fn without_an_authorizer_a_check_is_an_errored_denial() {
        let decision = "authorizer.group('').resource('pods').check('list')";
        assert_eq!(
            run(&format!("{decision}.allowed()"), None),
            Value::Bool(false)
        );
        assert_eq!(
            run(&format!("{decision}.errored()"), None),
            Value::Bool(true)
        );
        assert_eq!(
            run(&format!("{decision}.error()"), None),
            Value::String(Arc::new(NO_AUTHORIZER.to_string()))
        );
    }
}
