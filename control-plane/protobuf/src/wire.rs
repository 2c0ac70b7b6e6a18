//! The protobuf binary wire format: a bounds-checked field reader and the few writers the
//! encoder needs. Nothing here knows about Kubernetes.

use crate::error::{Path, ProtobufError};

/// One field value as it sits on the wire, before the schema gives it a meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireValue<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1 (fixed64, sfixed64, double).
    Fixed64(u64),
    /// Wire type 2 (string, bytes, embedded message, packed repeated).
    Bytes(&'a [u8]),
    /// Wire type 5 (fixed32, sfixed32, float).
    Fixed32(u32),
}

impl WireValue<'_> {
    /// The wire type's name, for error messages.
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            WireValue::Varint(_) => "varint",
            WireValue::Fixed64(_) => "fixed64",
            WireValue::Bytes(_) => "length-delimited",
            WireValue::Fixed32(_) => "fixed32",
        }
    }
}

/// Wire type numbers, as they appear in the low 3 bits of a tag.
pub(crate) const VARINT: u8 = 0;
pub(crate) const FIXED64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const FIXED32: u8 = 5;

/// Iterates over the fields of one serialized message.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over one message's bytes.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// True once every byte has been consumed.
    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// Reads one base-128 varint. `path` names the message being read, for errors.
    pub(crate) fn varint(&mut self, path: &Path<'_>) -> Result<u64, ProtobufError> {
        let mut value: u64 = 0;
        // A u64 takes at most 10 groups of 7 bits; anything longer is corrupt, not just big.
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos) else {
                return Err(ProtobufError::Truncated {
                    path: path.render(),
                });
            };
            self.pos += 1;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(ProtobufError::MalformedVarint {
            path: path.render(),
        })
    }

    /// Takes the next `len` bytes.
    pub(crate) fn take(&mut self, len: u64, path: &Path<'_>) -> Result<&'a [u8], ProtobufError> {
        let truncated = || ProtobufError::Truncated {
            path: path.render(),
        };
        let len = usize::try_from(len).map_err(|_| truncated())?;
        let end = self.pos.checked_add(len).ok_or_else(truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(bytes)
    }

    /// Reads the next field, or `None` at the end of the message.
    pub(crate) fn next_field(
        &mut self,
        path: &Path<'_>,
    ) -> Result<Option<(u32, WireValue<'a>)>, ProtobufError> {
        if self.is_empty() {
            return Ok(None);
        }
        let tag = self.varint(path)?;
        let number = tag >> 3;
        // Field numbers are 29-bit and never 0; anything else means we are not looking at a
        // protobuf message at all, which deserves an error rather than a skipped field.
        let number = match u32::try_from(number) {
            Ok(n) if (1..(1 << 29)).contains(&n) => n,
            _ => {
                return Err(ProtobufError::InvalidTag {
                    tag,
                    path: path.render(),
                });
            }
        };
        let value = match (tag & 7) as u8 {
            VARINT => WireValue::Varint(self.varint(path)?),
            FIXED64 => {
                let bytes = self.take(8, path)?;
                let mut le = [0u8; 8];
                le.copy_from_slice(bytes);
                WireValue::Fixed64(u64::from_le_bytes(le))
            }
            LEN => {
                let len = self.varint(path)?;
                WireValue::Bytes(self.take(len, path)?)
            }
            FIXED32 => {
                let bytes = self.take(4, path)?;
                let mut le = [0u8; 4];
                le.copy_from_slice(bytes);
                WireValue::Fixed32(u32::from_le_bytes(le))
            }
            // Groups (3, 4) are a deprecated proto2 feature no Kubernetes type uses; 6 and 7
            // do not exist.
            _ => {
                return Err(ProtobufError::InvalidTag {
                    tag,
                    path: path.render(),
                });
            }
        };
        Ok(Some((number, value)))
    }
}

/// Appends a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a field tag.
pub(crate) fn put_tag(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

/// Appends a length-delimited field.
pub(crate) fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Appends a varint field.
pub(crate) fn put_varint_field(out: &mut Vec<u8>, number: u32, value: u64) {
    put_tag(out, number, VARINT);
    put_varint(out, value);
}

/// Zig-zag decoding for sint32/sint64.
pub(crate) fn unzigzag(value: u64) -> i64 {
    ((value >> 1) as i64) ^ -((value & 1) as i64)
}

/// Zig-zag encoding for sint32/sint64.
pub(crate) fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(bytes: &[u8]) -> Result<Vec<(u32, WireValue<'_>)>, ProtobufError> {
        let mut reader = Reader::new(bytes);
        let mut out = Vec::new();
        while let Some(field) = reader.next_field(&Path::Root)? {
            out.push(field);
        }
        Ok(out)
    }

    #[test]
    fn reads_every_wire_type() {
        let bytes = [
            0x08, 0x96, 0x01, // 1: varint 150
            0x11, 1, 0, 0, 0, 0, 0, 0, 0, // 2: fixed64 1
            0x1a, 0x02, b'h', b'i', // 3: "hi"
            0x25, 2, 0, 0, 0, // 4: fixed32 2
        ];
        assert_eq!(
            fields(&bytes),
            Ok(vec![
                (1, WireValue::Varint(150)),
                (2, WireValue::Fixed64(1)),
                (3, WireValue::Bytes(b"hi")),
                (4, WireValue::Fixed32(2)),
            ])
        );
    }

    #[test]
    fn rejects_corrupt_input() {
        let truncated = ProtobufError::Truncated {
            path: "(root)".into(),
        };
        let cases: [(&[u8], ProtobufError); 6] = [
            (&[0x08], truncated.clone()),
            (&[0x0a, 0x05, b'a'], truncated.clone()),
            (&[0x11, 1, 2], truncated),
            (
                &[
                    0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
                ],
                ProtobufError::MalformedVarint {
                    path: "(root)".into(),
                },
            ),
            (
                &[0x00, 0x01],
                ProtobufError::InvalidTag {
                    tag: 0,
                    path: "(root)".into(),
                },
            ),
            (
                &[0x0b],
                ProtobufError::InvalidTag {
                    tag: 0x0b,
                    path: "(root)".into(),
                },
            ),
        ];
        for (bytes, want) in cases {
            assert_eq!(fields(bytes), Err(want), "{bytes:?}");
        }
    }

    #[test]
    fn varints_round_trip() {
        for value in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(Reader::new(&out).varint(&Path::Root), Ok(value));
        }
        // Negative int32s are sign-extended to 10 bytes, as every protobuf runtime writes them.
        let mut out = Vec::new();
        put_varint(&mut out, -1i64 as u64);
        assert_eq!(out.len(), 10);
    }

    #[test]
    fn zigzag_matches_the_spec_table() {
        for (signed, encoded) in [
            (0i64, 0u64),
            (-1, 1),
            (1, 2),
            (-2, 3),
            (i64::MAX, u64::MAX - 1),
        ] {
            assert_eq!(zigzag(signed), encoded);
            assert_eq!(unzigzag(encoded), signed);
        }
    }
}
