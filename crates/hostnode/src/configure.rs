//! The configuration files a [`NodeStart`] asks for: rendered by a pure function, then
//! written only where they differ from what is on disk (steady state writes nothing), each
//! write atomic. Which units' files changed decides what an upgrade restarts.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use crate::HostRoot;
use crate::fsutil::{self, FsError};
use crate::goalstate::{AuthMode, NodeStart};
use crate::restart::ChangedUnit;

/// The kubelet's configuration file.
pub const KUBELET_CONFIG: &str = "/etc/kubernetes/kubelet/config.yaml";
/// The bootstrap kubeconfig (bootstrap-token mode).
pub const BOOTSTRAP_KUBECONFIG: &str = "/etc/kubernetes/bootstrap-kubelet.conf";
/// The kubelet's kubeconfig. Written by us in kubeconfig and exec-credential modes; in
/// bootstrap-token mode the kubelet writes it after the TLS bootstrap.
pub const KUBELET_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";
/// containerd's configuration.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// The systemd unit directory drop-ins are written to.
pub const SYSTEMD_UNIT_DIR: &str = "/etc/systemd/system";
/// The drop-in file name below `<unit>.d/`.
pub const DROP_IN_NAME: &str = "10-outpost.conf";

/// Which service a file configures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// containerd.
    Containerd,
    /// The kubelet.
    Kubelet,
}

/// One file as the goal state wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredFile {
    /// Host path (absolute, before the [`HostRoot`] prefix).
    pub path: String,
    /// The contents, or `None` when the file must not exist.
    pub contents: Option<Vec<u8>>,
    /// Permission bits.
    pub mode: u32,
    /// The service that reads it.
    pub service: Service,
    /// Whether it is a systemd unit drop-in (a change needs `systemctl daemon-reload`).
    pub unit_file: bool,
}

/// The kubelet unit's drop-in path.
pub fn drop_in_path(unit: &str) -> String {
    format!("{SYSTEMD_UNIT_DIR}/{unit}.d/{DROP_IN_NAME}")
}

/// Every host path the goal state manages (present or absent): what an upgrade snapshots.
pub fn managed_paths(ns: &NodeStart) -> Vec<String> {
    render(ns).into_iter().map(|f| f.path).collect()
}

/// The shared configuration paths for the default unit names, for
/// [`crate::snapshot::take_snapshot`].
pub fn default_shared_paths() -> Vec<String> {
    vec![
        KUBELET_CONFIG.into(),
        drop_in_path("kubelet.service"),
        BOOTSTRAP_KUBECONFIG.into(),
        KUBELET_KUBECONFIG.into(),
        CONTAINERD_CONFIG.into(),
    ]
}

/// The kubelet's configuration as written: the configured KubeletConfiguration with
/// `port` set to the node's derived port (and `kind`/`apiVersion` filled in when the
/// configuration leaves them out, so the file is one the kubelet accepts).
pub fn kubelet_config(ns: &NodeStart) -> serde_yaml::Value {
    let mut map = ns.kubelet.config.as_mapping().cloned().unwrap_or_default();
    for (key, value) in [
        ("kind", "KubeletConfiguration"),
        ("apiVersion", "kubelet.config.k8s.io/v1beta1"),
    ] {
        map.entry(key.into()).or_insert_with(|| value.into());
    }
    map.insert("port".into(), u64::from(ns.kubelet_port).into());
    serde_yaml::Value::Mapping(map)
}

/// The kubelet's command line, executable first: the files this module writes, the node
/// name, the bootstrap flags and `extraArgs`. The serving port is in the configuration
/// file (`port`), the documented place for it (the `--port` flag is deprecated).
pub fn kubelet_argv(ns: &NodeStart) -> Vec<String> {
    let mut argv = vec![
        ns.kubelet.path.to_string_lossy().into_owned(),
        format!("--config={KUBELET_CONFIG}"),
        format!("--kubeconfig={KUBELET_KUBECONFIG}"),
        format!("--hostname-override={}", ns.node_name),
    ];
    if matches!(ns.auth, AuthMode::BootstrapToken(_)) {
        argv.push(format!("--bootstrap-kubeconfig={BOOTSTRAP_KUBECONFIG}"));
        argv.push("--rotate-certificates=true".into());
    }
    argv.extend(ns.kubelet.extra_args.iter().cloned());
    argv
}

/// How many lines [`render_drop_in`] writes; more would be an injected directive.
pub const DROP_IN_LINES: usize = 5;

/// The kubelet unit's drop-in: it empties the unit's `ExecStart=` and sets the whole
/// command line, so no flag depends on an environment variable the unit may not pass on.
/// Every argument after the executable is double-quoted with systemd's escapes (`\\`,
/// `\"`, `%%`, `$$`), so whatever it holds stays one literal argument.
pub fn render_drop_in(ns: &NodeStart) -> String {
    let mut argv = kubelet_argv(ns).into_iter();
    // The executable stays bare: its path was checked to hold no character systemd
    // interprets, and the first word is where systemd reads its prefixes (`-`, `@`, ...).
    let mut line = format!("ExecStart={}", argv.next().unwrap_or_default());
    for arg in argv {
        line.push(' ');
        line.push_str(&systemd_quote(&arg));
    }
    format!(
        "# Written by outpost-agent from its configuration; edits are overwritten.\n\
         [Service]\n\
         # The unit's own command line is replaced: the kubelet runs with exactly these flags.\n\
         ExecStart=\n\
         {line}\n"
    )
}

/// One `ExecStart=` word: double-quoted, with `\\`, `"`, `%` and `$` escaped and control
/// characters as `\xNN`, so systemd reads back exactly `arg`.
pub fn systemd_quote(arg: &str) -> String {
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('"');
    for c in arg.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' => out.push_str("$$"),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Renders the files for `ns`. Pure.
pub fn render(ns: &NodeStart) -> Vec<DesiredFile> {
    let mut files = Vec::new();
    // Serializing a serde_yaml::Value cannot fail; fall back to empty rather than panic.
    let kubelet_config = serde_yaml::to_string(&kubelet_config(ns)).unwrap_or_default();
    files.push(DesiredFile {
        path: KUBELET_CONFIG.into(),
        contents: Some(kubelet_config.into_bytes()),
        mode: 0o644,
        service: Service::Kubelet,
        unit_file: false,
    });

    match &ns.auth {
        AuthMode::BootstrapToken(b) => {
            files.push(kubelet_file(
                BOOTSTRAP_KUBECONFIG,
                Some(kubeconfig(
                    &b.api_server,
                    &b.ca_file.to_string_lossy(),
                    &format!("    token: {}\n", b.token),
                )),
            ));
            // KUBELET_KUBECONFIG is the kubelet's own in this mode: neither written nor
            // removed here (reset_kubelet_identity owns its removal).
        }
        AuthMode::Kubeconfig(k) => {
            files.push(kubelet_file(BOOTSTRAP_KUBECONFIG, None));
            files.push(kubelet_file(KUBELET_KUBECONFIG, Some(k.content.clone())));
        }
        AuthMode::ExecCredential(e) => {
            let mut user = format!(
                "    exec:\n      apiVersion: {}\n      command: {}\n      interactiveMode: Never\n",
                yaml_str(&e.api_version),
                yaml_str(&e.command)
            );
            if !e.args.is_empty() {
                user.push_str("      args:\n");
                for a in &e.args {
                    user.push_str(&format!("      - {}\n", yaml_str(a)));
                }
            }
            files.push(kubelet_file(BOOTSTRAP_KUBECONFIG, None));
            files.push(kubelet_file(
                KUBELET_KUBECONFIG,
                Some(kubeconfig(
                    &e.api_server,
                    &e.ca_file.to_string_lossy(),
                    &user,
                )),
            ));
        }
    }
    files.push(DesiredFile {
        path: drop_in_path(&ns.kubelet.unit),
        contents: Some(render_drop_in(ns).into_bytes()),
        mode: 0o644,
        service: Service::Kubelet,
        unit_file: true,
    });
    files.push(DesiredFile {
        path: CONTAINERD_CONFIG.into(),
        contents: Some(ns.containerd.config.clone().into_bytes()),
        mode: 0o644,
        service: Service::Containerd,
        unit_file: false,
    });
    files
}

fn kubelet_file(path: &str, contents: Option<String>) -> DesiredFile {
    DesiredFile {
        path: path.into(),
        contents: contents.map(String::into_bytes),
        // Credentials: owner only.
        mode: 0o600,
        service: Service::Kubelet,
        unit_file: false,
    }
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn kubeconfig(server: &str, ca_file: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: default\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
         users:\n- name: kubelet\n  user:\n{user}contexts:\n- name: default\n  context:\n    cluster: default\n    user: kubelet\n\
         current-context: default\n",
        yaml_str(server),
        yaml_str(ca_file)
    )
}

/// What [`apply`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Files written or removed.
    pub changed_files: Vec<PathBuf>,
    /// Whether a unit drop-in changed (`systemctl daemon-reload` is needed).
    pub unit_files_changed: bool,
    /// containerd then the kubelet, each with whether its configuration changed.
    pub units: Vec<ChangedUnit>,
}

/// Writes the files of `ns` below `root` where they differ; removes those that must be
/// absent.
pub fn apply(root: &HostRoot, ns: &NodeStart) -> Result<Applied, FsError> {
    let mut applied = Applied::default();
    let mut containerd = false;
    let mut kubelet = false;
    for file in render(ns) {
        let path = root.resolve(&file.path);
        let changed = match &file.contents {
            Some(contents) => {
                let same = std::fs::read(&path).ok().as_deref() == Some(contents.as_slice())
                    && std::fs::metadata(&path)
                        .is_ok_and(|m| m.permissions().mode() & 0o7777 == file.mode);
                if !same {
                    fsutil::write_atomic(&path, contents, file.mode, None)?;
                }
                !same
            }
            None => fsutil::remove_file_synced(&path)?,
        };
        if changed {
            tracing::info!(path = %path.display(), "configuration changed");
            applied.changed_files.push(path);
            applied.unit_files_changed |= file.unit_file;
            match file.service {
                Service::Containerd => containerd = true,
                Service::Kubelet => kubelet = true,
            }
        }
    }
    applied.units = vec![
        ChangedUnit {
            unit: ns.containerd.unit.clone(),
            changed: containerd,
        },
        ChangedUnit {
            unit: ns.kubelet.unit.clone(),
            changed: kubelet,
        },
    ];
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goalstate::resolve_machine;
    use crate::goalstate::tests::config;

    #[test]
    fn steady_state_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let ns = resolve_machine(&config(), "").unwrap().node_start;
        let first = apply(&root, &ns).unwrap();
        assert_eq!(first.changed_files.len(), 4);
        assert!(first.unit_files_changed);
        assert!(first.units.iter().all(|u| u.changed));
        let second = apply(&root, &ns).unwrap();
        assert_eq!(second.changed_files, Vec::<PathBuf>::new());
        assert!(second.units.iter().all(|u| !u.changed));
        let dropin =
            std::fs::read_to_string(root.resolve(drop_in_path("kubelet.service"))).unwrap();
        assert!(dropin.contains("--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf"));
        assert!(dropin.contains("--node-labels=pool=edge"));
    }

    /// systemd's reading of one `ExecStart=` line (the subset the renderer emits: bare
    /// or double-quoted words, `\\` escapes, `%%`, and `$$` kept for exec time), for
    /// checking that the rendered line reads back as the intended argv.
    fn systemd_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut chars = line.chars().peekable();
        while chars.peek().is_some() {
            while chars.peek() == Some(&' ') {
                chars.next();
            }
            let mut word = String::new();
            let quoted = chars.peek() == Some(&'"');
            if quoted {
                chars.next();
            }
            while let Some(c) = chars.next() {
                match c {
                    '"' if quoted => break,
                    ' ' if !quoted => break,
                    '\\' => match chars.next() {
                        Some('x') => {
                            let hex: String = chars.by_ref().take(2).collect();
                            word.push(char::from(u8::from_str_radix(&hex, 16).unwrap()));
                        }
                        Some(c) => word.push(c),
                        None => panic!("dangling backslash in {line:?}"),
                    },
                    '%' => {
                        assert_eq!(chars.next(), Some('%'), "a specifier in {line:?}");
                        word.push('%');
                    }
                    '$' => {
                        assert_eq!(chars.next(), Some('$'), "a variable in {line:?}");
                        word.push('$');
                    }
                    c => word.push(c),
                }
            }
            words.push(word);
        }
        words
    }

    #[test]
    fn the_drop_in_replaces_exec_start_and_reads_back_as_the_argv() {
        let mut ns = resolve_machine(&config(), "").unwrap().node_start;
        ns.kubelet.extra_args = vec![
            "--eviction-hard=memory.available<5%".into(),
            "--x=$HOME;${PATH}".into(),
            ";".into(),
            "--odd=\"q\"\\\n".into(),
        ];
        let text = render_drop_in(&ns);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), DROP_IN_LINES, "{text}");
        assert_eq!(lines[1], "[Service]");
        assert_eq!(
            lines[3], "ExecStart=",
            "the unit's own command line is reset"
        );
        let exec = lines[4].strip_prefix("ExecStart=").unwrap();
        assert!(!text.contains("Environment"), "{text}");
        assert_eq!(systemd_words(exec), kubelet_argv(&ns));
        assert_eq!(
            kubelet_argv(&ns)[..4],
            [
                "/usr/bin/kubelet",
                "--config=/etc/kubernetes/kubelet/config.yaml",
                "--kubeconfig=/etc/kubernetes/kubelet.conf",
                "--hostname-override=worker-1",
            ]
        );
    }

    #[test]
    fn the_kubelet_configuration_carries_the_derived_port() {
        let mut ns = resolve_machine(&config(), "").unwrap().node_start;
        let written = kubelet_config(&ns);
        assert_eq!(written.get("port").and_then(|p| p.as_u64()), Some(21149));
        assert_eq!(
            written.get("clusterDNS"),
            ns.kubelet.config.get("clusterDNS"),
            "the rest is kept"
        );
        ns.kubelet.config = serde_yaml::Value::Null;
        let written = kubelet_config(&ns);
        assert_eq!(
            written.get("kind").and_then(|v| v.as_str()),
            Some("KubeletConfiguration")
        );
        assert_eq!(written.get("port").and_then(|p| p.as_u64()), Some(21149));
    }

    #[test]
    fn only_the_changed_service_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let mut ns = resolve_machine(&config(), "").unwrap().node_start;
        apply(&root, &ns).unwrap();
        ns.containerd.config.push_str("[plugins]\n");
        let applied = apply(&root, &ns).unwrap();
        assert_eq!(
            applied.units,
            [
                ChangedUnit {
                    unit: "containerd.service".into(),
                    changed: true
                },
                ChangedUnit {
                    unit: "kubelet.service".into(),
                    changed: false
                }
            ]
        );
        assert!(!applied.unit_files_changed);
    }

    #[test]
    fn switching_auth_mode_removes_the_bootstrap_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let mut ns = resolve_machine(&config(), "").unwrap().node_start;
        apply(&root, &ns).unwrap();
        assert!(root.resolve(BOOTSTRAP_KUBECONFIG).exists());
        ns.auth = AuthMode::Kubeconfig(crate::goalstate::KubeconfigAuth {
            content: "apiVersion: v1\nkind: Config\n".into(),
        });
        apply(&root, &ns).unwrap();
        assert!(!root.resolve(BOOTSTRAP_KUBECONFIG).exists());
        assert_eq!(
            std::fs::read_to_string(root.resolve(KUBELET_KUBECONFIG)).unwrap(),
            "apiVersion: v1\nkind: Config\n"
        );
    }
}
