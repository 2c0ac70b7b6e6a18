//! The `meta.k8s.io/v1` Table representation (`Accept: …;as=Table`) that `kubectl get` prints.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta;

/// One printed column and how to compute its cell from an object.
#[derive(Clone)]
pub struct Column {
    /// Header, e.g. `Ready`.
    pub name: Cow<'static, str>,
    /// OpenAPI type of the cell: `string`, `integer`, `number`, `boolean`.
    pub ty: Cow<'static, str>,
    /// OpenAPI format hint (`name` for the name column), usually empty.
    pub format: Cow<'static, str>,
    /// What the column means.
    pub description: Cow<'static, str>,
    /// 0 for the default view, 1 for `-o wide` only.
    pub priority: i64,
    /// Computes the cell.
    pub cell: Cell,
}

/// How a column's cell is computed.
#[derive(Clone)]
pub enum Cell {
    /// By code (the built-in kinds' printers).
    Computed(fn(&Value) -> Value),
    /// By a custom resource's `additionalPrinterColumns` path.
    Path(Arc<crate::apiextensions::columns::JsonPath>),
    /// By such a path to a timestamp, printed as an age (`5m`) as upstream's printer does
    /// for columns of type `date`.
    Age(Arc<crate::apiextensions::columns::JsonPath>),
}

impl Cell {
    fn of(&self, obj: &Value) -> Value {
        match self {
            Cell::Computed(cell) => cell(obj),
            Cell::Path(path) => path.cell(obj),
            Cell::Age(path) => match path.cell(obj) {
                Value::String(timestamp) => json!(since(Some(&timestamp))),
                _ => Value::Null,
            },
        }
    }
}

impl Column {
    /// A default-view column.
    pub const fn new(
        name: &'static str,
        ty: &'static str,
        description: &'static str,
        cell: fn(&Value) -> Value,
    ) -> Self {
        Column {
            name: Cow::Borrowed(name),
            ty: Cow::Borrowed(ty),
            format: Cow::Borrowed(""),
            description: Cow::Borrowed(description),
            priority: 0,
            cell: Cell::Computed(cell),
        }
    }

    /// The same column, shown only with `-o wide`.
    pub const fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
}

/// The Age column every kind ends (or near-ends) with.
pub fn age_column() -> Column {
    Column::new(
        "Age",
        "string",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        |obj| json!(age(obj)),
    )
}

/// The Name column most kinds start with.
pub fn name_column() -> Column {
    Column {
        format: Cow::Borrowed("name"),
        ..Column::new(
            "Name",
            "string",
            "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated.",
            |obj| json!(meta::name(obj)),
        )
    }
}

/// What a Table row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// `PartialObjectMetadata` (the default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter.
    pub fn parse(value: Option<&str>) -> Option<Self> {
        match value {
            None | Some("") | Some("Metadata") => Some(IncludeObject::Metadata),
            Some("None") => Some(IncludeObject::None),
            Some("Object") => Some(IncludeObject::Object),
            Some(_) => None,
        }
    }
}

fn row(columns: &[Column], obj: &Value, include: IncludeObject) -> Value {
    let cells: Vec<Value> = columns.iter().map(|c| c.cell.of(obj)).collect();
    let mut row = json!({ "cells": cells });
    let object = match include {
        IncludeObject::None => None,
        IncludeObject::Object => Some(obj.clone()),
        IncludeObject::Metadata => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        })),
    };
    if let Some(object) = object {
        row["object"] = object;
    }
    row
}

/// Renders objects as a Table. `list_meta` is the list's `metadata` (resourceVersion, continue).
pub fn table(
    columns: &[Column],
    objects: &[Value],
    list_meta: Value,
    include: IncludeObject,
    headers: bool,
) -> Value {
    let mut table = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "rows": objects.iter().map(|o| row(columns, o, include)).collect::<Vec<_>>(),
    });
    if headers {
        table["columnDefinitions"] = Value::Array(
            columns
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name, "type": c.ty, "format": c.format,
                        "description": c.description, "priority": c.priority,
                    })
                })
                .collect(),
        );
    } else {
        table["columnDefinitions"] = json!([]);
    }
    table
}

/// `translateTimestampSince`: the object's age in kubectl's human form.
pub fn age(obj: &Value) -> String {
    since(meta::str_at(obj, &["metadata", "creationTimestamp"]))
}

/// The human duration since an RFC 3339 timestamp, or `<unknown>`.
pub fn since(timestamp: Option<&str>) -> String {
    let Some(ts) = timestamp.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else {
        return "<unknown>".to_string();
    };
    let elapsed = chrono::Utc::now().signed_duration_since(ts);
    human_duration(elapsed.num_seconds())
}

/// `duration.HumanDuration` from apimachinery: short, coarser as it grows.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_string();
    }
    if seconds < 0 {
        return "0s".to_string();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// A cell for an optional string: `<none>` when absent, as kubectl's printers do.
pub fn or_none(value: Option<&str>) -> Value {
    json!(value.filter(|v| !v.is_empty()).unwrap_or("<none>"))
}

/// An integer cell, 0 when absent.
pub fn int_at(obj: &Value, path: &[&str]) -> Value {
    json!(meta::at(obj, path).and_then(Value::as_i64).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_duration_matches_upstream_table() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 60, "3h1m"),
            (47 * 3600, "47h"),
            (2 * 86400 + 3600, "2d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }

    #[test]
    fn table_has_name_first_and_partial_metadata_rows() {
        let obj = json!({"metadata": {"name": "a", "creationTimestamp": "2020-01-01T00:00:00Z"}});
        let t = table(
            &[name_column(), age_column()],
            &[obj],
            json!({"resourceVersion": "5"}),
            IncludeObject::Metadata,
            true,
        );
        assert_eq!(t["columnDefinitions"][0]["name"], "Name");
        assert_eq!(t["rows"][0]["cells"][0], "a");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }
}
