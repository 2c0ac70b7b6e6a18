//! ELBv2 application load balancers for Ingresses, as the AWS Load Balancer Controller
//! deploys its model: one ALB per Ingress in the subnets the NLBs use, one HTTP(S) target
//! group per backend (instance targets on the NodePort), listeners with a default action, and
//! listener rules by priority, and its security groups (see [`super::security_groups`]).
//! Everything carries the model's tags, so what the model no
//! longer names (a target group of a changed NodePort, an ALB of a changed scheme) and, on
//! deletion, everything, is found by tags. Objects are looked up before they are created, as
//! in [`super::elb`], because moto (like a lost reply) does not deduplicate creates.
//!
//! What to change is decided by pure functions ([`plan_rules`], [`listener_matches`]); the
//! [`ApplicationLoadBalancers`] methods only carry it out.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, FixedResponseActionConfig, HostHeaderConditionConfig,
    Listener, LoadBalancer, LoadBalancerSchemeEnum, LoadBalancerTypeEnum, Matcher,
    PathPatternConditionConfig, ProtocolEnum, Rule, RuleCondition, Tag, TargetGroup,
    TargetTypeEnum,
};

use super::elb::{choose_subnets, tolerate_gone};
use super::security_groups::{IngressRule, Source};
use super::{AwsCloud, cloud_error, instance_id_from_provider_id, missing};
use crate::ingress::model::RESOURCE_TAG;
use crate::provider::{
    AlbAction, AlbHealthCheck, AlbListener, AlbModel, AlbRule, AlbSecurityGroups, AlbTargetGroup,
    ApplicationLoadBalancers, CloudError, CloudResult,
};

/// DescribeTags takes at most this many ARNs.
const DESCRIBE_TAGS_BATCH: usize = 20;

/// Upstream's resource ID of a managed security group (its `ingress.k8s.aws/resource` tag).
const MANAGED_GROUP_RESOURCE: &str = "ManagedLBSecurityGroup";

/// An action as ELBv2 reports it, reduced to what a model can ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenAction {
    /// Forward to one target group (ARN).
    Forward(String),
    /// A fixed response `(status code, content type)`.
    FixedResponse(String, String),
    /// Anything else (redirects, authentication, weighted forwards): never what we want.
    Other,
}

/// A listener rule as ELBv2 reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRule {
    /// Its ARN.
    pub arn: String,
    /// Its priority.
    pub priority: i32,
    /// `host-header` values.
    pub host_header: Vec<String>,
    /// `path-pattern` values.
    pub path_pattern: Vec<String>,
    /// Whether it has conditions other than host and path.
    pub other_conditions: bool,
    /// Its action (the last one, the one that answers).
    pub action: SeenAction,
}

/// A wanted rule with its action resolved to ARNs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedRule {
    /// Priority.
    pub priority: i32,
    /// `host-header` values.
    pub host_header: Vec<String>,
    /// `path-pattern` values.
    pub path_pattern: Vec<String>,
    /// Action.
    pub action: SeenAction,
}

/// The rule changes of one listener.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RulePlan {
    /// Rules to create.
    pub create: Vec<WantedRule>,
    /// `(rule ARN, what it becomes)`: a rule at the same priority that differs.
    pub modify: Vec<(String, WantedRule)>,
    /// Rule ARNs to delete (priorities no longer wanted, duplicates).
    pub delete: Vec<String>,
}

/// The rule changes that make a listener's rules exactly `wanted`, matched by priority.
pub fn plan_rules(existing: &[SeenRule], wanted: &[WantedRule]) -> RulePlan {
    let mut plan = RulePlan::default();
    let mut kept: BTreeSet<i32> = BTreeSet::new();
    for rule in existing {
        match wanted.iter().find(|w| w.priority == rule.priority) {
            Some(want) if kept.insert(want.priority) => {
                let same = !rule.other_conditions
                    && rule.host_header == want.host_header
                    && rule.path_pattern == want.path_pattern
                    && rule.action == want.action;
                if !same {
                    plan.modify.push((rule.arn.clone(), want.clone()));
                }
            }
            _ => plan.delete.push(rule.arn.clone()),
        }
    }
    plan.create = wanted
        .iter()
        .filter(|w| !kept.contains(&w.priority))
        .cloned()
        .collect();
    plan
}

/// A model action with its target group name resolved to an ARN.
fn resolve(action: &AlbAction, arns: &BTreeMap<String, String>) -> CloudResult<SeenAction> {
    match action {
        AlbAction::Forward { target_group } => arns
            .get(target_group)
            .map(|arn| SeenAction::Forward(arn.clone()))
            .ok_or_else(|| {
                CloudError::invalid(format!(
                    "the model forwards to target group {target_group}, which it does not define"
                ))
            }),
        AlbAction::FixedResponse {
            status_code,
            content_type,
        } => Ok(SeenAction::FixedResponse(
            status_code.clone(),
            content_type.clone(),
        )),
    }
}

fn seen_action(actions: &[Action]) -> SeenAction {
    let Some(action) = actions.last() else {
        return SeenAction::Other;
    };
    match action.r#type() {
        Some(ActionTypeEnum::Forward) => {
            if let Some(arn) = action.target_group_arn() {
                return SeenAction::Forward(arn.to_string());
            }
            match action.forward_config().map(|f| f.target_groups()) {
                Some([only]) => only
                    .target_group_arn()
                    .map(|arn| SeenAction::Forward(arn.to_string()))
                    .unwrap_or(SeenAction::Other),
                _ => SeenAction::Other,
            }
        }
        Some(ActionTypeEnum::FixedResponse) => match action.fixed_response_config() {
            Some(config) => SeenAction::FixedResponse(
                config.status_code().unwrap_or_default().to_string(),
                config.content_type().unwrap_or_default().to_string(),
            ),
            None => SeenAction::Other,
        },
        _ => SeenAction::Other,
    }
}

fn sdk_action(action: &SeenAction) -> CloudResult<Action> {
    match action {
        SeenAction::Forward(arn) => Ok(Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(arn)
            .build()),
        SeenAction::FixedResponse(status, content_type) => Ok(Action::builder()
            .r#type(ActionTypeEnum::FixedResponse)
            .fixed_response_config(
                FixedResponseActionConfig::builder()
                    .status_code(status)
                    .content_type(content_type)
                    .build(),
            )
            .build()),
        SeenAction::Other => Err(CloudError::invalid("an action of an unsupported type")),
    }
}

fn seen_rule(rule: &Rule) -> Option<SeenRule> {
    if rule.is_default() == Some(true) {
        return None;
    }
    let priority = rule.priority()?.parse().ok()?;
    let mut seen = SeenRule {
        arn: rule.rule_arn()?.to_string(),
        priority,
        host_header: Vec::new(),
        path_pattern: Vec::new(),
        other_conditions: false,
        action: seen_action(rule.actions()),
    };
    for condition in rule.conditions() {
        match condition.field() {
            Some("host-header") => seen.host_header.extend(
                condition
                    .host_header_config()
                    .map(|c| c.values().to_vec())
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| condition.values().to_vec()),
            ),
            Some("path-pattern") => seen.path_pattern.extend(
                condition
                    .path_pattern_config()
                    .map(|c| c.values().to_vec())
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| condition.values().to_vec()),
            ),
            _ => seen.other_conditions = true,
        }
    }
    Some(seen)
}

fn sdk_conditions(rule: &WantedRule) -> Vec<RuleCondition> {
    let mut conditions = Vec::new();
    if !rule.host_header.is_empty() {
        conditions.push(
            RuleCondition::builder()
                .field("host-header")
                .host_header_config(
                    HostHeaderConditionConfig::builder()
                        .set_values(Some(rule.host_header.clone()))
                        .build(),
                )
                .build(),
        );
    }
    if !rule.path_pattern.is_empty() {
        conditions.push(
            RuleCondition::builder()
                .field("path-pattern")
                .path_pattern_config(
                    PathPatternConditionConfig::builder()
                        .set_values(Some(rule.path_pattern.clone()))
                        .build(),
                )
                .build(),
        );
    }
    conditions
}

fn wanted_rules(
    rules: &[AlbRule],
    arns: &BTreeMap<String, String>,
) -> CloudResult<Vec<WantedRule>> {
    rules
        .iter()
        .map(|rule| {
            Ok(WantedRule {
                priority: rule.priority,
                host_header: rule.host_header.clone(),
                path_pattern: rule.path_pattern.clone(),
                action: resolve(&rule.action, arns)?,
            })
        })
        .collect()
}

/// Whether an existing listener already is what `wanted` asks (protocol, certificates, SSL
/// policy and default action); otherwise it is modified in place.
pub fn listener_matches(listener: &Listener, wanted: &AlbListener, default: &SeenAction) -> bool {
    let certificates: Vec<&str> = listener
        .certificates()
        .iter()
        .filter_map(|c| c.certificate_arn())
        .collect();
    let wanted_certificates: Vec<&str> =
        wanted.certificate_arns.iter().map(String::as_str).collect();
    listener.protocol().map(|p| p.as_str()) == Some(wanted.protocol.as_str())
        && (wanted.protocol != "HTTPS"
            || (certificates == wanted_certificates
                && listener.ssl_policy() == wanted.ssl_policy.as_deref()))
        && seen_action(listener.default_actions()) == *default
}

fn health_check_matches(group: &TargetGroup, check: &AlbHealthCheck) -> bool {
    group.health_check_protocol().map(|p| p.as_str()) == Some(check.protocol.as_str())
        && group.health_check_port() == Some(check.port.as_str())
        && group.health_check_path() == Some(check.path.as_str())
        && group.health_check_interval_seconds() == Some(check.interval_seconds)
        && group.health_check_timeout_seconds() == Some(check.timeout_seconds)
        && group.healthy_threshold_count() == Some(check.healthy_threshold)
        && group.unhealthy_threshold_count() == Some(check.unhealthy_threshold)
        && group.matcher().and_then(|m| m.http_code()) == Some(check.success_codes.as_str())
}

/// The managed security group's tags: the stack's, and upstream's resource ID.
fn managed_group_tags(model: &AlbModel) -> BTreeMap<String, String> {
    let mut tags = model.tags.clone();
    tags.insert(RESOURCE_TAG.to_string(), MANAGED_GROUP_RESOURCE.to_string());
    tags
}

fn sdk_tags(tags: &BTreeMap<String, String>) -> Vec<Tag> {
    tags.iter()
        .map(|(key, value)| Tag::builder().key(key).value(value).build())
        .collect()
}

impl AwsCloud {
    /// The ARNs among `arns` that carry all of `tags`.
    pub(super) async fn carrying_tags(
        &self,
        arns: &[String],
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<Vec<String>> {
        let mut matching = Vec::new();
        for batch in arns.chunks(DESCRIBE_TAGS_BATCH) {
            let answer = self
                .elb
                .describe_tags()
                .set_resource_arns(Some(batch.to_vec()))
                .send()
                .await
                .map_err(cloud_error)?;
            for description in answer.tag_descriptions() {
                let has = |key: &str, value: &str| {
                    description
                        .tags()
                        .iter()
                        .any(|t| t.key() == Some(key) && t.value() == Some(value))
                };
                if tags.iter().all(|(k, v)| has(k, v))
                    && let Some(arn) = description.resource_arn()
                {
                    matching.push(arn.to_string());
                }
            }
        }
        Ok(matching)
    }

    /// Every load balancer carrying all of `tags`.
    async fn tagged_load_balancers(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<Vec<LoadBalancer>> {
        let mut all = Vec::new();
        let mut pages = self.elb.describe_load_balancers().into_paginator().send();
        while let Some(page) = pages.next().await {
            all.extend(page.map_err(cloud_error)?.load_balancers().to_vec());
        }
        let arns: Vec<String> = all
            .iter()
            .filter_map(|lb| lb.load_balancer_arn().map(str::to_string))
            .collect();
        let tagged: BTreeSet<String> = self.carrying_tags(&arns, tags).await?.into_iter().collect();
        Ok(all
            .into_iter()
            .filter(|lb| {
                lb.load_balancer_arn()
                    .is_some_and(|arn| tagged.contains(arn))
            })
            .collect())
    }

    /// The subnets of a new load balancer: one per zone, at least two.
    async fn alb_subnets(&self, model: &AlbModel) -> CloudResult<Vec<String>> {
        let candidates = self.candidate_subnets().await?;
        let cluster_tag = self.settings.cluster_tag_key();
        let subnets = choose_subnets(&candidates, &cluster_tag, model.internal);
        if subnets.len() < 2 {
            let role = if model.internal {
                super::elb::ROLE_INTERNAL_ELB_TAG
            } else {
                super::elb::ROLE_ELB_TAG
            };
            return Err(CloudError::invalid(format!(
                "an application load balancer needs subnets in at least two zones tagged {role}, found {} ({})",
                subnets.len(),
                self.settings
                    .vpc_id
                    .as_deref()
                    .map(|vpc| format!("in VPC {vpc}"))
                    .unwrap_or_else(|| format!("tagged {cluster_tag}"))
            )));
        }
        Ok(subnets)
    }

    /// The VPC of `subnets` (the configured one, else the first subnet's).
    async fn vpc_of(&self, subnets: &[String]) -> CloudResult<String> {
        if let Some(vpc) = &self.settings.vpc_id {
            return Ok(vpc.clone());
        }
        let answer = self
            .ec2
            .describe_subnets()
            .set_subnet_ids(Some(subnets.iter().take(1).cloned().collect()))
            .send()
            .await
            .map_err(cloud_error)?;
        answer
            .subnets()
            .first()
            .and_then(|s| s.vpc_id())
            .map(str::to_string)
            .ok_or_else(|| missing("the subnets' VPC"))
    }

    /// The load balancer's security groups as the model asks, in `vpc_id`; a managed group
    /// is created or brought up to date.
    async fn alb_security_groups(
        &self,
        model: &AlbModel,
        vpc_id: &str,
    ) -> CloudResult<Vec<String>> {
        match &model.security_groups {
            AlbSecurityGroups::Named(names_or_ids) => {
                self.resolve_security_groups(names_or_ids, vpc_id).await
            }
            AlbSecurityGroups::Managed {
                name,
                inbound_cidrs,
            } => {
                let rules: BTreeSet<IngressRule> = model
                    .listeners
                    .iter()
                    .flat_map(|listener| {
                        inbound_cidrs
                            .iter()
                            .map(|cidr| IngressRule::tcp(listener.port, Source::Cidr(cidr.clone())))
                    })
                    .collect();
                let group = self
                    .ensure_managed_security_group(name, vpc_id, &managed_group_tags(model), &rules)
                    .await?;
                Ok(vec![group])
            }
        }
    }

    async fn create_application_load_balancer(
        &self,
        model: &AlbModel,
        subnets: Vec<String>,
        security_groups: Vec<String>,
    ) -> CloudResult<LoadBalancer> {
        let scheme = if model.internal {
            LoadBalancerSchemeEnum::Internal
        } else {
            LoadBalancerSchemeEnum::InternetFacing
        };
        let answer = self
            .elb
            .create_load_balancer()
            .name(&model.name)
            .r#type(LoadBalancerTypeEnum::Application)
            .scheme(scheme)
            .set_subnets(Some(subnets))
            .set_security_groups(Some(security_groups))
            .set_tags(Some(sdk_tags(&model.tags)))
            .send()
            .await
            .map_err(cloud_error)?;
        tracing::info!(name = %model.name, "created application load balancer");
        answer
            .load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| missing("the new load balancer"))
    }

    /// The group, created or its health check brought up to date; returns its ARN.
    async fn ensure_alb_target_group(
        &self,
        model: &AlbModel,
        group: &AlbTargetGroup,
        vpc_id: &str,
    ) -> CloudResult<String> {
        let check = &group.health_check;
        let check_protocol = ProtocolEnum::from(check.protocol.as_str());
        let matcher = Matcher::builder().http_code(&check.success_codes).build();
        if let Some(existing) = self.target_group_named(&group.name).await? {
            let arn = existing
                .target_group_arn()
                .ok_or_else(|| missing("a target group ARN"))?
                .to_string();
            if !health_check_matches(&existing, check) {
                self.elb
                    .modify_target_group()
                    .target_group_arn(&arn)
                    .health_check_protocol(check_protocol)
                    .health_check_port(&check.port)
                    .health_check_path(&check.path)
                    .health_check_interval_seconds(check.interval_seconds)
                    .health_check_timeout_seconds(check.timeout_seconds)
                    .healthy_threshold_count(check.healthy_threshold)
                    .unhealthy_threshold_count(check.unhealthy_threshold)
                    .matcher(matcher)
                    .send()
                    .await
                    .map_err(cloud_error)?;
            }
            return Ok(arn);
        }
        let mut tags = model.tags.clone();
        tags.extend(group.tags.clone());
        let answer = self
            .elb
            .create_target_group()
            .name(&group.name)
            .protocol(ProtocolEnum::from(group.protocol.as_str()))
            .port(group.port)
            .vpc_id(vpc_id)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(check_protocol)
            .health_check_port(&check.port)
            .health_check_path(&check.path)
            .health_check_interval_seconds(check.interval_seconds)
            .health_check_timeout_seconds(check.timeout_seconds)
            .healthy_threshold_count(check.healthy_threshold)
            .unhealthy_threshold_count(check.unhealthy_threshold)
            .matcher(matcher)
            .set_tags(Some(sdk_tags(&tags)))
            .send()
            .await
            .map_err(cloud_error)?;
        tracing::info!(name = %group.name, "created target group");
        answer
            .target_groups()
            .first()
            .and_then(|g| g.target_group_arn())
            .map(str::to_string)
            .ok_or_else(|| missing("the new target group"))
    }

    async fn rules_of(&self, listener_arn: &str) -> CloudResult<Vec<SeenRule>> {
        let mut rules = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let answer = self
                .elb
                .describe_rules()
                .listener_arn(listener_arn)
                .set_marker(marker.clone())
                .send()
                .await
                .map_err(cloud_error)?;
            rules.extend(answer.rules().iter().filter_map(seen_rule));
            match answer.next_marker() {
                Some(next) if !next.is_empty() && marker.as_deref() != Some(next) => {
                    marker = Some(next.to_string());
                }
                _ => return Ok(rules),
            }
        }
    }

    /// Creates or modifies one listener; returns its ARN.
    async fn ensure_alb_listener(
        &self,
        load_balancer_arn: &str,
        existing: Option<&Listener>,
        wanted: &AlbListener,
        default: &SeenAction,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<String> {
        let certificates: Option<Vec<Certificate>> = (wanted.protocol == "HTTPS").then(|| {
            wanted
                .certificate_arns
                .iter()
                .map(|arn| Certificate::builder().certificate_arn(arn).build())
                .collect()
        });
        let ssl_policy = wanted
            .ssl_policy
            .clone()
            .filter(|_| wanted.protocol == "HTTPS");
        if let Some(listener) = existing {
            let arn = listener
                .listener_arn()
                .ok_or_else(|| missing("a listener ARN"))?
                .to_string();
            if !listener_matches(listener, wanted, default) {
                self.elb
                    .modify_listener()
                    .listener_arn(&arn)
                    .port(wanted.port)
                    .protocol(ProtocolEnum::from(wanted.protocol.as_str()))
                    .set_certificates(certificates)
                    .set_ssl_policy(ssl_policy)
                    .default_actions(sdk_action(default)?)
                    .send()
                    .await
                    .map_err(cloud_error)?;
            }
            return Ok(arn);
        }
        let answer = self
            .elb
            .create_listener()
            .load_balancer_arn(load_balancer_arn)
            .port(wanted.port)
            .protocol(ProtocolEnum::from(wanted.protocol.as_str()))
            .set_certificates(certificates)
            .set_ssl_policy(ssl_policy)
            .default_actions(sdk_action(default)?)
            .set_tags(Some(sdk_tags(tags)))
            .send()
            .await
            .map_err(cloud_error)?;
        answer
            .listeners()
            .first()
            .and_then(|l| l.listener_arn())
            .map(str::to_string)
            .ok_or_else(|| missing("the new listener"))
    }

    async fn sync_rules(
        &self,
        listener_arn: &str,
        wanted: &[WantedRule],
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        let plan = plan_rules(&self.rules_of(listener_arn).await?, wanted);
        for arn in &plan.delete {
            let result = self
                .elb
                .delete_rule()
                .rule_arn(arn)
                .send()
                .await
                .map(|_| ())
                .map_err(cloud_error);
            tolerate_gone(result, &["RuleNotFound"])?;
        }
        for (arn, rule) in &plan.modify {
            self.elb
                .modify_rule()
                .rule_arn(arn)
                .set_conditions(Some(sdk_conditions(rule)))
                .actions(sdk_action(&rule.action)?)
                .send()
                .await
                .map_err(cloud_error)?;
        }
        for rule in &plan.create {
            self.elb
                .create_rule()
                .listener_arn(listener_arn)
                .priority(rule.priority)
                .set_conditions(Some(sdk_conditions(rule)))
                .actions(sdk_action(&rule.action)?)
                .set_tags(Some(sdk_tags(tags)))
                .send()
                .await
                .map_err(cloud_error)?;
        }
        if plan != RulePlan::default() {
            tracing::info!(
                listener = %listener_arn,
                created = plan.create.len(),
                modified = plan.modify.len(),
                deleted = plan.delete.len(),
                "listener rules synced"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl ApplicationLoadBalancers for AwsCloud {
    async fn ensure_application_load_balancer(&self, model: &AlbModel) -> CloudResult<String> {
        // An ALB of this Ingress under another name (its scheme changed) goes first: a target
        // group serves one load balancer only.
        for stale in self.tagged_load_balancers(&model.tags).await? {
            if stale.load_balancer_name() != Some(model.name.as_str())
                && let Some(arn) = stale.load_balancer_arn()
            {
                tracing::info!(name = ?stale.load_balancer_name(), "deleting a replaced application load balancer");
                self.delete_load_balancer_tree(arn).await?;
            }
        }
        let existing = self.find_load_balancer(&model.name).await?;
        let (vpc_id, subnets) = match existing.as_ref().and_then(|lb| lb.vpc_id()) {
            Some(vpc) => (vpc.to_string(), None),
            None if existing.is_some() => match &self.settings.vpc_id {
                Some(vpc) => (vpc.clone(), None),
                None => return Err(missing("the load balancer's VPC")),
            },
            None => {
                let subnets = self.alb_subnets(model).await?;
                (self.vpc_of(&subnets).await?, Some(subnets))
            }
        };
        let security_groups = self.alb_security_groups(model, &vpc_id).await?;
        let load_balancer = match (existing, subnets) {
            (Some(existing), _) => existing,
            (None, subnets) => {
                self.create_application_load_balancer(
                    model,
                    subnets.unwrap_or_default(),
                    security_groups.clone(),
                )
                .await?
            }
        };
        let lb_arn = load_balancer
            .load_balancer_arn()
            .ok_or_else(|| missing("a load balancer ARN"))?
            .to_string();
        let attached: BTreeSet<&str> = load_balancer
            .security_groups()
            .iter()
            .map(String::as_str)
            .collect();
        if attached != security_groups.iter().map(String::as_str).collect() {
            self.elb
                .set_security_groups()
                .load_balancer_arn(&lb_arn)
                .set_security_groups(Some(security_groups.clone()))
                .send()
                .await
                .map_err(cloud_error)?;
            tracing::info!(name = %model.name, groups = ?security_groups, "security groups set");
        }

        let instances: BTreeSet<String> = model
            .targets
            .iter()
            .filter_map(|id| instance_id_from_provider_id(id))
            .map(str::to_string)
            .collect();
        let mut arns: BTreeMap<String, String> = BTreeMap::new();
        for group in &model.target_groups {
            let arn = self.ensure_alb_target_group(model, group, &vpc_id).await?;
            self.sync_targets(&arn, group.port, &instances).await?;
            arns.insert(group.name.clone(), arn);
        }

        let existing = self.full_listeners_of(&lb_arn).await?;
        let mut kept: BTreeSet<String> = BTreeSet::new();
        for wanted in &model.listeners {
            let default = resolve(&wanted.default_action, &arns)?;
            let rules = wanted_rules(&wanted.rules, &arns)?;
            let current = existing.iter().find(|l| {
                l.port() == Some(wanted.port) && l.listener_arn().is_some_and(|a| !kept.contains(a))
            });
            let listener_arn = self
                .ensure_alb_listener(&lb_arn, current, wanted, &default, &model.tags)
                .await?;
            kept.insert(listener_arn.clone());
            self.sync_rules(&listener_arn, &rules, &model.tags).await?;
        }
        for listener in &existing {
            if let Some(arn) = listener.listener_arn()
                && !kept.contains(arn)
            {
                self.delete_listener(arn).await?;
            }
        }

        // Groups of this Ingress nothing names any more (a backend removed, a NodePort changed).
        let wanted_arns: BTreeSet<&String> = arns.values().collect();
        for group in self.tagged_target_groups(&model.tags).await? {
            if !wanted_arns.contains(&group) {
                self.delete_target_group(&group).await?;
                tracing::info!(group = %group, "deleted an unused target group");
            }
        }

        // The load balancer into the targets' groups on the target ports; or, when the user
        // names its groups, no managed group (one left from before goes).
        match &model.security_groups {
            AlbSecurityGroups::Managed { .. } => {
                let targets = self.target_security_groups(&instances).await?;
                let ports: BTreeSet<i32> = model
                    .target_groups
                    .iter()
                    .flat_map(|group| {
                        let check = group.health_check.port.parse::<i32>().ok();
                        std::iter::once(group.port).chain(check)
                    })
                    .collect();
                for group in &security_groups {
                    self.sync_rules_from(group, &targets, &ports).await?;
                }
            }
            AlbSecurityGroups::Named(_) => {
                self.delete_managed_security_groups(&managed_group_tags(model))
                    .await?;
            }
        }
        load_balancer
            .dns_name()
            .map(str::to_string)
            .ok_or_else(|| missing("the load balancer's DNS name"))
    }

    async fn delete_application_load_balancer(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        if tags.is_empty() {
            return Err(CloudError::invalid(
                "refusing to delete load balancers by an empty set of tags",
            ));
        }
        for load_balancer in self.tagged_load_balancers(tags).await? {
            if let Some(arn) = load_balancer.load_balancer_arn() {
                self.delete_load_balancer_tree(arn).await?;
                tracing::info!(name = ?load_balancer.load_balancer_name(), "deleted application load balancer");
            }
        }
        for group in self.tagged_target_groups(tags).await? {
            self.delete_target_group(&group).await?;
        }
        self.delete_managed_security_groups(tags).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(arn: &str, priority: i32, path: &str, group: &str) -> SeenRule {
        SeenRule {
            arn: arn.into(),
            priority,
            host_header: vec!["a.example.com".into()],
            path_pattern: vec![path.into()],
            other_conditions: false,
            action: SeenAction::Forward(group.into()),
        }
    }

    fn wanted(priority: i32, path: &str, group: &str) -> WantedRule {
        WantedRule {
            priority,
            host_header: vec!["a.example.com".into()],
            path_pattern: vec![path.into()],
            action: SeenAction::Forward(group.into()),
        }
    }

    #[test]
    fn rule_plans_match_by_priority() {
        // Nothing yet: create all.
        let plan = plan_rules(&[], &[wanted(1, "/a", "g1"), wanted(2, "/b", "g2")]);
        assert_eq!(plan.create.len(), 2);
        assert!(plan.modify.is_empty() && plan.delete.is_empty());
        // Up to date.
        let plan = plan_rules(
            &[seen("r1", 1, "/a", "g1"), seen("r2", 2, "/b", "g2")],
            &[wanted(1, "/a", "g1"), wanted(2, "/b", "g2")],
        );
        assert_eq!(plan, RulePlan::default());
        // A path edited, a rule gone, a duplicate priority.
        let plan = plan_rules(
            &[
                seen("r1", 1, "/a", "g1"),
                seen("r2", 2, "/b", "g2"),
                seen("r3", 1, "/a", "g1"),
            ],
            &[wanted(1, "/c", "g1")],
        );
        assert_eq!(plan.modify, vec![("r1".to_string(), wanted(1, "/c", "g1"))]);
        assert_eq!(plan.delete, vec!["r2".to_string(), "r3".to_string()]);
        assert!(plan.create.is_empty());
        // A rule with a condition we never set is rewritten.
        let mut odd = seen("r1", 1, "/a", "g1");
        odd.other_conditions = true;
        assert_eq!(plan_rules(&[odd], &[wanted(1, "/a", "g1")]).modify.len(), 1);
    }

    #[test]
    fn actions_resolve_names_to_arns() {
        let arns = BTreeMap::from([("tg".to_string(), "arn:tg".to_string())]);
        assert_eq!(
            resolve(
                &AlbAction::Forward {
                    target_group: "tg".into()
                },
                &arns
            )
            .expect("known"),
            SeenAction::Forward("arn:tg".into())
        );
        assert!(
            resolve(
                &AlbAction::Forward {
                    target_group: "x".into()
                },
                &arns
            )
            .is_err()
        );
        let fixed = AlbAction::FixedResponse {
            status_code: "404".into(),
            content_type: "text/plain".into(),
        };
        let action = sdk_action(&resolve(&fixed, &arns).expect("fixed")).expect("an action");
        assert_eq!(
            seen_action(&[action]),
            SeenAction::FixedResponse("404".into(), "text/plain".into())
        );
    }

    #[test]
    fn rules_are_read_from_either_condition_form() {
        let rule = Rule::builder()
            .rule_arn("r")
            .priority("3")
            .conditions(
                RuleCondition::builder()
                    .field("host-header")
                    .values("a.example.com")
                    .build(),
            )
            .conditions(
                RuleCondition::builder()
                    .field("path-pattern")
                    .path_pattern_config(
                        PathPatternConditionConfig::builder()
                            .values("/x")
                            .values("/x/*")
                            .build(),
                    )
                    .build(),
            )
            .actions(
                Action::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn("arn:tg")
                    .build(),
            )
            .build();
        let seen = seen_rule(&rule).expect("a rule");
        assert_eq!(seen.priority, 3);
        assert_eq!(seen.host_header, vec!["a.example.com"]);
        assert_eq!(seen.path_pattern, vec!["/x", "/x/*"]);
        assert_eq!(seen.action, SeenAction::Forward("arn:tg".into()));
        let default = Rule::builder()
            .rule_arn("d")
            .priority("default")
            .is_default(true)
            .build();
        assert!(seen_rule(&default).is_none());
    }
}
