//! [`Builder`]: the settings of an [`ApiServer`] and its start.

use super::*;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Binding the listener failed.
    #[error("binding the API double's listener on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Loading the cluster CA of `--pki-dir` failed.
    #[error("loading the cluster CA from {dir}: {message}")]
    Pki {
        /// The directory.
        dir: PathBuf,
        /// What the pki crate reported.
        message: String,
    },
    /// Generating certificates failed.
    #[error(transparent)]
    Cert(#[from] crate::tls::CertError),
    /// Building the TLS configuration failed.
    #[error("building the TLS configuration: {0}")]
    Tls(String),
    /// Writing the kubeconfig failed.
    #[error("writing the kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Loading the written kubeconfig into a kube::Config failed.
    #[error("loading the kubeconfig {path} into kube::Config: {message}")]
    Client {
        /// The path.
        path: PathBuf,
        /// What kube reported.
        message: String,
    },
}

/// Builds an [`ApiServer`].
#[derive(Default)]
pub struct Builder {
    listen: Option<SocketAddr>,
    kubeconfig_path: Option<PathBuf>,
    mode: AuthMode,
    tokens: HashMap<String, UserInfo>,
    authorizer: Option<Authorizer>,
    client_cas: Vec<String>,
    bookmark_interval: Option<Duration>,
    window: Option<usize>,
    token_cleaner: Option<Duration>,
    token_cleaner_off: bool,
    scheduler: bool,
    bootstrap_signer: bool,
    pki_dir: Option<PathBuf>,
    kubelet: KubeletSettings,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("listen", &self.listen)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Listen here instead of 127.0.0.1 on a free port.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }
    /// Write the kubeconfig here instead of into the server's tempdir.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig_path = Some(path.into());
        self
    }
    /// Reject callers without known credentials with 401.
    pub fn strict_auth(mut self) -> Self {
        self.mode = AuthMode::Strict;
        self
    }
    /// Accept a bearer token as this user.
    pub fn token(mut self, token: &str, user: UserInfo) -> Self {
        self.tokens.insert(token.to_string(), user);
        self
    }
    /// Decide every request (and SubjectAccessReview) with this closure; members of
    /// `system:masters` (the kubeconfig's user) always pass.
    pub fn authorizer(
        mut self,
        f: impl Fn(&UserInfo, &Attributes) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.authorizer = Some(Arc::new(f));
        self
    }
    /// Also accept client certificates signed by this CA (PEM).
    pub fn client_ca(mut self, pem: &str) -> Self {
        self.client_cas.push(pem.to_string());
        self
    }
    /// Period of BOOKMARK events (default 60 s).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = Some(d);
        self
    }
    /// How many change events are retained for watches to resume from (default 10,000).
    pub fn event_window(mut self, n: usize) -> Self {
        self.window = Some(n);
        self
    }
    /// Period of the bootstrap token cleaner (default 1 s).
    pub fn token_cleaner_interval(mut self, d: Duration) -> Self {
        self.token_cleaner = Some(d);
        self
    }
    /// Turn the bootstrap token cleaner on or off (on by default, as kubeadm enables it).
    pub fn token_cleaner(mut self, on: bool) -> Self {
        self.token_cleaner_off = !on;
        self
    }
    /// Run the scheduler stand-in ([`crate::scheduler`]): pending pods get bound to a
    /// fitting Ready node, or `PodScheduled=False` reason `Unschedulable`. Off by default
    /// (tests that bind pods themselves keep full control); `testkube serve` turns it on.
    pub fn scheduler(mut self, on: bool) -> Self {
        self.scheduler = on;
        self
    }
    /// Run the bootstrap signer ([`crate::bootstrap`]): `kube-public/cluster-info` gets a
    /// `jws-kubeconfig-<token-id>` signature per bootstrap token with
    /// `usage-bootstrap-signing`, and anonymous callers may read that ConfigMap even with
    /// [`Builder::strict_auth`]. Off by default; `testkube serve` turns it on.
    pub fn bootstrap_signer(mut self, on: bool) -> Self {
        self.bootstrap_signer = on;
        self
    }
    /// Serve as the API server of an existing cluster PKI: the CA is loaded from
    /// `<dir>/ca.crt` and `<dir>/ca.key` (the layout `stratum-server certs generate`
    /// writes), and the serving and admin certificates are issued from it, so clients
    /// pinning that CA (join discovery) trust this server.
    pub fn pki_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pki_dir = Some(dir.into());
        self
    }
    /// The kubelet address-type order of the proxy.
    pub fn preferred_address_types(mut self, types: Vec<String>) -> Self {
        self.kubelet.preferred_address_types = Some(types);
        self
    }
    /// Verify kubelet serving certificates against this CA (PEM).
    pub fn kubelet_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.kubelet.kubelet_ca = Some(pem.into());
        self
    }
    /// Let the proxy dial kubelets outside loopback.
    pub fn allow_non_loopback_kubelets(mut self, allow: bool) -> Self {
        self.kubelet.allow_non_loopback = allow;
        self
    }

    /// Starts the server.
    pub async fn start(self) -> Result<ApiServer, StartError> {
        let addr = self
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr, source })?;
        let ca = match &self.pki_dir {
            None => Ca::generate("testkube-ca")?,
            Some(dir) => {
                let loaded = pki::Ca::load(dir, "ca").map_err(|e| StartError::Pki {
                    dir: dir.clone(),
                    message: e.to_string(),
                })?;
                Ca::from_pem(loaded.cert_pem(), &loaded.key_pem())?
            }
        };
        let mut sans = vec!["127.0.0.1", "localhost", "::1"];
        let ip = local.ip().to_string();
        if !sans.contains(&ip.as_str()) && !local.ip().is_unspecified() {
            sans.push(&ip);
        }
        let serving = ca.issue("testkube-apiserver", &[], &sans, true, false)?;
        let admin = ca.issue("testkube-admin", &["system:masters"], &[], false, true)?;
        let kubelet_client = ca.issue(
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            &[],
            false,
            true,
        )?;
        let (tls, client_verifier) = server_tls(&serving, ca.cert_pem(), &self.client_cas)?;

        let host = if local.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if local.is_ipv6() {
            format!("[{}]", local.ip())
        } else {
            local.ip().to_string()
        };
        let url = format!("https://{host}:{}", local.port());
        let tempdir = tempfile::Builder::new()
            .prefix("testkube-")
            .tempdir()
            .map_err(|source| StartError::Kubeconfig {
                path: std::env::temp_dir(),
                source,
            })?;
        let kc_path = self
            .kubeconfig_path
            .clone()
            .unwrap_or_else(|| tempdir.path().join("kubeconfig"));
        let kc = kubeconfig::render(
            &url,
            ca.cert_pem(),
            &Credentials::ClientCert {
                cert_pem: admin.cert_pem.clone(),
                key_pem: admin.key_pem.clone(),
            },
        );
        kubeconfig::write(&kc_path, &kc).map_err(|source| StartError::Kubeconfig {
            path: kc_path.clone(),
            source,
        })?;
        let config = load_config(&kc_path).await?;

        let store = Arc::new(Store::new(self.window.unwrap_or(10_000)));
        {
            let mut g = store.lock();
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                api::seed_namespace(&mut g, ns);
            }
        }
        let state = Arc::new(State {
            store,
            faults: Faults::default(),
            log: Mutex::new(Vec::new()),
            policy: Policy {
                mode: self.mode,
                tokens: self.tokens,
                authorizer: self.authorizer,
            },
            bookmark_interval: self.bookmark_interval.unwrap_or(Duration::from_secs(60)),
            gc_kick: Notify::new(),
            server_address: Mutex::new(format!("{host}:{}", local.port())),
            proxy_config: crate::proxy_seam::ProxyHolder::new(&self.kubelet, &kubelet_client),
            cluster_info_public: self.bootstrap_signer,
        });
        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(serve(
            listener,
            tls,
            client_verifier,
            state.clone(),
            cancel.clone(),
        ));
        tasks.spawn(gc_loop(state.clone(), cancel.clone()));
        if self.scheduler {
            tasks.spawn(crate::scheduler::run(state.clone(), cancel.clone()));
        }
        if self.bootstrap_signer {
            tasks.spawn(crate::bootstrap::run(state.clone(), cancel.clone()));
        }
        if !self.token_cleaner_off {
            tasks.spawn(token_cleaner(
                state.clone(),
                self.token_cleaner.unwrap_or(Duration::from_secs(1)),
                cancel.clone(),
            ));
        }
        Ok(ApiServer {
            state,
            url,
            addr: local,
            kubeconfig_path: kc_path,
            config,
            ca,
            admin,
            cancel,
            tasks,
            _tempdir: tempdir,
        })
    }
}

async fn load_config(path: &Path) -> Result<kube::Config, StartError> {
    let err = |message: String| StartError::Client {
        path: path.to_path_buf(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))
}
