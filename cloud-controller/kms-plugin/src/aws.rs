//! The AWS KMS backend: the only code in this crate that links `aws-sdk-kms`. Its client is
//! built as `cloud-controller/src/aws/mod.rs` builds EC2's (TLS through rustls with ring via
//! aws-smithy-http-client, the SDK's standard retries, an endpoint override for LocalStack),
//! with the standard credential chain and shorter timeouts (see [`AwsKms::connect`]).

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_kms::config::http::HttpResponse;
use aws_sdk_kms::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kms::primitives::Blob;
use aws_smithy_http_client::tls;
use flotilla_api_machinery::errors::error_chain;

use crate::backend::{Encrypted, KeyDescription, KmsBackend, KmsError};

/// Attempts of one call, with the SDK's jittered exponential back-off between them.
const MAX_ATTEMPTS: u32 = 3;
/// The API server gives a plugin call a few seconds (the provider's `timeout`, 3 s by
/// default) and cancels it after that, so waiting longer than this for one attempt only
/// holds a connection for an answer nobody reads.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// All attempts of one call (Status, which the API server also bounds, is the only caller
/// that might wait this long).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Dialling KMS (a regional endpoint or a VPC endpoint: milliseconds when it works).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where AWS KMS is. Unset fields come from the SDK's usual sources: `AWS_REGION` (or
/// `AWS_DEFAULT_REGION`, or the profile), `AWS_ENDPOINT_URL_KMS` / `AWS_ENDPOINT_URL`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// The region (`--region`).
    pub region: Option<String>,
    /// The endpoint instead of KMS's regional one (`--endpoint-url`), e.g. LocalStack's
    /// `http://127.0.0.1:4566`.
    pub endpoint_url: Option<String>,
}

/// Why the KMS client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    /// No region from the flags, the environment or the profile.
    #[error("no AWS region: pass --region or set AWS_REGION")]
    NoRegion,
}

/// AWS KMS, through one SDK client (which pools its connections and is cheap to share).
#[derive(Debug, Clone)]
pub struct AwsKms {
    client: aws_sdk_kms::Client,
}

impl AwsKms {
    /// A client for `settings`, with credentials from the standard chain (environment,
    /// profile, web identity, ECS, IMDS). No call is made yet: a missing credential shows up
    /// on the first call, and in Status.
    pub async fn connect(settings: &AwsSettings) -> Result<Self, AwsError> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(
                tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .operation_timeout(OPERATION_TIMEOUT)
                    .build(),
            );
        if let Some(region) = &settings.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &settings.endpoint_url {
            loader = loader.endpoint_url(endpoint);
        }
        let shared = loader.load().await;
        if shared.region().is_none() {
            return Err(AwsError::NoRegion);
        }
        Ok(AwsKms {
            client: aws_sdk_kms::Client::new(&shared),
        })
    }
}

impl KmsBackend for AwsKms {
    async fn encrypt(&self, key_id: &str, plaintext: Vec<u8>) -> Result<Encrypted, KmsError> {
        const OPERATION: &str = "Encrypt";
        let output = self
            .client
            .encrypt()
            .key_id(key_id)
            .plaintext(Blob::new(plaintext))
            .send()
            .await
            .map_err(|err| kms_error(OPERATION, err))?;
        let ciphertext = output.ciphertext_blob.ok_or(KmsError::Incomplete {
            operation: OPERATION,
            missing: "CiphertextBlob",
        })?;
        let key_arn = output.key_id.ok_or(KmsError::Incomplete {
            operation: OPERATION,
            missing: "KeyId",
        })?;
        Ok(Encrypted {
            ciphertext: ciphertext.into_inner(),
            key_arn,
        })
    }

    async fn decrypt(
        &self,
        ciphertext: Vec<u8>,
        key_id: Option<&str>,
    ) -> Result<Vec<u8>, KmsError> {
        const OPERATION: &str = "Decrypt";
        let output = self
            .client
            .decrypt()
            .ciphertext_blob(Blob::new(ciphertext))
            .set_key_id(key_id.map(str::to_string))
            .send()
            .await
            .map_err(|err| kms_error(OPERATION, err))?;
        let plaintext = output.plaintext.ok_or(KmsError::Incomplete {
            operation: OPERATION,
            missing: "Plaintext",
        })?;
        Ok(plaintext.into_inner())
    }

    async fn describe_key(&self, key_id: &str) -> Result<KeyDescription, KmsError> {
        const OPERATION: &str = "DescribeKey";
        let output = self
            .client
            .describe_key()
            .key_id(key_id)
            .send()
            .await
            .map_err(|err| kms_error(OPERATION, err))?;
        let metadata = output.key_metadata.ok_or(KmsError::Incomplete {
            operation: OPERATION,
            missing: "KeyMetadata",
        })?;
        let arn = metadata.arn.ok_or(KmsError::Incomplete {
            operation: OPERATION,
            missing: "KeyMetadata.Arn",
        })?;
        // Older answers (and some emulators) carry only `Enabled`; the state is the finer word.
        let state = match metadata.key_state {
            Some(state) => state.as_str().to_string(),
            None if metadata.enabled => crate::backend::KEY_STATE_ENABLED.to_string(),
            None => "Disabled".to_string(),
        };
        Ok(KeyDescription { arn, state })
    }
}

/// The one place an SDK failure becomes a [`KmsError`]: KMS's code and message when it
/// answered, [`KmsError::Unreachable`] when it could not be reached or timed out.
fn kms_error<E>(operation: &'static str, err: SdkError<E, HttpResponse>) -> KmsError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(service) => {
            let inner = service.err();
            KmsError::service(
                operation,
                inner.code().unwrap_or("Unknown"),
                inner.message().unwrap_or(""),
                service.raw().status().is_server_error(),
            )
        }
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            KmsError::Unreachable {
                operation,
                reason: crate::backend::one_line(&error_chain(&err)),
            }
        }
        _ => KmsError::Request {
            operation,
            reason: crate::backend::one_line(&error_chain(&err)),
        },
    }
}
