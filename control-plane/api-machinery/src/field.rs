//! Field-level validation errors and field paths, shaped like upstream's
//! `k8s.io/apimachinery/pkg/util/validation/field` so messages read exactly as kube-apiserver's.

use std::fmt;

use serde_json::Value;

/// A path to a field inside an object, rendered as `spec.containers[0].name` or
/// `metadata.labels[app]` (upstream `field.Path`).
///
/// The empty path renders as `<nil>`, which is what upstream prints when a validation error is
/// raised without a path (for example while parsing a label selector).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Path {
    elements: Vec<PathElement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathElement {
    Field(String),
    Index(usize),
    Key(String),
}

impl Path {
    /// A path starting at the named root field (`field.NewPath`).
    pub fn new(root: impl Into<String>) -> Self {
        Path {
            elements: vec![PathElement::Field(root.into())],
        }
    }

    /// The empty path (upstream's nil `*field.Path`).
    pub fn none() -> Self {
        Path::default()
    }

    /// This path extended by a struct field.
    pub fn child(&self, name: impl Into<String>) -> Self {
        self.with(PathElement::Field(name.into()))
    }

    /// This path extended by a list index.
    pub fn index(&self, index: usize) -> Self {
        self.with(PathElement::Index(index))
    }

    /// This path extended by a map key.
    pub fn key(&self, key: impl Into<String>) -> Self {
        self.with(PathElement::Key(key.into()))
    }

    fn with(&self, element: PathElement) -> Self {
        let mut elements = self.elements.clone();
        elements.push(element);
        Path { elements }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.elements.is_empty() {
            return f.write_str("<nil>");
        }
        for (i, element) in self.elements.iter().enumerate() {
            match element {
                PathElement::Field(name) if i == 0 => f.write_str(name)?,
                PathElement::Field(name) => write!(f, ".{name}")?,
                PathElement::Index(index) => write!(f, "[{index}]")?,
                PathElement::Key(key) => write!(f, "[{key}]")?,
            }
        }
        Ok(())
    }
}

/// The machine-readable kind of a field error (upstream `field.ErrorType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// `FieldValueNotFound`.
    NotFound,
    /// `FieldValueRequired`.
    Required,
    /// `FieldValueDuplicate`.
    Duplicate,
    /// `FieldValueInvalid`.
    Invalid,
    /// `FieldValueNotSupported`.
    NotSupported,
    /// `FieldValueForbidden`.
    Forbidden,
    /// `FieldValueTooLong`.
    TooLong,
    /// `FieldValueTooMany`.
    TooMany,
    /// `InternalError`.
    Internal,
    /// `FieldValueTypeInvalid`.
    TypeInvalid,
}

impl ErrorType {
    /// The `StatusCause.reason` string, e.g. `FieldValueInvalid`.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TooMany => "FieldValueTooMany",
            ErrorType::Internal => "InternalError",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The human prefix of the message, e.g. `Invalid value`.
    pub fn message(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid | ErrorType::TypeInvalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::TooMany => "Too many",
            ErrorType::Internal => "Internal error",
        }
    }
}

/// One field-level validation failure (upstream `field.Error`).
///
/// `Display` renders `<field>: <type>: <value>: <detail>` exactly as upstream's `Error()`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {}", self.body())]
pub struct FieldError {
    /// What went wrong.
    pub error_type: ErrorType,
    /// The rendered path of the offending field.
    pub field: String,
    /// The offending value; `None` when upstream omits it from the message.
    pub bad_value: Option<Value>,
    /// Extra explanation appended after the value.
    pub detail: String,
}

impl FieldError {
    /// `field.Invalid`.
    pub fn invalid(path: &Path, value: impl Into<Value>, detail: impl Into<String>) -> Self {
        Self::with_value(ErrorType::Invalid, path, value.into(), detail)
    }

    /// `field.Required`.
    pub fn required(path: &Path, detail: impl Into<String>) -> Self {
        FieldError {
            error_type: ErrorType::Required,
            field: path.to_string(),
            bad_value: None,
            detail: detail.into(),
        }
    }

    /// `field.Forbidden`.
    pub fn forbidden(path: &Path, detail: impl Into<String>) -> Self {
        FieldError {
            error_type: ErrorType::Forbidden,
            field: path.to_string(),
            bad_value: None,
            detail: detail.into(),
        }
    }

    /// `field.Duplicate`.
    pub fn duplicate(path: &Path, value: impl Into<Value>) -> Self {
        Self::with_value(ErrorType::Duplicate, path, value.into(), "")
    }

    /// `field.NotSupported`: the detail lists the quoted supported values.
    pub fn not_supported(path: &Path, value: impl Into<Value>, supported: &[&str]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::with_value(ErrorType::NotSupported, path, value.into(), detail)
    }

    /// `field.TooLong` with upstream's `must have at most N bytes` detail.
    pub fn too_long(path: &Path, max_bytes: usize) -> Self {
        FieldError {
            error_type: ErrorType::TooLong,
            field: path.to_string(),
            bad_value: None,
            detail: format!("must have at most {max_bytes} bytes"),
        }
    }

    fn with_value(
        error_type: ErrorType,
        path: &Path,
        value: Value,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            error_type,
            field: path.to_string(),
            bad_value: Some(value),
            detail: detail.into(),
        }
    }

    /// The message without the field name (upstream `ErrorBody`), used as `StatusCause.message`.
    pub fn body(&self) -> String {
        let mut s = match (&self.bad_value, self.error_type) {
            // These types never print the value, whatever was recorded.
            (
                _,
                ErrorType::Required
                | ErrorType::Forbidden
                | ErrorType::TooLong
                | ErrorType::Internal,
            )
            | (None, _) => self.error_type.message().to_string(),
            (Some(value), _) => format!("{}: {}", self.error_type.message(), render_value(value)),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

/// Renders a bad value the way Go's `%q`/`%v` would for the JSON shapes a request carries.
fn render_value(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::String(s) => go_quote(s),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        // Most list-valued bad values upstream are `[]string`, which `%#v` prints Go-style.
        Value::Array(items) if items.iter().all(Value::is_string) => {
            let quoted: Vec<String> = items
                .iter()
                .filter_map(Value::as_str)
                .map(go_quote)
                .collect();
            format!("[]string{{{}}}", quoted.join(", "))
        }
        // Upstream falls back to Go's `%#v` of its own types here; JSON is the closest honest
        // rendering of an untyped value.
        other => other.to_string(),
    }
}

/// Joins errors the way upstream's `ErrorList.ToAggregate().Error()` does: one error prints
/// alone, several print as `[a, b]`; repeated messages are dropped.
pub fn aggregate(errors: &[FieldError]) -> String {
    let mut seen = Vec::<String>::new();
    for error in errors {
        let message = error.to_string();
        if !seen.contains(&message) {
            seen.push(message);
        }
    }
    aggregate_messages(&seen)
}

/// `utilerrors.NewAggregate(...).Error()` over plain messages.
pub fn aggregate_messages(messages: &[String]) -> String {
    match messages {
        [] => String::new(),
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// Go's `strconv.Quote`: double quotes, backslash escapes for quotes, backslashes and
/// non-printable characters; printable Unicode is kept as is.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => {
                if (c as u32) <= 0xffff {
                    out.push_str(&format!("\\u{:04x}", c as u32));
                } else {
                    out.push_str(&format!("\\U{:08x}", c as u32));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_render_like_upstream() {
        let cases = [
            (Path::none(), "<nil>"),
            (Path::new("metadata").child("name"), "metadata.name"),
            (
                Path::new("spec")
                    .child("containers")
                    .index(2)
                    .child("image"),
                "spec.containers[2].image",
            ),
            (
                Path::none().child("values").index(0).key("app"),
                "values[0][app]",
            ),
            (
                Path::new("metadata").child("labels").key("a/b"),
                "metadata.labels[a/b]",
            ),
        ];
        for (path, want) in cases {
            assert_eq!(path.to_string(), want);
        }
    }

    #[test]
    fn errors_render_like_upstream() {
        let name = Path::new("metadata").child("name");
        let cases = [
            (
                FieldError::invalid(&name, "Foo", "bad"),
                r#"metadata.name: Invalid value: "Foo": bad"#,
            ),
            (
                FieldError::invalid(&name, json!(3), "bad"),
                "metadata.name: Invalid value: 3: bad",
            ),
            (
                FieldError::invalid(&name, json!(null), ""),
                "metadata.name: Invalid value: null",
            ),
            (
                FieldError::required(&name, "name or generateName is required"),
                "metadata.name: Required value: name or generateName is required",
            ),
            (
                FieldError::forbidden(&name, "not allowed"),
                "metadata.name: Forbidden: not allowed",
            ),
            (
                FieldError::duplicate(&name, "a"),
                r#"metadata.name: Duplicate value: "a""#,
            ),
            (
                FieldError::not_supported(&Path::new("spec").child("type"), "X", &["A", "B"]),
                r#"spec.type: Unsupported value: "X": supported values: "A", "B""#,
            ),
            (
                FieldError::too_long(&Path::new("metadata").child("annotations"), 262144),
                "metadata.annotations: Too long: must have at most 262144 bytes",
            ),
            (
                FieldError::invalid(&Path::none(), "a\"b", "x"),
                r#"<nil>: Invalid value: "a\"b": x"#,
            ),
            (
                FieldError::invalid(&name, json!(["a", "b"]), "x"),
                r#"metadata.name: Invalid value: []string{"a", "b"}: x"#,
            ),
            (
                FieldError::invalid(&name, json!([]), "x"),
                "metadata.name: Invalid value: []string{}: x",
            ),
            (
                FieldError::invalid(&name, json!([1]), "x"),
                "metadata.name: Invalid value: [1]: x",
            ),
        ];
        for (error, want) in cases {
            assert_eq!(error.to_string(), want);
        }
    }

    #[test]
    fn aggregates_like_upstream() {
        let p = Path::new("x");
        let a = FieldError::required(&p, "a");
        let b = FieldError::required(&p, "b");
        assert_eq!(aggregate(&[]), "");
        assert_eq!(aggregate(std::slice::from_ref(&a)), "x: Required value: a");
        assert_eq!(
            aggregate(&[a.clone(), b, a]),
            "[x: Required value: a, x: Required value: b]"
        );
    }

    #[test]
    fn quotes_like_go() {
        let cases = [
            ("abc", r#""abc""#),
            ("a\nb", r#""a\nb""#),
            ("\u{1}", r#""\x01""#),
            ("é", "\"é\""),
            ("\\", r#""\\""#),
        ];
        for (input, want) in cases {
            assert_eq!(go_quote(input), want, "{input:?}");
        }
    }

    #[test]
    fn error_types_have_upstream_reasons() {
        assert_eq!(ErrorType::Invalid.reason(), "FieldValueInvalid");
        assert_eq!(ErrorType::TypeInvalid.message(), "Invalid value");
        assert_eq!(ErrorType::Internal.reason(), "InternalError");
    }
}
