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
//! - an hsync's flush also carries a *sync record* (length and tail CRC, see
//!   [`crate::header`]): its header is written after the flush and may not reach the
//!   disk before a power loss, and a later append's checksum entry for the partial
//!   block may; recovery extends a replica past its header to a record's length when
//!   the data bears the record out. Cuts erase the records.

mod recovery;
mod scan;

use crate::checksum;
use crate::error::{Error, Result};
use crate::fdcache::{self, FileCache, FileId};
use crate::gate;
use crate::header::{
    self, Header, SyncRecord, BLOCK, DATA_OFFSET, MAX_CHUNK_SIZE, RECORD_LEN, TABLE_LEN,
};
use crate::io::{IoEngine, IoOp};
use crate::layout::Layout;
use bytes::Bytes;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaReport, ReplicaState, MAX_DATA_LEN};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, OwnedRwLockWriteGuard, RwLock};

pub use crate::layout::{sync_dir, CORRUPT_SUFFIX, REPLICA_SUFFIX, TEMP_SUFFIX};
pub use scan::{ScanStats, SCAN_THREADS};

/// The per-chunk lock and what it protects.
type Slot = RwLock<SlotState>;

enum SlotState {
    /// Inserted by a creator that has not finished yet.
    Creating,
    Live(Replica),
    /// Deleted or moved aside; the slot is no longer in the table.
    Removed,
}

/// Where a store's replica files are and which of them are open; shared by the store
/// and every replica, so a replica keeps neither a path nor a descriptor of its own.
#[derive(Debug)]
struct Disk {
    layout: Layout,
    /// The replica files kept open (bounded); each replica's entry is keyed by its id.
    cache: FileCache,
}

/// One replica in memory. Its file is opened through the store's [`FileCache`]
/// (see [`Replica::file`]); dropping the replica drops its cache entry. Its path is
/// its handle's in the [`Layout`].
#[derive(Debug)]
struct Replica {
    disk: Arc<Disk>,
    /// This replica instance's identity in the cache: a new one whenever the file at
    /// its path may be a different inode (load, creation, a received copy renamed in).
    id: FileId,
    /// The last header written.
    header: Header,
    /// Whether `header` is known durable (false after an hsync header, which rides on
    /// the next flush).
    header_durable: bool,
    /// Bytes of data; at least `header.length`, more after appends not yet synced.
    length: u64,
    /// CRC of the partial last block (`length % BLOCK` bytes); 0 when block aligned.
    tail_crc: u32,
    /// Data below this offset was synced or handed to write-behind already.
    behind: u64,
    /// Data-region bytes the file holds (its size less [`DATA_OFFSET`]): at least
    /// `length`, more when zeros were written ahead for small hsyncs (see
    /// [`pad_range`]).
    padded: u64,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.disk.cache.forget(self.id);
    }
}

impl Replica {
    /// Where the replica's file is.
    fn path(&self) -> PathBuf {
        self.disk.layout.replica_path(self.header.handle)
    }

    /// The replica's open file (cached, or reopened at its path).
    async fn file(&self) -> Result<Arc<File>> {
        self.disk.cache.get_or_open(self.id, || self.path()).await
    }

    fn report(&self) -> ReplicaReport {
        ReplicaReport {
            handle: self.header.handle,
            version: self.header.version,
            length: self.length,
            state: self.header.state,
        }
    }

    fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |e| Error::io(op, self.path(), e)
    }

    /// Writes the next header after `pre`, then fsyncs, as one linked chain.
    async fn write_header(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        state: ReplicaState,
        length: u64,
        pre: Vec<IoOp>,
    ) -> Result<()> {
        debug_assert_eq!(length, self.length, "a header's tail CRC is the replica's");
        let next = self
            .header
            .next(version, state, length)
            .with_tail(self.tail_crc);
        self.write_next_header(engine, next, pre).await
    }

    /// Writes `next` (the header after the current one) after `pre`, then fsyncs.
    async fn write_next_header(
        &mut self,
        engine: &dyn IoEngine,
        next: Header,
        mut pre: Vec<IoOp>,
    ) -> Result<()> {
        pre.push(IoOp::Write {
            offset: next.slot_offset(),
            data: Bytes::from(next.encode_head()),
        });
        pre.push(IoOp::SyncAll);
        engine
            .run(self.file().await?, pre)
            .await
            .map_err(self.io("write header"))?;
        self.header = next;
        self.header_durable = true;
        Ok(())
    }

    /// hsync: runs `pre` (data and checksum writes), fdatasync, then writes a header
    /// holding `length` and its tail CRC `tail` without flushing it again (see the
    /// module's durability rules): one device flush per hsync instead of two.
    async fn sync_data_then_header(
        &mut self,
        engine: &dyn IoEngine,
        length: u64,
        tail: u32,
        mut pre: Vec<IoOp>,
    ) -> Result<()> {
        let next = self
            .header
            .next(self.header.version, ReplicaState::Writing, length)
            .with_tail(tail);
        let pad = pad_range(self.header.length, length, self.padded);
        if let Some((from, to)) = pad {
            pre.push(IoOp::Write {
                offset: DATA_OFFSET + from,
                data: Bytes::from_static(&ZEROS[..(to - from) as usize]),
            });
        }
        // Inside this flush: what it makes durable, for recovery should the header
        // (written after the flush) not reach the disk.
        let record = SyncRecord {
            handle: next.handle,
            version: next.version,
            length,
            seq: next.seq,
            tail_crc: tail,
        };
        pre.push(IoOp::Write {
            offset: SyncRecord::offset(next.seq),
            data: Bytes::copy_from_slice(&record.encode()),
        });
        pre.push(IoOp::SyncData);
        pre.push(IoOp::Write {
            offset: next.slot_offset(),
            data: Bytes::from(next.encode_head()),
        });
        engine
            .run(self.file().await?, pre)
            .await
            .map_err(self.io("sync"))?;
        self.header = next;
        self.header_durable = false;
        self.behind = self.behind.max(length);
        if let Some((_, to)) = pad {
            self.padded = self.padded.max(to);
        }
        Ok(())
    }

    /// Reads checksum entries `first..first + count`.
    async fn read_table(&self, engine: &dyn IoEngine, first: u64, count: u64) -> Result<Vec<u32>> {
        let bytes = engine
            .read_at(
                self.file().await?,
                header::table_entry_offset(first),
                (count * 4) as usize,
            )
            .await
            .map_err(self.io("read checksums"))?;
        if bytes.len() as u64 != count * 4 {
            return Err(Error::CorruptHeader {
                reason: format!(
                    "{} is shorter than its checksum table",
                    self.path().display()
                ),
            });
        }
        Ok(checksum::parse_table(&bytes))
    }

    /// Reads block `block`'s bytes present in the replica (up to `self.length`) and
    /// verifies them against its checksum.
    async fn read_verified_block(&self, engine: &dyn IoEngine, block: u64) -> Result<Vec<u8>> {
        let start = checksum::block_start(block);
        let end = (start + BLOCK).min(self.length);
        let data = engine
            .read_at(
                self.file().await?,
                DATA_OFFSET + start,
                (end - start) as usize,
            )
            .await
            .map_err(self.io("read"))?;
        let stored = if end == self.length && self.length % BLOCK != 0 {
            self.tail_crc
        } else {
            self.read_table(engine, block, 1).await?[0]
        };
        if data.len() as u64 != end - start || crc32fast::hash(&data) != stored {
            return Err(Error::ChecksumMismatch {
                handle: self.header.handle,
                offset: start,
            });
        }
        Ok(data)
    }

    /// Cuts the data to `length` (< `self.length`), durably, in three flushed steps:
    /// 1. data sync, then a *capped* header with the new length + fsync: from here on
    ///    start-up recovery stops at `length` even though the cut bytes and their
    ///    checksums are still in the file;
    /// 2. the cut block's checksum and every later table entry zeroed, fdatasync, then
    ///    ftruncate, fsync: the cut bytes are gone (the table first, so that no entry
    ///    ever vouches for bytes the truncate removed);
    /// 3. the same header uncapped + fsync, so that hsyncs past `length` are recovered
    ///    again.
    ///
    /// A crash between any two steps leaves exactly `length` bytes after recovery.
    async fn cut_to(&mut self, engine: &dyn IoEngine, length: u64) -> Result<()> {
        let in_block = length % BLOCK;
        let new_tail = if in_block == 0 {
            0
        } else {
            let block = checksum::block_of(length);
            let data = self.read_verified_block(engine, block).await?;
            crc32fast::hash(&data[..in_block as usize])
        };
        let (version, state) = (self.header.version, self.header.state);
        let capped = self
            .header
            .next(version, state, length)
            .with_tail(new_tail)
            .capped();
        self.write_next_header(engine, capped, vec![IoOp::SyncData])
            .await?;
        if let Some((offset, entries)) = stale_table_entries(length, new_tail) {
            engine
                .run(
                    self.file().await?,
                    // Synced before the truncate: a truncate that reached the disk
                    // ahead of the table would leave an entry vouching for bytes
                    // that are gone, and the replica would look corrupt.
                    vec![
                        IoOp::Write {
                            offset,
                            data: Bytes::from(entries),
                        },
                        IoOp::Write {
                            offset: SyncRecord::offset(0),
                            data: Bytes::from_static(&[0; RECORD_LEN]),
                        },
                        IoOp::Write {
                            offset: SyncRecord::offset(1),
                            data: Bytes::from_static(&[0; RECORD_LEN]),
                        },
                        IoOp::SyncData,
                    ],
                )
                .await
                .map_err(self.io("write checksums"))?;
        }
        let file = self.file().await?;
        engine
            .set_len(file.clone(), DATA_OFFSET + length)
            .await
            .map_err(self.io("truncate"))?;
        engine
            .run(file, vec![IoOp::SyncAll])
            .await
            .map_err(self.io("fsync"))?;
        self.length = length;
        self.tail_crc = new_tail;
        self.behind = self.behind.min(length);
        self.padded = length;
        self.write_header(engine, version, state, length, Vec::new())
            .await
    }

    /// Truncate under the lock (see [`Store::truncate`]).
    async fn truncate(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        length: u64,
    ) -> Result<ReplicaReport> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if length > self.length {
            return Err(Error::bad_request(format!(
                "cannot truncate chunk {handle} to {length}: it holds {} bytes",
                self.length
            )));
        }
        if length < self.length {
            self.cut_to(engine, length).await?;
        } else {
            let state = self.header.state;
            self.persist_length(engine, state).await?;
        }
        tracing::info!("replica truncated");
        Ok(self.report())
    }

    /// Finalize under the lock (see [`Store::finalize`]).
    async fn finalize(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        length: u64,
    ) -> Result<ReplicaReport> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if self.header.state == ReplicaState::Finalized {
            if length == self.length {
                return Ok(self.report());
            }
            return Err(Error::bad_request(format!(
                "chunk {handle} is already finalized at {} bytes, not {length}",
                self.length
            )));
        }
        if length > self.length {
            return Err(Error::bad_request(format!(
                "cannot finalize chunk {handle} at {length}: it holds {} bytes",
                self.length
            )));
        }
        if length < self.length {
            self.cut_to(engine, length).await?;
        }
        self.persist_length(engine, ReplicaState::Finalized).await?;
        // Drop bytes beyond the final length that a recovery left in the file.
        let file = self.file().await?;
        let file_len = file.metadata().map_err(self.io("stat"))?.len();
        if file_len > DATA_OFFSET + self.length {
            engine
                .set_len(file.clone(), DATA_OFFSET + self.length)
                .await
                .map_err(self.io("truncate"))?;
            engine
                .run(file, vec![IoOp::SyncAll])
                .await
                .map_err(self.io("fsync"))?;
        }
        self.padded = self.length;
        tracing::info!("replica finalized");
        Ok(self.report())
    }

    /// Stream set-up under the lock (see [`Store::open_for_write`]).
    async fn open_for_write(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        offset: u64,
    ) -> Result<ReplicaReport> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if self.header.state != ReplicaState::Writing {
            return Err(Error::bad_request(format!(
                "chunk {handle} is finalized; a write needs a version bump first"
            )));
        }
        if offset > self.length {
            return Err(Error::bad_request(format!(
                "write at {offset} is not contiguous: chunk {handle} holds {} bytes",
                self.length
            )));
        }
        if offset < self.length {
            tracing::info!(
                from = self.length,
                to = offset,
                "cutting the unacknowledged tail"
            );
            self.cut_to(engine, offset).await?;
        }
        Ok(self.report())
    }

    /// The checks every packet passes under the lock before it is written: the version
    /// gate, the replica still open for writing, the chunk limit, no gap after
    /// `length` (the replica's length including packets planned before this one).
    fn check_write(&self, version: ChunkVersion, offset: u64, len: u64, length: u64) -> Result<()> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if self.header.state != ReplicaState::Writing {
            return Err(Error::bad_request(format!("chunk {handle} is finalized")));
        }
        let end = offset.saturating_add(len);
        if end > MAX_CHUNK_SIZE {
            return Err(Error::bad_request(format!(
                "write ending at {end} exceeds the chunk limit of {MAX_CHUNK_SIZE} bytes"
            )));
        }
        if offset > length {
            return Err(Error::bad_request(format!(
                "write at {offset} is not contiguous: chunk {handle} holds {length} bytes"
            )));
        }
        Ok(())
    }

    /// Packets in order under one hold of the lock (see [`Store::write_batch`]). Each
    /// packet is checked (gate included) in turn; contiguous appends are planned into
    /// one vectored data write plus one checksum-table write, issued as one chain, and
    /// when any packet asks for `sync` the chain ends with fdatasync, then the header
    /// (holding the new length) and fsync.
    ///
    /// Also returns a write-behind hint once `write_behind` bytes (if not zero) have
    /// been appended since the last hint or sync, for the caller to run unawaited.
    async fn write_batch(
        &mut self,
        engine: &dyn IoEngine,
        packets: Vec<PacketWrite>,
        write_behind: u64,
    ) -> (BatchOutcome, Option<IoOp>) {
        let outcome = self.write_packets(engine, packets).await;
        let hint = if write_behind > 0 && self.length >= self.behind.saturating_add(write_behind) {
            let op = IoOp::WriteBehind {
                offset: DATA_OFFSET + self.behind,
                len: self.length - self.behind,
            };
            self.behind = self.length;
            Some(op)
        } else {
            None
        };
        (outcome, hint)
    }

    async fn write_packets(
        &mut self,
        engine: &dyn IoEngine,
        packets: Vec<PacketWrite>,
    ) -> BatchOutcome {
        let mut lengths = Vec::with_capacity(packets.len());
        // Lengths of the packets planned in `run` (applied once it is issued).
        let mut planned = Vec::with_capacity(packets.len());
        let mut run = AppendRun::new(self.length, self.tail_crc);
        let mut sync = false;
        let mut failure = None;
        for p in packets {
            let len = p.data.len() as u64;
            if let Err(e) = self.check_write(p.version, p.offset, len, run.length) {
                failure = Some(e);
                break;
            }
            let end = p.offset + len;
            if end <= run.length {
                // Bytes already present (or planned): an idempotent retry.
                sync |= p.sync;
                planned.push(run.length);
                continue;
            }
            if p.offset == run.length {
                run.push(p.data, p.crc);
                sync |= p.sync;
                planned.push(run.length);
                continue;
            }
            // Overlaps the end (a resend after recovery): issue what is planned, then
            // take the general path for this packet.
            if let Err(e) = self.issue(engine, &mut run, sync).await {
                return BatchOutcome {
                    lengths,
                    error: Some(e),
                };
            }
            lengths.append(&mut planned);
            sync = false;
            match self
                .write(engine, p.version, p.offset, p.data, p.sync)
                .await
            {
                Ok(l) => lengths.push(l),
                Err(e) => {
                    return BatchOutcome {
                        lengths,
                        error: Some(e),
                    }
                }
            }
            run = AppendRun::new(self.length, self.tail_crc);
        }
        match self.issue(engine, &mut run, sync).await {
            Ok(()) => lengths.append(&mut planned),
            Err(e) => failure = Some(e),
        }
        BatchOutcome {
            lengths,
            error: failure,
        }
    }

    /// Runs a chain of data and table writes.
    async fn run_ops(&self, engine: &dyn IoEngine, ops: Vec<IoOp>) -> Result<()> {
        engine
            .run(self.file().await?, ops)
            .await
            .map_err(|e| Error::io("write", self.path(), e))
    }

    /// After a write chain failed part-way (ENOSPC, EIO): its data and table writes
    /// may have landed past the replica's length, which did not move. The table entry
    /// of the partial last block is put back to the replica's tail CRC and later
    /// entries are zeroed, so no entry vouches for bytes the replica does not count
    /// (reads already check the partial block against the tail CRC, and start-up
    /// recovery repairs the table too; this keeps the file honest for both). Best
    /// effort: a failure here is logged, the write's own error is what the caller gets.
    async fn forget_failed_write(&mut self, engine: &dyn IoEngine) {
        let Some((offset, entries)) = stale_table_entries(self.length, self.tail_crc) else {
            return;
        };
        let file = match self.file().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reopen the replica to repair its table");
                return;
            }
        };
        let ops = vec![IoOp::Write {
            offset,
            data: Bytes::from(entries),
        }];
        if let Err(e) = engine.run(file, ops).await {
            tracing::warn!(error = %e, length = self.length, "cannot repair the checksum table after a failed write");
        }
    }

    /// Issues the planned appends as one chain (with the durable-length tail when
    /// `sync`), then makes them the replica's state.
    async fn issue(
        &mut self,
        engine: &dyn IoEngine,
        run: &mut AppendRun,
        sync: bool,
    ) -> Result<()> {
        let ops = run.take_ops();
        self.commit_ops(engine, ops, run.length, run.tail_crc, sync)
            .await
    }

    /// Runs a chain of data and table writes that take the replica to `length` (tail
    /// CRC `tail`), with the durable-length tail when `sync`, then makes that the
    /// replica's state; a chain that fails leaves the state as it was (and the table
    /// put back, see [`Replica::forget_failed_write`]).
    async fn commit_ops(
        &mut self,
        engine: &dyn IoEngine,
        ops: Vec<IoOp>,
        length: u64,
        tail: u32,
        sync: bool,
    ) -> Result<()> {
        let issued = if sync {
            self.sync_data_then_header(engine, length, tail, ops).await
        } else if !ops.is_empty() {
            self.run_ops(engine, ops).await
        } else {
            Ok(())
        };
        if let Err(e) = issued {
            self.forget_failed_write(engine).await;
            return Err(e);
        }
        self.length = length;
        self.tail_crc = tail;
        self.padded = self.padded.max(self.length);
        Ok(())
    }

    /// A packet write under the lock (see [`Store::write`]).
    async fn write(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        let len = data.len() as u64;
        self.check_write(version, offset, len, self.length)?;
        let end = offset + len;
        let mut ops = Vec::with_capacity(5);
        let (new_length, new_tail) = if end <= self.length {
            (self.length, self.tail_crc)
        } else {
            let (first, crcs, data_at, data) = if offset == self.length {
                let (first, crcs) = checksum::append_crcs(offset, self.tail_crc, &data);
                (first, crcs, offset, data)
            } else {
                // Overlaps the end: recompute the first block from disk.
                let first = checksum::block_of(offset);
                let start = checksum::block_start(first);
                let old = self.read_verified_block(engine, first).await?;
                let mut joined = Vec::with_capacity((offset - start) as usize + data.len());
                joined.extend_from_slice(&old[..(offset - start) as usize]);
                joined.extend_from_slice(&data);
                (first, checksum::block_crcs(&joined), offset, data)
            };
            let tail = if end % BLOCK == 0 {
                0
            } else {
                crcs.last().copied().unwrap_or(0)
            };
            ops.push(IoOp::Write {
                offset: DATA_OFFSET + data_at,
                data,
            });
            ops.push(IoOp::Write {
                offset: header::table_entry_offset(first),
                data: Bytes::from(checksum::encode_table(&crcs)),
            });
            (end, tail)
        };
        self.commit_ops(engine, ops, new_length, new_tail, sync)
            .await?;
        Ok(new_length)
    }

    /// Makes the current length durable in the header (data synced first).
    async fn persist_length(&mut self, engine: &dyn IoEngine, state: ReplicaState) -> Result<()> {
        let (version, length) = (self.header.version, self.length);
        if self.header_durable && self.header.length == length && self.header.state == state {
            return Ok(());
        }
        self.write_header(engine, version, state, length, vec![IoOp::SyncData])
            .await
    }
}

/// One packet of a [`Store::write_batch`].
#[derive(Clone, Debug)]
pub struct PacketWrite {
    /// The version of the packet's token, checked against the header.
    pub version: ChunkVersion,
    /// Chunk offset of the first byte.
    pub offset: u64,
    pub data: Bytes,
    /// `crc32(data)` when the caller has already verified it: a packet that fills at
    /// most one block from its start then needs no second pass for its table entry.
    pub crc: Option<u32>,
    /// Make everything up to this packet durable (data, then the header) before
    /// returning.
    pub sync: bool,
}

/// What became of a batch: the first `lengths.len()` packets were applied, each with
/// the replica's length after it; when `error` is set, the packet after them failed
/// with it and later ones were not attempted.
#[derive(Debug)]
pub struct BatchOutcome {
    pub lengths: Vec<u64>,
    pub error: Option<Error>,
}

/// Contiguous appends planned under the lock and not yet issued.
struct AppendRun {
    /// Chunk offset of the first planned byte.
    start: u64,
    bufs: Vec<Bytes>,
    /// Block of `crcs[0]`.
    first_block: u64,
    /// New checksum entries of every block the planned bytes touch.
    crcs: Vec<u32>,
    /// The replica's length once the run is issued.
    length: u64,
    /// CRC of the partial last block after the run (0 when block aligned).
    tail_crc: u32,
}

impl AppendRun {
    fn new(length: u64, tail_crc: u32) -> Self {
        Self {
            start: length,
            bufs: Vec::new(),
            first_block: checksum::block_of(length),
            crcs: Vec::new(),
            length,
            tail_crc,
        }
    }

    /// Plans `data` (non-empty) at the current end.
    fn push(&mut self, data: Bytes, crc: Option<u32>) {
        let offset = self.length;
        let end = offset + data.len() as u64;
        let (first, crcs) = match crc {
            Some(c) if offset % BLOCK == 0 && data.len() as u64 <= BLOCK => {
                (checksum::block_of(offset), vec![c])
            }
            _ => checksum::append_crcs(offset, self.tail_crc, &data),
        };
        if self.crcs.is_empty() {
            self.first_block = first;
        }
        self.crcs
            .truncate(first.saturating_sub(self.first_block) as usize);
        self.crcs.extend_from_slice(&crcs);
        self.tail_crc = if end % BLOCK == 0 {
            0
        } else {
            crcs.last().copied().unwrap_or(0)
        };
        self.length = end;
        self.bufs.push(data);
    }

    /// The data write and the table write of everything planned (none if nothing is).
    fn take_ops(&mut self) -> Vec<IoOp> {
        if self.bufs.is_empty() {
            return Vec::with_capacity(3);
        }
        let mut ops = Vec::with_capacity(5);
        ops.push(IoOp::Writev {
            offset: DATA_OFFSET + self.start,
            bufs: std::mem::take(&mut self.bufs),
        });
        ops.push(IoOp::Write {
            offset: header::table_entry_offset(self.first_block),
            data: Bytes::from(checksum::encode_table(&self.crcs)),
        });
        ops
    }
}

/// A replica being received from another chunkserver (re-replication). It is built in
/// a temporary file and renamed into place by [`Incoming::finish`]; dropped unfinished,
/// the temporary file is removed.
pub struct Incoming {
    handle: ChunkHandle,
    version: ChunkVersion,
    expected: u64,
    file: Arc<File>,
    tmp: PathBuf,
    received: u64,
    crcs: Vec<u32>,
    tail_crc: u32,
    engine: Arc<dyn IoEngine>,
    finished: bool,
}

impl Incoming {
    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Bytes announced by the sender.
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Appends the next bytes.
    pub async fn append(&mut self, data: Bytes) -> Result<u64> {
        let end = self.received + data.len() as u64;
        if end > self.expected {
            return Err(Error::bad_request(format!(
                "replica of chunk {} announced {} bytes, received {end}",
                self.handle, self.expected
            )));
        }
        let (first, crcs) = checksum::append_crcs(self.received, self.tail_crc, &data);
        for (i, crc) in crcs.iter().enumerate() {
            let idx = first as usize + i;
            if idx < self.crcs.len() {
                self.crcs[idx] = *crc;
            } else {
                self.crcs.push(*crc);
            }
        }
        self.tail_crc = if end % BLOCK == 0 {
            0
        } else {
            crcs.last().copied().unwrap_or(0)
        };
        self.engine
            .run(
                self.file.clone(),
                vec![IoOp::Write {
                    offset: DATA_OFFSET + self.received,
                    data,
                }],
            )
            .await
            .map_err(|e| Error::io("write", &self.tmp, e))?;
        self.received = end;
        Ok(end)
    }

    /// Seals the replica (finalized at the announced length) and puts it in place,
    /// replacing an older-version replica of the same chunk.
    pub async fn finish(mut self, store: &Store) -> Result<ReplicaReport> {
        if self.received != self.expected {
            return Err(Error::bad_request(format!(
                "replica of chunk {} ended after {} of {} bytes",
                self.handle, self.received, self.expected
            )));
        }
        let header = Header::new(
            self.handle,
            self.version,
            ReplicaState::Finalized,
            self.received,
        )
        .with_tail(self.tail_crc);
        self.engine
            .run(
                self.file.clone(),
                vec![
                    IoOp::Write {
                        offset: header::TABLE_OFFSET,
                        data: Bytes::from(checksum::encode_table(&self.crcs)),
                    },
                    IoOp::Write {
                        offset: header.slot_offset(),
                        data: Bytes::from(header.encode_head()),
                    },
                    IoOp::SyncAll,
                ],
            )
            .await
            .map_err(|e| Error::io("seal received replica", &self.tmp, e))?;
        // Sealed and durable, but only as a temporary file: start-up removes it.
        stampfs_proto::crash_point!("copy-before-rename");
        let replica = Replica {
            disk: store.disk.clone(),
            id: store.disk.cache.next_id(),
            header,
            header_durable: true,
            length: self.received,
            tail_crc: self.tail_crc,
            behind: self.received,
            padded: self.received,
        };
        let report = replica.report();
        loop {
            let slot = store.slot_or_insert(self.handle);
            let mut guard = slot.write().await;
            match &*guard {
                SlotState::Removed => continue,
                SlotState::Live(r) if r.header.version >= self.version => {
                    return Err(Error::bad_request(format!(
                        "already holds chunk {} at version {}",
                        self.handle, r.header.version
                    )));
                }
                SlotState::Live(_) | SlotState::Creating => {}
            }
            let (tmp, dst) = (self.tmp.clone(), replica.path());
            let dir = store.disk.layout.dir_of(self.handle);
            blocking(move || {
                std::fs::rename(&tmp, &dst).map_err(|e| Error::io("rename", &tmp, e))?;
                sync_dir(&dir)
            })
            .await?;
            self.finished = true;
            // The new inode under a new identity; the replaced replica's entry goes
            // with it (dropped here, under the lock).
            store.disk.cache.insert(replica.id, self.file.clone());
            *guard = SlotState::Live(replica);
            store.changed.notify_one();
            return Ok(report);
        }
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
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

/// Runs blocking file-system work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io {
            op: "blocking task",
            path: String::new(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// Writes `contents` to `path` durably and atomically: temp file, fsync, rename, fsync
/// of the directory.
pub fn replace_file(path: &Path, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(TEMP_SUFFIX);
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp).map_err(|e| Error::io("create", &tmp, e))?;
        f.write_all(contents)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io("write", &tmp, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io("rename", &tmp, e))?;
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => sync_dir(dir),
        None => sync_dir(Path::new(".")),
    }
}

/// Renames `path` aside as `<name>.corrupt` (or `<name>.corrupt.N` if taken); returns
/// the new path.
pub(crate) fn move_aside(path: &Path) -> Result<PathBuf> {
    let mut n = 0u32;
    loop {
        let mut name = path.as_os_str().to_owned();
        name.push(CORRUPT_SUFFIX);
        if n > 0 {
            name.push(format!(".{n}"));
        }
        let dst = PathBuf::from(name);
        if !dst.exists() {
            std::fs::rename(path, &dst).map_err(|e| Error::io("rename aside", path, e))?;
            if let Some(dir) = path.parent() {
                sync_dir(dir)?;
            }
            return Ok(dst);
        }
        n += 1;
    }
}

/// Small hsyncs overwrite zeros written ahead instead of growing the file: a flush of
/// blocks that already exist carries only the data pages, while a flush that grows the
/// file must also commit the new size to the file system's journal (about a third
/// more latency per hsync on ext4 here). The zeros are never data: lengths come from
/// the header and the checksum table, and finalize cuts the file to its length.
const PAD_AHEAD: u64 = 1 << 20;
/// An hsync that added at most this much since the previous header counts as small.
const PAD_SMALL: u64 = 256 << 10;
static ZEROS: [u8; PAD_AHEAD as usize] = [0; PAD_AHEAD as usize];

/// The data range `[from, to)` to fill with zeros in the chain of an hsync that takes
/// a replica from `synced` bytes (its last header's length) to `length`, when the file
/// holds `padded` data bytes: only for small hsyncs that come within half of
/// [`PAD_AHEAD`] of the end of the file, never past [`MAX_CHUNK_SIZE`], never over
/// data (`from >= length`), at most [`PAD_AHEAD`] bytes, ending 4 KiB aligned.
fn pad_range(synced: u64, length: u64, padded: u64) -> Option<(u64, u64)> {
    if length.saturating_sub(synced) > PAD_SMALL || length + PAD_AHEAD / 2 <= padded {
        return None;
    }
    let to = ((length + PAD_AHEAD) & !4095).min(MAX_CHUNK_SIZE);
    let from = padded.max(length);
    (to > from).then_some((from, to))
}

/// The table write that forgets everything past `length`: the entry of the block that
/// holds `length` becomes `tail` (the CRC of that block's first `length % BLOCK`
/// bytes), and every later entry zero. `None` when `length` is the chunk limit.
fn stale_table_entries(length: u64, tail: u32) -> Option<(u64, Vec<u8>)> {
    let first = checksum::block_of(length);
    let offset = header::table_entry_offset(first);
    let end = header::TABLE_OFFSET + TABLE_LEN;
    if offset >= end {
        return None;
    }
    let mut entries = vec![0u8; (end - offset) as usize];
    if length % BLOCK != 0 {
        entries[..4].copy_from_slice(&tail.to_le_bytes());
    }
    Some((offset, entries))
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
        let disk = Arc::new(Disk {
            layout: Layout::new(dir),
            cache: FileCache::new(fdcache::DEFAULT_CAPACITY),
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

    /// Opens a write stream at `offset` after the gate: the replica must be `Writing`;
    /// bytes beyond `offset` (an unacknowledged tail of the writer holding this version)
    /// are cut; a gap before `offset` is refused.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, offset))]
    pub async fn open_for_write(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
    ) -> Result<ReplicaReport> {
        let (slot, mut guard) = self.lock_live(handle).await?;
        let result = match &mut *guard {
            SlotState::Live(r) => {
                r.open_for_write(self.engine.as_ref(), version, offset)
                    .await
            }
            _ => Err(Error::NotFound { handle }),
        };
        self.settle(handle, &slot, &mut guard, result).await
    }

    /// Writes `data` at `offset` after the gate and returns the replica's length.
    /// `offset` must not leave a gap; bytes already present (`offset + len <= length`)
    /// are an idempotent retry and are not rewritten. With `sync`, the data and then a
    /// header holding the new length are made durable before returning.
    pub async fn write(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        let (slot, mut guard) = self.lock_live(handle).await?;
        let result = match &mut *guard {
            SlotState::Live(r) => {
                r.write(self.engine.as_ref(), version, offset, data, sync)
                    .await
            }
            _ => Err(Error::NotFound { handle }),
        };
        self.settle(handle, &slot, &mut guard, result).await
    }

    /// Writes consecutive packets of one stream under a single hold of the per-chunk
    /// lock: each packet passes the version gate and the write checks in turn (as
    /// [`Store::write`] would), contiguous appends go to disk as one chain, and a
    /// `sync` anywhere in the batch makes the whole batch durable before returning.
    pub async fn write_batch(
        &self,
        handle: ChunkHandle,
        packets: Vec<PacketWrite>,
    ) -> BatchOutcome {
        let (slot, mut guard) = match self.lock_live(handle).await {
            Ok(x) => x,
            Err(e) => {
                return BatchOutcome {
                    lengths: Vec::new(),
                    error: Some(e),
                }
            }
        };
        let outcome = match &mut *guard {
            SlotState::Live(r) => {
                let (outcome, hint) = r
                    .write_batch(self.engine.as_ref(), packets, self.write_behind)
                    .await;
                if let Some(op) = hint {
                    // Unawaited and outside the lock: a hint that only moves work earlier.
                    // It holds the file until it completes, evicted or not.
                    match r.file().await {
                        Ok(file) => {
                            let engine = self.engine.clone();
                            tokio::spawn(async move {
                                if let Err(e) = engine.run(file, vec![op]).await {
                                    tracing::debug!(chunk = %handle, error = %e, "write-behind failed");
                                }
                            });
                        }
                        Err(e) => {
                            tracing::debug!(chunk = %handle, error = %e, "write-behind skipped")
                        }
                    }
                }
                outcome
            }
            _ => BatchOutcome {
                lengths: Vec::new(),
                error: Some(Error::NotFound { handle }),
            },
        };
        if let Some(e @ Error::ChecksumMismatch { .. }) = &outcome.error {
            self.quarantine(handle, &slot, &mut guard, e).await;
        }
        outcome
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
            crcs: Vec::new(),
            tail_crc: 0,
            engine: self.engine.clone(),
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
mod tests {
    use super::*;

    #[test]
    fn zeros_go_ahead_of_small_hsyncs_only() {
        // A small hsync near the end of the file pads a MiB past its data.
        assert_eq!(pad_range(0, 4096, 0), Some((4096, 4096 + PAD_AHEAD)));
        assert_eq!(pad_range(4096, 5000, 4096), Some((5000, 4096 + PAD_AHEAD)));
        for length in [1, 4095, 4097, 70_000] {
            let (from, to) = pad_range(0, length, 0).expect("pads");
            assert!(to - from <= PAD_AHEAD && to % 4096 == 0 && from == length);
        }
        // Far from the end: nothing to do.
        assert_eq!(pad_range(4096, 8192, PAD_AHEAD), None);
        // Within half of the pad of the end: pad again, from the file's end.
        let p = PAD_AHEAD + 4096;
        assert_eq!(pad_range(p - 4096, p - 100, p), Some((p, 2 * PAD_AHEAD)));
        // A large hsync (bulk data) never pads.
        assert_eq!(pad_range(0, PAD_SMALL + 1, 0), None);
        // Never past the chunk limit, never over data.
        assert_eq!(
            pad_range(MAX_CHUNK_SIZE - 10, MAX_CHUNK_SIZE, MAX_CHUNK_SIZE),
            None
        );
        let (from, to) = pad_range(
            MAX_CHUNK_SIZE - 8192,
            MAX_CHUNK_SIZE - 4096,
            MAX_CHUNK_SIZE - 4096,
        )
        .expect("pads to the limit");
        assert_eq!((from, to), (MAX_CHUNK_SIZE - 4096, MAX_CHUNK_SIZE));
    }

    #[test]
    fn stale_entries_keep_the_tail_and_zero_the_rest() {
        let (offset, entries) = stale_table_entries(BLOCK + 10, 0xaabb_ccdd).expect("entries");
        assert_eq!(offset, header::table_entry_offset(1));
        assert_eq!(&entries[..4], &0xaabb_ccddu32.to_le_bytes());
        assert!(entries[4..].iter().all(|b| *b == 0));
        assert_eq!(
            offset + entries.len() as u64,
            header::TABLE_OFFSET + TABLE_LEN
        );
        let (offset, entries) = stale_table_entries(2 * BLOCK, 0).expect("entries");
        assert_eq!(offset, header::table_entry_offset(2));
        assert!(entries.iter().all(|b| *b == 0));
        assert_eq!(stale_table_entries(MAX_CHUNK_SIZE, 0), None);
    }

    const H: ChunkHandle = ChunkHandle(0xb47c);

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn packet(version: u64, offset: u64, data: &[u8], sync: bool) -> PacketWrite {
        PacketWrite {
            version: ChunkVersion(version),
            offset,
            data: Bytes::copy_from_slice(data),
            crc: Some(crc32fast::hash(data)),
            sync,
        }
    }

    fn engines() -> Vec<Arc<dyn IoEngine>> {
        let mut out: Vec<Arc<dyn IoEngine>> = vec![Arc::new(crate::io::ThreadsEngine::new())];
        match crate::io::UringEngine::new() {
            Ok(e) => out.push(Arc::new(e)),
            Err(e) => {
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "io_uring must be available in CI: {e}"
                );
                println!("SKIPPED: io_uring unavailable: {e}");
            }
        }
        out
    }

    #[tokio::test]
    async fn a_batch_gates_every_packet_and_keeps_the_ones_before_a_stale_one() {
        for engine in engines() {
            let dir = tempfile::tempdir().expect("tempdir");
            let s = Store::open(dir.path(), engine).await.expect("open");
            s.bump_version(H, ChunkVersion(2), true)
                .await
                .expect("create");
            let data = pattern(150_010, 1);
            let out = s
                .write_batch(
                    H,
                    vec![
                        packet(2, 0, &data[..65_536], false),
                        packet(2, 65_536, &data[65_536..150_000], false),
                        packet(1, 150_000, &data[150_000..], false),
                        packet(2, 150_000, &data[150_000..], false),
                    ],
                )
                .await;
            assert_eq!(out.lengths, vec![65_536, 150_000]);
            assert!(
                matches!(out.error, Some(Error::StaleToken { .. })),
                "{:?}",
                out.error
            );
            let (report, got) = s.read(H, ChunkVersion(2), 0, 1 << 20).await.expect("read");
            assert_eq!(report.length, 150_000);
            assert_eq!(&got[..], &data[..150_000]);
            // A newer token than the replica's is refused the same way, and a gap too.
            let out = s
                .write_batch(H, vec![packet(3, 150_000, b"x", false)])
                .await;
            assert!(matches!(out.error, Some(Error::ReplicaStale { .. })));
            let out = s
                .write_batch(
                    H,
                    vec![
                        packet(2, 150_000, b"ok", false),
                        packet(2, 150_010, b"gap", false),
                    ],
                )
                .await;
            assert_eq!(out.lengths, vec![150_002]);
            assert!(matches!(out.error, Some(Error::BadRequest { .. })));
        }
    }

    #[tokio::test]
    async fn a_batch_handles_retries_overlaps_and_unaligned_packets() {
        for engine in engines() {
            let dir = tempfile::tempdir().expect("tempdir");
            let s = Store::open(dir.path(), engine).await.expect("open");
            s.bump_version(H, ChunkVersion(1), true)
                .await
                .expect("create");
            let data = pattern(300_000, 2);
            let out = s
                .write_batch(
                    H,
                    vec![
                        packet(1, 0, &data[..1000], false),
                        // An exact retry of bytes already planned.
                        packet(1, 0, &data[..1000], false),
                        // Overlapping the end: takes the general path.
                        packet(1, 500, &data[500..70_000], false),
                        // Unaligned, crossing block boundaries, with a CRC hint.
                        packet(1, 70_000, &data[70_000..200_000], false),
                        // Block aligned, one block, the CRC reused for the table.
                        packet(1, 200_000, &data[200_000..262_144], false),
                        packet(1, 262_144, &data[262_144..], true),
                    ],
                )
                .await;
            assert!(out.error.is_none(), "{:?}", out.error);
            assert_eq!(
                out.lengths,
                vec![1000, 1000, 70_000, 200_000, 262_144, 300_000]
            );
            // Reads verify every block against the checksum table.
            let (_, got) = s.read(H, ChunkVersion(1), 0, 1 << 20).await.expect("read");
            assert_eq!(&got[..], &data[..]);
            drop(s);
            // And so does recovery at start-up.
            let s = Store::open(dir.path(), Arc::new(crate::io::ThreadsEngine::new()))
                .await
                .expect("reopen");
            assert_eq!(s.info(H).await.expect("info").length, 300_000);
            assert!(s.take_corrupt().is_empty());
        }
    }

    #[tokio::test]
    async fn hsync_header_rides_on_the_next_flush_and_carries_its_tail_crc() {
        for engine in engines() {
            let dir = tempfile::tempdir().expect("tempdir");
            let s = Store::open(dir.path(), engine).await.expect("open");
            s.bump_version(H, ChunkVersion(1), true)
                .await
                .expect("create");
            let data = pattern(10_000, 3);
            let out = s.write_batch(H, vec![packet(1, 0, &data, true)]).await;
            assert_eq!(out.lengths, vec![10_000]);
            let slot = s.slot(H).expect("slot");
            {
                let guard = slot.read().await;
                let SlotState::Live(r) = &*guard else {
                    panic!("live replica expected")
                };
                assert_eq!(r.header.length, 10_000, "the hsync header holds the length");
                assert_eq!(r.header.tail_crc, Some(crc32fast::hash(&data)));
                assert!(!r.header_durable, "written without a second flush");
            }
            // A truncate to the same length must still make that header durable.
            s.truncate(H, ChunkVersion(1), 10_000)
                .await
                .expect("truncate");
            let guard = slot.read().await;
            let SlotState::Live(r) = &*guard else {
                panic!("live replica expected")
            };
            assert!(r.header_durable);
            assert_eq!(r.header.length, 10_000);
        }
    }

    #[tokio::test]
    async fn a_received_copy_renamed_over_an_older_replica_is_what_the_cache_serves() {
        for engine in engines() {
            let dir = tempfile::tempdir().expect("tempdir");
            let s = Store::open(dir.path(), engine)
                .await
                .expect("open")
                .with_max_open_files(1);
            let (old, new) = (pattern(70_000, 5), pattern(90_000, 6));
            s.bump_version(H, ChunkVersion(1), true)
                .await
                .expect("create");
            s.write(H, ChunkVersion(1), 0, Bytes::from(old.clone()), true)
                .await
                .expect("write");
            let (_, got) = s.read(H, ChunkVersion(1), 0, 1 << 20).await.expect("read");
            assert_eq!(&got[..], &old[..], "the old inode is the cached one");
            let old_id = match &*s.slot(H).expect("slot").read().await {
                SlotState::Live(r) => r.id,
                _ => panic!("live replica expected"),
            };
            let mut incoming = s
                .receive(H, ChunkVersion(2), new.len() as u64)
                .await
                .expect("receive");
            incoming
                .append(Bytes::from(new.clone()))
                .await
                .expect("append");
            incoming.finish(&s).await.expect("finish");
            let (report, got) = s.read(H, ChunkVersion(2), 0, 1 << 20).await.expect("read");
            assert_eq!(report.length, new.len() as u64);
            assert_eq!(
                &got[..],
                &new[..],
                "the renamed-in inode, never the old one"
            );
            assert!(
                !s.disk.cache.holds(old_id),
                "the old replica's entry is dropped"
            );
            assert_eq!(s.open_files(), 1);
            // Another replica evicts it; a reopen by path finds the new inode too.
            let other = ChunkHandle(0xb47d);
            s.bump_version(other, ChunkVersion(1), true)
                .await
                .expect("create other");
            let (_, got) = s
                .read(H, ChunkVersion(2), 0, 1 << 20)
                .await
                .expect("reread");
            assert_eq!(&got[..], &new[..]);
            // Deleting drops the entry.
            s.delete(H, ChunkVersion(2)).await.expect("delete");
            assert_eq!(s.open_files(), 0);
        }
    }

    #[tokio::test]
    async fn write_behind_is_asked_for_every_threshold_of_appended_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let engine: Arc<dyn IoEngine> = Arc::new(crate::io::ThreadsEngine::new());
        let s = Store::open(dir.path(), engine.clone()).await.expect("open");
        s.bump_version(H, ChunkVersion(1), true)
            .await
            .expect("create");
        let slot = s.slot(H).expect("slot");
        let mut guard = slot.write().await;
        let SlotState::Live(r) = &mut *guard else {
            panic!("live replica expected")
        };
        let data = pattern(100_000, 4);
        let (out, hint) = r
            .write_batch(
                engine.as_ref(),
                vec![packet(1, 0, &data[..60_000], false)],
                64 << 10,
            )
            .await;
        assert!(out.error.is_none());
        assert!(hint.is_none(), "below the threshold");
        let (_, hint) = r
            .write_batch(
                engine.as_ref(),
                vec![packet(1, 60_000, &data[60_000..], false)],
                64 << 10,
            )
            .await;
        match hint {
            Some(op @ IoOp::WriteBehind { offset, len }) => {
                assert_eq!((offset, len), (DATA_OFFSET, 100_000));
                // The hint runs on the engine like any op.
                engine
                    .run(r.file().await.expect("file"), vec![op])
                    .await
                    .expect("hint runs");
            }
            other => panic!("expected a write-behind hint, got {other:?}"),
        }
        // Off when the threshold is zero; a sync counts as written back.
        let (_, hint) = r
            .write_batch(
                engine.as_ref(),
                vec![packet(1, 100_000, &data[..10], true)],
                0,
            )
            .await;
        assert!(hint.is_none());
        assert_eq!(r.behind, 100_010);
    }
}
