//! Benchmark: the node's cluster DNS responder with 10 000 Services in the cluster (every tenth
//! headless with three endpoints): queries per second and latency percentiles over UDP on
//! loopback for cluster names, against the same responder forwarding a name outside the cluster
//! to an upstream resolver (a stub on loopback answering at once) — the path a name takes
//! without cluster DNS on the node. Also the answer's cost in process and the index's memory
//! per 1000 Services. Prints its figures; asserts nothing about time.
//!
//! Run: `cargo bench -p flotilla-proxy --bench dns`.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use flotilla_proxy::dns::records::ClusterDns;
use flotilla_proxy::dns::server;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use serde_json::json;
use tokio::net::UdpSocket;

const SERVICES: usize = 10_000;
const CLIENTS: usize = 8;
const QUERIES_PER_CLIENT: usize = 2_500;

fn resident_kib() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4)
}

fn cluster(services: usize) -> ClusterDns {
    let mut dns = ClusterDns::new("cluster.local").expect("zone");
    for i in 0..services {
        let namespace = format!("ns-{}", i % 100);
        let name = format!("svc-{i}");
        let headless = i % 10 == 0;
        let ip = format!("10.96.{}.{}", (i / 250) % 250, i % 250 + 1);
        let service = json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": if headless { "None".to_string() } else { ip },
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
        });
        dns.apply_service(&serde_json::from_value(service).expect("service"));
        if headless {
            let endpoints: Vec<_> = (0..3)
                .map(|e| {
                    json!({"addresses": [format!("10.244.{}.{}", i % 250, e + 1)],
                                "conditions": {"ready": true}})
                })
                .collect();
            let slice = json!({
                "metadata": {"name": format!("{name}-x"), "namespace": namespace,
                             "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4", "endpoints": endpoints,
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            });
            dns.apply_slice(&serde_json::from_value(slice).expect("slice"));
        }
    }
    dns
}

fn query(id: u16, name: &str) -> Vec<u8> {
    query_of(id, name, RecordType::A)
}

fn query_of(id: u16, name: &str, kind: RecordType) -> Vec<u8> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).expect("name"), kind));
    message.to_vec().expect("query")
}

/// A stub upstream resolver: answers every query at once with its own bytes as a response.
async fn stub_upstream() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind stub");
    let address = socket.local_addr().expect("address");
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 4096];
        loop {
            let Ok((len, peer)) = socket.recv_from(&mut buffer).await else {
                continue;
            };
            let mut reply = buffer[..len].to_vec();
            if let Some(flags) = reply.get_mut(2) {
                *flags |= 0x80; // QR: a response
            }
            let _ = socket.send_to(&reply, peer).await;
        }
    });
    address
}

/// `CLIENTS` clients each sending `QUERIES_PER_CLIENT` queries for `names(i)`, one at a time:
/// (queries per second, p50, p99).
async fn load(
    server: SocketAddr,
    names: Arc<dyn Fn(usize) -> String + Send + Sync>,
) -> (f64, Duration, Duration) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let names = names.clone();
        tasks.push(tokio::spawn(async move {
            let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
            socket.connect(server).await.expect("connect");
            let mut buffer = vec![0u8; 4096];
            let mut latencies = Vec::with_capacity(QUERIES_PER_CLIENT);
            for i in 0..QUERIES_PER_CLIENT {
                let request = query(i as u16, &names(client * QUERIES_PER_CLIENT + i));
                let sent = Instant::now();
                socket.send(&request).await.expect("send");
                tokio::time::timeout(Duration::from_secs(2), socket.recv(&mut buffer))
                    .await
                    .expect("an answer within 2 s")
                    .expect("recv");
                latencies.push(sent.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("client"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    (
        latencies.len() as f64 / elapsed.as_secs_f64(),
        at(0.50),
        at(0.99),
    )
}

#[tokio::main]
async fn main() {
    let before = resident_kib();
    let dns = cluster(SERVICES);
    let after = resident_kib();
    println!(
        "index: {SERVICES} Services (1000 headless with 3 endpoints each): {} KiB resident, {:.0} KiB per 1000 Services",
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / (SERVICES as f64 / 1000.0)
    );

    let requests: Vec<Vec<u8>> = (0..10_000)
        .map(|i| {
            query(
                i as u16,
                &format!("svc-{i}.ns-{}.svc.cluster.local.", i % 100),
            )
        })
        .collect();
    let started = Instant::now();
    for request in &requests {
        std::hint::black_box(server::respond(&dns, request, true));
    }
    println!(
        "in process: {:.2} µs per answer (parse, look up, write)",
        started.elapsed().as_secs_f64() * 1e6 / requests.len() as f64
    );

    // Reverse lookups of the Services' addresses (every tenth is headless: its address is
    // nobody's, and goes upstream), through the address index.
    let reverse: Vec<Vec<u8>> = (0..10_000)
        .map(|i| {
            query_of(
                i as u16,
                &format!("{}.{}.96.10.in-addr.arpa.", i % 250 + 1, (i / 250) % 250),
                RecordType::PTR,
            )
        })
        .collect();
    let started = Instant::now();
    for request in &reverse {
        std::hint::black_box(server::respond(&dns, request, true));
    }
    println!(
        "in process: {:.2} µs per PTR answer (of {SERVICES} Services)",
        started.elapsed().as_secs_f64() * 1e6 / reverse.len() as f64
    );

    let upstream = stub_upstream().await;
    let records = Arc::new(RwLock::new(dns));
    let listening = server::bind("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("bind");
    let address = listening.local_address().expect("address");
    tokio::spawn(server::serve(listening, records, vec![upstream]));

    let cluster_names: Arc<dyn Fn(usize) -> String + Send + Sync> =
        Arc::new(|i| format!("svc-{}.ns-{}.svc.cluster.local.", i % SERVICES, i % 100));
    let forwarded: Arc<dyn Fn(usize) -> String + Send + Sync> =
        Arc::new(|i| format!("host-{i}.example.com."));
    // Alternated, so that both see the same machine.
    for round in 1..=2 {
        let (qps, p50, p99) = load(address, cluster_names.clone()).await;
        let (ref_qps, ref_p50, ref_p99) = load(address, forwarded.clone()).await;
        println!(
            "round {round}: cluster names {qps:.0}/s p50 {:.0} µs p99 {:.0} µs; forwarded upstream {ref_qps:.0}/s p50 {:.0} µs p99 {:.0} µs; ratio {:.2}x the queries/s, p99 {:.2}x",
            p50.as_secs_f64() * 1e6,
            p99.as_secs_f64() * 1e6,
            ref_p50.as_secs_f64() * 1e6,
            ref_p99.as_secs_f64() * 1e6,
            qps / ref_qps,
            p99.as_secs_f64() / ref_p99.as_secs_f64()
        );
    }
}
