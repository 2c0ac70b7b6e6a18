//! Who may reach a cluster's endpoint (EKS's `endpointAccess`): the public endpoint from the
//! `publicAccessCidrs`, the private one from the operator's private networks. Checked on
//! every request that came over the network, before authentication.

use std::net::IpAddr;

use flotilla_api_machinery::cidr::Cidr;

/// One cluster's endpoint access, as the management API sets it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointAccess {
    /// The endpoint answers clients in `public_access_cidrs`.
    pub public: bool,
    /// The endpoint answers clients in the service's private networks.
    pub private: bool,
    /// Who may use the public endpoint (`0.0.0.0/0`: everyone, IPv6 clients too).
    pub public_access_cidrs: Vec<String>,
}

impl Default for EndpointAccess {
    fn default() -> Self {
        EndpointAccess {
            public: true,
            private: false,
            public_access_cidrs: vec!["0.0.0.0/0".into()],
        }
    }
}

impl EndpointAccess {
    /// Whether `client` may reach the endpoint; the refusal says which rule refused it.
    pub fn admits(&self, client: IpAddr, private_networks: &[Cidr]) -> Result<(), String> {
        let client = flotilla_api_machinery::cidr::canonical(client);
        if self.private && private_networks.iter().any(|net| net.contains(client)) {
            return Ok(());
        }
        if self.public {
            // Open to everyone (the default) is decided without parsing anything: this runs
            // on every request.
            let admitted = self.public_access_cidrs.iter().any(|c| {
                c == "0.0.0.0/0" || c.parse::<Cidr>().is_ok_and(|cidr| cidr.contains(client))
            });
            if admitted {
                return Ok(());
            }
            return Err(format!(
                "the cluster's endpoint does not answer {client}: it is not in publicAccessCidrs [{}]{}",
                self.public_access_cidrs.join(" "),
                if self.private {
                    " nor in the service's private networks"
                } else {
                    ""
                }
            ));
        }
        Err(format!(
            "the cluster's endpoint is private (endpointAccess.public is false) and {client} is not in the service's private networks"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn public_cidrs_and_private_networks_decide() {
        let private: Vec<Cidr> = vec!["10.199.0.0/16".parse().expect("cidr")];
        let open = EndpointAccess::default();
        assert!(open.admits(ip("127.0.0.1"), &private).is_ok());
        assert!(open.admits(ip("::1"), &private).is_ok());

        let narrow = EndpointAccess {
            public_access_cidrs: vec!["10.1.0.0/16".into()],
            ..Default::default()
        };
        assert!(narrow.admits(ip("10.1.3.4"), &private).is_ok());
        let refused = narrow
            .admits(ip("127.0.0.1"), &private)
            .expect_err("refused");
        assert!(
            refused.contains("not in publicAccessCidrs [10.1.0.0/16]"),
            "{refused}"
        );
        assert!(narrow.admits(ip("10.199.0.5"), &private).is_err());

        let both = EndpointAccess {
            private: true,
            ..narrow.clone()
        };
        assert!(both.admits(ip("10.199.0.5"), &private).is_ok());

        let private_only = EndpointAccess {
            public: false,
            private: true,
            ..Default::default()
        };
        assert!(private_only.admits(ip("10.199.0.5"), &private).is_ok());
        let refused = private_only
            .admits(ip("127.0.0.1"), &private)
            .expect_err("refused");
        assert!(refused.contains("private"), "{refused}");
        assert!(private_only.admits(ip("127.0.0.1"), &[]).is_err());
    }
}
