//! The scheduling framework as upstream's kube-scheduler (v1.33, `pkg/scheduler/framework`):
//! pods and nodes precomputed once ([`PodInfo`], [`NodeInfo`]), a [`Snapshot`] of the cluster,
//! the extension points as methods of [`Plugin`] (queue sort, pre-filter, filter, post-filter,
//! pre-score, score, reserve, permit, pre-bind, bind) and the default profile
//! ([`Framework::default`]) running upstream's default plugins in upstream's order. Everything
//! here is a pure function of its inputs; the loop in `lib.rs` does the API calls the binding
//! cycle asks for ([`BindingPlan`]).

pub mod inter_pod_affinity;
pub mod node_plugins;
pub mod pod_topology_spread;
pub mod preemption;
pub mod selector;
pub mod volumes;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Node, PersistentVolume, PersistentVolumeClaim, Pod,
    PodAffinityTerm, ReplicationController, Service, Taint, Toleration, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;

use self::selector::{Labels, Requirement, Selector};

/// Upstream's `MaxNodeScore`.
pub const MAX_NODE_SCORE: i64 = 100;

/// Amounts the scheduler compares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU in millicores.
    pub milli_cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Number of pods.
    pub pods: i64,
}

impl Resources {
    fn add(&mut self, other: &Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
    }

    fn sub(&mut self, other: &Resources) {
        self.milli_cpu -= other.milli_cpu;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.pods -= other.pods;
    }
}

/// Extended resources (`example.com/gpu`, `hugepages-2Mi`, …) by name.
pub type ScalarResources = BTreeMap<String, i64>;

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

type ResourceList = BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>;

/// Whether a resource name is an extended (scalar) resource the scheduler counts by name.
fn is_scalar(name: &str) -> bool {
    !matches!(
        name,
        "cpu" | "memory" | "ephemeral-storage" | "pods" | "storage"
    )
}

fn read_list(list: Option<&ResourceList>) -> (Resources, ScalarResources) {
    let mut resources = Resources::default();
    let mut scalar = ScalarResources::new();
    for (name, quantity) in list.into_iter().flatten() {
        let scale = if name == "cpu" { 1000 } else { 1 };
        let Some(value) = parse_quantity(&quantity.0, scale) else {
            continue;
        };
        match name.as_str() {
            "cpu" => resources.milli_cpu = value,
            "memory" => resources.memory = value,
            "ephemeral-storage" => resources.ephemeral_storage = value,
            "pods" => resources.pods = value,
            other if is_scalar(other) => {
                scalar.insert(other.to_string(), value);
            }
            _ => {}
        }
    }
    (resources, scalar)
}

/// The requests of a pod (upstream's `PodRequests`): the app containers and sidecars summed,
/// at least each init container with the sidecars started before it, plus overhead, and one
/// pod. While a resize is pending or under way, a container counts the larger of its spec and
/// what the kubelet reports (`resources`, `allocatedResources`); a resize the kubelet found
/// infeasible counts only what it reports.
pub fn pod_requests(pod: &Pod) -> (Resources, ScalarResources) {
    let mut total = Resources::default();
    let mut scalar = ScalarResources::new();
    if let Some(spec) = &pod.spec {
        let status = pod.status.as_ref();
        let infeasible = status
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "PodResizePending" && c.reason.as_deref() == Some("Infeasible"));
        let app_statuses = status.and_then(|s| s.container_statuses.as_deref());
        for container in &spec.containers {
            let (r, s) = container_requests(container, app_statuses, infeasible);
            total.add(&r);
            add_scalars(&mut scalar, s);
        }
        let init_statuses = status.and_then(|s| s.init_container_statuses.as_deref());
        let (mut sidecars, mut sidecar_scalars) = (Resources::default(), ScalarResources::new());
        let (mut init, mut init_scalars) = (Resources::default(), ScalarResources::new());
        for container in spec.init_containers.iter().flatten() {
            let (mut r, mut s) = container_requests(container, init_statuses, infeasible);
            if container.restart_policy.as_deref() == Some("Always") {
                total.add(&r);
                add_scalars(&mut scalar, s.clone());
                sidecars.add(&r);
                add_scalars(&mut sidecar_scalars, s);
                (r, s) = (sidecars, sidecar_scalars.clone());
            } else {
                r.add(&sidecars);
                add_scalars(&mut s, sidecar_scalars.clone());
            }
            max_into(&mut init, &mut init_scalars, &r, s);
        }
        max_into(&mut total, &mut scalar, &init, init_scalars);
        let (overhead, s) = read_list(spec.overhead.as_ref());
        total.add(&overhead);
        add_scalars(&mut scalar, s);
    }
    total.pods = 1;
    (total, scalar)
}

/// One container's requests as [`pod_requests`] counts them (upstream's `determineContainerReqs`).
fn container_requests(
    container: &Container,
    statuses: Option<&[ContainerStatus]>,
    infeasible: bool,
) -> (Resources, ScalarResources) {
    let desired = read_list(
        container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref()),
    );
    let Some(status) = statuses
        .into_iter()
        .flatten()
        .find(|s| s.name == container.name && s.resources.is_some())
    else {
        return desired;
    };
    let (mut total, mut scalar) = if infeasible {
        Default::default()
    } else {
        desired
    };
    let actual = read_list(status.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let allocated = read_list(status.allocated_resources.as_ref());
    for (r, s) in [actual, allocated] {
        max_into(&mut total, &mut scalar, &r, s);
    }
    (total, scalar)
}

fn add_scalars(into: &mut ScalarResources, from: ScalarResources) {
    for (name, value) in from {
        *into.entry(name).or_default() += value;
    }
}

/// Raises each amount of `into` to `other`'s where that is larger.
fn max_into(
    into: &mut Resources,
    into_scalars: &mut ScalarResources,
    other: &Resources,
    other_scalars: ScalarResources,
) {
    into.milli_cpu = into.milli_cpu.max(other.milli_cpu);
    into.memory = into.memory.max(other.memory);
    into.ephemeral_storage = into.ephemeral_storage.max(other.ephemeral_storage);
    for (name, value) in other_scalars {
        let entry = into_scalars.entry(name).or_default();
        *entry = (*entry).max(value);
    }
}

/// Upstream's `DefaultMilliCPURequest` and `DefaultMemoryRequest` for scoring.
pub const DEFAULT_MILLI_CPU: i64 = 100;
/// See [`DEFAULT_MILLI_CPU`].
pub const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

/// [`pod_requests`] with each container's missing CPU or memory request counted as upstream's
/// defaults (`GetNonzeroRequests`); for scoring only.
pub fn pod_non_zero_requests(pod: &Pod) -> Resources {
    let mut total = Resources {
        pods: 1,
        ..Default::default()
    };
    for container in pod.spec.iter().flat_map(|s| s.containers.iter()) {
        let (r, _) = read_list(
            container
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref()),
        );
        total.milli_cpu += if r.milli_cpu > 0 {
            r.milli_cpu
        } else {
            DEFAULT_MILLI_CPU
        };
        total.memory += if r.memory > 0 {
            r.memory
        } else {
            DEFAULT_MEMORY
        };
    }
    total
}

/// A host port a pod asks for (upstream's `HostPortInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The host IP (`0.0.0.0` when unset).
    pub ip: String,
    /// The port.
    pub port: i32,
}

impl HostPort {
    /// Two ports conflict on the same protocol and port when either listens on every address.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == "0.0.0.0" || other.ip == "0.0.0.0")
    }
}

/// The host ports a pod asks for.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|h| *h > 0)?;
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ip: p
                    .host_ip
                    .clone()
                    .filter(|ip| !ip.is_empty())
                    .unwrap_or_else(|| "0.0.0.0".into()),
                port,
            })
        })
        .collect()
}

/// A parsed pod (anti-)affinity term (upstream's `framework.AffinityTerm`).
#[derive(Debug, Clone)]
pub struct AffinityTerm {
    /// Namespaces named by the term (the pod's own when neither these nor a selector is set).
    pub namespaces: Vec<String>,
    /// Namespaces selected by labels (nothing when null).
    pub namespace_selector: Selector,
    /// The pods selected.
    pub selector: Selector,
    /// The topology domain key.
    pub topology_key: String,
}

impl AffinityTerm {
    fn new(owner: &Pod, term: &PodAffinityTerm) -> Self {
        let namespace = owner.metadata.namespace.clone().unwrap_or_default();
        let namespaces = match (&term.namespaces, &term.namespace_selector) {
            (Some(list), _) if !list.is_empty() => list.clone(),
            (_, None) => vec![namespace],
            _ => Vec::new(),
        };
        let mut selector = Selector::from_label_selector(term.label_selector.as_ref());
        // matchLabelKeys / mismatchLabelKeys merge the owner's label values into the selector.
        if term.label_selector.is_some() {
            let labels = owner.metadata.labels.as_ref();
            for key in term.match_label_keys.iter().flatten() {
                if let Some(value) = labels.and_then(|l| l.get(key)) {
                    selector.add_requirement(Requirement::In(key.clone(), vec![value.clone()]));
                }
            }
            for key in term.mismatch_label_keys.iter().flatten() {
                if let Some(value) = labels.and_then(|l| l.get(key)) {
                    selector.add_requirement(Requirement::NotIn(key.clone(), vec![value.clone()]));
                }
            }
        }
        AffinityTerm {
            namespaces,
            namespace_selector: Selector::from_label_selector(term.namespace_selector.as_ref()),
            selector,
            topology_key: term.topology_key.clone(),
        }
    }

    /// Whether the term selects `pod`, whose namespace has `namespace_labels`.
    pub fn matches(&self, pod: &PodInfo, namespace_labels: Option<&Labels>) -> bool {
        (self.namespaces.contains(&pod.namespace)
            || (namespace_labels.is_some() && self.namespace_selector.matches(namespace_labels)))
            && self.selector.matches(pod.labels())
    }
}

/// A preferred term and its weight.
#[derive(Debug, Clone)]
pub struct WeightedAffinityTerm {
    /// The term.
    pub term: AffinityTerm,
    /// 1–100.
    pub weight: i64,
}

/// A pod with everything the plugins read precomputed once (upstream's `framework.PodInfo`).
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// The pod.
    pub pod: Arc<Pod>,
    /// `namespace/name`.
    pub key: String,
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
    /// `spec.priority` (or its PriorityClass's value, see `lib.rs`).
    pub priority: i32,
    /// Whether the pod may preempt (`spec.preemptionPolicy` is not `Never`).
    pub may_preempt: bool,
    /// Requests for fit.
    pub requests: Resources,
    /// Extended resource requests.
    pub scalar_requests: ScalarResources,
    /// Requests for scoring (upstream's non-zero defaults).
    pub non_zero_requests: Resources,
    /// Host ports.
    pub host_ports: Vec<HostPort>,
    /// Required pod affinity terms.
    pub required_affinity_terms: Vec<AffinityTerm>,
    /// Required pod anti-affinity terms.
    pub required_anti_affinity_terms: Vec<AffinityTerm>,
    /// Preferred pod affinity terms.
    pub preferred_affinity_terms: Vec<WeightedAffinityTerm>,
    /// Preferred pod anti-affinity terms.
    pub preferred_anti_affinity_terms: Vec<WeightedAffinityTerm>,
    /// `metadata.deletionTimestamp` is set.
    pub terminating: bool,
    /// `status.startTime` (or creation) for preemption's ordering.
    pub start_time: Option<Timestamp>,
}

impl PodInfo {
    /// Precomputes `pod`.
    pub fn new(pod: Arc<Pod>) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let (requests, scalar_requests) = pod_requests(&pod);
        let spec = pod.spec.as_ref();
        let affinity = spec.and_then(|s| s.affinity.as_ref());
        let pod_affinity = affinity.and_then(|a| a.pod_affinity.as_ref());
        let anti_affinity = affinity.and_then(|a| a.pod_anti_affinity.as_ref());
        let required = |terms: Option<&Vec<PodAffinityTerm>>| {
            terms
                .into_iter()
                .flatten()
                .map(|t| AffinityTerm::new(&pod, t))
                .collect::<Vec<_>>()
        };
        let preferred = |terms: Option<&Vec<WeightedPodAffinityTerm>>| {
            terms
                .into_iter()
                .flatten()
                .map(|t| WeightedAffinityTerm {
                    term: AffinityTerm::new(&pod, &t.pod_affinity_term),
                    weight: i64::from(t.weight),
                })
                .collect::<Vec<_>>()
        };
        PodInfo {
            key: format!("{namespace}/{name}"),
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            may_preempt: spec.and_then(|s| s.preemption_policy.as_deref()) != Some("Never"),
            requests,
            scalar_requests,
            non_zero_requests: pod_non_zero_requests(&pod),
            host_ports: host_ports(&pod),
            required_affinity_terms: required(pod_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            required_anti_affinity_terms: required(anti_affinity.and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_affinity_terms: preferred(pod_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            preferred_anti_affinity_terms: preferred(anti_affinity.and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            start_time: pod
                .status
                .as_ref()
                .and_then(|s| s.start_time.as_ref())
                .or(pod.metadata.creation_timestamp.as_ref())
                .map(|t| t.0),
            namespace,
            name,
            pod,
        }
    }

    /// The pod's labels.
    pub fn labels(&self) -> Option<&Labels> {
        self.pod.metadata.labels.as_ref()
    }

    /// The pod's tolerations.
    pub fn tolerations(&self) -> &[Toleration] {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or(&[])
    }

    /// Whether the pod has any pod affinity or anti-affinity term.
    pub fn has_affinity(&self) -> bool {
        !(self.required_affinity_terms.is_empty()
            && self.required_anti_affinity_terms.is_empty()
            && self.preferred_affinity_terms.is_empty()
            && self.preferred_anti_affinity_terms.is_empty())
    }

    /// The node the pod asks for in `spec.nodeName`, or bound to.
    pub fn node_name(&self) -> Option<&str> {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
    }

    /// `status.nominatedNodeName`.
    pub fn nominated_node_name(&self) -> Option<&str> {
        self.pod
            .status
            .as_ref()
            .and_then(|s| s.nominated_node_name.as_deref())
            .filter(|n| !n.is_empty())
    }
}

/// A node and what is bound (or assumed) to it, precomputed (upstream's `framework.NodeInfo`).
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// `metadata.name`.
    pub name: String,
    /// The node.
    pub node: Arc<Node>,
    /// `status.allocatable`.
    pub allocatable: Resources,
    /// Extended resources in `status.allocatable`.
    pub allocatable_scalar: ScalarResources,
    /// Sum of the requests of the pods here.
    pub requested: Resources,
    /// Sum of the extended resource requests of the pods here.
    pub requested_scalar: ScalarResources,
    /// The same with upstream's non-zero defaults, for scoring.
    pub non_zero_requested: Resources,
    /// Host ports in use.
    pub used_ports: Vec<HostPort>,
    /// The pods here.
    pub pods: Vec<Arc<PodInfo>>,
    /// How many of them have any pod (anti-)affinity term.
    pub pods_with_affinity: usize,
    /// How many of them have a required anti-affinity term.
    pub pods_with_required_anti_affinity: usize,
    /// Counts of matching pods already taken here, forgotten whenever the pods change.
    pub match_counts: MatchCounts,
}

/// How many of a node's pods a (namespace, selector) pair matches, remembered between
/// scheduling cycles: pods of one ReplicaSet come one after another with the same selector,
/// and between two of them only the node that took the previous one changed. Spreading then
/// costs a look-up per node instead of a walk over every pod in the cluster.
#[derive(Default)]
pub struct MatchCounts(std::sync::Mutex<Vec<(String, Selector, i64)>>);

/// Selectors remembered per node: about as many as ReplicaSets whose pods are in the queue at
/// once.
const MATCH_COUNTS_KEPT: usize = 16;

impl MatchCounts {
    /// The count for `namespace` and `selector`, computed by `count` when not remembered.
    pub fn get_or_count(
        &self,
        namespace: &str,
        selector: &Selector,
        count: impl FnOnce() -> i64,
    ) -> i64 {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, n)) = kept
            .iter()
            .find(|(ns, s, _)| ns == namespace && s == selector)
        {
            return *n;
        }
        let n = count();
        if kept.len() >= MATCH_COUNTS_KEPT {
            kept.remove(0);
        }
        kept.push((namespace.to_string(), selector.clone(), n));
        n
    }

    fn forget(&mut self) {
        self.0.get_mut().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

impl Clone for MatchCounts {
    fn clone(&self) -> Self {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        MatchCounts(std::sync::Mutex::new(kept))
    }
}

impl std::fmt::Debug for MatchCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MatchCounts")
    }
}

impl NodeInfo {
    /// A node with nothing bound to it yet.
    pub fn new(node: Arc<Node>) -> Self {
        let (allocatable, allocatable_scalar) =
            read_list(node.status.as_ref().and_then(|s| s.allocatable.as_ref()));
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            node,
            allocatable,
            allocatable_scalar,
            requested: Resources::default(),
            requested_scalar: ScalarResources::new(),
            non_zero_requested: Resources::default(),
            used_ports: Vec::new(),
            pods: Vec::new(),
            pods_with_affinity: 0,
            pods_with_required_anti_affinity: 0,
            match_counts: MatchCounts::default(),
        }
    }

    /// The same pods on an updated node object.
    pub fn with_node(&self, node: Arc<Node>) -> Self {
        let mut info = NodeInfo::new(node);
        for pod in &self.pods {
            info.add_pod(pod.clone());
        }
        info
    }

    /// The node's labels.
    pub fn labels(&self) -> Option<&Labels> {
        self.node.metadata.labels.as_ref()
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().and_then(|l| l.get(key)).map(String::as_str)
    }

    /// The node's taints.
    pub fn taints(&self) -> &[Taint] {
        self.node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or(&[])
    }

    /// Counts `pod` here.
    pub fn add_pod(&mut self, pod: Arc<PodInfo>) {
        self.match_counts.forget();
        self.requested.add(&pod.requests);
        for (name, value) in &pod.scalar_requests {
            *self.requested_scalar.entry(name.clone()).or_default() += value;
        }
        self.non_zero_requested.add(&pod.non_zero_requests);
        self.used_ports.extend(pod.host_ports.iter().cloned());
        if pod.has_affinity() {
            self.pods_with_affinity += 1;
        }
        if !pod.required_anti_affinity_terms.is_empty() {
            self.pods_with_required_anti_affinity += 1;
        }
        self.pods.push(pod);
    }

    /// Stops counting the pod with `key`; returns it if it was here.
    pub fn remove_pod(&mut self, key: &str) -> Option<Arc<PodInfo>> {
        let at = self.pods.iter().position(|p| p.key == key)?;
        let pod = self.pods.swap_remove(at);
        self.match_counts.forget();
        self.requested.sub(&pod.requests);
        for (name, value) in &pod.scalar_requests {
            *self.requested_scalar.entry(name.clone()).or_default() -= value;
        }
        self.non_zero_requested.sub(&pod.non_zero_requests);
        for port in &pod.host_ports {
            if let Some(at) = self.used_ports.iter().position(|p| p == port) {
                self.used_ports.swap_remove(at);
            }
        }
        if pod.has_affinity() {
            self.pods_with_affinity -= 1;
        }
        if !pod.required_anti_affinity_terms.is_empty() {
            self.pods_with_required_anti_affinity -= 1;
        }
        Some(pod)
    }
}

/// What the plugins see of the cluster: the nodes with their pods, and the objects the plugins
/// consult (upstream's snapshot and listers), all keyed `namespace/name` (or `name`).
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The nodes, in a stable order (sampling walks it round-robin).
    pub nodes: Vec<NodeInfo>,
    /// Namespace labels by name (pod affinity's namespaceSelector).
    pub namespaces: HashMap<String, Labels>,
    /// PersistentVolumeClaims.
    pub pvcs: HashMap<String, Arc<PersistentVolumeClaim>>,
    /// PersistentVolumes.
    pub pvs: HashMap<String, Arc<PersistentVolume>>,
    /// StorageClasses.
    pub storage_classes: HashMap<String, Arc<StorageClass>>,
    /// Services (default spreading).
    pub services: HashMap<String, Arc<Service>>,
    /// ReplicaSets (default spreading).
    pub replica_sets: HashMap<String, Arc<ReplicaSet>>,
    /// StatefulSets (default spreading).
    pub stateful_sets: HashMap<String, Arc<StatefulSet>>,
    /// ReplicationControllers (default spreading).
    pub replication_controllers: HashMap<String, Arc<ReplicationController>>,
    /// PodDisruptionBudgets (preemption).
    pub pdbs: HashMap<String, Arc<PodDisruptionBudget>>,
    /// Pending pods nominated to a node by preemption, by node name.
    pub nominated: HashMap<String, Vec<Arc<PodInfo>>>,
}

impl Snapshot {
    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Labels of the namespace called `name`.
    pub fn namespace_labels(&self, name: &str) -> Option<&Labels> {
        self.namespaces.get(name)
    }
}

/// A plugin's verdict (upstream's `framework.Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// The node fits / the step passed.
    Success,
    /// The node does not fit, but preempting pods there might help.
    Unschedulable,
    /// The node does not fit and preemption cannot help.
    UnschedulableAndUnresolvable,
    /// Something went wrong (a missing object the pod needs).
    Error,
    /// The plugin has nothing to do for this pod.
    Skip,
}

/// A plugin's verdict with its reasons (upstream's `framework.Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The verdict.
    pub code: Code,
    /// Reasons, each counted in the FitError message.
    pub reasons: Vec<Cow<'static, str>>,
    /// The plugin that gave it.
    pub plugin: &'static str,
}

impl Status {
    /// Success.
    pub const fn success() -> Self {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    /// Skip.
    pub const fn skip() -> Self {
        Status {
            code: Code::Skip,
            reasons: Vec::new(),
            plugin: "",
        }
    }

    /// A failure with one reason.
    pub fn new(code: Code, reason: impl Into<Cow<'static, str>>) -> Self {
        Status {
            code,
            reasons: vec![reason.into()],
            plugin: "",
        }
    }

    /// Whether the step passed.
    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }

    /// Whether this rejects the pod.
    pub fn is_rejected(&self) -> bool {
        matches!(
            self.code,
            Code::Unschedulable | Code::UnschedulableAndUnresolvable | Code::Error
        )
    }

    /// The reasons joined as upstream's `Status.Message()`.
    pub fn message(&self) -> String {
        self.reasons.join(", ")
    }

    fn by_plugin(mut self, plugin: &'static str) -> Self {
        self.plugin = plugin;
        self
    }
}

/// Per-cycle data the plugins compute in PreFilter / PreScore and read in Filter / Score
/// (upstream's `CycleState`, typed).
#[derive(Debug, Clone, Default)]
pub struct CycleState {
    /// Filter plugins whose PreFilter returned Skip.
    pub skip_filter: Vec<&'static str>,
    /// Indices (into the Filter list) of the filters to run, once PreFilter has run.
    pub active_filters: Option<Vec<usize>>,
    /// Score plugins whose PreScore returned Skip.
    pub skip_score: Vec<&'static str>,
    /// InterPodAffinity's PreFilter counts.
    pub inter_pod_affinity: Option<inter_pod_affinity::PreFilterState>,
    /// InterPodAffinity's PreScore topology scores.
    pub inter_pod_affinity_score: Option<inter_pod_affinity::PreScoreState>,
    /// PodTopologySpread's PreFilter counts.
    pub topology_spread: Option<pod_topology_spread::PreFilterState>,
    /// PodTopologySpread's PreScore counts.
    pub topology_spread_score: Option<pod_topology_spread::PreScoreState>,
    /// VolumeBinding's claims of the pod.
    pub volumes: Option<volumes::PodVolumes>,
}

/// A node's score from one plugin.
#[derive(Debug, Clone)]
pub struct NodeScore {
    /// The node's index in the snapshot.
    pub node: usize,
    /// The score.
    pub score: i64,
}

/// An API write the binding cycle makes before binding (PreBind) — sans-IO.
#[derive(Debug, Clone, PartialEq)]
pub enum ApiAction {
    /// Merge-patch an object: (API path, JSON merge patch).
    Patch {
        /// e.g. `/api/v1/namespaces/ns/persistentvolumeclaims/data`.
        path: String,
        /// The merge patch.
        patch: serde_json::Value,
    },
}

/// What the binding cycle must do for a pod placed on `node`.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingPlan {
    /// The node.
    pub node: String,
    /// PreBind writes (volume binding), in order.
    pub pre_bind: Vec<ApiAction>,
}

/// The extension points, each a no-op by default. Plugins are stateless; per-cycle data lives
/// in [`CycleState`].
pub trait Plugin: Sync {
    /// Upstream's plugin name.
    fn name(&self) -> &'static str;

    /// QueueSort: whether `a` goes before `b` in the active queue.
    fn less(&self, _a: &QueuedOrder, _b: &QueuedOrder) -> bool {
        false
    }

    /// PreFilter: computes state once per cycle; a rejection rejects every node; Skip skips
    /// this plugin's Filter.
    fn pre_filter(&self, _state: &mut CycleState, _pod: &PodInfo, _snapshot: &Snapshot) -> Status {
        Status::skip()
    }

    /// PreFilterExtensions.AddPod: `added` is now counted on `node` (nominated pods, preemption).
    fn add_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _added: &PodInfo,
        _node: &NodeInfo,
        _snapshot: &Snapshot,
    ) {
    }

    /// PreFilterExtensions.RemovePod: `removed` is no longer counted on `node`.
    fn remove_pod(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _removed: &PodInfo,
        _node: &NodeInfo,
        _snapshot: &Snapshot,
    ) {
    }

    /// Filter: whether `pod` fits `node`.
    fn filter(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _node: &NodeInfo,
        _snapshot: &Snapshot,
    ) -> Status {
        Status::success()
    }

    /// PreScore: computes scoring state over the feasible nodes; Skip skips Score.
    fn pre_score(
        &self,
        _state: &mut CycleState,
        _pod: &PodInfo,
        _snapshot: &Snapshot,
        _feasible: &[usize],
    ) -> Status {
        Status::skip()
    }

    /// Score: a raw score for one feasible node.
    fn score(&self, _state: &CycleState, _pod: &PodInfo, _node: &NodeInfo) -> i64 {
        0
    }

    /// ScoreExtensions.NormalizeScore: brings the raw scores to 0–100.
    fn normalize_score(
        &self,
        _state: &CycleState,
        _snapshot: &Snapshot,
        _scores: &mut [NodeScore],
    ) {
    }

    /// Reserve: claims what the pod needs on the chosen node; returns PreBind writes.
    fn reserve(
        &self,
        _state: &CycleState,
        _pod: &PodInfo,
        _node: &NodeInfo,
        _snapshot: &Snapshot,
    ) -> Result<Vec<ApiAction>, Status> {
        Ok(Vec::new())
    }

    /// Permit: `Success` to bind now (no default plugin waits or denies).
    fn permit(&self, _pod: &PodInfo, _node: &str) -> Status {
        Status::success()
    }
}

/// What PrioritySort compares.
#[derive(Debug, Clone, Copy)]
pub struct QueuedOrder {
    /// The pod's priority.
    pub priority: i32,
    /// When it was (re)added to the queue.
    pub timestamp: std::time::Instant,
}

/// Why a pod fits nowhere (upstream's `Diagnosis`).
#[derive(Debug, Clone, Default)]
pub struct Diagnosis {
    /// Each rejected node's status, by index in the snapshot.
    pub node_statuses: Vec<(usize, Status)>,
    /// The status of every node not in `node_statuses` (a PreFilter rejection).
    pub absent_status: Option<Status>,
    /// A PreFilter rejection's message.
    pub pre_filter_msg: Option<String>,
    /// The plugins that rejected the pod (queueing hints).
    pub unschedulable_plugins: BTreeSet<&'static str>,
    /// The PostFilter's message (preemption).
    pub post_filter_msg: Option<String>,
}

/// Upstream's FitError.
#[derive(Debug, Clone)]
pub struct FitError {
    /// Nodes in the snapshot.
    pub num_all_nodes: usize,
    /// Why.
    pub diagnosis: Diagnosis,
}

impl FitError {
    /// Upstream's message: `0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match
    /// Pod's node affinity/selector. preemption: …` (reasons counted, sorted).
    pub fn message(&self) -> String {
        if self.num_all_nodes == 0 && self.diagnosis.pre_filter_msg.is_none() {
            // Upstream's ErrNoNodesAvailable.
            return "no nodes available to schedule pods".to_string();
        }
        let mut message = format!("0/{} nodes are available:", self.num_all_nodes);
        match &self.diagnosis.pre_filter_msg {
            Some(pre_filter) => message.push_str(&format!(" {pre_filter}.")),
            None => message.push_str(&format!(
                " {}.",
                reasons_histogram(self.diagnosis.node_statuses.iter().map(|(_, s)| s))
            )),
        }
        if let Some(post_filter) = &self.diagnosis.post_filter_msg {
            message.push_str(&format!(" {post_filter}."));
        }
        message
    }
}

/// `1 Insufficient cpu, 2 node(s) …`: each reason counted over the statuses, sorted.
pub fn reasons_histogram<'a>(statuses: impl Iterator<Item = &'a Status>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for status in statuses {
        for reason in &status.reasons {
            *counts.entry(reason.as_ref()).or_default() += 1;
        }
    }
    let mut parts: Vec<String> = counts
        .into_iter()
        .map(|(reason, count)| format!("{count} {reason}"))
        .collect();
    parts.sort();
    parts.join(", ")
}

/// A pod placed on a node.
#[derive(Debug, Clone)]
pub struct ScheduleResult {
    /// The chosen node's index in the snapshot.
    pub node: usize,
    /// Nodes filtered.
    pub evaluated: usize,
    /// Nodes that fit.
    pub feasible: usize,
    /// The cycle's state (Reserve reads it).
    pub state: CycleState,
}

/// Upstream's `minFeasibleNodesToFind`, `minFeasibleNodesPercentageToFind` and
/// `basePercentageOfNodesToScore`.
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;
const BASE_PERCENTAGE_OF_NODES_TO_SCORE: usize = 50;

/// How many feasible nodes to look for before scoring (upstream's `numFeasibleNodesToFind`
/// with the adaptive `percentageOfNodesToScore`): all of up to 100 nodes, else
/// `max(5, 50 - nodes/125)` percent, at least 100.
pub fn num_feasible_nodes_to_find(all_nodes: usize) -> usize {
    if all_nodes < MIN_FEASIBLE_NODES_TO_FIND {
        return all_nodes;
    }
    let percentage = BASE_PERCENTAGE_OF_NODES_TO_SCORE
        .saturating_sub(all_nodes / 125)
        .max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND);
    (all_nodes * percentage / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// A profile: the plugins enabled at each extension point, in order, with score weights.
pub struct Framework {
    /// QueueSort.
    pub queue_sort: &'static dyn Plugin,
    /// PreFilter.
    pub pre_filter: Vec<&'static dyn Plugin>,
    /// Filter.
    pub filter: Vec<&'static dyn Plugin>,
    /// PostFilter.
    pub post_filter: Vec<&'static str>,
    /// PreScore.
    pub pre_score: Vec<&'static dyn Plugin>,
    /// Score, with weights.
    pub score: Vec<(&'static dyn Plugin, i64)>,
    /// Reserve (and PreBind: the writes Reserve returns).
    pub reserve: Vec<&'static dyn Plugin>,
    /// Permit.
    pub permit: Vec<&'static dyn Plugin>,
    /// Bind.
    pub bind: &'static str,
}

impl Default for Framework {
    /// Upstream's default plugins (`getDefaultPlugins`), expanded per extension point in the
    /// MultiPoint order: SchedulingGates (PreEnqueue, in the queue), PrioritySort,
    /// NodeUnschedulable, NodeName, TaintToleration (3), NodeAffinity (2), NodePorts,
    /// NodeResourcesFit (1), VolumeBinding, VolumeZone, PodTopologySpread (2),
    /// InterPodAffinity (2), DefaultPreemption, NodeResourcesBalancedAllocation (1),
    /// DefaultBinder.
    fn default() -> Self {
        use inter_pod_affinity::InterPodAffinity;
        use node_plugins::*;
        use pod_topology_spread::PodTopologySpread;
        use volumes::{VolumeBinding, VolumeZone};
        Framework {
            queue_sort: &PrioritySort,
            pre_filter: vec![
                &NodeAffinity,
                &NodePorts,
                &NodeResourcesFit,
                &VolumeBinding,
                &VolumeZone,
                &PodTopologySpread,
                &InterPodAffinity,
            ],
            filter: vec![
                &NodeUnschedulable,
                &NodeName,
                &TaintToleration,
                &NodeAffinity,
                &NodePorts,
                &NodeResourcesFit,
                &VolumeBinding,
                &VolumeZone,
                &PodTopologySpread,
                &InterPodAffinity,
            ],
            post_filter: vec![preemption::NAME],
            pre_score: vec![
                &TaintToleration,
                &NodeAffinity,
                &NodeResourcesFit,
                &PodTopologySpread,
                &InterPodAffinity,
                &NodeResourcesBalancedAllocation,
            ],
            score: vec![
                (&TaintToleration, 3),
                (&NodeAffinity, 2),
                (&NodeResourcesFit, 1),
                (&PodTopologySpread, 2),
                (&InterPodAffinity, 2),
                (&NodeResourcesBalancedAllocation, 1),
            ],
            reserve: vec![&VolumeBinding],
            permit: Vec::new(),
            bind: DEFAULT_BINDER,
        }
    }
}

/// Upstream's DefaultBinder: `POST pods/{name}/binding` (done by `lib.rs`).
pub const DEFAULT_BINDER: &str = "DefaultBinder";

impl Framework {
    /// Runs the PreFilter plugins; the first rejection stops them.
    pub fn run_pre_filter(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
    ) -> Status {
        for plugin in &self.pre_filter {
            let status = plugin.pre_filter(state, pod, snapshot);
            match status.code {
                Code::Success => {}
                Code::Skip => state.skip_filter.push(plugin.name()),
                _ => return status.by_plugin(plugin.name()),
            }
        }
        state.active_filters = Some(
            (0..self.filter.len())
                .filter(|&i| !state.skip_filter.contains(&self.filter[i].name()))
                .collect(),
        );
        Status::success()
    }

    /// Runs the Filter plugins on one node; the first rejection stops them.
    pub fn run_filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Status {
        let run = |plugin: &'static dyn Plugin| {
            let status = plugin.filter(state, pod, node, snapshot);
            (!status.is_success()).then(|| status.by_plugin(plugin.name()))
        };
        let rejection = match &state.active_filters {
            Some(active) => active.iter().find_map(|&i| run(self.filter[i])),
            None => self
                .filter
                .iter()
                .filter(|p| !state.skip_filter.contains(&p.name()))
                .find_map(|p| run(*p)),
        };
        rejection.unwrap_or_else(Status::success)
    }

    /// Runs the AddPod extensions.
    pub fn run_add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) {
        for plugin in &self.pre_filter {
            if !state.skip_filter.contains(&plugin.name()) {
                plugin.add_pod(state, pod, added, node, snapshot);
            }
        }
    }

    /// Runs the RemovePod extensions.
    pub fn run_remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) {
        for plugin in &self.pre_filter {
            if !state.skip_filter.contains(&plugin.name()) {
                plugin.remove_pod(state, pod, removed, node, snapshot);
            }
        }
    }

    /// Filters with the pods nominated to the node that are at least as important counted
    /// there first, then without them (upstream's `RunFilterPluginsWithNominatedPods`).
    pub fn run_filter_with_nominated_pods(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Status {
        if snapshot.nominated.is_empty() {
            return self.run_filter(state, pod, node, snapshot);
        }
        let nominated: Vec<&Arc<PodInfo>> = snapshot
            .nominated
            .get(&node.name)
            .into_iter()
            .flatten()
            .filter(|n| n.priority >= pod.priority && n.key != pod.key)
            .collect();
        if !nominated.is_empty() {
            let mut with = node.clone();
            let mut state_with = state.clone();
            for added in nominated {
                with.add_pod(added.clone());
                self.run_add_pod(&mut state_with, pod, added, &with, snapshot);
            }
            let status = self.run_filter(&state_with, pod, &with, snapshot);
            if !status.is_success() {
                return status;
            }
        }
        self.run_filter(state, pod, node, snapshot)
    }

    /// Schedules one pod (upstream's `schedulePod`): PreFilter, Filter over a sample of nodes
    /// starting at `start` (the caller advances it by `evaluated`), PreScore, Score, and the
    /// best node; or the FitError.
    pub fn schedule_pod(
        &self,
        pod: &PodInfo,
        snapshot: &Snapshot,
        start: usize,
    ) -> Result<ScheduleResult, Box<(FitError, CycleState)>> {
        let all = snapshot.nodes.len();
        let mut state = CycleState::default();
        let mut diagnosis = Diagnosis::default();
        if all == 0 {
            return Err(Box::new((
                FitError {
                    num_all_nodes: 0,
                    diagnosis,
                },
                state,
            )));
        }
        let pre_filter = self.run_pre_filter(&mut state, pod, snapshot);
        if !pre_filter.is_success() {
            diagnosis.pre_filter_msg = Some(pre_filter.message());
            diagnosis.unschedulable_plugins.insert(pre_filter.plugin);
            diagnosis.absent_status = Some(Status {
                code: Code::UnschedulableAndUnresolvable,
                ..pre_filter
            });
            return Err(Box::new((
                FitError {
                    num_all_nodes: all,
                    diagnosis,
                },
                state,
            )));
        }
        // A pod nominated by an earlier preemption tries its nominated node first.
        if let Some(nominated) = pod.nominated_node_name()
            && let Some(index) = snapshot.nodes.iter().position(|n| n.name == nominated)
            && self
                .run_filter_with_nominated_pods(&state, pod, &snapshot.nodes[index], snapshot)
                .is_success()
        {
            return Ok(ScheduleResult {
                node: index,
                evaluated: 0,
                feasible: 1,
                state,
            });
        }
        let wanted = num_feasible_nodes_to_find(all);
        let mut feasible: Vec<usize> = Vec::with_capacity(wanted.min(all));
        let mut evaluated = 0;
        for offset in 0..all {
            if feasible.len() >= wanted {
                break;
            }
            let index = (start + offset) % all;
            evaluated += 1;
            let status =
                self.run_filter_with_nominated_pods(&state, pod, &snapshot.nodes[index], snapshot);
            if status.is_success() {
                feasible.push(index);
            } else {
                diagnosis.unschedulable_plugins.insert(status.plugin);
                diagnosis.node_statuses.push((index, status));
            }
        }
        if feasible.is_empty() {
            return Err(Box::new((
                FitError {
                    num_all_nodes: all,
                    diagnosis,
                },
                state,
            )));
        }
        if feasible.len() == 1 {
            return Ok(ScheduleResult {
                node: feasible[0],
                evaluated,
                feasible: 1,
                state,
            });
        }
        let totals = self.prioritize(&mut state, pod, snapshot, &feasible);
        // The highest total; ties go to the first in evaluation order (upstream picks one of
        // them at random).
        let mut best = 0;
        for (i, total) in totals.iter().enumerate() {
            if *total > totals[best] {
                best = i;
            }
        }
        Ok(ScheduleResult {
            node: feasible[best],
            evaluated,
            feasible: feasible.len(),
            state,
        })
    }

    /// PreScore and Score over the feasible nodes: each plugin's normalized score times its
    /// weight, summed per node (upstream's `prioritizeNodes`).
    pub fn prioritize(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        feasible: &[usize],
    ) -> Vec<i64> {
        for plugin in &self.pre_score {
            if plugin.pre_score(state, pod, snapshot, feasible).code == Code::Skip {
                state.skip_score.push(plugin.name());
            }
        }
        let mut totals = vec![0i64; feasible.len()];
        let mut scores: Vec<NodeScore> = Vec::with_capacity(feasible.len());
        for (plugin, weight) in &self.score {
            if state.skip_score.contains(&plugin.name()) {
                continue;
            }
            scores.clear();
            scores.extend(feasible.iter().map(|&node| NodeScore {
                node,
                score: plugin.score(state, pod, &snapshot.nodes[node]),
            }));
            plugin.normalize_score(state, snapshot, &mut scores);
            for (total, score) in totals.iter_mut().zip(&scores) {
                *total += score.score * weight;
            }
        }
        totals
    }

    /// Reserve and Permit on the chosen node: the binding cycle's plan, or the rejection.
    pub fn reserve_and_permit(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Result<BindingPlan, Status> {
        let mut pre_bind = Vec::new();
        for plugin in &self.reserve {
            pre_bind.extend(
                plugin
                    .reserve(state, pod, node, snapshot)
                    .map_err(|s| s.by_plugin(plugin.name()))?,
            );
        }
        for plugin in &self.permit {
            let status = plugin.permit(pod, &node.name);
            if !status.is_success() {
                return Err(status.by_plugin(plugin.name()));
            }
        }
        Ok(BindingPlan {
            node: node.name.clone(),
            pre_bind,
        })
    }
}

/// Upstream's `DefaultNormalizeScore`: scales to 0–100 by the highest score, reversed if asked.
pub fn default_normalize_score(scores: &mut [NodeScore], reverse: bool) {
    let max = scores.iter().map(|s| s.score).max().unwrap_or(0);
    if max == 0 {
        if reverse {
            for s in scores {
                s.score = MAX_NODE_SCORE;
            }
        }
        return;
    }
    for s in scores {
        let scaled = MAX_NODE_SCORE * s.score / max;
        s.score = if reverse {
            MAX_NODE_SCORE - scaled
        } else {
            scaled
        };
    }
}

#[cfg(test)]
mod tests;
