//! The cluster backup file, sans IO: one JSON header line, then the payload, one JSON entry
//! per line. The header says what the file is (`flotilla.dev/v1` `ClusterBackup`, format
//! version), which cluster at which store revision, the key-encryption key its values are
//! sealed under, counts, and the payload's length and SHA-256; so a truncated, corrupted or
//! foreign file is refused from the header and a hash, before any value is opened.
//!
//! ```text
//! {"apiVersion":"flotilla.dev/v1","kind":"ClusterBackup","formatVersion":1,"cluster":{…},"revision":41234,…}
//! {"key":"cluster","value":"azhzOmVuYzph…"}
//! {"key":"tenant","value":"…"}
//! {"key":"nodepools/workers","value":"…"}
//! {"key":"objects/core/configmaps/default/settings","value":"…"}
//! ```
//!
//! Entry keys are `cluster` (the management record), `tenant` (the PKI: client CA,
//! service-account key, front-proxy CA), `nodepools/NAME` and `objects/KEY`, KEY relative to
//! the cluster's storage prefix, so a restore can put it under another. Every value is
//! base64 of the value sealed under the key-encryption key (upstream's `k8s:enc:aesgcm:v1:`
//! form), bound to [`seal_context`]: the cluster id, the revision and the entry key.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The header's `apiVersion`.
pub const API_VERSION: &str = "flotilla.dev/v1";
/// The header's `kind`.
pub const KIND: &str = "ClusterBackup";
/// The one format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The media type of the file on the wire.
pub const MEDIA_TYPE: &str = "application/octet-stream";

/// The entry holding the cluster's management record.
pub const CLUSTER_ENTRY: &str = "cluster";
/// The entry holding the cluster's tenant record (its PKI).
pub const TENANT_ENTRY: &str = "tenant";
/// The prefix of the node pools' entries.
pub const NODE_POOL_PREFIX: &str = "nodepools/";
/// The prefix of the objects' entries.
pub const OBJECT_PREFIX: &str = "objects/";

/// Why a file is not a backup this code can restore. Each message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The first line is not a backup header.
    #[error("not a Flotilla cluster backup: {0}")]
    NotABackup(String),
    /// A backup of another format version.
    #[error("the backup has format version {found}; this service reads version {FORMAT_VERSION}")]
    UnsupportedVersion {
        /// The file's version.
        found: u64,
    },
    /// The file ends inside its header line.
    #[error("the backup is truncated: it ends inside its header ({0} bytes)")]
    TruncatedHeader(usize),
    /// The file is shorter than its header says.
    #[error("the backup is truncated: it holds {have} of its {want} payload bytes")]
    Truncated {
        /// Payload bytes present.
        have: u64,
        /// Payload bytes the header announces.
        want: u64,
    },
    /// The file is longer than its header says.
    #[error("the backup is corrupted: {extra} bytes follow its payload")]
    TrailingBytes {
        /// How many.
        extra: u64,
    },
    /// The payload's hash is not the header's.
    #[error(
        "the backup is corrupted: its payload's SHA-256 is {actual}, its header says {expected}"
    )]
    Checksum {
        /// The hash of the bytes present.
        actual: String,
        /// The header's.
        expected: String,
    },
    /// The header is a backup header with a field missing or malformed.
    #[error("the backup's header is invalid: {0}")]
    BadHeader(String),
    /// A payload line is not an entry.
    #[error("the backup's entry {line} is invalid: {reason}")]
    BadEntry {
        /// 1-based line of the payload.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The entries do not add up to what the header says.
    #[error("the backup is inconsistent: {0}")]
    Inconsistent(String),
}

/// The cluster a backup holds, as its header names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackedUpCluster {
    /// Its name in its account.
    pub name: String,
    /// Its id (the `/clusters/{id}` of its URL and its storage prefix).
    pub id: String,
    /// The account it belonged to.
    pub account_id: String,
    /// Its Kubernetes minor version.
    pub kubernetes_version: String,
}

/// The first line of a backup file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// [`FORMAT_VERSION`] when written by this code.
    pub format_version: u32,
    /// The cluster.
    pub cluster: BackedUpCluster,
    /// The store revision every entry was read at: the backup holds exactly the writes at or
    /// below it.
    pub revision: i64,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// The version of the service that wrote it.
    pub service_version: String,
    /// The name (a fingerprint) of the key-encryption key the values are sealed under.
    pub key_encryption_key: String,
    /// How many entries the payload holds.
    pub entries: usize,
    /// How many of them are objects (objects and their allocations, as the object quota
    /// counts them).
    pub objects: usize,
    /// Objects per resource (`configmaps`, `deployments.apps`), for a reader of the file.
    pub resources: BTreeMap<String, usize>,
    /// The payload's length in bytes.
    pub payload_bytes: u64,
    /// The payload's SHA-256 (lowercase hex).
    pub payload_sha256: String,
    /// The payload's SHA-256 sealed under the key-encryption key (base64), bound to
    /// [`digest_context`]: only a holder of the key could have written this payload.
    pub payload_seal: String,
}

/// One payload line: a key and its sealed value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// [`CLUSTER_ENTRY`], [`TENANT_ENTRY`], `nodepools/NAME` or `objects/KEY`.
    pub key: String,
    /// Base64 of the sealed value.
    pub value: String,
}

/// What an entry holds, by its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind<'a> {
    /// The cluster's management record.
    Cluster,
    /// The cluster's tenant record.
    Tenant,
    /// A node pool's record, by name.
    NodePool(&'a str),
    /// An object, by its key below the cluster's storage prefix.
    Object(&'a str),
}

impl Entry {
    /// What the entry holds; `None` for a key of no kind this version knows.
    pub fn kind(&self) -> Option<EntryKind<'_>> {
        match self.key.as_str() {
            CLUSTER_ENTRY => Some(EntryKind::Cluster),
            TENANT_ENTRY => Some(EntryKind::Tenant),
            key => {
                if let Some(name) = key.strip_prefix(NODE_POOL_PREFIX) {
                    (!name.is_empty() && !name.contains('/')).then_some(EntryKind::NodePool(name))
                } else {
                    key.strip_prefix(OBJECT_PREFIX)
                        .filter(|relative| relative_key_is_valid(relative))
                        .map(EntryKind::Object)
                }
            }
        }
    }
}

/// An object key below a storage prefix: `group/resource/…`, no empty segment, nothing that
/// could climb out of the prefix it is put under.
fn relative_key_is_valid(relative: &str) -> bool {
    let segments: Vec<&str> = relative.split('/').collect();
    segments.len() >= 3
        && segments
            .iter()
            .all(|segment| !segment.is_empty() && *segment != "." && *segment != "..")
        && !relative.contains('\0')
}

/// The authenticated data an entry's value is sealed with: a value opens only as the entry
/// it was written as, in the backup it was written in.
pub fn seal_context(cluster_id: &str, revision: i64, entry_key: &str) -> String {
    format!("flotilla-backup:{cluster_id}@{revision}:{entry_key}")
}

/// The authenticated data the payload's digest is sealed with.
pub fn digest_context(cluster_id: &str, revision: i64) -> String {
    format!("flotilla-backup:{cluster_id}@{revision}")
}

/// The key of an object entry whose storage key is `key`, under `prefix` (the cluster's
/// storage prefix, ending with `/`); `None` for a key not under it.
pub fn object_entry_key(prefix: &str, key: &str) -> Option<String> {
    key.strip_prefix(prefix)
        .filter(|relative| relative_key_is_valid(relative))
        .map(|relative| format!("{OBJECT_PREFIX}{relative}"))
}

/// The storage key of an object whose key below a cluster's prefix is `relative`, for the
/// cluster whose prefix is `prefix` (the same or another: a restore under a new id).
pub fn storage_key(prefix: &str, relative: &str) -> String {
    format!("{prefix}{relative}")
}

/// The resource an object's relative key names, as upstream names resources: `configmaps`
/// for the core group, `deployments.apps` for the others.
pub fn resource_of(relative: &str) -> Option<String> {
    let mut segments = relative.splitn(3, '/');
    let group = segments.next()?;
    let resource = segments.next()?;
    segments.next()?;
    Some(if group == "core" {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    })
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The payload of `entries`: one compact JSON line each.
pub fn encode_payload(entries: &[Entry]) -> Vec<u8> {
    let mut payload = Vec::new();
    for entry in entries {
        // An entry is two strings: serializing it cannot fail.
        if serde_json::to_writer(&mut payload, entry).is_ok() {
            payload.push(b'\n');
        }
    }
    payload
}

/// The file: `header` (whose payload fields the caller filled from `payload`) on the first
/// line, then `payload`.
pub fn assemble(header: &Header, payload: &[u8]) -> Vec<u8> {
    let mut file = serde_json::to_vec(header).unwrap_or_default();
    file.push(b'\n');
    file.extend_from_slice(payload);
    file
}

/// The header of `file` and its payload, checked as far as can be without the key: that it
/// is a backup of this format version, whole (its length) and intact (its SHA-256).
pub fn read_header(file: &[u8]) -> Result<(Header, &[u8]), FormatError> {
    let Some(end) = file.iter().position(|b| *b == b'\n') else {
        return Err(match file.first() {
            Some(b'{') => FormatError::TruncatedHeader(file.len()),
            Some(_) => FormatError::NotABackup("it does not start with a JSON header".into()),
            None => FormatError::NotABackup("the file is empty".into()),
        });
    };
    let (line, payload) = (&file[..end], &file[end + 1..]);
    // What it is and which version first, so another version's header is named as such
    // rather than as a missing field.
    let value: serde_json::Value =
        serde_json::from_slice(line).map_err(|e| match line.first() {
            Some(b'{') => FormatError::BadHeader(format!("not JSON ({e}): corrupted")),
            _ => FormatError::NotABackup("its first line is not a JSON header".into()),
        })?;
    if value["kind"] != KIND || value["apiVersion"] != API_VERSION {
        return Err(FormatError::NotABackup(format!(
            "its header is not apiVersion {API_VERSION}, kind {KIND}"
        )));
    }
    match value["formatVersion"].as_u64() {
        Some(version) if version == u64::from(FORMAT_VERSION) => {}
        Some(found) => return Err(FormatError::UnsupportedVersion { found }),
        None => return Err(FormatError::BadHeader("formatVersion is missing".into())),
    }
    let header: Header =
        serde_json::from_value(value).map_err(|e| FormatError::BadHeader(e.to_string()))?;
    let have = payload.len() as u64;
    if have < header.payload_bytes {
        return Err(FormatError::Truncated {
            have,
            want: header.payload_bytes,
        });
    }
    if have > header.payload_bytes {
        return Err(FormatError::TrailingBytes {
            extra: have - header.payload_bytes,
        });
    }
    let actual = sha256_hex(payload);
    if actual != header.payload_sha256 {
        return Err(FormatError::Checksum {
            actual,
            expected: header.payload_sha256,
        });
    }
    Ok((header, payload))
}

/// The header and entries of `file`: [`read_header`], then every entry parsed and the
/// entries checked against the header (count, one cluster and one tenant record, no key
/// twice, every key of a known kind).
pub fn read(file: &[u8]) -> Result<(Header, Vec<Entry>), FormatError> {
    let (header, payload) = read_header(file)?;
    let mut entries = Vec::with_capacity(header.entries.min(1 << 20));
    let mut seen = BTreeSet::new();
    let (mut clusters, mut tenants, mut objects) = (0, 0, 0);
    let lines = payload.strip_suffix(b"\n").unwrap_or(payload);
    let lines = lines.split(|b| *b == b'\n').filter(|_| !payload.is_empty());
    for (index, line) in lines.enumerate() {
        let bad = |reason: String| FormatError::BadEntry {
            line: index + 1,
            reason,
        };
        let entry: Entry = serde_json::from_slice(line).map_err(|e| bad(e.to_string()))?;
        match entry.kind() {
            Some(EntryKind::Cluster) => clusters += 1,
            Some(EntryKind::Tenant) => tenants += 1,
            Some(EntryKind::Object(_)) => objects += 1,
            Some(EntryKind::NodePool(_)) => {}
            None => return Err(bad(format!("unknown key {:?}", entry.key))),
        }
        if !seen.insert(entry.key.clone()) {
            return Err(bad(format!("key {:?} appears twice", entry.key)));
        }
        entries.push(entry);
    }
    if entries.len() != header.entries || objects != header.objects {
        return Err(FormatError::Inconsistent(format!(
            "the header announces {} entries ({} objects), the payload holds {} ({objects} objects)",
            header.entries,
            header.objects,
            entries.len()
        )));
    }
    if clusters != 1 || tenants != 1 {
        return Err(FormatError::Inconsistent(format!(
            "it holds {clusters} cluster records and {tenants} tenant records, not one of each"
        )));
    }
    Ok((header, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }

    fn sample() -> Vec<u8> {
        let entries = vec![
            entry(CLUSTER_ENTRY, "Y2x1c3Rlcg=="),
            entry(TENANT_ENTRY, "dGVuYW50"),
            entry("nodepools/workers", "cG9vbA=="),
            entry("objects/core/configmaps/default/a", "YQ=="),
            entry("objects/apps/deployments/default/web", "dw=="),
        ];
        let payload = encode_payload(&entries);
        let header = Header {
            api_version: API_VERSION.into(),
            kind: KIND.into(),
            format_version: FORMAT_VERSION,
            cluster: BackedUpCluster {
                name: "prod".into(),
                id: "prod-abc123".into(),
                account_id: "acme".into(),
                kubernetes_version: "1.33".into(),
            },
            revision: 41234,
            created_at: "2025-01-01T00:00:00Z".into(),
            service_version: "0.0.0".into(),
            key_encryption_key: "kek-01020304".into(),
            entries: entries.len(),
            objects: 2,
            resources: BTreeMap::from([
                ("configmaps".to_string(), 1),
                ("deployments.apps".to_string(), 1),
            ]),
            payload_bytes: payload.len() as u64,
            payload_sha256: sha256_hex(&payload),
            payload_seal: "c2VhbA==".into(),
        };
        assemble(&header, &payload)
    }

    #[test]
    fn a_backup_reads_back_as_written() {
        let file = sample();
        let (header, entries) = read(&file).expect("a whole backup reads");
        assert_eq!(header.cluster.id, "prod-abc123");
        assert_eq!(header.revision, 41234);
        assert_eq!(entries.len(), 5);
        assert_eq!(entries[2].kind(), Some(EntryKind::NodePool("workers")));
        assert_eq!(
            entries[3].kind(),
            Some(EntryKind::Object("core/configmaps/default/a"))
        );
        // Written again from what was read, it is the same file, byte for byte.
        assert_eq!(assemble(&header, &encode_payload(&entries)), file);
        assert_eq!(file.iter().filter(|b| **b == b'\n').count(), 6);
    }

    #[test]
    fn every_truncation_is_refused_as_such() {
        let file = sample();
        let header_end = file.iter().position(|b| *b == b'\n').expect("header line");
        for cut in 1..file.len() {
            let err = read(&file[..cut]).expect_err("a truncated backup is refused");
            let message = err.to_string();
            assert!(
                message.starts_with("the backup is truncated"),
                "cut at {cut}: {message}"
            );
            if cut > header_end {
                assert!(
                    matches!(err, FormatError::Truncated { want, .. } if want == (file.len() - header_end - 1) as u64),
                    "cut at {cut}: {err:?}"
                );
            }
            assert!(!message.contains('\n'), "one line: {message}");
        }
        assert_eq!(
            read(b"").expect_err("empty").to_string(),
            "not a Flotilla cluster backup: the file is empty"
        );
    }

    #[test]
    fn any_flipped_payload_byte_fails_the_checksum() {
        let file = sample();
        let header_end = file.iter().position(|b| *b == b'\n').expect("header line");
        for at in header_end + 1..file.len() {
            let mut corrupted = file.clone();
            corrupted[at] ^= 0x20;
            let err = read(&corrupted).expect_err("a corrupted backup is refused");
            assert!(
                matches!(err, FormatError::Checksum { .. }),
                "byte {at}: {err}"
            );
        }
        let mut longer = file.clone();
        longer.extend_from_slice(b"{}\n");
        assert_eq!(
            read(&longer).expect_err("trailing bytes").to_string(),
            "the backup is corrupted: 3 bytes follow its payload"
        );
    }

    #[test]
    fn another_version_or_another_file_is_named() {
        let file = sample();
        let text = String::from_utf8(file).expect("utf-8");
        let newer = text.replacen("\"formatVersion\":1", "\"formatVersion\":2", 1);
        assert_eq!(
            read(newer.as_bytes()).expect_err("version 2").to_string(),
            "the backup has format version 2; this service reads version 1"
        );
        let other = "apiVersion: v1\nkind: Config\n";
        assert!(matches!(
            read(other.as_bytes()),
            Err(FormatError::NotABackup(_))
        ));
        let kubeconfig = "{\"apiVersion\":\"v1\",\"kind\":\"Config\"}\n";
        assert!(matches!(
            read(kubeconfig.as_bytes()),
            Err(FormatError::NotABackup(_))
        ));
    }

    #[test]
    fn entries_must_add_up_to_the_header() {
        let rewrite = |entries: Vec<Entry>, objects: usize| {
            let payload = encode_payload(&entries);
            let (mut header, _) = read_header(&sample())
                .map(|(h, p)| (h, p.to_vec()))
                .expect("header");
            header.entries = entries.len();
            header.objects = objects;
            header.payload_bytes = payload.len() as u64;
            header.payload_sha256 = sha256_hex(&payload);
            read(&assemble(&header, &payload))
        };
        let base = vec![entry(CLUSTER_ENTRY, "a"), entry(TENANT_ENTRY, "b")];
        assert!(rewrite(base.clone(), 0).is_ok());
        let mut twice = base.clone();
        twice.push(entry(TENANT_ENTRY, "c"));
        assert!(matches!(
            rewrite(twice, 0),
            Err(FormatError::BadEntry { line: 3, .. })
        ));
        assert!(matches!(
            rewrite(vec![entry(CLUSTER_ENTRY, "a")], 0),
            Err(FormatError::Inconsistent(_))
        ));
        let mut climbing = base.clone();
        climbing.push(entry("objects/core/../../x", "d"));
        assert!(matches!(
            rewrite(climbing, 1),
            Err(FormatError::BadEntry { line: 3, .. })
        ));
        assert!(matches!(
            rewrite(base, 1),
            Err(FormatError::Inconsistent(_))
        ));
    }

    #[test]
    fn object_keys_move_from_one_prefix_to_another() {
        let entry_key = object_entry_key(
            "/registry/prod-abc123/",
            "/registry/prod-abc123/core/configmaps/default/a",
        )
        .expect("under the prefix");
        assert_eq!(entry_key, "objects/core/configmaps/default/a");
        let relative = entry_key.strip_prefix(OBJECT_PREFIX).expect("object");
        assert_eq!(
            storage_key("/registry/copy-x1y2z3/", relative),
            "/registry/copy-x1y2z3/core/configmaps/default/a"
        );
        // A key of another cluster whose id merely starts the same is not this cluster's.
        assert_eq!(
            object_entry_key(
                "/registry/prod/",
                "/registry/prod-abc123/core/configmaps/default/a"
            ),
            None
        );
        assert_eq!(
            resource_of("apps/deployments/default/web").as_deref(),
            Some("deployments.apps")
        );
        assert_eq!(
            resource_of("core/serviceipallocations/10.96.0.12").as_deref(),
            Some("serviceipallocations")
        );
    }
}
