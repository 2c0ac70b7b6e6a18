//! The EC2 instance metadata service, version 2 (what a node reads at first boot): a session
//! token from `PUT /latest/api/token`, then `GET`s carrying it. Early in boot the service may not
//! answer yet, so connection failures and 5xx are retried with back-off; a 401 means the token
//! expired, so a new one is fetched once; a 404 is an absent item (`None`), as the SDKs have it.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Mutex;

/// Where the service answers on EC2 (and where a node image's emulator answers in tests).
pub const DEFAULT_ENDPOINT: &str = "http://169.254.169.254";
/// The environment variable the AWS SDKs read for another endpoint.
pub const ENDPOINT_VARIABLE: &str = "AWS_EC2_METADATA_SERVICE_ENDPOINT";
/// The session token's lifetime asked for (the SDKs' default, six hours).
const TOKEN_TTL_SECONDS: u32 = 21_600;
/// Attempts per request before giving up (connection refused, timeouts, 5xx).
const ATTEMPTS: u32 = 8;
/// The first back-off; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// One request's deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    /// The service did not answer after every attempt.
    #[error(
        "the instance metadata service at {endpoint} did not answer after {ATTEMPTS} attempts: {last}"
    )]
    Unreachable {
        /// The endpoint tried.
        endpoint: String,
        /// The last failure.
        last: String,
    },
    /// The service refused the request for a reason retrying will not fix.
    #[error("the instance metadata service answered {status} to {method} {path}")]
    Refused {
        /// The method.
        method: Method,
        /// The path.
        path: String,
        /// Its answer.
        status: StatusCode,
    },
    /// The endpoint is not a URL.
    #[error("invalid instance metadata endpoint {0:?}")]
    BadEndpoint(String),
}

/// An IMDSv2 client holding its session token.
pub struct Imds {
    endpoint: String,
    http: Client<HttpConnector, Full<Bytes>>,
    token: Mutex<Option<String>>,
}

impl std::fmt::Debug for Imds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imds")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// One answer: its status and body.
type Answer = (StatusCode, Bytes);

impl Imds {
    /// A client of `endpoint` (`http://host[:port]`).
    pub fn new(endpoint: &str) -> Result<Self, ImdsError> {
        let endpoint = endpoint.trim_end_matches('/').to_string();
        if endpoint.parse::<http::Uri>().is_err() || !endpoint.starts_with("http://") {
            return Err(ImdsError::BadEndpoint(endpoint));
        }
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(REQUEST_TIMEOUT));
        Ok(Imds {
            endpoint,
            http: Client::builder(TokioExecutor::new()).build(connector),
            token: Mutex::new(None),
        })
    }

    /// The client of the endpoint the environment names, else EC2's.
    pub fn from_environment() -> Result<Self, ImdsError> {
        let endpoint =
            std::env::var(ENDPOINT_VARIABLE).unwrap_or_else(|_| DEFAULT_ENDPOINT.to_string());
        Self::new(&endpoint)
    }

    /// `GET /latest/{path}` as text; `None` when the item does not exist (404).
    pub async fn get(&self, path: &str) -> Result<Option<String>, ImdsError> {
        let path = format!("/latest/{}", path.trim_start_matches('/'));
        for fresh_token in [false, true] {
            let token = self.token(fresh_token).await?;
            let (status, body) = self
                .send(Method::GET, &path, &[("x-aws-ec2-metadata-token", &token)])
                .await?;
            match status {
                StatusCode::OK => return Ok(Some(String::from_utf8_lossy(&body).into_owned())),
                StatusCode::NOT_FOUND => return Ok(None),
                // The token expired (or the service restarted): one more try with a new one.
                StatusCode::UNAUTHORIZED if !fresh_token => continue,
                status => {
                    return Err(ImdsError::Refused {
                        method: Method::GET,
                        path,
                        status,
                    });
                }
            }
        }
        Err(ImdsError::Refused {
            method: Method::GET,
            path,
            status: StatusCode::UNAUTHORIZED,
        })
    }

    /// The session token, fetched when there is none or `renew` is set.
    async fn token(&self, renew: bool) -> Result<String, ImdsError> {
        let mut held = self.token.lock().await;
        if let (Some(token), false) = (held.as_ref(), renew) {
            return Ok(token.clone());
        }
        let ttl = TOKEN_TTL_SECONDS.to_string();
        let path = "/latest/api/token";
        let (status, body) = self
            .send(
                Method::PUT,
                path,
                &[("x-aws-ec2-metadata-token-ttl-seconds", &ttl)],
            )
            .await?;
        if status != StatusCode::OK {
            return Err(ImdsError::Refused {
                method: Method::PUT,
                path: path.into(),
                status,
            });
        }
        let token = String::from_utf8_lossy(&body).trim().to_string();
        *held = Some(token.clone());
        Ok(token)
    }

    /// Sends one request, retrying what a booting service does (no answer, 5xx).
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, ImdsError> {
        let mut backoff = FIRST_BACKOFF;
        let mut last = String::new();
        for attempt in 1..=ATTEMPTS {
            match self.send_once(method.clone(), path, headers).await {
                Ok((status, _)) if status.is_server_error() => {
                    last = format!("{method} {path} answered {status}");
                }
                Ok(answer) => return Ok(answer),
                Err(err) => last = err,
            }
            if attempt < ATTEMPTS {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
        Err(ImdsError::Unreachable {
            endpoint: self.endpoint.clone(),
            last,
        })
    }

    async fn send_once(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.endpoint));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|err| err.to_string())?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|err| flotilla_api_machinery::errors::error_chain(&err))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|err| err.to_string())?
                .to_bytes();
            Ok((status, body))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))?
    }
}

/// A fake metadata service for unit tests: answers IMDSv2 from a map of paths, with the token
/// check, and can fail the first requests or expire tokens.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// What the fake serves and how it misbehaves.
    #[derive(Default)]
    pub struct Behaviour {
        /// `GET /latest/{path}` → body.
        pub items: HashMap<String, String>,
        /// Answer this many requests 503 first.
        pub fail_first: usize,
        /// Tokens issued so far; a GET with an older one than the last is 401 when set.
        pub expire_old_tokens: bool,
    }

    /// A running fake; its endpoint is `http://127.0.0.1:PORT`.
    pub struct FakeImds {
        /// The endpoint.
        pub endpoint: String,
        /// Requests seen, as `METHOD PATH`.
        pub seen: Arc<Mutex<Vec<String>>>,
        /// Tokens issued.
        pub tokens: Arc<AtomicUsize>,
    }

    impl FakeImds {
        /// Starts serving `behaviour`.
        pub async fn start(behaviour: Behaviour) -> FakeImds {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let endpoint = format!("http://{}", listener.local_addr().expect("address"));
            let seen = Arc::new(Mutex::new(Vec::new()));
            let tokens = Arc::new(AtomicUsize::new(0));
            let behaviour = Arc::new(Mutex::new(behaviour));
            let (seen_in, tokens_in) = (seen.clone(), tokens.clone());
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let (seen, tokens, behaviour) =
                        (seen_in.clone(), tokens_in.clone(), behaviour.clone());
                    tokio::spawn(async move {
                        let mut request = Vec::new();
                        let mut buffer = [0u8; 4096];
                        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => request.extend_from_slice(&buffer[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&request).to_string();
                        let mut words = head.split_whitespace();
                        let method = words.next().unwrap_or_default().to_string();
                        let path = words.next().unwrap_or_default().to_string();
                        let header = |name: &str| {
                            head.lines().find_map(|line| {
                                let (key, value) = line.split_once(':')?;
                                key.eq_ignore_ascii_case(name)
                                    .then(|| value.trim().to_string())
                            })
                        };
                        let (status, body) = {
                            let mut behaviour = behaviour.lock().expect("behaviour");
                            if let Ok(mut seen) = seen.lock() {
                                seen.push(format!("{method} {path}"));
                            }
                            if behaviour.fail_first > 0 {
                                behaviour.fail_first -= 1;
                                ("503 Service Unavailable", String::new())
                            } else if method == "PUT" && path == "/latest/api/token" {
                                if header("x-aws-ec2-metadata-token-ttl-seconds").is_none() {
                                    ("400 Bad Request", String::new())
                                } else {
                                    let n = tokens.fetch_add(1, Ordering::SeqCst) + 1;
                                    ("200 OK", format!("token-{n}"))
                                }
                            } else {
                                let issued = tokens.load(Ordering::SeqCst);
                                let token = header("x-aws-ec2-metadata-token");
                                let current = Some(format!("token-{issued}"));
                                let valid = match &token {
                                    None => false,
                                    Some(_) if behaviour.expire_old_tokens => token == current,
                                    Some(token) => token.starts_with("token-"),
                                };
                                if !valid {
                                    ("401 Unauthorized", String::new())
                                } else {
                                    let item = path.trim_start_matches("/latest/");
                                    match behaviour.items.get(item) {
                                        Some(body) => ("200 OK", body.clone()),
                                        None => ("404 Not Found", String::new()),
                                    }
                                }
                            }
                        };
                        let answer = format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(answer.as_bytes()).await;
                    });
                }
            });
            FakeImds {
                endpoint,
                seen,
                tokens,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::Ordering;

    use super::fake::{Behaviour, FakeImds};
    use super::*;

    fn items(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(path, body)| (path.to_string(), body.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn a_token_is_fetched_once_and_sent_with_every_get() {
        let fake = FakeImds::start(Behaviour {
            items: items(&[("meta-data/instance-id", "i-0abc"), ("user-data", "x")]),
            ..Default::default()
        })
        .await;
        let imds = Imds::new(&fake.endpoint).expect("client");
        assert_eq!(
            imds.get("meta-data/instance-id")
                .await
                .ok()
                .flatten()
                .as_deref(),
            Some("i-0abc")
        );
        assert_eq!(
            imds.get("/user-data").await.ok().flatten().as_deref(),
            Some("x")
        );
        assert_eq!(
            imds.get("meta-data/absent").await.ok(),
            Some(None),
            "404 is None"
        );
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 1);
        let seen = fake.seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(seen[0], "PUT /latest/api/token");
    }

    #[tokio::test]
    async fn a_booting_service_is_retried() {
        let fake = FakeImds::start(Behaviour {
            items: items(&[("meta-data/local-ipv4", "10.0.1.5")]),
            fail_first: 3,
            ..Default::default()
        })
        .await;
        let imds = Imds::new(&fake.endpoint).expect("client");
        assert_eq!(
            imds.get("meta-data/local-ipv4")
                .await
                .ok()
                .flatten()
                .as_deref(),
            Some("10.0.1.5")
        );
    }

    #[tokio::test]
    async fn an_expired_token_is_replaced_once() {
        let fake = FakeImds::start(Behaviour {
            items: items(&[("meta-data/instance-id", "i-1")]),
            expire_old_tokens: true,
            ..Default::default()
        })
        .await;
        let imds = Imds::new(&fake.endpoint).expect("client");
        assert!(imds.get("meta-data/instance-id").await.is_ok());
        // Another client takes a token: ours is now old, answered 401, and renewed.
        let other = Imds::new(&fake.endpoint).expect("client");
        assert!(other.get("meta-data/instance-id").await.is_ok());
        assert_eq!(
            imds.get("meta-data/instance-id")
                .await
                .ok()
                .flatten()
                .as_deref(),
            Some("i-1")
        );
        assert_eq!(fake.tokens.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable_after_the_retries() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let imds = Imds::new(&format!("http://127.0.0.1:{port}")).expect("client");
        let err = imds
            .get("user-data")
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("did not answer after 8 attempts"), "{err}");
        assert!(Imds::new("ftp://x").is_err());
    }
}
