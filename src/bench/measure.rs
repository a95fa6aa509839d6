//! The measurements: the raw disk, the pipeline, and small synced writes on both.

use super::SMALL_WRITE;
use anyhow::{Context, Result};
use indicatif::ProgressBar;
use stampfs_client::{Client, CreateOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// A deterministic, incompressible-looking buffer (xorshift).
pub(super) fn source(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes `bytes` sequentially with `pwrite` into a new file in `dir`, then
/// `fdatasync`; returns the time from create to the end of the sync. The file is
/// removed afterwards (not timed).
///
/// With `write_behind` above zero, writeback of every `write_behind` bytes written is
/// started right away (`posix_fadvise(DONTNEED)`, as the chunkserver's threads engine
/// does), so the disk works while the writer goes on: the stricter baseline.
pub(super) fn raw_sequential(
    dir: &Path,
    bytes: u64,
    buf: &[u8],
    bar: &ProgressBar,
    write_behind: u64,
) -> Result<Duration> {
    let path = dir.join("raw-sequential.bin");
    let started = Instant::now();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let mut at = 0u64;
    let mut behind = 0u64;
    while at < bytes {
        let n = (bytes - at).min(buf.len() as u64) as usize;
        file.write_all_at(&buf[..n], at)
            .with_context(|| format!("writing {}", path.display()))?;
        at += n as u64;
        bar.inc(n as u64);
        if write_behind > 0 && at - behind >= write_behind {
            if let Some(len) = std::num::NonZeroU64::new(at - behind) {
                rustix::fs::fadvise(&file, behind, Some(len), rustix::fs::Advice::DontNeed)
                    .with_context(|| format!("write-behind on {}", path.display()))?;
            }
            behind = at;
        }
    }
    file.sync_data()
        .with_context(|| format!("fdatasync {}", path.display()))?;
    let elapsed = started.elapsed();
    drop(file);
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    settle(dir);
    Ok(elapsed)
}

/// Waits until the file system holding `dir` has committed everything, so the work
/// a removal leaves behind (journal commit, discards) does not land in the next
/// measurement. Best effort: a failure only makes the next measurement noisier.
pub(super) fn settle(dir: &Path) {
    match std::fs::File::open(dir) {
        Ok(d) => {
            if let Err(e) = rustix::fs::syncfs(&d) {
                tracing::debug!(error = %e, "syncfs failed");
            }
        }
        Err(e) => tracing::debug!(error = %e, dir = %dir.display(), "cannot open for syncfs"),
    }
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("benchmark thread failed")?
}

/// Writes `size` bytes to `path` and closes after an hsync, as a task of the runtime
/// (where applications run writers). Returns the time from create to the end of
/// close and the ack latencies.
pub(super) async fn pipeline_write(
    client: Client,
    path: String,
    opts: CreateOptions,
    size: u64,
    src: Arc<Vec<u8>>,
    bar: ProgressBar,
) -> Result<(Duration, Vec<Duration>)> {
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let mut w = client
            .create(&path, opts)
            .await
            .with_context(|| format!("creating {path}"))?;
        w.record_ack_latencies(true);
        let mut left = size;
        while left > 0 {
            let n = left.min(src.len() as u64) as usize;
            w.write_all(&src[..n])
                .await
                .with_context(|| format!("writing {path}"))?;
            left -= n as u64;
            bar.inc(n as u64);
        }
        w.hsync().await.with_context(|| format!("hsync {path}"))?;
        let acks = w.take_ack_latencies();
        w.close().await.with_context(|| format!("closing {path}"))?;
        Ok((started.elapsed(), acks))
    });
    task.await.context("benchmark task failed")?
}

/// `files.len()` raw files appended side by side: each round writes 4 KiB to every
/// file and fdatasyncs them all at once, one thread per file, which is what that many
/// replicas on this one disk must do for one hsync.
pub(super) struct ParallelRaw {
    /// Releases the workers into a round (and, with `stop` set, out of their loop).
    start: Arc<Barrier>,
    /// Met by every worker once its write and sync are done.
    end: Arc<Barrier>,
    stop: Arc<AtomicBool>,
    /// The first error a worker hit; checked after each round.
    error: Arc<Mutex<Option<std::io::Error>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    paths: Vec<PathBuf>,
}

impl ParallelRaw {
    fn new(dir: &Path, n: usize) -> Result<Self> {
        let start = Arc::new(Barrier::new(n + 1));
        let end = Arc::new(Barrier::new(n + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let error = Arc::new(Mutex::new(None));
        let mut threads = Vec::new();
        let mut paths = Vec::new();
        let data = source(SMALL_WRITE);
        for k in 0..n {
            let path = dir.join(format!("raw-small-{k}.bin"));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            paths.push(path);
            let (start, end, stop, error, data) = (
                start.clone(),
                end.clone(),
                stop.clone(),
                error.clone(),
                data.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut at = 0u64;
                loop {
                    start.wait();
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    if let Err(e) = file.write_all_at(&data, at).and_then(|()| file.sync_data()) {
                        error
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(e);
                    }
                    at += data.len() as u64;
                    end.wait();
                }
            }));
        }
        Ok(Self {
            start,
            end,
            stop,
            error,
            threads,
            paths,
        })
    }

    /// One round (blocking): how long until every file's write and sync were done.
    fn round(&self) -> Result<Duration> {
        let started = Instant::now();
        self.start.wait();
        self.end.wait();
        let took = started.elapsed();
        if let Some(e) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e).context("raw parallel small write");
        }
        Ok(took)
    }
}

impl Drop for ParallelRaw {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.start.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Latencies of one small-write series.
pub(super) struct SmallSeries {
    pub(super) pipeline: Vec<Duration>,
    pub(super) raw: Vec<Duration>,
    /// `replication` raw files side by side (absent for replication 1).
    pub(super) raw_parallel: Option<Vec<Duration>>,
    /// The writer's own view: each packet's send to its ack from the whole pipeline.
    pub(super) acks: Vec<Duration>,
}

/// `count` × (4 KiB append + hsync) through the pipeline, interleaved one for one
/// with `count` × (4 KiB `pwrite` append + `fdatasync`) of a raw file in `dir` (and,
/// for replication above 1, with rounds of [`ParallelRaw`]), so every series sees the
/// same machine: on a VM, how busy the CPUs are changes how soon a sleeping thread
/// learns that its flush is done. One untimed warm-up of each first. The pipeline
/// side runs as a task of the runtime, as an application's writer would.
pub(super) async fn small_writes(
    client: Client,
    path: String,
    opts: CreateOptions,
    dir: PathBuf,
    count: usize,
    bar: ProgressBar,
) -> Result<SmallSeries> {
    let task = tokio::spawn(async move {
        let buf = source(SMALL_WRITE);
        let raw_path = dir.join("raw-small.bin");
        let raw = Arc::new(
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&raw_path)
                .with_context(|| format!("creating {}", raw_path.display()))?,
        );
        let replicas = usize::from(opts.replication.unwrap_or(1).max(1));
        let parallel = if replicas > 1 {
            let dir = dir.clone();
            Some(Arc::new(
                blocking(move || ParallelRaw::new(&dir, replicas)).await?,
            ))
        } else {
            None
        };
        let mut w = client
            .create(&path, opts)
            .await
            .with_context(|| format!("creating {path}"))?;
        let mut out = SmallSeries {
            pipeline: Vec::with_capacity(count),
            raw: Vec::with_capacity(count),
            raw_parallel: parallel.as_ref().map(|_| Vec::with_capacity(count)),
            acks: Vec::new(),
        };
        for i in 0..=count {
            let (file, data, at) = (raw.clone(), buf.clone(), (i * SMALL_WRITE) as u64);
            let took = blocking(move || {
                let started = Instant::now();
                file.write_all_at(&data, at)
                    .and_then(|()| file.sync_data())
                    .context("raw small write")?;
                Ok(started.elapsed())
            })
            .await?;
            let took_parallel = match &parallel {
                Some(p) => {
                    let p = p.clone();
                    Some(blocking(move || p.round()).await?)
                }
                None => None,
            };
            w.record_ack_latencies(i > 0);
            let started = Instant::now();
            w.write_all(&buf)
                .await
                .with_context(|| format!("writing {path}"))?;
            w.hsync().await.with_context(|| format!("hsync {path}"))?;
            if i > 0 {
                out.pipeline.push(started.elapsed());
                out.raw.push(took);
                if let (Some(v), Some(t)) = (out.raw_parallel.as_mut(), took_parallel) {
                    v.push(t);
                }
            }
            bar.inc(2 * SMALL_WRITE as u64);
        }
        out.acks = w.take_ack_latencies();
        w.close().await.with_context(|| format!("closing {path}"))?;
        drop(raw);
        if let Some(p) = parallel {
            // The last reference: joins the workers and removes their files.
            blocking(move || {
                drop(p);
                Ok(())
            })
            .await?;
        }
        std::fs::remove_file(&raw_path)
            .with_context(|| format!("removing {}", raw_path.display()))?;
        Ok(out)
    });
    task.await.context("benchmark task failed")?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_is_not_constant() {
        let s = source(4096);
        assert_eq!(s.len(), 4096);
        assert!(s.windows(2).any(|w| w[0] != w[1]));
    }
}
