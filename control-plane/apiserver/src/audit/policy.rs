//! The audit `Policy` (upstream `k8s.io/apiserver/pkg/apis/audit/v1` and
//! `pkg/audit/policy`): which requests are recorded at which level, the first matching rule
//! deciding, and which stages are left out.

use std::collections::BTreeSet;

use flotilla_api_machinery::rbac::Attributes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much of a request is recorded (ordered: each level holds the ones before it).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Level {
    /// Nothing.
    #[default]
    None,
    /// Who did what to which object, and the answer's status; no bodies.
    Metadata,
    /// Metadata and the request's body.
    Request,
    /// Metadata and both bodies.
    RequestResponse,
}

/// When in a request's life an event is written.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Stage {
    /// As soon as the request is authenticated, before anything else is done with it.
    RequestReceived,
    /// When a long-running request's headers are sent, before its body (watches, exec…).
    ResponseStarted,
    /// When the whole answer has been sent.
    ResponseComplete,
    /// When the handler panicked.
    Panic,
}

/// One group's resources a rule selects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupResources {
    /// The API group; `""` is the core group.
    #[serde(default)]
    pub group: String,
    /// Resources of the group (`pods`, `pods/log`, `pods/*`, `*/scale`, `*`); none selects
    /// every resource of the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Object names; none selects every object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_names: Vec<String>,
}

/// One rule: a level for the requests it selects. Every list left empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRule {
    /// The level of the requests the rule selects.
    pub level: Level,
    /// User names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    /// Groups, one of which the user must be in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_groups: Vec<String>,
    /// Verbs (`get`, `list`, `watch`, `create`, … for resources; lowercased methods otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verbs: Vec<String>,
    /// Resources; set, the rule selects resource requests only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<GroupResources>,
    /// Namespaces (`""` for cluster-scoped objects); set, the rule selects resource requests
    /// only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Paths of non-resource requests (`/healthz`, `/api*`); set, the rule selects those only.
    #[serde(
        default,
        rename = "nonResourceURLs",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub non_resource_urls: Vec<String>,
    /// Stages not written for the requests this rule selects, besides the policy's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<Stage>,
    /// Whether `managedFields` are left out of the recorded bodies (the policy's choice when
    /// unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omit_managed_fields: Option<bool>,
}

/// The object meta a policy file may carry (ignored, as upstream ignores it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyMeta {
    /// The policy's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// An audit policy (`audit.k8s.io/v1` `Policy`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// `audit.k8s.io/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// `Policy`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<PolicyMeta>,
    /// The rules, in order: the first that selects a request decides its level; a request no
    /// rule selects is not recorded.
    pub rules: Vec<PolicyRule>,
    /// Stages never written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omit_stages: Vec<Stage>,
    /// Whether `managedFields` are left out of recorded bodies.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omit_managed_fields: bool,
}

/// What a policy decides for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The level.
    pub level: Level,
    /// Stages not written.
    pub omit_stages: BTreeSet<Stage>,
    /// Whether `managedFields` are left out of the bodies.
    pub omit_managed_fields: bool,
}

impl Decision {
    /// Nothing recorded.
    pub fn none() -> Self {
        Decision {
            level: Level::None,
            omit_stages: BTreeSet::new(),
            omit_managed_fields: false,
        }
    }

    /// The decision that records what either records: the higher level, the stages both
    /// omit (a policy that records nothing omits nothing of the other's).
    pub fn union(self, other: Decision) -> Decision {
        match (self.level, other.level) {
            (_, Level::None) => self,
            (Level::None, _) => other,
            _ => Decision {
                level: self.level.max(other.level),
                omit_stages: self
                    .omit_stages
                    .intersection(&other.omit_stages)
                    .copied()
                    .collect(),
                omit_managed_fields: self.omit_managed_fields && other.omit_managed_fields,
            },
        }
    }
}

/// The API versions a policy may name (upstream removed `v1alpha1` and `v1beta1`).
const API_VERSION: &str = "audit.k8s.io/v1";

impl Policy {
    /// Reads a policy file's text (YAML or JSON), checked as upstream checks it.
    pub fn parse(text: &str) -> Result<Policy, String> {
        let policy: Policy = serde_yaml::from_str(text).map_err(|err| err.to_string())?;
        if policy.api_version != API_VERSION {
            return Err(format!(
                "apiVersion {:?} is not served: use {API_VERSION}",
                policy.api_version
            ));
        }
        if policy.kind != "Policy" {
            return Err(format!("kind {:?} is not Policy", policy.kind));
        }
        policy.validate()?;
        if policy.rules.is_empty() {
            return Err("a policy needs at least one rule".to_string());
        }
        Ok(policy)
    }

    /// Upstream's validation: the first error, with its field path.
    pub fn validate(&self) -> Result<(), String> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.validate().map_err(|why| format!("rules[{i}].{why}"))?;
        }
        Ok(())
    }

    /// The level, stages and body trimming for the request `attributes` describe.
    pub fn decide(&self, attributes: &Attributes) -> Decision {
        let Some(rule) = self.rules.iter().find(|rule| rule.matches(attributes)) else {
            return Decision::none();
        };
        Decision {
            level: rule.level,
            omit_stages: self
                .omit_stages
                .iter()
                .chain(&rule.omit_stages)
                .copied()
                .collect(),
            omit_managed_fields: rule.omit_managed_fields.unwrap_or(self.omit_managed_fields),
        }
    }
}

impl PolicyRule {
    fn validate(&self) -> Result<(), String> {
        if !self.non_resource_urls.is_empty()
            && (!self.resources.is_empty() || !self.namespaces.is_empty())
        {
            return Err(
                "nonResourceURLs: rules cannot apply to both regular resources and non-resource URLs"
                    .to_string(),
            );
        }
        for (i, url) in self.non_resource_urls.iter().enumerate() {
            if !url.starts_with('/') && url != "*" {
                return Err(format!(
                    "nonResourceURLs[{i}]: {url:?}: non-resource URL rules must begin with a '/' character"
                ));
            }
            if url.find('*').is_some_and(|at| at != url.len() - 1) {
                return Err(format!(
                    "nonResourceURLs[{i}]: {url:?}: non-resource URL wildcards '*' must be the final character of the rule"
                ));
            }
        }
        for (i, resources) in self.resources.iter().enumerate() {
            if !resources.group.is_empty()
                && !flotilla_api_machinery::names::is_dns1123_subdomain(&resources.group).is_empty()
            {
                return Err(format!(
                    "resources[{i}].group: {:?}: must be a DNS subdomain",
                    resources.group
                ));
            }
            if !resources.resource_names.is_empty() && resources.resources.is_empty() {
                return Err(format!(
                    "resources[{i}].resourceNames: using resourceNames requires at least one resource"
                ));
            }
        }
        Ok(())
    }

    /// Upstream's `ruleMatches`.
    fn matches(&self, attributes: &Attributes) -> bool {
        let user = &attributes.user;
        if !self.users.is_empty() && !self.users.contains(&user.name) {
            return false;
        }
        if !self.user_groups.is_empty()
            && !user
                .groups
                .iter()
                .any(|group| self.user_groups.contains(group))
        {
            return false;
        }
        if !self.verbs.is_empty() && !self.verbs.contains(&attributes.verb) {
            return false;
        }
        if !self.namespaces.is_empty() || !self.resources.is_empty() {
            return self.matches_resource(attributes);
        }
        if !self.non_resource_urls.is_empty() {
            return !attributes.resource_request
                && self
                    .non_resource_urls
                    .iter()
                    .any(|spec| path_matches(&attributes.path, spec));
        }
        true
    }

    /// Upstream's `ruleMatchesResource`.
    fn matches_resource(&self, attributes: &Attributes) -> bool {
        if !attributes.resource_request {
            return false;
        }
        if !self.namespaces.is_empty() && !self.namespaces.contains(&attributes.namespace) {
            return false;
        }
        if self.resources.is_empty() {
            return true;
        }
        let resource = attributes.resource.as_str();
        let subresource = attributes.subresource.as_str();
        let combined = if subresource.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}/{subresource}")
        };
        self.resources
            .iter()
            .filter(|selected| selected.group == attributes.api_group)
            .any(|selected| {
                if selected.resources.is_empty() {
                    return true;
                }
                if !selected.resource_names.is_empty()
                    && !selected.resource_names.contains(&attributes.name)
                {
                    return false;
                }
                selected.resources.iter().any(|res| {
                    res == &combined
                        || res == "*"
                        || (!subresource.is_empty() && res.strip_prefix("*/") == Some(subresource))
                        || res.strip_suffix("/*") == Some(resource)
                })
            })
    }
}

/// A non-resource path against one of a rule's: `*`, the path itself, or a prefix ending `*`.
fn path_matches(path: &str, spec: &str) -> bool {
    spec == "*"
        || spec == path
        || spec
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_machinery::rbac::UserInfo;

    fn attributes(verb: &str, group: &str, resource: &str, sub: &str, ns: &str) -> Attributes {
        Attributes {
            user: UserInfo {
                name: "alice".into(),
                groups: vec!["system:authenticated".into(), "devs".into()],
                ..Default::default()
            },
            verb: verb.into(),
            namespace: ns.into(),
            api_group: group.into(),
            api_version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: "web".into(),
            resource_request: true,
            path: String::new(),
        }
    }

    fn non_resource(path: &str) -> Attributes {
        Attributes {
            verb: "get".into(),
            resource_request: false,
            path: path.into(),
            ..attributes("get", "", "", "", "")
        }
    }

    const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: ["system:kube-proxy"]
  - level: Metadata
    resources: [{group: "", resources: ["secrets", "configmaps"]}]
  - level: RequestResponse
    resources: [{group: "", resources: ["pods/*"]}]
    omitStages: [ResponseStarted]
  - level: Request
    userGroups: ["devs"]
    verbs: ["create", "update", "patch"]
    namespaces: ["prod"]
  - level: None
    nonResourceURLs: ["/healthz*", "/version"]
  - level: Metadata
    omitManagedFields: true
"#;

    #[test]
    fn the_first_matching_rule_decides() {
        let policy = Policy::parse(POLICY).expect("valid policy");
        let decide = |a: &Attributes| policy.decide(a).level;
        assert_eq!(
            decide(&attributes("get", "", "secrets", "", "prod")),
            Level::Metadata
        );
        assert_eq!(
            decide(&attributes("get", "", "pods", "log", "dev")),
            Level::RequestResponse
        );
        assert_eq!(
            decide(&attributes("create", "apps", "deployments", "", "prod")),
            Level::Request
        );
        assert_eq!(
            decide(&attributes("create", "apps", "deployments", "", "dev")),
            Level::Metadata
        );
        assert_eq!(decide(&non_resource("/healthz/ready")), Level::None);
        assert_eq!(decide(&non_resource("/version")), Level::None);
        assert_eq!(decide(&non_resource("/versions")), Level::Metadata);
        let mut proxy = attributes("list", "", "endpoints", "", "");
        proxy.user.name = "system:kube-proxy".into();
        assert_eq!(decide(&proxy), Level::None);
    }

    #[test]
    fn stages_and_managed_fields_combine_the_policys_and_the_rules() {
        let policy = Policy::parse(POLICY).expect("valid policy");
        let pods = policy.decide(&attributes("get", "", "pods", "exec", ""));
        assert_eq!(
            pods.omit_stages,
            BTreeSet::from([Stage::RequestReceived, Stage::ResponseStarted])
        );
        assert!(!pods.omit_managed_fields);
        let other = policy.decide(&attributes("get", "", "nodes", "", ""));
        assert_eq!(other.omit_stages, BTreeSet::from([Stage::RequestReceived]));
        assert!(other.omit_managed_fields);
    }

    #[test]
    fn resource_forms_match_as_upstreams() {
        let rule = |resources: &[&str], names: &[&str]| PolicyRule {
            level: Level::Metadata,
            resources: vec![GroupResources {
                group: String::new(),
                resources: resources.iter().map(|s| s.to_string()).collect(),
                resource_names: names.iter().map(|s| s.to_string()).collect(),
            }],
            ..Default::default()
        };
        let scale = attributes("update", "", "pods", "scale", "");
        let pod = attributes("get", "", "pods", "", "");
        assert!(rule(&["*/scale"], &[]).matches(&scale));
        assert!(!rule(&["*/scale"], &[]).matches(&pod));
        assert!(rule(&["pods/*"], &[]).matches(&pod));
        assert!(rule(&["pods/scale"], &[]).matches(&scale));
        assert!(!rule(&["pods"], &[]).matches(&scale));
        assert!(rule(&["*"], &["web"]).matches(&pod));
        assert!(!rule(&["*"], &["db"]).matches(&pod));
        assert!(!rule(&["pods"], &[]).matches(&attributes("get", "apps", "pods", "", "")));
        assert!(!rule(&["pods"], &[]).matches(&non_resource("/api")));
    }

    #[test]
    fn bad_policies_are_refused_with_the_field() {
        let refused = |text: &str| Policy::parse(text).expect_err("refused");
        assert!(
            refused("apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules: [{level: None}]")
                .contains("not served")
        );
        assert!(
            refused("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: []")
                .contains("at least one rule")
        );
        assert!(
            refused("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: Loud}]")
                .contains("Loud")
        );
        let both = refused(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None}, {level: None, nonResourceURLs: [/x], namespaces: [a]}]",
        );
        assert!(both.starts_with("rules[1].nonResourceURLs"), "{both}");
        let wildcard = refused(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, nonResourceURLs: [/a*b]}]",
        );
        assert!(wildcard.contains("final character"), "{wildcard}");
        let names = refused(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{group: '', resourceNames: [a]}]}]",
        );
        assert!(names.contains("resources[0].resourceNames"), "{names}");
    }

    #[test]
    fn a_union_records_what_either_records() {
        let decision = |level, omit: &[Stage]| Decision {
            level,
            omit_stages: omit.iter().copied().collect(),
            omit_managed_fields: false,
        };
        let operator = decision(Level::Metadata, &[Stage::RequestReceived]);
        let tenant = decision(Level::RequestResponse, &[]);
        let both = operator.clone().union(tenant);
        assert_eq!(both.level, Level::RequestResponse);
        assert!(both.omit_stages.is_empty());
        let silent = decision(Level::None, &[]);
        assert_eq!(operator.clone().union(silent), operator);
    }
}
