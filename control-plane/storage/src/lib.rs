//! The revisioned key-value contract the apiserver stores objects in, and its two backends.
//!
//! This crate is the only one that links `etcd-client` and `redb`. Everything above it sees
//! [`Storage`]: a flat, ordered key space where every write gets a cluster-wide, strictly
//! increasing revision (the Kubernetes `resourceVersion`), modelled on etcd's v3 API and on the
//! kube-apiserver `storage.Interface` it is used through.
//!
//! - [`EmbeddedStorage`]: one redb file, fsync on commit, group commit; the zero-setup default.
//! - [`EtcdStorage`]: an etcd v3 cluster, for production and for several apiserver replicas.

mod embedded;
mod etcd;
mod types;

pub use embedded::{EmbeddedConfig, EmbeddedStorage};
pub use etcd::EtcdStorage;
pub use types::*;
