//! A node image's first boot: from the instance metadata (the `NodeConfig` user data the cloud
//! controller wrote, the instance's address, id, zone and host name) to the files the kubelet
//! and proxy units start from. Rendering is pure; writing is all or nothing — every file is
//! written beside its place and renamed only once all are written, so a failure leaves no
//! partial configuration behind.

use std::path::{Path, PathBuf};

use flotilla_api_machinery::nodeconfig::{API_VERSION, KIND, NodeConfig};
use k8s_openapi::api::core::v1::Taint;

use crate::imds::{Imds, ImdsError};

/// What the instance metadata says about this instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceIdentity {
    /// `instance-id`.
    pub instance_id: String,
    /// `local-ipv4`: the node's InternalIP.
    pub local_ipv4: std::net::Ipv4Addr,
    /// `placement/availability-zone`.
    pub availability_zone: String,
    /// `local-hostname` (`ip-10-0-1-5.ec2.internal`): the Node's name, as on EKS.
    pub local_hostname: String,
}

/// Why the node cannot join: each says what to fix, on one line.
#[derive(Debug, thiserror::Error)]
pub enum FirstBootError {
    /// The metadata service failed.
    #[error(transparent)]
    Metadata(#[from] ImdsError),
    /// An item every instance has is missing.
    #[error("the instance metadata has no {0}")]
    MissingItem(&'static str),
    /// The instance has no user data.
    #[error(
        "the instance has no user data: launch it with a node.flotilla.dev/v1alpha1 NodeConfig"
    )]
    NoUserData,
    /// The user data is not a NodeConfig.
    #[error("the user data is not a {API_VERSION} {KIND}: {0}")]
    NotANodeConfig(String),
    /// An item has a value that cannot be right.
    #[error("the instance metadata's {item} is {value:?}: {reason}")]
    BadItem {
        /// Which item.
        item: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The configuration could not be written.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Parses user data (YAML or JSON) as a NodeConfig, checking its kind and version.
pub fn parse_user_data(user_data: &str) -> Result<NodeConfig, FirstBootError> {
    if user_data.trim().is_empty() {
        return Err(FirstBootError::NoUserData);
    }
    let config: NodeConfig = serde_yaml::from_str(user_data)
        .map_err(|err| FirstBootError::NotANodeConfig(err.to_string()))?;
    if config.api_version != API_VERSION || config.kind != KIND {
        return Err(FirstBootError::NotANodeConfig(format!(
            "it is {} {}",
            config.api_version, config.kind
        )));
    }
    if config
        .spec
        .cluster
        .api_server_endpoint
        .parse::<http::Uri>()
        .is_err()
        || !config
            .spec
            .cluster
            .api_server_endpoint
            .starts_with("https://")
    {
        return Err(FirstBootError::NotANodeConfig(format!(
            "spec.cluster.apiServerEndpoint {:?} is not an https URL",
            config.spec.cluster.api_server_endpoint
        )));
    }
    Ok(config)
}

/// Reads this instance's NodeConfig and identity from the metadata service.
pub async fn read_instance(imds: &Imds) -> Result<(NodeConfig, InstanceIdentity), FirstBootError> {
    let user_data = imds
        .get("user-data")
        .await?
        .ok_or(FirstBootError::NoUserData)?;
    let config = parse_user_data(&user_data)?;
    let item = |name: &'static str| async move {
        imds.get(&format!("meta-data/{name}"))
            .await?
            .map(|value| value.trim().to_string())
            .filter(|value| !value.is_empty())
            .ok_or(FirstBootError::MissingItem(name))
    };
    let local_ipv4 = item("local-ipv4").await?;
    let identity = InstanceIdentity {
        instance_id: item("instance-id").await?,
        local_ipv4: local_ipv4
            .parse()
            .map_err(|err: std::net::AddrParseError| FirstBootError::BadItem {
                item: "local-ipv4",
                value: local_ipv4.clone(),
                reason: err.to_string(),
            })?,
        availability_zone: item("placement/availability-zone").await?,
        local_hostname: node_name(&item("local-hostname").await?)?,
    };
    Ok((config, identity))
}

/// The Node's name from `local-hostname`: its first name when EC2 gives several, lowercased; it
/// must be a DNS subdomain.
fn node_name(local_hostname: &str) -> Result<String, FirstBootError> {
    let name = local_hostname
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    if !valid {
        return Err(FirstBootError::BadItem {
            item: "local-hostname",
            value: local_hostname.to_string(),
            reason: "not a DNS subdomain, so not a Node name".into(),
        });
    }
    Ok(name)
}

/// Where a node keeps its state (everything under one directory, nothing in `/usr`).
#[derive(Debug, Clone)]
pub struct Layout {
    /// The state directory (`/var/lib/flotilla`).
    pub state_dir: PathBuf,
    /// containerd's CRI socket.
    pub runtime_endpoint: String,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            state_dir: PathBuf::from("/var/lib/flotilla"),
            runtime_endpoint: "unix:///run/containerd/containerd.sock".into(),
        }
    }
}

impl Layout {
    /// The NodeConfig as read (it holds the bootstrap token: mode 0600).
    pub fn node_config(&self) -> PathBuf {
        self.state_dir.join("nodeconfig.yaml")
    }
    /// The node's certificates (`kubelet-client-current.pem` once joined).
    pub fn cert_dir(&self) -> PathBuf {
        self.state_dir.join("pki")
    }
    /// The kubelet's flags, as a systemd environment file (`KUBELET_ARGS=…`).
    pub fn kubelet_env(&self) -> PathBuf {
        self.state_dir.join("kubelet.env")
    }
    /// The proxy's flags (`PROXY_ARGS=…`).
    pub fn proxy_env(&self) -> PathBuf {
        self.state_dir.join("proxy.env")
    }
    /// The proxy's kubeconfig: the node's own credential (group `system:nodes`, bound to
    /// `system:node-proxier` by `flotilla:node-proxier`).
    pub fn proxy_kubeconfig(&self) -> PathBuf {
        self.state_dir.join("proxy.kubeconfig")
    }
    /// The pod network's CNI configuration (the image's containerd reads `cni/`).
    pub fn cni_config(&self) -> PathBuf {
        self.state_dir.join("cni").join("10-flotilla.conflist")
    }
}

/// The node's pod range: a /24 of 10.244.0.0/16 named after the last octet of its address
/// (`10.0.1.5` → `10.244.5.0/24`). The image's pod network routes nothing between nodes by
/// itself, so it needs no allocator: nodes on one /24 never share a range, as a VPC subnet's
/// instances never share an address. Pods reach other nodes and the host masqueraded as
/// their node.
pub fn pod_cidr(node_ip: std::net::Ipv4Addr) -> String {
    format!("10.244.{}.0/24", node_ip.octets()[3])
}

/// The CNI configuration of the image's pod network: a bridge with the node as the pods'
/// gateway, addresses from [`pod_cidr`], masquerade for traffic leaving the range.
pub fn cni_config(node_ip: std::net::Ipv4Addr) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "flotilla",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr(node_ip)}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "loopback"}
        ]
    })
    .to_string()
}

/// One file to write: its path, text and mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedFile {
    /// Where.
    pub path: PathBuf,
    /// What.
    pub text: String,
    /// Unix mode.
    pub mode: u32,
}

/// The kubelet's flags for this instance.
pub fn kubelet_args(
    config: &NodeConfig,
    identity: &InstanceIdentity,
    layout: &Layout,
) -> Vec<String> {
    let mut args = vec![
        format!("--node-config={}", layout.node_config().display()),
        format!("--cert-dir={}", layout.cert_dir().display()),
        format!("--container-runtime-endpoint={}", layout.runtime_endpoint),
        format!("--node-name={}", identity.local_hostname),
        format!("--node-ip={}", identity.local_ipv4),
        format!("--root-dir={}", layout.state_dir.join("kubelet").display()),
    ];
    args.extend(dns_args(config));
    // Zone labels and the providerID are the cloud controller's to set, as upstream's.
    let labels: Vec<String> = config
        .spec
        .kubelet
        .node_labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect();
    if !labels.is_empty() {
        args.push(format!("--node-labels={}", labels.join(",")));
    }
    let taints: Vec<String> = config
        .spec
        .kubelet
        .register_with_taints
        .iter()
        .map(taint_flag)
        .collect();
    if !taints.is_empty() {
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    args
}

fn taint_flag(taint: &Taint) -> String {
    match &taint.value {
        Some(value) if !value.is_empty() => format!("{}={}:{}", taint.key, value, taint.effect),
        _ => format!("{}:{}", taint.key, taint.effect),
    }
}

/// The proxy's flags for this instance.
pub fn proxy_args(
    config: &NodeConfig,
    identity: &InstanceIdentity,
    layout: &Layout,
) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", layout.proxy_kubeconfig().display()),
        format!("--hostname-override={}", identity.local_hostname),
        format!("--node-ip={}", identity.local_ipv4),
    ];
    // The proxy answers the cluster DNS address on the node.
    args.extend(dns_args(config));
    args
}

/// `--cluster-dns` and `--cluster-domain`, for the kubelet and the proxy alike: the
/// document's, or every cluster's defaults (the cloud controller leaves them out, since node
/// images from before these fields refuse a document that has them).
fn dns_args(config: &NodeConfig) -> [String; 2] {
    use flotilla_api_machinery::nodeconfig::{DEFAULT_CLUSTER_DNS, DEFAULT_CLUSTER_DOMAIN};
    let kubelet = &config.spec.kubelet;
    let dns = kubelet
        .cluster_dns
        .first()
        .map_or(DEFAULT_CLUSTER_DNS, String::as_str);
    let domain = match kubelet.cluster_domain.as_str() {
        "" => DEFAULT_CLUSTER_DOMAIN,
        domain => domain,
    };
    [
        format!("--cluster-dns={dns}"),
        format!("--cluster-domain={domain}"),
    ]
}

/// A systemd environment file setting `variable` to `args`, which the unit expands unquoted
/// (`$VARIABLE`: split at whitespace), so no argument may hold whitespace or quotes.
fn environment_file(variable: &str, args: &[String]) -> Result<String, FirstBootError> {
    if let Some(bad) = args.iter().find(|arg| {
        arg.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\')
    }) {
        return Err(FirstBootError::NotANodeConfig(format!(
            "{bad:?} cannot be passed on a command line"
        )));
    }
    Ok(format!("{variable}={}\n", args.join(" ")))
}

/// The proxy's kubeconfig: the cluster from the NodeConfig, the node's certificate pair.
/// Written by a YAML serializer, not a template: the cluster's name, endpoint and CA come from
/// user data, and text pasted into YAML (a `: `, a `#`, a newline) would read back as another
/// value or not at all (found by the `kubeconfig` fuzz target).
fn proxy_kubeconfig(config: &NodeConfig, layout: &Layout) -> Result<String, FirstBootError> {
    let pair = layout.cert_dir().join("kubelet-client-current.pem");
    let pair = pair.display().to_string();
    let cluster = &config.spec.cluster;
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster.name, "cluster": {
            "server": cluster.api_server_endpoint,
            "certificate-authority-data": cluster.certificate_authority,
        }}],
        "users": [{"name": "node", "user": {"client-certificate": pair, "client-key": pair}}],
        "contexts": [{"name": "node", "context": {"cluster": cluster.name, "user": "node"}}],
        "current-context": "node",
    });
    serde_yaml::to_string(&kubeconfig)
        .map_err(|err| FirstBootError::NotANodeConfig(err.to_string()))
}

/// Every file the kubelet and proxy units start from.
pub fn render(
    config: &NodeConfig,
    identity: &InstanceIdentity,
    layout: &Layout,
) -> Result<Vec<RenderedFile>, FirstBootError> {
    let node_config = serde_yaml::to_string(config)
        .map_err(|err| FirstBootError::NotANodeConfig(err.to_string()))?;
    Ok(vec![
        RenderedFile {
            path: layout.node_config(),
            text: node_config,
            mode: 0o600,
        },
        RenderedFile {
            path: layout.kubelet_env(),
            text: environment_file("KUBELET_ARGS", &kubelet_args(config, identity, layout))?,
            mode: 0o644,
        },
        RenderedFile {
            path: layout.proxy_env(),
            text: environment_file("PROXY_ARGS", &proxy_args(config, identity, layout))?,
            mode: 0o644,
        },
        RenderedFile {
            path: layout.proxy_kubeconfig(),
            text: proxy_kubeconfig(config, layout)?,
            mode: 0o600,
        },
        RenderedFile {
            path: layout.cni_config(),
            text: cni_config(identity.local_ipv4),
            mode: 0o644,
        },
    ])
}

/// Writes every file or none: each goes to `NAME.new` first, and only once all are written
/// are they renamed into place (a failure removes the `.new` files).
pub fn write_all(files: &[RenderedFile]) -> Result<(), FirstBootError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let staged: Vec<(PathBuf, &Path)> = files
        .iter()
        .map(|file| (staging_path(&file.path), file.path.as_path()))
        .collect();
    let write = |file: &RenderedFile, staging: &Path| -> std::io::Result<()> {
        if let Some(parent) = file.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(file.mode)
            .open(staging)?;
        std::io::Write::write_all(&mut out, file.text.as_bytes())?;
        out.sync_all()?;
        std::fs::set_permissions(staging, std::fs::Permissions::from_mode(file.mode))
    };
    for (file, (staging, _)) in files.iter().zip(&staged) {
        if let Err(source) = write(file, staging) {
            for (staging, _) in &staged {
                let _ = std::fs::remove_file(staging);
            }
            return Err(FirstBootError::Write {
                path: file.path.clone(),
                source,
            });
        }
    }
    for (staging, path) in &staged {
        std::fs::rename(staging, path).map_err(|source| FirstBootError::Write {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}

fn staging_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::imds::fake::{Behaviour, FakeImds};

    const USER_DATA: &str = r#"apiVersion: node.flotilla.dev/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: prod
    apiServerEndpoint: https://api.example:6443/clusters/prod-x1
    certificateAuthority: Q0E=
  kubelet:
    bootstrapToken: abcdef.0123456789abcdef
    nodeLabels: {pool: workers, tier: web}
    registerWithTaints: [{key: dedicated, value: gpu, effect: NoSchedule}, {key: spot, effect: NoExecute}]
"#;

    fn metadata(user_data: Option<&str>) -> HashMap<String, String> {
        let mut items: HashMap<String, String> = [
            ("meta-data/instance-id", "i-0abc"),
            ("meta-data/local-ipv4", "10.0.1.5"),
            ("meta-data/placement/availability-zone", "us-east-1a"),
            (
                "meta-data/local-hostname",
                "IP-10-0-1-5.ec2.internal ip-10-0-1-5",
            ),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        if let Some(user_data) = user_data {
            items.insert("user-data".into(), user_data.into());
        }
        items
    }

    async fn read(
        items: HashMap<String, String>,
    ) -> Result<(NodeConfig, InstanceIdentity), FirstBootError> {
        let fake = FakeImds::start(Behaviour {
            items,
            ..Default::default()
        })
        .await;
        read_instance(&Imds::new(&fake.endpoint).expect("client")).await
    }

    #[tokio::test]
    async fn the_instance_is_read_from_its_metadata() {
        let (config, identity) = read(metadata(Some(USER_DATA))).await.expect("read");
        assert_eq!(config.spec.cluster.name, "prod");
        assert_eq!(
            identity,
            InstanceIdentity {
                instance_id: "i-0abc".into(),
                local_ipv4: "10.0.1.5".parse().expect("ip"),
                availability_zone: "us-east-1a".into(),
                local_hostname: "ip-10-0-1-5.ec2.internal".into(),
            }
        );
    }

    #[tokio::test]
    async fn missing_or_malformed_user_data_is_refused_in_one_line() {
        let cases = [
            (None, "the instance has no user data"),
            (Some("  \n"), "the instance has no user data"),
            (
                Some("#!/bin/bash\necho hi"),
                "is not a node.flotilla.dev/v1alpha1 NodeConfig",
            ),
            (
                Some(
                    "apiVersion: v1\nkind: ConfigMap\nspec: {cluster: {name: a, apiServerEndpoint: 'https://a', certificateAuthority: ''}, kubelet: {bootstrapToken: t}}",
                ),
                "it is v1 ConfigMap",
            ),
            (
                Some(
                    &USER_DATA.replace("https://api.example:6443/clusters/prod-x1", "http://plain"),
                ),
                "is not an https URL",
            ),
        ];
        for (user_data, expected) in cases {
            let err = read(metadata(user_data))
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(expected), "{user_data:?}: {err}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        let mut bad_ip = metadata(Some(USER_DATA));
        bad_ip.insert("meta-data/local-ipv4".into(), "ten".into());
        let err = read(bad_ip)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("local-ipv4 is \"ten\""), "{err}");
        let mut no_id = metadata(Some(USER_DATA));
        no_id.remove("meta-data/instance-id");
        let err = read(no_id)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(err, "the instance metadata has no instance-id");
    }

    #[tokio::test]
    async fn the_kubelet_and_proxy_get_the_instance_and_the_node_config() {
        let (config, identity) = read(metadata(Some(USER_DATA))).await.expect("read");
        let layout = Layout::default();
        let files = render(&config, &identity, &layout).expect("render");
        let text = |name: &str| {
            files
                .iter()
                .find(|f| f.path.ends_with(name))
                .map(|f| (f.text.clone(), f.mode))
                .unwrap_or_default()
        };
        let (kubelet, mode) = text("kubelet.env");
        assert_eq!(mode, 0o644);
        assert_eq!(
            kubelet,
            "KUBELET_ARGS=--node-config=/var/lib/flotilla/nodeconfig.yaml \
             --cert-dir=/var/lib/flotilla/pki \
             --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
             --node-name=ip-10-0-1-5.ec2.internal --node-ip=10.0.1.5 \
             --root-dir=/var/lib/flotilla/kubelet --cluster-dns=10.96.0.10 \
             --cluster-domain=cluster.local --node-labels=pool=workers,tier=web \
             --register-with-taints=dedicated=gpu:NoSchedule,spot:NoExecute\n"
        );
        let (proxy, _) = text("proxy.env");
        assert!(
            proxy.contains(" --hostname-override=ip-10-0-1-5.ec2.internal ")
                && proxy.ends_with(" --cluster-dns=10.96.0.10 --cluster-domain=cluster.local\n"),
            "{proxy}"
        );
        let spaced = NodeConfig {
            spec: flotilla_api_machinery::nodeconfig::NodeConfigSpec {
                kubelet: flotilla_api_machinery::nodeconfig::KubeletConfig {
                    node_labels: [("a".to_string(), "b c".to_string())].into(),
                    ..config.spec.kubelet.clone()
                },
                ..config.spec.clone()
            },
            ..config.clone()
        };
        assert!(render(&spaced, &identity, &layout).is_err());
        let (kubeconfig, mode) = text("proxy.kubeconfig");
        assert_eq!(mode, 0o600);
        assert!(kubeconfig.contains("server: https://api.example:6443/clusters/prod-x1"));
        assert!(
            kubeconfig.contains("client-key: /var/lib/flotilla/pki/kubelet-client-current.pem")
        );
        let (cni, _) = text("10-flotilla.conflist");
        let cni: serde_json::Value = serde_json::from_str(&cni).expect("CNI JSON");
        assert_eq!(
            cni["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.5.0/24"
        );
        let (node_config, mode) = text("nodeconfig.yaml");
        assert_eq!(mode, 0o600, "the bootstrap token is a secret");
        assert_eq!(parse_user_data(&node_config).ok(), Some(config));
    }

    /// Found by the `kubeconfig` fuzz target: the proxy's kubeconfig was a text template, so a
    /// cluster name or endpoint with a NUL, a `: `, a ` #` or a newline (user data) made YAML
    /// that did not parse, or parsed to other values.
    #[tokio::test]
    async fn the_proxy_kubeconfig_reads_back_whatever_the_cluster_is_called() {
        let (mut config, identity) = read(metadata(Some(USER_DATA))).await.expect("read");
        config.spec.cluster.name = "prod\0https: x #y".into();
        config.spec.cluster.api_server_endpoint = "https://api.example:6443 #c\n- z".into();
        let layout = Layout::default();
        let files = render(&config, &identity, &layout).expect("render");
        let text = &files
            .iter()
            .find(|f| f.path == layout.proxy_kubeconfig())
            .expect("the proxy's kubeconfig")
            .text;
        let parsed = kube::config::Kubeconfig::from_yaml(text).expect("parses");
        let cluster = &parsed.clusters[0];
        assert_eq!(cluster.name, config.spec.cluster.name, "{text}");
        let server = cluster.cluster.as_ref().and_then(|c| c.server.as_deref());
        assert_eq!(
            server,
            Some(config.spec.cluster.api_server_endpoint.as_str())
        );
        let context = parsed.contexts[0].context.as_ref().expect("a context");
        assert_eq!(context.cluster, config.spec.cluster.name);
        assert_eq!(parsed.current_context.as_deref(), Some("node"));
        let user = parsed.auth_infos[0].auth_info.as_ref().expect("a user");
        assert_eq!(
            user.client_key.as_deref(),
            Some("/var/lib/flotilla/pki/kubelet-client-current.pem")
        );
    }

    #[test]
    fn files_are_written_all_or_none() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let file = |name: &str, mode| RenderedFile {
            path: dir.path().join(name),
            text: format!("{name}\n"),
            mode,
        };
        write_all(&[file("a", 0o600), file("sub/b", 0o644)]).expect("written");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("sub/b"))
                .ok()
                .as_deref(),
            Some("sub/b\n")
        );
        let mode = std::fs::metadata(dir.path().join("a")).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o600));
        // The second file cannot be written (its directory is a file): the first is not
        // renamed into place and no staging file stays.
        std::fs::write(dir.path().join("blocked"), "").expect("file");
        let err = write_all(&[file("c", 0o644), file("blocked/d", 0o644)]);
        assert!(err.is_err());
        assert!(!dir.path().join("c").exists());
        assert!(!dir.path().join("c.new").exists());
    }

    #[test]
    fn node_names_come_from_the_first_host_name() {
        assert_eq!(
            node_name("IP-10-0-1-5.EC2.internal").ok().as_deref(),
            Some("ip-10-0-1-5.ec2.internal")
        );
        assert!(node_name("").is_err());
        assert!(node_name("bad_name.internal").is_err());
        assert!(node_name("-x").is_err());
    }
}
