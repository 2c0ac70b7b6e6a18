//! RBAC authorization as pure functions over a snapshot of RBAC objects: upstream's
//! `RBACAuthorizer` and rule resolver (`plugin/pkg/auth/authorizer/rbac`,
//! `pkg/registry/rbac/validation/rule.go`), rule matching (`pkg/apis/rbac/v1/evaluation_helpers.go`),
//! escalation checks (`validation.Covers`, `CompactRules`, `ConfirmNoEscalation`), ClusterRole
//! aggregation (the clusterrole-aggregation controller's sync), the Forbidden message
//! (`responsewriters.forbiddenMessage`) and the bootstrap ClusterRoles and ClusterRoleBindings
//! (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy`).
//!
//! The caller supplies a [`Policy`] (whatever its watch cache holds) and the request's
//! [`Attributes`]; nothing here reads storage, so every decision is reproducible in a table test.
//! Objects are the k8s-openapi `rbac.authorization.k8s.io/v1` types.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef,
    Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::field::{aggregate_messages, go_quote};
use crate::selector::{self, Operator, Requirement, SelectorError};

/// The RBAC API group (upstream `rbacv1.GroupName`).
pub const GROUP_NAME: &str = "rbac.authorization.k8s.io";
/// Matches every verb (upstream `rbacv1.VerbAll`).
pub const VERB_ALL: &str = "*";
/// Matches every API group (upstream `rbacv1.APIGroupAll`).
pub const API_GROUP_ALL: &str = "*";
/// Matches every resource (upstream `rbacv1.ResourceAll`).
pub const RESOURCE_ALL: &str = "*";
/// Matches every non-resource URL (upstream `rbacv1.NonResourceAll`).
pub const NON_RESOURCE_ALL: &str = "*";
/// Subject kind for a user (upstream `rbacv1.UserKind`).
pub const USER_KIND: &str = "User";
/// Subject kind for a group (upstream `rbacv1.GroupKind`).
pub const GROUP_KIND: &str = "Group";
/// Subject kind for a service account (upstream `rbacv1.ServiceAccountKind`).
pub const SERVICE_ACCOUNT_KIND: &str = "ServiceAccount";
/// Annotation that lets the apiserver reconcile a bootstrap object on upgrade (upstream
/// `rbacv1.AutoUpdateAnnotationKey`).
pub const AUTO_UPDATE_ANNOTATION_KEY: &str = "rbac.authorization.kubernetes.io/autoupdate";
/// Label on every bootstrap object (upstream `bootstrappolicy.Label`).
pub const BOOTSTRAPPING_LABEL_KEY: &str = "kubernetes.io/bootstrapping";
/// Value of [`BOOTSTRAPPING_LABEL_KEY`].
pub const BOOTSTRAPPING_LABEL_VALUE: &str = "rbac-defaults";
/// Label that aggregates a ClusterRole into `admin`.
pub const AGGREGATE_TO_ADMIN_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-admin";
/// Label that aggregates a ClusterRole into `edit` (and so `admin`).
pub const AGGREGATE_TO_EDIT_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-edit";
/// Label that aggregates a ClusterRole into `view` (and so `edit` and `admin`).
pub const AGGREGATE_TO_VIEW_LABEL: &str = "rbac.authorization.k8s.io/aggregate-to-view";

/// Group of cluster superusers (upstream `user.SystemPrivilegedGroup`).
pub const SYSTEM_PRIVILEGED_GROUP: &str = "system:masters";
/// Group of every authenticated user (upstream `user.AllAuthenticated`).
pub const ALL_AUTHENTICATED: &str = "system:authenticated";
/// Group of unauthenticated requests (upstream `user.AllUnauthenticated`).
pub const ALL_UNAUTHENTICATED: &str = "system:unauthenticated";
/// User name of unauthenticated requests (upstream `user.Anonymous`).
pub const ANONYMOUS: &str = "system:anonymous";
/// Group of kubelets (upstream `user.NodesGroup`).
pub const NODES_GROUP: &str = "system:nodes";
/// Group allowed to read the monitoring endpoints (upstream `user.MonitoringGroup`).
pub const MONITORING_GROUP: &str = "system:monitoring";
/// User of kube-proxy (upstream `user.KubeProxy`).
pub const KUBE_PROXY: &str = "system:kube-proxy";
/// User of kube-controller-manager (upstream `user.KubeControllerManager`).
pub const KUBE_CONTROLLER_MANAGER: &str = "system:kube-controller-manager";
/// User of kube-scheduler (upstream `user.KubeScheduler`).
pub const KUBE_SCHEDULER: &str = "system:kube-scheduler";
/// Prefix of service account user names (upstream `serviceaccount.ServiceAccountUsernamePrefix`).
pub const SERVICE_ACCOUNT_USERNAME_PREFIX: &str = "system:serviceaccount:";
/// Group of every service account (upstream `serviceaccount.AllServiceAccountsGroup`).
pub const ALL_SERVICE_ACCOUNTS_GROUP: &str = "system:serviceaccounts";

/// Why the policy could not be fully evaluated, or why a grant was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RbacError {
    /// A binding refers to a ClusterRole the snapshot does not hold (upstream's lister
    /// `NotFound`).
    #[error("clusterrole.rbac.authorization.k8s.io {} not found", go_quote(.name))]
    ClusterRoleNotFound {
        /// The ClusterRole's name.
        name: String,
    },
    /// A RoleBinding refers to a Role its namespace does not hold.
    #[error("role.rbac.authorization.k8s.io {} not found", go_quote(.name))]
    RoleNotFound {
        /// The binding's namespace, where the Role was looked up.
        namespace: String,
        /// The Role's name.
        name: String,
    },
    /// A roleRef kind other than `Role` and `ClusterRole`.
    #[error("unsupported role reference kind: {}", go_quote(.kind))]
    UnsupportedRoleRefKind {
        /// The kind found.
        kind: String,
    },
    /// Upstream `ConfirmNoEscalation`: the user tried to grant rules it does not hold. The
    /// apiserver wraps this in `NewForbidden`, e.g.
    /// `roles.rbac.authorization.k8s.io "r" is forbidden: user "x" (groups=[...]) is attempting ...`.
    #[error(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}{}",
        go_quote(.user),
        go_quote_list(.groups),
        .missing.join("\n"),
        resolution_errors_suffix(.resolution_errors)
    )]
    Escalation {
        /// The requesting user's name.
        user: String,
        /// The requesting user's groups.
        groups: Vec<String>,
        /// The missing rules, compacted and rendered with [`compact_string`], sorted.
        missing: Vec<String>,
        /// Errors met while resolving the user's own rules (they may explain the refusal).
        resolution_errors: Vec<String>,
    },
}

fn resolution_errors_suffix(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        // Upstream prints a one-element `[]error` holding the resolver's aggregate with `%v`.
        format!("; resolution errors: [{}]", aggregate_messages(errors))
    }
}

/// The authenticated identity of a request (upstream `user.Info` / `DefaultInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name, e.g. `alice` or `system:serviceaccount:team:reader`.
    pub name: String,
    /// A unique value for this user across time.
    pub uid: String,
    /// The groups the user belongs to.
    pub groups: Vec<String>,
    /// Extra information from the authenticator (not used by RBAC).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with a name and groups.
    pub fn new(name: impl Into<String>, groups: &[&str]) -> Self {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..UserInfo::default()
        }
    }

    /// The identity of an unauthenticated request (`system:anonymous` in
    /// `system:unauthenticated`).
    pub fn anonymous() -> Self {
        UserInfo::new(ANONYMOUS, &[ALL_UNAUTHENTICATED])
    }

    /// A service account as an authenticated request carries it: upstream
    /// `serviceaccount.UserInfo` groups plus `system:authenticated`, which upstream's
    /// authenticator chain adds to every authenticated user.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            name: make_username(namespace, name),
            groups: vec![
                ALL_SERVICE_ACCOUNTS_GROUP.to_string(),
                format!("{ALL_SERVICE_ACCOUNTS_GROUP}:{namespace}"),
                ALL_AUTHENTICATED.to_string(),
            ],
            ..UserInfo::default()
        }
    }
}

/// The user name of a service account (upstream `serviceaccount.MakeUsername`).
pub fn make_username(namespace: &str, name: &str) -> String {
    format!("{SERVICE_ACCOUNT_USERNAME_PREFIX}{namespace}:{name}")
}

/// Whether `username` is the service account `namespace/name` (upstream
/// `serviceaccount.MatchesUsername`), without building the string.
pub fn matches_username(namespace: &str, name: &str, username: &str) -> bool {
    username
        .strip_prefix(SERVICE_ACCOUNT_USERNAME_PREFIX)
        .and_then(|rest| rest.strip_prefix(namespace))
        .and_then(|rest| rest.strip_prefix(':'))
        == Some(name)
}

/// What a request asks to do (upstream `authorizer.AttributesRecord`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Who is asking.
    pub user: UserInfo,
    /// The verb: `get`, `list`, `watch`, `create`, ... for resources; the lowercased HTTP
    /// method for non-resource paths.
    pub verb: String,
    /// The namespace, empty for cluster-scoped resources and non-resource requests.
    pub namespace: String,
    /// The API group, empty for the core group.
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The resource, e.g. `pods`.
    pub resource: String,
    /// The subresource, e.g. `log`, or empty.
    pub subresource: String,
    /// The object name, empty for `list`, `watch` of a collection and `create`.
    pub name: String,
    /// True for API resource requests, false for non-resource paths such as `/healthz`.
    pub resource_request: bool,
    /// The request path; the one RBAC matches for non-resource requests.
    pub path: String,
}

/// An authorizer's answer (upstream `authorizer.Decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The request is explicitly denied; RBAC never says this, it has no deny rules.
    Deny,
    /// The request is allowed.
    Allow,
    /// This authorizer does not allow it; the next one in the chain may.
    NoOpinion,
}

/// Where a rule came from: the binding and the subject in it that matched the user (upstream's
/// `clusterRoleBindingDescriber` / `roleBindingDescriber`, which name the allow reason).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RuleSource<'a> {
    /// A ClusterRoleBinding.
    ClusterRoleBinding {
        /// The binding.
        binding: &'a ClusterRoleBinding,
        /// Its first subject that matched.
        subject: &'a Subject,
    },
    /// A RoleBinding in the request namespace.
    RoleBinding {
        /// The binding.
        binding: &'a RoleBinding,
        /// Its first subject that matched.
        subject: &'a Subject,
    },
}

impl std::fmt::Display for RuleSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleSource::ClusterRoleBinding { binding, subject } => write!(
                f,
                "ClusterRoleBinding {} of {} {} to {}",
                go_quote(object_name(&binding.metadata)),
                binding.role_ref.kind,
                go_quote(&binding.role_ref.name),
                describe_subject(subject, ""),
            ),
            RuleSource::RoleBinding { binding, subject } => {
                let namespace = object_namespace(&binding.metadata);
                write!(
                    f,
                    "RoleBinding {} of {} {} to {}",
                    go_quote(&format!("{}/{namespace}", object_name(&binding.metadata))),
                    binding.role_ref.kind,
                    go_quote(&binding.role_ref.name),
                    describe_subject(subject, namespace),
                )
            }
        }
    }
}

fn describe_subject(subject: &Subject, binding_namespace: &str) -> String {
    if subject.kind == SERVICE_ACCOUNT_KIND {
        let namespace = match subject.namespace.as_deref() {
            Some(namespace) if !namespace.is_empty() => namespace,
            _ => binding_namespace,
        };
        format!(
            "{} {}",
            subject.kind,
            go_quote(&format!("{}/{namespace}", subject.name))
        )
    } else {
        format!("{} {}", subject.kind, go_quote(&subject.name))
    }
}

/// One step of [`Policy::visit_rules_for`]: a rule that applies, or an error resolving a binding.
#[derive(Debug, Clone, PartialEq)]
pub enum Visit<'a> {
    /// A rule granted to the user by `source`.
    Rule {
        /// The binding that grants it.
        source: RuleSource<'a>,
        /// The rule.
        rule: &'a PolicyRule,
    },
    /// A binding that applies to the user but whose role could not be resolved.
    Error(RbacError),
}

/// A snapshot of the RBAC objects of one cluster: what upstream's authorizer reads from its
/// informers. Roles and RoleBindings carry their namespace in `metadata.namespace`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Policy {
    /// Every ClusterRole (aggregated ones as stored, i.e. after [`aggregate_cluster_roles`]).
    pub cluster_roles: Vec<ClusterRole>,
    /// Every ClusterRoleBinding.
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    /// Every Role, of every namespace.
    pub roles: Vec<Role>,
    /// Every RoleBinding, of every namespace.
    pub role_bindings: Vec<RoleBinding>,
}

impl Policy {
    /// Upstream `RBACAuthorizer.Authorize`: [`Decision::Allow`] with `RBAC: allowed by <source>`
    /// as soon as one rule allows the request, otherwise [`Decision::NoOpinion`] with an empty
    /// reason, or `RBAC: <errors>` when some applicable binding's role could not be resolved.
    pub fn authorize(&self, attributes: &Attributes) -> (Decision, String) {
        let mut allowed_by = None;
        let mut errors = Vec::new();
        self.visit_rules_for(
            &attributes.user,
            &attributes.namespace,
            |visit| match visit {
                Visit::Rule { source, rule } => {
                    if rule_allows(attributes, rule) {
                        allowed_by = Some(source.to_string());
                        false
                    } else {
                        true
                    }
                }
                Visit::Error(error) => {
                    errors.push(error);
                    true
                }
            },
        );
        if let Some(source) = allowed_by {
            return (Decision::Allow, format!("RBAC: allowed by {source}"));
        }
        if errors.is_empty() {
            (Decision::NoOpinion, String::new())
        } else {
            (Decision::NoOpinion, format!("RBAC: {}", aggregate(&errors)))
        }
    }

    /// Upstream `DefaultRuleResolver.VisitRulesFor`: calls `visitor` with every rule bound to
    /// `user` by a ClusterRoleBinding, then (for a non-empty `namespace`) by a RoleBinding in
    /// `namespace`, in snapshot order, and with an error for every applicable binding whose role
    /// is missing. Visiting stops when `visitor` returns false.
    pub fn visit_rules_for<'a>(
        &'a self,
        user: &UserInfo,
        namespace: &str,
        mut visitor: impl FnMut(Visit<'a>) -> bool,
    ) {
        for binding in &self.cluster_role_bindings {
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), "") else {
                continue;
            };
            let rules = match self.get_role_reference_rules(&binding.role_ref, "") {
                Ok(rules) => rules,
                Err(error) => {
                    if !visitor(Visit::Error(error)) {
                        return;
                    }
                    continue;
                }
            };
            let source = RuleSource::ClusterRoleBinding { binding, subject };
            for rule in rules {
                if !visitor(Visit::Rule { source, rule }) {
                    return;
                }
            }
        }

        if namespace.is_empty() {
            return;
        }
        for binding in &self.role_bindings {
            if object_namespace(&binding.metadata) != namespace {
                continue;
            }
            let Some(subject) = applies_to(user, binding.subjects.as_deref(), namespace) else {
                continue;
            };
            let rules = match self.get_role_reference_rules(&binding.role_ref, namespace) {
                Ok(rules) => rules,
                Err(error) => {
                    if !visitor(Visit::Error(error)) {
                        return;
                    }
                    continue;
                }
            };
            let source = RuleSource::RoleBinding { binding, subject };
            for rule in rules {
                if !visitor(Visit::Rule { source, rule }) {
                    return;
                }
            }
        }
    }

    /// The effective rules of `user` in `namespace` (cluster-wide bindings plus that namespace's
    /// bindings), and whether the list is incomplete because some role could not be resolved:
    /// what SelfSubjectRulesReview (`kubectl auth can-i --list`) reports. Upstream splits the
    /// rules into resource rules (those with `resources`) and non-resource rules (those with
    /// `nonResourceURLs`) when it builds the review status.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> (Vec<PolicyRule>, bool) {
        let (rules, errors) = self.rules_and_errors_for(user, namespace);
        (rules, !errors.is_empty())
    }

    /// Upstream `DefaultRuleResolver.RulesFor`: the rules, and the resolution errors.
    fn rules_and_errors_for(
        &self,
        user: &UserInfo,
        namespace: &str,
    ) -> (Vec<PolicyRule>, Vec<RbacError>) {
        let mut rules = Vec::new();
        let mut errors = Vec::new();
        self.visit_rules_for(user, namespace, |visit| {
            match visit {
                Visit::Rule { rule, .. } => rules.push(rule.clone()),
                Visit::Error(error) => errors.push(error),
            }
            true
        });
        (rules, errors)
    }

    /// Upstream `DefaultRuleResolver.GetRoleReferenceRules`: the rules of the role a binding in
    /// `binding_namespace` (empty for a ClusterRoleBinding) refers to. The roleRef's apiGroup is
    /// not checked, as upstream (validation already pins it).
    pub fn get_role_reference_rules(
        &self,
        role_ref: &RoleRef,
        binding_namespace: &str,
    ) -> Result<&[PolicyRule], RbacError> {
        match role_ref.kind.as_str() {
            "Role" => self
                .roles
                .iter()
                .find(|role| {
                    // A ClusterRoleBinding has no namespace to find a Role in; upstream's lister
                    // lookup under the empty namespace finds nothing either.
                    !binding_namespace.is_empty()
                        && object_namespace(&role.metadata) == binding_namespace
                        && object_name(&role.metadata) == role_ref.name
                })
                .map(|role| role.rules.as_deref().unwrap_or_default())
                .ok_or_else(|| RbacError::RoleNotFound {
                    namespace: binding_namespace.to_string(),
                    name: role_ref.name.clone(),
                }),
            "ClusterRole" => self
                .cluster_roles
                .iter()
                .find(|role| object_name(&role.metadata) == role_ref.name)
                .map(|role| role.rules.as_deref().unwrap_or_default())
                .ok_or_else(|| RbacError::ClusterRoleNotFound {
                    name: role_ref.name.clone(),
                }),
            kind => Err(RbacError::UnsupportedRoleRefKind {
                kind: kind.to_string(),
            }),
        }
    }

    /// Upstream `ConfirmNoEscalation`: `Ok` when the rules `user` holds in `namespace` cover
    /// `rules`, otherwise [`RbacError::Escalation`] naming the missing rules (and any errors
    /// resolving the user's own rules). Callers skip this check when the user may `escalate`
    /// (roles) or `bind` (bindings) the role, as upstream.
    pub fn confirm_no_escalation(
        &self,
        user: &UserInfo,
        namespace: &str,
        rules: &[PolicyRule],
    ) -> Result<(), RbacError> {
        let (owner_rules, errors) = self.rules_and_errors_for(user, namespace);
        let (covered, missing) = covers(&owner_rules, rules);
        if covered {
            return Ok(());
        }
        let resolution_errors = if errors.is_empty() {
            Vec::new()
        } else {
            vec![aggregate(&errors)]
        };
        Err(escalation_error(user, &missing, resolution_errors))
    }
}

/// `utilerrors.NewAggregate(errors).Error()`: duplicates dropped, several in brackets.
fn aggregate(errors: &[RbacError]) -> String {
    let mut messages = Vec::<String>::new();
    for error in errors {
        let message = error.to_string();
        if !messages.contains(&message) {
            messages.push(message);
        }
    }
    aggregate_messages(&messages)
}

/// The first subject among `subjects` that names `user` (upstream `appliesTo`).
fn applies_to<'a>(
    user: &UserInfo,
    subjects: Option<&'a [Subject]>,
    namespace: &str,
) -> Option<&'a Subject> {
    subjects?
        .iter()
        .find(|subject| applies_to_user(user, subject, namespace))
}

/// Upstream `appliesToUser`: whether one binding subject names `user`. `namespace` is the
/// binding's namespace (empty for a ClusterRoleBinding); a ServiceAccount subject without a
/// namespace means the binding's namespace, so in a ClusterRoleBinding it never matches.
pub fn applies_to_user(user: &UserInfo, subject: &Subject, namespace: &str) -> bool {
    match subject.kind.as_str() {
        USER_KIND => user.name == subject.name,
        GROUP_KIND => user.groups.contains(&subject.name),
        SERVICE_ACCOUNT_KIND => {
            let sa_namespace = match subject.namespace.as_deref() {
                Some(sa_namespace) if !sa_namespace.is_empty() => sa_namespace,
                _ => namespace,
            };
            !sa_namespace.is_empty() && matches_username(sa_namespace, &subject.name, &user.name)
        }
        _ => false,
    }
}

fn object_name(metadata: &ObjectMeta) -> &str {
    metadata.name.as_deref().unwrap_or_default()
}

fn object_namespace(metadata: &ObjectMeta) -> &str {
    metadata.namespace.as_deref().unwrap_or_default()
}

/// A Go nil-or-empty list as a slice.
fn list(values: &Option<Vec<String>>) -> &[String] {
    values.as_deref().unwrap_or_default()
}

fn has(set: &[String], element: &str) -> bool {
    set.iter().any(|s| s == element)
}

/// Upstream `RulesAllow`: whether any of `rules` allows the request.
pub fn rules_allow(attributes: &Attributes, rules: &[PolicyRule]) -> bool {
    rules.iter().any(|rule| rule_allows(attributes, rule))
}

/// Upstream `RuleAllows`: a resource request matches verb, group, `resource[/subresource]` and
/// name; a non-resource request matches verb and path.
pub fn rule_allows(attributes: &Attributes, rule: &PolicyRule) -> bool {
    if attributes.resource_request {
        let combined_resource = if attributes.subresource.is_empty() {
            attributes.resource.clone()
        } else {
            format!("{}/{}", attributes.resource, attributes.subresource)
        };
        verb_matches(rule, &attributes.verb)
            && api_group_matches(rule, &attributes.api_group)
            && resource_matches(rule, &combined_resource, &attributes.subresource)
            && resource_name_matches(rule, &attributes.name)
    } else {
        verb_matches(rule, &attributes.verb) && non_resource_url_matches(rule, &attributes.path)
    }
}

/// Upstream `VerbMatches`: the verb is listed, or `*` is.
pub fn verb_matches(rule: &PolicyRule, requested_verb: &str) -> bool {
    rule.verbs
        .iter()
        .any(|verb| verb == VERB_ALL || verb == requested_verb)
}

/// Upstream `APIGroupMatches`: the group is listed, or `*` is.
pub fn api_group_matches(rule: &PolicyRule, requested_group: &str) -> bool {
    list(&rule.api_groups)
        .iter()
        .any(|group| group == API_GROUP_ALL || group == requested_group)
}

/// Upstream `ResourceMatches`: `*`, the exact `resource/subresource`, or `*/subresource`. There
/// is no `resource/*` form: a rule for `pods` does not grant `pods/log`.
pub fn resource_matches(
    rule: &PolicyRule,
    combined_requested_resource: &str,
    requested_subresource: &str,
) -> bool {
    list(&rule.resources).iter().any(|resource| {
        resource == RESOURCE_ALL
            || resource == combined_requested_resource
            || (!requested_subresource.is_empty()
                && resource.strip_prefix("*/") == Some(requested_subresource))
    })
}

/// Upstream `ResourceNameMatches`: an empty list matches every name; otherwise the name must be
/// listed, so a rule with resourceNames never matches a request without a name (`list`,
/// `watch` of a collection, `create`, `deletecollection`).
pub fn resource_name_matches(rule: &PolicyRule, requested_name: &str) -> bool {
    let names = list(&rule.resource_names);
    names.is_empty() || has(names, requested_name)
}

/// Upstream `NonResourceURLMatches`: `*`, the exact path, or a prefix for a URL ending in `*`
/// (`/healthz/*` matches `/healthz/etcd` but not `/healthz`).
pub fn non_resource_url_matches(rule: &PolicyRule, requested_url: &str) -> bool {
    list(&rule.non_resource_urls)
        .iter()
        .any(|url| url == NON_RESOURCE_ALL || non_resource_url_covers(url, requested_url))
}

/// Exact match, or prefix match for a pattern ending in `*` (upstream `nonResourceURLCovers`;
/// Go's `TrimRight` drops every trailing `*`).
fn non_resource_url_covers(owner_path: &str, sub_path: &str) -> bool {
    owner_path == sub_path
        || (owner_path.ends_with('*') && sub_path.starts_with(owner_path.trim_end_matches('*')))
}

/// Upstream `validation.Covers`: whether `owner_rules` grant everything `servant_rules` do, and
/// the servant's rules, broken down to one verb/group/resource/name (or verb/URL) each, that no
/// owner rule covers.
pub fn covers(owner_rules: &[PolicyRule], servant_rules: &[PolicyRule]) -> (bool, Vec<PolicyRule>) {
    let uncovered: Vec<PolicyRule> = servant_rules
        .iter()
        .flat_map(breakdown_rule)
        .filter(|subrule| !owner_rules.iter().any(|owner| rule_covers(owner, subrule)))
        .collect();
    (uncovered.is_empty(), uncovered)
}

/// Upstream `BreakdownRule`: an equivalent list of rules with at most one verb, group, resource
/// and name each; non-resource URLs pair only with verbs. A rule with resources but no
/// apiGroups breaks down to nothing, as upstream.
pub fn breakdown_rule(rule: &PolicyRule) -> Vec<PolicyRule> {
    let one = |value: &String| Some(vec![value.clone()]);
    let mut subrules = Vec::new();
    for group in list(&rule.api_groups) {
        for resource in list(&rule.resources) {
            for verb in &rule.verbs {
                let names = list(&rule.resource_names);
                if names.is_empty() {
                    subrules.push(PolicyRule {
                        api_groups: one(group),
                        resources: one(resource),
                        verbs: vec![verb.clone()],
                        ..PolicyRule::default()
                    });
                } else {
                    for name in names {
                        subrules.push(PolicyRule {
                            api_groups: one(group),
                            resources: one(resource),
                            verbs: vec![verb.clone()],
                            resource_names: one(name),
                            ..PolicyRule::default()
                        });
                    }
                }
            }
        }
    }
    for url in list(&rule.non_resource_urls) {
        for verb in &rule.verbs {
            subrules.push(PolicyRule {
                non_resource_urls: one(url),
                verbs: vec![verb.clone()],
                ..PolicyRule::default()
            });
        }
    }
    subrules
}

fn has_all(set: &[String], contains: &[String]) -> bool {
    contains.iter().all(|element| has(set, element))
}

/// Upstream `resourceCoversAll`: `*`, exact names, or `*/subresource` for a subresource.
fn resource_covers_all(set_resources: &[String], covers_resources: &[String]) -> bool {
    if has(set_resources, RESOURCE_ALL) || has_all(set_resources, covers_resources) {
        return true;
    }
    covers_resources.iter().all(|path| {
        has(set_resources, path)
            || path
                .split_once('/')
                .is_some_and(|(_, subresource)| has(set_resources, &format!("*/{subresource}")))
    })
}

/// Upstream `ruleCovers`: whether one owner rule covers one broken-down servant rule.
fn rule_covers(owner: &PolicyRule, subrule: &PolicyRule) -> bool {
    let verb_matches = has(&owner.verbs, VERB_ALL) || has_all(&owner.verbs, &subrule.verbs);
    let owner_groups = list(&owner.api_groups);
    let group_matches =
        has(owner_groups, API_GROUP_ALL) || has_all(owner_groups, list(&subrule.api_groups));
    let resource_matches = resource_covers_all(list(&owner.resources), list(&subrule.resources));
    let non_resource_url_matches = list(&subrule.non_resource_urls).iter().all(|path| {
        list(&owner.non_resource_urls)
            .iter()
            .any(|owner_path| non_resource_url_covers(owner_path, path))
    });
    let owner_names = list(&owner.resource_names);
    let sub_names = list(&subrule.resource_names);
    // An owner limited to names covers only servants limited to (some of) those names.
    let resource_name_matches =
        owner_names.is_empty() || (!sub_names.is_empty() && has_all(owner_names, sub_names));
    verb_matches
        && group_matches
        && resource_matches
        && resource_name_matches
        && non_resource_url_matches
}

/// Upstream `CompactRules`: merges rules that have one group, one resource, at most one name and
/// no URLs and differ only by verb, so a missing-rights message reads
/// `Verbs:["create" "delete"]` rather than one line per verb. Other rules pass through; merged
/// rules follow them in first-seen order.
pub fn compact_rules(rules: &[PolicyRule]) -> Vec<PolicyRule> {
    let mut compacted = Vec::new();
    let mut simple: Vec<(SimpleResource<'_>, PolicyRule)> = Vec::new();
    for rule in rules {
        match simple_resource(rule) {
            Some(key) => match simple.iter_mut().find(|(k, _)| *k == key) {
                Some((_, existing)) => existing.verbs.extend(rule.verbs.iter().cloned()),
                None => simple.push((key, rule.clone())),
            },
            None => compacted.push(rule.clone()),
        }
    }
    compacted.extend(simple.into_iter().map(|(_, rule)| rule));
    compacted
}

/// Group, resource and optional name: the key [`compact_rules`] merges verbs under (upstream
/// `simpleResource`).
type SimpleResource<'a> = (&'a str, &'a str, Option<&'a str>);

/// Upstream `isSimpleResourceRule`: the group, resource and optional name of a rule that has
/// exactly one group and one resource, at most one name and no URLs.
fn simple_resource(rule: &PolicyRule) -> Option<SimpleResource<'_>> {
    let names = list(&rule.resource_names);
    if names.len() > 1 || !list(&rule.non_resource_urls).is_empty() {
        return None;
    }
    match (list(&rule.api_groups), list(&rule.resources)) {
        ([group], [resource]) => Some((group, resource, names.first().map(String::as_str))),
        _ => None,
    }
}

/// Upstream `rbacv1helpers.CompactString`: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`,
/// listing only non-empty fields, each quoted as Go's `%q` prints a `[]string`.
pub fn compact_string(rule: &PolicyRule) -> String {
    let fields = [
        ("APIGroups", list(&rule.api_groups)),
        ("Resources", list(&rule.resources)),
        ("NonResourceURLs", list(&rule.non_resource_urls)),
        ("ResourceNames", list(&rule.resource_names)),
        ("Verbs", rule.verbs.as_slice()),
    ];
    let parts: Vec<String> = fields
        .iter()
        .filter(|(_, values)| !values.is_empty())
        .map(|(name, values)| format!("{name}:{}", go_quote_list(values)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn go_quote_list(values: &[String]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| go_quote(v)).collect();
    format!("[{}]", quoted.join(" "))
}

/// Upstream `ConfirmNoEscalation`'s message for rules `user` lacks (as [`covers`] returns
/// them): compacted, rendered with [`compact_string`], deduplicated and sorted, one per line.
pub fn confirm_no_escalation_message(user: &UserInfo, uncovered: &[PolicyRule]) -> String {
    escalation_error(user, uncovered, Vec::new()).to_string()
}

fn escalation_error(
    user: &UserInfo,
    uncovered: &[PolicyRule],
    resolution_errors: Vec<String>,
) -> RbacError {
    let missing: BTreeSet<String> = compact_rules(uncovered)
        .iter()
        .map(compact_string)
        .collect();
    RbacError::Escalation {
        user: user.name.clone(),
        groups: user.groups.clone(),
        missing: missing.into_iter().collect(),
        resolution_errors,
    }
}

/// Upstream `responsewriters.forbiddenMessage`: `User "x" cannot list resource "pods" in API
/// group "" in the namespace "team"`, `... at the cluster scope`, or `User "x" cannot get path
/// "/metrics"`. The apiserver's Status message is [`forbidden_status_message`].
pub fn forbidden_reason(attributes: &Attributes) -> String {
    let username = go_quote(&attributes.user.name);
    if !attributes.resource_request {
        return format!(
            "User {username} cannot {} path {}",
            attributes.verb,
            go_quote(&attributes.path)
        );
    }
    let resource = if attributes.subresource.is_empty() {
        attributes.resource.clone()
    } else {
        format!("{}/{}", attributes.resource, attributes.subresource)
    };
    let scope = if attributes.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {}", go_quote(&attributes.namespace))
    };
    format!(
        "User {username} cannot {} resource {} in API group {} {scope}",
        attributes.verb,
        go_quote(&resource),
        go_quote(&attributes.api_group),
    )
}

/// The message of the 403 Status upstream's `responsewriters.Forbidden` sends:
/// `apierrors.NewForbidden(group/resource, name, ...)` around [`forbidden_reason`] (with `<`, `>`
/// and `&` escaped so it cannot pass for HTML) and the authorizer's `reason` if any, e.g.
/// `pods is forbidden: User "x" cannot list resource "pods" in API group "" in the namespace
/// "team"`, `deployments.apps "web" is forbidden: ...`, or for paths `forbidden: User "x" cannot
/// get path "/metrics"`.
pub fn forbidden_status_message(attributes: &Attributes, reason: &str) -> String {
    let message = forbidden_reason(attributes)
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    let detail = if reason.is_empty() {
        message
    } else {
        format!("{message}: {reason}")
    };
    let qualified_resource = if attributes.api_group.is_empty() {
        attributes.resource.clone()
    } else {
        format!("{}.{}", attributes.resource, attributes.api_group)
    };
    if attributes.api_group.is_empty() && attributes.resource.is_empty() {
        format!("forbidden: {detail}")
    } else if attributes.name.is_empty() {
        format!("{qualified_resource} is forbidden: {detail}")
    } else {
        format!(
            "{qualified_resource} {} is forbidden: {detail}",
            go_quote(&attributes.name)
        )
    }
}

/// What upstream's clusterrole-aggregation controller converges to: every ClusterRole that has an
/// `aggregationRule` gets, as its rules, the union of the rules of every other ClusterRole whose
/// labels match any of its `clusterRoleSelectors` — selectors in order, matching roles by name,
/// their rules in order, exact duplicates dropped. All roles are returned, in input order.
///
/// Upstream re-syncs every aggregated role whenever any ClusterRole changes, so nested
/// aggregation (`admin` takes `edit`, which takes `view`) settles; this repeats the sync until
/// nothing changes. A role whose selector is invalid keeps its rules, as upstream's failing sync
/// leaves the stored object alone.
pub fn aggregate_cluster_roles(cluster_roles: &[ClusterRole]) -> Vec<ClusterRole> {
    let mut roles = cluster_roles.to_vec();
    // Each round can only propagate rules one aggregation level further, so a bound of one round
    // per role is always enough for an acyclic graph and stops a cyclic one.
    for _ in 0..=roles.len() {
        let mut changed = false;
        for index in 0..roles.len() {
            let Some(rule) = &roles[index].aggregation_rule else {
                continue;
            };
            let Ok(new_rules) = aggregated_rules(&roles, index, rule) else {
                continue;
            };
            let current = roles[index].rules.as_deref().unwrap_or_default();
            if !rules_semantically_equal(current, &new_rules) {
                roles[index].rules = Some(new_rules);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    roles
}

/// Upstream `syncClusterRole`'s rule computation for `roles[index]`.
fn aggregated_rules(
    roles: &[ClusterRole],
    index: usize,
    rule: &AggregationRule,
) -> Result<Vec<PolicyRule>, SelectorError> {
    let own_name = object_name(&roles[index].metadata);
    let mut new_rules: Vec<PolicyRule> = Vec::new();
    for selector in rule.cluster_role_selectors.as_deref().unwrap_or_default() {
        let selector = label_selector_as_selector(selector)?;
        let empty = BTreeMap::new();
        let mut matching: Vec<&ClusterRole> = roles
            .iter()
            .filter(|role| selector.matches(role.metadata.labels.as_ref().unwrap_or(&empty)))
            .collect();
        matching.sort_by(|a, b| object_name(&a.metadata).cmp(object_name(&b.metadata)));
        for role in matching {
            if object_name(&role.metadata) == own_name {
                continue;
            }
            for rule in role.rules.as_deref().unwrap_or_default() {
                if !new_rules.iter().any(|r| rule_semantically_equal(r, rule)) {
                    new_rules.push(rule.clone());
                }
            }
        }
    }
    Ok(new_rules)
}

/// Upstream `metav1.LabelSelectorAsSelector` over the k8s-openapi type: an empty selector matches
/// everything; operators other than In, NotIn, Exists and DoesNotExist are errors.
fn label_selector_as_selector(
    selector: &LabelSelector,
) -> Result<selector::LabelSelector, SelectorError> {
    let mut requirements = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        requirements.push(Requirement::new(
            key,
            Operator::Equals,
            vec![value.clone()],
        )?);
    }
    for expression in selector.match_expressions.iter().flatten() {
        let operator = match expression.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(SelectorError::InvalidOperator(other.to_string())),
        };
        requirements.push(Requirement::new(
            &expression.key,
            operator,
            expression.values.clone().unwrap_or_default(),
        )?);
    }
    Ok(selector::LabelSelector::from_requirements(requirements))
}

/// `equality.Semantic.DeepEqual` for rules: a nil list equals an empty one.
fn rule_semantically_equal(a: &PolicyRule, b: &PolicyRule) -> bool {
    list(&a.api_groups) == list(&b.api_groups)
        && list(&a.resources) == list(&b.resources)
        && list(&a.resource_names) == list(&b.resource_names)
        && list(&a.non_resource_urls) == list(&b.non_resource_urls)
        && a.verbs == b.verbs
}

fn rules_semantically_equal(a: &[PolicyRule], b: &[PolicyRule]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| rule_semantically_equal(a, b))
}

// Verb sets of upstream's bootstrap policy.
const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const READ_WRITE: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

const LEGACY_GROUP: &str = "";
const APPS_GROUP: &str = "apps";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";
const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";
const AUTOSCALING_GROUP: &str = "autoscaling";
const BATCH_GROUP: &str = "batch";
const CERTIFICATES_GROUP: &str = "certificates.k8s.io";
const COORDINATION_GROUP: &str = "coordination.k8s.io";
const DISCOVERY_GROUP: &str = "discovery.k8s.io";
const EVENTS_GROUP: &str = "events.k8s.io";
const EXTENSIONS_GROUP: &str = "extensions";
const NETWORKING_GROUP: &str = "networking.k8s.io";
const NODE_GROUP: &str = "node.k8s.io";
const POLICY_GROUP: &str = "policy";
const RESOURCE_GROUP: &str = "resource.k8s.io";
const STORAGE_GROUP: &str = "storage.k8s.io";

/// Sorted, deduplicated strings: upstream's `PolicyRuleBuilder` builds every list from a set and
/// `Rule()` sorts them, so stored bootstrap rules read alphabetically.
fn sorted(values: &[&str]) -> Vec<String> {
    let set: BTreeSet<&str> = values.iter().copied().collect();
    set.into_iter().map(str::to_string).collect()
}

/// `NewRule(verbs...).Groups(groups...).Resources(resources...)`.
fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(sorted(groups)),
        resources: Some(sorted(resources)),
        verbs: sorted(verbs),
        ..PolicyRule::default()
    }
}

/// `NewRule(verbs...).Groups(groups...).Resources(resources...).Names(names...)`.
fn named_rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> PolicyRule {
    PolicyRule {
        resource_names: Some(sorted(names)),
        ..rule(verbs, groups, resources)
    }
}

/// `NewRule(verbs...).URLs(urls...)`.
fn url_rule(verbs: &[&str], urls: &[&str]) -> PolicyRule {
    PolicyRule {
        non_resource_urls: Some(sorted(urls)),
        verbs: sorted(verbs),
        ..PolicyRule::default()
    }
}

/// Upstream `eventsRule()`: recording events in either events API.
fn events_rule() -> PolicyRule {
    rule(
        &["create", "update", "patch"],
        &[LEGACY_GROUP, EVENTS_GROUP],
        &["events"],
    )
}

/// Upstream `addDefaultMetadata`: the bootstrapping label and the autoupdate annotation.
fn bootstrap_metadata(name: &str, extra_labels: &[(&str, &str)]) -> ObjectMeta {
    let mut labels: BTreeMap<String, String> = extra_labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.insert(
        BOOTSTRAPPING_LABEL_KEY.to_string(),
        BOOTSTRAPPING_LABEL_VALUE.to_string(),
    );
    ObjectMeta {
        name: Some(name.to_string()),
        labels: Some(labels),
        annotations: Some(BTreeMap::from([(
            AUTO_UPDATE_ANNOTATION_KEY.to_string(),
            "true".to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

fn cluster_role(name: &str, labels: &[(&str, &str)], rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_metadata(name, labels),
        rules: Some(rules),
        aggregation_rule: None,
    }
}

/// An aggregated role as upstream stores it at bootstrap: no rules of its own, a selector on
/// `aggregate_label: "true"`; the aggregation controller fills the rules in.
fn aggregated_cluster_role(
    name: &str,
    labels: &[(&str, &str)],
    aggregate_label: &str,
) -> ClusterRole {
    ClusterRole {
        metadata: bootstrap_metadata(name, labels),
        rules: None,
        aggregation_rule: Some(AggregationRule {
            cluster_role_selectors: Some(vec![LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    aggregate_label.to_string(),
                    "true".to_string(),
                )])),
                match_expressions: None,
            }]),
        }),
    }
}

/// Upstream `bootstrappolicy.NodeRules()`: what the Node authorizer and NodeRestriction admission
/// then narrow to the node's own objects.
fn node_rules() -> Vec<PolicyRule> {
    vec![
        rule(&["create"], &[AUTHENTICATION_GROUP], &["tokenreviews"]),
        rule(
            &["create"],
            &[AUTHORIZATION_GROUP],
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        rule(READ, &[LEGACY_GROUP], &["services"]),
        rule(
            &["create", "get", "list", "watch"],
            &[LEGACY_GROUP],
            &["nodes"],
        ),
        rule(&["update", "patch"], &[LEGACY_GROUP], &["nodes/status"]),
        rule(&["update", "patch"], &[LEGACY_GROUP], &["nodes"]),
        rule(&["create", "update", "patch"], &[LEGACY_GROUP], &["events"]),
        rule(READ, &[LEGACY_GROUP], &["pods"]),
        rule(&["create", "delete"], &[LEGACY_GROUP], &["pods"]),
        rule(&["update", "patch"], &[LEGACY_GROUP], &["pods/status"]),
        rule(&["create"], &[LEGACY_GROUP], &["pods/eviction"]),
        rule(READ, &[LEGACY_GROUP], &["secrets", "configmaps"]),
        rule(
            &["get"],
            &[LEGACY_GROUP],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        rule(&["get"], &[LEGACY_GROUP], &["endpoints"]),
        rule(
            &["create", "get", "list", "watch"],
            &[CERTIFICATES_GROUP],
            &["certificatesigningrequests"],
        ),
        rule(
            &["get", "create", "update", "patch", "delete"],
            &[COORDINATION_GROUP],
            &["leases"],
        ),
        rule(&["get"], &[STORAGE_GROUP], &["volumeattachments"]),
        rule(&["create"], &[LEGACY_GROUP], &["serviceaccounts/token"]),
        rule(
            &["get", "update", "patch"],
            &[LEGACY_GROUP],
            &["persistentvolumeclaims/status"],
        ),
        rule(READ, &[STORAGE_GROUP], &["csidrivers"]),
        rule(
            &["get", "create", "update", "patch", "delete"],
            &[STORAGE_GROUP],
            &["csinodes"],
        ),
        rule(READ, &[NODE_GROUP], &["runtimeclasses"]),
        rule(&["get"], &[RESOURCE_GROUP], &["resourceclaims"]),
        rule(
            &["deletecollection"],
            &[RESOURCE_GROUP],
            &["resourceslices"],
        ),
    ]
}

fn kube_scheduler_rules() -> Vec<PolicyRule> {
    vec![
        events_rule(),
        rule(&["create"], &[COORDINATION_GROUP], &["leases"]),
        named_rule(
            &["get", "list", "update", "watch"],
            &[COORDINATION_GROUP],
            &["leases"],
            &["kube-scheduler"],
        ),
        rule(READ_WRITE, &[COORDINATION_GROUP], &["leasecandidates"]),
        rule(READ, &[LEGACY_GROUP], &["nodes"]),
        rule(
            &["get", "list", "watch", "delete"],
            &[LEGACY_GROUP],
            &["pods"],
        ),
        rule(&["create"], &[LEGACY_GROUP], &["pods/binding", "bindings"]),
        rule(&["patch", "update"], &[LEGACY_GROUP], &["pods/status"]),
        rule(
            READ,
            &[LEGACY_GROUP],
            &["replicationcontrollers", "services"],
        ),
        rule(READ, &[APPS_GROUP, EXTENSIONS_GROUP], &["replicasets"]),
        rule(READ, &[APPS_GROUP], &["statefulsets"]),
        rule(READ, &[POLICY_GROUP], &["poddisruptionbudgets"]),
        rule(
            READ,
            &[LEGACY_GROUP],
            &["persistentvolumeclaims", "persistentvolumes"],
        ),
        rule(&["create"], &[AUTHENTICATION_GROUP], &["tokenreviews"]),
        rule(
            &["create"],
            &[AUTHORIZATION_GROUP],
            &["subjectaccessreviews"],
        ),
        rule(READ, &[STORAGE_GROUP], &["csinodes"]),
        rule(READ, &[STORAGE_GROUP], &["volumeattachments"]),
        rule(READ, &[LEGACY_GROUP], &["namespaces"]),
        rule(READ, &[STORAGE_GROUP], &["csidrivers"]),
        rule(READ, &[STORAGE_GROUP], &["csistoragecapacities"]),
        rule(READ, &[RESOURCE_GROUP], &["deviceclasses"]),
        rule(
            &["get", "list", "watch", "update", "patch"],
            &[RESOURCE_GROUP],
            &["resourceclaims"],
        ),
        rule(
            &["get", "list", "watch", "update", "patch"],
            &[RESOURCE_GROUP],
            &["resourceclaims/status"],
        ),
        rule(
            &["get", "list", "watch", "update", "patch"],
            &[LEGACY_GROUP],
            &["pods/finalizers"],
        ),
        rule(READ, &[RESOURCE_GROUP], &["resourceslices"]),
    ]
}

/// Upstream `bootstrappolicy.ClusterRoles()` with default feature gates, sorted by name as
/// upstream's golden `testdata/cluster-roles.yaml` lists them (the 1.34-era file: the
/// `resource.k8s.io` rules of `system:node` and `system:kube-scheduler` are in, as
/// DynamicResourceAllocation is on by default there). `admin`, `edit` and `view` have no
/// rules until [`aggregate_cluster_roles`] fills them from the `system:aggregate-to-*` roles.
/// The per-controller `system:controller:*` roles (`controller_policy.go`) are not included.
pub fn bootstrap_cluster_roles() -> Vec<ClusterRole> {
    let approver = |signer: &str| {
        cluster_role(
            &format!(
                "system:certificates.k8s.io:{}-approver",
                signer.trim_start_matches("kubernetes.io/")
            ),
            &[],
            vec![named_rule(
                &["approve"],
                &[CERTIFICATES_GROUP],
                &["signers"],
                &[signer],
            )],
        )
    };
    let mut roles = vec![
        aggregated_cluster_role("admin", &[], AGGREGATE_TO_ADMIN_LABEL),
        // The root role, which can do absolutely anything.
        cluster_role(
            "cluster-admin",
            &[],
            vec![
                rule(&[VERB_ALL], &[API_GROUP_ALL], &[RESOURCE_ALL]),
                url_rule(&[VERB_ALL], &[NON_RESOURCE_ALL]),
            ],
        ),
        aggregated_cluster_role(
            "edit",
            &[(AGGREGATE_TO_ADMIN_LABEL, "true")],
            AGGREGATE_TO_EDIT_LABEL,
        ),
        cluster_role(
            "system:aggregate-to-admin",
            &[(AGGREGATE_TO_ADMIN_LABEL, "true")],
            vec![
                rule(
                    &["create"],
                    &[AUTHORIZATION_GROUP],
                    &["localsubjectaccessreviews"],
                ),
                rule(READ_WRITE, &[GROUP_NAME], &["roles", "rolebindings"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-edit",
            &[(AGGREGATE_TO_EDIT_LABEL, "true")],
            vec![
                // Read on the resources that can escalate (exec into pods, read secrets) is
                // edit's, not view's.
                rule(
                    READ,
                    &[LEGACY_GROUP],
                    &[
                        "pods/attach",
                        "pods/proxy",
                        "pods/exec",
                        "pods/portforward",
                        "secrets",
                        "services/proxy",
                    ],
                ),
                rule(&["impersonate"], &[LEGACY_GROUP], &["serviceaccounts"]),
                rule(
                    WRITE,
                    &[LEGACY_GROUP],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/proxy",
                        "pods/exec",
                        "pods/portforward",
                    ],
                ),
                rule(&["create"], &[LEGACY_GROUP], &["pods/eviction"]),
                rule(
                    WRITE,
                    &[LEGACY_GROUP],
                    &[
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                        "persistentvolumeclaims",
                        "configmaps",
                        "secrets",
                        "events",
                    ],
                ),
                rule(&["create"], &[LEGACY_GROUP], &["serviceaccounts/token"]),
                rule(
                    WRITE,
                    &[APPS_GROUP],
                    &[
                        "statefulsets",
                        "statefulsets/scale",
                        "daemonsets",
                        "deployments",
                        "deployments/scale",
                        "deployments/rollback",
                        "replicasets",
                        "replicasets/scale",
                    ],
                ),
                rule(WRITE, &[AUTOSCALING_GROUP], &["horizontalpodautoscalers"]),
                rule(WRITE, &[BATCH_GROUP], &["jobs", "cronjobs"]),
                rule(
                    WRITE,
                    &[EXTENSIONS_GROUP],
                    &[
                        "daemonsets",
                        "deployments",
                        "deployments/scale",
                        "deployments/rollback",
                        "ingresses",
                        "replicasets",
                        "replicasets/scale",
                        "replicationcontrollers/scale",
                        "networkpolicies",
                    ],
                ),
                rule(WRITE, &[POLICY_GROUP], &["poddisruptionbudgets"]),
                rule(
                    WRITE,
                    &[NETWORKING_GROUP],
                    &["networkpolicies", "ingresses"],
                ),
                rule(READ_WRITE, &[COORDINATION_GROUP], &["leases"]),
            ],
        ),
        cluster_role(
            "system:aggregate-to-view",
            &[(AGGREGATE_TO_VIEW_LABEL, "true")],
            vec![
                rule(
                    READ,
                    &[LEGACY_GROUP],
                    &[
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "configmaps",
                    ],
                ),
                rule(
                    READ,
                    &[LEGACY_GROUP],
                    &[
                        "limitranges",
                        "resourcequotas",
                        "bindings",
                        "events",
                        "pods/status",
                        "resourcequotas/status",
                        "namespaces/status",
                        "replicationcontrollers/status",
                        "pods/log",
                    ],
                ),
                // Reading namespaces at namespace scope means reading *this* namespace: a way
                // to tell which namespaces one has access to.
                rule(READ, &[LEGACY_GROUP], &["namespaces"]),
                rule(READ, &[DISCOVERY_GROUP], &["endpointslices"]),
                rule(
                    READ,
                    &[APPS_GROUP],
                    &[
                        "controllerrevisions",
                        "statefulsets",
                        "statefulsets/status",
                        "statefulsets/scale",
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/status",
                        "deployments/scale",
                        "replicasets",
                        "replicasets/status",
                        "replicasets/scale",
                    ],
                ),
                rule(
                    READ,
                    &[AUTOSCALING_GROUP],
                    &[
                        "horizontalpodautoscalers",
                        "horizontalpodautoscalers/status",
                    ],
                ),
                rule(
                    READ,
                    &[BATCH_GROUP],
                    &["jobs", "cronjobs", "cronjobs/status", "jobs/status"],
                ),
                rule(
                    READ,
                    &[EXTENSIONS_GROUP],
                    &[
                        "daemonsets",
                        "daemonsets/status",
                        "deployments",
                        "deployments/scale",
                        "deployments/status",
                        "ingresses",
                        "ingresses/status",
                        "replicasets",
                        "replicasets/scale",
                        "replicasets/status",
                        "replicationcontrollers/scale",
                        "networkpolicies",
                    ],
                ),
                rule(
                    READ,
                    &[POLICY_GROUP],
                    &["poddisruptionbudgets", "poddisruptionbudgets/status"],
                ),
                rule(
                    READ,
                    &[NETWORKING_GROUP],
                    &["ingresses", "ingresses/status", "networkpolicies"],
                ),
            ],
        ),
        cluster_role(
            "system:auth-delegator",
            &[],
            vec![
                rule(&["create"], &[AUTHENTICATION_GROUP], &["tokenreviews"]),
                rule(
                    &["create"],
                    &[AUTHORIZATION_GROUP],
                    &["subjectaccessreviews"],
                ),
            ],
        ),
        // Just enough for any user to learn about themselves.
        cluster_role(
            "system:basic-user",
            &[],
            vec![
                rule(
                    &["create"],
                    &[AUTHORIZATION_GROUP],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
                rule(
                    &["create"],
                    &[AUTHENTICATION_GROUP],
                    &["selfsubjectreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            &[],
            vec![rule(
                &["create"],
                &[CERTIFICATES_GROUP],
                &["certificatesigningrequests/nodeclient"],
            )],
        ),
        cluster_role(
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            &[],
            vec![rule(
                &["create"],
                &[CERTIFICATES_GROUP],
                &["certificatesigningrequests/selfnodeclient"],
            )],
        ),
        approver("kubernetes.io/kube-apiserver-client"),
        approver("kubernetes.io/kube-apiserver-client-kubelet"),
        approver("kubernetes.io/kubelet-serving"),
        approver("kubernetes.io/legacy-unknown"),
        // Just enough to tell whether the server is ready and to negotiate API versions.
        cluster_role(
            "system:discovery",
            &[],
            vec![url_rule(
                &["get"],
                &[
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/version",
                    "/version/",
                    "/openapi",
                    "/openapi/*",
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                ],
            )],
        ),
        cluster_role(
            "system:heapster",
            &[],
            vec![
                rule(
                    READ,
                    &[LEGACY_GROUP],
                    &["events", "pods", "nodes", "namespaces"],
                ),
                rule(READ, &[EXTENSIONS_GROUP], &["deployments"]),
            ],
        ),
        cluster_role(
            "system:kube-aggregator",
            &[],
            vec![rule(READ, &[LEGACY_GROUP], &["services", "endpoints"])],
        ),
        // Enough for kube-controller-manager to start its informers and mint the per-controller
        // service account credentials; each controller then runs as its own identity.
        cluster_role(
            "system:kube-controller-manager",
            &[],
            vec![
                events_rule(),
                rule(&["create"], &[COORDINATION_GROUP], &["leases"]),
                named_rule(
                    &["get", "update"],
                    &[COORDINATION_GROUP],
                    &["leases"],
                    &["kube-controller-manager"],
                ),
                rule(
                    &["create"],
                    &[LEGACY_GROUP],
                    &["secrets", "serviceaccounts"],
                ),
                rule(&["delete"], &[LEGACY_GROUP], &["secrets"]),
                rule(
                    &["get"],
                    &[LEGACY_GROUP],
                    &["namespaces", "secrets", "serviceaccounts", "configmaps"],
                ),
                rule(
                    &["update"],
                    &[LEGACY_GROUP],
                    &["secrets", "serviceaccounts"],
                ),
                rule(&["create"], &[AUTHENTICATION_GROUP], &["tokenreviews"]),
                rule(
                    &["create"],
                    &[AUTHORIZATION_GROUP],
                    &["subjectaccessreviews"],
                ),
                rule(&["list", "watch"], &[API_GROUP_ALL], &[RESOURCE_ALL]),
                rule(&["create"], &[LEGACY_GROUP], &["serviceaccounts/token"]),
            ],
        ),
        cluster_role(
            "system:kube-dns",
            &[],
            vec![rule(
                &["list", "watch"],
                &[LEGACY_GROUP],
                &["endpoints", "services"],
            )],
        ),
        cluster_role("system:kube-scheduler", &[], kube_scheduler_rules()),
        cluster_role(
            "system:kubelet-api-admin",
            &[],
            vec![
                rule(READ, &[LEGACY_GROUP], &["nodes"]),
                rule(&["proxy"], &[LEGACY_GROUP], &["nodes"]),
                rule(
                    &[VERB_ALL],
                    &[LEGACY_GROUP],
                    &["nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log"],
                ),
            ],
        ),
        // The splatted health checks can reveal more than the bare ones, so they are kept
        // from system:public-info-viewer.
        cluster_role(
            "system:monitoring",
            &[],
            vec![url_rule(
                &["get"],
                &[
                    "/metrics",
                    "/metrics/slis",
                    "/livez",
                    "/readyz",
                    "/healthz",
                    "/livez/*",
                    "/readyz/*",
                    "/healthz/*",
                ],
            )],
        ),
        cluster_role("system:node", &[], node_rules()),
        cluster_role(
            "system:node-bootstrapper",
            &[],
            vec![rule(
                &["create", "get", "list", "watch"],
                &[CERTIFICATES_GROUP],
                &["certificatesigningrequests"],
            )],
        ),
        cluster_role(
            "system:node-problem-detector",
            &[],
            vec![
                rule(&["get"], &[LEGACY_GROUP], &["nodes"]),
                rule(&["patch"], &[LEGACY_GROUP], &["nodes/status"]),
                events_rule(),
            ],
        ),
        cluster_role(
            "system:node-proxier",
            &[],
            vec![
                rule(
                    &["list", "watch"],
                    &[LEGACY_GROUP],
                    &["services", "endpoints"],
                ),
                rule(READ, &[LEGACY_GROUP], &["nodes"]),
                events_rule(),
                rule(&["list", "watch"], &[DISCOVERY_GROUP], &["endpointslices"]),
            ],
        ),
        cluster_role(
            "system:persistent-volume-provisioner",
            &[],
            vec![
                rule(
                    &["get", "list", "watch", "create", "delete"],
                    &[LEGACY_GROUP],
                    &["persistentvolumes"],
                ),
                rule(
                    &["get", "list", "watch", "update"],
                    &[LEGACY_GROUP],
                    &["persistentvolumeclaims"],
                ),
                rule(READ, &[STORAGE_GROUP], &["storageclasses"]),
                rule(&["watch"], &[LEGACY_GROUP], &["events"]),
                events_rule(),
            ],
        ),
        // Insensitive information anyone, even unauthenticated, may read.
        cluster_role(
            "system:public-info-viewer",
            &[],
            vec![url_rule(
                &["get"],
                &["/livez", "/readyz", "/healthz", "/version", "/version/"],
            )],
        ),
        cluster_role(
            "system:service-account-issuer-discovery",
            &[],
            vec![url_rule(
                &["get"],
                &[
                    "/.well-known/openid-configuration",
                    "/.well-known/openid-configuration/",
                    "/openid/v1/jwks",
                    "/openid/v1/jwks/",
                ],
            )],
        ),
        cluster_role(
            "system:volume-scheduler",
            &[],
            vec![
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[LEGACY_GROUP],
                    &["persistentvolumes"],
                ),
                rule(READ, &[STORAGE_GROUP], &["storageclasses"]),
                rule(
                    &["get", "list", "watch", "update", "patch"],
                    &[LEGACY_GROUP],
                    &["persistentvolumeclaims"],
                ),
            ],
        ),
        aggregated_cluster_role(
            "view",
            &[(AGGREGATE_TO_EDIT_LABEL, "true")],
            AGGREGATE_TO_VIEW_LABEL,
        ),
    ];
    roles.sort_by(|a, b| object_name(&a.metadata).cmp(object_name(&b.metadata)));
    roles
}

fn rbac_subject(kind: &str, name: &str) -> Subject {
    Subject {
        api_group: Some(GROUP_NAME.to_string()),
        kind: kind.to_string(),
        name: name.to_string(),
        namespace: None,
    }
}

fn cluster_role_binding(role: &str, subjects: Vec<Subject>) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: bootstrap_metadata(role, &[]),
        role_ref: RoleRef {
            api_group: GROUP_NAME.to_string(),
            kind: "ClusterRole".to_string(),
            name: role.to_string(),
        },
        // Upstream leaves an empty binding's subjects nil (`system:node`).
        subjects: (!subjects.is_empty()).then_some(subjects),
    }
}

/// Upstream `bootstrappolicy.ClusterRoleBindings()`, sorted by name as upstream's golden
/// `testdata/cluster-role-bindings.yaml`. `system:node` has no subjects: kubelets are authorized
/// by the Node authorizer, and the binding is kept only so upgrades do not recreate it.
pub fn bootstrap_cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let group = |name: &str| rbac_subject(GROUP_KIND, name);
    let user = |name: &str| rbac_subject(USER_KIND, name);
    vec![
        cluster_role_binding("cluster-admin", vec![group(SYSTEM_PRIVILEGED_GROUP)]),
        cluster_role_binding("system:basic-user", vec![group(ALL_AUTHENTICATED)]),
        cluster_role_binding("system:discovery", vec![group(ALL_AUTHENTICATED)]),
        cluster_role_binding(
            "system:kube-controller-manager",
            vec![user(KUBE_CONTROLLER_MANAGER)],
        ),
        cluster_role_binding(
            "system:kube-dns",
            vec![Subject {
                api_group: None,
                kind: SERVICE_ACCOUNT_KIND.to_string(),
                name: "kube-dns".to_string(),
                namespace: Some("kube-system".to_string()),
            }],
        ),
        cluster_role_binding("system:kube-scheduler", vec![user(KUBE_SCHEDULER)]),
        cluster_role_binding("system:monitoring", vec![group(MONITORING_GROUP)]),
        cluster_role_binding("system:node", Vec::new()),
        cluster_role_binding("system:node-proxier", vec![user(KUBE_PROXY)]),
        cluster_role_binding(
            "system:public-info-viewer",
            vec![group(ALL_AUTHENTICATED), group(ALL_UNAUTHENTICATED)],
        ),
        cluster_role_binding(
            "system:service-account-issuer-discovery",
            vec![group(ALL_SERVICE_ACCOUNTS_GROUP)],
        ),
        cluster_role_binding("system:volume-scheduler", vec![user(KUBE_SCHEDULER)]),
    ]
}

/// The group every bootstrap token's user is in (`system:bootstrap:<id>`).
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers";

/// kubeadm's bindings for joining nodes (`cmd/kubeadm/app/phases/bootstraptoken/node`): bootstrap
/// token users may create CertificateSigningRequests (`kubeadm:kubelet-bootstrap`) that the
/// approver signs off as node client certificates (`kubeadm:node-autoapprove-bootstrap`), and
/// nodes may renew their own (`kubeadm:node-autoapprove-certificate-rotation`). kubeadm binds
/// the token group `system:bootstrappers:kubeadm:default-node-token`; these bind every
/// bootstrap token's `system:bootstrappers`. Not labelled as upstream's bootstrap policy.
/// Flotilla adds `flotilla:node-proxier`: a node image's proxy runs with its node's own
/// credential (there is no kube-proxy DaemonSet with a service account to give it one), so
/// `system:nodes` may read what kube-proxy reads (`system:node-proxier`).
pub fn node_bootstrap_cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    let binding = |name: &str, role: &str, group: &str| ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: GROUP_NAME.to_string(),
            kind: "ClusterRole".to_string(),
            name: role.to_string(),
        },
        subjects: Some(vec![rbac_subject(GROUP_KIND, group)]),
    };
    vec![
        binding(
            "kubeadm:kubelet-bootstrap",
            "system:node-bootstrapper",
            BOOTSTRAPPERS_GROUP,
        ),
        binding(
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            BOOTSTRAPPERS_GROUP,
        ),
        binding(
            "kubeadm:node-autoapprove-certificate-rotation",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            NODES_GROUP,
        ),
        binding("flotilla:node-proxier", "system:node-proxier", NODES_GROUP),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use Decision::{Allow, NoOpinion};

    fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: namespace.map(str::to_string),
            ..ObjectMeta::default()
        }
    }

    fn subject(kind: &str, name: &str, namespace: Option<&str>) -> Subject {
        Subject {
            api_group: (kind != SERVICE_ACCOUNT_KIND).then(|| GROUP_NAME.to_string()),
            kind: kind.to_string(),
            name: name.to_string(),
            namespace: namespace.map(str::to_string),
        }
    }

    fn role_ref(kind: &str, name: &str) -> RoleRef {
        RoleRef {
            api_group: GROUP_NAME.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
        }
    }

    fn role_binding(
        namespace: &str,
        name: &str,
        (kind, role): (&str, &str),
        subjects: Vec<Subject>,
    ) -> RoleBinding {
        RoleBinding {
            metadata: meta(Some(namespace), name),
            role_ref: role_ref(kind, role),
            subjects: Some(subjects),
        }
    }

    fn crb(name: &str, (kind, role): (&str, &str), subjects: Vec<Subject>) -> ClusterRoleBinding {
        ClusterRoleBinding {
            metadata: meta(None, name),
            role_ref: role_ref(kind, role),
            subjects: Some(subjects),
        }
    }

    fn plain_cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
        ClusterRole {
            metadata: meta(None, name),
            rules: Some(rules),
            aggregation_rule: None,
        }
    }

    fn resource(
        user: &UserInfo,
        verb: &str,
        namespace: &str,
        (group, resource, subresource): (&str, &str, &str),
        name: &str,
    ) -> Attributes {
        Attributes {
            user: user.clone(),
            verb: verb.to_string(),
            namespace: namespace.to_string(),
            api_group: group.to_string(),
            api_version: "v1".to_string(),
            resource: resource.to_string(),
            subresource: subresource.to_string(),
            name: name.to_string(),
            resource_request: true,
            path: String::new(),
        }
    }

    fn path(user: &UserInfo, verb: &str, path: &str) -> Attributes {
        Attributes {
            user: user.clone(),
            verb: verb.to_string(),
            path: path.to_string(),
            ..Attributes::default()
        }
    }

    /// Bootstrap policy as a running cluster stores it: aggregated roles filled in.
    fn bootstrap_policy() -> Policy {
        Policy {
            cluster_roles: aggregate_cluster_roles(&bootstrap_cluster_roles()),
            cluster_role_bindings: bootstrap_cluster_role_bindings(),
            ..Policy::default()
        }
    }

    fn rules_of(roles: &[ClusterRole], name: &str) -> Vec<PolicyRule> {
        roles
            .iter()
            .find(|role| object_name(&role.metadata) == name)
            .and_then(|role| role.rules.clone())
            .unwrap_or_default()
    }

    fn alice() -> UserInfo {
        UserInfo::new("alice", &[ALL_AUTHENTICATED])
    }

    /// Bootstrap policy plus `view` bound to the service account team/reader in namespace team.
    fn reader_policy() -> Policy {
        let mut policy = bootstrap_policy();
        policy.role_bindings.push(role_binding(
            "team",
            "reader-view",
            ("ClusterRole", "view"),
            vec![subject(SERVICE_ACCOUNT_KIND, "reader", Some("team"))],
        ));
        policy
    }

    #[test]
    fn service_account_bound_to_view_in_its_namespace() {
        let policy = reader_policy();
        let reader = UserInfo::service_account("team", "reader");
        // verb, namespace, (group, resource, subresource), name, decision
        type Case<'a> = (
            &'a str,
            &'a str,
            (&'a str, &'a str, &'a str),
            &'a str,
            Decision,
        );
        let cases: &[Case] = &[
            ("get", "team", ("", "pods", ""), "web-0", Allow),
            ("list", "team", ("", "pods", ""), "", Allow),
            ("watch", "team", ("", "pods", ""), "", Allow),
            ("get", "team", ("", "pods", "log"), "web-0", Allow),
            ("list", "team", ("apps", "deployments", ""), "", Allow),
            (
                "get",
                "team",
                ("apps", "deployments", "scale"),
                "web",
                Allow,
            ),
            (
                "list",
                "team",
                ("discovery.k8s.io", "endpointslices", ""),
                "",
                Allow,
            ),
            ("get", "team", ("", "namespaces", ""), "team", Allow),
            ("list", "other", ("", "pods", ""), "", NoOpinion),
            ("list", "", ("", "pods", ""), "", NoOpinion),
            ("create", "team", ("", "pods", ""), "", NoOpinion),
            ("delete", "team", ("", "pods", ""), "web-0", NoOpinion),
            ("get", "team", ("", "secrets", ""), "token", NoOpinion),
            ("list", "team", ("", "secrets", ""), "", NoOpinion),
            ("get", "team", ("", "pods", "exec"), "web-0", NoOpinion),
            (
                "update",
                "team",
                ("apps", "deployments", "scale"),
                "web",
                NoOpinion,
            ),
            ("list", "team", (GROUP_NAME, "roles", ""), "", NoOpinion),
        ];
        for &(verb, namespace, gvr, name, expected) in cases {
            let attributes = resource(&reader, verb, namespace, gvr, name);
            let (decision, reason) = policy.authorize(&attributes);
            assert_eq!(
                decision, expected,
                "{verb} {gvr:?} in {namespace:?}: {reason}"
            );
            if expected == NoOpinion {
                assert_eq!(reason, "", "{verb} {gvr:?} in {namespace:?}");
            }
        }
        let (_, reason) =
            policy.authorize(&resource(&reader, "get", "team", ("", "pods", ""), "web-0"));
        assert_eq!(
            reason,
            r#"RBAC: allowed by RoleBinding "reader-view/team" of ClusterRole "view" to ServiceAccount "reader/team""#
        );
    }

    #[test]
    fn bootstrap_tokens_may_request_node_client_certificates() {
        let mut policy = bootstrap_policy();
        policy
            .cluster_role_bindings
            .extend(node_bootstrap_cluster_role_bindings());
        let token = UserInfo::new(
            "system:bootstrap:abcdef",
            &[BOOTSTRAPPERS_GROUP, ALL_AUTHENTICATED],
        );
        let csr = |user: &UserInfo, verb: &str, subresource: &str| Attributes {
            user: user.clone(),
            verb: verb.into(),
            api_group: CERTIFICATES_GROUP.into(),
            resource: "certificatesigningrequests".into(),
            subresource: subresource.into(),
            resource_request: true,
            ..Default::default()
        };
        for (verb, sub) in [
            ("create", ""),
            ("get", ""),
            ("watch", ""),
            ("create", "nodeclient"),
        ] {
            assert_eq!(
                policy.authorize(&csr(&token, verb, sub)).0,
                Decision::Allow,
                "{verb} {sub}"
            );
        }
        assert_ne!(
            policy.authorize(&csr(&token, "create", "selfnodeclient")).0,
            Decision::Allow
        );
        assert_ne!(
            policy.authorize(&csr(&token, "delete", "")).0,
            Decision::Allow
        );
        let node = UserInfo::new("system:node:n1", &[NODES_GROUP, ALL_AUTHENTICATED]);
        assert_eq!(
            policy.authorize(&csr(&node, "create", "selfnodeclient")).0,
            Decision::Allow
        );
        assert_ne!(
            policy.authorize(&csr(&node, "create", "nodeclient")).0,
            Decision::Allow
        );
    }

    #[test]
    fn cluster_admin_through_system_masters() {
        let policy = bootstrap_policy();
        let admin = UserInfo::new("admin", &[SYSTEM_PRIVILEGED_GROUP, ALL_AUTHENTICATED]);
        let requests = [
            resource(&admin, "delete", "", ("", "nodes", ""), "node-1"),
            resource(
                &admin,
                "create",
                "kube-system",
                ("", "pods", "eviction"),
                "dns-0",
            ),
            resource(
                &admin,
                "escalate",
                "",
                (GROUP_NAME, "clusterroles", ""),
                "x",
            ),
            resource(&admin, "list", "team", ("example.com", "widgets", ""), ""),
            path(&admin, "get", "/metrics"),
            path(&admin, "post", "/anything/at/all"),
        ];
        for attributes in &requests {
            let (decision, reason) = policy.authorize(attributes);
            assert_eq!(decision, Allow, "{attributes:?}");
            assert_eq!(
                reason,
                r#"RBAC: allowed by ClusterRoleBinding "cluster-admin" of ClusterRole "cluster-admin" to Group "system:masters""#
            );
        }
        for attributes in &requests {
            let mut attributes = attributes.clone();
            attributes.user = alice();
            assert_eq!(policy.authorize(&attributes).0, NoOpinion, "{attributes:?}");
        }
    }

    #[test]
    fn non_resource_paths_of_the_bootstrap_roles() {
        let policy = bootstrap_policy();
        let monitor = UserInfo::new("prometheus", &[MONITORING_GROUP, ALL_AUTHENTICATED]);
        let sa = UserInfo::service_account("team", "reader");
        let cases: &[(&UserInfo, &str, Decision)] = &[
            (&alice(), "/api", Allow),
            (&alice(), "/apis", Allow),
            (&alice(), "/apis/apps/v1", Allow),
            (&alice(), "/openapi/v3", Allow),
            (&alice(), "/version", Allow),
            (&alice(), "/healthz", Allow),
            (&alice(), "/healthz/etcd", NoOpinion),
            (&alice(), "/metrics", NoOpinion),
            (&UserInfo::anonymous(), "/healthz", Allow),
            (&UserInfo::anonymous(), "/version/", Allow),
            (&UserInfo::anonymous(), "/livez", Allow),
            (&UserInfo::anonymous(), "/api", NoOpinion),
            (&monitor, "/metrics", Allow),
            (&monitor, "/readyz/etcd", Allow),
            (&sa, "/.well-known/openid-configuration", Allow),
            (&sa, "/openid/v1/jwks", Allow),
            (&alice(), "/openid/v1/jwks", NoOpinion),
        ];
        for &(user, url, expected) in cases {
            let (decision, reason) = policy.authorize(&path(user, "get", url));
            assert_eq!(decision, expected, "{} get {url}: {reason}", user.name);
        }
        assert_eq!(
            policy.authorize(&path(&alice(), "post", "/api")).0,
            NoOpinion
        );
        assert_eq!(
            policy
                .authorize(&path(&UserInfo::anonymous(), "get", "/healthz"))
                .1,
            r#"RBAC: allowed by ClusterRoleBinding "system:public-info-viewer" of ClusterRole "system:public-info-viewer" to Group "system:unauthenticated""#
        );
    }

    #[test]
    fn resource_names_never_match_unnamed_requests() {
        let bob = UserInfo::new("bob", &[]);
        let policy = Policy {
            roles: vec![Role {
                metadata: meta(Some("team"), "config-reader"),
                rules: Some(vec![named_rule(
                    &["get", "update", "list", "create"],
                    &[""],
                    &["configmaps"],
                    &["app-config"],
                )]),
            }],
            role_bindings: vec![role_binding(
                "team",
                "bob-config",
                ("Role", "config-reader"),
                vec![subject(USER_KIND, "bob", None)],
            )],
            ..Policy::default()
        };
        let cases: &[(&str, &str, &str, Decision)] = &[
            ("get", "team", "app-config", Allow),
            ("update", "team", "app-config", Allow),
            ("get", "team", "other-config", NoOpinion),
            ("list", "team", "", NoOpinion),
            ("create", "team", "", NoOpinion),
            ("delete", "team", "app-config", NoOpinion),
            ("get", "other", "app-config", NoOpinion),
        ];
        for &(verb, namespace, name, expected) in cases {
            let attributes = resource(&bob, verb, namespace, ("", "configmaps", ""), name);
            assert_eq!(
                policy.authorize(&attributes).0,
                expected,
                "{verb} {name:?} in {namespace}"
            );
        }
    }

    #[test]
    fn subresource_rules() {
        let carol = UserInfo::new("carol", &[]);
        let policy = Policy {
            cluster_roles: vec![plain_cluster_role(
                "scaler",
                vec![
                    rule(&["get", "update", "patch"], &["apps"], &["*/scale"]),
                    rule(&["get"], &[""], &["pods", "services/*"]),
                    rule(&["get"], &["policy"], &["*"]),
                ],
            )],
            cluster_role_bindings: vec![crb(
                "carol-scaler",
                ("ClusterRole", "scaler"),
                vec![subject(USER_KIND, "carol", None)],
            )],
            ..Policy::default()
        };
        let cases: &[(&str, (&str, &str, &str), Decision)] = &[
            ("update", ("apps", "deployments", "scale"), Allow),
            ("patch", ("apps", "statefulsets", "scale"), Allow),
            ("get", ("apps", "replicasets", "scale"), Allow),
            ("update", ("apps", "deployments", ""), NoOpinion),
            ("get", ("apps", "deployments", "status"), NoOpinion),
            ("get", ("", "replicationcontrollers", "scale"), NoOpinion),
            ("get", ("", "pods", ""), Allow),
            // A rule for a resource grants none of its subresources, and `resource/*` is not a
            // wildcard upstream.
            ("get", ("", "pods", "log"), NoOpinion),
            ("get", ("", "services", "proxy"), NoOpinion),
            ("get", ("policy", "poddisruptionbudgets", "status"), Allow),
        ];
        for &(verb, gvr, expected) in cases {
            let attributes = resource(&carol, verb, "team", gvr, "x");
            assert_eq!(policy.authorize(&attributes).0, expected, "{verb} {gvr:?}");
        }
    }

    #[test]
    fn rule_matching() {
        let user = alice();
        let cases: &[(PolicyRule, Attributes, bool)] = &[
            (
                rule(&["*"], &["*"], &["*"]),
                resource(&user, "frobnicate", "ns", ("x.io", "things", "sub"), "n"),
                true,
            ),
            (
                rule(&["get"], &["*"], &["pods"]),
                resource(&user, "get", "ns", ("anything", "pods", ""), ""),
                true,
            ),
            (
                rule(&["get"], &[""], &["pods"]),
                resource(&user, "get", "ns", ("apps", "pods", ""), ""),
                false,
            ),
            (
                rule(&["get"], &[""], &["pods"]),
                resource(&user, "list", "ns", ("", "pods", ""), ""),
                false,
            ),
            (
                rule(&["get"], &[""], &["pods/log"]),
                resource(&user, "get", "ns", ("", "pods", "log"), "p"),
                true,
            ),
            (
                rule(&["get"], &[""], &["*/log"]),
                resource(&user, "get", "ns", ("", "nodes", "log"), "p"),
                true,
            ),
            (
                rule(&["get"], &[""], &["*/log"]),
                resource(&user, "get", "ns", ("", "log", ""), "p"),
                false,
            ),
            // A resource rule never matches a path, nor a URL rule a resource.
            (
                rule(&["get"], &["*"], &["*"]),
                path(&user, "get", "/api"),
                false,
            ),
            (
                url_rule(&["get"], &["*"]),
                resource(&user, "get", "ns", ("", "pods", ""), ""),
                false,
            ),
            (
                url_rule(&["*"], &["/api"]),
                path(&user, "delete", "/api"),
                true,
            ),
        ];
        for (rule, attributes, expected) in cases {
            assert_eq!(
                rule_allows(attributes, rule),
                *expected,
                "{rule:?} vs {attributes:?}"
            );
        }
    }

    #[test]
    fn non_resource_url_prefixes() {
        let cases: &[(&[&str], &str, bool)] = &[
            (&["/healthz/*"], "/healthz/etcd", true),
            (&["/healthz/*"], "/healthz/", true),
            (&["/healthz/*"], "/healthz", false),
            (&["/logs*"], "/logs", true),
            (&["/logs*"], "/logsfoo/bar", true),
            (&["/logs*"], "/log", false),
            (&["/foo**"], "/foo", true),
            (&["*"], "/anything", true),
            (&["/api"], "/api/v1", false),
            (&["/api", "/api/*"], "/api/v1", true),
            (&["/metrics"], "/metrics", true),
        ];
        for &(urls, requested, expected) in cases {
            let rule = url_rule(&["get"], urls);
            assert_eq!(
                non_resource_url_matches(&rule, requested),
                expected,
                "{urls:?} vs {requested}"
            );
        }
    }

    #[test]
    fn subjects() {
        let reader = UserInfo::service_account("team", "reader");
        let devs = UserInfo::new("dan", &["devs"]);
        let cases: &[(Subject, &str, &UserInfo, bool)] = &[
            (subject(USER_KIND, "alice", None), "", &alice(), true),
            (subject(USER_KIND, "alice", None), "", &devs, false),
            (subject(GROUP_KIND, "devs", None), "", &devs, true),
            (subject(GROUP_KIND, "devs", None), "", &alice(), false),
            (
                subject(GROUP_KIND, ALL_SERVICE_ACCOUNTS_GROUP, None),
                "",
                &reader,
                true,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", Some("team")),
                "",
                &reader,
                true,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", Some("team")),
                "other",
                &reader,
                true,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", Some("other")),
                "team",
                &reader,
                false,
            ),
            // No namespace: the binding's, so never in a ClusterRoleBinding.
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", None),
                "",
                &reader,
                false,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", None),
                "team",
                &reader,
                true,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "reader", None),
                "other",
                &reader,
                false,
            ),
            (
                subject(SERVICE_ACCOUNT_KIND, "read", Some("team")),
                "",
                &reader,
                false,
            ),
            (
                subject(USER_KIND, "system:serviceaccount:team:reader", None),
                "",
                &reader,
                true,
            ),
            (subject("Robot", "alice", None), "", &alice(), false),
        ];
        for (subject, namespace, user, expected) in cases {
            assert_eq!(
                applies_to_user(user, subject, namespace),
                *expected,
                "{subject:?} in {namespace:?} for {}",
                user.name
            );
        }
    }

    #[test]
    fn service_account_usernames() {
        let cases: &[(&str, &str, &str, bool)] = &[
            ("team", "reader", "system:serviceaccount:team:reader", true),
            (
                "team",
                "reader",
                "system:serviceaccount:team:reader2",
                false,
            ),
            (
                "team",
                "reader",
                "system:serviceaccount:teamx:reader",
                false,
            ),
            (
                "team",
                "reader",
                "system:serviceaccounts:team:reader",
                false,
            ),
            ("team", "reader", "reader", false),
        ];
        for &(namespace, name, username, expected) in cases {
            assert_eq!(
                matches_username(namespace, name, username),
                expected,
                "{username}"
            );
        }
        assert_eq!(
            make_username("team", "reader"),
            "system:serviceaccount:team:reader"
        );
    }

    #[test]
    fn missing_roles_are_reported_and_skipped() {
        let dave = UserInfo::new("dave", &[]);
        let to_dave = || vec![subject(USER_KIND, "dave", None)];
        let mut policy = Policy {
            cluster_role_bindings: vec![crb("dangling", ("ClusterRole", "missing"), to_dave())],
            role_bindings: vec![
                role_binding("team", "gone", ("Role", "gone"), to_dave()),
                role_binding("team", "weird", ("Weird", "x"), to_dave()),
                role_binding("team", "again", ("Role", "gone"), to_dave()),
            ],
            ..Policy::default()
        };
        let get_pods = resource(&dave, "get", "team", ("", "pods", ""), "p");
        assert_eq!(
            policy.authorize(&get_pods),
            (
                NoOpinion,
                r#"RBAC: [clusterrole.rbac.authorization.k8s.io "missing" not found, role.rbac.authorization.k8s.io "gone" not found, unsupported role reference kind: "Weird"]"#
                    .to_string()
            )
        );
        let get_nodes = resource(&dave, "get", "", ("", "nodes", ""), "n");
        assert_eq!(
            policy.authorize(&get_nodes),
            (
                NoOpinion,
                r#"RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found"#.to_string()
            )
        );
        assert_eq!(policy.rules_for(&dave, "team"), (Vec::new(), true));

        // Rules are additive: what resolves still allows.
        policy.cluster_roles.push(plain_cluster_role(
            "pod-reader",
            vec![rule(READ, &[""], &["pods"])],
        ));
        policy.cluster_role_bindings.push(crb(
            "dave-pods",
            ("ClusterRole", "pod-reader"),
            to_dave(),
        ));
        assert_eq!(policy.authorize(&get_pods).0, Allow);
        assert_eq!(
            policy.rules_for(&dave, "team"),
            (vec![rule(READ, &[""], &["pods"])], true)
        );
    }

    #[test]
    fn roles_resolve_in_the_binding_namespace() {
        let erin = UserInfo::new("erin", &[]);
        let to_erin = || vec![subject(USER_KIND, "erin", None)];
        let policy = Policy {
            roles: vec![Role {
                metadata: meta(Some("team"), "pod-reader"),
                rules: Some(vec![rule(READ, &[""], &["pods"])]),
            }],
            role_bindings: vec![
                role_binding("team", "erin", ("Role", "pod-reader"), to_erin()),
                role_binding("other", "erin", ("Role", "pod-reader"), to_erin()),
            ],
            cluster_role_bindings: vec![crb("erin", ("Role", "pod-reader"), to_erin())],
            ..Policy::default()
        };
        let in_team = resource(&erin, "list", "team", ("", "pods", ""), "");
        assert_eq!(policy.authorize(&in_team).0, Allow);
        let (decision, reason) =
            policy.authorize(&resource(&erin, "list", "other", ("", "pods", ""), ""));
        assert_eq!(decision, NoOpinion);
        // The ClusterRoleBinding's Role is not found anywhere, then neither is other's; the two
        // identical messages collapse to one.
        assert_eq!(
            reason,
            r#"RBAC: role.rbac.authorization.k8s.io "pod-reader" not found"#
        );
    }

    #[test]
    fn rules_for_lists_cluster_and_namespace_rules() {
        let policy = reader_policy();
        let roles = &policy.cluster_roles;
        let reader = UserInfo::service_account("team", "reader");
        let cluster_wide: Vec<PolicyRule> = [
            "system:basic-user",
            "system:discovery",
            "system:public-info-viewer",
            "system:service-account-issuer-discovery",
        ]
        .iter()
        .flat_map(|name| rules_of(roles, name))
        .collect();
        let in_team: Vec<PolicyRule> = cluster_wide
            .iter()
            .cloned()
            .chain(rules_of(roles, "view"))
            .collect();
        let cases: &[(&UserInfo, &str, Vec<PolicyRule>)] = &[
            (&reader, "team", in_team),
            (&reader, "other", cluster_wide.clone()),
            (&reader, "", cluster_wide),
            (
                &UserInfo::anonymous(),
                "team",
                rules_of(roles, "system:public-info-viewer"),
            ),
        ];
        for (user, namespace, expected) in cases {
            let (rules, incomplete) = policy.rules_for(user, namespace);
            assert_eq!(&rules, expected, "{} in {namespace:?}", user.name);
            assert!(!incomplete);
        }
        assert_eq!(policy.rules_for(&reader, "team").0.len(), 5 + 10);
    }

    fn compact_strings(rules: &[PolicyRule]) -> Vec<String> {
        rules.iter().map(compact_string).collect()
    }

    #[test]
    fn covers_prevents_escalation() {
        let roles = aggregate_cluster_roles(&bootstrap_cluster_roles());
        let view = rules_of(&roles, "view");
        let edit = rules_of(&roles, "edit");
        let cluster_admin = rules_of(&roles, "cluster-admin");
        let names = |names: &[&str]| named_rule(&["get"], &[""], &["configmaps"], names);
        let cases: &[(&[PolicyRule], &[PolicyRule], &[&str])] = &[
            (&cluster_admin, &view, &[]),
            (&cluster_admin, &[url_rule(&["get"], &["/metrics"])], &[]),
            (&edit, &view, &[]),
            (
                &view,
                &[rule(&["create"], &[""], &["pods"])],
                &[r#"{APIGroups:[""], Resources:["pods"], Verbs:["create"]}"#],
            ),
            (
                &view,
                &[rule(&["get", "list"], &["", "apps"], &["pods"])],
                &[
                    r#"{APIGroups:["apps"], Resources:["pods"], Verbs:["get"]}"#,
                    r#"{APIGroups:["apps"], Resources:["pods"], Verbs:["list"]}"#,
                ],
            ),
            (
                &[rule(&["update"], &["apps"], &["*/scale"])],
                &[rule(
                    &["update"],
                    &["apps"],
                    &["deployments/scale", "replicasets/scale"],
                )],
                &[],
            ),
            (
                &[rule(&["update"], &["apps"], &["*/scale"])],
                &[rule(&["update"], &["apps"], &["deployments"])],
                &[r#"{APIGroups:["apps"], Resources:["deployments"], Verbs:["update"]}"#],
            ),
            (
                &[rule(&["get"], &["apps"], &["*"])],
                &[rule(&["get"], &["apps"], &["deployments/status"])],
                &[],
            ),
            (&[names(&["a", "b"])], &[names(&["a"])], &[]),
            (
                &[names(&["a"])],
                &[names(&["a", "b"])],
                &[
                    r#"{APIGroups:[""], Resources:["configmaps"], ResourceNames:["b"], Verbs:["get"]}"#,
                ],
            ),
            (
                &[names(&["a"])],
                &[rule(&["get"], &[""], &["configmaps"])],
                &[r#"{APIGroups:[""], Resources:["configmaps"], Verbs:["get"]}"#],
            ),
            (
                &[rule(&["get"], &[""], &["configmaps"])],
                &[names(&["a"])],
                &[],
            ),
            (
                &[url_rule(&["get"], &["/healthz/*"])],
                &[url_rule(&["get"], &["/healthz/etcd"])],
                &[],
            ),
            (
                &[url_rule(&["get"], &["/healthz/*"])],
                &[url_rule(&["get", "post"], &["/healthz"])],
                &[
                    r#"{NonResourceURLs:["/healthz"], Verbs:["get"]}"#,
                    r#"{NonResourceURLs:["/healthz"], Verbs:["post"]}"#,
                ],
            ),
            // Resource wildcards grant no paths.
            (
                &[rule(&["*"], &["*"], &["*"])],
                &[url_rule(&["get"], &["/metrics"])],
                &[r#"{NonResourceURLs:["/metrics"], Verbs:["get"]}"#],
            ),
            (&[], &[], &[]),
        ];
        for (owner, servant, expected) in cases {
            let (covered, uncovered) = covers(owner, servant);
            assert_eq!(compact_strings(&uncovered), *expected, "{servant:?}");
            assert_eq!(covered, expected.is_empty());
        }
        let (covered, uncovered) = covers(&view, &edit);
        assert!(!covered);
        assert!(uncovered.iter().any(|r| list(&r.resources) == ["secrets"]));
    }

    #[test]
    fn escalation_messages() {
        let roles = aggregate_cluster_roles(&bootstrap_cluster_roles());
        let view = rules_of(&roles, "view");
        let grant = [rule(
            &["get", "list", "create", "delete"],
            &[""],
            &["pods", "secrets"],
        )];
        let (covered, uncovered) = covers(&view, &grant);
        assert!(!covered);
        assert_eq!(
            confirm_no_escalation_message(&alice(), &uncovered),
            "user \"alice\" (groups=[\"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\" \"delete\"]}\n\
             {APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"create\" \"delete\" \"get\" \"list\"]}"
        );
        let url = [
            url_rule(&["get"], &["/metrics"]),
            named_rule(&["get"], &[""], &["configmaps"], &["a"]),
        ];
        assert_eq!(
            confirm_no_escalation_message(&UserInfo::new("bob", &[]), &covers(&[], &url).1),
            "user \"bob\" (groups=[]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"configmaps\"], ResourceNames:[\"a\"], Verbs:[\"get\"]}\n\
             {NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}"
        );

        let mut policy = reader_policy();
        let reader = UserInfo::service_account("team", "reader");
        assert_eq!(policy.confirm_no_escalation(&reader, "team", &view), Ok(()));
        let create_pods = [rule(&["create"], &[""], &["pods"])];
        let missing = "user \"system:serviceaccount:team:reader\" (groups=[\"system:serviceaccounts\" \"system:serviceaccounts:team\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
                       {APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"create\"]}";
        let refusal = policy.confirm_no_escalation(&reader, "team", &create_pods);
        assert_eq!(refusal.map_err(|e| e.to_string()), Err(missing.to_string()));
        assert!(
            policy
                .confirm_no_escalation(&reader, "other", &view)
                .is_err()
        );

        policy.cluster_role_bindings.push(crb(
            "dangling",
            ("ClusterRole", "missing"),
            vec![subject(GROUP_KIND, ALL_AUTHENTICATED, None)],
        ));
        let refusal = policy.confirm_no_escalation(&reader, "team", &create_pods);
        assert_eq!(
            refusal.map_err(|e| e.to_string()),
            Err(format!(
                "{missing}; resolution errors: [clusterrole.rbac.authorization.k8s.io \"missing\" not found]"
            ))
        );
    }

    #[test]
    fn compact_rules_merges_verbs_of_simple_rules() {
        let rules = [
            rule(&["get"], &[""], &["pods"]),
            url_rule(&["get"], &["/x"]),
            rule(&["list"], &[""], &["pods"]),
            named_rule(&["get"], &[""], &["pods"], &["a"]),
            named_rule(&["list"], &[""], &["pods"], &["a"]),
            rule(&["get"], &["", "apps"], &["pods"]),
        ];
        assert_eq!(
            compact_strings(&compact_rules(&rules)),
            [
                r#"{NonResourceURLs:["/x"], Verbs:["get"]}"#,
                r#"{APIGroups:["" "apps"], Resources:["pods"], Verbs:["get"]}"#,
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["get" "list"]}"#,
                r#"{APIGroups:[""], Resources:["pods"], ResourceNames:["a"], Verbs:["get" "list"]}"#,
            ]
        );
    }

    #[test]
    fn forbidden_messages_match_upstream() {
        let reader = UserInfo::service_account("team", "reader");
        let anonymous = UserInfo::anonymous();
        let quoted = UserInfo::new("a\"b", &[]);
        let cases: &[(Attributes, &str, &str, &str)] = &[
            (
                resource(&reader, "list", "other", ("", "pods", ""), ""),
                "",
                r#"User "system:serviceaccount:team:reader" cannot list resource "pods" in API group "" in the namespace "other""#,
                r#"pods is forbidden: User "system:serviceaccount:team:reader" cannot list resource "pods" in API group "" in the namespace "other""#,
            ),
            (
                resource(&alice(), "get", "", ("", "nodes", ""), "node-1"),
                "",
                r#"User "alice" cannot get resource "nodes" in API group "" at the cluster scope"#,
                r#"nodes "node-1" is forbidden: User "alice" cannot get resource "nodes" in API group "" at the cluster scope"#,
            ),
            (
                resource(
                    &alice(),
                    "create",
                    "team",
                    ("", "pods", "eviction"),
                    "web-0",
                ),
                "",
                r#"User "alice" cannot create resource "pods/eviction" in API group "" in the namespace "team""#,
                r#"pods "web-0" is forbidden: User "alice" cannot create resource "pods/eviction" in API group "" in the namespace "team""#,
            ),
            (
                resource(
                    &alice(),
                    "update",
                    "team",
                    ("apps", "deployments", "scale"),
                    "web",
                ),
                "",
                r#"User "alice" cannot update resource "deployments/scale" in API group "apps" in the namespace "team""#,
                r#"deployments.apps "web" is forbidden: User "alice" cannot update resource "deployments/scale" in API group "apps" in the namespace "team""#,
            ),
            (
                resource(&alice(), "list", "", (GROUP_NAME, "clusterroles", ""), ""),
                r#"RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found"#,
                r#"User "alice" cannot list resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope"#,
                r#"clusterroles.rbac.authorization.k8s.io is forbidden: User "alice" cannot list resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope: RBAC: clusterrole.rbac.authorization.k8s.io "missing" not found"#,
            ),
            (
                path(&anonymous, "get", "/metrics"),
                "",
                r#"User "system:anonymous" cannot get path "/metrics""#,
                r#"forbidden: User "system:anonymous" cannot get path "/metrics""#,
            ),
            (
                path(&anonymous, "get", "/<b>&"),
                "",
                r#"User "system:anonymous" cannot get path "/<b>&""#,
                r#"forbidden: User "system:anonymous" cannot get path "/&lt;b&gt;&amp;""#,
            ),
            (
                resource(&quoted, "get", "ns", ("", "pods", ""), ""),
                "",
                r#"User "a\"b" cannot get resource "pods" in API group "" in the namespace "ns""#,
                r#"pods is forbidden: User "a\"b" cannot get resource "pods" in API group "" in the namespace "ns""#,
            ),
        ];
        for (attributes, reason, expected_reason, expected_status) in cases {
            assert_eq!(forbidden_reason(attributes), *expected_reason);
            assert_eq!(
                forbidden_status_message(attributes, reason),
                *expected_status
            );
        }
    }

    #[test]
    fn bootstrap_aggregation_nests_view_in_edit_in_admin() {
        let bootstrap = bootstrap_cluster_roles();
        let roles = aggregate_cluster_roles(&bootstrap);
        let view = rules_of(&roles, "view");
        let edit = rules_of(&roles, "edit");
        let admin = rules_of(&roles, "admin");
        assert_eq!(view, rules_of(&bootstrap, "system:aggregate-to-view"));
        // Matching roles are taken in name order: system:aggregate-to-edit before view, edit
        // before system:aggregate-to-admin.
        let expected_edit: Vec<PolicyRule> = [
            rules_of(&bootstrap, "system:aggregate-to-edit"),
            view.clone(),
        ]
        .concat();
        assert_eq!(edit, expected_edit);
        let expected_admin: Vec<PolicyRule> = [
            edit.clone(),
            rules_of(&bootstrap, "system:aggregate-to-admin"),
        ]
        .concat();
        assert_eq!(admin, expected_admin);
        assert!(!view.iter().any(|r| has(list(&r.resources), "secrets")));
        assert!(edit.iter().any(|r| has(list(&r.resources), "secrets")));
        // Already converged: a second pass changes nothing, and non-aggregated roles are
        // returned untouched, in input order.
        assert_eq!(aggregate_cluster_roles(&roles), roles);
        let names = |roles: &[ClusterRole]| -> Vec<String> {
            roles
                .iter()
                .map(|r| object_name(&r.metadata).to_string())
                .collect()
        };
        assert_eq!(names(&roles), names(&bootstrap));
        assert_eq!(
            rules_of(&roles, "system:node"),
            rules_of(&bootstrap, "system:node")
        );
    }

    #[test]
    fn custom_role_labelled_aggregate_to_view_reaches_view_edit_and_admin() {
        let widgets = rule(READ, &["example.com"], &["widgets"]);
        let duplicate = rule(READ, &[DISCOVERY_GROUP], &["endpointslices"]);
        let mut custom = plain_cluster_role("widgets-view", vec![widgets.clone(), duplicate]);
        custom.metadata.labels = Some(BTreeMap::from([(
            AGGREGATE_TO_VIEW_LABEL.to_string(),
            "true".to_string(),
        )]));
        let mut input = bootstrap_cluster_roles();
        input.insert(0, custom);
        let roles = aggregate_cluster_roles(&input);
        let bootstrap_view = rules_of(&bootstrap_cluster_roles(), "system:aggregate-to-view");
        // The duplicate endpointslices rule is dropped; the new one follows, as
        // "system:aggregate-to-view" sorts before "widgets-view".
        assert_eq!(
            rules_of(&roles, "view"),
            [bootstrap_view, vec![widgets.clone()]].concat()
        );
        assert!(rules_of(&roles, "edit").contains(&widgets));
        assert!(rules_of(&roles, "admin").contains(&widgets));

        let mut policy = reader_policy();
        policy.cluster_roles = roles;
        let reader = UserInfo::service_account("team", "reader");
        let list_widgets = resource(&reader, "list", "team", ("example.com", "widgets", ""), "");
        assert_eq!(policy.authorize(&list_widgets).0, Allow);
    }

    #[test]
    fn aggregation_selectors() {
        let labelled = |name: &str, labels: &[(&str, &str)]| {
            let mut role = plain_cluster_role(name, vec![rule(&["get"], &["x"], &[name])]);
            role.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            role
        };
        let others = [
            labelled("d", &[]),
            labelled("a", &[("tier", "gold")]),
            labelled("c", &[("tier", "silver"), ("retired", "yes")]),
            labelled("b", &[("tier", "bronze")]),
        ];
        let labels = |pairs: &[(&str, &str)]| LabelSelector {
            match_labels: Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        };
        let expression = |key: &str, operator: &str, values: &[&str]| LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.to_string(),
                operator: operator.to_string(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| v.to_string()).collect()),
            }]),
        };
        let sentinel = rule(&["get"], &["x"], &["unchanged"]);
        let cases: Vec<(Vec<LabelSelector>, Vec<&str>)> = vec![
            (vec![labels(&[("tier", "gold")])], vec!["a"]),
            (
                vec![expression("tier", "In", &["gold", "silver"])],
                vec!["a", "c"],
            ),
            (
                vec![expression("tier", "NotIn", &["gold"])],
                vec!["b", "c", "d"],
            ),
            (vec![expression("tier", "Exists", &[])], vec!["a", "b", "c"]),
            (
                vec![expression("retired", "DoesNotExist", &[])],
                vec!["a", "b", "d"],
            ),
            (vec![LabelSelector::default()], vec!["a", "b", "c", "d"]),
            (
                vec![labels(&[("tier", "bronze")]), labels(&[("tier", "gold")])],
                vec!["b", "a"],
            ),
            (
                vec![
                    labels(&[("tier", "gold")]),
                    expression("tier", "Exists", &[]),
                ],
                vec!["a", "b", "c"],
            ),
            (Vec::new(), Vec::new()),
            (
                vec![expression("tier", "Sometimes", &["gold"])],
                vec!["unchanged"],
            ),
            (vec![expression("tier", "In", &[])], vec!["unchanged"]),
        ];
        for (selectors, expected) in cases {
            let aggregator = ClusterRole {
                metadata: meta(None, "aggregator"),
                rules: Some(vec![sentinel.clone()]),
                aggregation_rule: Some(AggregationRule {
                    cluster_role_selectors: Some(selectors.clone()),
                }),
            };
            let mut input = others.to_vec();
            input.push(aggregator);
            let output = aggregate_cluster_roles(&input);
            let got: Vec<String> = rules_of(&output, "aggregator")
                .iter()
                .flat_map(|r| list(&r.resources).to_vec())
                .collect();
            assert_eq!(got, expected, "{selectors:?}");
            assert_eq!(
                &output[..4],
                &others[..],
                "non-aggregated roles are untouched"
            );
        }
    }

    #[test]
    fn bootstrap_cluster_roles_carry_upstream_metadata() {
        let roles = bootstrap_cluster_roles();
        let required = [
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:aggregate-to-admin",
            "system:aggregate-to-edit",
            "system:aggregate-to-view",
            "system:discovery",
            "system:basic-user",
            "system:public-info-viewer",
            "system:node",
            "system:node-proxier",
            "system:kube-scheduler",
            "system:kube-controller-manager",
            "system:node-bootstrapper",
            "system:auth-delegator",
            "system:service-account-issuer-discovery",
            "system:monitoring",
            "system:volume-scheduler",
            "system:kube-dns",
        ];
        for name in required {
            assert!(
                roles.iter().any(|r| object_name(&r.metadata) == name),
                "{name} missing"
            );
        }
        for role in &roles {
            let labels = role.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get(BOOTSTRAPPING_LABEL_KEY).map(String::as_str),
                Some("rbac-defaults")
            );
            let annotations = role.metadata.annotations.clone().unwrap_or_default();
            assert_eq!(
                annotations
                    .get(AUTO_UPDATE_ANNOTATION_KEY)
                    .map(String::as_str),
                Some("true")
            );
        }
        let mut sorted_names: Vec<&str> = roles.iter().map(|r| object_name(&r.metadata)).collect();
        sorted_names.sort_unstable();
        assert!(
            roles
                .iter()
                .map(|r| object_name(&r.metadata))
                .eq(sorted_names)
        );

        let aggregation = |name: &str| {
            let role = roles
                .iter()
                .find(|r| object_name(&r.metadata) == name)
                .expect("bootstrap role exists");
            let selectors = role
                .aggregation_rule
                .as_ref()
                .and_then(|a| a.cluster_role_selectors.clone())
                .unwrap_or_default();
            let labels = role.metadata.labels.clone().unwrap_or_default();
            (
                selectors
                    .into_iter()
                    .flat_map(|s| s.match_labels.unwrap_or_default())
                    .collect::<Vec<_>>(),
                labels
                    .into_iter()
                    .filter(|(k, _)| k != BOOTSTRAPPING_LABEL_KEY)
                    .collect::<Vec<_>>(),
                role.rules.is_none(),
            )
        };
        let pair = |k: &str| vec![(k.to_string(), "true".to_string())];
        assert_eq!(
            aggregation("admin"),
            (pair(AGGREGATE_TO_ADMIN_LABEL), vec![], true)
        );
        assert_eq!(
            aggregation("edit"),
            (
                pair(AGGREGATE_TO_EDIT_LABEL),
                pair(AGGREGATE_TO_ADMIN_LABEL),
                true
            )
        );
        assert_eq!(
            aggregation("view"),
            (
                pair(AGGREGATE_TO_VIEW_LABEL),
                pair(AGGREGATE_TO_EDIT_LABEL),
                true
            )
        );
        assert_eq!(
            aggregation("system:aggregate-to-admin"),
            (vec![], pair(AGGREGATE_TO_ADMIN_LABEL), false)
        );
        assert_eq!(
            aggregation("system:aggregate-to-edit"),
            (vec![], pair(AGGREGATE_TO_EDIT_LABEL), false)
        );
        assert_eq!(
            aggregation("system:aggregate-to-view"),
            (vec![], pair(AGGREGATE_TO_VIEW_LABEL), false)
        );

        // A few roles exactly as upstream's golden testdata/cluster-roles.yaml renders them.
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rules_of(&roles, "cluster-admin"),
            vec![
                PolicyRule {
                    api_groups: Some(strings(&["*"])),
                    resources: Some(strings(&["*"])),
                    verbs: strings(&["*"]),
                    ..PolicyRule::default()
                },
                PolicyRule {
                    non_resource_urls: Some(strings(&["*"])),
                    verbs: strings(&["*"]),
                    ..PolicyRule::default()
                },
            ]
        );
        assert_eq!(
            rules_of(&roles, "system:discovery"),
            vec![PolicyRule {
                non_resource_urls: Some(strings(&[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ])),
                verbs: strings(&["get"]),
                ..PolicyRule::default()
            }]
        );
        assert_eq!(
            rules_of(&roles, "system:node-proxier"),
            vec![
                PolicyRule {
                    api_groups: Some(strings(&[""])),
                    resources: Some(strings(&["endpoints", "services"])),
                    verbs: strings(&["list", "watch"]),
                    ..PolicyRule::default()
                },
                PolicyRule {
                    api_groups: Some(strings(&[""])),
                    resources: Some(strings(&["nodes"])),
                    verbs: strings(&["get", "list", "watch"]),
                    ..PolicyRule::default()
                },
                PolicyRule {
                    api_groups: Some(strings(&["", "events.k8s.io"])),
                    resources: Some(strings(&["events"])),
                    verbs: strings(&["create", "patch", "update"]),
                    ..PolicyRule::default()
                },
                PolicyRule {
                    api_groups: Some(strings(&["discovery.k8s.io"])),
                    resources: Some(strings(&["endpointslices"])),
                    verbs: strings(&["list", "watch"]),
                    ..PolicyRule::default()
                },
            ]
        );
        assert_eq!(
            rules_of(&roles, "system:kube-scheduler")[2],
            PolicyRule {
                api_groups: Some(strings(&["coordination.k8s.io"])),
                resource_names: Some(strings(&["kube-scheduler"])),
                resources: Some(strings(&["leases"])),
                verbs: strings(&["get", "list", "update", "watch"]),
                ..PolicyRule::default()
            }
        );
    }

    #[test]
    fn bootstrap_cluster_role_bindings_match_upstream() {
        let bindings = bootstrap_cluster_role_bindings();
        // kind, name, namespace, apiGroup
        type RenderedSubject = (String, String, Option<String>, Option<String>);
        let rendered: Vec<(String, String, Vec<RenderedSubject>)> = bindings
            .iter()
            .map(|b| {
                (
                    object_name(&b.metadata).to_string(),
                    format!(
                        "{}/{}/{}",
                        b.role_ref.api_group, b.role_ref.kind, b.role_ref.name
                    ),
                    b.subjects
                        .iter()
                        .flatten()
                        .map(|s| {
                            (
                                s.kind.clone(),
                                s.name.clone(),
                                s.namespace.clone(),
                                s.api_group.clone(),
                            )
                        })
                        .collect(),
                )
            })
            .collect();
        let rbac = || Some(GROUP_NAME.to_string());
        let group = |name: &str| (GROUP_KIND.to_string(), name.to_string(), None, rbac());
        let user = |name: &str| (USER_KIND.to_string(), name.to_string(), None, rbac());
        let to_role = |name: &str| format!("{GROUP_NAME}/ClusterRole/{name}");
        let expected = vec![
            ("cluster-admin", vec![group("system:masters")]),
            ("system:basic-user", vec![group("system:authenticated")]),
            ("system:discovery", vec![group("system:authenticated")]),
            (
                "system:kube-controller-manager",
                vec![user("system:kube-controller-manager")],
            ),
            (
                "system:kube-dns",
                vec![(
                    SERVICE_ACCOUNT_KIND.to_string(),
                    "kube-dns".to_string(),
                    Some("kube-system".to_string()),
                    None,
                )],
            ),
            ("system:kube-scheduler", vec![user("system:kube-scheduler")]),
            ("system:monitoring", vec![group("system:monitoring")]),
            ("system:node", vec![]),
            ("system:node-proxier", vec![user("system:kube-proxy")]),
            (
                "system:public-info-viewer",
                vec![
                    group("system:authenticated"),
                    group("system:unauthenticated"),
                ],
            ),
            (
                "system:service-account-issuer-discovery",
                vec![group("system:serviceaccounts")],
            ),
            (
                "system:volume-scheduler",
                vec![user("system:kube-scheduler")],
            ),
        ];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(name, subjects)| (name.to_string(), to_role(name), subjects))
            .collect();
        assert_eq!(rendered, expected);
        assert!(bindings.iter().all(|b| {
            b.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(BOOTSTRAPPING_LABEL_KEY))
                .map(String::as_str)
                == Some("rbac-defaults")
                && b.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(AUTO_UPDATE_ANNOTATION_KEY))
                    .map(String::as_str)
                    == Some("true")
        }));
        // Every binding refers to a bootstrap role.
        let roles = bootstrap_cluster_roles();
        let policy = Policy {
            cluster_roles: roles,
            cluster_role_bindings: bindings,
            ..Policy::default()
        };
        for binding in &policy.cluster_role_bindings {
            assert!(
                policy
                    .get_role_reference_rules(&binding.role_ref, "")
                    .is_ok()
            );
        }
        assert_eq!(
            policy.authorize(&resource(
                &UserInfo::service_account("kube-system", "kube-dns"),
                "watch",
                "",
                ("", "services", ""),
                ""
            )),
            (
                Allow,
                r#"RBAC: allowed by ClusterRoleBinding "system:kube-dns" of ClusterRole "system:kube-dns" to ServiceAccount "kube-dns/kube-system""#
                    .to_string()
            )
        );
    }
}
