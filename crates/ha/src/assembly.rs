//! The node steps a first controller and a joining control plane share, in one pinned
//! order (the seed's `AssembleNode`):
//!
//! 1. resolve the cluster: the joiner's discovery and grant download, the first
//!    controller's shared PKI;
//! 2. host directories;
//! 3. the node IP;
//! 4. a hook before the certificates;
//! 5. this node's leaf certificates;
//! 6. its kubeconfigs;
//! 7. a hook before anything runs (the joiner records its intent there).
//!
//! Every step that can refuse returns before the next one starts, and the error reported
//! is the step's own, so a caller's refusal text survives. Cancellation is checked between
//! steps: a step in flight finishes, the next one does not start. The first step writes
//! nothing unless it succeeds (the grant download is all-or-nothing), so a wrong pin, key
//! or token leaves the host as it was.
//!
//! The steps are a trait so a test can record them ([`NodeAssembly`]); production
//! implementations are [`crate::join`]'s and [`crate::bootstrap`]'s.

use tokio_util::sync::CancellationToken;

/// The steps, in the order [`assemble_node`] runs them.
pub const STEPS: &[Step] = &[
    Step::ResolveCluster,
    Step::HostDirs,
    Step::NodeIp,
    Step::BeforeCerts,
    Step::IssueCerts,
    Step::WriteKubeconfigs,
    Step::BeforeRun,
];

/// One assembly step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Discovery and grant download, or the first controller's shared PKI.
    ResolveCluster,
    /// Data, PKI and log directories.
    HostDirs,
    /// This node's address.
    NodeIp,
    /// The caller's hook before certificates.
    BeforeCerts,
    /// Leaf certificates.
    IssueCerts,
    /// Kubeconfigs.
    WriteKubeconfigs,
    /// The caller's hook before anything runs.
    BeforeRun,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Step::ResolveCluster => "resolve the cluster",
            Step::HostDirs => "create the host directories",
            Step::NodeIp => "resolve the node IP",
            Step::BeforeCerts => "check before issuing certificates",
            Step::IssueCerts => "issue this node's certificates",
            Step::WriteKubeconfigs => "write the kubeconfigs",
            Step::BeforeRun => "prepare to run",
        };
        f.write_str(s)
    }
}

/// An assembly that stopped.
#[derive(Debug, thiserror::Error)]
pub enum AssemblyError<E: std::error::Error + 'static> {
    /// A step refused; its own error is the source.
    #[error(transparent)]
    Step(E),
    /// Cancelled (SIGINT/SIGTERM) before `next` started.
    #[error("interrupted before the step \"{next}\"; nothing after it was done")]
    Cancelled {
        /// The step that did not start.
        next: Step,
    },
}

/// The effects of each step. Implementations keep their own state (what discovery found,
/// the node IP chosen) between steps.
// The futures are awaited on the caller's task, never spawned, so no Send bound is needed.
#[allow(async_fn_in_trait)]
pub trait NodeAssembly {
    /// The error every step reports.
    type Error: std::error::Error + 'static;
    /// Runs `step`.
    async fn run(&mut self, step: Step) -> Result<(), Self::Error>;
}

/// Runs every step of [`STEPS`] in order, stopping at the first error or when `cancel`
/// fires between steps.
pub async fn assemble_node<A: NodeAssembly>(
    cancel: &CancellationToken,
    a: &mut A,
) -> Result<(), AssemblyError<A::Error>> {
    for &step in STEPS {
        if cancel.is_cancelled() {
            return Err(AssemblyError::Cancelled { next: step });
        }
        tracing::debug!(%step, "assembly step");
        a.run(step).await.map_err(AssemblyError::Step)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("refused at {0}")]
    struct Refused(Step);

    struct Recording {
        ran: Vec<Step>,
        fail_at: Option<Step>,
        cancel_after: Option<(Step, CancellationToken)>,
    }

    impl NodeAssembly for Recording {
        type Error = Refused;
        async fn run(&mut self, step: Step) -> Result<(), Refused> {
            self.ran.push(step);
            if let Some((at, token)) = &self.cancel_after
                && *at == step
            {
                token.cancel();
            }
            if self.fail_at == Some(step) {
                return Err(Refused(step));
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn steps_run_in_the_pinned_order() {
        let mut r = Recording {
            ran: vec![],
            fail_at: None,
            cancel_after: None,
        };
        assemble_node(&CancellationToken::new(), &mut r)
            .await
            .unwrap();
        assert_eq!(r.ran, STEPS);
        // Resolution (which can refuse a wrong pin or key) runs before anything is created.
        assert_eq!(r.ran[0], Step::ResolveCluster);
    }

    #[tokio::test]
    async fn a_refusal_stops_before_the_next_step_and_keeps_its_text() {
        for &fail in STEPS {
            let mut r = Recording {
                ran: vec![],
                fail_at: Some(fail),
                cancel_after: None,
            };
            let err = assemble_node(&CancellationToken::new(), &mut r)
                .await
                .unwrap_err();
            assert_eq!(r.ran.last(), Some(&fail));
            assert!(
                !r.ran
                    .iter()
                    .skip_while(|s| **s != fail)
                    .skip(1)
                    .any(|_| true)
            );
            assert_eq!(err.to_string(), format!("refused at {fail}"));
        }
    }

    #[tokio::test]
    async fn cancellation_lets_the_step_finish_and_starts_no_other() {
        let token = CancellationToken::new();
        let mut r = Recording {
            ran: vec![],
            fail_at: None,
            cancel_after: Some((Step::NodeIp, token.clone())),
        };
        let err = assemble_node(&token, &mut r).await.unwrap_err();
        assert_eq!(r.ran, &STEPS[..3]);
        assert!(matches!(
            err,
            AssemblyError::Cancelled {
                next: Step::BeforeCerts
            }
        ));
    }
}
