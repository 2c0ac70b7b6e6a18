//! Compiles `pattern` values written in Go's RE2 syntax with the `regex` crate, keeping Go's
//! meaning where the two dialects differ and phrasing compile errors like Go's
//! `regexp.Compile`.
//!
//! The differences that matter for CRD patterns: Go's `\d`, `\w`, `\s` and `\b` are ASCII
//! only (Rust's are Unicode), Go treats `[` inside a character class as a literal (Rust opens a
//! nested class) and has no class set operators (`&&`, `~~`), and Go knows `\Q...\E`.

use regex::{Regex, RegexBuilder};

/// Go's ASCII-only Perl classes, spelled so they also work nested inside a Rust class.
fn perl_class(c: char) -> Option<&'static str> {
    Some(match c {
        'd' => "[0-9]",
        'D' => "[^0-9]",
        'w' => "[0-9A-Za-z_]",
        'W' => "[^0-9A-Za-z_]",
        's' => r"[\t\n\f\r ]",
        'S' => r"[^\t\n\f\r ]",
        _ => return None,
    })
}

/// Rewrites a Go pattern into an equivalent `regex` crate pattern.
fn translate(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut in_class = false;
    // Position right after `[` or `[^`, where `]` is a literal in both dialects.
    let mut class_start = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at_class_start = std::mem::replace(&mut class_start, false);
        if c == '\\' {
            let Some(&next) = chars.get(i + 1) else {
                // Let the regex crate report the trailing backslash.
                out.push(c);
                break;
            };
            if next == 'Q' {
                let rest: String = chars[i + 2..].iter().collect();
                let (literal, terminated) = match rest.find(r"\E") {
                    Some(end) => (&rest[..end], true),
                    None => (rest.as_str(), false),
                };
                out.push_str(&regex::escape(literal));
                i += 2 + literal.chars().count() + if terminated { 2 } else { 0 };
                continue;
            }
            if let Some(class) = perl_class(next) {
                out.push_str(class);
            } else if !in_class && (next == 'b' || next == 'B') {
                out.push_str(&format!("(?-u:\\{next})"));
            } else {
                out.push(c);
                out.push(next);
            }
            i += 2;
            continue;
        }
        if in_class {
            match c {
                '[' if chars.get(i + 1) == Some(&':') => {
                    // A POSIX class like `[:alpha:]` means the same in both dialects.
                    let rest: String = chars[i..].iter().collect();
                    let len = rest.find(":]").map_or(1, |end| end + 2);
                    out.push_str(&rest[..len]);
                    i += rest[..len].chars().count();
                    continue;
                }
                '[' | '&' | '~' => {
                    out.push('\\');
                    out.push(c);
                }
                ']' if !at_class_start => {
                    in_class = false;
                    out.push(c);
                }
                '-' if chars.get(i + 1) == Some(&'-') => out.push_str(r"\-"),
                _ => out.push(c),
            }
            i += 1;
            continue;
        }
        if c == '[' {
            in_class = true;
            out.push(c);
            if chars.get(i + 1) == Some(&'^') {
                out.push('^');
                i += 1;
            }
            class_start = true;
        } else {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// Maps the regex crate's description of a syntax error onto Go's `regexp/syntax` error code.
fn go_error_code(rust_message: &str) -> String {
    let detail = rust_message
        .lines()
        .find_map(|line| line.trim().strip_prefix("error: "))
        .unwrap_or(rust_message)
        .trim();
    let code = match detail {
        "unclosed character class" => "missing closing ]",
        "unclosed group" => "missing closing )",
        "unopened group" => "unexpected )",
        "repetition operator missing expression" => "missing argument to repetition operator",
        "invalid character class range, the start must be <= the end" => {
            "invalid character class range"
        }
        "unrecognized escape sequence" => "invalid escape sequence",
        "incomplete escape sequence, reached end of pattern prematurely" => {
            "trailing backslash at end of expression"
        }
        "unrecognized flag" | "expected flag but got end of regex" => {
            "invalid or unsupported Perl syntax"
        }
        "empty capture group name" | "invalid capture group character" => "invalid named capture",
        other if other.contains("exceeds size limit") => "expression too large",
        other if other.contains("nest") => "expression nests too deeply",
        other => other,
    };
    code.to_string()
}

/// Compiles a Go regular expression. The error reads like Go's
/// (`error parsing regexp: missing closing ]: `[a``), quoting the whole pattern where Go quotes
/// the offending fragment.
pub(crate) fn compile(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(&translate(pattern))
        // Go reads `\012` as an octal escape.
        .octal(true)
        .build()
        .map_err(|err| match err {
            regex::Error::Syntax(message) => format!(
                "error parsing regexp: {}: `{pattern}`",
                go_error_code(&message)
            ),
            regex::Error::CompiledTooBig(_) => {
                format!("error parsing regexp: expression too large: `{pattern}`")
            }
            other => format!("error parsing regexp: {other}: `{pattern}`"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_like_go() {
        let cases = [
            (r"^\d+$", "123", true),
            // Go's \d is ASCII only.
            (r"^\d+$", "١٢٣", false),
            (r"^\w+$", "é", false),
            (r"^[\w-]+$", "a-b_c", true),
            (r"^[a[]+$", "a[a", true),
            (r"^[a&&b]+$", "&", true),
            (r"^[]a]+$", "]a", true),
            (r"^[^]a]+$", "b", true),
            (r"^[[:alpha:]]+$", "abc", true),
            (r"\Qa.b\E", "a.b", true),
            (r"\Qa.b\E", "axb", false),
            (r"\bfoo\b", "a foo b", true),
            (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "my-name", true),
            (r"^(\*\.)?[a-z]+$", "*.x", true),
            (r"^\S+\s\S+$", "a b", true),
        ];
        for (pattern, input, want) in cases {
            let re = compile(pattern).unwrap_or_else(|e| panic!("{pattern}: {e}"));
            assert_eq!(re.is_match(input), want, "{pattern} on {input:?}");
        }
    }

    #[test]
    fn errors_read_like_go() {
        let cases = [
            ("[a", "error parsing regexp: missing closing ]: `[a`"),
            ("(a", "error parsing regexp: missing closing ): `(a`"),
            ("a)", "error parsing regexp: unexpected ): `a)`"),
            (
                "*a",
                "error parsing regexp: missing argument to repetition operator: `*a`",
            ),
        ];
        for (pattern, want) in cases {
            assert_eq!(compile(pattern).err().as_deref(), Some(want), "{pattern}");
        }
    }
}
