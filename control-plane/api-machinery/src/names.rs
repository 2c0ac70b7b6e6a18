//! Name, label and annotation validation with upstream's exact messages
//! (`k8s.io/apimachinery/pkg/util/validation`, `api/validate/content`, `api/validation`), and
//! `generateName` expansion (`k8s.io/apiserver/pkg/storage/names`).
//!
//! The `is_*` checks return the list of problems (empty when valid), like their Go namesakes, so
//! callers can wrap each one in a [`FieldError`] at the path they are validating.

use std::fmt;

use rand::Rng;

use crate::field::{FieldError, Path};

/// Upstream `DNS1123LabelMaxLength`.
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Upstream `DNS1123SubdomainMaxLength`.
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Upstream `DNS1035LabelMaxLength`.
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
/// Upstream `LabelValueMaxLength`.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// The maximum length of the name part of a qualified name (label key).
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Upstream `TotalAnnotationSizeLimitB`: keys plus values of all annotations, in bytes.
pub const TOTAL_ANNOTATION_SIZE_LIMIT_BYTES: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// The alphabet upstream's `utilrand.String` draws from: no vowels (so no words) and no
/// look-alike characters.
pub const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
const GENERATE_NAME_RANDOM_LENGTH: usize = 5;
const GENERATE_NAME_MAX_BASE: usize = 63 - GENERATE_NAME_RANDOM_LENGTH;

/// Upstream `MaxLenError`.
pub fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// Upstream `RegexError`: the message, optional examples, and the regex used.
pub fn regex_error(msg: &str, regex: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{regex}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{example}', "));
    }
    out.push_str(&format!("regex used for validation is '{regex}')"));
    out
}

/// Upstream `EmptyError`.
pub fn empty_error() -> String {
    "must be non-empty".to_string()
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, anchored.
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

fn matches_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_lowercase()
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, anchored.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Longest management API cluster or node pool name: a cluster's id (`name-xxxxxx`) must stay
/// a DNS label.
pub const MAX_MANAGEMENT_NAME_LENGTH: usize = 40;

/// Why `name` cannot name a management API cluster or node pool (a DNS label of at most
/// [`MAX_MANAGEMENT_NAME_LENGTH`] characters); empty when it can.
pub fn management_name_problems(name: &str) -> Vec<String> {
    let mut problems = is_dns1123_label(name);
    if name.len() > MAX_MANAGEMENT_NAME_LENGTH {
        problems.push(format!(
            "must be no more than {MAX_MANAGEMENT_NAME_LENGTH} characters"
        ));
    }
    problems
}

/// `IsDNS1123Label`: at most 63 characters of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            // A valid subdomain that is not a valid label can only be failing on its dots.
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// `IsDNS1123Subdomain`: at most 253 characters, dot-separated DNS-1123 labels.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `IsDNS1035Label`: like a DNS-1123 label but starting with a letter (Service names).
pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !matches_dns1035_label(value) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// `IsQualifiedName` (a label key): an optional DNS-1123 subdomain prefix and `/`, then a name
/// of at most 63 characters.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else {
                errs.extend(
                    is_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 characters shaped like a qualified name.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_qualified_name(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// `path.IsValidPathSegmentName`: what every object name must satisfy to be addressable in a
/// URL, whatever stricter rule its kind adds.
pub fn is_valid_path_segment_name(name: &str) -> Vec<String> {
    if name == "." || name == ".." {
        return vec![format!("may not be '{name}'")];
    }
    let mut errs = Vec::new();
    for illegal in ["/", "%"] {
        if name.contains(illegal) {
            errs.push(format!("may not contain '{illegal}'"));
        }
    }
    errs
}

/// Upstream `maskTrailingDash`: a `generateName` prefix may end in `-`, so validate it as if
/// the generated suffix were there. Reproduces upstream exactly, including that it replaces the
/// last *two* characters.
pub fn mask_trailing_dash(name: &str) -> String {
    if name.len() > 1 && name.ends_with('-') {
        // The dash is ASCII, so the cut lands on a character boundary unless the character
        // before it is multi-byte; fall back to the unmasked name rather than panic.
        match name.get(..name.len() - 2) {
            Some(head) => format!("{head}a"),
            None => name.to_string(),
        }
    } else {
        name.to_string()
    }
}

/// Which name rule a kind's `metadata.name` must follow (upstream `ValidateNameFunc`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// `NameIsDNSSubdomain`: most kinds.
    Dns1123Subdomain,
    /// `NameIsDNSLabel`: Namespace and a few others.
    Dns1123Label,
    /// `NameIsDNS1035Label`: Service.
    Dns1035Label,
}

impl NameRule {
    /// Validates `name`; `prefix` is true when it is a `generateName` (a trailing dash is fine).
    pub fn validate(self, name: &str, prefix: bool) -> Vec<String> {
        let name = if prefix {
            mask_trailing_dash(name)
        } else {
            name.to_string()
        };
        match self {
            NameRule::Dns1123Subdomain => is_dns1123_subdomain(&name),
            NameRule::Dns1123Label => is_dns1123_label(&name),
            NameRule::Dns1035Label => is_dns1035_label(&name),
        }
    }
}

/// `ValidateLabels`: every key a qualified name, every value a label value.
pub fn validate_labels<'a>(
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
    path: &Path,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels {
        errors.extend(
            is_qualified_name(key)
                .into_iter()
                .map(|m| FieldError::invalid(path, key, m)),
        );
        errors.extend(
            is_valid_label_value(value)
                .into_iter()
                .map(|m| FieldError::invalid(path, value, m)),
        );
    }
    errors
}

/// `ValidateAnnotations`: keys are qualified names compared case-insensitively, and keys plus
/// values together stay within [`TOTAL_ANNOTATION_SIZE_LIMIT_BYTES`].
pub fn validate_annotations<'a>(
    annotations: impl IntoIterator<Item = (&'a str, &'a str)>,
    path: &Path,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut total = 0usize;
    for (key, value) in annotations {
        errors.extend(
            is_qualified_name(&key.to_lowercase())
                .into_iter()
                .map(|m| FieldError::invalid(path, key, m)),
        );
        total = total.saturating_add(key.len()).saturating_add(value.len());
    }
    if total > TOTAL_ANNOTATION_SIZE_LIMIT_BYTES {
        errors.push(FieldError::too_long(
            path,
            TOTAL_ANNOTATION_SIZE_LIMIT_BYTES,
        ));
    }
    errors
}

/// Expands a `generateName` prefix: at most 58 bytes of it, then five random characters from
/// [`GENERATE_NAME_ALPHABET`] (upstream `SimpleNameGenerator`).
pub fn generate_name(base: &str) -> String {
    generate_name_with(base, &mut rand::rng())
}

/// [`generate_name`] with a caller-supplied random source, for deterministic tests.
pub fn generate_name_with(base: &str, rng: &mut impl Rng) -> String {
    let mut cut = base.len().min(GENERATE_NAME_MAX_BASE);
    // Upstream cuts bytes; a valid name is ASCII, but never split a character of an invalid one
    // (validation will reject it with a clearer message than a panic).
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut name = String::with_capacity(cut + GENERATE_NAME_RANDOM_LENGTH);
    name.push_str(&base[..cut]);
    for _ in 0..GENERATE_NAME_RANDOM_LENGTH {
        let i = rng.random_range(0..GENERATE_NAME_ALPHABET.len());
        name.push(char::from(GENERATE_NAME_ALPHABET[i]));
    }
    name
}

/// A name rejected by one of the newtypes below; `Display` joins upstream's messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value {value:?}: {}", messages.join("; "))]
pub struct NameError {
    /// The rejected input.
    pub value: String,
    /// Upstream's messages, one per violated rule.
    pub messages: Vec<String>,
}

macro_rules! validated_name {
    ($(#[$doc:meta])* $name:ident, $check:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(String);

        impl $name {
            /// The validated string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = NameError;
            fn try_from(value: String) -> Result<Self, NameError> {
                let messages = $check(&value);
                if messages.is_empty() { Ok($name(value)) } else { Err(NameError { value, messages }) }
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;
            fn try_from(value: &str) -> Result<Self, NameError> {
                $name::try_from(value.to_string())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

validated_name!(
    /// A string known to be a DNS-1123 subdomain (most object names).
    Dns1123Subdomain,
    is_dns1123_subdomain
);
validated_name!(
    /// A string known to be a DNS-1123 label (namespace names, container names).
    Dns1123Label,
    is_dns1123_label
);
validated_name!(
    /// A string known to be a DNS-1035 label (Service names).
    Dns1035Label,
    is_dns1035_label
);
validated_name!(
    /// A string known to be a qualified name (label and annotation keys, finalizers).
    QualifiedName,
    is_qualified_name
);

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    const NAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    #[test]
    fn regex_error_matches_upstream_formatting() {
        // Upstream really does print a doubled space before "or": each example is followed by
        // ", " and the next is preceded by " or ".
        assert_eq!(
            regex_error("m", "r", &[]),
            "m (regex used for validation is 'r')"
        );
        assert_eq!(
            regex_error("m", "r", &["a"]),
            "m (e.g. 'a', regex used for validation is 'r')"
        );
        assert_eq!(
            regex_error("m", "r", &["a", "b"]),
            "m (e.g. 'a',  or 'b', regex used for validation is 'r')"
        );
    }

    #[test]
    fn dns1123_subdomain() {
        let long_ok = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(long_ok.len(), 253);
        let cases: Vec<(String, Vec<String>)> = vec![
            ("a".into(), vec![]),
            ("example.com".into(), vec![]),
            ("a-b.c-d".into(), vec![]),
            ("0.1".into(), vec![]),
            (long_ok.clone(), vec![]),
            (format!("{long_ok}e"), vec![max_len_error(253)]),
            ("".into(), vec![SUBDOMAIN_MSG.into()]),
            ("A".into(), vec![SUBDOMAIN_MSG.into()]),
            ("-a".into(), vec![SUBDOMAIN_MSG.into()]),
            ("a-".into(), vec![SUBDOMAIN_MSG.into()]),
            ("a..b".into(), vec![SUBDOMAIN_MSG.into()]),
            (".a".into(), vec![SUBDOMAIN_MSG.into()]),
            ("a_b".into(), vec![SUBDOMAIN_MSG.into()]),
            (
                format!("{}A", "a".repeat(253)),
                vec![max_len_error(253), SUBDOMAIN_MSG.into()],
            ),
        ];
        for (input, want) in cases {
            assert_eq!(is_dns1123_subdomain(&input), want, "{input:?}");
        }
    }

    #[test]
    fn dns1123_label() {
        let cases: Vec<(String, Vec<String>)> = vec![
            ("a".into(), vec![]),
            ("abc-123".into(), vec![]),
            ("1".into(), vec![]),
            ("a".repeat(63), vec![]),
            ("a".repeat(64), vec![max_len_error(63)]),
            ("a.b".into(), vec!["must not contain dots".into()]),
            ("".into(), vec![LABEL_MSG.into()]),
            ("Abc".into(), vec![LABEL_MSG.into()]),
            ("a_b".into(), vec![LABEL_MSG.into()]),
            ("-a".into(), vec![LABEL_MSG.into()]),
        ];
        for (input, want) in cases {
            assert_eq!(is_dns1123_label(&input), want, "{input:?}");
        }
    }

    #[test]
    fn dns1035_label() {
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("a", vec![]),
            ("my-svc1", vec![]),
            ("1abc", vec![DNS1035_MSG.into()]),
            ("a.b", vec![DNS1035_MSG.into()]),
            ("a-", vec![DNS1035_MSG.into()]),
        ];
        for (input, want) in cases {
            assert_eq!(is_dns1035_label(input), want, "{input:?}");
        }
        assert_eq!(is_dns1035_label(&"a".repeat(64)), vec![max_len_error(63)]);
    }

    #[test]
    fn qualified_names() {
        let ok = ["a", "A", "a.b_c-d", "example.com/MyName", "k8s.io/app", "1"];
        for input in ok {
            assert!(
                is_qualified_name(input).is_empty(),
                "{input:?}: {:?}",
                is_qualified_name(input)
            );
        }
        let cases: Vec<(String, Vec<String>)> = vec![
            (
                "".into(),
                vec!["name part must be non-empty".into(), NAME_PART_MSG.into()],
            ),
            ("a@b".into(), vec![NAME_PART_MSG.into()]),
            ("/a".into(), vec!["prefix part must be non-empty".into()]),
            (
                "Example.com/a".into(),
                vec![format!("prefix part {SUBDOMAIN_MSG}")],
            ),
            (
                "a/".into(),
                vec!["name part must be non-empty".into(), NAME_PART_MSG.into()],
            ),
            (
                "a".repeat(64),
                vec!["name part must be no more than 63 characters".into()],
            ),
            (
                "a/b/c".into(),
                vec![format!(
                    "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                    NAME_PART_MSG.trim_start_matches("name part ")
                )],
            ),
        ];
        for (input, want) in cases {
            assert_eq!(is_qualified_name(&input), want, "{input:?}");
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "a", "a.b", "A_b-1", &"v".repeat(63)] {
            assert!(is_valid_label_value(ok).is_empty(), "{ok:?}");
        }
        assert_eq!(
            is_valid_label_value("a b"),
            vec![LABEL_VALUE_MSG.to_string()]
        );
        assert_eq!(
            is_valid_label_value("-a"),
            vec![LABEL_VALUE_MSG.to_string()]
        );
        assert_eq!(
            is_valid_label_value(&"v".repeat(64)),
            vec![max_len_error(63)]
        );
    }

    #[test]
    fn path_segment_names() {
        assert!(is_valid_path_segment_name("ok").is_empty());
        assert_eq!(is_valid_path_segment_name(".."), vec!["may not be '..'"]);
        assert_eq!(is_valid_path_segment_name("."), vec!["may not be '.'"]);
        assert_eq!(
            is_valid_path_segment_name("a/b%c"),
            vec!["may not contain '/'", "may not contain '%'"]
        );
    }

    #[test]
    fn name_rules_accept_generate_name_prefixes() {
        assert!(NameRule::Dns1123Subdomain.validate("web-", true).is_empty());
        assert!(
            !NameRule::Dns1123Subdomain
                .validate("web-", false)
                .is_empty()
        );
        assert!(NameRule::Dns1035Label.validate("svc-", true).is_empty());
        assert!(!NameRule::Dns1123Label.validate("Web-", true).is_empty());
        assert_eq!(mask_trailing_dash("ab-"), "aa");
        assert_eq!(mask_trailing_dash("-"), "-");
        assert_eq!(mask_trailing_dash("abc"), "abc");
    }

    #[test]
    fn labels_and_annotations() {
        let path = Path::new("metadata").child("labels");
        let errors = validate_labels(
            [("app", "web"), ("bad key", "x"), ("k", "bad value")],
            &path,
        );
        let rendered: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            rendered,
            vec![
                format!("metadata.labels: Invalid value: \"bad key\": {NAME_PART_MSG}"),
                format!("metadata.labels: Invalid value: \"bad value\": {LABEL_VALUE_MSG}"),
            ]
        );

        let path = Path::new("metadata").child("annotations");
        // Annotation keys are case-insensitive, so an upper-case prefix is fine.
        assert!(validate_annotations([("Example.COM/Key", "v")], &path).is_empty());
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_BYTES);
        let errors = validate_annotations([("k", big.as_str())], &path);
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "metadata.annotations: Too long: must have at most 262144 bytes"
        );
        let exact = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_BYTES - 1);
        assert!(validate_annotations([("k", exact.as_str())], &path).is_empty());
    }

    #[test]
    fn generated_names() {
        let mut rng = StdRng::seed_from_u64(7);
        let short = generate_name_with("web-", &mut rng);
        assert_eq!(short.len(), 9);
        assert!(short.starts_with("web-"));
        assert!(
            short[4..]
                .bytes()
                .all(|b| GENERATE_NAME_ALPHABET.contains(&b))
        );

        let long = generate_name_with(&"a".repeat(100), &mut rng);
        assert_eq!(long.len(), 63);
        assert!(long.starts_with(&"a".repeat(58)));
        assert!(is_dns1123_label(&long).is_empty());

        let multibyte = generate_name_with(&format!("{}é", "a".repeat(57)), &mut rng);
        assert!(multibyte.starts_with(&"a".repeat(57)));
        assert_eq!(multibyte.chars().count(), 62);

        assert_ne!(
            generate_name("x-"),
            generate_name("x-"),
            "five random characters should differ"
        );
    }

    #[test]
    fn newtypes_enforce_their_rule() {
        assert_eq!(
            Dns1123Subdomain::try_from("a.b").map(|n| n.to_string()),
            Ok("a.b".to_string())
        );
        let err = Dns1123Label::try_from("a.b").expect_err("dots are not allowed in labels");
        assert_eq!(
            err.to_string(),
            "invalid value \"a.b\": must not contain dots"
        );
        assert!(Dns1035Label::try_from("1a").is_err());
        assert_eq!(
            QualifiedName::try_from("k8s.io/x").map(|n| n.as_str().to_string()),
            Ok("k8s.io/x".into())
        );
    }
}
