//! Prometheus-format request metrics (`/metrics`): counts and latency histograms per verb.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// Latency bucket bounds in seconds (a subset of kube-apiserver's).
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 60.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    total: u64,
    sum: f64,
}

/// Request metrics of the process.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    latency: Mutex<BTreeMap<String, Histogram>>,
    /// Other components' metrics in the same process (the controllers' work queues), which
    /// the apiserver does not depend on: each renders its own text.
    others: Mutex<Vec<fn() -> String>>,
}

impl Metrics {
    /// Adds another component's metrics to what [`Metrics::render`] writes.
    pub fn add_source(&self, render: fn() -> String) {
        if let Ok(mut others) = self.others.lock() {
            others.push(render);
        }
    }

    /// Records one finished request.
    pub fn observe(&self, verb: &str, code: u16, elapsed: Duration) {
        if let Ok(mut requests) = self.requests.lock() {
            *requests.entry((verb.to_string(), code)).or_default() += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            let histogram = latency.entry(verb.to_string()).or_default();
            let seconds = elapsed.as_secs_f64();
            for (i, bound) in BUCKETS.iter().enumerate() {
                if seconds <= *bound {
                    histogram.counts[i] += 1;
                }
            }
            histogram.total += 1;
            histogram.sum += seconds;
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP apiserver_request_total Counter of apiserver requests broken out by verb and HTTP response code.\n");
        out.push_str("# TYPE apiserver_request_total counter\n");
        if let Ok(requests) = self.requests.lock() {
            for ((verb, code), count) in requests.iter() {
                out.push_str(&format!(
                    "apiserver_request_total{{verb=\"{verb}\",code=\"{code}\"}} {count}\n"
                ));
            }
        }
        out.push_str("# HELP apiserver_request_duration_seconds Response latency distribution in seconds for each verb.\n");
        out.push_str("# TYPE apiserver_request_duration_seconds histogram\n");
        if let Ok(latency) = self.latency.lock() {
            for (verb, h) in latency.iter() {
                for (i, bound) in BUCKETS.iter().enumerate() {
                    out.push_str(&format!(
                        "apiserver_request_duration_seconds_bucket{{verb=\"{verb}\",le=\"{bound}\"}} {}\n",
                        h.counts[i]
                    ));
                }
                out.push_str(&format!(
                    "apiserver_request_duration_seconds_bucket{{verb=\"{verb}\",le=\"+Inf\"}} {}\n",
                    h.total
                ));
                out.push_str(&format!(
                    "apiserver_request_duration_seconds_sum{{verb=\"{verb}\"}} {}\n",
                    h.sum
                ));
                out.push_str(&format!(
                    "apiserver_request_duration_seconds_count{{verb=\"{verb}\"}} {}\n",
                    h.total
                ));
            }
        }
        if let Ok(others) = self.others.lock() {
            for render in others.iter() {
                out.push_str(&render());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let metrics = Metrics::default();
        metrics.observe("GET", 200, Duration::from_millis(3));
        metrics.observe("GET", 404, Duration::from_millis(30));
        let text = metrics.render();
        assert!(text.contains("apiserver_request_total{verb=\"GET\",code=\"200\"} 1"));
        assert!(
            text.contains("apiserver_request_duration_seconds_bucket{verb=\"GET\",le=\"0.005\"} 1")
        );
        assert!(text.contains("apiserver_request_duration_seconds_count{verb=\"GET\"} 2"));
    }
}
