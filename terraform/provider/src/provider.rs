//! The provider block: where the management API is and who calls it — `endpoint`, `api_key`,
//! `ca_certificate` or `ca_file`, or `config_file` (the CLI's client configuration, as
//! `flotilla up` writes it) — each falling back to the environment the CLI reads
//! (`FLOTILLA_ENDPOINT`, `FLOTILLA_API_KEY`, `FLOTILLA_CA_FILE`, `FLOTILLA_CONFIG`), so an
//! empty provider block works when the environment holds them, as with hashicorp/aws.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use flotilla_management_client::{ClientConfig, ManagementClient, read_config};
use serde::{Deserialize, Serialize};
use tf_provider::schema::{
    Attribute, AttributeConstraint, AttributeType, Block, Description, Schema,
};
use tf_provider::value::{ValueEmpty, ValueString};
use tf_provider::{AttributePath, Diagnostics, DynamicDataSource, DynamicResource, Provider};

use crate::account_resource::AccountResource;
use crate::auth_data_sources::{ClusterAuthDataSource, KubeconfigDataSource};
use crate::cluster_data_source::ClusterDataSource;
use crate::cluster_resource::ClusterResource;
use crate::node_pool_resource::NodePoolResource;

/// The configured client, shared by every resource and data source once Terraform has
/// configured the provider.
#[derive(Clone, Default)]
pub struct Connection(Arc<RwLock<Option<Arc<ManagementClient>>>>);

impl Connection {
    /// The client, or an error diagnostic when the provider is not configured.
    pub fn client(&self, diags: &mut Diagnostics) -> Option<Arc<ManagementClient>> {
        let client = self.0.read().ok().and_then(|guard| guard.clone());
        if client.is_none() {
            diags.root_error_short("the flotilla provider is not configured");
        }
        client
    }
}

/// The provider block's attributes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ProviderConfig<'a> {
    #[serde(borrow = "'a")]
    endpoint: ValueString<'a>,
    api_key: ValueString<'a>,
    ca_certificate: ValueString<'a>,
    ca_file: ValueString<'a>,
    config_file: ValueString<'a>,
}

/// `registry.terraform.io/flotilla/flotilla`.
#[derive(Default)]
pub struct FlotillaProvider {
    connection: Connection,
}

fn optional_string(description: &str, sensitive: bool) -> Attribute {
    Attribute {
        attr_type: AttributeType::String,
        description: Description::plain(description),
        constraint: AttributeConstraint::Optional,
        sensitive,
        ..Default::default()
    }
}

/// A setting: the provider block's value, else the environment variable's.
fn setting(value: &ValueString<'_>, variable: &str) -> Option<String> {
    value
        .as_deref_option()
        .map(str::to_string)
        .or_else(|| std::env::var(variable).ok())
        .filter(|value| !value.is_empty())
}

#[async_trait]
impl Provider for FlotillaProvider {
    type Config<'a> = ProviderConfig<'a>;
    type MetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        let attributes = [
            ("endpoint", optional_string("The service's URL, e.g. https://127.0.0.1:6443 (FLOTILLA_ENDPOINT).", false)),
            ("api_key", optional_string("The account's API key (FLOTILLA_API_KEY).", true)),
            ("ca_certificate", optional_string("The PEM of the CA that signed the service's certificate.", false)),
            ("ca_file", optional_string("A PEM file with that CA (FLOTILLA_CA_FILE).", false)),
            ("config_file", optional_string("The CLI's client configuration (JSON: endpoint, apiKey, caPem), as `flotilla up` writes it (FLOTILLA_CONFIG); what the other settings leave unset comes from it.", false)),
        ]
        .into_iter()
        .map(|(name, attribute)| (name.to_string(), attribute))
        .collect();
        Some(Schema {
            version: 1,
            block: Block {
                version: 1,
                description: Description::plain("Flotilla: hosted Kubernetes control planes"),
                attributes,
                ..Default::default()
            },
        })
    }

    async fn configure<'a>(
        &self,
        diags: &mut Diagnostics,
        _terraform_version: String,
        config: Self::Config<'a>,
    ) -> Option<()> {
        let file = match setting(&config.config_file, "FLOTILLA_CONFIG") {
            Some(path) => match read_config(&PathBuf::from(&path)) {
                Ok(file) => file,
                Err(err) => {
                    diags.error_short(format!("{err:#}"), AttributePath::new("config_file"));
                    return None;
                }
            },
            None => ClientConfig::default(),
        };
        let Some(endpoint) = setting(&config.endpoint, "FLOTILLA_ENDPOINT").or(file.endpoint)
        else {
            diags.error_short(
                "no endpoint: set endpoint, FLOTILLA_ENDPOINT or a config_file",
                AttributePath::new("endpoint"),
            );
            return None;
        };
        let Some(api_key) = setting(&config.api_key, "FLOTILLA_API_KEY").or(file.api_key) else {
            diags.error_short(
                "no API key: set api_key, FLOTILLA_API_KEY or a config_file",
                AttributePath::new("api_key"),
            );
            return None;
        };
        let ca_pem = match (
            config.ca_certificate.as_deref_option(),
            setting(&config.ca_file, "FLOTILLA_CA_FILE"),
        ) {
            (Some(pem), _) => Some(pem.to_string()),
            (None, Some(path)) => match std::fs::read_to_string(&path) {
                Ok(pem) => Some(pem),
                Err(err) => {
                    diags.error_short(
                        format!("reading {path}: {err}"),
                        AttributePath::new("ca_file"),
                    );
                    return None;
                }
            },
            (None, None) => file.ca_pem,
        };
        match ManagementClient::new(&endpoint, &api_key, ca_pem.as_deref()) {
            Ok(client) => {
                if let Ok(mut slot) = self.connection.0.write() {
                    *slot = Some(Arc::new(client));
                }
                Some(())
            }
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                None
            }
        }
    }

    fn get_resources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicResource>>> {
        let account: Box<dyn DynamicResource> =
            Box::new(AccountResource::new(self.connection.clone()));
        let cluster: Box<dyn DynamicResource> =
            Box::new(ClusterResource::new(self.connection.clone()));
        let node_pool: Box<dyn DynamicResource> =
            Box::new(NodePoolResource::new(self.connection.clone()));
        // Named without the provider's prefix: the server adds `flotilla_`.
        Some(HashMap::from([
            ("account".to_string(), account),
            ("cluster".to_string(), cluster),
            ("node_pool".to_string(), node_pool),
        ]))
    }

    fn get_data_sources(
        &self,
        _diags: &mut Diagnostics,
    ) -> Option<HashMap<String, Box<dyn DynamicDataSource>>> {
        let cluster: Box<dyn DynamicDataSource> =
            Box::new(ClusterDataSource::new(self.connection.clone()));
        let kubeconfig: Box<dyn DynamicDataSource> =
            Box::new(KubeconfigDataSource::new(self.connection.clone()));
        let auth: Box<dyn DynamicDataSource> =
            Box::new(ClusterAuthDataSource::new(self.connection.clone()));
        // Named without the provider's prefix: the server adds `flotilla_`.
        Some(HashMap::from([
            ("cluster".to_string(), cluster),
            ("kubeconfig".to_string(), kubeconfig),
            ("cluster_auth".to_string(), auth),
        ]))
    }
}
