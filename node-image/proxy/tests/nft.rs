//! Integration test with the real `nft`: network namespaces made by the test (a proxy
//! namespace routing between a client and two endpoint namespaces running busybox httpd),
//! rules rendered by the renderer and applied by `ip netns exec PROXY nft -f -` (full syncs)
//! and by a netlink socket opened in that namespace (partial syncs). Needs root, `ip`, `nft`
//! and `/bin/busybox`; fails saying which is missing.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_proxy::model::{
    Endpoint, NamespacedName, Protocol, ProxyState, ServicePort, ServicePortName,
};
use flotilla_proxy::netlink::Netlink;
use flotilla_proxy::nft::{Applied, Nft};
use flotilla_proxy::render::{Config, Renderer};

const BUSYBOX: &str = "/bin/busybox";

fn run(args: &[&str]) -> Result<String, String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|err| format!("{}: {err}", args.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn must(args: &[&str]) -> String {
    run(args).unwrap_or_else(|err| panic!("{err}"))
}

/// The namespaces and listeners of one test; removed on drop.
struct Lab {
    prefix: String,
    children: Vec<Child>,
    dirs: Vec<std::path::PathBuf>,
}

impl Lab {
    fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    fn exec(&self, ns: &str, args: &[&str]) -> Result<String, String> {
        let ns = self.ns(ns);
        let mut full = vec!["ip", "netns", "exec", ns.as_str()];
        full.extend_from_slice(args);
        run(&full)
    }

    /// One HTTP GET from the client namespace (busybox `nc`: busybox `wget` crashes inside a
    /// network namespace here); the body or the error text.
    fn get(&self, url: &str) -> Result<String, String> {
        let target = url.trim_start_matches("http://").trim_end_matches('/');
        let (host, port) = target.split_once(':').unwrap_or((target, "80"));
        let ns = self.ns("client");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns, BUSYBOX, "nc", "-w", "3", host, port])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("nc: {err}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            let _ = std::io::Write::write_all(&mut stdin, b"GET / HTTP/1.0\r\n\r\n");
        }
        let output = child
            .wait_with_output()
            .map_err(|err| format!("nc: {err}"))?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        match text.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.") => Ok(body.trim().to_string()),
            _ => Err(format!(
                "no HTTP answer from {url}: {}{}",
                text,
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    }

    fn answers(&self, url: &str, count: usize) -> Vec<String> {
        (0..count)
            .map(|_| {
                self.get(url)
                    .unwrap_or_else(|err| panic!("GET {url}: {err}"))
            })
            .collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for name in ["proxy", "client", "ep1", "ep2"] {
            let _ = run(&["ip", "netns", "del", &self.ns(name)]);
        }
        for dir in &self.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn preflight() {
    let uid = must(&["id", "-u"]);
    assert_eq!(
        uid.trim(),
        "0",
        "this test needs root (it creates network namespaces)"
    );
    run(&["nft", "--version"]).unwrap_or_else(|err| panic!("this test needs nft: {err}"));
    run(&["ip", "-V"]).unwrap_or_else(|err| panic!("this test needs iproute2: {err}"));
    assert!(
        std::path::Path::new(BUSYBOX).exists(),
        "this test needs {BUSYBOX} (busybox-static)"
    );
}

/// proxy (router, the node) ── veth ── client 10.77.1.2, ep1 10.77.2.2, ep2 10.77.3.2.
/// The netlink socket of namespace `ns` (made by `ip netns add`).
fn netlink_in(ns: &str) -> Netlink {
    Netlink::open_in(&std::path::Path::new("/run/netns").join(ns))
        .unwrap_or_else(|err| panic!("netlink socket in {ns}: {err}"))
}

fn build_lab() -> Lab {
    let mut lab = Lab {
        prefix: format!("fpx{}", std::process::id()),
        children: Vec::new(),
        dirs: Vec::new(),
    };
    for name in ["proxy", "client", "ep1", "ep2"] {
        must(&["ip", "netns", "add", &lab.ns(name)]);
        lab.exec(name, &["ip", "link", "set", "lo", "up"])
            .expect("lo up");
    }
    lab.exec("proxy", &["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        .expect("ip_forward");
    // A real node routes the Service CIDR somewhere (its default route); without a route the
    // kernel answers "network unreachable" before the filter hooks see a packet that was not
    // DNATed. A veth pair inside the namespace stands in: nothing sent there leaves it.
    lab.exec(
        "proxy",
        &[
            "ip", "link", "add", "svc0", "type", "veth", "peer", "name", "svc1",
        ],
    )
    .expect("veth");
    lab.exec("proxy", &["ip", "link", "set", "svc0", "up"])
        .expect("up");
    lab.exec("proxy", &["ip", "link", "set", "svc1", "up"])
        .expect("up");
    lab.exec(
        "proxy",
        &["ip", "route", "add", "172.30.0.0/16", "dev", "svc0"],
    )
    .expect("service route");
    for (i, name) in [(1, "client"), (2, "ep1"), (3, "ep2")] {
        let outer = format!("{}p{i}", lab.prefix);
        let inner = format!("{}c{i}", lab.prefix);
        must(&[
            "ip",
            "link",
            "add",
            &outer,
            "netns",
            &lab.ns("proxy"),
            "type",
            "veth",
            "peer",
            "name",
            &inner,
            "netns",
            &lab.ns(name),
        ]);
        let router = format!("10.77.{i}.1");
        let host = format!("10.77.{i}.2");
        lab.exec(
            "proxy",
            &["ip", "addr", "add", &format!("{router}/24"), "dev", &outer],
        )
        .expect("addr");
        lab.exec("proxy", &["ip", "link", "set", &outer, "up"])
            .expect("up");
        lab.exec(
            name,
            &["ip", "addr", "add", &format!("{host}/24"), "dev", &inner],
        )
        .expect("addr");
        lab.exec(name, &["ip", "link", "set", &inner, "up"])
            .expect("up");
        lab.exec(name, &["ip", "route", "add", "default", "via", &router])
            .expect("route");
    }
    for name in ["ep1", "ep2"] {
        let dir = std::env::temp_dir().join(format!("{}-{name}", lab.prefix));
        std::fs::create_dir_all(&dir).expect("www dir");
        std::fs::write(dir.join("index.html"), format!("{name}\n")).expect("index");
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &lab.ns(name),
                BUSYBOX,
                "httpd",
                "-f",
                "-p",
                "8080",
                "-h",
            ])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("busybox httpd");
        lab.children.push(child);
        lab.dirs.push(dir);
    }
    // Wait (bounded) for both listeners, reached directly from the client.
    for (i, name) in [(2, "ep1"), (3, "ep2")] {
        let url = format!("http://10.77.{i}.2:8080/");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match lab.get(&url) {
                Ok(body) if body == name => break,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                other => panic!("{name}'s httpd does not answer: {other:?}"),
            }
        }
    }
    lab
}

fn port(name: &str, ip: &str) -> ServicePort {
    ServicePort {
        name: ServicePortName {
            service: NamespacedName::new("default", name),
            port: "http".into(),
            protocol: Protocol::Tcp,
        },
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

fn endpoint(ip: &str) -> Endpoint {
    Endpoint {
        ip: ip.parse().expect("ip"),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some("elsewhere".into()),
        zone: None,
        is_local: false,
    }
}

fn distinct(answers: &[String]) -> BTreeSet<String> {
    answers.iter().cloned().collect()
}

#[test]
fn services_carry_traffic_through_real_nftables() {
    preflight();
    let lab = build_lab();
    // Upstream's single table, then the Service NAT part split over three tables.
    for service_tables in [0, 3] {
        carry_traffic(&lab, service_tables);
    }
}

fn carry_traffic(lab: &Lab, service_tables: u16) {
    let nft = Nft::with_command(vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        lab.ns("proxy"),
        "nft".into(),
    ])
    .with_netlink(netlink_in(&lab.ns("proxy")));

    let mut web = port("web", "172.30.0.10");
    web.node_port = 30080;
    let empty = port("empty", "172.30.0.11");
    let mut sticky = port("sticky", "172.30.0.12");
    sticky.sticky_max_age_seconds = Some(600);
    let both = [endpoint("10.77.2.2"), endpoint("10.77.3.2")];
    let mut state = ProxyState::new("node1");
    for svc in [&web, &empty, &sticky] {
        state.set_service(svc.name.service.clone(), vec![svc.clone()]);
    }
    state.set_endpoints(&web.name, 8080, &both);
    state.set_endpoints(&sticky.name, 8080, &both);
    state.take_changed();

    let mut renderer = Renderer::new(Config {
        cluster_cidr: Some("10.77.2.0/23".parse().expect("cidr")),
        node_port_ips: Some(vec!["10.77.1.1".parse().expect("ip")]),
        service_cidrs: vec!["172.30.0.0/16".parse().expect("cidr")],
        service_tables,
        ..Config::default()
    });
    let full = renderer.full_sync(&state);
    nft.apply(&full.script)
        .unwrap_or_else(|err| panic!("full sync refused by nft: {err}\n{}", full.script));
    if service_tables > 0 {
        let tables = nft.list_tables().expect("list");
        assert_eq!(
            tables.matches("\ntable ip kube-proxy-services-").count(),
            usize::from(service_tables),
            "{tables}"
        );
    }

    // ClusterIP: random load balancing reaches both endpoints (a miss in 30 tries: 2^-29).
    let answers = lab.answers("http://172.30.0.10/", 30);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["ep1".to_string(), "ep2".to_string()]),
        "ClusterIP answers: {answers:?}"
    );
    // NodePort on the node's address.
    let answers = lab.answers("http://10.77.1.1:30080/", 30);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["ep1".to_string(), "ep2".to_string()]),
        "NodePort answers: {answers:?}"
    );
    // ClientIP affinity: every request of this client lands on one endpoint.
    let answers = lab.answers("http://172.30.0.12/", 15);
    assert_eq!(distinct(&answers).len(), 1, "affinity answers: {answers:?}");
    // No endpoints: rejected (ICMP port unreachable → connection refused), not dropped.
    let err = lab
        .get("http://172.30.0.11/")
        .expect_err("a Service without endpoints must not answer");
    assert!(err.contains("refused"), "expected a reject, got: {err}");
    // An unknown port of a ClusterIP is rejected too (cluster-ips-check).
    let err = lab
        .get("http://172.30.0.10:81/")
        .expect_err("an undefined port must not answer");
    assert!(err.contains("refused"), "expected a reject, got: {err}");

    // Incremental: ep2 leaves the Service; only that Service's rules are written.
    state.set_endpoints(&web.name, 8080, &both[..1]);
    let changed = state.take_changed();
    let partial = renderer.sync(&state, &changed, Instant::now());
    assert!(!partial.full);
    assert!(
        !partial.script.contains("delete table"),
        "{}",
        partial.script
    );
    let applied = nft
        .apply_partial(&partial.script)
        .unwrap_or_else(|err| panic!("partial sync refused: {err}\n{}", partial.script));
    assert_eq!(applied, Applied::Netlink, "{}", partial.script);
    let answers = lab.answers("http://172.30.0.10/", 20);
    assert_eq!(
        distinct(&answers),
        BTreeSet::from(["ep1".to_string()]),
        "after removing ep2: {answers:?}"
    );
    // The stale endpoint chain is deleted by a sync a second later.
    let later = renderer.sync(
        &state,
        &BTreeSet::new(),
        Instant::now() + Duration::from_secs(2),
    );
    assert!(later.script.starts_with("delete chain"), "{}", later.script);
    nft.apply_partial(&later.script)
        .expect("stale chain deletion");
    let table = nft.list_tables().expect("list");
    assert!(!table.contains("10.77.3.2/8080\n\t\tip saddr"), "{table}");
    assert_eq!(
        table.matches("chain endpoint-").count(),
        3,
        "web keeps one endpoint chain, sticky two:\n{table}"
    );

    // Endpoints arrive for the empty Service: the reject goes, traffic flows.
    state.set_endpoints(&empty.name, 8080, &both[1..]);
    let changed = state.take_changed();
    let applied = nft
        .apply_partial(&renderer.sync(&state, &changed, Instant::now()).script)
        .expect("partial sync");
    assert_eq!(applied, Applied::Netlink);
    assert_eq!(lab.answers("http://172.30.0.11/", 3), vec!["ep2"; 3]);

    // A full resync over the existing table rebuilds it in one transaction.
    renderer.invalidate();
    nft.apply(
        &renderer
            .sync(&state, &BTreeSet::new(), Instant::now())
            .script,
    )
    .expect("full resync");
    assert_eq!(lab.answers("http://172.30.0.10/", 3), vec!["ep1"; 3]);

    // --cleanup removes the table.
    nft.delete_table().expect("cleanup");
    assert!(nft.list_tables().is_err(), "the table is gone");
    nft.delete_table()
        .expect("cleanup of a missing table is fine");
}

/// Every golden script of a feature (after the base table) is accepted by the kernel, so the
/// renderer's unit tests check text that nft really takes.
#[test]
fn golden_scripts_are_accepted_by_nft() {
    preflight();
    let ns = format!("fpxg{}", std::process::id());
    must(&["ip", "netns", "add", &ns]);
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = run(&["ip", "netns", "del", &self.0]);
        }
    }
    let _cleanup = Cleanup(ns.clone());
    let nft = Nft::with_command(vec![
        "ip".into(),
        "netns".into(),
        "exec".into(),
        ns.clone(),
        "nft".into(),
    ]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    let base = std::fs::read_to_string(dir.join("base.nft")).expect("base golden");
    for name in [
        "affinity",
        "bridge_masquerade",
        "cluster_ip",
        "cluster_ip_vmap",
        "etp_local",
        "etp_local_no_local_endpoints",
        "itp_local_no_local_endpoints",
        "load_balancer",
        "no_endpoints",
        "node_port",
        "terminating",
    ] {
        let lines = std::fs::read_to_string(dir.join(format!("{name}.nft"))).expect("golden");
        nft.apply(&format!("{base}{lines}"))
            .unwrap_or_else(|err| panic!("golden {name} refused by nft: {err}"));
    }
    // The split layout: its base, a Service, then that Service's partial sync.
    for name in [
        "base_split",
        "split_load_balancer",
        "split_incremental_endpoint_replaced",
    ] {
        let lines = std::fs::read_to_string(dir.join(format!("{name}.nft"))).expect("golden");
        nft.apply(&lines)
            .unwrap_or_else(|err| panic!("golden {name} refused by nft: {err}"));
    }
}

/// `nft list table` with each set's elements sorted (the kernel dumps a hash set in its own
/// order, which differs between two namespaces holding the same elements).
fn normalized_table(nft: &Nft) -> String {
    let table = nft.list_tables().expect("list table");
    let mut out = String::new();
    let mut rest = table.as_str();
    while let Some(start) = rest.find("elements = {") {
        let (head, tail) = rest.split_at(start + "elements = {".len());
        out.push_str(head);
        let end = tail.find('}').expect("elements end");
        let mut elements: Vec<&str> = tail[..end].split(',').map(str::trim).collect();
        elements.sort_unstable();
        out.push_str(&elements.join(", "));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Every form a partial sync writes, applied as a netlink batch in one namespace and by
/// `nft -f` in another, leaves the same ruleset, listed by nft.
#[test]
fn netlink_partial_syncs_leave_the_ruleset_nft_leaves() {
    preflight();
    for service_tables in [0, 4] {
        netlink_matches_nft(service_tables);
    }
}

fn netlink_matches_nft(service_tables: u16) {
    let pid = std::process::id();
    let (ns_netlink, ns_nft) = (
        format!("fpxn{pid}-{service_tables}"),
        format!("fpxf{pid}-{service_tables}"),
    );
    struct Cleanup(Vec<String>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for ns in &self.0 {
                let _ = run(&["ip", "netns", "del", ns]);
            }
        }
    }
    let _cleanup = Cleanup(vec![ns_netlink.clone(), ns_nft.clone()]);
    let in_ns = |ns: &str| {
        must(&["ip", "netns", "add", ns]);
        Nft::with_command(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            ns.to_string(),
            "nft".into(),
        ])
    };
    let via_netlink = in_ns(&ns_netlink).with_netlink(netlink_in(&ns_netlink));
    let via_nft = in_ns(&ns_nft);

    let node_endpoint = |ip: &str| Endpoint {
        node_name: Some("node1".into()),
        is_local: true,
        ..endpoint(ip)
    };
    let mut state = ProxyState::new("node1");
    let mut renderer = Renderer::new(Config {
        // A prefix of no whole bytes (masked) and one of whole bytes (bridge).
        cluster_cidr: Some("10.76.0.0/14".parse().expect("cidr")),
        node_port_ips: Some(vec!["10.77.1.1".parse().expect("ip")]),
        service_cidrs: vec!["172.30.0.0/16".parse().expect("cidr")],
        node_ip: Some("10.77.1.1".parse().expect("ip")),
        bridge_pod_cidr: Some("10.77.2.0/24".parse().expect("cidr")),
        service_tables,
        ..Config::default()
    });
    let web = port("web", "172.30.0.10");
    state.set_service(web.name.service.clone(), vec![web.clone()]);
    state.set_endpoints(
        &web.name,
        8080,
        &[endpoint("10.77.2.2"), endpoint("10.77.3.2")],
    );
    state.take_changed();
    let full = renderer.full_sync(&state);
    for nft in [&via_netlink, &via_nft] {
        nft.apply(&full.script)
            .unwrap_or_else(|err| panic!("full sync: {err}"));
    }

    let mut now = Instant::now();
    let mut step = |state: &mut ProxyState, what: &str, expect: Applied| {
        now += Duration::from_secs(2);
        let changed = state.take_changed();
        let tx = renderer.sync(state, &changed, now);
        assert!(!tx.full, "{what}");
        let applied = via_netlink
            .apply_partial(&tx.script)
            .unwrap_or_else(|err| panic!("{what}: {err}\n{}", tx.script));
        assert_eq!(applied, expect, "{what}:\n{}", tx.script);
        via_nft
            .apply(&tx.script)
            .unwrap_or_else(|err| panic!("{what} through nft: {err}\n{}", tx.script));
        let (got, want) = (normalized_table(&via_netlink), normalized_table(&via_nft));
        assert_eq!(
            got, want,
            "{what} ({service_tables} Service tables): netlink vs nft -f after\n{}",
            tx.script
        );
    };

    // A NodePort with ClientIP affinity: sets created in the batch, lookups and updates.
    let mut sticky = port("sticky", "172.30.0.12");
    sticky.node_port = 30080;
    sticky.sticky_max_age_seconds = Some(600);
    state.set_service(sticky.name.service.clone(), vec![sticky.clone()]);
    state.set_endpoints(
        &sticky.name,
        8080,
        &[endpoint("10.77.2.2"), endpoint("10.77.3.2")],
    );
    step(&mut state, "affinity NodePort added", Applied::Netlink);
    sticky.sticky_max_age_seconds = Some(900);
    state.set_service(sticky.name.service.clone(), vec![sticky.clone()]);
    step(&mut state, "affinity timeout changed", Applied::Netlink);

    // UDP and SCTP, three endpoints (numgen cascade), one on the bridge (masquerade rule).
    for (name, ip, protocol) in [
        ("dns", "172.30.0.13", Protocol::Udp),
        ("sig", "172.30.0.14", Protocol::Sctp),
    ] {
        let mut svc = port(name, ip);
        svc.name.protocol = protocol;
        state.set_service(svc.name.service.clone(), vec![svc.clone()]);
        state.set_endpoints(
            &svc.name,
            53,
            &[
                endpoint("10.77.2.3"),
                endpoint("10.77.3.3"),
                endpoint("10.77.4.3"),
            ],
        );
    }
    step(&mut state, "udp and sctp Services added", Applied::Netlink);

    // externalTrafficPolicy Local with a local endpoint (fib rules, comments), and an
    // internalTrafficPolicy Local Service without local endpoints (reject elements).
    let mut local = port("local", "172.30.0.15");
    local.node_port = 30081;
    local.external_ips = vec!["192.0.2.10".parse().expect("ip")];
    local.external_policy_local = true;
    state.set_service(local.name.service.clone(), vec![local.clone()]);
    state.set_endpoints(
        &local.name,
        8080,
        &[node_endpoint("10.77.2.4"), endpoint("10.77.3.4")],
    );
    let mut itp = port("itp", "172.30.0.16");
    itp.internal_policy_local = true;
    state.set_service(itp.name.service.clone(), vec![itp.clone()]);
    state.set_endpoints(&itp.name, 8080, &[endpoint("10.77.3.5")]);
    step(&mut state, "Local traffic policies", Applied::Netlink);

    // Endpoints go and come back; a Service without endpoints; a Service deleted.
    state.set_endpoints(&web.name, 8080, &[endpoint("10.77.2.2")]);
    step(&mut state, "endpoint removed", Applied::Netlink);
    step(&mut state, "stale chains deleted", Applied::Netlink);
    state.set_endpoints(&web.name, 8080, &[]);
    step(&mut state, "no endpoints left", Applied::Netlink);
    state.set_endpoints(&web.name, 8080, &[endpoint("10.77.3.2")]);
    step(&mut state, "endpoints back", Applied::Netlink);
    state.delete_service("default", "sticky");
    step(&mut state, "affinity Service deleted", Applied::Netlink);
    step(&mut state, "its chains deleted", Applied::Netlink);

    // loadBalancerSourceRanges render an anonymous set: that transaction goes through nft.
    let mut lb = port("lb", "172.30.0.17");
    lb.load_balancer_vips = vec!["203.0.113.5".parse().expect("ip")];
    lb.load_balancer_source_ranges = vec!["198.51.100.0/24".parse().expect("cidr")];
    state.set_service(lb.name.service.clone(), vec![lb.clone()]);
    state.set_endpoints(&lb.name, 8080, &[endpoint("10.77.3.6")]);
    step(&mut state, "LoadBalancer with source ranges", Applied::Nft);

    // A refused batch names its line and leaves nothing of itself behind.
    let before = normalized_table(&via_netlink);
    let err = via_netlink
        .apply_partial(
            "add chain ip kube-proxy zz-new\nadd rule ip kube-proxy zz-missing goto zz-new\n",
        )
        .expect_err("a rule in a missing chain is refused");
    assert!(
        err.to_string()
            .ends_with("at: add rule ip kube-proxy zz-missing goto zz-new"),
        "{err}"
    );
    assert_eq!(normalized_table(&via_netlink), before, "atomic");
}
