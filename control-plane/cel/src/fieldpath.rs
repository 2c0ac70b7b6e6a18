//! A rule's `fieldPath` (upstream `ValidFieldPath`): a relative JSON path such as
//! `.spec.replicas` or `.labels['app.kubernetes.io/name']`, checked against the schema and
//! normalized to the `field.Path` rendering the error is reported under.

use crate::schema::Structural;

/// Why a field path was refused (upstream's messages; only the fact is reported to the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldPathError(pub String);

/// The rendering of `json_path` as a path below `schema` (`spec.x[key]`), or why it is not one.
pub(crate) fn valid_field_path(
    json_path: &str,
    schema: &Structural,
) -> Result<String, FieldPathError> {
    let fail = |m: &str| Err(FieldPathError(m.to_string()));
    let tokens = tokenize(json_path);
    let mut tokens = tokens.iter().map(String::as_str);
    let mut rendered = String::new();
    let mut schema = schema;
    while let Some(token) = tokens.next() {
        let name = match token {
            "[" => {
                let Some(quoted) = tokens.next() else {
                    return fail("unexpected end of JSON path");
                };
                if quoted.len() < 2 || !quoted.starts_with('\'') || !quoted.ends_with('\'') {
                    return Err(FieldPathError(format!(
                        "expected single quoted string but got {quoted}"
                    )));
                }
                let name = unescape_single_quote(&quoted[1..quoted.len() - 1])
                    .map_err(|e| FieldPathError(format!("invalid string literal: {e}")))?;
                match tokens.next() {
                    Some("]") => {}
                    Some(other) => {
                        return Err(FieldPathError(format!("expected ] but got {other}")));
                    }
                    None => return fail("unexpected end of JSON path"),
                }
                name
            }
            "." => {
                let Some(name) = tokens.next() else {
                    return fail("unexpected end of JSON path");
                };
                name.to_string()
            }
            other => return Err(FieldPathError(format!("expected [ or . but got: {other}"))),
        };
        if let Some(properties) = schema.properties.as_ref().filter(|p| !p.is_empty()) {
            let Some(property) = properties.get(&name) else {
                return fail("does not refer to a valid field");
            };
            if !rendered.is_empty() {
                rendered.push('.');
            }
            rendered.push_str(&name);
            schema = property;
        } else if let Some(values) = &schema.additional_properties {
            rendered.push_str(&format!("[{name}]"));
            schema = values;
        } else {
            return fail("does not refer to a valid field");
        }
    }
    Ok(rendered)
}

/// Splits on `.`, `[` and `]`, keeping single-quoted strings (with `\'` escapes) whole.
fn tokenize(path: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut current = String::new();
    let mut chars = path.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\'' && current.is_empty() {
            current.push(c);
            let mut previous = c;
            for q in chars.by_ref() {
                current.push(q);
                if q == '\'' && previous != '\\' {
                    break;
                }
                previous = q;
            }
            tokens.push(std::mem::take(&mut current));
            continue;
        }
        if matches!(c, '.' | '[' | ']') {
            if !current.is_empty() {
                tokens.push(std::mem::take(&mut current));
            }
            tokens.push(c.to_string());
        } else {
            current.push(c);
        }
    }
    if !current.is_empty() {
        tokens.push(current);
    }
    tokens
}

fn unescape_single_quote(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            out.push(c);
            break;
        };
        out.push(match directive {
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            '\'' => '\'',
            '\\' => '\\',
            other => return Err(format!("invalid escape char \\{other}")),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    use serde_json::json;

    #[test]
    fn normalizes_like_upstream() {
        let props: JSONSchemaProps = serde_json::from_value(json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "a.b": {"type": "string"},
                }},
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let schema = Structural::from_props(&props);
        let cases: &[(&str, Result<&str, &str>)] = &[
            (".spec", Ok("spec")),
            (
                ".spec.labels['app.kubernetes.io/name']",
                Ok("spec.labels[app.kubernetes.io/name]"),
            ),
            (".spec['a.b']", Ok("spec.a.b")),
            (".spec.labels.x", Ok("spec.labels[x]")),
            (".spec.missing", Err("does not refer to a valid field")),
            ("spec", Err("expected [ or . but got: spec")),
            (".spec[", Err("unexpected end of JSON path")),
            (
                ".spec[labels]",
                Err("expected single quoted string but got labels"),
            ),
        ];
        for (path, want) in cases {
            let got = valid_field_path(path, &schema);
            match want {
                Ok(rendered) => assert_eq!(got.as_deref().ok(), Some(*rendered), "{path}"),
                Err(message) => {
                    assert_eq!(got.err().map(|e| e.0).as_deref(), Some(*message), "{path}")
                }
            }
        }
    }
}
