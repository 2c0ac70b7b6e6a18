//! The `kubernetes.regex` library: `find` and `findAll` on strings (upstream
//! `library/regex.go`), with Go's RE2 semantics: the leftmost-first match, and `findAll`'s
//! successive non-overlapping matches that skip an empty match abutting the previous one.
//!
//! Rust's `regex` is an RE2 dialect too; where the two differ, patterns are rewritten: Go's
//! `\d`, `\w`, `\s` and `\b` are ASCII-only, Rust's Unicode-aware, and `\Q...\E` quoting is
//! Go-only.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use cel::common::types::{INT_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};
use regex::Regex;

use super::{error, int_arg, member, str_arg, string_list, string_val};

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    member(env, "find", &STRING_TYPE, &[&STRING_TYPE], find)?;
    member(env, "findAll", &STRING_TYPE, &[&STRING_TYPE], find_all)?;
    member(
        env,
        "findAll",
        &STRING_TYPE,
        &[&STRING_TYPE, &INT_TYPE],
        find_all_n,
    )?;
    Ok(())
}

/// Rewrites a Go pattern into the Rust pattern that matches the same strings.
fn translate(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars().peekable();
    // inside `[...]` a class escape is nested as a class of its own, which Rust accepts
    let mut in_class = false;
    while let Some(c) = chars.next() {
        if c != '\\' {
            match c {
                '[' if !in_class => {
                    in_class = true;
                    out.push(c);
                    // a `]` or `^]` right after the opening bracket is a literal
                    if chars.peek() == Some(&'^') {
                        out.push('^');
                        chars.next();
                    }
                    if chars.peek() == Some(&']') {
                        out.push_str("\\]");
                        chars.next();
                    }
                }
                ']' if in_class => {
                    in_class = false;
                    out.push(c);
                }
                _ => out.push(c),
            }
            continue;
        }
        let Some(next) = chars.next() else {
            // a trailing backslash: left for the parser to reject
            out.push('\\');
            break;
        };
        let ascii = match next {
            'd' => Some("[0-9]"),
            'D' => Some("[^0-9]"),
            'w' => Some("[0-9A-Za-z_]"),
            'W' => Some("[^0-9A-Za-z_]"),
            's' => Some("[\\t\\n\\f\\r ]"),
            'S' => Some("[^\\t\\n\\f\\r ]"),
            'b' if !in_class => Some("(?-u:\\b)"),
            'B' if !in_class => Some("(?-u:\\B)"),
            _ => None,
        };
        if let Some(ascii) = ascii {
            out.push_str(ascii);
        } else if next == 'Q' {
            let mut literal = String::new();
            while let Some(q) = chars.next() {
                if q == '\\' && chars.peek() == Some(&'E') {
                    chars.next();
                    break;
                }
                literal.push(q);
            }
            out.push_str(&regex::escape(&literal));
        } else {
            out.push('\\');
            out.push(next);
        }
    }
    out
}

/// Go's `regexp.Compile` error text for the common mistakes, else the Rust parser's reason.
fn go_error(pattern: &str, error: &regex::Error) -> String {
    let text = error.to_string();
    let reason = text.rsplit("error: ").next().unwrap_or(&text).trim();
    let (code, expr) = match reason {
        "unclosed group" => ("missing closing )", pattern),
        "unopened group" => ("unexpected )", pattern),
        "unclosed character class" => (
            "missing closing ]",
            pattern.rfind('[').map_or(pattern, |i| &pattern[i..]),
        ),
        "repetition operator missing expression" => {
            ("missing argument to repetition operator", pattern)
        }
        other => (other, pattern),
    };
    format!("error parsing regexp: {code}: `{expr}`")
}

/// Compiled patterns by source: expressions run `find` in loops with a handful of literal
/// patterns, which upstream compiles once per program.
static CACHE: LazyLock<Mutex<HashMap<String, Arc<Regex>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
const CACHE_LIMIT: usize = 256;

fn compile(pattern: &str, function: &str) -> Result<Arc<Regex>, ExecutionError> {
    if let Ok(cache) = CACHE.lock()
        && let Some(re) = cache.get(pattern)
    {
        return Ok(re.clone());
    }
    let re = Regex::new(&translate(pattern)).map(Arc::new).map_err(|e| {
        error(
            function,
            format!("Illegal regex: {}", go_error(pattern, &e)),
        )
    })?;
    if let Ok(mut cache) = CACHE.lock() {
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
        cache.insert(pattern.to_string(), re.clone());
    }
    Ok(re)
}

/// Go's `FindAllString(text, n)`: `n < 0` for all matches.
fn find_all_limited(text: &str, re: &Regex, limit: i64) -> Vec<String> {
    let mut found = Vec::new();
    let mut pos = 0;
    let mut previous_end: Option<usize> = None;
    while pos <= text.len() && (limit < 0 || (found.len() as i64) < limit) {
        let Some(m) = re.find_at(text, pos) else {
            break;
        };
        let mut accept = true;
        if m.end() == m.start() {
            // Go drops an empty match right after the previous match, then steps one character
            if previous_end == Some(m.start()) {
                accept = false;
            }
            pos = text[m.end()..]
                .chars()
                .next()
                .map_or(text.len() + 1, |c| m.end() + c.len_utf8());
        } else {
            pos = m.end();
        }
        previous_end = Some(m.end());
        if accept {
            found.push(m.as_str().to_string());
        }
    }
    found
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "find")?;
    let re = compile(str_arg(&args, 1, "find")?, "find")?;
    Ok(string_val(
        re.find(text)
            .map_or_else(String::new, |m| m.as_str().to_string()),
    ))
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "findAll")?;
    let re = compile(str_arg(&args, 1, "findAll")?, "findAll")?;
    Ok(string_list(find_all_limited(text, &re, -1)))
}

fn find_all_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "findAll")?;
    let re = compile(str_arg(&args, 1, "findAll")?, "findAll")?;
    let limit = int_arg(&args, 2, "findAll")?;
    Ok(string_list(find_all_limited(text, &re, limit)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(text: &str, pattern: &str, limit: i64) -> Vec<String> {
        let re = compile(pattern, "findAll").unwrap_or_else(|e| panic!("{e}"));
        find_all_limited(text, &re, limit)
    }

    #[test]
    fn finds_like_go() {
        // (text, pattern, limit, Go's FindAllString)
        let cases: &[(&str, &str, i64, &[&str])] = &[
            ("abc 123 def 456", "[0-9]+", -1, &["123", "456"]),
            ("abc 123 def 456", "[0-9]+", 1, &["123"]),
            ("abc 123 def 456", "[0-9]+", 0, &[]),
            ("abc", "[0-9]+", -1, &[]),
            ("aaa", "a*", -1, &["aaa"]),
            ("xyz", "a*", -1, &["", "", "", ""]),
            ("baaab", "a*", -1, &["", "aaa", ""]),
            ("k=v;x=y", "[a-z]=[a-z]", -1, &["k=v", "x=y"]),
            // leftmost-first: the earlier alternative wins, as in Go
            ("ab", "a|ab", -1, &["a"]),
            ("foobar", "\\bbar", -1, &[]),
            ("foo bar", "\\bbar", -1, &["bar"]),
            // ASCII classes: Go's \d does not match other scripts' digits
            ("١٢3", "\\d+", -1, &["3"]),
            ("é_a", "\\w+", -1, &["_a"]),
            ("a.b*c", "\\Q.b*\\E", -1, &[".b*"]),
            ("x]y", "[]]", -1, &["]"]),
            ("a1b", "[^\\d]", -1, &["a", "b"]),
        ];
        for (text, pattern, limit, want) in cases {
            assert_eq!(all(text, pattern, *limit), *want, "{text:?} {pattern:?}");
        }
        let first =
            compile("a|ab", "find").map(|re| re.find("xab").map(|m| m.as_str().to_string()));
        assert_eq!(first.ok().flatten().as_deref(), Some("a"));
    }

    #[test]
    fn reports_illegal_patterns_like_go() {
        let cases = [
            (
                "(",
                "Illegal regex: error parsing regexp: missing closing ): `(`",
            ),
            (
                "a)",
                "Illegal regex: error parsing regexp: unexpected ): `a)`",
            ),
            (
                "x[a-",
                "Illegal regex: error parsing regexp: missing closing ]: `[a-`",
            ),
            (
                "*",
                "Illegal regex: error parsing regexp: missing argument to repetition operator: `*`",
            ),
        ];
        for (pattern, want) in cases {
            let got = compile(pattern, "find")
                .err()
                .map(|e| crate::validation::runtime_message(&e));
            assert_eq!(got.as_deref(), Some(want), "{pattern}");
        }
    }
}
