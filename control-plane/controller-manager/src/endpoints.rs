//! The endpoints controllers (upstream `EndpointsController` and `EndpointSliceController`,
//! pure API clients): every Service with a selector gets an Endpoints object and one
//! EndpointSlice listing the IPs of the pods it selects, ready or not, and they follow the pods
//! as they come, go and change readiness.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

/// The label upstream puts on the slices its controller manages.
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// The label this controller puts on the Endpoints it writes.
const MANAGED: &str = "endpoints.flotilla.io/managed";
/// Services synced at once (upstream's `--concurrent-endpoint-syncs`).
const CONCURRENT_SYNCS: usize = 5;
/// Runs both controllers until the task is aborted: a change to a Service, to its Endpoints,
/// or to a pod it selects (before or after the change) queues the Service's key (upstream's
/// handlers); workers sync one Service at a time each.
pub async fn run(informers: Arc<Informers>) {
    let services = informers.get::<Service>();
    let pods = informers.get::<Pod>();
    let endpoints = informers.get::<Endpoints>();
    let services_by_namespace = services.by_namespace();
    let pods_by_namespace = pods.by_namespace();
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("endpoint"));

    let on_service = queue.clone();
    services.on_change(move |change| {
        for service in change.objects() {
            on_service.add(pods::key(&service.metadata));
        }
    });
    let on_pod = queue.clone();
    let selecting = services_by_namespace.clone();
    pods.on_change(move |change| {
        let Some(pod) = change.new.or(change.old) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let candidates = selecting.get(namespace);
        for key in pod_service_memberships(&candidates, change.old, change.new) {
            on_pod.add(key);
        }
    });
    // A deleted Endpoints is written again; one left behind by a deleted Service goes
    // (upstream's onEndpointsDelete and checkLeftoverEndpoints).
    let on_endpoints = queue.clone();
    endpoints.on_change(move |change| {
        for object in change.objects() {
            on_endpoints.add(pods::key(&object.metadata));
        }
    });

    services.ready().await;
    pods.ready().await;
    endpoints.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, &services, &pods_by_namespace, &endpoints, key)
    })
    .await
}

/// Upstream's getPodServiceMemberships over a pod change: the keys of the Services among
/// `services` (those of the pod's namespace) whose selector matches the pod before or after
/// it, or none when nothing a Service's endpoints show changed.
fn pod_service_memberships(
    services: &[Arc<Service>],
    old: Option<&Pod>,
    new: Option<&Pod>,
) -> BTreeSet<String> {
    if let (Some(old), Some(new)) = (old, new)
        && old.metadata.labels == new.metadata.labels
        && same_endpoint_view(old, new)
    {
        return BTreeSet::new();
    }
    services
        .iter()
        .filter(|service| {
            service
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .filter(|s| !s.is_empty())
                .is_some_and(|selector| old.into_iter().chain(new).any(|p| selects(selector, p)))
        })
        .map(|service| pods::key(&service.metadata))
        .collect()
}

/// Whether what a pod's Services' Endpoints and EndpointSlices show of it is the same in
/// `a` and `b` (upstream's podChanged, labels aside).
fn same_endpoint_view(a: &Pod, b: &Pod) -> bool {
    let view = |pod: &Pod| {
        let spec = pod.spec.as_ref();
        (
            pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            pods::is_ready(pod),
            pods::is_finished(pod),
            pod.metadata.deletion_timestamp.is_some(),
            pod.metadata.uid.clone(),
            spec.and_then(|s| s.node_name.clone()),
            spec.map(|s| {
                s.containers
                    .iter()
                    .map(|c| c.ports.clone())
                    .collect::<Vec<_>>()
            }),
        )
    };
    view(a) == view(b)
}

/// Syncs the Service `key`: its Endpoints and EndpointSlice, or their removal once it is
/// gone.
async fn sync_key(
    client: &kube::Client,
    services: &Informer<Service>,
    pods_by_namespace: &Index<Pod>,
    endpoints: &Informer<Endpoints>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    if let Some(service) = services.get(namespace, name) {
        let members = pods_by_namespace.get(namespace);
        sync(client, &service, &members, endpoints).await?;
        return Ok(Requeue::No);
    }
    // Endpoints this controller wrote for a Service that is gone.
    let managed = endpoints.get(namespace, name).is_some_and(|stale| {
        stale
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.get(MANAGED).map(String::as_str) == Some("true"))
    });
    if managed {
        let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
        pods::delete(&api, name, &DeleteParams::default()).await?;
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
        pods::delete(&slices, name, &DeleteParams::default()).await?;
    }
    Ok(Requeue::No)
}

fn selects(selector: &BTreeMap<String, String>, pod: &Pod) -> bool {
    let labels = pod.metadata.labels.as_ref();
    selector
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

/// Whether `pod` is listed as a ready address: Ready (or the Service publishes not-ready
/// addresses) and not being deleted.
fn endpoint_ready(pod: &Pod, publish_not_ready: bool) -> bool {
    (publish_not_ready || crate::pods::is_ready(pod)) && pod.metadata.deletion_timestamp.is_none()
}

/// The port a Service port targets on `pod`: a number, or a named container port.
fn target_port(service_port: &Value, pod: &Pod) -> Option<i64> {
    match &service_port["targetPort"] {
        Value::Number(n) => n.as_i64(),
        Value::String(name) => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .map(|p| i64::from(p.container_port)),
        _ => service_port["port"].as_i64(),
    }
}

/// One Service: its Endpoints and EndpointSlice, written when they differ.
async fn sync(
    client: &kube::Client,
    service: &Service,
    pods: &[Arc<Pod>],
    endpoints: &Informer<Endpoints>,
) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&service.metadata.name, &service.metadata.namespace)
    else {
        return Ok(());
    };
    let spec = service.spec.as_ref();
    let Some(selector) = spec
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
    else {
        return Ok(());
    };
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName")
        || service.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    let service_json = serde_json::to_value(service).map_err(kube::Error::SerdeError)?;
    let ports: Vec<Value> = service_json["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let publish_not_ready = spec
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    let mut members: Vec<&Pod> = pods
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.metadata.namespace.as_ref() == Some(namespace))
        .filter(|p| selects(selector, p))
        .filter(|p| {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("");
            !matches!(phase, "Succeeded" | "Failed")
                && p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_some()
        })
        .collect();
    members.sort_by_key(|p| p.metadata.name.clone());
    let address = |pod: &Pod| {
        let mut address = json!({
            "ip": pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            "nodeName": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.metadata.name, "uid": pod.metadata.uid},
        });
        if let Some(hostname) = hostname_under(pod, name) {
            address["hostname"] = json!(hostname);
        }
        address
    };
    let ready = |pod: &Pod| endpoint_ready(pod, publish_not_ready);
    let endpoint_ports: Vec<Value> = ports
        .iter()
        .map(|port| {
            let target = members
                .first()
                .and_then(|pod| target_port(port, pod))
                .or_else(|| port["port"].as_i64());
            let mut out =
                json!({"port": target, "protocol": port["protocol"].as_str().unwrap_or("TCP")});
            if let Some(port_name) = port["name"].as_str() {
                out["name"] = json!(port_name);
            }
            out
        })
        .collect();
    let ready_addresses: Vec<Value> = members
        .iter()
        .filter(|p| ready(p))
        .map(|p| address(p))
        .collect();
    let not_ready: Vec<Value> = members
        .iter()
        .filter(|p| !ready(p))
        .map(|p| address(p))
        .collect();
    let subsets = if members.is_empty() {
        json!([])
    } else {
        let mut subset = json!({"ports": endpoint_ports});
        if !ready_addresses.is_empty() {
            subset["addresses"] = json!(ready_addresses);
        }
        if !not_ready.is_empty() {
            subset["notReadyAddresses"] = json!(not_ready);
        }
        json!([subset])
    };
    let current = endpoints.get(namespace, name);
    let current_subsets = current
        .as_ref()
        .map(|e| serde_json::to_value(&e.subsets).unwrap_or(Value::Null))
        .unwrap_or(Value::Null);
    let normalized = if subsets.as_array().is_some_and(|a| a.is_empty()) {
        Value::Null
    } else {
        subsets.clone()
    };
    if current.is_some() && current_subsets == normalized {
        return Ok(());
    }
    let object: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {MANAGED: "true"}},
        "subsets": subsets,
    }))
    .map_err(kube::Error::SerdeError)?;
    let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
    match &current {
        None => {
            api.create(&PostParams::default(), &object).await?;
        }
        Some(existing) => {
            let mut replacement = object;
            replacement.metadata.resource_version = existing.metadata.resource_version.clone();
            api.replace(name, &PostParams::default(), &replacement)
                .await?;
        }
    }
    write_slice(
        client,
        service,
        namespace,
        name,
        &members,
        &endpoint_ports,
        publish_not_ready,
    )
    .await
}

/// A pod's hostname when it names itself under the Service `service` (its `subdomain`), as
/// upstream's `ShouldSetHostname` has it: DNS then knows it as `<hostname>.<service>…`.
fn hostname_under(pod: &Pod, service: &str) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let hostname = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    (spec.subdomain.as_deref() == Some(service)).then(|| hostname.to_string())
}

/// The Service's one EndpointSlice (named after it), replaced whole.
async fn write_slice(
    client: &kube::Client,
    service: &Service,
    namespace: &str,
    name: &str,
    members: &[&Pod],
    ports: &[Value],
    publish_not_ready: bool,
) -> Result<(), kube::Error> {
    let endpoints: Vec<Value> = members
        .iter()
        .map(|pod| {
            let terminating = pod.metadata.deletion_timestamp.is_some();
            let mut endpoint = json!({
                "addresses": [pod.status.as_ref().and_then(|s| s.pod_ip.clone())],
                "conditions": {"ready": endpoint_ready(pod, publish_not_ready), "serving": crate::pods::is_ready(pod), "terminating": terminating},
                "nodeName": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.metadata.name, "uid": pod.metadata.uid},
            });
            if let Some(hostname) = hostname_under(pod, name) {
                endpoint["hostname"] = json!(hostname);
            }
            endpoint
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                  "uid": service.metadata.uid, "controller": true, "blockOwnerDeletion": true}],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports,
    }))
    .map_err(kube::Error::SerdeError)?;
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await? {
        None => {
            api.create(&PostParams::default(), &slice).await?;
        }
        Some(existing) => {
            let mut replacement = slice;
            replacement.metadata.resource_version = existing.metadata.resource_version;
            api.replace(name, &PostParams::default(), &replacement)
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, selector: serde_json::Value) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"selector": selector},
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn pod(labels: serde_json::Value, ip: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": labels},
            "status": {"podIP": ip},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_pod_change_queues_the_services_selecting_it_before_or_after() {
        let services = [
            service("web", json!({"app": "web"})),
            service("api", json!({"app": "api"})),
            service("all-web", json!({"tier": "front"})),
            service("manual", json!({})),
        ];
        let keys = |old: Option<&Pod>, new: Option<&Pod>| {
            pod_service_memberships(&services, old, new)
                .into_iter()
                .collect::<Vec<_>>()
        };
        let web = pod(json!({"app": "web", "tier": "front"}), "10.0.0.1");
        assert_eq!(keys(None, Some(&web)), ["ns/all-web", "ns/web"]);
        assert_eq!(keys(Some(&web), None), ["ns/all-web", "ns/web"]);
        // Relabelled from web to api: both the Service it left and the one it joined.
        let api = pod(json!({"app": "api"}), "10.0.0.1");
        assert_eq!(
            keys(Some(&web), Some(&api)),
            ["ns/all-web", "ns/api", "ns/web"]
        );
        // A new IP matters; a change no Endpoints shows does not.
        let moved = pod(json!({"app": "web", "tier": "front"}), "10.0.0.2");
        assert_eq!(keys(Some(&web), Some(&moved)), ["ns/all-web", "ns/web"]);
        let mut annotated = web.clone();
        annotated.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert!(keys(Some(&web), Some(&annotated)).is_empty());
    }
}
