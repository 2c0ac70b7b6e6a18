//! The sans-IO nf_tables batch encoder: a partial-sync script as the renderer writes it → one
//! nfnetlink batch (the messages `nft -f` would send for it, without nft's cache fetch).
//!
//! nft 1.0.6 dumps every chain and set of the network namespace before each transaction that
//! adds a rule or an element (tens of thousands of chains at 10 000 Services: most of a
//! change's time). The kernel resolves chains and sets by name itself, so the batch needs no
//! cache. Only the forms the renderer writes for Services are encoded; any other line (the
//! base table, anonymous sets of `loadBalancerSourceRanges`, `numgen … vmap`) is
//! [`EncodeError::Unsupported`] and the caller applies the script with `nft -f` instead.
//! The bytecode is nft's own for the same text (`nft --debug=netlink`), so `nft list` shows
//! the same ruleset either way (tested against real nftables in `tests/nft.rs`).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::model::Cidr;
use crate::render::{Container, MAX_COMMENT_LENGTH, is_proxy_table};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFPROTO_IPV4: u8 = 2;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

/// nf_tables message kinds (`enum nf_tables_msg_types`).
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
/// The generation request the socket sends after a batch (its answer ends the replies).
pub(crate) const NFT_MSG_GETGEN: u16 = 16;

/// `NFTA_CHAIN_TABLE`, `NFTA_RULE_TABLE`, `NFTA_SET_TABLE`, `NFTA_SET_ELEM_LIST_TABLE`.
const NFTA_TABLE_OF_OBJECT: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;

const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_SET_EVAL: u32 = 0x20;
/// nft's datatype number of `ipv4_addr` (`TYPE_IPADDR`).
const TYPE_IPADDR: u32 = 7;
/// libnftnl's user-data TLV kinds: the key byte order of a set, the comment of a rule or an
/// element (both 0).
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_COMMENT: u8 = 0;
const BYTEORDER_BIG_ENDIAN: u32 = 2;

const NFT_REG_VERDICT: u32 = 0;
const NFT_REG_1: u32 = 1;
const NFT_REG_2: u32 = 2;
const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFT_CMP_EQ: u32 = 0;
const NFT_CMP_NEQ: u32 = 1;
const NFT_META_L4PROTO: u32 = 16;
const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;
const NFTA_FIB_F_SADDR: u32 = 1;
/// `RTN_LOCAL`: the address type `fib … type local` compares with.
const RTN_LOCAL: u32 = 2;
const NFT_NG_RANDOM: u32 = 1;
const NFT_DYNSET_OP_UPDATE: u32 = 1;
const NFT_NAT_DNAT: u32 = 1;
const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 2;

const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

/// Why a script cannot go through the encoder (the caller then runs `nft -f`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A line whose form the encoder does not know.
    #[error("line {line} is not a form the netlink encoder knows: {text}")]
    Unsupported {
        /// Its number, from 1.
        line: usize,
        /// The line.
        text: String,
    },
}

/// One encoded transaction: the batch's bytes and, per message, the script line it came from
/// (for the kernel's errors, which name a message by sequence number).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `BATCH_BEGIN`, the messages, `BATCH_END`.
    pub bytes: Vec<u8>,
    /// The script line of each message's sequence number.
    pub lines: BTreeMap<u32, String>,
    /// The sequence number of `BATCH_BEGIN` (a failed commit is answered with it).
    pub first_seq: u32,
    /// The sequence number after the batch's last one.
    pub next_seq: u32,
}

/// Encodes `script` (the renderer's partial-sync lines) as one batch whose messages are
/// numbered from `first_seq`.
pub fn encode(script: &str, first_seq: u32) -> Result<Batch, EncodeError> {
    let mut out = Encoder {
        bytes: Vec::with_capacity(script.len()),
        lines: BTreeMap::new(),
        seq: first_seq,
        set_ids: BTreeMap::new(),
    };
    out.message(NFNL_MSG_BATCH_BEGIN, 0, 0, |_| {});
    for (index, line) in script.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let unsupported = || EncodeError::Unsupported {
            line: index + 1,
            text: line.to_string(),
        };
        let seq = out.seq;
        out.command(line).ok_or_else(unsupported)?;
        out.lines.insert(seq, line.to_string());
    }
    out.message(NFNL_MSG_BATCH_END, 0, 0, |_| {});
    Ok(Batch {
        bytes: out.bytes,
        lines: out.lines,
        first_seq,
        next_seq: out.seq,
    })
}

/// A netlink message or nested attribute under construction.
struct Attrs<'a> {
    buf: &'a mut Vec<u8>,
}

impl Attrs<'_> {
    fn put(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        pad(self.buf);
    }

    fn string(&mut self, kind: u16, value: &str) {
        let mut bytes = Vec::with_capacity(value.len() + 1);
        bytes.extend_from_slice(value.as_bytes());
        bytes.push(0);
        self.put(kind, &bytes);
    }

    fn u32(&mut self, kind: u16, value: u32) {
        self.put(kind, &value.to_be_bytes());
    }

    fn nested(&mut self, kind: u16, fill: impl FnOnce(&mut Attrs<'_>)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        fill(&mut Attrs { buf: self.buf });
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    }

    /// One expression of a rule's list.
    fn expr(&mut self, name: &str, fill: impl FnOnce(&mut Attrs<'_>)) {
        self.nested(NFTA_LIST_ELEM, |elem| {
            elem.string(NFTA_EXPR_NAME, name);
            elem.nested(NFTA_EXPR_DATA, fill);
        });
    }
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// libnftnl's user data: one TLV holding a NUL-terminated comment.
fn comment_udata(comment: &str) -> Vec<u8> {
    let mut out = vec![UDATA_COMMENT, (comment.len() + 1) as u8];
    out.extend_from_slice(comment.as_bytes());
    out.push(0);
    out
}

/// The ids of the sets a batch creates, by table and name.
type SetIds = BTreeMap<(String, String), u32>;

struct Encoder {
    bytes: Vec<u8>,
    lines: BTreeMap<u32, String>,
    seq: u32,
    /// Sets created by this batch, by table and name: rules refer to them by name and this id.
    set_ids: SetIds,
}

impl Encoder {
    /// Appends one message (`nlmsghdr` + `nfgenmsg` + attributes).
    fn message(&mut self, kind: u16, flags: u16, family: u8, fill: impl FnOnce(&mut Attrs<'_>)) {
        let start = self.bytes.len();
        let batch = kind == NFNL_MSG_BATCH_BEGIN || kind == NFNL_MSG_BATCH_END;
        let msg_type = if batch {
            kind
        } else {
            (NFNL_SUBSYS_NFTABLES << 8) | kind
        };
        self.bytes.extend_from_slice(&[0; 4]);
        self.bytes.extend_from_slice(&msg_type.to_ne_bytes());
        self.bytes
            .extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        self.bytes.extend_from_slice(&self.seq.to_ne_bytes());
        self.bytes.extend_from_slice(&0u32.to_ne_bytes());
        // nfgenmsg: family, version 0, resource id (the subsystem, for the batch messages).
        let res_id: u16 = if batch { NFNL_SUBSYS_NFTABLES } else { 0 };
        self.bytes.push(family);
        self.bytes.push(0);
        self.bytes.extend_from_slice(&res_id.to_be_bytes());
        fill(&mut Attrs {
            buf: &mut self.bytes,
        });
        let len = (self.bytes.len() - start) as u32;
        self.bytes[start..start + 4].copy_from_slice(&len.to_ne_bytes());
        self.seq = self.seq.wrapping_add(1);
    }

    fn table_message(&mut self, kind: u16, flags: u16, fill: impl FnOnce(&mut Attrs<'_>)) {
        self.message(kind, flags, NFPROTO_IPV4, fill);
    }

    /// Encodes one script line; `None` when its form is unknown.
    fn command(&mut self, line: &str) -> Option<()> {
        let (verb, table, rest) = [
            "add chain",
            "flush chain",
            "delete chain",
            "add set",
            "delete set",
        ]
        .into_iter()
        .chain(["add rule", "add element", "delete element"])
        .find_map(|verb| {
            let (table, rest) = line
                .strip_prefix(verb)?
                .strip_prefix(" ip ")?
                .split_once(' ')?;
            Some((verb, table, rest))
        })?;
        if !is_proxy_table(table) {
            return None;
        }
        // Commands naming one object: message, flags, the attribute of its name (the table
        // is attribute 1 of each).
        let named = match verb {
            "add chain" => Some((NFT_MSG_NEWCHAIN, NLM_F_CREATE, NFTA_CHAIN_NAME)),
            "flush chain" => Some((NFT_MSG_DELRULE, 0, NFTA_RULE_CHAIN)),
            "delete chain" => Some((NFT_MSG_DELCHAIN, 0, NFTA_CHAIN_NAME)),
            "delete set" => Some((NFT_MSG_DELSET, 0, NFTA_SET_NAME)),
            _ => None,
        };
        if let Some((kind, flags, name_attr)) = named {
            let name = single_word(rest)?;
            self.table_message(kind, flags, |m| {
                m.string(NFTA_TABLE_OF_OBJECT, table);
                m.string(name_attr, name);
            });
            return Some(());
        }
        match verb {
            "add set" => self.add_affinity_set(table, rest)?,
            "add rule" => self.add_rule(table, rest)?,
            "add element" => self.element(table, rest, true)?,
            _ => self.element(table, rest, false)?,
        }
        Some(())
    }

    /// `NAME { type ipv4_addr ; flags dynamic,timeout ; timeout Ns ; }`: the affinity sets.
    fn add_affinity_set(&mut self, table: &str, rest: &str) -> Option<()> {
        let (name, spec) = rest.split_once(' ')?;
        let seconds: u64 = spec
            .strip_prefix("{ type ipv4_addr ; flags dynamic,timeout ; timeout ")?
            .strip_suffix("s ; }")?
            .parse()
            .ok()?;
        let id = self.set_ids.len() as u32 + 1;
        self.set_ids
            .insert((table.to_string(), name.to_string()), id);
        let mut udata = vec![UDATA_SET_KEYBYTEORDER, 4];
        udata.extend_from_slice(&BYTEORDER_BIG_ENDIAN.to_ne_bytes());
        self.table_message(NFT_MSG_NEWSET, NLM_F_CREATE, |m| {
            m.string(NFTA_TABLE_OF_OBJECT, table);
            m.string(NFTA_SET_NAME, name);
            m.u32(NFTA_SET_FLAGS, NFT_SET_TIMEOUT | NFT_SET_EVAL);
            m.u32(NFTA_SET_KEY_TYPE, TYPE_IPADDR);
            m.u32(NFTA_SET_KEY_LEN, 4);
            m.u32(NFTA_SET_ID, id);
            m.put(
                NFTA_SET_TIMEOUT,
                &seconds.saturating_mul(1000).to_be_bytes(),
            );
            m.put(NFTA_SET_USERDATA, &udata);
        });
        Some(())
    }

    fn add_rule(&mut self, table: &str, rest: &str) -> Option<()> {
        let (chain, rule) = rest.split_once(' ')?;
        let (body, comment) = split_comment(rule)?;
        let exprs = parse_rule(body)?;
        let set_ids = std::mem::take(&mut self.set_ids);
        self.table_message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, |m| {
            m.string(NFTA_TABLE_OF_OBJECT, table);
            m.string(NFTA_RULE_CHAIN, chain);
            m.nested(NFTA_RULE_EXPRESSIONS, |list| {
                for expr in &exprs {
                    expr.encode(list, table, &set_ids);
                }
            });
            if let Some(comment) = comment {
                m.put(NFTA_RULE_USERDATA, &comment_udata(comment));
            }
        });
        self.set_ids = set_ids;
        Some(())
    }

    /// `CONTAINER { KEY [comment "C"] [: VERDICT] }` (add) or `CONTAINER { KEY }` (delete).
    fn element(&mut self, table: &str, rest: &str, add: bool) -> Option<()> {
        let (set, body) = rest.split_once(' ')?;
        let container = [
            Container::ClusterIps,
            Container::ServiceIps,
            Container::ServiceNodePorts,
            Container::NoEndpointServices,
            Container::NoEndpointNodePorts,
            Container::FirewallIps,
        ]
        .into_iter()
        .find(|c| c.name() == set)?;
        let body = body.strip_prefix("{ ")?.strip_suffix(" }")?;
        let (element, verdict) = match body.split_once(" : ") {
            Some((element, verdict)) => (element, Some(parse_verdict(verdict)?)),
            None => (body, None),
        };
        let (key_text, comment) = split_comment(element)?;
        let key = encode_key(container, key_text)?;
        let is_map = container != Container::ClusterIps;
        let well_formed = if add {
            is_map == verdict.is_some()
        } else {
            verdict.is_none() && comment.is_none()
        };
        if !well_formed {
            return None;
        }
        let (kind, flags) = if add {
            (NFT_MSG_NEWSETELEM, NLM_F_CREATE)
        } else {
            (NFT_MSG_DELSETELEM, 0)
        };
        self.table_message(kind, flags, |m| {
            m.string(NFTA_TABLE_OF_OBJECT, table);
            m.string(NFTA_SET_ELEM_LIST_SET, set);
            m.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |list| {
                list.nested(NFTA_LIST_ELEM, |elem| {
                    elem.nested(NFTA_SET_ELEM_KEY, |k| k.put(NFTA_DATA_VALUE, &key));
                    if let Some(verdict) = &verdict {
                        elem.nested(NFTA_SET_ELEM_DATA, |d| verdict.encode(d));
                    }
                    if let Some(comment) = comment {
                        elem.put(NFTA_SET_ELEM_USERDATA, &comment_udata(comment));
                    }
                });
            });
        });
        Some(())
    }
}

fn single_word(text: &str) -> Option<&str> {
    (!text.is_empty() && !text.contains(char::is_whitespace)).then_some(text)
}

/// Splits a trailing `comment "…"` off (the renderer's comments hold no quote and are no
/// longer than nft takes them).
fn split_comment(text: &str) -> Option<(&str, Option<&str>)> {
    match text.split_once(" comment \"") {
        None => Some((text, None)),
        Some((body, comment)) => {
            let comment = comment.strip_suffix('"')?;
            (!comment.contains('"') && comment.len() <= MAX_COMMENT_LENGTH)
                .then_some((body, Some(comment)))
        }
    }
}

/// A set element's key: the container's fields, each concatenated field padded to 4 bytes
/// (nft's layout of concatenations in registers).
fn encode_key(container: Container, text: &str) -> Option<Vec<u8>> {
    let fields: Vec<&str> = text.split(" . ").collect();
    let mut out = Vec::new();
    match (container, fields.as_slice()) {
        (Container::ClusterIps, [ip]) => {
            out.extend_from_slice(&ip.parse::<Ipv4Addr>().ok()?.octets())
        }
        (
            Container::ServiceIps | Container::NoEndpointServices | Container::FirewallIps,
            [ip, proto, port],
        ) => {
            out.extend_from_slice(&ip.parse::<Ipv4Addr>().ok()?.octets());
            out.extend_from_slice(&[l4proto(proto)?, 0, 0, 0]);
            out.extend_from_slice(&port.parse::<u16>().ok()?.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        }
        (Container::ServiceNodePorts | Container::NoEndpointNodePorts, [proto, port]) => {
            out.extend_from_slice(&[l4proto(proto)?, 0, 0, 0]);
            out.extend_from_slice(&port.parse::<u16>().ok()?.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
        }
        _ => return None,
    }
    Some(out)
}

fn l4proto(name: &str) -> Option<u8> {
    match name {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        _ => None,
    }
}

/// A verdict: `drop`, `accept`, `return`, `jump CHAIN`, `goto CHAIN`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict<'a> {
    code: i32,
    chain: Option<&'a str>,
}

impl Verdict<'_> {
    /// The `NFTA_DATA_VERDICT` of an immediate or a map element.
    fn encode(&self, data: &mut Attrs<'_>) {
        data.nested(NFTA_DATA_VERDICT, |v| {
            v.put(NFTA_VERDICT_CODE, &self.code.to_be_bytes());
            if let Some(chain) = self.chain {
                v.string(NFTA_VERDICT_CHAIN, chain);
            }
        });
    }
}

fn parse_verdict(text: &str) -> Option<Verdict<'_>> {
    verdict_words(&text.split(' ').collect::<Vec<_>>())
}

fn verdict_words<'a>(words: &[&'a str]) -> Option<Verdict<'a>> {
    match words {
        ["drop"] => Some(Verdict {
            code: NF_DROP,
            chain: None,
        }),
        ["accept"] => Some(Verdict {
            code: NF_ACCEPT,
            chain: None,
        }),
        ["return"] => Some(Verdict {
            code: NFT_RETURN,
            chain: None,
        }),
        ["jump", chain] => Some(Verdict {
            code: NFT_JUMP,
            chain: Some(chain),
        }),
        ["goto", chain] => Some(Verdict {
            code: NFT_GOTO,
            chain: Some(chain),
        }),
        _ => None,
    }
}

/// One nf_tables expression, as nft 1.0.6 emits it for our statements.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr<'a> {
    /// `payload load LEN @ BASE + OFFSET => reg 1`.
    Payload { base: u32, offset: u32, len: u32 },
    /// `bitwise reg 1 = (reg 1 & MASK) ^ 0`.
    Mask(Vec<u8>),
    /// `cmp OP reg 1 DATA`.
    Cmp { op: u32, data: Vec<u8> },
    /// `meta load l4proto => reg 1`.
    MetaL4Proto,
    /// `fib saddr type => reg 1`.
    FibSaddrType,
    /// `numgen reg 1 = random mod N`.
    Numgen(u32),
    /// `lookup reg 1 set NAME`.
    Lookup(&'a str),
    /// `dynset update reg_key 1 set NAME`.
    DynsetUpdate(&'a str),
    /// `immediate reg N DATA`.
    Value { reg: u32, data: Vec<u8> },
    /// `immediate reg 0 VERDICT`.
    Verdict(Verdict<'a>),
    /// `nat dnat ip addr_min reg 1 proto_min reg 2`.
    Dnat,
}

impl Expr<'_> {
    fn encode(&self, list: &mut Attrs<'_>, table: &str, set_ids: &SetIds) {
        let set_id = |set: &str| set_ids.get(&(table.to_string(), set.to_string())).copied();
        // Attribute numbers of each expression (`enum nft_*_attributes`).
        match self {
            Self::Payload { base, offset, len } => list.expr("payload", |e| {
                e.u32(1, NFT_REG_1); // DREG
                e.u32(2, *base);
                e.u32(3, *offset);
                e.u32(4, *len);
            }),
            Self::Mask(mask) => list.expr("bitwise", |e| {
                e.u32(1, NFT_REG_1); // SREG
                e.u32(2, NFT_REG_1); // DREG
                e.u32(3, mask.len() as u32);
                e.nested(4, |d| d.put(NFTA_DATA_VALUE, mask));
                e.nested(5, |d| d.put(NFTA_DATA_VALUE, &vec![0; mask.len()]));
            }),
            Self::Cmp { op, data } => list.expr("cmp", |e| {
                e.u32(1, NFT_REG_1); // SREG
                e.u32(2, *op);
                e.nested(3, |d| d.put(NFTA_DATA_VALUE, data));
            }),
            Self::MetaL4Proto => list.expr("meta", |e| {
                e.u32(2, NFT_META_L4PROTO); // KEY
                e.u32(1, NFT_REG_1); // DREG
            }),
            Self::FibSaddrType => list.expr("fib", |e| {
                e.u32(1, NFT_REG_1); // DREG
                e.u32(2, NFT_FIB_RESULT_ADDRTYPE);
                e.u32(3, NFTA_FIB_F_SADDR);
            }),
            Self::Numgen(modulus) => list.expr("numgen", |e| {
                e.u32(1, NFT_REG_1); // DREG
                e.u32(2, *modulus);
                e.u32(3, NFT_NG_RANDOM);
                e.u32(4, 0); // OFFSET
            }),
            Self::Lookup(set) => list.expr("lookup", |e| {
                e.string(1, set); // SET
                e.u32(2, NFT_REG_1); // SREG
                if let Some(id) = set_id(set) {
                    e.u32(4, id); // SET_ID
                }
            }),
            Self::DynsetUpdate(set) => list.expr("dynset", |e| {
                e.u32(4, NFT_REG_1); // SREG_KEY
                e.u32(3, NFT_DYNSET_OP_UPDATE);
                e.string(1, set); // SET_NAME
                if let Some(id) = set_id(set) {
                    e.u32(2, id); // SET_ID
                }
            }),
            Self::Value { reg, data } => list.expr("immediate", |e| {
                e.u32(1, *reg); // DREG
                e.nested(2, |d| d.put(NFTA_DATA_VALUE, data));
            }),
            Self::Verdict(verdict) => list.expr("immediate", |e| {
                e.u32(1, NFT_REG_VERDICT); // DREG
                e.nested(2, |d| verdict.encode(d));
            }),
            Self::Dnat => list.expr("nat", |e| {
                e.u32(1, NFT_NAT_DNAT); // TYPE
                e.u32(2, u32::from(NFPROTO_IPV4)); // FAMILY
                e.u32(3, NFT_REG_1); // REG_ADDR_MIN
                e.u32(5, NFT_REG_2); // REG_PROTO_MIN
                e.u32(7, NF_NAT_RANGE_PROTO_SPECIFIED); // FLAGS
            }),
        }
    }
}

/// An IPv4 address match on `ip saddr` / `ip daddr`, as nft linearizes it: a byte-aligned
/// prefix loads only its bytes; any other prefix loads the address and masks it.
fn address_match(offset: u32, op: u32, cidr: Cidr, out: &mut Vec<Expr<'_>>) {
    let octets = cidr.addr.octets();
    let prefix = u32::from(cidr.prefix.min(32));
    if prefix > 0 && prefix.is_multiple_of(8) {
        let len = prefix / 8;
        out.push(Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
        });
        out.push(Expr::Cmp {
            op,
            data: octets[..len as usize].to_vec(),
        });
    } else {
        let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
        out.push(Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len: 4,
        });
        out.push(Expr::Mask(mask.to_be_bytes().to_vec()));
        let network = u32::from(cidr.addr) & mask;
        out.push(Expr::Cmp {
            op,
            data: network.to_be_bytes().to_vec(),
        });
    }
}

/// Parses a rule body of the renderer's Service chains into nft's expressions.
fn parse_rule(body: &str) -> Option<Vec<Expr<'_>>> {
    let words: Vec<&str> = body.split(' ').collect();
    let mut out = Vec::new();
    let mut rest = words.as_slice();
    loop {
        match rest {
            [] => return (!out.is_empty()).then_some(out),
            ["ip", field @ ("saddr" | "daddr"), tail @ ..] => {
                let offset = if *field == "saddr" { 12 } else { 16 };
                let (op, tail) = match tail {
                    ["!=", tail @ ..] => (NFT_CMP_NEQ, tail),
                    _ => (NFT_CMP_EQ, tail),
                };
                let [value, tail @ ..] = tail else {
                    return None;
                };
                if let Some(set) = value.strip_prefix('@') {
                    if op != NFT_CMP_EQ {
                        return None;
                    }
                    out.push(Expr::Payload {
                        base: NFT_PAYLOAD_NETWORK_HEADER,
                        offset,
                        len: 4,
                    });
                    out.push(Expr::Lookup(set));
                } else {
                    let cidr = match value.parse::<Ipv4Addr>() {
                        Ok(addr) => Cidr { addr, prefix: 32 },
                        Err(_) => value.parse::<Cidr>().ok()?,
                    };
                    address_match(offset, op, cidr, &mut out);
                }
                rest = tail;
            }
            [proto @ ("tcp" | "udp" | "sctp"), "dport", port, tail @ ..] => {
                out.push(Expr::MetaL4Proto);
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: vec![l4proto(proto)?],
                });
                out.push(Expr::Payload {
                    base: NFT_PAYLOAD_TRANSPORT_HEADER,
                    offset: 2,
                    len: 2,
                });
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: port.parse::<u16>().ok()?.to_be_bytes().to_vec(),
                });
                rest = tail;
            }
            ["meta", "l4proto", proto, tail @ ..] => {
                out.push(Expr::MetaL4Proto);
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: vec![l4proto(proto)?],
                });
                rest = tail;
            }
            ["fib", "saddr", "type", "local", tail @ ..] => {
                out.push(Expr::FibSaddrType);
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: RTN_LOCAL.to_ne_bytes().to_vec(),
                });
                rest = tail;
            }
            ["numgen", "random", "mod", modulus, "==", value, tail @ ..] => {
                let modulus: u32 = modulus.parse().ok()?;
                let value: u32 = value.parse().ok()?;
                out.push(Expr::Numgen(modulus));
                out.push(Expr::Cmp {
                    op: NFT_CMP_EQ,
                    data: value.to_ne_bytes().to_vec(),
                });
                rest = tail;
            }
            ["update", set, "{", "ip", "saddr", "}"] => {
                out.push(Expr::Payload {
                    base: NFT_PAYLOAD_NETWORK_HEADER,
                    offset: 12,
                    len: 4,
                });
                out.push(Expr::DynsetUpdate(set.strip_prefix('@')?));
                rest = &[];
            }
            ["dnat", "to", target] => {
                let (ip, port) = target.split_once(':')?;
                out.push(Expr::Value {
                    reg: NFT_REG_1,
                    data: ip.parse::<Ipv4Addr>().ok()?.octets().to_vec(),
                });
                out.push(Expr::Value {
                    reg: NFT_REG_2,
                    data: port.parse::<u16>().ok()?.to_be_bytes().to_vec(),
                });
                out.push(Expr::Dnat);
                rest = &[];
            }
            _ => {
                out.push(Expr::Verdict(verdict_words(rest)?));
                return Some(out);
            }
        }
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
