//! Server-side apply and field ownership: `metadata.managedFields` with structured-merge-diff
//! semantics (`sigs.k8s.io/structured-merge-diff` `fieldpath`, `typed`, `merge.Updater`, and
//! the apiserver's field manager around it).
//!
//! * [`FieldSet`] (in `fieldpath`) is a set of field paths with the exact `FieldsV1` JSON encoding
//!   (`f:name`, `k:{"name":"x"}`, `v:"x"`, `i:0`, `"."`), so entries round-trip byte for byte
//!   and `kubectl get --show-managed-fields` shows what upstream would.
//! * [`apply`] merges an applied configuration into the live object, reports conflicts with
//!   other managers as a value, takes ownership with `force`, and prunes fields the applier
//!   stopped applying that nobody else owns.
//! * [`update`] moves ownership of the fields a non-apply write changed to its manager.
//!
//! Simplifications, on purpose: the schema is [`crate::schema`] (list types and atomic fields
//! of the built-in kinds) rather than full OpenAPI, so every object key is treated as a struct
//! field; there is no version conversion (a manager's `apiVersion` is recorded, not used to
//! convert); and the cap on the number of update managers is not enforced.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use crate::field::go_quote;
use crate::patch::json_equal;
use crate::schema::{FieldMeta, ListType, Schema};

/// Why field ownership could not be computed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ManagedFieldsError {
    /// A `fieldsV1` value is not in the upstream encoding.
    #[error("invalid fieldsV1: {0}")]
    InvalidFieldsV1(String),
    /// A `managedFields` entry is not shaped like a `ManagedFieldsEntry`.
    #[error("invalid managedFields entry: {0}")]
    InvalidEntry(String),
    /// An applied configuration carries `metadata.managedFields`, which upstream forbids.
    #[error("metadata.managedFields must be nil")]
    ManagedFieldsInConfig,
    /// An item of an associative list lacks one of the list's keys.
    #[error(
        ".{path}: associative list with keys has an element that omits key field {key:?} (and doesn't have default value)"
    )]
    MissingListKey {
        /// The list's path, dot-separated.
        path: String,
        /// The missing key field.
        key: String,
    },
    /// An associative list holds something other than objects.
    #[error(".{path}: associative list with keys has an element that is not a map")]
    NonObjectListItem {
        /// The list's path, dot-separated.
        path: String,
    },
    /// An applied configuration lists the same associative-list key twice.
    #[error(".{path}: duplicate entries for key {key}")]
    DuplicateKey {
        /// The list's path, dot-separated.
        path: String,
        /// The duplicated key, rendered like a path element.
        key: String,
    },
}

// Field paths and sets, and their `FieldsV1` encoding, live in `fieldpath` (upstream's package
// of the same name); this module is the field manager over them.
mod fieldpath;
#[cfg(test)]
mod tests;

pub use fieldpath::*;

// ---------------------------------------------------------------------------------------------

/// The operation that gave a manager its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write (create, update, patch).
    Update,
}

impl Operation {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who owns a set of fields. Appliers are one manager whatever API version they used;
/// updaters are separate managers per API version (upstream `BuildManagerIdentifier`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ManagerId {
    /// The field manager name (`kubectl`, `kube-controller-manager`, ...).
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The API version, for updaters only (empty for appliers).
    pub api_version: String,
    /// The subresource written through (`status`, `scale`), if any.
    pub subresource: String,
}

impl ManagerId {
    /// How upstream names this manager in conflict messages: `"kubectl"` for an applier,
    /// `"kubectl-edit" using apps/v1` for an updater.
    pub fn describe(&self) -> String {
        let mut name = go_quote(&self.manager);
        if !self.subresource.is_empty() {
            name = format!("{name} with subresource {}", go_quote(&self.subresource));
        }
        match self.operation {
            Operation::Update => format!("{name} using {}", self.api_version),
            Operation::Apply => name,
        }
    }
}

/// One `metadata.managedFields` entry (upstream `metav1.ManagedFieldsEntry`).
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedFieldsEntry {
    /// The field manager name.
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// The API version the manager used.
    pub api_version: String,
    /// When the manager last changed its fields (RFC 3339), if known.
    pub time: Option<String>,
    /// The owned fields.
    pub fields: FieldSet,
    /// The subresource written through, if any.
    pub subresource: String,
}

impl ManagedFieldsEntry {
    /// The identity this entry's fields belong to.
    pub fn id(&self) -> ManagerId {
        ManagerId {
            manager: self.manager.clone(),
            operation: self.operation,
            api_version: if self.operation == Operation::Update {
                self.api_version.clone()
            } else {
                String::new()
            },
            subresource: self.subresource.clone(),
        }
    }

    /// Decodes one entry.
    pub fn from_json(value: &Value) -> Result<Self, ManagedFieldsError> {
        let bad = |m: &str| ManagedFieldsError::InvalidEntry(m.to_string());
        let Value::Object(map) = value else {
            return Err(bad("expected an object"));
        };
        let text = |key: &str| -> Result<String, ManagedFieldsError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(ManagedFieldsError::InvalidEntry(format!(
                    "{key} must be a string"
                ))),
            }
        };
        let operation = match text("operation")?.as_str() {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            other => {
                return Err(ManagedFieldsError::InvalidEntry(format!(
                    "unknown operation {other:?}"
                )));
            }
        };
        let fields_type = text("fieldsType")?;
        if !fields_type.is_empty() && fields_type != "FieldsV1" {
            return Err(ManagedFieldsError::InvalidEntry(format!(
                "unsupported fieldsType {fields_type:?}"
            )));
        }
        let fields = match map.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::new(),
            Some(v) => FieldSet::from_fields_v1(v)?,
        };
        let time = text("time")?;
        Ok(ManagedFieldsEntry {
            manager: text("manager")?,
            operation,
            api_version: text("apiVersion")?,
            time: (!time.is_empty()).then_some(time),
            fields,
            subresource: text("subresource")?,
        })
    }

    /// Encodes in the field order and with the omissions of upstream's JSON.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        if !self.manager.is_empty() {
            map.insert("manager".into(), Value::from(self.manager.clone()));
        }
        map.insert("operation".into(), Value::from(self.operation.as_str()));
        if !self.api_version.is_empty() {
            map.insert("apiVersion".into(), Value::from(self.api_version.clone()));
        }
        if let Some(time) = &self.time {
            map.insert("time".into(), Value::from(time.clone()));
        }
        map.insert("fieldsType".into(), Value::from("FieldsV1"));
        map.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if !self.subresource.is_empty() {
            map.insert("subresource".into(), Value::from(self.subresource.clone()));
        }
        Value::Object(map)
    }
}

/// Decodes an object's `metadata.managedFields` (absent means none).
pub fn decode_managed_fields(
    object: &Value,
) -> Result<Vec<ManagedFieldsEntry>, ManagedFieldsError> {
    match object.get("metadata").and_then(|m| m.get("managedFields")) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(entries)) => entries.iter().map(ManagedFieldsEntry::from_json).collect(),
        Some(_) => Err(ManagedFieldsError::InvalidEntry(
            "managedFields must be a list".into(),
        )),
    }
}

/// Encodes entries for `metadata.managedFields`.
pub fn encode_managed_fields(entries: &[ManagedFieldsEntry]) -> Value {
    Value::Array(entries.iter().map(ManagedFieldsEntry::to_json).collect())
}

/// Writes `entries` into `object.metadata.managedFields`, removing the field when empty.
pub fn set_managed_fields(object: &mut Value, entries: &[ManagedFieldsEntry]) {
    let Some(object) = object.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
            metadata.shift_remove("managedFields");
        }
        return;
    }
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(metadata) = metadata {
        metadata.insert("managedFields".into(), encode_managed_fields(entries));
    }
}

/// Upstream's entry order: appliers first, then by time, manager, API version, subresource.
fn sort_entries(entries: &mut [ManagedFieldsEntry]) {
    entries.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then_with(|| {
                p.time
                    .as_deref()
                    .unwrap_or("")
                    .cmp(q.time.as_deref().unwrap_or(""))
            })
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
}

/// The fields the apiserver never tracks ownership of (upstream `stripMetaManager`): removed
/// from every manager's set after each operation.
fn strip_set() -> FieldSet {
    let mut set = FieldSet::new();
    for path in [
        &["apiVersion"][..],
        &["kind"],
        &["metadata"],
        &["metadata", "name"],
        &["metadata", "namespace"],
        &["metadata", "creationTimestamp"],
        &["metadata", "selfLink"],
        &["metadata", "uid"],
        &["metadata", "clusterName"],
        &["metadata", "generation"],
        &["metadata", "managedFields"],
        &["metadata", "resourceVersion"],
    ] {
        set.insert(&FieldPath::fields(path).0);
    }
    set
}

/// The managers' sets keyed by identity, remembering each entry's other attributes.
struct Managers {
    entries: BTreeMap<ManagerId, ManagedFieldsEntry>,
}

impl Managers {
    fn new(entries: &[ManagedFieldsEntry]) -> Self {
        let mut map: BTreeMap<ManagerId, ManagedFieldsEntry> = BTreeMap::new();
        for entry in entries {
            // Duplicate identities should not exist; if they do, they own the union.
            match map.get_mut(&entry.id()) {
                Some(existing) => existing.fields = existing.fields.union(&entry.fields),
                None => {
                    map.insert(entry.id(), entry.clone());
                }
            }
        }
        Managers { entries: map }
    }

    fn union_all(&self) -> FieldSet {
        self.entries
            .values()
            .fold(FieldSet::new(), |acc, e| acc.union(&e.fields))
    }

    fn into_sorted(self) -> Vec<ManagedFieldsEntry> {
        let mut entries: Vec<ManagedFieldsEntry> = self
            .entries
            .into_values()
            .filter(|e| !e.fields.is_empty())
            .collect();
        sort_entries(&mut entries);
        entries
    }
}

// ---------------------------------------------------------------------------------------------
// Walking values with the schema
// ---------------------------------------------------------------------------------------------

fn path_string(path: &[PathElement]) -> String {
    FieldPath(path.to_vec())
        .to_string()
        .trim_start_matches('.')
        .to_string()
}

/// The path element of each item of a non-atomic list.
fn list_item_elements(
    items: &[Value],
    list_type: ListType,
    path: &[PathElement],
) -> Result<Vec<PathElement>, ManagedFieldsError> {
    items
        .iter()
        .map(|item| match list_type {
            ListType::Set | ListType::Atomic => Ok(PathElement::Value(item.clone())),
            ListType::Map(keys) => {
                let Value::Object(map) = item else {
                    return Err(ManagedFieldsError::NonObjectListItem {
                        path: path_string(path),
                    });
                };
                let mut fields = Vec::with_capacity(keys.len());
                for key in keys {
                    let value = match (map.get(key.name), key.default) {
                        (Some(v), _) if !v.is_null() => v.clone(),
                        (_, Some(default)) => Value::from(default),
                        _ => {
                            return Err(ManagedFieldsError::MissingListKey {
                                path: path_string(path),
                                key: key.name.to_string(),
                            });
                        }
                    };
                    fields.push((key.name.to_string(), value));
                }
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(PathElement::Key(fields))
            }
        })
        .collect()
}

/// Whether a value is walked into (a granular map or a keyed/set list) or treated as a leaf.
fn is_granular(value: &Value, meta: &FieldMeta) -> bool {
    match value {
        Value::Object(_) => !meta.atomic,
        Value::Array(_) => meta.list_type != ListType::Atomic,
        _ => false,
    }
}

/// The fields a value sets (upstream `TypedValue.ToFieldSet`): leaves, empty and atomic
/// values, and every list item.
pub fn to_field_set(value: &Value, schema: Schema) -> Result<FieldSet, ManagedFieldsError> {
    field_set(value, schema, false)
}

/// `strict` rejects duplicate list keys, as upstream does for applied configurations (live
/// objects may hold duplicates, e.g. repeated environment variables).
fn field_set(value: &Value, schema: Schema, strict: bool) -> Result<FieldSet, ManagedFieldsError> {
    let mut set = FieldSet::new();
    if let Value::Object(map) = value {
        object_field_set(map, schema, &mut Vec::new(), &mut set, strict)?;
    }
    Ok(set)
}

fn object_field_set(
    map: &Map<String, Value>,
    schema: Schema,
    path: &mut Vec<PathElement>,
    set: &mut FieldSet,
    strict: bool,
) -> Result<(), ManagedFieldsError> {
    for (key, value) in map {
        path.push(PathElement::Field(key.clone()));
        value_field_set(
            value,
            &schema.field(key),
            schema.child(key),
            path,
            set,
            strict,
        )?;
        path.pop();
    }
    Ok(())
}

fn value_field_set(
    value: &Value,
    meta: &FieldMeta,
    schema: Schema,
    path: &mut Vec<PathElement>,
    set: &mut FieldSet,
    strict: bool,
) -> Result<(), ManagedFieldsError> {
    match value {
        Value::Object(map) if !meta.atomic && !map.is_empty() => {
            object_field_set(map, schema, path, set, strict)
        }
        Value::Array(items) if meta.list_type != ListType::Atomic => {
            let elements = list_item_elements(items, meta.list_type, path)?;
            let mut seen = BTreeSet::new();
            for (item, pe) in items.iter().zip(elements) {
                if strict && matches!(meta.list_type, ListType::Map(_)) && !seen.insert(pe.clone())
                {
                    return Err(ManagedFieldsError::DuplicateKey {
                        path: path_string(path),
                        key: pe.to_string(),
                    });
                }
                path.push(pe);
                set.insert(path);
                if let (Value::Object(map), ListType::Map(_)) = (item, meta.list_type) {
                    object_field_set(map, schema, path, set, strict)?;
                }
                path.pop();
            }
            Ok(())
        }
        _ => {
            set.insert(path);
            Ok(())
        }
    }
}

/// What changed between two versions of an object (upstream `typed.Comparison`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Leaves whose value changed.
    pub modified: FieldSet,
    /// Fields and items present only in the new version.
    pub added: FieldSet,
    /// Fields and items present only in the old version.
    pub removed: FieldSet,
}

/// Compares two versions of an object field by field.
pub fn compare(old: &Value, new: &Value, schema: Schema) -> Result<Comparison, ManagedFieldsError> {
    let mut comparison = Comparison::default();
    let empty = Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    compare_objects(
        Some(old),
        Some(new),
        schema,
        &mut Vec::new(),
        &mut comparison,
        true,
    )?;
    Ok(comparison)
}

/// `zero_present` says whether this object exists in the Go zero value of the old object:
/// upstream compares against a typed zero value, where non-pointer structs and non-`omitempty`
/// fields (the [`FieldMeta::embedded`] ones) already exist, so they are never "added".
fn compare_objects(
    old: Option<&Map<String, Value>>,
    new: Option<&Map<String, Value>>,
    schema: Schema,
    path: &mut Vec<PathElement>,
    out: &mut Comparison,
    zero_present: bool,
) -> Result<(), ManagedFieldsError> {
    let empty = Map::new();
    let (old_map, new_map) = (old.unwrap_or(&empty), new.unwrap_or(&empty));
    let keys: Vec<&String> = old_map
        .keys()
        .chain(new_map.keys().filter(|k| !old_map.contains_key(*k)))
        .collect();
    for key in keys {
        path.push(PathElement::Field(key.clone()));
        let meta = schema.field(key);
        let in_zero = meta.embedded && zero_present;
        compare_values_at(
            old_map.get(key),
            new_map.get(key),
            &meta,
            schema.child(key),
            path,
            out,
            in_zero,
        )?;
        path.pop();
    }
    Ok(())
}

fn compare_values_at(
    old: Option<&Value>,
    new: Option<&Value>,
    meta: &FieldMeta,
    schema: Schema,
    path: &mut Vec<PathElement>,
    out: &mut Comparison,
    in_zero: bool,
) -> Result<(), ManagedFieldsError> {
    let granular = |v: Option<&Value>| v.is_some_and(|v| is_granular(v, meta));
    let same_shape = match (old, new) {
        (Some(o), Some(n)) => std::mem::discriminant(o) == std::mem::discriminant(n),
        _ => true,
    };
    if !(granular(old) || granular(new)) || !same_shape {
        match (old, new) {
            // An absent leaf that exists in the zero value changed rather than appeared.
            (None, Some(_)) | (Some(_), None) if in_zero => out.modified.insert(path),
            (None, Some(_)) => out.added.insert(path),
            (Some(_), None) => out.removed.insert(path),
            (Some(o), Some(n)) if !json_equal(o, n) => out.modified.insert(path),
            _ => {}
        }
        return Ok(());
    }
    match (old, new) {
        (None, Some(_)) if !in_zero => out.added.insert(path),
        (Some(_), None) if !in_zero => out.removed.insert(path),
        _ => {}
    }
    let zero_present = old.is_some() || in_zero;
    match (old.or(new), old, new) {
        (Some(Value::Object(_)), old, new) => compare_objects(
            old.and_then(Value::as_object),
            new.and_then(Value::as_object),
            schema,
            path,
            out,
            zero_present,
        ),
        (Some(Value::Array(_)), old, new) => {
            let empty = Vec::new();
            let old_items = old.and_then(Value::as_array).unwrap_or(&empty);
            let new_items = new.and_then(Value::as_array).unwrap_or(&empty);
            let old_pes = list_item_elements(old_items, meta.list_type, path)?;
            let new_pes = list_item_elements(new_items, meta.list_type, path)?;
            let old_index: BTreeMap<&PathElement, &Value> =
                old_pes.iter().zip(old_items).rev().collect();
            let new_index: BTreeMap<&PathElement, &Value> =
                new_pes.iter().zip(new_items).rev().collect();
            let mut seen = BTreeSet::new();
            for pe in old_pes.iter().chain(&new_pes) {
                if !seen.insert(pe) {
                    continue;
                }
                let (o, n) = (old_index.get(pe).copied(), new_index.get(pe).copied());
                path.push(pe.clone());
                match (o, n) {
                    (None, Some(_)) => out.added.insert(path),
                    (Some(_), None) => out.removed.insert(path),
                    _ => {}
                }
                if let ListType::Map(_) = meta.list_type {
                    compare_objects(
                        o.and_then(Value::as_object),
                        n.and_then(Value::as_object),
                        schema,
                        path,
                        out,
                        o.is_some(),
                    )?;
                }
                path.pop();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Merges an applied configuration into the live object (upstream `TypedValue.Merge`): the
/// configuration wins on leaves and atomic values, maps merge key by key, associative lists and
/// sets merge item by item in upstream's order.
pub fn merge(live: &Value, config: &Value, schema: Schema) -> Result<Value, ManagedFieldsError> {
    merge_at(live, config, &FieldMeta::default(), schema, &mut Vec::new())
}

fn merge_at(
    live: &Value,
    config: &Value,
    meta: &FieldMeta,
    schema: Schema,
    path: &mut Vec<PathElement>,
) -> Result<Value, ManagedFieldsError> {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !meta.atomic => {
            let mut out = l.clone();
            for (key, value) in c {
                path.push(PathElement::Field(key.clone()));
                let merged = match l.get(key) {
                    Some(existing) => {
                        merge_at(existing, value, &schema.field(key), schema.child(key), path)?
                    }
                    None => value.clone(),
                };
                path.pop();
                if merged.is_null() {
                    // A typed round trip turns null into an absent field.
                    out.shift_remove(key);
                } else {
                    out.insert(key.clone(), merged);
                }
            }
            Ok(Value::Object(out))
        }
        (Value::Array(l), Value::Array(c)) if meta.list_type != ListType::Atomic => {
            merge_lists(l, c, meta, schema, path).map(Value::Array)
        }
        _ => Ok(config.clone()),
    }
}

/// Upstream's associative list merge order: configuration items in configuration order, with
/// live-only items kept at their live position relative to the shared ones.
fn merge_lists(
    live: &[Value],
    config: &[Value],
    meta: &FieldMeta,
    schema: Schema,
    path: &mut Vec<PathElement>,
) -> Result<Vec<Value>, ManagedFieldsError> {
    let live_pes = list_item_elements(live, meta.list_type, path)?;
    let config_pes = list_item_elements(config, meta.list_type, path)?;
    let mut config_index: BTreeMap<&PathElement, usize> = BTreeMap::new();
    for (i, pe) in config_pes.iter().enumerate() {
        if config_index.insert(pe, i).is_some() {
            return Err(ManagedFieldsError::DuplicateKey {
                path: path_string(path),
                key: pe.to_string(),
            });
        }
    }
    let mut live_index: BTreeMap<&PathElement, usize> = BTreeMap::new();
    for (i, pe) in live_pes.iter().enumerate() {
        live_index.entry(pe).or_insert(i);
    }
    let mut shared = config_pes.iter().filter(|pe| live_index.contains_key(pe));
    let mut next_shared = shared.next();
    let mut merged_config: BTreeSet<&PathElement> = BTreeSet::new();
    let mut out = Vec::with_capacity(live.len().max(config.len()));
    let merge_item = |l: Option<&Value>,
                      c: &Value,
                      path: &mut Vec<PathElement>,
                      pe: &PathElement|
     -> Result<Value, ManagedFieldsError> {
        match l {
            Some(l) if matches!(meta.list_type, ListType::Map(_)) => {
                path.push(pe.clone());
                let merged = merge_at(l, c, &FieldMeta::default(), schema, path);
                path.pop();
                merged
            }
            _ => Ok(c.clone()),
        }
    };
    let (mut li, mut ri) = (0, 0);
    while li < live.len() || ri < config.len() {
        if li < live.len() && ri < config.len() {
            let pe = &live_pes[li];
            if *pe == config_pes[ri] {
                merged_config.insert(pe);
                out.push(merge_item(Some(&live[li]), &config[ri], path, pe)?);
                li += 1;
                ri += 1;
                next_shared = shared.next();
                continue;
            }
            if config_index.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                // A shared item, but not the one due now: it will be emitted at its config place.
                li += 1;
                continue;
            }
        }
        if li < live.len() {
            let pe = &live_pes[li];
            if !config_index.contains_key(pe) {
                out.push(live[li].clone());
                li += 1;
                continue;
            }
            if merged_config.contains(pe) {
                li += 1;
                continue;
            }
        }
        if ri < config.len() {
            let pe = &config_pes[ri];
            merged_config.insert(pe);
            let l = live_index.get(pe).map(|&i| &live[i]);
            out.push(merge_item(l, &config[ri], path, pe)?);
            ri += 1;
            if next_shared.is_some_and(|n| n == pe) {
                next_shared = shared.next();
            }
        } else {
            // Only reachable with duplicate live keys; skip rather than loop forever.
            li += 1;
        }
    }
    Ok(out)
}

/// Removes the fields and items in `set` from a value (upstream `TypedValue.RemoveItems`).
fn remove_items(
    value: &Value,
    set: &FieldSet,
    schema: Schema,
) -> Result<Value, ManagedFieldsError> {
    remove_at(value, set, &FieldMeta::default(), schema, &mut Vec::new())
}

fn remove_at(
    value: &Value,
    set: &FieldSet,
    meta: &FieldMeta,
    schema: Schema,
    path: &mut Vec<PathElement>,
) -> Result<Value, ManagedFieldsError> {
    match value {
        Value::Object(map) if !meta.atomic => {
            let mut out = Map::new();
            for (key, child) in map {
                let pe = PathElement::Field(key.clone());
                if set.members.contains(&pe) {
                    continue;
                }
                let kept = match set.children.get(&pe) {
                    Some(below) => {
                        path.push(pe);
                        let kept =
                            remove_at(child, below, &schema.field(key), schema.child(key), path)?;
                        path.pop();
                        kept
                    }
                    None => child.clone(),
                };
                out.insert(key.clone(), kept);
            }
            Ok(Value::Object(out))
        }
        Value::Array(items) if meta.list_type != ListType::Atomic => {
            let pes = list_item_elements(items, meta.list_type, path)?;
            let mut out = Vec::with_capacity(items.len());
            for (item, pe) in items.iter().zip(pes) {
                if set.members.contains(&pe) {
                    continue;
                }
                match set.children.get(&pe) {
                    Some(below) => {
                        path.push(pe);
                        let kept = remove_at(item, below, &FieldMeta::default(), schema, path)?;
                        path.pop();
                        out.push(kept);
                    }
                    None => out.push(item.clone()),
                }
            }
            Ok(Value::Array(out))
        }
        other => Ok(other.clone()),
    }
}

/// Upstream `Updater.prune`: remove what the applier applied last time and not this time,
/// unless another manager (or the new configuration) owns it.
fn prune(
    merged: Value,
    managers: &Managers,
    last: Option<&FieldSet>,
    schema: Schema,
) -> Result<Value, ManagedFieldsError> {
    let Some(last) = last.filter(|l| !l.is_empty()) else {
        return Ok(merged);
    };
    let last = last.ensure_named_fields_are_members();
    let pruned = remove_items(&merged, &last, schema)?;

    // Add back whatever some manager still owns.
    let owned = managers.union_all().ensure_named_fields_are_members();
    let merged_set = to_field_set_named(&merged, schema)?;
    let pruned_set = to_field_set_named(&pruned, schema)?;
    let pruned = remove_items(
        &merged,
        &merged_set.difference(&pruned_set.union(&owned)),
        schema,
    )?;

    // Only take away what the applier itself used to own.
    let pruned_set = to_field_set_named(&pruned, schema)?;
    remove_items(
        &merged,
        &merged_set.difference(&pruned_set).intersection(&last),
        schema,
    )
}

fn to_field_set_named(value: &Value, schema: Schema) -> Result<FieldSet, ManagedFieldsError> {
    // Every non-empty object has a leaf below it, so naming the fields on the way covers all
    // intermediate objects too.
    Ok(to_field_set(value, schema)?.ensure_named_fields_are_members())
}

fn strip_metadata(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
        metadata.shift_remove("managedFields");
    }
    object
}

fn config_has_managed_fields(config: &Value) -> bool {
    config
        .get("metadata")
        .and_then(|m| m.get("managedFields"))
        .is_some_and(|m| !m.is_null() && m.as_array().is_none_or(|a| !a.is_empty()))
}

// ---------------------------------------------------------------------------------------------
// Apply and update
// ---------------------------------------------------------------------------------------------

/// One field another manager owns that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The owner of the field.
    pub manager: ManagerId,
    /// The field.
    pub path: FieldPath,
}

impl Conflict {
    /// The `StatusCause.message` upstream uses: `conflict with "kubectl" using apps/v1`.
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.manager.describe())
    }
}

/// The message of upstream's 409 for failed applies:
/// `Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using apps/v1: .spec.replicas`.
pub fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [one] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            one.manager.describe(),
            one.path
        );
    }
    let mut by_manager: BTreeMap<&ManagerId, Vec<&FieldPath>> = BTreeMap::new();
    for conflict in conflicts {
        by_manager
            .entry(&conflict.manager)
            .or_default()
            .push(&conflict.path);
    }
    let mut lines = Vec::new();
    for (manager, paths) in by_manager {
        lines.push(format!("conflicts with {}:", manager.describe()));
        lines.extend(paths.iter().map(|p| format!("- {p}")));
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}

/// Parameters of a server-side apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// The applying field manager.
    pub manager: String,
    /// The API version of the request, recorded on the entry.
    pub api_version: String,
    /// Take ownership of conflicting fields instead of failing.
    pub force: bool,
    /// The current time (RFC 3339) for the entry's timestamp; passed in to stay pure.
    pub now: String,
    /// The kind's schema ([`Schema::unknown`] for custom resources).
    pub schema: Schema,
    /// Fields whose ownership is not tracked for this endpoint, e.g. `.status` when applying to
    /// the main resource.
    pub ignored: FieldSet,
    /// The subresource applied through, if any.
    pub subresource: String,
}

/// The result of a server-side apply that did not fail.
#[derive(Debug, Clone, PartialEq)]
pub enum ApplyOutcome {
    /// The configuration was applied.
    Applied {
        /// The new object, `metadata.managedFields` included.
        object: Value,
        /// The new managed fields, as also written into the object.
        managed_fields: Vec<ManagedFieldsEntry>,
        /// False when neither the object nor anyone's ownership changed (no write needed).
        changed: bool,
    },
    /// Other managers own fields the configuration changes; nothing was applied.
    Conflicts(Vec<Conflict>),
}

/// Server-side apply of `config` by `options.manager` onto `live` (use `{}` for a create),
/// whose current ownership is `managed` (from [`decode_managed_fields`]).
pub fn apply(
    live: &Value,
    config: &Value,
    managed: &[ManagedFieldsEntry],
    options: &ApplyOptions,
) -> Result<ApplyOutcome, ManagedFieldsError> {
    if config_has_managed_fields(config) {
        return Err(ManagedFieldsError::ManagedFieldsInConfig);
    }
    let schema = options.schema;
    let live = strip_metadata(live);
    let config = strip_metadata(config);
    let mut managers = Managers::new(managed);
    let before: BTreeMap<ManagerId, FieldSet> = managers
        .entries
        .iter()
        .map(|(k, e)| (k.clone(), e.fields.clone()))
        .collect();

    let merged = merge(&live, &config, schema)?;
    let id = ManagerId {
        manager: options.manager.clone(),
        operation: Operation::Apply,
        api_version: String::new(),
        subresource: options.subresource.clone(),
    };
    let last = managers.entries.get(&id).map(|e| e.fields.clone());
    let applied = field_set(&config, schema, true)?.recursive_difference(&options.ignored);
    managers.entries.insert(
        id.clone(),
        ManagedFieldsEntry {
            manager: options.manager.clone(),
            operation: Operation::Apply,
            api_version: options.api_version.clone(),
            time: Some(options.now.clone()),
            fields: applied,
            subresource: options.subresource.clone(),
        },
    );
    let merged = prune(merged, &managers, last.as_ref(), schema)?;

    let comparison = compare(&live, &merged, schema)?;
    let changed_fields = comparison
        .modified
        .union(&comparison.added)
        .recursive_difference(&options.ignored);
    let removed = comparison.removed.recursive_difference(&options.ignored);
    let mut conflicts = Vec::new();
    for (other, entry) in &managers.entries {
        if *other == id {
            continue;
        }
        for path in entry.fields.intersection(&changed_fields).paths() {
            conflicts.push(Conflict {
                manager: other.clone(),
                path,
            });
        }
    }
    if !conflicts.is_empty() && !options.force {
        return Ok(ApplyOutcome::Conflicts(conflicts));
    }
    for (other, entry) in managers.entries.iter_mut() {
        if *other != id {
            entry.fields = entry
                .fields
                .difference(&changed_fields)
                .difference(&removed);
        }
    }
    let strip = strip_set();
    for entry in managers.entries.values_mut() {
        entry.fields = entry.fields.difference(&strip);
    }

    let after: BTreeMap<&ManagerId, &FieldSet> = managers
        .entries
        .iter()
        .filter(|(_, e)| !e.fields.is_empty())
        .map(|(k, e)| (k, &e.fields))
        .collect();
    let ownership_unchanged = before
        .iter()
        .filter(|(_, s)| !s.is_empty())
        .collect::<BTreeMap<_, _>>()
        == after;
    let changed = !(json_equal(&merged, &live) && ownership_unchanged);
    let managed_fields = if changed {
        managers.into_sorted()
    } else {
        // Nothing changed: keep the entries as they were, timestamps included, so the caller
        // can skip the write (upstream ignores timestamp-only managedFields changes).
        managed.to_vec()
    };
    let mut object = merged;
    set_managed_fields(&mut object, &managed_fields);
    Ok(ApplyOutcome::Applied {
        object,
        managed_fields,
        changed,
    })
}

/// Parameters of a non-apply write.
#[derive(Debug, Clone)]
pub struct UpdateOptions {
    /// The writing field manager.
    pub manager: String,
    /// The operation to record: [`Operation::Update`] for ordinary writes. Recording
    /// [`Operation::Apply`] here only attributes the changed fields to the applier's entry; it
    /// neither prunes nor detects conflicts (use [`apply`] for that).
    pub operation: Operation,
    /// The API version of the request.
    pub api_version: String,
    /// The current time (RFC 3339).
    pub now: String,
    /// The kind's schema ([`Schema::unknown`] for custom resources).
    pub schema: Schema,
    /// Fields whose ownership is not tracked for this endpoint.
    pub ignored: FieldSet,
    /// The subresource written through, if any.
    pub subresource: String,
}

/// Records a create/update/patch by `options.manager` that turned `old` (use `{}` for a
/// create) into `new`: the fields it changed or added become its own (taken from whoever owned
/// them) and removed fields are dropped from every manager. Returns the new entries; the
/// manager's timestamp moves only when it gained fields.
pub fn update(
    old: &Value,
    new: &Value,
    managed: &[ManagedFieldsEntry],
    options: &UpdateOptions,
) -> Result<Vec<ManagedFieldsEntry>, ManagedFieldsError> {
    let schema = options.schema;
    let old = strip_metadata(old);
    let new = strip_metadata(new);
    let comparison = compare(&old, &new, schema)?;
    let strip = strip_set();
    let changed = comparison
        .modified
        .union(&comparison.added)
        .recursive_difference(&options.ignored)
        .difference(&strip);
    let removed = comparison.removed.recursive_difference(&options.ignored);
    let mut managers = Managers::new(managed);
    for entry in managers.entries.values_mut() {
        entry.fields = entry
            .fields
            .difference(&changed)
            .difference(&removed)
            .difference(&strip);
    }
    if !changed.is_empty() {
        let entry = ManagedFieldsEntry {
            manager: options.manager.clone(),
            operation: options.operation,
            api_version: options.api_version.clone(),
            time: None,
            fields: FieldSet::new(),
            subresource: options.subresource.clone(),
        };
        let entry = managers.entries.entry(entry.id()).or_insert(entry);
        entry.fields = entry.fields.union(&changed);
        entry.api_version = options.api_version.clone();
        entry.time = Some(options.now.clone());
    }
    Ok(managers.into_sorted())
}

/// Convenience for the apiserver's write path: `entries` are the JSON `managedFields` of the
/// request (the old object's are used when the request has none, as upstream does), `old` is
/// `None` for a create, and the kind's schema comes from `new.kind`. Returns JSON entries.
pub fn update_ownership(
    entries: &[Value],
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    operation: &str,
    api_version: &str,
    now: &str,
) -> Result<Vec<Value>, ManagedFieldsError> {
    let empty = Value::Object(Map::new());
    let old = old.unwrap_or(&empty);
    let mut managed: Vec<ManagedFieldsEntry> = entries
        .iter()
        .map(ManagedFieldsEntry::from_json)
        .collect::<Result<_, _>>()?;
    if managed.is_empty() {
        managed = decode_managed_fields(old)?;
    }
    let schema = new
        .get("kind")
        .and_then(Value::as_str)
        .and_then(Schema::for_kind)
        .unwrap_or_default();
    let operation = match operation {
        "Update" => Operation::Update,
        "Apply" => Operation::Apply,
        other => {
            return Err(ManagedFieldsError::InvalidEntry(format!(
                "unknown operation {other:?}"
            )));
        }
    };
    let options = UpdateOptions {
        manager: manager.to_string(),
        operation,
        api_version: api_version.to_string(),
        now: now.to_string(),
        schema,
        ignored: FieldSet::new(),
        subresource: String::new(),
    };
    let updated = update(old, new, &managed, &options)?;
    Ok(updated.iter().map(ManagedFieldsEntry::to_json).collect())
}
