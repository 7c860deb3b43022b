//! Restarting the services whose configuration an upgrade changed.

use std::future::Future;

/// A service and whether its configuration changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedUnit {
    /// The systemd unit.
    pub unit: String,
    /// Whether its configuration changed.
    pub changed: bool,
}

/// A restart failed.
#[derive(Debug, thiserror::Error)]
#[error("restart {unit}")]
pub struct RestartError<E: std::error::Error + 'static> {
    /// The unit whose restart failed; later units were not restarted.
    pub unit: String,
    /// The restart function's error (it owns the wording).
    #[source]
    pub source: E,
}

/// Restarts, in order, the units whose configuration changed, stopping at the first
/// failure. Nothing is restarted when the node was not running: a start reads the
/// configuration written before it. Returns the units restarted.
pub async fn restart_changed<F, Fut, E>(
    units: &[ChangedUnit],
    was_running: bool,
    mut restart: F,
) -> Result<Vec<String>, RestartError<E>>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let mut restarted = Vec::new();
    if !was_running {
        tracing::info!("node stack not running: nothing to restart");
        return Ok(restarted);
    }
    for unit in units.iter().filter(|u| u.changed) {
        tracing::info!(unit = %unit.unit, "restarting: configuration changed");
        restart(unit.unit.clone())
            .await
            .map_err(|source| RestartError {
                unit: unit.unit.clone(),
                source,
            })?;
        restarted.push(unit.unit.clone());
    }
    Ok(restarted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, thiserror::Error)]
    #[error("job failed")]
    struct JobFailed;

    fn units() -> Vec<ChangedUnit> {
        [
            ("containerd.service", true),
            ("kubelet.service", false),
            ("other.service", true),
        ]
        .into_iter()
        .map(|(u, c)| ChangedUnit {
            unit: u.into(),
            changed: c,
        })
        .collect()
    }

    #[tokio::test]
    async fn restarts_only_changed_in_order() {
        let calls = Mutex::new(Vec::new());
        let done = restart_changed(&units(), true, |u| {
            calls.lock().unwrap().push(u);
            async { Ok::<_, JobFailed>(()) }
        })
        .await
        .unwrap();
        assert_eq!(done, ["containerd.service", "other.service"]);
        assert_eq!(
            *calls.lock().unwrap(),
            ["containerd.service", "other.service"]
        );
    }

    #[tokio::test]
    async fn nothing_when_not_running() {
        let calls = Mutex::new(Vec::<String>::new());
        let done = restart_changed(&units(), false, |u| {
            calls.lock().unwrap().push(u);
            async { Ok::<_, JobFailed>(()) }
        })
        .await
        .unwrap();
        assert!(done.is_empty());
        assert!(calls.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn stops_at_the_first_failure() {
        let calls = Mutex::new(Vec::new());
        let err = restart_changed(&units(), true, |u| {
            calls.lock().unwrap().push(u);
            async { Err(JobFailed) }
        })
        .await
        .unwrap_err();
        assert_eq!(err.unit, "containerd.service");
        assert_eq!(
            crate::error_chain(&err),
            "restart containerd.service: job failed"
        );
        assert_eq!(calls.lock().unwrap().len(), 1);
    }
}
