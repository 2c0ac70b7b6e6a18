//! What the apiserver's benches share: the nearest-rank percentile they print and a kube-rs
//! client for an in-process [`LocalServer`].

use std::time::Duration;

use flotilla_apiserver::local::LocalServer;

/// The nearest-rank `q` quantile of sorted latencies (zero for none).
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A kube-rs client of `local`'s tenant, through its admin kubeconfig.
#[allow(dead_code)] // the api bench drives its own clients
pub async fn client(local: &LocalServer) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&local.kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}
