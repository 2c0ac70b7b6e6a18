//! `/exec`, `/attach` and `/portForward` (upstream `pkg/kubelet/server` `getExec` …): the
//! client's WebSocket on the kubelet side, bridged to containerd's streaming server through
//! the URL CRI `Exec`/`Attach` returns. The client speaks the channel protocol
//! `v5.channel.k8s.io` (kubectl 1.30+) or `v4.channel.k8s.io`; containerd 1.6 speaks v4, whose
//! frames are the same (`[channel, data…]`: 0 stdin, 1 stdout, 2 stderr, 3 error with a
//! `Status` carrying the exit code, 4 resize), so without stdin frames pass through unchanged
//! ([`bridge`]). v5's close frame (`[255, channel]`) has no v4 WebSocket equivalent, so a
//! session with stdin speaks SPDY/3.1 to the runtime instead ([`bridge_spdy`]: one stream per
//! channel, stdin's end a FIN). Port-forward serves `portforward::serve` on the client's
//! tunnel and dials each port through the runtime ([`dial_pod_port`]).

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};

use crate::cri::call;
use crate::server::{Body, KubeletServer, full, text};
use crate::translate::{CONTAINER_NAME_LABEL, POD_UID_LABEL};

/// The remote-command protocols the kubelet accepts, best first.
pub const REMOTE_COMMAND_PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// What containerd 1.6's streaming server speaks over WebSocket.
const RUNTIME_PROTOCOL: &str = "v4.channel.k8s.io";
/// v5's close-a-stream signal.
const CLOSE_CHANNEL: u8 = 255;

/// The options of an exec or attach request (upstream `remotecommand.Options`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamOptions {
    /// The command (exec only).
    pub command: Vec<String>,
    /// Stream standard input.
    pub stdin: bool,
    /// Stream standard output.
    pub stdout: bool,
    /// Stream standard error (never with a TTY: the TTY merges it into stdout).
    pub stderr: bool,
    /// Allocate a TTY.
    pub tty: bool,
}

impl StreamOptions {
    /// Reads `stdin=1&stdout=1&…&command=…` (upstream `NewOptions`: "1" or "true").
    pub fn from_query(query: Option<&str>) -> Self {
        let mut options = StreamOptions::default();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let on = value == "1" || value.eq_ignore_ascii_case("true");
            match key.as_ref() {
                "command" => options.command.push(value.into_owned()),
                "stdin" | "input" => options.stdin = on,
                "stdout" | "output" => options.stdout = on,
                "stderr" | "error" => options.stderr = on,
                "tty" => options.tty = on,
                _ => {}
            }
        }
        if options.tty {
            options.stderr = false;
        }
        options
    }
}

/// The protocol to answer a client offering `offered` (a `Sec-WebSocket-Protocol` value).
pub fn negotiate<'a>(offered: &str, supported: &[&'a str]) -> Option<&'a str> {
    let offered: Vec<&str> = offered.split(',').map(str::trim).collect();
    supported.iter().find(|p| offered.contains(p)).copied()
}

/// Whether a request asks to switch to WebSocket.
pub fn is_websocket(request: &Request<Incoming>) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        request
            .headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(token))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// The 101 answer to a WebSocket handshake with `protocol`, or why there is none.
#[allow(clippy::result_large_err)]
fn accept(
    request: &Request<Incoming>,
    supported: &[&str],
) -> Result<Response<Body>, Response<Body>> {
    let key = request
        .headers()
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| text(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key"))?;
    let offered = request
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let protocol = negotiate(offered, supported).ok_or_else(|| {
        text(
            StatusCode::BAD_REQUEST,
            format!(
                "unable to upgrade: no supported protocol among [{offered}]; supported: [{}]",
                supported.join(", ")
            ),
        )
    })?;
    let mut response = Response::new(full(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
            .map_err(|e| text(StatusCode::BAD_REQUEST, e.to_string()))?,
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_str(protocol)
            .map_err(|e| text(StatusCode::BAD_REQUEST, e.to_string()))?,
    );
    Ok(response)
}

/// The ID of the running container `name` of the pod with `uid`.
async fn running_container(server: &KubeletServer, uid: &str, name: &str) -> Option<String> {
    let mut cri = server.cri.clone();
    let containers = cri.containers(uid).await.ok()?;
    containers
        .into_iter()
        .filter(|c| c.labels.get(CONTAINER_NAME_LABEL).map(String::as_str) == Some(name))
        .filter(|c| c.labels.get(POD_UID_LABEL).map(String::as_str) == Some(uid))
        .find(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
}

/// `/exec/{ns}/{pod}/{container}` or `/attach/…`.
pub async fn exec_or_attach(
    server: Arc<KubeletServer>,
    namespace: &str,
    pod: &str,
    container: &str,
    attach: bool,
    mut request: Request<Incoming>,
) -> Response<Body> {
    if !is_websocket(&request) {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: this kubelet streams exec and attach over WebSocket (v5.channel.k8s.io, v4.channel.k8s.io) only",
        );
    }
    let options = StreamOptions::from_query(request.uri().query());
    if !attach && options.command.is_empty() {
        return text(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 command",
        );
    }
    let pod = match server.pod(namespace, pod).await {
        Ok(pod) => pod,
        Err(response) => return response,
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let Some(id) = running_container(&server, &uid, container).await else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("container not found ({container:?})"),
        );
    };
    let mut cri = server.cri.clone();
    let url = if attach {
        cri.runtime
            .attach(cri::AttachRequest {
                container_id: id,
                stdin: options.stdin,
                tty: options.tty,
                stdout: options.stdout,
                stderr: options.stderr,
            })
            .await
            .map_err(call("Attach"))
            .map(|r| r.into_inner().url)
    } else {
        cri.runtime
            .exec(cri::ExecRequest {
                container_id: id,
                cmd: options.command.clone(),
                tty: options.tty,
                stdin: options.stdin,
                stdout: options.stdout,
                stderr: options.stderr,
            })
            .await
            .map_err(call("Exec"))
            .map(|r| r.into_inner().url)
    };
    let url = match url {
        Ok(url) => url,
        Err(err) => return text(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    // With stdin the runtime is spoken to over SPDY, which can tell it stdin ended;
    // otherwise over WebSocket v4, whose frames pass through as they are.
    enum Runtime {
        WebSocket(Box<WebSocketStream<tokio::net::TcpStream>>),
        Spdy(hyper::upgrade::Upgraded),
    }
    let runtime = if options.stdin {
        connect_runtime_spdy(&url).await.map(Runtime::Spdy)
    } else {
        connect_runtime(&url, "")
            .await
            .map(|ws| Runtime::WebSocket(Box::new(ws)))
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(message) => return text(StatusCode::INTERNAL_SERVER_ERROR, message),
    };
    let response = match accept(&request, &REMOTE_COMMAND_PROTOCOLS) {
        Ok(response) => response,
        Err(response) => return response,
    };
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let upgraded = match upgrade.await {
            Ok(upgraded) => upgraded,
            Err(err) => {
                tracing::debug!(%err, "exec: the client's upgrade failed");
                return;
            }
        };
        let client =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        match runtime {
            Runtime::WebSocket(runtime) => bridge(client, *runtime).await,
            Runtime::Spdy(runtime) => bridge_spdy(client, TokioIo::new(runtime), options).await,
        }
    });
    response
}

/// A WebSocket to containerd's streaming server at `url` (`http://127.0.0.1:P/exec/TOKEN`),
/// with `query` appended.
pub async fn connect_runtime(
    url: &str,
    query: &str,
) -> Result<WebSocketStream<tokio::net::TcpStream>, String> {
    let ws_url = format!(
        "{}{query}",
        url.replacen("http://", "ws://", 1)
            .replacen("https://", "wss://", 1)
    );
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("streaming URL {url}: {e}"))?;
    request.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(RUNTIME_PROTOCOL),
    );
    let authority = request
        .uri()
        .authority()
        .map(|a| a.to_string())
        .ok_or_else(|| format!("streaming URL {url} names no host"))?;
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| format!("connecting to the runtime's streaming server {authority}: {e}"))?;
    let (stream, _) = tokio_tungstenite::client_async(request, tcp)
        .await
        .map_err(|e| format!("the runtime's streaming server refused the stream: {e}"))?;
    Ok(stream)
}

/// Relays frames both ways until either side ends. Client frames go to the runtime as they
/// are but v5 close frames (`[255, channel]`), which v4 cannot express; runtime frames go to
/// the client as they are (the v4 and v5 data frames are the same). When the runtime ends
/// (after sending the exit status on channel 3), the client's WebSocket is closed.
pub async fn bridge<C, R>(client: WebSocketStream<C>, runtime: WebSocketStream<R>)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut client_tx, mut client_rx) = client.split();
    let (mut runtime_tx, mut runtime_rx) = runtime.split();
    let upstream = async {
        while let Some(Ok(message)) = client_rx.next().await {
            let forward = match &message {
                Message::Binary(data) => data.first() != Some(&CLOSE_CHANNEL),
                Message::Text(_) => true,
                Message::Close(_) => break,
                _ => false,
            };
            if forward && runtime_tx.send(message).await.is_err() {
                break;
            }
        }
        let _ = runtime_tx.close().await;
    };
    let downstream = async {
        while let Some(Ok(message)) = runtime_rx.next().await {
            let forward = match &message {
                Message::Binary(_) | Message::Text(_) => true,
                Message::Close(_) => break,
                _ => false,
            };
            if forward && client_tx.send(message).await.is_err() {
                return;
            }
        }
        // A normal closure: client-go reads anything else as an error of every stream.
        let _ = client_tx
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        let _ = client_tx.close().await;
    };
    // The runtime's end finishes the session; the client's end only stops its direction.
    tokio::pin!(upstream);
    tokio::pin!(downstream);
    tokio::select! {
        _ = &mut upstream => {
            (&mut downstream).await;
        }
        _ = &mut downstream => {}
    }
}

/// The remote-command protocol asked of the runtime over SPDY (containerd 1.6 speaks up to v4).
const RUNTIME_SPDY_PROTOCOL: &str = "v4.channel.k8s.io";

/// Exec/attach on the runtime's streaming server over SPDY/3.1 (kubectl's SPDY executor's
/// protocol): unlike WebSocket v4 it can half-close stdin, so it is used whenever the client
/// streams stdin. Returns the upgraded connection.
pub async fn connect_runtime_spdy(url: &str) -> Result<hyper::upgrade::Upgraded, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("streaming URL {url}: {e}"))?;
    let authority = uri
        .authority()
        .map(|a| a.to_string())
        .ok_or_else(|| format!("streaming URL {url} names no host"))?;
    let tcp = tokio::net::TcpStream::connect(&authority)
        .await
        .map_err(|e| format!("connecting to the runtime's streaming server {authority}: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("the runtime's streaming server: {e}"))?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let request = Request::post(uri.path())
        .header(header::HOST, authority)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", RUNTIME_SPDY_PROTOCOL)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("the runtime's streaming server: {e}"))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(format!(
            "the runtime's streaming server answered {} instead of switching to SPDY",
            response.status()
        ));
    }
    hyper::upgrade::on(&mut response)
        .await
        .map_err(|e| format!("the runtime's streaming server: {e}"))
}

/// The streams of one remote-command session over SPDY, in upstream's creation order
/// (error, stdin, stdout, stderr, resize), with the client's odd stream IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpdyStreams {
    /// `streamType: error`: the runtime writes the `Status` here.
    pub error: u32,
    /// `stdin`, when streamed.
    pub stdin: Option<u32>,
    /// `stdout`, when streamed.
    pub stdout: Option<u32>,
    /// `stderr`, when streamed (never with a TTY).
    pub stderr: Option<u32>,
    /// `resize`, with a TTY.
    pub resize: Option<u32>,
}

impl SpdyStreams {
    /// The streams `options` ask for, numbered 1, 3, 5, …
    pub fn plan(options: &StreamOptions) -> (Self, Vec<crate::spdy::Frame>) {
        let mut frames = Vec::new();
        let mut next = 1u32;
        let mut open = |kind: &str, wanted: bool| -> Option<u32> {
            if !wanted {
                return None;
            }
            let id = next;
            next += 2;
            frames.push(crate::spdy::Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: crate::spdy::Headers::new().with("streamtype", kind),
            });
            Some(id)
        };
        let error = open("error", true).unwrap_or(1);
        let stdin = open("stdin", options.stdin);
        let stdout = open("stdout", options.stdout);
        let stderr = open("stderr", options.stderr && !options.tty);
        let resize = open("resize", options.tty);
        (
            SpdyStreams {
                error,
                stdin,
                stdout,
                stderr,
                resize,
            },
            frames,
        )
    }

    /// The SPDY frame for one client WebSocket frame (`[channel, data…]`), if any.
    pub fn frame_for_client_message(&self, message: &[u8]) -> Option<crate::spdy::Frame> {
        let (&channel, data) = message.split_first()?;
        let data_frame = |stream_id: u32, fin: bool, data: &[u8]| crate::spdy::Frame::Data {
            stream_id,
            fin,
            data: bytes::Bytes::copy_from_slice(data),
        };
        match channel {
            0 => Some(data_frame(self.stdin?, false, data)),
            4 => Some(data_frame(self.resize?, false, data)),
            CLOSE_CHANNEL if data.first() == Some(&0) => Some(data_frame(self.stdin?, true, &[])),
            _ => None,
        }
    }

    /// The client channel of the runtime's stream `stream_id` (1 stdout, 2 stderr, 3 error).
    pub fn channel_of(&self, stream_id: u32) -> Option<u8> {
        if Some(stream_id) == self.stdout {
            Some(1)
        } else if Some(stream_id) == self.stderr {
            Some(2)
        } else if stream_id == self.error {
            Some(3)
        } else {
            None
        }
    }
}

/// Relays a client's WebSocket session over SPDY to the runtime: stdin, its end (v5's close
/// frame becomes a FIN) and resizes one way; stdout, stderr and the error channel's `Status`
/// the other; the runtime's PINGs are answered. Ends with a normal closure.
pub async fn bridge_spdy<C, R>(client: WebSocketStream<C>, runtime: R, options: StreamOptions)
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    R: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut encoder, mut decoder) = crate::spdy::Codec::new().into_parts();
    let (streams, opening) = SpdyStreams::plan(&options);
    let (mut read, mut write) = tokio::io::split(runtime);
    let (frames_tx, mut frames_rx) = tokio::sync::mpsc::channel::<crate::spdy::Frame>(64);
    let (mut client_tx, mut client_rx) = client.split();
    let writer = async move {
        let mut buf = bytes::BytesMut::new();
        for frame in opening {
            if encoder.encode(&frame, &mut buf).is_err() {
                return;
            }
        }
        if write.write_all(&buf).await.is_err() {
            return;
        }
        buf.clear();
        while let Some(frame) = frames_rx.recv().await {
            if encoder.encode(&frame, &mut buf).is_err() || write.write_all(&buf).await.is_err() {
                return;
            }
            buf.clear();
        }
        let _ = write.shutdown().await;
    };
    let upstream = {
        let frames_tx = frames_tx.clone();
        async move {
            while let Some(Ok(message)) = client_rx.next().await {
                match message {
                    Message::Binary(data) => {
                        if let Some(frame) = streams.frame_for_client_message(&data)
                            && frames_tx.send(frame).await.is_err()
                        {
                            return;
                        }
                    }
                    Message::Close(_) => return,
                    _ => {}
                }
            }
        }
    };
    let downstream = async move {
        let mut buf = bytes::BytesMut::with_capacity(16 * 1024);
        let mut status = Vec::new();
        'read: loop {
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(crate::spdy::Frame::Data {
                        stream_id,
                        fin,
                        data,
                    })) => match streams.channel_of(stream_id) {
                        Some(3) => {
                            status.extend_from_slice(&data);
                            if fin {
                                break 'read;
                            }
                        }
                        Some(channel) if !data.is_empty() => {
                            let mut framed = Vec::with_capacity(data.len() + 1);
                            framed.push(channel);
                            framed.extend_from_slice(&data);
                            if client_tx.send(Message::binary(framed)).await.is_err() {
                                return;
                            }
                        }
                        _ => {}
                    },
                    Ok(Some(crate::spdy::Frame::Ping { id })) => {
                        let _ = frames_tx.send(crate::spdy::Frame::Ping { id }).await;
                    }
                    Ok(Some(crate::spdy::Frame::GoAway { .. })) => break 'read,
                    Ok(Some(crate::spdy::Frame::RstStream { stream_id, .. }))
                        if stream_id == streams.error =>
                    {
                        break 'read;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(err) => {
                        tracing::debug!(%err, "exec: the runtime's SPDY stream is broken");
                        break 'read;
                    }
                }
            }
            match read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        if !status.is_empty() {
            let mut framed = Vec::with_capacity(status.len() + 1);
            framed.push(3);
            framed.extend_from_slice(&status);
            let _ = client_tx.send(Message::binary(framed)).await;
        }
        let _ = client_tx
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        let _ = client_tx.close().await;
        drop(frames_tx);
    };
    tokio::pin!(upstream);
    tokio::pin!(writer);
    tokio::pin!(downstream);
    // The runtime's end (its status) finishes the session.
    let (mut upstream_done, mut writer_done) = (false, false);
    loop {
        tokio::select! {
            _ = &mut downstream => break,
            _ = &mut upstream, if !upstream_done => upstream_done = true,
            _ = &mut writer, if !writer_done => writer_done = true,
        }
    }
}

/// How a WebSocket's binary messages carry a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Each message is a run of bytes (kubectl's `SPDY/3.1+portforward.k8s.io` tunnel).
    Raw,
    /// The runtime's port-forward channels: `[0, data…]` carries the bytes, `[1, text…]` an
    /// error; the first message of each channel holds the port (2 bytes, little-endian).
    PortChannels,
}

/// A WebSocket as a byte stream (AsyncRead + AsyncWrite), for the SPDY port-forward server on
/// the client side and for each forwarded connection on the runtime side.
pub struct WsIo<S> {
    ws: WebSocketStream<S>,
    framing: Framing,
    pending: bytes::Bytes,
    port_headers_seen: [bool; 2],
}

impl<S> WsIo<S> {
    /// Wraps `ws`.
    pub fn new(ws: WebSocketStream<S>, framing: Framing) -> Self {
        WsIo {
            ws,
            framing,
            pending: bytes::Bytes::new(),
            port_headers_seen: [false; 2],
        }
    }

    /// The bytes a received binary message contributes, or the runtime's error.
    fn payload(&mut self, data: bytes::Bytes) -> std::io::Result<bytes::Bytes> {
        match self.framing {
            Framing::Raw => Ok(data),
            Framing::PortChannels => {
                let Some((&channel, rest)) = data.split_first() else {
                    return Ok(bytes::Bytes::new());
                };
                let index = usize::from(channel.min(1));
                let mut rest = data.slice(1..1 + rest.len());
                if !self.port_headers_seen[index] {
                    self.port_headers_seen[index] = true;
                    rest = rest.slice(rest.len().min(2)..);
                }
                match channel {
                    0 => Ok(rest),
                    1 if rest.is_empty() => Ok(rest),
                    1 => Err(std::io::Error::other(
                        String::from_utf8_lossy(&rest).into_owned(),
                    )),
                    _ => Ok(bytes::Bytes::new()),
                }
            }
        }
    }
}

impl<S> tokio::io::AsyncRead for WsIo<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        loop {
            if !self.pending.is_empty() {
                let take = self.pending.len().min(buf.remaining());
                let chunk = self.pending.split_to(take);
                buf.put_slice(&chunk);
                return Poll::Ready(Ok(()));
            }
            match self.ws.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(Message::Binary(data)))) => {
                    self.pending = self.payload(data)?;
                }
                Poll::Ready(Some(Ok(Message::Close(_)))) | Poll::Ready(None) => {
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Some(Ok(_))) => {}
                Poll::Ready(Some(Err(err))) => {
                    return Poll::Ready(Err(std::io::Error::other(err)));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S> tokio::io::AsyncWrite for WsIo<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        match self.ws.poll_ready_unpin(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(err)) => return Poll::Ready(Err(std::io::Error::other(err))),
            Poll::Pending => return Poll::Pending,
        }
        let message = match self.framing {
            Framing::Raw => buf.to_vec(),
            Framing::PortChannels => {
                let mut framed = Vec::with_capacity(buf.len() + 1);
                framed.push(0);
                framed.extend_from_slice(buf);
                framed
            }
        };
        if let Err(err) = self.ws.start_send_unpin(Message::binary(message)) {
            return Poll::Ready(Err(std::io::Error::other(err)));
        }
        // Written through at once: callers (the port-forward server's copy towards the pod)
        // write without flushing, and a message left in the buffer would never leave.
        match self.ws.poll_flush_unpin(cx) {
            Poll::Ready(Err(err)) => Poll::Ready(Err(std::io::Error::other(err))),
            _ => Poll::Ready(Ok(buf.len())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.ws.poll_flush_unpin(cx).map_err(std::io::Error::other)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.ws.poll_close_unpin(cx).map_err(std::io::Error::other)
    }
}

/// Opens a byte stream to `port` inside the pod whose sandbox is `sandbox` (localhost of the
/// pod's network namespace, as upstream): CRI `PortForward`, then the runtime's WebSocket
/// port-forward stream for that one port.
pub async fn dial_pod_port(
    mut cri: crate::cri::Cri,
    sandbox: String,
    port: u16,
) -> std::io::Result<WsIo<tokio::net::TcpStream>> {
    let url = cri
        .runtime
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox,
            port: vec![i32::from(port)],
        })
        .await
        .map_err(|status| std::io::Error::other(format!("CRI PortForward: {}", status.message())))?
        .into_inner()
        .url;
    let ws = connect_runtime(&url, &format!("?port={port}"))
        .await
        .map_err(std::io::Error::other)?;
    Ok(WsIo::new(ws, Framing::PortChannels))
}

/// `upgraded` behind an in-memory pipe: the port-forward server shares its io between tasks
/// (it must be Sync), which hyper's upgraded connection is not.
fn piped(upgraded: hyper::upgrade::Upgraded) -> tokio::io::DuplexStream {
    let (near, mut far) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut upgraded = TokioIo::new(upgraded);
        let _ = tokio::io::copy_bidirectional(&mut upgraded, &mut far).await;
    });
    near
}

/// The WebSocket subprotocol of kubectl's port-forward tunnel: SPDY inside WebSocket.
pub const PORT_FORWARD_TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// `/portForward/{ns}/{pod}`: the port-forward protocol (SPDY/3.1, `portforward.k8s.io`) on
/// either a WebSocket tunnel (`SPDY/3.1+portforward.k8s.io`, kubectl 1.31+) or a plain
/// `Upgrade: SPDY/3.1`, each forwarded connection dialled through the runtime.
pub async fn port_forward(
    server: Arc<KubeletServer>,
    namespace: &str,
    pod: &str,
    mut request: Request<Incoming>,
) -> Response<Body> {
    let pod = match server.pod(namespace, pod).await {
        Ok(pod) => pod,
        Err(response) => return response,
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut cri = server.cri.clone();
    let sandbox = match cri.sandboxes(Some(&uid)).await {
        Ok(sandboxes) => sandboxes
            .into_iter()
            .find(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            .map(|s| s.id),
        Err(err) => return text(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    let Some(sandbox) = sandbox else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "pod {:?} has no running sandbox",
                pod.metadata.name.unwrap_or_default()
            ),
        );
    };
    let config = crate::portforward::Config::new(sandbox.clone(), "");
    let dial = move |port: u16| dial_pod_port(cri.clone(), sandbox.clone(), port);
    if is_websocket(&request) {
        let response = match accept(&request, &[PORT_FORWARD_TUNNEL_PROTOCOL]) {
            Ok(response) => response,
            Err(response) => return response,
        };
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            let Ok(upgraded) = upgrade.await else {
                return;
            };
            let ws = WebSocketStream::from_raw_socket(piped(upgraded), Role::Server, None).await;
            if let Err(err) =
                crate::portforward::serve(WsIo::new(ws, Framing::Raw), config, dial).await
            {
                tracing::debug!(%err, "port-forward tunnel ended");
            }
        });
        return response;
    }
    let spdy = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("SPDY/3.1"));
    let offered = request
        .headers()
        .get_all("x-stream-protocol-version")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == crate::portforward::PROTOCOL_V1);
    if !spdy || !offered {
        return text(
            StatusCode::BAD_REQUEST,
            "unable to upgrade: port-forward needs Upgrade: SPDY/3.1 with X-Stream-Protocol-Version portforward.k8s.io, or a WebSocket with SPDY/3.1+portforward.k8s.io",
        );
    }
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        if let Err(err) = crate::portforward::serve(piped(upgraded), config, dial).await {
            tracing::debug!(%err, "port-forward connection ended");
        }
    });
    let mut response = Response::new(full(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    headers.insert(
        "x-stream-protocol-version",
        HeaderValue::from_static(crate::portforward::PROTOCOL_V1),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_from_the_query() {
        let options = StreamOptions::from_query(Some(
            "command=sh&command=-c&command=echo+hi&stdin=1&stdout=true&stderr=1",
        ));
        assert_eq!(options.command, ["sh", "-c", "echo hi"]);
        assert!(options.stdin && options.stdout && options.stderr && !options.tty);
        let tty = StreamOptions::from_query(Some("stdout=1&stderr=1&tty=1"));
        assert!(tty.tty && !tty.stderr, "a TTY merges stderr into stdout");
    }

    #[test]
    fn protocols_are_negotiated_best_first() {
        assert_eq!(
            negotiate(
                "v4.channel.k8s.io, v5.channel.k8s.io",
                &REMOTE_COMMAND_PROTOCOLS
            ),
            Some("v5.channel.k8s.io")
        );
        assert_eq!(
            negotiate(
                "v4.channel.k8s.io,channel.k8s.io",
                &REMOTE_COMMAND_PROTOCOLS
            ),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate("base64.channel.k8s.io", &REMOTE_COMMAND_PROTOCOLS),
            None
        );
    }

    #[test]
    fn spdy_streams_are_opened_and_mapped_as_upstream() {
        use crate::spdy::Frame;
        let options = StreamOptions::from_query(Some("command=cat&stdin=1&stdout=1&stderr=1"));
        let (streams, opening) = SpdyStreams::plan(&options);
        let kinds: Vec<(u32, String)> = opening
            .iter()
            .map(|f| match f {
                Frame::SynStream {
                    stream_id, headers, ..
                } => (
                    *stream_id,
                    headers.get("streamType").unwrap_or("").to_string(),
                ),
                other => panic!("not a SYN_STREAM: {other:?}"),
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (1, "error".into()),
                (3, "stdin".into()),
                (5, "stdout".into()),
                (7, "stderr".into())
            ]
        );
        assert_eq!(streams.resize, None);
        assert_eq!(
            streams.frame_for_client_message(&[0, b'h', b'i']),
            Some(Frame::Data {
                stream_id: 3,
                fin: false,
                data: bytes::Bytes::from_static(b"hi")
            })
        );
        // v5's "stdin is done" becomes a FIN on the stdin stream.
        assert_eq!(
            streams.frame_for_client_message(&[CLOSE_CHANNEL, 0]),
            Some(Frame::Data {
                stream_id: 3,
                fin: true,
                data: bytes::Bytes::new()
            })
        );
        assert_eq!(
            streams.frame_for_client_message(&[4, b'{', b'}']),
            None,
            "no TTY, no resize"
        );
        assert_eq!(
            (
                streams.channel_of(5),
                streams.channel_of(7),
                streams.channel_of(1)
            ),
            (Some(1), Some(2), Some(3))
        );
        let tty = StreamOptions::from_query(Some("stdin=1&stdout=1&stderr=1&tty=1"));
        let (streams, opening) = SpdyStreams::plan(&tty);
        assert_eq!(opening.len(), 4, "error, stdin, stdout, resize");
        assert_eq!((streams.stderr, streams.resize), (None, Some(7)));
        assert!(matches!(
            streams.frame_for_client_message(&[4, b'{', b'}']),
            Some(Frame::Data { stream_id: 7, .. })
        ));
    }

    #[tokio::test]
    async fn the_runtime_port_channels_read_as_a_byte_stream() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (kubelet_end, runtime_end) = tokio::io::duplex(4096);
        let kubelet = WebSocketStream::from_raw_socket(kubelet_end, Role::Client, None).await;
        let mut runtime = WebSocketStream::from_raw_socket(runtime_end, Role::Server, None).await;
        let mut io = WsIo::new(kubelet, Framing::PortChannels);
        // The port (8080 = 0x1f90, little-endian) first on both channels, then data.
        for frame in [
            vec![0, 0x90, 0x1f],
            vec![1, 0x90, 0x1f],
            vec![0, b'h', b'i'],
        ] {
            runtime.send(Message::binary(frame)).await.expect("send");
        }
        let mut got = [0u8; 2];
        io.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"hi");
        io.write_all(b"yo").await.expect("write");
        io.flush().await.expect("flush");
        let sent = runtime.next().await.expect("frame").expect("ok");
        assert_eq!(sent.into_data().as_ref(), &[0, b'y', b'o']);
        runtime
            .send(Message::binary(b"\x01connection refused".to_vec()))
            .await
            .expect("send error");
        let err = io
            .read(&mut [0u8; 8])
            .await
            .expect_err("the runtime's error");
        assert_eq!(err.to_string(), "connection refused");
    }

    #[tokio::test]
    async fn frames_pass_through_and_v5_close_frames_stay_behind() {
        let (client_end, kubelet_client_end) = tokio::io::duplex(4096);
        let (kubelet_runtime_end, runtime_end) = tokio::io::duplex(4096);
        let client = WebSocketStream::from_raw_socket(client_end, Role::Client, None).await;
        let kubelet_client =
            WebSocketStream::from_raw_socket(kubelet_client_end, Role::Server, None).await;
        let kubelet_runtime =
            WebSocketStream::from_raw_socket(kubelet_runtime_end, Role::Client, None).await;
        let runtime = WebSocketStream::from_raw_socket(runtime_end, Role::Server, None).await;
        let bridged = tokio::spawn(bridge(kubelet_client, kubelet_runtime));
        let (mut client_tx, mut client_rx) = client.split();
        let (mut runtime_tx, mut runtime_rx) = runtime.split();
        client_tx
            .send(Message::binary(vec![0, b'h', b'i']))
            .await
            .expect("stdin");
        client_tx
            .send(Message::binary(vec![CLOSE_CHANNEL, 0]))
            .await
            .expect("close stdin");
        client_tx
            .send(Message::binary(
                b"\x04{\"Width\":80,\"Height\":24}".to_vec(),
            ))
            .await
            .expect("resize");
        let first = runtime_rx.next().await.expect("frame").expect("ok");
        assert_eq!(first.into_data().as_ref(), &[0, b'h', b'i']);
        let second = runtime_rx.next().await.expect("frame").expect("ok");
        assert_eq!(
            second.into_data()[0],
            4,
            "the close frame was not forwarded"
        );
        let status = b"\x03{\"metadata\":{},\"status\":\"Success\"}".to_vec();
        runtime_tx
            .send(Message::binary(vec![1, b'o', b'k']))
            .await
            .expect("stdout");
        runtime_tx
            .send(Message::binary(status.clone()))
            .await
            .expect("status");
        runtime_tx.close().await.expect("close");
        let out = client_rx.next().await.expect("frame").expect("ok");
        assert_eq!(out.into_data().as_ref(), &[1, b'o', b'k']);
        let err = client_rx.next().await.expect("frame").expect("ok");
        assert_eq!(err.into_data().as_ref(), status.as_slice());
        bridged.await.expect("bridge ends with the runtime");
    }
}
