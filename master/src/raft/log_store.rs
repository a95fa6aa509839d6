//! The group's log on disk: openraft's `RaftLogStorage` over segment files, with the
//! operation log's framing and its zeros written ahead.
//!
//! ```text
//! DIR/log.<first index, 20 digits>  "STMPRLG1" | header | record*
//!     header := has_prev u8 | prev term u64be | prev node u64be | prev index u64be | crc32
//!     record := len:u32be | crc:u32be | index:u64be | bincode(EntryDisk)   (oplog framing)
//! DIR/vote        the vote (disk.rs), replaced through a temp file, fsynced
//! DIR/committed   the last committed log id, overwritten in place, never fsynced
//! ```
//!
//! **Appends** ([`LogStore::append`] through openraft) write every entry of a call with one
//! `pwrite` and one `fdatasync` over zeros written ahead, as the operation log does
//! (`oplog.rs`, "Records overwrite zeros"), and only then tell openraft the entries are
//! flushed. A segment past [`SEGMENT_BYTES`] is sealed (its zeros cut) and the next one
//! starts with the log id before its first entry.
//!
//! **Truncation** (a follower's conflicting, uncommitted tail) deletes whole later
//! segments newest first, then cuts the segment holding the first removed entry and
//! syncs it, so after a crash at any point the log is a prefix of what it was: never a
//! log with a gap, and the truncation is simply redone or not needed.
//!
//! **Purging** (after a snapshot) deletes whole segments whose entries are all at or
//! below the purge point, never the newest one. Entries up to the purge point that
//! remain in a kept segment are no longer served. After a restart the purge point is the
//! oldest kept segment's previous log id, which is at or below the one openraft asked
//! for: the entries past it are still there.
//!
//! **Opening** ([`LogStore::open`]) reads every segment: the records must be
//! contiguous, each segment's previous log id must be the last entry before it, and
//! damage is an error, except in the newest segment, whose torn tail (a crash in the
//! middle of an append that was never acknowledged) is cut and whose zeros are kept for
//! appending; a newest segment whose header was never written is removed.
//!
//! *Known limit* (the operation log's too): a damaged record inside the newest segment
//! is taken for a torn tail, and the records after it are cut with it. An append writes
//! all its entries with one `pwrite`, whose sectors may reach the disk in any order, so
//! a valid record after a bad one does not prove damage; telling the two apart needs
//! the extent of the last append on disk, which this format does not keep.

use super::disk::{self, encode_entry};
use super::{Entry, NodeId, TypeConfig};
use crate::error::{Error, Result};
use crate::oplog::zeros::ZeroAhead;
use crate::oplog::{encode_record, lock, sync_dir};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{AnyError, LogId, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote};
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

mod segment;
use segment::{
    decode_log_id, encode_log_id, list_segments, scan, segment_header, segment_name, Rec, Seg,
};
pub use segment::{SEGMENT_BYTES, SEGMENT_MAGIC};

const VOTE_FILE: &str = "vote";
const VOTE_TMP: &str = "vote.tmp";
const COMMITTED_FILE: &str = "committed";
/// The committed file: flag, term, node, index, CRC.
const COMMITTED_LEN: usize = 1 + 24 + 4;

/// The group's log. Clones share it: openraft's log reader is a clone.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
    /// Appends written, one `fdatasync` each (kept outside the lock for readers).
    appends: Arc<AtomicU64>,
    timings: crate::oplog::LogTimings,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("LogStore")
            .field("dir", &inner.dir)
            .field("segments", &inner.segs.len())
            .field("last", &inner.last_log_id())
            .finish()
    }
}

struct Inner {
    dir: PathBuf,
    /// Oldest first; never empty once open. The last one is appended to.
    segs: Vec<Seg>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    /// Entries up to here are not served (openraft purged them).
    purged: Option<LogId<NodeId>>,
    /// A segment holding this many bytes is sealed before the next append.
    segment_bytes: u64,
    /// The commit point's file, kept open once written.
    committed_file: Option<File>,
    /// Set by [`LogStore::halt`]: every later write is refused.
    halted: bool,
}

impl Inner {
    /// Refuses writes once the log is halted.
    fn writable(&self) -> Result<()> {
        if self.halted {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.segs.last().and_then(Seg::last_log_id)
    }

    fn active(&mut self) -> Result<&mut Seg> {
        self.segs.last_mut().ok_or_else(|| Error::Codec {
            reason: "the group log has no segment".into(),
        })
    }

    /// Creates the segment whose first entry is `first`, after `prev` (`None`: not
    /// known, for the oldest segment only): header and zeros, durable, and its
    /// directory entry too.
    fn create_segment(&mut self, first: u64, prev: Option<LogId<NodeId>>) -> Result<()> {
        let path = self.dir.join(segment_name(first));
        let z = ZeroAhead::create(&self.dir, path, &segment_header(prev))?;
        let seg = Seg {
            z,
            first,
            prev,
            recs: Vec::new(),
        };
        self.segs.push(seg);
        Ok(())
    }

    /// Deletes a segment file durably (the directory synced before the next step).
    fn remove_segment(&self, s: &Seg) -> Result<()> {
        std::fs::remove_file(&s.z.path).map_err(s.z.io("remove"))?;
        sync_dir(&self.dir)
    }

    /// The segment and position of entry `index`, if it is held.
    fn locate(&self, index: u64) -> Option<(usize, usize)> {
        let s = self
            .segs
            .partition_point(|s| s.first <= index)
            .checked_sub(1)?;
        let i = usize::try_from(index - self.segs[s].first).ok()?;
        (i < self.segs[s].recs.len()).then_some((s, i))
    }

    fn append(&mut self, entries: Vec<Entry>) -> Result<()> {
        self.writable()?;
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let expected = first.log_id.index;
        let live = match (self.last_log_id(), self.purged) {
            (Some(l), Some(p)) => (l.index > p.index).then_some(l),
            (l, None) => l,
            (None, Some(_)) => None,
        };
        match live {
            // Entries follow the last one held.
            Some(l) if l.index + 1 != expected => {
                return Err(Error::Codec {
                    reason: format!("append of entry {expected} where {} belongs", l.index + 1),
                });
            }
            Some(_) => {}
            // Nothing held past the purge point: the log may start anywhere (a log
            // that starts after a snapshot; openraft's start-up purges up to what the
            // state machine applied even where the log holds nothing).
            None => {
                let fits = self
                    .segs
                    .last()
                    .is_some_and(|a| a.first + a.recs.len() as u64 == expected);
                if !fits {
                    // The old segments (nothing live in them) go first, each durably,
                    // newest first; then a new segment. A crash in between leaves a
                    // shorter log or none, never segments that do not follow one
                    // another.
                    let prev = self
                        .purged
                        .filter(|p| p.index.checked_add(1) == Some(expected));
                    while let Some(s) = self.segs.pop() {
                        self.remove_segment(&s)?;
                    }
                    self.create_segment(expected, prev)?;
                }
            }
        }
        let segment_bytes = self.segment_bytes;
        let full = {
            let a = self.active()?;
            !a.recs.is_empty() && a.z.pos >= segment_bytes
        };
        if full {
            let prev = self.last_log_id();
            self.active()?.z.seal()?;
            let first = prev.map_or(0, |p| p.index + 1);
            self.create_segment(first, prev)?;
        }
        let a = self.active()?;
        let mut buf = Vec::new();
        let mut recs = Vec::with_capacity(entries.len());
        for (n, e) in entries.iter().enumerate() {
            if e.log_id.index != expected + n as u64 {
                return Err(Error::Codec {
                    reason: format!("entries out of order at {}", e.log_id.index),
                });
            }
            let framed = encode_record(e.log_id.index, &encode_entry(e)?)?;
            recs.push(Rec {
                offset: a.z.pos + buf.len() as u64,
                len: framed.len() as u32,
                log_id: e.log_id,
            });
            buf.extend_from_slice(&framed);
        }
        a.z.write_durably(&buf)?;
        a.recs.extend(recs);
        Ok(())
    }

    fn truncate(&mut self, since: u64) -> Result<()> {
        self.writable()?;
        if self.last_log_id().is_none_or(|l| l.index < since) {
            return Ok(());
        }
        if self.segs.first().is_some_and(|s| s.first > since) {
            return Err(Error::Codec {
                reason: format!("truncate from {since}, before the oldest entry held"),
            });
        }
        // Newest first, each durably, so the log stays a prefix of what it was at
        // every step (deletions synced together may land in any order).
        while self.segs.len() > 1 && self.segs.last().is_some_and(|s| s.first > since) {
            if let Some(s) = self.segs.pop() {
                self.remove_segment(&s)?;
            }
        }
        let a = self.active()?;
        let at = match usize::try_from(since - a.first)
            .ok()
            .and_then(|i| a.recs.get(i))
        {
            Some(r) => r.offset,
            None => return Ok(()),
        };
        a.cut(at)
    }

    fn purge(&mut self, upto: LogId<NodeId>) -> Result<()> {
        self.writable()?;
        if self.purged.is_none_or(|p| p.index < upto.index) {
            self.purged = Some(upto);
        }
        // Oldest first, each durably: a crash leaves the log starting later, never a
        // gap between the segments left.
        while self.segs.len() > 1
            && self.segs[0]
                .last_log_id()
                .is_some_and(|l| l.index <= upto.index)
        {
            let s = self.segs.remove(0);
            self.remove_segment(&s)?;
        }
        Ok(())
    }

    /// Entries from `start` below `end` (`None`: to the last), those not purged.
    fn entries(&self, start: u64, end: Option<u64>) -> Result<Vec<Entry>> {
        let oldest = self.segs.first().map_or(0, |s| s.first);
        let start = start
            .max(self.purged.map_or(0, |p| p.index + 1))
            .max(oldest);
        let mut out = Vec::new();
        let mut index = start;
        while end.is_none_or(|e| index < e) {
            let Some((s, i)) = self.locate(index) else {
                break;
            };
            out.push(self.segs[s].read(i)?);
            index += 1;
        }
        Ok(out)
    }

    fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<()> {
        self.writable()?;
        let tmp = self.dir.join(VOTE_TMP);
        let path = self.dir.join(VOTE_FILE);
        let io = |e| Error::io(format!("save the vote in {}", path.display()), e);
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(&disk::encode_vote(vote)).map_err(io)?;
        f.sync_all().map_err(io)?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        sync_dir(&self.dir)?;
        self.vote = Some(*vote);
        Ok(())
    }

    fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> Result<()> {
        self.writable()?;
        let mut b = [0u8; COMMITTED_LEN];
        b[..25].copy_from_slice(&encode_log_id(committed));
        let crc = crc32fast::hash(&b[..25]);
        b[25..].copy_from_slice(&crc.to_be_bytes());
        let path = self.dir.join(COMMITTED_FILE);
        let io = |e| Error::io(format!("write {}", path.display()), e);
        if self.committed_file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io)?;
            self.committed_file = Some(f);
        }
        // Overwritten in place (no truncation, no new blocks: it is written at every
        // commit) and not synced: a value lost in a crash only makes the next start
        // apply less before it learns the commit point again.
        if let Some(f) = &self.committed_file {
            f.write_all_at(&b, 0).map_err(io)?;
        }
        self.committed = committed;
        Ok(())
    }
}

/// Reads the committed file; `None` when missing or damaged (it is never synced).
fn read_committed(dir: &Path) -> Option<LogId<NodeId>> {
    let b = std::fs::read(dir.join(COMMITTED_FILE)).ok()?;
    if b.len() != COMMITTED_LEN {
        return None;
    }
    let crc = u32::from_be_bytes([b[25], b[26], b[27], b[28]]);
    if crc32fast::hash(&b[..25]) != crc {
        return None;
    }
    let mut id = [0u8; 25];
    id.copy_from_slice(&b[..25]);
    decode_log_id(&id).ok().flatten()
}

impl LogStore {
    /// Opens the log in `dir` (created empty if missing): reads the vote, the committed
    /// log id and every segment (see the module doc for what is checked and repaired).
    pub fn open(dir: &Path) -> Result<LogStore> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    /// [`LogStore::open`] with segments sealed at `segment_bytes` (tests rotate small).
    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<LogStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("create {}", dir.display()), e))?;
        let vote = match std::fs::read(dir.join(VOTE_FILE)) {
            Ok(b) => Some(disk::decode_vote(&b).map_err(|e| Error::CorruptLog {
                path: dir.join(VOTE_FILE),
                offset: 0,
                reason: e.to_string(),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("read the vote in {}", dir.display()), e)),
        };
        let mut inner = Inner {
            dir: dir.to_path_buf(),
            segs: Vec::new(),
            vote,
            committed: read_committed(dir),
            purged: None,
            segment_bytes,
            committed_file: None,
            halted: false,
        };
        let found = list_segments(dir)?;
        let n = found.len();
        for (k, (first, path)) in found.into_iter().enumerate() {
            let newest = k + 1 == n;
            let mut s = scan(&path, first)?;
            if let Some(reason) = &s.torn {
                if !newest {
                    return Err(Error::CorruptLog {
                        path,
                        offset: s.good,
                        reason: reason.clone(),
                    });
                }
                if s.good == 0 {
                    // A crash while the segment was being created: nothing in it.
                    tracing::warn!(path = %path.display(), "removing a group log segment whose header was cut short");
                    std::fs::remove_file(&path)
                        .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
                    sync_dir(dir)?;
                    continue;
                }
                tracing::warn!(path = %path.display(), at = s.good, reason, "cutting a torn tail off the group log");
            }
            let expected = inner.last_log_id();
            if let Some(before) = inner.segs.last() {
                if s.prev != expected {
                    return Err(Error::CorruptLog {
                        path,
                        offset: 8,
                        reason: format!(
                            "follows {:?}, but the segment before ({}) ends at {expected:?}",
                            s.prev,
                            before.z.path.display()
                        ),
                    });
                }
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
            let size = file
                .metadata()
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
                .len();
            let mut seg = Seg {
                z: ZeroAhead {
                    path,
                    file,
                    pos: s.good,
                    allocated: size,
                },
                first,
                prev: s.prev,
                recs: std::mem::take(&mut s.recs),
            };
            if s.torn.is_some() {
                seg.cut(s.good)?;
            }
            inner.segs.push(seg);
        }
        if inner.segs.is_empty() {
            inner.create_segment(0, None)?;
        }
        inner.purged = inner.segs.first().and_then(|s| s.prev);
        Ok(LogStore {
            inner: Arc::new(Mutex::new(inner)),
            appends: Arc::new(AtomicU64::new(0)),
            timings: crate::oplog::LogTimings::default(),
        })
    }
}

impl LogStore {
    /// Entries from `start` below `end` (`None`: to the last), those not purged, read
    /// from the files (for replay at start and for building snapshots).
    pub fn read_entries(&self, start: u64, end: Option<u64>) -> Result<Vec<Entry>> {
        lock(&self.inner).entries(start, end)
    }

    /// The commit point openraft saved last (not synced: it may lag behind).
    pub fn committed(&self) -> Option<LogId<NodeId>> {
        lock(&self.inner).committed
    }

    /// Saves `vote` durably (forming a group writes its first vote this way).
    pub fn write_vote(&self, vote: &Vote<NodeId>) -> Result<()> {
        lock(&self.inner).save_vote(vote)
    }

    /// Refuses every write from now on, once the write in progress (if any) is done:
    /// a master that stops (or crashes in a test) leaves its directory untouched after
    /// this returns.
    pub fn halt(&self) {
        lock(&self.inner).halted = true;
    }

    /// The histograms of its durable appends (shared).
    pub fn timings(&self) -> crate::oplog::LogTimings {
        self.timings.clone()
    }

    /// Appends written so far by this process, each with one `fdatasync`.
    pub fn appends(&self) -> u64 {
        self.appends.load(Ordering::Relaxed)
    }
}

fn write_err(e: Error) -> StorageError<NodeId> {
    StorageIOError::write_logs(AnyError::error(e)).into()
}

fn read_err(e: Error) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::error(e)).into()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> std::result::Result<Vec<Entry>, StorageError<NodeId>> {
        let start = match range.start_bound() {
            Bound::Included(s) => *s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(e) => Some(e.saturating_add(1)),
            Bound::Excluded(e) => Some(*e),
            Bound::Unbounded => None,
        };
        lock(&self.inner).entries(start, end).map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(
        &mut self,
    ) -> std::result::Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = lock(&self.inner);
        let purged = inner.purged;
        let last = match (inner.last_log_id(), purged) {
            (Some(l), Some(p)) if p.index > l.index => Some(p),
            (l, p) => l.or(p),
        };
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(
        &mut self,
        vote: &Vote<NodeId>,
    ) -> std::result::Result<(), StorageError<NodeId>> {
        lock(&self.inner)
            .save_vote(vote)
            .map_err(|e| StorageIOError::write_vote(AnyError::error(e)).into())
    }

    async fn read_vote(
        &mut self,
    ) -> std::result::Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(lock(&self.inner).vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> std::result::Result<(), StorageError<NodeId>> {
        lock(&self.inner)
            .save_committed(committed)
            .map_err(write_err)
    }

    async fn read_committed(
        &mut self,
    ) -> std::result::Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(lock(&self.inner).committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> std::result::Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let count = entries.len() as u64;
        let started = std::time::Instant::now();
        let res = lock(&self.inner).append(entries);
        self.timings.observe(count, started.elapsed());
        match res {
            Ok(()) => {
                self.appends.fetch_add(1, Ordering::Relaxed);
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(write_err(e))
            }
        }
    }

    async fn truncate(
        &mut self,
        log_id: LogId<NodeId>,
    ) -> std::result::Result<(), StorageError<NodeId>> {
        lock(&self.inner).truncate(log_id.index).map_err(write_err)
    }

    async fn purge(
        &mut self,
        log_id: LogId<NodeId>,
    ) -> std::result::Result<(), StorageError<NodeId>> {
        lock(&self.inner).purge(log_id).map_err(write_err)
    }
}

#[cfg(test)]
mod tests;
