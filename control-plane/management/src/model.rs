//! The management API's wire types (camelCase JSON, field names after EKS CreateCluster and
//! CreateNodegroup) and their validation. Stored records are these same types.

use flotilla_api_machinery::cidr::MAX_CLUSTER_RANGE_PREFIX;
pub use flotilla_apiserver::audit::Policy as AuditPolicy;
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ManagementError;

/// Longest cluster or node pool name (the rule lives with the names, for the clients that check
/// it before calling).
pub use flotilla_api_machinery::names::MAX_MANAGEMENT_NAME_LENGTH as MAX_NAME_LENGTH;
/// A cluster's PodSecurity admission configuration (upstream's `PodSecurityConfiguration`).
pub use flotilla_apiserver::admission::PodSecurityConfiguration;

/// Kubernetes versions a cluster can ask for; the API server speaks the first one.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.33"];

/// An account: the owner of clusters, authenticated by its API keys.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Account {
    /// Account id (a DNS label).
    pub id: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
}

/// `POST /v1/accounts`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateAccountRequest {
    /// Account id (a DNS label).
    pub id: String,
}

/// A newly issued API key: shown once, stored only as a hash.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuedApiKey {
    /// The account it authenticates.
    pub account_id: String,
    /// The bearer token.
    pub api_key: String,
}

/// Lifecycle of a cluster, as EKS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClusterStatus {
    /// Accepted; its control plane is being set up.
    Creating,
    /// Serving.
    Active,
    /// Being deleted with everything it holds.
    Deleting,
    /// Setup failed; `statusReason` says why.
    Failed,
}

impl std::fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClusterStatus::Creating => "CREATING",
            ClusterStatus::Active => "ACTIVE",
            ClusterStatus::Deleting => "DELETING",
            ClusterStatus::Failed => "FAILED",
        })
    }
}

/// Service and pod networks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkConfig {
    /// Service ClusterIP range (default `10.96.0.0/12`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_ipv4_cidr: Option<String>,
    /// Pod network (default `10.244.0.0/16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ipv4_cidr: Option<String>,
}

/// Who may reach the cluster's endpoint (EKS `resourcesVpcConfig` access fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointAccess {
    /// Whether the endpoint answers from the internet.
    #[serde(default = "yes")]
    pub public: bool,
    /// Whether the endpoint answers from inside the VPC.
    #[serde(default)]
    pub private: bool,
    /// CIDRs allowed to reach the public endpoint (default `0.0.0.0/0`).
    #[serde(default = "everywhere")]
    pub public_access_cidrs: Vec<String>,
}

fn yes() -> bool {
    true
}

fn everywhere() -> Vec<String> {
    vec!["0.0.0.0/0".into()]
}

impl Default for EndpointAccess {
    fn default() -> Self {
        EndpointAccess {
            public: true,
            private: false,
            public_access_cidrs: everywhere(),
        }
    }
}

/// Static cloud credentials. The secret is write-only: responses never carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key (never returned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key: Option<String>,
}

/// Where the cluster's cloud resources live and how to reach that cloud.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudConfig {
    /// Region, e.g. `us-east-1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// VPC id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vpc_id: Option<String>,
    /// Subnet ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_ids: Vec<String>,
    /// Security group ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub security_group_ids: Vec<String>,
    /// Static credentials, or…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CloudCredentials>,
    /// …a role to assume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
    /// API endpoint override (e.g. LocalStack's `http://127.0.0.1:4566`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_override: Option<String>,
}

/// `POST /v1/clusters` (EKS CreateCluster).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateClusterRequest {
    /// Unique within the account; a DNS label of at most 40 characters.
    pub name: String,
    /// Kubernetes minor version (default the newest supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Networks.
    #[serde(default)]
    pub kubernetes_network_config: NetworkConfig,
    /// Endpoint access.
    #[serde(default)]
    pub endpoint_access: EndpointAccess,
    /// PodSecurity admission defaults and exemptions (upstream's shipped `privileged:latest`
    /// and none when unset).
    #[serde(default)]
    pub pod_security: PodSecurityConfiguration,
    /// The cluster's own audit policy (`audit.k8s.io/v1` `Policy`): its requests are recorded
    /// at the level this policy or the service operator's gives, whichever is higher, to the
    /// operator's audit backends. None: the operator's policy alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_policy: Option<AuditPolicy>,
    /// Tags.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Cloud placement.
    #[serde(default)]
    pub cloud: CloudConfig,
    /// Makes retries safe: the same token with the same parameters returns the same cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_token: Option<String>,
}

/// `PATCH /v1/clusters/{name}`: the fields that may change after creation.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateClusterRequest {
    /// New endpoint access.
    #[serde(default)]
    pub endpoint_access: Option<EndpointAccess>,
    /// New PodSecurity admission configuration (replaces the whole of it).
    #[serde(default)]
    pub pod_security: Option<PodSecurityConfiguration>,
    /// New audit policy (replaces the whole of it); `null` removes it.
    #[serde(default, deserialize_with = "present")]
    pub audit_policy: Option<Option<AuditPolicy>>,
    /// Tags to set (a `null` value removes the tag).
    #[serde(default)]
    pub tags: Option<BTreeMap<String, Option<String>>>,
}

/// A cluster as the API reports it (and as it is stored).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    /// Name, unique within the account.
    pub name: String,
    /// Globally unique id: the cluster's API is at `/clusters/{id}`.
    pub id: String,
    /// Owning account.
    pub account_id: String,
    /// Kubernetes minor version.
    pub version: String,
    /// Lifecycle state.
    pub status: ClusterStatus,
    /// Why it is `FAILED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// The Kubernetes API server URL.
    pub endpoint: String,
    /// Networks (defaults filled in).
    pub kubernetes_network_config: NetworkConfig,
    /// Endpoint access.
    pub endpoint_access: EndpointAccess,
    /// PodSecurity admission defaults and exemptions.
    #[serde(default)]
    pub pod_security: PodSecurityConfiguration,
    /// The cluster's own audit policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_policy: Option<AuditPolicy>,
    /// Tags.
    pub tags: BTreeMap<String, String>,
    /// Cloud placement (secret redacted in responses).
    pub cloud: CloudConfig,
    /// The token it was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_token: Option<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// The CA that signs the endpoint's certificate (responses only, as EKS's
    /// `certificateAuthority.data`: base64 of the PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<CertificateAuthorityData>,
    /// Set by the cloud controller once every cloud resource created for a `DELETING` cluster
    /// (instances, load balancers, volumes) is gone; only then is the tenant destroyed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cloud_released: bool,
    /// The cluster's resource name (responses only, as EKS's `arn`):
    /// `arn:flotilla:clusters::ACCOUNT:cluster/NAME`, unique across the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arn: Option<String>,
    /// The cluster's OIDC issuer for its service-account tokens (responses only, as EKS's
    /// `identity.oidc.issuer`): a cloud IAM trusts it through its discovery document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<ClusterIdentity>,
    /// What keeps the cluster from working as asked (`flotilla up`'s `demo` without a node:
    /// `NoLocalNodes`).
    #[serde(default)]
    pub health: Health,
    /// The backup the cluster was made from (`POST /v1/clusters/{name}/restore`); absent for
    /// a cluster that was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<RestoredFrom>,
    /// Set while a restore is still writing the cluster's objects: the reconciler leaves the
    /// cluster alone until the restore clears it (or marks it `FAILED` when the restore never
    /// finishes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restoring: bool,
}

/// `restoredFrom` of a cluster: which backup it was made from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoredFrom {
    /// The backed-up cluster's name.
    pub cluster_name: String,
    /// The backed-up cluster's id.
    pub cluster_id: String,
    /// The store revision every object of the backup was read at.
    pub revision: i64,
    /// When the backup was taken (RFC 3339).
    pub backup_created_at: String,
}

/// `certificateAuthority` of a cluster response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CertificateAuthorityData {
    /// Base64 of the PEM certificate.
    pub data: String,
}

/// `identity` of a cluster response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClusterIdentity {
    /// The OIDC provider.
    pub oidc: OidcIdentity,
}

/// `identity.oidc` of a cluster response.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct OidcIdentity {
    /// The issuer URL (`{issuer}/.well-known/openid-configuration` describes it).
    pub issuer: String,
}

impl Cluster {
    /// Whether the cluster has a cloud (a region or an endpoint override): its node pools
    /// then get instances, and its deletion waits for the cloud controller's clean-up.
    pub fn has_cloud(&self) -> bool {
        self.cloud.region.is_some() || self.cloud.endpoint_override.is_some()
    }

    /// The cluster without secrets, for responses.
    pub fn redacted(mut self) -> Self {
        if let Some(credentials) = self.cloud.credentials.as_mut() {
            credentials.secret_access_key = None;
        }
        self
    }
}

/// A node taint (EKS spelling of the effect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Taint {
    /// Key.
    pub key: String,
    /// Value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NO_SCHEDULE`, `NO_EXECUTE` or `PREFER_NO_SCHEDULE`.
    pub effect: String,
}

/// Size bounds of a node pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingConfig {
    /// Fewest nodes.
    pub min_size: u32,
    /// Most nodes.
    pub max_size: u32,
    /// Nodes wanted now.
    pub desired_size: u32,
}

impl Default for ScalingConfig {
    fn default() -> Self {
        // EKS's defaults.
        ScalingConfig {
            min_size: 1,
            max_size: 2,
            desired_size: 2,
        }
    }
}

/// `POST /v1/clusters/{name}/nodepools` (EKS CreateNodegroup).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateNodePoolRequest {
    /// Unique within the cluster; a DNS label of at most 40 characters.
    pub name: String,
    /// Instance types (default `["t3.medium"]`).
    #[serde(default)]
    pub instance_types: Vec<String>,
    /// Machine image id (default: the cluster's node image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Size.
    #[serde(default)]
    pub scaling_config: ScalingConfig,
    /// Node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Subnets (default: the cluster's).
    #[serde(default)]
    pub subnets: Vec<String>,
    /// Makes retries safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_token: Option<String>,
}

/// `PATCH /v1/clusters/{name}/nodepools/{pool}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateNodePoolRequest {
    /// New size.
    #[serde(default)]
    pub scaling_config: Option<ScalingConfig>,
    /// Labels to replace the pool's with.
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Taints to replace the pool's with.
    #[serde(default)]
    pub taints: Option<Vec<Taint>>,
}

/// Lifecycle of a node pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodePoolStatus {
    /// Accepted.
    Creating,
    /// Recorded and handed to the cloud controller.
    Active,
    /// Size or settings changing.
    Updating,
    /// Being deleted.
    Deleting,
    /// Failed; `statusReason` says why.
    Failed,
    /// Running but short of its size for a reason the cloud gave (EKS's `DEGRADED`):
    /// `health.issues` says which; the cloud controller keeps trying.
    Degraded,
}

impl std::fmt::Display for NodePoolStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodePoolStatus::Creating => "CREATING",
            NodePoolStatus::Active => "ACTIVE",
            NodePoolStatus::Updating => "UPDATING",
            NodePoolStatus::Deleting => "DELETING",
            NodePoolStatus::Failed => "FAILED",
            NodePoolStatus::Degraded => "DEGRADED",
        })
    }
}

/// One problem of a cluster or a node pool (EKS's `health.issues[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthIssue {
    /// EKS-style issue code (`Ec2SubnetNotFound`, `InsufficientInstanceCapacity`,
    /// `AccessDenied`, `NoLocalNodes`…).
    pub code: String,
    /// What is wrong, in the cloud's own words where the cloud said it.
    pub message: String,
    /// The resources concerned (subnet ids, instance ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_ids: Vec<String>,
}

/// `health` of a cluster or a node pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// What keeps it from working as asked now (empty when healthy).
    #[serde(default)]
    pub issues: Vec<HealthIssue>,
}

/// A node pool as reported and stored.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    /// Name.
    pub name: String,
    /// The cluster's name.
    pub cluster_name: String,
    /// Instance types.
    pub instance_types: Vec<String>,
    /// Machine image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_id: Option<String>,
    /// Size.
    pub scaling_config: ScalingConfig,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    pub taints: Vec<Taint>,
    /// Subnets.
    pub subnets: Vec<String>,
    /// Lifecycle state.
    pub status: NodePoolStatus,
    /// Why it is `FAILED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    /// Instance ids of its nodes (filled by the cloud controller).
    #[serde(default)]
    pub instance_ids: Vec<String>,
    /// Nodes of the pool that are Ready (filled by the cloud controller).
    #[serde(default)]
    pub ready_nodes: u32,
    /// Problems the cloud controller met.
    #[serde(default)]
    pub health: Health,
    /// The token it was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_token: Option<String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
}

/// A DNS label of at most [`MAX_NAME_LENGTH`] characters.
pub fn validate_name(what: &str, name: &str) -> Result<(), ManagementError> {
    match flotilla_api_machinery::names::management_name_problems(name).first() {
        Some(problem) => Err(ManagementError::invalid_parameter(format!(
            "{what} {name:?} is invalid: {problem}"
        ))),
        None => Ok(()),
    }
}

/// An IPv4 CIDR `a.b.c.d/n` whose host bits are zero, with a prefix of at most `max_prefix`.
fn validate_cidr(field: &str, cidr: &str, max_prefix: u8) -> Result<(), ManagementError> {
    match flotilla_api_machinery::cidr::ipv4_network_problem(cidr, max_prefix) {
        Some(why) => Err(ManagementError::invalid_parameter(format!(
            "{field} {cidr:?} is invalid: {why}"
        ))),
        None => Ok(()),
    }
}

impl CreateClusterRequest {
    /// Checks every field; the first problem is the error.
    pub fn validate(&self) -> Result<(), ManagementError> {
        validate_name("cluster name", &self.name)?;
        if let Some(version) = &self.version
            && !SUPPORTED_VERSIONS.contains(&version.as_str())
        {
            return Err(ManagementError::invalid_parameter(format!(
                "unsupported Kubernetes version {version:?}; supported: {}",
                SUPPORTED_VERSIONS.join(", ")
            )));
        }
        if let Some(cidr) = &self.kubernetes_network_config.service_ipv4_cidr {
            validate_cidr("serviceIpv4Cidr", cidr, MAX_CLUSTER_RANGE_PREFIX)?;
        }
        if let Some(cidr) = &self.kubernetes_network_config.pod_ipv4_cidr {
            validate_cidr("podIpv4Cidr", cidr, MAX_CLUSTER_RANGE_PREFIX)?;
        }
        self.endpoint_access.validate()?;
        validate_pod_security(&self.pod_security)?;
        if let Some(policy) = &self.audit_policy {
            validate_audit_policy(policy)?;
        }
        validate_tags(&self.tags)?;
        if self.cloud.credentials.is_some() && self.cloud.role_arn.is_some() {
            return Err(ManagementError::invalid_parameter(
                "cloud: give credentials or roleArn, not both",
            ));
        }
        if let Some(endpoint) = &self.cloud.endpoint_override
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(ManagementError::invalid_parameter(format!(
                "cloud.endpointOverride {endpoint:?} must be an http:// or https:// URL"
            )));
        }
        Ok(())
    }
}

/// A field given, even as `null`: `Some(None)` (absent stays `None` by `default`).
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// An audit policy as upstream checks a policy file: at least one rule, valid rules, and
/// `audit.k8s.io/v1` `Policy` when it names its kind.
pub fn validate_audit_policy(policy: &AuditPolicy) -> Result<(), ManagementError> {
    let invalid = |why: String| ManagementError::invalid_parameter(format!("auditPolicy.{why}"));
    if !policy.api_version.is_empty() && policy.api_version != "audit.k8s.io/v1" {
        return Err(invalid(format!(
            "apiVersion: {:?} is not served: use audit.k8s.io/v1",
            policy.api_version
        )));
    }
    if !policy.kind.is_empty() && policy.kind != "Policy" {
        return Err(invalid(format!("kind: {:?} is not Policy", policy.kind)));
    }
    if policy.rules.is_empty() {
        return Err(invalid(
            "rules: a policy needs at least one rule".to_string(),
        ));
    }
    policy.validate().map_err(invalid)
}

/// Levels and versions that exist (`podSecurity.defaults.enforce: "strict": must be one of …`).
pub fn validate_pod_security(config: &PodSecurityConfiguration) -> Result<(), ManagementError> {
    config
        .policy()
        .map(drop)
        .map_err(|why| ManagementError::invalid_parameter(format!("podSecurity.{why}")))
}

impl EndpointAccess {
    /// At least one way in, and well-formed CIDRs.
    pub fn validate(&self) -> Result<(), ManagementError> {
        if !self.public && !self.private {
            return Err(ManagementError::invalid_parameter(
                "endpointAccess: public and private access cannot both be disabled",
            ));
        }
        for cidr in &self.public_access_cidrs {
            validate_cidr("publicAccessCidrs", cidr, 32)?;
        }
        Ok(())
    }
}

/// EKS's tag limits: 50 tags, keys up to 128 and values up to 256 characters.
pub fn validate_tags(tags: &BTreeMap<String, String>) -> Result<(), ManagementError> {
    if tags.len() > 50 {
        return Err(ManagementError::invalid_parameter(
            "at most 50 tags are allowed",
        ));
    }
    for (key, value) in tags {
        if key.is_empty() || key.len() > 128 || value.len() > 256 {
            return Err(ManagementError::invalid_parameter(format!(
                "tag {key:?}: keys are 1-128 and values 0-256 characters"
            )));
        }
    }
    Ok(())
}

impl ScalingConfig {
    /// `min <= desired <= max`, `max >= 1`.
    pub fn validate(&self) -> Result<(), ManagementError> {
        if self.max_size < 1 {
            return Err(ManagementError::invalid_parameter(
                "scalingConfig.maxSize must be at least 1",
            ));
        }
        if self.min_size > self.max_size {
            return Err(ManagementError::invalid_parameter(format!(
                "scalingConfig.minSize ({}) must not exceed maxSize ({})",
                self.min_size, self.max_size
            )));
        }
        if self.desired_size < self.min_size || self.desired_size > self.max_size {
            return Err(ManagementError::invalid_parameter(format!(
                "scalingConfig.desiredSize ({}) must be between minSize ({}) and maxSize ({})",
                self.desired_size, self.min_size, self.max_size
            )));
        }
        Ok(())
    }
}

/// Kubernetes label rules for node labels.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), ManagementError> {
    for (key, value) in labels {
        let problems = flotilla_api_machinery::names::is_qualified_name(key)
            .into_iter()
            .chain(flotilla_api_machinery::names::is_valid_label_value(value));
        if let Some(problem) = problems.into_iter().next() {
            return Err(ManagementError::invalid_parameter(format!(
                "label {key:?}={value:?} is invalid: {problem}"
            )));
        }
    }
    Ok(())
}

/// Taint keys are qualified names; effects are EKS's three.
pub fn validate_taints(taints: &[Taint]) -> Result<(), ManagementError> {
    for taint in taints {
        if let Some(problem) = flotilla_api_machinery::names::is_qualified_name(&taint.key).first()
        {
            return Err(ManagementError::invalid_parameter(format!(
                "taint key {:?} is invalid: {problem}",
                taint.key
            )));
        }
        if !matches!(
            taint.effect.as_str(),
            "NO_SCHEDULE" | "NO_EXECUTE" | "PREFER_NO_SCHEDULE"
        ) {
            return Err(ManagementError::invalid_parameter(format!(
                "taint {:?}: effect {:?} must be NO_SCHEDULE, NO_EXECUTE or PREFER_NO_SCHEDULE",
                taint.key, taint.effect
            )));
        }
    }
    Ok(())
}

impl CreateNodePoolRequest {
    /// Checks every field; the first problem is the error.
    pub fn validate(&self) -> Result<(), ManagementError> {
        validate_name("node pool name", &self.name)?;
        self.scaling_config.validate()?;
        validate_labels(&self.labels)?;
        validate_taints(&self.taints)?;
        if self.instance_types.iter().any(|t| t.trim().is_empty()) {
            return Err(ManagementError::invalid_parameter(
                "instanceTypes must not contain empty names",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_need_zero_host_bits_and_a_bounded_prefix() {
        assert!(validate_cidr("f", "10.96.0.0/12", 24).is_ok());
        assert!(validate_cidr("f", "10.96.0.1/12", 24).is_err());
        assert!(validate_cidr("f", "10.96.0.0/28", 24).is_err());
        assert!(validate_cidr("f", "10.96.0.0", 24).is_err());
        assert!(validate_cidr("f", "0.0.0.0/0", 32).is_ok());
    }

    #[test]
    fn scaling_config_bounds() {
        let config = |min, desired, max| ScalingConfig {
            min_size: min,
            desired_size: desired,
            max_size: max,
        };
        assert!(config(1, 2, 3).validate().is_ok());
        assert!(config(0, 0, 1).validate().is_ok());
        assert!(config(2, 1, 3).validate().is_err());
        assert!(config(1, 4, 3).validate().is_err());
        assert!(config(0, 0, 0).validate().is_err());
    }

    #[test]
    fn names_are_short_dns_labels() {
        assert!(validate_name("n", "prod").is_ok());
        assert!(validate_name("n", "Prod").is_err());
        assert!(validate_name("n", &"a".repeat(41)).is_err());
    }

    #[test]
    fn pod_security_levels_must_exist() {
        assert!(validate_pod_security(&PodSecurityConfiguration::default()).is_ok());
        let mut config = PodSecurityConfiguration::default();
        config.defaults.warn_version = "v2.0".into();
        let err = validate_pod_security(&config).expect_err("no such version");
        assert!(
            err.to_string()
                .contains("podSecurity.defaults.warn-version"),
            "{err}"
        );
    }

    #[test]
    fn unknown_request_fields_are_refused() {
        let parsed: Result<CreateClusterRequest, _> =
            serde_json::from_str(r#"{"name":"a","nmae":"b"}"#);
        assert!(parsed.is_err());
    }
}
