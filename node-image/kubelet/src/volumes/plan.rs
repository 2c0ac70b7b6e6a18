//! The sans-IO core of pod volumes: where each volume lives under the kubelet's root
//! (`pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`), which files a configMap, secret,
//! downwardAPI or projected volume holds with which modes (upstream `MakePayload`,
//! `CollectData`), the hostPath type checks, when a bound token is refreshed, the
//! `/etc/hosts` a pod gets, and the CRI mounts of a container's `volumeMounts`
//! (upstream `makeMounts`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The default mode of configMap, secret, downwardAPI and projected files (0644).
pub const DEFAULT_MODE: i32 = 0o644;
/// The name of the symlink to the current data directory (upstream's AtomicWriter).
pub const DATA_DIR: &str = "..data";
/// A projected token's lifetime when the pod does not say (upstream's default).
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;
/// Tokens older than this are refreshed whatever their lifetime (upstream `maxTTL`).
pub const MAX_TOKEN_AGE_SECONDS: i64 = 24 * 60 * 60;

/// Why a volume cannot be set up: the text after `MountVolume.SetUp failed for volume "x" : `.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// A referenced object does not exist (upstream's kubelet cache wording).
    #[error("{kind} \"{name}\" not found")]
    NotFound {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// An item names a key the configMap lacks.
    #[error("configmap references non-existent config key: {0}")]
    MissingConfigKey(String),
    /// An item names a key the secret lacks.
    #[error("references non-existent secret key: {0}")]
    MissingSecretKey(String),
    /// A hostPath is not of its declared type.
    #[error("hostPath type check failed: {path} is not {what}")]
    HostPathType {
        /// The host path.
        path: String,
        /// `a directory`, `a file`, `a socket file`, `a character device`, `a block device`.
        what: &'static str,
    },
    /// An unknown hostPath type.
    #[error("{0} is an invalid volume type")]
    InvalidHostPathType(String),
    /// A payload path that would escape the volume (`..`, absolute).
    #[error("invalid path {0:?}: must be relative and may not contain '..'")]
    BadPath(String),
    /// A downward API field the kubelet does not project.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// A resourceFieldRef the kubelet cannot resolve.
    #[error("unsupported resource {0}")]
    Resource(String),
    /// A volume of a kind this kubelet does not mount.
    #[error("volume type is not supported by this kubelet")]
    Unsupported,
}

/// Why a container's mounts cannot be made: upstream reports these as
/// `CreateContainerConfigError`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MountError {
    /// A volumeMount names no volume of the pod.
    #[error("cannot find volume \"{volume}\" to mount into container \"{container}\"")]
    NoVolume {
        /// The volume.
        volume: String,
        /// The container.
        container: String,
    },
    /// A subPath that is absolute or climbs out of the volume.
    #[error("error {kind} {path:?}: must be a relative path without '..'")]
    SubPath {
        /// `subPath` or `subPathExpr`.
        kind: &'static str,
        /// The path.
        path: String,
    },
}

/// The volume plugins that keep something under the pod's directory, with upstream's
/// directory names (`kubernetes.io~<plugin>`); hostPath and `local` PVs are used in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plugin {
    /// `emptyDir`.
    EmptyDir,
    /// `configMap`.
    ConfigMap,
    /// `secret`.
    Secret,
    /// `downwardAPI`.
    DownwardApi,
    /// `projected`.
    Projected,
    /// A `persistentVolumeClaim` on a CSI PV.
    Csi,
}

impl Plugin {
    /// Upstream's plugin name (`kubernetes.io/<name>`, escaped `kubernetes.io~<name>`).
    pub fn dir_name(self) -> &'static str {
        match self {
            Plugin::EmptyDir => "kubernetes.io~empty-dir",
            Plugin::ConfigMap => "kubernetes.io~configmap",
            Plugin::Secret => "kubernetes.io~secret",
            Plugin::DownwardApi => "kubernetes.io~downward-api",
            Plugin::Projected => "kubernetes.io~projected",
            Plugin::Csi => "kubernetes.io~csi",
        }
    }

    /// Whether the files are API data (configMap, secret, downwardAPI, projected): such
    /// volumes are always mounted read-only, as upstream does since 1.10.
    pub fn read_only_data(self) -> bool {
        matches!(
            self,
            Plugin::ConfigMap | Plugin::Secret | Plugin::DownwardApi | Plugin::Projected
        )
    }
}

/// `<root>/pods/<uid>`: everything the kubelet keeps for one pod.
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("pods").join(uid)
}

/// `<root>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>`.
pub fn volume_dir(root: &Path, uid: &str, plugin: Plugin, name: &str) -> PathBuf {
    pod_dir(root, uid)
        .join("volumes")
        .join(plugin.dir_name())
        .join(name)
}

/// One file of an API-data volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// Its content.
    pub data: Vec<u8>,
    /// Its permission bits.
    pub mode: u32,
}

/// Relative path → file: what an API-data volume holds (upstream's payload).
pub type Payload = BTreeMap<String, FileProjection>;

fn mode_of(mode: Option<i32>, default: i32) -> u32 {
    u32::try_from(mode.unwrap_or(default) & 0o7777).unwrap_or(0o644)
}

/// A configMap's or secret's data, already decoded, as the kubelet fetched it.
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// The files of a configMap or secret volume (upstream `MakePayload`): every key under its
/// own name with `default_mode`, or only the listed items at their paths and modes. A
/// listed key the object lacks fails unless the volume is optional.
pub fn key_payload(
    kind: &'static str,
    items: Option<&[KeyToPath]>,
    data: &ObjectData,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, PlanError> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    let mut payload = Payload::new();
    match items.filter(|items| !items.is_empty()) {
        None => {
            for (key, value) in data {
                payload.insert(
                    key.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: mode_of(None, default_mode),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.get(&item.key) else {
                    if optional {
                        continue;
                    }
                    return Err(if kind == "secret" {
                        PlanError::MissingSecretKey(item.key.clone())
                    } else {
                        PlanError::MissingConfigKey(item.key.clone())
                    });
                };
                payload.insert(
                    item.path.clone(),
                    FileProjection {
                        data: value.clone(),
                        mode: mode_of(item.mode, default_mode),
                    },
                );
            }
        }
    }
    Ok(payload)
}

/// `k="v"` lines, sorted by key (upstream `fieldpath.FormatMap`).
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Go's `%q` for the strings labels and annotations hold.
fn quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The value of a downward API volume field (upstream `ExtractFieldPathAsString` on the
/// paths volumes allow).
fn field_value(pod: &Pod, path: &str) -> Result<String, PlanError> {
    let meta = &pod.metadata;
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref()),
        "metadata.annotations" => format_map(meta.annotations.as_ref()),
        _ => {
            let pick = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
                path.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_suffix("']"))
                    .map(|key| {
                        map.as_ref()
                            .and_then(|m| m.get(key).cloned())
                            .unwrap_or_default()
                    })
            };
            pick("metadata.labels['", &meta.labels)
                .or_else(|| pick("metadata.annotations['", &meta.annotations))
                .ok_or_else(|| PlanError::FieldPath(path.to_string()))?
        }
    };
    Ok(value)
}

/// A quantity's value in units of `divisor`, rounded up (upstream
/// `ExtractContainerResourceValue`): cpu in cores or millicores, memory in bytes or units.
fn resource_value(quantity: &Quantity, divisor: Option<&Quantity>) -> Option<String> {
    let value = parse_quantity(&quantity.0)?;
    let divisor = divisor.map(|d| parse_quantity(&d.0)).unwrap_or(Some(1.0))?;
    if divisor <= 0.0 {
        return None;
    }
    Some(format!("{}", (value / divisor).ceil() as i64))
}

/// A Kubernetes quantity as a number (enough precision for the downward API).
fn parse_quantity(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(number * factor)
}

/// The files of a downward API volume (or projected source): each item's field or the
/// named container's resource, with its mode or `default_mode`.
pub fn downward_payload(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<Payload, PlanError> {
    let default_mode = default_mode.unwrap_or(DEFAULT_MODE);
    let mut payload = Payload::new();
    for item in items {
        let text = if let Some(field) = &item.field_ref {
            field_value(pod, &field.field_path)?
        } else if let Some(resource) = &item.resource_field_ref {
            let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
            let container = containers
                .into_iter()
                .flatten()
                .find(|c| Some(&c.name) == resource.container_name.as_ref())
                .or_else(|| containers.and_then(|c| c.first()));
            let resources: Option<&ResourceRequirements> =
                container.and_then(|c| c.resources.as_ref());
            let (map, name) = match resource.resource.split_once('.') {
                Some(("limits", name)) => (resources.and_then(|r| r.limits.as_ref()), name),
                Some(("requests", name)) => (resources.and_then(|r| r.requests.as_ref()), name),
                _ => return Err(PlanError::Resource(resource.resource.clone())),
            };
            // Without a limit upstream falls back to the node's allocatable, which this
            // kubelet does not pass down: such a field is reported unsupported.
            map.and_then(|m| m.get(name))
                .and_then(|q| resource_value(q, resource.divisor.as_ref()))
                .ok_or_else(|| PlanError::Resource(resource.resource.clone()))?
        } else {
            continue;
        };
        payload.insert(
            item.path.clone(),
            FileProjection {
                data: text.into_bytes(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(payload)
}

/// Checks a payload's paths as upstream's `validatePayload`: relative, no `..` element,
/// no element starting with `..` (reserved for the writer), cleaned.
pub fn validate_payload(payload: &Payload) -> Result<Payload, PlanError> {
    let mut clean = Payload::new();
    for (path, file) in payload {
        let p = Path::new(path);
        let ok = !path.is_empty()
            && path.len() <= 4096
            && !p.is_absolute()
            && p.components().all(|c| match c {
                Component::Normal(part) => {
                    let part = part.to_string_lossy();
                    !part.starts_with("..") && part.len() <= 255
                }
                Component::CurDir => true,
                _ => false,
            });
        if !ok {
            return Err(PlanError::BadPath(path.clone()));
        }
        let cleaned: PathBuf = p.components().filter(|c| *c != Component::CurDir).collect();
        clean.insert(cleaned.to_string_lossy().into_owned(), file.clone());
    }
    Ok(clean)
}

/// The first element of each payload path: the user-visible symlinks into `..data`.
pub fn top_level_names(payload: &Payload) -> Vec<String> {
    let mut names: Vec<String> = payload
        .keys()
        .filter_map(|p| p.split('/').next().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// What is at a hostPath, as the checker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// Nothing.
    Absent,
    /// A directory.
    Directory,
    /// A regular file.
    File,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else (a FIFO).
    Other,
}

/// What to do about a hostPath before mounting it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathAction {
    /// Mount it as it is.
    Use,
    /// Create the directory (0755) first.
    MakeDir,
    /// Create an empty file (0644) first; its parent is not created, as upstream.
    MakeFile,
}

/// Upstream's `checkTypeInternal`: the hostPath `type` against what is there.
pub fn check_host_path(
    path: &str,
    host_type: Option<&str>,
    found: FileKind,
) -> Result<HostPathAction, PlanError> {
    let fail = |what| PlanError::HostPathType {
        path: path.to_string(),
        what,
    };
    let expect = |ok: bool, what| {
        if ok {
            Ok(HostPathAction::Use)
        } else {
            Err(fail(what))
        }
    };
    match host_type.unwrap_or("") {
        "" => Ok(HostPathAction::Use),
        "DirectoryOrCreate" if found == FileKind::Absent => Ok(HostPathAction::MakeDir),
        "DirectoryOrCreate" | "Directory" => expect(found == FileKind::Directory, "a directory"),
        "FileOrCreate" if found == FileKind::Absent => Ok(HostPathAction::MakeFile),
        "FileOrCreate" | "File" => expect(found == FileKind::File, "a file"),
        "Socket" => expect(found == FileKind::Socket, "a socket file"),
        "CharDevice" => expect(found == FileKind::CharDevice, "a character device"),
        "BlockDevice" => expect(found == FileKind::BlockDevice, "a block device"),
        other => Err(PlanError::InvalidHostPathType(other.to_string())),
    }
}

/// Whether a bound token must be requested again (upstream token manager
/// `requiresRefresh`): past 80% of its lifetime, or older than 24 hours.
pub fn token_needs_refresh(now: i64, expires_at: i64, expiration_seconds: i64) -> bool {
    let issued_at = expires_at - expiration_seconds;
    now >= issued_at + MAX_TOKEN_AGE_SECONDS || now >= expires_at - expiration_seconds / 5
}

/// The size option of a memory-backed emptyDir's tmpfs: its `sizeLimit`, else none (the
/// kernel's default of half the memory).
pub fn tmpfs_size(size_limit: Option<&Quantity>) -> Option<u64> {
    size_limit
        .and_then(|q| parse_quantity(&q.0))
        .filter(|bytes| *bytes > 0.0)
        .map(|bytes| bytes.ceil() as u64)
}

/// The pod's `/etc/hosts` (upstream `managedHostsFileContent`): the standard entries, the
/// pod's IP with its hostname (and FQDN when it has a subdomain), then `hostAliases`.
pub fn etc_hosts(pod: &Pod, pod_ip: &str) -> String {
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    let spec = pod.spec.as_ref();
    let hostname = spec
        .and_then(|s| s.hostname.clone())
        .or_else(|| pod.metadata.name.clone())
        .unwrap_or_default();
    if !pod_ip.is_empty() {
        match spec
            .and_then(|s| s.subdomain.as_deref())
            .filter(|s| !s.is_empty())
        {
            Some(subdomain) => {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
                out.push_str(&format!(
                    "{pod_ip}\t{hostname}.{subdomain}.{namespace}.svc.cluster.local\t{hostname}\n"
                ));
            }
            None => out.push_str(&format!("{pod_ip}\t{hostname}\n")),
        }
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_ref());
    if let Some(aliases) = aliases.filter(|a| !a.is_empty()) {
        out.push_str("\n# Entries added by HostAliases.\n");
        for alias in aliases {
            let names = alias.hostnames.clone().unwrap_or_default().join("\t");
            out.push_str(&format!("{}\t{names}\n", alias.ip));
        }
    }
    out
}

/// A volume as set up on the node: where it is and how it mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountedVolume {
    /// The host path containers bind-mount (a directory, a file or a device).
    pub host_path: PathBuf,
    /// Mounted read-only whatever the volumeMount says.
    pub read_only: bool,
    /// A raw block device (a `volumeMode: Block` claim), for `volumeDevices`.
    pub block: bool,
}

/// What a container gets from its pod's volumes, ready for its CRI config.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerMounts {
    /// Bind mounts (volumeMounts, `/etc/hosts`, the termination log).
    pub mounts: Vec<cri::Mount>,
    /// Block devices (volumeDevices).
    pub devices: Vec<cri::Device>,
}

/// A checked subPath: relative, with no `..` element.
fn safe_sub_path(kind: &'static str, path: &str) -> Result<PathBuf, MountError> {
    let p = Path::new(path);
    let ok = !p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(p.to_path_buf())
    } else {
        Err(MountError::SubPath {
            kind,
            path: path.to_string(),
        })
    }
}

/// One CRI mount of a container and, for a subPath, the directory to create first.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedMount {
    /// The CRI mount.
    pub mount: cri::Mount,
    /// A subPath directory that does not exist yet is created (upstream `SafeMakeDir`).
    pub sub_path: Option<PathBuf>,
}

/// The container's mounts (upstream `makeMounts`): each volumeMount at its mountPath,
/// read-only when it or its volume says so, with `subPath` or `subPathExpr` (expanded
/// against the container's environment) joined to the volume's path.
pub fn container_mounts(
    container: &Container,
    volumes: &HashMap<String, MountedVolume>,
    env: &[(String, String)],
) -> Result<Vec<PlannedMount>, MountError> {
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes
            .get(&mount.name)
            .ok_or_else(|| MountError::NoVolume {
                volume: mount.name.clone(),
                container: container.name.clone(),
            })?;
        let sub = match (&mount.sub_path, &mount.sub_path_expr) {
            (Some(path), _) if !path.is_empty() => Some(safe_sub_path("subPath", path)?),
            (_, Some(expr)) if !expr.is_empty() => {
                let path = crate::translate::expand(expr, &vars);
                Some(safe_sub_path("subPathExpr", &path)?)
            }
            _ => None,
        };
        let host_path = match &sub {
            Some(sub) => volume.host_path.join(sub),
            None => volume.host_path.clone(),
        };
        mounts.push(PlannedMount {
            mount: cri::Mount {
                container_path: mount.mount_path.clone(),
                host_path: host_path.to_string_lossy().into_owned(),
                readonly: volume.read_only || mount.read_only.unwrap_or(false),
                ..Default::default()
            },
            sub_path: sub.map(|_| host_path),
        });
    }
    Ok(mounts)
}

/// The container's raw block devices (upstream `makeBlockVolumes`): each volumeDevice's
/// volume must be a block volume.
pub fn container_devices(
    container: &Container,
    volumes: &HashMap<String, MountedVolume>,
) -> Result<Vec<cri::Device>, MountError> {
    let mut devices = Vec::new();
    for device in container.volume_devices.iter().flatten() {
        let volume = volumes
            .get(&device.name)
            .filter(|v| v.block)
            .ok_or_else(|| MountError::NoVolume {
                volume: device.name.clone(),
                container: container.name.clone(),
            })?;
        devices.push(cri::Device {
            container_path: device.device_path.clone(),
            host_path: volume.host_path.to_string_lossy().into_owned(),
            permissions: if volume.read_only { "r" } else { "mrw" }.to_string(),
        });
    }
    Ok(devices)
}

/// The VolumeAttachment the attach-detach controller makes for a CSI volume on a node
/// (upstream `getAttachmentName`: `csi-` + sha256 of handle, driver and node).
pub fn attachment_name(volume_handle: &str, driver: &str, node_name: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{volume_handle}{driver}{node_name}").as_bytes(),
    );
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// Whether the container mounts something at `path` itself.
pub fn mounts_at(container: &Container, path: &str) -> bool {
    container
        .volume_mounts
        .iter()
        .flatten()
        .any(|m| m.mount_path.trim_end_matches('/') == path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1",
                         "labels": {"app": "web", "tier": "a\"b"},
                         "annotations": {"note": "x"}},
            "spec": spec,
        }))
        .expect("pod")
    }

    fn data(pairs: &[(&str, &str)]) -> ObjectData {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn items(value: serde_json::Value) -> Vec<KeyToPath> {
        serde_json::from_value(value).expect("items")
    }

    #[test]
    fn layout_is_upstreams() {
        let root = Path::new("/var/lib/kubelet");
        for (plugin, want) in [
            (
                Plugin::EmptyDir,
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/v",
            ),
            (
                Plugin::ConfigMap,
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/v",
            ),
            (
                Plugin::Secret,
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~secret/v",
            ),
            (
                Plugin::Projected,
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~projected/v",
            ),
            (
                Plugin::DownwardApi,
                "/var/lib/kubelet/pods/u/volumes/kubernetes.io~downward-api/v",
            ),
        ] {
            assert_eq!(volume_dir(root, "u", plugin, "v"), Path::new(want));
        }
        assert!(Plugin::Secret.read_only_data() && !Plugin::EmptyDir.read_only_data());
    }

    #[test]
    fn key_payloads_follow_make_payload() {
        let cm = data(&[("a", "1"), ("b", "2")]);
        // All keys with the default mode.
        let all = key_payload("configmap", None, &cm, None, false).expect("all");
        assert_eq!(all.len(), 2);
        assert_eq!(all["a"].data, b"1");
        assert_eq!(all["a"].mode, 0o644);
        // defaultMode applies to every key.
        let all = key_payload("configmap", None, &cm, Some(0o400), false).expect("mode");
        assert_eq!(all["b"].mode, 0o400);
        // Items: only listed keys, at their paths, item mode over default.
        let listed =
            items(json!([{"key": "a", "path": "dir/x", "mode": 0o600}, {"key": "b", "path": "y"}]));
        let some = key_payload("configmap", Some(&listed), &cm, Some(0o440), false).expect("items");
        assert_eq!(some.keys().collect::<Vec<_>>(), ["dir/x", "y"]);
        assert_eq!(some["dir/x"].mode, 0o600);
        assert_eq!(some["y"].mode, 0o440);
        // A missing listed key: upstream's messages, unless optional.
        let missing = items(json!([{"key": "zz", "path": "z"}]));
        assert_eq!(
            key_payload("configmap", Some(&missing), &cm, None, false)
                .expect_err("missing")
                .to_string(),
            "configmap references non-existent config key: zz"
        );
        assert_eq!(
            key_payload("secret", Some(&missing), &cm, None, false)
                .expect_err("missing")
                .to_string(),
            "references non-existent secret key: zz"
        );
        assert!(
            key_payload("secret", Some(&missing), &cm, None, true)
                .expect("optional")
                .is_empty()
        );
        // An empty items list means all keys.
        assert_eq!(
            key_payload("configmap", Some(&[]), &cm, None, false)
                .expect("empty")
                .len(),
            2
        );
    }

    #[test]
    fn not_found_reads_as_upstreams_failed_mount() {
        let err = PlanError::NotFound {
            kind: "configmap",
            name: "y".into(),
        };
        assert_eq!(err.to_string(), "configmap \"y\" not found");
    }

    #[test]
    fn downward_payload_formats_fields() {
        let pod = pod(json!({"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}]}));
        let files: Vec<DownwardAPIVolumeFile> = serde_json::from_value(json!([
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}, "mode": 0o400},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "cpu-cores", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
        ]))
        .expect("files");
        let payload = downward_payload(&pod, &files, None).expect("payload");
        let text = |k: &str| String::from_utf8(payload[k].data.clone()).expect("utf8");
        assert_eq!(text("name"), "web");
        assert_eq!(text("ns"), "prod");
        assert_eq!(payload["ns"].mode, 0o400);
        assert_eq!(payload["name"].mode, 0o644);
        assert_eq!(text("labels"), "app=\"web\"\ntier=\"a\\\"b\"");
        assert_eq!(text("app"), "web");
        assert_eq!(text("cpu"), "500");
        assert_eq!(text("cpu-cores"), "1");
        assert_eq!(text("mem"), "64");
        let bad: Vec<DownwardAPIVolumeFile> =
            serde_json::from_value(json!([{"path": "x", "fieldRef": {"fieldPath": "spec.nope"}}]))
                .expect("bad");
        assert!(matches!(
            downward_payload(&pod, &bad, None),
            Err(PlanError::FieldPath(_))
        ));
    }

    #[test]
    fn payload_paths_may_not_escape() {
        let file = FileProjection {
            data: vec![],
            mode: 0o644,
        };
        for bad in ["/etc/passwd", "../x", "a/../../x", "..data", "a/..x", ""] {
            let payload = Payload::from([(bad.to_string(), file.clone())]);
            assert!(validate_payload(&payload).is_err(), "{bad}");
        }
        let payload = Payload::from([
            ("./a/b".to_string(), file.clone()),
            ("a/c".to_string(), file.clone()),
            ("d".to_string(), file.clone()),
        ]);
        let clean = validate_payload(&payload).expect("valid");
        assert_eq!(clean.keys().collect::<Vec<_>>(), ["a/b", "a/c", "d"]);
        assert_eq!(top_level_names(&clean), ["a", "d"]);
    }

    #[test]
    fn host_path_types_check_as_upstream() {
        use FileKind::*;
        use HostPathAction::*;
        let ok = |t: &str, found| check_host_path("/p", Some(t), found);
        assert_eq!(check_host_path("/p", None, Absent), Ok(Use));
        assert_eq!(ok("DirectoryOrCreate", Absent), Ok(MakeDir));
        assert_eq!(ok("DirectoryOrCreate", Directory), Ok(Use));
        assert_eq!(ok("Directory", Directory), Ok(Use));
        assert_eq!(ok("FileOrCreate", Absent), Ok(MakeFile));
        assert_eq!(ok("FileOrCreate", File), Ok(Use));
        assert_eq!(ok("File", File), Ok(Use));
        assert_eq!(ok("Socket", Socket), Ok(Use));
        assert_eq!(ok("CharDevice", CharDevice), Ok(Use));
        assert_eq!(ok("BlockDevice", BlockDevice), Ok(Use));
        for (t, found, message) in [
            (
                "Directory",
                Absent,
                "hostPath type check failed: /p is not a directory",
            ),
            (
                "DirectoryOrCreate",
                File,
                "hostPath type check failed: /p is not a directory",
            ),
            (
                "File",
                Directory,
                "hostPath type check failed: /p is not a file",
            ),
            (
                "FileOrCreate",
                Directory,
                "hostPath type check failed: /p is not a file",
            ),
            (
                "Socket",
                File,
                "hostPath type check failed: /p is not a socket file",
            ),
            (
                "CharDevice",
                BlockDevice,
                "hostPath type check failed: /p is not a character device",
            ),
            (
                "BlockDevice",
                Absent,
                "hostPath type check failed: /p is not a block device",
            ),
            ("Weird", Absent, "Weird is an invalid volume type"),
        ] {
            assert_eq!(
                ok(t, found).expect_err(t).to_string(),
                message,
                "{t} {found:?}"
            );
        }
    }

    #[test]
    fn tokens_refresh_at_80_percent_or_a_day() {
        // A one-hour token issued at 0.
        assert!(!token_needs_refresh(0, 3600, 3600));
        assert!(!token_needs_refresh(2879, 3600, 3600));
        assert!(token_needs_refresh(2880, 3600, 3600));
        assert!(token_needs_refresh(4000, 3600, 3600));
        // A week-long token is refreshed after a day.
        let week = 7 * 24 * 3600;
        assert!(!token_needs_refresh(3600, week, week));
        assert!(token_needs_refresh(24 * 3600, week, week));
    }

    #[test]
    fn attachment_names_match_the_attach_detach_controller() {
        let name = attachment_name("vol-1", "ebs.csi.aws.com", "n1");
        assert!(name.starts_with("csi-") && name.len() == 4 + 64, "{name}");
        assert_ne!(name, attachment_name("vol-1", "ebs.csi.aws.com", "n2"));
    }

    #[test]
    fn tmpfs_size_comes_from_size_limit() {
        assert_eq!(tmpfs_size(None), None);
        assert_eq!(
            tmpfs_size(Some(&Quantity("64Mi".into()))),
            Some(64 * 1024 * 1024)
        );
        assert_eq!(
            tmpfs_size(Some(&Quantity("1G".into()))),
            Some(1_000_000_000)
        );
        assert_eq!(tmpfs_size(Some(&Quantity("0".into()))), None);
    }

    #[test]
    fn etc_hosts_names_the_pod() {
        let plain = pod(json!({"containers": [],
            "hostAliases": [{"ip": "10.0.0.9", "hostnames": ["a", "b"]}]}));
        let text = etc_hosts(&plain, "10.244.0.5");
        assert!(text.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(text.contains("\n10.244.0.5\tweb\n"), "{text}");
        assert!(
            text.ends_with("\n# Entries added by HostAliases.\n10.0.0.9\ta\tb\n"),
            "{text}"
        );
        let sub = pod(json!({"containers": [], "hostname": "h", "subdomain": "s"}));
        assert!(
            etc_hosts(&sub, "10.244.0.6").contains("10.244.0.6\th.s.prod.svc.cluster.local\th\n")
        );
    }

    #[test]
    fn volume_mounts_become_cri_mounts() {
        let container: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "cfg", "mountPath": "/etc/cfg"},
            {"name": "data", "mountPath": "/data", "readOnly": true},
            {"name": "data", "mountPath": "/sub", "subPath": "a/b"},
            {"name": "data", "mountPath": "/expr", "subPathExpr": "$(POD)/logs"},
        ]}))
        .expect("container");
        let volumes = HashMap::from([
            (
                "cfg".to_string(),
                MountedVolume {
                    host_path: "/r/cfg".into(),
                    read_only: true,
                    block: false,
                },
            ),
            (
                "data".to_string(),
                MountedVolume {
                    host_path: "/r/data".into(),
                    read_only: false,
                    block: false,
                },
            ),
            (
                "disk".to_string(),
                MountedVolume {
                    host_path: "/dev/xvdba".into(),
                    read_only: false,
                    block: true,
                },
            ),
        ]);
        let env = [("POD".to_string(), "web-1".to_string())];
        let mounts = container_mounts(&container, &volumes, &env).expect("mounts");
        let view: Vec<(&str, &str, bool)> = mounts
            .iter()
            .map(|m| {
                (
                    m.mount.container_path.as_str(),
                    m.mount.host_path.as_str(),
                    m.mount.readonly,
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("/etc/cfg", "/r/cfg", true),
                ("/data", "/r/data", true),
                ("/sub", "/r/data/a/b", false),
                ("/expr", "/r/data/web-1/logs", false),
            ]
        );
        assert_eq!(mounts[0].sub_path, None);
        assert_eq!(mounts[2].sub_path, Some(PathBuf::from("/r/data/a/b")));

        let bad: Container = serde_json::from_value(json!({"name": "c", "volumeMounts": [
            {"name": "data", "mountPath": "/x", "subPath": "../../etc"}]}))
        .expect("bad");
        assert!(matches!(
            container_mounts(&bad, &volumes, &[]),
            Err(MountError::SubPath { .. })
        ));
        let none: Container = serde_json::from_value(
            json!({"name": "c", "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}),
        )
        .expect("none");
        assert_eq!(
            container_mounts(&none, &volumes, &[])
                .expect_err("no volume")
                .to_string(),
            "cannot find volume \"nope\" to mount into container \"c\""
        );
        assert!(mounts_at(&container, "/etc/cfg") && !mounts_at(&container, "/etc/hosts"));

        let raw: Container = serde_json::from_value(json!({"name": "c", "volumeDevices": [
            {"name": "disk", "devicePath": "/dev/xvda"}]}))
        .expect("raw");
        let devices = container_devices(&raw, &volumes).expect("devices");
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].host_path, "/dev/xvdba");
        assert_eq!(devices[0].container_path, "/dev/xvda");
        assert_eq!(devices[0].permissions, "mrw");
        let not_block: Container = serde_json::from_value(json!({"name": "c", "volumeDevices": [
            {"name": "data", "devicePath": "/dev/xvda"}]}))
        .expect("not block");
        assert!(container_devices(&not_block, &volumes).is_err());
    }
}
