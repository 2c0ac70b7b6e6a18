//! The etcd backend: [`Storage`] on an etcd v3 cluster through `etcd-client`.
//!
//! Every conditional write is one etcd transaction (compare, then put or delete, else get the
//! current state), so preconditions hold across any number of apiserver replicas. An optional
//! key prefix namespaces everything this store writes, for sharing one etcd with others.
//!
//! Watches are strict about etcd's known watch bugs (etcd-io/etcd#15220, #15271, #17529,
//! #18089): a watch never resumes silently. If etcd's stream ends, errors, is cancelled, goes
//! backwards or omits a previous value it was asked for, the [`WatchStream`] ends with an error
//! and the caller relists. Progress notifications are neither requested nor forwarded.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KvClient, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use futures::StreamExt;

use crate::types::{
    EventKind, KeyValue, Outcome, RangeRequest, RangeResponse, Revision, Storage, StorageError,
    WatchEvent, WatchResponse, WatchStream,
};

/// How long [`EtcdStorage::connect`] waits for a first answer before calling etcd unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// gRPC messages may be as large as a whole unpaginated list; etcd itself bounds them.
const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;
/// A key this store never writes, read only for the response header or a revision check.
const PROBE_KEY: &str = "\0flotilla-probe";

/// [`Storage`] on an etcd v3 cluster (tested against etcd 3.4).
pub struct EtcdStorage {
    client: Client,
    /// Prepended to every key on the way in and stripped on the way out.
    namespace: String,
    /// The last compaction point seen; it only moves forward, so it is a lower bound for
    /// [`EtcdStorage::compacted_revision`]'s search.
    compacted_hint: AtomicI64,
}

impl std::fmt::Debug for EtcdStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStorage")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl EtcdStorage {
    /// Connects to etcd at `endpoints` (`host:port` or `http://host:port`; TLS is not built in)
    /// and checks that it answers.
    ///
    /// With `prefix`, every key is stored as `prefix + key` and handed back without it. End the
    /// prefix with a separator (`/flotilla/`): it is a plain byte prefix, so a range over all
    /// keys of prefix `/a` would also see the keys of a store with prefix `/ab`.
    pub async fn connect(
        endpoints: &[String],
        prefix: Option<String>,
    ) -> Result<Self, StorageError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            // Keepalives are what notice a dead member under an idle watch.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(etcd_error(format!(
                "connect to etcd at {}",
                endpoints.join(",")
            )))?;
        let storage = Self {
            client,
            namespace: prefix.unwrap_or_default(),
            compacted_hint: AtomicI64::new(0),
        };
        // The client connects lazily; one round trip here turns a wrong endpoint into an error
        // now rather than on the first request.
        tokio::time::timeout(CONNECT_TIMEOUT, storage.current_revision())
            .await
            .map_err(|_| StorageError::Unavailable {
                message: format!(
                    "etcd at {} did not answer within {CONNECT_TIMEOUT:?}",
                    endpoints.join(",")
                ),
                source: None,
            })??;
        Ok(storage)
    }

    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.namespace.len() + key.len());
        full.extend_from_slice(self.namespace.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue, StorageError> {
        Ok(KeyValue {
            key: user_key(&self.namespace, kv.key())?,
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
        })
    }

    /// Turns etcd's refusal of a revision into the matching [`StorageError`].
    async fn revision_error(
        &self,
        error: etcd_client::Error,
        requested: Revision,
        context: &str,
    ) -> StorageError {
        match refusal(&error) {
            Some(Refusal::Compacted) => {
                // etcd does not say where the compaction point is; look it up. If that fails
                // too, the point is at least just past what was asked for.
                let compacted = self.compacted_revision().await.unwrap_or(requested + 1);
                StorageError::Compacted {
                    requested,
                    compacted,
                }
            }
            Some(Refusal::Future) => match self.current_revision().await {
                Ok(current) => StorageError::FutureRevision { requested, current },
                Err(error) => error,
            },
            None => etcd_error(context)(error),
        }
    }

    /// Whether etcd can still serve a read at `revision`.
    async fn readable(&self, revision: Revision) -> Result<bool, StorageError> {
        let options = GetOptions::new().with_revision(revision).with_count_only();
        match self.kv().get(self.full_key(PROBE_KEY), Some(options)).await {
            Ok(_) => Ok(true),
            Err(error) if refusal(&error) == Some(Refusal::Compacted) => Ok(false),
            Err(error) => Err(etcd_error("probe a past revision")(error)),
        }
    }

    /// The state of `key` as the failure branch of a transaction read it.
    fn failed_branch_state(
        &self,
        response: &TxnResponse,
    ) -> Result<Option<KeyValue>, StorageError> {
        for op in response.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                return get.kvs().first().map(|kv| self.key_value(kv)).transpose();
            }
        }
        Err(unexpected("transaction failure branch carries no read"))
    }
}

#[async_trait]
impl Storage for EtcdStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let response = self
            .kv()
            .get(self.full_key(key), None)
            .await
            .map_err(etcd_error("get"))?;
        response
            .kvs()
            .first()
            .map(|kv| self.key_value(kv))
            .transpose()
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        let prefix = self.full_key(&request.prefix);
        let mut start = match &request.start_key {
            Some(start) if start.as_str() > request.prefix.as_str() => self.full_key(start),
            _ => prefix.clone(),
        };
        if start.is_empty() {
            // etcd has no empty key; "\0" is the smallest one.
            start.push(0);
        }
        let mut options = GetOptions::new()
            .with_range(prefix_end(&prefix))
            .with_revision(request.revision.max(0));
        if request.limit > 0 {
            options = options.with_limit(i64::try_from(request.limit).unwrap_or(i64::MAX));
        }
        let response = match self.kv().get(start, Some(options)).await {
            Ok(response) => response,
            Err(error) => return Err(self.revision_error(error, request.revision, "range").await),
        };
        let revision = if request.revision > 0 {
            request.revision
        } else {
            header_revision(response.header())?
        };
        Ok(RangeResponse {
            kvs: response
                .kvs()
                .iter()
                .map(|kv| self.key_value(kv))
                .collect::<Result<_, _>>()?,
            more: response.more(),
            count: usize::try_from(response.count())
                .map_err(|_| unexpected("negative range count"))?,
            revision,
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        let full = self.full_key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(full.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(full.clone(), value.to_vec(), None)])
            .or_else([TxnOp::get(full, None)]);
        let response = self.kv().txn(txn).await.map_err(etcd_error("create"))?;
        if !response.succeeded() {
            return Ok(Outcome::Conflict(self.failed_branch_state(&response)?));
        }
        let revision = header_revision(response.header())?;
        Ok(Outcome::Done(KeyValue {
            key: key.to_owned(),
            value,
            create_revision: revision,
            mod_revision: revision,
        }))
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let full = self.full_key(key);
        // etcd compares an absent key's mod_revision as 0; requiring it to exist keeps an
        // update from ever creating a key.
        let txn = Txn::new()
            .when([
                Compare::create_revision(full.clone(), CompareOp::Greater, 0),
                Compare::mod_revision(full.clone(), CompareOp::Equal, expected_revision),
            ])
            .and_then([TxnOp::put(
                full.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(full, None)]);
        let response = self.kv().txn(txn).await.map_err(etcd_error("update"))?;
        if !response.succeeded() {
            return Ok(Outcome::Conflict(self.failed_branch_state(&response)?));
        }
        let revision = header_revision(response.header())?;
        let prev = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Put(put) => put.prev_key().map(etcd_client::KeyValue::create_revision),
            _ => None,
        });
        let create_revision =
            prev.ok_or_else(|| unexpected("update response lacks the previous value"))?;
        Ok(Outcome::Done(KeyValue {
            key: key.to_owned(),
            value,
            create_revision,
            mod_revision: revision,
        }))
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let full = self.full_key(key);
        let mut compares = vec![Compare::create_revision(
            full.clone(),
            CompareOp::Greater,
            0,
        )];
        if let Some(expected) = expected_revision {
            compares.push(Compare::mod_revision(
                full.clone(),
                CompareOp::Equal,
                expected,
            ));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::delete(
                full.clone(),
                Some(etcd_client::DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(full, None)]);
        let response = self.kv().txn(txn).await.map_err(etcd_error("delete"))?;
        if !response.succeeded() {
            return Ok(Outcome::Conflict(self.failed_branch_state(&response)?));
        }
        let revision = header_revision(response.header())?;
        let prev = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Delete(delete) => delete.prev_kvs().first().cloned(),
                _ => None,
            })
            .ok_or_else(|| unexpected("delete response lacks the previous value"))?;
        let mut deleted = self.key_value(&prev)?;
        deleted.mod_revision = revision;
        Ok(Outcome::Done(deleted))
    }

    async fn watch(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<WatchStream, StorageError> {
        let mut options = WatchOptions::new().with_prefix().with_prev_key();
        if from_revision > 0 {
            options = options.with_start_revision(from_revision);
        }
        let mut stream = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .watch(self.full_key(prefix), Some(options))
            .await
            .map_err(etcd_error("start watch"))?;
        // Wait until etcd has registered the watch: a watch "from now" must see every write made
        // after this call returns.
        match stream.message().await {
            Ok(Some(created)) if created.created() && !created.canceled() => {}
            Ok(Some(other)) => {
                return Err(StorageError::Unavailable {
                    message: format!(
                        "etcd refused the watch: canceled={} reason={:?}",
                        other.canceled(),
                        other.cancel_reason()
                    ),
                    source: None,
                });
            }
            Ok(None) => return Err(unexpected("etcd closed the watch before creating it")),
            Err(error) => return Err(etcd_error("start watch")(error)),
        }
        let watch = EtcdWatch {
            stream,
            namespace: self.namespace.clone(),
            next: from_revision.max(0),
            finished: false,
        };
        Ok(futures::stream::unfold(watch, |mut watch| async move {
            let item = watch.next_response().await?;
            Some((item, watch))
        })
        .boxed())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        match self.kv().compact(revision, None).await {
            Ok(_) => {}
            // Already compacted to or past `revision`: the goal holds; another replica got there.
            Err(error) if refusal(&error) == Some(Refusal::Compacted) => {}
            Err(error) => return Err(self.revision_error(error, revision, "compact").await),
        }
        self.compacted_hint.fetch_max(revision, Ordering::Relaxed);
        Ok(())
    }

    async fn current_revision(&self) -> Result<Revision, StorageError> {
        let response = self
            .kv()
            .get(
                self.full_key(PROBE_KEY),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(etcd_error("read the current revision"))?;
        header_revision(response.header())
    }

    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        // etcd exposes its compaction point only through refusals, so find the oldest readable
        // revision by bisection, starting from the last point seen (usually still exact: two
        // probes).
        let current = self.current_revision().await?;
        let hint = self
            .compacted_hint
            .load(Ordering::Relaxed)
            .clamp(1, current);
        let found = if self.readable(hint).await? {
            hint
        } else {
            // Invariant: `low` is not readable, `high` is (the current revision always is).
            let (mut low, mut high) = (hint, current);
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                if self.readable(middle).await? {
                    high = middle;
                } else {
                    low = middle;
                }
            }
            high
        };
        self.compacted_hint.fetch_max(found, Ordering::Relaxed);
        // Revision 1 readable means nothing was compacted, which the trait reports as 0.
        Ok(if found <= 1 { 0 } else { found })
    }
}

/// One etcd watch, translated and checked response by response.
struct EtcdWatch {
    stream: etcd_client::WatchStream,
    namespace: String,
    /// Events below this revision were delivered already (or precede the watch's start).
    next: Revision,
    finished: bool,
}

impl EtcdWatch {
    async fn next_response(&mut self) -> Option<Result<WatchResponse, StorageError>> {
        if self.finished {
            return None;
        }
        let item = self.step().await;
        if item.is_err() {
            self.finished = true;
        }
        Some(item)
    }

    async fn step(&mut self) -> Result<WatchResponse, StorageError> {
        loop {
            let response = match self.stream.message().await {
                Ok(Some(response)) => response,
                // A quiet end would look like "no more changes"; it means the opposite.
                Ok(None) => return Err(unexpected("etcd ended the watch stream")),
                Err(error) => return Err(etcd_error("watch")(error)),
            };
            if response.compact_revision() > 0 {
                return Err(StorageError::Compacted {
                    requested: self.next,
                    compacted: response.compact_revision(),
                });
            }
            if response.canceled() {
                return Err(StorageError::Unavailable {
                    message: format!("etcd cancelled the watch: {:?}", response.cancel_reason()),
                    source: None,
                });
            }
            if response.events().is_empty() {
                // A progress notification or a duplicate creation notice: nothing to deliver.
                continue;
            }
            let events = response
                .events()
                .iter()
                .map(|event| self.event(event))
                .collect::<Result<Vec<_>, _>>()?;
            let mut previous = self.next;
            for event in &events {
                if event.kv.mod_revision < previous {
                    return Err(unexpected(&format!(
                        "etcd watch went backwards: event at revision {} after revision {}",
                        event.kv.mod_revision, previous
                    )));
                }
                previous = event.kv.mod_revision;
            }
            // Responses split only between revisions, so the next one starts after this one.
            self.next = previous + 1;
            return Ok(WatchResponse {
                events,
                revision: previous,
            });
        }
    }

    fn event(&self, event: &etcd_client::Event) -> Result<WatchEvent, StorageError> {
        let raw = event
            .kv()
            .ok_or_else(|| unexpected("watch event without a key"))?;
        let kv = KeyValue {
            key: user_key(&self.namespace, raw.key())?,
            value: Bytes::copy_from_slice(raw.value()),
            create_revision: raw.create_revision(),
            mod_revision: raw.mod_revision(),
        };
        let prev = event
            .prev_kv()
            .map(|prev| {
                Ok::<_, StorageError>(KeyValue {
                    key: user_key(&self.namespace, prev.key())?,
                    value: Bytes::copy_from_slice(prev.value()),
                    create_revision: prev.create_revision(),
                    mod_revision: prev.mod_revision(),
                })
            })
            .transpose()?;
        let kind = match event.event_type() {
            EventType::Put => EventKind::Put,
            EventType::Delete => EventKind::Delete,
        };
        // etcd drops the previous value when it was compacted away before the event was sent;
        // an event that should carry one and does not cannot be trusted to be complete.
        let expects_prev = kind == EventKind::Delete || kv.create_revision != kv.mod_revision;
        if expects_prev && prev.is_none() {
            return Err(unexpected(&format!(
                "watch event for {} at revision {} lacks its previous value",
                kv.key, kv.mod_revision
            )));
        }
        Ok(WatchEvent { kind, kv, prev })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Compacted,
    Future,
}

/// etcd reports both as gRPC `OutOfRange` and tells them apart only by message.
fn refusal(error: &etcd_client::Error) -> Option<Refusal> {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return None;
    };
    let message = status.message();
    if message.contains("required revision has been compacted") {
        Some(Refusal::Compacted)
    } else if message.contains("required revision is a future revision") {
        Some(Refusal::Future)
    } else {
        None
    }
}

/// The end of the key range holding exactly the keys that start with `prefix`: the prefix without
/// its trailing 0xff bytes, last byte incremented. An empty or all-0xff prefix has no such end and
/// gets `"\0"`, which etcd reads as "to the end of the key space".
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn user_key(namespace: &str, raw: &[u8]) -> Result<String, StorageError> {
    let lossy = || String::from_utf8_lossy(raw).into_owned();
    let Some(key) = raw.strip_prefix(namespace.as_bytes()) else {
        return Err(StorageError::Corrupt {
            key: lossy(),
            message: format!("key outside the store's prefix {namespace:?}"),
        });
    };
    String::from_utf8(key.to_vec()).map_err(|error| StorageError::Corrupt {
        key: lossy(),
        message: format!("key is not UTF-8: {error}"),
    })
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision, StorageError> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| unexpected("etcd response without a header"))
}

fn etcd_error(context: impl std::fmt::Display) -> impl FnOnce(etcd_client::Error) -> StorageError {
    move |source| StorageError::Unavailable {
        message: format!("etcd {context}: {source}"),
        source: Some(Box::new(source)),
    }
}

fn unexpected(message: &str) -> StorageError {
    StorageError::Unavailable {
        message: format!("unexpected answer from etcd: {message}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_bounds_exactly_the_prefix() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"/a/", b"/a0"),
            (b"/registry/pods/", b"/registry/pods0"),
            (b"a", b"b"),
            (b"a\xff", b"b"),
            (b"a\xff\xff", b"b"),
            (b"\xff\xff", b"\0"),
            (b"", b"\0"),
        ];
        for (prefix, end) in cases {
            assert_eq!(prefix_end(prefix), *end, "prefix {prefix:?}");
        }
    }

    #[test]
    fn user_key_strips_the_namespace() -> Result<(), StorageError> {
        assert_eq!(user_key("/ns", b"/ns/a/b")?, "/a/b");
        assert_eq!(user_key("", b"/a")?, "/a");
        assert!(matches!(
            user_key("/ns", b"/other/a"),
            Err(StorageError::Corrupt { .. })
        ));
        assert!(matches!(
            user_key("", b"/\xff"),
            Err(StorageError::Corrupt { .. })
        ));
        Ok(())
    }
}
