//! Authentication of tenant requests: x509 client certificates of the tenant's CA, bearer
//! service-account JWTs signed by the tenant's key (and their issuing: TokenRequest, the OIDC
//! discovery documents), and bootstrap tokens kept as Secrets in `kube-system` — upstream's
//! authenticators, each scoped to one tenant so a credential of one cluster opens nothing in
//! another.

use std::collections::BTreeMap;

use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::meta;
use crate::pki::CertificateIdentity;
use crate::store::{ReadAt, Tenant};

pub use flotilla_api_machinery::rbac::UserInfo;

/// The identity of a request made inside the process (a tenant's control loops on the
/// in-memory transport), set as a request extension. Requests from the network never carry
/// it: only code in this process can add an extension.
#[derive(Debug, Clone)]
pub struct InProcessIdentity(pub UserInfo);

/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = flotilla_api_machinery::rbac::ALL_AUTHENTICATED;

/// The identity a verified client certificate asserts.
pub fn user_from_certificate(identity: CertificateIdentity) -> UserInfo {
    let mut groups = identity.groups;
    groups.push(AUTHENTICATED.into());
    UserInfo {
        name: identity.user,
        groups,
        ..Default::default()
    }
}

/// The `UserInfo` object of the authentication.k8s.io API.
pub fn user_info_json(user: &UserInfo) -> Value {
    let mut info = json!({ "username": user.name, "groups": user.groups });
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    if !user.extra.is_empty() {
        info["extra"] = json!(user.extra);
    }
    info
}

// ---------------------------------------------------------------------------------------------
// The service-account signing key

/// A tenant's service-account signing key (ECDSA P-256, so tokens are ES256 JWTs).
pub struct SigningKey {
    pair: EcdsaKeyPair,
    /// `kid` of the tokens and of the JWKS entry: base64url SHA-256 of the public point.
    key_id: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl SigningKey {
    /// A new key as PKCS#8 DER, base64 (how tenant records keep it).
    pub fn generate() -> Result<String, ApiError> {
        let document = EcdsaKeyPair::generate_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &SystemRandom::new(),
        )
        .map_err(|_| ApiError::internal("cannot generate a service-account signing key"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(document.as_ref()))
    }

    /// Loads a key kept by [`SigningKey::generate`].
    pub fn load(pkcs8_base64: &str) -> Result<Self, ApiError> {
        let der = base64::engine::general_purpose::STANDARD
            .decode(pkcs8_base64)
            .map_err(|_| ApiError::internal("the service-account signing key is not base64"))?;
        let pair = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &der,
            &SystemRandom::new(),
        )
        .map_err(|_| ApiError::internal("the service-account signing key is unreadable"))?;
        let digest = ring::digest::digest(&ring::digest::SHA256, pair.public_key().as_ref());
        Ok(SigningKey {
            key_id: b64url(digest.as_ref()),
            pair,
        })
    }

    /// The JWKS document (`/openid/v1/jwks`).
    pub fn jwks(&self) -> Value {
        // An uncompressed P-256 point: 0x04 ‖ x (32 bytes) ‖ y (32 bytes).
        let point = self.pair.public_key().as_ref();
        let (x, y) = match point.len() {
            65 => (&point[1..33], &point[33..]),
            _ => (&[][..], &[][..]),
        };
        json!({"keys": [{
            "use": "sig", "kty": "EC", "kid": self.key_id, "crv": "P-256", "alg": "ES256",
            "x": b64url(x), "y": b64url(y),
        }]})
    }

    /// Signs `claims` as a compact ES256 JWT.
    pub fn sign(&self, claims: &Value) -> Result<String, ApiError> {
        let header = json!({"alg": "ES256", "kid": self.key_id});
        let signing_input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = self
            .pair
            .sign(&SystemRandom::new(), signing_input.as_bytes())
            .map_err(|_| ApiError::internal("signing a service-account token failed"))?;
        Ok(format!("{signing_input}.{}", b64url(signature.as_ref())))
    }

    /// The claims of `token` if this key signed it; `None` for anything else.
    fn verify(&self, token: &str) -> Option<Value> {
        let mut parts = token.split('.');
        let (header, claims, sig) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let decode = |part: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part)
                .ok()
        };
        let header: Value = serde_json::from_slice(&decode(header)?).ok()?;
        if header["alg"] != "ES256" {
            return None;
        }
        let public = signature::UnparsedPublicKey::new(
            &signature::ECDSA_P256_SHA256_FIXED,
            self.pair.public_key().as_ref(),
        );
        let signed = token.len() - sig.len() - 1;
        public
            .verify(token.get(..signed)?.as_bytes(), &decode(sig)?)
            .ok()?;
        serde_json::from_slice(&decode(claims)?).ok()
    }
}

/// The OIDC discovery document (`/.well-known/openid-configuration`) of `issuer`.
pub fn openid_configuration(issuer: &str) -> Value {
    json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/openid/v1/jwks"),
        "response_types_supported": ["id_token"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["ES256"],
    })
}

// ---------------------------------------------------------------------------------------------
// Service-account tokens

/// What a token is bound to (`TokenRequest.spec.boundObjectRef`), checked on every use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundObject {
    /// `Pod`, `Secret` or `Node`.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

/// Everything a service-account token says.
#[derive(Debug, Clone)]
pub struct TokenClaims {
    /// `aud`.
    pub audiences: Vec<String>,
    /// Seconds since the epoch.
    pub issued_at: i64,
    /// Seconds since the epoch.
    pub expires_at: i64,
    /// The service account's namespace.
    pub namespace: String,
    /// The service account's name.
    pub service_account: String,
    /// The service account's uid.
    pub service_account_uid: String,
    /// The object the token dies with.
    pub bound: Option<BoundObject>,
    /// `jti`.
    pub id: String,
}

impl TokenClaims {
    /// The JWT claims, in upstream's layout.
    pub fn to_json(&self, issuer: &str) -> Value {
        let mut kubernetes = json!({
            "namespace": self.namespace,
            "serviceaccount": {"name": self.service_account, "uid": self.service_account_uid},
        });
        if let Some(bound) = &self.bound {
            kubernetes[bound.kind.to_lowercase()] = json!({"name": bound.name, "uid": bound.uid});
        }
        json!({
            "aud": self.audiences,
            "exp": self.expires_at,
            "iat": self.issued_at,
            "nbf": self.issued_at,
            "iss": issuer,
            "jti": self.id,
            "kubernetes.io": kubernetes,
            "sub": format!("system:serviceaccount:{}:{}", self.namespace, self.service_account),
        })
    }

    fn from_json(claims: &Value) -> Option<Self> {
        let kubernetes = &claims["kubernetes.io"];
        let audiences = audiences_of(claims);
        let bound = ["pod", "secret", "node"].iter().find_map(|kind| {
            let object = kubernetes.get(*kind)?;
            Some(BoundObject {
                kind: match *kind {
                    "pod" => "Pod",
                    "secret" => "Secret",
                    _ => "Node",
                }
                .to_string(),
                name: object["name"].as_str()?.to_string(),
                uid: object["uid"].as_str()?.to_string(),
            })
        });
        Some(TokenClaims {
            audiences,
            issued_at: claims["iat"].as_i64()?,
            expires_at: claims["exp"].as_i64()?,
            namespace: kubernetes["namespace"].as_str()?.to_string(),
            service_account: kubernetes["serviceaccount"]["name"].as_str()?.to_string(),
            service_account_uid: kubernetes["serviceaccount"]["uid"].as_str()?.to_string(),
            bound,
            id: claims["jti"].as_str().unwrap_or_default().to_string(),
        })
    }

    /// The user a valid token authenticates (upstream's service-account user and extras).
    pub fn user(&self) -> UserInfo {
        let mut extra = BTreeMap::new();
        if !self.id.is_empty() {
            extra.insert(
                "authentication.kubernetes.io/credential-id".to_string(),
                vec![format!("JTI={}", self.id)],
            );
        }
        if let Some(bound) = &self.bound {
            let prefix = format!("authentication.kubernetes.io/{}", bound.kind.to_lowercase());
            extra.insert(format!("{prefix}-name"), vec![bound.name.clone()]);
            extra.insert(format!("{prefix}-uid"), vec![bound.uid.clone()]);
        }
        UserInfo {
            name: format!(
                "system:serviceaccount:{}:{}",
                self.namespace, self.service_account
            ),
            uid: self.service_account_uid.clone(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{}", self.namespace),
                AUTHENTICATED.into(),
            ],
            extra,
        }
    }
}

/// Why a bearer token authenticates nobody (the 401 says only "Unauthorized", as upstream; the
/// reason is for TokenReview and logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidToken(pub String);

/// The claim naming the groups of a user token (not a service-account token).
const GROUPS_CLAIM: &str = "flotilla.io/groups";

/// A signature-checked token of a cluster's key.
#[derive(Debug, Clone)]
pub enum VerifiedToken {
    /// A service-account token; its account and bound object are still to be checked.
    ServiceAccount(TokenClaims),
    /// A user token (`flotilla cluster token`): the user and groups it names.
    User(UserInfo),
}

/// Checks `token` against `key`, `issuer`, the accepted audiences and the clock.
pub fn verify_token(
    key: &SigningKey,
    issuer: &str,
    accepted_audiences: &[String],
    token: &str,
    now: i64,
) -> Result<VerifiedToken, InvalidToken> {
    let claims = key
        .verify(token)
        .ok_or_else(|| InvalidToken("invalid bearer token".into()))?;
    if claims["iss"] != issuer {
        return Err(InvalidToken("token is of another issuer".into()));
    }
    if !audiences_of(&claims)
        .iter()
        .any(|a| accepted_audiences.contains(a))
    {
        return Err(InvalidToken("token audiences is invalid".into()));
    }
    match claims["exp"].as_i64() {
        Some(expires) if now < expires => {}
        _ => return Err(InvalidToken("token has expired".into())),
    }
    if claims["nbf"].as_i64().is_some_and(|nbf| now < nbf) {
        return Err(InvalidToken("token is not valid yet".into()));
    }
    if claims.get("kubernetes.io").is_some() {
        return TokenClaims::from_json(&claims)
            .map(VerifiedToken::ServiceAccount)
            .ok_or_else(|| InvalidToken("token lacks service-account claims".into()));
    }
    let name = claims["sub"].as_str().filter(|s| !s.is_empty());
    let groups = claims[GROUPS_CLAIM].as_array();
    match (name, groups) {
        (Some(name), Some(groups)) => {
            let mut groups: Vec<String> = groups
                .iter()
                .filter_map(|g| g.as_str().map(String::from))
                .collect();
            groups.push(AUTHENTICATED.into());
            Ok(VerifiedToken::User(UserInfo {
                name: name.to_string(),
                groups,
                ..Default::default()
            }))
        }
        _ => Err(InvalidToken("token names no user".into())),
    }
}

fn audiences_of(claims: &Value) -> Vec<String> {
    match &claims["aud"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    }
}

/// A user token for `user` in `groups`, valid for `lifetime_seconds` (what `flotilla cluster
/// token` hands kubectl's exec plugin, as `aws eks get-token` does): (token, expiry).
pub fn issue_user_token(
    key: &SigningKey,
    issuer: &str,
    user: &str,
    groups: &[&str],
    lifetime_seconds: i64,
) -> Result<(String, i64), ApiError> {
    let now = now_seconds();
    let expires = now + lifetime_seconds;
    let claims = json!({
        "iss": issuer, "aud": [issuer], "sub": user, GROUPS_CLAIM: groups,
        "iat": now, "nbf": now, "exp": expires, "jti": uuid::Uuid::new_v4().to_string(),
    });
    Ok((key.sign(&claims)?, expires))
}

// ---------------------------------------------------------------------------------------------
// Bootstrap tokens

/// `(id, secret)` of a bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn parse_bootstrap_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let valid = |part: &str, len: usize| {
        part.len() == len
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (valid(id, 6) && valid(secret, 16)).then_some((id, secret))
}

/// The user of bootstrap token `id` whose Secret is `secret` (a `bootstrap.kubernetes.io/token`
/// Secret in `kube-system`), if the Secret accepts `token_secret` now.
pub fn bootstrap_user(secret: &Value, id: &str, token_secret: &str, now: i64) -> Option<UserInfo> {
    if secret["type"] != "bootstrap.kubernetes.io/token" || meta::is_terminating(secret) {
        return None;
    }
    let field = |name: &str| -> Option<String> {
        let encoded = secret["data"][name].as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()?;
        String::from_utf8(bytes).ok()
    };
    let matches = field("token-id").as_deref() == Some(id)
        // Digests of equal length compared, so the time taken says nothing about the secret.
        && field("token-secret").is_some_and(|s| {
            let digest = |v: &str| ring::digest::digest(&ring::digest::SHA256, v.as_bytes());
            digest(&s).as_ref() == digest(token_secret).as_ref()
        });
    if !matches || field("usage-bootstrap-authentication").as_deref() != Some("true") {
        return None;
    }
    if let Some(expiration) = field("expiration") {
        let expires = chrono::DateTime::parse_from_rfc3339(&expiration).ok()?;
        if now >= expires.timestamp() {
            return None;
        }
    }
    let mut groups = vec!["system:bootstrappers".to_string()];
    for group in field("auth-extra-groups").unwrap_or_default().split(',') {
        let group = group.trim();
        if group.starts_with("system:bootstrappers:") && !groups.iter().any(|g| g == group) {
            groups.push(group.to_string());
        }
    }
    groups.push(AUTHENTICATED.into());
    Some(UserInfo {
        name: format!("system:bootstrap:{id}"),
        groups,
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------------------------
// The request authenticator

/// Seconds since the epoch.
pub fn now_seconds() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Authenticates a bearer token against `tenant`: a service-account JWT (whose account and
/// bound object must still exist with the same uids) or a bootstrap token.
pub async fn authenticate_token(
    server: &crate::ApiServer,
    tenant: &crate::tenants::TenantState,
    token: &str,
    audiences: Option<&[String]>,
) -> Result<(UserInfo, Vec<String>), InvalidToken> {
    let now = now_seconds();
    if let Some((id, secret)) = parse_bootstrap_token(token) {
        let stored = read(
            server,
            &tenant.tenant,
            "secrets",
            "kube-system",
            &format!("bootstrap-token-{id}"),
        )
        .await
        .ok_or_else(|| InvalidToken("invalid bootstrap token".into()))?;
        let user = bootstrap_user(&stored, id, secret, now)
            .ok_or_else(|| InvalidToken("invalid bootstrap token".into()))?;
        return Ok((user, Vec::new()));
    }
    let key = tenant
        .signing_key()
        .ok_or_else(|| InvalidToken("invalid bearer token".into()))?;
    let issuer = tenant.issuer();
    let api_audiences = vec![issuer.clone()];
    let accepted = audiences.unwrap_or(&api_audiences);
    let claims = match verify_token(key, &issuer, accepted, token, now)? {
        VerifiedToken::ServiceAccount(claims) => claims,
        VerifiedToken::User(user) => return Ok((user, accepted.to_vec())),
    };
    read(
        server,
        &tenant.tenant,
        "serviceaccounts",
        &claims.namespace,
        &claims.service_account,
    )
    .await
    .filter(|sa| meta::uid(sa) == claims.service_account_uid && !meta::is_terminating(sa))
    .ok_or_else(|| {
        InvalidToken(format!(
            "service account {}/{} has been deleted",
            claims.namespace, claims.service_account
        ))
    })?;
    if let Some(bound) = &claims.bound {
        let plural = match bound.kind.as_str() {
            "Pod" => "pods",
            "Secret" => "secrets",
            _ => "nodes",
        };
        let namespace = if plural == "nodes" {
            ""
        } else {
            claims.namespace.as_str()
        };
        read(server, &tenant.tenant, plural, namespace, &bound.name)
            .await
            .filter(|object| meta::uid(object) == bound.uid && !meta::is_terminating(object))
            .ok_or_else(|| {
                InvalidToken(format!(
                    "{} {} bound to this token has been deleted",
                    bound.kind, bound.name
                ))
            })?;
    }
    let matched = claims
        .audiences
        .iter()
        .filter(|a| accepted.contains(a))
        .cloned()
        .collect();
    Ok((claims.user(), matched))
}

/// A core/v1 object of `tenant`, if it exists.
async fn read(
    server: &crate::ApiServer,
    tenant: &Tenant,
    plural: &str,
    namespace: &str,
    name: &str,
) -> Option<Value> {
    let resource = server.resources.find("", "v1", plural)?;
    server
        .store
        .get(tenant, resource, namespace, name, ReadAt::Latest)
        .await
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::load(&SigningKey::generate().expect("generate")).expect("load")
    }

    fn claims(expires_at: i64) -> TokenClaims {
        TokenClaims {
            audiences: vec!["https://h/clusters/a".into()],
            issued_at: 1000,
            expires_at,
            namespace: "team".into(),
            service_account: "reader".into(),
            service_account_uid: "uid-1".into(),
            bound: Some(BoundObject {
                kind: "Pod".into(),
                name: "web-0".into(),
                uid: "pod-uid".into(),
            }),
            id: "jti-1".into(),
        }
    }

    #[test]
    fn a_token_verifies_only_with_its_key_issuer_audience_and_lifetime() {
        let (mine, theirs) = (key(), key());
        let issuer = "https://h/clusters/a";
        let audiences = vec![issuer.to_string()];
        let token = mine.sign(&claims(5000).to_json(issuer)).expect("sign");
        let VerifiedToken::ServiceAccount(parsed) =
            verify_token(&mine, issuer, &audiences, &token, 2000).expect("valid")
        else {
            panic!("a service-account token verified as something else");
        };
        assert_eq!(parsed.service_account, "reader");
        assert_eq!(
            parsed.bound.as_ref().map(|b| b.uid.as_str()),
            Some("pod-uid")
        );
        let user = parsed.user();
        assert_eq!(user.name, "system:serviceaccount:team:reader");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:team",
                AUTHENTICATED
            ]
        );
        assert_eq!(
            user.extra["authentication.kubernetes.io/pod-name"],
            ["web-0"]
        );

        // Another tenant's key, issuer or audience, or an expired token: refused.
        assert!(verify_token(&theirs, issuer, &audiences, &token, 2000).is_err());
        assert!(verify_token(&mine, "https://h/clusters/b", &audiences, &token, 2000).is_err());
        assert!(verify_token(&mine, issuer, &["other".to_string()], &token, 2000).is_err());
        assert!(verify_token(&mine, issuer, &audiences, &token, 5000).is_err());
        // A tampered payload breaks the signature.
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = b64url(claims(99_999).to_json(issuer).to_string().as_bytes());
        parts[1] = &forged;
        assert!(verify_token(&mine, issuer, &audiences, &parts.join("."), 2000).is_err());
    }

    #[test]
    fn a_user_token_names_its_user_and_groups_for_its_issuer_only() {
        let key = key();
        let issuer = "https://h/clusters/a";
        let (token, expires) =
            issue_user_token(&key, issuer, "kubernetes-admin", &["system:masters"], 900)
                .expect("issue");
        let now = now_seconds();
        assert!(expires > now);
        let audiences = vec![issuer.to_string()];
        match verify_token(&key, issuer, &audiences, &token, now).expect("valid") {
            VerifiedToken::User(user) => {
                assert_eq!(user.name, "kubernetes-admin");
                assert_eq!(user.groups, ["system:masters", AUTHENTICATED]);
            }
            other => panic!("not a user token: {other:?}"),
        }
        let other = vec!["https://h/clusters/b".to_string()];
        assert!(verify_token(&key, "https://h/clusters/b", &other, &token, now).is_err());
        assert!(verify_token(&key, issuer, &audiences, &token, expires).is_err());
    }

    #[test]
    fn the_jwks_names_the_key_tokens_carry() {
        let key = key();
        let jwks = key.jwks();
        let entry = &jwks["keys"][0];
        assert_eq!(
            (entry["kty"].as_str(), entry["crv"].as_str()),
            (Some("EC"), Some("P-256"))
        );
        let token = key.sign(&json!({"x": 1})).expect("sign");
        let header: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token.split('.').next().expect("header"))
                .expect("base64"),
        )
        .expect("json");
        assert_eq!(header["kid"], entry["kid"]);
        for coordinate in ["x", "y"] {
            let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(entry[coordinate].as_str().expect("coordinate"))
                .expect("base64");
            assert_eq!(bytes.len(), 32);
        }
    }

    fn bootstrap_secret(expiration: Option<&str>) -> Value {
        let b = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let mut data = json!({
            "token-id": b("abcdef"),
            "token-secret": b("0123456789abcdef"),
            "usage-bootstrap-authentication": b("true"),
            "auth-extra-groups": b("system:bootstrappers:worker,system:masters"),
        });
        if let Some(expiration) = expiration {
            data["expiration"] = json!(b(expiration));
        }
        json!({"type": "bootstrap.kubernetes.io/token", "metadata": {"name": "bootstrap-token-abcdef"}, "data": data})
    }

    #[test]
    fn bootstrap_tokens_follow_their_secret() {
        assert_eq!(
            parse_bootstrap_token("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        for bad in [
            "abcdef.0123456789abcde",
            "ABCDEF.0123456789abcdef",
            "abcdef0123456789abcdef",
        ] {
            assert_eq!(parse_bootstrap_token(bad), None, "{bad}");
        }
        let secret = bootstrap_secret(None);
        let user = bootstrap_user(&secret, "abcdef", "0123456789abcdef", 0).expect("valid");
        assert_eq!(user.name, "system:bootstrap:abcdef");
        // Extra groups outside system:bootstrappers: are ignored, as upstream.
        assert_eq!(
            user.groups,
            [
                "system:bootstrappers",
                "system:bootstrappers:worker",
                AUTHENTICATED
            ]
        );
        assert!(bootstrap_user(&secret, "abcdef", "0123456789abcdee", 0).is_none());
        let expired = bootstrap_secret(Some("2020-01-01T00:00:00Z"));
        assert!(bootstrap_user(&expired, "abcdef", "0123456789abcdef", 1_700_000_000).is_none());
    }
}
