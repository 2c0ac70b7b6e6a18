//! Envelope encryption of stored values under a key-encryption key (KEK): upstream's
//! `aesgcm` value transformer (`k8s:enc:aesgcm:v1:<key name>:` + nonce + sealed bytes, the
//! storage key as authenticated data), used for every record that holds a private key.
//!
//! The storage key is bound to the ciphertext, so a sealed value moved under another key (one
//! tenant's CA record copied over another's) does not open. Values written before sealing
//! existed open as [`Opened::Plain`]; their readers write them back sealed.

use std::fmt;

use base64::Engine;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// What every sealed value starts with (then the key's name and `:`).
const PREFIX: &[u8] = b"k8s:enc:aesgcm:v1:";
/// The key's length: AES-256.
pub const KEY_LEN: usize = 32;

/// Failures loading a key or opening a sealed value.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    /// The key file does not hold base64 of 32 bytes.
    #[error("a key-encryption key is base64 of {KEY_LEN} random bytes; this is {0}")]
    BadKey(String),
    /// The value was sealed under a key this server does not have.
    #[error(
        "{context} was sealed under key {sealed_with}, and this server has key {have} (a different --key-encryption-key-file?)"
    )]
    WrongKey {
        /// The storage key of the value.
        context: String,
        /// The name in the value's prefix.
        sealed_with: String,
        /// This server's key name.
        have: String,
    },
    /// The sealed bytes did not authenticate: corrupted, truncated, or moved from another key.
    #[error("{0} does not open under the key-encryption key: corrupted, or copied from elsewhere")]
    Corrupt(String),
    /// The system's random source failed.
    #[error("no randomness for a nonce")]
    Random,
}

/// A key-encryption key: seals and opens stored values.
pub struct KeyEncryptionKey {
    name: String,
    key: LessSafeKey,
    random: SystemRandom,
}

impl fmt::Debug for KeyEncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEncryptionKey")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A value read back from storage.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened<'a> {
    /// It was sealed; these are its plain bytes.
    Sealed(Vec<u8>),
    /// It was stored before sealing existed: write it back sealed.
    Plain(&'a [u8]),
}

impl Opened<'_> {
    /// The plain bytes, either way.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Opened::Sealed(bytes) => bytes,
            Opened::Plain(bytes) => bytes,
        }
    }

    /// Whether the stored form is plaintext and should be rewritten.
    pub fn is_plain(&self) -> bool {
        matches!(self, Opened::Plain(_))
    }
}

impl KeyEncryptionKey {
    /// A key from its raw bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        if bytes.len() != KEY_LEN {
            return Err(EnvelopeError::BadKey(format!("{} bytes", bytes.len())));
        }
        let fingerprint = ring::digest::digest(&ring::digest::SHA256, bytes);
        let name: String = fingerprint.as_ref()[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let key = UnboundKey::new(&AES_256_GCM, bytes)
            .map_err(|_| EnvelopeError::BadKey("refused by AES-256-GCM".into()))?;
        Ok(KeyEncryptionKey {
            name: format!("kek-{name}"),
            key: LessSafeKey::new(key),
            random: SystemRandom::new(),
        })
    }

    /// A key from the text of a key file: base64 of [`KEY_LEN`] bytes (upstream's
    /// `EncryptionConfiguration` secret form), surrounding whitespace ignored.
    pub fn from_file_text(text: &str) -> Result<Self, EnvelopeError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| EnvelopeError::BadKey("not base64".into()))?;
        Self::from_bytes(&bytes)
    }

    /// The text of a new key file: base64 of fresh random bytes.
    pub fn generate_file_text() -> Result<String, EnvelopeError> {
        let mut bytes = [0u8; KEY_LEN];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| EnvelopeError::Random)?;
        Ok(format!(
            "{}\n",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        ))
    }

    /// A key that lives only as long as this process: for servers whose store is thrown
    /// away with them (tests, in-process embedders).
    pub fn ephemeral() -> Result<Self, EnvelopeError> {
        Self::from_file_text(&Self::generate_file_text()?)
    }

    /// The key's name, a fingerprint that says nothing of the key itself.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Seals `plain`, bound to the storage key `context`.
    pub fn seal(&self, plain: &[u8], context: &str) -> Result<Vec<u8>, EnvelopeError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| EnvelopeError::Random)?;
        let mut body = plain.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut body,
            )
            .map_err(|_| EnvelopeError::Corrupt(context.to_string()))?;
        let mut sealed =
            Vec::with_capacity(PREFIX.len() + self.name.len() + 1 + NONCE_LEN + body.len());
        sealed.extend_from_slice(PREFIX);
        sealed.extend_from_slice(self.name.as_bytes());
        sealed.push(b':');
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&body);
        Ok(sealed)
    }

    /// Opens a stored value of storage key `context`: sealed ones are decrypted and
    /// authenticated, plaintext ones (written before sealing) come back as they are.
    pub fn open<'a>(&self, stored: &'a [u8], context: &str) -> Result<Opened<'a>, EnvelopeError> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(Opened::Plain(stored));
        };
        let corrupt = || EnvelopeError::Corrupt(context.to_string());
        let colon = rest.iter().position(|b| *b == b':').ok_or_else(corrupt)?;
        let (name, rest) = (&rest[..colon], &rest[colon + 1..]);
        if name != self.name.as_bytes() {
            return Err(EnvelopeError::WrongKey {
                context: context.to_string(),
                sealed_with: String::from_utf8_lossy(name).into_owned(),
                have: self.name.clone(),
            });
        }
        if rest.len() < NONCE_LEN {
            return Err(corrupt());
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt())?;
        let mut body = body.to_vec();
        let plain_len = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut body)
            .map_err(|_| corrupt())?
            .len();
        body.truncate(plain_len);
        Ok(Opened::Sealed(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> KeyEncryptionKey {
        KeyEncryptionKey::ephemeral().expect("key")
    }

    #[test]
    fn sealed_values_open_under_their_storage_key_only() {
        let kek = key();
        let sealed = kek
            .seal(b"-----BEGIN PRIVATE KEY-----", "/flotilla/tenants/a")
            .expect("seal");
        assert!(sealed.starts_with(b"k8s:enc:aesgcm:v1:kek-"));
        assert!(
            !sealed.windows(11).any(|w| w == b"PRIVATE KEY"),
            "the plaintext is not in the sealed bytes"
        );
        assert_eq!(
            kek.open(&sealed, "/flotilla/tenants/a").expect("open"),
            Opened::Sealed(b"-----BEGIN PRIVATE KEY-----".to_vec())
        );
        assert!(matches!(
            kek.open(&sealed, "/flotilla/tenants/b"),
            Err(EnvelopeError::Corrupt(_))
        ));
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let kek = key();
        let a = kek.seal(b"same", "k").expect("seal");
        let b = kek.seal(b"same", "k").expect("seal");
        assert_ne!(a, b, "each seal draws its own nonce");
    }

    #[test]
    fn plaintext_opens_as_plain_and_tampering_is_refused() {
        let kek = key();
        let plain = br#"{"id":"a"}"#;
        assert_eq!(kek.open(plain, "k").expect("open"), Opened::Plain(plain));
        let mut sealed = kek.seal(plain, "k").expect("seal");
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert!(matches!(
            kek.open(&sealed, "k"),
            Err(EnvelopeError::Corrupt(_))
        ));
        let truncated = &sealed[..PREFIX.len() + 13 + 4];
        assert!(kek.open(truncated, "k").is_err());
    }

    #[test]
    fn another_key_is_named_in_the_error() {
        let sealed = key().seal(b"x", "k").expect("seal");
        let err = key().open(&sealed, "k").expect_err("other key");
        assert!(matches!(err, EnvelopeError::WrongKey { .. }), "{err}");
        assert!(err.to_string().contains("--key-encryption-key-file"));
    }

    #[test]
    fn key_files_are_base64_of_32_bytes() {
        let text = KeyEncryptionKey::generate_file_text().expect("text");
        let a = KeyEncryptionKey::from_file_text(&text).expect("key");
        let b = KeyEncryptionKey::from_file_text(&format!("  {text}  ")).expect("key");
        assert_eq!(a.name(), b.name());
        let sealed = a.seal(b"v", "k").expect("seal");
        assert_eq!(b.open(&sealed, "k").expect("open").bytes(), b"v");
        assert!(KeyEncryptionKey::from_file_text("c2hvcnQ=").is_err());
        assert!(KeyEncryptionKey::from_file_text("not base64!").is_err());
    }
}
