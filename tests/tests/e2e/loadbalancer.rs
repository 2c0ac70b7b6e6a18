//! `type: LoadBalancer` Services on AWS APIs: `flotilla cloud-controller` against LocalStack
//! (ELBv2 and EC2 from moto) makes one network load balancer per Service, with a listener and
//! target group per port and exactly the Ready nodes' instances registered, refuses invalid
//! annotations with an event, makes no duplicate across injected ELBv2 faults, and removes
//! everything when the Services are deleted (needs the `flotilla` binary, kubectl 1.32 and
//! LocalStack from `tests/localstack/install`, which needs PyPI).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, LocalStack, flotilla_process, jsonpath, until};
use serde_json::{Value, json};

const CLUSTER_ID: &str = "demo";

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, labels: {app: web}}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx:1.25, ports: [{containerPort: 8080}, {containerPort: 8443}]}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: https, port: 443, targetPort: 8443}
"#;

const BAD: &str = r#"
apiVersion: v1
kind: Service
metadata:
  name: bad
  annotations: {service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval: "abc"}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

const FAULTY: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: faulty}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 8000, targetPort: 8080}]
"#;

/// `flotilla cloud-controller` with the AWS environment it needs (flotilla_process passes no
/// environment); its log goes to a file printed when the test fails.
pub(crate) struct CloudController {
    child: Child,
    log: PathBuf,
}

impl CloudController {
    pub(crate) fn start(dir: &Path, args: &[&str]) -> anyhow::Result<Self> {
        let log = dir.join("cloud-controller.log");
        let child = flotilla_e2e::cloud_controller_command(args)?
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting flotilla cloud-controller")?;
        Ok(CloudController { child, log })
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for CloudController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

/// Every load balancer in LocalStack.
pub(crate) fn load_balancers(aws: &LocalStack) -> anyhow::Result<Vec<Value>> {
    let answer = aws.call("elbv2", "describe_load_balancers", json!({}))?;
    Ok(answer["LoadBalancers"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

pub(crate) fn load_balancers_named(aws: &LocalStack, name: &str) -> anyhow::Result<Vec<Value>> {
    Ok(load_balancers(aws)?
        .into_iter()
        .filter(|lb| lb["LoadBalancerName"] == name)
        .collect())
}

/// The registered (not draining) instances of a target group.
fn registered(aws: &LocalStack, group_arn: &str) -> anyhow::Result<BTreeSet<String>> {
    let answer = aws.call(
        "elbv2",
        "describe_target_health",
        json!({"TargetGroupArn": group_arn}),
    )?;
    Ok(answer["TargetHealthDescriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|d| d["TargetHealth"]["State"] != "draining")
        .map(|d| text(&d["Target"]["Id"]))
        .collect())
}

/// `(port, target group port, group ARN)` of each listener of a load balancer.
fn listeners(aws: &LocalStack, lb_arn: &str) -> anyhow::Result<Vec<(i64, String)>> {
    let answer = aws.call(
        "elbv2",
        "describe_listeners",
        json!({"LoadBalancerArn": lb_arn}),
    )?;
    Ok(answer["Listeners"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|l| {
            (
                l["Port"].as_i64().unwrap_or_default(),
                text(&l["DefaultActions"][0]["TargetGroupArn"]),
            )
        })
        .collect())
}

fn target_groups(aws: &LocalStack, arguments: Value) -> anyhow::Result<Vec<Value>> {
    let answer = aws.call("elbv2", "describe_target_groups", arguments)?;
    Ok(answer["TargetGroups"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Upstream's load balancer name for a Service: `a` + UID without dashes, 32 characters.
pub(crate) fn lb_name(kubectl: &Kubectl, service: &str) -> anyhow::Result<String> {
    let uid = jsonpath(kubectl, &["get", "svc", service], "{.metadata.uid}")?;
    let mut name = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    Ok(name)
}

/// The instances registered in every target group of the Service's load balancer, which
/// must all agree.
pub(crate) fn targets_of(aws: &LocalStack, lb_arn: &str) -> anyhow::Result<BTreeSet<String>> {
    let groups = target_groups(aws, json!({"LoadBalancerArn": lb_arn}))?;
    let mut all: Option<BTreeSet<String>> = None;
    for group in &groups {
        let set = registered(aws, &text(&group["TargetGroupArn"]))?;
        match &all {
            Some(previous) if *previous != set => return Ok(BTreeSet::new()),
            _ => all = Some(set),
        }
    }
    Ok(all.unwrap_or_default())
}

fn faults(aws: &LocalStack, method: &str, rules: Value) -> anyhow::Result<()> {
    let out = Command::new("curl")
        .args(["-sf", "-X", method, "-H", "Content-Type: application/json"])
        .arg(format!("{}/_localstack/chaos/faults", aws.endpoint))
        .args(["-d", &rules.to_string()])
        .output()
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "{method} faults failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// One EC2 instance in `subnet`: its ID and zone.
pub(crate) fn run_instance(aws: &LocalStack, subnet: &str) -> anyhow::Result<(String, String)> {
    let answer = aws.call(
        "ec2",
        "run_instances",
        json!({"ImageId": "ami-12c6146b", "InstanceType": "t3.micro", "MinCount": 1,
               "MaxCount": 1, "SubnetId": subnet}),
    )?;
    let instance = &answer["Instances"][0];
    Ok((
        text(&instance["InstanceId"]),
        text(&instance["Placement"]["AvailabilityZone"]),
    ))
}

/// The `default` namespace's Events (events.k8s.io/v1), as the cloud controller writes them.
pub(crate) fn default_events(f: &Flotilla) -> anyhow::Result<Vec<Value>> {
    let events: Value = serde_json::from_str(&f.ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        "default",
        "-o",
        "json",
    ])?)?;
    Ok(events["items"].as_array().cloned().unwrap_or_default())
}

/// Gives `node` the provider ID of instance `id` in `zone`, as the cloud's node controller would.
pub(crate) fn set_provider_id(
    kubectl: &Kubectl,
    node: &str,
    zone: &str,
    id: &str,
) -> anyhow::Result<()> {
    let patch = json!({"spec": {"providerID": format!("aws:///{zone}/{id}")}}).to_string();
    kubectl.ok(&["patch", "node", node, "--type", "merge", "-p", &patch])?;
    Ok(())
}

pub(crate) fn wait_ready(kubectl: &Kubectl, node: &str) -> anyhow::Result<()> {
    until(
        &format!("node {node} is Ready"),
        Duration::from_secs(60),
        || {
            Ok(kubectl
                .run(
                    &[
                        "get",
                        "node",
                        node,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ],
                    None,
                    &[],
                )?
                .stdout
                .starts_with(b"True"))
        },
    )
}

#[test]
fn load_balancer_services_on_localstack() -> anyhow::Result<()> {
    let aws = LocalStack::start()?;
    let network = aws.network()?;
    // Three machines: two nodes at first, one joining later.
    let mut instances = Vec::new();
    for index in 0..3 {
        instances.push(run_instance(&aws, &network.subnet_ids[index % 2])?);
    }

    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let kubeconfig = f
        .kubeconfig
        .to_str()
        .context("kubeconfig path")?
        .to_string();
    let _nodes = flotilla_process(&[
        "simulate-nodes",
        "--kubeconfig",
        &kubeconfig,
        "--count",
        "2",
        "--prefix",
        "lb",
    ])?;
    for (index, node) in ["lb-0", "lb-1"].iter().enumerate() {
        wait_ready(&kubectl, node)?;
        let (id, zone) = &instances[index];
        set_provider_id(&kubectl, node, zone, id)?;
    }
    let subnets = network.subnet_ids.join(",");
    let controller = CloudController::start(
        f.data_dir(),
        &[
            "--kubeconfig",
            &kubeconfig,
            "--cluster-id",
            CLUSTER_ID,
            "--endpoint-override",
            &aws.endpoint,
            "--vpc-id",
            &network.vpc_id,
            "--subnet-ids",
            &subnets,
        ],
    )?;
    let outcome = scenario(&aws, &f, &kubectl, &kubeconfig, &instances);
    if outcome.is_err() {
        eprintln!("cloud-controller log (tail):\n{}", controller.log_tail());
    }
    outcome
}

fn scenario(
    aws: &LocalStack,
    f: &Flotilla,
    kubectl: &Kubectl,
    kubeconfig: &str,
    instances: &[(String, String)],
) -> anyhow::Result<()> {
    let ids = |n: usize| -> BTreeSet<String> {
        instances[..n].iter().map(|(id, _)| id.clone()).collect()
    };

    // A Service with two ports gets one NLB, its hostname in EXTERNAL-IP.
    let created = Instant::now();
    f.ok_stdin(&["apply", "-f", "-"], WEB)?;
    let mut hostname = String::new();
    until(
        "web has an ingress hostname",
        Duration::from_secs(60),
        || {
            hostname = jsonpath(
                kubectl,
                &["get", "svc", "web"],
                "{.status.loadBalancer.ingress[0].hostname}",
            )?;
            Ok(!hostname.is_empty())
        },
    )?;
    eprintln!(
        "Service created → ingress hostname {hostname}: {:.2} s",
        created.elapsed().as_secs_f64()
    );
    let table = f.ok(&["get", "svc", "web"])?;
    ensure!(
        table.contains(&hostname) && table.contains("LoadBalancer"),
        "kubectl get svc shows no hostname:\n{table}"
    );
    let finalizers = jsonpath(kubectl, &["get", "svc", "web"], "{.metadata.finalizers}")?;
    ensure!(
        finalizers.contains("service.kubernetes.io/load-balancer-cleanup"),
        "no cleanup finalizer: {finalizers}"
    );

    let name = lb_name(kubectl, "web")?;
    ensure!(
        load_balancers(aws)?.len() == 1,
        "expected exactly one NLB: {:?}",
        load_balancers(aws)?
    );
    let lb = load_balancers_named(aws, &name)?
        .into_iter()
        .next()
        .context("no NLB named after the Service's UID")?;
    ensure!(lb["Type"] == "network", "not a network LB: {lb}");
    ensure!(lb["Scheme"] == "internet-facing", "scheme: {lb}");
    ensure!(
        text(&lb["DNSName"]) == hostname,
        "hostname is not the DNSName"
    );
    let lb_arn = text(&lb["LoadBalancerArn"]);
    let tags = aws.call("elbv2", "describe_tags", json!({"ResourceArns": [lb_arn]}))?;
    let tags = tags["TagDescriptions"][0]["Tags"].to_string();
    for tag in [
        json!({"Key": format!("kubernetes.io/cluster/{CLUSTER_ID}"), "Value": "owned"}),
        json!({"Key": "kubernetes.io/service-name", "Value": "default/web"}),
    ] {
        ensure!(tags.contains(&tag.to_string()), "tag {tag} missing: {tags}");
    }
    let node_ports: BTreeSet<i64> =
        jsonpath(kubectl, &["get", "svc", "web"], "{.spec.ports[*].nodePort}")?
            .split_whitespace()
            .map(|p| p.parse().unwrap_or_default())
            .collect();
    let listener_list = listeners(aws, &lb_arn)?;
    ensure!(
        listener_list
            .iter()
            .map(|(p, _)| *p)
            .collect::<BTreeSet<_>>()
            == BTreeSet::from([80, 443]),
        "listeners: {listener_list:?}"
    );
    let groups = target_groups(aws, json!({"LoadBalancerArn": lb_arn}))?;
    let group_ports: BTreeSet<i64> = groups
        .iter()
        .map(|g| g["Port"].as_i64().unwrap_or_default())
        .collect();
    ensure!(
        groups.len() == 2 && group_ports == node_ports,
        "target groups {group_ports:?} are not on the NodePorts {node_ports:?}"
    );
    ensure!(
        groups
            .iter()
            .all(|g| g["Protocol"] == "TCP" && g["TargetType"] == "instance"),
        "target groups: {groups:?}"
    );
    let all_groups = target_groups(aws, json!({}))?;
    ensure!(all_groups.len() == 2, "extra target groups: {all_groups:?}");
    until(
        "the two Ready nodes are the targets",
        Duration::from_secs(30),
        || Ok(targets_of(aws, &lb_arn)? == ids(2)),
    )?;

    // A third node joins: registered. Its Node is made with its provider ID before its
    // simulated kubelet reports it, as a kubelet with `--provider-id` registers; otherwise
    // the cloud node controller sees a not-Ready Node without an instance and deletes it.
    let (id, zone) = &instances[2];
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "extra-0"},
                      "spec": {"providerID": format!("aws:///{zone}/{id}")}});
    f.ok_stdin(&["create", "-f", "-"], &node.to_string())?;
    let mut extra = flotilla_process(&[
        "simulate-nodes",
        "--kubeconfig",
        kubeconfig,
        "--count",
        "1",
        "--prefix",
        "extra",
    ])?;
    wait_ready(kubectl, "extra-0")?;
    until(
        "the joining node is registered",
        Duration::from_secs(30),
        || Ok(targets_of(aws, &lb_arn)? == ids(3)),
    )?;

    // It stops (no more heartbeats) and is NotReady: deregistered.
    extra.kill();
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
        "reason": "KubeletStopped", "message": "the simulated kubelet was killed"}]}});
    kubectl.ok(&[
        "patch",
        "node",
        "extra-0",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        &not_ready.to_string(),
    ])?;
    until(
        "the NotReady node is deregistered",
        Duration::from_secs(30),
        || Ok(targets_of(aws, &lb_arn)? == ids(2)),
    )?;

    // An invalid annotation: a warning event naming it, nothing made.
    f.ok_stdin(&["apply", "-f", "-"], BAD)?;
    let annotation = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    let mut note = String::new();
    until(
        "bad has a SyncLoadBalancerFailed event",
        Duration::from_secs(30),
        || {
            let events = default_events(f)?;
            note = events
                .iter()
                .find(|e| {
                    e["regarding"]["name"] == "bad"
                        && e["reason"] == "SyncLoadBalancerFailed"
                        && e["type"] == "Warning"
                })
                .map(|e| text(&e["note"]))
                .unwrap_or_default();
            Ok(!note.is_empty())
        },
    )?;
    ensure!(
        note.contains(annotation),
        "the event does not name the annotation: {note}"
    );
    eprintln!("invalid annotation event: {note}");
    let bad_name = lb_name(kubectl, "bad")?;
    ensure!(
        load_balancers_named(aws, &bad_name)?.is_empty() && load_balancers(aws)?.len() == 1,
        "an invalid Service made a load balancer"
    );
    ensure!(
        target_groups(aws, json!({}))?.len() == 2,
        "an invalid Service made a target group"
    );
    ensure!(
        jsonpath(
            kubectl,
            &["get", "svc", "bad"],
            "{.status.loadBalancer.ingress}"
        )?
        .is_empty(),
        "an invalid Service got an ingress"
    );

    // Faults: all of ELBv2 fails while a Service is created, then only CreateListener (so
    // the retries find the NLB and group already made); still exactly one of each.
    faults(
        aws,
        "POST",
        json!([{"service": "elbv2", "probability": 1,
                "error": {"statusCode": 503, "code": "ServiceUnavailable"}}]),
    )?;
    let faulty_created = Instant::now();
    f.ok_stdin(&["apply", "-f", "-"], FAULTY)?;
    std::thread::sleep(Duration::from_secs(4));
    faults(
        aws,
        "POST",
        json!([{"service": "elbv2", "operation": "CreateListener", "probability": 1,
                "error": {"statusCode": 503, "code": "ServiceUnavailable"}}]),
    )?;
    let faulty_name = lb_name(kubectl, "faulty")?;
    until("faulty's NLB exists", Duration::from_secs(60), || {
        Ok(!load_balancers_named(aws, &faulty_name)?.is_empty())
    })?;
    std::thread::sleep(Duration::from_secs(6));
    faults(aws, "DELETE", json!([]))?;
    until(
        "faulty has an ingress hostname",
        Duration::from_secs(120),
        || {
            Ok(!jsonpath(
                kubectl,
                &["get", "svc", "faulty"],
                "{.status.loadBalancer.ingress[0].hostname}",
            )?
            .is_empty())
        },
    )?;
    eprintln!(
        "Service created under faults → ingress hostname: {:.2} s",
        faulty_created.elapsed().as_secs_f64()
    );
    let faulty_lbs = load_balancers_named(aws, &faulty_name)?;
    ensure!(faulty_lbs.len() == 1, "duplicate NLBs: {faulty_lbs:?}");
    ensure!(
        load_balancers(aws)?.len() == 2,
        "NLBs: {:?}",
        load_balancers(aws)?
    );
    let faulty_arn = text(&faulty_lbs[0]["LoadBalancerArn"]);
    ensure!(
        listeners(aws, &faulty_arn)?.len() == 1,
        "faulty's listeners"
    );
    ensure!(
        target_groups(aws, json!({}))?.len() == 3,
        "target groups after the faults: {:?}",
        target_groups(aws, json!({}))?
    );
    until(
        "faulty's targets are the Ready nodes",
        Duration::from_secs(30),
        || Ok(targets_of(aws, &faulty_arn)? == ids(2)),
    )?;

    // Deleting the Services removes every NLB, listener and group, then the Services.
    f.ok(&["delete", "svc", "web", "bad", "faulty", "--timeout=90s"])?;
    until("the Services are gone", Duration::from_secs(60), || {
        Ok(f.ok(&["get", "svc", "-o", "name"])?.trim() == "service/kubernetes")
    })?;
    ensure!(
        load_balancers(aws)?.is_empty(),
        "NLBs left: {:?}",
        load_balancers(aws)?
    );
    ensure!(
        target_groups(aws, json!({}))?.is_empty(),
        "target groups left: {:?}",
        target_groups(aws, json!({}))?
    );
    for arn in [lb_arn, faulty_arn] {
        let left = match aws.try_call(
            "elbv2",
            "describe_listeners",
            json!({"LoadBalancerArn": arn}),
        )? {
            Ok(answer) => answer["Listeners"].as_array().map_or(0, Vec::len),
            Err(_) => 0,
        };
        ensure!(left == 0, "listeners left on {arn}");
    }
    let events = default_events(f)?;
    let seen: BTreeSet<(String, String)> = events
        .iter()
        .filter(|e| e["reportingController"] == "service-controller")
        .map(|e| (text(&e["regarding"]["name"]), text(&e["reason"])))
        .collect();
    for reason in [
        "EnsuringLoadBalancer",
        "EnsuredLoadBalancer",
        "UpdatedLoadBalancer",
        "DeletingLoadBalancer",
        "DeletedLoadBalancer",
    ] {
        ensure!(
            seen.contains(&("web".to_string(), reason.to_string())),
            "no {reason} event for web: {seen:?}"
        );
    }
    Ok(())
}
