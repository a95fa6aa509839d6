//! `stampfs bench mount-metadata`: metadata operations through mounted file systems,
//! one after the other in the same run, so a stampfs mount and another (MooseFS, a
//! local directory) are measured on the same machine in the same minute.
//!
//! Each target is a directory on a mount. For every round and every phase the loop
//! runs on each target in turn, single-threaded, one system call sequence per file
//! from this one process (no process per file):
//!
//! | phase          | per file                                           |
//! |----------------|----------------------------------------------------|
//! | `create+close` | `open(O_CREAT \| O_WRONLY)`, `close`                |
//! | `stat`         | `stat` of a file created in the phase before       |
//! | `unlink`       | `unlink` of those files                            |
//! | `mkdir`        | `mkdir`                                            |
//! | `rmdir`        | `rmdir` of those directories                       |
//!
//! and prints ops/s per phase and target, with p50/p99 of one operation. It also
//! measures what one durable metadata record costs on the disk under `--dir`: a small
//! write plus `fdatasync` that appends to a file (the file's size changes, so the file
//! system's journal commits too) and one that overwrites bytes already allocated.
//! Nothing here starts or stops a file system: `scripts/mount-metadata-bench.sh` sets up
//! a stampfs cluster, its mount and a MooseFS on loopback and runs this.

use crate::cli::BenchMountArgs;
use crate::{EXIT_ERROR, EXIT_OK};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The phases, in the order they run (each later one uses what the earlier made).
const PHASES: &[&str] = &["create+close", "stat", "unlink", "mkdir", "rmdir"];

/// One phase on one target.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    pub target: String,
    pub phase: String,
    pub round: u32,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// A small write plus `fdatasync`, appending or overwriting.
#[derive(Debug, Clone, Serialize)]
pub struct SyncResult {
    pub kind: String,
    pub n: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    files: u64,
    rounds: u32,
    results: Vec<PhaseResult>,
    fdatasync: Vec<SyncResult>,
}

/// Parses `NAME=DIR`.
pub fn parse_target(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, dir)) if !name.is_empty() && !dir.is_empty() => {
            Ok((name.to_string(), PathBuf::from(dir)))
        }
        _ => Err(format!("expected NAME=DIR, got {s:?}")),
    }
}

pub(crate) fn percentile(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// Runs `op` on every name and times each call.
fn timed(
    names: &[PathBuf],
    mut op: impl FnMut(&Path) -> std::io::Result<()>,
) -> std::io::Result<(Duration, Vec<Duration>)> {
    let mut lat = Vec::with_capacity(names.len());
    let start = Instant::now();
    for name in names {
        let t = Instant::now();
        op(name).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", name.display())))?;
        lat.push(t.elapsed());
    }
    let total = start.elapsed();
    lat.sort_unstable();
    Ok((total, lat))
}

fn run_phase(
    phase: &str,
    files: &[PathBuf],
    dirs: &[PathBuf],
) -> std::io::Result<(Duration, Vec<Duration>)> {
    match phase {
        "create+close" => timed(files, |p| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map(drop)
        }),
        "stat" => timed(files, |p| std::fs::metadata(p).map(drop)),
        "unlink" => timed(files, |p| std::fs::remove_file(p)),
        "mkdir" => timed(dirs, |p| std::fs::create_dir(p)),
        "rmdir" => timed(dirs, |p| std::fs::remove_dir(p)),
        other => Err(std::io::Error::other(format!("unknown phase {other}"))),
    }
}

/// Times `n` small writes plus `fdatasync` on a new file in `dir`: appending (the
/// size grows with every write) or overwriting a preallocated, already synced region.
fn fdatasync_probe(dir: &Path, n: u64, overwrite: bool) -> std::io::Result<SyncResult> {
    let path = dir.join(format!(
        ".stampfs-bench-fdatasync-{}-{}",
        std::process::id(),
        if overwrite { "over" } else { "append" }
    ));
    let res = (|| {
        let mut f = File::create(&path)?;
        let rec = [0x5au8; 128];
        if overwrite {
            let zeros = vec![0u8; (n as usize + 1) * rec.len()];
            f.write_all(&zeros)?;
            f.sync_all()?;
        }
        let mut lat = Vec::with_capacity(n as usize);
        for i in 0..n {
            let t = Instant::now();
            f.write_all_at(&rec, i * rec.len() as u64)?;
            f.sync_data()?;
            lat.push(t.elapsed());
        }
        lat.sort_unstable();
        Ok(SyncResult {
            kind: if overwrite { "overwrite" } else { "append" }.to_string(),
            n,
            p50_us: percentile(&lat, 0.5),
            p99_us: percentile(&lat, 0.99),
        })
    })();
    let _ = std::fs::remove_file(&path);
    res
}

fn rate(ops: u64, secs: f64) -> String {
    let r = ops as f64 / secs.max(1e-9);
    if r >= 10_000.0 {
        format!("{:.1}k", r / 1000.0)
    } else {
        format!("{r:.0}")
    }
}

/// Runs the benchmark; prints a table and writes `--json`.
pub async fn run(args: BenchMountArgs) -> u8 {
    run_blocking("mount-metadata", move || measure(&args)).await
}

/// Runs a mount benchmark's blocking body off the runtime; its exit status, an error
/// printed as `stampfs bench NAME: ...`.
pub(crate) async fn run_blocking(
    name: &str,
    body: impl FnOnce() -> std::io::Result<()> + Send + 'static,
) -> u8 {
    let res = match tokio::task::spawn_blocking(body).await {
        Ok(res) => res,
        Err(e) => Err(std::io::Error::other(e)),
    };
    match res {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("stampfs bench {name}: {e}");
            EXIT_ERROR
        }
    }
}

fn measure(args: &BenchMountArgs) -> std::io::Result<()> {
    if args.targets.is_empty() {
        return Err(std::io::Error::other("no --target NAME=DIR given"));
    }
    let mut results = Vec::new();
    for round in 1..=args.rounds {
        // A fresh directory per target and round, made (and later removed) outside the
        // timed loops.
        let mut work = Vec::new();
        for (name, dir) in &args.targets {
            // Named after the target too: two targets may be mounts of one cluster.
            let base = dir.join(format!(
                "stampfs-bench-{}-{name}-{round}",
                std::process::id()
            ));
            std::fs::create_dir(&base)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", base.display())))?;
            let files: Vec<PathBuf> = (0..args.files)
                .map(|i| base.join(format!("f{i:06}")))
                .collect();
            let dirs: Vec<PathBuf> = (0..args.files)
                .map(|i| base.join(format!("d{i:06}")))
                .collect();
            work.push((name.clone(), base, files, dirs));
        }
        for phase in PHASES {
            for (name, _, files, dirs) in &work {
                let (total, lat) = run_phase(phase, files, dirs)?;
                let ops = lat.len() as u64;
                results.push(PhaseResult {
                    target: name.clone(),
                    phase: phase.to_string(),
                    round,
                    ops,
                    seconds: total.as_secs_f64(),
                    ops_per_sec: ops as f64 / total.as_secs_f64().max(1e-9),
                    p50_us: percentile(&lat, 0.5),
                    p99_us: percentile(&lat, 0.99),
                });
            }
        }
        for (_, base, _, _) in &work {
            std::fs::remove_dir(base)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", base.display())))?;
        }
    }
    let dir = args.dir.clone().unwrap_or_else(|| PathBuf::from("."));
    let fdatasync = if args.sync_probe > 0 {
        vec![
            fdatasync_probe(&dir, args.sync_probe, false)?,
            fdatasync_probe(&dir, args.sync_probe, true)?,
        ]
    } else {
        Vec::new()
    };
    print_table(&results, &fdatasync, &args.targets);
    if let Some(path) = &args.json {
        let report = Report {
            files: args.files,
            rounds: args.rounds,
            results,
            fdatasync,
        };
        let text = serde_json::to_string_pretty(&report).map_err(std::io::Error::other)?;
        std::fs::write(path, text)?;
    }
    Ok(())
}

fn print_table(results: &[PhaseResult], sync: &[SyncResult], targets: &[(String, PathBuf)]) {
    let first = targets.first().map(|t| t.0.as_str()).unwrap_or("");
    println!(
        "{:<6} {:<13} {:<10} {:>7} {:>9} {:>10} {:>10} {:>8}",
        "round", "phase", "target", "ops", "ops/s", "p50", "p99", "vs first"
    );
    println!("{}", "-".repeat(80));
    for r in results {
        let base = results
            .iter()
            .find(|b| b.round == r.round && b.phase == r.phase && b.target == first)
            .map(|b| b.ops_per_sec)
            .unwrap_or(r.ops_per_sec);
        println!(
            "{:<6} {:<13} {:<10} {:>7} {:>9} {:>8.0}µs {:>8.0}µs {:>7.2}×",
            r.round,
            r.phase,
            r.target,
            r.ops,
            rate(r.ops, r.seconds),
            r.p50_us,
            r.p99_us,
            r.ops_per_sec / base.max(1e-9)
        );
    }
    if !sync.is_empty() {
        println!();
        println!("128 B write + fdatasync on --dir ({} each)", sync[0].n);
        for s in sync {
            println!(
                "  {:<10} p50 {:>6.0}µs  p99 {:>6.0}µs",
                s.kind, s.p50_us, s.p99_us
            );
        }
    }
}
