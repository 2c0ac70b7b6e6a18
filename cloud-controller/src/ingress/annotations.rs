//! The `alb.ingress.kubernetes.io/*` annotations this controller reads, their upstream
//! defaults and their parsing. Target-group annotations may be set on the backend Service,
//! which wins over the Ingress (upstream's precedence). Every bad value is an
//! [`AnnotationError`] naming the annotation.

use std::collections::BTreeMap;

use crate::provider::AlbHealthCheck;

/// `internal` (default) or `internet-facing`.
pub const SCHEME: &str = "alb.ingress.kubernetes.io/scheme";
/// JSON list of `{"HTTP": 80}` / `{"HTTPS": 443}` (default `[{"HTTP": 80}]`, or
/// `[{"HTTPS": 443}]` when a certificate is given).
pub const LISTEN_PORTS: &str = "alb.ingress.kubernetes.io/listen-ports";
/// Certificate ARNs for HTTPS listeners, comma separated (the first is the default).
pub const CERTIFICATE_ARN: &str = "alb.ingress.kubernetes.io/certificate-arn";
/// Security policy of HTTPS listeners.
pub const SSL_POLICY: &str = "alb.ingress.kubernetes.io/ssl-policy";
/// `instance` (default); `ip` is not supported here.
pub const TARGET_TYPE: &str = "alb.ingress.kubernetes.io/target-type";
/// `HTTP` (default) or `HTTPS` towards the targets.
pub const BACKEND_PROTOCOL: &str = "alb.ingress.kubernetes.io/backend-protocol";
/// Health check path (default `/`).
pub const HEALTHCHECK_PATH: &str = "alb.ingress.kubernetes.io/healthcheck-path";
/// Health check protocol (default: the backend protocol).
pub const HEALTHCHECK_PROTOCOL: &str = "alb.ingress.kubernetes.io/healthcheck-protocol";
/// Health check port: `traffic-port` (default) or a number.
pub const HEALTHCHECK_PORT: &str = "alb.ingress.kubernetes.io/healthcheck-port";
/// Seconds between health checks (default 15).
pub const HEALTHCHECK_INTERVAL: &str = "alb.ingress.kubernetes.io/healthcheck-interval-seconds";
/// Seconds a health check may take (default 5).
pub const HEALTHCHECK_TIMEOUT: &str = "alb.ingress.kubernetes.io/healthcheck-timeout-seconds";
/// Successes before healthy (default 2).
pub const HEALTHY_THRESHOLD: &str = "alb.ingress.kubernetes.io/healthy-threshold-count";
/// Failures before unhealthy (default 2).
pub const UNHEALTHY_THRESHOLD: &str = "alb.ingress.kubernetes.io/unhealthy-threshold-count";
/// Status codes of a healthy answer (default `200`).
pub const SUCCESS_CODES: &str = "alb.ingress.kubernetes.io/success-codes";
/// Security groups (IDs or names, comma separated) to attach instead of a managed one.
pub const SECURITY_GROUPS: &str = "alb.ingress.kubernetes.io/security-groups";
/// CIDRs (comma separated) the managed security group lets in on the listen ports
/// (default `0.0.0.0/0`).
pub const INBOUND_CIDRS: &str = "alb.ingress.kubernetes.io/inbound-cidrs";

/// Upstream's default security policy of HTTPS listeners.
pub const DEFAULT_SSL_POLICY: &str = "ELBSecurityPolicy-2016-08";

/// An annotation with a value this controller cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: {reason}")]
pub struct AnnotationError {
    /// The annotation's name.
    pub annotation: &'static str,
    /// What is wrong with its value.
    pub reason: String,
}

fn invalid(annotation: &'static str, reason: String) -> AnnotationError {
    AnnotationError { annotation, reason }
}

/// The annotations of the objects that may set a value, most specific first.
pub type Layers<'a> = [&'a BTreeMap<String, String>];

fn lookup<'a>(layers: &Layers<'a>, key: &str) -> Option<&'a str> {
    layers
        .iter()
        .find_map(|layer| layer.get(key).map(|v| v.trim()))
}

/// A listener protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ListenProtocol {
    /// HTTP.
    Http,
    /// HTTPS (needs a certificate).
    Https,
}

impl ListenProtocol {
    /// ELBv2's name of it.
    pub fn as_str(self) -> &'static str {
        match self {
            ListenProtocol::Http => "HTTP",
            ListenProtocol::Https => "HTTPS",
        }
    }
}

/// Whether the load balancer is internal (upstream's default) rather than internet-facing.
pub fn internal(ingress: &BTreeMap<String, String>) -> Result<bool, AnnotationError> {
    match lookup(&[ingress], SCHEME) {
        None | Some("internal") => Ok(true),
        Some("internet-facing") => Ok(false),
        Some(other) => Err(invalid(
            SCHEME,
            format!("{other:?} is not \"internal\" or \"internet-facing\""),
        )),
    }
}

/// The certificate ARNs, in order, empty ones dropped.
pub fn certificate_arns(ingress: &BTreeMap<String, String>) -> Vec<String> {
    lookup(&[ingress], CERTIFICATE_ARN)
        .map(string_list)
        .unwrap_or_default()
}

/// A comma-separated list, items trimmed, empty ones dropped.
fn string_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

/// The security groups the user names (upstream's `security-groups`), empty for a managed one.
pub fn security_groups(ingress: &BTreeMap<String, String>) -> Vec<String> {
    lookup(&[ingress], SECURITY_GROUPS)
        .map(string_list)
        .unwrap_or_default()
}

/// Whether `text` is a CIDR block (`address/prefix`, prefix within the address's length).
fn is_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

/// Upstream's `computeIngressExplicitInboundCIDRs` for an IPv4 load balancer: the IPv4 CIDRs
/// clients may come from, `0.0.0.0/0` when none is given; IPv6 ones are valid but, as
/// upstream does without dualstack, not used. A value that is no CIDR is an error.
pub fn inbound_cidrs(ingress: &BTreeMap<String, String>) -> Result<Vec<String>, AnnotationError> {
    let given = lookup(&[ingress], INBOUND_CIDRS)
        .map(string_list)
        .unwrap_or_default();
    if let Some(bad) = given.iter().find(|cidr| !is_cidr(cidr)) {
        return Err(invalid(
            INBOUND_CIDRS,
            format!("{bad:?} is not a CIDR block (e.g. 10.0.0.0/8)"),
        ));
    }
    if given.is_empty() {
        return Ok(vec!["0.0.0.0/0".to_string()]);
    }
    Ok(given
        .into_iter()
        .filter(|cidr| !cidr.contains(':'))
        .collect())
}

/// The security policy of HTTPS listeners.
pub fn ssl_policy(ingress: &BTreeMap<String, String>) -> String {
    lookup(&[ingress], SSL_POLICY)
        .filter(|p| !p.is_empty())
        .unwrap_or(DEFAULT_SSL_POLICY)
        .to_string()
}

/// Upstream's `computeIngressListenPorts`: the listeners by port (a later entry for a port
/// wins); without the annotation HTTP:80, or HTTPS:443 when `prefer_tls`.
pub fn listen_ports(
    ingress: &BTreeMap<String, String>,
    prefer_tls: bool,
) -> Result<BTreeMap<i32, ListenProtocol>, AnnotationError> {
    let Some(raw) = lookup(&[ingress], LISTEN_PORTS) else {
        return Ok(if prefer_tls {
            BTreeMap::from([(443, ListenProtocol::Https)])
        } else {
            BTreeMap::from([(80, ListenProtocol::Http)])
        });
    };
    let entries: Vec<BTreeMap<String, serde_json::Value>> =
        serde_json::from_str(raw).map_err(|err| {
            invalid(
                LISTEN_PORTS,
                format!("failed to parse listen-ports configuration `{raw}`: {err}"),
            )
        })?;
    if entries.is_empty() {
        return Err(invalid(
            LISTEN_PORTS,
            format!("empty listen-ports configuration `{raw}`"),
        ));
    }
    let mut ports = BTreeMap::new();
    for entry in entries {
        for (protocol, port) in entry {
            let port = port
                .as_i64()
                .filter(|p| (1..=65535).contains(p))
                .and_then(|p| i32::try_from(p).ok())
                .ok_or_else(|| {
                    invalid(
                        LISTEN_PORTS,
                        format!("listen port must be within [1, 65535]: {port}"),
                    )
                })?;
            let protocol = match protocol.as_str() {
                "HTTP" => ListenProtocol::Http,
                "HTTPS" => ListenProtocol::Https,
                other => {
                    return Err(invalid(
                        LISTEN_PORTS,
                        format!("listen protocol must be within [HTTP, HTTPS]: {other}"),
                    ));
                }
            };
            ports.insert(port, protocol);
        }
    }
    Ok(ports)
}

/// Checks the target type: only `instance` targets (the NodePort on every node) are made.
pub fn check_target_type(layers: &Layers<'_>) -> Result<(), AnnotationError> {
    match lookup(layers, TARGET_TYPE) {
        None | Some("instance") => Ok(()),
        Some("ip") => Err(invalid(
            TARGET_TYPE,
            "\"ip\" targets are not supported (use \"instance\")".into(),
        )),
        Some(other) => Err(invalid(
            TARGET_TYPE,
            format!("{other:?} is not \"instance\" or \"ip\""),
        )),
    }
}

fn protocol(
    layers: &Layers<'_>,
    annotation: &'static str,
) -> Result<Option<String>, AnnotationError> {
    match lookup(layers, annotation) {
        None => Ok(None),
        Some(value) => match value.to_ascii_uppercase().as_str() {
            p @ ("HTTP" | "HTTPS") => Ok(Some(p.to_string())),
            _ => Err(invalid(
                annotation,
                format!("{value:?} is not HTTP or HTTPS"),
            )),
        },
    }
}

/// The protocol towards the targets.
pub fn backend_protocol(layers: &Layers<'_>) -> Result<String, AnnotationError> {
    Ok(protocol(layers, BACKEND_PROTOCOL)?.unwrap_or_else(|| "HTTP".into()))
}

fn int(
    layers: &Layers<'_>,
    annotation: &'static str,
    default: i32,
    min: i32,
    max: i32,
) -> Result<i32, AnnotationError> {
    match lookup(layers, annotation) {
        None => Ok(default),
        Some(value) => match value.parse::<i32>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(invalid(
                annotation,
                format!("{value:?} is not a whole number from {min} to {max}"),
            )),
        },
    }
}

/// The target group's health check, with upstream's ALB defaults (HTTP on the traffic port,
/// path `/`, every 15 s, 5 s timeout, thresholds 2 and 2, code 200), within ELBv2's limits.
pub fn health_check(
    layers: &Layers<'_>,
    backend_protocol: &str,
) -> Result<AlbHealthCheck, AnnotationError> {
    let protocol =
        protocol(layers, HEALTHCHECK_PROTOCOL)?.unwrap_or_else(|| backend_protocol.into());
    let port = match lookup(layers, HEALTHCHECK_PORT) {
        None | Some("traffic-port") => "traffic-port".to_string(),
        Some(value) => match value.parse::<u16>() {
            Ok(n) if n > 0 => n.to_string(),
            _ => {
                return Err(invalid(
                    HEALTHCHECK_PORT,
                    format!("{value:?} is not \"traffic-port\" or a port number"),
                ));
            }
        },
    };
    let path = lookup(layers, HEALTHCHECK_PATH).unwrap_or("/").to_string();
    if !path.starts_with('/') || path.len() > 1024 {
        return Err(invalid(
            HEALTHCHECK_PATH,
            format!("{path:?} is not a path starting with \"/\" (at most 1024 characters)"),
        ));
    }
    let interval_seconds = int(layers, HEALTHCHECK_INTERVAL, 15, 5, 300)?;
    let timeout_seconds = int(layers, HEALTHCHECK_TIMEOUT, 5, 2, 120)?;
    if timeout_seconds >= interval_seconds {
        return Err(invalid(
            HEALTHCHECK_TIMEOUT,
            format!(
                "{timeout_seconds} s must be shorter than the interval of {interval_seconds} s"
            ),
        ));
    }
    let success_codes = lookup(layers, SUCCESS_CODES).unwrap_or("200").to_string();
    let codes_ok = !success_codes.is_empty()
        && success_codes
            .split([',', '-'])
            .all(|code| code.parse::<u16>().is_ok_and(|c| (200..=499).contains(&c)));
    if !codes_ok {
        return Err(invalid(
            SUCCESS_CODES,
            format!(
                "{success_codes:?} is not HTTP codes from 200 to 499 (\"200\", \"200,302\", \"200-299\")"
            ),
        ));
    }
    Ok(AlbHealthCheck {
        protocol,
        port,
        path,
        interval_seconds,
        timeout_seconds,
        healthy_threshold: int(layers, HEALTHY_THRESHOLD, 2, 2, 10)?,
        unhealthy_threshold: int(layers, UNHEALTHY_THRESHOLD, 2, 2, 10)?,
        success_codes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn listen_ports_parse_as_upstream() {
        use ListenProtocol::{Http, Https};
        type Case<'a> = (&'a [(&'a str, &'a str)], bool, Vec<(i32, ListenProtocol)>);
        let cases: [Case; 5] = [
            (&[], false, vec![(80, Http)]),
            (&[], true, vec![(443, Https)]),
            (
                &[(LISTEN_PORTS, r#"[{"HTTP": 80}, {"HTTPS": 443}]"#)],
                false,
                vec![(80, Http), (443, Https)],
            ),
            (
                &[(LISTEN_PORTS, r#"[{"HTTP": 8080, "HTTPS": 8443}]"#)],
                false,
                vec![(8080, Http), (8443, Https)],
            ),
            // A later entry for the same port wins.
            (
                &[(LISTEN_PORTS, r#"[{"HTTP": 80}, {"HTTPS": 80}]"#)],
                false,
                vec![(80, Https)],
            ),
        ];
        for (annotations, prefer_tls, want) in cases {
            let got = listen_ports(&map(annotations), prefer_tls).expect("valid");
            assert_eq!(got.into_iter().collect::<Vec<_>>(), want, "{annotations:?}");
        }
    }

    #[test]
    fn bad_listen_ports_name_the_annotation() {
        for raw in [
            "not json",
            "[]",
            r#"[{"HTTP": 0}]"#,
            r#"[{"HTTP": 70000}]"#,
            r#"[{"HTTP": "80"}]"#,
            r#"[{"TCP": 80}]"#,
            r#"{"HTTP": 80}"#,
        ] {
            let err = listen_ports(&map(&[(LISTEN_PORTS, raw)]), false)
                .expect_err(&format!("{raw} must be refused"));
            assert_eq!(err.annotation, LISTEN_PORTS);
            assert!(err.to_string().contains(LISTEN_PORTS), "{err}");
        }
    }

    #[test]
    fn scheme_defaults_to_internal() {
        assert_eq!(internal(&map(&[])), Ok(true));
        assert_eq!(internal(&map(&[(SCHEME, "internal")])), Ok(true));
        assert_eq!(internal(&map(&[(SCHEME, "internet-facing")])), Ok(false));
        assert_eq!(
            internal(&map(&[(SCHEME, "public")])).map_err(|e| e.annotation),
            Err(SCHEME)
        );
    }

    #[test]
    fn certificates_and_policy() {
        assert_eq!(
            certificate_arns(&map(&[(CERTIFICATE_ARN, " arn:a , ,arn:b")])),
            vec!["arn:a", "arn:b"]
        );
        assert!(certificate_arns(&map(&[])).is_empty());
        assert_eq!(ssl_policy(&map(&[])), DEFAULT_SSL_POLICY);
        assert_eq!(ssl_policy(&map(&[(SSL_POLICY, "P")])), "P");
    }

    #[test]
    fn security_groups_and_inbound_cidrs() {
        assert!(security_groups(&map(&[])).is_empty());
        assert_eq!(
            security_groups(&map(&[(SECURITY_GROUPS, "sg-1, web-clients,")])),
            vec!["sg-1", "web-clients"]
        );
        assert_eq!(inbound_cidrs(&map(&[])).expect("valid"), vec!["0.0.0.0/0"]);
        assert_eq!(
            inbound_cidrs(&map(&[(INBOUND_CIDRS, "10.0.0.0/8, 192.168.1.7/32")])).expect("valid"),
            vec!["10.0.0.0/8", "192.168.1.7/32"]
        );
        // IPv6 blocks are valid but an IPv4 load balancer has no use for them.
        assert_eq!(
            inbound_cidrs(&map(&[(INBOUND_CIDRS, "10.0.0.0/8,2001:db8::/32")])).expect("valid"),
            vec!["10.0.0.0/8"]
        );
        for bad in ["10.0.0.0", "10.0.0.0/33", "ten/8", "2001:db8::/129"] {
            let err = inbound_cidrs(&map(&[(INBOUND_CIDRS, bad)])).expect_err("an error");
            assert_eq!(err.annotation, INBOUND_CIDRS);
            assert!(err.reason.contains(bad), "{err}");
        }
    }

    #[test]
    fn health_check_defaults_and_service_precedence() {
        let empty = map(&[]);
        let check = health_check(&[&empty], "HTTP").expect("defaults");
        assert_eq!(
            check,
            AlbHealthCheck {
                protocol: "HTTP".into(),
                port: "traffic-port".into(),
                path: "/".into(),
                interval_seconds: 15,
                timeout_seconds: 5,
                healthy_threshold: 2,
                unhealthy_threshold: 2,
                success_codes: "200".into(),
            }
        );
        let service = map(&[(HEALTHCHECK_PATH, "/healthz")]);
        let ingress = map(&[
            (HEALTHCHECK_PATH, "/ready"),
            (HEALTHCHECK_INTERVAL, "30"),
            (SUCCESS_CODES, "200-299"),
            (HEALTHCHECK_PORT, "8080"),
        ]);
        let check = health_check(&[&service, &ingress], "HTTPS").expect("valid");
        assert_eq!(check.path, "/healthz");
        assert_eq!(check.interval_seconds, 30);
        assert_eq!(check.success_codes, "200-299");
        assert_eq!(check.port, "8080");
        assert_eq!(check.protocol, "HTTPS");
    }

    #[test]
    fn bad_target_group_annotations_name_themselves() {
        let cases = [
            (HEALTHCHECK_PATH, "healthz"),
            (HEALTHCHECK_INTERVAL, "4"),
            (HEALTHCHECK_INTERVAL, "x"),
            (HEALTHCHECK_TIMEOUT, "121"),
            (HEALTHCHECK_TIMEOUT, "20"),
            (HEALTHY_THRESHOLD, "1"),
            (UNHEALTHY_THRESHOLD, "11"),
            (HEALTHCHECK_PROTOCOL, "TCP"),
            (HEALTHCHECK_PORT, "0"),
            (SUCCESS_CODES, "ok"),
            (SUCCESS_CODES, "500"),
        ];
        for (annotation, value) in cases {
            let layer = map(&[(annotation, value)]);
            let err = health_check(&[&layer], "HTTP")
                .expect_err(&format!("{annotation}={value} must be refused"));
            assert_eq!(err.annotation, annotation, "{value}");
        }
        for (value, ok) in [("instance", true), ("ip", false), ("pod", false)] {
            let layer = map(&[(TARGET_TYPE, value)]);
            assert_eq!(check_target_type(&[&layer]).is_ok(), ok, "{value}");
        }
        let layer = map(&[(BACKEND_PROTOCOL, "grpc")]);
        assert_eq!(
            backend_protocol(&[&layer]).map_err(|e| e.annotation),
            Err(BACKEND_PROTOCOL)
        );
    }
}
