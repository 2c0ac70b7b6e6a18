//! A cluster's metrics panel: request rate, mean latency, throttled (429) and failed (5xx)
//! requests, from the cluster's own `/metrics` (the service's request counters for that
//! tenant), sampled every two seconds while the page is open and drawn as small SVG charts
//! rendered here.

use std::collections::VecDeque;
use std::time::Instant;

use axum::Router;
use axum::extract::Path;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use maud::{Markup, html};

use crate::clusters::cluster_tabs;
use crate::layout::{Section, page};
use crate::upstream::{Upstream, UpstreamError, segment};
use crate::workloads::Tenant;
use crate::{Console, Signed};

/// How many samples a chart keeps (two minutes at one per two seconds).
pub(crate) const KEPT: usize = 60;

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new().route("/console/clusters/{name}/metrics", get(metrics_page))
}

/// The cluster's request counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    pub at: Instant,
    /// Requests answered, all verbs and codes.
    pub requests: f64,
    /// Requests answered 429 (throttled).
    pub throttled: f64,
    /// Requests answered 5xx.
    pub failed: f64,
    /// Seconds spent answering, all verbs.
    pub seconds: f64,
    /// Objects the cluster stores.
    pub objects: f64,
}

/// The counters in a Prometheus text exposition.
pub(crate) fn parse(text: &str, at: Instant) -> Sample {
    let mut sample = Sample {
        at,
        requests: 0.0,
        throttled: 0.0,
        failed: 0.0,
        seconds: 0.0,
        objects: 0.0,
    };
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or_default();
        match name {
            "apiserver_request_total" => {
                sample.requests += value;
                if series.contains("code=\"429\"") {
                    sample.throttled += value;
                }
                if series.contains("code=\"5") {
                    sample.failed += value;
                }
            }
            "apiserver_request_duration_seconds_sum" => sample.seconds += value,
            "flotilla_cluster_objects" => sample.objects = value,
            _ => {}
        }
    }
    sample
}

/// A series of per-interval values from consecutive samples.
fn series(samples: &VecDeque<Sample>, value: impl Fn(&Sample, &Sample) -> f64) -> Vec<f64> {
    samples
        .iter()
        .zip(samples.iter().skip(1))
        .map(|(before, after)| value(before, after).max(0.0))
        .collect()
}

fn per_second(before: &Sample, after: &Sample, counter: impl Fn(&Sample) -> f64) -> f64 {
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    if seconds <= 0.0 {
        0.0
    } else {
        (counter(after) - counter(before)) / seconds
    }
}

/// One small chart: its title, its latest value and a polyline of `values`.
fn chart(title: &str, unit: &str, values: &[f64]) -> Markup {
    let (width, height) = (240.0, 60.0);
    // One value is a level line until the next one comes.
    let values: Vec<f64> = match values {
        [only] => vec![*only, *only],
        _ => values.to_vec(),
    };
    let values = values.as_slice();
    let top = values.iter().copied().fold(0.0_f64, f64::max).max(1e-9);
    let step = if values.len() > 1 {
        width / (values.len() - 1) as f64
    } else {
        width
    };
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                i as f64 * step,
                height - v / top * (height - 4.0) - 2.0
            )
        })
        .collect();
    let latest = values.last().copied();
    html! {
        figure.chart {
            figcaption {
                strong { (title) } " "
                span.muted { @match latest { Some(v) if unit.is_empty() => { (format!("{v:.0}")) } Some(v) => { (format!("{v:.2} {unit}")) } None => { "measuring…" } } }
            }
            svg viewBox=(format!("0 0 {width} {height}")) role="img" aria-label=(format!("{title} over the last two minutes")) {
                @if points.len() > 1 { polyline points=(points.join(" ")) {} }
            }
        }
    }
}

/// The whole panel for `samples` (one element, replaced as it updates).
pub(crate) fn panel(samples: &VecDeque<Sample>) -> Markup {
    let rate = series(samples, |a, b| per_second(a, b, |s| s.requests));
    let latency = series(samples, |a, b| {
        let requests = b.requests - a.requests;
        if requests <= 0.0 {
            0.0
        } else {
            (b.seconds - a.seconds) / requests * 1000.0
        }
    });
    let throttled = series(samples, |a, b| per_second(a, b, |s| s.throttled));
    let failed = series(samples, |a, b| per_second(a, b, |s| s.failed));
    let objects: Vec<f64> = samples.iter().skip(1).map(|s| s.objects).collect();
    let total = samples.back().map_or(0.0, |s| s.requests);
    html! {
        div #metrics-panel {
            div.charts {
                (chart("Requests", "/s", &rate))
                (chart("Mean latency", "ms", &latency))
                (chart("Throttled (429)", "/s", &throttled))
                (chart("Server errors (5xx)", "/s", &failed))
                (chart("Objects stored", "", &objects))
            }
            p.muted { (format!("{total:.0}")) " requests answered since the service started." }
        }
    }
}

/// One sample of cluster `tenant`'s counters.
pub(crate) async fn sample(
    upstream: &Upstream<'_>,
    tenant: &Tenant,
) -> Result<Sample, UpstreamError> {
    let bytes = upstream
        .with_bearer(&tenant.token)
        .call_bytes(
            http::Method::GET,
            &format!("{}/metrics", tenant.prefix),
            None,
        )
        .await?;
    Ok(parse(&String::from_utf8_lossy(&bytes), Instant::now()))
}

async fn metrics_page(signed: Signed, Path(name): Path<String>) -> Response {
    let upstream = signed.upstream();
    let tenant = match crate::workloads::tenant(&upstream, &name).await {
        Ok(tenant) => tenant,
        Err(err) => return signed.failed(&err),
    };
    let first = match sample(&upstream, &tenant).await {
        Ok(first) => first,
        Err(err) => return signed.failed(&err),
    };
    let body = html! {
        h1 { "Cluster " (name) }
        (cluster_tabs(&name, "metrics"))
        p.muted { "This cluster's API, sampled every two seconds while this page is open." }
        div #metrics-live data-live=(format!("/console/live/clusters/{}/metrics", segment(&name))) {
            (panel(&VecDeque::from([first])))
        }
    };
    Html(
        page(
            Some(&signed.session),
            Section::Clusters,
            &format!("Metrics of {name}"),
            body,
        )
        .into_string(),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const EXPOSITION: &str = r#"# HELP apiserver_request_total Counter of apiserver requests.
apiserver_request_total{verb="GET",code="200"} 100
apiserver_request_total{verb="POST",code="429"} 4
apiserver_request_total{verb="PUT",code="503"} 1
apiserver_request_duration_seconds_sum{verb="GET"} 0.5
apiserver_request_duration_seconds_sum{verb="POST"} 0.25
apiserver_request_duration_seconds_bucket{verb="GET",le="0.1"} 100
flotilla_cluster_objects 42
"#;

    #[test]
    fn counters_are_read_and_charted_as_rates() {
        let start = Instant::now();
        let first = parse(EXPOSITION, start);
        assert_eq!(
            (first.requests, first.throttled, first.failed),
            (105.0, 4.0, 1.0)
        );
        assert!((first.seconds - 0.75).abs() < 1e-9);
        let later = Sample {
            at: start + Duration::from_secs(2),
            requests: 125.0,
            throttled: 8.0,
            failed: 1.0,
            seconds: 0.95,
            objects: 43.0,
        };
        let samples = VecDeque::from([first, later]);
        assert_eq!(
            series(&samples, |a, b| per_second(a, b, |s| s.requests)),
            vec![10.0]
        );
        let html = panel(&samples).into_string();
        assert!(
            html.contains("10.00 /s") && html.contains("10.00 ms") && html.contains("2.00 /s"),
            "{html}"
        );
    }
}
