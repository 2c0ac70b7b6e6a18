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

/// Upstream's single-table layout (what most goldens show); `split` for the other.
fn config() -> Config {
    Config {
        cluster_cidr: Some("10.0.0.0/8".parse().expect("cidr")),
        service_tables: 0,
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

/// Compares `actual` with `testdata/NAME.nft`; `UPDATE_GOLDEN=1` rewrites the file.
fn golden(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(format!("{name}.nft"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("testdata dir");
        std::fs::write(&path, actual).expect("write golden");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(
        actual,
        expected,
        "{name}: rendered script differs from {}",
        path.display()
    );
}

fn ip(text: &str) -> Ipv4Addr {
    text.parse().expect("ip")
}

#[test]
fn base_table() {
    golden("base", &render_base(&config()));
    let mut restricted = config();
    restricted.node_port_ips = Some(vec![ip("10.199.7.2"), ip("127.0.0.1")]);
    restricted.service_cidrs = vec!["172.30.0.0/16".parse().expect("cidr")];
    let base = render_base(&restricted);
    assert!(base.contains("add element ip kube-proxy nodeport-ips { 10.199.7.2 }\n"));
    assert!(
        !base.contains("127.0.0.1 }"),
        "localhost NodePorts are not supported"
    );
    assert!(base.contains(
        "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports\n"
    ));
    assert!(base.contains(
        "add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n"
    ));
}

#[test]
fn chain_names_as_upstream() {
    // The example in upstream's servicePortChainNameBase comment.
    assert_eq!(
        service_chain(&port_name("svc1")),
        "service-ULMVA6XW-ns1/svc1/tcp/p80"
    );
    let long = "x".repeat(300);
    let name = hash_and_truncate(&long);
    assert_eq!(name.len(), 240);
    assert!(name.ends_with("..."));
}

#[test]
fn cluster_ip() {
    golden(
        "cluster_ip",
        &service_lines(
            config(),
            &[(
                service("svc1", "172.30.0.41"),
                vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
            )],
        ),
    );
}

#[test]
fn vmap_load_balancing() {
    // Upstream's form, kept as an option (see `LoadBalancing` for why it is not the default).
    let mut vmap = config();
    vmap.load_balancing = LoadBalancing::Vmap;
    golden(
        "cluster_ip_vmap",
        &service_lines(
            vmap,
            &[(
                service("svc1", "172.30.0.41"),
                vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
            )],
        ),
    );
}

#[test]
fn cascade_is_uniform() {
    // Endpoint i of n is taken with probability 1/(n-i) of what is left: 1/n each.
    let endpoints: Vec<Endpoint> = (1..=4)
        .map(|i| endpoint(&format!("10.180.0.{i}"), true))
        .collect();
    let lines = service_lines(config(), &[(service("four", "172.30.0.60"), endpoints)]);
    let picks: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("service-") && l.contains("goto endpoint-"))
        .map(|l| l.split(" service-").nth(1).unwrap_or_default())
        .collect();
    assert_eq!(picks.len(), 4, "{lines}");
    assert!(
        picks[0].contains("numgen random mod 4 == 0 goto endpoint-"),
        "{lines}"
    );
    assert!(
        picks[1].contains("numgen random mod 3 == 0 goto endpoint-"),
        "{lines}"
    );
    assert!(
        picks[2].contains("numgen random mod 2 == 0 goto endpoint-"),
        "{lines}"
    );
    assert!(
        !picks[3].contains("numgen"),
        "the last one is taken unconditionally: {lines}"
    );
}

#[test]
fn node_port() {
    let mut np = service("np", "172.30.0.42");
    np.node_port = 30080;
    golden(
        "node_port",
        &service_lines(config(), &[(np, vec![endpoint("10.180.0.2", true)])]),
    );
}

#[test]
fn session_affinity() {
    let mut aff = service("aff", "172.30.0.43");
    aff.sticky_max_age_seconds = Some(10800);
    golden(
        "affinity",
        &service_lines(
            config(),
            &[(
                aff,
                vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
            )],
        ),
    );
}

#[test]
fn external_traffic_policy_local() {
    let mut local = service("local", "172.30.0.44");
    local.node_port = 30081;
    local.external_policy_local = true;
    golden(
        "etp_local",
        &service_lines(
            config(),
            &[(
                local.clone(),
                vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
            )],
        ),
    );
    // No local endpoint: external traffic is dropped, pods and the node still get through.
    golden(
        "etp_local_no_local_endpoints",
        &service_lines(config(), &[(local, vec![endpoint("10.180.1.1", false)])]),
    );
}

#[test]
fn internal_traffic_policy_local() {
    let mut itp = service("itp", "172.30.0.46");
    itp.internal_policy_local = true;
    golden(
        "itp_local_no_local_endpoints",
        &service_lines(
            config(),
            &[(itp.clone(), vec![endpoint("10.180.1.1", false)])],
        ),
    );
    let lines = service_lines(
        config(),
        &[(
            itp,
            vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
        )],
    );
    assert!(
        lines.contains("goto local-"),
        "ClusterIP goes to the local chain:\n{lines}"
    );
    assert!(
        !lines.contains("10.180.1.1"),
        "the remote endpoint is unused:\n{lines}"
    );
}

#[test]
fn no_endpoints_rejected() {
    let mut np = service("np", "172.30.0.42");
    np.node_port = 30080;
    golden(
        "no_endpoints",
        &service_lines(config(), &[(np.clone(), vec![])]),
    );
    // An endpoint that is neither ready nor serving is no endpoint.
    let mut dead = endpoint("10.180.0.1", true);
    dead.ready = false;
    dead.serving = false;
    assert_eq!(
        service_lines(config(), &[(np.clone(), vec![dead])]),
        service_lines(config(), &[(np, vec![])])
    );
}

/// Found by the `netlink` fuzz target: a 62-character namespace, a 63-character Service
/// name and a port name (all valid) made a 131-byte element comment, which nft refuses
/// (more than 128), failing every sync (upstream kubernetes#139515).
#[test]
fn long_service_port_names_are_cut_to_nfts_comment_limit() {
    let mut svc = service("x", "172.30.0.42");
    svc.name = ServicePortName {
        service: NamespacedName::new(
            "loft-acme-platform-services-team-dev-v-shared-workloads-ns-001",
            "my-api-svc-x-my-api-namespace-x-acme-shared-vcluster--a1b2c3d4e",
        ),
        port: "http".into(),
        protocol: Protocol::Tcp,
    };
    assert_eq!(svc.name.to_string().len(), 131);
    let (mut renderer, mut state) = synced(&[]);
    state.set_service(svc.name.service.clone(), vec![svc.clone()]);
    let changed = state.take_changed();
    let script = renderer
        .partial_sync(&state, &changed, Instant::now())
        .script;
    let comments: Vec<&str> = script
        .lines()
        .filter_map(|line| line.split_once(" comment \"")?.1.split_once('"'))
        .map(|(comment, _)| comment)
        .collect();
    assert!(!comments.is_empty(), "{script}");
    for comment in comments {
        assert_eq!(comment.len(), MAX_COMMENT_LENGTH, "{script}");
        assert!(svc.name.to_string().starts_with(comment));
    }
    crate::batch::encode(&script, 1).expect("the partial sync goes through netlink");
}

#[test]
fn terminating_fallback() {
    golden(
        "terminating",
        &service_lines(
            config(),
            &[(
                service("term", "172.30.0.47"),
                vec![
                    terminating(endpoint("10.180.0.1", true)),
                    terminating(endpoint("10.180.1.1", false)),
                ],
            )],
        ),
    );
    // With a ready endpoint the terminating one is unused.
    let lines = service_lines(
        config(),
        &[(
            service("term", "172.30.0.47"),
            vec![
                terminating(endpoint("10.180.0.1", true)),
                endpoint("10.180.1.1", false),
            ],
        )],
    );
    assert!(
        !lines.contains("numgen"),
        "one endpoint, no choice: {lines}"
    );
    assert!(!lines.contains("10.180.0.1"), "{lines}");
}

#[test]
fn load_balancer_and_external_ips() {
    let mut lb = service("lb", "172.30.0.45");
    lb.load_balancer_vips = vec![ip("203.0.113.5")];
    lb.load_balancer_source_ranges = vec!["192.0.2.0/24".parse().expect("cidr")];
    lb.external_ips = vec![ip("198.51.100.1")];
    lb.node_port = 30082;
    golden(
        "load_balancer",
        &service_lines(config(), &[(lb, vec![endpoint("10.180.1.1", false)])]),
    );
}

#[test]
fn masquerade_rules() {
    let svc1 = || {
        (
            service("svc1", "172.30.0.41"),
            vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
        )
    };
    // Pods on this node's bridge (10.180.0.0/24) reaching a same-bridge endpoint.
    let mut bridge = config();
    bridge.bridge_pod_cidr = Some("10.180.0.0/24".parse().expect("cidr"));
    golden("bridge_masquerade", &service_lines(bridge, &[svc1()]));
    let mut all = config();
    all.masquerade_all = true;
    let lines = service_lines(all, &[svc1()]);
    assert!(lines.contains(
        "service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 tcp dport 80 jump mark-for-masquerade\n"
    ));
    let lines = service_lines(Config::default(), &[svc1()]);
    assert!(
        !lines.contains("ip daddr 172.30.0.41 tcp dport 80"),
        "no cluster CIDR: no off-cluster masquerade rule (upstream without a local detector)"
    );
}

/// A renderer that has fully synced `services`, and the state.
fn synced(services: &[(ServicePort, Vec<Endpoint>)]) -> (Renderer, ProxyState) {
    let state = state_with(services);
    let mut renderer = Renderer::new(config());
    renderer.full_sync(&state);
    (renderer, state)
}

#[test]
fn incremental_endpoint_removed_and_added() {
    let svc1 = service("svc1", "172.30.0.41");
    let other = service("other", "172.30.0.50");
    let (mut renderer, mut state) = synced(&[
        (
            svc1.clone(),
            vec![endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
        ),
        (other.clone(), vec![endpoint("10.180.0.9", true)]),
    ]);
    let t0 = Instant::now();
    state.set_endpoints(&svc1.name, 8080, &[endpoint("10.180.0.1", true)]);
    let changed = state.take_changed();
    let tx = renderer.sync(&state, &changed, t0);
    assert!(!tx.full);
    golden("incremental_endpoint_removed", &tx.script);
    assert!(
        !tx.script.contains("other"),
        "an unchanged Service is not touched"
    );
    assert_eq!(
        renderer.take_stale_chains(t0),
        None,
        "stale chains wait a second"
    );
    let unchanged: BTreeSet<NamespacedName> = [other.name.service.clone()].into();
    assert_eq!(
        renderer
            .sync(&state, &unchanged, t0 + STALE_CHAIN_DELAY)
            .script,
        "delete chain ip kube-proxy endpoint-FFWGZXMH-ns1/svc1/tcp/p80__10.180.1.1/8080\n",
        "a later sync deletes the stale chain"
    );
    state.set_endpoints(
        &svc1.name,
        8080,
        &[endpoint("10.180.0.1", true), endpoint("10.180.1.1", false)],
    );
    let changed = state.take_changed();
    golden(
        "incremental_endpoint_added",
        &renderer.sync(&state, &changed, t0).script,
    );
    assert_eq!(
        renderer.sync(&state, &unchanged, t0).script,
        "",
        "nothing to write"
    );
}

#[test]
fn incremental_service_added_and_deleted() {
    let svc1 = service("svc1", "172.30.0.41");
    let (mut renderer, mut state) = synced(&[(svc1.clone(), vec![endpoint("10.180.0.1", true)])]);
    let t0 = Instant::now();
    let mut np = service("np", "172.30.0.42");
    np.node_port = 30080;
    state.set_service(np.name.service.clone(), vec![np.clone()]);
    let changed = state.take_changed();
    let added = renderer.sync(&state, &changed, t0).script;
    // No endpoints yet: rejected, then endpoints arrive and the reject element goes.
    golden("incremental_service_added", &added);
    state.set_endpoints(&np.name, 8080, &[endpoint("10.180.0.2", true)]);
    let changed = state.take_changed();
    golden(
        "incremental_endpoints_arrive",
        &renderer.sync(&state, &changed, t0).script,
    );
    state.delete_service("ns1", "svc1");
    state.set_endpoints(&svc1.name, 8080, &[]);
    let changed = state.take_changed();
    golden(
        "incremental_service_deleted",
        &renderer.sync(&state, &changed, t0).script,
    );
}

#[test]
fn incremental_affinity_timeout_change_rewrites_chains() {
    let mut aff = service("aff", "172.30.0.43");
    aff.sticky_max_age_seconds = Some(10800);
    let (mut renderer, mut state) = synced(&[(aff.clone(), vec![endpoint("10.180.0.1", true)])]);
    aff.sticky_max_age_seconds = Some(60);
    state.set_service(aff.name.service.clone(), vec![aff]);
    let changed = state.take_changed();
    let script = renderer.sync(&state, &changed, Instant::now()).script;
    golden("incremental_affinity_timeout", &script);
    let flush = script.find("flush chain").expect("flush");
    let delete = script.find("delete set").expect("delete set");
    assert!(
        flush < delete,
        "rules using the set go before the set:\n{script}"
    );
}

#[test]
fn failure_forces_full_sync() {
    let (mut renderer, state) = synced(&[(service("svc1", "172.30.0.41"), vec![])]);
    assert!(!renderer.needs_full_sync());
    renderer.invalidate();
    let tx = renderer.sync(&state, &BTreeSet::new(), Instant::now());
    assert!(tx.full);
    assert!(tx.script.starts_with("add table ip kube-proxy"));
    assert!(tx.script.contains("delete table ip kube-proxy\n"));
}

fn split(tables: u16) -> Config {
    Config {
        service_tables: tables,
        node_port_ips: Some(vec![ip("10.199.7.2")]),
        ..config()
    }
}

#[test]
fn split_base_tables() {
    // Table kube-proxy keeps the filter part and masquerading; each Service table has its own
    // NAT hooks, dispatch maps, nodeport-ips and mark-for-masquerade; the others are deleted.
    golden("base_split", &render_base(&split(2)));
}

#[test]
fn split_service_objects_go_to_its_table() {
    let spread: BTreeSet<String> = (0..64)
        .map(|i| split(4).service_table(&NamespacedName::new("ns", &format!("s{i}"))))
        .collect();
    assert_eq!(
        spread.len(),
        4,
        "Services spread over every table: {spread:?}"
    );
    assert!(spread.iter().all(|t| is_proxy_table(t)), "{spread:?}");
    assert!(!is_proxy_table("kube-proxy-services-32") && !is_proxy_table("kube-proxy-services-1"));
    // The same split as the golden base (which the integration test loads under it).
    let config = split(2);
    let key = NamespacedName::new("ns1", "lb");
    let table = config.service_table(&key);
    assert!(table.starts_with("kube-proxy-services-0"), "{table}");
    assert_eq!(table, config.service_table(&key), "stable");
    assert_eq!(
        self::config().service_table(&key),
        TABLE,
        "not split: one table"
    );

    let mut lb = service("lb", "172.30.0.45");
    lb.load_balancer_vips = vec![ip("203.0.113.5")];
    lb.load_balancer_source_ranges = vec!["192.0.2.0/24".parse().expect("cidr")];
    lb.node_port = 30082;
    lb.sticky_max_age_seconds = Some(60);
    let mut state = state_with(&[(lb.clone(), vec![endpoint("10.180.1.1", false)])]);
    let mut renderer = Renderer::new(config.clone());
    let full = renderer.full_sync(&state).script;
    let lines = full
        .strip_prefix(&render_base(&config))
        .expect("base first");
    golden("split_load_balancer", lines);
    let t0 = Instant::now();
    state.set_endpoints(&lb.name, 8080, &[endpoint("10.180.0.1", true)]);
    let changed = state.take_changed();
    let tx = renderer.sync(&state, &changed, t0);
    golden("split_incremental_endpoint_replaced", &tx.script);
    assert_eq!(
        renderer.take_stale_chains(t0 + STALE_CHAIN_DELAY),
        Some(format!(
            "delete chain ip {table} endpoint-INRJDQ4T-ns1/lb/tcp/p80__10.180.1.1/8080\n"
        )),
        "the stale chain is deleted from its table"
    );
}
