//! `stampfs bench mount-io`: data through mounted file systems, each target in turn in
//! the same run, so a stampfs mount, another (MooseFS) and the local disk are measured on
//! the same machine in the same minute.
//!
//! Per round, every phase runs on every target before the next phase starts:
//!
//! | phase          | what one target does                                              |
//! |----------------|-------------------------------------------------------------------|
//! | `seq-write`    | create a file, write `--size` bytes in `--block` writes, `fsync`, `close` (all timed) |
//! | `seq-read`     | drop the page cache (root), read the file back in `--block` reads and check every 4 KiB page |
//! | `pwrite+fsync` | `--sync-ops` times: `pwrite` 4 KiB at a random 4 KiB-aligned offset of the file (of its first `--sync-span` bytes), then `fsync`; each pair timed |
//!
//! Before each target's write phases the machine's dirty pages are written back
//! (`sync`, untimed): a file system whose `fsync` leaves data in the page cache
//! (MooseFS's chunkservers) would otherwise hand the next target its write-back.
//! After `pwrite+fsync` every page it wrote is read back and checked against the last
//! write to it, outside the timing: a benchmark of writes that did not land would
//! measure nothing. Every 4 KiB page carries its offset (and, for the random writes, the
//! operation that wrote it) in its first 16 bytes, so a page read from the wrong place
//! fails too. Nothing here starts or stops a file system: `scripts/mount-io-bench.sh`
//! sets up stampfs and MooseFS side by side and runs this.

use crate::bench_mount::percentile;
use crate::cli::BenchMountIoArgs;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The unit the data is stamped and checked in, and the size of one random write.
const PAGE: usize = 4096;

/// One phase on one target.
#[derive(Debug, Clone, Serialize)]
pub struct IoResult {
    pub target: String,
    pub phase: String,
    pub round: u32,
    /// Bytes moved (the sequential phases) or operations (`pwrite+fsync`).
    pub bytes: u64,
    pub ops: u64,
    pub seconds: f64,
    pub mb_per_sec: f64,
    pub ops_per_sec: f64,
    /// Of one `--block` call (sequential phases) or one `pwrite`+`fsync` pair.
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Whether the page cache was dropped before a read phase.
    pub cold: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    size: u64,
    block: u64,
    sync_ops: u64,
    sync_span: Option<u64>,
    seed: u64,
    rounds: u32,
    results: Vec<IoResult>,
}

/// The content of the page at `offset`: its offset and a tag (0 for the sequential
/// write, the operation's number + 1 for a random write) in the first 16 bytes, then a
/// fixed pattern of `seed`.
fn stamp(page: &mut [u8], offset: u64, tag: u64) {
    page[..8].copy_from_slice(&offset.to_le_bytes());
    page[8..16].copy_from_slice(&tag.to_le_bytes());
}

/// A page of the fixed pattern (its first 16 bytes are overwritten by [`stamp`]).
fn pattern_page(seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut page = vec![0u8; PAGE];
    rng.fill(&mut page[..]);
    page
}

/// Checks one page read back; `what` names it in the error.
fn check_page(
    got: &[u8],
    pattern: &[u8],
    offset: u64,
    tag: u64,
    what: &str,
) -> std::io::Result<()> {
    let mut want = [0u8; 16];
    stamp(&mut want, offset, tag);
    if got.len() != PAGE || got[..16] != want || got[16..] != pattern[16..] {
        let got_offset = got
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        let got_tag = got
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes);
        return Err(std::io::Error::other(format!(
            "{what}: the page at offset {offset} is not what was written (want tag {tag}; \
             read {} bytes stamped offset {got_offset:?} tag {got_tag:?})",
            got.len()
        )));
    }
    Ok(())
}

fn with_path<T>(path: &Path, r: std::io::Result<T>) -> std::io::Result<T> {
    r.map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn result(
    target: &str,
    phase: &str,
    round: u32,
    bytes: u64,
    total: Duration,
    mut lat: Vec<Duration>,
    cold: bool,
) -> IoResult {
    lat.sort_unstable();
    let secs = total.as_secs_f64().max(1e-9);
    IoResult {
        target: target.to_string(),
        phase: phase.to_string(),
        round,
        bytes,
        ops: lat.len() as u64,
        seconds: total.as_secs_f64(),
        mb_per_sec: bytes as f64 / secs / 1e6,
        ops_per_sec: lat.len() as f64 / secs,
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        max_us: lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e6),
        cold,
    }
}

/// `seq-write`: the whole file in `block` writes, then `fsync`, then `close`.
fn seq_write(
    path: &Path,
    size: u64,
    block: usize,
    pattern: &[u8],
) -> std::io::Result<(Duration, Vec<Duration>)> {
    let mut buf = Vec::with_capacity(block);
    for _ in 0..block / PAGE {
        buf.extend_from_slice(pattern);
    }
    let mut lat = Vec::with_capacity((size / block as u64 + 1) as usize);
    let start = Instant::now();
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(block as u64) as usize;
        for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
            stamp(page, off + (i * PAGE) as u64, 0);
        }
        let t = Instant::now();
        f.write_all(&buf[..n])?;
        lat.push(t.elapsed());
        off += n as u64;
    }
    f.sync_all()?;
    drop(f);
    Ok((start.elapsed(), lat))
}

/// `seq-read`: the whole file in `block` reads, every page checked (outside the timing
/// of each read call, inside the phase's total: the checks cost the same everywhere).
fn seq_read(
    path: &Path,
    size: u64,
    block: usize,
    pattern: &[u8],
) -> std::io::Result<(Duration, Vec<Duration>)> {
    let mut buf = vec![0u8; block];
    let mut lat = Vec::with_capacity((size / block as u64 + 1) as usize);
    let start = Instant::now();
    let mut f = File::open(path)?;
    let mut off = 0u64;
    loop {
        let t = Instant::now();
        let n = read_full(&mut f, &mut buf)?;
        lat.push(t.elapsed());
        if n == 0 {
            break;
        }
        for (i, page) in buf[..n].chunks(PAGE).enumerate() {
            let at = off + (i * PAGE) as u64;
            check_page(page, pattern, at, 0, "seq-read")?;
        }
        off += n as u64;
    }
    if off != size {
        return Err(std::io::Error::other(format!(
            "seq-read: read {off} bytes of a {size}-byte file"
        )));
    }
    Ok((start.elapsed(), lat))
}

/// Reads until `buf` is full or the file ends.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `pwrite+fsync` at random pages of the file's first `span` bytes; then every page
/// written is read back and checked (untimed).
fn random_sync(
    path: &Path,
    span: u64,
    ops: u64,
    seed: u64,
    pattern: &[u8],
    warm: bool,
) -> std::io::Result<(Duration, Vec<Duration>)> {
    let pages = span / PAGE as u64;
    if pages == 0 {
        return Err(std::io::Error::other(
            "the random span is below one 4 KiB page",
        ));
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15);
    let f = OpenOptions::new().write(true).open(path)?;
    let mut page = pattern.to_vec();
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut lat = Vec::with_capacity(ops as usize);
    let start = Instant::now();
    for op in 0..ops {
        let at = rng.gen_range(0..pages) * PAGE as u64;
        stamp(&mut page, at, op + 1);
        let t = Instant::now();
        f.write_all_at(&page, at)?;
        f.sync_data()?;
        lat.push(t.elapsed());
        last.insert(at, op + 1);
    }
    let total = start.elapsed();
    drop(f);
    if !warm {
        // From the file system, not from the pages this process just wrote.
        drop_caches();
    }
    let f = File::open(path)?;
    let mut got = vec![0u8; PAGE];
    for (&at, &tag) in &last {
        f.read_exact_at(&mut got, at)?;
        check_page(&got, pattern, at, tag, "pwrite+fsync")?;
    }
    Ok((total, lat))
}

/// Drops the page cache (`sync`, then `3` into `/proc/sys/vm/drop_caches`): reads then
/// come from the file system, not from memory. Needs root; false when it failed.
fn drop_caches() -> bool {
    rustix::fs::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n").is_ok()
}

/// Runs the benchmark; prints a table and writes `--json`.
pub async fn run(args: BenchMountIoArgs) -> u8 {
    crate::bench_mount::run_blocking("mount-io", move || measure(&args)).await
}

fn measure(args: &BenchMountIoArgs) -> std::io::Result<()> {
    let block = args.block as usize;
    if block == 0 || block % PAGE != 0 {
        return Err(std::io::Error::other(
            "--block must be a positive multiple of 4KiB",
        ));
    }
    if args.size == 0 || args.size % PAGE as u64 != 0 {
        // Every page is stamped and checked whole.
        return Err(std::io::Error::other(
            "--size must be a positive multiple of 4KiB",
        ));
    }
    let pattern = pattern_page(args.seed);
    let mut results = Vec::new();
    for round in 1..=args.rounds {
        let files: Vec<(String, PathBuf)> = args
            .targets
            .iter()
            .map(|(name, dir)| {
                let file = format!("stampfs-bench-io-{}-{round}", std::process::id());
                (name.clone(), dir.join(file))
            })
            .collect();
        for (name, path) in &files {
            // What the target before left dirty is not this one's to write back.
            rustix::fs::sync();
            let (total, lat) = with_path(path, seq_write(path, args.size, block, &pattern))?;
            results.push(result(
                name,
                "seq-write",
                round,
                args.size,
                total,
                lat,
                false,
            ));
        }
        for (name, path) in &files {
            let cold = !args.warm && drop_caches();
            if !args.warm && !cold {
                eprintln!("stampfs bench mount-io: could not drop the page cache (not root?): reads may come from memory");
            }
            let (total, lat) = with_path(path, seq_read(path, args.size, block, &pattern))?;
            results.push(result(name, "seq-read", round, args.size, total, lat, cold));
        }
        for (name, path) in &files {
            rustix::fs::sync();
            let seed = args.seed.wrapping_add(u64::from(round));
            let span = args.sync_span.unwrap_or(args.size).min(args.size);
            let (total, lat) = with_path(
                path,
                random_sync(path, span, args.sync_ops, seed, &pattern, args.warm),
            )?;
            let bytes = lat.len() as u64 * PAGE as u64;
            results.push(result(
                name,
                "pwrite+fsync",
                round,
                bytes,
                total,
                lat,
                false,
            ));
        }
        for (_, path) in &files {
            with_path(path, std::fs::remove_file(path))?;
        }
    }
    print_table(&results, &args.targets);
    if let Some(path) = &args.json {
        let report = Report {
            size: args.size,
            block: args.block,
            sync_ops: args.sync_ops,
            sync_span: args.sync_span,
            seed: args.seed,
            rounds: args.rounds,
            results,
        };
        let text = serde_json::to_string_pretty(&report).map_err(std::io::Error::other)?;
        std::fs::write(path, text)?;
    }
    Ok(())
}

fn print_table(results: &[IoResult], targets: &[(String, PathBuf)]) {
    let first = targets.first().map(|t| t.0.as_str()).unwrap_or("");
    println!(
        "{:<6} {:<13} {:<14} {:>12} {:>10} {:>10} {:>10} {:>9}",
        "round", "phase", "target", "rate", "p50", "p99", "max", "vs first"
    );
    println!("{}", "-".repeat(90));
    for r in results {
        let sequential = r.phase != "pwrite+fsync";
        let value = |x: &IoResult| {
            if sequential {
                x.mb_per_sec
            } else {
                x.ops_per_sec
            }
        };
        let base = results
            .iter()
            .find(|b| b.round == r.round && b.phase == r.phase && b.target == first)
            .map(value)
            .unwrap_or(value(r));
        let rate = if sequential {
            format!("{:.0} MB/s", r.mb_per_sec)
        } else {
            format!("{:.0} ops/s", r.ops_per_sec)
        };
        let target = if r.phase == "seq-read" && !r.cold {
            format!("{} (warm)", r.target)
        } else {
            r.target.clone()
        };
        println!(
            "{:<6} {:<13} {:<14} {:>12} {:>8.0}µs {:>8.0}µs {:>8.0}µs {:>8.2}×",
            r.round,
            r.phase,
            target,
            rate,
            r.p50_us,
            r.p99_us,
            r.max_us,
            value(r) / base.max(1e-9)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_checks_its_offset_tag_and_pattern() {
        let pattern = pattern_page(7);
        let mut page = pattern.clone();
        stamp(&mut page, 8192, 3);
        check_page(&page, &pattern, 8192, 3, "t").unwrap();
        assert!(
            check_page(&page, &pattern, 4096, 3, "t").is_err(),
            "wrong place"
        );
        assert!(
            check_page(&page, &pattern, 8192, 2, "t").is_err(),
            "older write"
        );
        page[100] ^= 1;
        assert!(
            check_page(&page, &pattern, 8192, 3, "t").is_err(),
            "flipped bit"
        );
        assert!(
            check_page(&page[..10], &pattern, 8192, 3, "t").is_err(),
            "short"
        );
    }

    #[test]
    fn the_phases_run_and_check_on_a_local_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let pattern = pattern_page(1);
        let size = 3 * 65536 + 4096; // a multiple of the page, not of the block
        let (_, lat) = seq_write(&path, size, 65536, &pattern).unwrap();
        assert_eq!(lat.len(), 4);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
        seq_read(&path, size, 65536, &pattern).unwrap();
        let (_, lat) = random_sync(&path, size, 50, 9, &pattern, true).unwrap();
        assert_eq!(lat.len(), 50);
        // A page the sequential check would now reject proves the random writes landed.
        let f = File::open(&path).unwrap();
        let mut tags = 0;
        let mut page = vec![0u8; PAGE];
        for i in 0..size / PAGE as u64 {
            f.read_exact_at(&mut page, i * PAGE as u64).unwrap();
            if page[8..16] != [0u8; 8] {
                tags += 1;
            }
        }
        assert!(tags > 0 && tags <= 50, "{tags} pages rewritten");
        assert!(seq_read(&path, size, 65536, &pattern).is_err());
        // A file shorter than it should be fails the read check.
        seq_write(&path, size, 65536, &pattern).unwrap();
        seq_read(&path, size, 65536, &pattern).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(size - PAGE as u64)
            .unwrap();
        assert!(seq_read(&path, size, 65536, &pattern).is_err());
    }
}
