//! Measuring the start-up scan and the chunk report at scale.
//!
//! [`generate`] writes replica files straight into a data directory, as many as asked
//! for, without a store: each is a finalized replica of 1 000 to 52 000 zero bytes
//! whose header is [`Header::encode_head`]'s (with the tail CRC of its length) and
//! whose data is a hole, so a million of them cost one 4 KiB block each on disk and
//! every one of them is a valid replica a store serves. [`measure`] then opens a
//! [`Store`] on the directory and reports the scan's time, the full report's read time
//! (every page, as the heartbeat sends it) and the process's resident memory before,
//! after and at the peak.
//!
//! `cargo bench -p stampfs-chunkserver --bench scan -- --replicas 1000000` runs both
//! (and removes the files); `chunkserver/tests/scan_bench.rs` runs them at a tiny
//! size so that they cannot rot. No figure is asserted anywhere.

use crate::error::{Error, Result};
use crate::header::{Header, DATA_OFFSET};
use crate::io::IoEngine;
use crate::layout::{self, Dirty, Layout};
use crate::store::{Store, REPORT_PAGE, TABLE_BYTES_PER_REPLICA};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState};
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// Distinct replica lengths [`generate`] uses (their tail CRCs are computed once).
const LENGTHS: u64 = 256;

/// The length of generated replica `handle`: under one checksum block, so its header's
/// tail CRC vouches for all of it and no checksum table is needed.
fn length_of(handle: u64) -> u64 {
    1000 + (handle % LENGTHS) * 200
}

/// What [`generate`] wrote.
#[derive(Clone, Copy, Debug)]
pub struct Generated {
    pub replicas: u64,
    pub secs: f64,
}

/// Writes replicas of handles `1..=replicas` (as a master hands them out) into `dir`
/// with `threads` threads, each its share of the 256 subdirectories. Files are not
/// fsynced one by one (a benchmark's files need not survive a crash); the file system
/// is synced once at the end, so the scan measured next does not compete with the
/// write-back of its own input.
pub fn generate(dir: &Path, replicas: u64, threads: usize) -> Result<Generated> {
    let started = Instant::now();
    let layout = Layout::new(dir);
    layout::prepare(&layout, &mut Dirty::default())?;
    let zeros = vec![0u8; length_of(LENGTHS - 1) as usize];
    let tails: Vec<u32> = (0..LENGTHS)
        .map(|i| crc32fast::hash(&zeros[..length_of(i) as usize]))
        .collect();
    let threads = threads.clamp(1, layout::SUBDIRS);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (layout, tails) = (&layout, &tails);
                scope.spawn(move || -> Result<()> {
                    for sub in (t..layout::SUBDIRS).step_by(threads) {
                        // Handles whose low byte is `sub`, from 1.
                        let first = if sub == 0 { 256 } else { sub as u64 };
                        for h in (first..=replicas).step_by(256) {
                            write_replica(layout, ChunkHandle(h), tails[(h % LENGTHS) as usize])?;
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| Error::Io {
                op: "generate replicas",
                path: dir.display().to_string(),
                source: std::io::Error::other("a generator thread panicked"),
            })??;
        }
        Ok::<(), Error>(())
    })?;
    // Written back before anything is measured: a chunkserver starts on files at rest.
    let root = std::fs::File::open(dir).map_err(|e| Error::io("open", dir, e))?;
    rustix::fs::syncfs(&root).map_err(|e| Error::io("syncfs", dir, e.into()))?;
    Ok(Generated {
        replicas,
        secs: started.elapsed().as_secs_f64(),
    })
}

fn write_replica(layout: &Layout, handle: ChunkHandle, tail: u32) -> Result<()> {
    let path = layout.replica_path(handle);
    let length = length_of(handle.0);
    let header =
        Header::new(handle, ChunkVersion(1), ReplicaState::Finalized, length).with_tail(tail);
    let path = path.as_path();
    let io = |op| move |e| Error::io(op, path, e);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io("create"))?;
    file.write_all_at(&header.encode_head(), header.slot_offset())
        .map_err(io("write header"))?;
    file.set_len(DATA_OFFSET + length).map_err(io("size"))?;
    Ok(())
}

/// Drops the generated files' cached pages, so that the scan reads every header from
/// the device (the kernel's inode and directory caches stay warm: dropping those
/// needs root and affects the whole machine). Writes everything back first.
pub fn drop_cached_pages(dir: &Path) -> Result<()> {
    let root = std::fs::File::open(dir).map_err(|e| Error::io("open", dir, e))?;
    rustix::fs::syncfs(&root).map_err(|e| Error::io("syncfs", dir, e.into()))?;
    let layout = Layout::new(dir);
    for index in 0..layout::SUBDIRS {
        let sub = layout.subdir(index);
        for entry in std::fs::read_dir(&sub).map_err(|e| Error::io("list", &sub, e))? {
            let path = entry.map_err(|e| Error::io("list", &sub, e))?.path();
            let f = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed)
                .map_err(|e| Error::io("fadvise", &path, e.into()))?;
        }
    }
    Ok(())
}

/// What [`measure`] found.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub replicas: u64,
    pub corrupt: u64,
    /// The store's open: directory creation, migration check and the scan.
    pub scan_secs: f64,
    /// Reading the full chunk report page by page (no network).
    pub report_secs: f64,
    /// Resident memory before the store opened, with it open, and at the peak of the
    /// open (`None` where `/proc/self/status` says nothing).
    pub rss_before: Option<u64>,
    pub rss_after: Option<u64>,
    pub rss_peak: Option<u64>,
    /// `TABLE_BYTES_PER_REPLICA`: the table's own bytes per replica.
    pub table_bytes_per_replica: usize,
}

impl Figures {
    /// Resident bytes the open store holds per replica.
    pub fn rss_per_replica(&self) -> Option<f64> {
        let (before, after) = (self.rss_before?, self.rss_after?);
        (self.replicas > 0).then(|| after.saturating_sub(before) as f64 / self.replicas as f64)
    }
}

/// Opens a store on `dir` and measures it (see the module docs).
pub async fn measure(dir: &Path, engine: Arc<dyn IoEngine>) -> Result<Figures> {
    // The peak is measured from here on, where the kernel allows resetting it.
    let _ = std::fs::write("/proc/self/clear_refs", b"5");
    let rss_before = status_bytes("VmRSS:");
    let started = Instant::now();
    let (store, stats) = Store::open_with_stats(dir, engine).await?;
    let scan_secs = started.elapsed().as_secs_f64();
    let rss_peak = status_bytes("VmHWM:");
    let rss_after = status_bytes("VmRSS:");
    let started = Instant::now();
    let mut reported = 0u64;
    let mut after = None;
    loop {
        let page = store.report_page(after, REPORT_PAGE).await;
        reported += page.replicas.len() as u64;
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let report_secs = started.elapsed().as_secs_f64();
    debug_assert_eq!(reported, stats.replicas);
    Ok(Figures {
        replicas: stats.replicas,
        corrupt: stats.corrupt,
        scan_secs,
        report_secs,
        rss_before,
        rss_after,
        rss_peak,
        table_bytes_per_replica: TABLE_BYTES_PER_REPLICA,
    })
}

/// A `/proc/self/status` field in bytes (`kB` values).
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}
