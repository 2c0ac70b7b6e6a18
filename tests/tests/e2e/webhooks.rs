//! Admission webhooks served by a test process over TLS: a mutating webhook's JSON patch
//! applied, a validating webhook's refusal and warnings passed on in upstream's words, a
//! webhook that times out, answers garbage or presents a certificate outside its caBundle
//! failing the request under `failurePolicy: Fail` and not under `Ignore`, namespace
//! selectors, and dry runs.

use std::time::Duration;

use anyhow::ensure;
use flotilla_e2e::nodes::Fabric;
use flotilla_e2e::webhook_server::WebhookServer;
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath};
use serde_json::{Value, json};

fn contains(text: &str, wanted: &str) -> anyhow::Result<()> {
    ensure!(text.contains(wanted), "expected {wanted:?} in:\n{text}");
    Ok(())
}

/// The test webhooks: `/mutate` labels every ConfigMap `mutated=yes`; `/validate` refuses
/// ConfigMaps labelled `deny=true`; `/slow` answers after 3 s; `/garbage` answers no JSON.
fn answer(path: &str, review: Value) -> (u16, Vec<u8>) {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let object = &request["object"];
    let respond = |response: Value| {
        let mut response = response;
        response["uid"] = uid.clone();
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
        (200, serde_json::to_vec(&body).unwrap_or_default())
    };
    match path {
        // Deletes have no object to patch: a mutating webhook may only allow or refuse them.
        "/mutate" if request["operation"] == json!("DELETE") => {
            if request["oldObject"]["metadata"]["labels"]["guarded"] == json!("true") {
                return respond(json!({
                    "allowed": false,
                    "status": {"code": 403, "message": "guarded by the mutating webhook"},
                }));
            }
            respond(json!({"allowed": true}))
        }
        "/mutate" => {
            use base64::Engine as _;
            let mut labels = object["metadata"]["labels"].clone();
            if !labels.is_object() {
                labels = json!({});
            }
            labels["mutated"] = json!("yes");
            let patch = json!([{"op": "add", "path": "/metadata/labels", "value": labels}]);
            respond(json!({
                "allowed": true,
                "patchType": "JSONPatch",
                "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
            }))
        }
        "/validate" => {
            let old = &request["oldObject"];
            if request["operation"] == json!("DELETE") {
                if old["metadata"]["labels"]["protected"] == json!("true") && object.is_null() {
                    return respond(json!({
                        "allowed": false,
                        "status": {"code": 403, "message": "protected configmaps may not be deleted"},
                    }));
                }
                respond(json!({"allowed": true}))
            } else if object["metadata"]["labels"]["deny"] == json!("true") {
                respond(json!({
                    "allowed": false,
                    "status": {"code": 403, "message": "configmaps labelled deny are refused"},
                }))
            } else {
                respond(json!({"allowed": true, "warnings": ["checked by the test webhook"]}))
            }
        }
        // Refuses every exec, saying what it was shown (upstream's CONNECT review: the
        // options as the object, the pod's name).
        "/exec" => respond(json!({
            "allowed": false,
            "status": {"code": 403, "message": format!(
                "exec into {} ({}, {}) refused",
                request["name"].as_str().unwrap_or(""),
                object["kind"].as_str().unwrap_or(""),
                object["command"],
            )},
        })),
        "/slow" => {
            std::thread::sleep(Duration::from_secs(3));
            respond(json!({"allowed": true}))
        }
        _ => (200, b"this is not JSON".to_vec()),
    }
}

fn configuration(kind: &str, name: &str, url: &str, ca_bundle: &str, extra: &str) -> String {
    format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata: {{name: {name}}}
webhooks:
- name: {name}.test.flotilla.dev
  clientConfig: {{url: "{url}", caBundle: "{ca_bundle}"}}
  rules: [{{operations: [CREATE, UPDATE, DELETE], apiGroups: [""], apiVersions: [v1], resources: [configmaps]}}]
  sideEffects: None
  admissionReviewVersions: [v1]
  namespaceSelector: {{matchLabels: {{webhooks: "on"}}}}
{extra}"#
    )
}

fn configmap(kubectl: &Kubectl, name: &str, labels: &str) -> anyhow::Result<std::process::Output> {
    kubectl.run(
        &["apply", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: hooked, labels: {{{labels}}}}}\n"
        )),
        &[],
    )
}

#[test]
fn webhooks_mutate_refuse_and_fail_as_upstreams_do() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Webhooks are dialled only inside the node networks: serve on the host's fabric address.
    let fabric = Fabric::start(dir.path())?;
    let server = WebhookServer::start(&fabric.host_ip, answer)?;
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok(&["create", "namespace", "hooked"])?;
    kubectl.ok(&["label", "namespace", "hooked", "webhooks=on"])?;
    kubectl.ok(&["create", "namespace", "plain"])?;
    let ca = server.ca_bundle();

    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "MutatingWebhookConfiguration",
            "labeler",
            &format!("{}/mutate", server.url),
            &ca,
            "",
        ),
    )?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "guard",
            &format!("{}/validate", server.url),
            &ca,
            "",
        ),
    )?;

    // Mutated, allowed, and warned about.
    let created = configmap(&kubectl, "one", "app: web")?;
    ensure!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    contains(
        &String::from_utf8_lossy(&created.stderr),
        "Warning: checked by the test webhook",
    )?;
    ensure!(
        jsonpath(
            &kubectl,
            &["-n", "hooked", "get", "configmap", "one"],
            "{.metadata.labels.mutated}"
        )? == "yes"
    );
    // Outside the selected namespace nothing is called.
    kubectl.ok(&["-n", "plain", "create", "configmap", "untouched"])?;
    ensure!(
        jsonpath(
            &kubectl,
            &["-n", "plain", "get", "configmap", "untouched"],
            "{.metadata.labels}"
        )?
        .is_empty()
    );

    // A webhook's matchConditions skip it for what they exclude.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "conditional",
            &format!("{}/garbage", server.url),
            &ca,
            "  matchConditions:\n  - {name: not-exempt, expression: \"!has(object.metadata.labels) || !('exempt' in object.metadata.labels)\"}\n",
        ),
    )?;
    let exempt = configmap(&kubectl, "exempt", "exempt: \"yes\"")?;
    ensure!(
        exempt.status.success(),
        "{}",
        String::from_utf8_lossy(&exempt.stderr)
    );
    contains(
        &String::from_utf8_lossy(&configmap(&kubectl, "counted", "")?.stderr),
        "received invalid webhook response",
    )?;
    kubectl.ok(&["delete", "validatingwebhookconfiguration", "conditional"])?;

    // Refused in the webhook's words, nothing stored.
    let refused = configmap(&kubectl, "two", "deny: \"true\"")?;
    ensure!(!refused.status.success());
    contains(
        &String::from_utf8_lossy(&refused.stderr),
        r#"admission webhook "guard.test.flotilla.dev" denied the request: configmaps labelled deny are refused"#,
    )?;
    ensure!(
        kubectl
            .run(&["-n", "hooked", "get", "configmap", "two"], None, &[])?
            .status
            .code()
            != Some(0)
    );
    // Deletes are validated too, with the stored object as `oldObject`.
    configmap(&kubectl, "kept", "protected: \"true\"")?;
    let kept = kubectl.run(&["-n", "hooked", "delete", "configmap", "kept"], None, &[])?;
    contains(
        &String::from_utf8_lossy(&kept.stderr),
        r#"admission webhook "guard.test.flotilla.dev" denied the request: protected configmaps may not be deleted"#,
    )?;
    // Mutating webhooks see deletes too (they may refuse them, never change them).
    configmap(&kubectl, "guarded", "guarded: \"true\"")?;
    let guarded = kubectl.run(
        &["-n", "hooked", "delete", "configmap", "guarded"],
        None,
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&guarded.stderr),
        r#"admission webhook "labeler.test.flotilla.dev" denied the request: guarded by the mutating webhook"#,
    )?;
    kubectl.ok(&["-n", "hooked", "delete", "configmap", "one"])?;
    // Connections to pods (CONNECT) are admitted too, before the kubelet is dialled.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: exec-guard}}
webhooks:
- name: exec-guard.test.flotilla.dev
  clientConfig: {{url: "{}/exec", caBundle: "{ca}"}}
  rules: [{{operations: [CONNECT], apiGroups: [""], apiVersions: [v1], resources: [pods/exec]}}]
  sideEffects: None
  admissionReviewVersions: [v1]
  namespaceSelector: {{matchLabels: {{webhooks: "on"}}}}
"#,
            server.url
        ),
    )?;
    kubectl.ok(&[
        "-n",
        "hooked",
        "run",
        "target",
        "--image=busybox",
        "--restart=Never",
    ])?;
    let exec = kubectl.run(
        &["-n", "hooked", "exec", "target", "--", "ls", "/"],
        None,
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&exec.stderr),
        r#"admission webhook "exec-guard.test.flotilla.dev" denied the request: exec into target (PodExecOptions, ["ls","/"]) refused"#,
    )?;
    kubectl.ok(&["delete", "validatingwebhookconfiguration", "exec-guard"])?;

    // A dry run reaches webhooks without side effects.
    let dry = kubectl.run(
        &[
            "-n",
            "hooked",
            "create",
            "configmap",
            "three",
            "--dry-run=server",
            "-o",
            "jsonpath={.metadata.labels.mutated}",
        ],
        None,
        &[],
    )?;
    ensure!(
        String::from_utf8_lossy(&dry.stdout) == "yes",
        "{}",
        String::from_utf8_lossy(&dry.stderr)
    );

    // A webhook that takes longer than its timeout fails the request (failurePolicy Fail).
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "slow",
            &format!("{}/slow", server.url),
            &ca,
            "  timeoutSeconds: 1\n",
        ),
    )?;
    let timed_out = configmap(&kubectl, "four", "")?;
    let text = String::from_utf8_lossy(&timed_out.stderr).into_owned();
    contains(&text, r#"failed calling webhook "slow.test.flotilla.dev""#)?;
    contains(&text, "context deadline exceeded")?;
    kubectl.ok(&["delete", "validatingwebhookconfiguration", "slow"])?;

    // Garbage, and a certificate outside the caBundle, likewise; `Ignore` lets the request by.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "garbage",
            &format!("{}/garbage", server.url),
            &ca,
            "",
        ),
    )?;
    contains(
        &String::from_utf8_lossy(&configmap(&kubectl, "five", "")?.stderr),
        "received invalid webhook response",
    )?;
    kubectl.ok(&["delete", "validatingwebhookconfiguration", "garbage"])?;
    let other_ca = WebhookServer::start(&fabric.host_ip, answer)?.ca_bundle();
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "untrusted",
            &format!("{}/validate", server.url),
            &other_ca,
            "",
        ),
    )?;
    let untrusted = String::from_utf8_lossy(&configmap(&kubectl, "six", "")?.stderr).into_owned();
    contains(
        &untrusted,
        r#"failed calling webhook "untrusted.test.flotilla.dev""#,
    )?;
    contains(&untrusted, "certificate")?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "untrusted",
            &format!("{}/validate", server.url),
            &other_ca,
            "  failurePolicy: Ignore\n",
        ),
    )?;
    let ignored = configmap(&kubectl, "six", "")?;
    ensure!(
        ignored.status.success(),
        "{}",
        String::from_utf8_lossy(&ignored.stderr)
    );

    // A webhook reached through a Service: resolved through its EndpointSlice (here the
    // host's fabric address) and verified as `name.namespace.svc`.
    let service = WebhookServer::start_named(&fabric.host_ip, &["guard.hooks.svc"], answer)?;
    kubectl.ok(&["create", "namespace", "hooks"])?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"
apiVersion: v1
kind: Service
metadata: {{name: guard, namespace: hooks}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: guard-1, namespace: hooks, labels: {{kubernetes.io/service-name: guard}}}}
addressType: IPv4
ports: [{{name: https, port: {port}, protocol: TCP}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
"#,
            port = service.port(),
            ip = fabric.host_ip,
        ),
    )?;
    kubectl.ok(&[
        "delete",
        "validatingwebhookconfiguration",
        "guard",
        "untrusted",
    ])?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &configuration(
            "ValidatingWebhookConfiguration",
            "guard",
            "unused",
            &service.ca_bundle(),
            "",
        )
        .replace(
            "clientConfig: {url: \"unused\",",
            "clientConfig: {service: {namespace: hooks, name: guard, path: /validate},",
        ),
    )?;
    std::thread::sleep(Duration::from_millis(1100));
    let through_service = configmap(&kubectl, "seven", "deny: \"true\"")?;
    contains(
        &String::from_utf8_lossy(&through_service.stderr),
        r#"admission webhook "guard.test.flotilla.dev" denied the request: configmaps labelled deny are refused"#,
    )?;

    // matchPolicy Equivalent: a rule for a custom resource's v1 also catches requests made
    // through its v1beta1; Exact does not.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: gadgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: gadgets, kind: Gadget}
  versions:
  - {name: v1beta1, served: true, storage: false, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
  - {name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}
"#,
    )?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/gadgets.example.com",
    ])?;
    let gadget_hook = |policy: &str| {
        format!(
            "apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {{name: gadgets}}\nwebhooks:\n- name: gadgets.test.flotilla.dev\n  clientConfig: {{url: \"{}/validate\", caBundle: \"{ca}\"}}\n  rules: [{{operations: [CREATE], apiGroups: [example.com], apiVersions: [v1], resources: [gadgets]}}]\n  matchPolicy: {policy}\n  sideEffects: None\n  admissionReviewVersions: [v1]\n",
            server.url
        )
    };
    let gadget = |name: &str| {
        format!(
            "apiVersion: example.com/v1beta1\nkind: Gadget\nmetadata: {{name: {name}, namespace: hooked, labels: {{deny: \"true\"}}}}\n"
        )
    };
    kubectl.ok_stdin(&["apply", "-f", "-"], &gadget_hook("Equivalent"))?;
    std::thread::sleep(Duration::from_millis(1100));
    let equivalent = kubectl.run(&["apply", "-f", "-"], Some(&gadget("g1")), &[])?;
    contains(
        &String::from_utf8_lossy(&equivalent.stderr),
        r#"admission webhook "gadgets.test.flotilla.dev" denied the request"#,
    )?;
    kubectl.ok_stdin(&["apply", "-f", "-"], &gadget_hook("Exact"))?;
    std::thread::sleep(Duration::from_millis(1100));
    let exact = kubectl.run(&["apply", "-f", "-"], Some(&gadget("g2")), &[])?;
    ensure!(
        exact.status.success(),
        "{}",
        String::from_utf8_lossy(&exact.stderr)
    );

    // A configuration that cannot be called is refused when written.
    let bad = kubectl.run(
        &["apply", "-f", "-"],
        Some(&configuration(
            "ValidatingWebhookConfiguration",
            "plain-http",
            "http://10.0.0.1/x",
            &ca,
            "",
        )),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&bad.stderr),
        "'https' is the only allowed URL scheme",
    )?;
    Ok(())
}

const REPLICA_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: max-replicas}
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [deployments]}
  variables:
  - {name: limit, expression: "int(params.data.maxReplicas)"}
  validations:
  - expression: object.spec.replicas <= variables.limit
    messageExpression: "'replicas ' + string(object.spec.replicas) + ' exceed ' + string(variables.limit)"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: max-replicas-strict}
spec:
  policyName: max-replicas
  validationActions: [Deny]
  paramRef: {name: replica-limit, namespace: default}
  matchResources:
    namespaceSelector: {matchLabels: {policy: strict}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: max-replicas-warn}
spec:
  policyName: max-replicas
  validationActions: [Warn]
  paramRef: {name: replica-limit, namespace: default}
  matchResources:
    namespaceSelector: {matchLabels: {policy: lenient}}
"#;

#[test]
fn a_validating_admission_policy_denies_and_warns_by_binding() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok(&[
        "create",
        "configmap",
        "replica-limit",
        "--from-literal=maxReplicas=3",
    ])?;
    for (namespace, level) in [("strict", "strict"), ("lenient", "lenient")] {
        kubectl.ok(&["create", "namespace", namespace])?;
        kubectl.ok(&["label", "namespace", namespace, &format!("policy={level}")])?;
    }
    kubectl.ok_stdin(&["apply", "-f", "-"], REPLICA_POLICY)?;
    // The policy is read through the admission lookups (at most 1 s old).
    std::thread::sleep(Duration::from_millis(1100));

    let denied = kubectl.run(
        &[
            "-n",
            "strict",
            "create",
            "deployment",
            "big",
            "--image=nginx",
            "--replicas=5",
        ],
        None,
        &[],
    )?;
    ensure!(
        !denied.status.success(),
        "a Deployment over the limit was admitted"
    );
    contains(
        &String::from_utf8_lossy(&denied.stderr),
        r#"deployments.apps "big" is forbidden: ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-strict' denied request: replicas 5 exceed 3"#,
    )?;
    kubectl.ok(&[
        "-n",
        "strict",
        "create",
        "deployment",
        "small",
        "--image=nginx",
        "--replicas=2",
    ])?;
    let warned = kubectl.run(
        &[
            "-n",
            "lenient",
            "create",
            "deployment",
            "big",
            "--image=nginx",
            "--replicas=5",
        ],
        None,
        &[],
    )?;
    ensure!(
        warned.status.success(),
        "{}",
        String::from_utf8_lossy(&warned.stderr)
    );
    contains(
        &String::from_utf8_lossy(&warned.stderr),
        "Validation failed for ValidatingAdmissionPolicy 'max-replicas' with binding 'max-replicas-warn': replicas 5 exceed 3",
    )?;
    // Changing the replicas past the limit is an update the policy sees too.
    let patched = kubectl.run(
        &[
            "-n",
            "strict",
            "patch",
            "deployment",
            "small",
            "-p",
            r#"{"spec":{"replicas":4}}"#,
        ],
        None,
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&patched.stderr),
        "replicas 4 exceed 3",
    )?;

    // A policy whose expression does not compile is refused with it.
    let broken = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingAdmissionPolicy\nmetadata: {name: broken}\nspec:\n  matchConstraints:\n    resourceRules: [{apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]\n  validations: [{expression: 'object.metadata.name ==='}]\n"),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&broken.stderr),
        "spec.validations[0].expression",
    )?;
    contains(
        &String::from_utf8_lossy(&broken.stderr),
        "compilation failed",
    )?;
    // A binding whose parameter object is missing denies (parameterNotFoundAction: Deny).
    kubectl.ok(&["delete", "configmap", "replica-limit"])?;
    std::thread::sleep(Duration::from_millis(1100));
    let missing = kubectl.run(
        &[
            "-n",
            "strict",
            "create",
            "deployment",
            "other",
            "--image=nginx",
        ],
        None,
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&missing.stderr),
        "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction",
    )?;
    Ok(())
}

const AUTHORIZER_POLICY: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: secret-listers-only}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
    namespaceSelector: {matchLabels: {authz: checked}}
  validations:
  - expression: "authorizer.group('').resource('secrets').namespace(request.namespace).check('list').allowed()"
    messageExpression: "request.userInfo.username + ' may not list secrets in ' + request.namespace"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: secret-listers-only}
spec:
  policyName: secret-listers-only
  validationActions: [Deny]
"#;

/// A policy's `authorizer` checks are decided by the cluster's RBAC as the requesting user:
/// who may create ConfigMaps but not list Secrets is denied, who may do both (and the admin)
/// is admitted.
#[test]
fn a_validating_admission_policy_asks_the_authorizer() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok(&["create", "namespace", "authz"])?;
    kubectl.ok(&["label", "namespace", "authz", "authz=checked"])?;
    let in_authz = |args: &[&str]| {
        let mut all = vec!["-n", "authz"];
        all.extend_from_slice(args);
        kubectl.ok(&all)
    };
    in_authz(&[
        "create",
        "role",
        "configmap-writer",
        "--verb=create",
        "--resource=configmaps",
    ])?;
    in_authz(&[
        "create",
        "rolebinding",
        "configmap-writers",
        "--role=configmap-writer",
        "--user=carol",
        "--user=dave",
    ])?;
    in_authz(&[
        "create",
        "role",
        "secret-lister",
        "--verb=list",
        "--resource=secrets",
    ])?;
    in_authz(&[
        "create",
        "rolebinding",
        "secret-listers",
        "--role=secret-lister",
        "--user=dave",
    ])?;
    kubectl.ok_stdin(&["apply", "-f", "-"], AUTHORIZER_POLICY)?;
    // The policy is read through the admission lookups (at most 1 s old).
    std::thread::sleep(Duration::from_millis(1100));

    let denied = kubectl.run(
        &[
            "-n",
            "authz",
            "create",
            "configmap",
            "by-carol",
            "--as=carol",
        ],
        None,
        &[],
    )?;
    ensure!(
        !denied.status.success(),
        "a user who may not list secrets was admitted"
    );
    contains(
        &String::from_utf8_lossy(&denied.stderr),
        r#"configmaps "by-carol" is forbidden: ValidatingAdmissionPolicy 'secret-listers-only' with binding 'secret-listers-only' denied request: carol may not list secrets in authz"#,
    )?;
    in_authz(&["create", "configmap", "by-dave", "--as=dave"])?;
    in_authz(&["create", "configmap", "by-admin"])?;
    Ok(())
}
