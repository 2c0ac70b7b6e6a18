//! The `v2.KeyManagementService` gRPC service over a [`KmsBackend`], without generated code:
//! [`KeyManagementService`] is the `tower::Service` that tonic-prost-build would generate,
//! routing the three method paths to tonic's unary handler with prost's codec and answering
//! any other path Unimplemented; its `encrypt`, `decrypt` and `status` are the plugin's
//! semantics, callable without gRPC.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use flotilla_api_machinery::kms::{
    self, DecryptRequest, DecryptResponse, EncryptRequest, EncryptResponse, StatusRequest,
    StatusResponse,
};
use tokio::time::Instant;
use tonic::codegen::{BoxFuture, StdError};
use tonic_prost::prost::Message;
use tracing::Instrument;

use crate::backend::{KmsBackend, KmsError};

/// How long a healthy Status answer is reused. The API server asks for Status on its health
/// checks and to notice key rotation (about once a minute, more often while its health is
/// polled), and many API servers may share one account's KMS quota; a key turning unhealthy
/// is still seen within this long, and at once after an Encrypt or Decrypt fails for it.
pub const DEFAULT_STATUS_TTL: Duration = Duration::from_secs(60);

/// What the service needs besides its backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// The key to encrypt with (`--key-id`): a key id, key ARN, alias name or alias ARN.
    pub key_id: String,
    /// How long a healthy Status answer is reused ([`DEFAULT_STATUS_TTL`]).
    pub status_ttl: Duration,
}

impl ServiceConfig {
    /// `key_id` with the default Status cache.
    pub fn new(key_id: impl Into<String>) -> Self {
        ServiceConfig {
            key_id: key_id.into(),
            status_ttl: DEFAULT_STATUS_TTL,
        }
    }
}

/// The plugin's gRPC service; clones share the backend and the Status cache.
pub struct KeyManagementService<B> {
    inner: Arc<Inner<B>>,
}

impl<B> Clone for KeyManagementService<B> {
    fn clone(&self) -> Self {
        KeyManagementService {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<B> {
    backend: B,
    config: ServiceConfig,
    /// Held by a Status across its `DescribeKey`, so that Status calls arriving together make
    /// one call. Encrypt and Decrypt never wait for it.
    describing: tokio::sync::Mutex<()>,
    /// Locked only briefly, never across a call to KMS.
    status: std::sync::Mutex<StatusCache>,
}

#[derive(Default)]
struct StatusCache {
    /// The key's ARN as last seen: Status keeps answering it while KMS is unreachable, since
    /// a changed key id makes the API server rotate its data-encryption seed.
    key_arn: Option<String>,
    /// Until when the last healthy answer stands; `None` asks KMS on the next Status.
    healthy_until: Option<Instant>,
}

impl<B: KmsBackend> KeyManagementService<B> {
    /// The service over `backend`.
    pub fn new(backend: B, config: ServiceConfig) -> Self {
        KeyManagementService {
            inner: Arc::new(Inner {
                backend,
                config,
                describing: tokio::sync::Mutex::new(()),
                status: std::sync::Mutex::new(StatusCache::default()),
            }),
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, StatusCache> {
        // The cache holds no invariant a panicking holder could break half-way.
        self.inner
            .status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `Encrypt`: the plaintext encrypted by the plugin's key, and that key's ARN.
    pub async fn encrypt(&self, request: EncryptRequest) -> Result<EncryptResponse, tonic::Status> {
        if request.plaintext.is_empty() {
            return Err(tonic::Status::invalid_argument("plaintext is empty"));
        }
        let result = self
            .inner
            .backend
            .encrypt(&self.inner.config.key_id, request.plaintext)
            .await;
        match result {
            Ok(encrypted) => {
                let mut cache = self.cache();
                if cache.key_arn.as_deref() != Some(encrypted.key_arn.as_str()) {
                    // The alias now names another key: Status must say so before the cache
                    // expires, or the API server keeps seeing the old key id.
                    cache.healthy_until = None;
                }
                drop(cache);
                tracing::debug!(key_id = %encrypted.key_arn, "encrypted");
                Ok(EncryptResponse {
                    ciphertext: encrypted.ciphertext,
                    key_id: encrypted.key_arn,
                    annotations: Default::default(),
                })
            }
            Err(err) => Err(self.failed(err)),
        }
    }

    /// `Decrypt`: the plaintext, with the key id the API server stored passed on to KMS even
    /// when it is not the plugin's key now (KMS knows whether it still decrypts).
    pub async fn decrypt(&self, request: DecryptRequest) -> Result<DecryptResponse, tonic::Status> {
        if request.ciphertext.is_empty() {
            return Err(tonic::Status::invalid_argument("ciphertext is empty"));
        }
        let key_id = Some(request.key_id.as_str()).filter(|key_id| !key_id.is_empty());
        match self.inner.backend.decrypt(request.ciphertext, key_id).await {
            Ok(plaintext) => {
                tracing::debug!("decrypted");
                Ok(DecryptResponse { plaintext })
            }
            Err(err) => Err(self.failed(err)),
        }
    }

    /// `Status`: always an answer. `healthz` is `ok` when KMS describes the key as Enabled,
    /// else why not on one line, so the API server's health check shows the reason.
    pub async fn status(&self) -> StatusResponse {
        let _describing = self.inner.describing.lock().await;
        let cached = {
            let cache = self.cache();
            let fresh = cache
                .healthy_until
                .is_some_and(|until| Instant::now() < until);
            cache.key_arn.clone().filter(|_| fresh)
        };
        if let Some(key_arn) = cached {
            return status_response(kms::HEALTHY.to_string(), key_arn);
        }
        let described = self
            .inner
            .backend
            .describe_key(&self.inner.config.key_id)
            .await;
        let mut cache = self.cache();
        let healthz = match described {
            Ok(key) => {
                let healthz = if key.is_enabled() {
                    cache.healthy_until = Some(Instant::now() + self.inner.config.status_ttl);
                    kms::HEALTHY.to_string()
                } else {
                    cache.healthy_until = None;
                    format!("KMS key {} is {}", key.arn, key.state)
                };
                cache.key_arn = Some(key.arn);
                healthz
            }
            Err(err) => {
                cache.healthy_until = None;
                err.to_string()
            }
        };
        let key_id = cache
            .key_arn
            .clone()
            .unwrap_or_else(|| self.inner.config.key_id.clone());
        status_response(healthz, key_id)
    }

    /// Logs a failed call and turns it into its status; a failure that is not about the
    /// input also drops the cached healthy Status, so the next Status asks KMS.
    fn failed(&self, err: KmsError) -> tonic::Status {
        let status = tonic::Status::from(err);
        tracing::warn!(code = ?status.code(), "{}", status.message());
        if status.code() != tonic::Code::InvalidArgument {
            self.cache().healthy_until = None;
        }
        status
    }
}

fn status_response(healthz: String, key_id: String) -> StatusResponse {
    StatusResponse {
        version: kms::API_VERSION.to_string(),
        healthz,
        key_id,
    }
}

/// tonic's handler for one unary method, with prost's codec (as generated servers use).
fn grpc<Req, Resp>() -> tonic::server::Grpc<tonic_prost::ProstCodec<Resp, Req>>
where
    Req: Message + Default + Send + 'static,
    Resp: Message + Send + 'static,
{
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
}

impl<B, Body> tower::Service<http::Request<Body>> for KeyManagementService<B>
where
    B: KmsBackend,
    Body: tonic::codegen::Body + Send + 'static,
    Body::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let service = self.clone();
        Box::pin(async move {
            let response = match request.uri().path() {
                kms::ENCRYPT_PATH => {
                    let method = tower::service_fn(move |call: tonic::Request<EncryptRequest>| {
                        let service = service.clone();
                        let request = call.into_inner();
                        let span =
                            tracing::info_span!("kms", method = "Encrypt", uid = %request.uid);
                        async move { service.encrypt(request).await.map(tonic::Response::new) }
                            .instrument(span)
                    });
                    grpc().unary(method, request).await
                }
                kms::DECRYPT_PATH => {
                    let method = tower::service_fn(move |call: tonic::Request<DecryptRequest>| {
                        let service = service.clone();
                        let request = call.into_inner();
                        let span = tracing::info_span!(
                            "kms",
                            method = "Decrypt",
                            uid = %request.uid,
                            key_id = %request.key_id
                        );
                        async move { service.decrypt(request).await.map(tonic::Response::new) }
                            .instrument(span)
                    });
                    grpc().unary(method, request).await
                }
                kms::STATUS_PATH => {
                    let method = tower::service_fn(move |_: tonic::Request<StatusRequest>| {
                        let service = service.clone();
                        let span = tracing::debug_span!("kms", method = "Status");
                        async move { Ok(tonic::Response::new(service.status().await)) }
                            .instrument(span)
                    });
                    grpc().unary(method, request).await
                }
                other => tonic::Status::unimplemented(format!(
                    "unknown method {other}: {} has Status, Decrypt and Encrypt",
                    kms::SERVICE
                ))
                .into_http(),
            };
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{FakeKms, KEY_ARN, KEY_ID};

    #[tokio::test]
    async fn status_before_kms_ever_answered_names_the_configured_key() {
        let kms = FakeKms::default();
        kms.fail(
            "DescribeKey",
            KmsError::Unreachable {
                operation: "DescribeKey",
                reason: "dispatch failure: connection refused".to_string(),
            },
        );
        let service = KeyManagementService::new(kms.clone(), ServiceConfig::new(KEY_ID));
        let status = service.status().await;
        assert_eq!(status.version, kms::API_VERSION);
        assert_eq!(
            status.healthz,
            "KMS DescribeKey got no answer: dispatch failure: connection refused"
        );
        assert_eq!(status.key_id, KEY_ID);

        kms.heal();
        let status = service.status().await;
        assert_eq!(status.healthz, kms::HEALTHY);
        assert_eq!(status.key_id, KEY_ARN);
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_status_is_reused_until_its_ttl_passes() {
        let kms = FakeKms::default();
        let service = KeyManagementService::new(kms.clone(), ServiceConfig::new(KEY_ID));
        service.status().await;
        tokio::time::advance(DEFAULT_STATUS_TTL - Duration::from_secs(1)).await;
        service.status().await;
        assert_eq!(kms.state().describe_calls, 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        service.status().await;
        assert_eq!(kms.state().describe_calls, 2);
    }
}
