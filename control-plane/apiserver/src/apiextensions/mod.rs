//! `apiextensions.k8s.io`: each tenant's CustomResourceDefinitions and the kinds they add to
//! that tenant's resource table (and to nobody else's). Upstream runs these as a delegated
//! server with naming, establishing and finalizer controllers; here the same steps run right
//! after a definition is written ([`reconcile`]), and each tenant's table is rebuilt from its
//! definitions when they change (or, for changes another replica made, when it is found stale).

pub mod columns;
pub mod conversion;
pub mod custom_resource;
pub mod definition;
pub mod naming;
pub mod schemas;

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::meta;
use crate::openapi::CustomDocuments;
use crate::resources::{ResourceInfo, Resources};
use crate::store::{DeleteOptions, Deleted, ListOptions, Tenant};

/// The group definitions are served in.
pub const GROUP: &str = "apiextensions.k8s.io";

/// How long a tenant's table is trusted before it is read again from its definitions (the
/// bound on how long another replica's change takes to be seen here).
const REFRESH_AFTER: Duration = Duration::from_secs(10);

/// How soon after a load a request for an unknown kind may load again (another replica may
/// have just established it).
const RELOAD_ON_MISS_AFTER: Duration = Duration::from_secs(1);

/// One tenant's resource table: the built-in kinds and its definitions' kinds.
#[derive(Default)]
pub struct TenantKinds {
    loaded: RwLock<Option<(Instant, Arc<Resources>)>>,
    loading: tokio::sync::Mutex<()>,
    /// The keys and revisions of the definitions the table was built from.
    fingerprint: Mutex<Option<Vec<(String, flotilla_storage::Revision)>>>,
    /// The OpenAPI documents of the table they were built for.
    documents: Mutex<Option<(Arc<Resources>, Arc<CustomDocuments>)>>,
}

impl TenantKinds {
    /// The tenant's table, read from its definitions when not known or stale.
    pub async fn table(
        &self,
        server: &ApiServer,
        tenant: &Tenant,
    ) -> Result<Arc<Resources>, ApiError> {
        if let Some((at, table)) = self.current()
            && at.elapsed() < REFRESH_AFTER
        {
            return Ok(table);
        }
        self.reload(server, tenant).await
    }

    /// The tenant's OpenAPI v3 documents when its definitions add kinds (`None`: the shared
    /// documents are the tenant's).
    pub async fn documents(
        &self,
        server: &ApiServer,
        tenant: &Tenant,
    ) -> Result<Option<Arc<CustomDocuments>>, ApiError> {
        let table = self.table(server, tenant).await?;
        if !table.iter().any(|r| r.is_custom()) {
            return Ok(None);
        }
        let mut documents = self
            .documents
            .lock()
            .map_err(|_| ApiError::internal("the OpenAPI documents' lock was poisoned"))?;
        if let Some((built_for, built)) = &*documents
            && Arc::ptr_eq(built_for, &table)
        {
            return Ok(Some(built.clone()));
        }
        let built = Arc::new(server.openapi.with_custom(&table));
        *documents = Some((table, built.clone()));
        Ok(Some(built))
    }

    /// The table as last loaded, without reading anything (a request has loaded it already).
    pub fn loaded(&self) -> Option<Arc<Resources>> {
        self.current().map(|(_, table)| table)
    }

    fn current(&self) -> Option<(Instant, Arc<Resources>)> {
        self.loaded.read().ok().and_then(|loaded| loaded.clone())
    }

    /// The tenant's table for a request about `group`: read again first when the group is
    /// neither built in nor known yet (another replica may have just added it), at most once
    /// a second.
    pub async fn table_for_group(
        &self,
        server: &ApiServer,
        tenant: &Tenant,
        group: &str,
    ) -> Result<Arc<Resources>, ApiError> {
        let table = self.table(server, tenant).await?;
        if table.iter().any(|r| r.group == group) || !self.may_reload_on_miss() {
            return Ok(table);
        }
        self.reload(server, tenant).await
    }

    /// Whether a miss may read the definitions again: the table is over a second old.
    fn may_reload_on_miss(&self) -> bool {
        self.current()
            .is_none_or(|(at, _)| at.elapsed() >= RELOAD_ON_MISS_AFTER)
    }

    /// The resource at `group/version/plural` for this tenant; a miss on a group that is not
    /// built in reads the definitions again first (another replica may have just added it).
    pub async fn find(
        &self,
        server: &ApiServer,
        tenant: &Tenant,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Result<Option<Arc<ResourceInfo>>, ApiError> {
        let table = self.table(server, tenant).await?;
        if let Some(found) = table.find(group, version, plural) {
            return Ok(Some(found.clone()));
        }
        let built_in = server.resources.iter().any(|r| r.group == group);
        if built_in || !self.may_reload_on_miss() {
            return Ok(None);
        }
        let table = self.reload(server, tenant).await?;
        Ok(table.find(group, version, plural).cloned())
    }

    /// Reads the tenant's definitions and rebuilds its table.
    pub async fn reload(
        &self,
        server: &ApiServer,
        tenant: &Tenant,
    ) -> Result<Arc<Resources>, ApiError> {
        let started = Instant::now();
        let _one_at_a_time = self.loading.lock().await;
        // Someone else loaded while this call waited: theirs is as fresh as a new one.
        if let Some((at, table)) = self.current()
            && at >= started
        {
            return Ok(table);
        }
        // Unchanged definitions (the same keys at the same revisions) keep the table: a
        // refresh then costs one range read and no parsing.
        let prefix = tenant.list_prefix(definitions_resource(server), None);
        let stored = server
            .store
            .storage()
            .range(flotilla_storage::RangeRequest {
                prefix,
                ..Default::default()
            })
            .await?;
        // The APIServices too: one naming a Service for a replaceable built-in group takes
        // that group out of the table.
        let services = match server
            .resources
            .find("apiregistration.k8s.io", "v1", "apiservices")
        {
            Some(api_services) => {
                server
                    .store
                    .storage()
                    .range(flotilla_storage::RangeRequest {
                        prefix: tenant.list_prefix(api_services, None),
                        ..Default::default()
                    })
                    .await?
                    .kvs
            }
            None => Vec::new(),
        };
        let fingerprint: Vec<(String, flotilla_storage::Revision)> = stored
            .kvs
            .iter()
            .chain(&services)
            .map(|kv| (kv.key.clone(), kv.mod_revision))
            .collect();
        let unchanged = match self.fingerprint.lock() {
            Ok(known) if *known == Some(fingerprint.clone()) => true,
            Ok(mut known) => {
                *known = Some(fingerprint);
                false
            }
            Err(_) => false,
        };
        if unchanged && let Some((_, table)) = self.current() {
            if let Ok(mut loaded) = self.loaded.write() {
                *loaded = Some((Instant::now(), table.clone()));
            }
            return Ok(table);
        }
        let definitions: Vec<Value> = stored
            .kvs
            .iter()
            .map(crate::store::decode)
            .collect::<Result<_, _>>()?;
        let custom: Vec<Arc<ResourceInfo>> = definitions
            .iter()
            .filter(|d| definition::condition_status(d, "Established") == Some("True"))
            .flat_map(|d| {
                let conversion = conversion::of_definition(d, server, tenant);
                custom_resource::kinds_of(d, &server.schemas, &conversion)
            })
            .collect();
        let replaced: Vec<&str> = crate::resources::REPLACEABLE_GROUPS
            .iter()
            .copied()
            .filter(|group| {
                services.iter().any(|kv| {
                    crate::store::decode(kv).is_ok_and(|service| {
                        service["spec"]["group"] == *group && service["spec"]["service"].is_object()
                    })
                })
            })
            .collect();
        let table = match (custom.is_empty(), replaced.is_empty()) {
            (true, true) => server.resources.clone(),
            (false, true) => Arc::new(server.resources.with_custom(custom)),
            (_, false) => Arc::new(
                server
                    .resources
                    .without_groups(&replaced)
                    .with_custom(custom),
            ),
        };
        if let Ok(mut loaded) = self.loaded.write() {
            *loaded = Some((Instant::now(), table.clone()));
        }
        Ok(table)
    }
}

/// The definitions resource (always served).
pub fn definitions_resource(server: &ApiServer) -> &ResourceInfo {
    server
        .resources
        .find(GROUP, "v1", "customresourcedefinitions")
        .map(|r| &**r)
        .unwrap_or_else(|| unreachable!("customresourcedefinitions are always served"))
}

async fn list_definitions(server: &ApiServer, tenant: &Tenant) -> Result<Vec<Value>, ApiError> {
    let page = server
        .store
        .list(
            tenant,
            definitions_resource(server),
            None,
            &ListOptions::default(),
        )
        .await?;
    Ok(page.items)
}

/// What upstream's naming, establishing and finalizer controllers do after a definition
/// changes: accept its names (or say which one conflicts), mark it `Established`, delete the
/// objects of one being deleted, and rebuild the tenant's table.
pub async fn reconcile(
    server: &ApiServer,
    state: &crate::tenants::TenantState,
) -> Result<(), ApiError> {
    let tenant = &state.tenant;
    let resource = definitions_resource(server);
    let mut definitions = list_definitions(server, tenant).await?;
    // First come, first served: the older definition keeps a contested name.
    definitions.sort_by(|a, b| {
        let created = |d: &Value| {
            meta::str_at(d, &["metadata", "creationTimestamp"])
                .unwrap_or("")
                .to_string()
        };
        created(a)
            .cmp(&created(b))
            .then_with(|| meta::name(a).cmp(meta::name(b)))
    });
    for index in 0..definitions.len() {
        let definition = &definitions[index];
        if meta::is_terminating(definition) {
            continue;
        }
        let Some((accepted, names_condition, established)) =
            naming::calculate(definition, &definitions)
        else {
            continue;
        };
        let name = meta::name(definition).to_string();
        let written = server
            .store
            .guaranteed_update(tenant, resource, "", &name, false, |current| {
                let mut next = current.clone();
                next["status"]["acceptedNames"] = accepted.clone();
                for condition in [&names_condition, &established] {
                    definition::set_condition(
                        &mut next,
                        &condition.kind,
                        &condition.status,
                        &condition.reason,
                        &condition.message,
                    );
                }
                Ok((next != *current).then_some(next))
            })
            .await;
        match written {
            Ok(updated) => definitions[index] = updated,
            Err(err) if err.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    for definition in definitions.iter().filter(|d| meta::is_terminating(d)) {
        if meta::finalizers(definition)
            .iter()
            .any(|f| f == definition::CLEANUP_FINALIZER)
        {
            clean_up(server, state, definition).await?;
        }
    }
    // A definition being deleted serves reads and deletes of its objects until they are
    // gone and it is released, as upstream's does; the table follows what is left.
    state.kinds.reload(server, tenant).await?;
    Ok(())
}

/// Upstream's finalizer controller: deletes every object of a definition being deleted, then
/// releases the definition. Objects that wait on finalizers of their own keep it waiting
/// (`InstanceDeletionCheck`), and the next reconcile tries again.
async fn clean_up(
    server: &ApiServer,
    state: &crate::tenants::TenantState,
    definition: &Value,
) -> Result<(), ApiError> {
    let tenant = &state.tenant;
    let name = meta::name(definition).to_string();
    let resource = definitions_resource(server);
    // Its kinds left the table when deletion began; their objects are found through the
    // definition itself (every version is stored under one key prefix), read without
    // conversion: deleting needs no webhook, which may be gone already.
    let storage_kinds = custom_resource::kinds_of(definition, &server.schemas, &Default::default());
    let mut remaining = 0;
    if let Some(kind) = storage_kinds.first() {
        let page = server
            .store
            .list(tenant, kind, None, &ListOptions::default())
            .await?;
        for object in &page.items {
            let deleted = server
                .store
                .delete(
                    tenant,
                    kind,
                    meta::namespace(object),
                    meta::name(object),
                    &DeleteOptions::default(),
                    false,
                    &server.allocator,
                    None,
                )
                .await;
            match deleted {
                Ok(Deleted::Gone(_)) => {}
                Ok(Deleted::Pending(_)) => remaining += 1,
                Err(err) if err.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
    }
    let result = server
        .store
        .guaranteed_update(tenant, resource, "", &name, false, |current| {
            let mut next = current.clone();
            if remaining > 0 {
                definition::set_condition(
                    &mut next,
                    "Terminating",
                    "True",
                    "InstanceDeletionCheck",
                    &format!(
                        "could not confirm zero CustomResources remaining: {remaining} remaining"
                    ),
                );
            } else {
                let finalizers: Vec<String> = meta::finalizers(current)
                    .into_iter()
                    .filter(|f| f != definition::CLEANUP_FINALIZER)
                    .collect();
                next["metadata"]["finalizers"] = json!(finalizers);
                definition::set_condition(
                    &mut next,
                    "Terminating",
                    "False",
                    "InstanceDeletionCompleted",
                    "removed all instances",
                );
            }
            Ok((next != *current).then_some(next))
        })
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(err) if err.code == 404 => Ok(()),
        Err(err) => Err(err),
    }
}
