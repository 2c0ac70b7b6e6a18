//! The `flotilla` command line: the service (`up`, `serve`), the management API's client
//! commands (`account`, `cluster`, `nodepool`), the components that also run alone
//! (`scheduler`, `controller-manager`, `cloud-controller`, `kubelet`, `proxy`) and the CLI's
//! own (`version`, `completion`).

/// The management API's HTTPS client (its own crate, shared with the Terraform provider).
pub use flotilla_management_client as client;
mod cloud;
mod commands;
mod completion;
mod inprocess;
mod join;
mod leader_election;
mod localnodes;
pub mod placement;
mod private_files;
mod replicas;
mod service;
mod simulator;
mod standalone;
mod version;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// What `--help` ends with: exit codes and the environment.
const AFTER_HELP: &str = "\
Exit codes: 0 success, 1 error (one line on standard error says why), 2 bad usage.
Logs go to standard error; RUST_LOG filters them (e.g. RUST_LOG=debug).

Start here:
  flotilla up                          # a cluster on this machine; prints its kubeconfig
  flotilla completion bash > /etc/bash_completion.d/flotilla";

/// Flotilla: hosted Kubernetes control planes.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// How the process logs.
    #[command(flatten)]
    pub log: flotilla_logging::LogArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole service on this machine with a `demo` cluster; writes DIR/kubeconfig,
    /// DIR/flotilla.json (the `default` account's client configuration for the other
    /// commands) and DIR/operator.json (the operator's).
    #[command(after_help = "Examples:
  flotilla up                                  # embedded store, one local node when possible
  flotilla up --nodes 0                        # the control plane alone
  flotilla up --etcd http://127.0.0.1:2379 --data-dir ./flotilla-data")]
    Up(UpArgs),
    /// Run the hosted service on an etcd cluster.
    #[command(after_help = "Example:
  flotilla serve --etcd http://10.0.0.5:2379 --tls-san api.example.com \\
    --operator-config /etc/flotilla/operator.json \\
    --key-encryption-key-file /etc/flotilla/key-encryption-key")]
    Serve(ServeArgs),
    /// Accounts (operator only).
    #[command(after_help = "Example:
  FLOTILLA_CONFIG=./flotilla-data/operator.json flotilla account create acme")]
    Account {
        /// Where the management API is and who calls it.
        #[command(flatten)]
        client: ClientArgs,
        /// What to do with accounts.
        #[command(subcommand)]
        command: AccountCommand,
    },
    /// Clusters of your account.
    #[command(after_help = "Examples:
  flotilla cluster create prod --wait
  flotilla cluster kubeconfig prod --file prod.kubeconfig
  flotilla cluster list -o yaml")]
    Cluster {
        /// Where the management API is and who calls it.
        #[command(flatten)]
        client: ClientArgs,
        /// What to do with clusters.
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// The scheduler against any cluster (leader-elected on kube-system/kube-scheduler).
    #[command(after_help = "Example:
  flotilla scheduler --kubeconfig admin.kubeconfig")]
    Scheduler(StandaloneArgs),
    /// The controllers against any cluster (leader-elected on
    /// kube-system/kube-controller-manager).
    #[command(after_help = "Example:
  flotilla controller-manager --kubeconfig admin.kubeconfig \\
    --cluster-signing-cert-file ca.crt --cluster-signing-key-file ca.key")]
    ControllerManager(ControllerManagerArgs),
    /// The cloud controllers (nodes, load balancers, volumes) against any cluster, on AWS or
    /// an endpoint override such as LocalStack (leader-elected on
    /// kube-system/cloud-controller-manager).
    #[command(after_help = "Example:
  flotilla cloud-controller --kubeconfig admin.kubeconfig --cluster-id prod \\
    --vpc-id vpc-0abc --subnet-ids subnet-a,subnet-b --endpoint-override http://127.0.0.1:4566")]
    CloudController(CloudControllerArgs),
    /// Simulated nodes (kwok-style) for tests and benchmarks: registers nodes, heartbeats,
    /// and runs the pods bound to them. Not the real kubelet.
    #[command(after_help = "Example:
  flotilla simulate-nodes --kubeconfig admin.kubeconfig --count 100 --prefix sim")]
    SimulateNodes(SimulateArgs),
    /// Node pools of a cluster.
    #[command(after_help = "Examples:
  flotilla nodepool create prod workers --instance-type t3.large --desired 3 --wait
  flotilla nodepool scale prod workers --desired 5")]
    Nodepool {
        /// Where the management API is and who calls it.
        #[command(flatten)]
        client: ClientArgs,
        /// What to do with node pools.
        #[command(subcommand)]
        command: NodePoolCommand,
    },
    /// A worker node's kubelet on containerd's CRI (what `flotilla up` runs for its local
    /// nodes; the node image ships it as `flotilla-kubelet`).
    #[command(after_help = "Example:
  flotilla kubelet --node-config /etc/flotilla/node.yaml --cert-dir /var/lib/flotilla-kubelet/pki \\
    --node-name ip-10-0-1-5 --node-ip 10.0.1.5")]
    Kubelet(flotilla_kubelet::KubeletArgs),
    /// A worker node's proxy, kube-proxy's nftables mode (the node image ships it as
    /// `flotilla-proxy`).
    #[command(after_help = "Example:
  flotilla proxy --kubeconfig proxy.kubeconfig --cluster-cidr 10.244.0.0/16")]
    Proxy(flotilla_proxy::command::ProxyArgs),
    /// Print the client's version and, when a service is configured and reachable, the
    /// server's (as `kubectl version`).
    #[command(after_help = "Examples:
  flotilla version
  flotilla version --client -o json")]
    Version(VersionArgs),
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  flotilla completion bash > /etc/bash_completion.d/flotilla
  flotilla completion zsh > \"${fpath[1]}/_flotilla\"
  flotilla completion fish > ~/.config/fish/completions/flotilla.fish")]
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// `flotilla version`.
#[derive(Debug, Clone, clap::Args)]
pub struct VersionArgs {
    /// Where the management API is (the server's version is read from it).
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only the client's version: no server is asked.
    #[arg(long = "client")]
    pub client_only: bool,
}

/// `flotilla scheduler` / `flotilla controller-manager`.
#[derive(Debug, Clone, clap::Args)]
pub struct StandaloneArgs {
    /// The cluster's kubeconfig.
    #[arg(long)]
    pub kubeconfig: PathBuf,
    /// This replica's name in the Lease (default: host name and process id).
    #[arg(long)]
    pub identity: Option<String>,
}

/// `flotilla cloud-controller`.
#[derive(Debug, Clone, clap::Args)]
pub struct CloudControllerArgs {
    /// The cluster and who runs its loops.
    #[command(flatten)]
    pub standalone: StandaloneArgs,
    /// The cluster's id in resource tags (`kubernetes.io/cluster/<id>=owned`).
    #[arg(long)]
    pub cluster_id: String,
    /// Cloud region.
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Endpoint of every cloud API instead of the region's (e.g. LocalStack's).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub endpoint_override: Option<String>,
    /// The cluster's VPC.
    #[arg(long)]
    pub vpc_id: Option<String>,
    /// The cluster's subnets (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub subnet_ids: Vec<String>,
    /// A role to assume for every call (credentials otherwise come from the environment, as
    /// the AWS CLI finds them).
    #[arg(long)]
    pub role_arn: Option<String>,
}

/// `flotilla controller-manager`.
#[derive(Debug, Clone, clap::Args)]
pub struct ControllerManagerArgs {
    /// The cluster and this replica.
    #[command(flatten)]
    pub standalone: StandaloneArgs,
    /// The CA certificate (PEM) approved certificate signing requests are signed with (with
    /// --cluster-signing-key-file; without both, requests are approved but not signed).
    #[arg(long, requires = "cluster_signing_key_file")]
    pub cluster_signing_cert_file: Option<PathBuf>,
    /// The CA's private key (PEM).
    #[arg(long, requires = "cluster_signing_cert_file")]
    pub cluster_signing_key_file: Option<PathBuf>,
    /// The longest certificate the signer issues, in seconds (upstream's
    /// --cluster-signing-duration, one year).
    #[arg(long, default_value_t = 365 * 24 * 3600)]
    pub cluster_signing_duration_seconds: u64,
}

/// `flotilla simulate-nodes`: `--kubeconfig` runs `--count` nodes with that (admin)
/// credential; `--node-config` joins one node the kubelet's way (bootstrap token →
/// CertificateSigningRequest → its own `system:node:<name>` credential).
#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// The cluster's kubeconfig (an admin's).
    #[arg(
        long,
        required_unless_present = "node_config",
        conflicts_with = "node_config"
    )]
    pub kubeconfig: Option<PathBuf>,
    /// A node bootstrap document (`node.flotilla.dev/v1alpha1` NodeConfig, YAML or JSON): join
    /// one node with its bootstrap token.
    #[arg(long, requires_all = ["node_name", "node_ip", "cert_dir"])]
    pub node_config: Option<PathBuf>,
    /// The joining node's name (from its instance metadata).
    #[arg(long, requires = "node_config")]
    pub node_name: Option<String>,
    /// The joining node's InternalIP (from its instance metadata).
    #[arg(long, requires = "node_config")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Where the joining node keeps its key and signed certificate
    /// (`kubelet-client-current.pem`), reused on restart while valid.
    #[arg(long, requires = "node_config")]
    pub cert_dir: Option<PathBuf>,
    /// How many nodes.
    #[arg(long, default_value_t = 3)]
    pub count: usize,
    /// Node names are PREFIX-0, PREFIX-1, …
    #[arg(long, default_value = "sim")]
    pub prefix: String,
    /// CPU capacity of each node.
    #[arg(long, default_value = "4")]
    pub cpu: String,
    /// Memory capacity of each node.
    #[arg(long, default_value = "16Gi")]
    pub memory: String,
    /// Pod capacity of each node.
    #[arg(long, default_value_t = 110)]
    pub pods: u32,
}

/// `flotilla up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Directory for the embedded store, the admin kubeconfig and the client configuration.
    #[arg(long, default_value = "./flotilla-data")]
    pub data_dir: PathBuf,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Use this etcd cluster instead of the embedded store (comma-separated URLs).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Do not run the clusters' scheduler and controllers in this process: they run as
    /// separate `flotilla scheduler` and `flotilla controller-manager` processes instead.
    #[arg(long)]
    pub external_control_loops: bool,
    /// Real worker nodes of the `demo` cluster on this machine, each a network namespace with
    /// its own containerd, kubelet and proxy (needs root, containerd, runc, the CNI plugins,
    /// busybox-static, nftables, iproute2 and python3). Default: one when this machine has all
    /// of that, else none (`up` says what is missing); 0 runs the control plane alone.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=200))]
    pub nodes: Option<u8>,
    /// The key every private key in the store is sealed under (base64 of 32 random bytes,
    /// mode 0600); created when absent. Default: DIR/key-encryption-key.
    #[arg(long, env = "FLOTILLA_KEY_ENCRYPTION_KEY_FILE")]
    pub key_encryption_key_file: Option<PathBuf>,
    /// Encryption at rest of the resources it names (upstream's `EncryptionConfiguration`
    /// file: `aescbc`, `aesgcm`, `secretbox` and `identity` providers); each tenant encrypts
    /// with keys derived from the file's for it alone. Without it values are stored as they are.
    #[arg(long, env = "FLOTILLA_ENCRYPTION_PROVIDER_CONFIG")]
    pub encryption_provider_config: Option<PathBuf>,
    /// The networks a cluster with `endpointAccess.private` answers (comma-separated CIDRs),
    /// besides the local nodes' fabric.
    #[arg(long, value_delimiter = ',')]
    pub private_networks: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// How long a node pool's running instance may go without its Node before the pool is
    /// DEGRADED with `NodeCreationFailure` (its user data, token or route to the API is wrong).
    #[arg(long, default_value_t = 600)]
    pub node_join_timeout_seconds: u64,
    /// exec, attach and port-forward sessions the cluster may have open at once before more
    /// are answered 429 with Retry-After (0, the default: no limit — one user on one
    /// machine; `serve` limits each cluster to 100).
    #[arg(long, default_value_t = 0)]
    pub tenant_max_streams: usize,
    /// Audit logging.
    #[command(flatten)]
    pub audit: AuditArgs,
}

/// Upstream's audit flags, on `up` and `serve` alike.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// The audit policy (`audit.k8s.io/v1` `Policy`, YAML or JSON) the operator records every
    /// cluster's requests by; a cluster's own `auditPolicy` adds to it.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,
    /// Where audit events are written, one JSON line each (`-` for standard output); the
    /// file is created mode 0600.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,
    /// Days a rotated audit log is kept (0: whatever its age).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxage: u64,
    /// Rotated audit logs kept (0: all).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxbackup: usize,
    /// Megabytes the audit log reaches before it is rotated (0: 100).
    #[arg(long, default_value_t = 0)]
    pub audit_log_maxsize: u64,
    /// A kubeconfig naming the server audit events are posted to, in batches (`EventList`).
    #[arg(long)]
    pub audit_webhook_config_file: Option<PathBuf>,
    /// Events per batch at most.
    #[arg(long, default_value_t = 400)]
    pub audit_webhook_batch_max_size: usize,
    /// How long the first event of a batch waits for others (e.g. `30s`, `500ms`).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub audit_webhook_batch_max_wait: std::time::Duration,
    /// Events buffered for the webhook before new ones are dropped.
    #[arg(long, default_value_t = 10_000)]
    pub audit_webhook_batch_buffer_size: usize,
    /// The delay before a failed batch is sent again (×1.5 each time, five attempts).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub audit_webhook_initial_backoff: std::time::Duration,
}

/// A Go-style duration of one unit: `30s`, `500ms`, `2m`, `1h`.
/// A whole number of bytes written as a Kubernetes quantity (`1Gi`, `512Mi`, `1000000`).
fn parse_byte_quantity(text: &str) -> Result<u64, String> {
    let quantity = flotilla_api_machinery::quantity::Quantity::parse(text)
        .map_err(|_| format!("{text:?} is not a quantity (e.g. 1Gi, 500Mi, 1000000)"))?;
    let nanos = quantity.nanos();
    if nanos < 0 || nanos % 1_000_000_000 != 0 {
        return Err(format!(
            "{text:?} is not a whole, non-negative number of bytes"
        ));
    }
    u64::try_from(nanos / 1_000_000_000).map_err(|_| format!("{text:?} is too large"))
}

fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("{text:?} has no unit (s, ms, m, h)"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (s, ms, m, h)")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|err| format!("{text:?}: {err}"))
}

/// `flotilla serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// etcd endpoints (comma-separated URLs).
    #[arg(long, value_delimiter = ',', required = true)]
    pub etcd: Vec<String>,
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:6443")]
    pub listen: SocketAddr,
    /// Extra host names or IPs the serving certificate must cover.
    #[arg(long, value_delimiter = ',')]
    pub tls_san: Vec<String>,
    /// The URL clients reach this service at (default: https://<first --tls-san or the
    /// listen address>:<port>); cluster endpoints and kubeconfigs carry it.
    #[arg(long)]
    pub public_url: Option<String>,
    /// The operator's client configuration (JSON: endpoint, apiKey, caPem, as the client
    /// commands read it). Its token is registered as the operator's; a missing file is
    /// created with a new token (mode 0600), so `FLOTILLA_CONFIG=FILE flotilla account create
    /// ID` works at once.
    #[arg(
        long,
        env = "FLOTILLA_OPERATOR_CONFIG",
        default_value = "./flotilla-operator.json"
    )]
    pub operator_config: PathBuf,
    /// The key every private key in etcd is sealed under (base64 of 32 random bytes, mode
    /// 0600); created when absent. Every replica needs the same file: one with another key
    /// refuses to start.
    #[arg(
        long,
        env = "FLOTILLA_KEY_ENCRYPTION_KEY_FILE",
        default_value = "./flotilla-key-encryption-key"
    )]
    pub key_encryption_key_file: PathBuf,
    /// Encryption at rest of the resources it names (upstream's `EncryptionConfiguration`
    /// file: `aescbc`, `aesgcm`, `secretbox` and `identity` providers); each tenant encrypts
    /// with keys derived from the file's for it alone. Without it values are stored as they are.
    #[arg(long, env = "FLOTILLA_ENCRYPTION_PROVIDER_CONFIG")]
    pub encryption_provider_config: Option<PathBuf>,
    /// The networks worker nodes live in (comma-separated CIDRs: the VPCs' ranges): the only
    /// addresses dialled for `kubectl logs/exec/attach/port-forward`, never loopback,
    /// link-local or this service's own. Default: the private ranges (10/8, 172.16/12,
    /// 192.168/16, 100.64/10, fc00::/7) — name the node networks when the control plane's own
    /// network is private too.
    #[arg(long, value_delimiter = ',')]
    pub kubelet_networks: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// The networks a cluster with `endpointAccess.private` answers (comma-separated CIDRs:
    /// the VPCs'); a cluster with `public: false` answers nothing else.
    #[arg(long, value_delimiter = ',')]
    pub private_networks: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// Sustained requests per second each cluster's API accepts before answering 429 with
    /// Retry-After (0: no limit).
    #[arg(long, default_value_t = 200.0)]
    pub tenant_qps: f64,
    /// Requests above the sustained rate each cluster may make at once.
    #[arg(long, default_value_t = 400)]
    pub tenant_burst: u32,
    /// Requests each cluster may have executing at once, watches aside (0: no limit); the
    /// rest wait in the cluster's own queue.
    #[arg(long, default_value_t = 8)]
    pub tenant_max_in_flight: usize,
    /// Requests each cluster may have waiting for one of its seats before more are answered
    /// 429 with Retry-After (by default as many as its burst: the request budget decides how
    /// many requests a cluster makes, its seats how many run at once).
    #[arg(long, default_value_t = 400)]
    pub tenant_max_queued: usize,
    /// Most objects each cluster may store before creates are refused (403, exceeded quota;
    /// 0: no quota).
    #[arg(long, default_value_t = 100_000)]
    pub tenant_max_objects: usize,
    /// Most bytes each cluster's objects may hold together, as a Kubernetes quantity (`1Gi`,
    /// `500Mi`): creates and updates that would grow a cluster past it are refused (403,
    /// exceeded quota), shrinking updates and deletes never are (0: no quota).
    #[arg(long, default_value = "1Gi", value_parser = parse_byte_quantity)]
    pub tenant_max_bytes: u64,
    /// Watches each cluster may have open at once before more are answered 429 with
    /// Retry-After (0: no limit); its own control loops hosted here are not counted.
    #[arg(long, default_value_t = 1000)]
    pub tenant_max_watches: usize,
    /// exec, attach and port-forward sessions each cluster may have open at once before more
    /// are answered 429 with Retry-After (0: no limit).
    #[arg(long, default_value_t = 100)]
    pub tenant_max_streams: usize,
    /// How long a replica's hold on a cluster's control loops lasts without renewal; another
    /// replica takes them over this long after the holder dies.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// How long a cluster's control loops may have nothing to do (no change, no queued work,
    /// no nodes, pods, jobs, autoscalers, volumes or cloud) before they are parked: stopped,
    /// their Lease kept, started again by the cluster's next write. An idle cluster then
    /// costs its records and nothing else (`0s`: never parked).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub park_idle_clusters_after: std::time::Duration,
    /// How long a node pool's running instance may go without its Node before the pool is
    /// DEGRADED with `NodeCreationFailure` (its user data, token or route to the API is wrong).
    #[arg(long, default_value_t = 600)]
    pub node_join_timeout_seconds: u64,
    /// This replica's name in the clusters' leases (default: host name, listen port and a
    /// random suffix).
    #[arg(long)]
    pub replica_id: Option<String>,
    /// Do not run the clusters' scheduler and controllers in this process: they run as
    /// separate `flotilla scheduler` and `flotilla controller-manager` processes instead.
    #[arg(long)]
    pub external_control_loops: bool,
    /// Audit logging.
    #[command(flatten)]
    pub audit: AuditArgs,
}

/// How a client command reaches the management API. Flags and environment override the
/// configuration file that `flotilla up` writes.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Client configuration file (JSON: endpoint, apiKey, caPem), as `flotilla up` writes it.
    #[arg(long, global = true, env = "FLOTILLA_CONFIG")]
    pub config: Option<PathBuf>,
    /// The service's URL, e.g. https://127.0.0.1:6443.
    #[arg(long, global = true, env = "FLOTILLA_ENDPOINT")]
    pub endpoint: Option<String>,
    /// The bearer API key (or the operator token, for `account`).
    #[arg(long, global = true, env = "FLOTILLA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A PEM file with the CA that signed the service's certificate.
    #[arg(long, global = true, env = "FLOTILLA_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl ClientArgs {
    /// The management API client these flags, the environment and the configuration file
    /// describe (in that order of precedence).
    pub fn client(&self) -> anyhow::Result<client::ManagementClient> {
        client::ManagementClient::resolve(
            self.config.as_deref(),
            self.endpoint.as_deref(),
            self.api_key.as_deref(),
            self.ca_file.as_deref(),
        )
    }
}

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// The API's JSON.
    Json,
    /// The API's JSON as YAML.
    Yaml,
}

/// `flotilla account …`.
#[derive(Debug, Subcommand)]
pub enum AccountCommand {
    /// Create an account; prints its first API key.
    #[command(after_help = "Example:\n  flotilla account create acme")]
    Create {
        /// Account id (a DNS label).
        id: String,
    },
    /// List accounts.
    #[command(after_help = "Example:\n  flotilla account list -o json")]
    List,
    /// Show an account.
    #[command(after_help = "Example:\n  flotilla account get acme")]
    Get {
        /// Account id.
        id: String,
    },
    /// Delete an account that has no clusters; its API keys stop working.
    #[command(after_help = "Example:\n  flotilla account delete acme")]
    Delete {
        /// Account id.
        id: String,
    },
    /// Issue another API key for an account (`--rotate`: and revoke its other keys).
    #[command(
        after_help = "Examples:\n  flotilla account new-key acme\n  flotilla account new-key acme --rotate"
    )]
    NewKey {
        /// Account id.
        id: String,
        /// Revoke the account's other keys once the new one is issued.
        #[arg(long)]
        rotate: bool,
    },
}

/// `flotilla cluster …`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Create a cluster.
    #[command(after_help = "Examples:
  flotilla cluster create prod --tag team=infra --wait
  flotilla cluster create edge --public-access-cidr 203.0.113.0/24")]
    Create(Box<ClusterCreateArgs>),
    /// Change a cluster in place: endpoint access, tags, Pod Security defaults.
    #[command(after_help = "Examples:
  flotilla cluster update prod --pod-security-enforce baseline --wait
  flotilla cluster update prod --tag tier=gold --remove-tag owner")]
    Update(Box<ClusterUpdateArgs>),
    /// List clusters.
    #[command(after_help = "Example:\n  flotilla cluster list -o json")]
    List,
    /// Show one cluster.
    #[command(after_help = "Example:\n  flotilla cluster get demo -o yaml")]
    Get {
        /// Cluster name.
        name: String,
    },
    /// Delete a cluster with all of its objects, credentials and node pools.
    #[command(after_help = "Example:\n  flotilla cluster delete prod --wait")]
    Delete {
        /// Cluster name.
        name: String,
        /// Wait until it is gone.
        #[arg(long)]
        wait: bool,
    },
    /// Print (or write) an admin kubeconfig.
    #[command(after_help = "Examples:
  flotilla cluster kubeconfig prod --file prod.kubeconfig
  flotilla cluster kubeconfig prod --exec --file prod-exec.kubeconfig")]
    Kubeconfig {
        /// Cluster name.
        name: String,
        /// Write it to this file (mode 0600) instead of standard output.
        #[arg(long)]
        file: Option<PathBuf>,
        /// Authenticate through `flotilla cluster token` (kubectl's exec plugin, as EKS's
        /// `aws eks get-token`) instead of embedding a client certificate; needs --config.
        #[arg(long)]
        exec: bool,
    },
    /// Write a backup of a cluster to a file: its settings, node pools, credentials (CA and
    /// signing keys) and every object, read at one store revision, sealed under the service's
    /// key-encryption key.
    #[command(after_help = "Example:\n  flotilla cluster backup prod --file prod.flotilla-backup")]
    Backup {
        /// Cluster name (it must be ACTIVE).
        name: String,
        /// The file to write (mode 0600).
        #[arg(long)]
        file: PathBuf,
    },
    /// Make a cluster from a backup file: under its own name, in its own account, it comes
    /// back with its id and credentials (old kubeconfigs work again); with --name it is a
    /// copy with a new id and credentials of its own. A truncated, corrupted or foreign file
    /// is refused and nothing is written.
    #[command(after_help = "Examples:
  flotilla cluster restore --file prod.flotilla-backup --wait
  flotilla cluster restore --file prod.flotilla-backup --name prod-copy --wait")]
    Restore {
        /// The backup file.
        #[arg(long)]
        file: PathBuf,
        /// The new cluster's name (default: the backed-up cluster's).
        #[arg(long)]
        name: Option<String>,
        /// Wait until it is ACTIVE.
        #[arg(long)]
        wait: bool,
    },
    /// Print a 15-minute admin token as a kubectl ExecCredential.
    #[command(
        after_help = "Example (what kubectl's exec plugin runs):\n  flotilla cluster token prod"
    )]
    Token {
        /// Cluster name.
        name: String,
    },
}

/// `flotilla cluster create`.
#[derive(Debug, clap::Args)]
pub struct ClusterCreateArgs {
    /// Cluster name (a DNS label of at most 40 characters).
    pub name: String,
    /// Kubernetes minor version.
    #[arg(long)]
    pub version: Option<String>,
    /// Service ClusterIP range.
    #[arg(long)]
    pub service_cidr: Option<String>,
    /// Pod network.
    #[arg(long)]
    pub pod_cidr: Option<String>,
    /// CIDRs allowed to reach the public endpoint (repeatable).
    #[arg(long = "public-access-cidr")]
    pub public_access_cidrs: Vec<String>,
    /// Tags as key=value (repeatable).
    #[arg(long = "tag", value_parser = parse_key_value)]
    pub tags: Vec<(String, String)>,
    /// Cloud region.
    #[arg(long)]
    pub region: Option<String>,
    /// Subnet ids (repeatable).
    #[arg(long = "subnet")]
    pub subnets: Vec<String>,
    /// Cloud API endpoint override (e.g. LocalStack).
    #[arg(long)]
    pub cloud_endpoint: Option<String>,
    /// The VPC of the cluster's cloud resources.
    #[arg(long)]
    pub vpc_id: Option<String>,
    /// Security groups of the cluster's instances (repeatable).
    #[arg(long = "security-group")]
    pub security_groups: Vec<String>,
    /// A role the cloud controllers assume for every cloud call.
    #[arg(long, conflicts_with = "cloud_access_key_id")]
    pub role_arn: Option<String>,
    /// Access key id of static cloud credentials (the secret comes from
    /// FLOTILLA_CLOUD_SECRET_ACCESS_KEY, so it stays out of process listings).
    #[arg(long, requires = "cloud_secret_access_key")]
    pub cloud_access_key_id: Option<String>,
    /// The secret of --cloud-access-key-id.
    #[arg(
        long,
        env = "FLOTILLA_CLOUD_SECRET_ACCESS_KEY",
        hide_env_values = true,
        hide = true
    )]
    pub cloud_secret_access_key: Option<String>,
    /// The cluster's Pod Security defaults.
    #[command(flatten)]
    pub pod_security: PodSecurityArgs,
    /// The cluster's own audit policy (an `audit.k8s.io/v1` `Policy` file, YAML or JSON).
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,
    /// Idempotency token: a retry with the same token returns the same cluster.
    #[arg(long)]
    pub client_request_token: Option<String>,
    /// Wait until the cluster is ACTIVE.
    #[arg(long)]
    pub wait: bool,
}

/// The Pod Security defaults of a cluster (namespaces that label no level get these).
#[derive(Debug, Default, clap::Args)]
pub struct PodSecurityArgs {
    /// Pod Security level enforced where a namespace sets none: privileged (default),
    /// baseline or restricted, optionally with the standards' version (`baseline:v1.33`).
    #[arg(long, value_name = "LEVEL[:VERSION]")]
    pub pod_security_enforce: Option<String>,
    /// Pod Security level recorded in audit annotations (as --pod-security-enforce).
    #[arg(long, value_name = "LEVEL[:VERSION]")]
    pub pod_security_audit: Option<String>,
    /// Pod Security level warned about (as --pod-security-enforce).
    #[arg(long, value_name = "LEVEL[:VERSION]")]
    pub pod_security_warn: Option<String>,
    /// A namespace Pod Security never checks (repeatable; on update, the list replaces the
    /// cluster's).
    #[arg(long = "pod-security-exempt-namespace")]
    pub pod_security_exempt_namespaces: Vec<String>,
}

/// `flotilla cluster update`: what changes in place (as EKS's `update-cluster-config`).
#[derive(Debug, clap::Args)]
pub struct ClusterUpdateArgs {
    /// Cluster name.
    pub name: String,
    /// CIDRs allowed to reach the public endpoint (repeatable; replaces the cluster's).
    #[arg(long = "public-access-cidr")]
    pub public_access_cidrs: Vec<String>,
    /// Tags to set, as key=value (repeatable).
    #[arg(long = "tag", value_parser = parse_key_value)]
    pub tags: Vec<(String, String)>,
    /// Tags to remove, by key (repeatable).
    #[arg(long = "remove-tag")]
    pub remove_tags: Vec<String>,
    /// Pod Security defaults to change (the ones not given stay as they are).
    #[command(flatten)]
    pub pod_security: PodSecurityArgs,
    /// A new audit policy for the cluster (an `audit.k8s.io/v1` `Policy` file).
    #[arg(long, conflicts_with = "remove_audit_policy")]
    pub audit_policy_file: Option<PathBuf>,
    /// Remove the cluster's own audit policy (the operator's alone applies).
    #[arg(long)]
    pub remove_audit_policy: bool,
    /// Wait until the cluster is ACTIVE again.
    #[arg(long)]
    pub wait: bool,
}

/// `flotilla nodepool …`.
#[derive(Debug, Subcommand)]
pub enum NodePoolCommand {
    /// Create a node pool.
    #[command(after_help = "Example:
  flotilla nodepool create prod workers --instance-type t3.large --min 1 --max 5 --desired 3 \\
    --label tier=web --taint dedicated=gpu:NO_SCHEDULE --wait")]
    Create(NodePoolCreateArgs),
    /// List a cluster's node pools.
    #[command(after_help = "Example:\n  flotilla nodepool list prod")]
    List {
        /// Cluster name.
        cluster: String,
    },
    /// Change a node pool's size.
    #[command(
        after_help = "Example:\n  flotilla nodepool scale prod workers --desired 5 --max 8 --wait"
    )]
    Scale {
        /// Cluster name.
        cluster: String,
        /// Node pool name.
        name: String,
        /// Nodes wanted.
        #[arg(long)]
        desired: u32,
        /// Fewest nodes (default: unchanged, lowered to --desired if needed).
        #[arg(long)]
        min: Option<u32>,
        /// Most nodes (default: unchanged, raised to --desired if needed).
        #[arg(long)]
        max: Option<u32>,
        /// Wait until the pool is ACTIVE again.
        #[arg(long)]
        wait: bool,
    },
    /// Delete a node pool.
    #[command(after_help = "Example:\n  flotilla nodepool delete prod workers --wait")]
    Delete {
        /// Cluster name.
        cluster: String,
        /// Node pool name.
        name: String,
        /// Wait until it is gone.
        #[arg(long)]
        wait: bool,
    },
}

/// `flotilla nodepool create`.
#[derive(Debug, clap::Args)]
pub struct NodePoolCreateArgs {
    /// Cluster name.
    pub cluster: String,
    /// Node pool name.
    pub name: String,
    /// Instance type (repeatable).
    #[arg(long = "instance-type")]
    pub instance_types: Vec<String>,
    /// Machine image id.
    #[arg(long)]
    pub image: Option<String>,
    /// Fewest nodes.
    #[arg(long, default_value_t = 1)]
    pub min: u32,
    /// Most nodes.
    #[arg(long, default_value_t = 2)]
    pub max: u32,
    /// Nodes wanted.
    #[arg(long, default_value_t = 2)]
    pub desired: u32,
    /// Node labels as key=value (repeatable).
    #[arg(long = "label", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
    /// Node taints as key[=value]:EFFECT (repeatable), e.g. dedicated=gpu:NO_SCHEDULE.
    #[arg(long = "taint")]
    pub taints: Vec<String>,
    /// Subnet ids (repeatable; default the cluster's).
    #[arg(long = "subnet")]
    pub subnets: Vec<String>,
    /// Idempotency token.
    #[arg(long)]
    pub client_request_token: Option<String>,
    /// Wait until the pool is ACTIVE.
    #[arg(long)]
    pub wait: bool,
}

fn parse_key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected key=value, got {text:?}")),
    }
}

/// What the `flotilla` binary's `main` does with a parsed command line: sets up logging, runs
/// the command on a new runtime, and turns the outcome into the exit code (1 with one line on
/// standard error). It lives here rather than in the binary so that the runtime's `block_on`,
/// and with it the poll functions of every async state machine the command drives, is compiled
/// once, in this crate: in the binary's crate they took 250 CPU-s of a cold release build.
pub fn main_with(cli: Cli) -> std::process::ExitCode {
    let default_filter = match &cli.command {
        Command::Kubelet(_) => flotilla_kubelet::DEFAULT_LOG_FILTER,
        Command::Proxy(_) => flotilla_proxy::command::DEFAULT_LOG_FILTER,
        _ => "info",
    };
    flotilla_logging::init(&cli.log, default_filter);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Kubelet(args) => flotilla_kubelet::run_until_signalled(args).await,
        Command::Proxy(args) => flotilla_proxy::command::run_until_signalled(args).await,
        Command::Version(args) => version::print(&args).await,
        Command::Completion { shell } => {
            completion::write(shell, &mut std::io::stdout());
            Ok(())
        }
        Command::Up(args) => service::up(args).await,
        Command::Serve(args) => service::serve(args).await,
        Command::Account { client, command } => commands::account(&client, command).await,
        Command::Cluster { client, command } => commands::cluster(&client, command).await,
        Command::Nodepool { client, command } => commands::node_pool(&client, command).await,
        Command::SimulateNodes(args) => simulator::run(args).await,
        Command::CloudController(args) => cloud::standalone(args).await,
        Command::Scheduler(args) => {
            standalone::run(args, "kube-scheduler", flotilla_scheduler::run).await
        }
        Command::ControllerManager(args) => {
            let config = standalone::controller_manager_config(&args)?;
            standalone::run(args.standalone, "kube-controller-manager", move |client| {
                flotilla_controller_manager::run(client, config.clone())
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn byte_quotas_are_whole_quantities() {
        assert_eq!(super::parse_byte_quantity("1Gi"), Ok(1 << 30));
        assert_eq!(super::parse_byte_quantity("500M"), Ok(500_000_000));
        assert_eq!(super::parse_byte_quantity("0"), Ok(0));
        for bad in ["1.5", "-1Gi", "lots", "100m"] {
            assert!(super::parse_byte_quantity(bad).is_err(), "{bad}");
        }
    }

    /// Every command a user can run (the tree's leaves and the groups above them) ends its
    /// `--help` with an example.
    #[test]
    fn every_command_help_has_an_example() {
        fn check(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for sub in command.get_subcommands() {
                let path = format!("{path} {}", sub.get_name());
                let help = sub
                    .get_after_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                if !help.contains("Example") {
                    missing.push(path.clone());
                }
                check(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        check(&Cli::command(), "flotilla", &mut missing);
        assert!(missing.is_empty(), "no example in --help of: {missing:?}");
    }
}
