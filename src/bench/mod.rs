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
use stampfs_chunkserver::store::DEFAULT_WRITE_BEHIND;
use stampfs_chunkserver::IoEngineKind;
use stampfs_client::{Client, ClientConfig, CreateOptions};
use stampfs_proto::units::format_size;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod measure;
mod render;
mod results;

use measure::*;
pub use render::{render_svg, render_text, table};
pub use results::*;

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

/// Where the benchmark's files go: an embedded cluster with one engine, in plain TCP
/// or TLS, or a running cluster.
#[derive(Clone, Copy, Debug)]
enum Target {
    Embedded { engine: IoEngineKind, tls: bool },
    External,
}

impl Target {
    fn label(self) -> String {
        let (engine, tls) = match self {
            Target::Embedded { engine, tls } => (engine, tls),
            Target::External => return "external".into(),
        };
        let name = match engine {
            IoEngineKind::Uring => "uring",
            IoEngineKind::Threads => "threads",
            IoEngineKind::Auto => "auto",
        };
        if tls {
            format!("{name}{TLS_SUFFIX}")
        } else {
            name.into()
        }
    }

    fn tls(self) -> bool {
        matches!(self, Target::Embedded { tls: true, .. })
    }
}

/// What a TLS configuration's engine label ends with.
pub const TLS_SUFFIX: &str = "+tls";

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
    let mut targets: Vec<Target> = Vec::new();
    match &args.master {
        Some(_) => targets.push(Target::External),
        None => {
            for e in &args.engine {
                let engine = parse_engine(e)?;
                targets.push(Target::Embedded { engine, tls: false });
                if args.tls {
                    targets.push(Target::Embedded { engine, tls: true });
                }
            }
        }
    }
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
        dialer: stampfs_proto::net::Dialer::from_ca(args.tls_ca.as_deref())?,
        ..ClientConfig::default()
    };
    let src = Arc::new(source(RAW_BUF));
    let mut results = Vec::new();
    for target in targets {
        let label = target.label();
        let cluster = match target {
            Target::Embedded { engine, tls } => {
                bar.set_message(format!("starting a cluster ({label})"));
                let max_r = replication.iter().copied().max().unwrap_or(1);
                let dir = work.path().join(format!("cluster-{label}"));
                let mut builder = LocalCluster::builder(&dir)
                    .chunkservers(usize::from(max_r))
                    .chunkserver_config(move |c| c.io_engine = engine);
                if tls {
                    builder = builder.tls(crate::tls::generate(&dir.join("tls"), &["127.0.0.1"])?);
                }
                Some(
                    builder
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
            target,
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
    target: Target,
    work: &Path,
    src: &Arc<Vec<u8>>,
    bar: &ProgressBar,
) -> Result<Vec<ConfigResult>> {
    let label = &target.label();
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
            tls: target.tls(),
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

    #[test]
    fn engines_parse() {
        assert_eq!(parse_engine("uring").expect("ok"), IoEngineKind::Uring);
        assert_eq!(parse_engine("Threads").expect("ok"), IoEngineKind::Threads);
        assert!(parse_engine("spdk").is_err());
    }
}
