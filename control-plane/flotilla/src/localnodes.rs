//! `flotilla up --nodes N`: real worker nodes on this machine. A fabric network joins the host
//! and N nodes; each node is a network namespace with its own containerd, `flotilla kubelet`
//! (joined with a bootstrap token, so it acts as `system:node:<name>`) and `flotilla proxy`,
//! with routes between the nodes' pod CIDRs. The node-image scripts that do the plumbing are
//! embedded in the binary and written under `DIR/nodes/scripts`. Static pod manifests put in
//! `DIR/nodes/node-i/manifests` run on node i.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail, ensure};
use base64::Engine;
use flotilla_api_machinery::nodeconfig::{
    API_VERSION, ClusterConfig, KIND, KubeletConfig, NodeConfig, NodeConfigSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

/// The scripts, as `node-image/image` has them (they call each other by directory).
const SCRIPTS: [(&str, &str); 5] = [
    (
        "build-images",
        include_str!("../../../node-image/image/build-images"),
    ),
    (
        "start-fabric",
        include_str!("../../../node-image/image/start-fabric"),
    ),
    (
        "stop-fabric",
        include_str!("../../../node-image/image/stop-fabric"),
    ),
    (
        "start-containerd",
        include_str!("../../../node-image/image/start-containerd"),
    ),
    (
        "stop-containerd",
        include_str!("../../../node-image/image/stop-containerd"),
    ),
];

/// Every node's pods come from this range, a /24 each (`--cluster-cidr` of the proxies).
pub(crate) const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// The id of the local nodes' bootstrap token (its secret half is random and kept in the
/// token Secret).
const BOOTSTRAP_TOKEN_ID: &str = "flnode";

/// One node's files and address.
struct LocalNode {
    name: String,
    dir: PathBuf,
    ip: String,
    pod_cidr: String,
}

/// The local nodes of `flotilla up`, from their fabric to their daemons.
pub(crate) struct LocalNodes {
    root: PathBuf,
    fabric: PathBuf,
    /// The host's address on the fabric: the API server listens here too.
    pub(crate) host_ip: String,
    nodes: Vec<LocalNode>,
    daemons: Vec<Child>,
}

fn script(root: &Path, name: &str) -> PathBuf {
    root.join("scripts").join(name)
}

fn run(root: &Path, name: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(script(root, name))
        .args(args)
        .output()
        .with_context(|| format!("running {name}"))?;
    ensure!(
        out.status.success(),
        "{name} {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What installs every tool a local node needs (Debian's packages).
pub(crate) const INSTALL_COMMAND: &str = "apt-get install -y containerd runc \
     containernetworking-plugins busybox-static nftables iproute2 util-linux python3";

/// What this machine lacks to run local nodes: tools, CNI plugins, root. Empty when it can.
pub(crate) fn missing_requirements() -> Vec<String> {
    let mut missing = Vec::new();
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "busybox",
        "nsenter",
        "ip",
        "nft",
        "python3",
    ] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).exists()));
        if !found {
            missing.push(tool.to_string());
        }
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            missing.push(format!("/usr/lib/cni/{plugin}"));
        }
    }
    if !rustix::process::geteuid().is_root() {
        missing.push("root (containers and network namespaces need it)".to_string());
    }
    missing
}

/// Fails with what is missing unless this machine can run real nodes.
fn require_runtime() -> anyhow::Result<()> {
    let missing = missing_requirements();
    if !missing.is_empty() {
        bail!(
            "--nodes needs {} (as root: {INSTALL_COMMAND})",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Kills a daemon a previous run recorded in `pid_file`, if it still runs as `flotilla
/// COMPONENT`.
fn kill_stale(pid_file: &Path, component: &str) {
    let Ok(pid) = std::fs::read_to_string(pid_file) else {
        return;
    };
    let pid = pid.trim();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    if cmdline.split(|byte| *byte == 0).nth(1) == Some(component.as_bytes()) {
        let _ = Command::new("kill").args(["-9", pid]).status();
    }
    let _ = std::fs::remove_file(pid_file);
}

impl LocalNodes {
    /// Checks the machine, writes the scripts and starts the fabric (before the API server
    /// binds, which then listens on the fabric's host address too). Whatever a previous run
    /// left (killed without cleaning up) is removed first.
    pub(crate) fn prepare(data_dir: &Path, count: u8) -> anyhow::Result<Self> {
        require_runtime()?;
        let root = std::path::absolute(data_dir.join("nodes"))?;
        std::fs::create_dir_all(root.join("scripts"))?;
        for (name, text) in SCRIPTS {
            let path = script(&root, name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
        let nodes: Vec<LocalNode> = (1..=count)
            .map(|index| LocalNode {
                name: format!("node-{index}"),
                dir: root.join(format!("node-{index}")),
                ip: String::new(),
                pod_cidr: format!("10.244.{index}.0/24"),
            })
            .collect();
        for node in &nodes {
            kill_stale(&node.dir.join("kubelet.pid"), "kubelet");
            kill_stale(&node.dir.join("proxy.pid"), "proxy");
            run(&root, "stop-containerd", &[&node.dir.to_string_lossy()])?;
        }
        let fabric = root.join("fabric");
        run(&root, "stop-fabric", &[&fabric.to_string_lossy()])?;
        let host_ip = run(&root, "start-fabric", &[&fabric.to_string_lossy()])?
            .trim()
            .to_string();
        let prefix = host_ip.rsplit_once('.').map(|(p, _)| p.to_string());
        let prefix = prefix.context("the fabric's host address is not IPv4")?;
        let nodes = nodes
            .into_iter()
            .enumerate()
            .map(|(i, node)| LocalNode {
                ip: format!("{prefix}.{}", 11 + i),
                ..node
            })
            .collect();
        Ok(LocalNodes {
            root,
            fabric,
            host_ip,
            nodes,
            daemons: Vec::new(),
        })
    }

    /// Starts every node against the cluster at `server` (`https://HOST_IP:PORT/clusters/ID`,
    /// whose serving CA is `ca_pem`), creating the nodes' bootstrap token through `client`;
    /// the proxies use `proxy_kubeconfig` (`system:kube-proxy`, reaching `server`).
    pub(crate) async fn start(
        &mut self,
        client: kube::Client,
        server: &str,
        ca_pem: &str,
        proxy_kubeconfig: &str,
    ) -> anyhow::Result<()> {
        let token = bootstrap_token(client).await?;
        let proxy_kubeconfig_path = self.root.join("proxy.kubeconfig");
        crate::private_files::write_private(&proxy_kubeconfig_path, proxy_kubeconfig)?;
        let fabric = self.fabric.to_string_lossy().into_owned();
        for node in &self.nodes {
            let dir = node.dir.to_string_lossy().into_owned();
            run(
                &self.root,
                "start-containerd",
                &[&dir, &node.pod_cidr, &fabric, &node.ip],
            )?;
        }
        // Every node reaches every other node's pods through that node.
        for node in &self.nodes {
            for peer in self.nodes.iter().filter(|peer| peer.name != node.name) {
                let out = node_command(node, "ip")?
                    .args(["route", "replace", &peer.pod_cidr, "via", &peer.ip])
                    .output()?;
                ensure!(
                    out.status.success(),
                    "routing {} via {} on {}: {}",
                    peer.pod_cidr,
                    peer.ip,
                    node.name,
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        for node in &self.nodes {
            let config = NodeConfig {
                api_version: API_VERSION.into(),
                kind: KIND.into(),
                spec: NodeConfigSpec {
                    cluster: ClusterConfig {
                        name: "demo".into(),
                        api_server_endpoint: server.into(),
                        certificate_authority: base64::engine::general_purpose::STANDARD
                            .encode(ca_pem),
                    },
                    kubelet: KubeletConfig {
                        bootstrap_token: token.clone(),
                        node_labels: Default::default(),
                        register_with_taints: Vec::new(),
                        cluster_dns: vec![
                            flotilla_api_machinery::nodeconfig::DEFAULT_CLUSTER_DNS.into(),
                        ],
                        cluster_domain: flotilla_api_machinery::nodeconfig::DEFAULT_CLUSTER_DOMAIN
                            .into(),
                    },
                },
            };
            std::fs::create_dir_all(node.dir.join("manifests"))?;
            let config_path = node.dir.join("nodeconfig.yaml");
            std::fs::write(&config_path, serde_yaml::to_string(&config)?)?;
            let kubelet = spawn(
                node,
                "kubelet",
                &[
                    "--node-config",
                    &config_path.to_string_lossy(),
                    "--cert-dir",
                    &node.dir.join("pki").to_string_lossy(),
                    "--container-runtime-endpoint",
                    &format!("unix://{}", node.dir.join("containerd.sock").display()),
                    "--node-name",
                    &node.name,
                    "--node-ip",
                    &node.ip,
                    "--root-dir",
                    &node.dir.join("kubelet").to_string_lossy(),
                    // Static pods: manifests dropped here run on this node.
                    "--pod-manifest-path",
                    &node.dir.join("manifests").to_string_lossy(),
                    "--file-check-frequency",
                    "5s",
                    // The nodes share this machine's disk: evict on memory only, as kind
                    // does, so a nearly full developer disk does not evict every pod.
                    "--eviction-hard",
                    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%",
                ],
            )?;
            self.daemons.push(kubelet);
            let proxy = spawn(
                node,
                "proxy",
                &[
                    "--kubeconfig",
                    &proxy_kubeconfig_path.to_string_lossy(),
                    "--hostname-override",
                    &node.name,
                    "--node-ip",
                    &node.ip,
                    "--pod-cidr",
                    &node.pod_cidr,
                    "--cluster-cidr",
                    CLUSTER_CIDR,
                    "--healthz-bind-address",
                    &format!("{}:10256", node.ip),
                    // The node answers the cluster DNS itself.
                    "--cluster-dns",
                    flotilla_api_machinery::nodeconfig::DEFAULT_CLUSTER_DNS,
                    "--cluster-domain",
                    flotilla_api_machinery::nodeconfig::DEFAULT_CLUSTER_DOMAIN,
                ],
            )?;
            self.daemons.push(proxy);
            tracing::info!(node = %node.name, ip = %node.ip, pods = %node.pod_cidr, "local node started");
        }
        Ok(())
    }
}

/// Dropping the nodes (the service stopping, or failing after `prepare`) stops the daemons,
/// the nodes' containerds with their containers, and the fabric.
impl Drop for LocalNodes {
    fn drop(&mut self) {
        for daemon in &mut self.daemons {
            let _ = daemon.kill();
            let _ = daemon.wait();
        }
        for node in &self.nodes {
            let _ = run(
                &self.root,
                "stop-containerd",
                &[&node.dir.to_string_lossy()],
            );
        }
        let _ = run(&self.root, "stop-fabric", &[&self.fabric.to_string_lossy()]);
    }
}

/// A command run inside `node`'s network namespace.
fn node_command(node: &LocalNode, program: impl AsRef<std::ffi::OsStr>) -> anyhow::Result<Command> {
    let netns = std::fs::read_to_string(node.dir.join("netns"))
        .with_context(|| format!("{} has no network namespace", node.name))?;
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/var/run/netns/{}", netns.trim()))
        .arg("--")
        .arg(program);
    Ok(command)
}

/// Starts `flotilla COMPONENT` (`kubelet`, `proxy`) in `node`'s namespace, logging to
/// `DIR/COMPONENT.log`, its pid recorded.
fn spawn(node: &LocalNode, component: &str, args: &[&str]) -> anyhow::Result<Child> {
    let log = node.dir.join(format!("{component}.log"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("opening {}", log.display()))?;
    let child = node_command(node, std::env::current_exe()?)?
        .arg(component)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("starting the {component} of {}", node.name))?;
    std::fs::write(
        node.dir.join(format!("{component}.pid")),
        child.id().to_string(),
    )?;
    Ok(child)
}

/// The local nodes' bootstrap token (`id.secret`), created once as a
/// `bootstrap.kubernetes.io/token` Secret in `kube-system` and reused after a restart.
async fn bootstrap_token(client: kube::Client) -> anyhow::Result<String> {
    let secrets: Api<Secret> = Api::namespaced(client, "kube-system");
    let name = format!("bootstrap-token-{BOOTSTRAP_TOKEN_ID}");
    if let Some(secret) = secrets.get_opt(&name).await? {
        let secret_part = secret
            .data
            .as_ref()
            .and_then(|data| data.get("token-secret"))
            .and_then(|value| String::from_utf8(value.0.clone()).ok())
            .with_context(|| format!("kube-system/{name} has no token-secret"))?;
        return Ok(format!("{BOOTSTRAP_TOKEN_ID}.{secret_part}"));
    }
    let secret_part: String = {
        use rand::Rng;
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        let mut rng = rand::rng();
        (0..16)
            .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
            .collect()
    };
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "description": "the local nodes of flotilla up --nodes",
            "token-id": BOOTSTRAP_TOKEN_ID,
            "token-secret": secret_part,
            "usage-bootstrap-authentication": "true",
            "usage-bootstrap-signing": "true",
            "auth-extra-groups": "system:bootstrappers:kubeadm:default-node-token",
        },
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(format!("{BOOTSTRAP_TOKEN_ID}.{secret_part}"))
}
