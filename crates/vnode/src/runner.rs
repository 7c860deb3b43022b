//! The runner of one provider: its node controller and pod controller, together.

use std::sync::Arc;

use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::crash::CrashHook;
use crate::handler::Handler;
use crate::metrics::Metrics;
use crate::node::{NodeAdvert, NodeError, run_node};
use crate::pods::{PodControllerConfig, run_pods};
use crate::provider::Provider;

/// One provider's virtual node: node registration and lease, pod lifecycle, notify loop.
pub struct Runner {
    client: Client,
    provider: Arc<dyn Provider>,
    crash: Option<CrashHook>,
    /// The handler of the current (or last) run: each run starts with an empty one.
    handler: std::sync::Mutex<Arc<Handler>>,
    advert: NodeAdvert,
    metrics: Arc<Metrics>,
    pods: PodControllerConfig,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("provider", &self.provider.name())
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner for `provider`. `crash` is a test hook run at each crash point.
    pub fn new(
        client: Client,
        provider: Arc<dyn Provider>,
        advert: NodeAdvert,
        metrics: Arc<Metrics>,
        pods: PodControllerConfig,
        crash: Option<CrashHook>,
    ) -> Runner {
        let handler = Arc::new(Handler::new(
            provider.clone(),
            metrics.clone(),
            crash.clone(),
        ));
        Runner {
            client,
            provider,
            crash,
            handler: std::sync::Mutex::new(handler),
            advert,
            metrics,
            pods,
        }
    }

    /// The handler (the kubelet API asks it which pods it tracks).
    pub fn handler(&self) -> Arc<Handler> {
        self.handler
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Runs until `cancel` fires. A fresh handler map each time it starts leading is what
    /// a new leader has: everything it needs is re-adopted from the provider's list.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), NodeError> {
        let provider = self.provider.clone();
        let handler = Arc::new(Handler::new(
            provider.clone(),
            self.metrics.clone(),
            self.crash.clone(),
        ));
        *self.handler.lock().unwrap_or_else(|p| p.into_inner()) = handler.clone();
        info!(provider = %provider.name(), "virtual node runner starting");
        // Aborted when this future is dropped (JoinSet), like everything else of the runner.
        let mut node = tokio::task::JoinSet::new();
        node.spawn(run_node(
            self.client.clone(),
            provider.clone(),
            self.advert.clone(),
            cancel.clone(),
        ));
        let pods = run_pods(
            self.client.clone(),
            handler,
            self.metrics.clone(),
            self.pods.clone(),
            cancel.clone(),
        );
        pods.await;
        cancel.cancel();
        match node.join_next().await {
            Some(Ok(result)) => result,
            _ => Ok(()),
        }
    }
}
