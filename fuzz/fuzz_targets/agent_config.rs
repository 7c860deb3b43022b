//! The agent's YAML configuration is written by people and tools and ends up in unit
//! files, host paths and argv. Input: configuration text. Invariants: parsing never
//! panics; whatever `AgentConfig::parse` accepts renders a kubelet drop-in of exactly its
//! `DROP_IN_LINES` lines with no control character (no injected directive), unit paths without
//! `..` that stay in the unit directory, and a `Debug` that never shows the bootstrap
//! token's secret half.

#![no_main]

use std::path::Path;

use hostnode::configure::{DROP_IN_LINES, SYSTEMD_UNIT_DIR, render};
use hostnode::goalstate::{AgentConfig, AuthMode, resolve_machine};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = AgentConfig::parse(text, Path::new("fuzz.yaml")) else {
        return;
    };
    let mut slots: Vec<&str> = config.slots.keys().map(String::as_str).collect();
    slots.push("");
    for slot in slots {
        let goal = resolve_machine(&config, slot).expect("a configured slot resolves");
        for file in render(&goal.node_start) {
            assert!(!file.path.contains(".."), "{}", file.path);
            if file.unit_file {
                assert!(file.path.starts_with(SYSTEMD_UNIT_DIR), "{}", file.path);
                let contents = String::from_utf8(file.contents.clone().unwrap_or_default())
                    .expect("drop-ins are text");
                assert_eq!(contents.lines().count(), DROP_IN_LINES, "{contents:?}");
                assert!(
                    !contents.chars().any(|c| c.is_control() && c != '\n'),
                    "{contents:?}"
                );
            }
        }
        if let AuthMode::BootstrapToken(b) = &goal.node_start.auth
            && let Some((_, secret)) = b.token.split_once('.')
        {
            let debug = format!("{goal:?}");
            assert!(!debug.contains(secret), "{debug}");
        }
    }
});
