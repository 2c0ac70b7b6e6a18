//! Per-kind strategies: upstream defaulting, validation, status handling, field labels and
//! printed columns for each served kind.

use serde_json::{Value, json};

use crate::error::{FieldError, Path};
use crate::meta::{self, at, str_at};
use crate::resources::{FieldLabel, Strategy};
use crate::store::UpdateTarget;
use crate::table::{Column, age_column, int_at, name_column, or_none};

mod autoscaling;
mod config;
mod ephemeral;
mod networking;
mod resize;
mod runtimeclass;
mod storage;
pub mod webhooks;
mod workloads;

pub use autoscaling::*;
pub use config::*;
pub use networking::*;
pub use runtimeclass::*;
pub use storage::*;
pub use webhooks::*;
pub use workloads::*;

/// Kinds with no behaviour beyond the generic store.
pub struct DefaultStrategy;
impl Strategy for DefaultStrategy {}

fn set_default(obj: &mut Value, path: &[&str], value: Value) {
    if at(obj, path).is_none_or(Value::is_null) {
        meta::set_at(obj, path, value);
    }
}

fn array_len(obj: &Value, path: &[&str]) -> usize {
    at(obj, path).and_then(Value::as_array).map_or(0, Vec::len)
}

fn object_len(obj: &Value, path: &[&str]) -> usize {
    at(obj, path)
        .and_then(Value::as_object)
        .map_or(0, serde_json::Map::len)
}

/// `SetDefaults_PodSpec` and `SetDefaults_Container` for a pod spec wherever it is embedded.
fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    set_default(spec, &["restartPolicy"], json!("Always"));
    set_default(spec, &["dnsPolicy"], json!("ClusterFirst"));
    set_default(spec, &["terminationGracePeriodSeconds"], json!(30));
    set_default(spec, &["schedulerName"], json!("default-scheduler"));
    set_default(spec, &["securityContext"], json!({}));
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for container in containers {
                default_container(container);
            }
        }
    }
}

fn default_container(container: &mut Value) {
    let image = str_at(container, &["image"]).unwrap_or("");
    // Upstream: `:latest` or no tag pulls Always, anything else IfNotPresent.
    let last_segment = image.rsplit('/').next().unwrap_or("");
    let untagged = !last_segment.contains(':') && !image.contains('@');
    let policy = if untagged || image.ends_with(":latest") {
        "Always"
    } else {
        "IfNotPresent"
    };
    set_default(container, &["imagePullPolicy"], json!(policy));
    set_default(
        container,
        &["terminationMessagePath"],
        json!("/dev/termination-log"),
    );
    set_default(container, &["terminationMessagePolicy"], json!("File"));
    set_default(container, &["resources"], json!({}));
    // SetDefaults_Pod: a resource with a limit and no request requests the limit.
    if let Some(limits) = at(container, &["resources", "limits"])
        .and_then(Value::as_object)
        .cloned()
    {
        for (name, value) in limits {
            set_default(container, &["resources", "requests", name.as_str()], value);
        }
    }
    // SetDefaults_Probe and SetDefaults_HTTPGetAction (probes and lifecycle hooks).
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = container.get_mut(probe).filter(|p| p.is_object()) {
            set_default(p, &["timeoutSeconds"], json!(1));
            set_default(p, &["periodSeconds"], json!(10));
            set_default(p, &["successThreshold"], json!(1));
            set_default(p, &["failureThreshold"], json!(3));
            default_http_get(p);
        }
    }
    for hook in ["postStart", "preStop"] {
        if let Some(h) = container
            .get_mut("lifecycle")
            .and_then(|l| l.get_mut(hook))
            .filter(|h| h.is_object())
        {
            default_http_get(h);
        }
    }
    if let Some(ports) = container.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports {
            set_default(port, &["protocol"], json!("TCP"));
        }
    }
}

/// `SetDefaults_HTTPGetAction`: path `/`, scheme `HTTP`.
fn default_http_get(handler: &mut Value) {
    if let Some(get) = handler.get_mut("httpGet").filter(|g| g.is_object()) {
        set_default(get, &["path"], json!("/"));
        set_default(get, &["scheme"], json!("HTTP"));
    }
}

/// `ValidatePodSpec`, the part clients trip over: containers present, named and imaged.
fn validate_pod_spec(spec: Option<&Value>, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let containers = spec
        .and_then(|s| s.get("containers"))
        .and_then(Value::as_array);
    match containers {
        None => errors.push(FieldError::required(
            &Path::new(format!("{path}.containers")),
            "",
        )),
        Some(list) if list.is_empty() => errors.push(FieldError::required(
            &Path::new(format!("{path}.containers")),
            "",
        )),
        Some(list) => {
            let mut seen = std::collections::HashSet::new();
            for (i, c) in list.iter().enumerate() {
                let name = str_at(c, &["name"]).unwrap_or("");
                if name.is_empty() {
                    errors.push(FieldError::required(
                        &Path::new(format!("{path}.containers[{i}].name")),
                        "",
                    ));
                } else {
                    for problem in flotilla_api_machinery::names::is_dns1123_label(name) {
                        errors.push(FieldError::invalid(
                            &Path::new(format!("{path}.containers[{i}].name")),
                            json!(name),
                            &problem,
                        ));
                    }
                    if !seen.insert(name.to_string()) {
                        errors.push(FieldError::duplicate(
                            &Path::new(format!("{path}.containers[{i}].name")),
                            json!(name),
                        ));
                    }
                }
                if str_at(c, &["image"]).is_none_or(str::is_empty) {
                    errors.push(FieldError::required(
                        &Path::new(format!("{path}.containers[{i}].image")),
                        "",
                    ));
                }
            }
        }
    }
    if let Some(policy) = spec.and_then(|s| s.get("restartPolicy"))
        && !["Always", "OnFailure", "Never"].contains(&policy.as_str().unwrap_or(""))
    {
        errors.push(FieldError::not_supported(
            &Path::new(format!("{path}.restartPolicy")),
            policy.clone(),
            &["Always", "OnFailure", "Never"],
        ));
    }
    errors
}

/// Workload validation shared by Deployment, ReplicaSet, StatefulSet and DaemonSet:
/// non-negative replicas, a selector, and template labels the selector matches.
fn validate_workload(obj: &Value, has_replicas: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if has_replicas
        && let Some(replicas) = at(obj, &["spec", "replicas"]).and_then(Value::as_i64)
        && replicas < 0
    {
        errors.push(FieldError::invalid(
            &Path::new("spec.replicas"),
            json!(replicas),
            "must be greater than or equal to 0",
        ));
    }
    match at(obj, &["spec", "selector"]) {
        None | Some(Value::Null) => {
            errors.push(FieldError::required(&Path::new("spec.selector"), ""))
        }
        Some(selector) => {
            let labels = meta::string_map(at(obj, &["spec", "template", "metadata", "labels"]));
            match flotilla_api_machinery::selector::LabelSelector::from_json(selector) {
                Ok(parsed) if parsed.is_empty() => errors.push(FieldError::invalid(
                    &Path::new("spec.selector"),
                    selector.clone(),
                    "empty selector is invalid for deployment",
                )),
                Ok(parsed) if !parsed.matches(&labels) => errors.push(FieldError::invalid(
                    &Path::new("spec.template.metadata.labels"),
                    json!(labels),
                    "`selector` does not match template `labels`",
                )),
                Ok(_) => {}
                Err(err) => errors.push(FieldError::invalid(
                    &Path::new("spec.selector"),
                    selector.clone(),
                    err.to_string(),
                )),
            }
        }
    }
    errors.extend(validate_pod_spec(
        at(obj, &["spec", "template", "spec"]),
        "spec.template.spec",
    ));
    errors
}

fn default_template(obj: &mut Value, path: &[&str]) {
    if let Some(parent) = meta::object_at_mut(obj, &path[..path.len() - 1])
        && let Some(spec) = parent.get_mut(path[path.len() - 1])
    {
        default_pod_spec(spec);
    }
}

// ---------------------------------------------------------------- namespaces

/// Namespaces: Active on create, the `kubernetes` finalizer, DNS-label names.
pub struct NamespaceStrategy;
const NAMESPACE_FIELDS: &[FieldLabel] = &[FieldLabel::new("status.phase", &["status", "phase"])];

impl Strategy for NamespaceStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        NAMESPACE_FIELDS
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        meta::set_at(obj, &["status"], json!({"phase": "Active"}));
        meta::set_at(obj, &["spec", "finalizers"], json!(["kubernetes"]));
    }
    fn default(&self, obj: &mut Value) {
        let name = meta::name(obj).to_string();
        meta::set_at(
            obj,
            &["metadata", "labels", "kubernetes.io/metadata.name"],
            json!(name),
        );
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let name = meta::name(obj);
        flotilla_api_machinery::names::is_dns1123_label(name)
            .into_iter()
            .map(|p| FieldError::invalid(&Path::new("metadata.name"), json!(name), &p))
            .collect()
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Status", "string", "The status of the namespace", |o| {
                json!(str_at(o, &["status", "phase"]).unwrap_or(""))
            }),
            age_column(),
        ]
    }
}

// ---------------------------------------------------------------- pods

/// Pods: Pending on create, pod-spec defaults, spec immutability, phase/node field labels.
pub struct PodStrategy;

/// The READY, STATUS and RESTARTS cells of a pod, as upstream's `printPod`: init
/// containers first (`Init:N/M`, `Init:<reason>`, `Init:ExitCode:N`), then the app
/// containers from the last, sidecars counted among the containers, `Terminating`.
struct PodRow {
    ready: usize,
    total: usize,
    reason: String,
    restarts: i64,
    last_restart: Option<String>,
}

fn pod_row(pod: &Value) -> PodRow {
    let statuses = |key: &str| -> Vec<Value> {
        at(pod, &["status", key])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let init_specs: Vec<Value> = at(pod, &["spec", "initContainers"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let sidecar = |name: &str| {
        init_specs.iter().any(|c| {
            str_at(c, &["name"]) == Some(name) && str_at(c, &["restartPolicy"]) == Some("Always")
        })
    };
    let mut total = array_len(pod, &["spec", "containers"]);
    total += init_specs
        .iter()
        .filter(|c| str_at(c, &["restartPolicy"]) == Some("Always"))
        .count();
    let phase = str_at(pod, &["status", "phase"]).unwrap_or("");
    let mut reason = str_at(pod, &["status", "reason"])
        .filter(|r| !r.is_empty())
        .unwrap_or(phase)
        .to_string();
    let conditions = statuses("conditions");
    if conditions.iter().any(|c| {
        str_at(c, &["type"]) == Some("PodScheduled")
            && str_at(c, &["reason"]) == Some("SchedulingGated")
    }) {
        reason = "SchedulingGated".into();
    }
    let (mut ready, mut restarts, mut sidecar_restarts) = (0, 0i64, 0i64);
    let (mut last_restart, mut sidecar_last_restart): (Option<String>, Option<String>) =
        (None, None);
    let later = |current: &mut Option<String>, candidate: Option<&str>| {
        if let Some(c) = candidate
            && current.as_deref().is_none_or(|cur| cur < c)
        {
            *current = Some(c.to_string());
        }
    };
    let init_statuses = statuses("initContainerStatuses");
    let mut initializing = false;
    for (i, status) in init_statuses.iter().enumerate() {
        let name = str_at(status, &["name"]).unwrap_or("");
        let count = status
            .get("restartCount")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let finished = str_at(status, &["lastState", "terminated", "finishedAt"]);
        restarts += count;
        later(&mut last_restart, finished);
        if sidecar(name) {
            sidecar_restarts += count;
            later(&mut sidecar_last_restart, finished);
        }
        let terminated = at(status, &["state", "terminated"]);
        let exit = terminated
            .and_then(|t| t.get("exitCode"))
            .and_then(Value::as_i64);
        let waiting_reason = str_at(status, &["state", "waiting", "reason"]).unwrap_or("");
        if exit == Some(0) {
            continue;
        }
        if sidecar(name) && status.get("started") == Some(&json!(true)) {
            if status.get("ready") == Some(&json!(true)) {
                ready += 1;
            }
            continue;
        }
        reason = if let Some(t) = terminated {
            match str_at(t, &["reason"]).filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                    Some(signal) => format!("Init:Signal:{signal}"),
                    None => format!("Init:ExitCode:{}", exit.unwrap_or(0)),
                },
            }
        } else if !waiting_reason.is_empty() && waiting_reason != "PodInitializing" {
            format!("Init:{waiting_reason}")
        } else {
            format!("Init:{i}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = conditions.iter().any(|c| {
        str_at(c, &["type"]) == Some("Initialized") && str_at(c, &["status"]) == Some("True")
    });
    if !initializing || initialized {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        for status in statuses("containerStatuses").iter().rev() {
            restarts += status
                .get("restartCount")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            later(
                &mut last_restart,
                str_at(status, &["lastState", "terminated", "finishedAt"]),
            );
            let waiting = str_at(status, &["state", "waiting", "reason"]).unwrap_or("");
            let terminated = at(status, &["state", "terminated"]);
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if let Some(t) = terminated {
                reason = match str_at(t, &["reason"]).filter(|r| !r.is_empty()) {
                    Some(r) => r.to_string(),
                    None => match t.get("signal").and_then(Value::as_i64).filter(|s| *s != 0) {
                        Some(signal) => format!("Signal:{signal}"),
                        None => format!(
                            "ExitCode:{}",
                            t.get("exitCode").and_then(Value::as_i64).unwrap_or(0)
                        ),
                    },
                };
            } else if status.get("ready") == Some(&json!(true))
                && at(status, &["state", "running"]).is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            let pod_ready = conditions.iter().any(|c| {
                str_at(c, &["type"]) == Some("Ready") && str_at(c, &["status"]) == Some("True")
            });
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if meta::is_terminating(pod) {
        if str_at(pod, &["status", "reason"]) == Some("NodeLost") {
            reason = "Unknown".into();
        } else if !matches!(phase, "Succeeded" | "Failed") {
            reason = "Terminating".into();
        }
    }
    PodRow {
        ready,
        total,
        reason,
        restarts,
        last_restart,
    }
}

fn pod_status_cell(pod: &Value) -> Value {
    json!(pod_row(pod).reason)
}

/// What a pod's `resize` subresource keeps of a request (see [`resize::resize_only`]).
pub(crate) fn resize_only(requested: &Value, current: &Value) -> Value {
    resize::resize_only(requested, current)
}

/// `GetPodQOS`: Guaranteed when every container has CPU and memory limits equal to its
/// requests, BestEffort when none has any, Burstable otherwise.
fn pod_qos_class(pod: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|list| at(pod, &["spec", list]).and_then(Value::as_array))
        .flatten()
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for container in &containers {
        let requests = meta::string_map(at(container, &["resources", "requests"]));
        let limits = meta::string_map(at(container, &["resources", "limits"]));
        any |= !requests.is_empty() || !limits.is_empty();
        for resource in ["cpu", "memory"] {
            let limit = limits.get(resource);
            // A request left out defaults to the limit.
            let request = requests.get(resource).or(limit);
            if limit.is_none() || request != limit {
                guaranteed = false;
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

const POD_FIELDS: &[FieldLabel] = &[
    FieldLabel::new("spec.nodeName", &["spec", "nodeName"]),
    FieldLabel::new("spec.restartPolicy", &["spec", "restartPolicy"]),
    FieldLabel::new("spec.schedulerName", &["spec", "schedulerName"]),
    FieldLabel::new("spec.serviceAccountName", &["spec", "serviceAccountName"]),
    FieldLabel::new("spec.hostNetwork", &["spec", "hostNetwork"]).or("false"),
    FieldLabel::new("status.phase", &["status", "phase"]),
    FieldLabel::new("status.podIP", &["status", "podIP"]),
    FieldLabel::new("status.nominatedNodeName", &["status", "nominatedNodeName"]),
];

impl Strategy for PodStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        POD_FIELDS
    }
    fn prepare_for_create(&self, obj: &mut Value) {
        let qos = pod_qos_class(obj);
        meta::set_at(
            obj,
            &["status"],
            json!({"phase": "Pending", "qosClass": qos}),
        );
    }
    fn graceful_delete_seconds(&self, pod: &Value, requested: Option<i64>) -> Option<i64> {
        let unbound = str_at(pod, &["spec", "nodeName"]).is_none_or(str::is_empty);
        let finished = matches!(
            str_at(pod, &["status", "phase"]),
            Some("Succeeded") | Some("Failed")
        );
        if unbound || finished {
            return Some(0);
        }
        let default = at(pod, &["spec", "terminationGracePeriodSeconds"])
            .and_then(Value::as_i64)
            .unwrap_or(30);
        // Upstream turns a negative request into the shortest real grace period.
        Some(requested.map_or(default, |g| if g < 0 { 1 } else { g }))
    }
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        // spec.nodeName is set only through pods/binding.
        if let Some(node) = at(old, &["spec", "nodeName"]) {
            meta::set_at(new, &["spec", "nodeName"], node.clone());
        }
    }
    fn prepare_for_update_to(&self, target: UpdateTarget, new: &mut Value, old: &Value) {
        self.prepare_for_update(new, old);
        // What the ServiceAccount and DefaultTolerationSeconds plugins give a new pod, given
        // to an update's body as well: the chain's mutating half runs on creates only here.
        crate::admission::service_account::default_name(new);
        if let Some(spec) = new.get_mut("spec") {
            crate::admission::default_toleration_seconds::add_default_tolerations(spec);
        }
        // Ephemeral containers change only through their subresource; an update of the pod
        // that does not mention them keeps them.
        if target != UpdateTarget::EphemeralContainers {
            match at(old, &["spec", "ephemeralContainers"]) {
                Some(list) => meta::set_at(new, &["spec", "ephemeralContainers"], list.clone()),
                None => {
                    meta::remove_at(new, &["spec", "ephemeralContainers"]);
                }
            }
        }
    }
    fn validate_update_to(
        &self,
        target: UpdateTarget,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        match target {
            UpdateTarget::EphemeralContainers => ephemeral::validate_update(new, old),
            UpdateTarget::Resize => resize::validate(new, old, pod_qos_class),
            _ => self.validate_update(new, old),
        }
    }
    fn default(&self, obj: &mut Value) {
        if let Some(spec) = obj.get_mut("spec") {
            default_pod_spec(spec);
            set_default(spec, &["enableServiceLinks"], json!(true));
            set_default(spec, &["priority"], json!(0));
        }
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_pod_spec(obj.get("spec"), "spec")
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errors = self.validate(new);
        // Upstream allows only image, activeDeadlineSeconds, tolerations (additions) and a few
        // more to change; comparing with those neutralised finds every other change.
        let neutral = |pod: &Value| {
            let mut spec = pod.get("spec").cloned().unwrap_or(Value::Null);
            for list in ["containers", "initContainers"] {
                if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
                    for c in containers {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
            if let Some(s) = spec.as_object_mut() {
                s.remove("activeDeadlineSeconds");
                s.remove("tolerations");
                s.remove("terminationGracePeriodSeconds");
            }
            spec
        };
        if neutral(new) != neutral(old) {
            errors.push(FieldError::forbidden(&Path::new("spec"), "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"));
        }
        errors
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Ready",
                "string",
                "The aggregate readiness state of this pod for accepting traffic.",
                |o| {
                    let row = pod_row(o);
                    json!(format!("{}/{}", row.ready, row.total))
                },
            ),
            Column::new(
                "Status",
                "string",
                "The aggregate status of the containers in this pod.",
                pod_status_cell,
            ),
            Column::new(
                "Restarts",
                "string",
                "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.",
                |o| {
                    let row = pod_row(o);
                    match row.last_restart {
                        Some(at) if row.restarts != 0 => json!(format!(
                            "{} ({} ago)",
                            row.restarts,
                            crate::table::since(Some(&at))
                        )),
                        _ => json!(row.restarts.to_string()),
                    }
                },
            ),
            age_column(),
            Column::new("IP", "string", "The IP address assigned to the pod", |o| {
                or_none(str_at(o, &["status", "podIP"]))
            })
            .wide(),
            Column::new(
                "Node",
                "string",
                "The node that the pod is assigned to",
                |o| or_none(str_at(o, &["spec", "nodeName"])),
            )
            .wide(),
            Column::new(
                "Nominated Node",
                "string",
                "The node that the pod is nominated to",
                |o| or_none(str_at(o, &["status", "nominatedNodeName"])),
            )
            .wide(),
            Column::new(
                "Readiness Gates",
                "string",
                "The readiness gates of the pod",
                |_| json!("<none>"),
            )
            .wide(),
        ]
    }
}

// ---------------------------------------------------------------- nodes

/// Nodes: keep the status the kubelet registers with; Ready condition in the table.
pub struct NodeStrategy;
const NODE_FIELDS: &[FieldLabel] =
    &[FieldLabel::new("spec.unschedulable", &["spec", "unschedulable"]).or("false")];

impl Strategy for NodeStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        NODE_FIELDS
    }
    fn keeps_status_on_create(&self) -> bool {
        true
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Status", "string", "The status of the node", |o| {
                let ready = at(o, &["status", "conditions"])
                    .and_then(Value::as_array)
                    .and_then(|c| c.iter().find(|c| c.get("type") == Some(&json!("Ready"))))
                    .and_then(|c| c.get("status").and_then(Value::as_str));
                let mut status = match ready {
                    Some("True") => "Ready".to_string(),
                    Some(_) => "NotReady".to_string(),
                    None => "Unknown".to_string(),
                };
                if at(o, &["spec", "unschedulable"]) == Some(&json!(true)) {
                    status.push_str(",SchedulingDisabled");
                }
                json!(status)
            }),
            Column::new("Roles", "string", "The roles of the node", |o| {
                let roles: Vec<String> = meta::labels(o)
                    .keys()
                    .filter_map(|k| {
                        k.strip_prefix("node-role.kubernetes.io/")
                            .map(str::to_string)
                    })
                    .collect();
                or_none(Some(&roles.join(",")))
            }),
            age_column(),
            Column::new(
                "Version",
                "string",
                "Kubelet Version reported by the node.",
                |o| json!(str_at(o, &["status", "nodeInfo", "kubeletVersion"]).unwrap_or("")),
            ),
            Column::new("Internal-IP", "string", "List of internal IPs.", |o| {
                node_address(o, "InternalIP")
            })
            .wide(),
            Column::new("External-IP", "string", "List of external IPs.", |o| {
                node_address(o, "ExternalIP")
            })
            .wide(),
            Column::new(
                "OS-Image",
                "string",
                "OS image reported by the node.",
                |o| or_none(str_at(o, &["status", "nodeInfo", "osImage"])),
            )
            .wide(),
            Column::new(
                "Kernel-Version",
                "string",
                "Kernel version reported by the node.",
                |o| or_none(str_at(o, &["status", "nodeInfo", "kernelVersion"])),
            )
            .wide(),
            Column::new(
                "Container-Runtime",
                "string",
                "Container runtime reported by the node.",
                |o| {
                    or_none(str_at(
                        o,
                        &["status", "nodeInfo", "containerRuntimeVersion"],
                    ))
                },
            )
            .wide(),
        ]
    }
}

/// The first node address of a type, or `<none>`.
fn node_address(node: &Value, kind: &str) -> Value {
    let address = at(node, &["status", "addresses"])
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|a| a.get("type") == Some(&json!(kind))))
        .and_then(|a| str_at(a, &["address"]));
    or_none(address)
}

// ---------------------------------------------------------------- services

/// Services: type/port defaults and validation; IPs and node ports are allocated by the store.
pub struct ServiceStrategy;
impl Strategy for ServiceStrategy {
    /// A new Service's status is upstream's empty one, which Go's encoder always writes
    /// (`{"loadBalancer":{}}`): clients test `status.loadBalancer` without a guard.
    fn prepare_for_create(&self, obj: &mut Value) {
        meta::set_at(obj, &["status"], json!({"loadBalancer": {}}));
    }
    /// Allocated values a client leaves out of an update are kept (upstream's
    /// `patchAllocatedValues`): a replace without `clusterIP` or `nodePort` does not free them.
    fn prepare_for_update(&self, new: &mut Value, old: &Value) {
        for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if at(new, &["spec", field]).is_none_or(|v| v.is_null() || v == "")
                && let Some(value) = at(old, &["spec", field])
            {
                meta::set_at(new, &["spec", field], value.clone());
            }
        }
        let old_ports = at(old, &["spec", "ports"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if let Some(ports) = meta::object_at_mut(new, &["spec"])
            .and_then(|s| s.get_mut("ports"))
            .and_then(Value::as_array_mut)
        {
            for port in ports {
                if port.get("nodePort").is_some_and(|p| !p.is_null()) {
                    continue;
                }
                let same = |p: &&Value| {
                    p.get("port") == port.get("port")
                        && str_at(p, &["protocol"]).unwrap_or("TCP")
                            == str_at(port, &["protocol"]).unwrap_or("TCP")
                };
                if let Some(node_port) = old_ports.iter().find(same).and_then(|p| p.get("nodePort"))
                {
                    meta::set_at(port, &["nodePort"], node_port.clone());
                }
            }
        }
    }
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errors = self.validate(new);
        let old_ip = str_at(old, &["spec", "clusterIP"]).unwrap_or("");
        let new_ip = str_at(new, &["spec", "clusterIP"]).unwrap_or("");
        if !old_ip.is_empty() && old_ip != new_ip {
            errors.push(FieldError::invalid(
                &Path::new("spec.clusterIPs[0]"),
                json!(new_ip),
                "may not change once set",
            ));
        }
        errors
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "type"], json!("ClusterIP"));
        set_default(obj, &["spec", "sessionAffinity"], json!("None"));
        let ty = str_at(obj, &["spec", "type"]).unwrap_or("").to_string();
        if ty != "ExternalName" {
            set_default(obj, &["spec", "internalTrafficPolicy"], json!("Cluster"));
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            set_default(obj, &["spec", "externalTrafficPolicy"], json!("Cluster"));
        }
        if let Some(ports) = at(obj, &["spec", "ports"])
            .cloned()
            .and_then(|p| p.as_array().cloned())
        {
            let defaulted: Vec<Value> = ports
                .into_iter()
                .map(|mut port| {
                    set_default(&mut port, &["protocol"], json!("TCP"));
                    if let Some(p) = port.get("port").cloned() {
                        set_default(&mut port, &["targetPort"], p);
                    }
                    port
                })
                .collect();
            meta::set_at(obj, &["spec", "ports"], Value::Array(defaulted));
        }
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let name = meta::name(obj);
        for p in flotilla_api_machinery::names::is_dns1035_label(name) {
            errors.push(FieldError::invalid(
                &Path::new("metadata.name"),
                json!(name),
                &p,
            ));
        }
        let ty = str_at(obj, &["spec", "type"]).unwrap_or("ClusterIP");
        if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
            errors.push(FieldError::not_supported(
                &Path::new("spec.type"),
                json!(ty),
                &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
            ));
        }
        let ports = at(obj, &["spec", "ports"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if ports.is_empty()
            && ty != "ExternalName"
            && str_at(obj, &["spec", "clusterIP"]) != Some("None")
        {
            errors.push(FieldError::required(&Path::new("spec.ports"), ""));
        }
        for (i, port) in ports.iter().enumerate() {
            match port.get("port").and_then(Value::as_i64) {
                Some(p) if (1..=65535).contains(&p) => {}
                Some(p) => errors.push(FieldError::invalid(
                    &Path::new(format!("spec.ports[{i}].port")),
                    json!(p),
                    "must be between 1 and 65535, inclusive",
                )),
                None => errors.push(FieldError::required(
                    &Path::new(format!("spec.ports[{i}].port")),
                    "",
                )),
            }
            if ports.len() > 1 && str_at(port, &["name"]).is_none_or(str::is_empty) {
                errors.push(FieldError::required(
                    &Path::new(format!("spec.ports[{i}].name")),
                    "",
                ));
            }
        }
        errors
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Type", "string", "The type of the service.", |o| {
                json!(str_at(o, &["spec", "type"]).unwrap_or(""))
            }),
            Column::new(
                "Cluster-IP",
                "string",
                "The cluster IP of the service.",
                |o| or_none(str_at(o, &["spec", "clusterIP"])),
            ),
            Column::new(
                "External-IP",
                "string",
                "The external IP of the service.",
                |o| {
                    let ingress: Vec<String> = at(o, &["status", "loadBalancer", "ingress"])
                        .and_then(Value::as_array)
                        .map(|l| {
                            l.iter()
                                .filter_map(|i| {
                                    str_at(i, &["ip"])
                                        .or_else(|| str_at(i, &["hostname"]))
                                        .map(str::to_string)
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    if !ingress.is_empty() {
                        return json!(ingress.join(","));
                    }
                    match str_at(o, &["spec", "type"]) {
                        Some("LoadBalancer") => json!("<pending>"),
                        Some("ExternalName") => {
                            json!(str_at(o, &["spec", "externalName"]).unwrap_or(""))
                        }
                        _ => json!("<none>"),
                    }
                },
            ),
            Column::new("Port(s)", "string", "The ports of the service.", |o| {
                let ports: Vec<String> = at(o, &["spec", "ports"])
                    .and_then(Value::as_array)
                    .map(|l| {
                        l.iter()
                            .map(|p| {
                                let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                                let proto = str_at(p, &["protocol"]).unwrap_or("TCP");
                                match p.get("nodePort").and_then(Value::as_i64) {
                                    Some(node_port) => format!("{port}:{node_port}/{proto}"),
                                    None => format!("{port}/{proto}"),
                                }
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                or_none(Some(&ports.join(",")))
            }),
            age_column(),
            Column::new("Selector", "string", "The selector of the service.", |o| {
                let sel: Vec<String> = meta::string_map(at(o, &["spec", "selector"]))
                    .into_iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                or_none(Some(&sel.join(",")))
            })
            .wide(),
        ]
    }
}

/// EndpointSlices.
pub struct EndpointSliceStrategy;
impl Strategy for EndpointSliceStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("AddressType", "string", "Address type", |o| {
                json!(str_at(o, &["addressType"]).unwrap_or(""))
            }),
            Column::new("Ports", "string", "Ports", |o| {
                let ports: Vec<String> = at(o, &["ports"])
                    .and_then(Value::as_array)
                    .map(|p| {
                        p.iter()
                            .filter_map(|p| p.get("port").and_then(Value::as_i64))
                            .map(|p| p.to_string())
                            .collect()
                    })
                    .unwrap_or_default();
                or_none(Some(&ports.join(",")))
            }),
            Column::new("Endpoints", "string", "Endpoint addresses", |o| {
                let addresses: Vec<String> = at(o, &["endpoints"])
                    .and_then(Value::as_array)
                    .map(|e| {
                        e.iter()
                            .filter_map(|e| e.get("addresses").and_then(Value::as_array))
                            .flatten()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                or_none(Some(&addresses.join(",")))
            }),
            age_column(),
        ]
    }
}

/// Endpoints: the ENDPOINTS column (`formatEndpoints`: the first three `ip:port`, then a count).
pub struct EndpointsStrategy;
impl Strategy for EndpointsStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Endpoints", "string", "Endpoints of the service", |o| {
                json!(format_endpoints(o))
            }),
            age_column(),
        ]
    }
}

fn format_endpoints(endpoints: &Value) -> String {
    const SHOWN: usize = 3;
    let mut all = Vec::new();
    for subset in at(endpoints, &["subsets"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let addresses = subset
            .get("addresses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let ports = subset
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for address in &addresses {
            let ip = str_at(address, &["ip"]).unwrap_or("");
            if ports.is_empty() {
                all.push(ip.to_string());
            }
            for port in &ports {
                let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
                all.push(format!("{ip}:{number}"));
            }
        }
    }
    match all.len() {
        0 => "<none>".to_string(),
        n if n <= SHOWN => all.join(","),
        n => format!("{} + {} more...", all[..SHOWN].join(","), n - SHOWN),
    }
}

/// Leases.
pub struct LeaseStrategy;
impl Strategy for LeaseStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Holder", "string", "The holder of the lease", |o| {
                json!(str_at(o, &["spec", "holderIdentity"]).unwrap_or(""))
            }),
            age_column(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_data_is_encoded_into_data_and_not_kept() {
        let mut secret =
            json!({"data": {"a": "b2xk", "keep": "eA=="}, "stringData": {"a": "new", "b": "two"}});
        SecretStrategy.default(&mut secret);
        assert_eq!(
            secret,
            json!({"type": "Opaque", "data": {"a": "bmV3", "keep": "eA==", "b": "dHdv"}})
        );
    }

    #[test]
    fn deployment_rolling_update_bounds_default_one_by_one() {
        let mut d = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}});
        DeploymentStrategy.default(&mut d);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": "25%"}})
        );
        let mut d = json!({"spec": {"strategy": {"type": "Recreate"}}});
        DeploymentStrategy.default(&mut d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
    }

    #[test]
    fn deployment_defaults_fill_rollout_and_pod_fields() {
        let mut d = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "nginx"}, {"name": "b", "image": "x:1.0"}]}}}});
        DeploymentStrategy.default(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"],
            "Always"
        );
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][1]["imagePullPolicy"],
            "IfNotPresent"
        );
    }

    #[test]
    fn selector_must_match_template() {
        let d = json!({"metadata": {"name": "d"}, "spec": {
            "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "y"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let errors = DeploymentStrategy.validate(&d);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.template.metadata.labels");
    }

    #[test]
    fn service_updates_keep_allocated_values() {
        let old = json!({"spec": {"clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.9"], "type": "NodePort",
            "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]}});
        let mut new = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        ServiceStrategy.prepare_for_update(&mut new, &old);
        assert_eq!(new["spec"]["clusterIP"], "10.96.0.9");
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30080);
        let mut moved = new.clone();
        moved["spec"]["clusterIP"] = json!("10.96.0.10");
        let errors = ServiceStrategy.validate_update(&moved, &old);
        assert!(
            errors.iter().any(|e| e.field == "spec.clusterIPs[0]"),
            "{errors:?}"
        );
    }

    #[test]
    fn pod_qos_follows_requests_and_limits() {
        let pod = |resources: Value| json!({"spec": {"containers": [{"name": "c", "resources": resources}]}});
        assert_eq!(pod_qos_class(&pod(json!({}))), "BestEffort");
        assert_eq!(
            pod_qos_class(&pod(json!({"limits": {"cpu": "1", "memory": "1Gi"}}))),
            "Guaranteed"
        );
        assert_eq!(
            pod_qos_class(&pod(json!({"requests": {"cpu": "1"}}))),
            "Burstable"
        );
    }

    #[test]
    fn pod_rows_follow_print_pod() {
        let waiting = |name: &str, reason: &str| {
            json!({"name": name, "ready": false, "restartCount": 0,
                   "state": {"waiting": {"reason": reason}}})
        };
        let done = |name: &str| {
            json!({"name": name, "ready": true, "restartCount": 0,
                   "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}})
        };
        let running = |name: &str, ready: bool| {
            json!({"name": name, "ready": ready, "restartCount": 0, "started": true,
                   "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}})
        };
        let pod = |inits: Value, apps: Value, initialized: &str| {
            json!({
                "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}, {"name": "side", "restartPolicy": "Always"}],
                         "containers": [{"name": "app"}]},
                "status": {"phase": "Pending",
                           "conditions": [{"type": "Initialized", "status": initialized}],
                           "initContainerStatuses": inits, "containerStatuses": apps},
            })
        };
        let app_waiting = json!([waiting("app", "PodInitializing")]);
        let cases = [
            (
                pod(
                    json!([
                        running("i1", false),
                        waiting("i2", "PodInitializing"),
                        waiting("side", "PodInitializing")
                    ]),
                    app_waiting.clone(),
                    "False",
                ),
                "Init:0/3",
                "0/2",
            ),
            (
                pod(
                    json!([
                        done("i1"),
                        running("i2", false),
                        waiting("side", "PodInitializing")
                    ]),
                    app_waiting.clone(),
                    "False",
                ),
                "Init:1/3",
                "0/2",
            ),
            (
                pod(
                    json!([
                        waiting("i1", "CrashLoopBackOff"),
                        waiting("i2", "PodInitializing"),
                        waiting("side", "PodInitializing")
                    ]),
                    app_waiting.clone(),
                    "False",
                ),
                "Init:CrashLoopBackOff",
                "0/2",
            ),
            (
                pod(
                    json!([{"name": "i1", "restartCount": 0, "state": {"terminated": {"exitCode": 3}}}, waiting("i2", "PodInitializing"), waiting("side", "PodInitializing")]),
                    app_waiting.clone(),
                    "False",
                ),
                "Init:ExitCode:3",
                "0/2",
            ),
            (
                pod(
                    json!([done("i1"), done("i2"), running("side", true)]),
                    app_waiting.clone(),
                    "True",
                ),
                "PodInitializing",
                "1/2",
            ),
            (
                pod(
                    json!([done("i1"), done("i2"), running("side", true)]),
                    json!([running("app", true)]),
                    "True",
                ),
                "Pending",
                "2/2",
            ),
        ];
        for (pod, status, ready) in cases {
            let row = pod_row(&pod);
            assert_eq!(row.reason, status, "{pod}");
            assert_eq!(format!("{}/{}", row.ready, row.total), ready, "{pod}");
        }
    }

    #[test]
    fn bound_pods_are_deleted_gracefully() {
        let bound = json!({"spec": {"nodeName": "n", "terminationGracePeriodSeconds": 12}, "status": {"phase": "Running"}});
        assert_eq!(PodStrategy.graceful_delete_seconds(&bound, None), Some(12));
        assert_eq!(
            PodStrategy.graceful_delete_seconds(&bound, Some(-5)),
            Some(1)
        );
        assert_eq!(
            PodStrategy.graceful_delete_seconds(&bound, Some(0)),
            Some(0)
        );
        assert_eq!(
            PodStrategy.graceful_delete_seconds(&json!({"spec": {}}), Some(30)),
            Some(0)
        );
    }

    #[test]
    fn endpoints_print_like_upstream() {
        let ep = |ips: &[&str]| {
            let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
            json!({"subsets": [{"addresses": addresses, "ports": [{"port": 80}]}]})
        };
        assert_eq!(format_endpoints(&json!({})), "<none>");
        assert_eq!(
            format_endpoints(&ep(&["10.0.0.1", "10.0.0.2"])),
            "10.0.0.1:80,10.0.0.2:80"
        );
        assert_eq!(
            format_endpoints(&ep(&[
                "1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4", "1.1.1.5"
            ])),
            "1.1.1.1:80,1.1.1.2:80,1.1.1.3:80 + 2 more..."
        );
    }

    #[test]
    fn pod_without_containers_is_invalid() {
        let errors = PodStrategy.validate(&json!({"spec": {}}));
        assert_eq!(
            errors,
            vec![FieldError::required(&Path::new("spec.containers"), "")]
        );
    }
}
