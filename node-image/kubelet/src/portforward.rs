//! The port-forward protocol server (`portforward.k8s.io`, what `kubectl port-forward` speaks)
//! on one SPDY/3.1 connection, as upstream's kubelet streaming server
//! (`pkg/kubelet/cri/streaming/portforward/httpstream.go` on spdystream) does it.
//!
//! For every local connection kubectl opens two streams carrying headers `streamType`
//! (`error`, then `data`), `port` and `requestID`. Each valid stream is accepted with a
//! SYN_REPLY (an invalid one is reset with CANCEL); the two are paired by `requestID`; once both
//! are there the port is dialled and bytes are copied both ways between the data stream and the
//! pod's port. A dial failure is written on the error stream as upstream's
//! `error forwarding port 8080 to pod …, uid …: …`; then both streams are closed (FIN). Pod EOF
//! closes the data stream (FIN); client FIN on the data stream half-closes the pod connection;
//! RST_STREAM on either stream ends the pair. Client PINGs are echoed; GOAWAY or EOF ends the
//! session.
//!
//! Flow control: spdystream (kubectl, the API server) does none — it ignores WINDOW_UPDATE and
//! SETTINGS and never sends them (moby/spdystream#2) — so waiting for window credit it would
//! never grant would hang every transfer past 64 KiB. The server therefore (a) sends
//! WINDOW_UPDATE for the stream and the session as it hands bytes to the pod, so a peer that does
//! flow control can keep sending, and (b) holds its own sending to the peer's windows (64 KiB
//! initial, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW_UPDATE) once the peer has shown it does flow
//! control by sending either of those frames. Memory is bounded either way: each stream buffers
//! at most `Config::stream_buffer` bytes towards the pod and the reader stops reading the
//! connection while a stream's buffer is full (the backpressure spdystream gets from its
//! unbuffered channels); frames to the peer wait in bounded queues.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::spdy::{
    Codec, DEFAULT_INITIAL_WINDOW_SIZE, Decoder, Encoder, Frame, GoAwayStatus, Headers,
    MAX_FRAME_LENGTH, RstStatus, Setting, SpdyError,
};

/// The subprotocol a port-forward connection negotiates (`X-Stream-Protocol-Version`, and after
/// `SPDY/3.1+` in the WebSocket tunnel's `Sec-WebSocket-Protocol`).
pub const PROTOCOL_V1: &str = "portforward.k8s.io";
/// Stream header naming the stream's role (`api.StreamType`).
pub const STREAM_TYPE_HEADER: &str = "streamType";
/// Stream header with the pod port to forward to (`api.PortHeader`).
pub const PORT_HEADER: &str = "port";
/// Stream header pairing a request's error and data streams (`api.PortForwardRequestIDHeader`).
pub const REQUEST_ID_HEADER: &str = "requestID";
/// `streamType` of the stream that carries a request's error message.
pub const STREAM_TYPE_ERROR: &str = "error";
/// `streamType` of the stream that carries a request's bytes.
pub const STREAM_TYPE_DATA: &str = "data";

/// Payload of one DATA frame we send (what Go's `io.Copy` moves per write).
const CHUNK: usize = 32 * 1024;

/// The port-forward session's parameters.
#[derive(Debug, Clone)]
pub struct Config {
    /// The pod as named in error messages: with a CRI runtime upstream passes the sandbox ID.
    pub pod: String,
    /// The pod's UID in error messages (empty with a CRI runtime, as upstream).
    pub uid: String,
    /// How long a request may wait for its second stream (upstream's
    /// `StreamCreationTimeout`, 30 s).
    pub stream_creation_timeout: Duration,
    /// The session ends after this long without a frame in either direction (upstream's
    /// `--streaming-connection-idle-timeout`, 4 h).
    pub idle_timeout: Duration,
    /// After the pod closes its side, how long to wait for the client's side to end before
    /// closing the request (containerd's port forward waits 1 s).
    pub close_grace: Duration,
    /// Streams open at once; more are refused (RST_STREAM REFUSED_STREAM).
    pub max_streams: usize,
    /// Bytes buffered per data stream towards the pod before the reader stops reading.
    pub stream_buffer: usize,
    /// The largest frame payload accepted from the peer.
    pub max_frame_length: usize,
}

impl Config {
    /// Upstream's defaults for a pod.
    pub fn new(pod: impl Into<String>, uid: impl Into<String>) -> Self {
        Self {
            pod: pod.into(),
            uid: uid.into(),
            stream_creation_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(4 * 60 * 60),
            close_grace: Duration::from_secs(1),
            max_streams: 1024,
            stream_buffer: 256 * 1024,
            max_frame_length: MAX_FRAME_LENGTH,
        }
    }
}

/// Why a port-forward session ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum PortForwardError {
    /// Reading or writing the connection failed.
    #[error("port-forward connection: {0}")]
    Io(#[from] io::Error),
    /// The peer sent bytes that are not SPDY/3.1 (a GOAWAY PROTOCOL_ERROR was sent).
    #[error("port-forward protocol: {0}")]
    Protocol(#[from] SpdyError),
}

/// Serves the port-forward protocol on `io` until the client goes away.
///
/// `io` carries the SPDY/3.1 byte stream in both directions, from the first frame on: for the
/// `Upgrade: SPDY/3.1` path the upgraded connection after the 101 response; for the WebSocket
/// tunnel (`SPDY/3.1+portforward.k8s.io`) the concatenated payloads of the binary messages
/// (message boundaries mean nothing: a frame may span messages, a message may hold several
/// frames), and what is written becomes binary messages. Read EOF ends the session; write
/// shutdown is called when the session ends so the adapter can close its side.
///
/// `dial(port)` opens a byte stream to the pod's port; its error text ends up in the client's
/// message. Returns `Ok` when the client closed the connection or sent GOAWAY and its requests
/// finished, or after the idle timeout.
pub async fn serve<IO, D, F, S>(io: IO, config: Config, dial: D) -> Result<(), PortForwardError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send,
    D: Fn(u16) -> F + Send + Sync + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (read, write) = tokio::io::split(io);
    let (encoder, decoder) = Codec::new()
        .with_max_frame_length(config.max_frame_length)
        .into_parts();
    // Control frames (replies, resets, pings, window updates) jump the queue of data frames,
    // so a stream's SYN_REPLY, queued before its task exists, is on the wire before its data.
    let (control_tx, control_rx) = mpsc::channel(256);
    let (data_tx, data_rx) = mpsc::channel(64);
    let activity = Arc::new(Activity {
        started: Instant::now(),
        last_ms: AtomicU64::new(0),
    });
    let shared = Arc::new(Shared {
        config,
        control: control_tx,
        data: data_tx,
        windows: Mutex::new(SendWindows {
            enforced: false,
            initial: i64::from(DEFAULT_INITIAL_WINDOW_SIZE),
            session: i64::from(DEFAULT_INITIAL_WINDOW_SIZE),
            streams: HashMap::new(),
        }),
        window_changed: Notify::new(),
        session_unacked: Mutex::new(0),
        activity: Arc::clone(&activity),
    });
    let mut writer = pin!(write_frames(write, encoder, control_rx, data_rx, activity));
    let session = Session {
        shared,
        dial: Arc::new(dial),
        decoder,
        read,
        buf: BytesMut::with_capacity(64 * 1024),
        streams: HashMap::new(),
        pairs: HashMap::new(),
        tasks: JoinSet::new(),
        task_requests: HashMap::new(),
        last_stream_id: 0,
        gone_away: false,
    };
    let mut reader = pin!(session.run());
    tokio::select! {
        outcome = &mut reader => {
            // The session dropped its senders and aborted its tasks: the writer drains what
            // is queued and shuts the connection, unless the peer stopped reading.
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
            outcome
        }
        written = &mut writer => written,
    }
}

/// What the session, its tasks and the writer share.
struct Shared {
    config: Config,
    control: mpsc::Sender<Frame>,
    data: mpsc::Sender<Frame>,
    windows: Mutex<SendWindows>,
    window_changed: Notify,
    /// Bytes consumed on the session not yet granted back by a session WINDOW_UPDATE.
    session_unacked: Mutex<u32>,
    activity: Arc<Activity>,
}

/// When a frame last crossed the connection, for the idle timeout.
struct Activity {
    started: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn idle_deadline(&self, idle_timeout: Duration) -> Instant {
        self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle_timeout
    }
}

/// Our sending windows, as the peer grants them.
struct SendWindows {
    /// The peer has shown it does flow control (sent WINDOW_UPDATE or the initial window).
    enforced: bool,
    initial: i64,
    session: i64,
    /// Open streams we may send on.
    streams: HashMap<u32, i64>,
}

impl Shared {
    fn idle_deadline(&self) -> Instant {
        self.activity.idle_deadline(self.config.idle_timeout)
    }

    /// Waits until `want` bytes (or fewer) may be sent on `stream`; `None` once the stream
    /// is gone (reset or ended).
    async fn acquire_send(&self, stream: u32, want: usize) -> Option<usize> {
        loop {
            let mut notified = pin!(self.window_changed.notified());
            notified.as_mut().enable();
            {
                let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
                let enforced = windows.enforced;
                let session = windows.session;
                let window = windows.streams.get_mut(&stream)?;
                let granted = if enforced {
                    let available = (*window).min(session);
                    (available > 0).then(|| want.min(available as usize))
                } else {
                    Some(want)
                };
                if let Some(n) = granted {
                    // Counted even when not enforced, so a peer that turns flow control on
                    // later sees windows that include what it already received.
                    *window -= n as i64;
                    windows.session -= n as i64;
                    return Some(n);
                }
            }
            notified.await;
        }
    }

    fn update_windows(&self, apply: impl FnOnce(&mut SendWindows)) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        apply(&mut windows);
        drop(windows);
        self.window_changed.notify_waiters();
    }

    /// Grants the session's `n` consumed bytes back to the peer, in batches of half the
    /// initial window.
    async fn consumed_on_session(&self, n: usize) {
        let delta = {
            let mut unacked = self
                .session_unacked
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            *unacked = unacked.saturating_add(n as u32);
            if *unacked < DEFAULT_INITIAL_WINDOW_SIZE / 2 {
                return;
            }
            std::mem::take(&mut *unacked)
        };
        let _ = self
            .control
            .send(Frame::WindowUpdate {
                stream_id: 0,
                delta,
            })
            .await;
    }

    async fn send_data(&self, stream_id: u32, fin: bool, data: Bytes) -> bool {
        self.data
            .send(Frame::Data {
                stream_id,
                fin,
                data,
            })
            .await
            .is_ok()
    }
}

/// Encodes frames to the connection, control frames first, batching what is ready.
async fn write_frames<W: AsyncWrite>(
    write: W,
    mut encoder: Encoder,
    mut control: mpsc::Receiver<Frame>,
    mut data: mpsc::Receiver<Frame>,
    activity: Arc<Activity>,
) -> Result<(), PortForwardError> {
    let mut write = pin!(write);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let (mut control_open, mut data_open) = (true, true);
    loop {
        let frame = tokio::select! {
            biased;
            frame = control.recv(), if control_open => match frame {
                Some(frame) => frame,
                None => { control_open = false; continue; }
            },
            frame = data.recv(), if data_open => match frame {
                Some(frame) => frame,
                None => { data_open = false; continue; }
            },
            else => break,
        };
        encoder.encode(&frame, &mut buf)?;
        while buf.len() < 64 * 1024 {
            let Ok(frame) = control.try_recv().or_else(|_| data.try_recv()) else {
                break;
            };
            encoder.encode(&frame, &mut buf)?;
        }
        write.write_all(&buf).await?;
        write.flush().await?;
        buf.clear();
        activity.touch();
    }
    let _ = write.shutdown().await;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamType {
    Error,
    Data,
}

/// Client bytes on their way to the pod, holding their share of the stream's buffer.
type Inbound = (Bytes, OwnedSemaphorePermit);

/// A stream the client opened, as the reader tracks it.
struct StreamState {
    request_id: String,
    /// Where the stream's bytes go (data streams, until the client's FIN).
    inbound: Option<mpsc::UnboundedSender<Inbound>>,
    budget: Arc<Semaphore>,
}

/// A request's streams, as they arrive.
struct Pair {
    port: u16,
    error: Option<u32>,
    data: Option<u32>,
    /// The data stream's bytes, until the request starts and takes them.
    inbound: Option<mpsc::UnboundedReceiver<Inbound>>,
    deadline: Instant,
    signals: Arc<PairSignals>,
    started: bool,
}

/// What the reader tells a running request.
#[derive(Default)]
struct PairSignals {
    data_reset: AtomicBool,
    error_reset: AtomicBool,
    changed: Notify,
}

impl PairSignals {
    fn reset(&self, stream: StreamType) {
        match stream {
            StreamType::Data => self.data_reset.store(true, Ordering::SeqCst),
            StreamType::Error => self.error_reset.store(true, Ordering::SeqCst),
        }
        self.changed.notify_waiters();
    }

    fn any_reset(&self) -> bool {
        self.data_reset.load(Ordering::SeqCst) || self.error_reset.load(Ordering::SeqCst)
    }

    async fn wait_reset(&self) {
        loop {
            let mut notified = pin!(self.changed.notified());
            notified.as_mut().enable();
            if self.any_reset() {
                return;
            }
            notified.await;
        }
    }
}

/// The reading side of a session: frames in, streams paired, requests started.
struct Session<R, D> {
    shared: Arc<Shared>,
    dial: Arc<D>,
    decoder: Decoder,
    read: ReadHalf<R>,
    buf: BytesMut,
    streams: HashMap<u32, StreamState>,
    pairs: HashMap<String, Pair>,
    tasks: JoinSet<()>,
    task_requests: HashMap<tokio::task::Id, String>,
    last_stream_id: u32,
    gone_away: bool,
}

impl<R, D, F, S> Session<R, D>
where
    R: AsyncRead + AsyncWrite + Unpin + Send,
    D: Fn(u16) -> F + Send + Sync + 'static,
    F: Future<Output = io::Result<S>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    async fn run(mut self) -> Result<(), PortForwardError> {
        loop {
            if self.gone_away && self.pairs.is_empty() && self.tasks.is_empty() {
                return Ok(());
            }
            let pair_deadline = self
                .pairs
                .values()
                .filter(|p| !p.started)
                .map(|p| p.deadline)
                .min();
            let idle_deadline = self.shared.idle_deadline();
            tokio::select! {
                read = self.read.read_buf(&mut self.buf) => {
                    if read? == 0 {
                        return Ok(());
                    }
                    self.shared.activity.touch();
                    loop {
                        match self.decoder.decode(&mut self.buf) {
                            Ok(Some(frame)) => self.handle(frame).await,
                            Ok(None) => break,
                            Err(e) => {
                                let _ = self.shared.control.send(Frame::GoAway {
                                    last_good_stream_id: self.last_stream_id,
                                    status: GoAwayStatus::PROTOCOL_ERROR,
                                }).await;
                                return Err(e.into());
                            }
                        }
                    }
                }
                Some(done) = self.tasks.join_next_with_id() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(e) => e.id(),
                    };
                    if let Some(request_id) = self.task_requests.remove(&id) {
                        self.remove_pair(&request_id);
                    }
                }
                _ = tokio::time::sleep_until(pair_deadline.unwrap_or(idle_deadline)), if pair_deadline.is_some() => {
                    self.expire_pairs().await;
                }
                _ = tokio::time::sleep_until(idle_deadline) => {
                    if self.shared.idle_deadline() <= Instant::now() {
                        tracing::debug!("port-forward connection idle, closing");
                        let _ = self.shared.control.send(Frame::GoAway {
                            last_good_stream_id: self.last_stream_id,
                            status: GoAwayStatus::OK,
                        }).await;
                        return Ok(());
                    }
                }
            }
        }
    }

    async fn handle(&mut self, frame: Frame) {
        match frame {
            Frame::SynStream {
                stream_id,
                fin,
                headers,
                ..
            } => self.open_stream(stream_id, fin, &headers).await,
            Frame::Data {
                stream_id,
                fin,
                data,
            } => self.receive_data(stream_id, fin, data).await,
            Frame::Headers {
                stream_id,
                fin: true,
                ..
            } => self.receive_data(stream_id, true, Bytes::new()).await,
            Frame::RstStream { stream_id, status } => {
                tracing::debug!(
                    stream_id,
                    ?status,
                    "port-forward stream reset by the client"
                );
                let Some(stream) = self.streams.remove(&stream_id) else {
                    return;
                };
                self.shared.update_windows(|w| {
                    w.streams.remove(&stream_id);
                });
                let Some(pair) = self.pairs.get(&stream.request_id) else {
                    return;
                };
                let kind = if pair.error == Some(stream_id) {
                    StreamType::Error
                } else {
                    StreamType::Data
                };
                pair.signals.reset(kind);
                if !pair.started {
                    // The request can never complete: forget it (its other stream stays
                    // open, as upstream leaves it).
                    self.remove_pair(&stream.request_id);
                }
            }
            Frame::Ping { id } => {
                // Odd IDs are the client's; an even one would answer a ping we never send.
                if id % 2 == 1 {
                    let _ = self.shared.control.send(Frame::Ping { id }).await;
                }
            }
            Frame::Settings { entries, .. } => {
                if let Some(setting) = entries
                    .iter()
                    .rev()
                    .find(|s| s.id == Setting::INITIAL_WINDOW_SIZE)
                {
                    let initial = i64::from(setting.value & 0x7fff_ffff);
                    self.shared.update_windows(|w| {
                        let delta = initial - w.initial;
                        for window in w.streams.values_mut() {
                            *window += delta;
                        }
                        w.initial = initial;
                        w.enforced = true;
                    });
                }
            }
            Frame::WindowUpdate { stream_id, delta } => {
                let delta = i64::from(delta);
                self.shared.update_windows(|w| {
                    w.enforced = true;
                    if stream_id == 0 {
                        w.session = w.session.saturating_add(delta);
                    } else if let Some(window) = w.streams.get_mut(&stream_id) {
                        *window = window.saturating_add(delta);
                    }
                });
            }
            Frame::GoAway { .. } => {
                tracing::debug!("port-forward client sent GOAWAY");
                self.gone_away = true;
            }
            // We open no streams, so replies mean nothing; HEADERS without FIN carry nothing
            // port forwarding uses; unknown frames are ignored as the spec says.
            Frame::SynReply { .. } | Frame::Headers { .. } | Frame::Unknown { .. } => {}
        }
    }

    async fn reset(&self, stream_id: u32, status: RstStatus) {
        let _ = self
            .shared
            .control
            .send(Frame::RstStream { stream_id, status })
            .await;
    }

    /// Accepts or refuses a new stream (upstream's `httpStreamReceived` and
    /// `httpStreamHandler.run`).
    async fn open_stream(&mut self, stream_id: u32, fin: bool, headers: &Headers) {
        // spdystream's validateStreamId: client streams are odd and increasing.
        if stream_id.is_multiple_of(2) || stream_id <= self.last_stream_id {
            self.reset(stream_id, RstStatus::PROTOCOL_ERROR).await;
            return;
        }
        self.last_stream_id = stream_id;
        if self.gone_away {
            return;
        }
        if self.streams.len() >= self.shared.config.max_streams {
            self.reset(stream_id, RstStatus::REFUSED_STREAM).await;
            return;
        }
        let (kind, port) = match validate_stream(headers) {
            Ok(valid) => valid,
            Err(reason) => {
                tracing::debug!(stream_id, %reason, "port-forward stream rejected");
                self.reset(stream_id, RstStatus::CANCEL).await;
                return;
            }
        };
        let request_id = request_id(headers, kind, stream_id);
        let _ = self
            .shared
            .control
            .send(Frame::SynReply {
                stream_id,
                fin: false,
                headers: Headers::new(),
            })
            .await;

        let deadline = Instant::now() + self.shared.config.stream_creation_timeout;
        let pair = self
            .pairs
            .entry(request_id.clone())
            .or_insert_with(|| Pair {
                port,
                error: None,
                data: None,
                inbound: None,
                deadline,
                signals: Arc::default(),
                started: false,
            });
        let duplicate = match kind {
            StreamType::Error if pair.error.is_some() => Some("error stream already assigned"),
            StreamType::Data if pair.data.is_some() => Some("data stream already assigned"),
            _ => None,
        };
        if let Some(reason) = duplicate {
            // Upstream prints this on the request's error stream and leaves the extra
            // stream dangling; we also reset it so it does not stay open.
            let message = format!("error processing stream for request {request_id}: {reason}");
            tracing::warn!("{message}");
            let error_stream = pair.error.filter(|_| !pair.started);
            if let Some(error_stream) = error_stream {
                self.shared
                    .send_data(error_stream, false, Bytes::from(message))
                    .await;
            }
            self.reset(stream_id, RstStatus::CANCEL).await;
            return;
        }
        let mut inbound = None;
        match kind {
            StreamType::Error => pair.error = Some(stream_id),
            StreamType::Data => {
                let (tx, rx) = mpsc::unbounded_channel();
                if !fin {
                    inbound = Some(tx);
                }
                pair.data = Some(stream_id);
                pair.inbound = Some(rx);
                self.shared.update_windows(|w| {
                    let initial = w.initial;
                    w.streams.insert(stream_id, initial);
                });
            }
        }
        let complete = pair.error.is_some() && pair.data.is_some();
        self.streams.insert(
            stream_id,
            StreamState {
                request_id: request_id.clone(),
                inbound,
                budget: Arc::new(Semaphore::new(self.shared.config.stream_buffer.max(1))),
            },
        );
        if complete {
            self.start(&request_id);
        }
    }

    /// Starts forwarding a complete pair (upstream's `portForward`).
    fn start(&mut self, request_id: &str) {
        let Some(pair) = self.pairs.get_mut(request_id) else {
            return;
        };
        let (Some(error_stream), Some(data_stream), Some(inbound)) =
            (pair.error, pair.data, pair.inbound.take())
        else {
            return;
        };
        pair.started = true;
        let request = Request {
            shared: Arc::clone(&self.shared),
            port: pair.port,
            error_stream,
            data_stream,
            signals: Arc::clone(&pair.signals),
        };
        let dial = Arc::clone(&self.dial);
        let handle = self
            .tasks
            .spawn(async move { request.forward(dial.as_ref(), inbound).await });
        self.task_requests
            .insert(handle.id(), request_id.to_string());
    }

    async fn receive_data(&mut self, stream_id: u32, fin: bool, data: Bytes) {
        let len = data.len();
        let queued = match self.streams.get_mut(&stream_id) {
            Some(StreamState {
                inbound: Some(inbound),
                budget,
                ..
            }) if len > 0 => {
                // Wait for room in the stream's buffer (this stops reading the connection),
                // unless the request ends meanwhile.
                let want = len.min(self.shared.config.stream_buffer.max(1)) as u32;
                let permit = tokio::select! {
                    permit = Arc::clone(budget).acquire_many_owned(want) => permit.ok(),
                    _ = inbound.closed() => None,
                };
                match permit {
                    Some(permit) => inbound.send((data, permit)).is_ok(),
                    None => false,
                }
            }
            _ => false,
        };
        if !queued && len > 0 {
            // Nobody will consume these bytes: grant them back to the session at once.
            self.shared.consumed_on_session(len).await;
        }
        if fin && let Some(stream) = self.streams.get_mut(&stream_id) {
            stream.inbound = None;
        }
    }

    /// Writes upstream's timeout message on the error stream of requests whose second stream
    /// never came, and forgets them.
    async fn expire_pairs(&mut self) {
        let now = Instant::now();
        let expired: Vec<String> = self
            .pairs
            .iter()
            .filter(|(_, p)| !p.started && p.deadline <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for request_id in expired {
            let Some(pair) = self.pairs.get(&request_id) else {
                continue;
            };
            tracing::warn!(
                request_id,
                "port-forward request timed out waiting for streams"
            );
            if let Some(error_stream) = pair.error {
                let message = format!("(request={request_id}) timed out waiting for streams");
                self.shared
                    .send_data(error_stream, false, Bytes::from(message))
                    .await;
                self.shared
                    .send_data(error_stream, true, Bytes::new())
                    .await;
            }
            if let Some(data_stream) = pair.data {
                self.reset(data_stream, RstStatus::CANCEL).await;
            }
            self.remove_pair(&request_id);
        }
    }

    fn remove_pair(&mut self, request_id: &str) {
        let Some(pair) = self.pairs.remove(request_id) else {
            return;
        };
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.request_id == request_id)
            .map(|(id, _)| *id)
            .chain(pair.error)
            .collect();
        for id in &ids {
            self.streams.remove(id);
        }
        self.shared.update_windows(|w| {
            for id in &ids {
                w.streams.remove(id);
            }
        });
    }
}

/// Checks a new stream's headers as upstream's `httpStreamReceived`, with its messages.
fn validate_stream(headers: &Headers) -> Result<(StreamType, u16), String> {
    let port = headers.get(PORT_HEADER).unwrap_or("");
    if port.is_empty() {
        return Err(format!("{PORT_HEADER:?} header is required"));
    }
    // strconv.ParseUint(port, 10, 16): digits only, no sign.
    let parsed = port
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| port.parse::<u16>().ok())
        .flatten()
        .ok_or_else(|| format!("unable to parse {port:?} as a port"))?;
    if parsed < 1 {
        return Err(format!("port {port:?} must be > 0"));
    }
    let kind = match headers.get(STREAM_TYPE_HEADER).unwrap_or("") {
        "" => return Err(format!("{STREAM_TYPE_HEADER:?} header is required")),
        STREAM_TYPE_ERROR => StreamType::Error,
        STREAM_TYPE_DATA => StreamType::Data,
        other => return Err(format!("invalid stream type {other:?}")),
    };
    Ok((kind, parsed))
}

/// The request a stream belongs to: its `requestID`, or for old clients without one
/// upstream's guess from consecutive stream IDs (error `n`, data `n + 2`).
fn request_id(headers: &Headers, kind: StreamType, stream_id: u32) -> String {
    match headers.get(REQUEST_ID_HEADER) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => match kind {
            StreamType::Error => stream_id.to_string(),
            StreamType::Data => (i64::from(stream_id) - 2).to_string(),
        },
    }
}

/// One forwarded connection: a pair of streams and a dialled pod port.
struct Request {
    shared: Arc<Shared>,
    port: u16,
    error_stream: u32,
    data_stream: u32,
    signals: Arc<PairSignals>,
}

impl Request {
    async fn forward<D, F, S>(self, dial: &D, inbound: mpsc::UnboundedReceiver<Inbound>)
    where
        D: Fn(u16) -> F,
        F: Future<Output = io::Result<S>>,
        S: AsyncRead + AsyncWrite,
    {
        let dialled = tokio::select! {
            dialled = dial(self.port) => Some(dialled),
            _ = self.signals.wait_reset() => None,
        };
        let mut data_closed = false;
        match dialled {
            None => {}
            Some(Err(e)) => {
                let config = &self.shared.config;
                let message = format!(
                    "error forwarding port {} to pod {}, uid {}: {e}",
                    self.port, config.pod, config.uid
                );
                tracing::warn!("{message}");
                self.shared
                    .send_data(self.error_stream, false, Bytes::from(message))
                    .await;
            }
            Some(Ok(conn)) => data_closed = self.copy(conn, inbound).await,
        }
        // Upstream closes the error stream, then the data stream (deferred Close calls).
        if !self.signals.error_reset.load(Ordering::SeqCst) {
            self.shared
                .send_data(self.error_stream, true, Bytes::new())
                .await;
        }
        if !data_closed && !self.signals.data_reset.load(Ordering::SeqCst) {
            self.shared
                .send_data(self.data_stream, true, Bytes::new())
                .await;
        }
    }

    /// Copies both ways until both sides are done, the client resets, or the pod closed and
    /// the client did not follow within the grace period. Returns whether the data stream was
    /// closed (FIN sent).
    async fn copy<S: AsyncRead + AsyncWrite>(
        &self,
        conn: S,
        inbound: mpsc::UnboundedReceiver<Inbound>,
    ) -> bool {
        let (pod_read, pod_write) = tokio::io::split(conn);
        let mut to_pod = pin!(self.client_to_pod(inbound, pod_write));
        let mut from_pod = pin!(self.pod_to_client(pod_read));
        let (mut to_pod_done, mut from_pod_done, mut data_closed) = (false, false, false);
        let grace = tokio::time::sleep(Duration::MAX / 4);
        let mut grace = pin!(grace);
        while !(to_pod_done && from_pod_done) {
            tokio::select! {
                result = &mut to_pod, if !to_pod_done => {
                    to_pod_done = true;
                    if let Err(e) = result {
                        tracing::debug!(port = self.port, error = %e, "port-forward writing to the pod");
                    }
                }
                closed = &mut from_pod, if !from_pod_done => {
                    from_pod_done = true;
                    data_closed = closed;
                    grace.as_mut().reset(Instant::now() + self.shared.config.close_grace);
                }
                _ = self.signals.wait_reset() => break,
                _ = &mut grace, if from_pod_done => break,
            }
        }
        data_closed
    }

    /// Client bytes to the pod, granting window as they are written; the client's FIN
    /// half-closes the pod connection.
    async fn client_to_pod<W: AsyncWrite>(
        &self,
        mut inbound: mpsc::UnboundedReceiver<Inbound>,
        write: W,
    ) -> io::Result<()> {
        let mut write = pin!(write);
        let mut unacked = 0u32;
        while let Some((bytes, permit)) = inbound.recv().await {
            write.write_all(&bytes).await?;
            drop(permit);
            unacked = unacked.saturating_add(bytes.len() as u32);
            if unacked >= DEFAULT_INITIAL_WINDOW_SIZE / 2 {
                let _ = self
                    .shared
                    .control
                    .send(Frame::WindowUpdate {
                        stream_id: self.data_stream,
                        delta: std::mem::take(&mut unacked),
                    })
                    .await;
            }
            self.shared.consumed_on_session(bytes.len()).await;
        }
        write.shutdown().await
    }

    /// Pod bytes to the client within the peer's windows; pod EOF sends FIN. Returns whether
    /// the FIN was sent.
    async fn pod_to_client<R: AsyncRead>(&self, read: R) -> bool {
        let mut read = pin!(read);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match read.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(port = self.port, error = %e, "port-forward reading from the pod");
                    break;
                }
            };
            let mut sent = 0;
            while sent < n {
                let Some(granted) = self.shared.acquire_send(self.data_stream, n - sent).await
                else {
                    return false;
                };
                let chunk = Bytes::copy_from_slice(&buf[sent..sent + granted]);
                if !self.shared.send_data(self.data_stream, false, chunk).await {
                    return false;
                }
                sent += granted;
            }
        }
        self.shared
            .send_data(self.data_stream, true, Bytes::new())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::Decoder;
    use tokio::io::DuplexStream;
    use tokio::net::{TcpListener, TcpStream};

    /// What the test client sees on one stream.
    #[derive(Debug, PartialEq)]
    enum Event {
        Reply,
        Data(Bytes),
        Fin,
        Reset(RstStatus),
    }

    /// A SPDY client written against the codec, shaped like kubectl's: streams opened with
    /// SYN_STREAM, a reader that routes frames to streams. With `flow_control` it grants the
    /// server window as it consumes and holds its own sending to the server's grants.
    struct Client {
        frames: mpsc::UnboundedSender<Frame>,
        streams: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Event>>>>,
        pings: mpsc::UnboundedReceiver<Frame>,
        windows: Arc<ClientWindows>,
        next_stream: u32,
    }

    #[derive(Default)]
    struct ClientWindows {
        /// Our send windows (session at key 0), as the server grants them.
        send: Mutex<HashMap<u32, i64>>,
        changed: Notify,
        /// WINDOW_UPDATE deltas the server sent, by stream (session at key 0).
        granted_by_server: Mutex<HashMap<u32, u64>>,
    }

    impl Client {
        fn new(io: DuplexStream) -> Self {
            let (mut read, mut write) = tokio::io::split(io);
            let (frames, mut outgoing) = mpsc::unbounded_channel::<Frame>();
            tokio::spawn(async move {
                let mut encoder = Encoder::new();
                let mut buf = BytesMut::new();
                while let Some(frame) = outgoing.recv().await {
                    encoder.encode(&frame, &mut buf).expect("client encodes");
                    if write.write_all(&buf).await.is_err() {
                        break;
                    }
                    buf.clear();
                }
                let _ = write.shutdown().await;
            });
            let streams: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Event>>>> = Arc::default();
            let windows = Arc::new(ClientWindows::default());
            windows
                .send
                .lock()
                .expect("lock")
                .insert(0, i64::from(DEFAULT_INITIAL_WINDOW_SIZE));
            let (ping_tx, pings) = mpsc::unbounded_channel();
            let (routes, client_windows) = (Arc::clone(&streams), Arc::clone(&windows));
            tokio::spawn(async move {
                let mut decoder = Decoder::new();
                let mut buf = BytesMut::new();
                loop {
                    while let Some(frame) = decoder.decode(&mut buf).expect("server speaks SPDY") {
                        let route = |id: u32, event: Event| {
                            if let Some(tx) = routes.lock().expect("lock").get(&id) {
                                let _ = tx.send(event);
                            }
                        };
                        match frame {
                            Frame::SynReply { stream_id, .. } => route(stream_id, Event::Reply),
                            Frame::Data {
                                stream_id,
                                fin,
                                data,
                            } => {
                                if !data.is_empty() {
                                    route(stream_id, Event::Data(data));
                                }
                                if fin {
                                    route(stream_id, Event::Fin);
                                }
                            }
                            Frame::RstStream { stream_id, status } => {
                                route(stream_id, Event::Reset(status))
                            }
                            Frame::WindowUpdate { stream_id, delta } => {
                                *client_windows
                                    .granted_by_server
                                    .lock()
                                    .expect("lock")
                                    .entry(stream_id)
                                    .or_default() += u64::from(delta);
                                *client_windows
                                    .send
                                    .lock()
                                    .expect("lock")
                                    .entry(stream_id)
                                    .or_insert(i64::from(DEFAULT_INITIAL_WINDOW_SIZE)) +=
                                    i64::from(delta);
                                client_windows.changed.notify_waiters();
                            }
                            other => {
                                let _ = ping_tx.send(other);
                            }
                        }
                    }
                    match read.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                routes.lock().expect("lock").clear();
            });
            Self {
                frames,
                streams,
                pings,
                windows,
                next_stream: 1,
            }
        }

        fn send(&self, frame: Frame) {
            self.frames.send(frame).expect("client writer runs");
        }

        /// Opens a stream as kubectl's `CreateStream` does and waits for its SYN_REPLY.
        async fn open(&mut self, headers: Headers) -> ClientStream {
            let id = self.next_stream;
            self.next_stream += 2;
            let (tx, rx) = mpsc::unbounded_channel();
            self.streams.lock().expect("lock").insert(id, tx);
            self.send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers,
            });
            let mut stream = ClientStream {
                id,
                events: rx,
                frames: self.frames.clone(),
                windows: Arc::clone(&self.windows),
            };
            assert_eq!(stream.next().await, Event::Reply, "stream {id} accepted");
            stream
        }

        /// Opens kubectl's pair for one local connection: the error stream (closed for
        /// writing at once, as kubectl does), then the data stream.
        async fn request(&mut self, port: u16, request_id: u32) -> (ClientStream, ClientStream) {
            let headers = |kind: &str| {
                Headers::new()
                    .with(STREAM_TYPE_HEADER, kind)
                    .with(PORT_HEADER, &port.to_string())
                    .with(REQUEST_ID_HEADER, &request_id.to_string())
            };
            let error = self.open(headers(STREAM_TYPE_ERROR)).await;
            error.fin();
            let data = self.open(headers(STREAM_TYPE_DATA)).await;
            (error, data)
        }
    }

    struct ClientStream {
        id: u32,
        events: mpsc::UnboundedReceiver<Event>,
        frames: mpsc::UnboundedSender<Frame>,
        windows: Arc<ClientWindows>,
    }

    impl ClientStream {
        async fn next(&mut self) -> Event {
            self.events.recv().await.expect("stream events")
        }

        fn send_data(&self, data: &[u8]) {
            self.frames
                .send(Frame::Data {
                    stream_id: self.id,
                    fin: false,
                    data: Bytes::copy_from_slice(data),
                })
                .expect("client writer runs");
        }

        /// Sends within the server's windows, waiting for its WINDOW_UPDATEs.
        async fn send_flow_controlled(&self, mut data: &[u8]) {
            while !data.is_empty() {
                let mut notified = pin!(self.windows.changed.notified());
                notified.as_mut().enable();
                let granted = {
                    let mut send = self.windows.send.lock().expect("lock");
                    let stream = *send
                        .entry(self.id)
                        .or_insert(i64::from(DEFAULT_INITIAL_WINDOW_SIZE));
                    let available = stream.min(send[&0]).min(16 * 1024);
                    if available > 0 {
                        let n = (available as usize).min(data.len());
                        *send.get_mut(&self.id).expect("stream") -= n as i64;
                        *send.get_mut(&0).expect("session") -= n as i64;
                        n
                    } else {
                        0
                    }
                };
                if granted == 0 {
                    notified.await;
                    continue;
                }
                self.send_data(&data[..granted]);
                data = &data[granted..];
            }
        }

        fn fin(&self) {
            self.frames
                .send(Frame::Data {
                    stream_id: self.id,
                    fin: true,
                    data: Bytes::new(),
                })
                .expect("client writer runs");
        }

        fn reset(&self) {
            self.frames
                .send(Frame::RstStream {
                    stream_id: self.id,
                    status: RstStatus::CANCEL,
                })
                .expect("client writer runs");
        }

        /// Reads until FIN, as kubectl's `io.ReadAll(errorStream)` / `io.Copy`.
        async fn read_to_fin(&mut self) -> Vec<u8> {
            let mut all = Vec::new();
            loop {
                match self.next().await {
                    Event::Data(bytes) => all.extend_from_slice(&bytes),
                    Event::Fin => return all,
                    other => panic!("stream {}: unexpected {other:?}", self.id),
                }
            }
        }

        /// Reads `len` bytes; with `grant`, gives window back in 16 KiB steps as it consumes
        /// and checks the server never has more in flight than the 64 KiB it was given.
        async fn read_exact(&mut self, len: usize, grant: bool) -> Vec<u8> {
            let mut all = Vec::with_capacity(len);
            let mut ungranted = 0usize;
            while all.len() < len {
                match self.next().await {
                    Event::Data(bytes) => {
                        all.extend_from_slice(&bytes);
                        ungranted += bytes.len();
                        if grant {
                            assert!(
                                ungranted <= DEFAULT_INITIAL_WINDOW_SIZE as usize,
                                "server sent {ungranted} bytes beyond its window"
                            );
                            if ungranted >= 16 * 1024 {
                                for stream_id in [self.id, 0] {
                                    let _ = self.frames.send(Frame::WindowUpdate {
                                        stream_id,
                                        delta: ungranted as u32,
                                    });
                                }
                                ungranted = 0;
                            }
                        }
                    }
                    other => panic!("stream {}: unexpected {other:?}", self.id),
                }
            }
            all
        }
    }

    /// Turns a deadlock into a failure instead of a hung test run (not a timing assertion:
    /// every test here finishes in well under a second).
    pub(super) async fn bounded<T>(test: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), test)
            .await
            .expect("no progress for 60 s: deadlock")
    }

    /// An echo server on 127.0.0.1 that closes its side after the client's EOF.
    pub(super) async fn echo_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = conn.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                    let _ = write.shutdown().await;
                });
            }
        });
        port
    }

    /// A port on 127.0.0.1 nobody listens on.
    pub(super) async fn closed_port() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr").port()
    }

    /// Starts `serve` on one end of an in-memory duplex, "pod" port 8080 dialling the echo
    /// server and 8081 the closed port; returns the client and the session's outcome.
    async fn start(
        config: Config,
    ) -> (
        Client,
        tokio::task::JoinHandle<Result<(), PortForwardError>>,
    ) {
        let echo = echo_server().await;
        let closed = closed_port().await;
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(serve(server_io, config, move |port: u16| {
            let target = match port {
                8080 => echo,
                8081 => closed,
                other => other,
            };
            async move { TcpStream::connect(("127.0.0.1", target)).await }
        }));
        (Client::new(client_io), session)
    }

    fn config() -> Config {
        Config::new("pod-a", "uid-1")
    }

    #[tokio::test]
    async fn forwards_concurrent_connections_both_ways() {
        bounded(forwards_concurrent_connections_both_ways_body()).await
    }

    async fn forwards_concurrent_connections_both_ways_body() {
        let (mut client, session) = start(config()).await;
        let (mut error0, mut data0) = client.request(8080, 0).await;
        let (mut error1, mut data1) = client.request(8080, 1).await;
        data1.send_data(b"one");
        data0.send_data(b"zero");
        assert_eq!(data0.read_exact(4, false).await, b"zero");
        assert_eq!(data1.read_exact(3, false).await, b"one");
        data0.send_data(b" again");
        assert_eq!(data0.read_exact(6, false).await, b" again");

        // The client half-closes: the echo server sees EOF and closes, so the data stream
        // ends; kubectl then resets it, and the error stream ends empty.
        data0.fin();
        assert_eq!(data0.read_to_fin().await, b"");
        data0.reset();
        assert_eq!(error0.read_to_fin().await, b"");

        // Request 1 is unaffected and is ended by the client's reset alone.
        data1.send_data(b"still here");
        assert_eq!(data1.read_exact(10, false).await, b"still here");
        data1.reset();
        assert_eq!(error1.read_to_fin().await, b"");

        // The client's writer ends (and shuts its side) once every stream handle is gone.
        drop((client, error0, data0, error1, data1));
        session
            .await
            .expect("joins")
            .expect("the session ends cleanly at EOF");
    }

    #[tokio::test]
    async fn dial_failure_goes_on_the_error_stream() {
        bounded(dial_failure_goes_on_the_error_stream_body()).await
    }

    async fn dial_failure_goes_on_the_error_stream_body() {
        let (mut client, _session) = start(config()).await;
        let (mut error, mut data) = client.request(8081, 0).await;
        let message = String::from_utf8(error.read_to_fin().await).expect("utf-8");
        assert!(
            message.starts_with("error forwarding port 8081 to pod pod-a, uid uid-1: "),
            "{message}"
        );
        assert!(message.contains("refused"), "{message}");
        assert_eq!(data.read_to_fin().await, b"");
    }

    #[tokio::test]
    async fn answers_the_clients_pings_only() {
        bounded(answers_the_clients_pings_only_body()).await
    }

    async fn answers_the_clients_pings_only_body() {
        let (mut client, _session) = start(config()).await;
        client.send(Frame::Ping { id: 2 });
        client.send(Frame::Ping { id: 1 });
        assert_eq!(client.pings.recv().await, Some(Frame::Ping { id: 1 }));
    }

    /// kubectl does no flow control: 1 MiB each way must pass although it never grants the
    /// server any window; the server still grants it window as the echo server consumes.
    #[tokio::test]
    async fn a_mebibyte_each_way_without_flow_control() {
        bounded(a_mebibyte_each_way_without_flow_control_body()).await
    }

    async fn a_mebibyte_each_way_without_flow_control_body() {
        let (mut client, _session) = start(config()).await;
        let (_error, mut data) = client.request(8080, 0).await;
        let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        for chunk in payload.chunks(32 * 1024) {
            data.send_data(chunk);
        }
        assert!(data.read_exact(payload.len(), false).await == payload);
        let granted = client
            .windows
            .granted_by_server
            .lock()
            .expect("lock")
            .clone();
        let consumed = payload.len() as u64;
        for stream in [data.id, 0] {
            let got = granted.get(&stream).copied().unwrap_or(0);
            assert!(
                got + u64::from(DEFAULT_INITIAL_WINDOW_SIZE) / 2 >= consumed,
                "stream {stream}: granted {got} of {consumed}"
            );
        }
    }

    /// A flow-controlling peer: it announces its window, sends only what the server grants,
    /// and the server never sends beyond what the client granted.
    #[tokio::test]
    async fn a_mebibyte_each_way_within_the_windows() {
        bounded(a_mebibyte_each_way_within_the_windows_body()).await
    }

    async fn a_mebibyte_each_way_within_the_windows_body() {
        let (mut client, _session) = start(config()).await;
        client.send(Frame::Settings {
            clear: false,
            entries: vec![Setting {
                flags: 0,
                id: Setting::INITIAL_WINDOW_SIZE,
                value: DEFAULT_INITIAL_WINDOW_SIZE,
            }],
        });
        let (_error, data) = client.request(8080, 0).await;
        let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 241) as u8).collect();
        let ClientStream {
            id,
            mut events,
            frames,
            windows,
        } = data;
        let sender = ClientStream {
            id,
            events: mpsc::unbounded_channel().1,
            frames: frames.clone(),
            windows: Arc::clone(&windows),
        };
        let upload = {
            let payload = payload.clone();
            tokio::spawn(async move { sender.send_flow_controlled(&payload).await })
        };
        let mut reader = ClientStream {
            id,
            events: std::mem::replace(&mut events, mpsc::unbounded_channel().1),
            frames,
            windows,
        };
        assert!(reader.read_exact(payload.len(), true).await == payload);
        upload
            .await
            .expect("upload finishes within the server's grants");
    }

    #[tokio::test]
    async fn refuses_invalid_streams() {
        bounded(refuses_invalid_streams_body()).await
    }

    async fn refuses_invalid_streams_body() {
        let (mut client, _session) = start(config()).await;
        let cases = [
            Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_DATA)
                .with(REQUEST_ID_HEADER, "0"),
            Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_DATA)
                .with(PORT_HEADER, "http"),
            Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_DATA)
                .with(PORT_HEADER, "0"),
            Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_DATA)
                .with(PORT_HEADER, "65536"),
            Headers::new().with(PORT_HEADER, "8080"),
            Headers::new()
                .with(STREAM_TYPE_HEADER, "resize")
                .with(PORT_HEADER, "8080"),
        ];
        for headers in cases {
            let id = client.next_stream;
            client.next_stream += 2;
            let (tx, mut rx) = mpsc::unbounded_channel();
            client.streams.lock().expect("lock").insert(id, tx);
            client.send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: headers.clone(),
            });
            assert_eq!(
                rx.recv().await,
                Some(Event::Reset(RstStatus::CANCEL)),
                "{headers:?}"
            );
        }
        // Stream IDs must be odd and increasing (spdystream's validateStreamId).
        let (tx, mut rx) = mpsc::unbounded_channel();
        client.streams.lock().expect("lock").insert(1, tx);
        client.send(Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers: Headers::new(),
        });
        assert_eq!(
            rx.recv().await,
            Some(Event::Reset(RstStatus::PROTOCOL_ERROR))
        );
    }

    /// RST_STREAM on the data stream mid-transfer drops the pod connection (the pod sees
    /// EOF) and the error stream still ends, as kubectl waits for it.
    #[tokio::test]
    async fn a_reset_closes_the_pod_connection() {
        bounded(a_reset_closes_the_pod_connection_body()).await
    }

    async fn a_reset_closes_the_pod_connection_body() {
        let pod = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let pod_port = pod.local_addr().expect("addr").port();
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let _session = tokio::spawn(serve(server_io, config(), move |_port: u16| async move {
            TcpStream::connect(("127.0.0.1", pod_port)).await
        }));
        let mut client = Client::new(client_io);
        let (mut error, data) = client.request(9000, 0).await;
        let (mut pod_conn, _) = pod.accept().await.expect("dialled");
        data.send_data(b"partial");
        let mut got = [0u8; 7];
        pod_conn
            .read_exact(&mut got)
            .await
            .expect("reaches the pod");
        assert_eq!(&got, b"partial");
        data.reset();
        let mut rest = Vec::new();
        pod_conn
            .read_to_end(&mut rest)
            .await
            .expect("pod sees the close");
        assert!(rest.is_empty());
        assert_eq!(error.read_to_fin().await, b"");
    }

    #[tokio::test]
    async fn refuses_streams_beyond_the_limit() {
        bounded(refuses_streams_beyond_the_limit_body()).await
    }

    async fn refuses_streams_beyond_the_limit_body() {
        let mut config = config();
        config.max_streams = 2;
        let (mut client, _session) = start(config).await;
        let error = |request: &str| {
            Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_ERROR)
                .with(PORT_HEADER, "8080")
                .with(REQUEST_ID_HEADER, request)
        };
        let _first = client.open(error("1")).await;
        let _second = client.open(error("2")).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        client.streams.lock().expect("lock").insert(5, tx);
        client.next_stream = 7;
        client.send(Frame::SynStream {
            stream_id: 5,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers: error("3"),
        });
        assert_eq!(
            rx.recv().await,
            Some(Event::Reset(RstStatus::REFUSED_STREAM))
        );
    }

    #[tokio::test]
    async fn an_idle_session_ends_with_goaway() {
        bounded(an_idle_session_ends_with_goaway_body()).await
    }

    async fn an_idle_session_ends_with_goaway_body() {
        let mut config = config();
        config.idle_timeout = Duration::from_millis(50);
        let (mut client, session) = start(config).await;
        assert_eq!(
            client.pings.recv().await,
            Some(Frame::GoAway {
                last_good_stream_id: 0,
                status: GoAwayStatus::OK
            })
        );
        session.await.expect("joins").expect("ends cleanly");
    }

    #[test]
    fn validates_headers_with_upstreams_messages() {
        type Validated = Result<(StreamType, u16), String>;
        let cases: Vec<(Headers, Validated)> = vec![
            (
                Headers::new()
                    .with("streamtype", "error")
                    .with("port", "8080"),
                Ok((StreamType::Error, 8080)),
            ),
            (
                Headers::new().with("streamType", "data").with("port", "1"),
                Ok((StreamType::Data, 1)),
            ),
            (
                Headers::new().with("streamType", "data"),
                Err(r#""port" header is required"#.into()),
            ),
            (
                Headers::new()
                    .with("streamType", "data")
                    .with("port", "+80"),
                Err(r#"unable to parse "+80" as a port"#.into()),
            ),
            (
                Headers::new().with("streamType", "data").with("port", "0"),
                Err(r#"port "0" must be > 0"#.into()),
            ),
            (
                Headers::new().with("port", "80"),
                Err(r#""streamType" header is required"#.into()),
            ),
            (
                Headers::new().with("streamType", "x").with("port", "80"),
                Err(r#"invalid stream type "x""#.into()),
            ),
        ];
        for (headers, want) in cases {
            assert_eq!(validate_stream(&headers), want, "{headers:?}");
        }
        // Old clients without requestID: error stream n and data stream n + 2 pair up.
        let none = Headers::new();
        assert_eq!(request_id(&none, StreamType::Error, 5), "5");
        assert_eq!(request_id(&none, StreamType::Data, 7), "5");
        let with = Headers::new().with("requestid", "9");
        assert_eq!(request_id(&with, StreamType::Data, 7), "9");
    }

    #[tokio::test]
    async fn pairs_streams_of_old_clients_by_stream_id() {
        bounded(pairs_streams_of_old_clients_by_stream_id_body()).await
    }

    async fn pairs_streams_of_old_clients_by_stream_id_body() {
        let (mut client, _session) = start(config()).await;
        let headers = |kind: &str| {
            Headers::new()
                .with(STREAM_TYPE_HEADER, kind)
                .with(PORT_HEADER, "8080")
        };
        let _error = client.open(headers(STREAM_TYPE_ERROR)).await;
        let mut data = client.open(headers(STREAM_TYPE_DATA)).await;
        data.send_data(b"old");
        assert_eq!(data.read_exact(3, false).await, b"old");
    }

    #[tokio::test]
    async fn a_request_missing_its_data_stream_times_out() {
        bounded(a_request_missing_its_data_stream_times_out_body()).await
    }

    async fn a_request_missing_its_data_stream_times_out_body() {
        let mut config = config();
        config.stream_creation_timeout = Duration::from_millis(50);
        let (mut client, _session) = start(config).await;
        let mut error = client
            .open(
                Headers::new()
                    .with(STREAM_TYPE_HEADER, STREAM_TYPE_ERROR)
                    .with(PORT_HEADER, "8080")
                    .with(REQUEST_ID_HEADER, "7"),
            )
            .await;
        let message = String::from_utf8(error.read_to_fin().await).expect("utf-8");
        assert_eq!(message, "(request=7) timed out waiting for streams");
    }

    #[tokio::test]
    async fn goaway_ends_the_session_after_its_requests() {
        bounded(goaway_ends_the_session_after_its_requests_body()).await
    }

    async fn goaway_ends_the_session_after_its_requests_body() {
        let (mut client, session) = start(config()).await;
        let (mut error, mut data) = client.request(8080, 0).await;
        client.send(Frame::GoAway {
            last_good_stream_id: 0,
            status: GoAwayStatus::OK,
        });
        // The running request still works…
        data.send_data(b"bye");
        assert_eq!(data.read_exact(3, false).await, b"bye");
        // …and no new stream is accepted.
        let (tx, mut rx) = mpsc::unbounded_channel();
        client.streams.lock().expect("lock").insert(99, tx);
        client.send(Frame::SynStream {
            stream_id: 99,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers: Headers::new()
                .with(STREAM_TYPE_HEADER, STREAM_TYPE_ERROR)
                .with(PORT_HEADER, "8080"),
        });
        data.fin();
        assert_eq!(data.read_to_fin().await, b"");
        data.reset();
        assert_eq!(error.read_to_fin().await, b"");
        session.await.expect("joins").expect("ends cleanly");
        assert_eq!(rx.recv().await, None, "stream 99 got no reply");
    }

    #[tokio::test]
    async fn garbage_ends_the_session_with_goaway() {
        bounded(garbage_ends_the_session_with_goaway_body()).await
    }

    async fn garbage_ends_the_session_with_goaway_body() {
        let (client_io, server_io) = tokio::io::duplex(4096);
        let session = tokio::spawn(serve(server_io, config(), |_port: u16| async {
            Err::<TcpStream, _>(io::Error::other("not dialled"))
        }));
        let (mut read, mut write) = tokio::io::split(client_io);
        write
            .write_all(&[0x80, 2, 0, 1, 0, 0, 0, 0])
            .await
            .expect("writes");
        let outcome = session.await.expect("joins");
        assert!(
            matches!(
                outcome,
                Err(PortForwardError::Protocol(SpdyError::UnsupportedVersion(2)))
            ),
            "{outcome:?}"
        );
        let mut bytes = BytesMut::new();
        while read.read_buf(&mut bytes).await.expect("reads") > 0 {}
        assert_eq!(
            Decoder::new().decode(&mut bytes),
            Ok(Some(Frame::GoAway {
                last_good_stream_id: 0,
                status: GoAwayStatus::PROTOCOL_ERROR
            }))
        );
    }
}

/// Interoperability with the real client: kubectl 1.32 (Go's spdystream) against `serve`,
/// behind a minimal API server on 127.0.0.1 that answers discovery, the pod GET, and upgrades
/// `pods/web/portforward` to SPDY/3.1 (the WebSocket tunnel is the streaming server's part, so
/// kubectl is told to use SPDY directly).
#[cfg(test)]
mod kubectl_interop {
    use super::*;
    use std::process::Stdio;
    use tokio::io::AsyncBufReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// Reads one request head byte by byte, so no byte of an upgraded stream is swallowed.
    async fn read_head(conn: &mut TcpStream) -> Option<String> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if conn.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        String::from_utf8(head).ok()
    }

    async fn respond(conn: &mut TcpStream, status: &str, body: &str) {
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(response.as_bytes()).await;
    }

    async fn api_connection(mut conn: TcpStream, echo: u16, closed: u16) {
        while let Some(head) = read_head(&mut conn).await {
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let path = path.split('?').next().unwrap_or("").to_string();
            match path.as_str() {
                "/api" => {
                    respond(&mut conn, "200 OK", r#"{"kind":"APIVersions","versions":["v1"],"serverAddressByClientCIDRs":[{"clientCIDR":"0.0.0.0/0","serverAddress":"127.0.0.1"}]}"#).await
                }
                "/apis" => {
                    respond(&mut conn, "200 OK", r#"{"kind":"APIGroupList","apiVersion":"v1","groups":[]}"#).await
                }
                "/api/v1" => {
                    respond(&mut conn, "200 OK", r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["get","list"],"shortNames":["po"]},{"name":"pods/portforward","singularName":"","namespaced":true,"kind":"PodPortForwardOptions","verbs":["create","get"]}]}"#).await
                }
                "/api/v1/namespaces/default/pods/web" => {
                    respond(&mut conn, "200 OK", r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"default","uid":"uid-web"},"spec":{"containers":[{"name":"c","image":"i"}]},"status":{"phase":"Running"}}"#).await
                }
                "/api/v1/namespaces/default/pods/web/portforward" => {
                    assert!(head.to_ascii_lowercase().contains("upgrade: spdy/3.1"), "{head}");
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n\
                              Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: portforward.k8s.io\r\n\r\n",
                        )
                        .await;
                    let outcome = serve(conn, Config::new("web", "uid-web"), move |port| {
                        let target = if port == 8080 { echo } else { closed };
                        async move { TcpStream::connect(("127.0.0.1", target)).await }
                    })
                    .await;
                    eprintln!("port-forward session ended: {outcome:?}");
                    return;
                }
                _ => {
                    respond(&mut conn, "404 Not Found", r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#).await
                }
            }
        }
    }

    #[tokio::test]
    #[ignore = "needs kubectl on PATH: cargo test -p flotilla-kubelet kubectl_interop -- --ignored"]
    async fn kubectl_port_forward() {
        tests::bounded(kubectl_port_forward_body()).await
    }

    async fn kubectl_port_forward_body() {
        let echo = tests::echo_server().await;
        let closed = tests::closed_port().await;
        let api = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let api_port = api.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((conn, _)) = api.accept().await {
                tokio::spawn(api_connection(conn, echo, closed));
            }
        });
        let dir = std::env::temp_dir().join(format!("pf-interop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{api_port}\n\
                 users:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: default\n\
                 current-context: x\n"
            ),
        )
        .expect("kubeconfig");
        let mut kubectl = tokio::process::Command::new("kubectl")
            .args(["--kubeconfig"])
            .arg(&kubeconfig)
            .args([
                "port-forward",
                "pod/web",
                "--address",
                "127.0.0.1",
                ":8080",
                ":8081",
            ])
            .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false")
            .env("HOME", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl runs (is it on PATH?)");
        let mut stdout = tokio::io::BufReader::new(kubectl.stdout.take().expect("stdout")).lines();
        let mut local = HashMap::new();
        while local.len() < 2 {
            let line = stdout
                .next_line()
                .await
                .expect("reads")
                .expect("kubectl prints its ports");
            // "Forwarding from 127.0.0.1:41234 -> 8080"
            if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
                let (port, remote) = rest.split_once(" -> ").expect("format");
                local.insert(remote.to_string(), port.parse::<u16>().expect("port"));
            }
        }
        let echo_local = local["8080"];

        // Two concurrent connections, a mebibyte each way on each.
        let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
        let mut transfers = Vec::new();
        for _ in 0..2 {
            let payload = payload.clone();
            transfers.push(tokio::spawn(async move {
                let conn = TcpStream::connect(("127.0.0.1", echo_local))
                    .await
                    .expect("connects");
                let (mut read, mut write) = conn.into_split();
                let upload = tokio::spawn(async move {
                    write.write_all(&payload).await.expect("uploads");
                    write.shutdown().await.expect("half-closes");
                });
                let mut back = Vec::new();
                read.read_to_end(&mut back).await.expect("downloads");
                upload.await.expect("upload joins");
                back
            }));
        }
        for transfer in transfers {
            assert!(transfer.await.expect("joins") == payload, "echoed intact");
        }

        // A port nobody listens on: kubectl reports upstream's message from the error stream.
        let mut conn = TcpStream::connect(("127.0.0.1", local["8081"]))
            .await
            .expect("connects");
        let mut nothing = Vec::new();
        let _ = conn.read_to_end(&mut nothing).await;
        let mut stderr = tokio::io::BufReader::new(kubectl.stderr.take().expect("stderr")).lines();
        loop {
            let line = stderr
                .next_line()
                .await
                .expect("reads")
                .expect("kubectl reports the error");
            if line.contains("error forwarding port 8081 to pod web, uid uid-web:") {
                break;
            }
        }
        let _ = kubectl.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}
