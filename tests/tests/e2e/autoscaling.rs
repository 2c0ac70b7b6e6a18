//! Metrics and autoscaling on a real node (`flotilla up --nodes 1`), with stock kubectl 1.32:
//! the kubelet's `/stats/summary` and `/metrics/resource` through the API server's node
//! proxy, `kubectl top nodes` and `kubectl top pods` printing figures from
//! `metrics.k8s.io`, and a CPU-burning Deployment under a HorizontalPodAutoscaler (target
//! 50 % of its CPU request) scaled up while it burns and back down when the burning stops.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::LocalCluster;
use flotilla_e2e::{Kubectl, jsonpath, until};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Pods that burn CPU (capped at 200m by their limit, twice their 100m request) for their
/// first `BURN` seconds, then idle.
const BURNER: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: burner}
spec:
  replicas: 1
  selector: {matchLabels: {app: burner}}
  template:
    metadata: {labels: {app: burner}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: flotilla.local/busybox:1
        imagePullPolicy: Never
        command: [sh, -c, "end=$(( $(date +%s) + BURN )); while [ $(date +%s) -lt $end ]; do i=0; while [ $i -lt 5000 ]; do i=$((i+1)); done; done; exec sleep 3600"]
        resources:
          requests: {cpu: 100m, memory: 16Mi}
          limits: {cpu: 200m, memory: 64Mi}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: burner}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burner}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 20
      policies: [{type: Percent, value: 100, periodSeconds: 15}]
"#;

/// How long each burner pod burns.
const BURN: u64 = 60;

#[test]
fn metrics_and_autoscaling_on_a_real_node() -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = LocalCluster::start(1)?;
    let outcome = scenario(&cluster);
    println!("autoscaling e2e: {:.1} s", started.elapsed().as_secs_f64());
    outcome.with_context(|| format!("node logs:\n{}", cluster.logs()))
}

fn scenario(cluster: &LocalCluster) -> anyhow::Result<()> {
    let kubectl = cluster.flotilla.kubectl();
    until("the node is Ready", Duration::from_secs(90), || {
        let ready = jsonpath(
            &kubectl,
            &["get", "node", "node-1"],
            r#"{.status.conditions[?(@.type=="Ready")].status}"#,
        )
        .unwrap_or_default();
        Ok(ready == "True")
    })?;
    let manifest = BURNER.replace("BURN", &BURN.to_string());
    cluster
        .flotilla
        .ok_stdin(&["apply", "-f", "-"], &manifest)?;
    let applied = Instant::now();
    until("the burner is Running", Duration::from_secs(60), || {
        Ok(jsonpath(
            &kubectl,
            &["get", "pods", "-l", "app=burner"],
            "{.items[0].status.phase}",
        )
        .unwrap_or_default()
            == "Running")
    })?;

    // The kubelet's own endpoints, through the node proxy.
    let summary = kubectl.ok(&["get", "--raw", "/api/v1/nodes/node-1/proxy/stats/summary"])?;
    let summary: serde_json::Value = serde_json::from_str(&summary).context("summary JSON")?;
    ensure!(
        summary["node"]["nodeName"] == "node-1"
            && summary["node"]["memory"]["workingSetBytes"].as_u64() > Some(0),
        "summary: {summary}"
    );
    // The kubelet samples every 10 s: the new container shows from its next sample on.
    let mut resource = String::new();
    until(
        "/metrics/resource shows the burner's container",
        Duration::from_secs(30),
        || {
            resource = kubectl.ok(&[
                "get",
                "--raw",
                "/api/v1/nodes/node-1/proxy/metrics/resource",
            ])?;
            Ok(resource.contains("container_cpu_usage_seconds_total{container=\"burn\""))
        },
    )?;
    ensure!(
        resource.contains("# TYPE node_cpu_usage_seconds_total counter")
            && resource
                .contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"burner-")
            && resource.contains("resource_scrape_error 0"),
        "/metrics/resource:\n{resource}"
    );

    // `kubectl top`: the API is discovered, and each row has figures (the first CPU rate
    // needs two of the kubelet's 10 s samples).
    let asked = Instant::now();
    let mut nodes = String::new();
    until(
        "kubectl top nodes prints node-1",
        Duration::from_secs(60),
        || {
            nodes = kubectl
                .run(&["top", "nodes", "--no-headers"], None, &[])
                .map(|out| String::from_utf8_lossy(&out.stdout).to_string())
                .unwrap_or_default();
            Ok(nodes.starts_with("node-1 "))
        },
    )?;
    let columns: Vec<&str> = nodes.split_whitespace().collect();
    ensure!(
        columns.len() >= 5 && columns[1].ends_with('m') && columns[3].ends_with("Mi"),
        "kubectl top nodes: {nodes}"
    );
    let mut pods = String::new();
    until(
        "kubectl top pods prints the burner",
        Duration::from_secs(60),
        || {
            pods = kubectl
                .run(
                    &["top", "pods", "-l", "app=burner", "--no-headers"],
                    None,
                    &[],
                )
                .map(|out| String::from_utf8_lossy(&out.stdout).to_string())
                .unwrap_or_default();
            Ok(pods.starts_with("burner-"))
        },
    )?;
    let cpu_millis: u64 = pods
        .split_whitespace()
        .nth(1)
        .and_then(|cpu| cpu.strip_suffix('m'))
        .and_then(|cpu| cpu.parse().ok())
        .with_context(|| format!("kubectl top pods: {pods}"))?;
    ensure!(
        cpu_millis >= 100,
        "the burner burns at its 200m limit, top says {pods}"
    );
    println!(
        "figure: pod Running → kubectl top pods shows it: {:.1} s; burner at {cpu_millis}m",
        asked.elapsed().as_secs_f64()
    );
    let containers = kubectl.ok(&["top", "pods", "--containers", "-l", "app=burner"])?;
    ensure!(containers.contains("burn"), "{containers}");
    autoscale(cluster, applied)?;
    no_scale_subresource(cluster)?;
    let missing = kubectl.run(&["top", "pod", "no-such-pod"], None, &[])?;
    ensure!(
        !missing.status.success() && String::from_utf8_lossy(&missing.stderr).contains("not found"),
        "top of a missing pod: {}",
        String::from_utf8_lossy(&missing.stderr)
    );
    Ok(())
}

/// Half of the burner's 100m request: the HPA's target.
const TARGET_MILLICORES: f64 = 50.0;

/// A CPU quantity (`123456n`, `150m`, `1`) in millicores.
fn millicores(quantity: &str) -> Option<f64> {
    if let Some(nanos) = quantity.strip_suffix('n') {
        return nanos.parse::<f64>().ok().map(|n| n / 1e6);
    }
    if let Some(millis) = quantity.strip_suffix('m') {
        return millis.parse().ok();
    }
    quantity.parse::<f64>().ok().map(|cores| cores * 1000.0)
}

/// The time of the earliest burner PodMetrics sample using more than `target` millicores.
fn first_sample_over(kubectl: &Kubectl, target: f64) -> anyhow::Result<Option<OffsetDateTime>> {
    let Ok(raw) = kubectl.ok(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?labelSelector=app%3Dburner",
    ]) else {
        return Ok(None);
    };
    let list: serde_json::Value = serde_json::from_str(&raw).context("PodMetrics list JSON")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| {
            pod["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["usage"]["cpu"].as_str().and_then(millicores))
                .sum::<f64>()
                > target
        })
        .filter_map(|pod| pod["timestamp"].as_str())
        .filter_map(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .min())
}

/// The HorizontalPodAutoscaler: the burner at twice its request is scaled to the maximum of
/// 3; when every pod has stopped burning it is scaled back to 1 after its 20 s window.
fn autoscale(cluster: &LocalCluster, applied: Instant) -> anyhow::Result<()> {
    let kubectl = cluster.flotilla.kubectl();
    let replicas =
        || jsonpath(&kubectl, &["get", "deploy", "burner"], "{.spec.replicas}").unwrap_or_default();
    // The first kubelet sample over the target (its time is the PodMetrics' `timestamp`),
    // to time the decision it leads to.
    let mut first_over: Option<OffsetDateTime> = None;
    until(
        "the HPA scales the burner up to 3",
        Duration::from_secs(90),
        || {
            if first_over.is_none() {
                first_over = first_sample_over(&kubectl, TARGET_MILLICORES)?;
            }
            Ok(replicas() == "3")
        },
    )?;
    let scaled_up = applied.elapsed();
    let rescales = kubectl.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].firstTimestamp}",
    ])?;
    let first_rescale = rescales
        .split_whitespace()
        .filter_map(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .min()
        .context("no SuccessfulRescale event time")?;
    let first_over = first_over.context("no PodMetrics sample over the target was seen")?;
    println!(
        "figure: first kubelet sample over the target → HPA scale decision: {:.0} s (whole seconds; the HPA syncs every 15 s and reads the kubelet's latest sample, so 0–15 s; upstream's metrics-server adds up to its 15 s resolution)",
        (first_rescale - first_over).as_seconds_f64()
    );
    let events = kubectl.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.kind=HorizontalPodAutoscaler,reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].message}",
    ])?;
    ensure!(
        events.contains("New size: ")
            && events.contains("cpu resource utilization (percentage of request) above target"),
        "rescale events: {events}"
    );
    let status = kubectl.ok(&["get", "hpa", "burner", "-o", "json"])?;
    let status: serde_json::Value = serde_json::from_str(&status)?;
    let condition = |kind: &str| {
        status["status"]["conditions"]
            .as_array()
            .and_then(|all| all.iter().find(|c| c["type"] == kind))
            .map(|c| {
                format!(
                    "{}/{}",
                    c["status"].as_str().unwrap_or(""),
                    c["reason"].as_str().unwrap_or("")
                )
            })
            .unwrap_or_default()
    };
    ensure!(
        condition("AbleToScale").starts_with("True/")
            && condition("ScalingActive") == "True/ValidMetricFound"
            && status["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
                .as_i64()
                > Some(50),
        "HPA status: {}",
        status["status"]
    );
    let top = kubectl.ok(&["get", "hpa", "burner"])?;
    ensure!(
        top.contains("cpu: ") && top.contains("/50%"),
        "kubectl get hpa: {top}"
    );
    until(
        "the HPA scales the burner back to 1 once it stops burning",
        Duration::from_secs(BURN + 120),
        || Ok(replicas() == "1"),
    )?;
    println!(
        "figure: HPA and Deployment created → scaled up to 3 (at most): {:.1} s; → back to 1: {:.1} s (each pod burns {BURN} s from its start; window 20 s)",
        scaled_up.as_secs_f64(),
        applied.elapsed().as_secs_f64()
    );
    Ok(())
}

/// An HPA whose target kind has no scale subresource: upstream's `FailedGetScale` Event and
/// `AbleToScale=False`, and nothing else breaks.
fn no_scale_subresource(cluster: &LocalCluster) -> anyhow::Result<()> {
    let kubectl = cluster.flotilla.kubectl();
    kubectl.ok(&["create", "configmap", "settings"])?;
    cluster.flotilla.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: noscale}
spec:
  scaleTargetRef: {apiVersion: v1, kind: ConfigMap, name: settings}
  maxReplicas: 2
"#,
    )?;
    until(
        "the HPA on a ConfigMap reports FailedGetScale",
        Duration::from_secs(30),
        || {
            let able = jsonpath(
                &kubectl,
                &["get", "hpa", "noscale"],
                r#"{.status.conditions[?(@.type=="AbleToScale")].status}/{.status.conditions[?(@.type=="AbleToScale")].reason}"#,
            )?;
            Ok(able == "False/FailedGetScale")
        },
    )?;
    let events = kubectl.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=noscale,reason=FailedGetScale",
        "-o",
        "jsonpath={.items[*].type}",
    ])?;
    ensure!(
        events.contains("Warning"),
        "FailedGetScale events: {events:?}"
    );

    // A custom resource with a scale subresource is a target like a Deployment: its scale is
    // read (AbleToScale), and with no pod of its selector reporting, no metric is valid yet.
    cluster.flotilla.ok_stdin(&["apply", "-f", "-"], WIDGETS)?;
    until(
        "the widgets definition is established",
        Duration::from_secs(30),
        || {
            Ok(kubectl
                .run(&["get", "widgets"], None, &[])
                .is_ok_and(|out| out.status.success()))
        },
    )?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\nspec: {replicas: 1}\n",
    )?;
    kubectl.ok(&[
        "patch",
        "widget",
        "w",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":1,"selector":"app=widget"}}"#,
    ])?;
    cluster.flotilla.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: widget}\nspec:\n  scaleTargetRef: {apiVersion: example.com/v1, kind: Widget, name: w}\n  maxReplicas: 2\n",
    )?;
    until(
        "the HPA on a Widget reads its scale",
        Duration::from_secs(30),
        || {
            let conditions = jsonpath(
                &kubectl,
                &["get", "hpa", "widget"],
                r#"{.status.conditions[?(@.type=="AbleToScale")].reason}/{.status.conditions[?(@.type=="ScalingActive")].reason}"#,
            )?;
            Ok(conditions == "SucceededGetScale/FailedGetResourceMetric")
        },
    )?;
    Ok(())
}

/// A namespaced kind with a scale subresource.
const WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
"#;
