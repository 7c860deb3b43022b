//! Exec and attach sessions with a real process behind them, over either transport.
//!
//! [`serve`] takes the upgraded connection and a function that runs the process: it sets
//! up the client's streams, hands the process a [`ProcessIo`] (a pipe for stdin, an
//! [`Output`] each for stdout and stderr, and the terminal resize events), pumps bytes both
//! ways while it runs, and when it ends sends what is left of its output, then the outcome
//! on the error channel (the v4+ `Status` carrying a non-zero exit code, which kubectl
//! turns into its own exit code).
//!
//! Output is the hot path (`kubectl exec ... cat big-file`): a process's pipe handed over
//! with [`Output::pump_from`] is read by the session itself, straight into the buffer its
//! frames are written from (the frame header goes in room kept in front of the data), so
//! between the process's pipe and the TLS layer the bytes are not copied at all.
//!
//! If the client goes away first, the process future is dropped (a provider that spawns
//! with `kill_on_drop` ends the process with it).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use base64::Engine as _;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::codec::Framed;
use tokio_util::sync::PollSender;

use crate::channel::{
    CH_CLOSE, CH_ERROR, CH_RESIZE, CH_STDERR, CH_STDIN, CH_STDOUT, failure_message, is_v4_or_later,
};
use crate::spdy::{Codec, FLAG_FIN, Frame, SpdyError};
use crate::upgrade::Transport;

/// WebSocket subprotocols of exec and attach, newest first, with the base64 text variants.
pub const WS_EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// Size of the stdin pipe between the session and the process.
const PIPE: usize = 256 * 1024;
/// The most output read for one frame or message: large, because every message costs a
/// frame, a flush and TLS record writes however small it is. A session's read buffer
/// starts at [`FIRST_CHUNK`] and grows towards this while the reader keeps filling it (a
/// process writing faster than the client takes its output, into a pipe larger than the
/// default 64 KiB), so an idle or chatty session holds little.
const CHUNK: usize = 1024 * 1024;
/// Room for output in a session's read buffer at first.
const FIRST_CHUNK: usize = 64 * 1024;
/// The most of one write to an [`Output`] taken as one chunk (a longer write is taken in
/// parts): with [`QUEUED`] chunks waiting, what a session may hold for a fast writer.
const WRITE_CHUNK: usize = 128 * 1024;
/// Room kept in front of each chunk of output for the header of the frame that carries
/// it: a WebSocket header (at most 10 bytes) and the channel byte, or a SPDY data frame
/// header (8 bytes).
const HEADROOM: usize = 11;
/// Chunks written to an [`Output`] that wait for the session before a write waits too.
const QUEUED: usize = 4;

/// Which standard streams the client asked for (`input`, `output`, `error`, `tty`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    /// `input=1`.
    pub stdin: bool,
    /// `output=1`.
    pub stdout: bool,
    /// `error=1` (ignored with a tty: a terminal has one output).
    pub stderr: bool,
    /// `tty=1`.
    pub tty: bool,
}

/// A terminal size the client reports (on start and whenever its window changes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The process's side of the session.
#[derive(Debug)]
pub struct ProcessIo {
    /// What the client types; end of file when the client closes its stdin.
    pub stdin: Option<DuplexStream>,
    /// Where the process's standard output goes (drop or shut down to end it).
    pub stdout: Option<Output>,
    /// Where its standard error goes (`None` with a tty).
    pub stderr: Option<Output>,
    /// Terminal resize events (only with a tty).
    pub resize: mpsc::Receiver<TerminalSize>,
    /// Whether the client asked for a terminal.
    pub tty: bool,
}

type Reader = Box<dyn AsyncRead + Send + Unpin>;

/// What an [`Output`] passes to the session.
enum Feed {
    /// Bytes written to it: [`HEADROOM`] bytes of room, then the data.
    Data(Vec<u8>),
    /// A source the session reads itself up to its end, then says so.
    Reader(Reader, oneshot::Sender<()>),
}

/// Where one output stream of the process (stdout or stderr) goes: the session sends
/// what arrives to the client on that stream.
///
/// Two ways in. [`Output::pump_from`] hands the session a reader (typically the process's
/// pipe), which it reads straight into the buffer its frames are written from: no copy
/// between the pipe and the TLS layer. Or write to it ([`AsyncWrite`]): one copy per write.
/// Shutting it down, or dropping it, ends the stream.
pub struct Output {
    tx: PollSender<Feed>,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("closed", &self.tx.is_closed())
            .finish()
    }
}

impl Output {
    /// Sends everything `from` yields (up to its end of file or first read error), after
    /// what was written before, then ends the stream. The session reads `from` itself;
    /// this returns once it has sent the last of it (or the session is gone).
    pub async fn pump_from<R>(self, from: R)
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let Some(tx) = self.tx.get_ref().cloned() else {
            return;
        };
        drop(self);
        let (done_tx, done_rx) = oneshot::channel();
        if tx.send(Feed::Reader(Box::new(from), done_tx)).await.is_ok() {
            drop(tx);
            let _ = done_rx.await;
        }
    }
}

fn session_gone() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the exec session has ended")
}

impl AsyncWrite for Output {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        if ready!(this.tx.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(session_gone()));
        }
        let n = buf.len().min(WRITE_CHUNK);
        let mut chunk = Vec::with_capacity(HEADROOM + n);
        chunk.resize(HEADROOM, 0);
        chunk.extend_from_slice(&buf[..n]);
        match this.tx.send_item(Feed::Data(chunk)) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(session_gone())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().tx.close();
        Poll::Ready(Ok(()))
    }
}

/// The session's end of one [`Output`].
struct Source {
    rx: mpsc::Receiver<Feed>,
    reading: Option<(Reader, oneshot::Sender<()>)>,
}

/// A chunk of output ready to send.
enum Chunk {
    /// `n` bytes read into the session's buffer, after its [`HEADROOM`].
    Read(usize),
    /// Bytes written to the [`Output`], after their [`HEADROOM`].
    Written(Vec<u8>),
}

impl Source {
    /// The next chunk (reads go to `buf[HEADROOM..]`); `None` once the stream ended.
    /// Cancel-safe: every await is, and no state changes across one.
    async fn next(&mut self, buf: &mut [u8]) -> Option<Chunk> {
        loop {
            if let Some((reader, _)) = self.reading.as_mut() {
                match reader.read(&mut buf[HEADROOM..]).await {
                    Ok(n) if n > 0 => return Some(Chunk::Read(n)),
                    // The end of the reader (or it failed): say so, then what follows.
                    _ => self.reading = None,
                }
            }
            match self.rx.recv().await? {
                Feed::Data(chunk) => return Some(Chunk::Written(chunk)),
                Feed::Reader(reader, done) => self.reading = Some((reader, done)),
            }
        }
    }
}

/// The next chunk of an optional source; pending forever when there is none.
async fn next_opt(source: &mut Option<Source>, buf: &mut [u8]) -> Option<Chunk> {
    match source {
        Some(s) => s.next(buf).await,
        None => std::future::pending().await,
    }
}

/// A reusable buffer for reads of output: [`HEADROOM`], then room for a chunk.
fn read_buf() -> Vec<u8> {
    vec![0; HEADROOM + FIRST_CHUNK]
}

/// After a read of `n` bytes into `buf`: one that filled it came from a producer faster
/// than the session, so the buffer doubles (up to [`CHUNK`]) and the next frames carry
/// more for the same per-frame cost.
fn grow_after_read(buf: &mut Vec<u8>, n: usize) {
    let room = buf.len() - HEADROOM;
    if n == room && room < CHUNK {
        buf.resize(HEADROOM + (room * 2).min(CHUNK), 0);
    }
}

/// Writes `frame` (a whole frame) straight to the connection, bypassing the framing
/// layer, and flushes it.
async fn write_raw<W: AsyncWrite + Unpin>(io: &mut W, frame: &[u8]) -> std::io::Result<()> {
    io.write_all(frame).await?;
    io.flush().await
}

/// Puts a WebSocket binary message header and `channel` in front of the data in `chunk`
/// (which starts at [`HEADROOM`]); answers where the frame starts.
fn ws_binary_frame(chunk: &mut [u8], channel: u8) -> usize {
    let len = chunk.len() - HEADROOM + 1;
    chunk[HEADROOM - 1] = channel;
    let mut header = [0u8; 10];
    // FIN and the binary opcode; a server's frames are not masked.
    header[0] = 0x82;
    let header_len = if len < 126 {
        header[1] = len as u8;
        2
    } else if let Ok(short) = u16::try_from(len) {
        header[1] = 126;
        header[2..4].copy_from_slice(&short.to_be_bytes());
        4
    } else {
        header[1] = 127;
        header[2..10].copy_from_slice(&(len as u64).to_be_bytes());
        10
    };
    let start = HEADROOM - 1 - header_len;
    chunk[start..HEADROOM - 1].copy_from_slice(&header[..header_len]);
    start
}

/// Puts a SPDY data frame header (no flags) in front of the data in `chunk` (which starts
/// at [`HEADROOM`]); answers where the frame starts.
fn spdy_data_frame(chunk: &mut [u8], stream_id: u32) -> usize {
    let len = (chunk.len() - HEADROOM) as u32;
    let start = HEADROOM - 8;
    chunk[start..start + 4].copy_from_slice(&(stream_id & 0x7fff_ffff).to_be_bytes());
    chunk[start + 4..HEADROOM].copy_from_slice(&len.to_be_bytes());
    start
}

/// How the process ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It exited with this code (0 is success).
    Exited(i32),
    /// It could not run, or failed in a way that has no exit code; the text goes to the
    /// client's error channel.
    Failed(String),
}

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The SPDY connection broke or sent something malformed.
    #[error("SPDY session")]
    Spdy(#[from] SpdyError),
    /// The WebSocket connection broke or sent something malformed.
    #[error("WebSocket session")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    /// Writing to the connection or to the process's stdin pipe failed.
    #[error("connection or process pipe")]
    Io(#[from] std::io::Error),
}

/// The error-channel payload of an outcome: a `Status` for v4+, plain text before (and
/// nothing for a success).
pub fn status_payload(protocol: &str, command: &[String], outcome: &Outcome) -> String {
    let v4 = is_v4_or_later(protocol);
    match outcome {
        Outcome::Exited(0) if v4 => json!({"metadata": {}, "status": "Success"}).to_string(),
        Outcome::Exited(0) => String::new(),
        Outcome::Exited(code) if v4 => json!({
            "metadata": {},
            "status": "Failure",
            "message": failure_message(command, *code),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        })
        .to_string(),
        Outcome::Exited(code) => failure_message(command, *code),
        Outcome::Failed(msg) if v4 => json!({
            "metadata": {},
            "status": "Failure",
            "message": msg,
            "reason": "InternalError",
            "code": 500,
        })
        .to_string(),
        Outcome::Failed(msg) => msg.clone(),
    }
}

struct Pipes {
    io: ProcessIo,
    stdin: Option<DuplexStream>,
    stdout: Option<Source>,
    stderr: Option<Source>,
    resize: mpsc::Sender<TerminalSize>,
}

fn pipes(streams: Streams) -> Pipes {
    let pair = |on: bool| {
        if on {
            let (a, b) = tokio::io::duplex(PIPE);
            (Some(a), Some(b))
        } else {
            (None, None)
        }
    };
    let output = |on: bool| {
        if on {
            let (tx, rx) = mpsc::channel(QUEUED);
            let source = Source { rx, reading: None };
            (
                Some(source),
                Some(Output {
                    tx: PollSender::new(tx),
                }),
            )
        } else {
            (None, None)
        }
    };
    let (stdin_ours, stdin_theirs) = pair(streams.stdin);
    let (stdout_ours, stdout_theirs) = output(streams.stdout);
    let (stderr_ours, stderr_theirs) = output(streams.stderr && !streams.tty);
    let (resize, resize_rx) = mpsc::channel(8);
    Pipes {
        io: ProcessIo {
            stdin: stdin_theirs,
            stdout: stdout_theirs,
            stderr: stderr_theirs,
            resize: resize_rx,
            tty: streams.tty,
        },
        stdin: stdin_ours,
        stdout: stdout_ours,
        stderr: stderr_ours,
        resize,
    }
}

fn parse_resizes(data: &[u8], out: &mpsc::Sender<TerminalSize>) {
    for size in serde_json::Deserializer::from_slice(data)
        .into_iter::<TerminalSize>()
        .map_while(Result::ok)
    {
        let _ = out.try_send(size);
    }
}

/// Serves one exec or attach session on an upgraded connection until the process ends
/// and its output is delivered, or the client goes.
pub async fn serve<IO, F, Fut>(
    io: IO,
    transport: Transport,
    protocol: &str,
    streams: Streams,
    command: &[String],
    run: F,
) -> Result<(), SessionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(ProcessIo) -> Fut,
    Fut: Future<Output = Outcome>,
{
    match transport {
        Transport::Spdy => spdy(io, protocol, streams, command, run).await,
        Transport::WebSocket => {
            let ws = WebSocketStream::from_raw_socket(
                io,
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            websocket(ws, protocol, streams, command, run).await
        }
    }
}

async fn spdy<IO, F, Fut>(
    io: IO,
    protocol: &str,
    streams: Streams,
    command: &[String],
    run: F,
) -> Result<(), SessionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(ProcessIo) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let mut conn = Framed::new(io, Codec::new());
    let mut types: HashMap<u32, String> = HashMap::new();
    let id_of = |types: &HashMap<u32, String>, t: &str| {
        types.iter().find(|(_, v)| v.as_str() == t).map(|(k, _)| *k)
    };
    let mut expected = vec!["error"];
    if streams.stdin {
        expected.push("stdin");
    }
    if streams.stdout {
        expected.push("stdout");
    }
    if streams.stderr && !streams.tty {
        expected.push("stderr");
    }
    let Pipes {
        io: process_io,
        stdin: mut stdin_w,
        stdout: mut stdout_r,
        stderr: mut stderr_r,
        resize,
    } = pipes(streams);
    let mut last_stream = 0u32;

    // Every frame the client sends, in setup and while the process runs.
    macro_rules! on_frame {
        ($frame:expr) => {{
            let frame = $frame;
            match frame {
                Frame::SynStream {
                    stream_id, flags, ..
                } => {
                    let kind = frame.header("streamtype").unwrap_or("").to_string();
                    last_stream = last_stream.max(stream_id);
                    conn.send(Frame::SynReply {
                        stream_id,
                        flags: 0,
                        headers: vec![],
                    })
                    .await?;
                    if kind == "stdin" && flags & FLAG_FIN != 0 {
                        stdin_w = None;
                    }
                    types.insert(stream_id, kind);
                }
                Frame::Data {
                    stream_id,
                    flags,
                    data,
                } => match types.get(&stream_id).map(String::as_str) {
                    Some("stdin") => {
                        if let Some(w) = stdin_w.as_mut()
                            && !data.is_empty()
                            && w.write_all(&data).await.is_err()
                        {
                            stdin_w = None;
                        }
                        if flags & FLAG_FIN != 0 {
                            stdin_w = None;
                        }
                    }
                    Some("resize") => parse_resizes(&data, &resize),
                    _ => {}
                },
                Frame::RstStream { stream_id, .. }
                    if types.get(&stream_id).map(String::as_str) == Some("stdin") =>
                {
                    stdin_w = None;
                }
                Frame::Ping { id } => conn.send(Frame::Ping { id }).await?,
                Frame::GoAway { .. } => return Ok(()),
                _ => {}
            }
        }};
    }

    // Setup: the client opens one stream per standard stream, plus error (and resize).
    while !expected.iter().all(|t| id_of(&types, t).is_some()) {
        match conn.next().await {
            None => return Ok(()),
            Some(Err(e)) => {
                let _ = conn
                    .send(Frame::GoAway {
                        last_good_stream_id: last_stream,
                        status: 1,
                    })
                    .await;
                return Err(e.into());
            }
            Some(Ok(frame)) => on_frame!(frame),
        }
    }
    let out_id = id_of(&types, "stdout");
    let err_id = id_of(&types, "stderr");
    let error_id = id_of(&types, "error");

    let process = run(process_io);
    tokio::pin!(process);
    let mut outcome = None;
    let mut buf_out = read_buf();
    let mut buf_err = read_buf();
    // A data frame written straight to the connection, its header put in front of the
    // data (anything the codec holds goes first).
    macro_rules! send_data {
        ($id:expr, $chunk:expr) => {{
            let chunk: &mut [u8] = $chunk;
            if let Some(id) = $id {
                let start = spdy_data_frame(chunk, id);
                conn.flush().await?;
                write_raw(conn.get_mut(), &chunk[start..]).await?;
            }
        }};
    }
    while outcome.is_none() || stdout_r.is_some() || stderr_r.is_some() {
        tokio::select! {
            o = &mut process, if outcome.is_none() => outcome = Some(o),
            c = next_opt(&mut stdout_r, &mut buf_out) => match c {
                Some(Chunk::Read(n)) => {
                    send_data!(out_id, &mut buf_out[..HEADROOM + n]);
                    grow_after_read(&mut buf_out, n);
                }
                Some(Chunk::Written(mut chunk)) => send_data!(out_id, &mut chunk),
                None => stdout_r = None,
            },
            c = next_opt(&mut stderr_r, &mut buf_err) => match c {
                Some(Chunk::Read(n)) => {
                    send_data!(err_id, &mut buf_err[..HEADROOM + n]);
                    grow_after_read(&mut buf_err, n);
                }
                Some(Chunk::Written(mut chunk)) => send_data!(err_id, &mut chunk),
                None => stderr_r = None,
            },
            f = conn.next() => match f {
                None => return Ok(()),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(frame)) => on_frame!(frame),
            },
        }
    }
    let outcome = outcome.unwrap_or(Outcome::Exited(0));
    for id in [out_id, err_id].into_iter().flatten() {
        conn.send(fin(id)).await?;
    }
    if let Some(id) = error_id {
        let status = status_payload(protocol, command, &outcome);
        if !status.is_empty() {
            conn.send(Frame::Data {
                stream_id: id,
                flags: 0,
                data: status.into(),
            })
            .await?;
        }
        conn.send(fin(id)).await?;
    }
    conn.send(Frame::GoAway {
        last_good_stream_id: last_stream,
        status: 0,
    })
    .await?;
    conn.get_mut().shutdown().await?;
    Ok(())
}

fn fin(stream_id: u32) -> Frame {
    Frame::Data {
        stream_id,
        flags: FLAG_FIN,
        data: Bytes::new(),
    }
}

/// One channel message, binary or (base64 protocols) text.
fn ws_message(base64: bool, channel: u8, data: &[u8]) -> Message {
    if base64 {
        let mut s = String::with_capacity(1 + data.len() * 4 / 3 + 4);
        s.push(char::from(b'0' + channel));
        s.push_str(&base64::engine::general_purpose::STANDARD.encode(data));
        Message::text(s)
    } else {
        let mut out = Vec::with_capacity(1 + data.len());
        out.push(channel);
        out.extend_from_slice(data);
        Message::binary(out)
    }
}

/// `(channel, payload)` of a client message; `None` for anything else.
fn ws_decode(base64: bool, msg: &Message) -> Option<(u8, Vec<u8>)> {
    match msg {
        Message::Binary(data) if !base64 => {
            let (&ch, rest) = data.split_first()?;
            Some((ch, rest.to_vec()))
        }
        Message::Text(text) if base64 => {
            let bytes = text.as_bytes();
            let (&ch, rest) = bytes.split_first()?;
            if !ch.is_ascii_digit() {
                return None;
            }
            let data = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()?;
            Some((ch - b'0', data))
        }
        _ => None,
    }
}

async fn websocket<IO, F, Fut>(
    mut ws: WebSocketStream<IO>,
    protocol: &str,
    streams: Streams,
    command: &[String],
    run: F,
) -> Result<(), SessionError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: FnOnce(ProcessIo) -> Fut,
    Fut: Future<Output = Outcome>,
{
    let base64 = protocol.contains("base64");
    let v5 = protocol.starts_with("v5.");
    let Pipes {
        io: process_io,
        stdin: mut stdin_w,
        stdout: mut stdout_r,
        stderr: mut stderr_r,
        resize,
    } = pipes(streams);
    // The streams are ready: an empty message on the lowest writable channel says so.
    let ready = if streams.stdout {
        CH_STDOUT
    } else if streams.stderr {
        CH_STDERR
    } else {
        CH_ERROR
    };
    ws.send(ws_message(base64, ready, &[])).await?;
    let process = run(process_io);
    tokio::pin!(process);
    let mut outcome = None;
    let mut buf_out = read_buf();
    let mut buf_err = read_buf();
    // Binary protocols: the message is written straight to the connection, its header
    // and channel byte put in front of the data (anything tungstenite holds, such as the
    // answer to a ping, goes first); base64 ones encode it.
    macro_rules! send_output {
        ($channel:expr, $chunk:expr) => {{
            let chunk: &mut [u8] = $chunk;
            if base64 {
                ws.send(ws_message(true, $channel, &chunk[HEADROOM..]))
                    .await?;
            } else {
                let start = ws_binary_frame(chunk, $channel);
                ws.flush().await?;
                write_raw(ws.get_mut(), &chunk[start..]).await?;
            }
        }};
    }
    while outcome.is_none() || stdout_r.is_some() || stderr_r.is_some() {
        tokio::select! {
            o = &mut process, if outcome.is_none() => outcome = Some(o),
            c = next_opt(&mut stdout_r, &mut buf_out) => match c {
                Some(Chunk::Read(n)) => {
                    send_output!(CH_STDOUT, &mut buf_out[..HEADROOM + n]);
                    grow_after_read(&mut buf_out, n);
                }
                Some(Chunk::Written(mut chunk)) => send_output!(CH_STDOUT, &mut chunk),
                None => stdout_r = None,
            },
            c = next_opt(&mut stderr_r, &mut buf_err) => match c {
                Some(Chunk::Read(n)) => {
                    send_output!(CH_STDERR, &mut buf_err[..HEADROOM + n]);
                    grow_after_read(&mut buf_err, n);
                }
                Some(Chunk::Written(mut chunk)) => send_output!(CH_STDERR, &mut chunk),
                None => stderr_r = None,
            },
            m = ws.next() => {
                let msg = match m {
                    None => return Ok(()),
                    Some(m) => m?,
                };
                if let Message::Close(_) = msg {
                    return Ok(());
                }
                match ws_decode(base64, &msg) {
                    Some((CH_CLOSE, data)) if v5 && data.first() == Some(&CH_STDIN) => {
                        stdin_w = None;
                    }
                    Some((CH_STDIN, data)) => {
                        if let Some(w) = stdin_w.as_mut()
                            && !data.is_empty()
                            && w.write_all(&data).await.is_err()
                        {
                            stdin_w = None;
                        }
                    }
                    Some((CH_RESIZE, data)) => parse_resizes(&data, &resize),
                    _ => {}
                }
            }
        }
    }
    let outcome = outcome.unwrap_or(Outcome::Exited(0));
    let status = status_payload(protocol, command, &outcome);
    if !status.is_empty() {
        ws.send(ws_message(base64, CH_ERROR, status.as_bytes()))
            .await?;
    }
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    })))
    .await?;
    // Let the client answer the close so the handshake completes.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    /// A "process" that copies stdin to stdout uppercased, writes "E" to stderr, and
    /// exits with 3.
    async fn shout(mut io: ProcessIo) -> Outcome {
        let mut input = Vec::new();
        if let Some(mut r) = io.stdin.take() {
            r.read_to_end(&mut input).await.unwrap();
        }
        if let Some(mut w) = io.stdout.take() {
            w.write_all(&input.to_ascii_uppercase()).await.unwrap();
        }
        if let Some(mut w) = io.stderr.take() {
            w.write_all(b"E").await.unwrap();
        }
        Outcome::Exited(3)
    }

    fn all() -> Streams {
        Streams {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }

    async fn ws_roundtrip(protocol: &'static str) -> (Vec<u8>, Vec<u8>, String) {
        let (server, client) = tokio::io::duplex(PIPE);
        let cmd = vec!["shout".to_string()];
        let session = tokio::spawn(async move {
            serve(server, Transport::WebSocket, protocol, all(), &cmd, shout).await
        });
        let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let b64 = protocol.contains("base64");
        ws.send(ws_message(b64, CH_STDIN, b"hi")).await.unwrap();
        ws.send(ws_message(b64, CH_CLOSE, &[CH_STDIN]))
            .await
            .unwrap();
        let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), String::new());
        while let Some(Ok(msg)) = ws.next().await {
            match ws_decode(b64, &msg) {
                Some((CH_STDOUT, d)) => out.extend(d),
                Some((CH_STDERR, d)) => err.extend(d),
                Some((CH_ERROR, d)) => status.push_str(&String::from_utf8(d).unwrap()),
                _ => {}
            }
        }
        session.await.unwrap().unwrap();
        (out, err, status)
    }

    #[test]
    fn a_read_buffer_grows_only_when_filled_and_never_past_a_chunk() {
        let mut buf = read_buf();
        assert_eq!(buf.len(), HEADROOM + FIRST_CHUNK);
        // A read that left room: the producer is not ahead, nothing changes.
        grow_after_read(&mut buf, FIRST_CHUNK - 1);
        assert_eq!(buf.len(), HEADROOM + FIRST_CHUNK);
        // Full reads double it, up to CHUNK and no further.
        let mut sizes = Vec::new();
        for _ in 0..8 {
            let room = buf.len() - HEADROOM;
            grow_after_read(&mut buf, room);
            sizes.push(buf.len() - HEADROOM);
        }
        assert_eq!(
            sizes,
            [128, 256, 512, 1024, 1024, 1024, 1024, 1024].map(|k| k * 1024)
        );
        assert_eq!(CHUNK, 1024 * 1024);
    }

    #[tokio::test]
    async fn websocket_v5_carries_streams_and_the_exit_code() {
        let (out, err, status) = ws_roundtrip("v5.channel.k8s.io").await;
        assert_eq!(out, b"HI");
        assert_eq!(err, b"E");
        let s: serde_json::Value = serde_json::from_str(&status).unwrap();
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0]["message"], "3");
    }

    /// A SPDY client on `io` that has opened `streams` (id, stream type), as kubectl does.
    async fn spdy_client(
        io: tokio::io::DuplexStream,
        streams: &[(u32, &str)],
    ) -> Framed<tokio::io::DuplexStream, Codec> {
        let mut conn = Framed::new(io, Codec::new());
        for &(id, kind) in streams {
            conn.send(Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: vec![("streamtype".into(), kind.into())],
            })
            .await
            .unwrap();
        }
        conn
    }

    /// Everything the server sends until its GOAWAY: the data per stream, and the streams
    /// it ended (FIN) in the order it ended them.
    async fn spdy_collect(
        conn: &mut Framed<tokio::io::DuplexStream, Codec>,
    ) -> (HashMap<u32, Vec<u8>>, Vec<u32>) {
        let mut by_stream: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut ended = Vec::new();
        while let Some(Ok(frame)) = conn.next().await {
            match frame {
                Frame::Data {
                    stream_id,
                    flags,
                    data,
                } => {
                    by_stream.entry(stream_id).or_default().extend(&data[..]);
                    if flags & FLAG_FIN != 0 {
                        ended.push(stream_id);
                    }
                }
                Frame::GoAway { .. } => break,
                _ => {}
            }
        }
        (by_stream, ended)
    }

    #[tokio::test]
    async fn spdy_v4_carries_streams_and_the_exit_code() {
        let (server, client) = tokio::io::duplex(PIPE);
        let cmd = vec!["shout".to_string()];
        let session = tokio::spawn(async move {
            serve(
                server,
                Transport::Spdy,
                "v4.channel.k8s.io",
                all(),
                &cmd,
                shout,
            )
            .await
        });
        let mut conn = spdy_client(
            client,
            &[(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")],
        )
        .await;
        conn.send(Frame::Data {
            stream_id: 3,
            flags: FLAG_FIN,
            data: Bytes::from_static(b"hi"),
        })
        .await
        .unwrap();
        let (by_stream, mut ended) = spdy_collect(&mut conn).await;
        session.await.unwrap().unwrap();
        ended.sort_unstable();
        assert_eq!(
            ended,
            [1, 5, 7],
            "every stream the server writes ends with FIN"
        );
        assert_eq!(by_stream[&5], b"HI");
        assert_eq!(by_stream[&7], b"E");
        let s: serde_json::Value = serde_json::from_slice(&by_stream[&1]).unwrap();
        assert_eq!(s["details"]["causes"][0]["message"], "3");
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed).collect()
    }

    /// A "process" whose stdout gets a write, then a reader handed over (more than one
    /// chunk, so frames of every header size), and whose stderr gets a small reader.
    async fn pumped(mut io: ProcessIo) -> Outcome {
        let mut out = io.stdout.take().unwrap();
        let err = io.stderr.take().unwrap();
        out.write_all(b"w:").await.unwrap();
        tokio::join!(
            out.pump_from(std::io::Cursor::new(pattern(300_000, 0))),
            err.pump_from(std::io::Cursor::new(pattern(1000, 7))),
        );
        Outcome::Exited(0)
    }

    fn output_only() -> Streams {
        Streams {
            stdin: false,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }

    #[tokio::test]
    async fn websocket_output_pumped_from_readers_arrives_whole_and_in_order() {
        for protocol in ["v5.channel.k8s.io", "v4.base64.channel.k8s.io"] {
            let (server, client) = tokio::io::duplex(PIPE);
            let cmd = vec!["pumped".to_string()];
            let session = tokio::spawn(async move {
                serve(
                    server,
                    Transport::WebSocket,
                    protocol,
                    output_only(),
                    &cmd,
                    pumped,
                )
                .await
            });
            let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
            let b64 = protocol.contains("base64");
            let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), String::new());
            while let Some(Ok(msg)) = ws.next().await {
                match ws_decode(b64, &msg) {
                    Some((CH_STDOUT, d)) => out.extend(d),
                    Some((CH_STDERR, d)) => err.extend(d),
                    Some((CH_ERROR, d)) => status.push_str(&String::from_utf8(d).unwrap()),
                    _ => {}
                }
            }
            session.await.unwrap().unwrap();
            let mut want = b"w:".to_vec();
            want.extend(pattern(300_000, 0));
            assert!(
                out == want,
                "{protocol}: stdout of {} bytes differs",
                out.len()
            );
            assert_eq!(err, pattern(1000, 7), "{protocol}");
            assert!(status.contains("Success"), "{protocol}: {status}");
        }
    }

    #[tokio::test]
    async fn spdy_output_pumped_from_readers_arrives_whole_and_in_order() {
        let (server, client) = tokio::io::duplex(PIPE);
        let cmd = vec!["pumped".to_string()];
        let session = tokio::spawn(async move {
            serve(
                server,
                Transport::Spdy,
                "v4.channel.k8s.io",
                output_only(),
                &cmd,
                pumped,
            )
            .await
        });
        let mut conn = spdy_client(client, &[(1, "error"), (3, "stdout"), (5, "stderr")]).await;
        let (by_stream, mut ended) = spdy_collect(&mut conn).await;
        session.await.unwrap().unwrap();
        let mut want = b"w:".to_vec();
        want.extend(pattern(300_000, 0));
        assert!(
            by_stream[&3] == want,
            "stdout of {} bytes differs",
            by_stream[&3].len()
        );
        assert_eq!(by_stream[&5], pattern(1000, 7));
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&by_stream[&1]).unwrap()["status"],
            "Success"
        );
        ended.sort_unstable();
        assert_eq!(ended, [1, 3, 5], "every stream ends with FIN");
    }

    #[test]
    fn resize_events_parse_from_concatenated_json() {
        let (tx, mut rx) = mpsc::channel(8);
        parse_resizes(br#"{"Width":80,"Height":24}{"Width":100,"Height":30}"#, &tx);
        assert_eq!(rx.try_recv().unwrap().width, 80);
        assert_eq!(rx.try_recv().unwrap().height, 30);
    }

    #[test]
    fn old_protocols_get_text_and_nothing_on_success() {
        let cmd = vec!["x".to_string()];
        assert_eq!(
            status_payload("channel.k8s.io", &cmd, &Outcome::Exited(0)),
            ""
        );
        assert!(status_payload("", &cmd, &Outcome::Exited(2)).contains("exit code 2"));
        let v4 = status_payload("v4.channel.k8s.io", &cmd, &Outcome::Failed("no".into()));
        assert!(v4.contains("InternalError"));
    }
}
