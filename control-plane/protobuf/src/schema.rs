//! The message schemas of the built-in Kubernetes types, read from the descriptor set compiled
//! into this crate, plus the JSON knowledge the descriptors do not carry.
//!
//! `descriptors/kubernetes-1.33.binpb` is the `FileDescriptorSet` that every `generated.pb.go`
//! of k8s.io/api and k8s.io/apimachinery registers (see `descriptors/extract.py`). Unlike the
//! published `generated.proto` files it keeps the gogoproto field options, and those tell what
//! the Go struct looks like: `nullable=false` marks a value (non-pointer) field and
//! `customname` is the Go field name. The field names themselves are the JSON names.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::error::{Path, ProtobufError};
use crate::wire::{Reader, WireValue};

/// The compiled-in descriptor set.
const DESCRIPTORS: &[u8] = include_bytes!("../descriptors/kubernetes-1.33.binpb");

/// The fields Go's encoding/json writes even when zero or nil (no `omitempty`), which the
/// descriptors cannot tell: `<message> <proto field> <zero>` per line, generated from the Go
/// types by `descriptors/json_zero_fields.py`.
const JSON_ZERO_FIELDS: &str = include_str!("../descriptors/json-zero-fields.txt");

/// gogoproto's `nullable` field option: absent or true means a Go pointer (or slice/map).
const GOGO_NULLABLE: u32 = 65001;
/// gogoproto's `customname` field option: the Go field name.
const GOGO_CUSTOMNAME: u32 = 65004;

/// Go types embedded in a parent struct with `json:",inline"`: their fields appear directly in
/// the parent's JSON object. The descriptors cannot tell these from embedded structs that have
/// a JSON name (see [`NAMED_EMBEDDED_TYPES`]), so the split is written down here; a test fails
/// when a new descriptor set brings an embedded type in neither list.
pub(crate) const INLINE_TYPES: &[&str] = &[
    "DeviceConfiguration",
    "EphemeralContainerCommon",
    "IngressRuleValue",
    "LocalObjectReference",
    "PersistentVolumeSource",
    "ProbeHandler",
    "Rule",
    "RuleWithOperations",
    "TypeMeta",
    "VolumeSource",
];

/// Embedded Go structs (or fields named like their type) that keep their own JSON key. Only
/// the classification test needs the list: not being inline is the default.
#[cfg(test)]
pub(crate) const NAMED_EMBEDDED_TYPES: &[&str] = &[
    "LimitResponse",
    "ListMeta",
    "ObjectMeta",
    "PodAffinityTerm",
    "PodSignature",
    "RoleRef",
    "Time",
    "UserInfo",
];

/// Fields whose protobuf name is not their JSON name: go-to-protobuf takes the name from the
/// `protobuf:"...,name=X"` struct tag, and these few tags spell it differently from the `json`
/// tag. Keyed by (Go type name, protobuf name), as they recur across API versions. Found by
/// comparing every type against k8s-openapi (see the schema tests). `DaemonEndpoint.Port` is
/// not here: its JSON name really is `Port`.
const JSON_NAME_OVERRIDES: &[(&str, &str, &str)] = &[
    ("BoundObjectReference", "uID", "uid"),
    ("IngressClassParametersReference", "aPIGroup", "apiGroup"),
    ("MutatingWebhookConfiguration", "Webhooks", "webhooks"),
    ("ValidatingWebhookConfiguration", "Webhooks", "webhooks"),
    ("Validation", "Expression", "expression"),
    ("Variable", "Expression", "expression"),
    ("Variable", "Name", "name"),
    // CustomResourceDefinition schemas: JSON Schema's own names.
    ("JSONSchemaProps", "schema", "$schema"),
    ("JSONSchemaProps", "ref", "$ref"),
    (
        "JSONSchemaProps",
        "xKubernetesPreserveUnknownFields",
        "x-kubernetes-preserve-unknown-fields",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesEmbeddedResource",
        "x-kubernetes-embedded-resource",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesIntOrString",
        "x-kubernetes-int-or-string",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesListMapKeys",
        "x-kubernetes-list-map-keys",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesListType",
        "x-kubernetes-list-type",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesMapType",
        "x-kubernetes-map-type",
    ),
    (
        "JSONSchemaProps",
        "xKubernetesValidations",
        "x-kubernetes-validations",
    ),
];

/// The JSON name of a field.
fn json_name<'a>(message: &str, proto_name: &'a str) -> &'a str {
    let type_name = simple_name(message);
    JSON_NAME_OVERRIDES
        .iter()
        .find(|(ty, proto, _)| *ty == type_name && *proto == proto_name)
        .map_or(proto_name, |(_, _, json)| json)
}

/// API group → proto package prefix (the version is appended). Written out rather than derived
/// from the group's first DNS label so that a CRD group such as `apps.example.com` can never be
/// mistaken for a built-in one.
const GROUP_PACKAGES: &[(&str, &str)] = &[
    ("", "k8s.io.api.core"),
    ("admission.k8s.io", "k8s.io.api.admission"),
    (
        "apiextensions.k8s.io",
        "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions",
    ),
    (
        "apiregistration.k8s.io",
        "k8s.io.kube_aggregator.pkg.apis.apiregistration",
    ),
    (
        "admissionregistration.k8s.io",
        "k8s.io.api.admissionregistration",
    ),
    ("apidiscovery.k8s.io", "k8s.io.api.apidiscovery"),
    ("apps", "k8s.io.api.apps"),
    ("authentication.k8s.io", "k8s.io.api.authentication"),
    ("authorization.k8s.io", "k8s.io.api.authorization"),
    ("autoscaling", "k8s.io.api.autoscaling"),
    ("batch", "k8s.io.api.batch"),
    ("certificates.k8s.io", "k8s.io.api.certificates"),
    ("coordination.k8s.io", "k8s.io.api.coordination"),
    ("discovery.k8s.io", "k8s.io.api.discovery"),
    ("events.k8s.io", "k8s.io.api.events"),
    ("extensions", "k8s.io.api.extensions"),
    ("flowcontrol.apiserver.k8s.io", "k8s.io.api.flowcontrol"),
    ("imagepolicy.k8s.io", "k8s.io.api.imagepolicy"),
    ("internal.apiserver.k8s.io", "k8s.io.api.apiserverinternal"),
    ("meta.k8s.io", "k8s.io.apimachinery.pkg.apis.meta"),
    ("metrics.k8s.io", "k8s.io.metrics.pkg.apis.metrics"),
    ("networking.k8s.io", "k8s.io.api.networking"),
    ("node.k8s.io", "k8s.io.api.node"),
    ("policy", "k8s.io.api.policy"),
    ("rbac.authorization.k8s.io", "k8s.io.api.rbac"),
    ("resource.k8s.io", "k8s.io.api.resource"),
    ("scheduling.k8s.io", "k8s.io.api.scheduling"),
    ("storage.k8s.io", "k8s.io.api.storage"),
    ("storagemigration.k8s.io", "k8s.io.api.storagemigration"),
];

/// meta/v1 kinds that apimachinery registers into every group version (options, watch events)
/// or as unversioned types (Status, discovery documents).
const META_KINDS: &[&str] = &[
    "APIGroup",
    "APIGroupList",
    "APIResourceList",
    "APIVersions",
    "CreateOptions",
    "DeleteOptions",
    "GetOptions",
    "ListOptions",
    "PartialObjectMetadata",
    "PartialObjectMetadataList",
    "PatchOptions",
    "Status",
    "UpdateOptions",
    "WatchEvent",
];

/// Types whose Go JSON form is not the plain struct form (custom MarshalJSON, or a Go slice
/// type that protobuf has to wrap in a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    /// `resource.Quantity{string=1}` → `"100m"`.
    Quantity,
    /// `intstr.IntOrString{type=1,intVal=2,strVal=3}` → `80` or `"http"`.
    IntOrString,
    /// `metav1.Time{seconds=1,nanos=2}` → RFC 3339 with whole seconds, zero → `null`.
    Time,
    /// `metav1.MicroTime{seconds=1,nanos=2}` → RFC 3339 with 6 fraction digits, zero → `null`.
    MicroTime,
    /// `metav1.Duration{duration=1}` (nanoseconds) → Go duration string such as `"1h0m0s"`.
    Duration,
    /// `runtime.RawExtension{raw=1}` and `metav1.FieldsV1{Raw=1}` → the embedded JSON value.
    RawJson,
    /// `metav1.Verbs` and the `ExtraValue` types: `{repeated string items=1}` → a JSON array.
    StringList,
    /// `JSONSchemaPropsOrArray{schema=1, jSONSchemas=2}` → a schema object or an array of them.
    SchemaOrArray,
    /// `JSONSchemaPropsOrBool{allows=1, schema=2}` → a schema object or a boolean.
    SchemaOrBool,
    /// `JSONSchemaPropsOrStringArray{schema=1, property=2}` → a schema object or an array of
    /// strings.
    SchemaOrStringArray,
}

/// In [`Special::expected_fields`]: any message type (the schema union's members).
const ANY_MESSAGE: Type = Type::Message(usize::MAX);

impl Special {
    /// The special meaning of a message, from its full name.
    fn of(full_name: &str) -> Option<Special> {
        const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.";
        const APIEXTENSIONS: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.";
        if let Some(name) = full_name.strip_prefix(APIEXTENSIONS) {
            return match name {
                "JSON" => Some(Special::RawJson),
                "JSONSchemaPropsOrArray" => Some(Special::SchemaOrArray),
                "JSONSchemaPropsOrBool" => Some(Special::SchemaOrBool),
                "JSONSchemaPropsOrStringArray" => Some(Special::SchemaOrStringArray),
                _ => None,
            };
        }
        Some(match full_name {
            "k8s.io.apimachinery.pkg.api.resource.Quantity"
            | "k8s.io.apimachinery.pkg.api.resource.QuantityValue" => Special::Quantity,
            "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
            "k8s.io.apimachinery.pkg.runtime.RawExtension" => Special::RawJson,
            _ => match full_name.strip_prefix(META) {
                Some("Time") => Special::Time,
                Some("MicroTime") => Special::MicroTime,
                Some("Duration") => Special::Duration,
                Some("FieldsV1") => Special::RawJson,
                Some("Verbs") => Special::StringList,
                _ if full_name.starts_with("k8s.io.api.") && full_name.ends_with(".ExtraValue") => {
                    Special::StringList
                }
                _ => return None,
            },
        })
    }

    /// The field layout the decoder and encoder assume, checked when the schema loads so that
    /// a regenerated descriptor set cannot silently change it: (number, name, type).
    fn expected_fields(self) -> &'static [(u32, &'static str, Type)] {
        match self {
            Special::Quantity => &[(1, "string", Type::String)],
            Special::IntOrString => &[
                (1, "type", Type::Int64),
                (2, "intVal", Type::Int32),
                (3, "strVal", Type::String),
            ],
            Special::Time | Special::MicroTime => {
                &[(1, "seconds", Type::Int64), (2, "nanos", Type::Int32)]
            }
            Special::Duration => &[(1, "duration", Type::Int64)],
            // RawExtension calls it `raw`, FieldsV1 `Raw`; the number and type are what matter.
            Special::RawJson => &[(1, "", Type::Bytes)],
            Special::StringList => &[(1, "items", Type::String)],
            Special::SchemaOrArray => {
                &[(1, "schema", ANY_MESSAGE), (2, "jSONSchemas", ANY_MESSAGE)]
            }
            Special::SchemaOrBool => &[(1, "allows", Type::Bool), (2, "schema", ANY_MESSAGE)],
            Special::SchemaOrStringArray => {
                &[(1, "schema", ANY_MESSAGE), (2, "property", Type::String)]
            }
        }
    }

    /// Whether this is one of the schema unions of a CustomResourceDefinition, whose members
    /// are messages (see [`crate::decode`] and [`crate::encode`]).
    pub(crate) fn is_schema_union(self) -> bool {
        matches!(
            self,
            Special::SchemaOrArray | Special::SchemaOrBool | Special::SchemaOrStringArray
        )
    }
}

/// A field's declared protobuf type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Type {
    Double,
    Float,
    Int64,
    Uint64,
    Int32,
    Fixed64,
    Fixed32,
    Bool,
    String,
    Bytes,
    Uint32,
    Enum,
    Sfixed32,
    Sfixed64,
    Sint32,
    Sint64,
    /// Index into [`Schema::messages`].
    Message(usize),
}

impl Type {
    /// True for the scalar types that proto allows to be packed into one length-delimited field.
    pub(crate) fn is_packable(self) -> bool {
        !matches!(self, Type::String | Type::Bytes | Type::Message(_))
    }
}

/// How many values a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `optional`: zero or one.
    Single,
    /// `repeated`: a JSON array.
    Repeated,
    /// `map<K, V>`: a JSON object.
    Map {
        /// Key type (always string in Kubernetes).
        key: Type,
        /// Value type.
        value: Type,
    },
}

/// One field of a message.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    /// The JSON name: the proto field name, which go-to-protobuf takes from the json tag,
    /// except for the few in [`JSON_NAME_OVERRIDES`].
    pub(crate) name: String,
    /// The field number.
    pub(crate) number: u32,
    /// The declared type (for maps: the entry type; see `shape`).
    pub(crate) ty: Type,
    /// Single, repeated or map.
    pub(crate) shape: Shape,
    /// True when the Go field is a pointer: then a present zero value (`replicas: 0`,
    /// `automountServiceAccountToken: false`) means something and is kept.
    pub(crate) nullable: bool,
    /// True when the Go field is embedded with `json:",inline"`: its fields are the parent's.
    pub(crate) inline: bool,
    /// What Go's JSON writes for the field when it is zero or nil, when its tag has no
    /// `omitempty` and it is not a value struct (those are written as the struct's zero).
    pub(crate) json_zero: Option<JsonZero>,
}

/// The JSON of a zero or nil Go field written without `omitempty`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonZero {
    /// `""`.
    EmptyString,
    /// `false`.
    False,
    /// `0`.
    Zero,
    /// `null`: a nil pointer, slice or map.
    Null,
}

/// [`JSON_ZERO_FIELDS`] by (message full name, proto field name).
fn json_zero_fields() -> HashMap<(&'static str, &'static str), JsonZero> {
    JSON_ZERO_FIELDS
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let (message, field, zero) = (words.next()?, words.next()?, words.next()?);
            let zero = match zero {
                "\"\"" => JsonZero::EmptyString,
                "false" => JsonZero::False,
                "0" => JsonZero::Zero,
                "null" => JsonZero::Null,
                _ => return None,
            };
            Some(((message, field), zero))
        })
        .collect()
}

/// One message type.
#[derive(Debug, Clone)]
pub(crate) struct Message {
    /// Full name without the leading dot, e.g. `k8s.io.api.core.v1.ConfigMap`.
    pub(crate) name: String,
    /// Fields in declaration order, which is the Go struct's order and so the key order of
    /// Go's JSON.
    pub(crate) fields: Vec<Field>,
    /// Indexes into `fields` in field-number order, the order Go's generated marshaller
    /// writes them in.
    pub(crate) wire_order: Vec<usize>,
    /// Field number → index into `fields`.
    by_number: HashMap<u32, usize>,
    /// Set for the types with a custom JSON form.
    pub(crate) special: Option<Special>,
    /// True for the synthetic `XxxEntry` messages of map fields.
    map_entry: bool,
}

impl Message {
    /// The field with this number, if the schema knows it.
    pub(crate) fn field_index(&self, number: u32) -> Option<usize> {
        self.by_number.get(&number).copied()
    }
}

/// Every message of the compiled-in descriptor set.
#[derive(Debug)]
pub(crate) struct Schema {
    /// All messages; [`Type::Message`] indexes into this.
    pub(crate) messages: Vec<Message>,
    by_name: HashMap<String, usize>,
}

/// The schema, parsed on first use.
pub(crate) fn schema() -> Result<&'static Schema, ProtobufError> {
    static SCHEMA: OnceLock<Result<Schema, ProtobufError>> = OnceLock::new();
    SCHEMA
        .get_or_init(|| Schema::parse(DESCRIPTORS))
        .as_ref()
        .map_err(Clone::clone)
}

impl Schema {
    /// The message with this full name (no leading dot).
    pub(crate) fn message(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The message for a top-level kind, or `None` if this is not a built-in kind.
    pub(crate) fn kind(&self, api_version: &str, kind: &str) -> Option<usize> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        // A kind is a Go type name: refuse anything that could reach a nested or synthetic
        // message ("Foo.BarEntry") or an empty name.
        if kind.is_empty() || version.is_empty() || !kind.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return None;
        }
        let in_group = GROUP_PACKAGES
            .iter()
            .find(|(g, _)| *g == group)
            .and_then(|(_, package)| self.message(&format!("{package}.{version}.{kind}")));
        let found = in_group.or_else(|| {
            META_KINDS
                .contains(&kind)
                .then(|| self.message(&format!("k8s.io.apimachinery.pkg.apis.meta.v1.{kind}")))
                .flatten()
        })?;
        // Special types have no object form to put apiVersion and kind into.
        let message = &self.messages[found];
        (message.special.is_none() && !message.map_entry).then_some(found)
    }

    /// Parses a `google.protobuf.FileDescriptorSet`.
    fn parse(bytes: &[u8]) -> Result<Schema, ProtobufError> {
        let raw = raw_messages(bytes)?;
        let by_name: HashMap<String, usize> = raw
            .iter()
            .enumerate()
            .map(|(index, message)| (message.name.clone(), index))
            .collect();
        if by_name.len() != raw.len() {
            return Err(ProtobufError::Schema("duplicate message names".into()));
        }
        let resolve = |type_name: &str| -> Result<usize, ProtobufError> {
            by_name
                .get(type_name.trim_start_matches('.'))
                .copied()
                .ok_or_else(|| ProtobufError::Schema(format!("unresolved type {type_name}")))
        };

        let zero_fields = json_zero_fields();
        let mut messages = Vec::with_capacity(raw.len());
        for message in &raw {
            let mut fields = Vec::with_capacity(message.fields.len());
            for field in &message.fields {
                let ty = match field.ty {
                    11 => Type::Message(resolve(&field.type_name)?),
                    code => scalar_type(code).ok_or_else(|| {
                        ProtobufError::Schema(format!(
                            "{}.{}: unsupported type {code}",
                            message.name, field.name
                        ))
                    })?,
                };
                fields.push(Field {
                    name: json_name(&message.name, &field.name).to_owned(),
                    number: field.number,
                    ty,
                    shape: if field.repeated {
                        Shape::Repeated
                    } else {
                        Shape::Single
                    },
                    nullable: field.nullable,
                    inline: false,
                    json_zero: zero_fields
                        .get(&(message.name.as_str(), field.name.as_str()))
                        .copied(),
                });
            }
            let mut wire_order: Vec<usize> = (0..fields.len()).collect();
            wire_order.sort_by_key(|&i| fields[i].number);
            let by_number = fields
                .iter()
                .enumerate()
                .map(|(index, field)| (field.number, index))
                .collect();
            messages.push(Message {
                special: Special::of(&message.name),
                name: message.name.clone(),
                fields,
                wire_order,
                by_number,
                map_entry: message.map_entry,
            });
        }

        // Second pass, now that every type is resolved: maps and inline embedding.
        for (index, message) in raw.iter().enumerate() {
            for raw_field in &message.fields {
                let Some(position) = messages[index].field_index(raw_field.number) else {
                    continue;
                };
                let Type::Message(target) = messages[index].fields[position].ty else {
                    continue;
                };
                let shape = if raw_field.repeated && messages[target].map_entry {
                    let entry = &messages[target];
                    let (Some(key), Some(value)) = (entry.field_index(1), entry.field_index(2))
                    else {
                        return Err(ProtobufError::Schema(format!(
                            "map entry {} lacks key or value",
                            entry.name
                        )));
                    };
                    Some(Shape::Map {
                        key: entry.fields[key].ty,
                        value: entry.fields[value].ty,
                    })
                } else {
                    None
                };
                let inline = !raw_field.repeated
                    && !raw_field.nullable
                    && INLINE_TYPES.contains(&simple_name(&messages[target].name))
                    && raw_field.go_name == simple_name(&messages[target].name);
                let field = &mut messages[index].fields[position];
                if let Some(shape) = shape {
                    field.shape = shape;
                }
                field.inline = inline;
            }
        }

        for message in &messages {
            if let Some(special) = message.special {
                check_special(message, special)?;
            }
        }
        Ok(Schema { messages, by_name })
    }
}

/// The last dotted component of a full message name: the Go type name.
pub(crate) fn simple_name(full_name: &str) -> &str {
    full_name.rsplit('.').next().unwrap_or(full_name)
}

/// Fails if a special type's fields are not what the transcoder assumes.
fn check_special(message: &Message, special: Special) -> Result<(), ProtobufError> {
    let expected = special.expected_fields();
    let matches = message.fields.len() == expected.len()
        && message
            .wire_order
            .iter()
            .map(|&i| &message.fields[i])
            .zip(expected)
            .all(|(field, (number, name, ty))| {
                field.number == *number
                    && (field.ty == *ty
                        || (*ty == ANY_MESSAGE && matches!(field.ty, Type::Message(_))))
                    && (name.is_empty() || field.name == *name)
                    && (special != Special::StringList || field.shape == Shape::Repeated)
            });
    if matches {
        Ok(())
    } else {
        Err(ProtobufError::Schema(format!(
            "{} does not have the expected layout",
            message.name
        )))
    }
}

/// The scalar [`Type`] for a `FieldDescriptorProto.Type` code.
fn scalar_type(code: u64) -> Option<Type> {
    Some(match code {
        1 => Type::Double,
        2 => Type::Float,
        3 => Type::Int64,
        4 => Type::Uint64,
        5 => Type::Int32,
        6 => Type::Fixed64,
        7 => Type::Fixed32,
        8 => Type::Bool,
        9 => Type::String,
        12 => Type::Bytes,
        13 => Type::Uint32,
        14 => Type::Enum,
        15 => Type::Sfixed32,
        16 => Type::Sfixed64,
        17 => Type::Sint32,
        18 => Type::Sint64,
        // 10 (group) is not supported; 11 (message) is resolved by the caller.
        _ => return None,
    })
}

/// Reads every message of a `google.protobuf.FileDescriptorSet`.
fn raw_messages(bytes: &[u8]) -> Result<Vec<RawMessage>, ProtobufError> {
    let mut raw = Vec::new();
    let mut files = Reader::new(bytes);
    while let Some((number, value)) = files.next_field(&Path::Root)? {
        // FileDescriptorSet.file = 1
        if let (1, WireValue::Bytes(file)) = (number, value) {
            parse_file(file, &mut raw)?;
        }
    }
    Ok(raw)
}

/// A message as read from its DescriptorProto, before type names are resolved.
struct RawMessage {
    name: String,
    fields: Vec<RawField>,
    map_entry: bool,
}

/// A field as read from its FieldDescriptorProto.
#[derive(Default)]
struct RawField {
    name: String,
    number: u32,
    repeated: bool,
    ty: u64,
    type_name: String,
    nullable: bool,
    go_name: String,
}

/// Reads a length-delimited string field of a descriptor.
fn text(value: WireValue<'_>, what: &str) -> Result<String, ProtobufError> {
    match value {
        WireValue::Bytes(bytes) => String::from_utf8(bytes.to_vec())
            .map_err(|_| ProtobufError::Schema(format!("{what} is not utf-8"))),
        _ => Err(ProtobufError::Schema(format!("{what} is not a string"))),
    }
}

/// Reads a FileDescriptorProto, appending its messages (nested ones included).
fn parse_file(bytes: &[u8], out: &mut Vec<RawMessage>) -> Result<(), ProtobufError> {
    let mut package = String::new();
    let mut message_bytes = Vec::new();
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.next_field(&Path::Root)? {
        match (number, value) {
            (2, value) => package = text(value, "package")?,
            (4, WireValue::Bytes(message)) => message_bytes.push(message),
            _ => {}
        }
    }
    for message in message_bytes {
        parse_message(message, &package, out)?;
    }
    Ok(())
}

/// Reads a DescriptorProto whose parent scope is `scope`.
fn parse_message(
    bytes: &[u8],
    scope: &str,
    out: &mut Vec<RawMessage>,
) -> Result<(), ProtobufError> {
    let mut name = String::new();
    let mut fields = Vec::new();
    let mut nested = Vec::new();
    let mut map_entry = false;
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.next_field(&Path::Root)? {
        match (number, value) {
            (1, value) => name = text(value, "message name")?,
            (2, WireValue::Bytes(field)) => fields.push(parse_field(field)?),
            (3, WireValue::Bytes(message)) => nested.push(message),
            // MessageOptions.map_entry = 7
            (7, WireValue::Bytes(options)) => {
                let mut options = Reader::new(options);
                while let Some((number, value)) = options.next_field(&Path::Root)? {
                    if let (7, WireValue::Varint(flag)) = (number, value) {
                        map_entry = flag != 0;
                    }
                }
            }
            _ => {}
        }
    }
    let full_name = format!("{scope}.{name}");
    for message in nested {
        parse_message(message, &full_name, out)?;
    }
    out.push(RawMessage {
        name: full_name,
        fields,
        map_entry,
    });
    Ok(())
}

/// Reads a FieldDescriptorProto, gogoproto options included.
fn parse_field(bytes: &[u8]) -> Result<RawField, ProtobufError> {
    let mut field = RawField {
        // gogoproto's default: a field is a pointer unless marked otherwise.
        nullable: true,
        ..RawField::default()
    };
    let mut reader = Reader::new(bytes);
    while let Some((number, value)) = reader.next_field(&Path::Root)? {
        match (number, value) {
            (1, value) => field.name = text(value, "field name")?,
            (3, WireValue::Varint(n)) => {
                field.number = u32::try_from(n)
                    .map_err(|_| ProtobufError::Schema(format!("field number {n}")))?;
            }
            // Label 3 = LABEL_REPEATED.
            (4, WireValue::Varint(label)) => field.repeated = label == 3,
            (5, WireValue::Varint(ty)) => field.ty = ty,
            (6, value) => field.type_name = text(value, "type name")?,
            (8, WireValue::Bytes(options)) => {
                let mut options = Reader::new(options);
                while let Some((number, value)) = options.next_field(&Path::Root)? {
                    match (number, value) {
                        (GOGO_NULLABLE, WireValue::Varint(flag)) => field.nullable = flag != 0,
                        (GOGO_CUSTOMNAME, value) => field.go_name = text(value, "customname")?,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(field)
}

#[cfg(test)]
mod tests;
