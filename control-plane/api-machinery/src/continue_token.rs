//! Upstream's continue tokens of paginated lists (`meta.k8s.io/v1`: URL-safe base64 of
//! `{"v", "rv", "start"}`): the revision a list is read at and the key, relative to the list's
//! prefix, to go on from. A token comes back from the client, so decoding checks everything:
//! a start key that could climb out of the list's prefix (into another namespace or tenant)
//! is refused, not trusted.

use base64::Engine;

/// The version every token carries.
const VERSION: &str = "meta.k8s.io/v1";

/// The revision that means "go on at the latest state" (upstream's answer to a continue whose
/// revision was compacted).
pub const LATEST: i64 = -1;

/// A decoded token.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContinueToken {
    /// Always `meta.k8s.io/v1`.
    pub v: String,
    /// The revision the list is read at, or [`LATEST`].
    pub rv: i64,
    /// The key to start at, relative to the list's prefix.
    pub start: String,
}

/// The token of a list read at `revision` that goes on at `start` (relative to its prefix).
pub fn encode(revision: i64, start: &str) -> String {
    let token = ContinueToken {
        v: VERSION.to_string(),
        rv: revision,
        start: start.to_string(),
    };
    let json = serde_json::to_vec(&token).unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE.encode(json)
}

/// A token as a client sent it back; the error says why it is refused (upstream's words
/// where upstream has them).
pub fn decode(token: &str) -> Result<ContinueToken, &'static str> {
    let bytes = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| "not base64")?;
    let token: ContinueToken =
        serde_json::from_slice(&bytes).map_err(|_| "not a continue token")?;
    if token.v != VERSION {
        return Err("unknown version");
    }
    if token.rv <= 0 && token.rv != LATEST {
        return Err("incorrect encoded start resourceVersion (version meta.k8s.io/v1)");
    }
    if token.start.is_empty()
        || token.start.starts_with('/')
        || token.start.split('/').any(|s| s == ".." || s == ".")
    {
        return Err("continue key is not valid");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_refuse_escapes() {
        let decoded = decode(&encode(42, "default/pod-b\u{0}")).expect("decodes");
        assert_eq!(
            (decoded.rv, decoded.start.as_str()),
            (42, "default/pod-b\u{0}")
        );
        assert_eq!(decode(&encode(LATEST, "a")).expect("latest").rv, LATEST);
        for bad in ["../other/x", "/registry/b/core/pods/", "a/./b", ""] {
            assert_eq!(
                decode(&encode(5, bad)),
                Err("continue key is not valid"),
                "{bad}"
            );
        }
        assert_eq!(decode(&encode(0, "a")).map(|t| t.rv).ok(), None);
        assert_eq!(decode("not base64!"), Err("not base64"));
        assert_eq!(decode("e30"), Err("not a continue token"));
    }
}
