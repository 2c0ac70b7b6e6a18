//! Encryption at rest (`--encryption-provider-config`, upstream's `EncryptionConfiguration`):
//! a [`Storage`] in front of the real one that encrypts the values of the configured
//! resources on their way in and decrypts them on every way out — reads, lists, conflicts,
//! deletes and watch events — as upstream's transformers sit between the object codec and
//! etcd. Everything above (the registry, the watch caches, the management API) sees plain
//! values; the store only ever holds `k8s:enc:…` for those resources.
//!
//! A stored key names its tenant and resource (`/registry/<tenant>/<group|core>/<resource>/…`);
//! keys of no resource (the service's own records, already sealed under the key-encryption
//! key where they hold secrets) pass through untouched.

pub mod config;
pub mod kms;
pub mod transformers;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use flotilla_storage::{
    KeyValue, Outcome, ProgressRequester, RangeRequest, RangeResponse, Revision, Storage,
    StorageError, WatchResponse, WatchStream,
};
use futures::StreamExt;

use config::{Provider, Rule};
use kms::KmsProvider;
use transformers::{KmsProviders, Transformers};

/// The tenant, group (`""` for core) and resource of a resource's storage key.
fn resource_of(key: &str) -> Option<(&str, &str, &str)> {
    let rest = key.strip_prefix("/registry/")?;
    let mut parts = rest.splitn(4, '/');
    let tenant = parts.next()?;
    let group = parts.next()?;
    let resource = parts.next()?;
    parts.next()?;
    Some((tenant, if group == "core" { "" } else { group }, resource))
}

/// Reads and validates an `EncryptionConfiguration` file; the error is one line naming the
/// file and the field.
pub fn load(path: &Path) -> Result<Vec<Rule>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("reading {}: {err}", path.display()))?;
    config::parse(&text).map_err(|err| format!("{}: {err}", path.display()))
}

/// A [`Storage`] that encrypts the configured resources' values.
pub struct EncryptedStorage {
    inner: Arc<dyn Storage>,
    codec: Arc<Codec>,
}

impl std::fmt::Debug for EncryptedStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptedStorage")
            .field("rules", &self.codec.rules.len())
            .finish_non_exhaustive()
    }
}

impl EncryptedStorage {
    /// `inner` with `rules` applied.
    pub fn new(inner: Arc<dyn Storage>, rules: Vec<Rule>) -> Self {
        let kms: KmsProviders = rules
            .iter()
            .flat_map(|rule| &rule.providers)
            .filter_map(|provider| match provider {
                Provider::Kms(config) => {
                    Some((config.name.clone(), Arc::new(KmsProvider::new(config))))
                }
                _ => None,
            })
            .collect();
        EncryptedStorage {
            inner,
            codec: Arc::new(Codec {
                rules,
                kms,
                tenants: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The configuration's KMS providers, for the `kms-providers` health check.
    pub fn kms_providers(&self) -> Vec<Arc<KmsProvider>> {
        self.codec.kms.values().cloned().collect()
    }

    /// The events of `stream` decrypted, one batch at a time (in order).
    fn decrypting(&self, stream: WatchStream) -> WatchStream {
        let codec = self.codec.clone();
        stream
            .then(move |item| {
                let codec = codec.clone();
                async move {
                    match item {
                        Ok(response) => codec.read_watch(response).await,
                        Err(err) => Err(err),
                    }
                }
            })
            .boxed()
    }
}

/// A tenant's transformers, one set per rule.
type TenantTransformers = Arc<Vec<Transformers>>;

/// The rules, and each tenant's transformers (one set per rule, built on first use: a
/// tenant's keys are its own).
struct Codec {
    rules: Vec<Rule>,
    /// The `kms` providers, shared by every tenant's transformers.
    kms: KmsProviders,
    tenants: Mutex<HashMap<String, TenantTransformers>>,
}

impl Codec {
    /// The transformers of the tenant of `key` and the index of the rule that covers it, or
    /// `None` when no rule does.
    fn transformers(&self, key: &str) -> Result<Option<(TenantTransformers, usize)>, StorageError> {
        let Some((tenant, group, resource)) = resource_of(key) else {
            return Ok(None);
        };
        let Some(index) = self.rules.iter().position(|r| r.covers(group, resource)) else {
            return Ok(None);
        };
        let mut tenants = self.tenants.lock().map_err(|_| StorageError::Unavailable {
            message: "the encryption keys' lock is poisoned".to_string(),
            source: None,
        })?;
        if let Some(found) = tenants.get(tenant) {
            return Ok(Some((found.clone(), index)));
        }
        let built = self
            .rules
            .iter()
            .map(|rule| Transformers::new(&rule.providers, tenant, &self.kms))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|message| StorageError::Unavailable {
                message: format!("encryption keys of tenant {tenant}: {message}"),
                source: None,
            })?;
        let built = Arc::new(built);
        tenants.insert(tenant.to_string(), built.clone());
        Ok(Some((built, index)))
    }

    async fn write(&self, key: &str, value: &Bytes) -> Result<Bytes, StorageError> {
        match self.transformers(key)? {
            None => Ok(value.clone()),
            Some((all, index)) => {
                all[index]
                    .write(value, key)
                    .await
                    .map_err(|message| StorageError::Unavailable {
                        message: format!("encrypting {key}: {message}"),
                        source: None,
                    })
            }
        }
    }

    async fn read(&self, mut kv: KeyValue) -> Result<KeyValue, StorageError> {
        if let Some((all, index)) = self.transformers(&kv.key)? {
            (kv.value, kv.stale) =
                all[index]
                    .read(&kv.value, &kv.key)
                    .await
                    .map_err(|message| StorageError::Corrupt {
                        key: kv.key.clone(),
                        message: format!("cannot decrypt: {message}"),
                    })?;
        }
        Ok(kv)
    }

    async fn read_all(&self, kvs: Vec<KeyValue>) -> Result<Vec<KeyValue>, StorageError> {
        let mut read = Vec::with_capacity(kvs.len());
        for kv in kvs {
            read.push(self.read(kv).await?);
        }
        Ok(read)
    }

    async fn read_optional(&self, kv: Option<KeyValue>) -> Result<Option<KeyValue>, StorageError> {
        match kv {
            Some(kv) => Ok(Some(self.read(kv).await?)),
            None => Ok(None),
        }
    }

    /// A write's outcome: when done, the state is the caller's own `value` (nothing to
    /// decrypt); a conflict's current state is decrypted.
    async fn written(
        &self,
        outcome: Outcome<KeyValue>,
        value: Bytes,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        Ok(match outcome {
            Outcome::Done(mut kv) => {
                kv.value = value;
                Outcome::Done(kv)
            }
            Outcome::Conflict(current) => Outcome::Conflict(self.read_optional(current).await?),
        })
    }

    async fn read_watch(&self, mut response: WatchResponse) -> Result<WatchResponse, StorageError> {
        for event in &mut response.events {
            event.kv = self
                .read(std::mem::replace(
                    &mut event.kv,
                    KeyValue {
                        key: String::new(),
                        value: Bytes::new(),
                        create_revision: 0,
                        mod_revision: 0,
                        stale: false,
                    },
                ))
                .await?;
            event.prev = self.read_optional(event.prev.take()).await?;
        }
        Ok(response)
    }
}

#[async_trait]
impl Storage for EncryptedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let kv = self.inner.get(key).await?;
        self.codec.read_optional(kv).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        let mut response = self.inner.range(request).await?;
        response.kvs = self
            .codec
            .read_all(std::mem::take(&mut response.kvs))
            .await?;
        Ok(response)
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        let stored = self.codec.write(key, &value).await?;
        let outcome = self.inner.create(key, stored).await?;
        self.codec.written(outcome, value).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let stored = self.codec.write(key, &value).await?;
        let outcome = self.inner.update(key, stored, expected_revision).await?;
        self.codec.written(outcome, value).await
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        // The deleted state, decrypted.
        Ok(match self.inner.delete(key, expected_revision).await? {
            Outcome::Done(kv) => Outcome::Done(self.codec.read(kv).await?),
            Outcome::Conflict(current) => {
                Outcome::Conflict(self.codec.read_optional(current).await?)
            }
        })
    }

    async fn watch(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<WatchStream, StorageError> {
        let stream = self.inner.watch(prefix, from_revision).await?;
        Ok(self.decrypting(stream))
    }

    async fn watch_with_progress(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<(WatchStream, ProgressRequester), StorageError> {
        let (stream, progress) = self
            .inner
            .watch_with_progress(prefix, from_revision)
            .await?;
        Ok((self.decrypting(stream), progress))
    }

    fn progress_follows_events(&self) -> bool {
        self.inner.progress_follows_events()
    }

    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision, StorageError> {
        self.inner.current_revision().await
    }

    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        self.inner.compacted_revision().await
    }

    fn untransformed(&self) -> &dyn Storage {
        self.inner.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::Provider;
    use flotilla_storage::{EmbeddedStorage, EventKind};

    const SECRET: &str = "/registry/a/core/secrets/default/s";
    const CONFIG_MAP: &str = "/registry/a/core/configmaps/default/c";

    fn stores() -> (tempfile::TempDir, Arc<dyn Storage>, EncryptedStorage) {
        let dir = tempfile::tempdir().expect("tempdir");
        let inner: Arc<dyn Storage> =
            Arc::new(EmbeddedStorage::open(dir.path().join("s.redb")).expect("open"));
        let rules = vec![Rule {
            resources: vec![(String::new(), "secrets".to_string())],
            providers: vec![
                Provider::AesGcm(vec![("k".to_string(), vec![9; 32])]),
                Provider::Identity,
            ],
        }];
        let encrypted = EncryptedStorage::new(inner.clone(), rules);
        (dir, inner, encrypted)
    }

    fn done(outcome: Outcome<KeyValue>) -> KeyValue {
        match outcome {
            Outcome::Done(kv) => kv,
            Outcome::Conflict(current) => panic!("conflict: {current:?}"),
        }
    }

    #[test]
    fn resource_keys_name_tenant_group_and_resource() {
        assert_eq!(resource_of(SECRET), Some(("a", "", "secrets")));
        assert_eq!(
            resource_of("/registry/t/apps/deployments/ns/d"),
            Some(("t", "apps", "deployments"))
        );
        assert_eq!(
            resource_of("/registry/t/core/namespaces/default"),
            Some(("t", "", "namespaces"))
        );
        assert_eq!(resource_of("/registry/t/core/secrets"), None);
        assert_eq!(resource_of("/flotilla/tenants/a"), None);
    }

    #[tokio::test]
    async fn configured_resources_are_stored_encrypted_and_read_plain() {
        let (_dir, inner, encrypted) = stores();
        let value = Bytes::from_static(b"{\"data\":{\"k\":\"djE=\"}}");
        let created = done(
            encrypted
                .create(SECRET, value.clone())
                .await
                .expect("create"),
        );
        assert_eq!(created.value, value);
        done(
            encrypted
                .create(CONFIG_MAP, value.clone())
                .await
                .expect("create"),
        );

        let raw = inner.get(SECRET).await.expect("get").expect("stored");
        assert!(
            raw.value.starts_with(b"k8s:enc:aesgcm:v1:k:"),
            "{:?}",
            raw.value
        );
        assert!(!raw.value.windows(4).any(|w| w == b"djE="));
        // Resources no rule names are stored as they are.
        let plain = inner.get(CONFIG_MAP).await.expect("get").expect("stored");
        assert_eq!(plain.value, value);

        let read = encrypted.get(SECRET).await.expect("get").expect("stored");
        assert_eq!(read.value, value);
        // Beneath the transformation, the value as stored.
        let beneath = encrypted
            .untransformed()
            .get(SECRET)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(beneath.value, raw.value);
        let listed = encrypted
            .range(RangeRequest {
                prefix: "/registry/a/".to_string(),
                ..Default::default()
            })
            .await
            .expect("range");
        assert!(listed.kvs.iter().all(|kv| kv.value == value), "{listed:?}");

        // A stale update's conflict carries the current state, decrypted.
        let Outcome::Conflict(Some(current)) = encrypted
            .update(SECRET, Bytes::from_static(b"{}"), created.mod_revision - 1)
            .await
            .expect("update")
        else {
            panic!("no conflict");
        };
        assert_eq!(current.value, value);

        // A value written before encryption (plain) is still read while identity is listed.
        done(
            inner
                .create(
                    "/registry/a/core/secrets/default/old",
                    Bytes::from_static(b"{}"),
                )
                .await
                .expect("create"),
        );
        let old = encrypted
            .get("/registry/a/core/secrets/default/old")
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(old.value, "{}");
        // …and is stale, so an update that changes nothing still writes it encrypted.
        assert!(old.stale && !read.stale);
    }

    #[tokio::test]
    async fn watch_events_and_deletes_are_decrypted() {
        let (_dir, _inner, encrypted) = stores();
        let mut watch = encrypted
            .watch("/registry/a/core/secrets/", 0)
            .await
            .expect("watch");
        let first = done(
            encrypted
                .create(SECRET, Bytes::from_static(b"v1"))
                .await
                .expect("create"),
        );
        done(
            encrypted
                .update(SECRET, Bytes::from_static(b"v2"), first.mod_revision)
                .await
                .expect("update"),
        );
        let deleted = done(encrypted.delete(SECRET, None).await.expect("delete"));
        assert_eq!(deleted.value, "v2");
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let response = watch.next().await.expect("open").expect("events");
            for event in response.events {
                seen.push((
                    event.kind,
                    event.kv.value.clone(),
                    event.prev.map(|p| p.value),
                ));
            }
        }
        assert_eq!(
            seen,
            vec![
                (EventKind::Put, Bytes::from("v1"), None),
                (EventKind::Put, Bytes::from("v2"), Some(Bytes::from("v1"))),
                (EventKind::Delete, Bytes::new(), Some(Bytes::from("v2"))),
            ]
        );
    }

    #[tokio::test]
    async fn a_value_no_key_opens_is_a_corrupt_error() {
        let (_dir, inner, encrypted) = stores();
        done(
            inner
                .create(
                    SECRET,
                    Bytes::from_static(b"k8s:enc:aescbc:v1:gone:xxxxxxxx"),
                )
                .await
                .expect("create"),
        );
        let err = encrypted.get(SECRET).await.expect_err("no such key");
        assert!(
            matches!(&err, StorageError::Corrupt { key, message } if key == SECRET && message.contains("k8s:enc:aescbc:v1:gone:")),
            "{err}"
        );
    }
}
