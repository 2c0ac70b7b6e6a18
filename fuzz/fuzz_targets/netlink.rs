//! The proxy's nf_tables batch encoder (`flotilla_proxy::batch`, committed over netlink by
//! `netlink`) fed what reaches it from outside the process: Services and EndpointSlices built
//! from the fuzzer's bytes (names, addresses, ports, protocols, policies, affinity, load
//! balancer ingress and source ranges) go through the model and the renderer for a few
//! partial syncs, and each sync's script through the encoder — or, with the first byte's
//! third choice, arbitrary text does. No panic anywhere, and every batch is well formed for
//! the kernel: messages and attributes whose lengths agree with each other and the batch, in
//! 4-byte alignment with zeroed padding, numbered one after the other from the batch's first
//! sequence number, framed by BATCH_BEGIN and BATCH_END, each naming the table and the chain
//! or set of its script line. With objects the API server would admit, every line of a
//! partial sync encodes but the forms the encoder leaves to `nft -f` (`numgen … vmap`, the
//! anonymous sets of `loadBalancerSourceRanges`).
#![no_main]

use std::time::{Duration, Instant};

use flotilla_proxy::batch::{self, Batch, EncodeError};
use flotilla_proxy::model::ProxyState;
use flotilla_proxy::render::{Config, LoadBalancing, Renderer, is_proxy_table};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

const NLA_F_NESTED: u16 = 0x8000;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFPROTO_IPV4: u8 = 2;
/// nf_tables messages the encoder may write: NEWCHAIN, DELCHAIN, NEWRULE, DELRULE, NEWSET,
/// DELSET, NEWSETELEM, DELSETELEM.
const MESSAGE_KINDS: [u16; 8] = [3, 5, 6, 8, 9, 11, 12, 14];

/// One attribute: its kind (without the nested flag), payload, and children if nested.
#[derive(Debug)]
struct Attr<'a> {
    kind: u16,
    payload: &'a [u8],
}

/// The attributes of one message or nested attribute, checked: each length covers its
/// header, stays within its parent, and is followed by zeroed padding to 4 bytes.
fn attrs(mut data: &[u8], depth: usize) -> Vec<Attr<'_>> {
    assert!(depth < 8, "attributes nest at most a few levels");
    let mut out = Vec::new();
    while !data.is_empty() {
        assert!(data.len() >= 4, "a trailing partial attribute header");
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let kind = u16::from_ne_bytes([data[2], data[3]]);
        assert!(len >= 4, "an attribute shorter than its header");
        assert!(len <= data.len(), "an attribute past its parent's end");
        let padded = (len + 3) & !3;
        assert!(padded <= data.len(), "an attribute without its padding");
        assert!(data[len..padded].iter().all(|b| *b == 0), "padding is zero");
        let payload = &data[4..len];
        if kind & NLA_F_NESTED != 0 {
            attrs(payload, depth + 1);
        }
        out.push(Attr {
            kind: kind & !NLA_F_NESTED,
            payload,
        });
        data = &data[padded..];
    }
    out
}

/// A NUL-terminated string attribute's text.
fn string<'a>(attr: &Attr<'a>) -> &'a str {
    let (nul, text) = attr.payload.split_last().expect("a string holds its NUL");
    assert_eq!(*nul, 0, "a string ends with NUL");
    std::str::from_utf8(text).expect("names come from UTF-8 script text")
}

/// Reads `batch` back as the kernel would and checks it against the script it came from.
fn well_formed(batch: &Batch) {
    let mut rest = batch.bytes.as_slice();
    let mut seq = batch.first_seq;
    let mut kinds = Vec::new();
    while !rest.is_empty() {
        assert!(rest.len() >= 20, "a message shorter than its headers");
        let len = u32::from_ne_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        assert!(len >= 20 && len <= rest.len(), "message length {len}");
        assert_eq!(len % 4, 0, "messages are 4-byte aligned");
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        let flags = u16::from_ne_bytes([rest[6], rest[7]]);
        assert_eq!(flags & 1, 1, "NLM_F_REQUEST");
        assert_eq!(
            u32::from_ne_bytes(rest[8..12].try_into().expect("4 bytes")),
            seq,
            "sequence numbers follow each other"
        );
        assert_eq!(&rest[12..16], &[0; 4], "port id 0");
        let (family, version) = (rest[16], rest[17]);
        let res_id = u16::from_be_bytes([rest[18], rest[19]]);
        assert_eq!(version, 0);
        let attributes = attrs(&rest[20..len], 0);
        if kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END {
            assert_eq!((family, res_id), (0, NFNL_SUBSYS_NFTABLES));
            assert!(attributes.is_empty());
        } else {
            assert_eq!(kind >> 8, NFNL_SUBSYS_NFTABLES, "an nf_tables message");
            assert!(MESSAGE_KINDS.contains(&(kind & 0xff)), "kind {kind:#x}");
            assert_eq!((family, res_id), (NFPROTO_IPV4, 0));
            let line = batch.lines.get(&seq).expect("each message has its line");
            let words: Vec<&str> = line.split(' ').collect();
            let table = attributes.first().expect("the table first");
            assert_eq!(table.kind, 1, "the table first");
            assert_eq!(string(table), words[3], "{line}");
            assert!(is_proxy_table(string(table)), "{line}");
            // The object's name: attribute 3 of a chain, 2 of a rule's chain, a set, or
            // the set of an element list.
            let name_kind = match kind & 0xff {
                3 | 5 => 3,
                _ => 2,
            };
            let name = attributes
                .iter()
                .find(|a| a.kind == name_kind)
                .expect("the object's name");
            assert_eq!(string(name), words[4], "{line}");
        }
        kinds.push(kind);
        seq = seq.wrapping_add(1);
        rest = &rest[len..];
    }
    assert_eq!(kinds.first(), Some(&NFNL_MSG_BATCH_BEGIN));
    assert_eq!(kinds.last(), Some(&NFNL_MSG_BATCH_END));
    assert_eq!(
        kinds.iter().filter(|k| **k == NFNL_MSG_BATCH_BEGIN).count()
            + kinds.iter().filter(|k| **k == NFNL_MSG_BATCH_END).count(),
        2
    );
    assert_eq!(batch.next_seq, seq);
    assert_eq!(batch.lines.len(), kinds.len() - 2);
}

/// Encodes one script; with `strict` (objects the API server admits) only the forms left to
/// `nft -f` may be refused.
fn encode(script: &str, first_seq: u32, strict: bool) {
    match batch::encode(script, first_seq) {
        Ok(batch) => well_formed(&batch),
        Err(EncodeError::Unsupported { line, text }) => {
            assert_eq!(script.lines().nth(line - 1), Some(text.as_str()));
            if strict {
                let left_to_nft = text.contains(" vmap { ") || text.contains(" ip saddr != { ");
                assert!(left_to_nft, "a partial sync's line does not encode: {text}");
            }
        }
    }
}

/// Generates objects: the API server's names and values, or anything.
struct Gen<'a, 'b> {
    u: &'a mut Unstructured<'b>,
    valid: bool,
}

impl Gen<'_, '_> {
    /// A DNS label (Service and namespace names), or any string.
    fn label(&mut self, max: usize) -> Result<String> {
        if !self.valid {
            return self.u.arbitrary();
        }
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789-";
        let len = self.u.int_in_range(1..=max)?;
        let mut name = String::with_capacity(len);
        for i in 0..len {
            let pick = if i == 0 || i == len - 1 { 36 } else { 37 };
            let c = CHARS[self.u.choose_index(pick)?];
            name.push(if i == 0 && c.is_ascii_digit() {
                'a'
            } else {
                c as char
            });
        }
        Ok(name)
    }

    fn port_name(&mut self) -> Result<Value> {
        Ok(match self.u.int_in_range(0..=3)? {
            0 => Value::Null,
            1 => json!("http"),
            2 => json!("dns-tcp"),
            _ => json!(self.label(15)?),
        })
    }

    /// An IPv4 address from a few small ranges (so that they collide), or any string.
    fn ip(&mut self) -> Result<String> {
        if !self.valid && self.u.ratio(1, 4)? {
            return self.u.arbitrary();
        }
        let prefix = *self.u.choose(&[[10, 96, 0], [10, 244, 1], [192, 168, 7]])?;
        let last: u8 = self.u.arbitrary()?;
        Ok(format!("{}.{}.{}.{last}", prefix[0], prefix[1], prefix[2]))
    }

    fn cidr(&mut self) -> Result<String> {
        if !self.valid && self.u.ratio(1, 4)? {
            return self.u.arbitrary();
        }
        let prefix = self.u.int_in_range(0..=32)?;
        Ok(format!("{}/{prefix}", self.ip()?))
    }

    fn port(&mut self) -> Result<i64> {
        Ok(if self.valid {
            i64::from(self.u.int_in_range(1..=u16::MAX)?)
        } else {
            i64::from(self.u.arbitrary::<i32>()?)
        })
    }

    fn protocol(&mut self) -> Result<Value> {
        let protocols = ["TCP", "UDP", "SCTP"];
        Ok(match self.u.int_in_range(0..=4)? {
            0 => Value::Null,
            i @ 1..=3 => json!(protocols[i - 1]),
            _ if self.valid => json!("TCP"),
            _ => json!(self.u.arbitrary::<String>()?),
        })
    }

    fn list<T>(
        &mut self,
        max: usize,
        mut item: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<Vec<T>> {
        let n = self.u.int_in_range(0..=max)?;
        (0..n).map(|_| item(self)).collect()
    }

    fn service(&mut self, namespace: &str, name: &str) -> Result<Value> {
        let type_ = *self
            .u
            .choose(&["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"])?;
        let cluster_ip = if self.u.ratio(1, 8)? {
            "None".to_string()
        } else {
            self.ip()?
        };
        let ports = self.list(3, |g| {
            Ok(json!({
                "name": g.port_name()?,
                "protocol": g.protocol()?,
                "port": g.port()?,
                "nodePort": if g.u.arbitrary()? { json!(g.port()?) } else { Value::Null },
            }))
        })?;
        let external_ips = self.list(2, Self::ip)?;
        let source_ranges = self.list(2, Self::cidr)?;
        let ingress = self.list(2, |g| {
            Ok(json!({"ip": g.ip()?, "ipMode": if g.u.arbitrary()? { "VIP" } else { "Proxy" }}))
        })?;
        let affinity = self.u.arbitrary::<bool>()?;
        let timeout: Option<i32> = if self.valid {
            self.u.int_in_range(1..=86400).map(Some)?
        } else {
            self.u.arbitrary()?
        };
        let local = |g: &mut Self| -> Result<&'static str> {
            Ok(if g.u.arbitrary()? { "Local" } else { "Cluster" })
        };
        Ok(json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "type": type_,
                "clusterIP": cluster_ip,
                "clusterIPs": [cluster_ip],
                "ports": ports,
                "externalIPs": external_ips,
                "loadBalancerSourceRanges": source_ranges,
                "sessionAffinity": if affinity { "ClientIP" } else { "None" },
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": timeout}},
                "externalTrafficPolicy": local(self)?,
                "internalTrafficPolicy": local(self)?,
                "healthCheckNodePort": self.port()?,
            },
            "status": {"loadBalancer": {"ingress": ingress}},
        }))
    }

    fn slice(&mut self, namespace: &str, service: &str, index: u8) -> Result<Value> {
        let endpoints = self.list(4, |g| {
            let condition = |g: &mut Self| -> Result<Value> {
                Ok(match g.u.int_in_range(0..=2)? {
                    0 => Value::Null,
                    1 => json!(true),
                    _ => json!(false),
                })
            };
            Ok(json!({
                "addresses": [g.ip()?],
                "conditions": {
                    "ready": condition(g)?,
                    "serving": condition(g)?,
                    "terminating": condition(g)?,
                },
                "nodeName": *g.u.choose(&["node-a", "node-b"])?,
            }))
        })?;
        let ports = self.list(3, |g| {
            Ok(json!({"name": g.port_name()?, "protocol": g.protocol()?, "port": g.port()?}))
        })?;
        Ok(json!({
            "metadata": {
                "name": format!("{service}-{index}"),
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": ports,
        }))
    }
}

/// Services and slices from `u`, synced a few times.
fn objects(u: &mut Unstructured<'_>, valid: bool) -> Result<()> {
    let mut g = Gen { u, valid };
    let config = Config {
        cluster_cidr: if g.u.arbitrary()? {
            Some("10.244.0.0/16".parse().expect("a CIDR"))
        } else {
            None
        },
        masquerade_all: g.u.arbitrary()?,
        bridge_pod_cidr: if g.u.arbitrary()? {
            Some("10.244.1.0/24".parse().expect("a CIDR"))
        } else {
            None
        },
        load_balancing: if g.u.ratio(1, 4)? {
            LoadBalancing::Vmap
        } else {
            LoadBalancing::Cascade
        },
        service_tables: *g.u.choose(&[0, 1, 8])?,
        ..Config::default()
    };
    let mut state = ProxyState::new("node-a");
    let mut renderer = Renderer::new(config);
    // The first sync is the full one (`nft -f`); the partial ones after it go through the
    // encoder.
    let _ = renderer.full_sync(&state);
    state.take_changed();
    let start = Instant::now();
    let first_seq: u32 = g.u.arbitrary()?;
    let namespaces = [g.label(63)?, g.label(63)?];
    let mut names = Vec::new();
    for round in 0..3u8 {
        let changes = g.u.int_in_range(1..=4)?;
        for _ in 0..changes {
            let namespace = g.u.choose(&namespaces)?.clone();
            let name = if names.is_empty() || g.u.ratio(1, 3)? {
                let name = g.label(63)?;
                names.push((namespace.clone(), name.clone()));
                name
            } else {
                g.u.choose(&names)?.1.clone()
            };
            match g.u.int_in_range(0..=3)? {
                0 => {
                    state.delete_service(&namespace, &name);
                }
                1 => {
                    let slice = g.slice(&namespace, &name, round)?;
                    if let Ok(slice) = serde_json::from_value(slice) {
                        state.apply_slice(&slice);
                    }
                }
                _ => {
                    let service = g.service(&namespace, &name)?;
                    if let Ok(service) = serde_json::from_value(service) {
                        state.apply_service(&service);
                    }
                }
            }
        }
        let changed = state.take_changed();
        let now = start + Duration::from_secs(u64::from(round) * 2);
        let sync = renderer.partial_sync(&state, &changed, now);
        encode(&sync.script, first_seq, valid);
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 | 1 => {
            let _ = objects(&mut Unstructured::new(rest), mode % 3 == 0);
        }
        _ => {
            if let Ok(script) = std::str::from_utf8(rest) {
                let seq = (rest.len() as u32).wrapping_mul(0x9e37_79b9);
                encode(script, seq, false);
            }
        }
    }
});
