//! Pod spec → CRI requests, as pure functions (upstream `pkg/kubelet/kuberuntime`
//! `generatePodSandboxConfig` / `generateContainerConfig` and `kubelet_pods.go`
//! `makeEnvironmentVariables`): the sandbox and container configs with the labels the kubelet
//! finds its containers by again, environment variables resolved from values, the downward API
//! and the ConfigMaps/Secrets the caller fetched, and the image decision for a pull policy.

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

/// Sandbox and container label: the pod's UID (how the kubelet adopts its sandboxes).
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// Sandbox and container label: the pod's name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// Sandbox and container label: the pod's namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// Container label: the container's name in the pod spec.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// Container annotation: the container's restart count (upstream keeps it there too, so it
/// survives a kubelet restart).
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// Container annotation: the pod's termination grace period.
pub const GRACE_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";

/// Why a container's config cannot be made: reported as `CreateContainerConfigError`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A referenced ConfigMap or Secret does not exist (upstream passes the API's NotFound text).
    #[error("{kind} \"{name}\" not found")]
    NotFound {
        /// `configmap` or `secret`, as the API's NotFound message names them.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// The object exists but lacks the key.
    #[error("couldn't find key {key} in {kind} {namespace}/{name}")]
    MissingKey {
        /// `ConfigMap` or `Secret`.
        kind: &'static str,
        /// The key.
        key: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
        name: String,
    },
    /// A fieldRef the kubelet does not support.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// The pod lacks what a CRI request needs.
    #[error("the pod has no {0}")]
    Missing(&'static str),
}

/// The ConfigMaps and Secrets of the pod's namespace the environment refers to, as the
/// caller found them (`None`: not found). Secret values are already decoded.
#[derive(Debug, Clone, Default)]
pub struct EnvSources {
    /// ConfigMap name → its data.
    pub config_maps: BTreeMap<String, Option<BTreeMap<String, String>>>,
    /// Secret name → its data.
    pub secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

/// What the node knows that the downward API exposes.
#[derive(Debug, Clone, Default)]
pub struct NodeFacts {
    /// The Node's name (`spec.nodeName`).
    pub node_name: String,
    /// The node's IP (`status.hostIP`).
    pub host_ip: String,
    /// The pod's IP, once its sandbox has one.
    pub pod_ip: String,
}

/// The ConfigMaps and Secrets `container`'s env refers to: (config maps, secrets).
pub fn env_references(container: &Container) -> (Vec<String>, Vec<String>) {
    let (mut config_maps, mut secrets) = (Vec::new(), Vec::new());
    for var in container.env.iter().flatten() {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(r) = &from.config_map_key_ref {
            config_maps.push(r.name.clone());
        }
        if let Some(r) = &from.secret_key_ref {
            secrets.push(r.name.clone());
        }
    }
    for source in container.env_from.iter().flatten() {
        if let Some(r) = &source.config_map_ref {
            config_maps.push(r.name.clone());
        }
        if let Some(r) = &source.secret_ref {
            secrets.push(r.name.clone());
        }
    }
    config_maps.sort();
    config_maps.dedup();
    secrets.sort();
    secrets.dedup();
    (config_maps, secrets)
}

/// Expands `$(VAR)` references against `vars` as upstream's `expansion.Expand`: `$$` is a
/// literal `$`, an unknown reference stays as written.
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match vars.get(name) {
                Some(value) => out.push_str(value),
                None => out.push_str(&rest[at..at + 2 + close + 1]),
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The downward API value of `path` (the fieldRefs upstream resolves in the kubelet).
fn field_value(pod: &Pod, path: &str, facts: &NodeFacts) -> Result<String, ConfigError> {
    let meta = &pod.metadata;
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => facts.node_name.clone(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => facts.host_ip.clone(),
        "status.podIP" => facts.pod_ip.clone(),
        _ => {
            // metadata.labels['key'] / metadata.annotations['key']
            let pick = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
                path.strip_prefix(prefix)
                    .and_then(|r| r.strip_suffix("']"))
                    .map(|key| {
                        map.as_ref()
                            .and_then(|m| m.get(key).cloned())
                            .unwrap_or_default()
                    })
            };
            pick("metadata.labels['", &meta.labels)
                .or_else(|| pick("metadata.annotations['", &meta.annotations))
                .ok_or_else(|| ConfigError::FieldPath(path.to_string()))?
        }
    };
    Ok(value)
}

/// `container`'s environment (upstream `makeEnvironmentVariables`, without service links):
/// envFrom first, then env in order, each value expanded against those before it.
pub fn resolve_env(
    pod: &Pod,
    container: &Container,
    facts: &NodeFacts,
    sources: &EnvSources,
) -> Result<Vec<(String, String)>, ConfigError> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut vars: Vec<(String, String)> = Vec::new();
    let set = |vars: &mut Vec<(String, String)>, name: String, value: String| match vars
        .iter_mut()
        .find(|(n, _)| *n == name)
    {
        Some(entry) => entry.1 = value,
        None => vars.push((name, value)),
    };
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        let (data, optional, kind, name) = if let Some(r) = &source.config_map_ref {
            (
                sources.config_maps.get(&r.name).cloned().flatten(),
                r.optional.unwrap_or(false),
                "configmap",
                r.name.clone(),
            )
        } else if let Some(r) = &source.secret_ref {
            (
                sources.secrets.get(&r.name).cloned().flatten(),
                r.optional.unwrap_or(false),
                "secret",
                r.name.clone(),
            )
        } else {
            continue;
        };
        match data {
            Some(data) => {
                for (key, value) in data {
                    set(&mut vars, format!("{prefix}{key}"), value);
                }
            }
            None if optional => {}
            None => return Err(ConfigError::NotFound { kind, name }),
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let known: HashMap<String, String> = vars.iter().cloned().collect();
                expand(var.value.as_deref().unwrap_or(""), &known)
            }
            Some(from) => {
                if let Some(field) = &from.field_ref {
                    field_value(pod, &field.field_path, facts)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let source = KeySource {
                        objects: &sources.config_maps,
                        kind: "configmap",
                        key_kind: "ConfigMap",
                        namespace: &namespace,
                    };
                    match source.value(&r.name, &r.key, r.optional.unwrap_or(false))? {
                        Some(value) => value,
                        None => continue,
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let source = KeySource {
                        objects: &sources.secrets,
                        kind: "secret",
                        key_kind: "Secret",
                        namespace: &namespace,
                    };
                    match source.value(&r.name, &r.key, r.optional.unwrap_or(false))? {
                        Some(value) => value,
                        None => continue,
                    }
                } else {
                    // resourceFieldRef is not resolved yet: it needs the node's allocatable.
                    continue;
                }
            }
        };
        set(&mut vars, var.name.clone(), value);
    }
    Ok(vars)
}

/// ConfigMaps or Secrets that `valueFrom` key references read, with upstream's wording of
/// each kind in its errors.
struct KeySource<'a> {
    objects: &'a BTreeMap<String, Option<BTreeMap<String, String>>>,
    kind: &'static str,
    key_kind: &'static str,
    namespace: &'a str,
}

impl KeySource<'_> {
    /// The value of `key` in object `name`; `None` when it is absent and optional.
    fn value(&self, name: &str, key: &str, optional: bool) -> Result<Option<String>, ConfigError> {
        let Some(data) = self.objects.get(name).cloned().flatten() else {
            return if optional {
                Ok(None)
            } else {
                Err(ConfigError::NotFound {
                    kind: self.kind,
                    name: name.to_string(),
                })
            };
        };
        match data.get(key) {
            Some(value) => Ok(Some(value.clone())),
            None if optional => Ok(None),
            None => Err(ConfigError::MissingKey {
                kind: self.key_kind,
                key: key.to_string(),
                namespace: self.namespace.to_string(),
                name: name.to_string(),
            }),
        }
    }
}

/// What to do about a container's image given its pull policy and whether the node has it.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageDecision {
    /// Use the local image.
    Use,
    /// Report the container waiting with this reason and message.
    Wait {
        /// Upstream's reason (`ErrImageNeverPull`, `ImagePullBackOff`).
        reason: &'static str,
        /// Upstream's message.
        message: String,
    },
}

/// Upstream `imageManager.EnsureImageExists` against a node without a registry: present
/// images are used whatever the policy; an absent one is `ErrImageNeverPull` under `Never`
/// and, since nothing can be pulled, `ImagePullBackOff` otherwise.
pub fn image_decision(image: &str, policy: Option<&str>, present: bool) -> ImageDecision {
    if present {
        return ImageDecision::Use;
    }
    match policy.unwrap_or_else(|| default_pull_policy(image)) {
        "Never" => ImageDecision::Wait {
            reason: "ErrImageNeverPull",
            message: format!(
                "Container image \"{image}\" is not present with pull policy of Never"
            ),
        },
        _ => ImageDecision::Wait {
            reason: "ImagePullBackOff",
            message: format!(
                "Back-off pulling image \"{image}\": this node has no registry to pull from"
            ),
        },
    }
}

/// The API's default pull policy: `Always` for `:latest` or untagged images.
pub fn default_pull_policy(image: &str) -> &'static str {
    let last = image.rsplit('/').next().unwrap_or(image);
    let tagged = last.contains(':') && !image.ends_with(":latest");
    if tagged || image.contains('@') {
        "IfNotPresent"
    } else {
        "Always"
    }
}

fn pod_labels(pod: &Pod) -> Result<HashMap<String, String>, ConfigError> {
    let meta = &pod.metadata;
    let uid = meta
        .uid
        .clone()
        .ok_or(ConfigError::Missing("metadata.uid"))?;
    let name = meta
        .name
        .clone()
        .ok_or(ConfigError::Missing("metadata.name"))?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    Ok(HashMap::from([
        (POD_UID_LABEL.to_string(), uid),
        (POD_NAME_LABEL.to_string(), name),
        (POD_NAMESPACE_LABEL.to_string(), namespace),
    ]))
}

/// The pod's log directory under `log_root` (upstream `/var/log/pods/<ns>_<name>_<uid>`).
pub fn pod_log_dir(pod: &Pod, log_root: &str) -> String {
    let meta = &pod.metadata;
    format!(
        "{log_root}/{}_{}_{}",
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or(""),
        meta.uid.as_deref().unwrap_or("")
    )
}

/// The sandbox of `pod` (upstream `generatePodSandboxConfig`): metadata, hostname, labels the
/// kubelet adopts it by, the pod's log directory, its own network/PID namespaces.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    log_root: &str,
) -> Result<cri::PodSandboxConfig, ConfigError> {
    let meta = &pod.metadata;
    let labels = pod_labels(pod)?;
    let spec = pod.spec.as_ref().ok_or(ConfigError::Missing("spec"))?;
    let mut user_labels: HashMap<String, String> = meta
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    user_labels.extend(labels.clone());
    let host_network = spec.host_network.unwrap_or(false);
    let hostname = spec
        .hostname
        .clone()
        .or_else(|| meta.name.clone())
        .unwrap_or_default();
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: labels[POD_NAME_LABEL].clone(),
            uid: labels[POD_UID_LABEL].clone(),
            namespace: labels[POD_NAMESPACE_LABEL].clone(),
            attempt,
        }),
        hostname: if host_network {
            String::new()
        } else {
            hostname
        },
        log_directory: pod_log_dir(pod, log_root),
        labels: user_labels,
        annotations: meta
            .annotations
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(host_network, spec.host_pid.unwrap_or(false))),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn namespaces(host_network: bool, host_pid: bool) -> cri::NamespaceOption {
    let mode = |host: bool, otherwise: cri::NamespaceMode| {
        if host {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: mode(host_network, cri::NamespaceMode::Pod),
        // Upstream's default: each container its own PID namespace unless shareProcessNamespace.
        pid: mode(host_pid, cri::NamespaceMode::Container),
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// `container` of `pod` (upstream `generateContainerConfig`): command/args expanded against
/// its environment, the labels and annotations the kubelet reads back (name, pod, restart
/// count, grace period), its log path `<name>/<restartCount>.log`, the mounts and devices
/// its volumes give it.
pub fn container_config(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
    env: &[(String, String)],
    image_ref: &str,
    volumes: &crate::volumes::plan::ContainerMounts,
) -> Result<cri::ContainerConfig, ConfigError> {
    let mut labels = pod_labels(pod)?;
    labels.insert(CONTAINER_NAME_LABEL.into(), container.name.clone());
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let expand_all = |list: &Option<Vec<String>>| -> Vec<String> {
        list.iter().flatten().map(|s| expand(s, &vars)).collect()
    };
    let image = container.image.clone().unwrap_or_default();
    let share_pid = pod
        .spec
        .as_ref()
        .and_then(|s| s.share_process_namespace)
        .unwrap_or(false);
    let host_pid = pod.spec.as_ref().and_then(|s| s.host_pid).unwrap_or(false);
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let mut ns = namespaces(host_network, host_pid);
    if share_pid && !host_pid {
        ns.pid = cri::NamespaceMode::Pod as i32;
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: image,
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        labels,
        annotations: HashMap::from([
            (RESTART_COUNT_ANNOTATION.into(), restart_count.to_string()),
            (GRACE_ANNOTATION.into(), grace.to_string()),
        ]),
        log_path: format!("{}/{restart_count}.log", container.name),
        mounts: volumes.mounts.clone(),
        devices: volumes.devices.clone(),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(ns),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                         "labels": {"app": "web", "tier['x']": "1"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": containers,
                     "terminationGracePeriodSeconds": 5},
        }))
        .expect("pod")
    }

    fn container(pod: &Pod) -> Container {
        pod.spec.as_ref().expect("spec").containers[0].clone()
    }

    #[test]
    fn expansion_follows_upstream() {
        let vars = HashMap::from([("A".to_string(), "1".to_string())]);
        for (input, want) in [
            ("$(A)", "1"),
            ("x$(A)y", "x1y"),
            ("$$(A)", "$(A)"),
            ("$(B)", "$(B)"),
            ("$", "$"),
            ("a$b", "a$b"),
            ("$(A", "$(A"),
            ("$(A)$(A)", "11"),
        ] {
            assert_eq!(expand(input, &vars), want, "{input}");
        }
    }

    #[test]
    fn env_resolves_values_fields_and_references() {
        let pod = pod(json!([{"name": "c", "image": "i", "env": [
            {"name": "PLAIN", "value": "v"},
            {"name": "EXPANDED", "value": "$(PLAIN)-x"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}},
        ]}]));
        let facts = NodeFacts {
            node_name: "n1".into(),
            host_ip: "10.0.0.1".into(),
            pod_ip: "10.244.0.5".into(),
        };
        let one = |k: &str, v: &str| Some(BTreeMap::from([(k.to_string(), v.to_string())]));
        let sources = EnvSources {
            config_maps: BTreeMap::from([
                ("cm".into(), one("k", "from-cm")),
                ("gone".into(), None),
            ]),
            secrets: BTreeMap::from([("s".into(), one("k", "from-secret"))]),
        };
        let env = resolve_env(&pod, &container(&pod), &facts, &sources).expect("env");
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            got,
            vec![
                ("PLAIN", "v"),
                ("EXPANDED", "v-x"),
                ("NAME", "web"),
                ("NS", "prod"),
                ("IP", "10.244.0.5"),
                ("NODE", "n1"),
                ("APP", "web"),
                ("CM", "from-cm"),
                ("S", "from-secret"),
            ]
        );
        assert_eq!(
            env_references(&container(&pod)),
            (
                vec!["cm".to_string(), "gone".to_string()],
                vec!["s".to_string()]
            )
        );
    }

    #[test]
    fn missing_references_are_config_errors_with_upstream_text() {
        let facts = NodeFacts::default();
        let cases = [
            (
                json!({"configMapKeyRef": {"name": "cm", "key": "k"}}),
                EnvSources::default(),
                "configmap \"cm\" not found",
            ),
            (
                json!({"secretKeyRef": {"name": "s", "key": "k"}}),
                EnvSources {
                    secrets: BTreeMap::from([("s".into(), None)]),
                    ..Default::default()
                },
                "secret \"s\" not found",
            ),
            (
                json!({"configMapKeyRef": {"name": "cm", "key": "other"}}),
                EnvSources {
                    config_maps: BTreeMap::from([("cm".into(), Some(BTreeMap::new()))]),
                    ..Default::default()
                },
                "couldn't find key other in ConfigMap prod/cm",
            ),
            (
                json!({"fieldRef": {"fieldPath": "spec.bogus"}}),
                EnvSources::default(),
                "unsupported fieldPath: spec.bogus",
            ),
        ];
        for (from, sources, want) in cases {
            let pod = pod(json!([{"name": "c", "image": "i",
                                   "env": [{"name": "X", "valueFrom": from}]}]));
            let err = resolve_env(&pod, &container(&pod), &facts, &sources).expect_err("error");
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn image_decisions_follow_the_pull_policy() {
        let never = "Container image \"a:1\" is not present with pull policy of Never";
        let cases = [
            ("a:1", Some("Never"), true, None),
            (
                "a:1",
                Some("Never"),
                false,
                Some(("ErrImageNeverPull", never)),
            ),
            ("a:1", Some("IfNotPresent"), true, None),
            (
                "a:1",
                Some("IfNotPresent"),
                false,
                Some(("ImagePullBackOff", "")),
            ),
            ("a:1", Some("Always"), false, Some(("ImagePullBackOff", ""))),
            ("a", None, false, Some(("ImagePullBackOff", ""))),
        ];
        for (image, policy, present, want) in cases {
            let got = image_decision(image, policy, present);
            match (got, want) {
                (ImageDecision::Use, None) => {}
                (ImageDecision::Wait { reason, message }, Some((want_reason, want_message))) => {
                    assert_eq!(reason, want_reason);
                    assert!(message.starts_with(want_message), "{message}");
                }
                (got, want) => panic!("{image} {policy:?} {present}: {got:?} vs {want:?}"),
            }
        }
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("reg:5000/busybox"), "Always");
        assert_eq!(
            default_pull_policy("flotilla.local/busybox:1"),
            "IfNotPresent"
        );
    }

    #[test]
    fn configs_carry_the_labels_the_kubelet_adopts_by() {
        let pod = pod(json!([{"name": "c", "image": "flotilla.local/busybox:1",
                               "command": ["sh", "-c"], "args": ["echo $(X)"]}]));
        let sandbox = sandbox_config(&pod, 0, "/logs").expect("sandbox");
        assert_eq!(sandbox.labels[POD_UID_LABEL], "u-1");
        assert_eq!(sandbox.labels["app"], "web");
        assert_eq!(sandbox.hostname, "web");
        assert_eq!(sandbox.log_directory, "/logs/prod_web_u-1");
        let meta = sandbox.metadata.expect("metadata");
        assert_eq!(
            (meta.name.as_str(), meta.namespace.as_str()),
            ("web", "prod")
        );
        let env = vec![("X".to_string(), "1".to_string())];
        let config = container_config(
            &pod,
            &container(&pod),
            3,
            &env,
            "sha256:abc",
            &Default::default(),
        )
        .expect("config");
        assert_eq!(config.command, vec!["sh", "-c"]);
        assert_eq!(config.args, vec!["echo 1"]);
        assert_eq!(config.labels[CONTAINER_NAME_LABEL], "c");
        assert_eq!(config.annotations[RESTART_COUNT_ANNOTATION], "3");
        assert_eq!(config.annotations[GRACE_ANNOTATION], "5");
        assert_eq!(config.log_path, "c/3.log");
        assert_eq!(config.metadata.expect("metadata").attempt, 3);
        let mut no_uid = pod.clone();
        no_uid.metadata.uid = None;
        assert_eq!(
            sandbox_config(&no_uid, 0, "/l").expect_err("uid"),
            ConfigError::Missing("metadata.uid")
        );
    }
}
