//! Static pods and their mirror pods (upstream `pkg/kubelet/config/file.go` and `common.go`,
//! `pkg/kubelet/pod/mirror_client.go`): Pod manifests in `--pod-manifest-path` (a directory,
//! or one file) are read every `--file-check-frequency`, defaulted and named as upstream
//! does (`<name>-<node>`, a UID hashed from the manifest, the node, and the file), and run by
//! the kubelet like bound pods. Each gets a mirror pod in the API — a copy owned by the Node
//! and marked `kubernetes.io/config.mirror` — so `kubectl` sees it; the mirror carries the
//! static pod's status, and a deleted or outdated mirror is replaced.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Set on every pod the kubelet runs: where it came from (`file` or `api`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// A static pod's hash (its UID).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// When the kubelet first saw a static pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Marks a mirror pod; its value is the static pod's hash.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The source of static pods read from files.
const FILE_SOURCE: &str = "file";

/// Whether `pod` is a mirror pod (the API's copy of a static pod).
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// Whether `pod` is a static pod (read from a file by this kubelet).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION) == Some(FILE_SOURCE)
}

/// The static pod UID a mirror pod stands for (its `config.mirror` hash).
pub fn mirrored_uid(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_MIRROR_ANNOTATION)
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// `namespace/name` of a pod (upstream's pod full name, which ties a mirror to its static pod).
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Why a manifest was skipped (logged, as upstream logs and ignores bad files).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct ManifestError {
    /// The file.
    pub file: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Reads every manifest at `path` (a directory — its files in name order, hidden ones
/// skipped, not recursing — or one file) into static pods for node `node`. A missing path
/// holds no pods. Bad manifests and later duplicates of a pod name are returned as errors.
pub fn read_manifests(path: &Path, node: &str) -> (Vec<Pod>, Vec<ManifestError>) {
    let files: Vec<PathBuf> = match std::fs::metadata(path) {
        Err(_) => Vec::new(),
        Ok(meta) if meta.is_dir() => {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|entry| entry.file_type().is_ok_and(|t| t.is_file()))
                .map(|entry| entry.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| !n.starts_with('.'))
                })
                .collect();
            files.sort();
            files
        }
        Ok(_) => vec![path.to_path_buf()],
    };
    let mut pods: Vec<Pod> = Vec::new();
    let mut errors = Vec::new();
    for file in files {
        let source = file.display().to_string();
        let parsed = std::fs::read_to_string(&file)
            .map_err(|err| err.to_string())
            .and_then(|text| static_pod(&text, &source, node));
        match parsed {
            Ok(pod) if pods.iter().any(|p| full_name(p) == full_name(&pod)) => {
                errors.push(ManifestError {
                    file: source,
                    reason: format!(
                        "pod {} is already defined by another manifest; ignoring this one",
                        full_name(&pod)
                    ),
                });
            }
            Ok(pod) => pods.push(pod),
            Err(reason) => errors.push(ManifestError {
                file: source,
                reason,
            }),
        }
    }
    (pods, errors)
}

/// One manifest (YAML or JSON, a single v1 Pod) as the static pod of `node` read from
/// `source` (upstream `tryDecodeSinglePod` + `applyDefaults`).
pub fn static_pod(text: &str, source: &str, node: &str) -> Result<Pod, String> {
    let mut value: Value =
        serde_yaml::from_str(text).map_err(|err| format!("not a YAML or JSON document: {err}"))?;
    let (api_version, kind) = (
        value["apiVersion"].as_str().unwrap_or_default(),
        value["kind"].as_str().unwrap_or_default(),
    );
    if (api_version, kind) != ("v1", "Pod") {
        return Err(format!(
            "couldn't parse as pod: expected apiVersion v1 and kind Pod, got {api_version:?} {kind:?}"
        ));
    }
    default_pod(&mut value);
    // The UID is a hash of the manifest as written (defaulted), the node and the file.
    let mut hashed = serde_json::to_vec(&value).map_err(|err| err.to_string())?;
    hashed.extend_from_slice(format!("host:{node}file:{source}").as_bytes());
    let digest = ring::digest::digest(&ring::digest::SHA256, &hashed);
    let uid: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = value["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let metadata = value["metadata"]
        .as_object_mut()
        .ok_or("metadata must be an object")?;
    metadata.insert("uid".into(), json!(uid));
    metadata.insert(
        "name".into(),
        json!(format!("{name}-{}", node.to_lowercase())),
    );
    metadata
        .entry("namespace")
        .or_insert_with(|| json!("default"));
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("metadata.annotations must be an object")?;
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), json!(uid));
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), json!(FILE_SOURCE));
    let spec = value["spec"]
        .as_object_mut()
        .ok_or("spec must be an object")?;
    spec.insert("nodeName".into(), json!(node));
    // Static pods tolerate every NoExecute taint, so node problems do not evict them.
    let tolerations = spec
        .entry("tolerations")
        .or_insert_with(|| json!([]))
        .as_array_mut()
        .ok_or("spec.tolerations must be a list")?;
    let tolerate_all = json!({"operator": "Exists", "effect": "NoExecute"});
    if !tolerations.contains(&tolerate_all) {
        tolerations.push(tolerate_all);
    }
    value["status"] = json!({"phase": "Pending"});
    let pod: Pod = serde_json::from_value(value).map_err(|err| format!("invalid pod: {err}"))?;
    validate(&pod)?;
    Ok(pod)
}

/// The API defaults the kubelet relies on (upstream `SetDefaults_Pod` and friends; the
/// decoder applies them to manifests before hashing).
fn default_pod(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for (key, default) in [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("securityContext", json!({})),
    ] {
        spec.entry(key).or_insert(default);
    }
    for list in ["initContainers", "containers"] {
        for container in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            let image = container
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            container
                .entry("imagePullPolicy")
                .or_insert_with(|| json!(crate::translate::default_pull_policy(&image)));
            container
                .entry("terminationMessagePath")
                .or_insert_with(|| json!("/dev/termination-log"));
            container
                .entry("terminationMessagePolicy")
                .or_insert_with(|| json!("File"));
            for port in container
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                port.entry("protocol").or_insert_with(|| json!("TCP"));
            }
        }
    }
}

/// What the API would refuse of a static pod (the part of upstream's `ValidatePodCreate`
/// that keeps the kubelet from running nonsense).
fn validate(pod: &Pod) -> Result<(), String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let dns_subdomain = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    };
    if !dns_subdomain(name) {
        return Err(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain is required"
        ));
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if !dns_subdomain(namespace) || namespace.contains('.') || namespace.len() > 63 {
        return Err(format!(
            "metadata.namespace: Invalid value: {namespace:?}: a lowercase RFC 1123 label is required"
        ));
    }
    let spec = pod.spec.as_ref().ok_or("spec: Required value")?;
    if spec.containers.is_empty() {
        return Err("spec.containers: Required value".into());
    }
    let mut seen = std::collections::HashSet::new();
    for container in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        if container.name.is_empty()
            || container.name.contains('.')
            || !dns_subdomain(&container.name)
        {
            return Err(format!(
                "spec.containers.name: Invalid value: {:?}: a lowercase RFC 1123 label is required",
                container.name
            ));
        }
        if !seen.insert(container.name.clone()) {
            return Err(format!(
                "spec.containers.name: Duplicate value: {:?}",
                container.name
            ));
        }
        if container.image.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "spec.containers[{}].image: Required value",
                container.name
            ));
        }
    }
    Ok(())
}

/// Reads `path` every `every` (upstream's file source polls too) and publishes the static
/// pods whenever they change. A pod keeps the `config.seen` time of its first sighting.
pub async fn watch_manifests(
    path: PathBuf,
    node: String,
    every: Duration,
    publish: watch::Sender<Vec<Pod>>,
) {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut reported: Vec<ManifestError> = Vec::new();
    loop {
        let (mut pods, errors) = read_manifests(&path, &node);
        // Each bad file is logged once, not on every pass.
        for error in errors.iter().filter(|e| !reported.contains(e)) {
            tracing::warn!(%error, "skipping a static pod manifest");
        }
        reported = errors;
        seen.retain(|uid, _| pods.iter().any(|p| p.metadata.uid.as_ref() == Some(uid)));
        for pod in &mut pods {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let when = seen
                .entry(uid)
                .or_insert_with(|| k8s_openapi::jiff::Timestamp::now().to_string())
                .clone();
            pod.metadata
                .annotations
                .get_or_insert_default()
                .insert(CONFIG_SEEN_ANNOTATION.into(), when);
        }
        publish.send_if_modified(|current| {
            let changed = *current != pods;
            if changed {
                *current = pods;
            }
            changed
        });
        tokio::time::sleep(every).await;
    }
}

/// The mirror pod of `static_pod`: a copy owned by the Node (uid `node_uid`), marked with
/// the static pod's hash; the API assigns it a UID of its own.
pub fn mirror_pod(static_pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut mirror = static_pod.clone();
    let hash = static_pod.metadata.uid.clone().unwrap_or_default();
    mirror.metadata.uid = None;
    mirror.metadata.resource_version = None;
    mirror
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(CONFIG_MIRROR_ANNOTATION.into(), hash);
    mirror.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: node.to_string(),
        uid: node_uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    mirror.status = None;
    mirror
}

/// What [`ensure_mirror`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mirror {
    /// The mirror pod is current.
    Current,
    /// The mirror pod was (re)created: its status is still to be written.
    Created,
}

/// Makes the API hold `static_pod`'s current mirror: an outdated or deleting mirror is
/// deleted (by UID, so a newer one is never hit) and a new one created (upstream
/// `syncPod`'s mirror handling). A regular pod of that name is left alone: an error.
pub async fn ensure_mirror(
    client: &kube::Client,
    static_pod: &Pod,
    node: &str,
) -> anyhow::Result<Mirror> {
    let namespace = static_pod
        .metadata
        .namespace
        .as_deref()
        .unwrap_or("default");
    let name = static_pod.metadata.name.as_deref().unwrap_or_default();
    let hash = static_pod.metadata.uid.as_deref().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if let Some(existing) = pods.get_opt(name).await? {
        if !is_mirror(&existing) {
            anyhow::bail!(
                "pod {namespace}/{name} exists and is not a mirror pod; the static pod has no mirror"
            );
        }
        if mirrored_uid(&existing) == Some(hash) && existing.metadata.deletion_timestamp.is_none() {
            return Ok(Mirror::Current);
        }
        delete_mirror(client, &existing).await?;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let node_uid = nodes.get(node).await?.metadata.uid.unwrap_or_default();
    match pods
        .create(
            &PostParams::default(),
            &mirror_pod(static_pod, node, &node_uid),
        )
        .await
    {
        Ok(_) => {}
        // Created meanwhile (a previous pass's create the watch had not shown yet).
        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(Mirror::Current),
        Err(err) => return Err(err.into()),
    }
    tracing::info!(pod = %format!("{namespace}/{name}"), "mirror pod created");
    Ok(Mirror::Created)
}

/// Deletes `mirror` at once, only if it is still that object (UID precondition).
pub async fn delete_mirror(client: &kube::Client, mirror: &Pod) -> Result<(), kube::Error> {
    let namespace = mirror.metadata.namespace.as_deref().unwrap_or("default");
    let name = mirror.metadata.name.as_deref().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: mirror.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete(name, &params).await {
        Ok(_) => {
            tracing::info!(pod = %full_name(mirror), "mirror pod deleted");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(err) => Err(err),
    }
}

/// Parses a Go duration as the kubelet's flags take it (`20s`, `500ms`, `1m30s`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    flotilla_api_machinery::goduration::parse(text)
        .ok_or_else(|| format!("invalid duration {text:?} (e.g. 20s, 500ms, 1m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: c\n    image: busybox:1\n    ports: [{containerPort: 80}]\n";

    #[test]
    fn manifests_become_static_pods_named_after_the_node() {
        let pod = static_pod(MANIFEST, "/etc/manifests/web.yaml", "Node-1").expect("pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().expect("uid");
        assert_eq!(uid.len(), 32);
        let annotations = pod.metadata.annotations.clone().expect("annotations");
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(annotations[CONFIG_SOURCE_ANNOTATION], "file");
        assert!(is_static(&pod) && !is_mirror(&pod));
        let spec = pod.spec.clone().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        let toleration = &spec.tolerations.expect("tolerations")[0];
        assert_eq!(
            (toleration.operator.as_deref(), toleration.effect.as_deref()),
            (Some("Exists"), Some("NoExecute"))
        );
        assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    }

    #[test]
    fn the_uid_follows_content_node_and_file() {
        let uid = |text: &str, file: &str, node: &str| {
            static_pod(text, file, node)
                .expect("pod")
                .metadata
                .uid
                .expect("uid")
        };
        let base = uid(MANIFEST, "/m/web.yaml", "n1");
        assert_eq!(base, uid(MANIFEST, "/m/web.yaml", "n1"));
        assert_ne!(base, uid(MANIFEST, "/m/web.yaml", "n2"));
        assert_ne!(base, uid(MANIFEST, "/m/other.yaml", "n1"));
        let changed = MANIFEST.replace("busybox:1", "busybox:2");
        assert_ne!(base, uid(&changed, "/m/web.yaml", "n1"));
        // JSON manifests are read too.
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"kube-system"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
        let pod = static_pod(json, "/m/j.json", "n1").expect("json pod");
        assert_eq!(full_name(&pod), "kube-system/j-n1");
    }

    #[test]
    fn bad_manifests_are_refused_with_a_reason() {
        let cases = [
            (
                "kind: Deployment\napiVersion: apps/v1\n",
                "expected apiVersion v1 and kind Pod",
            ),
            ("{not yaml: [", "not a YAML or JSON document"),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: Web}\nspec: {containers: [{name: c, image: i}]}\n",
                "metadata.name: Invalid value",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: w}\nspec: {containers: []}\n",
                "spec.containers: Required value",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: w}\nspec: {containers: [{name: c, image: i}, {name: c, image: i}]}\n",
                "Duplicate value",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: w}\nspec: {containers: [{name: c}]}\n",
                "image: Required value",
            ),
        ];
        for (text, want) in cases {
            let err = static_pod(text, "/m/x.yaml", "n1").expect_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_directory_is_read_in_order_skipping_hidden_files_and_duplicates() {
        let dir = std::env::temp_dir().join(format!("static-pods-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.yaml"), MANIFEST).expect("a");
        std::fs::write(
            dir.join("b.yaml"),
            MANIFEST.replace("busybox:1", "busybox:2"),
        )
        .expect("b");
        std::fs::write(dir.join(".hidden.yaml"), MANIFEST.replace("web", "hidden")).expect("h");
        std::fs::write(dir.join("c.yaml"), "garbage: [").expect("c");
        let (pods, errors) = read_manifests(&dir, "n1");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[0].spec.as_ref().map(|s| s.containers[0].image.clone()),
            Some(Some("busybox:1".into()))
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].reason.contains("already defined"));
        assert!(errors[1].file.ends_with("c.yaml"));
        let (none, errors) = read_manifests(Path::new("/nonexistent/manifests"), "n1");
        assert!(none.is_empty() && errors.is_empty());
    }

    #[test]
    fn the_mirror_is_owned_by_the_node_and_marked_with_the_hash() {
        let pod = static_pod(MANIFEST, "/m/web.yaml", "n1").expect("pod");
        let mirror = mirror_pod(&pod, "n1", "node-uid");
        assert!(is_mirror(&mirror));
        assert_eq!(mirrored_uid(&mirror), pod.metadata.uid.as_deref());
        assert_eq!(mirror.metadata.uid, None);
        assert_eq!(mirror.status, None);
        let owner = &mirror.metadata.owner_references.clone().expect("owners")[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("Node", "n1", "node-uid", Some(true))
        );
        assert_eq!(full_name(&mirror), full_name(&pod));
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "10", "5x", "s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
