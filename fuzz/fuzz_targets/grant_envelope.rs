//! Grant entries are read from a Secret any holder of a bootstrap token can read, and a
//! compromised or buggy publisher could write anything there. Whatever the bytes,
//! opening (versioned and legacy) must fail cleanly rather than panic; a plaintext bundle
//! that decodes must re-encode to exactly the same bytes (the format is canonical); and a
//! bundle sealed under the fixed key opens back to the same bundle for its binding only.

#![no_main]

use hacore::grants::envelope::{
    CertKey, EntryBinding, EnvelopeError, decode_bundle, encode_bundle, open_bundle, open_bytes,
    open_legacy, seal_bundle, seal_legacy,
};
use libfuzzer_sys::fuzz_target;

const BINDING: EntryBinding<'static> = EntryBinding {
    secret: "kube-system/stratum-grants",
    entry: "certs-abcdef",
    token_id: "abcdef",
};

fuzz_target!(|data: &[u8]| {
    let key = CertKey::from_bytes([7u8; 32]);

    // As sealed bytes: only clean errors (or a genuine open, if the input is a real seal).
    let _ = open_bundle(&key, BINDING, data);
    let _ = open_bytes(&key, BINDING, data);
    let _ = open_legacy(&key, data);

    // As plaintext.
    let Ok(bundle) = decode_bundle(data) else {
        return;
    };
    let encoded = encode_bundle(&bundle).expect("a decoded bundle re-encodes");
    assert_eq!(
        encoded, data,
        "decode_bundle accepted a non-canonical encoding"
    );

    let sealed = seal_bundle(&key, BINDING, &bundle).expect("seal");
    assert_eq!(open_bundle(&key, BINDING, &sealed), Ok(bundle.clone()));
    let moved = EntryBinding {
        entry: "certs-zzzzzz",
        token_id: "zzzzzz",
        ..BINDING
    };
    assert_eq!(
        open_bundle(&key, moved, &sealed),
        Err(EnvelopeError::Authentication),
        "an entry moved to another token's slot must not open"
    );
    let other = CertKey::from_bytes([8u8; 32]);
    assert_eq!(
        open_bundle(&other, BINDING, &sealed),
        Err(EnvelopeError::Authentication)
    );

    let legacy = seal_legacy(&key, &bundle.files);
    assert_eq!(open_legacy(&key, &legacy), Ok(bundle.files));
});
