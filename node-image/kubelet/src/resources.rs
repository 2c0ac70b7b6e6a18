//! Requests and limits → a container's cgroup settings, as pure functions (upstream
//! kuberuntime `calculateLinuxResources` with `cm.MilliCPUToShares` and `milliCPUToQuota`,
//! `qos.GetPodQOS` and `qos.GetContainerOOMScoreAdjust`): CPU shares from the request, a
//! CFS quota over a 100 ms period from the limit, the memory limit, and the OOM score
//! adjustment of the pod's QoS class. (containerd here runs with `restrict_oom_score_adj`,
//! so it raises a score below its own to its own; the kubelet still asks for upstream's.)

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Fewest CPU shares (the kernel's floor).
pub const MIN_SHARES: i64 = 2;
/// Most CPU shares.
pub const MAX_SHARES: i64 = 262_144;
/// Shares per whole CPU.
pub const SHARES_PER_CPU: i64 = 1024;
/// The CFS period, µs.
pub const QUOTA_PERIOD: i64 = 100_000;
/// The smallest CFS quota, µs.
pub const MIN_QUOTA_PERIOD: i64 = 1000;
/// Guaranteed (and node-critical) containers' OOM score adjustment.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// BestEffort containers' OOM score adjustment.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// The priority from which a pod is critical (`SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// Parses a Kubernetes quantity into units of 10^`scale` (0: whole units, -3: milli),
/// rounding up as `Quantity.Value()` / `MilliValue()` do. `None` when it does not parse.
pub fn scaled(quantity: &str, scale: i32) -> Option<i64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (pow10, pow2): (i32, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exp if exp.starts_with(['e', 'E']) => (exp[1..].parse().ok()?, 0),
        _ => return None,
    };
    let (negative, digits) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole
        .chars()
        .chain(fraction.chars())
        .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let mantissa: i128 = format!("{whole}{fraction}").parse().ok()?;
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    let mut value = mantissa.checked_mul(1i128.checked_shl(pow2)?)?;
    let exponent = pow10 - fraction_digits - scale;
    if exponent >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exponent).ok()?)?)?;
    } else {
        let divisor = 10i128.checked_pow(u32::try_from(-exponent).ok()?)?;
        // Round up (away from zero for positive values, as the API's rounding does).
        value = (value + divisor - 1) / divisor;
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

/// The amount of `name` in `list`: millicores for CPU, whole units otherwise.
pub fn get(list: Option<&BTreeMap<String, Quantity>>, name: &str) -> Option<i64> {
    let scale = if name == "cpu" { -3 } else { 0 };
    list?.get(name).and_then(|q| scaled(&q.0, scale))
}

/// Upstream `MilliCPUToShares`.
pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        // Unset means the kernel's default: match it with the minimum.
        return MIN_SHARES;
    }
    (milli * SHARES_PER_CPU / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// Upstream `milliCPUToQuota`: 0 (no quota) without a limit.
pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli * period / 1000).max(MIN_QUOTA_PERIOD)
}

/// A pod's QoS class (upstream `ComputePodQOS` over app and init containers, with a
/// missing request taken from the limit as the API's defaulting would).
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "BestEffort";
    };
    let mut requests: BTreeMap<&str, i64> = BTreeMap::new();
    let mut limits: BTreeMap<&str, i64> = BTreeMap::new();
    let mut guaranteed = true;
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let resources = container.resources.as_ref();
        let req = resources.and_then(|r| r.requests.as_ref());
        let lim = resources.and_then(|r| r.limits.as_ref());
        let mut limits_found = 0;
        for name in ["cpu", "memory"] {
            let limit = get(lim, name).filter(|v| *v > 0);
            let request = get(req, name).or(limit).filter(|v| *v > 0);
            if let Some(r) = request {
                *requests.entry(name).or_default() += r;
            }
            if let Some(l) = limit {
                limits_found += 1;
                *limits.entry(name).or_default() += l;
            }
        }
        if limits_found < 2 {
            guaranteed = false;
        }
    }
    if requests.is_empty() && limits.is_empty() {
        return "BestEffort";
    }
    if guaranteed
        && requests.len() == limits.len()
        && requests.iter().all(|(k, v)| limits.get(k) == Some(v))
    {
        return "Guaranteed";
    }
    "Burstable"
}

/// Whether `pod` is node-critical (upstream `IsNodeCriticalPod`).
fn is_node_critical(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.priority.unwrap_or(0) >= SYSTEM_CRITICAL_PRIORITY
            && s.priority_class_name.as_deref() == Some("system-node-critical")
    })
}

/// Upstream `GetContainerOOMScoreAdjust` on a node with `memory_capacity` bytes.
pub fn oom_score_adj(pod: &Pod, container: &Container, memory_capacity: i64) -> i64 {
    if is_node_critical(pod) {
        return GUARANTEED_OOM_SCORE_ADJ;
    }
    match qos_class(pod) {
        "Guaranteed" => return GUARANTEED_OOM_SCORE_ADJ,
        "BestEffort" => return BEST_EFFORT_OOM_SCORE_ADJ,
        _ => {}
    }
    let resources = container.resources.as_ref();
    let request = get(resources.and_then(|r| r.requests.as_ref()), "memory")
        .or_else(|| get(resources.and_then(|r| r.limits.as_ref()), "memory"))
        .unwrap_or(0);
    let adj = 1000 - (1000 * i128::from(request) / i128::from(memory_capacity.max(1))) as i64;
    // Keep Burstable above Guaranteed and below BestEffort.
    if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        return 1000 + GUARANTEED_OOM_SCORE_ADJ;
    }
    if adj == BEST_EFFORT_OOM_SCORE_ADJ {
        return adj - 1;
    }
    adj
}

/// Upstream `generateLinuxContainerResources` (without hugepages, swap and cgroup v2
/// memory QoS): shares from the CPU request (or the limit when only it is set), the CFS
/// quota from the CPU limit over a 100 ms period, the memory limit, the OOM score.
pub fn linux_resources(
    pod: &Pod,
    container: &Container,
    memory_capacity: i64,
) -> cri::LinuxContainerResources {
    let resources = container.resources.as_ref();
    let requests = resources.and_then(|r| r.requests.as_ref());
    let limits = resources.and_then(|r| r.limits.as_ref());
    let cpu_request = get(requests, "cpu");
    let cpu_limit = get(limits, "cpu").unwrap_or(0);
    let shares = match cpu_request {
        None | Some(0) if cpu_limit != 0 => milli_cpu_to_shares(cpu_limit),
        request => milli_cpu_to_shares(request.unwrap_or(0)),
    };
    cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period: QUOTA_PERIOD,
        cpu_quota: milli_cpu_to_quota(cpu_limit, QUOTA_PERIOD),
        memory_limit_in_bytes: get(limits, "memory").unwrap_or(0),
        oom_score_adj: oom_score_adj(pod, container, memory_capacity),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quantities_scale_and_round_up() {
        let cases = [
            ("100m", -3, Some(100)),
            ("0.5", -3, Some(500)),
            ("1", -3, Some(1000)),
            ("2.5", 0, Some(3)),
            ("0.3", -3, Some(300)),
            ("1500u", -3, Some(2)),
            ("64Mi", 0, Some(67_108_864)),
            ("1Gi", 0, Some(1_073_741_824)),
            ("1.5Gi", 0, Some(1_610_612_736)),
            ("128M", 0, Some(128_000_000)),
            ("1e3", 0, Some(1000)),
            ("1k", 0, Some(1000)),
            ("abc", 0, None),
            ("1Zi", 0, None),
            ("", 0, None),
        ];
        for (text, scale, want) in cases {
            assert_eq!(scaled(text, scale), want, "{text}");
        }
    }

    #[test]
    fn cpu_conversions_follow_upstream() {
        for (milli, shares) in [
            (0, 2),
            (1, 2),
            (100, 102),
            (250, 256),
            (1000, 1024),
            (300_000, 262_144),
        ] {
            assert_eq!(milli_cpu_to_shares(milli), shares, "{milli}");
        }
        for (milli, quota) in [(0, 0), (5, 1000), (100, 10_000), (1500, 150_000)] {
            assert_eq!(milli_cpu_to_quota(milli, QUOTA_PERIOD), quota, "{milli}");
        }
    }

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "spec": {"containers": containers}}),
        )
        .expect("pod")
    }

    const GI: i64 = 1 << 30;

    #[test]
    fn qos_and_cgroup_settings_follow_upstream() {
        let best = pod(json!([{"name": "a"}]));
        let guaranteed = pod(json!([{"name": "a", "resources": {
            "limits": {"cpu": "500m", "memory": "64Mi"}}}]));
        let burstable = pod(json!([{"name": "a", "resources": {
            "requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}}]));
        let unequal = pod(json!([{"name": "a", "resources": {
            "requests": {"cpu": "250m", "memory": "64Mi"},
            "limits": {"cpu": "500m", "memory": "64Mi"}}}]));
        let cases = [
            (&best, "BestEffort", 2, 0, 0, 1000),
            (&guaranteed, "Guaranteed", 512, 50_000, 67_108_864, -997),
            // 1 GiB requested of 4 GiB: 1000 - 250.
            (&burstable, "Burstable", 256, 0, 2 * GI, 750),
            (&unequal, "Burstable", 256, 50_000, 67_108_864, 985),
        ];
        for (pod, class, shares, quota, memory, oom) in cases {
            assert_eq!(qos_class(pod), class);
            let c = &pod.spec.as_ref().expect("spec").containers[0];
            let r = linux_resources(pod, c, 4 * GI);
            assert_eq!(
                (
                    r.cpu_shares,
                    r.cpu_quota,
                    r.cpu_period,
                    r.memory_limit_in_bytes,
                    r.oom_score_adj
                ),
                (shares, quota, QUOTA_PERIOD, memory, oom),
                "{class}"
            );
        }
        // A request near the whole node still stays above Guaranteed; a tiny one below 1000.
        let big = pod(json!([{"name": "a", "resources": {"requests": {"memory": "4Gi"}}}]));
        let c = &big.spec.as_ref().expect("spec").containers[0];
        assert_eq!(oom_score_adj(&big, c, 4 * GI), 3);
        let tiny = pod(json!([{"name": "a", "resources": {"requests": {"memory": "1"}}}]));
        let c = &tiny.spec.as_ref().expect("spec").containers[0];
        assert_eq!(oom_score_adj(&tiny, c, 4 * GI), 999);
        let critical: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "priority": 2_000_001_000, "priorityClassName": "system-node-critical",
            "containers": [{"name": "a"}]}}))
        .expect("pod");
        let c = &critical.spec.as_ref().expect("spec").containers[0];
        assert_eq!(oom_score_adj(&critical, c, 4 * GI), -997);
    }
}
