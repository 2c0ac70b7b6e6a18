//! A node's first boot the node image's way, on a real node (a network namespace with its own
//! containerd on a fabric): `flotilla-bootstrap` reads the instance metadata from an IMDSv2
//! emulator — the NodeConfig user data, address, id, zone, host name — and writes the kubelet's
//! and proxy's configuration; the kubelet and proxy started from those files join by bootstrap
//! token → CSR, the Node registers under its metadata name and address and goes Ready, a
//! busybox pod runs on it, and the proxy syncs with the node's own credential. A second
//! instance with user data that is not a NodeConfig does not join: one line says why and
//! nothing is written.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::imds::{ImdsEmulator, InstanceMetadata};
use flotilla_e2e::nodes::{
    Containerd, Fabric, LOCAL_EVICTION_HARD, NodeDaemon, node_bin, require_runtime,
};
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath, until};

const TOKEN_ID: &str = "fboot1";
const TOKEN_SECRET: &str = "0123456789abcdef";

/// The NodeConfig the cloud controller would write for the cluster of `kubectl`.
fn user_data(kubectl: &Kubectl) -> anyhow::Result<String> {
    let config: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    let cluster = &config["clusters"][0]["cluster"];
    Ok(format!(
        "apiVersion: node.flotilla.dev/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: demo\n    apiServerEndpoint: {}\n    certificateAuthority: {}\n  kubelet:\n    bootstrapToken: {TOKEN_ID}.{TOKEN_SECRET}\n    nodeLabels: {{pool: workers}}\n",
        cluster["server"].as_str().context("server")?,
        cluster["certificate-authority-data"]
            .as_str()
            .context("CA")?,
    ))
}

/// Runs `flotilla-bootstrap` inside the node's namespace; its exit status and stderr.
fn bootstrap(
    containerd: &Containerd,
    imds: &ImdsEmulator,
    state: &Path,
) -> anyhow::Result<(bool, String)> {
    // The console is a device that exists; here a file stands for it.
    std::fs::write(state.with_extension("console"), "")?;
    let out = containerd
        .command(node_bin("flotilla-bootstrap")?)
        .arg("--imds-endpoint")
        .arg(&imds.endpoint)
        .arg("--state-dir")
        .arg(state)
        .arg("--container-runtime-endpoint")
        .arg(format!("unix://{}", containerd.socket().display()))
        .arg("--console")
        .arg(state.with_extension("console"))
        .env("RUST_LOG", "warn")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The flags a unit would expand from `VARIABLE=…` in `file`.
fn unit_args(file: &Path, variable: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)?;
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{variable}=")))
        .with_context(|| format!("{} sets no {variable}", file.display()))?;
    Ok(value.split_whitespace().map(str::to_string).collect())
}

#[test]
fn a_node_boots_from_its_instance_metadata() -> anyhow::Result<()> {
    require_runtime()?;
    let dir = tempfile::tempdir()?;
    let fabric = Fabric::start(&dir.path().join("fabric"))?;
    let containerd = Containerd::start(
        &dir.path().join("node"),
        &fabric,
        &fabric.node_ip(1),
        "10.244.1.0/24",
    )?;
    let flotilla = Flotilla::up_at(Backend::Embedded, &fabric.host_ip, &[])?;
    let kubectl = flotilla.kubectl();
    kubectl.create_bootstrap_token(TOKEN_ID, TOKEN_SECRET)?;
    let imds = ImdsEmulator::start(&fabric.host_ip)?;
    let node_ip = containerd.ip.clone();
    let node_name = format!("ip-{}.ec2.internal", node_ip.replace('.', "-"));
    imds.add(InstanceMetadata {
        instance_id: "i-0f1r57b007".into(),
        local_ipv4: node_ip.clone(),
        local_hostname: node_name.clone(),
        availability_zone: "us-east-1a".into(),
        user_data: Some(user_data(&kubectl)?),
    })?;

    let state = dir.path().join("state");
    let (ok, stderr) = bootstrap(&containerd, &imds, &state)?;
    ensure!(ok, "flotilla-bootstrap failed: {stderr}");
    let mut kubelet_args = unit_args(&state.join("kubelet.env"), "KUBELET_ARGS")?;
    // The nodes share this machine's disk: evict on memory only.
    kubelet_args.extend(["--eviction-hard".into(), LOCAL_EVICTION_HARD.into()]);
    let kubelet = NodeDaemon::start(
        "flotilla-kubelet",
        &containerd,
        &kubelet_args,
        &dir.path().join("kubelet.log"),
    )?;
    let mut proxy_args = unit_args(&state.join("proxy.env"), "PROXY_ARGS")?;
    proxy_args.extend(["--healthz-bind-address".into(), format!("{node_ip}:10256")]);
    // The proxy's credential is the kubelet's, there once the node has joined (the unit waits).
    until(
        "the node's client certificate",
        Duration::from_secs(60),
        || Ok(state.join("pki/kubelet-client-current.pem").exists()),
    )
    .with_context(|| kubelet.log())?;
    let proxy = NodeDaemon::start(
        "flotilla-proxy",
        &containerd,
        &proxy_args,
        &dir.path().join("proxy.log"),
    )?;

    let ready = r#"{.status.conditions[?(@.type=="Ready")].status}"#;
    until(
        "the Node is Ready under its metadata name",
        Duration::from_secs(60),
        || {
            Ok(
                jsonpath(&kubectl, &["get", "node", &node_name], ready).unwrap_or_default()
                    == "True",
            )
        },
    )
    .with_context(|| kubelet.log())?;
    let address = jsonpath(
        &kubectl,
        &["get", "node", &node_name],
        r#"{.status.addresses[?(@.type=="InternalIP")].address}"#,
    )?;
    ensure!(
        address == node_ip,
        "InternalIP {address}, metadata says {node_ip}"
    );
    let pool = jsonpath(
        &kubectl,
        &["get", "node", &node_name],
        "{.metadata.labels.pool}",
    )?;
    ensure!(pool == "workers", "the NodeConfig's label: {pool:?}");
    let requester = kubectl.ok(&["get", "csr", "-o", "jsonpath={.items[*].spec.username}"])?;
    ensure!(
        requester.contains(&format!("system:bootstrap:{TOKEN_ID}")),
        "joined through a CSR by the bootstrap token: {requester}"
    );

    kubectl.ok(&[
        "run",
        "firstboot",
        "--image=flotilla.local/busybox:1",
        "--image-pull-policy=Never",
        "--restart=Never",
        "--overrides",
        &format!(r#"{{"spec":{{"nodeName":"{node_name}"}}}}"#),
        "--",
        "sleep",
        "3600",
    ])?;
    until("the pod runs on the node", Duration::from_secs(90), || {
        Ok(kubectl
            .ok(&["get", "pod", "firstboot", "-o", "jsonpath={.status.phase}"])?
            .trim()
            == "Running")
    })
    .with_context(|| kubelet.log())?;
    // The proxy, as its node, lists Services and EndpointSlices and programs its first sync.
    until("the proxy is healthy", Duration::from_secs(60), || {
        let out = containerd.busybox(&[
            "wget",
            "-q",
            "-O",
            "-",
            &format!("http://{node_ip}:10256/healthz"),
        ])?;
        Ok(out.status.success())
    })
    .with_context(|| proxy.log())?;
    ensure!(
        !proxy.log().contains("Forbidden"),
        "the proxy was refused: {}",
        proxy.log()
    );

    // Another instance whose user data is a shell script: it does not join and writes nothing.
    imds.add(InstanceMetadata {
        user_data: Some("#!/bin/bash\n/etc/eks/bootstrap.sh prod\n".into()),
        ..InstanceMetadata {
            instance_id: "i-0bad".into(),
            local_ipv4: node_ip.clone(),
            local_hostname: node_name.clone(),
            availability_zone: "us-east-1a".into(),
            user_data: None,
        }
    })?;
    let refused = dir.path().join("refused");
    let (ok, stderr) = bootstrap(&containerd, &imds, &refused)?;
    ensure!(!ok, "bootstrap succeeded on a shell script");
    let lines: Vec<&str> = stderr.lines().collect();
    ensure!(
        lines.len() == 1 && lines[0].starts_with("flotilla-bootstrap: this node cannot join: the user data is not a node.flotilla.dev/v1alpha1 NodeConfig"),
        "one line saying why: {stderr}"
    );
    let console = std::fs::read_to_string(refused.with_extension("console")).unwrap_or_default();
    ensure!(
        console.trim() == lines[0],
        "the console has the same line: {console:?}"
    );
    ensure!(!refused.join("kubelet.env").exists(), "nothing is written");
    drop(proxy);
    drop(kubelet);
    Ok(())
}
