//! Content negotiation: which representation (`Accept`) a response takes, and which body
//! format (`Content-Type`) a request carries.

use std::sync::atomic::AtomicBool;

use flotilla_api_machinery::request_body;

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::ResourceInfo;
use crate::table::{IncludeObject, table};

/// The representation a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The object (or list) itself, as JSON.
    Json,
    /// The object as YAML.
    Yaml,
    /// `as=Table;g=meta.k8s.io;v=v1`.
    Table,
    /// `as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`.
    PartialMetadata,
}

/// Picks the first acceptable media range of an `Accept` header, as upstream's negotiation does.
pub fn representation(accept: &str) -> Result<Representation, ApiError> {
    if accept.trim().is_empty() {
        return Ok(Representation::Json);
    }
    for media in accept.split(',') {
        let mut parts = media.split(';').map(str::trim);
        let mime = parts.next().unwrap_or("");
        let params: Vec<&str> = parts.collect();
        let param = |name: &str| {
            params
                .iter()
                .find_map(|p| p.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
        };
        match mime {
            "application/json" | "*/*" | "application/*" => match param("as") {
                None => return Ok(Representation::Json),
                Some("Table")
                    if param("g") == Some("meta.k8s.io")
                        && matches!(param("v"), Some("v1") | Some("v1beta1")) =>
                {
                    return Ok(Representation::Table);
                }
                Some("PartialObjectMetadata") | Some("PartialObjectMetadataList")
                    if param("g") == Some("meta.k8s.io")
                        && matches!(param("v"), Some("v1") | Some("v1beta1")) =>
                {
                    return Ok(Representation::PartialMetadata);
                }
                // Other `as=` forms we do not serve: try the next media range.
                Some(_) => {}
            },
            "application/yaml" => return Ok(Representation::Yaml),
            _ => {}
        }
    }
    Err(ApiError::not_acceptable(format!(
        "only the following media types are accepted: application/json, application/yaml (asked for {accept})"
    )))
}

/// The body format of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json` (also the default when unset).
    Json,
    /// `application/yaml`.
    Yaml,
    /// `application/vnd.kubernetes.protobuf`, which kubectl's typed commands send.
    Protobuf,
}

/// Parses a request body as JSON or YAML into a JSON value, with upstream-style messages.
pub fn parse_body(body: &[u8], format: BodyFormat) -> Result<Value, ApiError> {
    parse_body_unless_abandoned(body, format, &AtomicBool::new(false))
}

/// [`parse_body`], giving up early once `abandoned` is set (its client went away).
pub fn parse_body_unless_abandoned(
    body: &[u8],
    format: BodyFormat,
    abandoned: &AtomicBool,
) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: unexpected end of JSON input",
        ));
    }
    match format {
        BodyFormat::Json => request_body::parse_json(body).map_err(ApiError::bad_request),
        BodyFormat::Yaml => {
            request_body::parse_yaml(body, abandoned).map_err(ApiError::bad_request)
        }
        BodyFormat::Protobuf => flotilla_protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding protobuf: {e}"))),
    }
}

/// The format a request's body is read in: a PATCH's by its patch type (JSON, or YAML for
/// an apply), any other's by its `Content-Type`; `None` when the type is not one served.
pub fn request_body_format(method: &http::Method, content_type: &str) -> Option<BodyFormat> {
    if method == http::Method::PATCH {
        let mime = content_type.split(';').next().unwrap_or("").trim();
        return match mime {
            "application/apply-patch+yaml" => Some(BodyFormat::Yaml),
            "application/json-patch+json"
            | "application/merge-patch+json"
            | "application/strategic-merge-patch+json" => Some(BodyFormat::Json),
            _ => None,
        };
    }
    body_format(content_type).ok()
}

/// The body format of a create/update `Content-Type`.
pub fn body_format(content_type: &str) -> Result<BodyFormat, ApiError> {
    let mime = content_type.split(';').next().unwrap_or("").trim();
    match mime {
        "" | "application/json" | "*/*" => Ok(BodyFormat::Json),
        "application/yaml" | "application/x-yaml" | "text/yaml" => Ok(BodyFormat::Yaml),
        mime if flotilla_protobuf::is_protobuf(mime) => Ok(BodyFormat::Protobuf),
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

/// Turns an object or list into the asked-for representation: (content type, body value).
pub fn render(
    resource: Option<&ResourceInfo>,
    value: Value,
    representation: Representation,
    include: IncludeObject,
) -> (&'static str, Value) {
    let is_list = value.get("items").is_some_and(Value::is_array)
        && value
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| k.ends_with("List"));
    match (representation, resource) {
        (Representation::Table, Some(resource))
            if value.get("kind").and_then(Value::as_str) != Some("Status") =>
        {
            let columns = resource.strategy.columns();
            if is_list {
                let items = value
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let list_meta = value.get("metadata").cloned().unwrap_or_else(|| json!({}));
                (
                    "application/json",
                    in_wire_order(None, table(&columns, &items, list_meta, include, true)),
                )
            } else {
                let rv = crate::meta::resource_version(&value).to_string();
                (
                    "application/json",
                    in_wire_order(
                        None,
                        table(
                            &columns,
                            &[value],
                            json!({"resourceVersion": rv}),
                            include,
                            true,
                        ),
                    ),
                )
            }
        }
        (Representation::PartialMetadata, Some(_)) => {
            let partial = |o: &Value| json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o.get("metadata").cloned().unwrap_or_else(|| json!({}))});
            if is_list {
                let items: Vec<Value> = value
                    .get("items")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(partial)
                    .collect();
                (
                    "application/json",
                    in_wire_order(
                        None,
                        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": value.get("metadata").cloned().unwrap_or_else(|| json!({})), "items": items}),
                    ),
                )
            } else {
                ("application/json", in_wire_order(None, partial(&value)))
            }
        }
        (Representation::Yaml, _) => ("application/yaml", value),
        _ => ("application/json", in_wire_order(resource, value)),
    }
}

/// A JSON answer's value made ready for [`to_json`]: a custom resource's keys sorted
/// (upstream writes it unstructured); built-in kinds are put in order as they are written.
pub fn in_wire_order(resource: Option<&ResourceInfo>, mut value: Value) -> Value {
    if resource.is_some_and(ResourceInfo::is_custom) {
        flotilla_protobuf::sort_unstructured(&mut value);
    }
    value
}

/// A JSON body as the API server writes it: a built-in kind's fields in the Go struct's
/// order with the value structs Go always writes, Go's escaping, a trailing newline.
pub fn to_json(value: &Value) -> Vec<u8> {
    flotilla_api_machinery::gojson::to_vec(&flotilla_protobuf::GoJson::new(value, false))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_get_accept_header_selects_table() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(representation(accept).ok(), Some(Representation::Table));
    }

    #[test]
    fn protobuf_only_is_not_acceptable_but_falls_back_when_json_listed() {
        assert!(representation("application/vnd.kubernetes.protobuf").is_err());
        assert_eq!(
            representation("application/vnd.kubernetes.protobuf, application/json").ok(),
            Some(Representation::Json)
        );
    }

    /// Finding 2 of the security review: `[` × 70,000 as YAML held a core for seconds.
    #[test]
    fn deeply_nested_yaml_is_refused_at_the_depth_limit() {
        // Flow collections, whose depth is what costs libyaml: refused by the depth check
        // (or, past 255 levels, by the event parser's own recursion limit).
        for body in [
            "[".repeat(70_000),
            "{a: ".repeat(70_000),
            format!("{}1{}", "[".repeat(129), "]".repeat(129)),
        ] {
            let err = parse_body(body.as_bytes(), BodyFormat::Yaml).expect_err("too deep");
            assert_eq!(err.code, 400);
            assert!(
                err.message.contains("exceeded max depth of 128")
                    || err.message.contains("recursion limit exceeded"),
                "{}: {}",
                &body[..8],
                err.message
            );
        }
        // Block nesting costs libyaml nothing per level; serde_yaml's own limit refuses it.
        let err = parse_body("- ".repeat(35_000).as_bytes(), BodyFormat::Yaml).expect_err("deep");
        assert_eq!(err.code, 400);
        let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        assert!(parse_body(deep.as_bytes(), BodyFormat::Yaml).is_ok());
        let json = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            parse_body(json.as_bytes(), BodyFormat::Json)
                .expect_err("too deep")
                .code,
            400
        );
    }

    /// Ten lines of nested aliases would expand to a billion nodes (serde_yaml's own
    /// repetition limit grows with the body, so padding the body let them through).
    #[test]
    fn aliases_that_multiply_nodes_are_refused() {
        let mut bomb = String::from("pad: [");
        bomb.push_str(&"1,".repeat(200_000));
        bomb.push_str("1]\na: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        let mut previous = "a".to_string();
        for name in ["b", "c", "d", "e", "f", "g", "h", "i"] {
            let refs = vec![format!("*{previous}"); 9].join(", ");
            bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
            previous = name.to_string();
        }
        let err = parse_body(bomb.as_bytes(), BodyFormat::Yaml).expect_err("refused");
        assert_eq!(err.code, 400);
        assert!(
            err.message.contains("excessive aliasing"),
            "{}",
            err.message
        );
        // A few aliases, as hand-written manifests use them, are fine.
        let modest = "base: &base {cpu: 1}\na: *base\nb: *base\n";
        assert_eq!(
            parse_body(modest.as_bytes(), BodyFormat::Yaml).ok(),
            Some(json!({"base": {"cpu": 1}, "a": {"cpu": 1}, "b": {"cpu": 1}}))
        );
    }

    #[test]
    fn json_sent_as_yaml_is_read_as_json() {
        assert_eq!(
            parse_body(br#" {"a": [1, {"b": null}]}"#, BodyFormat::Yaml).ok(),
            Some(json!({"a": [1, {"b": null}]}))
        );
        assert_eq!(
            parse_body(b"{a: 1}", BodyFormat::Yaml).ok(),
            Some(json!({"a": 1}))
        );
    }

    #[test]
    fn malformed_bodies_are_bad_requests() {
        let err = parse_body(b"{\"a\":", BodyFormat::Json).expect_err("malformed");
        assert_eq!(err.code, 400);
        assert!(parse_body(b"a: [1, 2", BodyFormat::Yaml).is_err());
        assert_eq!(
            parse_body(b"a: 1", BodyFormat::Yaml).ok(),
            Some(json!({"a": 1}))
        );
    }
}
