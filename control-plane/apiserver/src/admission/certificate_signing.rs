//! Upstream's CertificateSigning admission plugin: writing a certificate into a
//! CertificateSigningRequest's status (its `/status` subresource) needs the `sign` verb on
//! `signers` for the request's signerName (or `<domain>/*`) — being able to update CSR status
//! is not enough to issue credentials.

use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The CertificateSigning plugin.
pub struct CertificateSigning;

#[async_trait::async_trait]
impl Plugin for CertificateSigning {
    fn name(&self) -> &'static str {
        "CertificateSigning"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Update
            && attributes.subresource == "status"
            && attributes.resource.group == "certificates.k8s.io"
            && attributes.resource.plural == "certificatesigningrequests"
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        csr: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let Some(old) = attributes.old else {
            return Ok(());
        };
        let certificate = |c: &Value| meta::at(c, &["status", "certificate"]).cloned();
        if certificate(old) == certificate(csr) {
            return Ok(());
        }
        let Some(user) = attributes.user else {
            return Ok(());
        };
        let signer = meta::str_at(old, &["spec", "signerName"]).unwrap_or("");
        for name in crate::certificates::signer_names(signer) {
            let asked = flotilla_api_machinery::rbac::Attributes {
                user: user.clone(),
                verb: "sign".into(),
                api_group: "certificates.k8s.io".into(),
                api_version: "*".into(),
                resource: "signers".into(),
                name,
                resource_request: true,
                ..Default::default()
            };
            if context.authorizer.allowed(&asked).await? {
                return Ok(());
            }
        }
        Err(forbidden(
            attributes,
            csr,
            &format!("user not permitted to sign requests with signerName {signer:?}"),
        ))
    }
}
