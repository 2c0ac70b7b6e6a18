//! The error type of every decode and encode, and the field path it points at.

use std::fmt;

/// Why a body could not be decoded from, or a JSON value encoded to, the Kubernetes protobuf
/// form. Every variant that concerns a field names its path, e.g. `spec.template.spec.containers[0].image`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtobufError {
    /// The body does not start with the 4-byte prefix `k8s\0`.
    #[error("bad magic: a kubernetes protobuf body starts with the 4 bytes \"k8s\\0\"")]
    BadMagic,
    /// A varint, length or value runs past the end of its enclosing message.
    #[error("truncated protobuf data at {path}")]
    Truncated {
        /// Field being read.
        path: String,
    },
    /// A varint longer than the 10 bytes a 64-bit value can take.
    #[error("malformed varint at {path}")]
    MalformedVarint {
        /// Field being read.
        path: String,
    },
    /// A tag with field number 0, or a group / unknown wire type, which Kubernetes never writes.
    #[error("invalid field tag {tag} at {path}")]
    InvalidTag {
        /// The raw tag value.
        tag: u64,
        /// Message being read.
        path: String,
    },
    /// A known field arrived with a wire type its declared type cannot have.
    #[error("wrong wire type {found} at field {path} (expected {expected})")]
    WrongWireType {
        /// Field being read.
        path: String,
        /// Wire type the schema calls for.
        expected: &'static str,
        /// Wire type found on the wire.
        found: &'static str,
    },
    /// The envelope names no kind, or an object to encode has no `apiVersion` / `kind`.
    #[error("missing apiVersion or kind")]
    MissingTypeMeta,
    /// The envelope (or object) names a kind this crate has no schema for.
    #[error("unknown kind \"{gvk}\"")]
    UnknownKind {
        /// Rendered like Go's `GroupVersionKind.String()` without the leading slash for core:
        /// `apps/v1, Kind=Foo`.
        gvk: String,
    },
    /// `runtime.Unknown.contentEncoding` is set; Kubernetes clients never compress bodies this way.
    #[error("unsupported content encoding \"{0}\" in the protobuf envelope")]
    UnsupportedContentEncoding(String),
    /// `runtime.Unknown.contentType` names something other than protobuf.
    #[error("unsupported content type \"{0}\" in the protobuf envelope")]
    UnsupportedContentType(String),
    /// A string field holds bytes that are not UTF-8.
    #[error("invalid utf-8 in string field {path}")]
    InvalidUtf8 {
        /// Field being read.
        path: String,
    },
    /// A field holds a value its type does not allow (an IntOrString type other than 0/1,
    /// raw JSON that does not parse, a time out of range, a malformed duration...).
    #[error("invalid value at {path}: {reason}")]
    InvalidValue {
        /// Field being read or written.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Encoding: a JSON value of the wrong type for the field.
    #[error("expected {expected} at {path}, found {found}")]
    TypeMismatch {
        /// Field being written.
        path: String,
        /// JSON type the schema calls for.
        expected: &'static str,
        /// JSON type found.
        found: &'static str,
    },
    /// Messages nested deeper than any Kubernetes object does; refused so that hostile input
    /// cannot exhaust the stack.
    #[error("message nesting deeper than {limit} at {path}")]
    TooDeep {
        /// The nesting limit.
        limit: usize,
        /// Where the limit was hit.
        path: String,
    },
    /// The compiled-in descriptor data is inconsistent: a bug in this crate, not in the input.
    #[error("invalid embedded kubernetes descriptors: {0}")]
    Schema(String),
}

/// A field path built on the stack while walking a message, rendered only when an error needs
/// it, so that the happy path allocates nothing for it.
#[derive(Clone, Copy)]
pub(crate) enum Path<'a> {
    /// The object itself.
    Root,
    /// A named field of the parent.
    Field(&'a Path<'a>, &'a str),
    /// An element of a repeated parent.
    Index(&'a Path<'a>, usize),
    /// A value of a map parent.
    Key(&'a Path<'a>, &'a str),
}

impl Path<'_> {
    /// Renders the path for an error message.
    pub(crate) fn render(&self) -> String {
        let text = self.to_string();
        if text.is_empty() {
            "(root)".to_owned()
        } else {
            text
        }
    }
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => Ok(()),
            Path::Field(parent, name) => {
                if matches!(parent, Path::Root) {
                    write!(f, "{name}")
                } else {
                    write!(f, "{parent}.{name}")
                }
            }
            Path::Index(parent, index) => write!(f, "{parent}[{index}]"),
            Path::Key(parent, key) => write!(f, "{parent}[{key:?}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_render_like_json_accessors() {
        let root = Path::Root;
        let spec = Path::Field(&root, "spec");
        let containers = Path::Field(&spec, "containers");
        let first = Path::Index(&containers, 0);
        let image = Path::Field(&first, "image");
        let data = Path::Field(&root, "data");
        let key = Path::Key(&data, "a.b");
        let cases = [
            (root, "(root)"),
            (spec, "spec"),
            (image, "spec.containers[0].image"),
            (key, "data[\"a.b\"]"),
        ];
        for (path, want) in cases {
            assert_eq!(path.render(), want);
        }
    }

    #[test]
    fn messages_are_lowercase_and_specific() {
        let err = ProtobufError::UnknownKind {
            gvk: "apps/v1, Kind=Foo".into(),
        };
        assert_eq!(err.to_string(), "unknown kind \"apps/v1, Kind=Foo\"");
        let err = ProtobufError::WrongWireType {
            path: "spec.replicas".into(),
            expected: "varint",
            found: "length-delimited",
        };
        assert_eq!(
            err.to_string(),
            "wrong wire type length-delimited at field spec.replicas (expected varint)"
        );
    }
}
