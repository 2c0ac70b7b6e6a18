//! OpenAPI documents generated from the k8s-openapi types: `/openapi/v2` (JSON, and gnostic's
//! protobuf form kubectl asks for) and `/openapi/v3`
//! (an index plus one document per group version), with the `x-kubernetes-*` extensions
//! kubectl reads (group-version-kind, patch strategy and merge keys).

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use crate::discovery::KUBERNETES_MINOR;
use crate::resources::{ResourceInfo, Resources};
use flotilla_api_machinery::schema::{ListType, PatchMeta, PatchStrategy};

/// The documents, built once at startup (they depend only on the resource table).
pub struct OpenApi {
    v2: Bytes,
    v2_protobuf: Bytes,
    v3_index: Bytes,
    v3: BTreeMap<String, Bytes>,
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
    for resource in resources.iter() {
        if let Some(def) = definitions
            .get_mut(&resource.schema_name)
            .and_then(Value::as_object_mut)
        {
            def.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([gvk(resource)]),
            );
        }
        if let Some(schema) = PatchMeta::for_kind(resource.kind) {
            annotate_definition(definitions, &resource.schema_name, schema, 0);
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
    depth: usize,
) {
    // Kubernetes types nest about a dozen levels at most; the bound guards recursive types.
    if depth > 16 {
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
            annotate_definition(definitions, &child, schema.child(&property), depth + 1);
        }
    }
}

fn parameter(name: &str, location: &str, description: &str, v3: bool) -> Value {
    if v3 {
        json!({"name": name, "in": location, "description": description, "schema": {"type": "string", "uniqueItems": true}})
    } else {
        json!({"name": name, "in": location, "description": description, "type": "string", "uniqueItems": true})
    }
}

fn operations(resource: &ResourceInfo, reference: &Value, v3: bool) -> Vec<(String, Value)> {
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
    let collection = format!("{base}{ns}/{}", resource.plural);
    let item = format!("{collection}/{{name}}");
    let write_params = |extra: &[Value]| {
        let mut params = vec![
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
        ];
        params.extend_from_slice(extra);
        params
    };
    let response = |code: &str| {
        if v3 {
            json!({code: {"description": "OK", "content": {"application/json": {"schema": reference}}}})
        } else {
            json!({code: {"description": "OK", "schema": reference}})
        }
    };
    let body = |content_types: &[&str]| {
        if v3 {
            let content: Map<String, Value> = content_types
                .iter()
                .map(|c| (c.to_string(), json!({"schema": reference})))
                .collect();
            Some(json!({"content": content, "required": true}))
        } else {
            None
        }
    };
    let op = |action: &str,
              verb_id: &str,
              params: Vec<Value>,
              request_body: Option<Value>,
              code: &str| {
        let mut op = json!({
            "operationId": format!("{verb_id}{}", resource.kind),
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk(resource),
            "parameters": params,
            "responses": response(code),
        });
        if let Some(body) = request_body {
            op["requestBody"] = body;
        } else if !v3
            && matches!(action, "post" | "put" | "patch")
            && let Some(list) = op["parameters"].as_array_mut()
        {
            list.push(json!({"name": "body", "in": "body", "required": true, "schema": reference}));
        }
        op
    };
    let patch_params = write_params(&[parameter(
        "force",
        "query",
        "Force is going to \"force\" Apply requests.",
        v3,
    )]);
    let patch_types = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
    ];
    let mut collection_ops = json!({
        "get": op("list", "list", vec![], None, "200"),
        "post": op("post", "create", write_params(&[]), body(&["*/*"]), "201"),
    });
    let mut item_ops = json!({
        "get": op("get", "read", vec![], None, "200"),
        "put": op("put", "replace", write_params(&[]), body(&["*/*"]), "200"),
        "patch": op("patch", "patch", patch_params, body(&patch_types), "200"),
        "delete": op("delete", "delete", vec![], None, "200"),
    });
    let path_params = |with_name: bool| {
        let mut list = Vec::new();
        if with_name {
            list.push(if v3 {
                json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}})
            } else {
                json!({"name": "name", "in": "path", "required": true, "type": "string"})
            });
        }
        if resource.namespaced {
            list.push(if v3 {
                json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}})
            } else {
                json!({"name": "namespace", "in": "path", "required": true, "type": "string"})
            });
        }
        Value::Array(list)
    };
    collection_ops["parameters"] = path_params(false);
    item_ops["parameters"] = path_params(true);
    if resource.create_only {
        if let Some(ops) = collection_ops.as_object_mut() {
            ops.remove("get");
        }
        return vec![(collection, collection_ops)];
    }
    vec![(collection, collection_ops), (item, item_ops)]
}

fn group_version_path(resource: &ResourceInfo) -> String {
    if resource.group.is_empty() {
        format!("api/{}", resource.version)
    } else {
        format!("apis/{}/{}", resource.group, resource.version)
    }
}

impl OpenApi {
    /// Builds every document for the served resources.
    pub fn build(resources: &Resources) -> Self {
        let info = json!({"title": "Kubernetes", "version": format!("v1.{KUBERNETES_MINOR}.0")});

        // v2: one document, definitions under #/definitions/.
        let mut gen2 = generator("#/definitions/");
        let mut paths2 = Map::new();
        for resource in resources.iter() {
            let reference = serde_json::to_value((resource.schema)(&mut gen2)).unwrap_or_default();
            for (path, ops) in operations(resource, &reference, false) {
                paths2.insert(path, ops);
            }
        }
        let mut definitions2: Map<String, Value> =
            gen2.take_definitions(true).into_iter().collect();
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
            let mut gen3 = generator("#/components/schemas/");
            let mut paths = Map::new();
            for resource in members {
                let reference =
                    serde_json::to_value((resource.schema)(&mut gen3)).unwrap_or_default();
                for (path, ops) in operations(resource, &reference, true) {
                    paths.insert(path, ops);
                }
            }
            let mut schemas: Map<String, Value> = gen3.take_definitions(true).into_iter().collect();
            annotate(&mut schemas, resources);
            let doc = json!({"openapi": "3.0.0", "info": info, "paths": paths, "components": {"schemas": schemas}});
            v3.insert(gv, serialized(&doc));
        }
        let index: Map<String, Value> = v3
            .iter()
            .map(|(gv, doc)| {
                let hash = content_hash(doc);
                (
                    gv.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={hash}")}),
                )
            })
            .collect();
        OpenApi {
            v2_protobuf: Bytes::from(flotilla_protobuf::openapi_v2::encode_openapi_v2(&v2)),
            v2: serialized(&v2),
            v3_index: serialized(&json!({"paths": index})),
            v3,
        }
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

/// A stable content hash for cache-busting URLs (FNV-1a over the serialized document).
fn content_hash(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf29ce484222325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x100000001b3);
    }
    format!("{hash:016X}")
}
