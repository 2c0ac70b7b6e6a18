//! The AWS implementation of the provider traits: the only code that links the AWS SDK
//! (EC2 for instances and volumes, ELBv2 for load balancers). Every client is built from a
//! cluster's [`CloudSettings`], so the same code runs against AWS and LocalStack.

mod alb;
mod ebs;
mod elb;
mod instances;
mod security_groups;

pub use instances::instance_id_from_provider_id;

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_smithy_http_client::tls;

use crate::config::CloudSettings;
use crate::provider::CloudError;
use flotilla_api_machinery::errors::error_chain;

/// Attempts of one call, with the SDK's standard jittered exponential back-off between them
/// (throttling and 5xx are retried; the controllers' requeue covers longer outages).
const MAX_ATTEMPTS: u32 = 4;

/// One cluster's AWS clients.
#[derive(Clone)]
pub struct AwsCloud {
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancingv2::Client,
    settings: CloudSettings,
}

impl std::fmt::Debug for AwsCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCloud")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl AwsCloud {
    /// Clients for `settings` (no call is made yet).
    pub async fn connect(settings: CloudSettings) -> Self {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .region(Region::new(settings.region.clone()))
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(20))
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            );
        if let Some(endpoint) = &settings.endpoint_override {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(keys) = &settings.credentials {
            loader = loader.credentials_provider(Credentials::new(
                &keys.access_key_id,
                &keys.secret_access_key,
                None,
                None,
                "flotilla-cluster",
            ));
        }
        let mut shared = loader.load().await;
        if let Some(role) = &settings.role_arn {
            let provider = aws_config::sts::AssumeRoleProvider::builder(role)
                .session_name(format!("flotilla-{}", settings.cluster_id))
                .configure(&shared)
                .build()
                .await;
            shared = shared
                .into_builder()
                .credentials_provider(
                    aws_credential_types::provider::SharedCredentialsProvider::new(provider),
                )
                .build();
        }
        AwsCloud {
            ec2: aws_sdk_ec2::Client::new(&shared),
            elb: aws_sdk_elasticloadbalancingv2::Client::new(&shared),
            settings,
        }
    }

    /// The settings these clients were built from.
    pub fn settings(&self) -> &CloudSettings {
        &self.settings
    }
}

/// The one place an SDK failure becomes a [`CloudError`]: the service's code and message when
/// it answered, `ServiceUnavailable` when it could not be reached.
pub(crate) fn cloud_error<E, R>(err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    match &err {
        SdkError::ServiceError(service) => {
            let inner = service.err();
            let code = inner.code().unwrap_or("Unknown").to_string();
            let retryable = is_retryable_code(&code);
            CloudError {
                message: inner.message().unwrap_or("").to_string(),
                code,
                retryable,
            }
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            CloudError {
                code: "ServiceUnavailable".into(),
                message: format!("the cloud API did not answer: {}", error_chain(&err)),
                retryable: true,
            }
        }
        _ => CloudError {
            code: "ClientError".into(),
            message: error_chain(&err),
            retryable: false,
        },
    }
}

/// Codes that a later retry can succeed on without any change of input.
fn is_retryable_code(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "RequestLimitExceeded"
            | "InsufficientInstanceCapacity"
            | "InsufficientCapacity"
            | "ServiceUnavailable"
            | "InternalError"
            | "Unavailable"
    )
}

/// An EC2 filter `name` matching any of `values`.
pub(super) fn filter(
    name: &str,
    values: impl IntoIterator<Item = String>,
) -> aws_sdk_ec2::types::Filter {
    aws_sdk_ec2::types::Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().collect()))
        .build()
}

/// An answer that lacked what the call promises (`what`): retried, as a passing fault.
pub(super) fn missing(what: &str) -> CloudError {
    CloudError {
        code: "InternalError".into(),
        message: format!("AWS answered without {what}"),
        retryable: true,
    }
}
