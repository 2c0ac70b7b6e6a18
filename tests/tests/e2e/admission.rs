//! Upstream's default admission plugins seen through stock kubectl: ResourceQuota refusing
//! the n+1th object with upstream's message, and 20 concurrent creates against room for 10
//! storing exactly 10; PodSecurity's `enforce` refusing and `warn` warning; a claim getting
//! the default StorageClass and the pvc-protection finalizer, and still going when deleted;
//! an Ingress its default class; LimitRanger defaults; CertificateSubjectRestriction;
//! `kubectl debug` and PodSecurity on ephemeral containers.

use std::time::Duration;

use anyhow::ensure;
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath, until};

/// A pod that says everything `restricted` asks, in namespace `locked`.
const RESTRICTED_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: locked}
spec:
  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: c
    image: nginx
    securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
"#;

fn contains(text: &str, wanted: &str) -> anyhow::Result<()> {
    ensure!(text.contains(wanted), "expected {wanted:?} in:\n{text}");
    Ok(())
}

/// A namespace with a quota of `hard`, once the quota controller has counted what is in it
/// (admission refuses creates against a quota whose usage is not yet known, as upstream).
fn namespace_with_quota(kubectl: &Kubectl, namespace: &str, hard: &str) -> anyhow::Result<()> {
    kubectl.ok(&["create", "namespace", namespace])?;
    // The root CA ConfigMap is counted too; wait for it so the counts below are exact.
    until("the root CA ConfigMap", Duration::from_secs(30), || {
        Ok(kubectl
            .run(
                &["-n", namespace, "get", "configmap", "kube-root-ca.crt"],
                None,
                &[],
            )?
            .status
            .success())
    })?;
    kubectl.ok(&[
        "-n",
        namespace,
        "create",
        "quota",
        "q",
        &format!("--hard={hard}"),
    ])?;
    until(
        "the quota's usage is counted",
        Duration::from_secs(30),
        || {
            Ok(!jsonpath(
                kubectl,
                &["-n", namespace, "get", "quota", "q"],
                "{.status.used}",
            )?
            .is_empty())
        },
    )
}

#[test]
fn quota_refuses_the_object_past_its_limit_even_under_concurrent_creates() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();

    namespace_with_quota(&kubectl, "team", "pods=1,configmaps=2")?;
    let run_pod = |name: &str| {
        vec![
            "-n",
            "team",
            "run",
            name,
            "--image=nginx",
            "--restart=Never",
        ]
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    let args = run_pod("p1");
    kubectl.ok(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    let args = run_pod("p2");
    let refused = kubectl.fails(&args.iter().map(String::as_str).collect::<Vec<_>>())?;
    contains(
        &refused,
        "Error from server (Forbidden): pods \"p2\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=1, limited: pods=1",
    )?;
    // kube-root-ca.crt is one of the two ConfigMaps; a dry run checks but does not charge.
    kubectl.ok(&[
        "-n",
        "team",
        "create",
        "configmap",
        "dry",
        "--dry-run=server",
    ])?;
    kubectl.ok(&["-n", "team", "create", "configmap", "c1"])?;
    let refused = kubectl.fails(&["-n", "team", "create", "configmap", "c2"])?;
    contains(
        &refused,
        "configmaps \"c2\" is forbidden: exceeded quota: q, requested: configmaps=1, used: configmaps=2, limited: configmaps=2",
    )?;
    let used = jsonpath(
        &kubectl,
        &["-n", "team", "get", "quota", "q"],
        "{.status.used.configmaps} {.status.used.pods}",
    )?;
    ensure!(used == "2 1", "usage after the refusals: {used}");

    // An update is charged what it adds: a Service turned into a load balancer.
    namespace_with_quota(&kubectl, "edge", "services.loadbalancers=0")?;
    kubectl.ok(&[
        "-n",
        "edge",
        "create",
        "service",
        "clusterip",
        "web",
        "--tcp=80:80",
    ])?;
    let refused = kubectl.fails(&[
        "-n",
        "edge",
        "patch",
        "service",
        "web",
        "-p",
        r#"{"spec":{"type":"LoadBalancer"}}"#,
    ])?;
    contains(
        &refused,
        "services \"web\" is forbidden: exceeded quota: q, requested: services.loadbalancers=1, used: services.loadbalancers=0, limited: services.loadbalancers=0",
    )?;

    // Room for ten more ConfigMaps, twenty writers at once: exactly ten are stored.
    namespace_with_quota(&kubectl, "race", "configmaps=11")?;
    let outcomes: Vec<bool> = std::thread::scope(|scope| {
        let writers: Vec<_> = (0..20)
            .map(|i| {
                let kubectl = &kubectl;
                scope.spawn(move || {
                    let name = format!("c{i}");
                    kubectl
                        .run(&["-n", "race", "create", "configmap", &name], None, &[])
                        .map(|out| out.status.success())
                        .unwrap_or(false)
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().unwrap_or(false))
            .collect()
    });
    let created = outcomes.iter().filter(|ok| **ok).count();
    ensure!(
        created == 10,
        "{created} of 20 concurrent creates passed a quota with room for 10"
    );
    let stored = kubectl
        .ok(&["-n", "race", "get", "configmaps", "-o", "name"])?
        .lines()
        .count();
    ensure!(
        stored == 11,
        "{stored} ConfigMaps stored (10 created and kube-root-ca.crt expected)"
    );
    // The controller's recount agrees with what admission charged.
    std::thread::sleep(Duration::from_secs(3));
    let used = jsonpath(
        &kubectl,
        &["-n", "race", "get", "quota", "q"],
        "{.status.used.configmaps}",
    )?;
    ensure!(used == "11", "the recount says {used}");
    Ok(())
}

#[test]
fn pod_security_enforces_and_warns_by_namespace_label() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();

    kubectl.ok(&["create", "namespace", "locked"])?;
    kubectl.ok(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    let refused = kubectl.fails(&[
        "-n",
        "locked",
        "run",
        "root",
        "--image=nginx",
        "--privileged",
    ])?;
    contains(
        &refused,
        "pods \"root\" is forbidden: violates PodSecurity \"restricted:latest\": privileged (container \"root\" must not set securityContext.privileged=true)",
    )?;
    contains(&refused, "allowPrivilegeEscalation != false")?;

    kubectl.ok(&["create", "namespace", "watched"])?;
    kubectl.ok(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/warn=baseline",
    ])?;
    let out = kubectl.run(
        &[
            "-n",
            "watched",
            "run",
            "root",
            "--image=nginx",
            "--privileged",
        ],
        None,
        &[],
    )?;
    ensure!(
        out.status.success(),
        "warn mode refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    contains(
        &String::from_utf8_lossy(&out.stderr),
        "Warning: would violate PodSecurity \"baseline:latest\": privileged (container \"root\" must not set securityContext.privileged=true)",
    )?;
    // An unprivileged pod passes `restricted` when it says everything restricted asks.
    kubectl.ok_stdin(&["apply", "-f", "-"], &RESTRICTED_POD.replace("NAME", "ok"))?;

    // Enforcing a level on a namespace with pods that break it warns, naming them; the pods stay.
    for name in ["root-a", "root-b"] {
        kubectl.ok(&[
            "-n",
            "watched",
            "run",
            name,
            "--image=nginx",
            "--privileged",
        ])?;
    }
    let out = kubectl.run(
        &[
            "label",
            "namespace",
            "watched",
            "pod-security.kubernetes.io/enforce=baseline",
        ],
        None,
        &[],
    )?;
    ensure!(
        out.status.success(),
        "label: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    contains(
        &stderr,
        "Warning: existing pods in namespace \"watched\" violate the new PodSecurity enforce level \"baseline:latest\"",
    )?;
    contains(&stderr, "Warning: root (and 2 other pods): privileged")?;
    let refused = kubectl.fails(&[
        "label",
        "namespace",
        "watched",
        "--overwrite",
        "pod-security.kubernetes.io/enforce=strict",
    ])?;
    contains(
        &refused,
        "namespaces \"watched\" is invalid: metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: \"strict\"",
    )?;
    Ok(())
}

#[test]
fn claims_get_the_default_class_and_the_protection_finalizer() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let manifests = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: example.com/none
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: classless, namespace: default}
spec:
  storageClassName: ""
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], manifests)?;
    let data = jsonpath(
        &kubectl,
        &["get", "pvc", "data"],
        "{.spec.storageClassName} {.metadata.finalizers}",
    )?;
    ensure!(
        data == "standard [\"kubernetes.io/pvc-protection\"]",
        "the claim: {data}"
    );
    let classless = jsonpath(
        &kubectl,
        &["get", "pvc", "classless"],
        "{.spec.storageClassName}",
    )?;
    ensure!(
        classless.is_empty(),
        "an explicit \"\" class was replaced by {classless}"
    );
    // Growing a claim needs it Bound and its class to allow expansion.
    let refused = kubectl.fails(&[
        "patch",
        "pvc",
        "data",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ])?;
    contains(
        &refused,
        "persistentvolumeclaims \"data\" is forbidden: Only bound persistent volume claims can be expanded",
    )?;
    // Nothing mounts it, so the protection controller lets the delete finish.
    kubectl.ok(&["delete", "pvc", "data", "--timeout=30s"])?;

    // DefaultIngressClass does the same for Ingresses.
    let ingress = r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations: {ingressclass.kubernetes.io/is-default-class: "true"}
spec: {controller: example.com/ingress}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: default}
spec:
  defaultBackend: {service: {name: web, port: {number: 80}}}
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], ingress)?;
    let class = jsonpath(
        &kubectl,
        &["get", "ingress", "web"],
        "{.spec.ingressClassName}",
    )?;
    ensure!(class == "nginx", "the Ingress's class: {class}");
    Ok(())
}

/// A CertificateSigningRequest `name` for `signer` asking for `organization`.
fn signing_request(name: &str, organization: &str, signer: &str) -> anyhow::Result<String> {
    use base64::Engine;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, organization);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let request = params.serialize_request(&key)?.pem()?;
    Ok(format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  signerName: {signer}\n  usages: [client auth]\n  request: {}\n",
        base64::engine::general_purpose::STANDARD.encode(request)
    ))
}

#[test]
fn signing_requests_are_restricted_and_signing_needs_the_sign_verb() -> anyhow::Result<()> {
    use base64::Engine;
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let csr = signing_request(
        "mallory",
        "system:masters",
        "kubernetes.io/kube-apiserver-client",
    )?;
    let refused = kubectl
        .run(&["create", "-f", "-"], Some(&csr), &[])
        .map(|out| String::from_utf8_lossy(&out.stderr).into_owned())?;
    contains(
        &refused,
        "certificatesigningrequests.certificates.k8s.io \"mallory\" is forbidden: use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed",
    )?;

    // CertificateSigning: updating a request's status is not enough to issue its certificate.
    kubectl.ok_stdin(
        &["create", "-f", "-"],
        &signing_request("alice", "dev", "example.com/issuer")?,
    )?;
    kubectl.ok(&["certificate", "approve", "alice"])?;
    let rbac = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: issuer, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: csr-status}
rules:
- apiGroups: [certificates.k8s.io]
  resources: [certificatesigningrequests, certificatesigningrequests/status]
  verbs: [get, list, update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: issuer-csr-status}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: csr-status}
subjects: [{kind: ServiceAccount, name: issuer, namespace: default}]
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], rbac)?;
    let token = kubectl.ok(&["create", "token", "issuer"])?;
    let issuer = kubectl.with_token(token.trim())?;
    let key = rcgen::KeyPair::generate()?;
    let certificate = rcgen::CertificateParams::new(vec!["alice".to_string()])?
        .self_signed(&key)?
        .pem();
    let patch = serde_json::json!({"status": {"certificate":
        base64::engine::general_purpose::STANDARD.encode(certificate)}})
    .to_string();
    let sign = [
        "patch",
        "csr",
        "alice",
        "--subresource=status",
        "--type=merge",
        "-p",
        patch.as_str(),
    ];
    let refused = issuer.fails(&sign)?;
    contains(
        &refused,
        "certificatesigningrequests.certificates.k8s.io \"alice\" is forbidden: user not permitted to sign requests with signerName \"example.com/issuer\"",
    )?;
    let signer_role = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: csr-status}
rules:
- apiGroups: [certificates.k8s.io]
  resources: [certificatesigningrequests, certificatesigningrequests/status]
  verbs: [get, list, update, patch]
- apiGroups: [certificates.k8s.io]
  resources: [signers]
  resourceNames: ["example.com/*"]
  verbs: [sign]
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], signer_role)?;
    flotilla_e2e::until("the signer may sign", Duration::from_secs(10), || {
        Ok(issuer.run(&sign, None, &[])?.status.success())
    })
}

#[test]
fn a_limit_range_defaults_requests_and_limits_and_refuses_what_exceeds_it() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let manifests = r#"
apiVersion: v1
kind: Namespace
metadata: {name: limited}
---
apiVersion: v1
kind: LimitRange
metadata: {name: cpu, namespace: limited}
spec:
  limits:
  - type: Container
    default: {cpu: 500m}
    defaultRequest: {cpu: 100m}
    max: {cpu: "1"}
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], manifests)?;
    kubectl.ok(&[
        "-n",
        "limited",
        "run",
        "plain",
        "--image=nginx",
        "--restart=Never",
    ])?;
    let resources = jsonpath(
        &kubectl,
        &["-n", "limited", "get", "pod", "plain"],
        "{.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.limits.cpu}",
    )?;
    ensure!(resources == "100m 500m", "defaulted resources: {resources}");
    let note = jsonpath(
        &kubectl,
        &["-n", "limited", "get", "pod", "plain"],
        "{.metadata.annotations.kubernetes\\.io/limit-ranger}",
    )?;
    ensure!(
        note == "LimitRanger plugin set: cpu request for container plain; cpu limit for container plain",
        "annotation: {note}"
    );
    let big = r#"
apiVersion: v1
kind: Pod
metadata: {name: big, namespace: limited}
spec:
  containers:
  - {name: c, image: nginx, resources: {limits: {cpu: "2"}}}
"#;
    let refused = kubectl
        .run(&["apply", "-f", "-"], Some(big), &[])
        .map(|out| String::from_utf8_lossy(&out.stderr).into_owned())?;
    contains(
        &refused,
        "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2",
    )?;
    Ok(())
}

#[test]
fn kubectl_debug_adds_an_ephemeral_container_that_pod_security_checks() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok(&["run", "web", "--image=nginx", "--restart=Never"])?;
    kubectl.ok(&[
        "debug",
        "web",
        "--image=busybox",
        "--container=debugger",
        "--target=web",
    ])?;
    let added = jsonpath(
        &kubectl,
        &["get", "pod", "web"],
        "{.spec.ephemeralContainers[0].name} {.spec.ephemeralContainers[0].targetContainerName} {.spec.ephemeralContainers[0].terminationMessagePolicy}",
    )?;
    ensure!(
        added == "debugger web File",
        "the ephemeral container: {added}"
    );
    // Existing ones cannot be taken away (kubectl's own update of the pod keeps them).
    kubectl.ok(&["label", "pod", "web", "debugged=yes"])?;
    let kept = jsonpath(
        &kubectl,
        &["get", "pod", "web"],
        "{.spec.ephemeralContainers[*].name}",
    )?;
    ensure!(kept == "debugger", "after a label change: {kept}");

    // A privileged debugger is refused where `restricted` is enforced.
    kubectl.ok(&["create", "namespace", "locked"])?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &RESTRICTED_POD.replace("NAME", "app"),
    )?;
    kubectl.ok(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    let refused = kubectl.fails(&[
        "-n",
        "locked",
        "debug",
        "app",
        "--image=busybox",
        "--container=root",
        "--profile=sysadmin",
    ])?;
    contains(
        &refused,
        "violates PodSecurity \"restricted:latest\": privileged (container \"root\"",
    )?;
    Ok(())
}

#[test]
fn a_runtime_class_gives_pods_its_overhead_and_scheduling() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let manifests = r#"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: kata}
handler: kata
overhead: {podFixed: {cpu: 250m, memory: 120Mi}}
scheduling:
  nodeSelector: {sandbox: kata}
---
apiVersion: v1
kind: Pod
metadata: {name: sandboxed, namespace: default}
spec:
  runtimeClassName: kata
  containers: [{name: c, image: nginx}]
"#;
    kubectl.ok_stdin(&["apply", "-f", "-"], manifests)?;
    let listed = kubectl.ok(&["get", "runtimeclass", "kata", "--no-headers"])?;
    ensure!(
        listed.split_whitespace().nth(1) == Some("kata"),
        "kubectl get runtimeclass: {listed}"
    );
    let given = jsonpath(
        &kubectl,
        &["get", "pod", "sandboxed"],
        "{.spec.overhead.cpu} {.spec.overhead.memory} {.spec.nodeSelector.sandbox}",
    )?;
    ensure!(given == "250m 120Mi kata", "what the class gave: {given}");
    let refused = kubectl.fails(&[
        "run",
        "lost",
        "--image=nginx",
        "--overrides",
        r#"{"spec":{"runtimeClassName":"nope"}}"#,
    ])?;
    contains(
        &refused,
        "pods \"lost\" is forbidden: pod rejected: RuntimeClass \"nope\" not found",
    )
}

/// Upstream 1.33's `pods/resize`: only the containers' resources change through it, as
/// upstream validates them; the pod itself still refuses a resources change.
#[test]
fn pods_resize_changes_only_resources_as_upstream() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: v1
kind: Pod
metadata: {name: sized, namespace: default}
spec:
  containers:
  - name: c
    image: nginx
    resources: {requests: {cpu: 100m, memory: 64Mi}, limits: {memory: 128Mi}}
"#,
    )?;
    let resize = |patch: &str| {
        kubectl.run(
            &[
                "patch",
                "pod",
                "sized",
                "--subresource",
                "resize",
                "-p",
                patch,
            ],
            None,
            &[],
        )
    };
    let grown = resize(
        r#"{"spec":{"containers":[{"name":"c","image":"evil","resources":{"requests":{"cpu":"200m"}}}]}}"#,
    )?;
    ensure!(
        grown.status.success(),
        "{}",
        String::from_utf8_lossy(&grown.stderr)
    );
    let cpu = jsonpath(
        &kubectl,
        &["get", "pod", "sized"],
        "{.spec.containers[0].resources.requests.cpu} {.spec.containers[0].image}",
    )?;
    ensure!(cpu == "200m nginx", "after the resize: {cpu}");
    // Through the pod itself, resources stay immutable.
    let refused = kubectl.fails(&[
        "patch",
        "pod",
        "sized",
        "-p",
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"300m"}}}]}}"#,
    ])?;
    contains(&refused, "pod updates may not change fields")?;
    // A memory limit lowered without a restart, and a change of QoS class, are refused.
    let lowered = resize(
        r#"{"spec":{"containers":[{"name":"c","resources":{"limits":{"memory":"96Mi"}}}]}}"#,
    )?;
    contains(
        &String::from_utf8_lossy(&lowered.stderr),
        "memory limits cannot be decreased unless resizePolicy is RestartContainer",
    )?;
    let guaranteed = resize(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"200m","memory":"128Mi"},"limits":{"cpu":"200m","memory":"128Mi"}}}]}}"#,
    )?;
    contains(
        &String::from_utf8_lossy(&guaranteed.stderr),
        "Pod QOS Class may not change as a result of resizing",
    )?;
    // A quota is charged what a resize grows, and refuses one past it with upstream's text.
    kubectl.ok(&[
        "create",
        "quota",
        "cpu",
        "--hard=requests.cpu=500m,limits.memory=1Gi",
    ])?;
    until("the quota counts the pod", Duration::from_secs(20), || {
        Ok(jsonpath(
            &kubectl,
            &["get", "quota", "cpu"],
            "{.status.used.requests\\.cpu}",
        )? == "200m")
    })?;
    let past = resize(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"600m"}}}]}}"#,
    )?;
    contains(
        &String::from_utf8_lossy(&past.stderr),
        "exceeded quota: cpu, requested: requests.cpu=400m, used: requests.cpu=200m, limited: requests.cpu=500m",
    )?;
    let within = resize(
        r#"{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"400m"}}}]}}"#,
    )?;
    ensure!(
        within.status.success(),
        "{}",
        String::from_utf8_lossy(&within.stderr)
    );
    let openapi = kubectl.ok(&["get", "--raw", "/openapi/v3/api/v1"])?;
    contains(
        &openapi,
        "/api/v1/namespaces/{namespace}/pods/{name}/resize",
    )?;
    contains(&openapi, "patchCoreV1NamespacedPodResize")?;
    Ok(())
}
