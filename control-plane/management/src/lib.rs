//! Flotilla's management API (`/v1/…`): accounts and API keys, clusters, node pools and admin
//! kubeconfigs, modelled on EKS, and the reconciler that turns cluster records into tenants of
//! the API server and destroys them again.
//!
//! Records live in the same storage as the tenants, under `/flotilla/…` (outside every tenant's
//! prefix), so every replica of `flotilla serve` sees the same accounts and clusters. Status is
//! asynchronous as in EKS: a create answers `CREATING` at once, the reconciler makes it
//! `ACTIVE`; a delete answers `DELETING` and the reconciler removes every object and credential.

mod accounts;
pub mod backup;
pub mod error;
pub mod model;
mod openapi;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use flotilla_apiserver::ApiServer;
use flotilla_apiserver::storage::envelope::Opened;
use flotilla_storage::{KeyValue, Outcome, RangeRequest, Storage};
use futures::StreamExt;
use http::{HeaderMap, StatusCode};
use rand::Rng;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ManagementError;
use crate::model::*;

/// Every management record's prefix.
const ROOT: &str = "/flotilla/management/";
/// How often the reconciler looks at every record even without a nudge, while some record is
/// in a transitional state (creating, deleting, a pool changing).
const RESYNC: Duration = Duration::from_secs(2);
/// … and when every record is settled: a safety net only, since every record change anywhere
/// (this replica's API, another replica's, the cloud loops' reports) nudges it through a watch
/// of the records. An idle fleet is then not read in full every 2 s.
const SETTLED_RESYNC: Duration = Duration::from_secs(60);
/// Lifetime of an admin token (EKS's tokens last 15 minutes).
const ADMIN_TOKEN_SECONDS: i64 = 900;
/// How long a cluster may stay `CREATING` (setup retried on every pass) before it is `FAILED`.
const CREATE_DEADLINE: Duration = Duration::from_secs(300);
/// Length of the random suffix of a cluster id and of an API key.
const ID_SUFFIX: usize = 6;
const KEY_LENGTH: usize = 40;

type Result<T, E = ManagementError> = std::result::Result<T, E>;

fn accounts_prefix() -> String {
    format!("{ROOT}accounts/")
}
fn account_key(id: &str) -> String {
    format!("{ROOT}accounts/{id}")
}
fn api_keys_prefix() -> String {
    format!("{ROOT}apikeys/")
}
fn api_key_key(hash: &str) -> String {
    format!("{ROOT}apikeys/{hash}")
}
fn console_session_key_key() -> String {
    format!("{ROOT}console-session-key")
}
fn operator_key(hash: &str) -> String {
    format!("{ROOT}operator-tokens/{hash}")
}
fn clusters_prefix(account: &str) -> String {
    format!("{ROOT}clusters/{account}/")
}
fn cluster_key(account: &str, name: &str) -> String {
    format!("{ROOT}clusters/{account}/{name}")
}
fn account_pools_prefix(account: &str) -> String {
    format!("{ROOT}nodepools/{account}/")
}
fn pools_prefix(account: &str, cluster: &str) -> String {
    format!("{ROOT}nodepools/{account}/{cluster}/")
}
fn pool_key(account: &str, cluster: &str, pool: &str) -> String {
    format!("{ROOT}nodepools/{account}/{cluster}/{pool}")
}
fn token_key(account: &str, kind: &str, token: &str) -> String {
    format!(
        "{ROOT}request-tokens/{account}/{kind}/{}",
        sha256_hex(token)
    )
}

fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn random_lowercase(length: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..length)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Whether `cluster` has been `CREATING` for longer than its deadline: [`CREATE_DEADLINE`],
/// or [`backup::RESTORE_DEADLINE`] while a restore writes it.
fn creation_expired(cluster: &Cluster) -> bool {
    let deadline = if cluster.restoring {
        backup::RESTORE_DEADLINE
    } else {
        CREATE_DEADLINE
    };
    chrono::DateTime::parse_from_rfc3339(&cluster.created_at)
        .map(|created| {
            chrono::Utc::now().signed_duration_since(created)
                > chrono::Duration::from_std(deadline).unwrap_or(chrono::Duration::MAX)
        })
        .unwrap_or(true)
}

fn pool_not_found(pool: &str, cluster: &str) -> ManagementError {
    ManagementError::not_found(format!(
        "no node pool named {pool:?} in cluster {cluster:?}"
    ))
}

/// A request body as `T`, with a clear 400 for anything else.
fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    serde_json::from_slice(body)
        .map_err(|e| ManagementError::invalid_parameter(format!("invalid request body: {e}")))
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Caller {
    /// The service operator: manages accounts.
    Operator,
    /// An account, through one of its API keys.
    Account(String),
}

impl Caller {
    fn account(&self) -> Result<&str> {
        match self {
            Caller::Account(id) => Ok(id),
            Caller::Operator => Err(ManagementError::access_denied(
                "the operator token manages accounts; use an account's API key for clusters",
            )),
        }
    }
}

/// Where the tenant API of a cluster is reached, for endpoints and kubeconfigs.
#[derive(Debug, Clone)]
pub struct PublicEndpoint {
    /// `https://host:port`, without a path.
    pub base_url: String,
    /// The CA that signed the serving certificate (PEM).
    pub ca_pem: String,
}

/// A cluster record with its node pools, as the reconciler last read them (secrets
/// included: this is for the cloud controller in this process, never for responses).
#[derive(Debug, Clone)]
pub struct ManagedCluster {
    /// The cluster.
    pub cluster: Cluster,
    /// Its node pools.
    pub pools: Vec<NodePool>,
    /// The store revisions the cluster's record and its pools' were read at: the same
    /// revisions, the same records.
    pub revisions: Vec<i64>,
}

/// Every cluster by id, as of the reconciler's last pass.
pub type ClusterIndex = std::collections::HashMap<String, ManagedCluster>;

/// What the cloud controller saw of a node pool on one pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodePoolReport {
    /// Its live instances.
    pub instance_ids: Vec<String>,
    /// How many of their Nodes are Ready.
    pub ready_nodes: u32,
    /// What keeps it from its size.
    pub issues: Vec<HealthIssue>,
}

/// The management service.
pub struct Management {
    storage: Arc<dyn Storage>,
    api: Arc<ApiServer>,
    endpoint: PublicEndpoint,
    wake: tokio::sync::Notify,
    index: tokio::sync::watch::Sender<Arc<ClusterIndex>>,
    /// One restore at a time: each holds its backup file in memory.
    restores: tokio::sync::Semaphore,
    /// The settings each Active cluster's API was last given here (see [`Applied`]).
    applied: std::sync::Mutex<Applied>,
}

/// For each Active cluster, the revision of its record whose settings (endpoint access, Pod
/// Security, audit policy) its API was last given by this process. A pass gives them again
/// only for a record that changed since: reading every cluster's tenant record on every pass
/// made each pass cost a store read per cluster, so creates slowed as the fleet grew. Forgotten
/// every [`SETTLED_RESYNC`], so that a setting changed behind the reconciler's back is still
/// put right within that.
struct Applied {
    revisions: std::collections::HashMap<String, i64>,
    since: std::time::Instant,
}

impl Applied {
    fn new() -> Self {
        Applied {
            revisions: std::collections::HashMap::new(),
            since: std::time::Instant::now(),
        }
    }
}

impl Management {
    /// The service over the API server's storage.
    pub fn new(api: Arc<ApiServer>, endpoint: PublicEndpoint) -> Arc<Self> {
        Arc::new(Management {
            storage: api.store().storage().clone(),
            api,
            endpoint,
            wake: tokio::sync::Notify::new(),
            index: tokio::sync::watch::Sender::new(Arc::new(ClusterIndex::new())),
            restores: tokio::sync::Semaphore::new(1),
            applied: std::sync::Mutex::new(Applied::new()),
        })
    }

    fn applied(&self) -> std::sync::MutexGuard<'_, Applied> {
        self.applied.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A record as stored: sealed under the key-encryption key, bound to its storage key
    /// (cluster records carry cloud credentials).
    fn seal(&self, key: &str, value: &impl Serialize) -> Result<Bytes> {
        let json = serde_json::to_vec(value).map_err(ManagementError::internal)?;
        let sealed = self
            .api
            .key_encryption()
            .seal(&json, key)
            .map_err(ManagementError::internal)?;
        Ok(Bytes::from(sealed))
    }

    /// A stored record, opened (one stored before sealing reads as it is, and
    /// [`Management::seal_stored_records`] seals it).
    fn open<T: DeserializeOwned>(&self, kv: &KeyValue) -> Result<T> {
        let opened = self
            .api
            .key_encryption()
            .open(&kv.value, &kv.key)
            .map_err(ManagementError::internal)?;
        serde_json::from_slice(opened.bytes())
            .map_err(|e| ManagementError::internal(format!("record {} is unreadable: {e}", kv.key)))
    }

    /// Seals every management record stored before records were sealed (compare-and-swap
    /// per record: one changed meanwhile was written sealed by its writer). Returns how many.
    pub async fn seal_stored_records(&self) -> Result<usize> {
        let mut sealed = 0;
        let mut start_key = None;
        loop {
            let page = self
                .storage
                .range(RangeRequest {
                    prefix: ROOT.to_string(),
                    start_key: start_key.clone(),
                    limit: 500,
                    revision: 0,
                })
                .await?;
            for kv in &page.kvs {
                let kek = self.api.key_encryption();
                let opened = kek
                    .open(&kv.value, &kv.key)
                    .map_err(ManagementError::internal)?;
                let Opened::Plain(plain) = opened else {
                    continue;
                };
                let bytes = kek
                    .seal(plain, &kv.key)
                    .map_err(ManagementError::internal)?;
                if let Outcome::Done(_) = self
                    .storage
                    .update(&kv.key, Bytes::from(bytes), kv.mod_revision)
                    .await?
                {
                    sealed += 1;
                }
            }
            match (page.more, page.kvs.last()) {
                (true, Some(last)) => start_key = Some(format!("{}\0", last.key)),
                _ => break,
            }
        }
        if sealed > 0 {
            tracing::warn!(
                sealed,
                "management records were stored unsealed; sealed them"
            );
        }
        Ok(sealed)
    }

    /// Every cluster with its node pools, renewed on every reconciler pass (at least every
    /// two seconds): what this replica's cloud controllers work from.
    pub fn cluster_index(&self) -> tokio::sync::watch::Receiver<Arc<ClusterIndex>> {
        self.index.subscribe()
    }

    /// The serving CA and public URL nodes are told to reach clusters at.
    pub fn public_endpoint(&self) -> &PublicEndpoint {
        &self.endpoint
    }

    /// Replaces a cluster's `health.issues` (what keeps it from working as asked, as whoever
    /// runs it sees it: `flotilla up` reports a `demo` without a node). Writes only on change.
    pub async fn report_cluster_health(
        &self,
        account: &str,
        name: &str,
        issues: Vec<HealthIssue>,
    ) -> Result<()> {
        let (cluster, _) = self.cluster_record(account, name).await?;
        if cluster.health.issues == issues {
            return Ok(());
        }
        self.modify(
            &cluster_key(account, name),
            || ManagementError::not_found(format!("no cluster named {name:?}")),
            |record: &mut Cluster| {
                record.health.issues = issues.clone();
                Ok(())
            },
        )
        .await?;
        Ok(())
    }

    /// Records what the cloud controller saw of a pool: its instances, Ready nodes and
    /// issues, and the status that follows (`DEGRADED` with issues, `ACTIVE` once every
    /// wanted node is Ready, otherwise still `CREATING` / `UPDATING`). A `DELETING` pool
    /// keeps its status. Writes only when something changed.
    pub async fn report_node_pool(
        &self,
        cluster: &Cluster,
        pool: &str,
        report: NodePoolReport,
    ) -> Result<()> {
        let key = pool_key(&cluster.account_id, &cluster.name, pool);
        let Some(kv) = self.storage.get(&key).await? else {
            return Ok(());
        };
        let mut record: NodePool = self.open(&kv)?;
        let before = serde_json::to_value(&record).map_err(ManagementError::internal)?;
        record.instance_ids = report.instance_ids;
        record.ready_nodes = report.ready_nodes;
        record.health.issues = report.issues;
        if record.status != NodePoolStatus::Deleting {
            let desired = record.scaling_config.desired_size;
            if let Some(issue) = record.health.issues.first() {
                record.status = NodePoolStatus::Degraded;
                record.status_reason = Some(format!("{}: {}", issue.code, issue.message));
            } else if record.ready_nodes == desired && record.instance_ids.len() == desired as usize
            {
                record.status = NodePoolStatus::Active;
                record.status_reason = None;
            } else if record.status == NodePoolStatus::Degraded {
                record.status = NodePoolStatus::Updating;
                record.status_reason = None;
            }
        }
        let after = serde_json::to_value(&record).map_err(ManagementError::internal)?;
        if before != after {
            // A concurrent change (a scale) wins; the next pass reports again.
            self.swap(&key, &record, kv.mod_revision).await?;
        }
        Ok(())
    }

    /// Removes a `DELETING` pool's record once the cloud controller has nothing left of it.
    pub async fn forget_node_pool(&self, cluster: &Cluster, pool: &str) -> Result<()> {
        let key = pool_key(&cluster.account_id, &cluster.name, pool);
        self.storage.delete(&key, None).await?;
        self.wake.notify_one();
        Ok(())
    }

    /// Marks a `DELETING` cluster's cloud resources as gone, so the reconciler destroys it.
    pub async fn release_cloud(&self, cluster: &Cluster) -> Result<()> {
        self.modify(
            &cluster_key(&cluster.account_id, &cluster.name),
            || ManagementError::not_found(format!("no cluster named {:?}", cluster.name)),
            |record: &mut Cluster| {
                record.cloud_released = true;
                Ok(())
            },
        )
        .await?;
        Ok(())
    }

    /// The axum router of `/v1/…`; mount it at the root.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/openapi.json", get(openapi_document))
            .route("/v1/version", get(service_version))
            .route("/metrics", get(service_metrics))
            .route("/v1/identity", get(accounts::caller_identity))
            .route(
                "/v1/accounts",
                get(accounts::list_accounts).post(accounts::create_account),
            )
            .route(
                "/v1/accounts/{account}",
                get(accounts::describe_account).delete(accounts::delete_account),
            )
            .route(
                "/v1/accounts/{account}/apikeys",
                axum::routing::post(accounts::create_api_key),
            )
            .route("/v1/clusters", get(list_clusters).post(create_cluster))
            .route(
                "/v1/clusters/{name}",
                get(describe_cluster)
                    .patch(update_cluster)
                    .delete(delete_cluster),
            )
            .route("/v1/clusters/{name}/kubeconfig", get(cluster_kubeconfig))
            .route("/v1/clusters/{name}/backup", get(backup::get_backup))
            .route(
                "/v1/clusters/{name}/restore",
                axum::routing::post(backup::post_restore),
            )
            .route(
                "/v1/clusters/{name}/token",
                axum::routing::post(cluster_token),
            )
            .route(
                "/v1/clusters/{name}/nodepools",
                get(list_node_pools).post(create_node_pool),
            )
            .route(
                "/v1/clusters/{name}/nodepools/{pool}",
                get(describe_node_pool)
                    .patch(update_node_pool)
                    .delete(delete_node_pool),
            )
            .method_not_allowed_fallback(|| async { ManagementError::method_not_allowed() })
            .with_state(self.clone())
    }

    /// A cluster as responses show it: secrets removed, the endpoint's CA and the OIDC issuer
    /// added (EKS's `certificateAuthority.data` and `identity.oidc.issuer`).
    fn present(&self, cluster: Cluster) -> Cluster {
        use base64::Engine;
        let mut cluster = cluster.redacted();
        cluster.certificate_authority = Some(CertificateAuthorityData {
            data: base64::engine::general_purpose::STANDARD.encode(&self.endpoint.ca_pem),
        });
        cluster.arn = Some(format!(
            "arn:flotilla:clusters::{}:cluster/{}",
            cluster.account_id, cluster.name
        ));
        cluster.identity = Some(ClusterIdentity {
            oidc: OidcIdentity {
                issuer: cluster.endpoint.clone(),
            },
        });
        cluster
    }

    /// Registers `token` as an operator credential (idempotent; only its hash is stored).
    pub async fn register_operator_token(&self, token: &str) -> Result<()> {
        if token.len() < 16 {
            return Err(ManagementError::invalid_parameter(
                "the operator token must be at least 16 characters",
            ));
        }
        let _ = self
            .storage
            .create(&operator_key(&sha256_hex(token)), Bytes::from_static(b"{}"))
            .await?;
        Ok(())
    }

    /// The key that seals the console's session cookies: one for the whole service, so every
    /// replica opens the cookies any of them issued; made (sealed, like every record) on
    /// first use.
    pub async fn console_session_key(&self) -> Result<[u8; 32]> {
        use base64::Engine;
        let key = console_session_key_key();
        let stored = match self.storage.get(&key).await? {
            Some(kv) => self.open::<String>(&kv)?,
            None => {
                let fresh: [u8; 32] = rand::rng().random();
                let text = base64::engine::general_purpose::STANDARD.encode(fresh);
                match self.storage.create(&key, self.seal(&key, &text)?).await? {
                    Outcome::Done(_) => text,
                    // Another replica made it first: theirs is the key.
                    Outcome::Conflict(Some(kv)) => self.open::<String>(&kv)?,
                    Outcome::Conflict(None) => {
                        return Err(ManagementError::internal("console key vanished"));
                    }
                }
            }
        };
        base64::engine::general_purpose::STANDARD
            .decode(stored)
            .ok()
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| ManagementError::internal("the console session key is malformed"))
    }

    /// A new random operator token, for a first start.
    pub fn new_operator_token() -> String {
        format!("flo_op_{}", random_lowercase(KEY_LENGTH))
    }

    async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller> {
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(ManagementError::unauthorized)?;
        let hash = sha256_hex(token);
        if let Some(kv) = self.storage.get(&api_key_key(&hash)).await? {
            let issued: IssuedApiKey = self.open(&kv)?;
            return Ok(Caller::Account(issued.account_id));
        }
        if self.storage.get(&operator_key(&hash)).await?.is_some() {
            return Ok(Caller::Operator);
        }
        Err(ManagementError::unauthorized())
    }

    /// Creates account `id` if absent.
    pub async fn ensure_account(&self, id: &str) -> Result<Account> {
        validate_name("account id", id)?;
        let account = Account {
            id: id.to_string(),
            created_at: now(),
        };
        match self
            .storage
            .create(&account_key(id), self.seal(&account_key(id), &account)?)
            .await?
        {
            Outcome::Done(_) => Ok(account),
            Outcome::Conflict(Some(kv)) => self.open(&kv),
            Outcome::Conflict(None) => Err(ManagementError::internal("account vanished")),
        }
    }

    /// A new API key for `account` (which must exist). The key is returned once.
    pub async fn issue_api_key(&self, account: &str) -> Result<IssuedApiKey> {
        if self.storage.get(&account_key(account)).await?.is_none() {
            return Err(ManagementError::not_found(format!(
                "no account {account:?}"
            )));
        }
        let issued = IssuedApiKey {
            account_id: account.to_string(),
            api_key: format!("flo_{}", random_lowercase(KEY_LENGTH)),
        };
        let stored = IssuedApiKey {
            api_key: String::new(),
            ..issued.clone()
        };
        self.storage
            .create(
                &api_key_key(&sha256_hex(&issued.api_key)),
                self.seal(&api_key_key(&sha256_hex(&issued.api_key)), &stored)?,
            )
            .await?;
        Ok(issued)
    }

    async fn cluster_record(&self, account: &str, name: &str) -> Result<(Cluster, i64)> {
        let kv = self
            .storage
            .get(&cluster_key(account, name))
            .await?
            .ok_or_else(|| ManagementError::not_found(format!("no cluster named {name:?}")))?;
        Ok((self.open(&kv)?, kv.mod_revision))
    }

    async fn range_all<T: DeserializeOwned>(&self, prefix: &str) -> Result<Vec<(T, i64)>> {
        self.range_kvs(prefix)
            .await?
            .iter()
            .map(|kv| Ok((self.open(kv)?, kv.mod_revision)))
            .collect()
    }

    /// Every stored record under `prefix`, read page by page (each page at the latest
    /// revision).
    async fn range_kvs(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(range_pages(&*self.storage, prefix, 0, 500).await?)
    }

    /// Claims `token` for a request with this fingerprint. `Ok(true)`: first use, go ahead;
    /// `Ok(false)`: a retry of the same request, answer with the current state.
    async fn claim_token(
        &self,
        account: &str,
        kind: &str,
        token: Option<&str>,
        fingerprint: &impl Serialize,
    ) -> Result<bool> {
        let Some(token) = token else {
            return Ok(true);
        };
        let fingerprint =
            sha256_hex(&serde_json::to_string(fingerprint).map_err(ManagementError::internal)?);
        let record = serde_json::json!({ "fingerprint": fingerprint });
        match self
            .storage
            .create(
                &token_key(account, kind, token),
                self.seal(&token_key(account, kind, token), &record)?,
            )
            .await?
        {
            Outcome::Done(_) => Ok(true),
            Outcome::Conflict(Some(kv)) => {
                let seen: serde_json::Value = self.open(&kv)?;
                if seen["fingerprint"] == fingerprint.as_str() {
                    Ok(false)
                } else {
                    Err(ManagementError::idempotency_mismatch(token))
                }
            }
            Outcome::Conflict(None) => Ok(true),
        }
    }

    /// `CreateCluster`: stores the record as `CREATING`; the reconciler makes it `ACTIVE`.
    pub async fn create_cluster(
        &self,
        account: &str,
        request: CreateClusterRequest,
    ) -> Result<Cluster> {
        self.create_cluster_with_id(account, request, None).await
    }

    /// As [`Management::create_cluster`], with a fixed tenant id instead of a generated one
    /// (`flotilla up`'s `demo` cluster keeps its `/clusters/demo` URL).
    pub async fn create_cluster_with_id(
        &self,
        account: &str,
        request: CreateClusterRequest,
        id: Option<&str>,
    ) -> Result<Cluster> {
        request.validate()?;
        if request.audit_policy.is_some() {
            self.require_audit_backend()?;
        }
        let token = request.client_request_token.clone();
        if !self
            .claim_token(account, "cluster", token.as_deref(), &request)
            .await?
        {
            return Ok(self.cluster_record(account, &request.name).await?.0);
        }
        let id = match id {
            Some(id) => id.to_string(),
            None => format!("{}-{}", request.name, random_lowercase(ID_SUFFIX)),
        };
        let network = NetworkConfig {
            service_ipv4_cidr: Some(
                request
                    .kubernetes_network_config
                    .service_ipv4_cidr
                    .unwrap_or_else(|| "10.96.0.0/12".into()),
            ),
            pod_ipv4_cidr: Some(
                request
                    .kubernetes_network_config
                    .pod_ipv4_cidr
                    .unwrap_or_else(|| "10.244.0.0/16".into()),
            ),
        };
        let cluster = Cluster {
            endpoint: format!("{}/clusters/{id}", self.endpoint.base_url),
            id,
            name: request.name.clone(),
            account_id: account.to_string(),
            version: request
                .version
                .unwrap_or_else(|| SUPPORTED_VERSIONS[0].to_string()),
            status: ClusterStatus::Creating,
            status_reason: None,
            kubernetes_network_config: network,
            endpoint_access: request.endpoint_access,
            pod_security: request.pod_security,
            audit_policy: request.audit_policy,
            tags: request.tags,
            cloud: request.cloud,
            client_request_token: token,
            created_at: now(),
            certificate_authority: None,
            arn: None,
            identity: None,
            health: Health::default(),
            cloud_released: false,
            restored_from: None,
            restoring: false,
        };
        match self
            .storage
            .create(
                &cluster_key(account, &cluster.name),
                self.seal(&cluster_key(account, &cluster.name), &cluster)?,
            )
            .await?
        {
            Outcome::Done(_) => {
                self.wake.notify_one();
                Ok(cluster)
            }
            Outcome::Conflict(_) => Err(ManagementError::in_use(format!(
                "cluster {:?} already exists",
                cluster.name
            ))),
        }
    }

    /// Replaces a stored record by compare-and-swap on the revision it was read at.
    async fn swap<T: Serialize>(&self, key: &str, value: &T, revision: i64) -> Result<bool> {
        Ok(matches!(
            self.storage
                .update(key, self.seal(key, value)?, revision)
                .await?,
            Outcome::Done(_)
        ))
    }

    /// Reads, changes and writes back one record, retrying on a concurrent write.
    async fn modify<T: Serialize + DeserializeOwned>(
        &self,
        key: &str,
        missing: impl Fn() -> ManagementError,
        mut change: impl FnMut(&mut T) -> Result<()>,
    ) -> Result<T> {
        for _ in 0..16 {
            let kv = self.storage.get(key).await?.ok_or_else(&missing)?;
            let mut value: T = self.open(&kv)?;
            change(&mut value)?;
            if self.swap(key, &value, kv.mod_revision).await? {
                self.wake.notify_one();
                return Ok(value);
            }
        }
        Err(ManagementError::unavailable(
            "too many concurrent changes; try again",
        ))
    }

    /// `DeleteCluster`: marks it `DELETING`; the reconciler deletes its node pools, objects
    /// and credentials, then the record.
    pub async fn delete_cluster(&self, account: &str, name: &str) -> Result<Cluster> {
        self.modify(
            &cluster_key(account, name),
            || ManagementError::not_found(format!("no cluster named {name:?}")),
            |cluster: &mut Cluster| {
                cluster.status = ClusterStatus::Deleting;
                Ok(())
            },
        )
        .await
    }

    /// An admin kubeconfig for an `ACTIVE` cluster (a new client certificate each time).
    pub async fn kubeconfig(&self, account: &str, name: &str) -> Result<String> {
        self.user_kubeconfig(account, name, "kubernetes-admin", &["system:masters"])
            .await
    }

    /// A kubeconfig for `user` in `groups` of an `ACTIVE` cluster, with a new client
    /// certificate from the cluster's client CA (the admin's, or a component's such as
    /// `system:kube-proxy`).
    pub async fn user_kubeconfig(
        &self,
        account: &str,
        name: &str,
        user: &str,
        groups: &[&str],
    ) -> Result<String> {
        let (cluster, _) = self.cluster_record(account, name).await?;
        if cluster.status != ClusterStatus::Active {
            return Err(ManagementError::invalid_request(format!(
                "cluster {name:?} is {}{}; a kubeconfig is available once it is ACTIVE",
                cluster.status,
                cluster
                    .status_reason
                    .map(|reason| format!(" ({reason})"))
                    .unwrap_or_default()
            )));
        }
        let tenant = self
            .api
            .tenants
            .get(&cluster.id)
            .await?
            .ok_or_else(|| ManagementError::internal("the cluster's tenant is missing"))?;
        let certificate = tenant.issue_client(user, groups)?;
        Ok(flotilla_apiserver::pki::kubeconfig(
            &cluster.name,
            &cluster.endpoint,
            &self.endpoint.ca_pem,
            user,
            &certificate,
        ))
    }

    /// A 15-minute admin bearer token for an `ACTIVE` cluster (as `aws eks get-token`).
    pub async fn admin_token(&self, account: &str, name: &str) -> Result<(String, String)> {
        let cluster = self.require_active_cluster(account, name).await?;
        let tenant = self
            .api
            .tenants
            .get(&cluster.id)
            .await?
            .ok_or_else(|| ManagementError::internal("the cluster's tenant is missing"))?;
        let (token, expires) = tenant.issue_admin_token(ADMIN_TOKEN_SECONDS)?;
        let expires = chrono::DateTime::from_timestamp(expires, 0)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        Ok((token, expires))
    }

    async fn require_active_cluster(&self, account: &str, name: &str) -> Result<Cluster> {
        let (cluster, _) = self.cluster_record(account, name).await?;
        match cluster.status {
            ClusterStatus::Active => Ok(cluster),
            status => Err(ManagementError::invalid_request(format!(
                "cluster {name:?} is {status}; it must be ACTIVE for this"
            ))),
        }
    }

    /// `CreateNodegroup`.
    pub async fn create_node_pool(
        &self,
        account: &str,
        cluster: &str,
        mut request: CreateNodePoolRequest,
    ) -> Result<NodePool> {
        request.validate()?;
        let cluster = self.require_active_cluster(account, cluster).await?;
        if !self
            .claim_token(
                account,
                &format!("nodepool/{}", cluster.name),
                request.client_request_token.as_deref(),
                &request,
            )
            .await?
        {
            return self.node_pool(account, &cluster.name, &request.name).await;
        }
        if request.instance_types.is_empty() {
            request.instance_types = vec!["t3.medium".into()];
        }
        if request.subnets.is_empty() {
            request.subnets = cluster.cloud.subnet_ids.clone();
        }
        let pool = NodePool {
            name: request.name,
            cluster_name: cluster.name.clone(),
            instance_types: request.instance_types,
            image_id: request.image_id,
            scaling_config: request.scaling_config,
            labels: request.labels,
            taints: request.taints,
            subnets: request.subnets,
            status: NodePoolStatus::Creating,
            status_reason: None,
            instance_ids: Vec::new(),
            ready_nodes: 0,
            health: Health::default(),
            client_request_token: request.client_request_token,
            created_at: now(),
        };
        match self
            .storage
            .create(
                &pool_key(account, &cluster.name, &pool.name),
                self.seal(&pool_key(account, &cluster.name, &pool.name), &pool)?,
            )
            .await?
        {
            Outcome::Done(_) => {
                self.wake.notify_one();
                Ok(pool)
            }
            Outcome::Conflict(_) => Err(ManagementError::in_use(format!(
                "node pool {:?} already exists in cluster {:?}",
                pool.name, cluster.name
            ))),
        }
    }

    async fn node_pool(&self, account: &str, cluster: &str, pool: &str) -> Result<NodePool> {
        // The cluster must be visible to this account first: its absence is the better 404.
        self.cluster_record(account, cluster).await?;
        let kv = self
            .storage
            .get(&pool_key(account, cluster, pool))
            .await?
            .ok_or_else(|| pool_not_found(pool, cluster))?;
        self.open(&kv)
    }

    /// The reconciler: level-based, so a missed nudge or a crashed replica only delays it. It
    /// runs a pass when nudged (a record changed, on any replica) or when its resync is due.
    pub fn spawn_reconciler(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        let passes = async move {
            loop {
                let settled = match this.reconcile_pass().await {
                    Ok(settled) => settled,
                    Err(err) => {
                        tracing::warn!(%err, "management reconcile failed; retrying");
                        false
                    }
                };
                let resync = if settled { SETTLED_RESYNC } else { RESYNC };
                let _ = tokio::time::timeout(resync, this.wake.notified()).await;
            }
        };
        let this = self.clone();
        // Joined, so aborting the reconciler stops its watch too.
        tokio::spawn(async move {
            futures::future::join(passes, this.nudge_on_record_changes()).await;
        })
    }

    /// Nudges the reconciler whenever a management record changes. A watch that fails is
    /// started again after a second, with a nudge for what it may have missed.
    async fn nudge_on_record_changes(&self) {
        loop {
            match self.storage.watch(ROOT, 0).await {
                Ok(mut changes) => {
                    // A change made before the watch began may have missed the last pass.
                    self.wake.notify_one();
                    while let Some(change) = changes.next().await {
                        if change.is_err() {
                            break;
                        }
                        self.wake.notify_one();
                    }
                }
                Err(err) => tracing::debug!(%err, "watching the management records"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.wake.notify_one();
        }
    }

    /// One pass over every cluster and node pool, as the reconciler runs it.
    pub async fn reconcile_all(&self) -> Result<()> {
        self.reconcile_pass().await.map(|_| ())
    }

    /// One pass over every cluster and node pool: two range reads per account; only records
    /// in a transitional state cause writes. `true` when every record it read was settled.
    async fn reconcile_pass(&self) -> Result<bool> {
        {
            let mut applied = self.applied();
            if applied.since.elapsed() >= SETTLED_RESYNC {
                *applied = Applied::new();
            }
        }
        let accounts: Vec<(Account, i64)> = self.range_all(&accounts_prefix()).await?;
        let mut index = ClusterIndex::new();
        let mut settled = true;
        for (account, _) in accounts {
            let clusters: Vec<(Cluster, i64)> =
                self.range_all(&clusters_prefix(&account.id)).await?;
            let mut pools: Vec<(NodePool, i64)> =
                self.range_all(&account_pools_prefix(&account.id)).await?;
            for (cluster, revision) in clusters {
                settled &= matches!(
                    cluster.status,
                    ClusterStatus::Active | ClusterStatus::Failed
                );
                let (own, others): (Vec<_>, Vec<_>) = pools
                    .into_iter()
                    .partition(|(pool, _)| pool.cluster_name == cluster.name);
                pools = others;
                settled &= own.iter().all(|(pool, _)| {
                    !matches!(
                        pool.status,
                        NodePoolStatus::Creating
                            | NodePoolStatus::Updating
                            | NodePoolStatus::Deleting
                    )
                });
                index.insert(
                    cluster.id.clone(),
                    ManagedCluster {
                        cluster: cluster.clone(),
                        pools: own.iter().map(|(pool, _)| pool.clone()).collect(),
                        revisions: std::iter::once(revision)
                            .chain(own.iter().map(|(_, revision)| *revision))
                            .collect(),
                    },
                );
                if let Err(err) = self.reconcile_cluster(cluster.clone(), revision, own).await {
                    tracing::warn!(cluster = %cluster.id, %err, "cluster reconcile failed");
                }
            }
        }
        self.applied()
            .revisions
            .retain(|id, _| index.contains_key(id));
        // Every cluster's loops watch the index: it wakes them only when a record changed,
        // not on every pass.
        self.index.send_if_modified(|current| {
            let unchanged = current.len() == index.len()
                && index.iter().all(|(id, managed)| {
                    current
                        .get(id)
                        .is_some_and(|seen| seen.revisions == managed.revisions)
                });
            if !unchanged {
                *current = Arc::new(index);
            }
            !unchanged
        });
        Ok(settled)
    }

    async fn reconcile_cluster(
        &self,
        mut cluster: Cluster,
        revision: i64,
        pools: Vec<(NodePool, i64)>,
    ) -> Result<()> {
        let key = cluster_key(&cluster.account_id, &cluster.name);
        match cluster.status {
            // A restore is writing it: its objects come from the backup, not the bootstrap.
            ClusterStatus::Creating if cluster.restoring => {
                if creation_expired(&cluster) {
                    cluster.status = ClusterStatus::Failed;
                    cluster.status_reason = Some(
                        "the restore did not finish (the replica writing it stopped); delete the cluster and restore it again"
                            .into(),
                    );
                    self.swap(&key, &cluster, revision).await?;
                }
            }
            ClusterStatus::Creating => {
                match self.api.tenants.ensure(&self.api, &cluster.id).await {
                    Ok(_) => {
                        self.apply_endpoint_access(&cluster).await?;
                        self.apply_pod_security(&cluster).await?;
                        self.apply_audit_policy(&cluster).await?;
                        cluster.status = ClusterStatus::Active;
                        cluster.status_reason = None;
                    }
                    // Another replica bootstrapping the same tenant, or storage trouble:
                    // try again on the next pass, until the deadline makes it final.
                    Err(err) if !creation_expired(&cluster) => {
                        tracing::info!(cluster = %cluster.id, err = %err.message, "cluster setup will be retried");
                        cluster.status_reason = Some(format!("retrying: {}", err.message));
                    }
                    Err(err) => {
                        cluster.status = ClusterStatus::Failed;
                        cluster.status_reason = Some(err.message);
                    }
                }
                self.swap(&key, &cluster, revision).await?;
            }
            ClusterStatus::Active => {
                let given = self.applied().revisions.get(&cluster.id) == Some(&revision);
                if !given {
                    self.apply_endpoint_access(&cluster).await?;
                    self.apply_pod_security(&cluster).await?;
                    self.apply_audit_policy(&cluster).await?;
                    self.applied()
                        .revisions
                        .insert(cluster.id.clone(), revision);
                }
                self.reconcile_node_pools(&cluster, pools, false).await?
            }
            ClusterStatus::Deleting => {
                // A restore that stopped before it wrote the tenant never ran a cloud
                // controller: there is nothing in the cloud to wait for.
                if cluster.restoring && !self.restore_reached_tenant(&cluster).await? {
                    cluster.cloud = CloudConfig::default();
                }
                let pools_left = !pools.is_empty();
                self.reconcile_node_pools(&cluster, pools, true).await?;
                // With a cloud, the cloud controller (running on the tenant's API) first
                // removes what it created; the tenant stays until it says so.
                if cluster.has_cloud() && (pools_left || !cluster.cloud_released) {
                    return Ok(());
                }
                // A restore that never finished destroys nothing another restore holds.
                if self.owns_tenant(&cluster).await? {
                    self.api.tenants.destroy(&cluster.id).await?;
                    self.release_restore_claim(&cluster).await?;
                }
                self.storage.delete(&key, Some(revision)).await?;
                tracing::info!(cluster = %cluster.id, "cluster deleted");
            }
            ClusterStatus::Failed => {}
        }
        Ok(())
    }

    /// Gives the cluster's API the cluster's `endpointAccess`, when it has another.
    async fn apply_endpoint_access(&self, cluster: &Cluster) -> Result<()> {
        let wanted = flotilla_apiserver::endpoint_access::EndpointAccess {
            public: cluster.endpoint_access.public,
            private: cluster.endpoint_access.private,
            public_access_cidrs: cluster.endpoint_access.public_access_cidrs.clone(),
        };
        let current = self.api.tenants.get(&cluster.id).await?;
        if current.is_some_and(|state| state.record.endpoint_access == wanted) {
            return Ok(());
        }
        self.api
            .tenants
            .set_endpoint_access(&cluster.id, &wanted)
            .await
            .map_err(|err| ManagementError::internal(err.message))
    }

    /// Gives the cluster's API the cluster's `podSecurity`, when it has another.
    async fn apply_pod_security(&self, cluster: &Cluster) -> Result<()> {
        let current = self.api.tenants.get(&cluster.id).await?;
        if current.is_some_and(|state| state.record.pod_security == cluster.pod_security) {
            return Ok(());
        }
        self.api
            .tenants
            .set_pod_security(&cluster.id, &cluster.pod_security)
            .await
            .map_err(|err| ManagementError::internal(err.message))
    }

    /// Gives the cluster's API the cluster's `auditPolicy`, when it has another.
    async fn apply_audit_policy(&self, cluster: &Cluster) -> Result<()> {
        let current = self.api.tenants.get(&cluster.id).await?;
        if current.is_some_and(|state| state.record.audit_policy == cluster.audit_policy) {
            return Ok(());
        }
        self.api
            .tenants
            .set_audit_policy(&cluster.id, cluster.audit_policy.as_ref())
            .await
            .map_err(|err| ManagementError::internal(err.message))
    }

    /// A cluster's own audit policy needs somewhere to record to.
    fn require_audit_backend(&self) -> Result<()> {
        if self.api.audit().has_backend() {
            return Ok(());
        }
        Err(ManagementError::invalid_parameter(
            "auditPolicy: this service records no audit events (its operator starts it without \
             --audit-log-path or --audit-webhook-config-file)",
        ))
    }

    /// Without a cloud, node pools are records only: `ACTIVE` once recorded, removed when
    /// deleted. With one, the cloud controller reports their status and removes deleted ones
    /// once their instances are gone; here a deleted cluster only marks them `DELETING`.
    async fn reconcile_node_pools(
        &self,
        cluster: &Cluster,
        pools: Vec<(NodePool, i64)>,
        cluster_deleting: bool,
    ) -> Result<()> {
        for (mut pool, revision) in pools {
            let key = pool_key(&cluster.account_id, &cluster.name, &pool.name);
            if cluster.has_cloud() {
                if cluster_deleting && pool.status != NodePoolStatus::Deleting {
                    pool.status = NodePoolStatus::Deleting;
                    self.swap(&key, &pool, revision).await?;
                }
            } else if cluster_deleting || pool.status == NodePoolStatus::Deleting {
                self.storage.delete(&key, None).await?;
            } else if matches!(
                pool.status,
                NodePoolStatus::Creating | NodePoolStatus::Updating
            ) {
                pool.status = NodePoolStatus::Active;
                self.swap(&key, &pool, revision).await?;
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP handlers: authenticate, parse, call the service, answer JSON.

type Service = State<Arc<Management>>;

/// Every key under `prefix`, `page` keys per read, each read at `revision` (0: the latest).
async fn range_pages(
    storage: &dyn Storage,
    prefix: &str,
    revision: i64,
    page: usize,
) -> std::result::Result<Vec<KeyValue>, flotilla_storage::StorageError> {
    let mut out = Vec::new();
    let mut start_key = None;
    loop {
        let read = storage
            .range(RangeRequest {
                prefix: prefix.to_string(),
                start_key: start_key.take(),
                limit: page,
                revision,
            })
            .await?;
        let next = match (read.more, read.kvs.last()) {
            (true, Some(last)) => Some(format!("{}\0", last.key)),
            _ => None,
        };
        out.extend(read.kvs);
        match next {
            Some(key) => start_key = Some(key),
            None => return Ok(out),
        }
    }
}

fn json(status: StatusCode, value: &impl Serialize) -> Response {
    (status, axum::Json(value)).into_response()
}

/// `{"cluster": …}` as responses show a cluster.
fn cluster_answer(m: &Management, cluster: Cluster) -> Response {
    json(
        StatusCode::OK,
        &serde_json::json!({ "cluster": m.present(cluster) }),
    )
}

async fn openapi_document() -> Response {
    json(StatusCode::OK, &*openapi::DOCUMENT)
}

/// The service's version and the Kubernetes version its clusters speak: public, as upstream's
/// `/version` is, so a client can report it before it has a credential.
async fn service_version() -> Response {
    json(StatusCode::OK, &service_version_document())
}

/// What `GET /v1/version` answers.
pub fn service_version_document() -> serde_json::Value {
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "kubernetes": flotilla_apiserver::discovery::version(),
    })
}

/// The whole service's request metrics (every tenant's counts): the operator's only.
async fn service_metrics(State(m): Service, headers: HeaderMap) -> Result<Response> {
    if m.authenticate(&headers).await? != Caller::Operator {
        return Err(ManagementError::access_denied(
            "only the operator reads the service's metrics",
        ));
    }
    Ok((
        StatusCode::OK,
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m.api.render_metrics(),
    )
        .into_response())
}

async fn list_clusters(State(m): Service, headers: HeaderMap) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let clusters: Vec<Cluster> = m
        .range_all(&clusters_prefix(caller.account()?))
        .await?
        .into_iter()
        .map(|(c, _): (Cluster, i64)| m.present(c))
        .collect();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "clusters": clusters }),
    ))
}

async fn create_cluster(State(m): Service, headers: HeaderMap, body: Bytes) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let request: CreateClusterRequest = parse_body(&body)?;
    let cluster = m.create_cluster(caller.account()?, request).await?;
    Ok(cluster_answer(&m, cluster))
}

async fn describe_cluster(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let (cluster, _) = m.cluster_record(caller.account()?, &name).await?;
    Ok(cluster_answer(&m, cluster))
}

async fn update_cluster(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let request: UpdateClusterRequest = parse_body(&body)?;
    if let Some(access) = &request.endpoint_access {
        access.validate()?;
    }
    if let Some(config) = &request.pod_security {
        validate_pod_security(config)?;
    }
    if let Some(Some(policy)) = &request.audit_policy {
        validate_audit_policy(policy)?;
        m.require_audit_backend()?;
    }
    let cluster = m
        .modify(
            &cluster_key(caller.account()?, &name),
            || ManagementError::not_found(format!("no cluster named {name:?}")),
            |cluster: &mut Cluster| {
                if cluster.status != ClusterStatus::Active {
                    return Err(ManagementError::invalid_request(format!(
                        "cluster {name:?} is {}; it can be updated once it is ACTIVE",
                        cluster.status
                    )));
                }
                if let Some(access) = &request.endpoint_access {
                    cluster.endpoint_access = access.clone();
                }
                if let Some(config) = &request.pod_security {
                    cluster.pod_security = config.clone();
                }
                if let Some(policy) = &request.audit_policy {
                    cluster.audit_policy = policy.clone();
                }
                for (key, value) in request.tags.iter().flatten() {
                    match value {
                        Some(value) => cluster.tags.insert(key.clone(), value.clone()),
                        None => cluster.tags.remove(key),
                    };
                }
                validate_tags(&cluster.tags)
            },
        )
        .await?;
    // Applied here at once; other replicas read it within a second.
    if cluster.status == ClusterStatus::Active {
        m.apply_endpoint_access(&cluster).await?;
        m.apply_pod_security(&cluster).await?;
    }
    Ok(cluster_answer(&m, cluster))
}

async fn delete_cluster(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let cluster = m.delete_cluster(caller.account()?, &name).await?;
    Ok(cluster_answer(&m, cluster))
}

async fn cluster_kubeconfig(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let config = m.kubeconfig(caller.account()?, &name).await?;
    Ok((
        StatusCode::OK,
        [(http::header::CONTENT_TYPE, "application/yaml")],
        config,
    )
        .into_response())
}

async fn cluster_token(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let (token, expires) = m.admin_token(caller.account()?, &name).await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "token": token, "expirationTimestamp": expires }),
    ))
}

async fn list_node_pools(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let account = caller.account()?;
    m.cluster_record(account, &name).await?;
    let pools: Vec<NodePool> = m
        .range_all(&pools_prefix(account, &name))
        .await?
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "nodePools": pools }),
    ))
}

async fn create_node_pool(
    State(m): Service,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let request: CreateNodePoolRequest = parse_body(&body)?;
    let pool = m
        .create_node_pool(caller.account()?, &name, request)
        .await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "nodePool": pool }),
    ))
}

async fn describe_node_pool(
    State(m): Service,
    Path((name, pool)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let pool = m.node_pool(caller.account()?, &name, &pool).await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "nodePool": pool }),
    ))
}

async fn update_node_pool(
    State(m): Service,
    Path((name, pool)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let account = caller.account()?;
    let request: UpdateNodePoolRequest = parse_body(&body)?;
    if let Some(scaling) = &request.scaling_config {
        scaling.validate()?;
    }
    if let Some(labels) = &request.labels {
        validate_labels(labels)?;
    }
    if let Some(taints) = &request.taints {
        validate_taints(taints)?;
    }
    m.require_active_cluster(account, &name).await?;
    let updated = m
        .modify(
            &pool_key(account, &name, &pool),
            || pool_not_found(&pool, &name),
            |record: &mut NodePool| {
                if record.status == NodePoolStatus::Deleting {
                    return Err(ManagementError::invalid_request(format!(
                        "node pool {pool:?} is being deleted"
                    )));
                }
                if let Some(scaling) = request.scaling_config {
                    record.scaling_config = scaling;
                }
                if let Some(labels) = &request.labels {
                    record.labels = labels.clone();
                }
                if let Some(taints) = &request.taints {
                    record.taints = taints.clone();
                }
                record.status = NodePoolStatus::Updating;
                Ok(())
            },
        )
        .await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "nodePool": updated }),
    ))
}

async fn delete_node_pool(
    State(m): Service,
    Path((name, pool)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response> {
    let caller = m.authenticate(&headers).await?;
    let account = caller.account()?;
    m.cluster_record(account, &name).await?;
    let deleted = m
        .modify(
            &pool_key(account, &name, &pool),
            || pool_not_found(&pool, &name),
            |record: &mut NodePool| {
                record.status = NodePoolStatus::Deleting;
                Ok(())
            },
        )
        .await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "nodePool": deleted }),
    ))
}
