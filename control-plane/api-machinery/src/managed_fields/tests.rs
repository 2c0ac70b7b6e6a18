//! Server-side apply and field ownership, checked against upstream's behaviour.

use super::*;
use serde_json::json;

const NOW: &str = "2025-01-02T03:04:05Z";
const EARLIER: &str = "2024-01-01T00:00:00Z";

fn deployment() -> Schema {
    Schema::for_kind("Deployment").unwrap_or_default()
}

fn fields(json: &str) -> FieldSet {
    let value: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("bad test json: {e}"));
    FieldSet::from_fields_v1(&value).unwrap_or_else(|e| panic!("bad fieldsV1: {e}"))
}

fn entry(manager: &str, operation: Operation, api_version: &str, set: &str) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: manager.into(),
        operation,
        api_version: api_version.into(),
        time: Some(EARLIER.into()),
        fields: fields(set),
        subresource: String::new(),
    }
}

fn apply_options(manager: &str, force: bool) -> ApplyOptions {
    ApplyOptions {
        manager: manager.into(),
        api_version: "apps/v1".into(),
        force,
        now: NOW.into(),
        schema: deployment(),
        ignored: FieldSet::from_paths(&[FieldPath::fields(&["status"])]),
        subresource: String::new(),
    }
}

fn update_options(manager: &str, schema: Schema) -> UpdateOptions {
    UpdateOptions {
        manager: manager.into(),
        operation: Operation::Update,
        api_version: "apps/v1".into(),
        now: NOW.into(),
        schema,
        ignored: FieldSet::new(),
        subresource: String::new(),
    }
}

fn applied(
    outcome: Result<ApplyOutcome, ManagedFieldsError>,
) -> (Value, Vec<ManagedFieldsEntry>, bool) {
    match outcome {
        Ok(ApplyOutcome::Applied {
            object,
            managed_fields,
            changed,
        }) => (object, managed_fields, changed),
        other => panic!("expected a successful apply, got {other:?}"),
    }
}

fn web_config(replicas: i64, labels: Value, containers: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}
        }
    })
}

#[test]
fn fields_v1_round_trips_byte_for_byte() {
    let upstream = concat!(
        r#"{"f:metadata":{"f:finalizers":{".":{},"v:\"example.com/x\"":{}},"f:labels":{".":{},"f:app":{}}},"#,
        r#""f:spec":{"f:progressDeadlineSeconds":{},"f:replicas":{},"f:selector":{},"#,
        r#""f:strategy":{"f:rollingUpdate":{".":{},"f:maxSurge":{},"f:maxUnavailable":{}},"f:type":{}},"#,
        r#""f:template":{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"#,
        r#""k:{\"name\":\"a\\u003cb\"}":{".":{},"f:name":{}},"#,
        r#""k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{},"#,
        r#""f:ports":{".":{},"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}},"#,
        r#""f:resources":{}}},"f:dnsPolicy":{},"f:restartPolicy":{}}}},"#,
        r#""f:status":{"f:conditions":{"k:{\"type\":\"Available\"}":{".":{},"f:status":{}}},"f:replicas":{}}}"#,
    );
    let parsed = fields(upstream);
    let encoded = serde_json::to_string(&parsed.to_fields_v1()).unwrap_or_default();
    assert_eq!(encoded, upstream);
    // Parsing is order-insensitive; encoding always sorts.
    let shuffled = fields(r#"{"f:b":{},"f:a":{"f:y":{},".":{},"f:x":{}}}"#);
    assert_eq!(
        serde_json::to_string(&shuffled.to_fields_v1()).unwrap_or_default(),
        r#"{"f:a":{".":{},"f:x":{},"f:y":{}},"f:b":{}}"#
    );
}

#[test]
fn fields_v1_parsing_rules() {
    let set = fields(r#"{"f:a":{},"x:future":{},"i:3":{},"f:b":{".":{},"f:c":{}}}"#);
    let paths: Vec<String> = set.paths().iter().map(ToString::to_string).collect();
    assert_eq!(paths, vec![".a", ".b", "[3]", ".b.c"]);
    for bad in [
        r#"{"f":{}}"#,
        r#"{"fx":{}}"#,
        r#"{"k:{":{}}"#,
        r#"{"i:x":{}}"#,
        r#"{"f:a":1}"#,
        "[]",
    ] {
        let value: Value = serde_json::from_str(bad).unwrap_or_default();
        assert!(FieldSet::from_fields_v1(&value).is_err(), "{bad}");
    }
}

#[test]
fn paths_render_like_upstream() {
    let path = FieldPath(vec![
        PathElement::Field("spec".into()),
        PathElement::Field("containers".into()),
        PathElement::Key(vec![("name".into(), json!("nginx"))]),
        PathElement::Field("ports".into()),
        PathElement::Key(vec![
            ("containerPort".into(), json!(80)),
            ("protocol".into(), json!("TCP")),
        ]),
    ]);
    assert_eq!(
        path.to_string(),
        r#".spec.containers[name="nginx"].ports[containerPort=80,protocol="TCP"]"#
    );
    let set_item = FieldPath(vec![
        PathElement::Field("finalizers".into()),
        PathElement::Value(json!("a")),
    ]);
    assert_eq!(set_item.to_string(), r#".finalizers[="a"]"#);
    assert_eq!(FieldPath(vec![PathElement::Index(2)]).to_string(), "[2]");
}

#[test]
fn path_elements_sort_like_upstream() {
    let mut elements = vec![
        PathElement::Index(0),
        PathElement::Value(json!("b")),
        PathElement::Value(json!(2)),
        PathElement::Key(vec![("name".into(), json!("b"))]),
        PathElement::Key(vec![("name".into(), json!("a"))]),
        PathElement::Field("b".into()),
        PathElement::Field("a".into()),
        PathElement::Value(json!(true)),
        PathElement::Value(json!(null)),
    ];
    elements.sort();
    let rendered: Vec<String> = elements.iter().map(PathElement::serialize).collect();
    assert_eq!(
        rendered,
        vec![
            "f:a",
            "f:b",
            r#"k:{"name":"a"}"#,
            r#"k:{"name":"b"}"#,
            "v:2",
            r#"v:"b""#,
            "v:true",
            "v:null",
            "i:0"
        ]
    );
    assert_eq!(PathElement::Value(json!(1.5)).serialize(), "v:1.5");
    assert_eq!(PathElement::Value(json!(1e-7)).serialize(), "v:1e-07");
    assert_eq!(
        PathElement::Value(json!({"b": 1, "a": "<"})).serialize(),
        r#"v:{"a":"\u003c","b":1}"#
    );
}

#[test]
fn set_operations() {
    let a = fields(r#"{"f:x":{},"f:y":{"f:z":{}},"f:w":{"f:v":{}}}"#);
    let b = fields(r#"{"f:x":{},"f:y":{"f:q":{}},"f:w":{}}"#);
    let show = |s: FieldSet| serde_json::to_string(&s.to_fields_v1()).unwrap_or_default();
    assert_eq!(
        show(a.union(&b)),
        r#"{"f:w":{".":{},"f:v":{}},"f:x":{},"f:y":{"f:q":{},"f:z":{}}}"#
    );
    assert_eq!(show(a.intersection(&b)), r#"{"f:x":{}}"#);
    assert_eq!(
        show(a.difference(&b)),
        r#"{"f:w":{"f:v":{}},"f:y":{"f:z":{}}}"#
    );
    assert_eq!(show(a.recursive_difference(&b)), r#"{"f:y":{"f:z":{}}}"#);
    assert!(FieldSet::new().is_empty());
    assert!(a.has(&FieldPath::fields(&["y", "z"]).0));
    assert!(!a.has(&FieldPath::fields(&["y"]).0));
}

#[test]
fn field_set_of_an_applied_deployment() {
    let config = web_config(
        2,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]),
    );
    let set = to_field_set(&config, deployment()).unwrap_or_default();
    let got =
        serde_json::to_string(&set.difference(&strip_set()).to_fields_v1()).unwrap_or_default();
    let want = concat!(
        r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:replicas":{},"f:selector":{},"#,
        r#""f:template":{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"#,
        r#""f:image":{},"f:name":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{}}}}}}}}}"#,
    );
    assert_eq!(got, want);
}

#[test]
fn field_sets_report_bad_list_items() {
    let pod = Schema::for_kind("Pod").unwrap_or_default();
    let missing = json!({"spec": {"containers": [{"image": "x"}]}});
    assert_eq!(
        to_field_set(&missing, pod).map_err(|e| e.to_string()),
        Err(r#".spec.containers: associative list with keys has an element that omits key field "name" (and doesn't have default value)"#.to_string())
    );
    let scalar = json!({"spec": {"containers": ["x"]}});
    assert!(to_field_set(&scalar, pod).is_err());
    let duplicate = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
    let mut options = apply_options("kubectl", false);
    options.schema = pod;
    assert_eq!(
        apply(&json!({}), &duplicate, &[], &options).map_err(|e| e.to_string()),
        Err(r#".spec.containers: duplicate entries for key [name="a"]"#.to_string())
    );
    assert!(
        to_field_set(&duplicate, pod).is_ok(),
        "live objects may hold duplicates"
    );
}

#[test]
fn apply_creates_and_is_idempotent() {
    let config = web_config(
        2,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let (object, entries, changed) = applied(apply(
        &json!({}),
        &config,
        &[],
        &apply_options("kubectl", false),
    ));
    assert!(changed);
    assert_eq!(object["spec"]["replicas"], json!(2));
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].id().describe(), "\"kubectl\"");
    assert_eq!(
        entries[0].to_json(),
        json!({
            "manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1", "time": NOW, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}
        })
    );
    assert_eq!(decode_managed_fields(&object), Ok(entries.clone()));

    let mut later = apply_options("kubectl", false);
    later.now = "2030-01-01T00:00:00Z".into();
    let (again, again_entries, changed) = applied(apply(&object, &config, &entries, &later));
    assert!(
        !changed,
        "re-applying the same configuration changes nothing"
    );
    assert_eq!(again_entries, entries, "timestamps do not move on a no-op");
    assert_eq!(again, object);
}

#[test]
fn apply_conflicts_with_other_owners() {
    let live = web_config(
        1,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let owners = vec![entry(
        "kubectl-client-side-apply",
        Operation::Update,
        "apps/v1",
        r#"{"f:spec":{"f:replicas":{}}}"#,
    )];
    let config = web_config(
        3,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let outcome = apply(&live, &config, &owners, &apply_options("kubectl", false));
    let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
        panic!("expected conflicts, got {outcome:?}")
    };
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].path.to_string(), ".spec.replicas");
    assert_eq!(
        conflicts[0].cause_message(),
        "conflict with \"kubectl-client-side-apply\" using apps/v1"
    );
    assert_eq!(
        conflict_message(&conflicts),
        "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
    );

    // Forcing takes the field over.
    let (object, entries, _) = applied(apply(
        &live,
        &config,
        &owners,
        &apply_options("kubectl", true),
    ));
    assert_eq!(object["spec"]["replicas"], json!(3));
    assert_eq!(entries.len(), 1, "the old owner lost its only field");
    assert!(
        entries[0]
            .fields
            .has(&FieldPath::fields(&["spec", "replicas"]).0)
    );

    // Applying the value the other manager already set shares ownership instead.
    let same = web_config(
        1,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let (_, entries, _) = applied(apply(
        &live,
        &same,
        &owners,
        &apply_options("kubectl", false),
    ));
    let owners_of_replicas: Vec<&str> = entries
        .iter()
        .filter(|e| e.fields.has(&FieldPath::fields(&["spec", "replicas"]).0))
        .map(|e| e.manager.as_str())
        .collect();
    assert_eq!(
        owners_of_replicas,
        vec!["kubectl", "kubectl-client-side-apply"]
    );
}

#[test]
fn several_conflicts_are_grouped_by_manager() {
    let live = web_config(
        1,
        json!({"app": "web", "tier": "a"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let owners = vec![
        entry(
            "b-manager",
            Operation::Apply,
            "apps/v1",
            r#"{"f:metadata":{"f:labels":{"f:tier":{}}}}"#,
        ),
        entry(
            "a-manager",
            Operation::Update,
            "apps/v1",
            r#"{"f:spec":{"f:replicas":{},"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{"f:image":{}}}}}}}"#,
        ),
    ];
    let config = web_config(
        2,
        json!({"app": "web", "tier": "b"}),
        json!([{"name": "web", "image": "httpd"}]),
    );
    let outcome = apply(&live, &config, &owners, &apply_options("kubectl", false));
    let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
        panic!("expected conflicts, got {outcome:?}")
    };
    assert_eq!(
        conflict_message(&conflicts),
        concat!(
            "Apply failed with 3 conflicts: conflicts with \"a-manager\" using apps/v1:\n",
            "- .spec.replicas\n",
            "- .spec.template.spec.containers[name=\"web\"].image\n",
            "conflicts with \"b-manager\":\n",
            "- .metadata.labels.tier"
        )
    );
}

#[test]
fn apply_prunes_only_what_the_applier_dropped_and_nobody_else_owns() {
    let first = web_config(
        1,
        json!({"app": "web", "tier": "front", "team": "x"}),
        json!([{"name": "web", "image": "nginx"}, {"name": "log", "image": "fluentd"}]),
    );
    let (mut live, entries, _) = applied(apply(
        &json!({}),
        &first,
        &[],
        &apply_options("kubectl", false),
    ));
    // The server defaulted a field nobody owns, and another manager owns one label.
    live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
    let mut entries = entries;
    entries.push(entry(
        "labeller",
        Operation::Update,
        "apps/v1",
        r#"{"f:metadata":{"f:labels":{"f:team":{}}}}"#,
    ));

    let second = web_config(
        1,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let (object, entries, changed) = applied(apply(
        &live,
        &second,
        &entries,
        &apply_options("kubectl", false),
    ));
    assert!(changed);
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app": "web", "team": "x"}),
        "tier pruned, team kept"
    );
    assert_eq!(
        object["spec"]["template"]["spec"]["containers"],
        json!([{"name": "web", "image": "nginx"}])
    );
    assert_eq!(
        object["spec"]["strategy"],
        json!({"type": "RollingUpdate"}),
        "unowned fields are not pruned"
    );
    let kubectl = entries
        .iter()
        .find(|e| e.manager == "kubectl")
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    assert!(!kubectl.has(&FieldPath::fields(&["metadata", "labels", "tier"]).0));
}

#[test]
fn apply_merges_associative_lists_in_upstream_order() {
    let live = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}}}});
    let config = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "2"}]}}}});
    let merged = merge(&live, &config, deployment()).unwrap_or_default();
    assert_eq!(
        merged["spec"]["template"]["spec"]["containers"],
        json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}, {"name": "c", "image": "2"}])
    );
    let reordered = merge(
        &json!({"l": [1, 2, 3]}),
        &json!({"l": [3, 1]}),
        Schema::unknown(),
    )
    .unwrap_or_default();
    assert_eq!(reordered, json!({"l": [3, 1]}), "unknown lists are atomic");
    let meta = Schema::for_kind("Pod").unwrap_or_default();
    let finalizers = merge(
        &json!({"metadata": {"finalizers": ["a", "b"]}}),
        &json!({"metadata": {"finalizers": ["c", "a"]}}),
        meta,
    )
    .unwrap_or_default();
    assert_eq!(finalizers["metadata"]["finalizers"], json!(["c", "a", "b"]));
    let atomic = merge(
        &json!({"spec": {"selector": {"matchLabels": {"a": "1"}}}}),
        &json!({"spec": {"selector": {"matchLabels": {"b": "2"}}}}),
        deployment(),
    )
    .unwrap_or_default();
    assert_eq!(
        atomic["spec"]["selector"],
        json!({"matchLabels": {"b": "2"}}),
        "an atomic struct is replaced"
    );
}

#[test]
fn apply_rejects_managed_fields_in_the_configuration() {
    let config = json!({"metadata": {"managedFields": [{"manager": "x"}]}});
    assert_eq!(
        apply(&json!({}), &config, &[], &apply_options("kubectl", false)),
        Err(ManagedFieldsError::ManagedFieldsInConfig)
    );
}

#[test]
fn apply_ignores_status_for_the_main_resource() {
    let mut config = web_config(
        1,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    config["status"] = json!({"replicas": 5});
    let (_, entries, _) = applied(apply(
        &json!({}),
        &config,
        &[],
        &apply_options("kubectl", false),
    ));
    assert!(
        !entries[0]
            .fields
            .has(&FieldPath::fields(&["status", "replicas"]).0)
    );
}

#[test]
fn update_records_a_create() {
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d", "labels": {"a": "1"}}, "data": {"k": "v"}});
    let schema = Schema::for_kind("ConfigMap").unwrap_or_default();
    let entries = update(
        &json!({}),
        &configmap,
        &[],
        &update_options("kubectl-create", schema),
    )
    .unwrap_or_default();
    assert_eq!(entries.len(), 1);
    assert_eq!(
        serde_json::to_string(&entries[0].to_json()).unwrap_or_default(),
        concat!(
            r#"{"manager":"kubectl-create","operation":"Update","apiVersion":"apps/v1","time":"2025-01-02T03:04:05Z","#,
            r#""fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}},"f:metadata":{"f:labels":{".":{},"f:a":{}}}}}"#
        )
    );
}

#[test]
fn update_marks_new_objects_like_a_typed_zero_value_would() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "x"}],
        "volumes": [{"name": "v", "emptyDir": {}}]
    }});
    let schema = Schema::for_kind("Pod").unwrap_or_default();
    let entries = update(
        &json!({}),
        &pod,
        &[],
        &update_options("kubectl-run", schema),
    )
    .unwrap_or_default();
    assert_eq!(
        serde_json::to_string(&entries[0].fields.to_fields_v1()).unwrap_or_default(),
        concat!(
            r#"{"f:spec":{"f:containers":{"k:{\"name\":\"c\"}":{".":{},"f:image":{},"f:name":{}}},"#,
            r#""f:volumes":{".":{},"k:{\"name\":\"v\"}":{".":{},"f:emptyDir":{},"f:name":{}}}}}"#
        )
    );
    // Below a pointer the zero value has nothing, so everything is new.
    let rc = json!({"kind": "ReplicationController", "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
    let schema = Schema::for_kind("ReplicationController").unwrap_or_default();
    let entries =
        update(&json!({}), &rc, &[], &update_options("kubectl", schema)).unwrap_or_default();
    assert_eq!(
        serde_json::to_string(&entries[0].fields.to_fields_v1()).unwrap_or_default(),
        r#"{"f:spec":{"f:template":{".":{},"f:spec":{".":{},"f:containers":{".":{},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}}}"#
    );
}

#[test]
fn update_moves_ownership_of_changed_fields() {
    let config = web_config(
        2,
        json!({"app": "web"}),
        json!([{"name": "web", "image": "nginx"}]),
    );
    let (live, entries, _) = applied(apply(
        &json!({}),
        &config,
        &[],
        &apply_options("kubectl", false),
    ));

    // A scaler changes replicas: it becomes the owner, and the applier now conflicts.
    let mut scaled = live.clone();
    scaled["spec"]["replicas"] = json!(5);
    let entries = update(
        &live,
        &scaled,
        &entries,
        &update_options("hpa", deployment()),
    )
    .unwrap_or_default();
    let hpa = entries
        .iter()
        .find(|e| e.manager == "hpa")
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    assert_eq!(
        serde_json::to_string(&hpa.to_fields_v1()).unwrap_or_default(),
        r#"{"f:spec":{"f:replicas":{}}}"#
    );
    let kubectl = entries
        .iter()
        .find(|e| e.manager == "kubectl")
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    assert!(!kubectl.has(&FieldPath::fields(&["spec", "replicas"]).0));
    let outcome = apply(&scaled, &config, &entries, &apply_options("kubectl", false));
    let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
        panic!("expected conflicts, got {outcome:?}")
    };
    assert_eq!(
        conflict_message(&conflicts),
        "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas"
    );

    // Removing a field drops it from every owner; a no-op write changes nothing.
    let mut unlabelled = scaled.clone();
    unlabelled["metadata"]["labels"] = json!({});
    let after = update(
        &scaled,
        &unlabelled,
        &entries,
        &update_options("editor", deployment()),
    )
    .unwrap_or_default();
    assert!(after.iter().all(|e| {
        !e.fields
            .has(&FieldPath::fields(&["metadata", "labels", "app"]).0)
    }));
    let noop = update(
        &scaled,
        &scaled,
        &entries,
        &update_options("editor", deployment()),
    )
    .unwrap_or_default();
    assert_eq!(noop, entries);
}

#[test]
fn update_ownership_wrapper_falls_back_to_the_old_entries() {
    let old_entries = vec![entry(
        "kubectl",
        Operation::Apply,
        "v1",
        r#"{"f:data":{"f:a":{}}}"#,
    )];
    let mut old = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
    set_managed_fields(&mut old, &old_entries);
    let new = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "2"}});
    let entries =
        update_ownership(&[], Some(&old), &new, "editor", "Update", "v1", NOW).unwrap_or_default();
    assert_eq!(
        Value::Array(entries),
        json!([{"manager": "editor", "operation": "Update", "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}])
    );
    assert!(update_ownership(&[], None, &new, "x", "Frob", "v1", NOW).is_err());
    let mut cleared = old.clone();
    set_managed_fields(&mut cleared, &[]);
    assert_eq!(
        cleared.get("metadata").and_then(|m| m.get("managedFields")),
        None
    );
}

#[test]
fn compare_reports_added_modified_and_removed() {
    let pod = Schema::for_kind("Pod").unwrap_or_default();
    let old = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"nodeName": "n1", "tolerations": [{"key": "x"}]}});
    let new = json!({"metadata": {"finalizers": ["b", "c"]}, "spec": {"nodeName": "n2", "tolerations": [{"key": "y"}], "securityContext": {"runAsUser": 1}}});
    let c = compare(&old, &new, pod).unwrap_or_default();
    let show = |s: &FieldSet| serde_json::to_string(&s.to_fields_v1()).unwrap_or_default();
    assert_eq!(
        show(&c.modified),
        r#"{"f:spec":{"f:nodeName":{},"f:tolerations":{}}}"#
    );
    assert_eq!(
        show(&c.added),
        r#"{"f:metadata":{"f:finalizers":{"v:\"c\"":{}}},"f:spec":{"f:securityContext":{".":{},"f:runAsUser":{}}}}"#
    );
    assert_eq!(
        show(&c.removed),
        r#"{"f:metadata":{"f:finalizers":{"v:\"a\"":{}}}}"#
    );
}

#[test]
fn entries_sort_like_upstream() {
    let mut entries = vec![
        entry("z", Operation::Update, "v1", r#"{"f:a":{}}"#),
        entry("b", Operation::Apply, "v1", r#"{"f:a":{}}"#),
        entry("a", Operation::Update, "v1", r#"{"f:a":{}}"#),
    ];
    entries[0].time = Some("2020-01-01T00:00:00Z".into());
    sort_entries(&mut entries);
    let order: Vec<&str> = entries.iter().map(|e| e.manager.as_str()).collect();
    assert_eq!(order, vec!["b", "z", "a"]);
    let bad = json!({"manager": "x", "operation": "Frob"});
    assert!(ManagedFieldsEntry::from_json(&bad).is_err());
    let subresource = ManagerId {
        manager: "k".into(),
        operation: Operation::Update,
        api_version: "v1".into(),
        subresource: "status".into(),
    };
    assert_eq!(
        subresource.describe(),
        "\"k\" with subresource \"status\" using v1"
    );
}
