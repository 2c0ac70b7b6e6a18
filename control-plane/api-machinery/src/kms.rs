//! The KMS v2 plugin API (`k8s.io/kms/apis/v2`, package `v2`): the messages an API server and
//! a KMS plugin exchange over gRPC on a unix socket, the service's method paths, and
//! upstream's limits on what a plugin answers. Both ends use these: the API server's `kms`
//! encryption provider and Flotilla's AWS KMS plugin.

use std::collections::HashMap;

/// The gRPC service every method path is under.
pub const SERVICE: &str = "v2.KeyManagementService";
/// `rpc Status(StatusRequest) returns (StatusResponse)`: polled.
pub const STATUS_PATH: &str = "/v2.KeyManagementService/Status";
/// `rpc Decrypt(DecryptRequest) returns (DecryptResponse)`.
pub const DECRYPT_PATH: &str = "/v2.KeyManagementService/Decrypt";
/// `rpc Encrypt(EncryptRequest) returns (EncryptResponse)`.
pub const ENCRYPT_PATH: &str = "/v2.KeyManagementService/Encrypt";

/// The API version a plugin reports in [`StatusResponse::version`].
pub const API_VERSION: &str = "v2";
/// What [`StatusResponse::healthz`] says when the plugin is healthy.
pub const HEALTHY: &str = "ok";

/// Upstream's limit on a key id (`KeyIDMaxSize`).
pub const KEY_ID_MAX_BYTES: usize = 1024;
/// Upstream's limit on an encrypted DEK or seed (`encryptedDEKSourceMaxSize`).
pub const ENCRYPTED_DEK_MAX_BYTES: usize = 1024;
/// Upstream's limit on the annotations' keys and values together (`annotationsMaxSize`).
pub const ANNOTATIONS_MAX_BYTES: usize = 32 * 1024;

/// `StatusRequest`: empty.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

/// `StatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    /// The plugin's API version: must be the provider's configured `apiVersion`.
    #[prost(string, tag = "1")]
    pub version: String,
    /// `ok`, or why not (shown on the API server's health checks).
    #[prost(string, tag = "2")]
    pub healthz: String,
    /// The current key-encryption key: a change makes the API server encrypt a new seed.
    #[prost(string, tag = "3")]
    pub key_id: String,
}

/// `DecryptRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DecryptRequest {
    /// What [`EncryptResponse::ciphertext`] was.
    #[prost(bytes = "vec", tag = "1")]
    pub ciphertext: Vec<u8>,
    /// A unique id of the request, for the plugin's logs.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// The key id the plugin answered the encryption with.
    #[prost(string, tag = "3")]
    pub key_id: String,
    /// The annotations the plugin answered the encryption with.
    #[prost(map = "string, bytes", tag = "4")]
    pub annotations: HashMap<String, Vec<u8>>,
}

/// `DecryptResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DecryptResponse {
    /// The decrypted data.
    #[prost(bytes = "vec", tag = "1")]
    pub plaintext: Vec<u8>,
}

/// `EncryptRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EncryptRequest {
    /// The data to encrypt (for the API server, a data-encryption seed).
    #[prost(bytes = "vec", tag = "1")]
    pub plaintext: Vec<u8>,
    /// A unique id of the request, for the plugin's logs.
    #[prost(string, tag = "2")]
    pub uid: String,
}

/// `EncryptResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EncryptResponse {
    /// The encrypted data.
    #[prost(bytes = "vec", tag = "1")]
    pub ciphertext: Vec<u8>,
    /// The key-encryption key used: the remote KMS key, never a local one.
    #[prost(string, tag = "2")]
    pub key_id: String,
    /// Metadata stored beside the encrypted data, in plain text.
    #[prost(map = "string, bytes", tag = "3")]
    pub annotations: HashMap<String, Vec<u8>>,
}

/// Upstream's `ValidateKeyID`: present and at most 1 KiB.
pub fn validate_key_id(key_id: &str) -> Result<(), String> {
    if key_id.is_empty() {
        return Err("keyID is empty".to_string());
    }
    if key_id.len() > KEY_ID_MAX_BYTES {
        return Err(format!(
            "keyID is {} bytes, which exceeds the max size of {KEY_ID_MAX_BYTES}",
            key_id.len()
        ));
    }
    Ok(())
}

/// Upstream's `validateEncryptedDEKSource`: present and at most 1 KiB.
pub fn validate_encrypted_dek(encrypted: &[u8]) -> Result<(), String> {
    if encrypted.is_empty() {
        return Err("encrypted DEK source is empty".to_string());
    }
    if encrypted.len() > ENCRYPTED_DEK_MAX_BYTES {
        return Err(format!(
            "encrypted DEK source is {} bytes, which exceeds the max size of {ENCRYPTED_DEK_MAX_BYTES}",
            encrypted.len()
        ));
    }
    Ok(())
}

/// Upstream's `validateAnnotations`: every key a DNS-1123 subdomain (a fully qualified name),
/// keys and values under 32 KiB in all.
pub fn validate_annotations(annotations: &HashMap<String, Vec<u8>>) -> Result<(), String> {
    let mut total = 0;
    for (key, value) in annotations {
        if let Some(why) = crate::names::is_dns1123_subdomain(key).first() {
            return Err(format!("annotation key {key:?} is invalid: {why}"));
        }
        total += key.len() + value.len();
    }
    if total > ANNOTATIONS_MAX_BYTES {
        return Err(format!(
            "annotations exceeds max size of {ANNOTATIONS_MAX_BYTES}, actual size {total}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The bytes a Go plugin writes for an `EncryptResponse` (fields 1, 2 and one map entry).
    #[test]
    fn messages_use_upstreams_field_numbers() {
        let response = EncryptResponse {
            ciphertext: b"c".to_vec(),
            key_id: "k".to_string(),
            annotations: HashMap::from([("a.io".to_string(), b"v".to_vec())]),
        };
        let bytes = response.encode_to_vec();
        assert_eq!(
            bytes,
            [
                0x0a, 1, b'c', // ciphertext
                0x12, 1, b'k', // key_id
                0x1a, 9, 0x0a, 4, b'a', b'.', b'i', b'o', 0x12, 1, b'v', // annotations
            ]
        );
        assert_eq!(
            EncryptResponse::decode(bytes.as_slice()).ok(),
            Some(response)
        );
    }

    #[test]
    fn limits_are_upstreams() {
        assert!(validate_key_id("").is_err());
        assert!(validate_key_id(&"k".repeat(1025)).is_err());
        assert!(validate_key_id("arn:aws:kms:us-east-1:000000000000:key/1").is_ok());
        assert!(validate_encrypted_dek(&[]).is_err());
        assert!(validate_encrypted_dek(&[0; 1025]).is_err());
        let bad = HashMap::from([("Not_A_Name".to_string(), vec![])]);
        assert!(validate_annotations(&bad).is_err());
        let big = HashMap::from([("a.io".to_string(), vec![0; ANNOTATIONS_MAX_BYTES])]);
        assert!(validate_annotations(&big).is_err());
        let fine = HashMap::from([("version.encryption.remote.io".to_string(), b"1".to_vec())]);
        assert!(validate_annotations(&fine).is_ok());
    }
}
