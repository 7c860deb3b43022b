//! A node is started, stopped, reset or upgraded as a list of named steps run in order.
//! The name is what an operator sees in the progress lines and what a failure carries.

use std::future::Future;
use std::time::Duration;

use crate::BoxFuture;

/// Any error a step returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

type Step<'a> = Box<dyn FnOnce() -> BoxFuture<'a, Result<(), BoxError>> + Send + 'a>;

/// One named step. Build it with [`func`].
pub struct Task<'a> {
    name: String,
    step: Step<'a>,
}

impl<'a> Task<'a> {
    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs the step; a failure carries the task's name.
    pub async fn run(self) -> Result<(), PhaseError> {
        let name = self.name;
        (self.step)()
            .await
            .map_err(|source| PhaseError { task: name, source })
    }
}

impl std::fmt::Debug for Task<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Adapts an async closure to a [`Task`] named `name`.
pub fn func<'a, F, Fut, E>(name: impl Into<String>, step: F) -> Task<'a>
where
    F: FnOnce() -> Fut + Send + 'a,
    Fut: Future<Output = Result<(), E>> + Send + 'a,
    E: Into<BoxError>,
{
    Task {
        name: name.into(),
        step: Box::new(move || {
            let fut = step();
            Box::pin(async move { fut.await.map_err(Into::into) })
        }),
    }
}

/// A task that failed, named.
#[derive(Debug, thiserror::Error)]
#[error("phase {task:?} failed")]
pub struct PhaseError {
    /// The name of the task that failed.
    pub task: String,
    /// Why.
    #[source]
    pub source: BoxError,
}

impl PhaseError {
    /// A condition reason derived from the task name (`restart` gives `RestartFailed`,
    /// `await-local-dns` gives `AwaitLocalDnsFailed`), for status conditions and metrics
    /// that classify failures by phase.
    pub fn reason(&self) -> String {
        let mut reason = String::new();
        for word in self
            .task
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|w| !w.is_empty())
        {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                reason.push(first.to_ascii_uppercase());
                reason.extend(chars.map(|c| c.to_ascii_lowercase()));
            }
        }
        reason.push_str("Failed");
        reason
    }
}

/// What the sequential runner reports as it goes.
#[derive(Debug)]
pub enum Progress<'e> {
    /// Task `index` (0-based) of `total` is starting.
    Started {
        /// Position.
        index: usize,
        /// How many tasks there are.
        total: usize,
        /// Task name.
        name: &'e str,
    },
    /// The task finished.
    Done {
        /// Position.
        index: usize,
        /// How many tasks there are.
        total: usize,
        /// Task name.
        name: &'e str,
        /// How long it took.
        elapsed: Duration,
    },
    /// The task failed; no later task runs.
    Failed {
        /// Position.
        index: usize,
        /// How many tasks there are.
        total: usize,
        /// The failure.
        error: &'e PhaseError,
    },
}

/// Runs the tasks in order and stops at the first failure.
pub async fn run(tasks: Vec<Task<'_>>) -> Result<(), PhaseError> {
    run_with_progress(tasks, |_| {}).await
}

/// [`run`], reporting each task's start and end to `progress`.
pub async fn run_with_progress(
    tasks: Vec<Task<'_>>,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<(), PhaseError> {
    let total = tasks.len();
    for (index, task) in tasks.into_iter().enumerate() {
        let name = task.name.clone();
        progress(Progress::Started {
            index,
            total,
            name: &name,
        });
        let start = tokio::time::Instant::now();
        let span = tracing::info_span!("phase", phase = %name);
        match tracing::Instrument::instrument(task.run(), span).await {
            Ok(()) => progress(Progress::Done {
                index,
                total,
                name: &name,
                elapsed: start.elapsed(),
            }),
            Err(error) => {
                progress(Progress::Failed {
                    index,
                    total,
                    error: &error,
                });
                return Err(error);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Debug, thiserror::Error)]
    #[error("disk full")]
    struct DiskFull;

    #[tokio::test]
    async fn stops_at_first_failure_and_names_it() {
        let ran = Mutex::new(Vec::new());
        let tasks = vec![
            func("configure", || async {
                ran.lock().unwrap().push("configure");
                Ok::<_, DiskFull>(())
            }),
            func("restart", || async {
                ran.lock().unwrap().push("restart");
                Err(DiskFull)
            }),
            func("wait", || async {
                ran.lock().unwrap().push("wait");
                Ok::<_, DiskFull>(())
            }),
        ];
        let mut events = Vec::new();
        let err = run_with_progress(tasks, |p| {
            events.push(match p {
                Progress::Started { name, .. } => format!("start {name}"),
                Progress::Done { name, .. } => format!("done {name}"),
                Progress::Failed { error, .. } => format!("failed {}", error.task),
            })
        })
        .await
        .unwrap_err();
        assert_eq!(err.task, "restart");
        assert_eq!(
            crate::error_chain(&err),
            "phase \"restart\" failed: disk full"
        );
        assert_eq!(*ran.lock().unwrap(), ["configure", "restart"]);
        assert_eq!(
            events,
            [
                "start configure",
                "done configure",
                "start restart",
                "failed restart"
            ]
        );
    }

    #[test]
    fn reason_is_camel_case() {
        let err = |task: &str| PhaseError {
            task: task.into(),
            source: "x".into(),
        };
        assert_eq!(err("restart").reason(), "RestartFailed");
        assert_eq!(err("await-local-dns").reason(), "AwaitLocalDnsFailed");
        assert_eq!(err("").reason(), "Failed");
    }

    #[tokio::test]
    async fn empty_list_succeeds() {
        run(Vec::new()).await.unwrap();
    }
}
