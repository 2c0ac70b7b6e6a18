//! A multi-version CustomResourceDefinition whose versions convert through a conversion
//! webhook served by a test process over TLS: reads, lists (one ConversionReview a page),
//! watches and patches in the version not stored, writes converted to the storage version,
//! `status.storedVersions` after the storage version moves, and a webhook that refuses or
//! answers an object with another identity failing the read with upstream's message.

use std::sync::{Arc, Mutex};

use anyhow::ensure;
use flotilla_e2e::nodes::Fabric;
use flotilla_e2e::webhook_server::WebhookServer;
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath};
use serde_json::{Value, json};

/// v1 says `spec.size`; v2 says `spec.dimensions.size`. Objects labelled `broken` cannot be
/// converted; objects labelled `rename` come back under another name.
fn convert(object: &Value, desired: &str) -> Value {
    let mut out = object.clone();
    out["apiVersion"] = json!(desired);
    let spec = &mut out["spec"];
    if desired.ends_with("/v2") {
        if let Some(size) = spec.as_object_mut().and_then(|s| s.remove("size")) {
            spec["dimensions"] = json!({"size": size});
        }
    } else if let Some(size) = spec
        .as_object_mut()
        .and_then(|s| s.remove("dimensions"))
        .map(|d| d["size"].clone())
    {
        spec["size"] = size;
    }
    out["metadata"]["labels"]["converted"] = json!("yes");
    // Metadata other than labels and annotations is the server's: this is not kept.
    out["metadata"]["generation"] = json!(999);
    if object["metadata"]["labels"]["rename"] == json!("true") {
        out["metadata"]["name"] = json!(format!(
            "{}-renamed",
            object["metadata"]["name"].as_str().unwrap_or("")
        ));
    }
    out
}

fn answer(review: &Value, sizes: &Mutex<Vec<(String, usize)>>) -> (u16, Vec<u8>) {
    let request = &review["request"];
    let desired = request["desiredAPIVersion"].as_str().unwrap_or("");
    let objects = request["objects"].as_array().cloned().unwrap_or_default();
    if let Ok(mut sizes) = sizes.lock() {
        sizes.push((desired.to_string(), objects.len()));
    }
    let result = match objects
        .iter()
        .find(|o| o["metadata"]["labels"]["broken"] == json!("true"))
    {
        Some(broken) => json!({"status": "Failure", "message": format!(
            "widget {} cannot be converted", broken["metadata"]["name"].as_str().unwrap_or(""))}),
        None => json!({"status": "Success"}),
    };
    let converted: Vec<Value> = objects.iter().map(|o| convert(o, desired)).collect();
    let body = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
        "response": {"uid": request["uid"], "result": result, "convertedObjects": converted},
    });
    (200, serde_json::to_vec(&body).unwrap_or_default())
}

fn definition(url: &str, ca_bundle: &str, storage: &str) -> String {
    let (v1_storage, v2_storage) = (storage == "v1", storage == "v2");
    format!(
        r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: widgets.convert.example.com}}
spec:
  group: convert.example.com
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}}
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig: {{url: "{url}/convert", caBundle: "{ca_bundle}"}}
  versions:
  - name: v1
    served: true
    storage: {v1_storage}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {{type: object, properties: {{size: {{type: integer}}}}}}
  - name: v2
    served: true
    storage: {v2_storage}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              dimensions: {{type: object, properties: {{size: {{type: integer}}}}}}
"#
    )
}

fn widget(
    kubectl: &Kubectl,
    version: &str,
    name: &str,
    labels: &str,
    spec: &str,
) -> anyhow::Result<()> {
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: convert.example.com/{version}\nkind: Widget\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec: {spec}\n"
        ),
    )?;
    Ok(())
}

fn get(kubectl: &Kubectl, version: &str, name: &str) -> anyhow::Result<Value> {
    let path = format!("/apis/convert.example.com/{version}/namespaces/default/widgets/{name}");
    Ok(serde_json::from_str(
        &kubectl.ok(&["get", "--raw", &path])?,
    )?)
}

fn failed_read(kubectl: &Kubectl, path: &str) -> anyhow::Result<String> {
    let out = kubectl.run(&["get", "--raw", path], None, &[])?;
    ensure!(!out.status.success(), "{path} was read");
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_conversion_webhook_converts_reads_writes_lists_and_watches() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // Webhooks are dialled only inside the node networks: serve on the host's fabric address.
    let fabric = Fabric::start(dir.path())?;
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let recorded = sizes.clone();
    let server =
        WebhookServer::start(&fabric.host_ip, move |_, review| answer(&review, &recorded))?;
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &definition(&server.url, &server.ca_bundle(), "v1"),
    )?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.convert.example.com",
        "--timeout=10s",
    ])?;

    // Written in the storage version: no call. Read in the other: converted, with the
    // converter's labels and the server's other metadata.
    widget(&kubectl, "v1", "a", "app: demo", "{size: 3}")?;
    let a = get(&kubectl, "v2", "a")?;
    ensure!(a["apiVersion"] == "convert.example.com/v2", "{a}");
    ensure!(a["spec"] == json!({"dimensions": {"size": 3}}), "{a}");
    ensure!(a["metadata"]["labels"]["converted"] == "yes", "{a}");
    ensure!(
        a["metadata"]["generation"] == 1,
        "generation came from the webhook: {a}"
    );

    // Written in v2: converted to v1 to be stored, so v1 reads it without a call.
    widget(&kubectl, "v2", "b", "app: demo", "{dimensions: {size: 5}}")?;
    let b = get(&kubectl, "v1", "b")?;
    ensure!(b["spec"] == json!({"size": 5}), "{b}");
    ensure!(
        sizes
            .lock()
            .map(|s| s.contains(&("convert.example.com/v1".into(), 1)))
            .unwrap_or(false),
        "the v2 write was not converted to the storage version: {sizes:?}"
    );

    // A list converts its page in one review; kubectl's printer sees v2.
    sizes.lock().map(|mut s| s.clear()).ok();
    let listed: Value = serde_json::from_str(&kubectl.ok(&[
        "get",
        "--raw",
        "/apis/convert.example.com/v2/namespaces/default/widgets",
    ])?)?;
    let list_sizes: Vec<i64> = listed["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["spec"]["dimensions"]["size"].as_i64())
        .collect();
    ensure!(list_sizes == [3, 5], "{listed}");
    let calls = sizes.lock().map(|s| s.clone()).unwrap_or_default();
    ensure!(
        calls == [("convert.example.com/v2".to_string(), 2)],
        "{calls:?}"
    );
    ensure!(
        jsonpath(
            &kubectl,
            &["get", "widgets.v2.convert.example.com", "b"],
            "{.spec.dimensions.size}"
        )? == "5",
        "kubectl get in v2"
    );

    // A watch in v2 sees every event converted.
    let watched = kubectl.ok(&[
        "get",
        "--raw",
        "/apis/convert.example.com/v2/namespaces/default/widgets?watch=true&timeoutSeconds=1",
    ])?;
    let events: Vec<Value> = watched
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    ensure!(events.len() == 2, "{watched}");
    ensure!(
        events
            .iter()
            .all(|e| e["object"]["apiVersion"] == "convert.example.com/v2"
                && e["object"]["spec"]["dimensions"]["size"].is_i64()),
        "{watched}"
    );

    // A merge patch in v2 is applied to the v2 form and stored in v1.
    kubectl.ok(&[
        "patch",
        "widgets.v2.convert.example.com",
        "a",
        "--type=merge",
        "-p",
        r#"{"spec":{"dimensions":{"size":7}}}"#,
    ])?;
    let a = get(&kubectl, "v1", "a")?;
    ensure!(a["spec"] == json!({"size": 7}), "{a}");

    // A refusal and an answer with another identity fail the read, in upstream's words.
    widget(&kubectl, "v1", "c", "broken: 'true'", "{size: 1}")?;
    let refused = failed_read(
        &kubectl,
        "/apis/convert.example.com/v2/namespaces/default/widgets/c",
    )?;
    ensure!(
        refused.contains("conversion webhook for convert.example.com/v1, Kind=Widget failed: widget c cannot be converted"),
        "{refused}"
    );
    let list_refused = failed_read(
        &kubectl,
        "/apis/convert.example.com/v2/namespaces/default/widgets",
    )?;
    ensure!(
        list_refused.contains("widget c cannot be converted"),
        "{list_refused}"
    );
    kubectl.ok(&["delete", "widgets.v1.convert.example.com", "c"])?;
    widget(&kubectl, "v1", "d", "rename: 'true'", "{size: 1}")?;
    let renamed = failed_read(
        &kubectl,
        "/apis/convert.example.com/v2/namespaces/default/widgets/d",
    )?;
    ensure!(
        renamed.contains(
            "returned invalid converted object at index 0: must have the same name: d != d-renamed"
        ),
        "{renamed}"
    );
    kubectl.ok(&["delete", "widgets.v1.convert.example.com", "d"])?;

    // Moving the storage version to v2 records it; new writes are stored in v2 and old
    // objects stay readable in both.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &definition(&server.url, &server.ca_bundle(), "v2"),
    )?;
    let stored = jsonpath(
        &kubectl,
        &["get", "crd", "widgets.convert.example.com"],
        "{.status.storedVersions}",
    )?;
    ensure!(stored == r#"["v1","v2"]"#, "{stored}");
    sizes.lock().map(|mut s| s.clear()).ok();
    widget(&kubectl, "v1", "e", "app: demo", "{size: 9}")?;
    let calls = sizes.lock().map(|s| s.clone()).unwrap_or_default();
    ensure!(
        calls.contains(&("convert.example.com/v2".to_string(), 1)),
        "the v1 write was not converted to v2: {calls:?}"
    );
    ensure!(
        get(&kubectl, "v1", "e")?["spec"] == json!({"size": 9}),
        "e in v1"
    );
    ensure!(
        get(&kubectl, "v2", "a")?["spec"] == json!({"dimensions": {"size": 7}}),
        "a in v2"
    );
    Ok(())
}
