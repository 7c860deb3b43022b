//! Learner add, queueing and promotion against real etcd 3.4: the refusals the join
//! queues on are typed from what etcd really answers.

use std::time::Duration;

use ha::etcd::learner::{
    LearnerError, Queueing, Refusal, add_learner, linearizable_member_list, promote_when_caught_up,
};

use crate::etcd_harness::EtcdCluster;

fn quick(deadline: Duration) -> Queueing {
    Queueing {
        deadline,
        initial: Duration::from_millis(200),
        max: Duration::from_millis(500),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_learner_at_a_time_then_promotion_once_caught_up() -> anyhow::Result<()> {
    let mut cluster = EtcdCluster::start(1).await?;
    let opts = cluster.options();
    let eps = cluster.endpoints();

    // The first learner: queued only while the fresh cluster refuses reconfiguration.
    let a = cluster.plan_member()?;
    let mut seen = Vec::new();
    let added = add_learner(
        &opts,
        &eps,
        &a.name,
        &a.peer_url(),
        quick(Duration::from_secs(60)),
        |r| seen.push(r),
    )
    .await?;
    assert!(!added.adopted);
    assert!(seen.iter().all(|r| *r == Refusal::Unhealthy), "{seen:?}");
    let (_, members) = linearizable_member_list(&opts, &eps)
        .await
        .map_err(anyhow::Error::msg)?;
    assert!(members.iter().any(|m| m.id == added.id && m.is_learner));

    // A second learner is refused with etcd's one-learner rule, typed, until the deadline.
    let b = cluster.plan_member()?;
    let mut seen = Vec::new();
    let err = add_learner(
        &opts,
        &eps,
        &b.name,
        &b.peer_url(),
        quick(Duration::from_secs(3)),
        |r| seen.push(r),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, LearnerError::Deadline { .. }), "{err}");
    assert!(seen.contains(&Refusal::TooManyLearners), "{seen:?}");
    assert!(err.to_string().contains("too many learner"), "{err}");

    // Adding the same peer URL again adopts the member instead of failing or duplicating.
    let again = add_learner(
        &opts,
        &eps,
        &a.name,
        &a.peer_url(),
        quick(Duration::from_secs(10)),
        |_| {},
    )
    .await?;
    assert!(again.adopted);
    assert_eq!(again.id, added.id);

    // Promotion before the learner runs is refused as not in sync; once it runs, it goes.
    let err = promote_when_caught_up(&opts, &eps, added.id, &a.peer_url(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("in sync"), "{err}");
    cluster.start_added(&a, &added.initial_cluster).await?;
    promote_when_caught_up(
        &opts,
        &eps,
        added.id,
        &a.peer_url(),
        Duration::from_secs(60),
    )
    .await?;
    // A lost answer to the promote: promoting a voter again is success.
    promote_when_caught_up(
        &opts,
        &eps,
        added.id,
        &a.peer_url(),
        Duration::from_secs(10),
    )
    .await?;
    let (_, members) = linearizable_member_list(&opts, &cluster.endpoints())
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| !m.is_learner), "{members:?}");

    // The learner slot is free again.
    add_learner(
        &opts,
        &eps,
        &b.name,
        &b.peer_url(),
        quick(Duration::from_secs(60)),
        |_| {},
    )
    .await?;
    Ok(())
}
