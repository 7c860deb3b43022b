//! Crash points: the places between two steps of provisioning where a manager may die.
//! Tests (and the `NEBULA_MANAGER_CRASH_AT` fault switch of nebula-manager) hook them to
//! prove that a restart finds exactly one instance per live pod.

use std::sync::Arc;

use futures::future::BoxFuture;

/// A point between two steps of provisioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CrashPoint {
    /// The pod was seen; nothing asked of the provider yet.
    BeforeProvision,
    /// The provider created the instance; its answer has not reached the handler.
    ProviderCreated,
    /// The handler has the instance id in memory; nothing written to the pod yet.
    AfterProvision,
    /// The instance-id and endpoint annotations are written; the status is not.
    AfterMetadata,
    /// The connect Secret is written; the Running status is not.
    AfterSecret,
    /// The instance was terminated; the pod's final delete is not issued yet.
    AfterTerminate,
}

impl CrashPoint {
    /// Every crash point, in the order provisioning and deletion pass them.
    pub const ALL: [CrashPoint; 6] = [
        CrashPoint::BeforeProvision,
        CrashPoint::ProviderCreated,
        CrashPoint::AfterProvision,
        CrashPoint::AfterMetadata,
        CrashPoint::AfterSecret,
        CrashPoint::AfterTerminate,
    ];

    /// Its name on the command line and in logs (`before-provision`...).
    pub fn as_str(self) -> &'static str {
        match self {
            CrashPoint::BeforeProvision => "before-provision",
            CrashPoint::ProviderCreated => "provider-created",
            CrashPoint::AfterProvision => "after-provision",
            CrashPoint::AfterMetadata => "after-metadata",
            CrashPoint::AfterSecret => "after-secret",
            CrashPoint::AfterTerminate => "after-terminate",
        }
    }

    /// Parses [`CrashPoint::as_str`].
    pub fn parse(s: &str) -> Option<CrashPoint> {
        CrashPoint::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Called at every crash point; a test hook may never return (the "crash"), a production
/// handler has none.
pub type CrashHook = Arc<dyn Fn(CrashPoint) -> BoxFuture<'static, ()> + Send + Sync>;

/// Runs `hook` at `point`, if there is a hook.
pub(crate) async fn at(hook: &Option<CrashHook>, point: CrashPoint) {
    if let Some(hook) = hook {
        hook(point).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in CrashPoint::ALL {
            assert_eq!(CrashPoint::parse(p.as_str()), Some(p));
        }
        assert_eq!(CrashPoint::parse("nope"), None);
    }
}
