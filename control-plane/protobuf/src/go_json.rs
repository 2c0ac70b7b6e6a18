//! JSON as the Kubernetes API server writes it (Go's `encoding/json` over the Go types): a
//! serializable view of a value, [`GoJson`], that writes `kind` and `apiVersion` first, then
//! each field in the Go struct's order (the descriptor set's declaration order, through
//! inline embedding), the value (non-pointer) struct fields Go always writes when they are
//! absent — `{}`, or the zero value's own form: `null` for a `metav1.Time`, `0` for an
//! `IntOrString` — and map keys sorted. Objects that are not built-in kinds are written as
//! they were built, or, for a custom resource, with every key sorted as Go writes an
//! unstructured object. Nothing is copied or rebuilt: each object's keys are matched, in one
//! pass, against its type's field names in order (a table built once per message type), and
//! written in that order; the few keys out of place in an object stored before this order
//! was kept are written where they belong on the way. Escaping is the serializer's
//! (`flotilla_api_machinery::gojson`).

use std::sync::{LazyLock, OnceLock};

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Map, Value};

use crate::schema::{self, JsonZero, Schema, Shape, Special, Type};

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

/// One field of a message, inline embedding flattened, with what writing it needs worked out
/// once.
struct FlatField {
    name: &'static str,
    shape: Shape,
    /// The message walked for this field's values (for a map, its values'), unless they have
    /// a JSON form of their own.
    walked: Option<usize>,
    /// A value struct (or special type held by value), or a field whose `json` tag has no
    /// `omitempty`: written even when absent.
    always: bool,
    /// What the field is written from when it is absent and `always`: its zero value's JSON
    /// form (a struct's is written from [`NULL`] as `{}`).
    zero: &'static Value,
    /// A nil pointer, slice or map without `omitempty`: an absent value is written as `null`,
    /// not as the struct it points to.
    nil_is_null: bool,
    /// For a CustomResourceDefinition schema union (`JSONSchemaPropsOrArray`, …): the
    /// `JSONSchemaProps` message its object (or array of objects) form is written as.
    union_schema: Option<usize>,
}

/// Ranks are bytes: `kind` and `apiVersion` take 0 and 1, the fields follow, and this marks a
/// key the type lacks. No message comes near 254 fields (the test
/// `every_layout_fits_in_byte_ranks_and_names_each_field_once` checks); a larger one would be
/// written as built.
const UNKNOWN: u8 = u8::MAX;

/// Ranks below the fields' are `kind` and `apiVersion`.
const TYPE_META_RANKS: usize = 2;

/// The expected key sequence of a message, by rank: `kind`, `apiVersion`, then the fields in
/// the Go struct's order.
struct Layout {
    /// By rank.
    names: Vec<&'static str>,
    /// The names' [`head_word`]s, by rank.
    heads: Vec<u64>,
    fields: Vec<FlatField>,
    /// For each field index (and one past the last), the first `always` field at or after it:
    /// the absent value structs between two present keys are found without visiting the
    /// fields between them.
    next_always: Vec<u8>,
    /// The `always` fields, as a set of ranks.
    always_ranks: [u64; 4],
    /// The rank a key found at a rank is sorted by when the object is far out of order,
    /// without and with leading `kind` and `apiVersion`: the name's last rank among the
    /// fields, and 0 and 1 for `kind` and `apiVersion` when they lead. Every compiled-in
    /// message names each field once, so this is the identity but for the messages with
    /// fields named `kind` or `apiVersion` written with a leading pair (an `ObjectReference`
    /// as a top-level object).
    sort_rank: [Vec<u8>; 2],
    /// Whether `sort_rank` is the identity over the ranks looked for, without and with
    /// leading `kind` and `apiVersion`.
    sort_rank_is_identity: [bool; 2],
    /// Whether the message embeds `TypeMeta` itself (then it needs no leading pair).
    embeds_type_meta: bool,
    /// Too many fields for byte ranks (see [`UNKNOWN`]): written as built.
    oversized: bool,
}

fn flatten(schema: &'static Schema, message: usize, out: &mut Vec<FlatField>, depth: usize) {
    for field in &schema.messages[message].fields {
        if field.inline
            && let Type::Message(target) = field.ty
            && depth < MAX_DEPTH
        {
            flatten(schema, target, out, depth + 1);
            continue;
        }
        let value_struct =
            !field.nullable && field.shape == Shape::Single && matches!(field.ty, Type::Message(_));
        let element = match field.shape {
            Shape::Map { value, .. } => value,
            Shape::Single | Shape::Repeated => field.ty,
        };
        let zero = match field.json_zero {
            Some(JsonZero::EmptyString) => &EMPTY_STRING,
            Some(JsonZero::False) => &FALSE,
            Some(JsonZero::Zero) => &ZERO_INT,
            Some(JsonZero::Null) | None => zero_of(schema, field.ty),
        };
        out.push(FlatField {
            name: field.name.as_str(),
            shape: field.shape,
            walked: walked(schema, element),
            always: value_struct || field.json_zero.is_some(),
            zero,
            nil_is_null: !value_struct && field.json_zero == Some(JsonZero::Null),
            union_schema: union_schema(schema, element),
        });
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
    layouts[message].get_or_init(|| build_layout(schema, message))
}

fn build_layout(schema: &'static Schema, message: usize) -> Layout {
    let mut fields = Vec::new();
    flatten(schema, message, &mut fields, 0);
    let embeds_type_meta = schema.messages[message].fields.iter().any(|field| {
        field.inline
            && matches!(field.ty, Type::Message(target)
                if schema::simple_name(&schema.messages[target].name) == "TypeMeta")
    });
    let names: Vec<&'static str> = ["kind", "apiVersion"]
        .into_iter()
        .chain(fields.iter().map(|field| field.name))
        .collect();
    let oversized = names.len() >= usize::from(DISPLACED);
    let byte = |index: usize| u8::try_from(index).unwrap_or(UNKNOWN);
    let mut next_always = vec![byte(fields.len()); fields.len() + 1];
    for index in (0..fields.len()).rev() {
        next_always[index] = if fields[index].always {
            byte(index)
        } else {
            next_always[index + 1]
        };
    }
    let mut always_ranks = [0u64; 4];
    for (index, _) in fields.iter().enumerate().filter(|(_, f)| f.always) {
        let rank = index + TYPE_META_RANKS;
        if let Some(word) = always_ranks.get_mut(rank / 64) {
            *word |= 1 << (rank % 64);
        }
    }
    let last_rank = |name: &str| {
        let index = fields.iter().rposition(|field| field.name == name);
        index.map_or(UNKNOWN, |index| byte(index + TYPE_META_RANKS))
    };
    let without: Vec<u8> = (0..names.len())
        .map(|rank| match rank {
            0 | 1 => byte(rank),
            _ => last_rank(names[rank]),
        })
        .collect();
    let with = (0..names.len())
        .map(|rank| match names[rank] {
            "kind" => 0,
            "apiVersion" => 1,
            _ => without[rank],
        })
        .collect();
    let sort_rank = [without, with];
    let sort_rank_is_identity = [TYPE_META_RANKS, 0].map(|start| {
        (start..names.len())
            .all(|rank| usize::from(sort_rank[usize::from(start == 0)][rank]) == rank)
    });
    Layout {
        heads: names
            .iter()
            .map(|name| head_word(name.as_bytes()))
            .collect(),
        names,
        fields,
        next_always,
        always_ranks,
        sort_rank,
        sort_rank_is_identity,
        embeds_type_meta,
        oversized,
    }
}

impl Layout {
    /// The first rank from `start` on whose name is `key`.
    fn find(&self, start: usize, key: &str) -> Option<usize> {
        let bytes = key.as_bytes();
        find_name(
            &self.heads,
            &self.names,
            start..self.names.len(),
            bytes,
            head_word(bytes),
        )
    }
}

/// What an absent value struct is written as.
static EMPTY: LazyLock<Map<String, Value>> = LazyLock::new(Map::new);
static NULL: Value = Value::Null;
static ZERO_INT: LazyLock<Value> = LazyLock::new(|| Value::from(0));
static ZERO_QUANTITY: LazyLock<Value> = LazyLock::new(|| Value::from("0"));
static ZERO_DURATION: LazyLock<Value> = LazyLock::new(|| Value::from("0s"));
static EMPTY_STRING: LazyLock<Value> = LazyLock::new(|| Value::from(""));
static FALSE: Value = Value::Bool(false);

/// The zero value's JSON form of a field of type `ty`, for when it is absent (a struct's is
/// written from [`NULL`] as `{}`).
fn zero_of(schema: &Schema, ty: Type) -> &'static Value {
    let Type::Message(target) = ty else {
        return &NULL;
    };
    match schema.messages[target].special {
        Some(Special::IntOrString) => &ZERO_INT,
        Some(Special::Quantity) => &ZERO_QUANTITY,
        Some(Special::Duration) => &ZERO_DURATION,
        _ => &NULL,
    }
}

/// A word a name's bytes and length determine, its first eight bytes for the longer ones: a
/// key is looked for among a layout's names by comparing these, one word each, because
/// nearly every key of every object written is looked for, and comparing strings (a call to
/// `memcmp`, or a branch a byte) costs as much as writing the key.
#[inline]
fn head_word(name: &[u8]) -> u64 {
    if let Some(head) = name.first_chunk::<8>() {
        return u64::from_le_bytes(*head);
    }
    if let (Some(first), Some(last)) = (name.first_chunk::<4>(), name.last_chunk::<4>()) {
        return u64::from(u32::from_le_bytes(*first)) | u64::from(u32::from_le_bytes(*last)) << 32;
    }
    match name {
        [] => 0,
        [first, ..] => {
            u64::from(*first)
                | u64::from(name[name.len() / 2]) << 8
                | u64::from(name[name.len() - 1]) << 16
        }
    }
}

/// Whether `key` is `name`, given their [`head_word`]s are equal (which, with the lengths,
/// settles it for names of up to eight bytes).
#[inline]
fn same_rest(key: &[u8], name: &[u8]) -> bool {
    if key.len() != name.len() {
        return false;
    }
    match (key.get(8..), name.get(8..)) {
        (Some(key), Some(name)) => {
            key.last_chunk::<8>() == name.last_chunk::<8>()
                && (key.as_chunks::<8>().0.iter())
                    .zip(name.as_chunks::<8>().0)
                    .all(|(a, b)| a == b)
        }
        _ => true,
    }
}

/// The first rank in `ranks` whose name is `key` (whose [`head_word`] is `head`).
#[inline]
fn find_name(
    heads: &[u64],
    names: &[&str],
    ranks: std::ops::Range<usize>,
    key: &[u8],
    head: u64,
) -> Option<usize> {
    let (Some(heads), Some(names)) = (heads.get(ranks.clone()), names.get(ranks.clone())) else {
        return None;
    };
    for (offset, (&candidate, name)) in heads.iter().zip(names).enumerate() {
        if candidate == head && same_rest(key, name.as_bytes()) {
            return Some(ranks.start + offset);
        }
    }
    None
}

/// Keys of objects up to this size are ranked on the stack.
const INLINE_KEYS: usize = 64;

/// The rank of a key written elsewhere than its place in the object (see [`Displaced`]).
const DISPLACED: u8 = UNKNOWN - 1;

/// Keys out of their place an object may have and still be written in one pass; past that
/// it is sorted whole.
const DISPLACED_KEYS: usize = 8;

/// The keys of an object that do not follow on from the ones before them (keys moved, or
/// that the type lacks), with their ranks: written where their rank puts them, interleaved
/// with the keys that are in order. Objects stored before this order was kept have a few.
struct Displaced<'a> {
    entries: [(u8, &'a str, &'a Value); DISPLACED_KEYS],
    len: usize,
}

impl<'a> Displaced<'a> {
    fn new() -> Self {
        Displaced {
            entries: [(0, "", &NULL); DISPLACED_KEYS],
            len: 0,
        }
    }

    /// Adds a key, unless [`DISPLACED_KEYS`] are there already (which callers check first).
    fn push(&mut self, rank: u8, key: &'a str, value: &'a Value) {
        if let Some(entry) = self.entries.get_mut(self.len) {
            *entry = (rank, key, value);
            self.len += 1;
        }
    }

    /// By rank, and keys the type lacks (all [`UNKNOWN`]) by name, as Go sorts them.
    fn sorted(&mut self) -> &[(u8, &'a str, &'a Value)] {
        let entries = &mut self.entries[..self.len];
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
        entries
    }
}

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
        let layout = layout(self.schema, self.message);
        if self.depth > MAX_DEPTH || layout.oversized {
            return self.map.serialize(serializer);
        }
        let leading = self.top && !layout.embeds_type_meta;
        let mut inline = [0u8; INLINE_KEYS];
        let mut heap = Vec::new();
        let ranks = if self.map.len() <= INLINE_KEYS {
            &mut inline[..self.map.len()]
        } else {
            heap.resize(self.map.len(), 0);
            &mut heap[..]
        };
        let displaced = self.rank(layout, leading, ranks);
        if displaced == 0 {
            return self.serialize_in_order(layout, ranks, serializer);
        }
        // Out of order, keys are sorted by the rank their name has wherever it was found
        // (see `sort_rank`), which is where it was found but for the layouts that
        // `sort_rank_is_identity` tells apart.
        if displaced > DISPLACED_KEYS || !layout.sort_rank_is_identity[usize::from(leading)] {
            return self.serialize_sorted(layout, leading, serializer);
        }
        self.serialize_merged(layout, leading, ranks, serializer)
    }
}

impl MessageJson<'_> {
    /// Ranks every key, each looked for from just past the previous key in order (where it is
    /// when the object is in order, as a stored object read back is): those found there get
    /// their rank, the others are [`DISPLACED`]; returns how many are.
    fn rank(&self, layout: &Layout, leading: bool, ranks: &mut [u8]) -> usize {
        let start = if leading { 0 } else { TYPE_META_RANKS };
        let (names, heads) = (&layout.names, &layout.heads);
        let mut next = start;
        let mut displaced = 0;
        for (key, rank) in self.map.keys().zip(ranks.iter_mut()) {
            let key = key.as_bytes();
            match find_name(heads, names, next..names.len(), key, head_word(key)) {
                Some(found) => {
                    next = found + 1;
                    *rank = found as u8;
                }
                None => {
                    *rank = DISPLACED;
                    displaced += 1;
                }
            }
        }
        displaced
    }

    /// Writes an object whose keys are in order, the absent value structs in their places.
    ///
    /// The three writers are kept out of line: inlined into one body, the compiler stops
    /// inlining serde_json's one-byte writes (`,`, `:`) into their loops, which then cost
    /// a fifth of the time.
    #[inline(never)]
    fn serialize_in_order<S: Serializer>(
        &self,
        layout: &'static Layout,
        ranks: &[u8],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_map(None)?;
        // The first field whose absent value struct has not been written yet.
        let mut pending = 0;
        for ((key, value), &rank) in self.map.iter().zip(ranks) {
            let Some(index) = usize::from(rank).checked_sub(TYPE_META_RANKS) else {
                out.serialize_entry(key, value)?;
                continue;
            };
            self.serialize_field(layout, &mut pending, index, key, value, &mut out)?;
        }
        self.serialize_absent(layout, pending, layout.fields.len(), &mut out)?;
        out.end()
    }

    /// Writes an object with a few keys out of place: the keys in order with the displaced
    /// ones in their places (the keys the type lacks last), and the absent value structs in
    /// theirs.
    #[inline(never)]
    fn serialize_merged<S: Serializer>(
        &self,
        layout: &'static Layout,
        leading: bool,
        ranks: &[u8],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let start = if leading { 0 } else { TYPE_META_RANKS };
        let mut displaced = Displaced::new();
        for ((key, value), _) in self.map.iter().zip(ranks).filter(|(_, r)| **r == DISPLACED) {
            let found = layout.find(start, key);
            displaced.push(found.map_or(UNKNOWN, |r| r as u8), key, value);
        }
        let displaced = displaced.sorted();
        let mut out = serializer.serialize_map(None)?;
        // The first field whose absent value struct has not been written yet.
        let mut pending = 0;
        let mut in_order = self
            .map
            .iter()
            .zip(ranks)
            .filter(|(_, rank)| **rank != DISPLACED);
        let mut next_in_order = in_order.next();
        let mut moved = displaced.iter();
        let mut next_moved = moved.next();
        loop {
            let (rank, key, value) = match (next_in_order, next_moved) {
                (Some(((key, value), &rank)), Some(&(moved_rank, moved_key, moved_value))) => {
                    if moved_rank < rank {
                        next_moved = moved.next();
                        (moved_rank, moved_key, moved_value)
                    } else {
                        next_in_order = in_order.next();
                        (rank, key.as_str(), value)
                    }
                }
                (Some(((key, value), &rank)), None) => {
                    next_in_order = in_order.next();
                    (rank, key.as_str(), value)
                }
                (None, Some(&(moved_rank, moved_key, moved_value))) if moved_rank != UNKNOWN => {
                    next_moved = moved.next();
                    (moved_rank, moved_key, moved_value)
                }
                (None, _) => break,
            };
            let Some(index) = usize::from(rank).checked_sub(TYPE_META_RANKS) else {
                out.serialize_entry(key, value)?;
                continue;
            };
            self.serialize_field(layout, &mut pending, index, key, value, &mut out)?;
        }
        self.serialize_absent(layout, pending, layout.fields.len(), &mut out)?;
        // What is left are the keys the type lacks.
        for &(_, key, value) in next_moved.into_iter().chain(moved) {
            out.serialize_entry(key, value)?;
        }
        out.end()
    }

    /// Writes a field's value; a string, number or boolean as it is (what [`FieldJson`] would
    /// do), without the detour.
    #[inline]
    fn serialize_value<M: SerializeMap>(
        &self,
        field: &'static FlatField,
        value: &Value,
        out: &mut M,
    ) -> Result<(), M::Error> {
        match value {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => out.serialize_value(value),
            Value::Null | Value::Array(_) | Value::Object(_) => {
                out.serialize_value(&self.field(field, value))
            }
        }
    }

    /// Writes field `index` (`key`, `value`) after the absent value structs since `pending`,
    /// the first field not written yet, and moves `pending` past it.
    #[inline(always)]
    fn serialize_field<M: SerializeMap>(
        &self,
        layout: &'static Layout,
        pending: &mut usize,
        index: usize,
        key: &str,
        value: &Value,
        out: &mut M,
    ) -> Result<(), M::Error> {
        self.serialize_absent(layout, *pending, index, out)?;
        *pending = index + 1;
        out.serialize_key(key)?;
        self.serialize_value(&layout.fields[index], value, out)
    }

    /// Writes the absent value structs among fields `from..to` (none are present).
    #[inline(always)]
    fn serialize_absent<M: SerializeMap>(
        &self,
        layout: &'static Layout,
        from: usize,
        to: usize,
        out: &mut M,
    ) -> Result<(), M::Error> {
        if !self.zero_structs || usize::from(layout.next_always[from]) >= to {
            return Ok(());
        }
        self.serialize_absent_among(layout, from, to, out)
    }

    /// [`Self::serialize_absent`]'s loop, out of line: most objects have nothing absent.
    fn serialize_absent_among<M: SerializeMap>(
        &self,
        layout: &'static Layout,
        from: usize,
        to: usize,
        out: &mut M,
    ) -> Result<(), M::Error> {
        let mut index = usize::from(layout.next_always[from]);
        while index < to {
            let field = &layout.fields[index];
            out.serialize_key(field.name)?;
            out.serialize_value(&self.field(field, field.zero))?;
            index = usize::from(layout.next_always[index + 1]);
        }
        Ok(())
    }

    /// Writes an object far out of order: every key sorted by its name's rank (see
    /// `sort_rank`), the absent value structs in their places, then the keys the type lacks,
    /// sorted.
    #[inline(never)]
    fn serialize_sorted<S: Serializer>(
        &self,
        layout: &'static Layout,
        leading: bool,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let start = if leading { 0 } else { TYPE_META_RANKS };
        let sort_rank = &layout.sort_rank[usize::from(leading)];
        let mut by_rank: Vec<Option<&Value>> = vec![None; layout.names.len()];
        let mut present = [0u64; 4];
        let mut unknown: Vec<(&String, &Value)> = Vec::new();
        for (key, value) in self.map {
            let found = layout.find(start, key);
            let rank = found.and_then(|r| sort_rank.get(r)).map_or(UNKNOWN, |r| *r);
            match by_rank.get_mut(usize::from(rank)) {
                Some(slot) => {
                    *slot = Some(value);
                    present[usize::from(rank) / 64] |= 1 << (rank % 64);
                }
                None => unknown.push((key, value)),
            }
        }
        let mut out = serializer.serialize_map(None)?;
        for (word, (&present, &always)) in present.iter().zip(&layout.always_ranks).enumerate() {
            let mut bits = if self.zero_structs {
                present | always
            } else {
                present
            };
            while bits != 0 {
                let rank = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let value = by_rank[rank];
                let Some(index) = rank.checked_sub(TYPE_META_RANKS) else {
                    out.serialize_key(layout.names[rank])?;
                    out.serialize_value(value.unwrap_or(&NULL))?;
                    continue;
                };
                let field = &layout.fields[index];
                out.serialize_key(field.name)?;
                self.serialize_value(field, value.unwrap_or(field.zero), &mut out)?;
            }
        }
        unknown.sort_by(|a, b| a.0.cmp(b.0));
        for (key, value) in unknown {
            out.serialize_entry(key, value)?;
        }
        out.end()
    }

    fn field<'b>(&self, field: &'static FlatField, value: &'b Value) -> FieldJson<'b> {
        FieldJson {
            schema: self.schema,
            field,
            value,
            depth: self.depth + 1,
            zero_structs: self.zero_structs,
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

/// The schema message of a CustomResourceDefinition schema union type.
fn union_schema(schema: &Schema, ty: Type) -> Option<usize> {
    let Type::Message(target) = ty else {
        return None;
    };
    let message = &schema.messages[target];
    if !message.special.is_some_and(Special::is_schema_union) {
        return None;
    }
    message.fields.iter().find_map(|field| match field.ty {
        Type::Message(member) if field.name == "schema" => Some(member),
        _ => None,
    })
}

/// One field's value written as its declared type says.
struct FieldJson<'a> {
    schema: &'static Schema,
    field: &'static FlatField,
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
        let walked = self.field.walked;
        match (self.field.shape, self.value, walked) {
            (Shape::Single, Value::Object(map), Some(target)) => {
                self.message(target, map).serialize(serializer)
            }
            // An absent value struct (see `always`).
            (Shape::Single, Value::Null, Some(target)) if !self.field.nil_is_null => {
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
            (Shape::Map { .. }, Value::Object(map), entry) => {
                let write = |key: &String, value: &Value, out: &mut S::SerializeMap| {
                    out.serialize_key(key)?;
                    match (value, entry) {
                        (Value::Object(fields), Some(target)) => {
                            out.serialize_value(&self.message(target, fields))
                        }
                        (other, _) => match self.field.union_schema {
                            Some(target) => out.serialize_value(&self.union(target, other)),
                            None => out.serialize_value(other),
                        },
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
            _ => match self.field.union_schema {
                Some(target) => self.union(target, self.value).serialize(serializer),
                None => self.value.serialize(serializer),
            },
        }
    }
}

impl<'a> FieldJson<'a> {
    /// A value of a schema union, its schema objects in `JSONSchemaProps`' order.
    fn union(&self, target: usize, value: &'a Value) -> UnionJson<'a> {
        UnionJson {
            schema: self.schema,
            target,
            value,
            depth: self.depth,
            zero_structs: self.zero_structs,
        }
    }
}

/// A CustomResourceDefinition schema union's value (see `FlatField::union_schema`): a schema
/// object, an array (of schema objects, or strings), or a boolean.
struct UnionJson<'a> {
    schema: &'static Schema,
    target: usize,
    value: &'a Value,
    depth: usize,
    zero_structs: bool,
}

impl Serialize for UnionJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let message = |map| MessageJson {
            schema: self.schema,
            message: self.target,
            map,
            top: false,
            depth: self.depth,
            zero_structs: self.zero_structs,
        };
        match self.value {
            Value::Object(map) => message(map).serialize(serializer),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    match item {
                        Value::Object(map) => seq.serialize_element(&message(map))?,
                        other => seq.serialize_element(other)?,
                    }
                }
                seq.end()
            }
            other => other.serialize(serializer),
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

    /// Fields whose Go `json` tag has no `omitempty` are written when absent: zero scalars, and
    /// nil pointers, slices and maps as `null` (not as the struct they point to); the stored
    /// form keeps only what was written.
    #[test]
    fn fields_without_omitempty_are_written_as_their_zero() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "status": {"containerStatuses": [{"name": "c"}]}});
        let written = text(pod.clone());
        assert!(
            written.contains(r#"{"name":"c","state":{},"lastState":{},"ready":false,"restartCount":0,"image":"","imageID":""}"#),
            "{written}"
        );
        let stored = serde_json::to_string(&GoJson::stored(&pod)).expect("JSON");
        assert!(stored.contains(r#"[{"name":"c"}]"#), "{stored}");
        let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c"}, "spec": {"dataSource": {"kind": "VolumeSnapshot", "name": "s"}}});
        let written = text(claim);
        assert!(
            written
                .contains(r#""dataSource":{"apiGroup":null,"kind":"VolumeSnapshot","name":"s"}"#),
            "{written}"
        );
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "r"}});
        assert_eq!(
            text(role),
            r#"{"kind":"ClusterRole","apiVersion":"rbac.authorization.k8s.io/v1","metadata":{"name":"r","creationTimestamp":null},"rules":null}"#
        );
    }

    /// A CustomResourceDefinition is written in its Go types' order, down into its schema:
    /// JSON Schema's names, and the unions' schema objects ordered as `JSONSchemaProps`.
    #[test]
    fn custom_resource_definitions_are_in_go_order() {
        let crd = json!({"kind": "CustomResourceDefinition", "apiVersion": "apiextensions.k8s.io/v1",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"versions": [{"storage": true, "served": true, "name": "v1",
                "schema": {"openAPIV3Schema": {"properties": {"spec": {
                    "x-kubernetes-preserve-unknown-fields": true,
                    "type": "object",
                    "additionalProperties": {"type": "string", "description": "d"},
                    "items": [{"format": "int32", "type": "integer"}],
                }}, "type": "object"}}}],
                "scope": "Namespaced", "names": {"kind": "Widget", "plural": "widgets"},
                "group": "example.com"}});
        assert_eq!(
            text(crd),
            concat!(
                r#"{"kind":"CustomResourceDefinition","apiVersion":"apiextensions.k8s.io/v1","#,
                r#""metadata":{"name":"widgets.example.com","creationTimestamp":null},"#,
                r#""spec":{"group":"example.com","names":{"plural":"widgets","kind":"Widget"},"#,
                r#""scope":"Namespaced","versions":[{"name":"v1","served":true,"storage":true,"#,
                r#""schema":{"openAPIV3Schema":{"type":"object","properties":{"spec":{"#,
                r#""type":"object","items":[{"type":"integer","format":"int32"}],"#,
                r#""additionalProperties":{"description":"d","type":"string"},"#,
                r#""x-kubernetes-preserve-unknown-fields":true}}}}}]},"#,
                r#""status":{"conditions":null,"acceptedNames":{"plural":"","kind":""},"storedVersions":null}}"#
            )
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

    /// Reverses the keys of every object below `value` whose depth is in `depths`, and moves
    /// the first key of the others to the end: every mix of objects in order, a few keys
    /// out of place, and far out of order.
    fn reorder(value: &mut Value, depth: usize, reversed: &[usize]) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
                if reversed.contains(&depth) {
                    entries.reverse();
                } else if depth % 2 == 1 && !entries.is_empty() {
                    entries.rotate_left(1);
                }
                for (_, child) in &mut entries {
                    reorder(child, depth + 1, reversed);
                }
                *map = entries.into_iter().collect();
            }
            Value::Array(items) => items
                .iter_mut()
                .for_each(|v| reorder(v, depth + 1, reversed)),
            _ => {}
        }
    }

    #[test]
    fn the_order_keys_come_in_does_not_change_what_is_written() {
        let pod = json!({"kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": "p", "generateName": "p-", "namespace": "n", "uid": "u",
                "labels": {"b": "2", "a": "1"}, "zzz": 1, "annotations": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "name": "http"}],
                "env": [{"name": "A", "value": "1"}], "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}},
                "readinessProbe": {"httpGet": {"port": 80, "path": "/"}, "periodSeconds": 1, "timeoutSeconds": 1},
                "imagePullPolicy": "Always", "unknownToo": true}],
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute"}],
                "restartPolicy": "Always", "enableServiceLinks": true, "priority": 0, "schedulerName": "s",
                "dnsPolicy": "Default", "nodeName": "n", "hostname": "h", "subdomain": "d", "serviceAccountName": "a"},
            "status": {"phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}],
                "containerStatuses": [{"name": "c", "ready": true, "state": {"running": {}}, "lastState": {}}]}});
        let expected = text(pod.clone());
        let stored = serde_json::to_string(&GoJson::stored(&pod)).expect("JSON");
        for reversed in [&[][..], &[0], &[1], &[2, 3], &[0, 1, 2, 3, 4, 5, 6]] {
            let mut reordered = pod.clone();
            reorder(&mut reordered, 0, reversed);
            assert_eq!(
                text(reordered.clone()),
                expected,
                "reversed at depths {reversed:?}"
            );
            assert_eq!(
                serde_json::to_string(&GoJson::stored(&reordered)).expect("JSON"),
                stored,
                "reversed at depths {reversed:?}"
            );
        }
    }

    /// What ranks as bytes and the one-pass writing of objects in order rely on.
    #[test]
    fn every_layout_fits_in_byte_ranks_and_names_each_field_once() {
        let schema = schema::schema().expect("schema");
        for message in 0..schema.messages.len() {
            let layout = layout(schema, message);
            let name = &schema.messages[message].name;
            assert!(!layout.oversized, "{name} has too many fields");
            assert!(
                layout.sort_rank_is_identity[0],
                "{name} names a field twice"
            );
        }
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
