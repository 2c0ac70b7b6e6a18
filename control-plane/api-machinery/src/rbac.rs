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

mod bootstrap_policy;
pub use bootstrap_policy::{
    BOOTSTRAPPERS_GROUP, bootstrap_cluster_role_bindings, bootstrap_cluster_roles,
    node_bootstrap_cluster_role_bindings,
};

#[cfg(test)]
mod tests;
