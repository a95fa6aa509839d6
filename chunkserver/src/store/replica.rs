//! One replica in memory and the operations on its file that are not the write
//! path: headers (and the data flush under an hsync's header), the checksum table,
//! verified block reads, cuts, truncate, finalize and opening for writing.

use super::{Error, Result};
use crate::checksum;
use crate::fdcache::FileCache;
use crate::fdcache::FileId;
use crate::gate;
use crate::header::{
    self, Header, SyncRecord, BLOCK, DATA_OFFSET, MAX_CHUNK_SIZE, RECORD_LEN, TABLE_LEN,
};
use crate::io::{IoEngine, IoOp};
use crate::layout::Layout;
use bytes::Bytes;
use stampfs_proto::{ChunkVersion, ReplicaReport, ReplicaState};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

/// Where a store's replica files are and which of them are open; shared by the store
/// and every replica, so a replica keeps neither a path nor a descriptor of its own.
#[derive(Debug)]
pub(super) struct Disk {
    pub(super) layout: Layout,
    /// The replica files kept open (bounded); each replica's entry is keyed by its id.
    pub(super) cache: FileCache,
    /// The file system punches holes, so runs of zeros in packets are written as holes
    /// (`io::sparse`); probed when the store opens.
    pub(super) sparse: bool,
}

/// One replica in memory. Its file is opened through the store's [`FileCache`]
/// (see [`Replica::file`]); dropping the replica drops its cache entry. Its path is
/// its handle's in the [`Layout`].
#[derive(Debug)]
pub(super) struct Replica {
    pub(super) disk: Arc<Disk>,
    /// This replica instance's identity in the cache: a new one whenever the file at
    /// its path may be a different inode (load, creation, a received copy renamed in).
    pub(super) id: FileId,
    /// The last header written.
    pub(super) header: Header,
    /// Whether `header` is known durable (false after an hsync header, which rides on
    /// the next flush).
    pub(super) header_durable: bool,
    /// The length of the newest header known durable (`header.length` when
    /// `header_durable`; lower while an hsync's header rides on the next flush, its
    /// bytes past this vouched for only by the hsync's sync record).
    pub(super) durable_length: u64,
    /// Bytes of data; at least `header.length`, more after appends not yet synced.
    pub(super) length: u64,
    /// CRC of the partial last block (`length % BLOCK` bytes); 0 when block aligned.
    pub(super) tail_crc: u32,
    /// Data below this offset was synced or handed to write-behind already.
    pub(super) behind: u64,
    /// Data-region bytes the file holds (its size less [`DATA_OFFSET`]): at least
    /// `length`, more when zeros were written ahead for small hsyncs (see
    /// [`pad_range`]).
    pub(super) padded: u64,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.disk.cache.forget(self.id);
    }
}

impl Replica {
    /// Where the replica's file is.
    pub(super) fn path(&self) -> PathBuf {
        self.disk.layout.replica_path(self.header.handle)
    }

    /// The replica's open file (cached, or reopened at its path).
    pub(super) async fn file(&self) -> Result<Arc<File>> {
        self.disk.cache.get_or_open(self.id, || self.path()).await
    }

    pub(super) fn report(&self) -> ReplicaReport {
        ReplicaReport {
            handle: self.header.handle,
            version: self.header.version,
            length: self.length,
            state: self.header.state,
        }
    }

    pub(super) fn io(&self, op: &'static str) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |e| Error::io(op, self.path(), e)
    }

    /// Writes the next header after `pre`, then fsyncs, as one linked chain. The
    /// header drops the overwrite marks, so `pre` must flush the whole file (or the
    /// chain must follow one): every caller's does.
    pub(super) async fn write_header(
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
            .with_tail(self.tail_crc)
            .unmarked();
        self.write_next_header(engine, next, pre).await
    }

    /// Writes `next` (the header after the current one) after `pre`, then fsyncs.
    pub(super) async fn write_next_header(
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
        self.durable_length = next.length;
        Ok(())
    }

    /// hsync: runs `pre` (data and checksum writes), fdatasync, then writes a header
    /// holding `length` and its tail CRC `tail` without flushing it again (see the
    /// module's durability rules): one device flush per hsync instead of two.
    pub(super) async fn sync_data_then_header(
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
        // The chain's flush made the header before this one durable (it was written
        // before the chain), whether or not it was an hsync's.
        self.durable_length = self.header.length;
        self.header = next;
        self.header_durable = false;
        self.behind = self.behind.max(length);
        if let Some((_, to)) = pad {
            self.padded = self.padded.max(to);
        }
        Ok(())
    }

    /// Reads checksum entries `first..first + count`.
    pub(super) async fn read_table(
        &self,
        engine: &dyn IoEngine,
        first: u64,
        count: u64,
    ) -> Result<Vec<u32>> {
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
    pub(super) async fn read_verified_block(
        &self,
        engine: &dyn IoEngine,
        block: u64,
    ) -> Result<Vec<u8>> {
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
    pub(super) async fn cut_to(&mut self, engine: &dyn IoEngine, length: u64) -> Result<()> {
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
            .capped()
            .unmarked();
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
    pub(super) async fn truncate(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        length: u64,
    ) -> Result<ReplicaReport> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        self.holds(length)?;
        if length < self.length {
            self.cut_to(engine, length).await?;
        } else {
            let state = self.header.state;
            self.persist_length(engine, state).await?;
        }
        tracing::info!("replica truncated");
        Ok(self.report())
    }

    /// `ReplicaShort` when `offset` lies past the bytes the replica holds.
    fn holds(&self, offset: u64) -> Result<()> {
        if offset > self.length {
            return Err(Error::ReplicaShort {
                handle: self.header.handle,
                offset,
                length: self.length,
            });
        }
        Ok(())
    }

    /// What a write or a finalize at another length is told by a finalized replica.
    fn finalized(&self) -> Error {
        Error::ReplicaFinalized {
            handle: self.header.handle,
            length: self.length,
        }
    }

    /// Finalize under the lock (see [`Store::finalize`]).
    pub(super) async fn finalize(
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
            return Err(self.finalized());
        }
        self.holds(length)?;
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
    pub(super) async fn open_for_write(
        &mut self,
        engine: &dyn IoEngine,
        version: ChunkVersion,
        offset: u64,
    ) -> Result<ReplicaReport> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if self.header.state != ReplicaState::Writing {
            return Err(self.finalized());
        }
        self.holds(offset)?;
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

    /// The checks of an overwrite stream's set-up (see [`Store::open_for_overwrite`]):
    /// the gate, still `Writing`, and `offset` within the replica. Nothing is cut.
    pub(super) fn check_overwrite_setup(
        &self,
        version: ChunkVersion,
        offset: u64,
    ) -> Result<ReplicaReport> {
        gate::check(self.header.handle, version, self.header.version)?;
        if self.header.state != ReplicaState::Writing {
            return Err(self.finalized());
        }
        self.holds(offset)?;
        Ok(self.report())
    }

    /// The end of an overwrite stream: if the header has overwrite marks, the whole
    /// file is flushed and the header written again without them.
    pub(super) async fn clear_marks(&mut self, engine: &dyn IoEngine) -> Result<()> {
        if self.header.marks.is_empty() {
            return Ok(());
        }
        let regions = self.header.marks.count();
        let state = self.header.state;
        self.persist_length(engine, state).await?;
        tracing::debug!(regions, "overwrite marks cleared");
        Ok(())
    }

    /// Makes the current length durable in the header (data synced first).
    pub(super) async fn persist_length(
        &mut self,
        engine: &dyn IoEngine,
        state: ReplicaState,
    ) -> Result<()> {
        let (version, length) = (self.header.version, self.length);
        if self.header_durable
            && self.header.length == length
            && self.header.state == state
            && self.header.marks.is_empty()
        {
            return Ok(());
        }
        self.write_header(engine, version, state, length, vec![IoOp::SyncData])
            .await
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
pub(super) fn pad_range(synced: u64, length: u64, padded: u64) -> Option<(u64, u64)> {
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
pub(super) fn stale_table_entries(length: u64, tail: u32) -> Option<(u64, Vec<u8>)> {
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
}
