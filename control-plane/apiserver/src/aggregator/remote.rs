//! A tenant's APIServices served by its own servers (upstream kube-aggregator's
//! `APIServiceRegistrationController` and `AvailableConditionController`): the stored
//! APIServices naming a Service, each probed at `/apis/<group>/<version>` through the front
//! proxy's client certificate. The probe decides the `Available` condition and supplies the
//! resources aggregated discovery lists for the group version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::kubelet::KubeletNetworks;
use crate::outbound::{self, Dialer, Trust};
use crate::pki::IssuedCertificate;
use crate::resources::Resources;
use crate::store::{ListOptions, Store, Tenant};
use crate::tenants::TenantState;

/// How long the stored APIServices read are trusted (writes through this process forget
/// them at once; another replica's are seen within this).
const LIST_TTL: Duration = Duration::from_secs(2);

/// How often an APIService is probed again (upstream's availability controller resyncs
/// every 30 s).
const PROBE_EVERY: Duration = Duration::from_secs(30);

/// How long a probe may take (upstream's discovery check allows 5 s).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One stored APIService that names a Service.
#[derive(Clone)]
pub struct RemoteApi {
    /// `version.group`.
    pub name: String,
    /// The group it serves.
    pub group: String,
    /// The version it serves.
    pub version: String,
    /// Its `groupPriorityMinimum`.
    pub group_priority: i64,
    /// Its `versionPriority`.
    pub version_priority: i64,
    /// The Service's namespace, name and port.
    pub service: (String, String, u64),
    /// How its serving certificate is checked.
    pub trust: Trust,
    /// The stored object.
    pub stored: Value,
}

impl RemoteApi {
    /// The remote API a stored APIService describes, if it names a Service.
    pub fn of(stored: &Value) -> Option<Self> {
        let spec = &stored["spec"];
        let service = spec["service"].as_object()?;
        use base64::Engine as _;
        let trust = if spec["insecureSkipTLSVerify"] == json!(true) {
            Trust::Nothing
        } else {
            Trust::Bundle(
                spec["caBundle"]
                    .as_str()
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .unwrap_or_default(),
            )
        };
        let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
        Some(RemoteApi {
            name: crate::meta::name(stored).to_string(),
            group: text(spec.get("group")),
            version: text(spec.get("version")),
            group_priority: spec["groupPriorityMinimum"].as_i64().unwrap_or(0),
            version_priority: spec["versionPriority"].as_i64().unwrap_or(0),
            service: (
                text(service.get("namespace")),
                text(service.get("name")),
                service.get("port").and_then(Value::as_u64).unwrap_or(443),
            ),
            trust,
            stored: stored.clone(),
        })
    }
}

/// What the last probe of an APIService found.
#[derive(Clone)]
struct Probe {
    at: Instant,
    /// The spec it probed (a changed spec is probed anew).
    spec: Value,
    /// The group version's `APIResourceList`, or why it is not available (reason, message).
    outcome: Result<Value, (String, String)>,
}

/// A tenant's remote APIServices and their probes.
#[derive(Default)]
pub struct RemoteApis {
    listed: Mutex<Option<(Instant, Arc<Vec<RemoteApi>>)>>,
    probes: Arc<Mutex<HashMap<String, Probe>>>,
    /// Probes running in the background, by APIService name.
    probing: Arc<Mutex<std::collections::HashSet<String>>>,
}

/// What a probe needs, owned, so that it may run after the request that started it.
struct Prober {
    store: Store,
    tenant: Tenant,
    resources: Arc<Resources>,
    networks: KubeletNetworks,
    identity: IssuedCertificate,
}

impl RemoteApis {
    /// The stored APIServices naming a Service, read again when older than [`LIST_TTL`].
    pub async fn list(
        &self,
        server: &ApiServer,
        state: &TenantState,
    ) -> Result<Arc<Vec<RemoteApi>>, ApiError> {
        if let Ok(listed) = self.listed.lock()
            && let Some((at, apis)) = &*listed
            && at.elapsed() < LIST_TTL
        {
            return Ok(apis.clone());
        }
        let resource = api_services_resource(server);
        let page = server
            .store
            .list(&state.tenant, resource, None, &ListOptions::default())
            .await?;
        let apis = Arc::new(
            page.items
                .iter()
                .filter_map(RemoteApi::of)
                .collect::<Vec<_>>(),
        );
        if let Ok(mut listed) = self.listed.lock() {
            *listed = Some((Instant::now(), apis.clone()));
        }
        Ok(apis)
    }

    /// Forgets what was read, after a write to APIServices.
    pub fn forget(&self) {
        if let Ok(mut listed) = self.listed.lock() {
            *listed = None;
        }
    }

    /// The remote APIService serving `group`/`version`, unless the tenant serves it itself.
    pub async fn serving(
        &self,
        server: &ApiServer,
        state: &TenantState,
        local: &Resources,
        group: &str,
        version: &str,
    ) -> Result<Option<RemoteApi>, ApiError> {
        if local.iter().any(|r| r.group == group) {
            return Ok(None);
        }
        Ok(self
            .list(server, state)
            .await?
            .iter()
            .find(|api| api.group == group && api.version == version)
            .cloned())
    }

    /// `api`'s `Available` condition, probing first when it was never probed (bounded by
    /// the probe's timeout) and in the background when the last probe is stale.
    pub async fn outcome(
        &self,
        server: &ApiServer,
        state: &TenantState,
        api: &RemoteApi,
    ) -> Result<Value, (String, String)> {
        let known = self
            .probes
            .lock()
            .ok()
            .and_then(|probes| probes.get(&api.name).cloned())
            .filter(|probe| probe.spec == api.stored["spec"]);
        if let Some(probe) = &known
            && probe.at.elapsed() < PROBE_EVERY
        {
            return probe.outcome.clone();
        }
        let prober = match Prober::of(server, state) {
            Ok(prober) => prober,
            Err(err) => return Err(("ServiceAccessError".into(), err.message)),
        };
        match known {
            Some(probe) => {
                self.probe_in_background(prober, api.clone());
                probe.outcome
            }
            None => self.probe_now(prober, api).await,
        }
    }

    /// Probes `api` now and records the outcome.
    async fn probe_now(&self, prober: Prober, api: &RemoteApi) -> Result<Value, (String, String)> {
        let outcome = prober.probe(api).await;
        record(&self.probes, api, outcome.clone());
        outcome
    }

    fn probe_in_background(&self, prober: Prober, api: RemoteApi) {
        let Ok(mut probing) = self.probing.lock() else {
            return;
        };
        if !probing.insert(api.name.clone()) {
            return;
        }
        let (probes, probing) = (self.probes.clone(), self.probing.clone());
        tokio::spawn(async move {
            record(&probes, &api, prober.probe(&api).await);
            if let Ok(mut probing) = probing.lock() {
                probing.remove(&api.name);
            }
        });
    }

    /// Probes `api` now (after it was written, so the writer's next read sees its state).
    pub async fn refresh(&self, server: &ApiServer, state: &TenantState, name: &str) {
        self.forget();
        let Ok(apis) = self.list(server, state).await else {
            return;
        };
        if let Some(api) = apis.iter().find(|api| api.name == name)
            && let Ok(prober) = Prober::of(server, state)
        {
            let _ = self.probe_now(prober, api).await;
        }
    }

    /// The front proxy's connection settings for `api`, and where it is reached now.
    pub async fn connection(
        server: &ApiServer,
        state: &TenantState,
        api: &RemoteApi,
    ) -> Result<(outbound::Endpoint, Arc<rustls::ClientConfig>), outbound::Unreachable> {
        let prober = Prober::of(server, state).map_err(|err| outbound::Unreachable {
            reason: "ServiceAccessError",
            message: err.message,
        })?;
        prober.connection(api).await
    }
}

/// Keeps `outcome` as `api`'s last probe.
fn record(
    probes: &Mutex<HashMap<String, Probe>>,
    api: &RemoteApi,
    outcome: Result<Value, (String, String)>,
) {
    if let Ok(mut probes) = probes.lock() {
        probes.insert(
            api.name.clone(),
            Probe {
                at: Instant::now(),
                spec: api.stored["spec"].clone(),
                outcome,
            },
        );
    }
}

impl Prober {
    fn of(server: &ApiServer, state: &TenantState) -> Result<Self, ApiError> {
        Ok(Prober {
            store: server.store.clone(),
            tenant: state.tenant.clone(),
            resources: server.resources.clone(),
            networks: server.kubelet_networks.clone(),
            identity: state.front_proxy_client()?.clone(),
        })
    }

    async fn connection(
        &self,
        api: &RemoteApi,
    ) -> Result<(outbound::Endpoint, Arc<rustls::ClientConfig>), outbound::Unreachable> {
        let dialer = Dialer {
            store: &self.store,
            tenant: &self.tenant,
            resources: &self.resources,
            networks: &self.networks,
        };
        let (namespace, name, port) = &api.service;
        let endpoint =
            outbound::service(&dialer, namespace, name, *port, api.trust.clone()).await?;
        let config = outbound::tls_config(&api.trust, Some(&self.identity)).map_err(|message| {
            outbound::Unreachable {
                reason: "ServiceAccessError",
                message,
            }
        })?;
        Ok((endpoint, config))
    }

    /// Upstream's discovery check: `GET /apis/<group>/<version>` answers 200 within the
    /// timeout; its `APIResourceList` is what the group version serves.
    async fn probe(&self, api: &RemoteApi) -> Result<Value, (String, String)> {
        let (endpoint, config) = self
            .connection(api)
            .await
            .map_err(|unreachable| (unreachable.reason.to_string(), unreachable.message))?;
        let path = format!("/apis/{}/{}", api.group, api.version);
        let url = format!("https://{}{path}", endpoint.address);
        let failing = |why: String| {
            (
                "FailedDiscoveryCheck".to_string(),
                format!("failing or missing response from {url}: {why}"),
            )
        };
        let request = http::Request::get(&path)
            .header(http::header::HOST, &endpoint.authority)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::new()))
            .map_err(|err| failing(err.to_string()))?;
        let answered = tokio::time::timeout(PROBE_TIMEOUT, async {
            let response = outbound::forward(&endpoint, config, request).await?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|err| err.to_string())?
                .to_bytes();
            Ok::<_, String>((status, body))
        })
        .await
        .map_err(|_| failing("Get: context deadline exceeded".to_string()))?
        .map_err(failing)?;
        let (status, body) = answered;
        if !status.is_success() {
            return Err(failing(format!(
                "bad status from {url}: {}",
                status.as_u16()
            )));
        }
        serde_json::from_slice(&body).map_err(|err| failing(err.to_string()))
    }
}

/// The APIServices resource (always served).
pub fn api_services_resource(server: &ApiServer) -> &crate::resources::ResourceInfo {
    server
        .resources
        .find("apiregistration.k8s.io", "v1", "apiservices")
        .map(|r| &**r)
        .unwrap_or_else(|| unreachable!("apiservices are always served"))
}

/// The `Available` condition of a probe's outcome, as upstream's controller writes it.
pub fn available_condition(outcome: &Result<Value, (String, String)>) -> Value {
    match outcome {
        Ok(_) => json!({"type": "Available", "status": "True", "reason": "Passed",
            "message": "all checks passed"}),
        Err((reason, message)) => json!({"type": "Available", "status": "False",
            "reason": reason, "message": message}),
    }
}

/// An `APIResourceList`'s resources in aggregated discovery's form (upstream's
/// `convertAPIResourceToDiscovery`): subresources under their parent.
pub fn discovery_resources(list: &Value) -> Vec<Value> {
    let entries: Vec<&Value> = list["resources"].as_array().into_iter().flatten().collect();
    let mut resources: Vec<Value> = Vec::new();
    for entry in &entries {
        let name = entry["name"].as_str().unwrap_or("");
        if name.is_empty() || name.contains('/') {
            continue;
        }
        let mut resource = json!({
            "resource": name,
            "responseKind": {"group": entry["group"].as_str().unwrap_or(""),
                "version": entry["version"].as_str().unwrap_or(""),
                "kind": entry["kind"]},
            "scope": if entry["namespaced"] == json!(true) { "Namespaced" } else { "Cluster" },
            "singularResource": entry["singularName"].as_str().unwrap_or(""),
            "verbs": entry["verbs"].clone(),
        });
        for field in ["shortNames", "categories"] {
            if entry[field].as_array().is_some_and(|a| !a.is_empty()) {
                resource[field] = entry[field].clone();
            }
        }
        let subresources: Vec<Value> = entries
            .iter()
            .filter_map(|sub| {
                let (parent, subresource) = sub["name"].as_str()?.split_once('/')?;
                (parent == name).then(|| {
                    json!({"subresource": subresource,
                        "responseKind": {"group": sub["group"].as_str().unwrap_or(""),
                            "version": sub["version"].as_str().unwrap_or(""), "kind": sub["kind"]},
                        "verbs": sub["verbs"].clone()})
                })
            })
            .collect();
        if !subresources.is_empty() {
            resource["subresources"] = Value::Array(subresources);
        }
        resources.push(resource);
    }
    resources
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_lists_become_aggregated_discovery_entries() {
        let list = json!({"resources": [
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
             "verbs": ["get", "list"]},
            {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
             "verbs": ["get", "list"], "shortNames": ["nm"]},
            {"name": "nodes/status", "namespaced": false, "kind": "NodeMetrics", "verbs": ["get"]},
        ]});
        let resources = discovery_resources(&list);
        assert_eq!(resources.len(), 2);
        assert_eq!(resources[0]["scope"], "Namespaced");
        assert_eq!(resources[1]["scope"], "Cluster");
        assert_eq!(resources[1]["shortNames"], json!(["nm"]));
        assert_eq!(resources[1]["subresources"][0]["subresource"], "status");
    }

    #[test]
    fn only_apiservices_naming_a_service_are_remote() {
        assert!(
            RemoteApi::of(&json!({"metadata": {"name": "v1.apps"},
            "spec": {"group": "apps", "version": "v1"}}))
            .is_none()
        );
        let remote = RemoteApi::of(&json!({"metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                "service": {"namespace": "kube-system", "name": "metrics-server"},
                "insecureSkipTLSVerify": true, "groupPriorityMinimum": 100, "versionPriority": 100}}))
        .expect("remote");
        assert_eq!(remote.service.2, 443);
        assert!(remote.trust == Trust::Nothing);
    }
}
