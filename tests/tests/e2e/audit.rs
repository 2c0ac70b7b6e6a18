//! Audit logging seen from outside: `flotilla up` with upstream's `--audit-policy-file` and
//! `--audit-log-path`, driven by stock kubectl, and the log read back as `audit.k8s.io/v1`
//! events — levels by the policy's rules, bodies at `Request`/`RequestResponse`, Secrets
//! never beyond `Metadata`, the authorizer's decision, PodSecurity's and a
//! ValidatingAdmissionPolicy's audit annotations, impersonation, and a cluster's own policy
//! from the management API adding to the operator's.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::webhook_server::WebhookServer;
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, until};
use serde_json::Value;

/// The operator's policy: the `audited` namespace's ConfigMaps and Secrets with both bodies,
/// its other requests as metadata, nothing else.
const OPERATOR_POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: RequestResponse
    resources: [{group: "", resources: [configmaps, secrets]}]
    namespaces: [audited]
  - level: Metadata
    namespaces: [audited]
  - level: None
"#;

/// A cluster's own policy: its `tenant-audited` namespace's requests with their bodies.
const CLUSTER_POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: Request
    namespaces: [tenant-audited]
    omitStages: [RequestReceived]
"#;

/// A policy whose every binding only audits: ConfigMaps named `flagged…` fail it.
const AUDIT_ONLY_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: no-flagged}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  validations:
  - expression: "!object.metadata.name.startsWith('flagged')"
    message: flagged ConfigMaps are noted
  auditAnnotations:
  - key: name
    valueExpression: "'created ' + object.metadata.name"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-flagged}
spec:
  policyName: no-flagged
  validationActions: [Audit]
"#;

const PRIVILEGED_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: root, namespace: audited}
spec:
  containers:
  - name: c
    image: busybox
    securityContext: {privileged: true}
"#;

/// `flotilla up` recording by [`OPERATOR_POLICY`] (written into `dir`) to `log`.
fn up_audited(dir: &Path, log: &Path) -> anyhow::Result<Flotilla> {
    let policy = dir.join("policy.yaml");
    std::fs::write(&policy, OPERATOR_POLICY)?;
    Flotilla::up_with(
        Backend::Embedded,
        &[
            "--audit-policy-file",
            policy.to_str().context("path")?,
            "--audit-log-path",
            log.to_str().context("path")?,
        ],
    )
}

/// Every event in the log, once `wanted` says the ones looked for are there.
fn events_until(
    log: &Path,
    what: &str,
    wanted: impl Fn(&[Value]) -> bool,
) -> anyhow::Result<Vec<Value>> {
    let mut events = Vec::new();
    until(what, Duration::from_secs(20), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        events = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<Vec<Value>, _>>()
            .context("every line of the audit log is one JSON event")?;
        Ok(wanted(&events))
    })?;
    Ok(events)
}

/// The `ResponseComplete` event of `verb` on `resource` named `name`.
fn complete<'a>(events: &'a [Value], verb: &str, resource: &str, name: &str) -> Option<&'a Value> {
    events.iter().find(|e| {
        e["stage"] == "ResponseComplete"
            && e["verb"] == verb
            && e["objectRef"]["resource"] == resource
            && e["objectRef"]["name"] == name
    })
}

#[test]
fn audit_log_records_what_the_policies_ask_and_never_a_secret() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("logs/audit.log");
    let flotilla = up_audited(dir.path(), &log)?;
    let kubectl = flotilla.kubectl();
    kubectl.ok(&["create", "namespace", "audited"])?;
    kubectl.ok(&[
        "label",
        "namespace",
        "audited",
        "pod-security.kubernetes.io/audit=baseline",
    ])?;
    kubectl.ok_stdin(&["apply", "-f", "-"], AUDIT_ONLY_POLICY)?;
    kubectl.ok(&[
        "-n",
        "audited",
        "create",
        "configmap",
        "settings",
        "--from-literal=color=blue",
    ])?;
    kubectl.ok(&[
        "-n",
        "audited",
        "create",
        "secret",
        "generic",
        "db",
        "--from-literal=password=hunter2",
    ])?;
    kubectl.ok(&["-n", "audited", "get", "secret", "db", "-o", "yaml"])?;
    kubectl
        .ok(&["-n", "audited", "get", "configmaps", "--as=mallory"])
        .ok();
    kubectl.ok_stdin(&["apply", "-f", "-"], PRIVILEGED_POD)?;
    // The binding's policy is read through a short cache: retry until it has audited one.
    until(
        "the audit-only policy is in force",
        Duration::from_secs(20),
        || {
            let name = format!("flagged-{}", rand_suffix());
            let _ = kubectl.run(&["-n", "audited", "create", "configmap", &name], None, &[])?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(text.contains("validation.policy.admission.k8s.io/validation_failure"))
        },
    )?;
    kubectl.ok(&["create", "configmap", "elsewhere", "--from-literal=a=b"])?;
    let events = events_until(&log, "the requests' events", |events| {
        complete(events, "create", "pods", "root").is_some()
            && events
                .iter()
                .any(|e| e["impersonatedUser"]["username"] == "mallory")
    })?;

    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&log)?.permissions());
    ensure!(
        mode & 0o777 == 0o600,
        "the audit log is mode {:o}",
        mode & 0o777
    );
    ensure!(
        events
            .iter()
            .all(|e| e["apiVersion"] == "audit.k8s.io/v1" && e["kind"] == "Event"),
        "every line is an audit.k8s.io/v1 Event"
    );
    ensure!(
        events.iter().all(|e| e["stage"] != "RequestReceived"),
        "the policy omits RequestReceived"
    );
    ensure!(
        events.iter().all(|e| e["objectRef"]["name"] != "elsewhere"),
        "requests the policy gives None are not recorded"
    );
    let configmap = complete(&events, "create", "configmaps", "settings").with_context(|| {
        format!(
            "the ConfigMap's create is recorded, in:\n{}",
            events
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        )
    })?;
    ensure!(configmap["level"] == "RequestResponse", "{configmap}");
    ensure!(
        configmap["requestObject"]["data"]["color"] == "blue",
        "{configmap}"
    );
    ensure!(
        configmap["responseObject"]["metadata"]["uid"].is_string(),
        "{configmap}"
    );
    ensure!(configmap["responseStatus"]["code"] == 201, "{configmap}");
    ensure!(
        configmap["annotations"]["authorization.k8s.io/decision"] == "allow",
        "{configmap}"
    );
    ensure!(
        configmap["annotations"]["flotilla.dev/cluster"].is_string(),
        "{configmap}"
    );
    ensure!(
        configmap["auditID"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    // The rule says RequestResponse for Secrets; they are kept to Metadata all the same.
    let secret = complete(&events, "create", "secrets", "db").context("the Secret's create")?;
    ensure!(secret["level"] == "Metadata", "{secret}");
    ensure!(secret.get("requestObject").is_none() && secret.get("responseObject").is_none());
    let log_text = std::fs::read_to_string(&log)?;
    ensure!(
        !log_text.contains("hunter2"),
        "the Secret's value is in the audit log"
    );
    ensure!(
        !log_text.contains("aHVudGVyMg"),
        "the Secret's encoded value is in the audit log"
    );
    // The impersonated request: who asked, whom for, and the authorizer's refusal.
    let refused = events
        .iter()
        .find(|e| {
            e["impersonatedUser"]["username"] == "mallory" && e["stage"] == "ResponseComplete"
        })
        .context("the impersonated list")?;
    ensure!(refused["responseStatus"]["code"] == 403, "{refused}");
    ensure!(
        refused["responseStatus"]["reason"] == "Forbidden",
        "{refused}"
    );
    ensure!(
        refused["annotations"]["authorization.k8s.io/decision"] == "forbid",
        "{refused}"
    );
    // PodSecurity's annotations: the enforced policy and what `audit=baseline` would refuse.
    let pod = complete(&events, "create", "pods", "root").context("the pod's create")?;
    ensure!(
        pod["annotations"]["pod-security.kubernetes.io/enforce-policy"] == "privileged:latest",
        "{pod}"
    );
    let violations = pod["annotations"]["pod-security.kubernetes.io/audit-violations"]
        .as_str()
        .context("the audit-violations annotation")?;
    ensure!(
        violations.starts_with("would violate PodSecurity \"baseline:latest\": privileged"),
        "{violations}"
    );
    // The audit-only binding's failure and the policy's own annotation.
    let flagged = events
        .iter()
        .find(|e| {
            e["annotations"]
                .get("validation.policy.admission.k8s.io/validation_failure")
                .is_some()
        })
        .context("the audit-only failure")?;
    let failure: Value = serde_json::from_str(
        flagged["annotations"]["validation.policy.admission.k8s.io/validation_failure"]
            .as_str()
            .context("a string")?,
    )?;
    ensure!(failure[0]["policy"] == "no-flagged", "{failure}");
    ensure!(failure[0]["validationActions"][0] == "Audit", "{failure}");
    ensure!(
        flagged["annotations"]["no-flagged/name"]
            .as_str()
            .is_some_and(|name| name.starts_with("created flagged-")),
        "{flagged}"
    );
    ensure!(
        flagged["responseStatus"]["code"] == 201,
        "audit-only does not deny: {flagged}"
    );

    // A cluster's own policy, through the management API, adds to the operator's.
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    let cluster_policy = dir.path().join("cluster-policy.yaml");
    std::fs::write(&cluster_policy, CLUSTER_POLICY)?;
    let bad_policy = dir.path().join("bad-policy.yaml");
    std::fs::write(
        &bad_policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/a*b]}]\n",
    )?;
    let refused = cli.fails(&[
        "cluster",
        "update",
        "demo",
        "--audit-policy-file",
        bad_policy.to_str().context("path")?,
    ])?;
    ensure!(
        refused.contains("auditPolicy.rules[0].nonResourceURLs[0]"),
        "the refusal names the field: {refused}"
    );
    cli.ok(&[
        "cluster",
        "update",
        "demo",
        "--audit-policy-file",
        cluster_policy.to_str().context("path")?,
        "--wait",
    ])?;
    kubectl.ok(&["create", "namespace", "tenant-audited"])?;
    until(
        "the cluster's policy is in force",
        Duration::from_secs(20),
        || {
            let name = format!("t-{}", rand_suffix());
            kubectl.ok(&[
                "-n",
                "tenant-audited",
                "create",
                "configmap",
                &name,
                "--from-literal=k=v",
            ])?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(text.contains(&format!("\"name\":\"{name}\"")))
        },
    )?;
    let events = events_until(&log, "the tenant's events", |events| {
        events
            .iter()
            .any(|e| e["objectRef"]["namespace"] == "tenant-audited")
    })?;
    let tenant = events
        .iter()
        .find(|e| {
            e["objectRef"]["namespace"] == "tenant-audited"
                && e["verb"] == "create"
                && e["objectRef"]["resource"] == "configmaps"
                && e["objectRef"]["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("t-"))
        })
        .context("a create in the tenant's namespace")?;
    ensure!(tenant["level"] == "Request", "{tenant}");
    ensure!(tenant["requestObject"]["data"]["k"] == "v", "{tenant}");
    ensure!(tenant.get("responseObject").is_none(), "{tenant}");
    Ok(())
}

#[test]
fn audit_events_reach_a_webhook_in_batches_and_a_refused_batch_is_sent_again() -> anyhow::Result<()>
{
    use std::sync::{Arc, Mutex};
    let received: Arc<Mutex<Vec<(String, Value)>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let receiver = {
        let received = received.clone();
        let calls = calls.clone();
        WebhookServer::start("127.0.0.1", move |path, body| {
            // The first batch is refused: the backend must send it again.
            if calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return (503, b"{}".to_vec());
            }
            if let Ok(mut received) = received.lock() {
                received.push((path.to_string(), body));
            }
            (200, b"{}".to_vec())
        })?
    };
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("policy.yaml");
    std::fs::write(&policy, OPERATOR_POLICY)?;
    let kubeconfig = dir.path().join("receiver.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: receiver\n  cluster:\n    server: {}/audit/events\n    certificate-authority-data: {}\nusers:\n- name: flotilla\n  user: {{}}\ncontexts:\n- name: default\n  context: {{cluster: receiver, user: flotilla}}\ncurrent-context: default\n",
            receiver.url,
            receiver.ca_bundle()
        ),
    )?;
    let flotilla = Flotilla::up_with(
        Backend::Embedded,
        &[
            "--audit-policy-file",
            policy.to_str().context("path")?,
            "--audit-webhook-config-file",
            kubeconfig.to_str().context("path")?,
            "--audit-webhook-batch-max-wait",
            "200ms",
            "--audit-webhook-initial-backoff",
            "100ms",
        ],
    )?;
    let kubectl = flotilla.kubectl();
    kubectl.ok(&["create", "namespace", "audited"])?;
    kubectl.ok(&[
        "-n",
        "audited",
        "create",
        "configmap",
        "sent",
        "--from-literal=k=v",
    ])?;
    until(
        "the receiver has the ConfigMap's event",
        Duration::from_secs(20),
        || {
            let received = received.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            Ok(received.iter().any(|(_, list)| {
                list["items"]
                    .as_array()
                    .is_some_and(|items| complete(items, "create", "configmaps", "sent").is_some())
            }))
        },
    )?;
    let received = received.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    for (path, list) in received.iter() {
        ensure!(path == "/audit/events", "posted to {path}");
        ensure!(list["kind"] == "EventList" && list["apiVersion"] == "audit.k8s.io/v1");
    }
    ensure!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    Ok(())
}

/// A mutating webhook that annotates every ConfigMap `stamped: yes`.
fn stamp(_path: &str, review: Value) -> (u16, Vec<u8>) {
    use base64::Engine as _;
    let patch = serde_json::json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"stamped": "yes"}}
    ]);
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": review["request"]["uid"],
            "allowed": true,
            "patchType": "JSONPatch",
            "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            "auditAnnotations": {"stamp": "applied"},
        },
    });
    (200, serde_json::to_vec(&body).unwrap_or_default())
}

#[test]
fn webhook_calls_are_recorded_as_upstream_annotates_them() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Webhooks are dialled only inside the node networks: serve on the fabric's address.
    let fabric = flotilla_e2e::nodes::Fabric::start(dir.path())?;
    let server = WebhookServer::start(&fabric.host_ip, stamp)?;
    let log = dir.path().join("audit.log");
    let flotilla = up_audited(dir.path(), &log)?;
    let kubectl = flotilla.kubectl();
    kubectl.ok(&["create", "namespace", "audited"])?;
    let rules = "rules: [{operations: [CREATE], apiGroups: [\"\"], apiVersions: [v1], resources: [configmaps]}]";
    let select = "namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: audited}}";
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {{name: stamper}}\nwebhooks:\n- name: stamp.test.flotilla.dev\n  clientConfig: {{url: \"{}/stamp\", caBundle: \"{}\"}}\n  {rules}\n  {select}\n  sideEffects: None\n  admissionReviewVersions: [v1]\n---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: absent}}\nwebhooks:\n- name: absent.test.flotilla.dev\n  clientConfig: {{url: \"https://{}:1/nothing\", caBundle: \"{}\"}}\n  {rules}\n  {select}\n  failurePolicy: Ignore\n  timeoutSeconds: 2\n  sideEffects: None\n  admissionReviewVersions: [v1]\n",
            server.url,
            server.ca_bundle(),
            fabric.host_ip,
            server.ca_bundle()
        ),
    )?;
    until(
        "the webhooks stamp a ConfigMap",
        Duration::from_secs(20),
        || {
            let name = format!("w-{}", rand_suffix());
            kubectl.ok(&["-n", "audited", "create", "configmap", &name])?;
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            Ok(text.contains(&format!("\"name\":\"{name}\"")) && text.contains("failed-open."))
        },
    )?;
    let events = events_until(&log, "the stamped create", |events| {
        events.iter().any(|e| {
            e["stage"] == "ResponseComplete"
                && e["annotations"]
                    .get("failed-open.validating.webhook.admission.k8s.io/round_0_index_0")
                    .is_some()
        })
    })?;
    let stamped = events
        .iter()
        .find(|e| {
            e["stage"] == "ResponseComplete"
                && e["annotations"]
                    .get("failed-open.validating.webhook.admission.k8s.io/round_0_index_0")
                    .is_some()
        })
        .context("a create both webhooks saw")?;
    let annotations = &stamped["annotations"];
    let mutation: Value = serde_json::from_str(
        annotations["mutation.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .context("the mutation annotation")?,
    )?;
    ensure!(
        mutation
            == serde_json::json!({"configuration": "stamper", "webhook": "stamp.test.flotilla.dev", "mutated": true}),
        "{mutation}"
    );
    let patch: Value = serde_json::from_str(
        annotations["patch.webhook.admission.k8s.io/round_0_index_0"]
            .as_str()
            .context("the patch annotation (the level is RequestResponse)")?,
    )?;
    ensure!(
        patch["patchType"] == "JSONPatch" && patch["patch"][0]["op"] == "add",
        "{patch}"
    );
    ensure!(
        annotations["failed-open.validating.webhook.admission.k8s.io/round_0_index_0"]
            == "absent.test.flotilla.dev",
        "{annotations}"
    );
    ensure!(
        annotations["stamp.test.flotilla.dev/stamp"] == "applied",
        "{annotations}"
    );
    ensure!(stamped["responseObject"]["metadata"]["annotations"]["stamped"] == "yes");
    Ok(())
}

#[test]
fn a_policy_that_cannot_be_used_stops_up_with_one_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]\n",
    )?;
    let output = std::process::Command::new(flotilla_e2e::flotilla_bin()?)
        .args([
            "up",
            "--nodes",
            "0",
            "--data-dir",
            dir.path().join("data").to_str().context("path")?,
            "--listen",
            &format!("127.0.0.1:{}", flotilla_e2e::free_port()?),
            "--audit-policy-file",
            policy.to_str().context("path")?,
            "--audit-log-path",
            dir.path().join("audit.log").to_str().context("path")?,
        ])
        .output()?;
    ensure!(
        !output.status.success(),
        "up started with an unserved policy version"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr.contains("--audit-policy-file") && stderr.contains("not served"),
        "{stderr}"
    );
    Ok(())
}

fn rand_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{nanos:x}")
}
