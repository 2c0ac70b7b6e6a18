//! A real two-node cluster (`flotilla up --nodes 2`: each node a network namespace with its
//! own containerd, `flotilla-kubelet` joined by bootstrap token, and `flotilla-proxy`), driven
//! by stock kubectl 1.32: a Deployment of a locally built HTTP image Running and Ready on both
//! nodes, its Service answering from a pod on node 1 with replies from pods on both nodes, the
//! NodePort answering from the other node's namespace, and a pod whose readiness probe fails
//! leaving the Service's endpoints so traffic stops reaching it.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::LocalCluster;
use flotilla_e2e::{Kubectl, jsonpath, until};

/// Three busybox `httpd`s answering with their pod name, ready while `/www/ready` exists; a
/// NodePort Service over them; and a client pod pinned to node 1.
const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}}
      containers:
      - name: httpd
        image: flotilla.local/busybox:1
        imagePullPolicy: Never
        command: [sh, -c, "mkdir -p /www && hostname > /www/index.html && touch /www/ready && exec httpd -f -p 8080 -h /www"]
        ports: [{containerPort: 8080, name: http}]
        readinessProbe:
          exec: {command: [test, -f, /www/ready]}
          periodSeconds: 1
          failureThreshold: 1
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: node-1
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
"#;

/// The pod names that answer `rounds` requests to `url` made from inside the client pod.
fn answers(kubectl: &Kubectl, url: &str, rounds: usize) -> anyhow::Result<Vec<String>> {
    let script =
        format!("for i in $(seq 1 {rounds}); do wget -q -T 2 -O - {url} || echo FAILED; done");
    let out = kubectl.ok(&["exec", "client", "--", "sh", "-c", &script])?;
    Ok(out.lines().map(|l| l.trim().to_string()).collect())
}

#[test]
fn two_nodes_run_a_service() -> anyhow::Result<()> {
    let cluster = LocalCluster::start(2)?;
    let outcome = scenario(&cluster);
    outcome.with_context(|| format!("node logs:\n{}", cluster.logs()))
}

fn scenario(cluster: &LocalCluster) -> anyhow::Result<()> {
    let kubectl = cluster.flotilla.kubectl();
    let ready = r#"{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status} {end}"#;
    until("both nodes are Ready", Duration::from_secs(90), || {
        let nodes = jsonpath(&kubectl, &["get", "nodes"], ready).unwrap_or_default();
        Ok(nodes.contains("node-1=True") && nodes.contains("node-2=True"))
    })?;
    // Each node joined with the bootstrap token and acts as itself.
    let csrs = kubectl.ok(&["get", "csr"])?;
    ensure!(
        csrs.contains("Approved,Issued") && csrs.contains("system:bootstrap:"),
        "{csrs}"
    );

    cluster.flotilla.ok_stdin(&["apply", "-f", "-"], WEB)?;
    until(
        "the Deployment's 3 pods are Ready",
        Duration::from_secs(120),
        || {
            Ok(jsonpath(
                &kubectl,
                &["get", "deploy", "web"],
                "{.status.readyReplicas}",
            )? == "3")
        },
    )?;
    until("the client pod is Running", Duration::from_secs(60), || {
        Ok(jsonpath(&kubectl, &["get", "pod", "client"], "{.status.phase}")? == "Running")
    })?;
    let placement = jsonpath(
        &kubectl,
        &["get", "pods", "-l", "app=web"],
        "{range .items[*]}{.metadata.name}={.spec.nodeName}={.status.podIP} {end}",
    )?;
    let pods: Vec<(String, String, String)> = placement
        .split_whitespace()
        .filter_map(|entry| {
            let mut parts = entry.splitn(3, '=');
            Some((
                parts.next()?.to_string(),
                parts.next()?.to_string(),
                parts.next()?.to_string(),
            ))
        })
        .collect();
    let nodes: BTreeSet<&str> = pods.iter().map(|(_, node, _)| node.as_str()).collect();
    ensure!(
        nodes == BTreeSet::from(["node-1", "node-2"]),
        "pods on both nodes: {placement}"
    );
    for (name, node, ip) in &pods {
        let cidr = if node == "node-1" {
            "10.244.1."
        } else {
            "10.244.2."
        };
        ensure!(ip.starts_with(cidr), "{name} on {node} has IP {ip}");
    }

    // Pod to pod across nodes, by pod IP.
    let remote = pods
        .iter()
        .find(|(_, node, _)| node == "node-2")
        .context("a pod on node-2")?;
    let direct = answers(&kubectl, &format!("http://{}:8080/", remote.2), 1)?;
    ensure!(direct == [remote.0.clone()], "pod IP answer: {direct:?}");

    // The Service's ClusterIP from the client pod on node 1: answers from pods on both nodes.
    let cluster_ip = jsonpath(&kubectl, &["get", "svc", "web"], "{.spec.clusterIP}")?;
    let url = format!("http://{cluster_ip}/");
    let mut seen = BTreeSet::new();
    until(
        "the ClusterIP answers from pods on both nodes",
        Duration::from_secs(60),
        || {
            seen.extend(answers(&kubectl, &url, 12)?);
            let nodes: BTreeSet<&str> = pods
                .iter()
                .filter(|(name, _, _)| seen.contains(name))
                .map(|(_, node, _)| node.as_str())
                .collect();
            Ok(nodes.len() == 2)
        },
    )?;
    ensure!(!seen.contains("FAILED"), "some requests failed: {seen:?}");

    // The NodePort on node 1's address, from node 2's namespace.
    let node_port = jsonpath(
        &kubectl,
        &["get", "svc", "web"],
        "{.spec.ports[0].nodePort}",
    )?;
    let node_1 = cluster.node_ip(1)?;
    let out = cluster
        .node_command(2, "busybox")?
        .args(["wget", "-q", "-T", "3", "-O", "-"])
        .arg(format!("http://{node_1}:{node_port}/"))
        .output()?;
    let body = String::from_utf8_lossy(&out.stdout).trim().to_string();
    ensure!(
        out.status.success() && pods.iter().any(|(name, _, _)| *name == body),
        "NodePort {node_1}:{node_port} from node-2 answered {body:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A pod whose readiness probe starts failing leaves the endpoints; traffic stops reaching
    // it while the others keep answering.
    let (unready, _, unready_ip) = pods.first().context("a web pod")?.clone();
    kubectl.ok(&["exec", &unready, "--", "rm", "/www/ready"])?;
    until(
        "the unready pod leaves the EndpointSlice",
        Duration::from_secs(30),
        || {
            let endpoints = jsonpath(
                &kubectl,
                &[
                    "get",
                    "endpointslices",
                    "-l",
                    "kubernetes.io/service-name=web",
                ],
                r#"{range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]} {end}"#,
            )?;
            Ok(!endpoints.contains(&unready_ip) && endpoints.split_whitespace().count() == 2)
        },
    )?;
    let ready_status = jsonpath(
        &kubectl,
        &["get", "pod", &unready],
        r#"{.status.conditions[?(@.type=="Ready")].status}"#,
    )?;
    ensure!(ready_status == "False", "{unready} Ready={ready_status}");
    // The proxy follows the EndpointSlice: allow it a moment, then no answer may come from it.
    until(
        "traffic no longer reaches the unready pod",
        Duration::from_secs(20),
        || Ok(!answers(&kubectl, &url, 10)?.contains(&unready)),
    )?;
    let after = answers(&kubectl, &url, 20)?;
    ensure!(
        !after.contains(&unready) && !after.iter().any(|a| a == "FAILED"),
        "after {unready} went unready: {after:?}"
    );
    Ok(())
}
