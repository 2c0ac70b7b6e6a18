//! Sans-IO machinery of `apiextensions.k8s.io` (upstream `k8s.io/apiextensions-apiserver`):
//! structural schemas and what they do to a custom resource — validation, pruning of unknown
//! fields and defaulting — as pure functions over `serde_json::Value`.
