//! The `kubernetes.format` library: `format.named(name)`, `format.<name>()` and
//! `<Format>.validate(s)`, which answers `optional.none()` for a valid string and the list of
//! problems otherwise (upstream `library/format.go`).

use cel::common::types::{CelOptional, STRING_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{DeclarationError, Env, ExecutionError};
use flotilla_api_machinery::names::{self, NameRule};

use super::{arg, global, member, opaque_value, str_arg, string_list};

/// A named string format (`kubernetes.NamedFormat`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Format {
    name: &'static str,
}

opaque_value!(Format, FORMAT_TYPE, "kubernetes.NamedFormat");

/// The formats upstream names, each also a `format.<name>()` constructor.
pub(crate) const FORMAT_NAMES: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(FORMAT_TYPE.to_owned())?;
    global(env, "format.named", &[&STRING_TYPE], |args| {
        let name = str_arg(&args, 0, "format.named")?;
        let found = FORMAT_NAMES.iter().find(|n| **n == name);
        Ok(CowVal::owned(match found {
            Some(name) => CelOptional::of(Box::new(Format { name })),
            None => CelOptional::none(),
        }))
    })?;
    member(env, "validate", &FORMAT_TYPE, &[&STRING_TYPE], validate)?;
    // one zero-argument overload per name: cel-rust overloads are plain functions, so the name
    // is recovered from the overload that was called rather than captured
    macro_rules! constructors {
        ($($name:literal),*) => {
            $(
                global(env, concat!("format.", $name), &[], |_| {
                    Ok(CowVal::owned(Format { name: $name }))
                })?;
            )*
        };
    }
    constructors!(
        "dns1123Label",
        "dns1123Subdomain",
        "dns1035Label",
        "qualifiedName",
        "dns1123LabelPrefix",
        "dns1123SubdomainPrefix",
        "dns1035LabelPrefix",
        "labelValue",
        "uri",
        "uuid",
        "byte",
        "date",
        "datetime"
    );
    Ok(())
}

fn validate<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let format = arg::<Format>(&args, 0, "validate")?;
    let text = str_arg(&args, 1, "validate")?;
    let problems = problems(format.name, text);
    if problems.is_empty() {
        return Ok(CowVal::owned(CelOptional::none()));
    }
    let list: Box<dyn Val + 'v> = string_list(problems).into_owned();
    Ok(CowVal::owned(CelOptional::of(list)))
}

fn problems(format: &str, text: &str) -> Vec<String> {
    match format {
        "dns1123Label" => NameRule::Dns1123Label.validate(text, false),
        "dns1123Subdomain" => NameRule::Dns1123Subdomain.validate(text, false),
        "dns1035Label" => NameRule::Dns1035Label.validate(text, false),
        "dns1123LabelPrefix" => NameRule::Dns1123Label.validate(text, true),
        "dns1123SubdomainPrefix" => NameRule::Dns1123Subdomain.validate(text, true),
        "dns1035LabelPrefix" => NameRule::Dns1035Label.validate(text, true),
        "qualifiedName" => names::is_qualified_name(text),
        "labelValue" => names::is_valid_label_value(text),
        "uri" => super::urls::parse_request_uri(text)
            .err()
            .into_iter()
            .collect(),
        "uuid" if !is_uuid(text) => vec!["does not match the UUID format".to_string()],
        "byte" if crate::values::decode_base64(text).is_none() => {
            vec!["invalid base64".to_string()]
        }
        "date" if !is_date(text) => vec!["invalid date".to_string()],
        "datetime" if crate::values::parse_timestamp(text).is_none() => {
            vec!["invalid datetime".to_string()]
        }
        _ => Vec::new(),
    }
}

/// strfmt's UUID: 32 hex digits, optionally grouped 8-4-4-4-12 by dashes.
fn is_uuid(text: &str) -> bool {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = text.split('-').collect();
    match groups.as_slice() {
        [whole] => whole.len() == 32 && hex(whole),
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12]
                && groups.iter().all(|g| hex(g))
        }
        _ => false,
    }
}

/// RFC 3339 `full-date`: `YYYY-MM-DD`, a real calendar day.
fn is_date(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        return false;
    };
    if y.len() != 4 || m.len() != 2 || d.len() != 2 {
        return false;
    }
    let (Ok(year), Ok(month), Ok(day)) = (y.parse::<u32>(), m.parse::<u32>(), d.parse::<u32>())
    else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_like_upstream() {
        let cases: &[(&str, &str, bool)] = &[
            ("dns1123Label", "my-label-name", true),
            ("dns1123Label", "My_Label", false),
            ("dns1123Subdomain", "apiextensions.k8s.io", true),
            ("dns1035Label", "1abc", false),
            ("qualifiedName", "apiextensions.k8s.io/v1beta1", true),
            ("dns1123LabelPrefix", "my-label-prefix-", true),
            ("labelValue", "", true),
            ("uri", "http://example.com", true),
            ("uri", "example", false),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", true),
            ("uuid", "123e4567", false),
            ("byte", "aGVsbG8=", true),
            ("byte", "aGVsbG8", false),
            ("date", "2021-01-01", true),
            ("date", "2021-02-30", false),
            ("datetime", "2021-01-01T00:00:00Z", true),
            ("datetime", "2021-01-01", false),
        ];
        for (format, text, valid) in cases {
            assert_eq!(
                problems(format, text).is_empty(),
                *valid,
                "{format} {text:?}"
            );
        }
    }
}
