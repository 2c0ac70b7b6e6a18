//! The Flotilla kubelet, the node agent on containerd's CRI: from its flags, joins the cluster
//! (a kubeconfig, or a node bootstrap document and a bootstrap token), registers the Node,
//! then heartbeats and runs the pods bound to it until SIGINT/SIGTERM. Run by the
//! `flotilla-kubelet` binary of the node image and by `flotilla kubelet`.

mod cri;
mod dns;
mod events;
mod eviction;
mod hooks;
mod init;
mod logs;
mod machine;
mod node;
mod pleg;
mod pods;
pub mod portforward;
mod probe;
mod prober;
mod resize;
mod resources;
mod server;
pub mod spdy;
mod static_pods;
mod stats;
mod status;
/// The WebSocket side of `/exec`, `/attach` and `/portForward`: public for the fuzz targets
/// (`fuzz/`), which drive its channel framing with arbitrary frames.
pub mod streaming;
mod translate;
mod volumes;

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Parser;

/// The kubelet's flags (upstream's names).
#[derive(Debug, Parser)]
#[command(
    name = "flotilla-kubelet",
    about = "The Flotilla kubelet on containerd's CRI",
    // As with upstream's flags, a flag given again wins over the earlier one.
    args_override_self = true
)]
pub struct KubeletArgs {
    /// A kubeconfig to talk to the API with.
    #[arg(long, conflicts_with = "node_config")]
    kubeconfig: Option<PathBuf>,
    /// The node bootstrap document (node.flotilla.dev/v1alpha1 NodeConfig): join with its
    /// bootstrap token through a CertificateSigningRequest.
    #[arg(long, requires = "cert_dir")]
    node_config: Option<PathBuf>,
    /// Where the node's own certificate is kept (with --node-config).
    #[arg(long)]
    cert_dir: Option<PathBuf>,
    /// The CRI endpoint.
    #[arg(long, default_value = "unix:///run/containerd/containerd.sock")]
    container_runtime_endpoint: String,
    /// The Node's name (default: the hostname).
    #[arg(long)]
    node_name: Option<String>,
    /// The node's IP (default: the local address that reaches the API server).
    #[arg(long)]
    node_ip: Option<IpAddr>,
    /// Taints to register with: key=value:Effect,…
    #[arg(long, default_value = "")]
    register_with_taints: String,
    /// Labels to register with: key=value,…
    #[arg(long, default_value = "")]
    node_labels: String,
    /// Where the kubelet keeps its files (pod logs under `logs/`).
    #[arg(long, default_value = "/var/lib/flotilla-kubelet")]
    root_dir: PathBuf,
    /// The node's pod capacity.
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// The port of the kubelet's HTTPS server (0 picks a free one).
    #[arg(long, default_value_t = 10250)]
    port: u16,
    /// The address the HTTPS server binds (default: the node IP).
    #[arg(long)]
    address: Option<IpAddr>,
    /// The serving certificate (PEM); a self-signed one when absent.
    #[arg(long, requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// The serving certificate's key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Static pods: a directory of Pod manifests (or one manifest file) the kubelet runs
    /// itself, with a mirror pod in the API for each.
    #[arg(long)]
    pod_manifest_path: Option<PathBuf>,
    /// How often the static pod manifests are read again (a Go duration: 20s, 500ms).
    #[arg(long, default_value = "20s", value_parser = static_pods::parse_duration)]
    file_check_frequency: std::time::Duration,
    /// Hard eviction thresholds: signal<quantity or percentage, comma-separated
    /// (memory.available, nodefs.available, nodefs.inodesFree, imagefs.available,
    /// imagefs.inodesFree, pid.available). An empty value disables eviction.
    #[arg(long, default_value = eviction::DEFAULT_HARD)]
    eviction_hard: String,
    /// How long a pressure condition stays after its threshold was last met.
    #[arg(long, default_value = "5m0s", value_parser = static_pods::parse_duration)]
    eviction_pressure_transition_period: std::time::Duration,
    /// The cluster DNS addresses pods resolve with (comma-separated; default: the node
    /// bootstrap document's `clusterDNS`).
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Vec<String>,
    /// The cluster's DNS domain (default: the node bootstrap document's `clusterDomain`).
    #[arg(long)]
    cluster_domain: Option<String>,
    /// The node's resolv.conf, which pods with `dnsPolicy: Default` get.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// The CA (PEM) client certificates must be signed by; default: the cluster's client CA
    /// as the API server publishes it in kube-system/extension-apiserver-authentication.
    #[arg(long)]
    client_ca_file: Option<PathBuf>,
}

/// The kubelet's default log filter (`RUST_LOG` overrides it).
pub const DEFAULT_LOG_FILTER: &str = "info,kube=warn,tower=warn,h2=warn";

/// Runs the kubelet until SIGINT or SIGTERM.
pub async fn run_until_signalled(args: KubeletArgs) -> anyhow::Result<()> {
    tokio::select! {
        outcome = run(args) => outcome,
        _ = shutdown() => Ok(()),
    }
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

/// The local address the kernel would use to reach `server` (no packet is sent).
fn local_ip_towards(server: &str) -> Option<IpAddr> {
    let uri: http::Uri = server.parse().ok()?;
    let host = uri.host()?.trim_matches(['[', ']']).to_string();
    let port = uri.port_u16().unwrap_or(443);
    let target = (host.as_str(), port).to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(bind).ok()?;
    socket.connect(target).ok()?;
    Some(socket.local_addr().ok()?.ip())
}

/// How long the kubelet waits for the cluster to issue its serving certificate before it
/// serves a self-signed one (which the API server will not accept: logs and exec fail until a
/// restart gets one).
const SERVING_CERTIFICATE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The serving certificate the cluster issues for this node, or `None` (with a warning) when it
/// does not come in time.
async fn serving_certificate(
    client: &kube::Client,
    name: &str,
    hostnames: &[String],
) -> Option<(String, String)> {
    let request = flotilla_node_bootstrap::serving_certificate(client.clone(), name, hostnames);
    match tokio::time::timeout(SERVING_CERTIFICATE_WAIT, request).await {
        Ok(Ok(pair)) => {
            tracing::info!("serving with the certificate the cluster issued");
            Some(pair)
        }
        Ok(Err(err)) => {
            tracing::warn!(err = %format!("{err:#}"), "no serving certificate from the cluster; serving a self-signed one");
            None
        }
        Err(_) => {
            tracing::warn!(
                "the cluster did not issue a serving certificate within {}s (is the controller-manager running?); serving a self-signed one",
                SERVING_CERTIFICATE_WAIT.as_secs()
            );
            None
        }
    }
}

async fn run(args: KubeletArgs) -> anyhow::Result<()> {
    let name = args.node_name.clone().unwrap_or_else(hostname);
    let thresholds = eviction::parse_thresholds(&args.eviction_hard)
        .map_err(|err| anyhow::anyhow!("--eviction-hard: {err}"))?;
    let mut labels = node::parse_labels(&args.node_labels).map_err(anyhow::Error::msg)?;
    let mut taints = node::parse_taints(&args.register_with_taints).map_err(anyhow::Error::msg)?;
    let mut cluster_dns = args.cluster_dns.clone();
    let mut cluster_domain = args.cluster_domain.clone();
    let (client, server) = match (&args.kubeconfig, &args.node_config, &args.cert_dir) {
        (Some(path), _, _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::from_yaml(&text)?,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .context("the kubeconfig is not usable")?;
            let server = config.cluster_url.to_string();
            (kube::Client::try_from(config)?, server)
        }
        (None, Some(path), Some(cert_dir)) => {
            let (client, config) = flotilla_node_bootstrap::join(path, &name, cert_dir).await?;
            for (key, value) in config.spec.kubelet.node_labels {
                labels.entry(key).or_insert(value);
            }
            taints.extend(config.spec.kubelet.register_with_taints);
            if cluster_dns.is_empty() {
                cluster_dns = config.spec.kubelet.cluster_dns;
            }
            if cluster_domain.is_none() && !config.spec.kubelet.cluster_domain.is_empty() {
                cluster_domain = Some(config.spec.kubelet.cluster_domain);
            }
            (client, config.spec.cluster.api_server_endpoint)
        }
        _ => anyhow::bail!("either --kubeconfig or --node-config with --cert-dir is required"),
    };
    let node_ip = match args.node_ip {
        Some(ip) => ip,
        None => local_ip_towards(&server).with_context(|| {
            format!("cannot tell the node's IP towards {server}; pass --node-ip")
        })?,
    };
    let mut cri = cri::Cri::connect(&args.container_runtime_endpoint).await?;
    let version = cri.version().await?;
    let tls_files = args
        .tls_cert_file
        .clone()
        .zip(args.tls_private_key_file.clone());
    let hostnames = vec![name.clone(), node_ip.to_string()];
    // Without certificate files, the cluster issues the serving certificate (upstream's
    // serverTLSBootstrap): the API server verifies the kubelet against the cluster CA.
    let issued = match tls_files {
        Some(_) => None,
        None => serving_certificate(&client, &name, &hostnames).await,
    };
    let server_config = server::ServerConfig {
        address: std::net::SocketAddr::new(args.address.unwrap_or(node_ip), args.port),
        tls_files,
        issued,
        client_ca_file: args.client_ca_file.clone(),
        hostnames,
    };
    // The API may not answer yet (a node booting beside its network): retry for a while
    // rather than exit, as upstream's kubelet keeps retrying.
    let mut attempts = 0;
    let client_ca = loop {
        match server::client_ca(&client, server_config.client_ca_file.as_ref()).await {
            Ok(ca) => break ca,
            Err(err) if attempts < 30 => {
                attempts += 1;
                tracing::warn!(%err, "reading the client CA failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(err) => return Err(err.into()),
        }
    };
    let tls = server::tls_config(&server_config, &client_ca)?;
    let listener = server::bind(&server_config).await?;
    let kubelet_port = listener.local_addr()?.port();
    tracing::info!(address = %listener.local_addr()?, "kubelet server listening");
    let stats = Arc::new(stats::Stats::default());
    tokio::spawn(stats::run(stats.clone(), cri.clone()));
    let kubelet_server =
        server::KubeletServer::new(client.clone(), cri.clone(), name.clone(), stats);
    tracing::info!(runtime = %version.runtime_name, version = %version.runtime_version, "container runtime");
    let spec = node::NodeSpec {
        name: name.clone(),
        ip: node_ip.to_string(),
        labels,
        taints,
        max_pods: args.max_pods,
        machine: machine::current(),
        runtime_version: format!("{}://{}", version.runtime_name, version.runtime_version),
        kubelet_port,
    };
    node::register(&client, &spec).await?;
    let log_root = args.root_dir.join("logs");
    std::fs::create_dir_all(&log_root)
        .with_context(|| format!("creating {}", log_root.display()))?;
    let memory_capacity =
        i64::try_from(spec.machine.memory_kib.saturating_mul(1024)).unwrap_or(i64::MAX);
    let recorder = Arc::new(events::Recorder::new(client.clone(), name.clone()));
    let pressure = Arc::new(eviction::Pressure::default());
    let eviction_config = eviction::Config {
        thresholds,
        transition: args.eviction_pressure_transition_period,
        root_dir: args.root_dir.clone(),
        log_root: log_root.clone(),
    };
    tokio::spawn(eviction::run(
        client.clone(),
        name.clone(),
        cri.clone(),
        eviction_config,
        pressure.clone(),
        recorder.clone(),
    ));
    let pleg = Arc::new(pleg::Pleg::default());
    tokio::spawn(pleg::run(pleg.clone(), cri.clone()));
    let allocations = resize::Allocations::load(
        &args.root_dir,
        resize::Requests {
            milli_cpu: i64::try_from(spec.machine.cpus)
                .unwrap_or(i64::MAX)
                .saturating_mul(1000),
            memory: memory_capacity,
        },
    );
    // A node without one gives pods no resolvers of its own (upstream warns and goes on).
    let resolv_conf = std::fs::read_to_string(&args.resolv_conf).unwrap_or_else(|err| {
        tracing::warn!(path = %args.resolv_conf.display(), %err, "no resolv.conf for pods");
        String::new()
    });
    let dns = dns::DnsSettings {
        cluster_dns,
        cluster_domain: cluster_domain.unwrap_or_default(),
        host: dns::parse_resolv_conf(&resolv_conf),
    };
    let kubelet = Arc::new(pods::Kubelet {
        allocations,
        dns,
        sandbox_starts: tokio::sync::Semaphore::new(spec.machine.cpus.max(1)),
        pleg,
        recorder,
        pressure: pressure.clone(),
        memory_capacity,
        client: client.clone(),
        cri: cri.clone(),
        node_name: name.clone(),
        node_ip: node_ip.to_string(),
        log_root: log_root.to_string_lossy().into_owned(),
        backoff: Mutex::new(status::Backoff::default()),
        volumes: volumes::VolumeManager::new(args.root_dir.clone(), client.clone(), name.clone()),
    });
    let static_pods = args.pod_manifest_path.clone().map(|path| {
        let (publish, receive) =
            tokio::sync::watch::channel(static_pods::read_manifests(&path, &name).0);
        tokio::spawn(static_pods::watch_manifests(
            path,
            name.clone(),
            args.file_check_frequency,
            publish,
        ));
        receive
    });
    let heartbeat = tokio::spawn(node::heartbeat(
        client,
        spec,
        cri,
        pressure.conditions.subscribe(),
    ));
    let serving = tokio::spawn(server::serve(kubelet_server, listener, tls));
    tokio::select! {
        outcome = pods::run(kubelet, static_pods) => outcome,
        _ = heartbeat => anyhow::bail!("the heartbeat stopped"),
        _ = serving => anyhow::bail!("the kubelet server stopped"),
    }
}
