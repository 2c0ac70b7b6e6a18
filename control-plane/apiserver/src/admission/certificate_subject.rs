//! Upstream's CertificateSubjectRestriction admission plugin: a CertificateSigningRequest for
//! the `kubernetes.io/kube-apiserver-client` signer may not ask for the `system:masters`
//! group, so that approving a request can never mint a credential that bypasses RBAC.

use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

const API_SERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

/// The CertificateSubjectRestriction plugin.
pub struct CertificateSubjectRestriction;

#[async_trait::async_trait]
impl Plugin for CertificateSubjectRestriction {
    fn name(&self) -> &'static str {
        "CertificateSubjectRestriction"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create
            && attributes.subresource.is_empty()
            && attributes.resource.group == "certificates.k8s.io"
            && attributes.resource.plural == "certificatesigningrequests"
    }

    async fn validate(
        &self,
        _context: &Context<'_>,
        attributes: &Attributes<'_>,
        csr: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if meta::str_at(csr, &["spec", "signerName"]) != Some(API_SERVER_CLIENT_SIGNER) {
            return Ok(());
        }
        let organizations = crate::certificates::requested_organizations(csr)
            .map_err(|e| ApiError::internal(format!("failed to parse CSR: {e}")))?;
        if organizations.iter().any(|o| o == "system:masters") {
            return Err(forbidden(
                attributes,
                csr,
                &format!(
                    "use of {API_SERVER_CLIENT_SIGNER} signer with system:masters group is not allowed"
                ),
            ));
        }
        Ok(())
    }
}
