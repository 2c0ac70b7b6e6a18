//! Response encoding benchmark: `cargo bench -p flotilla-apiserver --bench encoding`.
//!
//! A list of 500 pods (each as the API stores it: metadata with labels, owner reference and
//! managed fields, a spec with two containers, a status with conditions and container
//! statuses) written as the API answers it, measured side by side in one run, never
//! asserted:
//!
//! - the reference: the value serialized as it is (the key order it was built in) by
//!   `gojson`, Go's escaping and the trailing newline;
//! - upstream's wire order: the same value written in the Go types' field order with their
//!   value structs (`negotiate::to_json`, through `flotilla_protobuf::GoJson`), escaped the
//!   same way.

mod support;
use support::percentile;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Lists encoded per case (interleaved, one of each in turn).
const ROUNDS: usize = 60;

/// Pods in the list.
const PODS: usize = 500;

fn pod(index: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("web-7d4b9c8f6-{index:05}"), "namespace": "shop",
            "uid": format!("0d6f1c2e-5b7a-4c11-9a3e-{index:012}"),
            "resourceVersion": format!("{}", 1000 + index), "creationTimestamp": "2026-12-06T10:00:00Z",
            "generateName": "web-7d4b9c8f6-",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6", "tier": "frontend"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6",
                "uid": "5f0e4c3a-1b2d-4e6f-8a9b-0c1d2e3f4a5b", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                "apiVersion": "v1", "time": "2026-12-06T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}}}}],
        },
        "spec": {
            "containers": [
                {"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 80, "protocol": "TCP", "name": "http"}],
                 "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                 "env": [{"name": "MODE", "value": "production"}, {"name": "PORT", "value": "80"}],
                 "readinessProbe": {"httpGet": {"path": "/healthz", "port": 80, "scheme": "HTTP"},
                    "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                 "imagePullPolicy": "IfNotPresent"},
                {"name": "sidecar", "image": "busybox:1.36", "command": ["sh", "-c", "sleep infinity"],
                 "resources": {}, "terminationMessagePath": "/dev/termination-log",
                 "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"},
            ],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": format!("node-{}", index % 20),
            "securityContext": {}, "schedulerName": "default-scheduler", "enableServiceLinks": true,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running", "hostIP": "10.0.1.5", "podIP": format!("10.244.{}.{}", index / 250, index % 250),
            "startTime": "2026-12-06T10:00:01Z", "qosClass": "Burstable",
            "conditions": [
                {"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-12-06T10:00:05Z"},
                {"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-12-06T10:00:00Z"},
            ],
            "containerStatuses": [
                {"name": "web", "ready": true, "restartCount": 0, "image": "nginx:1.27", "imageID": "sha256:abc",
                 "containerID": "containerd://0123", "started": true,
                 "state": {"running": {"startedAt": "2026-12-06T10:00:02Z"}}, "lastState": {}},
                {"name": "sidecar", "ready": true, "restartCount": 0, "image": "busybox:1.36", "imageID": "sha256:def",
                 "containerID": "containerd://4567", "started": true,
                 "state": {"running": {"startedAt": "2026-12-06T10:00:02Z"}}, "lastState": {}},
            ],
        },
    })
}

/// `pod` as a read gives it back: stored in upstream's order (what `Store` writes), decoded,
/// its resourceVersion stamped from the key's revision.
fn as_read(mut pod: Value) -> Value {
    let revision = pod["metadata"]["resourceVersion"].take();
    if let Some(metadata) = pod["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    let stored = serde_json::to_vec(&flotilla_protobuf::GoJson::stored(&pod)).unwrap_or_default();
    let read: Value = serde_json::from_slice(&stored).unwrap_or_default();
    let mut stamped = read;
    // Where `store::decode` stamps it: after name, namespace and uid.
    if let Some(metadata) = stamped["metadata"].as_object_mut() {
        let before = metadata
            .keys()
            .take_while(|k| matches!(k.as_str(), "name" | "generateName" | "namespace" | "uid"))
            .count();
        metadata.shift_insert(before, "resourceVersion".into(), revision);
    }
    stamped
}

fn pod_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "5000"}, "items": items})
}

/// Encodes `list` both ways, interleaved: (reference, wire order) timings and their sizes.
fn measure(list: &Value) -> (Vec<Duration>, Vec<Duration>, usize, usize) {
    let mut reference = Vec::with_capacity(ROUNDS);
    let mut ordered = Vec::with_capacity(ROUNDS);
    let mut bytes = (0, 0);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let body = flotilla_api_machinery::gojson::to_vec(list).unwrap_or_default();
        reference.push(started.elapsed());
        bytes.0 = body.len();

        let started = Instant::now();
        let body = flotilla_apiserver::negotiate::to_json(list);
        ordered.push(started.elapsed());
        bytes.1 = body.len();
    }
    reference.sort();
    ordered.sort();
    (reference, ordered, bytes.0, bytes.1)
}

fn report(
    what: &str,
    (reference, ordered, reference_bytes, ordered_bytes): (
        Vec<Duration>,
        Vec<Duration>,
        usize,
        usize,
    ),
) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let ratio = percentile(&ordered, 0.5).as_secs_f64() / percentile(&reference, 0.5).as_secs_f64();
    println!("{what}");
    println!(
        "  as built (reference):  p50 {:>6.2} ms  p99 {:>6.2} ms  {reference_bytes} bytes",
        ms(percentile(&reference, 0.5)),
        ms(percentile(&reference, 0.99)),
    );
    println!(
        "  upstream's wire order: p50 {:>6.2} ms  p99 {:>6.2} ms  {ordered_bytes} bytes",
        ms(percentile(&ordered, 0.5)),
        ms(percentile(&ordered, 0.99)),
    );
    println!("  ratio (wire order / reference, p50): {ratio:.2}× (issue 30: ≤ 1.10×)");
}

fn main() {
    println!("encoding a list of {PODS} pods, {ROUNDS} rounds each, interleaved");
    let read: Vec<Value> = (0..PODS).map(|i| as_read(pod(i))).collect();
    report(
        "pods as a read returns them (stored in upstream's order)",
        measure(&pod_list(read)),
    );
    let built: Vec<Value> = (0..PODS).map(pod).collect();
    report(
        "pods in another order (stored before this order was kept)",
        measure(&pod_list(built)),
    );
}
