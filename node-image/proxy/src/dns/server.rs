//! The cluster DNS responder on the node (as NodeLocal DNSCache runs beside kube-proxy): UDP and
//! TCP on the cluster DNS address, answering the cluster's names from [`ClusterDns`] and
//! forwarding every other name to the node's own resolvers. A packet that does not parse gets
//! FORMERR when its id can be read (and nothing otherwise), an opcode other than QUERY gets
//! NOTIMP, an upstream that does not answer SERVFAIL; no input stops the responder.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::records::{Answer, ClusterDns};

/// How long an upstream resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest UDP answer without EDNS (RFC 1035).
const CLASSIC_UDP_PAYLOAD: usize = 512;
/// The largest DNS message.
const MAX_MESSAGE: usize = 65_535;
/// How long a TCP client may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// What to do with one request.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// Send these bytes back.
    Answer(Vec<u8>),
    /// Ask the upstream resolvers, answering SERVFAIL if none does.
    Upstream {
        /// The request's id, for that SERVFAIL.
        id: u16,
    },
    /// Say nothing (a packet without even an id, or a response).
    Drop,
}

/// The reply to one request; over UDP (`udp`) an answer larger than 512 bytes, or the client's
/// EDNS size, is sent truncated so that the client asks again over TCP.
pub fn respond(dns: &ClusterDns, request: &[u8], udp: bool) -> Reply {
    let message = match Message::from_vec(request) {
        Ok(message) => message,
        Err(_) => {
            return match request.get(..2) {
                Some(id) if request.len() >= 12 && request[2] & 0x80 == 0 => Reply::Answer(error(
                    u16::from_be_bytes([id[0], id[1]]),
                    ResponseCode::FormErr,
                )),
                _ => Reply::Drop,
            };
        }
    };
    let id = message.metadata.id;
    if message.metadata.message_type != MessageType::Query {
        return Reply::Drop;
    }
    if message.metadata.op_code != OpCode::Query {
        return Reply::Answer(error(id, ResponseCode::NotImp));
    }
    let [query] = message.queries.as_slice() else {
        return Reply::Answer(error(id, ResponseCode::FormErr));
    };
    let (code, answers, authority) = match dns.answer(query.name(), query.query_type()) {
        Answer::Upstream => return Reply::Upstream { id },
        Answer::Cluster {
            code,
            answers,
            authority,
        } => (code, answers, authority),
    };
    let mut response = Message::response(id, OpCode::Query);
    response.metadata.authoritative = true;
    response.metadata.recursion_desired = message.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.metadata.response_code = code;
    response.add_query(query.clone());
    response.add_answers(answers);
    for record in authority {
        response.add_authority(record);
    }
    let Ok(bytes) = response.to_vec() else {
        return Reply::Answer(error(id, ResponseCode::ServFail));
    };
    let limit = message
        .edns
        .as_ref()
        .map_or(CLASSIC_UDP_PAYLOAD, |e| usize::from(e.max_payload()))
        .max(CLASSIC_UDP_PAYLOAD);
    if udp && bytes.len() > limit {
        // Too big for the datagram: the client asks again over TCP.
        return match response.truncate().to_vec() {
            Ok(truncated) => Reply::Answer(truncated),
            Err(_) => Reply::Answer(error(id, ResponseCode::ServFail)),
        };
    }
    Reply::Answer(bytes)
}

/// An answer of nothing but `code`.
fn error(id: u16, code: ResponseCode) -> Vec<u8> {
    Message::error_msg(id, OpCode::Query, code)
        .to_vec()
        .unwrap_or_default()
}

/// The nameservers of a resolv.conf, without `exclude` (the cluster DNS address itself, which
/// would answer its own forwards).
pub fn upstreams(resolv_conf: &str, exclude: IpAddr) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("nameserver"))
                .then(|| words.next()?.parse::<IpAddr>().ok())
                .flatten()
        })
        .filter(|ip| *ip != exclude)
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// The sockets the responder answers on.
pub struct Listening {
    udp: UdpSocket,
    tcp: TcpListener,
}

impl Listening {
    /// The address bound (the port chosen, when asked for port 0).
    pub fn local_address(&self) -> std::io::Result<SocketAddr> {
        self.udp.local_addr()
    }
}

/// Binds `address` over UDP and TCP (the same port for both).
pub async fn bind(address: SocketAddr) -> std::io::Result<Listening> {
    let udp = UdpSocket::bind(address).await?;
    let tcp = TcpListener::bind(udp.local_addr()?).await?;
    Ok(Listening { udp, tcp })
}

/// Answers DNS on `listening` until the task is dropped.
pub async fn serve(
    listening: Listening,
    dns: Arc<RwLock<ClusterDns>>,
    upstreams: Vec<SocketAddr>,
) -> anyhow::Result<()> {
    let Listening { udp, tcp } = listening;
    let udp = Arc::new(udp);
    tracing::info!(address = %udp.local_addr()?, upstreams = ?upstreams, "cluster DNS listening");
    let upstreams = Arc::new(upstreams);
    let udp_task = {
        let (dns, upstreams) = (dns.clone(), upstreams.clone());
        async move {
            let mut buffer = vec![0u8; MAX_MESSAGE];
            loop {
                let (len, peer) = match udp.recv_from(&mut buffer).await {
                    Ok(received) => received,
                    Err(err) => {
                        tracing::debug!(%err, "receiving a DNS datagram failed");
                        continue;
                    }
                };
                let request = buffer[..len].to_vec();
                let (dns, upstreams, socket) = (dns.clone(), upstreams.clone(), udp.clone());
                // Forwards wait on the network; each request answers on its own.
                tokio::spawn(async move {
                    if let Some(reply) = reply(&dns, &upstreams, &request, true).await {
                        let _ = socket.send_to(&reply, peer).await;
                    }
                });
            }
        }
    };
    let tcp_task = async move {
        loop {
            let (stream, _) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::debug!(%err, "accepting a DNS connection failed");
                    continue;
                }
            };
            let (dns, upstreams) = (dns.clone(), upstreams.clone());
            tokio::spawn(async move {
                let _ = serve_tcp(stream, &dns, &upstreams).await;
            });
        }
    };
    tokio::join!(udp_task, tcp_task);
    Ok(())
}

/// Queries on one TCP connection, each framed by its two-byte length, until it closes or idles.
async fn serve_tcp(
    mut stream: TcpStream,
    dns: &RwLock<ClusterDns>,
    upstreams: &[SocketAddr],
) -> std::io::Result<()> {
    loop {
        let mut length = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut length)).await {
            Ok(Ok(_)) => {}
            _ => return Ok(()),
        }
        let mut request = vec![0u8; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut request).await?;
        let Some(reply) = reply(dns, upstreams, &request, false).await else {
            return Ok(());
        };
        let Ok(length) = u16::try_from(reply.len()) else {
            return Ok(());
        };
        stream.write_all(&length.to_be_bytes()).await?;
        stream.write_all(&reply).await?;
    }
}

/// The bytes to send back for `request`, asking the upstreams when the name is not the
/// cluster's.
async fn reply(
    dns: &RwLock<ClusterDns>,
    upstreams: &[SocketAddr],
    request: &[u8],
    udp: bool,
) -> Option<Vec<u8>> {
    let decided = match dns.read() {
        Ok(dns) => respond(&dns, request, udp),
        Err(_) => return None,
    };
    match decided {
        Reply::Answer(bytes) => Some(bytes),
        Reply::Drop => None,
        Reply::Upstream { id } => {
            for upstream in upstreams {
                let answer = if udp {
                    forward_udp(*upstream, request).await
                } else {
                    forward_tcp(*upstream, request).await
                };
                match answer {
                    Ok(bytes) if bytes.get(..2) == request.get(..2) => return Some(bytes),
                    Ok(_) => {}
                    Err(err) => tracing::debug!(%upstream, %err, "upstream resolver failed"),
                }
            }
            Some(error(id, ResponseCode::ServFail))
        }
    }
}

async fn forward_udp(upstream: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().map_err(std::io::Error::other)?,
        SocketAddr::V6(_) => "[::]:0".parse().map_err(std::io::Error::other)?,
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(request).await?;
    let mut buffer = vec![0u8; MAX_MESSAGE];
    let len = tokio::time::timeout(UPSTREAM_TIMEOUT, socket.recv(&mut buffer))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    buffer.truncate(len);
    Ok(buffer)
}

async fn forward_tcp(upstream: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let exchange = async {
        let mut stream = TcpStream::connect(upstream).await?;
        let length = u16::try_from(request.len()).map_err(std::io::Error::other)?;
        stream.write_all(&length.to_be_bytes()).await?;
        stream.write_all(request).await?;
        let mut length = [0u8; 2];
        stream.read_exact(&mut length).await?;
        let mut answer = vec![0u8; usize::from(u16::from_be_bytes(length))];
        stream.read_exact(&mut answer).await?;
        Ok(answer)
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{Name, RecordType};
    use serde_json::json;

    fn dns() -> ClusterDns {
        let mut dns = ClusterDns::new("cluster.local").expect("zone");
        let web = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.20"},
        }))
        .expect("service");
        dns.apply_service(&web);
        dns
    }

    fn query(id: u16, name: &str, kind: RecordType) -> Vec<u8> {
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(Name::from_ascii(name).expect("name"), kind));
        message.to_vec().expect("query")
    }

    fn decoded(reply: Reply) -> Message {
        match reply {
            Reply::Answer(bytes) => Message::from_vec(&bytes).expect("response"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn cluster_names_are_answered_and_others_forwarded() {
        let dns = dns();
        let response = decoded(respond(
            &dns,
            &query(7, "web.shop.svc.cluster.local.", RecordType::A),
            true,
        ));
        assert_eq!(response.metadata.id, 7);
        assert_eq!(response.metadata.message_type, MessageType::Response);
        assert!(response.metadata.authoritative && response.metadata.recursion_available);
        assert_eq!(response.answers.len(), 1);
        assert_eq!(response.queries.len(), 1);
        let missing = decoded(respond(
            &dns,
            &query(8, "nope.shop.svc.cluster.local.", RecordType::A),
            true,
        ));
        assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(missing.authorities.len(), 1, "the SOA for negative caching");
        assert_eq!(
            respond(&dns, &query(9, "example.com.", RecordType::A), true),
            Reply::Upstream { id: 9 }
        );
    }

    #[test]
    fn malformed_packets_get_formerr_or_nothing() {
        let dns = dns();
        // A header with garbage after it: FORMERR for its id.
        let mut garbage = vec![0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0];
        garbage.extend_from_slice(&[0xff; 7]);
        let response = decoded(respond(&dns, &garbage, true));
        assert_eq!(
            (response.metadata.id, response.metadata.response_code),
            (0x1234, ResponseCode::FormErr)
        );
        // Too short for a header, or itself a response: no reply.
        assert_eq!(respond(&dns, &[1, 2, 3], true), Reply::Drop);
        let mut answer = Message::response(5, OpCode::Query);
        answer.add_query(Query::query(
            Name::from_ascii("web.shop.svc.cluster.local.").expect("name"),
            RecordType::A,
        ));
        assert_eq!(
            respond(&dns, &answer.to_vec().expect("bytes"), true),
            Reply::Drop
        );
        // Another opcode: NOTIMP.
        let mut update = Message::new(6, MessageType::Query, OpCode::Update);
        update.add_query(Query::query(
            Name::from_ascii("cluster.local.").expect("name"),
            RecordType::SOA,
        ));
        let response = decoded(respond(&dns, &update.to_vec().expect("bytes"), true));
        assert_eq!(response.metadata.response_code, ResponseCode::NotImp);
    }

    #[test]
    fn upstreams_come_from_resolv_conf_without_the_cluster_address() {
        let conf = "# comment\nsearch example.internal\nnameserver 10.96.0.10\nnameserver 1.1.1.1\nnameserver fd00::53\noptions ndots:2\n";
        let cluster: IpAddr = "10.96.0.10".parse().expect("ip");
        assert_eq!(
            upstreams(conf, cluster),
            vec![
                "1.1.1.1:53".parse::<SocketAddr>().expect("addr"),
                "[fd00::53]:53".parse().expect("addr"),
            ]
        );
    }
}
