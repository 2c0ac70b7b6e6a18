//! The Ingress strategy (`networking.k8s.io/v1`): upstream's printer columns (`printIngress`:
//! Class, Hosts, Address, Ports).

use super::*;

/// Ingresses: Name, Class, Hosts, Address, Ports, Age.
pub struct IngressStrategy;
impl Strategy for IngressStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Class",
                "string",
                "The name of the IngressClass resource that should be used for ingress",
                |o| json!(str_at(o, &["spec", "ingressClassName"]).unwrap_or("<none>")),
            ),
            Column::new(
                "Hosts",
                "string",
                "Hosts ingress will accept traffic from",
                |o| json!(hosts(o)),
            ),
            Column::new(
                "Address",
                "string",
                "Address is a list containing ingress points for the load-balancer",
                |o| json!(address(o)),
            ),
            Column::new(
                "Ports",
                "string",
                "Ports of TLS configurations that open",
                |o| {
                    let tls = at(o, &["spec", "tls"]).and_then(Value::as_array);
                    json!(if tls.is_some_and(|t| !t.is_empty()) {
                        "80, 443"
                    } else {
                        "80"
                    })
                },
            ),
            age_column(),
        ]
    }
}

/// Upstream's `formatHosts`: the first three rules' hosts, `*` when none names one.
fn hosts(ingress: &Value) -> String {
    const SHOWN: usize = 3;
    let rules = at(ingress, &["spec", "rules"])
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let listed: Vec<&str> = rules
        .iter()
        .take(SHOWN)
        .filter_map(|rule| rule["host"].as_str().filter(|h| !h.is_empty()))
        .collect();
    if listed.is_empty() {
        return "*".into();
    }
    let joined = listed.join(",");
    if rules.len() > SHOWN {
        format!("{joined} + {} more...", rules.len() - SHOWN)
    } else {
        joined
    }
}

/// Upstream's `ingressLoadBalancerStatusStringer` (not wide): each point's IP, else its
/// hostname, joined, cut to 13 characters and `...` past 16.
fn address(ingress: &Value) -> String {
    let points = at(ingress, &["status", "loadBalancer", "ingress"])
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let joined = points
        .iter()
        .filter_map(|point| {
            point["ip"]
                .as_str()
                .filter(|ip| !ip.is_empty())
                .or_else(|| point["hostname"].as_str().filter(|h| !h.is_empty()))
        })
        .collect::<Vec<_>>()
        .join(",");
    if joined.len() > 16 {
        format!("{}...", joined.get(..13).unwrap_or(&joined))
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_read_as_upstreams_printer_writes_them() {
        let ingress = json!({
            "spec": {"ingressClassName": "alb", "tls": [{"hosts": ["a.example.com"]}],
                     "rules": [{"host": "a.example.com"}, {"host": "b.example.com"}, {}, {"host": "d.example.com"}]},
            "status": {"loadBalancer": {"ingress": [{"hostname": "internal-k8s-default-web-123.elb.amazonaws.com"}]}},
        });
        assert_eq!(hosts(&ingress), "a.example.com,b.example.com + 1 more...");
        assert_eq!(address(&ingress), "internal-k8s-...");
        assert_eq!(hosts(&json!({"spec": {"rules": [{}]}})), "*");
        assert_eq!(
            address(&json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}})),
            "10.0.0.1"
        );
    }
}
