//! `data "flotilla_cluster"`: a cluster by name, as `aws_eks_cluster` reads one — its id,
//! Kubernetes version, status, API endpoint, CA and OIDC issuer, and tags.

use std::borrow::Cow;

use async_trait::async_trait;
use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{
    Attribute, AttributeConstraint, AttributeType, Block, Description, Schema,
};
use tf_provider::value::{ValueEmpty, ValueMap, ValueString};
use tf_provider::{AttributePath, DataSource, Diagnostics};

use crate::common::{attribute, json_text};
use crate::provider::Connection;

/// The data source's attributes (Terraform's names).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ClusterState<'a> {
    #[serde(borrow = "'a")]
    name: ValueString<'a>,
    id: ValueString<'a>,
    version: ValueString<'a>,
    status: ValueString<'a>,
    endpoint: ValueString<'a>,
    certificate_authority: ValueString<'a>,
    oidc_issuer: ValueString<'a>,
    arn: ValueString<'a>,
    tags: ValueMap<'a, ValueString<'a>>,
}

/// `flotilla_cluster`.
pub struct ClusterDataSource {
    connection: Connection,
}

impl ClusterDataSource {
    /// Reads through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        ClusterDataSource { connection }
    }
}

fn computed(kind: AttributeType, description: &str) -> Attribute {
    attribute(kind, AttributeConstraint::Computed, description)
}

/// The management API's cluster document as the data source's state.
fn state_of<'a>(cluster: &serde_json::Value) -> ClusterState<'a> {
    let tags = cluster["tags"]
        .as_object()
        .map(|tags| {
            tags.iter()
                .map(|(key, value)| {
                    (
                        Cow::Owned(key.clone()),
                        ValueString::Value(Cow::Owned(
                            value.as_str().unwrap_or_default().to_string(),
                        )),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    ClusterState {
        name: json_text(cluster, "/name"),
        id: json_text(cluster, "/id"),
        version: json_text(cluster, "/version"),
        status: json_text(cluster, "/status"),
        endpoint: json_text(cluster, "/endpoint"),
        certificate_authority: json_text(cluster, "/certificateAuthority/data"),
        oidc_issuer: json_text(cluster, "/identity/oidc/issuer"),
        arn: json_text(cluster, "/arn"),
        tags: ValueMap::Value(tags),
    }
}

#[async_trait]
impl DataSource for ClusterDataSource {
    type State<'a> = ClusterState<'a>;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        let mut attributes: std::collections::HashMap<String, Attribute> = [
            ("id", "The cluster's id."),
            ("version", "Its Kubernetes minor version."),
            ("status", "CREATING, ACTIVE, UPDATING, DELETING or FAILED."),
            ("endpoint", "The cluster's Kubernetes API URL."),
            (
                "certificate_authority",
                "Base64 of the PEM CA that signed the API's certificate.",
            ),
            ("oidc_issuer", "The issuer of its service-account tokens."),
            (
                "arn",
                "The cluster's resource name, arn:flotilla:clusters::ACCOUNT:cluster/NAME.",
            ),
        ]
        .into_iter()
        .map(|(name, description)| {
            (
                name.to_string(),
                computed(AttributeType::String, description),
            )
        })
        .collect();
        attributes.insert(
            "name".into(),
            Attribute {
                attr_type: AttributeType::String,
                description: Description::plain("The cluster's name."),
                constraint: AttributeConstraint::Required,
                ..Default::default()
            },
        );
        attributes.insert(
            "tags".into(),
            computed(
                AttributeType::Map(AttributeType::String.into()),
                "Its tags.",
            ),
        );
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain("A Flotilla cluster, by name."),
                attributes: attributes.into_iter().collect(),
                ..Default::default()
            },
        })
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        config: Self::State<'a>,
        _provider_meta_state: Self::ProviderMetaState<'a>,
    ) -> Option<Self::State<'a>> {
        let client = self.connection.client(diags)?;
        let Some(name) = config.name.as_deref_option() else {
            diags.error_short("name is required", AttributePath::new("name"));
            return None;
        };
        match client
            .call_json(Method::GET, &format!("/v1/clusters/{name}"), None)
            .await
        {
            // DescribeCluster's shape: `{"cluster": {...}}`.
            Ok(answer) => Some(state_of(&answer["cluster"])),
            Err(err) => {
                diags.error_short(format!("{err:#}"), AttributePath::new("name"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_management_document_maps_to_the_data_source() {
        let state = state_of(&serde_json::json!({
            "name": "prod", "id": "prod-x1", "version": "1.33", "status": "ACTIVE",
            "endpoint": "https://127.0.0.1:6443/clusters/prod-x1",
            "certificateAuthority": {"data": "Q0E="},
            "identity": {"oidc": {"issuer": "https://127.0.0.1:6443/clusters/prod-x1"}},
            "tags": {"team": "infra"}, "arn": "arn:flotilla:clusters::acme:cluster/prod",
        }));
        assert_eq!(state.id.as_deref_option(), Some("prod-x1"));
        assert_eq!(
            state.arn.as_deref_option(),
            Some("arn:flotilla:clusters::acme:cluster/prod")
        );
        assert_eq!(state.certificate_authority.as_deref_option(), Some("Q0E="));
        assert_eq!(
            state.oidc_issuer.as_deref_option(),
            Some("https://127.0.0.1:6443/clusters/prod-x1")
        );
        let tags = state.tags.as_ref_option().cloned().unwrap_or_default();
        assert_eq!(tags.len(), 1);
        let missing = state_of(&serde_json::json!({"name": "x"}));
        assert!(missing.certificate_authority.is_null());
    }
}
