//! The `customresourcedefinitions` kind's strategy (upstream
//! `apiextensions-apiserver/pkg/registry/customresourcedefinition` and the spec-level rules of
//! `pkg/apis/apiextensions/validation`): defaults, stored versions, generation, and the checks
//! of names, versions, scope, conversion and printer columns. The schema's own rules
//! (structural, CEL) are `flotilla_apiextensions`' and `flotilla_cel`'s.

use flotilla_api_machinery::field::{ErrorType, FieldError, Path};
use flotilla_api_machinery::names;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::{Value, json};

use crate::meta;
use crate::resources::Strategy;
use crate::store::UpdateTarget;
use crate::table::Column;

/// The finalizer a definition carries while its objects are deleted.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Upstream's `MaxSelectableFields`.
const MAX_SELECTABLE_FIELDS: usize = 8;

/// The strategy of `customresourcedefinitions` and their `/status`.
pub struct DefinitionStrategy;

impl Strategy for DefinitionStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        // PrepareForCreate: a fresh status whose stored versions name the storage version.
        let stored: Vec<Value> = versions(obj)
            .iter()
            .filter(|v| v["storage"] == json!(true))
            .map(|v| v["name"].clone())
            .collect();
        obj["status"] = json!({"storedVersions": stored});
    }

    fn prepare_for_update_to(&self, target: UpdateTarget, new: &mut Value, old: &Value) {
        if target == UpdateTarget::Status {
            return;
        }
        // PrepareForUpdate: status is the controllers'; a new storage version is recorded.
        new["status"] = old.get("status").cloned().unwrap_or_else(|| json!({}));
        let mut stored: Vec<Value> = new["status"]["storedVersions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for version in versions(new) {
            if version["storage"] == json!(true) && !stored.contains(&version["name"]) {
                stored.push(version["name"].clone());
            }
        }
        new["status"]["storedVersions"] = Value::Array(stored);
    }

    fn default(&self, obj: &mut Value) {
        // SetDefaults_CustomResourceDefinition(Spec).
        let spec = &mut obj["spec"];
        if !spec.is_object() {
            return;
        }
        if let Some(kind) = spec["names"]["kind"].as_str().map(str::to_string) {
            if spec["names"]["singular"].as_str().is_none_or(str::is_empty) {
                spec["names"]["singular"] = json!(kind.to_lowercase());
            }
            if spec["names"]["listKind"].as_str().is_none_or(str::is_empty) {
                spec["names"]["listKind"] = json!(format!("{kind}List"));
            }
        }
        if spec["conversion"].is_null() {
            spec["conversion"] = json!({"strategy": "None"});
        }
        if spec["conversion"]["strategy"] == json!("Webhook")
            && let Some(config) =
                spec["conversion"]["webhook"]["clientConfig"]["service"].as_object_mut()
            && !config.contains_key("port")
        {
            config.insert("port".into(), json!(443));
        }
        if let Some(versions) = spec["versions"].as_array_mut() {
            for version in versions {
                for column in version["additionalPrinterColumns"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                {
                    // The JSONPath key is `jsonPath` in v1; a missing priority is 0.
                    if column["priority"].is_null() {
                        column["priority"] = json!(0);
                    }
                }
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_definition(obj)
    }

    fn validate_update_to(
        &self,
        target: UpdateTarget,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        let mut errors = if target == UpdateTarget::Status {
            validate_names(
                &new["status"]["acceptedNames"],
                &Path::new("status").child("acceptedNames"),
            )
        } else {
            validate_definition(new)
        };
        // Upstream's ValidateCustomResourceDefinitionUpdate: the scope and the group are fixed
        // once objects may exist.
        for field in ["group", "scope"] {
            if new["spec"][field] != old["spec"][field] {
                errors.push(FieldError::invalid(
                    &Path::new("spec").child(field),
                    new["spec"][field].clone(),
                    "field is immutable",
                ));
            }
        }
        errors.extend(validate_stored_versions(new));
        errors
    }

    fn columns(&self) -> Vec<Column> {
        // Upstream serves definitions with the default table convertor.
        vec![
            crate::table::name_column(),
            Column::new(
                "Created At",
                "date",
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
                |obj| json!(meta::str_at(obj, &["metadata", "creationTimestamp"]).unwrap_or("")),
            ),
        ]
    }

    fn finalizers_on_delete(&self) -> &'static [&'static str] {
        &[CLEANUP_FINALIZER]
    }

    fn mark_deleting(&self, obj: &mut Value) {
        set_condition(
            obj,
            "Terminating",
            "True",
            "InstanceDeletionPending",
            "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
        );
    }
}

fn versions(obj: &Value) -> Vec<Value> {
    obj["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Sets (or replaces) one condition of a definition's status, keeping the transition time of
/// a condition whose status did not change.
pub fn set_condition(obj: &mut Value, kind: &str, status: &str, reason: &str, message: &str) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    let conditions = &mut obj["status"]["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else {
        return;
    };
    let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let entry = json!({
        "type": kind, "status": status, "lastTransitionTime": now,
        "reason": reason, "message": message,
    });
    match list.iter_mut().find(|c| c["type"] == json!(kind)) {
        Some(existing) => {
            let transition = if existing["status"] == json!(status) {
                existing["lastTransitionTime"].clone()
            } else {
                json!(now)
            };
            *existing = entry;
            existing["lastTransitionTime"] = transition;
        }
        None => list.push(entry),
    }
}

/// The status of a definition's condition `kind` (`"True"`, `"False"`), if it has one.
pub fn condition_status<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == json!(kind))?
        .get("status")?
        .as_str()
}

/// `ValidateCustomResourceDefinition` without the schema's own rules.
fn validate_definition(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &obj["spec"];
    let spec_path = Path::new("spec");
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    let name = meta::name(obj);
    if !name.is_empty() && name != format!("{plural}.{group}") {
        errors.push(FieldError::invalid(
            &Path::new("metadata").child("name"),
            json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errors.push(FieldError::required(&spec_path.child("group"), ""));
    } else {
        let problems = names::is_dns1123_subdomain(group);
        if !problems.is_empty() {
            errors.push(FieldError::invalid(
                &spec_path.child("group"),
                json!(group),
                problems.join(","),
            ));
        } else if !group.contains('.') {
            errors.push(FieldError::invalid(
                &spec_path.child("group"),
                json!(group),
                "should be a domain with at least one dot",
            ));
        }
    }
    match spec["scope"].as_str().unwrap_or("") {
        "Cluster" | "Namespaced" => {}
        "" => errors.push(FieldError::required(&spec_path.child("scope"), "")),
        other => errors.push(FieldError::not_supported(
            &spec_path.child("scope"),
            json!(other),
            &["Cluster", "Namespaced"],
        )),
    }
    let versions = versions(obj);
    let versions_path = spec_path.child("versions");
    if versions.is_empty() {
        errors.push(FieldError::invalid(
            &versions_path,
            json!([]),
            "must have exactly one version marked as storage version",
        ));
    }
    let mut seen = Vec::new();
    for (i, version) in versions.iter().enumerate() {
        let here = versions_path.index(i);
        let version_name = version["name"].as_str().unwrap_or("");
        let problems = names::is_dns1035_label(version_name);
        if !problems.is_empty() {
            errors.push(FieldError::invalid(
                &here.child("name"),
                json!(version_name),
                problems.join(","),
            ));
        }
        if seen.contains(&version_name) {
            errors.push(FieldError::invalid(
                &versions_path,
                Value::Array(versions.clone()),
                "must contain unique version names",
            ));
        }
        seen.push(version_name);
        let schema_path = here.child("schema").child("openAPIV3Schema");
        let schema = &version["schema"]["openAPIV3Schema"];
        if schema.is_null() {
            errors.push(FieldError::required(&schema_path, ""));
        } else {
            match serde_json::from_value::<JSONSchemaProps>(schema.clone()) {
                Ok(props) => {
                    let structural =
                        flotilla_apiextensions::validate_structural(&props, &schema_path);
                    // Rules are compiled against a structural schema only (upstream's order).
                    if structural.is_empty()
                        && let Err(rule_errors) =
                            flotilla_cel::Validator::compile_at(&props, &schema_path)
                    {
                        errors.extend(rule_errors);
                    }
                    errors.extend(structural);
                }
                Err(err) => errors.push(FieldError::invalid(
                    &schema_path,
                    Value::Null,
                    err.to_string(),
                )),
            }
            if version["subresources"]["status"].is_object() {
                errors.extend(status_root_rules(schema, &schema_path));
            }
        }
        errors.extend(validate_version_extras(version, &here));
    }
    let storage = versions
        .iter()
        .filter(|v| v["storage"] == json!(true))
        .count();
    if !versions.is_empty() && storage != 1 {
        errors.push(FieldError::invalid(
            &versions_path,
            Value::Array(versions.clone()),
            "must have exactly one version marked as storage version",
        ));
    }
    let names_path = spec_path.child("names");
    for field in ["plural", "singular", "kind", "listKind"] {
        if spec["names"][field].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required(&names_path.child(field), ""));
        }
    }
    errors.extend(validate_names(&spec["names"], &names_path));
    errors.extend(validate_conversion(
        &spec["conversion"],
        &spec_path.child("conversion"),
    ));
    errors.extend(validate_stored_versions(obj));
    errors
}

/// The subresources, printer columns, selectable fields and deprecation of one version.
fn validate_version_extras(version: &Value, here: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let scale = &version["subresources"]["scale"];
    if scale.is_object() {
        let scale_path = here.child("subresources").child("scale");
        for field in ["specReplicasPath", "statusReplicasPath"] {
            match scale[field].as_str() {
                None | Some("") => errors.push(FieldError::required(&scale_path.child(field), "")),
                Some(path) if simple_json_path(path).is_none() => errors.push(FieldError::invalid(
                    &scale_path.child(field),
                    json!(path),
                    "should be a valid path such as .spec.replicas",
                )),
                Some(path) if field == "specReplicasPath" && !path.starts_with(".spec.") => errors
                    .push(FieldError::invalid(
                        &scale_path.child(field),
                        json!(path),
                        "should be a json path under .spec",
                    )),
                Some(path) if field == "statusReplicasPath" && !path.starts_with(".status.") => {
                    errors.push(FieldError::invalid(
                        &scale_path.child(field),
                        json!(path),
                        "should be a json path under .status",
                    ))
                }
                Some(_) => {}
            }
        }
    }
    const COLUMN_TYPES: [&str; 5] = ["boolean", "date", "integer", "number", "string"];
    const COLUMN_FORMATS: [&str; 10] = [
        "byte",
        "date",
        "date-time",
        "double",
        "float",
        "int32",
        "int64",
        "name",
        "password",
        "uri",
    ];
    for (i, column) in version["additionalPrinterColumns"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let column_path = here.child("additionalPrinterColumns").index(i);
        if column["name"].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required(&column_path.child("name"), ""));
        }
        let types = COLUMN_TYPES.join(",");
        match column["type"].as_str().unwrap_or("") {
            "" => errors.push(FieldError::required(
                &column_path.child("type"),
                format!("must be one of {types}"),
            )),
            t if !COLUMN_TYPES.contains(&t) => errors.push(FieldError::invalid(
                &column_path.child("type"),
                json!(t),
                format!("must be one of {types}"),
            )),
            _ => {}
        }
        if let Some(format) = column["format"].as_str().filter(|f| !f.is_empty())
            && !COLUMN_FORMATS.contains(&format)
        {
            errors.push(FieldError::invalid(
                &column_path.child("format"),
                json!(format),
                format!("must be one of {}", COLUMN_FORMATS.join(",")),
            ));
        }
        match column["jsonPath"].as_str().unwrap_or("") {
            "" => errors.push(FieldError::required(&column_path.child("JSONPath"), "")),
            path if crate::apiextensions::columns::parse(path).is_err() => {
                errors.push(FieldError::invalid(
                    &column_path.child("JSONPath"),
                    json!(path),
                    "must be a simple json path starting with .",
                ))
            }
            _ => {}
        }
    }
    let mut selectable = Vec::new();
    for (i, field) in version["selectableFields"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field_path = here.child("selectableFields").index(i).child("jsonPath");
        match field["jsonPath"].as_str().unwrap_or("") {
            "" => errors.push(FieldError::required(&field_path, "")),
            path if path.starts_with(".metadata") => errors.push(FieldError::invalid(
                &field_path,
                json!(path),
                "must not point to fields in metadata",
            )),
            path if simple_json_path(path).is_none() => errors.push(FieldError::invalid(
                &field_path,
                json!(path),
                "is an invalid path",
            )),
            path if selectable.contains(&path) => {
                errors.push(FieldError::duplicate(&field_path, json!(path)))
            }
            path => selectable.push(path),
        }
    }
    if selectable.len() > MAX_SELECTABLE_FIELDS {
        errors.push(FieldError {
            error_type: ErrorType::TooMany,
            field: here.child("selectableFields").to_string(),
            bad_value: Some(json!(selectable.len())),
            detail: format!("must have at most {MAX_SELECTABLE_FIELDS} items"),
        });
    }
    if let Some(warning) = version["deprecationWarning"].as_str()
        && warning.len() > 256
    {
        errors.push(FieldError::too_long(&here.child("deprecationWarning"), 256));
    }
    errors
}

/// Upstream's `allowedFieldsAtRootSchema`, as JSON names.
const ALLOWED_AT_ROOT_WITH_STATUS: [&str; 22] = [
    "description",
    "type",
    "format",
    "title",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "required",
    "items",
    "properties",
    "externalDocs",
    "example",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
];

/// With a status subresource the root must be an object of plain properties (its `status`
/// property is what the subresource validates).
fn status_root_rules(schema: &Value, here: &Path) -> Vec<FieldError> {
    let Some(root) = schema.as_object() else {
        return Vec::new();
    };
    if let Some(kind) = root.get("type").and_then(Value::as_str)
        && kind != "object"
    {
        return vec![FieldError::invalid(
            &here.child("type"),
            json!(kind),
            "only \"object\" is allowed as the type at the root of the schema if the status subresource is enabled",
        )];
    }
    if root
        .keys()
        .any(|key| !ALLOWED_AT_ROOT_WITH_STATUS.contains(&key.as_str()))
    {
        let allowed: Vec<String> = [
            "Description",
            "Type",
            "Format",
            "Title",
            "Maximum",
            "ExclusiveMaximum",
            "Minimum",
            "ExclusiveMinimum",
            "MaxLength",
            "MinLength",
            "Pattern",
            "MaxItems",
            "MinItems",
            "UniqueItems",
            "MultipleOf",
            "Required",
            "Items",
            "Properties",
            "ExternalDocs",
            "Example",
            "XPreserveUnknownFields",
            "XValidations",
        ]
        .iter()
        .map(ToString::to_string)
        .collect();
        return vec![FieldError::invalid(
            here,
            schema.clone(),
            format!(
                "only [{}] fields are allowed at the root of the schema if the status subresource is enabled",
                allowed.join(" ")
            ),
        )];
    }
    Vec::new()
}

/// `.spec.replicas` as its field names, when the path is that simple (what scale paths and
/// selectable fields may be).
pub fn simple_json_path(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('.')?;
    let parts: Vec<String> = rest.split('.').map(str::to_string).collect();
    parts
        .iter()
        .all(|p| !p.is_empty() && !p.contains(['[', ']', '*', '@', '$']))
        .then_some(parts)
}

/// `ValidateCustomResourceDefinitionNames`.
fn validate_names(names_value: &Value, here: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let text = |field: &str| names_value[field].as_str().unwrap_or("").to_string();
    for field in ["plural", "singular"] {
        let value = text(field);
        let problems = names::is_dns1035_label(&value);
        if !value.is_empty() && !problems.is_empty() {
            errors.push(FieldError::invalid(
                &here.child(field),
                json!(value),
                problems.join(","),
            ));
        }
    }
    for field in ["kind", "listKind"] {
        let value = text(field);
        let problems = names::is_dns1035_label(&value.to_lowercase());
        if !value.is_empty() && !problems.is_empty() {
            errors.push(FieldError::invalid(
                &here.child(field),
                json!(value),
                format!(
                    "may have mixed case, but should otherwise match: {}",
                    problems.join(",")
                ),
            ));
        }
    }
    for list in ["shortNames", "categories"] {
        for (i, item) in names_value[list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let value = item.as_str().unwrap_or("");
            let problems = names::is_dns1035_label(value);
            if !problems.is_empty() {
                errors.push(FieldError::invalid(
                    &here.child(list).index(i),
                    json!(value),
                    problems.join(","),
                ));
            }
        }
    }
    let kind = text("kind");
    if !kind.is_empty() && kind == text("listKind") {
        errors.push(FieldError::invalid(
            &here.child("listKind"),
            json!(kind),
            "kind and listKind may not be the same",
        ));
    }
    errors
}

/// `validateCustomResourceConversion` (v1: the webhook's client config and review versions).
fn validate_conversion(conversion: &Value, here: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match conversion["strategy"].as_str().unwrap_or("None") {
        "None" => {
            if !conversion["webhook"].is_null() {
                errors.push(FieldError::forbidden(
                    &here.child("webhook"),
                    "should not be set when strategy is not set to Webhook",
                ));
            }
        }
        "Webhook" => {
            let webhook = &conversion["webhook"];
            if webhook.is_null() {
                errors.push(FieldError::required(
                    &here.child("webhook"),
                    "required when strategy is set to Webhook",
                ));
                return errors;
            }
            errors.extend(crate::strategies::webhooks::validate_client_config(
                &webhook["clientConfig"],
                &here.child("webhook").child("clientConfig"),
            ));
            let reviews: Vec<&str> = webhook["conversionReviewVersions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let reviews_path = here.child("webhook").child("conversionReviewVersions");
            if reviews.is_empty() {
                errors.push(FieldError::required(&reviews_path, ""));
            } else if !reviews.iter().any(|v| matches!(*v, "v1" | "v1beta1")) {
                errors.push(FieldError::invalid(
                    &reviews_path,
                    json!(reviews),
                    "must include at least one of v1, v1beta1",
                ));
            }
        }
        other => errors.push(FieldError::not_supported(
            &here.child("strategy"),
            json!(other),
            &["None", "Webhook"],
        )),
    }
    errors
}

/// `ValidateCustomResourceDefinitionStoredVersions`.
fn validate_stored_versions(obj: &Value) -> Vec<FieldError> {
    let stored: Vec<&str> = obj["status"]["storedVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let here = Path::new("status").child("storedVersions");
    let versions = versions(obj);
    if stored.is_empty() {
        return vec![FieldError::invalid(
            &here,
            json!([]),
            "must have at least one stored version",
        )];
    }
    let mut errors = Vec::new();
    if let Some(storage) = versions.iter().find(|v| v["storage"] == json!(true))
        && let Some(name) = storage["name"].as_str()
        && !stored.contains(&name)
    {
        errors.push(FieldError::invalid(
            &here,
            json!(stored),
            format!("must have the storage version {name}"),
        ));
    }
    for (i, version) in stored.iter().enumerate() {
        if !versions.iter().any(|v| v["name"] == json!(version)) {
            errors.push(FieldError::invalid(
                &here.index(i),
                json!(version),
                format!("missing from spec.versions; {version} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {version} and removes {version} from status.storedVersions"),
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget() -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object"}}}],
            },
        })
    }

    fn prepared(mut obj: Value) -> Value {
        DefinitionStrategy.prepare_for_create(&mut obj);
        DefinitionStrategy.default(&mut obj);
        obj
    }

    #[test]
    fn a_plain_definition_is_defaulted_and_valid() {
        let obj = prepared(widget());
        assert_eq!(obj["spec"]["names"]["singular"], "widget");
        assert_eq!(obj["spec"]["names"]["listKind"], "WidgetList");
        assert_eq!(obj["spec"]["conversion"]["strategy"], "None");
        assert_eq!(obj["status"]["storedVersions"], json!(["v1"]));
        assert_eq!(DefinitionStrategy.validate(&obj), vec![]);
    }

    #[test]
    fn bad_definitions_get_upstreams_messages() {
        let mut obj = widget();
        obj["metadata"]["name"] = json!("gadgets.example.com");
        obj["spec"]["group"] = json!("example");
        obj["spec"]["versions"][0]["storage"] = json!(false);
        let errors: Vec<String> = DefinitionStrategy
            .validate(&prepared(obj))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert!(errors.contains(&"metadata.name: Invalid value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group".to_string()), "{errors:?}");
        assert!(
            errors.contains(
                &"spec.group: Invalid value: \"example\": should be a domain with at least one dot"
                    .to_string()
            ),
            "{errors:?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.ends_with("must have exactly one version marked as storage version")),
            "{errors:?}"
        );
    }

    #[test]
    fn conversion_webhooks_need_an_https_url_or_a_service() {
        let mut obj = widget();
        obj["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": "https://convert.example.com/convert"},
            "conversionReviewVersions": ["v1"]}});
        assert!(
            DefinitionStrategy
                .validate(&prepared(obj.clone()))
                .is_empty()
        );
        obj["spec"]["conversion"]["webhook"]["clientConfig"] =
            json!({"url": "http://convert.example.com"});
        let errors: Vec<String> = DefinitionStrategy
            .validate(&prepared(obj))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.conversion.webhook.clientConfig.url: Invalid value: \"http://convert.example.com\": 'https' is the only allowed URL scheme"
            ]
        );
    }

    #[test]
    fn group_and_scope_are_immutable() {
        let old = prepared(widget());
        let mut new = old.clone();
        new["spec"]["scope"] = json!("Cluster");
        let errors = DefinitionStrategy.validate_update_to(UpdateTarget::Main, &new, &old);
        assert!(
            errors
                .iter()
                .any(|e| e.to_string()
                    == "spec.scope: Invalid value: \"Cluster\": field is immutable"),
            "{errors:?}"
        );
    }
}
