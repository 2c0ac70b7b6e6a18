//! Watch streams: initial state, live changes translated per selector, bookmarks, timeouts and
//! the 410 `Expired` error event, in the newline-delimited JSON form clients read.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use flotilla_storage::{EventKind, RangeRequest, Revision, StorageError};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::meta;
use crate::negotiate::Representation;
use crate::resources::ResourceInfo;
use crate::selection::Selection;
use crate::store::{Store, Tenant, decode};
use crate::table::{IncludeObject, table};

/// How often a bookmark is sent when the client allows them (upstream: about once a minute).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// What a watch request asked for.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// `resourceVersion`: `None` (unset or "0") starts with the current state as ADDED events.
    pub from: Option<Revision>,
    /// Selectors.
    pub selection: Selection,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `sendInitialEvents`: `Some(true)` sends the initial state then a bookmark marking its
    /// end; `Some(false)` sends no initial state even for an unset resourceVersion.
    pub send_initial_events: Option<bool>,
    /// `timeoutSeconds` (or the server's default).
    pub timeout: Duration,
}

struct Encoder {
    representation: Representation,
    include: IncludeObject,
    sent_headers: bool,
    kind: &'static str,
    api_version: String,
    columns: Vec<crate::table::Column>,
}

impl Encoder {
    fn object(&mut self, obj: Value) -> Value {
        match self.representation {
            Representation::Table => {
                let rv = meta::resource_version(&obj).to_string();
                let headers = !self.sent_headers;
                self.sent_headers = true;
                table(
                    &self.columns,
                    &[obj],
                    json!({"resourceVersion": rv}),
                    self.include,
                    headers,
                )
            }
            Representation::PartialMetadata => json!({
                "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
            }),
            Representation::Json | Representation::Yaml => obj,
        }
    }

    fn event(&mut self, kind: &str, obj: Value) -> Bytes {
        let object = if kind == "ERROR" {
            obj
        } else {
            self.object(obj)
        };
        let mut line =
            serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn bookmark(&mut self, revision: Revision, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        // Bookmarks take the kind of the representation, as upstream's fixup does.
        let (kind, api_version) = match self.representation {
            Representation::PartialMetadata => {
                ("PartialObjectMetadata", "meta.k8s.io/v1".to_string())
            }
            _ => (self.kind, self.api_version.clone()),
        };
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
        let mut line =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }
}

/// A running watch: the body stream a handler returns.
pub type WatchBody = tokio_stream::wrappers::ReceiverStream<Result<Bytes, Infallible>>;

/// Starts a watch of `resource` in `namespace` (all when `None`).
pub async fn start(
    store: &Store,
    tenant: &Tenant,
    resource: &'static ResourceInfo,
    namespace: Option<&str>,
    options: WatchOptions,
    representation: Representation,
    include: IncludeObject,
) -> Result<WatchBody, ApiError> {
    let prefix = tenant.list_prefix(resource, namespace);
    let storage = store.storage().clone();
    let mut encoder = Encoder {
        representation,
        include,
        sent_headers: false,
        kind: resource.kind,
        api_version: resource.api_version(),
        columns: resource.strategy.columns(),
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(64);

    // The initial state (unset/"0" RV, or sendInitialEvents) is read before the watch starts,
    // at one revision, and the watch continues right after it: no gap, no duplicate.
    let mut initial = Vec::new();
    let start_after = match (options.from, options.send_initial_events) {
        // A revision the store has not reached: waited for briefly, then refused, as upstream
        // (a watch from it would otherwise hang with nothing ever to send).
        (Some(from), None | Some(false)) => {
            store.wait_for_revision(from).await?;
            from
        }
        (None, Some(false)) => storage.current_revision().await?,
        _ => {
            let page = storage
                .range(RangeRequest {
                    prefix: prefix.clone(),
                    start_key: None,
                    limit: 0,
                    revision: 0,
                })
                .await?;
            for kv in &page.kvs {
                let obj = decode(kv)?;
                if options.selection.matches(&obj, resource) {
                    initial.push(obj);
                }
            }
            page.revision
        }
    };
    let live = storage.watch(&prefix, start_after + 1).await;

    tokio::spawn(async move {
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            async move { tx.send(Ok(bytes)).await.is_ok() }
        };
        for obj in initial {
            if !send(encoder.event("ADDED", obj)).await {
                return;
            }
        }
        if options.send_initial_events == Some(true)
            && options.allow_bookmarks
            && !send(encoder.bookmark(start_after, true)).await
        {
            return;
        }
        let mut live = match live {
            Ok(stream) => stream,
            Err(err) => {
                let _ = send(encoder.event("ERROR", error_status(err, start_after))).await;
                return;
            }
        };
        let deadline = tokio::time::sleep(options.timeout);
        tokio::pin!(deadline);
        let mut bookmarks = tokio::time::interval(BOOKMARK_INTERVAL);
        bookmarks.tick().await;
        let mut last_revision = start_after;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = bookmarks.tick(), if options.allow_bookmarks => {
                    if !send(encoder.bookmark(last_revision, false)).await {
                        return;
                    }
                }
                batch = live.next() => {
                    let response = match batch {
                        None => return,
                        Some(Err(err)) => {
                            let _ = send(encoder.event("ERROR", error_status(err, last_revision))).await;
                            return;
                        }
                        Some(Ok(response)) => response,
                    };
                    for event in response.events {
                        let revision = event.kv.mod_revision;
                        let (kind, object) = match translate(&event, &options.selection, resource) {
                            Ok(Some(pair)) => pair,
                            Ok(None) => continue,
                            Err(err) => {
                                let _ = send(encoder.event("ERROR", serde_json::to_value(err.to_status()).unwrap_or_default())).await;
                                return;
                            }
                        };
                        last_revision = revision;
                        if !send(encoder.event(kind, object)).await {
                            return;
                        }
                    }
                    last_revision = last_revision.max(response.revision);
                }
            }
        }
    });
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Maps one storage event to a watch event under the selection: objects moving into the
/// selection are ADDED, moving out are DELETED (as upstream's cacher does).
fn translate(
    event: &flotilla_storage::WatchEvent,
    selection: &Selection,
    resource: &ResourceInfo,
) -> Result<Option<(&'static str, Value)>, ApiError> {
    // With no selector an update is MODIFIED whatever it was before: the previous state is
    // only decoded when a selector must judge it, or for a DELETED event's object.
    if selection.is_everything() && event.kind == EventKind::Put {
        let kind = if event.prev.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        return Ok(Some((kind, decode(&event.kv)?)));
    }
    let previous = match &event.prev {
        Some(prev) => Some(decode(prev)?),
        None => None,
    };
    let previously_matched = previous
        .as_ref()
        .is_some_and(|p| selection.matches(p, resource));
    match event.kind {
        EventKind::Delete => {
            let Some(mut last) = previous else {
                return Ok(None);
            };
            if !previously_matched {
                return Ok(None);
            }
            meta::set_at(
                &mut last,
                &["metadata", "resourceVersion"],
                json!(event.kv.mod_revision.to_string()),
            );
            Ok(Some(("DELETED", last)))
        }
        EventKind::Put => {
            let current = decode(&event.kv)?;
            let matches_now = selection.matches(&current, resource);
            Ok(match (previously_matched, matches_now, previous) {
                (false, true, _) => Some(("ADDED", current)),
                (true, true, Some(_)) => Some(("MODIFIED", current)),
                // Leaving the selection shows the last state that matched, at this revision.
                (true, false, Some(mut last)) => {
                    meta::set_at(
                        &mut last,
                        &["metadata", "resourceVersion"],
                        json!(event.kv.mod_revision.to_string()),
                    );
                    Some(("DELETED", last))
                }
                _ => None,
            })
        }
    }
}

fn error_status(err: StorageError, revision: Revision) -> Value {
    let api_error = match err {
        StorageError::Compacted { compacted, .. } => ApiError::expired(format!(
            "too old resource version: {revision} ({compacted})"
        )),
        other => ApiError::from(other),
    };
    serde_json::to_value(api_error.to_status()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Security review, finding 9: a watch from a resourceVersion the store has not reached
    /// is refused after upstream's wait (it used to hang with nothing ever to send).
    #[tokio::test]
    async fn a_watch_from_a_future_resource_version_is_refused_with_504() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage =
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("open");
        let store = Store::new(Arc::new(storage));
        let resources = crate::resources::Resources::builtin();
        let configmaps = Box::leak(Box::new(resources))
            .find("", "v1", "configmaps")
            .expect("configmaps");
        let options = WatchOptions {
            from: Some(1_000_000),
            selection: Default::default(),
            allow_bookmarks: false,
            send_initial_events: None,
            timeout: Duration::from_secs(60),
        };
        let refused = start(
            &store,
            &Tenant::new("t"),
            configmaps,
            Some("default"),
            options,
            Representation::Json,
            IncludeObject::Metadata,
        )
        .await;
        let Err(err) = refused else {
            panic!("a watch from a future resourceVersion started");
        };
        assert_eq!((err.code, err.reason), (504, "Timeout"));
        assert!(
            err.message
                .starts_with("Timeout: Too large resource version: 1000000"),
            "{}",
            err.message
        );
    }
}
