//! `resource "flotilla_node_pool"`: a cluster's node pool, as `aws_eks_node_group`. Create
//! waits until it is ACTIVE (DEGRADED is an error carrying the cloud's reasons from
//! `health.issues`); the sizes and labels update in place (so `lifecycle { ignore_changes =
//! [desired_size] }` suits an autoscaled pool); the cluster, name, instance types, image and
//! subnets replace it; drift re-creates; `terraform import flotilla_node_pool.X CLUSTER/POOL`.
//! `taint { key, value, effect }` blocks (EKS's effects: NO_SCHEDULE, NO_EXECUTE,
//! PREFER_NO_SCHEDULE) update in place.

use std::borrow::Cow;
use std::collections::BTreeMap;

use async_trait::async_trait;
use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Description, Schema};
use tf_provider::value::{Value, ValueEmpty, ValueList, ValueMap, ValueNumber, ValueString};
use tf_provider::{AttributePath, Diagnostics, Resource};

use crate::common::{
    Operation, POLL, Timeouts, attribute, create_and_wait, delete_and_wait, get_if_found,
    json_text, owned, reported, schema, timeout, timeouts_block, validate_timeouts,
};
use crate::provider::Connection;

/// One `taint` block.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaintState<'a> {
    #[serde(borrow = "'a")]
    key: ValueString<'a>,
    value: ValueString<'a>,
    effect: ValueString<'a>,
}

/// The taint effects the management API takes (EKS's spelling).
const TAINT_EFFECTS: [&str; 3] = ["NO_SCHEDULE", "NO_EXECUTE", "PREFER_NO_SCHEDULE"];

/// The resource's attributes (Terraform's names).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct NodePoolState<'a> {
    #[serde(borrow = "'a")]
    cluster_name: ValueString<'a>,
    name: ValueString<'a>,
    instance_types: ValueList<ValueString<'a>>,
    image_id: ValueString<'a>,
    min_size: ValueNumber,
    max_size: ValueNumber,
    desired_size: ValueNumber,
    labels: ValueMap<'a, ValueString<'a>>,
    taint: ValueList<Value<TaintState<'a>>>,
    #[serde(with = "tf_provider::value::serde_as_vec")]
    timeouts: Value<Timeouts<'a>>,
    subnets: ValueList<ValueString<'a>>,
    status: ValueString<'a>,
    ready_nodes: ValueNumber,
    instance_ids: ValueList<ValueString<'a>>,
}

/// `flotilla_node_pool`.
pub struct NodePoolResource {
    connection: Connection,
}

impl NodePoolResource {
    /// Acts through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        NodePoolResource { connection }
    }
}

fn strings<'a>(value: &serde_json::Value) -> ValueList<ValueString<'a>> {
    Value::Value(
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(owned))
            .collect(),
    )
}

fn texts(list: &ValueList<ValueString<'_>>) -> Option<Vec<String>> {
    list.as_ref_option().map(|items| {
        items
            .iter()
            .filter_map(|item| item.as_deref_option().map(str::to_string))
            .collect()
    })
}

fn labels_of(state: &NodePoolState<'_>) -> BTreeMap<String, String> {
    state
        .labels
        .as_ref_option()
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| Some((k.to_string(), v.as_deref_option()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The JSON form of the pool's attributes that replace it when they change.
fn replacing(state: &NodePoolState<'_>) -> [(&'static str, serde_json::Value); 5] {
    [
        (
            "cluster_name",
            serde_json::json!(state.cluster_name.as_deref_option()),
        ),
        ("name", serde_json::json!(state.name.as_deref_option())),
        (
            "instance_types",
            serde_json::json!(texts(&state.instance_types)),
        ),
        (
            "image_id",
            serde_json::json!(state.image_id.as_deref_option()),
        ),
        ("subnets", serde_json::json!(texts(&state.subnets))),
    ]
}

impl<'a> NodePoolState<'a> {
    /// This state with the configuration's `timeouts` (Terraform's, unknown to the API).
    fn keeping(mut self, timeouts: &Value<Timeouts<'a>>) -> Self {
        self.timeouts = timeouts.clone();
        self
    }
}

/// Which attributes that replace the pool change from `prior` to `proposed` (an unknown or
/// unset proposal is the service's to choose).
pub fn replacing_changes(
    prior: &NodePoolState<'_>,
    proposed: &NodePoolState<'_>,
) -> Vec<&'static str> {
    let before = replacing(prior);
    replacing(proposed)
        .into_iter()
        .zip(before)
        .filter(|((_, next), (_, previous))| !next.is_null() && next != previous)
        .map(|((name, _), _)| name)
        .collect()
}

/// The management API's taints for the `taint` blocks.
fn taints_of(state: &NodePoolState<'_>) -> Vec<serde_json::Value> {
    state
        .taint
        .as_ref_option()
        .into_iter()
        .flatten()
        .filter_map(|taint| taint.as_ref_option())
        .map(|taint| {
            let mut wire = serde_json::json!({
                "key": taint.key.as_deref_option(),
                "effect": taint.effect.as_deref_option(),
            });
            if let Some(value) = taint.value.as_deref_option() {
                wire["value"] = value.into();
            }
            wire
        })
        .collect()
}

fn scaling(state: &NodePoolState<'_>) -> serde_json::Value {
    serde_json::json!({
        "minSize": state.min_size.as_ref_option(),
        "maxSize": state.max_size.as_ref_option(),
        "desiredSize": state.desired_size.as_ref_option(),
    })
}

/// CreateNodegroup's body for the planned state.
pub fn create_request(state: &NodePoolState<'_>) -> serde_json::Value {
    let mut request = serde_json::json!({
        "name": state.name.as_deref_option(),
        "scalingConfig": scaling(state),
        "labels": labels_of(state),
        "taints": taints_of(state),
        "instanceTypes": texts(&state.instance_types).unwrap_or_default(),
        "subnets": texts(&state.subnets).unwrap_or_default(),
    });
    if let Some(image) = state.image_id.as_deref_option() {
        request["imageId"] = image.into();
    }
    request
}

/// The state of a pool document; `labels_unset` keeps an empty label set null.
pub fn state_of<'a>(pool: &serde_json::Value, labels_unset: bool) -> NodePoolState<'a> {
    let labels: BTreeMap<Cow<'a, str>, ValueString<'a>> = pool["labels"]
        .as_object()
        .map(|labels| {
            labels
                .iter()
                .map(|(k, v)| (Cow::Owned(k.clone()), owned(v.as_str().unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default();
    let number = |pointer: &str| {
        pool.pointer(pointer)
            .and_then(|v| v.as_i64())
            .map_or(Value::Null, Value::Value)
    };
    NodePoolState {
        cluster_name: json_text(pool, "/clusterName"),
        name: json_text(pool, "/name"),
        instance_types: strings(&pool["instanceTypes"]),
        image_id: json_text(pool, "/imageId"),
        min_size: number("/scalingConfig/minSize"),
        max_size: number("/scalingConfig/maxSize"),
        desired_size: number("/scalingConfig/desiredSize"),
        labels: if labels.is_empty() && labels_unset {
            Value::Null
        } else {
            Value::Value(labels)
        },
        taint: Value::Value(
            pool["taints"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|taint| {
                    Value::Value(TaintState {
                        key: json_text(taint, "/key"),
                        value: json_text(taint, "/value"),
                        effect: json_text(taint, "/effect"),
                    })
                })
                .collect(),
        ),
        subnets: strings(&pool["subnets"]),
        timeouts: Value::Null,
        status: json_text(pool, "/status"),
        ready_nodes: number("/readyNodes"),
        instance_ids: strings(&pool["instanceIds"]),
    }
}

fn pool_path(cluster: &str, pool: &str) -> String {
    format!("/v1/clusters/{cluster}/nodepools/{pool}")
}

async fn describe(
    client: &flotilla_management_client::ManagementClient,
    cluster: &str,
    pool: &str,
) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(get_if_found(client, &pool_path(cluster, pool))
        .await?
        .map(|answer| answer["nodePool"].clone()))
}

/// Waits until the pool is ACTIVE; DEGRADED is an error with the cloud's reasons.
async fn wait_active(
    client: &flotilla_management_client::ManagementClient,
    cluster: &str,
    pool: &str,
    within: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let found = describe(client, cluster, pool)
            .await?
            .ok_or_else(|| anyhow::anyhow!("node pool {pool} disappeared"))?;
        match found["status"].as_str() {
            Some("ACTIVE") => return Ok(found),
            Some("DEGRADED") | Some("CREATE_FAILED") => {
                let issues: Vec<String> = found["health"]["issues"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|issue| {
                        format!(
                            "{}: {}",
                            issue["code"].as_str().unwrap_or_default(),
                            issue["message"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                anyhow::bail!(
                    "node pool {pool} is {}: {}",
                    found["status"].as_str().unwrap_or_default(),
                    if issues.is_empty() {
                        found["statusReason"]
                            .as_str()
                            .unwrap_or("no reason given")
                            .to_string()
                    } else {
                        issues.join("; ")
                    }
                )
            }
            _ if tokio::time::Instant::now() > deadline => {
                anyhow::bail!("node pool {pool} is not ACTIVE after {within:?}")
            }
            _ => tokio::time::sleep(POLL).await,
        }
    }
}

#[async_trait]
impl Resource for NodePoolResource {
    type State<'a> = NodePoolState<'a>;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeConstraint::{Computed, Optional, OptionalComputed, Required};
        let string = || AttributeType::String;
        let list = || AttributeType::List(AttributeType::String.into());
        let attributes = [
            ("cluster_name", attribute(string(), Required, "The pool's cluster (replaces the pool when changed).")),
            ("name", attribute(string(), Required, "The pool's name (replaces it when changed).")),
            ("instance_types", attribute(list(), OptionalComputed, "Instance types; the first is launched (replaces when changed).")),
            ("image_id", attribute(string(), Optional, "The AMI (default: the newest Flotilla node image for the cluster's version; replaces when changed).")),
            ("min_size", attribute(AttributeType::Number, Required, "Fewest nodes (updated in place).")),
            ("max_size", attribute(AttributeType::Number, Required, "Most nodes (updated in place).")),
            ("desired_size", attribute(AttributeType::Number, Required, "Nodes wanted, min_size ≤ desired_size ≤ max_size checked at plan (updated in place; `lifecycle { ignore_changes = [desired_size] }` for an autoscaled pool).")),
            ("labels", attribute(AttributeType::Map(string().into()), Optional, "Labels of the pool's Nodes (updated in place).")),
            ("subnets", attribute(list(), OptionalComputed, "Subnets (default: the cluster's; replaces when changed).")),
            ("status", attribute(string(), Computed, "CREATING, ACTIVE, UPDATING, DELETING or DEGRADED.")),
            ("ready_nodes", attribute(AttributeType::Number, Computed, "Ready Nodes of the pool.")),
            ("instance_ids", attribute(list(), Computed, "The pool's instances.")),
        ]
        .into_iter()
        .map(|(name, attribute)| (name.to_string(), attribute))
        .collect();
        let taint = Block {
            version: 1,
            description: Description::plain("A taint of the pool's Nodes (in place)."),
            attributes: [
                ("key", attribute(string(), Required, "The taint's key.")),
                ("value", attribute(string(), Optional, "Its value.")),
                (
                    "effect",
                    attribute(
                        string(),
                        Required,
                        "NO_SCHEDULE, NO_EXECUTE or PREFER_NO_SCHEDULE.",
                    ),
                ),
            ]
            .into_iter()
            .map(|(name, attribute)| (name.to_string(), attribute))
            .collect(),
            ..Default::default()
        };
        Some(schema(
            "A node pool of a Flotilla cluster (EC2 instances that join it).",
            attributes,
            vec![
                ("taint", tf_provider::schema::NestedBlock::List(taint)),
                ("timeouts", timeouts_block()),
            ],
        ))
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: Self::State<'a>) -> Option<()> {
        validate_timeouts(diags, &config.timeouts);
        let (min, max, desired) = (
            config.min_size.as_ref_option().copied(),
            config.max_size.as_ref_option().copied(),
            config.desired_size.as_ref_option().copied(),
        );
        if let (Some(min), Some(max)) = (min, max)
            && min > max
        {
            diags.error_short(
                format!("min_size {min} is above max_size {max}"),
                AttributePath::new("min_size"),
            );
        }
        for (index, taint) in config
            .taint
            .as_ref_option()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(effect) = taint
                .as_ref_option()
                .and_then(|t| t.effect.as_deref_option())
                && !TAINT_EFFECTS.contains(&effect)
            {
                diags.error_short(
                    format!(
                        "taint effect {effect:?} is not one of {}",
                        TAINT_EFFECTS.join(", ")
                    ),
                    AttributePath::new("taint")
                        .index(index as i64)
                        .attribute("effect"),
                );
            }
        }
        if let (Some(min), Some(max), Some(desired)) = (min, max, desired)
            && (desired < min || desired > max)
        {
            diags.error_short(
                format!("desired_size {desired} is outside {min}..={max}"),
                AttributePath::new("desired_size"),
            );
        }
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let cluster = state.cluster_name.as_deref_option()?.to_string();
        let name = state.name.as_deref_option()?.to_string();
        match describe(&client, &cluster, &name).await {
            Ok(None) => None,
            Ok(Some(found)) => Some((
                state_of(&found, state.labels.is_null()).keeping(&state.timeouts),
                private,
            )),
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                Some((state, private))
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
        for list in [
            &mut state.instance_types,
            &mut state.subnets,
            &mut state.instance_ids,
        ] {
            if list.is_null() {
                *list = Value::Unknown;
            }
        }
        state.status = Value::Unknown;
        state.ready_nodes = Value::Unknown;
        Some((state, ValueEmpty::default()))
    }

    async fn plan_update<'a>(
        &self,
        _diags: &mut Diagnostics,
        prior: Self::State<'a>,
        mut proposed: Self::State<'a>,
        _config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>, Vec<AttributePath>)> {
        let replace: Vec<AttributePath> = replacing_changes(&prior, &proposed)
            .into_iter()
            .map(AttributePath::new)
            .collect();
        // A resize changes which instances run and how many are Ready.
        if proposed.desired_size != prior.desired_size {
            proposed.instance_ids = Value::Unknown;
            proposed.ready_nodes = Value::Unknown;
        }
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
        let cluster = planned.cluster_name.as_deref_option()?.to_string();
        let name = planned.name.as_deref_option()?.to_string();
        let within = timeout(&planned.timeouts, Operation::Create);
        let found = create_and_wait(
            diags,
            &client,
            &format!("/v1/clusters/{cluster}/nodepools"),
            &create_request(&planned),
            || wait_active(&client, &cluster, &name, within),
            || describe(&client, &cluster, &name),
        )
        .await?;
        Some((
            state_of(&found, config.labels.is_null()).keeping(&planned.timeouts),
            private,
        ))
    }

    async fn update<'a>(
        &self,
        diags: &mut Diagnostics,
        _prior: Self::State<'a>,
        planned: Self::State<'a>,
        config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let cluster = planned.cluster_name.as_deref_option()?.to_string();
        let name = planned.name.as_deref_option()?.to_string();
        let request = serde_json::json!({
            "scalingConfig": scaling(&planned),
            "labels": labels_of(&planned),
            "taints": taints_of(&planned),
        });
        let updated = async {
            client
                .call_json(Method::PATCH, &pool_path(&cluster, &name), Some(&request))
                .await?;
            wait_active(
                &client,
                &cluster,
                &name,
                timeout(&planned.timeouts, Operation::Update),
            )
            .await
        };
        let found = reported(diags, updated.await)?;
        Some((
            state_of(&found, config.labels.is_null()).keeping(&planned.timeouts),
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
        let cluster = prior.cluster_name.as_deref_option()?.to_string();
        let name = prior.name.as_deref_option()?.to_string();
        let deleted = delete_and_wait(
            &client,
            &pool_path(&cluster, &name),
            timeout(&prior.timeouts, Operation::Delete),
            || describe(&client, &cluster, &name),
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
        let Some((cluster, name)) = id.split_once('/') else {
            diags.root_error_short(format!("import id {id:?} is not CLUSTER/POOL"));
            return None;
        };
        match describe(&client, cluster, name).await {
            Ok(Some(found)) => Some((state_of(&found, true), ValueEmpty::default())),
            Ok(None) => {
                diags.root_error_short(format!(
                    "no node pool {name:?} in cluster {cluster:?} to import"
                ));
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

    fn pool() -> serde_json::Value {
        serde_json::json!({
            "name": "workers", "clusterName": "prod", "instanceTypes": ["t3.large"],
            "scalingConfig": {"minSize": 1, "maxSize": 3, "desiredSize": 2},
            "labels": {}, "taints": [], "subnets": ["subnet-1"], "status": "ACTIVE",
            "instanceIds": ["i-1", "i-2"], "readyNodes": 2,
        })
    }

    #[test]
    fn sizes_and_labels_update_while_identity_and_placement_replace() {
        let prior = state_of(&pool(), true);
        assert!(prior.labels.is_null());
        assert_eq!(prior.desired_size.as_ref_option(), Some(&2));
        let mut proposed = prior.clone();
        proposed.desired_size = Value::Value(3);
        proposed.labels = Value::Value(BTreeMap::from([(Cow::Borrowed("team"), owned("infra"))]));
        assert!(replacing_changes(&prior, &proposed).is_empty());
        proposed.instance_types = Value::Value(vec![owned("m5.large")]);
        proposed.subnets = Value::Unknown;
        assert_eq!(replacing_changes(&prior, &proposed), vec!["instance_types"]);
    }

    #[test]
    fn the_plan_becomes_the_create_request() {
        let state = NodePoolState {
            name: owned("workers"),
            min_size: Value::Value(1),
            max_size: Value::Value(2),
            desired_size: Value::Value(1),
            instance_types: Value::Unknown,
            ..Default::default()
        };
        assert_eq!(
            create_request(&state),
            serde_json::json!({"name": "workers",
                "scalingConfig": {"minSize": 1, "maxSize": 2, "desiredSize": 1},
                "labels": {}, "taints": [], "instanceTypes": [], "subnets": []})
        );
        let tainted = NodePoolState {
            taint: Value::Value(vec![Value::Value(TaintState {
                key: owned("dedicated"),
                value: owned("gpu"),
                effect: owned("NO_SCHEDULE"),
            })]),
            ..state
        };
        assert_eq!(
            create_request(&tainted)["taints"],
            serde_json::json!([{"key": "dedicated", "value": "gpu", "effect": "NO_SCHEDULE"}])
        );
        let mut document = pool();
        document["taints"] =
            serde_json::json!([{"key": "dedicated", "value": "gpu", "effect": "NO_SCHEDULE"}]);
        assert_eq!(state_of(&document, true).taint, tainted.taint);
    }
}
