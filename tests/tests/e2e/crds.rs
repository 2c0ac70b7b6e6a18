//! CustomResourceDefinitions through stock kubectl: cert-manager's six real definitions
//! applied client-side and server-side, established, explained and served with their printer
//! columns, short names and categories; their objects created, patched, watched and deleted
//! with the definition; bad definitions refused with upstream's messages; and each tenant
//! seeing only its own definitions.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, Kubectl, jsonpath, until};

/// The cert-manager CRD fixtures (about 1 MB of schemas).
fn cert_manager_crds() -> anyhow::Result<PathBuf> {
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/crds/cert-manager");
    ensure!(
        dir.is_dir(),
        "the cert-manager CRD fixtures are missing at {} (../shared/fixtures beside the clone)",
        dir.display()
    );
    Ok(dir)
}

const ISSUER_AND_CERTIFICATE: &str = r#"
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: selfsigned, namespace: default}
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: web, namespace: default}
spec:
  secretName: web-tls
  dnsNames: [web.example.com]
  issuerRef: {name: selfsigned, kind: Issuer}
"#;

fn contains(text: &str, wanted: &str) -> anyhow::Result<()> {
    ensure!(text.contains(wanted), "expected {wanted:?} in:\n{text}");
    Ok(())
}

fn established(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        &format!("crd/{name}"),
    ])?;
    Ok(())
}

#[test]
fn cert_manager_definitions_install_and_serve_their_kinds() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let crds = cert_manager_crds()?;
    let crds = crds.to_str().context("fixture path")?;

    let applied = kubectl.ok(&["apply", "-f", crds])?;
    contains(
        &applied,
        "customresourcedefinition.apiextensions.k8s.io/certificates.cert-manager.io created",
    )?;
    for name in [
        "certificates.cert-manager.io",
        "issuers.cert-manager.io",
        "clusterissuers.cert-manager.io",
        "certificaterequests.cert-manager.io",
        "orders.acme.cert-manager.io",
        "challenges.acme.cert-manager.io",
    ] {
        established(&kubectl, name)?;
    }
    let names = jsonpath(
        &kubectl,
        &["get", "crd", "certificates.cert-manager.io"],
        "{.status.conditions[?(@.type==\"NamesAccepted\")].reason} {.status.acceptedNames.shortNames}",
    )?;
    ensure!(names == r#"NoConflicts ["cert","certs"]"#, "{names}");
    let listed = kubectl.ok(&["get", "crds"])?;
    contains(&listed, "CREATED AT")?;
    contains(&listed, "challenges.acme.cert-manager.io")?;

    // The same files again, server-side: the definitions are unchanged and still served.
    let again = kubectl.ok(&["apply", "--server-side", "--force-conflicts", "-f", crds])?;
    contains(&again, "certificates.cert-manager.io serverside-applied")?;

    let explained = kubectl.ok(&["explain", "certificate.spec.dnsNames"])?;
    contains(&explained, "GROUP:      cert-manager.io")?;
    contains(&explained, "FIELD: dnsNames <[]string>")?;
    // Through the v2 document too (gnostic's protobuf form, as kubectl reads it).
    let explained_v2 = kubectl.ok(&[
        "explain",
        "certificate.spec.dnsNames",
        "--output=plaintext-openapiv2",
    ])?;
    contains(&explained_v2, "VERSION:  cert-manager.io/v1")?;
    contains(&explained_v2, "Requested DNS subject alternative names.")?;

    // Each served group version is a local, available APIService.
    let services = kubectl.ok(&["get", "apiservices"])?;
    for row in ["v1.cert-manager.io", "v1.acme.cert-manager.io", "v1.apps"] {
        contains(&services, row)?;
    }
    contains(&services, "Local")?;
    // (Remote APIServices, proxied to a Service, are the aggregation suite's.)

    let resources = kubectl.ok(&["api-resources", "--api-group=cert-manager.io"])?;
    contains(&resources, "certificates")?;
    contains(&resources, "cert,certs")?;

    contains(
        &kubectl.ok_stdin(&["apply", "-f", "-"], ISSUER_AND_CERTIFICATE)?,
        "certificate.cert-manager.io/web created",
    )?;
    // Applied again with a change, client-side: kubectl reads the OpenAPI document, finds no
    // strategic merge patch for the kind, and sends a JSON merge patch.
    let changed = ISSUER_AND_CERTIFICATE
        .replace("dnsNames: [web.example.com]", "dnsNames: [www.example.com]");
    contains(
        &kubectl.ok_stdin(&["apply", "-f", "-"], &changed)?,
        "certificate.cert-manager.io/web configured",
    )?;
    ensure!(
        jsonpath(
            &kubectl,
            &["get", "certificate", "web"],
            "{.spec.dnsNames[0]}"
        )? == "www.example.com"
    );
    let table = kubectl.ok(&["get", "certs"])?;
    for column in ["NAME", "READY", "SECRET", "AGE", "web-tls"] {
        contains(&table, column)?;
    }
    let category = kubectl.ok(&["get", "cert-manager"])?;
    contains(&category, "issuer.cert-manager.io/selfsigned")?;
    contains(&category, "certificate.cert-manager.io/web")?;

    // The schema decides: an unknown enum value and missing required fields are refused
    // with upstream's field errors, an unknown field is refused under kubectl's strict
    // validation and pruned without it, and defaults are filled in.
    let certificate = |name: &str, algorithm: &str| {
        format!(
            "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  secretName: s\n  dnsNames: [a.example]\n  issuerRef: {{name: selfsigned}}\n  privateKey: {{algorithm: {algorithm}}}\n  bogus: 1\n"
        )
    };
    let enum_refused = kubectl.run(
        &["apply", "--validate=false", "-f", "-"],
        Some(&certificate("bad", "DSA")),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&enum_refused.stderr),
        r#"spec.privateKey.algorithm: Unsupported value: "DSA": supported values: "RSA", "ECDSA", "Ed25519""#,
    )?;
    let strict = kubectl.run(
        &["apply", "-f", "-"],
        Some(&certificate("bad", "ECDSA")),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&strict.stderr),
        r#"strict decoding error: unknown field "spec.bogus""#,
    )?;
    kubectl.ok_stdin(
        &["apply", "--validate=false", "-f", "-"],
        &certificate("pruned", "ECDSA"),
    )?;
    let stored = jsonpath(&kubectl, &["get", "certificate", "pruned"], "{.spec}")?;
    ensure!(
        !stored.contains("bogus") && stored.contains("ECDSA"),
        "{stored}"
    );
    let missing = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata: {name: incomplete, namespace: default}\nspec: {dnsNames: [a.example]}\n"),
        &[],
    )?;
    let missing = String::from_utf8_lossy(&missing.stderr);
    contains(&missing, "spec.issuerRef: Required value")?;
    contains(&missing, "spec.secretName: Required value")?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: acme, namespace: default}\nspec:\n  acme:\n    server: https://acme.example/directory\n    privateKeySecretRef: {name: k}\n    solvers: [{http01: {gatewayHTTPRoute: {parentRefs: [{name: gw}]}}}]\n",
    )?;
    let defaulted = jsonpath(
        &kubectl,
        &["get", "issuer", "acme"],
        "{.spec.acme.solvers[0].http01.gatewayHTTPRoute.parentRefs[0].kind}",
    )?;
    ensure!(
        defaulted == "Gateway",
        "parentRefs[0].kind was not defaulted: {defaulted:?}"
    );

    // cert-manager's own CEL rule on an Issuer.
    let venafi = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: cert-manager.io/v1\nkind: Issuer\nmetadata: {name: venafi, namespace: default}\nspec:\n  venafi: {zone: z}\n"),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&venafi.stderr),
        r#"spec.venafi: Invalid value: "object": exactly one of tpp, cloud, or ngts must be configured"#,
    )?;

    // A JSON merge patch works; a strategic merge patch is refused as upstream refuses it
    // for custom resources.
    kubectl.ok(&[
        "patch",
        "certificate",
        "web",
        "--type=merge",
        "-p",
        r#"{"spec":{"secretName":"web-tls-2"}}"#,
    ])?;
    ensure!(
        jsonpath(
            &kubectl,
            &["get", "certificate", "web"],
            "{.spec.secretName}"
        )? == "web-tls-2"
    );
    let refused = kubectl.fails(&[
        "patch",
        "certificate",
        "web",
        "--type=strategic",
        "-p",
        r#"{"spec":{"secretName":"x"}}"#,
    ])?;
    contains(
        &refused,
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got application/strategic-merge-patch+json)",
    )?;
    ensure!(
        jsonpath(
            &kubectl,
            &["get", "certificate", "web"],
            "{.metadata.generation}"
        )? == "3"
    );

    // A watch sees the object and its deletion.
    let (status, watched) = kubectl.raw_get(
        "/apis/cert-manager.io/v1/namespaces/default/certificates?watch=1&timeoutSeconds=1",
    )?;
    ensure!(status == 200, "{status}: {watched}");
    contains(&watched, r#""type":"ADDED""#)?;
    contains(&watched, r#""name":"web""#)?;

    // Deleting the definition deletes its objects first, then the kind is gone.
    kubectl.ok(&[
        "delete",
        "crd",
        "certificates.cert-manager.io",
        "--timeout=60s",
    ])?;
    until(
        "the certificates kind is gone",
        Duration::from_secs(30),
        || {
            Ok(kubectl
                .run(&["get", "certificates"], None, &[])?
                .status
                .code()
                != Some(0))
        },
    )?;
    let (status, _) =
        kubectl.raw_get("/apis/cert-manager.io/v1/namespaces/default/certificates/web")?;
    ensure!(status == 404, "certificate still served: {status}");
    // The other definitions and their objects are untouched.
    contains(&kubectl.ok(&["get", "issuers"])?, "selfsigned")?;
    Ok(())
}

#[test]
fn bad_definitions_get_upstreams_errors_and_names_are_first_come() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let widget = |name: &str, plural: &str, kind: &str, group: &str| {
        format!(
            r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {name}}}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: {plural}, kind: {kind}}}
  versions:
  - name: v1
    served: true
    storage: true
    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"#
        )
    };
    let wrong_name = kubectl.run(
        &["apply", "-f", "-"],
        Some(&widget(
            "gadgets.example.com",
            "widgets",
            "Widget",
            "example.com",
        )),
        &[],
    )?;
    ensure!(
        !wrong_name.status.success(),
        "a definition named unlike plural.group was accepted"
    );
    contains(
        &String::from_utf8_lossy(&wrong_name.stderr),
        r#"metadata.name: Invalid value: "gadgets.example.com": must be spec.names.plural+"."+spec.group"#,
    )?;
    let no_dot = kubectl.run(
        &["apply", "-f", "-"],
        Some(&widget("widgets.example", "widgets", "Widget", "example")),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&no_dot.stderr),
        "should be a domain with at least one dot",
    )?;
    ensure!(
        kubectl
            .run(&["get", "crd", "gadgets.example.com"], None, &[])?
            .status
            .code()
            != Some(0)
    );

    // A schema that is not structural (a property without a type).
    let loose = widget("widgets.example.com", "widgets", "Widget", "example.com").replace(
        "{type: object, x-kubernetes-preserve-unknown-fields: true}",
        "{type: object, properties: {spec: {properties: {size: {type: string}}}}}",
    );
    let refused = kubectl.run(&["apply", "-f", "-"], Some(&loose), &[])?;
    contains(
        &String::from_utf8_lossy(&refused.stderr),
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
    )?;

    // Two definitions claiming one kind: the first keeps it, the second is told why not.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &widget("widgets.example.com", "widgets", "Widget", "example.com"),
    )?;
    established(&kubectl, "widgets.example.com")?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &widget("gizmos.example.com", "gizmos", "Widget", "example.com"),
    )?;
    let condition = jsonpath(
        &kubectl,
        &["get", "crd", "gizmos.example.com"],
        "{.status.conditions[?(@.type==\"NamesAccepted\")].status} {.status.conditions[?(@.type==\"Established\")].status}",
    )?;
    ensure!(condition == "False False", "{condition}");
    let message = jsonpath(
        &kubectl,
        &["get", "crd", "gizmos.example.com"],
        "{.status.conditions[?(@.type==\"NamesAccepted\")].message}",
    )?;
    ensure!(message == r#""WidgetList" is already in use"#, "{message}");
    let (status, _) = kubectl.raw_get("/apis/example.com/v1/gizmos")?;
    ensure!(
        status == 404,
        "a kind whose names were refused is served: {status}"
    );
    Ok(())
}

#[test]
fn each_tenant_has_its_own_definitions() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let a = f.kubectl();
    let cli = FlotillaCli {
        config: f.data_dir().join("flotilla.json"),
    };
    cli.ok(&["cluster", "create", "other", "--wait"])?;
    let kubeconfig = f.data_dir().join("other.kubeconfig");
    cli.ok(&[
        "cluster",
        "kubeconfig",
        "other",
        "--file",
        kubeconfig.to_str().context("path")?,
    ])?;
    let b = Kubectl::new(&kubeconfig);

    // The same definition name, with different schemas (one column each) in the two tenants.
    let definition = |column: &str| {
        format!(
            r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: widgets.example.com}}
spec:
  group: example.com
  scope: Namespaced
  names: {{plural: widgets, kind: Widget}}
  versions:
  - name: v1
    served: true
    storage: true
    additionalPrinterColumns: [{{name: {column}, type: string, jsonPath: .spec.{column}}}]
    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"#
        )
    };
    a.ok_stdin(&["apply", "-f", "-"], &definition("color"))?;
    established(&a, "widgets.example.com")?;
    let (status, _) = b.raw_get("/apis/example.com/v1")?;
    ensure!(status == 404, "tenant b sees tenant a's group: {status}");
    ensure!(
        !b.ok(&["api-resources"])?.contains("widgets"),
        "tenant b's discovery lists widgets"
    );

    b.ok_stdin(&["apply", "-f", "-"], &definition("size"))?;
    established(&b, "widgets.example.com")?;
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w, namespace: default}\nspec: {color: red, size: big}\n";
    a.ok_stdin(&["apply", "-f", "-"], widget)?;
    b.ok_stdin(&["apply", "-f", "-"], widget)?;
    contains(&a.ok(&["get", "widgets"])?, "COLOR")?;
    contains(&b.ok(&["get", "widgets"])?, "SIZE")?;
    ensure!(!a.ok(&["get", "widgets"])?.contains("SIZE"));
    a.ok(&["delete", "crd", "widgets.example.com", "--timeout=60s"])?;
    until(
        "tenant a's widgets are gone",
        Duration::from_secs(30),
        || {
            Ok(
                a.raw_get("/apis/example.com/v1/namespaces/default/widgets")?
                    .0
                    == 404,
            )
        },
    )?;
    contains(&b.ok(&["get", "widgets"])?, "big")?;
    Ok(())
}

/// Two versions (one deprecated), conversion `None`, and `x-kubernetes-validations` rules
/// with a transition rule.
const VERSIONED_WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1beta1
    served: true
    storage: false
    deprecated: true
    subresources: &subresources
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    schema: &schema
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.minReplicas <= self.replicas
              message: minReplicas must not exceed replicas
            - rule: self.name == oldSelf.name
              message: name is immutable
            properties:
              name: {type: string}
              replicas: {type: integer}
              minReplicas: {type: integer, default: 1}
          status:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: string}
  - name: v1
    served: true
    storage: true
    subresources: *subresources
    schema: *schema
"#;

#[test]
fn versions_convert_and_rules_decide() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(&["apply", "-f", "-"], VERSIONED_WIDGETS)?;
    established(&kubectl, "widgets.example.com")?;
    let stored = jsonpath(
        &kubectl,
        &["get", "crd", "widgets.example.com"],
        "{.status.storedVersions}",
    )?;
    ensure!(stored == r#"["v1"]"#, "{stored}");

    // Written through the deprecated version (with upstream's warning), read through both.
    let written = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1beta1\nkind: Widget\nmetadata: {name: w, namespace: default}\nspec: {name: first, replicas: 3}\n"),
        &[],
    )?;
    ensure!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    contains(
        &String::from_utf8_lossy(&written.stderr),
        "Warning: example.com/v1beta1 Widget is deprecated; use example.com/v1 Widget",
    )?;
    let (_, v1) = kubectl.raw_get("/apis/example.com/v1/namespaces/default/widgets/w")?;
    contains(&v1, r#""apiVersion":"example.com/v1""#)?;
    contains(&v1, r#""minReplicas":1"#)?;
    let (_, beta) = kubectl.raw_get("/apis/example.com/v1beta1/namespaces/default/widgets")?;
    contains(&beta, r#""apiVersion":"example.com/v1beta1""#)?;

    // The rules: one on the object, one on its change.
    let refused = kubectl.run(
        &["apply", "-f", "-"],
        Some("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x, namespace: default}\nspec: {name: x, replicas: 1, minReplicas: 4}\n"),
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&refused.stderr),
        r#"spec: Invalid value: "object": minReplicas must not exceed replicas"#,
    )?;
    let renamed = kubectl.run(
        &[
            "patch",
            "widget",
            "w",
            "--type=merge",
            "-p",
            r#"{"spec":{"name":"second"}}"#,
        ],
        None,
        &[],
    )?;
    contains(
        &String::from_utf8_lossy(&renamed.stderr),
        "name is immutable",
    )?;
    kubectl.ok(&[
        "patch",
        "wd",
        "w",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":5}}"#,
    ])?;
    ensure!(jsonpath(&kubectl, &["get", "widget", "w"], "{.spec.replicas}")? == "5");

    // The scale subresource maps onto the definition's paths; status goes through /status.
    kubectl.ok(&[
        "patch",
        "widget",
        "w",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"replicas":5,"selector":"app=w"}}"#,
    ])?;
    let (_, scale) = kubectl.raw_get("/apis/example.com/v1/namespaces/default/widgets/w/scale")?;
    contains(&scale, r#""kind":"Scale""#)?;
    contains(&scale, r#""selector":"app=w""#)?;
    kubectl.ok(&["scale", "widget", "w", "--replicas=6"])?;
    ensure!(jsonpath(&kubectl, &["get", "widget", "w"], "{.spec.replicas}")? == "6");

    // A rule that does not compile is refused with the definition.
    let broken = VERSIONED_WIDGETS
        .replace(
            "self.minReplicas <= self.replicas",
            "self.minReplicas <= self.nope",
        )
        .replace("widgets.example.com", "gadgets.example.com")
        .replace(
            "plural: widgets, kind: Widget, shortNames: [wd]",
            "plural: gadgets, kind: Gadget",
        );
    let refused = kubectl.run(&["apply", "-f", "-"], Some(&broken), &[])?;
    let text = String::from_utf8_lossy(&refused.stderr).into_owned();
    contains(&text, "x-kubernetes-validations[0].rule")?;
    contains(&text, "compilation failed")?;
    Ok(())
}

/// A kind defined in Rust with kube-rs, as operators written in Rust define theirs.
#[derive(
    kube::CustomResource, serde::Serialize, serde::Deserialize, Clone, Debug, schemars::JsonSchema,
)]
#[kube(
    group = "kuberust.example.com",
    version = "v1",
    kind = "Gizmo",
    namespaced,
    status = "GizmoStatus",
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#
)]
pub struct GizmoSpec {
    size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    color: Option<String>,
}

/// The Gizmo's status.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, schemars::JsonSchema)]
pub struct GizmoStatus {
    ready: bool,
}

#[test]
fn a_kube_rs_derived_kind_is_applied_written_and_watched() -> anyhow::Result<()> {
    use futures::StreamExt;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use kube::runtime::{WatchStreamExt, watcher};

    let f = Flotilla::up(Backend::Embedded)?;
    let kubeconfig = f.data_dir().join("kubeconfig");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let name = "gizmos.kuberust.example.com";
        crds.patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(Gizmo::crd()),
        )
        .await?;
        tokio::time::timeout(
            Duration::from_secs(30),
            kube::runtime::wait::await_condition(
                crds.clone(),
                name,
                kube::runtime::wait::conditions::is_crd_established(),
            ),
        )
        .await??;

        let gizmos: Api<Gizmo> = Api::namespaced(client.clone(), "default");
        let mut events = watcher(gizmos.clone(), watcher::Config::default())
            .applied_objects()
            .boxed();
        gizmos
            .create(
                &PostParams::default(),
                &Gizmo::new(
                    "g1",
                    GizmoSpec {
                        size: 3,
                        color: None,
                    },
                ),
            )
            .await?;
        // Server-side apply by another manager, then the status through its subresource.
        let applied = gizmos
            .patch(
                "g1",
                &PatchParams::apply("sizer"),
                &Patch::Apply(serde_json::json!({
                    "apiVersion": "kuberust.example.com/v1", "kind": "Gizmo",
                    "spec": {"size": 5},
                })),
            )
            .await?;
        ensure!(applied.spec.size == 5, "{:?}", applied.spec);
        gizmos
            .patch_status(
                "g1",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {"ready": true}})),
            )
            .await?;
        let seen = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(event) = events.next().await {
                let gizmo = event?;
                if gizmo.spec.size == 5 && gizmo.status.as_ref().is_some_and(|s| s.ready) {
                    return anyhow::Ok(true);
                }
            }
            anyhow::Ok(false)
        })
        .await??;
        ensure!(
            seen,
            "the watcher never saw the applied size and the ready status"
        );
        let managers: Vec<String> = gizmos
            .get("g1")
            .await?
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        ensure!(managers.contains(&"sizer".to_string()), "{managers:?}");
        anyhow::Ok(())
    })?;
    contains(&f.kubectl().ok(&["get", "gizmos"])?, "SIZE")?;
    Ok(())
}

#[test]
fn a_quota_counts_custom_resources() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(&["apply", "-f", "-"], VERSIONED_WIDGETS)?;
    established(&kubectl, "widgets.example.com")?;
    kubectl.ok(&["create", "namespace", "limited"])?;
    kubectl.ok(&[
        "-n",
        "limited",
        "create",
        "quota",
        "widgets",
        "--hard=count/widgets.example.com=1",
    ])?;
    until("the quota counts widgets", Duration::from_secs(30), || {
        Ok(jsonpath(
            &kubectl,
            &["-n", "limited", "get", "quota", "widgets"],
            "{.status.used}",
        )?
        .contains("count/widgets.example.com"))
    })?;
    let widget = |name: &str| {
        format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata: {{name: {name}, namespace: limited}}\nspec: {{name: {name}, replicas: 1}}\n"
        )
    };
    kubectl.ok_stdin(&["apply", "-f", "-"], &widget("first"))?;
    let second = kubectl.run(&["apply", "-f", "-"], Some(&widget("second")), &[])?;
    contains(
        &String::from_utf8_lossy(&second.stderr),
        "exceeded quota: widgets, requested: count/widgets.example.com=1, used: count/widgets.example.com=1, limited: count/widgets.example.com=1",
    )?;
    // Deleting one frees its unit once the controller has recounted.
    kubectl.ok(&["-n", "limited", "delete", "widget", "first"])?;
    until(
        "the freed unit is used again",
        Duration::from_secs(40),
        || {
            Ok(kubectl
                .run(&["apply", "-f", "-"], Some(&widget("second")), &[])?
                .status
                .success())
        },
    )?;
    Ok(())
}

#[test]
fn the_garbage_collector_follows_owner_references_to_and_from_custom_resources()
-> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(&["apply", "-f", "-"], VERSIONED_WIDGETS)?;
    established(&kubectl, "widgets.example.com")?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: owner, namespace: default}\nspec: {name: owner, replicas: 1}\n",
    )?;
    let uid = jsonpath(&kubectl, &["get", "widget", "owner"], "{.metadata.uid}")?;
    // A Service owned by the widget, and a widget owned by a Service.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: owned\n  namespace: default\n  ownerReferences: [{{apiVersion: example.com/v1, kind: Widget, name: owner, uid: {uid}}}]\nspec: {{ports: [{{port: 80}}]}}\n"
        ),
    )?;
    kubectl.ok(&["create", "service", "clusterip", "parent", "--tcp=80"])?;
    let parent = jsonpath(&kubectl, &["get", "service", "parent"], "{.metadata.uid}")?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: child\n  namespace: default\n  ownerReferences: [{{apiVersion: v1, kind: Service, name: parent, uid: {parent}}}]\nspec: {{name: child, replicas: 1}}\n"
        ),
    )?;
    kubectl.ok(&["delete", "widget", "owner"])?;
    kubectl.ok(&["delete", "service", "parent"])?;
    until(
        "the widget's Service is collected",
        Duration::from_secs(60),
        || {
            Ok(kubectl
                .run(&["get", "service", "owned"], None, &[])?
                .status
                .code()
                != Some(0))
        },
    )?;
    until(
        "the Service's widget is collected",
        Duration::from_secs(60),
        || {
            Ok(kubectl
                .run(&["get", "widget", "child"], None, &[])?
                .status
                .code()
                != Some(0))
        },
    )?;
    Ok(())
}
