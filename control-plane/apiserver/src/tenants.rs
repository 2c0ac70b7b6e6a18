//! Tenant clusters known to the server: their records in storage (id, CA), client-certificate
//! authentication against each tenant's own CA, and the objects every new cluster starts with.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, UnixTime};
use serde_json::json;
use tokio::sync::RwLock;

use crate::authn::SigningKey;
use crate::endpoint_access::EndpointAccess;
use crate::error::ApiError;
use crate::pki::{
    CertificateAuthority, CertificateIdentity, IssuedCertificate, certificate_identity,
};
use crate::serve::PeerCertificates;
use crate::storage::envelope::KeyEncryptionKey;
use crate::store::{Store, Tenant, WriteOptions};

/// Where tenant records live: outside every tenant's own prefix.
const TENANT_RECORDS: &str = "/flotilla/tenants/";

/// How long a loaded tenant is served before its record is read again. A change to a record
/// (a cluster deleted, or given another endpoint access, through any replica) drops it from
/// the cache at once through [`Tenants::follow_records`]; this bounds how stale a missed
/// change can be.
const TENANT_RECHECK: Duration = Duration::from_secs(5);
/// How long [`Tenants::follow_records`] waits before watching again after its watch failed.
const RECORD_WATCH_RETRY: Duration = Duration::from_secs(1);
/// How many times (50 ms apart) a failed bootstrap create looks for a concurrent one's object.
const CONCURRENT_BOOTSTRAP_CHECKS: usize = 40;

/// Keys deleted per range while a tenant is destroyed.
const DESTROY_BATCH: usize = 500;

/// The stored record of one tenant cluster.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TenantRecord {
    /// Cluster id (URL segment).
    pub id: String,
    /// The cluster's client CA: it signs the certificates of this cluster's users only.
    pub client_ca: CertificateAuthority,
    /// The cluster's service-account signing key (PKCS#8, base64; see [`SigningKey`]). Empty
    /// in records written before tokens existed; the first load adds one.
    #[serde(default)]
    pub service_account_key: String,
    /// Which generation of default objects the cluster has (see [`BOOTSTRAP_VERSION`]).
    #[serde(default)]
    pub bootstrap_version: u32,
    /// Who may reach the cluster's endpoint (the management API's `endpointAccess`).
    #[serde(default)]
    pub endpoint_access: EndpointAccess,
    /// Its PodSecurity admission defaults and exemptions (the management API's `podSecurity`).
    #[serde(default)]
    pub pod_security: crate::admission::PodSecurityConfiguration,
    /// The CA of the front-proxy client certificate the cluster's aggregated API servers
    /// trust (upstream's `--requestheader-client-ca-file`): apart from the client CA, so no
    /// user certificate can pass for the proxy. Absent in records written before aggregated
    /// APIs; the first load adds one.
    #[serde(default)]
    pub front_proxy_ca: Option<CertificateAuthority>,
    /// The cluster's own audit policy (the management API's `auditPolicy`): recorded besides
    /// what the operator's policy records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_policy: Option<crate::audit::Policy>,
}

/// The generation of default objects a cluster gets: 1 added the RBAC defaults, default
/// ServiceAccounts, `kube-root-ca.crt` ConfigMaps and the `kubernetes` endpoints; 2 the
/// kubeadm-style node bootstrap bindings (bootstrap tokens request node client certificates,
/// nodes renew their own); 3 the `kube-system/extension-apiserver-authentication` ConfigMap
/// with the client CA (kubelets verify the API server's client certificate with it); 4 the
/// same ConfigMap's request-header keys (aggregated API servers authenticate the front proxy
/// with them). A cluster below it is brought up to date on its next request.
pub const BOOTSTRAP_VERSION: u32 = 4;

/// The name aggregated API servers must find in the front proxy's certificate
/// (`requestheader-allowed-names`).
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// A loaded tenant: where its keys are and how its clients are authenticated.
pub struct TenantState {
    /// Storage placement.
    pub tenant: Tenant,
    /// The stored record.
    pub record: TenantRecord,
    verifier: Arc<dyn ClientCertVerifier>,
    signing_key: Option<SigningKey>,
    issuer: String,
    bootstrapped: std::sync::atomic::AtomicBool,
    /// Its RBAC policy, cached briefly.
    pub policy: crate::authz::PolicyCache,
    /// How many objects it stores, for its quota.
    pub object_count: crate::limits::ObjectCount,
    /// Its request budget (kept while the record is unchanged).
    pub limiter: crate::limits::RateLimiter,
    /// Its requests executing and queued.
    pub seats: crate::limits::Seats,
    /// Its open watches.
    pub watches: crate::limits::LongRunning,
    /// Its open exec, attach and port-forward sessions.
    pub streams: crate::limits::LongRunning,
    /// Its turn on the heavy-work threads: one large body parsed at a time.
    pub heavy_work: tokio::sync::Semaphore,
    /// Its own request metrics (the requests that reached its API, after authorization).
    pub metrics: crate::metrics::Metrics,
    /// When its scheduler and controller manager were last seen (`componentstatuses`).
    pub components: crate::componentstatus::ComponentActivity,
    /// Its nodes' last usage summaries (`metrics.k8s.io`).
    pub node_summaries: crate::metrics_server::Summaries,
    /// Its resource table: the built-in kinds and its definitions' kinds.
    pub kinds: crate::apiextensions::TenantKinds,
    /// Its APIServices served by its own servers, and what they were last found to serve.
    pub remote_apis: crate::aggregator::remote::RemoteApis,
    /// The front proxy's client certificate, issued on first use.
    front_proxy_client: std::sync::OnceLock<IssuedCertificate>,
}

impl TenantState {
    fn load(
        record: TenantRecord,
        issuer_base: &str,
        max_bytes: Option<u64>,
    ) -> Result<Self, ApiError> {
        let mut roots = rustls::RootCertStore::empty();
        let ca =
            CertificateDer::from_pem_slice(record.client_ca.cert_pem.as_bytes()).map_err(|e| {
                ApiError::internal(format!("tenant {} CA is unreadable: {e}", record.id))
            })?;
        roots
            .add(ca)
            .map_err(|e| ApiError::internal(format!("tenant {} CA rejected: {e}", record.id)))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            crate::serve::crypto_provider(),
        )
        .allow_unauthenticated()
        .build()
        .map_err(|e| ApiError::internal(format!("tenant {} verifier: {e}", record.id)))?;
        let bootstrapped = record.bootstrap_version >= BOOTSTRAP_VERSION;
        let signing_key = match record.service_account_key.as_str() {
            "" => None,
            key => Some(SigningKey::load(key)?),
        };
        Ok(TenantState {
            tenant: Tenant::with_byte_quota(&record.id, max_bytes),
            issuer: format!("{issuer_base}/clusters/{}", record.id),
            record,
            verifier,
            signing_key,
            bootstrapped: bootstrapped.into(),
            policy: Default::default(),
            object_count: Default::default(),
            limiter: Default::default(),
            seats: Default::default(),
            watches: Default::default(),
            streams: Default::default(),
            heavy_work: tokio::sync::Semaphore::new(1),
            metrics: Default::default(),
            components: Default::default(),
            node_summaries: Default::default(),
            kinds: Default::default(),
            remote_apis: Default::default(),
            front_proxy_client: Default::default(),
        })
    }

    /// The identity of a connection's client certificate, if it chains to this tenant's CA.
    /// A certificate of another tenant's CA authenticates nothing here.
    pub fn authenticate(&self, peer: &PeerCertificates) -> Option<CertificateIdentity> {
        peer.verdict(&self.tenant.id, |chain| {
            let (leaf, intermediates) = chain.split_first()?;
            self.verifier
                .verify_client_cert(leaf, intermediates, UnixTime::now())
                .ok()?;
            certificate_identity(leaf)
        })
    }

    /// Whether the cluster has the current generation of default objects.
    pub fn bootstrapped(&self) -> bool {
        self.bootstrapped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The service-account token issuer (and default API audience): the cluster's URL.
    pub fn issuer(&self) -> String {
        self.issuer.clone()
    }

    /// The key service-account tokens are signed with.
    pub fn signing_key(&self) -> Option<&SigningKey> {
        self.signing_key.as_ref()
    }

    /// A short-lived admin bearer token (`kubernetes-admin` in `system:masters`): (token,
    /// expiry in seconds since the epoch).
    pub fn issue_admin_token(&self, lifetime_seconds: i64) -> Result<(String, i64), ApiError> {
        let key = self
            .signing_key()
            .ok_or_else(|| ApiError::internal("this cluster has no signing key"))?;
        crate::authn::issue_user_token(
            key,
            &self.issuer,
            "kubernetes-admin",
            &["system:masters"],
            lifetime_seconds,
        )
    }

    /// The front proxy's client certificate (CN `front-proxy-client`), signed by the
    /// cluster's front-proxy CA; issued once per load.
    pub fn front_proxy_client(&self) -> Result<&IssuedCertificate, ApiError> {
        if let Some(issued) = self.front_proxy_client.get() {
            return Ok(issued);
        }
        let ca = self.record.front_proxy_ca.as_ref().ok_or_else(|| {
            ApiError::internal(format!("tenant {} has no front-proxy CA", self.record.id))
        })?;
        let issued = ca
            .issue_client(FRONT_PROXY_CLIENT, &[])
            .map_err(ApiError::internal)?;
        Ok(self.front_proxy_client.get_or_init(|| issued))
    }

    /// A new admin client certificate (`system:masters`) for this tenant.
    pub fn issue_admin(&self) -> Result<IssuedCertificate, ApiError> {
        self.issue_client("kubernetes-admin", &["system:masters"])
    }

    /// A client certificate for `user` in `groups`, signed by this tenant's client CA (e.g.
    /// `system:kube-proxy` for the proxies of local nodes).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<IssuedCertificate, ApiError> {
        self.record
            .client_ca
            .issue_client(user, groups)
            .map_err(ApiError::internal)
    }
}

/// The tenants of this server, loaded lazily from storage so every replica sees them.
pub struct Tenants {
    store: Store,
    /// Seals tenant records: they hold the cluster's CA and service-account private keys.
    key_encryption: Arc<KeyEncryptionKey>,
    /// `https://host:port` clients reach the service at: tenant issuers are below it.
    public_url: String,
    /// Each tenant's byte quota.
    max_bytes: Option<u64>,
    loaded: RwLock<HashMap<String, (Arc<TenantState>, Instant)>>,
    /// The clusters whose control loops this replica holds but has stopped while idle.
    loops_parked: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Tenants {
    /// The registry over `store`, for a service reached at `public_url`, its records sealed
    /// under `key_encryption`.
    pub fn new(
        store: Store,
        public_url: &str,
        key_encryption: Arc<KeyEncryptionKey>,
        max_bytes: Option<u64>,
    ) -> Self {
        Tenants {
            store,
            key_encryption,
            public_url: public_url.trim_end_matches('/').to_string(),
            max_bytes,
            loops_parked: Default::default(),
            loaded: RwLock::new(HashMap::new()),
        }
    }

    /// Notes whether the control loops of `id` held here are parked (stopped while idle).
    pub fn set_loops_parked(&self, id: &str, parked: bool) {
        let mut set = self
            .loops_parked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if parked {
            set.insert(id.to_string());
        } else {
            set.remove(id);
        }
    }

    /// Whether the control loops of `id` are parked on this replica.
    pub fn loops_parked(&self, id: &str) -> bool {
        self.loops_parked
            .lock()
            .map(|set| set.contains(id))
            .unwrap_or(false)
    }

    /// The tenant `id`: `Ok(None)` only when its record is absent. A record the store cannot
    /// read now (etcd away, partitioned) is an error (503), as is one that cannot be
    /// decoded (500), so a client never sees a whole cluster 404 during a fault.
    pub async fn get(&self, id: &str) -> Result<Option<Arc<TenantState>>, ApiError> {
        // The read guard must be gone before the write below (tokio's lock would wait on it).
        let cached = self.loaded.read().await.get(id).cloned();
        if let Some((state, loaded_at)) = &cached
            && loaded_at.elapsed() < TENANT_RECHECK
        {
            return Ok(Some(state.clone()));
        }
        let key = format!("{TENANT_RECORDS}{id}");
        let kv = match self.store.storage().get(&key).await {
            Ok(Some(kv)) => kv,
            Ok(None) => {
                self.loaded.write().await.remove(id);
                return Ok(None);
            }
            // Storage trouble: keep serving what was loaded rather than failing every request.
            Err(err) => {
                let loaded = self.loaded.read().await.get(id).map(|(s, _)| s.clone());
                return match loaded {
                    Some(state) => Ok(Some(state)),
                    None => Err(err.into()),
                };
            }
        };
        let record = match self.decode(&key, &kv.value) {
            Ok((record, _))
                if record.service_account_key.is_empty() || record.front_proxy_ca.is_none() =>
            {
                match self.add_missing_keys(record, kv.mod_revision).await? {
                    Some(record) => record,
                    None => {
                        self.loaded.write().await.remove(id);
                        return Ok(None);
                    }
                }
            }
            Ok((record, plain)) => {
                if plain {
                    self.seal_in_place(&key, &record, kv.mod_revision).await;
                }
                record
            }
            Err(err) => {
                tracing::error!(tenant = id, %err, "tenant record unreadable");
                return Err(ApiError::internal(format!(
                    "the record of cluster {id} cannot be read: {err}"
                )));
            }
        };
        let mut loaded = self.loaded.write().await;
        // The same record as before keeps its state (and so its connections' cached verdicts).
        let state = match loaded.get(id) {
            Some((state, _))
                if state.record.client_ca == record.client_ca
                    && state.record.service_account_key == record.service_account_key
                    && state.record.endpoint_access == record.endpoint_access
                    && state.record.front_proxy_ca == record.front_proxy_ca =>
            {
                state.clone()
            }
            _ => Arc::new(TenantState::load(record, &self.public_url, self.max_bytes)?),
        };
        loaded.insert(id.to_string(), (state.clone(), Instant::now()));
        Ok(Some(state))
    }

    /// Drops a tenant from the cache whenever its record changes, in any replica, so the next
    /// request reads it anew: endpoint access and deletions apply within a watch's latency,
    /// without reading every record every second. Runs until the task is aborted; after a
    /// failed watch (compaction, etcd away) it forgets everything loaded and watches again.
    pub async fn follow_records(&self) {
        use futures::StreamExt;
        loop {
            let from = match self.store.storage().current_revision().await {
                Ok(revision) => revision + 1,
                Err(err) => {
                    tracing::warn!(%err, "watching tenant records");
                    tokio::time::sleep(RECORD_WATCH_RETRY).await;
                    continue;
                }
            };
            // Whatever changed before the watch started is read anew.
            self.loaded.write().await.clear();
            let mut changes = match self.store.storage().watch(TENANT_RECORDS, from).await {
                Ok(changes) => changes,
                Err(err) => {
                    tracing::warn!(%err, "watching tenant records");
                    tokio::time::sleep(RECORD_WATCH_RETRY).await;
                    continue;
                }
            };
            while let Some(Ok(batch)) = changes.next().await {
                let mut loaded = self.loaded.write().await;
                for event in batch.events {
                    if let Some(id) = event.kv.key.strip_prefix(TENANT_RECORDS) {
                        loaded.remove(id);
                    }
                }
            }
            tokio::time::sleep(RECORD_WATCH_RETRY).await;
        }
    }

    /// The storage prefix under which tenant records live (one key per tenant), for those
    /// that watch the set of tenants.
    pub const RECORDS_PREFIX: &'static str = TENANT_RECORDS;

    /// The tenant id a record's key names.
    pub fn record_id(key: &str) -> Option<&str> {
        key.strip_prefix(TENANT_RECORDS)
    }

    /// The storage key of tenant `id`'s record.
    pub fn record_key(id: &str) -> String {
        format!("{TENANT_RECORDS}{id}")
    }

    /// A new record for tenant `id`: its own client CA, service-account signing key and
    /// front-proxy CA, no default objects yet.
    pub fn new_record(id: &str) -> Result<TenantRecord, ApiError> {
        Ok(TenantRecord {
            id: id.to_string(),
            client_ca: CertificateAuthority::generate(&crate::pki::tenant_ca_name(id))
                .map_err(ApiError::internal)?,
            service_account_key: SigningKey::generate()?,
            bootstrap_version: 0,
            endpoint_access: EndpointAccess::default(),
            pod_security: Default::default(),
            front_proxy_ca: Some(
                CertificateAuthority::generate(&crate::pki::front_proxy_ca_name(id))
                    .map_err(ApiError::internal)?,
            ),
            audit_policy: None,
        })
    }

    /// A stored tenant record (the value of [`Tenants::record_key`]), opened.
    pub fn open_record(&self, key: &str, value: &[u8]) -> Result<TenantRecord, ApiError> {
        self.decode(key, value).map(|(record, _)| record)
    }

    /// `record` as it is stored under `key`: sealed under the key-encryption key.
    pub fn seal_record(&self, key: &str, record: &TenantRecord) -> Result<Bytes, ApiError> {
        self.encode(key, record)
    }

    /// The ids of every tenant in storage.
    pub async fn ids(&self) -> Result<Vec<String>, ApiError> {
        let mut ids = Vec::new();
        let mut start_key = None;
        loop {
            let page = self
                .store
                .storage()
                .range(flotilla_storage::RangeRequest {
                    prefix: TENANT_RECORDS.to_string(),
                    start_key: start_key.clone(),
                    limit: DESTROY_BATCH,
                    revision: 0,
                })
                .await?;
            ids.extend(
                page.kvs
                    .iter()
                    .filter_map(|kv| kv.key.strip_prefix(TENANT_RECORDS).map(String::from)),
            );
            match (page.more, page.kvs.last()) {
                (true, Some(last)) => start_key = Some(format!("{}\0", last.key)),
                _ => return Ok(ids),
            }
        }
    }

    /// Gives a record written before service-account tokens existed its signing key, once:
    /// a replica that loses the race uses the winner's.
    async fn add_missing_keys(
        &self,
        mut record: TenantRecord,
        revision: i64,
    ) -> Result<Option<TenantRecord>, ApiError> {
        if record.service_account_key.is_empty() {
            record.service_account_key = SigningKey::generate().map_err(ApiError::internal)?;
        }
        if record.front_proxy_ca.is_none() {
            record.front_proxy_ca = Some(
                CertificateAuthority::generate(&crate::pki::front_proxy_ca_name(&record.id))
                    .map_err(ApiError::internal)?,
            );
        }
        let key = format!("{TENANT_RECORDS}{}", record.id);
        let bytes = self.encode(&key, &record)?;
        match self.store.storage().update(&key, bytes, revision).await? {
            flotilla_storage::Outcome::Done(_) => Ok(Some(record)),
            // Another replica added them first: theirs are the keys.
            flotilla_storage::Outcome::Conflict(Some(kv)) => {
                self.decode(&key, &kv.value).map(|(record, _)| Some(record))
            }
            // Deleted meanwhile.
            flotilla_storage::Outcome::Conflict(None) => Ok(None),
        }
    }

    /// A stored tenant record, opened: (record, whether it was stored in plaintext).
    fn decode(&self, key: &str, value: &[u8]) -> Result<(TenantRecord, bool), ApiError> {
        let opened = self
            .key_encryption
            .open(value, key)
            .map_err(ApiError::internal)?;
        let record = serde_json::from_slice(opened.bytes()).map_err(ApiError::internal)?;
        Ok((record, opened.is_plain()))
    }

    /// A tenant record as stored: sealed, bound to its storage key.
    fn encode(&self, key: &str, record: &TenantRecord) -> Result<Bytes, ApiError> {
        let json = serde_json::to_vec(record).map_err(ApiError::internal)?;
        let sealed = self
            .key_encryption
            .seal(&json, key)
            .map_err(ApiError::internal)?;
        Ok(Bytes::from(sealed))
    }

    /// Writes a record found in plaintext (from before records were sealed) back sealed.
    /// Best effort: a concurrent writer seals it too, and the next read tries again.
    async fn seal_in_place(&self, key: &str, record: &TenantRecord, revision: i64) {
        let Ok(bytes) = self.encode(key, record) else {
            return;
        };
        match self.store.storage().update(key, bytes, revision).await {
            Ok(flotilla_storage::Outcome::Done(_)) => {
                tracing::warn!(tenant = %record.id, "tenant record was stored unsealed; sealed it");
            }
            Ok(flotilla_storage::Outcome::Conflict(_)) => {}
            Err(err) => tracing::warn!(tenant = %record.id, %err, "sealing a tenant record"),
        }
    }

    /// Deletes tenant `id` for good: every key under its prefix (objects, allocations), then
    /// its record, so its credentials open nothing any more. Idempotent: destroying a tenant
    /// that is already gone, or half gone, finishes the job.
    pub async fn destroy(&self, id: &str) -> Result<(), ApiError> {
        let storage = self.store.storage();
        let prefix = Tenant::new(id).key_prefix;
        loop {
            let page = storage
                .range(flotilla_storage::RangeRequest {
                    prefix: prefix.clone(),
                    limit: DESTROY_BATCH,
                    ..Default::default()
                })
                .await?;
            if page.kvs.is_empty() {
                break;
            }
            for kv in &page.kvs {
                storage.delete(&kv.key, None).await?;
            }
        }
        storage
            .delete(&format!("{TENANT_RECORDS}{id}"), None)
            .await?;
        self.loaded.write().await.remove(id);
        Ok(())
    }

    /// Creates tenant `id` (CA and default objects) unless it exists; returns it either way.
    pub async fn ensure(
        &self,
        server: &crate::ApiServer,
        id: &str,
    ) -> Result<Arc<TenantState>, ApiError> {
        if !flotilla_api_machinery::names::is_dns1123_label(id).is_empty() {
            return Err(ApiError::bad_request(format!(
                "invalid cluster id {id:?}: must be a DNS-1123 label"
            )));
        }
        if self.get(id).await?.is_none() {
            let record = Self::new_record(id)?;
            let key = Self::record_key(id);
            let bytes = self.encode(&key, &record)?;
            // Create-if-absent: a concurrent replica creating the same tenant wins or loses cleanly.
            let _ = self.store.storage().create(&key, bytes).await?;
        }
        let state = self
            .get(id)
            .await?
            .ok_or_else(|| ApiError::internal(format!("tenant {id} vanished")))?;
        if state.bootstrapped() {
            return Ok(state);
        }
        bootstrap_objects(server, &state).await?;
        self.record_bootstrapped(id).await?;
        state
            .bootstrapped
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(state)
    }

    /// Sets who may reach tenant `id`'s endpoint (idempotent); every replica following the
    /// records ([`Tenants::follow_records`]) applies it as soon as its watch delivers it.
    pub async fn set_endpoint_access(
        &self,
        id: &str,
        access: &EndpointAccess,
    ) -> Result<(), ApiError> {
        self.update_record(id, |record| {
            let changed = record.endpoint_access != *access;
            record.endpoint_access = access.clone();
            changed
        })
        .await
        .map(drop)
    }

    /// Gives tenant `id` the PodSecurity configuration `config`.
    pub async fn set_pod_security(
        &self,
        id: &str,
        config: &crate::admission::PodSecurityConfiguration,
    ) -> Result<(), ApiError> {
        self.update_record(id, |record| {
            let changed = record.pod_security != *config;
            record.pod_security = config.clone();
            changed
        })
        .await
        .map(drop)
    }

    /// Sets tenant `id`'s own audit policy.
    pub async fn set_audit_policy(
        &self,
        id: &str,
        policy: Option<&crate::audit::Policy>,
    ) -> Result<(), ApiError> {
        self.update_record(id, |record| {
            let changed = record.audit_policy.as_ref() != policy;
            record.audit_policy = policy.cloned();
            changed
        })
        .await
        .map(drop)
    }

    /// Marks tenant `id`'s record as holding the current default objects.
    async fn record_bootstrapped(&self, id: &str) -> Result<(), ApiError> {
        self.update_record(id, |record| {
            let behind = record.bootstrap_version < BOOTSTRAP_VERSION;
            record.bootstrap_version = record.bootstrap_version.max(BOOTSTRAP_VERSION);
            behind
        })
        .await
        .map(drop)
    }

    /// Changes tenant `id`'s record by compare-and-swap: `change` edits it and says whether it
    /// changed anything (nothing is written then). Whether a change was written.
    async fn update_record(
        &self,
        id: &str,
        change: impl Fn(&mut TenantRecord) -> bool,
    ) -> Result<bool, ApiError> {
        let key = format!("{TENANT_RECORDS}{id}");
        for _ in 0..16 {
            let Some(kv) = self.store.storage().get(&key).await? else {
                return Err(ApiError::internal(format!("tenant {id} vanished")));
            };
            let (mut record, _) = self.decode(&key, &kv.value)?;
            if !change(&mut record) {
                return Ok(false);
            }
            let bytes = self.encode(&key, &record)?;
            if let flotilla_storage::Outcome::Done(_) = self
                .store
                .storage()
                .update(&key, bytes, kv.mod_revision)
                .await?
            {
                return Ok(true);
            }
        }
        Err(ApiError::service_unavailable(format!(
            "tenant {id}'s record kept changing"
        )))
    }
}

/// The objects every cluster starts with (idempotent: existing ones are left alone).
async fn bootstrap_objects(server: &crate::ApiServer, state: &TenantState) -> Result<(), ApiError> {
    let tenant = &state.tenant;
    let options = WriteOptions {
        field_manager: "flotilla-bootstrap".into(),
        ..Default::default()
    };
    let namespaces = server.namespaces();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        create_if_absent(server, tenant, namespaces, "", obj, &options).await?;
    }
    if let Some(services) = server.resources.find("", "v1", "services") {
        let ip = crate::allocator::ServiceNetwork::default()
            .kubernetes_service_ip()
            .to_string();
        let obj = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
        });
        create_if_absent(server, tenant, services, "default", obj, &options).await?;
        // The cluster DNS's address, where users and tools look for it. Every node answers it
        // itself (the node proxy's responder), so the Service selects no pods.
        let dns_ip = crate::allocator::ServiceNetwork::default()
            .cluster_dns_ip()
            .to_string();
        let obj = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {
                "k8s-app": "kube-dns",
                "kubernetes.io/cluster-service": "true",
                "kubernetes.io/name": "CoreDNS",
            }},
            "spec": {"type": "ClusterIP", "clusterIP": dns_ip, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
            ]},
        });
        create_if_absent(server, tenant, services, "kube-system", obj, &options).await?;
    }
    // Each namespace's `default` ServiceAccount and upstream's default RBAC policy, written
    // concurrently (they are independent, and etcd commits concurrent writes together).
    let mut writes = Vec::new();
    if let Some(accounts) = server.resources.find("", "v1", "serviceaccounts") {
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}});
            writes.push((accounts, ns, obj));
        }
    }
    // The `kubernetes` Service's endpoints: where this server listens (upstream's
    // endpoint reconciler), when that is one concrete address.
    if let Ok(address) = server.advertise_address.parse::<std::net::SocketAddr>()
        && !address.ip().is_unspecified()
        && let (Some(endpoints), Some(slices)) = (
            server.resources.find("", "v1", "endpoints"),
            server
                .resources
                .find("discovery.k8s.io", "v1", "endpointslices"),
        )
    {
        let (ip, port) = (address.ip().to_string(), address.port());
        let family = if address.is_ipv4() { "IPv4" } else { "IPv6" };
        writes.push((
            endpoints,
            "default",
            json!({"apiVersion": "v1", "kind": "Endpoints",
                "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
                "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]}),
        ));
        writes.push((
            slices,
            "default",
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
                "addressType": family,
                "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
        ));
    }
    // What pods use to trust the API server (upstream's root-CA publisher).
    if let Some(config_maps) = server.resources.find("", "v1", "configmaps")
        && !server.serving_ca_pem.is_empty()
    {
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt", "namespace": ns},
                "data": {"ca.crt": server.serving_ca_pem}});
            writes.push((config_maps, ns, obj));
        }
    }
    // The client CA and the front proxy's request headers, where upstream's API server
    // publishes them (`ClientCARegistrationHook`): kubelets verify the API server's client
    // certificate with the one, aggregated API servers authenticate the front proxy with the
    // other. Clusters bootstrapped before the request-header keys get them now.
    if let Some(config_maps) = server.resources.find("", "v1", "configmaps") {
        publish_authentication(server, state, config_maps, &options).await?;
    }
    let rbac_group = flotilla_api_machinery::rbac::GROUP_NAME;
    if let (Some(roles), Some(bindings)) = (
        server.resources.find(rbac_group, "v1", "clusterroles"),
        server
            .resources
            .find(rbac_group, "v1", "clusterrolebindings"),
    ) {
        // Stored with their aggregated rules, as upstream's aggregation controller leaves them.
        let defaults = flotilla_api_machinery::rbac::aggregate_cluster_roles(
            &flotilla_api_machinery::rbac::bootstrap_cluster_roles(),
        );
        for role in defaults {
            let mut obj = serde_json::to_value(&role).map_err(ApiError::internal)?;
            obj["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
            obj["kind"] = json!("ClusterRole");
            writes.push((roles, "", obj));
        }
        let node_bootstrap = flotilla_api_machinery::rbac::node_bootstrap_cluster_role_bindings();
        for binding in flotilla_api_machinery::rbac::bootstrap_cluster_role_bindings()
            .into_iter()
            .chain(node_bootstrap)
        {
            let mut obj = serde_json::to_value(&binding).map_err(ApiError::internal)?;
            obj["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
            obj["kind"] = json!("ClusterRoleBinding");
            writes.push((bindings, "", obj));
        }
    }
    let outcomes = futures::future::join_all(writes.into_iter().map(|(resource, ns, obj)| {
        let options = &options;
        async move { create_if_absent(server, tenant, resource, ns, obj, options).await }
    }))
    .await;
    outcomes
        .into_iter()
        .collect::<Result<Vec<()>, ApiError>>()?;
    Ok(())
}

/// Writes `kube-system/extension-apiserver-authentication`, replacing the data of one
/// written before it carried every key.
async fn publish_authentication(
    server: &crate::ApiServer,
    state: &TenantState,
    config_maps: &crate::resources::ResourceInfo,
    options: &WriteOptions,
) -> Result<(), ApiError> {
    let (namespace, name) = crate::node::CLIENT_CA_CONFIGMAP;
    let front_proxy_ca = state
        .record
        .front_proxy_ca
        .as_ref()
        .map(|ca| ca.cert_pem.as_str())
        .unwrap_or("");
    let data = json!({
        "client-ca-file": state.record.client_ca.cert_pem,
        "requestheader-client-ca-file": front_proxy_ca,
        "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT}\"]"),
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
    });
    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace}, "data": data});
    create_if_absent(server, &state.tenant, config_maps, namespace, obj, options).await?;
    server
        .store
        .guaranteed_update(
            &state.tenant,
            config_maps,
            namespace,
            name,
            false,
            |current| {
                if current["data"] == data {
                    return Ok(None);
                }
                let mut updated = current.clone();
                updated["data"] = data.clone();
                Ok(Some(updated))
            },
        )
        .await?;
    Ok(())
}

pub(crate) async fn create_if_absent(
    server: &crate::ApiServer,
    tenant: &Tenant,
    resource: &crate::resources::ResourceInfo,
    namespace: &str,
    obj: serde_json::Value,
    options: &WriteOptions,
) -> Result<(), ApiError> {
    let key = tenant.object_key(resource, namespace, crate::meta::name(&obj));
    // Services are checked first because a create runs its hooks before storing: re-creating
    // the `kubernetes` Service would fail on its already reserved IP, not with AlreadyExists.
    // Everything else simply answers AlreadyExists, which saves a read per default object.
    if resource.kind == "Service" && server.store.storage().get(&key).await?.is_some() {
        return Ok(());
    }
    match server
        .store
        .create(
            tenant,
            resource,
            server.namespaces(),
            namespace,
            obj,
            options,
            &server.allocator,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if err.reason == "AlreadyExists" => Ok(()),
        // A concurrent bootstrap (another replica's reconciler) may be creating it: its
        // hooks already hold what ours need (the IP), so ours fail first. Wait for its write.
        Err(err) => {
            for _ in 0..CONCURRENT_BOOTSTRAP_CHECKS {
                if server.store.storage().get(&key).await?.is_some() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err)
        }
    }
}

#[cfg(test)]
mod tests;
