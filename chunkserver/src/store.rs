//! The replica store: one file per replica under the data directory (in the
//! subdirectory of its handle, see [`crate::layout`]), the version gate, and every
//! operation on replica data. Opening it scans the directory (`store::scan`, streaming,
//! on [`SCAN_THREADS`] threads) and recovers each replica (`store::recovery`); the
//! replica table is read back in pages for the chunk report ([`Store::report_page`]).
//!
//! A replica holds no descriptor of its own: its file is opened through the store's
//! bounded [`FileCache`] (`--max-open-files`), keyed by the replica instance, so
//! deleting, moving aside or replacing a replica drops its entry (see
//! [`crate::fdcache`]).
//!
//! Each replica sits behind its own `RwLock` (the *per-chunk lock*): every operation
//! takes it, runs the [`gate`](crate::gate::check) against the header version, and
//! performs its I/O while still holding it, so a version bump can never interleave with
//! a write (reads share the lock; writes, bumps, truncates and deletes are exclusive).
//!
//! Durability rules (see [`crate::header`] for the layout):
//! - data that a header's length covers is fdatasynced *before* that header is
//!   written, so a header never claims bytes that are not on disk;
//! - a header that changes the version or the state, or that a truncate or finalize
//!   writes, is the last step of a linked chain ending in an fsync: durable before the
//!   call returns (version bumps, contract 2);
//! - a `sync` packet (hsync) runs `data writes → fdatasync → header(new length)` as
//!   one chain: one device flush. Its data is durable when the ack goes out; its
//!   header is written but becomes durable with the next flush of the file (a later
//!   sync, bump, truncate or finalize). Until then the previous header, whose length
//!   is lower and also covered, is the one on disk: both are correct lower bounds;
//! - other appends only write data and checksum entries;
//! - a small hsync may also write zeros ahead of the data (`pad_range`), so later small
//!   hsyncs overwrite blocks instead of growing the file; the zeros are never data, and
//!   finalize cuts them;
//! - a cut (truncate, or a stream set-up behind the replica's end) writes a *capped*
//!   header first, so a crash in the middle of it cannot bring the cut bytes back
//!   (see `Replica::cut_to`);
//! - every header carries the CRC of its partial last block (its *tail CRC*): the
//!   table entry of that block moves on with later appends and may reach the disk
//!   before their bytes, so after a crash only the header still vouches for it;
//! - at start-up a `Writing` replica's header must be borne out by the data (whole
//!   blocks by the table, the partial block by the tail CRC), or the replica is
//!   corrupt; past the header's length, blocks are checked against the table (cut at
//!   the first block the table does not vouch for, never beyond the file, never past a
//!   capped header's length), and checksum entries and bytes past the recovered length
//!   are dropped. Corrupt replicas, and those whose two header slots are both invalid,
//!   are renamed aside as `.corrupt` and reported, never deleted. A finalized replica
//!   whose file is longer than its length is cut to it.
//!
//! - an overwrite stream writes bytes below the length in place (`store::overwrite`):
//!   before the first in-place write into a 4 MiB region whose *overwrite mark* is
//!   not in a durable header, a header with the mark set is written and flushed (and
//!   while an hsync's header is not durable yet, before an in-place write into bytes
//!   only its sync record vouches for); a torn in-place write in a marked region is
//!   recomputed at start-up instead of called corrupt. The next header written after
//!   a flush of the whole file clears the marks (the stream's end, finalize, bump,
//!   truncate, cut); an hsync's header keeps them.
//!
//! - an hsync's flush also carries a *sync record* (length and tail CRC, see
//!   [`crate::header`]): its header is written after the flush and may not reach the
//!   disk before a power loss, and a later append's checksum entry for the partial
//!   block may; recovery extends a replica past its header to a record's length when
//!   the data bears the record out. Cuts erase the records.

mod digest;
pub use digest::{block_hash, block_hashes};
mod files;
mod incoming;
mod overwrite;
mod recovery;
mod replica;
mod scan;
mod streams;
mod write;

use crate::checksum;
use crate::error::{Error, Result};
use crate::fdcache::{self, FileCache};
use crate::gate;
use crate::header::{Header, BLOCK, DATA_OFFSET, MAX_CHUNK_SIZE};
use crate::io::{IoEngine, IoOp};
use crate::layout::Layout;
use bytes::Bytes;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaReport, ReplicaState, MAX_DATA_LEN};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OwnedRwLockWriteGuard, RwLock};

pub use crate::layout::{sync_dir, CORRUPT_SUFFIX, REPLICA_SUFFIX, TEMP_SUFFIX};
use files::blocking;
pub(crate) use files::move_aside;
pub use files::replace_file;
pub use incoming::Incoming;
use replica::{stale_table_entries, Disk, Replica};
pub use scan::{ScanStats, SCAN_THREADS};
pub use write::{BatchOutcome, PacketWrite, WriteMode};

/// The per-chunk lock and what it protects.
type Slot = RwLock<SlotState>;

enum SlotState {
    /// Inserted by a creator that has not finished yet.
    Creating,
    Live(Replica),
    /// Deleted or moved aside; the slot is no longer in the table.
    Removed,
}

/// The replicas of one data directory.
pub struct Store {
    engine: Arc<dyn IoEngine>,
    /// The layout and the open replica files (every [`Replica`] holds it too).
    disk: Arc<Disk>,
    /// handle → per-chunk lock, in handle order (the chunk report is read from it in
    /// pages). This std mutex is held only to look up, insert or remove entries, or to
    /// copy out one page, never across I/O or an `.await`.
    slots: Mutex<BTreeMap<ChunkHandle, Arc<Slot>>>,
    /// Replicas moved aside as corrupt and not yet reported to the master; drained by
    /// the heartbeat task through [`Store::take_corrupt`].
    corrupt: Mutex<Vec<ChunkHandle>>,
    /// Wakes the heartbeat task when the master should hear about a change soon
    /// (corrupt replica, replica received or deleted).
    changed: Notify,
    /// Bytes appended to a replica between write-behind hints (0: none).
    write_behind: u64,
}

/// Default of [`Store::with_write_behind`].
pub const DEFAULT_WRITE_BEHIND: u64 = 2 << 20;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.disk.layout.root())
            .field("engine", &self.engine.name())
            .field("files", &self.disk.cache)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating if needed) the data directory: puts replica files in their
    /// subdirectories (migrating a flat layout, see [`crate::layout`]), removes leftover
    /// temporary files, loads and verifies every replica header, recovers the length of
    /// replicas that were being written, and moves aside (never deletes) replicas that
    /// fail. The scan streams through the directories (see `store::scan`).
    pub async fn open(dir: &Path, engine: Arc<dyn IoEngine>) -> Result<Store> {
        Ok(Self::open_with_stats(dir, engine).await?.0)
    }

    /// [`Store::open`], also returning what the scan found.
    pub async fn open_with_stats(
        dir: &Path,
        engine: Arc<dyn IoEngine>,
    ) -> Result<(Store, ScanStats)> {
        let sparse = files::holes_work(dir);
        let disk = Arc::new(Disk {
            layout: Layout::new(dir),
            cache: FileCache::new(fdcache::DEFAULT_CAPACITY),
            sparse,
        });
        let scan_disk = disk.clone();
        let started = std::time::Instant::now();
        let scanned = blocking(move || scan::scan(&scan_disk)).await?;
        let stats = scanned.stats;
        tracing::info!(
            dir = %dir.display(),
            replicas = stats.replicas,
            corrupt = stats.corrupt,
            ignored = stats.ignored,
            moved = stats.placed.moved,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "replica store opened"
        );
        let store = Store {
            engine,
            disk,
            slots: Mutex::new(scanned.slots),
            corrupt: Mutex::new(scanned.corrupt),
            changed: Notify::new(),
            write_behind: DEFAULT_WRITE_BEHIND,
        };
        Ok((store, stats))
    }

    /// Starts writing appended data back to disk every `bytes` per replica, without
    /// waiting for it, so the flush at hsync, finalize or a version bump finds little
    /// left to do and the disk works while the stream goes on. 0 turns it off.
    #[must_use]
    pub fn with_write_behind(mut self, bytes: u64) -> Self {
        self.write_behind = bytes;
        self
    }

    /// Keeps at most `max` replica files open (least recently used closed first);
    /// more only while operations in flight still hold evicted ones.
    #[must_use]
    pub fn with_max_open_files(self, max: usize) -> Self {
        self.disk.cache.set_capacity(max);
        self
    }

    /// The most replica files the store keeps open.
    pub fn max_open_files(&self) -> usize {
        self.disk.cache.capacity()
    }

    /// Replica files the store keeps open now (operations in flight may hold more).
    pub fn open_files(&self) -> usize {
        self.disk.cache.open_files()
    }

    /// Replica files reopened by path since the store opened (each one a cache miss:
    /// evicted, or not used since start-up).
    pub fn reopened_files(&self) -> u64 {
        self.disk.cache.reopened()
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.disk.layout.root()
    }

    /// The I/O engine's name.
    pub fn engine_name(&self) -> &'static str {
        self.engine.name()
    }

    /// Where the replica of `handle` lives.
    pub fn replica_path(&self, handle: ChunkHandle) -> PathBuf {
        self.disk.layout.replica_path(handle)
    }

    /// Corrupt replicas found since the last call (for ReportCorrupt).
    pub fn take_corrupt(&self) -> Vec<ChunkHandle> {
        std::mem::take(&mut *lock(&self.corrupt))
    }

    /// Puts back corrupt replicas whose report did not reach the master.
    pub fn requeue_corrupt(&self, handles: Vec<ChunkHandle>) {
        lock(&self.corrupt).extend(handles);
    }

    /// Notified when the master should hear about a change soon.
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    fn slot(&self, handle: ChunkHandle) -> Option<Arc<Slot>> {
        lock(&self.slots).get(&handle).cloned()
    }

    fn slot_or_insert(&self, handle: ChunkHandle) -> Arc<Slot> {
        lock(&self.slots)
            .entry(handle)
            .or_insert_with(|| Arc::new(RwLock::new(SlotState::Creating)))
            .clone()
    }

    /// Removes `slot` from the table if it is still the entry for `handle`.
    fn unlink_slot(&self, handle: ChunkHandle, slot: &Arc<Slot>) {
        let mut slots = lock(&self.slots);
        if slots.get(&handle).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            slots.remove(&handle);
        }
    }

    /// Moves a replica aside as corrupt (caller holds its write lock).
    async fn quarantine(
        &self,
        handle: ChunkHandle,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        why: &Error,
    ) {
        if let SlotState::Live(r) = &*state {
            let path = r.path();
            match blocking(move || move_aside(&path)).await {
                Ok(aside) => {
                    tracing::error!(chunk = %handle, error = %why, moved_to = %aside.display(), "corrupt replica moved aside")
                }
                Err(e) => {
                    tracing::error!(chunk = %handle, error = %why, rename_error = %e, "corrupt replica could not be moved aside; dropping it from the table")
                }
            }
            *state = SlotState::Removed;
            self.unlink_slot(handle, slot);
            lock(&self.corrupt).push(handle);
            self.changed.notify_one();
        }
    }

    /// Takes the write lock of a live replica.
    async fn lock_live(
        &self,
        handle: ChunkHandle,
    ) -> Result<(Arc<Slot>, OwnedRwLockWriteGuard<SlotState>)> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.clone().write_owned().await;
        if !matches!(&*guard, SlotState::Live(_)) {
            return Err(Error::NotFound { handle });
        }
        Ok((slot, guard))
    }

    /// Passes `result` through; a checksum mismatch moves the replica aside first.
    async fn settle<T>(
        &self,
        handle: ChunkHandle,
        slot: &Arc<Slot>,
        state: &mut SlotState,
        result: Result<T>,
    ) -> Result<T> {
        if let Err(e @ Error::ChecksumMismatch { .. }) = &result {
            self.quarantine(handle, slot, state, e).await;
        }
        result
    }

    /// Raises the replica to `version` durably (data fdatasync, then header write +
    /// fsync as one linked chain) and reopens it for append. Creates an empty replica
    /// when `create` is set and none exists. Equal version: idempotent. Lower: refused
    /// like a stale token.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, create))]
    pub async fn bump_version(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        create: bool,
    ) -> Result<ReplicaReport> {
        loop {
            let slot = if create {
                self.slot_or_insert(handle)
            } else {
                self.slot(handle).ok_or(Error::NotFound { handle })?
            };
            let mut guard = slot.write().await;
            match &mut *guard {
                SlotState::Removed if create => continue,
                SlotState::Removed => return Err(Error::NotFound { handle }),
                SlotState::Creating if !create => return Err(Error::NotFound { handle }),
                SlotState::Creating => match self.create_replica(handle, version).await {
                    Ok(r) => {
                        let report = r.report();
                        *guard = SlotState::Live(r);
                        tracing::info!("replica created");
                        return Ok(report);
                    }
                    Err(e) => {
                        *guard = SlotState::Removed;
                        self.unlink_slot(handle, &slot);
                        return Err(e);
                    }
                },
                SlotState::Live(r) => {
                    let current = r.header.version;
                    if version < current {
                        crate::gate::count_fenced();
                        return Err(Error::StaleToken {
                            handle,
                            presented: version,
                            current,
                        });
                    }
                    if version > current {
                        let length = r.length;
                        r.write_header(
                            self.engine.as_ref(),
                            version,
                            ReplicaState::Writing,
                            length,
                            vec![IoOp::SyncData],
                        )
                        .await?;
                        tracing::info!(from = %current, length, "version bumped");
                    }
                    return Ok(r.report());
                }
            }
        }
    }

    async fn create_replica(&self, handle: ChunkHandle, version: ChunkVersion) -> Result<Replica> {
        let path = self.replica_path(handle);
        let tmp = self.disk.layout.create_path(handle);
        let create_tmp = tmp.clone();
        let file = Arc::new(
            blocking(move || {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&create_tmp)
                    .map_err(|e| Error::io("create", &create_tmp, e))
            })
            .await?,
        );
        let header = Header::new(handle, version, ReplicaState::Writing, 0).with_tail(0);
        let io = |op| {
            let tmp = tmp.clone();
            move |e| Error::io(op, tmp, e)
        };
        self.engine
            .set_len(file.clone(), DATA_OFFSET)
            .await
            .map_err(io("size"))?;
        self.engine
            .run(
                file.clone(),
                vec![
                    IoOp::Write {
                        offset: header.slot_offset(),
                        data: Bytes::from(header.encode_head()),
                    },
                    IoOp::SyncAll,
                ],
            )
            .await
            .map_err(io("write header"))?;
        let (src, dst, dir) = (tmp.clone(), path, self.disk.layout.dir_of(handle));
        blocking(move || {
            std::fs::rename(&src, &dst).map_err(|e| Error::io("rename", &src, e))?;
            sync_dir(&dir)
        })
        .await?;
        let id = self.disk.cache.next_id();
        self.disk.cache.insert(id, file);
        Ok(Replica {
            disk: self.disk.clone(),
            id,
            header,
            header_durable: true,
            durable_length: 0,
            length: 0,
            tail_crc: 0,
            behind: 0,
            padded: 0,
        })
    }

    /// Cuts the replica at `version` to `length` (at most its current length) and makes
    /// the length durable.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, length))]
    pub async fn truncate(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    ) -> Result<ReplicaReport> {
        let (slot, mut guard) = self.lock_live(handle).await?;
        let result = match &mut *guard {
            SlotState::Live(r) => r.truncate(self.engine.as_ref(), version, length).await,
            _ => Err(Error::NotFound { handle }),
        };
        self.settle(handle, &slot, &mut guard, result).await
    }

    /// Seals the replica at `version` with `length` (cutting anything beyond it).
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, length))]
    pub async fn finalize(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    ) -> Result<ReplicaReport> {
        let (slot, mut guard) = self.lock_live(handle).await?;
        let result = match &mut *guard {
            SlotState::Live(r) => r.finalize(self.engine.as_ref(), version, length).await,
            _ => Err(Error::NotFound { handle }),
        };
        self.settle(handle, &slot, &mut guard, result).await
    }

    /// Deletes the replica if its version is at most `max_version`; otherwise keeps it
    /// and returns its report. A missing replica is already deleted.
    #[tracing::instrument(skip_all, fields(chunk = %handle, max_version = %max_version))]
    pub async fn delete(
        &self,
        handle: ChunkHandle,
        max_version: ChunkVersion,
    ) -> Result<Option<ReplicaReport>> {
        let Some(slot) = self.slot(handle) else {
            return Ok(None);
        };
        let mut guard = slot.write().await;
        let SlotState::Live(r) = &*guard else {
            return Ok(None);
        };
        if r.header.version > max_version {
            tracing::info!(version = %r.header.version, "replica newer than the deletion bound; kept");
            return Ok(Some(r.report()));
        }
        let (path, dir) = (r.path(), self.disk.layout.dir_of(handle));
        blocking(move || {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove", &path, e)),
            }
            sync_dir(&dir)
        })
        .await?;
        *guard = SlotState::Removed;
        self.unlink_slot(handle, &slot);
        self.changed.notify_one();
        crate::counters::add(&crate::counters::REPLICAS_DELETED, 1);
        tracing::info!("replica deleted");
        Ok(None)
    }

    /// The replica's report, whatever its version.
    pub async fn info(&self, handle: ChunkHandle) -> Result<ReplicaReport> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.read().await;
        match &*guard {
            SlotState::Live(r) => Ok(r.report()),
            _ => Err(Error::NotFound { handle }),
        }
    }

    /// The replica's report, after the gate.
    pub async fn gated_info(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> Result<ReplicaReport> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.read().await;
        match &*guard {
            SlotState::Live(r) => {
                gate::check(handle, version, r.header.version)?;
                Ok(r.report())
            }
            _ => Err(Error::NotFound { handle }),
        }
    }

    /// Reads up to `len` bytes at `offset` (clipped to the replica's length and to
    /// [`MAX_DATA_LEN`]) after the gate, verifying the CRC of every block touched. A
    /// mismatch moves the replica aside and queues a corruption report.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, offset, len))]
    pub async fn read(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
        len: u64,
    ) -> Result<(ReplicaReport, Bytes)> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.read().await;
        let SlotState::Live(r) = &*guard else {
            return Err(Error::NotFound { handle });
        };
        gate::check(handle, version, r.header.version)?;
        let report = r.report();
        if offset >= r.length || len == 0 {
            return Ok((report, Bytes::new()));
        }
        let end = offset
            .saturating_add(len.min(MAX_DATA_LEN as u64))
            .min(r.length);
        let first = checksum::block_of(offset);
        let last = checksum::block_of(end - 1);
        let start = checksum::block_start(first);
        let stop = checksum::block_start(last + 1).min(r.length);
        let engine = self.engine.as_ref();
        let file = r.file().await?;
        let (data, table) = tokio::join!(
            engine.read_at(file, DATA_OFFSET + start, (stop - start) as usize),
            r.read_table(engine, first, last - first + 1)
        );
        let data = data.map_err(|e| Error::io("read", r.path(), e))?;
        let mut table = table?;
        // A partial last block is checked against the CRC the replica holds in memory
        // (the header's tail CRC), never its table entry: a write that failed half-way
        // (ENOSPC after its table write landed) leaves an entry that vouches for bytes
        // past the length, which the next append or start-up recovery rewrites.
        if stop == r.length && r.length % BLOCK != 0 {
            if let Some(last) = table.last_mut() {
                *last = r.tail_crc;
            }
        }
        let bad = if (data.len() as u64) < stop - start {
            Some(checksum::block_start(checksum::block_of(
                start + data.len() as u64,
            )))
        } else {
            checksum::first_mismatch(&data, &table).map(|i| checksum::block_start(first + i as u64))
        };
        if let Some(bad) = bad {
            let id = r.id;
            drop(guard);
            let err = Error::ChecksumMismatch {
                handle,
                offset: bad,
            };
            let mut guard = slot.write().await;
            if matches!(&*guard, SlotState::Live(r) if r.id == id) {
                self.quarantine(handle, &slot, &mut guard, &err).await;
            }
            return Err(err);
        }
        let data = Bytes::from(data).slice((offset - start) as usize..(end - start) as usize);
        Ok((report, data))
    }

    /// Starts receiving a replica of `handle` at `version` (`length` bytes) from
    /// another chunkserver. Refused if this chunkserver already holds that version or a
    /// newer one.
    pub async fn receive(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        length: u64,
    ) -> Result<Incoming> {
        if length > MAX_CHUNK_SIZE {
            return Err(Error::bad_request(format!(
                "replica of {length} bytes exceeds the chunk limit"
            )));
        }
        if let Ok(existing) = self.info(handle).await {
            if existing.version >= version {
                return Err(Error::bad_request(format!(
                    "already holds chunk {handle} at version {}",
                    existing.version
                )));
            }
        }
        let tmp = self.disk.layout.receive_path(handle, rand::random::<u64>());
        let create = tmp.clone();
        let file = blocking(move || {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&create)
                .map_err(|e| Error::io("create", &create, e))?;
            f.set_len(DATA_OFFSET)
                .map_err(|e| Error::io("size", &create, e))?;
            Ok(f)
        })
        .await?;
        Ok(Incoming {
            handle,
            version,
            expected: length,
            file: Arc::new(file),
            tmp,
            received: 0,
            table: checksum::TableRun::at(0, 0),
            engine: self.engine.clone(),
            sparse: self.disk.sparse,
            finished: false,
        })
    }

    /// One page of the full chunk report: the reports of the replicas among the next
    /// `max` (at least 1) entries of the table after handle `after` (from the first
    /// when `None`), in handle order. Only that page's slots are copied out of the
    /// table, so a report of any size costs memory for one page. Pages are no
    /// snapshot: a replica created or deleted while they are read may or may not be
    /// in them (a report may always be late; the master allows for that).
    pub async fn report_page(&self, after: Option<ChunkHandle>, max: usize) -> ReportPage {
        let max = max.max(1);
        let page: Vec<(ChunkHandle, Arc<Slot>)> = {
            let slots = lock(&self.slots);
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            slots
                .range((from, Bound::Unbounded))
                .take(max)
                .map(|(h, s)| (*h, s.clone()))
                .collect()
        };
        let next = (page.len() == max).then(|| page[max - 1].0);
        let mut replicas = Vec::with_capacity(page.len());
        for (_, slot) in page {
            if let SlotState::Live(r) = &*slot.read().await {
                replicas.push(r.report());
            }
        }
        ReportPage { replicas, next }
    }

    /// Reports of every replica, in handle order (read page by page; the whole list is
    /// held, so the chunk report sends pages instead).
    pub async fn reports(&self) -> Vec<ReplicaReport> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = self.report_page(after, REPORT_PAGE).await;
            out.extend(page.replicas);
            match page.next {
                Some(next) => after = Some(next),
                None => return out,
            }
        }
    }

    /// Replicas in the table (those being created included).
    pub fn replica_count(&self) -> u64 {
        lock(&self.slots).len() as u64
    }

    /// Bytes of data of every replica, summed page by page.
    pub async fn replica_bytes(&self) -> u64 {
        let mut total = 0u64;
        let mut after = None;
        loop {
            let page = self.report_page(after, REPORT_PAGE).await;
            total += page.replicas.iter().map(|r| r.length).sum::<u64>();
            match page.next {
                Some(next) => after = Some(next),
                None => return total,
            }
        }
    }
}

/// Replicas per page of the chunk report: 64 Ki reports are 2 MiB in memory and
/// about 1 MiB on the wire (well inside one frame and the master's decode limit).
pub const REPORT_PAGE: usize = 1 << 16;

/// Bytes the replica table holds per replica, before allocator overhead: one entry of
/// the table (handle and pointer) and one slot (the per-chunk lock around the replica's
/// state: header, lengths, cache identity) behind its two reference counts. The
/// start-up scan also holds one such entry per replica in a list before the table is
/// built from it, and nothing else that grows with the replica count.
pub const TABLE_BYTES_PER_REPLICA: usize = std::mem::size_of::<(ChunkHandle, Arc<Slot>)>()
    + 2 * std::mem::size_of::<usize>()
    + std::mem::size_of::<Slot>();

/// See [`Store::report_page`].
#[derive(Debug)]
pub struct ReportPage {
    /// The live replicas of the page, in handle order.
    pub replicas: Vec<ReplicaReport>,
    /// Where the next page starts (after this handle); `None`: this was the last.
    pub next: Option<ChunkHandle>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short critical sections leaves plain data
    // (a map, a list) that is still consistent, so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
