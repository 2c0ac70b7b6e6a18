//! Sans-IO Kubernetes API machinery for Flotilla: label and field selectors, name validation,
//! JSON / merge / strategic-merge patches, server-side-apply field ownership and RBAC
//! authorization (rule evaluation, aggregation, escalation checks, bootstrap policy), and the
//! node bootstrap document (`nodeconfig`) the cloud controller writes and nodes read, resource
//! quantities and ResourceQuota's evaluators (`quantity`, `quota`), the LimitRanger and
//! PodSecurity admission rules (`limit_range`, `pod_security`), errors printed with their
//! causes on one line (`errors`), JSON bytes as Go's encoder writes them (`gojson`), and the
//! PEM and PKCS#10 payloads of CertificateSigningRequests (`csr`), and the messages of the
//! KMS v2 plugin API (`kms`), and request bodies read within limits (`request_body`).
//!
//! Everything here is a pure function over `serde_json::Value` and plain maps; nothing does IO,
//! so the apiserver (and anything else) can call it from any context and test it with tables.
//! Names follow upstream `k8s.io/apimachinery` and `sigs.k8s.io/structured-merge-diff` so a
//! reader who knows Kubernetes can find things.

pub mod cidr;
pub mod continue_token;
pub mod csr;
pub mod errors;
pub mod field;
pub mod goduration;
pub mod gojson;
pub mod kms;
pub mod kubeconfig;
pub mod limit_range;
pub mod managed_fields;
pub mod names;
pub mod nodeconfig;
pub mod patch;
pub mod pod_security;
pub mod quantity;
pub mod query;
pub mod quota;
pub mod rbac;
pub mod request_body;
pub mod schema;
pub mod selector;
