//! Real worker nodes for the end-to-end suites: a fabric network (`node-image/image/start-fabric`)
//! and, per node, a network namespace on it with its own containerd (`start-containerd`) and a
//! `flotilla-kubelet` running inside that namespace, as on a machine of its own. Everything is
//! stopped when dropped.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use anyhow::{Context, bail, ensure};

use crate::flotilla_bin;

/// The `node-image/image` scripts.
pub fn image_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../node-image/image")
}

/// Whether `tool` is a command on the PATH.
pub fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fails, naming what is missing, unless this machine can run containers on real nodes.
pub fn require_runtime() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for tool in [
        "containerd",
        "ctr",
        "runc",
        "busybox",
        "nsenter",
        "ip",
        "nft",
    ] {
        if !on_path(tool) {
            missing.push(tool.to_string());
        }
    }
    for plugin in ["bridge", "host-local", "loopback"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            missing.push(format!("/usr/lib/cni/{plugin}"));
        }
    }
    if !missing.is_empty() {
        bail!(
            "real nodes need {} (apt-get install -y containerd runc containernetworking-plugins \
             busybox-static nftables; tests/run installs them)",
            missing.join(", ")
        );
    }
    let uid = Command::new("id").arg("-u").output()?;
    ensure!(
        String::from_utf8_lossy(&uid.stdout).trim() == "0",
        "real nodes run containers and network namespaces: they need root"
    );
    Ok(())
}

fn run_script(script: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(image_scripts().join(script))
        .args(args)
        .output()
        .with_context(|| format!("running node-image/image/{script}"))?;
    ensure!(
        out.status.success(),
        "node-image/image/{script} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The network joining a local cluster's nodes, with the host at [`Fabric::host_ip`].
pub struct Fabric {
    dir: PathBuf,
    prefix: String,
    /// The host's address on the fabric: serve the API here so nodes reach it.
    pub host_ip: String,
}

impl Fabric {
    /// Starts a fabric on a /24 of 10.199.0.0/16 that no other fabric on this host uses.
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let host_ip = run_script("start-fabric", &[&dir.to_string_lossy()])?
            .trim()
            .to_string();
        let prefix = std::fs::read_to_string(dir.join("prefix"))?
            .trim()
            .to_string();
        Ok(Fabric {
            dir: dir.to_path_buf(),
            prefix,
            host_ip,
        })
    }

    /// The address of the `index`th node (1-based) on this fabric.
    pub fn node_ip(&self, index: u8) -> String {
        format!("{}.{}", self.prefix, 10 + u16::from(index))
    }

    /// The fabric's directory (for `start-containerd`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        let _ = Command::new(image_scripts().join("stop-fabric"))
            .arg(&self.dir)
            .status();
    }
}

/// One node's containerd, in the node's network namespace on a fabric; stopped with everything
/// it runs when dropped.
pub struct Containerd {
    dir: PathBuf,
    /// The node's network namespace (under /var/run/netns).
    pub netns: String,
    /// The node's address on the fabric.
    pub ip: String,
    /// The node's pod CIDR (fixed in its CNI configuration).
    pub pod_cidr: String,
}

impl Containerd {
    /// Builds the local images if needed and starts containerd for a node at `ip` on `fabric`.
    pub fn start(dir: &Path, fabric: &Fabric, ip: &str, pod_cidr: &str) -> anyhow::Result<Self> {
        let images = dir.join("images");
        run_script("build-images", &[&images.to_string_lossy()])?;
        let dir_arg = dir.to_string_lossy().into_owned();
        let fabric_arg = fabric.dir().to_string_lossy().into_owned();
        // Constructed before the script runs, so a half-started node is still cleaned up.
        let mut containerd = Containerd {
            dir: dir.to_path_buf(),
            netns: String::new(),
            ip: ip.to_string(),
            pod_cidr: pod_cidr.to_string(),
        };
        run_script("start-containerd", &[&dir_arg, pod_cidr, &fabric_arg, ip])?;
        containerd.netns = std::fs::read_to_string(dir.join("netns"))?
            .trim()
            .to_string();
        Ok(containerd)
    }

    /// The CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// `ctr -n k8s.io ARGS`.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .context("running ctr")?;
        ensure!(
            out.status.success(),
            "ctr {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The runtime containers (sandboxes included) of pod `uid`.
    pub fn pod_containers(&self, uid: &str) -> anyhow::Result<Vec<String>> {
        let filter = format!("labels.\"io.kubernetes.pod.uid\"=={uid}");
        Ok(self
            .ctr(&["containers", "ls", "-q", &filter])?
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// A command prepared to run inside the node's network namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/var/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        command
    }

    /// Runs `busybox ARGS` inside the node's network namespace (e.g. `wget` from the node).
    pub fn busybox(&self, args: &[&str]) -> anyhow::Result<Output> {
        self.command("busybox")
            .args(args)
            .output()
            .context("running busybox in the node's namespace")
    }

    /// Routes `cidr` (another node's pods) through `via` (that node's address).
    pub fn route(&self, cidr: &str, via: &str) -> anyhow::Result<()> {
        let out = self
            .command("ip")
            .args(["route", "replace", cidr, "via", via])
            .output()?;
        ensure!(
            out.status.success(),
            "ip route replace {cidr} via {via}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new(image_scripts().join("stop-containerd"))
            .arg(&self.dir)
            .status();
    }
}

/// A node daemon (`flotilla-kubelet`, `flotilla-proxy`) running inside a node's namespace,
/// SIGKILLed when dropped; its log goes to a file.
pub struct NodeDaemon {
    child: Child,
    log: PathBuf,
}

/// A binary built beside `flotilla` (`FLOTILLA_KUBELET_BIN` / `FLOTILLA_PROXY_BIN` override).
pub fn node_bin(name: &str) -> anyhow::Result<PathBuf> {
    let variable = format!(
        "{}_BIN",
        name.to_uppercase().replace('-', "_") // flotilla-kubelet → FLOTILLA_KUBELET_BIN
    );
    let bin = match std::env::var(&variable) {
        Ok(path) => PathBuf::from(path),
        Err(_) => flotilla_bin()?.with_file_name(name),
    };
    ensure!(
        bin.exists(),
        "{name} not found at {}: build it first (`cargo build --workspace --bins`; tests/run does)",
        bin.display()
    );
    Ok(bin)
}

impl NodeDaemon {
    /// Starts binary `name` with `args` inside `containerd`'s node namespace, logging to `log`.
    pub fn start(
        name: &str,
        containerd: &Containerd,
        args: &[String],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let bin = node_bin(name)?;
        let file = OpenOptions::new().create(true).append(true).open(log)?;
        let child = containerd
            .command(bin)
            .args(args)
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(NodeDaemon {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Starts a kubelet for node `name` with `kubeconfig`, keeping its files under `dir`.
    pub fn kubelet(
        containerd: &Containerd,
        kubeconfig: &Path,
        name: &str,
        dir: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Self> {
        let mut args: Vec<String> = vec![
            "--kubeconfig".into(),
            kubeconfig.to_string_lossy().into_owned(),
            "--container-runtime-endpoint".into(),
            format!("unix://{}", containerd.socket().display()),
            "--node-name".into(),
            name.into(),
            "--node-ip".into(),
            containerd.ip.clone(),
            "--root-dir".into(),
            dir.join("kubelet").to_string_lossy().into_owned(),
            "--eviction-hard".into(),
            LOCAL_EVICTION_HARD.into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        Self::start(
            "flotilla-kubelet",
            containerd,
            &args,
            &dir.join("kubelet.log"),
        )
    }

    /// SIGKILLs the daemon.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the daemon is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `flotilla up --nodes N`: the service with N real nodes (each a network namespace with its
/// own containerd, kubelet and proxy). Dropping it stops the service gracefully (which stops
/// the nodes), then removes whatever a failed stop left behind.
pub struct LocalCluster {
    /// The running service; its kubeconfig is the `demo` cluster's.
    pub flotilla: crate::Flotilla,
    count: u8,
}

impl LocalCluster {
    /// Starts `flotilla up --nodes count` on the embedded store.
    pub fn start(count: u8) -> anyhow::Result<Self> {
        require_runtime()?;
        let flotilla =
            crate::Flotilla::up_with(crate::Backend::Embedded, &["--nodes", &count.to_string()])?;
        Ok(LocalCluster { flotilla, count })
    }

    /// Starts `flotilla up` with no flag at all, as a new user does, its standard error in
    /// `stderr_file`: on a machine that can host a node, it runs one.
    pub fn start_as_typed(stderr_file: PathBuf) -> anyhow::Result<Self> {
        require_runtime()?;
        let flotilla =
            crate::Flotilla::up_as_typed(crate::Backend::Embedded, &[], &[], Some(stderr_file))?;
        Ok(LocalCluster { flotilla, count: 1 })
    }

    /// Node `index`'s directory (1-based), as `flotilla up` lays it out.
    pub fn node_dir(&self, index: u8) -> PathBuf {
        self.flotilla
            .data_dir()
            .join("nodes")
            .join(format!("node-{index}"))
    }

    /// Node `index`'s name.
    pub fn node_name(&self, index: u8) -> String {
        format!("node-{index}")
    }

    /// Node `index`'s address on the fabric.
    pub fn node_ip(&self, index: u8) -> anyhow::Result<String> {
        let path = self.node_dir(index).join("node-ip");
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .trim()
            .to_string())
    }

    /// A command prepared to run inside node `index`'s network namespace.
    pub fn node_command(
        &self,
        index: u8,
        program: impl AsRef<std::ffi::OsStr>,
    ) -> anyhow::Result<Command> {
        let path = self.node_dir(index).join("netns");
        let netns = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/var/run/netns/{}", netns.trim()))
            .arg("--")
            .arg(program);
        Ok(command)
    }

    /// What node `index`'s daemon (`kubelet`, `proxy`) logged.
    pub fn log(&self, index: u8, daemon: &str) -> String {
        std::fs::read_to_string(self.node_dir(index).join(format!("{daemon}.log")))
            .unwrap_or_default()
    }

    /// Every node's kubelet and proxy log, for a failing test's message.
    pub fn logs(&self) -> String {
        let mut all = String::new();
        for index in 1..=self.count {
            for daemon in ["kubelet", "proxy"] {
                let log = self.log(index, daemon);
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                all.push_str(&format!("--- node-{index} {daemon} (last 40 lines)\n"));
                for line in tail.into_iter().rev() {
                    all.push_str(line);
                    all.push('\n');
                }
            }
        }
        all
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.flotilla
            .stop(false, std::time::Duration::from_secs(40));
        let nodes = self.flotilla.data_dir().join("nodes");
        for index in 1..=self.count {
            let dir = self.node_dir(index);
            for daemon in ["kubelet", "proxy"] {
                let Ok(pid) = std::fs::read_to_string(dir.join(format!("{daemon}.pid"))) else {
                    continue;
                };
                let pid = pid.trim();
                // `flotilla kubelet …` / `flotilla proxy …`, still running after the stop.
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if cmdline.split(|byte| *byte == 0).nth(1) == Some(daemon.as_bytes()) {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            let _ = Command::new(image_scripts().join("stop-containerd"))
                .arg(&dir)
                .status();
        }
        let _ = Command::new(image_scripts().join("stop-fabric"))
            .arg(nodes.join("fabric"))
            .status();
    }
}

/// The NodeConfig user data the cloud controller would write for the cluster `kubectl` talks
/// to, joining with bootstrap token `token` (`id.secret`) and registering label `pool=workers`.
pub fn node_config_user_data(kubectl: &crate::Kubectl, token: &str) -> anyhow::Result<String> {
    let config: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    let cluster = &config["clusters"][0]["cluster"];
    Ok(format!(
        "apiVersion: node.flotilla.dev/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: demo\n    apiServerEndpoint: {}\n    certificateAuthority: {}\n  kubelet:\n    bootstrapToken: {token}\n    nodeLabels: {{pool: workers}}\n",
        cluster["server"]
            .as_str()
            .context("the kubeconfig has no server")?,
        cluster["certificate-authority-data"]
            .as_str()
            .context("the kubeconfig has no CA")?,
    ))
}

/// Runs `flotilla-bootstrap` inside `containerd`'s node namespace against the metadata
/// service at `imds_endpoint`, writing under `state` (its console is the file
/// `state.console`); its exit status and standard error.
pub fn run_bootstrap(
    containerd: &Containerd,
    imds_endpoint: &str,
    state: &Path,
) -> anyhow::Result<(bool, String)> {
    // The console is a device that exists; here a file stands for it.
    std::fs::write(state.with_extension("console"), "")?;
    let out = containerd
        .command(node_bin("flotilla-bootstrap")?)
        .arg("--imds-endpoint")
        .arg(imds_endpoint)
        .arg("--state-dir")
        .arg(state)
        .arg("--container-runtime-endpoint")
        .arg(format!("unix://{}", containerd.socket().display()))
        .arg("--console")
        .arg(state.with_extension("console"))
        .env("RUST_LOG", "warn")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The flags a systemd unit expands from `VARIABLE=…` in the environment `file` that
/// `flotilla-bootstrap` wrote.
pub fn unit_args(file: &Path, variable: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)?;
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{variable}=")))
        .with_context(|| format!("{} sets no {variable}", file.display()))?;
    Ok(value.split_whitespace().map(str::to_string).collect())
}

/// A node booted the node image's way: `flotilla-bootstrap` read its metadata from
/// `imds_endpoint` into `state`, then the kubelet and proxy started from what it wrote (the
/// kubelet evicting on memory only, the proxy's health on the node's address). Waits for the
/// node's client certificate before starting the proxy, as its unit does.
pub fn boot_from_metadata(
    containerd: &Containerd,
    imds_endpoint: &str,
    state: &Path,
) -> anyhow::Result<(NodeDaemon, NodeDaemon)> {
    let (ok, stderr) = run_bootstrap(containerd, imds_endpoint, state)?;
    ensure!(ok, "flotilla-bootstrap failed: {}", stderr.trim());
    start_configured(containerd, state)
}

/// The kubelet and proxy of a node `flotilla-bootstrap` configured under `state`, started as
/// their units start them (see [`boot_from_metadata`]).
pub fn start_configured(
    containerd: &Containerd,
    state: &Path,
) -> anyhow::Result<(NodeDaemon, NodeDaemon)> {
    let mut kubelet = start_configured_kubelet(containerd, state)?;
    ensure!(
        wait_for_node_certificate(&mut kubelet, state, std::time::Duration::from_secs(60)),
        "no node certificate (requested with the bootstrap token): {}",
        kubelet.log()
    );
    Ok((kubelet, start_configured_proxy(containerd, state)?))
}

/// The kubelet as its unit starts it from what `flotilla-bootstrap` wrote under `state`.
pub fn start_configured_kubelet(
    containerd: &Containerd,
    state: &Path,
) -> anyhow::Result<NodeDaemon> {
    let mut kubelet_args = unit_args(&state.join("kubelet.env"), "KUBELET_ARGS")?;
    kubelet_args.extend(["--eviction-hard".into(), LOCAL_EVICTION_HARD.into()]);
    NodeDaemon::start(
        "flotilla-kubelet",
        containerd,
        &kubelet_args,
        &state.with_extension("kubelet.log"),
    )
}

/// Whether the node's client certificate appeared within `within` (as the proxy's unit waits
/// for it), giving up early when the kubelet has exited (its request was refused).
pub fn wait_for_node_certificate(
    kubelet: &mut NodeDaemon,
    state: &Path,
    within: std::time::Duration,
) -> bool {
    let certificate = state.join("pki/kubelet-client-current.pem");
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if certificate.exists() {
            return true;
        }
        if !kubelet.running() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    certificate.exists()
}

/// The proxy as its unit starts it (once the node's certificate exists).
pub fn start_configured_proxy(containerd: &Containerd, state: &Path) -> anyhow::Result<NodeDaemon> {
    let mut proxy_args = unit_args(&state.join("proxy.env"), "PROXY_ARGS")?;
    proxy_args.extend([
        "--healthz-bind-address".into(),
        format!("{}:10256", containerd.ip),
    ]);
    NodeDaemon::start(
        "flotilla-proxy",
        containerd,
        &proxy_args,
        &state.with_extension("proxy.log"),
    )
}

/// Eviction thresholds for nodes sharing the host's disk: memory only, as kind sets them
/// (a nearly full developer disk must not evict every test pod).
pub const LOCAL_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<0%,nodefs.inodesFree<0%,imagefs.available<0%";

/// One real node against its own `flotilla up` on a fabric: the set-up the single-node kubelet
/// suites share. Fields drop in order: kubelet, service, containerd, fabric, directory.
pub struct SingleNode {
    /// The node's kubelet (replace it to restart the kubelet).
    pub kubelet: NodeDaemon,
    /// The service the node joins.
    pub flotilla: crate::Flotilla,
    /// The node's containerd.
    pub containerd: Containerd,
    /// The fabric joining the host and the node.
    pub fabric: Fabric,
    /// Everything on disk: the kubelet's root dir is `dir/kubelet`.
    pub dir: tempfile::TempDir,
}

impl SingleNode {
    /// Starts a fabric, node `name`'s containerd with pods from `pod_cidr`, `flotilla up` on
    /// the fabric's host address and the node's kubelet (with `kubelet_args` added).
    pub fn start(name: &str, pod_cidr: &str, kubelet_args: &[&str]) -> anyhow::Result<Self> {
        Self::start_with(name, pod_cidr, kubelet_args, &[])
    }

    /// [`SingleNode::start`] with `up_args` added to `flotilla up`.
    pub fn start_with(
        name: &str,
        pod_cidr: &str,
        kubelet_args: &[&str],
        up_args: &[&str],
    ) -> anyhow::Result<Self> {
        require_runtime()?;
        let dir = tempfile::tempdir()?;
        let fabric = Fabric::start(&dir.path().join("fabric"))?;
        let containerd = Containerd::start(
            &dir.path().join("node"),
            &fabric,
            &fabric.node_ip(1),
            pod_cidr,
        )?;
        let flotilla = crate::Flotilla::up_at(crate::Backend::Embedded, &fabric.host_ip, up_args)?;
        let kubelet = NodeDaemon::kubelet(
            &containerd,
            &flotilla.kubeconfig,
            name,
            dir.path(),
            kubelet_args,
        )?;
        Ok(SingleNode {
            kubelet,
            flotilla,
            containerd,
            fabric,
            dir,
        })
    }

    /// Waits until Node `name` reports Ready.
    pub fn wait_ready(&self, name: &str) -> anyhow::Result<()> {
        let kubectl = self.flotilla.kubectl();
        let ready = r#"{.status.conditions[?(@.type=="Ready")].status}"#;
        crate::until(
            "the node is Ready",
            std::time::Duration::from_secs(60),
            || {
                Ok(
                    crate::jsonpath(&kubectl, &["get", "node", name], ready).unwrap_or_default()
                        == "True",
                )
            },
        )
    }
}
