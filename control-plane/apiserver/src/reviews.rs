//! The request-only endpoints of authentication.k8s.io — SelfSubjectReview (`kubectl auth
//! whoami`), TokenReview, TokenRequest (`serviceaccounts/{name}/token`, `kubectl create
//! token`) — and of authorization.k8s.io — SelfSubjectAccessReview (`kubectl auth can-i`),
//! SubjectAccessReview, LocalSubjectAccessReview and SelfSubjectRulesReview (`kubectl auth
//! can-i --list`). Each answers from the request, the tenant's key and its RBAC policy;
//! nothing is stored.

use serde_json::{Value, json};

use crate::ApiServer;
use crate::authn::{self, BoundObject, TokenClaims, UserInfo};
use crate::authz;
use crate::error::{ApiError, FieldError, Path};
use crate::meta;
use crate::store::ReadAt;
use crate::tenants::TenantState;
use flotilla_api_machinery::rbac::Attributes;
use k8s_openapi::api::rbac::v1::PolicyRule;

/// Shortest and default lifetime of a requested token (upstream's limits).
const MIN_EXPIRATION_SECONDS: i64 = 600;
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// Longest lifetime upstream accepts (2^32 seconds).
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// `POST …/selfsubjectreviews`: who the caller is.
pub fn self_subject_review(user: &UserInfo) -> Value {
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": meta::now_rfc3339()},
        "status": {"userInfo": authn::user_info_json(user)},
    })
}

/// `POST …/tokenreviews`: whether `spec.token` authenticates anyone in this cluster.
pub async fn token_review(
    server: &ApiServer,
    tenant: &TenantState,
    body: Value,
) -> Result<Value, ApiError> {
    let token = meta::str_at(&body, &["spec", "token"]).unwrap_or("");
    if token.is_empty() {
        return Err(invalid(
            "TokenReview",
            "",
            FieldError::required(&Path::new("spec").child("token"), ""),
        ));
    }
    let audiences = Some(strings(&body["spec"]["audiences"])).filter(|list| !list.is_empty());
    let status = match authn::authenticate_token(server, tenant, token, audiences.as_deref()).await
    {
        Ok((user, matched)) => {
            json!({"authenticated": true, "user": authn::user_info_json(&user), "audiences": matched})
        }
        Err(err) => json!({"user": {}, "error": err.to_string()}),
    };
    let mut spec = body["spec"].clone();
    if let Some(spec) = spec.as_object_mut() {
        // The token is a secret: never echo it.
        spec.remove("token");
    }
    Ok(json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": meta::now_rfc3339()},
        "spec": spec,
        "status": status,
    }))
}

/// The strings of a JSON array (anything else: none).
fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item.as_str().map(String::from))
        .collect()
}

fn invalid(kind: &str, name: &str, error: FieldError) -> ApiError {
    ApiError::invalid("authentication.k8s.io", kind, name, vec![error])
}

/// `POST /api/v1/namespaces/{ns}/serviceaccounts/{name}/token`: a signed token for the
/// service account, optionally bound to a Pod, Secret or Node it dies with.
pub async fn token_request(
    server: &ApiServer,
    tenant: &TenantState,
    namespace: &str,
    name: &str,
    body: Value,
) -> Result<Value, ApiError> {
    let spec = &body["spec"];
    let expiration = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_EXPIRATION_SECONDS);
    let expiration_path = Path::new("spec").child("expirationSeconds");
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(
            "TokenRequest",
            name,
            FieldError::invalid(
                &expiration_path,
                json!(expiration),
                "may not specify a duration less than 10 minutes",
            ),
        ));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(
            "TokenRequest",
            name,
            FieldError::invalid(
                &expiration_path,
                json!(expiration),
                "may not specify a duration larger than 2^32 seconds",
            ),
        ));
    }
    let accounts = server
        .resources
        .find("", "v1", "serviceaccounts")
        .ok_or_else(ApiError::no_such_path)?;
    let account = server
        .store
        .get(&tenant.tenant, accounts, namespace, name, ReadAt::Latest)
        .await?;
    let bound = match spec.get("boundObjectRef").filter(|r| !r.is_null()) {
        Some(reference) => Some(bound_object(server, tenant, namespace, name, reference).await?),
        None => None,
    };
    let issuer = tenant.issuer();
    let mut audiences = strings(&spec["audiences"]);
    if audiences.is_empty() {
        audiences.push(issuer.clone());
    }
    let now = authn::now_seconds();
    let claims = TokenClaims {
        audiences: audiences.clone(),
        issued_at: now,
        expires_at: now + expiration,
        namespace: namespace.to_string(),
        service_account: name.to_string(),
        service_account_uid: meta::uid(&account).to_string(),
        bound,
        id: uuid::Uuid::new_v4().to_string(),
    };
    let key = tenant
        .signing_key()
        .ok_or_else(|| ApiError::internal("this cluster has no service-account signing key"))?;
    let token = key.sign(&claims.to_json(&issuer))?;
    let expires = chrono::DateTime::from_timestamp(claims.expires_at, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default();
    let mut spec = spec.clone();
    if !spec.is_object() {
        spec = json!({});
    }
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(expiration);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": meta::now_rfc3339()},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

/// Resolves `spec.boundObjectRef` to an existing object (upstream's checks and messages).
async fn bound_object(
    server: &ApiServer,
    tenant: &TenantState,
    namespace: &str,
    account: &str,
    reference: &Value,
) -> Result<BoundObject, ApiError> {
    let path = Path::new("spec").child("boundObjectRef");
    let kind = reference["kind"].as_str().unwrap_or("");
    let plural = match kind {
        "Pod" => "pods",
        "Secret" => "secrets",
        "Node" => "nodes",
        _ => {
            return Err(invalid(
                "TokenRequest",
                account,
                FieldError::not_supported(
                    &path.child("kind"),
                    json!(kind),
                    &["Pod", "Secret", "Node"],
                ),
            ));
        }
    };
    let api_version = reference["apiVersion"].as_str().unwrap_or("v1");
    if api_version != "v1" {
        return Err(invalid(
            "TokenRequest",
            account,
            FieldError::not_supported(&path.child("apiVersion"), json!(api_version), &["v1"]),
        ));
    }
    let name = reference["name"].as_str().unwrap_or("");
    if name.is_empty() {
        return Err(invalid(
            "TokenRequest",
            account,
            FieldError::required(&path.child("name"), ""),
        ));
    }
    let resource = server
        .resources
        .find("", "v1", plural)
        .ok_or_else(ApiError::no_such_path)?;
    let object_namespace = if plural == "nodes" { "" } else { namespace };
    let object = server
        .store
        .get(
            &tenant.tenant,
            resource,
            object_namespace,
            name,
            ReadAt::Latest,
        )
        .await?;
    let uid = meta::uid(&object).to_string();
    if let Some(wanted) = reference["uid"].as_str().filter(|u| !u.is_empty())
        && wanted != uid
    {
        return Err(ApiError::conflict(
            &resource.group_resource(),
            name,
            &format!(
                "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    if kind == "Pod" {
        let runs_as = meta::str_at(&object, &["spec", "serviceAccountName"]).unwrap_or("default");
        if runs_as != account {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount \"{account}\" to pod running with different serviceaccount name."
            )));
        }
    }
    Ok(BoundObject {
        kind: kind.to_string(),
        name: name.to_string(),
        uid,
    })
}

// ---------------------------------------------------------------------------------------------
// authorization.k8s.io

/// The attributes a `spec.resourceAttributes` / `spec.nonResourceAttributes` asks about.
fn review_attributes(spec: &Value, user: UserInfo, namespace: Option<&str>) -> Attributes {
    let field = |object: &Value, name: &str| object[name].as_str().unwrap_or("").to_string();
    let resource = &spec["resourceAttributes"];
    if resource.is_object() {
        return Attributes {
            user,
            verb: field(resource, "verb"),
            namespace: namespace.map_or_else(|| field(resource, "namespace"), String::from),
            api_group: field(resource, "group"),
            api_version: field(resource, "version"),
            resource: field(resource, "resource"),
            subresource: field(resource, "subresource"),
            name: field(resource, "name"),
            resource_request: true,
            path: String::new(),
        };
    }
    let non_resource = &spec["nonResourceAttributes"];
    Attributes {
        user,
        verb: field(non_resource, "verb"),
        path: field(non_resource, "path"),
        resource_request: false,
        ..Default::default()
    }
}

fn access_review_invalid(kind: &str, spec: &Value) -> Option<ApiError> {
    let has_resource = spec["resourceAttributes"].is_object();
    let has_non_resource = spec["nonResourceAttributes"].is_object();
    let path = Path::new("spec");
    let error = match (has_resource, has_non_resource) {
        (true, true) => FieldError::invalid(
            &path.child("nonResourceAttributes"),
            spec["nonResourceAttributes"].clone(),
            "cannot be specified in combination with resourceAttributes",
        ),
        (false, false) => FieldError::invalid(
            &path.child("resourceAttributes"),
            Value::Null,
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ),
        _ => return None,
    };
    Some(ApiError::invalid(
        "authorization.k8s.io",
        kind,
        "",
        vec![error],
    ))
}

/// `SelfSubjectAccessReview`, `SubjectAccessReview` and `LocalSubjectAccessReview` (in
/// `namespace`): whether the subject may do what the spec says.
pub async fn access_review(
    server: &ApiServer,
    tenant: &TenantState,
    kind: &str,
    caller: &UserInfo,
    namespace: Option<&str>,
    body: Value,
) -> Result<Value, ApiError> {
    let mut spec = body["spec"].clone();
    if !spec.is_object() {
        spec = json!({});
    }
    if let Some(err) = access_review_invalid(kind, &spec) {
        return Err(err);
    }
    let subject = if kind == "SelfSubjectAccessReview" {
        caller.clone()
    } else {
        let user = spec["user"].as_str().unwrap_or("").to_string();
        let groups = strings(&spec["groups"]);
        if user.is_empty() && groups.is_empty() {
            return Err(ApiError::invalid(
                "authorization.k8s.io",
                kind,
                "",
                vec![FieldError::invalid(
                    &Path::new("spec").child("user"),
                    json!(""),
                    "at least one of user or group must be specified",
                )],
            ));
        }
        let extra = serde_json::from_value(spec["extra"].clone()).unwrap_or_default();
        UserInfo {
            name: user,
            uid: spec["uid"].as_str().unwrap_or("").to_string(),
            groups,
            extra,
        }
    };
    if let Some(namespace) = namespace {
        let asked = spec["resourceAttributes"]["namespace"]
            .as_str()
            .unwrap_or("");
        if !asked.is_empty() && asked != namespace {
            return Err(ApiError::bad_request(format!(
                "spec.resourceAttributes.namespace must match namespace: {namespace}"
            )));
        }
        if spec["resourceAttributes"].is_object() {
            spec["resourceAttributes"]["namespace"] = json!(namespace);
        }
    }
    let attributes = review_attributes(&spec, subject, namespace);
    let (allowed, reason) = authz::allowed(server, tenant, &attributes).await?;
    let mut status = json!({ "allowed": allowed });
    if !reason.is_empty() {
        status["reason"] = json!(reason);
    }
    let mut metadata = json!({"creationTimestamp": meta::now_rfc3339()});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    Ok(json!({
        "kind": kind,
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    }))
}

/// `SelfSubjectRulesReview`: everything the caller may do in `spec.namespace`.
pub async fn rules_review(
    server: &ApiServer,
    tenant: &TenantState,
    caller: &UserInfo,
    body: Value,
) -> Result<Value, ApiError> {
    let namespace = meta::str_at(&body, &["spec", "namespace"]).unwrap_or("");
    if namespace.is_empty() {
        return Err(ApiError::invalid(
            "authorization.k8s.io",
            "SelfSubjectRulesReview",
            "",
            vec![FieldError::required(
                &Path::new("spec").child("namespace"),
                "",
            )],
        ));
    }
    let policy = authz::policy(server, tenant).await?;
    let (rules, incomplete) = policy.rules_for(caller, namespace);
    let (resource_rules, non_resource_rules): (Vec<&PolicyRule>, Vec<&PolicyRule>) = rules
        .iter()
        .partition(|rule| rule.non_resource_urls.as_ref().is_none_or(Vec::is_empty));
    let resource_rules: Vec<Value> = resource_rules
        .into_iter()
        .map(|rule| {
            let mut out = json!({
                "verbs": rule.verbs,
                "apiGroups": rule.api_groups.clone().unwrap_or_default(),
                "resources": rule.resources.clone().unwrap_or_default(),
            });
            if let Some(names) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
                out["resourceNames"] = json!(names);
            }
            out
        })
        .collect();
    let non_resource_rules: Vec<Value> = non_resource_rules
        .into_iter()
        .map(|rule| json!({"verbs": rule.verbs, "nonResourceURLs": rule.non_resource_urls}))
        .collect();
    Ok(json!({
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": meta::now_rfc3339()},
        "spec": {"namespace": namespace},
        "status": {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": incomplete,
        },
    }))
}
