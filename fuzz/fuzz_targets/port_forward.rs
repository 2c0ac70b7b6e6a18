//! The kubelet's port-forward session (`flotilla_kubelet::portforward::serve`), which
//! `kubectl port-forward` reaches through the API server's tunnel: the input is read as a
//! client's frames — streams opened with any headers (stream types, ports, request ids, good
//! and bad), data, resets, pings, settings, window updates, GOAWAY, and raw bytes between
//! them — sent on one connection and then closed. Port 1 answers as an echo server, port 2
//! refuses, any other closes at once. No panic; the session ends (on paused time: every
//! timeout the session has runs out, none waits for real); and what the server writes back
//! is well-formed SPDY/3.1.
#![no_main]

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use flotilla_kubelet::portforward::{Config, serve};
use flotilla_kubelet::spdy::{Codec, Frame, GoAwayStatus, Headers, RstStatus, Setting};
use libfuzzer_sys::arbitrary::{self, Unstructured};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

/// A frame the client sends, or raw bytes it writes between frames.
type Sent = Result<Frame, Vec<u8>>;

/// One client frame (or raw bytes) from the input.
fn frame(input: &mut Unstructured) -> arbitrary::Result<Sent> {
    let stream_id = u32::from(input.int_in_range(0u8..=9)?);
    Ok(Ok(match input.int_in_range(0u8..=8)? {
        0 | 1 => {
            let mut headers = Headers::new();
            if input.arbitrary()? {
                let kind = *input.choose(&["data", "error", "other", ""])?;
                headers = headers.with("streamType", kind);
            }
            if input.arbitrary()? {
                let port = *input.choose(&["1", "2", "3", "0", "65536", "x", ""])?;
                headers = headers.with("port", port);
            }
            if input.arbitrary()? {
                let id = input.int_in_range(0u8..=3)?.to_string();
                headers = headers.with("requestID", &id);
            }
            Frame::SynStream {
                stream_id,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: input.ratio(1, 8)?,
                unidirectional: input.ratio(1, 8)?,
                headers,
            }
        }
        2 | 3 => {
            let len = input.int_in_range(0usize..=64)?;
            Frame::Data {
                stream_id,
                fin: input.ratio(1, 4)?,
                data: Bytes::copy_from_slice(input.bytes(len.min(input.len()))?),
            }
        }
        4 => Frame::RstStream {
            stream_id,
            status: RstStatus(input.int_in_range(0..=12)?),
        },
        5 => Frame::Ping {
            id: input.arbitrary()?,
        },
        6 => Frame::Settings {
            clear: input.arbitrary()?,
            entries: vec![Setting {
                flags: 0,
                id: Setting::INITIAL_WINDOW_SIZE,
                value: input.int_in_range(0..=1 << 17)?,
            }],
        },
        7 => Frame::WindowUpdate {
            stream_id,
            delta: input.int_in_range(0..=1 << 17)?,
        },
        _ => {
            if input.ratio(1, 2)? {
                Frame::GoAway {
                    last_good_stream_id: stream_id,
                    status: GoAwayStatus::OK,
                }
            } else {
                let len = input.int_in_range(0usize..=16)?;
                return Ok(Err(input.bytes(len.min(input.len()))?.to_vec()));
            }
        }
    }))
}

/// The pod's side of a dialled port.
async fn pod(port: u16) -> std::io::Result<DuplexStream> {
    let (ours, mut theirs) = tokio::io::duplex(4096);
    match port {
        1 => {
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                while let Ok(read @ 1..) = theirs.read(&mut buffer).await {
                    if theirs.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                }
            });
            Ok(ours)
        }
        2 => Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )),
        _ => Ok(ours),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Unstructured::new(data);
    let mut codec = Codec::new();
    let mut wire = BytesMut::new();
    while !input.is_empty() {
        match frame(&mut input) {
            Ok(Ok(frame)) => {
                if codec.encode(&frame, &mut wire).is_err() {
                    return;
                }
            }
            Ok(Err(raw)) => wire.extend_from_slice(&raw),
            Err(_) => break,
        }
    }
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
    else {
        return;
    };
    runtime.block_on(async move {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let config = Config {
            pod: "fuzz".to_string(),
            uid: String::new(),
            stream_creation_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(4 * 60 * 60),
            close_grace: Duration::from_secs(1),
            max_streams: 8,
            stream_buffer: 4096,
            max_frame_length: 1 << 16,
        };
        let session = tokio::spawn(serve(server, config, pod));
        let (mut read, mut write) = tokio::io::split(&mut client);
        let send = async {
            let _ = write.write_all(&wire).await;
            let _ = write.shutdown().await;
        };
        let mut answer = Vec::new();
        let receive = read.read_to_end(&mut answer);
        let (_, _) = tokio::join!(send, receive);
        let ended = tokio::time::timeout(Duration::from_secs(5 * 60 * 60), session).await;
        assert!(ended.is_ok(), "the session did not end");
        let mut answer = BytesMut::from(answer.as_slice());
        let mut decoder = Codec::new();
        loop {
            match decoder.decode(&mut answer) {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(err) => panic!("the server wrote malformed SPDY: {err}"),
            }
        }
    });
});
