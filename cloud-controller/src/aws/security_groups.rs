//! EC2 security groups of application load balancers, as the AWS Load Balancer Controller
//! keeps them: the managed group of one load balancer (open on its listen ports to the
//! inbound CIDRs), the rules that let it into the security group of each target instance on
//! the target ports, groups named by the user, and their removal. The rule planning is sans
//! IO and unit tested; the calls are checked against LocalStack by the ingress e2e.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, ResourceType, SecurityGroup, Tag, TagSpecification,
    UserIdGroupPair,
};

use super::{AwsCloud, cloud_error, filter, missing};
use crate::provider::{CloudError, CloudResult};

/// Upstream's description of a managed group.
const MANAGED_DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";
/// Upstream's description of the rules it adds to the targets' groups.
const TARGET_RULE_DESCRIPTION: &str = "elbv2.k8s.aws/targetGroupBinding=shared";

/// Where an ingress rule lets traffic in from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    /// An IPv4 CIDR block.
    Cidr(String),
    /// Another security group (by ID).
    Group(String),
}

/// One TCP ingress rule with one source. EC2 answers permissions with several sources each;
/// they are split so that two sets of rules compare one rule at a time.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct IngressRule {
    /// First port.
    pub from_port: i32,
    /// Last port.
    pub to_port: i32,
    /// Who is let in.
    pub source: Source,
}

impl IngressRule {
    /// TCP on one port.
    pub fn tcp(port: i32, source: Source) -> Self {
        IngressRule {
            from_port: port,
            to_port: port,
            source,
        }
    }
}

/// The TCP rules of `permissions`, one per source (other protocols are not ours to manage).
pub fn rules_of(permissions: &[IpPermission]) -> BTreeSet<IngressRule> {
    let mut rules = BTreeSet::new();
    for permission in permissions {
        if permission.ip_protocol() != Some("tcp") {
            continue;
        }
        let (Some(from_port), Some(to_port)) = (permission.from_port(), permission.to_port())
        else {
            continue;
        };
        let cidrs = permission
            .ip_ranges()
            .iter()
            .filter_map(|range| range.cidr_ip())
            .map(|cidr| Source::Cidr(cidr.to_string()));
        let groups = permission
            .user_id_group_pairs()
            .iter()
            .filter_map(|pair| pair.group_id())
            .map(|group| Source::Group(group.to_string()));
        for source in cidrs.chain(groups) {
            rules.insert(IngressRule {
                from_port,
                to_port,
                source,
            });
        }
    }
    rules
}

/// What to change to get from `existing` to `wanted`: `(revoke, authorize)`.
pub fn plan(
    existing: &BTreeSet<IngressRule>,
    wanted: &BTreeSet<IngressRule>,
) -> (Vec<IngressRule>, Vec<IngressRule>) {
    (
        existing.difference(wanted).cloned().collect(),
        wanted.difference(existing).cloned().collect(),
    )
}

fn sdk_permission(rule: &IngressRule, description: Option<&str>) -> IpPermission {
    let permission = IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(rule.from_port)
        .to_port(rule.to_port);
    match &rule.source {
        Source::Cidr(cidr) => permission.ip_ranges(
            IpRange::builder()
                .cidr_ip(cidr)
                .set_description(description.map(str::to_string))
                .build(),
        ),
        Source::Group(group) => permission.user_id_group_pairs(
            UserIdGroupPair::builder()
                .group_id(group)
                .set_description(description.map(str::to_string))
                .build(),
        ),
    }
    .build()
}

/// Upstream's `resolveEndpointSGForENI`: the security group of a target's network interface
/// that the load balancer is let into — its only group, else the one of its groups tagged
/// for the cluster (`tagged`); none or several tagged is an error that says which.
pub fn target_security_group(
    interface: &str,
    groups: &[String],
    tagged: &BTreeSet<String>,
    cluster_tag_key: &str,
) -> CloudResult<String> {
    if let [only] = groups {
        return Ok(only.clone());
    }
    let candidates: Vec<&String> = groups.iter().filter(|g| tagged.contains(*g)).collect();
    match candidates.as_slice() {
        [one] => Ok((*one).clone()),
        _ => Err(CloudError::invalid(format!(
            "expected exactly one security group tagged {cluster_tag_key} on {interface}, \
             found {} among {groups:?}",
            candidates.len()
        ))),
    }
}

fn tag_filters(tags: &BTreeMap<String, String>) -> Vec<Filter> {
    tags.iter()
        .map(|(key, value)| filter(&format!("tag:{key}"), [value.clone()]))
        .collect()
}

impl AwsCloud {
    /// Every security group matching all of `filters` and, when given, with one of `ids`.
    async fn security_groups_where(
        &self,
        filters: Vec<Filter>,
        ids: Option<Vec<String>>,
    ) -> CloudResult<Vec<SecurityGroup>> {
        let mut found = Vec::new();
        let mut pages = self
            .ec2
            .describe_security_groups()
            .set_filters((!filters.is_empty()).then_some(filters))
            .set_group_ids(ids)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            found.extend(page.map_err(cloud_error)?.security_groups().to_vec());
        }
        Ok(found)
    }

    async fn change_rules(
        &self,
        group_id: &str,
        revoke: &[IngressRule],
        authorize: &[IngressRule],
        description: Option<&str>,
    ) -> CloudResult<()> {
        if !revoke.is_empty() {
            self.ec2
                .revoke_security_group_ingress()
                .group_id(group_id)
                // With the description it was made with: moto matches rules on it too.
                .set_ip_permissions(Some(
                    revoke
                        .iter()
                        .map(|r| sdk_permission(r, description))
                        .collect(),
                ))
                .send()
                .await
                .map_err(cloud_error)?;
        }
        if !authorize.is_empty() {
            let answer = self
                .ec2
                .authorize_security_group_ingress()
                .group_id(group_id)
                .set_ip_permissions(Some(
                    authorize
                        .iter()
                        .map(|r| sdk_permission(r, description))
                        .collect(),
                ))
                .send()
                .await
                .map_err(cloud_error);
            // Another writer's identical rule is as good as ours.
            match answer {
                Err(err) if err.code == "InvalidPermission.Duplicate" => {}
                other => {
                    other?;
                }
            }
        }
        if !revoke.is_empty() || !authorize.is_empty() {
            tracing::info!(
                group = %group_id,
                revoked = revoke.len(),
                authorized = authorize.len(),
                "security group rules synced"
            );
        }
        Ok(())
    }

    /// The load balancer's own group in `vpc_id`, found by `tags` (created when missing),
    /// with exactly `rules`; returns its ID.
    pub(super) async fn ensure_managed_security_group(
        &self,
        name: &str,
        vpc_id: &str,
        tags: &BTreeMap<String, String>,
        rules: &BTreeSet<IngressRule>,
    ) -> CloudResult<String> {
        let mut filters = tag_filters(tags);
        filters.push(filter("vpc-id", [vpc_id.to_string()]));
        let existing = self.security_groups_where(filters, None).await?;
        let (group_id, current) = match existing.first() {
            Some(group) => (
                group
                    .group_id()
                    .ok_or_else(|| missing("a security group ID"))?
                    .to_string(),
                rules_of(group.ip_permissions()),
            ),
            None => {
                let answer = self
                    .ec2
                    .create_security_group()
                    .group_name(name)
                    .description(MANAGED_DESCRIPTION)
                    .vpc_id(vpc_id)
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::SecurityGroup)
                            .set_tags(Some(
                                tags.iter()
                                    .map(|(k, v)| Tag::builder().key(k).value(v).build())
                                    .collect(),
                            ))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(cloud_error)?;
                let id = answer
                    .group_id()
                    .ok_or_else(|| missing("the new security group's ID"))?
                    .to_string();
                tracing::info!(%name, %id, "created security group");
                (id, BTreeSet::new())
            }
        };
        let (revoke, authorize) = plan(&current, rules);
        self.change_rules(&group_id, &revoke, &authorize, None)
            .await?;
        Ok(group_id)
    }

    /// The IDs of groups named by ID (`sg-…`) or by name in `vpc_id`; one that does not
    /// exist is an error naming it.
    pub(super) async fn resolve_security_groups(
        &self,
        names_or_ids: &[String],
        vpc_id: &str,
    ) -> CloudResult<Vec<String>> {
        let (ids, names): (Vec<String>, Vec<String>) = names_or_ids
            .iter()
            .cloned()
            .partition(|item| item.starts_with("sg-"));
        let mut found: BTreeMap<String, String> = BTreeMap::new();
        let mut lookups = Vec::new();
        if !ids.is_empty() {
            lookups.push(vec![filter("group-id", ids.clone())]);
        }
        if !names.is_empty() {
            lookups.push(vec![
                filter("group-name", names.clone()),
                filter("vpc-id", [vpc_id.to_string()]),
            ]);
        }
        for filters in lookups {
            for group in self.security_groups_where(filters, None).await? {
                if let Some(id) = group.group_id() {
                    found.insert(id.to_string(), id.to_string());
                    if let Some(name) = group.group_name() {
                        found.insert(name.to_string(), id.to_string());
                    }
                }
            }
        }
        let missing: Vec<&String> = names_or_ids
            .iter()
            .filter(|item| !found.contains_key(*item))
            .collect();
        if !missing.is_empty() {
            return Err(CloudError::invalid(format!(
                "security groups not found in {vpc_id}: {missing:?}"
            )));
        }
        let mut resolved = Vec::new();
        for item in names_or_ids {
            let id = &found[item];
            if !resolved.contains(id) {
                resolved.push(id.clone());
            }
        }
        Ok(resolved)
    }

    /// The security group of each instance's primary network interface that a load
    /// balancer must be let into (see [`target_security_group`]).
    pub(super) async fn target_security_groups(
        &self,
        instance_ids: &BTreeSet<String>,
    ) -> CloudResult<BTreeSet<String>> {
        if instance_ids.is_empty() {
            return Ok(BTreeSet::new());
        }
        // By filter, so that an instance gone meanwhile is left out rather than an error.
        let mut interfaces: Vec<(String, Vec<String>)> = Vec::new();
        let mut pages = self
            .ec2
            .describe_instances()
            .filters(filter("instance-id", instance_ids.iter().cloned()))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            for reservation in page.map_err(cloud_error)?.reservations() {
                for instance in reservation.instances() {
                    let primary = instance
                        .network_interfaces()
                        .iter()
                        .find(|i| i.attachment().and_then(|a| a.device_index()) == Some(0))
                        .or_else(|| instance.network_interfaces().first());
                    let (name, groups) = match primary {
                        Some(interface) => (
                            interface.network_interface_id().unwrap_or_default(),
                            interface.groups(),
                        ),
                        None => (
                            instance.instance_id().unwrap_or_default(),
                            instance.security_groups(),
                        ),
                    };
                    let groups = groups
                        .iter()
                        .filter_map(|g| g.group_id().map(str::to_string))
                        .collect();
                    interfaces.push((name.to_string(), groups));
                }
            }
        }
        let ambiguous: BTreeSet<String> = interfaces
            .iter()
            .filter(|(_, groups)| groups.len() > 1)
            .flat_map(|(_, groups)| groups.iter().cloned())
            .collect();
        let cluster_tag_key = self.settings.cluster_tag_key();
        let tagged: BTreeSet<String> = if ambiguous.is_empty() {
            BTreeSet::new()
        } else {
            self.security_groups_where(
                vec![filter("tag-key", [cluster_tag_key.clone()])],
                Some(ambiguous.into_iter().collect()),
            )
            .await?
            .iter()
            .filter_map(|g| g.group_id().map(str::to_string))
            .collect()
        };
        interfaces
            .iter()
            .map(|(name, groups)| target_security_group(name, groups, &tagged, &cluster_tag_key))
            .collect()
    }

    /// Makes `source` let into exactly `targets` on `ports` (TCP): the rules naming it are
    /// added where missing and revoked from every other group that has them.
    pub(super) async fn sync_rules_from(
        &self,
        source: &str,
        targets: &BTreeSet<String>,
        ports: &BTreeSet<i32>,
    ) -> CloudResult<()> {
        let mut groups: BTreeMap<String, SecurityGroup> = BTreeMap::new();
        let referencing = self
            .security_groups_where(
                vec![filter("ip-permission.group-id", [source.to_string()])],
                None,
            )
            .await?;
        let targets_now = if targets.is_empty() {
            Vec::new()
        } else {
            self.security_groups_where(Vec::new(), Some(targets.iter().cloned().collect()))
                .await?
        };
        for group in referencing.into_iter().chain(targets_now) {
            if let Some(id) = group.group_id() {
                groups.insert(id.to_string(), group);
            }
        }
        let from_source = Source::Group(source.to_string());
        let wanted: BTreeSet<IngressRule> = ports
            .iter()
            .map(|port| IngressRule::tcp(*port, from_source.clone()))
            .collect();
        for (id, group) in &groups {
            let current: BTreeSet<IngressRule> = rules_of(group.ip_permissions())
                .into_iter()
                .filter(|rule| rule.source == from_source)
                .collect();
            let want = if targets.contains(id) {
                wanted.clone()
            } else {
                BTreeSet::new()
            };
            let (revoke, authorize) = plan(&current, &want);
            self.change_rules(id, &revoke, &authorize, Some(TARGET_RULE_DESCRIPTION))
                .await?;
        }
        Ok(())
    }

    /// Deletes every security group carrying all of `tags`, after revoking the rules that
    /// let it into other groups. A group still in use (a deleted load balancer's network
    /// interfaces linger for a while on AWS) is a retryable error.
    pub(super) async fn delete_managed_security_groups(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<()> {
        for group in self.security_groups_where(tag_filters(tags), None).await? {
            let Some(id) = group.group_id() else {
                continue;
            };
            self.sync_rules_from(id, &BTreeSet::new(), &BTreeSet::new())
                .await?;
            match self
                .ec2
                .delete_security_group()
                .group_id(id)
                .send()
                .await
                .map_err(cloud_error)
            {
                Ok(_) => tracing::info!(group = %id, "deleted security group"),
                Err(err) if err.code == "InvalidGroup.NotFound" => {}
                Err(err) if err.code == "DependencyViolation" => {
                    return Err(CloudError {
                        message: format!(
                            "security group {id} is still in use (a deleted load balancer's \
                             network interfaces take a while to go): {}",
                            err.message
                        ),
                        retryable: true,
                        ..err
                    });
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(port: i32, block: &str) -> IngressRule {
        IngressRule::tcp(port, Source::Cidr(block.into()))
    }

    #[test]
    fn permissions_split_into_one_rule_per_source() {
        let permissions = vec![
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
                .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/8").build())
                .user_id_group_pairs(UserIdGroupPair::builder().group_id("sg-lb").build())
                .build(),
            // Not TCP: not ours to manage, never revoked.
            IpPermission::builder().ip_protocol("-1").build(),
        ];
        let rules = rules_of(&permissions);
        assert_eq!(
            rules,
            BTreeSet::from([
                cidr(80, "0.0.0.0/0"),
                cidr(80, "10.0.0.0/8"),
                IngressRule::tcp(80, Source::Group("sg-lb".into())),
            ])
        );
    }

    #[test]
    fn plans_revoke_the_extra_and_authorize_the_missing() {
        let existing = BTreeSet::from([cidr(80, "0.0.0.0/0"), cidr(8080, "0.0.0.0/0")]);
        let wanted = BTreeSet::from([cidr(80, "0.0.0.0/0"), cidr(443, "0.0.0.0/0")]);
        assert_eq!(
            plan(&existing, &wanted),
            (vec![cidr(8080, "0.0.0.0/0")], vec![cidr(443, "0.0.0.0/0")])
        );
        assert_eq!(plan(&wanted, &wanted), (vec![], vec![]));
    }

    #[test]
    fn a_target_group_is_the_only_one_or_the_one_tagged_for_the_cluster() {
        let tag = "kubernetes.io/cluster/demo";
        let groups = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let none = BTreeSet::new();
        assert_eq!(
            target_security_group("eni-1", &groups(&["sg-a"]), &none, tag).expect("one group"),
            "sg-a"
        );
        let tagged = BTreeSet::from(["sg-b".to_string()]);
        assert_eq!(
            target_security_group("eni-1", &groups(&["sg-a", "sg-b"]), &tagged, tag)
                .expect("one group"),
            "sg-b"
        );
        let err = target_security_group("eni-1", &groups(&["sg-a", "sg-c"]), &tagged, tag)
            .expect_err("an error");
        assert!(
            err.message.contains("eni-1") && err.message.contains(tag),
            "{err}"
        );
        let both = BTreeSet::from(["sg-a".to_string(), "sg-c".to_string()]);
        assert!(target_security_group("eni-1", &groups(&["sg-a", "sg-c"]), &both, tag).is_err());
    }
}
