//! The front's inputs come from the etcd member list (a joining member publishes its own
//! client URL) and from the command line; a kubeconfig being repointed is a file on disk.
//! Whatever the text: a server list either is refused or renders a configuration with
//! exactly one `server` line per backend and no line the template does not hold (no
//! injected directive); and a kubeconfig rewrite either fails cleanly or keeps every value
//! but the clusters' servers, and a second rewrite changes nothing.

#![no_main]

use hacore::front::{FrontSpec, parse_servers, render_haproxy};
use hacore::repoint::rewrite_server;
use libfuzzer_sys::fuzz_target;

const TEMPLATE_PREFIXES: &[&str] = &[
    "# ", "global", "    log ", "    hard-stop-after ", "defaults", "    mode tcp",
    "    log global", "    option ", "    retries ", "    timeout ", "frontend ", "    bind ",
    "    default_backend ", "backend ", "    balance ", "    http-check ", "    default-server ",
    "    server ",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(backends) = parse_servers(&[text.to_string()], 6443) {
        let n = backends.len();
        match render_haproxy(&FrontSpec::new(backends, "/etc/kubernetes/pki/ca.crt")) {
            Ok(cfg) => {
                let servers = cfg.lines().filter(|l| l.starts_with("    server ")).count();
                assert_eq!(servers, n, "one server line per backend:\n{cfg}");
                for line in cfg.lines().filter(|l| !l.is_empty()) {
                    assert!(
                        TEMPLATE_PREFIXES.iter().any(|p| line.starts_with(p)),
                        "a line the template does not hold: {line:?}"
                    );
                    if let Some(rest) = line.strip_prefix("    server ") {
                        assert_eq!(rest.split(' ').count(), 2, "{line:?}");
                    }
                }
            }
            Err(_) => {}
        }
    }
    if let Ok(r) = rewrite_server(text, "https://10.0.0.100:6443") {
        let again = rewrite_server(&r.text, "https://10.0.0.100:6443").expect("a rewrite re-reads");
        assert!(!again.changed, "a second rewrite changed something");
        assert_eq!(again.text, r.text);
    }
});
