//! Growing the cluster one learner at a time: add the new member as a non-voting learner,
//! let it catch up, then promote it. A learner does not count towards quorum, so a joiner
//! whose etcd never starts cannot cost the cluster its quorum.
//!
//! etcd allows one learner at a time and, with strict reconfiguration checking (the
//! default), refuses a change while some voting member has not been connected for its
//! health interval. Several controllers joining at once therefore queue: each add is
//! retried on exactly those refusals ([`Refusal::TooManyLearners`],
//! [`Refusal::Unhealthy`]) until its deadline. Refusals are typed from the gRPC code and
//! etcd's exact error text (what etcd's own client does in `rpctypes`), never from a
//! substring.
//!
//! An add whose answer is lost (timeout, connection dropped) may have been applied: before
//! every attempt the member list is read linearizably, and an existing member with this
//! peer URL is adopted instead of adding a second one.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, MemberAddOptions, TlsOptions,
};
use tokio::time::Instant;
use tracing::{info, warn};

use super::rules::ErrorClass;
use super::{EtcdOptions, MemberInfo, PemSource};

pub use super::rules::Refusal;

/// A learner add or promote that failed, naming the member.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// No endpoint given.
    #[error("no etcd endpoints to add {peer_url} through")]
    NoEndpoints {
        /// The member's peer URL.
        peer_url: String,
    },
    /// TLS material could not be read.
    #[error("etcd client TLS: cannot read {what}")]
    Tls {
        /// Which file.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// etcd refused for a reason waiting cannot fix.
    #[error("etcd member {endpoint} refused to {op} {peer_url}: {message}")]
    Refused {
        /// The endpoint that answered.
        endpoint: String,
        /// `add` or `promote`.
        op: &'static str,
        /// The member's peer URL.
        peer_url: String,
        /// etcd's answer.
        message: String,
        /// The refusal's class, when it is a known one.
        refusal: Option<Refusal>,
    },
    /// The deadline passed while etcd kept refusing or could not be reached.
    #[error(
        "gave up trying to {op} {peer_url} after {waited:?}; last answer: {last}. Check \
         `stratum-server etcd members` for a learner that never started (remove it) and \
         `stratum-server etcd health`"
    )]
    Deadline {
        /// `add` or `promote`.
        op: &'static str,
        /// The member's peer URL.
        peer_url: String,
        /// How long it tried.
        waited: Duration,
        /// The last refusal or reachability error.
        last: String,
    },
    /// The promoted member is not in the list any more.
    #[error("etcd member {id:x} ({peer_url}) is no longer a member: it was removed meanwhile")]
    Vanished {
        /// Its ID.
        id: u64,
        /// Its peer URL.
        peer_url: String,
    },
}

fn load(src: &PemSource, what: &'static str) -> Result<Vec<u8>, LearnerError> {
    match src {
        PemSource::Pem(b) => Ok(b.clone()),
        PemSource::Path(p) => std::fs::read(p).map_err(|source| LearnerError::Tls { what, source }),
    }
}

async fn connect(opts: &EtcdOptions, endpoint: &str) -> Result<Client, String> {
    let mut co = ConnectOptions::new()
        .with_connect_timeout(opts.connect_timeout)
        .with_timeout(opts.request_timeout);
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else if opts.tls.is_some() {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    };
    if let Some(tls) = &opts.tls {
        let (ca, cert, key) = (
            load(&tls.ca, "etcd CA").map_err(|e| e.to_string())?,
            load(&tls.cert, "etcd client certificate").map_err(|e| e.to_string())?,
            load(&tls.key, "etcd client key").map_err(|e| e.to_string())?,
        );
        co = co.with_tls(
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(Identity::from_pem(cert, key)),
        );
    }
    Client::connect([url.as_str()], Some(co))
        .await
        .map_err(|e| e.to_string())
}

/// One failed call: etcd's typed refusal, another answer, or no answer at all.
#[derive(Debug)]
enum CallFailure {
    Refused {
        code: i32,
        message: String,
        refusal: Option<Refusal>,
    },
    NoAnswer(String),
}

impl CallFailure {
    fn text(&self) -> String {
        match self {
            CallFailure::Refused { message, .. } => message.clone(),
            CallFailure::NoAnswer(why) => why.clone(),
        }
    }
}

/// One failed call, classified by the one classifier ([`super::rules::classify`]): a
/// class of no answer (never sent, or the outcome unknown) is [`CallFailure::NoAnswer`];
/// anything etcd answered is [`CallFailure::Refused`] with its typed refusal, if any.
fn failure(err: etcd_client::Error) -> CallFailure {
    let causes = super::error_text(&err);
    match err {
        etcd_client::Error::GRpcStatus(s) => {
            let code = i32::from(s.code());
            let message = s.message().to_string();
            let classified = super::rules::classify(code, &message, &causes);
            match classified.class {
                ErrorClass::Unreachable | ErrorClass::NoAnswer => {
                    CallFailure::NoAnswer(format!("{message} (gRPC code {code})"))
                }
                _ => CallFailure::Refused {
                    code,
                    message,
                    refusal: classified.refusal,
                },
            }
        }
        _ => CallFailure::NoAnswer(causes),
    }
}

async fn call<T, F, Fut>(opts: &EtcdOptions, endpoint: &str, f: F) -> Result<T, CallFailure>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let client = connect(opts, endpoint)
        .await
        .map_err(|e| CallFailure::NoAnswer(format!("cannot connect: {e}")))?;
    let deadline = opts.connect_timeout + opts.request_timeout;
    match tokio::time::timeout(deadline, f(client)).await {
        Ok(r) => r.map_err(failure),
        Err(_) => Err(CallFailure::NoAnswer(format!(
            "no answer within {deadline:?}"
        ))),
    }
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

/// The member list read linearizably, through the first endpoint that answers.
///
/// etcd 3.4's MemberList has no linearizable option (3.5 added one, and etcd-client sends
/// it as false), and a lagging member answers from its own applied state. So this first
/// makes a linearizable read through the same member (a quorum-confirmed read index that
/// the member waits to have applied), and only then lists: membership changes go through
/// the same log, so the list reflects every change committed before the read.
pub async fn linearizable_member_list(
    opts: &EtcdOptions,
    endpoints: &[String],
) -> Result<(String, Vec<MemberInfo>), String> {
    let mut tried = Vec::new();
    for ep in endpoints {
        let result = call(opts, ep, |mut c| async move {
            c.get(
                "stratum/membership-barrier",
                Some(GetOptions::new().with_count_only()),
            )
            .await?;
            c.member_list().await
        })
        .await;
        match result {
            Ok(r) => return Ok((ep.clone(), r.members().iter().map(to_info).collect())),
            Err(e) => tried.push(format!("{ep}: {}", e.text())),
        }
    }
    Err(if tried.is_empty() {
        "no etcd endpoints given".into()
    } else {
        tried.join("; ")
    })
}

/// A learner that is (now) a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LearnerAdded {
    /// Its member ID.
    pub id: u64,
    /// The `--initial-cluster` it boots with (state `existing`).
    pub initial_cluster: String,
    /// Every client URL of the cluster at the add.
    pub cluster_endpoints: Vec<String>,
    /// Attempts made (1 when the first add went through).
    pub attempts: u32,
    /// Whether an existing member with this peer URL was adopted (a lost answer, or a
    /// re-run after an interrupted join).
    pub adopted: bool,
}

/// How long to keep queueing, and the pause between attempts.
#[derive(Debug, Clone, Copy)]
pub struct Queueing {
    /// Give up after this long.
    pub deadline: Duration,
    /// First pause.
    pub initial: Duration,
    /// Longest pause.
    pub max: Duration,
}

impl Default for Queueing {
    /// Five minutes, 250 ms doubling to 2 s: a queue of several joiners, each needing a
    /// start and a catch-up, drains well within it.
    fn default() -> Self {
        Queueing {
            deadline: Duration::from_secs(300),
            initial: Duration::from_millis(250),
            max: Duration::from_secs(2),
        }
    }
}

fn client_urls(members: &[MemberInfo]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in members {
        for u in &m.client_urls {
            if !out.contains(u) {
                out.push(u.clone());
            }
        }
    }
    out
}

/// Adds `name` at `peer_url` as a learner through `endpoints`, queueing behind other
/// learners and strict-reconfiguration refusals until `q.deadline`. Every attempt first
/// reads the member list linearizably and adopts an existing member with this peer URL.
/// `on_queued` is called once per refusal that queues (for progress reporting).
pub async fn add_learner(
    opts: &EtcdOptions,
    endpoints: &[String],
    name: &str,
    peer_url: &str,
    q: Queueing,
    mut on_queued: impl FnMut(Refusal),
) -> Result<LearnerAdded, LearnerError> {
    if endpoints.is_empty() {
        return Err(LearnerError::NoEndpoints {
            peer_url: peer_url.into(),
        });
    }
    let start = Instant::now();
    let mut pause = q.initial;
    let mut attempts = 0u32;
    loop {
        let last: String;
        match linearizable_member_list(opts, endpoints).await {
            Err(e) => last = format!("member list: {e}"),
            Ok((_, members)) => {
                if let Some(m) = members
                    .iter()
                    .find(|m| m.peer_urls.iter().any(|u| u == peer_url))
                {
                    info!(member = name, peer_url, id = %format!("{:x}", m.id), "adopting the etcd member already added with this peer URL");
                    return Ok(LearnerAdded {
                        id: m.id,
                        initial_cluster: super::rules::initial_cluster(&members, m.id, name),
                        cluster_endpoints: client_urls(&members),
                        attempts,
                        adopted: true,
                    });
                }
                attempts += 1;
                match send_add(opts, endpoints, peer_url).await {
                    Ok((endpoint, id, members)) => {
                        info!(member = name, peer_url, %endpoint, id = %format!("{id:x}"), attempts, "etcd learner added");
                        return Ok(LearnerAdded {
                            id,
                            initial_cluster: super::rules::initial_cluster(&members, id, name),
                            cluster_endpoints: client_urls(&members),
                            attempts,
                            adopted: false,
                        });
                    }
                    Err((
                        endpoint,
                        CallFailure::Refused {
                            message,
                            refusal,
                            code,
                        },
                    )) => match refusal {
                        Some(r) if r.add_may_queue() => {
                            on_queued(r);
                            last = format!("{endpoint}: {message}");
                        }
                        _ => {
                            return Err(LearnerError::Refused {
                                endpoint,
                                op: "add",
                                peer_url: peer_url.into(),
                                message: format!("{message} (gRPC code {code})"),
                                refusal,
                            });
                        }
                    },
                    // No answer: it may or may not have been applied; the list at the top
                    // of the next attempt tells.
                    Err((endpoint, CallFailure::NoAnswer(why))) => {
                        last = format!("{endpoint}: {why}");
                    }
                }
            }
        }
        if start.elapsed() + pause > q.deadline {
            return Err(LearnerError::Deadline {
                op: "add",
                peer_url: peer_url.into(),
                waited: start.elapsed(),
                last,
            });
        }
        warn!(
            member = name,
            peer_url, "etcd add queued ({last}); retrying in {pause:?}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(q.max);
    }
}

/// Sends one learner add through the first endpoint that answers.
async fn send_add(
    opts: &EtcdOptions,
    endpoints: &[String],
    peer_url: &str,
) -> Result<(String, u64, Vec<MemberInfo>), (String, CallFailure)> {
    let mut last = None;
    for ep in endpoints {
        let urls = vec![peer_url.to_string()];
        let r = call(opts, ep, |mut c| async move {
            c.member_add(urls, Some(MemberAddOptions::new().with_is_learner()))
                .await
        })
        .await;
        match r {
            Ok(resp) => {
                let id = resp.member().map(|m| m.id()).unwrap_or(0);
                return Ok((
                    ep.clone(),
                    id,
                    resp.member_list().iter().map(to_info).collect(),
                ));
            }
            Err(CallFailure::Refused {
                refusal: Some(Refusal::NotSupportedForLearner),
                message,
                ..
            }) => last = Some((ep.clone(), CallFailure::NoAnswer(message))),
            Err(f @ CallFailure::Refused { .. }) => return Err((ep.clone(), f)),
            Err(f) => last = Some((ep.clone(), f)),
        }
    }
    Err(last.unwrap_or_else(|| (String::new(), CallFailure::NoAnswer("no endpoints".into()))))
}

/// Promotes learner `id` once it has caught up, retrying etcd's "not in sync" (and
/// transient health) refusals until `deadline`. A member that already votes (a lost
/// answer to an earlier promote) is success.
pub async fn promote_when_caught_up(
    opts: &EtcdOptions,
    endpoints: &[String],
    id: u64,
    peer_url: &str,
    deadline: Duration,
) -> Result<u32, LearnerError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(200);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let mut last = String::new();
        for ep in endpoints {
            match call(opts, ep, |mut c| async move { c.member_promote(id).await }).await {
                Ok(_) => {
                    info!(peer_url, id = %format!("{id:x}"), attempts, "etcd learner promoted to a voting member");
                    return Ok(attempts);
                }
                Err(CallFailure::Refused {
                    refusal: Some(Refusal::MemberNotLearner),
                    ..
                }) => return Ok(attempts),
                Err(CallFailure::Refused {
                    refusal: Some(Refusal::MemberNotFound),
                    ..
                }) => {
                    return Err(LearnerError::Vanished {
                        id,
                        peer_url: peer_url.into(),
                    });
                }
                Err(CallFailure::Refused {
                    refusal: Some(Refusal::NotSupportedForLearner),
                    message,
                    ..
                }) => last = format!("{ep}: {message}"),
                Err(CallFailure::Refused {
                    refusal: Some(r),
                    message,
                    ..
                }) if r.promote_may_wait() => {
                    last = format!("{ep}: {message}");
                    break;
                }
                Err(CallFailure::Refused {
                    message, refusal, ..
                }) => {
                    return Err(LearnerError::Refused {
                        endpoint: ep.clone(),
                        op: "promote",
                        peer_url: peer_url.into(),
                        message,
                        refusal,
                    });
                }
                Err(CallFailure::NoAnswer(why)) => last = format!("{ep}: {why}"),
            }
        }
        if start.elapsed() + pause > deadline {
            return Err(LearnerError::Deadline {
                op: "promote",
                peer_url: peer_url.into(),
                waited: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}
