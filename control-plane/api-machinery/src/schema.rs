//! Per-field merge semantics of the built-in kinds, as data: the strategic-merge-patch struct
//! tags (`patchStrategy:"merge" patchMergeKey:"name"`) and the server-side-apply list types
//! (`+listType=map +listMapKey=...`, `+listType=set`, atomic lists, maps and structs).
//!
//! Only fields whose behaviour differs from the default are listed. The defaults are upstream's:
//! maps (structs) merge key by key, lists are replaced wholesale by a strategic merge patch and
//! are atomic for server-side apply. A kind this module does not know yields `None` from
//! [`Schema::for_kind`]; upstream rejects strategic merge patches for such kinds (custom
//! resources) with 415, so the caller decides.
//!
//! Paths are field names from the object root; list elements are entered implicitly, so the
//! containers of a Deployment are at `["spec", "template", "spec", "containers"]` and their
//! ports at `[..., "containers", "ports"]`.

/// How a strategic merge patch combines a field with the live value (upstream `patchStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchStrategy {
    /// No tag: maps merge recursively, lists are replaced.
    Unspecified,
    /// `patchStrategy:"merge"`: lists merge, by [`FieldMeta::patch_merge_key`] for lists of
    /// objects or by value for lists of primitives.
    Merge,
    /// `patchStrategy:"replace"`: the patch value replaces the live value.
    Replace,
}

/// One key field of an associative list, with the default upstream's schema gives it (the
/// `protocol` of a port defaults to `TCP`, so an item without it still has an identity).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListMapKey {
    /// The key field's name.
    pub name: &'static str,
    /// The value assumed when an item omits the field.
    pub default: Option<&'static str>,
}

/// How server-side apply treats a list (upstream `x-kubernetes-list-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListType {
    /// The list is one value, owned and replaced as a whole.
    Atomic,
    /// A set of primitives; each value is owned separately (`v:"x"`).
    Set,
    /// An associative list of objects identified by these key fields (`k:{"name":"x"}`).
    Map(&'static [ListMapKey]),
}

/// The merge semantics of one field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldMeta {
    /// Strategic-merge-patch strategy.
    pub patch_strategy: PatchStrategy,
    /// Strategic-merge-patch merge key for lists of objects.
    pub patch_merge_key: Option<&'static str>,
    /// Whether the field is tagged `retainKeys` (only used when generating patches; the server
    /// honours any `$retainKeys` directive it is sent).
    pub retain_keys: bool,
    /// Server-side-apply list type, if the field is a list.
    pub list_type: ListType,
    /// Whether server-side apply treats the field (a map or struct) as one atomic value.
    pub atomic: bool,
    /// Whether the field exists in the Go zero value of its parent (a non-pointer struct, or a
    /// field without `omitempty`), so field ownership never records it as newly added when its
    /// parent already existed.
    pub embedded: bool,
}

impl FieldMeta {
    const DEFAULT: FieldMeta = FieldMeta {
        patch_strategy: PatchStrategy::Unspecified,
        patch_merge_key: None,
        retain_keys: false,
        list_type: ListType::Atomic,
        atomic: false,
        embedded: false,
    };
}

impl Default for FieldMeta {
    fn default() -> Self {
        FieldMeta::DEFAULT
    }
}

/// The fields of one Go struct that differ from the defaults.
#[derive(Debug)]
pub(crate) struct TypeDef {
    fields: &'static [FieldDef],
}

#[derive(Debug)]
struct FieldDef {
    name: &'static str,
    meta: FieldMeta,
    /// The type of the value, or of the list's elements.
    child: Option<&'static TypeDef>,
}

/// A position in the schema of a kind: the type of the object or sub-object being looked at.
/// An unknown position has all-default semantics.
#[derive(Debug, Clone, Copy, Default)]
pub struct Schema {
    ty: Option<&'static TypeDef>,
}

/// The name upstream's docs and the brief use for strategic-merge-patch metadata.
pub type PatchMeta = Schema;

impl Schema {
    /// The schema of a built-in kind, or `None` for a kind this crate does not know (custom
    /// resources).
    pub fn for_kind(kind: &str) -> Option<Schema> {
        let ty: &'static TypeDef = match kind {
            "Pod" => &POD,
            "PodTemplate" => &POD_TEMPLATE,
            "ReplicationController" => &REPLICATION_CONTROLLER,
            "Deployment" => &DEPLOYMENT,
            "ReplicaSet" | "DaemonSet" => &WORKLOAD,
            "StatefulSet" => &STATEFUL_SET,
            "Job" => &JOB,
            "CronJob" => &CRON_JOB,
            "Service" => &SERVICE,
            "Node" => &NODE,
            "Namespace"
            | "PersistentVolumeClaim"
            | "PersistentVolume"
            | "PodDisruptionBudget"
            | "HorizontalPodAutoscaler"
            | "APIService"
            | "CertificateSigningRequest" => &WITH_STATUS_CONDITIONS,
            "ServiceAccount" => &SERVICE_ACCOUNT,
            "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
                &WEBHOOK_CONFIGURATION
            }
            "ConfigMap"
            | "Secret"
            | "Endpoints"
            | "EndpointSlice"
            | "Event"
            | "Lease"
            | "LimitRange"
            | "ResourceQuota"
            | "Role"
            | "ClusterRole"
            | "RoleBinding"
            | "ClusterRoleBinding"
            | "Ingress"
            | "IngressClass"
            | "NetworkPolicy"
            | "PriorityClass"
            | "StorageClass"
            | "CSIDriver"
            | "CSINode"
            | "VolumeAttachment"
            | "RuntimeClass"
            | "ControllerRevision"
            | "Binding"
            | "ComponentStatus"
            | "CustomResourceDefinition"
            | "FlowSchema"
            | "PriorityLevelConfiguration" => &OBJECT,
            _ => return None,
        };
        Some(Schema { ty: Some(ty) })
    }

    /// The names of the kinds [`Schema::for_kind`] knows.
    pub fn known_kinds() -> &'static [&'static str] {
        KNOWN_KINDS
    }

    /// A schema with default semantics everywhere (what a custom resource gets from
    /// server-side apply when its CRD declares no list types).
    pub fn unknown() -> Schema {
        Schema { ty: None }
    }

    /// The semantics of field `name` at this position.
    pub fn field(&self, name: &str) -> FieldMeta {
        self.find(name).map(|f| f.meta).unwrap_or_default()
    }

    /// The schema of the value of field `name` (of its elements, for a list).
    pub fn child(&self, name: &str) -> Schema {
        Schema {
            ty: self.find(name).and_then(|f| f.child),
        }
    }

    /// The semantics of the field at `path` (field names from this position); an empty path
    /// yields the defaults.
    pub fn lookup(&self, path: &[&str]) -> FieldMeta {
        match path.split_last() {
            None => FieldMeta::default(),
            Some((last, parents)) => parents
                .iter()
                .fold(*self, |schema, name| schema.child(name))
                .field(last),
        }
    }

    fn find(&self, name: &str) -> Option<&'static FieldDef> {
        self.ty
            .and_then(|ty| ty.fields.iter().find(|f| f.name == name))
    }
}

const KNOWN_KINDS: &[&str] = &[
    "APIService",
    "Binding",
    "CSIDriver",
    "CSINode",
    "CertificateSigningRequest",
    "ClusterRole",
    "ClusterRoleBinding",
    "ComponentStatus",
    "ConfigMap",
    "ControllerRevision",
    "CronJob",
    "CustomResourceDefinition",
    "DaemonSet",
    "Deployment",
    "EndpointSlice",
    "Endpoints",
    "Event",
    "FlowSchema",
    "HorizontalPodAutoscaler",
    "Ingress",
    "IngressClass",
    "Job",
    "Lease",
    "LimitRange",
    "MutatingWebhookConfiguration",
    "Namespace",
    "NetworkPolicy",
    "Node",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "Pod",
    "PodDisruptionBudget",
    "PodTemplate",
    "PriorityClass",
    "PriorityLevelConfiguration",
    "ReplicaSet",
    "ReplicationController",
    "ResourceQuota",
    "Role",
    "RoleBinding",
    "RuntimeClass",
    "Secret",
    "Service",
    "ServiceAccount",
    "StatefulSet",
    "StorageClass",
    "ValidatingWebhookConfiguration",
    "VolumeAttachment",
];

// ---- builders (const so the tables are plain statics) ----

/// A plain struct-valued field with its own type.
const fn nested(name: &'static str, child: &'static TypeDef) -> FieldDef {
    FieldDef {
        name,
        meta: FieldMeta::DEFAULT,
        child: Some(child),
    }
}

/// A non-pointer struct field, present in the Go zero value.
const fn embedded(name: &'static str, child: &'static TypeDef) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.embedded = true;
    FieldDef {
        name,
        meta,
        child: Some(child),
    }
}

/// A map or struct that server-side apply treats as one value.
const fn atomic(name: &'static str) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.atomic = true;
    FieldDef {
        name,
        meta,
        child: None,
    }
}

/// Marks a field that the Go zero value of its parent already holds (no `omitempty`).
const fn present_in_zero_value(mut def: FieldDef) -> FieldDef {
    def.meta.embedded = true;
    def
}

/// A list of objects with `patchStrategy:"merge"` and `+listType=map`.
const fn merge_map_list(
    name: &'static str,
    merge_key: &'static str,
    keys: &'static [ListMapKey],
    child: Option<&'static TypeDef>,
) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.patch_strategy = PatchStrategy::Merge;
    meta.patch_merge_key = Some(merge_key);
    meta.list_type = ListType::Map(keys);
    FieldDef { name, meta, child }
}

/// Like [`merge_map_list`] with `patchStrategy:"merge,retainKeys"`.
const fn merge_retain_map_list(
    name: &'static str,
    merge_key: &'static str,
    keys: &'static [ListMapKey],
    child: Option<&'static TypeDef>,
) -> FieldDef {
    let mut def = merge_map_list(name, merge_key, keys, child);
    def.meta.retain_keys = true;
    def
}

/// A list of objects without a patch strategy but with `+listType=map` (replaced by a
/// strategic merge patch, merged by server-side apply).
const fn map_list(name: &'static str, keys: &'static [ListMapKey]) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.list_type = ListType::Map(keys);
    FieldDef {
        name,
        meta,
        child: None,
    }
}

/// A list of primitives with `patchStrategy:"merge"` and `+listType=set`.
const fn merge_set(name: &'static str) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.patch_strategy = PatchStrategy::Merge;
    meta.list_type = ListType::Set;
    FieldDef {
        name,
        meta,
        child: None,
    }
}

/// A struct field with `patchStrategy:"retainKeys"` (a union such as a Deployment's strategy).
const fn retain_keys(name: &'static str, embedded_struct: bool) -> FieldDef {
    let mut meta = FieldMeta::DEFAULT;
    meta.retain_keys = true;
    meta.embedded = embedded_struct;
    FieldDef {
        name,
        meta,
        child: None,
    }
}

const fn key(name: &'static str) -> ListMapKey {
    ListMapKey {
        name,
        default: None,
    }
}

const NAME: &[ListMapKey] = &[key("name")];
const TYPE: &[ListMapKey] = &[key("type")];
const IP: &[ListMapKey] = &[key("ip")];
const TCP: Option<&str> = Some("TCP");

// ---- metav1 ----

static OBJECT_META: TypeDef = TypeDef {
    fields: &[
        merge_set("finalizers"),
        merge_map_list("ownerReferences", "uid", &[key("uid")], None),
    ],
};

/// `status.conditions` as most kinds declare it: merged by `type`.
const CONDITIONS: FieldDef = merge_map_list("conditions", "type", TYPE, None);

static CONDITIONS_STATUS: TypeDef = TypeDef {
    fields: &[CONDITIONS],
};

/// A kind with nothing special beyond its metadata.
static OBJECT: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&EMPTY),
        status(&EMPTY),
    ],
};

/// A kind whose only special list is `status.conditions`.
static WITH_STATUS_CONDITIONS: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&EMPTY),
        status(&CONDITIONS_STATUS),
    ],
};

static EMPTY: TypeDef = TypeDef { fields: &[] };

const fn spec(child: &'static TypeDef) -> FieldDef {
    embedded("spec", child)
}

const fn status(child: &'static TypeDef) -> FieldDef {
    embedded("status", child)
}

// ---- core/v1 pods ----

static RESOURCE_REQUIREMENTS: TypeDef = TypeDef {
    fields: &[map_list("claims", NAME)],
};

static CONTAINER: TypeDef = TypeDef {
    fields: &[
        merge_map_list(
            "ports",
            "containerPort",
            &[
                key("containerPort"),
                ListMapKey {
                    name: "protocol",
                    default: TCP,
                },
            ],
            None,
        ),
        merge_map_list("env", "name", NAME, None),
        merge_map_list("volumeMounts", "mountPath", &[key("mountPath")], None),
        merge_map_list("volumeDevices", "devicePath", &[key("devicePath")], None),
        embedded("resources", &RESOURCE_REQUIREMENTS),
    ],
};

static POD_SPEC: TypeDef = TypeDef {
    fields: &[
        merge_retain_map_list("volumes", "name", NAME, None),
        merge_map_list("initContainers", "name", NAME, Some(&CONTAINER)),
        // `json:"containers"` has no omitempty: the zero PodSpec already holds it (as null).
        present_in_zero_value(merge_map_list("containers", "name", NAME, Some(&CONTAINER))),
        merge_map_list("ephemeralContainers", "name", NAME, Some(&CONTAINER)),
        merge_map_list("imagePullSecrets", "name", NAME, None),
        merge_map_list("hostAliases", "ip", IP, None),
        merge_map_list(
            "topologySpreadConstraints",
            "topologyKey",
            &[key("topologyKey"), key("whenUnsatisfiable")],
            None,
        ),
        merge_map_list("schedulingGates", "name", NAME, None),
        merge_retain_map_list("resourceClaims", "name", NAME, None),
        atomic("nodeSelector"),
    ],
};

static POD_STATUS: TypeDef = TypeDef {
    fields: &[
        CONDITIONS,
        merge_map_list("podIPs", "ip", IP, None),
        merge_map_list("hostIPs", "ip", IP, None),
        merge_retain_map_list("resourceClaimStatuses", "name", NAME, None),
    ],
};

static POD: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&POD_SPEC),
        status(&POD_STATUS),
    ],
};

static POD_TEMPLATE_SPEC: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        embedded("spec", &POD_SPEC),
    ],
};

static POD_TEMPLATE: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        embedded("template", &POD_TEMPLATE_SPEC),
    ],
};

// ---- workloads ----

/// A pod-owning controller's spec: the template is a value, the selector an atomic struct.
static WORKLOAD_SPEC: TypeDef = TypeDef {
    fields: &[
        embedded("template", &POD_TEMPLATE_SPEC),
        atomic("selector"),
        embedded("updateStrategy", &EMPTY),
    ],
};

static WORKLOAD: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&WORKLOAD_SPEC),
        status(&CONDITIONS_STATUS),
    ],
};

static DEPLOYMENT_SPEC: TypeDef = TypeDef {
    fields: &[
        embedded("template", &POD_TEMPLATE_SPEC),
        atomic("selector"),
        retain_keys("strategy", true),
    ],
};

static DEPLOYMENT: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&DEPLOYMENT_SPEC),
        status(&CONDITIONS_STATUS),
    ],
};

static PERSISTENT_VOLUME_CLAIM_TEMPLATE: TypeDef = TypeDef {
    fields: &[embedded("metadata", &OBJECT_META)],
};

static STATEFUL_SET_SPEC: TypeDef = TypeDef {
    fields: &[
        embedded("template", &POD_TEMPLATE_SPEC),
        atomic("selector"),
        embedded("updateStrategy", &EMPTY),
        nested("volumeClaimTemplates", &PERSISTENT_VOLUME_CLAIM_TEMPLATE),
    ],
};

static STATEFUL_SET: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&STATEFUL_SET_SPEC),
        status(&CONDITIONS_STATUS),
    ],
};

/// A ReplicationController's template is a pointer and its selector a plain map.
static REPLICATION_CONTROLLER_SPEC: TypeDef = TypeDef {
    fields: &[nested("template", &POD_TEMPLATE_SPEC)],
};

static REPLICATION_CONTROLLER: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&REPLICATION_CONTROLLER_SPEC),
        status(&CONDITIONS_STATUS),
    ],
};

static JOB_SPEC: TypeDef = TypeDef {
    fields: &[embedded("template", &POD_TEMPLATE_SPEC), atomic("selector")],
};

static JOB: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&JOB_SPEC),
        status(&CONDITIONS_STATUS),
    ],
};

static JOB_TEMPLATE_SPEC: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        embedded("spec", &JOB_SPEC),
    ],
};

static CRON_JOB_SPEC: TypeDef = TypeDef {
    fields: &[embedded("jobTemplate", &JOB_TEMPLATE_SPEC)],
};

static CRON_JOB: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&CRON_JOB_SPEC),
        status(&EMPTY),
    ],
};

// ---- services, nodes, accounts, webhooks ----

static SERVICE_SPEC: TypeDef = TypeDef {
    fields: &[
        merge_map_list(
            "ports",
            "port",
            &[
                key("port"),
                ListMapKey {
                    name: "protocol",
                    default: TCP,
                },
            ],
            None,
        ),
        atomic("selector"),
    ],
};

static SERVICE_STATUS: TypeDef = TypeDef {
    fields: &[CONDITIONS, embedded("loadBalancer", &EMPTY)],
};

static SERVICE: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&SERVICE_SPEC),
        status(&SERVICE_STATUS),
    ],
};

static NODE_SPEC: TypeDef = TypeDef {
    fields: &[merge_set("podCIDRs")],
};

static NODE_STATUS: TypeDef = TypeDef {
    fields: &[
        CONDITIONS,
        merge_map_list("addresses", "type", TYPE, None),
        embedded("daemonEndpoints", &EMPTY),
        embedded("nodeInfo", &EMPTY),
    ],
};

static NODE: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        spec(&NODE_SPEC),
        status(&NODE_STATUS),
    ],
};

static SERVICE_ACCOUNT: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        merge_map_list("secrets", "name", NAME, None),
    ],
};

static WEBHOOK_CONFIGURATION: TypeDef = TypeDef {
    fields: &[
        embedded("metadata", &OBJECT_META),
        merge_map_list("webhooks", "name", NAME, None),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    fn merge_key(kind: &str, path: &[&str]) -> Option<(PatchStrategy, Option<&'static str>)> {
        let meta = Schema::for_kind(kind)?.lookup(path);
        Some((meta.patch_strategy, meta.patch_merge_key))
    }

    #[test]
    fn strategic_merge_keys_follow_upstream_tags() {
        use PatchStrategy::{Merge, Unspecified};
        let template = ["spec", "template", "spec"];
        type Case<'a> = (&'a str, Vec<&'a str>, (PatchStrategy, Option<&'a str>));
        let cases: Vec<Case> = vec![
            ("Pod", vec!["spec", "containers"], (Merge, Some("name"))),
            ("Pod", vec!["spec", "initContainers"], (Merge, Some("name"))),
            (
                "Pod",
                vec!["spec", "ephemeralContainers"],
                (Merge, Some("name")),
            ),
            ("Pod", vec!["spec", "volumes"], (Merge, Some("name"))),
            (
                "Pod",
                vec!["spec", "imagePullSecrets"],
                (Merge, Some("name")),
            ),
            ("Pod", vec!["spec", "hostAliases"], (Merge, Some("ip"))),
            (
                "Pod",
                vec!["spec", "topologySpreadConstraints"],
                (Merge, Some("topologyKey")),
            ),
            ("Pod", vec!["spec", "tolerations"], (Unspecified, None)),
            (
                "Pod",
                vec!["spec", "containers", "args"],
                (Unspecified, None),
            ),
            (
                "Pod",
                vec!["spec", "containers", "command"],
                (Unspecified, None),
            ),
            (
                "Pod",
                vec!["spec", "containers", "ports"],
                (Merge, Some("containerPort")),
            ),
            (
                "Pod",
                vec!["spec", "containers", "env"],
                (Merge, Some("name")),
            ),
            (
                "Pod",
                vec!["spec", "containers", "volumeMounts"],
                (Merge, Some("mountPath")),
            ),
            (
                "Pod",
                vec!["spec", "initContainers", "volumeDevices"],
                (Merge, Some("devicePath")),
            ),
            ("Pod", vec!["status", "conditions"], (Merge, Some("type"))),
            ("Pod", vec!["status", "podIPs"], (Merge, Some("ip"))),
            ("Pod", vec!["metadata", "finalizers"], (Merge, None)),
            (
                "Pod",
                vec!["metadata", "ownerReferences"],
                (Merge, Some("uid")),
            ),
            (
                "Deployment",
                [&template[..], &["containers"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "ReplicaSet",
                [&template[..], &["containers", "env"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "StatefulSet",
                [&template[..], &["volumes"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "DaemonSet",
                [&template[..], &["initContainers"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "Job",
                [&template[..], &["containers"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "ReplicationController",
                [&template[..], &["containers"]].concat(),
                (Merge, Some("name")),
            ),
            (
                "PodTemplate",
                vec!["template", "spec", "containers"],
                (Merge, Some("name")),
            ),
            (
                "CronJob",
                vec![
                    "spec",
                    "jobTemplate",
                    "spec",
                    "template",
                    "spec",
                    "containers",
                    "ports",
                ],
                (Merge, Some("containerPort")),
            ),
            (
                "Deployment",
                vec!["status", "conditions"],
                (Merge, Some("type")),
            ),
            ("Deployment", vec!["metadata", "finalizers"], (Merge, None)),
            ("Service", vec!["spec", "ports"], (Merge, Some("port"))),
            ("Service", vec!["spec", "externalIPs"], (Unspecified, None)),
            ("Node", vec!["status", "addresses"], (Merge, Some("type"))),
            ("Node", vec!["status", "conditions"], (Merge, Some("type"))),
            ("Node", vec!["spec", "taints"], (Unspecified, None)),
            ("Node", vec!["spec", "podCIDRs"], (Merge, None)),
            (
                "Namespace",
                vec!["status", "conditions"],
                (Merge, Some("type")),
            ),
            (
                "ConfigMap",
                vec!["metadata", "ownerReferences"],
                (Merge, Some("uid")),
            ),
            ("ConfigMap", vec!["data"], (Unspecified, None)),
            ("ServiceAccount", vec!["secrets"], (Merge, Some("name"))),
            (
                "ServiceAccount",
                vec!["imagePullSecrets"],
                (Unspecified, None),
            ),
            (
                "ValidatingWebhookConfiguration",
                vec!["webhooks"],
                (Merge, Some("name")),
            ),
        ];
        for (kind, path, want) in cases {
            assert_eq!(merge_key(kind, &path), Some(want), "{kind} {path:?}");
        }
    }

    #[test]
    fn unknown_kinds_and_fields() {
        assert!(Schema::for_kind("Widget").is_none());
        assert_eq!(
            Schema::unknown().lookup(&["spec", "items"]),
            FieldMeta::default()
        );
        let pod = Schema::for_kind("Pod").map(|s| s.lookup(&["spec", "bogus", "containers"]));
        assert_eq!(
            pod,
            Some(FieldMeta::default()),
            "unknown fields fall back to defaults below them"
        );
        assert_eq!(Schema::unknown().lookup(&[]), FieldMeta::default());
        for kind in Schema::known_kinds() {
            assert!(Schema::for_kind(kind).is_some(), "{kind}");
        }
    }

    #[test]
    fn apply_list_types_follow_upstream_markers() {
        let pod = Schema::for_kind("Pod").unwrap_or_default();
        let ports = pod.lookup(&["spec", "containers", "ports"]).list_type;
        let ListType::Map(keys) = ports else {
            panic!("ports should be a map list: {ports:?}")
        };
        assert_eq!(
            keys.iter().map(|k| (k.name, k.default)).collect::<Vec<_>>(),
            vec![("containerPort", None), ("protocol", Some("TCP"))]
        );
        assert_eq!(
            pod.lookup(&["metadata", "finalizers"]).list_type,
            ListType::Set
        );
        assert_eq!(
            pod.lookup(&["spec", "tolerations"]).list_type,
            ListType::Atomic
        );
        assert!(pod.lookup(&["spec", "nodeSelector"]).atomic);
        assert!(pod.lookup(&["spec"]).embedded);
        assert!(!pod.lookup(&["spec", "securityContext"]).embedded);
        let deployment = Schema::for_kind("Deployment").unwrap_or_default();
        assert!(deployment.lookup(&["spec", "selector"]).atomic);
        assert!(deployment.lookup(&["spec", "strategy"]).retain_keys);
        assert!(
            deployment
                .lookup(&["spec", "template", "metadata"])
                .embedded
        );
        let node = Schema::for_kind("Node").unwrap_or_default();
        assert_eq!(node.lookup(&["spec", "taints"]).list_type, ListType::Atomic);
        assert_eq!(node.lookup(&["spec", "podCIDRs"]).list_type, ListType::Set);
    }
}
