//! A node joining its cluster the kubelet's way (upstream `pkg/kubelet/certificate/bootstrap`):
//! with the `NodeConfig`'s bootstrap token the node requests a client certificate for
//! `system:node:<name>` (O `system:nodes`) through a CertificateSigningRequest, waits for the
//! cluster to approve and sign it, keeps key and certificate in the cert directory, and from
//! then on talks to the API as that node. A valid certificate already there is reused. One
//! flow for the real kubelet and for `flotilla simulate-nodes --node-config`. The kubelet's
//! serving certificate is requested the same way (`kubelet-serving` signer, the node's names
//! and addresses as subjectAltNames), so the API server can verify the kubelet it dials.
//!
//! Before that, on a node image's first boot, `flotilla-bootstrap` reads the instance's
//! metadata (`imds`) and writes the kubelet's and proxy's configuration (`firstboot`).

pub mod firstboot;
pub mod imds;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::api::{Api, PostParams};
use serde_json::json;

use flotilla_api_machinery::nodeconfig::NodeConfig;

/// The certificate and key the node authenticates with (the kubelet's file name).
const CURRENT_PAIR: &str = "kubelet-client-current.pem";
/// The key of a request not signed yet, reused when the node restarts while waiting.
const PENDING_KEY: &str = "kubelet-client.key.tmp";
/// How long the node waits for its request to be approved and signed.
const SIGNING_TIMEOUT: Duration = Duration::from_secs(120);
/// A certificate this close to its expiry is requested anew.
const RENEW_MARGIN: Duration = Duration::from_secs(60);
const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const KUBELET_SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

/// Joins as node `name` with the bootstrap document at `path`, keeping the credential in
/// `cert_dir`: a client acting as `system:node:<name>`, and the document (its labels and
/// taints are what the node registers with).
pub async fn join(
    path: &Path,
    name: &str,
    cert_dir: &Path,
) -> anyhow::Result<(kube::Client, NodeConfig)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let config = NodeConfig::parse(&text)?;
    std::fs::create_dir_all(cert_dir)
        .with_context(|| format!("creating {}", cert_dir.display()))?;
    let ca_pem = config.ca_pem()?;
    let pair_path = cert_dir.join(CURRENT_PAIR);
    let pair = match reusable_pair(&pair_path, name) {
        Some(pair) => {
            tracing::info!(path = %pair_path.display(), "using the stored node certificate");
            pair
        }
        None => {
            let pair = bootstrap(&config, &ca_pem, name, cert_dir).await?;
            write_private(&pair_path, &format!("{}{}", pair.cert, pair.key))?;
            let _ = std::fs::remove_file(cert_dir.join(PENDING_KEY));
            tracing::info!(path = %pair_path.display(), "node certificate issued");
            pair
        }
    };
    let user = json!({
        "client-certificate-data": b64(&pair.cert),
        "client-key-data": b64(&pair.key),
    });
    let client = client(&config, &ca_pem, user).await?;
    Ok((client, config))
}

/// Writes a file only its owner reads (keys).
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

/// A certificate and its private key, as PEM.
struct Pair {
    cert: String,
    key: String,
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// A kube client of the document's cluster, trusting its CA, authenticating as `user` (a
/// kubeconfig `user` entry).
async fn client(
    config: &NodeConfig,
    ca_pem: &str,
    user: serde_json::Value,
) -> anyhow::Result<kube::Client> {
    let cluster = &config.spec.cluster;
    let kubeconfig: kube::config::Kubeconfig = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster.name, "cluster": {
            "server": cluster.api_server_endpoint,
            "certificate-authority-data": b64(ca_pem),
        }}],
        "users": [{"name": "node", "user": user}],
        "contexts": [{"name": "node", "context": {"cluster": cluster.name, "user": "node"}}],
        "current-context": "node",
    }))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("the node config does not make a usable client")?;
    Ok(kube::Client::try_from(config)?)
}

/// The first PEM block labelled `label` in `text`, with its markers.
fn pem_block(text: &str, label: &str) -> Option<String> {
    let begin_marker = format!("-----BEGIN {label}-----");
    let end_marker = format!("-----END {label}-----");
    let begin = text.find(&begin_marker)?;
    let end = text[begin..].find(&end_marker)? + begin + end_marker.len();
    Some(format!("{}\n", &text[begin..end]))
}

/// The stored pair, when it is this node's and valid for a while longer (the kubelet's
/// `loadFile` then `certificate.Current`).
fn reusable_pair(path: &Path, name: &str) -> Option<Pair> {
    let text = std::fs::read_to_string(path).ok()?;
    let pair = Pair {
        cert: pem_block(&text, "CERTIFICATE")?,
        key: pem_block(&text, "PRIVATE KEY")?,
    };
    let (_, block) = x509_parser::pem::parse_x509_pem(pair.cert.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&block.contents).ok()?;
    let common_name = cert.subject().iter_common_name().next()?.as_str().ok()?;
    let expires = cert.validity().not_after.timestamp();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let fresh = u64::try_from(expires).ok()? > now + RENEW_MARGIN.as_secs();
    (common_name == format!("system:node:{name}") && fresh).then_some(pair)
}

/// The private key of the request: the one of an earlier unfinished request, or a new one
/// (stored first, so a restart asks with the same key).
fn request_key(cert_dir: &Path) -> anyhow::Result<rcgen::KeyPair> {
    let path: PathBuf = cert_dir.join(PENDING_KEY);
    if let Ok(pem) = std::fs::read_to_string(&path)
        && let Ok(key) = rcgen::KeyPair::from_pem(&pem)
    {
        return Ok(key);
    }
    let key = rcgen::KeyPair::generate()?;
    write_private(&path, &key.serialize_pem())?;
    Ok(key)
}

/// The PEM PKCS#10 request for `system:node:<name>` in `system:nodes`, naming `hosts` (IP
/// addresses or DNS names) as subjectAltNames.
fn certificate_request(
    name: &str,
    hosts: &[String],
    key: &rcgen::KeyPair,
) -> anyhow::Result<String> {
    let mut params = rcgen::CertificateParams::default();
    for host in hosts {
        params
            .subject_alt_names
            .push(match host.parse::<std::net::IpAddr>() {
                Ok(ip) => rcgen::SanType::IpAddress(ip),
                Err(_) => rcgen::SanType::DnsName(host.clone().try_into()?),
            });
    }
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{name}"));
    Ok(params.serialize_request(key)?.pem()?)
}

/// Requests the node's certificate with the bootstrap token and waits until it is issued.
async fn bootstrap(
    config: &NodeConfig,
    ca_pem: &str,
    name: &str,
    cert_dir: &Path,
) -> anyhow::Result<Pair> {
    let token = json!({"token": config.spec.kubelet.bootstrap_token});
    let client = client(config, ca_pem, token).await?;
    let key = request_key(cert_dir)?;
    let request = certificate_request(name, &[], &key)?;
    let cert = issued(
        client,
        &request,
        KUBELET_CLIENT_SIGNER,
        &["digital signature", "client auth"],
        "node-csr-",
    )
    .await
    .context("the node's client certificate (requested with the bootstrap token)")?;
    Ok(Pair {
        cert,
        key: key.serialize_pem(),
    })
}

/// The kubelet's serving certificate for node `name`, reached at `hosts` (its addresses and
/// names): requested with the node's own `client` and waited for. Returns (certificate, key)
/// as PEM. The key is new each time and never leaves memory.
pub async fn serving_certificate(
    client: kube::Client,
    name: &str,
    hosts: &[String],
) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let request = certificate_request(name, hosts, &key)?;
    let cert = issued(
        client,
        &request,
        KUBELET_SERVING_SIGNER,
        &["digital signature", "server auth"],
        "kubelet-serving-",
    )
    .await
    .context("the kubelet's serving certificate")?;
    Ok((cert, key.serialize_pem()))
}

/// Creates a CertificateSigningRequest for the PEM `request` and waits until it is issued:
/// the certificate, as PEM.
async fn issued(
    client: kube::Client,
    request: &str,
    signer: &str,
    usages: &[&str],
    generate_name: &str,
) -> anyhow::Result<String> {
    let csr: CertificateSigningRequest = serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": generate_name},
        "spec": {
            "request": b64(request),
            "signerName": signer,
            "usages": usages,
        },
    }))?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client);
    let created = csrs
        .create(&PostParams::default(), &csr)
        .await
        .context("creating the CertificateSigningRequest")?;
    let csr_name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %csr_name, signer, "requested a certificate");
    let started = Instant::now();
    loop {
        let current = csrs
            .get(&csr_name)
            .await
            .with_context(|| format!("reading CertificateSigningRequest {csr_name}"))?;
        let status = current.status.unwrap_or_default();
        if let Some(refusal) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| matches!(c.type_.as_str(), "Denied" | "Failed") && c.status == "True")
        {
            bail!(
                "CertificateSigningRequest {csr_name} was {}: {} {}",
                refusal.type_.to_lowercase(),
                refusal.reason.as_deref().unwrap_or(""),
                refusal.message.as_deref().unwrap_or("")
            );
        }
        if let Some(certificate) = status.certificate.filter(|c| !c.0.is_empty()) {
            return String::from_utf8(certificate.0).context("the issued certificate is not PEM");
        }
        if started.elapsed() > SIGNING_TIMEOUT {
            bail!(
                "CertificateSigningRequest {csr_name} was not approved and signed within {}s \
                 (is the controller-manager running with a signing CA?)",
                SIGNING_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_the_node_in_system_nodes() {
        let key = rcgen::KeyPair::generate().expect("key");
        let pem = certificate_request("n1", &["10.0.0.5".into(), "n1".into()], &key).expect("csr");
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("pem");
        assert_eq!(block.label, "CERTIFICATE REQUEST");
        use x509_parser::prelude::FromDer;
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
                .expect("csr");
        let subject = &csr.certification_request_info.subject;
        let cn = subject
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok());
        let o: Vec<&str> = subject
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .collect();
        assert_eq!((cn, o), (Some("system:node:n1"), vec!["system:nodes"]));
    }

    #[test]
    fn stored_pairs_are_reused_only_for_this_node_while_valid() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join(CURRENT_PAIR);
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::hours(1);
        let cert = params.self_signed(&key).expect("cert");
        std::fs::write(&path, format!("{}{}", cert.pem(), key.serialize_pem())).expect("write");
        assert!(reusable_pair(&path, "n1").is_some());
        assert!(reusable_pair(&path, "n2").is_none());
        params.not_after = now + time::Duration::seconds(10);
        let expiring = params.self_signed(&key).expect("cert");
        std::fs::write(&path, format!("{}{}", expiring.pem(), key.serialize_pem())).expect("write");
        assert!(reusable_pair(&path, "n1").is_none());
        assert!(reusable_pair(&dir.path().join("missing"), "n1").is_none());
    }
}
