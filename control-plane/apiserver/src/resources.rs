//! The table of served resources: names, scope, subresources and the strategy of each kind.

use std::any::TypeId;
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::FieldError;
use crate::store::UpdateTarget;
use crate::strategies;
use crate::table::Column;

/// A group and resource (`deployments.apps`), the unit errors and RBAC speak of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupResource {
    /// API group; empty for the core group.
    pub group: String,
    /// Plural resource name, possibly with a subresource (`pods/status`).
    pub resource: String,
}

impl fmt::Display for GroupResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// Resource-specific behaviour run by the generic store in a fixed order
/// (prepare → default → validate), as in kube-apiserver's `rest.RESTCreateStrategy`.
pub trait Strategy: Send + Sync {
    /// `PrepareForCreate`: clear or set fields the client may not choose.
    fn prepare_for_create(&self, _obj: &mut Value) {}

    /// The part of `PrepareForCreate` that reads the request's user from its context (a
    /// CertificateSigningRequest records its requester); runs after [`Strategy::prepare_for_create`].
    fn prepare_for_create_by(
        &self,
        _obj: &mut Value,
        _user: &flotilla_api_machinery::rbac::UserInfo,
    ) {
    }

    /// `PrepareForUpdate`: carry over fields the client may not change through this endpoint.
    fn prepare_for_update(&self, _new: &mut Value, _old: &Value) {}

    /// `PrepareForUpdate` of the strategy serving `target` (a kind whose subresources have
    /// strategies of their own, as upstream's CSR status and approval strategies); by default
    /// [`Strategy::prepare_for_update`] for every target.
    fn prepare_for_update_to(&self, _target: UpdateTarget, new: &mut Value, old: &Value) {
        self.prepare_for_update(new, old)
    }

    /// Fill in upstream defaults (the `SetDefaults_*` functions).
    fn default(&self, _obj: &mut Value) {}

    /// `Validate` on create.
    fn validate(&self, _obj: &Value) -> Vec<FieldError> {
        Vec::new()
    }

    /// `ValidateUpdate`; defaults to the create validation.
    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        self.validate(new)
    }

    /// `ValidateUpdate` of the strategy serving `target`; by default [`Strategy::validate_update`].
    fn validate_update_to(
        &self,
        _target: UpdateTarget,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        self.validate_update(new, old)
    }

    /// Field selector labels beyond `metadata.name` / `metadata.namespace` (`GetAttrs`); a
    /// selector on any other field is refused.
    fn field_labels(&self) -> &'static [FieldLabel] {
        &[]
    }

    /// Whether `field` may be used in a field selector, besides `metadata.name` and
    /// `metadata.namespace`.
    fn supports_field_label(&self, field: &str) -> bool {
        self.field_labels().iter().any(|label| label.name == field)
    }

    /// The values of every field a selector may name in `obj`.
    fn field_label_values(&self, obj: &Value) -> Vec<(String, String)> {
        self.field_labels()
            .iter()
            .map(|label| (label.name.to_string(), label.value(obj)))
            .collect()
    }

    /// Columns of the Table representation (`kubectl get`), Name included where it belongs.
    fn columns(&self) -> Vec<Column> {
        vec![crate::table::name_column(), crate::table::age_column()]
    }

    /// `CheckGracefulDelete`: how many seconds a delete waits for (pods bound to a node wait
    /// for their kubelet); `None` or 0 deletes at once.
    fn graceful_delete_seconds(&self, _obj: &Value, _requested: Option<i64>) -> Option<i64> {
        None
    }

    /// Whether an annotation change bumps `metadata.generation` too (Deployments: rollout
    /// annotations such as `kubectl rollout restart`'s are part of what the controller acts on).
    fn annotations_bump_generation(&self) -> bool {
        false
    }

    /// Whether a create may carry a status (nodes do; most kinds reset it).
    fn keeps_status_on_create(&self) -> bool {
        false
    }

    /// Finalizers a delete adds before the object goes (a CustomResourceDefinition's
    /// objects are deleted first), as upstream's registries that override `Delete` do.
    fn finalizers_on_delete(&self) -> &'static [&'static str] {
        &[]
    }

    /// Marks an object whose deletion has begun (a definition's `Terminating` condition).
    fn mark_deleting(&self, _obj: &mut Value) {}
}

/// One field a kind can be selected by, and where its value lives in the object.
#[derive(Debug, Clone, Copy)]
pub struct FieldLabel {
    /// The selector's field name (`spec.nodeName`).
    pub name: &'static str,
    /// Where the value is.
    pub path: &'static [&'static str],
    /// The value when the field is absent (`false` for a bool, `0` for a count).
    pub default: &'static str,
}

impl FieldLabel {
    /// A label whose absent value is "".
    pub const fn new(name: &'static str, path: &'static [&'static str]) -> Self {
        FieldLabel {
            name,
            path,
            default: "",
        }
    }

    /// The same label with another value for an absent field.
    pub const fn or(mut self, default: &'static str) -> Self {
        self.default = default;
        self
    }

    /// The label's value in `obj`, as field selectors compare it.
    pub fn value(&self, obj: &Value) -> String {
        match crate::meta::at(obj, self.path) {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => self.default.to_string(),
            Some(other) => other.to_string(),
        }
    }
}

/// The scale subresource's mapping onto the object (`autoscaling/v1` `Scale`); a custom
/// resource's paths come from its definition.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleSubresource {
    /// Where the desired replicas live in the object.
    pub spec_replicas: Vec<Name>,
    /// Where the observed replicas live.
    pub status_replicas: Vec<Name>,
    /// Where the label selector lives (rendered as a string in `Scale.status.selector`); a
    /// custom resource may have none.
    pub label_selector: Option<Vec<Name>>,
}

/// A name in the resource table: borrowed for the built-in kinds, owned for the kinds a
/// tenant defines.
pub type Name = Cow<'static, str>;

/// What a kind's objects may contain, beyond what its strategy checks.
pub enum Shape {
    /// A built-in kind: its k8s-openapi type.
    Typed {
        /// Decodes into the k8s-openapi type and encodes back: the canonical form, which also
        /// drops fields the type does not have (how unknown fields are found).
        canonicalize: fn(&Value) -> Result<Value, serde_json::Error>,
        /// Registers the type's OpenAPI schema (and those it refers to) and returns a `$ref`.
        schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
        /// The OpenAPI definition name (`io.k8s.api.apps.v1.Deployment`).
        schema_name: String,
    },
    /// A custom resource: its definition's structural schema.
    Custom(Arc<dyn ObjectSchema>),
}

/// A custom resource version's schema as the store and the OpenAPI documents use it.
pub trait ObjectSchema: Send + Sync {
    /// Drops the fields the schema does not have (upstream's pruning), as a built-in kind's
    /// round trip through its type does.
    fn canonicalize(&self, obj: &Value) -> Result<Value, serde_json::Error>;

    /// The version's `openAPIV3Schema`, for the OpenAPI documents.
    fn openapi_schema(&self) -> &Value;
}

/// Everything the server knows about one served resource.
pub struct ResourceInfo {
    /// API group, empty for core.
    pub group: Name,
    /// API version within the group.
    pub version: Name,
    /// Kind of a single object.
    pub kind: Name,
    /// Kind of a list.
    pub list_kind: Name,
    /// Plural resource name (URL segment).
    pub plural: Name,
    /// Lower-case singular name.
    pub singular: Name,
    /// Namespaced (true) or cluster-scoped.
    pub namespaced: bool,
    /// kubectl short names (`po`, `deploy`).
    pub short_names: Vec<Name>,
    /// Categories such as `all`.
    pub categories: Vec<Name>,
    /// Whether `/status` is served (and status is ignored on the main resource).
    pub status_subresource: bool,
    /// The `/scale` subresource, where upstream has one.
    pub scale: Option<ScaleSubresource>,
    /// Whether `metadata.generation` tracks spec changes.
    pub tracks_generation: bool,
    /// A request-only kind (TokenReview, SelfSubjectReview, the access reviews): only
    /// `create` is served, answered by the server and never stored.
    pub create_only: bool,
    /// A read-only kind computed on each request (`componentstatuses`): get and list only.
    pub computed: bool,
    /// Kind-specific behaviour.
    pub strategy: Box<dyn Strategy>,
    /// What its objects may contain.
    pub shape: Shape,
    /// Set for a custom resource version other than its definition's storage version: the
    /// version objects are stored at, which reads and writes convert from and to.
    pub storage_version: Option<Name>,
    /// A served version marked deprecated, with the warning every request to it gets.
    pub deprecation_warning: Option<String>,
    /// A custom resource whose definition is being deleted: its objects are read and
    /// deleted, no new one is created.
    pub terminating: bool,
    /// How its objects change version.
    pub conversion: crate::conversion::Conversion,
}

impl ResourceInfo {
    /// `group/version`, or `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The group and resource, for errors.
    pub fn group_resource(&self) -> GroupResource {
        GroupResource {
            group: self.group.to_string(),
            resource: self.plural.to_string(),
        }
    }

    /// The canonical form of `obj`: fields the kind does not have dropped. `obj` is read, not
    /// taken: the caller compares the two for unknown fields, and a body of the wrong shape
    /// fails at its first wrong field without a copy of the whole (a 3 MiB body of a million
    /// nodes cost 45 ms to copy before its decode failed).
    pub fn canonicalize(&self, obj: &Value) -> Result<Value, serde_json::Error> {
        match &self.shape {
            Shape::Typed { canonicalize, .. } => canonicalize(obj),
            Shape::Custom(schema) => schema.canonicalize(obj),
        }
    }

    /// The OpenAPI definition name: the k8s-openapi type's (`io.k8s.api.apps.v1.Deployment`),
    /// or for a custom resource upstream's reversed group (`io.cert-manager.v1.Certificate`).
    pub fn definition_name(&self) -> String {
        match &self.shape {
            Shape::Typed { schema_name, .. } => schema_name.clone(),
            Shape::Custom(_) => {
                let reversed: Vec<&str> = self.group.rsplit('.').collect();
                format!("{}.{}.{}", reversed.join("."), self.version, self.kind)
            }
        }
    }

    /// The kind's strategic-merge and server-side-apply field metadata: a built-in kind's
    /// table entry; none for a custom resource, whatever its kind is called (upstream's
    /// custom resources take no strategic merge patch, and apply merges them by their
    /// schema's defaults).
    pub fn patch_meta(&self) -> Option<flotilla_api_machinery::schema::PatchMeta> {
        match self.shape {
            Shape::Typed { .. } => flotilla_api_machinery::schema::PatchMeta::for_kind(&self.kind),
            Shape::Custom(_) => None,
        }
    }

    /// Whether this kind is defined by a CustomResourceDefinition.
    pub fn is_custom(&self) -> bool {
        matches!(self.shape, Shape::Custom(_))
    }

    /// The group and a subresource of it (`pods/status`).
    pub fn group_subresource(&self, subresource: &str) -> GroupResource {
        GroupResource {
            group: self.group.to_string(),
            resource: format!("{}/{subresource}", self.plural),
        }
    }
}

fn canonicalize_as<T: DeserializeOwned + Serialize>(
    value: &Value,
) -> Result<Value, serde_json::Error> {
    let typed = T::deserialize(value)?;
    serde_json::to_value(typed)
}

struct Names {
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    status: bool,
    scale: Option<ScaleSubresource>,
    generation: bool,
}

const PLAIN: Names = Names {
    short_names: &[],
    categories: &[],
    status: false,
    scale: None,
    generation: false,
};

fn replicas_scale() -> ScaleSubresource {
    ScaleSubresource {
        spec_replicas: vec!["spec".into(), "replicas".into()],
        status_replicas: vec!["status".into(), "replicas".into()],
        label_selector: Some(vec!["spec".into(), "selector".into()]),
    }
}

fn define<T>(names: Names, strategy: Box<dyn Strategy>) -> ResourceInfo
where
    T: k8s_openapi::Resource
        + k8s_openapi::ListableResource
        + DeserializeOwned
        + Serialize
        + schemars::JsonSchema,
    T::Scope: 'static,
{
    ResourceInfo {
        list_kind: Cow::Borrowed(T::LIST_KIND),
        short_names: names
            .short_names
            .iter()
            .map(|s| Cow::Borrowed(*s))
            .collect(),
        categories: names.categories.iter().map(|s| Cow::Borrowed(*s)).collect(),
        status_subresource: names.status,
        scale: names.scale,
        tracks_generation: names.generation,
        create_only: false,
        strategy,
        ..define_create_only::<T>()
    }
}

/// A request-only kind: `create` is its one verb, and nothing is stored.
fn define_create_only<T>() -> ResourceInfo
where
    T: k8s_openapi::Resource + DeserializeOwned + Serialize + schemars::JsonSchema,
    T::Scope: 'static,
{
    ResourceInfo {
        create_only: true,
        ..typed::<T>(
            Cow::Borrowed(""),
            |generator| generator.subschema_for::<T>(),
            T::schema_name().into_owned(),
            Box::new(strategies::DefaultStrategy),
        )
    }
}

/// A metrics kind (`metrics.k8s.io`): computed on each request from the kubelets, read-only.
fn define_metrics<T>(schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema) -> ResourceInfo
where
    T: k8s_openapi::Resource + k8s_openapi::ListableResource + DeserializeOwned + Serialize,
    T::Scope: 'static,
{
    ResourceInfo {
        computed: true,
        ..typed::<T>(
            Cow::Borrowed(T::LIST_KIND),
            schema,
            crate::metrics_server::definition_name(T::KIND),
            Box::new(crate::metrics_server::MetricsStrategy),
        )
    }
}

/// A kind of type `T` with no subresource, verb flag or alias, its OpenAPI schema from
/// `schema` under `schema_name`.
fn typed<T>(
    list_kind: Name,
    schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
    schema_name: String,
    strategy: Box<dyn Strategy>,
) -> ResourceInfo
where
    T: k8s_openapi::Resource + DeserializeOwned + Serialize,
    T::Scope: 'static,
{
    ResourceInfo {
        group: Cow::Borrowed(T::GROUP),
        version: Cow::Borrowed(T::VERSION),
        kind: Cow::Borrowed(T::KIND),
        list_kind,
        plural: Cow::Borrowed(T::URL_PATH_SEGMENT),
        singular: Cow::Owned(T::KIND.to_lowercase()),
        namespaced: TypeId::of::<T::Scope>() == TypeId::of::<k8s_openapi::NamespaceResourceScope>(),
        short_names: Vec::new(),
        categories: Vec::new(),
        status_subresource: false,
        scale: None,
        tracks_generation: false,
        create_only: false,
        computed: false,
        strategy,
        shape: Shape::Typed {
            canonicalize: canonicalize_as::<T>,
            schema,
            schema_name,
        },
        storage_version: None,
        deprecation_warning: None,
        terminating: false,
        conversion: Default::default(),
    }
}

/// Built-in groups a tenant may serve from its own server instead, by an APIService naming
/// a Service (metrics-server's `v1beta1.metrics.k8s.io`, as EKS users install it): the
/// tenant's table then leaves the built-in kinds of the group out, and the aggregator
/// proxies the group version to that server.
pub const REPLACEABLE_GROUPS: &[&str] = &["metrics.k8s.io"];

/// All served resources, in discovery order: the built-in kinds shared by every tenant, then
/// the kinds one tenant's CustomResourceDefinitions add.
#[derive(Clone)]
pub struct Resources {
    all: Vec<Arc<ResourceInfo>>,
}

impl Resources {
    /// The built-in resources Flotilla serves.
    pub fn builtin() -> Self {
        use k8s_openapi::api::{
            apps::v1 as apps, authentication::v1 as authentication,
            authorization::v1 as authorization, autoscaling::v2 as autoscaling, batch::v1 as batch,
            certificates::v1 as certificates, coordination::v1 as coordination, core::v1 as core,
            discovery::v1 as discovery, events::v1 as events, networking::v1 as networking,
            node::v1 as node, policy::v1 as policy, rbac::v1 as rbac, scheduling::v1 as scheduling,
            storage::v1 as storage,
        };
        use strategies as s;
        let all_cat: &'static [&'static str] = &["all"];
        let workload = |short: &'static [&'static str], scale: Option<ScaleSubresource>| Names {
            short_names: short,
            categories: all_cat,
            status: true,
            scale,
            generation: true,
        };
        let status_only = |short: &'static [&'static str], generation: bool| Names {
            short_names: short,
            categories: &[],
            status: true,
            scale: None,
            generation,
        };
        let short = |short: &'static [&'static str]| Names {
            short_names: short,
            ..PLAIN
        };
        let all = vec![
            define::<core::Namespace>(status_only(&["ns"], false), Box::new(s::NamespaceStrategy)),
            define::<core::Pod>(
                Names {
                    short_names: &["po"],
                    categories: all_cat,
                    status: true,
                    scale: None,
                    generation: true,
                },
                Box::new(s::PodStrategy),
            ),
            define::<core::Node>(status_only(&["no"], false), Box::new(s::NodeStrategy)),
            define::<core::Service>(
                Names {
                    short_names: &["svc"],
                    categories: all_cat,
                    status: true,
                    scale: None,
                    generation: false,
                },
                Box::new(s::ServiceStrategy),
            ),
            define::<core::Endpoints>(short(&["ep"]), Box::new(s::EndpointsStrategy)),
            define::<core::ConfigMap>(short(&["cm"]), Box::new(s::ConfigMapStrategy)),
            ResourceInfo {
                computed: true,
                ..define::<core::ComponentStatus>(
                    short(&["cs"]),
                    Box::new(crate::componentstatus::ComponentStatusStrategy),
                )
            },
            define::<core::Secret>(PLAIN, Box::new(s::SecretStrategy)),
            define::<core::ServiceAccount>(short(&["sa"]), Box::new(s::ServiceAccountStrategy)),
            define::<core::Event>(short(&["ev"]), Box::new(s::CoreEventStrategy)),
            define::<core::PersistentVolume>(
                status_only(&["pv"], false),
                Box::new(s::PersistentVolumeStrategy),
            ),
            define::<core::PersistentVolumeClaim>(
                status_only(&["pvc"], false),
                Box::new(s::PersistentVolumeClaimStrategy),
            ),
            define::<core::LimitRange>(short(&["limits"]), Box::new(s::DefaultStrategy)),
            define::<core::ResourceQuota>(
                status_only(&["quota"], false),
                Box::new(s::DefaultStrategy),
            ),
            define::<core::PodTemplate>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<core::ReplicationController>(
                Names {
                    short_names: &["rc"],
                    categories: all_cat,
                    status: true,
                    scale: Some(replicas_scale()),
                    generation: true,
                },
                Box::new(s::DefaultStrategy),
            ),
            define::<apps::Deployment>(
                workload(&["deploy"], Some(replicas_scale())),
                Box::new(s::DeploymentStrategy),
            ),
            define::<apps::ReplicaSet>(
                workload(&["rs"], Some(replicas_scale())),
                Box::new(s::ReplicaSetStrategy),
            ),
            define::<apps::StatefulSet>(
                workload(&["sts"], Some(replicas_scale())),
                Box::new(s::StatefulSetStrategy),
            ),
            define::<apps::DaemonSet>(workload(&["ds"], None), Box::new(s::DaemonSetStrategy)),
            define::<apps::ControllerRevision>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<batch::Job>(workload(&[], None), Box::new(s::JobStrategy)),
            define::<batch::CronJob>(workload(&["cj"], None), Box::new(s::CronJobStrategy)),
            define::<autoscaling::HorizontalPodAutoscaler>(
                Names {
                    short_names: &["hpa"],
                    categories: all_cat,
                    status: true,
                    scale: None,
                    // Upstream's strategy bumps it on spec changes (the controller reacts).
                    generation: true,
                },
                Box::new(s::HorizontalPodAutoscalerStrategy),
            ),
            define::<discovery::EndpointSlice>(PLAIN, Box::new(s::EndpointSliceStrategy)),
            define::<coordination::Lease>(PLAIN, Box::new(s::LeaseStrategy)),
            define::<events::Event>(short(&["ev"]), Box::new(s::DefaultStrategy)),
            define::<policy::PodDisruptionBudget>(
                status_only(&["pdb"], true),
                Box::new(s::DefaultStrategy),
            ),
            define::<networking::Ingress>(
                status_only(&["ing"], false),
                Box::new(s::IngressStrategy),
            ),
            define::<networking::IngressClass>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<networking::NetworkPolicy>(short(&["netpol"]), Box::new(s::DefaultStrategy)),
            define::<storage::StorageClass>(short(&["sc"]), Box::new(s::StorageClassStrategy)),
            define::<node::RuntimeClass>(PLAIN, Box::new(s::RuntimeClassStrategy)),
            define::<storage::VolumeAttachment>(
                status_only(&[], false),
                Box::new(s::VolumeAttachmentStrategy),
            ),
            define::<storage::CSIDriver>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<storage::CSINode>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<certificates::CertificateSigningRequest>(
                status_only(&["csr"], false),
                Box::new(crate::certificates::CertificateSigningRequestStrategy),
            ),
            define::<scheduling::PriorityClass>(short(&["pc"]), Box::new(s::DefaultStrategy)),
            define::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>(
                Names {
                    short_names: &["crd", "crds"],
                    categories: &["api-extensions"],
                    status: true,
                    scale: None,
                    generation: true,
                },
                Box::new(crate::apiextensions::definition::DefinitionStrategy),
            ),
            define::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>(
                PLAIN,
                Box::new(s::WebhookConfigurationStrategy { mutating: true }),
            ),
            define::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>(
                PLAIN,
                Box::new(s::WebhookConfigurationStrategy { mutating: false }),
            ),
            define::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>(
                status_only(&[], true),
                Box::new(s::ValidatingAdmissionPolicyStrategy),
            ),
            define::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>(
                PLAIN,
                Box::new(s::ValidatingAdmissionPolicyBindingStrategy),
            ),
            define::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>(
                Names {
                    status: true,
                    ..PLAIN
                },
                Box::new(crate::aggregator::ApiServiceStrategy),
            ),
            define::<rbac::Role>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<rbac::RoleBinding>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<rbac::ClusterRole>(PLAIN, Box::new(s::DefaultStrategy)),
            define::<rbac::ClusterRoleBinding>(PLAIN, Box::new(s::DefaultStrategy)),
            define_create_only::<authentication::TokenReview>(),
            define_create_only::<authentication::SelfSubjectReview>(),
            define_create_only::<authorization::SelfSubjectAccessReview>(),
            define_create_only::<authorization::SubjectAccessReview>(),
            define_create_only::<authorization::LocalSubjectAccessReview>(),
            define_create_only::<authorization::SelfSubjectRulesReview>(),
            define_metrics::<k8s_metrics::v1beta1::NodeMetrics>(
                crate::metrics_server::node_schema,
            ),
            define_metrics::<k8s_metrics::v1beta1::PodMetrics>(crate::metrics_server::pod_schema),
        ];
        Resources {
            all: all.into_iter().map(Arc::new).collect(),
        }
    }

    /// These resources and `custom` after them (a tenant's table: its definitions' kinds
    /// follow the built-in ones, which they can never shadow).
    pub fn with_custom(&self, custom: impl IntoIterator<Item = Arc<ResourceInfo>>) -> Self {
        let mut all = self.all.clone();
        all.extend(custom);
        Resources { all }
    }

    /// These resources but those of `groups` (built-in groups a tenant's APIService serves
    /// instead: see [`REPLACEABLE_GROUPS`]).
    pub fn without_groups(&self, groups: &[&str]) -> Self {
        Resources {
            all: self
                .all
                .iter()
                .filter(|r| !groups.contains(&&*r.group))
                .cloned()
                .collect(),
        }
    }

    /// Every resource.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.all.iter()
    }

    /// The resource served at `group/version/plural`, if any.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&Arc<ResourceInfo>> {
        self.all
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The resource of a `group/version, kind`, if any.
    pub fn find_kind(&self, group: &str, version: &str, kind: &str) -> Option<&Arc<ResourceInfo>> {
        self.all
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// The served groups with their versions, core ("") first, in first-seen order; a
    /// custom group's versions are in upstream's priority order (`v2` before `v1beta1`), the
    /// first being the preferred one.
    pub fn groups(&self) -> Vec<(&str, Vec<&str>)> {
        let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
        for r in &self.all {
            match groups.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) if !versions.contains(&&*r.version) => {
                    versions.push(&r.version)
                }
                Some(_) => {}
                None => groups.push((&r.group, vec![&r.version])),
            }
        }
        for (group, versions) in &mut groups {
            if self.all.iter().any(|r| r.group == *group && r.is_custom()) {
                versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
            }
        }
        groups
    }
}

/// Upstream's `version.CompareKubeAwareVersionStrings` as a sortable key: GA versions above
/// beta above alpha, higher numbers first within each; anything else last, alphabetically.
pub fn version_priority(version: &str) -> (u8, u64, u64, std::cmp::Reverse<String>) {
    let parsed = version.strip_prefix('v').and_then(|rest| {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let major: u64 = rest[..digits].parse().ok()?;
        let tail = &rest[digits..];
        let (stage, minor) = if tail.is_empty() {
            (3, 0)
        } else if let Some(n) = tail.strip_prefix("beta") {
            (2, n.parse().ok()?)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (1, n.parse().ok()?)
        } else {
            return None;
        };
        Some((stage, major, minor))
    });
    match parsed {
        Some((stage, major, minor)) => (stage, major, minor, std::cmp::Reverse(String::new())),
        None => (0, 0, 0, std::cmp::Reverse(version.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_labels_render_values_as_selectors_compare_them() {
        let host_network =
            FieldLabel::new("spec.hostNetwork", &["spec", "hostNetwork"]).or("false");
        assert_eq!(host_network.value(&json!({})), "false");
        assert_eq!(
            host_network.value(&json!({"spec": {"hostNetwork": true}})),
            "true"
        );
        let node = FieldLabel::new("spec.nodeName", &["spec", "nodeName"]);
        assert_eq!(node.value(&json!({"spec": {"nodeName": "n1"}})), "n1");
        assert_eq!(node.value(&json!({"spec": {"nodeName": null}})), "");
    }

    #[test]
    fn versions_sort_as_upstream_prefers_them() {
        let mut versions = vec![
            "v1alpha1",
            "foo",
            "v1beta2",
            "v2",
            "v1",
            "v11alpha2",
            "bar",
            "v1beta1",
        ];
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
        assert_eq!(
            versions,
            [
                "v2",
                "v1",
                "v1beta2",
                "v1beta1",
                "v11alpha2",
                "v1alpha1",
                "bar",
                "foo"
            ]
        );
    }
}
