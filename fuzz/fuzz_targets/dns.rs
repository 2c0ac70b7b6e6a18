//! The node's cluster DNS responder (`flotilla proxy`), which every pod on a node can send
//! packets to: arbitrary bytes as a UDP and as a TCP request against a zone with a ClusterIP
//! Service, a headless Service with named and unnamed endpoints, an ExternalName and a
//! dual-stack Service. No panic; an answer is a DNS message.
#![no_main]

use std::sync::OnceLock;

use flotilla_proxy::dns::records::ClusterDns;
use flotilla_proxy::dns::server::{Reply, respond};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn zone() -> &'static ClusterDns {
    static ZONE: OnceLock<ClusterDns> = OnceLock::new();
    ZONE.get_or_init(|| {
        let mut dns = ClusterDns::new("cluster.local").expect("zone");
        for service in [
            json!({"metadata": {"name": "web", "namespace": "shop"},
                   "spec": {"clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"port": 81}]}}),
            json!({"metadata": {"name": "db", "namespace": "shop"},
                   "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}}),
            json!({"metadata": {"name": "mail", "namespace": "shop"},
                   "spec": {"type": "ExternalName", "externalName": "smtp.example.com"}}),
            json!({"metadata": {"name": "dual", "namespace": "other"},
                   "spec": {"clusterIP": "10.96.0.30", "clusterIPs": ["10.96.0.30", "fd00::30"]}}),
        ] {
            dns.apply_service(&serde_json::from_value(service).expect("service"));
        }
        dns.apply_slice(
            &serde_json::from_value(json!({
                "metadata": {"name": "db-abc", "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": "db"}},
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                    {"addresses": ["10.244.2.6"], "conditions": {"ready": true}},
                ],
                "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            }))
            .expect("slice"),
        );
        dns
    })
}

fuzz_target!(|packet: &[u8]| {
    for udp in [true, false] {
        if let Reply::Answer(bytes) = respond(zone(), packet, udp) {
            assert!(
                bytes.len() >= 12,
                "an answer shorter than a DNS header: {bytes:?}"
            );
        }
    }
});
