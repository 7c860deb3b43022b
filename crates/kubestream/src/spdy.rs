//! SPDY/3.1 framing, as Kubernetes streaming (exec, attach, port-forward) uses it.
//!
//! kubectl up to 1.29, and every kubectl as a fallback, speaks SPDY/3.1 to the API server,
//! which passes the connection through to the kubelet. Only what those clients use is
//! here: SYN_STREAM / SYN_REPLY / HEADERS with zlib-compressed header blocks (one
//! compression context per direction for the whole connection, primed with SPDY/3's
//! dictionary), DATA, RST_STREAM, SETTINGS, PING, GOAWAY and WINDOW_UPDATE. Flow control
//! is not enforced: the Go implementation (moby/spdystream) does not enforce it either.
//!
//! The decoder reads untrusted bytes: it returns [`SpdyError`] for anything malformed and
//! never panics. [`Codec`] is a `tokio_util` codec, so a connection is a
//! `Framed<io, Codec>`; tests use it to speak raw SPDY through a proxy.

use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio_util::codec::{Decoder, Encoder};

/// SPDY protocol version carried in every control frame.
pub const VERSION: u16 = 3;
/// The `FIN` flag of DATA, SYN_STREAM and SYN_REPLY frames.
pub const FLAG_FIN: u8 = 0x01;
/// Largest payload a frame can carry (24-bit length).
pub const MAX_FRAME_LEN: usize = (1 << 24) - 1;
/// Largest decompressed header block accepted, against decompression bombs.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// Header names and values of one header block, names lowercase as SPDY/3 requires.
pub type Headers = Vec<(String, String)>;

/// One SPDY frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Opens a stream.
    SynStream {
        /// Stream id (odd when the client opens it).
        stream_id: u32,
        /// The stream this one is associated with (0 for none).
        associated_to: u32,
        /// Priority, 0 (highest) to 7.
        priority: u8,
        /// `FIN` and/or `UNIDIRECTIONAL`.
        flags: u8,
        /// The stream's headers.
        headers: Headers,
    },
    /// Accepts a stream.
    SynReply {
        /// Stream id.
        stream_id: u32,
        /// `FIN` or 0.
        flags: u8,
        /// Reply headers.
        headers: Headers,
    },
    /// Aborts a stream.
    RstStream {
        /// Stream id.
        stream_id: u32,
        /// Status code (1 protocol error, 5 cancel, ...).
        status: u32,
    },
    /// Connection settings (id, value pairs with their flags).
    Settings {
        /// Frame flags.
        flags: u8,
        /// `(flags, id, value)` entries.
        entries: Vec<(u8, u32, u32)>,
    },
    /// A ping; the receiver echoes it.
    Ping {
        /// Ping id (odd from clients, even from servers).
        id: u32,
    },
    /// The sender is closing the connection.
    GoAway {
        /// The last stream id the sender accepted.
        last_good_stream_id: u32,
        /// Status code (0 OK).
        status: u32,
    },
    /// More headers for a stream.
    Headers {
        /// Stream id.
        stream_id: u32,
        /// Frame flags.
        flags: u8,
        /// The headers.
        headers: Headers,
    },
    /// Flow-control window increase.
    WindowUpdate {
        /// Stream id (0 for the whole session in SPDY/3.1).
        stream_id: u32,
        /// Bytes added to the window.
        delta: u32,
    },
    /// Stream payload.
    Data {
        /// Stream id.
        stream_id: u32,
        /// `FIN` or 0.
        flags: u8,
        /// The payload.
        data: Bytes,
    },
    /// A control frame of a type this implementation does not know; SPDY says ignore it.
    Unknown {
        /// The frame type.
        frame_type: u16,
    },
}

impl Frame {
    /// The value of header `name` (lowercase) in a frame that carries headers.
    pub fn header(&self, name: &str) -> Option<&str> {
        let headers = match self {
            Frame::SynStream { headers, .. }
            | Frame::SynReply { headers, .. }
            | Frame::Headers { headers, .. } => headers,
            _ => return None,
        };
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why a byte sequence is not valid SPDY/3.
#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    /// A control frame names a version other than 3.
    #[error("unsupported SPDY version {0} (only SPDY/3.1 is spoken)")]
    UnsupportedVersion(u16),
    /// A control frame's length does not fit its type.
    #[error("malformed {frame} frame: length {len}")]
    BadLength {
        /// Frame kind.
        frame: &'static str,
        /// Payload length found.
        len: usize,
    },
    /// The zlib header block could not be inflated or deflated.
    #[error("header block compression: {0}")]
    Compression(String),
    /// The inflated header block is not a valid SPDY/3 name/value block.
    #[error("malformed header block: {0}")]
    HeaderBlock(&'static str),
    /// The payload is larger than a frame can carry.
    #[error("frame payload of {0} bytes exceeds SPDY's 24-bit length")]
    TooLarge(usize),
    /// Reading or writing the connection failed.
    #[error("spdy connection")]
    Io(#[from] std::io::Error),
}

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1): length-prefixed
/// header words followed by a run of common values. 1423 bytes, no trailing NUL (what
/// the Go implementation uses, and the dictionary id must match it).
pub fn dictionary() -> &'static [u8] {
    static DICT: OnceLock<Vec<u8>> = OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: &[&str] = &[
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
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
            "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
            "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1423);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// Encodes a header block (uncompressed SPDY/3 name/value block).
pub fn encode_header_block(headers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Parses an uncompressed header block; names are lowercased (Go's framer rejects
/// uppercase names; being lenient here costs nothing).
pub fn parse_header_block(mut block: &[u8]) -> Result<Headers, SpdyError> {
    fn take_u32(b: &mut &[u8]) -> Result<usize, SpdyError> {
        if b.len() < 4 {
            return Err(SpdyError::HeaderBlock("truncated length"));
        }
        let v = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        *b = &b[4..];
        Ok(v)
    }
    fn take_str(b: &mut &[u8]) -> Result<String, SpdyError> {
        let len = take_u32(b)?;
        if b.len() < len {
            return Err(SpdyError::HeaderBlock("string runs past the block"));
        }
        let s = String::from_utf8_lossy(&b[..len]).into_owned();
        *b = &b[len..];
        Ok(s)
    }
    let count = take_u32(&mut block)?;
    // Each pair takes at least 8 bytes: a count larger than that is a lie, and would
    // otherwise make us reserve memory for it.
    if count > block.len() / 8 {
        return Err(SpdyError::HeaderBlock("pair count exceeds the block"));
    }
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let name = take_str(&mut block)?;
        if name.is_empty() {
            return Err(SpdyError::HeaderBlock("empty header name"));
        }
        let value = take_str(&mut block)?;
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

/// Frame encoder and decoder for one side of a connection. It owns the two zlib
/// contexts, so one `Codec` serves exactly one connection.
pub struct Codec {
    inflate: Decompress,
    deflate: Compress,
    deflate_primed: bool,
}

impl Default for Codec {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec").finish_non_exhaustive()
    }
}

impl Codec {
    /// A codec with fresh compression contexts.
    pub fn new() -> Self {
        Codec {
            inflate: Decompress::new(true),
            deflate: Compress::new(Compression::default(), true),
            deflate_primed: false,
        }
    }

    fn inflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        loop {
            if out.capacity() - out.len() < 256 {
                out.reserve(out.capacity().max(1024));
            }
            let before_in = self.inflate.total_in();
            let before_out = self.inflate.total_out();
            let res = self
                .inflate
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = (self.inflate.total_in() - before_in) as usize;
            input = &input[consumed.min(input.len())..];
            if out.len() > MAX_HEADER_BLOCK {
                return Err(SpdyError::HeaderBlock("inflated header block too large"));
            }
            match res {
                Ok(Status::StreamEnd) => break,
                Ok(_) => {
                    let produced = self.inflate.total_out() - before_out;
                    if input.is_empty() && out.len() < out.capacity() {
                        break;
                    }
                    if consumed == 0 && produced == 0 && out.len() < out.capacity() {
                        // No progress with room to spare: the input is stuck.
                        return Err(SpdyError::Compression("inflate made no progress".into()));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate
                        .set_dictionary(dictionary())
                        .map_err(|e| SpdyError::Compression(format!("dictionary: {e}")))?;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
        }
        Ok(out)
    }

    fn deflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        if !self.deflate_primed {
            self.deflate
                .set_dictionary(dictionary())
                .map_err(|e| SpdyError::Compression(format!("dictionary: {e}")))?;
            self.deflate_primed = true;
        }
        let mut out = Vec::with_capacity(input.len() + 64);
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            let consumed = (self.deflate.total_in() - before) as usize;
            input = &input[consumed.min(input.len())..];
            // A sync flush is complete once all input is taken and the output did not
            // fill the buffer (zlib stops early only when it runs out of room).
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }

    fn headers_of(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let raw = self.inflate(block)?;
        parse_header_block(&raw)
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Decoder for Codec {
    type Item = Frame;
    type Error = SpdyError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        if src.len() < 8 {
            return Ok(None);
        }
        let len = ((src[5] as usize) << 16) | ((src[6] as usize) << 8) | src[7] as usize;
        if src.len() < 8 + len {
            src.reserve(8 + len - src.len());
            return Ok(None);
        }
        let head = src.split_to(8);
        let payload = src.split_to(len).freeze();
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            return Ok(Some(Frame::Data {
                stream_id: be32(&head[..4]) & 0x7fff_ffff,
                flags,
                data: payload,
            }));
        }
        let version = u16::from_be_bytes([head[0] & 0x7f, head[1]]);
        if version != VERSION {
            return Err(SpdyError::UnsupportedVersion(version));
        }
        let frame_type = u16::from_be_bytes([head[2], head[3]]);
        let p = &payload[..];
        let bad = |frame| SpdyError::BadLength { frame, len };
        let frame = match frame_type {
            TYPE_SYN_STREAM => {
                if len < 10 {
                    return Err(bad("SYN_STREAM"));
                }
                Frame::SynStream {
                    stream_id: be32(&p[0..4]) & 0x7fff_ffff,
                    associated_to: be32(&p[4..8]) & 0x7fff_ffff,
                    priority: p[8] >> 5,
                    flags,
                    headers: self.headers_of(&p[10..])?,
                }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                if len < 4 {
                    return Err(bad(if frame_type == TYPE_HEADERS {
                        "HEADERS"
                    } else {
                        "SYN_REPLY"
                    }));
                }
                let stream_id = be32(&p[0..4]) & 0x7fff_ffff;
                let headers = self.headers_of(&p[4..])?;
                if frame_type == TYPE_HEADERS {
                    Frame::Headers {
                        stream_id,
                        flags,
                        headers,
                    }
                } else {
                    Frame::SynReply {
                        stream_id,
                        flags,
                        headers,
                    }
                }
            }
            TYPE_RST_STREAM => {
                if len != 8 {
                    return Err(bad("RST_STREAM"));
                }
                Frame::RstStream {
                    stream_id: be32(&p[0..4]) & 0x7fff_ffff,
                    status: be32(&p[4..8]),
                }
            }
            TYPE_SETTINGS => {
                if len < 4 {
                    return Err(bad("SETTINGS"));
                }
                let n = be32(&p[0..4]) as usize;
                if n > (len - 4) / 8 {
                    return Err(bad("SETTINGS"));
                }
                let entries = (0..n)
                    .map(|i| {
                        let e = &p[4 + i * 8..12 + i * 8];
                        (e[0], be32(e) & 0x00ff_ffff, be32(&e[4..8]))
                    })
                    .collect();
                Frame::Settings { flags, entries }
            }
            TYPE_PING => {
                if len != 4 {
                    return Err(bad("PING"));
                }
                Frame::Ping { id: be32(p) }
            }
            TYPE_GOAWAY => {
                if len != 4 && len != 8 {
                    return Err(bad("GOAWAY"));
                }
                Frame::GoAway {
                    last_good_stream_id: be32(p) & 0x7fff_ffff,
                    status: if len == 8 { be32(&p[4..8]) } else { 0 },
                }
            }
            TYPE_WINDOW_UPDATE => {
                if len != 8 {
                    return Err(bad("WINDOW_UPDATE"));
                }
                Frame::WindowUpdate {
                    stream_id: be32(p) & 0x7fff_ffff,
                    delta: be32(&p[4..8]) & 0x7fff_ffff,
                }
            }
            other => Frame::Unknown { frame_type: other },
        };
        Ok(Some(frame))
    }
}

fn put_control(dst: &mut BytesMut, frame_type: u16, flags: u8, payload: &[u8]) {
    dst.put_u16(0x8000 | VERSION);
    dst.put_u16(frame_type);
    dst.put_u32(((flags as u32) << 24) | payload.len() as u32);
    dst.put_slice(payload);
}

impl Encoder<Frame> for Codec {
    type Error = SpdyError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), SpdyError> {
        let mut p = BytesMut::new();
        let (frame_type, flags) = match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if data.len() > MAX_FRAME_LEN {
                    return Err(SpdyError::TooLarge(data.len()));
                }
                dst.put_u32(stream_id & 0x7fff_ffff);
                dst.put_u32(((flags as u32) << 24) | data.len() as u32);
                dst.put_slice(&data);
                return Ok(());
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(associated_to & 0x7fff_ffff);
                p.put_u8((priority & 0x7) << 5);
                p.put_u8(0);
                let block = self.deflate(&encode_header_block(&headers))?;
                p.put_slice(&block);
                (TYPE_SYN_STREAM, flags)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                let block = self.deflate(&encode_header_block(&headers))?;
                p.put_slice(&block);
                (TYPE_SYN_REPLY, flags)
            }
            Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                let block = self.deflate(&encode_header_block(&headers))?;
                p.put_slice(&block);
                (TYPE_HEADERS, flags)
            }
            Frame::RstStream { stream_id, status } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(status);
                (TYPE_RST_STREAM, 0)
            }
            Frame::Settings { flags, entries } => {
                p.put_u32(entries.len() as u32);
                for (f, id, value) in entries {
                    p.put_u32(((f as u32) << 24) | (id & 0x00ff_ffff));
                    p.put_u32(value);
                }
                (TYPE_SETTINGS, flags)
            }
            Frame::Ping { id } => {
                p.put_u32(id);
                (TYPE_PING, 0)
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                p.put_u32(last_good_stream_id & 0x7fff_ffff);
                p.put_u32(status);
                (TYPE_GOAWAY, 0)
            }
            Frame::WindowUpdate { stream_id, delta } => {
                p.put_u32(stream_id & 0x7fff_ffff);
                p.put_u32(delta & 0x7fff_ffff);
                (TYPE_WINDOW_UPDATE, 0)
            }
            Frame::Unknown { frame_type } => (frame_type, 0),
        };
        if p.len() > MAX_FRAME_LEN {
            return Err(SpdyError::TooLarge(p.len()));
        }
        put_control(dst, frame_type, flags, &p);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frames: Vec<Frame>) -> Vec<Frame> {
        let mut tx = Codec::new();
        let mut rx = Codec::new();
        let mut buf = BytesMut::new();
        for f in frames {
            tx.encode(f, &mut buf).unwrap();
        }
        let mut out = Vec::new();
        while let Some(f) = rx.decode(&mut buf).unwrap() {
            out.push(f);
        }
        assert!(buf.is_empty());
        out
    }

    #[test]
    fn dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert!(d.starts_with(b"\x00\x00\x00\x07options\x00\x00\x00\x04head"));
        assert!(d.ends_with(b"enq=0."));
    }

    #[test]
    fn frames_roundtrip_with_shared_compression_context() {
        let h = |t: &str| vec![("streamtype".to_string(), t.to_string())];
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h("error"),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h("stdin"),
            },
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: vec![],
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hi\n"),
            },
            Frame::Ping { id: 7 },
            Frame::RstStream {
                stream_id: 3,
                status: 5,
            },
            Frame::Settings {
                flags: 0,
                entries: vec![(0, 4, 1000)],
            },
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 65536,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
        ];
        assert_eq!(roundtrip(frames.clone()), frames);
    }

    #[test]
    fn partial_input_waits_for_more() {
        let mut tx = Codec::new();
        let mut buf = BytesMut::new();
        tx.encode(Frame::Ping { id: 1 }, &mut buf).unwrap();
        let mut rx = Codec::new();
        let mut part = BytesMut::from(&buf[..5]);
        assert_eq!(rx.decode(&mut part).unwrap(), None);
        part.extend_from_slice(&buf[5..]);
        assert_eq!(rx.decode(&mut part).unwrap(), Some(Frame::Ping { id: 1 }));
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let cases: Vec<Vec<u8>> = vec![
            // version 2
            vec![0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1],
            // PING with 3 bytes
            vec![0x80, 0x03, 0x00, 0x06, 0, 0, 0, 3, 0, 0, 1],
            // SYN_STREAM too short
            vec![0x80, 0x03, 0x00, 0x01, 0, 0, 0, 2, 0, 1],
            // SYN_STREAM with garbage header block
            vec![
                0x80, 0x03, 0x00, 0x01, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xde, 0xad,
                0xbe, 0xef,
            ],
            // SETTINGS claiming 1000 entries
            vec![0x80, 0x03, 0x00, 0x04, 0, 0, 0, 4, 0, 0, 0x03, 0xe8],
            // RST_STREAM too long
            vec![
                0x80, 0x03, 0x00, 0x03, 0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0,
            ],
            // GOAWAY of 5 bytes
            vec![0x80, 0x03, 0x00, 0x07, 0, 0, 0, 5, 0, 0, 0, 1, 0],
            // WINDOW_UPDATE of 2 bytes
            vec![0x80, 0x03, 0x00, 0x09, 0, 0, 0, 2, 0, 0],
        ];
        for case in cases {
            let mut rx = Codec::new();
            let mut buf = BytesMut::from(&case[..]);
            assert!(rx.decode(&mut buf).is_err(), "accepted {case:?}");
        }
    }

    #[test]
    fn random_garbage_never_panics() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2000 {
            let n = rng.random_range(0..64);
            let mut bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
            if rng.random_bool(0.7) && bytes.len() >= 4 {
                // Make most of them look like SPDY/3 control frames to reach the parsers.
                bytes[0] = 0x80;
                bytes[1] = 0x03;
                bytes[2] = 0;
                bytes[3] = rng.random_range(0..12);
            }
            let mut rx = Codec::new();
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..8 {
                match rx.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }
    }

    #[test]
    fn header_block_rejects_lies() {
        // Claims 2^31 pairs in 4 bytes.
        assert!(parse_header_block(&[0x80, 0, 0, 0]).is_err());
        // Name length runs past the end.
        assert!(parse_header_block(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        // Empty name.
        assert!(parse_header_block(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        let ok = encode_header_block(&[("Port".into(), "80".into())]);
        assert_eq!(
            parse_header_block(&ok).unwrap(),
            vec![("port".to_string(), "80".to_string())]
        );
    }

    #[test]
    fn oversized_inflation_is_refused() {
        // A header block that inflates past MAX_HEADER_BLOCK.
        let mut tx = Codec::new();
        let big = vec![("x".to_string(), "a".repeat(MAX_HEADER_BLOCK + 10))];
        let mut buf = BytesMut::new();
        tx.encode(
            Frame::Headers {
                stream_id: 1,
                flags: 0,
                headers: big,
            },
            &mut buf,
        )
        .unwrap();
        let mut rx = Codec::new();
        assert!(matches!(
            rx.decode(&mut buf),
            Err(SpdyError::HeaderBlock(_))
        ));
    }
}
