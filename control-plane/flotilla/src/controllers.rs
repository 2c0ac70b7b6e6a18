//! A tenant's control loops, as pure API clients (kube-rs, kube-runtime) of its cluster:
//! so far upstream's service-account controller and root-CA publisher — every namespace gets a
//! `default` ServiceAccount and a `kube-root-ca.crt` ConfigMap. The scheduler and the other
//! controllers join them here.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::runtime::watcher::{self, Event};

/// Runs the loops of one cluster until the task is aborted (its lease was lost).
pub async fn run(client: kube::Client, root_ca_pem: String) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut events = watcher::watcher(namespaces, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let namespace = match event {
            Ok(Event::Apply(ns) | Event::InitApply(ns)) => ns,
            Ok(_) => continue,
            Err(err) => {
                // The watcher relists by itself; a failure here is only worth a trace.
                tracing::debug!(%err, "namespace watch failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let terminating = namespace.metadata.deletion_timestamp.is_some();
        let Some(name) = namespace.metadata.name.filter(|_| !terminating) else {
            continue;
        };
        if let Err(err) = reconcile_namespace(&client, &name, &root_ca_pem).await {
            tracing::info!(namespace = %name, %err, "namespace defaults not written; will retry on the next event");
        }
    }
}

/// Upstream's ServiceAccountsController and root-CA publisher for one namespace.
async fn reconcile_namespace(
    client: &kube::Client,
    namespace: &str,
    root_ca_pem: &str,
) -> Result<(), kube::Error> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    create_if_absent(&accounts, &account).await?;
    if !root_ca_pem.is_empty() {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let root_ca = ConfigMap {
            metadata: ObjectMeta {
                name: Some("kube-root-ca.crt".into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "ca.crt".to_string(),
                root_ca_pem.to_string(),
            )])),
            ..Default::default()
        };
        create_if_absent(&config_maps, &root_ca).await?;
    }
    Ok(())
}

async fn create_if_absent<K>(api: &Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        // A namespace being deleted refuses new content: nothing to do.
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 404 => Ok(()),
        Err(err) => Err(err),
    }
}
