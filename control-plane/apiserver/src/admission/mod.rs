//! The admission chain as data (upstream `k8s.io/apiserver/pkg/admission`): an ordered list
//! of plugins, each one module, run on every write after authorization. Mutating plugins
//! (`admit`) change the object before the registry prepares and validates it; validating
//! plugins (`validate`) see the final object just before it is stored, so what they allow
//! is exactly what is written. The order is upstream's `--enable-admission-plugins` order.

mod default_storage_class;
mod limit_ranger;
mod pod_security;
mod priority;
mod resource_quota;
mod storage_protection;

use flotilla_api_machinery::rbac::UserInfo;
use serde_json::Value;

use crate::error::ApiError;
use crate::resources::{ResourceInfo, Resources};
use crate::selection::Selection;
use crate::store::{CreateHooks, ListOptions, ReadAt, Store, Tenant, Written};

/// What a request does to its object (upstream's `admission.Operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// A new object (POST, or an apply that creates).
    Create,
}

/// The request a plugin decides on (upstream's `admission.Attributes`).
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
    /// The tenant's kinds.
    pub resources: &'a Resources,
    /// Whose cluster the request is for.
    pub tenant: &'a Tenant,
}

impl Context<'_> {
    /// The kind `plural` of `group`/`version`, which the server always serves.
    pub fn resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<&ResourceInfo, ApiError> {
        self.resources
            .find(group, version, plural)
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
}

impl Chain {
    /// Upstream's default plugins that live in the chain, in upstream's order. The others of
    /// upstream's default list run where the registry needs them: NamespaceLifecycle in the
    /// store's create, ServiceAccount and DefaultTolerationSeconds in the Pod strategy,
    /// TaintNodesByCondition in the Node strategy, NodeRestriction beside the Node
    /// authorizer, CertificateApproval in the CSR approval path.
    pub fn upstream_default() -> Self {
        Chain {
            plugins: vec![
                Box::new(limit_ranger::LimitRanger),
                Box::new(pod_security::PodSecurity),
                Box::new(priority::Priority),
                Box::new(default_storage_class::DefaultStorageClass),
                Box::new(storage_protection::StorageObjectInUseProtection),
                Box::new(resource_quota::ResourceQuota),
            ],
        }
    }

    /// No plugins (for measuring what the chain costs).
    pub fn empty() -> Self {
        Chain {
            plugins: Vec::new(),
        }
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
        for plugin in self.plugins.iter().filter(|p| p.handles(attributes)) {
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
        for plugin in self.plugins.iter().filter(|p| p.handles(attributes)) {
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
