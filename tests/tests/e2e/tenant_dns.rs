//! Cluster DNS per tenant: two clusters of one `flotilla up`, each with a node of its own
//! (a namespace node booted from its NodeConfig as the node image boots, joined by its
//! cluster's bootstrap token), each with a Service `web` in `default` at its own address and a
//! Service only it has. A pod on each node resolves `web` to its own cluster's address, and the
//! other cluster's only name is NXDOMAIN: a node's proxy answers from its own cluster's
//! Services alone.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::imds::{ImdsEmulator, InstanceMetadata};
use flotilla_e2e::nodes::{Containerd, Fabric, boot_from_metadata, node_config_user_data};
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, Kubectl, jsonpath, until};

/// Each tenant's Services: `web` at an address of its own, and one name only it has.
fn services(web_ip: &str, only: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Service
metadata: {{name: web}}
spec: {{clusterIP: {web_ip}, ports: [{{port: 80}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: {only}}}
spec: {{ports: [{{port: 80}}]}}
"#
    )
}

/// A busybox pod on `node` that waits.
fn client(node: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata: {{name: client}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
"#
    )
}

/// `nslookup name` from the client pod: its output, whether or not it found the name.
fn lookup(kubectl: &Kubectl, name: &str) -> anyhow::Result<String> {
    let out = kubectl.run(&["exec", "client", "--", "nslookup", name], None, &[])?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[test]
fn each_tenants_nodes_answer_only_its_own_names() -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let fabric = Fabric::start(&dir.path().join("fabric"))?;
    let flotilla = Flotilla::up_at(Backend::Embedded, &fabric.host_ip, &[])?;
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    cli.ok(&["cluster", "create", "other", "--wait"])?;
    let other_kubeconfig = flotilla.data_dir().join("other.kubeconfig");
    cli.ok(&[
        "cluster",
        "kubeconfig",
        "other",
        "--file",
        other_kubeconfig.to_str().context("path")?,
    ])?;
    let tenants = [
        (
            "demo",
            flotilla.kubectl(),
            "10.96.200.1",
            "only-demo",
            "demo00",
        ),
        (
            "other",
            Kubectl::new(&other_kubeconfig),
            "10.96.200.2",
            "only-other",
            "other0",
        ),
    ];
    let imds = ImdsEmulator::start(&fabric.host_ip)?;
    let mut nodes = Vec::new();
    for (index, (tenant, kubectl, web_ip, only, token_id)) in tenants.iter().enumerate() {
        let index = u8::try_from(index + 1)?;
        let token = format!("{token_id}.0123456789abcdef");
        kubectl.create_bootstrap_token(token_id, "0123456789abcdef")?;
        let ip = fabric.node_ip(index);
        let node_name = format!("ip-{}.ec2.internal", ip.replace('.', "-"));
        imds.add(InstanceMetadata {
            instance_id: format!("i-0{tenant}"),
            local_ipv4: ip.clone(),
            local_hostname: node_name.clone(),
            availability_zone: "us-east-1a".into(),
            user_data: Some(node_config_user_data(kubectl, &token)?),
        })?;
        let pods = format!("10.244.{}.0/24", 100 + index);
        let containerd = Containerd::start(
            &dir.path().join(format!("node-{index}")),
            &fabric,
            &ip,
            &pods,
        )?;
        let daemons = boot_from_metadata(
            &containerd,
            &imds.endpoint,
            &dir.path().join(format!("state-{index}")),
        )
        .with_context(|| format!("the node of {tenant}"))?;
        nodes.push((containerd, daemons));
        kubectl.ok_stdin(&["apply", "-f", "-"], &services(web_ip, only))?;
        kubectl.ok_stdin(&["apply", "-f", "-"], &client(&node_name))?;
    }
    for (tenant, kubectl, ..) in &tenants {
        until(
            &format!("the client pod of {tenant} is Running"),
            Duration::from_secs(120),
            || Ok(jsonpath(kubectl, &["get", "pod", "client"], "{.status.phase}")? == "Running"),
        )
        .with_context(|| {
            let logs: Vec<String> = nodes
                .iter()
                .map(|(_, (kubelet, _))| kubelet.log())
                .collect();
            format!("kubelets:\n{}", logs.join("\n---\n"))
        })?;
    }
    for (index, (tenant, kubectl, web_ip, only, _)) in tenants.iter().enumerate() {
        let (_, _, other_ip, other_only, _) = &tenants[1 - index];
        let mut web = String::new();
        until(
            &format!("web resolves on the node of {tenant}"),
            Duration::from_secs(30),
            || {
                web = lookup(kubectl, "web.default.svc.cluster.local")?;
                Ok(web.contains(web_ip))
            },
        )?;
        ensure!(
            !web.contains(other_ip),
            "{tenant}'s node answered the other tenant's address:\n{web}"
        );
        let own_ip = jsonpath(kubectl, &["get", "svc", only], "{.spec.clusterIP}")?;
        let own = lookup(kubectl, &format!("{only}.default.svc.cluster.local"))?;
        ensure!(
            !own_ip.is_empty() && own.contains(&own_ip),
            "{tenant}'s own name {only} at {own_ip}:\n{own}"
        );
        let foreign = lookup(kubectl, &format!("{other_only}.default.svc.cluster.local"))?;
        ensure!(
            foreign.contains("NXDOMAIN") || foreign.contains("can't find"),
            "{tenant}'s node resolved the other tenant's {other_only}:\n{foreign}"
        );
    }
    println!("tenant DNS e2e: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
