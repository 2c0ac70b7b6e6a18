//! The admission chain as data (upstream `k8s.io/apiserver/pkg/admission`): an ordered list
//! of plugins, each one module, run on every write after authorization. Mutating plugins
//! (`admit`) change the object before the registry prepares and validates it; validating
//! plugins (`validate`) see the final object just before it is stored, so what they allow
//! is exactly what is written. The order is upstream's `--enable-admission-plugins` order.

mod certificate_signing;
mod certificate_subject;
mod claim_resize;
mod default_class;
mod limit_ranger;
mod lookups;
mod pod_security;
mod pod_security_config;
mod policy;
mod priority;
mod resource_quota;
mod runtime_class;
mod storage_protection;
mod webhook;

use std::sync::Arc;

use flotilla_api_machinery::rbac::UserInfo;
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

impl Chain {
    /// Upstream's default plugins that live in the chain, in upstream's order. The others of
    /// upstream's default list run where the registry needs them: NamespaceLifecycle in the
    /// store's create, ServiceAccount and DefaultTolerationSeconds in the Pod strategy,
    /// TaintNodesByCondition in the Node strategy, NodeRestriction beside the Node
    /// authorizer, CertificateApproval in the CSR approval path.
    pub fn upstream_default() -> Self {
        Chain {
            enabled: std::sync::atomic::AtomicBool::new(true),
            lookups: Lookups::default(),
            plugins: vec![
                Box::new(limit_ranger::LimitRanger),
                Box::new(pod_security::PodSecurity),
                Box::new(priority::Priority),
                Box::new(claim_resize::PersistentVolumeClaimResize),
                Box::new(runtime_class::RuntimeClass),
                Box::new(certificate_signing::CertificateSigning),
                Box::new(certificate_subject::CertificateSubjectRestriction),
                Box::new(default_class::DEFAULT_INGRESS_CLASS),
                Box::new(default_class::DEFAULT_STORAGE_CLASS),
                Box::new(storage_protection::StorageObjectInUseProtection),
                Box::new(webhook::MutatingWebhooks),
                Box::new(policy::ValidatingAdmissionPolicies),
                Box::new(webhook::ValidatingWebhooks),
                Box::new(resource_quota::ResourceQuota::default()),
            ],
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
