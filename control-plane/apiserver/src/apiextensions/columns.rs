//! A custom resource's `additionalPrinterColumns`: the JSONPath subset they are written in
//! (`.spec.replicas`, `.status.conditions[?(@.type=="Ready")].status`, `.spec.items[*].name`,
//! `.metadata.labels.app`) and the Table columns and cells they make, as upstream's
//! `tableconvertor` prints them.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::table::{Cell, Column};

/// One step of a parsed path.
#[derive(Debug, Clone, PartialEq)]
enum Step {
    /// `.name` or `['name']`.
    Field(String),
    /// `[3]`.
    Index(usize),
    /// `[*]`.
    All,
    /// `[?(@.a.b=="x")]` (also `!=`).
    Filter {
        path: Vec<String>,
        equal: bool,
        value: Value,
    },
}

/// A parsed column path.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonPath {
    steps: Vec<Step>,
}

/// Parses a column's `jsonPath` (with or without kubectl's `{}` braces).
pub fn parse(path: &str) -> Result<JsonPath, String> {
    let text = path.trim();
    let text = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .unwrap_or(text);
    let mut rest = text.strip_prefix('$').unwrap_or(text);
    if !rest.starts_with('.') && !rest.starts_with('[') {
        return Err(format!("unrecognized path {path:?}"));
    }
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let name = &after[..end];
            if name.is_empty() {
                return Err(format!("empty field name in {path:?}"));
            }
            steps.push(Step::Field(name.to_string()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = closing_bracket(after).ok_or_else(|| format!("unclosed [ in {path:?}"))?;
            steps.push(
                bracket(&after[..end])
                    .ok_or_else(|| format!("unrecognized [{}] in {path:?}", &after[..end]))?,
            );
            rest = &after[end + 1..];
        } else {
            return Err(format!("unexpected {rest:?} in {path:?}"));
        }
    }
    Ok(JsonPath { steps })
}

/// Where the `]` closing a bracket is, skipping quoted text.
fn closing_bracket(text: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in text.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ']') => return Some(i),
            _ => {}
        }
    }
    None
}

fn bracket(inner: &str) -> Option<Step> {
    let inner = inner.trim();
    if inner == "*" {
        return Some(Step::All);
    }
    if let Ok(index) = inner.parse::<usize>() {
        return Some(Step::Index(index));
    }
    if let Some(quoted) = unquote(inner) {
        return Some(Step::Field(quoted));
    }
    let filter = inner.strip_prefix("?(")?.strip_suffix(')')?.trim();
    let (left, equal, right) = if let Some((l, r)) = filter.split_once("==") {
        (l, true, r)
    } else {
        let (l, r) = filter.split_once("!=")?;
        (l, false, r)
    };
    let path: Vec<String> = left
        .trim()
        .strip_prefix("@.")?
        .split('.')
        .map(str::to_string)
        .collect();
    let right = right.trim();
    let value = match unquote(right) {
        Some(text) => json!(text),
        None => serde_json::from_str(right).ok()?,
    };
    Some(Step::Filter { path, equal, value })
}

fn unquote(text: &str) -> Option<String> {
    ['"', '\''].iter().find_map(|q| {
        text.strip_prefix(*q)
            .and_then(|t| t.strip_suffix(*q))
            .map(str::to_string)
    })
}

impl JsonPath {
    /// Every value the path selects in `obj`, in order.
    pub fn find<'a>(&self, obj: &'a Value) -> Vec<&'a Value> {
        let mut current = vec![obj];
        for step in &self.steps {
            let mut next = Vec::new();
            for value in current {
                match step {
                    Step::Field(name) => next.extend(value.get(name)),
                    Step::Index(index) => next.extend(value.get(*index)),
                    Step::All => match value {
                        Value::Array(items) => next.extend(items.iter()),
                        Value::Object(map) => next.extend(map.values()),
                        _ => {}
                    },
                    Step::Filter {
                        path,
                        equal,
                        value: wanted,
                    } => {
                        for item in value.as_array().into_iter().flatten() {
                            let found = path.iter().try_fold(item, |v, key| v.get(key));
                            if (found == Some(wanted)) == *equal {
                                next.push(item);
                            }
                        }
                    }
                }
            }
            current = next;
        }
        current
    }
}

/// The Table column a definition's `additionalPrinterColumns` entry describes; `None` for an
/// entry whose path does not parse (validation refuses those).
pub fn printer_column(entry: &Value) -> Option<Column> {
    let path = parse(entry["jsonPath"].as_str()?).ok()?;
    let text = |field: &str, default: &str| -> Cow<'static, str> {
        Cow::Owned(entry[field].as_str().unwrap_or(default).to_string())
    };
    Some(Column {
        name: Cow::Owned(entry["name"].as_str()?.to_string()),
        ty: text("type", "string"),
        format: text("format", ""),
        description: text("description", ""),
        priority: entry["priority"].as_i64().unwrap_or(0),
        cell: if entry["type"] == json!("date") {
            Cell::Age(Arc::new(path))
        } else {
            Cell::Path(Arc::new(path))
        },
    })
}

impl JsonPath {
    /// The cell of `obj`: the one value selected, several joined with `,` as upstream's
    /// printer does, or null when nothing is there.
    pub fn cell(&self, obj: &Value) -> Value {
        let found = self.find(obj);
        match found.as_slice() {
            [] => Value::Null,
            [one] => (*one).clone(),
            many => json!(
                many.iter()
                    .map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_paths_select_as_kubectl_does() {
        let obj = json!({
            "spec": {"secretName": "tls", "dnsNames": ["a.example", "b.example"]},
            "status": {"conditions": [
                {"type": "Issuing", "status": "False"},
                {"type": "Ready", "status": "True", "message": "up"},
            ]},
            "metadata": {"labels": {"app": "web"}},
        });
        let cell = |path: &str| parse(path).expect("parses").cell(&obj);
        assert_eq!(cell(".spec.secretName"), json!("tls"));
        assert_eq!(
            cell(".status.conditions[?(@.type==\"Ready\")].status"),
            json!("True")
        );
        assert_eq!(
            cell(".status.conditions[?(@.type=='Ready')].message"),
            json!("up")
        );
        assert_eq!(cell(".spec.dnsNames[*]"), json!("a.example,b.example"));
        assert_eq!(cell(".spec.dnsNames[1]"), json!("b.example"));
        assert_eq!(cell(".metadata.labels.app"), json!("web"));
        assert_eq!(cell(".spec.missing"), Value::Null);
        assert_eq!(cell("{.spec['secretName']}"), json!("tls"));
    }

    #[test]
    fn malformed_paths_are_refused() {
        for bad in ["spec.x", ".spec[", ".spec..x", ".spec[?(@.a)]"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
