//! CIDR blocks (`10.0.0.0/16`, `fd00::/8`): parsed once into a newtype that answers whether an
//! address is inside, for endpoint access rules and the networks the API server may dial.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A CIDR block: an address and a prefix length valid for its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    address: IpAddr,
    prefix: u8,
}

/// Why a text is not a CIDR block.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a CIDR block: {why}")]
pub struct CidrError {
    text: String,
    why: &'static str,
}

/// An address as its family sees it: an IPv4-mapped IPv6 address (`::ffff:10.0.0.1`, what a
/// dual-stack listener reports for an IPv4 client) is its IPv4 address.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(address, IpAddr::V4),
        v4 => v4,
    }
}

/// The longest prefix a cluster's Service or pod range may have (a /24 and larger).
pub const MAX_CLUSTER_RANGE_PREFIX: u8 = 24;

/// Why `text` is not an IPv4 network `a.b.c.d/n` (host bits zero) with a prefix of at most
/// `max_prefix`; `None` when it is. The management API's rule for its ranges, which the
/// Terraform provider also checks at plan.
pub fn ipv4_network_problem(text: &str, max_prefix: u8) -> Option<String> {
    let Ok(parsed) = text.parse::<Cidr>() else {
        return Some("expected a.b.c.d/n".into());
    };
    if !parsed.address().is_ipv4() {
        return Some("not an IPv4 address".into());
    }
    if parsed.prefix() > max_prefix {
        return Some(format!("prefix length must be at most /{max_prefix}"));
    }
    if !parsed.is_network() {
        return Some("host bits must be zero".into());
    }
    None
}

impl Cidr {
    /// The block of exactly one address.
    pub fn host(address: IpAddr) -> Self {
        Cidr {
            address,
            prefix: Self::bits(address),
        }
    }

    fn bits(address: IpAddr) -> u8 {
        match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        }
    }

    /// The block's first address as written.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether the address is the block's first (no host bits set), as a network is written.
    pub fn is_network(&self) -> bool {
        let host_bits = u32::from(Self::bits(self.address) - self.prefix);
        match self.address {
            IpAddr::V4(v4) => u32::from(v4) & !u32::MAX.checked_shl(host_bits).unwrap_or(0) == 0,
            IpAddr::V6(v6) => u128::from(v6) & !u128::MAX.checked_shl(host_bits).unwrap_or(0) == 0,
        }
    }

    /// Whether `candidate` is inside the block (an IPv4-mapped IPv6 address counts as its
    /// IPv4 address).
    pub fn contains(&self, candidate: IpAddr) -> bool {
        let candidate = match candidate {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(candidate, IpAddr::V4),
            v4 => v4,
        };
        match (self.address, candidate) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let fail = |why| CidrError {
            text: text.to_string(),
            why,
        };
        let (address, prefix) = text.split_once('/').ok_or_else(|| fail("no /prefix"))?;
        let address: IpAddr = address.parse().map_err(|_| fail("not an IP address"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| fail("the prefix is not a number"))?;
        if prefix > Self::bits(address) {
            return Err(fail("the prefix is longer than the address"));
        }
        Ok(Cidr { address, prefix })
    }
}

impl TryFrom<&str> for Cidr {
    type Error = CidrError;

    fn try_from(text: &str) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        let cases = [
            ("10.1.0.0/16", "10.1.255.7", true),
            ("10.1.0.0/16", "10.2.0.1", false),
            ("0.0.0.0/0", "203.0.113.9", true),
            ("127.0.0.1/32", "127.0.0.1", true),
            ("127.0.0.1/32", "127.0.0.2", false),
            ("10.1.0.0/16", "::ffff:10.1.2.3", true),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "fe80::1", false),
            ("::/0", "10.0.0.1", false),
        ];
        for (block, address, inside) in cases {
            let cidr: Cidr = block.parse().expect("cidr");
            assert_eq!(cidr.contains(ip(address)), inside, "{block} ∋ {address}");
        }
        assert!(Cidr::host(ip("10.0.0.5")).contains(ip("10.0.0.5")));
        for (block, network) in [
            ("10.1.0.0/16", true),
            ("10.1.0.1/16", false),
            ("0.0.0.0/0", true),
            ("10.0.0.5/32", true),
            ("fd00::/8", true),
            ("fd00::1/64", false),
        ] {
            let cidr: Cidr = block.parse().expect("cidr");
            assert_eq!(cidr.is_network(), network, "{block}");
        }
        assert_eq!(Cidr::host(ip("10.0.0.5")).to_string(), "10.0.0.5/32");
    }

    #[test]
    fn malformed_blocks_are_refused() {
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "10.0.0.0/a", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }
}
