//! Upstream's bootstrap policy (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy`): the default
//! ClusterRoles and ClusterRoleBindings every cluster starts with, kubeadm's node-joining
//! bindings, and Flotilla's `flotilla:node-proxier`.

use super::*;

// Verb sets of upstream's bootstrap policy.
pub(super) const READ: &[&str] = &["get", "list", "watch"];
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
pub(super) const CERTIFICATES_GROUP: &str = "certificates.k8s.io";
const COORDINATION_GROUP: &str = "coordination.k8s.io";
pub(super) const DISCOVERY_GROUP: &str = "discovery.k8s.io";
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
pub(super) fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(sorted(groups)),
        resources: Some(sorted(resources)),
        verbs: sorted(verbs),
        ..PolicyRule::default()
    }
}

/// `NewRule(verbs...).Groups(groups...).Resources(resources...).Names(names...)`.
pub(super) fn named_rule(
    verbs: &[&str],
    groups: &[&str],
    resources: &[&str],
    names: &[&str],
) -> PolicyRule {
    PolicyRule {
        resource_names: Some(sorted(names)),
        ..rule(verbs, groups, resources)
    }
}

/// `NewRule(verbs...).URLs(urls...)`.
pub(super) fn url_rule(verbs: &[&str], urls: &[&str]) -> PolicyRule {
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
        // What metrics-server's manifests add: reading metrics.k8s.io, aggregated into the
        // user-facing roles (the metrics API is served natively here). Labelled for view
        // only, which edit and admin take in.
        cluster_role(
            "system:aggregated-metrics-reader",
            &[(AGGREGATE_TO_VIEW_LABEL, "true")],
            vec![rule(READ, &["metrics.k8s.io"], &["pods", "nodes"])],
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
