//! Pure decisions over what etcd members answered: which errors to retry, whether the
//! cluster agrees on a leader, what a new member boots with, where each member lives.
//! No I/O here, so every rule is unit-tested with answers no live cluster gives on demand
//! (split brains, alarms).

use std::net::IpAddr;

// The downgrade rules: refused before anything is asked of etcd.
pub use super::downgrade::{
    DowngradeMethod, DowngradePlan, DowngradeRefusal, MinorVersion, plan_downgrade,
};
use std::time::Duration;

/// The text etcd's strict reconfiguration check answers a member add with while some
/// voting member has not been connected for its health interval (~5 s): after a member
/// start, or while a previously added member has not started yet. Nothing was added.
pub const UNHEALTHY_CLUSTER: &str = "etcdserver: unhealthy cluster";

/// How a failed request is to be treated. Computed once, by [`classify`] (and the
/// client-side wrapper in `ha::etcd`), and matched by every caller: no caller looks at
/// an error's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// The member could not be connected to: the request was never sent. Ask another one.
    Unreachable,
    /// The request was (or may have been) sent, but no answer came: a timeout, a connection
    /// broken mid-call, or etcd's own "request timed out" / "leader changed". A write may
    /// have been applied: read before re-sending it.
    NoAnswer,
    /// etcd refused a reconfiguration with "unhealthy cluster": nothing changed, safe to
    /// retry after a pause.
    UnhealthyCluster,
    /// The server has no such RPC (gRPC UNIMPLEMENTED): an older etcd.
    Unimplemented,
    /// etcd refused a member add: a member already has this peer URL.
    PeerUrlExists,
    /// The member answered with another error: report it, do not retry.
    Answered,
}

/// gRPC status codes (tonic's numbering) that matter here.
pub mod code {
    /// CANCELLED.
    pub const CANCELLED: i32 = 1;
    /// UNKNOWN.
    pub const UNKNOWN: i32 = 2;
    /// INVALID_ARGUMENT.
    pub const INVALID_ARGUMENT: i32 = 3;
    /// NOT_FOUND.
    pub const NOT_FOUND: i32 = 5;
    /// FAILED_PRECONDITION.
    pub const FAILED_PRECONDITION: i32 = 9;
    /// DEADLINE_EXCEEDED.
    pub const DEADLINE_EXCEEDED: i32 = 4;
    /// UNIMPLEMENTED.
    pub const UNIMPLEMENTED: i32 = 12;
    /// UNAVAILABLE.
    pub const UNAVAILABLE: i32 = 14;
}

/// etcd's answers whose outcome is unknown (all UNAVAILABLE, `rpctypes`' exact texts):
/// the proposal may still be applied.
const ETCD_AMBIGUOUS: &[&str] = &[
    "etcdserver: request timed out",
    "etcdserver: request timed out, possibly due to previous leader failure",
    "etcdserver: request timed out, possibly due to connection lost",
    "etcdserver: leader changed",
    "etcdserver: server stopped",
];

/// Texts of a failure to connect at all (the request never left this process). These
/// are tonic's and the OS's words for the transport, not etcd's answers.
const CONNECT_FAILED: &[&str] = &[
    "tcp connect error",
    "connection refused",
    "no route to host",
    "network is unreachable",
    "dns error",
    "failed to lookup address",
];

/// A membership refusal etcd answered, typed by gRPC code and etcd's exact text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `etcdserver: too many learner members in cluster`: another learner is still
    /// joining. Nothing changed; retry once it is promoted or removed.
    TooManyLearners,
    /// `etcdserver: unhealthy cluster`: some voting member is not (yet) connected.
    /// Nothing changed; retry.
    Unhealthy,
    /// `etcdserver: can only promote a learner member which is in sync with leader`: the
    /// learner has not caught up. Retry.
    LearnerNotReady,
    /// `etcdserver: can only promote a learner member`: it already votes.
    MemberNotLearner,
    /// `etcdserver: re-configuration failed due to not enough started members`.
    NotEnoughStarted,
    /// `etcdserver: Peer URLs already exists`.
    PeerUrlExists,
    /// `etcdserver: member not found`.
    MemberNotFound,
    /// `etcdserver: given member URLs are invalid`.
    BadUrls,
    /// `etcdserver: rpc not supported for learner`: the endpoint asked is itself a learner;
    /// ask another member.
    NotSupportedForLearner,
}

impl Refusal {
    /// Classifies a gRPC status; `None` for anything that is not one of these refusals.
    pub fn classify(code: i32, message: &str) -> Option<Refusal> {
        use code::*;
        let r = match (code, message) {
            (FAILED_PRECONDITION, "etcdserver: too many learner members in cluster") => {
                Refusal::TooManyLearners
            }
            (UNAVAILABLE, UNHEALTHY_CLUSTER) => Refusal::Unhealthy,
            (
                FAILED_PRECONDITION,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ) => Refusal::LearnerNotReady,
            (FAILED_PRECONDITION, "etcdserver: can only promote a learner member") => {
                Refusal::MemberNotLearner
            }
            (
                FAILED_PRECONDITION,
                "etcdserver: re-configuration failed due to not enough started members",
            ) => Refusal::NotEnoughStarted,
            (FAILED_PRECONDITION, "etcdserver: Peer URLs already exists") => Refusal::PeerUrlExists,
            (NOT_FOUND, "etcdserver: member not found") => Refusal::MemberNotFound,
            (INVALID_ARGUMENT, "etcdserver: given member URLs are invalid") => Refusal::BadUrls,
            (UNAVAILABLE, "etcdserver: rpc not supported for learner") => {
                Refusal::NotSupportedForLearner
            }
            _ => return None,
        };
        Some(r)
    }

    /// Whether an add refused this way may be retried: nothing changed, and waiting can
    /// clear it.
    pub fn add_may_queue(self) -> bool {
        matches!(self, Refusal::TooManyLearners | Refusal::Unhealthy)
    }

    /// Whether a promote refused this way may be retried.
    pub fn promote_may_wait(self) -> bool {
        matches!(
            self,
            Refusal::LearnerNotReady | Refusal::Unhealthy | Refusal::NotEnoughStarted
        )
    }
}

/// A failed call, classified once: the class every retry matches, and etcd's typed
/// refusal when the answer is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Classified {
    /// What to do about it.
    pub class: ErrorClass,
    /// Which of etcd's membership refusals it is, if any.
    pub refusal: Option<Refusal>,
}

impl Classified {
    /// The learner-add retry rule: queue (pause, retry) on exactly the refusals waiting
    /// clears ([`Refusal::add_may_queue`]).
    pub fn learner_add_queues(&self) -> bool {
        self.refusal.is_some_and(Refusal::add_may_queue)
    }
}

/// The one classifier of a gRPC status. `message` is the status message exactly as etcd
/// sent it; `detail` is the message with the transport's causes appended (what tells
/// "refused" from "timed out" for a connection that failed).
///
/// etcd's own errors are typed by gRPC code and exact text, as etcd's client does in
/// `rpctypes` ([`Refusal::classify`]): "unhealthy cluster" is UNAVAILABLE with exactly
/// that text, never a substring of something else. UNIMPLEMENTED is the gRPC code alone
/// (gRPC servers answer an unknown service or method with it). A transport status
/// (UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED without etcd's `etcdserver:` prefix, or
/// UNKNOWN with a transport error) is [`ErrorClass::Unreachable`] when connecting failed
/// and [`ErrorClass::NoAnswer`] otherwise.
pub fn classify(code: i32, message: &str, detail: &str) -> Classified {
    let refusal = Refusal::classify(code, message);
    let class = match refusal {
        Some(Refusal::Unhealthy) => ErrorClass::UnhealthyCluster,
        Some(Refusal::PeerUrlExists) => ErrorClass::PeerUrlExists,
        Some(_) => ErrorClass::Answered,
        None => classify_unrefused(code, message, detail),
    };
    Classified { class, refusal }
}

fn classify_unrefused(code: i32, message: &str, detail: &str) -> ErrorClass {
    if code == code::UNIMPLEMENTED {
        return ErrorClass::Unimplemented;
    }
    if code == code::UNAVAILABLE && ETCD_AMBIGUOUS.contains(&message) {
        return ErrorClass::NoAnswer;
    }
    let from_etcd = message.starts_with("etcdserver:") || message.starts_with("etcdhttp:");
    let lower = format!("{message} {detail}").to_ascii_lowercase();
    let connect_failed = CONNECT_FAILED.iter().any(|t| lower.contains(t));
    let transport = match code {
        code::UNAVAILABLE | code::DEADLINE_EXCEEDED | code::CANCELLED => !from_etcd,
        // tonic reports a broken connection mid-call as UNKNOWN with a transport message.
        code::UNKNOWN => lower.contains("transport error"),
        _ => false,
    };
    match (transport, connect_failed) {
        (true, true) => ErrorClass::Unreachable,
        (true, false) => ErrorClass::NoAnswer,
        (false, _) => ErrorClass::Answered,
    }
}

/// [`classify`]'s class of a status whose message carries no appended causes.
pub fn classify_status(code: i32, message: &str) -> ErrorClass {
    classify(code, message, "").class
}

/// What a member add does next after a failed attempt, by the failure's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddStep {
    /// Nothing was sent: try the next endpoint.
    NextEndpoint,
    /// The outcome is unknown: read the member list before anything is re-sent.
    ReadMembers,
    /// etcd refused with "unhealthy cluster": pause, then retry.
    Backoff,
    /// Give up with this error.
    Fail,
}

/// The member-add retry rule. A peer URL that already exists after an earlier attempt
/// went unanswered may be that attempt's own member: read the list, do not fail.
pub fn add_step(class: ErrorClass, earlier_attempt_unanswered: bool) -> AddStep {
    match class {
        ErrorClass::Unreachable => AddStep::NextEndpoint,
        ErrorClass::NoAnswer => AddStep::ReadMembers,
        ErrorClass::UnhealthyCluster => AddStep::Backoff,
        ErrorClass::PeerUrlExists if earlier_attempt_unanswered => AddStep::ReadMembers,
        ErrorClass::PeerUrlExists | ErrorClass::Unimplemented | ErrorClass::Answered => {
            AddStep::Fail
        }
    }
}

/// The member an earlier, unanswered add of `peer_url` created: listed with that peer URL
/// and not started yet. A started member with the URL is someone else's, not this add's.
pub fn added_member<'a>(members: &'a [MemberInfo], peer_url: &str) -> Option<&'a MemberInfo> {
    members
        .iter()
        .find(|m| !m.started() && m.peer_urls.iter().any(|u| u == peer_url))
}

/// Bounded exponential backoff for the unhealthy-cluster refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, the first included (at least 1).
    pub attempts: u32,
    /// Pause after the first refusal.
    pub initial: Duration,
    /// Longest pause.
    pub max: Duration,
}

impl Default for RetryPolicy {
    /// 12 attempts, 500 ms doubling to 4 s: about 35 s in all, several times etcd's
    /// 5 s health interval, so a join right behind another one gets through.
    fn default() -> Self {
        RetryPolicy {
            attempts: 12,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(4),
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt `n` (1-based).
    pub fn delay_after(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }
}

/// A member as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberInfo {
    /// Member ID.
    pub id: u64,
    /// Name; empty while an added member has not started.
    pub name: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs; empty while an added member has not started.
    pub client_urls: Vec<String>,
    /// Whether the member is a raft learner (non-voting).
    pub is_learner: bool,
}

impl MemberInfo {
    /// Whether the member has started (an added member publishes its name on start).
    pub fn started(&self) -> bool {
        !self.name.is_empty()
    }

    /// The member as errors name it: its name, or its ID and peer URL before it started.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!(
                "{:x} (not started, peer {})",
                self.id,
                self.peer_urls.join(",")
            )
        } else {
            format!("{} ({:x})", self.name, self.id)
        }
    }
}

/// The `ETCD_INITIAL_CLUSTER` value a newly added member boots with (state `existing`):
/// `name=peerurl` for every peer URL of every member, the new member named `new_name`.
pub fn initial_cluster(members: &[MemberInfo], new_id: u64, new_name: &str) -> String {
    let mut parts = Vec::new();
    for m in members {
        let name = if m.id == new_id { new_name } else { &m.name };
        for url in &m.peer_urls {
            parts.push(format!("{name}={url}"));
        }
    }
    parts.join(",")
}

/// The host part of a URL such as `https://10.0.0.1:2379` or `https://[fd00::1]:2379`.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority
        .rsplit_once('@')
        .map(|(_, a)| a)
        .unwrap_or(authority);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split_once(']')?.0
    } else {
        match authority.rsplit_once(':') {
            Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
            _ => authority,
        }
    };
    (!host.is_empty()).then(|| host.to_string())
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

/// A member that cannot be placed on any host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unplaceable {
    /// The member, as [`MemberInfo::label`] names it.
    pub member: String,
}

/// Hosts of every member's client URLs (deduplicated, in member order).
pub fn client_hosts(members: &[MemberInfo]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in members {
        for h in m.client_urls.iter().filter_map(|u| url_host(u)) {
            if !out.contains(&h) {
                out.push(h);
            }
        }
    }
    out
}

/// One host per member, learners and not-yet-started members included: the host of its
/// first non-loopback client URL, else of its first peer URL. A member added but not
/// started has no client URL yet, and a caller accounting for every member must still
/// see it. A member with neither cannot be placed: an error naming it.
pub fn member_hosts(members: &[MemberInfo]) -> Result<Vec<String>, Unplaceable> {
    members
        .iter()
        .map(|m| {
            m.client_urls
                .iter()
                .filter_map(|u| url_host(u))
                .find(|h| !is_loopback(h))
                .or_else(|| m.peer_urls.iter().find_map(|u| url_host(u)))
                .ok_or_else(|| Unplaceable { member: m.label() })
        })
        .collect()
}

/// One member's answer to a health probe. `error` set means it did not answer, which is
/// never healthy.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberAnswer {
    /// The endpoint asked.
    pub endpoint: String,
    /// The answering member's ID.
    pub member_id: Option<u64>,
    /// The leader it knows (None: it knows none).
    pub leader: Option<u64>,
    /// Its raft term.
    pub raft_term: u64,
    /// Its etcd version.
    pub version: String,
    /// Whether it is a learner.
    pub is_learner: bool,
    /// Alarms raised for this member (e.g. `NOSPACE`, `CORRUPT`), and errors its status
    /// reports.
    pub alarms: Vec<String>,
    /// Why it did not answer.
    pub error: Option<String>,
}

impl MemberAnswer {
    /// An answer recording that `endpoint` did not answer.
    pub fn unreachable(endpoint: &str, error: impl Into<String>) -> Self {
        MemberAnswer {
            endpoint: endpoint.to_string(),
            member_id: None,
            leader: None,
            raft_term: 0,
            version: String::new(),
            is_learner: false,
            alarms: Vec::new(),
            error: Some(error.into()),
        }
    }

    /// Whether this member answered, knows a leader and raises no alarm.
    pub fn healthy(&self) -> bool {
        self.error.is_none() && self.leader.is_some() && self.alarms.is_empty()
    }
}

/// The alarms (and other errors) a member's status reports about itself. etcd lists every
/// alarm it knows as `memberID:<decimal> alarm:<TYPE>`, and adds `etcdserver: no leader`
/// when it has none (already visible as a zero leader, so not repeated here). Alarms of
/// other members are left to those members' own answers, so each problem names the member
/// that raised it; an entry that does not parse is kept rather than dropped.
pub fn alarms_from_status_errors(own_id: Option<u64>, errors: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for e in errors {
        let e = e.trim();
        if e == "etcdserver: no leader" {
            continue;
        }
        let member = e
            .split_whitespace()
            .find_map(|w| w.strip_prefix("memberID:"))
            .and_then(|id| id.parse::<u64>().ok());
        let alarm = e.split_whitespace().find_map(|w| w.strip_prefix("alarm:"));
        match (member, alarm) {
            (Some(m), Some(a)) if Some(m) == own_id => out.push(a.to_string()),
            (Some(_), Some(_)) => {}
            _ => out.push(e.to_string()),
        }
    }
    out
}

/// Why the cluster is not healthy, naming each member involved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "problem", rename_all = "snake_case")]
pub enum MemberProblem {
    /// No endpoint was given: there is nothing to vouch for.
    NoMembers,
    /// The member did not answer.
    NoAnswer {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The member answered but knows no leader: it is not part of a working quorum.
    NoLeader {
        /// The endpoint.
        endpoint: String,
    },
    /// The member has alarms raised.
    Alarm {
        /// The endpoint.
        endpoint: String,
        /// The alarms.
        alarms: Vec<String>,
    },
    /// The member list could not be read: nothing to vouch for.
    NoMemberList {
        /// Why.
        reason: String,
    },
    /// A voting member was added but has not started (it has no client URL): it counts
    /// towards quorum and answers nothing.
    NotStarted {
        /// The member, as [`MemberInfo::label`] names it.
        member: String,
    },
    /// A listed member's client URL was answered by another member.
    WrongMember {
        /// The endpoint asked.
        endpoint: String,
        /// The member listed at it.
        expected: u64,
        /// The member that answered.
        answered: u64,
    },
    /// Members name different leaders: a split brain, or an election in progress.
    LeaderDisagreement {
        /// (endpoint, leader ID) of every member that named one.
        leaders: Vec<(String, u64)>,
    },
}

impl std::fmt::Display for MemberProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemberProblem::NoMembers => write!(f, "no etcd endpoints to check"),
            MemberProblem::NoMemberList { reason } => {
                write!(f, "cannot read the etcd member list: {reason}")
            }
            MemberProblem::NotStarted { member } => write!(
                f,
                "voting member {member} was added but has not started: start it, or remove it"
            ),
            MemberProblem::WrongMember {
                endpoint,
                expected,
                answered,
            } => write!(
                f,
                "member {endpoint} answered as {answered:x}, but the member list has {expected:x} there"
            ),
            MemberProblem::NoAnswer { endpoint, reason } => {
                write!(f, "member {endpoint} did not answer: {reason}")
            }
            MemberProblem::NoLeader { endpoint } => {
                write!(f, "member {endpoint} answered but knows no leader")
            }
            MemberProblem::Alarm { endpoint, alarms } => {
                write!(f, "member {endpoint} has alarms: {}", alarms.join(", "))
            }
            MemberProblem::LeaderDisagreement { leaders } => {
                let named: Vec<String> = leaders
                    .iter()
                    .map(|(e, l)| format!("{e} follows {l:x}"))
                    .collect();
                write!(
                    f,
                    "members disagree on the leader (split brain?): {}",
                    named.join("; ")
                )
            }
        }
    }
}

/// The agreement rule. Healthy only when there is at least one answer, every member
/// answered, knows a leader, raises no alarm, and all name the same leader; returns that
/// leader. Per-member health alone is satisfied by a split brain (two partitions, each
/// with a leader of its own), which is exactly when narrowing trust cluster-wide cannot
/// be walked back, so agreement is checked too. Fails closed: every problem found is
/// returned.
pub fn judge_cluster(answers: &[MemberAnswer]) -> Result<u64, Vec<MemberProblem>> {
    if answers.is_empty() {
        return Err(vec![MemberProblem::NoMembers]);
    }
    let mut problems = Vec::new();
    let mut leaders: Vec<(String, u64)> = Vec::new();
    for a in answers {
        if let Some(reason) = &a.error {
            problems.push(MemberProblem::NoAnswer {
                endpoint: a.endpoint.clone(),
                reason: reason.clone(),
            });
            continue;
        }
        match a.leader {
            None => problems.push(MemberProblem::NoLeader {
                endpoint: a.endpoint.clone(),
            }),
            Some(l) => leaders.push((a.endpoint.clone(), l)),
        }
        if !a.alarms.is_empty() {
            problems.push(MemberProblem::Alarm {
                endpoint: a.endpoint.clone(),
                alarms: a.alarms.clone(),
            });
        }
    }
    if leaders.iter().any(|(_, l)| *l != leaders[0].1) {
        problems.push(MemberProblem::LeaderDisagreement {
            leaders: leaders.clone(),
        });
    }
    match (problems.is_empty(), leaders.first()) {
        (true, Some((_, l))) => Ok(*l),
        (true, None) => Err(vec![MemberProblem::NoMembers]),
        (false, _) => Err(problems),
    }
}

/// One voting member to probe: its ID, how errors name it, and the client URL to ask
/// (`None`: it has not started and publishes none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The member's ID.
    pub member_id: u64,
    /// [`MemberInfo::label`].
    pub label: String,
    /// Its first client URL.
    pub endpoint: Option<String>,
}

/// Whom a health check asks: every voting member of the list, once each (by ID), at its
/// first client URL. Learners do not vote and are not asked. The endpoints a caller gave
/// only serve to read the list: two of three members listed, or one listed twice, cannot
/// hide a dead third.
pub fn probe_targets(members: &[MemberInfo]) -> Vec<ProbeTarget> {
    let mut out: Vec<ProbeTarget> = Vec::new();
    for m in members.iter().filter(|m| !m.is_learner) {
        if out.iter().any(|t| t.member_id == m.id) {
            continue;
        }
        out.push(ProbeTarget {
            member_id: m.id,
            label: m.label(),
            endpoint: m.client_urls.first().cloned(),
        });
    }
    out
}

/// The health rule over the member list: `answers[i]` is what `targets[i]` answered
/// (`None`: not asked, because it has no client URL). Every voting member must have
/// started, answer as itself, and pass [`judge_cluster`] with the others.
pub fn judge_members(
    targets: &[ProbeTarget],
    answers: &[Option<MemberAnswer>],
) -> Result<u64, Vec<MemberProblem>> {
    if targets.is_empty() {
        return Err(vec![MemberProblem::NoMembers]);
    }
    let mut problems = Vec::new();
    let mut asked = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        match answers.get(i).and_then(Option::as_ref) {
            None => problems.push(MemberProblem::NotStarted {
                member: t.label.clone(),
            }),
            Some(a) => {
                if let Some(id) = a.member_id
                    && id != t.member_id
                {
                    problems.push(MemberProblem::WrongMember {
                        endpoint: a.endpoint.clone(),
                        expected: t.member_id,
                        answered: id,
                    });
                }
                asked.push(a.clone());
            }
        }
    }
    match judge_cluster(&asked) {
        Ok(leader) if problems.is_empty() => Ok(leader),
        Ok(_) => Err(problems),
        Err(more) => {
            problems.extend(more.into_iter().filter(|p| *p != MemberProblem::NoMembers));
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal etcd sends, by its gRPC code and exact text, classifies as its
    /// variant; the same text under another code is not that refusal.
    #[test]
    fn every_refusal_classifies_by_code_and_exact_text() {
        use code::*;
        let table = [
            (
                FAILED_PRECONDITION,
                "etcdserver: too many learner members in cluster",
                Refusal::TooManyLearners,
            ),
            (UNAVAILABLE, UNHEALTHY_CLUSTER, Refusal::Unhealthy),
            (
                FAILED_PRECONDITION,
                "etcdserver: can only promote a learner member which is in sync with leader",
                Refusal::LearnerNotReady,
            ),
            (
                FAILED_PRECONDITION,
                "etcdserver: can only promote a learner member",
                Refusal::MemberNotLearner,
            ),
            (
                FAILED_PRECONDITION,
                "etcdserver: re-configuration failed due to not enough started members",
                Refusal::NotEnoughStarted,
            ),
            (
                FAILED_PRECONDITION,
                "etcdserver: Peer URLs already exists",
                Refusal::PeerUrlExists,
            ),
            (
                NOT_FOUND,
                "etcdserver: member not found",
                Refusal::MemberNotFound,
            ),
            (
                INVALID_ARGUMENT,
                "etcdserver: given member URLs are invalid",
                Refusal::BadUrls,
            ),
            (
                UNAVAILABLE,
                "etcdserver: rpc not supported for learner",
                Refusal::NotSupportedForLearner,
            ),
        ];
        for (code, message, want) in table {
            assert_eq!(Refusal::classify(code, message), Some(want), "{message}");
            assert_eq!(
                Refusal::classify(UNKNOWN, message),
                None,
                "{message} under UNKNOWN"
            );
        }
    }

    fn ok(endpoint: &str, id: u64, leader: u64) -> MemberAnswer {
        MemberAnswer {
            endpoint: endpoint.into(),
            member_id: Some(id),
            leader: Some(leader),
            raft_term: 2,
            version: "3.4.23".into(),
            is_learner: false,
            alarms: vec![],
            error: None,
        }
    }

    #[test]
    fn agreement_is_healthy() {
        let a = [ok("a", 1, 1), ok("b", 2, 1), ok("c", 3, 1)];
        assert_eq!(judge_cluster(&a), Ok(1));
    }

    #[test]
    fn split_brain_fails_even_though_every_member_is_healthy() {
        let a = [ok("a", 1, 1), ok("b", 2, 1), ok("c", 3, 3), ok("d", 4, 3)];
        assert!(a.iter().all(MemberAnswer::healthy));
        let problems = judge_cluster(&a).unwrap_err();
        assert_eq!(problems.len(), 1);
        let MemberProblem::LeaderDisagreement { leaders } = &problems[0] else {
            panic!("{problems:?}")
        };
        assert_eq!(leaders.len(), 4);
        let text = problems[0].to_string();
        assert!(
            text.contains("c follows 3") && text.contains("a follows 1"),
            "{text}"
        );
    }

    #[test]
    fn member_without_leader_fails_and_is_named() {
        let mut b = ok("b", 2, 1);
        b.leader = None;
        let problems = judge_cluster(&[ok("a", 1, 1), b]).unwrap_err();
        assert_eq!(
            problems,
            vec![MemberProblem::NoLeader {
                endpoint: "b".into()
            }]
        );
    }

    #[test]
    fn unreachable_member_fails_closed() {
        let a = [
            ok("a", 1, 1),
            MemberAnswer::unreachable("b", "connection refused"),
        ];
        let problems = judge_cluster(&a).unwrap_err();
        assert_eq!(
            problems[0].to_string(),
            "member b did not answer: connection refused"
        );
    }

    #[test]
    fn alarms_fail() {
        let mut c = ok("c", 3, 1);
        c.alarms = vec!["NOSPACE".into()];
        assert!(!c.healthy());
        let problems = judge_cluster(&[ok("a", 1, 1), c]).unwrap_err();
        assert!(matches!(&problems[0], MemberProblem::Alarm { endpoint, .. } if endpoint == "c"));
    }

    #[test]
    fn status_errors_become_own_alarms() {
        let errors = vec![
            "etcdserver: no leader".to_string(),
            "memberID:7 alarm:NOSPACE ".to_string(),
            "memberID:8 alarm:CORRUPT ".to_string(),
            "something else".to_string(),
        ];
        assert_eq!(
            alarms_from_status_errors(Some(7), &errors),
            vec!["NOSPACE".to_string(), "something else".to_string()]
        );
        assert!(alarms_from_status_errors(Some(1), &errors[..1]).is_empty());
    }

    #[test]
    fn nothing_to_ask_is_not_healthy() {
        assert_eq!(judge_cluster(&[]), Err(vec![MemberProblem::NoMembers]));
    }

    #[test]
    fn all_unreachable_lists_each() {
        let a = [
            MemberAnswer::unreachable("a", "x"),
            MemberAnswer::unreachable("b", "y"),
        ];
        assert_eq!(judge_cluster(&a).unwrap_err().len(), 2);
    }

    #[test]
    fn errors_are_classified_by_code_and_etcd_message() {
        let cases = [
            (
                code::UNAVAILABLE,
                "etcdserver: unhealthy cluster",
                ErrorClass::UnhealthyCluster,
            ),
            (
                9,
                "etcdserver: re-configuration failed due to not enough started members",
                ErrorClass::Answered,
            ),
            (
                9,
                "etcdserver: Peer URLs already exists",
                ErrorClass::PeerUrlExists,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: leader changed",
                ErrorClass::NoAnswer,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: request timed out",
                ErrorClass::NoAnswer,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: request timed out, possibly due to previous leader failure",
                ErrorClass::NoAnswer,
            ),
            (
                code::UNAVAILABLE,
                "tcp connect error: Connection refused (os error 111)",
                ErrorClass::Unreachable,
            ),
            (
                code::DEADLINE_EXCEEDED,
                "Timeout expired",
                ErrorClass::NoAnswer,
            ),
            (code::CANCELLED, "Timeout expired", ErrorClass::NoAnswer),
            (
                code::UNKNOWN,
                "transport error: connection reset",
                ErrorClass::NoAnswer,
            ),
            (
                code::UNIMPLEMENTED,
                "unknown method Downgrade for service etcdserverpb.Maintenance",
                ErrorClass::Unimplemented,
            ),
            // UNIMPLEMENTED is the code, not a text: the same words under another code are
            // another answer.
            (
                code::UNKNOWN,
                "unknown service etcdserverpb.Maintenance",
                ErrorClass::Answered,
            ),
            // etcd's refusal text embedded in other text, or under another code, is not
            // the refusal.
            (
                code::UNAVAILABLE,
                "proxy: etcdserver: unhealthy cluster (upstream)",
                ErrorClass::NoAnswer,
            ),
            (
                code::UNKNOWN,
                "etcdserver: unhealthy cluster",
                ErrorClass::Answered,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: no leader",
                ErrorClass::Answered,
            ),
        ];
        for (c, message, want) in cases {
            assert_eq!(classify_status(c, message), want, "{c} {message}");
        }
    }

    #[test]
    fn refusals_are_typed_by_code_and_exact_text() {
        assert_eq!(
            Refusal::classify(9, "etcdserver: too many learner members in cluster"),
            Some(Refusal::TooManyLearners)
        );
        assert_eq!(
            Refusal::classify(14, "etcdserver: unhealthy cluster"),
            Some(Refusal::Unhealthy)
        );
        // The same text under another code, or embedded in other text, is not the refusal.
        assert_eq!(Refusal::classify(2, "etcdserver: unhealthy cluster"), None);
        assert_eq!(
            Refusal::classify(14, "proxy: etcdserver: unhealthy cluster (upstream)"),
            None
        );
        assert_eq!(
            Refusal::classify(
                9,
                "etcdserver: can only promote a learner member which is in sync with leader"
            ),
            Some(Refusal::LearnerNotReady)
        );
        assert_eq!(
            Refusal::classify(9, "etcdserver: can only promote a learner member"),
            Some(Refusal::MemberNotLearner)
        );
        assert!(Refusal::TooManyLearners.add_may_queue());
        assert!(Refusal::Unhealthy.add_may_queue());
        assert!(!Refusal::PeerUrlExists.add_may_queue());
        assert!(!Refusal::NotEnoughStarted.add_may_queue());
        assert!(Refusal::LearnerNotReady.promote_may_wait());
        assert!(!Refusal::TooManyLearners.promote_may_wait());
    }

    /// The classifier and both member-add retries in one table: each answer etcd (or the
    /// transport) gives goes through [`classify`] once, and the voter add's next step
    /// ([`add_step`]) and the learner add's queueing ([`Classified::learner_add_queues`])
    /// follow from what it computed. A classifier that matched text loosely, or a retry
    /// that looked at the text, fails here.
    #[test]
    fn classifier_and_member_add_retries_agree() {
        use AddStep::*;
        let cases: &[(i32, &str, &str, ErrorClass, AddStep, bool)] = &[
            (
                code::UNAVAILABLE,
                UNHEALTHY_CLUSTER,
                "",
                ErrorClass::UnhealthyCluster,
                Backoff,
                true,
            ),
            (
                code::FAILED_PRECONDITION,
                "etcdserver: too many learner members in cluster",
                "",
                ErrorClass::Answered,
                Fail,
                true,
            ),
            (
                code::FAILED_PRECONDITION,
                "etcdserver: Peer URLs already exists",
                "",
                ErrorClass::PeerUrlExists,
                Fail,
                false,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: leader changed",
                "",
                ErrorClass::NoAnswer,
                ReadMembers,
                false,
            ),
            (
                code::UNAVAILABLE,
                "transport error",
                "tcp connect error: Connection refused (os error 111)",
                ErrorClass::Unreachable,
                NextEndpoint,
                false,
            ),
            (
                code::UNIMPLEMENTED,
                "unknown method MemberAdd",
                "",
                ErrorClass::Unimplemented,
                Fail,
                false,
            ),
            // Loose matches of the refusal text are not the refusal.
            (
                code::UNKNOWN,
                UNHEALTHY_CLUSTER,
                "",
                ErrorClass::Answered,
                Fail,
                false,
            ),
            (
                code::UNAVAILABLE,
                "etcdserver: unhealthy cluster, really",
                "",
                ErrorClass::Answered,
                Fail,
                false,
            ),
        ];
        for &(c, message, detail, class, step, queues) in cases {
            let got = classify(c, message, detail);
            assert_eq!(got.class, class, "{c} {message}");
            assert_eq!(add_step(got.class, false), step, "{c} {message}");
            assert_eq!(got.learner_add_queues(), queues, "{c} {message}");
        }
    }

    #[test]
    fn the_add_retry_follows_the_class_alone() {
        use AddStep::*;
        assert_eq!(add_step(ErrorClass::Unreachable, false), NextEndpoint);
        assert_eq!(add_step(ErrorClass::NoAnswer, false), ReadMembers);
        assert_eq!(add_step(ErrorClass::UnhealthyCluster, false), Backoff);
        assert_eq!(add_step(ErrorClass::UnhealthyCluster, true), Backoff);
        assert_eq!(add_step(ErrorClass::PeerUrlExists, false), Fail);
        assert_eq!(add_step(ErrorClass::PeerUrlExists, true), ReadMembers);
        assert_eq!(add_step(ErrorClass::Answered, true), Fail);
        assert_eq!(add_step(ErrorClass::Unimplemented, false), Fail);
        // The classifier and the retry together: etcd's refusal text leads to a pause.
        assert_eq!(
            add_step(classify_status(code::UNAVAILABLE, UNHEALTHY_CLUSTER), false),
            Backoff
        );
    }

    #[test]
    fn only_an_unstarted_member_is_adopted() {
        let ms = [
            member(1, "a", &["http://10.0.0.1:2380"], &["http://10.0.0.1:2379"]),
            member(2, "", &["http://10.0.0.2:2380"], &[]),
        ];
        assert_eq!(
            added_member(&ms, "http://10.0.0.2:2380").map(|m| m.id),
            Some(2)
        );
        assert_eq!(added_member(&ms, "http://10.0.0.1:2380"), None);
        assert_eq!(added_member(&ms, "http://10.0.0.3:2380"), None);
    }

    #[test]
    fn health_probes_every_voting_member_once() {
        let mut learner = member(4, "d", &["p4"], &["http://d:2379"]);
        learner.is_learner = true;
        let ms = [
            member(1, "a", &["p1"], &["http://a:2379", "http://a2:2379"]),
            member(2, "b", &["p2"], &["http://b:2379"]),
            member(1, "a", &["p1"], &["http://a:2379"]),
            member(3, "", &["p3"], &[]),
            learner,
        ];
        let targets = probe_targets(&ms);
        assert_eq!(
            targets
                .iter()
                .map(|t| (t.member_id, t.endpoint.as_deref()))
                .collect::<Vec<_>>(),
            vec![
                (1, Some("http://a:2379")),
                (2, Some("http://b:2379")),
                (3, None)
            ]
        );
        let answers = [
            Some(ok("http://a:2379", 1, 1)),
            Some(ok("http://b:2379", 2, 1)),
            None,
        ];
        let problems = judge_members(&targets, &answers).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            matches!(&problems[0], MemberProblem::NotStarted { member } if member.contains("not started")),
            "{problems:?}"
        );
        assert_eq!(judge_members(&targets[..2], &answers[..2]), Ok(1));
        // An answer from another member than the one listed there.
        let wrong = [
            Some(ok("http://a:2379", 1, 1)),
            Some(ok("http://b:2379", 1, 1)),
        ];
        let problems = judge_members(&targets[..2], &wrong).unwrap_err();
        assert!(
            problems.iter().any(|p| matches!(
                p,
                MemberProblem::WrongMember {
                    expected: 2,
                    answered: 1,
                    ..
                }
            )),
            "{problems:?}"
        );
        // Missing answers for members that have client URLs: nothing hides them.
        let problems = judge_members(&targets[..2], &answers[..1]).unwrap_err();
        assert!(!problems.is_empty());
        assert_eq!(judge_members(&[], &[]), Err(vec![MemberProblem::NoMembers]));
        // No member started: each is named, and "no members" does not hide them.
        let none = judge_members(&targets[..2], &[None, None]).unwrap_err();
        assert_eq!(none.len(), 2, "{none:?}");
        assert!(
            none.iter()
                .all(|p| matches!(p, MemberProblem::NotStarted { .. })),
            "{none:?}"
        );
        // One not started, one not answering: both problems are reported.
        let mut silent = ok("http://b:2379", 2, 1);
        silent.error = Some("connection refused".into());
        let both = judge_members(&targets[..2], &[None, Some(silent)]).unwrap_err();
        assert!(
            both.iter()
                .any(|p| matches!(p, MemberProblem::NoAnswer { .. })),
            "{both:?}"
        );
        assert!(
            both.iter()
                .any(|p| matches!(p, MemberProblem::NotStarted { .. })),
            "{both:?}"
        );
    }

    #[test]
    fn client_hosts_are_every_members_hosts_once_in_order() {
        let ms = vec![
            member(
                2,
                "b",
                &["p2"],
                &["https://10.0.0.2:2379", "https://10.0.0.2:4001"],
            ),
            member(1, "a", &["p1"], &["https://10.0.0.1:2379"]),
            member(3, "", &["p3"], &[]),
            member(
                4,
                "d",
                &["p4"],
                &["https://10.0.0.1:3379", "https://[fd00::4]:2379"],
            ),
        ];
        assert_eq!(client_hosts(&ms), vec!["10.0.0.2", "10.0.0.1", "fd00::4"]);
        assert!(client_hosts(&[]).is_empty());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            attempts: 5,
            initial: Duration::from_millis(500),
            max: Duration::from_secs(2),
        };
        let d: Vec<_> = (1..=5).map(|n| p.delay_after(n).as_millis()).collect();
        assert_eq!(d, vec![500, 1000, 2000, 2000, 2000]);
        assert_eq!(p.delay_after(200), Duration::from_secs(2));
    }

    fn member(id: u64, name: &str, peers: &[&str], clients: &[&str]) -> MemberInfo {
        MemberInfo {
            id,
            name: name.into(),
            peer_urls: peers.iter().map(|s| s.to_string()).collect(),
            client_urls: clients.iter().map(|s| s.to_string()).collect(),
            is_learner: false,
        }
    }

    #[test]
    fn initial_cluster_names_the_new_member() {
        let ms = [
            member(1, "cp-1", &["https://10.0.0.1:2380"], &[]),
            member(7, "", &["https://10.0.0.2:2380"], &[]),
        ];
        assert_eq!(
            initial_cluster(&ms, 7, "cp-2"),
            "cp-1=https://10.0.0.1:2380,cp-2=https://10.0.0.2:2380"
        );
    }

    #[test]
    fn hosts_prefer_non_loopback_clients_then_peers() {
        let ms = [
            member(
                1,
                "a",
                &["https://10.0.0.1:2380"],
                &["https://127.0.0.1:2379", "https://10.0.0.9:2379"],
            ),
            member(2, "", &["https://[fd00::2]:2380"], &[]),
            member(
                3,
                "c",
                &["https://10.0.0.3:2380"],
                &["https://localhost:2379"],
            ),
        ];
        assert_eq!(
            member_hosts(&ms).unwrap(),
            vec!["10.0.0.9", "fd00::2", "10.0.0.3"]
        );
        let bad = [member(4, "", &[], &[])];
        let err = member_hosts(&bad).unwrap_err();
        assert!(err.member.contains('4'), "{err:?}");
    }

    #[test]
    fn url_hosts() {
        assert_eq!(
            url_host("https://10.0.0.1:2379").as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(url_host("http://[::1]:2379/x").as_deref(), Some("::1"));
        assert_eq!(url_host("node-a:2379").as_deref(), Some("node-a"));
        assert_eq!(url_host("https://host").as_deref(), Some("host"));
        assert_eq!(url_host("https://"), None);
        // A colon not followed by a port belongs to the host text.
        assert_eq!(url_host("https://host:web").as_deref(), Some("host:web"));
    }
}
