//! The node bootstrap contract: the `NodeConfig` document a node boots with (EC2 user data
//! written by the cloud controller). It gives the node its cluster's server URL, CA bundle and
//! a bootstrap token; with them the node requests its own credential (`system:node:<name>`)
//! through a CertificateSigningRequest and registers itself. Its name and IP come from the
//! instance metadata, not from here, and the cloud controller sets the providerID.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Taint;
use serde::{Deserialize, Serialize};

/// The document's `apiVersion`.
pub const API_VERSION: &str = "node.flotilla.dev/v1alpha1";
/// The document's `kind`.
pub const KIND: &str = "NodeConfig";

/// Why a node bootstrap document is unusable.
#[derive(Debug, thiserror::Error)]
pub enum NodeConfigError {
    /// Neither YAML nor JSON of the expected shape.
    #[error("the node config is not a {KIND} document: {0}")]
    Parse(#[from] serde_yaml::Error),
    /// Another apiVersion or kind.
    #[error("the node config is {api_version}/{kind}, expected {API_VERSION}/{KIND}")]
    WrongKind {
        /// The document's apiVersion.
        api_version: String,
        /// The document's kind.
        kind: String,
    },
    /// A required field is empty.
    #[error("the node config has no {0}")]
    Missing(&'static str),
    /// `spec.cluster.certificateAuthority` is not base64 of a PEM bundle.
    #[error("spec.cluster.certificateAuthority is not base64 of a PEM CA bundle")]
    CertificateAuthority,
}

/// `node.flotilla.dev/v1alpha1` `NodeConfig` (YAML or JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// `node.flotilla.dev/v1alpha1`.
    pub api_version: String,
    /// `NodeConfig`.
    pub kind: String,
    /// What the node needs to join.
    pub spec: NodeConfigSpec,
}

/// The cluster to join and how the node's kubelet registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfigSpec {
    /// The cluster.
    pub cluster: ClusterConfig,
    /// The kubelet.
    pub kubelet: KubeletConfig,
}

/// Where the cluster's API is and how to trust it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    /// The cluster's name.
    pub name: String,
    /// The cluster's API URL (`https://host:port/clusters/{id}`).
    pub api_server_endpoint: String,
    /// Base64 of the CA bundle (PEM) that signed the API server's certificate.
    pub certificate_authority: String,
}

/// The node's first credential and what it registers with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletConfig {
    /// A bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`, used only to request the node credential.
    pub bootstrap_token: String,
    /// Labels the Node registers with (kubelet `--node-labels`).
    #[serde(default)]
    pub node_labels: BTreeMap<String, String>,
    /// Taints the Node registers with (kubelet `--register-with-taints`).
    #[serde(default)]
    pub register_with_taints: Vec<Taint>,
    /// The cluster DNS addresses pods resolve with (kubelet `--cluster-dns`); the node's
    /// proxy answers the first. Empty: pods get the node's own resolvers.
    #[serde(default, rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (kubelet `--cluster-domain`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_domain: String,
}

/// The cluster DNS address every cluster has (`kube-system/kube-dns`, the tenth address of
/// the default Service range).
pub const DEFAULT_CLUSTER_DNS: &str = "10.96.0.10";
/// The cluster DNS domain.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

impl NodeConfig {
    /// Parses and checks a document.
    pub fn parse(text: &str) -> Result<Self, NodeConfigError> {
        let config: NodeConfig = serde_yaml::from_str(text)?;
        if config.api_version != API_VERSION || config.kind != KIND {
            return Err(NodeConfigError::WrongKind {
                api_version: config.api_version,
                kind: config.kind,
            });
        }
        let cluster = &config.spec.cluster;
        if cluster.api_server_endpoint.is_empty() {
            return Err(NodeConfigError::Missing("spec.cluster.apiServerEndpoint"));
        }
        if config.spec.kubelet.bootstrap_token.is_empty() {
            return Err(NodeConfigError::Missing("spec.kubelet.bootstrapToken"));
        }
        config.ca_pem()?;
        Ok(config)
    }

    /// The CA bundle, as PEM.
    pub fn ca_pem(&self) -> Result<String, NodeConfigError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(self.spec.cluster.certificate_authority.trim())
            .map_err(|_| NodeConfigError::CertificateAuthority)?;
        let pem = String::from_utf8(bytes).map_err(|_| NodeConfigError::CertificateAuthority)?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(NodeConfigError::CertificateAuthority);
        }
        Ok(pem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca() -> String {
        base64::engine::general_purpose::STANDARD
            .encode("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    }

    #[test]
    fn yaml_and_json_documents_parse() {
        let yaml = format!(
            r#"
apiVersion: node.flotilla.dev/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: prod
    apiServerEndpoint: https://127.0.0.1:6443/clusters/prod-abc123
    certificateAuthority: {}
  kubelet:
    bootstrapToken: abcdef.0123456789abcdef
    nodeLabels: {{team: infra}}
    registerWithTaints: [{{key: node.cloudprovider.kubernetes.io/uninitialized, value: "true", effect: NoSchedule}}]
"#,
            ca()
        );
        let config = NodeConfig::parse(&yaml).expect("yaml");
        assert_eq!(config.spec.kubelet.node_labels["team"], "infra");
        let taint = &config.spec.kubelet.register_with_taints[0];
        assert_eq!(
            (taint.key.as_str(), taint.effect.as_str()),
            (
                "node.cloudprovider.kubernetes.io/uninitialized",
                "NoSchedule"
            )
        );
        assert!(
            config
                .ca_pem()
                .expect("ca")
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        let json = serde_json::to_string(&config).expect("json");
        assert_eq!(NodeConfig::parse(&json).expect("json"), config);
    }

    #[test]
    fn bad_documents_are_refused() {
        let doc = |kind: &str, token: &str, ca: &str| {
            format!(
                r#"{{"apiVersion": "node.flotilla.dev/v1alpha1", "kind": "{kind}", "spec": {{
                "cluster": {{"name": "c", "apiServerEndpoint": "https://x", "certificateAuthority": "{ca}"}},
                "kubelet": {{"bootstrapToken": "{token}"}}}}}}"#
            )
        };
        assert!(NodeConfig::parse(&doc("NodeConfig", "a.b", &ca())).is_ok());
        assert!(matches!(
            NodeConfig::parse(&doc("Node", "a.b", &ca())),
            Err(NodeConfigError::WrongKind { .. })
        ));
        assert!(matches!(
            NodeConfig::parse(&doc("NodeConfig", "", &ca())),
            Err(NodeConfigError::Missing(_))
        ));
        assert!(matches!(
            NodeConfig::parse(&doc("NodeConfig", "a.b", "!!")),
            Err(NodeConfigError::CertificateAuthority)
        ));
        assert!(NodeConfig::parse("spec: [").is_err());
    }
}
