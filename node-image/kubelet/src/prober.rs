//! The IO half of probes and httpGet/tcpSocket hooks: CRI `ExecSync` with the probe's
//! timeout, an HTTP/1.1 GET (https without certificate checks, as upstream) and a TCP
//! connect from the kubelet's own network namespace; and the per-pod probe loop that feeds
//! `probe::Prober` the container states the pod worker saw and wakes the worker when a
//! published result changes. Every decision is in `probe.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::cri::Cri;
use crate::events::Recorder;
use crate::probe::{
    self, DialError, Due, GrpcFailure, Handler, HttpGet, Observed, Outcome, ProbeKind, Prober,
};
use flotilla_api_machinery::errors::error_chain;

/// Upstream reads at most this much of a probe's output or body.
const MAX_OUTPUT: usize = 10 * 1024;
/// Added to an exec's own timeout before the kubelet gives up on the runtime.
const EXEC_MARGIN: Duration = Duration::from_secs(10);

/// Runs `handler` (exec in container `id`) within `timeout`.
pub async fn run(cri: &mut Cri, id: &str, handler: &Handler, timeout: Duration) -> Outcome {
    match handler {
        Handler::Exec(command) => exec(cri, id, command, timeout).await,
        Handler::Http(get) => http(get, timeout).await,
        Handler::Tcp { host, port } => tcp(host, *port, timeout).await,
        Handler::Grpc {
            host,
            port,
            service,
        } => grpc(host, *port, service, timeout).await,
        Handler::Sleep(duration) => {
            tokio::time::sleep(*duration).await;
            Outcome::Success(String::new())
        }
    }
}

/// Upstream's exec prober over CRI `ExecSync`: exit 0 passes, any other exit fails with
/// the combined output, a timeout fails with upstream's "timed out" text.
pub async fn exec(cri: &mut Cri, id: &str, command: &[String], timeout: Duration) -> Outcome {
    let request = cri::ExecSyncRequest {
        container_id: id.to_string(),
        cmd: command.to_vec(),
        timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
    };
    let call = cri.runtime.exec_sync(request);
    let response = match tokio::time::timeout(timeout + EXEC_MARGIN, call).await {
        Err(_) => return Outcome::Failure(probe::exec_timeout_message(command)),
        Ok(Err(status)) => {
            let timed_out = status.code() == tonic::Code::DeadlineExceeded
                || status.message().contains("timeout");
            return if timed_out {
                Outcome::Failure(probe::exec_timeout_message(command))
            } else {
                Outcome::Error(status.message().to_string())
            };
        }
        Ok(Ok(response)) => response.into_inner(),
    };
    let mut output = response.stdout;
    output.extend_from_slice(&response.stderr);
    output.truncate(MAX_OUTPUT);
    let output = String::from_utf8_lossy(&output).into_owned();
    if response.exit_code == 0 {
        Outcome::Success(output)
    } else {
        Outcome::Failure(output)
    }
}

fn dial_error(err: &std::io::Error) -> DialError {
    match err.kind() {
        std::io::ErrorKind::ConnectionRefused => DialError::Refused,
        std::io::ErrorKind::TimedOut => DialError::Timeout,
        _ => DialError::Other(err.to_string()),
    }
}

/// Upstream's tcpSocket prober: passes when the connection opens.
pub async fn tcp(host: &str, port: u16, timeout: Duration) -> Outcome {
    match dial(host, port, timeout).await {
        Ok(_) => Outcome::Success(String::new()),
        Err(err) => Outcome::Failure(probe::dial_message(host, port, &err)),
    }
}

/// Upstream's gRPC prober: `grpc.health.v1.Health/Check` for `service` over plain HTTP/2,
/// connecting and calling each within `timeout`; only SERVING passes.
pub async fn grpc(host: &str, port: u16, service: &str, timeout: Duration) -> Outcome {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let fail =
        |failure: GrpcFailure| Outcome::Failure(probe::grpc_message(host, port, timeout, &failure));
    let uri = format!("http://{}", probe::join_host_port(host, port));
    let endpoint = tonic::transport::Endpoint::from_shared(uri)
        .and_then(|endpoint| endpoint.user_agent(probe::probe_agent()));
    let endpoint = match endpoint {
        Ok(endpoint) => endpoint,
        Err(err) => return fail(GrpcFailure::Connect(err.to_string())),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Err(_) => return fail(GrpcFailure::ConnectTimeout),
        Ok(Err(err)) => return fail(GrpcFailure::Connect(error_chain(&err))),
        Ok(Ok(channel)) => channel,
    };
    let request = HealthCheckRequest {
        service: service.to_string(),
    };
    let mut client = HealthClient::new(channel);
    let call = client.check(request);
    let status = match tokio::time::timeout(timeout, call).await {
        Err(_) => return fail(GrpcFailure::RpcTimeout),
        Ok(Err(status)) => {
            return fail(match status.code() {
                tonic::Code::Unimplemented => {
                    GrpcFailure::Unimplemented(status.message().to_string())
                }
                tonic::Code::DeadlineExceeded => GrpcFailure::RpcTimeout,
                _ => GrpcFailure::Rpc(format!(
                    "rpc error: code = {:?} desc = {}",
                    status.code(),
                    status.message()
                )),
            });
        }
        Ok(Ok(response)) => response.into_inner().status,
    };
    match ServingStatus::try_from(status) {
        Ok(ServingStatus::Serving) => Outcome::Success("service healthy".into()),
        Ok(other) => fail(GrpcFailure::Unhealthy(other.as_str_name().to_string())),
        Err(_) => fail(GrpcFailure::Unhealthy(status.to_string())),
    }
}

/// A TCP connection to `host:port` within `timeout`.
pub async fn dial(host: &str, port: u16, timeout: Duration) -> Result<TcpStream, DialError> {
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Err(_) => Err(DialError::Timeout),
        Ok(Err(err)) => Err(dial_error(&err)),
        Ok(Ok(stream)) => Ok(stream),
    }
}

/// Upstream `DoHTTPProbe` within `timeout`: redirects to the same host are followed (at
/// most 10), a redirect elsewhere ends with its 3xx; the last answer is judged by
/// `probe::http_outcome`.
pub async fn http(get: &HttpGet, timeout: Duration) -> Outcome {
    let follow = async {
        let mut current = get.clone();
        for _ in 0..=probe::MAX_REDIRECTS {
            let answer = http_get(&current).await?;
            match probe::redirect(&current, answer.status, answer.location.as_deref()) {
                Some(next) => current = next,
                None => return Ok(answer),
            }
        }
        Err(format!(
            "Get \"{}\": stopped after 10 redirects",
            current.url()
        ))
    };
    match tokio::time::timeout(timeout, follow).await {
        Err(_) => Outcome::Failure(probe::http_error_message(get, &DialError::Timeout, true)),
        Ok(Err(message)) => Outcome::Failure(message),
        Ok(Ok(answer)) => probe::http_outcome(answer.status, &answer.body),
    }
}

/// One HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The first 10 KiB of the body.
    pub body: String,
    /// The `Location` header, if any.
    pub location: Option<String>,
}

/// One GET, or the failure's text.
pub async fn http_get(get: &HttpGet) -> Result<Answer, String> {
    let stream = TcpStream::connect((get.host.as_str(), get.port))
        .await
        .map_err(|err| probe::http_error_message(get, &dial_error(&err), false))?;
    if get.scheme == "https" {
        let tls = tokio_rustls::TlsConnector::from(insecure_tls()?);
        let name = rustls_pki_types::ServerName::try_from(get.host.clone())
            .map_err(|err| format!("Get \"{}\": {err}", get.url()))?;
        let stream = tls
            .connect(name, stream)
            .await
            .map_err(|err| format!("Get \"{}\": {err}", get.url()))?;
        exchange(get, stream).await
    } else {
        exchange(get, stream).await
    }
}

async fn exchange<S>(get: &HttpGet, stream: S) -> Result<Answer, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let failed = |err: &dyn std::fmt::Display| format!("Get \"{}\": {err}", get.url());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| failed(&err))?;
    let driver = tokio::spawn(connection);
    let mut request = http::Request::get(get.path.as_str()).header("Host", get.host_header());
    for (name, value) in &get.headers {
        if !name.eq_ignore_ascii_case("host") {
            request = request.header(name.as_str(), value.as_str());
        }
    }
    let request = request
        .header("Connection", "close")
        .body(Empty::<Bytes>::new())
        .map_err(|err| failed(&err))?;
    let outcome = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| failed(&err))?;
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get(http::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_string);
        let mut body = response.into_body();
        let mut read = Vec::new();
        while read.len() < MAX_OUTPUT {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        read.extend_from_slice(data);
                    }
                }
                Some(Err(err)) => return Err(failed(&err)),
                None => break,
            }
        }
        read.truncate(MAX_OUTPUT);
        Ok(Answer {
            status,
            body: String::from_utf8_lossy(&read).into_owned(),
            location,
        })
    }
    .await;
    driver.abort();
    outcome
}

/// Upstream probes https with `InsecureSkipVerify`: the pod's certificate is not checked.
fn insecure_tls() -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A verifier that accepts any certificate but still checks the handshake's signatures.
#[derive(Debug)]
struct AcceptAny(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What the pod worker last saw, for the probe loop.
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Container name → its newest runtime container.
    pub containers: HashMap<String, Observed>,
    /// The pod's IP (the default host of httpGet and tcpSocket).
    pub pod_ip: String,
    /// The pod is being deleted.
    pub deleting: bool,
}

/// The probe state one pod's worker and its probe loop share.
#[derive(Default)]
pub struct PodProbes {
    /// The state machine.
    pub prober: Mutex<Prober>,
    /// What the worker last saw.
    pub seen: Mutex<Seen>,
    /// Wakes the probe loop (the worker saw something new).
    pub wake_probes: Notify,
    /// Wakes the worker (a published result changed).
    pub wake_pod: Notify,
}

impl PodProbes {
    /// The probes of `pod`.
    pub fn new(pod: &Pod) -> Self {
        PodProbes {
            prober: Mutex::new(Prober::new(pod)),
            ..Default::default()
        }
    }

    /// Hands the probe loop the worker's latest view.
    pub fn update(&self, seen: Seen) {
        if let Ok(mut current) = self.seen.lock() {
            *current = seen;
        }
        self.wake_probes.notify_one();
    }

    /// (started, ready) of running container `id` named `name`, as `UpdatePodStatus`.
    pub fn started_ready(&self, name: &str, id: &str) -> (bool, bool) {
        match self.prober.lock() {
            Ok(prober) => {
                let started = prober.started(name, id);
                (started, started && prober.ready(name, id))
            }
            Err(_) => (true, true),
        }
    }

    /// The probe that failed for container `id` named `name`, if it must be killed.
    pub fn failed(&self, name: &str, id: &str) -> Option<ProbeKind> {
        self.prober.lock().ok()?.failed(name, id)
    }
}

/// The per-pod probe loop: runs due probes, records their outcomes and events, and wakes
/// the pod worker on every change of a published result. Runs until aborted.
pub async fn probe_loop(cri: Cri, recorder: Arc<Recorder>, pod: Pod, probes: Arc<PodProbes>) {
    let never = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    let agent = probe::probe_agent();
    loop {
        let seen = probes.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let now = Instant::now();
        let polled = probes.prober.lock().map(|mut prober| {
            let observed = |name: &str| seen.containers.get(name).cloned();
            let (due, next, changed) = prober.poll(&observed, seen.deleting, never, now);
            (
                due,
                next.into_iter().chain(prober.next_period()).min(),
                changed,
            )
        });
        // Drop the poisoned guard (not Send) before any await.
        let polled = polled.map_err(|_| ());
        let Ok((due, next, changed)) = polled else {
            return;
        };
        if changed {
            probes.wake_pod.notify_one();
        }
        let runs = due.into_iter().map(|due| {
            let mut cri = cri.clone();
            let pod = &pod;
            let agent = agent.as_str();
            let pod_ip = seen.pod_ip.as_str();
            async move {
                let outcome = probe_once(&mut cri, pod, &due, pod_ip, agent).await;
                (due, outcome)
            }
        });
        for (due, outcome) in futures::future::join_all(runs).await {
            if let Some((kind, reason, message)) = outcome.event(due.kind) {
                recorder.container_event(&pod, &due.container, kind, reason, &message);
            }
            let changed = probes
                .prober
                .lock()
                .is_ok_and(|mut p| p.record(&due, &outcome, Instant::now()));
            if changed {
                tracing::info!(pod = ?pod.metadata.name, container = %due.container, probe = due.kind.title(), ?outcome, "probe result changed");
                probes.wake_pod.notify_one();
            }
        }
        // Sleep until the next probe is due or the worker sees something new; bounded, so
        // a missed wake-up only delays.
        let wait = next
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = probes.wake_probes.notified() => {}
        }
    }
}

async fn probe_once(cri: &mut Cri, pod: &Pod, due: &Due, pod_ip: &str, agent: &str) -> Outcome {
    let spec = pod.spec.as_ref();
    let container = spec
        .into_iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == due.container);
    let Some(container) = container else {
        return Outcome::Error(format!("container {} not found", due.container));
    };
    let spec = match due.kind {
        ProbeKind::Liveness => container.liveness_probe.as_ref(),
        ProbeKind::Readiness => container.readiness_probe.as_ref(),
        ProbeKind::Startup => container.startup_probe.as_ref(),
    };
    let Some(spec) = spec else {
        return Outcome::Error(format!("no {} probe", due.kind.title()));
    };
    match probe::probe_handler(spec, container, pod_ip, agent) {
        Ok(handler) => run(cri, &due.id, &handler, due.timeout).await,
        Err(err) => Outcome::Error(err.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A loopback server answering every connection with `response`, returning what it read.
    async fn serve(response: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut buf = vec![0; 4096];
            let n = socket.read(&mut buf).await.unwrap_or(0);
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        (port, task)
    }

    fn get(port: u16, path: &str) -> HttpGet {
        HttpGet {
            scheme: "http".into(),
            host: "127.0.0.1".into(),
            port,
            path: path.into(),
            headers: vec![
                ("X-Probe".into(), "yes".into()),
                ("User-Agent".into(), "kube-probe/1.33".into()),
                ("Accept".into(), "*/*".into()),
            ],
        }
    }

    #[tokio::test]
    async fn http_probes_judge_real_answers() {
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (port, request) = serve(ok).await;
        let outcome = http(&get(port, "/healthz?a=1"), Duration::from_secs(2)).await;
        assert_eq!(outcome, Outcome::Success("ok".into()));
        let request = request.await.expect("request");
        assert!(
            request.starts_with("GET /healthz?a=1 HTTP/1.1\r\n"),
            "{request}"
        );
        let lower = request.to_ascii_lowercase();
        for header in [
            format!("host: 127.0.0.1:{port}"),
            "x-probe: yes".into(),
            "user-agent: kube-probe/1.33".into(),
            "accept: */*".into(),
        ] {
            assert!(lower.contains(&header), "{header} in {request}");
        }

        let (port, _) =
            serve("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n").await;
        assert_eq!(
            http(&get(port, "/"), Duration::from_secs(2)).await,
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
        );
        // A redirect to another host ends with its 3xx: a warning.
        let (port, _) = serve(
            "HTTP/1.1 301 Moved\r\nlocation: http://other.invalid/x\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        assert!(matches!(
            http(&get(port, "/"), Duration::from_secs(2)).await,
            Outcome::Warning(_)
        ));
    }

    #[tokio::test]
    async fn same_host_redirects_are_followed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let mut paths = Vec::new();
            for answer in [
                "HTTP/1.1 302 Found\r\nlocation: /next\r\ncontent-length: 0\r\n\r\n",
                "HTTP/1.1 503 Unavailable\r\ncontent-length: 0\r\n\r\n",
            ] {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let mut buf = vec![0; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).into_owned();
                paths.push(request.split_whitespace().nth(1).unwrap_or("").to_string());
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            }
            paths
        });
        assert_eq!(
            http(&get(port, "/start"), Duration::from_secs(2)).await,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        assert_eq!(server.await.expect("server"), vec!["/start", "/next"]);
    }

    #[tokio::test]
    async fn refused_and_silent_servers_fail_with_go_texts() {
        // A port nothing listens on: bind, note it, close.
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr").port()
        };
        assert_eq!(
            http(&get(port, "/"), Duration::from_secs(2)).await,
            Outcome::Failure(format!(
                "Get \"http://127.0.0.1:{port}/\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            ))
        );
        let Outcome::Failure(message) = tcp("127.0.0.1", port, Duration::from_secs(1)).await else {
            panic!("tcp to a closed port passed");
        };
        assert_eq!(
            message,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );

        // A listener that accepts and never answers: the timeout fails the HTTP probe; the
        // TCP probe passes (it only connects).
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let hold = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            let second = listener.accept().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop((socket, second));
        });
        assert_eq!(
            http(&get(port, "/"), Duration::from_millis(300)).await,
            Outcome::Failure(format!(
                "Get \"http://127.0.0.1:{port}/\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            ))
        );
        assert_eq!(
            tcp("127.0.0.1", port, Duration::from_secs(1)).await,
            Outcome::Success(String::new())
        );
        hold.abort();
    }

    #[tokio::test]
    async fn grpc_probes_ask_the_health_service() {
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("db", tonic_health::ServingStatus::NotServing)
            .await;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let second = Duration::from_secs(1);
        assert_eq!(
            grpc("127.0.0.1", port, "", second).await,
            Outcome::Success("service healthy".into())
        );
        assert_eq!(
            grpc("127.0.0.1", port, "db", second).await,
            Outcome::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let Outcome::Failure(unknown) = grpc("127.0.0.1", port, "nope", second).await else {
            panic!("an unknown service passed");
        };
        assert!(
            unknown.starts_with("error: health rpc probe failed: rpc error: code = NotFound"),
            "{unknown}"
        );
        server.abort();

        // Nothing listening: the connection fails with upstream's text.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr").port()
        };
        let Outcome::Failure(refused) = grpc("127.0.0.1", closed, "", second).await else {
            panic!("a closed port passed");
        };
        assert!(
            refused.starts_with(&format!(
                "error: failed to connect service at \"127.0.0.1:{closed}\": "
            )),
            "{refused}"
        );
    }
}
