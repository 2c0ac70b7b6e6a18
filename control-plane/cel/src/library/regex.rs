//! The `kubernetes.regex` library: `find` and `findAll` on strings (upstream
//! `library/regex.go`).
//!
//! This crate may not depend on a regex engine of its own, so both are built on the standard
//! `matches` overload, which only answers whether a pattern matches: the match is found by
//! anchoring the pattern (`^(?:re)` to find where it starts, `^(?:re)$` to find where it ends).
//! That returns the leftmost-*longest* match where Go returns the leftmost-*first* one, which
//! only differs for alternations whose earlier branch is a prefix of a later one (`a|ab`), and
//! assertions such as `\b` see the candidate substring rather than its surroundings.

use cel::common::types::{CelBool, CelString, INT_TYPE, STRING_TYPE};
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};

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

/// Whether `pattern` matches somewhere in `text`, through the standard `matches` overload.
fn is_match(text: &str, pattern: &str) -> Result<bool, ExecutionError> {
    let args = vec![
        CowVal::owned(CelString::from(text.to_string())),
        CowVal::owned(CelString::from(pattern.to_string())),
    ];
    let matches = crate::env::env()
        .find_overload("matches", &args)
        .ok_or_else(|| error("matches", "no such overload"))?;
    let result = matches(args).map_err(|e| match e {
        // upstream: `Illegal regex: <the regexp package's reason>`
        ExecutionError::FunctionError { message, .. } => error(
            "find",
            format!(
                "Illegal regex: {}",
                message.rsplit("error: ").next().unwrap_or(&message)
            ),
        ),
        other => other,
    })?;
    result
        .downcast_ref::<CelBool>()
        .map(|b| *b.inner())
        .ok_or_else(|| error("matches", "no such overload"))
}

/// The char boundaries of `text`, its end included.
fn boundaries(text: &str) -> impl DoubleEndedIterator<Item = usize> + '_ {
    text.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
}

/// The first match at or after byte `from` (leftmost start, longest end), as byte offsets.
fn find_from(
    text: &str,
    pattern: &str,
    from: usize,
) -> Result<Option<(usize, usize)>, ExecutionError> {
    let prefix = format!("^(?:{pattern})");
    let whole = format!("^(?:{pattern})$");
    for start in boundaries(text).filter(|&i| i >= from) {
        if !is_match(&text[start..], &prefix)? {
            continue;
        }
        for end in boundaries(text).rev().filter(|&j| j >= start) {
            if is_match(&text[start..end], &whole)? {
                return Ok(Some((start, end)));
            }
        }
    }
    Ok(None)
}

fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "find")?;
    let pattern = str_arg(&args, 1, "find")?;
    // one unanchored run validates the pattern and skips the search when nothing matches
    if !is_match(text, pattern)? {
        return Ok(string_val(String::new()));
    }
    let found = find_from(text, pattern, 0)?;
    Ok(string_val(
        found.map_or_else(String::new, |(s, e)| text[s..e].to_string()),
    ))
}

fn find_all_limited(text: &str, pattern: &str, limit: i64) -> Result<Vec<String>, ExecutionError> {
    let mut found = Vec::new();
    if limit == 0 || !is_match(text, pattern)? {
        return Ok(found);
    }
    let mut from = 0;
    let mut previous_end: Option<usize> = None;
    while from <= text.len() && (limit < 0 || (found.len() as i64) < limit) {
        let Some((start, end)) = find_from(text, pattern, from)? else {
            break;
        };
        // Go skips an empty match right after the previous match
        let skip = start == end && previous_end == Some(start);
        if !skip {
            found.push(text[start..end].to_string());
            previous_end = Some(end);
        }
        from = if end > start {
            end
        } else {
            // step past the empty match by one character
            text[end..]
                .chars()
                .next()
                .map_or(text.len() + 1, |c| end + c.len_utf8())
        };
    }
    Ok(found)
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "findAll")?;
    let pattern = str_arg(&args, 1, "findAll")?;
    Ok(string_list(find_all_limited(text, pattern, -1)?))
}

fn find_all_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "findAll")?;
    let pattern = str_arg(&args, 1, "findAll")?;
    let limit = int_arg(&args, 2, "findAll")?;
    Ok(string_list(find_all_limited(text, pattern, limit)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_like_go_for_ordinary_patterns() {
        let cases: &[(&str, &str, i64, &[&str])] = &[
            ("abc 123 def 456", "[0-9]+", -1, &["123", "456"]),
            ("abc 123 def 456", "[0-9]+", 1, &["123"]),
            ("abc", "[0-9]+", -1, &[]),
            ("aaa", "a*", -1, &["aaa"]),
            ("xyz", "a*", -1, &["", "", "", ""]),
            ("k=v;x=y", "[a-z]=[a-z]", -1, &["k=v", "x=y"]),
        ];
        for (text, pattern, limit, want) in cases {
            let got = find_all_limited(text, pattern, *limit).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(got, *want, "{text:?} {pattern:?}");
        }
    }

    #[test]
    fn reports_illegal_patterns() {
        let err = find_all_limited("abc", "(", -1)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("Illegal regex")));
    }
}
