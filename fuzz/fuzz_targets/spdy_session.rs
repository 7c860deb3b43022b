//! Whole echo streaming sessions (kubestream::echo) fed untrusted bytes after the upgrade: the SPDY
//! port-forward session and the WebSocket port-forward session. They must end (the
//! fuzzer's -timeout catches a hang) with a result or an error, never a panic, and the
//! SPDY session may report only ports named by SYN_STREAM frames actually present.

#![no_main]

use std::sync::OnceLock;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use kubestream::spdy::{Codec, Frame};
use kubestream::echo::{spdy_port_forward, ws_port_forward};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::codec::Decoder;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
    })
}

/// Writes `input` to the server side, then half-closes, draining whatever the server
/// sends back so an echoing session never blocks on a full pipe.
async fn feed(mut client: tokio::io::DuplexStream, input: Vec<u8>) {
    let _ = client.write_all(&input).await;
    let _ = client.shutdown().await;
    let mut sink = vec![0u8; 16 * 1024];
    while let Ok(n) = client.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// Ports named by `port` headers of SYN_STREAM frames with streamtype data.
fn ports_in(input: &[u8]) -> Vec<String> {
    let mut codec = Codec::new();
    let mut buf = BytesMut::from(input);
    let mut ports = Vec::new();
    while let Ok(Some(frame)) = codec.decode(&mut buf) {
        if let Frame::SynStream { .. } = frame
            && frame.header("streamtype") == Some("data")
            && let Some(p) = frame.header("port")
        {
            ports.push(p.to_string());
        }
    }
    ports
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, input)) = data.split_first() else {
        return;
    };
    let input = input.to_vec();
    runtime().block_on(async move {
        let (server, client) = tokio::io::duplex(64 * 1024);
        if mode % 2 == 0 {
            let expected = ports_in(&input);
            let (result, ()) = tokio::join!(spdy_port_forward(server), feed(client, input));
            if let Ok(ports) = result {
                assert!(
                    ports.iter().all(|p| expected.contains(p)),
                    "session reported ports {ports:?}, the input names only {expected:?}"
                );
            }
        } else {
            let ws = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
            let (_result, ()) =
                tokio::join!(ws_port_forward(ws, vec![8080, 9090]), feed(client, input));
        }
    });
});
