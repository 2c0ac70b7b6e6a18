//! Console sessions: the API key a user signed in with, sealed (ChaCha20-Poly1305) into an
//! `HttpOnly; Secure; SameSite=Strict` cookie under the service's console key, so any replica
//! opens it and nothing is kept server-side; each session carries its CSRF token and expiry.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::Rng;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

/// The session cookie's name.
pub const COOKIE: &str = "flotilla_session";
/// How long a session lasts after sign-in.
pub const LIFETIME_SECONDS: i64 = 8 * 3600;

/// Who is signed in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The API key (or operator token) every call is made with.
    #[serde(rename = "k")]
    pub api_key: String,
    /// The account, or `None` for the operator.
    #[serde(rename = "a")]
    pub account: Option<String>,
    /// The token every form must carry back.
    #[serde(rename = "c")]
    pub csrf: String,
    /// When it ends (Unix seconds).
    #[serde(rename = "e")]
    pub expires: i64,
}

impl Session {
    /// A new session for `api_key`, lasting [`LIFETIME_SECONDS`] from `now`.
    pub fn new(api_key: String, account: Option<String>, now: i64) -> Self {
        Session {
            api_key,
            account,
            csrf: random_token(),
            expires: now + LIFETIME_SECONDS,
        }
    }

    /// Whether this is the operator's session.
    pub fn is_operator(&self) -> bool {
        self.account.is_none()
    }

    /// Whether `token` (from a form or header) is this session's CSRF token, compared in
    /// constant time.
    pub fn csrf_matches(&self, token: &str) -> bool {
        let (ours, theirs) = (self.csrf.as_bytes(), token.as_bytes());
        ours.len() == theirs.len()
            && ours
                .iter()
                .zip(theirs)
                .fold(0u8, |differ, (a, b)| differ | (a ^ b))
                == 0
    }
}

/// 32 random bytes, URL-safe base64.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Seals and opens sessions with one key.
pub struct Sealer {
    key: LessSafeKey,
}

impl Sealer {
    /// A sealer under `key` (the service's console key).
    pub fn new(key: &[u8; 32]) -> Self {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key)
            .unwrap_or_else(|_| unreachable!("a 32-byte key is ChaCha20-Poly1305's size"));
        Sealer {
            key: LessSafeKey::new(unbound),
        }
    }

    /// The cookie value of `session`: base64(nonce ‖ ciphertext ‖ tag).
    pub fn seal(&self, session: &Session) -> String {
        let nonce: [u8; NONCE_LEN] = rand::rng().random();
        let mut sealed = serde_json::to_vec(session).unwrap_or_default();
        // Sealing only fails for inputs larger than the cipher's limit (256 GiB).
        let _ = self.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(COOKIE.as_bytes()),
            &mut sealed,
        );
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The session in a cookie value, if it was sealed with this key and has not expired.
    pub fn open(&self, cookie: &str, now: i64) -> Option<Session> {
        let bytes = URL_SAFE_NO_PAD.decode(cookie).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut sealed = sealed.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(COOKIE.as_bytes()), &mut sealed)
            .ok()?;
        let session: Session = serde_json::from_slice(plain).ok()?;
        (session.expires > now).then_some(session)
    }
}

/// The `Set-Cookie` value carrying `value` (a session) under the console's path.
pub fn set_cookie(value: &str) -> String {
    format!(
        "{COOKIE}={value}; Path=/console; HttpOnly; Secure; SameSite=Strict; Max-Age={LIFETIME_SECONDS}"
    )
}

/// The `Set-Cookie` value that ends the session.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/console; HttpOnly; Secure; SameSite=Strict; Max-Age=0")
}

/// The session cookie's value among a request's `Cookie` headers.
pub fn cookie_value(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_only_with_its_key_and_before_it_expires() {
        let sealer = Sealer::new(&[7; 32]);
        let session = Session::new("flo_key".into(), Some("acme".into()), 1000);
        let cookie = sealer.seal(&session);
        assert_eq!(sealer.open(&cookie, 1001), Some(session.clone()));
        assert_eq!(sealer.open(&cookie, 1000 + LIFETIME_SECONDS), None);
        assert_eq!(Sealer::new(&[8; 32]).open(&cookie, 1001), None);
        let mut tampered = URL_SAFE_NO_PAD.decode(&cookie).unwrap_or_default();
        if let Some(last) = tampered.last_mut() {
            *last ^= 1;
        }
        assert_eq!(sealer.open(&URL_SAFE_NO_PAD.encode(tampered), 1001), None);
        assert_eq!(sealer.open("not base64!", 1001), None);
        assert!(!cookie.contains("flo_key"), "the key is not readable");
    }

    #[test]
    fn csrf_tokens_and_cookies() {
        let session = Session::new("k".into(), None, 0);
        assert!(session.is_operator());
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches("forged"));
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::COOKIE,
            http::HeaderValue::from_static("theme=dark; flotilla_session=abc; other=1"),
        );
        assert_eq!(cookie_value(&headers), Some("abc"));
        assert!(set_cookie("abc").contains("HttpOnly; Secure; SameSite=Strict"));
    }
}
