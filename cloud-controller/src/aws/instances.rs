//! EC2 instances: node groups (launch, list by tags, terminate, subnet zones) and
//! `InstancesV2` for the node controller.

use std::collections::BTreeMap;

use async_trait::async_trait;
use aws_sdk_ec2::types::{
    Filter, InstanceStateName, InstanceType, ResourceType, Tag, TagSpecification,
};
use base64::Engine;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use super::{AwsCloud, cloud_error, filter};
use crate::nodepool::{KUBERNETES_VERSION_TAG, NODE_IMAGE_TAG};
use crate::provider::{
    CloudError, CloudResult, Instance, InstanceMetadata, InstanceState, InstancesV2, LaunchRequest,
    NodeGroups, NodeImage,
};

/// The instance id in a provider ID `aws:///<zone>/<instance-id>` (or `aws://<zone>/<id>`).
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<&str> {
    let rest = provider_id.strip_prefix("aws://")?;
    let id = rest.rsplit('/').next()?;
    id.starts_with("i-").then_some(id)
}

fn state_of(name: Option<&InstanceStateName>) -> InstanceState {
    match name {
        Some(InstanceStateName::Pending) => InstanceState::Pending,
        Some(InstanceStateName::Running) => InstanceState::Running,
        Some(InstanceStateName::Stopping) => InstanceState::Stopping,
        Some(InstanceStateName::Stopped) => InstanceState::Stopped,
        Some(InstanceStateName::ShuttingDown) => InstanceState::ShuttingDown,
        _ => InstanceState::Terminated,
    }
}

fn to_instance(instance: &aws_sdk_ec2::types::Instance) -> Instance {
    let tags = instance
        .tags()
        .iter()
        .filter_map(|tag| {
            Some((
                tag.key()?.to_string(),
                tag.value().unwrap_or("").to_string(),
            ))
        })
        .collect();
    Instance {
        id: instance.instance_id().unwrap_or_default().to_string(),
        state: state_of(instance.state().and_then(|s| s.name())),
        zone: instance
            .placement()
            .and_then(|p| p.availability_zone())
            .unwrap_or_default()
            .to_string(),
        subnet_id: instance.subnet_id().unwrap_or_default().to_string(),
        instance_type: instance
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        private_dns_name: instance.private_dns_name().unwrap_or_default().to_string(),
        private_ip: instance
            .private_ip_address()
            .unwrap_or_default()
            .to_string(),
        tags,
        launch_time: instance
            .launch_time()
            .map(|t| t.to_string())
            .unwrap_or_default(),
    }
}

fn address(kind: &str, value: &str) -> Option<NodeAddress> {
    (!value.is_empty()).then(|| NodeAddress {
        type_: kind.into(),
        address: value.into(),
    })
}

impl AwsCloud {
    /// Instances matching `filters`, terminated ones included (callers decide).
    async fn describe_instances(&self, filters: Vec<Filter>) -> CloudResult<Vec<Instance>> {
        let mut found = Vec::new();
        let mut pages = self
            .ec2
            .describe_instances()
            .set_filters(Some(filters))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(cloud_error)?;
            for reservation in page.reservations() {
                found.extend(reservation.instances().iter().map(to_instance));
            }
        }
        Ok(found)
    }

    /// The EC2 instance of a Node: by provider ID when set, else by private DNS name. A
    /// terminated instance is as good as none.
    async fn node_instance(
        &self,
        node: &Node,
    ) -> CloudResult<Option<(Instance, aws_sdk_ec2::types::Instance)>> {
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        let request = self.ec2.describe_instances();
        let request = match provider_id.and_then(instance_id_from_provider_id) {
            Some(id) => request.instance_ids(id),
            None => {
                let name = node.metadata.name.clone().unwrap_or_default();
                request.filters(filter("private-dns-name", [name]))
            }
        };
        let answer = match request.send().await {
            Ok(answer) => answer,
            Err(err) => {
                let err = cloud_error(err);
                // DescribeInstances by id answers a gone instance with this code.
                if err.code == "InvalidInstanceID.NotFound" {
                    return Ok(None);
                }
                return Err(err);
            }
        };
        Ok(answer
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .map(|raw| (to_instance(raw), raw.clone()))
            .find(|(instance, _)| instance.state != InstanceState::Terminated))
    }
}

#[async_trait]
impl InstancesV2 for AwsCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        Ok(self.node_instance(node).await?.is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        Ok(self
            .node_instance(node)
            .await?
            .is_some_and(|(instance, _)| {
                matches!(
                    instance.state,
                    InstanceState::Stopping | InstanceState::Stopped
                )
            }))
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let Some((instance, raw)) = self.node_instance(node).await? else {
            return Ok(None);
        };
        let mut node_addresses: Vec<NodeAddress> = Vec::new();
        node_addresses.extend(address("InternalIP", &instance.private_ip));
        node_addresses.extend(address("InternalDNS", &instance.private_dns_name));
        node_addresses.extend(address("Hostname", &instance.private_dns_name));
        node_addresses.extend(address("ExternalIP", raw.public_ip_address().unwrap_or("")));
        node_addresses.extend(address("ExternalDNS", raw.public_dns_name().unwrap_or("")));
        Ok(Some(InstanceMetadata {
            provider_id: format!("aws:///{}/{}", instance.zone, instance.id),
            instance_type: instance.instance_type,
            node_addresses,
            zone: instance.zone,
            region: self.settings.region.clone(),
        }))
    }
}

#[async_trait]
impl NodeGroups for AwsCloud {
    async fn instances_tagged(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<Vec<Instance>> {
        let mut filters: Vec<Filter> = tags
            .iter()
            .map(|(key, value)| filter(&format!("tag:{key}"), [value.clone()]))
            .collect();
        filters.push(filter(
            "instance-state-name",
            ["pending", "running", "stopping", "stopped", "shutting-down"].map(String::from),
        ));
        let mut found = self.describe_instances(filters).await?;
        found.retain(|instance| instance.state != InstanceState::Terminated);
        Ok(found)
    }

    async fn launch(&self, request: &LaunchRequest) -> CloudResult<Instance> {
        let tags: Vec<Tag> = request
            .tags
            .iter()
            .map(|(key, value)| Tag::builder().key(key).value(value).build())
            .collect();
        let tag_spec = |kind: ResourceType| {
            TagSpecification::builder()
                .resource_type(kind)
                .set_tags(Some(tags.clone()))
                .build()
        };
        let answer = self
            .ec2
            .run_instances()
            .image_id(&request.image_id)
            .instance_type(InstanceType::from(request.instance_type.as_str()))
            .subnet_id(&request.subnet_id)
            .set_security_group_ids(
                (!request.security_group_ids.is_empty())
                    .then(|| request.security_group_ids.clone()),
            )
            .user_data(base64::engine::general_purpose::STANDARD.encode(&request.user_data))
            .tag_specifications(tag_spec(ResourceType::Instance))
            .tag_specifications(tag_spec(ResourceType::Volume))
            .client_token(&request.client_token)
            .min_count(1)
            .max_count(1)
            .send()
            .await
            .map_err(cloud_error)?;
        answer
            .instances()
            .first()
            .map(to_instance)
            .ok_or_else(|| CloudError {
                code: "InternalError".into(),
                message: "RunInstances answered without an instance".into(),
                retryable: true,
            })
    }

    async fn terminate(&self, instance_ids: &[String]) -> CloudResult<()> {
        if instance_ids.is_empty() {
            return Ok(());
        }
        match self
            .ec2
            .terminate_instances()
            .set_instance_ids(Some(instance_ids.to_vec()))
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => {
                let err = cloud_error(err);
                if err.code == "InvalidInstanceID.NotFound" {
                    Ok(())
                } else {
                    Err(err)
                }
            }
        }
    }

    async fn node_images(&self) -> CloudResult<Vec<NodeImage>> {
        let answer = self
            .ec2
            .describe_images()
            .owners("self")
            .filters(filter(
                &format!("tag:{NODE_IMAGE_TAG}"),
                ["true".to_string()],
            ))
            .filters(filter("state", ["available".to_string()]))
            .send()
            .await
            .map_err(cloud_error)?;
        Ok(answer
            .images()
            .iter()
            .filter_map(|image| {
                let tag = |key: &str| {
                    image
                        .tags()
                        .iter()
                        .find(|t| t.key() == Some(key))
                        .and_then(|t| t.value())
                        .map(str::to_string)
                };
                // The filter is the service's; an image without the tag is not ours anyway.
                (tag(NODE_IMAGE_TAG).as_deref() == Some("true")).then(|| NodeImage {
                    image_id: image.image_id().unwrap_or_default().to_string(),
                    name: image.name().unwrap_or_default().to_string(),
                    kubernetes_version: tag(KUBERNETES_VERSION_TAG).unwrap_or_default(),
                    creation_date: image.creation_date().unwrap_or_default().to_string(),
                })
            })
            .collect())
    }

    async fn subnet_zones(&self, subnet_ids: &[String]) -> CloudResult<Vec<String>> {
        if subnet_ids.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self
            .ec2
            .describe_subnets()
            .set_subnet_ids(Some(subnet_ids.to_vec()))
            .send()
            .await
            .map_err(cloud_error)?;
        subnet_ids
            .iter()
            .map(|id| {
                answer
                    .subnets()
                    .iter()
                    .find(|s| s.subnet_id() == Some(id.as_str()))
                    .and_then(|s| s.availability_zone())
                    .map(str::to_string)
                    .ok_or_else(|| CloudError {
                        code: "InvalidSubnetID.NotFound".into(),
                        message: format!("The subnet ID '{id}' does not exist"),
                        retryable: false,
                    })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_name_their_instance() {
        assert_eq!(
            instance_id_from_provider_id("aws:///us-east-1a/i-0123456789abcdef0"),
            Some("i-0123456789abcdef0")
        );
        assert_eq!(
            instance_id_from_provider_id("aws://us-east-1a/i-1"),
            Some("i-1")
        );
        assert_eq!(instance_id_from_provider_id("gce://p/z/n"), None);
        assert_eq!(instance_id_from_provider_id("aws:///us-east-1a/"), None);
    }
}
