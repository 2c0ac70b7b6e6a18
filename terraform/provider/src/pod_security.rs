//! The `pod_security` block of `flotilla_cluster`: the cluster's Pod Security admission
//! defaults and exemptions (the management API's `podSecurity`, upstream's
//! `PodSecurityConfiguration`: a namespace without `pod-security.kubernetes.io/*` labels gets
//! these levels). Every attribute is optional; what the configuration leaves out is
//! upstream's default (`privileged`, `latest`, no exemptions) and stays null in the state.

use serde::{Deserialize, Serialize};
use tf_provider::AttributePath;
use tf_provider::schema::{AttributeConstraint, AttributeType, Block, Description};
use tf_provider::value::{Value, ValueList, ValueString};

use crate::common::{attribute, owned};

/// The levels of the Pod Security Standards.
const LEVELS: [&str; 3] = ["privileged", "baseline", "restricted"];

/// The block's attributes (Terraform's names).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodSecurityState<'a> {
    #[serde(borrow = "'a")]
    enforce: ValueString<'a>,
    enforce_version: ValueString<'a>,
    audit: ValueString<'a>,
    audit_version: ValueString<'a>,
    warn: ValueString<'a>,
    warn_version: ValueString<'a>,
    exempt_usernames: ValueList<ValueString<'a>>,
    exempt_namespaces: ValueList<ValueString<'a>>,
    exempt_runtime_classes: ValueList<ValueString<'a>>,
}

/// (Terraform name, the API's name under `defaults`, its default).
const MODES: [(&str, &str, &str); 6] = [
    ("enforce", "enforce", "privileged"),
    ("enforce_version", "enforce-version", "latest"),
    ("audit", "audit", "privileged"),
    ("audit_version", "audit-version", "latest"),
    ("warn", "warn", "privileged"),
    ("warn_version", "warn-version", "latest"),
];

/// (Terraform name, the API's name under `exemptions`).
const EXEMPTIONS: [(&str, &str); 3] = [
    ("exempt_usernames", "usernames"),
    ("exempt_namespaces", "namespaces"),
    ("exempt_runtime_classes", "runtimeClasses"),
];

impl<'a> PodSecurityState<'a> {
    fn mode(&self, name: &str) -> &ValueString<'a> {
        match name {
            "enforce" => &self.enforce,
            "enforce_version" => &self.enforce_version,
            "audit" => &self.audit,
            "audit_version" => &self.audit_version,
            "warn" => &self.warn,
            _ => &self.warn_version,
        }
    }

    fn mode_mut(&mut self, name: &str) -> &mut ValueString<'a> {
        match name {
            "enforce" => &mut self.enforce,
            "enforce_version" => &mut self.enforce_version,
            "audit" => &mut self.audit,
            "audit_version" => &mut self.audit_version,
            "warn" => &mut self.warn,
            _ => &mut self.warn_version,
        }
    }

    fn exemptions(&self, name: &str) -> &ValueList<ValueString<'a>> {
        match name {
            "exempt_usernames" => &self.exempt_usernames,
            "exempt_namespaces" => &self.exempt_namespaces,
            _ => &self.exempt_runtime_classes,
        }
    }

    fn exemptions_mut(&mut self, name: &str) -> &mut ValueList<ValueString<'a>> {
        match name {
            "exempt_usernames" => &mut self.exempt_usernames,
            "exempt_namespaces" => &mut self.exempt_namespaces,
            _ => &mut self.exempt_runtime_classes,
        }
    }
}

/// The block's schema.
pub fn block() -> Block {
    use AttributeConstraint::Optional;
    let string = || AttributeType::String;
    let list = || AttributeType::List(AttributeType::String.into());
    let attributes = [
        ("enforce", attribute(string(), Optional, "Level pods are refused above: privileged (default), baseline or restricted.")),
        ("enforce_version", attribute(string(), Optional, "The Pod Security Standards version enforced: latest (default) or v1.N.")),
        ("audit", attribute(string(), Optional, "Level recorded in audit annotations (default privileged).")),
        ("audit_version", attribute(string(), Optional, "Its version (default latest).")),
        ("warn", attribute(string(), Optional, "Level warned about (default privileged).")),
        ("warn_version", attribute(string(), Optional, "Its version (default latest).")),
        ("exempt_usernames", attribute(list(), Optional, "Users whose requests are never checked (system:serviceaccount:NS:NAME for a service account).")),
        ("exempt_namespaces", attribute(list(), Optional, "Namespaces never checked.")),
        ("exempt_runtime_classes", attribute(list(), Optional, "Pods of these RuntimeClasses are never checked.")),
    ]
    .into_iter()
    .map(|(name, attribute)| (name.to_string(), attribute))
    .collect();
    Block {
        version: 1,
        description: Description::plain(
            "Pod Security admission for namespaces that do not label their own levels (updated in place; leaving the block out is privileged everywhere, as upstream ships).",
        ),
        attributes,
        ..Default::default()
    }
}

/// The management API's `podSecurity` for the block (none: upstream's defaults).
pub fn request(block: Option<&PodSecurityState<'_>>) -> serde_json::Value {
    let mut defaults = serde_json::Map::new();
    for (name, api, default) in MODES {
        let value = block
            .and_then(|b| b.mode(name).as_deref_option())
            .unwrap_or(default);
        defaults.insert(api.into(), value.into());
    }
    let mut exemptions = serde_json::Map::new();
    for (name, api) in EXEMPTIONS {
        let values: Vec<&str> = block
            .and_then(|b| b.exemptions(name).as_ref_option())
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_deref_option())
            .collect();
        exemptions.insert(api.into(), values.into());
    }
    serde_json::json!({"defaults": defaults, "exemptions": exemptions})
}

/// The block's state from a cluster document. What `prior` (the configuration or the
/// earlier state) left null stays null while the API holds the default; a value someone
/// changed outside Terraform shows as drift.
pub fn state_of<'a>(
    cluster: &serde_json::Value,
    prior: &Value<PodSecurityState<'a>>,
) -> Value<PodSecurityState<'a>> {
    let api = &cluster["podSecurity"];
    let mode = |api_name: &str, default: &str| -> Option<String> {
        api["defaults"][api_name]
            .as_str()
            .filter(|value| *value != default)
            .map(str::to_string)
    };
    let exempt = |api_name: &str| -> Vec<String> {
        api["exemptions"][api_name]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let prior = prior.as_ref_option();
    let mut state = PodSecurityState::default();
    let mut differs = false;
    for (name, api_name, default) in MODES {
        let set_before = prior.is_some_and(|p| !p.mode(name).is_null());
        let value = mode(api_name, default);
        differs |= value.is_some();
        *state.mode_mut(name) = match value {
            Some(value) => owned(&value),
            None if set_before => owned(default),
            None => Value::Null,
        };
    }
    for (name, api_name) in EXEMPTIONS {
        let set_before = prior.is_some_and(|p| !p.exemptions(name).is_null());
        let values = exempt(api_name);
        differs |= !values.is_empty();
        *state.exemptions_mut(name) = if values.is_empty() && !set_before {
            Value::Null
        } else {
            Value::Value(values.iter().map(|v| owned(v)).collect())
        };
    }
    if prior.is_none() && !differs {
        Value::Null
    } else {
        Value::Value(state)
    }
}

/// The configuration's values the management API would refuse, each with its attribute
/// (unknown values wait for apply).
pub fn problems(config: &Value<PodSecurityState<'_>>) -> Vec<(String, AttributePath)> {
    let Some(block) = config.as_ref_option() else {
        return Vec::new();
    };
    let path = |name: &'static str| AttributePath::new("pod_security").index(0).attribute(name);
    let mut problems = Vec::new();
    for (name, _, _) in MODES {
        let Some(value) = block.mode(name).as_deref_option() else {
            continue;
        };
        let problem = if name.ends_with("_version") {
            (!is_version(value)).then(|| {
                format!("{value:?} is not a Pod Security Standards version: use latest or v1.N")
            })
        } else {
            (!LEVELS.contains(&value)).then(|| {
                format!(
                    "{value:?} is not a Pod Security level: use privileged, baseline or restricted"
                )
            })
        };
        if let Some(problem) = problem {
            problems.push((problem, path(name)));
        }
    }
    problems
}

/// `latest` or `v1.N` (upstream's `ParseVersion`).
fn is_version(text: &str) -> bool {
    text == "latest"
        || text.strip_prefix("v1.").is_some_and(|minor| {
            !minor.is_empty()
                && minor.bytes().all(|b| b.is_ascii_digit())
                && (minor == "0" || !minor.starts_with('0'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn configured() -> PodSecurityState<'static> {
        PodSecurityState {
            enforce: owned("baseline"),
            exempt_namespaces: Value::Value(vec![owned("kube-system")]),
            ..Default::default()
        }
    }

    #[test]
    fn the_request_fills_what_the_block_leaves_out_with_upstreams_defaults() {
        assert_eq!(
            request(Some(&configured())),
            json!({"defaults": {"enforce": "baseline", "enforce-version": "latest",
                    "audit": "privileged", "audit-version": "latest",
                    "warn": "privileged", "warn-version": "latest"},
                "exemptions": {"usernames": [], "namespaces": ["kube-system"], "runtimeClasses": []}})
        );
        assert_eq!(request(None)["defaults"]["enforce"], "privileged");
    }

    #[test]
    fn what_was_left_out_stays_null_and_drift_shows() {
        let block = configured();
        let cluster = json!({"podSecurity": request(Some(&block))});
        assert_eq!(
            state_of(&cluster, &Value::Value(block.clone())),
            Value::Value(block)
        );
        // No block, API at the defaults: no block in the state.
        let defaults = json!({"podSecurity": request(None)});
        assert_eq!(state_of(&defaults, &Value::Null), Value::Null);
        // No block, but someone set a level: it shows, and a plan would remove it.
        let drifted = json!({"podSecurity": {"defaults": {"warn": "restricted"}}});
        let state = state_of(&drifted, &Value::Null);
        assert_eq!(
            state.as_ref_option().map(|s| s.warn.clone()),
            Some(owned("restricted"))
        );
    }

    #[test]
    fn bad_levels_and_versions_are_told_at_plan_with_their_attribute() {
        let block = PodSecurityState {
            enforce: owned("strict"),
            warn_version: owned("v1.033"),
            audit_version: owned("v1.30"),
            ..Default::default()
        };
        let found: Vec<String> = problems(&Value::Value(block))
            .into_iter()
            .map(|(problem, _)| problem)
            .collect();
        assert_eq!(
            found,
            [
                "\"strict\" is not a Pod Security level: use privileged, baseline or restricted",
                "\"v1.033\" is not a Pod Security Standards version: use latest or v1.N",
            ]
        );
    }
}
