//! The `kubernetes.urls` library: `url()`, `isURL()` and the `URL` getters (upstream
//! `library/urls.go`), over a port of the parts of Go's `net/url` they rely on
//! (`ParseRequestURI` to accept, `Parse` to split, `EscapedPath`, `Query`).

use std::collections::HashMap;

use cel::common::types::{CelList, CelMapKey, CelString, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use flotilla_api_machinery::field::go_quote;

use super::{arg, bool_val, error, global, member, opaque_value, str_arg, string_val};

/// A parsed URL (Go's `url.URL`, the fields the getters read).
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Url {
    scheme: String,
    opaque: String,
    user: Option<String>,
    host: String,
    path: String,
    raw_path: String,
    force_query: bool,
    raw_query: String,
    fragment: String,
}

opaque_value!(Url, URL_TYPE, "kubernetes.URL");

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(URL_TYPE.to_owned())?;
    global(env, "url", &[&STRING_TYPE], to_url)?;
    global(env, "isURL", &[&STRING_TYPE], is_url)?;
    member(env, "getScheme", &URL_TYPE, &[], |args| {
        Ok(string_val(
            arg::<Url>(&args, 0, "getScheme")?.scheme.clone(),
        ))
    })?;
    member(env, "getHost", &URL_TYPE, &[], |args| {
        Ok(string_val(arg::<Url>(&args, 0, "getHost")?.host.clone()))
    })?;
    member(env, "getHostname", &URL_TYPE, &[], |args| {
        let url = arg::<Url>(&args, 0, "getHostname")?;
        Ok(string_val(split_host_port(&url.host).0.to_string()))
    })?;
    member(env, "getPort", &URL_TYPE, &[], |args| {
        let url = arg::<Url>(&args, 0, "getPort")?;
        Ok(string_val(split_host_port(&url.host).1.to_string()))
    })?;
    member(env, "getEscapedPath", &URL_TYPE, &[], |args| {
        Ok(string_val(
            arg::<Url>(&args, 0, "getEscapedPath")?.escaped_path(),
        ))
    })?;
    member(env, "getQuery", &URL_TYPE, &[], get_query)?;
    Ok(())
}

fn to_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "url")?;
    let parsed = parse_request_uri(text).and_then(|_| parse(text));
    match parsed {
        Ok(url) => Ok(CowVal::owned(url)),
        Err(e) => Err(error(
            "url",
            format!("URL parse error during conversion from string: {e}"),
        )),
    }
}

fn is_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let text = str_arg(&args, 0, "isURL")?;
    Ok(bool_val(parse_request_uri(text).is_ok()))
}

fn get_query<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let url = arg::<Url>(&args, 0, "getQuery")?;
    let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
    for (key, value) in parse_query(&url.raw_query) {
        match grouped.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => grouped.push((key, vec![value])),
        }
    }
    let map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = grouped
        .into_iter()
        .map(|(key, values)| {
            let values: Vec<Box<dyn Val + 'v>> = values
                .into_iter()
                .map(|v| Box::new(CelString::from(v)) as Box<dyn Val + 'v>)
                .collect();
            (
                CelMapKey::from(key),
                Box::new(CelList::from(values)) as Box<dyn Val + 'v>,
            )
        })
        .collect();
    Ok(CowVal::owned(cel::common::types::CelMap::from(map)))
}

/// Go's `url.ParseRequestURI`: an absolute URI or an absolute path, no fragment split off.
pub(crate) fn parse_request_uri(raw: &str) -> Result<Url, String> {
    parse_url(raw, true).map_err(|e| format!("parse {}: {e}", go_quote(raw)))
}

/// Go's `url.Parse`: the fragment is split off first.
fn parse(raw: &str) -> Result<Url, String> {
    let (rest, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    let mut url = parse_url(rest, false).map_err(|e| format!("parse {}: {e}", go_quote(raw)))?;
    url.fragment =
        unescape(fragment, Mode::Fragment).map_err(|e| format!("parse {}: {e}", go_quote(raw)))?;
    Ok(url)
}

fn parse_url(raw: &str, via_request: bool) -> Result<Url, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".to_string());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".to_string());
    }
    let mut url = Url::default();
    if raw == "*" {
        url.path = "*".to_string();
        return Ok(url);
    }
    let (scheme, rest) = get_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    let mut rest = rest.to_string();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        url.force_query = true;
        rest.pop();
    } else if let Some((before, query)) = rest.clone().split_once('?') {
        url.raw_query = query.to_string();
        rest = before.to_string();
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            // `mailto:x@y` and the like keep their opaque part as written
            url.opaque = rest;
            return Ok(url);
        }
        if via_request {
            return Err("invalid URI for request".to_string());
        }
        let segment = rest.split('/').next().unwrap_or_default();
        if segment.contains(':') {
            return Err("first path segment in URL cannot contain colon".to_string());
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///"))
        && rest.starts_with("//")
    {
        let after = &rest[2..];
        let (authority, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, ""),
        };
        let (user, host) = parse_authority(authority)?;
        url.user = user;
        url.host = host;
        rest = path.to_string();
    }
    url.path = unescape(&rest, Mode::Path)?;
    if escape(&url.path, Mode::Path) != rest {
        url.raw_path = rest;
    }
    Ok(url)
}

fn get_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i == 0 => return Ok(("", raw)),
            b'0'..=b'9' | b'+' | b'-' | b'.' => {}
            b':' if i == 0 => return Err("missing protocol scheme".to_string()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_authority(authority: &str) -> Result<(Option<String>, String), String> {
    let (user, host) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let host = parse_host(host)?;
    let user = match user {
        None => None,
        Some(info) => {
            let valid = info.chars().all(|c| {
                c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c) || !c.is_ascii()
            });
            if !valid {
                return Err("net/url: invalid userinfo".to_string());
            }
            Some(unescape(info, Mode::UserPassword)?)
        }
    };
    Ok((user, host))
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

fn parse_host(host: &str) -> Result<String, String> {
    if host.starts_with('[') {
        let Some(close) = host.rfind(']') else {
            return Err("missing ']' in host".to_string());
        };
        let port = &host[close + 1..];
        if !valid_optional_port(port) {
            return Err(format!("invalid port {} after host", go_quote(port)));
        }
    } else if let Some(colon) = host.rfind(':') {
        let port = &host[colon..];
        if !valid_optional_port(port) {
            return Err(format!("invalid port {} after host", go_quote(port)));
        }
    }
    unescape(host, Mode::Host)
}

/// Go's `url.splitHostPort`: the host without brackets, and the port.
fn split_host_port(host_port: &str) -> (&str, &str) {
    let (mut host, mut port) = (host_port, "");
    if let Some(colon) = host_port.rfind(':')
        && valid_optional_port(&host_port[colon..])
    {
        host = &host_port[..colon];
        port = &host_port[colon + 1..];
    }
    if host.len() >= 2 && host.starts_with('[') && host.ends_with(']') {
        host = &host[1..host.len() - 1];
    }
    (host, port)
}

/// Go's `parseQuery`, dropping the pairs it reports errors for, as `URL.Query()` does.
fn parse_query(query: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for part in query.split('&') {
        if part.is_empty() || part.contains(';') {
            continue;
        }
        let (key, value) = part.split_once('=').unwrap_or((part, ""));
        if let (Ok(key), Ok(value)) = (
            unescape(key, Mode::QueryComponent),
            unescape(value, Mode::QueryComponent),
        ) {
            pairs.push((key, value));
        }
    }
    pairs
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Path,
    Host,
    UserPassword,
    QueryComponent,
    Fragment,
}

/// Go's `shouldEscape` for the modes used here.
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b'~') {
        return false;
    }
    if mode == Mode::Host
        && matches!(
            c,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b'"'
        )
    {
        return false;
    }
    match c {
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => c == b'?',
            Mode::UserPassword => matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::QueryComponent => true,
            Mode::Fragment | Mode::Host => false,
        },
        _ => !(mode == Mode::Fragment && matches!(c, b'!' | b'(' | b')' | b'*')),
    }
}

/// Go's `unescape`: percent-decoding with the checks of `mode`.
fn unescape(s: &str, mode: Mode) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
                let (Some(hi), Some(lo)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) else {
                    let bad: String = s[i..].chars().take(3).collect();
                    return Err(format!("invalid URL escape {}", go_quote(&bad)));
                };
                if mode == Mode::Host && hi < 8 && &s[i..i + 3] != "%25" {
                    return Err(format!("invalid URL escape {}", go_quote(&s[i..i + 3])));
                }
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            c => {
                if mode == Mode::Host && c < 0x80 && should_escape(c, mode) {
                    return Err(format!(
                        "invalid character {} in host name",
                        go_quote(&(c as char).to_string())
                    ));
                }
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn escape(s: &str, mode: Mode) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if should_escape(b, mode) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
    out
}

impl Url {
    /// Go's `URL.EscapedPath`: the path as written when that is a valid encoding of it.
    fn escaped_path(&self) -> String {
        if !self.raw_path.is_empty()
            && valid_encoded_path(&self.raw_path)
            && unescape(&self.raw_path, Mode::Path).is_ok_and(|p| p == self.path)
        {
            return self.raw_path.clone();
        }
        if self.path == "*" {
            return "*".to_string();
        }
        escape(&self.path, Mode::Path)
    }
}

fn valid_encoded_path(s: &str) -> bool {
    s.bytes().all(|b| {
        matches!(
            b,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'['
                | b']'
                | b'%'
        ) || !should_escape(b, Mode::Path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_what_parse_request_uri_accepts() {
        for ok in [
            "https://kubernetes.io",
            "https://user:pass@example.com:80/path?query=val#fragment",
            "/absolute-path",
            "https://[::1]:80/path",
            "mailto:someone@example.com",
            "*",
        ] {
            assert!(parse_request_uri(ok).is_ok(), "{ok}");
        }
        for (bad, message) in [
            ("", "parse \"\": empty url"),
            (
                "../relative-path",
                "parse \"../relative-path\": invalid URI for request",
            ),
            ("://x", "parse \"://x\": missing protocol scheme"),
            (
                "https://a b",
                "parse \"https://a b\": invalid character \" \" in host name",
            ),
            (
                "http://x:port",
                "parse \"http://x:port\": invalid port \":port\" after host",
            ),
            ("http://[::1", "parse \"http://[::1\": missing ']' in host"),
            ("/a%zz", "parse \"/a%zz\": invalid URL escape \"%zz\""),
        ] {
            assert_eq!(
                parse_request_uri(bad).err().as_deref(),
                Some(message),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn splits_like_go() {
        let url = parse("https://user@example.com:8080/a%20b/c?k=v1&k=v2&x=%41#frag")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url.scheme, "https");
        assert_eq!(url.host, "example.com:8080");
        assert_eq!(split_host_port(&url.host), ("example.com", "8080"));
        assert_eq!(url.path, "/a b/c");
        assert_eq!(url.escaped_path(), "/a%20b/c");
        assert_eq!(url.fragment, "frag");
        assert_eq!(
            parse_query(&url.raw_query),
            [("k", "v1"), ("k", "v2"), ("x", "A")].map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let ipv6 = parse("https://[::1]:80/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(split_host_port(&ipv6.host), ("::1", "80"));
        let no_port = parse("https://[::1]/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(split_host_port(&no_port.host), ("::1", ""));
        let spaced = parse("/with space").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(spaced.escaped_path(), "/with%20space");
    }
}
