//! `flotilla scheduler` and `flotilla controller-manager` against any kubeconfig: the same
//! loops the hosted service runs per cluster, made highly available as upstream's are — each
//! replica runs them only while it holds the component's Lease in `kube-system`.

use std::future::Future;
use std::time::Duration;

use anyhow::Context;

use crate::leader_election::LeaderElection;
use crate::{ControllerManagerArgs, StandaloneArgs};

/// Upstream's leader-election timings.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The CA of the kubeconfig's cluster (PEM), which the root-CA publisher hands to pods.
pub fn cluster_ca_pem(kubeconfig: &std::path::Path) -> anyhow::Result<String> {
    use base64::Engine;
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::config::Kubeconfig::from_yaml(&text)?;
    let data = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .unwrap_or_default();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .context("the kubeconfig's certificate-authority-data is not base64")?;
    Ok(String::from_utf8(pem)?)
}

/// The controllers' configuration from `flotilla controller-manager`'s flags: the kubeconfig's
/// CA for the root-CA publisher, and the signing CA when both files are given.
pub fn controller_manager_config(
    args: &ControllerManagerArgs,
) -> anyhow::Result<flotilla_controller_manager::Config> {
    let root_ca_pem = cluster_ca_pem(&args.standalone.kubeconfig)?;
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    };
    let cluster_signing = match (
        &args.cluster_signing_cert_file,
        &args.cluster_signing_key_file,
    ) {
        (Some(cert), Some(key)) => {
            Some(flotilla_controller_manager::certificates::ClusterSigning {
                cert_pem: read(cert)?,
                key_pem: read(key)?,
                max_duration: Duration::from_secs(args.cluster_signing_duration_seconds),
            })
        }
        _ => {
            tracing::info!(
                "no --cluster-signing-cert-file/--cluster-signing-key-file: the csrsigning controller does not run"
            );
            None
        }
    };
    Ok(flotilla_controller_manager::Config {
        root_ca_pem,
        cluster_signing,
    })
}

/// Runs `component`'s loops (built by `start` from a client) while holding its Lease.
pub async fn run<F, Fut>(args: StandaloneArgs, component: &str, start: F) -> anyhow::Result<()>
where
    F: Fn(kube::Client) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let kubeconfig = std::fs::read_to_string(&args.kubeconfig)
        .with_context(|| format!("reading {}", args.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("the kubeconfig is not usable")?;
    let client = kube::Client::try_from(config)?;
    let identity = args.identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| component.to_string());
        format!("{host}_{}", std::process::id())
    });
    let mut election = LeaderElection::new(component, &identity, LEASE_DURATION);
    let mut running: Option<tokio::task::JoinHandle<()>> = None;
    let mut ticker = tokio::time::interval(RETRY_PERIOD);
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = ticker.tick() => {}
        }
        let held = election
            .try_acquire_or_renew(&client)
            .await
            .unwrap_or(false);
        match (held, running.is_some()) {
            (true, false) => {
                tracing::info!(%component, %identity, "became the leader");
                running = Some(tokio::spawn(start(client.clone())));
            }
            (false, true) => {
                tracing::warn!(%component, %identity, "lost the lease; stopping");
                if let Some(task) = running.take() {
                    task.abort();
                }
            }
            _ => {}
        }
    }
    if let Some(task) = running {
        task.abort();
    }
    Ok(())
}
