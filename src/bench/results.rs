//! What a run measured, and the arithmetic on it (ratios, percentiles, CPU use).

use super::{target_ratio, SMALL_TARGET};
use serde::Serialize;
use std::time::Duration;

/// Everything one run measured (the `--json` document).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The command line that produced it.
    pub command: String,
    pub size: u64,
    pub packet: u64,
    pub window: u64,
    pub chunk_size: Option<u64>,
    pub small_writes: usize,
    pub cores: usize,
    /// Where the cluster and the raw files lived.
    pub dir: String,
    pub results: Vec<ConfigResult>,
}

/// One (replication, engine) configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigResult {
    pub replication: u8,
    /// `uring`, `threads`, `auto`, or `external` (a running cluster); with
    /// [`TLS_SUFFIX`](super::TLS_SUFFIX) when the cluster served TLS.
    pub engine: String,
    /// Whether every connection was TLS (`--tls`).
    pub tls: bool,
    pub throughput: Throughput,
    /// Absent when `--small-writes 0`.
    pub small: Option<SmallWrites>,
    /// With `--pattern overwrite`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overwrite: Option<crate::bench_patterns::Overwrite>,
    /// With `--pattern random` (and small writes to compare with).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random: Option<crate::bench_patterns::Random>,
}

/// Bulk write through the pipeline next to the raw limit.
#[derive(Clone, Debug, Serialize)]
pub struct Throughput {
    pub bytes: u64,
    pub seconds: f64,
    pub mb_per_s: f64,
    pub packets_sampled: usize,
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    /// `bytes × replication`.
    pub raw_bytes: u64,
    /// The raw runs (before and after the pipeline run), seconds each.
    pub raw_runs: Vec<f64>,
    /// Mean of `raw_runs`.
    pub raw_seconds: f64,
    /// Raw bandwidth of the disk (`raw_bytes / raw_seconds`).
    pub raw_mb_per_s: f64,
    /// The physical limit for this replication: raw bandwidth / replication.
    pub limit_mb_per_s: f64,
    /// `raw_seconds / seconds`: fraction of the limit reached.
    pub ratio: f64,
    pub target: f64,
    pub met: bool,
    /// CPU time this process (client and embedded cluster) spent during the
    /// pipeline run, per GiB written; absent where `/proc` is not readable.
    pub cpu_seconds_per_gib: Option<f64>,
    /// Share of the machine's CPU time used by *other* processes during the pipeline
    /// run (0..1): a benchmark on a shared machine is only as quiet as this says.
    pub other_load: Option<f64>,
    /// The stricter baseline: the same raw write, but starting writeback every
    /// `write_behind` bytes as the chunkserver does (one run, after the others).
    pub raw_wb_seconds: Option<f64>,
    pub raw_wb_mb_per_s: Option<f64>,
    /// `raw_wb_seconds / seconds`.
    pub ratio_wb: Option<f64>,
}

/// Small appends with hsync next to raw small writes with fdatasync.
#[derive(Clone, Debug, Serialize)]
pub struct SmallWrites {
    pub count: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub raw_p50_us: f64,
    pub raw_p99_us: f64,
    /// `p50 / raw p50`.
    pub ratio: f64,
    pub target: f64,
    pub met: bool,
    /// For replication above 1: `replication` raw files appended and fdatasynced side
    /// by side per round (what that many replicas on one disk must do per hsync).
    pub raw_parallel_p50_us: Option<f64>,
    pub raw_parallel_p99_us: Option<f64>,
    /// `p50 / raw_parallel p50`.
    pub ratio_parallel: Option<f64>,
    /// `ratio_parallel` within the target: within 1.5× of the same-disk limit for that
    /// many copies (`None` for replication 1, where `met` is that verdict).
    pub met_parallel: Option<bool>,
    /// Median ack latency of the packets as the writer's streamer saw it (the rest of
    /// `p50` is the hop between the application's task and the streamer).
    pub ack_p50_us: f64,
}

/// The `p`-quantile (0..=1) of `samples` by nearest rank; zero when empty.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = (p.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(super) fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e6
    } else {
        0.0
    }
}

impl Throughput {
    /// Derives rates, the limit and the ratio from what was timed.
    pub fn new(
        replication: u8,
        bytes: u64,
        elapsed: Duration,
        acks: &[Duration],
        raw_runs: &[Duration],
    ) -> Self {
        let seconds = elapsed.as_secs_f64();
        let raw_bytes = bytes * u64::from(replication.max(1));
        let raw_seconds = if raw_runs.is_empty() {
            0.0
        } else {
            raw_runs.iter().map(Duration::as_secs_f64).sum::<f64>() / raw_runs.len() as f64
        };
        let raw_mb = mb_per_s(raw_bytes, raw_seconds);
        let ratio = if seconds > 0.0 {
            raw_seconds / seconds
        } else {
            0.0
        };
        let target = target_ratio(replication);
        Self {
            bytes,
            seconds,
            mb_per_s: mb_per_s(bytes, seconds),
            packets_sampled: acks.len(),
            ack_p50_us: us(percentile(acks, 0.50)),
            ack_p99_us: us(percentile(acks, 0.99)),
            raw_bytes,
            raw_runs: raw_runs.iter().map(Duration::as_secs_f64).collect(),
            raw_seconds,
            raw_mb_per_s: raw_mb,
            limit_mb_per_s: raw_mb / f64::from(replication.max(1)),
            ratio,
            target,
            met: ratio >= target,
            cpu_seconds_per_gib: None,
            other_load: None,
            raw_wb_seconds: None,
            raw_wb_mb_per_s: None,
            ratio_wb: None,
        }
    }

    /// Adds the stricter (write-behind) raw baseline.
    pub fn with_write_behind_baseline(mut self, raw: Duration) -> Self {
        let secs = raw.as_secs_f64();
        self.raw_wb_seconds = Some(secs);
        self.raw_wb_mb_per_s = Some(mb_per_s(self.raw_bytes, secs));
        if self.seconds > 0.0 {
            self.ratio_wb = Some(secs / self.seconds);
        }
        self
    }

    /// Adds the CPU accounting of the pipeline run.
    pub fn with_cpu(mut self, cpu: Option<CpuUse>) -> Self {
        if let Some(c) = cpu {
            let gib = self.bytes as f64 / f64::from(1u32 << 30);
            if gib > 0.0 {
                self.cpu_seconds_per_gib = Some(c.own_seconds / gib);
            }
            self.other_load = Some(c.other_load);
        }
        self
    }
}

/// CPU time over an interval, from `/proc`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuUse {
    /// This process's user + system time.
    pub own_seconds: f64,
    /// Busy time of everything else, as a share of all cores' time (0..1).
    pub other_load: f64,
}

/// A reading of `/proc/self/stat` and `/proc/stat` (clock ticks).
#[derive(Clone, Copy, Debug)]
pub struct CpuSnapshot {
    own: u64,
    busy: u64,
    total: u64,
}

/// Linux's `USER_HZ`, the unit of `/proc` CPU times (100 on every Linux ABI).
pub(super) const TICKS_PER_SECOND: f64 = 100.0;

impl CpuSnapshot {
    /// Reads the counters; `None` when `/proc` is unavailable or unexpected.
    pub fn now() -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/stat").ok()?;
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let (own, (busy, total)) = (parse_self_stat(&own)?, parse_proc_stat(&stat)?);
        Some(Self { own, busy, total })
    }

    /// What was used between `self` and `later`.
    pub fn until(&self, later: &Self) -> Option<CpuUse> {
        let own = later.own.checked_sub(self.own)?;
        let busy = later.busy.checked_sub(self.busy)?;
        let total = later.total.checked_sub(self.total)?;
        if total == 0 {
            return None;
        }
        Some(CpuUse {
            own_seconds: own as f64 / TICKS_PER_SECOND,
            other_load: busy.saturating_sub(own) as f64 / total as f64,
        })
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line.
pub fn parse_self_stat(text: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// (busy, total) ticks of all CPUs from the first line of `/proc/stat`; idle and
/// iowait are not busy.
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?;
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields.map(|f| f.parse().ok()).collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is
    // already counted in user, so only the first eight are summed.
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((total - idle.min(total), total))
}

impl SmallWrites {
    /// Percentiles and the verdict from the latency series. The verdict compares with
    /// one raw write + fdatasync, as the target is stated.
    pub fn new(pipeline: &[Duration], raw: &[Duration], raw_parallel: Option<&[Duration]>) -> Self {
        let p50 = us(percentile(pipeline, 0.50));
        let raw_p50 = us(percentile(raw, 0.50));
        let ratio = if raw_p50 > 0.0 { p50 / raw_p50 } else { 0.0 };
        let par_p50 = raw_parallel.map(|r| us(percentile(r, 0.50)));
        Self {
            count: pipeline.len(),
            p50_us: p50,
            p99_us: us(percentile(pipeline, 0.99)),
            raw_p50_us: raw_p50,
            raw_p99_us: us(percentile(raw, 0.99)),
            ratio,
            target: SMALL_TARGET,
            met: raw_p50 > 0.0 && ratio <= SMALL_TARGET,
            raw_parallel_p50_us: par_p50,
            raw_parallel_p99_us: raw_parallel.map(|r| us(percentile(r, 0.99))),
            ratio_parallel: par_p50.filter(|p| *p > 0.0).map(|p| p50 / p),
            met_parallel: par_p50.map(|p| p > 0.0 && p50 / p <= SMALL_TARGET),
            ack_p50_us: 0.0,
        }
    }

    /// Adds the writer's ack latencies.
    pub fn with_acks(mut self, acks: &[Duration]) -> Self {
        self.ack_p50_us = us(percentile(acks, 0.50));
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&s, 0.5), ms(50));
        assert_eq!(percentile(&s, 0.99), ms(99));
        assert_eq!(percentile(&s, 1.0), ms(100));
        assert_eq!(percentile(&s, 0.0), ms(1));
        assert_eq!(percentile(&[ms(7)], 0.99), ms(7));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn ratio_compares_with_raw_divided_by_replication() {
        // Raw writes 3 GB in 10 s (300 MB/s); the pipeline writes 1 GB in 12.5 s.
        let t = Throughput::new(
            3,
            1_000_000_000,
            Duration::from_millis(12_500),
            &[],
            &[ms(9_000), ms(11_000)],
        );
        assert_eq!(t.raw_bytes, 3_000_000_000);
        assert!((t.raw_mb_per_s - 300.0).abs() < 1e-6);
        assert!((t.limit_mb_per_s - 100.0).abs() < 1e-6);
        assert!((t.mb_per_s - 80.0).abs() < 1e-6);
        assert!((t.ratio - 0.8).abs() < 1e-9);
        assert!(t.met);
        let wb = t.clone().with_write_behind_baseline(ms(10_000));
        assert!((wb.ratio_wb.expect("wb ratio") - 0.8).abs() < 1e-9);
        assert!((wb.raw_wb_mb_per_s.expect("wb rate") - 300.0).abs() < 1e-6);
        let t1 = Throughput::new(1, 1_000_000_000, ms(2_000), &[], &[ms(1_600)]);
        assert!((t1.ratio - 0.8).abs() < 1e-9);
        assert!(!t1.met, "replication 1 needs 85%");
    }

    #[test]
    fn small_write_verdict() {
        let s = SmallWrites::new(
            &[ms(3), ms(3), ms(4)],
            &[ms(2), ms(2), ms(9)],
            Some(&[ms(6)]),
        );
        assert!((s.ratio - 1.5).abs() < 1e-9);
        assert!(s.met);
        assert!((s.ratio_parallel.expect("parallel") - 0.5).abs() < 1e-9);
        assert_eq!(s.met_parallel, Some(true));
        // Missed against one raw write, met against the same-disk limit for r copies.
        let s = SmallWrites::new(&[ms(5)], &[ms(2)], Some(&[ms(4)]));
        assert!(!s.met);
        assert_eq!(s.met_parallel, Some(true));
        let s = SmallWrites::new(&[ms(7)], &[ms(2)], Some(&[ms(4)]));
        assert_eq!(s.met_parallel, Some(false));
        let s = SmallWrites::new(&[ms(4)], &[ms(2)], None);
        assert!(!s.met);
        assert_eq!(s.met_parallel, None);
        assert!(!SmallWrites::new(&[ms(1)], &[], None).met);
    }

    #[test]
    fn proc_stat_parsing() {
        let own = "1234 (tokio (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 7 0";
        assert_eq!(parse_self_stat(own), Some(300));
        assert_eq!(parse_self_stat("garbage"), None);
        let stat = "cpu  100 5 50 800 40 1 4 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(parse_proc_stat(stat), Some((160, 1000)));
        assert_eq!(parse_proc_stat("intr 1 2 3"), None);
        let a = CpuSnapshot {
            own: 100,
            busy: 1000,
            total: 4000,
        };
        let b = CpuSnapshot {
            own: 300,
            busy: 2000,
            total: 6000,
        };
        let used = a.until(&b).expect("forward");
        assert!((used.own_seconds - 2.0).abs() < 1e-9);
        assert!((used.other_load - 0.4).abs() < 1e-9);
        assert!(b.until(&a).is_none());
    }
}
