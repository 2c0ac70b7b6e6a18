//! Kubernetes' use of the Common Expression Language (upstream `k8s.io/apiserver/pkg/cel` and
//! `apiextensions-apiserver/pkg/apiserver/schema/cel`): `x-kubernetes-validations` rules compiled
//! once per schema and evaluated against custom resources.
