//! The proxy's HTTP servers: `/healthz`, `/livez` and `/metrics` on `--healthz-bind-address`
//! (upstream `ProxyHealthServer`), and one listener per `healthCheckNodePort` answering how
//! many local endpoints a Service has (upstream `ServiceHealthServer`). The health and
//! response logic is sans-IO; the servers are small hyper loops.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::model::NamespacedName;

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Errors of the servers.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// A listener could not be bound.
    #[error("failed to start proxy healthz on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Debug, Default)]
struct HealthState {
    last_updated: Option<SystemTime>,
    oldest_pending_queued: Option<SystemTime>,
    node_eligible: bool,
}

/// Whether the rules are fresh: unhealthy once an update has been queued and not applied
/// within the health timeout (upstream: twice the sync period).
#[derive(Debug)]
pub struct ProxyHealth {
    timeout: Duration,
    state: Mutex<HealthState>,
}

fn rfc3339(time: Option<SystemTime>) -> String {
    // Go marshals a zero time.Time as year 1.
    match time {
        Some(time) => chrono::DateTime::<chrono::Utc>::from(time)
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        None => "0001-01-01T00:00:00Z".to_string(),
    }
}

impl ProxyHealth {
    /// A health tracker with this timeout.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Mutex::new(HealthState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A change arrived that the rules do not show yet (upstream `QueuedUpdate`).
    pub fn queued_update(&self, now: SystemTime) {
        let mut state = self.lock();
        state.oldest_pending_queued.get_or_insert(now);
    }

    /// The rules were written (upstream `Updated`).
    pub fn updated(&self, now: SystemTime) {
        let mut state = self.lock();
        state.oldest_pending_queued = None;
        state.last_updated = Some(now);
    }

    /// The node exists, is not being deleted and is not tainted for deletion.
    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_eligible = eligible;
    }

    /// Whether the rules are fresh at `now`.
    pub fn healthy(&self, now: SystemTime) -> bool {
        let state = self.lock();
        match state.oldest_pending_queued {
            Some(queued) if state.last_updated.is_some() => {
                now.duration_since(queued).unwrap_or_default() < self.timeout
            }
            // Healthy while starting up (upstream: no proxier has reported yet).
            _ => true,
        }
    }

    /// The `/healthz` (`with_node`) or `/livez` answer at `now`: status and upstream's JSON
    /// (`lastUpdated`, `currentTime`, `nodeEligible`, `healthy`, per-family `status`).
    pub fn response(&self, now: SystemTime, with_node: bool) -> (StatusCode, String) {
        let healthy = self.healthy(now);
        let (last_updated, node_eligible) = {
            let state = self.lock();
            (state.last_updated, state.node_eligible)
        };
        let ok = healthy && (!with_node || node_eligible);
        // As upstream: a healthy answer reports "now" as lastUpdated.
        let reported = if ok { Some(now) } else { last_updated };
        let mut body = serde_json::Map::new();
        body.insert("lastUpdated".into(), rfc3339(reported).into());
        body.insert("currentTime".into(), rfc3339(Some(now)).into());
        if with_node {
            body.insert("nodeEligible".into(), node_eligible.into());
        }
        body.insert("healthy".into(), healthy.into());
        if last_updated.is_some() {
            body.insert(
                "status".into(),
                serde_json::json!({"IPv4": {"lastUpdated": rfc3339(last_updated), "healthy": healthy}}),
            );
        }
        let status = if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        (status, serde_json::Value::Object(body).to_string())
    }
}

/// A service health check answer (upstream `hcHandler`): 200 when the Service has local
/// endpoints and the proxy is healthy, else 503; the body and weight header as upstream.
pub fn service_health_response(
    service: &NamespacedName,
    local_endpoints: usize,
    proxy_healthy: bool,
) -> (StatusCode, String) {
    let status = if local_endpoints != 0 && proxy_healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {:?},\n\t\t\"name\": {:?}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        service.namespace, service.name, local_endpoints, proxy_healthy
    );
    (status, body)
}

/// Upstream's sync latency buckets: 1 ms doubling 15 times.
const BUCKETS: usize = 15;

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn bound(i: usize) -> f64 {
        0.001 * f64::from(1u32 << i)
    }

    fn observe(&mut self, seconds: f64) {
        for (i, count) in self.counts.iter_mut().enumerate() {
            if seconds <= Self::bound(i) {
                *count += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (i, count) in self.counts.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {count}", Self::bound(i));
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug, Default)]
struct MetricsState {
    sync: Histogram,
    full: Histogram,
    partial: Histogram,
    last_sync: Option<SystemTime>,
    sync_failures: u64,
    cleanup_failures: u64,
}

/// The proxy's Prometheus metrics (upstream's names).
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<MetricsState>,
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, MetricsState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one successful sync.
    pub fn observe_sync(&self, elapsed: Duration, full: bool, now: SystemTime) {
        let mut state = self.lock();
        let seconds = elapsed.as_secs_f64();
        state.sync.observe(seconds);
        if full {
            state.full.observe(seconds);
        } else {
            state.partial.observe(seconds);
        }
        state.last_sync = Some(now);
    }

    /// Records a failed nft transaction.
    pub fn sync_failed(&self) {
        self.lock().sync_failures += 1;
    }

    /// Records a failed stale-chain cleanup.
    pub fn cleanup_failed(&self) {
        self.lock().cleanup_failures += 1;
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let state = self.lock();
        let mut out = String::new();
        state.sync.write(
            &mut out,
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
        );
        state.full.write(
            &mut out,
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
        );
        state.partial.write(
            &mut out,
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
        );
        let last = state
            .last_sync
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let _ = writeln!(
            out,
            "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced\n# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\nkubeproxy_sync_proxy_rules_last_timestamp_seconds {last}"
        );
        let _ = writeln!(
            out,
            "# HELP kubeproxy_sync_proxy_rules_nftables_sync_failures_total Cumulative proxy nftables sync failures\n# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter\nkubeproxy_sync_proxy_rules_nftables_sync_failures_total {}",
            state.sync_failures
        );
        let _ = writeln!(
            out,
            "# HELP kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total Cumulative proxy nftables cleanup failures\n# TYPE kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total counter\nkubeproxy_sync_proxy_rules_nftables_cleanup_failures_total {}",
            state.cleanup_failures
        );
        out
    }
}

type Handler = Arc<dyn Fn(&str) -> (StatusCode, &'static str, String) + Send + Sync>;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response
            .headers_mut()
            .insert(http::header::CONTENT_TYPE, value);
    }
    if let Ok(value) = "nosniff".parse() {
        response
            .headers_mut()
            .insert("x-content-type-options", value);
    }
    response
}

/// Binds `addr` and serves `handler` (path → status, content type, body) until aborted.
async fn serve(addr: SocketAddr, handler: Handler) -> Result<JoinHandle<()>, HealthError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| HealthError::Bind { addr, source })?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let (status, content_type, body) = handler(request.uri().path());
                    async move { Ok::<_, Infallible>(respond(status, content_type, body)) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }))
}

/// Serves `/healthz`, `/livez` and `/metrics` on `addr`.
pub async fn serve_healthz(
    addr: SocketAddr,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) -> Result<JoinHandle<()>, HealthError> {
    let handler: Handler = Arc::new(move |path| match path {
        "/healthz" => {
            let (status, body) = health.response(SystemTime::now(), true);
            (status, "application/json", body)
        }
        "/livez" => {
            let (status, body) = health.response(SystemTime::now(), false);
            (status, "application/json", body)
        }
        "/metrics" => (
            StatusCode::OK,
            "text/plain; version=0.0.4",
            metrics.render(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "404 page not found\n".into(),
        ),
    });
    serve(addr, handler).await
}

/// The per-Service health check listeners (one per `healthCheckNodePort`).
pub struct ServiceHealthServer {
    bind_ip: std::net::IpAddr,
    health: Arc<ProxyHealth>,
    counts: Arc<Mutex<BTreeMap<u16, (NamespacedName, usize)>>>,
    listeners: BTreeMap<u16, JoinHandle<()>>,
}

impl ServiceHealthServer {
    /// Listeners bound on `bind_ip` (upstream binds the NodePort addresses).
    pub fn new(bind_ip: std::net::IpAddr, health: Arc<ProxyHealth>) -> Self {
        Self {
            bind_ip,
            health,
            counts: Arc::default(),
            listeners: BTreeMap::new(),
        }
    }

    /// Opens and closes listeners to match `services` (port → Service and its local ready
    /// endpoint count) and updates the counts they report.
    pub async fn sync(&mut self, services: BTreeMap<u16, (NamespacedName, usize)>) {
        self.listeners.retain(|port, handle| {
            let keep = services.contains_key(port);
            if !keep {
                handle.abort();
            }
            keep
        });
        for port in services.keys() {
            if self.listeners.contains_key(port) {
                continue;
            }
            let counts = self.counts.clone();
            let health = self.health.clone();
            let port_number = *port;
            let handler: Handler = Arc::new(move |_path| {
                let entry = counts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .get(&port_number)
                    .cloned();
                match entry {
                    Some((service, count)) => {
                        let (status, body) = service_health_response(
                            &service,
                            count,
                            health.healthy(SystemTime::now()),
                        );
                        (status, "application/json", body)
                    }
                    None => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", String::new()),
                }
            });
            match serve(SocketAddr::new(self.bind_ip, *port), handler).await {
                Ok(handle) => {
                    self.listeners.insert(*port, handle);
                }
                Err(err) => tracing::error!(%err, "failed to start healthcheck"),
            }
        }
        *self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = services;
    }
}

impl Drop for ServiceHealthServer {
    fn drop(&mut self) {
        for handle in self.listeners.values() {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fresh_then_stale() {
        let health = ProxyHealth::new(Duration::from_secs(60));
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        health.set_node_eligible(true);
        assert_eq!(
            health.response(t0, true).0,
            StatusCode::OK,
            "healthy while starting"
        );
        health.updated(t0);
        health.queued_update(t0 + Duration::from_secs(1));
        let (status, body) = health.response(t0 + Duration::from_secs(30), true);
        assert_eq!(status, StatusCode::OK, "a queued update is not late yet");
        let json: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(json["lastUpdated"], "2023-11-14T22:13:50Z");
        assert_eq!(json["currentTime"], "2023-11-14T22:13:50Z");
        assert_eq!(json["nodeEligible"], true);
        assert_eq!(
            json["status"]["IPv4"]["lastUpdated"],
            "2023-11-14T22:13:20Z"
        );
        let (status, body) = health.response(t0 + Duration::from_secs(62), true);
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let json: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(json["healthy"], false);
        assert_eq!(json["lastUpdated"], "2023-11-14T22:13:20Z");
        health.updated(t0 + Duration::from_secs(63));
        assert_eq!(
            health.response(t0 + Duration::from_secs(64), true).0,
            StatusCode::OK
        );
        health.set_node_eligible(false);
        assert_eq!(
            health.response(t0 + Duration::from_secs(64), true).0,
            StatusCode::SERVICE_UNAVAILABLE,
            "/healthz fails on a node being deleted"
        );
        assert_eq!(
            health.response(t0 + Duration::from_secs(64), false).0,
            StatusCode::OK,
            "/livez does not look at the node"
        );
    }

    #[test]
    fn service_health_as_upstream() {
        let service = NamespacedName::new("ns", "web");
        let (status, body) = service_health_response(&service, 2, true);
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"ns\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        assert_eq!(
            service_health_response(&service, 0, true).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            service_health_response(&service, 3, false).0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[test]
    fn metrics_text() {
        let metrics = Metrics::default();
        metrics.observe_sync(Duration::from_millis(3), false, SystemTime::UNIX_EPOCH);
        let text = metrics.render();
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.002\"} 0")
        );
        assert!(
            text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1")
        );
        assert!(text.contains("kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1"));
        assert!(text.contains("kubeproxy_sync_full_proxy_rules_duration_seconds_count 0"));
    }
}
