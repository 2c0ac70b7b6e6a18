//! A cluster's PodSecurity admission configuration (upstream's `PodSecurityConfiguration` of
//! `pod-security.admission.config.k8s.io/v1`, with its key names): the levels namespaces
//! without labels get, and the users, namespaces and runtime classes exempt from checks.
//! Unset, it is what upstream ships: `privileged:latest` in every mode, no exemptions. Each
//! cluster's is a setting of the management API, kept in the cluster's record.

use flotilla_api_machinery::pod_security::{Level, LevelVersion, Policy, Version};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One cluster's PodSecurity configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PodSecurityConfiguration {
    /// The policy of namespaces that do not label one.
    #[serde(default)]
    pub defaults: PodSecurityDefaults,
    /// Requests never checked.
    #[serde(default)]
    pub exemptions: PodSecurityExemptions,
}

/// The default level and version of each mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PodSecurityDefaults {
    /// `privileged`, `baseline` or `restricted`.
    #[serde(default = "privileged")]
    pub enforce: String,
    /// `latest` or `v1.N`.
    #[serde(default = "latest", rename = "enforce-version")]
    pub enforce_version: String,
    /// Level for the audit annotation.
    #[serde(default = "privileged")]
    pub audit: String,
    /// Its version.
    #[serde(default = "latest", rename = "audit-version")]
    pub audit_version: String,
    /// Level for warnings.
    #[serde(default = "privileged")]
    pub warn: String,
    /// Its version.
    #[serde(default = "latest", rename = "warn-version")]
    pub warn_version: String,
}

fn privileged() -> String {
    "privileged".into()
}

fn latest() -> String {
    "latest".into()
}

impl Default for PodSecurityDefaults {
    fn default() -> Self {
        PodSecurityDefaults {
            enforce: privileged(),
            enforce_version: latest(),
            audit: privileged(),
            audit_version: latest(),
            warn: privileged(),
            warn_version: latest(),
        }
    }
}

/// What is never checked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodSecurityExemptions {
    /// Requesting users (`system:serviceaccount:ns:name` for service accounts).
    #[serde(default)]
    pub usernames: Vec<String>,
    /// Namespaces.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Pods of these runtime classes.
    #[serde(default)]
    pub runtime_classes: Vec<String>,
}

impl PodSecurityConfiguration {
    /// The default policy, or what is wrong with a level or version (`defaults.enforce: …`).
    pub fn policy(&self) -> Result<Policy, String> {
        let d = &self.defaults;
        let mode = |name: &str, level: &str, version_name: &str, version: &str| {
            let level: Level = level
                .parse()
                .map_err(|e| format!("defaults.{name}: {level:?}: {e}"))?;
            let version: Version = version
                .parse()
                .map_err(|e| format!("defaults.{version_name}: {version:?}: {e}"))?;
            Ok::<_, String>(LevelVersion::new(level, version))
        };
        Ok(Policy {
            enforce: mode("enforce", &d.enforce, "enforce-version", &d.enforce_version)?,
            audit: mode("audit", &d.audit, "audit-version", &d.audit_version)?,
            warn: mode("warn", &d.warn, "warn-version", &d.warn_version)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_is_upstreams_shipped_configuration_and_bad_levels_are_named() {
        let unset: PodSecurityConfiguration = serde_json::from_str("{}").expect("json");
        assert_eq!(unset.policy(), Ok(Policy::default()));
        let set: PodSecurityConfiguration = serde_json::from_value(serde_json::json!({
            "defaults": {"enforce": "baseline", "enforce-version": "v1.30", "warn": "restricted"},
            "exemptions": {"namespaces": ["kube-system"], "runtimeClasses": ["kata"]},
        }))
        .expect("json");
        let policy = set.policy().expect("valid");
        assert_eq!(policy.enforce.to_string(), "baseline:v1.30");
        assert_eq!(policy.warn.to_string(), "restricted:latest");
        let bad = PodSecurityConfiguration {
            defaults: PodSecurityDefaults {
                enforce: "strict".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(
            bad.policy()
                .is_err_and(|e| e.starts_with("defaults.enforce: \"strict\""))
        );
    }
}
