//! Upstream's value transformers for encryption at rest, byte for byte: a value written by a
//! provider is `k8s:enc:<provider>:v1:<key name>:` followed by
//!
//! - `aescbc`: a random 16-byte IV, then AES-CBC of the value with PKCS#7 padding;
//! - `aesgcm`: a random 12-byte nonce, then AES-GCM of the value with the storage key as
//!   authenticated data (so a value copied under another key does not open);
//! - `secretbox`: a random 24-byte nonce, then NaCl's secretbox (XSalsa20-Poly1305, the tag
//!   first);
//!
//! and `identity` writes the value as it is; a `kms` provider's values
//! (`k8s:enc:kms:v2:<name>:`) are sealed and opened by its envelope (`super::kms`). Reads pick
//! the transformer by prefix.
//!
//! One difference from upstream, on purpose: each tenant encrypts with keys of its own,
//! derived from the file's key by HKDF-SHA256 over the tenant's id, so one tenant's data keys
//! are never another's (the file's key is the key-encryption key of all of them).

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use bytes::Bytes;
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use crypto_secretbox::XSalsa20Poly1305;
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};

use std::collections::HashMap;
use std::sync::Arc;

use super::config::Provider;
use super::kms::KmsProvider;

/// What every encrypted value starts with.
pub const ENCRYPTED_PREFIX: &[u8] = b"k8s:enc:";
/// The salt of the per-tenant key derivation.
const DERIVATION_SALT: &[u8] = b"flotilla encryption at rest v1";

const CBC_IV_LEN: usize = 16;
const GCM_NONCE_LEN: usize = 12;
const SECRETBOX_NONCE_LEN: usize = 24;

type Aes192Gcm = AesGcm<aes::Aes192, U12>;

pub(super) enum Gcm {
    Aes128(Box<Aes128Gcm>),
    Aes192(Box<Aes192Gcm>),
    Aes256(Box<Aes256Gcm>),
}

enum Cipher {
    Identity,
    AesGcm(Gcm),
    AesCbc(Vec<u8>),
    Secretbox(Box<XSalsa20Poly1305>),
    /// A KMS v2 plugin's envelope, shared by every tenant (each with seeds of its own).
    Kms(Arc<KmsProvider>),
}

/// The configuration's `kms` providers by name, each dialled once for all tenants.
pub type KmsProviders = HashMap<String, Arc<KmsProvider>>;

/// One key of one provider.
pub struct Transformer {
    /// `k8s:enc:<provider>:v1:<name>:`; empty for identity.
    prefix: Vec<u8>,
    cipher: Cipher,
}

/// ring's HKDF output length.
struct Length(usize);

impl hkdf::KeyType for Length {
    fn len(&self) -> usize {
        self.0
    }
}

/// The tenant's own key derived from a file's key (same length).
pub fn derive(secret: &[u8], tenant: &str) -> Vec<u8> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, DERIVATION_SALT).extract(secret);
    let mut derived = vec![0u8; secret.len()];
    // The lengths used (16–32 bytes) are far below HKDF-SHA256's limit of 8160.
    if let Ok(okm) = prk.expand(&[tenant.as_bytes()], Length(secret.len())) {
        let _ = okm.fill(&mut derived);
    }
    derived
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| "no randomness for a nonce".to_string())?;
    Ok(bytes)
}

fn cbc_encrypt(key: &[u8], iv: &[u8; CBC_IV_LEN], plain: &[u8]) -> Result<Vec<u8>, String> {
    let bad = |_| "bad AES key length".to_string();
    Ok(match key.len() {
        16 => cbc::Encryptor::<aes::Aes128>::new_from_slices(key, iv)
            .map_err(bad)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        24 => cbc::Encryptor::<aes::Aes192>::new_from_slices(key, iv)
            .map_err(bad)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
        _ => cbc::Encryptor::<aes::Aes256>::new_from_slices(key, iv)
            .map_err(bad)?
            .encrypt_padded_vec_mut::<Pkcs7>(plain),
    })
}

fn cbc_decrypt(key: &[u8], iv: &[u8], sealed: &[u8]) -> Result<Vec<u8>, String> {
    let bad = |_| "bad AES key length".to_string();
    let padding = |_| "invalid PKCS#7 padding".to_string();
    match key.len() {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(key, iv)
            .map_err(bad)?
            .decrypt_padded_vec_mut::<Pkcs7>(sealed)
            .map_err(padding),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(key, iv)
            .map_err(bad)?
            .decrypt_padded_vec_mut::<Pkcs7>(sealed)
            .map_err(padding),
        _ => cbc::Decryptor::<aes::Aes256>::new_from_slices(key, iv)
            .map_err(bad)?
            .decrypt_padded_vec_mut::<Pkcs7>(sealed)
            .map_err(padding),
    }
}

impl Gcm {
    pub(super) fn new(key: &[u8]) -> Result<Gcm, String> {
        let bad = |_| "bad AES key length".to_string();
        Ok(match key.len() {
            16 => Gcm::Aes128(Box::new(Aes128Gcm::new_from_slice(key).map_err(bad)?)),
            24 => Gcm::Aes192(Box::new(Aes192Gcm::new_from_slice(key).map_err(bad)?)),
            _ => Gcm::Aes256(Box::new(Aes256Gcm::new_from_slice(key).map_err(bad)?)),
        })
    }

    fn seal(&self, nonce: &[u8], plain: &[u8], aad: &[u8]) -> Result<Vec<u8>, String> {
        let payload = Payload { msg: plain, aad };
        let nonce = aes_gcm::Nonce::from_slice(nonce);
        match self {
            Gcm::Aes128(c) => c.encrypt(nonce, payload),
            Gcm::Aes192(c) => c.encrypt(nonce, payload),
            Gcm::Aes256(c) => c.encrypt(nonce, payload),
        }
        .map_err(|_| "AES-GCM encryption failed".to_string())
    }

    pub(super) fn open(&self, nonce: &[u8], sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>, String> {
        let payload = Payload { msg: sealed, aad };
        let nonce = aes_gcm::Nonce::from_slice(nonce);
        match self {
            Gcm::Aes128(c) => c.decrypt(nonce, payload),
            Gcm::Aes192(c) => c.decrypt(nonce, payload),
            Gcm::Aes256(c) => c.decrypt(nonce, payload),
        }
        .map_err(|_| {
            "does not authenticate: corrupted, or written under another key or name".to_string()
        })
    }
}

impl Transformer {
    /// The transformers of one provider for one tenant, its keys in order.
    pub fn for_provider(
        provider: &Provider,
        tenant: &str,
        kms: &KmsProviders,
    ) -> Result<Vec<Transformer>, String> {
        let keyed = |kind: &str,
                     keys: &[(String, Vec<u8>)],
                     make: &dyn Fn(Vec<u8>) -> Result<Cipher, String>| {
            keys.iter()
                .map(|(name, secret)| {
                    Ok(Transformer {
                        prefix: format!("k8s:enc:{kind}:v1:{name}:").into_bytes(),
                        cipher: make(derive(secret, tenant))?,
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        };
        match provider {
            Provider::Identity => Ok(vec![Transformer {
                prefix: Vec::new(),
                cipher: Cipher::Identity,
            }]),
            Provider::AesGcm(keys) => {
                keyed("aesgcm", keys, &|key| Ok(Cipher::AesGcm(Gcm::new(&key)?)))
            }
            Provider::AesCbc(keys) => keyed("aescbc", keys, &|key| Ok(Cipher::AesCbc(key))),
            Provider::Secretbox(keys) => keyed("secretbox", keys, &|key| {
                XSalsa20Poly1305::new_from_slice(&key)
                    .map(|c| Cipher::Secretbox(Box::new(c)))
                    .map_err(|_| "bad secretbox key length".to_string())
            }),
            Provider::Kms(config) => {
                let provider = kms
                    .get(&config.name)
                    .ok_or_else(|| format!("no KMS provider named {:?}", config.name))?;
                Ok(vec![Transformer {
                    prefix: provider.prefix().to_vec(),
                    cipher: Cipher::Kms(provider.clone()),
                }])
            }
        }
    }

    /// The stored form of `plain`, written by `tenant` under storage key `context`.
    async fn seal(&self, tenant: &str, plain: &[u8], context: &[u8]) -> Result<Bytes, String> {
        let mut out = self.prefix.clone();
        match &self.cipher {
            Cipher::Identity => return Ok(Bytes::copy_from_slice(plain)),
            Cipher::Kms(provider) => return provider.seal(tenant, plain, context).await,
            Cipher::AesCbc(key) => {
                let iv = random::<CBC_IV_LEN>()?;
                out.extend_from_slice(&iv);
                out.extend(cbc_encrypt(key, &iv, plain)?);
            }
            Cipher::AesGcm(gcm) => {
                let nonce = random::<GCM_NONCE_LEN>()?;
                out.extend_from_slice(&nonce);
                out.extend(gcm.seal(&nonce, plain, context)?);
            }
            Cipher::Secretbox(cipher) => {
                let nonce = random::<SECRETBOX_NONCE_LEN>()?;
                out.extend_from_slice(&nonce);
                out.extend(
                    cipher
                        .encrypt(crypto_secretbox::Nonce::from_slice(&nonce), plain)
                        .map_err(|_| "secretbox encryption failed".to_string())?,
                );
            }
        }
        Ok(Bytes::from(out))
    }

    /// The plain value of a stored one this transformer wrote (prefix included), and whether
    /// its key is not the provider's current one.
    async fn open(&self, stored: &[u8], context: &[u8]) -> Result<(Vec<u8>, bool), String> {
        if let Cipher::Kms(provider) = &self.cipher {
            return provider.open(stored, context).await;
        }
        self.open_locally(stored, context)
            .map(|plain| (plain, false))
    }

    fn open_locally(&self, stored: &[u8], context: &[u8]) -> Result<Vec<u8>, String> {
        let body = &stored[self.prefix.len()..];
        let split = |len: usize| {
            (body.len() >= len)
                .then(|| body.split_at(len))
                .ok_or_else(|| "the stored value is too short".to_string())
        };
        match &self.cipher {
            Cipher::Identity => Ok(body.to_vec()),
            Cipher::Kms(_) => Err("a KMS envelope is opened by its provider".to_string()),
            Cipher::AesCbc(key) => {
                let (iv, sealed) = split(CBC_IV_LEN)?;
                if sealed.is_empty() || sealed.len() % CBC_IV_LEN != 0 {
                    return Err("the stored value is not a whole number of blocks".to_string());
                }
                cbc_decrypt(key, iv, sealed)
            }
            Cipher::AesGcm(gcm) => {
                let (nonce, sealed) = split(GCM_NONCE_LEN)?;
                gcm.open(nonce, sealed, context)
            }
            Cipher::Secretbox(cipher) => {
                let (nonce, sealed) = split(SECRETBOX_NONCE_LEN)?;
                cipher
                    .decrypt(crypto_secretbox::Nonce::from_slice(nonce), sealed)
                    .map_err(|_| {
                        "does not authenticate: corrupted, or written under another key".to_string()
                    })
            }
        }
    }
}

/// One rule's transformers for one tenant: the first writes; a read is opened by the one
/// whose prefix it carries (identity reads what carries none).
pub struct Transformers {
    tenant: String,
    all: Vec<Transformer>,
}

impl Transformers {
    /// Every key of every provider of a rule, in order.
    pub fn new(
        providers: &[Provider],
        tenant: &str,
        kms: &KmsProviders,
    ) -> Result<Transformers, String> {
        let mut all = Vec::new();
        for provider in providers {
            all.extend(Transformer::for_provider(provider, tenant, kms)?);
        }
        Ok(Transformers {
            tenant: tenant.to_string(),
            all,
        })
    }

    /// The stored form of a value written under storage key `context`.
    pub async fn write(&self, plain: &Bytes, context: &str) -> Result<Bytes, String> {
        match self.all.first() {
            Some(first) if !matches!(first.cipher, Cipher::Identity) => {
                first.seal(&self.tenant, plain, context.as_bytes()).await
            }
            _ => Ok(plain.clone()),
        }
    }

    /// The value of a stored one read at storage key `context`, and whether it is stale:
    /// read by another transformer than the one that writes (or under a key its provider
    /// no longer writes with), so to be written again.
    pub async fn read(&self, stored: &Bytes, context: &str) -> Result<(Bytes, bool), String> {
        if stored.starts_with(ENCRYPTED_PREFIX) {
            let Some((index, transformer)) = self
                .all
                .iter()
                .enumerate()
                .find(|(_, t)| !t.prefix.is_empty() && stored.starts_with(&t.prefix))
            else {
                let end = stored
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| **b == b':')
                    .nth(4)
                    .map_or(stored.len().min(64), |(i, _)| i + 1);
                return Err(format!(
                    "no configured provider reads values encrypted as {:?} (was its key removed from the encryption configuration?)",
                    String::from_utf8_lossy(&stored[..end])
                ));
            };
            return transformer
                .open(stored, context.as_bytes())
                .await
                .map(|(plain, stale)| (Bytes::from(plain), stale || index != 0));
        }
        if stored.is_empty() {
            return Ok((stored.clone(), false));
        }
        if let Some(index) = self
            .all
            .iter()
            .position(|t| matches!(t.cipher, Cipher::Identity))
        {
            return Ok((stored.clone(), index != 0));
        }
        Err(
            "the value is not encrypted and no identity provider is configured to read it"
                .to_string(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "/registry/a/core/secrets/default/s";

    fn keys(name: &str, len: usize) -> Vec<(String, Vec<u8>)> {
        vec![(name.to_string(), (0..len as u8).collect())]
    }

    #[tokio::test]
    async fn every_provider_round_trips_with_upstreams_prefix() {
        let value = Bytes::from_static(b"{\"data\":{\"password\":\"aHVudGVyMg==\"}}");
        for (provider, prefix) in [
            (Provider::AesCbc(keys("k1", 32)), "k8s:enc:aescbc:v1:k1:"),
            (Provider::AesCbc(keys("k1", 16)), "k8s:enc:aescbc:v1:k1:"),
            (Provider::AesGcm(keys("k2", 24)), "k8s:enc:aesgcm:v1:k2:"),
            (Provider::AesGcm(keys("k2", 32)), "k8s:enc:aesgcm:v1:k2:"),
            (
                Provider::Secretbox(keys("k3", 32)),
                "k8s:enc:secretbox:v1:k3:",
            ),
        ] {
            let transformers =
                Transformers::new(&[provider], "a", &KmsProviders::new()).expect("valid");
            let stored = transformers.write(&value, KEY).await.expect("sealed");
            assert!(stored.starts_with(prefix.as_bytes()), "{stored:?}");
            assert!(!stored.windows(8).any(|w| w == b"password"), "{prefix}");
            assert_eq!(
                transformers.read(&stored, KEY).await.expect("opened"),
                (value.clone(), false)
            );
            // A random nonce or IV: the same value never looks the same twice.
            assert_ne!(
                transformers.write(&value, KEY).await.expect("sealed"),
                stored
            );
        }
    }

    #[tokio::test]
    async fn cbc_pads_as_upstream() {
        let t = Transformers::new(
            &[Provider::AesCbc(keys("k", 32))],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        // 16 bytes of value: IV + two blocks (a whole block of padding).
        let stored = t
            .write(&Bytes::from_static(&[7; 16]), KEY)
            .await
            .expect("sealed");
        assert_eq!(stored.len(), "k8s:enc:aescbc:v1:k:".len() + 16 + 32);
        let stored = t
            .write(&Bytes::from_static(&[7; 15]), KEY)
            .await
            .expect("sealed");
        assert_eq!(stored.len(), "k8s:enc:aescbc:v1:k:".len() + 16 + 16);
    }

    #[tokio::test]
    async fn tenants_have_keys_of_their_own() {
        let provider = Provider::AesGcm(keys("k", 32));
        let a = Transformers::new(std::slice::from_ref(&provider), "a", &KmsProviders::new())
            .expect("valid");
        let b = Transformers::new(&[provider], "b", &KmsProviders::new()).expect("valid");
        let stored = a
            .write(&Bytes::from_static(b"secret"), KEY)
            .await
            .expect("sealed");
        assert!(
            b.read(&stored, KEY).await.is_err(),
            "tenant b opened tenant a's value"
        );
        assert_ne!(derive(&[1; 32], "a"), derive(&[1; 32], "b"));
        assert_eq!(derive(&[1; 32], "a"), derive(&[1; 32], "a"));
        assert_eq!(derive(&[1; 16], "a").len(), 16);
    }

    #[tokio::test]
    async fn gcm_binds_the_storage_key() {
        let t = Transformers::new(
            &[Provider::AesGcm(keys("k", 32))],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        let stored = t
            .write(&Bytes::from_static(b"secret"), KEY)
            .await
            .expect("sealed");
        let err = t
            .read(&stored, "/registry/a/core/secrets/default/other")
            .await
            .expect_err("moved");
        assert!(err.contains("does not authenticate"), "{err}");
    }

    #[tokio::test]
    async fn reads_pick_by_prefix_and_identity_reads_plain() {
        let old = Provider::AesCbc(keys("old", 32));
        let writer_before =
            Transformers::new(std::slice::from_ref(&old), "a", &KmsProviders::new())
                .expect("valid");
        let before = writer_before
            .write(&Bytes::from_static(b"v1"), KEY)
            .await
            .expect("sealed");
        // Rotation: a new first provider; the old key still reads, and plain text too.
        let rotated = Transformers::new(
            &[
                Provider::Secretbox(keys("new", 32)),
                old,
                Provider::Identity,
            ],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        // Both are stale: read by another transformer than the writing one.
        let v1 = (Bytes::from("v1"), true);
        assert_eq!(rotated.read(&before, KEY).await.expect("old key"), v1);
        let plain = Bytes::from_static(b"{}");
        assert_eq!(
            rotated.read(&plain, KEY).await.expect("plain"),
            (plain.clone(), true)
        );
        let after = rotated
            .write(&Bytes::from_static(b"v2"), KEY)
            .await
            .expect("sealed");
        assert!(after.starts_with(b"k8s:enc:secretbox:v1:new:"));
        let v2 = (Bytes::from("v2"), false);
        assert_eq!(rotated.read(&after, KEY).await.expect("new key"), v2);
        // Without identity, plain text is refused; an unknown key is named.
        let strict = Transformers::new(
            &[Provider::AesGcm(keys("g", 32))],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        assert!(strict.read(&Bytes::from_static(b"{}"), KEY).await.is_err());
        let err = strict.read(&before, KEY).await.expect_err("unknown key");
        assert!(err.contains("k8s:enc:aescbc:v1:old:"), "{err}");
        // Identity first writes plain and still reads what was encrypted.
        let off = Transformers::new(
            &[Provider::Identity, Provider::AesCbc(keys("old", 32))],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        assert_eq!(
            off.write(&Bytes::from_static(b"v3"), KEY)
                .await
                .expect("plain"),
            "v3"
        );
        assert_eq!(off.read(&before, KEY).await.expect("old key"), v1);
        let v3 = Bytes::from_static(b"v3");
        assert_eq!(
            off.read(&v3, KEY).await.expect("plain"),
            (v3.clone(), false)
        );
    }

    #[tokio::test]
    async fn damaged_values_are_errors_not_panics() {
        let t = Transformers::new(
            &[
                Provider::AesCbc(keys("c", 32)),
                Provider::AesGcm(keys("g", 32)),
                Provider::Secretbox(keys("s", 32)),
            ],
            "a",
            &KmsProviders::new(),
        )
        .expect("valid");
        for prefix in [
            "k8s:enc:aescbc:v1:c:",
            "k8s:enc:aesgcm:v1:g:",
            "k8s:enc:secretbox:v1:s:",
        ] {
            for tail in [&b""[..], b"short", &[0u8; 40], &[0u8; 33]] {
                let mut stored = prefix.as_bytes().to_vec();
                stored.extend_from_slice(tail);
                assert!(
                    t.read(&Bytes::from(stored), KEY).await.is_err(),
                    "{prefix} {tail:?}"
                );
            }
        }
    }
}
