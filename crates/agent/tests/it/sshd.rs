//! A real sshd on 127.0.0.1 with a generated host key and one authorized client key,
//! killed on drop. Forwarding is allowed both ways: the tunnel's `-R` and the readiness
//! probe's `-W`. Shared with `bins/outpost-agent/tests/it` (included by path).

#![allow(dead_code)] // each test binary uses part of it

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Sshd {
    _dir: tempfile::TempDir,
    pub port: u16,
    pub client_key: PathBuf,
    pub known_hosts: PathBuf,
    pub user: String,
    process: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn require(tool: &str, package: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join(tool);
        if p.exists() {
            return p;
        }
    }
    panic!("{tool} not found: apt-get install {package}");
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen runs (apt-get install openssh-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Sshd {
    pub async fn start() -> Sshd {
        let sshd = require("sshd", "openssh-server");
        require("ssh", "openssh-client");
        require("ssh-keygen", "openssh-client");
        // sshd refuses to start without its privilege-separation directory.
        std::fs::create_dir_all("/run/sshd").expect("create /run/sshd for sshd");
        let dir = tempfile::tempdir().unwrap();
        let host_key = dir.path().join("host_key");
        let client_key = dir.path().join("client_key");
        keygen(&host_key);
        keygen(&client_key);
        let authorized = dir.path().join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let cfg = dir.path().join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile none\n\
                 AuthorizedKeysFile {ak}\nStrictModes no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nAllowUsers {user}\nUsePAM no\n\
                 AllowTcpForwarding yes\nGatewayPorts clientspecified\nX11Forwarding no\n\
                 PermitTTY no\n",
                hk = host_key.display(),
                ak = authorized.display(),
            ),
        )
        .unwrap();
        let process = Command::new(&sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sshd");
        let known_hosts = dir.path().join("known_hosts");
        let host_pub = std::fs::read_to_string(host_key.with_extension("pub")).unwrap();
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_pub}")).unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "sshd did not listen on {addr}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Sshd {
            _dir: dir,
            port,
            client_key,
            known_hosts,
            user,
            process,
        }
    }

    /// The `tunnel:` block for this sshd.
    pub fn tunnel_yaml(&self, remote_bind: std::net::Ipv4Addr, backoff: &str) -> String {
        format!(
            "tunnel:\n  format: ssh\n  server: '127.0.0.1:{port}'\n  user: {user}\n  \
             identityFile: {key}\n  knownHosts: {kh}\n  remoteBind: {remote_bind}\n  \
             restartBackoff: {backoff}\n  maxRestartBackoff: 10s\n",
            port = self.port,
            user = self.user,
            key = self.client_key.display(),
            kh = self.known_hosts.display(),
        )
    }
}
