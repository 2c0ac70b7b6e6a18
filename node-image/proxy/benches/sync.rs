//! Benchmark: time to program one Service change incrementally with 1000 and 10 000 Services
//! present, against a full rewrite of the table (what iptables-mode kube-proxy does on every
//! change). Real `nft` in a scratch network namespace made here; needs root, `ip` and `nft`.
//! Prints its figures; asserts nothing about time.
//!
//! Changes go as the proxy sends them: a netlink batch (`Nft::apply_partial`), with the
//! Services' NAT part over the default number of tables. `FLOTILLA_PROXY_BENCH_NFT=1` pipes
//! them to `nft -f -` instead; `FLOTILLA_PROXY_BENCH_SERVICE_TABLES=N` sets the tables (0:
//! upstream's single table).
//!
//! Run: `cargo bench -p flotilla-proxy --bench sync` (or build it in the dev profile with
//! `cargo build -p flotilla-proxy --benches` and run the binary: the kernel and nft dominate
//! the figures, render times are printed apart).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_proxy::model::{
    Endpoint, NamespacedName, Protocol, ProxyState, ServicePort, ServicePortName,
};
use flotilla_proxy::netlink::Netlink;
use flotilla_proxy::nft::{Applied, Nft};
use flotilla_proxy::render::{Config, DEFAULT_SERVICE_TABLES, Renderer};

const IN_NAMESPACE: &str = "FLOTILLA_PROXY_BENCH_IN_NETNS";
const CHANGES: usize = 50;
const FULL_RUNS: usize = 3;

fn main() {
    if std::env::var_os(IN_NAMESPACE).is_some() {
        bench();
        return;
    }
    // Re-run this program inside a namespace of its own, so nft runs exactly as the proxy
    // runs it (no `ip netns exec` per transaction) and nothing touches the host's rules.
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if uid != "0" {
        eprintln!("the proxy benchmark needs root (it makes a network namespace)");
        std::process::exit(1);
    }
    if Command::new("nft").arg("--version").output().is_err() {
        eprintln!("the proxy benchmark needs nft");
        std::process::exit(1);
    }
    let ns = format!("fpxbench{}", std::process::id());
    let created = Command::new("ip").args(["netns", "add", &ns]).status();
    if !created.is_ok_and(|s| s.success()) {
        eprintln!("cannot create network namespace {ns}");
        std::process::exit(1);
    }
    let exe = std::env::current_exe().expect("current exe");
    let status = Command::new("ip")
        .args(["netns", "exec", &ns])
        .arg(exe)
        .env(IN_NAMESPACE, "1")
        .status();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    if !status.is_ok_and(|s| s.success()) {
        std::process::exit(1);
    }
}

fn service(i: usize) -> ServicePort {
    ServicePort {
        name: ServicePortName {
            service: NamespacedName::new(&format!("ns{}", i % 50), &format!("svc{i}")),
            port: "http".into(),
            protocol: Protocol::Tcp,
        },
        cluster_ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 30, 0, 0)) + i as u32 + 1),
        port: 80,
        node_port: if i.is_multiple_of(10) {
            30000 + (i / 10) as u16 % 2768
        } else {
            0
        },
        external_ips: vec![],
        load_balancer_vips: vec![],
        load_balancer_source_ranges: vec![],
        sticky_max_age_seconds: i.is_multiple_of(20).then_some(10800),
        external_policy_local: false,
        internal_policy_local: false,
        health_check_node_port: 0,
    }
}

fn endpoint(i: usize, j: usize) -> Endpoint {
    Endpoint {
        ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + (i * 4 + j) as u32),
        port: 8080,
        ready: true,
        serving: true,
        terminating: false,
        node_name: Some(format!("node{}", j % 3)),
        zone: None,
        is_local: j == 0,
    }
}

fn endpoints(i: usize, count: usize) -> Vec<Endpoint> {
    (0..count).map(|j| endpoint(i, j)).collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn bench() {
    let mut nft = Nft::default();
    let via_nft = std::env::var_os("FLOTILLA_PROXY_BENCH_NFT").is_some();
    if !via_nft {
        nft = nft.with_netlink(Netlink::open().expect("netlink socket"));
    }
    let service_tables = std::env::var("FLOTILLA_PROXY_BENCH_SERVICE_TABLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_SERVICE_TABLES);
    println!(
        "flotilla-proxy sync benchmark (nft: {}; changes through {}; {service_tables} Service tables)",
        nft.version().unwrap_or_default(),
        if via_nft { "nft -f" } else { "netlink" }
    );
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12} {:>8}",
        "services",
        "rules(KB)",
        "full ms",
        "full render",
        "change p50",
        "change p99",
        "render p50",
        "ratio"
    );
    for services in [1000usize, 10_000] {
        let mut state = ProxyState::new("node0");
        for i in 0..services {
            let svc = service(i);
            state.set_service(svc.name.service.clone(), vec![svc.clone()]);
            state.set_endpoints(&svc.name, 8080, &endpoints(i, 2 + i % 2));
        }
        state.take_changed();
        let config = Config {
            service_tables,
            cluster_cidr: Some("10.128.0.0/14".parse().expect("cidr")),
            node_port_ips: Some(vec![Ipv4Addr::new(10, 199, 7, 2)]),
            service_cidrs: vec!["172.30.0.0/16".parse().expect("cidr")],
            ..Config::default()
        };
        let mut renderer = Renderer::new(config);

        // Full rewrites: render + apply of the whole table, as after a restart or an error.
        let mut full_times = Vec::new();
        let mut full_render = Duration::ZERO;
        let mut size = 0;
        for _ in 0..FULL_RUNS {
            renderer.invalidate();
            let start = Instant::now();
            let tx = renderer.sync(&state, &BTreeSet::new(), start);
            full_render = start.elapsed();
            size = tx.script.len();
            if let Some(dir) = std::env::var_os("FLOTILLA_PROXY_BENCH_DUMP") {
                // For looking into nft's costs by hand: the table of this size.
                let path = std::path::Path::new(&dir).join(format!("full-{services}.nft"));
                std::fs::write(path, &tx.script).expect("dump");
            }
            nft.apply(&tx.script).expect("full sync");
            full_times.push(start.elapsed());
        }
        full_times.sort();
        let full = percentile(&full_times, 0.5);

        // One Service change at a time: endpoint added, endpoint removed, Service added.
        let mut change_times = Vec::new();
        let mut render_times = Vec::new();
        let mut next_new = services;
        for k in 0..CHANGES {
            let i = (k * 7919) % services;
            let svc = service(i);
            match k % 3 {
                0 => state.set_endpoints(&svc.name, 8080, &endpoints(i, 4)),
                1 => state.set_endpoints(&svc.name, 8080, &endpoints(i, 1)),
                _ => {
                    let new = service(next_new);
                    next_new += 1;
                    state.set_service(new.name.service.clone(), vec![new.clone()]);
                    state.set_endpoints(&new.name, 8080, &endpoints(next_new, 2));
                }
            }
            let start = Instant::now();
            let changed = state.take_changed();
            let tx = renderer.sync(&state, &changed, start);
            render_times.push(start.elapsed());
            let applied = nft.apply_partial(&tx.script).expect("partial sync");
            change_times.push(start.elapsed());
            assert_eq!(
                applied,
                if via_nft {
                    Applied::Nft
                } else {
                    Applied::Netlink
                },
                "{}",
                tx.script
            );
            // Stale chains wait a second before a sync deletes them; do it here, unmeasured,
            // so each measured change is one Service's own transaction.
            if let Some(stale) = renderer.take_stale_chains(start + Duration::from_secs(2)) {
                nft.apply_partial(&stale).expect("stale chains");
            }
        }
        change_times.sort();
        render_times.sort();
        let p50 = percentile(&change_times, 0.5);
        let p99 = percentile(&change_times, 0.99);
        println!(
            "{:>8} {:>10} {:>12.1} {:>12.1} {:>12.2} {:>12.2} {:>12.3} {:>8.4}",
            services,
            size / 1024,
            ms(full),
            ms(full_render),
            ms(p50),
            ms(p99),
            ms(percentile(&render_times, 0.5)),
            p50.as_secs_f64() / full.as_secs_f64()
        );
    }
    println!(
        "full ms: render + apply of the whole table (median of {FULL_RUNS}); change: render + apply \
         of one Service change over {CHANGES} changes (endpoint added / removed / Service added); \
         ratio: change p50 / full"
    );
    let _ = nft.delete_table();
}
