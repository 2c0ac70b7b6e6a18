//! JSON encoder benchmark: `cargo bench -p flotilla-api-machinery --bench gojson`.
//!
//! A PodList of 500 pods as the API server stores them, encoded the way responses are
//! (`gojson::to_vec`: Go's escaping and trailing newline) against plain `serde_json::to_vec`
//! (the encoder before it, the reference), interleaved run by run. Prints µs per list and the
//! ratio; never asserts.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const PODS: usize = 500;
const ROUNDS: usize = 200;

fn pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("web-7d9c5b6f4-{i:05}"), "namespace": "default",
            "uid": "4f9d1f0e-8a0b-4c4e-9d57-0c8f2b4a6e31", "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-12-06T07:00:00Z", "generateName": "web-7d9c5b6f4-",
            "labels": {"app": "web", "pod-template-hash": "7d9c5b6f4"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-06T06:59:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9c5b6f4",
                "uid": "0b8b6a2e-1c1e-4d3b-8a55-2f9e7c1d0a44", "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "containers": [{"name": "web", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "command": ["/bin/sh", "-c", "echo 'a && b' > /tmp/x && exec nginx -g 'daemon off;'"],
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "nodeName": format!("node-{}", i % 10), "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": true,
        },
        "status": {
            "phase": "Running", "podIP": format!("10.244.{}.{}", i / 250, i % 250), "hostIP": "10.0.0.5",
            "qosClass": "Burstable", "startTime": "2026-12-06T07:00:01Z",
            "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-12-06T07:00:03Z"}],
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "nginx:1.27",
                "imageID": "docker.io/library/nginx@sha256:0123456789abcdef", "started": true,
                "containerID": "containerd://abcdef0123456789",
                "state": {"running": {"startedAt": "2026-12-06T07:00:02Z"}}}],
        },
    })
}

fn main() -> serde_json::Result<()> {
    let list = json!({"kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": "2000"}, "items": (0..PODS).map(pod).collect::<Vec<_>>()});
    let mut plain = Duration::ZERO;
    let mut go = Duration::ZERO;
    let mut bytes = (0, 0);
    for _ in 0..ROUNDS {
        let began = Instant::now();
        bytes.0 = black_box(serde_json::to_vec(black_box(&list))?).len();
        plain += began.elapsed();
        let began = Instant::now();
        bytes.1 = black_box(flotilla_api_machinery::gojson::to_vec(black_box(&list))?).len();
        go += began.elapsed();
    }
    let per = |d: Duration| d.as_secs_f64() * 1e6 / ROUNDS as f64;
    println!("encoding a PodList of {PODS} pods, {ROUNDS} rounds interleaved");
    println!(
        "  serde_json::to_vec (reference)  {:>8.0} µs  {} bytes",
        per(plain),
        bytes.0
    );
    println!(
        "  gojson::to_vec (Go's escaping)  {:>8.0} µs  {} bytes   {:.3}× of the reference (target ≤ 1.10)",
        per(go),
        bytes.1,
        go.as_secs_f64() / plain.as_secs_f64()
    );
    Ok(())
}
