//! The RBAC authorizer's, rule resolver's, escalation checks' and bootstrap policy's table tests.

use super::bootstrap_policy::{
    CERTIFICATES_GROUP, DISCOVERY_GROUP, READ, named_rule, rule, url_rule,
};
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
    policy
        .cluster_role_bindings
        .push(crb("dave-pods", ("ClusterRole", "pod-reader"), to_dave()));
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
    assert_eq!(policy.rules_for(&reader, "team").0.len(), 5 + 11);
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
            &[r#"{APIGroups:[""], Resources:["configmaps"], ResourceNames:["b"], Verbs:["get"]}"#],
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
    // metrics-server's reader role sorts after upstream's.
    let expected_view: Vec<PolicyRule> = [
        rules_of(&bootstrap, "system:aggregate-to-view"),
        rules_of(&bootstrap, "system:aggregated-metrics-reader"),
    ]
    .concat();
    assert_eq!(view, expected_view);
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
    let bootstrap_view = [
        rules_of(&bootstrap_cluster_roles(), "system:aggregate-to-view"),
        rules_of(
            &bootstrap_cluster_roles(),
            "system:aggregated-metrics-reader",
        ),
    ]
    .concat();
    // The duplicate endpointslices rule is dropped; the new one follows, as
    // "system:aggregate-to-view" and "system:aggregated-metrics-reader" sort before
    // "widgets-view".
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
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
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
