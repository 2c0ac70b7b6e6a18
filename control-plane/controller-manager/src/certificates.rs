//! The certificate controllers of node TLS bootstrap: `csrapproving` (upstream
//! `pkg/controller/certificates/approver`, sarapprove) approves kubelet client requests whose
//! requester a SubjectAccessReview allows to ask for them, and a kubelet's request for its own
//! serving certificate (upstream leaves that to an external approver; the API server verifies
//! kubelets' serving certificates here, so each kubelet needs one), and `csrsigning` (upstream
//! `pkg/controller/certificates/signer`) signs approved requests for the
//! `kube-apiserver-client-kubelet`, `kubelet-serving` and `kube-apiserver-client` signers with
//! the cluster CA.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};

use crate::informers::{Informer, Informers};
use crate::workqueue::{Requeue, WorkQueue, run_workers};

/// Requests handled at once (upstream's certificate controllers run five workers).
const CONCURRENT_SYNCS: usize = 5;
/// `kubernetes.io/kube-apiserver-client-kubelet`: kubelets' client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// `kubernetes.io/kubelet-serving`: kubelets' serving certificates.
pub const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// `kubernetes.io/kube-apiserver-client`: any client certificate, approved by people.
pub const API_SERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// Upstream's `--cluster-signing-duration` default: one year.
pub const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate's validity starts, for clients whose clock lags.
const BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Certificates shorter than this keep their full lifetime ahead of now.
const SHORT: Duration = Duration::from_secs(8 * 3600);
/// The shortest certificate issued, whatever was asked (twice the backdate).
const MIN_DURATION: Duration = Duration::from_secs(10 * 60);

/// The CA `csrsigning` signs with (upstream's `--cluster-signing-cert-file` / `-key-file`).
#[derive(Clone)]
pub struct ClusterSigning {
    /// The CA certificate (PEM).
    pub cert_pem: String,
    /// Its private key (PEM, PKCS#8).
    pub key_pem: String,
    /// The longest certificate issued (`--cluster-signing-duration`).
    pub max_duration: Duration,
}

impl std::fmt::Debug for ClusterSigning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSigning")
            .field("max_duration", &self.max_duration)
            .finish_non_exhaustive()
    }
}

/// What a request's PKCS#10 asks for (the parts the decisions read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedSubject {
    /// Subject common name.
    pub common_name: String,
    /// Subject organizations, in order.
    pub organizations: Vec<String>,
    /// DNS subjectAltNames.
    pub dns_names: usize,
    /// Email subjectAltNames.
    pub emails: usize,
    /// IP subjectAltNames.
    pub ips: usize,
    /// URI subjectAltNames.
    pub uris: usize,
}

/// `ParseCSR`: the subject and subjectAltNames of a PEM `CERTIFICATE REQUEST`, read by the
/// same rules the API server admitted it by (`api_machinery::csr`: its first PEM block, its
/// signature checked).
pub fn parse_request(pem: &[u8]) -> Result<RequestedSubject, String> {
    use x509_parser::extensions::{GeneralName, ParsedExtension};
    use x509_parser::prelude::FromDer;
    let der = flotilla_api_machinery::csr::parse_csr(pem).map_err(|err| err.to_string())?;
    let (_, request) = x509_parser::certification_request::X509CertificationRequest::from_der(&der)
        .map_err(|e| format!("x509: {e}"))?;
    let subject = &request.certification_request_info.subject;
    let mut parsed = RequestedSubject {
        common_name: subject
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or("")
            .to_string(),
        organizations: subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok().map(str::to_string))
            .collect(),
        ..Default::default()
    };
    for extension in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(_) => parsed.dns_names += 1,
                    GeneralName::RFC822Name(_) => parsed.emails += 1,
                    GeneralName::IPAddress(_) => parsed.ips += 1,
                    GeneralName::URI(_) => parsed.uris += 1,
                    _ => {}
                }
            }
        }
    }
    Ok(parsed)
}

/// Whether `usages` are exactly `required`, with or without key encipherment (which RSA keys
/// need and others do not), as upstream's `…RequiredUsages` and `…RequiredUsagesNoRSA`.
fn usages_are(usages: &[String], required: &[&str]) -> bool {
    let given: BTreeSet<&str> = usages.iter().map(String::as_str).collect();
    let without: BTreeSet<&str> = required.iter().copied().collect();
    let mut with = without.clone();
    with.insert("key encipherment");
    given == without || given == with
}

/// `ValidateKubeletClientCSR`: CN `system:node:…`, O exactly `system:nodes`, no SANs, usages
/// {digital signature, client auth}, with or without key encipherment.
pub fn validate_kubelet_client(
    request: &RequestedSubject,
    usages: &[String],
) -> Result<(), String> {
    if request.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if request.dns_names > 0 {
        return Err("DNS subjectAltNames are not allowed".into());
    }
    if request.emails > 0 {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if request.ips > 0 {
        return Err("IP subjectAltNames are not allowed".into());
    }
    if request.uris > 0 {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !request.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    if !usages_are(usages, &["client auth", "digital signature"]) {
        return Err("usages did not match [client auth digital signature key encipherment]".into());
    }
    Ok(())
}

/// `ValidateKubeletServingCSR`: CN `system:node:…`, O exactly `system:nodes`, at least one DNS
/// or IP subjectAltName and no email or URI ones, usages {digital signature, server auth}, with
/// or without key encipherment.
pub fn validate_kubelet_serving(
    request: &RequestedSubject,
    usages: &[String],
) -> Result<(), String> {
    if request.organizations != ["system:nodes"] {
        return Err("subject organization is not system:nodes".into());
    }
    if request.dns_names == 0 && request.ips == 0 {
        return Err("DNS or IP subjectAltName is required".into());
    }
    if request.emails > 0 {
        return Err("Email subjectAltNames are not allowed".into());
    }
    if request.uris > 0 {
        return Err("URI subjectAltNames are not allowed".into());
    }
    if !usages_are(usages, &["digital signature", "server auth"]) {
        return Err("usages did not match [digital signature key encipherment server auth]".into());
    }
    if !request.common_name.starts_with("system:node:") {
        return Err("subject common name does not begin with system:node:".into());
    }
    Ok(())
}

/// Whether a kubelet-serving request is approved at once: a node asking for its own serving
/// certificate (requester = CN, in `system:nodes`), or an administrator (`system:masters`, who
/// could approve it anyway) asking for a kubelet it runs.
pub fn approves_serving(
    signer: &str,
    username: &str,
    groups: &[String],
    request: &RequestedSubject,
    usages: &[String],
) -> bool {
    if signer != KUBELET_SERVING_SIGNER || validate_kubelet_serving(request, usages).is_err() {
        return false;
    }
    let in_group = |group: &str| groups.iter().any(|g| g == group);
    (username == request.common_name && in_group("system:nodes")) || in_group("system:masters")
}

/// The Approved condition's message of a kubelet-serving request.
const SERVING_APPROVAL: &str = "Auto approving the kubelet's own serving certificate.";

/// One way sarapprove may approve a request: the subresource of `certificatesigningrequests`
/// the requester must be allowed to create, and the approval message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recognizer {
    /// `selfnodeclient` or `nodeclient`.
    pub subresource: &'static str,
    /// The Approved condition's message.
    pub message: &'static str,
}

const SELF_NODE_CLIENT: Recognizer = Recognizer {
    subresource: "selfnodeclient",
    message: "Auto approving self kubelet client certificate after SubjectAccessReview.",
};
const NODE_CLIENT: Recognizer = Recognizer {
    subresource: "nodeclient",
    message: "Auto approving kubelet client certificate after SubjectAccessReview.",
};

/// sarapprove's recognizers, in order, that match `csr` (the node renewing its own certificate
/// first, then any valid kubelet client request).
pub fn recognize(
    signer: &str,
    username: &str,
    request: &RequestedSubject,
    usages: &[String],
) -> Vec<Recognizer> {
    if signer != KUBELET_CLIENT_SIGNER || validate_kubelet_client(request, usages).is_err() {
        return Vec::new();
    }
    let mut recognized = Vec::new();
    if username == request.common_name {
        recognized.push(SELF_NODE_CLIENT);
    }
    recognized.push(NODE_CLIENT);
    recognized
}

/// `duration`: the requested lifetime capped by `max`, never below ten minutes.
pub fn duration(max: Duration, expiration_seconds: Option<i32>) -> Duration {
    let Some(seconds) = expiration_seconds else {
        return max;
    };
    let requested = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    if requested > max {
        max
    } else if requested < MIN_DURATION {
        MIN_DURATION
    } else {
        requested
    }
}

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == kind && c.status == "True")
}

fn is_issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

fn usages(csr: &CertificateSigningRequest) -> Vec<String> {
    csr.spec.usages.clone().unwrap_or_default()
}

/// Runs `csrapproving` until the task is aborted.
pub async fn run_approver(informers: Arc<Informers>) {
    let csrs = informers.get::<CertificateSigningRequest>();
    let client = informers.client().clone();
    on_each_request(&csrs, "csrapproving", |csr| {
        let client = &client;
        async move { approve(client, &csr).await }
    })
    .await
}

/// Queues each request's name on every change to it, and runs `handle` on the request the
/// cache holds for each name taken from the queue (upstream's certificate controller base:
/// one queue, a few workers, errors retried with back-off).
async fn on_each_request<'a, F, Fut>(
    csrs: &'a Informer<CertificateSigningRequest>,
    name: &'static str,
    handle: F,
) where
    F: Fn(Arc<CertificateSigningRequest>) -> Fut + 'a,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + 'a,
{
    let queue = Arc::new(WorkQueue::new(name));
    let on_change = queue.clone();
    csrs.on_change(move |change| {
        for csr in change.objects() {
            if let Some(name) = &csr.metadata.name {
                on_change.add(name.clone());
            }
        }
    });
    csrs.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |name: String| {
        let csr = csrs.get("", &name);
        let handled = csr.map(&handle);
        async move {
            if let Some(handled) = handled {
                handled.await?;
            }
            Ok::<_, kube::Error>(Requeue::No)
        }
    })
    .await
}

/// sarapprove's `handle`.
async fn approve(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
) -> Result<(), kube::Error> {
    if is_issued(csr) || has_condition(csr, "Approved") || has_condition(csr, "Denied") {
        return Ok(());
    }
    let Ok(request) = parse_request(&csr.spec.request.0) else {
        return Ok(());
    };
    let username = csr.spec.username.as_deref().unwrap_or("");
    let groups = csr.spec.groups.clone().unwrap_or_default();
    if approves_serving(
        &csr.spec.signer_name,
        username,
        &groups,
        &request,
        &usages(csr),
    ) {
        return record_approval(client, csr, "serving", SERVING_APPROVAL).await;
    }
    for recognizer in recognize(&csr.spec.signer_name, username, &request, &usages(csr)) {
        if !authorize(client, csr, recognizer.subresource).await? {
            continue;
        }
        return record_approval(client, csr, recognizer.subresource, recognizer.message).await;
    }
    Ok(())
}

/// Writes the Approved condition (a request changed meanwhile is seen on the next pass).
async fn record_approval(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
    via: &str,
    message: &str,
) -> Result<(), kube::Error> {
    {
        let mut approved = csr.clone();
        approved
            .status
            .get_or_insert_with(Default::default)
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some("AutoApproved".into()),
                message: Some(message.into()),
                last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                ..Default::default()
            });
        let name = csr.metadata.name.clone().unwrap_or_default();
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        match api
            .replace_subresource("approval", &name, &PostParams::default(), &approved)
            .await
        {
            Ok(_) => tracing::info!(csr = %name, via, "approved"),
            // Changed since it was cached: the next pass sees the new state.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Whether the requester may `create` `certificatesigningrequests/{subresource}`.
async fn authorize(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
    subresource: &str,
) -> Result<bool, kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: csr.spec.username.clone(),
            uid: csr.spec.uid.clone(),
            groups: csr.spec.groups.clone(),
            extra: csr.spec.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                group: Some("certificates.k8s.io".into()),
                resource: Some("certificatesigningrequests".into()),
                verb: Some("create".into()),
                subresource: Some(subresource.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let answer = reviews.create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Why a request could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The request is not one this signer issues (recorded as the Failed condition).
    #[error("{0}")]
    Validation(String),
    /// rcgen refused the request or the CA.
    #[error("signing failed: {0}")]
    Sign(#[from] rcgen::Error),
    /// The CA has expired (or expires before the certificate would start).
    #[error("the signer has expired: {0}")]
    Expired(String),
}

/// Whether `signer` is one `csrsigning` issues for, and if so whether the request fits it
/// (upstream's `isRequestForSignerFn` of each signer).
pub fn check_signer(
    signer: &str,
    request: &RequestedSubject,
    usages: &[String],
) -> Option<Result<(), String>> {
    match signer {
        KUBELET_CLIENT_SIGNER => Some(validate_kubelet_client(request, usages)),
        KUBELET_SERVING_SIGNER => Some(validate_kubelet_serving(request, usages)),
        API_SERVER_CLIENT_SIGNER => Some(
            match usages.iter().find(|u| {
                !matches!(
                    u.as_str(),
                    "digital signature" | "key encipherment" | "client auth"
                )
            }) {
                Some(bad) => Err(format!("invalid usage for client certificate: {bad}")),
                None => Ok(()),
            },
        ),
        _ => None,
    }
}

/// Signs a PEM request with `ca`: the request's subject and names, `usages` as key usages and
/// extended key usages, valid for [`duration`] (from five minutes ago for long certificates),
/// never beyond the CA. Returns the certificate as PEM.
pub fn sign(
    ca: &ClusterSigning,
    request_pem: &[u8],
    usages: &[String],
    expiration_seconds: Option<i32>,
    now: time::OffsetDateTime,
) -> Result<String, SignError> {
    use rcgen::{ExtendedKeyUsagePurpose as Eku, KeyUsagePurpose as Ku};
    let text = std::str::from_utf8(request_pem)
        .map_err(|_| SignError::Validation("the request is not PEM".into()))?;
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(text)?;
    let params = &mut csr.params;
    params.key_usages.clear();
    params.extended_key_usages.clear();
    for usage in usages {
        match usage.as_str() {
            "signing" | "digital signature" => params.key_usages.push(Ku::DigitalSignature),
            "content commitment" => params.key_usages.push(Ku::ContentCommitment),
            "key encipherment" => params.key_usages.push(Ku::KeyEncipherment),
            "key agreement" => params.key_usages.push(Ku::KeyAgreement),
            "data encipherment" => params.key_usages.push(Ku::DataEncipherment),
            "cert sign" => params.key_usages.push(Ku::KeyCertSign),
            "crl sign" => params.key_usages.push(Ku::CrlSign),
            "encipher only" => params.key_usages.push(Ku::EncipherOnly),
            "decipher only" => params.key_usages.push(Ku::DecipherOnly),
            "any" => params.extended_key_usages.push(Eku::Any),
            "server auth" => params.extended_key_usages.push(Eku::ServerAuth),
            "client auth" => params.extended_key_usages.push(Eku::ClientAuth),
            "code signing" => params.extended_key_usages.push(Eku::CodeSigning),
            "email protection" | "s/mime" => params.extended_key_usages.push(Eku::EmailProtection),
            "timestamping" => params.extended_key_usages.push(Eku::TimeStamping),
            "ocsp signing" => params.extended_key_usages.push(Eku::OcspSigning),
            other => {
                return Err(SignError::Validation(format!(
                    "unsupported key usage: {other}"
                )));
            }
        }
    }
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    params.use_authority_key_identifier_extension = true;
    let lifetime = duration(ca.max_duration, expiration_seconds);
    let lifetime =
        time::Duration::try_from(lifetime).map_err(|e| SignError::Validation(e.to_string()))?;
    let backdate = time::Duration::try_from(BACKDATE).unwrap_or(time::Duration::ZERO);
    let not_before = now - backdate;
    let mut not_after = if lifetime < time::Duration::try_from(SHORT).unwrap_or(lifetime) {
        now + lifetime
    } else {
        not_before + lifetime
    };
    let ca_not_after = ca_expiry(&ca.cert_pem)?;
    if now >= ca_not_after {
        return Err(SignError::Expired(
            "refusing to sign a certificate that expired in the past".into(),
        ));
    }
    if not_after > ca_not_after {
        not_after = ca_not_after;
    }
    params.not_before = not_before;
    params.not_after = not_after;
    let mut serial: [u8; 16] = rand::random();
    serial[0] &= 0x7f;
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    let key = rcgen::KeyPair::from_pem(&ca.key_pem)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, key)?;
    Ok(csr.signed_by(&issuer)?.pem())
}

fn ca_expiry(cert_pem: &str) -> Result<time::OffsetDateTime, SignError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
        .map_err(|e| SignError::Expired(format!("unreadable CA certificate: {e}")))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents)
        .map_err(|e| SignError::Expired(format!("unreadable CA certificate: {e}")))?;
    Ok(cert.validity().not_after.to_datetime())
}

/// Runs `csrsigning` with `ca` until the task is aborted.
pub async fn run_signer(informers: Arc<Informers>, ca: ClusterSigning) {
    let csrs: Informer<CertificateSigningRequest> = informers.get();
    let client = informers.client().clone();
    on_each_request(&csrs, "csrsigning", |csr| {
        let (client, ca) = (&client, &ca);
        async move { sign_one(client, ca, &csr).await }
    })
    .await
}

/// The signer's `handle`.
async fn sign_one(
    client: &kube::Client,
    ca: &ClusterSigning,
    csr: &CertificateSigningRequest,
) -> Result<(), kube::Error> {
    let approved = has_condition(csr, "Approved") && !has_condition(csr, "Denied");
    if !approved || has_condition(csr, "Failed") || is_issued(csr) {
        return Ok(());
    }
    let usages = usages(csr);
    let outcome = match parse_request(&csr.spec.request.0) {
        Err(err) => match check_signer(&csr.spec.signer_name, &RequestedSubject::default(), &[]) {
            None => return Ok(()),
            Some(_) => Err(SignError::Validation(format!("unable to parse csr: {err}"))),
        },
        Ok(request) => match check_signer(&csr.spec.signer_name, &request, &usages) {
            None => return Ok(()),
            Some(Err(problem)) => Err(SignError::Validation(problem)),
            Some(Ok(())) => sign(
                ca,
                &csr.spec.request.0,
                &usages,
                csr.spec.expiration_seconds,
                time::OffsetDateTime::now_utc(),
            ),
        },
    };
    let mut next = csr.clone();
    let status = next.status.get_or_insert_with(Default::default);
    match outcome {
        Ok(pem) => status.certificate = Some(k8s_openapi::ByteString(pem.into_bytes())),
        Err(SignError::Validation(message)) => {
            status.conditions.get_or_insert_with(Vec::new).push(
                CertificateSigningRequestCondition {
                    type_: "Failed".into(),
                    status: "True".into(),
                    reason: Some("SignerValidationFailure".into()),
                    message: Some(message),
                    last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                },
            );
        }
        Err(err) => {
            tracing::warn!(csr = ?csr.metadata.name, %err, "not signed");
            return Ok(());
        }
    }
    let name = csr.metadata.name.clone().unwrap_or_default();
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    match api
        .replace_status(&name, &PostParams::default(), &next)
        .await
    {
        Ok(_) => {
            tracing::info!(csr = %name, "signed");
            Ok(())
        }
        Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409) => Ok(()),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject(cn: &str, orgs: &[&str]) -> RequestedSubject {
        RequestedSubject {
            common_name: cn.into(),
            organizations: orgs.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        }
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    fn request_pem(cn: &str, orgs: &[&str], dns: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(strings(dns)).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        for org in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *org);
        }
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    #[test]
    fn kubelet_client_requests_are_told_apart() {
        let client = strings(&["digital signature", "client auth"]);
        let rsa = strings(&["digital signature", "key encipherment", "client auth"]);
        let node = subject("system:node:n1", &["system:nodes"]);
        assert_eq!(validate_kubelet_client(&node, &client), Ok(()));
        assert_eq!(validate_kubelet_client(&node, &rsa), Ok(()));
        let cases = [
            (
                subject("system:node:n1", &["system:masters"]),
                "subject organization is not system:nodes",
            ),
            (
                subject("system:node:n1", &["system:nodes", "system:masters"]),
                "subject organization is not system:nodes",
            ),
            (
                subject("alice", &["system:nodes"]),
                "subject common name does not begin with system:node:",
            ),
            (
                RequestedSubject {
                    dns_names: 1,
                    ..node.clone()
                },
                "DNS subjectAltNames are not allowed",
            ),
            (
                RequestedSubject {
                    ips: 1,
                    ..node.clone()
                },
                "IP subjectAltNames are not allowed",
            ),
        ];
        for (request, want) in cases {
            assert_eq!(validate_kubelet_client(&request, &client), Err(want.into()));
        }
        assert!(validate_kubelet_client(&node, &strings(&["client auth"])).is_err());
        assert!(
            validate_kubelet_client(&node, &strings(&["digital signature", "server auth"]))
                .is_err()
        );
    }

    #[test]
    fn recognizers_follow_signer_and_requester() {
        let usages = strings(&["digital signature", "client auth"]);
        let node = subject("system:node:n1", &["system:nodes"]);
        assert_eq!(
            recognize(
                KUBELET_CLIENT_SIGNER,
                "system:bootstrap:abcdef",
                &node,
                &usages
            ),
            vec![NODE_CLIENT]
        );
        assert_eq!(
            recognize(KUBELET_CLIENT_SIGNER, "system:node:n1", &node, &usages),
            vec![SELF_NODE_CLIENT, NODE_CLIENT]
        );
        assert!(recognize(API_SERVER_CLIENT_SIGNER, "system:node:n1", &node, &usages).is_empty());
        let masters = subject("system:node:x", &["system:masters"]);
        assert!(
            recognize(
                KUBELET_CLIENT_SIGNER,
                "system:bootstrap:a",
                &masters,
                &usages
            )
            .is_empty()
        );
    }

    #[test]
    fn a_node_gets_its_own_serving_certificate_approved() {
        let usages = strings(&["digital signature", "server auth"]);
        let mut node = subject("system:node:n1", &["system:nodes"]);
        node.ips = 1;
        let nodes = strings(&["system:nodes", "system:authenticated"]);
        assert!(approves_serving(
            KUBELET_SERVING_SIGNER,
            "system:node:n1",
            &nodes,
            &node,
            &usages
        ));
        // Another node's, without names, with client usages, or another signer: no.
        assert!(!approves_serving(
            KUBELET_SERVING_SIGNER,
            "system:node:n2",
            &nodes,
            &node,
            &usages
        ));
        let no_names = subject("system:node:n1", &["system:nodes"]);
        assert!(!approves_serving(
            KUBELET_SERVING_SIGNER,
            "system:node:n1",
            &nodes,
            &no_names,
            &usages
        ));
        assert!(!approves_serving(
            KUBELET_SERVING_SIGNER,
            "system:node:n1",
            &nodes,
            &node,
            &strings(&["digital signature", "client auth"])
        ));
        assert!(!approves_serving(
            KUBELET_CLIENT_SIGNER,
            "system:node:n1",
            &nodes,
            &node,
            &usages
        ));
        // An administrator's request for a kubelet it runs.
        assert!(approves_serving(
            KUBELET_SERVING_SIGNER,
            "kubernetes-admin",
            &strings(&["system:masters"]),
            &node,
            &usages
        ));
        assert_eq!(
            check_signer(KUBELET_SERVING_SIGNER, &node, &usages),
            Some(Ok(()))
        );
    }

    #[test]
    fn requests_parse_into_subject_and_names() {
        let pem = request_pem("system:node:n1", &["system:nodes"], &[]);
        assert_eq!(
            parse_request(pem.as_bytes()),
            Ok(subject("system:node:n1", &["system:nodes"]))
        );
        let with_dns = request_pem("system:node:n1", &["system:nodes"], &["n1.example.com"]);
        assert_eq!(
            parse_request(with_dns.as_bytes()).map(|r| r.dns_names),
            Ok(1)
        );
        assert!(parse_request(b"junk").is_err());
    }

    #[test]
    fn duration_is_capped_and_floored() {
        let year = DEFAULT_MAX_DURATION;
        assert_eq!(duration(year, None), year);
        assert_eq!(duration(year, Some(3600)), Duration::from_secs(3600));
        assert_eq!(duration(year, Some(i32::MAX)), year);
        assert_eq!(duration(year, Some(60)), MIN_DURATION);
        assert_eq!(
            duration(Duration::from_secs(7200), Some(86400)),
            Duration::from_secs(7200)
        );
    }

    #[test]
    fn signing_issues_a_client_certificate_from_the_ca() {
        let ca_key = rcgen::KeyPair::generate().expect("key");
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
        let ca = ClusterSigning {
            cert_pem: ca_cert.pem(),
            key_pem: ca_key.serialize_pem(),
            max_duration: DEFAULT_MAX_DURATION,
        };
        let pem = request_pem("system:node:n1", &["system:nodes"], &[]);
        let now = time::OffsetDateTime::now_utc()
            .replace_nanosecond(0)
            .expect("whole second");
        let usages = strings(&["digital signature", "client auth"]);
        let cert = sign(&ca, pem.as_bytes(), &usages, Some(3600), now).expect("signed");
        let (_, block) = x509_parser::pem::parse_x509_pem(cert.as_bytes()).expect("pem");
        let (_, parsed) = x509_parser::parse_x509_certificate(&block.contents).expect("x509");
        let cn = parsed
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok());
        assert_eq!(cn, Some("system:node:n1"));
        let lifetime = parsed.validity().not_after.to_datetime() - now;
        assert_eq!(lifetime.whole_seconds(), 3600);
        let eku = parsed.extended_key_usage().expect("eku").expect("present");
        assert!(eku.value.client_auth && !eku.value.server_auth);
        assert!(!parsed.is_ca());
        // A year-long certificate starts five minutes ago.
        let long = sign(&ca, pem.as_bytes(), &usages, None, now).expect("signed");
        let (_, block) = x509_parser::pem::parse_x509_pem(long.as_bytes()).expect("pem");
        let (_, parsed) = x509_parser::parse_x509_certificate(&block.contents).expect("x509");
        let started = now - parsed.validity().not_before.to_datetime();
        assert_eq!(started.whole_seconds(), 300);
    }

    #[test]
    fn client_signer_allows_only_client_usages() {
        let any = subject("alice", &["devs"]);
        assert_eq!(
            check_signer(API_SERVER_CLIENT_SIGNER, &any, &strings(&["client auth"])),
            Some(Ok(()))
        );
        assert_eq!(
            check_signer(API_SERVER_CLIENT_SIGNER, &any, &strings(&["server auth"])),
            Some(Err(
                "invalid usage for client certificate: server auth".into()
            ))
        );
        assert_eq!(check_signer("example.com/x", &any, &[]), None);
    }
}
