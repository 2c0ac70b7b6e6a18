//! Golden tests of the renderer: one Service per feature, the exact nft lines it renders,
//! and the contents of incremental diffs.

use super::*;
use crate::model::{Protocol, ServicePortName};

fn port_name(name: &str) -> ServicePortName {
    ServicePortName {
        service: NamespacedName::new("ns1", name),
        port: "p80".into(),
        protocol: Protocol::Tcp,
    }
}

fn service(name: &str, ip: &str) -> ServicePort {
    ServicePort {
        name: port_name(name),
        cluster_ip: ip.parse().expect("ip"),
        port: 80,
        node_port: 0,
        external_ips: vec![],
        load_balancer_vips: vec![],
        load_balancer_source_ranges: vec![],
        sticky_max_age_seconds: None,
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: 0,
    }
}

fn endpoint(ip: &str, local: bool) -> Endpoint {
    Endpoint {
        ip: ip.parse().expect("ip"),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(if local { "node1" } else { "node2" }.into()),
        zone: None,
        is_local: local,
    }
}

fn terminating(mut endpoint: Endpoint) -> Endpoint {
    endpoint.ready = false;
    endpoint.terminating = true;
    endpoint
}

fn config() -> Config {
    Config {
        cluster_cidr: Some("10.0.0.0/8".parse().expect("cidr")),
        ..Config::default()
    }
}

fn state_with(services: &[(ServicePort, Vec<Endpoint>)]) -> ProxyState {
    let mut state = ProxyState::new("node1");
    for (svc, endpoints) in services {
        state.set_service(svc.name.service.clone(), vec![svc.clone()]);
        state.set_endpoints(&svc.name, 8080, endpoints);
    }
    state.take_changed();
    state
}

/// The lines a full sync writes for the Services (the base part left out).
fn service_lines(config: Config, services: &[(ServicePort, Vec<Endpoint>)]) -> String {
    let state = state_with(services);
    let base = render_base(&config);
    let mut renderer = Renderer::new(config);
    let full = renderer.full_sync(&state).script;
    full.strip_prefix(&base).expect("base first").to_string()
}

fn dump(script: &str) {
    println!("----\n{script}----");
}

#[test]
fn dump_all() {
    dump(&render_base(&config()));
    let mut np = service("np", "172.30.0.42");
    np.node_port = 30080;
    dump(&service_lines(
        config(),
        &[
            (
                service("svc1", "172.30.0.41"),
                vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
            ),
            (np, vec![endpoint("10.180.0.2", true)]),
        ],
    ));
}
