//! Node TLS bootstrap end to end (needs the `flotilla` binary and kubectl 1.32): a bootstrap
//! token Secret made with kubectl, `flotilla simulate-nodes --node-config` joining node `n1`
//! through a CertificateSigningRequest that the hosted controllers approve and sign, the node
//! then acting as `system:node:n1` (its Node with labels and taints, its Lease, its pods) and
//! limited by NodeRestriction; requests that must not be approved or stored are not.

use std::time::Duration;

use anyhow::{Context, ensure};
use base64::Engine;
use flotilla_e2e::{Backend, Flotilla, Kubectl, flotilla_process, jsonpath, until};

const TOKEN_ID: &str = "abcdef";
const TOKEN: &str = "abcdef.0123456789abcdef";

fn b64(data: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// A PEM certificate request with subject `O=org, CN=cn`.
fn request_pem(cn: &str, org: &str) -> anyhow::Result<String> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    Ok(params.serialize_request(&key)?.pem()?)
}

const KUBELET_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

fn csr_manifest(name: &str, request_b64: &str, signer: &str) -> String {
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  request: {request_b64}\n  signerName: {signer}\n  usages: [digital signature, client auth]\n"
    )
}

/// The node bootstrap document for the cluster of `kubeconfig`.
fn node_config(kubectl: &Kubectl) -> anyhow::Result<String> {
    let config: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    let cluster = &config["clusters"][0]["cluster"];
    let server = cluster["server"].as_str().context("server")?;
    let ca = cluster["certificate-authority-data"]
        .as_str()
        .context("CA")?;
    Ok(format!(
        r#"apiVersion: node.flotilla.dev/v1alpha1
kind: NodeConfig
spec:
  cluster:
    name: demo
    apiServerEndpoint: {server}
    certificateAuthority: {ca}
  kubelet:
    bootstrapToken: {TOKEN}
    nodeLabels: {{team: infra}}
    registerWithTaints: [{{key: node.cloudprovider.kubernetes.io/uninitialized, value: "true", effect: NoSchedule}}]
"#
    ))
}

/// kubectl as the node, with the certificate and key the simulator stored.
fn node_kubectl(kubectl: &Kubectl, cert_dir: &std::path::Path) -> anyhow::Result<Kubectl> {
    let pair = std::fs::read_to_string(cert_dir.join("kubelet-client-current.pem"))?;
    let block = |label: &str| -> anyhow::Result<String> {
        let begin = format!("-----BEGIN {label}-----");
        let end = format!("-----END {label}-----");
        let start = pair.find(&begin).context("begin")?;
        let stop = pair[start..].find(&end).context("end")? + start + end.len();
        Ok(format!("{}\n", &pair[start..stop]))
    };
    let mut config: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubectl.kubeconfig)?)?;
    config["users"][0]["user"] = serde_json::json!({
        "client-certificate-data": b64(block("CERTIFICATE")?),
        "client-key-data": b64(block("PRIVATE KEY")?),
    });
    let file = kubectl.kubeconfig.with_extension("n1.kubeconfig");
    std::fs::write(&file, serde_yaml::to_string(&config)?)?;
    Ok(Kubectl::new(&file))
}

#[test]
fn a_node_joins_with_a_bootstrap_token() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.create_bootstrap_token(TOKEN_ID, "0123456789abcdef")?;
    let config_path = f.data_dir().join("node-config.yaml");
    std::fs::write(&config_path, node_config(&kubectl)?)?;
    let cert_dir = f.data_dir().join("n1-pki");
    let (config_arg, dir_arg) = (
        config_path.to_str().context("path")?,
        cert_dir.to_str().context("path")?,
    );
    let _node = flotilla_process(&[
        "simulate-nodes",
        "--node-config",
        config_arg,
        "--node-name",
        "n1",
        "--node-ip",
        "10.0.0.5",
        "--cert-dir",
        dir_arg,
    ])?;

    // The request is approved and issued, and the requester is the bootstrap token's user.
    until("n1's request is issued", Duration::from_secs(60), || {
        Ok(kubectl.ok(&["get", "csr"])?.contains("Approved,Issued"))
    })?;
    let table = kubectl.ok(&["get", "csr"])?;
    for column in ["SIGNERNAME", "REQUESTOR", "REQUESTEDDURATION", "CONDITION"] {
        ensure!(table.contains(column), "no {column} in:\n{table}");
    }
    ensure!(
        table.contains("kubernetes.io/kube-apiserver-client-kubelet")
            && table.contains(&format!("system:bootstrap:{TOKEN_ID}")),
        "{table}"
    );
    let reason = jsonpath(
        &kubectl,
        &["get", "csr"],
        "{.items[0].status.conditions[0].reason}",
    )?;
    ensure!(reason == "AutoApproved", "{reason}");

    // The Node registered itself with its labels, taints and address; its Lease renews.
    until("node n1 is registered", Duration::from_secs(30), || {
        Ok(kubectl
            .run(&["get", "node", "n1"], None, &[])?
            .status
            .success())
    })?;
    let taint = jsonpath(&kubectl, &["get", "node", "n1"], "{.spec.taints[0].key}")?;
    ensure!(
        taint == "node.cloudprovider.kubernetes.io/uninitialized",
        "{taint}"
    );
    let team = jsonpath(&kubectl, &["get", "node", "n1"], "{.metadata.labels.team}")?;
    ensure!(team == "infra", "{team}");
    let ip = jsonpath(
        &kubectl,
        &["get", "node", "n1"],
        "{.status.addresses[0].address}",
    )?;
    ensure!(ip == "10.0.0.5", "{ip}");
    let holder = jsonpath(
        &kubectl,
        &["-n", "kube-node-lease", "get", "lease", "n1"],
        "{.spec.holderIdentity}",
    )?;
    ensure!(holder == "n1", "{holder}");
    let renewed = |k: &Kubectl| {
        jsonpath(
            k,
            &["-n", "kube-node-lease", "get", "lease", "n1"],
            "{.spec.renewTime}",
        )
    };
    let first = renewed(&kubectl)?;
    until("n1's lease is renewed", Duration::from_secs(25), || {
        Ok(renewed(&kubectl)? != first)
    })?;

    // A pod bound to it runs.
    kubectl.ok(&[
        "run",
        "on-n1",
        "--image=nginx",
        "--overrides={\"spec\":{\"nodeName\":\"n1\"}}",
    ])?;
    until("the pod on n1 runs", Duration::from_secs(30), || {
        Ok(jsonpath(&kubectl, &["get", "pod", "on-n1"], "{.status.phase}")? == "Running")
    })?;

    // The node's own credential is system:node:n1, and NodeRestriction holds it to its Node.
    let node = node_kubectl(&kubectl, &cert_dir)?;
    let whoami = node.ok(&["auth", "whoami"])?;
    ensure!(
        whoami.contains("system:node:n1") && whoami.contains("system:nodes"),
        "{whoami}"
    );
    node.ok(&["label", "node", "n1", "checked=yes"])?;
    kubectl.ok_stdin(
        &["create", "-f", "-"],
        "apiVersion: v1\nkind: Node\nmetadata: {name: n2}\n",
    )?;
    let refused = node.fails(&["label", "node", "n2", "stolen=yes"])?;
    ensure!(
        refused.contains("Forbidden")
            && refused.contains("node \"n1\" is not allowed to modify node \"n2\""),
        "{refused}"
    );

    // With the bootstrap token: a request for a node name in system:masters is not approved.
    let token = kubectl.with_token(TOKEN)?;
    token.ok_stdin(
        &["create", "-f", "-"],
        &csr_manifest(
            "masters",
            &b64(request_pem("system:node:x", "system:masters")?),
            KUBELET_SIGNER,
        ),
    )?;
    // A bad request is refused as invalid and nothing is stored.
    let invalid = token.run(
        &["create", "-f", "-"],
        Some(&csr_manifest(
            "bad",
            &b64("-----BEGIN NOTHING-----\n"),
            KUBELET_SIGNER,
        )),
        &[],
    )?;
    let stderr = String::from_utf8_lossy(&invalid.stderr).to_string();
    ensure!(
        !invalid.status.success()
            && stderr.contains("is invalid")
            && stderr.contains("PEM block type must be CERTIFICATE REQUEST"),
        "{stderr}"
    );
    let missing = kubectl.fails(&["get", "csr", "bad"])?;
    ensure!(missing.contains("NotFound"), "{missing}");
    // Well past the approver's first look, the masters request is still pending.
    std::thread::sleep(Duration::from_secs(3));
    let condition = jsonpath(
        &kubectl,
        &["get", "csr", "masters"],
        "{.status.conditions[*].type}",
    )?;
    ensure!(
        condition.is_empty(),
        "masters request has conditions {condition}"
    );
    ensure!(kubectl.ok(&["get", "csr", "masters"])?.contains("Pending"));
    // The bootstrap token may not approve; an admin denies it with kubectl.
    let approve = token.fails(&["certificate", "approve", "masters"])?;
    ensure!(approve.contains("Forbidden"), "{approve}");
    contains_all(
        &kubectl.ok(&["certificate", "deny", "masters"])?,
        &["certificatesigningrequest.certificates.k8s.io/masters denied"],
    )?;
    ensure!(kubectl.ok(&["get", "csr", "masters"])?.contains("Denied"));
    // A plain client certificate request is left to people: an admin approves it, and the
    // signer issues it.
    kubectl.ok_stdin(
        &["create", "-f", "-"],
        &csr_manifest(
            "manual",
            &b64(request_pem("alice", "devs")?),
            "kubernetes.io/kube-apiserver-client",
        ),
    )?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(kubectl.ok(&["get", "csr", "manual"])?.contains("Pending"));
    kubectl.ok(&["certificate", "approve", "manual"])?;
    until(
        "the manual request is issued",
        Duration::from_secs(30),
        || {
            Ok(kubectl
                .ok(&["get", "csr", "manual"])?
                .contains("Approved,Issued"))
        },
    )?;
    Ok(())
}

fn contains_all(haystack: &str, needles: &[&str]) -> anyhow::Result<()> {
    for needle in needles {
        ensure!(
            haystack.contains(needle),
            "expected {needle:?} in:\n{haystack}"
        );
    }
    Ok(())
}
