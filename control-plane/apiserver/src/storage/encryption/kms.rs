//! The `kms` v2 encryption provider, upstream's envelope scheme byte for byte: a value is
//! stored as `k8s:enc:kms:v2:<name>:` followed by an `EncryptedObject` (protobuf) holding
//! the plugin's key id, the data-encryption seed as the plugin encrypted it, the plugin's
//! annotations and the data: 32 random bytes of HKDF info, a 12-byte nonce and AES-256-GCM of
//! the value under HKDF-SHA256-Expand(seed, info), the storage key authenticated
//! (`HKDF_SHA256_XNONCE_AES_GCM_SEED`). Values of the older `AES_GCM_KEY` form (the plugin
//! encrypted the AES key itself) are read too.
//!
//! The plugin is asked to encrypt a seed once per tenant and key id: each tenant's seed is
//! its own (random, never derived from another's), so one tenant's data keys are never
//! another's. It is asked to decrypt a seed the first time a value carrying it is read;
//! opened seeds are kept. Its `Status` is asked at most once a minute on the way of a write
//! (and by the first read, to judge staleness): a new key id there (the key-encryption key
//! rotated) makes the next write of each tenant encrypt a new seed, and values under the old
//! one read as stale, so that rewriting them (`kubectl replace`) stores them anew, as upstream.
//! The `kms-providers` health check asks the same `Status`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use bytes::Bytes;
use flotilla_api_machinery::kms as api;
use prost::Message;
use ring::hkdf;
use tokio::sync::OnceCell;

use super::config::Kms;
use super::transformers::Gcm;

/// Every value of a `kms` v2 provider starts with this, then the provider's name and `:`.
const PREFIX: &str = "k8s:enc:kms:v2:";
/// The seed's length (upstream's `MinSeedSizeExtendedNonceGCM`), the HKDF info's and the
/// derived AES-256 key's.
const SEED_LEN: usize = 32;
const GCM_NONCE_LEN: usize = 12;
/// How long the plugin's key id is trusted before `Status` is asked again.
const STATUS_INTERVAL: Duration = Duration::from_secs(60);
/// How soon `Status` is asked again after it failed.
const STATUS_RETRY: Duration = Duration::from_secs(1);
/// How long writes go on with the last key id the plugin gave when it no longer answers
/// `Status` (upstream's `kmsv2PluginWriteDEKSourceMaxTTL`).
const STATUS_MAX_AGE: Duration = Duration::from_secs(180);

/// `EncryptedDEKSourceType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
enum SourceType {
    /// The plugin encrypted the AES-GCM key itself.
    AesGcmKey = 0,
    /// The plugin encrypted a seed; each value's key is derived from it.
    HkdfSha256XnonceAesGcmSeed = 1,
}

/// `EncryptedObject` (`k8s.io/apiserver/.../kmsv2/v2/api.proto`): what is stored.
#[derive(Clone, PartialEq, prost::Message)]
struct EncryptedObject {
    #[prost(bytes = "vec", tag = "1")]
    encrypted_data: Vec<u8>,
    #[prost(string, tag = "2")]
    key_id: String,
    #[prost(bytes = "vec", tag = "3")]
    encrypted_dek_source: Vec<u8>,
    /// Ordered, so that the object without its data is one key for its seed.
    #[prost(btree_map = "string, bytes", tag = "4")]
    annotations: BTreeMap<String, Vec<u8>>,
    #[prost(enumeration = "SourceType", tag = "5")]
    encrypted_dek_source_type: i32,
}

impl EncryptedObject {
    /// Upstream's `ValidateEncryptedObject`.
    fn validate(&self) -> Result<SourceType, String> {
        let source = SourceType::try_from(self.encrypted_dek_source_type).map_err(|_| {
            format!(
                "unknown encryptedDEKSourceType: {}",
                self.encrypted_dek_source_type
            )
        })?;
        if self.encrypted_data.is_empty() {
            return Err("encrypted data is empty".to_string());
        }
        api::validate_encrypted_dek(&self.encrypted_dek_source)
            .map_err(|err| format!("failed to validate encrypted DEK source: {err}"))?;
        api::validate_key_id(&self.key_id)
            .map_err(|err| format!("failed to validate key id: {err}"))?;
        let annotations: HashMap<String, Vec<u8>> = self.annotations.clone().into_iter().collect();
        api::validate_annotations(&annotations)
            .map_err(|err| format!("failed to validate annotations: {err}"))?;
        Ok(source)
    }

    /// The object without its data: what identifies the seed it was written under.
    fn seed_key(&self) -> Vec<u8> {
        EncryptedObject {
            encrypted_data: Vec::new(),
            ..self.clone()
        }
        .encode_to_vec()
    }
}

/// A seed (or, in the older form, a key) as opened.
enum Opened {
    Seed(hkdf::Prk),
    Key(Gcm),
}

/// ring's HKDF output length.
struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        SEED_LEN
    }
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness for a seed or nonce".to_string())?;
    Ok(bytes)
}

impl Opened {
    fn new(source: SourceType, plain: &[u8]) -> Result<Opened, String> {
        match source {
            SourceType::HkdfSha256XnonceAesGcmSeed => {
                if plain.len() < SEED_LEN {
                    return Err(format!(
                        "invalid seed length {} used for key generation",
                        plain.len()
                    ));
                }
                Ok(Opened::Seed(hkdf::Prk::new_less_safe(
                    hkdf::HKDF_SHA256,
                    plain,
                )))
            }
            SourceType::AesGcmKey => Ok(Opened::Key(Gcm::new(plain)?)),
        }
    }

    fn derived(prk: &hkdf::Prk, info: &[u8]) -> Result<Aes256Gcm, String> {
        let mut key = [0u8; SEED_LEN];
        prk.expand(&[info], Len32)
            .and_then(|okm| okm.fill(&mut key))
            .map_err(|_| "failed to KDF expand seed with info".to_string())?;
        Aes256Gcm::new_from_slice(&key).map_err(|_| "bad derived key length".to_string())
    }

    /// `info || nonce || AES-GCM(plain)`, a key derived for this value alone.
    fn seal(&self, plain: &[u8], context: &[u8]) -> Result<Vec<u8>, String> {
        let Opened::Seed(prk) = self else {
            return Err("values are only written under a seed".to_string());
        };
        let info = random::<SEED_LEN>()?;
        let nonce = random::<GCM_NONCE_LEN>()?;
        let sealed = Self::derived(prk, &info)?
            .encrypt(
                aes_gcm::Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: context,
                },
            )
            .map_err(|_| "AES-GCM encryption failed".to_string())?;
        let mut out = Vec::with_capacity(SEED_LEN + GCM_NONCE_LEN + sealed.len());
        out.extend_from_slice(&info);
        out.extend_from_slice(&nonce);
        out.extend(sealed);
        Ok(out)
    }

    fn open(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, String> {
        let short = || "the stored data was shorter than the required size".to_string();
        match self {
            Opened::Seed(prk) => {
                let (info, rest) = data.split_at_checked(SEED_LEN).ok_or_else(short)?;
                let (nonce, sealed) = rest.split_at_checked(GCM_NONCE_LEN).ok_or_else(short)?;
                Self::derived(prk, info)?
                    .decrypt(
                        aes_gcm::Nonce::from_slice(nonce),
                        Payload {
                            msg: sealed,
                            aad: context,
                        },
                    )
                    .map_err(|_| {
                        "does not authenticate: corrupted, or written under another key".to_string()
                    })
            }
            Opened::Key(gcm) => {
                let (nonce, sealed) = data.split_at_checked(GCM_NONCE_LEN).ok_or_else(short)?;
                gcm.open(nonce, sealed, context)
            }
        }
    }
}

/// A tenant's seed for writes: opened, and the object fields every value written under it
/// carries.
struct WriteSeed {
    opened: Arc<Opened>,
    header: EncryptedObject,
    /// The key id `Status` gave when the seed was made: a new one there makes a new seed (the
    /// header's is what `Encrypt` answered, which a plugin may spell otherwise).
    status_key_id: String,
}

/// The gRPC client of the plugin, over its unix socket.
struct Plugin {
    socket: std::path::PathBuf,
    timeout: Duration,
    /// Built on first use (building it needs the runtime); it reconnects by itself.
    channel: OnceCell<tonic::transport::Channel>,
}

impl Plugin {
    async fn channel(&self) -> tonic::transport::Channel {
        self.channel
            .get_or_init(|| async {
                let socket = self.socket.clone();
                // The URI is a placeholder: the connector dials the socket.
                tonic::transport::Endpoint::from_static("http://[::1]:50051")
                    .connect_timeout(self.timeout)
                    .connect_with_connector_lazy(tower::service_fn(move |_: http::Uri| {
                        let socket = socket.clone();
                        async move {
                            let stream = tokio::net::UnixStream::connect(socket).await?;
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                        }
                    }))
            })
            .await
            .clone()
    }

    /// One unary call, within the provider's timeout.
    async fn call<Request, Response>(
        &self,
        path: &'static str,
        request: Request,
    ) -> Result<Response, String>
    where
        Request: Message + Send + Sync + 'static,
        Response: Message + Default + Send + Sync + 'static,
    {
        let call = async {
            let mut grpc = tonic::client::Grpc::new(self.channel().await);
            grpc.ready().await.map_err(|err| err.to_string())?;
            let codec = tonic_prost::ProstCodec::<Request, Response>::default();
            grpc.unary(
                tonic::Request::new(request),
                http::uri::PathAndQuery::from_static(path),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result.map_err(|err| {
                format!("the KMS plugin at {} failed: {err}", self.socket.display())
            }),
            Err(_) => Err(format!(
                "the KMS plugin at {} did not answer within {:?}",
                self.socket.display(),
                self.timeout
            )),
        }
    }
}

/// The plugin's `Status` as last asked.
#[derive(Default)]
struct StatusState {
    /// The last key id it gave, and when.
    answered: Option<(String, Instant)>,
    /// When it was last asked.
    attempted: Option<Instant>,
    /// Why the last ask failed, if it did.
    failure: Option<String>,
}

impl StatusState {
    /// Whether `Status` is to be asked now: never asked, a minute after an answer, a second
    /// after a failure.
    fn due(&self) -> bool {
        match (&self.answered, self.attempted) {
            (_, None) => true,
            (Some((_, answered)), Some(attempted)) if *answered >= attempted => {
                attempted.elapsed() >= STATUS_INTERVAL
            }
            (_, Some(attempted)) => attempted.elapsed() >= STATUS_RETRY,
        }
    }
}

/// One `kms` provider of the configuration, shared by every tenant.
pub struct KmsProvider {
    prefix: Vec<u8>,
    plugin: Plugin,
    /// Each tenant's seed for writes (one encryption by the plugin, however many writers
    /// race for it).
    writers: Mutex<HashMap<String, Arc<OnceCell<Arc<WriteSeed>>>>>,
    /// Seeds opened, by [`EncryptedObject::seed_key`].
    opened: Mutex<HashMap<Vec<u8>, Arc<Opened>>>,
    /// What the plugin's `Status` last said, and when it was asked: read by anyone at once.
    status: Mutex<StatusState>,
    /// Held while `Status` is asked, so that callers arriving together ask once.
    asking: tokio::sync::Mutex<()>,
    /// The key id the plugin's last `Encrypt` answered (current too, however it spells it).
    written_key_id: Mutex<Option<String>>,
}

impl std::fmt::Debug for KmsProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KmsProvider")
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("socket", &self.plugin.socket)
            .finish_non_exhaustive()
    }
}

fn poisoned() -> String {
    "the KMS provider's lock is poisoned".to_string()
}

impl KmsProvider {
    /// The provider `config` names; nothing is dialled until it is used.
    pub fn new(config: &Kms) -> KmsProvider {
        KmsProvider {
            prefix: format!("{PREFIX}{}:", config.name).into_bytes(),
            plugin: Plugin {
                socket: config.socket.clone(),
                timeout: config.timeout,
                channel: OnceCell::new(),
            },
            writers: Mutex::new(HashMap::new()),
            opened: Mutex::new(HashMap::new()),
            status: Mutex::new(StatusState::default()),
            asking: tokio::sync::Mutex::new(()),
            written_key_id: Mutex::new(None),
        }
    }

    /// `k8s:enc:kms:v2:<name>:`.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The plugin's current key id for a write: asked at most once a minute (once a second
    /// while it fails); while it does not answer, the last one it gave serves writes for
    /// three minutes.
    async fn current_key_id(&self) -> Result<String, String> {
        let _asking = self.asking.lock().await;
        if self.status()?.due() {
            let attempted = Instant::now();
            let answer = self.ask_status().await;
            let mut status = self.status()?;
            status.attempted = Some(attempted);
            match answer {
                Ok(key_id) => {
                    status.answered = Some((key_id, Instant::now()));
                    status.failure = None;
                }
                Err(err) => {
                    tracing::warn!(%err, "KMS plugin status");
                    status.failure = Some(err);
                }
            }
        }
        let status = self.status()?;
        match (&status.answered, &status.failure) {
            (Some((key_id, answered)), _) if answered.elapsed() < STATUS_MAX_AGE => {
                Ok(key_id.clone())
            }
            (_, Some(failure)) => Err(failure.clone()),
            (_, None) => Err("the KMS plugin has not answered its status".to_string()),
        }
    }

    fn status(&self) -> Result<std::sync::MutexGuard<'_, StatusState>, String> {
        self.status.lock().map_err(|_| poisoned())
    }

    /// The key id values are judged stale against: the last one the plugin gave, asked for
    /// only when it was never asked (a read never waits on a plugin that is failing).
    async fn key_id_for_reads(&self) -> Result<Option<String>, String> {
        if self.status()?.attempted.is_none() {
            let _ = self.current_key_id().await;
        }
        Ok(self
            .status()?
            .answered
            .as_ref()
            .map(|(key_id, _)| key_id.clone()))
    }

    async fn ask_status(&self) -> Result<String, String> {
        let answer: api::StatusResponse = self
            .plugin
            .call(api::STATUS_PATH, api::StatusRequest {})
            .await?;
        if answer.version != api::API_VERSION {
            return Err(format!(
                "the KMS plugin speaks API version {:?}, not {:?}",
                answer.version,
                api::API_VERSION
            ));
        }
        if answer.healthz != api::HEALTHY {
            return Err(format!("the KMS plugin is not healthy: {}", answer.healthz));
        }
        api::validate_key_id(&answer.key_id)?;
        Ok(answer.key_id)
    }

    /// Upstream's `kms-providers` health check for this provider: the plugin's last `Status`
    /// (asked anew once it is a minute old, or a second after a failure) answered healthy,
    /// in API version v2, with a key id.
    pub async fn check(&self) -> Result<(), String> {
        let current = self.current_key_id().await;
        let status = self.status()?;
        match (&status.failure, current) {
            (Some(failure), _) => Err(failure.clone()),
            (None, Err(err)) => Err(err),
            (None, Ok(_)) => Ok(()),
        }
    }

    /// A new seed, encrypted by the plugin while its `Status` gives `status_key_id`.
    async fn generate(&self, status_key_id: &str) -> Result<Arc<WriteSeed>, String> {
        let seed = random::<SEED_LEN>()?;
        let answer: api::EncryptResponse = self
            .plugin
            .call(
                api::ENCRYPT_PATH,
                api::EncryptRequest {
                    plaintext: seed.to_vec(),
                    uid: uuid::Uuid::new_v4().to_string(),
                },
            )
            .await
            .map_err(|err| format!("failed to encrypt DEK, error: {err}"))?;
        let header = EncryptedObject {
            // Any non-empty value, to validate the header alone.
            encrypted_data: vec![0],
            key_id: answer.key_id,
            encrypted_dek_source: answer.ciphertext,
            annotations: answer.annotations.into_iter().collect(),
            encrypted_dek_source_type: SourceType::HkdfSha256XnonceAesGcmSeed as i32,
        };
        header.validate()?;
        let opened = Arc::new(Opened::new(SourceType::HkdfSha256XnonceAesGcmSeed, &seed)?);
        // Reads of what this seed writes need not ask the plugin.
        self.opened
            .lock()
            .map_err(|_| poisoned())?
            .insert(header.seed_key(), opened.clone());
        *self.written_key_id.lock().map_err(|_| poisoned())? = Some(header.key_id.clone());
        Ok(Arc::new(WriteSeed {
            opened,
            header: EncryptedObject {
                encrypted_data: Vec::new(),
                ..header
            },
            status_key_id: status_key_id.to_string(),
        }))
    }

    /// `tenant`'s seed for writes under the plugin's current key id.
    async fn write_seed(&self, tenant: &str) -> Result<Arc<WriteSeed>, String> {
        let key_id = self.current_key_id().await?;
        loop {
            let cell = self
                .writers
                .lock()
                .map_err(|_| poisoned())?
                .entry(tenant.to_string())
                .or_default()
                .clone();
            let seed = cell
                .get_or_try_init(|| self.generate(&key_id))
                .await?
                .clone();
            if seed.status_key_id == key_id {
                return Ok(seed);
            }
            // The key-encryption key rotated: a new seed, encrypted under the new one (the
            // first writer to see it replaces the cell; the others then use the new one).
            let mut writers = self.writers.lock().map_err(|_| poisoned())?;
            if writers
                .get(tenant)
                .is_some_and(|current| Arc::ptr_eq(current, &cell))
            {
                writers.insert(tenant.to_string(), Arc::default());
            }
        }
    }

    /// The stored form of `plain`, written by `tenant` under storage key `context`.
    pub async fn seal(&self, tenant: &str, plain: &[u8], context: &[u8]) -> Result<Bytes, String> {
        let seed = self.write_seed(tenant).await?;
        let object = EncryptedObject {
            encrypted_data: seed.opened.seal(plain, context)?,
            ..seed.header.clone()
        };
        let mut out = self.prefix.clone();
        object
            .encode(&mut out)
            .map_err(|err| format!("encoding the encrypted object: {err}"))?;
        Ok(Bytes::from(out))
    }

    /// The value of a stored one (prefix included) read at storage key `context`, and whether
    /// it was written under another key id than the plugin's current one.
    pub async fn open(&self, stored: &[u8], context: &[u8]) -> Result<(Vec<u8>, bool), String> {
        let body = stored
            .strip_prefix(self.prefix.as_slice())
            .ok_or_else(|| "not written by this provider".to_string())?;
        let object = EncryptedObject::decode(body)
            .map_err(|err| format!("not an encrypted object: {err}"))?;
        let source = object.validate()?;
        let seed_key = object.seed_key();
        let known = self
            .opened
            .lock()
            .map_err(|_| poisoned())?
            .get(&seed_key)
            .cloned();
        let opened = match known {
            Some(opened) => opened,
            None => {
                let answer: api::DecryptResponse = self
                    .plugin
                    .call(
                        api::DECRYPT_PATH,
                        api::DecryptRequest {
                            ciphertext: object.encrypted_dek_source.clone(),
                            uid: uuid::Uuid::new_v4().to_string(),
                            key_id: object.key_id.clone(),
                            annotations: object.annotations.clone().into_iter().collect(),
                        },
                    )
                    .await
                    .map_err(|err| format!("failed to decrypt DEK, error: {err}"))?;
                let opened = Arc::new(Opened::new(source, &answer.plaintext)?);
                self.opened
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert(seed_key, opened.clone());
                opened
            }
        };
        let plain = opened.open(&object.encrypted_data, context)?;
        let written = self.written_key_id.lock().map_err(|_| poisoned())?.clone();
        let stale = self
            .key_id_for_reads()
            .await?
            .is_some_and(|current| current != object.key_id)
            && written.is_none_or(|written| written != object.key_id)
            || source != SourceType::HkdfSha256XnonceAesGcmSeed;
        Ok((plain, stale))
    }
}

#[cfg(test)]
mod tests;
