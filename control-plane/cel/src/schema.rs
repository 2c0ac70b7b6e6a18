//! The structural view of a CRD schema the rules run against (upstream `schema.Structural`) and
//! its CEL declaration (`model.SchemaDeclType` / `apiservercel.DeclType`): which fields a rule
//! can name, with which types, and the size bounds the cost estimate multiplies by.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, ValidationRule,
};

use crate::escaping;
use crate::limits::MAX_REQUEST_SIZE_BYTES;

/// The parts of a `JSONSchemaProps` that CEL validation reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Structural {
    pub type_: String,
    pub format: String,
    pub int_or_string: bool,
    pub embedded_resource: bool,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub map_type: Option<String>,
    /// `None` and an empty map differ: only an object with properties is a CEL object type.
    pub properties: Option<BTreeMap<String, Structural>>,
    pub additional_properties: Option<Box<Structural>>,
    pub items: Option<Box<Structural>>,
    pub max_items: Option<i64>,
    pub max_length: Option<i64>,
    pub max_properties: Option<i64>,
    pub required: Vec<String>,
    pub has_default: bool,
    pub enum_: Vec<serde_json::Value>,
    pub validations: Vec<ValidationRule>,
    /// `allOf` branches: upstream runs their rules against this node's value and type.
    pub all_of: Vec<Structural>,
}

impl Structural {
    /// The structural view of a CRD schema.
    pub fn from_props(props: &JSONSchemaProps) -> Structural {
        let items = match &props.items {
            Some(JSONSchemaPropsOrArray::Schema(schema)) => {
                Some(Box::new(Structural::from_props(schema)))
            }
            // a structural schema never has tuple items; the first one is the closest reading
            Some(JSONSchemaPropsOrArray::Schemas(schemas)) => {
                schemas.first().map(|s| Box::new(Structural::from_props(s)))
            }
            None => None,
        };
        let additional_properties = match &props.additional_properties {
            Some(JSONSchemaPropsOrBool::Schema(schema)) => {
                Some(Box::new(Structural::from_props(schema)))
            }
            _ => None,
        };
        Structural {
            type_: props.type_.clone().unwrap_or_default(),
            format: props.format.clone().unwrap_or_default(),
            int_or_string: props.x_kubernetes_int_or_string.unwrap_or(false),
            embedded_resource: props.x_kubernetes_embedded_resource.unwrap_or(false),
            list_type: props.x_kubernetes_list_type.clone(),
            list_map_keys: props.x_kubernetes_list_map_keys.clone().unwrap_or_default(),
            map_type: props.x_kubernetes_map_type.clone(),
            properties: props.properties.as_ref().map(|properties| {
                properties
                    .iter()
                    .map(|(name, p)| (name.clone(), Structural::from_props(p)))
                    .collect()
            }),
            additional_properties,
            items,
            max_items: props.max_items,
            max_length: props.max_length,
            max_properties: props.max_properties,
            required: props.required.clone().unwrap_or_default(),
            has_default: props.default.is_some(),
            enum_: props
                .enum_
                .as_ref()
                .map(|values| values.iter().map(|v| v.0.clone()).collect())
                .unwrap_or_default(),
            validations: props.x_kubernetes_validations.clone().unwrap_or_default(),
            all_of: props
                .all_of
                .as_ref()
                .map(|all| all.iter().map(Structural::from_props).collect())
                .unwrap_or_default(),
        }
    }

    /// Whether this node or anything below it carries rules (`hasXValidations`).
    pub fn has_validations(&self) -> bool {
        !self.validations.is_empty()
            || !self.all_of.is_empty()
            || self.items.as_ref().is_some_and(|s| s.has_validations())
            || self
                .additional_properties
                .as_ref()
                .is_some_and(|s| s.has_validations())
            || self
                .properties
                .as_ref()
                .is_some_and(|p| p.values().any(Structural::has_validations))
    }

    /// This schema with `kind`, `apiVersion` and `metadata.{name,generateName}` declared, as
    /// they are always readable at the root of a resource (`WithTypeAndObjectMeta`).
    pub fn with_type_and_object_meta(&self) -> Structural {
        let declared = |name: &str, type_: &str| {
            self.properties
                .as_ref()
                .and_then(|p| p.get(name))
                .is_some_and(|s| s.type_ == type_)
        };
        let metadata_declares = |name: &str| {
            self.properties
                .as_ref()
                .and_then(|p| p.get("metadata"))
                .and_then(|m| m.properties.as_ref())
                .and_then(|p| p.get(name))
                .is_some_and(|s| s.type_ == "string")
        };
        if declared("kind", "string")
            && declared("apiVersion", "string")
            && declared("metadata", "object")
            && metadata_declares("name")
            && metadata_declares("generateName")
        {
            return self.clone();
        }
        let string = || Structural {
            type_: "string".to_string(),
            ..Structural::default()
        };
        let mut result = self.clone();
        let properties = result.properties.get_or_insert_with(BTreeMap::new);
        properties.insert("kind".to_string(), string());
        properties.insert("apiVersion".to_string(), string());
        properties.insert(
            "metadata".to_string(),
            Structural {
                type_: "object".to_string(),
                properties: Some(BTreeMap::from([
                    ("name".to_string(), string()),
                    ("generateName".to_string(), string()),
                ])),
                ..Structural::default()
            },
        );
        result
    }
}

/// A CEL type declared from a schema, with the bounds the cost estimate uses.
#[derive(Debug, Clone)]
pub(crate) struct DeclType {
    pub kind: DeclKind,
    /// The most elements (list items, map entries, string bytes) a value can have.
    pub max_elements: i64,
    /// The fewest bytes a value takes serialized, which bounds how many fit in a request.
    pub min_serialized_size: i64,
}

#[derive(Debug, Clone)]
pub(crate) enum DeclKind {
    /// `x-kubernetes-int-or-string`: checked at runtime only.
    Dyn,
    Bool,
    Int,
    /// Only declared for admission variables whose expression yields a `uint`.
    Uint,
    Double,
    String,
    Bytes,
    Duration,
    Timestamp,
    List(Arc<DeclType>),
    /// String keys to values of one type (`additionalProperties`).
    Map(Arc<DeclType>),
    /// Declared properties, keyed by their escaped CEL names.
    Object(BTreeMap<String, DeclField>),
}

#[derive(Debug, Clone)]
pub(crate) struct DeclField {
    pub ty: Arc<DeclType>,
    /// Only used to document the declaration; CEL presence is always tested with `has()`.
    #[allow(dead_code)]
    pub required: bool,
}

const MIN_STRING_SIZE: i64 = 2;
const MIN_BOOL_SIZE: i64 = 4;
const MIN_NUMBER_SIZE: i64 = 1;
const MAX_DURATION_SIZE_JSON: i64 = 32;
const MIN_DURATION_SIZE_JSON: i64 = 3;
const JSON_DATE_SIZE: i64 = 12;
const MAX_DATETIME_SIZE_JSON: i64 = 32;
const MIN_DATETIME_SIZE_JSON: i64 = 21;

impl DeclType {
    pub(crate) fn simple(kind: DeclKind, min_size: i64, max_elements: i64) -> Arc<DeclType> {
        Arc::new(DeclType {
            kind,
            max_elements,
            min_serialized_size: min_size,
        })
    }

    /// The CEL type name as cel-go prints it in compile errors.
    pub fn type_name(&self) -> String {
        match &self.kind {
            DeclKind::Dyn => "dyn".to_string(),
            DeclKind::Bool => "bool".to_string(),
            DeclKind::Int => "int".to_string(),
            DeclKind::Uint => "uint".to_string(),
            DeclKind::Double => "double".to_string(),
            DeclKind::String => "string".to_string(),
            DeclKind::Bytes => "bytes".to_string(),
            DeclKind::Duration => "google.protobuf.Duration".to_string(),
            DeclKind::Timestamp => "google.protobuf.Timestamp".to_string(),
            DeclKind::List(elem) => format!("list({})", elem.type_name()),
            DeclKind::Map(elem) => format!("map(string, {})", elem.type_name()),
            DeclKind::Object(_) => "object".to_string(),
        }
    }
}

/// The CEL declaration of a schema node (`SchemaDeclType`), or `None` when rules cannot see it:
/// an untyped node, or a list or map whose elements cannot be seen.
pub(crate) fn schema_decl_type(s: &Structural, is_resource_root: bool) -> Option<Arc<DeclType>> {
    if s.int_or_string {
        // the largest string a request can carry; the smallest value is `0`
        return Some(DeclType::simple(
            DeclKind::Dyn,
            1,
            MAX_REQUEST_SIZE_BYTES - 2,
        ));
    }
    let with_meta;
    let s = if is_resource_root {
        with_meta = s.with_type_and_object_meta();
        &with_meta
    } else {
        s
    };
    match s.type_.as_str() {
        "array" => {
            let items = s.items.as_ref()?;
            let item_type = schema_decl_type(items, items.embedded_resource)?;
            let max_items = match s.max_items {
                Some(max) => max.max(0),
                // `[` and `]`, then one comma per item
                None => (MAX_REQUEST_SIZE_BYTES - 2) / (item_type.min_serialized_size + 1),
            };
            Some(Arc::new(DeclType {
                kind: DeclKind::List(item_type),
                max_elements: max_items,
                min_serialized_size: 2,
            }))
        }
        "object" => {
            if let Some(additional) = &s.additional_properties {
                let value_type = schema_decl_type(additional, additional.embedded_resource)?;
                let max_properties = match s.max_properties {
                    Some(max) => max.max(0),
                    // a two-character key, quotes, colon and comma around each value
                    None => (MAX_REQUEST_SIZE_BYTES - 2) / (value_type.min_serialized_size + 6),
                };
                return Some(Arc::new(DeclType {
                    kind: DeclKind::Map(value_type),
                    max_elements: max_properties,
                    min_serialized_size: 2,
                }));
            }
            let mut fields = BTreeMap::new();
            let mut min_size = 2;
            for (name, prop) in s.properties.iter().flatten() {
                let Some(field_type) = schema_decl_type(prop, prop.embedded_resource) else {
                    continue;
                };
                let required = s.required.contains(name);
                // defaulted fields are filled in server-side, so they need not be sent
                if required && !prop.has_default {
                    min_size += name.len() as i64 + field_type.min_serialized_size + 4;
                }
                if let Some(escaped) = escaping::escape(name) {
                    fields.insert(
                        escaped,
                        DeclField {
                            ty: field_type,
                            required,
                        },
                    );
                }
            }
            Some(Arc::new(DeclType {
                kind: DeclKind::Object(fields),
                max_elements: 0,
                min_serialized_size: min_size,
            }))
        }
        "string" => {
            let (kind, min_size, max) = match s.format.as_str() {
                "byte" => (
                    DeclKind::Bytes,
                    MIN_STRING_SIZE,
                    s.max_length
                        .map_or(MAX_REQUEST_SIZE_BYTES - 2, |max| max.max(0)),
                ),
                "duration" => (
                    DeclKind::Duration,
                    MIN_DURATION_SIZE_JSON,
                    MAX_DURATION_SIZE_JSON,
                ),
                "date" => (DeclKind::Timestamp, JSON_DATE_SIZE, JSON_DATE_SIZE),
                "date-time" => (
                    DeclKind::Timestamp,
                    MIN_DATETIME_SIZE_JSON,
                    MAX_DATETIME_SIZE_JSON,
                ),
                _ => {
                    let max = match s.max_length {
                        // maxLength counts code points, which take up to 4 bytes each
                        Some(max) => max.max(0) * 4,
                        None if !s.enum_.is_empty() => s
                            .enum_
                            .iter()
                            .filter_map(serde_json::Value::as_str)
                            .map(|v| v.len() as i64)
                            .max()
                            .unwrap_or(0),
                        None => MAX_REQUEST_SIZE_BYTES - 2,
                    };
                    (DeclKind::String, MIN_STRING_SIZE, max)
                }
            };
            Some(DeclType::simple(kind, min_size, max))
        }
        "boolean" => Some(DeclType::simple(DeclKind::Bool, MIN_BOOL_SIZE, 0)),
        "number" => Some(DeclType::simple(DeclKind::Double, MIN_NUMBER_SIZE, 0)),
        "integer" => Some(DeclType::simple(DeclKind::Int, MIN_NUMBER_SIZE, 0)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn structural(schema: serde_json::Value) -> Structural {
        let props: JSONSchemaProps =
            serde_json::from_value(schema).unwrap_or_else(|e| panic!("{e}"));
        Structural::from_props(&props)
    }

    #[test]
    fn declares_fields_with_escaped_names() {
        let s = structural(json!({
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "maxLength": 10},
                "foo-bar": {"type": "integer"},
                "namespace": {"type": "string"},
                "1bad": {"type": "string"},
                "untyped": {"x-kubernetes-preserve-unknown-fields": true},
            }
        }));
        let decl = schema_decl_type(&s, false).unwrap_or_else(|| panic!("declared"));
        let DeclKind::Object(fields) = &decl.kind else {
            panic!("object expected")
        };
        let names: Vec<&str> = fields.keys().map(String::as_str).collect();
        assert_eq!(names, ["__namespace__", "foo__dash__bar", "name"]);
        assert_eq!(fields["name"].ty.max_elements, 40);
        // `{}` plus `"name":""` and separators
        assert_eq!(decl.min_serialized_size, 2 + 4 + 2 + 4);
    }

    #[test]
    fn bounds_unbounded_lists_by_the_request_size() {
        let s = structural(json!({"type": "array", "items": {"type": "integer"}}));
        let decl = schema_decl_type(&s, false).unwrap_or_else(|| panic!("declared"));
        assert_eq!(decl.max_elements, (3 * 1024 * 1024 - 2) / 2);
        let bounded =
            structural(json!({"type": "array", "maxItems": 5, "items": {"type": "string"}}));
        let decl = schema_decl_type(&bounded, false).unwrap_or_else(|| panic!("declared"));
        assert_eq!(decl.max_elements, 5);
    }

    #[test]
    fn resource_roots_expose_type_and_object_meta() {
        let s = structural(json!({"type": "object", "properties": {"spec": {"type": "object"}}}));
        let decl = schema_decl_type(&s, true).unwrap_or_else(|| panic!("declared"));
        let DeclKind::Object(fields) = &decl.kind else {
            panic!("object expected")
        };
        assert!(fields.contains_key("apiVersion") && fields.contains_key("kind"));
        let DeclKind::Object(meta) = &fields["metadata"].ty.kind else {
            panic!("object expected")
        };
        assert!(meta.contains_key("name") && meta.contains_key("generateName"));
    }

    #[test]
    fn hides_what_rules_cannot_see() {
        for schema in [
            json!({"type": "array"}),
            json!({"x-kubernetes-preserve-unknown-fields": true}),
            json!({"type": "object", "additionalProperties": {"x-kubernetes-preserve-unknown-fields": true}}),
        ] {
            assert!(
                schema_decl_type(&structural(schema.clone()), false).is_none(),
                "{schema}"
            );
        }
    }
}
