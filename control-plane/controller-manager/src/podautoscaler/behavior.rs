//! How a metric's recommendation becomes the replica count to set (upstream's
//! `normalizeDesiredReplicas*`, `stabilizeRecommendation*` and `calculateScale*Limit*`): the
//! stabilization windows over an HPA's recent recommendations, the scaling policies over its
//! recent scale events, and the min/max clamp, with the AbleToScale and ScalingLimited
//! conditions each step explains itself by. The history is per HPA, in memory, as upstream
//! keeps it.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Upstream's `--horizontal-pod-autoscaler-downscale-stabilization` default.
pub const DOWNSCALE_STABILIZATION_WINDOW: Duration = Duration::from_secs(300);
/// Without a behavior, one sync grows the target at most this factor…
const SCALE_UP_LIMIT_FACTOR: f64 = 2.0;
/// …or to this many replicas, whichever is more.
const SCALE_UP_LIMIT_MINIMUM: f64 = 4.0;

/// A recommendation as it was made (upstream's `timestampedRecommendation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recommendation {
    replicas: i32,
    at: Timestamp,
}

/// A rescale as it was made (upstream's `timestampedScaleEvent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ScaleEvent {
    /// How many replicas were added or removed (never negative).
    change: i32,
    at: Timestamp,
    /// Older than every policy period: its slot may be reused.
    outdated: bool,
}

/// One HPA's recent recommendations and scale events.
#[derive(Debug, Clone, Default)]
pub struct History {
    recommendations: Vec<Recommendation>,
    scale_up_events: Vec<ScaleEvent>,
    scale_down_events: Vec<ScaleEvent>,
}

/// How policies are combined (`selectPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// One scaling policy (`HPAScalingPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// At most this many pods per period.
    Pods {
        /// Pods.
        value: i32,
        /// Period in seconds.
        period_seconds: i32,
    },
    /// At most this percentage of the replicas at the period's start per period.
    Percent {
        /// Percent.
        value: i32,
        /// Period in seconds.
        period_seconds: i32,
    },
}

impl Policy {
    fn period_seconds(self) -> i32 {
        match self {
            Policy::Pods { period_seconds, .. } | Policy::Percent { period_seconds, .. } => {
                period_seconds
            }
        }
    }
}

/// One direction's rules with upstream's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScalingRules {
    /// Seconds of recommendations the direction looks back over.
    pub stabilization_window_seconds: i32,
    /// How the policies combine.
    pub select_policy: SelectPolicy,
    /// The policies.
    pub policies: Vec<Policy>,
}

/// Both directions' rules of a behavior.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Behavior {
    /// Rules for growing.
    pub scale_up: ScalingRules,
    /// Rules for shrinking.
    pub scale_down: ScalingRules,
}

impl Behavior {
    /// The rules of `behavior` with the API's defaults (`GenerateHPAScaleUpRules`,
    /// `GenerateHPAScaleDownRules`) and the controller's downscale window for a missing
    /// scale-down window (`maybeInitScaleDownStabilizationWindow`) filled in.
    pub fn from_spec(behavior: &HorizontalPodAutoscalerBehavior) -> Self {
        let up_default = ScalingRules {
            stabilization_window_seconds: 0,
            select_policy: SelectPolicy::Max,
            policies: vec![
                Policy::Pods {
                    value: 4,
                    period_seconds: 15,
                },
                Policy::Percent {
                    value: 100,
                    period_seconds: 15,
                },
            ],
        };
        let down_default = ScalingRules {
            stabilization_window_seconds: DOWNSCALE_STABILIZATION_WINDOW.as_secs() as i32,
            select_policy: SelectPolicy::Max,
            policies: vec![Policy::Percent {
                value: 100,
                period_seconds: 15,
            }],
        };
        Behavior {
            scale_up: merge_rules(behavior.scale_up.as_ref(), up_default),
            scale_down: merge_rules(behavior.scale_down.as_ref(), down_default),
        }
    }
}

/// Upstream's `copyHPAScalingRules`: each field set in `from` replaces the default.
fn merge_rules(from: Option<&HPAScalingRules>, mut rules: ScalingRules) -> ScalingRules {
    let Some(from) = from else {
        return rules;
    };
    if let Some(window) = from.stabilization_window_seconds {
        rules.stabilization_window_seconds = window;
    }
    if let Some(select) = from.select_policy.as_deref() {
        rules.select_policy = match select {
            "Min" => SelectPolicy::Min,
            "Disabled" => SelectPolicy::Disabled,
            _ => SelectPolicy::Max,
        };
    }
    if let Some(policies) = &from.policies {
        rules.policies = policies
            .iter()
            .filter_map(|p| match p.type_.as_str() {
                "Pods" => Some(Policy::Pods {
                    value: p.value,
                    period_seconds: p.period_seconds,
                }),
                "Percent" => Some(Policy::Percent {
                    value: p.value,
                    period_seconds: p.period_seconds,
                }),
                _ => None,
            })
            .collect();
    }
    rules
}

/// A condition a normalization step sets: (status True?, reason, message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// Whether the condition is True.
    pub status: bool,
    /// Its reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
}

impl Explanation {
    fn new(status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
        }
    }
}

/// What normalization decided and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The replica count to set.
    pub desired: i32,
    /// The AbleToScale condition (always True here).
    pub able_to_scale: Explanation,
    /// The ScalingLimited condition.
    pub scaling_limited: Explanation,
}

/// The bounds and the recommendation one normalization works on (upstream's
/// `NormalizationArg` without the key and rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `spec.minReplicas` (1 when unset).
    pub min_replicas: i32,
    /// `spec.maxReplicas`.
    pub max_replicas: i32,
    /// The target's replicas now.
    pub current_replicas: i32,
    /// What the metrics recommend.
    pub desired_replicas: i32,
}

fn cutoff(now: Timestamp, seconds: i64) -> Timestamp {
    now.checked_sub(SignedDuration::from_secs(seconds))
        .unwrap_or(Timestamp::MIN)
}

impl History {
    /// Upstream's `recordInitialRecommendation`: the current count is the first
    /// recommendation of an HPA seen for the first time.
    pub fn record_initial_recommendation(&mut self, current_replicas: i32, now: Timestamp) {
        if self.recommendations.is_empty() {
            self.recommendations.push(Recommendation {
                replicas: current_replicas,
                at: now,
            });
        }
    }

    /// Upstream's `stabilizeRecommendation` (no behavior): the highest recommendation of the
    /// last `window`, this one included, which is recorded in place of an expired one.
    fn stabilize_recommendation(&mut self, desired: i32, window: Duration, now: Timestamp) -> i32 {
        let cutoff = cutoff(now, window.as_secs() as i64);
        let mut highest = desired;
        let mut old = None;
        for (i, rec) in self.recommendations.iter().enumerate() {
            if rec.at < cutoff {
                old = Some(i);
            } else if rec.replicas > highest {
                highest = rec.replicas;
            }
        }
        self.record(old, desired, now);
        highest
    }

    fn record(&mut self, slot: Option<usize>, replicas: i32, now: Timestamp) {
        let rec = Recommendation { replicas, at: now };
        match slot.and_then(|i| self.recommendations.get_mut(i)) {
            Some(old) => *old = rec,
            None => self.recommendations.push(rec),
        }
    }

    /// Upstream's `normalizeDesiredReplicas`, for an HPA without a behavior: the downscale
    /// window, then growth of at most ×2 (at least to 4) per sync, then min and max.
    pub fn normalize(&mut self, bounds: Bounds, window: Duration, now: Timestamp) -> Normalized {
        let stabilized = self.stabilize_recommendation(bounds.desired_replicas, window, now);
        let able_to_scale = if stabilized != bounds.desired_replicas {
            Explanation::new(
                true,
                "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation",
            )
        } else {
            Explanation::new(
                true,
                "ReadyForNewScale",
                "recommended size matches current size",
            )
        };
        let (desired, reason, message) = convert_desired_replicas_with_rules(
            bounds.current_replicas,
            stabilized,
            bounds.min_replicas,
            bounds.max_replicas,
        );
        Normalized {
            desired,
            able_to_scale,
            scaling_limited: Explanation::new(desired != stabilized, reason, message),
        }
    }

    /// Upstream's `normalizeDesiredReplicasWithBehaviors`: both stabilization windows, then
    /// the policies' rate limits and min/max.
    pub fn normalize_with_behavior(
        &mut self,
        behavior: &Behavior,
        bounds: Bounds,
        now: Timestamp,
    ) -> Normalized {
        let (stabilized, reason, message) = self.stabilize_with_behavior(behavior, bounds, now);
        let able_to_scale = if stabilized != bounds.desired_replicas {
            Explanation::new(true, reason, message)
        } else {
            Explanation::new(
                true,
                "ReadyForNewScale",
                "recommended size matches current size",
            )
        };
        let (desired, reason, message) = self.convert_desired_replicas_with_behavior_rate(
            behavior,
            Bounds {
                desired_replicas: stabilized,
                ..bounds
            },
            now,
        );
        Normalized {
            desired,
            able_to_scale,
            scaling_limited: Explanation::new(desired != stabilized, reason, message),
        }
    }

    /// Upstream's `stabilizeRecommendationWithBehaviors`: the current count moved no further
    /// than the lowest recommendation of the scale-up window and the highest of the
    /// scale-down window allow; the recommendation is recorded in place of one older than both.
    fn stabilize_with_behavior(
        &mut self,
        behavior: &Behavior,
        bounds: Bounds,
        now: Timestamp,
    ) -> (i32, &'static str, &'static str) {
        let desired = bounds.desired_replicas;
        let up_cutoff = cutoff(
            now,
            i64::from(behavior.scale_up.stabilization_window_seconds),
        );
        let down_cutoff = cutoff(
            now,
            i64::from(behavior.scale_down.stabilization_window_seconds),
        );
        let mut up = desired;
        let mut down = desired;
        let mut old = None;
        for (i, rec) in self.recommendations.iter().enumerate() {
            if rec.at > up_cutoff {
                up = up.min(rec.replicas);
            }
            if rec.at > down_cutoff {
                down = down.max(rec.replicas);
            }
            if rec.at < up_cutoff && rec.at < down_cutoff {
                old = Some(i);
            }
        }
        let recommendation = bounds.current_replicas.max(up).min(down);
        self.record(old, desired, now);
        if desired >= bounds.current_replicas {
            (
                recommendation,
                "ScaleUpStabilized",
                "recent recommendations were lower than current one, applying the lowest recent recommendation",
            )
        } else {
            (
                recommendation,
                "ScaleDownStabilized",
                "recent recommendations were higher than current one, applying the highest recent recommendation",
            )
        }
    }

    /// Upstream's `convertDesiredReplicasWithBehaviorRate`.
    fn convert_desired_replicas_with_behavior_rate(
        &self,
        behavior: &Behavior,
        bounds: Bounds,
        now: Timestamp,
    ) -> (i32, &'static str, &'static str) {
        let Bounds {
            min_replicas,
            max_replicas,
            current_replicas,
            desired_replicas,
        } = bounds;
        if desired_replicas > current_replicas {
            let limit = self
                .scale_up_limit(current_replicas, &behavior.scale_up, now)
                .max(current_replicas);
            let (maximum, reason, message) = if max_replicas > limit {
                (
                    limit,
                    "ScaleUpLimit",
                    "the desired replica count is increasing faster than the maximum scale rate",
                )
            } else {
                (
                    max_replicas,
                    "TooManyReplicas",
                    "the desired replica count is more than the maximum replica count",
                )
            };
            if desired_replicas > maximum {
                return (maximum, reason, message);
            }
        } else if desired_replicas < current_replicas {
            let limit = self
                .scale_down_limit(current_replicas, &behavior.scale_down, now)
                .min(current_replicas);
            let (minimum, reason, message) = if min_replicas < limit {
                (
                    limit,
                    "ScaleDownLimit",
                    "the desired replica count is decreasing faster than the maximum scale rate",
                )
            } else {
                (
                    min_replicas,
                    "TooFewReplicas",
                    "the desired replica count is less than the minimum replica count",
                )
            };
            if desired_replicas < minimum {
                return (minimum, reason, message);
            }
        }
        (
            desired_replicas,
            "DesiredWithinRange",
            "the desired count is within the acceptable range",
        )
    }

    /// The replicas at the start of `period_seconds` (now undone by the period's events).
    fn period_start(&self, current: i32, period_seconds: i32, now: Timestamp) -> i32 {
        let added = replicas_change_per_period(period_seconds, &self.scale_up_events, now);
        let removed = replicas_change_per_period(period_seconds, &self.scale_down_events, now);
        current - added + removed
    }

    /// Upstream's `calculateScaleUpLimitWithScalingRules`.
    fn scale_up_limit(&self, current: i32, rules: &ScalingRules, now: Timestamp) -> i32 {
        let (mut result, select): (i32, fn(i32, i32) -> i32) = match rules.select_policy {
            SelectPolicy::Disabled => return current,
            SelectPolicy::Min => (i32::MAX, i32::min),
            SelectPolicy::Max => (i32::MIN, i32::max),
        };
        for policy in &rules.policies {
            let start = self.period_start(current, policy.period_seconds(), now);
            let proposed = match *policy {
                Policy::Pods { value, .. } => start.saturating_add(value),
                // Rounded up: a small percentage of few replicas must still add one.
                Policy::Percent { value, .. } => {
                    (f64::from(start) * (1.0 + f64::from(value) / 100.0)).ceil() as i32
                }
            };
            result = select(result, proposed);
        }
        result
    }

    /// Upstream's `calculateScaleDownLimitWithBehaviors`.
    fn scale_down_limit(&self, current: i32, rules: &ScalingRules, now: Timestamp) -> i32 {
        let (mut result, select): (i32, fn(i32, i32) -> i32) = match rules.select_policy {
            SelectPolicy::Disabled => return current,
            SelectPolicy::Min => (i32::MIN, i32::max),
            SelectPolicy::Max => (i32::MAX, i32::min),
        };
        for policy in &rules.policies {
            let start = self.period_start(current, policy.period_seconds(), now);
            let proposed = match *policy {
                Policy::Pods { value, .. } => start.saturating_sub(value),
                Policy::Percent { value, .. } => {
                    (f64::from(start) * (1.0 - f64::from(value) / 100.0)) as i32
                }
            };
            result = select(result, proposed);
        }
        result
    }

    /// Upstream's `storeScaleEvent`: a rescale from `previous` to `new` is remembered (in the
    /// slot of an outdated event when there is one) only when the HPA has a behavior.
    pub fn store_scale_event(
        &mut self,
        behavior: Option<&Behavior>,
        previous: i32,
        new: i32,
        now: Timestamp,
    ) {
        let Some(behavior) = behavior else {
            return;
        };
        let (events, rules, change) = if new > previous {
            (
                &mut self.scale_up_events,
                &behavior.scale_up,
                new - previous,
            )
        } else {
            (
                &mut self.scale_down_events,
                &behavior.scale_down,
                previous - new,
            )
        };
        let longest = rules
            .policies
            .iter()
            .map(|p| p.period_seconds())
            .max()
            .unwrap_or(0)
            .max(0);
        let cutoff = cutoff(now, i64::from(longest));
        for event in events.iter_mut() {
            if event.at < cutoff {
                event.outdated = true;
            }
        }
        let event = ScaleEvent {
            change,
            at: now,
            outdated: false,
        };
        match events.iter().rposition(|e| e.outdated) {
            Some(i) => events[i] = event,
            None => events.push(event),
        }
    }
}

/// Upstream's `getReplicasChangePerPeriod`: the replicas changed by events of the last
/// `period_seconds`.
fn replicas_change_per_period(period_seconds: i32, events: &[ScaleEvent], now: Timestamp) -> i32 {
    let cutoff = cutoff(now, i64::from(period_seconds));
    events
        .iter()
        .filter(|e| e.at > cutoff)
        .map(|e| e.change)
        .sum()
}

/// Upstream's `convertDesiredReplicasWithRules` (no behavior).
fn convert_desired_replicas_with_rules(
    current: i32,
    desired: i32,
    min_replicas: i32,
    max_replicas: i32,
) -> (i32, &'static str, &'static str) {
    let scale_up_limit =
        (SCALE_UP_LIMIT_FACTOR * f64::from(current)).max(SCALE_UP_LIMIT_MINIMUM) as i32;
    let (maximum, reason, message) = if max_replicas > scale_up_limit {
        (
            scale_up_limit,
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate",
        )
    } else {
        (
            max_replicas,
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count",
        )
    };
    if desired < min_replicas {
        return (
            min_replicas,
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count",
        );
    }
    if desired > maximum {
        return (maximum, reason, message);
    }
    (
        desired,
        "DesiredWithinRange",
        "the desired count is within the acceptable range",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::autoscaling::v2::HPAScalingPolicy;

    fn bounds(min: i32, max: i32, current: i32, desired: i32) -> Bounds {
        Bounds {
            min_replicas: min,
            max_replicas: max,
            current_replicas: current,
            desired_replicas: desired,
        }
    }

    fn rules(window: i32, select: &str, policies: &[(&str, i32, i32)]) -> HPAScalingRules {
        HPAScalingRules {
            stabilization_window_seconds: Some(window),
            select_policy: Some(select.into()),
            policies: Some(
                policies
                    .iter()
                    .map(|(t, value, period)| HPAScalingPolicy {
                        type_: (*t).into(),
                        value: *value,
                        period_seconds: *period,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn limited(n: &Normalized) -> (i32, &'static str, bool, &'static str) {
        (
            n.desired,
            n.able_to_scale.reason,
            n.scaling_limited.status,
            n.scaling_limited.reason,
        )
    }

    #[test]
    fn defaults_fill_what_the_behavior_leaves_out() {
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior {
            scale_down: Some(HPAScalingRules {
                select_policy: Some("Min".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(behavior.scale_up.stabilization_window_seconds, 0);
        assert_eq!(behavior.scale_up.policies.len(), 2);
        assert_eq!(behavior.scale_down.stabilization_window_seconds, 300);
        assert_eq!(behavior.scale_down.select_policy, SelectPolicy::Min);
    }

    #[test]
    fn without_a_behavior_growth_is_at_most_double_or_four_and_within_bounds() {
        let now = Timestamp::now();
        for (b, want) in [
            (
                bounds(1, 20, 1, 10),
                (4, "ReadyForNewScale", true, "ScaleUpLimit"),
            ),
            (
                bounds(1, 20, 5, 30),
                (10, "ReadyForNewScale", true, "ScaleUpLimit"),
            ),
            (
                bounds(1, 6, 5, 30),
                (6, "ReadyForNewScale", true, "TooManyReplicas"),
            ),
            (
                bounds(2, 20, 5, 1),
                (2, "ReadyForNewScale", true, "TooFewReplicas"),
            ),
            (
                bounds(1, 20, 5, 7),
                (7, "ReadyForNewScale", false, "DesiredWithinRange"),
            ),
        ] {
            let mut history = History::default();
            let n = history.normalize(b, DOWNSCALE_STABILIZATION_WINDOW, now);
            assert_eq!(limited(&n), want, "{b:?}");
        }
    }

    #[test]
    fn without_a_behavior_scale_down_waits_for_the_window() {
        let now = Timestamp::now();
        let mut history = History::default();
        history.record_initial_recommendation(5, now - SignedDuration::from_secs(60));
        let n = history.normalize(bounds(1, 10, 5, 2), DOWNSCALE_STABILIZATION_WINDOW, now);
        assert_eq!(
            limited(&n),
            (5, "ScaleDownStabilized", false, "DesiredWithinRange")
        );
        // Six minutes later both samples have expired.
        let later = now + SignedDuration::from_secs(360);
        let n = history.normalize(bounds(1, 10, 5, 2), DOWNSCALE_STABILIZATION_WINDOW, later);
        assert_eq!(n.desired, 2);
    }

    #[test]
    fn default_behavior_adds_four_pods_or_doubles_per_period() {
        let now = Timestamp::now();
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior::default());
        let mut history = History::default();
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 5, 20), now);
        assert_eq!(limited(&n), (10, "ReadyForNewScale", true, "ScaleUpLimit"));
        let mut history = History::default();
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 1, 20), now);
        assert_eq!(n.desired, 5);
        let mut history = History::default();
        let n = history.normalize_with_behavior(&behavior, bounds(1, 8, 5, 20), now);
        assert_eq!(
            limited(&n),
            (8, "ReadyForNewScale", true, "TooManyReplicas")
        );
    }

    #[test]
    fn stabilization_windows_hold_the_count() {
        let now = Timestamp::now();
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(60, "Max", &[("Pods", 100, 15)])),
            scale_down: Some(rules(60, "Max", &[("Percent", 100, 15)])),
        });
        let mut history = History::default();
        history.record_initial_recommendation(3, now - SignedDuration::from_secs(10));
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 3, 6), now);
        assert_eq!(
            limited(&n),
            (3, "ScaleUpStabilized", false, "DesiredWithinRange")
        );
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 3, 1), now);
        assert_eq!(n.desired, 3);
        assert_eq!(n.able_to_scale.reason, "ScaleDownStabilized");
        // Past both windows the last recommendations rule.
        let later = now + SignedDuration::from_secs(120);
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 3, 6), later);
        assert_eq!(n.desired, 6);
    }

    #[test]
    fn policies_count_the_period_s_scale_events() {
        let now = Timestamp::now();
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, "Max", &[("Pods", 4, 60)])),
            scale_down: Some(rules(0, "Max", &[("Percent", 50, 60)])),
        });
        let mut history = History::default();
        history.store_scale_event(Some(&behavior), 4, 8, now - SignedDuration::from_secs(10));
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 8, 20), now);
        assert_eq!(limited(&n), (8, "ReadyForNewScale", true, "ScaleUpLimit"));
        let mut history = History::default();
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 10, 1), now);
        assert_eq!(limited(&n), (5, "ReadyForNewScale", true, "ScaleDownLimit"));
        let n = history.normalize_with_behavior(&behavior, bounds(4, 100, 6, 1), now);
        assert_eq!(limited(&n), (4, "ReadyForNewScale", true, "TooFewReplicas"));
    }

    #[test]
    fn select_policy_min_and_disabled() {
        let now = Timestamp::now();
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior {
            scale_up: Some(rules(0, "Min", &[("Pods", 4, 15), ("Percent", 100, 15)])),
            scale_down: Some(rules(0, "Disabled", &[])),
        });
        let mut history = History::default();
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 10, 30), now);
        assert_eq!(n.desired, 14);
        let n = history.normalize_with_behavior(&behavior, bounds(1, 100, 10, 2), now);
        assert_eq!(
            limited(&n),
            (10, "ReadyForNewScale", true, "ScaleDownLimit")
        );
    }

    #[test]
    fn an_outdated_scale_event_s_slot_is_reused() {
        let now = Timestamp::now();
        let behavior = Behavior::from_spec(&HorizontalPodAutoscalerBehavior::default());
        let mut history = History::default();
        history.store_scale_event(Some(&behavior), 1, 3, now - SignedDuration::from_secs(100));
        history.store_scale_event(Some(&behavior), 3, 5, now);
        assert_eq!(history.scale_up_events.len(), 1);
        assert_eq!(history.scale_up_events[0].change, 2);
        history.store_scale_event(None, 5, 9, now);
        assert_eq!(
            history.scale_up_events.len(),
            1,
            "kept only with a behavior"
        );
        assert_eq!(
            replicas_change_per_period(15, &history.scale_up_events, now),
            2
        );
    }
}
