//! The Flotilla service: `flotilla up` (one machine, embedded store, a `demo` cluster) and
//! `flotilla serve` (the hosted service on etcd), wiring storage, the API server and TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use flotilla_apiserver::ApiServer;
use flotilla_apiserver::pki::{CertificateAuthority, kubeconfig};
use flotilla_apiserver::serve::ServerConfig;
use flotilla_storage::{EmbeddedStorage, EtcdStorage, Storage};
use tokio::net::TcpListener;

/// How often old revisions are compacted away (kube-apiserver's default interval).
const COMPACTION_INTERVAL: Duration = Duration::from_secs(300);

/// Where the service's serving CA is kept, shared by every replica.
const SERVING_CA_KEY: &str = "/flotilla/pki/serving-ca";

/// The cluster `flotilla up` creates.
const DEMO_CLUSTER: &str = "demo";

/// Flotilla: hosted Kubernetes control planes.
#[derive(Debug, Parser)]
#[command(name = "flotilla", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the whole service on this machine with a `demo` cluster; writes DIR/kubeconfig.
    Up(UpArgs),
    /// Run the hosted service on an etcd cluster.
    Serve(ServeArgs),
}

/// `flotilla up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Directory for the embedded store and the admin kubeconfig.
    #[arg(long, default_value = "./flotilla-data")]
    pub data_dir: PathBuf,
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Use this etcd cluster instead of the embedded store (comma-separated URLs).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
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
}

/// Runs a parsed command line to completion.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Up(args) => up(args).await,
        Command::Serve(args) => serve(args).await,
    }
}

async fn open_storage(
    etcd: &[String],
    data_dir: Option<&Path>,
) -> anyhow::Result<Arc<dyn Storage>> {
    if !etcd.is_empty() {
        let storage = EtcdStorage::connect(etcd, None)
            .await
            .context("connecting to etcd")?;
        return Ok(Arc::new(storage));
    }
    let Some(dir) = data_dir else {
        bail!("no storage: give --etcd or --data-dir");
    };
    let path = dir.join("store.redb");
    let storage = tokio::task::spawn_blocking(move || EmbeddedStorage::open(&path))
        .await
        .context("opening the embedded store")?
        .context("opening the embedded store")?;
    Ok(Arc::new(storage))
}

/// The serving CA every replica shares: loaded from storage, or created there once.
async fn serving_ca(storage: &Arc<dyn Storage>) -> anyhow::Result<CertificateAuthority> {
    if let Some(kv) = storage.get(SERVING_CA_KEY).await? {
        return serde_json::from_slice(&kv.value).context("stored serving CA is unreadable");
    }
    let ca = CertificateAuthority::generate("flotilla-serving-ca")?;
    let bytes = Bytes::from(serde_json::to_vec(&ca)?);
    match storage.create(SERVING_CA_KEY, bytes).await? {
        flotilla_storage::Outcome::Done(_) => Ok(ca),
        // Another replica created it first: use theirs.
        flotilla_storage::Outcome::Conflict(Some(kv)) => {
            serde_json::from_slice(&kv.value).context("stored serving CA is unreadable")
        }
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

/// A bound, configured server, not yet serving.
struct Started {
    server: Arc<ApiServer>,
    listener: TcpListener,
    tls: Arc<ServerConfig>,
    serving_ca: CertificateAuthority,
}

async fn start(
    storage: Arc<dyn Storage>,
    listen: SocketAddr,
    extra_sans: &[String],
) -> anyhow::Result<Started> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let local = listener.local_addr()?;
    let server = ApiServer::new(storage.clone(), &local.to_string());
    let ca = serving_ca(&storage).await?;
    let serving = ca.issue_serving("flotilla", &serving_hosts(local, extra_sans))?;
    let chain = format!("{}{}", serving.cert_pem, ca.cert_pem);
    let tls = flotilla_apiserver::serve::server_config(&chain, &serving.key_pem)?;
    spawn_compactor(storage);
    Ok(Started {
        server,
        listener,
        tls,
        serving_ca: ca,
    })
}

async fn up(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let storage = open_storage(&args.etcd, Some(&args.data_dir)).await?;
    let Started {
        server,
        listener,
        tls,
        serving_ca,
    } = start(storage, args.listen, &[]).await?;
    let local = listener.local_addr()?;
    let tenant = server
        .tenants
        .ensure(&server, DEMO_CLUSTER)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let admin = tenant
        .issue_admin()
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let host = if local.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        local.ip().to_string()
    };
    let server_url = format!(
        "https://{}/clusters/{DEMO_CLUSTER}",
        SocketAddr::new(host.parse()?, local.port())
    );
    let config = kubeconfig(
        DEMO_CLUSTER,
        &server_url,
        &serving_ca.cert_pem,
        "kubernetes-admin",
        &admin,
    );
    let path = args.data_dir.join("kubeconfig");
    write_private(&path, &config)?;
    let absolute = std::fs::canonicalize(&path).unwrap_or(path);
    println!("{}", absolute.display());
    tracing::info!(url = %server_url, kubeconfig = %absolute.display(), "flotilla is up");
    flotilla_apiserver::serve::serve_tls(listener, tls, server.router(), shutdown_signal()).await;
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let storage = open_storage(&args.etcd, None).await?;
    let Started {
        server,
        listener,
        tls,
        ..
    } = start(storage, args.listen, &args.tls_san).await?;
    tracing::info!(address = %listener.local_addr()?, "flotilla is serving");
    flotilla_apiserver::serve::serve_tls(listener, tls, server.router(), shutdown_signal()).await;
    Ok(())
}

/// Writes a file readable by its owner only (it holds a private key).
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    Ok(())
}
