//! What a CertificateSigningRequest carries (certificates.k8s.io): the PEM blocks of
//! `spec.request` and `status.certificate`, the PKCS#10 request with its signature checked
//! (upstream's `ParseCSR` + `CheckSignature`), the subject organizations a signed client
//! certificate would carry as groups, and `validateCertificate`'s check of an issued chain.
//! Pure functions over bytes: the API server's validation and admission call them, and so
//! does the `csr` fuzz target.

use base64::Engine;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

/// Why a request or a certificate chain is refused (the messages are the field errors'
/// details, as upstream words them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    /// The request's first PEM block is missing, unreadable, or not a request.
    #[error("PEM block type must be CERTIFICATE REQUEST")]
    NotARequest,
    /// The DER inside is not what it should be.
    #[error("x509: {0}")]
    X509(String),
    /// The request is not signed by the key it holds.
    #[error("x509: ECDSA verification failure")]
    Signature,
    /// A certificate chain without a PEM block.
    #[error("must contain at least one CERTIFICATE PEM block")]
    NoCertificate,
    /// A certificate chain with a block of another type.
    #[error("only CERTIFICATE PEM blocks are allowed, found {0:?}")]
    NotACertificate(String),
    /// A certificate chain with PEM headers.
    #[error("no PEM block headers are permitted")]
    Headers,
}

/// One PEM block: its label (`CERTIFICATE REQUEST`), decoded contents, and whether it had
/// headers (`Proc-Type: …` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemBlock {
    /// The label between `-----BEGIN ` and `-----`.
    pub label: String,
    /// The base64 body, decoded.
    pub contents: Vec<u8>,
    /// A body line holds a `:`.
    pub headers: bool,
}

/// Finds the next block in `text`: the block and what follows its end line; `None` when
/// there is no complete block or its body is not base64.
fn next_block(text: &str) -> Option<(PemBlock, &str)> {
    let begin = text.find("-----BEGIN ")?;
    let after = &text[begin + "-----BEGIN ".len()..];
    let label_end = after.find("-----")?;
    let label = after[..label_end].to_string();
    let body = &after[label_end + 5..];
    let end_marker = format!("-----END {label}-----");
    let end = body.find(&end_marker)?;
    let inner = &body[..end];
    let headers = inner.lines().any(|l| l.contains(':'));
    let encoded: String = inner.chars().filter(|c| !c.is_whitespace()).collect();
    let contents = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let block = PemBlock {
        label,
        contents,
        headers,
    };
    Some((block, &body[end + end_marker.len()..]))
}

/// The first PEM block of `data` (read as UTF-8, invalid sequences replaced), if it is
/// complete and its body base64.
pub fn first_pem_block(data: &[u8]) -> Option<PemBlock> {
    next_block(&String::from_utf8_lossy(data)).map(|(block, _)| block)
}

/// Every PEM block of `data`, in order, up to the first incomplete one or one whose body is
/// not base64.
pub fn pem_blocks(data: &[u8]) -> Vec<PemBlock> {
    let text = String::from_utf8_lossy(data);
    let mut rest: &str = &text;
    let mut blocks = Vec::new();
    while let Some((block, after)) = next_block(rest) {
        blocks.push(block);
        rest = after;
    }
    blocks
}

/// `ParseCSR` and `CheckSignature`: `pem`'s first block must be a `CERTIFICATE REQUEST` whose
/// signature verifies. Returns the request's DER.
pub fn parse_csr(pem: &[u8]) -> Result<Vec<u8>, CsrError> {
    let der = match first_pem_block(pem) {
        Some(block) if block.label == "CERTIFICATE REQUEST" => block.contents,
        _ => return Err(CsrError::NotARequest),
    };
    let (_, request) =
        X509CertificationRequest::from_der(&der).map_err(|e| CsrError::X509(e.to_string()))?;
    request
        .verify_signature()
        .map_err(|_| CsrError::Signature)?;
    Ok(der)
}

/// The subject organizations (the groups a client certificate would carry) the request in
/// `pem` asks for, once [`parse_csr`] accepts it.
pub fn requested_organizations(pem: &[u8]) -> Result<Vec<String>, CsrError> {
    let der = parse_csr(pem)?;
    let (_, request) =
        X509CertificationRequest::from_der(&der).map_err(|e| CsrError::X509(e.to_string()))?;
    Ok(request
        .certification_request_info
        .subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect())
}

/// `validateCertificate`: an issued chain (`status.certificate`) is empty, or one or more
/// `CERTIFICATE` blocks without headers, each a certificate.
pub fn validate_certificate(data: &[u8]) -> Result<(), CsrError> {
    if data.is_empty() {
        return Ok(());
    }
    let blocks = pem_blocks(data);
    if blocks.is_empty() {
        return Err(CsrError::NoCertificate);
    }
    for block in blocks {
        if block.label != "CERTIFICATE" {
            return Err(CsrError::NotACertificate(block.label));
        }
        if block.headers {
            return Err(CsrError::Headers);
        }
        x509_parser::parse_x509_certificate(&block.contents)
            .map_err(|e| CsrError::X509(e.to_string()))?;
    }
    Ok(())
}

/// `der` as one PEM block labelled `label`, its body in lines of 64 characters.
pub fn encode_pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `openssl req -new` with a P-256 key: O=system:nodes, CN=system:node:n1.
    const P256_REQUEST: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIHqMIGSAgEAMDAxFTATBgNVBAoMDHN5c3RlbTpub2RlczEXMBUGA1UEAwwOc3lz
dGVtOm5vZGU6bjEwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARel1jNMSZHIHlm
vXM21kbU06qaicxnUDDPCuaMqf5fRQdBTaYz+29zOQJTfzJjBvGqV5l8FMIVXirB
qWUSNE0AoAAwCgYIKoZIzj0EAwIDRwAwRAIgTmuaCK5pUw8ey8TIqTXzy0SkCbbu
TJrHlr2zCyK+iGsCIDStkaGF5d3A2vtZVis/4LRG5VhqRlV82EcGFDb7dlFE
-----END CERTIFICATE REQUEST-----
";

    /// `openssl req -new` with an Ed25519 key: O=system:masters, O=devs, CN=alice, two SANs.
    const ED25519_REQUEST: &str = "-----BEGIN CERTIFICATE REQUEST-----
MIHqMIGdAgEAMDgxFzAVBgNVBAoMDnN5c3RlbTptYXN0ZXJzMQ0wCwYDVQQKDARk
ZXZzMQ4wDAYDVQQDDAVhbGljZTAqMAUGAytlcAMhABD50xIkONLMkJlFrKTLCHXc
/28XU5fBtKZ4GHtL70T1oDIwMAYJKoZIhvcNAQkOMSMwITAfBgNVHREEGDAWgg5u
MS5leGFtcGxlLmNvbYcECgAABTAFBgMrZXADQQBqLXhU22oese0bftOQoSD84hRP
xUpwfJ+hOFMn6wsTIuOOwsCRLtFq7istY6Tdaf3h7XmAa5XS0Sp9MSiu80MF
-----END CERTIFICATE REQUEST-----
";

    /// `openssl req -x509`, self-signed P-256: CN=flotilla-t1-ca.
    const CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----
MIIBhzCCAS2gAwIBAgIUHBu5nsBdN6lajAqV7Y0vPR5TfcQwCgYIKoZIzj0EAwIw
GTEXMBUGA1UEAwwOZmxvdGlsbGEtdDEtY2EwHhcNMjYxMjA3MTM0MzU2WhcNMzYx
MjA0MTM0MzU2WjAZMRcwFQYDVQQDDA5mbG90aWxsYS10MS1jYTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABF6XWM0xJkcgeWa9czbWRtTTqpqJzGdQMM8K5oyp/l9F
B0FNpjP7b3M5AlN/MmMG8apXmXwUwhVeKsGpZRI0TQCjUzBRMB0GA1UdDgQWBBQV
HFykJLffm4ThQtX2WXIizrBOiTAfBgNVHSMEGDAWgBQVHFykJLffm4ThQtX2WXIi
zrBOiTAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQCmF4rLpJI/
1ikzI++2gwa0ZbTazu4qxeBd5T7LyK2N7gIgQrWnGno43R1ix+Blgv2NL4c13r2E
AqKUeNmC+b5vzYs=
-----END CERTIFICATE-----
";

    #[test]
    fn signed_requests_parse_and_name_their_organizations() {
        assert_eq!(
            requested_organizations(P256_REQUEST.as_bytes()),
            Ok(vec!["system:nodes".to_string()])
        );
        assert_eq!(
            requested_organizations(ED25519_REQUEST.as_bytes()),
            Ok(vec!["system:masters".to_string(), "devs".to_string()])
        );
        let der = parse_csr(P256_REQUEST.as_bytes()).expect("parses");
        assert_eq!(encode_pem("CERTIFICATE REQUEST", &der), P256_REQUEST);
    }

    #[test]
    fn anything_else_is_refused_with_upstreams_words() {
        assert_eq!(parse_csr(b"not a pem"), Err(CsrError::NotARequest));
        assert_eq!(
            parse_csr(CERTIFICATE.as_bytes()),
            Err(CsrError::NotARequest)
        );
        let garbage = encode_pem("CERTIFICATE REQUEST", b"\x30\x03\x02\x01\x00");
        assert!(matches!(
            parse_csr(garbage.as_bytes()),
            Err(CsrError::X509(_))
        ));
        // The same request with one byte of its signature changed.
        let mut der = parse_csr(P256_REQUEST.as_bytes()).expect("parses");
        let last = der.len() - 1;
        der[last] ^= 1;
        assert_eq!(
            parse_csr(encode_pem("CERTIFICATE REQUEST", &der).as_bytes()),
            Err(CsrError::Signature)
        );
        assert_eq!(
            CsrError::Signature.to_string(),
            "x509: ECDSA verification failure"
        );
    }

    #[test]
    fn blocks_are_read_in_order_until_one_is_broken() {
        let chain = format!(
            "junk\n{CERTIFICATE}{P256_REQUEST}-----BEGIN X-----\n!!\n-----END X-----\n{CERTIFICATE}"
        );
        let blocks = pem_blocks(chain.as_bytes());
        let labels: Vec<&str> = blocks.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["CERTIFICATE", "CERTIFICATE REQUEST"]);
        assert_eq!(first_pem_block(chain.as_bytes()).as_ref(), blocks.first());
        let with_headers = "-----BEGIN CERTIFICATE-----\nProc-Type: 4,ENCRYPTED\n\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(pem_blocks(with_headers.as_bytes()).is_empty(), "not base64");
    }

    #[test]
    fn issued_chains_are_certificate_blocks_only() {
        assert_eq!(validate_certificate(b""), Ok(()));
        assert_eq!(validate_certificate(CERTIFICATE.as_bytes()), Ok(()));
        let two = format!("{CERTIFICATE}{CERTIFICATE}");
        assert_eq!(validate_certificate(two.as_bytes()), Ok(()));
        assert_eq!(validate_certificate(b"x"), Err(CsrError::NoCertificate));
        assert_eq!(
            validate_certificate(P256_REQUEST.as_bytes()),
            Err(CsrError::NotACertificate("CERTIFICATE REQUEST".into()))
        );
        let headers = "-----BEGIN CERTIFICATE-----\nA:B\n-----END CERTIFICATE-----\n";
        assert_eq!(
            validate_certificate(headers.as_bytes()),
            Err(CsrError::NoCertificate),
            "`A:B` is no base64, so the block is no block"
        );
    }
}
