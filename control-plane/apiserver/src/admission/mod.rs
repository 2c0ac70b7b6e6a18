//! The admission chain as data (upstream `k8s.io/apiserver/pkg/admission`): an ordered list
//! of plugins, each one module, run on every write after authorization. Mutating plugins
//! (`admit`) change the object before the registry prepares and validates it; validating
//! plugins (`validate`) see the final object just before it is stored, so what they allow
//! is exactly what is written. The order is upstream's `AllOrderedPlugins` order.

mod certificate_approval;
mod certificate_signing;
mod certificate_subject;
mod claim_resize;
mod default_class;
pub mod default_toleration_seconds;
mod limit_ranger;
mod lookups;
pub mod namespace_lifecycle;
mod node_restriction;
mod pod_security;
mod pod_security_config;
mod policy;
mod priority;
mod resource_quota;
mod runtime_class;
pub mod service_account;
mod storage_protection;
mod taint_nodes;
mod webhook;

use std::sync::Arc;

use flotilla_api_machinery::rbac::UserInfo;
use flotilla_cel::admission::RequestAuthorizer;
use serde_json::Value;

pub use self::lookups::Lookups;
pub use self::pod_security_config::{
    PodSecurityConfiguration, PodSecurityDefaults, PodSecurityExemptions,
};
use crate::error::ApiError;
use crate::resources::{ResourceInfo, Resources};
use crate::selection::Selection;
use crate::store::{CreateHooks, ListOptions, ReadAt, Store, Tenant, UpdateValidation, Written};

/// What a request does to its object (upstream's `admission.Operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new object (POST, or an apply that creates).
    Create,
    /// A change to a stored object (PUT or PATCH, of the object or a subresource).
    Update,
    /// A delete (the object is the stored one, as `old`; what the mutating half changes is
    /// not kept).
    Delete,
    /// A connection to a pod (`exec`, `attach`, `portforward`): the object is the request's
    /// options (`PodExecOptions`, …), `old` the pod, for its name only (upstream sends no
    /// old object).
    Connect,
}

/// The request a plugin decides on (upstream's `admission.Attributes`).
#[derive(Clone, Copy)]
pub struct Attributes<'a> {
    /// What the request does.
    pub operation: Operation,
    /// The kind written.
    pub resource: &'a ResourceInfo,
    /// `""` for the object itself, else the subresource's name.
    pub subresource: &'a str,
    /// The object's namespace (`""` for cluster-scoped kinds).
    pub namespace: &'a str,
    /// The object's name as the request's path gives it (upstream's `GetName`); `""` on a
    /// create, whose object names itself.
    pub name: &'a str,
    /// Who asks; `None` for the server's own writes.
    pub user: Option<&'a UserInfo>,
    /// `dryRun=All`: decide, but change nothing (no quota is charged).
    pub dry_run: bool,
    /// On an update, the stored object being replaced.
    pub old: Option<&'a Value>,
}

impl Attributes<'_> {
    /// Whether the request is for `plural` in the core group, on the object itself.
    pub fn is_core(&self, plural: &str) -> bool {
        self.resource.group.is_empty()
            && self.resource.plural == plural
            && self.subresource.is_empty()
    }
}

/// What plugins may read: the tenant's objects through the registry.
pub struct Context<'a> {
    /// The registry.
    pub store: &'a Store,
    /// The tenant's kinds (its definitions' included).
    pub resources: Arc<Resources>,
    /// Whose cluster the request is for.
    pub tenant: &'a Tenant,
    /// Recent copies of what plugins read.
    pub lookups: &'a Lookups,
    /// The cluster's PodSecurity defaults and exemptions.
    pub pod_security: &'a PodSecurityConfiguration,
    /// The cluster's authorizer, for plugins that ask whether the user may do something else
    /// (upstream injects it the same way).
    pub authorizer: &'a dyn Authorizer,
    /// Where the control plane may dial on a tenant's behalf (its webhooks): the networks its
    /// nodes and pods are in, never the service's own addresses.
    pub networks: &'a crate::kubelet::KubeletNetworks,
}

/// Whether a user may do what `attributes` describe (RBAC and the Node authorizer).
#[async_trait::async_trait]
pub trait Authorizer: Send + Sync {
    /// Allowed or not.
    async fn allowed(
        &self,
        attributes: &flotilla_api_machinery::rbac::Attributes,
    ) -> Result<bool, ApiError>;

    /// A copy of this authorizer that decides synchronously, for the checks of CEL's
    /// `authorizer` library, which cannot wait during evaluation. `None` (the default) where
    /// there is none: every such check then decides "not allowed", with an error.
    async fn snapshot(&self) -> Result<Option<Arc<dyn RequestAuthorizer>>, ApiError> {
        Ok(None)
    }
}

/// [`Authorizer::snapshot`] of a [`Context`]'s authorizer, taken on first use and kept for
/// the rest of one plugin call (the policies and webhooks it evaluates).
#[derive(Default)]
pub(crate) struct CelAuthorizer {
    taken: Option<Option<Arc<dyn RequestAuthorizer>>>,
}

impl CelAuthorizer {
    /// The snapshot, taken now if it was not yet.
    pub(crate) async fn get(
        &mut self,
        context: &Context<'_>,
    ) -> Result<Option<Arc<dyn RequestAuthorizer>>, ApiError> {
        if let Some(taken) = &self.taken {
            return Ok(taken.clone());
        }
        let taken = context.authorizer.snapshot().await?;
        self.taken = Some(taken.clone());
        Ok(taken)
    }
}

impl Context<'_> {
    /// What calls to the tenant's webhooks resolve their client configs with.
    pub fn dialer(&self) -> crate::outbound::Dialer<'_> {
        crate::outbound::Dialer {
            store: self.store,
            tenant: self.tenant,
            resources: &self.resources,
            networks: self.networks,
        }
    }

    /// The kind `plural` of `group`/`version`, which the server always serves.
    pub fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<&ResourceInfo, ApiError> {
        self.resources
            .find(group, version, plural)
            .map(|resource| &**resource)
            .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))
    }

    /// Every object of `resource` in `namespace` (every namespace when `None`), as of now.
    pub async fn list(
        &self,
        resource: &ResourceInfo,
        namespace: Option<&str>,
    ) -> Result<Vec<Value>, ApiError> {
        let options = ListOptions {
            read_at: ReadAt::Latest,
            selection: Selection::default(),
            limit: 0,
            continue_token: None,
        };
        Ok(self
            .store
            .list(self.tenant, resource, namespace, &options)
            .await?
            .items)
    }

    /// [`Context::list`] from a copy at most [`lookups::LOOKUP_TTL`] old (what upstream's
    /// plugins read from informers).
    pub async fn list_cached(
        &self,
        resource: &ResourceInfo,
        namespace: Option<&str>,
    ) -> Result<Arc<Vec<Value>>, ApiError> {
        let Some(plural) = lookups::Lookups::kept(&resource.plural) else {
            return Ok(Arc::new(self.list(resource, namespace).await?));
        };
        let key = (
            self.tenant.id.clone(),
            plural,
            namespace.unwrap_or("").to_string(),
        );
        if let Some(items) = self.lookups.get(&key) {
            return Ok(items);
        }
        let items = Arc::new(self.list(resource, namespace).await?);
        self.lookups.put(key, items.clone());
        Ok(items)
    }

    /// The cluster-scoped object `name` of `resource` (`None` when absent), from a copy as
    /// [`Context::list_cached`].
    pub async fn get_cached(
        &self,
        resource: &ResourceInfo,
        name: &str,
    ) -> Result<Option<Value>, ApiError> {
        let read = || async {
            match self
                .store
                .get(self.tenant, resource, "", name, ReadAt::Latest)
                .await
            {
                Ok(object) => Ok(Some(object)),
                Err(err) if err.code == 404 => Ok(None),
                Err(err) => Err(err),
            }
        };
        let Some(plural) = lookups::Lookups::kept(&resource.plural) else {
            return read().await;
        };
        let key = (self.tenant.id.clone(), plural, format!("={name}"));
        if let Some(items) = self.lookups.get(&key) {
            return Ok(items.first().cloned());
        }
        let found = read().await?;
        self.lookups
            .put(key, Arc::new(found.iter().cloned().collect()));
        Ok(found)
    }
}

/// One admission plugin. Both halves default to allowing; a plugin implements the ones it has.
#[async_trait::async_trait]
pub trait Plugin: Send + Sync {
    /// Upstream's name, as `--enable-admission-plugins` spells it.
    fn name(&self) -> &'static str;

    /// Whether the plugin has anything to say about this request.
    fn handles(&self, attributes: &Attributes<'_>) -> bool;

    /// The mutating half: may change `object`.
    async fn admit(
        &self,
        _context: &Context<'_>,
        _attributes: &Attributes<'_>,
        _object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        Ok(())
    }

    /// The validating half: allows or refuses `object` as it will be stored.
    async fn validate(
        &self,
        _context: &Context<'_>,
        _attributes: &Attributes<'_>,
        _object: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        Ok(())
    }
}

/// The plugins a server runs, in order.
pub struct Chain {
    plugins: Vec<Box<dyn Plugin>>,
    /// Off only to measure what the chain costs (the admission benchmark).
    enabled: std::sync::atomic::AtomicBool,
    lookups: Lookups,
}

/// Upstream's default plugins, in upstream's order (`AllOrderedPlugins` of
/// `pkg/kubeapiserver/options/plugins.go`): its default-on set, with NodeRestriction (which
/// every kubeadm-style cluster enables) at its place after ServiceAccount. Left out:
/// ClusterTrustBundleAttest, since ClusterTrustBundles are not served; PodTopologyLabels,
/// PodGroupProtection and the other plugins behind alpha feature gates; and
/// MutatingAdmissionPolicy, not implemented.
pub const UPSTREAM_DEFAULT: &[&str] = &[
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "NodeRestriction",
    "TaintNodesByCondition",
    "PodSecurity",
    "Priority",
    "DefaultTolerationSeconds",
    "DefaultStorageClass",
    "StorageObjectInUseProtection",
    "PersistentVolumeClaimResize",
    "RuntimeClass",
    "CertificateApproval",
    "CertificateSigning",
    "CertificateSubjectRestriction",
    "DefaultIngressClass",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
    "ResourceQuota",
];

/// The plugin upstream calls `name`, if this server has it.
fn plugin(name: &str) -> Option<Box<dyn Plugin>> {
    let plugin: Box<dyn Plugin> = match name {
        "NamespaceLifecycle" => Box::new(namespace_lifecycle::NamespaceLifecycle),
        "LimitRanger" => Box::new(limit_ranger::LimitRanger),
        "ServiceAccount" => Box::new(service_account::ServiceAccount),
        "NodeRestriction" => Box::new(node_restriction::NodeRestriction),
        "TaintNodesByCondition" => Box::new(taint_nodes::TaintNodesByCondition),
        "PodSecurity" => Box::new(pod_security::PodSecurity),
        "Priority" => Box::new(priority::Priority),
        "DefaultTolerationSeconds" => {
            Box::new(default_toleration_seconds::DefaultTolerationSeconds)
        }
        "DefaultStorageClass" => Box::new(default_class::DEFAULT_STORAGE_CLASS),
        "StorageObjectInUseProtection" => {
            Box::new(storage_protection::StorageObjectInUseProtection)
        }
        "PersistentVolumeClaimResize" => Box::new(claim_resize::PersistentVolumeClaimResize),
        "RuntimeClass" => Box::new(runtime_class::RuntimeClass),
        "CertificateApproval" => Box::new(certificate_approval::CertificateApproval),
        "CertificateSigning" => Box::new(certificate_signing::CertificateSigning),
        "CertificateSubjectRestriction" => {
            Box::new(certificate_subject::CertificateSubjectRestriction)
        }
        "DefaultIngressClass" => Box::new(default_class::DEFAULT_INGRESS_CLASS),
        "MutatingAdmissionWebhook" => Box::new(webhook::MutatingWebhooks),
        "ValidatingAdmissionPolicy" => Box::new(policy::ValidatingAdmissionPolicies),
        "ValidatingAdmissionWebhook" => Box::new(webhook::ValidatingWebhooks),
        "ResourceQuota" => Box::new(resource_quota::ResourceQuota::default()),
        _ => return None,
    };
    Some(plugin)
}

impl Chain {
    /// Upstream's default chain, [`UPSTREAM_DEFAULT`]. Two of its rules also hold where the
    /// registry needs them, defined once in their plugin's module: NamespaceLifecycle's check
    /// again in the store's create, just before the write (a namespace may start terminating
    /// after the chain looked); DefaultTolerationSeconds and ServiceAccount's default name in
    /// the Pod strategy's update (this server runs the mutating half on creates only, and an
    /// update's body has always been given them again).
    pub fn upstream_default() -> Self {
        // Never an empty chain by mistake: every name of the list is built in (a unit test
        // holds it to that).
        Self::from_names(UPSTREAM_DEFAULT).expect("every upstream default plugin is built in")
    }

    /// A chain of the plugins upstream calls `names`, in the order given (what
    /// `--enable-admission-plugins` would configure); an unknown name is refused, named.
    pub fn from_names(names: &[&str]) -> Result<Self, String> {
        let plugins = names
            .iter()
            .map(|name| plugin(name).ok_or_else(|| format!("unknown admission plugin {name:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::with_plugins(plugins))
    }

    fn with_plugins(plugins: Vec<Box<dyn Plugin>>) -> Self {
        Chain {
            enabled: std::sync::atomic::AtomicBool::new(true),
            lookups: Lookups::default(),
            plugins,
        }
    }

    /// Turns every plugin off or back on (for measuring what the chain costs).
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled
            .store(enabled, std::sync::atomic::Ordering::Relaxed);
    }

    fn active(&self) -> impl Iterator<Item = &dyn Plugin> {
        let enabled = self.enabled.load(std::sync::atomic::Ordering::Relaxed);
        self.plugins
            .iter()
            .filter(move |_| enabled)
            .map(|p| p.as_ref())
    }

    /// The copies plugins read, for requests' contexts and for writes to forget.
    pub fn lookups(&self) -> &Lookups {
        &self.lookups
    }

    /// The plugins' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.plugins.iter().map(|p| p.name()).collect()
    }

    /// Runs every mutating half that handles the request, in order.
    pub async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        for plugin in self.active().filter(|p| p.handles(attributes)) {
            plugin.admit(context, attributes, object, warnings).await?;
        }
        Ok(())
    }

    /// Runs every validating half that handles the request, in order; the first refusal wins.
    pub async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        for plugin in self.active().filter(|p| p.handles(attributes)) {
            plugin
                .validate(context, attributes, object, warnings)
                .await?;
        }
        Ok(())
    }
}

/// Upstream's `admission.NewForbidden` for the request's object.
pub fn forbidden(attributes: &Attributes<'_>, object: &Value, why: &str) -> ApiError {
    ApiError::forbidden(
        &attributes.resource.group_resource(),
        crate::meta::name(object),
        why,
    )
}

/// A create's object through the whole chain: the mutating half now, the validating half as
/// the store's last step before writing (after the registry has prepared and validated it),
/// then the store's own hooks. Returns what was written, with every plugin's warnings.
pub async fn create(
    chain: &Chain,
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    namespaces: &ResourceInfo,
    mut object: Value,
    options: &crate::store::WriteOptions,
    hooks: &dyn CreateHooks,
) -> Result<Written, ApiError> {
    let mut warnings = Vec::new();
    chain
        .admit(context, attributes, &mut object, &mut warnings)
        .await?;
    let validating = ValidatingHooks {
        chain,
        context,
        attributes,
        inner: hooks,
        warnings: std::sync::Mutex::new(Vec::new()),
    };
    let mut written = context
        .store
        .create(
            context.tenant,
            attributes.resource,
            namespaces,
            attributes.namespace,
            object,
            options,
            &validating,
        )
        .await?;
    warnings.extend(validating.warnings.into_inner().unwrap_or_default());
    warnings.append(&mut written.warnings);
    written.warnings = warnings;
    Ok(written)
}

/// The store's create hooks with the chain's validating half in front.
struct ValidatingHooks<'a> {
    chain: &'a Chain,
    context: &'a Context<'a>,
    attributes: &'a Attributes<'a>,
    inner: &'a dyn CreateHooks,
    warnings: std::sync::Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl CreateHooks for ValidatingHooks<'_> {
    async fn before_create(
        &self,
        store: &Store,
        tenant: &Tenant,
        resource: &ResourceInfo,
        obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let mut warnings = Vec::new();
        self.chain
            .validate(self.context, self.attributes, &obj, &mut warnings)
            .await?;
        if let Ok(mut all) = self.warnings.lock() {
            all.extend(warnings);
        }
        self.inner
            .before_create(store, tenant, resource, obj, dry_run)
            .await
    }

    async fn release(&self, store: &Store, tenant: &Tenant, resource: &ResourceInfo, obj: &Value) {
        self.inner.release(store, tenant, resource, obj).await;
    }
}

/// The validating half of the chain for an update, run by the store on each new state it is
/// about to write (so a retried update is decided again on what it will really replace).
pub struct UpdateValidator<'a> {
    chain: &'a Chain,
    context: &'a Context<'a>,
    attributes: Attributes<'a>,
    warnings: std::sync::Mutex<Vec<String>>,
}

impl<'a> UpdateValidator<'a> {
    /// The chain's validating half for updates described by `attributes`.
    pub fn new(chain: &'a Chain, context: &'a Context<'a>, attributes: Attributes<'a>) -> Self {
        UpdateValidator {
            chain,
            context,
            attributes,
            warnings: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The warnings of the last decision.
    pub fn into_warnings(self) -> Vec<String> {
        self.warnings.into_inner().unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl UpdateValidation for UpdateValidator<'_> {
    async fn validate(&self, new: &Value, old: &Value) -> Result<(), ApiError> {
        let attributes = Attributes {
            old: Some(old),
            ..self.attributes
        };
        let mut warnings = Vec::new();
        // A delete goes through the mutating half too (its webhooks may refuse it), on a copy:
        // nothing a plugin does to it is kept, as upstream's delete handler does.
        if attributes.operation == Operation::Delete {
            let mut scratch = new.clone();
            self.chain
                .admit(self.context, &attributes, &mut scratch, &mut warnings)
                .await?;
        }
        self.chain
            .validate(self.context, &attributes, new, &mut warnings)
            .await?;
        if let Ok(mut last) = self.warnings.lock() {
            *last = warnings;
        }
        Ok(())
    }
}

/// What plugins' unit tests build their requests from.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::LazyLock;

    use super::{Attributes, Operation};
    use crate::resources::Resources;

    static RESOURCES: LazyLock<Resources> = LazyLock::new(Resources::builtin);

    /// A request by no one in particular for `group`'s `plural` (served in its preferred
    /// version) in namespace `apps`.
    pub fn attributes(
        operation: Operation,
        group: &str,
        plural: &str,
        subresource: &'static str,
    ) -> Attributes<'static> {
        let resource = RESOURCES
            .iter()
            .find(|r| &*r.group == group && &*r.plural == plural)
            .map(|r| &**r)
            .unwrap_or_else(|| panic!("{plural}.{group} is served"));
        Attributes {
            operation,
            resource,
            subresource,
            namespace: if resource.namespaced { "apps" } else { "" },
            name: "",
            user: None,
            dry_run: false,
            old: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::store::WriteOptions;

    /// Keeps the object it is shown, in the chain where the mutating webhooks are.
    struct Recorder(Arc<Mutex<Option<Value>>>);

    #[async_trait::async_trait]
    impl Plugin for Recorder {
        fn name(&self) -> &'static str {
            "Recorder"
        }

        fn handles(&self, _attributes: &Attributes<'_>) -> bool {
            true
        }

        async fn admit(
            &self,
            _context: &Context<'_>,
            _attributes: &Attributes<'_>,
            object: &mut Value,
            _warnings: &mut Vec<String>,
        ) -> Result<(), ApiError> {
            if let Ok(mut seen) = self.0.lock() {
                *seen = Some(object.clone());
            }
            Ok(())
        }
    }

    struct AllowAll;

    #[async_trait::async_trait]
    impl Authorizer for AllowAll {
        async fn allowed(
            &self,
            _attributes: &flotilla_api_machinery::rbac::Attributes,
        ) -> Result<bool, ApiError> {
            Ok(true)
        }
    }

    /// Creates with nothing run before them (the plugins' tests write their fixtures
    /// straight through the registry).
    pub(crate) struct NoHooks;

    #[async_trait::async_trait]
    impl CreateHooks for NoHooks {
        async fn before_create(
            &self,
            _store: &Store,
            _tenant: &Tenant,
            _resource: &ResourceInfo,
            obj: Value,
            _dry_run: bool,
        ) -> Result<Value, ApiError> {
            Ok(obj)
        }

        async fn release(&self, _: &Store, _: &Tenant, _: &ResourceInfo, _: &Value) {}
    }

    /// Upstream's mutating webhooks are shown a new pod after ServiceAccount and
    /// DefaultTolerationSeconds: with its service account, token volume and mounts, and the
    /// default tolerations. Needs the embedded store only.
    #[tokio::test]
    async fn the_mutating_webhooks_see_a_pod_as_upstreams_do() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let storage = flotilla_storage::EmbeddedStorage::open(dir.path().join("store.redb"))?;
        let store = Store::new(Arc::new(storage));
        let tenant = Tenant::new("demo");
        let resources = Arc::new(Resources::builtin());
        let served = |plural: &str| resources.find("", "v1", plural).cloned();
        let (Some(namespaces), Some(pods)) = (served("namespaces"), served("pods")) else {
            anyhow::bail!("namespaces and pods are served");
        };
        let options = WriteOptions::default();
        let namespace = json!({"metadata": {"name": "apps"}});
        store
            .create(
                &tenant,
                &namespaces,
                &namespaces,
                "",
                namespace,
                &options,
                &NoHooks,
            )
            .await?;

        let seen = Arc::new(Mutex::new(None));
        let mut chain = Chain::upstream_default();
        let webhooks = chain
            .plugins
            .iter()
            .position(|p| p.name() == "MutatingAdmissionWebhook")
            .ok_or_else(|| anyhow::anyhow!("the chain has mutating webhooks"))?;
        chain
            .plugins
            .insert(webhooks, Box::new(Recorder(seen.clone())));
        let (lookups, pod_security) = (Lookups::default(), PodSecurityConfiguration::default());
        let networks = crate::kubelet::KubeletNetworks::default();
        let context = Context {
            store: &store,
            resources: resources.clone(),
            tenant: &tenant,
            lookups: &lookups,
            pod_security: &pod_security,
            authorizer: &AllowAll,
            networks: &networks,
        };
        let attributes = Attributes {
            operation: Operation::Create,
            resource: &pods,
            subresource: "",
            namespace: "apps",
            name: "",
            user: None,
            dry_run: false,
            old: None,
        };
        let pod = json!({"metadata": {"name": "web"},
            "spec": {"containers": [{"name": "app", "image": "nginx"}]}});
        let written = create(
            &chain,
            &context,
            &attributes,
            &namespaces,
            pod,
            &options,
            &NoHooks,
        )
        .await?;

        let shown = seen
            .lock()
            .ok()
            .and_then(|seen| seen.clone())
            .ok_or_else(|| anyhow::anyhow!("the webhooks' place saw the pod"))?;
        let spec = &shown["spec"];
        assert_eq!(spec["serviceAccountName"], "default");
        let volume = spec["volumes"][0]["name"].as_str().unwrap_or_default();
        assert!(volume.starts_with("kube-api-access-"), "{shown}");
        assert_eq!(
            spec["containers"][0]["volumeMounts"][0]["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        let tolerated: Vec<&str> = spec["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["key"].as_str())
            .collect();
        assert_eq!(
            tolerated,
            [
                "node.kubernetes.io/not-ready",
                "node.kubernetes.io/unreachable"
            ]
        );
        // What was shown is what was stored (the registry adds no second volume).
        assert_eq!(written.object["spec"]["volumes"], spec["volumes"]);
        assert_eq!(written.object["spec"]["tolerations"], spec["tolerations"]);
        Ok(())
    }

    #[test]
    fn the_default_chain_is_upstreams_order() {
        let chain = Chain::upstream_default();
        assert_eq!(chain.names(), UPSTREAM_DEFAULT);
        assert_eq!(
            chain.names()[..8],
            [
                "NamespaceLifecycle",
                "LimitRanger",
                "ServiceAccount",
                "NodeRestriction",
                "TaintNodesByCondition",
                "PodSecurity",
                "Priority",
                "DefaultTolerationSeconds",
            ]
        );
        assert_eq!(
            chain.names()[chain.names().len() - 4..],
            [
                "MutatingAdmissionWebhook",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionWebhook",
                "ResourceQuota",
            ]
        );
    }

    #[test]
    fn a_chain_is_built_from_upstreams_names_in_the_order_given() {
        let chain = Chain::from_names(&["ResourceQuota", "NamespaceLifecycle"]).expect("known");
        assert_eq!(chain.names(), ["ResourceQuota", "NamespaceLifecycle"]);
        assert!(Chain::from_names(&[]).expect("empty").names().is_empty());
        assert_eq!(
            Chain::from_names(&["LimitRanger", "AlwaysPullImages"]).err(),
            Some("unknown admission plugin \"AlwaysPullImages\"".to_string())
        );
        // Each plugin answers to the name it is built from.
        for name in UPSTREAM_DEFAULT {
            assert_eq!(plugin(name).map(|p| p.name()), Some(*name));
        }
    }
}
