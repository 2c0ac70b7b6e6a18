//! Pod volumes (upstream's volume manager and plugins, thin IO around [`plan`]): before a
//! pod's sandbox is made, each volume is set up under
//! `<root-dir>/pods/<uid>/volumes/kubernetes.io~<plugin>/<name>` — emptyDir (a directory, or
//! a tmpfs for `medium: Memory`), hostPath (type-checked in place), configMap, secret,
//! downwardAPI and projected (written by [`atomic`]'s AtomicWriter, service-account tokens
//! from the TokenRequest API bound to the pod), persistentVolumeClaim (a `hostPath` or
//! `local` PV, or the device a CSI VolumeAttachment reports). API-data volumes are re-synced
//! every [`RESYNC`] (their ConfigMaps and Secrets read through a cache the node's pods share)
//! and tokens rotated, writing only on change. A volume that cannot be set
//! up leaves the pod in ContainerCreating with upstream's `FailedMount` event. A removed
//! pod's directory is unmounted and removed.

pub mod atomic;
pub mod plan;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Event, EventSource, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, Pod, Secret, ServiceAccount, Volume,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use plan::{
    ContainerMounts, FileKind, HostPathAction, MountedVolume, ObjectData, Payload, PlanError,
    Plugin,
};

/// How often API-data volumes are re-read and tokens checked (upstream: the sync period
/// plus the cache TTL, about a minute).
pub const RESYNC: Duration = Duration::from_secs(5);
/// The least time between two reports of the same failure as an event.
const EVENT_INTERVAL: Duration = Duration::from_secs(10);

/// Why a volume could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// What the volume's content or type says is wrong.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The API could not be read.
    #[error("{0}")]
    Api(String),
    /// Writing the files failed.
    #[error(transparent)]
    Write(#[from] atomic::WriteError),
    /// A filesystem call or a mount failed.
    #[error("{0}")]
    Io(String),
    /// One or more volumes failed (each already reported as an event).
    #[error("unmounted volumes=[{}]: {first}", .volumes.join(" "))]
    Unmounted {
        /// The volumes that are not set up.
        volumes: Vec<String>,
        /// The first failure.
        first: String,
    },
    /// A container's mounts cannot be made.
    #[error(transparent)]
    Mount(#[from] plan::MountError),
}

fn api_error(err: kube::Error) -> VolumeError {
    match err {
        kube::Error::Api(status) => VolumeError::Api(status.message),
        other => VolumeError::Api(other.to_string()),
    }
}

fn io_error(what: &str, path: &Path, err: std::io::Error) -> VolumeError {
    VolumeError::Io(format!("{what} {}: {err}", path.display()))
}

/// A token the kubelet requested for a projected volume.
#[derive(Debug, Clone)]
struct Token {
    token: String,
    audience: String,
    expiration_seconds: i64,
    expires_at: i64,
}

/// What the manager remembers of one pod.
#[derive(Debug, Default)]
struct PodState {
    volumes: HashMap<String, MountedVolume>,
    synced_at: Option<Instant>,
    tokens: HashMap<String, Token>,
    /// Failure message → (event name, count, last reported).
    events: HashMap<String, (String, i32, Instant)>,
}

/// A ConfigMap or Secret as last read: (kind, namespace, name) → (when, its data or absent).
type ObjectCache = HashMap<(&'static str, String, String), (Instant, Option<ObjectData>)>;

/// The volumes of every pod on the node.
pub struct VolumeManager {
    root: PathBuf,
    client: kube::Client,
    node_name: String,
    pods: Mutex<HashMap<String, PodState>>,
    /// ConfigMaps and Secrets shared by the node's pods (upstream's TTL-based
    /// `cacheBasedManager`): a re-sync reads an object at most every [`RESYNC`], however many
    /// pods mount it; a volume set up for the first time reads it afresh.
    objects: Mutex<ObjectCache>,
}

/// A pod's volumes, set up: what its containers' mounts are made of.
#[derive(Debug, Clone, Default)]
struct PodVolumes {
    pod_dir: PathBuf,
    volumes: HashMap<String, MountedVolume>,
}

fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// What is at `path` (following symlinks, as upstream's checker does).
fn file_kind(path: &Path) -> FileKind {
    match std::fs::metadata(path) {
        Err(_) => FileKind::Absent,
        Ok(meta) => {
            let t = meta.file_type();
            if t.is_dir() {
                FileKind::Directory
            } else if t.is_file() {
                FileKind::File
            } else if t.is_socket() {
                FileKind::Socket
            } else if t.is_char_device() {
                FileKind::CharDevice
            } else if t.is_block_device() {
                FileKind::BlockDevice
            } else {
                FileKind::Other
            }
        }
    }
}

/// The mount points at or under `dir`, deepest first (from `/proc/self/mountinfo`).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

fn run(program: &str, args: &[&str]) -> Result<(), VolumeError> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|err| VolumeError::Io(format!("running {program}: {err}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(VolumeError::Io(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn object_data(
    data: Option<BTreeMap<String, String>>,
    binary: Option<BTreeMap<String, k8s_openapi::ByteString>>,
) -> ObjectData {
    let mut out: ObjectData = data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect();
    for (k, v) in binary.unwrap_or_default() {
        out.insert(k, v.0);
    }
    out
}

impl VolumeManager {
    /// A manager keeping pods' volumes under `root/pods`.
    pub fn new(root: PathBuf, client: kube::Client, node_name: String) -> Self {
        Self {
            root,
            client,
            node_name,
            pods: Mutex::new(HashMap::new()),
            objects: Mutex::new(HashMap::new()),
        }
    }

    /// Reads ConfigMap or Secret `namespace/name` (`kind` `configmap` or `secret`; `None`:
    /// it does not exist) through
    /// the shared cache: a copy younger than [`RESYNC`] serves a re-sync (`reuse`).
    pub async fn object(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        reuse: bool,
    ) -> Result<Option<ObjectData>, VolumeError> {
        let key = (kind, namespace.to_string(), name.to_string());
        let cache = || match self.objects.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if reuse
            && let Some((at, data)) = cache().get(&key)
            && at.elapsed() < RESYNC
        {
            return Ok(data.clone());
        }
        let data = if kind == "secret" {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
            api.get_opt(name)
                .await
                .map_err(api_error)?
                .map(|secret| object_data(secret.string_data, secret.data))
        } else {
            let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
            api.get_opt(name)
                .await
                .map_err(api_error)?
                .map(|cm| object_data(cm.data, cm.binary_data))
        };
        let mut objects = cache();
        objects.retain(|_, (at, _)| at.elapsed() < RESYNC * 10);
        objects.insert(key, (Instant::now(), data.clone()));
        Ok(data)
    }

    fn state<T>(&self, f: impl FnOnce(&mut HashMap<String, PodState>) -> T) -> T {
        let mut guard = match self.pods.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(&mut guard)
    }

    /// Sets up (or re-syncs, at most every [`RESYNC`]) every volume of `pod` (upstream
    /// `WaitForAttachAndMount`). A volume that fails is reported as a `FailedMount` event;
    /// one that was set up before keeps its last content, so running containers go on.
    pub async fn prepare(&self, pod: &Pod) -> Result<(), VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let volumes: Vec<Volume> = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.clone())
            .unwrap_or_default();
        let fresh = self.state(|pods| {
            pods.get(&uid).is_some_and(|state| {
                let recent = state.synced_at.is_some_and(|t| t.elapsed() < RESYNC);
                let complete = volumes.iter().all(|v| state.volumes.contains_key(&v.name));
                recent && complete
            })
        });
        if fresh {
            return Ok(());
        }
        let (previous, mut tokens) = self.state(|pods| {
            let state = pods.entry(uid.clone()).or_default();
            (state.volumes.clone(), state.tokens.clone())
        });
        let mut ready = HashMap::new();
        let mut failed = Vec::new();
        let mut first = None;
        for volume in &volumes {
            let reuse = previous.contains_key(&volume.name);
            match self.set_up(pod, volume, &mut tokens, reuse).await {
                Ok(mounted) => {
                    ready.insert(volume.name.clone(), mounted);
                }
                Err(err) => {
                    let message = format!(
                        "MountVolume.SetUp failed for volume \"{}\" : {err}",
                        volume.name
                    );
                    tracing::warn!(pod = ?pod.metadata.name, %message);
                    self.event(pod, &uid, "FailedMount", &message).await;
                    match previous.get(&volume.name) {
                        Some(mounted) => {
                            ready.insert(volume.name.clone(), mounted.clone());
                        }
                        None => {
                            failed.push(volume.name.clone());
                            first.get_or_insert(err.to_string());
                        }
                    }
                }
            }
        }
        self.state(|pods| {
            let state = pods.entry(uid.clone()).or_default();
            state.volumes = ready;
            state.tokens = tokens;
            state.synced_at = Some(Instant::now());
            if failed.is_empty() {
                state.events.clear();
            }
        });
        match first {
            None => Ok(()),
            Some(first) => Err(VolumeError::Unmounted {
                volumes: failed,
                first,
            }),
        }
    }

    /// Posts (or counts again, at most every [`EVENT_INTERVAL`]) a Warning event on `pod`,
    /// as the kubelet's event recorder does.
    async fn event(&self, pod: &Pod, uid: &str, reason: &str, message: &str) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let previous = self.state(|pods| {
            pods.get(uid)
                .and_then(|s| s.events.get(message))
                .map(|(event, count, at)| (event.clone(), *count, *at))
        });
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let outcome = match previous {
            Some((_, _, at)) if at.elapsed() < EVENT_INTERVAL => return,
            Some((event, count, _)) => {
                let patch = json!({"count": count + 1, "lastTimestamp": now});
                api.patch(&event, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| (event, count + 1))
            }
            None => {
                let event_name = format!(
                    "{name}.{:x}",
                    k8s_openapi::jiff::Timestamp::now().as_nanosecond()
                );
                let event = Event {
                    metadata: ObjectMeta {
                        name: Some(event_name.clone()),
                        namespace: Some(namespace.clone()),
                        ..Default::default()
                    },
                    involved_object: ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(name.clone()),
                        namespace: Some(namespace.clone()),
                        uid: Some(uid.to_string()),
                        resource_version: pod.metadata.resource_version.clone(),
                        ..Default::default()
                    },
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                    type_: Some("Warning".into()),
                    source: Some(EventSource {
                        component: Some("kubelet".into()),
                        host: Some(self.node_name.clone()),
                    }),
                    first_timestamp: Some(now.clone()),
                    last_timestamp: Some(now),
                    count: Some(1),
                    reporting_component: Some("kubelet".into()),
                    reporting_instance: Some(self.node_name.clone()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &event)
                    .await
                    .map(|_| (event_name, 1))
            }
        };
        match outcome {
            Ok((event, count)) => self.state(|pods| {
                pods.entry(uid.to_string())
                    .or_default()
                    .events
                    .insert(message.to_string(), (event, count, Instant::now()));
            }),
            Err(err) => {
                tracing::debug!(%err, "posting an event failed");
                // The event may have expired: the next report creates a new one.
                self.state(|pods| {
                    if let Some(state) = pods.get_mut(uid) {
                        state.events.remove(message);
                    }
                });
            }
        }
    }

    /// One volume (upstream: the plugin's `SetUp`); `reuse`: it was set up before, so its
    /// ConfigMaps and Secrets may come from the shared cache.
    async fn set_up(
        &self,
        pod: &Pod,
        volume: &Volume,
        tokens: &mut HashMap<String, Token>,
        reuse: bool,
    ) -> Result<MountedVolume, VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let dir = |plugin| plan::volume_dir(&self.root, &uid, plugin, &volume.name);
        let data_volume = |plugin: Plugin| MountedVolume {
            host_path: dir(plugin),
            read_only: plugin.read_only_data(),
            block: false,
        };
        if let Some(empty) = &volume.empty_dir {
            let path = dir(Plugin::EmptyDir);
            std::fs::create_dir_all(&path).map_err(|e| io_error("creating", &path, e))?;
            if empty.medium.as_deref() == Some("Memory") && mounts_under(&path).is_empty() {
                let mut options = String::from("mode=0777");
                if let Some(size) = plan::tmpfs_size(empty.size_limit.as_ref()) {
                    options.push_str(&format!(",size={size}"));
                }
                let target = path.to_string_lossy();
                run("mount", &["-t", "tmpfs", "-o", &options, "tmpfs", &target])?;
            }
            // Upstream's emptyDir is world-writable so any container user can use it.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                .map_err(|e| io_error("chmod", &path, e))?;
            return Ok(MountedVolume {
                host_path: path,
                read_only: false,
                block: false,
            });
        }
        if let Some(host) = &volume.host_path {
            return host_path(&host.path, host.type_.as_deref(), false);
        }
        if let Some(source) = &volume.config_map {
            let name = source.name.clone();
            let optional = source.optional.unwrap_or(false);
            let data = self
                .source("configmap", &namespace, &name, optional, reuse)
                .await?;
            let payload = plan::key_payload(
                "configmap",
                source.items.as_deref(),
                &data,
                source.default_mode,
                optional,
            )?;
            atomic::write(&dir(Plugin::ConfigMap), &payload)?;
            return Ok(data_volume(Plugin::ConfigMap));
        }
        if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let optional = source.optional.unwrap_or(false);
            let data = self
                .source("secret", &namespace, &name, optional, reuse)
                .await?;
            let payload = plan::key_payload(
                "secret",
                source.items.as_deref(),
                &data,
                source.default_mode,
                optional,
            )?;
            atomic::write(&dir(Plugin::Secret), &payload)?;
            return Ok(data_volume(Plugin::Secret));
        }
        if let Some(source) = &volume.downward_api {
            let payload = plan::downward_payload(
                pod,
                source.items.as_deref().unwrap_or_default(),
                source.default_mode,
            )?;
            atomic::write(&dir(Plugin::DownwardApi), &payload)?;
            return Ok(data_volume(Plugin::DownwardApi));
        }
        if let Some(projected) = &volume.projected {
            let default_mode = projected.default_mode;
            let mut payload = Payload::new();
            for source in projected.sources.iter().flatten() {
                if let Some(s) = &source.config_map {
                    let optional = s.optional.unwrap_or(false);
                    let data = self
                        .source("configmap", &namespace, &s.name, optional, reuse)
                        .await?;
                    payload.extend(plan::key_payload(
                        "configmap",
                        s.items.as_deref(),
                        &data,
                        default_mode,
                        optional,
                    )?);
                } else if let Some(s) = &source.secret {
                    let optional = s.optional.unwrap_or(false);
                    let data = self
                        .source("secret", &namespace, &s.name, optional, reuse)
                        .await?;
                    payload.extend(plan::key_payload(
                        "secret",
                        s.items.as_deref(),
                        &data,
                        default_mode,
                        optional,
                    )?);
                } else if let Some(s) = &source.downward_api {
                    payload.extend(plan::downward_payload(
                        pod,
                        s.items.as_deref().unwrap_or_default(),
                        default_mode,
                    )?);
                } else if let Some(s) = &source.service_account_token {
                    let key = format!("{}/{}", volume.name, s.path);
                    let audience = s.audience.clone().unwrap_or_default();
                    let seconds = s.expiration_seconds.unwrap_or(plan::DEFAULT_TOKEN_SECONDS);
                    let reuse = tokens.get(&key).filter(|t| {
                        t.audience == audience
                            && t.expiration_seconds == seconds
                            && !plan::token_needs_refresh(now_seconds(), t.expires_at, seconds)
                    });
                    let token = match reuse {
                        Some(token) => token.clone(),
                        None => {
                            let token = self.request_token(pod, &audience, seconds).await?;
                            tracing::info!(pod = ?pod.metadata.name, volume = %volume.name, "service-account token requested");
                            tokens.insert(key, token.clone());
                            token
                        }
                    };
                    payload.insert(
                        s.path.clone(),
                        plan::FileProjection {
                            data: token.token.into_bytes(),
                            mode: u32::try_from(default_mode.unwrap_or(plan::DEFAULT_MODE))
                                .unwrap_or(0o644),
                        },
                    );
                } else {
                    return Err(PlanError::Unsupported.into());
                }
            }
            atomic::write(&dir(Plugin::Projected), &payload)?;
            return Ok(data_volume(Plugin::Projected));
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            let mut mounted = self.claim(pod, &claim.claim_name).await?;
            mounted.read_only |= claim.read_only.unwrap_or(false);
            return Ok(mounted);
        }
        Err(PlanError::Unsupported.into())
    }

    /// A volume's ConfigMap or Secret (`kind`): missing is an error unless `optional`.
    async fn source(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        optional: bool,
        reuse: bool,
    ) -> Result<ObjectData, VolumeError> {
        match self.object(kind, namespace, name, reuse).await? {
            Some(data) => Ok(data),
            None if optional => Ok(ObjectData::new()),
            None => Err(PlanError::NotFound {
                kind,
                name: name.to_string(),
            }
            .into()),
        }
    }

    /// `POST serviceaccounts/{name}/token` bound to the pod (upstream token manager).
    async fn request_token(
        &self,
        pod: &Pod,
        audience: &str,
        seconds: i64,
    ) -> Result<Token, VolumeError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.to_string()]
                },
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let answer = api
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|err| {
                VolumeError::Api(format!("failed to fetch token: {}", api_error(err)))
            })?;
        let status = answer
            .status
            .ok_or_else(|| VolumeError::Api("failed to fetch token: no status".into()))?;
        Ok(Token {
            token: status.token,
            audience: audience.to_string(),
            expiration_seconds: seconds,
            expires_at: status.expiration_timestamp.0.as_second(),
        })
    }

    /// A claim's bound PV as the node sees it: a hostPath or local path, or the device a
    /// CSI VolumeAttachment to this node reports.
    async fn claim(&self, pod: &Pod, claim_name: &str) -> Result<MountedVolume, VolumeError> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &namespace);
        let claim = claims
            .get_opt(claim_name)
            .await
            .map_err(api_error)?
            .ok_or_else(|| {
                VolumeError::Api(format!("persistentvolumeclaim \"{claim_name}\" not found"))
            })?;
        let phase = claim
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        let pv_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if phase != "Bound" || pv_name.is_empty() {
            return Err(VolumeError::Api(format!(
                "PVC {namespace}/{claim_name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({pv_name:?})"
            )));
        }
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let pv = pvs.get(&pv_name).await.map_err(api_error)?;
        let spec = pv.spec.unwrap_or_default();
        let block = spec.volume_mode.as_deref() == Some("Block");
        if let Some(host) = &spec.host_path {
            return host_path(&host.path, host.type_.as_deref(), block);
        }
        if let Some(local) = &spec.local {
            let want = if block { "BlockDevice" } else { "Directory" };
            return host_path(&local.path, Some(want), block);
        }
        if let Some(csi) = &spec.csi {
            let name = plan::attachment_name(&csi.volume_handle, &csi.driver, &self.node_name);
            let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
            let attachment = attachments.get_opt(&name).await.map_err(api_error)?;
            let status = attachment.and_then(|a| a.status);
            let device = status
                .as_ref()
                .filter(|s| s.attached)
                .and_then(|s| s.attachment_metadata.as_ref())
                .and_then(|m| m.get("devicePath").cloned())
                .ok_or_else(|| {
                    VolumeError::Io(format!(
                        "volume {} (VolumeAttachment {name}) is not attached to node {} yet",
                        csi.volume_handle, self.node_name
                    ))
                })?;
            if file_kind(Path::new(&device)) != FileKind::BlockDevice {
                return Err(VolumeError::Io(format!(
                    "device {device} that VolumeAttachment {name} reports for volume {} does not exist on this node",
                    csi.volume_handle
                )));
            }
            if block {
                return Ok(MountedVolume {
                    host_path: PathBuf::from(device),
                    read_only: false,
                    block: true,
                });
            }
            let target = plan::volume_dir(&self.root, &uid, Plugin::Csi, &pv_name).join("mount");
            std::fs::create_dir_all(&target).map_err(|e| io_error("creating", &target, e))?;
            if mounts_under(&target).is_empty() {
                let fs_type = csi.fs_type.clone().unwrap_or_else(|| "ext4".into());
                // A blank disk is formatted first, as the CSI driver's SafeFormatAndMount.
                let blank = std::process::Command::new("blkid")
                    .args(["-p", &device])
                    .status()
                    .is_ok_and(|s| s.code() == Some(2));
                if blank {
                    run(&format!("mkfs.{fs_type}"), &[&device])?;
                }
                run("mount", &[&device, &target.to_string_lossy()])?;
            }
            return Ok(MountedVolume {
                host_path: target,
                read_only: false,
                block: false,
            });
        }
        Err(PlanError::Unsupported.into())
    }

    /// `container`'s mounts and devices from the volumes [`Self::prepare`] set up for `pod`,
    /// with the pod's `/etc/hosts` (once it has `pod_ip`) and its termination-message file.
    pub fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        env: &[(String, String)],
        pod_ip: &str,
    ) -> Result<ContainerMounts, VolumeError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let volumes = self.state(|pods| {
            pods.get(&uid)
                .map(|state| state.volumes.clone())
                .unwrap_or_default()
        });
        PodVolumes {
            pod_dir: plan::pod_dir(&self.root, &uid),
            volumes,
        }
        .container_mounts(pod, container, env, pod_ip)
    }

    /// Unmounts and removes everything the kubelet kept for pod `uid` (upstream
    /// `cleanupOrphanedPodDirs`). A mount that will not go keeps the directory, so no
    /// volume's data is ever deleted through it.
    pub fn cleanup(&self, uid: &str) {
        self.state(|pods| pods.remove(uid));
        let dir = plan::pod_dir(&self.root, uid);
        if !dir.exists() {
            return;
        }
        for mount in mounts_under(&dir) {
            if let Err(err) = run("umount", &[&mount.to_string_lossy()]) {
                tracing::warn!(%err, "unmounting a pod volume failed");
            }
        }
        if !mounts_under(&dir).is_empty() {
            tracing::warn!(dir = %dir.display(), "pod directory still has mounts; kept");
            return;
        }
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), %err, "removing a pod directory failed");
        }
    }

    /// Removes the directories of pods not in `known` (deleted while the kubelet was down).
    pub fn remove_orphans(&self, known: &HashSet<String>) {
        let Ok(entries) = std::fs::read_dir(self.root.join("pods")) else {
            return;
        };
        for entry in entries.flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&uid) {
                tracing::info!(pod_uid = %uid, "removing an orphaned pod directory");
                self.cleanup(&uid);
            }
        }
    }
}

/// A hostPath (or a PV's path) after upstream's type check, created when its type says so.
fn host_path(
    path: &str,
    host_type: Option<&str>,
    block: bool,
) -> Result<MountedVolume, VolumeError> {
    let p = Path::new(path);
    match plan::check_host_path(path, host_type, file_kind(p))? {
        HostPathAction::Use => {}
        HostPathAction::MakeDir => {
            std::fs::create_dir_all(p).map_err(|e| io_error("creating", p, e))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| io_error("chmod", p, e))?;
        }
        HostPathAction::MakeFile => {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map_err(|e| io_error("creating", p, e))?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| io_error("chmod", p, e))?;
        }
    }
    Ok(MountedVolume {
        host_path: p.to_path_buf(),
        read_only: false,
        block,
    })
}

impl PodVolumes {
    /// `container`'s mounts and devices (upstream `makeMounts`): its volumeMounts (subPath
    /// directories created), the pod's managed `/etc/hosts` once it has an IP, and a fresh
    /// termination-message file at `terminationMessagePath`.
    fn container_mounts(
        &self,
        pod: &Pod,
        container: &Container,
        env: &[(String, String)],
        pod_ip: &str,
    ) -> Result<ContainerMounts, VolumeError> {
        let planned = plan::container_mounts(container, &self.volumes, env)?;
        let mut mounts = Vec::new();
        for p in planned {
            if let Some(sub) = &p.sub_path
                && !sub.exists()
            {
                std::fs::create_dir_all(sub).map_err(|e| io_error("creating", sub, e))?;
            }
            mounts.push(p.mount);
        }
        let devices = plan::container_devices(container, &self.volumes)?;
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if !pod_ip.is_empty() && !host_network && !plan::mounts_at(container, "/etc/hosts") {
            let hosts = self.pod_dir.join("etc-hosts");
            if !hosts.exists() {
                std::fs::create_dir_all(&self.pod_dir)
                    .map_err(|e| io_error("creating", &self.pod_dir, e))?;
                std::fs::write(&hosts, plan::etc_hosts(pod, pod_ip))
                    .map_err(|e| io_error("writing", &hosts, e))?;
            }
            mounts.push(k8s_cri::v1::Mount {
                container_path: "/etc/hosts".into(),
                host_path: hosts.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        let message_path = container
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        if !message_path.is_empty() && !plan::mounts_at(container, &message_path) {
            let dir = self.pod_dir.join("containers").join(&container.name);
            std::fs::create_dir_all(&dir).map_err(|e| io_error("creating", &dir, e))?;
            let file = dir.join(format!(
                "{:08x}",
                k8s_openapi::jiff::Timestamp::now().subsec_nanosecond()
            ));
            std::fs::write(&file, b"").map_err(|e| io_error("writing", &file, e))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
                .map_err(|e| io_error("chmod", &file, e))?;
            mounts.push(k8s_cri::v1::Mount {
                container_path: message_path,
                host_path: file.to_string_lossy().into_owned(),
                ..Default::default()
            });
        }
        Ok(ContainerMounts { mounts, devices })
    }
}
