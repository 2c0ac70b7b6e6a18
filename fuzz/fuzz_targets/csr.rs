//! CertificateSigningRequests' payloads (`api_machinery::csr`), which any user allowed to
//! create a CSR — every node's bootstrap token — sends the API server: arbitrary bytes as
//! `spec.request` and `status.certificate` (PEM text), and the same bytes as the DER inside a
//! `CERTIFICATE REQUEST` block (so that the PKCS#10 and signature code is reached without
//! base64 in the way). No panic, and: the first PEM block is the first of the blocks; every
//! block written back as PEM reads back the same; a request that parses and verifies is
//! accepted again from its DER in a fresh block, and asks for the same organizations; an
//! accepted certificate chain is CERTIFICATE blocks only, none with headers.
#![no_main]

use flotilla_api_machinery::csr::{
    self, CsrError, encode_pem, first_pem_block, pem_blocks, validate_certificate,
};
use libfuzzer_sys::fuzz_target;

/// Checks the request in `pem`, whatever it is.
fn request(pem: &[u8]) {
    let parsed = csr::parse_csr(pem);
    let organizations = csr::requested_organizations(pem);
    match (&parsed, &organizations) {
        (Ok(der), Ok(organizations)) => {
            let again = encode_pem("CERTIFICATE REQUEST", der);
            assert_eq!(csr::parse_csr(again.as_bytes()).as_ref(), Ok(der));
            assert_eq!(
                csr::requested_organizations(again.as_bytes()).as_ref(),
                Ok(organizations)
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "one request, one verdict"),
        _ => panic!("parse_csr {parsed:?} but requested_organizations {organizations:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let blocks = pem_blocks(data);
    assert_eq!(first_pem_block(data).as_ref(), blocks.first());
    for block in &blocks {
        let again = encode_pem(&block.label, &block.contents);
        assert_eq!(pem_blocks(again.as_bytes()).first(), Some(block), "{again}");
    }
    request(data);
    match validate_certificate(data) {
        Ok(()) => assert!(
            data.is_empty()
                || (!blocks.is_empty()
                    && blocks
                        .iter()
                        .all(|b| b.label == "CERTIFICATE" && !b.headers)),
            "{blocks:?}"
        ),
        Err(CsrError::NoCertificate) => assert!(blocks.is_empty()),
        Err(_) => assert!(!blocks.is_empty()),
    }
    request(encode_pem("CERTIFICATE REQUEST", data).as_bytes());
});
