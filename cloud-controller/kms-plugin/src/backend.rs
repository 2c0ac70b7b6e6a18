//! What the plugin needs of a key management service ([`KmsBackend`]: encrypt, decrypt,
//! describe the key), the one error a backend answers ([`KmsError`]), and the one place a KMS
//! failure becomes a gRPC status code ([`KmsError::grpc_code`]).

use std::future::Future;

/// AWS KMS's name for the state of a key that can encrypt and decrypt.
pub const KEY_STATE_ENABLED: &str = "Enabled";

/// What KMS answered an `Encrypt` with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encrypted {
    /// The ciphertext blob, opaque to everyone but KMS.
    pub ciphertext: Vec<u8>,
    /// The ARN of the key that encrypted (an alias resolved to the key it names now).
    pub key_arn: String,
}

/// The plugin's key, as `DescribeKey` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDescription {
    /// The key's ARN.
    pub arn: String,
    /// The key's state in KMS's words (`Enabled`, `Disabled`, `PendingDeletion`, …).
    pub state: String,
}

impl KeyDescription {
    /// Whether the key can encrypt and decrypt now.
    pub fn is_enabled(&self) -> bool {
        self.state == KEY_STATE_ENABLED
    }
}

/// A key management service: AWS KMS in the binary, a fake in tests.
///
/// The futures are `Send` because tonic runs each request on whichever worker thread is free.
pub trait KmsBackend: Send + Sync + 'static {
    /// `Encrypt(KeyId = key_id, Plaintext = plaintext)`.
    fn encrypt(
        &self,
        key_id: &str,
        plaintext: Vec<u8>,
    ) -> impl Future<Output = Result<Encrypted, KmsError>> + Send;

    /// `Decrypt(CiphertextBlob = ciphertext, KeyId = key_id)`: the plaintext.
    fn decrypt(
        &self,
        ciphertext: Vec<u8>,
        key_id: Option<&str>,
    ) -> impl Future<Output = Result<Vec<u8>, KmsError>> + Send;

    /// `DescribeKey(KeyId = key_id)`.
    fn describe_key(
        &self,
        key_id: &str,
    ) -> impl Future<Output = Result<KeyDescription, KmsError>> + Send;
}

/// Why a KMS call failed. `operation` is KMS's name for the call (`Encrypt`, `Decrypt`,
/// `DescribeKey`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KmsError {
    /// KMS answered with an error: its code (`NotFoundException`, …) and message.
    #[error("KMS {operation}: {code}{}", colon_then(message))]
    Service {
        /// The call.
        operation: &'static str,
        /// AWS's error code.
        code: String,
        /// AWS's message, on one line.
        message: String,
        /// Whether the answer was an HTTP 5xx (a fault on KMS's side, worth retrying).
        server_fault: bool,
    },
    /// The call got no answer: KMS could not be reached or timed out (after the SDK's
    /// retries), or no credentials could be found to sign it.
    #[error("KMS {operation} got no answer: {reason}")]
    Unreachable {
        /// The call.
        operation: &'static str,
        /// Why, with its causes.
        reason: String,
    },
    /// KMS answered without something the call promises.
    #[error("KMS {operation} answered without {missing}")]
    Incomplete {
        /// The call.
        operation: &'static str,
        /// The missing field.
        missing: &'static str,
    },
    /// The SDK could not build the call (for example, a malformed endpoint URL).
    #[error("KMS {operation} could not be sent: {reason}")]
    Request {
        /// The call.
        operation: &'static str,
        /// Why, with its causes.
        reason: String,
    },
}

/// `: message`, or nothing when AWS sent no message.
fn colon_then(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// `text` on one line: the API server shows a plugin's error and health inline.
pub fn one_line(text: &str) -> String {
    text.split(['\r', '\n'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

impl KmsError {
    /// An error KMS answered, its message folded onto one line.
    pub fn service(
        operation: &'static str,
        code: impl Into<String>,
        message: &str,
        server_fault: bool,
    ) -> Self {
        KmsError::Service {
            operation,
            code: code.into(),
            message: one_line(message),
            server_fault,
        }
    }

    /// The gRPC code the API server gets. Unavailable says "try again" (its callers retry),
    /// InvalidArgument "this input will never work", FailedPrecondition "the key must be
    /// fixed first".
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            KmsError::Service {
                code, server_fault, ..
            } => grpc_code_of(code).unwrap_or(if *server_fault {
                tonic::Code::Unavailable
            } else {
                tonic::Code::Internal
            }),
            KmsError::Unreachable { .. } => tonic::Code::Unavailable,
            KmsError::Incomplete { .. } | KmsError::Request { .. } => tonic::Code::Internal,
        }
    }
}

impl From<KmsError> for tonic::Status {
    fn from(err: KmsError) -> Self {
        tonic::Status::new(err.grpc_code(), err.to_string())
    }
}

/// The gRPC code of an AWS error code that KMS's operations answer (or the AWS query
/// protocol's common ones), if it is one we know.
fn grpc_code_of(aws_code: &str) -> Option<tonic::Code> {
    use tonic::Code;
    let code = match aws_code {
        // Passing: request rates, KMS's own faults, an external key store that is slow or
        // briefly unreachable.
        "ThrottlingException"
        | "Throttling"
        | "TooManyRequestsException"
        | "RequestLimitExceeded"
        | "LimitExceededException"
        | "KMSInternalException"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "ServiceUnavailableException"
        | "DependencyTimeoutException"
        | "KeyUnavailableException"
        | "RequestTimeout"
        | "RequestTimeoutException" => Code::Unavailable,
        // The input: a ciphertext that is not KMS's, or not of this key; a malformed field.
        "InvalidCiphertextException"
        | "IncorrectKeyException"
        | "InvalidKeyUsageException"
        | "InvalidGrantTokenException"
        | "InvalidArnException"
        | "ValidationException"
        | "ValidationError"
        | "SerializationException"
        | "InvalidParameterValue"
        | "InvalidParameterCombination"
        | "MissingParameter" => Code::InvalidArgument,
        // The key: gone, disabled, pending deletion or import.
        "NotFoundException" | "DisabledException" | "KMSInvalidStateException" => {
            Code::FailedPrecondition
        }
        // The plugin's identity: allowed no use of the key, or not accepted at all.
        "AccessDeniedException" => Code::PermissionDenied,
        "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "InvalidSignatureException"
        | "IncompleteSignature"
        | "MissingAuthenticationToken"
        | "ExpiredTokenException" => Code::Unauthenticated,
        _ => return None,
    };
    Some(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn answered(code: &str, server_fault: bool) -> KmsError {
        KmsError::service("Decrypt", code, "what AWS said", server_fault)
    }

    #[test]
    fn aws_codes_map_to_grpc_codes() {
        let cases = [
            ("ThrottlingException", Code::Unavailable),
            ("KMSInternalException", Code::Unavailable),
            ("DependencyTimeoutException", Code::Unavailable),
            ("KeyUnavailableException", Code::Unavailable),
            ("InvalidCiphertextException", Code::InvalidArgument),
            ("IncorrectKeyException", Code::InvalidArgument),
            ("ValidationException", Code::InvalidArgument),
            ("InvalidKeyUsageException", Code::InvalidArgument),
            ("NotFoundException", Code::FailedPrecondition),
            ("DisabledException", Code::FailedPrecondition),
            ("KMSInvalidStateException", Code::FailedPrecondition),
            ("AccessDeniedException", Code::PermissionDenied),
            ("UnrecognizedClientException", Code::Unauthenticated),
        ];
        for (aws, grpc) in cases {
            assert_eq!(answered(aws, false).grpc_code(), grpc, "{aws}");
        }
    }

    #[test]
    fn unknown_codes_map_by_who_is_at_fault() {
        assert_eq!(
            answered("NewException", true).grpc_code(),
            Code::Unavailable
        );
        assert_eq!(answered("NewException", false).grpc_code(), Code::Internal);
        let unreachable = KmsError::Unreachable {
            operation: "Encrypt",
            reason: "timed out".into(),
        };
        assert_eq!(unreachable.grpc_code(), Code::Unavailable);
    }

    #[test]
    fn the_status_keeps_aws_code_and_message_on_one_line() {
        let err = KmsError::service(
            "Decrypt",
            "InvalidCiphertextException",
            "first line\r\n  second line\n",
            false,
        );
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "KMS Decrypt: InvalidCiphertextException: first line second line"
        );
        let bare = KmsError::service("Encrypt", "NotFoundException", "", false);
        assert_eq!(bare.to_string(), "KMS Encrypt: NotFoundException");
    }
}
