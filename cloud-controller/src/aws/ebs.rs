//! EBS volumes for the provisioner and the attach/detach controller (being written: every
//! call answers `NotImplemented` until then).

use async_trait::async_trait;

use super::AwsCloud;
use crate::provider::{CloudError, CloudResult, CreateVolumeRequest, Volume, Volumes};

fn not_yet() -> CloudError {
    CloudError {
        code: "NotImplemented".into(),
        message: "volumes are not implemented yet".into(),
        retryable: false,
    }
}

#[async_trait]
impl Volumes for AwsCloud {
    async fn create_volume(&self, _: &CreateVolumeRequest) -> CloudResult<Volume> {
        Err(not_yet())
    }
    async fn describe_volume(&self, _: &str) -> CloudResult<Option<Volume>> {
        Err(not_yet())
    }
    async fn delete_volume(&self, _: &str) -> CloudResult<()> {
        Err(not_yet())
    }
    async fn attach_volume(&self, _: &str, _: &str, _: &str) -> CloudResult<()> {
        Err(not_yet())
    }
    async fn detach_volume(&self, _: &str, _: &str) -> CloudResult<()> {
        Err(not_yet())
    }
    async fn resize_volume(&self, _: &str, _: i32) -> CloudResult<()> {
        Err(not_yet())
    }
}
