//! The cloud-provider interfaces the controllers are written against (upstream's
//! `cloudprovider.InstancesV2` and `LoadBalancer`, plus node groups, block volumes and the
//! application load balancers of Ingresses), their
//! data types, and the one error type every provider call returns. The AWS implementation is
//! in [`crate::aws`]; unit tests use fakes of these traits.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};

/// A failed cloud call: the provider's error code (AWS's `InvalidSubnetID.NotFound`,
/// `InsufficientInstanceCapacity`, `UnauthorizedOperation`, `Throttling`…) and message, so
/// events and statuses can carry them verbatim.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CloudError {
    /// The provider's error code (or `ServiceUnavailable` when the cloud did not answer).
    pub code: String,
    /// The provider's message.
    pub message: String,
    /// Whether trying again later can succeed without a change of input (throttling, the
    /// cloud unreachable, capacity). Controllers requeue either way; this only picks the
    /// event type and the status wording.
    pub retryable: bool,
}

impl CloudError {
    /// An error of our own making (bad annotations, missing configuration).
    pub fn invalid(message: impl Into<String>) -> Self {
        CloudError {
            code: "InvalidParameterValue".into(),
            message: message.into(),
            retryable: false,
        }
    }
}

/// What provider calls return.
pub type CloudResult<T> = Result<T, CloudError>;

/// Upstream's `InstanceMetadata`: what the node controller writes onto a Node.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InstanceMetadata {
    /// `aws:///<zone>/<instance-id>`.
    pub provider_id: String,
    /// `node.kubernetes.io/instance-type`.
    pub instance_type: String,
    /// The node's addresses (InternalIP, InternalDNS, Hostname, ExternalIP…).
    pub node_addresses: Vec<NodeAddress>,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// `topology.kubernetes.io/region`.
    pub region: String,
}

/// Upstream's `InstancesV2`: how the node controller learns about a Node's machine. A
/// Node is matched by its `spec.providerID` when set, otherwise by its name (the
/// instance's private DNS name, as the AWS cloud provider names nodes).
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the Node's instance still exists (terminated counts as gone).
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;
    /// Whether the Node's instance is stopped (it may come back).
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;
    /// The Node's instance, or `None` when there is none.
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;
}

/// The lifecycle state of an instance (EC2's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Booting.
    Pending,
    /// Up.
    Running,
    /// Going down, may come back.
    Stopping,
    /// Down, may come back.
    Stopped,
    /// Being terminated.
    ShuttingDown,
    /// Gone.
    Terminated,
}

impl InstanceState {
    /// Still counts toward a pool's size (not terminating or terminated).
    pub fn is_live(self) -> bool {
        !matches!(
            self,
            InstanceState::ShuttingDown | InstanceState::Terminated
        )
    }
}

/// A machine of a node pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Instance id.
    pub id: String,
    /// State.
    pub state: InstanceState,
    /// Availability zone.
    pub zone: String,
    /// Subnet.
    pub subnet_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Private DNS name: the name its Node registers with.
    pub private_dns_name: String,
    /// Private IPv4 address.
    pub private_ip: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Launch time (RFC 3339), for picking the newest to remove first.
    pub launch_time: String,
}

/// One RunInstances call of a node pool.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchRequest {
    /// Machine image.
    pub image_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Where.
    pub subnet_id: String,
    /// Security groups.
    pub security_group_ids: Vec<String>,
    /// The node bootstrap document (plain text; the provider encodes it).
    pub user_data: String,
    /// Tags of the instance (and its volumes).
    pub tags: BTreeMap<String, String>,
    /// Idempotency token: a retried launch with the same token starts nothing new.
    pub client_token: String,
}

/// A machine image registered as a Flotilla node image (tags
/// [`crate::nodepool::NODE_IMAGE_TAG`] and [`crate::nodepool::KUBERNETES_VERSION_TAG`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeImage {
    /// The AMI id.
    pub image_id: String,
    /// Its name.
    pub name: String,
    /// The Kubernetes minor version its kubelet speaks (`1.32`).
    pub kubernetes_version: String,
    /// When it was registered (RFC 3339, as EC2's `CreationDate`).
    pub creation_date: String,
}

/// Node groups: the instances behind a node pool, found by their tags.
#[async_trait]
pub trait NodeGroups: Send + Sync {
    /// Every instance carrying all of `tags` that is not terminated.
    async fn instances_tagged(&self, tags: &BTreeMap<String, String>)
    -> CloudResult<Vec<Instance>>;
    /// Starts one instance.
    async fn launch(&self, request: &LaunchRequest) -> CloudResult<Instance>;
    /// Terminates instances (already gone ones are not an error).
    async fn terminate(&self, instance_ids: &[String]) -> CloudResult<()>;
    /// The availability zone of each subnet, in the order given; an unknown subnet is an
    /// error (`InvalidSubnetID.NotFound`).
    async fn subnet_zones(&self, subnet_ids: &[String]) -> CloudResult<Vec<String>>;
    /// The Flotilla node images this account owns, available to launch.
    async fn node_images(&self) -> CloudResult<Vec<NodeImage>>;
}

/// Upstream's `cloudprovider.LoadBalancer` for `type: LoadBalancer` Services.
#[async_trait]
pub trait LoadBalancers: Send + Sync {
    /// The Service's load balancer status, or `None` when it has none.
    async fn get_load_balancer(&self, service: &Service)
    -> CloudResult<Option<LoadBalancerStatus>>;
    /// Creates or updates the Service's load balancer to target `nodes`.
    async fn ensure_load_balancer(
        &self,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<LoadBalancerStatus>;
    /// Points an existing load balancer at `nodes`.
    async fn update_load_balancer(&self, service: &Service, nodes: &[Node]) -> CloudResult<()>;
    /// Deletes everything created for the Service (done when nothing is left).
    async fn ensure_load_balancer_deleted(&self, service: &Service) -> CloudResult<()>;
}

/// What a listener or a rule does with a request (the ALB action types an Ingress needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlbAction {
    /// Forward to the target group of that name (a name of [`AlbModel::target_groups`]).
    Forward {
        /// The target group's name.
        target_group: String,
    },
    /// Answer without any backend (upstream's default action: 404, `text/plain`).
    FixedResponse {
        /// HTTP status code (`"404"`).
        status_code: String,
        /// Content type (`text/plain`).
        content_type: String,
    },
}

/// One listener rule: all its conditions must match (values within one condition are ORed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlbRule {
    /// Evaluation order within the listener, from 1 (lowest first).
    pub priority: i32,
    /// `host-header` values; empty for no host condition.
    pub host_header: Vec<String>,
    /// `path-pattern` values; empty for no path condition.
    pub path_pattern: Vec<String>,
    /// What a matching request gets.
    pub action: AlbAction,
}

/// One listener of an application load balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlbListener {
    /// Port.
    pub port: i32,
    /// `HTTP` or `HTTPS`.
    pub protocol: String,
    /// Certificates of an HTTPS listener (the first is the default one).
    pub certificate_arns: Vec<String>,
    /// Security policy of an HTTPS listener.
    pub ssl_policy: Option<String>,
    /// What requests no rule matches get.
    pub default_action: AlbAction,
    /// The rules, in priority order.
    pub rules: Vec<AlbRule>,
}

/// The health check of an ALB target group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlbHealthCheck {
    /// `HTTP` or `HTTPS`.
    pub protocol: String,
    /// `traffic-port` or a port number.
    pub port: String,
    /// Path.
    pub path: String,
    /// Seconds between checks.
    pub interval_seconds: i32,
    /// Seconds a check may take.
    pub timeout_seconds: i32,
    /// Successes to become healthy.
    pub healthy_threshold: i32,
    /// Failures to become unhealthy.
    pub unhealthy_threshold: i32,
    /// Status codes of a healthy answer (`200`, `200-299`, `200,302`).
    pub success_codes: String,
}

/// One target group of an application load balancer: instance targets on a NodePort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlbTargetGroup {
    /// Its name (≤ 32 characters), fixed by what it targets.
    pub name: String,
    /// `HTTP` or `HTTPS` (the backend protocol).
    pub protocol: String,
    /// The targets' port: the Service's NodePort.
    pub port: i32,
    /// Health check.
    pub health_check: AlbHealthCheck,
    /// Tags of this group beyond [`AlbModel::tags`].
    pub tags: BTreeMap<String, String>,
}

/// The security groups of an application load balancer (upstream's frontend groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlbSecurityGroups {
    /// A group made for this load balancer alone (upstream's managed group): open on the
    /// listen ports to `inbound_cidrs`, and let in on the target ports by the security group
    /// of each target instance, so the load balancer reaches the NodePorts.
    Managed {
        /// Its name (≤ 255 characters; upstream's `k8s-<ns8>-<name8>-<hash>`).
        name: String,
        /// The IPv4 CIDRs clients may come from.
        inbound_cidrs: Vec<String>,
    },
    /// The groups the user named (IDs or names), attached as they are: the user opens the
    /// nodes to them, as upstream leaves it.
    Named(Vec<String>),
}

/// Everything an Ingress asks of its application load balancer (upstream's model stack),
/// built and validated by the ingress controller; the provider only carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlbModel {
    /// The load balancer's name (≤ 32 characters).
    pub name: String,
    /// Scheme `internal` instead of `internet-facing`.
    pub internal: bool,
    /// Its security groups.
    pub security_groups: AlbSecurityGroups,
    /// Tags of every resource made for the Ingress: they find them again for cleanup.
    pub tags: BTreeMap<String, String>,
    /// The target groups; listeners and rules name them.
    pub target_groups: Vec<AlbTargetGroup>,
    /// The listeners, with their rules.
    pub listeners: Vec<AlbListener>,
    /// The Nodes' provider IDs (`aws:///zone/i-…`) registered in every target group.
    pub targets: BTreeSet<String>,
}

/// Application load balancers for Ingresses (what the AWS Load Balancer Controller does
/// with ELBv2): the controller builds an [`AlbModel`], the provider makes the cloud match it.
#[async_trait]
pub trait ApplicationLoadBalancers: Send + Sync {
    /// Creates or updates the load balancer, its security groups, its target groups and
    /// targets, listeners and rules to match `model`, and removes what the model no longer has (resources carrying
    /// `model.tags` that it does not name). Returns the load balancer's DNS name.
    async fn ensure_application_load_balancer(&self, model: &AlbModel) -> CloudResult<String>;
    /// Deletes every load balancer (with its listeners and rules), target group and managed
    /// security group carrying all of `tags`, and the rules that let such a group into
    /// others; done when nothing is left.
    async fn delete_application_load_balancer(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()>;
}

/// A block volume (EBS).
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// Volume id (`vol-…`).
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Size in GiB.
    pub size_gib: i32,
    /// Volume type (`gp3`, `io2`…).
    pub volume_type: String,
    /// `creating`, `available`, `in-use`, `deleting`, `deleted`, `error`.
    pub state: String,
    /// Instances it is attached to, with the attachment state (`attaching`, `attached`,
    /// `detaching`…) and device name.
    pub attachments: Vec<VolumeAttachmentInfo>,
}

/// One attachment of a [`Volume`].
#[derive(Debug, Clone, PartialEq)]
pub struct VolumeAttachmentInfo {
    /// Instance id.
    pub instance_id: String,
    /// Attachment state.
    pub state: String,
    /// Device name (`/dev/xvdba`).
    pub device: String,
}

/// What a StorageClass and a claim ask of a new volume.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateVolumeRequest {
    /// Availability zone.
    pub zone: String,
    /// Size in GiB.
    pub size_gib: i32,
    /// Volume type (default `gp3`).
    pub volume_type: String,
    /// Provisioned IOPS, for the types that take it.
    pub iops: Option<i32>,
    /// Encrypted at rest.
    pub encrypted: bool,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Idempotency token (the PV's name): a retried create makes no second volume.
    pub client_token: String,
}

/// Block volumes (EBS), for the provisioner and the attach/detach controller.
#[async_trait]
pub trait Volumes: Send + Sync {
    /// Creates a volume.
    async fn create_volume(&self, request: &CreateVolumeRequest) -> CloudResult<Volume>;
    /// The volume, or `None` when it does not exist.
    async fn describe_volume(&self, volume_id: &str) -> CloudResult<Option<Volume>>;
    /// Deletes a volume (an absent one is not an error).
    async fn delete_volume(&self, volume_id: &str) -> CloudResult<()>;
    /// Attaches a volume to an instance at `device`.
    async fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> CloudResult<()>;
    /// Detaches a volume from an instance (not attached is not an error).
    async fn detach_volume(&self, volume_id: &str, instance_id: &str) -> CloudResult<()>;
    /// Grows a volume to `size_gib`.
    async fn resize_volume(&self, volume_id: &str, size_gib: i32) -> CloudResult<()>;
}

/// Everything a cluster's cloud controllers need of one cloud.
pub trait Cloud:
    InstancesV2 + NodeGroups + LoadBalancers + ApplicationLoadBalancers + Volumes
{
}

impl<T: InstancesV2 + NodeGroups + LoadBalancers + ApplicationLoadBalancers + Volumes> Cloud for T {}
