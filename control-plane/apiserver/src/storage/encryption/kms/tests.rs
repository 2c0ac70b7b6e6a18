//! The envelope's formats: what a value looks like stored, and that it opens only where it
//! was written. (The plugin's side is tested against the real plugin and LocalStack's KMS in
//! the e2e suite `kms`.)

use super::*;

const KEY: &[u8] = b"/registry/a/core/secrets/default/s";

fn header(seed: &[u8]) -> EncryptedObject {
    EncryptedObject {
        encrypted_data: Vec::new(),
        key_id: "arn:aws:kms:us-east-1:000000000000:key/k".to_string(),
        encrypted_dek_source: seed.iter().map(|b| b ^ 0x5a).collect(),
        annotations: BTreeMap::new(),
        encrypted_dek_source_type: SourceType::HkdfSha256XnonceAesGcmSeed as i32,
    }
}

#[test]
fn a_value_under_a_seed_is_info_nonce_and_sealed_data() {
    let seed = [7u8; SEED_LEN];
    let opened = Opened::new(SourceType::HkdfSha256XnonceAesGcmSeed, &seed).expect("seed");
    let data = opened.seal(b"hunter2", KEY).expect("sealed");
    // 32 bytes of info, 12 of nonce, the value and GCM's 16-byte tag.
    assert_eq!(data.len(), SEED_LEN + GCM_NONCE_LEN + 7 + 16);
    assert_eq!(opened.open(&data, KEY).expect("opened"), b"hunter2");
    // Each value has a key of its own: the same value never looks the same twice.
    assert_ne!(opened.seal(b"hunter2", KEY).expect("sealed"), data);
    // Bound to its storage key, and to its seed.
    assert!(
        opened
            .open(&data, b"/registry/a/core/secrets/default/t")
            .is_err()
    );
    let other =
        Opened::new(SourceType::HkdfSha256XnonceAesGcmSeed, &[8u8; SEED_LEN]).expect("seed");
    assert!(other.open(&data, KEY).is_err());
    // Damaged or short data is an error, not a panic.
    for short in [&data[..0], &data[..31], &data[..44], &data[..50]] {
        assert!(opened.open(short, KEY).is_err());
    }
    assert!(Opened::new(SourceType::HkdfSha256XnonceAesGcmSeed, &[1; 16]).is_err());
}

#[test]
fn the_older_form_opens_with_the_key_itself() {
    let key = [3u8; 32];
    let nonce = [9u8; GCM_NONCE_LEN];
    let sealed = Aes256Gcm::new_from_slice(&key)
        .expect("key")
        .encrypt(
            aes_gcm::Nonce::from_slice(&nonce),
            Payload {
                msg: b"v",
                aad: KEY,
            },
        )
        .expect("sealed");
    let mut data = nonce.to_vec();
    data.extend(sealed);
    let opened = Opened::new(SourceType::AesGcmKey, &key).expect("key");
    assert_eq!(opened.open(&data, KEY).expect("opened"), b"v");
    assert!(
        opened.seal(b"v", KEY).is_err(),
        "never written in this form"
    );
}

#[test]
fn encrypted_objects_are_validated_as_upstream() {
    let mut object = header(&[1; SEED_LEN]);
    object.encrypted_data = vec![1];
    assert_eq!(
        object.validate(),
        Ok(SourceType::HkdfSha256XnonceAesGcmSeed)
    );
    let decoded = EncryptedObject::decode(object.encode_to_vec().as_slice()).expect("decoded");
    assert_eq!(decoded, object);
    for (broken, wanted) in [
        (
            EncryptedObject {
                encrypted_data: Vec::new(),
                ..object.clone()
            },
            "encrypted data is empty",
        ),
        (
            EncryptedObject {
                key_id: String::new(),
                ..object.clone()
            },
            "keyID is empty",
        ),
        (
            EncryptedObject {
                encrypted_dek_source: vec![0; 1025],
                ..object.clone()
            },
            "exceeds the max size",
        ),
        (
            EncryptedObject {
                encrypted_dek_source_type: 7,
                ..object.clone()
            },
            "unknown encryptedDEKSourceType: 7",
        ),
    ] {
        let err = broken.validate().expect_err(wanted);
        assert!(err.contains(wanted), "{err}");
    }
    // The seed's identity ignores the data.
    let other_data = EncryptedObject {
        encrypted_data: vec![2, 3],
        ..object.clone()
    };
    assert_eq!(other_data.seed_key(), object.seed_key());
    assert_ne!(header(&[2; SEED_LEN]).seed_key(), object.seed_key());
}

/// A provider whose plugin is not there: a write fails with a reason naming the socket, and
/// a value whose seed it has not opened cannot be read.
#[tokio::test]
async fn without_its_plugin_a_write_fails_and_names_the_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("absent.sock");
    let provider = KmsProvider::new(&Kms {
        name: "aws".to_string(),
        socket: socket.clone(),
        timeout: Duration::from_millis(500),
    });
    assert_eq!(provider.prefix(), b"k8s:enc:kms:v2:aws:");
    let err = provider.seal("a", b"v", KEY).await.expect_err("no plugin");
    assert!(err.contains(&socket.display().to_string()), "{err}");
    let mut object = header(&[1; SEED_LEN]);
    object.encrypted_data = vec![0; 60];
    let mut stored = provider.prefix().to_vec();
    stored.extend(object.encode_to_vec());
    let err = provider.open(&stored, KEY).await.expect_err("no plugin");
    assert!(err.starts_with("failed to decrypt DEK"), "{err}");
    assert!(
        provider
            .open(b"k8s:enc:kms:v2:aws:\xff\xff", KEY)
            .await
            .is_err()
    );
}
