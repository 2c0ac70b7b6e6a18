//! Sizes and costs in cel-go's units (`checker.SizeEstimate`, `checker.CostEstimate` and the
//! `common` cost factors): where the sizes of `self`'s parts come from at CRD creation (the
//! schema's bounds) and at validation time (the data itself).

use std::sync::Arc;

use serde_json::Value as Json;

use crate::escaping;
use crate::schema::{DeclKind, DeclType};

/// cel-go's `common.StringTraversalCostFactor`.
pub(crate) const STRING_TRAVERSAL: f64 = 0.1;
/// cel-go's `common.RegexStringLengthCostFactor`.
pub(crate) const REGEX_STRING_LENGTH: f64 = 0.25;
/// cel-go's `common.ListCreateBaseCost`.
pub(crate) const LIST_CREATE: u64 = 10;
/// cel-go's `common.MapCreateBaseCost`.
pub(crate) const MAP_CREATE: u64 = 30;
/// cel-go's `common.StructCreateBaseCost`.
pub(crate) const STRUCT_CREATE: u64 = 40;
/// The fixed cost of one `check` of the authorizer library (upstream `CostEstimator`), set so
/// that only two fit in one expression's `PerCallLimit`.
pub(crate) const AUTHZ_CHECK: u64 = 350_000;

/// The bounds on how many elements (code points, items, entries) a value has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Size {
    pub min: u64,
    pub max: u64,
}

impl Size {
    pub const UNKNOWN: Size = Size {
        min: 0,
        max: u64::MAX,
    };

    pub fn exactly(n: u64) -> Size {
        Size { min: n, max: n }
    }

    pub fn union(self, other: Size) -> Size {
        Size {
            min: self.min.min(other.min),
            max: self.max.max(other.max),
        }
    }

    pub fn add(self, other: Size) -> Size {
        Size {
            min: self.min.saturating_add(other.min),
            max: self.max.saturating_add(other.max),
        }
    }
}

/// `multiplyByCostFactor`: the product rounded up, saturating.
pub(crate) fn factor(x: u64, factor: f64) -> u64 {
    let product = (x as f64 * factor).ceil();
    if product >= u64::MAX as f64 {
        u64::MAX
    } else {
        product as u64
    }
}

/// One step of a path from `self` or `oldSelf` into the value, as cel-go's size estimator
/// walks it (`@items`, `@values`, `@keys` or a field name).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Seg {
    /// `self`, or `oldSelf` when true.
    Root(bool),
    /// A named variable of an admission expression (`object`, `request`, ...).
    Var(&'static str),
    Field(String),
    Items,
    Values,
    Keys,
}

/// Where sizes come from.
pub(crate) trait Sizes {
    /// The size of the value at `path`, if it is known.
    fn size(&self, path: &[Seg]) -> Option<Size>;
    /// The size assumed for a value nothing is known about.
    fn unknown(&self) -> Size;
}

/// Sizes from the schema's bounds (`maxItems`, `maxLength`, `maxProperties`, or what fits in
/// a request), as upstream estimates them when a CRD is written.
pub(crate) struct DeclSizes {
    pub root: Arc<DeclType>,
}

impl Sizes for DeclSizes {
    fn size(&self, path: &[Seg]) -> Option<Size> {
        let mut node = &self.root;
        for seg in path.iter().skip(1) {
            node = match (seg, &node.kind) {
                (Seg::Field(name), DeclKind::Object(fields)) => &fields.get(name)?.ty,
                (Seg::Items, DeclKind::List(elem)) | (Seg::Values, DeclKind::Map(elem)) => elem,
                // upstream declares map keys as plain strings, with no size of their own
                (Seg::Keys, DeclKind::Map(_)) => return Some(Size { min: 0, max: 0 }),
                _ => return None,
            };
        }
        Some(Size {
            min: 0,
            max: node.max_elements.max(0) as u64,
        })
    }

    fn unknown(&self) -> Size {
        Size::UNKNOWN
    }
}

/// Sizes read off the data being validated: the largest value found at a path. An unknown
/// size (the result of a function the estimate has no model for) is taken as the size of the
/// whole value, which every size derived from it stays within in practice.
pub(crate) struct DataSizes<'a> {
    pub new: &'a Json,
    pub old: Option<&'a Json>,
    pub whole: u64,
}

impl<'a> DataSizes<'a> {
    pub fn new(new: &'a Json, old: Option<&'a Json>) -> Self {
        let whole = count(new) + old.map_or(0, count);
        DataSizes { new, old, whole }
    }
}

/// How many scalars and elements a value holds, a cheap stand-in for its serialized size.
pub(crate) fn count(value: &Json) -> u64 {
    match value {
        Json::Array(items) => 1 + items.iter().map(count).sum::<u64>(),
        Json::Object(fields) => {
            1 + fields
                .iter()
                .map(|(k, v)| k.len() as u64 + count(v))
                .sum::<u64>()
        }
        Json::String(s) => s.chars().count() as u64 + 1,
        _ => 1,
    }
}

fn element_size(value: &Json) -> u64 {
    match value {
        Json::String(s) => s.chars().count() as u64,
        Json::Array(items) => items.len() as u64,
        Json::Object(fields) => fields.len() as u64,
        _ => 0,
    }
}

impl Sizes for DataSizes<'_> {
    fn size(&self, path: &[Seg]) -> Option<Size> {
        let root = match path.first()? {
            Seg::Root(false) => self.new,
            Seg::Root(true) => self.old?,
            _ => return None,
        };
        size_at(root, &path[1..], true)
    }

    fn unknown(&self) -> Size {
        Size {
            min: 0,
            max: self.whole,
        }
    }
}

/// The largest size found at `path` below `root` in the data. Field names are CEL names, which
/// are escaped property names when the data is typed by a schema (`escaped`).
pub(crate) fn size_at(root: &Json, path: &[Seg], escaped: bool) -> Option<Size> {
    let mut values: Vec<&Json> = vec![root];
    let mut keys: Option<Vec<&str>> = None;
    for seg in path {
        let mut next = Vec::new();
        for value in &values {
            match (seg, value) {
                (Seg::Field(name), Json::Object(fields)) => {
                    let field = if escaped {
                        fields.get(&escaping::unescape(name).unwrap_or_else(|| name.clone()))
                    } else {
                        fields.get(name)
                    };
                    next.extend(field);
                }
                (Seg::Items, Json::Array(items)) => next.extend(items.iter()),
                (Seg::Values, Json::Object(fields)) => next.extend(fields.values()),
                (Seg::Keys, Json::Object(fields)) => {
                    keys.get_or_insert_with(Vec::new)
                        .extend(fields.keys().map(String::as_str));
                }
                _ => {}
            }
        }
        values = next;
    }
    let max = match keys {
        Some(keys) => keys.iter().map(|k| k.chars().count() as u64).max(),
        None => values.iter().map(|v| element_size(v)).max(),
    };
    Some(Size {
        min: 0,
        max: max.unwrap_or(0),
    })
}

/// Upstream's message for a cost over a limit (`getCostErrorMessage`).
pub(crate) fn cost_error_message(cost_name: &str, cost: u64, limit: u64) -> String {
    let exceed = cost as f64 / limit as f64;
    let factor = if exceed > 100.0 {
        "more than 100x".to_string()
    } else if exceed < 1.5 {
        format!("{exceed:.6}x")
    } else {
        format!("{exceed:.1}x")
    };
    format!(
        "{cost_name} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_sizes_off_the_data() {
        let data = json!({"items": [{"name": "ab"}, {"name": "abcd"}], "m": {"key": "v"}});
        let sizes = DataSizes::new(&data, None);
        let path = |segs: &[Seg]| sizes.size(segs).map(|s| s.max);
        let root = Seg::Root(false);
        assert_eq!(path(&[root.clone(), Seg::Field("items".into())]), Some(2));
        assert_eq!(
            path(&[
                root.clone(),
                Seg::Field("items".into()),
                Seg::Items,
                Seg::Field("name".into())
            ]),
            Some(4)
        );
        assert_eq!(
            path(&[root.clone(), Seg::Field("m".into()), Seg::Keys]),
            Some(3)
        );
        assert_eq!(path(&[Seg::Root(true)]), None);
    }

    #[test]
    fn formats_factors_like_upstream() {
        assert!(
            cost_error_message("estimated rule cost", 12_000_000, 10_000_000)
                .starts_with("estimated rule cost exceeds budget by factor of 1.200000x")
        );
        assert!(cost_error_message("x", 25_000_000, 10_000_000).contains("factor of 2.5x"));
        assert!(cost_error_message("x", u64::MAX, 10_000_000).contains("more than 100x"));
        assert_eq!(factor(5, STRING_TRAVERSAL), 1);
        assert_eq!(factor(u64::MAX, 2.0), u64::MAX);
    }
}
