//! The webhook backend in upstream's batch mode: events are buffered, sent as one
//! `audit.k8s.io/v1` `EventList` once `max_batch_size` are waiting or the oldest has waited
//! `max_batch_wait`, to the server a kubeconfig names (its TLS and credentials), retried with
//! back-off; a full buffer drops events rather than slowing requests.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

/// Upstream's `--audit-webhook-*` batch options.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookOptions {
    /// A kubeconfig naming the receiver (`--audit-webhook-config-file`).
    pub config_file: PathBuf,
    /// Events buffered before new ones are dropped (`-batch-buffer-size`, 10000).
    pub buffer_size: usize,
    /// Events per request at most (`-batch-max-size`, 400).
    pub max_batch_size: usize,
    /// How long the first buffered event waits for others (`-batch-max-wait`, 30 s).
    pub max_batch_wait: Duration,
    /// The first retry's delay (`--audit-webhook-initial-backoff`, 10 s), ×1.5 each time.
    pub initial_backoff: Duration,
}

impl WebhookOptions {
    /// Upstream's defaults for a receiver named by `config_file`.
    pub fn new(config_file: PathBuf) -> Self {
        WebhookOptions {
            config_file,
            buffer_size: 10_000,
            max_batch_size: 400,
            max_batch_wait: Duration::from_secs(30),
            initial_backoff: Duration::from_secs(10),
        }
    }
}

/// Attempts per batch before it is dropped (upstream's default back-off has five steps).
const ATTEMPTS: u32 = 5;

/// A running webhook backend.
#[derive(Debug, Clone)]
pub struct WebhookBackend {
    events: mpsc::Sender<Bytes>,
}

impl WebhookBackend {
    /// Reads the kubeconfig and starts the sender; a kubeconfig that cannot be used is an
    /// error now, not at the first event.
    pub async fn start(options: WebhookOptions) -> Result<WebhookBackend, String> {
        let file = options.config_file.display().to_string();
        let kubeconfig = kube::config::Kubeconfig::read_from(&options.config_file)
            .map_err(|err| format!("{file}: {err}"))?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|err| format!("{file}: {err}"))?;
        // The client joins its base URL's path and the request's: the whole path goes in the
        // request, so that the receiver sees exactly the URL the kubeconfig names.
        let path = config
            .cluster_url
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let mut base = http::uri::Parts::default();
        base.scheme = config.cluster_url.scheme().cloned();
        base.authority = config.cluster_url.authority().cloned();
        base.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        config.cluster_url = http::Uri::from_parts(base).map_err(|err| format!("{file}: {err}"))?;
        let client = kube::Client::try_from(config).map_err(|err| format!("{file}: {err}"))?;
        let (events, received) = mpsc::channel(options.buffer_size.max(1));
        tokio::spawn(send_batches(client, path, options, received));
        Ok(WebhookBackend { events })
    }

    /// Buffers one encoded event; drops it (and says so) when the buffer is full.
    pub fn send(&self, line: Bytes) {
        if self.events.try_send(line).is_err() {
            tracing::error!("the audit webhook's buffer is full; an event was dropped");
        }
    }
}

async fn send_batches(
    client: kube::Client,
    path: String,
    options: WebhookOptions,
    mut received: mpsc::Receiver<Bytes>,
) {
    let mut batch = Vec::with_capacity(options.max_batch_size);
    while let Some(first) = received.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + options.max_batch_wait;
        while batch.len() < options.max_batch_size {
            match tokio::time::timeout_at(deadline, received.recv()).await {
                Ok(Some(event)) => batch.push(event),
                Ok(None) | Err(_) => break,
            }
        }
        let body = super::event::event_list(&batch);
        let mut delay = options.initial_backoff;
        for attempt in 1..=ATTEMPTS {
            match post(&client, &path, body.clone()).await {
                Ok(()) => break,
                Err(err) if attempt == ATTEMPTS => {
                    tracing::error!(%err, events = batch.len(), "the audit webhook refused a batch; its events were dropped");
                }
                Err(err) => {
                    tracing::warn!(%err, attempt, "the audit webhook refused a batch; retrying");
                    tokio::time::sleep(delay).await;
                    delay = delay.mul_f64(1.5);
                }
            }
        }
        batch.clear();
    }
}

async fn post(client: &kube::Client, path: &str, body: Vec<u8>) -> Result<(), String> {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|err| err.to_string())?;
    let response = client
        .send(request.map(kube::client::Body::from))
        .await
        .map_err(|err| err.to_string())?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {}", response.status()))
    }
}
