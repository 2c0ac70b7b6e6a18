//! The generic registry: create, get, list, update, patch, delete and watch for every kind,
//! over [`Storage`], running each kind's [`Strategy`] in kube-apiserver's fixed order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flotilla_api_machinery::continue_token;
use flotilla_storage::{KeyValue, Outcome, RangeRequest, Revision, Storage, StorageError};
use serde_json::{Value, json};

use crate::error::{ApiError, FieldError, Path};
use crate::limits::StoredBytes;
use crate::meta;
use crate::resources::ResourceInfo;
use crate::selection::Selection;
use crate::storage::cacher::WatchCaches;

/// How many generated names a create tries before giving up.
const GENERATE_NAME_ATTEMPTS: usize = 8;

/// How long a read waits for the store, or a watch cache, to reach the revision it asks for
/// (upstream's `blockTimeout`) before it is refused or served by the store.
const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// How long a namespace read as Active is trusted by creates in it.
const NAMESPACE_CACHE_TTL: Duration = Duration::from_secs(1);

/// How many times an optimistic update is retried on a write race before giving up
/// (kube-apiserver's `GuaranteedUpdate` retries until success; we bound it).
const MAX_UPDATE_ATTEMPTS: usize = 16;

/// Where one tenant cluster's objects live in storage.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// The cluster id from the URL (`/clusters/{id}`).
    pub id: String,
    /// Storage key prefix, ending with `/`; every key of the tenant starts with it.
    pub key_prefix: String,
    /// How many bytes its keys hold, and how many they may.
    pub stored_bytes: Arc<StoredBytes>,
}

impl Tenant {
    /// The tenant with id `id`, stored under `/registry/{id}/`, without a byte quota.
    pub fn new(id: &str) -> Self {
        Self::with_byte_quota(id, None)
    }

    /// The tenant with id `id`, whose keys may hold at most `max_bytes` together.
    pub fn with_byte_quota(id: &str, max_bytes: Option<u64>) -> Self {
        Tenant {
            id: id.to_string(),
            key_prefix: format!("/registry/{id}/"),
            stored_bytes: Arc::new(StoredBytes::new(max_bytes)),
        }
    }

    fn resource_prefix(&self, resource: &ResourceInfo) -> String {
        let group = if resource.group.is_empty() {
            "core"
        } else {
            &resource.group
        };
        format!("{}{group}/{}/", self.key_prefix, resource.plural)
    }

    /// The prefix of every object of `resource` in `namespace` (all namespaces when `None`).
    pub fn list_prefix(&self, resource: &ResourceInfo, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if resource.namespaced => format!("{}{ns}/", self.resource_prefix(resource)),
            _ => self.resource_prefix(resource),
        }
    }

    /// The key of one object.
    pub fn object_key(&self, resource: &ResourceInfo, namespace: &str, name: &str) -> String {
        if resource.namespaced {
            format!("{}{namespace}/{name}", self.resource_prefix(resource))
        } else {
            format!("{}{name}", self.resource_prefix(resource))
        }
    }
}

/// `fieldValidation`: what to do with fields the type does not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and warn (the default since 1.27 for non-kubectl clients).
    #[default]
    Warn,
    /// Reject the request.
    Strict,
}

/// Options shared by every write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: run everything, store nothing.
    pub dry_run: bool,
    /// `fieldValidation`.
    pub field_validation: FieldValidation,
    /// `fieldManager` (defaulted from the user agent by the handler).
    pub field_manager: String,
    /// The write is a server-side apply, whose ownership is already computed.
    pub apply: bool,
    /// Who writes (the request context's user), for strategies that record it; `None` for
    /// the server's own writes.
    pub user: Option<flotilla_api_machinery::rbac::UserInfo>,
}

/// `resourceVersion` + `resourceVersionMatch` of a get or list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAt {
    /// Unset: the most recent state (a quorum read).
    #[default]
    Latest,
    /// `"0"` or NotOlderThan: any state at least this new (0: any).
    NotOlderThan(Revision),
    /// `resourceVersionMatch=Exact`: exactly this revision.
    Exact(Revision),
}

/// List request options (default: everything, latest).
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// Which revision to read.
    pub read_at: ReadAt,
    /// Label and field selectors.
    pub selection: Selection,
    /// Page size; 0 for all.
    pub limit: usize,
    /// The `continue` token of the previous page.
    pub continue_token: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// The objects, in key order.
    pub items: Vec<Value>,
    /// The revision the list was read at.
    pub revision: Revision,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// Objects left after this page (only without selectors, as upstream).
    pub remaining_item_count: Option<i64>,
}

/// The revision a continue token carries to mean "resume at the latest state".
const LATEST_CONTINUE: Revision = continue_token::LATEST;

/// The token of a list of `prefix` at `revision` that goes on from the key `next_start`.
fn continue_after(prefix: &str, next_start: &str, revision: Revision) -> String {
    encode_continue(revision, next_start.strip_prefix(prefix).unwrap_or(""))
}

fn encode_continue(revision: Revision, next_key_suffix: &str) -> String {
    continue_token::encode(revision, next_key_suffix)
}

fn decode_continue(token: &str) -> Result<continue_token::ContinueToken, ApiError> {
    continue_token::decode(token)
        .map_err(|why| ApiError::bad_request(format!("invalid continue token: {why}")))
}

fn parse_revision(value: &str) -> Result<Revision, ApiError> {
    value
        .parse::<Revision>()
        .ok()
        .filter(|r| *r >= 0)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "Invalid value: {value:?}: resourceVersion must be a non-negative integer"
            ))
        })
}

/// `ValidateListOptions` failures: 422 `ListOptions.meta.k8s.io "" is invalid: …`.
fn invalid_list_options(error: FieldError) -> ApiError {
    ApiError::invalid("meta.k8s.io", "ListOptions", "", vec![error])
}

impl ReadAt {
    /// Interprets `resourceVersion` and `resourceVersionMatch` as kube-apiserver does.
    pub fn parse(resource_version: Option<&str>, matching: Option<&str>) -> Result<Self, ApiError> {
        match (
            resource_version.filter(|v| !v.is_empty()),
            matching.filter(|m| !m.is_empty()),
        ) {
            (None, None) => Ok(ReadAt::Latest),
            (None, Some(_)) => Err(invalid_list_options(FieldError::forbidden(
                &Path::new("resourceVersionMatch"),
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ))),
            (Some(rv), None | Some("NotOlderThan")) => {
                Ok(ReadAt::NotOlderThan(parse_revision(rv)?))
            }
            (Some(rv), Some("Exact")) => {
                let revision = parse_revision(rv)?;
                if revision == 0 {
                    return Err(invalid_list_options(FieldError::forbidden(
                        &Path::new("resourceVersionMatch"),
                        "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    )));
                }
                Ok(ReadAt::Exact(revision))
            }
            (Some(_), Some(other)) => Err(invalid_list_options(FieldError::not_supported(
                &Path::new("resourceVersionMatch"),
                json!(other),
                &["Exact", "NotOlderThan", ""],
            ))),
        }
    }
}

/// Decodes `kvs` in order into `items`, keeping those `selection` matches, until `items` holds
/// `limit` (0: no limit); returns how many of `kvs` were taken. In-place conversion (every
/// built-in kind) decodes each object as served before judging it; a webhook converts the kept
/// objects in one call, judged as stored.
async fn take_matching(
    kvs: &[KeyValue],
    resource: &ResourceInfo,
    selection: &Selection,
    limit: usize,
    items: &mut Vec<Value>,
) -> Result<usize, ApiError> {
    let start = items.len();
    let filtering = !selection.is_everything();
    let raw_filter = selection.raw_filter();
    let mut taken = 0;
    for kv in kvs {
        if limit > 0 && items.len() >= limit {
            break;
        }
        taken += 1;
        if !raw_filter.may_match(&kv.value) {
            continue;
        }
        let obj = if resource.converts_in_place() {
            decode_as(kv, resource).await?
        } else {
            decode(kv)?
        };
        if !filtering || selection.matches(&obj, resource) {
            items.push(obj);
        }
    }
    if !resource.converts_in_place() {
        resource
            .convert_all(&mut items[start..], &resource.api_version())
            .await?;
    }
    Ok(taken)
}

/// Decodes a stored object and stamps its `resourceVersion` from the key's revision.
pub fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    let mut obj: Value = serde_json::from_slice(&kv.value)
        .map_err(|e| ApiError::internal(format!("stored object {} is not JSON: {e}", kv.key)))?;
    if let Some(metadata) = meta::metadata_mut(&mut obj) {
        // In ObjectMeta's place (after the name, namespace and uid), so that the object stays
        // in the order it was stored in, which answers are written in.
        let before = metadata
            .keys()
            .take_while(|key| {
                matches!(
                    key.as_str(),
                    "name" | "generateName" | "namespace" | "selfLink" | "uid"
                )
            })
            .count();
        metadata.shift_insert(
            before,
            "resourceVersion".into(),
            json!(kv.mod_revision.to_string()),
        );
    }
    Ok(obj)
}

/// [`decode`] in the version `resource` serves (a custom resource may be stored at another).
async fn decode_as(kv: &KeyValue, resource: &ResourceInfo) -> Result<Value, ApiError> {
    resource.served(decode(kv)?).await
}

/// etcd's default `--max-request-bytes` (1.5 MiB): no stored object may be larger, on
/// either backend, so an object that fits one fits the other.
pub const MAX_STORED_OBJECT_BYTES: usize = 1536 * 1024;

fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    // The resourceVersion is the key's revision, never stored bytes (as upstream); the object
    // is copied only when it carries one to drop.
    // Stored in the order upstream writes the kind's JSON, so that answers read back from
    // the store are in order already.
    let bytes = if obj.pointer("/metadata/resourceVersion").is_none() {
        serde_json::to_vec(&flotilla_protobuf::GoJson::stored(obj))
    } else {
        let mut obj = obj.clone();
        meta::remove_at(&mut obj, &["metadata", "resourceVersion"]);
        serde_json::to_vec(&flotilla_protobuf::GoJson::stored(&obj))
    }
    .map_err(ApiError::internal)?;
    if bytes.len() > MAX_STORED_OBJECT_BYTES {
        // What kube-apiserver answers when etcd refuses the write (its error passed through
        // as a reasonless 500).
        return Err(ApiError::unknown("etcdserver: request is too large"));
    }
    Ok(Bytes::from(bytes))
}

/// Paths of fields in `input` that are not in `canonical` (the typed round trip): the
/// unknown fields of `fieldValidation`, in upstream's `.spec.foo` form.
pub fn unknown_fields(input: &Value, canonical: &Value) -> Vec<String> {
    fn walk(input: &Value, canonical: &Value, path: &str, out: &mut Vec<String>) {
        match (input, canonical) {
            (Value::Object(i), Value::Object(c)) => {
                for (key, value) in i {
                    let child = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    match c.get(key) {
                        Some(cv) => walk(value, cv, &child, out),
                        None if !value.is_null() => out.push(child),
                        None => {}
                    }
                }
            }
            (Value::Array(i), Value::Array(c)) => {
                for (index, (iv, cv)) in i.iter().zip(c).enumerate() {
                    walk(iv, cv, &format!("{path}[{index}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(input, canonical, "", &mut out);
    out
}

/// What a write decided, for the handler to render.
pub struct Written {
    /// The object as stored (or as it would be, on a dry run).
    pub object: Value,
    /// `Warning` headers to send (unknown fields under `fieldValidation=Warn`).
    pub warnings: Vec<String>,
}

/// The generic store over one storage backend.
#[derive(Clone)]
pub struct Store {
    storage: Arc<dyn Storage>,
    /// Namespace keys recently read as Active, and when. NamespaceLifecycle admission trusts
    /// its informer the same way: a create need not read its namespace every time. Writes to a
    /// namespace through this process forget it at once; another replica's delete is seen
    /// within [`NAMESPACE_CACHE_TTL`].
    active_namespaces: Arc<std::sync::Mutex<HashMap<String, Instant>>>,
    /// Every resource's watch cache: lists of `resourceVersion=0`, consistent lists and
    /// watches are served from them.
    caches: WatchCaches,
    /// A revision the store is known to have reached (it answered with it, or a list was
    /// served at it): a watch or list from a revision at or below it need not ask the store.
    reached: Arc<std::sync::atomic::AtomicI64>,
}

impl Store {
    /// A store over `storage`.
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        Store {
            caches: WatchCaches::new(Arc::clone(&storage)),
            storage,
            active_namespaces: Arc::default(),
            reached: Arc::default(),
        }
    }

    /// Admits a write that changes `tenant`'s stored size by `delta` bytes (its byte quota).
    async fn charge<'t>(
        &self,
        tenant: &'t Tenant,
        resource: &ResourceInfo,
        name: &str,
        delta: i64,
    ) -> Result<crate::limits::Charge<'t>, ApiError> {
        tenant
            .stored_bytes
            .charge(
                &self.storage,
                &tenant.key_prefix,
                delta,
                &resource.group_resource(),
                name,
            )
            .await
    }

    /// Notes that the store has reached `revision`.
    fn note_reached(&self, revision: Revision) {
        self.reached
            .fetch_max(revision, std::sync::atomic::Ordering::Relaxed);
    }

    /// The watch caches.
    pub fn caches(&self) -> &WatchCaches {
        &self.caches
    }

    fn namespace_known_active(&self, key: &str) -> bool {
        self.active_namespaces
            .lock()
            .ok()
            .and_then(|cache| {
                cache
                    .get(key)
                    .map(|seen| seen.elapsed() < NAMESPACE_CACHE_TTL)
            })
            .unwrap_or(false)
    }

    fn remember_namespace(&self, key: &str, active: bool) {
        if let Ok(mut cache) = self.active_namespaces.lock() {
            if active {
                cache.insert(key.to_string(), Instant::now());
            } else {
                cache.remove(key);
            }
        }
    }

    /// The backend, for watches and compaction.
    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// Canonicalises through the kind's type and applies `fieldValidation`.
    fn canonicalize(
        &self,
        resource: &ResourceInfo,
        obj: Value,
        validation: FieldValidation,
        warnings: &mut Vec<String>,
    ) -> Result<Value, ApiError> {
        let canonical = resource.canonicalize(&obj).map_err(|e| {
            ApiError::bad_request(format!(
                "{} in version \"{}\" cannot be handled as a {}: {e}",
                resource.kind, resource.version, resource.kind
            ))
        })?;
        let unknown = unknown_fields(&obj, &canonical);
        if !unknown.is_empty() {
            match validation {
                FieldValidation::Strict => {
                    let listed: Vec<String> = unknown
                        .iter()
                        .map(|f| format!("unknown field \"{f}\""))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "strict decoding error: {}",
                        listed.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|f| format!("unknown field \"{f}\"")))
                }
                FieldValidation::Ignore => {}
            }
        }
        Ok(canonical)
    }

    /// NamespaceLifecycle's rule ([`crate::admission::namespace_lifecycle::check_create`]) on
    /// a create of `resource`'s `name` in `namespace`, reading the namespace unless it was
    /// seen active within [`NAMESPACE_CACHE_TTL`].
    pub async fn check_namespace_open(
        &self,
        tenant: &Tenant,
        namespaces: &ResourceInfo,
        resource: &ResourceInfo,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let key = tenant.object_key(namespaces, "", namespace);
        if self.namespace_known_active(&key) {
            return Ok(());
        }
        let stored = match self.storage.get(&key).await? {
            Some(kv) => Some(decode(&kv)?),
            None => None,
        };
        if let Some(ns) = &stored {
            self.remember_namespace(&key, !meta::is_terminating(ns));
        }
        crate::admission::namespace_lifecycle::check_create(
            &namespaces.group_resource(),
            &resource.group_resource(),
            namespace,
            name,
            stored.as_ref(),
        )
    }

    /// `Create`: POST of a new object into `namespace` ("" for cluster-scoped kinds).
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespaces: &ResourceInfo,
        namespace: &str,
        mut obj: Value,
        options: &WriteOptions,
        hooks: &dyn CreateHooks,
    ) -> Result<Written, ApiError> {
        let mut warnings = Vec::new();
        check_type_meta(resource, &mut obj)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        if resource.namespaced {
            let body_ns = meta::namespace(&obj);
            if !body_ns.is_empty() && body_ns != namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta::set_at(&mut obj, &["metadata", "namespace"], json!(namespace));
        } else {
            meta::remove_at(&mut obj, &["metadata", "namespace"]);
        }
        if !meta::resource_version(&obj).is_empty() {
            return Err(ApiError::unknown(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let generate_name = meta::str_at(&obj, &["metadata", "generateName"])
            .unwrap_or("")
            .to_string();
        let generated = meta::name(&obj).is_empty() && !generate_name.is_empty();

        // System fields (FillObjectMetaSystemFields), then the strategy (PrepareForCreate).
        {
            let metadata = meta::metadata_mut(&mut obj)
                .ok_or_else(|| ApiError::bad_request("metadata must be an object"))?;
            metadata.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            metadata.insert("creationTimestamp".into(), json!(meta::now_rfc3339()));
            metadata.remove("deletionTimestamp");
            metadata.remove("deletionGracePeriodSeconds");
            metadata.remove("resourceVersion");
            metadata.remove("selfLink");
            if resource.tracks_generation {
                metadata.insert("generation".into(), json!(1));
            } else {
                metadata.remove("generation");
            }
        }
        if resource.status_subresource && !resource.strategy.keeps_status_on_create() {
            meta::remove_at(&mut obj, &["status"]);
        }
        resource.strategy.prepare_for_create(&mut obj);
        if let Some(user) = &options.user {
            resource.strategy.prepare_for_create_by(&mut obj, user);
        }
        resource.strategy.default(&mut obj);
        // An apply's ownership was computed by the apply itself.
        if !options.apply {
            crate::managed::record_update(
                &mut obj,
                None,
                &options.field_manager,
                &resource.api_version(),
            );
        }

        if generated {
            let name = flotilla_api_machinery::names::generate_name(&generate_name);
            meta::set_at(&mut obj, &["metadata", "name"], json!(name));
        }
        let mut candidate =
            self.canonicalize(resource, obj, options.field_validation, &mut warnings)?;
        ensure_valid(
            resource,
            &candidate,
            generated,
            resource.strategy.validate(&candidate),
        )?;
        let name = meta::name(&candidate).to_string();
        // NamespaceLifecycle ran in the chain; checked again here, just before the write, since
        // the namespace may have started terminating since.
        if resource.namespaced {
            self.check_namespace_open(tenant, namespaces, resource, namespace, &name)
                .await?;
        }
        candidate = hooks
            .before_create(self, tenant, resource, candidate, options.dry_run)
            .await?;
        if options.dry_run {
            let key = tenant.object_key(resource, namespace, &name);
            if self.storage.get(&key).await?.is_some() {
                return Err(ApiError::already_exists(&resource.group_resource(), &name));
            }
            return Ok(Written {
                object: candidate,
                warnings,
            });
        }
        // Only the name can collide, and only a generated one is tried again; a generated
        // name from a valid generateName stays valid, so nothing above needs to run again.
        let mut attempt = 1;
        loop {
            let name = meta::name(&candidate).to_string();
            let key = tenant.object_key(resource, namespace, &name);
            let value = encode(&*resource.to_stored(&candidate).await?)?;
            let charge = self
                .charge(tenant, resource, &name, value.len() as i64)
                .await?;
            match self.storage.create(&key, value).await? {
                Outcome::Done(kv) => {
                    charge.keep();
                    meta::set_at(
                        &mut candidate,
                        &["metadata", "resourceVersion"],
                        json!(kv.mod_revision.to_string()),
                    );
                    return Ok(Written {
                        object: candidate,
                        warnings,
                    });
                }
                Outcome::Conflict(_) if generated && attempt < GENERATE_NAME_ATTEMPTS => {
                    attempt += 1;
                    let name = flotilla_api_machinery::names::generate_name(&generate_name);
                    meta::set_at(&mut candidate, &["metadata", "name"], json!(name));
                }
                Outcome::Conflict(_) => {
                    hooks.release(self, tenant, resource, &candidate).await;
                    return Err(ApiError::already_exists(&resource.group_resource(), &name));
                }
            }
        }
    }

    /// `Get`.
    pub async fn get(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespace: &str,
        name: &str,
        read_at: ReadAt,
    ) -> Result<Value, ApiError> {
        let key = tenant.object_key(resource, namespace, name);
        let kv = match read_at {
            ReadAt::Exact(revision) => {
                let page = self
                    .storage
                    .range(RangeRequest {
                        prefix: key.clone(),
                        start_key: None,
                        limit: 0,
                        revision,
                    })
                    .await?;
                page.kvs.into_iter().find(|kv| kv.key == key)
            }
            // Served by the resource's watch cache when it has one (as upstream; a GET alone
            // does not build one), once the cache has reached the revision.
            ReadAt::NotOlderThan(revision) => {
                let cached = match self.caches.existing(&tenant.list_prefix(resource, None)) {
                    Some(cache)
                        if cache
                            .wait_until(revision, FRESHNESS_WAIT)
                            .await
                            .unwrap_or(false) =>
                    {
                        Some(cache.get(&key))
                    }
                    _ => None,
                };
                match cached {
                    Some(kv) => kv,
                    None => {
                        self.wait_for_revision(revision).await?;
                        self.storage.get(&key).await?
                    }
                }
            }
            ReadAt::Latest => self.storage.get(&key).await?,
        };
        match kv {
            Some(kv) => decode_as(&kv, resource).await,
            None => Err(ApiError::not_found(&resource.group_resource(), name)),
        }
    }

    /// Waits up to 3 s for the store to reach `revision` (upstream's `waitUntilFreshAndBlock`),
    /// then answers "Too large resource version" (504).
    pub(crate) async fn wait_for_revision(&self, revision: Revision) -> Result<(), ApiError> {
        // A revision this process has seen answered needs no round trip: an informer's
        // watch from the revision its list was served at is the common case.
        if revision <= self.reached.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        for _ in 0..30 {
            let current = self.storage.current_revision().await?;
            self.note_reached(current);
            if current >= revision {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let current = self.storage.current_revision().await?;
        Err(ApiError::too_large_resource_version(revision, current))
    }

    /// `List`, with selectors and pages at a consistent revision.
    pub async fn list(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<ListPage, ApiError> {
        let prefix = tenant.list_prefix(resource, namespace);
        if options.continue_token.is_none()
            && let Some(page) = self
                .list_from_cache(tenant, resource, &prefix, options)
                .await?
        {
            self.note_reached(page.revision);
            return Ok(page);
        }
        let (mut revision, mut start_key) = match &options.continue_token {
            Some(token) => {
                if !matches!(options.read_at, ReadAt::Latest)
                    && options.read_at != ReadAt::NotOlderThan(0)
                {
                    return Err(invalid_list_options(FieldError::forbidden(
                        &Path::new("resourceVersion"),
                        "specifying resource version is not allowed when using continue",
                    )));
                }
                let token = decode_continue(token)?;
                (token.rv.max(0), Some(format!("{prefix}{}", token.start)))
            }
            None => match options.read_at {
                ReadAt::Exact(revision) => (revision, None),
                ReadAt::NotOlderThan(revision) => {
                    self.wait_for_revision(revision).await?;
                    (0, None)
                }
                ReadAt::Latest => (0, None),
            },
        };
        let from_continue = options.continue_token.is_some();
        let mut items = Vec::new();
        let filtering = !options.selection.is_everything();
        let mut remaining = None;
        let mut continue_token = None;
        loop {
            let want = if options.limit == 0 {
                0
            } else {
                options.limit - items.len()
            };
            let request = RangeRequest {
                prefix: prefix.clone(),
                start_key: start_key.clone(),
                limit: want,
                revision,
            };
            let page = match self.storage.range(request).await {
                Ok(page) => page,
                Err(StorageError::Compacted { .. }) if from_continue => {
                    let resume = start_key
                        .as_deref()
                        .and_then(|k| k.strip_prefix(&prefix))
                        .unwrap_or("");
                    let mut err = ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    );
                    err.continue_token = Some(encode_continue(LATEST_CONTINUE, resume));
                    return Err(err);
                }
                Err(StorageError::Compacted { .. }) => {
                    return Err(ApiError::expired(
                        "The resourceVersion for the provided list is too old.",
                    ));
                }
                Err(other) => return Err(other.into()),
            };
            revision = page.revision;
            let returned = page.kvs.len();
            let last_key = page.kvs.last().map(|kv| kv.key.clone());
            take_matching(&page.kvs, resource, &options.selection, 0, &mut items).await?;
            if !page.more {
                break;
            }
            // More keys exist: either the page is full, or selectors filtered some out and we
            // keep reading (upstream fills pages the same way).
            let next_start = match last_key {
                Some(key) => format!("{key}\u{0}"),
                None => break,
            };
            if options.limit > 0 && items.len() >= options.limit {
                continue_token = Some(continue_after(&prefix, &next_start, revision));
                if !filtering {
                    remaining = Some((page.count - returned) as i64);
                }
                break;
            }
            start_key = Some(next_start);
        }
        Ok(ListPage {
            items,
            revision,
            continue_token,
            remaining_item_count: remaining,
        })
    }

    /// A list served by the resource's watch cache: `resourceVersion=0` (any state) at once, a
    /// not-older-than revision once the cache has reached it, and the latest state once the
    /// cache has reached the store's current revision (upstream's consistent read from cache).
    /// `None` when the store must answer: an exact revision, or a cache that could not catch up
    /// in time or failed (the store's answer is the same, only dearer).
    async fn list_from_cache(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        prefix: &str,
        options: &ListOptions,
    ) -> Result<Option<ListPage>, ApiError> {
        let wanted = match options.read_at {
            ReadAt::Exact(_) => return Ok(None),
            ReadAt::NotOlderThan(revision) => revision,
            ReadAt::Latest => self.storage.current_revision().await?,
        };
        let cache = match self
            .caches
            .cache(&tenant.list_prefix(resource, None), 0)
            .await
        {
            Ok(cache) => cache,
            Err(error) => {
                tracing::debug!(%error, prefix, "listing from the store: no watch cache");
                self.caches.count_fallback();
                return Ok(None);
            }
        };
        match cache.wait_until(wanted, FRESHNESS_WAIT).await {
            Ok(true) => {}
            // A revision the store has not reached: refused after the wait, as upstream.
            Ok(false) if options.read_at != ReadAt::Latest => {
                let current = self.storage.current_revision().await?;
                if current < wanted {
                    if self.storage.progress_follows_events() {
                        return Err(ApiError::too_large_resource_version(wanted, current));
                    }
                    // A cache without trusted progress answered at once: the store is given
                    // upstream's wait for the revision before the refusal.
                    self.wait_for_revision(wanted).await?;
                }
                self.caches.count_fallback();
                return Ok(None);
            }
            Ok(false) => {
                tracing::debug!(
                    prefix,
                    wanted,
                    "listing from the store: the watch cache lags"
                );
                self.caches.count_fallback();
                return Ok(None);
            }
            Err(error) => {
                tracing::debug!(%error, prefix, "listing from the store: the watch cache failed");
                self.caches.count_fallback();
                return Ok(None);
            }
        }
        if options.read_at == ReadAt::Latest {
            self.caches.count_served();
        }
        let (kvs, revision) = cache.list(prefix, None);
        let mut items = Vec::new();
        let consumed = take_matching(
            &kvs,
            resource,
            &options.selection,
            options.limit,
            &mut items,
        )
        .await?;
        let mut continue_token = None;
        let mut remaining_item_count = None;
        if let Some(last) = consumed.checked_sub(1).map(|i| &kvs[i].key)
            && consumed < kvs.len()
        {
            continue_token = Some(continue_after(prefix, &format!("{last}\u{0}"), revision));
            if options.selection.is_everything() {
                remaining_item_count = Some((kvs.len() - consumed) as i64);
            }
        }
        Ok(Some(ListPage {
            items,
            revision,
            continue_token,
            remaining_item_count,
        }))
    }

    /// Writes `obj` over `key` if the key is still at `expected`: the stored object stamped
    /// with its new resourceVersion, or the conflict.
    async fn swap(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        key: &str,
        mut obj: Value,
        current: &KeyValue,
    ) -> Result<Outcome<Value>, ApiError> {
        let value = encode(&*resource.to_stored(&obj).await?)?;
        let charge = self
            .charge(
                tenant,
                resource,
                meta::name(&obj),
                value.len() as i64 - current.value.len() as i64,
            )
            .await?;
        match self
            .storage
            .update(key, value, current.mod_revision)
            .await?
        {
            Outcome::Done(kv) => {
                charge.keep();
                meta::set_at(
                    &mut obj,
                    &["metadata", "resourceVersion"],
                    json!(kv.mod_revision.to_string()),
                );
                Ok(Outcome::Done(obj))
            }
            Outcome::Conflict(current) => Ok(Outcome::Conflict(current)),
        }
    }

    /// `GuaranteedUpdate`: read, transform, compare-and-swap, retrying on races.
    /// `try_update` returns the desired new object, or `None` to leave the object as it is.
    /// When `precondition` names a resourceVersion the update is attempted only against it.
    pub async fn guaranteed_update<F>(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespace: &str,
        name: &str,
        dry_run: bool,
        try_update: F,
    ) -> Result<Value, ApiError>
    where
        F: FnMut(&Value) -> Result<Option<Value>, ApiError>,
    {
        self.guaranteed_update_validated(
            tenant, resource, namespace, name, dry_run, try_update, None,
        )
        .await
    }

    /// [`Store::guaranteed_update`] with `validation` (validating admission) deciding on each
    /// new state, against the stored one, just before it is written.
    #[allow(clippy::too_many_arguments)]
    pub async fn guaranteed_update_validated<F>(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespace: &str,
        name: &str,
        dry_run: bool,
        mut try_update: F,
        validation: Option<&dyn UpdateValidation>,
    ) -> Result<Value, ApiError>
    where
        F: FnMut(&Value) -> Result<Option<Value>, ApiError>,
    {
        let key = tenant.object_key(resource, namespace, name);
        if resource.kind == "Namespace" {
            self.remember_namespace(&key, false);
        }
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let Some(kv) = self.storage.get(&key).await? else {
                return Err(ApiError::not_found(&resource.group_resource(), name));
            };
            let current = decode_as(&kv, resource).await?;
            let Some(mut updated) = try_update(&current)? else {
                return Ok(current);
            };
            let mut compare_current = current.clone();
            meta::remove_at(&mut compare_current, &["metadata", "resourceVersion"]);
            meta::remove_at(&mut updated, &["metadata", "resourceVersion"]);
            // Validating admission decides before the no-op check, as upstream's registry
            // calls it inside GuaranteedUpdate's update function: an update that would change
            // nothing is still refused to whoever may not make it.
            if let Some(validation) = validation {
                validation.validate(&updated, &current).await?;
            }
            // A write that changes nothing is not a write (no new resourceVersion), but a
            // managedFields timestamp alone does not count as a change either. A stale value
            // (under an older encryption key) is written all the same: that is how
            // `kubectl replace` re-encrypts it, as upstream's GuaranteedUpdate does.
            if !kv.stale
                && without_managed_times(&updated) == without_managed_times(&compare_current)
            {
                return Ok(current);
            }
            let finalize = should_delete_during_update(&compare_current, &updated);
            if dry_run {
                // A dry run stores nothing, so the object keeps the revision it was read at.
                meta::set_at(
                    &mut updated,
                    &["metadata", "resourceVersion"],
                    json!(kv.mod_revision.to_string()),
                );
                return Ok(updated);
            }
            if finalize {
                match self.storage.delete(&key, Some(kv.mod_revision)).await? {
                    Outcome::Done(deleted) => {
                        tenant.stored_bytes.release(kv.value.len());
                        let mut obj = updated;
                        meta::set_at(
                            &mut obj,
                            &["metadata", "resourceVersion"],
                            json!(deleted.mod_revision.to_string()),
                        );
                        return Ok(obj);
                    }
                    Outcome::Conflict(_) => continue,
                }
            }
            match self.swap(tenant, resource, &key, updated, &kv).await? {
                Outcome::Done(stored) => return Ok(stored),
                Outcome::Conflict(None) => {
                    return Err(ApiError::not_found(&resource.group_resource(), name));
                }
                Outcome::Conflict(Some(_)) => continue,
            }
        }
        Err(ApiError::conflict(
            &resource.group_resource(),
            name,
            "too many concurrent updates, please try again",
        ))
    }

    /// Turns a client's full object into the next stored state of `current` (`Update` for the
    /// main resource, or the status subresource): carries system fields, runs the strategy,
    /// validates. Used by PUT and by every patch type.
    pub fn prepare_update(
        &self,
        resource: &ResourceInfo,
        current: &Value,
        mut new: Value,
        subresource: UpdateTarget,
        options: &WriteOptions,
        warnings: &mut Vec<String>,
    ) -> Result<Value, ApiError> {
        check_type_meta(resource, &mut new)?;
        let name = meta::name(current).to_string();
        let new_name = meta::name(&new);
        if !new_name.is_empty() && new_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        let new_ns = meta::namespace(&new);
        if resource.namespaced && !new_ns.is_empty() && new_ns != meta::namespace(current) {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let given_rv = meta::resource_version(&new).to_string();
        if !given_rv.is_empty() && given_rv != meta::resource_version(current) {
            return Err(ApiError::stale_update(&resource.group_resource(), &name));
        }
        let given_uid = meta::uid(&new).to_string();
        if !given_uid.is_empty() && given_uid != meta::uid(current) {
            return Err(ApiError::conflict(
                &resource.group_resource(),
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {given_uid}, UID in object meta: {}",
                    meta::uid(current)
                ),
            ));
        }
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        match subresource {
            UpdateTarget::Main => {
                if resource.status_subresource {
                    match current.get("status") {
                        Some(status) => meta::set_at(&mut new, &["status"], status.clone()),
                        None => {
                            meta::remove_at(&mut new, &["status"]);
                        }
                    }
                }
            }
            UpdateTarget::EphemeralContainers => {
                // Upstream's dropNonEphemeralContainerUpdates: everything else stays.
                let mut next = current.clone();
                match meta::at(&new, &["spec", "ephemeralContainers"]) {
                    Some(list) => {
                        meta::set_at(&mut next, &["spec", "ephemeralContainers"], list.clone())
                    }
                    None => {
                        meta::remove_at(&mut next, &["spec", "ephemeralContainers"]);
                    }
                }
                new = next;
            }
            UpdateTarget::Resize => {
                // Upstream's dropNonResizeUpdates: everything else stays.
                new = crate::strategies::resize_only(&new, current);
            }
            UpdateTarget::Status | UpdateTarget::Approval => {
                // Only status (and labels/annotations, as ResetObjectMetaForStatus allows) move.
                let mut next = current.clone();
                match new.get("status") {
                    Some(status) => meta::set_at(&mut next, &["status"], status.clone()),
                    None => {
                        meta::remove_at(&mut next, &["status"]);
                    }
                }
                for field in ["labels", "annotations"] {
                    match meta::at(&new, &["metadata", field]) {
                        Some(v) => meta::set_at(&mut next, &["metadata", field], v.clone()),
                        None => {
                            meta::remove_at(&mut next, &["metadata", field]);
                        }
                    }
                }
                new = next;
            }
        }
        // System fields always come from the stored object.
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ] {
            match meta::at(current, &["metadata", field]) {
                Some(v) => meta::set_at(&mut new, &["metadata", field], v.clone()),
                None => {
                    meta::remove_at(&mut new, &["metadata", field]);
                }
            }
        }
        if meta::at(&new, &["metadata", "managedFields"]).is_none()
            && let Some(managed) = meta::at(current, &["metadata", "managedFields"])
        {
            meta::set_at(&mut new, &["metadata", "managedFields"], managed.clone());
        }
        if meta::is_terminating(current) {
            // Finalizers may only be removed from an object being deleted, never added.
            let before = meta::finalizers(current);
            let added: Vec<String> = meta::finalizers(&new)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    &resource.group,
                    &resource.kind,
                    &name,
                    vec![FieldError::forbidden(
                        &Path::new("metadata.finalizers"),
                        "no new finalizers can be added if the object is being deleted",
                    )],
                ));
            }
        }
        resource
            .strategy
            .prepare_for_update_to(subresource, &mut new, current);
        resource.strategy.default(&mut new);
        let mut new = self.canonicalize(resource, new, options.field_validation, warnings)?;
        // Upstream's status strategies never bump generation, even when they carry an
        // annotation change (the Deployment controller writes its revision that way).
        let annotations_changed = resource.strategy.annotations_bump_generation()
            && matches!(subresource, UpdateTarget::Main)
            && meta::at(&new, &["metadata", "annotations"])
                != meta::at(current, &["metadata", "annotations"]);
        if resource.tracks_generation && (spec_of(&new) != spec_of(current) || annotations_changed)
        {
            set_next_generation(&mut new, current);
        }
        ensure_valid(
            resource,
            &new,
            false,
            resource
                .strategy
                .validate_update_to(subresource, &new, current),
        )?;
        // An apply's ownership was computed by the apply itself.
        if !options.apply {
            crate::managed::record_update(
                &mut new,
                Some(current),
                &options.field_manager,
                &resource.api_version(),
            );
        }
        Ok(new)
    }

    /// `Delete`: graceful (finalizers, pods on nodes) or immediate.
    #[allow(clippy::too_many_arguments)]
    pub async fn delete(
        &self,
        tenant: &Tenant,
        resource: &ResourceInfo,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
        dry_run: bool,
        hooks: &dyn CreateHooks,
        admission: Option<&dyn UpdateValidation>,
    ) -> Result<Deleted, ApiError> {
        let key = tenant.object_key(resource, namespace, name);
        if resource.kind == "Namespace" {
            self.remember_namespace(&key, false);
        }
        for _ in 0..MAX_UPDATE_ATTEMPTS {
            let Some(kv) = self.storage.get(&key).await? else {
                return Err(ApiError::not_found(&resource.group_resource(), name));
            };
            let current = decode_as(&kv, resource).await?;
            if let Some(uid) = &options.uid
                && uid != meta::uid(&current)
            {
                return Err(ApiError::conflict(
                    &resource.group_resource(),
                    name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                        meta::uid(&current)
                    ),
                ));
            }
            if let Some(rv) = &options.resource_version
                && rv != meta::resource_version(&current)
            {
                return Err(ApiError::conflict(
                    &resource.group_resource(),
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        meta::resource_version(&current)
                    ),
                ));
            }
            // Validating admission decides on the object as stored (upstream's
            // `deleteValidation`), on each attempt.
            if let Some(admission) = admission {
                admission.validate(&current, &current).await?;
            }
            let mut finalizers = meta::finalizers(&current);
            match options.propagation {
                Propagation::Orphan if !finalizers.iter().any(|f| f == "orphan") => {
                    finalizers.push("orphan".into())
                }
                Propagation::Foreground
                    if !finalizers.iter().any(|f| f == "foregroundDeletion") =>
                {
                    finalizers.push("foregroundDeletion".into())
                }
                _ => {}
            }
            for finalizer in resource.strategy.finalizers_on_delete() {
                if !finalizers.iter().any(|f| f == finalizer) {
                    finalizers.push(finalizer.to_string());
                }
            }
            let namespace_finalizers = resource.kind == "Namespace"
                && meta::at(&current, &["spec", "finalizers"])
                    .and_then(Value::as_array)
                    .is_some_and(|f| !f.is_empty());
            let grace = resource
                .strategy
                .graceful_delete_seconds(&current, options.grace_period_seconds)
                .unwrap_or(0);
            let graceful = !finalizers.is_empty() || namespace_finalizers || grace > 0;
            if graceful {
                if meta::is_terminating(&current) && meta::finalizers(&current) == finalizers {
                    return Ok(Deleted::Pending(current));
                }
                let mut updated = current.clone();
                meta::set_at(&mut updated, &["metadata", "finalizers"], json!(finalizers));
                if !meta::is_terminating(&updated) {
                    // BeforeDelete: the object goes away at now + grace (pods wait for their kubelet).
                    let deadline = chrono::Utc::now() + chrono::Duration::seconds(grace);
                    meta::set_at(
                        &mut updated,
                        &["metadata", "deletionTimestamp"],
                        json!(deadline.format("%Y-%m-%dT%H:%M:%SZ").to_string()),
                    );
                    meta::set_at(
                        &mut updated,
                        &["metadata", "deletionGracePeriodSeconds"],
                        json!(grace),
                    );
                    if resource.tracks_generation {
                        set_next_generation(&mut updated, &current);
                    }
                    resource.strategy.mark_deleting(&mut updated);
                }
                if resource.kind == "Namespace" {
                    meta::set_at(&mut updated, &["status", "phase"], json!("Terminating"));
                }
                if dry_run {
                    return Ok(Deleted::Pending(updated));
                }
                match self.swap(tenant, resource, &key, updated, &kv).await? {
                    Outcome::Done(stored) => return Ok(Deleted::Pending(stored)),
                    Outcome::Conflict(_) => continue,
                }
            }
            if dry_run {
                return Ok(Deleted::Gone(current));
            }
            match self.storage.delete(&key, Some(kv.mod_revision)).await? {
                Outcome::Done(_) => {
                    tenant.stored_bytes.release(kv.value.len());
                    hooks.release(self, tenant, resource, &current).await;
                    return Ok(Deleted::Gone(current));
                }
                Outcome::Conflict(None) => {
                    return Err(ApiError::not_found(&resource.group_resource(), name));
                }
                Outcome::Conflict(Some(_)) => continue,
            }
        }
        Err(ApiError::conflict(
            &resource.group_resource(),
            name,
            "too many concurrent updates, please try again",
        ))
    }
}

/// `ShouldDeleteDuringUpdate`: an update that removes the last finalizer of an object already
/// being deleted (and past its grace period) deletes it. Namespaces also wait for their
/// `spec.finalizers` (the namespace controller's).
fn should_delete_during_update(old: &Value, new: &Value) -> bool {
    let grace_over = meta::at(old, &["metadata", "deletionGracePeriodSeconds"])
        .and_then(Value::as_i64)
        .is_none_or(|grace| grace == 0);
    let namespace_done = new.get("kind").and_then(Value::as_str) != Some("Namespace")
        || meta::at(new, &["spec", "finalizers"])
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
    meta::is_terminating(old) && grace_over && meta::finalizers(new).is_empty() && namespace_done
}

/// The result of a delete.
pub enum Deleted {
    /// Removed from storage; carries the last state.
    Gone(Value),
    /// Marked for deletion (finalizers pending); carries the new state.
    Pending(Value),
}

/// `propagationPolicy` (and the legacy `orphanDependents`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Delete dependents in the background (the default).
    #[default]
    Background,
    /// Keep the owner until dependents are gone (`foregroundDeletion` finalizer).
    Foreground,
    /// Leave dependents (`orphan` finalizer).
    Orphan,
}

/// Delete preconditions and policy.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `propagationPolicy`.
    pub propagation: Propagation,
    /// `gracePeriodSeconds`, when the client gave one.
    pub grace_period_seconds: Option<i64>,
}

/// Which part of an object an update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateTarget {
    /// The main resource: status changes are ignored when the kind has a status subresource.
    Main,
    /// The `/status` subresource: only status changes.
    Status,
    /// A CertificateSigningRequest's `/approval`: only its Approved/Denied conditions change.
    Approval,
    /// A Pod's `/ephemeralcontainers`: only `spec.ephemeralContainers` changes.
    EphemeralContainers,
    /// A Pod's `/resize`: only its containers' `resources` and `resizePolicy` change.
    Resize,
}

impl UpdateTarget {
    /// The subresource's name in the URL (`None` for the object itself).
    pub fn subresource(self) -> Option<&'static str> {
        match self {
            UpdateTarget::Main => None,
            UpdateTarget::Status => Some("status"),
            UpdateTarget::Approval => Some("approval"),
            UpdateTarget::EphemeralContainers => Some("ephemeralcontainers"),
            UpdateTarget::Resize => Some("resize"),
        }
    }
}

/// What decides on an update's new state before it is stored (validating admission).
#[async_trait::async_trait]
pub trait UpdateValidation: Send + Sync {
    /// Allows `new` to replace `old`, or refuses it.
    async fn validate(&self, new: &Value, old: &Value) -> Result<(), ApiError>;
}

/// Side effects of creating and deleting certain kinds (service IP and port allocation).
#[async_trait::async_trait]
pub trait CreateHooks: Send + Sync {
    /// Runs after validation, before the object is stored; may fill in allocated fields.
    async fn before_create(
        &self,
        store: &Store,
        tenant: &Tenant,
        resource: &ResourceInfo,
        obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError>;
    /// Releases what `before_create` reserved (after a failed create or a delete).
    async fn release(&self, store: &Store, tenant: &Tenant, resource: &ResourceInfo, obj: &Value);
}

/// The fields outside metadata and status: what `generation` tracks.
fn spec_of(obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        map.remove("status");
    }
    copy
}

fn without_managed_times(obj: &Value) -> Value {
    let mut copy = obj.clone();
    if let Some(entries) = copy
        .pointer_mut("/metadata/managedFields")
        .and_then(Value::as_array_mut)
    {
        for entry in entries {
            if let Some(entry) = entry.as_object_mut() {
                entry.remove("time");
            }
        }
    }
    copy
}

/// Fills `apiVersion`/`kind` when absent and rejects a body meant for another kind.
fn check_type_meta(resource: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    let Some(map) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let expected_version = resource.api_version();
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(v) if !v.is_empty() && v != expected_version => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected_version})"
            )));
        }
        _ => {}
    }
    match map.get("kind").and_then(Value::as_str) {
        Some(k) if !k.is_empty() && k != resource.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                resource.kind
            )));
        }
        _ => {}
    }
    map.insert("apiVersion".into(), json!(expected_version));
    map.insert("kind".into(), json!(resource.kind));
    Ok(())
}

/// `metadata.generation` one past `previous`'s.
fn set_next_generation(obj: &mut Value, previous: &Value) {
    let generation = meta::at(previous, &["metadata", "generation"])
        .and_then(Value::as_i64)
        .unwrap_or(0);
    meta::set_at(obj, &["metadata", "generation"], json!(generation + 1));
}

/// Object-meta validation plus the strategy's findings, as one 422 when anything is wrong.
fn ensure_valid(
    resource: &ResourceInfo,
    obj: &Value,
    generated: bool,
    strategy_errors: Vec<FieldError>,
) -> Result<(), ApiError> {
    let mut errors = validate_object_meta(resource, obj, generated);
    errors.extend(strategy_errors);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            &resource.group,
            &resource.kind,
            meta::name(obj),
            errors,
        ))
    }
}

/// `ValidateObjectMeta`: name, labels, annotations, finalizers.
fn validate_object_meta(resource: &ResourceInfo, obj: &Value, generated: bool) -> Vec<FieldError> {
    use flotilla_api_machinery::names;
    let mut errors = Vec::new();
    let name = meta::name(obj);
    if name.is_empty() {
        errors.push(FieldError::required(
            &Path::new("metadata.name"),
            "name or generateName is required",
        ));
    } else {
        let problems = match (&*resource.group, &*resource.kind) {
            // Namespaces and services have stricter strategy validation of their own.
            ("", "Namespace" | "Service") => Vec::new(),
            // RBAC objects are named freely (`system:aggregate-to-admin`): upstream validates
            // them as path segments only (ValidateRBACName).
            (
                "rbac.authorization.k8s.io",
                "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding",
            ) => names::is_valid_path_segment_name(name),
            _ => {
                let mut p = names::is_valid_path_segment_name(name);
                if p.is_empty() {
                    p = names::is_dns1123_subdomain(name);
                }
                p
            }
        };
        let field = if generated {
            "metadata.generateName"
        } else {
            "metadata.name"
        };
        errors.extend(
            problems
                .into_iter()
                .map(|p| FieldError::invalid(&Path::new(field), json!(name), &p)),
        );
    }
    for (key, value) in meta::labels(obj) {
        for p in names::is_qualified_name(&key) {
            errors.push(FieldError::invalid(
                &Path::new("metadata.labels"),
                json!(key),
                &p,
            ));
        }
        for p in names::is_valid_label_value(&value) {
            errors.push(FieldError::invalid(
                &Path::new("metadata.labels"),
                json!(value),
                &p,
            ));
        }
    }
    let annotations: BTreeMap<String, String> =
        meta::string_map(meta::at(obj, &["metadata", "annotations"]));
    let mut total = 0;
    for (key, value) in &annotations {
        for p in names::is_qualified_name(&key.to_lowercase()) {
            errors.push(FieldError::invalid(
                &Path::new("metadata.annotations"),
                json!(key),
                &p,
            ));
        }
        total += key.len() + value.len();
    }
    if total > names::TOTAL_ANNOTATION_SIZE_LIMIT_BYTES {
        errors.push(FieldError::too_long(
            &Path::new("metadata.annotations"),
            names::TOTAL_ANNOTATION_SIZE_LIMIT_BYTES,
        ));
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_found_by_round_trip_difference() {
        let input =
            json!({"spec": {"replicas": 1, "bogus": 2, "template": {"x": null}}, "extra": [1]});
        let canonical = json!({"spec": {"replicas": 1, "template": {}}});
        assert_eq!(
            unknown_fields(&input, &canonical),
            vec!["spec.bogus", "extra"]
        );
    }

    #[tokio::test]
    async fn a_future_resource_version_times_out_with_504() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage =
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("open");
        let store = Store::new(Arc::new(storage));
        let err = store
            .wait_for_revision(1_000_000)
            .await
            .expect_err("future");
        assert_eq!((err.code, err.reason), (504, "Timeout"));
        assert!(
            err.message
                .starts_with("Timeout: Too large resource version: 1000000, current: ")
        );
    }

    #[test]
    fn read_at_follows_upstream_rules() {
        assert_eq!(ReadAt::parse(None, None).ok(), Some(ReadAt::Latest));
        assert_eq!(
            ReadAt::parse(Some("0"), None).ok(),
            Some(ReadAt::NotOlderThan(0))
        );
        assert_eq!(
            ReadAt::parse(Some("7"), Some("Exact")).ok(),
            Some(ReadAt::Exact(7))
        );
        assert!(ReadAt::parse(Some("0"), Some("Exact")).is_err());
        assert!(ReadAt::parse(None, Some("Exact")).is_err());
        assert!(ReadAt::parse(Some("x"), None).is_err());
    }
}
