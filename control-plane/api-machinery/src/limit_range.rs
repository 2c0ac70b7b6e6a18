//! The LimitRanger admission plugin (upstream `plugin/pkg/admission/limitranger`): which
//! requests it sees, the container defaults it fills into pods (and the
//! `kubernetes.io/limit-ranger` annotation saying so), and the min / max /
//! limit-to-request-ratio checks on containers, pods and claims, with upstream's messages.
//!
//! The caller (the apiserver's admission chain) lists the namespace's LimitRanges, skips an
//! update whose old object carries a `deletionTimestamp`, runs [`default_pod`] in the mutating
//! phase and [`validate_pod`] / [`validate_claim`] in the validating one, and wraps
//! [`aggregate`] of the errors into upstream's `pods "x" is forbidden: …` 403.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, LimitRange, LimitRangeItem, PersistentVolumeClaim, Pod, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;

use crate::quantity::Quantity;

/// The plugin's name in `--enable-admission-plugins`.
pub const PLUGIN_NAME: &str = "LimitRanger";

/// The annotation listing what the plugin defaulted.
pub const LIMIT_RANGER_ANNOTATION: &str = "kubernetes.io/limit-ranger";

/// `LimitRangeItem.type` of limits on each container.
pub const LIMIT_TYPE_CONTAINER: &str = "Container";
/// `LimitRangeItem.type` of limits on a pod's total.
pub const LIMIT_TYPE_POD: &str = "Pod";
/// `LimitRangeItem.type` of limits on a claim's storage request.
pub const LIMIT_TYPE_PERSISTENT_VOLUME_CLAIM: &str = "PersistentVolumeClaim";

/// Upstream's `resource.MaxMilliValue`: above it, comparisons fall back to whole units.
const MAX_MILLI_VALUE: i128 = (i64::MAX / 1000) as i128;

/// Resources a pod-level `spec.resources` may set (upstream's `supportedPodLevelResources`).
const SUPPORTED_POD_LEVEL_RESOURCES: [&str; 2] = ["cpu", "memory"];

type WireList = BTreeMap<String, WireQuantity>;
type ResourceList = BTreeMap<String, Quantity>;

/// Whether LimitRanger handles a request (upstream `Handles` plus `SupportsAttributes`):
/// creates of pods and claims, updates of claims, and updates through a pod's `resize`
/// subresource; never other pod updates (containers are immutable) or other subresources.
/// `operation` is the admission operation (`CREATE`, `UPDATE`, …); the resource is a core one.
pub fn applies(operation: &str, resource_plural: &str, subresource: &str) -> bool {
    if operation != "CREATE" && operation != "UPDATE" {
        return false;
    }
    if subresource == "resize" && resource_plural == "pods" && operation == "UPDATE" {
        return true;
    }
    if !subresource.is_empty() {
        return false;
    }
    if resource_plural == "pods" && operation == "UPDATE" {
        return false;
    }
    resource_plural == "pods" || resource_plural == "persistentvolumeclaims"
}

/// Upstream's `SetDefaults_LimitRangeItem`, run when a LimitRange is decoded: a `Container`
/// item's missing default limit comes from `max`, and its missing default request from the
/// default limit, else from `min`.
pub fn set_defaults_limit_range_item(item: &mut LimitRangeItem) {
    if item.type_ != LIMIT_TYPE_CONTAINER {
        return;
    }
    let max = item.max.clone().unwrap_or_default();
    fill_missing(&mut item.default, &max);
    let default = item.default.clone().unwrap_or_default();
    fill_missing(&mut item.default_request, &default);
    let min = item.min.clone().unwrap_or_default();
    fill_missing(&mut item.default_request, &min);
}

/// The part of upstream's `SetDefaults_Pod` LimitRanger relies on, run when a pod is decoded
/// (before admission): a container (or init container) with a limit and no request of a
/// resource requests its limit.
pub fn set_defaults_pod_resources(pod: &mut Pod) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let init_containers = spec.init_containers.iter_mut().flatten();
    for container in spec.containers.iter_mut().chain(init_containers) {
        if let Some(resources) = container.resources.as_mut()
            && let Some(limits) = resources.limits.clone()
        {
            fill_missing(&mut resources.requests, &limits);
        }
    }
}

/// The mutating half (upstream `PodMutateLimitFunc` per LimitRange, after the decode-time
/// defaulting of the pod and of each LimitRange item): fills each container's and init
/// container's missing limits from the `Container` items' `default` and missing requests from
/// their `defaultRequest`, and records what it set in the `kubernetes.io/limit-ranger`
/// annotation (the last LimitRange that set anything writes it, as upstream).
pub fn default_pod(limit_ranges: &[LimitRange], pod: &mut Pod) {
    set_defaults_pod_resources(pod);
    for limit_range in limit_ranges {
        let mut limit_range = limit_range.clone();
        for item in limit_range
            .spec
            .iter_mut()
            .flat_map(|s| s.limits.iter_mut())
        {
            set_defaults_limit_range_item(item);
        }
        pod_mutate_limit(&limit_range, pod);
    }
}

/// Upstream's `PodMutateLimitFunc` for one (already defaulted) LimitRange.
fn pod_mutate_limit(limit_range: &LimitRange, pod: &mut Pod) {
    let (default_requests, default_limits) = default_container_resource_requirements(limit_range);
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let mut annotations = Vec::new();
    let containers = spec.containers.iter_mut().map(|c| ("container", c));
    let init_containers = spec.init_containers.iter_mut().flatten();
    let init_containers = init_containers.map(|c| ("init container", c));
    for (prefix, container) in containers.chain(init_containers) {
        let (requests, limits) = (&default_requests, &default_limits);
        merge_container_resources(container, requests, limits, prefix, &mut annotations);
    }
    if !annotations.is_empty() {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                LIMIT_RANGER_ANNOTATION.to_string(),
                format!("LimitRanger plugin set: {}", annotations.join("; ")),
            );
    }
}

/// The `Container` items' default requests and limits; a later item wins a resource.
fn default_container_resource_requirements(limit_range: &LimitRange) -> (WireList, WireList) {
    let mut requests = WireList::new();
    let mut limits = WireList::new();
    for item in items(limit_range) {
        if item.type_ == LIMIT_TYPE_CONTAINER {
            requests.extend(item.default_request.iter().flatten().map(clone_entry));
            limits.extend(item.default.iter().flatten().map(clone_entry));
        }
    }
    (requests, limits)
}

fn clone_entry((name, value): (&String, &WireQuantity)) -> (String, WireQuantity) {
    (name.clone(), value.clone())
}

/// Fills one container and appends `cpu, memory request for container x` and
/// `… limit for …` (names sorted) to the annotation's parts.
fn merge_container_resources(
    container: &mut Container,
    default_requests: &WireList,
    default_limits: &WireList,
    prefix: &str,
    annotations: &mut Vec<String>,
) {
    let had_resources = container.resources.is_some();
    let mut resources = container.resources.take().unwrap_or_default();
    let set_limits = fill_missing(&mut resources.limits, default_limits);
    let set_requests = fill_missing(&mut resources.requests, default_requests);
    if had_resources || resources != ResourceRequirements::default() {
        container.resources = Some(resources);
    }
    if !set_requests.is_empty() {
        annotations.push(format!(
            "{} request for {prefix} {}",
            set_requests.join(", "),
            container.name
        ));
    }
    if !set_limits.is_empty() {
        annotations.push(format!(
            "{} limit for {prefix} {}",
            set_limits.join(", "),
            container.name
        ));
    }
}

/// Copies the defaults a list lacks into it; the names it set, in order.
fn fill_missing(list: &mut Option<WireList>, defaults: &WireList) -> Vec<String> {
    let mut set = Vec::new();
    for (name, value) in defaults {
        if !list.as_ref().is_some_and(|l| l.contains_key(name)) {
            list.get_or_insert_with(WireList::new)
                .insert(name.clone(), value.clone());
            set.push(name.clone());
        }
    }
    set
}

/// One container's requests and limits as the checks see them.
struct Observed {
    requests: ResourceList,
    limits: ResourceList,
    /// A sidecar: an init container with `restartPolicy: Always`.
    restartable: bool,
}

/// The validating half (upstream `PodValidateLimitFunc` over the namespace's LimitRanges):
/// `Container` items check each container and init container, `Pod` items the pod's total
/// requests and limits. Returns the errors of the first LimitRange the pod violates, each in
/// upstream's words (resources in name order, where upstream's order is Go map order); a
/// quantity that does not parse is reported instead.
pub fn validate_pod(limit_ranges: &[LimitRange], pod: &Pod) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let spec = pod.spec.as_ref();
    let mut observe = |container: &Container| {
        let resources = container.resources.as_ref();
        Observed {
            requests: parse_list(resources.and_then(|r| r.requests.as_ref()), &mut bad),
            limits: parse_list(resources.and_then(|r| r.limits.as_ref()), &mut bad),
            restartable: container.restart_policy.as_deref() == Some("Always"),
        }
    };
    let containers: Vec<Observed> = spec
        .map(|s| s.containers.iter().map(&mut observe).collect())
        .unwrap_or_default();
    let init_containers: Vec<Observed> = spec
        .and_then(|s| s.init_containers.as_ref())
        .map(|c| c.iter().map(&mut observe).collect())
        .unwrap_or_default();
    let pod_level = spec.and_then(|s| s.resources.as_ref());
    let pod_level_requests = pod_level.map(|r| parse_list(r.requests.as_ref(), &mut bad));
    let pod_level_limits = pod_level.map(|r| parse_list(r.limits.as_ref(), &mut bad));
    if !bad.is_empty() {
        return Err(bad);
    }
    let total = |pick, pod_level| pod_total(&containers, &init_containers, pick, pod_level);
    let pod_requests = total(|c| &c.requests, pod_level_requests.as_ref());
    let pod_limits = total(|c| &c.limits, pod_level_limits.as_ref());
    for limit_range in limit_ranges {
        let mut errors = Vec::new();
        for item in items(limit_range) {
            let bounds = Bounds::of(item, &mut errors);
            match item.type_.as_str() {
                LIMIT_TYPE_CONTAINER => {
                    for container in containers.iter().chain(&init_containers) {
                        bounds.check(
                            &item.type_,
                            &container.requests,
                            &container.limits,
                            &mut errors,
                        );
                    }
                }
                LIMIT_TYPE_POD => {
                    bounds.check(&item.type_, &pod_requests, &pod_limits, &mut errors)
                }
                _ => {}
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
    }
    Ok(())
}

/// Upstream's `podRequests` / `podLimits`: the containers' sum, sidecars added as they start,
/// raised to the largest init container (plus the sidecars started before it), then
/// overridden by pod-level `spec.resources` for cpu and memory. Pod overhead and status
/// resources are not counted, as upstream.
fn pod_total(
    containers: &[Observed],
    init_containers: &[Observed],
    pick: fn(&Observed) -> &ResourceList,
    pod_level: Option<&ResourceList>,
) -> ResourceList {
    let mut total = ResourceList::new();
    for container in containers {
        add_resource_list(&mut total, pick(container));
    }
    let mut sidecars = ResourceList::new();
    let mut init_max = ResourceList::new();
    for container in init_containers {
        let effective = if container.restartable {
            add_resource_list(&mut total, pick(container));
            add_resource_list(&mut sidecars, pick(container));
            sidecars.clone()
        } else {
            let mut effective = ResourceList::new();
            add_resource_list(&mut effective, pick(container));
            add_resource_list(&mut effective, &sidecars);
            effective
        };
        max_resource_list(&mut init_max, &effective);
    }
    max_resource_list(&mut total, &init_max);
    for (name, value) in pod_level.into_iter().flatten() {
        if SUPPORTED_POD_LEVEL_RESOURCES.contains(&name.as_str()) {
            total.insert(name.clone(), *value);
        }
    }
    total
}

fn add_resource_list(list: &mut ResourceList, other: &ResourceList) {
    for (name, value) in other {
        list.entry(name.clone())
            .and_modify(|sum| *sum = *sum + *value)
            .or_insert(*value);
    }
}

fn max_resource_list(list: &mut ResourceList, other: &ResourceList) {
    for (name, value) in other {
        if list.get(name).is_none_or(|current| value > current) {
            list.insert(name.clone(), *value);
        }
    }
}

/// Upstream's `PersistentVolumeClaimValidateLimitFunc`: `PersistentVolumeClaim` items bound
/// the claim's `spec.resources.requests` (its limits are not user input) by `min` and `max`.
/// Claims get no defaults: storage is a required part of their spec. Returns the errors of
/// the first LimitRange the claim violates.
pub fn validate_claim(
    limit_ranges: &[LimitRange],
    claim: &PersistentVolumeClaim,
) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let requests = parse_list(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
        &mut bad,
    );
    if !bad.is_empty() {
        return Err(bad);
    }
    for limit_range in limit_ranges {
        let mut errors = Vec::new();
        for item in items(limit_range) {
            if item.type_ != LIMIT_TYPE_PERSISTENT_VOLUME_CLAIM {
                continue;
            }
            let bounds = Bounds::of(item, &mut errors);
            let kind = item.type_.as_str();
            for (name, enforced) in &bounds.min {
                let none = ResourceList::new();
                errors.extend(min_constraint(kind, name, *enforced, &requests, &none));
            }
            for (name, enforced) in &bounds.max {
                errors.extend(max_request_constraint(kind, name, *enforced, &requests));
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
    }
    Ok(())
}

/// One message for several errors, as upstream's `utilerrors.NewAggregate(errs).Error()`:
/// a lone error as it is, repeats dropped, several as `[a, b]`.
pub fn aggregate(errors: &[String]) -> String {
    if let [only] = errors {
        return only.clone();
    }
    let mut seen: Vec<&str> = Vec::new();
    for error in errors {
        if !seen.contains(&error.as_str()) {
            seen.push(error);
        }
    }
    match seen.as_slice() {
        [] => String::new(),
        [only] => (*only).to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

fn items(limit_range: &LimitRange) -> impl Iterator<Item = &LimitRangeItem> {
    limit_range.spec.iter().flat_map(|s| s.limits.iter())
}

/// A LimitRange item's parsed `min`, `max` and `maxLimitRequestRatio`.
struct Bounds {
    min: ResourceList,
    max: ResourceList,
    ratio: ResourceList,
}

impl Bounds {
    fn of(item: &LimitRangeItem, errors: &mut Vec<String>) -> Bounds {
        Bounds {
            min: parse_list(item.min.as_ref(), errors),
            max: parse_list(item.max.as_ref(), errors),
            ratio: parse_list(item.max_limit_request_ratio.as_ref(), errors),
        }
    }

    /// All `min` checks, then all `max`, then all ratios, as upstream orders them.
    fn check(
        &self,
        limit_type: &str,
        requests: &ResourceList,
        limits: &ResourceList,
        errors: &mut Vec<String>,
    ) {
        for (name, enforced) in &self.min {
            errors.extend(min_constraint(
                limit_type, name, *enforced, requests, limits,
            ));
        }
        for (name, enforced) in &self.max {
            errors.extend(max_constraint(
                limit_type, name, *enforced, requests, limits,
            ));
        }
        for (name, enforced) in &self.ratio {
            errors.extend(limit_request_ratio_constraint(
                limit_type, name, *enforced, requests, limits,
            ));
        }
    }
}

fn parse_list(list: Option<&WireList>, bad: &mut Vec<String>) -> ResourceList {
    let mut parsed = ResourceList::new();
    for (name, value) in list.into_iter().flatten() {
        match Quantity::parse(&value.0) {
            Ok(quantity) => {
                parsed.insert(name.clone(), quantity);
            }
            Err(error) => bad.push(format!("{name}: {error}")),
        }
    }
    parsed
}

/// A resource's request and limit beside a bound, with the three as upstream compares them.
struct Usage {
    request: Option<Quantity>,
    limit: Option<Quantity>,
    /// Request, limit and bound at a common precision (absent ones count as zero).
    values: (i128, i128, i128),
}

impl Usage {
    fn of(name: &str, requests: &ResourceList, limits: &ResourceList, bound: Quantity) -> Usage {
        let request = requests.get(name).copied();
        let limit = limits.get(name).copied();
        let values = request_limit_enforced_values(request, limit, bound);
        Usage {
            request,
            limit,
            values,
        }
    }
}

/// Upstream's `minConstraint`.
fn min_constraint(
    limit_type: &str,
    name: &str,
    enforced: Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let usage = Usage::of(name, requests, limits, enforced);
    let (request_value, limit_value, bound) = usage.values;
    let prefix = format!("minimum {name} usage per {limit_type} is {enforced}");
    match (usage.request, usage.limit) {
        (None, _) => Some(format!("{prefix}.  No request is specified")),
        (Some(request), _) if request_value < bound => {
            Some(format!("{prefix}, but request is {request}"))
        }
        (_, Some(limit)) if limit_value < bound => Some(format!("{prefix}, but limit is {limit}")),
        _ => None,
    }
}

/// Upstream's `maxConstraint`.
fn max_constraint(
    limit_type: &str,
    name: &str,
    enforced: Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let usage = Usage::of(name, requests, limits, enforced);
    let (request_value, limit_value, bound) = usage.values;
    let prefix = format!("maximum {name} usage per {limit_type} is {enforced}");
    match (usage.request, usage.limit) {
        (_, None) => Some(format!("{prefix}.  No limit is specified")),
        (_, Some(limit)) if limit_value > bound => Some(format!("{prefix}, but limit is {limit}")),
        (Some(request), _) if request_value > bound => {
            Some(format!("{prefix}, but request is {request}"))
        }
        _ => None,
    }
}

/// Upstream's `maxRequestConstraint`, for kinds whose limits are not user input (claims).
fn max_request_constraint(
    limit_type: &str,
    name: &str,
    enforced: Quantity,
    requests: &ResourceList,
) -> Option<String> {
    let usage = Usage::of(name, requests, &ResourceList::new(), enforced);
    let (request_value, _, bound) = usage.values;
    let prefix = format!("maximum {name} usage per {limit_type} is {enforced}");
    match usage.request {
        None => Some(format!("{prefix}.  No request is specified")),
        Some(request) if request_value > bound => {
            Some(format!("{prefix}, but request is {request}"))
        }
        _ => None,
    }
}

/// Upstream's `limitRequestRatioConstraint`: limit / request must not exceed `enforced`.
fn limit_request_ratio_constraint(
    limit_type: &str,
    name: &str,
    enforced: Quantity,
    requests: &ResourceList,
    limits: &ResourceList,
) -> Option<String> {
    let usage = Usage::of(name, requests, limits, enforced);
    let (request_value, limit_value, _) = usage.values;
    let prefix = format!("{name} max limit to request ratio per {limit_type} is {enforced}");
    if usage.request.is_none() || request_value == 0 {
        return Some(format!(
            "{prefix}, but no request is specified or request is 0"
        ));
    }
    if usage.limit.is_none() || limit_value == 0 {
        return Some(format!("{prefix}, but no limit is specified or limit is 0"));
    }
    // Upstream compares in float64, scaled to thousandths when the bound allows.
    let observed_ratio = limit_value as f64 / request_value as f64;
    let (scaled_ratio, max_ratio) = if value(enforced) <= MAX_MILLI_VALUE {
        (observed_ratio * 1000.0, milli_value(enforced) as f64)
    } else {
        (observed_ratio, value(enforced) as f64)
    };
    (scaled_ratio > max_ratio)
        .then(|| format!("{prefix}, but provided ratio is {observed_ratio:.6}"))
}

/// Upstream's `requestLimitEnforcedValues`: the three at milli precision when none
/// overflows it, else in whole units (both rounded up, as `MilliValue` / `Value`); an absent
/// quantity counts as zero.
fn request_limit_enforced_values(
    request: Option<Quantity>,
    limit: Option<Quantity>,
    enforced: Quantity,
) -> (i128, i128, i128) {
    let request = request.unwrap_or(Quantity::ZERO);
    let limit = limit.unwrap_or(Quantity::ZERO);
    let all = [request, limit, enforced];
    if all.iter().all(|q| value(*q) <= MAX_MILLI_VALUE) {
        (
            milli_value(request),
            milli_value(limit),
            milli_value(enforced),
        )
    } else {
        (value(request), value(limit), value(enforced))
    }
}

/// Upstream's `Value`: whole units, rounded up.
fn value(quantity: Quantity) -> i128 {
    ceil_div(quantity.nanos(), 1_000_000_000)
}

/// Upstream's `MilliValue`: thousandths, rounded up.
fn milli_value(quantity: Quantity) -> i128 {
    quantity.milli_value()
}

fn ceil_div(numerator: i128, denominator: i128) -> i128 {
    -((-numerator).div_euclid(denominator))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        LimitRangeSpec, PersistentVolumeClaimSpec, PodSpec, VolumeResourceRequirements,
    };

    use super::*;

    // The fixtures are written in a small notation so upstream's tables stay one row a case:
    // a list is `cpu:100m,memory:1Gi` (`-` for none), requirements `requests / limits`, a
    // LimitRange `Type key=list …; Type …` with keys min, max, default, defaultRequest, ratio.

    fn list(text: &str) -> Option<WireList> {
        let pairs = text
            .trim()
            .split(',')
            .filter_map(|p| p.trim().split_once(':'));
        let list: WireList = pairs
            .map(|(k, v)| (k.to_string(), WireQuantity(v.to_string())))
            .collect();
        (!list.is_empty()).then_some(list)
    }

    fn requirements(text: &str) -> ResourceRequirements {
        let (requests, limits) = text.split_once('/').unwrap_or((text, ""));
        ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..Default::default()
        }
    }

    fn container(name: String, resources: &str) -> Container {
        Container {
            name,
            image: Some("foo:V0".to_string()),
            resources: Some(requirements(resources)),
            ..Default::default()
        }
    }

    /// Upstream's `validPod` (`count` containers `foo-<i>`), `validPodInit` (init containers
    /// separated by `;`) and `withRestartableInitContainer` (a sidecar appended).
    fn test_pod(containers: &str, init: &str, sidecar: &str) -> Pod {
        let (count, resources) = containers
            .trim()
            .split_once(' ')
            .unwrap_or((containers, ""));
        let count: usize = count.parse().expect("container count");
        let mut init: Vec<Container> = (init.trim() != "-")
            .then(|| init.split(';').enumerate())
            .into_iter()
            .flatten()
            .map(|(i, r)| container(format!("foo-{i}"), r))
            .collect();
        if sidecar.trim() != "-" {
            let mut sidecar = container(format!("foo-{}", init.len()), sidecar);
            sidecar.restart_policy = Some("Always".to_string());
            init.push(sidecar);
        }
        let mut pod = Pod::default();
        pod.metadata.name = Some("test-pod".to_string());
        pod.spec = Some(PodSpec {
            containers: (0..count)
                .map(|i| container(format!("foo-{i}"), resources))
                .collect(),
            init_containers: (!init.is_empty()).then_some(init),
            ..Default::default()
        });
        pod
    }

    fn limit_range(text: &str) -> LimitRange {
        let item = |text: &str| {
            let mut words = text.split_whitespace();
            let mut item = LimitRangeItem {
                type_: words.next().unwrap_or_default().to_string(),
                ..Default::default()
            };
            for word in words {
                let (key, value) = word.split_once('=').unwrap_or((word, ""));
                let field = match key {
                    "min" => &mut item.min,
                    "max" => &mut item.max,
                    "default" => &mut item.default,
                    "defaultRequest" => &mut item.default_request,
                    _ => &mut item.max_limit_request_ratio,
                };
                *field = list(value);
            }
            item
        };
        LimitRange {
            spec: Some(LimitRangeSpec {
                limits: text.split(';').map(item).collect(),
            }),
            ..Default::default()
        }
    }

    fn rows(table: &str) -> impl Iterator<Item = &str> {
        table.lines().filter(|l| !l.trim().is_empty())
    }

    fn columns<const N: usize>(row: &str, separator: char) -> [&str; N] {
        let cells: Vec<&str> = row.split(separator).map(str::trim).collect();
        <[&str; N]>::try_from(cells).expect("a cell per column")
    }

    /// Upstream's `validLimitRange`.
    const VALID: &str = "Pod max=cpu:200m,memory:4Gi min=cpu:50m,memory:2Mi; \
        Container max=cpu:100m,memory:2Gi min=cpu:25m,memory:1Mi \
        default=cpu:75m,memory:10Mi defaultRequest=cpu:50m,memory:5Mi";

    fn annotation(pod: &Pod) -> Option<&str> {
        let annotations = pod.metadata.annotations.as_ref()?;
        annotations.get(LIMIT_RANGER_ANNOTATION).map(String::as_str)
    }

    fn resources(pod: &Pod, init: bool) -> Vec<ResourceRequirements> {
        let spec = pod.spec.as_ref().expect("spec");
        let containers = match init {
            true => spec.init_containers.clone().unwrap_or_default(),
            false => spec.containers.clone(),
        };
        containers
            .into_iter()
            .map(|c| c.resources.unwrap_or_default())
            .collect()
    }

    /// Upstream's `TestPodLimitFunc`, each error case with the message it produces: pod
    /// decode defaulting, `PodMutateLimitFunc` with the LimitRange as given (upstream's
    /// fixtures are converted, not defaulted), then `PodValidateLimitFunc`.
    const POD_CASES: &str = "
ctr-min-cpu-request            | 1 cpu:100m / -          | - | - | Container min=cpu:50m | ok
ctr-min-cpu-request-limit      | 1 cpu:100m / cpu:200m   | - | - | Container min=cpu:50m | ok
ctr-min-memory-request         | 1 memory:60Mi / -       | - | - | Container min=memory:50Mi | ok
ctr-min-memory-request-limit   | 1 memory:60Mi / memory:100Mi | - | - | Container min=memory:50Mi | ok
ctr-max-cpu-request-limit      | 1 cpu:500m / cpu:1      | - | - | Container max=cpu:2 | ok
ctr-max-cpu-limit              | 1 - / cpu:1             | - | - | Container max=cpu:2 | ok
ctr-max-mem-request-limit      | 1 memory:250Mi / memory:500Mi | - | - | Container max=memory:1Gi | ok
ctr-max-cpu-ratio              | 1 cpu:500m / cpu:750m   | - | - | Container ratio=cpu:1.5 | ok
ctr-max-mem-limit              | 1 - / memory:500Mi      | - | - | Container max=memory:1Gi | ok
pod-min-cpu-request            | 2 cpu:75m / -           | - | - | Pod min=cpu:100m | ok
pod-min-cpu-request-limit      | 2 cpu:75m / cpu:200m    | - | - | Pod min=cpu:100m | ok
pod-min-memory-request         | 2 memory:60Mi / -       | - | - | Pod min=memory:100Mi | ok
pod-min-memory-request-limit   | 2 memory:60Mi / memory:100Mi | - | - | Pod min=memory:100Mi | ok
pod-init-min-memory-request    | 2 memory:60Mi / -       | memory:100Mi / - | - | Pod min=memory:100Mi | ok
pod-init-min-memory-request-limit | 2 memory:60Mi / memory:100Mi | memory:80Mi / memory:100Mi | - | Pod min=memory:100Mi | ok
pod-max-cpu-request-limit      | 2 cpu:500m / cpu:1      | - | - | Pod max=cpu:2 | ok
pod-max-cpu-limit              | 2 - / cpu:1             | - | - | Pod max=cpu:2 | ok
pod-init-max-cpu-request-limit | 2 cpu:500m / cpu:1      | cpu:1 / cpu:2; cpu:1 / cpu:1 | - | Pod max=cpu:2 | ok
pod-init-max-cpu-limit         | 2 - / cpu:1             | - / cpu:2; - / cpu:2 | - | Pod max=cpu:2 | ok
pod-max-mem-request-limit      | 2 memory:250Mi / memory:500Mi | - | - | Pod max=memory:1Gi | ok
pod-max-mem-limit              | 2 - / memory:500Mi      | - | - | Pod max=memory:1Gi | ok
pod-max-mem-ratio              | 3 memory:300Mi / memory:450Mi | - | - | Pod max=memory:2Gi ratio=memory:1.5 | ok
ctr-1-min-les-request          | 1 ephemeral-storage:60Mi / - | - | - | Container min=ephemeral-storage:50Mi | ok
ctr-1-min-les-request-limit    | 1 ephemeral-storage:60Mi / ephemeral-storage:100Mi | - | - | Container min=ephemeral-storage:50Mi | ok
ctr-1-max-les-request-limit    | 1 ephemeral-storage:250Mi / ephemeral-storage:500Mi | - | - | Container max=ephemeral-storage:1Gi | ok
ctr-1-max-les-limit            | 1 - / ephemeral-storage:500Mi | - | - | Container max=ephemeral-storage:1Gi | ok
ctr-2-min-les-request          | 2 ephemeral-storage:60Mi / - | - | - | Container min=ephemeral-storage:50Mi | ok
ctr-2-max-les-request-limit    | 2 ephemeral-storage:250Mi / ephemeral-storage:500Mi | - | - | Container max=ephemeral-storage:600Mi | ok
ctr-2-max-les-limit            | 2 - / ephemeral-storage:500Mi | - | - | Container max=ephemeral-storage:600Mi | ok
pod-min-les-request            | 2 ephemeral-storage:60Mi / - | - | - | Pod min=ephemeral-storage:100Mi | ok
pod-init-min-les-request       | 2 ephemeral-storage:60Mi / - | ephemeral-storage:100Mi / - | - | Pod min=ephemeral-storage:100Mi | ok
pod-max-les-limit              | 2 - / ephemeral-storage:500Mi | - | - | Pod max=ephemeral-storage:1Gi | ok
pod-max-les-ratio              | 3 ephemeral-storage:300Mi / ephemeral-storage:450Mi | - | - | Pod max=ephemeral-storage:2Gi ratio=ephemeral-storage:1.5 | ok
ctr-min-cpu-request            | 1 cpu:40m / -           | - | - | Container min=cpu:50m | minimum cpu usage per Container is 50m, but request is 40m
ctr-min-cpu-request-limit      | 1 cpu:40m / cpu:200m    | - | - | Container min=cpu:50m | minimum cpu usage per Container is 50m, but request is 40m
ctr-min-cpu-no-request-limit   | 1 - / -                 | - | - | Container min=cpu:50m | minimum cpu usage per Container is 50m.  No request is specified
ctr-min-memory-request         | 1 memory:40Mi / -       | - | - | Container min=memory:50Mi | minimum memory usage per Container is 50Mi, but request is 40Mi
ctr-min-memory-request-limit   | 1 memory:40Mi / memory:100Mi | - | - | Container min=memory:50Mi | minimum memory usage per Container is 50Mi, but request is 40Mi
ctr-min-memory-no-request-limit | 1 - / -                | - | - | Container min=memory:50Mi | minimum memory usage per Container is 50Mi.  No request is specified
ctr-max-cpu-request-limit      | 1 cpu:500m / cpu:2500m  | - | - | Container max=cpu:2 | maximum cpu usage per Container is 2, but limit is 2500m
ctr-max-cpu-limit              | 1 - / cpu:2500m         | - | - | Container max=cpu:2 | maximum cpu usage per Container is 2, but limit is 2500m
ctr-max-cpu-no-request-limit   | 1 - / -                 | - | - | Container max=cpu:2 | maximum cpu usage per Container is 2.  No limit is specified
ctr-max-cpu-ratio              | 1 cpu:1250m / cpu:2500m | - | - | Container ratio=cpu:1 | cpu max limit to request ratio per Container is 1, but provided ratio is 2.000000
ctr-max-mem-request-limit      | 1 memory:250Mi / memory:2Gi | - | - | Container max=memory:1Gi | maximum memory usage per Container is 1Gi, but limit is 2Gi
ctr-max-mem-no-request-limit   | 1 - / -                 | - | - | Container max=memory:1Gi | maximum memory usage per Container is 1Gi.  No limit is specified
pod-min-cpu-request            | 1 cpu:75m / -           | - | - | Pod min=cpu:100m | minimum cpu usage per Pod is 100m, but request is 75m
pod-min-cpu-request-limit      | 1 cpu:75m / cpu:200m    | - | - | Pod min=cpu:100m | minimum cpu usage per Pod is 100m, but request is 75m
pod-min-memory-request-limit   | 1 memory:60Mi / memory:100Mi | - | - | Pod min=memory:100Mi | minimum memory usage per Pod is 100Mi, but request is 60Mi
pod-max-cpu-request-limit      | 3 cpu:500m / cpu:1      | - | - | Pod max=cpu:2 | maximum cpu usage per Pod is 2, but limit is 3
pod-max-cpu-limit              | 3 - / cpu:1             | - | - | Pod max=cpu:2 | maximum cpu usage per Pod is 2, but limit is 3
pod-max-mem-request-limit      | 3 memory:250Mi / memory:500Mi | - | - | Pod max=memory:1Gi | maximum memory usage per Pod is 1Gi, but limit is 1500Mi
pod-init-max-mem-limit         | 1 - / memory:500Mi      | - / memory:1.5Gi | - | Pod max=memory:1Gi | maximum memory usage per Pod is 1Gi, but limit is 1536Mi
pod-max-mem-ratio              | 3 memory:250Mi / memory:500Mi | - | - | Pod max=memory:2Gi ratio=memory:1.5 | memory max limit to request ratio per Pod is 1500m, but provided ratio is 2.000000
ctr-1-min-les-request-limit    | 1 ephemeral-storage:40Mi / ephemeral-storage:100Mi | - | - | Container min=ephemeral-storage:50Mi | minimum ephemeral-storage usage per Container is 50Mi, but request is 40Mi
ctr-1-max-les-limit            | 1 - / ephemeral-storage:2Gi | - | - | Container max=ephemeral-storage:1Gi | maximum ephemeral-storage usage per Container is 1Gi, but limit is 2Gi
ctr-2-min-les-no-request-limit | 2 - / -                 | - | - | Container min=ephemeral-storage:50Mi | minimum ephemeral-storage usage per Container is 50Mi.  No request is specified
ctr-2-max-les-request-limit    | 2 ephemeral-storage:250Mi / ephemeral-storage:2Gi | - | - | Container max=ephemeral-storage:1Gi | maximum ephemeral-storage usage per Container is 1Gi, but limit is 2Gi
ctr-2-max-les-no-request-limit | 2 - / -                 | - | - | Container max=ephemeral-storage:1Gi | maximum ephemeral-storage usage per Container is 1Gi.  No limit is specified
pod-min-les-request            | 1 ephemeral-storage:60Mi / - | - | - | Pod min=ephemeral-storage:100Mi | minimum ephemeral-storage usage per Pod is 100Mi, but request is 60Mi
pod-max-les-limit              | 3 - / ephemeral-storage:500Mi | - | - | Pod max=ephemeral-storage:1Gi | maximum ephemeral-storage usage per Pod is 1Gi, but limit is 1500Mi
pod-init-max-les-limit         | 1 - / ephemeral-storage:500Mi | - / ephemeral-storage:1.5Gi | - | Pod max=ephemeral-storage:1Gi | maximum ephemeral-storage usage per Pod is 1Gi, but limit is 1536Mi
pod-max-les-ratio              | 3 ephemeral-storage:250Mi / ephemeral-storage:500Mi | - | - | Pod max=ephemeral-storage:2Gi ratio=ephemeral-storage:1.5 | ephemeral-storage max limit to request ratio per Pod is 1500m, but provided ratio is 2.000000
ctr-max-cpu-limit-restartable-init-container | 1 cpu:1000m / cpu:1500m | - | cpu:1500m / - | Pod max=cpu:2 | maximum cpu usage per Pod is 2, but request is 2500m
sidecar-counts-after-it-starts | 1 cpu:100m / -          | cpu:300m / - | cpu:100m / - | Pod min=cpu:400m | minimum cpu usage per Pod is 400m, but request is 300m
ratio-zero-request             | 1 cpu:0 / cpu:1         | - | - | Container ratio=cpu:1 | cpu max limit to request ratio per Container is 1, but no request is specified or request is 0
ratio-no-limit                 | 1 cpu:1 / -             | - | - | Container ratio=cpu:1 | cpu max limit to request ratio per Container is 1, but no limit is specified or limit is 0
nano-rounds-up-to-milli        | 1 cpu:1n / -            | - | - | Container min=cpu:1m | ok
exa-compares-whole-units       | 1 - / memory:2Ei        | - | - | Container max=memory:1Ei | maximum memory usage per Container is 1Ei, but limit is 2Ei
claim-items-ignored            | 1 - / -                 | - | - | PersistentVolumeClaim min=storage:1Gi | ok
several-in-upstream-order      | 1 cpu:50m,memory:2Gi / cpu:200m | - | - | Container min=cpu:100m max=memory:1Gi ratio=cpu:2 | [minimum cpu usage per Container is 100m, but request is 50m, maximum memory usage per Container is 1Gi.  No limit is specified, cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000]
items-in-order                 | 1 - / cpu:1           | - | - | Pod max=cpu:200m; Container max=cpu:100m | [maximum cpu usage per Pod is 200m, but limit is 1, maximum cpu usage per Container is 100m, but limit is 1]
";

    #[test]
    fn upstream_pod_limit_func_cases() {
        for row in rows(POD_CASES) {
            let [name, containers, init, sidecar, range, expected] = columns(row, '|');
            let range = limit_range(range);
            let mut pod = test_pod(containers, init, sidecar);
            set_defaults_pod_resources(&mut pod);
            pod_mutate_limit(&range, &mut pod);
            let outcome = validate_pod(&[range], &pod).map_err(|e| aggregate(&e));
            let expected = (expected != "ok").then(|| expected.to_string());
            assert_eq!(outcome.err(), expected, "{name}");
        }
    }

    /// Upstream's `TestMergePodResourceRequirements` and `TestPodLimitFuncApplyDefault`
    /// against `validLimitRange`: containers, init containers, what each ends with, and the
    /// annotation after `LimitRanger plugin set: ` (`-` for none).
    const DEFAULT_CASES: &str = "
1 - / - | - | cpu:50m,memory:5Mi / cpu:75m,memory:10Mi | - \
    | cpu, memory request for container foo-0; cpu, memory limit for container foo-0
1 - / - | - / - | cpu:50m,memory:5Mi / cpu:75m,memory:10Mi | cpu:50m,memory:5Mi / cpu:75m,memory:10Mi \
    | cpu, memory request for container foo-0; cpu, memory limit for container foo-0; \
      cpu, memory request for init container foo-0; cpu, memory limit for init container foo-0
1 memory:512Mi / - | memory:512Mi / - | cpu:50m,memory:512Mi / cpu:75m,memory:10Mi \
    | cpu:50m,memory:512Mi / cpu:75m,memory:10Mi \
    | cpu request for container foo-0; cpu, memory limit for container foo-0; \
      cpu request for init container foo-0; cpu, memory limit for init container foo-0
1 cpu:100m,memory:512Mi / cpu:200m,memory:1G | cpu:200m,memory:1G / cpu:400m,memory:2G \
    | cpu:100m,memory:512Mi / cpu:200m,memory:1G | cpu:200m,memory:1G / cpu:400m,memory:2G | -
1 - / cpu:1 | - | cpu:1,memory:5Mi / cpu:1,memory:10Mi | - \
    | memory request for container foo-0; memory limit for container foo-0
";

    #[test]
    fn default_pod_fills_what_is_missing_and_annotates() {
        // The last row: decode-time defaulting first, so the cpu request is the limit.
        for row in rows(DEFAULT_CASES) {
            let [containers, init, expected, init_expected, set] = columns(row, '|');
            let mut pod = test_pod(containers, init, "-");
            default_pod(&[limit_range(VALID)], &mut pod);
            assert_eq!(resources(&pod, false), [requirements(expected)], "{row}");
            if init != "-" {
                assert_eq!(
                    resources(&pod, true),
                    [requirements(init_expected)],
                    "{row}"
                );
            }
            let expected = (set != "-").then(|| format!("LimitRanger plugin set: {set}"));
            assert_eq!(annotation(&pod), expected.as_deref(), "{row}");
        }
    }

    #[test]
    fn default_pod_defaults_the_limit_range_items_first() {
        // Upstream's "no request or limit" errors pass once the stored LimitRange carries
        // its decode-time defaults (default limit from max, default request from min).
        for range in [
            "Container min=cpu:50m",
            "Container max=cpu:2,memory:1Gi",
            VALID,
        ] {
            let mut pod = test_pod("1 - / -", "- / -", "-");
            default_pod(&[limit_range(range)], &mut pod);
            assert_eq!(validate_pod(&[limit_range(range)], &pod), Ok(()), "{range}");
        }
        let mut pod = test_pod("1 - / -", "-", "-");
        default_pod(&[limit_range("Container max=cpu:2")], &mut pod);
        assert_eq!(resources(&pod, false), [requirements("cpu:2 / cpu:2")]);
    }

    #[test]
    fn set_defaults_limit_range_item_fills_container_items_only() {
        let range = "Container max=cpu:2,memory:1Gi min=ephemeral-storage:1Mi default=memory:512Mi";
        let mut item = limit_range(range).spec.expect("spec").limits.remove(0);
        set_defaults_limit_range_item(&mut item);
        assert_eq!(item.default, list("cpu:2,memory:512Mi"));
        assert_eq!(
            item.default_request,
            list("cpu:2,ephemeral-storage:1Mi,memory:512Mi")
        );
        let mut item = limit_range("Pod max=cpu:2")
            .spec
            .expect("spec")
            .limits
            .remove(0);
        set_defaults_limit_range_item(&mut item);
        assert_eq!((item.default, item.default_request), (None, None));
    }

    #[test]
    fn several_limit_ranges_apply_in_order() {
        let ranges = [
            limit_range("Container default=cpu:1"),
            limit_range("Container default=cpu:2,memory:64Mi"),
        ];
        let mut pod = test_pod("1 - / -", "-", "-");
        default_pod(&ranges, &mut pod);
        assert_eq!(
            resources(&pod, false),
            [requirements("cpu:1,memory:64Mi / cpu:1,memory:64Mi")]
        );
        assert_eq!(
            annotation(&pod),
            Some(
                "LimitRanger plugin set: memory request for container foo-0; memory limit for container foo-0"
            )
        );
        // The first LimitRange the pod violates decides.
        let ranges = [
            "Container max=cpu:4",
            "Container max=cpu:1",
            "Container max=cpu:500m",
        ];
        let ranges: Vec<_> = ranges.into_iter().map(limit_range).collect();
        assert_eq!(
            validate_pod(&ranges, &test_pod("1 cpu:2 / cpu:2", "-", "-")),
            Err(vec![
                "maximum cpu usage per Container is 1, but limit is 2".to_string()
            ])
        );
    }

    #[test]
    fn pod_level_resources_override_the_container_sum() {
        let mut pod = test_pod("3 cpu:1 / cpu:1", "-", "-");
        pod.spec.as_mut().expect("spec").resources = Some(requirements("cpu:1500m / cpu:2"));
        assert_eq!(validate_pod(&[limit_range("Pod max=cpu:2")], &pod), Ok(()));
    }

    #[test]
    fn unparsable_quantities_are_reported() {
        let errors = validate_pod(&[limit_range(VALID)], &test_pod("1 cpu:lots / -", "-", "-"));
        let errors = errors.expect_err("bad quantity");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("cpu: quantities must match"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn upstream_persistent_volume_claim_limit_func_cases() {
        let claim = |request: &str| PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                resources: Some(VolumeResourceRequirements {
                    requests: list(request),
                    limits: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // Upstream's `TestPersistentVolumeClaimLimitFunc`: request | items | outcome.
        let cases = "
            storage:1Gi   | min=storage:1Gi                 | ok
            storage:1Gi   | max=storage:1Gi                 | ok
            storage:100Gi |                                 | ok
            storage:5Gi   | min=storage:1Gi max=storage:10Gi | ok
            storage:500Mi | min=storage:1Gi | minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi
            storage:100Gi | min=storage:1Gi max=storage:1Gi | maximum storage usage per PersistentVolumeClaim is 1Gi, but request is 100Gi
            -             | min=storage:1Gi | minimum storage usage per PersistentVolumeClaim is 1Gi.  No request is specified
            -             | max=storage:1Gi | maximum storage usage per PersistentVolumeClaim is 1Gi.  No request is specified";
        for row in rows(cases) {
            let [request, range, expected] = columns(row, '|');
            let range = limit_range(&format!("PersistentVolumeClaim {range}"));
            let outcome = validate_claim(&[range], &claim(request)).err();
            let expected = (expected != "ok").then(|| vec![expected.to_string()]);
            assert_eq!(outcome, expected, "{row}");
        }
        // Container and Pod items do not bound claims.
        assert_eq!(
            validate_claim(&[limit_range(VALID)], &claim("storage:1Ti")),
            Ok(())
        );
    }

    #[test]
    fn aggregate_prints_like_upstream() {
        for (errors, expected) in [
            ("", ""),
            ("a", "a"),
            ("a|b", "[a, b]"),
            ("a|a", "a"),
            ("a|b|a|c", "[a, b, c]"),
        ] {
            let errors: Vec<String> = errors
                .split('|')
                .filter(|e| !e.is_empty())
                .map(String::from)
                .collect();
            assert_eq!(aggregate(&errors), expected, "{errors:?}");
        }
    }

    #[test]
    fn applies_mirrors_supports_attributes() {
        let cases = "CREATE pods - true, UPDATE pods - false, UPDATE pods resize true, \
            CREATE pods resize false, UPDATE pods status false, CREATE pods binding false, \
            CREATE persistentvolumeclaims - true, UPDATE persistentvolumeclaims - true, \
            UPDATE persistentvolumeclaims status false, DELETE pods - false, \
            CONNECT pods exec false, CREATE services - false";
        for case in cases.split(", ") {
            let [operation, resource, subresource, expected] = columns(case, ' ');
            let subresource = subresource.trim_start_matches('-');
            let outcome = applies(operation, resource, subresource);
            assert_eq!(outcome.to_string(), expected, "{case}");
        }
    }
}
