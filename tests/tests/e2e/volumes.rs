//! EBS volumes end to end on LocalStack: `flotilla cloud-controller` provisions a
//! WaitForFirstConsumer claim of an `ebs.csi.aws.com` class in its pod's node's zone, attaches
//! it to the node's instance through a VolumeAttachment, grows it, detaches it when the pod
//! goes and deletes it with the claim; a class with a bad `type` gets a ProvisioningFailed
//! event and no volume (needs the `flotilla` binary, kubectl 1.32 and LocalStack from PyPI).

use std::process::{Child, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, LocalStack, jsonpath, until};
use serde_json::json;

/// A background `flotilla` process (killed when dropped) with the AWS environment the
/// cloud controller reads, which `flotilla_process` does not pass.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cloud_controller(args: &[&str]) -> anyhow::Result<Background> {
    let child = flotilla_e2e::cloud_controller_command(args)?
        .stderr(Stdio::null())
        .spawn()
        .context("starting flotilla cloud-controller")?;
    Ok(Background(child))
}

const CLASSES_AND_CLAIM: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ebs-gp3}
provisioner: ebs.csi.aws.com
parameters: {type: gp3}
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: ebs-gp3
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: app, namespace: default}
spec:
  containers:
  - name: app
    image: busybox:1.36
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: data}
"#;

const BOGUS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ebs-bogus}
provisioner: ebs.csi.aws.com
parameters: {type: bogus}
volumeBindingMode: Immediate
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: bogus, namespace: default}
spec:
  storageClassName: ebs-bogus
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
"#;

fn describe_volume(
    localstack: &LocalStack,
    volume_id: &str,
) -> anyhow::Result<Result<serde_json::Value, (String, String)>> {
    Ok(localstack
        .try_call("ec2", "describe_volumes", json!({"VolumeIds": [volume_id]}))?
        .map(|answer| answer["Volumes"][0].clone()))
}

fn tag<'a>(volume: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    volume["Tags"]
        .as_array()?
        .iter()
        .find(|t| t["Key"] == key)?["Value"]
        .as_str()
}

fn events(kubectl: &Kubectl) -> anyhow::Result<String> {
    jsonpath(
        kubectl,
        &["get", "events", "-n", "default"],
        r#"{range .items[*]}{.involvedObject.name} {.type} {.reason} {.message}{"\n"}{end}"#,
    )
}

#[test]
fn ebs_volumes_are_provisioned_attached_grown_detached_and_deleted() -> anyhow::Result<()> {
    let localstack = LocalStack::start()?;
    let network = localstack.network()?;
    let launched = localstack.call(
        "ec2",
        "run_instances",
        json!({"ImageId": "ami-0123456789abcdef0", "InstanceType": "t3.medium",
               "MinCount": 1, "MaxCount": 1, "SubnetId": network.subnet_ids[0]}),
    )?;
    let instance_id = launched["Instances"][0]["InstanceId"]
        .as_str()
        .context("run_instances answered no InstanceId")?
        .to_string();
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let kubeconfig = kubectl.kubeconfig.to_str().context("path")?.to_string();
    let _nodes = flotilla_e2e::flotilla_process(&[
        "simulate-nodes",
        "--kubeconfig",
        &kubeconfig,
        "--count",
        "1",
    ])?;
    until("node sim-0 is Ready", Duration::from_secs(30), || {
        Ok(jsonpath(
            &kubectl,
            &["get", "nodes"],
            r#"{.items[*].status.conditions[?(@.type=="Ready")].status}"#,
        )? == "True")
    })?;
    kubectl.ok(&[
        "label",
        "node",
        "sim-0",
        "topology.kubernetes.io/zone=us-east-1a",
    ])?;
    let provider_id = format!("aws:///us-east-1a/{instance_id}");
    kubectl.ok(&[
        "patch",
        "node",
        "sim-0",
        "-p",
        &json!({"spec": {"providerID": provider_id}}).to_string(),
    ])?;
    let subnets = network.subnet_ids.join(",");
    let _cloud = cloud_controller(&[
        "--kubeconfig",
        &kubeconfig,
        "--cluster-id",
        "demo",
        "--endpoint-override",
        &localstack.endpoint,
        "--vpc-id",
        &network.vpc_id,
        "--subnet-ids",
        &subnets,
    ])?;
    kubectl.ok_stdin(&["apply", "-f", "-"], CLASSES_AND_CLAIM)?;

    // Provisioned in the pod's node's zone after the scheduler chose it, then bound.
    until("the claim is Bound", Duration::from_secs(60), || {
        Ok(jsonpath(&kubectl, &["get", "pvc", "data"], "{.status.phase}")? == "Bound")
    })?;
    let uid = jsonpath(&kubectl, &["get", "pvc", "data"], "{.metadata.uid}")?;
    let pv_name = format!("pvc-{uid}");
    ensure!(jsonpath(&kubectl, &["get", "pvc", "data"], "{.spec.volumeName}")? == pv_name);
    let pv = |path: &str| jsonpath(&kubectl, &["get", "pv", &pv_name], path);
    ensure!(pv("{.spec.csi.driver}")? == "ebs.csi.aws.com");
    ensure!(pv("{.spec.capacity.storage}")? == "1Gi");
    ensure!(pv("{.spec.persistentVolumeReclaimPolicy}")? == "Delete");
    ensure!(
        pv(r#"{.metadata.annotations.pv\.kubernetes\.io/provisioned-by}"#)? == "ebs.csi.aws.com"
    );
    ensure!(
        pv("{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}")?
            == "us-east-1a"
    );
    let volume_id = pv("{.spec.csi.volumeHandle}")?;
    ensure!(volume_id.starts_with("vol-"), "volume handle {volume_id:?}");
    let volume = describe_volume(&localstack, &volume_id)?
        .map_err(|(code, message)| anyhow::anyhow!("{code}: {message}"))?;
    ensure!(volume["AvailabilityZone"] == "us-east-1a", "{volume}");
    ensure!(volume["VolumeType"] == "gp3", "{volume}");
    ensure!(volume["Size"] == 1, "{volume}");
    ensure!(
        tag(&volume, "kubernetes.io/cluster/demo") == Some("owned"),
        "{volume}"
    );
    ensure!(tag(&volume, "kubernetes.io/created-for/pv/name") == Some(pv_name.as_str()));
    ensure!(tag(&volume, "kubernetes.io/created-for/pvc/name") == Some("data"));
    ensure!(tag(&volume, "kubernetes.io/created-for/pvc/namespace") == Some("default"));
    let claim_events = events(&kubectl)?;
    ensure!(
        claim_events.contains("data Normal ProvisioningSucceeded"),
        "{claim_events}"
    );

    // Attached to the node's instance, and the VolumeAttachment says so.
    until(
        "the VolumeAttachment is attached",
        Duration::from_secs(60),
        || {
            Ok(jsonpath(
                &kubectl,
                &["get", "volumeattachments"],
                "{.items[*].status.attached}",
            )? == "true")
        },
    )?;
    let table = kubectl.ok(&["get", "volumeattachments"])?;
    ensure!(
        table.lines().next().is_some_and(|h| h.contains("ATTACHER")
            && h.contains("PV")
            && h.contains("NODE")
            && h.contains("ATTACHED")),
        "{table}"
    );
    ensure!(
        table
            .lines()
            .nth(1)
            .is_some_and(|row| row.contains(pv_name.as_str())
                && row.contains("sim-0")
                && row.contains("true")),
        "{table}"
    );
    let attachment = |path: &str| jsonpath(&kubectl, &["get", "volumeattachments"], path);
    ensure!(attachment("{.items[0].metadata.name}")?.starts_with("csi-"));
    ensure!(attachment("{.items[0].spec.attacher}")? == "ebs.csi.aws.com");
    ensure!(attachment("{.items[0].spec.nodeName}")? == "sim-0");
    ensure!(attachment("{.items[0].spec.source.persistentVolumeName}")? == pv_name);
    ensure!(attachment("{.items[0].status.attachmentMetadata.devicePath}")? == "/dev/xvdba");
    ensure!(
        attachment("{.items[0].metadata.finalizers[0]}")? == "external-attacher/ebs-csi-aws-com"
    );
    let volume = describe_volume(&localstack, &volume_id)?
        .map_err(|(code, message)| anyhow::anyhow!("{code}: {message}"))?;
    ensure!(
        volume["Attachments"][0]["InstanceId"] == instance_id.as_str(),
        "{volume}"
    );
    ensure!(volume["Attachments"][0]["State"] == "attached", "{volume}");
    ensure!(
        volume["Attachments"][0]["Device"] == "/dev/xvdba",
        "{volume}"
    );

    // Grown: ModifyVolume, then the PV's capacity and the claim's.
    kubectl.ok(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"3Gi"}}}}"#,
    ])?;
    until("the volume is 3 GiB", Duration::from_secs(60), || {
        let grown = describe_volume(&localstack, &volume_id)?.is_ok_and(|v| v["Size"] == 3);
        Ok(grown && pv("{.spec.capacity.storage}")? == "3Gi")
    })?;
    until(
        "the claim's capacity is 3Gi",
        Duration::from_secs(30),
        || {
            Ok(jsonpath(
                &kubectl,
                &["get", "pvc", "data"],
                "{.status.capacity.storage}",
            )? == "3Gi")
        },
    )?;

    // The pod goes: the volume is detached and the VolumeAttachment removed.
    kubectl.ok(&["delete", "pod", "app", "--wait=true", "--timeout=60s"])?;
    until("the volume is detached", Duration::from_secs(60), || {
        Ok(describe_volume(&localstack, &volume_id)?.is_ok_and(|v| {
            v["State"] == "available" && v["Attachments"].as_array().is_none_or(Vec::is_empty)
        }))
    })?;
    until(
        "the VolumeAttachment is gone",
        Duration::from_secs(30),
        || {
            Ok(jsonpath(
                &kubectl,
                &["get", "volumeattachments"],
                "{.items[*].metadata.name}",
            )?
            .is_empty())
        },
    )?;

    // The claim goes: the volume is deleted, then the PV.
    kubectl.ok(&["delete", "pvc", "data", "--wait=true", "--timeout=60s"])?;
    until("the volume is deleted", Duration::from_secs(60), || {
        Ok(matches!(describe_volume(&localstack, &volume_id)?,
            Err((code, _)) if code == "InvalidVolume.NotFound"))
    })?;
    until("the PV is gone", Duration::from_secs(30), || {
        Ok(jsonpath(&kubectl, &["get", "pv"], "{.items[*].metadata.name}")?.is_empty())
    })?;

    // A bad parameter: a ProvisioningFailed event naming it, and nothing created.
    kubectl.ok_stdin(&["apply", "-f", "-"], BOGUS)?;
    until(
        "the bogus claim gets ProvisioningFailed",
        Duration::from_secs(60),
        || {
            Ok(events(&kubectl)?.lines().any(|line| {
                line.starts_with("bogus Warning ProvisioningFailed")
                    && line.contains("type")
                    && line.contains("\"bogus\"")
            }))
        },
    )?;
    let volumes = localstack.call(
        "ec2",
        "describe_volumes",
        json!({"Filters": [{"Name": "tag:kubernetes.io/created-for/pvc/name", "Values": ["bogus"]}]}),
    )?;
    ensure!(
        volumes["Volumes"].as_array().is_some_and(Vec::is_empty),
        "{volumes}"
    );
    ensure!(jsonpath(&kubectl, &["get", "pvc", "bogus"], "{.status.phase}")? == "Pending");
    Ok(())
}
