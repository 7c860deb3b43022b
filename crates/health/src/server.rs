//! The listener: readiness state the agent reports into, the background data-plane check,
//! and the HTTP/1.1 accept loop.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::error::Error;
use crate::http::{Probe, respond};
use crate::readiness::{CheckVerdict, Conditions, DeliveryMode, NotReady};

/// How often the background data-plane check runs.
///
/// Ten seconds matches the kubelet's default probe period: a broken data plane is noticed
/// within about one probe, while the check (a kernel query in the process that programs the
/// interface) runs at a fixed, low rate no matter how often anyone probes.
pub const DATA_PLANE_CHECK_PERIOD: Duration = Duration::from_secs(10);

/// hyper's smallest allowed read buffer; it also caps the request line plus headers. A
/// probe's request is a few hundred bytes.
const MAX_HEAD_BYTES: usize = 8192;

/// Timing and capacity knobs of the listener. The defaults are what production uses; tests
/// shrink them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Period of the background data-plane check. Default [`DATA_PLANE_CHECK_PERIOD`].
    pub check_period: Duration,
    /// A check run that takes longer counts as failed and is abandoned, so a hung kernel
    /// query cannot freeze the verdict at its last value. Default 5 s.
    pub check_timeout: Duration,
    /// A connection that has not delivered a complete request head within this time is
    /// closed (slowloris). Default 5 s, well above any kubelet probe timeout.
    pub header_read_timeout: Duration,
    /// Connections served at once. A connection accepted beyond it evicts the oldest open
    /// one (closed at once), so clients that hold every slot cannot starve the kubelet's
    /// probes: a new probe connection always gets in, and a flood of new connections
    /// costs the agent no more than this many tasks. Default 64: the kubelet needs one or
    /// two.
    pub max_connections: usize,
    /// Any connection, however busy, is asked to close after this long, so a client that
    /// keeps one alive (or stops reading responses) cannot hold a slot forever. Default 60 s.
    pub connection_lifetime: Duration,
    /// On shutdown (or at the end of a connection's lifetime) an in-flight request gets this
    /// long to finish before its connection is dropped. Default 5 s.
    pub drain_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            check_period: DATA_PLANE_CHECK_PERIOD,
            check_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(5),
            max_connections: 64,
            connection_lifetime: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(5),
        }
    }
}

type CheckFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;
type CheckFn = Arc<dyn Fn() -> CheckFuture + Send + Sync>;

/// The probe listener. Cheap to clone: every clone shares one readiness state, so each of
/// the agent's subsystems can hold one and report into it.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    tuning: Tuning,
    /// The current verdict, read by every probe without taking the lock.
    ready: AtomicBool,
    state: Mutex<State>,
}

struct State {
    conditions: Conditions,
    /// The last evaluated verdict, to log transitions once rather than per probe.
    verdict: Result<(), NotReady>,
    /// Bumped per installed check, so a replaced poller's late verdict is ignored.
    check_generation: u64,
    check_cancel: Option<CancellationToken>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.inner.config)
            .field("tuning", &self.inner.tuning)
            .field("readiness", &self.readiness())
            .finish()
    }
}

impl Server {
    /// A server for `config` (defaults applied) with production [`Tuning`]. It starts not
    /// ready, with the delivery mode seeded to [`DeliveryMode::Streaming`].
    pub fn new(config: Config) -> Server {
        Server::with_tuning(config, Tuning::default())
    }

    /// Like [`Server::new`] with explicit timing and capacity knobs.
    pub fn with_tuning(mut config: Config, mut tuning: Tuning) -> Server {
        config.apply_defaults();
        tuning.max_connections = tuning.max_connections.max(1);
        let conditions = Conditions::default();
        let verdict = conditions.evaluate();
        Server {
            inner: Arc::new(Inner {
                config,
                tuning,
                ready: AtomicBool::new(verdict.is_ok()),
                state: Mutex::new(State {
                    conditions,
                    verdict,
                    check_generation: 0,
                    check_cancel: None,
                }),
            }),
        }
    }

    /// The configuration in effect (defaults applied).
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Binds the configured address. Separate from [`Server::serve`] so the agent fails
    /// fast on a taken address before it starts registering the node.
    pub async fn listen(&self) -> Result<TcpListener, Error> {
        let addr = self.inner.config.listen.clone();
        if !self.inner.config.is_enabled() {
            return Err(Error::Disabled { addr });
        }
        match TcpListener::bind(addr.as_str()).await {
            Ok(listener) => Ok(listener),
            Err(source) if source.kind() == io::ErrorKind::AddrInUse => {
                Err(Error::AddressInUse { addr, source })
            }
            Err(source) => Err(Error::Bind { addr, source }),
        }
    }

    /// Serves `/healthz` and `/readyz` on `listener` until `cancel` is cancelled, then stops
    /// accepting, lets in-flight requests finish (bounded by [`Tuning::drain_timeout`]) and
    /// returns `Ok(())`. The port is released before this returns.
    pub async fn serve(
        &self,
        cancel: CancellationToken,
        listener: TcpListener,
    ) -> Result<(), Error> {
        let tuning = &self.inner.tuning;
        let local = listener
            .local_addr()
            .map_or_else(|_| self.inner.config.listen.clone(), |a| a.to_string());
        match self.readiness() {
            Ok(()) => info!(addr = %local, "health listener serving on http://{local}; ready"),
            Err(reason) => info!(
                addr = %local,
                %reason,
                "health listener serving on http://{local}; not ready yet"
            ),
        }

        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(tuning.header_read_timeout)
            .max_buf_size(MAX_HEAD_BYTES)
            .keep_alive(true);
        let service = Probes {
            inner: self.inner.clone(),
        };
        let mut connections = JoinSet::new();
        // Open connections, oldest first, each with the token that evicts it.
        let mut live: VecDeque<(tokio::task::Id, CancellationToken)> = VecDeque::new();
        // Connections evicted since the limit was hit; logged as one line per burst.
        let mut evicted = 0usize;
        let mut saturated = false;
        // Accept errors come in streaks (out of file descriptors): one warning per streak.
        let mut accept_failing = false;

        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                    let id = match done {
                        Ok((id, ())) => id,
                        Err(err) => {
                            if err.is_panic() {
                                error!(%err, "a health connection task panicked");
                            }
                            err.id()
                        }
                    };
                    live.retain(|(live_id, _)| *live_id != id);
                }
                accepted = listener.accept() => {
                    let (stream, peer) = match accepted {
                        Ok(accepted) => {
                            accept_failing = false;
                            accepted
                        }
                        Err(err) => {
                            // Typically out of file descriptors: back off instead of spinning,
                            // and keep serving once descriptors free up.
                            if !accept_failing {
                                warn!(%err, "health listener could not accept a connection; retrying");
                                accept_failing = true;
                            }
                            tokio::select! {
                                () = cancel.cancelled() => break,
                                () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                            }
                        }
                    };
                    if live.len() >= tuning.max_connections {
                        // Full: the oldest connection makes room. A probe connection is
                        // answered within microseconds of its request, so what is oldest is
                        // a client holding a slot, not a probe.
                        if let Some((_, evict)) = live.pop_front() {
                            evict.cancel();
                        }
                        evicted += 1;
                        if !saturated {
                            warn!(
                                limit = tuning.max_connections,
                                "health listener at its connection limit; closing the oldest connection for each new one"
                            );
                            saturated = true;
                        }
                    } else if saturated && live.len() + 1 < tuning.max_connections {
                        info!(evicted, "health listener below its connection limit again");
                        saturated = false;
                        evicted = 0;
                    }
                    let evict = CancellationToken::new();
                    let handle = connections.spawn(serve_connection(
                        builder.clone(),
                        stream,
                        peer,
                        service.clone(),
                        cancel.clone(),
                        tuning.clone(),
                        evict.clone(),
                    ));
                    live.push_back((handle.id(), evict));
                }
            }
        }

        // Stop accepting first: the port is free for a restarted agent while connections drain.
        drop(listener);
        let open = connections.len();
        let drained = tokio::time::timeout(
            // Each connection bounds its own drain; the margin only covers scheduling.
            tuning.drain_timeout + Duration::from_secs(1),
            async { while connections.join_next().await.is_some() {} },
        )
        .await;
        if drained.is_err() {
            warn!(
                remaining = connections.len(),
                "health connections outlived the drain time; closing them"
            );
            connections.shutdown().await;
        }
        info!(addr = %local, drained = open, "health listener stopped");
        Ok(())
    }

    /// The node identity is registered (or a persisted one was loaded on restart).
    pub fn set_registered(&self) {
        self.inner.update(|c| c.registered = true);
    }

    /// The node identity is no longer usable: for an agent that watches its Node, the
    /// Node was deleted or its kubelet stopped posting Ready. Readiness is withheld until
    /// [`Server::set_registered`] again.
    pub fn set_unregistered(&self) {
        self.inner.update(|c| c.registered = false);
    }

    /// The mesh data plane is established: the tunnel interface is configured and up and
    /// the firewall baseline is installed. Call once, after both succeeded.
    ///
    /// Readiness waits for it because a node without a tunnel carries no mesh traffic; if
    /// such nodes reported ready, a rolling update could replace every agent in the fleet
    /// while none holds a data plane. This is a latch: to notice the data plane breaking
    /// later, also install a check with [`Server::set_data_plane_check`].
    pub fn set_data_plane_ready(&self) {
        self.inner.update(|c| c.data_plane_latched = true);
    }

    /// Records how control-plane events currently reach the agent.
    /// [`DeliveryMode::Unknown`] withholds readiness.
    pub fn set_delivery_mode(&self, mode: DeliveryMode) {
        self.inner.update(|c| c.delivery_mode = mode);
    }

    /// Control-plane event delivery has stopped for good. Permanent.
    ///
    /// The delivery mode cannot say this: the reconnecting client reports only mode
    /// transitions, and on a permanent failure it just returns, leaving the last mode in
    /// place while no events arrive.
    pub fn set_delivery_stopped(&self) {
        self.inner.update(|c| c.delivery_stopped = true);
    }

    /// A long-running subsystem exited before shutdown. Readiness is withheld from then on:
    /// nothing restarts it, and liveness is constant on purpose, so the node must leave
    /// rotation instead. `name` goes to the log only, never into a response.
    pub fn set_subsystem_stopped(&self, name: impl Into<String>) {
        let name = name.into();
        self.inner.update(|c| {
            if !c.stopped_subsystems.contains(&name) {
                c.stopped_subsystems.push(name);
            }
        });
    }

    /// Starts re-checking the data plane in the background: `check` runs at once, then every
    /// [`Tuning::check_period`], until `cancel` is cancelled; readiness uses its last
    /// verdict (on top of the [`Server::set_data_plane_ready`] latch). Until the first run
    /// finishes the node is not ready. A run that exceeds [`Tuning::check_timeout`] or
    /// panics counts as a failure. Installing another check replaces this one.
    ///
    /// The latch alone would report ready for the rest of the process's life, while the data
    /// plane is kernel state others can change (an admin deleting the interface, a module
    /// missing after a kernel upgrade). The check runs on a timer, never per request: the
    /// endpoints are unauthenticated, and a per-probe check would let anyone who reaches
    /// the port drive kernel queries in the process that programs the data plane.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn set_data_plane_check<F, Fut, E>(&self, cancel: CancellationToken, check: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: fmt::Display + 'static,
    {
        let check: CheckFn = Arc::new(move || {
            let run = check();
            Box::pin(async move { run.await.map_err(|e| e.to_string()) })
        });
        let poller_cancel = cancel.child_token();
        let mut generation = 0;
        self.inner.update_state(|st| {
            if let Some(previous) = st.check_cancel.replace(poller_cancel.clone()) {
                previous.cancel();
            }
            st.check_generation += 1;
            generation = st.check_generation;
            st.conditions.data_plane_check = CheckVerdict::Pending;
        });
        tokio::spawn(poll_data_plane(
            Arc::downgrade(&self.inner),
            poller_cancel,
            generation,
            check,
            self.inner.tuning.check_period,
            self.inner.tuning.check_timeout,
        ));
    }

    /// [`Server::set_data_plane_check`] for a blocking check (one that shells out or makes
    /// synchronous syscalls). Each run happens on Tokio's blocking pool. A blocking call
    /// cannot be abandoned, so while a timed-out run is still stuck, later runs fail at
    /// once instead of piling up more stuck threads.
    pub fn set_data_plane_check_blocking<F, E>(&self, cancel: CancellationToken, check: F)
    where
        F: Fn() -> Result<(), E> + Send + Sync + 'static,
        E: fmt::Display + 'static,
    {
        let check = Arc::new(check);
        let busy = Arc::new(AtomicBool::new(false));
        self.set_data_plane_check(cancel, move || {
            let check = check.clone();
            let busy = busy.clone();
            async move {
                if busy.swap(true, Ordering::AcqRel) {
                    return Err("the previous run of the check is still blocked".to_string());
                }
                let run = tokio::task::spawn_blocking(move || {
                    // Cleared on unwind too, so a panicking check does not wedge the poller.
                    let _idle = ClearOnDrop(busy);
                    check().map_err(|e| e.to_string())
                });
                match run.await {
                    Ok(verdict) => verdict,
                    Err(err) => Err(format!("the check panicked: {err}")),
                }
            }
        });
    }

    /// The current verdict: `Ok` when `/readyz` answers 200, otherwise why not.
    pub fn readiness(&self) -> Result<(), NotReady> {
        self.inner.lock().verdict.clone()
    }

    /// Whether `/readyz` currently answers 200.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }
}

struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent under every setter, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut Conditions)) {
        self.update_state(|st| change(&mut st.conditions));
    }

    /// Applies a change, re-evaluates, and logs only when the verdict changed: probes never
    /// log, so a flood of requests cannot flood the log either.
    fn update_state(&self, change: impl FnOnce(&mut State)) {
        let mut st = self.lock();
        change(&mut st);
        let verdict = st.conditions.evaluate();
        if verdict == st.verdict {
            return;
        }
        match (&st.verdict, &verdict) {
            (_, Ok(())) => info!("ready: registered, data plane up, delivery running"),
            (Ok(()), Err(reason)) => warn!(%reason, "not ready"),
            (Err(_), Err(reason)) if reason.is_permanent() => warn!(%reason, "not ready"),
            (Err(_), Err(reason)) => info!(%reason, "still not ready"),
        }
        self.ready.store(verdict.is_ok(), Ordering::Release);
        st.verdict = verdict;
    }

    fn record_check(&self, generation: u64, verdict: CheckVerdict) {
        self.update_state(|st| {
            if st.check_generation == generation {
                st.conditions.data_plane_check = verdict;
            }
        });
    }
}

async fn poll_data_plane(
    inner: Weak<Inner>,
    cancel: CancellationToken,
    generation: u64,
    check: CheckFn,
    period: Duration,
    timeout: Duration,
) {
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // A task per run: a panicking check becomes a failed verdict rather than the end of
        // the poller, and a run past its timeout can be aborted.
        let mut run = tokio::spawn(check());
        let verdict = tokio::select! {
            biased;
            () = cancel.cancelled() => {
                run.abort();
                return;
            }
            outcome = tokio::time::timeout(timeout, &mut run) => match outcome {
                Ok(Ok(Ok(()))) => CheckVerdict::Passed,
                Ok(Ok(Err(reason))) => CheckVerdict::Failed(reason),
                Ok(Err(err)) => CheckVerdict::Failed(format!("the check panicked: {err}")),
                Err(_) => {
                    run.abort();
                    CheckVerdict::Failed(format!("the check did not finish within {timeout:?}"))
                }
            },
        };
        // The server is gone: nobody reads the verdict any more.
        let Some(inner) = inner.upgrade() else { return };
        inner.record_check(generation, verdict);
    }
}

async fn serve_connection(
    builder: http1::Builder,
    stream: TcpStream,
    peer: std::net::SocketAddr,
    service: Probes,
    cancel: CancellationToken,
    tuning: Tuning,
    evict: CancellationToken,
) {
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            log_connection_end(peer, result, &tuning);
            return;
        }
        () = evict.cancelled() => {
            // Dropped at once: the slot is needed now.
            debug!(%peer, "health connection evicted to make room for a new one");
            return;
        }
        () = cancel.cancelled() => {}
        () = tokio::time::sleep(tuning.connection_lifetime) => {
            debug!(%peer, "health connection reached its lifetime; closing it");
        }
    }
    // Finish the request in flight (if any) with `Connection: close`, then hang up.
    conn.as_mut().graceful_shutdown();
    match tokio::time::timeout(tuning.drain_timeout, conn).await {
        Ok(result) => log_connection_end(peer, result, &tuning),
        Err(_) => debug!(%peer, "health connection did not finish within the drain time; dropped"),
    }
}

fn log_connection_end(peer: std::net::SocketAddr, result: hyper::Result<()>, tuning: &Tuning) {
    match result {
        Ok(()) => {}
        Err(err) if err.is_timeout() => debug!(
            %peer,
            timeout = ?tuning.header_read_timeout,
            "closed a health connection that did not send a request head in time"
        ),
        Err(err) => debug!(%peer, %err, "health connection ended with an error"),
    }
}

/// The hyper service: answers from the cached verdict, so a probe costs an atomic load.
#[derive(Clone)]
struct Probes {
    inner: Arc<Inner>,
}

impl Service<Request<Incoming>> for Probes {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let probe = Probe {
            method: req.method(),
            path: req.uri().path(),
            has_body: !req.body().is_end_stream(),
        };
        std::future::ready(Ok(respond(
            &probe,
            self.inner.ready.load(Ordering::Acquire),
        )))
    }
}
