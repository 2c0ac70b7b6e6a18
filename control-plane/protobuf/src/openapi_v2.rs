//! The OpenAPI v2 document in gnostic's protobuf form (`openapi.v2.Document`, media type
//! `application/com.github.proto-openapi.spec.v2.v1.0+protobuf`), which kubectl and client-go
//! ask `/openapi/v2` for. Encoded straight from the JSON document: the message and field numbers
//! are those of gnostic's `openapiv2/OpenAPIv2.proto`; vendor extensions (`x-…`) and other free
//! values are `Any { yaml }`, whose YAML is the value's JSON (JSON is YAML), as gnostic writes
//! them. Keys the message has no field for are left out, as gnostic's compiler would refuse them.

use serde_json::{Map, Value};

use crate::wire::{FIXED64, put_bytes, put_tag, put_varint_field};

/// The media type the protobuf document is answered with. kubectl asks for the older spelling
/// `…spec.v2@v1.0+protobuf`, but Go's media-type parser refuses an `@` in a response's
/// `Content-Type`, so upstream answers this one (with a `.`) to both.
pub const OPENAPI_V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";
/// What both spellings start with, for matching an `Accept` header.
pub const OPENAPI_V2_PROTOBUF_TYPE: &str = "application/com.github.proto-openapi.spec.v2";

/// The gnostic `Document` of an OpenAPI v2 (Swagger 2.0) JSON document.
pub fn encode_openapi_v2(document: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(doc) = document.as_object() else {
        return out;
    };
    string(&mut out, 1, doc.get("swagger"));
    if let Some(info) = doc.get("info").and_then(Value::as_object) {
        let mut message = Vec::new();
        string(&mut message, 1, info.get("title"));
        string(&mut message, 2, info.get("version"));
        string(&mut message, 3, info.get("description"));
        extensions(&mut message, 7, info);
        put_bytes(&mut out, 2, &message);
    }
    string(&mut out, 3, doc.get("host"));
    string(&mut out, 4, doc.get("basePath"));
    strings(&mut out, 5, doc.get("schemes"));
    strings(&mut out, 6, doc.get("consumes"));
    strings(&mut out, 7, doc.get("produces"));
    if let Some(paths) = doc.get("paths").and_then(Value::as_object) {
        let mut message = Vec::new();
        extensions(&mut message, 1, paths);
        for (name, item) in paths.iter().filter(|(name, _)| !name.starts_with("x-")) {
            named(&mut message, 2, name, &path_item(item));
        }
        put_bytes(&mut out, 8, &message);
    }
    if let Some(definitions) = doc.get("definitions").and_then(Value::as_object) {
        let mut message = Vec::new();
        for (name, definition) in definitions {
            named(&mut message, 1, name, &schema(definition));
        }
        put_bytes(&mut out, 9, &message);
    }
    extensions(&mut out, 16, doc);
    out
}

fn string(out: &mut Vec<u8>, number: u32, value: Option<&Value>) {
    if let Some(text) = value.and_then(Value::as_str)
        && !text.is_empty()
    {
        put_bytes(out, number, text.as_bytes());
    }
}

fn strings(out: &mut Vec<u8>, number: u32, value: Option<&Value>) {
    for text in value.and_then(Value::as_array).into_iter().flatten() {
        if let Some(text) = text.as_str() {
            put_bytes(out, number, text.as_bytes());
        }
    }
}

fn boolean(out: &mut Vec<u8>, number: u32, value: Option<&Value>) {
    if value.and_then(Value::as_bool) == Some(true) {
        put_varint_field(out, number, 1);
    }
}

fn int64(out: &mut Vec<u8>, number: u32, value: Option<&Value>) {
    if let Some(n) = value.and_then(Value::as_i64)
        && n != 0
    {
        // int64 on the wire: two's complement in a varint.
        put_varint_field(out, number, n as u64);
    }
}

fn double(out: &mut Vec<u8>, number: u32, value: Option<&Value>) {
    if let Some(n) = value.and_then(Value::as_f64)
        && n != 0.0
    {
        put_tag(out, number, FIXED64);
        out.extend_from_slice(&n.to_le_bytes());
    }
}

/// `Any { yaml }` of a free value.
fn any(value: &Value) -> Vec<u8> {
    let mut message = Vec::new();
    put_bytes(&mut message, 2, value.to_string().as_bytes());
    message
}

/// A `Named…` pair: `{ name = 1, value = 2 }`.
fn named(out: &mut Vec<u8>, number: u32, name: &str, value: &[u8]) {
    let mut pair = Vec::new();
    put_bytes(&mut pair, 1, name.as_bytes());
    put_bytes(&mut pair, 2, value);
    put_bytes(out, number, &pair);
}

/// The object's `x-…` members as repeated `NamedAny`.
fn extensions(out: &mut Vec<u8>, number: u32, object: &Map<String, Value>) {
    for (name, value) in object.iter().filter(|(name, _)| name.starts_with("x-")) {
        named(out, number, name, &any(value));
    }
}

/// `Schema`.
fn schema(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(s) = value.as_object() else {
        return out;
    };
    string(&mut out, 1, s.get("$ref"));
    string(&mut out, 2, s.get("format"));
    string(&mut out, 3, s.get("title"));
    string(&mut out, 4, s.get("description"));
    if let Some(default) = s.get("default") {
        put_bytes(&mut out, 5, &any(default));
    }
    double(&mut out, 6, s.get("multipleOf"));
    double(&mut out, 7, s.get("maximum"));
    boolean(&mut out, 8, s.get("exclusiveMaximum"));
    double(&mut out, 9, s.get("minimum"));
    boolean(&mut out, 10, s.get("exclusiveMinimum"));
    int64(&mut out, 11, s.get("maxLength"));
    int64(&mut out, 12, s.get("minLength"));
    string(&mut out, 13, s.get("pattern"));
    int64(&mut out, 14, s.get("maxItems"));
    int64(&mut out, 15, s.get("minItems"));
    boolean(&mut out, 16, s.get("uniqueItems"));
    int64(&mut out, 17, s.get("maxProperties"));
    int64(&mut out, 18, s.get("minProperties"));
    strings(&mut out, 19, s.get("required"));
    for value in s
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        put_bytes(&mut out, 20, &any(value));
    }
    match s.get("additionalProperties") {
        Some(Value::Bool(allowed)) => {
            let mut item = Vec::new();
            put_varint_field(&mut item, 2, u64::from(*allowed));
            put_bytes(&mut out, 21, &item);
        }
        Some(nested @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_bytes(&mut item, 1, &schema(nested));
            put_bytes(&mut out, 21, &item);
        }
        _ => {}
    }
    match s.get("type") {
        Some(Value::String(kind)) => {
            let mut item = Vec::new();
            put_bytes(&mut item, 1, kind.as_bytes());
            put_bytes(&mut out, 22, &item);
        }
        Some(kinds @ Value::Array(_)) => {
            let mut item = Vec::new();
            strings(&mut item, 1, Some(kinds));
            put_bytes(&mut out, 22, &item);
        }
        _ => {}
    }
    match s.get("items") {
        Some(nested @ Value::Object(_)) => {
            let mut item = Vec::new();
            put_bytes(&mut item, 1, &schema(nested));
            put_bytes(&mut out, 23, &item);
        }
        Some(Value::Array(list)) => {
            let mut item = Vec::new();
            for nested in list {
                put_bytes(&mut item, 1, &schema(nested));
            }
            put_bytes(&mut out, 23, &item);
        }
        _ => {}
    }
    for nested in s
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        put_bytes(&mut out, 24, &schema(nested));
    }
    if let Some(properties) = s.get("properties").and_then(Value::as_object) {
        let mut message = Vec::new();
        for (name, nested) in properties {
            named(&mut message, 1, name, &schema(nested));
        }
        put_bytes(&mut out, 25, &message);
    }
    string(&mut out, 26, s.get("discriminator"));
    boolean(&mut out, 27, s.get("readOnly"));
    if let Some(example) = s.get("example") {
        put_bytes(&mut out, 30, &any(example));
    }
    extensions(&mut out, 31, s);
    out
}

/// `PathItem`.
fn path_item(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(item) = value.as_object() else {
        return out;
    };
    string(&mut out, 1, item.get("$ref"));
    for (method, number) in [
        ("get", 2),
        ("put", 3),
        ("post", 4),
        ("delete", 5),
        ("options", 6),
        ("head", 7),
        ("patch", 8),
    ] {
        if let Some(operation) = item.get(method) {
            put_bytes(&mut out, number, &operation_message(operation));
        }
    }
    for parameter in item
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        put_bytes(&mut out, 9, &parameters_item(parameter));
    }
    extensions(&mut out, 10, item);
    out
}

/// `Operation`.
fn operation_message(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let Some(op) = value.as_object() else {
        return out;
    };
    strings(&mut out, 1, op.get("tags"));
    string(&mut out, 2, op.get("summary"));
    string(&mut out, 3, op.get("description"));
    string(&mut out, 5, op.get("operationId"));
    strings(&mut out, 6, op.get("produces"));
    strings(&mut out, 7, op.get("consumes"));
    for parameter in op
        .get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        put_bytes(&mut out, 8, &parameters_item(parameter));
    }
    if let Some(responses) = op.get("responses").and_then(Value::as_object) {
        let mut message = Vec::new();
        for (code, response) in responses.iter().filter(|(code, _)| !code.starts_with("x-")) {
            named(&mut message, 1, code, &response_value(response));
        }
        extensions(&mut message, 2, responses);
        put_bytes(&mut out, 9, &message);
    }
    strings(&mut out, 10, op.get("schemes"));
    boolean(&mut out, 11, op.get("deprecated"));
    extensions(&mut out, 13, op);
    out
}

/// `ResponseValue`: a `Response` or a `JsonReference`.
fn response_value(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(reference) = value.get("$ref") {
        let mut message = Vec::new();
        string(&mut message, 1, Some(reference));
        put_bytes(&mut out, 2, &message);
        return out;
    }
    let mut response = Vec::new();
    string(&mut response, 1, value.get("description"));
    if let Some(nested) = value.get("schema") {
        let mut item = Vec::new();
        put_bytes(&mut item, 1, &schema(nested));
        put_bytes(&mut response, 2, &item);
    }
    if let Some(object) = value.as_object() {
        extensions(&mut response, 5, object);
    }
    put_bytes(&mut out, 1, &response);
    out
}

/// `ParametersItem`: a `Parameter` (body or one of the non-body kinds) or a `JsonReference`.
fn parameters_item(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(reference) = value.get("$ref") {
        let mut message = Vec::new();
        string(&mut message, 1, Some(reference));
        put_bytes(&mut out, 2, &message);
        return out;
    }
    let Some(p) = value.as_object() else {
        return out;
    };
    let mut parameter = Vec::new();
    let location = p.get("in").and_then(Value::as_str).unwrap_or_default();
    if location == "body" {
        let mut body = Vec::new();
        string(&mut body, 1, p.get("description"));
        string(&mut body, 2, p.get("name"));
        string(&mut body, 3, p.get("in"));
        boolean(&mut body, 4, p.get("required"));
        if let Some(nested) = p.get("schema") {
            put_bytes(&mut body, 5, &schema(nested));
        }
        extensions(&mut body, 6, p);
        put_bytes(&mut parameter, 1, &body);
    } else {
        // Query and form-data sub-schemas carry `allowEmptyValue` as field 5, shifting the
        // rest by one; header and path ones do not.
        let (kind, shift) = match location {
            "header" => (1, 0),
            "formData" => (2, 1),
            "path" => (4, 0),
            _ => (3, 1),
        };
        let mut sub = Vec::new();
        boolean(&mut sub, 1, p.get("required"));
        string(&mut sub, 2, p.get("in"));
        string(&mut sub, 3, p.get("description"));
        string(&mut sub, 4, p.get("name"));
        if shift == 1 {
            boolean(&mut sub, 5, p.get("allowEmptyValue"));
        }
        string(&mut sub, 5 + shift, p.get("type"));
        string(&mut sub, 6 + shift, p.get("format"));
        string(&mut sub, 8 + shift, p.get("collectionFormat"));
        if let Some(default) = p.get("default") {
            put_bytes(&mut sub, 9 + shift, &any(default));
        }
        boolean(&mut sub, 19 + shift, p.get("uniqueItems"));
        for value in p
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            put_bytes(&mut sub, 20 + shift, &any(value));
        }
        extensions(&mut sub, 22 + shift, p);
        let mut non_body = Vec::new();
        put_bytes(&mut non_body, kind, &sub);
        put_bytes(&mut parameter, 2, &non_body);
    }
    put_bytes(&mut out, 1, &parameter);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Path;
    use crate::wire::{Reader, WireValue};

    /// The fields of one message, as (number, bytes or varint).
    fn fields(bytes: &[u8]) -> Vec<(u32, WireValue<'_>)> {
        let mut reader = Reader::new(bytes);
        let mut out = Vec::new();
        loop {
            match reader.next_field(&Path::Root) {
                Ok(Some(field)) => out.push(field),
                Ok(None) => return out,
                Err(err) => panic!("malformed: {err}"),
            }
        }
    }

    fn message(bytes: &[u8], number: u32) -> Vec<&[u8]> {
        fields(bytes)
            .into_iter()
            .filter(|(n, _)| *n == number)
            .filter_map(|(_, v)| match v {
                WireValue::Bytes(b) => Some(b),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_document_becomes_gnostics_message() {
        let document = serde_json::json!({
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": {"/api/v1/namespaces/{namespace}/configmaps": {
                "get": {"operationId": "listCoreV1NamespacedConfigMap",
                        "parameters": [{"name": "limit", "in": "query", "type": "integer", "uniqueItems": true}],
                        "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/io.k8s.api.core.v1.ConfigMapList"}}}},
                "parameters": [{"name": "namespace", "in": "path", "required": true, "type": "string"}]}},
            "definitions": {"io.k8s.api.core.v1.ConfigMap": {
                "type": "object", "required": ["metadata"],
                "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}},
                               "immutable": {"type": "boolean"}},
                "x-kubernetes-group-version-kind": [{"group": "", "kind": "ConfigMap", "version": "v1"}]}},
        });
        let bytes = encode_openapi_v2(&document);
        assert_eq!(message(&bytes, 1), vec![b"2.0".as_slice()]);
        let info = message(&bytes, 2)[0];
        assert_eq!(message(info, 1), vec![b"Kubernetes".as_slice()]);

        let definitions = message(&bytes, 9)[0];
        let pair = message(definitions, 1)[0];
        assert_eq!(
            message(pair, 1),
            vec![b"io.k8s.api.core.v1.ConfigMap".as_slice()]
        );
        let config_map = message(pair, 2)[0];
        assert_eq!(
            message(message(config_map, 22)[0], 1),
            vec![b"object".as_slice()]
        );
        assert_eq!(message(config_map, 19), vec![b"metadata".as_slice()]);
        let extension = message(config_map, 31)[0];
        assert_eq!(
            message(extension, 1),
            vec![b"x-kubernetes-group-version-kind".as_slice()]
        );
        let yaml = message(message(extension, 2)[0], 2)[0];
        let parsed: Value = serde_json::from_slice(yaml).unwrap_or_default();
        assert_eq!(parsed[0]["kind"], "ConfigMap");
        let properties = message(config_map, 25)[0];
        assert_eq!(message(properties, 1).len(), 2);
        let data = message(message(properties, 1)[0], 2)[0];
        let additional = message(data, 21)[0];
        assert_eq!(
            message(message(message(additional, 1)[0], 22)[0], 1),
            vec![b"string".as_slice()]
        );

        let paths = message(&bytes, 8)[0];
        let path = message(paths, 2)[0];
        let item = message(path, 2)[0];
        let get = message(item, 2)[0];
        assert_eq!(
            message(get, 5),
            vec![b"listCoreV1NamespacedConfigMap".as_slice()]
        );
        let query = message(message(message(message(get, 8)[0], 1)[0], 2)[0], 3)[0];
        assert_eq!(message(query, 4), vec![b"limit".as_slice()]);
        assert_eq!(
            message(query, 6),
            vec![b"integer".as_slice()],
            "type is field 6 of a query parameter"
        );
        let namespace = message(message(message(message(item, 9)[0], 1)[0], 2)[0], 4)[0];
        assert_eq!(
            message(namespace, 5),
            vec![b"string".as_slice()],
            "type is field 5 of a path parameter"
        );
        let response = message(message(message(message(get, 9)[0], 1)[0], 2)[0], 1)[0];
        assert_eq!(message(response, 1), vec![b"OK".as_slice()]);
    }
}
