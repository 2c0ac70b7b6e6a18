//! An APIService proxied to a test aggregated API server (a metrics-server imitation) over
//! TLS: the server authenticates the front proxy by the CA the cluster publishes in
//! `kube-system/extension-apiserver-authentication` and takes the caller's identity from its
//! headers; discovery lists the group; `kubectl explain` reads its server's OpenAPI;
//! `kubectl top` reads pod and node metrics through it;
//! RBAC decides before anything is proxied; an APIService whose Service is missing is not
//! `Available` and its group answers 503.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::aggregated_server::AggregatedServer;
use flotilla_e2e::nodes::Fabric;
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath};
use serde_json::Value;

fn endpoints(kubectl: &Kubectl, host_ip: &str, port: u16) -> anyhow::Result<()> {
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: metrics-server, namespace: kube-system}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: metrics-server-manual
  namespace: kube-system
  labels: {{kubernetes.io/service-name: metrics-server}}
addressType: IPv4
endpoints: [{{addresses: ["{host_ip}"], conditions: {{ready: true}}}}]
ports: [{{name: https, port: {port}, protocol: TCP}}]
"#
        ),
    )?;
    Ok(())
}

fn api_service(name_group: (&str, &str), service: &str, trust: &str) -> String {
    let (version, group) = name_group;
    format!(
        r#"
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {version}.{group}}}
spec:
  group: {group}
  version: {version}
  service: {{namespace: kube-system, name: {service}, port: 443}}
  groupPriorityMinimum: 100
  versionPriority: 100
  {trust}
"#
    )
}

/// Waits for `kubectl get apiservice name` to report `Available` as `wanted`.
fn wait_available(kubectl: &Kubectl, name: &str, wanted: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = jsonpath(
            kubectl,
            &["get", "apiservice", name],
            "{.status.conditions[0].status}/{.status.conditions[0].reason}/{.status.conditions[0].message}",
        )?;
        if status.starts_with(&format!("{wanted}/")) {
            return Ok(status);
        }
        ensure!(
            Instant::now() < deadline,
            "{name} is {status}, not {wanted}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn an_api_service_proxies_to_its_server_and_kubectl_top_reads_through_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The control plane dials only inside the node networks: serve on the host's fabric address.
    let fabric = Fabric::start(dir.path())?;
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let authentication: Value = serde_json::from_str(&kubectl.ok(&[
        "-n",
        "kube-system",
        "get",
        "configmap",
        "extension-apiserver-authentication",
        "-o",
        "json",
    ])?)?;
    for key in [
        "client-ca-file",
        "requestheader-client-ca-file",
        "requestheader-allowed-names",
        "requestheader-username-headers",
        "requestheader-group-headers",
        "requestheader-extra-headers-prefix",
    ] {
        ensure!(
            authentication["data"][key].is_string(),
            "{key} is not published: {authentication}"
        );
    }
    let server = AggregatedServer::start(
        &fabric.host_ip,
        &["metrics-server.kube-system.svc"],
        &authentication["data"],
    )?;
    server.set_pods(&[("default", "web-1")]);
    server.set_nodes(&["node-a"]);
    endpoints(&kubectl, &fabric.host_ip, server.port())?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &api_service(
            ("v1beta1", "metrics.k8s.io"),
            "metrics-server",
            &format!("caBundle: {}", server.ca_bundle()),
        ),
    )?;
    wait_available(&kubectl, "v1beta1.metrics.k8s.io", "True")?;
    let listed = kubectl.ok(&["get", "apiservices"])?;
    let line = listed
        .lines()
        .find(|l| l.starts_with("v1beta1.metrics.k8s.io"))
        .context("the APIService is not listed")?;
    ensure!(
        line.contains("kube-system/metrics-server") && line.contains("True"),
        "{line}"
    );
    ensure!(
        listed
            .lines()
            .any(|l| l.starts_with("v1.apps ") && l.contains("Local")),
        "local APIServices are listed beside it:\n{listed}"
    );

    // Discovery (aggregated, which kubectl uses) lists the group's resources.
    let resources = kubectl.ok(&["api-resources", "--api-group=metrics.k8s.io"])?;
    ensure!(
        resources.contains("PodMetrics") && resources.contains("NodeMetrics"),
        "{resources}"
    );

    // The group version's OpenAPI is its server's, listed in the cluster's index:
    // `kubectl explain` reads it.
    let explained = kubectl.ok(&["explain", "podmetrics.containers"])?;
    ensure!(
        explained.contains("Metrics for all containers are collected within the same time window."),
        "{explained}"
    );

    // kubectl top, through the proxy, as the caller.
    let pods = kubectl.ok(&["top", "pod", "-n", "default"])?;
    ensure!(
        pods.lines()
            .any(|l| l.starts_with("web-1") && l.contains("100m") && l.contains("64Mi")),
        "{pods}"
    );
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n",
    )?;
    kubectl.ok(&[
        "patch",
        "node",
        "node-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"capacity":{"cpu":"2","memory":"4Gi"},"allocatable":{"cpu":"2","memory":"4Gi"}}}"#,
    ])?;
    let nodes = kubectl.ok(&["top", "node"])?;
    ensure!(
        nodes
            .lines()
            .any(|l| l.starts_with("node-a") && l.contains("250m")),
        "{nodes}"
    );
    let seen = server.requests();
    let metrics_reads: Vec<_> = seen
        .iter()
        .filter(|r| {
            r.path_and_query
                .starts_with("/apis/metrics.k8s.io/v1beta1/")
        })
        .collect();
    ensure!(
        !metrics_reads.is_empty(),
        "nothing was proxied: {:?}",
        seen.len()
    );
    for read in &metrics_reads {
        ensure!(
            read.client_cn.as_deref() == Some("front-proxy-client"),
            "proxied without the front proxy's certificate: {:?}",
            read.client_cn
        );
        ensure!(
            read.user == "kubernetes-admin" && read.groups.iter().any(|g| g == "system:masters"),
            "proxied as {} {:?}",
            read.user,
            read.groups
        );
        ensure!(
            read.authorization_header.is_none(),
            "the caller's credentials were passed on"
        );
    }

    // RBAC decides here, before anything is proxied; a grant lets the user through as itself.
    let before = server.requests().len();
    let refused = kubectl.run(&["top", "pod", "-n", "default", "--as=bob"], None, &[])?;
    ensure!(!refused.status.success(), "bob read pod metrics");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    ensure!(
        stderr.contains(r#"pods.metrics.k8s.io is forbidden: User "bob" cannot list resource "pods" in API group "metrics.k8s.io" in the namespace "default""#),
        "{stderr}"
    );
    ensure!(
        server.requests()[before..].iter().all(|r| r.user != "bob"),
        "bob's refused request was proxied"
    );
    kubectl.ok(&[
        "create",
        "clusterrole",
        "metrics-reader",
        "--verb=get,list",
        "--resource=pods.metrics.k8s.io",
    ])?;
    kubectl.ok(&[
        "create",
        "clusterrolebinding",
        "bob-metrics",
        "--clusterrole=metrics-reader",
        "--user=bob",
    ])?;
    std::thread::sleep(Duration::from_millis(1100));
    kubectl.ok(&["top", "pod", "-n", "default", "--as=bob"])?;
    ensure!(
        server.requests().iter().any(|r| r.user == "bob"),
        "bob's request was not proxied as bob"
    );

    // A Service that does not exist: not Available, with upstream's reason, and 503.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &api_service(
            ("v1alpha1", "broken.example.com"),
            "nothing-here",
            "insecureSkipTLSVerify: true",
        ),
    )?;
    let status = wait_available(&kubectl, "v1alpha1.broken.example.com", "False")?;
    ensure!(status.contains("ServiceNotFound"), "{status}");
    let unreachable = kubectl.run(
        &["get", "--raw", "/apis/broken.example.com/v1alpha1/things"],
        None,
        &[],
    )?;
    ensure!(!unreachable.status.success(), "a missing service answered");
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    ensure!(
        stderr.contains("service unavailable")
            || stderr.contains("ServiceUnavailable")
            || stderr.contains("error trying to reach service"),
        "{stderr}"
    );

    // Bad input: a name that is not version.group.
    let bad = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {name: metrics}\nspec: {group: metrics.k8s.io, version: v1beta1, groupPriorityMinimum: 100, versionPriority: 100, service: {namespace: kube-system, name: metrics-server}}\n"),
        &[],
    )?;
    ensure!(!bad.status.success(), "a misnamed APIService was stored");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    ensure!(
        stderr.contains(
            "metadata.name: Invalid value: \"metrics\": must be `spec.version+\".\"+spec.group`"
        ),
        "{stderr}"
    );

    // metrics-server's APIService removed: the cluster's own metrics.k8s.io serves again
    // (no node here has a kubelet to read, so its lists are empty rather than proxied).
    kubectl.ok(&["delete", "apiservice", "v1beta1.metrics.k8s.io"])?;
    let served = kubectl.ok(&["get", "apiservice", "v1beta1.metrics.k8s.io"])?;
    ensure!(served.contains("Local"), "after the delete: {served}");
    let before = server.requests().len();
    let pods = kubectl.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/pods"])?;
    ensure!(
        pods.contains("\"kind\":\"PodMetricsList\"") && server.requests().len() == before,
        "served by the cluster itself: {pods}"
    );
    Ok(())
}
