//! `cargo xtask sandbox`: the whole system on one machine, as processes and network
//! namespaces it creates and removes itself, then a guided tour with real kubectl.
//!
//! - the API double (`testkube serve`) as the cluster's API server, on the sandbox bridge,
//!   serving with the first controller's CA, bootstrap signer and scheduler stand-in on;
//! - `stratum-server up` (first controller, real etcd), `stratum-server join` twice;
//! - `stratum-server nodes reconcile --tunnel ssh`, leader-elected, with its admin listener;
//! - an `sshd` on the bridge, the tunnel end of every worker;
//! - `nebula-manager run --provider process`: one virtual node;
//! - two workers, each in its own network namespace: `outpost-agent join`, a stub kubelet
//!   (`testkube kubelet`) on the node's derived port, and `outpost-agent run`, which keeps
//!   the worker's `ssh -R` tunnel up.
//!
//! With `--kubeconfig F` the workers, the reconciler and nebula-manager use a real
//! cluster's API server instead (`real`); the control-plane hosts keep the API double,
//! since growing a control plane needs its CA's keys.
//!
//! Operations: `docs/sandbox.md`.

mod net;
mod procs;
mod real;
mod tour;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};

use net::{HOST_IP, Net};
use procs::Procs;

/// `cargo xtask sandbox` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run the tour once and exit: 0 when every step passed, else 1 naming the first
    /// failing step. Without it the sandbox stays up until Ctrl-C.
    #[arg(long)]
    pub once: bool,
    /// Working directory for the sandbox's files (PKI, kubeconfigs, etcd data, logs).
    /// Must not exist or be empty; default: a new directory under /tmp.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Keep the working directory after stopping (logs for a failed run).
    #[arg(long)]
    pub keep: bool,
    /// Run the workers, the node-address reconciler and nebula-manager against this
    /// cluster instead of the API double (its server must be https://IPv4:PORT on this
    /// machine's reach; see docs/sandbox.md). What the sandbox creates there is deleted
    /// when it stops.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// The control-plane hosts: names and their addresses on loopback.
const CONTROLLERS: [(&str, Ipv4Addr); 3] = [
    ("cp1", Ipv4Addr::new(127, 0, 211, 11)),
    ("cp2", Ipv4Addr::new(127, 0, 211, 12)),
    ("cp3", Ipv4Addr::new(127, 0, 211, 13)),
];
const WORKERS: u8 = 2;
const API_PORT: u16 = 6443;
const SSHD_PORT: u16 = 2222;
const RECONCILER_ADMIN: &str = "127.0.0.1:9102";
const MANAGER_KUBELET: &str = "127.0.0.1:10250";
const MANAGER_HEALTH: &str = "127.0.0.1:9104";
const MANAGER_ADMIN: &str = "127.0.0.1:9105";
/// The agents' probe and admin listeners, on each worker's own address.
const AGENT_HEALTH_PORT: u16 = 9101;
const AGENT_ADMIN_PORT: u16 = 9103;

/// Where the built binaries are.
struct Bins {
    testkube: PathBuf,
    stratum: PathBuf,
    outpost: PathBuf,
    nebula: PathBuf,
}

/// Prints one step of a long command: its name, then `ok (1.2s)` or the failure.
fn step<T>(what: &str, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    eprint!("sandbox: {what} ... ");
    let start = Instant::now();
    let out = f();
    match &out {
        Ok(_) => eprintln!("ok ({:.1}s)", start.elapsed().as_secs_f64()),
        Err(_) => eprintln!("FAILED"),
    }
    out.with_context(|| what.to_string())
}

/// Runs the sandbox. Errors name the step that failed and what to do.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    preflight()?;
    let bins = step("building the binaries", build)?;
    let (dir, made_dir) = working_dir(args.dir.as_deref())?;
    eprintln!("sandbox: working directory {}", dir.display());
    let cluster_nodes: Vec<String> = (1..=WORKERS)
        .map(worker_name)
        .chain(["nebula-process".to_string()])
        .collect();
    let mut cluster = match &args.kubeconfig {
        None => None,
        Some(kc) => Some(step(
            &format!("checking the cluster of {}", kc.display()),
            || real::inspect(kc, &dir, &cluster_nodes),
        )?),
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let result = {
        // Dropped in reverse order: processes first, then the network.
        let net = step("creating the bridge and the worker namespaces", || {
            Net::create(WORKERS)
        })?;
        let mut procs = Procs::new(&dir)?;
        let outcome = bring_up(&bins, &dir, &mut procs, cluster.as_mut()).and_then(|sbx| {
            let failed = tour::run(&sbx, &mut procs);
            if args.once {
                tour::cleanup(&sbx);
                return Ok(failed);
            }
            println!("\nThe sandbox is up. Point kubectl at it with\n\n    export KUBECONFIG={}\n\nLogs are in {}. Ctrl-C stops every process and removes the sandbox.",
                sbx.kubeconfig.display(), dir.join("logs").display());
            while !stop.load(Ordering::SeqCst) {
                procs.check_all()?;
                std::thread::sleep(Duration::from_millis(500));
            }
            eprintln!("\nsandbox: stopping");
            tour::cleanup(&sbx);
            Ok(failed)
        });
        procs.stop_all();
        if let Some(c) = &cluster {
            // After the kubelets and the manager stopped, or they would register again.
            step("removing the sandbox's objects from the cluster", || {
                real::cleanup(c, &cluster_nodes);
                Ok(())
            })?;
        }
        drop(net);
        outcome
    };
    if made_dir && !args.keep {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the working directory {}", dir.display()))?;
    } else {
        eprintln!("sandbox: kept {}", dir.display());
    }
    match result? {
        None => Ok(ExitCode::SUCCESS),
        Some(step) => {
            eprintln!("sandbox: the tour failed at step: {step}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Root (network namespaces, a bridge, sshd) and the Debian packages of `.ci/packages`:
/// installed when missing, as `.ci/run` does.
fn preflight() -> anyhow::Result<()> {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/packages");
    let text = std::fs::read_to_string(&list)
        .with_context(|| format!("reading the package list {}", list.display()))?;
    let packages: Vec<&str> = text
        .lines()
        .flat_map(|l| l.split('#').next().unwrap_or("").split_whitespace())
        .collect();
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if !missing.is_empty() {
        let line = format!(
            "apt-get install -y --no-install-recommends {}",
            missing.join(" ")
        );
        if !root {
            bail!("missing Debian packages; install them with:\n    sudo {line}");
        }
        eprintln!("sandbox: installing {}", missing.join(" "));
        let ok = Command::new("sh")
            .args(["-c", &format!("apt-get update -qq && {line}")])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        ensure!(ok, "installing the packages failed: run `{line}` and retry");
    }
    ensure!(
        root,
        "the sandbox creates network namespaces, a bridge and an sshd: run it as root"
    );
    for (tool, how) in [
        ("kubectl", "install kubectl (1.27-1.33) on PATH"),
        ("ssh-keygen", "apt-get install openssh-client"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        ensure!(found, "{tool} is not on PATH: {how}");
    }
    Ok(())
}

fn build() -> anyhow::Result<Bins> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--bins"])
        .args(["-p", "testkube", "-p", "stratum-server"])
        .args(["-p", "outpost-agent", "-p", "nebula-manager"])
        .status()
        .context("running cargo build")?;
    ensure!(status.success(), "cargo build failed");
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => PathBuf::from(t),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    };
    let bin = |name: &str| target.join("debug").join(name);
    Ok(Bins {
        testkube: bin("testkube"),
        stratum: bin("stratum-server"),
        outpost: bin("outpost-agent"),
        nebula: bin("nebula-manager"),
    })
}

/// The working directory, and whether the sandbox made it (and so may remove it).
fn working_dir(dir: Option<&Path>) -> anyhow::Result<(PathBuf, bool)> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!("outpost-sandbox.{}", std::process::id())),
    };
    match std::fs::read_dir(&dir) {
        Ok(mut entries) => {
            ensure!(
                entries.next().is_none(),
                "{} is not empty: pass an empty or new --dir",
                dir.display()
            );
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    Ok((std::fs::canonicalize(&dir)?, true))
}

/// What the tour needs to know about the running sandbox.
pub struct Sandbox {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub stratum: PathBuf,
    pub pki: PathBuf,
    pub etcd_endpoints: Vec<String>,
    pub workers: Vec<String>,
}

/// Runs `cmd` to completion; its stdout, or an error with its stderr.
pub fn output(mut cmd: Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{:?} failed ({}): {}{}",
        cmd.get_program(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `f` until it returns `Some`, failing with its last error at the deadline.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    procs: &mut Procs,
    mut f: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f() {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => String::new(),
            Err(e) => format!("{e:#}"),
        };
        procs.check_all()?;
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?} {last}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn kubectl(kubeconfig: &Path) -> Command {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig);
    cmd
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `token create` as JSON.
fn token_create(
    bins: &Bins,
    kubeconfig: &Path,
    pki: &Path,
    extra: &[&str],
) -> anyhow::Result<serde_json::Value> {
    let mut cmd = Command::new(&bins.stratum);
    cmd.args(["token", "create", "-o", "json", "--kubeconfig"])
        .arg(kubeconfig)
        .arg("--pki-dir")
        .arg(pki)
        .args(extra)
        .env_remove("KUBECONFIG");
    Ok(serde_json::from_str(&output(cmd)?)?)
}

fn field(v: &serde_json::Value, key: &str) -> anyhow::Result<String> {
    Ok(v[key]
        .as_str()
        .with_context(|| format!("token create printed no {key}: {v}"))?
        .to_string())
}

/// A worker's node name.
fn worker_name(i: u8) -> String {
    format!("w{i}")
}

fn bring_up(
    bins: &Bins,
    dir: &Path,
    procs: &mut Procs,
    mut cluster: Option<&mut real::Cluster>,
) -> anyhow::Result<Sandbox> {
    // The control plane's API double; the cluster's API (the tour's kubeconfig) is the
    // same server unless --kubeconfig named a real one.
    let kubeconfig = dir.join("admin.kubeconfig");
    let cluster_kc = cluster
        .as_ref()
        .map_or_else(|| kubeconfig.clone(), |c| c.kubeconfig.clone());
    let api_server = cluster
        .as_ref()
        .map_or_else(|| format!("{HOST_IP}:{API_PORT}"), |c| c.server.to_string());
    let root = |name: &str| dir.join(name);
    let pki_of = |name: &str| dir.join(name).join("kubernetes/pki");
    let etcd = Command::new("sh")
        .args(["-c", "command -v etcd"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .context("etcd is not on PATH: apt-get install etcd-server")?;

    // The first controller's shared PKI; the API double serves with its CA.
    let pki = pki_of("cp1");
    step(
        "generating the cluster PKI (stratum-server certs generate)",
        || {
            let mut cmd = Command::new(&bins.stratum);
            cmd.args(["certs", "generate", "--pki-dir"])
                .arg(&pki)
                .args(["--node-name", "cp1", "--node-ip"])
                .arg(CONTROLLERS[0].1.to_string());
            output(cmd).map(|_| ())
        },
    )?;
    step(
        &format!("starting the API double on {HOST_IP}:{API_PORT} (testkube serve)"),
        || {
            let mut cmd = Command::new(&bins.testkube);
            cmd.args(["serve", "--listen", &format!("{HOST_IP}:{API_PORT}")])
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--pki-dir")
                .arg(&pki)
                // As a tunnelled cluster's kube-apiserver is configured (docs/nodeaddr.md).
                .args(["--kubelet-preferred-address-types", "ExternalIP,InternalIP"]);
            let i = procs.spawn("testkube", cmd)?;
            procs
                .get(i)
                .wait_log("testkube serving", Duration::from_secs(30))?;
            Ok(())
        },
    )?;

    // The control plane: up, then two joins.
    for (n, (name, ip)) in CONTROLLERS.iter().enumerate() {
        let r = root(name);
        std::fs::create_dir_all(&r)?;
        write(
            &r.join("node.yaml"),
            &format!(
                "adminListen: 127.0.0.1:{}\ndiscoveryTimeout: 30s\netcd:\n  binary: {etcd}\n  clientPort: 2379\n  peerPort: 2380\n  startTimeout: 120s\n",
                9120 + n
            ),
        )?;
        let _ = ip;
    }
    let flags = |name: &str, ip: Ipv4Addr| -> Vec<String> {
        vec![
            "--node-name".into(),
            name.into(),
            "--node-ip".into(),
            ip.to_string(),
            "--data-dir".into(),
            root(name).join("data").display().to_string(),
            "--pki-dir".into(),
            pki_of(name).display().to_string(),
            "--config".into(),
            root(name).join("node.yaml").display().to_string(),
        ]
    };
    step(
        "starting the first controller with a real etcd (stratum-server up)",
        || {
            let mut cmd = Command::new(&bins.stratum);
            cmd.arg("up")
                .args(flags("cp1", CONTROLLERS[0].1))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env_remove("KUBECONFIG");
            let i = procs.spawn("stratum-cp1", cmd)?;
            procs
                .get(i)
                .wait_log("bootstrap objects in place", Duration::from_secs(120))
        },
    )?;
    let endpoint = |ip: Ipv4Addr| format!("https://{ip}:2379");
    for (name, ip) in &CONTROLLERS[1..] {
        step(
            &format!("joining {name} as a control plane (stratum-server join)"),
            || {
                let grant = token_create(
                    bins,
                    &kubeconfig,
                    &pki,
                    &[
                        "--control-plane",
                        "--ttl",
                        "1h",
                        "--etcd-endpoint",
                        &endpoint(CONTROLLERS[0].1),
                    ],
                )?;
                let mut cmd = Command::new(&bins.stratum);
                cmd.args(["join", "--server", &format!("{HOST_IP}:{API_PORT}")])
                    .args(["--token", &field(&grant, "token")?])
                    .args([
                        "--discovery-token-ca-cert-hash",
                        &field(&grant, "caCertHash")?,
                    ])
                    .arg("--control-plane")
                    .args(flags(name, *ip))
                    // The certificate key through the environment, never argv.
                    .env("STRATUM_CERTIFICATE_KEY", field(&grant, "certificateKey")?)
                    .env_remove("KUBECONFIG");
                procs.spawn(&format!("stratum-{name}"), cmd)?;
                wait_for(
                    &format!("{name} a voting etcd member"),
                    Duration::from_secs(180),
                    procs,
                    || {
                        let mut cmd = Command::new(&bins.stratum);
                        cmd.args(["etcd", "members", "-o", "json"])
                            .args(etcd_flags(&pki, &[endpoint(CONTROLLERS[0].1)]));
                        let v: serde_json::Value = serde_json::from_str(&output(cmd)?)?;
                        let voter = v["members"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|m| m["name"] == *name && m["is_learner"] == false);
                        Ok(voter.then_some(()))
                    },
                )
            },
        )?;
    }
    let etcd_endpoints: Vec<String> = CONTROLLERS.iter().map(|(_, ip)| endpoint(*ip)).collect();

    // The tunnel end: sshd on the bridge, one key for every worker.
    let ssh_dir = dir.join("sshd");
    let user = "root";
    step(&format!("starting sshd on {HOST_IP}:{SSHD_PORT}"), || {
        start_sshd(&ssh_dir, procs)
    })?;

    step(
        "starting the node-address reconciler (stratum-server nodes reconcile)",
        || {
            let mut cmd = Command::new(&bins.stratum);
            cmd.args(["nodes", "reconcile", "--tunnel", "ssh", "--interval", "5s"])
                .args(["--admin-listen", RECONCILER_ADMIN])
                .arg("--kubeconfig")
                .arg(&cluster_kc);
            procs.spawn("reconciler", cmd).map(|_| ())
        },
    )?;
    step("starting nebula-manager with the process provider", || {
        let mut cmd = Command::new(&bins.nebula);
        cmd.args(["run", "--provider", "process", "--state-dir"])
            .arg(dir.join("nebula"))
            .args(["--kubelet-listen", MANAGER_KUBELET])
            .args(["--health-listen", MANAGER_HEALTH])
            .args(["--admin-listen", MANAGER_ADMIN])
            .arg("--kubeconfig")
            .arg(&cluster_kc)
            .env("POD_IP", "127.0.0.1");
        procs.spawn("nebula-manager", cmd).map(|_| ())
    })?;

    // The workers.
    if let Some(c) = cluster.as_deref() {
        step(
            &format!(
                "relaying the workers' namespaces to the cluster's API server {}",
                c.server
            ),
            || real::relay(c, WORKERS, procs),
        )?;
    }
    let mut workers = Vec::new();
    for i in 1..=WORKERS {
        let name = worker_name(i);
        step(
            &format!(
                "joining worker {name} in netns {} (outpost-agent join)",
                net::netns(i)
            ),
            || {
                // Against a real cluster the pin is its CA's hash.
                let ca_dir = cluster
                    .as_ref()
                    .map_or(pki.as_path(), |c| c.ca_dir.as_path());
                let token = token_create(bins, &cluster_kc, ca_dir, &["--ttl", "1h"])?;
                let secret = field(&token, "token")?;
                if let Some(c) = cluster.as_deref_mut() {
                    let id = secret.split('.').next().unwrap_or_default();
                    c.token_ids.push(id.to_string());
                }
                let wroot = root(&name);
                std::fs::create_dir_all(wroot.join("host"))?;
                let config = wroot.join("agent.yaml");
                write(&config, &agent_yaml(&name, i, &wroot, &ssh_dir, user))?;
                let mut cmd = Net::exec(i, &bins.outpost);
                cmd.args(["join", "--server", &api_server])
                    .args(["--token", &secret])
                    .args([
                        "--discovery-token-ca-cert-hash",
                        &field(&token, "caCertHash")?,
                    ])
                    .arg("--config")
                    .arg(&config)
                    .arg("--host-root")
                    .arg(wroot.join("host"))
                    .arg("--no-start");
                output(cmd).map(|_| ())
            },
        )?;
        step(
            &format!("starting {name}'s stub kubelet on its derived port"),
            || {
                let mut port = Command::new(&bins.outpost);
                port.args(["kubelet-port", "--node-name", &name]);
                let port = output(port)?.trim().to_string();
                let mut cmd = Net::exec(i, &bins.testkube);
                cmd.args(["kubelet", "--node", &name])
                    .args(["--listen", &format!("127.0.0.1:{port}")])
                    .args(["--internal-ip", &net::worker_ip(i).to_string()])
                    .arg("--kubeconfig")
                    .arg(&cluster_kc);
                let k = procs.spawn(&format!("kubelet-{name}"), cmd)?;
                procs.get(k).wait_log("served on", Duration::from_secs(30))
            },
        )?;
        step(
            &format!("starting {name}'s agent and its ssh tunnel (outpost-agent run)"),
            || {
                let mut cmd = Net::exec(i, &bins.outpost);
                cmd.args(["run", "--config"])
                    .arg(root(&name).join("agent.yaml"));
                procs.spawn(&format!("agent-{name}"), cmd).map(|_| ())
            },
        )?;
        workers.push(name);
    }
    Ok(Sandbox {
        dir: dir.to_path_buf(),
        kubeconfig: cluster_kc,
        stratum: bins.stratum.clone(),
        pki,
        etcd_endpoints,
        workers,
    })
}

/// The flags `stratum-server etcd` needs to reach the members with the PKI's
/// healthcheck client.
pub fn etcd_flags(pki: &Path, endpoints: &[String]) -> Vec<String> {
    vec![
        "--endpoints".into(),
        endpoints.join(","),
        "--cacert".into(),
        pki.join("etcd/ca.crt").display().to_string(),
        "--cert".into(),
        pki.join("etcd/healthcheck-client.crt")
            .display()
            .to_string(),
        "--key".into(),
        pki.join("etcd/healthcheck-client.key")
            .display()
            .to_string(),
    ]
}

/// The worker's agent.yaml (docs/examples/agent.yaml has every key).
fn agent_yaml(name: &str, i: u8, root: &Path, ssh: &Path, user: &str) -> String {
    let ip = net::worker_ip(i);
    format!(
        "nodeName: {name}\n\
         kubeconfig: {kubeconfig}\n\
         health:\n  listen: {ip}:{AGENT_HEALTH_PORT}\n\
         admin:\n  listen: {ip}:{AGENT_ADMIN_PORT}\n\
         dataPlane:\n  check: tunnel\n\
         tunnel:\n  format: ssh\n  server: {HOST_IP}:{SSHD_PORT}\n  user: {user}\n  identityFile: {key}\n  knownHosts: {known}\n",
        kubeconfig = root
            .join("host/etc/kubernetes/bootstrap-kubelet.conf")
            .display(),
        key = ssh.join("client_key").display(),
        known = ssh.join("known_hosts").display(),
    )
}

fn start_sshd(dir: &Path, procs: &mut Procs) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    // sshd refuses to start without its privilege-separation directory.
    std::fs::create_dir_all("/run/sshd")?;
    for key in ["host_key", "client_key"] {
        let mut cmd = Command::new("ssh-keygen");
        cmd.args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(key));
        output(cmd)?;
    }
    std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys"))?;
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub"))?;
    write(
        &dir.join("known_hosts"),
        &format!("[{HOST_IP}]:{SSHD_PORT} {host_pub}"),
    )?;
    let cfg = dir.join("sshd_config");
    write(
        &cfg,
        &format!(
            "Port {SSHD_PORT}\nListenAddress {HOST_IP}\nHostKey {hk}\nPidFile none\n\
             AuthorizedKeysFile {ak}\nStrictModes no\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nAllowUsers root\nUsePAM no\n\
             AllowTcpForwarding yes\nGatewayPorts clientspecified\nX11Forwarding no\n\
             PermitTTY no\n",
            hk = dir.join("host_key").display(),
            ak = dir.join("authorized_keys").display(),
        ),
    )?;
    let sshd = Command::new("sh")
        .args(["-c", "command -v sshd"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .context("sshd is not on PATH: apt-get install openssh-server")?;
    let mut cmd = Command::new(sshd);
    cmd.args(["-D", "-e", "-f"]).arg(&cfg);
    let i = procs.spawn("sshd", cmd)?;
    procs
        .get(i)
        .wait_log("Server listening", Duration::from_secs(20))
}
