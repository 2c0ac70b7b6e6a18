//! The Flotilla service: `flotilla up` (one machine, embedded store, a `demo` cluster) and
//! `flotilla serve` (the hosted service on etcd), wiring storage, the API server, the
//! management API and TLS.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use flotilla_api_machinery::cidr::Cidr;
use flotilla_apiserver::audit::log::LogOptions;
use flotilla_apiserver::audit::webhook::WebhookOptions;
use flotilla_apiserver::audit::{AuditOptions, Auditor, Policy as AuditPolicy};
use flotilla_apiserver::kubelet::KubeletNetworks;
use flotilla_apiserver::limits::TenantLimits;
use flotilla_apiserver::pki::CertificateAuthority;
use flotilla_apiserver::serve::ServerConfig;
use flotilla_apiserver::storage::encryption::kms::KmsProvider;
use flotilla_apiserver::storage::encryption::{self, EncryptedStorage};
use flotilla_apiserver::storage::envelope::KeyEncryptionKey;
use flotilla_apiserver::{ApiServer, ServerOptions};
use flotilla_management::model::{CreateClusterRequest, HealthIssue};
use flotilla_management::{Management, PublicEndpoint};
use flotilla_storage::{EmbeddedStorage, EtcdStorage, Storage};
use k8s_openapi::api::core::v1::Event;
use tokio::net::TcpListener;

use crate::client::ClientConfig;
use crate::localnodes::LocalNodes;
use crate::placement::{self, PlacementConfig};
use crate::private_files::{self, write_private};
use crate::{AuditArgs, ServeArgs, UpArgs};

/// How often old revisions are compacted away (kube-apiserver's default interval).
const COMPACTION_INTERVAL: Duration = Duration::from_secs(300);

/// Where the service's serving CA is kept, shared by every replica.
const SERVING_CA_KEY: &str = "/flotilla/pki/serving-ca";

/// The cluster `flotilla up` creates.
const DEMO_CLUSTER: &str = "demo";
/// The account `flotilla up` creates it in, whose API key it writes for the CLI.
const LOCAL_ACCOUNT: &str = "default";
/// Upstream's leader-election lease duration.
const DEFAULT_LEASE: Duration = Duration::from_secs(15);
/// How long `flotilla up` waits for the demo cluster's control plane.
const DEMO_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The store as the service opened it.
struct OpenedStorage {
    storage: Arc<dyn Storage>,
    /// The encryption configuration's KMS providers (for the `kms-providers` health check).
    kms_providers: Vec<Arc<KmsProvider>>,
}

/// The store, behind encryption at rest when an `EncryptionConfiguration` is given.
async fn open_storage(
    etcd: &[String],
    data_dir: Option<&Path>,
    encryption: Option<&Path>,
) -> anyhow::Result<OpenedStorage> {
    // The file is read first: a bad one stops the service before it touches the store.
    let rules = encryption
        .map(encryption::load)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let storage = open_backend(etcd, data_dir).await?;
    Ok(match rules {
        Some(rules) => {
            tracing::info!(rules = rules.len(), "encryption at rest is on");
            let encrypted = EncryptedStorage::new(storage, rules);
            OpenedStorage {
                kms_providers: encrypted.kms_providers(),
                storage: Arc::new(encrypted),
            }
        }
        None => OpenedStorage {
            storage,
            kms_providers: Vec::new(),
        },
    })
}

async fn open_backend(
    etcd: &[String],
    data_dir: Option<&Path>,
) -> anyhow::Result<Arc<dyn Storage>> {
    if !etcd.is_empty() {
        let storage = EtcdStorage::connect(etcd, None)
            .await
            .context("connecting to etcd")?;
        // Watches of one resource (a cluster's kind, watched by its scheduler, controllers,
        // kubelets and users alike) share one etcd watch: its watch cache's.
        return Ok(Arc::new(storage));
    }
    let Some(dir) = data_dir else {
        bail!("no storage: give --etcd or --data-dir");
    };
    let path = dir.join("store.redb");
    let opened = path.clone();
    let storage = tokio::task::spawn_blocking(move || EmbeddedStorage::open(&opened))
        .await
        .context("opening the embedded store")?
        .context("opening the embedded store")?;
    // redb creates the file with the process's umask; the directory is private already.
    private_files::make_private(&path)?;
    Ok(Arc::new(storage))
}

/// The serving CA every replica shares: loaded from storage, or created there once. Its
/// record is sealed under the key-encryption key; one stored before sealing is sealed now.
async fn serving_ca(
    storage: &Arc<dyn Storage>,
    key_encryption: &KeyEncryptionKey,
) -> anyhow::Result<CertificateAuthority> {
    let open = |value: &[u8]| -> anyhow::Result<(CertificateAuthority, bool)> {
        let opened = key_encryption.open(value, SERVING_CA_KEY)?;
        let ca =
            serde_json::from_slice(opened.bytes()).context("stored serving CA is unreadable")?;
        Ok((ca, opened.is_plain()))
    };
    let seal = |ca: &CertificateAuthority| -> anyhow::Result<Bytes> {
        Ok(Bytes::from(
            key_encryption.seal(&serde_json::to_vec(ca)?, SERVING_CA_KEY)?,
        ))
    };
    if let Some(kv) = storage.get(SERVING_CA_KEY).await? {
        let (ca, plain) = open(&kv.value)?;
        if plain {
            match storage
                .update(SERVING_CA_KEY, seal(&ca)?, kv.mod_revision)
                .await?
            {
                flotilla_storage::Outcome::Done(_) => {
                    tracing::warn!("the serving CA was stored unsealed; sealed it")
                }
                flotilla_storage::Outcome::Conflict(_) => {}
            }
        }
        return Ok(ca);
    }
    let ca = CertificateAuthority::generate("flotilla-serving-ca")?;
    match storage.create(SERVING_CA_KEY, seal(&ca)?).await? {
        flotilla_storage::Outcome::Done(_) => Ok(ca),
        // Another replica created it first: use theirs.
        flotilla_storage::Outcome::Conflict(Some(kv)) => Ok(open(&kv.value)?.0),
        flotilla_storage::Outcome::Conflict(None) => {
            bail!("serving CA vanished while being created")
        }
    }
}

fn serving_hosts(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if !listen.ip().is_unspecified() {
        hosts.push(listen.ip().to_string());
    }
    hosts.extend(extra.iter().cloned());
    hosts.dedup();
    hosts
}

/// Compacts history older than one interval, on every interval (kube-apiserver's scheme:
/// compact to the revision seen at the previous tick).
fn spawn_compactor(storage: Arc<dyn Storage>) {
    tokio::spawn(async move {
        let mut previous = None;
        let mut ticker = tokio::time::interval(COMPACTION_INTERVAL);
        loop {
            ticker.tick().await;
            if let Some(revision) = previous
                && let Err(err) = storage.compact(revision).await
            {
                tracing::warn!(%err, revision, "compaction failed");
            }
            previous = storage.current_revision().await.ok();
        }
    });
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

/// A bound, configured service, not yet serving.
struct Started {
    listener: TcpListener,
    /// More addresses serving the same APIs (the local nodes' fabric).
    extra_listeners: Vec<TcpListener>,
    tls: Arc<ServerConfig>,
    management: Arc<Management>,
    router: axum::Router,
    /// `https://host:port`: what clients put in front of `/v1/…` and `/clusters/{id}`.
    public_url: String,
    serving_ca: CertificateAuthority,
}

#[allow(clippy::too_many_arguments)]
async fn start(
    opened: OpenedStorage,
    key_encryption: KeyEncryptionKey,
    listen: SocketAddr,
    also_listen_on: Option<std::net::IpAddr>,
    extra_sans: &[String],
    public_url: Option<String>,
    limits: TenantLimits,
    placement_options: PlacementOptions,
    networks: Networks,
    audit: Arc<Auditor>,
) -> anyhow::Result<Started> {
    let OpenedStorage {
        storage,
        kms_providers,
    } = opened;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = listener.local_addr()?;
    let public_url = public_url.unwrap_or_else(|| default_public_url(local, extra_sans));
    let mut extra_listeners = Vec::new();
    let mut sans = extra_sans.to_vec();
    if let Some(ip) = also_listen_on {
        let address = SocketAddr::new(ip, local.port());
        extra_listeners.push(
            TcpListener::bind(address)
                .await
                .with_context(|| format!("listening on {address}"))?,
        );
        sans.push(ip.to_string());
    }
    let ca = serving_ca(&storage, &key_encryption).await?;
    // The service's own addresses are never a kubelet's, whatever a tenant's Node says.
    let mut own: Vec<std::net::IpAddr> = sans.iter().filter_map(|s| s.parse().ok()).collect();
    own.push(local.ip());
    let server = ApiServer::with_options(
        storage.clone(),
        ServerOptions {
            advertise_address: local.to_string(),
            public_url: public_url.clone(),
            limits,
            serving_ca_pem: ca.cert_pem.clone(),
            key_encryption: Arc::new(key_encryption),
            kubelet_networks: KubeletNetworks {
                allowed: networks.nodes,
                own,
            },
            private_networks: networks.private,
            audit,
            kms_providers,
        },
    );
    // Tenant records changed through any replica (deletions, endpoint access) apply here at once.
    tokio::spawn({
        let server = server.clone();
        async move { server.tenants.follow_records().await }
    });
    let serving = ca.issue_serving("flotilla", &serving_hosts(local, &sans))?;
    let chain = format!("{}{}", serving.cert_pem, ca.cert_pem);
    let tls = flotilla_apiserver::serve::server_config(&chain, &serving.key_pem)?;
    let management = Management::new(
        server.clone(),
        PublicEndpoint {
            base_url: public_url.trim_end_matches('/').to_string(),
            ca_pem: ca.cert_pem.clone(),
        },
    );
    management
        .seal_stored_records()
        .await
        .context("sealing the management records")?;
    management.spawn_reconciler();
    // The management API owns `/v1/…`; everything else is the API server's. The console
    // (`/console/…`) is a client of both, through that router in memory.
    let apis = management.router().merge(server.router());
    let console = flotilla_console::Console::new(
        apis.clone(),
        browser_address,
        &management
            .console_session_key()
            .await
            .context("making the console's session key")?,
    );
    let router = console.router().merge(apis);
    let identity = placement_options
        .replica_id
        .clone()
        .unwrap_or_else(|| default_replica_id(local));
    if placement_options.enabled {
        // The controllers' queues are reported with the service's metrics (the operator's).
        server.add_metrics_source(flotilla_controller_manager::workqueue::render_metrics);
        placement::spawn(
            server.clone(),
            server.router(),
            PlacementConfig {
                identity,
                lease_duration: placement_options.lease_duration,
                retry_period: (placement_options.lease_duration / 5)
                    .max(Duration::from_millis(200)),
                root_ca_pem: ca.cert_pem.clone(),
                management: management.clone(),
                node_join_timeout: placement_options.node_join_timeout,
                sole_replica: placement_options.sole_replica,
                park_idle_after: placement_options.park_idle_after,
            },
        );
    }
    spawn_compactor(storage);
    Ok(Started {
        listener,
        extra_listeners,
        tls,
        management,
        router,
        public_url,
        serving_ca: ca,
    })
}

/// What the console's calls carry of a browser request: its address, so a cluster's endpoint
/// access rules apply to the browser as if it called the cluster itself.
fn browser_address(extensions: &http::Extensions) -> http::Extensions {
    let mut kept = http::Extensions::new();
    if let Some(address) = extensions.get::<flotilla_apiserver::serve::ClientAddress>() {
        kept.insert(*address);
    }
    kept
}

/// The networks the service distinguishes.
struct Networks {
    /// Where kubelets live (empty: the private ranges).
    nodes: Vec<Cidr>,
    /// What a cluster's private endpoint answers.
    private: Vec<Cidr>,
}

/// How this replica takes part in running clusters' control loops.
struct PlacementOptions {
    replica_id: Option<String>,
    lease_duration: Duration,
    /// Whether this process runs the clusters' control loops at all.
    enabled: bool,
    /// How long a node pool's instance may run without its Node.
    node_join_timeout: Duration,
    /// The store admits one process (the embedded store): no other replica can be live.
    sole_replica: bool,
    /// How long a cluster's loops may be idle before they are parked.
    park_idle_after: Option<Duration>,
}

/// `host_port_random`: unique among replicas, and names the replica for a reader.
fn default_replica_id(local: SocketAddr) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "flotilla".into());
    let suffix: u32 = rand_suffix();
    format!("{host}_{}_{suffix:08x}", local.port())
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    nanos ^ std::process::id().rotate_left(16)
}

impl Started {
    /// Serves both APIs until SIGINT or SIGTERM.
    async fn serve(self) {
        for listener in self.extra_listeners {
            tokio::spawn(flotilla_apiserver::serve::serve_tls(
                listener,
                self.tls.clone(),
                self.router.clone(),
                shutdown_signal(),
            ));
        }
        flotilla_apiserver::serve::serve_tls(
            self.listener,
            self.tls,
            self.router,
            shutdown_signal(),
        )
        .await;
    }
}

/// `https://host:port` for a listener: the first extra SAN, else its address (loopback when
/// it listens on every interface).
fn default_public_url(local: SocketAddr, extra_sans: &[String]) -> String {
    let host = match extra_sans.first() {
        Some(san) => san.clone(),
        None if local.ip().is_unspecified() => "127.0.0.1".to_string(),
        None => local.ip().to_string(),
    };
    let host = if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]")
    } else {
        host
    };
    format!("https://{host}:{}", local.port())
}

pub(crate) async fn up(args: UpArgs) -> anyhow::Result<()> {
    private_files::prepare_data_dir(&args.data_dir)?;
    let key_encryption = private_files::key_encryption_key(
        &args
            .key_encryption_key_file
            .clone()
            .unwrap_or_else(|| args.data_dir.join(private_files::DATA_DIR_KEK)),
    )?;
    let storage = open_storage(
        &args.etcd,
        Some(&args.data_dir),
        args.encryption_provider_config.as_deref(),
    )
    .await?;
    let plan = NodePlan::for_flag(args.nodes);
    let mut no_nodes_reason = plan.missing_summary();
    let local_nodes = match plan.count {
        0 => None,
        count => match LocalNodes::prepare(&args.data_dir, count) {
            Ok(nodes) => Some(nodes),
            // Asked for: a failure is the command's. By default: the control plane alone.
            Err(err) if plan.asked => return Err(err.context("preparing the local nodes")),
            Err(err) => {
                no_nodes_reason = Some(format!("{err:#}"));
                None
            }
        },
    };
    if let Some(reason) = &no_nodes_reason {
        eprintln!(
            "flotilla up: no local node ({reason}); pods stay Pending until a node joins \
             (--nodes 0 runs the control plane alone and silences this)"
        );
    }
    let fabric_ip = match &local_nodes {
        Some(nodes) => Some(
            nodes
                .host_ip
                .parse::<std::net::IpAddr>()
                .context("the fabric's host address")?,
        ),
        None => None,
    };
    // Local nodes' kubelets live on the fabric (without nodes: the private ranges), and the
    // fabric is the private network a private endpoint answers, with any given.
    let fabric = match fabric_ip {
        Some(ip) => vec![format!("{ip}/24").parse::<Cidr>()?],
        None => Vec::new(),
    };
    let networks = Networks {
        nodes: fabric.clone(),
        private: fabric
            .into_iter()
            .chain(args.private_networks.clone())
            .collect(),
    };
    // One user on one machine: no per-cluster request limit, streams only if asked.
    let limits = TenantLimits {
        max_streams: (args.tenant_max_streams > 0).then_some(args.tenant_max_streams),
        ..TenantLimits::UNLIMITED
    };
    let started = start(
        storage,
        key_encryption,
        args.listen,
        fabric_ip,
        &[],
        None,
        limits,
        PlacementOptions {
            replica_id: None,
            lease_duration: DEFAULT_LEASE,
            enabled: !args.external_control_loops,
            node_join_timeout: Duration::from_secs(args.node_join_timeout_seconds),
            sole_replica: args.etcd.is_empty(),
            // One cluster on one machine: nothing to gain.
            park_idle_after: None,
        },
        networks,
        Arc::new(auditor(&args.audit).await?),
    )
    .await?;
    let management = &started.management;

    // The local operator, a `default` account with an API key for the CLI, and `demo`.
    operator_config(management, &args.data_dir.join("operator.json"), &started).await?;
    management.ensure_account(LOCAL_ACCOUNT).await?;
    let client_config = args.data_dir.join("flotilla.json");
    if !client_config.exists() {
        let key = management.issue_api_key(LOCAL_ACCOUNT).await?;
        write_client_config(&client_config, &started, key.api_key)?;
    }
    let kubeconfig = demo_kubeconfig(management).await?;
    let path = args.data_dir.join("kubeconfig");
    write_private(&path, &kubeconfig)?;
    let kubeconfig_path = std::fs::canonicalize(&path).unwrap_or(path);
    let client_config = std::fs::canonicalize(&client_config).unwrap_or(client_config);
    // Why `kubectl get nodes` is empty, where a user looks: the cluster's health (set before
    // `up` says it is ready) and an Event (recorded once the API serves).
    let issues = match (&no_nodes_reason, plan.asked) {
        (Some(reason), false) => vec![no_local_nodes_issue(reason)],
        _ => Vec::new(),
    };
    management
        .report_cluster_health(LOCAL_ACCOUNT, DEMO_CLUSTER, issues.clone())
        .await?;
    if let Some(issue) = issues.into_iter().next() {
        tokio::spawn(record_no_nodes_event(kubeconfig.clone(), issue));
    }
    print!(
        "{}",
        UpSummary {
            kubeconfig: &kubeconfig_path,
            public_url: &started.public_url,
            client_config: &client_config,
            data_dir: &args.data_dir,
        }
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    let (Some(mut nodes), Some(fabric_ip)) = (local_nodes, fabric_ip) else {
        started.serve().await;
        return Ok(());
    };
    // The nodes join a serving API: start them while serving, stop them once it ends.
    let management = started.management.clone();
    let node_start = start_local_nodes(
        &mut nodes,
        started.management.clone(),
        started.serving_ca.cert_pem.clone(),
        started.listener.local_addr()?.port(),
        &kubeconfig,
        fabric_ip,
    );
    let serve = started.serve();
    tokio::pin!(serve);
    let started_nodes = tokio::select! {
        _ = &mut serve => Ok(false),
        outcome = node_start => outcome.map(|()| true),
    };
    match started_nodes {
        Ok(true) => serve.await,
        Ok(false) => {}
        // Dropping `nodes` stops them, on this path and the others.
        Err(err) if plan.asked => return Err(err.context("starting the local nodes")),
        // The default node: say why there is none and keep serving the control plane.
        Err(err) => {
            drop(nodes);
            let reason = format!("starting it failed: {err:#}");
            eprintln!("flotilla up: no local node ({reason})");
            let issue = no_local_nodes_issue(&reason);
            management
                .report_cluster_health(LOCAL_ACCOUNT, DEMO_CLUSTER, vec![issue.clone()])
                .await?;
            tokio::spawn(record_no_nodes_event(kubeconfig, issue));
            serve.await;
        }
    }
    Ok(())
}

/// How many local nodes `up` runs: `--nodes` when given, else one when this machine can.
struct NodePlan {
    count: u8,
    /// `--nodes` was given (a failure to start them is an error, not a notice).
    asked: bool,
    /// What this machine lacks, when it cannot run the default node.
    missing: Vec<String>,
}

impl NodePlan {
    fn for_flag(nodes: Option<u8>) -> Self {
        match nodes {
            Some(count) => NodePlan {
                count,
                asked: true,
                missing: Vec::new(),
            },
            None => {
                let missing = crate::localnodes::missing_requirements();
                NodePlan {
                    count: u8::from(missing.is_empty()),
                    asked: false,
                    missing,
                }
            }
        }
    }

    /// What is missing and how to install it, in one line; `None` when nothing is.
    fn missing_summary(&self) -> Option<String> {
        (!self.missing.is_empty()).then(|| {
            format!(
                "this machine lacks {}; as root: {}",
                self.missing.join(", "),
                crate::localnodes::INSTALL_COMMAND
            )
        })
    }
}

/// The `health.issues[]` entry of a `demo` cluster without a node.
fn no_local_nodes_issue(reason: &str) -> HealthIssue {
    HealthIssue {
        code: "NoLocalNodes".into(),
        message: format!("flotilla up runs no node on this machine: {reason}"),
        resource_ids: Vec::new(),
    }
}

/// A Warning Event `NoLocalNodes` in `default` (what `kubectl get events` shows beside an
/// empty `kubectl get nodes`), replaced on every start. Best effort: the health issue says
/// the same.
async fn record_no_nodes_event(admin_kubeconfig: String, issue: HealthIssue) {
    let recorded = async {
        let config = kube::config::Kubeconfig::from_yaml(&admin_kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(config, &Default::default()).await?;
        let events: kube::Api<Event> =
            kube::Api::namespaced(kube::Client::try_from(config)?, "default");
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let event: Event = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "flotilla-up.no-local-nodes", "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Namespace", "name": "default"},
            "reason": issue.code,
            "message": issue.message,
            "type": "Warning",
            "source": {"component": "flotilla-up"},
            "reportingComponent": "flotilla-up",
            "reportingInstance": "flotilla-up",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
        }))?;
        let _ = events
            .delete(
                &event.metadata.name.clone().unwrap_or_default(),
                &Default::default(),
            )
            .await;
        events.create(&Default::default(), &event).await?;
        anyhow::Ok(())
    };
    if let Err(err) = recorded.await {
        tracing::warn!(err = %format!("{err:#}"), "recording the NoLocalNodes event");
    }
}

/// What `flotilla up` prints on standard output once the cluster answers, in this order.
struct UpSummary<'a> {
    kubeconfig: &'a Path,
    public_url: &'a str,
    client_config: &'a Path,
    data_dir: &'a Path,
}

impl std::fmt::Display for UpSummary<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kubeconfig = self.kubeconfig.display();
        let client_config = self.client_config.display();
        writeln!(f, "{kubeconfig}")?;
        writeln!(f, "export KUBECONFIG={kubeconfig}")?;
        writeln!(
            f,
            "API endpoint: {}/clusters/{DEMO_CLUSTER}",
            self.public_url
        )?;
        writeln!(f, "Management endpoint: {}/v1/", self.public_url)?;
        writeln!(
            f,
            "Console: {}/console/ (sign in with the apiKey of {client_config})",
            self.public_url
        )?;
        writeln!(
            f,
            "Client configuration: {client_config} (export FLOTILLA_CONFIG={client_config})"
        )?;
        writeln!(
            f,
            "Stop with Ctrl-C (or SIGTERM); {} keeps everything for the next `flotilla up`",
            self.data_dir.display()
        )
    }
}

/// Starts the local nodes of `up --nodes` against the demo cluster, which they reach on the
/// fabric at `fabric_ip`.
async fn start_local_nodes(
    nodes: &mut LocalNodes,
    management: Arc<Management>,
    ca_pem: String,
    port: u16,
    admin_kubeconfig: &str,
    fabric_ip: std::net::IpAddr,
) -> anyhow::Result<()> {
    let server = format!("https://{fabric_ip}:{port}/clusters/{DEMO_CLUSTER}");
    let admin = kube::config::Kubeconfig::from_yaml(admin_kubeconfig)?;
    let admin = kube::Config::from_custom_kubeconfig(admin, &Default::default()).await?;
    let client = kube::Client::try_from(admin)?;
    let proxy = management
        .user_kubeconfig(LOCAL_ACCOUNT, DEMO_CLUSTER, "system:kube-proxy", &[])
        .await?;
    let mut proxy = kube::config::Kubeconfig::from_yaml(&proxy)?;
    for cluster in &mut proxy.clusters {
        if let Some(cluster) = &mut cluster.cluster {
            cluster.server = Some(server.clone());
        }
    }
    let proxy = serde_yaml::to_string(&proxy)?;
    nodes.start(client, &server, &ca_pem, &proxy).await
}

/// Creates the `demo` cluster once (it keeps the id `demo`, so its URL is stable), waits
/// until it is ACTIVE and returns an admin kubeconfig for it.
async fn demo_kubeconfig(management: &Management) -> anyhow::Result<String> {
    let request: CreateClusterRequest =
        serde_json::from_value(serde_json::json!({ "name": DEMO_CLUSTER }))?;
    match management
        .create_cluster_with_id(LOCAL_ACCOUNT, request, Some(DEMO_CLUSTER))
        .await
    {
        Ok(_) => {}
        // A restart: it exists already.
        Err(err) if err.status == http::StatusCode::CONFLICT => {}
        Err(err) => return Err(err.into()),
    }
    let deadline = tokio::time::Instant::now() + DEMO_READY_TIMEOUT;
    loop {
        match management.kubeconfig(LOCAL_ACCOUNT, DEMO_CLUSTER).await {
            Ok(config) => return Ok(config),
            Err(err) if tokio::time::Instant::now() >= deadline => {
                bail!("the demo cluster did not become ACTIVE: {err}")
            }
            // The reconciler was nudged by the create; it has not finished yet.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Registers the operator token of the client configuration at `path`, creating the file
/// with a new token first if it does not exist; the endpoint and CA are kept current.
async fn operator_config(
    management: &Management,
    path: &Path,
    started: &Started,
) -> anyhow::Result<()> {
    let token = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str::<ClientConfig>(&text)
            .with_context(|| format!("{} is not a client configuration", path.display()))?
            .api_key
            .with_context(|| format!("{} has no apiKey", path.display()))?,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Management::new_operator_token(),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    management
        .register_operator_token(&token)
        .await
        .with_context(|| format!("registering the operator token of {}", path.display()))?;
    write_client_config(path, started, token)
}

/// Writes a client configuration (mode 0600: it holds a bearer token).
fn write_client_config(path: &Path, started: &Started, api_key: String) -> anyhow::Result<()> {
    let config = ClientConfig {
        endpoint: Some(started.public_url.clone()),
        api_key: Some(api_key),
        ca_pem: Some(started.serving_ca.cert_pem.clone()),
    };
    write_private(path, &serde_json::to_string_pretty(&config)?)
}

/// The audit backends and policy the flags name; a policy or backend that cannot be used
/// stops the service before it serves.
async fn auditor(args: &AuditArgs) -> anyhow::Result<Auditor> {
    let policy =
        match &args.audit_policy_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--audit-policy-file {}", path.display()))?;
                Some(AuditPolicy::parse(&text).map_err(|why| {
                    anyhow::anyhow!("--audit-policy-file {}: {why}", path.display())
                })?)
            }
            None => None,
        };
    let options = AuditOptions {
        policy,
        log: args.audit_log_path.clone().map(|path| LogOptions {
            path,
            max_size_mb: args.audit_log_maxsize,
            max_backups: args.audit_log_maxbackup,
            max_age_days: args.audit_log_maxage,
        }),
        webhook: args
            .audit_webhook_config_file
            .clone()
            .map(|file| WebhookOptions {
                buffer_size: args.audit_webhook_batch_buffer_size,
                max_batch_size: args.audit_webhook_batch_max_size.max(1),
                max_batch_wait: args.audit_webhook_batch_max_wait,
                initial_backoff: args.audit_webhook_initial_backoff,
                ..WebhookOptions::new(file)
            }),
    };
    Auditor::start(options).await.map_err(anyhow::Error::msg)
}

pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // The store first: a bad encryption configuration stops the service before it writes a
    // key-encryption key file.
    let storage =
        open_storage(&args.etcd, None, args.encryption_provider_config.as_deref()).await?;
    let key_encryption = private_files::key_encryption_key(&args.key_encryption_key_file)?;
    if !(args.tenant_qps.is_finite() && args.tenant_qps >= 0.0) {
        bail!("--tenant-qps must be a non-negative number");
    }
    let limits = TenantLimits {
        requests_per_second: (args.tenant_qps > 0.0).then_some(args.tenant_qps),
        burst: args.tenant_burst,
        max_in_flight: (args.tenant_max_in_flight > 0).then_some(args.tenant_max_in_flight),
        max_queued: args.tenant_max_queued,
        max_objects: (args.tenant_max_objects > 0).then_some(args.tenant_max_objects),
        max_bytes: (args.tenant_max_bytes > 0).then_some(args.tenant_max_bytes),
        max_watches: (args.tenant_max_watches > 0).then_some(args.tenant_max_watches),
        max_streams: (args.tenant_max_streams > 0).then_some(args.tenant_max_streams),
    };
    let placement_options = PlacementOptions {
        replica_id: args.replica_id,
        lease_duration: Duration::from_secs(args.lease_duration_seconds.max(1)),
        enabled: !args.external_control_loops,
        node_join_timeout: Duration::from_secs(args.node_join_timeout_seconds),
        sole_replica: false,
        park_idle_after: (!args.park_idle_clusters_after.is_zero())
            .then_some(args.park_idle_clusters_after),
    };
    let started = start(
        storage,
        key_encryption,
        args.listen,
        None,
        &args.tls_san,
        args.public_url,
        limits,
        placement_options,
        Networks {
            nodes: args.kubelet_networks.clone(),
            private: args.private_networks.clone(),
        },
        Arc::new(auditor(&args.audit).await?),
    )
    .await?;
    operator_config(&started.management, &args.operator_config, &started).await?;
    tracing::info!(
        address = %started.listener.local_addr()?,
        public_url = %started.public_url,
        operator_config = %args.operator_config.display(),
        "flotilla is serving"
    );
    started.serve().await;
    Ok(())
}
