//! etcd membership and health against real etcd 3.4 members (see `etcd_harness`).

use std::time::Duration;

use ha::etcd::{
    self, AddMember, DowngradeState, EtcdError, EtcdOptions, JOIN_BUNDLE_ETCD_KEY, MemberProblem,
    RetryPolicy,
};
use ha::journal::JoinIntentJournal;

use crate::etcd_harness::{EtcdCluster, find_etcd};

/// Quick enough for a test, patient enough to outlast etcd's 5 s health interval.
fn test_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 30,
        initial: Duration::from_millis(300),
        max: Duration::from_secs(1),
    }
}

/// One mTLS cluster grows, is refused, loses a member and gains a learner; every step is
/// checked against what etcd itself reports. Shared so the whole story costs one cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_grows_refuses_fails_closed_and_shrinks() -> anyhow::Result<()> {
    let mut cluster = EtcdCluster::start(3).await?;
    let opts = cluster.options();
    let eps = cluster.endpoints();
    let state = tempfile::tempdir()?;
    let journal = JoinIntentJournal::new(state.path());

    // A client without the client certificate is turned away: the cluster really is mTLS.
    let anonymous = EtcdOptions::default();
    assert!(etcd::member_count(&anonymous, &eps).await.is_err());

    let health = etcd::etcd_cluster_healthy(&opts, &eps).await?;
    assert_eq!(health.members.len(), 3);

    // The same material given inline works; a client certificate from another CA does not,
    // and the error names the member.
    let files = cluster.client_tls().unwrap();
    let inline = EtcdOptions::with_tls(Some(ha::etcd::EtcdTls::from_pem(
        &std::fs::read(&files.ca)?,
        &std::fs::read(&files.cert)?,
        &std::fs::read(&files.key)?,
    )));
    assert_eq!(etcd::member_count(&inline, &eps).await?, 3);
    let stranger = pki::Ca::generate("other-ca")?
        .issue(&pki::LeafSpec::new("stranger", &[pki::Usage::ClientAuth]))?;
    let foreign = EtcdOptions::with_tls(Some(ha::etcd::EtcdTls::from_pem(
        &std::fs::read(&files.ca)?,
        stranger.cert_pem.as_bytes(),
        stranger.key_pem.as_bytes(),
    )));
    let err = etcd::etcd_cluster_healthy(&foreign, &eps[..1])
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&eps[0]), "{err}");
    assert_eq!(etcd::member_count(&opts, &eps).await?, 3);

    // Add a 4th member. The journal is on disk before the add and names it.
    let s4 = cluster.plan_member()?;
    let add4 = etcd::member_add_with(
        &opts,
        &eps,
        &AddMember {
            retry: test_retry(),
            ..AddMember::new(&s4.name, s4.peer_url())
        },
        Some(&journal),
    )
    .await?;
    // No assertion on add4.attempts: a cluster started moments ago is itself refused
    // ("unhealthy cluster") until its members have been connected ~5 s, so this first add
    // has usually been retried already.
    let recorded = journal.read()?.expect("journal written before the add");
    assert_eq!(recorded.peer_url, s4.peer_url());
    assert_eq!(add4.initial_cluster.split(',').count(), 4);
    assert!(
        add4.initial_cluster
            .contains(&format!("{}={}", s4.name, s4.peer_url())),
        "{}",
        add4.initial_cluster
    );
    let (_, members) = etcd::member_list_via(&opts, &eps).await?;
    assert_eq!(members.len(), 4);
    let m4 = members.iter().find(|m| m.id == add4.id).unwrap();
    assert!(!m4.started() && m4.client_urls.is_empty());

    // An add right behind it, while the 4th has not started: etcd 3.4's strict reconfig
    // check answers "unhealthy cluster" (the 4th voter is not connected). The add is
    // retried while the 4th starts, and goes through once it has been connected ~5 s.
    let s5 = cluster.plan_member()?;
    // The classifier and the retry together, on etcd's real answer: with a single attempt,
    // the add behind the unstarted 4th member ends as `AddRefused` (the class computed
    // from the gRPC status was UnhealthyCluster and the retry took its backoff branch),
    // not as a generic `Request` error, and nothing was added.
    let once = AddMember {
        retry: RetryPolicy {
            attempts: 1,
            ..test_retry()
        },
        ..AddMember::new(&s5.name, s5.peer_url())
    };
    match etcd::member_add_with(&opts, &eps, &once, None).await {
        Err(EtcdError::AddRefused { attempts: 1, .. }) => {}
        other => panic!("expected AddRefused after one unhealthy-cluster refusal: {other:?}"),
    }
    let (_, members) = etcd::member_list_via(&opts, &eps).await?;
    assert_eq!(members.len(), 4, "a refused add adds nothing");
    let add5_req = AddMember {
        retry: test_retry(),
        ..AddMember::new(&s5.name, s5.peer_url())
    };
    let (opts5, eps5) = (opts.clone(), eps.clone());
    let add5 =
        tokio::spawn(async move { etcd::member_add_with(&opts5, &eps5, &add5_req, None).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.start_added(&s4, &add4.initial_cluster).await?;
    let four: Vec<String> = (0..4).map(|i| cluster.endpoint(i)).collect();
    let health = etcd::etcd_cluster_healthy(&opts, &four).await?;
    assert_eq!(health.members.len(), 4);
    let (_, members) = etcd::member_list_via(&opts, &four).await?;
    let m4 = members.iter().find(|m| m.id == add4.id).unwrap();
    assert_eq!(
        m4.name, s4.name,
        "the 4th member started and published its name"
    );
    journal.clear()?;
    assert!(!journal.survives()?);

    let add5 = add5.await??;
    assert!(
        add5.attempts > 1,
        "the add behind an unstarted member must have been refused first (attempts {})",
        add5.attempts
    );
    cluster.start_added(&s5, &add5.initial_cluster).await?;
    let all = cluster.endpoints();
    assert_eq!(all.len(), 5);
    let health = etcd::etcd_cluster_healthy(&opts, &all).await?;
    assert!(
        health
            .members
            .iter()
            .all(|m| m.leader == Some(health.leader))
    );
    assert_eq!(etcd::member_count(&opts, &all).await?, 5);

    // Kill a follower (not member 0, the survivor used below): health fails closed,
    // naming exactly that member. A follower, so the others keep their leader and the
    // only problem is the dead member.
    // Answers come in member-list order: match them to cluster members by endpoint.
    let is_follower = |i: usize| {
        health
            .members
            .iter()
            .any(|m| m.endpoint == cluster.endpoint(i) && m.member_id != Some(health.leader))
    };
    let victim = (1..5)
        .find(|&i| is_follower(i))
        .expect("four of five members are followers");
    let dead = cluster.endpoint(victim);
    let dead_peer = cluster.peer_url(victim);
    let dead_host = dead_peer
        .trim_start_matches("https://")
        .split(':')
        .next()
        .unwrap()
        .to_string();
    cluster.kill(victim);
    let err = etcd::etcd_cluster_healthy(&opts, &all).await.unwrap_err();
    let EtcdError::Unhealthy { problems, .. } = &err else {
        panic!("expected Unhealthy, got {err}")
    };
    assert_eq!(problems.len(), 1, "{err}");
    assert!(
        matches!(&problems[0], MemberProblem::NoAnswer { endpoint, .. } if *endpoint == dead),
        "{err}"
    );
    assert!(err.to_string().contains(&dead), "{err}");

    // Remove it through a list that starts with the dead endpoint: the survivor answers.
    let via = vec![dead.clone(), cluster.endpoint(0)];
    etcd::member_remove(&opts, &via, &dead_peer).await?;
    let survivors = cluster.endpoints();
    assert_eq!(etcd::member_count(&opts, &survivors).await?, 4);
    etcd::etcd_cluster_healthy(&opts, &survivors).await?;
    // Removing it again is a clear not-found naming the peer URL.
    let again = etcd::member_remove(&opts, &survivors, &dead_peer)
        .await
        .unwrap_err();
    assert!(
        matches!(&again, EtcdError::MemberNotFound { peer_url, .. } if *peer_url == dead_peer),
        "{again}"
    );

    // A learner counts as a member, and has a host before it ever starts.
    let s6 = cluster.plan_member()?;
    let learner = etcd::member_add_with(
        &opts,
        &survivors,
        &AddMember {
            learner: true,
            retry: test_retry(),
            ..AddMember::new(&s6.name, s6.peer_url())
        },
        None,
    )
    .await?;
    let (_, members) = etcd::member_list_via(&opts, &survivors).await?;
    assert!(members.iter().any(|m| m.id == learner.id && m.is_learner));
    assert_eq!(etcd::member_count(&opts, &survivors).await?, 5);
    let hosts = etcd::member_hosts_via(&opts, &survivors).await?;
    assert_eq!(hosts.len(), 5);
    assert!(hosts.contains(&s6.ip.to_string()), "{hosts:?}");
    assert!(
        !hosts.contains(&dead_host),
        "removed member gone: {hosts:?}"
    );
    let client_ips = etcd::member_client_ips_via(&opts, &via).await?;
    assert_eq!(
        client_ips.len(),
        4,
        "the unstarted learner has no client URL: {client_ips:?}"
    );

    // join_state: members (learner included) and the bundle key, read linearizably.
    let js = etcd::join_state(&opts, &survivors).await?;
    assert_eq!((js.members, js.bundle), (5, false));
    let tls = cluster.client_tls().unwrap();
    let mut raw = etcd_client::Client::connect(
        [cluster.endpoint(0)],
        Some(
            etcd_client::ConnectOptions::new().with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(&tls.ca)?))
                    .identity(etcd_client::Identity::from_pem(
                        std::fs::read(&tls.cert)?,
                        std::fs::read(&tls.key)?,
                    )),
            ),
        ),
    )
    .await?;
    raw.put(JOIN_BUNDLE_ETCD_KEY, "sealed", None).await?;
    let js = etcd::join_state(&opts, &survivors).await?;
    assert!(js.bundle);

    // Lose quorum: of the four voters left, kill two. The survivors still answer their
    // status; for up to an election timeout the old leader still believes it leads (etcd's
    // own check-quorum delay), then both know no leader, and health says so for each of
    // them rather than passing on "they answered".
    let running: Vec<usize> = (0..cluster.len())
        .filter(|&i| survivors.contains(&cluster.endpoint(i)))
        .collect();
    assert_eq!(running.len(), 4);
    cluster.kill(running[2]);
    cluster.kill(running[3]);
    let alive = vec![cluster.endpoint(running[0]), cluster.endpoint(running[1])];
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let last = match etcd::etcd_cluster_healthy(&opts, &alive).await {
            Ok(h) => format!("still healthy: {h:?}"),
            Err(err) => {
                let EtcdError::Unhealthy { problems, .. } = &err else {
                    panic!("expected Unhealthy, got {err}")
                };
                let leaderless = problems
                    .iter()
                    .filter(|p| matches!(p, MemberProblem::NoLeader { endpoint } if alive.contains(endpoint)))
                    .count();
                if leaderless == 2 {
                    assert!(err.to_string().contains("knows no leader"), "{err}");
                    break;
                }
                err.to_string()
            }
        };
        assert!(
            std::time::Instant::now() < deadline,
            "members kept a leader without quorum: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A plain-http member: storage facts of etcd 3.4, a downgrade refused as not validated,
/// and the journal written before an add that could not even be sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_member_storage_downgrade_and_journal_order() -> anyhow::Result<()> {
    let cluster = EtcdCluster::start_plain(1).await?;
    let opts = cluster.options();
    let ep = cluster.endpoint(0);
    assert!(ep.starts_with("http://"));

    let storage = etcd::etcd_storage_at(&opts, &ep).await?;
    assert_eq!(storage.members, 1);
    assert!(storage.server_version.starts_with("3.4"), "{storage:?}");
    assert_eq!(storage.downgrade, DowngradeState::Unsupported);
    assert_eq!(storage.storage_version, None, "3.4 does not report one");

    let err = etcd::downgrade_etcd(&opts, &ep, "3.3").await.unwrap_err();
    assert!(
        matches!(
            &err,
            EtcdError::DowngradeNotValidated {
                unsupported: true,
                ..
            }
        ),
        "{err}"
    );

    // A member that is down: status says so as NoStatus, not as a parse or setup error.
    let down = "http://127.0.0.19:9".to_string();
    let err = etcd::etcd_storage_at(&opts, &down).await.unwrap_err();
    assert!(
        matches!(&err, EtcdError::NoStatus { endpoint, .. } if *endpoint == down),
        "{err}"
    );

    // TLS material that cannot be loaded is a setup error naming the endpoint and file,
    // not "unreachable" and not a member's refusal: nothing was asked.
    let broken = EtcdOptions::with_tls(Some(ha::etcd::EtcdTls::from_paths(
        "/nonexistent/ca.crt",
        "/nonexistent/c.crt",
        "/nonexistent/c.key",
    )));
    let err = etcd::member_count(&broken, std::slice::from_ref(&down))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EtcdError::BadEndpoint { endpoint, reason } if *endpoint == down && reason.contains("/nonexistent/ca.crt")),
        "{err}"
    );

    // The journal is written before the add is sent: an add that cannot reach anyone
    // still leaves it behind, and the error says nobody could be asked.
    let state = tempfile::tempdir()?;
    let journal = JoinIntentJournal::new(state.path());
    let err = etcd::member_add(
        &opts,
        std::slice::from_ref(&down),
        "x",
        "http://127.0.0.18:2380",
        &journal,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, EtcdError::Unreachable { .. }), "{err}");
    assert!(journal.survives()?);

    // A non-retryable refusal comes back at once: re-adding an existing peer URL.
    let err = etcd::member_add_with(
        &opts,
        std::slice::from_ref(&ep),
        &AddMember::new("dup", cluster.peer_url(0)),
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, EtcdError::Request { endpoint, .. } if *endpoint == ep),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_missing_etcd_binary_fails_naming_the_package() {
    let empty = tempfile::tempdir().unwrap();
    let err = find_etcd(None, Some(empty.path().as_os_str().to_owned())).unwrap_err();
    assert!(
        err.to_string().contains("apt-get install etcd-server"),
        "{err}"
    );
    let err = find_etcd(Some(empty.path().join("etcd").into_os_string()), None).unwrap_err();
    assert!(err.to_string().contains("etcd-server"), "{err}");
}

/// `etcd health` over the member list, not the endpoints given: with the third of three
/// members dead, listing the two live ones (or one of them twice) is unhealthy and names
/// the dead one; a live member listed twice is counted once; an added voter that never
/// started is unhealthy too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_requires_every_listed_voting_member() -> anyhow::Result<()> {
    let mut cluster = EtcdCluster::start_plain(3).await?;
    let opts = cluster.options();
    let (ep0, ep1) = (cluster.endpoint(0), cluster.endpoint(1));

    let twice = vec![ep0.clone(), ep0.clone()];
    let health = etcd::etcd_cluster_healthy(&opts, &twice).await?;
    assert_eq!(
        health.members.len(),
        3,
        "every member answers once, whatever was listed: {health:?}"
    );

    // A voter added but never started counts towards quorum and answers nothing.
    let slot = cluster.plan_member()?;
    let added = etcd::member_add_with(
        &opts,
        std::slice::from_ref(&ep0),
        &AddMember {
            retry: test_retry(),
            ..AddMember::new(&slot.name, slot.peer_url())
        },
        None,
    )
    .await?;
    let err = etcd::etcd_cluster_healthy(&opts, &cluster.endpoints())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EtcdError::Unhealthy { problems, .. } if problems.iter().any(|p| matches!(p, MemberProblem::NotStarted { member } if member.contains(&format!("{:x}", added.id))))),
        "{err}"
    );
    etcd::member_remove(&opts, std::slice::from_ref(&ep0), &slot.peer_url()).await?;
    etcd::etcd_cluster_healthy(&opts, &cluster.endpoints()).await?;

    // Kill a follower that is not listed below; the two listed stay healthy themselves.
    let health = etcd::etcd_cluster_healthy(&opts, &cluster.endpoints()).await?;
    // Answers come in member-list order: match them to cluster members by endpoint.
    let leads = |i: usize| {
        health
            .members
            .iter()
            .any(|m| m.endpoint == cluster.endpoint(i) && m.member_id == Some(health.leader))
    };
    let victim = (0..3).rev().find(|&i| !leads(i)).unwrap();
    let dead = cluster.endpoint(victim);
    let listed: Vec<String> = (0..3)
        .filter(|&i| i != victim)
        .map(|i| cluster.endpoint(i))
        .collect();
    cluster.kill(victim);
    for given in [listed.clone(), vec![listed[0].clone(), listed[0].clone()]] {
        let err = etcd::etcd_cluster_healthy(&opts, &given)
            .await
            .expect_err("a dead voting member must make the cluster unhealthy");
        let EtcdError::Unhealthy { problems, .. } = &err else {
            panic!("expected Unhealthy, got {err}")
        };
        assert!(
            problems.iter().any(
                |p| matches!(p, MemberProblem::NoAnswer { endpoint, .. } if *endpoint == dead)
            ),
            "the dead member is named: {err}"
        );
    }
    let _ = ep1;
    Ok(())
}

/// A loopback TCP proxy to `target` that relays both ways until the client has sent
/// `trigger` (e.g. the peer URL inside a MemberAdd request body), and from then on throws
/// away every byte the server answers on that connection: the request arrives and is
/// applied, its answer never does.
struct AnswerEatingProxy {
    url: String,
    eaten: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl AnswerEatingProxy {
    async fn start(target: &str, trigger: &[u8]) -> anyhow::Result<Self> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let target_addr = target
            .split_once("://")
            .map(|(_, a)| a)
            .unwrap_or(target)
            .to_string();
        let trigger = trigger.to_vec();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let eaten = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = eaten.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&target_addr).await else {
                    continue;
                };
                let (counter, trigger) = (counter.clone(), trigger.clone());
                tokio::spawn(async move {
                    let triggered = std::sync::Arc::new(AtomicBool::new(false));
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up_flag = triggered.clone();
                    let up = async move {
                        let mut seen: Vec<u8> = Vec::new();
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = cr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            seen.extend_from_slice(&buf[..n]);
                            if seen.windows(trigger.len()).any(|w| w == trigger.as_slice()) {
                                up_flag.store(true, Ordering::SeqCst);
                            }
                            let keep = seen.len().saturating_sub(trigger.len());
                            seen.drain(..keep);
                            if sw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down = async move {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n) = sr.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            if triggered.load(Ordering::SeqCst) {
                                counter.fetch_add(n, Ordering::Relaxed);
                            } else if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    tokio::join!(up, down);
                });
            }
        });
        Ok(AnswerEatingProxy { url, eaten, task })
    }
}

impl Drop for AnswerEatingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An add whose answer is lost (it reached etcd and was applied) is read back from the
/// member list, not re-sent to the next endpoint: a second add would fail, and the first
/// would stay behind as an unstarted voter that can cost quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_member_add_is_read_back_not_sent_twice() -> anyhow::Result<()> {
    let mut cluster = EtcdCluster::start_plain(3).await?;
    let opts = cluster.options();
    // Past etcd's "unhealthy cluster" window after a start (a learner added directly,
    // retried until accepted, then removed), so the add below commits at its first send
    // and only its answer is lost.
    let warmup = cluster.plan_member()?;
    let direct = vec![cluster.endpoint(1)];
    etcd::member_add_with(
        &opts,
        &direct,
        &AddMember {
            learner: true,
            retry: test_retry(),
            ..AddMember::new(&warmup.name, warmup.peer_url())
        },
        None,
    )
    .await?;
    etcd::member_remove(&opts, &direct, &warmup.peer_url()).await?;
    let slot = cluster.plan_member()?;
    let proxy = AnswerEatingProxy::start(&cluster.endpoint(0), slot.peer_url().as_bytes()).await?;
    let endpoints = vec![proxy.url.clone(), cluster.endpoint(1), cluster.endpoint(2)];
    let added = etcd::member_add_with(
        &opts,
        &endpoints,
        &AddMember {
            retry: test_retry(),
            ..AddMember::new(&slot.name, slot.peer_url())
        },
        None,
    )
    .await
    .map_err(|e| anyhow::anyhow!("the add must succeed once, read back: {e}"))?;
    assert!(
        proxy.eaten.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the proxy relayed the add and ate etcd's answer"
    );
    let (_, members) = etcd::member_list_via(&opts, &cluster.endpoints()).await?;
    let with_url: Vec<_> = members
        .iter()
        .filter(|m| m.peer_urls.contains(&slot.peer_url()))
        .collect();
    assert_eq!(with_url.len(), 1, "{members:?}");
    assert_eq!(with_url[0].id, added.id);
    assert!(
        added
            .initial_cluster
            .contains(&format!("{}={}", slot.name, slot.peer_url())),
        "{}",
        added.initial_cluster
    );
    // The adopted member is a real one: it starts with what the add returned.
    cluster.start_added(&slot, &added.initial_cluster).await?;
    etcd::etcd_cluster_healthy(&opts, &cluster.endpoints()).await?;
    Ok(())
}

/// `etcd downgrade --to 3.5.0` on real etcd 3.4: refused before anything is asked, naming
/// the cluster version and the etcd release that has the downgrade API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_on_etcd_3_4_is_refused_naming_the_version_that_supports_it() -> anyhow::Result<()>
{
    let cluster = EtcdCluster::start(2).await?;
    let opts = cluster.options();
    let eps = cluster.endpoints();
    let versions = etcd::member_versions(&opts, &eps).await?;
    assert_eq!(versions.len(), 2);
    assert!(
        versions.iter().all(|(_, v)| v.starts_with("3.4.")),
        "{versions:?}"
    );

    let mut progress = Vec::new();
    let err = etcd::downgrade_cluster(&opts, &eps, "3.5.0", Duration::from_secs(5), &mut progress)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            EtcdError::DowngradeRefused(ha::etcd::rules::DowngradeRefusal::Unsupported { cluster })
                if cluster.to_string() == "3.4"
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("3.4") && text.contains("etcd 3.5 or later"),
        "{text}"
    );
    let progress = String::from_utf8(progress)?;
    assert!(!progress.contains("downgrade enabled"), "{progress}");
    // The cluster is as it was: both members answer, on 3.4.
    assert_eq!(etcd::member_versions(&opts, &eps).await?, versions);

    // A member that does not answer: its version is unknown, and that is an error naming it.
    let err = etcd::downgrade_cluster(
        &opts,
        &["https://127.0.0.19:9".to_string()],
        "3.3",
        Duration::from_secs(1),
        &mut Vec::new(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("127.0.0.19:9"), "{err}");
    Ok(())
}
