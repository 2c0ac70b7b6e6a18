//! Upstream's namespace controller (a deleted namespace's contents are deleted, then its
//! `kubernetes` finalizer removed), service-account controller and root-CA publisher (every
//! namespace gets a `default` ServiceAccount and a `kube-root-ca.crt` ConfigMap).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::{Discovery, Scope, verbs};
use kube::runtime::watcher::{self, Event};

/// How often a terminating namespace's contents are looked at again while they drain
/// (objects with finalizers of their own leave only when those are removed).
const NAMESPACE_RETRY: Duration = Duration::from_secs(1);
/// The finalizer the namespace controller owns.
const NAMESPACE_FINALIZER: &str = "kubernetes";

/// The service-account controller, root-CA publisher and namespace controller.
pub async fn run(client: kube::Client, root_ca_pem: String) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut events = watcher::watcher(namespaces, watcher::Config::default()).boxed();
    // Namespaces being emptied now, so an event does not start a second deleter.
    let draining: Arc<Mutex<HashSet<String>>> = Arc::default();
    while let Some(event) = events.next().await {
        let namespace = match event {
            Ok(Event::Apply(ns) | Event::InitApply(ns)) => ns,
            Ok(_) => continue,
            Err(err) => {
                // The watcher relists by itself; a failure here is only worth a trace.
                tracing::debug!(%err, "namespace watch failed; retrying");
                tokio::time::sleep(NAMESPACE_RETRY).await;
                continue;
            }
        };
        let Some(name) = namespace.metadata.name.clone() else {
            continue;
        };
        if namespace.metadata.deletion_timestamp.is_some() {
            let finalizing = namespace
                .spec
                .as_ref()
                .and_then(|spec| spec.finalizers.as_ref())
                .is_some_and(|list| list.iter().any(|f| f == NAMESPACE_FINALIZER));
            let first = draining
                .lock()
                .map(|mut set| set.insert(name.clone()))
                .unwrap_or(false);
            if finalizing && first {
                let (client, draining) = (client.clone(), draining.clone());
                // The deleter owns the namespace until it is finalized; it ends with the loops.
                tokio::spawn(async move {
                    delete_namespace_contents(&client, &name).await;
                    if let Ok(mut set) = draining.lock() {
                        set.remove(&name);
                    }
                });
            }
            continue;
        }
        if let Err(err) = reconcile_namespace(&client, &name, &root_ca_pem).await {
            tracing::info!(namespace = %name, %err, "namespace defaults not written; will retry on the next event");
        }
    }
}

/// Upstream's namespace controller for one terminating namespace: delete every namespaced
/// object in it (deletecollection per resource), wait until none is left, then remove the
/// `kubernetes` finalizer through `namespaces/{name}/finalize`, after which the server
/// deletes the namespace.
async fn delete_namespace_contents(client: &kube::Client, namespace: &str) {
    loop {
        match drain(client, namespace).await {
            Ok(true) => match finalize(client, namespace).await {
                Ok(()) => return,
                Err(err) => {
                    tracing::info!(%namespace, %err, "finalizing the namespace failed; retrying")
                }
            },
            Ok(false) => {}
            Err(err) => {
                tracing::info!(%namespace, %err, "deleting the namespace's contents failed; retrying")
            }
        }
        tokio::time::sleep(NAMESPACE_RETRY).await;
    }
}

/// One pass: asks every namespaced resource to delete its objects in `namespace`; `true` once
/// nothing is left.
async fn drain(client: &kube::Client, namespace: &str) -> Result<bool, kube::Error> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut empty = true;
    for group in discovery.groups() {
        for (resource, capabilities) in group.recommended_resources() {
            if capabilities.scope != Scope::Namespaced
                || !capabilities.supports_operation(verbs::LIST)
                || !capabilities.supports_operation(verbs::DELETE_COLLECTION)
            {
                continue;
            }
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), namespace, &resource);
            let left = api.list(&ListParams::default().limit(1)).await?;
            if left.items.is_empty() {
                continue;
            }
            empty = false;
            match api
                .delete_collection(&DeleteParams::background(), &ListParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(err),
            }
        }
    }
    Ok(empty)
}

/// Removes the controller's finalizer from `spec.finalizers` (`PUT …/finalize`).
async fn finalize(client: &kube::Client, namespace: &str) -> Result<(), kube::Error> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let Some(mut current) = namespaces.get_opt(namespace).await? else {
        return Ok(());
    };
    if let Some(finalizers) = current
        .spec
        .as_mut()
        .and_then(|spec| spec.finalizers.as_mut())
    {
        finalizers.retain(|f| f != NAMESPACE_FINALIZER);
    }
    match namespaces
        .replace_subresource("finalize", namespace, &PostParams::default(), &current)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err),
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
