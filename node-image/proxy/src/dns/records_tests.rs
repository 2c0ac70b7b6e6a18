//! The record mapping against the cases of the Kubernetes DNS specification (schema 1.1.0),
//! written as `dig` would print the answers.

use super::*;
use serde_json::json;

fn service(value: serde_json::Value) -> Service {
    serde_json::from_value(value).expect("service")
}

fn slice(value: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(value).expect("slice")
}

/// A cluster with a ClusterIP Service, a headless one with two ready endpoints (one named,
/// as a StatefulSet's) and one not ready, an ExternalName one and a dual-stack one.
fn cluster() -> ClusterDns {
    let mut dns = ClusterDns::new("cluster.local").expect("zone");
    dns.apply_service(&service(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"},
                           {"port": 81}]},
    })));
    dns.apply_service(&service(json!({
        "metadata": {"name": "db", "namespace": "shop"},
        "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]},
    })));
    dns.apply_slice(&slice(json!({
        "metadata": {"name": "db-abc", "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
            {"addresses": ["10.244.2.6"], "conditions": {"ready": true}},
            {"addresses": ["10.244.3.7"], "hostname": "db-2", "conditions": {"ready": false}},
        ],
        "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
    })));
    dns.apply_service(&service(json!({
        "metadata": {"name": "mail", "namespace": "shop"},
        "spec": {"type": "ExternalName", "externalName": "smtp.example.com"},
    })));
    dns.apply_service(&service(json!({
        "metadata": {"name": "dual", "namespace": "other"},
        "spec": {"clusterIP": "10.96.0.30", "clusterIPs": ["10.96.0.30", "fd00::30"]},
    })));
    dns
}

/// The answer as `dig +noall +answer +authority` lines, and the response code.
fn dig(dns: &ClusterDns, name: &str, kind: RecordType) -> (ResponseCode, Vec<String>) {
    let name = Name::from_ascii(name).expect("name");
    match dns.answer(&name, kind) {
        Answer::Cluster {
            code,
            answers,
            authority,
        } => (
            code,
            answers
                .iter()
                .chain(&authority)
                .map(|r| format!("{} {} {} {}", r.name, r.ttl, r.record_type(), r.data))
                .collect(),
        ),
        Answer::Upstream => (ResponseCode::Refused, vec!["upstream".into()]),
    }
}

const SOA: &str =
    "cluster.local. 5 SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5";

#[test]
fn cluster_ip_services_resolve_to_their_ips_and_named_ports() {
    let dns = cluster();
    assert_eq!(
        dig(&dns, "web.shop.svc.cluster.local.", RecordType::A),
        (
            ResponseCode::NoError,
            vec!["web.shop.svc.cluster.local. 5 A 10.96.0.20".to_string()]
        )
    );
    // Names are case-insensitive, and a relative name is taken as absolute.
    assert_eq!(
        dig(&dns, "WEB.Shop.svc.cluster.local", RecordType::A).1,
        vec!["web.shop.svc.cluster.local. 5 A 10.96.0.20"]
    );
    // A name that exists without the type: NODATA with the SOA.
    assert_eq!(
        dig(&dns, "web.shop.svc.cluster.local.", RecordType::AAAA),
        (ResponseCode::NoError, vec![SOA.to_string()])
    );
    // SRV of a named port; an unnamed port has none.
    assert_eq!(
        dig(
            &dns,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV
        )
        .1,
        vec!["_http._tcp.web.shop.svc.cluster.local. 5 SRV 0 100 80 web.shop.svc.cluster.local."]
    );
    assert_eq!(
        dig(
            &dns,
            "_http._udp.web.shop.svc.cluster.local.",
            RecordType::SRV
        )
        .0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        dig(
            &dns,
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::A
        ),
        (ResponseCode::NoError, vec![SOA.to_string()])
    );
    // Dual-stack: both families.
    assert_eq!(
        dig(&dns, "dual.other.svc.cluster.local.", RecordType::AAAA).1,
        vec!["dual.other.svc.cluster.local. 5 AAAA fd00::30"]
    );
    // The reverse of a cluster IP.
    assert_eq!(
        dig(&dns, "20.0.96.10.in-addr.arpa.", RecordType::PTR).1,
        vec!["20.0.96.10.in-addr.arpa. 5 PTR web.shop.svc.cluster.local."]
    );
    let v6 = "0.3.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.";
    assert_eq!(
        dig(&dns, v6, RecordType::PTR).1,
        vec![format!("{v6} 5 PTR dual.other.svc.cluster.local.")]
    );
}

#[test]
fn headless_services_resolve_to_their_ready_endpoints() {
    let dns = cluster();
    assert_eq!(
        dig(&dns, "db.shop.svc.cluster.local.", RecordType::A).1,
        vec![
            "db.shop.svc.cluster.local. 5 A 10.244.1.5",
            "db.shop.svc.cluster.local. 5 A 10.244.2.6",
        ]
    );
    // A StatefulSet pod by its hostname; an endpoint without one by its dashed address.
    assert_eq!(
        dig(&dns, "db-0.db.shop.svc.cluster.local.", RecordType::A).1,
        vec!["db-0.db.shop.svc.cluster.local. 5 A 10.244.1.5"]
    );
    assert_eq!(
        dig(&dns, "10-244-2-6.db.shop.svc.cluster.local.", RecordType::A).1,
        vec!["10-244-2-6.db.shop.svc.cluster.local. 5 A 10.244.2.6"]
    );
    // A not-ready endpoint is not published.
    assert_eq!(
        dig(&dns, "db-2.db.shop.svc.cluster.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
    // SRV: one per endpoint and port, the weight shared.
    assert_eq!(
        dig(&dns, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV).1,
        vec![
            "_pg._tcp.db.shop.svc.cluster.local. 5 SRV 0 50 5432 db-0.db.shop.svc.cluster.local.",
            "_pg._tcp.db.shop.svc.cluster.local. 5 SRV 0 50 5432 10-244-2-6.db.shop.svc.cluster.local.",
        ]
    );
    // PTR only for endpoints with a hostname; another address goes upstream.
    assert_eq!(
        dig(&dns, "5.1.244.10.in-addr.arpa.", RecordType::PTR).1,
        vec!["5.1.244.10.in-addr.arpa. 5 PTR db-0.db.shop.svc.cluster.local."]
    );
    assert_eq!(
        dig(&dns, "6.2.244.10.in-addr.arpa.", RecordType::PTR).1,
        vec!["upstream"]
    );
}

#[test]
fn external_names_pods_and_the_schema_version() {
    let dns = cluster();
    for kind in [RecordType::A, RecordType::AAAA, RecordType::CNAME] {
        assert_eq!(
            dig(&dns, "mail.shop.svc.cluster.local.", kind).1,
            vec!["mail.shop.svc.cluster.local. 5 CNAME smtp.example.com."]
        );
    }
    assert_eq!(
        dig(&dns, "10-244-1-5.shop.pod.cluster.local.", RecordType::A).1,
        vec!["10-244-1-5.shop.pod.cluster.local. 5 A 10.244.1.5"]
    );
    assert_eq!(
        dig(&dns, "not-an-ip.shop.pod.cluster.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
    assert_eq!(
        dig(&dns, "dns-version.cluster.local.", RecordType::TXT).1,
        vec!["dns-version.cluster.local. 5 TXT 1.1.0"]
    );
    assert_eq!(
        dig(&dns, "cluster.local.", RecordType::SOA).1,
        vec![SOA.to_string()]
    );
}

#[test]
fn names_that_do_not_exist_and_names_outside_the_zone() {
    let mut dns = cluster();
    for name in [
        "nope.shop.svc.cluster.local.",
        "web.nope.svc.cluster.local.",
        "a.b.c.d.e.svc.cluster.local.",
        "web.shop.cluster.local.",
    ] {
        assert_eq!(
            dig(&dns, name, RecordType::A),
            (ResponseCode::NXDomain, vec![SOA.to_string()]),
            "{name}"
        );
    }
    // Names that exist without records: the namespace, `svc`, the apex.
    for name in [
        "shop.svc.cluster.local.",
        "svc.cluster.local.",
        "cluster.local.",
    ] {
        assert_eq!(
            dig(&dns, name, RecordType::A),
            (ResponseCode::NoError, vec![SOA.to_string()]),
            "{name}"
        );
    }
    assert_eq!(dig(&dns, "example.com.", RecordType::A).1, vec!["upstream"]);
    assert_eq!(
        dig(&dns, "8.8.8.8.in-addr.arpa.", RecordType::PTR).1,
        vec!["upstream"]
    );
    // A deleted Service is gone at once.
    assert!(dns.delete_service("shop", "web"));
    assert_eq!(
        dig(&dns, "web.shop.svc.cluster.local.", RecordType::A).0,
        ResponseCode::NXDomain
    );
    assert!(!dns.delete_service("shop", "web"));
}

#[test]
fn updates_report_whether_answers_changed() {
    let mut dns = cluster();
    let web = service(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]},
    }));
    assert!(!dns.apply_service(&web), "the same Service again");
    let moved = service(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.21", "clusterIPs": ["10.96.0.21"]},
    }));
    assert!(dns.apply_service(&moved));
    assert_eq!(
        dig(&dns, "web.shop.svc.cluster.local.", RecordType::A).1,
        vec!["web.shop.svc.cluster.local. 5 A 10.96.0.21"]
    );
    let listed = [("shop".to_string(), "db".to_string())]
        .into_iter()
        .collect();
    dns.retain_services(&listed);
    assert_eq!(dns.service_count(), 1);
}

#[test]
fn reverse_lookups_follow_the_index_through_changes_and_relists() {
    let mut dns = cluster();
    let upstream = |dns: &ClusterDns, name: &str| {
        dns.answer(&Name::from_ascii(name).expect("name"), RecordType::PTR) == Answer::Upstream
    };
    // A Service's cluster IP moves: the old address is no longer the cluster's.
    dns.apply_service(&service(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.21", "clusterIPs": ["10.96.0.21"]},
    })));
    assert!(upstream(&dns, "20.0.96.10.in-addr.arpa."));
    assert_eq!(
        dig(&dns, "21.0.96.10.in-addr.arpa.", RecordType::PTR).1,
        vec!["21.0.96.10.in-addr.arpa. 5 PTR web.shop.svc.cluster.local."]
    );
    // A second Service on the same address (a reused IP mid-update) answers both, in order.
    dns.apply_service(&service(json!({
        "metadata": {"name": "api", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.21", "clusterIPs": ["10.96.0.21"]},
    })));
    assert_eq!(
        dig(&dns, "21.0.96.10.in-addr.arpa.", RecordType::PTR).1,
        vec![
            "21.0.96.10.in-addr.arpa. 5 PTR api.shop.svc.cluster.local.",
            "21.0.96.10.in-addr.arpa. 5 PTR web.shop.svc.cluster.local.",
        ]
    );
    // A headless endpoint's address goes with its slice.
    assert!(!upstream(&dns, "5.1.244.10.in-addr.arpa."));
    dns.retain_slices(&std::collections::BTreeSet::new());
    assert!(upstream(&dns, "5.1.244.10.in-addr.arpa."));
    // A relist that keeps nothing leaves nothing indexed.
    dns.retain_services(&std::collections::BTreeSet::new());
    assert!(upstream(&dns, "21.0.96.10.in-addr.arpa."));
    assert!(dns.by_address.is_empty());
}
