//! Server-side apply and field ownership: `metadata.managedFields` with structured-merge-diff
//! semantics (`sigs.k8s.io/structured-merge-diff` `fieldpath`, `typed`, `merge.Updater`, and
//! the apiserver's field manager around it).
//!
//! * [`FieldSet`] is a set of field paths with the exact `FieldsV1` JSON encoding
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

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

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

// ---------------------------------------------------------------------------------------------
// Path elements, paths and sets
// ---------------------------------------------------------------------------------------------

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
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
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
    fn ensure_named_fields_are_members(&self) -> FieldSet {
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2025-01-02T03:04:05Z";
    const EARLIER: &str = "2024-01-01T00:00:00Z";

    fn deployment() -> Schema {
        Schema::for_kind("Deployment").unwrap_or_default()
    }

    fn fields(json: &str) -> FieldSet {
        let value: Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("bad test json: {e}"));
        FieldSet::from_fields_v1(&value).unwrap_or_else(|e| panic!("bad fieldsV1: {e}"))
    }

    fn entry(
        manager: &str,
        operation: Operation,
        api_version: &str,
        set: &str,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: manager.into(),
            operation,
            api_version: api_version.into(),
            time: Some(EARLIER.into()),
            fields: fields(set),
            subresource: String::new(),
        }
    }

    fn apply_options(manager: &str, force: bool) -> ApplyOptions {
        ApplyOptions {
            manager: manager.into(),
            api_version: "apps/v1".into(),
            force,
            now: NOW.into(),
            schema: deployment(),
            ignored: FieldSet::from_paths(&[FieldPath::fields(&["status"])]),
            subresource: String::new(),
        }
    }

    fn update_options(manager: &str, schema: Schema) -> UpdateOptions {
        UpdateOptions {
            manager: manager.into(),
            operation: Operation::Update,
            api_version: "apps/v1".into(),
            now: NOW.into(),
            schema,
            ignored: FieldSet::new(),
            subresource: String::new(),
        }
    }

    fn applied(
        outcome: Result<ApplyOutcome, ManagedFieldsError>,
    ) -> (Value, Vec<ManagedFieldsEntry>, bool) {
        match outcome {
            Ok(ApplyOutcome::Applied {
                object,
                managed_fields,
                changed,
            }) => (object, managed_fields, changed),
            other => panic!("expected a successful apply, got {other:?}"),
        }
    }

    fn web_config(replicas: i64, labels: Value, containers: Value) -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "labels": labels},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}}
            }
        })
    }

    #[test]
    fn fields_v1_round_trips_byte_for_byte() {
        let upstream = concat!(
            r#"{"f:metadata":{"f:finalizers":{".":{},"v:\"example.com/x\"":{}},"f:labels":{".":{},"f:app":{}}},"#,
            r#""f:spec":{"f:progressDeadlineSeconds":{},"f:replicas":{},"f:selector":{},"#,
            r#""f:strategy":{"f:rollingUpdate":{".":{},"f:maxSurge":{},"f:maxUnavailable":{}},"f:type":{}},"#,
            r#""f:template":{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:containers":{"#,
            r#""k:{\"name\":\"a\\u003cb\"}":{".":{},"f:name":{}},"#,
            r#""k:{\"name\":\"nginx\"}":{".":{},"f:image":{},"f:name":{},"#,
            r#""f:ports":{".":{},"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{},"f:protocol":{}}},"#,
            r#""f:resources":{}}},"f:dnsPolicy":{},"f:restartPolicy":{}}}},"#,
            r#""f:status":{"f:conditions":{"k:{\"type\":\"Available\"}":{".":{},"f:status":{}}},"f:replicas":{}}}"#,
        );
        let parsed = fields(upstream);
        let encoded = serde_json::to_string(&parsed.to_fields_v1()).unwrap_or_default();
        assert_eq!(encoded, upstream);
        // Parsing is order-insensitive; encoding always sorts.
        let shuffled = fields(r#"{"f:b":{},"f:a":{"f:y":{},".":{},"f:x":{}}}"#);
        assert_eq!(
            serde_json::to_string(&shuffled.to_fields_v1()).unwrap_or_default(),
            r#"{"f:a":{".":{},"f:x":{},"f:y":{}},"f:b":{}}"#
        );
    }

    #[test]
    fn fields_v1_parsing_rules() {
        let set = fields(r#"{"f:a":{},"x:future":{},"i:3":{},"f:b":{".":{},"f:c":{}}}"#);
        let paths: Vec<String> = set.paths().iter().map(ToString::to_string).collect();
        assert_eq!(paths, vec![".a", ".b", "[3]", ".b.c"]);
        for bad in [
            r#"{"f":{}}"#,
            r#"{"fx":{}}"#,
            r#"{"k:{":{}}"#,
            r#"{"i:x":{}}"#,
            r#"{"f:a":1}"#,
            "[]",
        ] {
            let value: Value = serde_json::from_str(bad).unwrap_or_default();
            assert!(FieldSet::from_fields_v1(&value).is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_render_like_upstream() {
        let path = FieldPath(vec![
            PathElement::Field("spec".into()),
            PathElement::Field("containers".into()),
            PathElement::Key(vec![("name".into(), json!("nginx"))]),
            PathElement::Field("ports".into()),
            PathElement::Key(vec![
                ("containerPort".into(), json!(80)),
                ("protocol".into(), json!("TCP")),
            ]),
        ]);
        assert_eq!(
            path.to_string(),
            r#".spec.containers[name="nginx"].ports[containerPort=80,protocol="TCP"]"#
        );
        let set_item = FieldPath(vec![
            PathElement::Field("finalizers".into()),
            PathElement::Value(json!("a")),
        ]);
        assert_eq!(set_item.to_string(), r#".finalizers[="a"]"#);
        assert_eq!(FieldPath(vec![PathElement::Index(2)]).to_string(), "[2]");
    }

    #[test]
    fn path_elements_sort_like_upstream() {
        let mut elements = vec![
            PathElement::Index(0),
            PathElement::Value(json!("b")),
            PathElement::Value(json!(2)),
            PathElement::Key(vec![("name".into(), json!("b"))]),
            PathElement::Key(vec![("name".into(), json!("a"))]),
            PathElement::Field("b".into()),
            PathElement::Field("a".into()),
            PathElement::Value(json!(true)),
            PathElement::Value(json!(null)),
        ];
        elements.sort();
        let rendered: Vec<String> = elements.iter().map(PathElement::serialize).collect();
        assert_eq!(
            rendered,
            vec![
                "f:a",
                "f:b",
                r#"k:{"name":"a"}"#,
                r#"k:{"name":"b"}"#,
                "v:2",
                r#"v:"b""#,
                "v:true",
                "v:null",
                "i:0"
            ]
        );
        assert_eq!(PathElement::Value(json!(1.5)).serialize(), "v:1.5");
        assert_eq!(PathElement::Value(json!(1e-7)).serialize(), "v:1e-07");
        assert_eq!(
            PathElement::Value(json!({"b": 1, "a": "<"})).serialize(),
            r#"v:{"a":"\u003c","b":1}"#
        );
    }

    #[test]
    fn set_operations() {
        let a = fields(r#"{"f:x":{},"f:y":{"f:z":{}},"f:w":{"f:v":{}}}"#);
        let b = fields(r#"{"f:x":{},"f:y":{"f:q":{}},"f:w":{}}"#);
        let show = |s: FieldSet| serde_json::to_string(&s.to_fields_v1()).unwrap_or_default();
        assert_eq!(
            show(a.union(&b)),
            r#"{"f:w":{".":{},"f:v":{}},"f:x":{},"f:y":{"f:q":{},"f:z":{}}}"#
        );
        assert_eq!(show(a.intersection(&b)), r#"{"f:x":{}}"#);
        assert_eq!(
            show(a.difference(&b)),
            r#"{"f:w":{"f:v":{}},"f:y":{"f:z":{}}}"#
        );
        assert_eq!(show(a.recursive_difference(&b)), r#"{"f:y":{"f:z":{}}}"#);
        assert!(FieldSet::new().is_empty());
        assert!(a.has(&FieldPath::fields(&["y", "z"]).0));
        assert!(!a.has(&FieldPath::fields(&["y"]).0));
    }

    #[test]
    fn field_set_of_an_applied_deployment() {
        let config = web_config(
            2,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]),
        );
        let set = to_field_set(&config, deployment()).unwrap_or_default();
        let got =
            serde_json::to_string(&set.difference(&strip_set()).to_fields_v1()).unwrap_or_default();
        let want = concat!(
            r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:replicas":{},"f:selector":{},"#,
            r#""f:template":{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"#,
            r#""f:image":{},"f:name":{},"f:ports":{"k:{\"containerPort\":80,\"protocol\":\"TCP\"}":{".":{},"f:containerPort":{}}}}}}}}}"#,
        );
        assert_eq!(got, want);
    }

    #[test]
    fn field_sets_report_bad_list_items() {
        let pod = Schema::for_kind("Pod").unwrap_or_default();
        let missing = json!({"spec": {"containers": [{"image": "x"}]}});
        assert_eq!(
            to_field_set(&missing, pod).map_err(|e| e.to_string()),
            Err(r#".spec.containers: associative list with keys has an element that omits key field "name" (and doesn't have default value)"#.to_string())
        );
        let scalar = json!({"spec": {"containers": ["x"]}});
        assert!(to_field_set(&scalar, pod).is_err());
        let duplicate = json!({"spec": {"containers": [{"name": "a"}, {"name": "a"}]}});
        let mut options = apply_options("kubectl", false);
        options.schema = pod;
        assert_eq!(
            apply(&json!({}), &duplicate, &[], &options).map_err(|e| e.to_string()),
            Err(r#".spec.containers: duplicate entries for key [name="a"]"#.to_string())
        );
        assert!(
            to_field_set(&duplicate, pod).is_ok(),
            "live objects may hold duplicates"
        );
    }

    #[test]
    fn apply_creates_and_is_idempotent() {
        let config = web_config(
            2,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let (object, entries, changed) = applied(apply(
            &json!({}),
            &config,
            &[],
            &apply_options("kubectl", false),
        ));
        assert!(changed);
        assert_eq!(object["spec"]["replicas"], json!(2));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].id().describe(), "\"kubectl\"");
        assert_eq!(
            entries[0].to_json(),
            json!({
                "manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1", "time": NOW, "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}}
            })
        );
        assert_eq!(decode_managed_fields(&object), Ok(entries.clone()));

        let mut later = apply_options("kubectl", false);
        later.now = "2030-01-01T00:00:00Z".into();
        let (again, again_entries, changed) = applied(apply(&object, &config, &entries, &later));
        assert!(
            !changed,
            "re-applying the same configuration changes nothing"
        );
        assert_eq!(again_entries, entries, "timestamps do not move on a no-op");
        assert_eq!(again, object);
    }

    #[test]
    fn apply_conflicts_with_other_owners() {
        let live = web_config(
            1,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let owners = vec![entry(
            "kubectl-client-side-apply",
            Operation::Update,
            "apps/v1",
            r#"{"f:spec":{"f:replicas":{}}}"#,
        )];
        let config = web_config(
            3,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let outcome = apply(&live, &config, &owners, &apply_options("kubectl", false));
        let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
            panic!("expected conflicts, got {outcome:?}")
        };
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].path.to_string(), ".spec.replicas");
        assert_eq!(
            conflicts[0].cause_message(),
            "conflict with \"kubectl-client-side-apply\" using apps/v1"
        );
        assert_eq!(
            conflict_message(&conflicts),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using apps/v1: .spec.replicas"
        );

        // Forcing takes the field over.
        let (object, entries, _) = applied(apply(
            &live,
            &config,
            &owners,
            &apply_options("kubectl", true),
        ));
        assert_eq!(object["spec"]["replicas"], json!(3));
        assert_eq!(entries.len(), 1, "the old owner lost its only field");
        assert!(
            entries[0]
                .fields
                .has(&FieldPath::fields(&["spec", "replicas"]).0)
        );

        // Applying the value the other manager already set shares ownership instead.
        let same = web_config(
            1,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let (_, entries, _) = applied(apply(
            &live,
            &same,
            &owners,
            &apply_options("kubectl", false),
        ));
        let owners_of_replicas: Vec<&str> = entries
            .iter()
            .filter(|e| e.fields.has(&FieldPath::fields(&["spec", "replicas"]).0))
            .map(|e| e.manager.as_str())
            .collect();
        assert_eq!(
            owners_of_replicas,
            vec!["kubectl", "kubectl-client-side-apply"]
        );
    }

    #[test]
    fn several_conflicts_are_grouped_by_manager() {
        let live = web_config(
            1,
            json!({"app": "web", "tier": "a"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let owners = vec![
            entry(
                "b-manager",
                Operation::Apply,
                "apps/v1",
                r#"{"f:metadata":{"f:labels":{"f:tier":{}}}}"#,
            ),
            entry(
                "a-manager",
                Operation::Update,
                "apps/v1",
                r#"{"f:spec":{"f:replicas":{},"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{"f:image":{}}}}}}}"#,
            ),
        ];
        let config = web_config(
            2,
            json!({"app": "web", "tier": "b"}),
            json!([{"name": "web", "image": "httpd"}]),
        );
        let outcome = apply(&live, &config, &owners, &apply_options("kubectl", false));
        let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
            panic!("expected conflicts, got {outcome:?}")
        };
        assert_eq!(
            conflict_message(&conflicts),
            concat!(
                "Apply failed with 3 conflicts: conflicts with \"a-manager\" using apps/v1:\n",
                "- .spec.replicas\n",
                "- .spec.template.spec.containers[name=\"web\"].image\n",
                "conflicts with \"b-manager\":\n",
                "- .metadata.labels.tier"
            )
        );
    }

    #[test]
    fn apply_prunes_only_what_the_applier_dropped_and_nobody_else_owns() {
        let first = web_config(
            1,
            json!({"app": "web", "tier": "front", "team": "x"}),
            json!([{"name": "web", "image": "nginx"}, {"name": "log", "image": "fluentd"}]),
        );
        let (mut live, entries, _) = applied(apply(
            &json!({}),
            &first,
            &[],
            &apply_options("kubectl", false),
        ));
        // The server defaulted a field nobody owns, and another manager owns one label.
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        let mut entries = entries;
        entries.push(entry(
            "labeller",
            Operation::Update,
            "apps/v1",
            r#"{"f:metadata":{"f:labels":{"f:team":{}}}}"#,
        ));

        let second = web_config(
            1,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let (object, entries, changed) = applied(apply(
            &live,
            &second,
            &entries,
            &apply_options("kubectl", false),
        ));
        assert!(changed);
        assert_eq!(
            object["metadata"]["labels"],
            json!({"app": "web", "team": "x"}),
            "tier pruned, team kept"
        );
        assert_eq!(
            object["spec"]["template"]["spec"]["containers"],
            json!([{"name": "web", "image": "nginx"}])
        );
        assert_eq!(
            object["spec"]["strategy"],
            json!({"type": "RollingUpdate"}),
            "unowned fields are not pruned"
        );
        let kubectl = entries
            .iter()
            .find(|e| e.manager == "kubectl")
            .map(|e| e.fields.clone())
            .unwrap_or_default();
        assert!(!kubectl.has(&FieldPath::fields(&["metadata", "labels", "tier"]).0));
    }

    #[test]
    fn apply_merges_associative_lists_in_upstream_order() {
        let live = json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}}}});
        let config = json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c", "image": "2"}]}}}});
        let merged = merge(&live, &config, deployment()).unwrap_or_default();
        assert_eq!(
            merged["spec"]["template"]["spec"]["containers"],
            json!([{"name": "a", "image": "1"}, {"name": "b", "image": "2"}, {"name": "c", "image": "2"}])
        );
        let reordered = merge(
            &json!({"l": [1, 2, 3]}),
            &json!({"l": [3, 1]}),
            Schema::unknown(),
        )
        .unwrap_or_default();
        assert_eq!(reordered, json!({"l": [3, 1]}), "unknown lists are atomic");
        let meta = Schema::for_kind("Pod").unwrap_or_default();
        let finalizers = merge(
            &json!({"metadata": {"finalizers": ["a", "b"]}}),
            &json!({"metadata": {"finalizers": ["c", "a"]}}),
            meta,
        )
        .unwrap_or_default();
        assert_eq!(finalizers["metadata"]["finalizers"], json!(["c", "a", "b"]));
        let atomic = merge(
            &json!({"spec": {"selector": {"matchLabels": {"a": "1"}}}}),
            &json!({"spec": {"selector": {"matchLabels": {"b": "2"}}}}),
            deployment(),
        )
        .unwrap_or_default();
        assert_eq!(
            atomic["spec"]["selector"],
            json!({"matchLabels": {"b": "2"}}),
            "an atomic struct is replaced"
        );
    }

    #[test]
    fn apply_rejects_managed_fields_in_the_configuration() {
        let config = json!({"metadata": {"managedFields": [{"manager": "x"}]}});
        assert_eq!(
            apply(&json!({}), &config, &[], &apply_options("kubectl", false)),
            Err(ManagedFieldsError::ManagedFieldsInConfig)
        );
    }

    #[test]
    fn apply_ignores_status_for_the_main_resource() {
        let mut config = web_config(
            1,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        config["status"] = json!({"replicas": 5});
        let (_, entries, _) = applied(apply(
            &json!({}),
            &config,
            &[],
            &apply_options("kubectl", false),
        ));
        assert!(
            !entries[0]
                .fields
                .has(&FieldPath::fields(&["status", "replicas"]).0)
        );
    }

    #[test]
    fn update_records_a_create() {
        let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d", "labels": {"a": "1"}}, "data": {"k": "v"}});
        let schema = Schema::for_kind("ConfigMap").unwrap_or_default();
        let entries = update(
            &json!({}),
            &configmap,
            &[],
            &update_options("kubectl-create", schema),
        )
        .unwrap_or_default();
        assert_eq!(entries.len(), 1);
        assert_eq!(
            serde_json::to_string(&entries[0].to_json()).unwrap_or_default(),
            concat!(
                r#"{"manager":"kubectl-create","operation":"Update","apiVersion":"apps/v1","time":"2025-01-02T03:04:05Z","#,
                r#""fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:k":{}},"f:metadata":{"f:labels":{".":{},"f:a":{}}}}}"#
            )
        );
    }

    #[test]
    fn update_marks_new_objects_like_a_typed_zero_value_would() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "volumes": [{"name": "v", "emptyDir": {}}]
        }});
        let schema = Schema::for_kind("Pod").unwrap_or_default();
        let entries = update(
            &json!({}),
            &pod,
            &[],
            &update_options("kubectl-run", schema),
        )
        .unwrap_or_default();
        assert_eq!(
            serde_json::to_string(&entries[0].fields.to_fields_v1()).unwrap_or_default(),
            concat!(
                r#"{"f:spec":{"f:containers":{"k:{\"name\":\"c\"}":{".":{},"f:image":{},"f:name":{}}},"#,
                r#""f:volumes":{".":{},"k:{\"name\":\"v\"}":{".":{},"f:emptyDir":{},"f:name":{}}}}}"#
            )
        );
        // Below a pointer the zero value has nothing, so everything is new.
        let rc = json!({"kind": "ReplicationController", "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
        let schema = Schema::for_kind("ReplicationController").unwrap_or_default();
        let entries =
            update(&json!({}), &rc, &[], &update_options("kubectl", schema)).unwrap_or_default();
        assert_eq!(
            serde_json::to_string(&entries[0].fields.to_fields_v1()).unwrap_or_default(),
            r#"{"f:spec":{"f:template":{".":{},"f:spec":{".":{},"f:containers":{".":{},"k:{\"name\":\"c\"}":{".":{},"f:name":{}}}}}}}"#
        );
    }

    #[test]
    fn update_moves_ownership_of_changed_fields() {
        let config = web_config(
            2,
            json!({"app": "web"}),
            json!([{"name": "web", "image": "nginx"}]),
        );
        let (live, entries, _) = applied(apply(
            &json!({}),
            &config,
            &[],
            &apply_options("kubectl", false),
        ));

        // A scaler changes replicas: it becomes the owner, and the applier now conflicts.
        let mut scaled = live.clone();
        scaled["spec"]["replicas"] = json!(5);
        let entries = update(
            &live,
            &scaled,
            &entries,
            &update_options("hpa", deployment()),
        )
        .unwrap_or_default();
        let hpa = entries
            .iter()
            .find(|e| e.manager == "hpa")
            .map(|e| e.fields.clone())
            .unwrap_or_default();
        assert_eq!(
            serde_json::to_string(&hpa.to_fields_v1()).unwrap_or_default(),
            r#"{"f:spec":{"f:replicas":{}}}"#
        );
        let kubectl = entries
            .iter()
            .find(|e| e.manager == "kubectl")
            .map(|e| e.fields.clone())
            .unwrap_or_default();
        assert!(!kubectl.has(&FieldPath::fields(&["spec", "replicas"]).0));
        let outcome = apply(&scaled, &config, &entries, &apply_options("kubectl", false));
        let Ok(ApplyOutcome::Conflicts(conflicts)) = outcome else {
            panic!("expected conflicts, got {outcome:?}")
        };
        assert_eq!(
            conflict_message(&conflicts),
            "Apply failed with 1 conflict: conflict with \"hpa\" using apps/v1: .spec.replicas"
        );

        // Removing a field drops it from every owner; a no-op write changes nothing.
        let mut unlabelled = scaled.clone();
        unlabelled["metadata"]["labels"] = json!({});
        let after = update(
            &scaled,
            &unlabelled,
            &entries,
            &update_options("editor", deployment()),
        )
        .unwrap_or_default();
        assert!(after.iter().all(|e| {
            !e.fields
                .has(&FieldPath::fields(&["metadata", "labels", "app"]).0)
        }));
        let noop = update(
            &scaled,
            &scaled,
            &entries,
            &update_options("editor", deployment()),
        )
        .unwrap_or_default();
        assert_eq!(noop, entries);
    }

    #[test]
    fn update_ownership_wrapper_falls_back_to_the_old_entries() {
        let old_entries = vec![entry(
            "kubectl",
            Operation::Apply,
            "v1",
            r#"{"f:data":{"f:a":{}}}"#,
        )];
        let mut old = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}});
        set_managed_fields(&mut old, &old_entries);
        let new = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "2"}});
        let entries = update_ownership(&[], Some(&old), &new, "editor", "Update", "v1", NOW)
            .unwrap_or_default();
        assert_eq!(
            Value::Array(entries),
            json!([{"manager": "editor", "operation": "Update", "apiVersion": "v1", "time": NOW, "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}}}])
        );
        assert!(update_ownership(&[], None, &new, "x", "Frob", "v1", NOW).is_err());
        let mut cleared = old.clone();
        set_managed_fields(&mut cleared, &[]);
        assert_eq!(
            cleared.get("metadata").and_then(|m| m.get("managedFields")),
            None
        );
    }

    #[test]
    fn compare_reports_added_modified_and_removed() {
        let pod = Schema::for_kind("Pod").unwrap_or_default();
        let old = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"nodeName": "n1", "tolerations": [{"key": "x"}]}});
        let new = json!({"metadata": {"finalizers": ["b", "c"]}, "spec": {"nodeName": "n2", "tolerations": [{"key": "y"}], "securityContext": {"runAsUser": 1}}});
        let c = compare(&old, &new, pod).unwrap_or_default();
        let show = |s: &FieldSet| serde_json::to_string(&s.to_fields_v1()).unwrap_or_default();
        assert_eq!(
            show(&c.modified),
            r#"{"f:spec":{"f:nodeName":{},"f:tolerations":{}}}"#
        );
        assert_eq!(
            show(&c.added),
            r#"{"f:metadata":{"f:finalizers":{"v:\"c\"":{}}},"f:spec":{"f:securityContext":{".":{},"f:runAsUser":{}}}}"#
        );
        assert_eq!(
            show(&c.removed),
            r#"{"f:metadata":{"f:finalizers":{"v:\"a\"":{}}}}"#
        );
    }

    #[test]
    fn entries_sort_like_upstream() {
        let mut entries = vec![
            entry("z", Operation::Update, "v1", r#"{"f:a":{}}"#),
            entry("b", Operation::Apply, "v1", r#"{"f:a":{}}"#),
            entry("a", Operation::Update, "v1", r#"{"f:a":{}}"#),
        ];
        entries[0].time = Some("2020-01-01T00:00:00Z".into());
        sort_entries(&mut entries);
        let order: Vec<&str> = entries.iter().map(|e| e.manager.as_str()).collect();
        assert_eq!(order, vec!["b", "z", "a"]);
        let bad = json!({"manager": "x", "operation": "Frob"});
        assert!(ManagedFieldsEntry::from_json(&bad).is_err());
        let subresource = ManagerId {
            manager: "k".into(),
            operation: Operation::Update,
            api_version: "v1".into(),
            subresource: "status".into(),
        };
        assert_eq!(
            subresource.describe(),
            "\"k\" with subresource \"status\" using v1"
        );
    }
}
