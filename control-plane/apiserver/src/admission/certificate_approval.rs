//! Upstream's CertificateApproval admission plugin
//! (`plugin/pkg/admission/certificates/approval`): changing a CertificateSigningRequest's
//! approval (its `/approval` subresource) needs the `approve` verb on `signers` named by its
//! signer (or the signer's `<domain>/*`) — being able to update approval is not enough.

use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The CertificateApproval plugin.
pub struct CertificateApproval;

/// What the user must be allowed for `signer` to approve: `approve` on each name that grants
/// it, any one sufficing.
fn approve_attributes(
    user: &flotilla_api_machinery::rbac::UserInfo,
    signer: &str,
) -> Vec<flotilla_api_machinery::rbac::Attributes> {
    crate::certificates::signer_names(signer)
        .into_iter()
        .map(|name| flotilla_api_machinery::rbac::Attributes {
            user: user.clone(),
            verb: "approve".into(),
            api_group: "certificates.k8s.io".into(),
            api_version: "*".into(),
            resource: "signers".into(),
            name,
            resource_request: true,
            ..Default::default()
        })
        .collect()
}

#[async_trait::async_trait]
impl Plugin for CertificateApproval {
    fn name(&self) -> &'static str {
        "CertificateApproval"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Update
            && attributes.subresource == "approval"
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
        let Some(user) = attributes.user else {
            return Ok(());
        };
        // The signer of the request as stored: a request's spec never changes.
        let signer =
            meta::str_at(attributes.old.unwrap_or(csr), &["spec", "signerName"]).unwrap_or("");
        for asked in approve_attributes(user, signer) {
            if context.authorizer.allowed(&asked).await? {
                return Ok(());
            }
        }
        Err(forbidden(
            attributes,
            csr,
            &format!("user not permitted to approve requests with signerName {signer:?}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approving_asks_for_the_signer_or_its_domain() {
        let user = flotilla_api_machinery::rbac::UserInfo::new("alice", &[]);
        let asked = approve_attributes(&user, "example.com/issuer");
        let names: Vec<&str> = asked.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["example.com/issuer", "example.com/*"]);
        assert!(asked.iter().all(|a| a.verb == "approve"
            && a.resource == "signers"
            && a.api_group == "certificates.k8s.io"
            && a.user.name == "alice"));
    }

    #[test]
    fn only_approval_updates_are_its_business() {
        use super::super::testing::attributes;
        let plugin = CertificateApproval;
        let csrs = |operation, subresource| {
            attributes(
                operation,
                "certificates.k8s.io",
                "certificatesigningrequests",
                subresource,
            )
        };
        assert!(plugin.handles(&csrs(Operation::Update, "approval")));
        assert!(!plugin.handles(&csrs(Operation::Update, "status")));
        assert!(!plugin.handles(&csrs(Operation::Update, "")));
        assert!(!plugin.handles(&csrs(Operation::Create, "")));
    }
}
