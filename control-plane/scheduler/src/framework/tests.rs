//! Table-driven tests of the framework against upstream's own test cases (each table names
//! the upstream test it mirrors, in `pkg/scheduler/framework/plugins/...`), plus whole
//! scheduling cycles: messages, preemption and volumes.

// Each table is a vector of tuples, one per upstream case.
#![allow(clippy::type_complexity)]

use std::sync::Arc;

use serde_json::{Value, json};

use super::inter_pod_affinity::{
    AFFINITY_NOT_MATCH, ANTI_AFFINITY_NOT_MATCH, EXISTING_ANTI_AFFINITY_NOT_MATCH,
};
use super::pod_topology_spread::{CONSTRAINTS_NOT_MATCH, NODE_LABEL_NOT_MATCH};
use super::*;
use crate::cache::Cache;

fn node_with(name: &str, cpu: &str, labels: Value, taints: Value) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}},
        }))
        .expect("node"),
    )
}

fn node(name: &str, labels: Value) -> Arc<Node> {
    node_with(name, "8", labels, json!([]))
}

fn pod_in(namespace: &str, name: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
    let mut spec = spec;
    if spec.get("containers").is_none() {
        spec["containers"] = json!([{"name": "c", "image": "x"}]);
    }
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .expect("pod");
    Arc::new(PodInfo::new(Arc::new(pod)))
}

fn pod(name: &str, labels: Value, spec: Value) -> Arc<PodInfo> {
    pod_in("default", name, labels, spec)
}

fn cpu_pod(name: &str, cpu: &str, priority: i32) -> Arc<PodInfo> {
    pod(
        name,
        json!({}),
        json!({"priority": priority, "containers": [{"name": "c", "image": "x",
            "resources": {"requests": {"cpu": cpu}}}]}),
    )
}

/// A cache with `nodes` and `(pod, node)` placements.
fn cluster(nodes: Vec<Arc<Node>>, pods: Vec<(Arc<PodInfo>, &str)>) -> Cache {
    let mut cache = Cache::new();
    for n in nodes {
        cache.add_node(n);
    }
    for (p, n) in pods {
        cache.add_pod(p, n);
    }
    cache
}

/// Runs PreFilter then Filter on every node: `None` for a fit, else the reasons.
fn filter_all(pod: &PodInfo, snapshot: &Snapshot) -> Vec<Option<String>> {
    let framework = Framework::default();
    let mut state = CycleState::default();
    let pre = framework.run_pre_filter(&mut state, pod, snapshot);
    if !pre.is_success() {
        return snapshot.nodes.iter().map(|_| Some(pre.message())).collect();
    }
    snapshot
        .nodes
        .iter()
        .map(|n| {
            let status = framework.run_filter(&state, pod, n, snapshot);
            (!status.is_success()).then(|| status.message())
        })
        .collect()
}

/// One plugin's normalized scores over every node.
fn scores_of(plugin: &dyn Plugin, pod: &PodInfo, snapshot: &Snapshot) -> Vec<i64> {
    let mut state = CycleState::default();
    let feasible: Vec<usize> = (0..snapshot.nodes.len()).collect();
    plugin.pre_filter(&mut state, pod, snapshot);
    if plugin.pre_score(&mut state, pod, snapshot, &feasible).code == Code::Skip {
        return vec![0; feasible.len()];
    }
    let mut scores: Vec<NodeScore> = feasible
        .iter()
        .map(|&i| NodeScore {
            node: i,
            score: plugin.score(&state, pod, &snapshot.nodes[i]),
        })
        .collect();
    plugin.normalize_score(&state, snapshot, &mut scores);
    scores.into_iter().map(|s| s.score).collect()
}

fn schedule(pod: &PodInfo, snapshot: &Snapshot) -> Result<String, String> {
    match Framework::default().schedule_pod(pod, snapshot, 0) {
        Ok(result) => Ok(snapshot.nodes[result.node].name.clone()),
        Err(unschedulable) => Err(unschedulable.0.message()),
    }
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

/// tainttoleration/taint_toleration_test.go `TestTaintTolerationFilter`.
#[test]
fn taint_toleration_filter_as_upstream() {
    let cases: &[(&str, Value, Value, Option<&str>)] = &[
        (
            "A pod having no tolerations can't be scheduled onto a node with nonempty taints",
            json!([]),
            json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
            Some("node(s) had untolerated taint {dedicated: user1}"),
        ),
        (
            "A pod which can be scheduled on a dedicated node assigned to user1 with effect NoSchedule",
            json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
            None,
        ),
        (
            "A pod which can't be scheduled on a dedicated node assigned to user2 with effect NoSchedule",
            json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "value": "user1", "effect": "NoSchedule"}]),
            Some("node(s) had untolerated taint {dedicated: user1}"),
        ),
        (
            "A pod can be scheduled onto the node, with a toleration uses operator Exists that tolerates the taints on the node",
            json!([{"key": "foo", "operator": "Exists", "effect": "NoSchedule"}]),
            json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
            None,
        ),
        (
            "A pod has multiple tolerations, node has multiple taints, all the taints are tolerated, pod can be scheduled onto the node",
            json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"},
                   {"key": "foo", "operator": "Exists", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "value": "user2", "effect": "NoSchedule"},
                   {"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
            None,
        ),
        (
            "A pod has a toleration that keys and values match the taint on the node, but (non-empty) effect doesn't match, can't be scheduled onto the node",
            json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
            json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
            Some("node(s) had untolerated taint {foo: bar}"),
        ),
        (
            "The pod has a toleration that keys and values match the taint on the node, the effect of toleration is empty, and the effect of taint is NoSchedule. Pod can be scheduled onto the node",
            json!([{"key": "foo", "operator": "Equal", "value": "bar"}]),
            json!([{"key": "foo", "value": "bar", "effect": "NoSchedule"}]),
            None,
        ),
        (
            "The pod has a toleration that key and value don't match the taint on the node, but the effect of taint on node is PreferNoSchedule. Pod can be scheduled onto the node",
            json!([{"key": "dedicated", "operator": "Equal", "value": "user2", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "value": "user1", "effect": "PreferNoSchedule"}]),
            None,
        ),
        (
            "The pod has no toleration, but the effect of taint on node is PreferNoSchedule. Pod can be scheduled onto the node",
            json!([]),
            json!([{"key": "dedicated", "value": "user1", "effect": "PreferNoSchedule"}]),
            None,
        ),
        (
            // A NoExecute taint without a value, as the node lifecycle controller sets.
            "An untolerated NoExecute taint without a value",
            json!([]),
            json!([{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
            Some("node(s) had untolerated taint {node.kubernetes.io/unreachable: }"),
        ),
    ];
    for (name, tolerations, taints, want) in cases {
        let cache = cluster(vec![node_with("n", "8", json!({}), taints.clone())], vec![]);
        let p = pod("p", json!({}), json!({"tolerations": tolerations}));
        assert_eq!(
            filter_all(&p, &cache.snapshot),
            vec![want.map(str::to_string)],
            "{name}"
        );
    }
}

/// tainttoleration/taint_toleration_test.go `TestTaintTolerationScore`.
#[test]
fn taint_toleration_score_as_upstream() {
    let prefer =
        |key: &str, value: &str| json!({"key": key, "value": value, "effect": "PreferNoSchedule"});
    let cases: &[(&str, Value, Vec<Value>, Vec<i64>)] = &[
        (
            "node with taints tolerated by the pod, gets a higher score than those node with intolerable taints",
            json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
            vec![
                json!([prefer("foo", "bar")]),
                json!([prefer("foo", "blah")]),
            ],
            vec![100, 0],
        ),
        (
            "the nodes that all of their taints are tolerated by the pod, get the same score, no matter how many tolerable taints a node has",
            json!([{"key": "cpu-type", "operator": "Equal", "value": "arm64", "effect": "PreferNoSchedule"},
                   {"key": "disk-type", "operator": "Equal", "value": "ssd", "effect": "PreferNoSchedule"}]),
            vec![
                json!([]),
                json!([prefer("cpu-type", "arm64")]),
                json!([prefer("cpu-type", "arm64"), prefer("disk-type", "ssd")]),
            ],
            vec![100, 100, 100],
        ),
        (
            "the more intolerable taints a node has, the lower score it gets",
            json!([{"key": "foo", "operator": "Equal", "value": "bar", "effect": "PreferNoSchedule"}]),
            vec![
                json!([]),
                json!([prefer("cpu-type", "arm64")]),
                json!([prefer("cpu-type", "arm64"), prefer("disk-type", "ssd")]),
            ],
            vec![100, 50, 0],
        ),
    ];
    for (name, tolerations, taints, want) in cases {
        let nodes = taints
            .iter()
            .enumerate()
            .map(|(i, t)| node_with(&format!("n{i}"), "8", json!({}), t.clone()))
            .collect();
        let cache = cluster(nodes, vec![]);
        let p = pod("p", json!({}), json!({"tolerations": tolerations}));
        assert_eq!(
            &scores_of(&node_plugins::TaintToleration, &p, &cache.snapshot),
            want,
            "{name}"
        );
    }
}

/// nodeaffinity/node_affinity_test.go `TestNodeAffinity` (Filter).
#[test]
fn node_affinity_filter_as_upstream() {
    let required = |terms: Value| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": terms}}}})
    };
    let mut with_selector = required(json!([{"matchExpressions": [
        {"key": "foo", "operator": "In", "values": ["bar"]}]}]));
    with_selector["nodeSelector"] = json!({"foo": "bar"});
    let mut selector_unsatisfied = with_selector.clone();
    selector_unsatisfied["nodeSelector"] = json!({"foo": "other"});
    let cases: Vec<(&str, Value, Value, &str, bool)> = vec![
        (
            "missing labels",
            json!({"nodeSelector": {"foo": "bar"}}),
            json!({}),
            "node1",
            false,
        ),
        (
            "same labels",
            json!({"nodeSelector": {"foo": "bar"}}),
            json!({"foo": "bar"}),
            "node1",
            true,
        ),
        (
            "node labels are superset",
            json!({"nodeSelector": {"foo": "bar"}}),
            json!({"foo": "bar", "baz": "blah"}),
            "node1",
            true,
        ),
        (
            "node labels are subset",
            json!({"nodeSelector": {"foo": "bar", "baz": "blah"}}),
            json!({"foo": "bar"}),
            "node1",
            false,
        ),
        (
            "Pod with matchExpressions using In operator that matches the existing node",
            required(
                json!([{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar", "value2"]}]}]),
            ),
            json!({"foo": "bar"}),
            "node1",
            true,
        ),
        (
            "Pod with matchExpressions using Gt operator that matches the existing node",
            required(
                json!([{"matchExpressions": [{"key": "kernel-version", "operator": "Gt", "values": ["0204"]}]}]),
            ),
            json!({"kernel-version": "0206"}),
            "node1",
            true,
        ),
        (
            "Pod with matchExpressions using NotIn operator that matches the existing node",
            required(
                json!([{"matchExpressions": [{"key": "mem-type", "operator": "NotIn", "values": ["DDR", "DDR2"]}]}]),
            ),
            json!({"mem-type": "DDR3"}),
            "node1",
            true,
        ),
        (
            "Pod with matchExpressions using Exists operator that matches the existing node",
            required(json!([{"matchExpressions": [{"key": "GPU", "operator": "Exists"}]}])),
            json!({"GPU": "NVIDIA-GRID-K1"}),
            "node1",
            true,
        ),
        (
            "Pod with affinity that don't match node's labels won't schedule onto the node",
            required(
                json!([{"matchExpressions": [{"key": "foo", "operator": "In", "values": ["value1", "value2"]}]}]),
            ),
            json!({"foo": "bar"}),
            "node1",
            false,
        ),
        (
            "Pod with empty MatchExpressions is not a valid value will match no objects and won't schedule onto the node",
            required(json!([{"matchExpressions": []}])),
            json!({"foo": "bar"}),
            "node1",
            false,
        ),
        (
            "Pod with multiple matchExpressions ANDed that doesn't match the existing node",
            required(json!([{"matchExpressions": [
                {"key": "GPU", "operator": "Exists"},
                {"key": "GPU", "operator": "NotIn", "values": ["AMD", "INTER"]},
                {"key": "GPU", "operator": "NotIn", "values": ["NVIDIA-GRID-K1"]}]}])),
            json!({"GPU": "NVIDIA-GRID-K1"}),
            "node1",
            false,
        ),
        (
            "Pod with multiple NodeSelectorTerms ORed in affinity, matches the node's labels and will schedule onto the node",
            required(json!([
                {"matchExpressions": [{"key": "foo", "operator": "In", "values": ["bar", "value2"]}]},
                {"matchExpressions": [{"key": "diffkey", "operator": "In", "values": ["wrong", "value2"]}]}])),
            json!({"foo": "bar"}),
            "node1",
            true,
        ),
        (
            "Pod with an Affinity and a PodSpec.NodeSelector(the old thing that we are deprecating) both are satisfied, will schedule onto the node",
            with_selector,
            json!({"foo": "bar"}),
            "node1",
            true,
        ),
        (
            "Pod with an Affinity matches node's labels but the PodSpec.NodeSelector(the old thing that we are deprecating) is not satisfied, won't schedule onto the node",
            selector_unsatisfied,
            json!({"foo": "bar"}),
            "node1",
            false,
        ),
        (
            "Pod with matchFields using In operator that matches the existing node",
            required(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]),
            ),
            json!({}),
            "node1",
            true,
        ),
        (
            "Pod with matchFields using In operator that does not match the existing node",
            required(
                json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node1"]}]}]),
            ),
            json!({}),
            "node2",
            false,
        ),
    ];
    for (name, spec, labels, node_name, fits) in cases {
        let cache = cluster(vec![node(node_name, labels)], vec![]);
        let p = pod("p", json!({}), spec);
        let want = (!fits).then(|| "node(s) didn't match Pod's node affinity/selector".to_string());
        assert_eq!(filter_all(&p, &cache.snapshot), vec![want], "{name}");
    }
}

/// nodeaffinity/node_affinity_test.go `TestNodeAffinityPriority`.
#[test]
fn node_affinity_score_as_upstream() {
    let preferred = |terms: Value| json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": terms}}});
    let term = |weight: i32, expressions: Value| json!({"weight": weight, "preference": {"matchExpressions": expressions}});
    let in_ = |key: &str, value: &str| json!({"key": key, "operator": "In", "values": [value]});
    let affinity1 = preferred(json!([term(2, json!([in_("foo", "bar")]))]));
    let affinity2 = preferred(json!([
        term(2, json!([in_("foo", "bar")])),
        term(4, json!([in_("key", "value")])),
        term(
            5,
            json!([in_("foo", "bar"), in_("key", "value"), in_("az", "az1")])
        ),
    ]));
    let label1 = json!({"foo": "bar"});
    let label2 = json!({"key": "value"});
    let label3 = json!({"az": "az1"});
    let label5 = json!({"foo": "bar", "key": "value", "az": "az1"});
    let cases: Vec<(&str, Value, Vec<Value>, Vec<i64>)> = vec![
        (
            "all nodes are same priority as NodeAffinity is nil",
            json!({}),
            vec![label1.clone(), label2.clone(), label3.clone()],
            vec![0, 0, 0],
        ),
        (
            "only node1 matches the preferred scheduling requirements of pod",
            affinity1,
            vec![label1.clone(), label2.clone(), label3],
            vec![100, 0, 0],
        ),
        (
            "all nodes matches the preferred scheduling requirements of pod but with different priorities",
            affinity2,
            vec![label1, label5, label2],
            vec![18, 100, 36],
        ),
    ];
    for (name, spec, labels, want) in cases {
        let nodes = labels
            .into_iter()
            .enumerate()
            .map(|(i, l)| node(&format!("node{}", i + 1), l))
            .collect();
        let cache = cluster(nodes, vec![]);
        let p = pod("p", json!({}), spec);
        assert_eq!(
            scores_of(&node_plugins::NodeAffinity, &p, &cache.snapshot),
            want,
            "{name}"
        );
    }
}

fn pod_affinity(kind: &str, terms: Value) -> Value {
    json!({"affinity": {kind: {"requiredDuringSchedulingIgnoredDuringExecution": terms}}})
}

fn term(key: &str, op: &str, values: &[&str], topology: &str) -> Value {
    json!({"labelSelector": {"matchExpressions": [{"key": key, "operator": op, "values": values}]},
           "topologyKey": topology})
}

/// interpodaffinity/filtering_test.go `TestRequiredAffinitySingleNode`.
#[test]
fn inter_pod_affinity_single_node_as_upstream() {
    let node_labels = json!({"region": "r1", "zone": "z11"});
    let security_s1 = json!({"security": "S1"});
    let cases: Vec<(&str, Arc<PodInfo>, Vec<Arc<PodInfo>>, Option<&str>)> = vec![
        (
            "A pod that has no required pod affinity scheduling rules can schedule onto a node with no existing pods",
            pod("p", json!({}), json!({})),
            vec![],
            None,
        ),
        (
            "satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using In operator that matches the existing pod",
            pod(
                "p",
                security_s1.clone(),
                pod_affinity(
                    "podAffinity",
                    json!([term(
                        "security",
                        "In",
                        &["securityscan", "value2"],
                        "region"
                    )]),
                ),
            ),
            vec![pod("e", json!({"security": "securityscan"}), json!({}))],
            None,
        ),
        (
            "satisfies the pod with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using not in operator in labelSelector that matches the existing pod",
            pod(
                "p",
                security_s1.clone(),
                pod_affinity(
                    "podAffinity",
                    json!([term(
                        "security",
                        "NotIn",
                        &["securityscan3", "value3"],
                        "region"
                    )]),
                ),
            ),
            vec![pod("e", json!({"security": "securityscan"}), json!({}))],
            None,
        ),
        (
            "Does not satisfy the PodAffinity with labelSelector because of diff Namespace",
            pod(
                "p",
                security_s1.clone(),
                pod_affinity(
                    "podAffinity",
                    json!([{
                "labelSelector": {"matchExpressions": [{"key": "security", "operator": "In", "values": ["securityscan", "value2"]}]},
                "namespaces": ["DiffNameSpace"], "topologyKey": "region"}]),
                ),
            ),
            vec![pod_in(
                "ns",
                "e",
                json!({"security": "securityscan"}),
                json!({}),
            )],
            Some(AFFINITY_NOT_MATCH),
        ),
        (
            "Doesn't satisfy the PodAffinity because of unmatching labelSelector with the existing pod",
            pod(
                "p",
                security_s1.clone(),
                pod_affinity(
                    "podAffinity",
                    json!([term(
                        "security",
                        "In",
                        &["antivirusscan", "value2"],
                        "region"
                    )]),
                ),
            ),
            vec![pod("e", json!({"security": "securityscan"}), json!({}))],
            Some(AFFINITY_NOT_MATCH),
        ),
        (
            "satisfies the PodAffinity but doesn't satisfy the PodAntiAffinity with the existing pod",
            pod(
                "p",
                security_s1.clone(),
                json!({"affinity": {
                "podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("security", "In", &["securityscan", "value2"], "region")]},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("service", "In", &["securityscan", "value2"], "zone")]}}}),
            ),
            vec![pod(
                "e",
                json!({"security": "securityscan", "service": "securityscan"}),
                json!({}),
            )],
            Some(ANTI_AFFINITY_NOT_MATCH),
        ),
        (
            "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity constraints. doesn't satisfy PodAntiAffinity symmetry with the existing pod",
            pod("p", security_s1.clone(), json!({})),
            vec![pod(
                "e",
                json!({"foo": "bar"}),
                pod_affinity(
                    "podAntiAffinity",
                    json!([term("security", "In", &["S1"], "zone")]),
                ),
            )],
            Some(EXISTING_ANTI_AFFINITY_NOT_MATCH),
        ),
        (
            "pod matches its own Label in PodAffinity and that matches the existing pod Labels",
            pod(
                "p",
                json!({"foo": "bar"}),
                pod_affinity(
                    "podAffinity",
                    json!([term("foo", "In", &["bar"], "region")]),
                ),
            ),
            vec![pod("e", json!({"foo": "bar"}), json!({}))],
            None,
        ),
        (
            "The first pod of the collection that should be scheduled: pod matches its own Label in PodAffinity and there are no other pods with those Labels",
            pod(
                "p",
                json!({"foo": "bar"}),
                pod_affinity(
                    "podAffinity",
                    json!([term("foo", "In", &["bar"], "region")]),
                ),
            ),
            vec![],
            None,
        ),
        (
            "A pod with an affinity term that does not match itself is not scheduled when no pod matches",
            pod(
                "p",
                json!({"foo": "bar"}),
                pod_affinity(
                    "podAffinity",
                    json!([term("foo", "In", &["other"], "region")]),
                ),
            ),
            vec![],
            Some(AFFINITY_NOT_MATCH),
        ),
    ];
    for (name, incoming, existing, want) in cases {
        let pods = existing.into_iter().map(|p| (p, "machine1")).collect();
        let cache = cluster(vec![node("machine1", node_labels.clone())], pods);
        assert_eq!(
            filter_all(&incoming, &cache.snapshot),
            vec![want.map(str::to_string)],
            "{name}"
        );
    }
}

/// interpodaffinity/filtering_test.go `TestRequiredAffinityMultipleNodes`.
#[test]
fn inter_pod_affinity_multiple_nodes_as_upstream() {
    let nodes = || {
        vec![
            node(
                "machine1",
                json!({"region": "r1", "zone": "z11", "hostname": "machine1"}),
            ),
            node(
                "machine2",
                json!({"region": "r1", "zone": "z12", "hostname": "machine2"}),
            ),
            node(
                "machine3",
                json!({"region": "r2", "zone": "z21", "hostname": "machine3"}),
            ),
        ]
    };
    // "A pod can be scheduled onto all the nodes that have the same topology key & label value
    // with one of them has an existing pod that matches the affinity rules"
    let cache = cluster(
        nodes(),
        vec![(pod("e", json!({"foo": "bar"}), json!({})), "machine1")],
    );
    let incoming = pod(
        "p",
        json!({}),
        pod_affinity(
            "podAffinity",
            json!([term("foo", "In", &["bar"], "region")]),
        ),
    );
    assert_eq!(
        filter_all(&incoming, &cache.snapshot),
        vec![None, None, Some(AFFINITY_NOT_MATCH.to_string())]
    );
    // "NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod that
    // matches the inter pod affinity rule. The pod can not be scheduled onto nodeA and nodeB."
    let cache = cluster(
        nodes(),
        vec![(pod("e", json!({"foo": "abc"}), json!({})), "machine1")],
    );
    let incoming = pod(
        "p",
        json!({"foo": "abc"}),
        pod_affinity(
            "podAntiAffinity",
            json!([term("foo", "In", &["abc"], "region")]),
        ),
    );
    assert_eq!(
        filter_all(&incoming, &cache.snapshot),
        vec![
            Some(ANTI_AFFINITY_NOT_MATCH.to_string()),
            Some(ANTI_AFFINITY_NOT_MATCH.to_string()),
            None
        ]
    );
    // Anti-affinity by hostname spreads replicas one per node, and the FitError counts them.
    let spec = pod_affinity(
        "podAntiAffinity",
        json!([term("app", "In", &["web"], "hostname")]),
    );
    let mut cache = cluster(nodes(), vec![]);
    let mut placed = Vec::new();
    for i in 0..3 {
        let replica = pod(&format!("web-{i}"), json!({"app": "web"}), spec.clone());
        let node = schedule(&replica, &cache.snapshot).expect("fits");
        cache.add_pod(replica, &node);
        placed.push(node);
    }
    placed.sort();
    assert_eq!(placed, ["machine1", "machine2", "machine3"]);
    let fourth = pod("web-3", json!({"app": "web"}), spec);
    assert_eq!(
        schedule(&fourth, &cache.snapshot),
        Err("0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules.".into())
    );
}

/// interpodaffinity/scoring_test.go `TestPreferredAffinity`.
#[test]
fn inter_pod_affinity_score_as_upstream() {
    let nodes = || {
        vec![
            node("node1", json!({"region": "China"})),
            node("node2", json!({"region": "India"})),
            node("node3", json!({"az": "az1"})),
        ]
    };
    let preferred = |kind: &str, key: &str, value: &str| {
        json!({"affinity": {kind: {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 5, "podAffinityTerm": term(key, "In", &[value], "region")}]}}})
    };
    let s1 = json!({"security": "S1"});
    let s2 = json!({"security": "S2"});
    let cases: Vec<(&str, Value, Vec<(Value, &str)>, Vec<i64>)> = vec![
        (
            "all machines are same priority as Affinity is nil",
            json!({}),
            vec![],
            vec![0, 0, 0],
        ),
        (
            "Affinity: pod that matches topology key & pods in nodes will get high score comparing to others which doesn't match either pods in nodes or in topology key",
            preferred("podAffinity", "security", "S1"),
            vec![
                (s1.clone(), "node1"),
                (s2.clone(), "node2"),
                (json!({}), "node3"),
            ],
            vec![100, 0, 0],
        ),
        (
            "Anti Affinity: pod that does not match existing pods in node will get high score",
            preferred("podAntiAffinity", "security", "S1"),
            vec![(s1, "node1"), (s2, "node2")],
            vec![0, 100, 100],
        ),
    ];
    for (name, spec, existing, want) in cases {
        let pods = existing
            .into_iter()
            .enumerate()
            .map(|(i, (labels, n))| (pod(&format!("e{i}"), labels, json!({})), n))
            .collect();
        let cache = cluster(nodes(), pods);
        let incoming = pod("p", json!({"security": "S1"}), spec);
        assert_eq!(
            scores_of(
                &inter_pod_affinity::InterPodAffinity,
                &incoming,
                &cache.snapshot
            ),
            want,
            "{name}"
        );
    }
}

fn spread(key: &str, max_skew: i32, action: &str, extra: Value) -> Value {
    let mut constraint = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": action,
        "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}});
    if let (Some(c), Value::Object(extra)) = (constraint.as_object_mut(), extra) {
        c.extend(extra);
    }
    constraint
}

/// The four nodes of upstream's podtopologyspread tests.
fn spread_nodes() -> Vec<Arc<Node>> {
    [
        ("node-a", "zone1"),
        ("node-b", "zone1"),
        ("node-x", "zone2"),
        ("node-y", "zone2"),
    ]
    .into_iter()
    .map(|(name, zone)| node(name, json!({"zone": zone, "node": name})))
    .collect()
}

fn foo_pods(counts: &[(&str, usize)]) -> Vec<(Arc<PodInfo>, &'static str)> {
    let mut pods = Vec::new();
    for (node_name, count) in counts {
        let node_name: &'static str = match *node_name {
            "node-a" => "node-a",
            "node-b" => "node-b",
            "node-x" => "node-x",
            _ => "node-y",
        };
        for i in 0..*count {
            pods.push((
                pod(&format!("p-{node_name}-{i}"), json!({"foo": ""}), json!({})),
                node_name,
            ));
        }
    }
    pods
}

/// podtopologyspread/filtering_test.go `TestSingleConstraint` and `TestMultipleConstraints`.
#[test]
fn topology_spread_filter_as_upstream() {
    let fits = |want: [bool; 4]| -> Vec<Option<String>> {
        want.iter()
            .map(|f| (!f).then(|| CONSTRAINTS_NOT_MATCH.to_string()))
            .collect()
    };
    let cases: Vec<(&str, Value, Value, &[(&str, usize)], Vec<Option<String>>)> = vec![
        (
            "no existing pods",
            json!({"foo": ""}),
            json!([spread("zone", 1, "DoNotSchedule", json!({}))]),
            &[],
            fits([true; 4]),
        ),
        (
            "no existing pods, incoming pod doesn't match itself",
            json!({"bar": ""}),
            json!([spread("zone", 1, "DoNotSchedule", json!({}))]),
            &[],
            fits([true; 4]),
        ),
        (
            "pods spread across zones as 3/3, all nodes fit",
            json!({"foo": ""}),
            json!([spread("zone", 1, "DoNotSchedule", json!({}))]),
            &[("node-a", 2), ("node-b", 1), ("node-x", 1), ("node-y", 2)],
            fits([true; 4]),
        ),
        (
            "pod cannot be scheduled as all nodes don't have label 'rack'",
            json!({"foo": ""}),
            json!([spread("rack", 1, "DoNotSchedule", json!({}))]),
            &[],
            vec![Some(NODE_LABEL_NOT_MATCH.to_string()); 4],
        ),
        (
            "pods spread across nodes as 2/1/0/3, only node-x fits",
            json!({"foo": ""}),
            json!([spread("node", 1, "DoNotSchedule", json!({}))]),
            &[("node-a", 2), ("node-b", 1), ("node-y", 3)],
            fits([false, false, true, false]),
        ),
        (
            "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit",
            json!({"foo": ""}),
            json!([spread("node", 2, "DoNotSchedule", json!({}))]),
            &[("node-a", 2), ("node-b", 1), ("node-y", 3)],
            fits([false, true, true, false]),
        ),
        (
            "pods spread across nodes as 2/1/0/3, but pod doesn't match itself",
            json!({"bar": ""}),
            json!([spread("node", 1, "DoNotSchedule", json!({}))]),
            &[("node-a", 2), ("node-b", 1), ("node-y", 3)],
            fits([false, true, true, false]),
        ),
        (
            // TestMultipleConstraints
            "two Constraints on zone and node, spreads = [3/3, 2/1/0/3]",
            json!({"foo": ""}),
            json!([
                spread("zone", 1, "DoNotSchedule", json!({})),
                spread("node", 1, "DoNotSchedule", json!({}))
            ]),
            &[("node-a", 2), ("node-b", 1), ("node-y", 3)],
            fits([false, false, true, false]),
        ),
        (
            "ScheduleAnyway constraints never filter",
            json!({"foo": ""}),
            json!([spread("node", 1, "ScheduleAnyway", json!({}))]),
            &[("node-a", 2), ("node-b", 1), ("node-y", 3)],
            fits([true; 4]),
        ),
        (
            // Adapted from "pods spread across nodes as 2/2/1, maxSkew is 2, and the number of
            // domains < minDomains, then the third node fits": fewer domains than minDomains
            // make the global minimum 0.
            "two zones with 1/1 pods and minDomains 3: the minimum counts as 0",
            json!({"foo": ""}),
            json!([spread("zone", 1, "DoNotSchedule", json!({"minDomains": 3}))]),
            &[("node-a", 1), ("node-x", 1)],
            fits([false; 4]),
        ),
        (
            "nodeAffinityPolicy Honor: nodes the pod cannot use are not domains",
            json!({"foo": ""}),
            json!([spread("node", 1, "DoNotSchedule", json!({}))]),
            &[("node-a", 1), ("node-b", 1)],
            // node-x/y are filtered by the nodeSelector below, so the minimum is 1.
            vec![
                None,
                None,
                Some("node(s) didn't match Pod's node affinity/selector".into()),
                Some("node(s) didn't match Pod's node affinity/selector".into()),
            ],
        ),
    ];
    for (name, labels, constraints, existing, want) in cases {
        let cache = cluster(spread_nodes(), foo_pods(existing));
        let mut spec = json!({"topologySpreadConstraints": constraints});
        if name.starts_with("nodeAffinityPolicy") {
            spec["nodeSelector"] = json!({"zone": "zone1"});
        }
        let incoming = pod("p", labels, spec);
        assert_eq!(filter_all(&incoming, &cache.snapshot), want, "{name}");
    }
}

/// podtopologyspread/scoring_test.go `TestPodTopologySpreadScore`.
#[test]
fn topology_spread_score_as_upstream() {
    let nodes = |names: &[&str]| -> Vec<Arc<Node>> {
        names
            .iter()
            .map(|n| node(n, json!({"kubernetes.io/hostname": n})))
            .collect()
    };
    let constraint = json!([{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}}]);
    let cases: Vec<(&str, Vec<&str>, Vec<(&str, usize)>, Vec<i64>)> = vec![
        (
            "one constraint on node, no existing pods",
            vec!["node-a", "node-b"],
            vec![],
            vec![100, 100],
        ),
        (
            "one constraint on node, all nodes have the same number of matching pods",
            vec!["node-a", "node-b"],
            vec![("node-a", 1), ("node-b", 1)],
            vec![100, 100],
        ),
        (
            "one constraint on node, all 4 nodes are candidates",
            vec!["node-a", "node-b", "node-c", "node-d"],
            vec![("node-a", 2), ("node-b", 1), ("node-d", 3)],
            vec![20, 60, 100, 0],
        ),
    ];
    for (name, names, existing, want) in cases {
        let mut pods = Vec::new();
        for (n, count) in &existing {
            for i in 0..*count {
                pods.push((
                    pod(&format!("p-{n}-{i}"), json!({"foo": ""}), json!({})),
                    *n,
                ));
            }
        }
        let cache = cluster(nodes(&names), pods);
        let incoming = pod(
            "p",
            json!({"foo": ""}),
            json!({"topologySpreadConstraints": constraint}),
        );
        assert_eq!(
            scores_of(
                &pod_topology_spread::PodTopologySpread,
                &incoming,
                &cache.snapshot
            ),
            want,
            "{name}"
        );
    }
}

/// podtopologyspread: upstream's system default constraints apply to a pod without its own,
/// through the selector of the Service selecting it.
#[test]
fn system_default_spreading_follows_services() {
    let mut cache = cluster(
        vec![
            node(
                "a",
                json!({"kubernetes.io/hostname": "a", "topology.kubernetes.io/zone": "z1"}),
            ),
            node(
                "b",
                json!({"kubernetes.io/hostname": "b", "topology.kubernetes.io/zone": "z1"}),
            ),
        ],
        vec![],
    );
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}},
    }))
    .expect("service");
    cache
        .snapshot
        .services
        .insert("default/web".into(), Arc::new(service));
    for i in 0..2 {
        cache.add_pod(
            pod(&format!("old-{i}"), json!({"app": "web"}), json!({})),
            "a",
        );
    }
    // Unrelated load on b makes least-allocated prefer a; spreading outweighs it.
    cache.add_pod(cpu_pod("load", "4", 0), "b");
    let incoming = pod("new", json!({"app": "web"}), json!({}));
    let scores = scores_of(
        &pod_topology_spread::PodTopologySpread,
        &incoming,
        &cache.snapshot,
    );
    // hostname: 2·ln 4 + 2 ≈ 4.8 vs 2; zone (both z1): 2·ln 3 + 4 ≈ 6.2 each → 11 vs 8.
    assert_eq!(scores, [72, 100]);
    assert_eq!(schedule(&incoming, &cache.snapshot), Ok("b".into()));
}

#[test]
fn fit_error_message_counts_first_failures_per_node() {
    let cache = cluster(
        vec![
            node_with("small", "1", json!({"zone": "a"}), json!([])),
            node_with(
                "tainted",
                "8",
                json!({"zone": "a"}),
                json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]),
            ),
            node_with("elsewhere", "8", json!({"zone": "b"}), json!([])),
        ],
        vec![],
    );
    let wants_two_cpus_in_a = pod(
        "p",
        json!({}),
        json!({
            "nodeSelector": {"zone": "a"},
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
        }),
    );
    assert_eq!(
        schedule(&wants_two_cpus_in_a, &cache.snapshot),
        Err("0/3 nodes are available: 1 Insufficient cpu, 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}.".into())
    );
    let tolerant = pod(
        "p",
        json!({}),
        json!({
            "nodeSelector": {"zone": "a"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "2"}}}],
        }),
    );
    assert_eq!(schedule(&tolerant, &cache.snapshot), Ok("tainted".into()));
    assert_eq!(
        schedule(&pod("p", json!({}), json!({})), &Snapshot::default()),
        Err("no nodes available to schedule pods".into())
    );
}

#[test]
fn least_allocated_spreads_and_ports_conflict() {
    let busy_pod = pod(
        "busy",
        json!({}),
        json!({"containers": [{"name": "c", "image": "x",
        "resources": {"requests": {"cpu": "3"}},
        "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
    );
    let cache = cluster(
        vec![
            node_with("busy", "4", json!({}), json!([])),
            node_with("idle", "4", json!({}), json!([])),
        ],
        vec![(busy_pod, "busy")],
    );
    assert_eq!(
        schedule(&cpu_pod("p", "500m", 0), &cache.snapshot),
        Ok("idle".into())
    );
    let with_port = pod(
        "p",
        json!({}),
        json!({"containers": [{"name": "c", "image": "x",
        "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
    );
    assert_eq!(
        filter_all(&with_port, &cache.snapshot),
        vec![
            Some("node(s) didn't have free ports for the requested pod ports".into()),
            None
        ]
    );
}

#[test]
fn sampling_follows_upstreams_percentage_of_nodes_to_score() {
    assert_eq!(num_feasible_nodes_to_find(50), 50);
    assert_eq!(num_feasible_nodes_to_find(100), 100);
    // 5000 nodes: 50 - 5000/125 = 10 % = 500.
    assert_eq!(num_feasible_nodes_to_find(5000), 500);
    // 6000 nodes: 50 - 48 = 2 %, raised to the 5 % floor.
    assert_eq!(num_feasible_nodes_to_find(6000), 300);
    assert_eq!(num_feasible_nodes_to_find(1000), 420);
}

fn preempt_on(cache: &Cache, incoming: &PodInfo) -> Result<(String, Vec<String>), String> {
    let framework = Framework::default();
    let Err(unschedulable) = framework.schedule_pod(incoming, &cache.snapshot, 0) else {
        return Err("fits without preemption".into());
    };
    let (fit_error, state) = *unschedulable;
    preemption::preempt(
        &framework,
        &state,
        incoming,
        &cache.snapshot,
        &fit_error.diagnosis,
        0,
    )
    .map(|c| {
        (
            cache.snapshot.nodes[c.node].name.clone(),
            c.victims.iter().map(|v| v.name.clone()).collect(),
        )
    })
}

/// defaultpreemption/default_preemption_test.go: `TestSelectBestCandidate` ("a pod that fits on
/// a machine with no preemption", "machine with min highest priority pod is picked", "when
/// highest priorities are the same, minimum sum of priorities is picked") and
/// `TestSelectNodesForPreemption` (fewest victims, PDB-violating pods reprieved first).
#[test]
fn preemption_picks_victims_as_upstream() {
    // The node whose most important victim has the lowest priority.
    let cache = cluster(
        vec![
            node_with("n1", "1", json!({}), json!([])),
            node_with("n2", "1", json!({}), json!([])),
        ],
        vec![
            (cpu_pod("mid", "800m", 50), "n1"),
            (cpu_pod("low", "800m", 10), "n2"),
        ],
    );
    assert_eq!(
        preempt_on(&cache, &cpu_pod("p", "500m", 100)),
        Ok(("n2".into(), vec!["low".into()]))
    );
    // Equal highest priority: the smaller sum of priorities.
    let cache = cluster(
        vec![
            node_with("n1", "1", json!({}), json!([])),
            node_with("n2", "1", json!({}), json!([])),
        ],
        vec![
            (cpu_pod("a1", "400m", 10), "n1"),
            (cpu_pod("a2", "400m", 10), "n1"),
            (cpu_pod("b1", "400m", 10), "n2"),
            (cpu_pod("b2", "400m", 5), "n2"),
        ],
    );
    assert_eq!(
        preempt_on(&cache, &cpu_pod("p", "900m", 100)),
        Ok(("n2".into(), vec!["b1".into(), "b2".into()]))
    );
    // As few victims as possible: one of three 300m pods frees enough for 400m.
    let cache = cluster(
        vec![node_with("n1", "1", json!({}), json!([]))],
        vec![
            (cpu_pod("v1", "300m", 1), "n1"),
            (cpu_pod("v2", "300m", 2), "n1"),
            (cpu_pod("v3", "300m", 3), "n1"),
        ],
    );
    assert_eq!(
        preempt_on(&cache, &cpu_pod("p", "400m", 100)),
        Ok(("n1".into(), vec!["v1".into()]))
    );
    // Higher-priority pods are never victims: nothing helps.
    let cache = cluster(
        vec![node_with("n1", "1", json!({}), json!([]))],
        vec![(cpu_pod("vip", "800m", 1000), "n1")],
    );
    assert_eq!(
        preempt_on(&cache, &cpu_pod("p", "500m", 100)),
        Err(
            "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
                .into()
        )
    );
}

#[test]
fn preemption_respects_pod_disruption_budgets() {
    let protected = pod(
        "protected",
        json!({"app": "db"}),
        json!({"priority": 1,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]}),
    );
    let mut cache = cluster(
        vec![node_with("n1", "1", json!({}), json!([]))],
        vec![(protected, "n1"), (cpu_pod("free", "500m", 1), "n1")],
    );
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}},
        "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1},
    }))
    .expect("pdb");
    cache
        .snapshot
        .pdbs
        .insert("default/db".into(), Arc::new(pdb));
    assert_eq!(
        preempt_on(&cache, &cpu_pod("p", "500m", 100)),
        Ok(("n1".into(), vec!["free".into()]))
    );
}

#[test]
fn preemption_messages_follow_upstream() {
    let cache = cluster(
        vec![
            node("n1", json!({"zone": "a"})),
            node("n2", json!({"zone": "a"})),
        ],
        vec![],
    );
    let framework = Framework::default();
    let nowhere = pod("p", json!({}), json!({"nodeSelector": {"zone": "mars"}}));
    let Err(unschedulable) = framework.schedule_pod(&nowhere, &cache.snapshot, 0) else {
        panic!("should not fit");
    };
    let (mut fit_error, state) = *unschedulable;
    fit_error.diagnosis.post_filter_msg = preemption::preempt(
        &framework,
        &state,
        &nowhere,
        &cache.snapshot,
        &fit_error.diagnosis,
        0,
    )
    .err();
    assert_eq!(
        fit_error.message(),
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.."
    );
    let never = pod(
        "p",
        json!({}),
        json!({"preemptionPolicy": "Never", "priority": 5,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100"}}}]}),
    );
    assert_eq!(
        preempt_on(&cache, &never),
        Err("preemption: not eligible due to preemptionPolicy=Never.".into())
    );
}

fn volume_cluster(class_mode: &str, provisioner: &str) -> Cache {
    let mut cache = cluster(
        vec![
            node("a", json!({"topology.kubernetes.io/zone": "z1"})),
            node("b", json!({"topology.kubernetes.io/zone": "z2"})),
        ],
        vec![],
    );
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "standard"}, "provisioner": provisioner,
        "volumeBindingMode": class_mode,
    }))
    .expect("class");
    cache
        .snapshot
        .storage_classes
        .insert("standard".into(), Arc::new(class));
    cache
}

fn claim(name: &str, volume: Option<&str>) -> Arc<PersistentVolumeClaim> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": "claim-uid"},
            "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                     "volumeName": volume,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .expect("claim"),
    )
}

fn with_claim(name: &str) -> Arc<PodInfo> {
    pod(
        "p",
        json!({}),
        json!({"volumes": [{"name": "data",
        "persistentVolumeClaim": {"claimName": name}}]}),
    )
}

/// volumebinding/volume_binding_test.go ("unbound claim with immediate binding mode",
/// "PVC does not exist", "bound and unbound unsatisfied") and volumezone's zone conflicts.
#[test]
fn volumes_as_upstream() {
    // Unbound claim of an Immediate class: PreFilter rejects the pod.
    let mut cache = volume_cluster("Immediate", "example.com/csi");
    cache
        .snapshot
        .pvcs
        .insert("default/data".into(), claim("data", None));
    assert_eq!(
        schedule(&with_claim("data"), &cache.snapshot),
        Err("0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims.".into())
    );
    assert_eq!(
        schedule(&with_claim("missing"), &cache.snapshot),
        Err("0/2 nodes are available: persistentvolumeclaim \"missing\" not found.".into())
    );

    // WaitForFirstConsumer with a provisioner: any node; Reserve asks for provisioning there.
    let mut cache = volume_cluster("WaitForFirstConsumer", "example.com/csi");
    cache
        .snapshot
        .pvcs
        .insert("default/data".into(), claim("data", None));
    let incoming = with_claim("data");
    let result = Framework::default()
        .schedule_pod(&incoming, &cache.snapshot, 0)
        .expect("fits");
    let node = cache.snapshot.nodes[result.node].clone();
    let plan = Framework::default()
        .reserve_and_permit(&result.state, &incoming, &node, &cache.snapshot)
        .expect("reserved");
    assert_eq!(
        plan.pre_bind,
        vec![ApiAction::Patch {
            path: "/api/v1/namespaces/default/persistentvolumeclaims/data".into(),
            patch: json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node.name}}}),
        }]
    );
    // Once assumed, the claim is pinned to that node.
    cache.assume_volumes(&plan.pre_bind);
    let other = if node.name == "a" { "b" } else { "a" };
    let index = cache.node_index(other).expect("other");
    let mut state = CycleState::default();
    let framework = Framework::default();
    framework.run_pre_filter(&mut state, &incoming, &cache.snapshot);
    assert_eq!(
        framework
            .run_filter(
                &state,
                &incoming,
                &cache.snapshot.nodes[index],
                &cache.snapshot
            )
            .message(),
        volumes::BIND_CONFLICT
    );

    // WaitForFirstConsumer without a provisioner: a static volume on node b only.
    let mut cache = volume_cluster("WaitForFirstConsumer", "kubernetes.io/no-provisioner");
    cache
        .snapshot
        .pvcs
        .insert("default/data".into(), claim("data", None));
    let local: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "local-b"},
        "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                 "capacity": {"storage": "5Gi"}, "local": {"path": "/mnt"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z2"]}]}]}}},
        "status": {"phase": "Available"},
    }))
    .expect("pv");
    cache.snapshot.pvs.insert("local-b".into(), Arc::new(local));
    assert_eq!(
        filter_all(&with_claim("data"), &cache.snapshot),
        vec![Some(volumes::BIND_CONFLICT.into()), None]
    );

    // A bound claim: the volume's node affinity and zone label decide.
    let mut cache = volume_cluster("Immediate", "example.com/csi");
    cache
        .snapshot
        .pvcs
        .insert("default/data".into(), claim("data", Some("pv-z2")));
    let zoned: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-z2", "labels": {"topology.kubernetes.io/zone": "z2"}},
        "spec": {"storageClassName": "standard", "capacity": {"storage": "1Gi"}},
    }))
    .expect("pv");
    cache.snapshot.pvs.insert("pv-z2".into(), Arc::new(zoned));
    assert_eq!(
        filter_all(&with_claim("data"), &cache.snapshot),
        vec![Some(volumes::ZONE_CONFLICT.into()), None]
    );
    assert_eq!(
        schedule(&with_claim("data"), &cache.snapshot),
        Ok("b".into())
    );
}

#[test]
fn nominated_pods_hold_their_room() {
    let mut cache = cluster(vec![node_with("n1", "1", json!({}), json!([]))], vec![]);
    let nominated = cpu_pod("first", "800m", 100);
    cache
        .snapshot
        .nominated
        .insert("n1".into(), vec![nominated]);
    // A lower-priority pod cannot take the room a more important nominated pod waits for.
    assert_eq!(
        schedule(&cpu_pod("later", "500m", 0), &cache.snapshot),
        Err("0/1 nodes are available: 1 Insufficient cpu.".into())
    );
    assert_eq!(
        schedule(&cpu_pod("vip", "100m", 200), &cache.snapshot),
        Ok("n1".into())
    );
}

#[test]
fn match_counts_are_remembered_until_the_node_pods_change() {
    let mut info = NodeInfo::new(node("a", json!({})));
    let selector = Selector::from_set(
        &[("app".to_string(), "web".to_string())]
            .into_iter()
            .collect(),
    );
    assert_eq!(
        info.match_counts.get_or_count("default", &selector, || 3),
        3
    );
    // Remembered: the count is not taken again.
    assert_eq!(
        info.match_counts
            .get_or_count("default", &selector, || panic!("counted twice")),
        3
    );
    // Another namespace is another count.
    assert_eq!(info.match_counts.get_or_count("other", &selector, || 1), 1);
    // A pod arriving (or leaving) makes every remembered count stale.
    info.add_pod(pod("p", json!({"app": "web"}), json!({})));
    assert_eq!(
        info.match_counts.get_or_count("default", &selector, || 4),
        4
    );
    info.remove_pod("default/p");
    assert_eq!(
        info.match_counts.get_or_count("default", &selector, || 3),
        3
    );
}

#[test]
fn pod_requests_count_sidecars_and_pending_resizes() {
    // Upstream's TestPodRequests cases: sidecars run beside the app containers and beside the
    // init containers after them; a resize counts the larger of spec and status unless the
    // kubelet found it infeasible.
    let resources = |cpu: &str| json!({"requests": {"cpu": cpu}});
    let sidecars: Pod = serde_json::from_value(json!({"spec": {
        "containers": [{"name": "app", "resources": resources("200m")}],
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": resources("100m")},
            {"name": "init", "resources": resources("250m")},
        ],
    }}))
    .expect("pod");
    assert_eq!(pod_requests(&sidecars).0.milli_cpu, 350);
    let resized = |reason: &str| -> Pod {
        serde_json::from_value(json!({
            "spec": {"containers": [{"name": "app", "resources": resources("2")}]},
            "status": {
                "conditions": [{"type": "PodResizePending", "status": "True", "reason": reason}],
                "containerStatuses": [{
                    "name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                    "resources": resources("500m"),
                    "allocatedResources": {"cpu": "1"},
                }],
            },
        }))
        .expect("pod")
    };
    assert_eq!(pod_requests(&resized("Deferred")).0.milli_cpu, 2000);
    assert_eq!(pod_requests(&resized("Infeasible")).0.milli_cpu, 1000);
}
