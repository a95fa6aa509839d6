//! What one run of `stampfs bench master` found: the `--json` document and the
//! terminal tables, with the targets the figures are judged against.

use super::stats::{CpuSplit, Memory};
use crate::cli::BenchVia;
use serde::Serialize;
use std::fmt::Write as _;

/// The goals (docs/DESIGN.md, README): not assertions, verdicts.
pub const TARGET_CREATE_OPS: f64 = 20_000.0;
pub const TARGET_READ_OPS: f64 = 200_000.0;
pub const TARGET_BYTES_PER_CHUNK: f64 = 150.0;
pub const TARGET_BYTES_PER_FILE: f64 = 200.0;
pub const TARGET_REPORT_MS: f64 = 1000.0;
pub const TARGET_STALL_MS: f64 = 50.0;

pub const WHY_SERVICE: &str = "client tasks call the master's request layer (stampfs_master::service::Core, what its connection handlers call) directly: on this 2-core machine the wire (framing, two sockets and a wake-up on each side per request) costs more CPU than most master operations and would be measured instead of the master; --via rpc measures through it";
pub const WHY_RPC: &str = "client tasks and simulated chunkservers speak the wire protocol over loopback TCP (RpcClient, the client library's transport; one request at a time per connection): the master plus framing, sockets and wake-ups, on the same cores";

/// Everything one run measured (the `--json` document).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The command line that produced it.
    pub command: String,
    pub via: BenchVia,
    /// Why the client tasks reach the master the way they do.
    pub via_why: String,
    pub cores: usize,
    pub files: u64,
    pub chunks_per_file: u64,
    pub chunkservers: usize,
    pub threads: usize,
    pub ops: u64,
    pub replication: u8,
    pub files_per_dir: u64,
    /// Masters: 1, or the members of a group on loopback (the leader driven).
    pub masters: u8,
    /// The log a single master kept (`oplog` or `group`); a group's is `group`.
    pub log: String,
    /// The master's replica-health interval (0: the worker was off).
    pub health_interval_s: f64,
    /// Where the master's log and checkpoint lived.
    pub dir: String,
    pub operations: Vec<OpResult>,
    pub memory: MemoryReport,
    /// Requests timed while the master checkpointed, ran a health pass, and applied
    /// the dense chunkserver's report.
    pub stalls: Vec<StallResult>,
    /// The dense chunkserver's full report (absent with `--report-replicas 0`).
    pub big_report: Option<BigReport>,
    /// Operation log counters over the whole run.
    pub log_fsyncs: u64,
    pub log_records: u64,
    pub sim: SimCounters,
}

/// One measured operation.
#[derive(Clone, Debug, Serialize)]
pub struct OpResult {
    pub name: String,
    /// Successful calls.
    pub count: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Wall time of the phase.
    pub seconds: f64,
    pub ops_per_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub target_ops_per_s: Option<f64>,
    pub met: Option<bool>,
    /// What one call is, when it is not obvious.
    pub note: Option<String>,
    /// CPU seconds by thread group during the phase.
    pub cpu: CpuSplit,
}

/// The master's memory per file and per chunk.
#[derive(Clone, Debug, Serialize)]
pub struct MemoryReport {
    /// How it is measured.
    pub method: String,
    pub files: u64,
    pub chunks: u64,
    pub replicas_per_chunk: f64,
    pub baseline: Memory,
    pub after_files: Memory,
    pub after_chunks: Memory,
    pub heap_per_file: Option<f64>,
    pub rss_per_file: Option<f64>,
    pub heap_per_chunk: Option<f64>,
    pub rss_per_chunk: Option<f64>,
    pub target_per_file: f64,
    pub target_per_chunk: f64,
    /// Judged on the allocator's figure (RSS when there is none).
    pub met_per_file: Option<bool>,
    pub met_per_chunk: Option<bool>,
}

/// Requests timed while something else ran in the master.
#[derive(Clone, Debug, Serialize)]
pub struct StallResult {
    /// What ran.
    pub during: String,
    /// How long it took.
    pub seconds: f64,
    /// Stats answered meanwhile, and their latency.
    pub requests: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub target_max_ms: f64,
    pub met: bool,
}

/// The dense chunkserver's full report: once with replicas the master did not know
/// on it, then twice with every replica known.
#[derive(Clone, Debug, Serialize)]
pub struct BigReport {
    pub replicas: u64,
    /// Time to apply the first report (every replica new on this chunkserver).
    pub new_ms: f64,
    /// The slower of the two reports that changed nothing.
    pub known_ms: f64,
    /// The most a request timed meanwhile waited.
    pub new_stall_ms: f64,
    pub known_stall_ms: f64,
    pub target_ms: f64,
    pub stall_target_ms: f64,
    pub met: bool,
    pub stall_met: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SimCounters {
    pub bumps: u64,
    pub finalizes: u64,
    pub truncates: u64,
    pub deletes: u64,
    pub other: u64,
    pub arena_growths: u64,
}

pub fn fmt_us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0} µs")
    } else {
        format!("{v:.1} µs")
    }
}

pub fn fmt_rate(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "MISSED",
        None => "",
    }
}

pub fn bytes(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |b| format!("{b:.0} B"))
}

/// The terminal report.
pub fn render_text(r: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "stampfs bench master: {} master(s) on the {} log, {} files × {} chunks, replication {}, {} chunkservers, {} client tasks, via {:?}, health pass every {}, {} cores",
        r.masters,
        r.log,
        r.files,
        r.chunks_per_file,
        r.replication,
        r.chunkservers,
        r.threads,
        r.via,
        if r.health_interval_s > 0.0 {
            format!("{} s", r.health_interval_s)
        } else {
            "(off)".into()
        },
        r.cores
    );
    let _ = writeln!(out, "({})\n", r.via_why);
    let rows: Vec<Vec<String>> = r
        .operations
        .iter()
        .map(|o| {
            vec![
                o.name.clone(),
                o.count.to_string(),
                format!("{:.2}", o.seconds),
                fmt_rate(o.ops_per_s),
                fmt_us(o.p50_us),
                fmt_us(o.p99_us),
                fmt_us(o.max_us),
                o.errors.to_string(),
                o.target_ops_per_s
                    .map_or_else(String::new, |t| format!("≥{}", fmt_rate(t))),
                verdict(o.met).to_string(),
                format!("{:.0}%", cpu_share(o)),
                o.cpu
                    .other_load
                    .map_or_else(|| "-".into(), |l| format!("{:.0}%", 100.0 * l)),
            ]
        })
        .collect();
    out.push_str(&crate::bench::table(
        &[
            "operation",
            "ops",
            "s",
            "ops/s",
            "p50",
            "p99",
            "max",
            "errors",
            "target",
            "",
            "sim cpu",
            "others",
        ],
        &rows,
    ));
    let m = &r.memory;
    let _ = writeln!(
        out,
        "\nmaster memory ({} files, {} chunks, {:.2} replicas per chunk)",
        m.files, m.chunks, m.replicas_per_chunk
    );
    out.push_str(&crate::bench::table(
        &["per", "heap", "rss", "target", ""],
        &[
            vec![
                "file".into(),
                bytes(m.heap_per_file),
                bytes(m.rss_per_file),
                format!("≤{:.0} B", m.target_per_file),
                verdict(m.met_per_file).into(),
            ],
            vec![
                "chunk".into(),
                bytes(m.heap_per_chunk),
                bytes(m.rss_per_chunk),
                format!("≤{:.0} B", m.target_per_chunk),
                verdict(m.met_per_chunk).into(),
            ],
        ],
    ));
    let _ = writeln!(out, "\nrequests (stat) timed while the master was busy");
    let rows: Vec<Vec<String>> = r
        .stalls
        .iter()
        .map(|s| {
            vec![
                s.during.clone(),
                format!("{:.3}", s.seconds),
                s.requests.to_string(),
                fmt_us(s.p50_us),
                fmt_us(s.p99_us),
                fmt_us(s.max_us),
                format!("≤{:.0} ms", s.target_max_ms),
                verdict(Some(s.met)).into(),
            ]
        })
        .collect();
    out.push_str(&crate::bench::table(
        &["during", "s", "requests", "p50", "p99", "max", "target", ""],
        &rows,
    ));
    if let Some(b) = &r.big_report {
        let _ = writeln!(
            out,
            "\nfull report of {} replicas: applied in {:.0} ms (new on that chunkserver) and {:.0} ms (known), target < {:.0} ms: {}; other requests waited up to {:.0} ms and {:.0} ms, target ≤ {:.0} ms: {}",
            b.replicas,
            b.new_ms,
            b.known_ms,
            b.target_ms,
            verdict(Some(b.met)),
            b.new_stall_ms,
            b.known_stall_ms,
            b.stall_target_ms,
            verdict(Some(b.stall_met)),
        );
    }
    let _ = writeln!(
        out,
        "\noperation log: {} records in {} fsyncs ({:.1} per fsync); simulated chunkservers: {} bumps, {} finalizes, {} deletes",
        r.log_records,
        r.log_fsyncs,
        r.log_records as f64 / r.log_fsyncs.max(1) as f64,
        r.sim.bumps,
        r.sim.finalizes,
        r.sim.deletes
    );
    for o in r.operations.iter().filter(|o| o.errors > 0) {
        let _ = writeln!(
            out,
            "{}: {} errors, first: {}",
            o.name,
            o.errors,
            o.first_error.as_deref().unwrap_or("?")
        );
    }
    out
}

/// The share of the phase's CPU time the simulated chunkservers used.
pub fn cpu_share(o: &OpResult) -> f64 {
    let c = &o.cpu;
    let total = c.master_and_clients + c.oplog_writer + c.simulated_chunkservers;
    if total > 0.0 {
        100.0 * c.simulated_chunkservers / total
    } else {
        0.0
    }
}
