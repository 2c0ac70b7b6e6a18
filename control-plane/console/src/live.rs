//! Live updates: each open list holds one server-sent-events stream that looks at its source
//! every half second (through the same APIs as the page) and sends only the rows that changed
//! (`row`: their new HTML) or went away (`gone`); the page's script swaps them in. The stream
//! ends with the session.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Query};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::upstream::{UpstreamError, segment};
use crate::workloads::{PodQuery, Tenant, items, list_bodies, lists, pod_row, pod_row_id, tenant};
use crate::{Console, Signed, clusters, metrics, nodepools};

/// How often a stream looks at its source.
const INTERVAL: Duration = Duration::from_millis(500);
/// How often the metrics panel samples the cluster's counters.
const METRICS_INTERVAL: Duration = Duration::from_secs(2);
/// How long a cluster token is reused (they last 15 minutes).
const TOKEN_REUSE: Duration = Duration::from_secs(600);

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new()
        .route("/console/live/clusters", get(clusters_live))
        .route("/console/live/clusters/{name}", get(overview_live))
        .route("/console/live/clusters/{name}/nodepools", get(pools_live))
        .route("/console/live/clusters/{name}/pods", get(pods_live))
        .route("/console/live/clusters/{name}/metrics", get(metrics_live))
        .route(
            "/console/live/clusters/{name}/workloads",
            get(workloads_live),
        )
}

/// What a stream watches.
enum Source {
    /// One page of the account's clusters matching a filter.
    Clusters(crate::layout::Listing),
    /// One cluster's overview.
    Overview(String),
    /// One cluster's node pools.
    Pools(String),
    /// One page of one cluster's pods.
    Pods(String, PodQuery),
    /// One cluster's request metrics.
    Metrics(String),
    /// One cluster's nodes, namespaces, Deployments, Services and Events (each list's table
    /// body replaced whole).
    Workloads(String),
}

/// A stream's state between looks.
struct Watch {
    signed: Signed,
    source: Source,
    /// The parent element new rows go into.
    parent: &'static str,
    sent: BTreeMap<String, String>,
    queue: VecDeque<Event>,
    tenant: Option<(Tenant, Instant)>,
    /// The metrics samples so far (metrics only).
    samples: VecDeque<metrics::Sample>,
    first: bool,
}

impl Watch {
    /// The rows (element id → HTML) the source shows now.
    async fn snapshot(&mut self) -> Result<BTreeMap<String, String>, UpstreamError> {
        let upstream = self.signed.upstream();
        Ok(match &self.source {
            Source::Clusters(listing) => clusters::cluster_rows(&upstream, listing)
                .await?
                .0
                .iter()
                .map(|row| {
                    (
                        clusters::row_id(row.cluster["name"].as_str().unwrap_or_default()),
                        clusters::cluster_row(row).into_string(),
                    )
                })
                .collect(),
            Source::Overview(name) => {
                let answer = upstream
                    .get(&format!("/v1/clusters/{}", segment(name)))
                    .await?;
                BTreeMap::from([(
                    "overview".to_string(),
                    clusters::overview_facts(&answer["cluster"]).into_string(),
                )])
            }
            Source::Pools(name) => upstream
                .get(&format!("/v1/clusters/{}/nodepools", segment(name)))
                .await?["nodePools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|pool| {
                    (
                        nodepools::row_id(pool["name"].as_str().unwrap_or_default()),
                        nodepools::pool_row(&self.signed.session, name, pool).into_string(),
                    )
                })
                .collect(),
            Source::Pods(name, pods) => {
                let (name, path) = (name.clone(), pods.path());
                let tenant = self.tenant(&name).await?;
                items(&self.signed.upstream(), &tenant, &path)
                    .await?
                    .iter()
                    .map(|pod| (pod_row_id(pod), pod_row(pod).into_string()))
                    .collect()
            }
            Source::Workloads(name) => {
                let name = name.clone();
                let tenant = self.tenant(&name).await?;
                let lists = lists(&self.signed.upstream(), &tenant).await?;
                list_bodies(&name, &lists)
                    .into_iter()
                    .map(|(id, body)| (id.to_string(), body.into_string()))
                    .collect()
            }
            Source::Metrics(name) => {
                let due = self
                    .samples
                    .back()
                    .is_none_or(|last| last.at.elapsed() >= METRICS_INTERVAL);
                if due {
                    let name = name.clone();
                    let tenant = self.tenant(&name).await?;
                    let sample = metrics::sample(&self.signed.upstream(), &tenant).await?;
                    self.samples.push_back(sample);
                    while self.samples.len() > metrics::KEPT {
                        self.samples.pop_front();
                    }
                }
                BTreeMap::from([(
                    "metrics-panel".to_string(),
                    metrics::panel(&self.samples).into_string(),
                )])
            }
        })
    }

    /// Cluster `name`'s tenant API and a token for it, reused while the token is young.
    async fn tenant(&mut self, name: &str) -> Result<Tenant, UpstreamError> {
        match &self.tenant {
            Some((tenant, at)) if at.elapsed() < TOKEN_REUSE => Ok(tenant.clone()),
            _ => {
                let fresh = tenant(&self.signed.upstream(), name).await?;
                self.tenant = Some((fresh.clone(), Instant::now()));
                Ok(fresh)
            }
        }
    }

    /// Queues the events that turn what was sent into `now`.
    fn queue_changes(&mut self, now: BTreeMap<String, String>) {
        for (id, html) in &now {
            if self.first || self.sent.get(id) != Some(html) {
                let data = serde_json::json!({"id": id, "html": html, "parent": self.parent});
                self.queue
                    .push_back(Event::default().event("row").data(data.to_string()));
            }
        }
        if self.first {
            // The page was rendered before this stream's first look: a row that went away in
            // between was never sent, so the page is told the whole set and drops the rest.
            let data =
                serde_json::json!({"ids": now.keys().collect::<Vec<_>>(), "parent": self.parent});
            self.queue
                .push_back(Event::default().event("present").data(data.to_string()));
        }
        for id in self.sent.keys().filter(|id| !now.contains_key(*id)) {
            let data = serde_json::json!({"id": id});
            self.queue
                .push_back(Event::default().event("gone").data(data.to_string()));
        }
        self.sent = now;
        self.first = false;
    }
}

fn stream(signed: Signed, source: Source, parent: &'static str) -> Response {
    let watch = Watch {
        signed,
        source,
        parent,
        sent: BTreeMap::new(),
        queue: VecDeque::new(),
        tenant: None,
        samples: VecDeque::new(),
        first: true,
    };
    let events = futures::stream::unfold(watch, |mut watch| async move {
        loop {
            if let Some(event) = watch.queue.pop_front() {
                return Some((Ok::<Event, Infallible>(event), watch));
            }
            if watch.signed.session.expires <= crate::now() {
                return None;
            }
            if !watch.first {
                tokio::time::sleep(INTERVAL).await;
            }
            // A failed look (the service busy, the cluster going away) changes nothing shown.
            match watch.snapshot().await {
                Ok(now) => watch.queue_changes(now),
                Err(err) => {
                    tracing::debug!(error = %err, "a console live look failed");
                    // The first successful look still sends the whole set.
                    if watch.first {
                        tokio::time::sleep(INTERVAL).await;
                    }
                }
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn clusters_live(signed: Signed, Query(query): Query<HashMap<String, String>>) -> Response {
    stream(
        signed,
        Source::Clusters(crate::layout::Listing::from_query(&query)),
        "clusters",
    )
}

async fn overview_live(signed: Signed, Path(name): Path<String>) -> Response {
    stream(signed, Source::Overview(name), "overview-live")
}

async fn pools_live(signed: Signed, Path(name): Path<String>) -> Response {
    stream(signed, Source::Pools(name), "pools")
}

async fn pods_live(
    signed: Signed,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    stream(
        signed,
        Source::Pods(name, PodQuery::from_query(&query)),
        "pods",
    )
}

async fn workloads_live(signed: Signed, Path(name): Path<String>) -> Response {
    stream(signed, Source::Workloads(name), "workloads-live")
}

async fn metrics_live(signed: Signed, Path(name): Path<String>) -> Response {
    stream(signed, Source::Metrics(name), "metrics-live")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> Watch {
        let console = Console::new(Router::new(), |_| http::Extensions::new(), &[0; 32]);
        Watch {
            signed: Signed {
                session: crate::session::Session::new("k".into(), Some("a".into()), 0),
                connection: http::Extensions::new(),
                console,
            },
            source: Source::Clusters(crate::layout::Listing::from_query(&HashMap::new())),
            parent: "clusters",
            sent: BTreeMap::new(),
            queue: VecDeque::new(),
            tenant: None,
            samples: VecDeque::new(),
            first: true,
        }
    }

    fn rows(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_first_look_sends_every_row_then_only_changes() {
        let mut watch = watch();
        watch.queue_changes(rows(&[("a", "1"), ("b", "2")]));
        assert_eq!(watch.queue.len(), 3, "everything, once, then the whole set");
        let present = format!("{:?}", watch.queue.back());
        assert!(
            present.contains("present") && present.contains(r#"\"ids\":[\"a\",\"b\"]"#),
            "{present}"
        );
        watch.queue.clear();
        watch.queue_changes(rows(&[("a", "1"), ("b", "2")]));
        assert!(watch.queue.is_empty(), "nothing changed");
        watch.queue_changes(rows(&[("a", "1'"), ("c", "3")]));
        assert_eq!(watch.queue.len(), 3, "a changed, c new, b gone");
        assert_eq!(watch.sent, rows(&[("a", "1'"), ("c", "3")]));
    }
}
