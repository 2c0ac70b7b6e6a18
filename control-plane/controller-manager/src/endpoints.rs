//! The endpoints controllers (upstream `EndpointsController` and `EndpointSliceController`,
//! pure API clients): every Service with a selector gets an Endpoints object and one
//! EndpointSlice listing the IPs of the pods it selects, ready or not, and they follow the pods
//! as they come, go and change readiness.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::informers::{Informer, Informers, Triggers};

/// How often every Service is looked at again without a change seen.
const RESYNC: Duration = Duration::from_secs(5);
/// The label upstream puts on the slices its controller manages.
const MANAGED_BY: &str = "endpointslice-controller.k8s.io";

/// Runs both controllers until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let services = informers.get::<Service>();
    let pods = informers.get::<Pod>();
    let endpoints = informers.get::<Endpoints>();
    let client = informers.client().clone();
    let mut triggers = Triggers::new(RESYNC).on(&services).on(&pods).on(&endpoints);
    loop {
        triggers.next().await;
        if services.is_ready() && pods.is_ready() && endpoints.is_ready() {
            sync_all(&client, &services, &pods, &endpoints).await;
        }
    }
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

async fn sync_all(
    client: &kube::Client,
    services: &Informer<Service>,
    pods: &Informer<Pod>,
    endpoints: &Informer<Endpoints>,
) {
    let services = services.list();
    let pods = pods.list();
    for service in &services {
        if let Err(err) = sync(client, service, &pods, endpoints).await {
            tracing::info!(service = ?service.metadata.name, %err, "endpoints sync failed; retrying");
        }
    }
    // Endpoints this controller wrote for Services that are gone.
    for stale in endpoints.list() {
        let (Some(name), Some(namespace)) = (&stale.metadata.name, &stale.metadata.namespace)
        else {
            continue;
        };
        let managed =
            stale.metadata.labels.as_ref().is_some_and(|l| {
                l.get("endpoints.flotilla.io/managed") == Some(&"true".to_string())
            });
        let exists = services.iter().any(|s| {
            s.metadata.name.as_ref() == Some(name)
                && s.metadata.namespace.as_ref() == Some(namespace)
        });
        if managed && !exists {
            let api: Api<Endpoints> = Api::namespaced(client.clone(), namespace);
            let _ = api.delete(name, &DeleteParams::default()).await;
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
            let _ = slices.delete(name, &DeleteParams::default()).await;
        }
    }
}

/// One Service: its Endpoints and EndpointSlice, written when they differ.
async fn sync(
    client: &kube::Client,
    service: &Service,
    pods: &[std::sync::Arc<Pod>],
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
        json!({
            "ip": pod.status.as_ref().and_then(|s| s.pod_ip.clone()),
            "nodeName": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.metadata.name, "uid": pod.metadata.uid},
        })
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
                     "labels": {"endpoints.flotilla.io/managed": "true"}},
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
            json!({
                "addresses": [pod.status.as_ref().and_then(|s| s.pod_ip.clone())],
                "conditions": {"ready": endpoint_ready(pod, publish_not_ready), "serving": crate::pods::is_ready(pod), "terminating": terminating},
                "nodeName": pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod.metadata.name, "uid": pod.metadata.uid},
            })
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
