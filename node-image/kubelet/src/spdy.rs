//! SPDY/3.1 framing, sans-IO: the frames `kubectl port-forward` speaks (SYN_STREAM, SYN_REPLY,
//! RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE, DATA) to and from bytes, with the
//! name/value header blocks compressed by zlib with SPDY/3's dictionary.
//!
//! Like Go's `spdystream` framer (the one kubectl, the API server and upstream's kubelet use),
//! each direction of a connection has ONE zlib context for all its header blocks, and every
//! block is ended with a sync flush, so a frame's block is only decodable in order, after every
//! earlier block of the same direction. A [`Codec`] therefore belongs to one connection; after
//! [`Codec::decode`] returns an error its inflate context is out of step and the connection must
//! end (send GOAWAY, close).
//!
//! Wire format (SPDY draft 3.1, section 2.2): a control frame is
//! `1 | version(15) | type(16) | flags(8) | length(24) | payload`, a data frame is
//! `0 | stream-id(31) | flags(8) | length(24) | payload`.

use std::fmt;
use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The protocol version this codec speaks (SPDY/3; 3.1 adds only session flow control).
pub const VERSION: u16 = 3;
/// The largest payload a frame's 24-bit length can carry (spdystream's `MaxDataLength`).
pub const MAX_FRAME_LENGTH: usize = (1 << 24) - 1;
/// The flow-control window every stream and the session start with (SPDY/3.1, 64 KiB).
pub const DEFAULT_INITIAL_WINDOW_SIZE: u32 = 64 * 1024;
/// The largest decompressed name/value block [`Codec`] accepts: kubectl's blocks are a few
/// dozen bytes; the bound keeps a small compressed frame from inflating into gigabytes.
pub const DEFAULT_MAX_HEADER_BLOCK: usize = 256 * 1024;

const FLAG_FIN: u8 = 0x01;
const FLAG_UNIDIRECTIONAL: u8 = 0x02;
const FLAG_SETTINGS_CLEAR: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// The zlib dictionary of SPDY/3 (draft 3.1, section 2.6.10.1): 65 length-prefixed header
/// names and values, then a run of status codes, reason phrases, dates and common values.
/// 1423 bytes, no trailing NUL; its Adler-32 (the DICTID in every SPDY/3 zlib header) is
/// `0xe3c6a7c2`, which a test checks.
pub static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const ENTRIES: [&str; 65] = [
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
        "502504505",
        "203 Non-Authoritative Information",
        "204 No Content",
        "301 Moved Permanently",
        "400 Bad Request",
        "401 Unauthorized",
        "403 Forbidden",
        "404 Not Found",
        "500 Internal Server Error",
        "501 Not Implemented",
        "503 Service Unavailable",
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec",
        " 00:00:00",
        " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,",
        "application/xhtml+xml,text/plain,text/javascript,public",
        "privatemax-age=gzip,deflate,sdch",
        "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut dictionary = Vec::with_capacity(1423);
    for entry in ENTRIES {
        dictionary.extend_from_slice(&(entry.len() as u32).to_be_bytes());
        dictionary.extend_from_slice(entry.as_bytes());
    }
    dictionary.extend_from_slice(TAIL.as_bytes());
    dictionary
});

/// Why bytes are not a SPDY/3 frame, or a frame cannot be written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdyError {
    /// A control frame of another SPDY version.
    #[error("unsupported SPDY version {0}")]
    UnsupportedVersion(u16),
    /// A frame longer than this codec accepts.
    #[error("frame of {length} bytes is larger than the {max} bytes allowed")]
    FrameTooLarge {
        /// The frame's payload length.
        length: usize,
        /// The limit.
        max: usize,
    },
    /// A control frame whose length, flags or fields break the spec.
    #[error("invalid {frame} frame: {reason}")]
    InvalidControlFrame {
        /// The frame type.
        frame: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// A frame that must name a stream names stream 0 (spdystream's `ZeroStreamId`).
    #[error("stream id zero is disallowed")]
    ZeroStreamId,
    /// A stream id with the reserved high bit set.
    #[error("stream id {0:#x} does not fit in 31 bits")]
    StreamIdTooLarge(u32),
    /// The compressed name/value block does not inflate (or deflate) with the SPDY dictionary.
    #[error("header compression: {0}")]
    Compression(String),
    /// The inflated name/value block is malformed.
    #[error("invalid header block: {0}")]
    InvalidHeaderBlock(&'static str),
    /// The inflated name/value block is larger than allowed.
    #[error("header block larger than {0} bytes")]
    HeaderBlockTooLarge(usize),
}

/// The status of a RST_STREAM frame (draft 3.1, section 2.6.3).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RstStatus(pub u32);

// The spec's whole table, though the server sends only some of them.
#[allow(dead_code)]
impl RstStatus {
    /// A generic error; the stream is torn down.
    pub const PROTOCOL_ERROR: Self = Self(1);
    /// A frame for a stream that is not active.
    pub const INVALID_STREAM: Self = Self(2);
    /// The stream was refused before any processing.
    pub const REFUSED_STREAM: Self = Self(3);
    /// The SPDY version is not supported.
    pub const UNSUPPORTED_VERSION: Self = Self(4);
    /// The stream is no longer needed (spdystream's `Stream.Reset`).
    pub const CANCEL: Self = Self(5);
    /// The endpoint failed internally.
    pub const INTERNAL_ERROR: Self = Self(6);
    /// The peer broke flow control.
    pub const FLOW_CONTROL_ERROR: Self = Self(7);
    /// A SYN_STREAM for a stream already open.
    pub const STREAM_IN_USE: Self = Self(8);
    /// Data or SYN_REPLY for a half-closed stream.
    pub const STREAM_ALREADY_CLOSED: Self = Self(9);
    /// A frame was too large to process.
    pub const FRAME_TOO_LARGE: Self = Self(11);
}

impl fmt::Debug for RstStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            1 => "PROTOCOL_ERROR",
            2 => "INVALID_STREAM",
            3 => "REFUSED_STREAM",
            4 => "UNSUPPORTED_VERSION",
            5 => "CANCEL",
            6 => "INTERNAL_ERROR",
            7 => "FLOW_CONTROL_ERROR",
            8 => "STREAM_IN_USE",
            9 => "STREAM_ALREADY_CLOSED",
            10 => "INVALID_CREDENTIALS",
            11 => "FRAME_TOO_LARGE",
            other => return write!(f, "RstStatus({other})"),
        };
        f.write_str(name)
    }
}

/// The status of a GOAWAY frame (draft 3.1, section 2.6.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoAwayStatus(pub u32);

#[allow(dead_code)] // the spec's whole table, though the server sends only some of them
impl GoAwayStatus {
    /// A normal session teardown.
    pub const OK: Self = Self(0);
    /// A generic protocol error.
    pub const PROTOCOL_ERROR: Self = Self(1);
    /// The endpoint failed internally.
    pub const INTERNAL_ERROR: Self = Self(2);
}

/// One ID/value pair of a SETTINGS frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// FLAG_SETTINGS_PERSIST_VALUE (1) / FLAG_SETTINGS_PERSISTED (2).
    pub flags: u8,
    /// The setting's 24-bit ID (e.g. [`Setting::INITIAL_WINDOW_SIZE`]).
    pub id: u32,
    /// Its value.
    pub value: u32,
}

#[allow(dead_code)] // the spec's settings port forwarding reads or tests send
impl Setting {
    /// SETTINGS_MAX_CONCURRENT_STREAMS.
    pub const MAX_CONCURRENT_STREAMS: u32 = 4;
    /// SETTINGS_INITIAL_WINDOW_SIZE: the initial flow-control window of every stream.
    pub const INITIAL_WINDOW_SIZE: u32 = 7;
}

/// A name/value header block: names are lowercase on the wire; several values of one name
/// travel NUL-separated in one value (spdystream's `headerValueSeparator`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// An empty block (what spdystream's `SendReply(http.Header{}, …)` sends).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a name (lowercased, as spdystream writes names) with its value.
    #[cfg_attr(not(test), allow(dead_code))] // clients build blocks; the server sends empty ones
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.0.push((name.to_ascii_lowercase(), value.to_string()));
        self
    }

    /// The first value of `name` (case-insensitive, like Go's `http.Header.Get`).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.split('\0').next().unwrap_or(v))
    }
}

/// One SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Opens a stream (odd IDs from the client).
    SynStream {
        /// The new stream.
        stream_id: u32,
        /// The stream this one is associated to (server push; 0 otherwise).
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        /// The credential slot (unused by Kubernetes).
        slot: u8,
        /// The sender sends nothing more on this stream (FLAG_FIN).
        fin: bool,
        /// The receiver must send nothing on this stream (FLAG_UNIDIRECTIONAL).
        unidirectional: bool,
        /// The stream's headers.
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        /// The stream.
        stream_id: u32,
        /// The sender sends nothing more on this stream.
        fin: bool,
        /// Reply headers (empty for Kubernetes streams).
        headers: Headers,
    },
    /// Aborts a stream.
    RstStream {
        /// The stream.
        stream_id: u32,
        /// Why.
        status: RstStatus,
    },
    /// Connection parameters.
    Settings {
        /// FLAG_SETTINGS_CLEAR_SETTINGS.
        clear: bool,
        /// The ID/value pairs.
        entries: Vec<Setting>,
    },
    /// A liveness check; the receiver echoes a ping whose ID parity is not its own.
    Ping {
        /// Odd from the client, even from the server.
        id: u32,
    },
    /// The sender accepts no new streams.
    GoAway {
        /// The last stream the sender processed.
        last_good_stream_id: u32,
        /// Why.
        status: GoAwayStatus,
    },
    /// More headers for a stream.
    Headers {
        /// The stream.
        stream_id: u32,
        /// The sender sends nothing more on this stream.
        fin: bool,
        /// The headers.
        headers: Headers,
    },
    /// Grants the sender `delta` more bytes on a stream (or the session, for stream 0).
    WindowUpdate {
        /// The stream, 0 for the session window (SPDY/3.1).
        stream_id: u32,
        /// The bytes granted.
        delta: u32,
    },
    /// Stream bytes.
    Data {
        /// The stream.
        stream_id: u32,
        /// The sender sends nothing more on this stream (half-close).
        fin: bool,
        /// The payload.
        data: Bytes,
    },
    /// A control frame of a type this codec does not know: the spec says to ignore it.
    Unknown {
        /// The control frame type.
        frame_type: u16,
    },
}

/// A SPDY/3.1 codec for one connection: frames to bytes with the outbound zlib context
/// ([`Encoder`]), bytes to frames with the inbound one ([`Decoder`]).
#[derive(Debug, Default)]
pub struct Codec {
    encoder: Encoder,
    decoder: Decoder,
}

impl Codec {
    /// A codec for a new connection (see [`Decoder::new`] for its limits).
    pub fn new() -> Self {
        Self::default()
    }

    /// Lowers the largest frame payload accepted (the buffer a peer can make us hold).
    pub fn with_max_frame_length(mut self, max: usize) -> Self {
        self.decoder = self.decoder.with_max_frame_length(max);
        self
    }

    /// The two directions, for a reader and a writer that run apart.
    pub fn into_parts(self) -> (Encoder, Decoder) {
        (self.encoder, self.decoder)
    }

    /// See [`Decoder::decode`].
    #[cfg_attr(not(test), allow(dead_code))] // the server uses the halves apart
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        self.decoder.decode(src)
    }

    /// See [`Encoder::encode`].
    #[cfg_attr(not(test), allow(dead_code))] // the server uses the halves apart
    pub fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), SpdyError> {
        self.encoder.encode(frame, dst)
    }
}

/// The inbound half of a [`Codec`]: bytes to frames, with the inbound zlib context.
pub struct Decoder {
    inflate: Decompress,
    /// Whether the inflate context has been given the dictionary yet.
    inflate_primed: bool,
    max_frame_length: usize,
    max_header_block: usize,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("max_frame_length", &self.max_frame_length)
            .field("max_header_block", &self.max_header_block)
            .finish_non_exhaustive()
    }
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder accepting frames up to [`MAX_FRAME_LENGTH`] and header blocks up to
    /// [`DEFAULT_MAX_HEADER_BLOCK`].
    pub fn new() -> Self {
        Self {
            inflate: Decompress::new(true),
            inflate_primed: false,
            max_frame_length: MAX_FRAME_LENGTH,
            max_header_block: DEFAULT_MAX_HEADER_BLOCK,
        }
    }

    /// Lowers the largest frame payload accepted (the buffer a peer can make us hold).
    pub fn with_max_frame_length(mut self, max: usize) -> Self {
        self.max_frame_length = max.min(MAX_FRAME_LENGTH);
        self
    }

    /// Takes one frame off the front of `src`: `Ok(None)` when `src` does not yet hold a whole
    /// frame (nothing is consumed; more capacity is reserved), an error when the bytes are not
    /// SPDY/3 (the connection cannot go on).
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        if src.len() < 8 {
            return Ok(None);
        }
        let word = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
        let flags = src[4];
        let length = usize::from(src[5]) << 16 | usize::from(src[6]) << 8 | usize::from(src[7]);
        if length > self.max_frame_length {
            return Err(SpdyError::FrameTooLarge {
                length,
                max: self.max_frame_length,
            });
        }
        if src.len() < 8 + length {
            src.reserve(8 + length - src.len());
            return Ok(None);
        }
        src.advance(8);
        let payload = src.split_to(length).freeze();
        if word & 0x8000_0000 == 0 {
            let stream_id = word & 0x7fff_ffff;
            if stream_id == 0 {
                return Err(SpdyError::ZeroStreamId);
            }
            return Ok(Some(Frame::Data {
                stream_id,
                fin: flags & FLAG_FIN != 0,
                data: payload,
            }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::UnsupportedVersion(version));
        }
        self.decode_control((word & 0xffff) as u16, flags, payload)
            .map(Some)
    }

    fn decode_control(
        &mut self,
        frame_type: u16,
        flags: u8,
        mut p: Bytes,
    ) -> Result<Frame, SpdyError> {
        let invalid = |frame, reason| SpdyError::InvalidControlFrame { frame, reason };
        let frame = match frame_type {
            TYPE_SYN_STREAM => {
                if p.len() < 10 {
                    return Err(invalid("SYN_STREAM", "shorter than 10 bytes"));
                }
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let associated_to = p.get_u32() & 0x7fff_ffff;
                let priority = p.get_u8() >> 5;
                let slot = p.get_u8();
                let headers = self.inflate_headers(&p)?;
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    slot,
                    fin: flags & FLAG_FIN != 0,
                    unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                    headers,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                let name = if frame_type == TYPE_SYN_REPLY {
                    "SYN_REPLY"
                } else {
                    "HEADERS"
                };
                if p.len() < 4 {
                    return Err(invalid(name, "shorter than 4 bytes"));
                }
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let headers = self.inflate_headers(&p)?;
                let fin = flags & FLAG_FIN != 0;
                if frame_type == TYPE_SYN_REPLY {
                    Frame::SynReply {
                        stream_id,
                        fin,
                        headers,
                    }
                } else {
                    Frame::Headers {
                        stream_id,
                        fin,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                if p.len() != 8 {
                    return Err(invalid("RST_STREAM", "length is not 8"));
                }
                let stream_id = p.get_u32() & 0x7fff_ffff;
                let status = RstStatus(p.get_u32());
                if status.0 == 0 {
                    return Err(invalid("RST_STREAM", "status 0"));
                }
                Frame::RstStream { stream_id, status }
            }
            TYPE_SETTINGS => {
                if p.len() < 4 {
                    return Err(invalid("SETTINGS", "shorter than 4 bytes"));
                }
                let count = p.get_u32() as usize;
                if p.len() != count.saturating_mul(8) {
                    return Err(invalid("SETTINGS", "length does not match the entry count"));
                }
                let entries = (0..count)
                    .map(|_| {
                        let flag_id = p.get_u32();
                        Setting {
                            flags: (flag_id >> 24) as u8,
                            id: flag_id & 0x00ff_ffff,
                            value: p.get_u32(),
                        }
                    })
                    .collect();
                Frame::Settings {
                    clear: flags & FLAG_SETTINGS_CLEAR != 0,
                    entries,
                }
            }
            TYPE_PING => {
                if p.len() != 4 {
                    return Err(invalid("PING", "length is not 4"));
                }
                if flags != 0 {
                    return Err(invalid("PING", "flags set"));
                }
                Frame::Ping { id: p.get_u32() }
            }
            TYPE_GOAWAY => {
                if p.len() != 8 {
                    return Err(invalid("GOAWAY", "length is not 8"));
                }
                Frame::GoAway {
                    last_good_stream_id: p.get_u32() & 0x7fff_ffff,
                    status: GoAwayStatus(p.get_u32()),
                }
            }
            TYPE_WINDOW_UPDATE => {
                if p.len() != 8 {
                    return Err(invalid("WINDOW_UPDATE", "length is not 8"));
                }
                Frame::WindowUpdate {
                    stream_id: p.get_u32() & 0x7fff_ffff,
                    delta: p.get_u32() & 0x7fff_ffff,
                }
            }
            // The block of an unknown frame cannot carry headers we must inflate: only the
            // three header frames touch the zlib context, so skipping keeps it in step.
            other => return Ok(Frame::Unknown { frame_type: other }),
        };
        match &frame {
            Frame::SynStream { stream_id: 0, .. }
            | Frame::SynReply { stream_id: 0, .. }
            | Frame::Headers { stream_id: 0, .. }
            | Frame::RstStream { stream_id: 0, .. }
            | Frame::Ping { id: 0 } => Err(SpdyError::ZeroStreamId),
            _ => Ok(frame),
        }
    }

    /// Inflates one header block (the whole compressed payload, ended by the sender's sync
    /// flush) and parses it.
    fn inflate_headers(&mut self, compressed: &[u8]) -> Result<Headers, SpdyError> {
        let mut block: Vec<u8> = Vec::with_capacity(compressed.len().saturating_mul(4).min(4096));
        let mut consumed = 0usize;
        loop {
            if block.len() == block.capacity() {
                if block.len() >= self.max_header_block {
                    return Err(SpdyError::HeaderBlockTooLarge(self.max_header_block));
                }
                let more = block
                    .len()
                    .max(256)
                    .min(self.max_header_block - block.len());
                block.reserve_exact(more);
            }
            let before_in = self.inflate.total_in();
            let before_out = self.inflate.total_out();
            let result = self.inflate.decompress_vec(
                &compressed[consumed..],
                &mut block,
                FlushDecompress::Sync,
            );
            consumed += (self.inflate.total_in() - before_in) as usize;
            let produced = self.inflate.total_out() - before_out;
            match result {
                Ok(Status::Ok) | Ok(Status::BufError) => {}
                Ok(Status::StreamEnd) => {
                    if consumed < compressed.len() {
                        return Err(SpdyError::Compression(
                            "bytes after the end of the zlib stream".into(),
                        ));
                    }
                    break;
                }
                Err(e) => match e.needs_dictionary() {
                    Some(_) if !self.inflate_primed => {
                        self.inflate_primed = true;
                        self.inflate
                            .set_dictionary(&DICTIONARY)
                            .map_err(|e| SpdyError::Compression(e.to_string()))?;
                        continue;
                    }
                    _ => return Err(SpdyError::Compression(e.to_string())),
                },
            }
            // Done when every input byte is in and the output had room to spare (so nothing
            // is left pending inside the inflater).
            let room = block.len() < block.capacity();
            if consumed == compressed.len() && room {
                break;
            }
            if room && produced == 0 && self.inflate.total_in() == before_in {
                return Err(SpdyError::Compression(
                    "the inflater made no progress".into(),
                ));
            }
        }
        parse_header_block(&block)
    }
}

/// The outbound half of a [`Codec`]: frames to bytes, with the outbound zlib context.
pub struct Encoder {
    deflate: Compress,
}

impl fmt::Debug for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Default for Encoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Encoder {
    /// An encoder whose header blocks are deflated at best compression with the SPDY/3
    /// dictionary, as spdystream's `zlib.NewWriterLevelDict`.
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::best(), true);
        // Setting a dictionary on a fresh deflate context cannot fail.
        let _ = deflate.set_dictionary(&DICTIONARY);
        Self { deflate }
    }

    /// Appends `frame` to `dst`. Fails for frames the spec forbids sending (stream 0, a
    /// payload over 24 bits), leaving `dst` as it was.
    pub fn encode(&mut self, frame: &Frame, dst: &mut BytesMut) -> Result<(), SpdyError> {
        match frame {
            Frame::Data {
                stream_id,
                fin,
                data,
            } => {
                check_stream_id(*stream_id)?;
                check_length(data.len())?;
                dst.reserve(8 + data.len());
                dst.put_u32(*stream_id);
                put_flags_length(dst, if *fin { FLAG_FIN } else { 0 }, data.len());
                dst.put_slice(data);
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                slot,
                fin,
                unidirectional,
                headers,
            } => {
                check_stream_id(*stream_id)?;
                let block = self.deflate_headers(headers)?;
                check_length(10 + block.len())?;
                let flags = if *fin { FLAG_FIN } else { 0 }
                    | if *unidirectional {
                        FLAG_UNIDIRECTIONAL
                    } else {
                        0
                    };
                put_control_header(dst, TYPE_SYN_STREAM, flags, 10 + block.len());
                dst.put_u32(*stream_id);
                dst.put_u32(*associated_to & 0x7fff_ffff);
                dst.put_u8((*priority & 0x07) << 5);
                dst.put_u8(*slot);
                dst.put_slice(&block);
            }
            Frame::SynReply {
                stream_id,
                fin,
                headers,
            }
            | Frame::Headers {
                stream_id,
                fin,
                headers,
            } => {
                check_stream_id(*stream_id)?;
                let block = self.deflate_headers(headers)?;
                check_length(4 + block.len())?;
                let frame_type = if matches!(frame, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                put_control_header(
                    dst,
                    frame_type,
                    if *fin { FLAG_FIN } else { 0 },
                    4 + block.len(),
                );
                dst.put_u32(*stream_id);
                dst.put_slice(&block);
            }
            Frame::RstStream { stream_id, status } => {
                check_stream_id(*stream_id)?;
                put_control_header(dst, TYPE_RST_STREAM, 0, 8);
                dst.put_u32(*stream_id);
                dst.put_u32(status.0);
            }
            Frame::Settings { clear, entries } => {
                check_length(4 + entries.len().saturating_mul(8))?;
                let flags = if *clear { FLAG_SETTINGS_CLEAR } else { 0 };
                put_control_header(dst, TYPE_SETTINGS, flags, 4 + entries.len() * 8);
                dst.put_u32(entries.len() as u32);
                for setting in entries {
                    dst.put_u32(u32::from(setting.flags) << 24 | (setting.id & 0x00ff_ffff));
                    dst.put_u32(setting.value);
                }
            }
            Frame::Ping { id } => {
                if *id == 0 {
                    return Err(SpdyError::ZeroStreamId);
                }
                put_control_header(dst, TYPE_PING, 0, 4);
                dst.put_u32(*id);
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                put_control_header(dst, TYPE_GOAWAY, 0, 8);
                dst.put_u32(*last_good_stream_id & 0x7fff_ffff);
                dst.put_u32(status.0);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                if *stream_id > 0x7fff_ffff {
                    return Err(SpdyError::StreamIdTooLarge(*stream_id));
                }
                put_control_header(dst, TYPE_WINDOW_UPDATE, 0, 8);
                dst.put_u32(*stream_id);
                dst.put_u32(*delta & 0x7fff_ffff);
            }
            Frame::Unknown { frame_type } => {
                put_control_header(dst, *frame_type, 0, 0);
            }
        }
        Ok(())
    }

    /// Serializes and compresses one header block, ending it with a sync flush (as
    /// spdystream's `headerCompressor.Flush()`), so the peer can inflate it on its own.
    fn deflate_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let mut plain = Vec::new();
        let count = u32::try_from(headers.0.len())
            .map_err(|_| SpdyError::InvalidHeaderBlock("too many headers"))?;
        plain.extend_from_slice(&count.to_be_bytes());
        for (name, value) in &headers.0 {
            for field in [name.as_bytes(), value.as_bytes()] {
                let len = u32::try_from(field.len())
                    .map_err(|_| SpdyError::InvalidHeaderBlock("header too long"))?;
                plain.extend_from_slice(&len.to_be_bytes());
                plain.extend_from_slice(field);
            }
        }
        check_length(plain.len())?;
        let mut out = Vec::with_capacity(plain.len() / 2 + 64);
        let mut consumed = 0usize;
        loop {
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&plain[consumed..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            consumed += (self.deflate.total_in() - before) as usize;
            // A sync flush is complete once all input is in and deflate stopped short of
            // filling the output.
            if consumed == plain.len() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }
}

fn check_stream_id(stream_id: u32) -> Result<(), SpdyError> {
    match stream_id {
        0 => Err(SpdyError::ZeroStreamId),
        id if id > 0x7fff_ffff => Err(SpdyError::StreamIdTooLarge(id)),
        _ => Ok(()),
    }
}

fn check_length(length: usize) -> Result<(), SpdyError> {
    if length > MAX_FRAME_LENGTH {
        return Err(SpdyError::FrameTooLarge {
            length,
            max: MAX_FRAME_LENGTH,
        });
    }
    Ok(())
}

fn put_control_header(dst: &mut BytesMut, frame_type: u16, flags: u8, length: usize) {
    dst.reserve(8 + length);
    dst.put_u16(0x8000 | VERSION);
    dst.put_u16(frame_type);
    put_flags_length(dst, flags, length);
}

fn put_flags_length(dst: &mut BytesMut, flags: u8, length: usize) {
    dst.put_u32(u32::from(flags) << 24 | (length as u32 & 0x00ff_ffff));
}

/// Parses an inflated name/value block: a 32-bit count, then 32-bit-length-prefixed names and
/// values. Rejects what spdystream rejects: names not in lowercase, a name twice, and a block
/// that is shorter or longer than its count says.
fn parse_header_block(mut block: &[u8]) -> Result<Headers, SpdyError> {
    fn field<'a>(block: &mut &'a [u8]) -> Result<&'a [u8], SpdyError> {
        if block.len() < 4 {
            return Err(SpdyError::InvalidHeaderBlock("truncated length"));
        }
        let len = block.get_u32() as usize;
        if block.len() < len {
            return Err(SpdyError::InvalidHeaderBlock("truncated name or value"));
        }
        let (value, rest) = block.split_at(len);
        *block = rest;
        Ok(value)
    }
    if block.len() < 4 {
        return Err(SpdyError::InvalidHeaderBlock("missing the header count"));
    }
    let count = block.get_u32() as usize;
    // Each pair takes at least 8 bytes: a count beyond that is a lie, not an allocation.
    if count > block.len() / 8 {
        return Err(SpdyError::InvalidHeaderBlock("count exceeds the block"));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let name = std::str::from_utf8(field(&mut block)?)
            .map_err(|_| SpdyError::InvalidHeaderBlock("name is not UTF-8"))?;
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(SpdyError::InvalidHeaderBlock("header was not lowercased"));
        }
        if headers.iter().any(|(n, _): &(String, String)| n == name) {
            return Err(SpdyError::InvalidHeaderBlock(
                "multiple headers with same name",
            ));
        }
        let value = String::from_utf8_lossy(field(&mut block)?).into_owned();
        headers.push((name.to_string(), value));
    }
    if !block.is_empty() {
        return Err(SpdyError::InvalidHeaderBlock("bytes after the last header"));
    }
    Ok(Headers(headers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in data {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        b << 16 | a
    }

    fn decode_all(codec: &mut Codec, bytes: &[u8]) -> Result<Vec<Frame>, SpdyError> {
        let mut buf = BytesMut::from(bytes);
        let mut frames = Vec::new();
        while let Some(frame) = codec.decode(&mut buf)? {
            frames.push(frame);
        }
        assert!(buf.is_empty(), "{} bytes left over", buf.len());
        Ok(frames)
    }

    fn encode(codec: &mut Codec, frame: &Frame) -> Vec<u8> {
        let mut buf = BytesMut::new();
        codec.encode(frame, &mut buf).expect("encodes");
        buf.to_vec()
    }

    fn kubectl_headers(stream_type: &str, request_id: &str) -> Headers {
        Headers::new()
            .with("streamType", stream_type)
            .with("port", "8080")
            .with("requestID", request_id)
    }

    #[test]
    fn dictionary_is_spdy3s() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert_eq!(&DICTIONARY[..11], b"\0\0\0\x07options");
        assert!(DICTIONARY.ends_with(b"utf-,*,enq=0."));
        // The DICTID every SPDY/3 implementation puts in its zlib header.
        assert_eq!(adler32(&DICTIONARY), 0xe3c6_a7c2);
    }

    /// Published vectors: Chromium's spdy_framer_test `CreateSynStreamCompressed` and
    /// `CreateSynReplyCompressed` (headers bar: foo, foo: bar; zlib window bits 11), in both the
    /// plain and the SIMD-zlib variants. Each is the first block of a fresh context.
    #[test]
    fn decodes_chromium_compressed_vectors() {
        let syn_stream: &[u8] = &[
            0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x37, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
            0x00, 0x00, 0x80, 0x00, 0x38, 0xEA, 0xE3, 0xC6, 0xA7, 0xC2, 0x02, 0xE5, 0x0E, 0x50,
            0xC2, 0x4B, 0x4A, 0x04, 0xE5, 0x0B, 0x66, 0x80, 0x00, 0x4A, 0xCB, 0xCF, 0x07, 0x08,
            0x20, 0x10, 0x95, 0x96, 0x9F, 0x0F, 0xA2, 0x00, 0x02, 0x28, 0x29, 0xB1, 0x08, 0x20,
            0x80, 0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF,
        ];
        let syn_stream_simd: &[u8] = &[
            0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x32, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
            0x00, 0x00, 0x80, 0x00, 0x38, 0xea, 0xe3, 0xc6, 0xa7, 0xc2, 0x02, 0xe5, 0x0e, 0x50,
            0xc2, 0x4b, 0x4a, 0x04, 0xe5, 0x0b, 0x66, 0x80, 0x00, 0x4a, 0xcb, 0xcf, 0x07, 0x08,
            0x20, 0x24, 0x0a, 0x20, 0x80, 0x92, 0x12, 0x8b, 0x00, 0x02, 0x08, 0x00, 0x00, 0x00,
            0xff, 0xff,
        ];
        let syn_reply: &[u8] = &[
            0x80, 0x03, 0x00, 0x02, 0x00, 0x00, 0x00, 0x31, 0x00, 0x00, 0x00, 0x01, 0x38, 0xea,
            0xe3, 0xc6, 0xa7, 0xc2, 0x02, 0xe5, 0x0e, 0x50, 0xc2, 0x4b, 0x4a, 0x04, 0xe5, 0x0b,
            0x66, 0x80, 0x00, 0x4a, 0xcb, 0xcf, 0x07, 0x08, 0x20, 0x10, 0x95, 0x96, 0x9f, 0x0f,
            0xa2, 0x00, 0x02, 0x28, 0x29, 0xb1, 0x08, 0x20, 0x80, 0x00, 0x00, 0x00, 0x00, 0xff,
            0xff,
        ];
        let headers = Headers::new().with("bar", "foo").with("foo", "bar");
        let want_stream = Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 4,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers: headers.clone(),
        };
        for bytes in [syn_stream, syn_stream_simd] {
            let frames = decode_all(&mut Codec::new(), bytes).expect("decodes");
            assert_eq!(frames, vec![want_stream.clone()]);
        }
        let frames = decode_all(&mut Codec::new(), syn_reply).expect("decodes");
        assert_eq!(
            frames,
            vec![Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers
            }]
        );
    }

    /// A SYN_STREAM built by hand from the spec: the zlib header with FDICT and the
    /// dictionary's ID, then the block as one stored (uncompressed) deflate block, which is
    /// byte-aligned and so needs no flush marker.
    #[test]
    fn decodes_a_hand_built_stored_block() {
        let mut block = Vec::new();
        block.extend_from_slice(&3u32.to_be_bytes());
        for (name, value) in [
            ("streamtype", "error"),
            ("port", "8080"),
            ("requestid", "0"),
        ] {
            block.extend_from_slice(&(name.len() as u32).to_be_bytes());
            block.extend_from_slice(name.as_bytes());
            block.extend_from_slice(&(value.len() as u32).to_be_bytes());
            block.extend_from_slice(value.as_bytes());
        }
        let len = block.len() as u16;
        let mut zlib = vec![0x78, 0xbb, 0xe3, 0xc6, 0xa7, 0xc2, 0x00];
        zlib.extend_from_slice(&len.to_le_bytes());
        zlib.extend_from_slice(&(!len).to_le_bytes());
        zlib.extend_from_slice(&block);
        let mut frame = vec![0x80, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00];
        frame[7] = (10 + zlib.len()) as u8;
        frame.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        frame.extend_from_slice(&zlib);
        let frames = decode_all(&mut Codec::new(), &frame).expect("decodes");
        assert_eq!(
            frames,
            vec![Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: kubectl_headers("error", "0"),
            }]
        );
    }

    /// Frames without header blocks have one encoding: Chromium's published vectors
    /// (RST_STREAM, SETTINGS, PING) and hand-built ones from the spec.
    #[test]
    fn encodes_exact_bytes() {
        let cases: Vec<(Frame, Vec<u8>)> = vec![
            (
                Frame::RstStream {
                    stream_id: 1,
                    status: RstStatus::PROTOCOL_ERROR,
                },
                vec![0x80, 3, 0, 3, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 1],
            ),
            (
                Frame::RstStream {
                    stream_id: 0x7fff_ffff,
                    status: RstStatus::INTERNAL_ERROR,
                },
                vec![
                    0x80, 3, 0, 3, 0, 0, 0, 8, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 6,
                ],
            ),
            (
                Frame::Settings {
                    clear: false,
                    entries: vec![Setting {
                        flags: 1,
                        id: Setting::INITIAL_WINDOW_SIZE,
                        value: 0x0a0b_0c0d,
                    }],
                },
                vec![
                    0x80, 3, 0, 4, 0, 0, 0, 0x0c, 0, 0, 0, 1, 1, 0, 0, 7, 0x0a, 0x0b, 0x0c, 0x0d,
                ],
            ),
            (
                Frame::Settings {
                    clear: false,
                    entries: vec![],
                },
                vec![0x80, 3, 0, 4, 0, 0, 0, 4, 0, 0, 0, 0],
            ),
            (
                Frame::Ping { id: 0x1234_5678 },
                vec![0x80, 3, 0, 6, 0, 0, 0, 4, 0x12, 0x34, 0x56, 0x78],
            ),
            (
                Frame::GoAway {
                    last_good_stream_id: 7,
                    status: GoAwayStatus::OK,
                },
                vec![0x80, 3, 0, 7, 0, 0, 0, 8, 0, 0, 0, 7, 0, 0, 0, 0],
            ),
            (
                Frame::WindowUpdate {
                    stream_id: 3,
                    delta: 0x1_0000,
                },
                vec![0x80, 3, 0, 9, 0, 0, 0, 8, 0, 0, 0, 3, 0, 1, 0, 0],
            ),
            (
                Frame::Data {
                    stream_id: 5,
                    fin: true,
                    data: Bytes::from_static(b"hi"),
                },
                vec![0, 0, 0, 5, 1, 0, 0, 2, b'h', b'i'],
            ),
            (
                Frame::Data {
                    stream_id: 1,
                    fin: true,
                    data: Bytes::new(),
                },
                vec![0, 0, 0, 1, 1, 0, 0, 0],
            ),
        ];
        for (frame, bytes) in cases {
            assert_eq!(encode(&mut Codec::new(), &frame), bytes, "{frame:?}");
            let decoded = decode_all(&mut Codec::new(), &bytes).expect("decodes");
            assert_eq!(decoded, vec![frame]);
        }
    }

    /// Our first header block starts with the zlib header Go's `NewWriterLevelDict` at
    /// `BestCompression` writes: CMF 0x78, FLG 0xf9 (level 3, FDICT), DICTID.
    #[test]
    fn header_blocks_start_like_gos() {
        let bytes = encode(
            &mut Codec::new(),
            &Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: Headers::new(),
            },
        );
        assert_eq!(
            &bytes[..8],
            &[0x80, 3, 0, 2, 0, 0, 0, (bytes.len() - 8) as u8]
        );
        assert_eq!(&bytes[12..18], &[0x78, 0xf9, 0xe3, 0xc6, 0xa7, 0xc2]);
        // A sync flush ends every block.
        assert!(bytes.ends_with(&[0x00, 0x00, 0xff, 0xff]));
    }

    /// Every frame round-trips, header frames sharing one zlib context per direction across
    /// the whole sequence, as on a connection.
    #[test]
    fn round_trips_a_connection() {
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: kubectl_headers("error", "0"),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 1,
                priority: 7,
                slot: 2,
                fin: true,
                unidirectional: true,
                headers: kubectl_headers("data", "0"),
            },
            Frame::SynReply {
                stream_id: 1,
                fin: false,
                headers: Headers::new(),
            },
            Frame::Headers {
                stream_id: 3,
                fin: true,
                headers: Headers::new().with("x-multi", "a\0b"),
            },
            Frame::RstStream {
                stream_id: 3,
                status: RstStatus::CANCEL,
            },
            Frame::Settings {
                clear: true,
                entries: vec![
                    Setting {
                        flags: 0,
                        id: Setting::MAX_CONCURRENT_STREAMS,
                        value: 100,
                    },
                    Setting {
                        flags: 2,
                        id: Setting::INITIAL_WINDOW_SIZE,
                        value: 1 << 20,
                    },
                ],
            },
            Frame::Ping { id: 1 },
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 0x7fff_ffff,
            },
            Frame::Data {
                stream_id: 1,
                fin: false,
                data: Bytes::from(vec![7u8; 100_000]),
            },
            Frame::SynStream {
                stream_id: 5,
                associated_to: 0,
                priority: 0,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: kubectl_headers("data", "1"),
            },
            Frame::GoAway {
                last_good_stream_id: 5,
                status: GoAwayStatus::PROTOCOL_ERROR,
            },
        ];
        let (mut sender, mut receiver) = (Codec::new(), Codec::new());
        let mut wire = BytesMut::new();
        for frame in &frames {
            sender.encode(frame, &mut wire).expect("encodes");
        }
        let decoded = decode_all(&mut receiver, &wire).expect("decodes");
        assert_eq!(decoded, frames);
        assert_eq!(
            decoded[2..4]
                .iter()
                .filter_map(|f| match f {
                    Frame::Headers { headers, .. } => headers.get("X-Multi"),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            vec!["a"]
        );
    }

    #[test]
    fn waits_for_whole_frames() {
        let mut sender = Codec::new();
        let mut wire = BytesMut::new();
        let frame = Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers: kubectl_headers("data", "4"),
        };
        sender.encode(&frame, &mut wire).expect("encodes");
        let mut receiver = Codec::new();
        let mut buf = BytesMut::new();
        for (i, byte) in wire.iter().enumerate() {
            assert_eq!(receiver.decode(&mut buf), Ok(None), "after {i} bytes");
            assert_eq!(buf.len(), i, "nothing is consumed early");
            buf.put_u8(*byte);
        }
        assert_eq!(receiver.decode(&mut buf), Ok(Some(frame)));
        assert!(buf.is_empty());
    }

    #[test]
    fn rejects_bad_frames() {
        let control = |frame_type: u16, flags: u8, payload: &[u8]| {
            let mut bytes = vec![0x80, 3];
            bytes.extend_from_slice(&frame_type.to_be_bytes());
            bytes.push(flags);
            bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
            bytes.extend_from_slice(payload);
            bytes
        };
        let plain_block = |pairs: &[(&str, &str)], count: u32| {
            let mut block = count.to_be_bytes().to_vec();
            for (n, v) in pairs {
                block.extend_from_slice(&(n.len() as u32).to_be_bytes());
                block.extend_from_slice(n.as_bytes());
                block.extend_from_slice(&(v.len() as u32).to_be_bytes());
                block.extend_from_slice(v.as_bytes());
            }
            block
        };
        // A SYN_REPLY whose block is deflated properly but says what the test wants.
        let reply_with_block = |block: &[u8]| {
            let mut deflate = Compress::new(Compression::best(), true);
            deflate.set_dictionary(&DICTIONARY).expect("dictionary");
            let mut out = Vec::with_capacity(block.len() + 64);
            deflate
                .compress_vec(block, &mut out, FlushCompress::Sync)
                .expect("deflates");
            let mut payload = vec![0, 0, 0, 1];
            payload.extend_from_slice(&out);
            control(TYPE_SYN_REPLY, 0, &payload)
        };
        let cases: Vec<(&str, Vec<u8>, SpdyError)> = vec![
            (
                "SPDY/2",
                vec![0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1],
                SpdyError::UnsupportedVersion(2),
            ),
            (
                "data on stream 0",
                vec![0, 0, 0, 0, 0, 0, 0, 1, 9],
                SpdyError::ZeroStreamId,
            ),
            (
                "ping 0",
                control(TYPE_PING, 0, &[0, 0, 0, 0]),
                SpdyError::ZeroStreamId,
            ),
            (
                "ping with flags",
                control(TYPE_PING, 1, &[0, 0, 0, 1]),
                SpdyError::InvalidControlFrame {
                    frame: "PING",
                    reason: "flags set",
                },
            ),
            (
                "short ping",
                control(TYPE_PING, 0, &[0, 0, 1]),
                SpdyError::InvalidControlFrame {
                    frame: "PING",
                    reason: "length is not 4",
                },
            ),
            (
                "rst status 0",
                control(TYPE_RST_STREAM, 0, &[0, 0, 0, 1, 0, 0, 0, 0]),
                SpdyError::InvalidControlFrame {
                    frame: "RST_STREAM",
                    reason: "status 0",
                },
            ),
            (
                "rst on stream 0",
                control(TYPE_RST_STREAM, 0, &[0, 0, 0, 0, 0, 0, 0, 5]),
                SpdyError::ZeroStreamId,
            ),
            (
                "settings count lies",
                control(
                    TYPE_SETTINGS,
                    0,
                    &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 7, 0, 0, 0, 1],
                ),
                SpdyError::InvalidControlFrame {
                    frame: "SETTINGS",
                    reason: "length does not match the entry count",
                },
            ),
            (
                "goaway too short",
                control(TYPE_GOAWAY, 0, &[0, 0, 0, 1]),
                SpdyError::InvalidControlFrame {
                    frame: "GOAWAY",
                    reason: "length is not 8",
                },
            ),
            (
                "syn_stream too short",
                control(TYPE_SYN_STREAM, 0, &[0, 0, 0, 1, 0, 0, 0, 0, 0]),
                SpdyError::InvalidControlFrame {
                    frame: "SYN_STREAM",
                    reason: "shorter than 10 bytes",
                },
            ),
            (
                "header block that is not zlib",
                control(TYPE_SYN_REPLY, 0, &[0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef]),
                SpdyError::Compression("invalid stream".into()),
            ),
            (
                "uppercase name",
                reply_with_block(&plain_block(&[("Port", "1")], 1)),
                SpdyError::InvalidHeaderBlock("header was not lowercased"),
            ),
            (
                "name twice",
                reply_with_block(&plain_block(&[("port", "1"), ("port", "2")], 2)),
                SpdyError::InvalidHeaderBlock("multiple headers with same name"),
            ),
            (
                "count larger than the block",
                reply_with_block(&plain_block(&[("port", "1")], 1_000_000)),
                SpdyError::InvalidHeaderBlock("count exceeds the block"),
            ),
            (
                "bytes after the last header",
                reply_with_block(&[plain_block(&[("port", "1")], 1), vec![0]].concat()),
                SpdyError::InvalidHeaderBlock("bytes after the last header"),
            ),
            (
                "truncated value",
                reply_with_block(&plain_block(&[("port", "1")], 1)[..16]),
                SpdyError::InvalidHeaderBlock("truncated name or value"),
            ),
        ];
        for (name, bytes, want) in cases {
            let got = decode_all(&mut Codec::new(), &bytes);
            match (&got, &want) {
                // zlib's message text is the backend's; only the kind matters.
                (Err(SpdyError::Compression(_)), SpdyError::Compression(_)) => {}
                _ => assert_eq!(got, Err(want), "{name}"),
            }
        }
    }

    #[test]
    fn bounds_what_a_peer_can_make_us_hold() {
        // A length over the limit fails at once, before the payload arrives.
        let mut codec = Codec::new().with_max_frame_length(1024);
        let mut buf = BytesMut::from(&[0, 0, 0, 1, 0, 0x10, 0, 0][..]);
        assert_eq!(
            codec.decode(&mut buf),
            Err(SpdyError::FrameTooLarge {
                length: 0x10_0000,
                max: 1024
            })
        );
        // A block that inflates past the bound fails without inflating it all.
        let mut sender = Codec::new();
        let mut wire = BytesMut::new();
        let huge = "x".repeat(DEFAULT_MAX_HEADER_BLOCK + 1);
        sender
            .encode(
                &Frame::Headers {
                    stream_id: 1,
                    fin: false,
                    headers: Headers::new().with("big", &huge),
                },
                &mut wire,
            )
            .expect("encodes");
        assert!(wire.len() < 4096, "compresses well: {}", wire.len());
        assert_eq!(
            decode_all(&mut Codec::new(), &wire),
            Err(SpdyError::HeaderBlockTooLarge(DEFAULT_MAX_HEADER_BLOCK))
        );
        // What cannot be sent is refused, leaving the buffer alone.
        let mut buf = BytesMut::new();
        for frame in [
            Frame::Data {
                stream_id: 0,
                fin: false,
                data: Bytes::new(),
            },
            Frame::Data {
                stream_id: 1,
                fin: false,
                data: Bytes::from(vec![0; MAX_FRAME_LENGTH + 1]),
            },
            Frame::Ping { id: 0 },
            Frame::RstStream {
                stream_id: 0x8000_0001,
                status: RstStatus::CANCEL,
            },
        ] {
            assert!(sender.encode(&frame, &mut buf).is_err(), "{frame:?}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn skips_unknown_control_frames() {
        let mut bytes = vec![0x80, 3, 0, 0x0a, 0, 0, 0, 3, 1, 2, 3];
        bytes.extend_from_slice(&[0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 9]);
        let frames = decode_all(&mut Codec::new(), &bytes).expect("decodes");
        assert_eq!(
            frames,
            vec![Frame::Unknown { frame_type: 0x0a }, Frame::Ping { id: 9 }]
        );
    }

    /// Garbage never panics: a deterministic stream of pseudo-random bytes (xorshift), fed in
    /// uneven chunks, either decodes or fails cleanly.
    #[test]
    fn garbage_never_panics() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..2000 {
            let len = (next() % 64) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && bytes.len() >= 8 {
                // Make it look like a SPDY/3 control frame of a known type with a fitting
                // length, so the deeper parsers run too.
                bytes[0] = 0x80;
                bytes[1] = 3;
                bytes[2] = 0;
                bytes[3] = (next() % 10) as u8;
                let payload = (bytes.len() - 8) as u8;
                bytes[5] = 0;
                bytes[6] = 0;
                bytes[7] = payload;
            }
            let mut codec = Codec::new().with_max_frame_length(1 << 16);
            let mut buf = BytesMut::new();
            for chunk in bytes.chunks(1 + (next() % 7) as usize) {
                buf.extend_from_slice(chunk);
                match codec.decode(&mut buf) {
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
    }
}
