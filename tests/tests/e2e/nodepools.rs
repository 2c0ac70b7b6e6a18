//! Node pools on LocalStack's EC2: `flotilla up` with a cluster whose cloud is LocalStack, the
//! local hypervisor booting a joining node for each running instance (a real node the node
//! image's way where containerd is available: `flotilla-bootstrap` from an IMDSv2 emulator,
//! the kubelet and proxy in a network namespace), driven by the
//! `flotilla` CLI, kubectl and AWS API calls. Creating, scaling up and down (drained first),
//! replacing an instance terminated behind the controller's back, a pool with an unknown
//! subnet, and deleting the cluster with its instances.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::hypervisor::Hypervisor;
use flotilla_e2e::nodes::Fabric;
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, Kubectl, LocalStack, jsonpath, until};

/// Instances of a pool that are `running`, by the tags the cloud controller gives them.
fn pool_instances(
    aws: &LocalStack,
    cluster_id: &str,
    pool: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let answer = aws.call(
        "ec2",
        "describe_instances",
        serde_json::json!({"Filters": [
            {"Name": format!("tag:kubernetes.io/cluster/{cluster_id}"), "Values": ["owned"]},
            {"Name": "tag:flotilla.dev/nodepool", "Values": [pool]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]}),
    )?;
    Ok(answer["Reservations"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["Instances"].as_array().cloned().unwrap_or_default())
        .collect())
}

/// Names of the pool's Nodes that are Ready and initialized by the cloud controller.
fn ready_initialized_nodes(kubectl: &Kubectl, pool: &str) -> anyhow::Result<Vec<String>> {
    let nodes: serde_json::Value = serde_json::from_str(&kubectl.ok(&[
        "get",
        "nodes",
        "-l",
        &format!("flotilla.dev/nodepool={pool}"),
        "-o",
        "json",
    ])?)?;
    Ok(nodes["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|node| {
            let ready = node["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let initialized = node["spec"]["providerID"]
                .as_str()
                .is_some_and(|id| id.starts_with("aws:///"))
                && !node["spec"]["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["key"] == "node.cloudprovider.kubernetes.io/uninitialized");
            ready && initialized && node["spec"]["unschedulable"] != true
        })
        .filter_map(|node| node["metadata"]["name"].as_str().map(String::from))
        .collect())
}

fn pool_field(cli: &FlotillaCli, pool: &str, field: &str) -> anyhow::Result<serde_json::Value> {
    let list: serde_json::Value =
        serde_json::from_str(&cli.ok(&["nodepool", "list", "prod", "-o", "json"])?)?;
    Ok(list["nodePools"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == pool)
        .map(|p| p[field].clone())
        .unwrap_or(serde_json::Value::Null))
}

/// Registers an AMI, tagged as a Flotilla node image for Kubernetes `version` when given; its
/// id.
pub(crate) fn register_node_image(
    aws: &LocalStack,
    name: &str,
    version: Option<&str>,
) -> anyhow::Result<String> {
    let registered = aws.call(
        "ec2",
        "register_image",
        serde_json::json!({
            "Name": name,
            "Architecture": "x86_64",
            "VirtualizationType": "hvm",
            "RootDeviceName": "/dev/xvda",
            "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 8}}],
        }),
    )?;
    let id = registered["ImageId"]
        .as_str()
        .context("RegisterImage gave no ImageId")?
        .to_string();
    if let Some(version) = version {
        aws.call(
            "ec2",
            "create_tags",
            serde_json::json!({"Resources": [id], "Tags": [
                {"Key": "flotilla.dev/node-image", "Value": "true"},
                {"Key": "flotilla.dev/kubernetes-version", "Value": version},
            ]}),
        )?;
    }
    Ok(id)
}

/// `flotilla cluster create prod` on LocalStack's EC2 (both subnets of its network), waited
/// for; its id and a kubectl for it.
pub(crate) fn create_cluster(
    cli: &FlotillaCli,
    aws: &LocalStack,
    data_dir: &std::path::Path,
) -> anyhow::Result<(String, Kubectl)> {
    let network = aws.network()?;
    let created: serde_json::Value = serde_json::from_str(&cli.ok_env(
        &[
            "cluster",
            "create",
            "prod",
            "--region",
            "us-east-1",
            "--cloud-endpoint",
            &aws.endpoint,
            "--vpc-id",
            &network.vpc_id,
            "--subnet",
            &network.subnet_ids[0],
            "--subnet",
            &network.subnet_ids[1],
            "--cloud-access-key-id",
            "test",
            "--wait",
            "-o",
            "json",
        ],
        &[("FLOTILLA_CLOUD_SECRET_ACCESS_KEY", "test")],
    )?)?;
    let cluster_id = created["id"]
        .as_str()
        .context("the cluster has no id")?
        .to_string();
    ensure!(
        created["cloud"]["credentials"]
            .get("secretAccessKey")
            .is_none(),
        "the secret access key must never be returned: {created}"
    );
    let kubeconfig = data_dir.join("prod.kubeconfig");
    cli.ok(&[
        "cluster",
        "kubeconfig",
        "prod",
        "--file",
        kubeconfig.to_str().context("path")?,
    ])?;
    let kubectl = Kubectl::new(&kubeconfig);
    Ok((cluster_id, kubectl))
}

#[test]
fn node_pools_on_localstack_ec2() -> anyhow::Result<()> {
    let aws = LocalStack::start()?;
    // Real nodes (the node image's first boot in a network namespace) where this machine can
    // run them; simulated ones elsewhere. The API listens on the fabric the nodes live on.
    let fabric_dir = tempfile::tempdir()?;
    let fabric = match flotilla_e2e::nodes::require_runtime() {
        Ok(()) => Some(Fabric::start(&fabric_dir.path().join("fabric"))?),
        Err(err) => {
            eprintln!("nodepools: simulated nodes ({err:#})");
            None
        }
    };
    let real_nodes = fabric.is_some();
    let flotilla = match &fabric {
        Some(fabric) => Flotilla::up_at(Backend::Embedded, &fabric.host_ip, &[])?,
        None => Flotilla::up(Backend::Embedded)?,
    };
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    // Node images registered in the account: a pool without an image boots the newest one
    // for the cluster's version (1.33), as EKS picks its AMI from an SSM parameter.
    let node_image = register_node_image(&aws, "flotilla-node-1.33-a", Some("1.33"))?;
    let newest_image = register_node_image(&aws, "flotilla-node-1.33-b", Some("1.33"))?;
    register_node_image(&aws, "flotilla-node-1.34-a", Some("1.34"))?;
    ensure!(node_image != newest_image, "two images");
    // With real nodes, the instances of one more AMI (a pool names it) boot the node image
    // itself in a VM.
    let vm_image = register_node_image(&aws, "flotilla-node-vm", None)?;
    let hypervisor = match fabric {
        Some(fabric) => Hypervisor::boot_image_as_vm(
            aws.port,
            fabric,
            &vm_image,
            &flotilla_e2e::vm::node_image()?,
        )?,
        None => Hypervisor::start(aws.port)?,
    };
    let (cluster_id, kubectl) = create_cluster(&cli, &aws, flotilla.data_dir())?;

    // Create: two instances with the pool's tags and a NodeConfig user data, two Nodes join.
    let scale_started = Instant::now();
    cli.ok(&[
        "nodepool",
        "create",
        "prod",
        "workers",
        "--instance-type",
        "t3.large",
        "--min",
        "1",
        "--max",
        "3",
        "--desired",
        "2",
        "--label",
        "team=infra",
    ])?;
    until(
        "2 instances run in LocalStack",
        Duration::from_secs(60),
        || Ok(pool_instances(&aws, &cluster_id, "workers")?.len() == 2),
    )?;
    let instances = pool_instances(&aws, &cluster_id, "workers")?;
    let zones: std::collections::BTreeSet<&str> = instances
        .iter()
        .filter_map(|i| i["Placement"]["AvailabilityZone"].as_str())
        .collect();
    ensure!(
        zones.len() == 2,
        "instances should spread over both zones: {zones:?}"
    );
    let first = instances[0]["InstanceId"].as_str().context("instance id")?;
    ensure!(
        instances
            .iter()
            .all(|i| i["ImageId"] == newest_image.as_str()),
        "the pool boots the newest node image of its version ({newest_image}): {instances:?}"
    );
    ensure!(
        instances[0]["InstanceType"] == "t3.large",
        "{}",
        instances[0]
    );
    let user_data = aws.call(
        "ec2",
        "describe_instance_attribute",
        serde_json::json!({"InstanceId": first, "Attribute": "userData"}),
    )?;
    let user_data = {
        use base64::Engine;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD.decode(
                user_data["UserData"]["Value"]
                    .as_str()
                    .context("no user data")?,
            )?,
        )?
    };
    ensure!(
        user_data.contains("kind: NodeConfig")
            && user_data.contains(&format!("/clusters/{cluster_id}"))
            && user_data.contains("bootstrapToken:"),
        "user data is not the node bootstrap document:\n{user_data}"
    );
    // The hypervisor's clock starts when it sees an instance running: at the poll that finds
    // a Node Ready, its age bounds instance running → Node Ready (within one poll, 0.2 s).
    let mut running_to_ready = Vec::new();
    until(
        "2 Nodes of the pool are Ready and initialized",
        Duration::from_secs(90),
        || {
            let ready = ready_initialized_nodes(&kubectl, "workers")?;
            for (instance, age) in hypervisor.nodes() {
                let node_ready = instances.iter().any(|i| {
                    i["InstanceId"] == instance.as_str()
                        && i["PrivateDnsName"]
                            .as_str()
                            .is_some_and(|name| ready.iter().any(|n| n == name))
                });
                if node_ready && !running_to_ready.iter().any(|(i, _)| i == &instance) {
                    running_to_ready.push((instance, age));
                }
            }
            Ok(ready.len() == 2)
        },
    )?;
    eprintln!(
        "figure: instance running → Node Ready and initialized (real namespace nodes: {real_nodes}): {}",
        running_to_ready
            .iter()
            .map(|(_, age)| format!("{:.1} s", age.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!(
        "figure: node pool create → 2 Nodes Ready and initialized: {:.1} s",
        scale_started.elapsed().as_secs_f64()
    );
    let node = &ready_initialized_nodes(&kubectl, "workers")?[0];
    if real_nodes {
        let runtime = jsonpath(
            &kubectl,
            &["get", "node", node],
            "{.status.nodeInfo.containerRuntimeVersion}",
        )?;
        ensure!(
            runtime.starts_with("containerd://"),
            "node {node} is a real kubelet on containerd: {runtime:?}"
        );
    }
    let labels = jsonpath(&kubectl, &["get", "node", node], "{.metadata.labels}")?;
    for expected in [
        "\"topology.kubernetes.io/zone\":\"us-east-1",
        "\"topology.kubernetes.io/region\":\"us-east-1\"",
        "\"node.kubernetes.io/instance-type\":\"t3.large\"",
        "\"team\":\"infra\"",
    ] {
        ensure!(
            labels.contains(expected),
            "node {node} lacks {expected}: {labels}"
        );
    }
    let csr = kubectl.ok(&["get", "csr"])?;
    ensure!(
        csr.contains("Approved,Issued"),
        "the nodes joined through CSRs: {csr}"
    );
    until(
        "the pool is ACTIVE with 2 Ready nodes",
        Duration::from_secs(30),
        || {
            Ok(pool_field(&cli, "workers", "status")? == "ACTIVE"
                && pool_field(&cli, "workers", "readyNodes")? == 2)
        },
    )?;

    // A `LoadBalancer` Service: its NLB targets both instances.
    kubectl.ok(&["create", "service", "loadbalancer", "edge", "--tcp=80:8080"])?;
    let pool_ids: std::collections::BTreeSet<String> =
        pool_instances(&aws, &cluster_id, "workers")?
            .iter()
            .filter_map(|i| i["InstanceId"].as_str().map(String::from))
            .collect();
    let edge = crate::loadbalancer::lb_name(&kubectl, "edge")?;
    let mut targets = std::collections::BTreeSet::new();
    until(
        "the Service's NLB targets both instances",
        Duration::from_secs(60),
        || {
            let Some(lb) = crate::loadbalancer::load_balancers_named(&aws, &edge)?.pop() else {
                return Ok(false);
            };
            targets = crate::loadbalancer::targets_of(
                &aws,
                lb["LoadBalancerArn"].as_str().unwrap_or_default(),
            )?;
            Ok(targets == pool_ids)
        },
    )
    .with_context(|| format!("targets {targets:?}, instances {pool_ids:?}"))?;
    kubectl.ok(&["delete", "service", "edge", "--wait"])?;

    // Scale up to 3 while EC2 has no capacity, then refuses access: the pool is DEGRADED
    // with each reason, nothing leaks, and it recovers once EC2 does.
    let no_capacity = |code: &str, status: u16| {
        serde_json::json!([{"service": "ec2", "operation": "RunInstances",
            "error": {"statusCode": status, "code": code, "message": format!("injected {code}")}}])
    };
    aws.set_faults(no_capacity("InsufficientInstanceCapacity", 400))?;
    cli.ok(&["nodepool", "scale", "prod", "workers", "--desired", "3"])?;
    for (code, status, issue) in [
        (
            "InsufficientInstanceCapacity",
            400,
            "InsufficientInstanceCapacity",
        ),
        ("UnauthorizedOperation", 403, "AccessDenied"),
    ] {
        aws.set_faults(no_capacity(code, status))?;
        until(
            &format!("the pool is DEGRADED by {code}"),
            Duration::from_secs(30),
            || {
                Ok(pool_field(&cli, "workers", "status")? == "DEGRADED"
                    && pool_field(&cli, "workers", "health")?
                        .to_string()
                        .contains(issue)
                    && pool_field(&cli, "workers", "statusReason")?
                        .to_string()
                        .contains(code))
            },
        )?;
        ensure!(
            pool_instances(&aws, &cluster_id, "workers")?.len() == 2,
            "no instance leaks from a failed launch"
        );
    }
    let scale_started = Instant::now();
    aws.set_faults(serde_json::json!([]))?;
    until("3 Nodes are Ready", Duration::from_secs(90), || {
        Ok(ready_initialized_nodes(&kubectl, "workers")?.len() == 3)
    })?;
    eprintln!(
        "figure: EC2 recovers → third Node Ready: {:.1} s",
        scale_started.elapsed().as_secs_f64()
    );
    until("the pool is ACTIVE again", Duration::from_secs(30), || {
        Ok(pool_field(&cli, "workers", "status")? == "ACTIVE")
    })?;

    // Pods on every node, then down to 1: the removed nodes are drained (their pods move).
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: web}}}
      terminationGracePeriodSeconds: 2
      # A local image: real nodes reach no registry.
      containers: [{name: web, image: "flotilla.local/busybox:1", imagePullPolicy: Never, command: [sleep, "3600"]}]
"#,
    )?;
    kubectl.ok(&["rollout", "status", "deployment/web", "--timeout=60s"])?;
    cli.ok(&[
        "nodepool",
        "scale",
        "prod",
        "workers",
        "--desired",
        "1",
        "--min",
        "1",
    ])?;
    until("one instance is left", Duration::from_secs(90), || {
        Ok(pool_instances(&aws, &cluster_id, "workers")?.len() == 1)
    })?;
    let survivor = pool_instances(&aws, &cluster_id, "workers")?[0]["PrivateDnsName"]
        .as_str()
        .context("private dns name")?
        .to_string();
    until(
        "every web pod runs on the remaining node",
        Duration::from_secs(60),
        || {
            let placed = jsonpath(
                &kubectl,
                &[
                    "get",
                    "pods",
                    "-l",
                    "app=web",
                    "--field-selector=status.phase=Running",
                ],
                "{.items[*].spec.nodeName}",
            )?;
            let nodes: Vec<&str> = placed.split_whitespace().collect();
            Ok(nodes.len() == 3 && nodes.iter().all(|n| *n == survivor))
        },
    )
    .with_context(|| {
        let pods = kubectl
            .ok(&["get", "pods", "-o", "wide"])
            .unwrap_or_default();
        let nodes = kubectl.ok(&["get", "nodes"]).unwrap_or_default();
        format!("survivor {survivor}\n{pods}\n{nodes}")
    })?;
    until(
        "the removed Nodes are deleted",
        Duration::from_secs(120),
        || {
            let names = jsonpath(
                &kubectl,
                &["get", "nodes", "-l", "flotilla.dev/nodepool=workers"],
                "{.items[*].metadata.name}",
            )?;
            Ok(names.split_whitespace().collect::<Vec<_>>() == [survivor.as_str()])
        },
    )?;

    // An instance terminated behind the controller's back is replaced; its Node goes.
    let victim = pool_instances(&aws, &cluster_id, "workers")?[0]["InstanceId"]
        .as_str()
        .context("instance id")?
        .to_string();
    aws.call(
        "ec2",
        "terminate_instances",
        serde_json::json!({"InstanceIds": [victim]}),
    )?;
    until(
        "a replacement instance runs",
        Duration::from_secs(60),
        || {
            let now = pool_instances(&aws, &cluster_id, "workers")?;
            Ok(now.len() == 1 && now[0]["InstanceId"] != victim.as_str())
        },
    )?;
    until(
        "the terminated instance's Node is deleted and the new one Ready",
        Duration::from_secs(120),
        || {
            let ready = ready_initialized_nodes(&kubectl, "workers")?;
            let all = jsonpath(&kubectl, &["get", "nodes"], "{.items[*].metadata.name}")?;
            Ok(ready.len() == 1 && ready[0] != survivor && !all.contains(&survivor))
        },
    )?;

    // Bad input: an unknown subnet is a DEGRADED pool with EKS's issue code, nothing launched.
    let refused = cli.fails(&[
        "nodepool",
        "create",
        "prod",
        "stray",
        "--subnet",
        "subnet-00000000",
        "--desired",
        "1",
        "--min",
        "1",
        "--wait",
    ])?;
    ensure!(
        refused.contains("DEGRADED") && refused.contains("Ec2SubnetNotFound"),
        "an unknown subnet should fail the wait with its reason: {refused}"
    );
    ensure!(
        pool_instances(&aws, &cluster_id, "stray")?.is_empty(),
        "nothing launched for a bad subnet"
    );
    let issues = pool_field(&cli, "stray", "health")?;
    ensure!(
        issues.to_string().contains("subnet-00000000"),
        "the issue names the subnet: {issues}"
    );

    // A pool of the node image's AMI: its instance boots the image in a VM (software
    // emulation), which joins as the namespace nodes do.
    if real_nodes {
        let launched = Instant::now();
        cli.ok(&[
            "nodepool",
            "create",
            "prod",
            "vms",
            "--image",
            &vm_image,
            "--desired",
            "1",
            "--min",
            "1",
            "--max",
            "1",
        ])?;
        until(
            "the VM instance's Node is Ready and initialized",
            Duration::from_secs(300),
            || Ok(ready_initialized_nodes(&kubectl, "vms")?.len() == 1),
        )?;
        eprintln!(
            "nodepools: VM instance launched → Node Ready in {:.1} s",
            launched.elapsed().as_secs_f64()
        );
        let vm_node = ready_initialized_nodes(&kubectl, "vms")?.remove(0);
        let runtime = jsonpath(
            &kubectl,
            &["get", "node", &vm_node],
            "{.status.nodeInfo.containerRuntimeVersion}",
        )?;
        ensure!(
            runtime.starts_with("containerd://"),
            "the VM runs containerd: {runtime:?}"
        );
    }

    // Deleting the cluster terminates every instance and removes it.
    cli.ok(&["cluster", "delete", "prod", "--wait"])?;
    ensure!(
        pool_instances(&aws, &cluster_id, "workers")?.is_empty(),
        "the cluster's instances are terminated with it"
    );
    Ok(())
}

/// A pool whose instances boot but cannot join — one's user data is not a NodeConfig, one's
/// bootstrap token is unknown, one's API server unreachable — is DEGRADED with EKS's
/// `NodeCreationFailure` naming all three once the join timeout passes, instead of waiting
/// forever; the first boot's reason is on the first instance's console, the kubelets'
/// refusal and connection failure in the others' journals.
#[test]
fn a_pool_whose_instances_cannot_join_is_degraded() -> anyhow::Result<()> {
    flotilla_e2e::nodes::require_runtime()?;
    let aws = LocalStack::start()?;
    let fabric_dir = tempfile::tempdir()?;
    let fabric = Fabric::start(&fabric_dir.path().join("fabric"))?;
    let flotilla = Flotilla::up_at(
        Backend::Embedded,
        &fabric.host_ip,
        &["--node-join-timeout-seconds", "20"],
    )?;
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    let hypervisor = Hypervisor::start_real_with(
        aws.port,
        fabric,
        Some(Box::new(|index, user_data| {
            // One field of the NodeConfig replaced by `value`.
            let replace = |field: &str, value: &str| {
                user_data
                    .lines()
                    .map(|line| match line.split_once(field) {
                        Some((indent, _)) => format!("{indent}{field} {value}"),
                        None => line.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            match index {
                0 => "#!/bin/bash\n/etc/eks/bootstrap.sh prod\n".to_string(),
                1 => replace("bootstrapToken:", "wrong0.0123456789abcdef"),
                // A server no route leads to (TEST-NET-1).
                _ => replace("apiServerEndpoint:", "https://192.0.2.1:6443/clusters/x"),
            }
        })),
    )?;
    let (cluster_id, kubectl) = create_cluster(&cli, &aws, flotilla.data_dir())?;
    cli.ok(&[
        "nodepool",
        "create",
        "prod",
        "broken",
        "--desired",
        "3",
        "--min",
        "1",
        "--max",
        "3",
    ])?;
    until(
        "the pool is DEGRADED by NodeCreationFailure naming its three instances",
        Duration::from_secs(180),
        || {
            let instances = pool_instances(&aws, &cluster_id, "broken")?;
            let health = pool_field(&cli, "broken", "health")?.to_string();
            Ok(pool_field(&cli, "broken", "status")? == "DEGRADED"
                && health.contains("NodeCreationFailure")
                && instances.len() == 3
                && instances.iter().all(|i| {
                    i["InstanceId"]
                        .as_str()
                        .is_some_and(|id| health.contains(id))
                }))
        },
    )
    .with_context(|| {
        format!(
            "pool: {:?}",
            cli.ok(&["nodepool", "list", "prod", "-o", "json"])
        )
    })?;
    let nodes = jsonpath(&kubectl, &["get", "nodes"], "{.items[*].metadata.name}")?;
    ensure!(nodes.is_empty(), "no Node joined: {nodes}");
    let ids: Vec<String> = pool_instances(&aws, &cluster_id, "broken")?
        .iter()
        .filter_map(|i| i["InstanceId"].as_str().map(String::from))
        .collect();
    let consoles = || -> Vec<(String, String)> {
        ids.iter()
            .map(|id| hypervisor.console_and_journal(id))
            .collect()
    };
    ensure!(
        consoles().iter().any(|(console, _)| console.contains(
            "flotilla-bootstrap: this node cannot join: the user data is not a node.flotilla.dev/v1alpha1 NodeConfig"
        )),
        "the first boot's reason is on the console: {:?}",
        consoles()
    );
    // The kubelet's request for its certificate: refused at once for the unknown token, failed
    // once the connection to the unreachable server times out.
    until(
        "the kubelets' refusal and connection failure are in their journals",
        Duration::from_secs(90),
        || {
            let all = consoles();
            Ok(all
                .iter()
                .any(|(_, journal)| journal.contains("401") || journal.contains("Unauthorized"))
                && all
                    .iter()
                    .filter(|(_, journal)| journal.contains("ERROR") || journal.contains("Error"))
                    .count()
                    >= 2)
        },
    )
    .with_context(|| format!("{:?}", consoles()))?;
    Ok(())
}
