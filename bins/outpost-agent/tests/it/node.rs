//! `outpost-agent node ...` end to end: the real binary under `--host-root`, with a
//! scripted `systemctl` (PID 1 is not systemd on test machines, so the real one cannot
//! manage units) and real mounts in a private mount namespace.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");

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

/// A host tree, two configurations and a scripted systemctl whose behaviour is switched
/// by marker files.
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        std::fs::write(dir.path().join("old.yaml"), CONFIG).unwrap();
        // The upgrade changes the kubelet configuration, containerd's and the unit
        // drop-in, and switches the kubelet to a kubeconfig (so a file appears and one
        // goes).
        let new = CONFIG
            .replace("maxPods: 110", "maxPods: 250")
            .replace("version = 2", "version = 3")
            .replace("pool=edge", "pool=core")
            .replace(
                "  bootstrapToken:\n    apiServer: https://10.0.0.1:6443\n    token: abcdef.0123456789abcdef\n    caFile: /etc/kubernetes/pki/ca.crt\n",
                "  kubeconfig:\n    content: \"apiVersion: v1\\nkind: Config\\n\"\n",
            );
        std::fs::write(dir.path().join("new.yaml"), new).unwrap();
        let d = dir.path().display();
        let script = format!(
            r#"#!/bin/sh
# Stands in for systemctl: logs every call; marker files make restarts fail or crash.
echo "$*" >> {d}/systemctl.log
case "$1" in
  is-active)
    if [ -e {d}/stopped ]; then echo inactive; exit 3; fi
    if [ "$3" = kubelet.service ] && [ -e {d}/kubelet-crashloop ]; then echo activating; exit 3; fi
    echo active; exit 0 ;;
  stop)
    while [ -e {d}/hold-stop ]; do sleep 0.05; done ;;
  show)
    # What systemd 252 prints for a unit whose drop-in set the command line (the
    # command line itself from a marker file the test writes).
    if [ -e {d}/show-exec ]; then
      echo "ExecStart={{ path=/usr/bin/kubelet ; argv[]=$(cat {d}/show-exec) ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }}"
      echo "FragmentPath=/lib/systemd/system/kubelet.service"
      echo "DropInPaths=/etc/systemd/system/kubelet.service.d/10-outpost.conf"
    fi ;;
  restart)
    if [ "$3" = kubelet.service ] && [ -e {d}/crashloop-after-restart ]; then touch {d}/kubelet-crashloop; fi
    if [ "$3" = kubelet.service ] && [ -e {d}/crash-on-kubelet-restart ]; then kill -9 $PPID; sleep 1; exit 1; fi
    if [ "$3" = kubelet.service ] && [ -e {d}/fail-kubelet-restart ]; then
      echo "Job for kubelet.service failed because the control process exited with error code." >&2; exit 1
    fi ;;
esac
exit 0
"#
        );
        let path = dir.path().join("systemctl");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn root(&self) -> PathBuf {
        self.path("root")
    }

    fn mark(&self, name: &str, on: bool) {
        if on {
            std::fs::write(self.path(name), b"").unwrap();
        } else {
            let _ = std::fs::remove_file(self.path(name));
        }
    }

    fn node(&self, args: &[&str]) -> Output {
        let out = Command::new(BIN)
            .arg("node")
            .args(args)
            .arg("--host-root")
            .arg(self.root())
            .env("OUTPOST_SYSTEMCTL", self.path("systemctl"))
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        eprintln!(
            "$ outpost-agent node {}\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn config(&self, name: &str) -> String {
        self.path(name).to_str().unwrap().to_string()
    }

    fn systemctl_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("systemctl.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Every regular file below root/etc except the agent's own directory, with its
    /// bytes and mode.
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
        walk(&self.root().join("etc"), &mut out);
        out
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn upgrade_rolls_back_byte_for_byte_when_the_kubelet_restart_fails() {
    let host = Host::new();
    let up = host.node(&["up", "--config", &host.config("old.yaml")]);
    assert!(up.status.success());
    let before = host.etc();
    assert_eq!(before.len(), 4, "{:?}", before.keys());

    host.mark("fail-kubelet-restart", true);
    std::fs::remove_file(host.path("systemctl.log")).unwrap();
    let out = host.node(&[
        "upgrade",
        "--settle-hold-seconds",
        "0",
        "--config",
        &host.config("new.yaml"),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("phase \"restart\" failed"), "{err}");
    assert!(err.contains("Job for kubelet.service failed"), "{err}");
    assert!(err.contains("previous configuration was restored"), "{err}");
    assert!(
        stdout(&out).contains("[7/9] restart FAILED"),
        "{}",
        stdout(&out)
    );
    // Byte for byte and mode for mode, including the kubeconfig the upgrade created
    // being gone and the bootstrap kubeconfig it removed being back.
    assert_eq!(host.etc(), before);
    assert!(
        !host
            .root()
            .join("etc/outpost-agent/upgrade-snapshot")
            .exists()
    );
    assert_eq!(
        host.systemctl_log(),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service",
            "daemon-reload",
            "restart -- containerd.service",
            "restart -- kubelet.service",
            // Rollback: reload the restored drop-in, restart onto the old configuration.
            "daemon-reload",
            "restart -- containerd.service",
            "restart -- kubelet.service",
        ]
    );

    // With the restart working, the same upgrade goes through and writes the new files.
    host.mark("fail-kubelet-restart", false);
    let out = host.node(&[
        "upgrade",
        "--settle-hold-seconds",
        "0",
        "--config",
        &host.config("new.yaml"),
    ]);
    assert!(out.status.success());
    let after = host.etc();
    assert_ne!(after, before);
    let kubelet = host.root().join("etc/kubernetes/kubelet/config.yaml");
    assert!(String::from_utf8_lossy(&after[&kubelet].0).contains("maxPods: 250"));
    assert!(
        !host
            .root()
            .join("etc/kubernetes/bootstrap-kubelet.conf")
            .exists()
    );

    // Steady state: the same upgrade again changes nothing and restarts nothing.
    std::fs::remove_file(host.path("systemctl.log")).unwrap();
    let out = host.node(&[
        "upgrade",
        "--settle-hold-seconds",
        "0",
        "--config",
        &host.config("new.yaml"),
    ]);
    assert!(out.status.success());
    assert_eq!(host.etc(), after);
    assert_eq!(
        host.systemctl_log(),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service"
        ]
    );
}

#[test]
fn an_upgrade_killed_half_way_is_restored_by_the_next_one() {
    let host = Host::new();
    assert!(
        host.node(&["up", "--config", &host.config("old.yaml")])
            .status
            .success()
    );
    let before = host.etc();

    // systemctl kills the agent (SIGKILL) in the middle of the restart phase: the new
    // configuration is written, the snapshot is on disk, nothing rolled back.
    host.mark("crash-on-kubelet-restart", true);
    let out = host.node(&[
        "upgrade",
        "--settle-hold-seconds",
        "0",
        "--config",
        &host.config("new.yaml"),
    ]);
    assert_eq!(out.status.code(), None, "killed by a signal");
    assert_ne!(host.etc(), before);
    host.mark("crash-on-kubelet-restart", false);

    let status = host.node(&["status", "--config", &host.config("old.yaml")]);
    assert!(
        stdout(&status).contains("an upgrade did not finish"),
        "{}",
        stdout(&status)
    );

    // The next upgrade first restores what the dead one saved, then applies its own
    // configuration (here: the old one again, which is then already in place).
    let out = host.node(&[
        "upgrade",
        "--settle-hold-seconds",
        "0",
        "--config",
        &host.config("old.yaml"),
    ]);
    assert!(out.status.success());
    assert!(stdout(&out).contains("restored the configuration an interrupted upgrade saved"));
    assert_eq!(host.etc(), before);
}

#[test]
fn status_exit_codes_json_and_a_bad_config_names_the_phase() {
    let host = Host::new();
    let out = host.node(&["status", "--config", &host.config("old.yaml"), "-o", "json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["running"], true);
    assert_eq!(v["units"][1]["unit"], "kubelet.service");
    assert_eq!(v["auth"], "bootstrap-token");
    // Before `node up`: the derived port, no file carrying it yet, no drop-in, and a
    // systemd that says nothing.
    let k = &v["kubelet"];
    assert_eq!(k["port"], 21149, "{k}");
    assert_eq!(k["portRange"], "20000-29999");
    assert_eq!(k["configuredPort"], serde_json::Value::Null);
    assert_eq!(k["dropInState"], "missing");
    assert_eq!(k["systemd"], serde_json::Value::Null);

    assert!(
        host.node(&["up", "--config", &host.config("old.yaml")])
            .status
            .success()
    );
    std::fs::write(
        host.path("show-exec"),
        "/usr/bin/kubelet --config=/etc/kubernetes/kubelet/config.yaml --kubeconfig=/etc/kubernetes/kubelet.conf \
         --hostname-override=worker-1 --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
         --rotate-certificates=true --node-labels=pool=edge",
    )
    .unwrap();
    let out = host.node(&["status", "--config", &host.config("old.yaml"), "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let k = &v["kubelet"];
    assert_eq!(k["configuredPort"], 21149, "{k}");
    assert_eq!(k["dropInState"], "current");
    assert_eq!(
        k["dropIn"],
        host.root()
            .join("etc/systemd/system/kubelet.service.d/10-outpost.conf")
            .to_str()
            .unwrap()
    );
    assert_eq!(
        k["systemd"]["fragmentPath"],
        "/lib/systemd/system/kubelet.service"
    );
    assert_eq!(k["systemd"]["execStartFromDropIn"], true, "{k}");
    // Another drop-in sorting after ours set its own command line: status says so.
    std::fs::write(host.path("show-exec"), "/usr/bin/kubelet $KUBELET_ARGS").unwrap();
    let out = host.node(&["status", "--config", &host.config("old.yaml")]);
    assert!(
        stdout(&out).contains("systemd runs something else: /usr/bin/kubelet $KUBELET_ARGS"),
        "{}",
        stdout(&out)
    );
    std::fs::remove_file(host.path("show-exec")).unwrap();

    host.mark("stopped", true);
    let out = host.node(&["status", "--config", &host.config("old.yaml")]);
    assert_eq!(out.status.code(), Some(3));
    assert!(stdout(&out).contains("kubelet.service inactive"));

    // A fresh tree: nothing may be written for a bad configuration.
    let host = Host::new();
    std::fs::write(
        host.path("bad.yaml"),
        CONFIG.replace("abcdef.0123456789abcdef", "nope"),
    )
    .unwrap();
    let out = host.node(&["up", "--config", &host.config("bad.yaml")]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("phase \"resolve-goal-state\" failed"), "{err}");
    assert!(err.contains("auth.bootstrapToken.token"), "{err}");
    assert!(
        !host.root().join("etc").exists(),
        "nothing written for a bad config"
    );
}

#[test]
fn reset_unmounts_and_deletes_nothing_through_a_mount() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "node reset test needs root (it mounts in a private mount namespace): run the tests as root"
    );
    let host = Host::new();
    let root = host.root();
    let k = root.join("var/lib/kubelet");
    std::fs::create_dir_all(&k).unwrap();
    std::fs::create_dir_all(root.join("etc/cni/net.d")).unwrap();
    std::fs::write(root.join("etc/cni/net.d/10-flannel.conflist"), b"{}").unwrap();
    std::fs::create_dir_all(root.join("var/lib/cni/networks/cbr0")).unwrap();
    std::fs::write(root.join("var/lib/cni/networks/cbr0/10.244.0.5"), b"id").unwrap();
    std::fs::create_dir_all(root.join("etc/kubernetes")).unwrap();
    std::fs::write(root.join("etc/kubernetes/kubelet.conf"), b"rotated").unwrap();
    let data = host.path("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("rows"), b"must survive").unwrap();
    let sibling = root.join("var/lib/kubelet-x");
    std::fs::create_dir_all(&sibling).unwrap();
    std::fs::write(sibling.join("keep"), b"sibling").unwrap();

    // One private mount namespace for the mounts and the agent: a tmpfs on the kubelet
    // directory, a secret volume, a bind mount of the data directory with a space in
    // its name, and a tmpfs on kubelet-x. The mount table is printed afterwards.
    let script = format!(
        r#"set -e
K='{k}'
mount -t tmpfs tmpfs "$K"
mkdir -p "$K/pki"
echo cert > "$K/pki/kubelet-client-current.pem"
echo '{{}}' > "$K/cpu_manager_state"
mkdir -p "$K/pods/p1/volumes/kubernetes.io~secret/tok" "$K/pods/p2/volumes/kubernetes.io~local-volume/my pv"
mount -t tmpfs tmpfs "$K/pods/p1/volumes/kubernetes.io~secret/tok"
echo secret > "$K/pods/p1/volumes/kubernetes.io~secret/tok/token"
mount --bind '{data}' "$K/pods/p2/volumes/kubernetes.io~local-volume/my pv"
mount -t tmpfs tmpfs '{sibling}'
echo sibling-tmpfs > '{sibling}/on-tmpfs'
'{bin}' node reset --config '{config}' --host-root '{root}'
echo "--- kubelet dir"
ls -A "$K"
echo "--- mounts"
cat /proc/self/mountinfo
echo "--- kubelet-x"
cat '{sibling}/on-tmpfs'
"#,
        k = k.display(),
        data = data.display(),
        sibling = sibling.display(),
        bin = BIN,
        config = host.config("old.yaml"),
        root = root.display(),
    );
    let out = Command::new("unshare")
        // -n as well: the reset removes the LocalDNS interface, which must not touch
        // the test machine's own links.
        .args(["-m", "-n", "--propagation", "private", "sh", "-c", &script])
        .env("OUTPOST_SYSTEMCTL", host.path("systemctl"))
        .env("NO_COLOR", "1")
        .output()
        .expect("unshare not found: apt-get install util-linux");
    let text = stdout(&out);
    eprintln!("{text}{}", stderr(&out));
    assert!(out.status.success(), "reset failed");
    for phase in [
        "stop",
        "unmount-kubelet-dir",
        "remove-kubelet-state",
        "reset-cni-state",
        "reset-kubelet-identity",
        "cleanup-network",
        "verify-unmounted",
    ] {
        assert!(
            text.contains(&format!("] {phase} ok")),
            "{phase} missing: {text}"
        );
    }
    let (_, rest) = text.split_once("--- kubelet dir\n").unwrap();
    let (listing, rest) = rest.split_once("--- mounts\n").unwrap();
    assert_eq!(listing, "", "left in the kubelet directory");
    let (mounts, sibling_out) = rest.split_once("--- kubelet-x\n").unwrap();
    let below: Vec<&str> = mounts
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| p.starts_with(&format!("{}/", k.display())))
        })
        .collect();
    assert!(below.is_empty(), "still mounted: {below:?}");
    // The kubelet directory's own mount (a dedicated disk) stays, as with kubeadm.
    assert!(
        mounts.lines().any(|l| l.split(' ').nth(4) == k.to_str()),
        "the mount at the kubelet directory was detached"
    );
    assert_eq!(
        sibling_out.trim(),
        "sibling-tmpfs",
        "kubelet-x was unmounted"
    );

    // Outside the namespace: the data behind the bind mount survived; the kubelet
    // directory below its tmpfs was never written.
    assert_eq!(std::fs::read(data.join("rows")).unwrap(), b"must survive");
    assert_eq!(std::fs::read_dir(&k).unwrap().count(), 0);
    assert!(root.join("etc/cni/net.d").is_dir());
    assert_eq!(
        std::fs::read_dir(root.join("etc/cni/net.d"))
            .unwrap()
            .count(),
        0
    );
    assert!(!root.join("var/lib/cni").exists());
    assert!(!root.join("etc/kubernetes/kubelet.conf").exists());
    assert_eq!(std::fs::read(sibling.join("keep")).unwrap(), b"sibling");
    let log = host.systemctl_log();
    assert_eq!(
        log[..2],
        ["stop -- kubelet.service", "stop -- containerd.service"]
    );
}

#[test]
fn up_starts_a_stopped_stack_then_is_steady_and_down_stops_kubelet_first() {
    let host = Host::new();
    host.mark("stopped", true);
    let out = host.node(&["up", "--config", &host.config("old.yaml")]);
    assert!(out.status.success());
    assert_eq!(
        host.systemctl_log(),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service",
            "daemon-reload",
            "start -- containerd.service",
            "start -- kubelet.service",
        ]
    );
    let written = host.etc();
    assert_eq!(written.len(), 4);
    let dropin = host
        .root()
        .join("etc/systemd/system/kubelet.service.d/10-outpost.conf");
    let text = String::from_utf8_lossy(&written[&dropin].0).into_owned();
    assert!(
        text.contains("--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf"),
        "{text}"
    );
    assert_eq!(
        written[&host.root().join("etc/kubernetes/bootstrap-kubelet.conf")].1,
        0o600
    );

    // Running now, same configuration: nothing written, nothing restarted.
    host.mark("stopped", false);
    std::fs::remove_file(host.path("systemctl.log")).unwrap();
    let mtime = std::fs::metadata(&dropin).unwrap().modified().unwrap();
    let out = host.node(&["up", "--config", &host.config("old.yaml")]);
    assert!(out.status.success());
    assert_eq!(
        host.systemctl_log(),
        [
            "is-active -- containerd.service",
            "is-active -- kubelet.service"
        ]
    );
    assert_eq!(
        std::fs::metadata(&dropin).unwrap().modified().unwrap(),
        mtime
    );

    std::fs::remove_file(host.path("systemctl.log")).unwrap();
    let out = host.node(&["down", "--config", &host.config("old.yaml")]);
    assert!(out.status.success());
    assert_eq!(
        host.systemctl_log(),
        ["stop -- kubelet.service", "stop -- containerd.service"]
    );
}

/// A network namespace with dnsmasq, removed on drop.
struct DnsNetns {
    name: String,
    dnsmasq: Option<std::process::Child>,
}

impl Drop for DnsNetns {
    fn drop(&mut self) {
        if let Some(mut child) = self.dnsmasq.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

#[test]
fn up_with_local_dns_in_a_network_namespace_waits_for_real_answers() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "LocalDNS test needs root (ip netns): run the tests as root"
    );
    for (program, package) in [("ip", "iproute2"), ("dnsmasq", "dnsmasq-base")] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .output()
            .unwrap()
            .status
            .success();
        assert!(found, "{program} not found: apt-get install {package}");
    }
    let name = format!("hn-agent-{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &name]).output();
    assert!(
        Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success()
    );
    let mut netns = DnsNetns {
        name: name.clone(),
        dnsmasq: None,
    };
    let run_in = |args: &[&str]| {
        Command::new("ip")
            .args(["netns", "exec", &name])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(run_in(&["ip", "link", "set", "lo", "up"]).status.success());
    // The dummy driver when the kernel has it, else a port-less bridge.
    let kind = if run_in(&["ip", "link", "add", "probe0", "type", "dummy"])
        .status
        .success()
    {
        run_in(&["ip", "link", "del", "probe0"]);
        "dummy"
    } else {
        "bridge"
    };
    // --bind-dynamic: the listener address appears only when `node up` creates it.
    let dnsmasq = Command::new("ip")
        .args([
            "netns",
            "exec",
            &name,
            "dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
        ])
        .args([
            "--listen-address=169.254.20.10",
            "--bind-dynamic",
            "--address=/test/1.2.3.4",
        ])
        .args(["--no-resolv", "--no-hosts", "--port=53"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    netns.dnsmasq = Some(dnsmasq);

    let host = Host::new();
    host.mark("stopped", true);
    let config = format!(
        "{CONFIG}localDNS:\n  interfaceKind: {kind}\n  listeners: [169.254.20.10]\n  probeName: probe.test.\n  readyTimeoutSeconds: 20\n"
    );
    std::fs::write(host.path("dns.yaml"), config).unwrap();
    let agent = |cmd: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &netns.name, BIN, "node", cmd, "--config"])
            .arg(host.path("dns.yaml"))
            .arg("--host-root")
            .arg(host.root())
            .env("OUTPOST_SYSTEMCTL", host.path("systemctl"))
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        eprintln!("{}{}", stdout(&out), stderr(&out));
        out
    };
    let out = agent("up");
    assert!(out.status.success());
    assert!(stdout(&out).contains("] await-local-dns ok"));
    let addrs = run_in(&["ip", "-o", "addr", "show", "dev", "outpost-dns"]);
    assert!(
        stdout(&addrs).contains("169.254.20.10/32"),
        "{}",
        stdout(&addrs)
    );

    let out = agent("down");
    assert!(out.status.success());
    assert!(
        !run_in(&["ip", "link", "show", "outpost-dns"])
            .status
            .success(),
        "interface left behind"
    );
    // Idempotent: a second down finds nothing to remove.
    assert!(agent("down").status.success());
}

/// Set in the re-executed test process to the name of the test it must run.
const INNER_ENV: &str = "OUTPOST_AGENT_IT_INNER";

/// Runs the calling test again in private mount and network namespaces
/// (`unshare -m -n --propagation private`), filtered to this one test. Returns `true` in
/// that inner process, where the caller runs its body (a process's other threads cannot
/// be moved into a new mount namespace one by one, so the whole test binary is re-run).
fn in_private_namespaces(test: &str) -> bool {
    let name = format!("node::{test}");
    if std::env::var(INNER_ENV).is_ok_and(|v| v == name) {
        return true;
    }
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "{name} needs root (it mounts in a private mount namespace): run the tests as root"
    );
    let exe = std::env::current_exe().expect("current test executable");
    let out = Command::new("unshare")
        .args(["-m", "-n", "--propagation", "private"])
        .arg(&exe)
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, &name)
        .output()
        .expect("unshare not found: apt-get install util-linux");
    let out_text = stdout(&out);
    print!("{out_text}");
    eprint!("{}", stderr(&out));
    assert!(
        out.status.success(),
        "{name} failed inside the namespaces ({})",
        out.status
    );
    assert!(
        out_text.contains("test result: ok. 1 passed"),
        "{name}: the inner run did not run exactly this test"
    );
    false
}

/// Every regular file below `dir` with its bytes (symlinks not followed).
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                walk(&p, out);
            } else if meta.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

/// Issue 17 (High): a container still running in its emptyDir swaps a directory with a
/// symlink to somewhere outside the kubelet directory (`renameat2(RENAME_EXCHANGE)` in a
/// loop) while `node reset` walks it. The real binary, in a private mount namespace,
/// must remove nothing outside the kubelet directory. Several rounds, thousands of files
/// each: a path-based walk loses files outside in every round.
#[test]
fn reset_race_with_a_symlink_exchange_touches_nothing_outside() {
    if !in_private_namespaces("reset_race_with_a_symlink_exchange_touches_nothing_outside") {
        return;
    }
    use nix::fcntl::{RenameFlags, renameat2};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let host = Host::new();
    // Everything on a tmpfs of this namespace: nothing real can be touched even if the
    // reset goes wrong.
    let arena = host.path("arena");
    std::fs::create_dir(&arena).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(&arena)
        .status()
        .unwrap();
    assert!(status.success(), "mount tmpfs");
    let outside = arena.join("outside");
    const FILES: usize = 500;
    const PAIRS: usize = 3;
    for sub in ["a", "b"] {
        std::fs::create_dir_all(outside.join(sub)).unwrap();
        for i in 0..FILES {
            std::fs::write(outside.join(sub).join(format!("f{i}")), format!("{sub}{i}")).unwrap();
        }
    }
    let before = tree(&outside);
    let root = arena.join("root");
    let k = root.join("var/lib/kubelet");
    let scratch = k.join("pods/p1/volumes/kubernetes.io~empty-dir/scratch");
    // The binary under test; set to run the race against another build (an old one, to
    // see the test catch a path-based walk).
    let bin = std::env::var("OUTPOST_AGENT_RACE_BIN").unwrap_or_else(|_| BIN.into());

    for round in 0..6 {
        // Each pair: a symlink to `outside` first, then a directory with the same shape.
        // tmpfs lists the newest entry first, so the walk meets a directory before its
        // symlink and the exchanges go on while it is emptied.
        std::fs::create_dir_all(&scratch).unwrap();
        for pair in 0..PAIRS {
            std::os::unix::fs::symlink(&outside, scratch.join(format!("s{pair}"))).unwrap();
            for sub in ["a", "b"] {
                let d = scratch.join(format!("d{pair}")).join(sub);
                std::fs::create_dir_all(&d).unwrap();
                for i in 0..FILES {
                    std::fs::write(d.join(format!("f{i}")), b"pod").unwrap();
                }
            }
        }
        std::fs::write(k.join("cpu_manager_state"), b"{}").unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let dir = std::fs::File::open(&scratch).unwrap();
        let swapper = {
            let (stop, swaps) = (stop.clone(), swaps.clone());
            std::thread::spawn(move || {
                let names: Vec<(String, String)> = (0..PAIRS)
                    .map(|p| (format!("d{p}"), format!("s{p}")))
                    .collect();
                while !stop.load(Ordering::Relaxed) {
                    let mut any = false;
                    for (d, s) in &names {
                        // Fails once the reset removed one of the two.
                        if renameat2(
                            &dir,
                            d.as_str(),
                            &dir,
                            s.as_str(),
                            RenameFlags::RENAME_EXCHANGE,
                        )
                        .is_ok()
                        {
                            swaps.fetch_add(1, Ordering::Relaxed);
                            any = true;
                        }
                    }
                    if !any {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let out = Command::new(&bin)
            .args(["node", "reset", "--config", &host.config("old.yaml")])
            .arg("--host-root")
            .arg(&root)
            .env("OUTPOST_SYSTEMCTL", host.path("systemctl"))
            .env("NO_COLOR", "1")
            .output()
            .unwrap();
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        eprintln!(
            "round {round}: {} exchanges\n{}{}",
            swaps.load(Ordering::Relaxed),
            stdout(&out),
            stderr(&out)
        );
        let after = tree(&outside);
        let lost: Vec<_> = before.keys().filter(|p| !after.contains_key(*p)).collect();
        assert!(
            lost.is_empty(),
            "round {round}: the reset removed {} file(s) outside the kubelet directory, e.g. {:?}",
            lost.len(),
            &lost[..lost.len().min(3)]
        );
        assert_eq!(after, before, "round {round}: files outside changed");
        assert!(out.status.success(), "round {round}: reset failed");
        assert_eq!(
            std::fs::read_dir(&k).unwrap().count(),
            0,
            "round {round}: the kubelet directory is not empty"
        );
    }
}

/// Issue 17 (Medium): a `nodeName` with a newline would add an `ExecStartPre=` line to
/// the kubelet's unit drop-in (a root command at its next start); a unit name with `../`
/// would write a drop-in outside `--host-root`. Both are refused when the configuration
/// loads, naming the field, and nothing is written anywhere.
#[test]
fn config_values_cannot_inject_unit_directives_or_escape_the_host_root() {
    let host = Host::new();
    let injected = CONFIG.replace(
        "nodeName: worker-1",
        "nodeName: \"worker-1\\nExecStartPre=/bin/touch /tmp/outpost-pwned\"",
    );
    std::fs::write(host.path("inject.yaml"), injected).unwrap();
    let escape = CONFIG.replace(
        "kubelet:\n",
        "kubelet:\n  unit: ../../../../escape.service\n",
    );
    std::fs::write(host.path("escape.yaml"), escape).unwrap();

    for (config, field) in [("inject.yaml", "nodeName"), ("escape.yaml", "kubelet.unit")] {
        let out = host.node(&["up", "--config", &host.config(config)]);
        assert_eq!(out.status.code(), Some(1), "{config} was accepted");
        let err = stderr(&out);
        assert!(err.contains(field), "{config}: {err}");
        assert!(
            !host.root().join("etc").exists(),
            "{config}: something was written below the host root"
        );
    }
    // The `../` unit name resolves to a directory beside the host root.
    assert!(
        !host.path("escape.service.d").exists(),
        "wrote outside --host-root"
    );
    assert!(
        host.systemctl_log().is_empty(),
        "systemctl ran: {:?}",
        host.systemctl_log()
    );
}

/// Issue 17: `node` commands take a lock; a second one while the first runs is refused,
/// naming the holder, and changes nothing.
#[test]
fn two_node_commands_at_once_refuse_naming_the_holder() {
    let host = Host::new();
    host.mark("hold-stop", true);
    let first = Command::new(BIN)
        .args(["node", "down", "--config", &host.config("old.yaml")])
        .arg("--host-root")
        .arg(host.root())
        .env("OUTPOST_SYSTEMCTL", host.path("systemctl"))
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first one is inside its stop phase (it holds the lock).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !host.systemctl_log().iter().any(|l| l.starts_with("stop")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first command never reached its stop phase"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let second = host.node(&["reset", "--config", &host.config("old.yaml")]);
    assert_eq!(second.status.code(), Some(1));
    let err = stderr(&second);
    assert!(
        err.contains("another node command is running")
            && err.contains(&format!("pid {}: outpost-agent node down", first.id())),
        "{err}"
    );
    assert!(
        !stdout(&second).contains("resolve-goal-state"),
        "the refused command ran a phase"
    );

    host.mark("hold-stop", false);
    let out = first.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Free again.
    let third = host.node(&["down", "--config", &host.config("old.yaml")]);
    assert!(third.status.success());
}

/// A stand-in for the kubelet's healthz endpoint: answers every request with `status`,
/// switchable while it runs.
struct Healthz {
    addr: std::net::SocketAddr,
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
}

impl Healthz {
    fn start(status: u16) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let code = std::sync::Arc::new(std::sync::atomic::AtomicU16::new(status));
        let shared = code.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let code = shared.load(std::sync::atomic::Ordering::SeqCst);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {code} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                );
            }
        });
        Self { addr, status: code }
    }

    fn set(&self, status: u16) {
        self.status
            .store(status, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Issue 17 (Low): `node upgrade` counted as success once `systemctl restart` exited 0.
/// It now settles: the kubelet must become active and answer its healthz, and stay so;
/// a kubelet that never answers, or that crash-loops, rolls the upgrade back.
#[test]
fn upgrade_rolls_back_unless_the_kubelet_settles() {
    let host = Host::new();
    let healthz = Healthz::start(500);
    for name in ["old.yaml", "new.yaml"] {
        let text = std::fs::read_to_string(host.path(name)).unwrap().replace(
            "healthzPort: 0",
            &format!(
                "healthzPort: {}\n    healthzBindAddress: 127.0.0.1",
                healthz.addr.port()
            ),
        );
        std::fs::write(host.path(name), text).unwrap();
    }
    assert!(
        host.node(&["up", "--config", &host.config("old.yaml")])
            .status
            .success()
    );
    let before = host.etc();
    // Failing cases run into a short deadline; the passing one returns as soon as the
    // hold is over, so it gets a generous one.
    let upgrade = |settle: &str, hold: &str| {
        host.node(&[
            "upgrade",
            "--settle-seconds",
            settle,
            "--settle-hold-seconds",
            hold,
            "--config",
            &host.config("new.yaml"),
        ])
    };

    // The restart "works", but the kubelet answers 500 on healthz: rolled back.
    let out = upgrade("2", "0");
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("phase \"settle\" failed"), "{err}");
    assert!(err.contains("answered 500"), "{err}");
    assert!(err.contains("previous configuration was restored"), "{err}");
    assert_eq!(host.etc(), before);

    // Healthy on healthz, but the unit keeps restarting: rolled back.
    healthz.set(200);
    host.mark("crashloop-after-restart", true);
    let out = upgrade("2", "0");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unit is activating"),
        "{}",
        stderr(&out)
    );
    assert_eq!(host.etc(), before);

    // Active and healthy through the hold: the upgrade stands.
    host.mark("crashloop-after-restart", false);
    host.mark("kubelet-crashloop", false);
    let out = upgrade("60", "1");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("settled (healthz on 127.0.0.1:"),
        "{}",
        stdout(&out)
    );
    assert_ne!(host.etc(), before);
}
