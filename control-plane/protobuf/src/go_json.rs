//! JSON as the Kubernetes API server writes it (Go's `encoding/json` over the Go types): a
//! serializable view of a value, [`GoJson`], that writes `kind` and `apiVersion` first, then
//! each field in the Go struct's order (the descriptor set's declaration order, through
//! inline embedding), the value (non-pointer) struct fields Go always writes when they are
//! absent — `{}`, or the zero value's own form: `null` for a `metav1.Time`, `0` for an
//! `IntOrString` — and map keys sorted. Objects that are not built-in kinds are written as
//! they were built, or, for a custom resource, with every key sorted as Go writes an
//! unstructured object. Nothing is copied or rebuilt: each object's keys are ranked by a
//! table built once per message type, and written in rank order. Escaping is the
//! serializer's (`flotilla_api_machinery::gojson`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{LazyLock, OnceLock};

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::schema::{self, Schema, Shape, Special, Type};

/// Deeper than any real object (see [`crate::MAX_DEPTH`]); past it values are written as
/// they are.
const MAX_DEPTH: usize = crate::MAX_DEPTH;

/// A value as the API server writes it (see the module's text).
pub struct GoJson<'a> {
    value: &'a Value,
    custom: bool,
    zero_structs: bool,
}

impl<'a> GoJson<'a> {
    /// `value` as an answer, an object of a custom resource when `custom` (then its keys
    /// are sorted).
    pub fn new(value: &'a Value, custom: bool) -> Self {
        GoJson {
            value,
            custom,
            zero_structs: true,
        }
    }

    /// `value` as it is stored: in the same order, without the value structs it lacks (what
    /// is stored is what was written), so that reading it back needs no reordering.
    pub fn stored(value: &'a Value) -> Self {
        GoJson {
            value,
            custom: false,
            zero_structs: false,
        }
    }
}

impl Serialize for GoJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let schema = schema::schema().ok();
        if let (Some(schema), Value::Object(map)) = (schema, self.value)
            && let Some(message) = kind_of(schema, map)
        {
            return MessageJson {
                schema,
                message,
                map,
                top: true,
                depth: 0,
                zero_structs: self.zero_structs,
            }
            .serialize(serializer);
        }
        if self.custom {
            Sorted(self.value, 0).serialize(serializer)
        } else {
            self.value.serialize(serializer)
        }
    }
}

/// The message of a built-in object by its `apiVersion` and `kind`.
fn kind_of(schema: &Schema, map: &Map<String, Value>) -> Option<usize> {
    let api_version = map.get("apiVersion")?.as_str()?;
    let kind = map.get("kind")?.as_str()?;
    schema.kind(api_version, kind)
}

/// FNV-1a: field names are short and trusted (the schema's); the lookup is on every key of
/// every object written.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut hash = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = hash;
    }
}

/// One field of a message, inline embedding flattened.
struct FlatField {
    name: &'static str,
    ty: Type,
    shape: Shape,
    /// A value struct (or special type held by value): written even when absent.
    always: bool,
}

/// A message's fields in the Go struct's order, with what writing needs of them.
struct Layout {
    fields: Vec<FlatField>,
    rank: HashMap<&'static str, u32, BuildHasherDefault<Fnv>>,
    /// Value structs (and the special types held by value), written even when absent.
    always: Vec<u32>,
    /// Whether the message embeds `TypeMeta` itself (then it needs no leading pair).
    embeds_type_meta: bool,
}

fn flatten(
    schema: &'static Schema,
    message: usize,
    out: &mut Vec<(FlatField, bool)>,
    depth: usize,
) {
    for field in &schema.messages[message].fields {
        if field.inline
            && let Type::Message(target) = field.ty
            && depth < MAX_DEPTH
        {
            flatten(schema, target, out, depth + 1);
            continue;
        }
        let always =
            !field.nullable && field.shape == Shape::Single && matches!(field.ty, Type::Message(_));
        out.push((
            FlatField {
                name: field.name.as_str(),
                ty: field.ty,
                shape: field.shape,
                always,
            },
            always,
        ));
    }
}

/// The layout of `message`, built on first use.
fn layout(schema: &'static Schema, message: usize) -> &'static Layout {
    static LAYOUTS: OnceLock<Vec<OnceLock<Layout>>> = OnceLock::new();
    let layouts = LAYOUTS.get_or_init(|| {
        (0..schema.messages.len())
            .map(|_| OnceLock::new())
            .collect()
    });
    layouts[message].get_or_init(|| {
        let mut flat = Vec::new();
        flatten(schema, message, &mut flat, 0);
        let rank = flat
            .iter()
            .enumerate()
            .map(|(i, (field, _))| (field.name, i as u32))
            .collect();
        let always = flat
            .iter()
            .enumerate()
            .filter(|(_, (_, always))| *always)
            .map(|(i, _)| i as u32)
            .collect();
        let embeds_type_meta = schema.messages[message].fields.iter().any(|field| {
            field.inline
                && matches!(field.ty, Type::Message(target)
                    if schema::simple_name(&schema.messages[target].name) == "TypeMeta")
        });
        Layout {
            fields: flat.into_iter().map(|(field, _)| field).collect(),
            rank,
            always,
            embeds_type_meta,
        }
    })
}

/// What an absent value struct is written as.
static EMPTY: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);
static NULL: Value = Value::Null;
static ZERO_INT: LazyLock<Value> = LazyLock::new(|| Value::from(0));
static ZERO_QUANTITY: LazyLock<Value> = LazyLock::new(|| Value::from("0"));
static ZERO_DURATION: LazyLock<Value> = LazyLock::new(|| Value::from("0s"));

/// Ranks below the fields' are `kind` and `apiVersion`; keys the type lacks come last.
const TYPE_META_RANKS: u32 = 2;
const UNKNOWN: u32 = u32::MAX;

/// One built-in object (or nested struct) written in its Go order.
struct MessageJson<'a> {
    schema: &'static Schema,
    message: usize,
    map: &'a Map<String, Value>,
    /// A top-level object: `kind` and `apiVersion` lead.
    top: bool,
    depth: usize,
    /// Whether absent value structs are written (see `always`).
    zero_structs: bool,
}

impl Serialize for MessageJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.depth > MAX_DEPTH {
            return self.map.serialize(serializer);
        }
        let layout = layout(self.schema, self.message);
        let leading = self.top && !layout.embeds_type_meta;
        if self.in_order(layout, leading) {
            return self.serialize_in_order(layout, leading, serializer);
        }
        let mut entries: Vec<(u32, &str, &Value)> = Vec::with_capacity(self.map.len() + 2);
        let mut in_order = true;
        let mut last = 0;
        // The fields present, by rank (objects have far fewer than 256 fields; past that the
        // map is asked).
        let mut present = [0u64; 4];
        for (key, value) in self.map {
            let rank = match key.as_str() {
                "kind" if leading => 0,
                "apiVersion" if leading => 1,
                _ => layout
                    .rank
                    .get(key.as_str())
                    .map_or(UNKNOWN, |r| r + TYPE_META_RANKS),
            };
            in_order &= rank >= last && rank != UNKNOWN;
            last = rank;
            if let Some(word) = present.get_mut((rank / 64) as usize) {
                *word |= 1 << (rank % 64);
            }
            entries.push((rank, key, value));
        }
        for &index in layout.always.iter().filter(|_| self.zero_structs) {
            let field = &layout.fields[index as usize];
            let rank = index + TYPE_META_RANKS;
            let seen = match present.get((rank / 64) as usize) {
                Some(word) => word & (1 << (rank % 64)) != 0,
                None => self.map.contains_key(field.name),
            };
            if seen {
                continue;
            }
            in_order = false;
            entries.push((rank, field.name, self.zero_of(field)));
        }
        if !in_order {
            // Stable and adaptive: an object stored in order with a value struct appended
            // costs a merge, not a sort.
            entries.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        }
        let mut map = serializer.serialize_map(Some(entries.len()))?;
        for (rank, key, value) in entries {
            map.serialize_key(key)?;
            if rank < TYPE_META_RANKS || rank == UNKNOWN {
                map.serialize_value(value)?;
                continue;
            }
            let field = &layout.fields[(rank - TYPE_META_RANKS) as usize];
            map.serialize_value(&self.field(field, value))?;
        }
        map.end()
    }
}

/// The name at `position` of an object's expected key sequence: `kind` and `apiVersion` when
/// they lead, then the fields.
fn expected(layout: &Layout, leading: bool, position: usize) -> Option<&'static str> {
    match (leading, position) {
        (true, 0) => Some("kind"),
        (true, 1) => Some("apiVersion"),
        (true, _) => layout.fields.get(position - 2).map(|f| f.name),
        (false, _) => layout.fields.get(position).map(|f| f.name),
    }
}

impl MessageJson<'_> {
    /// Whether every key is a field and they come in the Go order (what a stored object
    /// read back has): one merge walk of string comparisons, no lookups.
    fn in_order(&self, layout: &Layout, leading: bool) -> bool {
        let mut position = 0;
        'keys: for key in self.map.keys() {
            while let Some(name) = expected(layout, leading, position) {
                position += 1;
                if name == key {
                    continue 'keys;
                }
            }
            return false;
        }
        true
    }

    /// Writes an object whose keys are in order, the absent value structs in their places.
    fn serialize_in_order<S: Serializer>(
        &self,
        layout: &Layout,
        leading: bool,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let offset = if leading { TYPE_META_RANKS as usize } else { 0 };
        let mut out = serializer.serialize_map(None)?;
        let mut position = 0;
        let mut keys = self.map.iter().peekable();
        while let Some(name) = expected(layout, leading, position) {
            let field = position.checked_sub(offset).map(|i| &layout.fields[i]);
            position += 1;
            match keys.peek() {
                Some((key, value)) if key.as_str() == name => {
                    out.serialize_key(name)?;
                    match field {
                        Some(field) => out.serialize_value(&self.field(field, value))?,
                        None => out.serialize_value(*value)?,
                    }
                    keys.next();
                }
                _ => {
                    if let Some(field) = field.filter(|f| f.always && self.zero_structs) {
                        out.serialize_key(name)?;
                        out.serialize_value(&self.field(field, self.zero_of(field)))?;
                    }
                }
            }
        }
        out.end()
    }

    fn field<'b>(&self, field: &FlatField, value: &'b Value) -> FieldJson<'b> {
        FieldJson {
            schema: self.schema,
            ty: field.ty,
            shape: field.shape,
            value,
            depth: self.depth + 1,
            zero_structs: self.zero_structs,
        }
    }

    /// What an absent value struct is written as: its zero value's JSON form (a struct's
    /// is written from [`NULL`] as `{}`).
    fn zero_of(&self, field: &FlatField) -> &'static Value {
        let Type::Message(target) = field.ty else {
            return &NULL;
        };
        match self.schema.messages[target].special {
            Some(Special::IntOrString) => &ZERO_INT,
            Some(Special::Quantity) => &ZERO_QUANTITY,
            Some(Special::Duration) => &ZERO_DURATION,
            _ => &NULL,
        }
    }
}

/// A message type that is walked (not one with a JSON form of its own).
fn walked(schema: &Schema, ty: Type) -> Option<usize> {
    match ty {
        Type::Message(target) if schema.messages[target].special.is_none() => Some(target),
        _ => None,
    }
}

/// One field's value written as its declared type says.
struct FieldJson<'a> {
    schema: &'static Schema,
    ty: Type,
    shape: Shape,
    value: &'a Value,
    depth: usize,
    zero_structs: bool,
}

impl FieldJson<'_> {
    fn message<'a>(&self, target: usize, map: &'a Map<String, Value>) -> MessageJson<'a> {
        MessageJson {
            schema: self.schema,
            message: target,
            map,
            top: false,
            depth: self.depth,
            zero_structs: self.zero_structs,
        }
    }
}

impl Serialize for FieldJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let target = walked(self.schema, self.ty);
        match (self.shape, self.value, target) {
            (Shape::Single, Value::Object(map), Some(target)) => {
                self.message(target, map).serialize(serializer)
            }
            // An absent value struct (see `always`).
            (Shape::Single, Value::Null, Some(target)) => {
                self.message(target, &EMPTY).serialize(serializer)
            }
            (Shape::Repeated, Value::Array(items), Some(target)) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    match item {
                        Value::Object(map) => seq.serialize_element(&self.message(target, map))?,
                        other => seq.serialize_element(other)?,
                    }
                }
                seq.end()
            }
            (Shape::Map { value: entry, .. }, Value::Object(map), _) => {
                let entry = walked(self.schema, entry);
                let write = |key: &String, value: &Value, out: &mut S::SerializeMap| {
                    out.serialize_key(key)?;
                    match (value, entry) {
                        (Value::Object(fields), Some(target)) => {
                            out.serialize_value(&self.message(target, fields))
                        }
                        (other, _) => out.serialize_value(other),
                    }
                };
                let mut out = serializer.serialize_map(Some(map.len()))?;
                // Maps are mostly stored sorted already; Go writes them sorted.
                if map.keys().zip(map.keys().skip(1)).all(|(a, b)| a <= b) {
                    for (key, value) in map {
                        write(key, value, &mut out)?;
                    }
                } else {
                    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                    for (key, value) in entries {
                        write(key, value, &mut out)?;
                    }
                }
                out.end()
            }
            _ => self.value.serialize(serializer),
        }
    }
}

/// Sorts every object's keys in place, as Go writes an unstructured object (a custom
/// resource); the workspace's maps keep insertion order, so it serializes sorted.
pub fn sort_unstructured(value: &mut Value) {
    fn sort(value: &mut Value, depth: usize) {
        match value {
            Value::Object(map) if depth <= MAX_DEPTH => {
                map.sort_keys();
                map.values_mut().for_each(|v| sort(v, depth + 1));
            }
            Value::Array(items) if depth <= MAX_DEPTH => {
                items.iter_mut().for_each(|v| sort(v, depth + 1));
            }
            _ => {}
        }
    }
    sort(value, 0);
}

/// A value with every object's keys sorted, as Go writes a `map[string]interface{}`.
struct Sorted<'a>(&'a Value, usize);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) if self.1 <= MAX_DEPTH => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_unstable();
                let mut out = serializer.serialize_map(Some(keys.len()))?;
                for key in keys {
                    out.serialize_key(key)?;
                    out.serialize_value(&Sorted(&map[key.as_str()], self.1 + 1))?;
                }
                out.end()
            }
            Value::Array(items) if self.1 <= MAX_DEPTH => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Sorted(item, self.1 + 1))?;
                }
                seq.end()
            }
            other => other.serialize(serializer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(value: Value) -> String {
        let custom = value["apiVersion"]
            .as_str()
            .is_some_and(|v| v.contains("example.com"));
        serde_json::to_string(&GoJson::new(&value, custom)).expect("JSON")
    }

    #[test]
    fn a_status_is_in_upstreams_order() {
        let status = json!({"apiVersion": "v1", "code": 404, "details": {"kind": "pods", "name": "x"},
            "kind": "Status", "message": "pods \"x\" not found", "metadata": {},
            "reason": "NotFound", "status": "Failure"});
        assert_eq!(
            text(status),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"pods"},"code":404}"#
        );
    }

    #[test]
    fn value_structs_are_always_written_and_fields_keep_go_order() {
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "web"},
            "spec": {"type": "ClusterIP", "ports": [{"port": 80, "name": "http", "protocol": "TCP"}]}});
        assert_eq!(
            text(service),
            r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web","namespace":"shop","creationTimestamp":null},"spec":{"ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":0}],"type":"ClusterIP"},"status":{"loadBalancer":{}}}"#
        );
    }

    #[test]
    fn custom_resources_maps_and_unknown_keys_are_sorted() {
        let widget =
            json!({"kind": "Widget", "apiVersion": "example.com/v1", "spec": {"b": 1, "a": 2}});
        assert_eq!(
            text(widget),
            r#"{"apiVersion":"example.com/v1","kind":"Widget","spec":{"a":2,"b":1}}"#
        );
        let config_map = json!({"kind": "ConfigMap", "apiVersion": "v1", "zzz": true,
            "data": {"b": "1", "a": "2"}, "metadata": {"name": "c", "creationTimestamp": "2026-01-01T00:00:00Z"}});
        assert_eq!(
            text(config_map),
            r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c","creationTimestamp":"2026-01-01T00:00:00Z"},"data":{"a":"2","b":"1"},"zzz":true}"#
        );
    }

    #[test]
    fn a_list_orders_each_item() {
        let list = json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "5"},
            "items": [{"data": {"k": "v"}, "metadata": {"name": "a", "creationTimestamp": null}}]});
        assert_eq!(
            text(list),
            r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","creationTimestamp":null},"data":{"k":"v"}}]}"#
        );
    }

    #[test]
    fn an_object_in_order_gets_its_absent_value_structs_in_their_places() {
        let pod = json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i", "imagePullPolicy": "Always"}]}});
        assert_eq!(
            text(pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","creationTimestamp":null},"spec":{"containers":[{"name":"c","image":"i","resources":{},"imagePullPolicy":"Always"}]},"status":{}}"#
        );
    }

    #[test]
    fn stored_objects_are_ordered_without_added_structs() {
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "spec": {"type": "ClusterIP"}, "metadata": {"name": "web"}});
        assert_eq!(
            serde_json::to_string(&GoJson::stored(&service)).expect("JSON"),
            r#"{"kind":"Service","apiVersion":"v1","metadata":{"name":"web"},"spec":{"type":"ClusterIP"}}"#
        );
    }

    #[test]
    fn other_objects_are_written_as_built() {
        let version = json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0"});
        assert_eq!(
            text(version),
            r#"{"major":"1","minor":"33","gitVersion":"v1.33.0"}"#
        );
    }
}
