//! certificates.k8s.io `CertificateSigningRequest`s: upstream's strategies for the resource and
//! its `/status` and `/approval` subresources (`pkg/registry/certificates/certificates`), its
//! validation (`pkg/apis/certificates/validation`), the printed columns, and the
//! `certificateapproval` admission check (approving needs `approve` on the signer).

use base64::Engine;
use flotilla_api_machinery::rbac::UserInfo;
use flotilla_api_machinery::{csr, names};
use serde_json::{Value, json};

use crate::error::{FieldError, Path};
use crate::meta::{self, at, str_at};
use crate::resources::Strategy;
use crate::store::UpdateTarget;
use crate::table::{Column, age_column, human_duration, name_column};

/// The API group.
pub const GROUP: &str = "certificates.k8s.io";
/// `certificates.LegacyUnknownSignerName`, refused by the v1 API.
const LEGACY_UNKNOWN_SIGNER: &str = "kubernetes.io/legacy-unknown";
/// The shortest certificate a request may ask for (`expirationSeconds`).
const MIN_EXPIRATION_SECONDS: i64 = 600;
const APPROVED: &str = "Approved";
const DENIED: &str = "Denied";
const FAILED: &str = "Failed";

/// Every key usage upstream knows (`allValidUsages`), sorted as `sets.List` prints them.
const VALID_USAGES: &[&str] = &[
    "any",
    "cert sign",
    "client auth",
    "code signing",
    "content commitment",
    "crl sign",
    "data encipherment",
    "decipher only",
    "digital signature",
    "email protection",
    "encipher only",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "key agreement",
    "key encipherment",
    "microsoft sgc",
    "netscape sgc",
    "ocsp signing",
    "s/mime",
    "server auth",
    "signing",
    "timestamping",
];

/// The strategy of `certificatesigningrequests` and its subresources.
pub struct CertificateSigningRequestStrategy;

impl Strategy for CertificateSigningRequestStrategy {
    fn prepare_for_create(&self, obj: &mut Value) {
        // Users cannot create pre-approved (or pre-issued) requests.
        meta::set_at(obj, &["status"], json!({}));
        for field in ["username", "uid", "groups", "extra"] {
            meta::remove_at(obj, &["spec", field]);
        }
    }

    fn prepare_for_create_by(&self, obj: &mut Value, user: &UserInfo) {
        // Whatever the client sent, the request is the requester's.
        if !obj.get("spec").is_some_and(Value::is_object) {
            return;
        }
        meta::set_at(obj, &["spec", "username"], json!(user.name));
        if !user.uid.is_empty() {
            meta::set_at(obj, &["spec", "uid"], json!(user.uid));
        }
        if !user.groups.is_empty() {
            meta::set_at(obj, &["spec", "groups"], json!(user.groups));
        }
        if !user.extra.is_empty() {
            meta::set_at(obj, &["spec", "extra"], json!(user.extra));
        }
    }

    fn prepare_for_update_to(&self, target: UpdateTarget, new: &mut Value, old: &Value) {
        // The spec never changes after creation, through any endpoint.
        copy_field(new, old, &["spec"]);
        match target {
            // The main resource changes only metadata.
            UpdateTarget::Main => copy_field(new, old, &["status"]),
            // Status keeps the approval decisions as they were.
            UpdateTarget::Status => {
                preserve_condition_instances(new, old, APPROVED);
                preserve_condition_instances(new, old, DENIED);
                populate_condition_timestamps(new, old);
            }
            // Approval changes only the conditions.
            UpdateTarget::Approval => {
                copy_field(new, old, &["status", "certificate"]);
                populate_condition_timestamps(new, old);
            }
            // Served for pods only.
            UpdateTarget::EphemeralContainers | UpdateTarget::Resize => {}
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_create(obj)
    }

    fn validate_update_to(
        &self,
        target: UpdateTarget,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        let options = Options {
            setting_approval: target == UpdateTarget::Approval,
            setting_certificate: target == UpdateTarget::Status,
            ..Options::for_update(new, old)
        };
        validate_update(new, old, &options)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            age_column(),
            Column::new(
                "SignerName",
                "string",
                "signerName indicates the requested signer, and is a qualified name.",
                |o| {
                    json!(
                        str_at(o, &["spec", "signerName"])
                            .filter(|s| !s.is_empty())
                            .unwrap_or("<none>")
                    )
                },
            ),
            Column::new(
                "Requestor",
                "string",
                "request contains an x509 certificate signing request encoded in a \"CERTIFICATE REQUEST\" PEM block.",
                |o| json!(str_at(o, &["spec", "username"]).unwrap_or("")),
            ),
            Column::new(
                "RequestedDuration",
                "string",
                "expirationSeconds is the requested duration of validity of the issued certificate.",
                |o| match at(o, &["spec", "expirationSeconds"]).and_then(Value::as_i64) {
                    Some(seconds) => json!(human_duration(seconds)),
                    None => json!("<none>"),
                },
            ),
            Column::new(
                "Condition",
                "string",
                "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\".",
                |o| json!(condition_summary(o)),
            ),
        ]
    }
}

fn copy_field(new: &mut Value, old: &Value, path: &[&str]) {
    match at(old, path) {
        Some(value) => meta::set_at(new, path, value.clone()),
        None => {
            meta::remove_at(new, path);
        }
    }
}

fn conditions(obj: &Value) -> &[Value] {
    at(obj, &["status", "conditions"])
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn conditions_of<'a>(obj: &'a Value, kind: &str) -> Vec<&'a Value> {
    conditions(obj)
        .iter()
        .filter(|c| str_at(c, &["type"]) == Some(kind))
        .collect()
}

/// `extractCSRStatus`: `Pending`, `Approved` or `Denied`, then `,Failed` and `,Issued`.
pub fn condition_summary(obj: &Value) -> String {
    let has = |kind: &str| !conditions_of(obj, kind).is_empty();
    let mut status = if has(DENIED) {
        "Denied".to_string()
    } else if has(APPROVED) {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has(FAILED) {
        status.push_str(",Failed");
    }
    if str_at(obj, &["status", "certificate"]).is_some_and(|c| !c.is_empty()) {
        status.push_str(",Issued");
    }
    status
}

/// `preserveConditionInstances`: when the update has as many conditions of `kind` as before,
/// they are the old ones (a different count is left for validation to refuse).
fn preserve_condition_instances(new: &mut Value, old: &Value, kind: &str) {
    let old_instances: Vec<Value> = conditions_of(old, kind).into_iter().cloned().collect();
    let Some(list) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let positions: Vec<usize> = list
        .iter()
        .enumerate()
        .filter(|(_, c)| str_at(c, &["type"]) == Some(kind))
        .map(|(i, _)| i)
        .collect();
    if positions.len() != old_instances.len() {
        return;
    }
    for (position, instance) in positions.into_iter().zip(old_instances) {
        list[position] = instance;
    }
}

/// `populateConditionTimestamps`: a condition without `lastUpdateTime` gets now; without
/// `lastTransitionTime`, the old one of its type when the status is unchanged, else now.
fn populate_condition_timestamps(new: &mut Value, old: &Value) {
    let now = meta::now_rfc3339();
    let old_conditions: Vec<Value> = conditions(old).to_vec();
    let Some(list) = new
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for condition in list.iter_mut().filter(|c| c.is_object()) {
        let unset = |c: &Value, field: &str| c.get(field).is_none_or(Value::is_null);
        if unset(condition, "lastUpdateTime") {
            condition["lastUpdateTime"] = json!(now);
        }
        if unset(condition, "lastTransitionTime") {
            let previous = old_conditions
                .iter()
                .find(|o| o.get("type") == condition.get("type"))
                .filter(|o| o.get("status") == condition.get("status"))
                .and_then(|o| o.get("lastTransitionTime"))
                .filter(|t| !t.is_null())
                .cloned();
            condition["lastTransitionTime"] = previous.unwrap_or_else(|| json!(now));
        }
    }
}

/// Upstream's `certificateValidationOptions`: what an update path may change, and the bad data
/// already stored that is tolerated.
#[derive(Debug, Default, Clone, Copy)]
struct Options {
    setting_approval: bool,
    setting_certificate: bool,
    both_approved_and_denied: bool,
    legacy_signer: bool,
    duplicate_condition_types: bool,
    empty_condition_type: bool,
    arbitrary_certificate: bool,
    unknown_usages: bool,
    duplicate_usages: bool,
}

impl Options {
    /// `getValidationOptions` for an update of `old` to `new`.
    fn for_update(new: &Value, old: &Value) -> Self {
        let usages = usages(old);
        let mut seen = std::collections::BTreeSet::new();
        let mut seen_types = std::collections::BTreeSet::new();
        Options {
            both_approved_and_denied: !conditions_of(old, APPROVED).is_empty()
                && !conditions_of(old, DENIED).is_empty(),
            legacy_signer: str_at(old, &["spec", "signerName"]) == Some(LEGACY_UNKNOWN_SIGNER),
            duplicate_condition_types: conditions(old)
                .iter()
                .any(|c| !seen_types.insert(str_at(c, &["type"]).unwrap_or("").to_string())),
            empty_condition_type: conditions(old)
                .iter()
                .any(|c| str_at(c, &["type"]).unwrap_or("").is_empty()),
            arbitrary_certificate: certificate(new) == certificate(old)
                || csr::validate_certificate(&certificate(old)).is_err(),
            unknown_usages: usages.iter().any(|u| !VALID_USAGES.contains(&u.as_str())),
            duplicate_usages: usages.iter().any(|u| !seen.insert(u.clone())),
            ..Options::default()
        }
    }
}

fn usages(obj: &Value) -> Vec<String> {
    at(obj, &["spec", "usages"])
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|u| u.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A base64 field's bytes (empty when absent or not base64).
fn bytes_at(obj: &Value, path: &[&str]) -> Vec<u8> {
    str_at(obj, path)
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .unwrap_or_default()
}

fn certificate(obj: &Value) -> Vec<u8> {
    bytes_at(obj, &["status", "certificate"])
}

/// The `signers` names that grant a signer (upstream's `IsAuthorizedForSignerName`): its
/// own, and `<domain>/*`.
pub fn signer_names(signer: &str) -> Vec<String> {
    let mut names = vec![signer.to_string()];
    if let Some((domain, _)) = signer.split_once('/') {
        names.push(format!("{domain}/*"));
    }
    names
}

/// The subject organizations (the groups a client certificate would carry) that the
/// request of CertificateSigningRequest `obj` asks for.
pub fn requested_organizations(obj: &Value) -> Result<Vec<String>, String> {
    csr::requested_organizations(&bytes_at(obj, &["spec", "request"])).map_err(|e| e.to_string())
}

/// `ValidateSignerName`: `example.com/signer-name`.
fn validate_signer_name(path: &Path, signer: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if signer.is_empty() {
        errors.push(FieldError::required(path, ""));
        return errors;
    }
    let segments: Vec<&str> = signer.split('/').collect();
    let [domain, name] = segments.as_slice() else {
        errors.push(FieldError::invalid(
            path,
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
        return errors;
    };
    if domain.len() > 253 {
        errors.push(FieldError::too_long(path, 253));
    }
    let labels: Vec<&str> = domain.split('.').collect();
    for label in &labels {
        let problems = names::is_dns1123_label(label);
        if !problems.is_empty() {
            for problem in problems {
                errors.push(FieldError::invalid(
                    path,
                    *domain,
                    format!("validating label {label:?}: {problem}"),
                ));
            }
            break;
        }
    }
    if labels.len() < 2 {
        errors.push(FieldError::invalid(
            path,
            *domain,
            "should be a domain with at least two segments separated by dots",
        ));
    }
    for component in name.split('.') {
        let problems = names::is_dns1123_subdomain(component);
        if !problems.is_empty() {
            for problem in problems {
                errors.push(FieldError::invalid(
                    path,
                    *name,
                    format!("validating component {component:?}: {problem}"),
                ));
            }
            break;
        }
    }
    if signer.len() > 571 {
        errors.push(FieldError::too_long(path, 571));
    }
    errors
}

fn validate_create(obj: &Value) -> Vec<FieldError> {
    validate_request(obj, &Options::default())
}

/// `validateCertificateSigningRequest` (object metadata is the generic store's).
fn validate_request(obj: &Value, options: &Options) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = Path::new("spec");
    if let Err(problem) = csr::parse_csr(&bytes_at(obj, &["spec", "request"])) {
        let given = str_at(obj, &["spec", "request"]).unwrap_or("");
        errors.push(FieldError::invalid(
            &spec.child("request"),
            given,
            problem.to_string(),
        ));
    }
    let usages = usages(obj);
    if usages.is_empty() {
        errors.push(FieldError::required(&spec.child("usages"), ""));
    }
    if !options.unknown_usages {
        for (i, usage) in usages.iter().enumerate() {
            if !VALID_USAGES.contains(&usage.as_str()) {
                errors.push(FieldError::not_supported(
                    &spec.child("usages").index(i),
                    usage.as_str(),
                    VALID_USAGES,
                ));
            }
        }
    }
    if !options.duplicate_usages {
        let mut seen = std::collections::BTreeSet::new();
        for (i, usage) in usages.iter().enumerate() {
            if !seen.insert(usage) {
                errors.push(FieldError::duplicate(
                    &spec.child("usages").index(i),
                    usage.as_str(),
                ));
            }
        }
    }
    let signer = str_at(obj, &["spec", "signerName"]).unwrap_or("");
    if !options.legacy_signer && signer == LEGACY_UNKNOWN_SIGNER {
        errors.push(FieldError::invalid(
            &spec.child("signerName"),
            signer,
            "the legacy signerName is not allowed via this API version",
        ));
    } else {
        errors.extend(validate_signer_name(&spec.child("signerName"), signer));
    }
    if let Some(seconds) = at(obj, &["spec", "expirationSeconds"]).and_then(Value::as_i64)
        && seconds < MIN_EXPIRATION_SECONDS
    {
        errors.push(FieldError::invalid(
            &spec.child("expirationSeconds"),
            seconds,
            "may not specify a duration less than 600 seconds (10 minutes)",
        ));
    }
    errors.extend(validate_conditions(obj, options));
    if !options.arbitrary_certificate
        && let Err(problem) = csr::validate_certificate(&certificate(obj))
    {
        errors.push(FieldError::invalid(
            &Path::new("status").child("certificate"),
            "<certificate data>",
            problem.to_string(),
        ));
    }
    errors
}

/// `validateConditions`.
fn validate_conditions(obj: &Value, options: &Options) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let path = Path::new("status").child("conditions");
    let mut seen = std::collections::BTreeSet::new();
    let (mut approved, mut denied) = (false, false);
    for (i, condition) in conditions(obj).iter().enumerate() {
        let kind = str_at(condition, &["type"]).unwrap_or("");
        if !options.empty_condition_type && kind.is_empty() {
            errors.push(FieldError::required(&path.index(i).child("type"), ""));
        }
        let allowed: &[&str] = if matches!(kind, APPROVED | DENIED | FAILED) {
            &["True"]
        } else {
            &["False", "True", "Unknown"]
        };
        let status = str_at(condition, &["status"]).unwrap_or("");
        if status.is_empty() {
            errors.push(FieldError::required(&path.index(i).child("status"), ""));
        } else if !allowed.contains(&status) {
            errors.push(FieldError::not_supported(
                &path.index(i).child("status"),
                status,
                allowed,
            ));
        }
        if !options.both_approved_and_denied {
            let clash = match kind {
                APPROVED => {
                    approved = true;
                    denied
                }
                DENIED => {
                    denied = true;
                    approved
                }
                _ => false,
            };
            if clash {
                errors.push(FieldError::invalid(
                    &path.index(i).child("type"),
                    kind,
                    "Approved and Denied conditions are mutually exclusive",
                ));
            }
        }
        if !options.duplicate_condition_types && !seen.insert(kind) {
            errors.push(FieldError::duplicate(&path.index(i).child("type"), kind));
        }
    }
    errors
}

/// `validateCertificateSigningRequestUpdate`.
fn validate_update(new: &Value, old: &Value, options: &Options) -> Vec<FieldError> {
    let mut errors = validate_request(new, options);
    let path = Path::new("status").child("conditions");
    for kind in [APPROVED, DENIED, FAILED] {
        if conditions_of(new, kind).len() < conditions_of(old, kind).len() {
            errors.push(FieldError::forbidden(
                &path,
                format!("updates may not remove a condition of type {kind:?}"),
            ));
        }
    }
    if !options.setting_approval {
        for kind in [APPROVED, DENIED] {
            let (before, after) = (conditions_of(old, kind), conditions_of(new, kind));
            if after.len() > before.len() {
                errors.push(FieldError::forbidden(
                    &path,
                    format!("updates may not add a condition of type {kind:?}"),
                ));
            } else if after.len() == before.len() && after != before {
                errors.push(FieldError::forbidden(
                    &path,
                    format!("updates may not modify a condition of type {kind:?}"),
                ));
            }
        }
    }
    let (before, after) = (certificate(old), certificate(new));
    if before != after {
        let path = Path::new("status").child("certificate");
        if !options.setting_certificate {
            errors.push(FieldError::forbidden(
                &path,
                "updates may not set certificate content",
            ));
        } else if !before.is_empty() {
            errors.push(FieldError::forbidden(
                &path,
                "updates may not modify existing certificate content",
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr_pem(cn: &str, org: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, org);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    fn csr(request: &str) -> Value {
        json!({
            "metadata": {"name": "node-csr-1"},
            "spec": {
                "request": base64::engine::general_purpose::STANDARD.encode(request),
                "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
                "usages": ["digital signature", "client auth"],
            },
        })
    }

    fn fields(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(|e| e.field.clone()).collect()
    }

    #[test]
    fn a_signer_is_granted_by_name_or_by_its_domain() {
        assert_eq!(
            signer_names("example.com/issuer"),
            ["example.com/issuer", "example.com/*"]
        );
    }

    #[test]
    fn the_requested_groups_are_read_from_the_request() {
        let pem = csr_pem("alice", "system:masters");
        let csr =
            json!({"spec": {"request": base64::engine::general_purpose::STANDARD.encode(pem)}});
        assert_eq!(
            requested_organizations(&csr),
            Ok(vec!["system:masters".to_string()])
        );
        assert!(
            requested_organizations(&json!({"spec": {"request": "bm90IGEgcmVxdWVzdA=="}})).is_err()
        );
    }

    #[test]
    fn requests_must_be_signed_pem_certificate_requests() {
        let good = csr(&csr_pem("system:node:n1", "system:nodes"));
        assert!(
            validate_create(&good).is_empty(),
            "{:?}",
            validate_create(&good)
        );
        let bad = csr("not a pem");
        let errors = validate_create(&bad);
        assert_eq!(fields(&errors), vec!["spec.request"]);
        assert!(
            errors[0]
                .body()
                .contains("PEM block type must be CERTIFICATE REQUEST")
        );
    }

    #[test]
    fn signer_usages_and_duration_are_checked() {
        let mut obj = csr(&csr_pem("system:node:n1", "system:nodes"));
        obj["spec"]["signerName"] = json!("kubelet");
        obj["spec"]["usages"] = json!(["client auth", "flying", "client auth"]);
        obj["spec"]["expirationSeconds"] = json!(60);
        assert_eq!(
            fields(&validate_create(&obj)),
            vec![
                "spec.usages[1]",
                "spec.usages[2]",
                "spec.signerName",
                "spec.expirationSeconds"
            ]
        );
        obj["spec"]["signerName"] = json!("");
        obj["spec"]["usages"] = json!([]);
        obj["spec"]["expirationSeconds"] = json!(600);
        assert_eq!(
            fields(&validate_create(&obj)),
            vec!["spec.usages", "spec.signerName"]
        );
    }

    #[test]
    fn create_records_the_requester_and_clears_status() {
        let strategy = CertificateSigningRequestStrategy;
        let mut obj = csr(&csr_pem("system:node:n1", "system:nodes"));
        obj["spec"]["username"] = json!("someone-else");
        obj["spec"]["groups"] = json!(["system:masters"]);
        obj["status"] = json!({"conditions": [{"type": "Approved", "status": "True"}]});
        strategy.prepare_for_create(&mut obj);
        let user = UserInfo::new("system:bootstrap:abcdef", &["system:bootstrappers"]);
        strategy.prepare_for_create_by(&mut obj, &user);
        assert_eq!(obj["spec"]["username"], "system:bootstrap:abcdef");
        assert_eq!(obj["spec"]["groups"], json!(["system:bootstrappers"]));
        assert_eq!(obj["status"], json!({}));
    }

    fn approved(obj: &Value) -> Value {
        let mut next = obj.clone();
        next["status"]["conditions"] = json!([{"type": "Approved", "status": "True", "reason": "AutoApproved",
            "lastUpdateTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}]);
        next
    }

    #[test]
    fn approval_changes_only_approval_conditions() {
        let strategy = CertificateSigningRequestStrategy;
        let old = csr(&csr_pem("system:node:n1", "system:nodes"));
        // Through /approval: the condition is taken, spec changes are not, timestamps filled.
        let mut new = approved(&old);
        new["spec"]["signerName"] = json!("example.com/other");
        strategy.prepare_for_update_to(UpdateTarget::Approval, &mut new, &old);
        assert_eq!(new["spec"], old["spec"]);
        assert!(new["status"]["conditions"][0]["lastUpdateTime"].is_string());
        let mut fresh = old.clone();
        fresh["status"]["conditions"] = json!([{"type": "Approved", "status": "True"}]);
        strategy.prepare_for_update_to(UpdateTarget::Approval, &mut fresh, &old);
        assert!(fresh["status"]["conditions"][0]["lastTransitionTime"].is_string());
        assert!(
            strategy
                .validate_update_to(UpdateTarget::Approval, &new, &old)
                .is_empty()
        );
        // Through /status or the main resource an approval cannot be added.
        let mut via_status = approved(&old);
        strategy.prepare_for_update_to(UpdateTarget::Status, &mut via_status, &old);
        assert_eq!(
            fields(&strategy.validate_update_to(UpdateTarget::Status, &via_status, &old)),
            vec!["status.conditions"]
        );
        let mut via_main = approved(&old);
        strategy.prepare_for_update_to(UpdateTarget::Main, &mut via_main, &old);
        assert_eq!(via_main.get("status"), old.get("status"));
        // Approved and Denied together, or an approval removed, are refused.
        let mut both = new.clone();
        both["status"]["conditions"]
            .as_array_mut()
            .expect("conditions")
            .push(json!({"type": "Denied", "status": "True"}));
        strategy.prepare_for_update_to(UpdateTarget::Approval, &mut both, &new);
        assert_eq!(
            fields(&strategy.validate_update_to(UpdateTarget::Approval, &both, &new)),
            vec!["status.conditions[1].type"]
        );
        let mut removed = new.clone();
        removed["status"]["conditions"] = json!([]);
        assert_eq!(
            fields(&strategy.validate_update_to(UpdateTarget::Approval, &removed, &new)),
            vec!["status.conditions"]
        );
    }

    #[test]
    fn status_sets_the_certificate_once() {
        let strategy = CertificateSigningRequestStrategy;
        let old = approved(&csr(&csr_pem("system:node:n1", "system:nodes")));
        let ca = crate::pki::CertificateAuthority::generate("ca").expect("ca");
        let issued = ca
            .issue_client("system:node:n1", &["system:nodes"])
            .expect("cert");
        let encoded = base64::engine::general_purpose::STANDARD.encode(&issued.cert_pem);
        let mut new = old.clone();
        new["status"]["certificate"] = json!(encoded);
        strategy.prepare_for_update_to(UpdateTarget::Status, &mut new, &old);
        assert!(
            strategy
                .validate_update_to(UpdateTarget::Status, &new, &old)
                .is_empty()
        );
        let mut again = new.clone();
        again["status"]["certificate"] =
            json!(base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem));
        assert_eq!(
            fields(&strategy.validate_update_to(UpdateTarget::Status, &again, &new)),
            vec!["status.certificate"]
        );
        let mut garbage = old.clone();
        garbage["status"]["certificate"] =
            json!(base64::engine::general_purpose::STANDARD.encode("junk"));
        assert_eq!(
            fields(&strategy.validate_update_to(UpdateTarget::Status, &garbage, &old)),
            vec!["status.certificate"]
        );
    }

    #[test]
    fn condition_column_reads_like_kubectl() {
        let old = csr("x");
        assert_eq!(condition_summary(&old), "Pending");
        let mut obj = approved(&old);
        obj["status"]["certificate"] = json!("Y2VydA==");
        assert_eq!(condition_summary(&obj), "Approved,Issued");
        obj["status"]["conditions"] = json!([{"type": "Denied"}, {"type": "Failed"}]);
        assert_eq!(condition_summary(&obj), "Denied,Failed,Issued");
    }
}
