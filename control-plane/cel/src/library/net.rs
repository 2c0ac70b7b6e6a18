//! The `kubernetes.net.ip` and `kubernetes.net.cidr` libraries: `ip()`, `isIP()`,
//! `ip.isCanonical()`, `cidr()`, `isCIDR()` and their methods (upstream `library/ip.go`,
//! `library/cidr.go`), following Go's `net/netip` semantics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cel::common::types::STRING_TYPE;
use cel::common::value::CowVal;
use cel::{DeclarationError, Env, ExecutionError};
use flotilla_api_machinery::field::go_quote;

use super::{arg, bool_val, error, global, int_val, member, opaque_value, str_arg, string_val};

/// An IP address value (`net.IP`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ip(IpAddr);

/// A network prefix value (`net.CIDR`): the address as written and the prefix length.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cidr {
    addr: IpAddr,
    bits: u8,
}

opaque_value!(Ip, IP_TYPE, "net.IP");
opaque_value!(Cidr, CIDR_TYPE, "net.CIDR");

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(IP_TYPE.to_owned())?;
    env.add_type(CIDR_TYPE.to_owned())?;
    global(env, "ip", &[&STRING_TYPE], |args| {
        let text = str_arg(&args, 0, "ip")?;
        parse_ip(text)
            .map(|a| CowVal::owned(Ip(a)))
            .map_err(|e| error("ip", e))
    })?;
    global(env, "isIP", &[&STRING_TYPE], |args| {
        Ok(bool_val(parse_ip(str_arg(&args, 0, "isIP")?).is_ok()))
    })?;
    global(env, "ip.isCanonical", &[&STRING_TYPE], |args| {
        let text = str_arg(&args, 0, "ip.isCanonical")?;
        let addr = parse_ip(text).map_err(|e| error("ip.isCanonical", e))?;
        Ok(bool_val(addr.to_string() == text))
    })?;
    global(env, "string", &[&IP_TYPE], |args| {
        Ok(string_val(ip(&args, 0, "string")?.to_string()))
    })?;
    member(env, "family", &IP_TYPE, &[], |args| {
        Ok(int_val(if ip(&args, 0, "family")?.is_ipv4() {
            4
        } else {
            6
        }))
    })?;
    member(env, "isUnspecified", &IP_TYPE, &[], |args| {
        Ok(bool_val(ip(&args, 0, "isUnspecified")?.is_unspecified()))
    })?;
    member(env, "isLoopback", &IP_TYPE, &[], |args| {
        Ok(bool_val(ip(&args, 0, "isLoopback")?.is_loopback()))
    })?;
    member(env, "isLinkLocalMulticast", &IP_TYPE, &[], |args| {
        Ok(bool_val(match ip(&args, 0, "isLinkLocalMulticast")? {
            IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
            IpAddr::V6(v6) => v6.octets()[0] == 0xff && v6.octets()[1] & 0x0f == 0x02,
        }))
    })?;
    member(env, "isLinkLocalUnicast", &IP_TYPE, &[], |args| {
        Ok(bool_val(is_link_local_unicast(ip(
            &args,
            0,
            "isLinkLocalUnicast",
        )?)))
    })?;
    member(env, "isGlobalUnicast", &IP_TYPE, &[], |args| {
        Ok(bool_val(is_global_unicast(ip(
            &args,
            0,
            "isGlobalUnicast",
        )?)))
    })?;

    global(env, "cidr", &[&STRING_TYPE], |args| {
        let text = str_arg(&args, 0, "cidr")?;
        parse_cidr(text).map(CowVal::owned).map_err(|e| {
            error(
                "cidr",
                format!("network address parse error during conversion from string: {e}"),
            )
        })
    })?;
    global(env, "isCIDR", &[&STRING_TYPE], |args| {
        Ok(bool_val(parse_cidr(str_arg(&args, 0, "isCIDR")?).is_ok()))
    })?;
    global(env, "string", &[&CIDR_TYPE], |args| {
        let c = arg::<Cidr>(&args, 0, "string")?;
        Ok(string_val(format!("{}/{}", c.addr, c.bits)))
    })?;
    member(env, "containsIP", &CIDR_TYPE, &[&IP_TYPE], |args| {
        let c = arg::<Cidr>(&args, 0, "containsIP")?;
        Ok(bool_val(c.contains(ip(&args, 1, "containsIP")?)))
    })?;
    member(env, "containsIP", &CIDR_TYPE, &[&STRING_TYPE], |args| {
        let c = arg::<Cidr>(&args, 0, "containsIP")?;
        let addr =
            parse_ip(str_arg(&args, 1, "containsIP")?).map_err(|e| error("containsIP", e))?;
        Ok(bool_val(c.contains(addr)))
    })?;
    member(env, "containsCIDR", &CIDR_TYPE, &[&CIDR_TYPE], |args| {
        let c = arg::<Cidr>(&args, 0, "containsCIDR")?;
        Ok(bool_val(c.contains_cidr(arg::<Cidr>(
            &args,
            1,
            "containsCIDR",
        )?)))
    })?;
    member(env, "containsCIDR", &CIDR_TYPE, &[&STRING_TYPE], |args| {
        let c = arg::<Cidr>(&args, 0, "containsCIDR")?;
        let other = parse_cidr(str_arg(&args, 1, "containsCIDR")?).map_err(|e| {
            error(
                "containsCIDR",
                format!("network address parse error during conversion from string: {e}"),
            )
        })?;
        Ok(bool_val(c.contains_cidr(&other)))
    })?;
    member(env, "ip", &CIDR_TYPE, &[], |args| {
        Ok(CowVal::owned(Ip(arg::<Cidr>(&args, 0, "ip")?.addr)))
    })?;
    member(env, "masked", &CIDR_TYPE, &[], |args| {
        let c = arg::<Cidr>(&args, 0, "masked")?;
        Ok(CowVal::owned(Cidr {
            addr: mask(c.addr, c.bits),
            bits: c.bits,
        }))
    })?;
    member(env, "prefixLength", &CIDR_TYPE, &[], |args| {
        Ok(int_val(i64::from(
            arg::<Cidr>(&args, 0, "prefixLength")?.bits,
        )))
    })?;
    Ok(())
}

fn ip(args: &[CowVal<'_, '_>], index: usize, function: &str) -> Result<IpAddr, ExecutionError> {
    arg::<Ip>(args, index, function).map(|i| i.0)
}

/// `netip.ParseAddr` plus upstream's refusal of zones and IPv4-mapped IPv6 addresses.
pub(crate) fn parse_ip(raw: &str) -> Result<IpAddr, String> {
    let addr = match raw.parse::<IpAddr>() {
        Ok(addr) => addr,
        Err(_) => {
            // Go accepts zones and lets upstream refuse them with its own message
            if let Some((addr, zone)) = raw.split_once('%')
                && !zone.is_empty()
                && addr.parse::<Ipv6Addr>().is_ok()
            {
                return Err(format!(
                    "IP address {} with zone value is not allowed",
                    go_quote(raw)
                ));
            }
            return Err(format!(
                "IP Address {} parse error during conversion from string: ParseAddr({}): unable to parse IP",
                go_quote(raw),
                go_quote(raw)
            ));
        }
    };
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(format!(
            "IPv4-mapped IPv6 address {} is not allowed",
            go_quote(raw)
        ));
    }
    Ok(addr)
}

/// `netip.ParsePrefix` plus upstream's refusal of IPv4-mapped IPv6 addresses.
fn parse_cidr(raw: &str) -> Result<Cidr, String> {
    let fail = |why: &str| {
        format!(
            "network address parse error during conversion from string: netip.ParsePrefix({}): {why}",
            go_quote(raw)
        )
    };
    let Some((addr, bits)) = raw.rsplit_once('/') else {
        return Err(fail("no '/'"));
    };
    if addr.contains('%') {
        return Err(fail("IPv6 zones cannot be present in a prefix"));
    }
    let addr: IpAddr = addr.parse().map_err(|_| {
        fail(&format!(
            "ParseAddr({}): unable to parse IP",
            go_quote(addr)
        ))
    })?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let valid_bits = !bits.is_empty()
        && bits.bytes().all(|b| b.is_ascii_digit())
        && (bits == "0" || !bits.starts_with('0'));
    let bits: u8 = match bits.parse::<u16>() {
        Ok(n) if valid_bits && n <= max => n as u8,
        _ => return Err(fail(&format!("bad bits after slash: {}", go_quote(bits)))),
    };
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(format!(
            "IPv4-mapped IPv6 address {} is not allowed",
            go_quote(raw)
        ));
    }
    Ok(Cidr { addr, bits })
}

fn mask(addr: IpAddr, bits: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let m = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(bits))
            };
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(bits))
            };
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & m))
        }
    }
}

impl Cidr {
    fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && mask(addr, self.bits) == mask(self.addr, self.bits)
    }

    /// Upstream: the prefixes overlap and this one is no longer than the other.
    fn contains_cidr(&self, other: &Cidr) -> bool {
        let shortest = self.bits.min(other.bits);
        self.addr.is_ipv4() == other.addr.is_ipv4()
            && mask(self.addr, shortest) == mask(other.addr, shortest)
            && self.bits <= other.bits
    }
}

fn is_link_local_unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4.octets()[..2] == [169, 254],
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

/// Go's `Addr.IsGlobalUnicast`: private and unique-local addresses count as global.
fn is_global_unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => {
            !v4.is_unspecified()
                && !v4.is_broadcast()
                && !v4.is_loopback()
                && !v4.is_multicast()
                && !is_link_local_unicast(addr)
        }
        IpAddr::V6(v6) => {
            !v6.is_unspecified()
                && !v6.is_loopback()
                && !v6.is_multicast()
                && !is_link_local_unicast(addr)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_like_upstream() {
        assert!(parse_ip("192.168.0.1").is_ok());
        assert!(parse_ip("2001:db8::abcd").is_ok());
        assert_eq!(
            parse_ip("::ffff:1.2.3.4").err().as_deref(),
            Some("IPv4-mapped IPv6 address \"::ffff:1.2.3.4\" is not allowed")
        );
        assert_eq!(
            parse_ip("fe80::1%eth0").err().as_deref(),
            Some("IP address \"fe80::1%eth0\" with zone value is not allowed")
        );
        assert!(parse_ip("01.2.3.4").is_err(), "leading zeros");
        assert!(parse_ip("foo").is_err());
    }

    #[test]
    fn classifies_addresses_like_netip() {
        let cases: &[(&str, bool, bool)] = &[
            // address, link-local unicast, global unicast
            ("169.254.169.254", true, false),
            ("192.168.0.1", false, true),
            ("255.255.255.255", false, false),
            ("fe80::1", true, false),
            ("2001:db8::abcd", false, true),
            ("ff00::1", false, false),
            ("fd00::1", false, true),
        ];
        for (text, link_local, global) in cases {
            let addr = parse_ip(text).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(is_link_local_unicast(addr), *link_local, "{text}");
            assert_eq!(is_global_unicast(addr), *global, "{text}");
        }
    }

    #[test]
    fn prefixes_contain_like_upstream() {
        let c = |s: &str| parse_cidr(s).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            c("192.168.0.0/24")
                .contains(parse_ip("192.168.0.1").unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
        );
        assert!(c("192.168.0.0/16").contains_cidr(&c("192.168.10.0/24")));
        assert!(!c("192.168.1.0/24").contains_cidr(&c("192.168.2.0/24")));
        assert!(!c("192.168.10.0/24").contains_cidr(&c("192.168.0.0/16")));
        assert_eq!(
            mask(c("192.168.0.1/24").addr, 24).to_string(),
            "192.168.0.0"
        );
        assert!(parse_cidr("192.168.0.0").is_err());
        assert!(parse_cidr("192.168.0.0/33").is_err());
        assert!(parse_cidr("::ffff:1.2.3.4/120").is_err());
    }
}
