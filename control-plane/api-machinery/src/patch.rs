//! The three PATCH content types kube-apiserver accepts: JSON Patch (RFC 6902), JSON Merge
//! Patch (RFC 7386) and strategic merge patch (`k8s.io/apimachinery/pkg/util/strategicpatch`,
//! the server-side "apply" half: `StrategicMergeMapPatch` with parallel lists merged and
//! unmatched nulls ignored).
//!
//! The strategic merge patch is a port of upstream's algorithm, including its list ordering
//! rules and directives (`$patch`, `$retainKeys`, `$deleteFromPrimitiveList/`,
//! `$setElementOrder/`). It takes the per-field strategies from [`crate::schema`]. One deliberate
//! difference: upstream decodes the result into a Go struct, which silently drops directive keys
//! and `null`s that end up in newly added values; objects here stay JSON, so those are removed
//! explicitly instead.

use std::cmp::Ordering;

use serde_json::{Map, Value};

pub use crate::schema::PatchMeta;
use crate::schema::{PatchStrategy, Schema};

const DIRECTIVE_MARKER: &str = "$patch";
const DELETE_DIRECTIVE: &str = "delete";
const REPLACE_DIRECTIVE: &str = "replace";
const MERGE_DIRECTIVE: &str = "merge";
const RETAIN_KEYS_DIRECTIVE: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST_PREFIX: &str = "$deleteFromPrimitiveList";
const SET_ELEMENT_ORDER_PREFIX: &str = "$setElementOrder";

/// Why a patch could not be applied. Messages are meant for a 422/400 `Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatchError {
    /// The JSON Patch document is not a list of operation objects.
    #[error("invalid json patch: {0}")]
    InvalidJsonPatch(String),
    /// One JSON Patch operation failed.
    #[error("json patch operation {index} ({op}) failed: {message}")]
    JsonPatchOperation {
        /// Zero-based position of the operation.
        index: usize,
        /// The operation name.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// More operations than [`MAX_JSON_PATCH_OPERATIONS`] (upstream's 413 text).
    #[error("The allowed maximum operations in a JSON patch is {limit}, got {got}")]
    TooManyOperations {
        /// The limit.
        limit: usize,
        /// How many the patch has.
        got: usize,
    },
    /// `copy` operations would grow the document by more than [`MAX_JSON_PATCH_COPY_BYTES`]
    /// (json-patch's `AccumulatedCopySizeError` text).
    #[error(
        "Unable to complete the copy, the accumulated size increase of copy is {accumulated}, exceeding the limit {limit}"
    )]
    CopySizeExceeded {
        /// Bytes copied so far, with the refused copy.
        accumulated: usize,
        /// The limit.
        limit: usize,
    },
    /// A strategic merge patch (or the document it applies to) is not a JSON object.
    #[error("invalid JSON document")]
    BadJsonDocument,
    /// A strategic merge patch is malformed; the message is upstream's where it has one.
    #[error("{0}")]
    Strategic(String),
}

fn strategic(message: impl Into<String>) -> PatchError {
    PatchError::Strategic(message.into())
}

// ---------------------------------------------------------------------------------------------
// JSON Patch (RFC 6902)
// ---------------------------------------------------------------------------------------------

/// Upstream's `maxJSONPatchOperations`: a longer patch is refused before any is applied.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
/// Upstream's `JSONPatchMaxCopyBytes` (the request body limit): how much `copy` operations
/// may add to a document in all, measured as the copied values' JSON length. Without it,
/// each copy of a value into itself doubles the document.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// The length of `value` as compact JSON, counted without building the text.
fn json_length(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Writing a Value to a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Applies a JSON Patch document (a list of operations) to `doc`, atomically: any failing
/// operation fails the whole patch.
pub fn apply_json_patch(doc: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Some(operations) = patch.as_array() else {
        return Err(PatchError::InvalidJsonPatch(
            "a json patch must be a list of operations".into(),
        ));
    };
    if operations.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(PatchError::TooManyOperations {
            limit: MAX_JSON_PATCH_OPERATIONS,
            got: operations.len(),
        });
    }
    let mut doc = doc.clone();
    let mut copied = 0usize;
    for (index, operation) in operations.iter().enumerate() {
        let fail = |op: &str, message: String| PatchError::JsonPatchOperation {
            index,
            op: op.to_string(),
            message,
        };
        let Some(operation) = operation.as_object() else {
            return Err(fail("", "operation must be an object".into()));
        };
        let op = operation
            .get("op")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let path = |name: &str| -> Result<Vec<String>, PatchError> {
            match operation.get(name) {
                Some(Value::String(pointer)) => parse_pointer(pointer).map_err(|m| fail(op, m)),
                _ => Err(fail(op, format!("missing or non-string {name:?}"))),
            }
        };
        let value = || {
            operation
                .get("value")
                .cloned()
                .ok_or_else(|| fail(op, "missing \"value\"".into()))
        };
        let result = match op {
            "add" => add(&mut doc, &path("path")?, value()?),
            "remove" => remove(&mut doc, &path("path")?).map(drop),
            "replace" => {
                let target = path("path")?;
                let new = value()?;
                get_mut(&mut doc, &target).map(|slot| *slot = new)
            }
            "move" => {
                let from = path("from")?;
                let to = path("path")?;
                if to.len() > from.len() && to[..from.len()] == from[..] {
                    Err("cannot move a value into one of its own children".to_string())
                } else if from == to {
                    get(&doc, &from).map(drop)
                } else {
                    remove(&mut doc, &from).and_then(|moved| add(&mut doc, &to, moved))
                }
            }
            "copy" => {
                let from = path("from")?;
                let to = path("path")?;
                match get(&doc, &from) {
                    Ok(source) => {
                        // Counted before the clone, so a refused copy allocates nothing.
                        copied = copied.saturating_add(json_length(source));
                        if copied > MAX_JSON_PATCH_COPY_BYTES {
                            return Err(PatchError::CopySizeExceeded {
                                accumulated: copied,
                                limit: MAX_JSON_PATCH_COPY_BYTES,
                            });
                        }
                        let value = source.clone();
                        add(&mut doc, &to, value)
                    }
                    Err(message) => Err(message),
                }
            }
            "test" => {
                let target = path("path")?;
                let expected = value()?;
                get(&doc, &target).and_then(|actual| {
                    if json_equal(actual, &expected) {
                        Ok(())
                    } else {
                        Err(format!("testing value {} failed", pointer_string(&target)))
                    }
                })
            }
            other => return Err(fail(other, format!("unknown operation {other:?}"))),
        };
        result.map_err(|message| fail(op, message))?;
    }
    Ok(doc)
}

/// Splits an RFC 6901 pointer into unescaped reference tokens.
fn parse_pointer(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(format!("invalid path {pointer:?}: must start with '/'"));
    };
    rest.split('/')
        .map(|token| {
            // `~01` must decode to `~1`, so `~1` is replaced before `~0`.
            let unescaped = token.replace("~1", "/").replace("~0", "~");
            if token.replace("~0", "").replace("~1", "").contains('~') {
                Err(format!("invalid path {pointer:?}: bad escape in {token:?}"))
            } else {
                Ok(unescaped)
            }
        })
        .collect()
}

fn pointer_string(tokens: &[String]) -> String {
    tokens
        .iter()
        .map(|t| format!("/{}", t.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// An array index token: digits without leading zeros.
fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let index = if valid {
        token.parse::<usize>().ok()
    } else {
        None
    };
    match index {
        Some(i) if i < len || (allow_end && i == len) => Ok(i),
        Some(i) => Err(format!("index {i} out of bounds for a list of {len}")),
        None => Err(format!("invalid list index {token:?}")),
    }
}

fn get<'a>(doc: &'a Value, path: &[String]) -> Result<&'a Value, String> {
    let mut current = doc;
    for (depth, token) in path.iter().enumerate() {
        current = match current {
            Value::Object(map) => map.get(token),
            Value::Array(items) => items.get(array_index(token, items.len(), false)?),
            _ => None,
        }
        .ok_or_else(|| format!("path {} does not exist", pointer_string(&path[..=depth])))?;
    }
    Ok(current)
}

fn get_mut<'a>(doc: &'a mut Value, path: &[String]) -> Result<&'a mut Value, String> {
    let mut current = doc;
    for (depth, token) in path.iter().enumerate() {
        current = match current {
            Value::Object(map) => map.get_mut(token),
            Value::Array(items) => {
                let i = array_index(token, items.len(), false)?;
                items.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| format!("path {} does not exist", pointer_string(&path[..=depth])))?;
    }
    Ok(current)
}

fn add(doc: &mut Value, path: &[String], value: Value) -> Result<(), String> {
    let Some((last, parent)) = path.split_last() else {
        *doc = value;
        return Ok(());
    };
    match get_mut(doc, parent)? {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let i = if last == "-" {
                items.len()
            } else {
                array_index(last, items.len(), true)?
            };
            items.insert(i, value);
            Ok(())
        }
        _ => Err(format!(
            "parent of {} is not an object or a list",
            pointer_string(path)
        )),
    }
}

fn remove(doc: &mut Value, path: &[String]) -> Result<Value, String> {
    let Some((last, parent)) = path.split_last() else {
        return Err("cannot remove the whole document".into());
    };
    match get_mut(doc, parent)? {
        Value::Object(map) => map
            .shift_remove(last)
            .ok_or_else(|| format!("path {} does not exist", pointer_string(path))),
        Value::Array(items) => {
            let i = array_index(last, items.len(), false)?;
            Ok(items.remove(i))
        }
        _ => Err(format!("path {} does not exist", pointer_string(path))),
    }
}

/// JSON equality with numbers compared by value (`1` equals `1.0`), as RFC 6902 `test` needs.
pub fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_equal(x, y),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn number_equal(x: &serde_json::Number, y: &serde_json::Number) -> bool {
    match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
        (Some(a), Some(b), _, _) => a == b,
        (_, _, Some(a), Some(b)) => a == b,
        _ => x.as_f64() == y.as_f64(),
    }
}

// ---------------------------------------------------------------------------------------------
// JSON Merge Patch (RFC 7386)
// ---------------------------------------------------------------------------------------------

/// Applies a JSON Merge Patch: objects merge recursively, `null` deletes, anything else
/// (including lists) replaces.
pub fn apply_merge_patch(doc: &Value, patch: &Value) -> Value {
    let Value::Object(patch) = patch else {
        return patch.clone();
    };
    let mut target = match doc {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            target.shift_remove(key);
        } else {
            let merged = apply_merge_patch(target.get(key).unwrap_or(&Value::Null), value);
            target.insert(key.clone(), merged);
        }
    }
    Value::Object(target)
}

// ---------------------------------------------------------------------------------------------
// Strategic merge patch
// ---------------------------------------------------------------------------------------------

/// Applies a strategic merge patch to `original` using the field strategies of `meta` (from
/// [`PatchMeta::for_kind`]). Both documents must be JSON objects.
pub fn apply_strategic_merge_patch(
    original: &Value,
    patch: &Value,
    meta: &PatchMeta,
) -> Result<Value, PatchError> {
    let (Value::Object(original), Value::Object(patch)) = (original, patch) else {
        return Err(PatchError::BadJsonDocument);
    };
    merge_map(original.clone(), patch.clone(), *meta).map(Value::Object)
}

/// The Go type class of a JSON value, which decides whether two values merge or replace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

fn kind(value: &Value) -> Kind {
    match value {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(_) => Kind::Number,
        Value::String(_) => Kind::String,
        Value::Array(_) => Kind::Array,
        Value::Object(_) => Kind::Object,
    }
}

/// Scalar equality as Go's `==` on decoded interface values (numbers by value).
fn scalar_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => number_equal(x, y),
        _ => a == b,
    }
}

/// Renders a value the way the error messages show it.
fn show(value: &Value) -> String {
    value.to_string()
}

fn no_merge_key(item: &Map<String, Value>, key: &str) -> PatchError {
    strategic(format!(
        "map: {} does not contain declared merge key: {key}",
        show(&Value::Object(item.clone()))
    ))
}

fn merge_map(
    mut original: Map<String, Value>,
    mut patch: Map<String, Value>,
    schema: Schema,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.get(DIRECTIVE_MARKER) {
        return match directive.as_str() {
            Some(REPLACE_DIRECTIVE) => {
                patch.remove(DIRECTIVE_MARKER);
                // The patch stands in for the whole map, so it must not carry directives on.
                Ok(clean_object(patch))
            }
            Some(DELETE_DIRECTIVE) => Ok(Map::new()),
            _ => Err(strategic(format!(
                "unknown patch type: {} in map: {}",
                directive
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| show(directive)),
                show(&Value::Object(patch.clone()))
            ))),
        };
    }
    apply_retain_keys(&mut original, &mut patch)?;
    merge_set_element_order_lists(&mut original, &mut patch, schema)?;

    for (key, patch_value) in patch {
        let (key, is_delete_list) = match key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST_PREFIX) {
            Some(rest) => match rest.strip_prefix('/') {
                Some(field) => (field.to_string(), true),
                None => return Err(strategic("invalid patch format of primitive list")),
            },
            None => (key, false),
        };
        if patch_value.is_null() {
            // Null deletes; a null for an absent key is ignored (IgnoreUnmatchedNulls).
            original.shift_remove(&key);
            continue;
        }
        // Values are taken out of their slot and put back so the key keeps its position.
        let Some(original_value) = original.get_mut(&key).map(std::mem::take) else {
            if !is_delete_list && let Some(value) = clean_new_value(patch_value) {
                original.insert(key, value);
            }
            continue;
        };
        let merged = if kind(&original_value) != kind(&patch_value) {
            if is_delete_list {
                Some(original_value)
            } else {
                clean_new_value(patch_value)
            }
        } else {
            merge_values(original_value, patch_value, schema, &key, is_delete_list)?
        };
        match merged {
            Some(merged) => {
                if let Some(slot) = original.get_mut(&key) {
                    *slot = merged;
                }
            }
            None => {
                original.shift_remove(&key);
            }
        }
    }
    Ok(original)
}

/// Merges two values of the same kind found under `key`.
fn merge_values(
    original_value: Value,
    patch_value: Value,
    schema: Schema,
    key: &str,
    is_delete_list: bool,
) -> Result<Option<Value>, PatchError> {
    let field = schema.field(key);
    Ok(match (original_value, patch_value) {
        (Value::Object(o), Value::Object(p)) => {
            if field.patch_strategy == PatchStrategy::Replace {
                Some(Value::Object(clean_object(p)))
            } else {
                Some(Value::Object(merge_map(o, p, schema.child(key))?))
            }
        }
        (Value::Array(o), Value::Array(p)) => Some(Value::Array(merge_slice_handler(
            o,
            p,
            schema,
            key,
            is_delete_list,
        )?)),
        (_, scalar) => clean_new_value(scalar),
    })
}

/// `$retainKeys`: drop every original key not listed, after checking the patch only sets
/// listed keys.
fn apply_retain_keys(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
) -> Result<(), PatchError> {
    let Some(retain) = patch.remove(RETAIN_KEYS_DIRECTIVE) else {
        return Ok(());
    };
    let Value::Array(retain) = retain else {
        return Err(strategic("invalid patch format of retainKeys"));
    };
    let retained = |key: &str| retain.iter().any(|r| r.as_str() == Some(key));
    for (key, value) in patch.iter() {
        let directive = key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
            || key.starts_with(SET_ELEMENT_ORDER_PREFIX);
        if !value.is_null() && !directive && !retained(key) {
            return Err(strategic("invalid patch format of retainKeys"));
        }
    }
    original.retain(|key, _| retained(key));
    Ok(())
}

/// `$setElementOrder/<field>`: merge the list it names and impose the given order on the items
/// that appear in it, interleaving the server-only items by their live order.
fn merge_set_element_order_lists(
    original: &mut Map<String, Value>,
    patch: &mut Map<String, Value>,
    schema: Schema,
) -> Result<(), PatchError> {
    let keys: Vec<String> = patch
        .keys()
        .filter(|k| k.starts_with(SET_ELEMENT_ORDER_PREFIX))
        .cloned()
        .collect();
    for directive_key in keys {
        let Some(order) = patch.remove(&directive_key) else {
            continue;
        };
        let Value::Array(order) = order else {
            return Err(strategic("invalid patch format of setElementOrder list"));
        };
        let Some(field_name) = directive_key
            .strip_prefix(SET_ELEMENT_ORDER_PREFIX)
            .and_then(|r| r.strip_prefix('/'))
        else {
            return Err(strategic("invalid patch format of setElementOrder list"));
        };
        let field_name = field_name.to_string();
        let original_list = match original.get(&field_name) {
            None => None,
            Some(Value::Array(items)) => Some(items.clone()),
            Some(_) => {
                return Err(strategic(format!(
                    "expected a list for {field_name}, but the live value is not a list"
                )));
            }
        };
        let patch_list = match patch.remove(&field_name) {
            None => None,
            Some(Value::Array(items)) => Some(items),
            Some(_) => {
                return Err(strategic(format!(
                    "expected a list for {field_name}, but the patch value is not a list"
                )));
            }
        };
        let field = schema.field(&field_name);
        let merge_key = field.patch_merge_key.unwrap_or("");
        if let Some(patch_list) = &patch_list {
            validate_patch_with_set_order_list(patch_list, &order, merge_key)?;
        }
        let merged = match (&original_list, patch_list.clone()) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => clean_list(p),
            (Some(o), Some(p)) => merge_slice_handler(o.clone(), p, schema, &field_name, false)?,
            (None, None) => continue,
        };
        let live = original_list.unwrap_or_default();
        let element_kind = slice_element_kind(&[&live, patch_list.as_deref().unwrap_or(&[])])?;
        let Some(element_kind) = element_kind else {
            original.insert(field_name, Value::Array(merged));
            continue;
        };
        let (in_order, server_only) = partition_by_presence(merged, &order, merge_key)?;
        let both = normalize_element_order(
            in_order,
            server_only,
            &order,
            &live,
            merge_key,
            element_kind,
        )?;
        original.insert(field_name, Value::Array(both));
    }
    Ok(())
}

fn validate_patch_with_set_order_list(
    patch_list: &[Value],
    order: &[Value],
    merge_key: &str,
) -> Result<(), PatchError> {
    if order.is_empty() || patch_list.is_empty() {
        return Ok(());
    }
    let non_delete: Vec<&Value> = if merge_key.is_empty() {
        patch_list.iter().collect()
    } else {
        patch_list
            .iter()
            .filter(|v| !is_delete_directive(v))
            .collect()
    };
    let (mut patch_index, mut order_index) = (0, 0);
    while patch_index < non_delete.len() && order_index < order.len() {
        if has_directive_marker(non_delete[patch_index]) {
            patch_index += 1;
            continue;
        }
        if merge_key_value_equal(non_delete[patch_index], &order[order_index], merge_key)? {
            patch_index += 1;
        }
        order_index += 1;
    }
    if patch_index < non_delete.len() && order_index >= order.len() {
        return Err(strategic(format!(
            "the order in patch list:\n{}\n doesn't match {SET_ELEMENT_ORDER_PREFIX} list:\n{}",
            show(&Value::Array(patch_list.to_vec())),
            show(&Value::Array(order.to_vec()))
        )));
    }
    Ok(())
}

fn has_directive_marker(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|m| m.contains_key(DIRECTIVE_MARKER))
}

fn is_delete_directive(value: &Value) -> bool {
    value
        .as_object()
        .and_then(|m| m.get(DIRECTIVE_MARKER))
        .and_then(Value::as_str)
        == Some(DELETE_DIRECTIVE)
}

fn merge_key_value_equal(left: &Value, right: &Value, merge_key: &str) -> Result<bool, PatchError> {
    if merge_key.is_empty() {
        return Ok(scalar_equal(left, right));
    }
    let (Some(left), Some(right)) = (left.as_object(), right.as_object()) else {
        return Err(strategic(format!(
            "expected a map with merge key {merge_key}, but received a scalar"
        )));
    };
    let l = left
        .get(merge_key)
        .ok_or_else(|| no_merge_key(left, merge_key))?;
    let r = right
        .get(merge_key)
        .ok_or_else(|| no_merge_key(right, merge_key))?;
    Ok(scalar_equal(l, r))
}

fn merge_slice_handler(
    original: Vec<Value>,
    patch: Vec<Value>,
    schema: Schema,
    key: &str,
    is_delete_list: bool,
) -> Result<Vec<Value>, PatchError> {
    let field = schema.field(key);
    // Delete lists apply whatever the field's strategy is.
    if field.patch_strategy == PatchStrategy::Merge || is_delete_list {
        merge_slice(
            original,
            patch,
            schema.child(key),
            key,
            field.patch_merge_key.unwrap_or(""),
            is_delete_list,
        )
    } else {
        Ok(clean_list(patch))
    }
}

fn merge_slice(
    original: Vec<Value>,
    patch: Vec<Value>,
    element_schema: Schema,
    key: &str,
    merge_key: &str,
    is_delete_list: bool,
) -> Result<Vec<Value>, PatchError> {
    if original.is_empty() && patch.is_empty() {
        return Ok(original);
    }
    let Some(element_kind) = slice_element_kind(&[&original, &patch])? else {
        return Ok(original);
    };
    let (live, patch, merged) = if element_kind != Kind::Object {
        if is_delete_list {
            return Ok(original
                .into_iter()
                .filter(|v| !patch.iter().any(|d| scalar_equal(v, d)))
                .collect());
        }
        let mut merged: Vec<Value> = Vec::with_capacity(original.len() + patch.len());
        for value in original.iter().chain(&patch) {
            if !merged.iter().any(|m| scalar_equal(m, value)) {
                merged.push(value.clone());
            }
        }
        (original, patch, merged)
    } else {
        if merge_key.is_empty() {
            return Err(strategic(format!(
                "cannot merge lists without merge key for {key}"
            )));
        }
        let (live, patch) = merge_slice_with_special_elements(original, patch, merge_key)?;
        let merged =
            merge_slice_without_special_elements(live.clone(), &patch, merge_key, element_schema)?;
        (live, patch, merged)
    };
    let (in_patch, server_only) = partition_by_presence(
        merged,
        &patch,
        if element_kind == Kind::Object {
            merge_key
        } else {
            ""
        },
    )?;
    normalize_element_order(
        in_patch,
        server_only,
        &patch,
        &live,
        merge_key,
        element_kind,
    )
}

/// Processes `$patch: delete|replace|merge` items of a list of maps; returns the live list
/// after deletions (or the replacement) and the patch without directive items.
fn merge_slice_with_special_elements(
    original: Vec<Value>,
    patch: Vec<Value>,
    merge_key: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut live = original;
    let mut plain = Vec::with_capacity(patch.len());
    let mut replace = false;
    for item in patch {
        let Some(map) = item.as_object() else {
            return Err(strategic("list element types are not identical"));
        };
        let Some(directive) = map.get(DIRECTIVE_MARKER) else {
            plain.push(item);
            continue;
        };
        match directive.as_str() {
            Some(DELETE_DIRECTIVE) => {
                let Some(value) = map.get(merge_key) else {
                    return Err(no_merge_key(map, merge_key));
                };
                live.retain(|v| {
                    !v.as_object()
                        .and_then(|m| m.get(merge_key))
                        .is_some_and(|k| scalar_equal(k, value))
                });
            }
            // Keep scanning so every other directive item is pruned too.
            Some(REPLACE_DIRECTIVE) => replace = true,
            Some(MERGE_DIRECTIVE) => {
                return Err(strategic(
                    "merging lists cannot yet be specified in the patch",
                ));
            }
            _ => {
                return Err(strategic(format!(
                    "unknown patch type: {} in map: {}",
                    directive
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| show(directive)),
                    show(&item)
                )));
            }
        }
    }
    if replace {
        return Ok((clean_list(plain), Vec::new()));
    }
    Ok((live, plain))
}

fn merge_slice_without_special_elements(
    mut live: Vec<Value>,
    patch: &[Value],
    merge_key: &str,
    schema: Schema,
) -> Result<Vec<Value>, PatchError> {
    for item in patch {
        let Some(map) = item.as_object() else {
            return Err(strategic("list element types are not identical"));
        };
        let Some(value) = map.get(merge_key) else {
            return Err(no_merge_key(map, merge_key));
        };
        let found = live.iter().position(|v| {
            v.as_object()
                .and_then(|m| m.get(merge_key))
                .is_some_and(|k| scalar_equal(k, value))
        });
        match found {
            Some(i) => {
                let existing = std::mem::take(&mut live[i]);
                let Value::Object(existing) = existing else {
                    return Err(strategic(format!("value for key {i} is not a map")));
                };
                live[i] = Value::Object(merge_map(existing, map.clone(), schema)?);
            }
            None => {
                if let Some(value) = clean_new_value(item.clone()) {
                    live.push(value);
                }
            }
        }
    }
    Ok(live)
}

/// The common kind of the elements of `lists`; `None` when they are all empty. Lists of lists
/// and mixed lists are errors, as upstream.
fn slice_element_kind(lists: &[&[Value]]) -> Result<Option<Kind>, PatchError> {
    let mut found: Option<Kind> = None;
    for value in lists.iter().flat_map(|l| l.iter()) {
        let k = kind(value);
        if k == Kind::Array {
            return Err(strategic("lists of lists are not supported"));
        }
        match found {
            None => found = Some(k),
            Some(prev) if prev != k => {
                return Err(strategic("list element types are not identical"));
            }
            Some(_) => {}
        }
    }
    Ok(found)
}

/// Position of `value` in `list`, comparing merge-key values for maps and values otherwise.
fn index_of(list: &[Value], value: &Value, merge_key: &str, element_kind: Kind) -> Option<usize> {
    let key_of = |v: &'_ Value| -> Option<Value> {
        if element_kind == Kind::Object {
            v.as_object().and_then(|m| m.get(merge_key)).cloned()
        } else {
            Some(v.clone())
        }
    };
    let wanted = key_of(value);
    list.iter().position(|v| match (&key_of(v), &wanted) {
        (Some(a), Some(b)) => scalar_equal(a, b),
        (None, None) => true,
        _ => false,
    })
}

/// Splits `merged` into the items present in `partition_by` and the rest, keeping order.
fn partition_by_presence(
    merged: Vec<Value>,
    partition_by: &[Value],
    merge_key: &str,
) -> Result<(Vec<Value>, Vec<Value>), PatchError> {
    let mut present = Vec::new();
    let mut absent = Vec::new();
    for item in merged {
        let found = if merge_key.is_empty() {
            partition_by.iter().any(|p| scalar_equal(p, &item))
        } else {
            let Some(map) = item.as_object() else {
                return Err(strategic("list element types are not identical"));
            };
            let Some(value) = map.get(merge_key) else {
                return Err(no_merge_key(map, merge_key));
            };
            partition_by.iter().any(|p| {
                p.as_object()
                    .and_then(|m| m.get(merge_key))
                    .is_some_and(|k| scalar_equal(k, value))
            })
        };
        if found {
            present.push(item)
        } else {
            absent.push(item)
        }
    }
    Ok((present, absent))
}

/// Sorts the patch items by the patch (or `$setElementOrder`) order and the server-only items
/// by the live order, then interleaves them: a server-only item goes before a patch item only
/// when both are in the live list and the server-only item came first there.
fn normalize_element_order(
    patch_items: Vec<Value>,
    server_only: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    merge_key: &str,
    element_kind: Kind,
) -> Result<Vec<Value>, PatchError> {
    let patch_items = normalize_slice_order(patch_items, patch_order, merge_key, element_kind)?;
    let server_only = normalize_slice_order(server_only, server_order, merge_key, element_kind)?;
    Ok(merge_sorted_slice(
        server_only,
        patch_items,
        server_order,
        merge_key,
        element_kind,
    ))
}

fn normalize_slice_order(
    items: Vec<Value>,
    order: &[Value],
    merge_key: &str,
    element_kind: Kind,
) -> Result<Vec<Value>, PatchError> {
    let (mut keep, to_delete): (Vec<Value>, Vec<Value>) = if element_kind == Kind::Object {
        for item in items.iter().chain(order) {
            match item.as_object() {
                Some(map) if !map.contains_key(merge_key) => {
                    return Err(no_merge_key(map, merge_key));
                }
                Some(_) => {}
                None => return Err(strategic("list element types are not identical")),
            }
        }
        items.into_iter().partition(|v| !is_delete_directive(v))
    } else {
        (items, Vec::new())
    };
    // Items missing from the order keep their relative position after the ordered ones.
    keep.sort_by_key(|v| index_of(order, v, merge_key, element_kind).unwrap_or(usize::MAX));
    keep.extend(to_delete);
    Ok(keep)
}

fn merge_sorted_slice(
    left: Vec<Value>,
    right: Vec<Value>,
    server_order: &[Value],
    merge_key: &str,
    element_kind: Kind,
) -> Vec<Value> {
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut left = left.into_iter().peekable();
    let mut right = right.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                let li = index_of(server_order, l, merge_key, element_kind);
                let ri = index_of(server_order, r, merge_key, element_kind);
                matches!((li, ri), (Some(li), Some(ri)) if li.cmp(&ri) == Ordering::Less)
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        out.extend(next);
    }
    out
}

/// A value being added where nothing was: drop `$patch` items, directive keys and nulls (what a
/// decode into the Go type would do).
fn clean_new_value(value: Value) -> Option<Value> {
    match value {
        Value::Object(map) => {
            if map.contains_key(DIRECTIVE_MARKER) {
                None
            } else {
                Some(Value::Object(clean_object(map)))
            }
        }
        Value::Array(items) => Some(Value::Array(clean_list(items))),
        Value::Null => None,
        scalar => Some(scalar),
    }
}

fn clean_object(map: Map<String, Value>) -> Map<String, Value> {
    map.into_iter()
        .filter(|(k, _)| !is_directive_key(k))
        .filter_map(|(k, v)| clean_new_value(v).map(|v| (k, v)))
        .collect()
}

fn clean_list(items: Vec<Value>) -> Vec<Value> {
    items
        .into_iter()
        .filter_map(|v| match v {
            // A null list item is kept: only keys are dropped for being null.
            Value::Null => Some(Value::Null),
            other => clean_new_value(other),
        })
        .collect()
}

fn is_directive_key(key: &str) -> bool {
    key == DIRECTIVE_MARKER
        || key == RETAIN_KEYS_DIRECTIVE
        || key.starts_with(DELETE_FROM_PRIMITIVE_LIST_PREFIX)
        || key.starts_with(SET_ELEMENT_ORDER_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Schema {
        Schema::for_kind("Pod").unwrap_or_default()
    }

    fn deployment() -> Schema {
        Schema::for_kind("Deployment").unwrap_or_default()
    }

    fn smp(schema: Schema, original: Value, patch: Value) -> Value {
        apply_strategic_merge_patch(&original, &patch, &schema)
            .unwrap_or_else(|e| panic!("patch failed: {e}"))
    }

    #[test]
    fn json_patch_operations() {
        let doc = json!({"a": {"b": [1, 2, 3]}, "c": "x", "~/": 1});
        let cases = [
            (
                json!([{"op": "add", "path": "/d", "value": 4}]),
                json!({"a": {"b": [1, 2, 3]}, "c": "x", "~/": 1, "d": 4}),
            ),
            (
                json!([{"op": "add", "path": "/a/b/1", "value": 9}]),
                json!({"a": {"b": [1, 9, 2, 3]}, "c": "x", "~/": 1}),
            ),
            (
                json!([{"op": "add", "path": "/a/b/-", "value": 9}]),
                json!({"a": {"b": [1, 2, 3, 9]}, "c": "x", "~/": 1}),
            ),
            (
                json!([{"op": "add", "path": "/a/b/3", "value": 9}]),
                json!({"a": {"b": [1, 2, 3, 9]}, "c": "x", "~/": 1}),
            ),
            (
                json!([{"op": "remove", "path": "/a/b/0"}]),
                json!({"a": {"b": [2, 3]}, "c": "x", "~/": 1}),
            ),
            (
                json!([{"op": "remove", "path": "/~0~1"}]),
                json!({"a": {"b": [1, 2, 3]}, "c": "x"}),
            ),
            (
                json!([{"op": "replace", "path": "/c", "value": {"y": 1}}]),
                json!({"a": {"b": [1, 2, 3]}, "c": {"y": 1}, "~/": 1}),
            ),
            (
                json!([{"op": "move", "from": "/c", "path": "/a/c"}]),
                json!({"a": {"b": [1, 2, 3], "c": "x"}, "~/": 1}),
            ),
            (
                json!([{"op": "move", "from": "/a/b/0", "path": "/a/b/2"}]),
                json!({"a": {"b": [2, 3, 1]}, "c": "x", "~/": 1}),
            ),
            (
                json!([{"op": "copy", "from": "/a/b", "path": "/e"}]),
                json!({"a": {"b": [1, 2, 3]}, "c": "x", "~/": 1, "e": [1, 2, 3]}),
            ),
            (
                json!([{"op": "test", "path": "/a/b/0", "value": 1.0}, {"op": "remove", "path": "/c"}]),
                json!({"a": {"b": [1, 2, 3]}, "~/": 1}),
            ),
            (
                json!([{"op": "replace", "path": "", "value": [1]}]),
                json!([1]),
            ),
            (json!([]), doc.clone()),
        ];
        for (patch, want) in cases {
            assert_eq!(apply_json_patch(&doc, &patch), Ok(want), "{patch}");
        }
    }

    #[test]
    fn json_patch_operation_count_is_limited_before_anything_is_applied() {
        let op = json!({"op": "add", "path": "/a", "value": 1});
        let at_limit = Value::Array(vec![op.clone(); MAX_JSON_PATCH_OPERATIONS]);
        assert!(apply_json_patch(&json!({}), &at_limit).is_ok());
        let over = Value::Array(vec![op; MAX_JSON_PATCH_OPERATIONS + 1]);
        assert_eq!(
            apply_json_patch(&json!({}), &over)
                .expect_err("over the limit")
                .to_string(),
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
    }

    #[test]
    fn copies_into_themselves_stop_at_the_accumulated_copy_limit() {
        // Each copy of /a into /a/x doubles the document: 18 would be ~ 2^18 × the start.
        let doc = json!({"a": {"k": "v".repeat(1000)}});
        let copies: Vec<Value> = (0..40)
            .map(|i| json!({"op": "copy", "from": "/a", "path": format!("/a/x{i}")}))
            .collect();
        let err = apply_json_patch(&doc, &Value::Array(copies)).expect_err("refused");
        match err {
            PatchError::CopySizeExceeded { accumulated, limit } => {
                assert_eq!(limit, MAX_JSON_PATCH_COPY_BYTES);
                assert!(
                    accumulated > limit && accumulated < 3 * limit,
                    "{accumulated}"
                );
            }
            other => panic!("unexpected {other}"),
        }
        // Copies within the limit still work.
        let small = json!([{"op": "copy", "from": "/a", "path": "/b"}]);
        assert_eq!(apply_json_patch(&doc, &small).expect("copy")["b"], doc["a"]);
    }

    #[test]
    fn json_patch_failures() {
        let doc = json!({"a": {"b": [1]}, "c": "x"});
        let cases = [
            (
                json!({"op": "add"}),
                "invalid json patch: a json patch must be a list of operations",
            ),
            (
                json!([{"op": "remove", "path": "/nope"}]),
                "json patch operation 0 (remove) failed: path /nope does not exist",
            ),
            (
                json!([{"op": "replace", "path": "/a/x", "value": 1}]),
                "json patch operation 0 (replace) failed: path /a/x does not exist",
            ),
            (
                json!([{"op": "add", "path": "/a/b/5", "value": 1}]),
                "json patch operation 0 (add) failed: index 5 out of bounds for a list of 1",
            ),
            (
                json!([{"op": "add", "path": "/a/b/01", "value": 1}]),
                "json patch operation 0 (add) failed: invalid list index \"01\"",
            ),
            (
                json!([{"op": "add", "path": "/x/y", "value": 1}]),
                "json patch operation 0 (add) failed: path /x does not exist",
            ),
            (
                json!([{"op": "test", "path": "/c", "value": "y"}]),
                "json patch operation 0 (test) failed: testing value /c failed",
            ),
            (
                json!([{"op": "move", "from": "/a", "path": "/a/b/c"}]),
                "json patch operation 0 (move) failed: cannot move a value into one of its own children",
            ),
            (
                json!([{"op": "frob", "path": "/c"}]),
                "json patch operation 0 (frob) failed: unknown operation \"frob\"",
            ),
            (
                json!([{"op": "add", "path": "c", "value": 1}]),
                "json patch operation 0 (add) failed: invalid path \"c\": must start with '/'",
            ),
            (
                json!([{"op": "add", "path": "/c"}]),
                "json patch operation 0 (add) failed: missing \"value\"",
            ),
            (
                json!([{"op": "remove", "path": "/c"}, {"op": "remove", "path": "/c"}]),
                "json patch operation 1 (remove) failed: path /c does not exist",
            ),
            (
                json!([{"op": "remove", "path": "/a~2"}]),
                "json patch operation 0 (remove) failed: invalid path \"/a~2\": bad escape in \"a~2\"",
            ),
        ];
        for (patch, want) in cases {
            assert_eq!(
                apply_json_patch(&doc, &patch).map_err(|e| e.to_string()),
                Err(want.to_string()),
                "{patch}"
            );
        }
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        // The examples of RFC 7386 appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (doc, patch, want) in cases {
            assert_eq!(apply_merge_patch(&doc, &patch), want, "{doc} + {patch}");
        }
    }

    #[test]
    fn smp_merges_containers_by_name_and_replaces_unmerged_lists() {
        let original = json!({"spec": {"template": {"spec": {
            "containers": [
                {"name": "app", "image": "app:1", "args": ["a", "b"], "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                {"name": "side", "image": "side:1"}
            ],
            "tolerations": [{"key": "k1"}, {"key": "k2"}]
        }}}});
        let patch = json!({"spec": {"template": {"spec": {
            "containers": [{"name": "app", "image": "app:2", "args": ["c"], "env": [{"name": "B", "value": "3"}]}],
            "tolerations": [{"key": "k3"}]
        }}}});
        let want = json!({"spec": {"template": {"spec": {
            "containers": [
                {"name": "app", "image": "app:2", "args": ["c"], "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}]},
                {"name": "side", "image": "side:1"}
            ],
            "tolerations": [{"key": "k3"}]
        }}}});
        assert_eq!(smp(deployment(), original, patch), want);
    }

    #[test]
    fn smp_table() {
        let cases: Vec<(&str, Schema, Value, Value, Value)> = vec![
            (
                "null deletes a key",
                pod(),
                json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
                json!({"metadata": {"labels": {"a": null}}}),
                json!({"metadata": {"labels": {"b": "2"}}}),
            ),
            (
                "null for an absent key is ignored",
                pod(),
                json!({"a": 1}),
                json!({"b": null}),
                json!({"a": 1}),
            ),
            (
                "nulls inside new values are dropped",
                pod(),
                json!({}),
                json!({"spec": {"x": null, "y": 1}}),
                json!({"spec": {"y": 1}}),
            ),
            (
                "scalars replace",
                pod(),
                json!({"spec": {"nodeName": "a"}}),
                json!({"spec": {"nodeName": "b"}}),
                json!({"spec": {"nodeName": "b"}}),
            ),
            (
                "type change replaces",
                pod(),
                json!({"spec": {"x": {"a": 1}}}),
                json!({"spec": {"x": [1]}}),
                json!({"spec": {"x": [1]}}),
            ),
            (
                "new container goes first without an order directive",
                pod(),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
                json!({"spec": {"containers": [{"name": "c", "image": "c"}]}}),
                json!({"spec": {"containers": [{"name": "c", "image": "c"}, {"name": "a"}, {"name": "b"}]}}),
            ),
            (
                "patched items keep their live position relative to server-only ones",
                pod(),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "image": "1"}, {"name": "c"}]}}),
                json!({"spec": {"containers": [{"name": "b", "image": "2"}]}}),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "image": "2"}, {"name": "c"}]}}),
            ),
            (
                "$patch delete removes a list item by merge key",
                pod(),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
                json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}]}}),
                json!({"spec": {"containers": [{"name": "b"}]}}),
            ),
            (
                "$patch replace on a list replaces it",
                pod(),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
                json!({"spec": {"containers": [{"name": "c"}, {"$patch": "replace"}]}}),
                json!({"spec": {"containers": [{"name": "c"}]}}),
            ),
            (
                "$patch replace on a map replaces it",
                pod(),
                json!({"spec": {"securityContext": {"runAsUser": 1, "fsGroup": 2}}}),
                json!({"spec": {"securityContext": {"$patch": "replace", "runAsGroup": 3}}}),
                json!({"spec": {"securityContext": {"runAsGroup": 3}}}),
            ),
            (
                "$patch delete on a map empties it",
                pod(),
                json!({"spec": {"securityContext": {"runAsUser": 1}}}),
                json!({"spec": {"securityContext": {"$patch": "delete"}}}),
                json!({"spec": {"securityContext": {}}}),
            ),
            (
                "finalizers merge as a set",
                pod(),
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"finalizers": ["b", "c"]}}),
                json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
            ),
            (
                "a new finalizer without an order directive goes first",
                pod(),
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"finalizers": ["c"]}}),
                json!({"metadata": {"finalizers": ["c", "a", "b"]}}),
            ),
            (
                "$deleteFromPrimitiveList removes values",
                pod(),
                json!({"metadata": {"finalizers": ["a", "b", "c"]}}),
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b", "x"]}}),
                json!({"metadata": {"finalizers": ["a", "c"]}}),
            ),
            (
                "$deleteFromPrimitiveList on an absent list is a no-op",
                pod(),
                json!({"metadata": {}}),
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
                json!({"metadata": {}}),
            ),
            (
                "$setElementOrder orders merged items",
                pod(),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
                json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "c"}, {"name": "b"}], "containers": [{"name": "c", "image": "c"}]}}),
                json!({"spec": {"containers": [{"name": "a"}, {"name": "c", "image": "c"}, {"name": "b"}]}}),
            ),
            (
                "$setElementOrder reorders primitives",
                pod(),
                json!({"metadata": {"finalizers": ["a", "b"]}}),
                json!({"metadata": {"$setElementOrder/finalizers": ["b", "c", "a"], "finalizers": ["c"]}}),
                json!({"metadata": {"finalizers": ["b", "c", "a"]}}),
            ),
            (
                "$setElementOrder keeps server-only items by live order",
                pod(),
                json!({"spec": {"containers": [{"name": "x"}, {"name": "a"}, {"name": "y"}, {"name": "b"}]}}),
                json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}),
                json!({"spec": {"containers": [{"name": "x"}, {"name": "y"}, {"name": "b"}, {"name": "a"}]}}),
            ),
            (
                "$retainKeys clears unlisted keys",
                deployment(),
                json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}}),
                json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
                json!({"spec": {"strategy": {"type": "Recreate"}}}),
            ),
            (
                "ports merge by containerPort",
                pod(),
                json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}]}]}}),
                json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "web"}]}]}}),
                json!({"spec": {"containers": [{"name": "a", "ports": [{"containerPort": 80, "name": "web"}, {"containerPort": 443}]}]}}),
            ),
            (
                "volume mounts merge by mountPath",
                pod(),
                json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"mountPath": "/a", "name": "v1"}]}]}}),
                json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"mountPath": "/b", "name": "v2"}]}]}}),
                json!({"spec": {"containers": [{"name": "a", "volumeMounts": [{"mountPath": "/b", "name": "v2"}, {"mountPath": "/a", "name": "v1"}]}]}}),
            ),
            (
                "conditions merge by type",
                pod(),
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Scheduled", "status": "True"}]}}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Scheduled", "status": "True"}]}}),
            ),
            (
                "node taints are replaced wholesale",
                Schema::for_kind("Node").unwrap_or_default(),
                json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}}),
                json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
                json!({"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}),
            ),
            (
                "service ports merge by port",
                Schema::for_kind("Service").unwrap_or_default(),
                json!({"spec": {"ports": [{"port": 80, "targetPort": 8080}, {"port": 443}]}}),
                json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}}),
                json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}]}}),
            ),
            (
                "owner references merge by uid",
                Schema::for_kind("ConfigMap").unwrap_or_default(),
                json!({"metadata": {"ownerReferences": [{"uid": "1", "name": "a"}]}}),
                json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}]}}),
                json!({"metadata": {"ownerReferences": [{"uid": "2", "name": "b"}, {"uid": "1", "name": "a"}]}}),
            ),
            (
                "directives in new values are stripped",
                pod(),
                json!({"spec": {}}),
                json!({"spec": {"containers": [{"name": "a", "env": [{"name": "X", "$patch": "delete"}], "$setElementOrder/env": [{"name": "X"}]}]}}),
                json!({"spec": {"containers": [{"name": "a", "env": []}]}}),
            ),
            (
                "cronjob containers are merged deep in the job template",
                Schema::for_kind("CronJob").unwrap_or_default(),
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b"}]}}}}}}),
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "2"}]}}}}}}),
                json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "a", "image": "2"}, {"name": "b"}]}}}}}}),
            ),
            (
                "unknown fields merge maps and replace lists",
                pod(),
                json!({"spec": {"extra": {"a": 1, "l": [1, 2]}}}),
                json!({"spec": {"extra": {"b": 2, "l": [3]}}}),
                json!({"spec": {"extra": {"a": 1, "l": [3], "b": 2}}}),
            ),
            (
                "an empty patch list leaves a merged list alone",
                pod(),
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": []}}),
                json!({"metadata": {"finalizers": ["a"]}}),
            ),
            (
                "$patch delete at the top empties the object",
                pod(),
                json!({"a": 1}),
                json!({"$patch": "delete"}),
                json!({}),
            ),
        ];
        for (name, schema, original, patch, want) in cases {
            assert_eq!(
                apply_strategic_merge_patch(&original, &patch, &schema),
                Ok(want),
                "{name}"
            );
        }
    }

    #[test]
    fn smp_errors() {
        let cases: Vec<(Value, Value, &str)> = vec![
            (
                json!({"spec": {"containers": [{"name": "a"}]}}),
                json!({"spec": {"containers": [{"image": "x"}]}}),
                "map: {\"image\":\"x\"} does not contain declared merge key: name",
            ),
            (
                json!({"spec": {"containers": [{"name": "a"}]}}),
                json!({"spec": {"containers": [{"$patch": "merge", "name": "a"}]}}),
                "merging lists cannot yet be specified in the patch",
            ),
            (
                json!({"spec": {}}),
                json!({"spec": {"$patch": "frob"}}),
                "unknown patch type: frob in map: {\"$patch\":\"frob\"}",
            ),
            (
                json!({"spec": {"containers": [{"name": "a"}]}}),
                json!({"spec": {"containers": [{"name": "b", "$patch": "frob"}]}}),
                "unknown patch type: frob in map: {\"name\":\"b\",\"$patch\":\"frob\"}",
            ),
            (
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": [["b"]]}}),
                "lists of lists are not supported",
            ),
            (
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"finalizers": [1]}}),
                "list element types are not identical",
            ),
            (
                json!({"spec": {}}),
                json!({"spec": {"$retainKeys": "x"}}),
                "invalid patch format of retainKeys",
            ),
            (
                json!({"spec": {}}),
                json!({"spec": {"$retainKeys": ["a"], "b": 1}}),
                "invalid patch format of retainKeys",
            ),
            (
                json!({"spec": {}}),
                json!({"spec": {"$setElementOrder/containers": "x"}}),
                "invalid patch format of setElementOrder list",
            ),
            (
                json!({"metadata": {"finalizers": ["a"]}}),
                json!({"metadata": {"$deleteFromPrimitiveListfinalizers": ["a"]}}),
                "invalid patch format of primitive list",
            ),
            (
                json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}),
                json!({"spec": {"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "b"}]}}),
                "the order in patch list:\n[{\"name\":\"b\"}]\n doesn't match $setElementOrder list:\n[{\"name\":\"a\"}]",
            ),
            (
                json!({"spec": {"x": [{"a": 1}]}}),
                json!({"spec": {"x": [{"a": 2}]}}),
                "",
            ),
        ];
        for (original, patch, want) in cases {
            let got =
                apply_strategic_merge_patch(&original, &patch, &pod()).map_err(|e| e.to_string());
            if want.is_empty() {
                assert!(got.is_ok(), "{patch}: {got:?}");
            } else {
                assert_eq!(got, Err(want.to_string()), "{patch}");
            }
        }
        assert_eq!(
            apply_strategic_merge_patch(&json!([]), &json!({}), &pod()),
            Err(PatchError::BadJsonDocument)
        );
        let lists_without_key = Schema::for_kind("Pod").unwrap_or_default();
        let got = apply_strategic_merge_patch(
            &json!({"metadata": {"finalizers": [{"a": 1}]}}),
            &json!({"metadata": {"finalizers": [{"a": 2}]}}),
            &lists_without_key,
        );
        assert_eq!(
            got.map_err(|e| e.to_string()),
            Err("cannot merge lists without merge key for finalizers".into())
        );
    }

    #[test]
    fn patches_keep_key_order() {
        let original = json!({"a": 1, "b": {"x": 1, "y": 2}, "c": 3});
        let merged = smp(
            pod(),
            original.clone(),
            json!({"a": 2, "b": {"x": null, "z": 3}}),
        );
        assert_eq!(merged.to_string(), r#"{"a":2,"b":{"y":2,"z":3},"c":3}"#);
        let merged = apply_merge_patch(&original, &json!({"a": null, "b": {"x": 5}}));
        assert_eq!(merged.to_string(), r#"{"b":{"x":5,"y":2},"c":3}"#);
        let patched = apply_json_patch(
            &original,
            &json!([{"op": "remove", "path": "/a"}, {"op": "replace", "path": "/b/x", "value": 0}]),
        );
        assert_eq!(
            patched.map(|v| v.to_string()),
            Ok(r#"{"b":{"x":0,"y":2},"c":3}"#.to_string())
        );
    }

    #[test]
    fn json_equality_compares_numbers_by_value() {
        assert!(json_equal(&json!({"a": [1, 2.0]}), &json!({"a": [1.0, 2]})));
        assert!(!json_equal(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(!json_equal(&json!([1]), &json!(["1"])));
        assert!(json_equal(&json!(u64::MAX), &json!(u64::MAX)));
    }
}
