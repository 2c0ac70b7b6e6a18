//! The plugin as the API server sees it: a real tonic client over a real unix socket in a
//! temporary directory, served by [`serve`] over a fake KMS backend (no AWS involved).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_api_machinery::kms::{
    self, DecryptRequest, DecryptResponse, EncryptRequest, EncryptResponse, StatusRequest,
    StatusResponse,
};
use hyper_util::rt::TokioIo;
use tonic::Code;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_prost::prost;

use super::*;
use crate::backend::{Encrypted, KeyDescription, KmsError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) const KEY_ID: &str = "alias/flotilla-secrets";
pub(crate) const KEY_ARN: &str =
    "arn:aws:kms:eu-west-1:000000000000:key/11111111-2222-3333-4444-555555555555";
const SEALED: &[u8] = b"sealed:";

/// KMS in memory: "encrypts" by prefixing, answers `fail[operation]` when set, and records
/// what it was asked.
#[derive(Clone, Default)]
pub(crate) struct FakeKms(Arc<Mutex<FakeState>>);

pub(crate) struct FakeState {
    pub(crate) key_arn: String,
    pub(crate) key_state: String,
    pub(crate) fail: HashMap<&'static str, KmsError>,
    pub(crate) describe_calls: usize,
    pub(crate) encrypt_key_ids: Vec<String>,
    pub(crate) decrypt_key_ids: Vec<Option<String>>,
}

impl Default for FakeState {
    fn default() -> Self {
        FakeState {
            key_arn: KEY_ARN.to_string(),
            key_state: "Enabled".to_string(),
            fail: HashMap::new(),
            describe_calls: 0,
            encrypt_key_ids: Vec::new(),
            decrypt_key_ids: Vec::new(),
        }
    }
}

impl FakeKms {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn fail(&self, operation: &'static str, err: KmsError) {
        self.state().fail.insert(operation, err);
    }

    pub(crate) fn heal(&self) {
        self.state().fail.clear();
    }
}

impl KmsBackend for FakeKms {
    async fn encrypt(&self, key_id: &str, plaintext: Vec<u8>) -> Result<Encrypted, KmsError> {
        let mut state = self.state();
        state.encrypt_key_ids.push(key_id.to_string());
        if let Some(err) = state.fail.get("Encrypt") {
            return Err(err.clone());
        }
        Ok(Encrypted {
            ciphertext: [SEALED, &plaintext].concat(),
            key_arn: state.key_arn.clone(),
        })
    }

    async fn decrypt(
        &self,
        ciphertext: Vec<u8>,
        key_id: Option<&str>,
    ) -> Result<Vec<u8>, KmsError> {
        let mut state = self.state();
        state.decrypt_key_ids.push(key_id.map(str::to_string));
        if let Some(err) = state.fail.get("Decrypt") {
            return Err(err.clone());
        }
        match ciphertext.strip_prefix(SEALED) {
            Some(plaintext) => Ok(plaintext.to_vec()),
            None => Err(KmsError::service(
                "Decrypt",
                "InvalidCiphertextException",
                "",
                false,
            )),
        }
    }

    async fn describe_key(&self, _key_id: &str) -> Result<KeyDescription, KmsError> {
        let mut state = self.state();
        state.describe_calls += 1;
        if let Some(err) = state.fail.get("DescribeKey") {
            return Err(err.clone());
        }
        Ok(KeyDescription {
            arn: state.key_arn.clone(),
            state: state.key_state.clone(),
        })
    }
}

/// A plugin serving on a socket in its own temporary directory, and a client connected to it.
struct Plugin {
    kms: FakeKms,
    client: tonic::client::Grpc<Channel>,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), Error>>,
    _dir: tempfile::TempDir,
}

impl Plugin {
    async fn start() -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(DEFAULT_STATUS_TTL_FOR_TESTS).await
    }

    async fn start_with(status_ttl: Duration) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let socket: SocketPath = format!("unix://{}/kms.sock", dir.path().display()).parse()?;
        let kms = FakeKms::default();
        let service = KeyManagementService::new(
            kms.clone(),
            ServiceConfig {
                key_id: KEY_ID.to_string(),
                status_ttl,
            },
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn({
            let socket = socket.clone();
            async move {
                serve(&socket, service, async move {
                    let _ = stopped.await;
                })
                .await
            }
        });
        let path = socket.path().to_path_buf();
        // Serving has begun once the startup probe asked for the key; every later Status
        // waits for the probe's answer, so the tests' counts of DescribeKey are exact.
        for _ in 0..500 {
            if path.exists() && kms.state().describe_calls > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The URI is only a placeholder: the connector dials the socket.
        let dial = path.clone();
        let channel = Endpoint::from_static("http://[::1]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let dial = dial.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(dial).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await?;
        Ok(Plugin {
            kms,
            client: tonic::client::Grpc::new(channel),
            socket: path,
            stop: Some(stop),
            served,
            _dir: dir,
        })
    }

    async fn call<Req, Resp>(
        &mut self,
        path: &'static str,
        request: Req,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.client
            .ready()
            .await
            .map_err(|err| tonic::Status::unknown(format!("channel not ready: {err}")))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        let path = http::uri::PathAndQuery::from_static(path);
        self.client
            .unary(tonic::Request::new(request), path, codec)
            .await
            .map(tonic::Response::into_inner)
    }

    async fn encrypt(&mut self, plaintext: &[u8]) -> Result<EncryptResponse, tonic::Status> {
        let request = EncryptRequest {
            plaintext: plaintext.to_vec(),
            uid: "uid-1".to_string(),
        };
        self.call(kms::ENCRYPT_PATH, request).await
    }

    async fn decrypt(
        &mut self,
        ciphertext: &[u8],
        key_id: &str,
    ) -> Result<DecryptResponse, tonic::Status> {
        let request = DecryptRequest {
            ciphertext: ciphertext.to_vec(),
            uid: "uid-2".to_string(),
            key_id: key_id.to_string(),
            annotations: HashMap::new(),
        };
        self.call(kms::DECRYPT_PATH, request).await
    }

    async fn status(&mut self) -> Result<StatusResponse, tonic::Status> {
        self.call(kms::STATUS_PATH, StatusRequest {}).await
    }

    /// Stops the plugin as a signal would, with the client still connected (as the API
    /// server stays), and checks it stopped before the grace period ran out and removed its
    /// socket.
    async fn stop(mut self) -> TestResult {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(10), self.served).await???;
        assert!(
            started.elapsed() < SHUTDOWN_GRACE,
            "an idle connection held the plugin up"
        );
        assert!(!self.socket.exists(), "the socket outlived the plugin");
        drop(self.client);
        Ok(())
    }
}

/// Long enough that no test sees the cache expire on its own.
const DEFAULT_STATUS_TTL_FOR_TESTS: Duration = Duration::from_secs(600);

#[tokio::test]
async fn encrypt_answers_the_key_arn_and_decrypt_round_trips() -> TestResult {
    let mut plugin = Plugin::start().await?;
    let encrypted = plugin.encrypt(b"seed").await?;
    assert_eq!(encrypted.ciphertext, b"sealed:seed");
    assert_eq!(encrypted.key_id, KEY_ARN);
    assert!(encrypted.annotations.is_empty());
    assert_eq!(plugin.kms.state().encrypt_key_ids, [KEY_ID]);

    let decrypted = plugin
        .decrypt(&encrypted.ciphertext, &encrypted.key_id)
        .await?;
    assert_eq!(decrypted.plaintext, b"seed");
    assert_eq!(
        plugin.kms.state().decrypt_key_ids,
        [Some(KEY_ARN.to_string())]
    );
    plugin.stop().await
}

#[tokio::test]
async fn decrypt_passes_any_key_id_to_kms() -> TestResult {
    let mut plugin = Plugin::start().await?;
    let old_key = "arn:aws:kms:eu-west-1:000000000000:key/old";
    plugin.decrypt(b"sealed:x", old_key).await?;
    plugin.decrypt(b"sealed:y", "").await?;
    assert_eq!(
        plugin.kms.state().decrypt_key_ids,
        [Some(old_key.to_string()), None]
    );
    plugin.stop().await
}

#[tokio::test]
async fn empty_input_is_an_invalid_argument_and_never_reaches_kms() -> TestResult {
    let mut plugin = Plugin::start().await?;
    let empty_plaintext = plugin.encrypt(b"").await.err().map(|s| s.code());
    assert_eq!(empty_plaintext, Some(Code::InvalidArgument));
    let empty_ciphertext = plugin.decrypt(b"", KEY_ARN).await.err().map(|s| s.code());
    assert_eq!(empty_ciphertext, Some(Code::InvalidArgument));
    assert!(plugin.kms.state().encrypt_key_ids.is_empty());
    assert!(plugin.kms.state().decrypt_key_ids.is_empty());
    plugin.stop().await
}

#[tokio::test]
async fn kms_errors_become_grpc_codes_with_awss_code_and_message() -> TestResult {
    let mut plugin = Plugin::start().await?;
    let cases = [
        ("ThrottlingException", "Rate exceeded", Code::Unavailable),
        (
            "NotFoundException",
            "Key 'alias/x' does not exist",
            Code::FailedPrecondition,
        ),
        (
            "DisabledException",
            "key is disabled",
            Code::FailedPrecondition,
        ),
        ("IncorrectKeyException", "wrong key", Code::InvalidArgument),
        (
            "AccessDeniedException",
            "not authorized",
            Code::PermissionDenied,
        ),
    ];
    for (aws_code, message, grpc_code) in cases {
        plugin.fail("Encrypt", aws_code, message);
        let status = plugin.encrypt(b"seed").await.err();
        assert_eq!(
            status.as_ref().map(|s| s.code()),
            Some(grpc_code),
            "{aws_code}"
        );
        assert_eq!(
            status.as_ref().map(|s| s.message().to_string()),
            Some(format!("KMS Encrypt: {aws_code}: {message}"))
        );
    }
    plugin.kms.heal();
    let not_ours = plugin.decrypt(b"garbage", KEY_ARN).await.err();
    assert_eq!(
        not_ours.as_ref().map(|s| s.code()),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        not_ours.as_ref().map(|s| s.message()),
        Some("KMS Decrypt: InvalidCiphertextException")
    );

    plugin.kms.fail(
        "Decrypt",
        KmsError::Unreachable {
            operation: "Decrypt",
            reason: "dispatch failure: timed out".to_string(),
        },
    );
    let unreachable = plugin.decrypt(b"sealed:x", KEY_ARN).await.err();
    assert_eq!(unreachable.map(|s| s.code()), Some(Code::Unavailable));
    plugin.stop().await
}

impl Plugin {
    fn fail(&self, operation: &'static str, aws_code: &str, message: &str) {
        self.kms.fail(
            operation,
            KmsError::service(operation, aws_code, message, false),
        );
    }
}

#[tokio::test]
async fn status_is_healthy_with_the_key_arn_and_cached() -> TestResult {
    let mut plugin = Plugin::start().await?;
    for _ in 0..3 {
        let status = plugin.status().await?;
        assert_eq!(status.version, kms::API_VERSION);
        assert_eq!(status.healthz, kms::HEALTHY);
        assert_eq!(status.key_id, KEY_ARN);
    }
    // The startup probe's DescribeKey answers all three.
    assert_eq!(plugin.kms.state().describe_calls, 1);
    plugin.stop().await
}

#[tokio::test]
async fn status_asks_kms_each_time_without_a_cache() -> TestResult {
    let mut plugin = Plugin::start_with(Duration::ZERO).await?;
    plugin.status().await?;
    plugin.status().await?;
    assert!(plugin.kms.state().describe_calls >= 2);
    plugin.stop().await
}

#[tokio::test]
async fn status_says_why_the_key_is_unusable_as_a_successful_answer() -> TestResult {
    let mut plugin = Plugin::start().await?;
    plugin.kms.state().key_state = "PendingDeletion".to_string();
    // A failed Encrypt makes the next Status ask KMS rather than reuse the startup probe's.
    plugin.fail(
        "Encrypt",
        "KMSInvalidStateException",
        "key is pending deletion",
    );
    plugin.encrypt(b"seed").await.err();
    let status = plugin.status().await?;
    assert_eq!(status.version, kms::API_VERSION);
    assert_eq!(
        status.healthz,
        format!("KMS key {KEY_ARN} is PendingDeletion")
    );
    assert_eq!(status.key_id, KEY_ARN);

    // An unhealthy answer is not cached: the key coming back is seen at once.
    plugin.kms.state().key_state = "Enabled".to_string();
    assert_eq!(plugin.status().await?.healthz, kms::HEALTHY);
    plugin.stop().await
}

#[tokio::test]
async fn status_without_kms_keeps_the_last_known_key_id() -> TestResult {
    let mut plugin = Plugin::start_with(Duration::ZERO).await?;
    plugin.fail(
        "DescribeKey",
        "AccessDeniedException",
        "User is not authorized",
    );
    let status = plugin.status().await?;
    assert_eq!(
        status.healthz,
        "KMS DescribeKey: AccessDeniedException: User is not authorized"
    );
    // The startup probe saw the ARN.
    assert_eq!(status.key_id, KEY_ARN);
    plugin.fail("DescribeKey", "ThrottlingException", "Rate exceeded");
    let status = plugin.status().await?;
    assert_eq!(
        status.healthz,
        "KMS DescribeKey: ThrottlingException: Rate exceeded"
    );
    assert_eq!(status.key_id, KEY_ARN);
    plugin.stop().await
}

#[tokio::test]
async fn a_failed_encrypt_drops_the_cached_health() -> TestResult {
    let mut plugin = Plugin::start().await?;
    assert_eq!(plugin.status().await?.healthz, kms::HEALTHY);
    let before = plugin.kms.state().describe_calls;

    // Bad input says nothing about the key: the cache stands.
    plugin.decrypt(b"garbage", KEY_ARN).await.err();
    plugin.status().await?;
    assert_eq!(plugin.kms.state().describe_calls, before);

    plugin.fail("Encrypt", "DisabledException", "key is disabled");
    plugin.kms.state().key_state = "Disabled".to_string();
    plugin.encrypt(b"seed").await.err();
    let status = plugin.status().await?;
    assert_eq!(status.healthz, format!("KMS key {KEY_ARN} is Disabled"));
    assert_eq!(plugin.kms.state().describe_calls, before + 1);
    plugin.stop().await
}

#[tokio::test]
async fn an_encrypt_by_a_new_key_drops_the_cached_status() -> TestResult {
    let mut plugin = Plugin::start().await?;
    assert_eq!(plugin.status().await?.key_id, KEY_ARN);
    // The alias now names another key.
    let rotated = "arn:aws:kms:eu-west-1:000000000000:key/rotated";
    plugin.kms.state().key_arn = rotated.to_string();
    assert_eq!(plugin.encrypt(b"seed").await?.key_id, rotated);
    assert_eq!(plugin.status().await?.key_id, rotated);
    plugin.stop().await
}

#[tokio::test]
async fn unknown_methods_are_unimplemented() -> TestResult {
    let mut plugin = Plugin::start().await?;
    let other_method = plugin
        .call::<StatusRequest, StatusResponse>("/v2.KeyManagementService/Rotate", StatusRequest {})
        .await
        .err();
    assert_eq!(other_method.map(|s| s.code()), Some(Code::Unimplemented));
    let other_service = plugin
        .call::<StatusRequest, StatusResponse>(
            "/v1beta1.KeyManagementService/Version",
            StatusRequest {},
        )
        .await
        .err();
    assert_eq!(other_service.map(|s| s.code()), Some(Code::Unimplemented));
    // The connection still serves.
    assert_eq!(plugin.status().await?.healthz, kms::HEALTHY);
    plugin.stop().await
}

#[test]
fn the_command_line_parses_and_bad_flags_are_usage_errors() -> TestResult {
    let cli = Cli::try_parse_from([
        "flotilla-kms-plugin",
        "--listen",
        "unix:///run/flotilla/kms.sock",
        "--key-id",
        "alias/flotilla-secrets",
        "--endpoint-url",
        "http://127.0.0.1:4566",
        "--region",
        "us-east-1",
        "--log-format",
        "json",
    ]);
    let config = cli.map(Config::from).ok();
    assert_eq!(
        config,
        Some(Config {
            socket: "/run/flotilla/kms.sock".parse()?,
            service: ServiceConfig::new("alias/flotilla-secrets"),
            aws: AwsSettings {
                region: Some("us-east-1".to_string()),
                endpoint_url: Some("http://127.0.0.1:4566".to_string()),
            },
        })
    );

    let usage_error = |args: &[&str]| {
        Cli::try_parse_from([&["flotilla-kms-plugin"], args].concat())
            .err()
            .map(|err| err.exit_code())
    };
    assert_eq!(usage_error(&["--key-id", "k"]), Some(2));
    assert_eq!(usage_error(&["--listen", "/run/kms.sock"]), Some(2));
    assert_eq!(
        usage_error(&["--listen", "kms.sock", "--key-id", "k"]),
        Some(2)
    );
    assert_eq!(
        usage_error(&["--listen", "/run/kms.sock", "--key-id", ""]),
        Some(2)
    );
    assert_eq!(
        usage_error(&["--listen", "/run/kms.sock", "--key-id", "k", "--bogus"]),
        Some(2)
    );
    Ok(())
}
