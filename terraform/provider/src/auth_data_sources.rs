//! `data "flotilla_kubeconfig"` (a cluster's kubeconfig, as `flotilla cluster kubeconfig`
//! writes it) and `data "flotilla_cluster_auth"` (a short-lived bearer token for its API, as
//! `aws_eks_cluster_auth`), both sensitive, for configuring kubectl or other providers.

use std::borrow::Cow;

use async_trait::async_trait;
use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Description, Schema};
use tf_provider::value::{ValueEmpty, ValueString};
use tf_provider::{AttributePath, DataSource, Diagnostics};

use crate::common::{attribute, json_text};
use crate::provider::Connection;

/// `flotilla_kubeconfig`'s attributes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct KubeconfigState<'a> {
    #[serde(borrow = "'a")]
    name: ValueString<'a>,
    kubeconfig: ValueString<'a>,
}

/// `flotilla_cluster_auth`'s attributes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ClusterAuthState<'a> {
    #[serde(borrow = "'a")]
    name: ValueString<'a>,
    token: ValueString<'a>,
    expiration: ValueString<'a>,
}

/// `flotilla_kubeconfig`.
pub struct KubeconfigDataSource {
    connection: Connection,
}

/// `flotilla_cluster_auth`.
pub struct ClusterAuthDataSource {
    connection: Connection,
}

impl KubeconfigDataSource {
    /// Reads through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        KubeconfigDataSource { connection }
    }
}

impl ClusterAuthDataSource {
    /// Reads through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        ClusterAuthDataSource { connection }
    }
}

/// A data source schema: `name` required, the rest computed and sensitive.
fn schema(description: &str, outputs: &[(&str, &str)]) -> Schema {
    let mut attributes: std::collections::HashMap<_, _> = outputs
        .iter()
        .map(|(name, text)| {
            let mut output = attribute(AttributeType::String, AttributeConstraint::Computed, text);
            output.sensitive = true;
            (name.to_string(), output)
        })
        .collect();
    attributes.insert(
        "name".to_string(),
        attribute(
            AttributeType::String,
            AttributeConstraint::Required,
            "The cluster's name.",
        ),
    );
    Schema {
        version: 1,
        block: Block {
            version: 1,
            description: Description::plain(description),
            attributes,
            ..Default::default()
        },
    }
}

#[async_trait]
impl DataSource for KubeconfigDataSource {
    type State<'a> = KubeconfigState<'a>;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(schema(
            "A cluster's kubeconfig (the account's administrator credential).",
            &[("kubeconfig", "The kubeconfig (YAML).")],
        ))
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        config: Self::State<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<Self::State<'a>> {
        let client = self.connection.client(diags)?;
        let name = config.name.as_deref_option()?.to_string();
        match client
            .call(
                Method::GET,
                &format!("/v1/clusters/{name}/kubeconfig"),
                None,
            )
            .await
        {
            Ok(bytes) => Some(KubeconfigState {
                kubeconfig: ValueString::Value(Cow::Owned(
                    String::from_utf8_lossy(&bytes).into_owned(),
                )),
                name: config.name,
            }),
            Err(err) => {
                diags.error_short(format!("{err:#}"), AttributePath::new("name"));
                None
            }
        }
    }
}

#[async_trait]
impl DataSource for ClusterAuthDataSource {
    type State<'a> = ClusterAuthState<'a>;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        Some(schema(
            "A short-lived bearer token for a cluster's Kubernetes API.",
            &[
                ("token", "The bearer token."),
                ("expiration", "When it expires (RFC 3339)."),
            ],
        ))
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        config: Self::State<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<Self::State<'a>> {
        let client = self.connection.client(diags)?;
        let name = config.name.as_deref_option()?.to_string();
        match client
            .call_json(Method::POST, &format!("/v1/clusters/{name}/token"), None)
            .await
        {
            Ok(answer) => Some(ClusterAuthState {
                token: json_text(&answer, "/token"),
                expiration: json_text(&answer, "/expirationTimestamp"),
                name: config.name,
            }),
            Err(err) => {
                diags.error_short(format!("{err:#}"), AttributePath::new("name"));
                None
            }
        }
    }
}
