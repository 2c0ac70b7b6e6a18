//! The OpenAPI 3.1 document of the management API (`GET /v1/openapi.json`), its schemas
//! generated from the wire types.

use std::sync::LazyLock;

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

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
    let answer = |name: &str| json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference(name)}}}, "default": {"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}});
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
                "get": {"summary": "List accounts (operator)", "responses": answer("Account")},
                "post": {"summary": "Create an account and its first API key (operator)", "requestBody": body("CreateAccountRequest"), "responses": answer("IssuedApiKey")},
            },
            "/v1/accounts/{account}": {
                "get": {"summary": "Describe an account (the operator, or the account itself)", "responses": answer("Account")},
                "delete": {"summary": "Delete an account without clusters, revoking every API key it has (operator)", "responses": answer("Account")},
            },
            "/v1/accounts/{account}/apikeys": {
                "post": {"summary": "Issue another API key; with rotate=true the account's other keys are revoked", "parameters": [{"name": "rotate", "in": "query", "required": false, "schema": {"type": "boolean"}}], "responses": answer("IssuedApiKey")},
            },
            "/v1/clusters": {
                "get": {"summary": "List the account's clusters", "responses": answer("Cluster")},
                "post": {"summary": "Create a cluster (answers CREATING)", "requestBody": body("CreateClusterRequest"), "responses": answer("Cluster")},
            },
            "/v1/clusters/{name}": {
                "get": {"summary": "Describe a cluster", "responses": answer("Cluster")},
                "patch": {"summary": "Update endpoint access or tags", "requestBody": body("UpdateClusterRequest"), "responses": answer("Cluster")},
                "delete": {"summary": "Delete a cluster with everything in it (answers DELETING)", "responses": answer("Cluster")},
            },
            "/v1/clusters/{name}/kubeconfig": {
                "get": {"summary": "An admin kubeconfig (YAML) of an ACTIVE cluster", "responses": {"200": {"description": "kubeconfig", "content": {"application/yaml": {}}}}},
            },
            "/v1/clusters/{name}/token": {
                "post": {"summary": "A 15-minute admin bearer token of an ACTIVE cluster (what `flotilla cluster token` gives kubectl's exec plugin)", "responses": {"200": {"description": "{token, expirationTimestamp}", "content": {"application/json": {"schema": {"type": "object", "properties": {"token": {"type": "string"}, "expirationTimestamp": {"type": "string", "format": "date-time"}}}}}}}},
            },
            "/v1/clusters/{name}/nodepools": {
                "get": {"summary": "List node pools", "responses": answer("NodePool")},
                "post": {"summary": "Create a node pool", "requestBody": body("CreateNodePoolRequest"), "responses": answer("NodePool")},
            },
            "/v1/clusters/{name}/nodepools/{pool}": {
                "get": {"summary": "Describe a node pool", "responses": answer("NodePool")},
                "patch": {"summary": "Scale or relabel a node pool", "requestBody": body("UpdateNodePoolRequest"), "responses": answer("NodePool")},
                "delete": {"summary": "Delete a node pool", "responses": answer("NodePool")},
            },
        },
    })
}
