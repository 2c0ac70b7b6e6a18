//! Liveness, readiness and startup probes as a sans-IO state machine (upstream
//! `pkg/kubelet/prober`: `worker.doProbe`, the results managers, `isContainerStarted` and
//! `UpdatePodStatus`), and the pure halves of the handlers: resolving a probe or hook to what
//! to run (`ResolveContainerPort`, `NewRequestForHTTPGetAction`), judging an HTTP answer
//! (`DoHTTPProbe`) and upstream's event and failure texts. Observations and results go in;
//! what to probe when, and which containers must be killed, come out. The IO is `prober.rs`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Why a probe or hook cannot be run at all (upstream's prober errors: the result is thrown
/// away and reported as "… probe errored").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// A named port the container does not declare.
    #[error("port {0} not found")]
    PortNotFound(String),
    /// A port outside 1–65535.
    #[error("invalid port number: {0}")]
    InvalidPort(i64),
    /// No handler, or one the kubelet does not run.
    #[error("missing probe handler for {0}")]
    NoHandler(String),
}

/// Which probe (upstream `probeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProbeKind {
    /// Restarts the container when it fails.
    Liveness,
    /// Takes the container out of service when it fails.
    Readiness,
    /// Holds the other two back until it succeeds; restarts the container when it fails.
    Startup,
}

impl ProbeKind {
    /// Upstream's `probeType.String()`, as event messages show it.
    pub fn title(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The result a new container starts with (upstream `worker.initialValue`): not ready,
    /// alive, not yet started.
    fn initial(self) -> ProbeResult {
        match self {
            ProbeKind::Liveness => ProbeResult::Success,
            ProbeKind::Readiness => ProbeResult::Failure,
            ProbeKind::Startup => ProbeResult::Unknown,
        }
    }
}

/// A probe's published result (upstream `results.Result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// Passed.
    Success,
    /// Failed.
    Failure,
    /// Not known yet.
    Unknown,
}

/// What one run of a handler found (upstream `probe.Result` with its output).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Passed; the output (an HTTP body, an exec's output).
    Success(String),
    /// Passed with a warning (an HTTP redirect not followed).
    Warning(String),
    /// Failed, with what upstream shows after "probe failed: ".
    Failure(String),
    /// Could not run (a prober error): thrown away, reported as "probe errored".
    Error(String),
}

impl Outcome {
    /// The result the worker counts; `None` for a prober error (thrown away as upstream).
    pub fn result(&self) -> Option<ProbeResult> {
        match self {
            Outcome::Success(_) | Outcome::Warning(_) => Some(ProbeResult::Success),
            Outcome::Failure(_) => Some(ProbeResult::Failure),
            Outcome::Error(_) => None,
        }
    }

    /// The event upstream's prober records for it: (type, reason, message).
    pub fn event(&self, kind: ProbeKind) -> Option<(&'static str, &'static str, String)> {
        let title = kind.title();
        match self {
            Outcome::Success(_) => None,
            Outcome::Warning(out) => Some((
                "Warning",
                "ProbeWarning",
                format!("{title} probe warning: {out}"),
            )),
            Outcome::Failure(out) => Some((
                "Warning",
                "Unhealthy",
                format!("{title} probe failed: {out}"),
            )),
            Outcome::Error(err) => Some((
                "Warning",
                "Unhealthy",
                format!("{title} probe errored: {err}"),
            )),
        }
    }
}

/// A probe's timing with upstream's defaults (the API's `SetDefaults_Probe`, repeated here
/// for objects that bypassed defaulting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// `initialDelaySeconds` (0).
    pub initial_delay: Duration,
    /// `periodSeconds` (10).
    pub period: Duration,
    /// `timeoutSeconds` (1).
    pub timeout: Duration,
    /// `successThreshold` (1; always 1 for liveness and startup).
    pub success_threshold: u32,
    /// `failureThreshold` (3).
    pub failure_threshold: u32,
}

impl Timing {
    /// The timing of `probe`.
    pub fn of(probe: &Probe) -> Self {
        let secs = |v: Option<i32>, default: u64| {
            Duration::from_secs(v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
        };
        let positive = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        Timing {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds.filter(|p| *p > 0), 10),
            timeout: secs(probe.timeout_seconds.filter(|t| *t > 0), 1),
            success_threshold: positive(probe.success_threshold, 1),
            failure_threshold: positive(probe.failure_threshold, 3),
        }
    }
}

/// An HTTP GET to make (upstream `NewRequestForHTTPGetAction`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    /// `http` or `https` (lowercased; https skips certificate checks as upstream).
    pub scheme: String,
    /// The host to connect to (default: the pod's IP).
    pub host: String,
    /// The port.
    pub port: u16,
    /// The path and query (`/` when empty).
    pub path: String,
    /// Request headers in order, with upstream's `User-Agent` and `Accept` defaults.
    pub headers: Vec<(String, String)>,
}

impl HttpGet {
    /// The URL, as Go's `url.URL.String()` shows it in error messages.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("{}://{host}:{}{}", self.scheme, self.port, self.path)
    }

    /// The `Host` header: the one the spec sets, else `host:port`.
    pub fn host_header(&self) -> String {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| match (self.scheme.as_str(), self.port) {
                ("http", 80) | ("https", 443) => self.host.clone(),
                _ => format!("{}:{}", self.host, self.port),
            })
    }
}

/// What a probe or lifecycle hook runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// A command in the container (CRI `ExecSync`).
    Exec(Vec<String>),
    /// An HTTP GET from the node.
    Http(HttpGet),
    /// A TCP connection from the node.
    Tcp {
        /// Host (default: the pod's IP).
        host: String,
        /// Port.
        port: u16,
    },
    /// A gRPC health check (`grpc.health.v1.Health/Check`) from the node, without TLS.
    Grpc {
        /// The pod's IP.
        host: String,
        /// Port.
        port: u16,
        /// The service asked about (`""`: the server as a whole).
        service: String,
    },
    /// Sleep (lifecycle hooks only).
    Sleep(Duration),
}

/// Upstream `ResolveContainerPort`: a number, or the name of one of the container's ports
/// (or a number written as a string).
pub fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, ProbeError> {
    let number = match port {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(name) => {
            let named = container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .map(|p| i64::from(p.container_port));
            match named.or_else(|| name.parse().ok()) {
                Some(n) => n,
                None => return Err(ProbeError::PortNotFound(name.clone())),
            }
        }
    };
    u16::try_from(number)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(ProbeError::InvalidPort(number))
}

/// The request of an httpGet action (`agent`: `kube-probe` or `kube-lifecycle`).
pub fn http_get(
    action: &HTTPGetAction,
    container: &Container,
    pod_ip: &str,
    agent: &str,
) -> Result<HttpGet, ProbeError> {
    let scheme = action
        .scheme
        .as_deref()
        .unwrap_or("HTTP")
        .to_ascii_lowercase();
    let host = action
        .host
        .clone()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod_ip.to_string());
    let port = resolve_port(&action.port, container)?;
    let path = match action.path.as_deref().unwrap_or("") {
        "" => "/".to_string(),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/{p}"),
    };
    let mut headers: Vec<(String, String)> = action
        .http_headers
        .iter()
        .flatten()
        .map(|h| (h.name.clone(), h.value.clone()))
        .collect();
    let has = |headers: &[(String, String)], name: &str| {
        headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name))
    };
    if !has(&headers, "User-Agent") {
        headers.push(("User-Agent".into(), agent.to_string()));
    }
    if !has(&headers, "Accept") {
        headers.push(("Accept".into(), "*/*".into()));
    } else {
        // An Accept header overridden to empty is dropped, as upstream.
        headers.retain(|(k, v)| !(k.eq_ignore_ascii_case("Accept") && v.is_empty()));
    }
    Ok(HttpGet {
        scheme,
        host,
        port,
        path,
        headers,
    })
}

/// What `probe` of `container` runs against a pod at `pod_ip`.
pub fn probe_handler(
    probe: &Probe,
    container: &Container,
    pod_ip: &str,
    agent: &str,
) -> Result<Handler, ProbeError> {
    if let Some(exec) = &probe.exec {
        return Ok(Handler::Exec(exec.command.clone().unwrap_or_default()));
    }
    if let Some(get) = &probe.http_get {
        return Ok(Handler::Http(http_get(get, container, pod_ip, agent)?));
    }
    if let Some(tcp) = &probe.tcp_socket {
        return Ok(Handler::Tcp {
            host: tcp
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| pod_ip.to_string()),
            port: resolve_port(&tcp.port, container)?,
        });
    }
    if let Some(grpc) = &probe.grpc {
        return Ok(Handler::Grpc {
            host: pod_ip.to_string(),
            port: resolve_port(&IntOrString::Int(grpc.port), container)?,
            service: grpc.service.clone().unwrap_or_default(),
        });
    }
    Err(ProbeError::NoHandler(container.name.clone()))
}

/// The `User-Agent` of probes (`kube-probe/<major>.<minor>`).
pub fn probe_agent() -> String {
    format!("kube-probe/{}", version_fragment())
}

/// The `User-Agent` of httpGet hooks (`kube-lifecycle/<major>.<minor>`).
pub fn lifecycle_agent() -> String {
    format!("kube-lifecycle/{}", version_fragment())
}

fn version_fragment() -> String {
    let version = crate::node::KUBELET_VERSION.trim_start_matches('v');
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// Upstream `DoHTTPProbe`'s verdict on an answer: 2xx passes; 3xx passes with a warning
/// (redirects are not followed); anything else fails with the status code.
pub fn http_outcome(status: u16, body: &str) -> Outcome {
    match status {
        200..=299 => Outcome::Success(body.to_string()),
        300..=399 => Outcome::Warning(format!("Probe terminated redirects, Response body: {body}")),
        _ => Outcome::Failure(format!("HTTP probe failed with statuscode: {status}")),
    }
}

/// How many redirects an HTTP probe follows (Go's client default).
pub const MAX_REDIRECTS: usize = 10;

/// The request after a redirect answer, when upstream's prober follows it: a 3xx with a
/// `Location` on the same host (upstream's `redirectChecker` without non-local redirects).
/// `None` ends with this answer.
pub fn redirect(get: &HttpGet, status: u16, location: Option<&str>) -> Option<HttpGet> {
    if !matches!(status, 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let location = location?.trim();
    let mut next = get.clone();
    if let Some((scheme, rest)) = location.split_once("://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let default_port = if scheme.eq_ignore_ascii_case("https") {
            443
        } else {
            80
        };
        let (host, port) = split_authority(authority, default_port)?;
        if host != get.host {
            return None;
        }
        next.scheme = scheme.to_ascii_lowercase();
        next.port = port;
        next.path = path.to_string();
    } else if location.starts_with('/') {
        next.path = location.to_string();
    } else {
        // Relative to the current path's directory.
        let base = get.path.split('?').next().unwrap_or("/");
        let dir = &base[..base.rfind('/').map_or(0, |i| i + 1)];
        next.path = format!("{dir}{location}");
    }
    Some(next)
}

/// `host[:port]` or `[v6][:port]` → (host, port).
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.split_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((authority.to_string(), default_port)),
    }
}

/// How a connection attempt failed, for Go-shaped messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialError {
    /// Nothing listens.
    Refused,
    /// The timeout ran out.
    Timeout,
    /// Anything else (the OS's text).
    Other(String),
}

/// `dial tcp HOST:PORT: …`, as Go's net package words it.
pub fn dial_message(host: &str, port: u16, err: &DialError) -> String {
    let addr = join_host_port(host, port);
    match err {
        DialError::Refused => format!("dial tcp {addr}: connect: connection refused"),
        DialError::Timeout => format!("dial tcp {addr}: i/o timeout"),
        DialError::Other(text) => format!("dial tcp {addr}: {text}"),
    }
}

/// The failure text of an HTTP probe that got no answer (Go's `*url.Error` text).
pub fn http_error_message(get: &HttpGet, err: &DialError, awaiting_headers: bool) -> String {
    let url = get.url();
    match err {
        DialError::Timeout if awaiting_headers => format!(
            "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        ),
        DialError::Timeout => format!("Get \"{url}\": context deadline exceeded"),
        _ => format!("Get \"{url}\": {}", dial_message(&get.host, get.port, err)),
    }
}

/// The failure text of an exec probe that timed out (upstream's `TimeoutError`).
pub fn exec_timeout_message(command: &[String]) -> String {
    format!("command {:?} timed out", command.join(" "))
}

/// Go's `net.JoinHostPort`: IPv6 hosts in brackets.
pub fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// How a gRPC health check ended, short of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcFailure {
    /// The connection did not open within the timeout.
    ConnectTimeout,
    /// The connection failed.
    Connect(String),
    /// The server has no `grpc.health.v1.Health` (its status message).
    Unimplemented(String),
    /// The call did not finish within the timeout.
    RpcTimeout,
    /// The call failed otherwise.
    Rpc(String),
    /// The server answered with a status other than SERVING (its name).
    Unhealthy(String),
}

/// Upstream's gRPC prober messages (`pkg/probe/grpc`) for a check of `host:port`.
pub fn grpc_message(host: &str, port: u16, timeout: Duration, failure: &GrpcFailure) -> String {
    let addr = join_host_port(host, port);
    let timeout = format!("{}s", timeout.as_secs());
    match failure {
        GrpcFailure::ConnectTimeout => format!(
            "timeout: failed to connect service {addr:?} within {timeout}: context deadline exceeded"
        ),
        GrpcFailure::Connect(err) => format!("error: failed to connect service at {addr:?}: {err}"),
        GrpcFailure::Unimplemented(message) => format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {message}"
        ),
        GrpcFailure::RpcTimeout => format!("timeout: health rpc did not complete within {timeout}"),
        GrpcFailure::Rpc(err) => format!("error: health rpc probe failed: {err}"),
        GrpcFailure::Unhealthy(status) => format!("service unhealthy (responded with {status:?})"),
    }
}

/// What the prober knows of a container at one moment (from the pod worker's last sync).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The runtime container's ID.
    pub id: String,
    /// When it started running, if it is running.
    pub running_since: Option<Instant>,
    /// Whether it has exited.
    pub terminated: bool,
}

/// What a worker wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poll {
    /// Run the probe now.
    Probe,
    /// Nothing before this instant.
    Until(Instant),
    /// Nothing until the container changes.
    Idle,
}

/// One probe of one container (upstream `worker`): its published result for the current
/// container ID, the run of equal results toward a threshold, and when it probes next.
#[derive(Debug, Clone)]
pub struct Worker {
    kind: ProbeKind,
    timing: Timing,
    container_id: Option<String>,
    result: Option<ProbeResult>,
    last: Option<ProbeResult>,
    run: u32,
    on_hold: bool,
    next: Option<Instant>,
    stopped: bool,
}

impl Worker {
    /// A worker for a probe of `kind` with `timing`.
    pub fn new(kind: ProbeKind, timing: Timing) -> Self {
        Worker {
            kind,
            timing,
            container_id: None,
            result: None,
            last: None,
            run: 0,
            on_hold: false,
            next: None,
            stopped: false,
        }
    }

    /// The published result for container `id` (`None`: none for that container).
    pub fn result(&self, id: &str) -> Option<ProbeResult> {
        (self.container_id.as_deref() == Some(id))
            .then_some(self.result)
            .flatten()
    }

    fn set(&mut self, result: ProbeResult) -> bool {
        let changed = self.result != Some(result);
        self.result = Some(result);
        changed
    }

    /// Upstream `doProbe` up to the probe itself: takes in the container's state (`started`:
    /// whether the startup probe let it through; `deleting`: the pod is terminating;
    /// `never`: restartPolicy Never) and says whether to probe now. Returns also whether the
    /// published result changed.
    pub fn poll(
        &mut self,
        observed: Option<&Observed>,
        started: bool,
        deleting: bool,
        never: bool,
        now: Instant,
    ) -> (Poll, bool) {
        let Some(observed) = observed.filter(|_| !self.stopped) else {
            return (Poll::Idle, false);
        };
        let mut changed = false;
        if self.container_id.as_deref() != Some(observed.id.as_str()) {
            // A new container: start over from the initial result.
            self.container_id = Some(observed.id.clone());
            self.result = Some(self.kind.initial());
            self.last = None;
            self.run = 0;
            self.on_hold = false;
            self.next = None;
            changed = true;
        }
        if self.on_hold {
            return (Poll::Idle, changed);
        }
        let Some(since) = observed.running_since else {
            changed |= self.set(ProbeResult::Failure);
            if observed.terminated && never {
                self.stopped = true;
            }
            return (Poll::Idle, changed);
        };
        if deleting && self.kind != ProbeKind::Readiness {
            // Graceful shutdown: liveness and startup stop and never kill.
            changed |= self.set(ProbeResult::Success);
            self.stopped = true;
            return (Poll::Idle, changed);
        }
        let delay_end = since + self.timing.initial_delay;
        if now < delay_end {
            return (Poll::Until(delay_end), changed);
        }
        match (started, self.kind) {
            (true, ProbeKind::Startup) | (false, ProbeKind::Liveness | ProbeKind::Readiness) => {
                return (Poll::Idle, changed);
            }
            _ => {}
        }
        match self.next {
            Some(next) if now < next => (Poll::Until(next), changed),
            _ => (Poll::Probe, changed),
        }
    }

    /// Takes in one probe's outcome for container `id` at `now` (upstream: the thresholds
    /// and `onHold` after a liveness or startup failure). Returns whether the published
    /// result changed.
    pub fn record(&mut self, id: &str, outcome: &Outcome, now: Instant) -> bool {
        if self.container_id.as_deref() != Some(id) {
            return false;
        }
        self.next = Some(now + self.timing.period);
        let Some(result) = outcome.result() else {
            return false;
        };
        if self.last == Some(result) {
            self.run += 1;
        } else {
            self.last = Some(result);
            self.run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => self.timing.failure_threshold,
            _ => self.timing.success_threshold,
        };
        if self.run < threshold {
            return false;
        }
        let changed = self.set(result);
        if self.kind != ProbeKind::Readiness && result == ProbeResult::Failure {
            // The container will be killed: stop probing until a new one appears.
            self.on_hold = true;
            self.run = 0;
        }
        changed
    }
}

/// A probe to run now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The container's name.
    pub container: String,
    /// Which probe.
    pub kind: ProbeKind,
    /// The runtime container it probes.
    pub id: String,
    /// Its timeout.
    pub timeout: Duration,
}

/// All probes of one pod (upstream `prober.manager` for one pod): a worker per container
/// and probe kind, for app containers and restartable (sidecar) init containers.
#[derive(Debug, Clone, Default)]
pub struct Prober {
    workers: Vec<(String, ProbeKind, Worker)>,
}

/// Whether `container` is an init container that keeps running (a sidecar).
pub fn is_restartable_init(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

impl Prober {
    /// The workers `pod`'s spec asks for.
    pub fn new(pod: &Pod) -> Self {
        let Some(spec) = &pod.spec else {
            return Prober::default();
        };
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| is_restartable_init(c));
        let mut workers = Vec::new();
        for container in spec.containers.iter().chain(sidecars) {
            for (kind, probe) in [
                (ProbeKind::Startup, &container.startup_probe),
                (ProbeKind::Liveness, &container.liveness_probe),
                (ProbeKind::Readiness, &container.readiness_probe),
            ] {
                if let Some(probe) = probe {
                    workers.push((
                        container.name.clone(),
                        kind,
                        Worker::new(kind, Timing::of(probe)),
                    ));
                }
            }
        }
        Prober { workers }
    }

    /// Whether the pod has any probe.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    fn worker(&self, container: &str, kind: ProbeKind) -> Option<&Worker> {
        self.workers
            .iter()
            .find(|(c, k, _)| c == container && *k == kind)
            .map(|(_, _, w)| w)
    }

    /// Upstream `isContainerStarted` for a running container `id`: its startup probe
    /// succeeded, or it has none.
    pub fn started(&self, container: &str, id: &str) -> bool {
        match self.worker(container, ProbeKind::Startup) {
            Some(worker) => worker.result(id) == Some(ProbeResult::Success),
            None => true,
        }
    }

    /// Upstream `UpdatePodStatus` for a running, started container `id`: its readiness
    /// probe succeeded, or it has none.
    pub fn ready(&self, container: &str, id: &str) -> bool {
        match self.worker(container, ProbeKind::Readiness) {
            Some(worker) => worker.result(id) == Some(ProbeResult::Success),
            None => true,
        }
    }

    /// The probe whose failure means container `id` must be killed (upstream
    /// `computePodActions`: liveness first, then startup).
    pub fn failed(&self, container: &str, id: &str) -> Option<ProbeKind> {
        [ProbeKind::Liveness, ProbeKind::Startup]
            .into_iter()
            .find(|kind| {
                self.worker(container, *kind)
                    .is_some_and(|w| w.result(id) == Some(ProbeResult::Failure))
            })
    }

    /// Feeds every worker its container's state (`observed`: name → state); returns the
    /// probes to run now, the next instant something is due, and whether any published
    /// result changed.
    pub fn poll(
        &mut self,
        observed: &dyn Fn(&str) -> Option<Observed>,
        deleting: bool,
        never: bool,
        now: Instant,
    ) -> (Vec<Due>, Option<Instant>, bool) {
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let mut changed = false;
        // Startup workers first, so the others see this pass's "started".
        self.workers
            .sort_by_key(|(_, kind, _)| *kind != ProbeKind::Startup);
        for i in 0..self.workers.len() {
            let container = self.workers[i].0.clone();
            let state = observed(&container);
            let started = state
                .as_ref()
                .is_some_and(|s| s.running_since.is_some() && self.started(&container, &s.id));
            let (_, kind, worker) = &mut self.workers[i];
            let (poll, c) = worker.poll(state.as_ref(), started, deleting, never, now);
            changed |= c;
            match (poll, state) {
                (Poll::Probe, Some(state)) => due.push(Due {
                    container,
                    kind: *kind,
                    id: state.id,
                    timeout: worker.timing.timeout,
                }),
                (Poll::Until(at), _) => next = Some(next.map_or(at, |n| n.min(at))),
                _ => {}
            }
        }
        (due, next, changed)
    }

    /// Takes in the outcome of `due`; returns whether a published result changed.
    pub fn record(&mut self, due: &Due, outcome: &Outcome, now: Instant) -> bool {
        self.workers
            .iter_mut()
            .find(|(c, k, _)| *c == due.container && *k == due.kind)
            .is_some_and(|(_, _, w)| w.record(&due.id, outcome, now))
    }

    /// When the earliest probe recorded so far is due again.
    pub fn next_period(&self) -> Option<Instant> {
        self.workers.iter().filter_map(|(_, _, w)| w.next).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn timing(success: u32, failure: u32) -> Timing {
        Timing {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    fn running(id: &str, since: Instant) -> Observed {
        Observed {
            id: id.into(),
            running_since: Some(since),
            terminated: false,
        }
    }

    #[test]
    fn timing_defaults_follow_the_api() {
        let t = Timing::of(&Probe::default());
        assert_eq!(
            (t.initial_delay, t.period, t.timeout),
            (
                Duration::ZERO,
                Duration::from_secs(10),
                Duration::from_secs(1)
            )
        );
        assert_eq!((t.success_threshold, t.failure_threshold), (1, 3));
        let t = Timing::of(&Probe {
            period_seconds: Some(2),
            timeout_seconds: Some(0),
            failure_threshold: Some(1),
            ..Default::default()
        });
        assert_eq!(t.period, Duration::from_secs(2));
        assert_eq!(t.timeout, Duration::from_secs(1));
        assert_eq!(t.failure_threshold, 1);
    }

    /// One step of a worker's life: what it sees, what it is told, what it must answer.
    enum Step {
        Poll {
            at: u64,
            observed: Option<Observed>,
            started: bool,
            want: Poll,
        },
        Record {
            at: u64,
            outcome: Outcome,
            changed: bool,
        },
        Result(Option<ProbeResult>),
    }

    fn run(kind: ProbeKind, timing: Timing, t0: Instant, steps: Vec<Step>) {
        let mut worker = Worker::new(kind, timing);
        let secs = |s: u64| t0 + Duration::from_secs(s);
        for (n, step) in steps.into_iter().enumerate() {
            match step {
                Step::Poll {
                    at,
                    observed,
                    started,
                    want,
                } => {
                    let (got, _) = worker.poll(observed.as_ref(), started, false, false, secs(at));
                    assert_eq!(got, want, "{kind:?} step {n}");
                }
                Step::Record {
                    at,
                    outcome,
                    changed,
                } => assert_eq!(
                    worker.record("c1", &outcome, secs(at)),
                    changed,
                    "{kind:?} step {n}"
                ),
                Step::Result(want) => assert_eq!(worker.result("c1"), want, "{kind:?} step {n}"),
            }
        }
    }

    #[test]
    fn workers_follow_do_probe() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let fail = || Outcome::Failure(String::new());
        let ok = || Outcome::Success(String::new());
        let poll = |at: u64, started: bool, want: Poll| Step::Poll {
            at,
            observed: Some(running("c1", t0)),
            started,
            want,
        };
        // Readiness: not ready until it passes; held back by initialDelay and by startup;
        // failures count up to the threshold.
        run(
            ProbeKind::Readiness,
            timing(1, 2),
            t0,
            vec![
                poll(0, true, Poll::Until(at(5))),
                Step::Result(Some(ProbeResult::Failure)),
                poll(6, false, Poll::Idle),
                poll(6, true, Poll::Probe),
                Step::Record {
                    at: 6,
                    outcome: ok(),
                    changed: true,
                },
                Step::Result(Some(ProbeResult::Success)),
                poll(7, true, Poll::Until(at(16))),
                poll(16, true, Poll::Probe),
                Step::Record {
                    at: 16,
                    outcome: fail(),
                    changed: false,
                },
                Step::Result(Some(ProbeResult::Success)),
                Step::Record {
                    at: 26,
                    outcome: fail(),
                    changed: true,
                },
                Step::Result(Some(ProbeResult::Failure)),
                // Readiness keeps probing after failing.
                poll(36, true, Poll::Probe),
                // A prober error is thrown away.
                Step::Record {
                    at: 36,
                    outcome: Outcome::Error("port x not found".into()),
                    changed: false,
                },
                Step::Record {
                    at: 46,
                    outcome: ok(),
                    changed: true,
                },
            ],
        );
        // Liveness: alive from the start; after failureThreshold failures it holds until
        // a new container appears, which starts alive again.
        run(
            ProbeKind::Liveness,
            timing(1, 3),
            t0,
            vec![
                poll(5, true, Poll::Probe),
                Step::Result(Some(ProbeResult::Success)),
                Step::Record {
                    at: 5,
                    outcome: fail(),
                    changed: false,
                },
                Step::Record {
                    at: 15,
                    outcome: fail(),
                    changed: false,
                },
                Step::Record {
                    at: 25,
                    outcome: ok(),
                    changed: false,
                },
                Step::Record {
                    at: 35,
                    outcome: fail(),
                    changed: false,
                },
                Step::Record {
                    at: 45,
                    outcome: fail(),
                    changed: false,
                },
                Step::Record {
                    at: 55,
                    outcome: fail(),
                    changed: true,
                },
                Step::Result(Some(ProbeResult::Failure)),
                poll(100, true, Poll::Idle),
                Step::Poll {
                    at: 101,
                    observed: Some(running("c2", at(100))),
                    started: true,
                    want: Poll::Until(at(105)),
                },
                Step::Result(None),
            ],
        );
        // Startup: unknown until it passes; once started it stops probing.
        run(
            ProbeKind::Startup,
            timing(1, 3),
            t0,
            vec![
                Step::Poll {
                    at: 0,
                    observed: None,
                    started: false,
                    want: Poll::Idle,
                },
                poll(5, false, Poll::Probe),
                Step::Result(Some(ProbeResult::Unknown)),
                Step::Record {
                    at: 5,
                    outcome: ok(),
                    changed: true,
                },
                poll(20, true, Poll::Idle),
                // An exited container is a failure.
                Step::Poll {
                    at: 30,
                    observed: Some(Observed {
                        id: "c1".into(),
                        running_since: None,
                        terminated: true,
                    }),
                    started: false,
                    want: Poll::Idle,
                },
                Step::Result(Some(ProbeResult::Failure)),
            ],
        );
    }

    #[test]
    fn deletion_stops_liveness_but_not_readiness() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(60);
        let mut liveness = Worker::new(ProbeKind::Liveness, timing(1, 1));
        let mut readiness = Worker::new(ProbeKind::Readiness, timing(1, 1));
        let obs = running("c1", t0);
        assert_eq!(
            liveness.poll(Some(&obs), true, true, false, later).0,
            Poll::Idle
        );
        assert_eq!(liveness.result("c1"), Some(ProbeResult::Success));
        assert_eq!(
            readiness.poll(Some(&obs), true, true, false, later).0,
            Poll::Probe
        );
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec}))
            .expect("pod")
    }

    #[test]
    fn the_prober_gates_liveness_and_readiness_on_startup() {
        let pod = pod(json!({
            "initContainers": [
                {"name": "side", "image": "i", "restartPolicy": "Always",
                 "readinessProbe": {"exec": {"command": ["true"]}}},
                {"name": "init", "image": "i"},
            ],
            "containers": [
                {"name": "app", "image": "i",
                 "startupProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                 "livenessProbe": {"exec": {"command": ["true"]}, "failureThreshold": 1},
                 "readinessProbe": {"exec": {"command": ["true"]}}},
                {"name": "plain", "image": "i"},
            ],
        }));
        let mut prober = Prober::new(&pod);
        let t0 = Instant::now();
        let observed = |name: &str| (name == "app").then(|| running("a1", t0));
        let (due, _, _) = prober.poll(&observed, false, false, t0);
        let kinds: Vec<(&str, ProbeKind)> =
            due.iter().map(|d| (d.container.as_str(), d.kind)).collect();
        assert_eq!(kinds, vec![("app", ProbeKind::Startup)]);
        assert!(!prober.started("app", "a1") && !prober.ready("app", "a1"));
        assert!(prober.started("plain", "p1") && prober.ready("plain", "p1"));
        assert!(prober.record(&due[0], &Outcome::Success(String::new()), t0));
        assert!(prober.started("app", "a1"));
        let (due, _, _) = prober.poll(&observed, false, false, t0);
        let mut kinds: Vec<ProbeKind> = due.iter().map(|d| d.kind).collect();
        kinds.sort();
        assert_eq!(kinds, vec![ProbeKind::Liveness, ProbeKind::Readiness]);
        let liveness = due
            .iter()
            .find(|d| d.kind == ProbeKind::Liveness)
            .expect("liveness");
        prober.record(liveness, &Outcome::Failure("boom".into()), t0);
        assert_eq!(prober.failed("app", "a1"), Some(ProbeKind::Liveness));
        assert_eq!(prober.failed("app", "a2"), None);
        // The sidecar's readiness probe has a worker; the plain init container has none.
        assert!(!prober.ready("side", "s1"));
    }

    fn container(ports: serde_json::Value) -> Container {
        serde_json::from_value(json!({"name": "c", "ports": ports})).expect("container")
    }

    #[test]
    fn ports_resolve_as_upstream() {
        let c = container(json!([{"name": "http", "containerPort": 8080}]));
        let cases = [
            (IntOrString::Int(80), Ok(80)),
            (IntOrString::String("http".into()), Ok(8080)),
            (IntOrString::String("81".into()), Ok(81)),
            (
                IntOrString::String("web".into()),
                Err(ProbeError::PortNotFound("web".into())),
            ),
            (IntOrString::Int(0), Err(ProbeError::InvalidPort(0))),
            (IntOrString::Int(70000), Err(ProbeError::InvalidPort(70000))),
        ];
        for (port, want) in cases {
            assert_eq!(resolve_port(&port, &c), want, "{port:?}");
        }
        assert_eq!(
            ProbeError::PortNotFound("web".into()).to_string(),
            "port web not found"
        );
    }

    #[test]
    fn http_requests_follow_new_request_for_http_get_action() {
        let c = container(json!([{"name": "http", "containerPort": 8080}]));
        let action: HTTPGetAction = serde_json::from_value(json!({
            "port": "http", "path": "healthz?x=1", "scheme": "HTTPS",
            "httpHeaders": [{"name": "X-Custom", "value": "1"}, {"name": "Accept", "value": ""}],
        }))
        .expect("action");
        let get = http_get(&action, &c, "10.244.0.5", "kube-probe/1.33").expect("get");
        assert_eq!(get.url(), "https://10.244.0.5:8080/healthz?x=1");
        assert_eq!(get.host_header(), "10.244.0.5:8080");
        assert_eq!(
            get.headers,
            vec![
                ("X-Custom".to_string(), "1".to_string()),
                ("User-Agent".to_string(), "kube-probe/1.33".to_string()),
            ]
        );
        let action: HTTPGetAction = serde_json::from_value(json!({
            "port": 80, "host": "example.internal",
            "httpHeaders": [{"name": "Host", "value": "svc.local"}],
        }))
        .expect("action");
        let get = http_get(&action, &c, "10.244.0.5", "kube-probe/1.33").expect("get");
        assert_eq!(get.url(), "http://example.internal:80/");
        assert_eq!(get.host_header(), "svc.local");
        assert!(get.headers.contains(&("Accept".into(), "*/*".into())));
        assert_eq!(probe_agent(), "kube-probe/1.33");
        assert_eq!(lifecycle_agent(), "kube-lifecycle/1.33");
    }

    #[test]
    fn redirects_stay_on_the_host() {
        let get = HttpGet {
            scheme: "http".into(),
            host: "10.0.0.5".into(),
            port: 8080,
            path: "/a/b?x=1".into(),
            headers: vec![],
        };
        let path = |status: u16, location: Option<&str>| {
            redirect(&get, status, location).map(|g| (g.scheme, g.port, g.path))
        };
        let cases = [
            (302, Some("/c"), Some(("http", 8080, "/c"))),
            (301, Some("d"), Some(("http", 8080, "/a/d"))),
            (
                307,
                Some("https://10.0.0.5:8443/e"),
                Some(("https", 8443, "/e")),
            ),
            (308, Some("http://10.0.0.5"), Some(("http", 80, "/"))),
            (302, Some("http://elsewhere:8080/"), None),
            (302, None, None),
            (304, Some("/c"), None),
            (200, Some("/c"), None),
        ];
        for (status, location, want) in cases {
            let want = want.map(|(s, p, path)| (s.to_string(), p, path.to_string()));
            assert_eq!(path(status, location), want, "{status} {location:?}");
        }
    }

    #[test]
    fn outcomes_and_messages_follow_upstream() {
        let cases = [
            (200, Outcome::Success("ok".into())),
            (204, Outcome::Success("ok".into())),
            (
                302,
                Outcome::Warning("Probe terminated redirects, Response body: ok".into()),
            ),
            (
                404,
                Outcome::Failure("HTTP probe failed with statuscode: 404".into()),
            ),
            (
                500,
                Outcome::Failure("HTTP probe failed with statuscode: 500".into()),
            ),
        ];
        for (status, want) in cases {
            assert_eq!(http_outcome(status, "ok"), want, "{status}");
        }
        assert_eq!(
            Outcome::Failure("HTTP probe failed with statuscode: 500".into())
                .event(ProbeKind::Liveness),
            Some((
                "Warning",
                "Unhealthy",
                "Liveness probe failed: HTTP probe failed with statuscode: 500".into()
            ))
        );
        assert_eq!(
            Outcome::Failure(String::new())
                .event(ProbeKind::Readiness)
                .map(|e| e.2),
            Some("Readiness probe failed: ".into())
        );
        assert_eq!(
            Outcome::Success(String::new()).event(ProbeKind::Startup),
            None
        );
        assert_eq!(
            dial_message("10.0.0.1", 80, &DialError::Refused),
            "dial tcp 10.0.0.1:80: connect: connection refused"
        );
        assert_eq!(
            dial_message("::1", 80, &DialError::Timeout),
            "dial tcp [::1]:80: i/o timeout"
        );
        let get = HttpGet {
            scheme: "http".into(),
            host: "10.0.0.1".into(),
            port: 8080,
            path: "/".into(),
            headers: vec![],
        };
        assert_eq!(
            http_error_message(&get, &DialError::Refused, false),
            "Get \"http://10.0.0.1:8080/\": dial tcp 10.0.0.1:8080: connect: connection refused"
        );
        assert_eq!(
            http_error_message(&get, &DialError::Timeout, true),
            "Get \"http://10.0.0.1:8080/\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        );
        assert_eq!(
            exec_timeout_message(&["sleep".into(), "5".into()]),
            "command \"sleep 5\" timed out"
        );
    }

    #[test]
    fn grpc_probes_target_the_pod_with_upstreams_messages() {
        let c: Container = serde_json::from_value(serde_json::json!({"name": "app"})).expect("c");
        let probe: Probe =
            serde_json::from_value(serde_json::json!({"grpc": {"port": 9090, "service": "db"}}))
                .expect("probe");
        assert_eq!(
            probe_handler(&probe, &c, "10.244.0.5", "kube-probe/1.33"),
            Ok(Handler::Grpc {
                host: "10.244.0.5".into(),
                port: 9090,
                service: "db".into()
            })
        );
        let bad: Probe =
            serde_json::from_value(serde_json::json!({"grpc": {"port": 0}})).expect("p");
        assert_eq!(
            probe_handler(&bad, &c, "10.244.0.5", "a"),
            Err(ProbeError::InvalidPort(0))
        );
        let second = Duration::from_secs(1);
        let cases = [
            (
                GrpcFailure::ConnectTimeout,
                "timeout: failed to connect service \"10.244.0.5:9090\" within 1s: context deadline exceeded",
            ),
            (
                GrpcFailure::RpcTimeout,
                "timeout: health rpc did not complete within 1s",
            ),
            (
                GrpcFailure::Unimplemented("unknown service grpc.health.v1.Health".into()),
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): unknown service grpc.health.v1.Health",
            ),
            (
                GrpcFailure::Unhealthy("NOT_SERVING".into()),
                "service unhealthy (responded with \"NOT_SERVING\")",
            ),
        ];
        for (failure, want) in cases {
            assert_eq!(grpc_message("10.244.0.5", 9090, second, &failure), want);
        }
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
    }
}
