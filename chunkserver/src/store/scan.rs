//! The start-up scan: every replica file of a data directory loaded, recovered and
//! put in the replica table, in one streaming pass.
//!
//! 1. [`layout::prepare`]: the 256 subdirectories exist, and files of the flat layout
//!    in `DIR` itself are renamed into them (migration).
//! 2. [`SCAN_THREADS`] threads share the subdirectories (thread `t` takes every
//!    `SCAN_THREADS`-th one from `t`), so that many header reads are in flight at once
//!    when the page cache is cold (one read at a time waits out the device's latency
//!    a million times). Each subdirectory is read as a stream (`readdir`, a few KiB of
//!    entries at a time; no list of names or paths is kept): temporary files are
//!    removed, each replica is loaded ([`super::recovery`]) into the table or, when it
//!    fails its checks, moved aside as `.corrupt` and queued for a report. A replica in
//!    the wrong subdirectory (rare: moved by hand) is only noted; moved-aside files
//!    and names that are not this store's are left alone.
//! 3. The noted replicas are renamed into place and loaded, once no thread reads any
//!    directory (a rename into a directory being read may or may not be seen).
//! 4. Every directory that gained or lost a name is fsynced before the store serves.
//!
//! Memory: the table (one `(handle, slot)` pair and one slot per replica, see
//! [`super::TABLE_BYTES_PER_REPLICA`]), the handles of corrupt replicas, the paths of
//! misplaced ones, and one directory entry per thread. An I/O error (an unreadable
//! directory or replica) fails the scan: a chunkserver that cannot see all of its
//! replicas does not start. Nothing on disk makes it panic.

use super::{move_aside, recovery, Disk, Slot, SlotState};
use crate::error::{Error, Result};
use crate::layout::{self, Dirty, Name, Placed, Placement};
use stampfs_proto::ChunkHandle;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::RwLock;

/// What the scan found.
pub(super) struct Scanned {
    /// handle → per-chunk lock of every replica loaded.
    pub slots: BTreeMap<ChunkHandle, Arc<Slot>>,
    /// Replicas moved aside as corrupt (to report).
    pub corrupt: Vec<ChunkHandle>,
    pub stats: ScanStats,
}

/// Counts of one scan, logged when the store opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Replicas loaded.
    pub replicas: u64,
    /// Replicas moved aside as corrupt.
    pub corrupt: u64,
    /// Entries left alone (moved-aside files, names that are not the store's).
    pub ignored: u64,
    /// What was put in place (migration from the flat layout, misplaced files,
    /// temporary files removed).
    pub placed: Placed,
}

/// How often a long scan logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// Threads that read the subdirectories at start-up: enough reads in flight to keep a
/// device's queue busy on a cold start; on a warm one they share the CPUs.
pub const SCAN_THREADS: usize = 16;

/// Runs the scan (blocking).
pub(super) fn scan(disk: &Arc<Disk>) -> Result<Scanned> {
    let layout = &disk.layout;
    let mut dirty = Dirty::default();
    let placed = layout::prepare(layout, &mut dirty)?;
    let progress = Progress {
        loaded: AtomicU64::new(0),
        started: Instant::now(),
        logged: Mutex::new(Instant::now()),
    };
    let threads = SCAN_THREADS.min(layout::SUBDIRS);
    let parts: Vec<Result<Found>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let progress = &progress;
                std::thread::Builder::new()
                    .name(format!("scan-{t}"))
                    .spawn_scoped(scope, move || {
                        let mut part = Part::new(disk, progress);
                        for index in (t..layout::SUBDIRS).step_by(threads) {
                            part.subdir(index)?;
                        }
                        Ok(part.done())
                    })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| match w {
                Ok(handle) => handle
                    .join()
                    .unwrap_or_else(|_| Err(scan_error(layout, "a scan thread panicked"))),
                Err(e) => Err(Error::io("start a scan thread", layout.root(), e)),
            })
            .collect()
    });
    let mut all = Part::new(disk, &progress).done();
    all.stats.placed = placed;
    for part in parts {
        all.merge(part?, &mut dirty);
    }
    // Misplaced replicas, now that no directory is being read.
    let mut late = Part::new(disk, &progress);
    for (handle, src) in std::mem::take(&mut all.misplaced) {
        let dst = layout.replica_path(handle);
        let placement = layout::place(&src, &dst)?;
        match placement {
            Placement::Moved => late.found.stats.placed.moved += 1,
            Placement::SameFile => late.found.stats.placed.links_removed += 1,
            Placement::Duplicate => {
                tracing::error!(chunk = %handle, path = %src.display(), kept = %dst.display(), "a second replica file for a chunk already in place; renamed aside as .duplicate");
                late.found.stats.placed.duplicates += 1;
            }
            Placement::Gone => continue,
        }
        tracing::warn!(chunk = %handle, from = %src.display(), to = %dst.display(), "replica file in the wrong subdirectory put in place");
        if let Some(index) = src
            .parent()
            .and_then(|p| p.file_name())
            .and_then(layout::parse_subdir)
        {
            late.found.dirty.subdir(index);
        }
        late.found.dirty.subdir(layout::subdir_of(handle));
        // Moved: its own directory was read without it. Otherwise the file in place
        // was loaded there.
        if placement == Placement::Moved {
            late.load(&dst, handle)?;
        }
    }
    all.merge(late.done(), &mut dirty);
    dirty.sync(layout)?;
    // Sorted once, then built bottom-up: full B-tree nodes, no rebalancing.
    let slots: BTreeMap<_, _> = all.loaded.into_iter().collect();
    Ok(Scanned {
        slots,
        corrupt: all.corrupt,
        stats: all.stats,
    })
}

fn scan_error(layout: &layout::Layout, why: &str) -> Error {
    Error::io(
        "scan",
        layout.root(),
        std::io::Error::other(why.to_string()),
    )
}

/// Shared by the scan threads: replicas loaded so far, for the progress log.
struct Progress {
    loaded: AtomicU64,
    started: Instant,
    logged: Mutex<Instant>,
}

/// What one scan thread found.
struct Found {
    loaded: Vec<(ChunkHandle, Arc<Slot>)>,
    corrupt: Vec<ChunkHandle>,
    misplaced: Vec<(ChunkHandle, PathBuf)>,
    stats: ScanStats,
    dirty: Dirty,
}

impl Found {
    fn merge(&mut self, mut other: Found, dirty: &mut Dirty) {
        self.loaded.append(&mut other.loaded);
        self.corrupt.append(&mut other.corrupt);
        self.misplaced.append(&mut other.misplaced);
        let (s, o) = (&mut self.stats, other.stats);
        s.replicas += o.replicas;
        s.corrupt += o.corrupt;
        s.ignored += o.ignored;
        s.placed.moved += o.placed.moved;
        s.placed.moved_aside += o.placed.moved_aside;
        s.placed.links_removed += o.placed.links_removed;
        s.placed.duplicates += o.placed.duplicates;
        s.placed.temps_removed += o.placed.temps_removed;
        dirty.merge(&other.dirty);
    }
}

/// One scan thread at work.
struct Part<'a> {
    disk: &'a Arc<Disk>,
    progress: &'a Progress,
    found: Found,
}

impl<'a> Part<'a> {
    fn new(disk: &'a Arc<Disk>, progress: &'a Progress) -> Self {
        Self {
            disk,
            progress,
            found: Found {
                loaded: Vec::new(),
                corrupt: Vec::new(),
                misplaced: Vec::new(),
                stats: ScanStats::default(),
                dirty: Dirty::default(),
            },
        }
    }

    fn done(self) -> Found {
        self.found
    }

    /// Reads subdirectory `index` (see the module docs).
    fn subdir(&mut self, index: usize) -> Result<()> {
        let dir = self.disk.layout.subdir(index);
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io("list", &dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list", &dir, e))?;
            let found = &mut self.found;
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                found.stats.ignored += 1;
                continue;
            }
            match layout::classify(&entry.file_name()) {
                Name::Temp => {
                    let path = entry.path();
                    tracing::info!(path = %path.display(), "removing leftover temporary file");
                    layout::remove_temp(&path)?;
                    found.stats.placed.temps_removed += 1;
                    found.dirty.subdir(index);
                }
                Name::Replica(handle) if layout::subdir_of(handle) == index => {
                    self.load(&entry.path(), handle)?;
                }
                Name::Replica(handle) => found.misplaced.push((handle, entry.path())),
                Name::Aside(_) | Name::Other => found.stats.ignored += 1,
            }
        }
        Ok(())
    }

    /// Loads the replica of `handle` at `path` into the table, or moves it aside.
    fn load(&mut self, path: &Path, handle: ChunkHandle) -> Result<()> {
        let found = &mut self.found;
        match recovery::load_replica(path, handle, self.disk) {
            Ok(r) => {
                tracing::debug!(chunk = %handle, version = %r.header.version, length = r.length, state = ?r.header.state, "replica loaded");
                found
                    .loaded
                    .push((handle, Arc::new(RwLock::new(SlotState::Live(r)))));
                found.stats.replicas += 1;
            }
            Err(e @ Error::Io { .. }) => return Err(e),
            Err(e) => {
                let aside = move_aside(path)?;
                tracing::error!(chunk = %handle, error = %e, moved_to = %aside.display(), "corrupt replica moved aside");
                found.corrupt.push(handle);
                found.stats.corrupt += 1;
            }
        }
        let n = self.progress.loaded.fetch_add(1, Ordering::Relaxed) + 1;
        if n % 4096 == 0 {
            let mut logged = self
                .progress
                .logged
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if logged.elapsed() >= PROGRESS_EVERY {
                *logged = Instant::now();
                tracing::info!(
                    replicas = n,
                    elapsed_s = self.progress.started.elapsed().as_secs(),
                    "scanning replicas"
                );
            }
        }
        Ok(())
    }
}
