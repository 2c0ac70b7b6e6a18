//! Property-name escaping between OpenAPI and CEL identifiers (upstream
//! `k8s.io/apiserver/pkg/cel/escaping.go`): `foo-bar` is `self.foo__dash__bar` in a rule.

/// The CEL lexer's reserved words: a property with one of these names is only reachable as
/// `__name__` (`namespace` is the one Kubernetes objects hit most), and no variable may be
/// named one (upstream's `celReserved`).
pub(crate) const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// The CEL identifier for a property name (`Escape`), or `None` when the name cannot be
/// expressed: it is empty, starts with a digit, or holds a character other than
/// `[a-zA-Z0-9_.-/]`.
///
/// `__` becomes `__underscores__`, `.` `__dot__`, `-` `__dash__`, `/` `__slash__`, and a reserved
/// word `w` becomes `__w__`.
pub fn escape(ident: &str) -> Option<String> {
    let first = ident.chars().next()?;
    if first.is_ascii_digit() {
        return None;
    }
    if RESERVED.contains(&ident) {
        return Some(format!("__{ident}__"));
    }
    let mut out = String::with_capacity(ident.len());
    let mut rest = ident;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with("__") {
            out.push_str("__underscores__");
            rest = &rest[2..];
            continue;
        }
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c if c.is_ascii_alphanumeric() || c == '_' => out.push(c),
            _ => return None,
        }
        rest = &rest[c.len_utf8()..];
    }
    Some(out)
}

/// The property name a CEL identifier stands for (`Unescape`), or `None` when it holds an
/// escape sequence that [`escape`] never produces.
pub fn unescape(escaped: &str) -> Option<String> {
    let bytes = escaped.as_bytes();
    let mut out = String::with_capacity(escaped.len());
    let mut i = 0;
    let mut copied = 0;
    while i + 1 < bytes.len() {
        if bytes[i] != b'_' || bytes[i + 1] != b'_' {
            i += 1;
            continue;
        }
        // upstream matches `__[^_]+__`: the contents run to the next underscore
        let start = i + 2;
        let end = escaped[start..]
            .find('_')
            .map_or(escaped.len(), |offset| start + offset);
        if end == start || !escaped[end..].starts_with("__") {
            i += 1;
            continue;
        }
        let contents = &escaped[start..end];
        let replacement = match contents {
            "underscores" => "__",
            "dot" => ".",
            "dash" => "-",
            "slash" => "/",
            // a reserved word is only escaped when it is the whole name
            word if RESERVED.contains(&word) && end + 2 - i == escaped.len() => word,
            _ => return None,
        };
        out.push_str(&escaped[copied..i]);
        out.push_str(replacement);
        i = end + 2;
        copied = i;
    }
    out.push_str(&escaped[copied..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_upstream() {
        let cases: &[(&str, Option<&str>)] = &[
            ("metadata", Some("metadata")),
            ("namespace", Some("__namespace__")),
            ("if", Some("__if__")),
            ("foo-bar", Some("foo__dash__bar")),
            ("a.b/c", Some("a__dot__b__slash__c")),
            ("a__b", Some("a__underscores__b")),
            ("a___b", Some("a__underscores___b")),
            ("_x", Some("_x")),
            ("-x", Some("__dash__x")),
            ("1x", None),
            ("", None),
            ("a b", None),
            ("a-b$", None),
            ("ünicode", None),
        ];
        for (input, want) in cases {
            assert_eq!(escape(input).as_deref(), *want, "{input:?}");
        }
    }

    #[test]
    fn unescapes_like_upstream() {
        let cases: &[(&str, Option<&str>)] = &[
            ("foo__dash__bar", Some("foo-bar")),
            ("__namespace__", Some("namespace")),
            ("x__namespace__", None),
            ("a__underscores__b", Some("a__b")),
            ("a__dot__b__slash__c", Some("a.b/c")),
            ("__unknown__", None),
            ("plain", Some("plain")),
            ("a__", Some("a__")),
            ("a___dash__b", Some("a_-b")),
        ];
        for (input, want) in cases {
            assert_eq!(unescape(input).as_deref(), *want, "{input:?}");
        }
    }

    #[test]
    fn round_trips() {
        for name in ["a-b.c/d", "x__y", "namespace", "as", "plain_name"] {
            let escaped = escape(name).unwrap_or_default();
            assert_eq!(unescape(&escaped).as_deref(), Some(name), "{name}");
        }
    }
}
