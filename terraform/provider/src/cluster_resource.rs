//! `resource "flotilla_cluster"`: a cluster of the management API, as `aws_eks_cluster` is an
//! EKS cluster. Create waits until it is ACTIVE (a FAILED cluster is an error carrying its
//! status reason); tags and endpoint access update in place; name, version and the network
//! ranges replace it (the management API cannot change them); a cluster deleted behind
//! Terraform's back is planned for re-creation; `terraform import flotilla_cluster.X NAME`.
//! A `cloud { region, vpc_id, subnet_ids, … }` block gives it EC2 (node pools, load balancers,
//! volumes); it replaces the cluster when it changes, and its secret access key is kept from
//! the configuration (the API never returns it).

use std::borrow::Cow;
use std::collections::BTreeMap;

use async_trait::async_trait;
use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueBool, ValueEmpty, ValueList, ValueMap, ValueString};
use tf_provider::{AttributePath, Diagnostics, Resource};

use crate::common::{
    Operation, POLL, Timeouts, attribute, create_and_wait, delete_and_wait, get_if_found,
    json_text, owned, reported, schema, timeout, timeouts_block, validate_timeouts,
};
use crate::pod_security::{self, PodSecurityState};
use crate::provider::Connection;

/// `cloud`: where the cluster's instances, load balancers and volumes are made.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudState<'a> {
    #[serde(borrow = "'a")]
    region: ValueString<'a>,
    endpoint_override: ValueString<'a>,
    vpc_id: ValueString<'a>,
    subnet_ids: ValueList<ValueString<'a>>,
    security_group_ids: ValueList<ValueString<'a>>,
    role_arn: ValueString<'a>,
    access_key_id: ValueString<'a>,
    secret_access_key: ValueString<'a>,
}

/// The resource's attributes (Terraform's names).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct ClusterResourceState<'a> {
    #[serde(borrow = "'a")]
    name: ValueString<'a>,
    version: ValueString<'a>,
    service_ipv4_cidr: ValueString<'a>,
    pod_ipv4_cidr: ValueString<'a>,
    endpoint_public_access: ValueBool,
    endpoint_private_access: ValueBool,
    public_access_cidrs: ValueList<ValueString<'a>>,
    tags: ValueMap<'a, ValueString<'a>>,
    /// A block given at most once (the library carries it as a list of zero or one).
    #[serde(with = "tf_provider::value::serde_as_vec")]
    cloud: Value<CloudState<'a>>,
    #[serde(with = "tf_provider::value::serde_as_vec")]
    pod_security: Value<PodSecurityState<'a>>,
    #[serde(with = "tf_provider::value::serde_as_vec")]
    timeouts: Value<Timeouts<'a>>,
    id: ValueString<'a>,
    endpoint: ValueString<'a>,
    certificate_authority: ValueString<'a>,
    oidc_issuer: ValueString<'a>,
    arn: ValueString<'a>,
    status: ValueString<'a>,
}

/// Attributes whose change replaces the cluster.
const REPLACING: [&str; 5] = [
    "name",
    "version",
    "service_ipv4_cidr",
    "pod_ipv4_cidr",
    "cloud",
];

/// `flotilla_cluster`.
pub struct ClusterResource {
    connection: Connection,
}

impl ClusterResource {
    /// Acts through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        ClusterResource { connection }
    }
}

/// The value of `field` in `state`, as JSON (for comparing plans).
fn field(state: &ClusterResourceState<'_>, name: &str) -> serde_json::Value {
    match name {
        "name" => serde_json::json!(state.name.as_deref_option()),
        "version" => serde_json::json!(state.version.as_deref_option()),
        "service_ipv4_cidr" => serde_json::json!(state.service_ipv4_cidr.as_deref_option()),
        "pod_ipv4_cidr" => serde_json::json!(state.pod_ipv4_cidr.as_deref_option()),
        "cloud" => state
            .cloud
            .as_ref_option()
            .map_or(serde_json::Value::Null, cloud_request),
        _ => serde_json::Value::Null,
    }
}

impl<'a> ClusterResourceState<'a> {
    /// This state with the configuration's `timeouts` (Terraform's, unknown to the API).
    fn keeping(mut self, timeouts: &Value<Timeouts<'a>>) -> Self {
        self.timeouts = timeouts.clone();
        self
    }
}

/// Which of [`REPLACING`] change between `prior` and `proposed` (unknown or unset proposed
/// values are the server's to choose, so they change nothing).
pub fn replacing_changes(
    prior: &ClusterResourceState<'_>,
    proposed: &ClusterResourceState<'_>,
) -> Vec<&'static str> {
    REPLACING
        .into_iter()
        .filter(|name| {
            let next = field(proposed, name);
            !next.is_null() && next != field(prior, name)
        })
        .collect()
}

fn tags_of(state: &ClusterResourceState<'_>) -> BTreeMap<String, String> {
    state
        .tags
        .as_ref_option()
        .map(|tags| {
            tags.iter()
                .filter_map(|(key, value)| {
                    Some((key.to_string(), value.as_deref_option()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The endpoint access the plan asks for (what it leaves unset is the service's default).
fn endpoint_access(state: &ClusterResourceState<'_>) -> serde_json::Value {
    let mut access = serde_json::Map::new();
    if let Some(public) = state.endpoint_public_access.as_ref_option() {
        access.insert("public".into(), (*public).into());
    }
    if let Some(private) = state.endpoint_private_access.as_ref_option() {
        access.insert("private".into(), (*private).into());
    }
    if let Some(cidrs) = state.public_access_cidrs.as_ref_option() {
        let cidrs: Vec<&str> = cidrs.iter().filter_map(|c| c.as_deref_option()).collect();
        access.insert("publicAccessCidrs".into(), cidrs.into());
    }
    serde_json::Value::Object(access)
}

fn list_texts(list: &ValueList<ValueString<'_>>) -> Vec<String> {
    list.as_ref_option()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_deref_option().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The management API's `cloud` object for `cloud`.
fn cloud_request(cloud: &CloudState<'_>) -> serde_json::Value {
    let mut request = serde_json::json!({
        "region": cloud.region.as_deref_option(),
        "endpointOverride": cloud.endpoint_override.as_deref_option(),
        "vpcId": cloud.vpc_id.as_deref_option(),
        "subnetIds": list_texts(&cloud.subnet_ids),
        "securityGroupIds": list_texts(&cloud.security_group_ids),
        "roleArn": cloud.role_arn.as_deref_option(),
    });
    if let Some(key) = cloud.access_key_id.as_deref_option() {
        request["credentials"] = serde_json::json!({
            "accessKeyId": key,
            "secretAccessKey": cloud.secret_access_key.as_deref_option(),
        });
    }
    // Unset members are left out, as the API's defaults.
    if let Some(object) = request.as_object_mut() {
        object.retain(|_, value| !value.is_null());
    }
    request
}

/// The state's `cloud` from a cluster document; the secret comes from `prior` (never
/// returned by the API). A cluster without a cloud has none.
fn cloud_of<'a>(
    cluster: &serde_json::Value,
    prior: Option<&CloudState<'a>>,
) -> Value<CloudState<'a>> {
    let cloud = &cluster["cloud"];
    if cloud.as_object().is_none_or(|c| c.is_empty()) {
        return Value::Null;
    }
    let list = |name: &str| -> ValueList<ValueString<'a>> {
        Value::Value(
            cloud[name]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(owned))
                .collect(),
        )
    };
    Value::Value(CloudState {
        region: json_text(cloud, "/region"),
        endpoint_override: json_text(cloud, "/endpointOverride"),
        vpc_id: json_text(cloud, "/vpcId"),
        subnet_ids: list("subnetIds"),
        security_group_ids: list("securityGroupIds"),
        role_arn: json_text(cloud, "/roleArn"),
        access_key_id: json_text(cloud, "/credentials/accessKeyId"),
        secret_access_key: prior
            .map(|p| p.secret_access_key.clone())
            .unwrap_or(Value::Null),
    })
}

/// CreateCluster's body for the planned state.
pub fn create_request(state: &ClusterResourceState<'_>) -> serde_json::Value {
    let mut network = serde_json::Map::new();
    if let Some(cidr) = state.service_ipv4_cidr.as_deref_option() {
        network.insert("serviceIpv4Cidr".into(), cidr.into());
    }
    if let Some(cidr) = state.pod_ipv4_cidr.as_deref_option() {
        network.insert("podIpv4Cidr".into(), cidr.into());
    }
    let mut request = serde_json::json!({
        "name": state.name.as_deref_option(),
        "kubernetesNetworkConfig": network,
        "endpointAccess": endpoint_access(state),
        "tags": tags_of(state),
    });
    if let Some(version) = state.version.as_deref_option() {
        request["version"] = version.into();
    }
    if let Some(cloud) = state.cloud.as_ref_option() {
        request["cloud"] = cloud_request(cloud);
    }
    if let Some(block) = state.pod_security.as_ref_option() {
        request["podSecurity"] = pod_security::request(Some(block));
    }
    request
}

/// The state of a cluster document; `prior_tags_unset` keeps an empty tag set null, as the
/// configuration that left `tags` out has it, `prior_cloud` holds the cloud's secret and
/// `prior_pod_security` says which of its attributes the configuration left out.
pub fn state_of<'a>(
    cluster: &serde_json::Value,
    prior_tags_unset: bool,
    prior_cloud: Option<&CloudState<'a>>,
    prior_pod_security: &Value<PodSecurityState<'a>>,
) -> ClusterResourceState<'a> {
    let tags: BTreeMap<Cow<'a, str>, ValueString<'a>> = cluster["tags"]
        .as_object()
        .map(|tags| {
            tags.iter()
                .map(|(k, v)| (Cow::Owned(k.clone()), owned(v.as_str().unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default();
    let access = &cluster["endpointAccess"];
    ClusterResourceState {
        name: json_text(cluster, "/name"),
        version: json_text(cluster, "/version"),
        service_ipv4_cidr: json_text(cluster, "/kubernetesNetworkConfig/serviceIpv4Cidr"),
        pod_ipv4_cidr: json_text(cluster, "/kubernetesNetworkConfig/podIpv4Cidr"),
        endpoint_public_access: access["public"].as_bool().map_or(Value::Null, Value::Value),
        endpoint_private_access: access["private"]
            .as_bool()
            .map_or(Value::Null, Value::Value),
        public_access_cidrs: Value::Value(
            access["publicAccessCidrs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c.as_str().map(owned))
                .collect(),
        ),
        tags: if tags.is_empty() && prior_tags_unset {
            Value::Null
        } else {
            Value::Value(tags)
        },
        cloud: cloud_of(cluster, prior_cloud),
        pod_security: pod_security::state_of(cluster, prior_pod_security),
        timeouts: Value::Null,
        id: json_text(cluster, "/id"),
        endpoint: json_text(cluster, "/endpoint"),
        certificate_authority: json_text(cluster, "/certificateAuthority/data"),
        oidc_issuer: json_text(cluster, "/identity/oidc/issuer"),
        arn: json_text(cluster, "/arn"),
        status: json_text(cluster, "/status"),
    }
}

/// The cluster named `name`, `None` when there is none.
async fn describe(
    client: &flotilla_management_client::ManagementClient,
    name: &str,
) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(get_if_found(client, &format!("/v1/clusters/{name}"))
        .await?
        .map(|answer| answer["cluster"].clone()))
}

/// Waits until the cluster is ACTIVE; a FAILED one is an error with its reason.
async fn wait_active(
    client: &flotilla_management_client::ManagementClient,
    name: &str,
    within: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let cluster = describe(client, name)
            .await?
            .ok_or_else(|| anyhow::anyhow!("cluster {name} disappeared while being created"))?;
        match cluster["status"].as_str() {
            Some("ACTIVE") => return Ok(cluster),
            Some("FAILED") => anyhow::bail!(
                "cluster {name} FAILED: {}",
                cluster["statusReason"]
                    .as_str()
                    .unwrap_or("no reason given")
            ),
            _ if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("cluster {name} is not ACTIVE after {within:?}")
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

/// The configuration's ranges that the management API would refuse, each with its attribute
/// (the API's own rule; unknown values wait for apply).
fn cidr_problems(config: &ClusterResourceState<'_>) -> Vec<(String, AttributePath)> {
    use flotilla_api_machinery::cidr::{MAX_CLUSTER_RANGE_PREFIX, ipv4_network_problem};
    let mut problems = Vec::new();
    for (name, value) in [
        ("service_ipv4_cidr", &config.service_ipv4_cidr),
        ("pod_ipv4_cidr", &config.pod_ipv4_cidr),
    ] {
        if let Some(cidr) = value.as_deref_option()
            && let Some(why) = ipv4_network_problem(cidr, MAX_CLUSTER_RANGE_PREFIX)
        {
            problems.push((
                format!("{cidr:?} is invalid: {why}"),
                AttributePath::new(name),
            ));
        }
    }
    for (index, cidr) in config.public_access_cidrs.iter().flatten().enumerate() {
        if let Some(cidr) = cidr.as_deref_option()
            && let Some(why) = ipv4_network_problem(cidr, 32)
        {
            problems.push((
                format!("{cidr:?} is invalid: {why}"),
                AttributePath::new("public_access_cidrs").index(index as i64),
            ));
        }
    }
    problems
}

/// The attributes of `cloud`.
fn cloud_attributes() -> std::collections::HashMap<String, tf_provider::schema::Attribute> {
    use AttributeConstraint::Optional;
    let string = || AttributeType::String;
    let list = || AttributeType::List(AttributeType::String.into());
    let mut attributes: std::collections::HashMap<String, tf_provider::schema::Attribute> = [
        (
            "region",
            attribute(string(), Optional, "Region (us-east-1)."),
        ),
        (
            "endpoint_override",
            attribute(
                string(),
                Optional,
                "One endpoint for every cloud API (LocalStack's http://127.0.0.1:4566).",
            ),
        ),
        (
            "vpc_id",
            attribute(string(), Optional, "The cluster's VPC."),
        ),
        (
            "subnet_ids",
            attribute(
                list(),
                Optional,
                "The cluster's subnets (node pools default to them).",
            ),
        ),
        (
            "security_group_ids",
            attribute(list(), Optional, "Security groups of its instances."),
        ),
        (
            "role_arn",
            attribute(string(), Optional, "A role assumed for every call."),
        ),
        (
            "access_key_id",
            attribute(string(), Optional, "Static credentials' key id."),
        ),
        (
            "secret_access_key",
            attribute(
                string(),
                Optional,
                "Static credentials' secret (kept in the state, never returned by the API).",
            ),
        ),
    ]
    .into_iter()
    .map(|(name, attribute)| (name.to_string(), attribute))
    .collect();
    if let Some(secret) = attributes.get_mut("secret_access_key") {
        secret.sensitive = true;
    }
    attributes
}

#[async_trait]
impl Resource for ClusterResource {
    type State<'a> = ClusterResourceState<'a>;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeConstraint::{Computed, Optional, OptionalComputed, Required};
        let string = || AttributeType::String;
        let attributes = [
            ("name", attribute(string(), Required, "The cluster's name, a DNS label of at most 40 characters checked at plan (replaces the cluster when changed).")),
            ("version", attribute(string(), OptionalComputed, "Kubernetes minor version (default: the newest supported; replaces when changed).")),
            ("service_ipv4_cidr", attribute(string(), OptionalComputed, "The Services' range, an IPv4 CIDR of /24 or larger checked at plan (default 10.96.0.0/12; replaces when changed).")),
            ("pod_ipv4_cidr", attribute(string(), OptionalComputed, "The pods' range, an IPv4 CIDR of /24 or larger checked at plan (default 10.244.0.0/16; replaces when changed).")),
            ("endpoint_public_access", attribute(AttributeType::Bool, OptionalComputed, "Whether the API answers on the public endpoint (updated in place).")),
            ("endpoint_private_access", attribute(AttributeType::Bool, OptionalComputed, "Whether it answers the private networks (updated in place).")),
            ("public_access_cidrs", attribute(AttributeType::List(string().into()), OptionalComputed, "Who may reach the public endpoint: IPv4 CIDRs, checked at plan (updated in place).")),
            ("tags", attribute(AttributeType::Map(string().into()), Optional, "Tags (updated in place; a key left out is removed).")),
            ("id", attribute(string(), Computed, "The cluster's id.")),
            ("endpoint", attribute(string(), Computed, "The cluster's Kubernetes API URL.")),
            ("certificate_authority", attribute(string(), Computed, "Base64 of the PEM CA that signed the API's certificate.")),
            ("oidc_issuer", attribute(string(), Computed, "The issuer of its service-account tokens.")),
            ("arn", attribute(string(), Computed, "The cluster's resource name, arn:flotilla:clusters::ACCOUNT:cluster/NAME (unique across the service).")),
            ("status", attribute(string(), Computed, "CREATING, ACTIVE, UPDATING, DELETING or FAILED.")),
        ]
        .into_iter()
        .map(|(name, attribute)| (name.to_string(), attribute))
        .collect();
        let cloud = Block {
            version: 1,
            description: Description::plain(
                "The cloud (EC2, ELBv2, EBS) the cluster's node pools, load balancers and volumes are made in (replaces the cluster when changed).",
            ),
            attributes: cloud_attributes(),
            ..Default::default()
        };
        Some(schema(
            "A Flotilla cluster (a hosted Kubernetes control plane).",
            attributes,
            vec![
                ("cloud", tf_provider::schema::NestedBlock::Optional(cloud)),
                (
                    "pod_security",
                    tf_provider::schema::NestedBlock::Optional(pod_security::block()),
                ),
                ("timeouts", timeouts_block()),
            ],
        ))
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: Self::State<'a>) -> Option<()> {
        validate_timeouts(diags, &config.timeouts);
        // The management API's own rules, checked at plan (unknown values wait for apply).
        if let Some(name) = config.name.as_deref_option()
            && let Some(problem) =
                flotilla_api_machinery::names::management_name_problems(name).first()
        {
            diags.error_short(
                format!("cluster name {name:?} is invalid: {problem}"),
                AttributePath::new("name"),
            );
        }
        for (problem, path) in cidr_problems(&config)
            .into_iter()
            .chain(pod_security::problems(&config.pod_security))
        {
            diags.error_short(problem, path);
        }
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: Self::State<'a>,
        private_state: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let name = state.name.as_deref_option()?.to_string();
        match describe(&client, &name).await {
            // Gone behind Terraform's back: the plan re-creates it.
            Ok(None) => None,
            Ok(Some(cluster)) => Some((
                state_of(
                    &cluster,
                    state.tags.is_null(),
                    state.cloud.as_ref_option(),
                    &state.pod_security,
                )
                .keeping(&state.timeouts),
                private_state,
            )),
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                Some((state, private_state))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        _diags: &mut Diagnostics,
        proposed: Self::State<'a>,
        _config: Self::State<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let mut state = proposed;
        let unknown_if_null = |value: &mut ValueString<'a>| {
            if value.is_null() {
                *value = Value::Unknown;
            }
        };
        for value in [
            &mut state.version,
            &mut state.service_ipv4_cidr,
            &mut state.pod_ipv4_cidr,
            &mut state.id,
            &mut state.endpoint,
            &mut state.certificate_authority,
            &mut state.oidc_issuer,
            &mut state.arn,
            &mut state.status,
        ] {
            unknown_if_null(value);
        }
        if state.endpoint_public_access.is_null() {
            state.endpoint_public_access = Value::Unknown;
        }
        if state.endpoint_private_access.is_null() {
            state.endpoint_private_access = Value::Unknown;
        }
        if state.public_access_cidrs.is_null() {
            state.public_access_cidrs = Value::Unknown;
        }
        Some((state, ValueEmpty::default()))
    }

    async fn plan_update<'a>(
        &self,
        _diags: &mut Diagnostics,
        prior: Self::State<'a>,
        proposed: Self::State<'a>,
        _config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>, Vec<AttributePath>)> {
        let replace = replacing_changes(&prior, &proposed)
            .into_iter()
            .map(AttributePath::new)
            .collect();
        Some((proposed, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<Self::PrivateState<'a>> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: Self::State<'a>,
        config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let name = planned.name.as_deref_option()?.to_string();
        let within = timeout(&planned.timeouts, Operation::Create);
        let cluster = create_and_wait(
            diags,
            &client,
            "/v1/clusters",
            &create_request(&planned),
            || wait_active(&client, &name, within),
            || describe(&client, &name),
        )
        .await?;
        Some((
            state_of(
                &cluster,
                config.tags.is_null(),
                config.cloud.as_ref_option(),
                &config.pod_security,
            )
            .keeping(&planned.timeouts),
            private,
        ))
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: Self::State<'a>,
        planned: Self::State<'a>,
        config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let name = planned.name.as_deref_option()?.to_string();
        // Tags the plan drops are removed (a null value), the others set.
        let wanted = tags_of(&planned);
        let mut tags: BTreeMap<String, Option<String>> = tags_of(&prior)
            .into_keys()
            .filter(|key| !wanted.contains_key(key))
            .map(|key| (key, None))
            .collect();
        tags.extend(wanted.into_iter().map(|(k, v)| (k, Some(v))));
        // The block left out is upstream's defaults again.
        let request = serde_json::json!({
            "endpointAccess": endpoint_access(&planned),
            "tags": tags,
            "podSecurity": pod_security::request(planned.pod_security.as_ref_option()),
        });
        let updated = async {
            client
                .call_json(
                    Method::PATCH,
                    &format!("/v1/clusters/{name}"),
                    Some(&request),
                )
                .await?;
            wait_active(
                &client,
                &name,
                timeout(&planned.timeouts, Operation::Update),
            )
            .await
        };
        let cluster = reported(diags, updated.await)?;
        Some((
            state_of(
                &cluster,
                config.tags.is_null(),
                config.cloud.as_ref_option(),
                &config.pod_security,
            )
            .keeping(&planned.timeouts),
            private,
        ))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: Self::State<'a>,
        _private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<()> {
        let client = self.connection.client(diags)?;
        let name = prior.name.as_deref_option()?.to_string();
        let deleted = delete_and_wait(
            &client,
            &format!("/v1/clusters/{name}"),
            timeout(&prior.timeouts, Operation::Delete),
            || describe(&client, &name),
        )
        .await;
        reported(diags, deleted)
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        match describe(&client, &id).await {
            Ok(Some(cluster)) => Some((
                state_of(&cluster, true, None, &Value::Null),
                ValueEmpty::default(),
            )),
            Ok(None) => {
                diags.root_error_short(format!("no cluster named {id:?} to import"));
                None
            }
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> serde_json::Value {
        serde_json::json!({
            "name": "prod", "id": "prod-x1", "version": "1.33", "status": "ACTIVE",
            "endpoint": "https://127.0.0.1:6443/clusters/prod-x1",
            "kubernetesNetworkConfig": {"serviceIpv4Cidr": "10.96.0.0/12", "podIpv4Cidr": "10.244.0.0/16"},
            "endpointAccess": {"public": true, "private": false, "publicAccessCidrs": ["0.0.0.0/0"]},
            "tags": {},
        })
    }

    #[test]
    fn names_versions_and_ranges_replace_while_tags_and_access_update() {
        let prior = state_of(&cluster(), false, None, &Value::Null);
        let mut proposed = prior.clone();
        proposed.tags = Value::Value(BTreeMap::from([(Cow::Borrowed("team"), owned("infra"))]));
        proposed.endpoint_private_access = Value::Value(true);
        assert!(replacing_changes(&prior, &proposed).is_empty());
        proposed.version = owned("1.34");
        proposed.service_ipv4_cidr = Value::Unknown;
        assert_eq!(replacing_changes(&prior, &proposed), vec!["version"]);
        proposed.name = owned("other");
        assert_eq!(
            replacing_changes(&prior, &proposed),
            vec!["name", "version"]
        );
    }

    #[test]
    fn the_plan_becomes_the_create_request_and_the_answer_the_state() {
        let mut planned = ClusterResourceState {
            name: owned("prod"),
            tags: Value::Value(BTreeMap::from([(Cow::Borrowed("team"), owned("infra"))])),
            endpoint_private_access: Value::Value(true),
            ..Default::default()
        };
        planned.version = Value::Unknown;
        let request = create_request(&planned);
        assert_eq!(
            request,
            serde_json::json!({"name": "prod", "kubernetesNetworkConfig": {},
                "endpointAccess": {"private": true}, "tags": {"team": "infra"}})
        );
        let state = state_of(&cluster(), true, None, &Value::Null);
        assert!(
            state.tags.is_null(),
            "no tags in the configuration, none in the API"
        );
        assert_eq!(
            state.service_ipv4_cidr.as_deref_option(),
            Some("10.96.0.0/12")
        );
        assert_eq!(state.endpoint_public_access.as_ref_option(), Some(&true));
        assert!(
            !state_of(&cluster(), false, None, &Value::Null)
                .tags
                .is_null()
        );
        assert!(
            state.cloud.is_null(),
            "no cloud in the API, none in the state"
        );
    }

    #[test]
    fn ranges_the_api_would_refuse_are_found_at_plan_on_their_attribute() {
        let config = ClusterResourceState {
            name: owned("prod"),
            service_ipv4_cidr: owned("10.96.0.1/12"),
            pod_ipv4_cidr: owned("10.244.0.0/16"),
            public_access_cidrs: Value::Value(vec![owned("0.0.0.0/0"), owned("203.0.113.0/33")]),
            ..Default::default()
        };
        let problems = cidr_problems(&config);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].0.contains("host bits must be zero"));
        assert_eq!(problems[0].1, AttributePath::new("service_ipv4_cidr"));
        assert_eq!(
            problems[1].1,
            AttributePath::new("public_access_cidrs").index(1)
        );
        let unknown = ClusterResourceState {
            service_ipv4_cidr: Value::Unknown,
            ..Default::default()
        };
        assert!(cidr_problems(&unknown).is_empty());
    }

    #[test]
    fn the_cloud_goes_to_the_api_and_its_secret_stays_in_the_state() {
        let cloud = CloudState {
            region: owned("us-east-1"),
            vpc_id: owned("vpc-1"),
            subnet_ids: Value::Value(vec![owned("subnet-1"), owned("subnet-2")]),
            access_key_id: owned("AKID"),
            secret_access_key: owned("s3cret"),
            ..Default::default()
        };
        assert_eq!(
            cloud_request(&cloud),
            serde_json::json!({"region": "us-east-1", "vpcId": "vpc-1",
                "subnetIds": ["subnet-1", "subnet-2"], "securityGroupIds": [],
                "credentials": {"accessKeyId": "AKID", "secretAccessKey": "s3cret"}})
        );
        let mut document = cluster();
        document["cloud"] = serde_json::json!({"region": "us-east-1", "vpcId": "vpc-1",
            "subnetIds": ["subnet-1", "subnet-2"], "credentials": {"accessKeyId": "AKID"}});
        let state = state_of(&document, true, Some(&cloud), &Value::Null);
        let read = state.cloud.as_ref_option().cloned().unwrap_or_default();
        assert_eq!(read.secret_access_key.as_deref_option(), Some("s3cret"));
        assert_eq!(read.subnet_ids, cloud.subnet_ids);
        let mut other = state.clone();
        if let Value::Value(c) = &mut other.cloud {
            c.region = owned("eu-west-1");
        }
        assert_eq!(replacing_changes(&state, &other), vec!["cloud"]);
    }
}
