//! Container logs, sans IO: the CRI log format (`<RFC3339Nano> <stream> <P|F> <content>`,
//! one entry a line, as containerd writes the files the kubelet points containers at),
//! upstream's `PodLogOptions` as the kubelet reads them from a query, where a tail starts,
//! and the writer that applies since/timestamps/limitBytes to each entry (upstream
//! `pkg/kubelet/kuberuntime/logs`). Which container's file to read is
//! [`container_for_logs`] (upstream `validateContainerLogStatus`).

use std::collections::HashMap;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_openapi::api::core::v1::Pod;

/// Why a log request or a log line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    /// A query parameter has the wrong form.
    #[error("invalid value {value:?} for {name}")]
    Query {
        /// The parameter.
        name: &'static str,
        /// What was given.
        value: String,
    },
    /// Both ways of saying "since" were given.
    #[error("at most one of sinceTime or sinceSeconds may be specified")]
    TwoSinces,
    /// A line is not in the CRI log format.
    #[error("invalid CRI log line: {0}")]
    Line(String),
}

/// Upstream's `PodLogOptions` as the kubelet's `/containerLogs` reads them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    /// Keep the stream open and send lines as they are written.
    pub follow: bool,
    /// The log of the previous (terminated) instance of the container.
    pub previous: bool,
    /// Prefix each entry with its RFC3339Nano timestamp.
    pub timestamps: bool,
    /// Only entries at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only the last this many lines.
    pub tail: Option<usize>,
    /// Stop after this many bytes.
    pub limit_bytes: Option<u64>,
}

fn flag(query: &HashMap<String, String>, name: &'static str) -> Result<bool, LogError> {
    match query.get(name).map(String::as_str) {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(LogError::Query {
            name,
            value: other.to_string(),
        }),
    }
}

fn number(query: &HashMap<String, String>, name: &'static str) -> Result<Option<i64>, LogError> {
    match query.get(name).filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(value) => value.parse().map(Some).map_err(|_| LogError::Query {
            name,
            value: value.clone(),
        }),
    }
}

impl LogOptions {
    /// The options of a `/containerLogs` query, `now` resolving `sinceSeconds`. Negative
    /// `tailLines` means all lines; non-positive `limitBytes` and `sinceSeconds` are refused
    /// as upstream's validation does.
    pub fn from_query(
        query: &HashMap<String, String>,
        now: DateTime<Utc>,
    ) -> Result<Self, LogError> {
        let since_seconds = number(query, "sinceSeconds")?;
        let since_time = match query.get("sinceTime").filter(|v| !v.is_empty()) {
            None => None,
            Some(value) => Some(
                DateTime::parse_from_rfc3339(value)
                    .map_err(|_| LogError::Query {
                        name: "sinceTime",
                        value: value.clone(),
                    })?
                    .with_timezone(&Utc),
            ),
        };
        let since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => return Err(LogError::TwoSinces),
            (Some(seconds), None) if seconds < 1 => {
                return Err(LogError::Query {
                    name: "sinceSeconds",
                    value: seconds.to_string(),
                });
            }
            (Some(seconds), None) => Some(now - chrono::Duration::seconds(seconds)),
            (None, time) => time,
        };
        let limit_bytes = match number(query, "limitBytes")? {
            Some(bytes) if bytes < 1 => {
                return Err(LogError::Query {
                    name: "limitBytes",
                    value: bytes.to_string(),
                });
            }
            other => other.map(|b| b as u64),
        };
        Ok(LogOptions {
            follow: flag(query, "follow")?,
            previous: flag(query, "previous")?,
            timestamps: flag(query, "timestamps")?,
            since,
            tail: number(query, "tailLines")?
                .filter(|t| *t >= 0)
                .map(|t| t as usize),
            limit_bytes,
        })
    }
}

/// One entry of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriLine<'a> {
    /// When the runtime read it.
    pub time: DateTime<Utc>,
    /// `stdout` or `stderr`.
    pub stream: &'a str,
    /// A partial entry (`P`): the line continues in the next entry.
    pub partial: bool,
    /// The content, without the newline.
    pub content: &'a [u8],
}

/// Parses one line of a CRI log file (without its `\n`).
pub fn parse_cri_line(line: &[u8]) -> Result<CriLine<'_>, LogError> {
    let bad = || LogError::Line(String::from_utf8_lossy(line).into_owned());
    let mut fields = line.splitn(4, |b| *b == b' ');
    let time = fields.next().ok_or_else(bad)?;
    let stream = fields.next().ok_or_else(bad)?;
    let tags = fields.next().ok_or_else(bad)?;
    let content = fields.next().unwrap_or(b"");
    let time = std::str::from_utf8(time).map_err(|_| bad())?;
    let time = DateTime::parse_from_rfc3339(time)
        .map_err(|_| bad())?
        .with_timezone(&Utc);
    let stream = std::str::from_utf8(stream).map_err(|_| bad())?;
    if stream != "stdout" && stream != "stderr" {
        return Err(bad());
    }
    // Tags are `:`-separated; the first is the partial/full flag.
    let partial = match tags.split(|b| *b == b':').next() {
        Some(b"P") => true,
        Some(b"F") => false,
        _ => return Err(bad()),
    };
    Ok(CriLine {
        time,
        stream,
        partial,
        content,
    })
}

/// Where the last `tail` lines of `content` start (upstream `FindTailLineStartIndex`): the
/// whole file for `None`, its end for `Some(0)`. A last line without its newline counts.
pub fn tail_start(content: &[u8], tail: Option<usize>) -> usize {
    let Some(tail) = tail else {
        return 0;
    };
    if tail == 0 {
        return content.len();
    }
    // Skip the final newline so it does not count as an empty last line.
    let end = if content.last() == Some(&b'\n') {
        content.len() - 1
    } else {
        content.len()
    };
    let mut seen = 0;
    for (i, byte) in content[..end].iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == tail {
                return i + 1;
            }
        }
    }
    0
}

/// What the writer says after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    More,
    /// `limitBytes` is reached: end the stream.
    Done,
}

/// Applies since/timestamps/limitBytes to entries, in order (upstream's `logWriter`).
#[derive(Debug)]
pub struct LogWriter {
    since: Option<DateTime<Utc>>,
    timestamps: bool,
    remaining: Option<u64>,
}

impl LogWriter {
    /// A writer for `options`.
    pub fn new(options: &LogOptions) -> Self {
        LogWriter {
            since: options.since,
            timestamps: options.timestamps,
            remaining: options.limit_bytes,
        }
    }

    /// Appends what one raw file line (without `\n`) contributes to `out`. Lines that do not
    /// parse are skipped (upstream logs and skips them too).
    pub fn line(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Flow {
        if self.remaining == Some(0) {
            return Flow::Done;
        }
        let Ok(entry) = parse_cri_line(raw) else {
            return Flow::More;
        };
        if self.since.is_some_and(|since| entry.time < since) {
            return Flow::More;
        }
        let mut text = Vec::with_capacity(entry.content.len() + 40);
        if self.timestamps {
            text.extend_from_slice(
                entry
                    .time
                    .to_rfc3339_opts(SecondsFormat::Nanos, true)
                    .as_bytes(),
            );
            text.push(b' ');
        }
        text.extend_from_slice(entry.content);
        if !entry.partial {
            text.push(b'\n');
        }
        match &mut self.remaining {
            None => {
                out.extend_from_slice(&text);
                Flow::More
            }
            Some(remaining) => {
                let take = (*remaining).min(text.len() as u64) as usize;
                out.extend_from_slice(&text[..take]);
                *remaining -= take as u64;
                if *remaining == 0 {
                    Flow::Done
                } else {
                    Flow::More
                }
            }
        }
    }

    /// Feeds every complete line of `buffer` (consumed from the front) to [`Self::line`];
    /// an incomplete last line stays in `buffer` for the next read.
    pub fn lines(&mut self, buffer: &mut Vec<u8>, out: &mut Vec<u8>) -> Flow {
        let mut start = 0;
        let mut flow = Flow::More;
        while let Some(newline) = buffer[start..].iter().position(|b| *b == b'\n') {
            let line = &buffer[start..start + newline];
            flow = self.line(line, out);
            start += newline + 1;
            if flow == Flow::Done {
                break;
            }
        }
        buffer.drain(..start);
        flow
    }
}

/// The container ID whose log a request reads (upstream `validateContainerLogStatus`), or
/// upstream's message for why there is none.
pub fn container_for_logs(pod: &Pod, container: &str, previous: bool) -> Result<String, String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let status = pod.status.as_ref();
    let found = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .chain(status.and_then(|s| s.init_container_statuses.as_ref()))
        .chain(status.and_then(|s| s.ephemeral_container_statuses.as_ref()))
        .flatten()
        .find(|s| s.name == container);
    let Some(found) = found else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        ));
    };
    let last = found
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.clone())
        .filter(|id| !id.is_empty());
    let state = found.state.clone().unwrap_or_default();
    let terminated_msg = || format!("container {container:?} in pod {pod_name:?} is terminated");
    let id = if previous {
        last.ok_or_else(|| {
            format!("previous terminated container {container:?} in pod {pod_name:?} not found")
        })?
    } else if state.running.is_some() {
        found.container_id.clone().unwrap_or_default()
    } else if let Some(terminated) = &state.terminated {
        match terminated.container_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => id,
            None => last.ok_or_else(terminated_msg)?,
        }
    } else if found
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .is_some()
    {
        last.ok_or_else(terminated_msg)?
    } else if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.clone().unwrap_or_default();
        let why = match reason.as_str() {
            "ErrImagePull" => "image can't be pulled".to_string(),
            "ImagePullBackOff" => "trying and failing to pull image".to_string(),
            _ => reason,
        };
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
        ));
    } else {
        return Err(format!(
            "container {container:?} in pod {pod_name:?} is waiting to start - no logs yet"
        ));
    };
    // `containerd://<id>` → `<id>`.
    Ok(id
        .split_once("://")
        .map(|(_, id)| id.to_string())
        .unwrap_or(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const FILE: &[u8] = b"2026-01-01T00:00:01.000000001Z stdout F one\n\
2026-01-01T00:00:02Z stderr F two\n\
2026-01-01T00:00:03Z stdout P thr\n\
2026-01-01T00:00:03.5Z stdout F ee\n\
garbage\n\
2026-01-01T00:00:04Z stdout F four\n";

    fn run(options: &LogOptions) -> String {
        let start = tail_start(FILE, options.tail);
        let mut buffer = FILE[start..].to_vec();
        let mut out = Vec::new();
        LogWriter::new(options).lines(&mut buffer, &mut out);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn cri_lines_parse_as_containerd_writes_them() {
        let line =
            parse_cri_line(b"2016-10-06T00:17:09.669794202Z stdout F log content 1").expect("line");
        assert_eq!(line.stream, "stdout");
        assert!(!line.partial);
        assert_eq!(line.content, b"log content 1");
        assert_eq!(line.time.timestamp_subsec_nanos(), 669794202);
        let empty = parse_cri_line(b"2016-10-06T00:17:09Z stderr P").expect("empty");
        assert!(empty.partial);
        assert_eq!(empty.content, b"");
        for bad in [
            &b"nonsense"[..],
            b"2016-10-06T00:17:09Z stdin F x",
            b"2016-10-06T00:17:09Z stdout X x",
            b"yesterday stdout F x",
        ] {
            assert!(parse_cri_line(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn selection_by_tail_since_timestamps_and_limit() {
        let time = |s: &str| {
            DateTime::parse_from_rfc3339(s)
                .expect("t")
                .with_timezone(&Utc)
        };
        let cases: Vec<(&str, LogOptions, &str)> = vec![
            (
                "everything, partial entries joined",
                LogOptions::default(),
                "one\ntwo\nthree\nfour\n",
            ),
            (
                "tail 2 counts file lines",
                LogOptions {
                    tail: Some(2),
                    ..Default::default()
                },
                "four\n",
            ),
            (
                "tail 3",
                LogOptions {
                    tail: Some(3),
                    ..Default::default()
                },
                "ee\nfour\n",
            ),
            (
                "tail 0",
                LogOptions {
                    tail: Some(0),
                    ..Default::default()
                },
                "",
            ),
            (
                "tail beyond the file",
                LogOptions {
                    tail: Some(100),
                    ..Default::default()
                },
                "one\ntwo\nthree\nfour\n",
            ),
            (
                "since drops older entries",
                LogOptions {
                    since: Some(time("2026-01-01T00:00:02Z")),
                    ..Default::default()
                },
                "two\nthree\nfour\n",
            ),
            (
                "timestamps in RFC3339Nano",
                LogOptions {
                    timestamps: true,
                    tail: Some(2),
                    ..Default::default()
                },
                "2026-01-01T00:00:04.000000000Z four\n",
            ),
            (
                "limitBytes cuts mid-line",
                LogOptions {
                    limit_bytes: Some(6),
                    ..Default::default()
                },
                "one\ntw",
            ),
        ];
        for (name, options, want) in cases {
            assert_eq!(run(&options), want, "{name}");
        }
    }

    #[test]
    fn an_incomplete_last_line_waits_for_more() {
        let mut writer = LogWriter::new(&LogOptions::default());
        let mut buffer = b"2026-01-01T00:00:01Z stdout F a\n2026-01-01T00:00:02Z std".to_vec();
        let mut out = Vec::new();
        writer.lines(&mut buffer, &mut out);
        assert_eq!(out, b"a\n");
        buffer.extend_from_slice(b"out F b\n");
        writer.lines(&mut buffer, &mut out);
        assert_eq!(out, b"a\nb\n");
        assert!(buffer.is_empty());
    }

    #[test]
    fn options_from_the_query() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:01:00Z")
            .expect("now")
            .with_timezone(&Utc);
        let options = LogOptions::from_query(
            &query(&[
                ("follow", "true"),
                ("tailLines", "5"),
                ("sinceSeconds", "60"),
                ("timestamps", "true"),
                ("limitBytes", "10"),
            ]),
            now,
        )
        .expect("options");
        assert!(options.follow && options.timestamps && !options.previous);
        assert_eq!(options.tail, Some(5));
        assert_eq!(options.limit_bytes, Some(10));
        assert_eq!(
            options.since.map(|s| s.to_rfc3339()),
            Some("2026-01-01T00:00:00+00:00".into())
        );
        assert_eq!(
            LogOptions::from_query(&query(&[("tailLines", "-1")]), now)
                .expect("all")
                .tail,
            None
        );
        assert_eq!(
            LogOptions::from_query(
                &query(&[("sinceSeconds", "1"), ("sinceTime", "2026-01-01T00:00:00Z")]),
                now
            ),
            Err(LogError::TwoSinces)
        );
        assert!(LogOptions::from_query(&query(&[("follow", "maybe")]), now).is_err());
        assert!(LogOptions::from_query(&query(&[("limitBytes", "0")]), now).is_err());
    }

    fn pod(statuses: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "status": {"containerStatuses": statuses},
        }))
        .expect("pod")
    }

    #[test]
    fn which_container_instance_is_read() {
        let running = pod(json!([{
            "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://now",
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://before"}},
        }]));
        assert_eq!(container_for_logs(&running, "c", false), Ok("now".into()));
        assert_eq!(container_for_logs(&running, "c", true), Ok("before".into()));
        assert_eq!(
            container_for_logs(&running, "x", false),
            Err("container \"x\" in pod \"web\" is not available".into())
        );
        let creating = pod(json!([{
            "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        }]));
        assert_eq!(
            container_for_logs(&creating, "c", false),
            Err("container \"c\" in pod \"web\" is waiting to start: ContainerCreating".into())
        );
        assert_eq!(
            container_for_logs(&creating, "c", true),
            Err("previous terminated container \"c\" in pod \"web\" not found".into())
        );
        let backing_off = pod(json!([{
            "name": "c", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://dead"}},
        }]));
        assert_eq!(
            container_for_logs(&backing_off, "c", false),
            Ok("dead".into())
        );
    }
}
