//! Watch streams: initial state, live changes translated per selector, bookmarks, timeouts and
//! the 410 `Expired` error event, in the newline-delimited JSON form clients read.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use flotilla_storage::{EventKind, Revision, StorageError};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::meta;
use crate::negotiate::Representation;
use crate::resources::ResourceInfo;
use crate::selection::Selection;
use crate::storage::cacher::Cache;
use crate::store::{Store, Tenant, decode};
use crate::table::{IncludeObject, table};

/// How long after a watch's revision moves without an event a bookmark follows, when the
/// client allows them (upstream: about once a minute).
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// How old an initial state may be and still start another watch (as upstream's watch cache
/// serves `resourceVersion=0` from a state a little behind the store): the watch continues
/// from its revision, so no change is missed.
const SNAPSHOT_REUSE: Duration = Duration::from_secs(1);

/// The state of one key prefix at one revision, taken from its watch cache and decoded once,
/// and sent by every watch that starts from it while any of them still sends from it (one
/// decoded copy however many watchers).
#[derive(Debug)]
pub struct Snapshot {
    revision: Revision,
    objects: Vec<Value>,
}

/// A snapshot being read or read: concurrent watches wait for the one read.
#[derive(Debug)]
struct SharedSnapshot {
    taken: std::time::Instant,
    snapshot: tokio::sync::OnceCell<Snapshot>,
}

/// The initial states watches are sending, by key prefix; an entry lives as long as a watch
/// holds it.
#[derive(Debug, Default)]
pub struct Snapshots {
    by_prefix: Mutex<HashMap<String, Weak<SharedSnapshot>>>,
}

impl Snapshots {
    /// The state of `prefix`: one read by a recent watch, or a new read. The watch keeps
    /// what this returns while it sends from it; the entry lives as long as one does.
    async fn state(&self, cache: &Cache, prefix: &str) -> Result<Arc<SharedSnapshot>, ApiError> {
        let shared = {
            let mut by_prefix = self
                .by_prefix
                .lock()
                .map_err(|_| ApiError::internal("the watch snapshot table is poisoned"))?;
            match by_prefix.get(prefix).and_then(Weak::upgrade) {
                Some(shared) if shared.taken.elapsed() < SNAPSHOT_REUSE => shared,
                _ => {
                    by_prefix.retain(|_, entry| entry.strong_count() > 0);
                    let shared = Arc::new(SharedSnapshot {
                        taken: std::time::Instant::now(),
                        snapshot: tokio::sync::OnceCell::new(),
                    });
                    by_prefix.insert(prefix.to_string(), Arc::downgrade(&shared));
                    shared
                }
            }
        };
        shared
            .snapshot
            .get_or_try_init(|| async {
                let (kvs, revision) = cache.list(prefix, None);
                let objects = kvs.iter().map(decode).collect::<Result<_, _>>()?;
                Ok::<_, ApiError>(Snapshot { revision, objects })
            })
            .await?;
        Ok(shared)
    }

    /// How many snapshots watches hold now.
    pub fn live(&self) -> usize {
        self.by_prefix
            .lock()
            .map(|by_prefix| by_prefix.values().filter(|e| e.strong_count() > 0).count())
            .unwrap_or(0)
    }
}

/// What a watch request asked for.
#[derive(Debug)]
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
    /// The watch's place in its tenant's count, held until it ends.
    pub slot: Option<crate::limits::LongRunningSlot>,
}

struct Encoder {
    representation: Representation,
    include: IncludeObject,
    sent_headers: bool,
    /// Objects of a custom resource (written with their keys sorted, as upstream's
    /// unstructured encoder does).
    custom: bool,
    kind: crate::resources::Name,
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
        // A table or partial metadata is a built-in kind whatever the resource is.
        let mut object = object;
        if self.custom && matches!(self.representation, Representation::Json) {
            flotilla_protobuf::sort_unstructured(&mut object);
        }
        // Go's encoder, as upstream's watch stream: the event's fields in its struct's order,
        // a newline after each.
        Bytes::from(
            flotilla_api_machinery::gojson::to_vec(&WatchEvent {
                kind,
                object: flotilla_protobuf::GoJson::new(&object, false),
            })
            .unwrap_or_default(),
        )
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
            _ => (&*self.kind, self.api_version.clone()),
        };
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": metadata});
        Bytes::from(
            flotilla_api_machinery::gojson::to_vec(&json!({"type": "BOOKMARK", "object": obj}))
                .unwrap_or_default(),
        )
    }
}

/// A watch event as upstream's `metav1.WatchEvent` writes it: `type`, then `object`.
#[derive(serde::Serialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    object: flotilla_protobuf::GoJson<'a>,
}

/// A running watch: the body stream a handler returns.
pub type WatchBody =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Bytes, Infallible>> + Send>>;

/// How many bytes of events a watch may have queued for its client: a client that does not
/// read holds this much, whatever the size or number of the objects it watches.
const WATCH_BUFFER_BYTES: usize = 256 * 1024;

/// Starts a watch of `resource` in `namespace` (all when `None`).
#[allow(clippy::too_many_arguments)]
pub async fn start(
    store: &Store,
    snapshots: &Snapshots,
    tenant: &Tenant,
    resource: Arc<ResourceInfo>,
    namespace: Option<&str>,
    options: WatchOptions,
    representation: Representation,
    include: IncludeObject,
) -> Result<WatchBody, ApiError> {
    let prefix = tenant.list_prefix(&resource, namespace);
    // A cache built for this watch starts where the watch does, so the watch is in its window.
    let cache_start = match (options.from, options.send_initial_events) {
        (Some(from), None | Some(false)) => from + 1,
        _ => 0,
    };
    let cache = store
        .caches()
        .cache(&tenant.list_prefix(&resource, None), cache_start)
        .await?;
    let mut encoder = Encoder {
        representation,
        include,
        sent_headers: false,
        custom: resource.is_custom(),
        kind: resource.kind.clone(),
        api_version: resource.api_version(),
        columns: resource.strategy.columns(),
    };
    // Each queued event holds permits of its size from the watch's byte budget until the
    // body hands it on; one larger than the whole budget takes all of it.
    let (tx, rx) = mpsc::channel::<(tokio::sync::OwnedSemaphorePermit, Bytes)>(64);
    let budget = Arc::new(tokio::sync::Semaphore::new(WATCH_BUFFER_BYTES));

    // The initial state (unset/"0" RV, or sendInitialEvents) is one revision's, shared with
    // the watches that start from it, and the watch continues right after it: no gap, no
    // duplicate. It is filtered by this watch's selection as it is sent.
    let mut initial = None;
    let start_after = match (options.from, options.send_initial_events) {
        // A revision the store has not reached: waited for briefly, then refused, as upstream
        // (a watch from it would otherwise hang with nothing ever to send).
        (Some(from), None | Some(false)) => {
            store.wait_for_revision(from).await?;
            from
        }
        (None, Some(false)) => store.storage().current_revision().await?,
        _ => {
            let shared = snapshots.state(&cache, &prefix).await?;
            let revision = shared
                .snapshot
                .get()
                .map(|snapshot| snapshot.revision)
                .ok_or_else(|| ApiError::internal("a watch snapshot was not read"))?;
            initial = Some(shared);
            revision
        }
    };
    let live = cache.watch(&prefix, start_after + 1);

    tokio::spawn(async move {
        let _slot = options.slot;
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            let budget = budget.clone();
            async move {
                let cost = u32::try_from(bytes.len().clamp(1, WATCH_BUFFER_BYTES)).unwrap_or(1);
                let Ok(permit) = budget.acquire_many_owned(cost).await else {
                    return false;
                };
                tx.send((permit, bytes)).await.is_ok()
            }
        };
        if let Some(snapshot) = initial.as_ref().and_then(|shared| shared.snapshot.get()) {
            for obj in &snapshot.objects {
                if !options.selection.matches(obj, &resource) {
                    continue;
                }
                let obj = match resource.served(obj.clone()).await {
                    Ok(obj) => obj,
                    Err(err) => {
                        let _ = send(encoder.event("ERROR", err.status_value())).await;
                        return;
                    }
                };
                if !send(encoder.event("ADDED", obj)).await {
                    return;
                }
            }
        }
        // Sent: this watch no longer keeps the state alive.
        drop(initial);
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
        let mut last_revision = start_after;
        // The revision the client knows (from an event or a bookmark). A bookmark is sent
        // about a minute after the revision moves past it without an event, and never when
        // nothing moved: it would tell the client nothing, and an idle watch then has no
        // timer at all (thousands of idle clusters' watches would each wake every minute).
        let mut client_revision = start_after;
        let mut bookmark_due: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                // The client went away: its place in the cache is given up at once, not at the
                // next event or the timeout.
                () = tx.closed() => return,
                _ = sleep_until_some(bookmark_due), if options.allow_bookmarks => {
                    bookmark_due = None;
                    if !send(encoder.bookmark(last_revision, false)).await {
                        return;
                    }
                    client_revision = last_revision;
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
                        let (kind, object) = match translate(&event, &options.selection, &resource) {
                            Ok(Some(pair)) => pair,
                            Ok(None) => continue,
                            Err(err) => {
                                let _ = send(encoder.event("ERROR", err.status_value())).await;
                                return;
                            }
                        };
                        last_revision = revision;
                        let object = match resource.served(object).await {
                            Ok(object) => object,
                            Err(err) => {
                                let _ = send(encoder.event("ERROR", err.status_value())).await;
                                return;
                            }
                        };
                        if !send(encoder.event(kind, object)).await {
                            return;
                        }
                        client_revision = revision;
                    }
                    last_revision = last_revision.max(response.revision);
                    if last_revision > client_revision && bookmark_due.is_none() {
                        bookmark_due = Some(tokio::time::Instant::now() + BOOKMARK_INTERVAL);
                    }
                }
            }
        }
    });
    Ok(Box::pin(
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|(permit, bytes)| {
            drop(permit);
            Ok(bytes)
        }),
    ))
}

/// Sleeps until `due`, or forever when there is none.
async fn sleep_until_some(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
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
    api_error.status_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(from: Option<Revision>) -> WatchOptions {
        WatchOptions {
            from,
            selection: Default::default(),
            allow_bookmarks: false,
            send_initial_events: None,
            timeout: Duration::from_secs(60),
            slot: None,
        }
    }

    /// The resident memory of this process, from /proc (Linux).
    fn resident_bytes() -> u64 {
        std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
            .map_or(0, |pages| pages * 4096)
    }

    /// Security review, finding 4: watches from resourceVersion 0 whose clients do not read
    /// share one copy of the initial state (it was one each: 100 watches over 5 MiB held
    /// 275 MB), and each still sends all of it.
    #[tokio::test]
    async fn watches_that_start_together_share_one_initial_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage =
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("open");
        let store = Store::new(Arc::new(storage));
        let resources = Box::leak(Box::new(crate::resources::Resources::builtin()));
        let configmaps = resources.find("", "v1", "configmaps").expect("configmaps");
        let tenant = Tenant::new("t");
        let prefix = tenant.list_prefix(configmaps, Some("default"));
        let value = "v".repeat(16 * 1024);
        for i in 0..320 {
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("big-{i}"), "namespace": "default"},
                "data": {"v": value}});
            store
                .storage()
                .create(
                    &format!("{prefix}big-{i}"),
                    Bytes::from(serde_json::to_vec(&object).expect("json")),
                )
                .await
                .expect("create");
        }
        let snapshots = Snapshots::default();
        let before = resident_bytes();
        let mut bodies = Vec::new();
        for _ in 0..100 {
            // Never read: each watch's task stops at its channel's 64 events, holding its
            // place in the initial state.
            let body = start(
                &store,
                &snapshots,
                &tenant,
                configmaps.clone(),
                Some("default"),
                options(None),
                Representation::Json,
                IncludeObject::Metadata,
            )
            .await;
            let Ok(body) = body else {
                panic!("watch refused");
            };
            bodies.push(body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let grown = resident_bytes().saturating_sub(before);
        println!(
            "100 unread watches over 5 MiB: {} initial state(s), resident memory +{:.1} MiB",
            snapshots.live(),
            grown as f64 / 1_048_576.0
        );
        assert!(
            (1..=2).contains(&snapshots.live()),
            "{} initial states for 100 watches",
            snapshots.live()
        );
        let mut first = bodies.swap_remove(0);
        let mut added = 0;
        while added < 320 {
            let line = tokio::time::timeout(Duration::from_secs(10), first.next())
                .await
                .expect("in time")
                .expect("an event")
                .unwrap_or_default();
            assert!(line.starts_with(br#"{"type":"ADDED""#));
            added += 1;
        }
        drop(first);
        drop(bodies);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            snapshots.live(),
            0,
            "the state is freed with its last watch"
        );
    }

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
        let options = options(Some(1_000_000));
        let refused = start(
            &store,
            &Snapshots::default(),
            &Tenant::new("t"),
            configmaps.clone(),
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
