//! Certificates: certificate authorities, serving and client certificates, and the
//! kubeconfig that ties them together for kubectl.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// How long a CA is valid.
const CA_VALIDITY_DAYS: i64 = 3650;
/// How long a leaf (serving or client) certificate is valid, as kubeadm issues them.
const LEAF_VALIDITY_DAYS: i64 = 365;

/// Failures while issuing or loading certificates.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused the parameters or a key.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// More than one group was asked for: rcgen keeps one value per name attribute.
    #[error("client certificates carry at most one group (O) here; asked for {0}")]
    TooManyGroups(usize),
}

/// A certificate authority: its certificate and private key, as PEM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CertificateAuthority {
    /// The CA certificate.
    pub cert_pem: String,
    /// The CA private key (PKCS#8).
    pub key_pem: String,
}

/// An issued certificate and its key, as PEM.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IssuedCertificate {
    /// The leaf certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

fn distinguished_name(common_name: &str, organizations: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    for org in organizations {
        dn.push(DnType::OrganizationName, *org);
    }
    dn.push(DnType::CommonName, common_name);
    dn
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = time::OffsetDateTime::now_utc();
    // Back-dated an hour so a client whose clock lags slightly still accepts it.
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(days);
}

impl CertificateAuthority {
    /// A new self-signed CA named `common_name`.
    pub fn generate(common_name: &str) -> Result<Self, PkiError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name, &[]);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, CA_VALIDITY_DAYS);
        let cert = params.self_signed(&key)?;
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    fn issue(&self, params: CertificateParams) -> Result<IssuedCertificate, PkiError> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A serving certificate for the given DNS names and IP addresses.
    pub fn issue_serving(
        &self,
        common_name: &str,
        hosts: &[String],
    ) -> Result<IssuedCertificate, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(common_name, &[]);
        for host in hosts {
            let san = match host.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(host.clone().try_into()?),
            };
            params.subject_alt_names.push(san);
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut params, LEAF_VALIDITY_DAYS);
        self.issue(params)
    }

    /// A client certificate: CN is the user name, O the groups (Kubernetes x509 authentication).
    /// At most one group: rcgen's distinguished name keeps a single value per attribute type,
    /// so a second `O` would silently replace the first.
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<IssuedCertificate, PkiError> {
        if groups.len() > 1 {
            return Err(PkiError::TooManyGroups(groups.len()));
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(user, groups);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        set_validity(&mut params, LEAF_VALIDITY_DAYS);
        self.issue(params)
    }
}

/// A kubeconfig (YAML) with one cluster, one user authenticating by client certificate, and
/// one current context — what `kubectl` and kube-rs read.
pub fn kubeconfig(
    cluster: &str,
    server_url: &str,
    ca_pem: &str,
    user: &str,
    client: &IssuedCertificate,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server_url, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(&client.cert_pem),
            "client-key-data": b64(&client.key_pem),
        }}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
        "preferences": {},
    });
    serde_yaml::to_string(&config).unwrap_or_default()
}

/// The common name of a certificate's issuer (a tenant CA is `flotilla-{id}-ca`).
pub fn issuer_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let name = cert
        .issuer()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    Some(name)
}

/// The tenant whose CA is named `common_name`, by the naming [`tenant_ca_name`] gives them.
pub fn tenant_of_ca_name(common_name: &str) -> Option<&str> {
    common_name.strip_prefix("flotilla-")?.strip_suffix("-ca")
}

/// The common name of tenant `id`'s client CA.
pub fn tenant_ca_name(id: &str) -> String {
    format!("flotilla-{id}-ca")
}

/// The name of tenant `id`'s front-proxy CA. It is not a client CA name: no certificate it
/// signs authenticates to the API server itself.
pub fn front_proxy_ca_name(id: &str) -> String {
    format!("front-proxy-ca-{id}")
}

/// The identity an x509 client certificate asserts: CN → user, O → groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateIdentity {
    /// The user name.
    pub user: String,
    /// The groups.
    pub groups: Vec<String>,
}

/// Reads the user and groups out of a DER client certificate.
pub fn certificate_identity(der: &[u8]) -> Option<CertificateIdentity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(CertificateIdentity { user, groups })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;

    #[test]
    fn client_certificates_carry_user_and_groups() {
        let ca = CertificateAuthority::generate("test-ca").expect("ca");
        let client = ca.issue_client("alice", &["devs"]).expect("client");
        let der = CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).expect("pem");
        let identity = certificate_identity(&der).expect("identity");
        assert_eq!(identity.user, "alice");
        assert_eq!(identity.groups, vec!["devs"]);
        assert!(ca.issue_client("bob", &["a", "b"]).is_err());
    }

    #[test]
    fn kubeconfig_is_yaml_with_current_context() {
        let ca = CertificateAuthority::generate("ca").expect("ca");
        let client = ca
            .issue_client("admin", &["system:masters"])
            .expect("client");
        let config = kubeconfig(
            "demo",
            "https://127.0.0.1:6443/clusters/demo",
            &ca.cert_pem,
            "admin",
            &client,
        );
        let parsed: serde_json::Value = serde_yaml::from_str(&config).expect("yaml");
        assert_eq!(parsed["current-context"], "demo");
        assert_eq!(
            parsed["clusters"][0]["cluster"]["server"],
            "https://127.0.0.1:6443/clusters/demo"
        );
    }
}
