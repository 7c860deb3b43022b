//! Output capture of the process provider: the pod's process writes its standard output
//! and error into two FIFOs in its directory; the manager drains them into `output.log`,
//! stamping every chunk it reads with the time in `output.idx`, and hands each chunk to
//! the clients attached at that moment.
//!
//! Why FIFOs rather than the log file as the process's stdout: a live attach needs the
//! output as it is written, with stdout and stderr apart, and `sinceSeconds`, `sinceTime`
//! and `timestamps` need the time each line was written. Why the process opens them
//! read-write: it then holds a reader of its own, so a manager that dies never makes its
//! writes fail (no SIGPIPE); they wait in the pipe (1 MiB where the system allows) until
//! the next manager drains them. A process that writes more than that while no manager
//! runs blocks until one does.
//!
//! `output.idx` is a sequence of 16-byte records, one per chunk read (not per line):
//! the chunk's offset in `output.log` and the time it was read, in nanoseconds since
//! the Unix epoch, both little-endian `u64`. A line's time is that of the chunk holding
//! its first byte.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::{broadcast, watch};

pub(crate) const OUTPUT: &str = "output.log";
pub(crate) const INDEX: &str = "output.idx";
pub(crate) const STDOUT_FIFO: &str = "stdout.fifo";
pub(crate) const STDERR_FIFO: &str = "stderr.fifo";
pub(crate) const STDIN_FIFO: &str = "stdin.fifo";
/// Pipe size asked for the output FIFOs (the unprivileged maximum by default).
const PIPE_SIZE: i32 = 1 << 20;
/// Chunks an attached client may fall behind before it misses output.
const ATTACH_BACKLOG: usize = 1024;

/// Which standard stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// The live capture of one instance in this manager.
pub(crate) struct Capture {
    /// Taken when the output ends, so that subscribers see the channel close.
    chunks: Mutex<Option<broadcast::Sender<(Stream, Bytes)>>>,
    /// Bytes in `output.log` so far; closed when the process's output ended.
    written: watch::Receiver<u64>,
}

impl Capture {
    /// Chunks from now on; `Closed` once the process's output ended.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<(Stream, Bytes)> {
        match &*self.chunks.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(tx) => tx.subscribe(),
            // Ended: a receiver of a channel already closed.
            None => broadcast::channel(1).1,
        }
    }

    /// The log length, changing as output is captured.
    pub(crate) fn written(&self) -> watch::Receiver<u64> {
        self.written.clone()
    }
}

/// The captures running in this manager, by claim directory.
#[derive(Clone, Default)]
pub(crate) struct Captures {
    live: Arc<Mutex<HashMap<PathBuf, Arc<Capture>>>>,
}

impl Captures {
    /// The running capture of `dir`, starting one when the instance has output FIFOs and
    /// none runs. `None` for an instance without FIFOs, or outside a runtime.
    pub(crate) fn ensure(&self, dir: &Path) -> Option<Arc<Capture>> {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = live.get(dir)
            && c.written.has_changed().is_ok()
        {
            return Some(c.clone());
        }
        live.remove(dir);
        if !dir.join(STDOUT_FIFO).exists() {
            return None;
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let open =
            |name: &str| tokio::net::unix::pipe::OpenOptions::new().open_receiver(dir.join(name));
        // Opening needs the runtime's reactor: enter it (this may run outside a task).
        let _guard = handle.enter();
        let (out, err) = match (open(STDOUT_FIFO), open(STDERR_FIFO)) {
            (Ok(o), Ok(e)) => (o, e),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(dir = %dir.display(), error = %e, "opening the output FIFOs");
                return None;
            }
        };
        let (chunks, _) = broadcast::channel(ATTACH_BACKLOG);
        let start = std::fs::metadata(dir.join(OUTPUT)).map_or(0, |m| m.len());
        let (written_tx, written) = watch::channel(start);
        let capture = Arc::new(Capture {
            chunks: Mutex::new(Some(chunks.clone())),
            written,
        });
        let ours = capture.clone();
        live.insert(dir.to_path_buf(), capture.clone());
        let dir = dir.to_path_buf();
        let registry = self.live.clone();
        handle.spawn(async move {
            pump(&dir, out, err, chunks, written_tx).await;
            ours.chunks.lock().unwrap_or_else(|p| p.into_inner()).take();
            let mut live = registry.lock().unwrap_or_else(|p| p.into_inner());
            if live
                .get(&dir)
                .is_some_and(|c| c.written.has_changed().is_err())
            {
                live.remove(&dir);
            }
        });
        Some(capture)
    }
}

/// Makes the FIFOs of a new instance; `stdin` adds the standard-input one.
pub(crate) fn make_fifos(dir: &Path, stdin: bool) -> std::io::Result<()> {
    let mut names = vec![STDOUT_FIFO, STDERR_FIFO];
    if stdin {
        names.push(STDIN_FIFO);
    }
    for name in names {
        let path = dir.join(name);
        match nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(std::io::Error::from(e)),
        }
    }
    Ok(())
}

/// Opens a FIFO read-write for the process (it holds both ends: never SIGPIPE, never end
/// of file on its stdin), with a large buffer where the system allows.
pub(crate) fn open_for_process(path: &Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    // Best effort: the default 64 KiB still works, it only holds less while no manager runs.
    widen_pipe(&file);
    Ok(file)
}

/// Asks for a [`PIPE_SIZE`] buffer on a pipe, best effort: a process writing large blocks
/// (`cat`, `dd`, `tar`) then fills it in one write, and its reader takes it in one read,
/// instead of a wake-up on each side every 64 KiB. Where the system refuses (an
/// unprivileged user past `fs/pipe-user-pages-soft`, or above `fs/pipe-max-size`), the
/// pipe keeps its default size and works the same, only with more wake-ups.
pub(crate) fn widen_pipe(pipe: &impl std::os::fd::AsFd) {
    let _ = nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

async fn pump(
    dir: &Path,
    mut out: tokio::net::unix::pipe::Receiver,
    mut err: tokio::net::unix::pipe::Receiver,
    chunks: broadcast::Sender<(Stream, Bytes)>,
    written: watch::Sender<u64>,
) {
    let log_path = dir.join(OUTPUT);
    let idx_path = dir.join(INDEX);
    let open_append = |p: &Path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
    };
    let mut log = open_append(&log_path).ok();
    let mut idx = open_append(&idx_path).ok();
    let mut offset = std::fs::metadata(&log_path).map_or(0, |m| m.len());
    let (mut out_open, mut err_open) = (true, true);
    let mut buf_out = vec![0u8; 64 * 1024];
    let mut buf_err = vec![0u8; 64 * 1024];
    while out_open || err_open {
        let (stream, n) = tokio::select! {
            r = out.read(&mut buf_out), if out_open => (Stream::Stdout, r),
            r = err.read(&mut buf_err), if err_open => (Stream::Stderr, r),
        };
        let n = match n {
            Ok(0) | Err(_) => {
                match stream {
                    Stream::Stdout => out_open = false,
                    Stream::Stderr => err_open = false,
                }
                continue;
            }
            Ok(n) => n,
        };
        let data = match stream {
            Stream::Stdout => &buf_out[..n],
            Stream::Stderr => &buf_err[..n],
        };
        let mut record = [0u8; 16];
        record[..8].copy_from_slice(&offset.to_le_bytes());
        record[8..].copy_from_slice(&now_nanos().to_le_bytes());
        // The index first: a reader that sees the bytes finds their time. A failed write
        // (the directory is gone after terminate) drops the file, the pipes still drain.
        if idx.as_mut().is_some_and(|f| f.write_all(&record).is_err()) {
            idx = None;
        }
        if log.as_mut().is_some_and(|f| f.write_all(data).is_err()) {
            log = None;
        }
        offset += n as u64;
        written.send_replace(offset);
        let _ = chunks.send((stream, Bytes::copy_from_slice(data)));
    }
}

/// The capture times of a log: `(offset, nanos)` records in offset order.
pub(crate) fn read_index(dir: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(dir.join(INDEX)).unwrap_or_default();
    bytes
        .chunks_exact(16)
        .map(|r| {
            let mut o = [0u8; 8];
            let mut t = [0u8; 8];
            o.copy_from_slice(&r[..8]);
            t.copy_from_slice(&r[8..]);
            (u64::from_le_bytes(o), u64::from_le_bytes(t))
        })
        .collect()
}

/// The time of the byte at `offset`: the last record at or before it, else `fallback`
/// (output captured before this format: the log file's modification time).
pub(crate) fn time_at(index: &[(u64, u64)], offset: u64, fallback: u64) -> u64 {
    let i = index.partition_point(|(o, _)| *o <= offset);
    if i == 0 { fallback } else { index[i - 1].1 }
}

/// What a log request asks to be rendered.
#[derive(Clone, Debug, Default)]
pub(crate) struct Render {
    pub(crate) since: Option<i128>,
    pub(crate) timestamps: bool,
}

/// Appends the lines of `content` (which starts at `base` in the log) that pass the
/// `since` filter to `out`, each prefixed with its time when asked. Answers how many
/// bytes of `content` were consumed: a trailing partial line is left when `hold_partial`.
pub(crate) fn render_lines(
    content: &[u8],
    base: u64,
    index: &[(u64, u64)],
    fallback: u64,
    r: &Render,
    hold_partial: bool,
    out: &mut Vec<u8>,
) -> usize {
    let mut pos = 0;
    while pos < content.len() {
        let end = match content[pos..].iter().position(|b| *b == b'\n') {
            Some(i) => pos + i + 1,
            None if hold_partial => break,
            None => content.len(),
        };
        let t = time_at(index, base + pos as u64, fallback);
        if r.since.is_none_or(|s| i128::from(t) >= s) {
            if r.timestamps {
                out.extend_from_slice(rfc3339_nanos(t).as_bytes());
                out.push(b' ');
            }
            out.extend_from_slice(&content[pos..end]);
        }
        pos = end;
    }
    pos
}

/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` of nanoseconds since the epoch (the kubelet's
/// fixed-width form of `timestamps=true`).
pub(crate) fn rfc3339_nanos(nanos: u64) -> String {
    let secs = nanos / 1_000_000_000;
    let sub = nanos % 1_000_000_000;
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{sub:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_widened_pipe_takes_a_mebibyte_in_one_write() {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        widen_pipe(&read);
        let size = nix::fcntl::fcntl(&read, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        assert_eq!(size, PIPE_SIZE, "the pipe was not widened");
        // What it is for: a writer's large block goes in at once, not 64 KiB of it.
        let block = vec![7u8; PIPE_SIZE as usize];
        assert_eq!(nix::unistd::write(&write, &block).unwrap(), block.len());
        drop(read);
    }

    #[test]
    fn a_line_takes_the_time_of_the_chunk_holding_its_first_byte() {
        let index = [(0, 100), (6, 200), (9, 300)];
        // "one\ntw" read at 100, "o\n" at 200, "three\n" at 300.
        let content = b"one\ntwo\nthree\n";
        let mut out = Vec::new();
        let r = Render {
            since: Some(100),
            timestamps: false,
        };
        assert_eq!(render_lines(content, 0, &index, 0, &r, false, &mut out), 14);
        assert_eq!(out, content);
        out.clear();
        let r = Render {
            since: Some(150),
            timestamps: false,
        };
        render_lines(content, 0, &index, 0, &r, false, &mut out);
        // "two" started in the chunk read at 100.
        assert_eq!(out, b"three\n");
        assert_eq!(time_at(&index, 5, 0), 100);
        assert_eq!(time_at(&[], 5, 42), 42);
    }

    #[test]
    fn a_partial_line_is_held_when_asked() {
        let mut out = Vec::new();
        let r = Render {
            since: None,
            timestamps: true,
        };
        let used = render_lines(
            b"a\nb",
            10,
            &[(10, 1_700_000_000_000_000_005)],
            0,
            &r,
            true,
            &mut out,
        );
        assert_eq!(used, 2);
        assert_eq!(out, b"2023-11-14T22:13:20.000000005Z a\n");
    }
}
