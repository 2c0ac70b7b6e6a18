//! The restricted Pod Security checks (upstream `policy/check_*.go` with
//! `Level: api.LevelRestricted`): each check's revisions by policy version, the baseline checks
//! each one overrides, and the exact forbidden reason and detail.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PodSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::baseline::{
    CAPABILITIES_BASELINE, HOST_PATH_VOLUMES, PROC_MOUNT, SECCOMP_PROFILE_BASELINE, proc_mount_1_0,
    valid_seccomp,
};
use super::{
    Check, Violation, containers, containers_phrase, in_user_namespace, is_windows, join_quote,
    overriding, pluralize, pod_security_context, since, violation,
};

/// Restricted checks sorted by ID (byte order, as upstream sorts them); they report after every
/// baseline check.
pub(super) const CHECKS: &[Check] = &[
    Check {
        id: "allowPrivilegeEscalation",
        versions: &[
            since(8, allow_privilege_escalation_1_8),
            since(25, allow_privilege_escalation_1_25),
        ],
    },
    Check {
        id: "capabilities_restricted",
        versions: &[
            overriding(22, capabilities_restricted_1_22, &[CAPABILITIES_BASELINE]),
            overriding(25, capabilities_restricted_1_25, &[CAPABILITIES_BASELINE]),
        ],
    },
    Check {
        id: "procMount_restricted",
        // Baseline relaxes procMount for user-namespaced pods from 1.35; restricted keeps the
        // unconditional rule.
        versions: &[overriding(35, proc_mount_1_0, &[PROC_MOUNT])],
    },
    Check {
        id: "restrictedVolumes",
        versions: &[overriding(0, restricted_volumes_1_0, &[HOST_PATH_VOLUMES])],
    },
    Check {
        id: "runAsNonRoot",
        versions: &[
            since(0, run_as_non_root_1_0),
            since(35, run_as_non_root_1_35),
        ],
    },
    Check {
        id: "runAsUser",
        versions: &[since(23, run_as_user_1_23), since(35, run_as_user_1_35)],
    },
    Check {
        id: "seccompProfile_restricted",
        versions: &[
            overriding(
                19,
                seccomp_profile_restricted_1_19,
                &[SECCOMP_PROFILE_BASELINE],
            ),
            overriding(
                25,
                seccomp_profile_restricted_1_25,
                &[SECCOMP_PROFILE_BASELINE],
            ),
        ],
    },
];

fn allow_privilege_escalation_1_8(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad: Vec<&str> = containers(spec)
        .filter(|c| {
            c.security_context
                .and_then(|sc| sc.allow_privilege_escalation)
                != Some(false)
        })
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&bad)
        ),
    )
}

/// From 1.25 Windows pods are exempt: API validation forbids the Linux-only field there.
fn allow_privilege_escalation_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    allow_privilege_escalation_1_8(meta, spec)
}

/// Containers must drop `ALL` and may add only `NET_BIND_SERVICE`.
fn capabilities_restricted_1_22(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut missing_drop_all = Vec::new();
    let mut adding_forbidden = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in containers(spec) {
        let Some(capabilities) = c.security_context.and_then(|sc| sc.capabilities.as_ref()) else {
            missing_drop_all.push(c.name);
            continue;
        };
        let dropped = capabilities.drop.as_deref().unwrap_or_default();
        if !dropped.iter().any(|capability| capability == "ALL") {
            missing_drop_all.push(c.name);
        }
        let mut added_forbidden = false;
        for capability in capabilities.add.as_deref().unwrap_or_default() {
            if capability != "NET_BIND_SERVICE" {
                added_forbidden = true;
                forbidden.insert(capability.as_str());
            }
        }
        if added_forbidden {
            adding_forbidden.push(c.name);
        }
    }
    let mut details = Vec::new();
    if !missing_drop_all.is_empty() {
        details.push(format!(
            r#"{} must set securityContext.capabilities.drop=["ALL"]"#,
            containers_phrase(&missing_drop_all)
        ));
    }
    if !adding_forbidden.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding_forbidden),
            join_quote(forbidden)
        ));
    }
    if details.is_empty() {
        return None;
    }
    violation("unrestricted capabilities", details.join("; "))
}

/// From 1.25 Windows pods are exempt: API validation forbids capabilities there.
fn capabilities_restricted_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    capabilities_restricted_1_22(meta, spec)
}

/// Only ephemeral and API-backed inline volume types (and PVCs) are allowed.
fn restricted_volumes_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_volumes = Vec::new();
    let mut bad_types = BTreeSet::new();
    for volume in spec.volumes.iter().flatten() {
        if let Some(type_) = restricted_volume_type(volume) {
            bad_volumes.push(volume.name.as_str());
            bad_types.insert(type_);
        }
    }
    if bad_volumes.is_empty() {
        return None;
    }
    violation(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            pluralize("volume", "volumes", bad_volumes.len()),
            join_quote(&bad_volumes),
            pluralize("uses", "use", bad_volumes.len()),
            pluralize(
                "restricted volume type",
                "restricted volume types",
                bad_types.len()
            ),
            join_quote(bad_types)
        ),
    )
}

/// The volume's source type when it is not an allowed one; `"unknown"` when no source is set.
fn restricted_volume_type(v: &Volume) -> Option<&'static str> {
    let allowed = v.config_map.is_some()
        || v.csi.is_some()
        || v.downward_api.is_some()
        || v.empty_dir.is_some()
        || v.ephemeral.is_some()
        || v.image.is_some()
        || v.persistent_volume_claim.is_some()
        || v.projected.is_some()
        || v.secret.is_some();
    if allowed {
        return None;
    }
    let restricted = [
        (v.host_path.is_some(), "hostPath"),
        (v.gce_persistent_disk.is_some(), "gcePersistentDisk"),
        (v.aws_elastic_block_store.is_some(), "awsElasticBlockStore"),
        (v.git_repo.is_some(), "gitRepo"),
        (v.nfs.is_some(), "nfs"),
        (v.iscsi.is_some(), "iscsi"),
        (v.glusterfs.is_some(), "glusterfs"),
        (v.rbd.is_some(), "rbd"),
        (v.flex_volume.is_some(), "flexVolume"),
        (v.cinder.is_some(), "cinder"),
        (v.cephfs.is_some(), "cephfs"),
        (v.flocker.is_some(), "flocker"),
        (v.fc.is_some(), "fc"),
        (v.azure_file.is_some(), "azureFile"),
        (v.vsphere_volume.is_some(), "vsphereVolume"),
        (v.quobyte.is_some(), "quobyte"),
        (v.azure_disk.is_some(), "azureDisk"),
        (v.photon_persistent_disk.is_some(), "photonPersistentDisk"),
        (v.portworx_volume.is_some(), "portworxVolume"),
        (v.scale_io.is_some(), "scaleIO"),
        (v.storageos.is_some(), "storageos"),
    ];
    Some(
        restricted
            .into_iter()
            .find(|(set, _)| *set)
            .map_or("unknown", |(_, name)| name),
    )
}

/// The pod, or every container not covered by it, must set `runAsNonRoot: true`.
fn run_as_non_root_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut setters = Vec::new();
    let pod_value = pod_security_context(spec).and_then(|sc| sc.run_as_non_root);
    if pod_value == Some(false) {
        setters.push("pod".to_string());
    }
    let mut explicitly_bad = Vec::new();
    let mut implicitly_bad = Vec::new();
    for c in containers(spec) {
        match c.security_context.and_then(|sc| sc.run_as_non_root) {
            Some(false) => explicitly_bad.push(c.name),
            Some(true) => {}
            None if pod_value != Some(true) => implicitly_bad.push(c.name),
            None => {}
        }
    }
    if !explicitly_bad.is_empty() {
        setters.push(containers_phrase(&explicitly_bad));
    }
    if !setters.is_empty() {
        return violation(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                setters.join(" and ")
            ),
        );
    }
    if implicitly_bad.is_empty() {
        return None;
    }
    violation(
        "runAsNonRoot != true",
        format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            containers_phrase(&implicitly_bad)
        ),
    )
}

/// From 1.35 a pod in a user namespace may run as root inside it.
fn run_as_non_root_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    run_as_non_root_1_0(meta, spec)
}

fn run_as_user_1_23(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut setters = Vec::new();
    if pod_security_context(spec).and_then(|sc| sc.run_as_user) == Some(0) {
        setters.push("pod".to_string());
    }
    let bad: Vec<&str> = containers(spec)
        .filter(|c| c.security_context.and_then(|sc| sc.run_as_user) == Some(0))
        .map(|c| c.name)
        .collect();
    if !bad.is_empty() {
        setters.push(containers_phrase(&bad));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", setters.join(" and ")),
    )
}

/// From 1.35 a pod in a user namespace may set `runAsUser: 0`.
fn run_as_user_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    run_as_user_1_23(meta, spec)
}

/// A `RuntimeDefault` or `Localhost` profile must be set, on the pod or on every container.
fn seccomp_profile_restricted_1_19(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut bad_values = BTreeSet::new();
    let mut pod_set = false;
    if let Some(profile) = pod_security_context(spec).and_then(|sc| sc.seccomp_profile.as_ref()) {
        if valid_seccomp(&profile.type_) {
            pod_set = true;
        } else {
            setters.push("pod".to_string());
            bad_values.insert(profile.type_.as_str());
        }
    }
    let mut explicitly_bad = Vec::new();
    let mut implicitly_bad = Vec::new();
    for c in containers(spec) {
        match c
            .security_context
            .and_then(|sc| sc.seccomp_profile.as_ref())
        {
            Some(profile) if !valid_seccomp(&profile.type_) => {
                explicitly_bad.push(c.name);
                bad_values.insert(profile.type_.as_str());
            }
            Some(_) => {}
            None if !pod_set => implicitly_bad.push(c.name),
            None => {}
        }
    }
    if !explicitly_bad.is_empty() {
        setters.push(containers_phrase(&explicitly_bad));
    }
    if !setters.is_empty() {
        return violation(
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                setters.join(" and "),
                join_quote(bad_values)
            ),
        );
    }
    if implicitly_bad.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            r#"pod or {} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            containers_phrase(&implicitly_bad)
        ),
    )
}

/// From 1.25 Windows pods are exempt: API validation forbids seccomp there.
fn seccomp_profile_restricted_1_25(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if is_windows(spec) {
        return None;
    }
    seccomp_profile_restricted_1_19(meta, spec)
}

#[cfg(test)]
mod tests {
    //! Upstream's `check_*_test.go` fixtures for the restricted checks, plus an allowed pod each.

    use serde_json::{Value, json};

    use super::super::fixtures::{allows, forbids, with_contexts};
    use super::*;

    fn spec(spec: Value) -> Value {
        json!({ "spec": spec })
    }

    fn on_os(os: &str, containers: Value) -> Value {
        spec(json!({"os": {"name": os}, "containers": containers}))
    }

    #[test]
    fn allow_privilege_escalation() {
        let contexts = with_contexts(&[
            ("a", Value::Null),
            ("b", json!({})),
            ("c", json!({"allowPrivilegeEscalation": true})),
            ("d", json!({"allowPrivilegeEscalation": false})),
        ]);
        let reason = "allowPrivilegeEscalation != false";
        for check in [
            allow_privilege_escalation_1_8,
            allow_privilege_escalation_1_25,
        ] {
            forbids(
                check,
                spec(json!({"containers": contexts})),
                reason,
                r#"containers "a", "b", "c" must set securityContext.allowPrivilegeEscalation=false"#,
            );
            allows(
                check,
                spec(
                    json!({"containers": with_contexts(&[("d", json!({"allowPrivilegeEscalation": false}))])}),
                ),
            );
        }
        let unset = json!([{"name": "a"}]);
        allows(
            allow_privilege_escalation_1_25,
            on_os("windows", unset.clone()),
        );
        forbids(
            allow_privilege_escalation_1_8,
            on_os("windows", unset.clone()),
            reason,
            r#"container "a" must set securityContext.allowPrivilegeEscalation=false"#,
        );
        forbids(
            allow_privilege_escalation_1_25,
            on_os("linux", unset),
            reason,
            r#"container "a" must set securityContext.allowPrivilegeEscalation=false"#,
        );
    }

    #[test]
    fn capabilities_restricted() {
        let caps = |add: Value, drop: Value| json!({"capabilities": {"add": add, "drop": drop}});
        let containers = with_contexts(&[
            ("a", json!({"capabilities": {"add": ["FOO", "BAR"]}})),
            ("b", json!({"capabilities": {"add": ["BAR", "BAZ"]}})),
            (
                "c",
                caps(json!(["NET_BIND_SERVICE", "CHOWN"]), json!(["ALL", "FOO"])),
            ),
        ]);
        let reason = "unrestricted capabilities";
        for check in [capabilities_restricted_1_22, capabilities_restricted_1_25] {
            forbids(
                check,
                spec(json!({"containers": containers})),
                reason,
                r#"containers "a", "b" must set securityContext.capabilities.drop=["ALL"]; containers "a", "b", "c" must not include "BAR", "BAZ", "CHOWN", "FOO" in securityContext.capabilities.add"#,
            );
            allows(
                check,
                spec(json!({"containers": with_contexts(&[
                    ("a", caps(json!(["NET_BIND_SERVICE"]), json!(["ALL"]))),
                ])})),
            );
        }
        let unset = json!([{"name": "a"}]);
        allows(
            capabilities_restricted_1_25,
            on_os("windows", unset.clone()),
        );
        forbids(
            capabilities_restricted_1_25,
            on_os("linux", unset),
            reason,
            r#"container "a" must set securityContext.capabilities.drop=["ALL"]"#,
        );
    }

    #[test]
    fn restricted_volumes() {
        let allowed = [
            json!({"name": "a1", "emptyDir": {}}),
            json!({"name": "a2", "secret": {}}),
            json!({"name": "a3", "persistentVolumeClaim": {"claimName": "c"}}),
            json!({"name": "a4", "downwardAPI": {}}),
            json!({"name": "a5", "configMap": {}}),
            json!({"name": "a6", "projected": {}}),
            json!({"name": "a7", "csi": {"driver": "d"}}),
            json!({"name": "a8", "ephemeral": {}}),
            json!({"name": "a9", "image": {}}),
        ];
        allows(restricted_volumes_1_0, spec(json!({"volumes": allowed})));
        let restricted = [
            ("hostPath", json!({"path": "/"})),
            ("gcePersistentDisk", json!({"pdName": "p"})),
            ("awsElasticBlockStore", json!({"volumeID": "v"})),
            ("gitRepo", json!({"repository": "r"})),
            ("nfs", json!({"server": "s", "path": "/"})),
            ("iscsi", json!({"targetPortal": "t", "iqn": "i", "lun": 0})),
            ("glusterfs", json!({"endpoints": "e", "path": "p"})),
            ("rbd", json!({"monitors": [], "image": "i"})),
            ("flexVolume", json!({"driver": "d"})),
            ("cinder", json!({"volumeID": "v"})),
            ("cephfs", json!({"monitors": []})),
            ("flocker", json!({})),
            ("fc", json!({})),
            ("azureFile", json!({"secretName": "s", "shareName": "s"})),
            ("vsphereVolume", json!({"volumePath": "p"})),
            ("quobyte", json!({"registry": "r", "volume": "v"})),
            ("azureDisk", json!({"diskName": "d", "diskURI": "u"})),
            ("photonPersistentDisk", json!({"pdID": "p"})),
            ("portworxVolume", json!({"volumeID": "v"})),
            (
                "scaleIO",
                json!({"gateway": "g", "system": "s", "secretRef": {}}),
            ),
            ("storageos", json!({})),
        ];
        let mut volumes: Vec<Value> = allowed.to_vec();
        for (index, (field, source)) in restricted.iter().enumerate() {
            let mut volume = json!({"name": format!("b{}", index + 1)});
            volume[*field] = source.clone();
            volumes.push(volume);
        }
        volumes.push(json!({"name": "c1"}));
        forbids(
            restricted_volumes_1_0,
            spec(json!({"volumes": volumes})),
            "restricted volume types",
            concat!(
                r#"volumes "b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9", "b10", "b11", "b12", "b13", "b14", "b15", "b16", "b17", "b18", "b19", "b20", "b21", "c1""#,
                " use restricted volume types ",
                r#""awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "#,
                r#""hostPath", "iscsi", "nfs", "photonPersistentDisk", "portworxVolume", "quobyte", "rbd", "scaleIO", "storageos", "unknown", "vsphereVolume""#,
            ),
        );
        forbids(
            restricted_volumes_1_0,
            spec(json!({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]})),
            "restricted volume types",
            r#"volume "h" uses restricted volume type "hostPath""#,
        );
    }

    #[test]
    fn run_as_non_root() {
        let reason = "runAsNonRoot != true";
        for check in [run_as_non_root_1_0, run_as_non_root_1_35] {
            forbids(
                check,
                spec(json!({"containers": [{"name": "a"}]})),
                reason,
                r#"pod or container "a" must set securityContext.runAsNonRoot=true"#,
            );
            forbids(
                check,
                spec(
                    json!({"securityContext": {"runAsNonRoot": false}, "containers": [{"name": "a"}]}),
                ),
                reason,
                "pod must not set securityContext.runAsNonRoot=false",
            );
            forbids(
                check,
                spec(json!({
                    "securityContext": {"runAsNonRoot": true},
                    "containers": with_contexts(&[
                        ("a", Value::Null),
                        ("b", json!({})),
                        ("c", json!({"runAsNonRoot": false})),
                        ("d", json!({"runAsNonRoot": false})),
                        ("e", json!({"runAsNonRoot": true})),
                        ("f", json!({"runAsNonRoot": true})),
                    ]),
                })),
                reason,
                r#"containers "c", "d" must not set securityContext.runAsNonRoot=false"#,
            );
            forbids(
                check,
                spec(json!({"containers": with_contexts(&[
                    ("a", Value::Null),
                    ("b", json!({})),
                    ("d", json!({"runAsNonRoot": true})),
                    ("e", json!({"runAsNonRoot": true})),
                ])})),
                reason,
                r#"pod or containers "a", "b" must set securityContext.runAsNonRoot=true"#,
            );
            allows(
                check,
                spec(
                    json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "a"}]}),
                ),
            );
        }
        let user_namespace = spec(json!({"hostUsers": false, "containers": [{"name": "a"}]}));
        allows(run_as_non_root_1_35, user_namespace.clone());
        forbids(
            run_as_non_root_1_0,
            user_namespace,
            reason,
            r#"pod or container "a" must set securityContext.runAsNonRoot=true"#,
        );
    }

    #[test]
    fn run_as_user() {
        for check in [run_as_user_1_23, run_as_user_1_35] {
            forbids(
                check,
                spec(json!({"securityContext": {"runAsUser": 0}, "containers": [{"name": "a"}]})),
                "runAsUser=0",
                "pod must not set runAsUser=0",
            );
            for pod_user in [json!(1000), Value::Null] {
                allows(
                    check,
                    spec(
                        json!({"securityContext": {"runAsUser": pod_user}, "containers": [{"name": "a"}]}),
                    ),
                );
            }
            forbids(
                check,
                spec(json!({
                    "securityContext": {"runAsUser": 1000},
                    "containers": with_contexts(&[
                        ("a", Value::Null),
                        ("b", json!({})),
                        ("c", json!({"runAsUser": 0})),
                        ("d", json!({"runAsUser": 0})),
                        ("e", json!({"runAsUser": 1})),
                        ("f", json!({"runAsUser": 1})),
                    ]),
                })),
                "runAsUser=0",
                r#"containers "c", "d" must not set runAsUser=0"#,
            );
        }
        let user_namespace = spec(json!({"hostUsers": false, "securityContext": {"runAsUser": 0}}));
        allows(run_as_user_1_35, user_namespace.clone());
        forbids(
            run_as_user_1_23,
            user_namespace,
            "runAsUser=0",
            "pod must not set runAsUser=0",
        );
    }

    #[test]
    fn seccomp_profile_restricted() {
        let profile = |type_: &str| json!({"seccompProfile": {"type": type_}});
        let reason = "seccompProfile";
        for check in [
            seccomp_profile_restricted_1_19,
            seccomp_profile_restricted_1_25,
        ] {
            forbids(
                check,
                spec(json!({"containers": [{"name": "a"}]})),
                reason,
                r#"pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            );
            forbids(
                check,
                spec(
                    json!({"securityContext": profile("Unconfined"), "containers": [{"name": "a"}]}),
                ),
                reason,
                r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#,
            );
            forbids(
                check,
                spec(json!({
                    "securityContext": profile("RuntimeDefault"),
                    "containers": with_contexts(&[
                        ("a", Value::Null),
                        ("b", json!({})),
                        ("c", profile("Unconfined")),
                        ("d", profile("Unconfined")),
                        ("e", profile("RuntimeDefault")),
                        ("f", profile("RuntimeDefault")),
                    ]),
                })),
                reason,
                r#"containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#,
            );
            forbids(
                check,
                spec(json!({"containers": with_contexts(&[
                    ("a", Value::Null),
                    ("b", json!({})),
                    ("d", profile("RuntimeDefault")),
                    ("e", profile("Localhost")),
                ])})),
                reason,
                r#"pod or containers "a", "b" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            );
            allows(
                check,
                spec(
                    json!({"securityContext": profile("RuntimeDefault"), "containers": [{"name": "a"}]}),
                ),
            );
        }
        let unset = json!([{"name": "a"}]);
        allows(
            seccomp_profile_restricted_1_25,
            on_os("windows", unset.clone()),
        );
        forbids(
            seccomp_profile_restricted_1_25,
            on_os("linux", unset),
            reason,
            r#"pod or container "a" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
        );
    }
}
