//! Ingresses on application load balancers: `flotilla cloud-controller` against LocalStack
//! (ELBv2 and EC2 from moto) creates the `alb` IngressClass, gives an Ingress with two host
//! rules over two NodePort Services one internal ALB with its listener, rules and target
//! groups (the Ready nodes' instances on the NodePorts) and its DNS name in the status,
//! follows an edited path, a new NodePort and a node leaving the targets, warns about a
//! missing backend Service without building anything, ignores another class, gives the ALB
//! its own security group (open on the listen ports to `inbound-cidrs`, let into the nodes'
//! group on the NodePorts) or the groups the user names, and deletes everything with the
//! Ingress (needs the `flotilla` binary, kubectl 1.32 and LocalStack
//! from `tests/localstack/install`, which needs PyPI).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, LocalStack, flotilla_process, jsonpath, until};
use serde_json::{Value, json};

use crate::loadbalancer::{
    CloudController, default_events, load_balancers, run_instance, set_provider_id, text,
    wait_ready,
};

const CLUSTER_ID: &str = "demo";

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: api}
spec:
  type: NodePort
  selector: {app: api}
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

const SHOP: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
  annotations: {alb.ingress.kubernetes.io/healthcheck-path: /healthz}
spec:
  ingressClassName: alb
  rules:
  - host: web.example.com
    http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]
  - host: api.example.com
    http:
      paths: [{path: /v1, pathType: Prefix, backend: {service: {name: api, port: {name: http}}}}]
"#;

const BROKEN: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: broken}
spec:
  ingressClassName: alb
  rules:
  - http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: missing, port: {number: 80}}}}]
"#;

const OTHER_CLASS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: other}
spec:
  ingressClassName: nginx
  defaultBackend: {service: {name: web, port: {number: 80}}}
"#;

fn list(value: &Value) -> Vec<Value> {
    value.as_array().cloned().unwrap_or_default()
}

fn target_groups(aws: &LocalStack) -> anyhow::Result<Vec<Value>> {
    Ok(list(
        &aws.call("elbv2", "describe_target_groups", json!({}))?["TargetGroups"],
    ))
}

fn listeners(aws: &LocalStack, lb_arn: &str) -> anyhow::Result<Vec<Value>> {
    Ok(
        match aws.try_call(
            "elbv2",
            "describe_listeners",
            json!({"LoadBalancerArn": lb_arn}),
        )? {
            Ok(answer) => list(&answer["Listeners"]),
            Err(_) => Vec::new(),
        },
    )
}

/// `(priority, hosts, paths, target group ARN)` of a listener rule.
type SeenRule = (i64, Vec<String>, Vec<String>, String);

/// A listener's non-default rules, by priority.
fn rules(aws: &LocalStack, listener_arn: &str) -> anyhow::Result<Vec<SeenRule>> {
    let answer = aws.call(
        "elbv2",
        "describe_rules",
        json!({"ListenerArn": listener_arn}),
    )?;
    let strings = |v: &Value| -> Vec<String> { list(v).iter().map(text).collect() };
    let mut found: Vec<_> = list(&answer["Rules"])
        .iter()
        .filter(|r| r["IsDefault"] != true && r["Priority"] != "default")
        .map(|r| {
            let mut hosts = Vec::new();
            let mut paths = Vec::new();
            for condition in list(&r["Conditions"]) {
                match condition["Field"].as_str() {
                    Some("host-header") => {
                        hosts = strings(&condition["HostHeaderConfig"]["Values"])
                    }
                    Some("path-pattern") => {
                        paths = strings(&condition["PathPatternConfig"]["Values"])
                    }
                    _ => {}
                }
            }
            (
                text(&r["Priority"]).parse().unwrap_or(-1),
                hosts,
                paths,
                text(&r["Actions"][0]["TargetGroupArn"]),
            )
        })
        .collect();
    found.sort();
    Ok(found)
}

/// `(instance, port)` of a target group's registered (not draining) targets.
fn registered(aws: &LocalStack, group_arn: &str) -> anyhow::Result<BTreeSet<(String, i64)>> {
    let answer = aws.call(
        "elbv2",
        "describe_target_health",
        json!({"TargetGroupArn": group_arn}),
    )?;
    Ok(list(&answer["TargetHealthDescriptions"])
        .iter()
        .filter(|d| d["TargetHealth"]["State"] != "draining")
        .map(|d| {
            (
                text(&d["Target"]["Id"]),
                d["Target"]["Port"].as_i64().unwrap_or_default(),
            )
        })
        .collect())
}

/// The security groups made for Ingress `default/<name>` (found by upstream's stack tag).
fn managed_groups(aws: &LocalStack, name: &str) -> anyhow::Result<Vec<Value>> {
    let answer = aws.call(
        "ec2",
        "describe_security_groups",
        json!({"Filters": [{"Name": "tag:ingress.k8s.aws/stack", "Values": [format!("default/{name}")]}]}),
    )?;
    Ok(list(&answer["SecurityGroups"]))
}

/// `(port, source)` of a security group's TCP rules; the source is a CIDR or a group ID.
fn group_rules(aws: &LocalStack, group_id: &str) -> anyhow::Result<BTreeSet<(i64, String)>> {
    let answer = aws.call(
        "ec2",
        "describe_security_groups",
        json!({"GroupIds": [group_id]}),
    )?;
    let mut rules = BTreeSet::new();
    for permission in list(&answer["SecurityGroups"][0]["IpPermissions"]) {
        if permission["IpProtocol"] != "tcp" {
            continue;
        }
        let port = permission["FromPort"].as_i64().unwrap_or(-1);
        for range in list(&permission["IpRanges"]) {
            rules.insert((port, text(&range["CidrIp"])));
        }
        for pair in list(&permission["UserIdGroupPairs"]) {
            rules.insert((port, text(&pair["GroupId"])));
        }
    }
    Ok(rules)
}

/// The rules of the nodes' group that let `source` in.
fn rules_from(
    aws: &LocalStack,
    nodes_group: &str,
    source: &str,
) -> anyhow::Result<BTreeSet<(i64, String)>> {
    Ok(group_rules(aws, nodes_group)?
        .into_iter()
        .filter(|(_, from)| from == source)
        .collect())
}

/// The security groups attached to the load balancer.
fn attached_groups(lb: &Value) -> Vec<String> {
    list(&lb["SecurityGroups"]).iter().map(text).collect()
}

fn node_port(kubectl: &Kubectl, service: &str) -> anyhow::Result<i64> {
    jsonpath(
        kubectl,
        &["get", "svc", service],
        "{.spec.ports[0].nodePort}",
    )?
    .parse()
    .context("a NodePort")
}

#[test]
fn ingresses_on_application_load_balancers() -> anyhow::Result<()> {
    let started = Instant::now();
    let aws = LocalStack::start()?;
    let network = aws.network()?;
    // Internal is the default scheme: the subnets are tagged for internal load balancers too.
    aws.call(
        "ec2",
        "create_tags",
        json!({"Resources": network.subnet_ids,
               "Tags": [{"Key": "kubernetes.io/role/internal-elb", "Value": "1"}]}),
    )?;
    let mut instances = Vec::new();
    for subnet in &network.subnet_ids {
        instances.push(run_instance(&aws, subnet)?);
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
        "ing",
    ])?;
    for (index, node) in ["ing-0", "ing-1"].iter().enumerate() {
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
    // In node order: `ing-0`'s instance first.
    let ids: Vec<String> = instances.iter().map(|(id, _)| id.clone()).collect();
    let outcome = scenario(&aws, &f, &kubectl, &ids, &network.vpc_id);
    if outcome.is_err() {
        eprintln!("cloud-controller log (tail):\n{}", controller.log_tail());
    }
    eprintln!(
        "ingress e2e wall time: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    outcome
}

fn scenario(
    aws: &LocalStack,
    f: &Flotilla,
    kubectl: &Kubectl,
    instances: &[String],
    vpc_id: &str,
) -> anyhow::Result<()> {
    // The controller makes the `alb` class, so `ingressClassName: alb` works as is.
    until(
        "the alb IngressClass exists",
        Duration::from_secs(30),
        || {
            Ok(jsonpath(
                kubectl,
                &["get", "ingressclass", "alb"],
                "{.spec.controller}",
            )
            .is_ok_and(|c| c == "ingress.k8s.aws/alb"))
        },
    )?;
    f.ok_stdin(&["apply", "-f", "-"], SERVICES)?;
    let created = Instant::now();
    f.ok_stdin(&["apply", "-f", "-"], SHOP)?;
    let mut hostname = String::new();
    until("shop has a hostname", Duration::from_secs(60), || {
        hostname = jsonpath(
            kubectl,
            &["get", "ingress", "shop"],
            "{.status.loadBalancer.ingress[0].hostname}",
        )?;
        Ok(!hostname.is_empty())
    })?;
    eprintln!(
        "Ingress created → hostname in status ({hostname}): {:.2} s",
        created.elapsed().as_secs_f64()
    );
    // kubectl's table: upstream's printer columns.
    let table = kubectl.ok(&["get", "ingress", "shop"])?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header == ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]
            && table.contains(" alb ")
            && table.contains(" 80 "),
        "kubectl get ingress:\n{table}"
    );
    let finalizers = jsonpath(
        kubectl,
        &["get", "ingress", "shop"],
        "{.metadata.finalizers}",
    )?;
    ensure!(
        finalizers.contains("ingress.k8s.aws/resources"),
        "no finalizer: {finalizers}"
    );

    // One internal ALB, tagged with the cluster and the Ingress.
    let lbs = load_balancers(aws)?;
    ensure!(lbs.len() == 1, "expected one load balancer: {lbs:?}");
    let lb = &lbs[0];
    ensure!(lb["Type"] == "application", "not an ALB: {lb}");
    ensure!(lb["Scheme"] == "internal", "scheme: {lb}");
    ensure!(
        text(&lb["DNSName"]) == hostname,
        "hostname is not the DNSName: {lb}"
    );
    let lb_arn = text(&lb["LoadBalancerArn"]);
    let tags = aws.call("elbv2", "describe_tags", json!({"ResourceArns": [lb_arn]}))?;
    let tags = tags["TagDescriptions"][0]["Tags"].to_string();
    for tag in [
        json!({"Key": format!("kubernetes.io/cluster/{CLUSTER_ID}"), "Value": "owned"}),
        json!({"Key": "ingress.k8s.aws/stack", "Value": "default/shop"}),
    ] {
        ensure!(tags.contains(&tag.to_string()), "tag {tag} missing: {tags}");
    }

    // One target group per Service, on its NodePort, with both nodes' instances.
    let web_port = node_port(kubectl, "web")?;
    let api_port = node_port(kubectl, "api")?;

    // Its own security group, open to everyone on the listener's port, and let into the
    // nodes' group (the VPC's default group here) on the two NodePorts.
    let groups = managed_groups(aws, "shop")?;
    ensure!(groups.len() == 1, "expected one managed group: {groups:?}");
    let managed = text(&groups[0]["GroupId"]);
    ensure!(
        groups[0]["Description"] == "[k8s] Managed SecurityGroup for LoadBalancer"
            && groups[0]["VpcId"] == vpc_id
            && text(&groups[0]["GroupName"]).starts_with("k8s-default-shop-"),
        "managed group: {}",
        groups[0]
    );
    ensure!(
        attached_groups(lb) == [managed.clone()],
        "the load balancer's groups: {lb}"
    );
    let open_to_all = BTreeSet::from([(80, "0.0.0.0/0".to_string())]);
    ensure!(
        group_rules(aws, &managed)? == open_to_all,
        "managed group rules: {:?}",
        group_rules(aws, &managed)?
    );
    let nodes_group = text(
        &aws.call(
            "ec2",
            "describe_security_groups",
            json!({"Filters": [{"Name": "vpc-id", "Values": [vpc_id]},
                               {"Name": "group-name", "Values": ["default"]}]}),
        )?["SecurityGroups"][0]["GroupId"],
    );
    let into_nodes = |ports: &[i64]| -> BTreeSet<(i64, String)> {
        ports.iter().map(|p| (*p, managed.clone())).collect()
    };
    until(
        "the nodes' group lets the load balancer in",
        Duration::from_secs(30),
        || Ok(rules_from(aws, &nodes_group, &managed)? == into_nodes(&[web_port, api_port])),
    )?;
    let groups = target_groups(aws)?;
    ensure!(groups.len() == 2, "expected two target groups: {groups:?}");
    let group_on = |port: i64| -> anyhow::Result<String> {
        let group = groups
            .iter()
            .find(|g| g["Port"] == port)
            .with_context(|| format!("no target group on NodePort {port}: {groups:?}"))?;
        ensure!(
            group["Protocol"] == "HTTP"
                && group["TargetType"] == "instance"
                && group["HealthCheckPath"] == "/healthz",
            "target group: {group}"
        );
        Ok(text(&group["TargetGroupArn"]))
    };
    let web_group = group_on(web_port)?;
    let api_group = group_on(api_port)?;
    for (group, port) in [(&web_group, web_port), (&api_group, api_port)] {
        let want: BTreeSet<(String, i64)> = instances.iter().map(|id| (id.clone(), port)).collect();
        until("the nodes are registered", Duration::from_secs(30), || {
            Ok(registered(aws, group)? == want)
        })?;
    }

    // One HTTP:80 listener answering 404 by default, and a rule per host and path.
    let found = listeners(aws, &lb_arn)?;
    ensure!(found.len() == 1, "listeners: {found:?}");
    let listener = &found[0];
    ensure!(
        listener["Port"] == 80 && listener["Protocol"] == "HTTP",
        "listener: {listener}"
    );
    let default = &listener["DefaultActions"][0];
    ensure!(
        default["Type"] == "fixed-response"
            && default["FixedResponseConfig"]["StatusCode"] == "404",
        "default action: {default}"
    );
    let listener_arn = text(&listener["ListenerArn"]);
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let want = vec![
        (
            1,
            strings(&["web.example.com"]),
            strings(&["/*"]),
            web_group.clone(),
        ),
        (
            2,
            strings(&["api.example.com"]),
            strings(&["/v1", "/v1/*"]),
            api_group.clone(),
        ),
    ];
    let got = rules(aws, &listener_arn)?;
    ensure!(got == want, "rules: {got:?}, want {want:?}");

    // Editing a path updates its rule.
    let edit =
        json!([{"op": "replace", "path": "/spec/rules/1/http/paths/0/path", "value": "/v2"}]);
    kubectl.ok(&[
        "patch",
        "ingress",
        "shop",
        "--type",
        "json",
        "-p",
        &edit.to_string(),
    ])?;
    let want_edited = vec![
        want[0].clone(),
        (
            2,
            strings(&["api.example.com"]),
            strings(&["/v2", "/v2/*"]),
            api_group.clone(),
        ),
    ];
    until(
        "the edited path is in its rule",
        Duration::from_secs(30),
        || Ok(rules(aws, &listener_arn)? == want_edited),
    )?;

    // A new NodePort of a backend Service: a new target group on it, the old one deleted.
    let moved = (30000..32768)
        .find(|p| *p != web_port && *p != api_port)
        .context("a free NodePort")?;
    let patch = json!({"spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080,
                                           "nodePort": moved}]}});
    kubectl.ok(&[
        "patch",
        "svc",
        "web",
        "--type",
        "merge",
        "-p",
        &patch.to_string(),
    ])?;
    let mut moved_group = String::new();
    until(
        "the web rule forwards to a group on the new NodePort",
        Duration::from_secs(30),
        || {
            let groups = target_groups(aws)?;
            let Some(group) = groups.iter().find(|g| g["Port"] == moved) else {
                return Ok(false);
            };
            moved_group = text(&group["TargetGroupArn"]);
            let got = rules(aws, &listener_arn)?;
            Ok(groups.len() == 2
                && got.first().is_some_and(|rule| rule.3 == moved_group)
                && registered(aws, &moved_group)?.len() == instances.len())
        },
    )?;
    ensure!(
        !target_groups(aws)?
            .iter()
            .any(|g| text(&g["TargetGroupArn"]) == web_group),
        "the group on the old NodePort is left"
    );
    until(
        "the nodes' group follows the new NodePort",
        Duration::from_secs(30),
        || Ok(rules_from(aws, &nodes_group, &managed)? == into_nodes(&[api_port, moved])),
    )?;

    // inbound-cidrs narrows who may reach the listener.
    kubectl.ok(&[
        "annotate",
        "ingress",
        "shop",
        "alb.ingress.kubernetes.io/inbound-cidrs=10.0.0.0/8,192.168.0.0/16",
    ])?;
    let private = BTreeSet::from([
        (80, "10.0.0.0/8".to_string()),
        (80, "192.168.0.0/16".to_string()),
    ]);
    until(
        "the managed group follows inbound-cidrs",
        Duration::from_secs(30),
        || Ok(group_rules(aws, &managed)? == private),
    )?;

    // A node leaving the target set (excluded from load balancers) is deregistered.
    kubectl.ok(&[
        "label",
        "node",
        "ing-1",
        "node.kubernetes.io/exclude-from-external-load-balancers=true",
    ])?;
    let only = |port: i64| BTreeSet::from([(instances[0].clone(), port)]);
    until(
        "the excluded node is deregistered",
        Duration::from_secs(30),
        || {
            Ok(registered(aws, &moved_group)? == only(moved)
                && registered(aws, &api_group)? == only(api_port))
        },
    )?;

    // A missing backend Service: a warning naming it, nothing built. Another class: ignored.
    f.ok_stdin(&["apply", "-f", "-"], BROKEN)?;
    f.ok_stdin(&["apply", "-f", "-"], OTHER_CLASS)?;
    let mut note = String::new();
    until(
        "broken has a FailedBuildModel event",
        Duration::from_secs(30),
        || {
            let events = default_events(f)?;
            note = events
                .iter()
                .find(|e| {
                    e["regarding"]["name"] == "broken"
                        && e["reason"] == "FailedBuildModel"
                        && e["type"] == "Warning"
                })
                .map(|e| text(&e["note"]))
                .unwrap_or_default();
            Ok(!note.is_empty())
        },
    )?;
    ensure!(
        note.contains("missing"),
        "the event does not name the Service: {note}"
    );
    eprintln!("missing backend event: {note}");
    // `nginx` names no IngressClass of this cluster: said, and nothing built for it.
    until(
        "other has an UnknownIngressClass event",
        Duration::from_secs(30),
        || {
            let events = default_events(f)?;
            Ok(events.iter().any(|e| {
                e["regarding"]["name"] == "other"
                    && e["reason"] == "UnknownIngressClass"
                    && text(&e["note"]).contains("\"nginx\" not found")
            }))
        },
    )?;
    ensure!(
        load_balancers(aws)?.len() == 1,
        "a broken Ingress made a load balancer"
    );
    ensure!(
        target_groups(aws)?.len() == 2,
        "a broken Ingress made a target group"
    );
    for name in ["broken", "other"] {
        let status = jsonpath(
            kubectl,
            &["get", "ingress", name],
            "{.status.loadBalancer.ingress}",
        )?;
        let finalizers = jsonpath(kubectl, &["get", "ingress", name], "{.metadata.finalizers}")?;
        ensure!(
            status.is_empty() && finalizers.is_empty(),
            "{name} was reconciled: status {status:?}, finalizers {finalizers:?}"
        );
    }

    // Named security groups replace the managed one: it and its rules on the nodes go.
    let clients = aws.call(
        "ec2",
        "create_security_group",
        json!({"GroupName": "web-clients", "Description": "clients", "VpcId": vpc_id}),
    )?;
    let clients = text(&clients["GroupId"]);
    kubectl.ok(&[
        "annotate",
        "ingress",
        "shop",
        "alb.ingress.kubernetes.io/security-groups=web-clients",
    ])?;
    until(
        "the named group replaces the managed one",
        Duration::from_secs(30),
        || {
            let lbs = load_balancers(aws)?;
            Ok(lbs.len() == 1
                && attached_groups(&lbs[0]) == [clients.clone()]
                && managed_groups(aws, "shop")?.is_empty()
                && rules_from(aws, &nodes_group, &managed)?.is_empty())
        },
    )?;
    // A group that does not exist: a warning naming it, and the load balancer untouched.
    kubectl.ok(&[
        "annotate",
        "--overwrite",
        "ingress",
        "shop",
        "alb.ingress.kubernetes.io/security-groups=no-such-group",
    ])?;
    until(
        "a missing security group is reported",
        Duration::from_secs(30),
        || {
            let events = default_events(f)?;
            Ok(events.iter().any(|e| {
                e["regarding"]["name"] == "shop"
                    && e["type"] == "Warning"
                    && text(&e["note"]).contains("no-such-group")
            }))
        },
    )?;
    let lbs = load_balancers(aws)?;
    ensure!(
        lbs.len() == 1 && attached_groups(&lbs[0]) == [clients.clone()],
        "a missing group changed the load balancer: {lbs:?}"
    );
    // Back to a managed group, which is made again.
    kubectl.ok(&[
        "annotate",
        "ingress",
        "shop",
        "alb.ingress.kubernetes.io/security-groups-",
    ])?;
    let mut managed = String::new();
    until(
        "a managed group is made again",
        Duration::from_secs(30),
        || {
            let groups = managed_groups(aws, "shop")?;
            let Some(group) = groups.first() else {
                return Ok(false);
            };
            managed = text(&group["GroupId"]);
            let lbs = load_balancers(aws)?;
            Ok(lbs.len() == 1
                && attached_groups(&lbs[0]) == [managed.clone()]
                && !rules_from(aws, &nodes_group, &managed)?.is_empty())
        },
    )?;

    // Deleting the Ingress removes the rules, listener, target groups and load balancer.
    f.ok(&[
        "delete",
        "ingress",
        "shop",
        "broken",
        "other",
        "--timeout=60s",
    ])?;
    until("the Ingresses are gone", Duration::from_secs(60), || {
        Ok(f.ok(&["get", "ingress", "-o", "name"])?.trim().is_empty())
    })?;
    ensure!(
        load_balancers(aws)?.is_empty(),
        "load balancers left: {:?}",
        load_balancers(aws)?
    );
    ensure!(
        target_groups(aws)?.is_empty(),
        "target groups left: {:?}",
        target_groups(aws)?
    );
    ensure!(
        listeners(aws, &lb_arn)?.is_empty(),
        "listeners left on {lb_arn}"
    );
    // …and its security group, with the rule that let it into the nodes' group.
    ensure!(
        managed_groups(aws, "shop")?.is_empty(),
        "managed groups left: {:?}",
        managed_groups(aws, "shop")?
    );
    ensure!(
        rules_from(aws, &nodes_group, &managed)?.is_empty(),
        "rules left on the nodes' group: {:?}",
        group_rules(aws, &nodes_group)?
    );
    ensure!(
        group_rules(aws, &clients).is_ok(),
        "the user's own group was deleted"
    );
    Ok(())
}
