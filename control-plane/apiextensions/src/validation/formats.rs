//! The string formats CRD schemas may use and how each is checked (upstream apiextensions
//! `validation/formats.go` for which formats count, kube-openapi `strfmt` and its `govalidator`
//! copy for the checks). Formats are compared by name with dashes removed (`date-time` is
//! `datetime`), as go-openapi normalizes them.

use std::net::Ipv6Addr;
use std::sync::LazyLock;

use regex::Regex;

use crate::goregex;

/// The formats validated at Kubernetes 1.33 compatibility (`k8s-short-name` and
/// `k8s-long-name` arrive with 1.34 and are ignored until then).
const SUPPORTED: &[&str] = &[
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// Whether a string `format` is validated (after go-openapi's dash-removing normalization).
pub(crate) fn is_supported(format: &str) -> bool {
    SUPPORTED.contains(&format.replace('-', "").as_str())
}

fn go_regex(pattern: &str) -> Option<Regex> {
    goregex::compile(pattern).ok()
}

macro_rules! go_regex {
    ($name:ident, $pattern:expr) => {
        static $name: LazyLock<Option<Regex>> = LazyLock::new(|| go_regex($pattern));
    };
}

go_regex!(
    HOSTNAME,
    r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$"
);
go_regex!(
    UUID,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"
);
go_regex!(
    UUID3,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"
);
go_regex!(
    UUID4,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"
);
go_regex!(
    UUID5,
    r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"
);
go_regex!(
    CREDIT_CARD,
    r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11})$"
);
go_regex!(HEX_COLOR, r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$");
go_regex!(
    RGB_COLOR,
    r"^rgb\(\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*,\s*(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])\s*\)$"
);
go_regex!(
    BASE64,
    r"^(?:[A-Za-z0-9+\/]{4})*(?:[A-Za-z0-9+\/]{2}==|[A-Za-z0-9+\/]{3}=|[A-Za-z0-9+\/]{4})$"
);
go_regex!(SSN, r"^\d{3}[- ]?\d{2}[- ]?\d{4}$");
go_regex!(
    DATE_TIME_TAIL,
    r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$"
);
go_regex!(DURATION_PART, r"((\d+)\s*([A-Za-zµ]+))");

fn matches(re: &LazyLock<Option<Regex>>, s: &str) -> bool {
    re.as_ref().is_some_and(|re| re.is_match(s))
}

/// Whether `value` satisfies the supported string format `format`.
pub(crate) fn validates(format: &str, value: &str) -> bool {
    match format.replace('-', "").as_str() {
        "bsonobjectid" => value.len() == 24 && value.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => is_request_uri(value),
        "email" => is_email(value),
        "hostname" => is_hostname(value),
        "ipv4" => parse_ip_sloppy(value).is_some() && value.contains('.'),
        "ipv6" => value.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(value),
        "mac" => is_mac(value),
        "uuid" => matches(&UUID, value),
        "uuid3" => matches(&UUID3, value),
        "uuid4" => matches(&UUID4, value),
        "uuid5" => matches(&UUID5, value),
        "isbn" => is_isbn10(value) || is_isbn13(value),
        "isbn10" => is_isbn10(value),
        "isbn13" => is_isbn13(value),
        "creditcard" => is_credit_card(value),
        "ssn" => value.len() == 11 && matches(&SSN, value),
        "hexcolor" => matches(&HEX_COLOR, value),
        "rgbcolor" => matches(&RGB_COLOR, value),
        "byte" => matches(&BASE64, value),
        "date" => is_date(value),
        "duration" => is_duration(value),
        "datetime" => is_date_time(value),
        // "password" and anything unknown accept every string.
        _ => true,
    }
}

fn is_hostname(s: &str) -> bool {
    matches(&HOSTNAME, s) && s.len() <= 255 && s.split('.').all(|label| label.len() <= 63)
}

/// `netutils.ParseIPSloppy`: IPv4 octets may carry leading zeros.
fn parse_ip_sloppy(s: &str) -> Option<()> {
    if s.contains(':') {
        return s.parse::<Ipv6Addr>().ok().map(|_| ());
    }
    let parts: Vec<&str> = s.split('.').collect();
    let octet_ok = |p: &&str| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| n <= 255)
    };
    (parts.len() == 4 && parts.iter().all(octet_ok)).then_some(())
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, prefix)) = s.split_once('/') else {
        return false;
    };
    let bits = if ip.contains(':') { 128 } else { 32 };
    parse_ip_sloppy(ip).is_some()
        && !prefix.is_empty()
        && prefix.bytes().all(|b| b.is_ascii_digit())
        && prefix.parse::<u32>().is_ok_and(|n| n <= bits)
}

/// `net.ParseMAC`: 6, 8 or 20 octets as `xx:xx`, `xx-xx` or `xxxx.xxxx`.
fn is_mac(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() < 14 {
        return false;
    }
    let hex_groups = |sep: u8, width: usize| {
        let groups: Vec<&[u8]> = b.split(|&c| c == sep).collect();
        let octets = groups.len() * width / 2;
        matches!(octets, 6 | 8 | 20)
            && groups
                .iter()
                .all(|g| g.len() == width && g.iter().all(u8::is_ascii_hexdigit))
    };
    match (b[2], b[4]) {
        (sep @ (b':' | b'-'), _) => hex_groups(sep, 2),
        (_, b'.') => hex_groups(b'.', 4),
        _ => false,
    }
}

fn sanitize_isbn(s: &str) -> Vec<u8> {
    // Go's `[\s-]+`: ASCII whitespace and dashes.
    s.bytes()
        .filter(|b| !matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ' | b'-'))
        .collect()
}

fn is_isbn10(s: &str) -> bool {
    let d = sanitize_isbn(s);
    let shape = d.len() == 10
        && d[..9].iter().all(u8::is_ascii_digit)
        && (d[9].is_ascii_digit() || d[9] == b'X');
    if !shape {
        return false;
    }
    let mut sum: u32 = (0..9)
        .map(|i| (i as u32 + 1) * u32::from(d[i] - b'0'))
        .sum();
    sum += 10
        * if d[9] == b'X' {
            10
        } else {
            u32::from(d[9] - b'0')
        };
    sum.is_multiple_of(11)
}

fn is_isbn13(s: &str) -> bool {
    let d = sanitize_isbn(s);
    if d.len() != 13 || !d.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let sum: u32 = (0..12)
        .map(|i| if i % 2 == 0 { 1 } else { 3 } * u32::from(d[i] - b'0'))
        .sum();
    u32::from(d[12] - b'0') == (10 - sum % 10) % 10
}

fn is_credit_card(s: &str) -> bool {
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    if !matches(&CREDIT_CARD, &digits) {
        return false;
    }
    // Luhn checksum, from the rightmost digit.
    let sum: u32 = digits
        .bytes()
        .rev()
        .enumerate()
        .map(|(i, b)| {
            let d = u32::from(b - b'0');
            match (i % 2 == 1, d * 2) {
                (false, _) => d,
                (true, doubled) if doubled >= 10 => doubled % 10 + 1,
                (true, doubled) => doubled,
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// `time.Parse("2006-01-02", s)`: exact widths and a day that exists in that month.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let number = |r: std::ops::Range<usize>| {
        b[r.clone()]
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| s[r].parse::<u32>().ok())
            .flatten()
    };
    let (Some(year), Some(month), Some(day)) = (number(0..4), number(5..7), number(8..10)) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// strfmt `IsDateTime`: a date, a `t`, and a time with a `z` or numeric offset.
fn is_date_time(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    let Some(caps) = DATE_TIME_TAIL.as_ref().and_then(|re| re.captures(parts[1])) else {
        return false;
    };
    let field = |i| caps.get(i).map_or("", |m| m.as_str());
    field(1) <= "23" && field(2) <= "59" && field(3) <= "59"
}

/// Go's `time.ParseDuration`.
fn is_go_duration(s: &str) -> bool {
    let rest = s.strip_prefix(['-', '+']).unwrap_or(s);
    if rest == "0" {
        return true;
    }
    if rest.is_empty() {
        return false;
    }
    let mut rest = rest;
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(tail) => {
                let n = tail.bytes().take_while(u8::is_ascii_digit).count();
                tail.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return false;
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let nanos = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return false,
        };
        let number: f64 = format!("{}.{}0", if int.is_empty() { "0" } else { int }, frac)
            .parse()
            .unwrap_or(f64::INFINITY);
        total += number * nanos;
        // Go rejects anything beyond an int64 of nanoseconds.
        if total > 9.223_372_036_854_775e18 {
            return false;
        }
        rest = after;
    }
    true
}

/// strfmt `ParseDuration`: Go's syntax, or else any `<digits> <unit word>` pair it recognizes
/// (`3 days`, `1 week`).
fn is_duration(s: &str) -> bool {
    if is_go_duration(s) {
        return true;
    }
    const UNITS: &[&[&str]] = &[
        &["ns", "nano"],
        &["us", "µs", "micro"],
        &["ms", "milli"],
        &["s", "sec"],
        &["m", "min"],
        &["h", "hr", "hour"],
        &["d", "day"],
        &["w", "wk", "week"],
    ];
    let Some(re) = DURATION_PART.as_ref() else {
        return false;
    };
    let mut ok = false;
    for caps in re.captures_iter(s) {
        let digits = caps.get(2).map_or("", |m| m.as_str());
        if digits.parse::<i64>().is_err() {
            // strconv.Atoi overflow aborts the whole parse.
            return false;
        }
        let unit = caps.get(3).map_or("", |m| m.as_str()).trim().to_lowercase();
        for variants in UNITS {
            let last = variants.len() - 1;
            for (i, variant) in variants.iter().enumerate() {
                if (i == last && unit.starts_with(variant)) || unit == *variant {
                    ok = true;
                }
            }
        }
    }
    ok
}

/// `url.ParseRequestURI`: an absolute URI, or an absolute path.
fn is_request_uri(s: &str) -> bool {
    if s.is_empty() || s.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return false;
    }
    if s == "*" {
        return true;
    }
    let (scheme, rest) = match split_scheme(s) {
        Ok(split) => split,
        Err(()) => return false,
    };
    let rest = rest.split_once('?').map_or(rest, |(path, _)| path);
    if !rest.starts_with('/') {
        // An opaque URI like `mailto:x` needs a scheme.
        return !scheme.is_empty();
    }
    let path = if !scheme.is_empty() && rest.starts_with("//") {
        let authority_and_path = &rest[2..];
        let end = authority_and_path
            .find('/')
            .unwrap_or(authority_and_path.len());
        if !valid_authority(&authority_and_path[..end]) {
            return false;
        }
        &authority_and_path[end..]
    } else {
        rest
    };
    valid_escapes(path)
}

/// Go's `getScheme`: `Err` for a leading colon, an empty scheme when there is none.
fn split_scheme(s: &str) -> Result<(&str, &str), ()> {
    for (i, c) in s.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err(()),
            ':' => return Ok((&s[..i], &s[i + 1..])),
            _ => return Ok(("", s)),
        }
    }
    Ok(("", s))
}

fn valid_escapes(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
            {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

fn valid_authority(authority: &str) -> bool {
    let (userinfo, host) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let userinfo_ok = userinfo.is_none_or(|u| {
        u.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c))
    });
    userinfo_ok && valid_host(host)
}

fn valid_host(host: &str) -> bool {
    if let Some(bracketed) = host.strip_prefix('[') {
        let Some(end) = bracketed.find(']') else {
            return false;
        };
        let port = &bracketed[end + 1..];
        return valid_optional_port(port);
    }
    let (name, port) = match host.rfind(':') {
        Some(colon) => (&host[..colon], &host[colon..]),
        None => (host, ""),
    };
    valid_optional_port(port)
        && valid_escapes(name)
        && name.chars().all(|c| {
            c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=%\"<>[]:".contains(c) || !c.is_ascii()
        })
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

fn is_atext(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~".contains(c) || !c.is_ascii()
}

/// A dot-atom: atext runs joined by single dots.
fn is_dot_atom(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|part| !part.is_empty() && part.chars().all(is_atext))
}

fn is_quoted_string(s: &str) -> bool {
    let Some(inner) = s.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.next().is_none() => return false,
            '"' => return false,
            _ => {}
        }
    }
    true
}

fn is_addr_spec(s: &str) -> bool {
    let Some(at) = s.rfind('@') else { return false };
    let (local, domain) = (&s[..at], &s[at + 1..]);
    let local_ok = is_dot_atom(local) || is_quoted_string(local);
    let domain_ok = is_dot_atom(domain)
        || (domain.starts_with('[') && domain.ends_with(']') && domain.len() > 2);
    local_ok && domain_ok
}

/// A display name: atoms (dots allowed, as Go is lenient) and quoted strings, separated by
/// whitespace; empty is fine.
fn is_phrase(s: &str) -> bool {
    let mut chars = s.trim().chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '"' {
            chars.next();
            loop {
                match chars.next() {
                    None => return false,
                    Some('"') => break,
                    Some('\\') => {
                        if chars.next().is_none() {
                            return false;
                        }
                    }
                    Some(_) => {}
                }
            }
        } else if is_atext(c) || c == '.' {
            chars.next();
        } else {
            return false;
        }
    }
    true
}

/// `net/mail.ParseAddress`: `user@host`, or a display name and `<user@host>`.
fn is_email(s: &str) -> bool {
    let s = s.trim();
    if let Some(inner) = s.strip_suffix('>') {
        let Some(open) = inner.rfind('<') else {
            return false;
        };
        return is_phrase(&inner[..open]) && is_addr_spec(inner[open + 1..].trim());
    }
    is_addr_spec(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_names() {
        assert!(is_supported("date-time"));
        assert!(is_supported("uuid"));
        assert!(!is_supported("int32"));
        assert!(!is_supported("k8s-short-name"));
        assert!(!is_supported("unknown"));
    }

    #[test]
    fn checks_formats() {
        let cases = [
            ("date", "2024-02-29", true),
            ("date", "2023-02-29", false),
            ("date", "2024-1-01", false),
            ("date-time", "2024-01-02T15:04:05Z", true),
            ("date-time", "2024-01-02T15:04:05.123+02:00", true),
            ("date-time", "2024-01-02 15:04:05Z", false),
            ("date-time", "2024-01-02T25:04:05Z", false),
            ("duration", "1h30m", true),
            ("duration", "1.5s", true),
            ("duration", "3 days", true),
            ("duration", "forever", false),
            ("uri", "https://example.com/a?b=c", true),
            ("uri", "/absolute/path", true),
            ("uri", "mailto:someone", true),
            ("uri", "relative/path", false),
            ("uri", "http://exa mple.com", false),
            ("uri", "http://host:port", false),
            ("email", "a.b@example.com", true),
            ("email", "Jane Doe <jane@example.com>", true),
            ("email", "\"Doe, Jane\" <jane@example.com>", true),
            ("email", "Jane <jane@example.com", false),
            ("uri", "*", true),
            ("email", "not-an-email", false),
            ("email", "a..b@example.com", false),
            ("hostname", "example.com", true),
            ("hostname", "-bad.example.com", false),
            ("ipv4", "10.0.0.1", true),
            ("ipv4", "010.0.0.1", true),
            ("ipv4", "10.0.0", false),
            ("ipv6", "fe80::1", true),
            ("ipv6", "10.0.0.1", false),
            ("cidr", "10.0.0.0/8", true),
            ("cidr", "fd00::/129", false),
            ("mac", "00:00:5e:00:53:01", true),
            ("mac", "0000.5e00.5301", true),
            ("mac", "00:00:5e:00:53", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid4", "123e4567-e89b-12d3-a456-426614174000", false),
            ("isbn10", "0321751043", true),
            ("isbn13", "978-0321751041", true),
            ("isbn", "0321751044", false),
            ("creditcard", "4111 1111 1111 1111", true),
            ("creditcard", "4111 1111 1111 1112", false),
            ("ssn", "123-45-6789", true),
            ("hexcolor", "#FFF", true),
            ("rgbcolor", "rgb(255, 0, 10)", true),
            ("rgbcolor", "rgb(256, 0, 10)", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "not base64", false),
            ("bsonobjectid", "507f1f77bcf86cd799439011", true),
            ("password", "anything", true),
        ];
        for (format, value, want) in cases {
            assert_eq!(validates(format, value), want, "{format} {value:?}");
        }
    }
}
