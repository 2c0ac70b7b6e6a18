//! Strategies of the configuration kinds: ConfigMaps and Secrets (upstream's 1 MiB data
//! limit, `stringData`), ServiceAccounts and core Events.

use super::*;

/// Upstream's `core.MaxSecretSize`: what a ConfigMap's or a Secret's data may hold in all.
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// The bytes of a map of base64 values once decoded (what upstream counts; a value that is
/// not base64 counts as its text, and fails elsewhere).
fn decoded_bytes(values: Option<&Value>) -> usize {
    use base64::Engine;
    values
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(_, value)| {
            let text = value.as_str().unwrap_or_default();
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_or(text.len(), |bytes| bytes.len())
        })
        .sum()
}

/// The bytes of a map of plain string values.
fn string_bytes(values: Option<&Value>) -> usize {
    values
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(_, value)| value.as_str().map_or(0, str::len))
        .sum()
}

/// ConfigMaps: the Data column; `data` and `binaryData` together at most 1 MiB.
pub struct ConfigMapStrategy;
impl Strategy for ConfigMapStrategy {
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let total = string_bytes(obj.get("data")) + decoded_bytes(obj.get("binaryData"));
        if total > MAX_SECRET_SIZE {
            // Upstream reports it on the empty path.
            return vec![FieldError::too_long(&Path::new(""), MAX_SECRET_SIZE)];
        }
        Vec::new()
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Data",
                "string",
                "The number of entries in the config map.",
                |o| json!(object_len(o, &["data"]) + object_len(o, &["binaryData"])),
            ),
            age_column(),
        ]
    }
}

/// Secrets: `Opaque` by default, the `type` field label.
pub struct SecretStrategy;
const SECRET_FIELDS: &[FieldLabel] = &[FieldLabel::new("type", &["type"])];

impl Strategy for SecretStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        SECRET_FIELDS
    }
    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        if decoded_bytes(obj.get("data")) > MAX_SECRET_SIZE {
            return vec![FieldError::too_long(&Path::new("data"), MAX_SECRET_SIZE)];
        }
        Vec::new()
    }
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["type"], json!("Opaque"));
        merge_string_data(obj);
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Type", "string", "The type of the secret", |o| {
                json!(str_at(o, &["type"]).unwrap_or(""))
            }),
            Column::new(
                "Data",
                "string",
                "The number of entries in the secret",
                |o| json!(object_len(o, &["data"])),
            ),
            age_column(),
        ]
    }
}

/// `stringData` is write-only: its entries are base64-encoded into `data`, overriding entries
/// of the same key, and it is never stored (upstream's v1 → internal conversion).
fn merge_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(Value::Object(string_data)) = obj.as_object_mut().and_then(|o| o.remove("stringData"))
    else {
        return;
    };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    if let Some(data) = obj["data"].as_object_mut() {
        for (key, value) in string_data {
            let text = value.as_str().unwrap_or_default();
            data.insert(
                key,
                json!(base64::engine::general_purpose::STANDARD.encode(text)),
            );
        }
    }
}

/// ServiceAccounts: the Secrets column.
pub struct ServiceAccountStrategy;
impl Strategy for ServiceAccountStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("Secrets", "string", "The number of secrets", |o| {
                json!(array_len(o, &["secrets"]))
            }),
            age_column(),
        ]
    }
}

/// core/v1 Events: involvedObject and reason field labels, the event table.
pub struct CoreEventStrategy;
const EVENT_FIELDS: &[FieldLabel] = &[
    FieldLabel::new("involvedObject.kind", &["involvedObject", "kind"]),
    FieldLabel::new("involvedObject.namespace", &["involvedObject", "namespace"]),
    FieldLabel::new("involvedObject.name", &["involvedObject", "name"]),
    FieldLabel::new("involvedObject.uid", &["involvedObject", "uid"]),
    FieldLabel::new(
        "involvedObject.apiVersion",
        &["involvedObject", "apiVersion"],
    ),
    FieldLabel::new(
        "involvedObject.resourceVersion",
        &["involvedObject", "resourceVersion"],
    ),
    FieldLabel::new("involvedObject.fieldPath", &["involvedObject", "fieldPath"]),
    FieldLabel::new("reason", &["reason"]),
    FieldLabel::new("reportingComponent", &["reportingComponent"]),
    FieldLabel::new("source", &["source", "component"]),
    FieldLabel::new("type", &["type"]),
];

impl Strategy for CoreEventStrategy {
    fn field_labels(&self) -> &'static [FieldLabel] {
        EVENT_FIELDS
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            Column::new(
                "Last Seen",
                "string",
                "The last time the event was seen",
                |o| {
                    json!(crate::table::since(
                        str_at(o, &["lastTimestamp"]).or_else(|| str_at(o, &["eventTime"]))
                    ))
                },
            ),
            Column::new("Type", "string", "The type of the event", |o| {
                json!(str_at(o, &["type"]).unwrap_or(""))
            }),
            Column::new("Reason", "string", "The reason of the event", |o| {
                json!(str_at(o, &["reason"]).unwrap_or(""))
            }),
            Column::new("Object", "string", "The object the event is about", |o| {
                let kind = str_at(o, &["involvedObject", "kind"])
                    .unwrap_or("")
                    .to_lowercase();
                json!(format!(
                    "{kind}/{}",
                    str_at(o, &["involvedObject", "name"]).unwrap_or("")
                ))
            }),
            Column::new("Message", "string", "The message of the event", |o| {
                json!(str_at(o, &["message"]).unwrap_or(""))
            }),
            // Upstream's event printer shows the name only with `-o wide`, last.
            name_column().wide(),
        ]
    }
}
