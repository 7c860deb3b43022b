//! The placement blocklist: a provider (or one of its capacity types) that just refused a
//! provision is skipped for a while, so placement moves on instead of hot-looping.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::provider::BlockScope;

/// Shared between the pod controllers (which record refusals) and placement (which reads).
#[derive(Debug, Default)]
pub struct Blocklist {
    entries: Mutex<HashMap<(String, BlockScope), Instant>>,
}

impl Blocklist {
    /// An empty blocklist.
    pub fn new() -> Blocklist {
        Blocklist::default()
    }

    /// Blocks `scope` of `provider` for `ttl`. A later record extends, never shortens.
    pub fn record(&self, provider: &str, scope: BlockScope, ttl: Duration) {
        let until = Instant::now() + ttl;
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let slot = e.entry((provider.to_string(), scope)).or_insert(until);
        if *slot < until {
            *slot = until;
        }
    }

    /// Whether `scope` of `provider` is blocked now (a provider-wide block blocks every
    /// capacity type).
    pub fn is_blocked(&self, provider: &str, scope: &BlockScope) -> bool {
        let now = Instant::now();
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.retain(|_, until| *until > now);
        e.contains_key(&(provider.to_string(), BlockScope::Provider))
            || e.contains_key(&(provider.to_string(), scope.clone()))
    }

    /// When the earliest block ends, if any is active.
    pub fn next_expiry(&self) -> Option<Instant> {
        let now = Instant::now();
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.values().copied().filter(|u| *u > now).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn blocks_expire() {
        let b = Blocklist::new();
        b.record(
            "a",
            BlockScope::CapacityType("spot".into()),
            Duration::from_secs(30),
        );
        assert!(b.is_blocked("a", &BlockScope::CapacityType("spot".into())));
        assert!(!b.is_blocked("a", &BlockScope::CapacityType("on-demand".into())));
        b.record("c", BlockScope::Provider, Duration::from_secs(10));
        assert!(b.is_blocked("c", &BlockScope::CapacityType("x".into())));
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(!b.is_blocked("a", &BlockScope::CapacityType("spot".into())));
        assert_eq!(b.next_expiry(), None);
    }
}
