//! Bootstrap tokens and token lifetimes come from the command line and from kubeconfig
//! files: untrusted text. A token that parses must print back as the (trimmed) input and
//! re-parse to itself; a lifetime that parses must survive being written as seconds.

#![no_main]

use common::token::{BootstrapToken, is_token_id, parse_ttl};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(token) = BootstrapToken::parse(text) {
        assert_eq!(token.to_string(), text.trim());
        assert!(is_token_id(token.id()));
        assert_eq!(token.secret().len(), 16);
        assert_eq!(
            BootstrapToken::parse(&token.to_string()).ok(),
            Some(token.clone())
        );
        assert_eq!(
            token.secret_name(),
            format!("bootstrap-token-{}", token.id())
        );
        assert!(!format!("{token:?}").contains(token.secret()));
    }
    if let Ok(ttl) = parse_ttl(text) {
        let again = parse_ttl(&format!("{}s", ttl.as_secs())).expect("seconds re-parse");
        assert_eq!(again, ttl);
    }
});
