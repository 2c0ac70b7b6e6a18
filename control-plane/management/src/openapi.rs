//! The OpenAPI 3.0 document of the management API (`GET /v1/openapi.json`), its schemas
//! generated from the wire types.

use std::sync::LazyLock;

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use crate::backup;
use crate::model::*;

/// The document, built once.
pub static DOCUMENT: LazyLock<Value> = LazyLock::new(build);

fn build() -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut schemas = serde_json::Map::new();
    macro_rules! schema {
        // Each call registers the type's schema among the generator's definitions.
        ($($t:ty),*) => {$( let _ = generator.subschema_for::<$t>(); )*};
    }
    schema!(
        CreateAccountRequest,
        IssuedApiKey,
        Account,
        CreateClusterRequest,
        UpdateClusterRequest,
        Cluster,
        CreateNodePoolRequest,
        UpdateNodePoolRequest,
        NodePool
    );
    for (name, schema) in generator.take_definitions(true) {
        schemas.insert(name, schema);
    }
    let reference = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    let body = |name: &str| json!({"required": true, "content": {"application/json": {"schema": reference(name)}}});
    let error = json!({"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let respond = |status: &str, schema: Value| json!({status: {"description": "OK", "content": {"application/json": {"schema": schema}}}, "default": error.clone()});
    // Answers wrap what they carry, as EKS's do: `{"cluster": {…}}`, `{"clusters": […]}`.
    let one = |field: &str, name: &str| {
        respond(
            "200",
            json!({"type": "object", "required": [field], "properties": {field: reference(name)}}),
        )
    };
    let many = |field: &str, name: &str| {
        respond(
            "200",
            json!({"type": "object", "required": [field], "properties": {field: {"type": "array", "items": reference(name)}}}),
        )
    };
    let binary = json!({"type": "string", "format": "binary"});
    let path = |name: &str| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}});
    schemas.insert(
        "Error".into(),
        json!({"type": "object", "required": ["code", "message"], "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}),
    );
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Flotilla management API", "version": "v1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
        "paths": {
            "/v1/version": {
                "get": {"summary": "The service's version and its clusters' Kubernetes version (no credential needed)", "security": [], "responses": {"200": {"description": "{version, kubernetes}", "content": {"application/json": {"schema": {"type": "object", "required": ["version", "kubernetes"], "properties": {"version": {"type": "string"}, "kubernetes": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}},
            },
            "/v1/identity": {
                "get": {"summary": "Who the credential is: the operator, or which account", "responses": {"200": {"description": "{operator, accountId}", "content": {"application/json": {"schema": {"type": "object", "required": ["operator"], "properties": {"operator": {"type": "boolean"}, "accountId": {"type": "string"}}}}}}, "default": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}}},
            },
            "/v1/accounts": {
                "get": {"summary": "List accounts (operator)", "responses": many("accounts", "Account")},
                "post": {"summary": "Create an account and its first API key (operator)", "requestBody": body("CreateAccountRequest"), "responses": respond("201", reference("IssuedApiKey"))},
            },
            "/v1/accounts/{account}": {
                "parameters": [path("account")],
                "get": {"summary": "Describe an account (the operator, or the account itself)", "responses": one("account", "Account")},
                "delete": {"summary": "Delete an account without clusters, revoking every API key it has (operator)", "responses": one("account", "Account")},
            },
            "/v1/accounts/{account}/apikeys": {
                "parameters": [path("account")],
                "post": {"summary": "Issue another API key; with rotate=true the account's other keys are revoked", "parameters": [{"name": "rotate", "in": "query", "required": false, "schema": {"type": "boolean"}}], "responses": respond("201", reference("IssuedApiKey"))},
            },
            "/v1/clusters": {
                "get": {"summary": "List the account's clusters", "responses": many("clusters", "Cluster")},
                "post": {"summary": "Create a cluster (answers CREATING)", "requestBody": body("CreateClusterRequest"), "responses": one("cluster", "Cluster")},
            },
            "/v1/clusters/{name}": {
                "parameters": [path("name")],
                "get": {"summary": "Describe a cluster", "responses": one("cluster", "Cluster")},
                "patch": {"summary": "Update endpoint access or tags", "requestBody": body("UpdateClusterRequest"), "responses": one("cluster", "Cluster")},
                "delete": {"summary": "Delete a cluster with everything in it (answers DELETING)", "responses": one("cluster", "Cluster")},
            },
            "/v1/clusters/{name}/kubeconfig": {
                "parameters": [path("name")],
                "get": {"summary": "An admin kubeconfig (YAML) of an ACTIVE cluster", "responses": {"200": {"description": "kubeconfig", "content": {"application/yaml": {"schema": {"type": "object", "required": ["apiVersion", "kind", "clusters", "contexts", "users"], "description": "a kubeconfig (kind: Config)"}}}}, "default": error.clone()}},
            },
            "/v1/clusters/{name}/backup": {
                "parameters": [path("name")],
                "get": {"summary": "A backup of an ACTIVE cluster (what `flotilla cluster backup` writes): its record, node pools, PKI and every object, read at one store revision and sealed under the service's key-encryption key", "responses": {"200": {"description": "the backup file: a JSON header line, then one sealed entry per line", "content": {backup::format::MEDIA_TYPE: {"schema": binary.clone()}}}, "default": error.clone()}},
            },
            "/v1/clusters/{name}/restore": {
                "parameters": [path("name")],
                "post": {"summary": "Make cluster {name} from a backup file (answers CREATING): under the backup's own name, in its own account, it comes back with its id and credentials; otherwise it is a copy with a new id and credentials of its own. 409 when {name} exists; a truncated, corrupted or foreign file is a 400 and nothing is written", "requestBody": {"required": true, "content": {backup::format::MEDIA_TYPE: {"schema": binary.clone()}}}, "responses": one("cluster", "Cluster")},
            },
            "/v1/clusters/{name}/token": {
                "parameters": [path("name")],
                "post": {"summary": "A 15-minute admin bearer token of an ACTIVE cluster (what `flotilla cluster token` gives kubectl's exec plugin)", "responses": respond("200", json!({"type": "object", "required": ["token", "expirationTimestamp"], "properties": {"token": {"type": "string"}, "expirationTimestamp": {"type": "string", "format": "date-time"}}}))},
            },
            "/v1/clusters/{name}/nodepools": {
                "parameters": [path("name")],
                "get": {"summary": "List node pools", "responses": many("nodePools", "NodePool")},
                "post": {"summary": "Create a node pool", "requestBody": body("CreateNodePoolRequest"), "responses": one("nodePool", "NodePool")},
            },
            "/v1/clusters/{name}/nodepools/{pool}": {
                "parameters": [path("name"), path("pool")],
                "get": {"summary": "Describe a node pool", "responses": one("nodePool", "NodePool")},
                "patch": {"summary": "Scale or relabel a node pool", "requestBody": body("UpdateNodePoolRequest"), "responses": one("nodePool", "NodePool")},
                "delete": {"summary": "Delete a node pool", "responses": one("nodePool", "NodePool")},
            },
        },
    })
}
