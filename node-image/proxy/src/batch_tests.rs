//! Unit tests of the batch encoder: which lines it takes, and the bytes of nft's bytecode.

use super::*;

/// Attributes: kind and payload (without padding).
type Attributes = Vec<(u16, Vec<u8>)>;
/// A message: type, flags, sequence number, attributes.
type Message = (u16, u16, u32, Attributes);

/// The attributes of one netlink message or nested attribute, in order.
fn attrs(mut data: &[u8]) -> Attributes {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let kind = u16::from_ne_bytes([data[2], data[3]]) & !NLA_F_NESTED;
        out.push((kind, data[4..len].to_vec()));
        data = &data[((len + 3) & !3).min(data.len())..];
    }
    out
}

/// Each message of a batch: type, flags, sequence number, attributes.
fn messages(batch: &Batch) -> Vec<Message> {
    let mut out = Vec::new();
    let mut data = batch.bytes.as_slice();
    while !data.is_empty() {
        let len = u32::from_ne_bytes(data[0..4].try_into().expect("len")) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        let flags = u16::from_ne_bytes([data[6], data[7]]);
        let seq = u32::from_ne_bytes(data[8..12].try_into().expect("seq"));
        out.push((kind, flags, seq, attrs(&data[20..len])));
        data = &data[len..];
    }
    out
}

/// The expressions of an `add rule` message: name and attributes of each.
fn expressions(rule_attrs: &[(u16, Vec<u8>)]) -> Vec<(String, Attributes)> {
    let (_, list) = rule_attrs
        .iter()
        .find(|(kind, _)| *kind == NFTA_RULE_EXPRESSIONS)
        .expect("expressions");
    attrs(list)
        .into_iter()
        .map(|(_, elem)| {
            let parts = attrs(&elem);
            let name = String::from_utf8(parts[0].1.clone()).expect("name");
            (name.trim_end_matches('\0').to_string(), attrs(&parts[1].1))
        })
        .collect()
}

fn encode_one(line: &str) -> Vec<Message> {
    let batch = encode(line, 100).unwrap_or_else(|err| panic!("{err}"));
    messages(&batch)
}

#[test]
fn a_batch_is_framed_by_begin_and_end_and_numbers_its_messages() {
    let script =
        "add chain ip kube-proxy a\nflush chain ip kube-proxy a\ndelete chain ip kube-proxy b\n";
    let batch = encode(script, 10).expect("encodes");
    let msgs = messages(&batch);
    let kinds: Vec<u16> = msgs.iter().map(|m| m.0).collect();
    assert_eq!(
        kinds,
        vec![
            NFNL_MSG_BATCH_BEGIN,
            0x0a00 | NFT_MSG_NEWCHAIN,
            0x0a00 | NFT_MSG_DELRULE,
            0x0a00 | NFT_MSG_DELCHAIN,
            NFNL_MSG_BATCH_END
        ]
    );
    let seqs: Vec<u32> = msgs.iter().map(|m| m.2).collect();
    assert_eq!(seqs, vec![10, 11, 12, 13, 14]);
    assert_eq!(batch.next_seq, 15);
    assert_eq!(batch.lines[&12], "flush chain ip kube-proxy a");
    // The batch messages name the nftables subsystem in nfgenmsg's resource id.
    assert_eq!(&batch.bytes[16..20], &[0, 0, 0, 10]);
    assert_eq!(msgs[1].1, NLM_F_REQUEST | NLM_F_CREATE);
    assert_eq!(
        msgs[1].3,
        vec![
            (NFTA_TABLE_OF_OBJECT, b"kube-proxy\0".to_vec()),
            (NFTA_CHAIN_NAME, b"a\0".to_vec())
        ]
    );
}

#[test]
fn rules_are_appended_with_their_comment() {
    let msgs = encode_one(
        "add rule ip kube-proxy external-X ip saddr 10.0.0.0/8 goto service-X comment \"short-circuit pod traffic\"",
    );
    let (kind, flags, _, rule) = &msgs[1];
    assert_eq!(*kind, 0x0a00 | NFT_MSG_NEWRULE);
    assert_eq!(*flags, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND);
    let udata = &rule
        .iter()
        .find(|(k, _)| *k == NFTA_RULE_USERDATA)
        .expect("udata")
        .1;
    assert_eq!(udata[..2], [0, 26]);
    assert_eq!(&udata[2..], b"short-circuit pod traffic\0");
    let names: Vec<String> = expressions(rule).into_iter().map(|(n, _)| n).collect();
    // A /8 loads one byte (nft: `payload load 1b @ network header + 12`).
    assert_eq!(names, vec!["payload", "cmp", "immediate"]);
    let exprs = expressions(rule);
    assert_eq!(exprs[0].1[3], (4, 1u32.to_be_bytes().to_vec()));
    assert_eq!(exprs[1].1[2].1, attrs_of_value(&[10]));
}

fn attrs_of_value(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    Attrs { buf: &mut out }.put(NFTA_DATA_VALUE, data);
    out
}

#[test]
fn prefixes_are_linearized_as_nft_does() {
    let cases: &[(&str, &[&str], u32)] = &[
        (
            "ip saddr != 10.128.0.0/14 jump m",
            &["payload", "bitwise", "cmp", "immediate"],
            4,
        ),
        (
            "ip saddr 10.128.0.0/16 jump m",
            &["payload", "cmp", "immediate"],
            2,
        ),
        (
            "ip saddr 10.128.0.0/24 jump m",
            &["payload", "cmp", "immediate"],
            3,
        ),
        (
            "ip saddr 10.128.0.7 jump m",
            &["payload", "cmp", "immediate"],
            4,
        ),
        (
            "ip saddr 0.0.0.0/0 jump m",
            &["payload", "bitwise", "cmp", "immediate"],
            4,
        ),
    ];
    for (rule, names, load) in cases {
        let msgs = encode_one(&format!("add rule ip kube-proxy c {rule}"));
        let exprs = expressions(&msgs[1].3);
        let got: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(&got, names, "{rule}");
        assert_eq!(exprs[0].1[3].1, load.to_be_bytes(), "{rule}");
    }
    // /14: mask 255.252.0.0, compared with the network.
    let msgs = encode_one("add rule ip kube-proxy c ip saddr != 10.129.0.0/14 jump m");
    let exprs = expressions(&msgs[1].3);
    assert_eq!(exprs[1].1[3].1, attrs_of_value(&[255, 252, 0, 0]));
    assert_eq!(exprs[2].1[1].1, NFT_CMP_NEQ.to_be_bytes());
    assert_eq!(exprs[2].1[2].1, attrs_of_value(&[10, 128, 0, 0]));
}

#[test]
fn every_service_chain_form_of_the_renderer_encodes() {
    let rules = [
        "ip daddr 172.30.0.45 tcp dport 80 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
        "ip daddr 172.30.0.45 udp dport 53 jump mark-for-masquerade",
        "jump mark-for-masquerade",
        "fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"",
        "fib saddr type local goto service-X comment \"short-circuit local traffic\"",
        "goto local-X",
        "ip saddr @affinity-X goto endpoint-X",
        "numgen random mod 3 == 0 goto endpoint-X",
        "ip saddr 10.180.0.1 jump mark-for-masquerade",
        "ip saddr 10.180.0.0/24 jump mark-for-masquerade comment \"pod to a pod on this node's bridge\"",
        "update @affinity-X { ip saddr }",
        "meta l4proto sctp dnat to 10.180.0.1:8080",
    ];
    for rule in rules {
        encode(&format!("add rule ip kube-proxy c {rule}"), 1)
            .unwrap_or_else(|err| panic!("{rule}: {err}"));
    }
    let msgs = encode_one("add rule ip kube-proxy c meta l4proto tcp dnat to 10.180.1.1:8080");
    let exprs = expressions(&msgs[1].3);
    let names: Vec<&str> = exprs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["meta", "cmp", "immediate", "immediate", "nat"]);
    assert_eq!(exprs[2].1[1].1, attrs_of_value(&[10, 180, 1, 1]));
    assert_eq!(exprs[3].1[1].1, attrs_of_value(&[0x1f, 0x90]));
}

#[test]
fn lines_outside_the_service_forms_are_left_to_nft() {
    let lines = [
        "add table ip kube-proxy",
        "delete table ip kube-proxy",
        "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }",
        "add rule ip kube-proxy firewall-X ip saddr != { 192.0.2.0/24 } drop",
        "add rule ip kube-proxy service-X numgen random mod 2 vmap { 0 : goto a, 1 : goto b }",
        "add rule ip kube-proxy masquerading masquerade fully-random",
        "add rule ip kube-proxy x ip saddr != @affinity-X goto y",
        "add rule ip kube-proxy x meta l4proto icmp dnat to 10.0.0.1:1",
        "add rule ip kube-proxy x dnat to 10.0.0.1",
        "add set ip kube-proxy nodeport-ips { type ipv4_addr ; comment \"x\" ; }",
        "add element ip kube-proxy nodeport-ips { 10.0.0.1 }",
        "add element ip kube-proxy service-ips { 10.0.0.1 . tcp . 80 }",
        "add element ip kube-proxy cluster-ips { 10.0.0.1 : drop }",
        "delete element ip kube-proxy service-ips { 10.0.0.1 . tcp . 80 : drop }",
        "add element ip other service-ips { 10.0.0.1 . tcp . 80 : drop }",
        "add rule ip kube-proxy c goto",
    ];
    for line in lines {
        let script = format!("add chain ip kube-proxy ok\n{line}\n");
        assert_eq!(
            encode(&script, 1),
            Err(EncodeError::Unsupported {
                line: 2,
                text: line.to_string()
            }),
            "{line}"
        );
    }
}

#[test]
fn comments_up_to_nfts_limit_are_encoded() {
    let line = |comment: &str| {
        format!(
            "add element ip kube-proxy no-endpoint-services {{ 172.30.9.9 . tcp . 80 comment \"{comment}\" : goto reject-chain }}"
        )
    };
    let longest = "c".repeat(MAX_COMMENT_LENGTH);
    let msgs = encode_one(&line(&longest));
    let elem = attrs(&attrs(&msgs[1].3[2].1)[0].1);
    let udata = &elem[2].1;
    assert_eq!(
        usize::from(udata[1]),
        MAX_COMMENT_LENGTH + 1,
        "the comment and its NUL"
    );
    assert_eq!(&udata[2..2 + MAX_COMMENT_LENGTH], longest.as_bytes());
    assert!(matches!(
        encode(&line(&"c".repeat(MAX_COMMENT_LENGTH + 1)), 1),
        Err(EncodeError::Unsupported { .. })
    ));
}

#[test]
fn map_elements_carry_key_verdict_and_comment() {
    let msgs = encode_one(
        "add element ip kube-proxy no-endpoint-services { 172.30.9.9 . tcp . 80 comment \"ns/x:http\" : goto reject-chain }",
    );
    let (kind, _, _, list) = &msgs[1];
    assert_eq!(*kind, 0x0a00 | NFT_MSG_NEWSETELEM);
    assert_eq!(
        list[1],
        (NFTA_SET_ELEM_LIST_SET, b"no-endpoint-services\0".to_vec())
    );
    let elems = attrs(&list[2].1);
    let elem = attrs(&elems[0].1);
    assert_eq!(
        elem[0].1,
        attrs_of_value(&[172, 30, 9, 9, 6, 0, 0, 0, 0, 80, 0, 0])
    );
    let verdict = attrs(&attrs(&elem[1].1)[0].1);
    assert_eq!(verdict[0].1, NFT_GOTO.to_be_bytes());
    assert_eq!(verdict[1].1, b"reject-chain\0".to_vec());
    assert_eq!(elem[2].0, NFTA_SET_ELEM_USERDATA);
    assert_eq!(&elem[2].1[..12], b"\0\x0ans/x:http\0");

    let msgs = encode_one("delete element ip kube-proxy service-nodeports { udp . 30082 }");
    assert_eq!(msgs[1].0, 0x0a00 | NFT_MSG_DELSETELEM);
    let elem = attrs(&attrs(&msgs[1].3[2].1)[0].1);
    assert_eq!(
        elem,
        vec![(
            NFTA_SET_ELEM_KEY,
            attrs_of_value(&[17, 0, 0, 0, 0x75, 0x82, 0, 0])
        )]
    );

    let msgs = encode_one("add element ip kube-proxy cluster-ips { 172.30.0.41 }");
    let elem = attrs(&attrs(&msgs[1].3[2].1)[0].1);
    assert_eq!(
        elem,
        vec![(NFTA_SET_ELEM_KEY, attrs_of_value(&[172, 30, 0, 41]))]
    );
}

#[test]
fn affinity_sets_are_created_and_referred_to_by_id() {
    let script = "add set ip kube-proxy affinity-X { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }\n\
                  add rule ip kube-proxy endpoint-X update @affinity-X { ip saddr }\n\
                  add rule ip kube-proxy service-X ip saddr @affinity-X goto endpoint-X\n\
                  add rule ip kube-proxy service-X ip saddr @affinity-Y goto endpoint-Y\n\
                  delete set ip kube-proxy affinity-Z\n";
    let batch = encode(script, 1).expect("encodes");
    let msgs = messages(&batch);
    let set = &msgs[1].3;
    assert_eq!(msgs[1].0, 0x0a00 | NFT_MSG_NEWSET);
    assert_eq!(set[2], (NFTA_SET_FLAGS, 0x30u32.to_be_bytes().to_vec()));
    assert_eq!(set[3], (NFTA_SET_KEY_TYPE, 7u32.to_be_bytes().to_vec()));
    assert_eq!(set[5], (NFTA_SET_ID, 1u32.to_be_bytes().to_vec()));
    assert_eq!(
        set[6],
        (NFTA_SET_TIMEOUT, 10_800_000u64.to_be_bytes().to_vec())
    );
    assert_eq!(set[7].1[..6], [0, 4, 2, 0, 0, 0]);
    let dynset = &expressions(&msgs[2].3)[1];
    assert_eq!(dynset.0, "dynset");
    assert!(
        dynset.1.contains(&(2, 1u32.to_be_bytes().to_vec())),
        "set id"
    );
    let lookup = &expressions(&msgs[3].3)[1];
    assert!(
        lookup.1.contains(&(4, 1u32.to_be_bytes().to_vec())),
        "set id"
    );
    // A set of an earlier transaction goes by name alone.
    let lookup = &expressions(&msgs[4].3)[1];
    assert_eq!(lookup.1.len(), 2, "{lookup:?}");
    assert_eq!(msgs[5].0, 0x0a00 | NFT_MSG_DELSET);
}

/// The renderer's own partial syncs encode whole (goldens of incremental changes).
#[test]
fn incremental_goldens_encode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
    for name in [
        "incremental_affinity_timeout",
        "incremental_endpoint_added",
        "incremental_endpoint_removed",
        "incremental_endpoints_arrive",
        "incremental_service_added",
        "incremental_service_deleted",
    ] {
        let script = std::fs::read_to_string(dir.join(format!("{name}.nft"))).expect("golden");
        encode(&script, 1).unwrap_or_else(|err| panic!("{name}: {err}"));
    }
}
