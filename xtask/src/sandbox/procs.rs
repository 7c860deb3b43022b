//! The sandbox's processes: each in its own process group with its output in
//! `<dir>/logs/<name>.log`, stopped in reverse start order.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A process the sandbox started.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    /// The log so far (for waiting on a line, or for an error message).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails, with the log's tail, when the process has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); its log {} ends with:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log_text(), 15)
            );
        }
        Ok(())
    }

    /// Waits until the log holds `text`; fails when the process exits first or at the
    /// deadline.
    pub fn wait_log(&mut self, text: &str, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().contains(text) {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "{} did not log {text:?} within {timeout:?}; its log {} ends with:\n{}",
                    self.name,
                    self.log.display(),
                    tail(&self.log_text(), 15)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM to the process (it stops its own children), then SIGKILL to its whole
    /// group after `grace`.
    fn stop(&mut self, grace: Duration) {
        let pid = self.child.id();
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            signal_group(pid, "KILL");
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Whatever is left of the group (children of a killed parent included).
        signal_group(pid, "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Every process the sandbox started, in start order.
pub struct Procs {
    logs: PathBuf,
    procs: Vec<Proc>,
}

impl Procs {
    pub fn new(dir: &Path) -> anyhow::Result<Procs> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(Procs {
            logs,
            procs: Vec::new(),
        })
    }

    /// Starts `cmd` as `name` in its own process group, output to its log file. Returns
    /// its index for [`Procs::get`].
    pub fn spawn(&mut self, name: &str, mut cmd: Command) -> anyhow::Result<usize> {
        let log = self.logs.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        self.procs.push(Proc {
            name: name.to_string(),
            log,
            child,
        });
        Ok(self.procs.len() - 1)
    }

    pub fn get(&mut self, i: usize) -> &mut Proc {
        &mut self.procs[i]
    }

    /// Fails naming the first process that has exited.
    pub fn check_all(&mut self) -> anyhow::Result<()> {
        for p in &mut self.procs {
            p.check_alive()?;
        }
        Ok(())
    }

    /// Stops every process, last started first.
    pub fn stop_all(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            eprintln!("sandbox: stopping {}", p.name);
            p.stop(Duration::from_secs(15));
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.stop_all();
    }
}
