//! The baseline Pod Security checks (upstream `policy/check_*.go` with `Level: api.LevelBaseline`):
//! each check's revisions by policy version and its exact forbidden reason and detail.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{HTTPGetAction, PodSpec, SELinuxOptions, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{
    Check, Violation, containers, containers_phrase, in_user_namespace, join_quote, pluralize,
    pod_security_context, since, violation,
};
use crate::field::go_quote;

/// Baseline checks sorted by ID (byte order, as upstream sorts them), which is the order their
/// violations are reported in.
pub(super) const CHECKS: &[Check] = &[
    Check {
        id: "appArmorProfile",
        versions: &[since(0, app_armor_profile_1_0)],
    },
    Check {
        id: CAPABILITIES_BASELINE,
        versions: &[since(0, capabilities_baseline_1_0)],
    },
    Check {
        id: "hostNamespaces",
        versions: &[since(0, host_namespaces_1_0)],
    },
    Check {
        id: HOST_PATH_VOLUMES,
        versions: &[since(0, host_path_volumes_1_0)],
    },
    Check {
        id: "hostPorts",
        versions: &[since(0, host_ports_1_0)],
    },
    Check {
        id: "hostProbesAndHostLifecycle",
        versions: &[since(34, host_probes_and_host_lifecycle_1_34)],
    },
    Check {
        id: "privileged",
        versions: &[since(0, privileged_1_0)],
    },
    Check {
        id: PROC_MOUNT,
        versions: &[
            since(0, proc_mount_1_0),
            since(35, proc_mount_baseline_1_35),
        ],
    },
    Check {
        id: "seLinuxOptions",
        versions: &[
            since(0, se_linux_options_1_0),
            since(31, se_linux_options_1_31),
        ],
    },
    Check {
        id: SECCOMP_PROFILE_BASELINE,
        versions: &[
            since(0, seccomp_profile_baseline_1_0),
            since(19, seccomp_profile_baseline_1_19),
        ],
    },
    Check {
        id: "sysctls",
        versions: &[
            since(0, sysctls_1_0),
            since(27, sysctls_1_27),
            since(29, sysctls_1_29),
            since(32, sysctls_1_32),
            since(37, sysctls_1_37),
        ],
    },
    Check {
        id: "windowsHostProcess",
        versions: &[since(0, windows_host_process_1_0)],
    },
];

/// Baseline IDs that restricted checks override.
pub(super) const CAPABILITIES_BASELINE: &str = "capabilities_baseline";
pub(super) const HOST_PATH_VOLUMES: &str = "hostPathVolumes";
pub(super) const PROC_MOUNT: &str = "procMount";
pub(super) const SECCOMP_PROFILE_BASELINE: &str = "seccompProfile_baseline";

const APP_ARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// AppArmor profile types (fields) and the deprecated beta annotations must not be unconfined.
fn app_armor_profile_1_0(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let allowed_type = |profile: &str| matches!(profile, "RuntimeDefault" | "Localhost");
    let mut setters = Vec::new();
    let mut bad_values = BTreeSet::new();
    if let Some(profile) = pod_security_context(spec).and_then(|sc| sc.app_armor_profile.as_ref())
        && !allowed_type(&profile.type_)
    {
        setters.push("pod".to_string());
        bad_values.insert(profile.type_.clone());
    }
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(profile) = c
            .security_context
            .and_then(|sc| sc.app_armor_profile.as_ref())
            && !allowed_type(&profile.type_)
        {
            bad_containers.push(c.name);
            bad_values.insert(profile.type_.clone());
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    let mut bad_annotations: Vec<String> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(key, value)| {
            key.starts_with(APP_ARMOR_ANNOTATION_PREFIX)
                && !(value.is_empty()
                    || value.as_str() == "runtime/default"
                    || value.starts_with("localhost/"))
        })
        .map(|(key, value)| format!("{key}={}", go_quote(value)))
        .collect();
    bad_annotations.sort();
    let mut bad_value_list: Vec<String> = bad_values.into_iter().collect();
    if !bad_annotations.is_empty() {
        setters.push(pluralize("annotation", "annotations", bad_annotations.len()).to_string());
        bad_value_list.extend(bad_annotations);
    }
    if setters.is_empty() {
        return None;
    }
    let reason = pluralize(
        "forbidden AppArmor profile",
        "forbidden AppArmor profiles",
        bad_value_list.len(),
    );
    violation(
        reason,
        format!(
            "{} must not set AppArmor profile type to {}",
            setters.join(" and "),
            join_quote(&bad_value_list)
        ),
    )
}

/// Capabilities Docker grants by default; adding anything else is forbidden.
const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

fn capabilities_baseline_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in containers(spec) {
        let added = c
            .security_context
            .and_then(|sc| sc.capabilities.as_ref())
            .and_then(|caps| caps.add.as_deref())
            .unwrap_or_default();
        let mut valid = true;
        for capability in added {
            if !DEFAULT_CAPABILITIES.contains(&capability.as_str()) {
                valid = false;
                forbidden.insert(capability.as_str());
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    violation(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad_containers),
            join_quote(forbidden)
        ),
    )
}

fn host_namespaces_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let shared: Vec<&str> = [
        (spec.host_network, "hostNetwork=true"),
        (spec.host_pid, "hostPID=true"),
        (spec.host_ipc, "hostIPC=true"),
    ]
    .into_iter()
    .filter(|(set, _)| *set == Some(true))
    .map(|(_, text)| text)
    .collect();
    if shared.is_empty() {
        return None;
    }
    violation("host namespaces", shared.join(", "))
}

fn host_path_volumes_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let names: Vec<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|volume| volume.host_path.is_some())
        .map(|volume| volume.name.as_str())
        .collect();
    if names.is_empty() {
        return None;
    }
    violation(
        "hostPath volumes",
        format!(
            "{} {}",
            pluralize("volume", "volumes", names.len()),
            join_quote(&names)
        ),
    )
}

fn host_ports_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    // Upstream sorts the ports as strings.
    let mut ports = BTreeSet::new();
    for c in containers(spec) {
        let mut valid = true;
        for port in c.ports.iter().filter_map(|p| p.host_port) {
            if port != 0 {
                valid = false;
                ports.insert(port.to_string());
            }
        }
        if !valid {
            bad_containers.push(c.name);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    violation(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            pluralize("uses", "use", bad_containers.len()),
            pluralize("hostPort", "hostPorts", ports.len()),
            ports.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
}

/// Probes and lifecycle handlers must not point at another host (`httpGet.host`,
/// `tcpSocket.host`).
fn host_probes_and_host_lifecycle_1_34(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    fn hosts<'a>(
        http_get: Option<&'a HTTPGetAction>,
        tcp_socket: Option<&'a TCPSocketAction>,
    ) -> impl Iterator<Item = &'a str> {
        let http = http_get.and_then(|action| action.host.as_deref());
        let tcp = tcp_socket.and_then(|action| action.host.as_deref());
        http.into_iter().chain(tcp).filter(|host| !host.is_empty())
    }
    let mut bad_containers = BTreeSet::new();
    let mut forbidden = BTreeSet::new();
    for c in containers(spec) {
        let probes = c
            .probes
            .into_iter()
            .flatten()
            .flat_map(|probe| hosts(probe.http_get.as_ref(), probe.tcp_socket.as_ref()));
        let handlers = c
            .lifecycle
            .into_iter()
            .flat_map(|lifecycle| [lifecycle.post_start.as_ref(), lifecycle.pre_stop.as_ref()])
            .flatten()
            .flat_map(|handler| hosts(handler.http_get.as_ref(), handler.tcp_socket.as_ref()));
        for host in probes.chain(handlers) {
            bad_containers.insert(c.name);
            forbidden.insert(host);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    let names: Vec<&str> = bad_containers.into_iter().collect();
    violation(
        "probe or lifecycle host",
        format!(
            "{} {} {} {}",
            containers_phrase(&names),
            pluralize("uses", "use", names.len()),
            pluralize(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                forbidden.len()
            ),
            join_quote(forbidden)
        ),
    )
}

fn privileged_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad: Vec<&str> = containers(spec)
        .filter(|c| c.security_context.and_then(|sc| sc.privileged) == Some(true))
        .map(|c| c.name)
        .collect();
    if bad.is_empty() {
        return None;
    }
    violation(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&bad)
        ),
    )
}

/// Any `procMount` but `Default` unmasks /proc; also the restricted `procMount_restricted` check.
pub(super) fn proc_mount_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut forbidden = BTreeSet::new();
    for c in containers(spec) {
        if let Some(proc_mount) = c.security_context.and_then(|sc| sc.proc_mount.as_deref())
            && proc_mount != "Default"
        {
            bad_containers.push(c.name);
            forbidden.insert(proc_mount);
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    violation(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&bad_containers),
            join_quote(forbidden)
        ),
    )
}

/// From 1.35 a pod in a user namespace may unmask /proc under baseline.
fn proc_mount_baseline_1_35(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    if in_user_namespace(spec) {
        return None;
    }
    proc_mount_1_0(meta, spec)
}

const SE_LINUX_TYPES_1_0: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t"];
const SE_LINUX_TYPES_1_31: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

fn se_linux_options_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    se_linux_options(spec, SE_LINUX_TYPES_1_0)
}

fn se_linux_options_1_31(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    se_linux_options(spec, SE_LINUX_TYPES_1_31)
}

fn se_linux_options(spec: &PodSpec, allowed_types: &[&str]) -> Option<Violation> {
    let mut bad_types = BTreeSet::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |options: &SELinuxOptions| {
        let mut valid = true;
        let type_ = options.type_.as_deref().unwrap_or_default();
        if !allowed_types.contains(&type_) {
            valid = false;
            bad_types.insert(type_.to_string());
        }
        if options.user.as_deref().is_some_and(|user| !user.is_empty()) {
            valid = false;
            set_user = true;
        }
        if options.role.as_deref().is_some_and(|role| !role.is_empty()) {
            valid = false;
            set_role = true;
        }
        valid
    };
    let mut setters = Vec::new();
    if let Some(options) = pod_security_context(spec).and_then(|sc| sc.se_linux_options.as_ref())
        && !valid(options)
    {
        setters.push("pod".to_string());
    }
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(options) = c
            .security_context
            .and_then(|sc| sc.se_linux_options.as_ref())
            && !valid(options)
        {
            bad_containers.push(c.name);
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    if setters.is_empty() {
        return None;
    }
    let mut bad_data = Vec::new();
    if !bad_types.is_empty() {
        bad_data.push(format!(
            "{} {}",
            pluralize("type", "types", bad_types.len()),
            join_quote(&bad_types)
        ));
    }
    if set_user {
        bad_data.push("user may not be set".to_string());
    }
    if set_role {
        bad_data.push("role may not be set".to_string());
    }
    violation(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            setters.join(" and "),
            bad_data.join("; ")
        ),
    )
}

const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";

/// Before 1.19 seccomp was set by the alpha annotations.
fn seccomp_profile_baseline_1_0(meta: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let valid = |value: &str| {
        matches!(value, "runtime/default" | "docker/default") || value.starts_with("localhost/")
    };
    let annotations = meta.annotations.as_ref();
    let mut forbidden = BTreeSet::new();
    let mut inspect = |key: String| {
        if let Some(value) = annotations.and_then(|a| a.get(&key))
            && !valid(value)
        {
            forbidden.insert(format!("{key}={}", go_quote(value)));
        }
    };
    inspect(SECCOMP_POD_ANNOTATION.to_string());
    for c in containers(spec) {
        inspect(format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}", c.name));
    }
    if forbidden.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "forbidden {} {}",
            pluralize("annotation", "annotations", forbidden.len()),
            forbidden.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
}

/// `RuntimeDefault` and `Localhost` are the allowed seccomp profile types.
pub(super) fn valid_seccomp(type_: &str) -> bool {
    matches!(type_, "RuntimeDefault" | "Localhost")
}

/// From 1.19 the `seccompProfile` fields, which may be unset.
fn seccomp_profile_baseline_1_19(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let mut setters = Vec::new();
    let mut bad_values = BTreeSet::new();
    if let Some(profile) = pod_security_context(spec).and_then(|sc| sc.seccomp_profile.as_ref())
        && !valid_seccomp(&profile.type_)
    {
        setters.push("pod".to_string());
        bad_values.insert(profile.type_.as_str());
    }
    let mut bad_containers = Vec::new();
    for c in containers(spec) {
        if let Some(profile) = c
            .security_context
            .and_then(|sc| sc.seccomp_profile.as_ref())
            && !valid_seccomp(&profile.type_)
        {
            bad_containers.push(c.name);
            bad_values.insert(profile.type_.as_str());
        }
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters.join(" and "),
            join_quote(bad_values)
        ),
    )
}

const SYSCTLS_1_0: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];
const SYSCTLS_ADDED_1_27: &[&str] = &["net.ipv4.ip_local_reserved_ports"];
const SYSCTLS_ADDED_1_29: &[&str] = &[
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];
const SYSCTLS_ADDED_1_32: &[&str] = &["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"];
const SYSCTLS_ADDED_1_37: &[&str] = &[
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

fn sysctls_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0])
}

fn sysctls_1_27(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_ADDED_1_27])
}

fn sysctls_1_29(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    sysctls(spec, &[SYSCTLS_1_0, SYSCTLS_ADDED_1_27, SYSCTLS_ADDED_1_29])
}

fn sysctls_1_32(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let allowed = [
        SYSCTLS_1_0,
        SYSCTLS_ADDED_1_27,
        SYSCTLS_ADDED_1_29,
        SYSCTLS_ADDED_1_32,
    ];
    sysctls(spec, &allowed)
}

fn sysctls_1_37(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let allowed = [
        SYSCTLS_1_0,
        SYSCTLS_ADDED_1_27,
        SYSCTLS_ADDED_1_29,
        SYSCTLS_ADDED_1_32,
        SYSCTLS_ADDED_1_37,
    ];
    sysctls(spec, &allowed)
}

/// Only namespaced sysctls isolated from other pods are safe.
fn sysctls(spec: &PodSpec, allowed: &[&[&str]]) -> Option<Violation> {
    let forbidden: Vec<&str> = pod_security_context(spec)
        .and_then(|sc| sc.sysctls.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|sysctl| sysctl.name.as_str())
        .filter(|name| !allowed.iter().any(|list| list.contains(name)))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    violation("forbidden sysctls", forbidden.join(", "))
}

fn windows_host_process_1_0(_: &ObjectMeta, spec: &PodSpec) -> Option<Violation> {
    let bad_containers: Vec<&str> = containers(spec)
        .filter(|c| {
            c.security_context
                .and_then(|sc| sc.windows_options.as_ref())
                .and_then(|options| options.host_process)
                == Some(true)
        })
        .map(|c| c.name)
        .collect();
    let pod_forbidden = pod_security_context(spec)
        .and_then(|sc| sc.windows_options.as_ref())
        .and_then(|options| options.host_process)
        == Some(true);
    let mut setters = Vec::new();
    if pod_forbidden {
        setters.push("pod".to_string());
    }
    if !bad_containers.is_empty() {
        setters.push(containers_phrase(&bad_containers));
    }
    if setters.is_empty() {
        return None;
    }
    violation(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            setters.join(" and ")
        ),
    )
}

#[cfg(test)]
mod tests {
    //! Upstream's `check_*_test.go` fixtures for the baseline checks, plus an allowed pod each.

    use serde_json::{Value, json};

    use super::super::CheckFn;
    use super::super::fixtures::{allows, forbids, with_contexts};
    use super::*;

    fn spec(spec: Value) -> Value {
        json!({ "spec": spec })
    }

    #[test]
    fn app_armor_profile() {
        let apparmor = |type_: &str| json!({"appArmorProfile": {"type": type_}});
        for annotations in [
            json!({"container.apparmor.security.beta.kubernetes.io/test": "runtime/default", "env": "prod"}),
            json!({"container.apparmor.security.beta.kubernetes.io/test": "localhost/sec-profile01"}),
            json!({"env": "dev"}),
        ] {
            allows(
                app_armor_profile_1_0,
                json!({"metadata": {"annotations": annotations}}),
            );
        }
        allows(
            app_armor_profile_1_0,
            spec(json!({"securityContext": apparmor("RuntimeDefault"),
                "containers": with_contexts(&[("foo", apparmor("Localhost"))])})),
        );
        let reason = "forbidden AppArmor profile";
        forbids(
            app_armor_profile_1_0,
            spec(json!({"securityContext": apparmor("Unconfined")})),
            reason,
            r#"pod must not set AppArmor profile type to "Unconfined""#,
        );
        forbids(
            app_armor_profile_1_0,
            spec(json!({"securityContext": apparmor("RuntimeDefault"),
                "containers": with_contexts(&[("foo", apparmor("Unconfined"))])})),
            reason,
            r#"container "foo" must not set AppArmor profile type to "Unconfined""#,
        );
        forbids(
            app_armor_profile_1_0,
            spec(json!({"containers": [{"name": "foo"}],
                "initContainers": with_contexts(&[("bar", apparmor("Unconfined"))])})),
            reason,
            r#"container "bar" must not set AppArmor profile type to "Unconfined""#,
        );
        let prefix = APP_ARMOR_ANNOTATION_PREFIX;
        let annotations: serde_json::Map<String, Value> = [
            ("", "bogus"),
            ("a", ""),
            ("b", "runtime/default"),
            ("c", "localhost/"),
            ("d", "localhost/foo"),
            ("e", "unconfined"),
            ("f", "unknown"),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), json!(v)))
        .collect();
        forbids(
            app_armor_profile_1_0,
            json!({"metadata": {"annotations": annotations}}),
            "forbidden AppArmor profiles",
            "annotations must not set AppArmor profile type to \
             \"container.apparmor.security.beta.kubernetes.io/=\"bogus\"\", \
             \"container.apparmor.security.beta.kubernetes.io/e=\"unconfined\"\", \
             \"container.apparmor.security.beta.kubernetes.io/f=\"unknown\"\"",
        );
    }

    #[test]
    fn capabilities_baseline() {
        let add = |caps: Value| json!({"capabilities": {"add": caps}});
        allows(
            capabilities_baseline_1_0,
            spec(
                json!({"containers": with_contexts(&[("a", add(json!(["CHOWN", "NET_BIND_SERVICE"])))])}),
            ),
        );
        forbids(
            capabilities_baseline_1_0,
            spec(json!({"containers": with_contexts(&[
                ("a", add(json!(["FOO", "BAR"]))),
                ("b", add(json!(["BAR", "BAZ"]))),
            ])})),
            "non-default capabilities",
            r#"containers "a", "b" must not include "BAR", "BAZ", "FOO" in securityContext.capabilities.add"#,
        );
    }

    #[test]
    fn host_namespaces() {
        allows(
            host_namespaces_1_0,
            spec(json!({"hostNetwork": false, "hostPID": false})),
        );
        forbids(
            host_namespaces_1_0,
            spec(json!({"hostNetwork": true, "hostIPC": true, "hostPID": true})),
            "host namespaces",
            "hostNetwork=true, hostPID=true, hostIPC=true",
        );
    }

    #[test]
    fn host_path_volumes() {
        allows(
            host_path_volumes_1_0,
            spec(json!({"volumes": [{"name": "c", "emptyDir": {}}]})),
        );
        forbids(
            host_path_volumes_1_0,
            spec(json!({"volumes": [
                {"name": "a", "hostPath": {"path": "/a"}},
                {"name": "b", "hostPath": {"path": "/b"}},
                {"name": "c", "emptyDir": {}},
            ]})),
            "hostPath volumes",
            r#"volumes "a", "b""#,
        );
    }

    #[test]
    fn host_ports() {
        let ports = |name: &str, ports: &[i32]| {
            let ports: Vec<Value> = ports
                .iter()
                .map(|p| json!({"containerPort": 80, "hostPort": p}))
                .collect();
            json!({"name": name, "ports": ports})
        };
        allows(
            host_ports_1_0,
            spec(json!({"containers": [ports("a", &[0])]})),
        );
        forbids(
            host_ports_1_0,
            spec(json!({"containers": [ports("a", &[0]), ports("b", &[0, 20])]})),
            "hostPort",
            r#"container "b" uses hostPort 20"#,
        );
        forbids(
            host_ports_1_0,
            spec(json!({"containers": [
                ports("a", &[0]),
                ports("b", &[0, 10, 20]),
                ports("c", &[0, 10, 30]),
            ]})),
            "hostPort",
            r#"containers "b", "c" use hostPorts 10, 20, 30"#,
        );
    }

    #[test]
    fn host_probes_and_host_lifecycle() {
        let check = host_probes_and_host_lifecycle_1_34;
        allows(
            check,
            spec(json!({"containers": [{
                "name": "a",
                "livenessProbe": {"httpGet": {"port": 80}},
                "readinessProbe": {"tcpSocket": {"port": 80, "host": ""}},
                "lifecycle": {"postStart": {"httpGet": {"port": 80}}},
            }]})),
        );
        let reason = "probe or lifecycle host";
        forbids(
            check,
            spec(json!({"containers": [{
                "name": "a",
                "livenessProbe": {"httpGet": {"port": 80, "host": "127.0.0.1"}},
                "readinessProbe": {"tcpSocket": {"port": 80, "host": "::1"}},
                "startupProbe": {"httpGet": {"port": 80, "host": "localhost"}},
            }]})),
            reason,
            r#"container "a" uses probe or lifecycle hosts "127.0.0.1", "::1", "localhost""#,
        );
        forbids(
            check,
            spec(json!({"containers": [{
                "name": "d",
                "lifecycle": {"postStart": {"tcpSocket": {"port": 80, "host": "invalid.host"}}},
            }]})),
            reason,
            r#"container "d" uses probe or lifecycle host "invalid.host""#,
        );
        forbids(
            check,
            spec(json!({"initContainers": [{
                "name": "init",
                "livenessProbe": {"httpGet": {"port": 80, "host": "invalid.init.host"}},
            }]})),
            reason,
            r#"container "init" uses probe or lifecycle host "invalid.init.host""#,
        );
        forbids(
            check,
            spec(json!({"containers": [
                {"name": "valid"},
                {"name": "invalid1", "livenessProbe": {"httpGet": {"port": 80, "host": "a.com"}}},
                {
                    "name": "invalid2",
                    "lifecycle": {"preStop": {"tcpSocket": {"port": 80, "host": "b.com"}}},
                    "startupProbe": {"httpGet": {"port": 80, "host": "a.com"}},
                },
            ]})),
            reason,
            r#"containers "invalid1", "invalid2" use probe or lifecycle hosts "a.com", "b.com""#,
        );
    }

    #[test]
    fn privileged() {
        allows(
            privileged_1_0,
            spec(json!({"containers": with_contexts(&[("a", json!({"privileged": false}))])})),
        );
        forbids(
            privileged_1_0,
            spec(json!({"containers": with_contexts(&[
                ("a", Value::Null),
                ("b", json!({})),
                ("c", json!({"privileged": false})),
                ("d", json!({"privileged": true})),
                ("e", json!({"privileged": true})),
            ])})),
            "privileged",
            r#"containers "d", "e" must not set securityContext.privileged=true"#,
        );
    }

    fn proc_mount_pod(host_users: bool) -> Value {
        spec(json!({
            "hostUsers": host_users,
            "containers": with_contexts(&[
                ("a", Value::Null),
                ("b", json!({})),
                ("c", json!({"procMount": "Default"})),
                ("d", json!({"procMount": "Unmasked"})),
                ("e", json!({"procMount": "other"})),
            ]),
        }))
    }

    #[test]
    fn proc_mount() {
        let detail =
            r#"containers "d", "e" must not set securityContext.procMount to "Unmasked", "other""#;
        forbids(proc_mount_1_0, proc_mount_pod(true), "procMount", detail);
        forbids(proc_mount_1_0, proc_mount_pod(false), "procMount", detail);
        forbids(
            proc_mount_baseline_1_35,
            proc_mount_pod(true),
            "procMount",
            detail,
        );
        allows(proc_mount_baseline_1_35, proc_mount_pod(false));
    }

    #[test]
    fn se_linux_options() {
        let types = |names: &[(&'static str, &str)]| {
            let contexts: Vec<(&str, Value)> = names
                .iter()
                .map(|(name, type_)| (*name, json!({"seLinuxOptions": {"type": type_}})))
                .collect();
            with_contexts(&contexts)
        };
        let allowed = types(&[
            ("a", "container_t"),
            ("b", "container_init_t"),
            ("c", "container_kvm_t"),
            ("d", "container_engine_t"),
        ]);
        allows(
            se_linux_options_1_31,
            spec(json!({"securityContext": {"seLinuxOptions": {}}, "containers": allowed})),
        );
        forbids(
            se_linux_options_1_0,
            spec(json!({"containers": types(&[("d", "container_engine_t")])})),
            "seLinuxOptions",
            r#"container "d" set forbidden securityContext.seLinuxOptions: type "container_engine_t""#,
        );
        let bad_pod = json!({"seLinuxOptions": {"type": "foo", "user": "bar", "role": "baz"}});
        let mut containers = allowed.as_array().cloned().unwrap_or_default();
        containers.extend([
            json!({"name": "e", "securityContext": {"seLinuxOptions": {"type": "bar"}}}),
            json!({"name": "f", "securityContext": {"seLinuxOptions": {"user": "bar"}}}),
            json!({"name": "g", "securityContext": {"seLinuxOptions": {"role": "baz"}}}),
        ]);
        forbids(
            se_linux_options_1_31,
            spec(json!({"securityContext": bad_pod, "containers": containers})),
            "seLinuxOptions",
            r#"pod and containers "e", "f", "g" set forbidden securityContext.seLinuxOptions: types "bar", "foo"; user may not be set; role may not be set"#,
        );
        forbids(
            se_linux_options_1_31,
            spec(json!({"securityContext": bad_pod, "containers": allowed})),
            "seLinuxOptions",
            r#"pod set forbidden securityContext.seLinuxOptions: type "foo"; user may not be set; role may not be set"#,
        );
        forbids(
            se_linux_options_1_31,
            spec(json!({"securityContext": {"seLinuxOptions": {"role": "bad"}}})),
            "seLinuxOptions",
            "pod set forbidden securityContext.seLinuxOptions: role may not be set",
        );
    }

    #[test]
    fn seccomp_profile_baseline_annotations() {
        let pod = |annotations: Value| {
            json!({
                "metadata": {"annotations": annotations},
                "spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]},
            })
        };
        allows(
            seccomp_profile_baseline_1_0,
            pod(json!({
                "seccomp.security.alpha.kubernetes.io/pod": "docker/default",
                "container.seccomp.security.alpha.kubernetes.io/a": "localhost/x",
                "container.seccomp.security.alpha.kubernetes.io/zz": "unconfined",
            })),
        );
        forbids(
            seccomp_profile_baseline_1_0,
            pod(json!({"seccomp.security.alpha.kubernetes.io/pod": "unconfined"})),
            "seccompProfile",
            r#"forbidden annotation seccomp.security.alpha.kubernetes.io/pod="unconfined""#,
        );
        forbids(
            seccomp_profile_baseline_1_0,
            pod(json!({
                "seccomp.security.alpha.kubernetes.io/pod": "unconfined",
                "container.seccomp.security.alpha.kubernetes.io/a": "unconfined",
                "container.seccomp.security.alpha.kubernetes.io/b": "unknown",
            })),
            "seccompProfile",
            r#"forbidden annotations container.seccomp.security.alpha.kubernetes.io/a="unconfined", container.seccomp.security.alpha.kubernetes.io/b="unknown", seccomp.security.alpha.kubernetes.io/pod="unconfined""#,
        );
    }

    #[test]
    fn seccomp_profile_baseline_fields() {
        let profile = |type_: &str| json!({"seccompProfile": {"type": type_}});
        let containers = with_contexts(&[
            ("a", Value::Null),
            ("b", json!({})),
            ("c", profile("Unconfined")),
            ("d", profile("Unconfined")),
            ("e", profile("RuntimeDefault")),
            ("f", profile("Localhost")),
        ]);
        allows(
            seccomp_profile_baseline_1_19,
            spec(json!({"containers": with_contexts(&[("a", Value::Null)])})),
        );
        forbids(
            seccomp_profile_baseline_1_19,
            spec(json!({"securityContext": profile("Unconfined"), "containers": [{"name": "a"}]})),
            "seccompProfile",
            r#"pod must not set securityContext.seccompProfile.type to "Unconfined""#,
        );
        forbids(
            seccomp_profile_baseline_1_19,
            spec(json!({"securityContext": profile("RuntimeDefault"), "containers": containers})),
            "seccompProfile",
            r#"containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#,
        );
        forbids(
            seccomp_profile_baseline_1_19,
            spec(json!({"securityContext": profile("Unconfined"), "containers": containers})),
            "seccompProfile",
            r#"pod and containers "c", "d" must not set securityContext.seccompProfile.type to "Unconfined""#,
        );
    }

    fn sysctl_pod(names: &[&str]) -> Value {
        let sysctls: Vec<Value> = names
            .iter()
            .map(|n| json!({"name": n, "value": "1"}))
            .collect();
        spec(json!({"securityContext": {"sysctls": sysctls}}))
    }

    #[test]
    fn sysctls_grow_by_version() {
        let revisions: [(CheckFn, &[&str]); 5] = [
            (sysctls_1_0, SYSCTLS_1_0),
            (sysctls_1_27, SYSCTLS_ADDED_1_27),
            (sysctls_1_29, SYSCTLS_ADDED_1_29),
            (sysctls_1_32, SYSCTLS_ADDED_1_32),
            (sysctls_1_37, SYSCTLS_ADDED_1_37),
        ];
        for (index, (check, added)) in revisions.iter().enumerate() {
            forbids(*check, sysctl_pod(&["a", "b"]), "forbidden sysctls", "a, b");
            allows(*check, sysctl_pod(added));
            // What a revision adds is forbidden by every earlier one.
            for (earlier, _) in &revisions[..index] {
                for name in *added {
                    forbids(*earlier, sysctl_pod(&[name]), "forbidden sysctls", name);
                }
            }
        }
    }

    #[test]
    fn windows_host_process() {
        let host_process = |value: bool| json!({"windowsOptions": {"hostProcess": value}});
        allows(
            windows_host_process_1_0,
            spec(json!({"securityContext": host_process(false)})),
        );
        forbids(
            windows_host_process_1_0,
            spec(json!({
                "securityContext": host_process(true),
                "containers": with_contexts(&[
                    ("a", Value::Null),
                    ("b", json!({})),
                    ("c", json!({"windowsOptions": {}})),
                    ("d", host_process(false)),
                    ("e", host_process(true)),
                    ("f", host_process(true)),
                ]),
            })),
            "hostProcess",
            r#"pod and containers "e", "f" must not set securityContext.windowsOptions.hostProcess=true"#,
        );
    }

    #[test]
    fn ephemeral_containers_are_checked() {
        forbids(
            privileged_1_0,
            spec(json!({
                "containers": [{"name": "app"}],
                "ephemeralContainers": [{"name": "debug", "securityContext": {"privileged": true}}],
            })),
            "privileged",
            r#"container "debug" must not set securityContext.privileged=true"#,
        );
    }
}
