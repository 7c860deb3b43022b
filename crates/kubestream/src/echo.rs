//! Exec, attach and port-forward sessions over SPDY/3.1 and WebSocket whose "process" is
//! an echo: what the API double's stub kubelet serves, so tests can check bytes both ways.
//!
//! Behaviour (an echo, so tests can check bytes both ways):
//! - `echo ARGS...` writes `ARGS\n` to stdout and exits 0;
//! - `exit N` or `sh -c "exit N"` exits N (v4+ report it as a `NonZeroExitCode` Status);
//! - anything else, and attach, copies stdin to stdout until stdin closes, then exits 0.
//!
//! Port-forward echoes every data stream back on itself.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::codec::Framed;

use crate::channel::{
    CH_CLOSE, CH_ERROR, CH_STDERR, CH_STDIN, CH_STDOUT, ExecRequest, is_v4_or_later, v1_status,
    v4_status,
};
use crate::spdy::{Codec, FLAG_FIN, Frame, SpdyError};

/// What the stub's "process" does when it has no stdin to echo: (stdout, exit code).
pub fn run_command(command: &[String]) -> (Vec<u8>, i32) {
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["echo", rest @ ..] => (format!("{}\n", rest.join(" ")).into_bytes(), 0),
        ["exit", n] => (Vec::new(), n.parse().unwrap_or(1)),
        ["sh", "-c", script] => match script.strip_prefix("exit ") {
            Some(n) => (Vec::new(), n.trim().parse().unwrap_or(1)),
            None => (Vec::new(), 0),
        },
        _ => (Vec::new(), 0),
    }
}

/// Whether the command echoes stdin (every command but `echo`, `exit` and `sh -c exit`).
fn echoes_stdin(command: &[String]) -> bool {
    let exits = command.len() == 3 && command[0] == "sh" && command[2].starts_with("exit ");
    let prints = matches!(
        command.first().map(String::as_str),
        Some("echo") | Some("exit")
    );
    !(prints || exits)
}

/// Serves an exec or attach session over SPDY until it completes or the client goes.
pub async fn spdy_exec<IO>(io: IO, req: ExecRequest, protocol: String) -> Result<(), SpdyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = Framed::new(io, Codec::new());
    let mut stream_types: HashMap<u32, String> = HashMap::new();
    let by_type = |types: &HashMap<u32, String>, t: &str| {
        types.iter().find(|(_, v)| v.as_str() == t).map(|(k, _)| *k)
    };
    let echo = req.kind == "attach" || echoes_stdin(&req.command);
    let mut stdin_done = !req.stdin;
    let mut pending: Vec<Bytes> = Vec::new();
    let mut last_stream = 0u32;
    let expected: Vec<&str> = {
        let mut e = vec!["error"];
        if req.stdout {
            e.push("stdout");
        }
        if req.stderr && !req.tty {
            e.push("stderr");
        }
        e
    };
    loop {
        let all_there = expected.iter().all(|t| by_type(&stream_types, t).is_some());
        if stdin_done && all_there {
            break;
        }
        let frame = match conn.next().await {
            None => return Ok(()),
            Some(Err(e)) => {
                let _ = conn
                    .send(Frame::GoAway {
                        last_good_stream_id: last_stream,
                        status: 1,
                    })
                    .await;
                return Err(e);
            }
            Some(Ok(f)) => f,
        };
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
                    stdin_done = true;
                }
                if kind == "stdout" {
                    for data in pending.drain(..) {
                        conn.send(Frame::Data {
                            stream_id,
                            flags: 0,
                            data,
                        })
                        .await?;
                    }
                }
                stream_types.insert(stream_id, kind);
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } if stream_types.get(&stream_id).map(String::as_str) == Some("stdin") => {
                if echo && !data.is_empty() {
                    match by_type(&stream_types, "stdout") {
                        Some(out) => {
                            conn.send(Frame::Data {
                                stream_id: out,
                                flags: 0,
                                data,
                            })
                            .await?
                        }
                        None => pending.push(data),
                    }
                }
                if flags & FLAG_FIN != 0 {
                    stdin_done = true;
                }
            }
            Frame::RstStream { stream_id, .. }
                if stream_types.get(&stream_id).map(String::as_str) == Some("stdin") =>
            {
                stdin_done = true;
            }
            Frame::Ping { id } => conn.send(Frame::Ping { id }).await?,
            Frame::GoAway { .. } => return Ok(()),
            _ => {}
        }
    }
    let (output, exit) = run_command(&req.command);
    if let Some(out) = by_type(&stream_types, "stdout") {
        if !output.is_empty() {
            conn.send(Frame::Data {
                stream_id: out,
                flags: 0,
                data: output.into(),
            })
            .await?;
        }
        conn.send(fin(out)).await?;
    }
    if let Some(err) = by_type(&stream_types, "stderr") {
        conn.send(fin(err)).await?;
    }
    if let Some(err) = by_type(&stream_types, "error") {
        let status = if is_v4_or_later(&protocol) {
            v4_status(&req.command, exit)
        } else {
            v1_status(&req.command, exit)
        };
        if !status.is_empty() {
            conn.send(Frame::Data {
                stream_id: err,
                flags: 0,
                data: status.into(),
            })
            .await?;
        }
        conn.send(fin(err)).await?;
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

/// Serves a port-forward session over SPDY: each `data` stream is echoed back on itself
/// until the client closes it; the session lasts until the client goes. Returns the
/// ports the client asked for.
pub async fn spdy_port_forward<IO>(io: IO) -> Result<Vec<String>, SpdyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut conn = Framed::new(io, Codec::new());
    let mut data_streams: HashMap<u32, ()> = HashMap::new();
    let mut ports = Vec::new();
    while let Some(frame) = conn.next().await {
        let frame = frame?;
        match frame {
            Frame::SynStream {
                stream_id, flags, ..
            } => {
                let kind = frame.header("streamtype").unwrap_or("").to_string();
                if let (Some(p), "data") = (frame.header("port"), kind.as_str()) {
                    ports.push(p.to_string());
                }
                conn.send(Frame::SynReply {
                    stream_id,
                    flags: 0,
                    headers: vec![],
                })
                .await?;
                if kind == "data" {
                    data_streams.insert(stream_id, ());
                    if flags & FLAG_FIN != 0 {
                        conn.send(fin(stream_id)).await?;
                    }
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } if data_streams.contains_key(&stream_id) => {
                conn.send(Frame::Data {
                    stream_id,
                    flags: flags & FLAG_FIN,
                    data,
                })
                .await?;
            }
            Frame::Ping { id } => conn.send(Frame::Ping { id }).await?,
            Frame::GoAway { .. } => break,
            _ => {}
        }
    }
    Ok(ports)
}

/// Serves an exec or attach session over WebSocket (`channel.k8s.io` family: binary
/// messages whose first byte is the channel).
pub async fn ws_exec<IO>(
    mut ws: WebSocketStream<IO>,
    req: ExecRequest,
    protocol: String,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let echo = req.kind == "attach" || echoes_stdin(&req.command);
    // The kubelet tells the client the streams are ready with an empty message on the
    // lowest writable channel.
    let ready = if req.stdout {
        CH_STDOUT
    } else if req.stderr {
        CH_STDERR
    } else {
        CH_ERROR
    };
    ws.send(Message::binary(vec![ready])).await?;
    let v5 = protocol.starts_with("v5.");
    let mut stdin_done = !req.stdin;
    while !stdin_done {
        let msg = match tokio::time::timeout(Duration::from_secs(3600), ws.next()).await {
            Err(_) | Ok(None) => return Ok(()),
            Ok(Some(m)) => m?,
        };
        match msg {
            Message::Binary(data) => {
                if data.is_empty() {
                    continue;
                }
                if v5 && data[0] == CH_CLOSE {
                    if data.get(1) == Some(&CH_STDIN) {
                        stdin_done = true;
                    }
                    continue;
                }
                if data[0] == CH_STDIN && data.len() > 1 && echo && req.stdout {
                    let mut out = Vec::with_capacity(data.len());
                    out.push(CH_STDOUT);
                    out.extend_from_slice(&data[1..]);
                    ws.send(Message::binary(out)).await?;
                }
            }
            Message::Close(_) => return Ok(()),
            _ => {}
        }
    }
    let (output, exit) = run_command(&req.command);
    if req.stdout && !output.is_empty() {
        let mut out = vec![CH_STDOUT];
        out.extend_from_slice(&output);
        ws.send(Message::binary(out)).await?;
    }
    let status = if is_v4_or_later(&protocol) {
        v4_status(&req.command, exit)
    } else {
        v1_status(&req.command, exit)
    };
    if !status.is_empty() {
        let mut out = vec![CH_ERROR];
        out.extend_from_slice(status.as_bytes());
        ws.send(Message::binary(out)).await?;
    }
    ws.send(Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    })))
    .await?;
    // Wait briefly for the client's close reply so the close handshake completes.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    Ok(())
}

/// Serves a port-forward session over WebSocket (`v4.channel.k8s.io` / `portforward.k8s.io`
/// as the Python client speaks it): for port i, channel 2i carries data and 2i+1 errors;
/// each channel first announces its port as two little-endian bytes. Data is echoed.
pub async fn ws_port_forward<IO>(
    mut ws: WebSocketStream<IO>,
    ports: Vec<u16>,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    for (i, port) in ports.iter().enumerate() {
        for ch in [2 * i as u8, 2 * i as u8 + 1] {
            let le = port.to_le_bytes();
            ws.send(Message::binary(vec![ch, le[0], le[1]])).await?;
        }
    }
    while let Some(msg) = ws.next().await {
        match msg? {
            Message::Binary(data)
                if data.len() > 1 && data[0] % 2 == 0 && (data[0] as usize) / 2 < ports.len() =>
            {
                ws.send(Message::binary(data)).await?;
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    Ok(())
}

/// Serves SPDY port-forward tunnelled in WebSocket (`SPDY/3.1+portforward.k8s.io`, what
/// kubectl 1.31+ tries first): binary messages carry the raw SPDY byte stream.
pub async fn ws_tunnelled_spdy_port_forward<IO>(ws: WebSocketStream<IO>) -> Result<(), SpdyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
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
            match tokio::io::AsyncReadExt::read(&mut near_r, &mut buf).await {
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
    let session = async {
        let res = spdy_port_forward(far).await;
        res.map(|_| ())
    };
    let ((), (), res) = tokio::join!(inbound, outbound, session);
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::{EXEC_PROTOCOLS, negotiate};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn negotiation_follows_client_order() {
        assert_eq!(
            negotiate(&["v4.channel.k8s.io", "v5.channel.k8s.io"], EXEC_PROTOCOLS),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(negotiate(&["v9.channel.k8s.io"], EXEC_PROTOCOLS), None);
    }

    #[test]
    fn commands_behave_like_the_documented_stub() {
        assert_eq!(run_command(&s(&["echo", "a", "b"])), (b"a b\n".to_vec(), 0));
        assert_eq!(run_command(&s(&["exit", "3"])).1, 3);
        assert_eq!(run_command(&s(&["sh", "-c", "exit 4"])).1, 4);
        assert_eq!(run_command(&s(&["cat"])), (vec![], 0));
        assert!(echoes_stdin(&s(&["cat"])));
        assert!(!echoes_stdin(&s(&["echo", "x"])));
    }

    #[test]
    fn v4_status_reports_exit_codes() {
        let ok: serde_json::Value = serde_json::from_str(&v4_status(&s(&["cat"]), 0)).unwrap();
        assert_eq!(ok["status"], "Success");
        let bad: serde_json::Value =
            serde_json::from_str(&v4_status(&s(&["exit", "3"]), 3)).unwrap();
        assert_eq!(bad["reason"], "NonZeroExitCode");
        assert_eq!(bad["details"]["causes"][0]["message"], "3");
    }

    fn exec_req(command: &[&str], stdin: bool) -> ExecRequest {
        ExecRequest {
            kind: "exec".into(),
            namespace: "default".into(),
            pod: "web".into(),
            container: "app".into(),
            command: s(command),
            stdin,
            stdout: true,
            stderr: true,
            tty: false,
        }
    }

    #[tokio::test]
    async fn websocket_session_ignores_odd_messages_and_still_echoes() {
        use tokio_tungstenite::tungstenite::protocol::Role;
        let (server, client) = tokio::io::duplex(64 * 1024);
        let session = tokio::spawn(async move {
            let ws = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
            ws_exec(ws, exec_req(&["cat"], true), "v5.channel.k8s.io".into()).await
        });
        let mut ws = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
        for odd in [
            Message::binary(Vec::new()),
            Message::binary(vec![CH_CLOSE]),
            Message::binary(vec![CH_CLOSE, 9]),
            Message::binary(vec![7, 1, 2, 3]),
            Message::text("not a channel frame"),
            Message::Ping(vec![1, 2].into()),
            Message::binary(b"\x00ok".to_vec()),
            Message::binary(vec![CH_CLOSE, CH_STDIN]),
        ] {
            ws.send(odd).await.unwrap();
        }
        let mut stdout = Vec::new();
        let mut error = Vec::new();
        while let Some(Ok(msg)) = ws.next().await {
            if let Message::Binary(b) = msg {
                match b.first() {
                    Some(&CH_STDOUT) => stdout.extend_from_slice(&b[1..]),
                    Some(&CH_ERROR) => error.extend_from_slice(&b[1..]),
                    _ => {}
                }
            }
        }
        assert_eq!(stdout, b"ok");
        assert!(String::from_utf8_lossy(&error).contains("Success"));
        session.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn garbage_after_the_upgrade_ends_sessions_with_errors_not_panics() {
        use rand::{Rng, SeedableRng};
        use tokio::io::AsyncWriteExt;
        use tokio_tungstenite::tungstenite::protocol::Role;
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for round in 0..20 {
            let garbage: Vec<u8> = (0..rng.random_range(1..512))
                .map(|_| rng.random())
                .collect();
            // SPDY exec
            let (server, mut client) = tokio::io::duplex(64 * 1024);
            let spdy = tokio::spawn(spdy_exec(
                server,
                exec_req(&["cat"], true),
                "v4.channel.k8s.io".into(),
            ));
            client.write_all(&garbage).await.unwrap();
            drop(client);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), spdy)
                .await
                .unwrap_or_else(|_| panic!("SPDY session hung on garbage (round {round})"))
                .expect("SPDY session panicked");
            // WebSocket exec
            let (server, mut client) = tokio::io::duplex(64 * 1024);
            let ws = tokio::spawn(async move {
                let ws = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
                ws_exec(ws, exec_req(&["cat"], true), "v5.channel.k8s.io".into()).await
            });
            client.write_all(&garbage).await.unwrap();
            drop(client);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), ws)
                .await
                .unwrap_or_else(|_| panic!("WebSocket session hung on garbage (round {round})"))
                .expect("WebSocket session panicked");
            // SPDY port-forward
            let (server, mut client) = tokio::io::duplex(64 * 1024);
            let pf = tokio::spawn(spdy_port_forward(server));
            client.write_all(&garbage).await.unwrap();
            drop(client);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), pf)
                .await
                .unwrap_or_else(|_| panic!("port-forward hung on garbage (round {round})"))
                .expect("port-forward session panicked");
        }
    }
}
