//! OpenAPI documents generated from the k8s-openapi types: `/openapi/v2` (JSON, and gnostic's
//! protobuf form kubectl asks for) and `/openapi/v3`
//! (an index plus one document per group version), with the `x-kubernetes-*` extensions
//! kubectl reads (group-version-kind, patch strategy and merge keys).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::discovery::KUBERNETES_MINOR;
use crate::resources::{ResourceInfo, Resources, Shape};
use flotilla_api_machinery::schema::{ListType, PatchMeta, PatchStrategy};

/// The documents, built once at startup (they depend only on the resource table).
pub struct OpenApi {
    v2: Bytes,
    v2_protobuf: Bytes,
    v3_index: Bytes,
    v3: BTreeMap<String, Bytes>,
    /// Tenants' custom group-version documents, one copy per content.
    custom: DocumentInterner,
}

/// Documents shared by content: tenants that installed the same definitions serve the same
/// bytes, held once while any tenant holds them.
#[derive(Default)]
struct DocumentInterner {
    documents: crate::interning::Shared<Vec<u8>>,
}

/// A shared document as `Bytes` (its owner keeps the shared copy alive).
struct SharedDocument(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedDocument {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl DocumentInterner {
    fn intern(&self, bytes: Vec<u8>) -> Bytes {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut hasher);
        let shared =
            self.documents
                .get_or_make(hasher.finish(), |known| *known == bytes, || bytes.clone());
        Bytes::from_owner(SharedDocument(shared))
    }
}

/// Documents are served as they are, so they are serialized once, not per request.
fn serialized(doc: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(doc).unwrap_or_default())
}

fn generator(definitions_path: &'static str) -> schemars::SchemaGenerator {
    let mut settings = schemars::generate::SchemaSettings::openapi3();
    settings.definitions_path = definitions_path.into();
    settings.meta_schema = None;
    schemars::SchemaGenerator::new(settings)
}

fn gvk(resource: &ResourceInfo) -> Value {
    json!({"group": resource.group, "version": resource.version, "kind": resource.kind})
}

/// `x-kubernetes-group-version-kind` on each served kind's definition, and the patch and
/// list-type metadata kubectl and apply clients read, taken from the same field table the
/// server's own strategic merge and server-side apply use.
fn annotate(definitions: &mut Map<String, Value>, resources: &Resources) {
    // Field tags belong to a Go type, not to where it is reached from: each definition is
    // annotated once (recursive types such as JSONSchemaProps would otherwise be walked
    // exponentially often).
    let mut annotated = std::collections::HashSet::new();
    for resource in resources.iter() {
        let definition_name = resource.definition_name();
        if let Some(def) = definitions
            .get_mut(&definition_name)
            .and_then(Value::as_object_mut)
        {
            def.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([gvk(resource)]),
            );
        }
        if let Some(schema) = resource.patch_meta() {
            annotate_definition(definitions, &definition_name, schema, &mut annotated);
        }
    }
}

/// The definition a property refers to, directly or as the items of an array.
fn referenced_definition(property: &Value) -> Option<String> {
    let reference = property
        .get("$ref")
        .or_else(|| property.get("items").and_then(|i| i.get("$ref")))
        .or_else(|| {
            property
                .get("allOf")
                .and_then(|a| a.get(0))
                .and_then(|a| a.get("$ref"))
        })?
        .as_str()?;
    Some(reference.rsplit('/').next()?.to_string())
}

fn annotate_definition(
    definitions: &mut Map<String, Value>,
    name: &str,
    schema: PatchMeta,
    annotated: &mut std::collections::HashSet<String>,
) {
    if !annotated.insert(name.to_string()) {
        return;
    }
    let properties: Vec<(String, Option<String>)> = definitions
        .get(name)
        .and_then(|d| d.get("properties"))
        .and_then(Value::as_object)
        .map(|p| {
            p.iter()
                .map(|(k, v)| (k.clone(), referenced_definition(v)))
                .collect()
        })
        .unwrap_or_default();
    for (property, child_definition) in properties {
        let field = schema.field(&property);
        if let Some(prop) = definitions
            .get_mut(name)
            .and_then(|d| d.get_mut("properties"))
            .and_then(|p| p.get_mut(&property))
            .and_then(Value::as_object_mut)
        {
            match field.patch_strategy {
                PatchStrategy::Merge => {
                    let strategy = if field.retain_keys {
                        "merge,retainKeys"
                    } else {
                        "merge"
                    };
                    prop.insert("x-kubernetes-patch-strategy".into(), json!(strategy));
                }
                PatchStrategy::Replace => {
                    prop.insert("x-kubernetes-patch-strategy".into(), json!("replace"));
                }
                PatchStrategy::Unspecified if field.retain_keys => {
                    prop.insert("x-kubernetes-patch-strategy".into(), json!("retainKeys"));
                }
                PatchStrategy::Unspecified => {}
            }
            if let Some(key) = field.patch_merge_key {
                prop.insert("x-kubernetes-patch-merge-key".into(), json!(key));
            }
            match field.list_type {
                ListType::Map(keys) => {
                    prop.insert("x-kubernetes-list-type".into(), json!("map"));
                    let names: Vec<&str> = keys.iter().map(|k| k.name).collect();
                    prop.insert("x-kubernetes-list-map-keys".into(), json!(names));
                }
                ListType::Set => {
                    prop.insert("x-kubernetes-list-type".into(), json!("set"));
                }
                ListType::Atomic if prop.get("type") == Some(&json!("array")) => {
                    prop.insert("x-kubernetes-list-type".into(), json!("atomic"));
                }
                ListType::Atomic => {}
            }
        }
        if let Some(child) = child_definition {
            annotate_definition(definitions, &child, schema.child(&property), annotated);
        }
    }
}

/// A query or path parameter of `kind` (`string`, `integer`, `boolean`) in the document's
/// version's form.
fn parameter(name: &str, location: &str, description: &str, v3: bool) -> Value {
    typed_parameter(name, location, "string", description, v3)
}

fn typed_parameter(name: &str, location: &str, kind: &str, description: &str, v3: bool) -> Value {
    let mut p = if v3 {
        json!({"name": name, "in": location, "description": description, "schema": {"type": kind, "uniqueItems": true}})
    } else {
        json!({"name": name, "in": location, "description": description, "type": kind, "uniqueItems": true})
    };
    if location == "path" {
        p["required"] = json!(true);
    }
    p
}

/// The query parameters of list and watch requests.
fn list_parameters(v3: bool) -> Vec<Value> {
    [
        ("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
        ("continue", "string", "The continue option should be set when retrieving more results from the server."),
        ("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields."),
        ("labelSelector", "string", "A selector to restrict the list of returned objects by their labels."),
        ("limit", "integer", "limit is a maximum number of responses to return for a list call."),
        ("resourceVersion", "string", "resourceVersion sets a constraint on what resource versions a request may be served from."),
        ("resourceVersionMatch", "string", "resourceVersionMatch determines how resourceVersion is applied to list calls."),
        ("sendInitialEvents", "boolean", "`sendInitialEvents=true` may be set together with `watch=true`."),
        ("timeoutSeconds", "integer", "Timeout for the list/watch call."),
        ("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
    ]
    .into_iter()
    .map(|(name, kind, description)| typed_parameter(name, "query", kind, description, v3))
    .collect()
}

/// The query parameters of delete requests.
fn delete_parameters(v3: bool) -> Vec<Value> {
    [
        ("dryRun", "string", "When present, indicates that modifications should not be persisted."),
        ("gracePeriodSeconds", "integer", "The duration in seconds before the object should be deleted."),
        ("orphanDependents", "boolean", "Deprecated: please use the PropagationPolicy."),
        ("propagationPolicy", "string", "Whether and how garbage collection will be performed: Orphan, Background or Foreground."),
    ]
    .into_iter()
    .map(|(name, kind, description)| typed_parameter(name, "query", kind, description, v3))
    .collect()
}

/// The query parameters of create, update and patch requests.
fn write_parameters(v3: bool) -> Vec<Value> {
    vec![
        parameter(
            "dryRun",
            "query",
            "When present, indicates that modifications should not be persisted.",
            v3,
        ),
        parameter(
            "fieldManager",
            "query",
            "fieldManager is a name associated with the actor or entity that is making these changes.",
            v3,
        ),
        parameter(
            "fieldValidation",
            "query",
            "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields. Valid values are: Ignore, Warn, Strict.",
            v3,
        ),
    ]
}

/// The group-version part of upstream's operation ids: `CoreV1`, `AppsV1`,
/// `RbacAuthorizationV1`, `FlowcontrolApiserverV1` (the group without `.k8s.io`, each part
/// capitalized).
pub(crate) fn operation_group_version(group: &str, version: &str) -> String {
    let capitalized = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .map(|first| first.to_uppercase().chain(chars).collect::<String>())
            .unwrap_or_default()
    };
    let group = if group.is_empty() {
        "Core".to_string()
    } else {
        group
            .trim_end_matches(".k8s.io")
            .split('.')
            .map(capitalized)
            .collect()
    };
    format!("{group}{}", capitalized(version))
}

/// Where the document's schemas live and the extra ones a resource's operations need.
struct Schemas<'a> {
    generator: &'a mut schemars::SchemaGenerator,
    /// Definitions written here (list kinds), added to the generator's.
    extra: &'a mut Map<String, Value>,
    prefix: &'static str,
}

impl Schemas<'_> {
    fn reference<T: schemars::JsonSchema>(&mut self) -> Value {
        serde_json::to_value(self.generator.subschema_for::<T>()).unwrap_or_default()
    }

    /// The list kind of `resource` (`PodList`): its definition, upstream's shape, and a
    /// reference to it.
    fn list_reference(&mut self, resource: &ResourceInfo, item: &Value) -> Value {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
        let definition_name = resource.definition_name();
        let namespace = definition_name
            .rsplit_once('.')
            .map_or("", |(namespace, _)| namespace);
        let name = format!("{namespace}.{}", resource.list_kind);
        if !self.extra.contains_key(&name) {
            let metadata = self.reference::<ListMeta>();
            let definition = json!({
                "description": format!("{} is a list of {}.", resource.list_kind, resource.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                    "items": {"type": "array", "items": item, "description": format!("List of {}.", resource.plural)},
                    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                    "metadata": metadata,
                },
                "x-kubernetes-group-version-kind": [{"group": resource.group, "version": resource.version, "kind": resource.list_kind}],
            });
            self.extra.insert(name.clone(), definition);
        }
        json!({"$ref": format!("{}{name}", self.prefix)})
    }
}

/// What one operation answers.
enum Answer {
    /// A schema (by reference).
    Schema(Value),
    /// Text (logs, streaming connects).
    Text,
}

fn operations(
    resource: &ResourceInfo,
    schemas: &mut Schemas<'_>,
    v3: bool,
) -> Vec<(String, Value)> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, WatchEvent};
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    let reference = match &resource.shape {
        Shape::Typed { schema, .. } => {
            serde_json::to_value(schema(schemas.generator)).unwrap_or_default()
        }
        Shape::Custom(custom) => {
            use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
            let name = resource.definition_name();
            let mut definition = custom.openapi_schema().clone();
            if !v3 {
                to_openapi_v2(&mut definition);
            }
            let metadata = schemas.reference::<ObjectMeta>();
            if let Some(object) = definition.as_object_mut() {
                object.insert(
                    "x-kubernetes-group-version-kind".into(),
                    json!([gvk(resource)]),
                );
                // Upstream's builder describes the standard fields; metadata is ObjectMeta.
                let properties = object.entry("properties").or_insert_with(|| json!({}));
                properties["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"});
                properties["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"});
                properties["metadata"] = metadata;
            }
            schemas.extra.insert(name.clone(), definition);
            json!({"$ref": format!("{}{name}", schemas.prefix)})
        }
    };
    // A request-only kind (TokenReview) has no list kind, and no list operation to use one.
    let list = if resource.create_only {
        Value::Null
    } else {
        schemas.list_reference(resource, &reference)
    };
    let status = schemas.reference::<Status>();
    let watch_event = schemas.reference::<WatchEvent<RawExtension>>();
    let base = if resource.group.is_empty() {
        format!("/api/{}", resource.version)
    } else {
        format!("/apis/{}/{}", resource.group, resource.version)
    };
    let ns = if resource.namespaced {
        "/namespaces/{namespace}"
    } else {
        ""
    };
    let gv = operation_group_version(&resource.group, &resource.version);
    let scope = if resource.namespaced {
        "Namespaced"
    } else {
        ""
    };
    let kind = &resource.kind;
    let content = |answer: &Answer| match (answer, v3) {
        (Answer::Schema(schema), true) => {
            json!({"application/json": {"schema": schema}, "application/yaml": {"schema": schema}, "application/vnd.kubernetes.protobuf": {"schema": schema}})
        }
        (Answer::Text, true) => json!({"*/*": {"schema": {"type": "string"}}}),
        (Answer::Schema(schema), false) => schema.clone(),
        (Answer::Text, false) => json!({"type": "string"}),
    };
    let responses = |code: &str, answer: &Answer| {
        if v3 {
            json!({code: {"description": "OK", "content": content(answer)}, "401": {"description": "Unauthorized"}})
        } else {
            json!({code: {"description": "OK", "schema": content(answer)}, "401": {"description": "Unauthorized"}})
        }
    };
    // One operation: upstream's action, id, parameters, optional body schema and answer.
    let op = |action: &str,
              id: String,
              gvk: &Value,
              mut params: Vec<Value>,
              body: Option<(&Value, &[&str])>,
              code: &str,
              answer: Answer| {
        let mut op = json!({
            "operationId": id,
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
            "responses": responses(code, &answer),
        });
        if let Some((schema, types)) = body {
            if v3 {
                let content: Map<String, Value> = types
                    .iter()
                    .map(|c| (c.to_string(), json!({"schema": schema})))
                    .collect();
                op["requestBody"] = json!({"content": content, "required": true});
            } else {
                params.push(
                    json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                );
            }
        }
        op["parameters"] = Value::Array(params);
        op
    };
    let path_params = |with_name: bool, namespaced: bool| {
        let mut list = Vec::new();
        if with_name {
            list.push(parameter(
                "name",
                "path",
                &format!("name of the {kind}"),
                v3,
            ));
        }
        if namespaced {
            list.push(parameter(
                "namespace",
                "path",
                "object name and auth scope, such as for teams and projects",
                v3,
            ));
        }
        list.push(parameter(
            "pretty",
            "query",
            "If 'true', then the output is pretty printed.",
            v3,
        ));
        Value::Array(list)
    };
    // A custom resource takes no strategic merge patch: its absence here is how kubectl
    // apply knows to send a JSON merge patch (upstream's documents say so the same way).
    let patch_types: &[&str] = if resource.is_custom() {
        &[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ]
    } else {
        &[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
            "application/apply-patch+yaml",
        ]
    };
    let mut patch_params = write_parameters(v3);
    patch_params.push(typed_parameter(
        "force",
        "query",
        "boolean",
        "Force is going to \"force\" Apply requests.",
        v3,
    ));
    let own = gvk(resource);
    let any = ["*/*"];
    let mut delete_collection_params = delete_parameters(v3);
    delete_collection_params.extend(list_parameters(v3));

    let mut paths = Vec::new();
    let collection = format!("{base}{ns}/{}", resource.plural);
    let item = format!("{collection}/{{name}}");
    let list_op = op(
        "list",
        format!("list{gv}{scope}{kind}"),
        &own,
        list_parameters(v3),
        None,
        "200",
        Answer::Schema(list.clone()),
    );
    let read_op = op(
        "get",
        format!("read{gv}{scope}{kind}"),
        &own,
        vec![],
        None,
        "200",
        Answer::Schema(reference.clone()),
    );
    if resource.computed {
        paths.push((
            collection.clone(),
            json!({"get": list_op, "parameters": path_params(false, resource.namespaced)}),
        ));
        paths.push((
            item.clone(),
            json!({"get": read_op, "parameters": path_params(true, resource.namespaced)}),
        ));
        return paths;
    }
    let mut collection_ops = json!({});
    if !resource.create_only {
        collection_ops["get"] = list_op;
        collection_ops["delete"] = op(
            "deletecollection",
            format!("delete{gv}Collection{scope}{kind}"),
            &own,
            delete_collection_params,
            None,
            "200",
            Answer::Schema(status.clone()),
        );
    }
    collection_ops["post"] = op(
        "post",
        format!("create{gv}{scope}{kind}"),
        &own,
        write_parameters(v3),
        Some((&reference, &any)),
        "201",
        Answer::Schema(reference.clone()),
    );
    collection_ops["parameters"] = path_params(false, resource.namespaced);
    paths.push((collection.clone(), collection_ops));
    if resource.create_only {
        return paths;
    }
    let item_ops = json!({
        "get": read_op,
        "put": op("put", format!("replace{gv}{scope}{kind}"), &own, write_parameters(v3), Some((&reference, &any)), "200", Answer::Schema(reference.clone())),
        "patch": op("patch", format!("patch{gv}{scope}{kind}"), &own, patch_params.clone(), Some((&reference, patch_types)), "200", Answer::Schema(reference.clone())),
        "delete": op("delete", format!("delete{gv}{scope}{kind}"), &own, delete_parameters(v3), None, "200", Answer::Schema(status.clone())),
        "parameters": path_params(true, resource.namespaced),
    });
    paths.push((item.clone(), item_ops));

    // Every namespace at once, and the watch paths upstream still serves.
    if resource.namespaced {
        let all = json!({
            "get": op("list", format!("list{gv}{kind}ForAllNamespaces"), &own, list_parameters(v3), None, "200", Answer::Schema(list.clone())),
            "parameters": path_params(false, false),
        });
        paths.push((format!("{base}/{}", resource.plural), all));
        let watch_all = json!({
            "get": op("watchlist", format!("watch{gv}{kind}ListForAllNamespaces"), &own, list_parameters(v3), None, "200", Answer::Schema(watch_event.clone())),
            "parameters": path_params(false, false),
        });
        paths.push((format!("{base}/watch/{}", resource.plural), watch_all));
    }
    let watch_list = json!({
        "get": op("watchlist", format!("watch{gv}{scope}{kind}List"), &own, list_parameters(v3), None, "200", Answer::Schema(watch_event.clone())),
        "parameters": path_params(false, resource.namespaced),
    });
    paths.push((format!("{base}/watch{ns}/{}", resource.plural), watch_list));
    let watch_one = json!({
        "get": op("watch", format!("watch{gv}{scope}{kind}"), &own, list_parameters(v3), None, "200", Answer::Schema(watch_event)),
        "parameters": path_params(true, resource.namespaced),
    });
    paths.push((
        format!("{base}/watch{ns}/{}/{{name}}", resource.plural),
        watch_one,
    ));

    // Subresources, as discovery lists them.
    for (sub, group, version, sub_kind, verbs) in crate::discovery::subresources(resource) {
        let title: String = {
            let mut chars = sub.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect())
                .unwrap_or_default()
        };
        let sub_gvk = json!({"group": group, "version": version, "kind": sub_kind});
        let schema = match sub_kind {
            "Scale" => Some(schemas.reference::<k8s_openapi::api::autoscaling::v1::Scale>()),
            "Eviction" => Some(schemas.reference::<k8s_openapi::api::policy::v1::Eviction>()),
            "Binding" => Some(schemas.reference::<k8s_openapi::api::core::v1::Binding>()),
            "TokenRequest" => {
                Some(schemas.reference::<k8s_openapi::api::authentication::v1::TokenRequest>())
            }
            k if k == kind && sub != "log" => Some(reference.clone()),
            _ => None,
        };
        let answer = || match &schema {
            Some(schema) => Answer::Schema(schema.clone()),
            None => Answer::Text,
        };
        if sub == "proxy" {
            // Every method is proxied, with and without a path after `proxy` (upstream's
            // `connect…Proxy` and `connect…ProxyWithPath` operations).
            let singular: &str = &resource.singular;
            for with_path in [false, true] {
                let mut ops = json!({});
                for method in ["Delete", "Get", "Head", "Options", "Patch", "Post", "Put"] {
                    let suffix = if with_path { "WithPath" } else { "" };
                    ops[method.to_ascii_lowercase()] = op(
                        "connect",
                        format!("connect{gv}{method}{scope}{kind}Proxy{suffix}"),
                        &sub_gvk,
                        vec![],
                        None,
                        "200",
                        Answer::Text,
                    );
                }
                let mut params = vec![parameter(
                    "name",
                    "path",
                    &format!("name of the {sub_kind}"),
                    v3,
                )];
                if resource.namespaced {
                    params.push(parameter(
                        "namespace",
                        "path",
                        "object name and auth scope, such as for teams and projects",
                        v3,
                    ));
                }
                if with_path {
                    params.push(parameter("path", "path", "path to the resource", v3));
                }
                params.push(parameter(
                    "path",
                    "query",
                    &format!(
                        "Path is the URL path to use for the current proxy request to {singular}."
                    ),
                    v3,
                ));
                ops["parameters"] = Value::Array(params);
                let path = if with_path {
                    format!("{item}/proxy/{{path}}")
                } else {
                    format!("{item}/proxy")
                };
                paths.push((path, ops));
            }
            continue;
        }
        let connect = matches!(sub, "exec" | "attach" | "portforward");
        let mut ops = json!({});
        for verb in verbs {
            match (verb, connect) {
                ("get", true) => {
                    ops["get"] = op(
                        "connect",
                        format!("connect{gv}Get{scope}{kind}{title}"),
                        &sub_gvk,
                        vec![],
                        None,
                        "200",
                        Answer::Text,
                    );
                }
                ("create", true) => {
                    ops["post"] = op(
                        "connect",
                        format!("connect{gv}Post{scope}{kind}{title}"),
                        &sub_gvk,
                        vec![],
                        None,
                        "200",
                        Answer::Text,
                    );
                }
                ("get", false) => {
                    ops["get"] = op(
                        "get",
                        format!("read{gv}{scope}{kind}{title}"),
                        &sub_gvk,
                        vec![],
                        None,
                        "200",
                        answer(),
                    );
                }
                ("update", false) => {
                    let body = schema.clone().unwrap_or_else(|| json!({"type": "object"}));
                    ops["put"] = op(
                        "put",
                        format!("replace{gv}{scope}{kind}{title}"),
                        &sub_gvk,
                        write_parameters(v3),
                        Some((&body, &any)),
                        "200",
                        answer(),
                    );
                }
                ("patch", false) => {
                    let body = schema.clone().unwrap_or_else(|| json!({"type": "object"}));
                    ops["patch"] = op(
                        "patch",
                        format!("patch{gv}{scope}{kind}{title}"),
                        &sub_gvk,
                        patch_params.clone(),
                        Some((&body, patch_types)),
                        "200",
                        answer(),
                    );
                }
                ("create", false) => {
                    let body = schema.clone().unwrap_or_else(|| json!({"type": "object"}));
                    ops["post"] = op(
                        "post",
                        format!("create{gv}{scope}{kind}{title}"),
                        &sub_gvk,
                        write_parameters(v3),
                        Some((&body, &any)),
                        "201",
                        answer(),
                    );
                }
                _ => {}
            }
        }
        ops["parameters"] = path_params(true, resource.namespaced);
        paths.push((format!("{item}/{sub}"), ops));
    }
    paths
}

fn group_version_path(resource: &ResourceInfo) -> String {
    if resource.group.is_empty() {
        format!("api/{}", resource.version)
    } else {
        format!("apis/{}/{}", resource.group, resource.version)
    }
}

/// A tenant's documents when its definitions add kinds.
pub struct CustomDocuments {
    v3_index: Bytes,
    v3: BTreeMap<String, Bytes>,
    /// The table they describe, for the v2 document.
    table: Arc<Resources>,
    /// The v2 document (JSON, protobuf), built when first asked for: it is the whole API in
    /// one document, so it is not built for tenants whose clients never ask.
    v2: std::sync::OnceLock<(Bytes, Bytes)>,
}

impl CustomDocuments {
    /// `/openapi/v2` with the tenant's kinds: JSON and gnostic's protobuf form.
    pub fn v2(&self, shared: &OpenApi) -> &(Bytes, Bytes) {
        self.v2.get_or_init(|| shared.v2_with(&self.table))
    }

    /// `/openapi/v3`: the index of group-version documents.
    pub fn v3_index(&self) -> &Bytes {
        &self.v3_index
    }

    /// `/openapi/v3/{api/v1 | apis/g/v}`.
    pub fn v3_document(&self, group_version: &str) -> Option<&Bytes> {
        self.v3.get(group_version)
    }
}

/// The v3 document of one group version's kinds.
fn v3_document(members: &[&ResourceInfo], resources: &Resources) -> Value {
    let info = json!({"title": "Kubernetes", "version": format!("v1.{KUBERNETES_MINOR}.0")});
    let mut gen3 = generator("#/components/schemas/");
    let mut lists3 = Map::new();
    let mut paths = Map::new();
    for resource in members {
        let mut schemas = Schemas {
            generator: &mut gen3,
            extra: &mut lists3,
            prefix: "#/components/schemas/",
        };
        for (path, ops) in operations(resource, &mut schemas, true) {
            paths.insert(path, ops);
        }
    }
    let mut schemas: Map<String, Value> = gen3.take_definitions(true).into_iter().collect();
    schemas.extend(lists3);
    annotate(&mut schemas, resources);
    json!({"openapi": "3.0.0", "info": info, "paths": paths, "components": {"schemas": schemas}})
}

/// The v3 index: each document's URL with a hash of its bytes (clients cache by it).
fn v3_index(documents: &BTreeMap<String, Bytes>) -> Value {
    let index: Map<String, Value> = documents
        .iter()
        .map(|(gv, doc)| {
            let hash = content_hash(doc);
            (
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")}),
            )
        })
        .collect();
    json!({"paths": index})
}

impl OpenApi {
    /// Builds every document for the served resources.
    pub fn build(resources: &Resources) -> Self {
        let info = json!({"title": "Kubernetes", "version": format!("v1.{KUBERNETES_MINOR}.0")});

        // v2: one document, definitions under #/definitions/.
        let mut gen2 = generator("#/definitions/");
        let mut lists2 = Map::new();
        let mut paths2 = Map::new();
        for resource in resources.iter() {
            let mut schemas = Schemas {
                generator: &mut gen2,
                extra: &mut lists2,
                prefix: "#/definitions/",
            };
            for (path, ops) in operations(resource, &mut schemas, false) {
                paths2.insert(path, ops);
            }
        }
        let mut definitions2: Map<String, Value> =
            gen2.take_definitions(true).into_iter().collect();
        definitions2.extend(lists2);
        annotate(&mut definitions2, resources);
        let v2 =
            json!({"swagger": "2.0", "info": info, "paths": paths2, "definitions": definitions2});

        // v3: one document per group version, schemas under #/components/schemas/.
        let mut v3 = BTreeMap::new();
        let mut by_gv: BTreeMap<String, Vec<&ResourceInfo>> = BTreeMap::new();
        for resource in resources.iter() {
            by_gv
                .entry(group_version_path(resource))
                .or_default()
                .push(resource);
        }
        for (gv, members) in by_gv {
            v3.insert(gv, serialized(&v3_document(&members, resources)));
        }
        OpenApi {
            v2_protobuf: Bytes::from(flotilla_protobuf::openapi_v2::encode_openapi_v2(&v2)),
            v2: serialized(&v2),
            v3_index: serialized(&v3_index(&v3)),
            v3,
            custom: DocumentInterner::default(),
        }
    }

    /// The v3 documents of `table` (a tenant's): the shared ones, and its custom group
    /// versions' built afresh (what a tenant's definitions add is that tenant's only).
    pub fn with_custom(&self, table: &Arc<Resources>) -> CustomDocuments {
        let mut by_gv: BTreeMap<String, Vec<&ResourceInfo>> = BTreeMap::new();
        for resource in table.iter().filter(|r| r.is_custom()) {
            by_gv
                .entry(group_version_path(resource))
                .or_default()
                .push(resource);
        }
        let mut v3 = self.v3.clone();
        for (gv, members) in by_gv {
            let document = serde_json::to_vec(&v3_document(&members, table)).unwrap_or_default();
            v3.insert(gv, self.custom.intern(document));
        }
        CustomDocuments {
            v3_index: serialized(&v3_index(&v3)),
            v3,
            table: table.clone(),
            v2: Default::default(),
        }
    }

    /// The v2 document with `table`'s custom kinds added (their schemas as upstream's
    /// builder publishes them in v2), shared by content between tenants.
    fn v2_with(&self, table: &Resources) -> (Bytes, Bytes) {
        let mut document: Value = serde_json::from_slice(&self.v2).unwrap_or_default();
        let mut generator = generator("#/definitions/");
        let mut extra = Map::new();
        let mut paths = Map::new();
        for resource in table.iter().filter(|r| r.is_custom()) {
            let mut schemas = Schemas {
                generator: &mut generator,
                extra: &mut extra,
                prefix: "#/definitions/",
            };
            paths.extend(operations(resource, &mut schemas, false));
        }
        // The shared document defines every referenced built-in type already.
        if let Some(all) = document["paths"].as_object_mut() {
            all.extend(paths);
        }
        if let Some(definitions) = document["definitions"].as_object_mut() {
            definitions.extend(extra);
        }
        let protobuf = flotilla_protobuf::openapi_v2::encode_openapi_v2(&document);
        let json = serde_json::to_vec(&document).unwrap_or_default();
        (self.custom.intern(json), self.custom.intern(protobuf))
    }

    /// `/openapi/v2`.
    pub fn v2(&self) -> &Bytes {
        &self.v2
    }

    /// `/openapi/v2` in gnostic's protobuf form (what kubectl asks for).
    pub fn v2_protobuf(&self) -> &Bytes {
        &self.v2_protobuf
    }

    /// `/openapi/v3`: the index of group-version documents.
    pub fn v3_index(&self) -> &Bytes {
        &self.v3_index
    }

    /// `/openapi/v3/{api/v1 | apis/g/v}`.
    pub fn v3_document(&self, group_version: &str) -> Option<&Bytes> {
        self.v3.get(group_version)
    }
}

/// Upstream's `ToStructuralOpenAPIV2`: what v2 cannot say, or kubectl's v2 reader cannot
/// cope with, removed from a custom resource's schema (junctors; nullable and
/// unknown-field-preserving nodes lose their type and children; nullable fields are not
/// required).
fn to_openapi_v2(schema: &mut Value) {
    let Some(node) = schema.as_object_mut() else {
        return;
    };
    for junctor in ["allOf", "oneOf", "anyOf", "not"] {
        node.remove(junctor);
    }
    let preserves = node.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
    if node.remove("nullable") == Some(json!(true)) {
        node.remove("type");
        node.remove("items");
        node.remove("properties");
    }
    if preserves {
        node.remove("items");
        node.remove("properties");
        if node.get("type") == Some(&json!("object")) {
            node.remove("type");
        }
    }
    if node.get("type") == Some(&json!("array")) && !node.contains_key("items") {
        node.remove("type");
    }
    let nullable_fields: Vec<String> = node
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .filter(|(_, p)| p.get("nullable") == Some(&json!(true)))
                .map(|(name, _)| name.clone())
                .collect()
        })
        .unwrap_or_default();
    let nullable_values = node
        .get("additionalProperties")
        .is_some_and(|a| a.get("nullable") == Some(&json!(true)));
    if nullable_values {
        node.remove("required");
    } else if let Some(required) = node.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| {
            !nullable_fields
                .iter()
                .any(|f| Some(f.as_str()) == r.as_str())
        });
        if required.is_empty() {
            node.remove("required");
        }
    }
    if let Some(properties) = node.get_mut("properties").and_then(Value::as_object_mut) {
        properties.values_mut().for_each(to_openapi_v2);
    }
    for child in ["items", "additionalProperties"] {
        if let Some(value) = node.get_mut(child) {
            to_openapi_v2(value);
        }
    }
}

/// A stable content hash for cache-busting URLs (FNV-1a over the serialized document).
pub(crate) fn content_hash(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016X}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(api: &OpenApi, group_version: &str) -> Value {
        api.v3_document(group_version)
            .and_then(|bytes| serde_json::from_slice(bytes).ok())
            .unwrap_or_default()
    }

    #[test]
    fn a_tenants_v2_document_has_its_custom_kinds() {
        let builtin = Arc::new(Resources::builtin());
        let api = OpenApi::build(&builtin);
        let definition = json!({
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}}}]},
            "status": {"acceptedNames": {"plural": "widgets", "singular": "widget",
                "kind": "Widget", "listKind": "WidgetList"}},
        });
        let interner = crate::apiextensions::schemas::Interner::default();
        let kinds = crate::apiextensions::custom_resource::kinds_of(
            &definition,
            &interner,
            &Default::default(),
        );
        let table = Arc::new(builtin.with_custom(kinds));
        let custom = api.with_custom(&table);
        let (json, protobuf) = custom.v2(&api);
        let v2: Value = serde_json::from_slice(json).expect("JSON");
        assert!(v2["definitions"]["com.example.v1.Widget"]["properties"]["spec"].is_object());
        assert!(v2["paths"]["/apis/example.com/v1/namespaces/{namespace}/widgets"].is_object());
        assert!(v2["definitions"]["io.k8s.api.core.v1.Pod"].is_object());
        let names: Vec<&String> = v2["definitions"]
            .as_object()
            .map(|d| d.keys().collect())
            .unwrap_or_default();
        assert!(names.iter().all(|name| !name.ends_with('.')), "{names:?}");
        assert!(protobuf.len() > api.v2_protobuf().len());
    }

    #[test]
    fn custom_schemas_lose_what_v2_cannot_say() {
        let mut schema = json!({"type": "object", "required": ["a", "b"],
        "properties": {
            "a": {"type": "string", "nullable": true},
            "b": {"type": "integer", "oneOf": [{"minimum": 1}]},
            "c": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                  "properties": {"d": {"type": "string"}}},
            "e": {"type": "array", "items": {"type": "string", "anyOf": [{}]}},
        }});
        to_openapi_v2(&mut schema);
        assert_eq!(
            schema,
            json!({"type": "object", "required": ["b"],
            "properties": {
                "a": {},
                "b": {"type": "integer"},
                "c": {"x-kubernetes-preserve-unknown-fields": true},
                "e": {"type": "array", "items": {"type": "string"}},
            }})
        );
    }

    /// Every path and operation upstream's document has for a kind: the all-namespaces list,
    /// deletecollection, the watch paths and each subresource, with unique operation ids in
    /// upstream's spelling and each operation's group-version-kind.
    #[test]
    fn documents_describe_every_path_upstream_serves() {
        let api = OpenApi::build(&Resources::builtin());
        let core = v3(&api, "api/v1");
        let paths = core["paths"].as_object().cloned().unwrap_or_default();
        for path in [
            "/api/v1/pods",
            "/api/v1/namespaces/{namespace}/pods",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            "/api/v1/watch/pods",
            "/api/v1/watch/namespaces/{namespace}/pods",
            "/api/v1/watch/namespaces/{namespace}/pods/{name}",
            "/api/v1/namespaces/{namespace}/pods/{name}/status",
            "/api/v1/namespaces/{namespace}/pods/{name}/binding",
            "/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            "/api/v1/namespaces/{namespace}/pods/{name}/exec",
            "/api/v1/namespaces/{namespace}/pods/{name}/attach",
            "/api/v1/namespaces/{namespace}/pods/{name}/portforward",
            "/api/v1/namespaces/{namespace}/pods/{name}/proxy",
            "/api/v1/namespaces/{namespace}/pods/{name}/proxy/{path}",
            "/api/v1/namespaces/{namespace}/services/{name}/proxy",
            "/api/v1/namespaces/{namespace}/services/{name}/proxy/{path}",
            "/api/v1/nodes/{name}/proxy",
            "/api/v1/nodes/{name}/proxy/{path}",
            "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            "/api/v1/namespaces/{name}/finalize",
            "/api/v1/nodes/{name}/status",
        ] {
            assert!(paths.contains_key(path), "{path} is missing");
        }
        let pods = &paths["/api/v1/namespaces/{namespace}/pods"];
        assert_eq!(
            pods["delete"]["operationId"],
            "deleteCoreV1CollectionNamespacedPod"
        );
        assert_eq!(pods["delete"]["x-kubernetes-action"], "deletecollection");
        assert_eq!(pods["get"]["operationId"], "listCoreV1NamespacedPod");
        assert_eq!(
            paths["/api/v1/pods"]["get"]["operationId"],
            "listCoreV1PodForAllNamespaces"
        );
        assert_eq!(
            paths["/api/v1/namespaces/{namespace}/pods/{name}/exec"]["post"]["operationId"],
            "connectCoreV1PostNamespacedPodExec"
        );
        // The proxies: every method, upstream's ids, the options kind, `path` in the path and
        // in the query.
        let proxy = &paths["/api/v1/namespaces/{namespace}/services/{name}/proxy/{path}"];
        for (method, id) in [
            (
                "delete",
                "connectCoreV1DeleteNamespacedServiceProxyWithPath",
            ),
            ("get", "connectCoreV1GetNamespacedServiceProxyWithPath"),
            ("head", "connectCoreV1HeadNamespacedServiceProxyWithPath"),
            (
                "options",
                "connectCoreV1OptionsNamespacedServiceProxyWithPath",
            ),
            ("patch", "connectCoreV1PatchNamespacedServiceProxyWithPath"),
            ("post", "connectCoreV1PostNamespacedServiceProxyWithPath"),
            ("put", "connectCoreV1PutNamespacedServiceProxyWithPath"),
        ] {
            assert_eq!(proxy[method]["operationId"], id);
            assert_eq!(proxy[method]["x-kubernetes-action"], "connect");
        }
        assert_eq!(
            proxy["get"]["x-kubernetes-group-version-kind"]["kind"],
            "ServiceProxyOptions"
        );
        let parameters: Vec<(&str, &str)> = proxy["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p["name"].as_str()?, p["in"].as_str()?)))
            .collect();
        assert_eq!(
            parameters,
            [
                ("name", "path"),
                ("namespace", "path"),
                ("path", "path"),
                ("path", "query")
            ]
        );
        assert_eq!(
            paths["/api/v1/nodes/{name}/proxy"]["get"]["operationId"],
            "connectCoreV1GetNodeProxy"
        );
        assert_eq!(
            paths["/api/v1/namespaces/{namespace}/pods/{name}/proxy"]["options"]["operationId"],
            "connectCoreV1OptionsNamespacedPodProxy"
        );
        let eviction = &paths["/api/v1/namespaces/{namespace}/pods/{name}/eviction"]["post"];
        assert_eq!(
            eviction["x-kubernetes-group-version-kind"]["kind"],
            "Eviction"
        );
        let list_schema = &pods["get"]["responses"]["200"]["content"]["application/json"]["schema"];
        assert_eq!(
            list_schema["$ref"],
            "#/components/schemas/io.k8s.api.core.v1.PodList"
        );
        assert!(
            core["components"]["schemas"]["io.k8s.api.core.v1.PodList"]["properties"]["items"]
                .is_object()
        );
        let operations: Vec<&str> = paths
            .values()
            .flat_map(|ops| ops.as_object().into_iter().flatten())
            .filter_map(|(_, op)| op["operationId"].as_str())
            .collect();
        let unique: std::collections::BTreeSet<&str> = operations.iter().copied().collect();
        assert_eq!(unique.len(), operations.len(), "operation ids are unique");
        assert!(
            paths.len() > 90 && operations.len() > 180,
            "{} paths, {} operations",
            paths.len(),
            operations.len()
        );

        let apps = v3(&api, "apis/apps/v1");
        let scale = &apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"];
        assert_eq!(
            scale["get"]["operationId"],
            "readAppsV1NamespacedDeploymentScale"
        );
        assert_eq!(
            scale["get"]["x-kubernetes-group-version-kind"]["group"],
            "autoscaling"
        );
        assert_eq!(
            operation_group_version("rbac.authorization.k8s.io", "v1"),
            "RbacAuthorizationV1"
        );
        assert_eq!(
            operation_group_version("flowcontrol.apiserver.k8s.io", "v1"),
            "FlowcontrolApiserverV1"
        );

        let v2: Value = serde_json::from_slice(api.v2()).unwrap_or_default();
        assert!(v2["paths"]["/api/v1/watch/namespaces/{namespace}/pods"]["get"].is_object());
        assert_eq!(
            v2["paths"]["/api/v1/nodes/{name}/proxy/{path}"]["head"]["operationId"],
            "connectCoreV1HeadNodeProxyWithPath"
        );
        assert!(v2["definitions"]["io.k8s.api.apps.v1.DeploymentList"].is_object());
        assert!(!api.v2_protobuf().is_empty());
    }
}
