//! Upstream's ServiceAccount admission plugin (`plugin/pkg/admission/serviceaccount`): a new
//! pod that is not a mirror pod runs as `default` unless it names a service account, and one
//! that may automount gets a projected `kube-api-access-<5 chars>` volume — a bound service-account token (3607 s), the
//! cluster's `ca.crt` from `kube-root-ca.crt` and the pod's namespace — mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container and init container.

use rand::Rng;
use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;

/// Where the token, `ca.crt` and `namespace` appear in containers.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The generated volume's name prefix.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The injected token's lifetime (upstream's 1 hour + 7 s, which marks it as auto-injected).
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation of mirror pods, which get no token.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// upstream `utilrand.String`'s alphabet (no vowels, no confusable digits).
const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A `kube-api-access-xxxxx` name.
pub fn volume_name() -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{VOLUME_PREFIX}{suffix}")
}

/// The projected volume upstream injects.
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

/// The ServiceAccount plugin.
pub struct ServiceAccount;

#[async_trait::async_trait]
impl Plugin for ServiceAccount {
    fn name(&self) -> &'static str {
        "ServiceAccount"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create && attributes.is_core("pods")
    }

    async fn admit(
        &self,
        _context: &Context<'_>,
        _attributes: &Attributes<'_>,
        pod: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        default_name(pod);
        mount_token(pod, &volume_name());
        Ok(())
    }
}

/// Names the `default` service account in a `pod` that names none, unless it is a mirror pod
/// (which stays as its kubelet wrote it: a changed spec would make the kubelet replace it).
/// The Pod strategy applies this to an update's body too, as it always has.
pub fn default_name(pod: &mut Value) {
    if !pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_null() {
        return;
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let named = spec
        .get("serviceAccountName")
        .is_some_and(|name| !name.is_null());
    if !named {
        spec.insert("serviceAccountName".into(), json!("default"));
    }
}

/// Adds the token volume and its mounts to a new `pod` (named `volume`), unless it is a
/// mirror pod, opts out with `automountServiceAccountToken: false`, or already has one.
pub fn mount_token(pod: &mut Value, volume: &str) {
    if !pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_null() {
        return;
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("automountServiceAccountToken") == Some(&Value::Bool(false)) {
        return;
    }
    let volumes = spec
        .entry("volumes")
        .or_insert_with(|| json!([]))
        .as_array_mut();
    let Some(volumes) = volumes else {
        return;
    };
    let existing = volumes.iter().find_map(|v| {
        v["name"]
            .as_str()
            .filter(|n| n.starts_with(VOLUME_PREFIX) && !v["projected"].is_null())
            .map(str::to_string)
    });
    let name = match existing {
        Some(name) => name,
        None => {
            volumes.push(token_volume(volume));
            volume.to_string()
        }
    };
    for list in ["initContainers", "containers"] {
        for container in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(container) = container.as_object_mut() else {
                continue;
            };
            let mounts = container.entry("volumeMounts").or_insert_with(|| json!([]));
            let Some(mounts) = mounts.as_array_mut() else {
                continue;
            };
            if mounts.iter().any(|m| m["mountPath"] == MOUNT_PATH) {
                continue;
            }
            mounts.push(json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_get_the_token_volume_in_every_container() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "i"}],
            "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}],
        }});
        mount_token(&mut pod, "kube-api-access-abcde");
        let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0], token_volume("kube-api-access-abcde"));
        let mount =
            json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": MOUNT_PATH});
        assert_eq!(
            pod["spec"]["initContainers"][0]["volumeMounts"],
            json!([mount])
        );
        assert_eq!(pod["spec"]["containers"][0]["volumeMounts"], json!([mount]));
        assert_eq!(pod["spec"]["containers"][1]["volumeMounts"][1], mount);
        // Admitting again changes nothing.
        let before = pod.clone();
        mount_token(&mut pod, "kube-api-access-zzzzz");
        assert_eq!(pod, before);
    }

    #[test]
    fn opted_out_mirror_and_self_mounted_pods_are_left_alone() {
        for pod in [
            json!({"spec": {"automountServiceAccountToken": false, "containers": [{"name": "a"}]}}),
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
                   "spec": {"containers": [{"name": "a"}]}}),
        ] {
            let mut admitted = pod.clone();
            mount_token(&mut admitted, "kube-api-access-abcde");
            assert_eq!(admitted, pod);
        }
        let mut own = json!({"spec": {"containers": [{"name": "a",
            "volumeMounts": [{"name": "mine", "mountPath": MOUNT_PATH}]}]}});
        mount_token(&mut own, "kube-api-access-abcde");
        assert_eq!(
            own["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .map(Vec::len),
            Some(1)
        );
    }

    #[test]
    fn pods_run_as_default_unless_they_name_an_account_or_are_mirrors() {
        let mut unnamed = json!({"spec": {"containers": []}});
        default_name(&mut unnamed);
        assert_eq!(unnamed["spec"]["serviceAccountName"], "default");
        let mut null = json!({"spec": {"serviceAccountName": null}});
        default_name(&mut null);
        assert_eq!(null["spec"]["serviceAccountName"], "default");
        let mut named = json!({"spec": {"serviceAccountName": "web"}});
        default_name(&mut named);
        assert_eq!(named["spec"]["serviceAccountName"], "web");
        let mirror = json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}},
            "spec": {"containers": []}});
        let mut admitted = mirror.clone();
        default_name(&mut admitted);
        assert_eq!(admitted, mirror);
    }

    #[test]
    fn only_pod_creates_are_its_business() {
        use super::super::testing::attributes;
        let plugin = ServiceAccount;
        assert!(plugin.handles(&attributes(Operation::Create, "", "pods", "")));
        assert!(!plugin.handles(&attributes(Operation::Update, "", "pods", "")));
        assert!(!plugin.handles(&attributes(Operation::Create, "", "pods", "eviction")));
        assert!(!plugin.handles(&attributes(Operation::Create, "", "secrets", "")));
    }

    #[test]
    fn names_use_upstreams_alphabet() {
        let name = volume_name();
        let suffix = name.strip_prefix(VOLUME_PREFIX).expect("prefix");
        assert_eq!(suffix.len(), 5);
        assert!(suffix.bytes().all(|b| ALPHABET.contains(&b)), "{name}");
    }
}
