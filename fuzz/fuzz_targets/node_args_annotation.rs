//! The k3s `k3s.io/node-args` and `k3s.io/node-env` annotations are written by whoever
//! registers a node: untrusted. Whatever their bytes, routing-name recovery must not panic
//! and must answer either the registered name or that name less a k3s node-id suffix (`-`
//! and 8 lowercase hex digits), so an annotation can never steer a route to an unrelated
//! node's port.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First line: the registered name; second line: the node-args value; the rest: the
    // node-env value (absent when there is no second newline).
    let text = String::from_utf8_lossy(data);
    let (name, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let (args, env) = match rest.split_once('\n') {
        Some((a, e)) => (a, Some(e)),
        None => (rest, None),
    };
    let routed = nodeaddr::routing_name_from(name, Some(args), env);
    if routed != name {
        let suffix = name
            .strip_prefix(routed)
            .expect("a routing name other than the node name must be its prefix");
        let hex = suffix.strip_prefix('-').expect("suffix starts with '-'");
        assert!(!routed.is_empty());
        assert_eq!(hex.len(), 8);
        assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    }
    let _ = nodeaddr::configured_node_name(args);
    if let Some(env) = env {
        let _ = nodeaddr::configured_node_name_env(env);
    }
});
