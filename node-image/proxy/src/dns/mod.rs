//! Cluster DNS on the node: the record mapping of the Kubernetes DNS specification
//! (`records`).

pub mod records;
