//! etcd membership and health.
//!
//! Every function talks to real etcd members through `etcd-client` and takes the
//! endpoints to try (`https://10.0.0.1:2379`, ...) plus [`EtcdOptions`] (mTLS material and
//! timeouts). Decisions are pure functions in [`rules`]: the one classifier of failures into
//! typed classes ([`rules::classify_status`]) and what a member add does about each
//! ([`rules::add_step`]), whom a health check asks and whether they agree on a leader
//! ([`rules::probe_targets`], [`rules::judge_members`]), what a new member boots with
//! ([`rules::initial_cluster`]).
//!
//! - Membership: [`member_add`] (journals the intent first, retries etcd's "unhealthy
//!   cluster" refusal, reads an unanswered add back from the member list instead of
//!   re-sending it), [`member_remove`], [`member_list_via`], [`member_client_ips`],
//!   [`member_client_ips_via`], [`member_hosts_via`], [`member_count`], [`join_state`].
//! - Health: [`etcd_member_status`], [`etcd_cluster_healthy`] (every voting member of the
//!   member list, fails closed).
//! - Storage: [`etcd_storage_at`], [`downgrade_etcd`].

pub mod learner;
// The pure rules live in `hacore` (no etcd client in its tree); re-exported here.
pub use hacore::etcd::rules;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{
    Certificate, Client, ConnectOptions, DowngradeOptions, GetOptions, Identity, MemberAddOptions,
    TlsOptions,
};
use tracing::{info, warn};

use crate::journal::{JoinIntent, JoinIntentJournal, JournalError};
pub use rules::{
    ErrorClass, MemberAnswer, MemberInfo, MemberProblem, RetryPolicy, UNHEALTHY_CLUSTER,
};

/// Where kube-apiserver stores the `kube-system/stratum-certs` Secret (its default
/// `--etcd-prefix` `/registry`, then `secrets/<namespace>/<name>`). Its existence tells
/// an etcd reader that a control-plane join bundle is published. This couples to the
/// apiserver's storage layout, not to an API.
pub const JOIN_BUNDLE_ETCD_KEY: &str = "/registry/secrets/kube-system/stratum-certs";

/// PEM material, inline or from a file. Its `Debug` names a path but never prints inline
/// bytes: they may be a private key.
#[derive(Clone, PartialEq, Eq)]
pub enum PemSource {
    /// Read from this file when connecting.
    Path(PathBuf),
    /// These bytes.
    Pem(Vec<u8>),
}

impl std::fmt::Debug for PemSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PemSource::Path(p) => f.debug_tuple("Path").field(p).finish(),
            PemSource::Pem(b) => write!(f, "Pem(<{} bytes redacted>)", b.len()),
        }
    }
}

impl PemSource {
    fn load(&self, what: &'static str) -> Result<Vec<u8>, EtcdError> {
        match self {
            PemSource::Pem(b) => Ok(b.clone()),
            PemSource::Path(p) => std::fs::read(p).map_err(|e| EtcdError::Tls {
                what,
                reason: format!("cannot read {}: {e}", p.display()),
            }),
        }
    }
}

/// Client mTLS for etcd: the etcd CA, and a client certificate and key it issued (e.g.
/// `etcd/ca.crt`, `apiserver-etcd-client.crt`, `apiserver-etcd-client.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed the members' serving certificates.
    pub ca: PemSource,
    /// Client certificate.
    pub cert: PemSource,
    /// Client key.
    pub key: PemSource,
}

impl EtcdTls {
    /// TLS material read from files at connect time.
    pub fn from_paths(
        ca: impl Into<PathBuf>,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        EtcdTls {
            ca: PemSource::Path(ca.into()),
            cert: PemSource::Path(cert.into()),
            key: PemSource::Path(key.into()),
        }
    }

    /// TLS material given inline.
    pub fn from_pem(ca: &[u8], cert: &[u8], key: &[u8]) -> Self {
        EtcdTls {
            ca: PemSource::Pem(ca.to_vec()),
            cert: PemSource::Pem(cert.to_vec()),
            key: PemSource::Pem(key.to_vec()),
        }
    }

    fn tls_options(&self) -> Result<TlsOptions, EtcdError> {
        let ca = self.ca.load("etcd CA certificate")?;
        let cert = self.cert.load("etcd client certificate")?;
        let key = self.key.load("etcd client key")?;
        Ok(TlsOptions::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key)))
    }
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client TLS; `None` for plain `http://` endpoints.
    pub tls: Option<EtcdTls>,
    /// How long to wait for a connection.
    pub connect_timeout: Duration,
    /// How long to wait for one request's answer.
    pub request_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            tls: None,
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
        }
    }
}

impl EtcdOptions {
    /// Default timeouts with the given TLS.
    pub fn with_tls(tls: Option<EtcdTls>) -> Self {
        EtcdOptions {
            tls,
            ..Default::default()
        }
    }
}

/// An etcd operation that failed, naming the endpoint or member.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint was given.
    #[error("no etcd endpoints given: pass at least one, e.g. https://10.0.0.1:2379")]
    NoEndpoints,
    /// The TLS material could not be loaded.
    #[error("etcd TLS: {what}: {reason}")]
    Tls {
        /// Which file.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A client could not be built for the endpoint (bad URL, TLS with http://, ...).
    #[error("etcd endpoint {endpoint}: {reason}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// None of the endpoints could be reached: could not ask (not "not found").
    #[error("could not reach any etcd endpoint to {op}: {}", tried.join("; "))]
    Unreachable {
        /// The operation.
        op: &'static str,
        /// `endpoint: reason` for each endpoint tried.
        tried: Vec<String>,
    },
    /// A member answered with an error.
    #[error("etcd member {endpoint} refused to {op}: {reason}")]
    Request {
        /// The endpoint that answered.
        endpoint: String,
        /// The operation.
        op: &'static str,
        /// etcd's answer.
        reason: String,
        /// The answer's class, as [`rules::classify_status`] computed it.
        class: ErrorClass,
    },
    /// An add went unanswered and the member list could not be read to learn whether it
    /// was applied: nothing was re-sent, since a second add of a committed one leaves an
    /// unstarted voter that can cost quorum.
    #[error(
        "etcd member {endpoint} did not answer the add of {peer_url} ({reason}), and the member \
         list could not be read to tell whether it was applied ({list_error}); nothing was \
         re-sent. Check `stratum-server etcd members`: remove a member with that peer URL that \
         never started, then retry"
    )]
    AddOutcomeUnknown {
        /// The endpoint that did not answer.
        endpoint: String,
        /// The peer URL being added.
        peer_url: String,
        /// Why no answer came.
        reason: String,
        /// Why the list could not be read.
        list_error: String,
    },
    /// The add was refused as "unhealthy cluster" on every attempt.
    #[error(
        "etcd member {endpoint} kept refusing to add {peer_url}: unhealthy cluster ({attempts} \
         attempts); check `stratum-server etcd health` and that every added member has started"
    )]
    AddRefused {
        /// The endpoint that answered last.
        endpoint: String,
        /// The peer URL being added.
        peer_url: String,
        /// Attempts made.
        attempts: u32,
    },
    /// No member has the peer URL.
    #[error("no etcd member has peer URL {peer_url} (asked {endpoint}; members: {})", known.join(", "))]
    MemberNotFound {
        /// The peer URL looked for.
        peer_url: String,
        /// The endpoint asked.
        endpoint: String,
        /// Members listed, by label.
        known: Vec<String>,
    },
    /// A member has neither a client nor a peer URL.
    #[error("etcd member {member} has no client or peer URL: it cannot be placed on any host")]
    MemberWithoutUrls {
        /// The member.
        member: String,
    },
    /// The cluster is not healthy.
    #[error("etcd cluster is not healthy: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Unhealthy {
        /// Every problem found, each naming its member.
        problems: Vec<MemberProblem>,
        /// Every member's answer.
        answers: Vec<MemberAnswer>,
    },
    /// The member did not answer its status request (as opposed to a failure to set up
    /// the client, or to list the members of a member that did answer).
    #[error("etcd member {endpoint} did not answer its status request: {reason}")]
    NoStatus {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// A downgrade failed at its validate step, before etcd changed anything.
    #[error(
        "etcd at {endpoint} did not validate a downgrade to {target}: {reason}{}",
        if *unsupported { " (this etcd has no downgrade API: it needs etcd 3.5 or later)" } else { "" }
    )]
    DowngradeNotValidated {
        /// The endpoint.
        endpoint: String,
        /// The target version.
        target: String,
        /// etcd's answer.
        reason: String,
        /// Whether the server lacks the downgrade API altogether.
        unsupported: bool,
    },
    /// A downgrade refused before anything was asked of etcd ([`rules::DowngradeRefusal`]).
    #[error(transparent)]
    DowngradeRefused(#[from] rules::DowngradeRefusal),
    /// An enabled downgrade did not reach every member in time.
    #[error(
        "after {} these members do not run etcd {target} yet: {}. {how}, then run this \
         again to wait",
        humantime::format_duration(*waited),
        pending.join(", ")
    )]
    DowngradeIncomplete {
        /// The target.
        target: String,
        /// How long was waited.
        waited: Duration,
        /// `member (version)` of each member not on the target (`not answering` for one
        /// whose version could not be read).
        pending: Vec<String>,
        /// What to do to each member ([`rules::DowngradeMethod::restart_instructions`]),
        /// capitalised.
        how: String,
    },
    /// The join intent could not be recorded: the add was not sent.
    #[error("member add not sent")]
    Journal(#[from] JournalError),
}

/// A failed call, classified.
struct CallError {
    class: ErrorClass,
    reason: String,
    /// The client could not even be set up (TLS files, URL): nothing was asked.
    setup: bool,
}

impl CallError {
    /// The client-setup failure as the caller's error (only when `setup`).
    fn into_bad_endpoint(self, endpoint: &str) -> EtcdError {
        EtcdError::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: self.reason,
        }
    }
}

/// The one classifier of a client error: gRPC statuses go to [`rules::classify`] (etcd's
/// exact message for the typed refusals, with the causes appended for the transport) (tonic's "tcp connect error" alone does not say refused vs
/// timed out); a transport or I/O error raised before a call is a failure to connect.
fn classify(err: &etcd_client::Error) -> CallError {
    let reason = error_text(err);
    let class = match err {
        etcd_client::Error::GRpcStatus(s) => {
            rules::classify(i32::from(s.code()), s.message(), &reason).class
        }
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            ErrorClass::Unreachable
        }
        _ => ErrorClass::Answered,
    };
    CallError {
        class,
        reason,
        setup: false,
    }
}

fn error_text(err: &etcd_client::Error) -> String {
    let mut reason = match err {
        etcd_client::Error::GRpcStatus(s) => s.message().to_string(),
        other => other.to_string(),
    };
    // tonic's "tcp connect error" alone does not say refused vs unroutable vs TLS: append
    // the causes.
    let mut source = match err {
        etcd_client::Error::GRpcStatus(s) => std::error::Error::source(s),
        other => std::error::Error::source(other),
    };
    while let Some(cause) = source {
        let text = cause.to_string();
        if !reason.contains(&text) {
            reason = format!("{reason}: {text}");
        }
        source = cause.source();
    }
    reason
}

fn normalize(endpoint: &str, tls: bool) -> String {
    if endpoint.contains("://") {
        endpoint.to_string()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// A client bound to exactly one endpoint, so every answer is attributable.
pub(crate) async fn connect_one(opts: &EtcdOptions, endpoint: &str) -> Result<Client, EtcdError> {
    let mut co = ConnectOptions::new()
        .with_connect_timeout(opts.connect_timeout)
        .with_timeout(opts.request_timeout);
    if let Some(tls) = &opts.tls {
        co = co.with_tls(tls.tls_options()?);
    }
    let url = normalize(endpoint, opts.tls.is_some());
    Client::connect([url.as_str()], Some(co))
        .await
        .map_err(|e| EtcdError::BadEndpoint {
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        })
}

/// Runs `call` against one endpoint with an overall deadline (a connect that hangs
/// counts as unreachable).
async fn call_one<T, F, Fut>(opts: &EtcdOptions, endpoint: &str, call: F) -> Result<T, CallError>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let client = match connect_one(opts, endpoint).await {
        Ok(c) => c,
        Err(e) => {
            let reason = match e {
                EtcdError::BadEndpoint { reason, .. } => reason,
                other => other.to_string(),
            };
            return Err(CallError {
                class: ErrorClass::Answered,
                reason,
                setup: true,
            });
        }
    };
    let deadline = opts.connect_timeout + opts.request_timeout;
    match tokio::time::timeout(deadline, call(client)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(classify(&e)),
        Err(_) => Err(CallError {
            class: ErrorClass::NoAnswer,
            reason: format!("no answer within {deadline:?}"),
            setup: false,
        }),
    }
}

/// Asks each endpoint in turn until one answers; an answered error is returned at once,
/// an unreachable or silent endpoint moves on to the next. Only for requests that are
/// safe to repeat (reads, and writes whose repetition is harmless).
async fn first_answer<T, F, Fut>(
    opts: &EtcdOptions,
    endpoints: &[String],
    op: &'static str,
    mut call: F,
) -> Result<(String, T), EtcdError>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    if endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    let mut tried = Vec::new();
    for ep in endpoints {
        match call_one(opts, ep, &mut call).await {
            Ok(v) => return Ok((ep.clone(), v)),
            Err(CallError {
                setup: true,
                reason,
                ..
            }) => {
                return Err(EtcdError::BadEndpoint {
                    endpoint: ep.clone(),
                    reason,
                });
            }
            Err(CallError {
                class: ErrorClass::Unreachable | ErrorClass::NoAnswer,
                reason,
                ..
            }) => tried.push(format!("{ep}: {reason}")),
            Err(CallError { reason, class, .. }) => {
                return Err(EtcdError::Request {
                    endpoint: ep.clone(),
                    op,
                    reason,
                    class,
                });
            }
        }
    }
    Err(EtcdError::Unreachable { op, tried })
}

fn to_info(m: &etcd_client::Member) -> MemberInfo {
    MemberInfo {
        id: m.id(),
        name: m.name().to_string(),
        peer_urls: m.peer_urls().to_vec(),
        client_urls: m.client_urls().to_vec(),
        is_learner: m.is_learner(),
    }
}

/// The member list, through the first endpoint that answers: (endpoint, members).
pub async fn member_list_via(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<(String, Vec<MemberInfo>), EtcdError> {
    first_answer(opts, endpoints, "list members", |mut c| async move {
        let r = c.member_list().await?;
        Ok(r.members().iter().map(to_info).collect::<Vec<_>>())
    })
    .await
}

/// A member add request.
#[derive(Debug, Clone)]
pub struct AddMember {
    /// The new member's name (its `--name`).
    pub name: String,
    /// Its peer URL.
    pub peer_url: String,
    /// Add it as a non-voting learner.
    pub learner: bool,
    /// Backoff for the unhealthy-cluster refusal.
    pub retry: RetryPolicy,
}

impl AddMember {
    /// A voting member with the default retry policy.
    pub fn new(name: impl Into<String>, peer_url: impl Into<String>) -> Self {
        AddMember {
            name: name.into(),
            peer_url: peer_url.into(),
            learner: false,
            retry: RetryPolicy::default(),
        }
    }
}

/// What a successful add reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberAdded {
    /// The new member's ID.
    pub id: u64,
    /// `ETCD_INITIAL_CLUSTER` for the new member (with `--initial-cluster-state existing`).
    pub initial_cluster: String,
    /// Attempts made (more than 1: etcd refused with "unhealthy cluster" first).
    pub attempts: u32,
    /// The endpoint that accepted the add.
    pub endpoint: String,
}

/// Adds a member, returning what it boots with. The intent is written to `journal`
/// durably before anything is sent (refused when an earlier intent survives). Each failure
/// is classified once ([`rules::classify_status`]) and the next step follows from its class
/// alone ([`rules::add_step`]): an endpoint that could not be connected to is skipped; etcd's
/// "unhealthy cluster" refusal is retried with `req.retry`'s backoff, each retry logged; an
/// add that went unanswered (timeout, broken connection, etcd's "request timed out") may
/// have been applied, so the member list is read before anything is re-sent, and the
/// unstarted member it shows is adopted as this add's; every other error is returned at once.
pub async fn member_add_with(
    opts: &EtcdOptions,
    endpoints: &[String],
    req: &AddMember,
    journal: Option<&JoinIntentJournal>,
) -> Result<MemberAdded, EtcdError> {
    if endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    if let Some(j) = journal {
        j.record(&JoinIntent {
            member_name: req.name.clone(),
            peer_url: req.peer_url.clone(),
            endpoints: endpoints.to_vec(),
            recorded_at_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        })?;
    }
    let attempts = req.retry.attempts.max(1);
    // Set once any attempt went unanswered: from then on, a "peer URL exists" refusal may
    // be that attempt's own member.
    let mut unanswered: Option<String> = None;
    let mut n = 1;
    loop {
        let mut tried = Vec::new();
        let mut refused: Option<String> = None;
        for ep in endpoints {
            let result = call_one(opts, ep, |mut c| {
                let urls = vec![req.peer_url.clone()];
                let o = if req.learner {
                    MemberAddOptions::new().with_is_learner()
                } else {
                    MemberAddOptions::new()
                };
                async move { c.member_add(urls, Some(o)).await }
            })
            .await;
            let err = match result {
                Ok(resp) => {
                    let id = resp.member().map(|m| m.id()).unwrap_or(0);
                    let members: Vec<MemberInfo> = resp.member_list().iter().map(to_info).collect();
                    let initial_cluster = rules::initial_cluster(&members, id, &req.name);
                    info!(member = %req.name, peer_url = %req.peer_url, endpoint = %ep, id = %format!("{id:x}"), attempts = n, "etcd member added");
                    return Ok(MemberAdded {
                        id,
                        initial_cluster,
                        attempts: n,
                        endpoint: ep.clone(),
                    });
                }
                Err(e) if e.setup => return Err(e.into_bad_endpoint(ep)),
                Err(e) => e,
            };
            match rules::add_step(err.class, unanswered.is_some()) {
                rules::AddStep::NextEndpoint => tried.push(format!("{ep}: {}", err.reason)),
                rules::AddStep::ReadMembers => {
                    if err.class == ErrorClass::NoAnswer {
                        warn!(
                            "etcd member {ep} did not answer the add of {} ({}): reading the member list before any retry",
                            req.peer_url, err.reason
                        );
                        unanswered = Some(ep.clone());
                    }
                    let silent = unanswered.as_deref().unwrap_or(ep);
                    if let Some(added) =
                        adopt_unanswered_add(opts, endpoints, silent, &err.reason, req, n).await?
                    {
                        return Ok(added);
                    }
                    if err.class == ErrorClass::PeerUrlExists {
                        // Listed, yet not as an unstarted member: someone else's member.
                        return Err(EtcdError::Request {
                            endpoint: ep.clone(),
                            op: "add a member",
                            reason: err.reason,
                            class: err.class,
                        });
                    }
                    tried.push(format!("{ep}: {}", err.reason));
                }
                rules::AddStep::Backoff => {
                    refused = Some(ep.clone());
                    break;
                }
                rules::AddStep::Fail => {
                    return Err(EtcdError::Request {
                        endpoint: ep.clone(),
                        op: "add a member",
                        reason: err.reason,
                        class: err.class,
                    });
                }
            }
        }
        let Some(endpoint) = refused else {
            return Err(EtcdError::Unreachable {
                op: "add a member",
                tried,
            });
        };
        if n >= attempts {
            return Err(EtcdError::AddRefused {
                endpoint,
                peer_url: req.peer_url.clone(),
                attempts,
            });
        }
        let pause = req.retry.delay_after(n);
        warn!(
            "etcd member {endpoint} refused to add {}: unhealthy cluster (retrying in {pause:?}, {n}/{attempts})",
            req.peer_url
        );
        tokio::time::sleep(pause).await;
        n += 1;
    }
}

/// After an add went unanswered at `silent`: reads the member list (the other endpoints
/// first) and returns the unstarted member with the add's peer URL, if any. A list that
/// cannot be read is [`EtcdError::AddOutcomeUnknown`]: without it, re-sending could add a
/// second member.
async fn adopt_unanswered_add(
    opts: &EtcdOptions,
    endpoints: &[String],
    silent: &str,
    reason: &str,
    req: &AddMember,
    attempt: u32,
) -> Result<Option<MemberAdded>, EtcdError> {
    let mut order: Vec<String> = endpoints.iter().filter(|e| *e != silent).cloned().collect();
    order.push(silent.to_string());
    let (endpoint, members) = match member_list_via(opts, &order).await {
        Ok(listed) => listed,
        Err(e) => {
            return Err(EtcdError::AddOutcomeUnknown {
                endpoint: silent.to_string(),
                peer_url: req.peer_url.clone(),
                reason: reason.to_string(),
                list_error: e.to_string(),
            });
        }
    };
    let Some(m) = rules::added_member(&members, &req.peer_url) else {
        return Ok(None);
    };
    info!(member = %req.name, peer_url = %req.peer_url, %endpoint, id = %format!("{:x}", m.id), attempts = attempt, "etcd member add was applied though unanswered; adopting it");
    Ok(Some(MemberAdded {
        id: m.id,
        initial_cluster: rules::initial_cluster(&members, m.id, &req.name),
        attempts: attempt,
        endpoint,
    }))
}

/// Adds `new_name` at `new_peer_url` as a voting member (journal first, default retry)
/// and returns the `ETCD_INITIAL_CLUSTER` string it must boot with, state `existing`.
pub async fn member_add(
    opts: &EtcdOptions,
    endpoints: &[String],
    new_name: &str,
    new_peer_url: &str,
    journal: &JoinIntentJournal,
) -> Result<String, EtcdError> {
    member_add_with(
        opts,
        endpoints,
        &AddMember::new(new_name, new_peer_url),
        Some(journal),
    )
    .await
    .map(|a| a.initial_cluster)
}

/// Removes the member with `peer_url`, through the first endpoint that answers. A join's
/// rollback uses the same published endpoints as its add: removing through a VIP would
/// fail exactly when a rollback is needed. Returns the removed member's ID.
pub async fn member_remove(
    opts: &EtcdOptions,
    endpoints: &[String],
    peer_url: &str,
) -> Result<u64, EtcdError> {
    let (endpoint, members) = member_list_via(opts, endpoints).await?;
    let Some(target) = members
        .iter()
        .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
    else {
        return Err(EtcdError::MemberNotFound {
            peer_url: peer_url.to_string(),
            endpoint,
            known: members
                .iter()
                .map(|m| format!("{} {}", m.label(), m.peer_urls.join(",")))
                .collect(),
        });
    };
    let id = target.id;
    // Ask the endpoint that listed first; it answered a moment ago.
    let mut order = vec![endpoint.clone()];
    order.extend(endpoints.iter().filter(|e| **e != endpoint).cloned());
    first_answer(opts, &order, "remove a member", |mut c| async move {
        c.member_remove(id).await
    })
    .await?;
    info!(peer_url, id = %format!("{id:x}"), "etcd member removed");
    Ok(id)
}

/// Hosts of every member's client URLs, from the member at `endpoint` (HAProxy backends).
pub async fn member_client_ips(
    opts: &EtcdOptions,
    endpoint: &str,
) -> Result<Vec<String>, EtcdError> {
    member_client_ips_via(opts, &[endpoint.to_string()]).await
}

/// [`member_client_ips`] through the first of several endpoints that answers.
pub async fn member_client_ips_via(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<Vec<String>, EtcdError> {
    let (_, members) = member_list_via(opts, endpoints).await?;
    Ok(rules::client_hosts(&members))
}

/// One host per member, learners and not-yet-started members included
/// ([`rules::member_hosts`]).
pub async fn member_hosts_via(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<Vec<String>, EtcdError> {
    let (_, members) = member_list_via(opts, endpoints).await?;
    rules::member_hosts(&members).map_err(|u| EtcdError::MemberWithoutUrls { member: u.member })
}

/// How many members (learners included) the cluster has, as the answering member sees it.
pub async fn member_count(opts: &EtcdOptions, endpoints: &[String]) -> Result<usize, EtcdError> {
    Ok(member_list_via(opts, endpoints).await?.1.len())
}

/// What a join needs to know about the cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JoinState {
    /// Members, learners included: a learner is a control plane that is joining.
    pub members: usize,
    /// Whether the join bundle's storage key ([`JOIN_BUNDLE_ETCD_KEY`]) exists.
    pub bundle: bool,
}

/// The member count and whether a join bundle is published, both read linearizably (the
/// client's default), so neither is a stale answer from a lagging member.
pub async fn join_state(opts: &EtcdOptions, endpoints: &[String]) -> Result<JoinState, EtcdError> {
    // The linearizable read goes first, and the member list is then asked of the member
    // that answered it: etcd 3.4's MemberList has no linearizable option (etcd-client sends
    // it as false), but membership changes go through the same log, so a member that has
    // served a linearizable read lists every change committed before it.
    let (answered, count) = first_answer(
        opts,
        endpoints,
        "read the join bundle key",
        |mut c| async move {
            let r = c
                .get(
                    JOIN_BUNDLE_ETCD_KEY,
                    Some(GetOptions::new().with_count_only()),
                )
                .await?;
            Ok(r.count())
        },
    )
    .await?;
    let (_, members) = member_list_via(opts, &[answered]).await?;
    Ok(JoinState {
        members: members.len(),
        bundle: count > 0,
    })
}

/// Asks the member at `endpoint` how it is. A member with no leader is reported, not
/// hidden: it is up and answering, and not part of a working quorum.
pub async fn etcd_member_status(opts: &EtcdOptions, endpoint: &str) -> MemberAnswer {
    // Status alone: it is answered from the member's local state (alarms included, in its
    // `errors`), whereas an alarm list goes through raft and hangs while there is no leader.
    match call_one(opts, endpoint, |mut c| async move { c.status().await }).await {
        Err(e) => MemberAnswer::unreachable(endpoint, e.reason),
        Ok(status) => {
            let member_id = status.header().map(|h| h.member_id());
            let own = rules::alarms_from_status_errors(member_id, status.errors());
            MemberAnswer {
                endpoint: endpoint.to_string(),
                member_id,
                leader: (status.leader() != 0).then_some(status.leader()),
                raft_term: status.raft_term(),
                version: status.version().to_string(),
                is_learner: status.is_learner(),
                alarms: own,
                error: None,
            }
        }
    }
}

/// A healthy cluster's summary.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ClusterHealth {
    /// The leader every member named.
    pub leader: u64,
    /// Every member's answer.
    pub members: Vec<MemberAnswer>,
}

/// Fails closed. The member list is read through `endpoints` (the first that answers);
/// then every voting member of that list is asked at its own client URL, concurrently, and
/// each must have started, answer as itself, know a leader and raise no alarm, and all
/// must name the same leader ([`rules::judge_members`]). The endpoints given only locate
/// the cluster: a dead member left off them, or a live one listed twice, changes nothing.
/// A list that cannot be read is unhealthy too ([`MemberProblem::NoMemberList`]).
pub async fn etcd_cluster_healthy(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<ClusterHealth, EtcdError> {
    let members = match member_list_via(opts, endpoints).await {
        Ok((_, members)) => members,
        Err(EtcdError::NoEndpoints) => {
            return Err(EtcdError::Unhealthy {
                problems: vec![MemberProblem::NoMembers],
                answers: Vec::new(),
            });
        }
        Err(e @ EtcdError::BadEndpoint { .. }) => return Err(e),
        Err(e) => {
            return Err(EtcdError::Unhealthy {
                problems: vec![MemberProblem::NoMemberList {
                    reason: e.to_string(),
                }],
                answers: Vec::new(),
            });
        }
    };
    let targets = rules::probe_targets(&members);
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in targets.iter().enumerate() {
        if let Some(ep) = &t.endpoint {
            let (opts, ep) = (opts.clone(), ep.clone());
            set.spawn(async move { (i, etcd_member_status(&opts, &ep).await) });
        }
    }
    let mut answers: Vec<Option<MemberAnswer>> = vec![None; targets.len()];
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, a)) => answers[i] = Some(a),
            Err(e) => warn!("etcd status task failed: {e}"),
        }
    }
    // A task that died still asked a member: it did not answer, it is not "not started".
    for (a, t) in answers.iter_mut().zip(&targets) {
        if a.is_none()
            && let Some(ep) = &t.endpoint
        {
            *a = Some(MemberAnswer::unreachable(ep, "status task failed"));
        }
    }
    let verdict = rules::judge_members(&targets, &answers);
    let answers: Vec<MemberAnswer> = answers.into_iter().flatten().collect();
    match verdict {
        Ok(leader) => Ok(ClusterHealth {
            leader,
            members: answers,
        }),
        Err(problems) => Err(EtcdError::Unhealthy { problems, answers }),
    }
}

/// Whether a downgrade is enabled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum DowngradeState {
    /// The server has no downgrade API (etcd before 3.5).
    Unsupported,
    /// The server does not report it in its status (etcd 3.5).
    Unknown,
    /// No downgrade enabled.
    Disabled,
    /// A downgrade to `target` is in progress.
    Enabled {
        /// The target version.
        target: String,
    },
}

/// The etcd at one address as a rollback needs it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EtcdStorage {
    /// The version its data is stored at; `None` when the server does not report it
    /// (etcd before 3.6).
    pub storage_version: Option<String>,
    /// The server's version.
    pub server_version: String,
    /// Members of its cluster, learners included.
    pub members: usize,
    /// Downgrade state.
    pub downgrade: DowngradeState,
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut it = version.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Reads the storage version, cluster size and downgrade state of the member at
/// `endpoint`. Both reads are the member's own view, so a member of a cluster that lost
/// quorum still answers and is not mistaken for one that is down.
pub async fn etcd_storage_at(opts: &EtcdOptions, endpoint: &str) -> Result<EtcdStorage, EtcdError> {
    let status = call_one(opts, endpoint, |mut c| async move { c.status().await })
        .await
        .map_err(|e| {
            if e.setup {
                e.into_bad_endpoint(endpoint)
            } else {
                EtcdError::NoStatus {
                    endpoint: endpoint.to_string(),
                    reason: e.reason,
                }
            }
        })?;
    let (_, members) = member_list_via(opts, &[endpoint.to_string()]).await?;
    let server_version = status.version().to_string();
    let downgrade = match status.downgrade_info() {
        Some(d) if d.enabled() => DowngradeState::Enabled {
            target: d.target_version().to_string(),
        },
        Some(_) => DowngradeState::Disabled,
        None => match major_minor(&server_version) {
            Some(v) if v < (3, 5) => DowngradeState::Unsupported,
            _ => DowngradeState::Unknown,
        },
    };
    let storage_version = Some(status.storage_version().to_string()).filter(|s| !s.is_empty());
    Ok(EtcdStorage {
        storage_version,
        server_version,
        members: members.len(),
        downgrade,
    })
}

/// Asks the cluster at `endpoint` to downgrade to `target` (major.minor): etcd validates
/// first, then lowers the cluster version; each member's storage migrates down as it is
/// restarted on the older binary (the caller drives those restarts and waits for every
/// member to report the target). A server without the downgrade API, or one that does not
/// validate, is [`EtcdError::DowngradeNotValidated`] and nothing changed.
///
/// For etcd 3.6 and later only ([`rules::DowngradeMethod::Enable`]): on etcd 3.5 the enable
/// is applied but never answers, and leaves every 3.5 member unable to start again until it
/// is cancelled; [`downgrade_cluster`] never calls this for 3.5.
pub async fn downgrade_etcd(
    opts: &EtcdOptions,
    endpoint: &str,
    target: &str,
) -> Result<(), EtcdError> {
    let t = target.to_string();
    if let Err(e) = call_one(opts, endpoint, |c| async move {
        c.maintenance_client()
            .downgrade(DowngradeOptions::Validate(t))
            .await
    })
    .await
    {
        if e.setup {
            return Err(e.into_bad_endpoint(endpoint));
        }
        // UNIMPLEMENTED: the service predates the downgrade RPC.
        let unsupported = e.class == ErrorClass::Unimplemented;
        return Err(EtcdError::DowngradeNotValidated {
            endpoint: endpoint.to_string(),
            target: target.to_string(),
            reason: e.reason,
            unsupported,
        });
    }
    let t = target.to_string();
    call_one(opts, endpoint, |c| async move {
        c.maintenance_client()
            .downgrade(DowngradeOptions::Enable(t))
            .await
    })
    .await
    .map_err(|e| EtcdError::Request {
        endpoint: endpoint.to_string(),
        op: "enable a downgrade",
        reason: e.reason,
        class: e.class,
    })?;
    info!(endpoint, target, "etcd downgrade enabled");
    Ok(())
}

/// Where a command finds the etcd cluster: the endpoints and TLS it was given, or else the
/// node state in `data_dir` (the cluster's recorded client URLs, and the node's etcd
/// client certificate under its PKI directory).
pub fn access_from(
    endpoints: &[String],
    tls: Option<EtcdTls>,
    data_dir: Option<&std::path::Path>,
) -> Result<(EtcdOptions, Vec<String>), AccessError> {
    let given: Vec<String> = endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect();
    let state = match data_dir {
        Some(d) => crate::nodestate::NodeState::load(d)?.map(|s| (d, s)),
        None => None,
    };
    match (given.is_empty(), state) {
        (false, state) => {
            let tls = tls.or_else(|| {
                state
                    .as_ref()
                    .and_then(|(_, s)| crate::join::etcd_options(&s.pki_dir).tls)
            });
            Ok((EtcdOptions::with_tls(tls), given))
        }
        (true, Some((_, s))) => {
            let opts = match tls {
                Some(t) => EtcdOptions::with_tls(Some(t)),
                None => crate::join::etcd_options(&s.pki_dir),
            };
            Ok((opts, s.endpoints()))
        }
        (true, None) => Err(match data_dir {
            Some(d) => AccessError::NoState {
                data_dir: d.to_path_buf(),
            },
            None => AccessError::Nothing,
        }),
    }
}

/// A command that cannot tell where the etcd cluster is.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Neither endpoints nor a data directory were given.
    #[error(
        "no etcd endpoints: pass --endpoints URL,... (or $STRATUM_ETCD_ENDPOINTS), or --data-dir \
         of a control-plane node to use the endpoints its state records"
    )]
    Nothing,
    /// The data directory holds no node state.
    #[error("{} holds no node state: pass --endpoints instead", data_dir.display())]
    NoState {
        /// The directory.
        data_dir: PathBuf,
    },
    /// The node state could not be read.
    #[error(transparent)]
    State(#[from] crate::nodestate::NodeStateError),
}

/// Every member's reported version, as `(name, version)`, read at its own client
/// URL. A member that does not answer is an error naming it: its version is unknown, and
/// the cluster version cannot be told without it.
pub async fn member_versions(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<Vec<(String, String)>, EtcdError> {
    let (_, members) = member_list_via(opts, endpoints).await?;
    let mut out = Vec::new();
    // Learners included: a learner on another version would be left behind too.
    for m in &members {
        let Some(ep) = m.client_urls.first() else {
            return Err(EtcdError::NoStatus {
                endpoint: m.label(),
                reason: "the member has not started: its version is unknown".into(),
            });
        };
        let a = etcd_member_status(opts, ep).await;
        if let Some(reason) = a.error {
            return Err(EtcdError::NoStatus {
                endpoint: ep.clone(),
                reason,
            });
        }
        out.push((m.label(), a.version));
    }
    Ok(out)
}

/// Every member's version while members are being restarted: one that does not answer is
/// `(name, "not answering")` rather than an error, and a member list nobody gives is one
/// entry naming the endpoints asked.
async fn versions_while_restarting(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Vec<(String, String)> {
    let members = match member_list_via(opts, endpoints).await {
        Ok((_, m)) => m,
        Err(e) => return vec![("member list".to_string(), format!("no answer: {e}"))],
    };
    let mut out = Vec::new();
    for m in &members {
        let version = match m.client_urls.first() {
            None => "not started".to_string(),
            Some(ep) => {
                let a = etcd_member_status(opts, ep).await;
                match a.error {
                    Some(_) => "not answering".to_string(),
                    None => a.version,
                }
            }
        };
        out.push((m.label(), version));
    }
    out
}

/// What [`downgrade_cluster`] ended with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DowngradeDone {
    /// The plan etcd accepted.
    pub plan: rules::DowngradePlan,
    /// Every member's version at the end.
    pub members: Vec<(String, String)>,
}

/// `etcd downgrade --to VERSION`: reads every member's version, refuses what etcd cannot
/// do ([`rules::plan_downgrade`]: no downgrade API before etcd 3.5, one minor version at a
/// time) before asking anything, then validates and enables the downgrade
/// ([`downgrade_etcd`]) and waits up to `wait` until every member reports the target
/// (members are restarted on the older binary by their operator meanwhile). Progress goes
/// to `w`, a line per step and per change in the members' versions.
pub async fn downgrade_cluster(
    opts: &EtcdOptions,
    endpoints: &[String],
    target: &str,
    wait: Duration,
    w: &mut (dyn std::io::Write + Send),
) -> Result<DowngradeDone, EtcdError> {
    if rules::MinorVersion::parse(target).is_none() {
        return Err(rules::DowngradeRefusal::BadTarget {
            target: target.to_string(),
        }
        .into());
    }
    let _ = writeln!(w, "reading every member's version");
    let versions = member_versions(opts, endpoints).await?;
    for (m, v) in &versions {
        let _ = writeln!(w, "  {m}: etcd {v}");
    }
    let plan = rules::plan_downgrade(&versions, target)?;
    let how = plan.method.restart_instructions(plan.target);
    match (plan.under_way, plan.method) {
        (true, _) => {
            let _ = writeln!(
                w,
                "a downgrade from {} to {} is under way (some members already run {}): \
                 nothing to enable",
                plan.cluster, plan.target, plan.target
            );
        }
        (false, rules::DowngradeMethod::RollingRestart) => {
            // etcd 3.5's enable is not used: it never answers, and once applied no 3.5
            // member can start again (see hacore::etcd::downgrade).
            let _ = writeln!(
                w,
                "cluster version {}: etcd downgrades {} to {} by restarting members, without \
                 the downgrade API; nothing is asked of etcd",
                plan.cluster, plan.cluster, plan.target
            );
        }
        (false, rules::DowngradeMethod::Enable) => {
            let _ = writeln!(
                w,
                "cluster version {}: asking etcd to validate and enable a downgrade to {}",
                plan.cluster, plan.target
            );
            let (endpoint, _) = member_list_via(opts, endpoints).await?;
            downgrade_etcd(opts, &endpoint, &plan.target.to_string()).await?;
            let _ = writeln!(w, "downgrade enabled");
        }
    }
    let _ = writeln!(w, "now {how}");
    let _ = writeln!(
        w,
        "waiting up to {} for every member to run etcd {}",
        humantime::format_duration(wait),
        plan.target
    );
    let started = tokio::time::Instant::now();
    let mut last = Vec::new();
    loop {
        let now = versions_while_restarting(opts, endpoints).await;
        let pending = hacore::etcd::downgrade::members_not_on(&now, plan.target);
        if !now.is_empty() && pending.is_empty() {
            let _ = writeln!(w, "every member runs etcd {}", plan.target);
            return Ok(DowngradeDone { plan, members: now });
        }
        if pending != last {
            let _ = writeln!(w, "  not yet on {}: {}", plan.target, pending.join(", "));
            last = pending.clone();
        }
        if started.elapsed() >= wait {
            let mut how = how;
            if let Some(first) = how.get_mut(..1) {
                first.make_ascii_uppercase();
            }
            return Err(EtcdError::DowngradeIncomplete {
                target: plan.target.to_string(),
                waited: wait,
                pending,
                how,
            });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_without_scheme_follow_tls() {
        assert_eq!(normalize("10.0.0.1:2379", true), "https://10.0.0.1:2379");
        assert_eq!(normalize("10.0.0.1:2379", false), "http://10.0.0.1:2379");
        assert_eq!(normalize("http://a:1", true), "http://a:1");
    }

    #[test]
    fn tls_debug_names_paths_but_prints_no_key() {
        let tls = EtcdTls::from_pem(
            b"CA PEM",
            b"CERT PEM",
            b"-----BEGIN PRIVATE KEY----- SECRET",
        );
        let opts = EtcdOptions::with_tls(Some(tls));
        let text = format!("{opts:?}");
        assert!(
            !text.contains("SECRET") && !text.contains("BEGIN"),
            "{text}"
        );
        // Nor as the byte list a derived Debug prints ("S, E, C" = 83, 69, 67).
        assert!(!text.contains("83, 69, 67"), "{text}");
        assert!(text.contains("redacted"), "{text}");
        let files = EtcdTls::from_paths("/pki/ca.crt", "/pki/c.crt", "/pki/c.key");
        assert!(format!("{files:?}").contains("/pki/c.key"));
    }

    #[test]
    fn versions() {
        assert_eq!(major_minor("3.4.23"), Some((3, 4)));
        assert_eq!(major_minor("x"), None);
    }

    #[tokio::test]
    async fn no_endpoints_is_an_error_not_healthy() {
        let err = etcd_cluster_healthy(&EtcdOptions::default(), &[])
            .await
            .unwrap_err();
        assert!(matches!(err, EtcdError::Unhealthy { .. }), "{err}");
        let err = member_count(&EtcdOptions::default(), &[])
            .await
            .unwrap_err();
        assert!(matches!(err, EtcdError::NoEndpoints));
    }
}
