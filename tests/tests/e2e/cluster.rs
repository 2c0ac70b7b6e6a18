//! A real two-node cluster (`flotilla up --nodes 2`: each node a network namespace with its
//! own containerd, `flotilla kubelet` joined by bootstrap token, and `flotilla proxy`), driven
//! by stock kubectl 1.32: a Deployment of a locally built HTTP image Running and Ready on both
//! nodes, its Service answering from a pod on node 1 with replies from pods on both nodes, the
//! NodePort answering from the other node's namespace, and a pod whose readiness probe fails
//! leaving the Service's endpoints so traffic stops reaching it; then static pods from node 1's
//! manifest directory and their mirror pods.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

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
kind: Service
metadata: {name: named}
spec:
  clusterIP: None
  selector: {dns: named}
  ports: [{port: 8080, name: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: named-0, labels: {dns: named}}
spec:
  hostname: named-0
  subdomain: named
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"]
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

/// One HTTP GET of `/` at `host` `port` with busybox `nc` (busybox-static's `wget` crashes
/// here), printing the body's last line or `FAILED`.
fn http_get_script(host: &str, port: &str) -> String {
    format!(
        r#"out=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 {host} {port} | tail -n 1); echo "${{out:-FAILED}}""#
    )
}

/// The pod names that answer `rounds` requests to `host` `port` made from inside the client
/// pod (`FAILED` for each request that got no answer).
fn answers(
    kubectl: &Kubectl,
    host: &str,
    port: &str,
    rounds: usize,
) -> anyhow::Result<Vec<String>> {
    let script = format!(
        "for i in $(seq 1 {rounds}); do {}; done",
        http_get_script(host, port)
    );
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
    let direct = answers(&kubectl, &remote.2, "8080", 1)?;
    ensure!(direct == [remote.0.clone()], "pod IP answer: {direct:?}");

    // The Service's ClusterIP from the client pod on node 1: answers from pods on both nodes.
    let cluster_ip = jsonpath(&kubectl, &["get", "svc", "web"], "{.spec.clusterIP}")?;
    let mut seen = BTreeSet::new();
    until(
        "the ClusterIP answers from pods on both nodes",
        Duration::from_secs(60),
        || {
            seen.extend(answers(&kubectl, &cluster_ip, "80", 12)?);
            let nodes: BTreeSet<&str> = pods
                .iter()
                .filter(|(name, _, _)| seen.contains(name))
                .map(|(_, node, _)| node.as_str())
                .collect();
            Ok(nodes.len() == 2)
        },
    )?;
    ensure!(!seen.contains("FAILED"), "some requests failed: {seen:?}");
    cluster_dns(&kubectl, &cluster_ip, &pods)?;

    // The NodePort on node 1's address, from node 2's namespace.
    let node_port = jsonpath(
        &kubectl,
        &["get", "svc", "web"],
        "{.spec.ports[0].nodePort}",
    )?;
    let node_1 = cluster.node_ip(1)?;
    let out = cluster
        .node_command(2, "busybox")?
        .args(["sh", "-c", &http_get_script(&node_1, &node_port)])
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
        || Ok(!answers(&kubectl, &cluster_ip, "80", 10)?.contains(&unready)),
    )?;
    let after = answers(&kubectl, &cluster_ip, "80", 20)?;
    ensure!(
        !after.contains(&unready) && !after.iter().any(|a| a == "FAILED"),
        "after {unready} went unready: {after:?}"
    );
    static_pods(cluster)
}

/// The cluster DNS on the nodes: the client pod's resolv.conf points at `kube-dns`, the
/// Service resolves by its full name and reaches its pods by its short one, a headless
/// Service's pod resolves by `hostname.subdomain`, and a missing name is NXDOMAIN.
fn cluster_dns(
    kubectl: &Kubectl,
    cluster_ip: &str,
    pods: &[(String, String, String)],
) -> anyhow::Result<()> {
    let dns_ip = jsonpath(
        kubectl,
        &["-n", "kube-system", "get", "svc", "kube-dns"],
        "{.spec.clusterIP}",
    )?;
    ensure!(dns_ip == "10.96.0.10", "kube-dns at {dns_ip:?}");
    let resolv = kubectl.ok(&["exec", "client", "--", "cat", "/etc/resolv.conf"])?;
    for line in [
        "nameserver 10.96.0.10",
        "search default.svc.cluster.local svc.cluster.local cluster.local",
        "options ndots:5",
    ] {
        ensure!(resolv.contains(line), "the client's resolv.conf:\n{resolv}");
    }
    let lookup = |name: &str| -> anyhow::Result<String> {
        let out = kubectl.run(&["exec", "client", "--", "nslookup", name], None, &[])?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    };
    let full = lookup("web.default.svc.cluster.local")?;
    ensure!(
        full.contains(cluster_ip),
        "nslookup of the Service:\n{full}"
    );
    // By its short name (the search path), over HTTP, answered by the Deployment's pods.
    let by_name = answers(kubectl, "web", "80", 6)?;
    ensure!(
        by_name
            .iter()
            .all(|a| pods.iter().any(|(name, _, _)| name == a)),
        "http://web answered {by_name:?}"
    );
    until("the named pod is Running", Duration::from_secs(60), || {
        Ok(jsonpath(kubectl, &["get", "pod", "named-0"], "{.status.phase}")? == "Running")
    })?;
    let named_ip = jsonpath(kubectl, &["get", "pod", "named-0"], "{.status.podIP}")?;
    let mut named = String::new();
    until(
        "the headless Service's pod resolves",
        Duration::from_secs(30),
        || {
            named = lookup("named-0.named.default.svc.cluster.local")?;
            Ok(named.contains(&named_ip))
        },
    )
    .with_context(|| format!("nslookup named-0.named:\n{named}"))?;
    let answered = answers(kubectl, "named-0.named", "8080", 1)?;
    ensure!(
        answered == ["named-0"],
        "http://named-0.named answered {answered:?}"
    );
    let missing = lookup("nope.default.svc.cluster.local")?;
    ensure!(
        missing.contains("NXDOMAIN") || missing.contains("can't find"),
        "nslookup of a missing name:\n{missing}"
    );
    // How soon a new Service resolves: the proxy's watch updates the records as the Service
    // arrives. The figure includes `kubectl exec`'s own round trips, timed beside it.
    let exec_started = Instant::now();
    lookup("web.default.svc.cluster.local")?;
    let one_exec = exec_started.elapsed();
    let created = Instant::now();
    kubectl.ok(&["create", "service", "clusterip", "late", "--tcp=80:8080"])?;
    let late_ip = jsonpath(kubectl, &["get", "svc", "late"], "{.spec.clusterIP}")?;
    until("a new Service resolves", Duration::from_secs(10), || {
        Ok(lookup("late.default.svc.cluster.local")?.contains(&late_ip))
    })?;
    println!(
        "figure: Service created → resolvable from a pod on node 1: {:.2} s (one kubectl exec of nslookup: {:.2} s)",
        created.elapsed().as_secs_f64(),
        one_exec.as_secs_f64()
    );
    // Node 2 answers too, from its own proxy: a lookup from a pod there.
    let (on_node_2, _, _) = pods
        .iter()
        .find(|(_, node, _)| node == "node-2")
        .context("a pod on node-2")?;
    let out = kubectl.run(
        &[
            "exec",
            on_node_2,
            "--",
            "nslookup",
            "web.default.svc.cluster.local",
        ],
        None,
        &[],
    )?;
    let there = String::from_utf8_lossy(&out.stdout);
    ensure!(there.contains(cluster_ip), "nslookup on node-2:\n{there}");
    Ok(())
}

/// A static pod on node 1: busybox httpd from a manifest in the node's manifest directory.
const STATIC_WEB: &str = r#"apiVersion: v1
kind: Pod
metadata: {name: static-web, labels: {tier: static}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "echo static-VERSION; mkdir -p /www && echo VERSION > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

/// Static pods on node 1 (its kubelet acts as `system:node:node-1`, so NodeRestriction
/// admits the mirror pod): the mirror appears Running and owned by the Node, `kubectl logs`
/// reaches the static pod, a deleted mirror comes back without the container restarting, an
/// edited manifest replaces the pod, a bad manifest is skipped, and removing the manifest
/// stops the pod and deletes its mirror.
fn static_pods(cluster: &LocalCluster) -> anyhow::Result<()> {
    let kubectl = cluster.flotilla.kubectl();
    let manifests = cluster.node_dir(1).join("manifests");
    let manifest = manifests.join("static-web.yaml");
    std::fs::write(
        manifests.join("broken.yaml"),
        "apiVersion: v1\nkind: Pod\nspec: {}\n",
    )?;
    std::fs::write(&manifest, STATIC_WEB.replace("VERSION", "1"))?;
    let mirror = "static-web-node-1";
    let state = |path: &str| jsonpath(&kubectl, &["get", "pod", mirror], path);
    until("the mirror pod is Running", Duration::from_secs(60), || {
        Ok(state("{.status.phase}").unwrap_or_default() == "Running")
    })?;
    let owner = state(
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}/{.metadata.ownerReferences[0].controller}",
    )?;
    ensure!(owner == "Node/node-1/true", "mirror owner {owner:?}");
    let hash = state(r#"{.metadata.annotations.kubernetes\.io/config\.mirror}"#)?;
    ensure!(hash.len() == 32, "config.mirror annotation {hash:?}");
    let source = state(r#"{.metadata.annotations.kubernetes\.io/config\.source}"#)?;
    ensure!(source == "file", "config.source {source:?}");
    let account = state("{.spec.serviceAccountName}")?;
    ensure!(
        account.is_empty(),
        "a mirror pod names no service account: {account:?}"
    );
    let logs = kubectl.ok(&["logs", mirror])?;
    ensure!(
        logs.contains("static-1"),
        "logs of the static pod: {logs:?}"
    );
    ensure!(
        cluster
            .log(1, "kubelet")
            .contains("skipping a static pod manifest"),
        "the broken manifest was not reported"
    );

    // Deleting the mirror brings a new one; the static pod's container keeps running.
    let container = state("{.status.containerStatuses[0].containerID}")?;
    let first_uid = state("{.metadata.uid}")?;
    kubectl.ok(&["delete", "pod", mirror, "--wait=false"])?;
    until(
        "a new mirror pod is Running",
        Duration::from_secs(60),
        || {
            let uid = state("{.metadata.uid}").unwrap_or_default();
            Ok(!uid.is_empty()
                && uid != first_uid
                && state("{.status.phase}").unwrap_or_default() == "Running")
        },
    )?;
    let same = state("{.status.containerStatuses[0].containerID}")?;
    ensure!(
        same == container,
        "container {container} became {same} after the mirror's deletion"
    );

    // An edited manifest is a new static pod: a new container and a matching new mirror.
    std::fs::write(&manifest, STATIC_WEB.replace("VERSION", "2"))?;
    until(
        "the edited static pod runs",
        Duration::from_secs(60),
        || {
            let id = state("{.status.containerStatuses[0].containerID}").unwrap_or_default();
            let annotation = state(r#"{.metadata.annotations.kubernetes\.io/config\.mirror}"#)
                .unwrap_or_default();
            Ok(!id.is_empty()
                && id != container
                && annotation != hash
                && kubectl
                    .ok(&["logs", mirror])
                    .unwrap_or_default()
                    .contains("static-2"))
        },
    )?;

    // Without its manifest the pod stops and its mirror goes.
    std::fs::remove_file(&manifest)?;
    std::fs::remove_file(manifests.join("broken.yaml"))?;
    until("the mirror pod is gone", Duration::from_secs(60), || {
        let out = kubectl.run(&["get", "pod", mirror], None, &[])?;
        Ok(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound"))
    })?;
    let pods = kubectl.ok(&["get", "pods", "-l", "tier=static", "-o", "name"])?;
    ensure!(pods.trim().is_empty(), "static pods left: {pods}");
    Ok(())
}
