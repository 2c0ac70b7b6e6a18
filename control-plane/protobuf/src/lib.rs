//! Transcodes the Kubernetes protobuf wire format (`application/vnd.kubernetes.protobuf`) to
//! and from the Kubernetes JSON form, for the built-in types.
//!
//! kubectl and client-go send typed objects as protobuf: the 4 bytes `k8s\0`, then a
//! `runtime.Unknown` whose `typeMeta` names the kind and whose `raw` holds the object. The
//! apiserver works on JSON, so [`decode`] turns such a body into the `serde_json::Value` that
//! the same object would have been as JSON (camelCase keys, `apiVersion` and `kind` set), and
//! [`encode`] does the reverse for responses.
//!
//! The schemas come from the descriptor set compiled into k8s.io/api 1.33 (see
//! `descriptors/`): every core, apps, batch, networking, storage, rbac, policy, autoscaling,
//! scheduling, coordination, discovery, events, authentication, authorization, certificates,
//! admissionregistration, flowcontrol, node, resource, ... version, plus meta/v1 and the
//! apimachinery special types. Custom resources have no protobuf form and are not covered.

mod decode;
mod encode;
mod error;
mod go_json;
mod gotime;
pub mod openapi_v2;
mod schema;
mod wire;

pub use error::ProtobufError;

/// The media type of the Kubernetes protobuf encoding.
pub const PROTOBUF_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every enveloped protobuf body.
const MAGIC: &[u8] = b"k8s\0";

/// The deepest message nesting accepted. Real objects stay under 20 (a pod template inside a
/// job template inside a cron job); the limit only stops hostile input from exhausting the
/// stack.
const MAX_DEPTH: usize = 100;

/// True for `application/vnd.kubernetes.protobuf` (parameters ignored).
///
/// Media types are case-insensitive; surrounding whitespace is ignored. The watch stream form
/// (`;stream=watch`) counts too: telling it apart is the caller's business.
pub fn is_protobuf(content_type: &str) -> bool {
    let media_type = content_type
        .split_once(';')
        .map_or(content_type, |(media_type, _)| media_type);
    media_type
        .trim()
        .eq_ignore_ascii_case(PROTOBUF_CONTENT_TYPE)
}

/// Decodes the Kubernetes protobuf envelope (4-byte magic `k8s\0` + `runtime.Unknown{typeMeta,
/// raw, contentEncoding, contentType}`) and transcodes `raw`, the built-in object named by
/// `typeMeta`, into its Kubernetes JSON form: camelCase field names exactly as the JSON API,
/// with `apiVersion` and `kind` set.
///
/// The JSON is what Go's `json.Marshal` gives for the decoded struct, except that zero values
/// of non-pointer scalar fields are left out (they mean the same as absent). Fields the schema
/// does not know are skipped, as Go does.
///
/// # Errors
///
/// [`ProtobufError::BadMagic`] without the prefix, [`ProtobufError::UnknownKind`] for a kind
/// that is not built in, and a path-carrying error for malformed or mistyped data.
pub fn decode(body: &[u8]) -> Result<serde_json::Value, ProtobufError> {
    decode::envelope(schema::schema()?, body, 0)
}

/// Encodes the JSON of a built-in kind (with `apiVersion` and `kind`) into an enveloped
/// protobuf body, byte for byte what a Go client or apiserver writes for the same object.
///
/// JSON keys the schema does not know are dropped, as decoding the JSON into the Go struct
/// would drop them.
///
/// # Errors
///
/// [`ProtobufError::MissingTypeMeta`] without `apiVersion`/`kind`,
/// [`ProtobufError::UnknownKind`] for a kind that is not built in, and a path-carrying error
/// for a value of the wrong JSON type.
pub fn encode(value: &serde_json::Value) -> Result<Vec<u8>, ProtobufError> {
    encode::envelope(schema::schema()?, value)
}

pub use go_json::{GoJson, sort_unstructured};

#[cfg(test)]
mod tests;
