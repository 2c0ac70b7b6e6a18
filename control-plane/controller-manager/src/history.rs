//! Controller history shared by the StatefulSet and DaemonSet controllers (upstream
//! `pkg/controller/history` and `controller.ComputeHash`): the pod-template patch a
//! ControllerRevision stores, its hash and name, ordering by revision number, and which
//! revisions fall outside `revisionHistoryLimit`. Pure functions; the controllers do the IO.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::{Map, Value, json};

/// The pod label naming the revision a pod was made from (`apps.ControllerRevisionHashLabelKey`,
/// the DaemonSet's `DefaultDaemonSetUniqueLabelKey`).
pub const CONTROLLER_REVISION_HASH_LABEL: &str = "controller-revision-hash";

/// The ControllerRevision label carrying its hash (`history.ControllerRevisionHashLabel`).
pub const REVISION_HASH_LABEL: &str = "controller.kubernetes.io/hash";

/// The characters `rand.SafeEncodeString` maps to: no vowels, no look-alikes, so a hash never
/// spells a word.
const SAFE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Upstream `rand.SafeEncodeString`: each byte of `text` mapped into [`SAFE_ALPHABET`].
pub fn safe_encode(text: &str) -> String {
    text.bytes()
        .map(|b| SAFE_ALPHABET[usize::from(b) % SAFE_ALPHABET.len()] as char)
        .collect()
}

/// 32-bit FNV-1 (Go's `fnv.New32`).
pub fn fnv1_32(chunks: &[&[u8]]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in chunks.iter().flat_map(|c| c.iter()) {
        hash = hash.wrapping_mul(0x0100_0193);
        hash ^= u32::from(*byte);
    }
    hash
}

/// 32-bit FNV-1a (Go's `fnv.New32a`).
pub fn fnv1a_32(chunks: &[&[u8]]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in chunks.iter().flat_map(|c| c.iter()) {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

/// `value` with every object's keys sorted, as Go's `json.Marshal` of a map writes them, so
/// the same template always yields the same bytes.
pub fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut sorted = Map::new();
            for key in keys {
                sorted.insert(key.clone(), canonical(&map[key]));
            }
            Value::Object(sorted)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// The data of a revision of `template` (upstream `getPatch`): a strategic merge patch that
/// replaces `spec.template` wholesale, which `kubectl rollout undo` applies.
pub fn template_patch(template: &PodTemplateSpec) -> Value {
    let mut template = serde_json::to_value(template).unwrap_or_else(|_| json!({}));
    if let Value::Object(map) = &mut template {
        map.insert("$patch".into(), json!("replace"));
    }
    canonical(&json!({"spec": {"template": template}}))
}

/// The pod template a revision stores (upstream `ApplyRevision` of a template patch).
pub fn template_of(revision: &ControllerRevision) -> Option<PodTemplateSpec> {
    let mut template = revision
        .data
        .as_ref()?
        .0
        .get("spec")?
        .get("template")?
        .clone();
    if let Value::Object(map) = &mut template {
        map.remove("$patch");
    }
    serde_json::from_value(template).ok()
}

/// Whether `revision` stores `data` (upstream `EqualRevision`, compared as JSON values so a
/// round trip through the API server's encoding does not make equal data differ).
pub fn stores(revision: &ControllerRevision, data: &Value) -> bool {
    revision
        .data
        .as_ref()
        .is_some_and(|stored| canonical(&stored.0) == *data)
}

/// Upstream `HashControllerRevision`: FNV-1 over the data, then the collision count, safely
/// encoded.
pub fn hash_revision(data: &Value, collision_count: Option<i32>) -> String {
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    let probe = collision_count.map(|c| c.to_string()).unwrap_or_default();
    safe_encode(&fnv1_32(&[&bytes, probe.as_bytes()]).to_string())
}

/// Upstream `ControllerRevisionName`: `<parent>-<hash>`, the prefix cut to 223 characters so
/// the name stays within 253.
pub fn revision_name(parent: &str, hash: &str) -> String {
    let prefix: String = parent.chars().take(223).collect();
    format!("{prefix}-{hash}")
}

/// Upstream `SortControllerRevisions`: by revision number, then creation time, then name.
pub fn sort_revisions(revisions: &mut [ControllerRevision]) {
    revisions.sort_by(|a, b| {
        a.revision
            .cmp(&b.revision)
            .then_with(|| {
                let time =
                    |r: &ControllerRevision| r.metadata.creation_timestamp.as_ref().map(|t| t.0);
                time(a).cmp(&time(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// The number the next revision gets: one past the highest of `sorted` (1 for none).
pub fn next_revision(sorted: &[ControllerRevision]) -> i64 {
    sorted.last().map_or(1, |r| r.revision + 1)
}

/// Upstream `truncateHistory`/`cleanupHistory`: the names of the oldest revisions of `sorted`
/// that are not `live` (in use by a pod or the status) beyond `limit` of them.
pub fn revisions_to_delete(
    sorted: &[ControllerRevision],
    live: &BTreeSet<String>,
    limit: i32,
) -> Vec<String> {
    let history: Vec<&String> = sorted
        .iter()
        .filter_map(|r| r.metadata.name.as_ref())
        .filter(|name| !live.contains(*name))
        .collect();
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    history
        .iter()
        .take(history.len().saturating_sub(limit))
        .map(|name| (*name).clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn revision(name: &str, number: i64) -> ControllerRevision {
        ControllerRevision {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            revision: number,
            data: None,
        }
    }

    #[test]
    fn fnv_matches_the_reference_vectors() {
        // Published FNV test vectors (Go's hash/fnv tests).
        assert_eq!(fnv1_32(&[b""]), 0x811c9dc5);
        assert_eq!(fnv1_32(&[b"a"]), 0x050c5d7e);
        assert_eq!(fnv1_32(&[b"abc"]), 0x439c2f4b);
        assert_eq!(fnv1a_32(&[b"a"]), 0xe40c292c);
        assert_eq!(fnv1a_32(&[b"abc"]), 0x1a47e90b);
        assert_eq!(fnv1a_32(&[b"a", b"bc"]), fnv1a_32(&[b"abc"]));
    }

    #[test]
    fn safe_encoding_uses_no_vowels() {
        // '0' is byte 48: 48 % 27 = 21 → '4'; '9' is 57 % 27 = 3 → 'f'.
        assert_eq!(safe_encode("09"), "4f");
        let hash = hash_revision(&json!({"spec": {}}), None);
        assert!(hash.chars().all(|c| SAFE_ALPHABET.contains(&(c as u8))));
        assert_ne!(hash, hash_revision(&json!({"spec": {}}), Some(1)));
    }

    #[test]
    fn the_patch_round_trips_and_ignores_key_order() {
        let template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "c", "image": "nginx"}]},
        }))
        .expect("test fixture");
        let data = template_patch(&template);
        assert_eq!(data["spec"]["template"]["$patch"], "replace");
        let stored = ControllerRevision {
            data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
                serde_json::from_str(&serde_json::to_string(&data).expect("test fixture"))
                    .expect("test fixture"),
            )),
            ..revision("web-1", 1)
        };
        assert!(stores(&stored, &data));
        assert_eq!(template_of(&stored), Some(template));
        assert_eq!(revision_name("web", "abc"), "web-abc");
        assert_eq!(revision_name(&"x".repeat(300), "h").len(), 225);
    }

    #[test]
    fn history_beyond_the_limit_goes_oldest_first_sparing_live_ones() {
        let mut revisions = vec![
            revision("r3", 3),
            revision("r1", 1),
            revision("r2", 2),
            revision("r4", 4),
        ];
        sort_revisions(&mut revisions);
        assert_eq!(next_revision(&revisions), 5);
        assert_eq!(next_revision(&[]), 1);
        let live: BTreeSet<String> = ["r4".to_string(), "r1".to_string()].into();
        let cases: &[(i32, &[&str])] = &[
            (0, &["r2", "r3"]),
            (1, &["r2"]),
            (2, &[]),
            (10, &[]),
            (-1, &[]),
        ];
        for (limit, want) in cases {
            assert_eq!(
                revisions_to_delete(&revisions, &live, *limit),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "limit {limit}"
            );
        }
    }
}
