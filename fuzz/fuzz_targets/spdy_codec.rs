//! SPDY/3 frames arrive from whatever dialled the kubelet streaming server: untrusted bytes. The
//! decoder must never panic, must not depend on how the bytes were split across reads,
//! and every frame it yields must survive an encode/decode round trip unchanged (through
//! a second codec pair, so the zlib header contexts are exercised as a stream).

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use kubestream::spdy::{Codec, Frame};
use tokio_util::codec::{Decoder, Encoder};

/// Frames decoded until the decoder wants more input or fails; the error as text.
fn decode_all(chunks: &[&[u8]]) -> (Vec<Frame>, Option<String>) {
    let mut codec = Codec::new();
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => frames.push(frame),
                Ok(None) => break,
                Err(e) => return (frames, Some(e.to_string())),
            }
        }
    }
    (frames, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, data)) = data.split_first() else {
        return;
    };
    let whole = decode_all(&[data]);
    // The same bytes in reads of `split + 1` bytes.
    let chunks: Vec<&[u8]> = data.chunks(usize::from(split) + 1).collect();
    let chunked = decode_all(&chunks);
    assert_eq!(whole, chunked, "decoding depends on read boundaries");

    let (frames, _) = whole;
    let mut tx = Codec::new();
    let mut wire = BytesMut::new();
    for frame in &frames {
        tx.encode(frame.clone(), &mut wire)
            .expect("a decoded frame must re-encode");
    }
    let (again, err) = decode_all(&[&wire]);
    assert_eq!(err, None, "our own encoding failed to decode");
    assert_eq!(frames, again, "decode(encode(frame)) != frame");
});
