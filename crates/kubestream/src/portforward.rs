//! Port-forward sessions with real connections behind them.
//!
//! SPDY (`portforward.k8s.io`): for each forwarded connection the client opens an `error`
//! stream and a `data` stream carrying the same `port` and `requestID` headers; the server
//! dials the port ([`serve_spdy`]'s `connect`) and copies bytes between the data stream
//! and the connection, half-closing each way as the other side does. A failed dial is a
//! message on the error stream. kubectl 1.31+ first tries the same SPDY stream tunnelled
//! in WebSocket binary messages (`SPDY/3.1+portforward.k8s.io`, [`serve_tunnelled`]).
//! The Python client speaks the WebSocket channel form ([`serve_channels`]).

use std::collections::HashMap;
use std::future::Future;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::codec::Framed;

use crate::spdy::{Codec, FLAG_FIN, Frame, SpdyError};

/// Streams of one forwarded connection, by request id.
#[derive(Default)]
struct Pair {
    error: Option<u32>,
    data: Option<u32>,
    port: Option<u16>,
}

fn data(stream_id: u32, flags: u8, data: Bytes) -> Frame {
    Frame::Data {
        stream_id,
        flags,
        data,
    }
}

/// Serves a SPDY port-forward session until the client goes. `connect` dials a port of
/// the pod; its error text goes to the client's error stream.
pub async fn serve_spdy<IO, F, Fut, S>(io: IO, connect: F) -> Result<(), SpdyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: Fn(u16) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<S, String>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut conn = Framed::new(io, Codec::new());
    let (out_tx, mut out_rx) = mpsc::channel::<Frame>(64);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    // data stream id -> where its bytes go (None once the client half-closed it).
    let mut inbound: HashMap<u32, mpsc::Sender<Bytes>> = HashMap::new();
    let mut tasks = JoinSet::new();
    let mut last_stream = 0u32;
    loop {
        tokio::select! {
            Some(frame) = out_rx.recv() => conn.send(frame).await?,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            f = conn.next() => {
                let frame = match f {
                    None => return Ok(()),
                    Some(f) => f?,
                };
                match frame {
                    Frame::SynStream { stream_id, .. } => {
                        last_stream = last_stream.max(stream_id);
                        let kind = frame.header("streamtype").unwrap_or("").to_string();
                        let request = frame.header("requestid").unwrap_or("").to_string();
                        let port = frame.header("port").and_then(|p| p.parse::<u16>().ok());
                        conn.send(Frame::SynReply { stream_id, flags: 0, headers: vec![] }).await?;
                        let pair = pairs.entry(request.clone()).or_default();
                        match kind.as_str() {
                            "error" => pair.error = Some(stream_id),
                            "data" => pair.data = Some(stream_id),
                            _ => continue,
                        }
                        pair.port = pair.port.or(port);
                        let (Some(error_id), Some(data_id)) = (pair.error, pair.data) else {
                            continue;
                        };
                        let port = pair.port;
                        pairs.remove(&request);
                        let (in_tx, in_rx) = mpsc::channel::<Bytes>(16);
                        inbound.insert(data_id, in_tx);
                        let out = out_tx.clone();
                        let connect = connect.clone();
                        tasks.spawn(async move {
                            forward(port, error_id, data_id, connect, in_rx, out).await;
                        });
                    }
                    Frame::Data { stream_id, flags, data } => {
                        if let Some(tx) = inbound.get(&stream_id)
                            && !data.is_empty()
                            && tx.send(data).await.is_err()
                        {
                            inbound.remove(&stream_id);
                        }
                        if flags & FLAG_FIN != 0 {
                            inbound.remove(&stream_id);
                        }
                    }
                    Frame::RstStream { stream_id, .. } => {
                        inbound.remove(&stream_id);
                    }
                    Frame::Ping { id } => conn.send(Frame::Ping { id }).await?,
                    Frame::GoAway { .. } => {
                        let _ = conn
                            .send(Frame::GoAway { last_good_stream_id: last_stream, status: 0 })
                            .await;
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
    }
}

/// One forwarded connection: dial, then copy both ways.
async fn forward<F, Fut, S>(
    port: Option<u16>,
    error_id: u32,
    data_id: u32,
    connect: F,
    mut inbound: mpsc::Receiver<Bytes>,
    out: mpsc::Sender<Frame>,
) where
    F: Fn(u16) -> Fut,
    Fut: Future<Output = Result<S, String>>,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let dialed = match port {
        None => Err("the stream names no valid port".to_string()),
        Some(p) => connect(p).await,
    };
    let stream = match dialed {
        Ok(s) => s,
        Err(msg) => {
            let _ = out
                .send(data(error_id, FLAG_FIN, Bytes::from(msg.into_bytes())))
                .await;
            let _ = out.send(data(data_id, FLAG_FIN, Bytes::new())).await;
            return;
        }
    };
    let (mut r, mut w) = tokio::io::split(stream);
    let upstream = async {
        while let Some(chunk) = inbound.recv().await {
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = Bytes::copy_from_slice(&buf[..n]);
                    if out.send(data(data_id, 0, chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = out.send(data(data_id, FLAG_FIN, Bytes::new())).await;
        // The client closes its local connection only once the error stream ends.
        let _ = out.send(data(error_id, FLAG_FIN, Bytes::new())).await;
    };
    tokio::join!(upstream, downstream);
}

/// Serves SPDY port-forward tunnelled in WebSocket binary messages
/// (`SPDY/3.1+portforward.k8s.io`).
pub async fn serve_tunnelled<IO, F, Fut, S>(
    ws: WebSocketStream<IO>,
    connect: F,
) -> Result<(), SpdyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: Fn(u16) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<S, String>> + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (near, far) = tokio::io::duplex(64 * 1024);
    let (mut near_r, mut near_w) = tokio::io::split(near);
    let (mut sink, mut stream) = ws.split();
    let inbound = async {
        while let Some(Ok(msg)) = stream.next().await {
            let data = match msg {
                Message::Binary(d) => d,
                Message::Close(_) => break,
                _ => continue,
            };
            if near_w.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = near_w.shutdown().await;
    };
    let outbound = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match near_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if sink.send(Message::binary(buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    let session = serve_spdy(far, connect);
    let ((), (), res) = tokio::join!(inbound, outbound, session);
    res
}

/// Serves WebSocket port-forward with the channel protocol (`v4.channel.k8s.io` /
/// `portforward.k8s.io`, what the Python client speaks): one connection per requested
/// port, dialed at the start; port i carries data on channel 2i and errors on 2i+1, and
/// each channel first announces its port as two little-endian bytes.
pub async fn serve_channels<IO, F, Fut, S>(
    mut ws: WebSocketStream<IO>,
    ports: Vec<u16>,
    connect: F,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: Fn(u16) -> Fut,
    Fut: Future<Output = Result<S, String>>,
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(64);
    let mut inbound: HashMap<u8, mpsc::Sender<Bytes>> = HashMap::new();
    let mut tasks = JoinSet::new();
    for (i, port) in ports.iter().enumerate() {
        let Ok(data_ch) = u8::try_from(2 * i) else {
            break;
        };
        let error_ch = data_ch + 1;
        for ch in [data_ch, error_ch] {
            let le = port.to_le_bytes();
            ws.send(Message::binary(vec![ch, le[0], le[1]])).await?;
        }
        let stream = match connect(*port).await {
            Ok(s) => s,
            Err(msg) => {
                let mut m = vec![error_ch];
                m.extend_from_slice(msg.as_bytes());
                ws.send(Message::binary(m)).await?;
                continue;
            }
        };
        let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(16);
        inbound.insert(data_ch, in_tx);
        let out = out_tx.clone();
        tasks.spawn(async move {
            let (mut r, mut w) = tokio::io::split(stream);
            let upstream = async {
                while let Some(chunk) = in_rx.recv().await {
                    if w.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                let _ = w.shutdown().await;
            };
            let downstream = async {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match r.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let chunk = Bytes::copy_from_slice(&buf[..n]);
                            if out.send((data_ch, chunk)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            };
            // As the kubelet does: the forward of a port ends when either direction does
            // (in practice, the pod's side closing: the channel protocol has no way for
            // the client to half-close).
            tokio::select! {
                () = upstream => {}
                () = downstream => {}
            }
        });
    }
    drop(out_tx);
    loop {
        tokio::select! {
            chunk = out_rx.recv() => match chunk {
                Some((ch, chunk)) => {
                    let mut m = Vec::with_capacity(1 + chunk.len());
                    m.push(ch);
                    m.extend_from_slice(&chunk);
                    ws.send(Message::binary(m)).await?;
                }
                // Every port's forward ended and its output went out: close the session,
                // which is how the client learns that the pod closed its connection.
                None => {
                    ws.send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Normal,
                        reason: "".into(),
                    })))
                    .await?;
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
                        while let Some(Ok(_)) = ws.next().await {}
                    })
                    .await;
                    return Ok(());
                }
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            msg = ws.next() => match msg {
                None => return Ok(()),
                Some(msg) => match msg? {
                    Message::Binary(d) if d.len() > 1 => {
                        if let Some(tx) = inbound.get(&d[0])
                            && tx.send(Bytes::copy_from_slice(&d[1..])).await.is_err()
                        {
                            inbound.remove(&d[0]);
                        }
                    }
                    Message::Close(_) => return Ok(()),
                    _ => {}
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn(id: u32, kind: &str, port: &str, request: &str) -> Frame {
        Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: vec![
                ("streamtype".into(), kind.into()),
                ("port".into(), port.into()),
                ("requestid".into(), request.into()),
            ],
        }
    }

    #[tokio::test]
    async fn spdy_forwards_to_a_real_listener_and_reports_dial_failures() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf.to_ascii_uppercase()).await.unwrap();
        });
        let (server, client) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(serve_spdy(server, move |p: u16| async move {
            if p == port {
                tokio::net::TcpStream::connect(("127.0.0.1", p))
                    .await
                    .map_err(|e| e.to_string())
            } else {
                Err(format!("nothing listens on {p}"))
            }
        }));
        let mut conn = Framed::new(client, Codec::new());
        conn.send(syn(1, "error", &port.to_string(), "0"))
            .await
            .unwrap();
        conn.send(syn(3, "data", &port.to_string(), "0"))
            .await
            .unwrap();
        conn.send(data(3, 0, Bytes::from_static(b"hello")))
            .await
            .unwrap();
        conn.send(syn(5, "error", "1", "1")).await.unwrap();
        conn.send(syn(7, "data", "1", "1")).await.unwrap();
        let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
        let mut fins = 0;
        // FIN on data stream 3 and error stream 1 (the listener closed), error stream 5
        // and data stream 7 (the dial failed).
        while fins < 4 {
            match tokio::time::timeout(std::time::Duration::from_secs(10), conn.next())
                .await
                .expect("frames within 10 s")
            {
                Some(Ok(Frame::Data {
                    stream_id,
                    flags,
                    data,
                })) => {
                    got.entry(stream_id).or_default().extend(&data[..]);
                    if flags & FLAG_FIN != 0 {
                        fins += 1;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("session ended early: {other:?}"),
            }
        }
        assert_eq!(got[&3], b"HELLO");
        assert_eq!(String::from_utf8_lossy(&got[&5]), "nothing listens on 1");
        drop(conn);
        session.await.unwrap().unwrap();
    }
}

#[cfg(test)]
mod channel_tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::Role;

    #[tokio::test]
    async fn websocket_channels_forward_to_a_real_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf.to_ascii_uppercase()).await.unwrap();
        });
        let (server, client) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
            serve_channels(ws, vec![port], |p: u16| async move {
                tokio::net::TcpStream::connect(("127.0.0.1", p))
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
        });
        let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        let le = port.to_le_bytes();
        for ch in [0u8, 1] {
            let m = ws.next().await.unwrap().unwrap();
            assert_eq!(m.into_data().to_vec(), vec![ch, le[0], le[1]]);
        }
        ws.send(Message::binary(b"\x00hello".to_vec()))
            .await
            .unwrap();
        let m = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next())
            .await
            .expect("data within 5 s")
            .unwrap()
            .unwrap();
        assert_eq!(m.into_data().to_vec(), b"\x00HELLO".to_vec());
        ws.send(Message::Close(None)).await.unwrap();
        session.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn websocket_channels_close_the_session_when_the_pods_side_closes() {
        use tokio_tungstenite::tungstenite::protocol::Role;
        // The pod answers once and closes, as an HTTP/1.0 server does.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(b"pong").await.unwrap();
        });
        let (server, client) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
            serve_channels(ws, vec![port], |p: u16| async move {
                tokio::net::TcpStream::connect(("127.0.0.1", p))
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
        });
        let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        ws.send(Message::binary(b"\x00ping".to_vec()))
            .await
            .unwrap();
        let mut data = Vec::new();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while let Some(msg) = ws.next().await {
                match msg {
                    Ok(Message::Binary(b)) if b.first() == Some(&0) => {
                        data.extend_from_slice(&b[1..])
                    }
                    Ok(Message::Close(_)) | Err(_) => return true,
                    _ => {}
                }
            }
            true
        })
        .await;
        assert_eq!(
            ended,
            Ok(true),
            "the session stayed open after the pod closed"
        );
        // The port prefix, then what the pod wrote.
        assert_eq!(data, [&port.to_le_bytes()[..], b"pong"].concat());
        session.await.unwrap().unwrap();
    }
}
