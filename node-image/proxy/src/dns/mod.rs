//! Cluster DNS on the node: the record mapping of the Kubernetes DNS specification
//! (`records`) and the responder that serves it on the cluster DNS address (`server`).

pub mod records;
pub mod server;
