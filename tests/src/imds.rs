//! An EC2 instance metadata service emulator (IMDSv2) for nodes started by the tests: answers
//! `PUT /latest/api/token` and, with that token, `GET /latest/user-data` and
//! `/latest/meta-data/{instance-id,local-ipv4,local-hostname,placement/availability-zone}` for
//! the instance whose address the request comes from (each node has its own address on the
//! fabric), as EC2's link-local service does for the instance asking.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// What one instance's metadata says.
#[derive(Debug, Clone)]
pub struct InstanceMetadata {
    /// `instance-id`.
    pub instance_id: String,
    /// `local-ipv4` (also the address its requests come from).
    pub local_ipv4: String,
    /// `local-hostname`.
    pub local_hostname: String,
    /// `placement/availability-zone`.
    pub availability_zone: String,
    /// `user-data` (absent when `None`).
    pub user_data: Option<String>,
}

type Instances = Arc<Mutex<HashMap<IpAddr, InstanceMetadata>>>;

/// The running emulator; stops when dropped.
pub struct ImdsEmulator {
    /// `http://HOST:PORT`.
    pub endpoint: String,
    instances: Instances,
    stop: Arc<AtomicBool>,
    address: std::net::SocketAddr,
}

impl ImdsEmulator {
    /// Serves on `host` (e.g. a fabric's host address) at a free port.
    pub fn start(host: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((host, 0))?;
        let address = listener.local_addr()?;
        let instances: Instances = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let tokens = Arc::new(AtomicU64::new(0));
        let (served, stopping) = (instances.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopping.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (served, tokens) = (served.clone(), tokens.clone());
                std::thread::spawn(move || {
                    let _ = answer(stream, &served, &tokens);
                });
            }
        });
        Ok(ImdsEmulator {
            endpoint: format!("http://{address}"),
            instances,
            stop,
            address,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> std::net::SocketAddr {
        self.address
    }

    /// Serves `metadata` to requests from its `local_ipv4`.
    pub fn add(&self, metadata: InstanceMetadata) -> anyhow::Result<()> {
        let address: IpAddr = metadata.local_ipv4.parse()?;
        if let Ok(mut instances) = self.instances.lock() {
            instances.insert(address, metadata);
        }
        Ok(())
    }
}

impl Drop for ImdsEmulator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.address);
    }
}

/// Answers one connection (one request; `Connection: close`).
fn answer(mut stream: TcpStream, instances: &Instances, tokens: &AtomicU64) -> std::io::Result<()> {
    let peer = stream.peer_addr()?.ip();
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_lowercase(), value.trim().to_string());
        }
    }
    let mut words = request_line.split_whitespace();
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let instance = instances
        .lock()
        .ok()
        .and_then(|all| all.get(&peer).cloned());
    let (status, body) = match (method, path, instance) {
        (_, _, None) => ("404 Not Found", String::new()),
        ("PUT", "/latest/api/token", Some(instance)) => {
            if headers.contains_key("x-aws-ec2-metadata-token-ttl-seconds") {
                let n = tokens.fetch_add(1, Ordering::SeqCst);
                ("200 OK", format!("{}-{n}", instance.instance_id))
            } else {
                ("400 Bad Request", String::new())
            }
        }
        ("GET", path, Some(instance)) => {
            let token = headers.get("x-aws-ec2-metadata-token");
            if !token.is_some_and(|token| token.starts_with(&format!("{}-", instance.instance_id)))
            {
                ("401 Unauthorized", String::new())
            } else {
                let item = match path {
                    "/latest/user-data" => instance.user_data.clone(),
                    "/latest/meta-data/instance-id" => Some(instance.instance_id.clone()),
                    "/latest/meta-data/local-ipv4" => Some(instance.local_ipv4.clone()),
                    "/latest/meta-data/local-hostname" => Some(instance.local_hostname.clone()),
                    "/latest/meta-data/placement/availability-zone" => {
                        Some(instance.availability_zone.clone())
                    }
                    _ => None,
                };
                match item {
                    Some(body) => ("200 OK", body),
                    None => ("404 Not Found", String::new()),
                }
            }
        }
        _ => ("405 Method Not Allowed", String::new()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
