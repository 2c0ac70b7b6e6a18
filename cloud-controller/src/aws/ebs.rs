//! EBS volumes on EC2 for the provisioner, the attacher and the resizer ([`crate::volume`]):
//! CreateVolume (idempotent by the PV-name tag, since moto ignores client tokens),
//! DescribeVolumes, DeleteVolume, AttachVolume, DetachVolume and ModifyVolume, each
//! answering the outcomes callers expect (gone, not attached) as values, not errors.

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification, VolumeType};

use super::{AwsCloud, cloud_error};
use crate::provider::{
    CloudError, CloudResult, CreateVolumeRequest, Volume, VolumeAttachmentInfo, Volumes,
};
use crate::volume::params::PV_NAME_TAG;

/// The codes EC2 answers for a volume that does not exist.
fn volume_not_found(err: &CloudError) -> bool {
    matches!(
        err.code.as_str(),
        "InvalidVolume.NotFound" | "InvalidVolumeID.NotFound"
    )
}

fn to_volume(volume: &aws_sdk_ec2::types::Volume) -> Volume {
    Volume {
        id: volume.volume_id().unwrap_or_default().to_string(),
        zone: volume.availability_zone().unwrap_or_default().to_string(),
        size_gib: volume.size().unwrap_or_default(),
        volume_type: volume
            .volume_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        state: volume
            .state()
            .map(|s| s.as_str().to_string())
            .unwrap_or_default(),
        attachments: volume
            .attachments()
            .iter()
            .map(|a| VolumeAttachmentInfo {
                instance_id: a.instance_id().unwrap_or_default().to_string(),
                state: a
                    .state()
                    .map(|s| s.as_str().to_string())
                    .unwrap_or_default(),
                device: a.device().unwrap_or_default().to_string(),
            })
            .collect(),
    }
}

impl AwsCloud {
    /// A live volume of this cluster already created for the PV `pv_name` (a create retried
    /// after a lost answer must not make a second one).
    async fn volume_for_pv(&self, pv_name: &str) -> CloudResult<Option<Volume>> {
        let filters = vec![
            Filter::builder()
                .name(format!("tag:{PV_NAME_TAG}"))
                .values(pv_name)
                .build(),
            Filter::builder()
                .name(format!("tag:{}", self.settings.cluster_tag_key()))
                .values("owned")
                .build(),
        ];
        let answer = self
            .ec2
            .describe_volumes()
            .set_filters(Some(filters))
            .send()
            .await
            .map_err(cloud_error)?;
        Ok(answer
            .volumes()
            .iter()
            .map(to_volume)
            .find(|v| !matches!(v.state.as_str(), "deleting" | "deleted" | "error")))
    }
}

#[async_trait]
impl Volumes for AwsCloud {
    async fn create_volume(&self, request: &CreateVolumeRequest) -> CloudResult<Volume> {
        let pv_name = request
            .tags
            .get(PV_NAME_TAG)
            .cloned()
            .unwrap_or_else(|| request.client_token.clone());
        if let Some(existing) = self.volume_for_pv(&pv_name).await? {
            return Ok(existing);
        }
        let tags: Vec<Tag> = request
            .tags
            .iter()
            .map(|(key, value)| Tag::builder().key(key).value(value).build())
            .collect();
        let answer = self
            .ec2
            .create_volume()
            .availability_zone(&request.zone)
            .size(request.size_gib)
            .volume_type(VolumeType::from(request.volume_type.as_str()))
            .set_iops(request.iops)
            .encrypted(request.encrypted)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Volume)
                    .set_tags(Some(tags))
                    .build(),
            )
            .client_token(&request.client_token)
            .send()
            .await
            .map_err(cloud_error)?;
        Ok(Volume {
            id: answer.volume_id().unwrap_or_default().to_string(),
            zone: answer
                .availability_zone()
                .unwrap_or(&request.zone)
                .to_string(),
            size_gib: answer.size().unwrap_or(request.size_gib),
            volume_type: answer
                .volume_type()
                .map(|t| t.as_str().to_string())
                .unwrap_or_else(|| request.volume_type.clone()),
            state: answer
                .state()
                .map(|s| s.as_str().to_string())
                .unwrap_or_default(),
            attachments: Vec::new(),
        })
    }

    async fn describe_volume(&self, volume_id: &str) -> CloudResult<Option<Volume>> {
        match self
            .ec2
            .describe_volumes()
            .volume_ids(volume_id)
            .send()
            .await
        {
            Ok(answer) => Ok(answer.volumes().first().map(to_volume)),
            Err(err) => {
                let err = cloud_error(err);
                if volume_not_found(&err) {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    async fn delete_volume(&self, volume_id: &str) -> CloudResult<()> {
        match self.ec2.delete_volume().volume_id(volume_id).send().await {
            Ok(_) => Ok(()),
            Err(err) => {
                let err = cloud_error(err);
                if volume_not_found(&err) {
                    Ok(())
                } else {
                    Err(err)
                }
            }
        }
    }

    async fn attach_volume(
        &self,
        volume_id: &str,
        instance_id: &str,
        device: &str,
    ) -> CloudResult<()> {
        self.ec2
            .attach_volume()
            .volume_id(volume_id)
            .instance_id(instance_id)
            .device(device)
            .send()
            .await
            .map_err(cloud_error)?;
        Ok(())
    }

    async fn detach_volume(&self, volume_id: &str, instance_id: &str) -> CloudResult<()> {
        match self
            .ec2
            .detach_volume()
            .volume_id(volume_id)
            .instance_id(instance_id)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => {
                let err = cloud_error(err);
                // Already detached (IncorrectState: the volume is `available`), never attached
                // there, or gone: each leaves the wanted end state.
                if volume_not_found(&err)
                    || matches!(
                        err.code.as_str(),
                        "IncorrectState" | "InvalidAttachment.NotFound"
                    )
                {
                    Ok(())
                } else {
                    Err(err)
                }
            }
        }
    }

    async fn resize_volume(&self, volume_id: &str, size_gib: i32) -> CloudResult<()> {
        self.ec2
            .modify_volume()
            .volume_id(volume_id)
            .size(size_gib)
            .send()
            .await
            .map_err(cloud_error)?;
        Ok(())
    }
}
