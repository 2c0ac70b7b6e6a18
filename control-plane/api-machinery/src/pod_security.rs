//! Pod Security Standards (`privileged` / `baseline` / `restricted`) as pure checks over a pod's
//! metadata and spec: policy levels and versions from namespace labels, every versioned check,
//! and upstream's forbidden-reason text, ported from `k8s.io/pod-security-admission`
//! (`api/` for levels and versions, `policy/check_*.go` for the checks and their registry,
//! `admission/` for the `violates PodSecurity "level:version": ...` message).
//!
//! The checks live in `baseline` and `restricted`; this file owns the level / version types,
//! the registry that picks each check's variant for a policy version (and the overrides a
//! restricted check places on a baseline one), and message aggregation.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::{
    ContainerPort, Lifecycle, PodSecurityContext, PodSpec, Probe, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::field::{FieldError, Path};

mod baseline;
mod restricted;

/// The namespace label prefix shared by every Pod Security label and audit annotation.
pub const LABEL_PREFIX: &str = "pod-security.kubernetes.io/";
/// Namespace label holding the enforced level.
pub const ENFORCE_LEVEL_LABEL: &str = "pod-security.kubernetes.io/enforce";
/// Namespace label holding the enforced policy version.
pub const ENFORCE_VERSION_LABEL: &str = "pod-security.kubernetes.io/enforce-version";
/// Namespace label holding the audited level.
pub const AUDIT_LEVEL_LABEL: &str = "pod-security.kubernetes.io/audit";
/// Namespace label holding the audited policy version.
pub const AUDIT_VERSION_LABEL: &str = "pod-security.kubernetes.io/audit-version";
/// Namespace label holding the warned level.
pub const WARN_LEVEL_LABEL: &str = "pod-security.kubernetes.io/warn";
/// Namespace label holding the warned policy version.
pub const WARN_VERSION_LABEL: &str = "pod-security.kubernetes.io/warn-version";

/// A Pod Security Standards level (upstream `api.Level`), ordered from least to most strict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Level {
    /// No restrictions.
    Privileged,
    /// Prevents known privilege escalations.
    Baseline,
    /// Current pod hardening best practices; includes every baseline check.
    Restricted,
}

impl Level {
    /// The label value spelling (`"privileged"`, `"baseline"`, `"restricted"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Level {
    type Err = ParseError;

    /// Upstream `ParseLevel`; upstream falls back to `restricted` on error, which
    /// [`policy_to_evaluate`] does.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "privileged" => Ok(Level::Privileged),
            "baseline" => Ok(Level::Baseline),
            "restricted" => Ok(Level::Restricted),
            _ => Err(ParseError::Level {
                value: value.to_string(),
            }),
        }
    }
}

/// A policy version: `v1.N` or `latest` (upstream `api.Version`). `latest` orders after every
/// numbered version, even future ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Version {
    /// `v1.N`, holding the minor number N (upstream accepts major version 1 only).
    V1(u64),
    /// `latest`: the newest rules this build knows.
    Latest,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Version::V1(minor) => write!(f, "v1.{minor}"),
            Version::Latest => f.write_str("latest"),
        }
    }
}

impl FromStr for Version {
    type Err = ParseError;

    /// Upstream `ParseVersion`: `latest` or `v1.N` with no leading zero in N; upstream falls back
    /// to `latest` on error, which [`policy_to_evaluate`] does.
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        if value == "latest" {
            return Ok(Version::Latest);
        }
        let invalid = || ParseError::Version {
            value: value.to_string(),
        };
        let minor = value.strip_prefix("v1.").ok_or_else(invalid)?;
        let well_formed = !minor.is_empty()
            && minor.bytes().all(|b| b.is_ascii_digit())
            && (minor == "0" || !minor.starts_with('0'));
        if !well_formed {
            return Err(invalid());
        }
        minor.parse().map(Version::V1).map_err(|_| invalid())
    }
}

/// Why a namespace label value is not a level or a version; the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not `privileged`, `baseline` or `restricted`.
    #[error("must be one of privileged, baseline, restricted")]
    Level {
        /// The rejected label value.
        value: String,
    },
    /// Not `latest` or `v1.N`.
    #[error(r#"must be "latest" or "v1.x""#)]
    Version {
        /// The rejected label value.
        value: String,
    },
}

/// A level evaluated at a policy version, rendered `restricted:v1.25` (upstream
/// `api.LevelVersion`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LevelVersion {
    /// The level.
    pub level: Level,
    /// The policy version the level's checks are taken from.
    pub version: Version,
}

impl LevelVersion {
    /// `level` at `version`.
    pub fn new(level: Level, version: Version) -> Self {
        LevelVersion { level, version }
    }

    /// Whether two level-versions evaluate alike: both privileged, or equal.
    pub fn equivalent(&self, other: &LevelVersion) -> bool {
        (self.level == Level::Privileged && other.level == Level::Privileged) || self == other
    }
}

impl fmt::Display for LevelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.level, self.version)
    }
}

/// The three modes a namespace's labels configure (upstream `api.Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// Violations reject the request.
    pub enforce: LevelVersion,
    /// Violations are recorded in the audit annotation `pod-security.kubernetes.io/audit-violations`.
    pub audit: LevelVersion,
    /// Violations are returned as warnings.
    pub warn: LevelVersion,
}

impl Default for Policy {
    /// Upstream's default admission configuration: `privileged:latest` in every mode.
    fn default() -> Self {
        let privileged = LevelVersion::new(Level::Privileged, Version::Latest);
        Policy {
            enforce: privileged,
            audit: privileged,
            warn: privileged,
        }
    }
}

/// Resolves a namespace's labels to the policy to evaluate (upstream `PolicyToEvaluate`): labels
/// override `defaults`; an invalid enforce level becomes `restricted`, an invalid audit or warn
/// level `privileged` (fail open), an invalid version `latest`, and each invalid value is reported
/// as `metadata.labels[<label>]: Invalid value`. Warn follows an explicitly set, stricter enforce
/// level (and its version) unless warn is labelled itself.
pub fn policy_to_evaluate(
    labels: &BTreeMap<String, String>,
    defaults: Policy,
) -> (Policy, Vec<FieldError>) {
    let mut policy = defaults;
    let mut errors = Vec::new();

    let enforce_level = parse_label::<Level>(labels, ENFORCE_LEVEL_LABEL, &mut errors);
    if let Some(parsed) = enforce_level {
        policy.enforce.level = parsed.unwrap_or(Level::Restricted);
    }
    if let Some(parsed) = parse_label::<Version>(labels, ENFORCE_VERSION_LABEL, &mut errors) {
        policy.enforce.version = parsed.unwrap_or(Version::Latest);
    }
    if let Some(parsed) = parse_label::<Level>(labels, AUDIT_LEVEL_LABEL, &mut errors) {
        policy.audit.level = parsed.unwrap_or(Level::Privileged);
    }
    if let Some(parsed) = parse_label::<Version>(labels, AUDIT_VERSION_LABEL, &mut errors) {
        policy.audit.version = parsed.unwrap_or(Version::Latest);
    }
    let warn_level = parse_label::<Level>(labels, WARN_LEVEL_LABEL, &mut errors);
    if let Some(parsed) = warn_level {
        policy.warn.level = parsed.unwrap_or(Level::Privileged);
    }
    let warn_version = parse_label::<Version>(labels, WARN_VERSION_LABEL, &mut errors);
    if let Some(parsed) = warn_version {
        policy.warn.version = parsed.unwrap_or(Version::Latest);
    }

    let has_enforce_level = matches!(enforce_level, Some(Ok(_)));
    let (has_warn_level, has_warn_version) = (warn_level.is_some(), warn_version.is_some());
    if !has_warn_level && has_enforce_level && policy.enforce.level > policy.warn.level {
        policy.warn.level = policy.enforce.level;
        if !has_warn_version {
            policy.warn.version = policy.enforce.version;
        }
    }
    (policy, errors)
}

/// `label`'s value parsed, when the label is present; a bad value is reported as upstream's
/// `field.Invalid` on `metadata.labels[<label>]`.
fn parse_label<T: FromStr<Err = ParseError>>(
    labels: &BTreeMap<String, String>,
    label: &str,
    errors: &mut Vec<FieldError>,
) -> Option<Result<T, ()>> {
    let value = labels.get(label)?;
    Some(value.parse::<T>().map_err(|error| {
        let path = Path::new("metadata").child("labels").key(label);
        errors.push(FieldError::invalid(
            &path,
            value.as_str(),
            error.to_string(),
        ));
    }))
}

/// Why one check forbids a pod (upstream `CheckResult` with `Allowed: false`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Violation {
    /// Short and always shown: `"host ports"`, `"privileged"`.
    pub reason: String,
    /// The offending values, shown in parentheses after the reason; may be empty.
    pub detail: String,
}

/// Runs every check of `level_version` against a pod (upstream `Evaluator.EvaluatePod` with no
/// emulation version), returning the violations in upstream's order: baseline checks by ID, then
/// restricted checks by ID. `privileged` and an allowed pod give an empty list.
///
/// Pass a pod's own metadata and spec, or a template's for workload resources.
pub fn check_pod(
    level_version: LevelVersion,
    pod_metadata: &ObjectMeta,
    pod_spec: &PodSpec,
) -> Vec<Violation> {
    check_pod_emulating(level_version, Version::Latest, pod_metadata, pod_spec)
}

/// [`check_pod`] as a server emulating `emulation_version` evaluates it: versions newer than that
/// (`latest` included) use its rules (upstream `NewEvaluator(checks, &emulationVersion)`).
pub fn check_pod_emulating(
    level_version: LevelVersion,
    emulation_version: Version,
    pod_metadata: &ObjectMeta,
    pod_spec: &PodSpec,
) -> Vec<Violation> {
    if level_version.level == Level::Privileged {
        return Vec::new();
    }
    let version = level_version.version.min(emulation_version);
    let restricted: Vec<&VersionedCheck> = if level_version.level == Level::Restricted {
        restricted::CHECKS
            .iter()
            .filter_map(|check| check.at(version))
            .collect()
    } else {
        Vec::new()
    };
    let overridden = |id: &str| restricted.iter().any(|check| check.overrides.contains(&id));
    baseline::CHECKS
        .iter()
        .filter(|check| !overridden(check.id))
        .filter_map(|check| check.at(version))
        .chain(restricted.iter().copied())
        .filter_map(|check| (check.check)(pod_metadata, pod_spec))
        .collect()
}

/// The reasons alone, comma-separated: `host namespaces, privileged` (upstream
/// `AggregateCheckResult.ForbiddenReason`, used for namespace-wide warnings).
pub fn forbidden_reason(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|violation| violation.reason.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Each reason with its detail in parentheses when it has one:
/// `host ports (8080, 9090), privileged (...)` (upstream `AggregateCheckResult.ForbiddenDetail`).
pub fn forbidden_detail(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|violation| {
            if violation.detail.is_empty() {
                violation.reason.clone()
            } else {
                format!("{} ({})", violation.reason, violation.detail)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What upstream prints after `violates PodSecurity ` / `would violate PodSecurity `:
/// `"restricted:latest": allowPrivilegeEscalation != false (container "c" must set ...), ...`.
pub fn violation_message(level_version: LevelVersion, violations: &[Violation]) -> String {
    format!("\"{level_version}\": {}", forbidden_detail(violations))
}

/// The enforce-mode denial, `violates PodSecurity "...": ...`, carried by the 403 Forbidden.
pub fn denial_message(level_version: LevelVersion, violations: &[Violation]) -> String {
    format!(
        "violates PodSecurity {}",
        violation_message(level_version, violations)
    )
}

/// The warn-mode warning and audit-mode annotation value, `would violate PodSecurity "...": ...`.
pub fn warning_message(level_version: LevelVersion, violations: &[Violation]) -> String {
    format!(
        "would violate PodSecurity {}",
        violation_message(level_version, violations)
    )
}

/// One check and its revisions (upstream `policy.Check`).
struct Check {
    /// Upstream's check ID; checks run in ID order within a level.
    id: &'static str,
    /// Revisions with strictly increasing minimum versions.
    versions: &'static [VersionedCheck],
}

/// One revision of a check (upstream `policy.VersionedCheck`).
struct VersionedCheck {
    /// The first `v1.N` this revision applies to.
    minimum_minor: u64,
    /// `None` when the pod is allowed.
    check: CheckFn,
    /// Baseline check IDs this (restricted) revision replaces while it applies.
    overrides: &'static [&'static str],
}

type CheckFn = fn(&ObjectMeta, &PodSpec) -> Option<Violation>;

/// A revision from `v1.<minimum_minor>` on.
const fn since(minimum_minor: u64, check: CheckFn) -> VersionedCheck {
    overriding(minimum_minor, check, &[])
}

/// A restricted revision that replaces the baseline checks `overrides` while it applies.
const fn overriding(
    minimum_minor: u64,
    check: CheckFn,
    overrides: &'static [&'static str],
) -> VersionedCheck {
    VersionedCheck {
        minimum_minor,
        check,
        overrides,
    }
}

impl Check {
    /// The revision in force at `version`, if the check exists there yet.
    fn at(&self, version: Version) -> Option<&VersionedCheck> {
        self.versions
            .iter()
            .rev()
            .find(|revision| Version::V1(revision.minimum_minor) <= version)
    }
}

/// The fields the checks read from a container, an init container or an ephemeral container
/// (upstream casts `EphemeralContainerCommon` to `Container`; the Rust types differ).
struct ContainerFields<'a> {
    name: &'a str,
    security_context: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    probes: [Option<&'a Probe>; 3],
    lifecycle: Option<&'a Lifecycle>,
}

/// Every container of the pod: init containers, containers, then ephemeral containers
/// (upstream `visitContainers`).
fn containers(spec: &PodSpec) -> impl Iterator<Item = ContainerFields<'_>> {
    let regular = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| ContainerFields {
            name: &c.name,
            security_context: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
            probes: [
                c.liveness_probe.as_ref(),
                c.readiness_probe.as_ref(),
                c.startup_probe.as_ref(),
            ],
            lifecycle: c.lifecycle.as_ref(),
        });
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| ContainerFields {
            name: &c.name,
            security_context: c.security_context.as_ref(),
            ports: c.ports.as_deref().unwrap_or_default(),
            probes: [
                c.liveness_probe.as_ref(),
                c.readiness_probe.as_ref(),
                c.startup_probe.as_ref(),
            ],
            lifecycle: c.lifecycle.as_ref(),
        });
    regular.chain(ephemeral)
}

fn pod_security_context(spec: &PodSpec) -> Option<&PodSecurityContext> {
    spec.security_context.as_ref()
}

/// `spec.os.name == "windows"`: API validation already forbids the Linux-only fields there.
fn is_windows(spec: &PodSpec) -> bool {
    spec.os.as_ref().is_some_and(|os| os.name == "windows")
}

/// `hostUsers: false`: the pod runs in a user namespace (upstream
/// `relaxPolicyForUserNamespacePod`).
fn in_user_namespace(spec: &PodSpec) -> bool {
    spec.host_users == Some(false)
}

/// `"a", "b"` without escaping (upstream `joinQuote`).
fn join_quote<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items
        .into_iter()
        .map(|item| format!("\"{}\"", item.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pluralize(singular: &'static str, plural: &'static str, count: usize) -> &'static str {
    if count == 1 { singular } else { plural }
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[&str]) -> String {
    format!(
        "{} {}",
        pluralize("container", "containers", names.len()),
        join_quote(names)
    )
}

fn violation(reason: &str, detail: String) -> Option<Violation> {
    Some(Violation {
        reason: reason.to_string(),
        detail,
    })
}

/// Pods written as JSON for the check tables.
#[cfg(test)]
mod fixtures {
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::{Value, json};

    use super::{CheckFn, Violation};

    /// `{"metadata": ..., "spec": ...}` as typed metadata and spec; `spec.containers` defaults
    /// to empty.
    pub(super) fn pod(pod: Value) -> (ObjectMeta, PodSpec) {
        let meta = pod.get("metadata").cloned().unwrap_or_else(|| json!({}));
        let mut spec = pod.get("spec").cloned().unwrap_or_else(|| json!({}));
        if spec.get("containers").is_none() {
            spec["containers"] = json!([]);
        }
        let meta = serde_json::from_value(meta).expect("pod metadata");
        let spec = serde_json::from_value(spec).expect("pod spec");
        (meta, spec)
    }

    /// Containers named `names` with the given security contexts (`null` for none).
    pub(super) fn with_contexts(contexts: &[(&str, Value)]) -> Value {
        let containers: Vec<Value> = contexts
            .iter()
            .map(|(name, sc)| {
                if sc.is_null() {
                    json!({"name": name})
                } else {
                    json!({"name": name, "securityContext": sc})
                }
            })
            .collect();
        Value::Array(containers)
    }

    /// Runs one check revision and asserts it forbids the pod with exactly `reason (detail)`.
    #[track_caller]
    pub(super) fn forbids(check: CheckFn, pod_json: Value, reason: &str, detail: &str) {
        let (meta, spec) = pod(pod_json);
        let expected = Violation {
            reason: reason.to_string(),
            detail: detail.to_string(),
        };
        assert_eq!(check(&meta, &spec), Some(expected));
    }

    /// Runs one check revision and asserts it allows the pod.
    #[track_caller]
    pub(super) fn allows(check: CheckFn, pod_json: Value) {
        let (meta, spec) = pod(pod_json);
        assert_eq!(check(&meta, &spec), None);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::fixtures::pod;
    use super::*;

    fn lv(level: Level, version: &str) -> LevelVersion {
        LevelVersion::new(level, version.parse().expect("version"))
    }

    /// A pod that passes `restricted:latest`, changed by `edit`.
    fn restricted_pod(edit: impl FnOnce(&mut Value)) -> Value {
        let mut pod = json!({"spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
            }}],
        }});
        edit(&mut pod);
        pod
    }

    fn reasons(level_version: LevelVersion, pod_json: &Value) -> Vec<String> {
        let (meta, spec) = pod(pod_json.clone());
        check_pod(level_version, &meta, &spec)
            .into_iter()
            .map(|violation| violation.reason)
            .collect()
    }

    #[test]
    fn levels_parse_like_upstream() {
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert_eq!(level.as_str().parse::<Level>(), Ok(level));
        }
        let error = "Restricted".parse::<Level>().expect_err("case matters");
        assert_eq!(
            error.to_string(),
            "must be one of privileged, baseline, restricted"
        );
    }

    #[test]
    fn versions_parse_like_upstream() {
        let successes = [
            ("latest", Version::Latest),
            ("v1.0", Version::V1(0)),
            ("v1.1", Version::V1(1)),
            ("v1.20", Version::V1(20)),
            ("v1.10000", Version::V1(10000)),
        ];
        for (text, version) in successes {
            assert_eq!(text.parse::<Version>(), Ok(version), "{text}");
            assert_eq!(version.to_string(), text);
        }
        for text in [
            "foo", "", "v2.0", "v1", "1.1", "v1.01", "v1.", "v1.x", "v1.-1",
        ] {
            let error = text.parse::<Version>().expect_err(text);
            assert_eq!(error.to_string(), r#"must be "latest" or "v1.x""#);
        }
        assert!(Version::V1(9) < Version::V1(10));
        assert!(Version::V1(10_000) < Version::Latest);
        assert_eq!(
            lv(Level::Restricted, "v1.25").to_string(),
            "restricted:v1.25"
        );
    }

    #[test]
    fn level_versions_equivalent_when_both_privileged() {
        assert!(lv(Level::Privileged, "v1.1").equivalent(&lv(Level::Privileged, "latest")));
        assert!(!lv(Level::Baseline, "v1.1").equivalent(&lv(Level::Baseline, "latest")));
        assert!(lv(Level::Baseline, "v1.1").equivalent(&lv(Level::Baseline, "v1.1")));
    }

    #[test]
    fn policy_from_namespace_labels() {
        let privileged = lv(Level::Privileged, "latest");
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v.to_string()))
                .collect()
        };
        let policy = |enforce, warn, audit| Policy {
            enforce,
            warn,
            audit,
        };
        let cases = [
            (
                labels(&[("enforce", "baseline")]),
                policy(
                    lv(Level::Baseline, "latest"),
                    lv(Level::Baseline, "latest"),
                    privileged,
                ),
            ),
            (
                labels(&[("warn", "restricted")]),
                policy(privileged, lv(Level::Restricted, "latest"), privileged),
            ),
            (
                labels(&[("enforce", "baseline"), ("enforce-version", "v1.22")]),
                policy(
                    lv(Level::Baseline, "v1.22"),
                    lv(Level::Baseline, "v1.22"),
                    privileged,
                ),
            ),
            (
                labels(&[
                    ("enforce", "baseline"),
                    ("enforce-version", "v1.22"),
                    ("warn-version", "latest"),
                ]),
                policy(
                    lv(Level::Baseline, "v1.22"),
                    lv(Level::Baseline, "latest"),
                    privileged,
                ),
            ),
            (
                labels(&[("enforce", "baseline"), ("warn", "privileged")]),
                policy(lv(Level::Baseline, "latest"), privileged, privileged),
            ),
            (
                labels(&[
                    ("enforce", "baseline"),
                    ("enforce-version", "v1.20"),
                    ("warn", "restricted"),
                    ("warn-version", "v1.21"),
                    ("audit", "restricted"),
                    ("audit-version", "v1.22"),
                ]),
                policy(
                    lv(Level::Baseline, "v1.20"),
                    lv(Level::Restricted, "v1.21"),
                    lv(Level::Restricted, "v1.22"),
                ),
            ),
        ];
        for (labels, expected) in cases {
            assert_eq!(
                policy_to_evaluate(&labels, Policy::default()),
                (expected, vec![])
            );
        }

        let (resolved, errors) =
            policy_to_evaluate(&labels(&[("enforce", "foo")]), Policy::default());
        assert_eq!(
            resolved,
            policy(lv(Level::Restricted, "latest"), privileged, privileged)
        );
        let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            messages,
            [
                r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "foo": must be one of privileged, baseline, restricted"#
            ]
        );

        let (resolved, errors) = policy_to_evaluate(
            &labels(&[
                ("enforce", "baseline"),
                ("warn", "foo"),
                ("audit-version", "v2"),
            ]),
            Policy::default(),
        );
        assert_eq!(
            resolved,
            policy(lv(Level::Baseline, "latest"), privileged, privileged)
        );
        assert_eq!(errors.len(), 2);
        assert!(
            errors[0]
                .to_string()
                .contains(r#"audit-version]: Invalid value: "v2": must be "latest" or "v1.x""#)
        );
    }

    #[test]
    fn checks_are_registered_in_upstream_order() {
        for table in [baseline::CHECKS, restricted::CHECKS] {
            let ids: Vec<&str> = table.iter().map(|check| check.id).collect();
            let mut sorted = ids.clone();
            sorted.sort_unstable();
            assert_eq!(ids, sorted);
            for check in table {
                let minimums: Vec<u64> = check.versions.iter().map(|v| v.minimum_minor).collect();
                assert!(minimums.windows(2).all(|w| w[0] < w[1]), "{}", check.id);
            }
        }
        for check in restricted::CHECKS {
            for id in check.versions.iter().flat_map(|v| v.overrides) {
                assert!(baseline::CHECKS.iter().any(|b| b.id == *id), "{id}");
            }
        }
    }

    #[test]
    fn privileged_pod_under_restricted_latest() {
        let (meta, spec) = pod(json!({"spec": {"containers": [
            {"name": "c", "securityContext": {"privileged": true}},
        ]}}));
        let level_version = lv(Level::Restricted, "latest");
        let violations = check_pod(level_version, &meta, &spec);
        assert_eq!(
            denial_message(level_version, &violations),
            concat!(
                r#"violates PodSecurity "restricted:latest": "#,
                r#"privileged (container "c" must not set securityContext.privileged=true), "#,
                r#"allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), "#,
                r#"unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), "#,
                r#"runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), "#,
                r#"seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#,
            )
        );
        assert_eq!(
            forbidden_reason(&violations),
            "privileged, allowPrivilegeEscalation != false, unrestricted capabilities, runAsNonRoot != true, seccompProfile"
        );
        let baseline = lv(Level::Baseline, "v1.30");
        assert_eq!(
            warning_message(baseline, &check_pod(baseline, &meta, &spec)),
            r#"would violate PodSecurity "baseline:v1.30": privileged (container "c" must not set securityContext.privileged=true)"#
        );
        assert!(check_pod(lv(Level::Privileged, "latest"), &meta, &spec).is_empty());
    }

    #[test]
    fn empty_details_print_the_reason_alone() {
        let violations = [
            Violation {
                reason: "a".into(),
                detail: String::new(),
            },
            Violation {
                reason: "b".into(),
                detail: "x".into(),
            },
        ];
        assert_eq!(forbidden_detail(&violations), "a, b (x)");
        assert_eq!(
            violation_message(lv(Level::Baseline, "v1.2"), &violations),
            r#""baseline:v1.2": a, b (x)"#
        );
    }

    #[test]
    fn compliant_pod_passes_every_version() {
        let compliant = restricted_pod(|_| {});
        for version in (0..=40)
            .map(|minor| format!("v1.{minor}"))
            .chain(["latest".into()])
        {
            for level in [Level::Baseline, Level::Restricted] {
                assert_eq!(
                    reasons(lv(level, &version), &compliant),
                    Vec::<String>::new()
                );
            }
        }
    }

    #[test]
    fn restricted_checks_start_at_their_versions() {
        let restricted = |version: &str| lv(Level::Restricted, version);
        let escalating = restricted_pod(|p| {
            p["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = json!(true)
        });
        assert_eq!(
            reasons(restricted("v1.7"), &escalating),
            Vec::<String>::new()
        );
        assert_eq!(
            reasons(restricted("v1.8"), &escalating),
            ["allowPrivilegeEscalation != false"]
        );

        let root = restricted_pod(|p| p["spec"]["securityContext"]["runAsUser"] = json!(0));
        assert_eq!(reasons(restricted("v1.22"), &root), Vec::<String>::new());
        assert_eq!(reasons(restricted("v1.23"), &root), ["runAsUser=0"]);

        // Before 1.22 restricted applies baseline's capability rule; from 1.22 its own replaces it.
        let sys_admin = restricted_pod(|p| {
            p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                json!(["SYS_ADMIN"])
        });
        assert_eq!(
            reasons(restricted("v1.21"), &sys_admin),
            ["non-default capabilities"]
        );
        assert_eq!(
            reasons(restricted("v1.22"), &sys_admin),
            ["unrestricted capabilities"]
        );
        assert_eq!(
            reasons(lv(Level::Baseline, "latest"), &sys_admin),
            ["non-default capabilities"]
        );

        // Before 1.19 seccomp is baseline's annotation rule, which an unset profile passes.
        let no_seccomp = restricted_pod(|p| {
            p["spec"]["securityContext"]["seccompProfile"] = Value::Null;
            p["metadata"] =
                json!({"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}});
        });
        let (meta, spec) = pod(no_seccomp.clone());
        assert_eq!(
            check_pod(restricted("v1.18"), &meta, &spec),
            [Violation {
                reason: "seccompProfile".into(),
                detail:
                    r#"forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined""#
                        .into(),
            }]
        );
        assert_eq!(
            reasons(restricted("v1.19"), &no_seccomp),
            ["seccompProfile"]
        );

        // Windows pods skip the Linux-only fields from 1.25.
        let windows = json!({"spec": {
            "os": {"name": "windows"},
            "securityContext": {"runAsNonRoot": true},
            "containers": [{"name": "c"}],
        }});
        assert_eq!(
            reasons(restricted("v1.24"), &windows),
            [
                "allowPrivilegeEscalation != false",
                "unrestricted capabilities",
                "seccompProfile"
            ]
        );
        assert_eq!(reasons(restricted("v1.25"), &windows), Vec::<String>::new());
    }

    #[test]
    fn restricted_volumes_replace_host_path_volumes() {
        let host_path = restricted_pod(|p| {
            p["spec"]["volumes"] = json!([{"name": "h", "hostPath": {"path": "/"}}])
        });
        assert_eq!(
            reasons(lv(Level::Baseline, "latest"), &host_path),
            ["hostPath volumes"]
        );
        assert_eq!(
            reasons(lv(Level::Restricted, "v1.0"), &host_path),
            ["restricted volume types"]
        );
    }

    #[test]
    fn user_namespaces_relax_from_1_35() {
        let in_userns = restricted_pod(|p| {
            p["spec"]["hostUsers"] = json!(false);
            p["spec"]["securityContext"]["runAsNonRoot"] = json!(false);
            p["spec"]["securityContext"]["runAsUser"] = json!(0);
            p["spec"]["containers"][0]["securityContext"]["procMount"] = json!("Unmasked");
        });
        assert_eq!(
            reasons(lv(Level::Restricted, "v1.34"), &in_userns),
            ["procMount", "runAsNonRoot != true", "runAsUser=0"]
        );
        // Restricted keeps the unconditional procMount rule, now as procMount_restricted.
        assert_eq!(
            reasons(lv(Level::Restricted, "v1.35"), &in_userns),
            ["procMount"]
        );
        assert_eq!(
            reasons(lv(Level::Baseline, "v1.34"), &in_userns),
            ["procMount"]
        );
        assert_eq!(
            reasons(lv(Level::Baseline, "v1.35"), &in_userns),
            Vec::<String>::new()
        );
    }

    #[test]
    fn baseline_revisions_follow_versions() {
        let baseline = |version: &str| lv(Level::Baseline, version);
        let sysctl = |name: &str| {
            restricted_pod(|p| {
                p["spec"]["securityContext"]["sysctls"] = json!([{"name": name, "value": "1"}])
            })
        };
        for (name, first) in [
            ("net.ipv4.ip_local_reserved_ports", 27),
            ("net.ipv4.tcp_keepalive_time", 29),
            ("net.ipv4.tcp_rmem", 32),
            ("net.ipv4.tcp_notsent_lowat", 37),
        ] {
            let before = format!("v1.{}", first - 1);
            assert_eq!(
                reasons(baseline(&before), &sysctl(name)),
                ["forbidden sysctls"]
            );
            assert_eq!(
                reasons(baseline(&format!("v1.{first}")), &sysctl(name)),
                Vec::<String>::new()
            );
            assert_eq!(
                reasons(baseline("latest"), &sysctl(name)),
                Vec::<String>::new()
            );
        }

        let engine = restricted_pod(|p| {
            p["spec"]["securityContext"]["seLinuxOptions"] = json!({"type": "container_engine_t"})
        });
        assert_eq!(reasons(baseline("v1.30"), &engine), ["seLinuxOptions"]);
        assert_eq!(reasons(baseline("v1.31"), &engine), Vec::<String>::new());

        let unconfined = restricted_pod(|p| {
            p["spec"]["securityContext"]["appArmorProfile"] = json!({"type": "Unconfined"})
        });
        assert_eq!(
            reasons(baseline("v1.0"), &unconfined),
            ["forbidden AppArmor profile"]
        );
    }

    #[test]
    fn probe_host_check_honours_emulation_version() {
        let (meta, spec) = pod(json!({"spec": {"containers": [
            {"name": "c", "startupProbe": {"httpGet": {"port": 80, "host": "localhost"}}},
        ]}}));
        let baseline = |version: &str| lv(Level::Baseline, version);
        assert!(check_pod(baseline("v1.33"), &meta, &spec).is_empty());
        assert_eq!(check_pod(baseline("v1.34"), &meta, &spec).len(), 1);
        assert_eq!(check_pod(baseline("latest"), &meta, &spec).len(), 1);
        for (emulated, active) in [(Version::V1(34), true), (Version::V1(33), false)] {
            for version in ["latest", "v1.34"] {
                let violations = check_pod_emulating(baseline(version), emulated, &meta, &spec);
                assert_eq!(!violations.is_empty(), active, "{emulated} {version}");
            }
        }
    }
}
