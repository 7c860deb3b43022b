//! The maintenance fence: the Lease `kube-system/stratum-maintenance`, held by a
//! cluster-wide maintenance operation (`certs rekey`) for its run and rechecked right before
//! each write it makes.
//!
//! The decisions (who holds it, take, renew, release) are pure, in [`hacore::fence`]; this
//! module reads and writes the Lease, every write carrying the resourceVersion it read (a
//! Lease cannot be updated unconditionally), so two takers racing cannot both win.
//!
//! The grant reader Role ([`crate::grants::rbac`]) lets the control-plane bootstrap group
//! `get` and `update` this one Lease by name, and nothing else among Leases; RBAC cannot
//! limit `create` by name, so [`ensure_fence_lease`] creates it (empty) when the reader
//! grant is written, and a holder from that group only ever updates it.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};

pub use hacore::fence::{FENCE_DURATION_SECONDS, FENCE_LEASE, FENCE_NAMESPACE, FenceState, judge};

/// How many times a fence write is attempted before conflicts are reported.
const MAX_ATTEMPTS: u32 = 5;

/// Why the fence could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// Someone else holds it.
    #[error(
        "the maintenance fence {FENCE_NAMESPACE}/{FENCE_LEASE} is held by {holder:?}{}: another \
         maintenance operation is running; wait for it to finish (or for its term to run out) \
         and run this again. Nothing was written",
        until.map(|t| format!(" until {t}")).unwrap_or_default()
    )]
    Held {
        /// The holder's identity.
        holder: String,
        /// When its term ends without a renewal.
        until: Option<Timestamp>,
    },
    /// It was held and is no longer: taken over, or its term ran out while a call stalled.
    #[error(
        "the maintenance fence {FENCE_NAMESPACE}/{FENCE_LEASE} was lost ({now}); this \
         operation stops before its next write"
    )]
    Lost {
        /// Who holds it now, or that it ran out.
        now: String,
    },
    /// The API server refused or could not be asked.
    #[error("cannot {action} the Lease {FENCE_NAMESPACE}/{FENCE_LEASE}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Writes kept conflicting.
    #[error(
        "the Lease {FENCE_NAMESPACE}/{FENCE_LEASE} kept changing under this write \
         ({MAX_ATTEMPTS} attempts); retry in a moment"
    )]
    Conflict,
}

fn api_error(action: &'static str) -> impl Fn(kube::Error) -> FenceError {
    move |source| FenceError::Api {
        action,
        source: Box::new(source),
    }
}

fn is_race(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found())
}

fn lost(state: FenceState) -> FenceError {
    FenceError::Lost {
        now: match state {
            FenceState::Held { holder, .. } => format!("now held by {holder:?}"),
            FenceState::Free | FenceState::Mine { .. } => "its term ran out".into(),
        },
    }
}

/// Creates the fence Lease, empty, when it does not exist: the reader Role grants only
/// `get` and `update` on it by name (RBAC cannot scope `create` to a name), so a holder from
/// the bootstrap group needs it to exist. Writes nothing when it exists.
pub async fn ensure_fence_lease(client: &kube::Client) -> Result<(), FenceError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), FENCE_NAMESPACE);
    if api
        .get_opt(FENCE_LEASE)
        .await
        .map_err(api_error("read"))?
        .is_some()
    {
        return Ok(());
    }
    let empty = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(FENCE_LEASE.into()),
            namespace: Some(FENCE_NAMESPACE.into()),
            ..Default::default()
        },
        spec: None,
    };
    match api.create(&PostParams::default(), &empty).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(()),
        Err(e) => Err(api_error("create")(e)),
    }
}

/// A held fence. Dropping it does not release it (that needs the API); call
/// [`Fence::release`], or let the term run out.
#[derive(Clone)]
pub struct Fence {
    client: kube::Client,
    identity: String,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// Takes the fence as `identity`, refusing ([`FenceError::Held`]) while someone else's
    /// term runs. A conflicting write re-reads and judges again.
    pub async fn take(client: &kube::Client, identity: &str) -> Result<Fence, FenceError> {
        let api: Api<Lease> = Api::namespaced(client.clone(), FENCE_NAMESPACE);
        for _ in 0..MAX_ATTEMPTS {
            let observed = api.get_opt(FENCE_LEASE).await.map_err(api_error("read"))?;
            let wanted = match hacore::fence::take(observed.as_ref(), identity, Timestamp::now()) {
                Ok(lease) => lease,
                Err(FenceState::Held { holder, expires }) => {
                    return Err(FenceError::Held {
                        holder,
                        until: expires,
                    });
                }
                Err(other) => return Err(lost(other)),
            };
            let written = match observed {
                None => api.create(&PostParams::default(), &wanted).await,
                Some(_) => {
                    api.replace(FENCE_LEASE, &PostParams::default(), &wanted)
                        .await
                }
            };
            match written {
                Ok(_) => {
                    tracing::info!(
                        lease = FENCE_LEASE,
                        holder = identity,
                        "maintenance fence taken"
                    );
                    return Ok(Fence {
                        client: client.clone(),
                        identity: identity.to_string(),
                    });
                }
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(api_error("write")(e)),
            }
        }
        Err(FenceError::Conflict)
    }

    /// The identity this fence is held as.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Rechecks that this fence is still held, and renews its term: the recheck a
    /// maintenance write runs immediately before writing. A fence taken over or run out is
    /// [`FenceError::Lost`], never re-taken here.
    pub async fn confirm(&self) -> Result<(), FenceError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), FENCE_NAMESPACE);
        for _ in 0..MAX_ATTEMPTS {
            let observed = api.get_opt(FENCE_LEASE).await.map_err(api_error("read"))?;
            let renewed = hacore::fence::renew(observed.as_ref(), &self.identity, Timestamp::now())
                .map_err(lost)?;
            match api
                .replace(FENCE_LEASE, &PostParams::default(), &renewed)
                .await
            {
                Ok(_) => return Ok(()),
                // Written since the read: read again and judge whose it is now.
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(api_error("renew")(e)),
            }
        }
        Err(FenceError::Conflict)
    }

    /// Gives the fence up (when still held; someone else's term is never ended).
    pub async fn release(self) -> Result<(), FenceError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), FENCE_NAMESPACE);
        for _ in 0..MAX_ATTEMPTS {
            let observed = api.get_opt(FENCE_LEASE).await.map_err(api_error("read"))?;
            let Some(released) =
                hacore::fence::release(observed.as_ref(), &self.identity, Timestamp::now())
            else {
                return Ok(());
            };
            match api
                .replace(FENCE_LEASE, &PostParams::default(), &released)
                .await
            {
                Ok(_) => {
                    tracing::info!(lease = FENCE_LEASE, "maintenance fence released");
                    return Ok(());
                }
                Err(e) if is_race(&e) => continue,
                Err(e) => return Err(api_error("release")(e)),
            }
        }
        Err(FenceError::Conflict)
    }
}
