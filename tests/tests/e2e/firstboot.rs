//! A node's first boot the node image's way, on a real node (a network namespace with its own
//! containerd on a fabric): `flotilla-bootstrap` reads the instance metadata from an IMDSv2
//! emulator — the NodeConfig user data, address, id, zone, host name — and writes the kubelet's
//! and proxy's configuration; the kubelet and proxy started from those files join by bootstrap
//! token → CSR, the Node registers under its metadata name and address and goes Ready, a
//! busybox pod runs on it, and the proxy syncs with the node's own credential. A second
//! instance with user data that is not a NodeConfig does not join: one line says why and
//! nothing is written.

use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::imds::{ImdsEmulator, InstanceMetadata};
use flotilla_e2e::nodes::{
    Containerd, Fabric, boot_from_metadata, node_config_user_data, require_runtime, run_bootstrap,
};
use flotilla_e2e::{Backend, Flotilla, jsonpath, until};

const TOKEN_ID: &str = "fboot1";
const TOKEN_SECRET: &str = "0123456789abcdef";

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
        user_data: Some(node_config_user_data(
            &kubectl,
            &format!("{TOKEN_ID}.{TOKEN_SECRET}"),
        )?),
    })?;

    let state = dir.path().join("state");
    let (kubelet, proxy) = boot_from_metadata(&containerd, &imds.endpoint, &state)?;

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
    let (ok, stderr) = run_bootstrap(&containerd, &imds.endpoint, &refused)?;
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
