//! Upstream's default filter and score plugins as pure functions over a pod and a snapshot of
//! nodes (with the pods already bound to them): NodeName, NodeUnschedulable, TaintToleration,
//! NodeAffinity (nodeSelector and required affinity), NodeResourcesFit, NodePorts; scoring by
//! least-allocated and balanced allocation. An unschedulable pod gets upstream's message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, Taint, Toleration};

/// A node and what is already bound to it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// The node.
    pub node: Node,
    /// Requests of the pods bound to it (milli-CPU, bytes, pods).
    pub requested: Resources,
    /// The same with upstream's non-zero defaults for containers that request nothing
    /// (100m CPU, 200 MB), which scoring uses so best-effort pods still spread.
    pub non_zero_requested: Resources,
    /// Host ports in use, as (protocol, port).
    pub used_ports: Vec<(String, i32)>,
}

/// Amounts the scheduler compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU in millicores.
    pub milli_cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Number of pods.
    pub pods: i64,
}

/// Why a node does not fit (upstream's reason strings, counted in the message).
pub type Reason = String;

/// Parses a Kubernetes quantity into a number of `unit`s (1 for bytes and pods, 1000 for
/// millicores), rounding up as upstream does for requests.
pub fn parse_quantity(text: &str, scale: i64) -> Option<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => {
            10f64.powi(exponent.get(1..)?.parse().ok()?)
        }
        _ => return None,
    };
    Some((value * multiplier * scale as f64).ceil() as i64)
}

/// The requests of a pod: the sum over containers, at least the largest init container, plus
/// overhead (upstream's `computePodResourceRequest`), and one pod.
pub fn pod_requests(pod: &Pod) -> Resources {
    let Some(spec) = &pod.spec else {
        return Resources {
            pods: 1,
            ..Default::default()
        };
    };
    let of = |requests: Option<
        &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        let get = |name: &str, scale| {
            requests
                .and_then(|r| r.get(name))
                .and_then(|q| parse_quantity(&q.0, scale))
                .unwrap_or(0)
        };
        (get("cpu", 1000), get("memory", 1))
    };
    let mut cpu = 0;
    let mut memory = 0;
    for container in &spec.containers {
        let (c, m) = of(container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()));
        cpu += c;
        memory += m;
    }
    for container in spec.init_containers.iter().flatten() {
        let (c, m) = of(container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()));
        cpu = cpu.max(c);
        memory = memory.max(m);
    }
    let (c, m) = of(spec.overhead.as_ref());
    Resources {
        milli_cpu: cpu + c,
        memory: memory + m,
        pods: 1,
    }
}

/// Upstream's `DefaultMilliCPURequest` and `DefaultMemoryRequest` for scoring.
const DEFAULT_MILLI_CPU: i64 = 100;
const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// [`pod_requests`] with each container's missing CPU or memory request counted as upstream's
/// defaults (`GetNonzeroRequests`); for scoring only.
pub fn pod_non_zero_requests(pod: &Pod) -> Resources {
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    let mut total = Resources {
        pods: 1,
        ..Default::default()
    };
    for container in containers {
        let requests = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        let get = |name: &str, scale| {
            requests
                .and_then(|r| r.get(name))
                .and_then(|q| parse_quantity(&q.0, scale))
        };
        total.milli_cpu += get("cpu", 1000)
            .filter(|v| *v > 0)
            .unwrap_or(DEFAULT_MILLI_CPU);
        total.memory += get("memory", 1)
            .filter(|v| *v > 0)
            .unwrap_or(DEFAULT_MEMORY);
    }
    total
}

impl NodeInfo {
    /// A node with nothing bound to it yet.
    pub fn new(node: Node) -> Self {
        NodeInfo {
            node,
            requested: Resources::default(),
            non_zero_requested: Resources::default(),
            used_ports: Vec::new(),
        }
    }

    /// Counts `pod` as bound here.
    pub fn add_pod(&mut self, pod: &Pod) {
        let requests = pod_requests(pod);
        self.requested.milli_cpu += requests.milli_cpu;
        self.requested.memory += requests.memory;
        self.requested.pods += 1;
        let non_zero = pod_non_zero_requests(pod);
        self.non_zero_requested.milli_cpu += non_zero.milli_cpu;
        self.non_zero_requested.memory += non_zero.memory;
        self.non_zero_requested.pods += 1;
        self.used_ports.extend(host_ports(pod));
    }
}

fn allocatable(node: &Node) -> Resources {
    let get = |name: &str, scale| {
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(name))
            .and_then(|q| parse_quantity(&q.0, scale))
            .unwrap_or(0)
    };
    Resources {
        milli_cpu: get("cpu", 1000),
        memory: get("memory", 1),
        pods: get("pods", 1),
    }
}

/// Every filter, in upstream's order: `Ok(())` when the node fits, else the reasons.
pub fn filter(pod: &Pod, info: &NodeInfo) -> Result<(), Vec<Reason>> {
    let mut reasons = Vec::new();
    let node = &info.node;
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    let spec = pod.spec.as_ref();
    // NodeName
    if let Some(wanted) = spec
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        && wanted != node_name
    {
        reasons.push("node(s) didn't match the requested node name".into());
    }
    // NodeUnschedulable
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let tolerations: &[Toleration] = spec.and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
    if unschedulable
        && !tolerations.iter().any(|t| {
            t.key.as_deref() == Some("node.kubernetes.io/unschedulable")
                && t.effect.as_deref().is_none_or(|e| e == "NoSchedule")
        })
    {
        reasons.push("node(s) were unschedulable".into());
    }
    // TaintToleration
    let taints: &[Taint] = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[]);
    if let Some(taint) = taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
    {
        let value = taint
            .value
            .as_deref()
            .map(|v| format!(": {v}"))
            .unwrap_or_default();
        reasons.push(format!(
            "node(s) had untolerated taint {{{}{value}}}",
            taint.key
        ));
    }
    // NodeAffinity
    if !matches_node_selector(pod, node) {
        reasons.push("node(s) didn't match Pod's node affinity/selector".into());
    }
    // NodeResourcesFit
    let wanted = pod_requests(pod);
    let free = allocatable(node);
    if info.requested.pods + 1 > free.pods {
        reasons.push("Too many pods".into());
    }
    if wanted.milli_cpu > 0 && info.requested.milli_cpu + wanted.milli_cpu > free.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if wanted.memory > 0 && info.requested.memory + wanted.memory > free.memory {
        reasons.push("Insufficient memory".into());
    }
    // NodePorts
    let conflict = host_ports(pod)
        .iter()
        .any(|port| info.used_ports.contains(port));
    if conflict {
        reasons.push("node(s) didn't have free ports for the requested pod ports".into());
    }
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(reasons)
    }
}

/// Upstream `Toleration.ToleratesTaint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The host ports a pod asks for.
pub fn host_ports(pod: &Pod) -> Vec<(String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port
                .filter(|h| *h > 0)
                .map(|h| (p.protocol.clone().unwrap_or_else(|| "TCP".into()), h))
        })
        .collect()
}

/// `spec.nodeSelector` and `requiredDuringSchedulingIgnoredDuringExecution`.
pub fn matches_node_selector(pod: &Pod, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let Some(spec) = &pod.spec else {
        return true;
    };
    if let Some(selector) = &spec.node_selector
        && !selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let Some(required) = required else {
        return true;
    };
    let name = node.metadata.name.clone().unwrap_or_default();
    // Terms are ORed; the requirements of one term are ANDed; an empty term matches nothing.
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        expressions
            .iter()
            .all(|r| requirement_matches(r, labels.get(&r.key)))
            && fields.iter().all(|r| {
                let value = (r.key == "metadata.name").then_some(&name);
                requirement_matches(r, value)
            })
    })
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

/// Upstream's default scores, 0–100 each: least allocated (free share of CPU and memory after
/// the pod) and balanced allocation (how close the CPU and memory shares are).
pub fn score(pod: &Pod, info: &NodeInfo) -> i64 {
    let wanted = pod_non_zero_requests(pod);
    let free = allocatable(&info.node);
    let share = |used: i64, capacity: i64| {
        if capacity <= 0 {
            1.0
        } else {
            (used as f64 / capacity as f64).min(1.0)
        }
    };
    let used = info.non_zero_requested;
    let cpu = share(used.milli_cpu + wanted.milli_cpu, free.milli_cpu);
    let memory = share(used.memory + wanted.memory, free.memory);
    let least_allocated = ((1.0 - cpu) + (1.0 - memory)) / 2.0 * 100.0;
    let balanced = (1.0 - (cpu - memory).abs()) * 100.0;
    (least_allocated + balanced).round() as i64
}

/// Upstream's FitError message: `0/3 nodes are available: 1 Insufficient cpu, 2 node(s)
/// didn't match Pod's node affinity/selector.` (reasons counted, sorted).
pub fn fit_error(nodes: usize, reasons: &[Reason]) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for reason in reasons {
        *counts.entry(reason.as_str()).or_default() += 1;
    }
    let mut parts: Vec<String> = counts
        .into_iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    parts.sort();
    if nodes == 0 {
        // Upstream's ErrNoNodesAvailable.
        "no nodes available to schedule pods".to_string()
    } else if parts.is_empty() {
        format!("0/{nodes} nodes are available.")
    } else {
        format!("0/{nodes} nodes are available: {}.", parts.join(", "))
    }
}

/// Picks the best node for `pod`: (node name) or the FitError message.
pub fn schedule(pod: &Pod, nodes: &[NodeInfo]) -> Result<String, String> {
    let mut reasons = Vec::new();
    let mut best: Option<(i64, &str)> = None;
    for info in nodes {
        let name = info.node.metadata.name.as_deref().unwrap_or("");
        match filter(pod, info) {
            Ok(()) => {
                let value = score(pod, info);
                // Ties keep the first node in the snapshot's order (by name).
                let better = match best {
                    None => true,
                    Some((top, _)) => value > top,
                };
                if better {
                    best = Some((value, name));
                }
            }
            Err(why) => reasons.extend(why),
        }
    }
    match best {
        Some((_, name)) => Ok(name.to_string()),
        None => Err(fit_error(nodes.len(), &reasons)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(
        name: &str,
        cpu: &str,
        labels: serde_json::Value,
        taints: serde_json::Value,
    ) -> NodeInfo {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}},
        }))
        .expect("node");
        NodeInfo::new(node)
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).expect("pod")
    }

    #[test]
    fn quantities_parse_as_upstream() {
        assert_eq!(parse_quantity("100m", 1000), Some(100));
        assert_eq!(parse_quantity("2", 1000), Some(2000));
        assert_eq!(parse_quantity("0.5", 1000), Some(500));
        assert_eq!(parse_quantity("128Mi", 1), Some(128 * 1024 * 1024));
        assert_eq!(parse_quantity("1G", 1), Some(1_000_000_000));
        assert_eq!(parse_quantity("1e3", 1), Some(1000));
        assert_eq!(parse_quantity("bogus", 1), None);
    }

    #[test]
    fn filters_and_message_follow_upstream() {
        let nodes = vec![
            node("small", "1", json!({"zone": "a"}), json!([])),
            node(
                "tainted",
                "8",
                json!({"zone": "a"}),
                json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
            ),
            node("elsewhere", "8", json!({"zone": "b"}), json!([])),
        ];
        let wants_two_cpus_in_a = pod(json!({
            "nodeSelector": {"zone": "a"},
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
        }));
        assert_eq!(
            schedule(&wants_two_cpus_in_a, &nodes),
            Err("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}.".into())
        );
        let tolerant = pod(json!({
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
        }));
        assert_eq!(schedule(&tolerant, &nodes), Ok("tainted".into()));
        let affinity = pod(json!({
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}}},
            "containers": [{"name": "c", "image": "x"}],
        }));
        assert_eq!(schedule(&affinity, &nodes), Ok("elsewhere".into()));
    }

    #[test]
    fn least_allocated_spreads_and_ports_conflict() {
        let mut busy = node("busy", "4", json!({}), json!([]));
        busy.add_pod(&pod(json!({"containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": "3"}},
            "ports": [{"containerPort": 80, "hostPort": 8080}]}]})));
        let idle = node("idle", "4", json!({}), json!([]));
        let plain = pod(
            json!({"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]}),
        );
        assert_eq!(
            schedule(&plain, &[busy.clone(), idle.clone()]),
            Ok("idle".into())
        );
        let with_port = pod(
            json!({"containers": [{"name": "c", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
        );
        assert!(filter(&with_port, &busy).is_err());
        assert!(filter(&with_port, &idle).is_ok());
    }

    #[test]
    fn best_effort_pods_spread_by_their_non_zero_requests() {
        let best_effort = pod(json!({"containers": [{"name": "c", "image": "x"}]}));
        let mut first = node("a", "4", json!({}), json!([]));
        let second = node("b", "4", json!({}), json!([]));
        first.add_pod(&best_effort);
        assert_eq!(schedule(&best_effort, &[first, second]), Ok("b".into()));
    }
}
