//! What a cluster's cloud controllers are told about their cloud: region, endpoint override,
//! credentials and the network the cluster's resources go into. The hosted service builds it
//! from the cluster's `cloud` section; every AWS call honours it.

/// Static credentials (an access key pair).
#[derive(Clone, PartialEq)]
pub struct StaticCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
}

impl std::fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log line.
        f.debug_struct("StaticCredentials")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// One cluster's cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudSettings {
    /// The cluster's id: resources are tagged `kubernetes.io/cluster/<id>=owned` (the id, not
    /// the name, because names are unique only within an account and accounts may share a
    /// cloud account).
    pub cluster_id: String,
    /// Region (`us-east-1`).
    pub region: String,
    /// Endpoint of every cloud API (LocalStack's `http://127.0.0.1:4566`), instead of the
    /// region's.
    pub endpoint_override: Option<String>,
    /// Static credentials; without them (and without a role) the default chain is used.
    pub credentials: Option<StaticCredentials>,
    /// A role to assume for every call.
    pub role_arn: Option<String>,
    /// The cluster's VPC.
    pub vpc_id: Option<String>,
    /// The cluster's subnets (node pools default to them; load balancers discover theirs by
    /// tags within the VPC when none are tagged).
    pub subnet_ids: Vec<String>,
    /// Security groups of the cluster's instances.
    pub security_group_ids: Vec<String>,
}

impl CloudSettings {
    /// The tag every resource of this cluster carries (upstream's `kubernetes.io/cluster/<name>`).
    pub fn cluster_tag_key(&self) -> String {
        format!("kubernetes.io/cluster/{}", self.cluster_id)
    }
}
