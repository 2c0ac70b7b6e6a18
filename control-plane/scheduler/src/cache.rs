//! The scheduler's cache (upstream's `internal/cache`): the [`Snapshot`] kept up to date
//! incrementally from watch events, plus assumed pods — a pod counts on its node from the
//! moment the scheduler picks the node, before the binding is written and long before the
//! watch shows it bound, so the next pods never double-book the node. Pure data; `lib.rs`
//! feeds it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::framework::{ApiAction, NodeInfo, PodInfo, Snapshot};

/// The cache.
#[derive(Debug, Default)]
pub struct Cache {
    /// What the plugins read.
    pub snapshot: Snapshot,
    node_index: HashMap<String, usize>,
    /// Every counted pod's node.
    pod_nodes: HashMap<String, String>,
    /// Pods counted because the scheduler placed them, not yet seen bound.
    assumed: HashSet<String>,
    /// Pods bound to nodes the cache does not know (yet).
    orphans: HashMap<String, Vec<Arc<PodInfo>>>,
}

/// What a node event changed, for the queue's move events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeChange {
    /// A new node.
    Added,
    /// A change the filters look at (labels, taints, allocatable, unschedulable).
    Relevant,
    /// Only status noise (heartbeats, conditions).
    Irrelevant,
}

fn relevant_fields_equal(a: &Node, b: &Node) -> bool {
    a.metadata.labels == b.metadata.labels
        && a.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
            == b.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
        && a.status.as_ref().map(|s| &s.allocatable) == b.status.as_ref().map(|s| &s.allocatable)
}

impl Cache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The index of the node called `name` in the snapshot.
    pub fn node_index(&self, name: &str) -> Option<usize> {
        self.node_index.get(name).copied()
    }

    /// Adds or updates a node, keeping its pods.
    pub fn add_node(&mut self, node: Arc<Node>) -> NodeChange {
        let name = node.metadata.name.clone().unwrap_or_default();
        if let Some(&index) = self.node_index.get(&name) {
            let info = &mut self.snapshot.nodes[index];
            let relevant = !relevant_fields_equal(&info.node, &node);
            *info = info.with_node(node);
            return if relevant {
                NodeChange::Relevant
            } else {
                NodeChange::Irrelevant
            };
        }
        let mut info = NodeInfo::new(node);
        for pod in self.orphans.remove(&name).into_iter().flatten() {
            info.add_pod(pod);
        }
        self.node_index.insert(name, self.snapshot.nodes.len());
        self.snapshot.nodes.push(info);
        NodeChange::Added
    }

    /// Removes a node; its pods wait as orphans in case it comes back.
    pub fn remove_node(&mut self, name: &str) {
        let Some(index) = self.node_index.remove(name) else {
            return;
        };
        let info = self.snapshot.nodes.swap_remove(index);
        if let Some(moved) = self.snapshot.nodes.get(index) {
            self.node_index.insert(moved.name.clone(), index);
        }
        if !info.pods.is_empty() {
            self.orphans.insert(info.name, info.pods);
        }
    }

    /// Names of all nodes.
    pub fn node_names(&self) -> Vec<String> {
        self.node_index.keys().cloned().collect()
    }

    /// Counts `pod` on `node` (replacing an earlier version of it, assumed or not).
    pub fn add_pod(&mut self, pod: Arc<PodInfo>, node: &str) {
        self.remove_pod(&pod.key);
        self.pod_nodes.insert(pod.key.clone(), node.to_string());
        match self.node_index.get(node) {
            Some(&index) => self.snapshot.nodes[index].add_pod(pod),
            None => self.orphans.entry(node.to_string()).or_default().push(pod),
        }
    }

    /// Stops counting the pod with `key`; returns its node and the pod.
    pub fn remove_pod(&mut self, key: &str) -> Option<(String, Arc<PodInfo>)> {
        self.assumed.remove(key);
        let node = self.pod_nodes.remove(key)?;
        let pod = match self.node_index.get(&node) {
            Some(&index) => self.snapshot.nodes[index].remove_pod(key),
            None => {
                let orphans = self.orphans.get_mut(&node)?;
                let at = orphans.iter().position(|p| p.key == key)?;
                Some(orphans.swap_remove(at))
            }
        };
        pod.map(|p| (node, p))
    }

    /// Keys of every counted pod.
    pub fn pod_keys(&self) -> Vec<String> {
        self.pod_nodes.keys().cloned().collect()
    }

    /// The node `key` is counted on.
    pub fn pod_node(&self, key: &str) -> Option<&str> {
        self.pod_nodes.get(key).map(String::as_str)
    }

    /// Counts a pod the scheduler placed on `node` before the binding is written.
    pub fn assume(&mut self, pod: Arc<PodInfo>, node: &str) {
        let key = pod.key.clone();
        self.add_pod(pod, node);
        self.assumed.insert(key);
    }

    /// Whether `key` is assumed (placed by us, not yet seen bound).
    pub fn is_assumed(&self, key: &str) -> bool {
        self.assumed.contains(key)
    }

    /// Undoes [`Self::assume`] after a failed binding.
    pub fn forget(&mut self, key: &str) {
        if self.assumed.contains(key) {
            self.remove_pod(key);
        }
    }

    /// The watch shows the assumed pod bound: it stays counted, now as a bound pod.
    pub fn confirm(&mut self, key: &str) {
        self.assumed.remove(key);
    }

    /// Applies the volume PreBind writes to the cached claims and volumes at once, so the next
    /// pods see the static volume taken and the claim's selected node (upstream's assume
    /// caches for PVs and PVCs).
    pub fn assume_volumes(&mut self, actions: &[ApiAction]) {
        for ApiAction::Patch { path, patch } in actions {
            if let Some(name) = path.strip_prefix("/api/v1/persistentvolumes/") {
                if let Some(pv) = self.snapshot.pvs.get_mut(name)
                    && let Some(patched) = patched(pv.as_ref(), patch)
                {
                    *pv = Arc::new(patched);
                }
            } else if let Some(rest) = path.strip_prefix("/api/v1/namespaces/")
                && let Some((namespace, name)) = rest.split_once("/persistentvolumeclaims/")
            {
                let key = format!("{namespace}/{name}");
                if let Some(pvc) = self.snapshot.pvcs.get_mut(&key)
                    && let Some(patched) = patched(pvc.as_ref(), patch)
                {
                    *pvc = Arc::new(patched);
                }
            }
        }
    }
}

/// `object` with a JSON merge patch (RFC 7386) applied.
fn patched<T: serde::Serialize + serde::de::DeserializeOwned>(
    object: &T,
    patch: &Value,
) -> Option<T> {
    let mut value = serde_json::to_value(object).ok()?;
    merge(&mut value, patch);
    serde_json::from_value(value).ok()
}

fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "status": {"allocatable": {"cpu": "1", "memory": "1Gi", "pods": "10"}},
            }))
            .expect("node"),
        )
    }

    fn pod(name: &str) -> Arc<PodInfo> {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x",
                "resources": {"requests": {"cpu": "600m"}}}]},
        }))
        .expect("pod");
        Arc::new(PodInfo::new(Arc::new(pod)))
    }

    #[test]
    fn assumed_pods_count_until_forgotten_or_confirmed() {
        let mut cache = Cache::new();
        cache.add_node(node("a"));
        cache.assume(pod("p"), "a");
        assert_eq!(cache.snapshot.nodes[0].requested.milli_cpu, 600);
        assert!(cache.is_assumed("default/p"));
        cache.forget("default/p");
        assert_eq!(cache.snapshot.nodes[0].requested.milli_cpu, 0);
        cache.assume(pod("q"), "a");
        // The watch shows it bound: counted once, no longer assumed.
        cache.add_pod(pod("q"), "a");
        cache.confirm("default/q");
        assert_eq!(cache.snapshot.nodes[0].requested.milli_cpu, 600);
        assert!(!cache.is_assumed("default/q"));
        cache.forget("default/q");
        assert_eq!(cache.snapshot.nodes[0].pods.len(), 1);
    }

    #[test]
    fn pods_survive_their_node_going_and_coming_back() {
        let mut cache = Cache::new();
        cache.add_node(node("a"));
        cache.add_node(node("b"));
        cache.add_pod(pod("p"), "a");
        cache.remove_node("a");
        assert_eq!(cache.snapshot.nodes.len(), 1);
        assert_eq!(cache.node_index("b"), Some(0));
        assert_eq!(cache.add_node(node("a")), NodeChange::Added);
        let a = cache.node_index("a").expect("a");
        assert_eq!(cache.snapshot.nodes[a].pods.len(), 1);
        assert_eq!(cache.add_node(node("a")), NodeChange::Irrelevant);
        assert!(cache.remove_pod("default/p").is_some());
        assert_eq!(cache.snapshot.nodes[a].pods.len(), 0);
    }
}
