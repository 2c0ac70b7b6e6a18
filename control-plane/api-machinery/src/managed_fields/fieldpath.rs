//! Field paths and sets (upstream `sigs.k8s.io/structured-merge-diff/fieldpath`): path
//! elements, their order, and the exact `FieldsV1` JSON encoding, read and written.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use super::ManagedFieldsError;
use crate::field::go_quote;

/// One step of a field path (upstream `fieldpath.PathElement`).
#[derive(Debug, Clone)]
pub enum PathElement {
    /// A field of an object: `f:name`.
    Field(String),
    /// An item of an associative list, by its key fields sorted by name: `k:{"name":"x"}`.
    Key(Vec<(String, Value)>),
    /// An item of a set, by value: `v:"x"`.
    Value(Value),
    /// An item of a list by position: `i:0`.
    Index(i64),
}

impl PathElement {
    fn rank(&self) -> u8 {
        match self {
            PathElement::Field(_) => 0,
            PathElement::Key(_) => 1,
            PathElement::Value(_) => 2,
            PathElement::Index(_) => 3,
        }
    }

    /// Parses one serialized element; `Ok(None)` for an element type from a future version,
    /// which upstream drops.
    pub fn parse(s: &str) -> Result<Option<PathElement>, ManagedFieldsError> {
        let bad = |m: String| ManagedFieldsError::InvalidFieldsV1(m);
        let bytes = s.as_bytes();
        if bytes.len() < 2 {
            return Err(bad(format!("key must be 2 characters long: {s:?}")));
        }
        if bytes[1] != b':' {
            return Err(bad(format!("missing colon: {s}")));
        }
        let rest = &s[2..];
        Ok(Some(match bytes[0] {
            b'f' => PathElement::Field(rest.to_string()),
            b'v' => PathElement::Value(
                serde_json::from_str(rest).map_err(|e| bad(format!("{s}: {e}")))?,
            ),
            b'k' => {
                let fields: Map<String, Value> =
                    serde_json::from_str(rest).map_err(|e| bad(format!("{s}: {e}")))?;
                let mut fields: Vec<(String, Value)> = fields.into_iter().collect();
                fields.sort_by(|a, b| a.0.cmp(&b.0));
                PathElement::Key(fields)
            }
            b'i' => PathElement::Index(
                rest.parse()
                    .map_err(|_| bad(format!("invalid index: {s}")))?,
            ),
            _ => return Ok(None),
        }))
    }

    /// The serialized form used as a `fieldsV1` key.
    pub fn serialize(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(fields) => {
                let inner: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("{}:{}", go_json_string(k), go_json(v)))
                    .collect();
                format!("k:{{{}}}", inner.join(","))
            }
            PathElement::Value(value) => format!("v:{}", go_json(value)),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }
}

impl PartialEq for PathElement {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for PathElement {}

impl PartialOrd for PathElement {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Upstream's order: fields, then keys, then values, then indexes; within a kind by content.
impl Ord for PathElement {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (PathElement::Field(a), PathElement::Field(b)) => a.cmp(b),
            (PathElement::Key(a), PathElement::Key(b)) => compare_field_lists(a, b),
            (PathElement::Value(a), PathElement::Value(b)) => compare_values(a, b),
            (PathElement::Index(a), PathElement::Index(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

/// Renders like upstream's `PathElement.String()`: `.name`, `[name="x"]`, `[="x"]`, `[0]`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(fields) => {
                let parts: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("{k}={}", value_to_string(v)))
                    .collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={}]", value_to_string(v)),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

fn compare_field_lists(a: &[(String, Value)], b: &[(String, Value)]) -> Ordering {
    for ((ka, va), (kb, vb)) in a.iter().zip(b) {
        let c = ka.cmp(kb).then_with(|| compare_values(va, vb));
        if c != Ordering::Equal {
            return c;
        }
    }
    a.len().cmp(&b.len())
}

/// structured-merge-diff's total order on values: numbers (compared numerically), strings,
/// booleans, lists, maps, null.
fn compare_values(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x.cmp(&y),
            _ => x
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&y.as_f64().unwrap_or(0.0)),
        },
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (x, y) in x.iter().zip(y) {
                let c = compare_values(x, y);
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(x), Value::Object(y)) => {
            let mut x: Vec<(&String, &Value)> = x.iter().collect();
            let mut y: Vec<(&String, &Value)> = y.iter().collect();
            x.sort_by(|a, b| a.0.cmp(b.0));
            y.sort_by(|a, b| a.0.cmp(b.0));
            for ((kx, vx), (ky, vy)) in x.iter().zip(&y) {
                let c = kx.cmp(ky).then_with(|| compare_values(vx, vy));
                if c != Ordering::Equal {
                    return c;
                }
            }
            x.len().cmp(&y.len())
        }
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Upstream `value.ToString`: strings quoted Go-style, everything else plain.
fn value_to_string(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::String(s) => go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items
                .iter()
                .map(value_to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        Value::Object(map) => {
            let mut entries: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{k}={}", value_to_string(v)))
                .collect();
            entries.sort();
            format!("{{{}}}", entries.join(";"))
        }
    }
}

/// A JSON string as Go's `encoding/json` writes it: HTML-sensitive characters and the line and
/// paragraph separators are `\u` escaped, which serde_json does not do.
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON value as Go's `encoding/json` writes it (map keys sorted, Go string escaping, Go's
/// float formatting).
fn go_json(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (_, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => go_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => go_json_string(s),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(go_json).collect::<Vec<_>>().join(",")
        ),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let parts: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{}", go_json_string(k), go_json(v)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
    }
}

/// Go's `encoding/json` float format: shortest decimal, exponent form (at least two exponent
/// digits) below 1e-6 and from 1e21.
fn go_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let s = format!("{f:e}");
        match s.split_once('e') {
            Some((mantissa, exp)) => {
                let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
                format!("{mantissa}e{sign}{digits:0>2}")
            }
            None => s,
        }
    } else if f.fract() == 0.0 {
        format!("{f:.0}")
    } else {
        format!("{f}")
    }
}

/// A field path such as `.spec.containers[name="nginx"].image` (upstream `fieldpath.Path`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct FieldPath(pub Vec<PathElement>);

impl FieldPath {
    /// A path of plain field names: `FieldPath::fields(&["spec", "replicas"])`.
    pub fn fields(names: &[&str]) -> Self {
        FieldPath(
            names
                .iter()
                .map(|n| PathElement::Field((*n).to_string()))
                .collect(),
        )
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|pe| write!(f, "{pe}"))
    }
}

/// A set of field paths (upstream `fieldpath.Set`): the paths that end at this level
/// (`members`) and the sets below each element that leads further (`children`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    pub(super) members: BTreeSet<PathElement>,
    pub(super) children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// The empty set.
    pub fn new() -> Self {
        FieldSet::default()
    }

    /// A set holding the given paths.
    pub fn from_paths<'a>(paths: impl IntoIterator<Item = &'a FieldPath>) -> Self {
        let mut set = FieldSet::new();
        for path in paths {
            set.insert(&path.0);
        }
        set
    }

    /// True when the set holds no path.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(FieldSet::is_empty)
    }

    /// Adds a path; the empty path is ignored.
    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    /// Whether the set holds exactly this path.
    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// Every path in the set, in upstream's iteration order (members before children).
    pub fn paths(&self) -> Vec<FieldPath> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<FieldPath>) {
        for member in &self.members {
            let mut path = prefix.clone();
            path.push(member.clone());
            out.push(FieldPath(path));
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect_paths(prefix, out);
            prefix.pop();
        }
    }

    /// Paths in either set.
    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (pe, child) in &other.children {
            let merged = match out.children.get(pe) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(pe.clone(), merged);
        }
        out
    }

    /// Paths in both sets.
    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.intersection(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, child)| {
                other
                    .children
                    .get(pe)
                    .map(|o| (pe.clone(), child.intersection(o)))
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        FieldSet { members, children }
    }

    /// Paths in this set and not in `other`.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .map(|(pe, child)| match other.children.get(pe) {
                Some(o) => (pe.clone(), child.difference(o)),
                None => (pe.clone(), child.clone()),
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        FieldSet { members, children }
    }

    /// Like [`FieldSet::difference`], but a member of `other` also removes everything below it
    /// (used to drop ignored subtrees such as `.status`).
    pub fn recursive_difference(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.difference(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter(|(pe, _)| !other.members.contains(pe))
            .map(|(pe, child)| match other.children.get(pe) {
                Some(o) => (pe.clone(), child.recursive_difference(o)),
                None => (pe.clone(), child.clone()),
            })
            .filter(|(_, c)| !c.is_empty())
            .collect();
        FieldSet { members, children }
    }

    /// Makes every struct field that leads somewhere a member too, so removing the set removes
    /// the fields themselves (upstream `EnsureNamedFieldsAreMembers`; without a full schema
    /// every object key counts as a struct field).
    pub(super) fn ensure_named_fields_are_members(&self) -> FieldSet {
        let mut out = FieldSet {
            members: self.members.clone(),
            children: BTreeMap::new(),
        };
        for (pe, child) in &self.children {
            if matches!(pe, PathElement::Field(_)) {
                out.members.insert(pe.clone());
            }
            out.children
                .insert(pe.clone(), child.ensure_named_fields_are_members());
        }
        out
    }

    /// Decodes a `fieldsV1` value.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, ManagedFieldsError> {
        let Value::Object(map) = value else {
            return Err(ManagedFieldsError::InvalidFieldsV1(
                "expected an object".into(),
            ));
        };
        Ok(read_fields_v1(map)?.0.unwrap_or_default())
    }

    /// Encodes as a `fieldsV1` value, keys in upstream's order (`.` first, then elements sorted).
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, include_self: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if include_self && !self.is_empty() {
            out.insert(".".to_string(), Value::Object(Map::new()));
        }
        let elements: BTreeSet<&PathElement> =
            self.members.iter().chain(self.children.keys()).collect();
        for pe in elements {
            let child = self.children.get(pe).filter(|c| !c.is_empty());
            let value = match child {
                Some(child) => Value::Object(child.emit(self.members.contains(pe))),
                None => Value::Object(Map::new()),
            };
            out.insert(pe.serialize(), value);
        }
        out
    }
}

/// Returns the children described by `map` (if any) and whether the node itself is a member.
fn read_fields_v1(
    map: &Map<String, Value>,
) -> Result<(Option<FieldSet>, bool), ManagedFieldsError> {
    let mut children: Option<FieldSet> = None;
    let mut is_member = false;
    for (key, value) in map {
        if key == "." {
            is_member = true;
            continue;
        }
        let Some(pe) = PathElement::parse(key)? else {
            continue;
        };
        let Value::Object(inner) = value else {
            return Err(ManagedFieldsError::InvalidFieldsV1(format!(
                "{key}: expected an object"
            )));
        };
        let (grandchildren, child_is_member) = read_fields_v1(inner)?;
        let set = children.get_or_insert_with(FieldSet::new);
        if child_is_member {
            set.members.insert(pe.clone());
        }
        if let Some(grandchildren) = grandchildren {
            set.children.insert(pe, grandchildren);
        }
    }
    if children.is_none() {
        is_member = true;
    }
    Ok((children, is_member))
}

// ---------------------------------------------------------------------------------------------
// managedFields entries
