//! The on-disk byte layout of the embedded store's `keys` and `changes` tables (and of the
//! version-1 tables it converts), and its decoding checks.
//!
//! Integers are little-endian and fixed width. Every decoder validates lengths and tags and reports
//! [`StorageError::Corrupt`] instead of panicking: the bytes come from disk.

use bytes::Bytes;

use crate::types::{EventKind, KeyValue, Revision, StorageError, WatchEvent};

/// The version of this layout, stored in the `meta` table; bump it on any incompatible change.
/// Version 1 kept each value in `kv` and again in every `log` record that mentioned it; files
/// still in it are converted on open (see [`v1`]).
pub(crate) const FORMAT_VERSION: i64 = 2;

/// Upper bound on a key plus its value, far below what the `u32` length fields can hold.
pub(crate) const MAX_ENTRY_BYTES: usize = 1 << 30;

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const NO_PREV: u8 = 0;
const HAS_PREV: u8 = 1;

/// A key's revisions, as the `keys` table holds them: its value is in the `changes` record at
/// `mod_revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Revisions {
    pub(crate) create_revision: Revision,
    pub(crate) mod_revision: Revision,
}

/// `keys` table value: `create_revision | mod_revision`.
pub(crate) fn encode_revisions(revisions: Revisions) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&revisions.create_revision.to_le_bytes());
    out[8..].copy_from_slice(&revisions.mod_revision.to_le_bytes());
    out
}

pub(crate) fn decode_revisions(key: &str, bytes: &[u8]) -> Result<Revisions, StorageError> {
    let mut reader = Reader::new(key, bytes);
    let revisions = Revisions {
        create_revision: reader.i64()?,
        mod_revision: reader.i64()?,
    };
    reader.finish()?;
    Ok(revisions)
}

/// A key's whole state: its revisions and the value its latest change wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) create_revision: Revision,
    pub(crate) mod_revision: Revision,
    pub(crate) value: Bytes,
}

impl Stored {
    pub(crate) fn revisions(&self) -> Revisions {
        Revisions {
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }

    pub(crate) fn into_key_value(self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            stale: false,
        }
    }
}

/// One committed change, as the `changes` table holds it under its revision. A value is stored
/// only here, once: the `keys` table and later changes point at the change that wrote it.
///
/// `prev` is what makes reads at a past revision possible: the state of `key` just before this
/// change (the value of the change at `prev.mod_revision`) is its state at every revision between
/// that change and this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) kind: EventKind,
    pub(crate) key: String,
    /// Zero for a delete, like etcd's delete events.
    pub(crate) create_revision: Revision,
    /// Empty for a delete.
    pub(crate) value: Bytes,
    pub(crate) prev: Option<Revisions>,
}

impl Change {
    /// The watch event this change describes, committed at `revision`, given the key's previous
    /// state (the caller reads it from the change `self.prev` points at).
    pub(crate) fn into_event(self, revision: Revision, prev: Option<Stored>) -> WatchEvent {
        let prev = prev.map(|prev| prev.into_key_value(&self.key));
        WatchEvent {
            kind: self.kind,
            kv: KeyValue {
                key: self.key,
                value: self.value,
                create_revision: self.create_revision,
                mod_revision: revision,
                stale: false,
            },
            prev,
        }
    }
}

/// `changes` table value:
/// `tag | key_len u32 | key | create_revision | value_len u32 | value | prev_tag [| prev_create | prev_mod]`.
///
/// The key comes first so that scans can filter by prefix without decoding values.
pub(crate) fn encode_change(change: &Change) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 4 + change.key.len() + 8 + 4 + change.value.len() + 17);
    out.push(match change.kind {
        EventKind::Put => TAG_PUT,
        EventKind::Delete => TAG_DELETE,
    });
    put_len_prefixed(&mut out, change.key.as_bytes());
    out.extend_from_slice(&change.create_revision.to_le_bytes());
    put_len_prefixed(&mut out, &change.value);
    match change.prev {
        None => out.push(NO_PREV),
        Some(prev) => {
            out.push(HAS_PREV);
            out.extend_from_slice(&encode_revisions(prev));
        }
    }
    out
}

/// Only the key of a change; `what` names the record in errors (its revision).
pub(crate) fn decode_change_key<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str, StorageError> {
    Ok(Reader::new(what, bytes).change_head()?.key)
}

/// What a change wrote: its kind, its key (borrowed) and its value (copied), for reads that only
/// want a key's value.
pub(crate) fn decode_written<'a>(
    what: &str,
    bytes: &'a [u8],
) -> Result<(EventKind, &'a str, Bytes), StorageError> {
    let mut reader = Reader::new(what, bytes);
    let head = reader.change_head()?;
    reader.prev_revisions()?;
    reader.finish()?;
    Ok((head.kind, head.key, Bytes::copy_from_slice(head.value)))
}

pub(crate) fn decode_change(what: &str, bytes: &[u8]) -> Result<Change, StorageError> {
    let mut reader = Reader::new(what, bytes);
    let head = reader.change_head()?;
    let prev = reader.prev_revisions()?;
    reader.finish()?;
    Ok(head.into_change(prev))
}

/// Only what links a change to the others: its kind and where the key's previous state is. Reads
/// past the key and value without copying them (compaction scans many changes).
pub(crate) fn decode_change_links(
    what: &str,
    bytes: &[u8],
) -> Result<(EventKind, Option<Revisions>), StorageError> {
    let mut reader = Reader::new(what, bytes);
    let kind = reader.change_head()?.kind;
    let prev = reader.prev_revisions()?;
    reader.finish()?;
    Ok((kind, prev))
}

/// Version 1 of the layout, read only to convert a file written by an earlier build: `kv` held
/// `create_revision | mod_revision | value`, and a `log` record ended with the whole previous
/// state, `prev_tag [| prev_create | prev_mod | prev_value]`.
pub(crate) mod v1 {
    use super::*;

    pub(crate) const FORMAT_VERSION: i64 = 1;

    pub(crate) fn decode_kv(key: &str, bytes: &[u8]) -> Result<Stored, StorageError> {
        let mut reader = Reader::new(key, bytes);
        Ok(Stored {
            create_revision: reader.i64()?,
            mod_revision: reader.i64()?,
            value: Bytes::copy_from_slice(reader.rest()),
        })
    }

    /// A `log` record: the change (with `prev` reduced to its revisions) and the whole previous
    /// state it carried.
    pub(crate) fn decode_log(
        what: &str,
        bytes: &[u8],
    ) -> Result<(Change, Option<Stored>), StorageError> {
        let mut reader = Reader::new(what, bytes);
        let head = reader.change_head()?;
        let prev = match reader.tag()? {
            NO_PREV => {
                reader.finish()?;
                None
            }
            HAS_PREV => Some(decode_kv(what, reader.rest())?),
            other => return Err(reader.corrupt(format!("unknown previous-state tag {other}"))),
        };
        Ok((head.into_change(prev.as_ref().map(Stored::revisions)), prev))
    }
}

fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    // The store refuses keys and values above `MAX_ENTRY_BYTES` before they reach the writer, so
    // this cannot fire; if it ever did, a loud failure beats a silently truncated record.
    let len = u32::try_from(bytes.len())
        .unwrap_or_else(|_| panic!("record field of {} bytes exceeds 4 GiB", bytes.len()));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

/// What every change record, of either version, starts with, borrowed from the record.
struct ChangeHead<'a> {
    kind: EventKind,
    key: &'a str,
    create_revision: Revision,
    value: &'a [u8],
}

impl ChangeHead<'_> {
    fn into_change(self, prev: Option<Revisions>) -> Change {
        Change {
            kind: self.kind,
            key: self.key.to_owned(),
            create_revision: self.create_revision,
            value: Bytes::copy_from_slice(self.value),
            prev,
        }
    }
}

/// A bounds-checked cursor over one stored value.
struct Reader<'w, 'a> {
    what: &'w str,
    bytes: &'a [u8],
}

impl<'w, 'a> Reader<'w, 'a> {
    fn new(what: &'w str, bytes: &'a [u8]) -> Self {
        Self { what, bytes }
    }

    fn corrupt(&self, message: String) -> StorageError {
        StorageError::Corrupt {
            key: self.what.to_owned(),
            message,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        if self.bytes.len() < n {
            return Err(self.corrupt(format!(
                "record truncated: wanted {n} more bytes, {} left",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn tag(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    /// A change's `tag | key_len u32 | key | create_revision | value_len u32 | value`.
    fn change_head(&mut self) -> Result<ChangeHead<'a>, StorageError> {
        Ok(ChangeHead {
            kind: self.kind()?,
            key: self.str()?,
            create_revision: self.i64()?,
            value: self.len_prefixed()?,
        })
    }

    /// A change's trailing `prev_tag [| prev_create | prev_mod]`.
    fn prev_revisions(&mut self) -> Result<Option<Revisions>, StorageError> {
        match self.tag()? {
            NO_PREV => Ok(None),
            HAS_PREV => Ok(Some(Revisions {
                create_revision: self.i64()?,
                mod_revision: self.i64()?,
            })),
            other => Err(self.corrupt(format!("unknown previous-state tag {other}"))),
        }
    }

    fn kind(&mut self) -> Result<EventKind, StorageError> {
        match self.tag()? {
            TAG_PUT => Ok(EventKind::Put),
            TAG_DELETE => Ok(EventKind::Delete),
            other => Err(self.corrupt(format!("unknown event tag {other}"))),
        }
    }

    fn i64(&mut self) -> Result<i64, StorageError> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(i64::from_le_bytes(raw))
    }

    fn len_prefixed(&mut self) -> Result<&'a [u8], StorageError> {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        let len = usize::try_from(u32::from_le_bytes(raw))
            .map_err(|_| self.corrupt("length does not fit in memory".to_owned()))?;
        self.take(len)
    }

    fn str(&mut self) -> Result<&'a str, StorageError> {
        let bytes = self.len_prefixed()?;
        std::str::from_utf8(bytes).map_err(|e| self.corrupt(format!("key is not UTF-8: {e}")))
    }

    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.bytes)
    }

    fn finish(&self) -> Result<(), StorageError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.corrupt(format!("{} trailing bytes", self.bytes.len())))
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn revisions(create: Revision, modified: Revision) -> Revisions {
        Revisions {
            create_revision: create,
            mod_revision: modified,
        }
    }

    #[test]
    fn revisions_round_trip_and_reject_any_other_length() -> Result<(), StorageError> {
        let bytes = encode_revisions(revisions(3, 9));
        assert_eq!(decode_revisions("/k", &bytes)?, revisions(3, 9));
        for len in (0..16).chain([17]) {
            let mut wrong = bytes.to_vec();
            wrong.resize(len, 0);
            let err = decode_revisions("/k", &wrong);
            assert!(
                matches!(err, Err(StorageError::Corrupt { ref key, .. }) if key == "/k"),
                "length {len}: {err:?}"
            );
        }
        Ok(())
    }

    fn changes() -> Vec<Change> {
        vec![
            Change {
                kind: EventKind::Put,
                key: "/registry/pods/default/a".to_owned(),
                create_revision: 5,
                value: Bytes::from_static(b"new"),
                prev: None,
            },
            Change {
                kind: EventKind::Put,
                key: "/k".to_owned(),
                create_revision: 5,
                value: Bytes::from_static(b"newer"),
                prev: Some(revisions(5, 6)),
            },
            Change {
                kind: EventKind::Delete,
                key: "/ключ".to_owned(),
                create_revision: 0,
                value: Bytes::new(),
                prev: Some(revisions(5, 7)),
            },
        ]
    }

    #[test]
    fn change_round_trips() -> Result<(), StorageError> {
        for change in changes() {
            let bytes = encode_change(&change);
            assert_eq!(decode_change_key("rev 8", &bytes)?, change.key);
            assert_eq!(decode_change("rev 8", &bytes)?, change);
            assert_eq!(
                decode_change_links("rev 8", &bytes)?,
                (change.kind, change.prev)
            );
        }
        Ok(())
    }

    #[test]
    fn change_rejects_truncation_and_garbage() {
        for change in changes() {
            let bytes = encode_change(&change);
            for cut in 0..bytes.len() {
                assert!(
                    decode_change("rev 8", &bytes[..cut]).is_err(),
                    "cut at {cut} of {change:?}"
                );
                assert!(decode_change_links("rev 8", &bytes[..cut]).is_err());
                assert!(decode_written("rev 8", &bytes[..cut]).is_err());
            }
        }
        let mut bad_tag = encode_change(&changes()[0]);
        bad_tag[0] = 9;
        assert!(
            matches!(decode_change("rev 8", &bad_tag), Err(StorageError::Corrupt { ref key, .. }) if key == "rev 8")
        );
        let mut trailing = encode_change(&changes()[1]);
        trailing.push(0);
        assert!(decode_change("rev 8", &trailing).is_err());
        let mut bad_utf8 = encode_change(&changes()[1]);
        bad_utf8[5] = 0xff;
        assert!(decode_change_key("rev 8", &bad_utf8).is_err());
    }

    #[test]
    fn change_becomes_written_state_and_event() -> Result<(), StorageError> {
        let mut all = changes();
        let update = all.swap_remove(1);
        assert_eq!(
            decode_written("rev 8", &encode_change(&update))?,
            (EventKind::Put, "/k", Bytes::from_static(b"newer"))
        );
        let prev = Stored {
            create_revision: 5,
            mod_revision: 6,
            value: Bytes::from_static(b"new"),
        };
        let event = update.into_event(8, Some(prev));
        assert_eq!(event.kv.mod_revision, 8);
        let prev = event.prev.expect("an update carries its previous state");
        assert_eq!(
            (prev.key.as_str(), prev.mod_revision, &prev.value[..]),
            ("/k", 6, &b"new"[..])
        );

        let delete = all.swap_remove(1);
        assert_eq!(
            decode_written("rev 9", &encode_change(&delete))?.0,
            EventKind::Delete
        );
        let event = delete.into_event(9, None);
        assert_eq!(event.kind, EventKind::Delete);
        assert_eq!(event.kv.key, "/ключ");
        assert_eq!((event.kv.mod_revision, event.kv.create_revision), (9, 0));
        assert!(event.kv.value.is_empty());
        Ok(())
    }

    /// Version 1's `log` record for `change` with the whole previous state `prev` appended.
    pub(crate) fn v1_log(change: &Change, prev: Option<&Stored>) -> Vec<u8> {
        let mut out = encode_change(&Change {
            prev: None,
            ..change.clone()
        });
        if let Some(prev) = prev {
            *out.last_mut().expect("a record ends with its prev tag") = HAS_PREV;
            out.extend_from_slice(&v1_kv(prev));
        }
        out
    }

    /// Version 1's `kv` value for `state`.
    pub(crate) fn v1_kv(state: &Stored) -> Vec<u8> {
        let mut out = encode_revisions(state.revisions()).to_vec();
        out.extend_from_slice(&state.value);
        out
    }

    #[test]
    fn version_1_records_decode() -> Result<(), StorageError> {
        let prev = Stored {
            create_revision: 5,
            mod_revision: 6,
            value: Bytes::from_static(b"new"),
        };
        assert_eq!(v1::decode_kv("/k", &v1_kv(&prev))?, prev);
        let update = changes().swap_remove(1);
        let (change, whole_prev) = v1::decode_log("rev 8", &v1_log(&update, Some(&prev)))?;
        assert_eq!((change, whole_prev), (update, Some(prev)));
        let create = changes().swap_remove(0);
        assert_eq!(
            v1::decode_log("rev 8", &v1_log(&create, None))?,
            (create, None)
        );
        Ok(())
    }
}
