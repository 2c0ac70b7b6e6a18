//! Authorization of tenant requests: the request's attributes (upstream `RequestInfo`), the
//! RBAC policy of the tenant (read from its own Roles and bindings, cached briefly), the
//! `system:masters` short cut, impersonation (`kubectl --as`), and the 403 upstream sends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_api_machinery::rbac::{self, Attributes, Decision, Policy, UserInfo};
use http::{HeaderMap, Method};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef,
};
use serde::de::DeserializeOwned;

use crate::ApiServer;
use crate::error::ApiError;
use crate::store::ListOptions;
use crate::tenants::TenantState;

/// The group upstream authorizes everything for, before RBAC is asked.
pub const SYSTEM_MASTERS: &str = "system:masters";

/// How long a tenant's policy is reused before it is read again. Writes of RBAC objects
/// through this replica drop it at once; those through another replica take this long, as
/// upstream's informer-fed authorizer lags its writes.
const POLICY_TTL: Duration = Duration::from_secs(1);

/// A tenant's cached RBAC policy.
#[derive(Default)]
pub struct PolicyCache {
    cached: std::sync::Mutex<Option<(Arc<Policy>, Instant)>>,
}

impl PolicyCache {
    /// Forgets the cached policy (an RBAC object of the tenant changed).
    pub fn invalidate(&self) {
        if let Ok(mut cached) = self.cached.lock() {
            *cached = None;
        }
    }

    fn fresh(&self) -> Option<Arc<Policy>> {
        let cached = self.cached.lock().ok()?;
        let (policy, read_at) = cached.as_ref()?;
        (read_at.elapsed() < POLICY_TTL).then(|| policy.clone())
    }

    fn remember(&self, policy: Arc<Policy>) {
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((policy, Instant::now()));
        }
    }
}

/// Every object of an rbac.authorization.k8s.io kind in the tenant.
async fn list_all<T: DeserializeOwned>(
    server: &ApiServer,
    state: &TenantState,
    plural: &str,
) -> Result<Vec<T>, ApiError> {
    let resource = server
        .resources
        .find("rbac.authorization.k8s.io", "v1", plural)
        .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
    let page = server
        .store
        .list(&state.tenant, resource, None, &ListOptions::default())
        .await?;
    Ok(page
        .items
        .into_iter()
        .filter_map(|item| serde_json::from_value(item).ok())
        .collect())
}

/// The tenant's RBAC policy, aggregated ClusterRoles resolved.
pub async fn policy(server: &ApiServer, state: &TenantState) -> Result<Arc<Policy>, ApiError> {
    if let Some(policy) = state.policy.fresh() {
        return Ok(policy);
    }
    let cluster_roles: Vec<ClusterRole> = list_all(server, state, "clusterroles").await?;
    let policy = Arc::new(Policy {
        cluster_roles: rbac::aggregate_cluster_roles(&cluster_roles),
        cluster_role_bindings: list_all::<ClusterRoleBinding>(server, state, "clusterrolebindings")
            .await?,
        roles: list_all::<Role>(server, state, "roles").await?,
        role_bindings: list_all::<RoleBinding>(server, state, "rolebindings").await?,
    });
    state.policy.remember(policy.clone());
    Ok(policy)
}

/// Whether `attributes` are allowed: `system:masters` always, otherwise by RBAC.
pub async fn allowed(
    server: &ApiServer,
    state: &TenantState,
    attributes: &Attributes,
) -> Result<(bool, String), ApiError> {
    if attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
        return Ok((true, String::new()));
    }
    // Upstream's chain: the Node authorizer, then RBAC.
    if crate::node::authorize(server, state, attributes).await? == Some(true) {
        return Ok((true, String::new()));
    }
    let policy = policy(server, state).await?;
    let (decision, reason) = policy.authorize(attributes);
    Ok((decision == Decision::Allow, reason))
}

/// The tenant's authorizer as CEL admission expressions ask it (`authorizer.group('')...
/// .check('list')`): synchronously, over one snapshot of the tenant's RBAC policy taken
/// before evaluating, with the `system:masters` short cut. The Node authorizer is left out:
/// it reads nodes and pods from storage, which a synchronous check cannot wait for, and it
/// only ever allows kubelets, which do not write objects that policies check this way.
pub struct PolicySnapshot {
    policy: Arc<Policy>,
}

impl PolicySnapshot {
    /// Decides by `policy`.
    pub fn new(policy: Arc<Policy>) -> Self {
        PolicySnapshot { policy }
    }
}

impl flotilla_cel::admission::RequestAuthorizer for PolicySnapshot {
    fn check(&self, attributes: &Attributes) -> flotilla_cel::admission::AuthorizerDecision {
        if attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
            return flotilla_cel::admission::AuthorizerDecision {
                allowed: true,
                ..Default::default()
            };
        }
        let (decision, reason) = self.policy.authorize(attributes);
        flotilla_cel::admission::AuthorizerDecision {
            allowed: decision == Decision::Allow,
            reason,
            error: None,
        }
    }
}

/// A [`PolicySnapshot`] of the tenant's policy as it is now.
pub async fn snapshot(
    server: &ApiServer,
    state: &TenantState,
) -> Result<Arc<dyn flotilla_cel::admission::RequestAuthorizer>, ApiError> {
    Ok(Arc::new(PolicySnapshot::new(policy(server, state).await?)))
}

/// [`allowed`], or upstream's 403 for the request.
pub async fn authorize(
    server: &ApiServer,
    state: &TenantState,
    attributes: &Attributes,
) -> Result<(), ApiError> {
    let (allowed, reason) = allowed(server, state, attributes).await?;
    if allowed {
        Ok(())
    } else {
        Err(forbidden(attributes, &reason))
    }
}

/// Upstream's 403 `Status` for a request that was not allowed.
pub fn forbidden(attributes: &Attributes, reason: &str) -> ApiError {
    ApiError::forbidden_message(
        &attributes.api_group,
        &attributes.resource,
        &attributes.name,
        rbac::forbidden_status_message(attributes, reason),
    )
}

/// A 403 for the request's object with `message` as the reason (admission's form:
/// `rolebindings.rbac.authorization.k8s.io "x" is forbidden: <message>`).
pub fn forbidden_because(attributes: &Attributes, message: &str) -> ApiError {
    let qualified = if attributes.api_group.is_empty() {
        attributes.resource.clone()
    } else {
        format!("{}.{}", attributes.resource, attributes.api_group)
    };
    let subject = if attributes.name.is_empty() {
        qualified
    } else {
        format!("{qualified} \"{}\"", attributes.name)
    };
    ApiError::forbidden_message(
        &attributes.api_group,
        &attributes.resource,
        &attributes.name,
        format!("{subject} is forbidden: {message}"),
    )
}

// ---------------------------------------------------------------------------------------------
// RBAC escalation prevention

/// Upstream's RBAC escalation checks on writes of roles and bindings: a user may only create
/// or change a Role/ClusterRole whose rules they already hold (or with the `escalate` verb),
/// and only bind a role whose rules they hold (or with the `bind` verb on it). A patch's
/// result is not known here, so patching roles needs `escalate` and patching bindings `bind`.
pub async fn check_rbac_write(
    server: &ApiServer,
    state: &TenantState,
    attributes: &Attributes,
    content_type: &str,
    body: &[u8],
) -> Result<(), ApiError> {
    let role_kind = match attributes.resource.as_str() {
        "roles" | "clusterroles" => true,
        "rolebindings" | "clusterrolebindings" => false,
        _ => return Ok(()),
    };
    if !attributes.resource_request
        || attributes.api_group != rbac::GROUP_NAME
        || !attributes.subresource.is_empty()
        || !matches!(attributes.verb.as_str(), "create" | "update" | "patch")
        || attributes.user.groups.iter().any(|g| g == SYSTEM_MASTERS)
    {
        return Ok(());
    }
    let forbidden = |message: String| forbidden_because(attributes, &message);
    let may = |verb: &str, resource: &str, name: &str| Attributes {
        verb: verb.into(),
        resource: resource.into(),
        name: name.into(),
        subresource: String::new(),
        ..attributes.clone()
    };
    let policy = policy(server, state).await?;
    let object = if attributes.verb == "patch" {
        None
    } else {
        // A body that does not parse is refused by the handler with the proper 400.
        let format = crate::negotiate::body_format(content_type)?;
        match crate::negotiate::parse_body(body, format) {
            Ok(object) => Some(object),
            Err(_) => return Ok(()),
        }
    };
    if role_kind {
        if allowed(
            server,
            state,
            &may("escalate", &attributes.resource, &attributes.name),
        )
        .await?
        .0
        {
            return Ok(());
        }
        let Some(object) = object else {
            return Err(forbidden(
                "patching a role requires the escalate verb on it".into(),
            ));
        };
        let mut rules: Vec<PolicyRule> =
            serde_json::from_value(object["rules"].clone()).unwrap_or_default();
        if !object["aggregationRule"].is_null() {
            // An aggregated role can gather any rules: only a user holding all may create one.
            rules = vec![PolicyRule {
                verbs: vec!["*".into()],
                api_groups: Some(vec!["*".into()]),
                resources: Some(vec!["*".into()]),
                ..Default::default()
            }];
        }
        return policy
            .confirm_no_escalation(&attributes.user, &attributes.namespace, &rules)
            .map_err(|err| forbidden(err.to_string()));
    }
    let Some(object) = object else {
        return if allowed(server, state, &may("bind", "roles", "")).await?.0
            && allowed(server, state, &may("bind", "clusterroles", ""))
                .await?
                .0
        {
            Ok(())
        } else {
            Err(forbidden(
                "patching a binding requires the bind verb on roles".into(),
            ))
        };
    };
    let role_ref: RoleRef = serde_json::from_value(object["roleRef"].clone())
        .map_err(|_| ApiError::bad_request("roleRef is missing or malformed"))?;
    let role_resource = if role_ref.kind == "ClusterRole" {
        "clusterroles"
    } else {
        "roles"
    };
    if allowed(server, state, &may("bind", role_resource, &role_ref.name))
        .await?
        .0
    {
        return Ok(());
    }
    let rules = policy
        .get_role_reference_rules(&role_ref, &attributes.namespace)
        .map_err(|err| forbidden(err.to_string()))?
        .to_vec();
    policy
        .confirm_no_escalation(&attributes.user, &attributes.namespace, &rules)
        .map_err(|err| forbidden(err.to_string()))
}

// ---------------------------------------------------------------------------------------------
// Request attributes

/// Upstream `RequestInfoFactory`: the attributes of a request below `/clusters/{id}` (`rest`
/// are the path segments after it).
pub fn request_attributes(
    user: &UserInfo,
    method: &Method,
    rest: &[&str],
    query: &HashMap<String, String>,
) -> Attributes {
    let path = format!("/{}", rest.join("/"));
    let non_resource = || Attributes {
        user: user.clone(),
        verb: method.as_str().to_ascii_lowercase(),
        resource_request: false,
        path: path.clone(),
        ..Default::default()
    };
    let (api_group, api_version, mut parts) = match rest {
        ["api", version, parts @ ..] if !parts.is_empty() => ("", *version, parts),
        ["apis", group, version, parts @ ..] if !parts.is_empty() => (*group, *version, parts),
        _ => return non_resource(),
    };
    // The deprecated /watch/ path prefix.
    let mut watch_path = false;
    if parts.first() == Some(&"watch") {
        watch_path = true;
        parts = &parts[1..];
    }
    let mut namespace = "";
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        namespace = parts[1];
        // `namespaces/{name}/status|finalize` are the namespace's own subresources.
        if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
            parts = &parts[2..];
        }
    }
    let (resource, name, subresource) = match parts {
        [resource] => (*resource, "", ""),
        [resource, name] => (*resource, *name, ""),
        [resource, name, sub, ..] => (*resource, *name, *sub),
        [] => return non_resource(),
    };
    let mut name = name.to_string();
    // `?watch` makes a list a watch; on a named request (a proxied path's query) it is no
    // watch, as upstream's RequestInfo reads it.
    let watch = watch_path
        || (name.is_empty()
            && flotilla_api_machinery::query::query_bool(query.get("watch").map(|v| v.as_str())));
    let verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if name.is_empty() => "list",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => "",
    }
    .to_string();
    // A list or watch narrowed to one name by a field selector is about that name.
    if matches!(verb.as_str(), "list" | "watch")
        && let Some(selector) = query.get("fieldSelector")
        && let Some(single) = selector
            .strip_prefix("metadata.name=")
            .filter(|rest| !rest.contains(','))
    {
        name = single.to_string();
    }
    Attributes {
        user: user.clone(),
        verb,
        namespace: namespace.to_string(),
        api_group: api_group.to_string(),
        api_version: api_version.to_string(),
        resource: resource.to_string(),
        subresource: subresource.to_string(),
        name,
        resource_request: true,
        path,
    }
}

// ---------------------------------------------------------------------------------------------
// Impersonation

const IMPERSONATE_USER: &str = "impersonate-user";
const IMPERSONATE_GROUP: &str = "impersonate-group";
const IMPERSONATE_UID: &str = "impersonate-uid";
const IMPERSONATE_EXTRA: &str = "impersonate-extra-";

/// Upstream's impersonation filter: when the request asks to act as someone else, `user` must
/// be allowed to `impersonate` each asked-for user, service account, group, uid and extra; the
/// request then runs as that identity. Without impersonation headers, `user` is returned.
pub async fn impersonate(
    server: &ApiServer,
    state: &TenantState,
    user: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok().map(String::from))
            .collect()
    };
    let wanted_user = values(IMPERSONATE_USER).into_iter().next();
    let groups = values(IMPERSONATE_GROUP);
    let uid = values(IMPERSONATE_UID).into_iter().next();
    let mut extra: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for (name, value) in headers {
        if let Some(key) = name.as_str().strip_prefix(IMPERSONATE_EXTRA)
            && let Ok(value) = value.to_str()
        {
            let key = percent_decode(key);
            extra.entry(key).or_default().push(value.to_string());
        }
    }
    let Some(wanted_user) = wanted_user else {
        if groups.is_empty() && uid.is_none() && extra.is_empty() {
            return Ok(user);
        }
        return Err(ApiError::internal(
            "requested impersonation of groups, uid or extras without impersonating a user",
        ));
    };
    let check = |resource: &str, namespace: &str, name: &str, subresource: &str| Attributes {
        user: user.clone(),
        verb: "impersonate".into(),
        namespace: namespace.into(),
        api_group: if matches!(resource, "uids" | "userextras") {
            "authentication.k8s.io".into()
        } else {
            String::new()
        },
        resource: resource.into(),
        subresource: subresource.into(),
        name: name.into(),
        resource_request: true,
        ..Default::default()
    };
    let mut asks = Vec::new();
    match wanted_user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((namespace, name)) => asks.push(check("serviceaccounts", namespace, name, "")),
        None => asks.push(check("users", "", &wanted_user, "")),
    }
    for group in &groups {
        asks.push(check("groups", "", group, ""));
    }
    if let Some(uid) = &uid {
        asks.push(check("uids", "", uid, ""));
    }
    for (key, values) in &extra {
        for value in values {
            asks.push(check("userextras", "", value, key));
        }
    }
    for ask in &asks {
        authorize(server, state, ask).await?;
    }
    let mut impersonated_groups = groups;
    if let Some((namespace, _)) = wanted_user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        && impersonated_groups.is_empty()
    {
        impersonated_groups.push("system:serviceaccounts".into());
        impersonated_groups.push(format!("system:serviceaccounts:{namespace}"));
    }
    if wanted_user != rbac::ANONYMOUS
        && !impersonated_groups
            .iter()
            .any(|g| g == rbac::ALL_AUTHENTICATED)
    {
        impersonated_groups.push(rbac::ALL_AUTHENTICATED.into());
    }
    Ok(UserInfo {
        name: wanted_user,
        uid: uid.unwrap_or_default(),
        groups: impersonated_groups,
        extra,
    })
}

/// Header keys of extras are percent-encoded (upstream `impersonate-extra-` decoding).
fn percent_decode(text: &str) -> String {
    form_urlencoded::parse(format!("k={text}").as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        request_attributes(&UserInfo::anonymous(), &method, &segments, &query)
    }

    /// (method, path, query, (verb, namespace, group, resource, name, subresource)).
    type Case = (
        Method,
        &'static str,
        &'static [(&'static str, &'static str)],
        (
            &'static str,
            &'static str,
            &'static str,
            &'static str,
            &'static str,
            &'static str,
        ),
    );

    #[test]
    fn request_info_follows_upstream() {
        let cases: Vec<Case> = vec![
            (
                Method::GET,
                "/api/v1/namespaces/team/pods",
                &[],
                ("list", "team", "", "pods", "", ""),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team/pods/web",
                &[],
                ("get", "team", "", "pods", "web", ""),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team/pods",
                &[("watch", "true")],
                ("watch", "team", "", "pods", "", ""),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/team/pods",
                &[],
                ("watch", "team", "", "pods", "", ""),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/team/pods/web/eviction",
                &[],
                ("create", "team", "", "pods", "web", "eviction"),
            ),
            // The proxy subresources: the method's verb, the name with its port, whatever
            // the proxied path and query.
            (
                Method::GET,
                "/api/v1/namespaces/team/pods/web:8080/proxy/metrics",
                &[("watch", "true")],
                ("get", "team", "", "pods", "web:8080", "proxy"),
            ),
            (
                Method::HEAD,
                "/api/v1/namespaces/team/services/https:web:443/proxy/",
                &[],
                ("get", "team", "", "services", "https:web:443", "proxy"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/team/services/web/proxy/a/b",
                &[],
                ("create", "team", "", "services", "web", "proxy"),
            ),
            (
                Method::PUT,
                "/api/v1/nodes/n1/proxy/configz",
                &[],
                ("update", "", "", "nodes", "n1", "proxy"),
            ),
            (
                Method::PATCH,
                "/api/v1/nodes/n1:9100/proxy",
                &[],
                ("patch", "", "", "nodes", "n1:9100", "proxy"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/team/pods/web/proxy/x",
                &[],
                ("delete", "team", "", "pods", "web", "proxy"),
            ),
            (
                Method::OPTIONS,
                "/api/v1/namespaces/team/pods/web/proxy/x",
                &[],
                ("", "team", "", "pods", "web", "proxy"),
            ),
            (
                Method::PATCH,
                "/apis/apps/v1/namespaces/team/deployments/web/scale",
                &[],
                ("patch", "team", "apps", "deployments", "web", "scale"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/team/configmaps",
                &[],
                ("deletecollection", "team", "", "configmaps", "", ""),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/team",
                &[],
                ("get", "team", "", "namespaces", "team", ""),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/team/finalize",
                &[],
                ("update", "team", "", "namespaces", "team", "finalize"),
            ),
            (
                Method::GET,
                "/api/v1/nodes",
                &[("fieldSelector", "metadata.name=n1")],
                ("list", "", "", "nodes", "n1", ""),
            ),
            (
                Method::GET,
                "/apis/rbac.authorization.k8s.io/v1/clusterroles/view",
                &[],
                (
                    "get",
                    "",
                    "rbac.authorization.k8s.io",
                    "clusterroles",
                    "view",
                    "",
                ),
            ),
        ];
        for (method, path, query, (verb, namespace, group, resource, name, sub)) in cases {
            let got = attributes(method, path, query);
            assert!(got.resource_request, "{path}");
            assert_eq!(
                (
                    got.verb.as_str(),
                    got.namespace.as_str(),
                    got.api_group.as_str(),
                    got.resource.as_str(),
                    got.name.as_str(),
                    got.subresource.as_str()
                ),
                (verb, namespace, group, resource, name, sub),
                "{path}"
            );
        }
        for path in [
            "/api",
            "/apis",
            "/apis/apps/v1",
            "/healthz",
            "/openapi/v3/apis/apps/v1",
            "/version",
        ] {
            let got = attributes(Method::GET, path, &[]);
            assert!(!got.resource_request, "{path}");
            assert_eq!((got.verb.as_str(), got.path.as_str()), ("get", path));
        }
    }

    /// CEL's `authorizer` checks decide as the tenant's RBAC does, `system:masters` always
    /// allowed.
    #[test]
    fn a_policy_snapshot_decides_cel_checks_by_rbac() -> anyhow::Result<()> {
        use flotilla_cel::admission::{
            AdmissionExpressions, AdmissionInputs, ExpressionKind, ExpressionValue,
            RequestAuthorizer,
        };
        use serde_json::json;

        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": "secret-reader", "namespace": "apps"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
        }))?;
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "alice-reads", "namespace": "apps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
            "subjects": [{"kind": "User", "name": "alice"}],
        }))?;
        let policy = Policy {
            roles: vec![role],
            role_bindings: vec![binding],
            ..Policy::default()
        };
        let authorizer: Arc<dyn RequestAuthorizer> =
            Arc::new(PolicySnapshot::new(Arc::new(policy)));
        let compiled = AdmissionExpressions::compile(
            &[
                "authorizer.group('').resource('secrets').namespace('apps').check('list').allowed()",
                "authorizer.group('').resource('secrets').namespace('apps').check('list').reason()",
                "authorizer.group('').resource('secrets').namespace('other').check('list').allowed()",
            ],
            ExpressionKind::Variable,
            &[],
            false,
        );
        let decide = |user: serde_json::Value| {
            let request = json!({"userInfo": user});
            let inputs = AdmissionInputs {
                object: None,
                old_object: None,
                request: &request,
                params: None,
                namespace_object: None,
                authorizer: Some(&authorizer),
            };
            compiled
                .evaluate(&inputs, 10_000_000)
                .map(|evaluation| evaluation.results)
                .unwrap_or_default()
        };
        let yes = || Ok(ExpressionValue::Bool(true));
        let no = || Ok(ExpressionValue::Bool(false));
        let reason = |text: &str| Ok(ExpressionValue::String(text.to_string()));
        assert_eq!(
            decide(json!({"username": "alice", "groups": ["system:authenticated"]})),
            [
                yes(),
                reason(
                    "RBAC: allowed by RoleBinding \"alice-reads/apps\" of Role \"secret-reader\" to User \"alice\""
                ),
                no()
            ]
        );
        assert_eq!(
            decide(json!({"username": "bob", "groups": ["system:authenticated"]})),
            [no(), reason(""), no()]
        );
        assert_eq!(
            decide(json!({"username": "admin", "groups": [SYSTEM_MASTERS]})),
            [yes(), reason(""), yes()]
        );
        Ok(())
    }
}
