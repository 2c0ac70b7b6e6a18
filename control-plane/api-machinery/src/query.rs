//! Query parameters as upstream's apiserver reads them (apimachinery's runtime conversions):
//! one rule for every boolean, so authorization and the handlers agree on what a request is.

/// A boolean query parameter: absent is false; `false` and `0` (any case) are false; any
/// other value — `true`, `True`, `1`, `yes`, even an empty `?watch=` — is true
/// (`Convert_Slice_string_To_bool`).
pub fn query_bool(value: Option<&str>) -> bool {
    match value {
        None => false,
        Some(text) => !(text.eq_ignore_ascii_case("false") || text == "0"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_read_as_upstream_reads_them() {
        for truthy in ["true", "True", "TRUE", "1", "t", "yes", ""] {
            assert!(query_bool(Some(truthy)), "{truthy:?}");
        }
        for falsy in ["false", "False", "FALSE", "0"] {
            assert!(!query_bool(Some(falsy)), "{falsy:?}");
        }
        assert!(!query_bool(None));
    }
}
