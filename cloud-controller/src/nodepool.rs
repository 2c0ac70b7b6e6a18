//! Node pools on instances (EKS managed node groups): one level-based pass brings a pool's
//! instances to its desired size — launching into the pool's subnets spread over zones, with
//! user data carrying the node bootstrap document and a per-pool bootstrap token; draining a
//! node (cordon, then evictions that respect PodDisruptionBudgets) before terminating its
//! instance; replacing instances terminated behind its back — and reports what it saw.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use flotilla_api_machinery::nodeconfig::{
    API_VERSION, ClusterConfig, KIND, KubeletConfig, NodeConfig, NodeConfigSpec,
};
use k8s_openapi::api::core::v1::{Node, Pod, Secret, Taint};
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams, PostParams};
use rand::Rng;
use serde_json::json;

use crate::aws::instance_id_from_provider_id;
use crate::config::CloudSettings;
use crate::node::{UNINITIALIZED_TAINT, is_ready};
use crate::provider::{CloudError, Instance, LaunchRequest, NodeGroups, NodeImage};

/// The tag naming an instance's pool.
pub const POOL_TAG: &str = "flotilla.dev/nodepool";
/// The label every Node of a pool carries (as EKS's `eks.amazonaws.com/nodegroup`).
pub const POOL_LABEL: &str = "flotilla.dev/nodepool";
/// Annotation on a Node being drained for removal: when the drain began (RFC 3339).
pub const DRAIN_ANNOTATION: &str = "flotilla.dev/drain-started";
/// How long a drain may wait for evictions (PDBs) before the instance goes anyway (EKS
/// gives up after 15 minutes too; pods then die with the node).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// How long a running instance may go without its Node, by default, before the pool reports
/// EKS's `NodeCreationFailure` (its user data, bootstrap token or route to the API is wrong).
pub const NODE_JOIN_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The image a pool without one boots when the account has no Flotilla node image registered
/// for the cluster's version.
pub const DEFAULT_IMAGE: &str = "ami-flotilla-node";
/// The tag (value `true`) that makes an AMI a Flotilla node image.
pub const NODE_IMAGE_TAG: &str = "flotilla.dev/node-image";
/// The tag naming the Kubernetes minor version of a node image's kubelet.
pub const KUBERNETES_VERSION_TAG: &str = "flotilla.dev/kubernetes-version";
const MANAGER: &str = "flotilla-nodepool-controller";

/// A pool as the cloud controller needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePoolSpec {
    /// The cluster's name (in user data and the `Name` tag).
    pub cluster_name: String,
    /// The pool's name.
    pub name: String,
    /// Instance types; the first is launched.
    pub instance_types: Vec<String>,
    /// Machine image (default: the newest node image for the cluster's version, as EKS
    /// picks its AMI from an SSM parameter; [`DEFAULT_IMAGE`] when none is registered).
    pub image_id: Option<String>,
    /// The cluster's Kubernetes minor version (`1.32`).
    pub kubernetes_version: String,
    /// Nodes wanted.
    pub desired_size: u32,
    /// Labels of its Nodes.
    pub labels: BTreeMap<String, String>,
    /// Taints of its Nodes.
    pub taints: Vec<Taint>,
    /// Subnets (instances spread over their zones).
    pub subnet_ids: Vec<String>,
    /// Being deleted: every instance goes.
    pub deleting: bool,
}

/// Where nodes find their cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterEndpoint {
    /// The cluster's API URL (`https://host:port/clusters/{id}`).
    pub server: String,
    /// The CA bundle that signed the API's certificate (PEM).
    pub ca_pem: String,
}

/// One problem of a pool (EKS health issue).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolIssue {
    /// EKS-style code.
    pub code: String,
    /// The cloud's message.
    pub message: String,
    /// Resources concerned.
    pub resource_ids: Vec<String>,
}

/// What one pass saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolObservation {
    /// Live instances after the pass.
    pub instance_ids: Vec<String>,
    /// Ready Nodes among them.
    pub ready_nodes: u32,
    /// Problems.
    pub issues: Vec<PoolIssue>,
    /// Deleting and nothing is left.
    pub gone: bool,
}

/// EKS's health-issue code for a cloud error.
pub fn issue_code(err: &CloudError) -> String {
    match err.code.as_str() {
        "InvalidSubnetID.NotFound" | "InvalidSubnetID.Malformed" => "Ec2SubnetNotFound",
        "InvalidAMIID.NotFound" | "InvalidAMIID.Malformed" => "Ec2ImageNotFound",
        "InvalidInstanceType.NotFound" => "Ec2InstanceTypeDoesNotExist",
        "InsufficientInstanceCapacity" | "InsufficientCapacity" => "InsufficientInstanceCapacity",
        "UnauthorizedOperation" | "AccessDenied" | "AuthFailure" => "AccessDenied",
        "InstanceLimitExceeded" | "VcpuLimitExceeded" => "InstanceLimitExceeded",
        "ServiceUnavailable" => "Ec2ServiceUnavailable",
        _ => "InternalFailure",
    }
    .to_string()
}

fn issue(err: &CloudError, resource_ids: Vec<String>) -> PoolIssue {
    PoolIssue {
        code: issue_code(err),
        message: err.to_string(),
        resource_ids,
    }
}

/// The newest of `images` for Kubernetes `version` (by registration time, then name).
pub fn newest_node_image<'a>(images: &'a [NodeImage], version: &str) -> Option<&'a NodeImage> {
    images
        .iter()
        .filter(|image| image.kubernetes_version == version)
        .max_by(|a, b| {
            a.creation_date
                .cmp(&b.creation_date)
                .then(a.name.cmp(&b.name))
        })
}

/// The subnet the next instance goes to: the one whose zone holds the fewest of `live`
/// (ties: the first listed), as an auto scaling group balances zones.
pub fn next_subnet<'a>(subnets: &'a [(String, String)], live: &[Instance]) -> Option<&'a str> {
    subnets
        .iter()
        .min_by_key(|(_, zone)| live.iter().filter(|i| &i.zone == zone).count())
        .map(|(id, _)| id.as_str())
}

/// Which instances go when the pool shrinks by `count`: those already draining first, then
/// those without a Ready Node, then the newest (an auto scaling group's default).
pub fn removal_order<'n>(
    live: &[Instance],
    node_of: impl Fn(&Instance) -> Option<&'n Node>,
    count: usize,
) -> Vec<Instance> {
    let mut ranked: Vec<(&Instance, bool, bool)> = live
        .iter()
        .map(|instance| {
            let node = node_of(instance);
            let draining = node.is_some_and(|n| annotation(n, DRAIN_ANNOTATION).is_some());
            let ready = node.is_some_and(is_ready);
            (instance, draining, ready)
        })
        .collect();
    ranked.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(a.2.cmp(&b.2))
            .then(b.0.launch_time.cmp(&a.0.launch_time))
            .then(b.0.id.cmp(&a.0.id))
    });
    ranked
        .into_iter()
        .take(count)
        .map(|(i, _, _)| i.clone())
        .collect()
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Whether a pod being deleted would have had to be evicted (not a DaemonSet's, a mirror or
/// finished): the drain waits for it to go.
fn must_evict_once_deleted(pod: &Pod) -> bool {
    let mut undeleted = pod.clone();
    undeleted.metadata.deletion_timestamp = None;
    must_evict(&undeleted)
}

/// EKS's `NodeCreationFailure` for the instances launched more than `timeout` before `now`
/// that have no Node: they booted but never joined. `None` when every old instance joined.
pub fn unjoined_instances<'n>(
    live: &[Instance],
    node_of: impl Fn(&Instance) -> Option<&'n Node>,
    now: k8s_openapi::jiff::Timestamp,
    timeout: Duration,
) -> Option<PoolIssue> {
    let late: Vec<String> = live
        .iter()
        .filter(|instance| {
            let launched = instance
                .launch_time
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok();
            let waited = launched.map(|launched| now.duration_since(launched));
            waited.is_some_and(|waited| waited.as_secs() >= timeout.as_secs() as i64)
                && node_of(instance).is_none()
        })
        .map(|instance| instance.id.clone())
        .collect();
    (!late.is_empty()).then(|| PoolIssue {
        code: "NodeCreationFailure".into(),
        message: "Instances failed to join the kubernetes cluster".into(),
        resource_ids: late,
    })
}

/// Pods a drain must evict: not finished, not a DaemonSet's (it would come straight back, as
/// `kubectl drain --ignore-daemonsets`), not a static pod's mirror.
pub fn must_evict(pod: &Pod) -> bool {
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Succeeded" || phase == "Failed");
    let daemon = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|owners| owners.iter().any(|o| o.kind == "DaemonSet"));
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    !finished && !daemon && !mirror && pod.metadata.deletion_timestamp.is_none()
}

/// The node bootstrap document of a pool's instances.
pub fn user_data(
    spec: &NodePoolSpec,
    endpoint: &ClusterEndpoint,
    bootstrap_token: &str,
) -> Result<String, CloudError> {
    let mut labels = spec.labels.clone();
    labels.insert(POOL_LABEL.into(), spec.name.clone());
    let mut taints = spec.taints.clone();
    // As kubelets with `--cloud-provider=external`: the node controller initializes it.
    taints.push(Taint {
        key: UNINITIALIZED_TAINT.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    let config = NodeConfig {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        spec: NodeConfigSpec {
            cluster: ClusterConfig {
                name: spec.cluster_name.clone(),
                api_server_endpoint: endpoint.server.clone(),
                certificate_authority: base64::engine::general_purpose::STANDARD
                    .encode(&endpoint.ca_pem),
            },
            kubelet: KubeletConfig {
                bootstrap_token: bootstrap_token.into(),
                node_labels: labels,
                register_with_taints: taints,
                // Left to the node's first boot (it defaults them): a node image from
                // before these fields refuses a document that has them.
                cluster_dns: Vec::new(),
                cluster_domain: String::new(),
            },
        },
    };
    serde_yaml::to_string(&config)
        .map_err(|err| CloudError::invalid(format!("rendering the node config: {err}")))
}

/// The node pool controller of one cluster.
pub struct NodePools {
    client: kube::Client,
    cloud: Arc<dyn NodeGroups>,
    settings: Arc<CloudSettings>,
    endpoint: ClusterEndpoint,
    node_join_timeout: Duration,
}

impl NodePools {
    /// A controller acting through `client` on `cloud`.
    pub fn new(
        client: kube::Client,
        cloud: Arc<dyn NodeGroups>,
        settings: Arc<CloudSettings>,
        endpoint: ClusterEndpoint,
    ) -> Self {
        NodePools {
            client,
            cloud,
            settings,
            endpoint,
            node_join_timeout: NODE_JOIN_TIMEOUT,
        }
    }

    /// How long an instance may run without its Node before the pool reports
    /// `NodeCreationFailure` (default [`NODE_JOIN_TIMEOUT`]).
    pub fn with_node_join_timeout(mut self, timeout: Duration) -> Self {
        self.node_join_timeout = timeout;
        self
    }

    fn pool_tags(&self, pool: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (self.settings.cluster_tag_key(), "owned".to_string()),
            (POOL_TAG.to_string(), pool.to_string()),
        ])
    }

    /// One pass over every pool of the cluster: the cluster's instances and Nodes are read
    /// once for all of them. Problems become issues of the observations, never errors.
    pub async fn reconcile_all(&self, specs: &[NodePoolSpec]) -> Vec<PoolObservation> {
        if specs.is_empty() {
            return Vec::new();
        }
        let cluster_tag = BTreeMap::from([(self.settings.cluster_tag_key(), "owned".to_string())]);
        let shared = async {
            let instances = self.cloud.instances_tagged(&cluster_tag).await?;
            let nodes: Api<Node> = Api::all(self.client.clone());
            let nodes = nodes
                .list(&ListParams::default())
                .await
                .map_err(crate::node::api_error)?
                .items;
            Ok::<_, CloudError>((instances, nodes))
        };
        let (instances, nodes) = match shared.await {
            Ok(found) => found,
            Err(err) => {
                tracing::warn!(%err, "listing the cluster's instances and nodes failed");
                let failed = PoolObservation {
                    issues: vec![issue(&err, Vec::new())],
                    ..Default::default()
                };
                return vec![failed; specs.len()];
            }
        };
        let mut observations = Vec::with_capacity(specs.len());
        for spec in specs {
            let live: Vec<Instance> = instances
                .iter()
                .filter(|i| i.state.is_live() && i.tags.get(POOL_TAG) == Some(&spec.name))
                .cloned()
                .collect();
            observations.push(match self.reconcile(spec, live, &nodes).await {
                Ok(observation) => observation,
                Err(err) => {
                    tracing::warn!(pool = %spec.name, %err, "node pool reconcile failed");
                    PoolObservation {
                        issues: vec![issue(&err, Vec::new())],
                        ..Default::default()
                    }
                }
            });
        }
        observations
    }

    /// One pool, given its live instances and the cluster's Nodes.
    async fn reconcile(
        &self,
        spec: &NodePoolSpec,
        mut live: Vec<Instance>,
        all_nodes: &[Node],
    ) -> Result<PoolObservation, CloudError> {
        let node_of = |instance: &Instance| -> Option<&Node> {
            all_nodes.iter().find(|node| {
                let provider = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
                match provider.and_then(instance_id_from_provider_id) {
                    Some(id) => id == instance.id,
                    None => node.metadata.name.as_deref() == Some(&instance.private_dns_name),
                }
            })
        };
        let mut issues = Vec::new();
        let desired = if spec.deleting {
            0
        } else {
            spec.desired_size as usize
        };
        if live.len() > desired {
            let victims = removal_order(&live, node_of, live.len() - desired);
            let mut terminate = Vec::new();
            for victim in &victims {
                let drained = match node_of(victim) {
                    Some(node) => self.drain(node).await?,
                    None => true,
                };
                if drained {
                    terminate.push(victim.id.clone());
                }
            }
            if !terminate.is_empty() {
                tracing::info!(pool = %spec.name, instances = ?terminate, "terminating drained instances");
                self.cloud.terminate(&terminate).await?;
                live.retain(|i| !terminate.contains(&i.id));
            }
        }
        if spec.deleting {
            if live.is_empty() {
                self.forget_bootstrap_token(&spec.name).await?;
            }
            return Ok(PoolObservation {
                gone: live.is_empty(),
                instance_ids: live.iter().map(|i| i.id.clone()).collect(),
                ..Default::default()
            });
        }
        if live.len() < desired {
            match self.cloud.subnet_zones(&spec.subnet_ids).await {
                Err(err) => issues.push(issue(&err, spec.subnet_ids.clone())),
                Ok(_) if spec.subnet_ids.is_empty() => issues.push(PoolIssue {
                    code: "Ec2SubnetNotFound".into(),
                    message: "the node pool has no subnets and neither has its cluster".into(),
                    resource_ids: Vec::new(),
                }),
                Ok(zones) => match self.launch_image(spec).await {
                    Err(err) => issues.push(issue(&err, Vec::new())),
                    Ok(image_id) => {
                        let subnets: Vec<(String, String)> =
                            spec.subnet_ids.iter().cloned().zip(zones).collect();
                        let token = self.bootstrap_token(&spec.name).await?;
                        let user_data = user_data(spec, &self.endpoint, &token)?;
                        while live.len() < desired {
                            let Some(subnet) = next_subnet(&subnets, &live) else {
                                break;
                            };
                            let request = self.launch_request(spec, &image_id, subnet, &user_data);
                            match self.cloud.launch(&request).await {
                                Ok(instance) => {
                                    tracing::info!(pool = %spec.name, instance = %instance.id, zone = %instance.zone, image = %image_id, "instance launched");
                                    live.push(instance);
                                }
                                Err(err) => {
                                    issues.push(issue(&err, vec![subnet.to_string()]));
                                    break;
                                }
                            }
                        }
                    }
                },
            }
        }
        issues.extend(unjoined_instances(
            &live,
            node_of,
            k8s_openapi::jiff::Timestamp::now(),
            self.node_join_timeout,
        ));
        let ready_nodes = live
            .iter()
            .filter(|i| node_of(i).is_some_and(is_ready))
            .count();
        Ok(PoolObservation {
            instance_ids: live.iter().map(|i| i.id.clone()).collect(),
            ready_nodes: u32::try_from(ready_nodes).unwrap_or(u32::MAX),
            issues,
            gone: false,
        })
    }

    /// The image a launch for `spec` uses: its own, else the newest node image registered for
    /// the cluster's version, else [`DEFAULT_IMAGE`].
    async fn launch_image(&self, spec: &NodePoolSpec) -> Result<String, CloudError> {
        if let Some(image) = &spec.image_id {
            return Ok(image.clone());
        }
        let images = self.cloud.node_images().await?;
        Ok(newest_node_image(&images, &spec.kubernetes_version)
            .map_or_else(|| DEFAULT_IMAGE.to_string(), |image| image.image_id.clone()))
    }

    fn launch_request(
        &self,
        spec: &NodePoolSpec,
        image_id: &str,
        subnet: &str,
        user_data: &str,
    ) -> LaunchRequest {
        let mut tags = self.pool_tags(&spec.name);
        tags.insert(
            "Name".into(),
            format!("{}-{}-node", spec.cluster_name, spec.name),
        );
        // A fresh token per launch: the SDK's own retries of this call reuse it, so a retry
        // after a lost answer starts nothing new, while a later launch is a new one.
        let token: String = rand::rng()
            .sample_iter(rand::distr::Alphanumeric)
            .take(32)
            .map(char::from)
            .collect();
        LaunchRequest {
            image_id: image_id.to_string(),
            instance_type: spec
                .instance_types
                .first()
                .cloned()
                .unwrap_or_else(|| "t3.medium".into()),
            subnet_id: subnet.to_string(),
            security_group_ids: self.settings.security_group_ids.clone(),
            user_data: user_data.to_string(),
            tags,
            client_token: token,
        }
    }

    /// Cordons the Node and evicts its pods; `true` once nothing is left to evict (or the
    /// drain has waited [`DRAIN_TIMEOUT`]).
    async fn drain(&self, node: &Node) -> Result<bool, CloudError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let nodes: Api<Node> = Api::all(self.client.clone());
        let now = k8s_openapi::jiff::Timestamp::now();
        let started = match annotation(node, DRAIN_ANNOTATION) {
            Some(text) => text.parse::<k8s_openapi::jiff::Timestamp>().unwrap_or(now),
            None => {
                let patch = json!({
                    "metadata": {"annotations": {DRAIN_ANNOTATION: now.to_string()}},
                    "spec": {"unschedulable": true},
                });
                nodes
                    .patch(&name, &patch_params(), &Patch::Merge(patch))
                    .await
                    .map_err(crate::node::api_error)?;
                tracing::info!(node = %name, "cordoned for removal; draining");
                now
            }
        };
        let pods: Api<Pod> = Api::all(self.client.clone());
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
            .await
            .map_err(crate::node::api_error)?
            .items;
        let left: Vec<&Pod> = on_node.iter().filter(|p| must_evict(p)).collect();
        // As `kubectl drain`, a pod being deleted still holds the node until its kubelet has
        // stopped it (terminating the instance earlier would leave it Terminating for good).
        let terminating = on_node
            .iter()
            .any(|p| p.metadata.deletion_timestamp.is_some() && must_evict_once_deleted(p));
        if left.is_empty() && !terminating {
            return Ok(true);
        }
        let waited = now.duration_since(started);
        if waited.as_secs() >= DRAIN_TIMEOUT.as_secs() as i64 {
            tracing::warn!(node = %name, pods = left.len(), "drain timed out; removing the node anyway");
            return Ok(true);
        }
        for pod in left {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            match api.evict(&pod_name, &EvictParams::default()).await {
                Ok(_) => {}
                // 429: a PodDisruptionBudget forbids it now; 404: already gone.
                Err(kube::Error::Api(status)) if status.code == 429 || status.code == 404 => {
                    tracing::debug!(pod = %pod_name, code = status.code, "eviction not possible yet");
                }
                Err(err) => return Err(crate::node::api_error(err)),
            }
        }
        Ok(false)
    }

    fn token_secret_name(id: &str) -> String {
        format!("bootstrap-token-{id}")
    }

    async fn pool_token_secret(&self, pool: &str) -> Result<Option<Secret>, CloudError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "kube-system");
        let found = secrets
            .list(&ListParams::default().labels(&format!("{POOL_LABEL}={pool}")))
            .await
            .map_err(crate::node::api_error)?;
        Ok(found.items.into_iter().next())
    }

    /// The pool's bootstrap token (`id.secret`), created on first use as a
    /// `bootstrap.kubernetes.io/token` Secret in `kube-system`.
    async fn bootstrap_token(&self, pool: &str) -> Result<String, CloudError> {
        let field = |secret: &Secret, key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        if let Some(secret) = self.pool_token_secret(pool).await?
            && let (Some(id), Some(token)) =
                (field(&secret, "token-id"), field(&secret, "token-secret"))
        {
            return Ok(format!("{id}.{token}"));
        }
        let id = random_token_part(6);
        let token = random_token_part(16);
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {
                "name": Self::token_secret_name(&id),
                "namespace": "kube-system",
                "labels": {POOL_LABEL: pool},
            },
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "description": format!("nodes of node pool {pool}"),
                "token-id": id,
                "token-secret": token,
                "usage-bootstrap-authentication": "true",
                "auth-extra-groups": format!("system:bootstrappers:flotilla:{pool}"),
            },
        }))
        .map_err(|err| CloudError::invalid(err.to_string()))?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "kube-system");
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .map_err(crate::node::api_error)?;
        Ok(format!("{id}.{token}"))
    }

    async fn forget_bootstrap_token(&self, pool: &str) -> Result<(), CloudError> {
        if let Some(secret) = self.pool_token_secret(pool).await? {
            let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "kube-system");
            let name = secret.metadata.name.unwrap_or_default();
            match secrets.delete(&name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(crate::node::api_error(err)),
            }
        }
        Ok(())
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

fn random_token_part(length: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..length)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::InstanceState;

    fn instance(id: &str, zone: &str, launched: &str) -> Instance {
        Instance {
            id: id.into(),
            state: InstanceState::Running,
            zone: zone.into(),
            subnet_id: format!("subnet-{zone}"),
            instance_type: "t3.medium".into(),
            private_dns_name: format!("ip-{id}.ec2.internal"),
            private_ip: "10.0.0.1".into(),
            tags: BTreeMap::new(),
            launch_time: launched.into(),
        }
    }

    fn node(name: &str, ready: bool, draining: bool) -> Node {
        let mut annotations = serde_json::Map::new();
        if draining {
            annotations.insert(DRAIN_ANNOTATION.into(), json!("2026-01-01T00:00:00Z"));
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .expect("a node")
    }

    #[test]
    fn launches_go_to_the_emptiest_zone() {
        let subnets = vec![
            ("subnet-a".to_string(), "us-east-1a".to_string()),
            ("subnet-b".to_string(), "us-east-1b".to_string()),
        ];
        assert_eq!(next_subnet(&subnets, &[]), Some("subnet-a"));
        let one_in_a = [instance("i-1", "us-east-1a", "1")];
        assert_eq!(next_subnet(&subnets, &one_in_a), Some("subnet-b"));
        let one_each = [
            instance("i-1", "us-east-1a", "1"),
            instance("i-2", "us-east-1b", "2"),
        ];
        assert_eq!(next_subnet(&subnets, &one_each), Some("subnet-a"));
        assert_eq!(next_subnet(&[], &one_each), None);
    }

    #[test]
    fn removal_prefers_draining_then_unready_then_newest() {
        let live = vec![
            instance("i-old", "a", "2026-01-01"),
            instance("i-new", "a", "2026-03-01"),
            instance("i-mid", "a", "2026-02-01"),
            instance("i-unready", "a", "2025-01-01"),
            instance("i-draining", "a", "2025-01-01"),
        ];
        let nodes = [
            node("ip-i-old.ec2.internal", true, false),
            node("ip-i-new.ec2.internal", true, false),
            node("ip-i-mid.ec2.internal", true, false),
            node("ip-i-unready.ec2.internal", false, false),
            node("ip-i-draining.ec2.internal", true, true),
        ];
        let node_of = |i: &Instance| {
            nodes
                .iter()
                .find(|n| n.metadata.name.as_deref() == Some(&i.private_dns_name))
        };
        let order: Vec<String> = removal_order(&live, node_of, 4)
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(order, ["i-draining", "i-unready", "i-new", "i-mid"]);
    }

    #[test]
    fn instances_that_never_joined_are_a_node_creation_failure() {
        let live = [
            instance("i-old-joined", "a", "2026-01-01T00:00:00Z"),
            instance("i-old-lost", "a", "2026-01-01T00:00:00Z"),
            instance("i-new", "b", "2026-01-01T00:09:00Z"),
            instance("i-unknown-time", "b", "yesterday"),
        ];
        let joined = node("ip-i-old-joined.ec2.internal", true, false);
        let node_of = |i: &Instance| {
            (i.private_dns_name == "ip-i-old-joined.ec2.internal").then_some(&joined)
        };
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:10:00Z".parse().expect("time");
        let issue = unjoined_instances(&live, node_of, now, NODE_JOIN_TIMEOUT).expect("an issue");
        assert_eq!(issue.code, "NodeCreationFailure");
        assert_eq!(
            issue.message,
            "Instances failed to join the kubernetes cluster"
        );
        assert_eq!(issue.resource_ids, vec!["i-old-lost".to_string()]);
        let early: k8s_openapi::jiff::Timestamp = "2026-01-01T00:05:00Z".parse().expect("time");
        assert_eq!(
            unjoined_instances(&live, node_of, early, NODE_JOIN_TIMEOUT),
            None
        );
    }

    #[test]
    fn drains_skip_daemon_set_mirror_and_finished_pods() {
        let pod = |extra: serde_json::Value| -> Pod {
            let mut base = json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}});
            json_merge(&mut base, extra);
            serde_json::from_value(base).expect("a pod")
        };
        assert!(must_evict(&pod(json!({}))));
        assert!(!must_evict(&pod(json!({"metadata": {"ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]}}))));
        assert!(!must_evict(&pod(
            json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}})
        )));
        assert!(!must_evict(&pod(json!({"status": {"phase": "Succeeded"}}))));
        // A pod already being deleted is not evicted again, but the drain waits for it.
        let terminating = pod(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
        assert!(!must_evict(&terminating));
        assert!(must_evict_once_deleted(&terminating));
        assert!(!must_evict_once_deleted(&pod(json!({"metadata": {
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]}}))));
    }

    fn json_merge(base: &mut serde_json::Value, extra: serde_json::Value) {
        match (base, extra) {
            (serde_json::Value::Object(base), serde_json::Value::Object(extra)) => {
                for (key, value) in extra {
                    json_merge(base.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
            (slot, value) => *slot = value,
        }
    }

    #[test]
    fn pools_boot_the_newest_node_image_of_their_version() {
        let image = |id: &str, version: &str, created: &str| NodeImage {
            image_id: id.into(),
            name: format!("flotilla-node-{id}"),
            kubernetes_version: version.into(),
            creation_date: created.into(),
        };
        let images = [
            image("ami-old", "1.32", "2026-11-01T00:00:00.000Z"),
            image("ami-new", "1.32", "2026-12-01T00:00:00.000Z"),
            image("ami-next", "1.33", "2026-12-05T00:00:00.000Z"),
        ];
        let newest = |version| newest_node_image(&images, version).map(|i| i.image_id.as_str());
        assert_eq!(newest("1.32"), Some("ami-new"));
        assert_eq!(newest("1.33"), Some("ami-next"));
        assert_eq!(newest("1.31"), None, "no image of another version");
    }

    #[test]
    fn user_data_is_a_node_config_with_the_pool_label_and_the_uninitialized_taint() {
        let spec = NodePoolSpec {
            cluster_name: "prod".into(),
            name: "workers".into(),
            instance_types: vec!["t3.large".into()],
            image_id: None,
            kubernetes_version: "1.32".into(),
            desired_size: 2,
            labels: BTreeMap::from([("team".to_string(), "infra".to_string())]),
            taints: vec![],
            subnet_ids: vec![],
            deleting: false,
        };
        let endpoint = ClusterEndpoint {
            server: "https://127.0.0.1:6443/clusters/prod-abc".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        };
        let text = user_data(&spec, &endpoint, "abcdef.0123456789abcdef").expect("user data");
        let config = NodeConfig::parse(&text).expect("a node config");
        assert_eq!(config.spec.cluster.api_server_endpoint, endpoint.server);
        assert_eq!(
            config.spec.kubelet.bootstrap_token,
            "abcdef.0123456789abcdef"
        );
        assert_eq!(config.spec.kubelet.node_labels[POOL_LABEL], "workers");
        assert_eq!(config.spec.kubelet.node_labels["team"], "infra");
        assert!(
            config
                .spec
                .kubelet
                .register_with_taints
                .iter()
                .any(|t| t.key == UNINITIALIZED_TAINT)
        );
    }

    #[test]
    fn cloud_errors_become_eks_issue_codes() {
        let err = |code: &str| CloudError {
            code: code.into(),
            message: "m".into(),
            retryable: false,
        };
        assert_eq!(
            issue_code(&err("InvalidSubnetID.NotFound")),
            "Ec2SubnetNotFound"
        );
        assert_eq!(
            issue_code(&err("InsufficientInstanceCapacity")),
            "InsufficientInstanceCapacity"
        );
        assert_eq!(issue_code(&err("UnauthorizedOperation")), "AccessDenied");
    }
}
