//! Per-cluster backup and restore (`GET /v1/clusters/{name}/backup`, `POST
//! /v1/clusters/{name}/restore`): a consistent snapshot of one cluster — its management
//! record, node pools, tenant record (its PKI) and every object — read at one store revision
//! and sealed entry by entry under the key-encryption key ([`format`] is the file); and its
//! restore, checked whole before the first write and undone when a write fails.
//!
//! A restore under the backup's own name, in its own account, brings the cluster back as it
//! was: the same id (so the same URL, issuer and storage prefix) and the same CA and signing
//! keys, so its old kubeconfigs, node certificates and tokens work again. Under another name
//! (or in another account) it is a copy: a new id, every object moved under the new prefix,
//! and credentials of its own, since one cluster's credentials must never open another's.

pub mod format;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use flotilla_apiserver::storage::envelope::Opened;
use flotilla_apiserver::store::Tenant;
use flotilla_apiserver::tenants::{TenantRecord, Tenants};
use flotilla_storage::{KeyValue, Outcome, RangeRequest, StorageError};
use futures::StreamExt;
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use crate::error::ManagementError;
use crate::model::*;
use crate::{
    ID_SUFFIX, Management, ROOT, Result, Service, cluster_answer, cluster_key, now, pool_key,
    pools_prefix, random_lowercase,
};

/// The largest backup a restore takes: it is held in memory, one restore at a time per
/// replica.
pub const MAX_BACKUP_BYTES: usize = 256 * 1024 * 1024;
/// Creates a restore keeps in flight at once (etcd and the embedded store commit concurrent
/// writes together).
const RESTORE_CONCURRENCY: usize = 32;
/// Keys read per range while a backup is taken.
const BACKUP_PAGE: usize = 1000;
/// How many revisions a backup tries when compaction overtakes the one it reads at.
const BACKUP_ATTEMPTS: usize = 3;
/// How long a restore may write before the reconciler gives its cluster up as `FAILED`.
pub(crate) const RESTORE_DEADLINE: Duration = Duration::from_secs(1800);

const BASE64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Who holds a cluster id while a restore writes under it: one record per id, so two
/// restores of one backup cannot write into the same prefix, and only the holder's cluster
/// may destroy what is there.
fn restore_claim_key(id: &str) -> String {
    format!("{ROOT}restores/{id}")
}

/// A restore claim's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RestoreClaim {
    account_id: String,
    cluster: String,
}

/// A backup file and its header.
#[derive(Debug, Clone)]
pub struct Backup {
    /// What the file says of itself.
    pub header: format::Header,
    /// The file.
    pub bytes: Vec<u8>,
}

/// Why taking a snapshot stopped: the store (a compaction overtaking the revision is tried
/// again at a newer one) or the cluster.
#[derive(Debug, thiserror::Error)]
enum SnapshotError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Refused(#[from] ManagementError),
}

/// A backup's contents, opened and checked.
#[derive(Debug)]
struct Contents {
    header: format::Header,
    cluster: Cluster,
    tenant: TenantRecord,
    pools: Vec<NodePool>,
    /// Keys below the cluster's storage prefix, with their values.
    objects: Vec<(String, Vec<u8>)>,
}

/// Everything a restore writes, decided before it writes anything.
#[derive(Debug)]
struct Plan {
    account: String,
    name: String,
    id: String,
    /// Whether the cluster keeps the backup's id and credentials.
    same_identity: bool,
    cluster: Cluster,
    tenant: TenantRecord,
    pools: Vec<NodePool>,
    /// Storage keys under the new prefix, with their values.
    objects: Vec<(String, Bytes)>,
}

/// What a restore has written so far, for undoing it.
#[derive(Debug, Default)]
struct Written {
    /// The cluster record's revision, once created.
    record: Option<i64>,
    /// Whether the id is claimed (everything under its prefix is then the restore's).
    claimed: bool,
}

/// An object that describes the service a cluster runs on rather than the cluster itself,
/// put right for this service as a restore writes it.
#[derive(Debug, PartialEq, Eq)]
enum Fixup {
    /// Written as it is.
    Keep,
    /// Written with this value instead.
    Replace(Vec<u8>),
    /// Not written: the cluster's bootstrap writes this service's own.
    Drop,
}

/// What a restore does with the object at `relative` (below the cluster's prefix): the
/// `kubernetes` Service's endpoints name where the backed-up service listened (the bootstrap
/// writes this one's), and `kube-root-ca.crt` ConfigMaps carry its serving CA.
fn for_this_service(relative: &str, value: &[u8], serving_ca_pem: &str) -> Fixup {
    match relative {
        "core/endpoints/default/kubernetes"
        | "discovery.k8s.io/endpointslices/default/kubernetes" => Fixup::Drop,
        _ if relative.starts_with("core/configmaps/")
            && relative.ends_with("/kube-root-ca.crt")
            && relative.matches('/').count() == 3
            && !serving_ca_pem.is_empty() =>
        {
            let Ok(mut object) = serde_json::from_slice::<serde_json::Value>(value) else {
                return Fixup::Keep;
            };
            match object.pointer_mut("/data/ca.crt") {
                Some(ca) if ca.as_str() != Some(serving_ca_pem) => {
                    *ca = serde_json::Value::from(serving_ca_pem);
                    serde_json::to_vec(&object).map_or(Fixup::Keep, Fixup::Replace)
                }
                _ => Fixup::Keep,
            }
        }
        _ => Fixup::Keep,
    }
}

impl Management {
    /// A consistent backup of `account`'s `ACTIVE` cluster `name`: every key of it read at one
    /// store revision (started again at a newer one if compaction overtakes it).
    pub async fn backup_cluster(&self, account: &str, name: &str) -> Result<Backup> {
        let started = Instant::now();
        let mut attempt = 1;
        loop {
            match self.snapshot(account, name).await {
                Ok(backup) => {
                    tracing::info!(
                        cluster = %backup.header.cluster.id,
                        revision = backup.header.revision,
                        objects = backup.header.objects,
                        bytes = backup.bytes.len(),
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "cluster backed up"
                    );
                    return Ok(backup);
                }
                Err(SnapshotError::Storage(StorageError::Compacted { .. }))
                    if attempt < BACKUP_ATTEMPTS =>
                {
                    attempt += 1;
                }
                Err(SnapshotError::Storage(err)) => return Err(err.into()),
                Err(SnapshotError::Refused(err)) => return Err(err),
            }
        }
    }

    /// Every key of the cluster at the store's current revision, sealed into a backup.
    async fn snapshot(&self, account: &str, name: &str) -> Result<Backup, SnapshotError> {
        let revision = self.storage.current_revision().await?;
        let kek = self.api.key_encryption().clone();
        let record = self
            .get_at(&cluster_key(account, name), revision)
            .await?
            .ok_or_else(|| ManagementError::not_found(format!("no cluster named {name:?}")))?;
        let cluster_json = self.opened(&record)?;
        let cluster: Cluster = serde_json::from_slice(&cluster_json).map_err(|e| {
            ManagementError::internal(format!("record {} is unreadable: {e}", record.key))
        })?;
        if cluster.status != ClusterStatus::Active {
            return Err(ManagementError::invalid_request(format!(
                "cluster {name:?} is {}; it can be backed up once it is ACTIVE",
                cluster.status
            ))
            .into());
        }
        let tenant_key = Tenants::record_key(&cluster.id);
        let tenant = self.get_at(&tenant_key, revision).await?.ok_or_else(|| {
            ManagementError::internal(format!("cluster {name:?} has no tenant record"))
        })?;
        let tenant_json = self.opened(&tenant)?;
        // Checked now, so a backup that could not be restored is never written.
        serde_json::from_slice::<TenantRecord>(&tenant_json).map_err(|e| {
            ManagementError::internal(format!("record {tenant_key} is unreadable: {e}"))
        })?;
        let pools_prefix = pools_prefix(account, name);
        let pools = self.range_at(&pools_prefix, revision).await?;
        let prefix = Tenant::new(&cluster.id).key_prefix;
        let objects = self.range_at(&prefix, revision).await?;

        let seal = |key: &str, plain: &[u8]| -> Result<format::Entry, ManagementError> {
            let sealed = kek
                .seal(plain, &format::seal_context(&cluster.id, revision, key))
                .map_err(ManagementError::internal)?;
            Ok(format::Entry {
                key: key.to_string(),
                value: BASE64.encode(sealed),
            })
        };
        let mut entries = Vec::with_capacity(2 + pools.len() + objects.len());
        entries.push(seal(format::CLUSTER_ENTRY, &cluster_json)?);
        entries.push(seal(format::TENANT_ENTRY, &tenant_json)?);
        for kv in &pools {
            let Some(pool) = kv.key.strip_prefix(&pools_prefix) else {
                continue;
            };
            let key = format!("{}{pool}", format::NODE_POOL_PREFIX);
            entries.push(seal(&key, &self.opened(kv)?)?);
        }
        let mut resources = std::collections::BTreeMap::new();
        let mut object_count = 0;
        for kv in &objects {
            let Some(key) = format::object_entry_key(&prefix, &kv.key) else {
                tracing::warn!(key = %kv.key, "a key of no object under a cluster's prefix; left out of its backup");
                continue;
            };
            if let Some(resource) = key
                .strip_prefix(format::OBJECT_PREFIX)
                .and_then(format::resource_of)
            {
                *resources.entry(resource).or_insert(0) += 1;
            }
            object_count += 1;
            entries.push(seal(&key, &kv.value)?);
        }
        let payload = format::encode_payload(&entries);
        let digest = format::sha256_hex(&payload);
        let payload_seal = kek
            .seal(
                digest.as_bytes(),
                &format::digest_context(&cluster.id, revision),
            )
            .map_err(ManagementError::internal)?;
        let header = format::Header {
            api_version: format::API_VERSION.into(),
            kind: format::KIND.into(),
            format_version: format::FORMAT_VERSION,
            cluster: format::BackedUpCluster {
                name: cluster.name.clone(),
                id: cluster.id.clone(),
                account_id: cluster.account_id.clone(),
                kubernetes_version: cluster.version.clone(),
            },
            revision,
            created_at: now(),
            service_version: env!("CARGO_PKG_VERSION").into(),
            key_encryption_key: kek.name().to_string(),
            entries: entries.len(),
            objects: object_count,
            resources,
            payload_bytes: payload.len() as u64,
            payload_sha256: digest,
            payload_seal: BASE64.encode(payload_seal),
        };
        let bytes = format::assemble(&header, &payload);
        Ok(Backup { header, bytes })
    }

    /// `key` as it was at `revision`.
    async fn get_at(&self, key: &str, revision: i64) -> Result<Option<KeyValue>, StorageError> {
        // The key sorts before every longer key it prefixes: the first of the range is it,
        // when it exists.
        let page = self
            .storage
            .range(RangeRequest {
                prefix: key.to_string(),
                start_key: None,
                limit: 1,
                revision,
            })
            .await?;
        Ok(page.kvs.into_iter().next().filter(|kv| kv.key == key))
    }

    /// Every key under `prefix` as it was at `revision`, page by page.
    async fn range_at(&self, prefix: &str, revision: i64) -> Result<Vec<KeyValue>, StorageError> {
        crate::range_pages(&*self.storage, prefix, revision, BACKUP_PAGE).await
    }

    /// A record's plain bytes (sealed under the key-encryption key, or from before sealing).
    fn opened(&self, kv: &KeyValue) -> Result<Vec<u8>> {
        self.api
            .key_encryption()
            .open(&kv.value, &kv.key)
            .map(|opened| opened.bytes().to_vec())
            .map_err(ManagementError::internal)
    }

    /// Recreates a cluster named `name` in `account` from the backup `file`. Nothing is
    /// written until the whole file has been read, authenticated and found restorable, and
    /// the name and id found free; a write that fails undoes what the restore wrote. The
    /// cluster answers `CREATING`, then the reconciler makes it `ACTIVE`.
    pub async fn restore_cluster(&self, account: &str, name: &str, file: &[u8]) -> Result<Cluster> {
        let started = Instant::now();
        let contents = self.open_backup(file)?;
        validate_name("cluster name", name)?;
        self.check_restorable(&contents)?;
        let plan = self.plan_restore(account, name, contents)?;
        self.check_free(&plan).await?;
        let mut written = Written::default();
        match self.write_restore(&plan, &mut written).await {
            Ok(cluster) => {
                let (from, revision) = cluster
                    .restored_from
                    .as_ref()
                    .map_or(("", 0), |from| (from.cluster_id.as_str(), from.revision));
                tracing::info!(
                    cluster = %plan.id,
                    from,
                    revision,
                    objects = plan.objects.len(),
                    same_identity = plan.same_identity,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "cluster restored"
                );
                self.wake.notify_one();
                Ok(cluster)
            }
            Err(err) => {
                self.undo_restore(&plan, &written).await;
                Err(err)
            }
        }
    }

    /// The backup in `file`, read, authenticated with this service's key-encryption key and
    /// every entry opened and decoded.
    fn open_backup(&self, file: &[u8]) -> Result<Contents> {
        let (header, entries) = format::read(file)?;
        let kek = self.api.key_encryption();
        if header.key_encryption_key != kek.name() {
            return Err(ManagementError::invalid_parameter(format!(
                "the backup is sealed under key-encryption key {}, and this service has {}: \
                 restore it on a service started with the same --key-encryption-key-file",
                header.key_encryption_key,
                kek.name()
            )));
        }
        let (id, revision) = (header.cluster.id.as_str(), header.revision);
        let altered = |what: &str| {
            ManagementError::invalid_parameter(format!(
                "the backup's {what} does not open under this service's key-encryption key: \
                 the file was altered"
            ))
        };
        let open = |value: &str, context: &str, what: &str| -> Result<Vec<u8>> {
            let sealed = BASE64.decode(value).map_err(|_| altered(what))?;
            match kek.open(&sealed, context) {
                Ok(Opened::Sealed(plain)) => Ok(plain),
                // A value in clear was never written by a backup.
                Ok(Opened::Plain(_)) | Err(_) => Err(altered(what)),
            }
        };
        let digest = open(
            &header.payload_seal,
            &format::digest_context(id, revision),
            "seal",
        )?;
        if digest != header.payload_sha256.as_bytes() {
            return Err(altered("seal"));
        }
        let undecodable = |key: &str, e: serde_json::Error| {
            ManagementError::invalid_parameter(format!(
                "the backup's entry {key:?} is unreadable: {e}"
            ))
        };
        let (mut cluster, mut tenant) = (None, None);
        let mut pools = Vec::new();
        let mut objects = Vec::with_capacity(header.objects);
        // Each entry's text is dropped as it is opened: the file is held once, not twice.
        for entry in entries {
            let plain = open(
                &entry.value,
                &format::seal_context(id, revision, &entry.key),
                &format!("entry {:?}", entry.key),
            )?;
            match entry.kind() {
                Some(format::EntryKind::Cluster) => {
                    let record: Cluster =
                        serde_json::from_slice(&plain).map_err(|e| undecodable(&entry.key, e))?;
                    cluster = Some(record);
                }
                Some(format::EntryKind::Tenant) => {
                    let record: TenantRecord =
                        serde_json::from_slice(&plain).map_err(|e| undecodable(&entry.key, e))?;
                    tenant = Some(record);
                }
                Some(format::EntryKind::NodePool(name)) => {
                    let pool: NodePool =
                        serde_json::from_slice(&plain).map_err(|e| undecodable(&entry.key, e))?;
                    if pool.name != name {
                        return Err(altered(&format!("entry {:?}", entry.key)));
                    }
                    pools.push(pool);
                }
                Some(format::EntryKind::Object(relative)) => {
                    objects.push((relative.to_string(), plain));
                }
                // `format::read` refuses unknown keys.
                None => return Err(altered(&format!("entry {:?}", entry.key))),
            }
        }
        let (Some(cluster), Some(tenant)) = (cluster, tenant) else {
            return Err(ManagementError::invalid_parameter(
                "the backup holds no cluster or no tenant record",
            ));
        };
        if cluster.id != header.cluster.id
            || cluster.name != header.cluster.name
            || tenant.id != cluster.id
            || pools.iter().any(|pool| pool.cluster_name != cluster.name)
        {
            return Err(ManagementError::invalid_parameter(
                "the backup is inconsistent: its header, cluster, tenant and node pool records name different clusters",
            ));
        }
        Ok(Contents {
            header,
            cluster,
            tenant,
            pools,
            objects,
        })
    }

    /// What a create of the same cluster would be refused for: its version, an audit policy
    /// without an audit backend, more objects than a cluster may store.
    fn check_restorable(&self, contents: &Contents) -> Result<()> {
        let version = &contents.cluster.version;
        if !SUPPORTED_VERSIONS.contains(&version.as_str()) {
            return Err(ManagementError::invalid_parameter(format!(
                "the backup's cluster runs Kubernetes {version}; this service runs {}",
                SUPPORTED_VERSIONS.join(", ")
            )));
        }
        if contents.cluster.audit_policy.is_some() {
            self.require_audit_backend()?;
        }
        if let Some(limit) = self.api.limits().max_objects
            && contents.objects.len() > limit
        {
            return Err(ManagementError::limit_exceeded(format!(
                "the backup holds {} objects; a cluster of this service may store {limit}",
                contents.objects.len()
            )));
        }
        let bytes: u64 = contents
            .objects
            .iter()
            .map(|(_, value)| value.len() as u64)
            .sum();
        if let Some(limit) = self.api.limits().max_bytes
            && bytes > limit
        {
            return Err(ManagementError::limit_exceeded(format!(
                "the backup's objects hold {bytes} bytes; a cluster of this service may store {limit}"
            )));
        }
        Ok(())
    }

    /// The records and keys a restore of `contents` as `account`'s cluster `name` writes.
    fn plan_restore(&self, account: &str, name: &str, contents: Contents) -> Result<Plan> {
        let Contents {
            header,
            cluster: original,
            tenant: original_tenant,
            pools,
            objects,
        } = contents;
        // Credentials stay with their account: another account's restore is a copy.
        let same_identity = name == original.name && account == original.account_id;
        let id = if same_identity {
            original.id.clone()
        } else {
            format!("{name}-{}", random_lowercase(ID_SUFFIX))
        };
        let tenant = if same_identity {
            TenantRecord {
                // The bootstrap runs again: it writes this service's `kubernetes` endpoints
                // and publishes the cluster's CAs.
                bootstrap_version: 0,
                ..original_tenant
            }
        } else {
            TenantRecord {
                endpoint_access: original_tenant.endpoint_access,
                pod_security: original_tenant.pod_security,
                audit_policy: original_tenant.audit_policy,
                ..Tenants::new_record(&id)?
            }
        };
        let prefix = Tenant::new(&id).key_prefix;
        let objects: Vec<(String, Bytes)> = objects
            .into_iter()
            .filter_map(|(relative, value)| {
                let value = match for_this_service(&relative, &value, &self.endpoint.ca_pem) {
                    Fixup::Keep => value,
                    Fixup::Replace(value) => value,
                    Fixup::Drop => return None,
                };
                Some((format::storage_key(&prefix, &relative), Bytes::from(value)))
            })
            .collect();
        let cluster = Cluster {
            name: name.to_string(),
            id: id.clone(),
            account_id: account.to_string(),
            endpoint: format!("{}/clusters/{id}", self.endpoint.base_url),
            status: ClusterStatus::Creating,
            status_reason: Some(format!("restoring {} objects from a backup", objects.len())),
            client_request_token: None,
            created_at: now(),
            certificate_authority: None,
            cloud_released: false,
            arn: None,
            identity: None,
            health: Health::default(),
            restored_from: Some(RestoredFrom {
                cluster_name: original.name.clone(),
                cluster_id: original.id.clone(),
                revision: header.revision,
                backup_created_at: header.created_at.clone(),
            }),
            restoring: true,
            ..original
        };
        let pools = pools
            .into_iter()
            .map(|pool| NodePool {
                cluster_name: name.to_string(),
                status: NodePoolStatus::Creating,
                status_reason: None,
                instance_ids: Vec::new(),
                ready_nodes: 0,
                health: Health::default(),
                client_request_token: None,
                created_at: now(),
                ..pool
            })
            .collect();
        Ok(Plan {
            account: account.to_string(),
            name: name.to_string(),
            id,
            same_identity,
            cluster,
            tenant,
            pools,
            objects,
        })
    }

    /// Refuses (409) a restore onto a name that exists, or onto an id in use here.
    async fn check_free(&self, plan: &Plan) -> Result<()> {
        if self
            .storage
            .get(&cluster_key(&plan.account, &plan.name))
            .await?
            .is_some()
        {
            return Err(ManagementError::in_use(format!(
                "cluster {:?} already exists",
                plan.name
            )));
        }
        let prefix = Tenant::new(&plan.id).key_prefix;
        let in_use = self
            .storage
            .get(&Tenants::record_key(&plan.id))
            .await?
            .is_some()
            || self
                .storage
                .get(&restore_claim_key(&plan.id))
                .await?
                .is_some()
            || !self
                .storage
                .range(RangeRequest {
                    prefix,
                    limit: 1,
                    ..Default::default()
                })
                .await?
                .kvs
                .is_empty();
        if in_use {
            return Err(ManagementError::in_use(format!(
                "cluster id {:?} is in use on this service: the backed-up cluster (or another \
                 restore of it) is here; restore it under another name to make a copy",
                plan.id
            )));
        }
        Ok(())
    }

    /// Writes the plan: the cluster record (claiming the name), the id's claim, the objects,
    /// the node pools, the tenant record last (its cluster's control loops start on it, so
    /// they never see half the objects), then the record made ready for the reconciler.
    async fn write_restore(&self, plan: &Plan, written: &mut Written) -> Result<Cluster> {
        let record_key = cluster_key(&plan.account, &plan.name);
        match self
            .storage
            .create(&record_key, self.seal(&record_key, &plan.cluster)?)
            .await?
        {
            Outcome::Done(kv) => written.record = Some(kv.mod_revision),
            Outcome::Conflict(_) => {
                return Err(ManagementError::in_use(format!(
                    "cluster {:?} already exists",
                    plan.name
                )));
            }
        }
        let claim_key = restore_claim_key(&plan.id);
        let claim = RestoreClaim {
            account_id: plan.account.clone(),
            cluster: plan.name.clone(),
        };
        match self
            .storage
            .create(&claim_key, self.seal(&claim_key, &claim)?)
            .await?
        {
            Outcome::Done(_) => written.claimed = true,
            Outcome::Conflict(_) => {
                return Err(ManagementError::in_use(format!(
                    "cluster id {:?} is being restored by another request",
                    plan.id
                )));
            }
        }
        let taken = || {
            ManagementError::in_use(format!(
                "cluster id {:?} is being written by another request",
                plan.id
            ))
        };
        // Concurrent creates; after a failure the rest are skipped, and the undo removes the
        // whole prefix (the claim makes it this restore's), written or not.
        let stop = AtomicBool::new(false);
        let stop = &stop;
        let mut creates = futures::stream::iter(plan.objects.iter().cloned())
            .map(|(key, value)| async move {
                if stop.load(Ordering::Relaxed) {
                    return None;
                }
                Some(self.storage.create(&key, value).await)
            })
            .buffer_unordered(RESTORE_CONCURRENCY);
        let mut failure = None;
        while let Some(outcome) = creates.next().await {
            let failed = match outcome {
                None | Some(Ok(Outcome::Done(_))) => None,
                Some(Ok(Outcome::Conflict(_))) => Some(taken()),
                Some(Err(err)) => Some(ManagementError::from(err)),
            };
            if let Some(err) = failed {
                stop.store(true, Ordering::Relaxed);
                failure.get_or_insert(err);
            }
        }
        if let Some(err) = failure {
            return Err(err);
        }
        for pool in &plan.pools {
            let key = pool_key(&plan.account, &plan.name, &pool.name);
            if let Outcome::Conflict(_) = self.storage.create(&key, self.seal(&key, pool)?).await? {
                return Err(ManagementError::in_use(format!(
                    "node pool {:?} of cluster {:?} already exists",
                    pool.name, plan.name
                )));
            }
        }
        let tenant_key = Tenants::record_key(&plan.id);
        let sealed = self.api.tenants.seal_record(&tenant_key, &plan.tenant)?;
        if let Outcome::Conflict(_) = self.storage.create(&tenant_key, sealed).await? {
            return Err(taken());
        }
        let ready = Cluster {
            restoring: false,
            status_reason: None,
            ..plan.cluster.clone()
        };
        let revision = written.record.unwrap_or_default();
        if !self.swap(&record_key, &ready, revision).await? {
            return Err(ManagementError::in_use(format!(
                "cluster {:?} changed while it was being restored (deleted?)",
                plan.name
            )));
        }
        // The record is the cluster now; a claim left behind is released by its deletion.
        if let Err(err) = self.storage.delete(&claim_key, None).await {
            tracing::warn!(cluster = %plan.id, %err, "releasing a restore's claim");
        }
        Ok(ready)
    }

    /// Removes what a failed restore wrote: everything under the claimed id, the node pools,
    /// the claim, then the record. A step that fails leaves the rest (and the record, still
    /// marked restoring) for the reconciler: the cluster turns `FAILED` at the deadline and
    /// its deletion removes the rest.
    async fn undo_restore(&self, plan: &Plan, written: &Written) {
        let undone = async {
            if written.claimed {
                self.api.tenants.destroy(&plan.id).await?;
                for pool in &plan.pools {
                    self.storage
                        .delete(&pool_key(&plan.account, &plan.name, &pool.name), None)
                        .await?;
                }
                self.storage
                    .delete(&restore_claim_key(&plan.id), None)
                    .await?;
            }
            if written.record.is_some() {
                self.storage
                    .delete(&cluster_key(&plan.account, &plan.name), written.record)
                    .await?;
            }
            Ok::<(), ManagementError>(())
        };
        if let Err(err) = undone.await {
            tracing::warn!(cluster = %plan.id, %err, "undoing a failed restore; the reconciler finishes it");
        }
    }

    /// The restore claim on `cluster`'s id, when there is one: whether it is `cluster`'s,
    /// and its revision.
    async fn restore_claim(&self, cluster: &Cluster) -> Result<Option<(bool, i64)>> {
        let Some(kv) = self.storage.get(&restore_claim_key(&cluster.id)).await? else {
            return Ok(None);
        };
        let claim: RestoreClaim = self.open(&kv)?;
        let ours = claim.account_id == cluster.account_id && claim.cluster == cluster.name;
        Ok(Some((ours, kv.mod_revision)))
    }

    /// Whether a restore of `cluster` that never finished got as far as its tenant record
    /// (its control loops, the cloud's among them, may have run).
    pub(crate) async fn restore_reached_tenant(&self, cluster: &Cluster) -> Result<bool> {
        // Without its claim it wrote nothing (or undid it); another's claim is not its.
        match self.restore_claim(cluster).await? {
            Some((true, _)) => Ok(self
                .storage
                .get(&Tenants::record_key(&cluster.id))
                .await?
                .is_some()),
            _ => Ok(false),
        }
    }

    /// Whether `cluster` may destroy the tenant under its id: always, unless it is a restore
    /// that never finished and does not hold the id's claim (it wrote nothing there, or
    /// another restore holds it).
    pub(crate) async fn owns_tenant(&self, cluster: &Cluster) -> Result<bool> {
        Ok(!cluster.restoring || matches!(self.restore_claim(cluster).await?, Some((true, _))))
    }

    /// Releases `cluster`'s claim on its id, once what is under the id is gone.
    pub(crate) async fn release_restore_claim(&self, cluster: &Cluster) -> Result<()> {
        if let Some((true, revision)) = self.restore_claim(cluster).await? {
            self.storage
                .delete(&restore_claim_key(&cluster.id), Some(revision))
                .await?;
        }
        Ok(())
    }
}

/// `GET /v1/clusters/{name}/backup`: the backup file.
pub(crate) async fn get_backup(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let backup = m.backup_cluster(caller.account()?, &name).await?;
    let disposition = format!(
        "attachment; filename=\"{name}-{}.flotilla-backup\"",
        backup.header.revision
    );
    Ok((
        StatusCode::OK,
        [
            (http::header::CONTENT_TYPE, format::MEDIA_TYPE.to_string()),
            (http::header::CONTENT_DISPOSITION, disposition),
        ],
        backup.bytes,
    )
        .into_response())
}

/// `POST /v1/clusters/{name}/restore`: the body is a backup file; answers the new cluster.
pub(crate) async fn post_restore(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let account = caller.account()?;
    // One restore at a time per replica: each holds its file in memory.
    let _turn = m
        .restores
        .acquire()
        .await
        .map_err(|_| ManagementError::unavailable("the service is shutting down"))?;
    let mut file = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|e| ManagementError::invalid_parameter(format!("reading the backup: {e}")))?;
        if file.len() + chunk.len() > MAX_BACKUP_BYTES {
            return Err(ManagementError::too_large(format!(
                "a backup to restore may be at most {MAX_BACKUP_BYTES} bytes"
            )));
        }
        file.extend_from_slice(&chunk);
    }
    let cluster = m.restore_cluster(account, &name, &file).await?;
    Ok(cluster_answer(&m, cluster))
}

#[cfg(test)]
mod tests;
