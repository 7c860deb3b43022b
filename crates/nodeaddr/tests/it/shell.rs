//! The bash derivation published in docs/nodeaddr.md agrees with the Rust one.

use std::path::PathBuf;
use std::process::Command;

use nodeaddr::{PortRange, kubelet_port_for_node, loopback_candidate};

fn snippet() -> String {
    let doc = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/nodeaddr.md");
    let text = std::fs::read_to_string(&doc)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", doc.display()));
    let start = text
        .find("<!-- snippet:nodeaddr.sh -->")
        .expect("docs/nodeaddr.md lost its snippet marker");
    let rest = &text[start..];
    let open = rest.find("```bash\n").expect("snippet fence") + "```bash\n".len();
    let close = rest[open..].find("```").expect("snippet end");
    rest[open..open + close].to_string()
}

#[test]
fn documented_bash_matches_the_rust_derivation() {
    let names = [
        "",
        "a",
        "foobar",
        "worker-1",
        "gpu-box",
        "node-α",
        "k3s-agent-01.example.internal",
        "box-1a2b3c4d",
    ];
    let mut script = snippet();
    for n in &names {
        script.push_str(&format!(
            "printf '%s %s %s\\n' \"$(nodeaddr_port '{n}')\" \"$(nodeaddr_port '{n}' 40000 77)\" \"$(nodeaddr_loopback '{n}')\"\n"
        ));
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("LANG", "C.UTF-8")
        .output()
        .expect("bash not found: it is part of every Debian install (apt-get install bash)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), names.len(), "{stdout}");
    let custom = PortRange::new(40000, 77).unwrap();
    for (n, line) in names.iter().zip(lines) {
        let want = format!(
            "{} {} {}",
            kubelet_port_for_node(n),
            custom.port_for(n),
            loopback_candidate(n)
        );
        assert_eq!(line, want, "name {n:?}");
    }
}
