//! How a phase is measured: calls spread over client tasks, each timed into a shared
//! histogram; work timed while probe requests measure how long it stalls the master.

use super::report::{OpResult, StallResult, TARGET_STALL_MS};
use super::stats::{CpuSplit, Histogram};
use super::workload::{file_path, spread, Ctx};
use anyhow::Result;
use stampfs_proto::Stat;
use std::future::Future;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Latencies and errors of one operation.
#[derive(Default)]
pub struct OpStats {
    pub hist: Histogram,
    pub errors: AtomicU64,
    pub first_error: Mutex<Option<String>>,
}

impl OpStats {
    pub fn record<T>(&self, took: Duration, r: &Result<T>) {
        match r {
            Ok(_) => self.hist.record(took),
            Err(e) => {
                if self.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    if let Ok(mut f) = self.first_error.lock() {
                        *f = Some(format!("{e:#}"));
                    }
                }
            }
        }
    }

    pub fn result(&self, name: &str, seconds: f64, cpu: CpuSplit) -> OpResult {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        let count = self.hist.count();
        OpResult {
            name: name.to_string(),
            count,
            errors: self.errors.load(Ordering::Relaxed),
            first_error: self.first_error.lock().ok().and_then(|f| f.clone()),
            seconds,
            ops_per_s: if seconds > 0.0 {
                count as f64 / seconds
            } else {
                0.0
            },
            mean_us: us(self.hist.mean()),
            p50_us: us(self.hist.quantile(0.5)),
            p99_us: us(self.hist.quantile(0.99)),
            max_us: us(self.hist.max()),
            target_ops_per_s: None,
            met: None,
            note: None,
            cpu,
        }
    }
}

/// Times `f` into `stats`.
pub async fn timed<T>(stats: &OpStats, f: impl Future<Output = Result<T>>) -> Result<T> {
    let t = Instant::now();
    let r = f.await;
    stats.record(t.elapsed(), &r);
    r
}

/// Runs `op(0..total)` on `threads` tasks (each takes the next index), returning the
/// wall time.
pub async fn run_ops<F, Fut>(threads: usize, total: u64, op: F) -> Duration
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    op(i).await;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    start.elapsed()
}

/// One measured phase: `total` calls of `op` on `threads` tasks, each timed.
pub async fn measure<F, Fut, T>(
    name: &str,
    threads: usize,
    total: u64,
    progress: &Progress,
    op: F,
) -> OpResult
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    progress.phase(name, total);
    let stats = Arc::new(OpStats::default());
    let s = stats.clone();
    let bar = progress.bar.clone();
    let op = Arc::new(op);
    let cpu = CpuSplit::now();
    let took = run_ops(threads, total, move |i| {
        let (s, op, bar) = (s.clone(), op.clone(), bar.clone());
        async move {
            let _ = timed(&s, op(i)).await;
            bar.inc(1);
        }
    })
    .await;
    stats.result(name, took.as_secs_f64(), CpuSplit::now().since(&cpu))
}

/// Runs `work` while `threads` tasks stat random built files in a loop; returns what
/// `work` returned, how long it took, and the stats' latencies meanwhile.
pub async fn probed<T>(
    during: &str,
    ctx: &Ctx,
    work: impl Future<Output = Result<T>>,
) -> Result<(T, StallResult)> {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(OpStats::default());
    let probes: Vec<_> = (0..ctx.threads.clamp(1, 4))
        .map(|t| {
            let (stop, stats, driver) = (stop.clone(), stats.clone(), ctx.driver.clone());
            let files = ctx.files;
            let fpd = ctx.files_per_dir;
            tokio::spawn(async move {
                let mut i = t as u64;
                while !stop.load(Ordering::Relaxed) {
                    let path = file_path(spread(i, files), fpd);
                    let _ = timed(&stats, driver.call(Stat { path, caller: None })).await;
                    i += 7;
                    // Leave the CPU to the work being probed between requests.
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let t = Instant::now();
    let r = work.await;
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    for p in probes {
        let _ = p.await;
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let max_us = us(stats.hist.max());
    Ok((
        r?,
        StallResult {
            during: during.to_string(),
            seconds: took.as_secs_f64(),
            requests: stats.hist.count(),
            p50_us: us(stats.hist.quantile(0.5)),
            p99_us: us(stats.hist.quantile(0.99)),
            max_us,
            target_max_ms: TARGET_STALL_MS,
            met: max_us <= TARGET_STALL_MS * 1000.0,
        },
    ))
}

/// A progress bar on a terminal (stderr), hidden otherwise.
pub struct Progress {
    pub bar: indicatif::ProgressBar,
    pub start: Instant,
}

impl Progress {
    pub fn new() -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let b = indicatif::ProgressBar::new(0);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {msg:24} {wide_bar} {pos}/{len} ({per_sec})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        Self {
            bar,
            start: Instant::now(),
        }
    }

    pub fn phase(&self, name: &str, total: u64) {
        if self.bar.is_hidden() {
            // Long runs off a terminal still say where they are.
            eprintln!(
                "[{:>7.1} s] {name} ({total})",
                self.start.elapsed().as_secs_f64()
            );
        }
        self.bar.set_message(name.to_string());
        self.bar.set_length(total);
        self.bar.set_position(0);
    }
}
