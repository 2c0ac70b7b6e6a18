//! A `NETLINK_NETFILTER` socket that commits [`crate::batch`] transactions to nf_tables: one
//! batch is one atomic transaction, as with `nft -f`.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, sockopt};

use crate::batch::{self, Batch, EncodeError};

const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// How long a reply may take (the kernel answers within the `sendto`; this bounds a lost one).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Errors of the netlink path.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket could not be opened or used.
    #[error("nf_tables netlink socket: {context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The script has a line the encoder does not know.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The kernel refused the transaction (nothing of it was applied).
    #[error("nf_tables refused the transaction ({source}) at: {line}")]
    Refused {
        /// The script line of the refused message (the batch for a failed commit).
        line: String,
        /// The kernel's errno.
        #[source]
        source: std::io::Error,
    },
    /// A reply that is not a netlink message.
    #[error("malformed netlink reply")]
    Malformed,
}

fn io(context: &'static str) -> impl FnOnce(rustix::io::Errno) -> NetlinkError {
    move |errno| NetlinkError::Io {
        context,
        source: errno.into(),
    }
}

/// A socket to nf_tables of the network namespace it was opened in.
#[derive(Debug)]
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
}

impl Netlink {
    /// Opens a socket in this thread's network namespace.
    pub fn open() -> Result<Self, NetlinkError> {
        let fd = rustix::net::socket(
            AddressFamily::NETLINK,
            SocketType::RAW,
            Some(netlink::NETFILTER),
        )
        .map_err(io("socket"))?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, 0)).map_err(io("bind"))?;
        sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(REPLY_TIMEOUT))
            .map_err(io("receive timeout"))?;
        Ok(Self { fd, seq: 1 })
    }

    /// Opens a socket in the network namespace bound at `netns` (`/run/netns/NAME`): a
    /// short-lived thread enters it, and the socket stays there for its whole life.
    pub fn open_in(netns: &Path) -> Result<Self, NetlinkError> {
        let file = std::fs::File::open(netns).map_err(|source| NetlinkError::Io {
            context: "open network namespace",
            source,
        })?;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    rustix::thread::move_into_link_name_space(
                        file.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .map_err(io("setns"))?;
                    Self::open()
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(NetlinkError::Io {
                        context: "setns thread",
                        source: std::io::Error::other("panicked"),
                    })
                })
        })
    }

    /// Encodes `script` and commits it as one transaction. [`NetlinkError::Encode`] means
    /// nothing was sent.
    pub fn apply(&mut self, script: &str) -> Result<(), NetlinkError> {
        let batch = batch::encode(script, self.seq)?;
        self.commit(&batch)
    }

    fn commit(&mut self, batch: &Batch) -> Result<(), NetlinkError> {
        // The kernel takes a batch only whole, in one message: make room for large ones.
        let needed = batch.bytes.len() + 4096;
        if sockopt::socket_send_buffer_size(&self.fd).map_err(io("send buffer"))? < needed {
            sockopt::set_socket_send_buffer_size_force(&self.fd, needed)
                .map_err(io("send buffer"))?;
        }
        let kernel = SocketAddrNetlink::new(0, 0);
        rustix::net::sendto(&self.fd, &batch.bytes, SendFlags::empty(), &kernel)
            .map_err(io("send batch"))?;
        // The batch is processed inside that sendto, so its errors are queued already; the
        // generation request's answer comes after them and ends the reading.
        let barrier = batch.next_seq;
        self.seq = barrier.wrapping_add(1);
        rustix::net::sendto(&self.fd, &getgen(barrier), SendFlags::empty(), &kernel)
            .map_err(io("send generation request"))?;
        let mut first_error: Option<NetlinkError> = None;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let (len, _) = rustix::net::recv(&self.fd, &mut buf[..], RecvFlags::empty())
                .map_err(io("receive"))?;
            let replies = replies(&buf[..len.min(buf.len())])?;
            if settle(batch, &replies, &mut first_error) {
                return first_error.map_or(Ok(()), Err);
            }
        }
    }
}

/// Takes one datagram's replies into the batch's outcome (its first error); true once the
/// generation request sent after the batch (`batch.next_seq`) has been answered.
fn settle(batch: &Batch, replies: &[Reply], first_error: &mut Option<NetlinkError>) -> bool {
    let barrier = batch.next_seq;
    for reply in replies {
        // Answers to an earlier, abandoned exchange are not this batch's.
        if reply.seq.wrapping_sub(batch.first_seq) > barrier.wrapping_sub(batch.first_seq) {
            continue;
        }
        if let Some(errno) = reply.errno
            && errno != 0
            && first_error.is_none()
        {
            *first_error = Some(refused(&batch.lines, reply.seq, errno));
        }
        if reply.seq == barrier {
            return true;
        }
    }
    false
}

fn refused(lines: &BTreeMap<u32, String>, seq: u32, errno: i32) -> NetlinkError {
    NetlinkError::Refused {
        line: lines
            .get(&seq)
            .cloned()
            .unwrap_or_else(|| "(commit of the batch)".to_string()),
        source: std::io::Error::from_raw_os_error(errno.saturating_neg()),
    }
}

/// `NFT_MSG_GETGEN`: answered by one `NFT_MSG_NEWGEN` message.
fn getgen(seq: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(20);
    out.extend_from_slice(&20u32.to_ne_bytes());
    out.extend_from_slice(&((10u16 << 8) | batch::NFT_MSG_GETGEN).to_ne_bytes());
    out.extend_from_slice(&1u16.to_ne_bytes()); // NLM_F_REQUEST
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // nfgenmsg: AF_UNSPEC, version 0, res_id 0
    out
}

/// One reply: its sequence number and, for `NLMSG_ERROR`, the (negative) errno.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    seq: u32,
    errno: Option<i32>,
}

fn replies(mut data: &[u8]) -> Result<Vec<Reply>, NetlinkError> {
    let mut out = Vec::new();
    while data.len() >= NLMSG_HDRLEN {
        let u32_at = |at: usize| -> Result<u32, NetlinkError> {
            data.get(at..at + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_ne_bytes)
                .ok_or(NetlinkError::Malformed)
        };
        let len = u32_at(0)? as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if len < NLMSG_HDRLEN || len > data.len() {
            return Err(NetlinkError::Malformed);
        }
        let errno = if kind == NLMSG_ERROR {
            Some(u32_at(NLMSG_HDRLEN)? as i32)
        } else {
            None
        };
        // An error names the refused message by the sequence number of its own header
        // (which it echoes after the errno), as does its header.
        out.push(Reply {
            seq: u32_at(8)?,
            errno,
        });
        data = &data[(len + 3) & !3..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&0u16.to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn replies_carry_errors_and_the_barrier() {
        let mut data = message(NLMSG_ERROR, 7, &(-2i32).to_ne_bytes());
        data.extend(message(NLMSG_ERROR, 8, &0i32.to_ne_bytes()));
        data.extend(message(0x0a0f, 9, &[0; 4]));
        assert_eq!(
            replies(&data).expect("well formed"),
            vec![
                Reply {
                    seq: 7,
                    errno: Some(-2)
                },
                Reply {
                    seq: 8,
                    errno: Some(0)
                },
                Reply {
                    seq: 9,
                    errno: None
                },
            ]
        );
        assert!(matches!(replies(&data[..18]), Err(NetlinkError::Malformed)));
    }

    #[test]
    fn the_outcome_is_the_batchs_first_error_once_the_barrier_answers() {
        let batch = crate::batch::encode(
            "add chain ip kube-proxy a\nadd rule ip kube-proxy a goto b\n",
            10,
        )
        .expect("encodes");
        assert_eq!((batch.first_seq, batch.next_seq), (10, 14));
        let reply = |seq, errno| Reply { seq, errno };
        let mut first_error = None;
        // A stale error of an earlier exchange, then this batch's refused rule.
        assert!(!settle(
            &batch,
            &[reply(7, Some(-22)), reply(12, Some(-2))],
            &mut first_error
        ));
        assert!(settle(
            &batch,
            &[reply(13, Some(-22)), reply(14, None)],
            &mut first_error
        ));
        let err = first_error.expect("refused").to_string();
        assert!(
            err.ends_with("at: add rule ip kube-proxy a goto b"),
            "{err}"
        );
        let mut clean = None;
        assert!(settle(&batch, &[reply(14, None)], &mut clean));
        assert!(clean.is_none());
    }

    #[test]
    fn a_refusal_names_the_line() {
        let lines = BTreeMap::from([(3, "add rule ip kube-proxy x goto y".to_string())]);
        let err = refused(&lines, 3, -2);
        assert_eq!(
            err.to_string(),
            "nf_tables refused the transaction (No such file or directory (os error 2)) at: add rule ip kube-proxy x goto y"
        );
        let err = refused(&lines, 1, -22);
        assert!(err.to_string().contains("(commit of the batch)"), "{err}");
    }

    #[test]
    fn the_generation_request_is_a_bare_nftables_message() {
        let request = getgen(42);
        assert_eq!(request.len(), 20);
        assert_eq!(u16::from_ne_bytes([request[4], request[5]]), 0x0a10);
        assert_eq!(
            u32::from_ne_bytes([request[8], request[9], request[10], request[11]]),
            42
        );
    }
}
