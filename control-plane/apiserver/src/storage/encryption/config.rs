//! Upstream's `EncryptionConfiguration` (`apiserver.config.k8s.io/v1`, the file of
//! `--encryption-provider-config`): its types, its validation with upstream's field paths, and
//! which rule a stored resource falls under.

use base64::Engine;
use serde::Deserialize;

/// The API version the file must carry (`v1`, or the older `v1` of `apiserver.k8s.io`).
const API_VERSIONS: &[&str] = &["apiserver.config.k8s.io/v1", "apiserver.k8s.io/v1"];
/// AES key lengths upstream accepts (AES-128, -192, -256).
const AES_KEY_LENGTHS: &[usize] = &[16, 24, 32];
/// Secretbox's key length.
const SECRETBOX_KEY_LENGTHS: &[usize] = &[32];

/// The file: rules of resources and the providers that encrypt them, in order.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionConfiguration {
    /// `apiVersion`.
    #[serde(default)]
    pub api_version: String,
    /// `kind`.
    #[serde(default)]
    pub kind: String,
    /// The rules, the first matching one applying to a resource.
    #[serde(default)]
    pub resources: Vec<ResourceConfiguration>,
}

/// One rule: resources and their providers (the first encrypts writes; all decrypt reads).
#[derive(Debug, Clone, Deserialize)]
pub struct ResourceConfiguration {
    /// `secrets`, `deployments.apps`, `*.apps`, `*.` (the core group), `*.*` (everything).
    #[serde(default)]
    pub resources: Vec<String>,
    /// The providers, in order.
    #[serde(default)]
    pub providers: Vec<ProviderConfiguration>,
}

/// One provider: exactly one of its fields is set.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ProviderConfiguration {
    /// AES-GCM with a random nonce.
    pub aesgcm: Option<KeysConfiguration>,
    /// AES-CBC with PKCS#7 padding.
    pub aescbc: Option<KeysConfiguration>,
    /// XSalsa20-Poly1305 (NaCl's secretbox).
    pub secretbox: Option<KeysConfiguration>,
    /// No encryption.
    pub identity: Option<serde_json::Value>,
    /// A KMS plugin (`apiVersion: v2` only, as upstream without the `KMSv1` gate).
    pub kms: Option<KmsConfiguration>,
}

/// A `kms` provider: the plugin that encrypts each tenant's data-encryption seed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KmsConfiguration {
    /// `v2` (upstream defaults an absent one to the deprecated `v1`).
    #[serde(default)]
    pub api_version: String,
    /// The provider's name, written into every value it encrypts.
    #[serde(default)]
    pub name: String,
    /// `unix:///path/to/plugin.sock`.
    #[serde(default)]
    pub endpoint: String,
    /// KMS v1 only.
    pub cachesize: Option<i64>,
    /// A Go duration; 3 s when absent.
    pub timeout: Option<String>,
}

/// A validated `kms` provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kms {
    /// The provider's name (`k8s:enc:kms:v2:<name>:`).
    pub name: String,
    /// The plugin's unix socket.
    pub socket: std::path::PathBuf,
    /// How long one call to the plugin may take.
    pub timeout: std::time::Duration,
}

/// The keys of a provider: the first encrypts, every one decrypts.
#[derive(Debug, Clone, Deserialize)]
pub struct KeysConfiguration {
    /// The keys.
    #[serde(default)]
    pub keys: Vec<KeyConfiguration>,
}

/// One named key.
#[derive(Debug, Clone, Deserialize)]
pub struct KeyConfiguration {
    /// Its name, written into every value it encrypts.
    #[serde(default)]
    pub name: String,
    /// Base64 of the key's bytes.
    #[serde(default)]
    pub secret: String,
}

/// A provider as validated: what the transformers are built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// `aesgcm` keys, by name.
    AesGcm(Vec<(String, Vec<u8>)>),
    /// `aescbc` keys, by name.
    AesCbc(Vec<(String, Vec<u8>)>),
    /// `secretbox` keys, by name.
    Secretbox(Vec<(String, Vec<u8>)>),
    /// Plain text.
    Identity,
    /// A KMS v2 plugin.
    Kms(Kms),
}

/// A validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `(group, resource)` patterns; `*` matches any.
    pub resources: Vec<(String, String)>,
    /// Its providers, in order.
    pub providers: Vec<Provider>,
}

impl Rule {
    /// Whether the rule covers `resource` of `group` (`""` for the core group).
    pub fn covers(&self, group: &str, resource: &str) -> bool {
        self.resources
            .iter()
            .any(|(g, r)| (g == "*" || g == group) && (r == "*" || r == resource))
    }
}

/// Reads and validates the file; every problem is named by its field path, upstream's way.
pub fn parse(text: &str) -> Result<Vec<Rule>, String> {
    let config: EncryptionConfiguration = serde_yaml::from_str(text)
        .map_err(|err| format!("not an EncryptionConfiguration: {err}"))?;
    validate(&config)
}

fn decode_keys(
    path: &str,
    keys: &KeysConfiguration,
    lengths: &[usize],
) -> Result<Vec<(String, Vec<u8>)>, String> {
    if keys.keys.is_empty() {
        return Err(format!(
            "{path}.keys: Required value: at least one key is required"
        ));
    }
    let mut decoded: Vec<(String, Vec<u8>)> = Vec::new();
    for (index, key) in keys.keys.iter().enumerate() {
        let key_path = format!("{path}.keys[{index}]");
        if key.name.is_empty() {
            return Err(format!(
                "{key_path}.name: Required value: key name is required"
            ));
        }
        if key.name.contains(':') {
            return Err(format!(
                "{key_path}.name: Invalid value: {:?}: key name must not contain ':'",
                key.name
            ));
        }
        if decoded.iter().any(|(name, _)| *name == key.name) {
            return Err(format!(
                "{key_path}.name: Duplicate value: {:?}: key names must be unique",
                key.name
            ));
        }
        if key.secret.is_empty() {
            return Err(format!(
                "{key_path}.secret: Required value: secret is required"
            ));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(key.secret.trim())
            .map_err(|_| {
                format!(
                    "{key_path}.secret: Invalid value: \"REDACTED\": secrets must be base64 encoded"
                )
            })?;
        if !lengths.contains(&bytes.len()) {
            return Err(format!(
                "{key_path}.secret: Invalid value: \"REDACTED\": secret is not of the expected length, got {}, expected one of {lengths:?}",
                bytes.len()
            ));
        }
        decoded.push((key.name.clone(), bytes));
    }
    Ok(decoded)
}

fn provider(path: &str, config: &ProviderConfiguration) -> Result<Provider, String> {
    let set = [
        config.aesgcm.is_some(),
        config.aescbc.is_some(),
        config.secretbox.is_some(),
        config.identity.is_some(),
        config.kms.is_some(),
    ]
    .iter()
    .filter(|set| **set)
    .count();
    if set == 0 {
        return Err(format!(
            "{path}: Invalid value: provider does not contain any of the expected providers: KMS, AESGCM, AESCBC, Secretbox, Identity"
        ));
    }
    if set > 1 {
        return Err(format!(
            "{path}: Invalid value: more than one provider specified in a single element, should split into different list elements"
        ));
    }
    type Keyed = fn(Vec<(String, Vec<u8>)>) -> Provider;
    let keyed: [(&str, &Option<KeysConfiguration>, &[usize], Keyed); 3] = [
        ("aesgcm", &config.aesgcm, AES_KEY_LENGTHS, Provider::AesGcm),
        ("aescbc", &config.aescbc, AES_KEY_LENGTHS, Provider::AesCbc),
        (
            "secretbox",
            &config.secretbox,
            SECRETBOX_KEY_LENGTHS,
            Provider::Secretbox,
        ),
    ];
    for (name, keys, lengths, make) in keyed {
        if let Some(keys) = keys {
            return Ok(make(decode_keys(&format!("{path}.{name}"), keys, lengths)?));
        }
    }
    if let Some(kms) = &config.kms {
        return Ok(Provider::Kms(validate_kms(&format!("{path}.kms"), kms)?));
    }
    Ok(Provider::Identity)
}

/// Upstream's `validateKMSConfiguration`, with its messages.
fn validate_kms(path: &str, kms: &KmsConfiguration) -> Result<Kms, String> {
    match kms.api_version.as_str() {
        "v2" => {}
        // Upstream's default, and what it refuses unless the `KMSv1` gate is on.
        "" | "v1" => {
            return Err(format!(
                "{path}.apiVersion: Invalid value: \"v1\": KMSv1 is deprecated and will only receive security updates going forward. Use KMSv2 instead.  Set --feature-gates=KMSv1=true to use the deprecated KMSv1 feature."
            ));
        }
        other => {
            return Err(format!(
                "{path}.apiVersion: Invalid value: {other:?}: unsupported apiVersion apiVersion for KMS provider, only v1 and v2 are supported"
            ));
        }
    }
    if kms.name.is_empty() {
        return Err(format!("{path}.name: Required value: name is required"));
    }
    if kms.name.contains(':') {
        return Err(format!(
            "{path}.name: Invalid value: {:?}: should not contain ':' in KMSv2",
            kms.name
        ));
    }
    if let Some(size) = kms.cachesize {
        return Err(format!(
            "{path}.cachesize: Invalid value: {size}: cachesize is not supported in v2"
        ));
    }
    let timeout = match &kms.timeout {
        None => std::time::Duration::from_secs(3),
        Some(text) => match flotilla_api_machinery::goduration::parse(text) {
            Some(duration) if duration > std::time::Duration::ZERO => duration,
            _ => {
                return Err(format!(
                    "{path}.timeout: Invalid value: {text:?}: timeout should be a positive value"
                ));
            }
        },
    };
    if kms.endpoint.is_empty() {
        return Err(format!(
            "{path}.endpoint: Required value: endpoint is required"
        ));
    }
    let socket = match kms.endpoint.split_once("://") {
        Some(("unix", socket)) if socket.starts_with('/') => std::path::PathBuf::from(socket),
        Some(("unix", _)) => {
            return Err(format!(
                "{path}.endpoint: Invalid value: {:?}: the socket's path must be absolute",
                kms.endpoint
            ));
        }
        Some((scheme, _)) => {
            return Err(format!(
                "{path}.endpoint: Invalid value: {:?}: unsupported scheme {scheme:?} for KMS provider",
                kms.endpoint
            ));
        }
        None => {
            return Err(format!(
                "{path}.endpoint: Invalid value: {:?}: unsupported scheme \"\" for KMS provider",
                kms.endpoint
            ));
        }
    };
    Ok(Kms {
        name: kms.name.clone(),
        socket,
        timeout,
    })
}

/// `secrets` → `("", "secrets")`, `deployments.apps` → `("apps", "deployments")`, `*.apps`,
/// `*.` (every core resource), `*.*` (every resource).
fn resource_pattern(path: &str, text: &str) -> Result<(String, String), String> {
    if text.is_empty() {
        return Err(format!("{path}: Required value: resource name is required"));
    }
    if text != text.to_lowercase() {
        return Err(format!(
            "{path}: Invalid value: {text:?}: resource name must be lowercase"
        ));
    }
    if text == "*" {
        return Err(format!(
            "{path}: Invalid value: \"*\": use '*.' to encrypt all the resources from core API group or *.* to encrypt all resources"
        ));
    }
    Ok(match text.split_once('.') {
        None => (String::new(), text.to_string()),
        Some((resource, group)) => (
            if group.is_empty() && resource == "*" {
                String::new()
            } else {
                group.to_string()
            },
            resource.to_string(),
        ),
    })
}

fn validate(config: &EncryptionConfiguration) -> Result<Vec<Rule>, String> {
    if !API_VERSIONS.contains(&config.api_version.as_str())
        || config.kind != "EncryptionConfiguration"
    {
        return Err(format!(
            "apiVersion/kind: Invalid value: \"{}/{}\": expected apiserver.config.k8s.io/v1 EncryptionConfiguration",
            config.api_version, config.kind
        ));
    }
    if config.resources.is_empty() {
        return Err(
            "resources: Required value: at least one resourceConfig is required".to_string(),
        );
    }
    let mut rules: Vec<Rule> = Vec::new();
    for (index, rule) in config.resources.iter().enumerate() {
        let path = format!("resources[{index}]");
        if rule.resources.is_empty() {
            return Err(format!(
                "{path}.resources: Required value: at least one resource is required"
            ));
        }
        if rule.providers.is_empty() {
            return Err(format!(
                "{path}.providers: Required value: at least one provider is required"
            ));
        }
        let resources = rule
            .resources
            .iter()
            .enumerate()
            .map(|(i, text)| resource_pattern(&format!("{path}.resources[{i}]"), text))
            .collect::<Result<Vec<_>, _>>()?;
        let providers = rule
            .providers
            .iter()
            .enumerate()
            .map(|(i, p)| provider(&format!("{path}.providers[{i}]"), p))
            .collect::<Result<Vec<_>, _>>()?;
        // A KMS provider's name is in every value it writes: unique across the whole file,
        // as upstream checks it.
        for (i, provider) in providers.iter().enumerate() {
            let Provider::Kms(kms) = provider else {
                continue;
            };
            let earlier = rules
                .iter()
                .flat_map(|rule| &rule.providers)
                .chain(&providers[..i]);
            if earlier
                .filter_map(|p| match p {
                    Provider::Kms(other) => Some(other),
                    _ => None,
                })
                .any(|other| other.name == kms.name)
            {
                return Err(format!(
                    "{path}.providers[{i}].kms.name: Duplicate value: \"duplicate KMS provider name {:?}, names must be unique\"",
                    kms.name
                ));
            }
        }
        rules.push(Rule {
            resources,
            providers,
        });
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY32: &str = "c2VjcmV0IGlzIHNlY3VyZSwgaXMgdGhlIGtleSB0b28="; // 32 bytes

    fn config(rules: &str) -> String {
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n{rules}"
        )
    }

    #[test]
    fn upstreams_example_parses() {
        let rules = parse(&config(&format!(
            "- resources: [secrets, configmaps]\n  providers:\n  - aescbc: {{keys: [{{name: key1, secret: {KEY32}}}]}}\n  - identity: {{}}\n- resources: ['*.apps', '*.']\n  providers: [{{secretbox: {{keys: [{{name: k, secret: {KEY32}}}]}}}}]\n"
        )))
        .expect("valid");
        assert_eq!(rules.len(), 2);
        assert!(rules[0].covers("", "secrets") && rules[0].covers("", "configmaps"));
        assert!(!rules[0].covers("apps", "secrets"));
        assert!(
            matches!(&rules[0].providers[0], Provider::AesCbc(keys) if keys[0].0 == "key1" && keys[0].1.len() == 32)
        );
        assert_eq!(rules[0].providers[1], Provider::Identity);
        assert!(rules[1].covers("apps", "deployments") && rules[1].covers("", "pods"));
        assert!(!rules[1].covers("batch", "jobs"));
        let all = parse(&config(
            "- resources: ['*.*']\n  providers: [{identity: {}}]\n",
        ))
        .expect("valid");
        assert!(all[0].covers("cert-manager.io", "certificates"));
        let one = parse(&config(&format!(
            "- resources: [deployments.apps]\n  providers: [{{aesgcm: {{keys: [{{name: a, secret: {KEY32}}}]}}}}]\n"
        )))
        .expect("valid");
        assert!(one[0].covers("apps", "deployments") && !one[0].covers("apps", "replicasets"));
    }

    #[test]
    fn bad_files_name_the_field() {
        let short = "c2hvcnQ="; // 5 bytes
        for (rules, wanted) in [
            (
                format!("- resources: [secrets]\n  providers: [{{aescbc: {{keys: [{{name: k, secret: {short}}}]}}}}]\n"),
                "resources[0].providers[0].aescbc.keys[0].secret: Invalid value: \"REDACTED\": secret is not of the expected length, got 5",
            ),
            (
                "- resources: [secrets]\n  providers: [{aescbc: {keys: [{name: k, secret: '!!'}]}}]\n".to_string(),
                "secrets must be base64 encoded",
            ),
            (
                format!("- resources: [secrets]\n  providers: [{{aescbc: {{keys: [{{name: k, secret: {KEY32}}}]}}, identity: {{}}}}]\n"),
                "resources[0].providers[0]: Invalid value: more than one provider",
            ),
            (
                "- resources: [secrets]\n  providers: [{}]\n".to_string(),
                "does not contain any of the expected providers",
            ),
            (
                "- resources: [secrets]\n  providers: []\n".to_string(),
                "resources[0].providers: Required value",
            ),
            (
                "- resources: [Secrets]\n  providers: [{identity: {}}]\n".to_string(),
                "resources[0].resources[0]: Invalid value: \"Secrets\"",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {name: k, endpoint: 'unix:///k.sock'}}]\n".to_string(),
                "resources[0].providers[0].kms.apiVersion: Invalid value: \"v1\": KMSv1 is deprecated",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: k}}]\n".to_string(),
                "resources[0].providers[0].kms.endpoint: Required value",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: k, endpoint: 'tcp://1.2.3.4:5'}}]\n".to_string(),
                "kms.endpoint: Invalid value: \"tcp://1.2.3.4:5\": unsupported scheme \"tcp\" for KMS provider",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: 'a:b', endpoint: 'unix:///k.sock'}}]\n".to_string(),
                "kms.name: Invalid value: \"a:b\": should not contain ':' in KMSv2",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: k, endpoint: 'unix:///k.sock', cachesize: 10}}]\n".to_string(),
                "kms.cachesize: Invalid value: 10: cachesize is not supported in v2",
            ),
            (
                "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: k, endpoint: 'unix:///k.sock', timeout: 0s}}]\n".to_string(),
                "kms.timeout: Invalid value: \"0s\": timeout should be a positive value",
            ),
            (
                "- resources: [secrets]\n  providers:\n  - kms: {apiVersion: v2, name: k, endpoint: 'unix:///a.sock'}\n  - kms: {apiVersion: v2, name: k, endpoint: 'unix:///b.sock'}\n".to_string(),
                "resources[0].providers[1].kms.name: Duplicate value",
            ),
            (
                format!("- resources: [secrets]\n  providers: [{{secretbox: {{keys: [{{name: a, secret: {KEY32}}}, {{name: a, secret: {KEY32}}}]}}}}]\n"),
                "keys[1].name: Duplicate value",
            ),
        ] {
            let err = parse(&config(&rules)).expect_err(&rules);
            assert!(err.contains(wanted), "{rules}\n→ {err}");
            // A key's secret never appears in an error.
            assert!(!err.contains(KEY32) && !err.contains(short), "{err}");
        }
        let kms = parse(&config(
            "- resources: [secrets]\n  providers: [{kms: {apiVersion: v2, name: aws, endpoint: 'unix:///run/kms.sock', timeout: 5s}}, {identity: {}}]\n- resources: [configmaps]\n  providers: [{kms: {apiVersion: v2, name: aws2, endpoint: 'unix:///run/kms.sock'}}]\n",
        ))
        .expect("valid");
        assert_eq!(
            kms[0].providers[0],
            Provider::Kms(Kms {
                name: "aws".to_string(),
                socket: "/run/kms.sock".into(),
                timeout: std::time::Duration::from_secs(5),
            })
        );
        assert!(
            matches!(&kms[1].providers[0], Provider::Kms(k) if k.timeout == std::time::Duration::from_secs(3))
        );
        let err = parse("kind: Pod\n").expect_err("not the kind");
        assert!(err.starts_with("apiVersion/kind"), "{err}");
    }
}
