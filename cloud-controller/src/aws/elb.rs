//! ELBv2 network load balancers for `type: LoadBalancer` Services (being written: every call
//! answers `NotImplemented` until then).

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::AwsCloud;
use crate::provider::{CloudError, CloudResult, LoadBalancers};

fn not_yet() -> CloudError {
    CloudError {
        code: "NotImplemented".into(),
        message: "load balancers are not implemented yet".into(),
        retryable: false,
    }
}

#[async_trait]
impl LoadBalancers for AwsCloud {
    async fn get_load_balancer(&self, _: &Service) -> CloudResult<Option<LoadBalancerStatus>> {
        let _ = &self.elb;
        Err(not_yet())
    }
    async fn ensure_load_balancer(
        &self,
        _: &Service,
        _: &[Node],
    ) -> CloudResult<LoadBalancerStatus> {
        Err(not_yet())
    }
    async fn update_load_balancer(&self, _: &Service, _: &[Node]) -> CloudResult<()> {
        Err(not_yet())
    }
    async fn ensure_load_balancer_deleted(&self, _: &Service) -> CloudResult<()> {
        Err(not_yet())
    }
}
