//! The kubelet's WebSocket streams (`flotilla_kubelet::streaming`), which clients reach through
//! the API server for exec, attach and port-forward, and which the runtime's streaming server
//! answers on: arbitrary bytes as what arrives on one WebSocket, through tungstenite's framing
//! and ours. The first byte picks the side: the runtime's port-forward channels read as a byte
//! stream (`Framing::PortChannels`, unmasked frames), kubectl's port-forward tunnel
//! (`Framing::Raw`, masked frames), or an exec session's client frames relayed to the runtime
//! (`bridge`, its options from the other bits). No panic or hang, and each side agrees with a reference: the same bytes decoded
//! by tungstenite's blocking reader, then the channel protocol applied by hand — the byte
//! stream holds exactly channel 0's payloads after each channel's 2-byte port header and stops
//! at channel 1's error; the runtime gets exactly the client's frames but v5's close frames
//! (`[255, channel]`), in order, and when the runtime ends the client gets a normal closure
//! (unless it broke the protocol); and each client frame maps to the SPDY frame upstream's
//! remote-command protocol gives it (stdin, its end, resize). The same bytes as a query and a
//! `Sec-WebSocket-Protocol` offer check `StreamOptions` and the protocol negotiation.
#![no_main]

use std::io::{Cursor, Read, Write};

use bytes::Bytes;
use flotilla_kubelet::spdy::Frame;
use flotilla_kubelet::streaming::{
    Framing, REMOTE_COMMAND_PROTOCOLS, SpdyStreams, StreamOptions, WsIo, bridge, negotiate,
};
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

/// v5's close-a-stream channel.
const CLOSE_CHANNEL: u8 = 255;

/// A blocking socket over the fuzzer's bytes: reads them, swallows what is written (pongs,
/// the close reply).
struct Wire {
    input: Cursor<Vec<u8>>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        Read::read(&mut self.input, buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The messages tungstenite's blocking reader decodes from `wire` as `role`, until the
/// connection ends or fails.
fn reference_messages(wire: &[u8], role: Role) -> Vec<Message> {
    reference_decode(wire, role).0
}

/// The messages of `wire`, and whether the peer broke the protocol (rather than closing, or
/// going away between frames).
fn reference_decode(wire: &[u8], role: Role) -> (Vec<Message>, bool) {
    let mut socket = tungstenite::WebSocket::from_raw_socket(
        Wire {
            input: Cursor::new(wire.to_vec()),
        },
        role,
        None,
    );
    let mut messages = Vec::new();
    loop {
        match socket.read() {
            Ok(message) => messages.push(message),
            Err(
                tungstenite::Error::ConnectionClosed
                | tungstenite::Error::AlreadyClosed
                | tungstenite::Error::Protocol(
                    tungstenite::error::ProtocolError::ResetWithoutClosingHandshake,
                ),
            ) => return (messages, false),
            Err(_) => return (messages, true),
        }
    }
}

/// How a byte stream over WebSocket messages ends: its bytes and then EOF, or its bytes and
/// then an error (the runtime's, on channel 1, or a broken connection's).
#[derive(Debug, PartialEq)]
enum Ending {
    Eof,
    RuntimeError(String),
    Broken,
}

/// What `WsIo` must read from `messages` (which ended with `Close` or a failure).
fn reference_stream(messages: &[Message], framing: Framing) -> (Vec<u8>, Ending) {
    let mut out = Vec::new();
    let mut port_headers_seen = [false; 2];
    for message in messages {
        match message {
            Message::Binary(data) => match framing {
                Framing::Raw => out.extend_from_slice(data),
                Framing::PortChannels => {
                    let Some((&channel, mut rest)) = data.split_first() else {
                        continue;
                    };
                    let index = usize::from(channel.min(1));
                    if !port_headers_seen[index] {
                        port_headers_seen[index] = true;
                        rest = &rest[rest.len().min(2)..];
                    }
                    match channel {
                        0 => out.extend_from_slice(rest),
                        1 if !rest.is_empty() => {
                            let text = String::from_utf8_lossy(rest).into_owned();
                            return (out, Ending::RuntimeError(text));
                        }
                        _ => {}
                    }
                }
            },
            Message::Close(_) => return (out, Ending::Eof),
            _ => {}
        }
    }
    (out, Ending::Broken)
}

/// The runtime's view of one exec session: the frames the client sent, but v5's close
/// frames, up to the client's close or failure.
fn reference_forwarded(messages: &[Message]) -> Vec<Message> {
    messages
        .iter()
        .take_while(|m| !matches!(m, Message::Close(_)))
        .filter(|m| match m {
            Message::Binary(data) => data.first() != Some(&CLOSE_CHANNEL),
            Message::Text(_) => true,
            _ => false,
        })
        .cloned()
        .collect()
}

/// One current-thread runtime for every run: the connections are in memory, so it needs no
/// IO driver and no timers, and a run's tasks interleave the same way each time.
fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

/// An in-memory connection whose far end has written `wire` and, unless it stays `open`,
/// closed its sending side; the near end's writes (pongs, close frames) fit in its buffer.
async fn connection(wire: &[u8], open: bool) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
    let (near, mut far) = tokio::io::duplex(2 * wire.len() + 4096);
    far.write_all(wire).await.expect("fits the buffer");
    if !open {
        far.shutdown().await.expect("shutdown");
    }
    (near, far)
}

/// What `WsIo` reads from `wire` as `role`.
fn byte_stream(wire: &[u8], role: Role, framing: Framing) -> (Vec<u8>, Ending) {
    runtime().block_on(async {
        let (near, _far) = connection(wire, false).await;
        let ws = WebSocketStream::from_raw_socket(near, role, None).await;
        let mut io = WsIo::new(ws, framing);
        let mut out = Vec::new();
        let ending = match io.read_to_end(&mut out).await {
            Ok(_) => Ending::Eof,
            Err(err) => match err.get_ref() {
                Some(inner) if inner.is::<tungstenite::Error>() => Ending::Broken,
                _ => Ending::RuntimeError(err.to_string()),
            },
        };
        (out, ending)
    })
}

/// One exec session whose client sends `wire` and stays connected, and whose runtime ends
/// (as its process exits) once it has the `expected` frames or the client's side is closed:
/// what the runtime received, and what the client did.
fn bridged(wire: &[u8], expected: usize) -> (Vec<Message>, Vec<Message>) {
    runtime().block_on(async {
        let (client_near, mut client_far) = connection(wire, true).await;
        let (kubelet_end, runtime_end) = tokio::io::duplex(64 * 1024);
        let client = WebSocketStream::from_raw_socket(client_near, Role::Server, None).await;
        let kubelet = WebSocketStream::from_raw_socket(kubelet_end, Role::Client, None).await;
        let mut runtime = WebSocketStream::from_raw_socket(runtime_end, Role::Server, None).await;
        let received = async move {
            let mut received = Vec::new();
            while received.len() < expected {
                match runtime.next().await {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                    Some(Ok(message @ (Message::Binary(_) | Message::Text(_)))) => {
                        received.push(message)
                    }
                    Some(Ok(_)) => {}
                }
            }
            // The runtime ends: its close frame; anything the kubelet still sends before the
            // close reply counts too.
            let _ = runtime.close(None).await;
            while let Some(Ok(message)) = runtime.next().await {
                if matches!(message, Message::Binary(_) | Message::Text(_)) {
                    received.push(message);
                }
            }
            received
        };
        let ((), received) = tokio::join!(bridge(client, kubelet), received);
        // The kubelet's end of the client's connection is gone with the session.
        let mut to_client = Vec::new();
        client_far
            .read_to_end(&mut to_client)
            .await
            .expect("an in-memory read");
        (received, reference_messages(&to_client, Role::Client))
    })
}

/// Upstream's mapping of one client frame to the runtime's SPDY streams.
fn expected_spdy_frame(streams: &SpdyStreams, message: &[u8]) -> Option<Frame> {
    let data = |stream_id: Option<u32>, fin: bool, data: &[u8]| {
        stream_id.map(|stream_id| Frame::Data {
            stream_id,
            fin,
            data: Bytes::copy_from_slice(data),
        })
    };
    match message.split_first()? {
        (0, rest) => data(streams.stdin, false, rest),
        (4, rest) => data(streams.resize, false, rest),
        (&CLOSE_CHANNEL, [0, ..]) => data(streams.stdin, true, &[]),
        _ => None,
    }
}

/// The streams planned for `options` are numbered 1, 3, 5, … in upstream's order, and the
/// runtime's streams map back to channels 1 (stdout), 2 (stderr), 3 (error).
fn check_plan(options: &StreamOptions) -> SpdyStreams {
    let (streams, opening) = SpdyStreams::plan(options);
    let planned: Vec<(&str, Option<u32>)> = vec![
        ("error", Some(streams.error)),
        ("stdin", streams.stdin),
        ("stdout", streams.stdout),
        ("stderr", streams.stderr),
        ("resize", streams.resize),
    ];
    let opened: Vec<(u32, String)> = opening
        .iter()
        .map(|frame| match frame {
            Frame::SynStream {
                stream_id, headers, ..
            } => (
                *stream_id,
                headers.get("streamType").unwrap_or_default().to_string(),
            ),
            other => panic!("a plan opens streams only: {other:?}"),
        })
        .collect();
    let wanted: Vec<(u32, String)> = planned
        .iter()
        .filter_map(|(kind, id)| Some(((*id)?, kind.to_string())))
        .collect();
    assert_eq!(opened, wanted);
    for (i, (id, _)) in opened.iter().enumerate() {
        assert_eq!(
            *id,
            2 * i as u32 + 1,
            "stream IDs are the client's odd ones"
        );
    }
    assert_eq!(streams.stdin.is_some(), options.stdin);
    assert_eq!(streams.stderr.is_some(), options.stderr && !options.tty);
    assert_eq!(streams.resize.is_some(), options.tty);
    for (channel, id) in [
        (1, streams.stdout),
        (2, streams.stderr),
        (3, Some(streams.error)),
    ] {
        if let Some(id) = id {
            assert_eq!(streams.channel_of(id), Some(channel));
        }
    }
    for id in [streams.stdin, streams.resize].into_iter().flatten() {
        assert_eq!(streams.channel_of(id), None, "a client stream is no output");
    }
    streams
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, wire)) = data.split_first() else {
        return;
    };

    let text = String::from_utf8_lossy(wire);
    let options = StreamOptions::from_query(Some(&text));
    assert!(!(options.tty && options.stderr), "a TTY merges stderr");
    if let Some(protocol) = negotiate(&text, &REMOTE_COMMAND_PROTOCOLS) {
        assert!(REMOTE_COMMAND_PROTOCOLS.contains(&protocol));
        assert!(text.split(',').any(|offered| offered.trim() == protocol));
    }

    match mode & 0x03 {
        0 => {
            // The runtime's port-forward channels (the kubelet is the WebSocket client).
            let messages = reference_messages(wire, Role::Client);
            let expected = reference_stream(&messages, Framing::PortChannels);
            assert_eq!(
                byte_stream(wire, Role::Client, Framing::PortChannels),
                expected
            );
        }
        1 => {
            // kubectl's SPDY/3.1+portforward.k8s.io tunnel (the kubelet is the server).
            let messages = reference_messages(wire, Role::Server);
            let expected = reference_stream(&messages, Framing::Raw);
            assert_eq!(byte_stream(wire, Role::Server, Framing::Raw), expected);
        }
        _ => {
            // An exec session's client frames, with stdin, stdout, stderr and tty from the
            // mode's bits.
            let (messages, broken) = reference_decode(wire, Role::Server);
            let forwarded = reference_forwarded(&messages);
            let (to_runtime, to_client) = bridged(wire, forwarded.len());
            assert_eq!(to_runtime, forwarded);
            // The runtime said nothing, then ended: the client is told the session ended —
            // normally, unless it was closing it itself (client-go reads anything else as a
            // failure of every stream) — but when it broke the protocol (tungstenite then
            // drops the connection).
            let client_closed = messages.iter().any(|m| matches!(m, Message::Close(_)));
            match to_client.last() {
                Some(Message::Close(Some(frame))) if !client_closed => {
                    assert_eq!(frame.code, CloseCode::Normal, "{to_client:?}")
                }
                Some(Message::Close(_)) => {}
                _ => assert!(broken, "no close frame: {to_client:?}"),
            }
            assert!(
                to_client
                    .iter()
                    .all(|m| matches!(m, Message::Close(_) | Message::Pong(_))),
                "{to_client:?}"
            );
            let options = StreamOptions {
                command: vec!["sh".into()],
                stdin: mode & 0x08 != 0,
                stdout: mode & 0x10 != 0,
                stderr: mode & 0x20 != 0,
                tty: mode & 0x40 != 0,
            };
            let streams = check_plan(&options);
            for message in &messages {
                if let Message::Binary(data) = message {
                    assert_eq!(
                        streams.frame_for_client_message(data),
                        expected_spdy_frame(&streams, data)
                    );
                }
            }
        }
    }
});
