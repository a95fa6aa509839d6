//! The start-up scan and the chunk report over many replica files:
//!
//! ```text
//! cargo bench -p stampfs-chunkserver --bench scan -- [--replicas N] [--dir DIR]
//!     [--threads T] [--cold] [--keep] [--json] [--existing DIR]
//! ```
//!
//! Generates N (default 1 000 000) finalized replica files in a new directory under
//! DIR (default the system temp dir), opens a store on them with the threads I/O
//! engine, and prints the scan's time, the report's read time and the resident memory
//! per replica. `--cold` drops the files' cached pages before the scan (inode and
//! directory caches stay warm). The files are removed afterwards unless `--keep`;
//! `--existing DIR` scans a directory kept that way (N is then what it holds).

use stampfs_chunkserver::bench::{self, Figures};
use stampfs_chunkserver::io::ThreadsEngine;
use std::sync::Arc;

struct Args {
    replicas: u64,
    /// Scan this directory (left by `--keep`) instead of generating one.
    existing: Option<std::path::PathBuf>,
    dir: std::path::PathBuf,
    threads: usize,
    cold: bool,
    keep: bool,
    json: bool,
}

fn args() -> Args {
    let mut a = Args {
        replicas: 1_000_000,
        existing: None,
        dir: std::env::temp_dir(),
        threads: 2,
        cold: false,
        keep: false,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--replicas" => a.replicas = value().parse().unwrap_or_else(|_| usage("--replicas N")),
            "--dir" => a.dir = value().into(),
            "--existing" => a.existing = Some(value().into()),
            "--threads" => a.threads = value().parse().unwrap_or_else(|_| usage("--threads T")),
            "--cold" => a.cold = true,
            "--keep" => a.keep = true,
            "--json" => a.json = true,
            // What `cargo bench` passes to every bench target.
            "--bench" => {}
            other => usage(&format!("unknown argument {other}")),
        }
    }
    a
}

fn usage(why: &str) -> ! {
    eprintln!("scan bench: {why}\nusage: scan [--replicas N] [--dir DIR] [--threads T] [--cold] [--keep] [--json] [--existing DIR]");
    std::process::exit(2)
}

fn mib(b: Option<u64>) -> String {
    b.map_or("-".into(), |b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}

fn main() {
    let mut a = args();
    if let Some(existing) = a.existing.clone() {
        a.replicas = 0;
        report(&a, &existing);
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("stampfs-scan-bench-")
        .tempdir_in(&a.dir)
        .unwrap_or_else(|e| {
            usage(&format!(
                "cannot create a directory in {}: {e}",
                a.dir.display()
            ))
        });
    let path = dir.path().to_path_buf();
    eprintln!(
        "generating {} replica files in {}",
        a.replicas,
        path.display()
    );
    let generated = bench::generate(&path, a.replicas, a.threads).expect("generate");
    eprintln!("generated in {:.1} s", generated.secs);
    report(&a, &path);
    if a.keep {
        eprintln!("kept {}", dir.keep().display());
    } else {
        let started = std::time::Instant::now();
        drop(dir);
        eprintln!(
            "removed the files in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
}

/// Scans `path` and prints the figures.
fn report(a: &Args, path: &std::path::Path) {
    if a.cold {
        bench::drop_cached_pages(path).expect("drop cached pages");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let f: Figures = runtime
        .block_on(bench::measure(path, Arc::new(ThreadsEngine::new())))
        .expect("measure");
    if a.replicas > 0 {
        assert_eq!(f.replicas, a.replicas, "every generated replica loads");
    }
    assert_eq!(f.corrupt, 0, "none looks corrupt");
    if a.json {
        println!(
            "{{\"replicas\":{},\"cold\":{},\"scan_secs\":{:.3},\"report_secs\":{:.3},\"rss_before\":{},\"rss_after\":{},\"rss_peak\":{},\"rss_per_replica\":{},\"table_bytes_per_replica\":{}}}",
            f.replicas,
            a.cold,
            f.scan_secs,
            f.report_secs,
            f.rss_before.map_or("null".into(), |v| v.to_string()),
            f.rss_after.map_or("null".into(), |v| v.to_string()),
            f.rss_peak.map_or("null".into(), |v| v.to_string()),
            f.rss_per_replica().map_or("null".into(), |v| format!("{v:.1}")),
            f.table_bytes_per_replica,
        );
        return;
    }
    println!("replicas            {}", f.replicas);
    println!(
        "page cache          {}",
        if a.cold {
            "cold (headers read from the device)"
        } else {
            "warm"
        }
    );
    println!(
        "scan                {:.2} s ({:.0} replicas/s)",
        f.scan_secs,
        f.replicas as f64 / f.scan_secs.max(1e-9)
    );
    println!(
        "full report read    {:.3} s ({} pages)",
        f.report_secs,
        f.replicas
            .div_ceil(stampfs_chunkserver::store::REPORT_PAGE as u64)
    );
    println!(
        "RSS before / after  {} / {} MiB (peak {} MiB)",
        mib(f.rss_before),
        mib(f.rss_after),
        mib(f.rss_peak)
    );
    println!(
        "per replica         {} B resident ({} B of table before allocator overhead)",
        f.rss_per_replica()
            .map_or("-".into(), |v| format!("{v:.0}")),
        f.table_bytes_per_replica
    );
}
