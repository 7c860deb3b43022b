//! The lifecycle API (`hostnode::lifecycle`) as a library: a real tree below a temporary
//! host root, systemctl recorded, real mounts in a private mount namespace for the reset.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hostnode::goalstate::AgentConfig;
use hostnode::lifecycle::{
    Aftermath, Command, DropInState, Event, LifecycleError, MountsRemain, Node, Report, Settle,
    Silent,
};
use hostnode::phases::Progress;
use hostnode::runner::{CmdOutput, RecordingRunner};
use hostnode::unmount::{Mounter, SyscallMounter};
use hostnode::{BoxFuture, Hooks, HostRoot};

use crate::support::{block_on, in_private_mount_ns, mount_tmpfs, mounts_below};

const CONFIG: &str = r#"nodeName: worker-1
kubelet:
  config:
    kind: KubeletConfiguration
    apiVersion: kubelet.config.k8s.io/v1beta1
    maxPods: 110
    healthzPort: 0
  extraArgs: [--node-labels=pool=edge]
containerd:
  config: |
    version = 2
auth:
  bootstrapToken:
    apiServer: https://10.0.0.1:6443
    token: abcdef.0123456789abcdef
    caFile: /etc/kubernetes/pki/ca.crt
"#;

/// Records what a command reports: phase lines and events, rendered.
#[derive(Default)]
struct Recorder {
    lines: Mutex<Vec<String>>,
}

impl Recorder {
    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The phases that started, in order.
    fn started(&self) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter_map(|l| l.strip_prefix("start ").map(str::to_string))
            .collect()
    }
}

impl Report for Recorder {
    fn progress(&self, _: Command, progress: &Progress<'_>) {
        let line = match progress {
            Progress::Started { index, total, name } => {
                format!("start {name}@{}/{total}", index + 1)
            }
            Progress::Done { name, .. } => format!("done {name}"),
            Progress::Failed { error, .. } => format!("failed {}", error.task),
        };
        self.lines.lock().unwrap().push(line);
    }

    fn event(&self, _: Command, event: &Event<'_>) {
        let line = match event {
            Event::StackRunning(r) => format!("running={r}"),
            Event::Wrote(p) => format!("wrote {}", p.file_name().unwrap().to_string_lossy()),
            Event::Restarted(u) => format!("restarted {}", u.join(",")),
            Event::RollingBack(_) => "rolling back".into(),
            Event::RolledBack => "rolled back".into(),
            Event::MountsKept(e) => format!("kept {}", e.failures.len()),
            Event::KubeletStateRemoved { kept, .. } => format!("removed, kept {kept}"),
            Event::IdentityRemoved(p) => {
                format!("identity {}", p.file_name().unwrap().to_string_lossy())
            }
            other => format!("{other:?}")
                .split(['(', ' '])
                .next()
                .unwrap()
                .into(),
        };
        self.lines.lock().unwrap().push(line);
    }
}

/// A host root with the configuration and a recording systemctl that reports every unit
/// `active` (or `inactive` once `stopped`).
struct Host {
    dir: tempfile::TempDir,
    runner: RecordingRunner,
}

impl Host {
    fn new(running: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let runner = RecordingRunner::new();
        let state = if running {
            CmdOutput::stdout("active\n")
        } else {
            CmdOutput {
                code: Some(3),
                stdout: "inactive\n".into(),
                stderr: String::new(),
            }
        };
        runner.respond(&["systemctl", "is-active"], state);
        Self { dir, runner }
    }

    fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path().join("root"))
    }

    fn node(&self, config: &str) -> Node {
        self.node_with(config, Hooks::default())
    }

    fn node_with(&self, config: &str, hooks: Hooks) -> Node {
        let text = config.to_string();
        Node::new(
            move || AgentConfig::parse(&text, Path::new("agent.yaml")),
            "",
            Hooks {
                host_root: self.root(),
                runner: Some(Arc::new(self.runner.clone())),
                // No LocalDNS in the configuration: nothing of the host's network is
                // touched, but the cleanup still asks `ip`; a no-op here.
                cleanup_network: Some(Arc::new(|| Box::pin(async { Ok(()) }))),
                ..hooks
            },
        )
    }

    /// Every regular file below root/etc except the agent's own directory.
    fn etc(&self) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
        fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (Vec<u8>, u32)>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries {
                let p = e.unwrap().path();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                if meta.is_dir() {
                    if !p.ends_with("outpost-agent") {
                        walk(&p, out);
                    }
                } else {
                    out.insert(
                        p.clone(),
                        (std::fs::read(&p).unwrap(), meta.mode() & 0o7777),
                    );
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root().resolve("/etc"), &mut out);
        out
    }
}

fn systemctl(runner: &RecordingRunner) -> Vec<String> {
    runner
        .commands()
        .into_iter()
        .filter_map(|c| c.strip_prefix("systemctl ").map(str::to_string))
        .collect()
}

#[tokio::test]
async fn up_starts_a_stopped_stack_in_order_and_down_stops_the_kubelet_first() {
    let host = Host::new(false);
    let report = Recorder::default();
    let up = host.node(CONFIG).up(&report).await.unwrap();
    assert!(!up.was_running);
    assert!(up.applied.unit_files_changed);
    assert_eq!(up.goal.node_start.node_name, "worker-1");
    assert_eq!(
        report.started(),
        Command::Up
            .phases()
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{p}@{}/8", i + 1))
            .collect::<Vec<_>>()
    );
    let lines = report.lines();
    assert!(lines.contains(&"running=false".to_string()), "{lines:?}");
    assert!(
        lines.contains(&"wrote config.yaml".to_string()),
        "{lines:?}"
    );
    assert_eq!(
        systemctl(&host.runner),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service",
            "daemon-reload",
            "start -- containerd.service",
            "start -- kubelet.service",
        ]
    );

    host.runner.clear();
    let down = host.node(CONFIG).down(&Silent).await.unwrap();
    assert_eq!(down.goal.slot, "");
    assert_eq!(
        systemctl(&host.runner),
        ["stop -- kubelet.service", "stop -- containerd.service"]
    );
}

#[tokio::test]
async fn up_of_a_running_stack_restarts_only_what_changed_and_steady_state_does_nothing() {
    let host = Host::new(true);
    host.node(CONFIG).up(&Silent).await.unwrap();
    host.runner.clear();
    let again = host.node(CONFIG).up(&Silent).await.unwrap();
    assert!(again.was_running);
    assert!(again.applied.changed_files.is_empty());
    assert_eq!(
        systemctl(&host.runner),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service"
        ]
    );

    host.runner.clear();
    let changed = CONFIG.replace("version = 2", "version = 3");
    host.node(&changed).up(&Silent).await.unwrap();
    assert_eq!(
        systemctl(&host.runner),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service",
            "restart -- containerd.service",
        ]
    );
}

#[tokio::test]
async fn a_bad_configuration_fails_the_first_phase_and_writes_nothing() {
    let host = Host::new(false);
    let bad = CONFIG.replace("abcdef.0123456789abcdef", "nope");
    let report = Recorder::default();
    let err = host.node(&bad).up(&report).await.unwrap_err();
    assert_eq!(err.phase().unwrap().task, "resolve-goal-state");
    let chain = hostnode::error_chain(&err);
    assert!(
        chain.starts_with("node up: phase \"resolve-goal-state\" failed: "),
        "{chain}"
    );
    assert!(chain.contains("auth.bootstrapToken.token"), "{chain}");
    assert_eq!(
        report.lines(),
        ["start resolve-goal-state@1/8", "failed resolve-goal-state"]
    );
    assert!(!host.root().resolve("/etc").exists());
    assert!(host.runner.commands().is_empty());
}

#[tokio::test]
async fn a_held_lock_refuses_before_any_phase() {
    let host = Host::new(false);
    let _held = hostnode::lock::NodeLock::acquire(&host.root(), "node upgrade").unwrap();
    let report = Recorder::default();
    let err = host.node(CONFIG).reset(&report).await.unwrap_err();
    assert!(
        matches!(
            err,
            LifecycleError::Locked {
                command: Command::Reset,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        hostnode::error_chain(&err).contains("another node command is running"),
        "{err}"
    );
    assert!(report.lines().is_empty());
    assert!(host.runner.commands().is_empty());
}

#[tokio::test]
async fn a_failed_restart_rolls_the_upgrade_back_byte_for_byte() {
    let host = Host::new(true);
    host.node(CONFIG).up(&Silent).await.unwrap();
    let before = host.etc();
    host.runner.clear();
    host.runner.respond(
        &["systemctl", "restart", "--", "kubelet.service"],
        CmdOutput::failed(1, "Job for kubelet.service failed.\n"),
    );
    let new = CONFIG
        .replace("maxPods: 110", "maxPods: 250")
        .replace("version = 2", "version = 3");
    let report = Recorder::default();
    let err = host
        .node(&new)
        .upgrade(Settle::default(), &report)
        .await
        .unwrap_err();
    assert_eq!(err.phase().unwrap().task, "restart");
    // The scripted failure stays for the rollback's own restart of the kubelet: the
    // files are back, and the error says the restart onto them failed too.
    assert!(
        matches!(err.aftermath(), Some(Aftermath::RestoredRestartFailed { problems }) if problems.len() == 1),
        "{err:?}"
    );
    assert!(
        hostnode::error_chain(&err).contains("Job for kubelet.service failed"),
        "{err}"
    );
    assert_eq!(host.etc(), before);
    let lines = report.lines();
    assert!(
        lines.ends_with(&[
            "failed restart".into(),
            "rolling back".into(),
            "RolledBackRestartFailed".into()
        ]),
        "{lines:?}"
    );
    // No unit file changed, so no daemon-reload; the rollback restarts onto the old
    // configuration what the upgrade restarted.
    assert_eq!(
        systemctl(&host.runner),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service",
            "restart -- containerd.service",
            "restart -- kubelet.service",
            "restart -- containerd.service",
            "restart -- kubelet.service",
        ]
    );
    assert!(!host.node(CONFIG).snapshot_dir().exists());

    // The same upgrade with a working restart stands (healthzPort 0: the settle checks
    // the unit alone, which is active).
    let host2 = Host::new(true);
    host2.node(CONFIG).up(&Silent).await.unwrap();
    let done = host2
        .node(&new)
        .upgrade(
            Settle {
                hold: std::time::Duration::ZERO,
                ..Settle::default()
            },
            &Silent,
        )
        .await
        .unwrap();
    assert_eq!(done.restarted, ["containerd.service", "kubelet.service"]);
    assert!(!done.recovered);
    assert_ne!(host2.etc(), before);
}

#[tokio::test]
async fn status_reports_units_and_the_running_predicate() {
    let host = Host::new(true);
    let status = host.node(CONFIG).status().await.unwrap();
    assert!(status.running);
    assert_eq!(status.backend, "none");
    assert_eq!(status.units[1], ("kubelet.service".into(), "active".into()));
    assert!(status.leftover_snapshot.is_none());
    // Nothing written yet: the derived port, no file carrying it, no drop-in.
    assert_eq!(status.kubelet.port, 21149);
    assert_eq!(status.kubelet.port_range, "20000-29999");
    assert_eq!(status.kubelet.configured_port, None);
    assert_eq!(status.kubelet.drop_in_state, DropInState::Missing);
    assert_eq!(
        status.kubelet.systemd, None,
        "the recording systemctl says nothing"
    );
    host.node(CONFIG).up(&Silent).await.unwrap();
    let status = host.node(CONFIG).status().await.unwrap();
    assert_eq!(status.kubelet.configured_port, Some(21149));
    assert_eq!(status.kubelet.drop_in_state, DropInState::Current);
    let edited = CONFIG.replace("pool=edge", "pool=core");
    let status = host.node(&edited).status().await.unwrap();
    assert_eq!(status.kubelet.drop_in_state, DropInState::Stale);

    let host = Host::new(false);
    let status = host.node(CONFIG).status().await.unwrap();
    assert!(!status.running);

    // systemd cannot be asked: an error naming the phase, not "not running".
    let host = Host::new(true);
    let text = CONFIG.to_string();
    let node = Node::new(
        move || AgentConfig::parse(&text, Path::new("a.yaml")),
        "",
        Hooks {
            host_root: host.root(),
            runner: Some(Arc::new({
                let r = RecordingRunner::new();
                r.respond(
                    &["systemctl"],
                    CmdOutput::failed(1, "System has not been booted with systemd\n"),
                );
                r
            })),
            ..Hooks::default()
        },
    );
    let err = node.status().await.unwrap_err();
    assert_eq!(err.phase().unwrap().task, "unit-states");
    assert!(
        hostnode::error_chain(&err).contains("cannot tell whether containerd.service is running"),
        "{err}"
    );
}

/// Refuses to unmount the paths it is given, and unmounts the rest for real.
#[derive(Clone)]
struct Refusing(Vec<PathBuf>);

impl Mounter for Refusing {
    fn unmount_lazy<'a>(&'a self, path: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.0.iter().any(|p| p == path) {
                return Err("refused by the test".into());
            }
            SyscallMounter.unmount_lazy(path).await
        })
    }

    fn unmount_mount<'a>(&'a self, path: &'a Path, id: u32) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if self.0.iter().any(|p| p == path) {
                return Err("refused by the test".into());
            }
            SyscallMounter.unmount_mount(path, id).await
        })
    }
}

/// A reset with a pod volume that will not unmount still removes everything else, then
/// fails at its last phase naming the mount; with the mount gone, the next reset passes.
#[test]
fn reset_keeps_going_past_a_stuck_mount_and_fails_at_the_end() {
    if !in_private_mount_ns(
        module_path!(),
        "reset_keeps_going_past_a_stuck_mount_and_fails_at_the_end",
    ) {
        return;
    }
    let host = Host::new(false);
    let root = host.root();
    let k = root.kubelet_dir();
    mount_tmpfs(&k);
    let stuck = k.join("pods/p1/volumes/kubernetes.io~secret/tok");
    let gone = k.join("pods/p2/volumes/kubernetes.io~projected/p");
    mount_tmpfs(&stuck);
    mount_tmpfs(&gone);
    std::fs::write(stuck.join("token"), b"secret").unwrap();
    std::fs::write(k.join("cpu_manager_state"), b"{}").unwrap();
    std::fs::create_dir_all(k.join("pki")).unwrap();
    std::fs::write(k.join("pki/kubelet-client-current.pem"), b"cert").unwrap();
    let kubeconfig = root.resolve("/etc/kubernetes/kubelet.conf");
    std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
    std::fs::write(&kubeconfig, b"rotated").unwrap();

    let report = Recorder::default();
    let node = host.node_with(
        CONFIG,
        Hooks {
            mounter: Some(Arc::new(Refusing(vec![stuck.clone()]))),
            ..Hooks::default()
        },
    );
    let err = block_on(node.reset(&report)).unwrap_err();
    assert_eq!(err.phase().unwrap().task, "verify-unmounted");
    let source = std::error::Error::source(err.phase().unwrap())
        .unwrap()
        .downcast_ref::<MountsRemain>()
        .expect("a typed MountsRemain");
    assert_eq!(source.source.failures[0].0, stuck);
    assert_eq!(
        report.started(),
        Command::Reset
            .phases()
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{p}@{}/8", i + 1))
            .collect::<Vec<_>>()
    );
    let lines = report.lines();
    assert!(lines.contains(&"kept 1".to_string()), "{lines:?}");
    // The rotated client certificate went with the kubelet directory's contents; the
    // kubeconfig pointing at it goes in the identity phase.
    assert!(
        lines.contains(&"identity kubelet.conf".to_string()),
        "{lines:?}"
    );
    assert!(!kubeconfig.exists());
    // The stuck volume and its contents stay; everything else went.
    assert_eq!(std::fs::read(stuck.join("token")).unwrap(), b"secret");
    assert!(!k.join("cpu_manager_state").exists());
    assert!(!gone.exists());
    assert_eq!(mounts_below(&k), vec![k.clone(), stuck.clone()]);

    let out = block_on(host.node(CONFIG).reset(&Silent)).unwrap();
    assert_eq!(out.kubelet_dir.as_deref(), Some(k.as_path()));
    assert_eq!(mounts_below(&k), vec![k.clone()]);
    assert_eq!(std::fs::read_dir(&k).unwrap().count(), 0);
}

/// `systemd-analyze verify` over the unit `node up` leaves: a stock kubelet unit with a
/// kubeadm-style drop-in that sets its own command line from environment variables,
/// then ours. systemd must load it without a warning about our drop-in, and run exactly
/// our command line (the `%` and `$` in flags literal). Without our `ExecStart=` reset
/// line the same tree is refused, so the check is not vacuous.
#[tokio::test]
async fn systemd_loads_the_rendered_unit_and_runs_our_command_line() {
    crate::support::require_program("systemd-analyze", "systemd");
    let host = Host::new(false);
    let root = host.root();
    let kubelet = host.dir.path().join("bin/kubelet");
    std::fs::create_dir_all(kubelet.parent().unwrap()).unwrap();
    std::fs::write(&kubelet, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(
        &kubelet,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let units = root.resolve("/etc/systemd/system");
    std::fs::create_dir_all(units.join("kubelet.service.d")).unwrap();
    std::fs::write(
        units.join("kubelet.service"),
        format!(
            "[Unit]\nDescription=kubelet\n\n[Service]\nExecStart={}\nRestart=always\n\n[Install]\nWantedBy=multi-user.target\n",
            kubelet.display()
        ),
    )
    .unwrap();
    std::fs::write(
        units.join("kubelet.service.d/10-kubeadm.conf"),
        format!(
            "[Service]\nEnvironment=\"KUBELET_KUBECONFIG_ARGS=--kubeconfig=/etc/kubernetes/kubelet.conf\"\nEnvironmentFile=-/etc/default/kubelet\nExecStart=\nExecStart={} $KUBELET_KUBECONFIG_ARGS $KUBELET_EXTRA_ARGS\n",
            kubelet.display()
        ),
    )
    .unwrap();
    let config = CONFIG
        .replace(
            "  extraArgs: [--node-labels=pool=edge]",
            &format!(
                "  path: {}\n  extraArgs: [--node-labels=pool=edge, \"--eviction-hard=memory.available<5%\", \"--x=$HOME\"]",
                kubelet.display()
            ),
        );
    let up = host.node(&config).up(&Silent).await.unwrap();
    assert_eq!(up.goal.node_start.kubelet_port, 21149);
    let written: serde_yaml::Value = serde_yaml::from_slice(
        &std::fs::read(root.resolve("/etc/kubernetes/kubelet/config.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(written["port"].as_u64(), Some(21149));
    assert_eq!(written["maxPods"].as_u64(), Some(110));

    let verify = |unit: &Path| {
        let out = std::process::Command::new("systemd-analyze")
            .arg("verify")
            .arg(unit)
            .env("SYSTEMD_LOG_LEVEL", "debug")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, text) = verify(&units.join("kubelet.service"));
    assert!(ok, "systemd-analyze verify refused the unit:\n{text}");
    // At debug level systemd names each drop-in it loaded ("DropIn Path: ..."); any
    // other line naming ours is a complaint about it (`...10-outpost.conf:5: Unknown
    // key ...`).
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("10-outpost.conf"))
        .collect();
    assert!(!ours.is_empty(), "our drop-in was not loaded:\n{text}");
    for line in ours {
        assert!(
            line.trim().starts_with("DropIn Path:"),
            "systemd complained about our drop-in: {line}"
        );
    }
    let commands: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Command Line: "))
        .collect();
    assert_eq!(commands.len(), 1, "one ExecStart, ours:\n{text}");
    let command = commands[0];
    assert!(
        command.starts_with(&format!(
            "{} --config=/etc/kubernetes/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf --hostname-override=worker-1 ",
            kubelet.display()
        )),
        "{command}"
    );
    assert!(command.contains("memory.available<5%"), "{command}");
    assert!(!command.contains("KUBELET_KUBECONFIG_ARGS"), "{command}");

    // The same tree with our reset line taken out: two command lines, refused.
    let drop_in = units.join("kubelet.service.d/10-outpost.conf");
    let text_before = std::fs::read_to_string(&drop_in).unwrap();
    std::fs::write(&drop_in, text_before.replace("ExecStart=\n", "")).unwrap();
    let (ok, text) = verify(&units.join("kubelet.service"));
    assert!(!ok && text.contains("more than one ExecStart"), "{text}");
}
