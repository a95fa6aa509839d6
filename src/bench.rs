//! `stampfs bench pipeline`: write throughput and latency through the full pipeline,
//! measured next to the physical limit of the same disk in the same run.
//!
//! For every (replication, engine) configuration:
//!
//! 1. **Raw limit.** `size × replication` bytes written sequentially with plain
//!    `pwrite` (1 MiB buffers) into one file and `fdatasync`ed at the end: what the
//!    disk can absorb when every byte is written `replication` times. It is measured
//!    right before *and* right after the pipeline run and the two are averaged, so a
//!    disk whose speed drifts does not flatter or punish either side. The raw file is
//!    removed and the file system synced (`syncfs`) outside the timed part, so the
//!    journal commit and discards of a removal never land in the next measurement.
//! 2. **Pipeline.** `size` bytes through a [`FileWriter`](stampfs_client::FileWriter)
//!    with the given packet size and window, closed after an `hsync`; timed from
//!    `create` to the end of `close`, in a task of the runtime as an application's
//!    writer would run. Per-packet ack latency (first send to the ack of the whole
//!    pipeline) comes from the writer's optional recorder. The process's CPU time and
//!    the CPU used by everything else on the machine are read from `/proc` around it.
//!    The file stays until the cluster is removed (deleting it would put its
//!    discards into the next measurement).
//! 3. **Small writes.** `N ×` (4 KiB append + `hsync`) interleaved one for one with
//!    `N ×` (4 KiB `pwrite` append + `fdatasync`) of a raw file on the same disk, and
//!    for replication `r > 1` with `N` rounds of `r` raw files appended and
//!    fdatasynced side by side; one untimed warm-up each.
//!
//! 4. **Writes at any offset** (`--pattern overwrite,random`, [`crate::bench_patterns`]):
//!    the appended file written again from offset 0, and 4 KiB random writes with
//!    hsync, each next to its append counterpart of the same configuration.
//!
//! Ratio = raw seconds / pipeline seconds: the fraction of the disk's limit for that
//! replication the pipeline reaches. MB are 10^6 bytes.
//!
//! The embedded cluster (one per engine, `max(replication)` chunkservers) and the raw
//! files live in a temporary directory under `--dir` (default: the current directory,
//! so the disk measured is the one you are on); it is removed at the end. Peak disk
//! use is about `size × (sum of replications + max replication)`.

use crate::cli::BenchPipelineArgs;
use crate::cluster::LocalCluster;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use stampfs_chunkserver::store::DEFAULT_WRITE_BEHIND;
use stampfs_chunkserver::IoEngineKind;
use stampfs_client::{Client, ClientConfig, CreateOptions};
use stampfs_proto::units::format_size;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Bytes of one small write.
pub const SMALL_WRITE: usize = 4096;
/// Buffer of the raw sequential writer and of the benchmark's data source.
const RAW_BUF: usize = 1 << 20;
/// Small-write target: pipeline hsync p50 at most this many times the raw p50.
pub const SMALL_TARGET: f64 = 1.5;

/// The throughput target for `replication`: the fraction of the raw limit to reach.
pub fn target_ratio(replication: u8) -> f64 {
    if replication <= 1 {
        0.85
    } else {
        0.80
    }
}

/// Runs the write-pipeline benchmark.
pub async fn run(args: BenchPipelineArgs) -> u8 {
    match run_inner(args).await {
        Ok(()) => crate::EXIT_OK,
        Err(e) => {
            eprintln!("stampfs bench pipeline: {e:#}");
            crate::EXIT_ERROR
        }
    }
}

// ---------------------------------------------------------------- results

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
    /// `uring`, `threads`, `auto`, or `external` (a running cluster).
    pub engine: String,
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

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
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
const TICKS_PER_SECOND: f64 = 100.0;

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

// ---------------------------------------------------------------- presentation

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

/// Renders rows as an aligned table (first column left-aligned, the rest right).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(cols) {
            width[i] = width[i].max(cell.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut out = String::new();
        for (i, cell) in cells.enumerate() {
            let pad = width[i].saturating_sub(cell.chars().count());
            if i > 0 {
                out.push_str("  ");
            }
            if i == 0 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(&mut header.iter().copied());
    out.push('\n');
    out.push_str(&"-".repeat(width.iter().sum::<usize>() + 2 * cols.saturating_sub(1)));
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
        out.push('\n');
    }
    out
}

fn config_name(r: &ConfigResult) -> String {
    format!("r{} {}", r.replication, r.engine)
}

/// The terminal report: a throughput table, a small-write table and the targets.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "write pipeline: {} per configuration, packet {}, window {}, chunk {}, {} core(s)",
        format_size(report.size),
        format_size(report.packet),
        format_size(report.window),
        report
            .chunk_size
            .map_or_else(|| "master default".to_string(), format_size),
        report.cores,
    );
    let _ = writeln!(out, "disk: {}\n", report.dir);
    let rows: Vec<Vec<String>> = report
        .results
        .iter()
        .map(|r| {
            let t = &r.throughput;
            vec![
                config_name(r),
                format!("{:.0}", t.mb_per_s),
                fmt_us(t.ack_p50_us),
                fmt_us(t.ack_p99_us),
                format!("{:.0}", t.raw_mb_per_s),
                format!("{:.0}", t.limit_mb_per_s),
                format!("{:.0}%", t.ratio * 100.0),
                format!("≥{:.0}%", t.target * 100.0),
                verdict(t.met).to_string(),
                t.cpu_seconds_per_gib
                    .map_or_else(|| "-".into(), |c| format!("{c:.2}")),
                t.other_load
                    .map_or_else(|| "-".into(), |o| format!("{:.0}%", o * 100.0)),
                t.raw_wb_mb_per_s
                    .map_or_else(|| "-".into(), |v| format!("{v:.0}")),
                t.ratio_wb
                    .map_or_else(|| "-".into(), |v| format!("{:.0}%", v * 100.0)),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "config",
            "MB/s",
            "ack p50",
            "ack p99",
            "raw MB/s",
            "limit",
            "ratio",
            "target",
            "",
            "cpu s/GiB",
            "others",
            "raw+wb",
            "ratio wb",
        ],
        &rows,
    ));
    let small: Vec<Vec<String>> = report
        .results
        .iter()
        .filter_map(|r| {
            r.small.as_ref().map(|s| {
                vec![
                    config_name(r),
                    s.count.to_string(),
                    fmt_us(s.p50_us),
                    fmt_us(s.p99_us),
                    fmt_us(s.ack_p50_us),
                    fmt_us(s.raw_p50_us),
                    fmt_us(s.raw_p99_us),
                    format!("{:.2}×", s.ratio),
                    format!("≤{:.1}×", s.target),
                    verdict(s.met).to_string(),
                    s.raw_parallel_p50_us.map_or_else(|| "-".into(), fmt_us),
                    s.ratio_parallel
                        .map_or_else(|| "-".into(), |r| format!("{r:.2}×")),
                    s.met_parallel
                        .map_or_else(|| "-".into(), |m| verdict(m).to_string()),
                ]
            })
        })
        .collect();
    if !small.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "4 KiB + hsync",
                "n",
                "p50",
                "p99",
                "ack p50",
                "raw p50",
                "raw p99",
                "p50/raw",
                "target",
                "",
                "raw×r p50",
                "p50/raw×r",
                "≤1.5×",
            ],
            &small,
        ));
    }
    let _ = write!(
        out,
        "\nlimit = raw sequential pwrite+fdatasync bandwidth of size×replication bytes on the same disk, \
         divided by the replication; ratio = pipeline / limit. raw p50/p99: 4 KiB pwrite + fdatasync.\n\
         cpu s/GiB = CPU time of this process (client + embedded cluster) per GiB written; \
         others = CPU used by other processes (and stolen by the hypervisor) during the pipeline run, as a share of the machine.\n\
         raw+wb = the same raw write starting writeback every {} as the chunkserver does (a stricter \
         baseline than the target's); ratio wb = pipeline / (raw+wb / replication).\n\
         raw×r: r raw files each appended 4 KiB and fdatasynced side by side per round \
         (what r replicas on one disk do per hsync, the same-disk limit for r copies); \
         the first verdict judges against one raw write, the second against that limit.\n",
        format_size(DEFAULT_WRITE_BEHIND)
    );
    let patterns: Vec<_> = report
        .results
        .iter()
        .filter(|r| r.overwrite.is_some() || r.random.is_some())
        .map(|r| (config_name(r), r.overwrite.as_ref(), r.random.as_ref()))
        .collect();
    if !patterns.is_empty() {
        out.push('\n');
        out.push_str(&crate::bench_patterns::render(&patterns));
    }
    out
}

/// The stricter baseline's limit for a configuration, MB/s.
fn wb_limit(r: &ConfigResult) -> Option<f64> {
    r.throughput
        .raw_wb_mb_per_s
        .map(|v| v / f64::from(r.replication.max(1)))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A hand-written SVG: left, pipeline throughput next to the raw limit per
/// configuration; right, the ratio with its target marked.
pub fn render_svg(report: &Report) -> String {
    const W: f64 = 900.0;
    const H: f64 = 420.0;
    const TOP: f64 = 60.0;
    const BOTTOM: f64 = 340.0;
    let n = report.results.len().max(1) as f64;
    let plot_h = BOTTOM - TOP;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        xml_escape(&format!(
            "stampfs write pipeline: {} per configuration, packet {}, window {}",
            format_size(report.size),
            format_size(report.packet),
            format_size(report.window)
        ))
    );
    // Left panel: MB/s.
    let (lx, lw) = (60.0, 470.0);
    let max_mb = report
        .results
        .iter()
        .flat_map(|r| {
            [
                r.throughput.mb_per_s,
                r.throughput.limit_mb_per_s,
                wb_limit(r).unwrap_or(0.0),
            ]
        })
        .fold(1.0f64, f64::max)
        * 1.15;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="48" text-anchor="middle">throughput (MB/s): pipeline vs raw-disk limit</text>"#,
        lx + lw / 2.0
    );
    for i in 0..=4 {
        let v = max_mb * f64::from(i) / 4.0;
        let y = BOTTOM - plot_h * f64::from(i) / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{lx}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            lx + lw,
            lx - 4.0,
            y + 4.0
        );
    }
    let group = lw / n;
    let bar = (group * 0.27).min(45.0);
    for (i, r) in report.results.iter().enumerate() {
        let gx = lx + group * i as f64 + group / 2.0;
        let bars = [
            Some((r.throughput.mb_per_s, "#3b7dd8")),
            Some((r.throughput.limit_mb_per_s, "#aaaaaa")),
            wb_limit(r).map(|v| (v, "#dddddd")),
        ];
        for (k, (v, color)) in bars
            .into_iter()
            .enumerate()
            .filter_map(|(k, b)| Some((k, b?)))
        {
            let h = plot_h * v / max_mb;
            let x = gx - 1.5 * bar + bar * k as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{bar:.1}" height="{h:.1}" fill="{color}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{v:.0}</text>"#,
                BOTTOM - h,
                x + bar / 2.0,
                BOTTOM - h - 3.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            BOTTOM + 16.0,
            xml_escape(&config_name(r))
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{lx}" y="{}" width="10" height="10" fill="#3b7dd8"/><text x="{}" y="{}">pipeline</text><rect x="{}" y="{}" width="10" height="10" fill="#aaaaaa"/><text x="{}" y="{}">raw limit (raw / replication)</text><rect x="{}" y="{}" width="10" height="10" fill="#dddddd"/><text x="{}" y="{}">raw with write-behind / replication</text>"##,
        BOTTOM + 32.0,
        lx + 14.0,
        BOTTOM + 41.0,
        lx + 90.0,
        BOTTOM + 32.0,
        lx + 104.0,
        BOTTOM + 41.0,
        lx + 290.0,
        BOTTOM + 32.0,
        lx + 304.0,
        BOTTOM + 41.0
    );
    // Right panel: ratio.
    let (rx, rw) = (600.0, 270.0);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="48" text-anchor="middle">ratio to the limit (target marked)</text>"#,
        rx + rw / 2.0
    );
    let max_ratio = report
        .results
        .iter()
        .map(|r| r.throughput.ratio)
        .fold(1.0f64, f64::max)
        * 1.1;
    for pct in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let y = BOTTOM - plot_h * pct / max_ratio;
        let _ = writeln!(
            s,
            r##"<line x1="{rx}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{:.0}%</text>"##,
            rx + rw,
            rx - 4.0,
            y + 4.0,
            pct * 100.0
        );
    }
    let group = rw / n;
    let bar = (group * 0.5).min(50.0);
    for (i, r) in report.results.iter().enumerate() {
        let t = &r.throughput;
        let gx = rx + group * i as f64 + group / 2.0;
        let h = plot_h * t.ratio / max_ratio;
        let color = if t.met { "#2e9e5b" } else { "#d8613b" };
        let ty = BOTTOM - plot_h * t.target / max_ratio;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{bar:.1}" height="{h:.1}" fill="{color}"/><line x1="{:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#000" stroke-dasharray="4 2"/><text x="{gx:.1}" y="{:.1}" text-anchor="middle" font-size="10">{:.0}%</text><text x="{gx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            gx - bar / 2.0,
            BOTTOM - h,
            gx - bar * 0.8,
            gx + bar * 0.8,
            BOTTOM - h - 3.0,
            t.ratio * 100.0,
            BOTTOM + 16.0,
            xml_escape(&config_name(r))
        );
    }
    s.push_str("</svg>\n");
    s
}

// ---------------------------------------------------------------- measuring

/// A deterministic, incompressible-looking buffer (xorshift).
fn source(len: usize) -> Vec<u8> {
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
fn raw_sequential(
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
fn settle(dir: &Path) {
    match std::fs::File::open(dir) {
        Ok(d) => {
            if let Err(e) = rustix::fs::syncfs(&d) {
                tracing::debug!(error = %e, "syncfs failed");
            }
        }
        Err(e) => tracing::debug!(error = %e, dir = %dir.display(), "cannot open for syncfs"),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .context("benchmark thread failed")?
}

/// Writes `size` bytes to `path` and closes after an hsync, as a task of the runtime
/// (where applications run writers). Returns the time from create to the end of
/// close and the ack latencies.
async fn pipeline_write(
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
struct ParallelRaw {
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
struct SmallSeries {
    pipeline: Vec<Duration>,
    raw: Vec<Duration>,
    /// `replication` raw files side by side (absent for replication 1).
    raw_parallel: Option<Vec<Duration>>,
    /// The writer's own view: each packet's send to its ack from the whole pipeline.
    acks: Vec<Duration>,
}

/// `count` × (4 KiB append + hsync) through the pipeline, interleaved one for one
/// with `count` × (4 KiB `pwrite` append + `fdatasync`) of a raw file in `dir` (and,
/// for replication above 1, with rounds of [`ParallelRaw`]), so every series sees the
/// same machine: on a VM, how busy the CPUs are changes how soon a sleeping thread
/// learns that its flush is done. One untimed warm-up of each first. The pipeline
/// side runs as a task of the runtime, as an application's writer would.
async fn small_writes(
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

/// Where the benchmark's files go: an embedded cluster with one engine, or a running
/// cluster.
#[derive(Clone, Copy, Debug)]
enum Target {
    Embedded(IoEngineKind),
    External,
}

impl Target {
    fn label(self) -> String {
        match self {
            Target::Embedded(IoEngineKind::Uring) => "uring".into(),
            Target::Embedded(IoEngineKind::Threads) => "threads".into(),
            Target::Embedded(IoEngineKind::Auto) => "auto".into(),
            Target::External => "external".into(),
        }
    }
}

fn parse_engine(name: &str) -> Result<IoEngineKind> {
    match name.trim().to_ascii_lowercase().as_str() {
        "uring" | "io_uring" | "io-uring" => Ok(IoEngineKind::Uring),
        "threads" => Ok(IoEngineKind::Threads),
        "auto" => Ok(IoEngineKind::Auto),
        other => bail!("unknown engine {other:?} (use uring, threads or auto)"),
    }
}

fn validate(args: &BenchPipelineArgs) -> Result<()> {
    if args.size == 0 {
        bail!("--size must be greater than zero");
    }
    if args.packet == 0 || args.packet > stampfs_proto::MAX_DATA_LEN as u64 {
        bail!(
            "--packet must be between 1 byte and {}",
            format_size(stampfs_proto::MAX_DATA_LEN as u64)
        );
    }
    if args.window < args.packet {
        bail!("--window must hold at least one packet");
    }
    if args.replication.is_empty() || args.replication.iter().any(|&r| r == 0 || r > 16) {
        bail!("--replication takes factors between 1 and 16");
    }
    let patterns = crate::bench_patterns::Patterns::parse(&args.pattern)?;
    if patterns.overwrite && args.chunk_size.is_none_or(|c| args.size >= c) {
        bail!(
            "--pattern overwrite needs --size below --chunk-size (set both): only a file's \
             last chunk, and not a full one, takes writes below its end so far"
        );
    }
    if patterns.random && args.small_writes == 0 {
        bail!("--pattern random measures --small-writes writes: set it above 0");
    }
    Ok(())
}

async fn run_inner(args: BenchPipelineArgs) -> Result<()> {
    validate(&args)?;
    let targets: Vec<Target> = match &args.master {
        Some(_) => vec![Target::External],
        None => args
            .engine
            .iter()
            .map(|e| parse_engine(e).map(Target::Embedded))
            .collect::<Result<_>>()?,
    };
    let base = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("finding the current directory")?,
    };
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".stampfs-bench-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a temporary directory in {}", base.display()))?;
    let mut replication = args.replication.clone();
    replication.dedup();
    let per_config: u64 = replication
        .iter()
        .map(|&r| {
            args.size + 3 * args.size * u64::from(r) + 2 * (args.small_writes as u64 + 1) * 4096
        })
        .sum();
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(per_config * targets.len() as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let client_config = ClientConfig {
        packet_size: args.packet as usize,
        window: args.window as usize,
        ..ClientConfig::default()
    };
    let src = Arc::new(source(RAW_BUF));
    let mut results = Vec::new();
    for target in targets {
        let label = target.label();
        let cluster = match target {
            Target::Embedded(kind) => {
                bar.set_message(format!("starting a cluster ({label})"));
                let max_r = replication.iter().copied().max().unwrap_or(1);
                let dir = work.path().join(format!("cluster-{label}"));
                Some(
                    LocalCluster::builder(&dir)
                        .chunkservers(usize::from(max_r))
                        .chunkserver_config(move |c| c.io_engine = kind)
                        .start()
                        .await
                        .with_context(|| format!("starting an embedded cluster ({label})"))?,
                )
            }
            Target::External => None,
        };
        let master = match (&cluster, &args.master) {
            (Some(c), _) => c.master_addr(),
            (None, Some(m)) => m.clone(),
            (None, None) => bail!("no cluster to measure"),
        };
        let client = match &cluster {
            Some(c) => c.client_with(client_config.clone()).await?,
            None => Client::connect_with(&master, client_config.clone())
                .await
                .with_context(|| format!("connecting to the master at {master}"))?,
        };
        let outcome = measure_target(
            &args,
            &replication,
            &client,
            &label,
            work.path(),
            &src,
            &bar,
        )
        .await;
        if let Some(c) = cluster {
            c.shutdown().await.context("stopping the cluster")?;
            let dir = work.path().join(format!("cluster-{label}"));
            let _ = std::fs::remove_dir_all(&dir);
            settle(work.path());
        }
        results.extend(outcome?);
    }
    bar.finish_and_clear();
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        size: args.size,
        packet: args.packet,
        window: args.window,
        chunk_size: args.chunk_size,
        small_writes: args.small_writes,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        dir: base.display().to_string(),
        results,
    };
    print!("{}", render_text(&report));
    if let Some(path) = &args.json {
        write_output(path, &serde_json::to_string_pretty(&report)?)?;
    }
    if let Some(path) = &args.plot {
        write_output(path, &render_svg(&report))?;
    }
    work.close().context("removing the benchmark directory")?;
    Ok(())
}

fn write_output(path: &PathBuf, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

async fn measure_target(
    args: &BenchPipelineArgs,
    replication: &[u8],
    client: &Client,
    label: &str,
    work: &Path,
    src: &Arc<Vec<u8>>,
    bar: &ProgressBar,
) -> Result<Vec<ConfigResult>> {
    let remote_dir = format!("/stampfs-bench-{}", std::process::id());
    client
        .mkdir(&remote_dir, true)
        .await
        .with_context(|| format!("mkdir {remote_dir}"))?;
    let mut out = Vec::new();
    for &r in replication {
        let raw_bytes = args.size * u64::from(r);
        let mut raw_runs = Vec::new();
        let run_raw = |what: &'static str, write_behind: u64| {
            bar.set_message(format!("r{r} {label}: raw disk {what}"));
            let (dir, src, bar) = (work.to_path_buf(), src.clone(), bar.clone());
            blocking(move || raw_sequential(&dir, raw_bytes, &src, &bar, write_behind))
        };
        raw_runs.push(run_raw("(before)", 0).await?);
        bar.set_message(format!("r{r} {label}: pipeline"));
        let opts = CreateOptions {
            replication: Some(r),
            chunk_size: args.chunk_size,
            overwrite: true,
            attr: None,
        };
        let path = format!("{remote_dir}/r{r}-{label}");
        let cpu_before = CpuSnapshot::now();
        let (elapsed, acks) = pipeline_write(
            client.clone(),
            path.clone(),
            opts.clone(),
            args.size,
            src.clone(),
            bar.clone(),
        )
        .await?;
        let cpu = match (cpu_before, CpuSnapshot::now()) {
            (Some(a), Some(b)) => a.until(&b),
            _ => None,
        };
        // The file stays until the end: deleting it now would put its discards into
        // the next measurement.
        raw_runs.push(run_raw("(after)", 0).await?);
        let raw_wb = run_raw("with write-behind", DEFAULT_WRITE_BEHIND).await?;
        let throughput = Throughput::new(r, args.size, elapsed, &acks, &raw_runs)
            .with_cpu(cpu)
            .with_write_behind_baseline(raw_wb);
        let small = if args.small_writes > 0 {
            bar.set_message(format!("r{r} {label}: 4 KiB + hsync / + fdatasync"));
            let small_path = format!("{remote_dir}/small-r{r}-{label}");
            let series = small_writes(
                client.clone(),
                small_path,
                opts,
                work.to_path_buf(),
                args.small_writes,
                bar.clone(),
            )
            .await?;
            Some(
                SmallWrites::new(
                    &series.pipeline,
                    &series.raw,
                    series.raw_parallel.as_deref(),
                )
                .with_acks(&series.acks),
            )
        } else {
            None
        };
        let patterns = crate::bench_patterns::Patterns::parse(&args.pattern)?;
        let overwrite = if patterns.overwrite {
            bar.set_message(format!("r{r} {label}: sequential overwrite"));
            let took = crate::bench_patterns::overwrite(
                client.clone(),
                path.clone(),
                args.size,
                src.clone(),
                bar.clone(),
            )
            .await?;
            Some(crate::bench_patterns::Overwrite::new(
                args.size,
                took,
                throughput.mb_per_s,
            ))
        } else {
            None
        };
        let random = match (&small, patterns.random) {
            (Some(s), true) => {
                bar.set_message(format!("r{r} {label}: random 4 KiB + hsync"));
                let span = args.size;
                let samples = crate::bench_patterns::random(
                    client.clone(),
                    path.clone(),
                    span,
                    args.small_writes,
                    bar.clone(),
                )
                .await?;
                Some(crate::bench_patterns::Random::new(&samples, span, s.p50_us))
            }
            _ => None,
        };
        out.push(ConfigResult {
            replication: r,
            engine: label.to_string(),
            throughput,
            small,
            overwrite,
            random,
        });
    }
    // An embedded cluster is removed with its directory; a running one is asked to
    // delete the files (its trash and garbage collection take it from there).
    let _ = client.delete(&remote_dir, true).await;
    Ok(out)
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
    fn tables_align_columns() {
        let t = table(
            &["config", "MB/s"],
            &[
                vec!["r1 uring".into(), "5".into()],
                vec!["r3 threads".into(), "123".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "config      MB/s");
        assert_eq!(lines[2], "r1 uring       5");
        assert_eq!(lines[3], "r3 threads   123");
    }

    fn sample_report() -> Report {
        let t = Throughput::new(3, 1 << 30, ms(10_000), &[ms(1), ms(2)], &[ms(9_000)]);
        Report {
            command: "stampfs bench pipeline".into(),
            size: 1 << 30,
            packet: 64 << 10,
            window: 8 << 20,
            chunk_size: None,
            small_writes: 1,
            cores: 2,
            dir: "/tmp/<x>".into(),
            results: vec![ConfigResult {
                replication: 3,
                engine: "uring".into(),
                throughput: t,
                small: Some(SmallWrites::new(&[ms(1)], &[ms(1)], Some(&[ms(2)]))),
                overwrite: Some(crate::bench_patterns::Overwrite::new(
                    80_000_000,
                    ms(1_000),
                    100.0,
                )),
                random: None,
            }],
        }
    }

    #[test]
    fn text_report_names_every_configuration_and_verdict() {
        let text = render_text(&sample_report());
        assert!(text.contains("r3 uring"), "{text}");
        assert!(text.contains("90%"), "{text}");
        assert!(text.contains("met"), "{text}");
        assert!(text.contains("4 KiB + hsync"), "{text}");
        assert!(
            text.contains("r3 uring: sequential overwrite 80 MB/s against append 100 MB/s: 80%"),
            "{text}"
        );
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let svg = render_svg(&sample_report());
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("r3 uring"));
        assert!(!svg.contains("NaN"));
        assert_eq!(svg.matches("<svg").count(), 1);
        let empty = Report {
            results: Vec::new(),
            ..sample_report()
        };
        assert!(!render_svg(&empty).contains("NaN"));
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

    #[test]
    fn engines_parse() {
        assert_eq!(parse_engine("uring").expect("ok"), IoEngineKind::Uring);
        assert_eq!(parse_engine("Threads").expect("ok"), IoEngineKind::Threads);
        assert!(parse_engine("spdk").is_err());
    }

    #[test]
    fn source_is_not_constant() {
        let s = source(4096);
        assert_eq!(s.len(), 4096);
        assert!(s.windows(2).any(|w| w[0] != w[1]));
    }
}
