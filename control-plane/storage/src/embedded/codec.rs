//! The on-disk byte layout of the embedded store's `kv` and `log` tables, and its decoding checks.
//!
//! Integers are little-endian and fixed width. Every decoder validates lengths and tags and reports
//! [`StorageError::Corrupt`] instead of panicking: the bytes come from disk.

use bytes::Bytes;

use crate::types::{EventKind, KeyValue, Revision, StorageError, WatchEvent};

/// The version of this layout, stored in the `meta` table; bump it on any incompatible change.
pub(crate) const FORMAT_VERSION: i64 = 1;

/// Upper bound on a key plus its value, far below what the `u32` length fields can hold.
pub(crate) const MAX_ENTRY_BYTES: usize = 1 << 30;

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const NO_PREV: u8 = 0;
const HAS_PREV: u8 = 1;

/// A key's state as the `kv` table holds it (the key itself is the table key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) create_revision: Revision,
    pub(crate) mod_revision: Revision,
    pub(crate) value: Bytes,
}

impl Stored {
    pub(crate) fn into_key_value(self, key: &str) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
        }
    }
}

/// `kv` table value: `create_revision | mod_revision | value`.
pub(crate) fn encode_stored(
    create_revision: Revision,
    mod_revision: Revision,
    value: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + value.len());
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(value);
    out
}

pub(crate) fn decode_stored(key: &str, bytes: &[u8]) -> Result<Stored, StorageError> {
    let mut reader = Reader::new(key, bytes);
    let create_revision = reader.i64()?;
    let mod_revision = reader.i64()?;
    let value = Bytes::copy_from_slice(reader.rest());
    Ok(Stored {
        create_revision,
        mod_revision,
        value,
    })
}

/// One committed change, as the `log` table holds it under its revision.
///
/// `prev` is what makes reads at a past revision possible: the state of `key` just before this
/// change is the state at every revision between the key's previous change and this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogRecord {
    pub(crate) kind: EventKind,
    pub(crate) key: String,
    /// Zero for a delete, like etcd's delete events.
    pub(crate) create_revision: Revision,
    /// Empty for a delete.
    pub(crate) value: Bytes,
    pub(crate) prev: Option<Stored>,
}

impl LogRecord {
    /// The watch event this record describes, committed at `revision`.
    pub(crate) fn into_event(self, revision: Revision) -> WatchEvent {
        let prev = self.prev.map(|prev| prev.into_key_value(&self.key));
        WatchEvent {
            kind: self.kind,
            kv: KeyValue {
                key: self.key,
                value: self.value,
                create_revision: self.create_revision,
                mod_revision: revision,
            },
            prev,
        }
    }
}

/// `log` table value:
/// `tag | key_len u32 | key | create_revision | value_len u32 | value | prev_tag [| prev_create | prev_mod | prev_value]`.
///
/// The key comes first so that scans can filter by prefix without decoding values.
pub(crate) fn encode_log(record: &LogRecord) -> Vec<u8> {
    let prev_len = record.prev.as_ref().map_or(0, |p| 16 + p.value.len());
    let mut out =
        Vec::with_capacity(1 + 4 + record.key.len() + 8 + 4 + record.value.len() + 1 + prev_len);
    out.push(match record.kind {
        EventKind::Put => TAG_PUT,
        EventKind::Delete => TAG_DELETE,
    });
    put_len_prefixed(&mut out, record.key.as_bytes());
    out.extend_from_slice(&record.create_revision.to_le_bytes());
    put_len_prefixed(&mut out, &record.value);
    match &record.prev {
        None => out.push(NO_PREV),
        Some(prev) => {
            out.push(HAS_PREV);
            out.extend_from_slice(&prev.create_revision.to_le_bytes());
            out.extend_from_slice(&prev.mod_revision.to_le_bytes());
            out.extend_from_slice(&prev.value);
        }
    }
    out
}

/// Only the key of a log record; `what` names the record in errors (its revision).
pub(crate) fn decode_log_key<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str, StorageError> {
    let mut reader = Reader::new(what, bytes);
    reader.tag()?;
    reader.str()
}

pub(crate) fn decode_log(what: &str, bytes: &[u8]) -> Result<LogRecord, StorageError> {
    let mut reader = Reader::new(what, bytes);
    let kind = match reader.tag()? {
        TAG_PUT => EventKind::Put,
        TAG_DELETE => EventKind::Delete,
        other => return Err(reader.corrupt(format!("unknown event tag {other}"))),
    };
    let key = reader.str()?.to_owned();
    let create_revision = reader.i64()?;
    let value = Bytes::copy_from_slice(reader.len_prefixed()?);
    let prev = match reader.tag()? {
        NO_PREV => {
            reader.finish()?;
            None
        }
        HAS_PREV => Some(Stored {
            create_revision: reader.i64()?,
            mod_revision: reader.i64()?,
            value: Bytes::copy_from_slice(reader.rest()),
        }),
        other => return Err(reader.corrupt(format!("unknown previous-state tag {other}"))),
    };
    Ok(LogRecord {
        kind,
        key,
        create_revision,
        value,
        prev,
    })
}

fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    // The store refuses keys and values above `MAX_ENTRY_BYTES` before they reach the writer, so
    // this cannot fire; if it ever did, a loud failure beats a silently truncated record.
    let len = u32::try_from(bytes.len())
        .unwrap_or_else(|_| panic!("record field of {} bytes exceeds 4 GiB", bytes.len()));
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
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
mod tests {
    use super::*;

    fn stored(create: Revision, modified: Revision, value: &'static [u8]) -> Stored {
        Stored {
            create_revision: create,
            mod_revision: modified,
            value: Bytes::from_static(value),
        }
    }

    #[test]
    fn stored_round_trips() -> Result<(), StorageError> {
        for value in [&b""[..], b"x", b"{\"kind\":\"Pod\"}", &[0u8, 255, 7]] {
            let bytes = encode_stored(3, 9, value);
            let expected = Stored {
                create_revision: 3,
                mod_revision: 9,
                value: Bytes::copy_from_slice(value),
            };
            assert_eq!(decode_stored("/k", &bytes)?, expected);
        }
        Ok(())
    }

    #[test]
    fn stored_rejects_truncation() {
        let bytes = encode_stored(3, 9, b"abc");
        for cut in 0..16 {
            let err = decode_stored("/k", &bytes[..cut]);
            assert!(
                matches!(err, Err(StorageError::Corrupt { ref key, .. }) if key == "/k"),
                "cut at {cut}: {err:?}"
            );
        }
    }

    fn records() -> Vec<LogRecord> {
        vec![
            LogRecord {
                kind: EventKind::Put,
                key: "/registry/pods/default/a".to_owned(),
                create_revision: 5,
                value: Bytes::from_static(b"new"),
                prev: None,
            },
            LogRecord {
                kind: EventKind::Put,
                key: "/k".to_owned(),
                create_revision: 5,
                value: Bytes::from_static(b"newer"),
                prev: Some(stored(5, 6, b"new")),
            },
            LogRecord {
                kind: EventKind::Delete,
                key: "/ключ".to_owned(),
                create_revision: 0,
                value: Bytes::new(),
                prev: Some(stored(5, 7, b"")),
            },
        ]
    }

    #[test]
    fn log_round_trips() -> Result<(), StorageError> {
        for record in records() {
            let bytes = encode_log(&record);
            assert_eq!(decode_log_key("rev 8", &bytes)?, record.key);
            assert_eq!(decode_log("rev 8", &bytes)?, record);
        }
        Ok(())
    }

    #[test]
    fn log_rejects_truncation_and_garbage() {
        for record in records() {
            let bytes = encode_log(&record);
            // Every strict prefix is invalid except, for records carrying a previous state, those
            // that cut only into the trailing previous value (it has no length of its own).
            let min_valid = bytes.len() - record.prev.as_ref().map_or(0, |p| p.value.len());
            for cut in 0..min_valid {
                assert!(
                    decode_log("rev 8", &bytes[..cut]).is_err(),
                    "cut at {cut} of {record:?}"
                );
            }
        }
        let mut bad_tag = encode_log(&records()[0]);
        bad_tag[0] = 9;
        assert!(
            matches!(decode_log("rev 8", &bad_tag), Err(StorageError::Corrupt { ref key, .. }) if key == "rev 8")
        );
        let mut trailing = encode_log(&records()[0]);
        trailing.push(0);
        assert!(decode_log("rev 8", &trailing).is_err());
        let mut bad_utf8 = encode_log(&records()[1]);
        bad_utf8[5] = 0xff;
        assert!(decode_log_key("rev 8", &bad_utf8).is_err());
    }

    #[test]
    fn log_record_becomes_event() {
        let event = records().swap_remove(2).into_event(8);
        assert_eq!(event.kind, EventKind::Delete);
        assert_eq!(event.kv.key, "/ключ");
        assert_eq!(event.kv.mod_revision, 8);
        assert_eq!(event.kv.create_revision, 0);
        assert!(event.kv.value.is_empty());
        let prev = event.prev.expect("delete carries its previous state");
        assert_eq!(
            (prev.key.as_str(), prev.create_revision, prev.mod_revision),
            ("/ключ", 5, 7)
        );
    }
}
