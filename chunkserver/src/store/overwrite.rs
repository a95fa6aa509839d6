//! In-place writes: the overwrite stream's side of the write path (DESIGN.md, "Writes
//! at any offset").
//!
//! A packet of an overwrite batch may start anywhere up to the replica's length
//! (including the packets planned before it). Its bytes below the length are written
//! in place and the rest appended, all planned under the per-chunk lock into one chain:
//!
//! 1. **Marks first.** Before the first in-place write into a region whose overwrite
//!    mark is not in a durable header yet, a header with the mark set is written and
//!    flushed ([`Replica::mark_for_in_place`]). The same happens while an hsync's
//!    header still rides on the next flush and the write touches bytes that only the
//!    hsync's sync record vouches for: start-up recovery checks records strictly, so
//!    those bytes must be under a durable header before they change in place.
//! 2. **Plan.** Every block the batch touches gets its new content in a [`Plan`]: a
//!    block the packet covers from its start to its end (as far as the replica holds
//!    it) is taken from the packet as is; any other block is read back through the
//!    I/O engine and verified against its checksum, then patched (so a new checksum
//!    is never computed over corrupt bytes). Later packets patch the planned block.
//! 3. **One chain.** The packets' data at their own offsets (contiguous ones as one
//!    vectored write, in order, so a later packet's bytes win), then the recomputed
//!    table entries of every touched block; an hsync ends it like an append's
//!    (sync record, fdatasync, header). The files are buffered (no `O_DIRECT`), so a
//!    write rewrites exactly its own bytes and a torn one leaves each byte old or new.
//!
//! The marks are cleared by the next header written after a flush of the whole file:
//! [`Store::close_overwrite`](crate::store::Store::close_overwrite) at the end of the
//! stream, or a finalize, bump or cut.

use super::replica::Replica;
use super::write::{BatchOutcome, PacketWrite};
use super::{Error, Result};
use crate::checksum;
use crate::header::{self, Marks, BLOCK, DATA_OFFSET};
use crate::io::{sparse, IoEngine, IoOp};
use bytes::Bytes;
use std::collections::BTreeMap;

impl Replica {
    /// An overwrite batch (see the module docs and [`Replica::write_batch`]): each
    /// packet checked in turn against the replica's length including the packets
    /// planned before it, then planned; everything planned goes as one chain.
    pub(super) async fn overwrite_packets(
        &mut self,
        engine: &dyn IoEngine,
        packets: Vec<PacketWrite>,
    ) -> BatchOutcome {
        let mut plan = Plan::new(self.length);
        let mut lengths = Vec::with_capacity(packets.len());
        let mut planned = Vec::with_capacity(packets.len());
        let mut sync = false;
        let mut failure = None;
        for p in packets {
            let len = p.data.len() as u64;
            if let Err(e) = self.check_write(p.version, p.offset, len, plan.length) {
                failure = Some(e);
                break;
            }
            if plan.ops() + blocks_touched(p.offset, len) + 1 > MAX_PLAN_OPS {
                // A chain has room for so many ops (io_uring links at most 255): issue
                // what is planned and go on with a new plan. A `sync` in the batch is
                // honoured by the last chain, whose flush covers the whole file.
                let full = std::mem::replace(&mut plan, Plan::new(0));
                if let Err(e) = self.issue_plan(engine, full, false).await {
                    return BatchOutcome {
                        lengths,
                        error: Some(e),
                    };
                }
                lengths.append(&mut planned);
                plan = Plan::new(self.length);
            }
            let in_place_end = (p.offset + len).min(plan.length);
            if p.offset < in_place_end {
                if let Err(e) = self.mark_for_in_place(engine, p.offset, in_place_end).await {
                    failure = Some(e);
                    break;
                }
            }
            if let Err(e) = plan.put(self, engine, p.offset, p.data, p.crc).await {
                failure = Some(e);
                break;
            }
            sync |= p.sync;
            planned.push(plan.length);
        }
        match self.issue_plan(engine, plan, sync).await {
            Ok(()) => lengths.append(&mut planned),
            Err(e) => failure = Some(e),
        }
        BatchOutcome {
            lengths,
            error: failure,
        }
    }

    /// Whether an in-place write of data bytes `start..end` must first make a header
    /// durable even if its regions are marked: an hsync's header is not durable yet
    /// and the write touches a block holding bytes that only the hsync's sync record
    /// vouches for (from the block of the durable header's length up to the hsync's
    /// length). Recovery checks a record strictly; changed in place, those bytes could
    /// fail the check after a crash, and the acknowledged hsync would be lost.
    pub(super) fn needs_durable_header(&self, start: u64, end: u64) -> bool {
        !self.header_durable
            && self.durable_length < self.header.length
            && end > checksum::block_start(checksum::block_of(self.durable_length))
            && start < self.header.length
    }

    /// Makes sure an in-place write of data bytes `start..end` may go ahead: the
    /// regions it touches are marked in a durable header (and the bytes it touches
    /// are under one, see [`Replica::needs_durable_header`]). Otherwise writes and
    /// flushes a header with the marks added: the next header when the current one is
    /// durable; when it is an hsync's header still riding on the next flush, that same
    /// header again (same slot), so the durable one in the other slot stays intact
    /// whatever a crash does to this write. Its length is the current header's (its
    /// bytes were flushed before it was written).
    pub(super) async fn mark_for_in_place(
        &mut self,
        engine: &dyn IoEngine,
        start: u64,
        end: u64,
    ) -> Result<()> {
        let needed = Marks::of_range(start, end).minus(self.header.marks);
        if needed.is_empty() && !self.needs_durable_header(start, end) {
            return Ok(());
        }
        let base = if self.header_durable {
            let h = self.header;
            header::Header {
                tail_crc: h.tail_crc,
                ..h.next(h.version, h.state, h.length)
            }
        } else {
            self.header
        };
        let next = base.with_marks(needed);
        tracing::debug!(
            regions = needed.count(),
            length = next.length,
            "marking regions for in-place writes"
        );
        self.write_next_header(engine, next, Vec::new()).await
    }

    /// Issues a plan as one chain (with the durable-length tail when `sync`) and makes
    /// it the replica's state. A chain that fails part-way may have written some
    /// in-place bytes and not their entries (or the reverse): their blocks' entries
    /// are then recomputed from what is on disk (best effort, see
    /// [`Replica::repair_in_place`]), as start-up recovery would in a marked region.
    async fn issue_plan(&mut self, engine: &dyn IoEngine, plan: Plan, sync: bool) -> Result<()> {
        if plan.blocks.is_empty() && !sync {
            return Ok(());
        }
        let length = plan.length;
        let tail = plan.tail(self.tail_crc);
        let in_place: Vec<u64> = plan
            .blocks
            .keys()
            .copied()
            .filter(|b| checksum::block_start(*b) < self.length)
            .collect();
        let mut ops = plan.data;
        if self.disk.sparse {
            // The plan's ops stay within MAX_PLAN_OPS; holes take at most what is left
            // of a chain's room besides the table writes and a sync.
            let room = MAX_CHAIN_OPS.saturating_sub(plan.blocks.len() + 8);
            ops = sparse::elide_zeros(ops, room);
        }
        ops.extend(table_writes(&plan.blocks));
        let result = self.commit_ops(engine, ops, length, tail, sync).await;
        if result.is_err() && !in_place.is_empty() {
            self.repair_in_place(engine, &in_place).await;
        }
        result
    }

    /// After an overwrite chain failed: the entries of `blocks` (each below the
    /// replica's length, so in marked regions) and the tail CRC recomputed from the
    /// bytes on disk, so that reads verify what is there (each byte old or new). Best
    /// effort: a failure is logged; the chain's error is what the caller gets.
    async fn repair_in_place(&mut self, engine: &dyn IoEngine, blocks: &[u64]) {
        let file = match self.file().await {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reopen the replica to repair its table");
                return;
            }
        };
        let mut ops = Vec::new();
        let mut tail = self.tail_crc;
        for &block in blocks {
            let start = checksum::block_start(block);
            let end = (start + BLOCK).min(self.length);
            let data = match engine
                .read_at(file.clone(), DATA_OFFSET + start, (end - start) as usize)
                .await
            {
                Ok(d) if d.len() as u64 == end - start => d,
                Ok(_) | Err(_) => {
                    tracing::warn!(block, "cannot read back a block to repair its entry");
                    return;
                }
            };
            let crc = crc32fast::hash(&data);
            if end == self.length && self.length % BLOCK != 0 {
                tail = crc;
            }
            ops.push(IoOp::Write {
                offset: header::table_entry_offset(block),
                data: Bytes::copy_from_slice(&crc.to_le_bytes()),
            });
        }
        for chunk in ops.chunks(MAX_PLAN_OPS) {
            if let Err(e) = engine.run(file.clone(), chunk.to_vec()).await {
                tracing::warn!(error = %e, "cannot repair the checksum table after a failed overwrite");
                return;
            }
        }
        self.tail_crc = tail;
    }
}

/// Most data and table writes in one plan's chain (leaving room for an hsync's tail
/// within the io_uring engine's limit of 255 linked ops).
const MAX_PLAN_OPS: usize = 192;

/// Ops one chain may hold (the io_uring engine's limit).
const MAX_CHAIN_OPS: usize = 255;

/// Blocks that `len` bytes at `offset` touch.
fn blocks_touched(offset: u64, len: u64) -> usize {
    if len == 0 {
        return 0;
    }
    (checksum::block_of(offset + len - 1) - checksum::block_of(offset) + 1) as usize
}

/// The new content of one block touched by a plan.
#[derive(Debug)]
enum Image {
    /// Taken whole from a packet: the block's bytes from its start (as far as the
    /// replica holds it), and the packet's verified CRC when the slice is the whole
    /// packet.
    Shared { data: Bytes, crc: Option<u32> },
    /// Patched: old bytes read back (or an earlier planned image) with packets' bytes
    /// written over them.
    Owned(Vec<u8>),
}

impl Image {
    fn len(&self) -> usize {
        match self {
            Image::Shared { data, .. } => data.len(),
            Image::Owned(v) => v.len(),
        }
    }

    /// Writes `bytes` at `at` (at most the image's length: writes never leave a gap).
    fn patch(&mut self, at: usize, bytes: &[u8]) {
        let mut owned = match std::mem::replace(self, Image::Owned(Vec::new())) {
            Image::Shared { data, .. } => data.to_vec(),
            Image::Owned(v) => v,
        };
        let end = at + bytes.len();
        if owned.len() < end {
            owned.resize(end, 0);
        }
        owned[at..end].copy_from_slice(bytes);
        *self = Image::Owned(owned);
    }

    fn crc(&self) -> u32 {
        match self {
            Image::Shared { crc: Some(c), .. } => *c,
            Image::Shared { data, .. } => crc32fast::hash(data),
            Image::Owned(v) => crc32fast::hash(v),
        }
    }
}

/// An overwrite batch planned under the lock and not yet issued.
#[derive(Debug)]
struct Plan {
    /// The replica's length once the plan is issued.
    length: u64,
    /// The data writes, in packet order.
    data: Vec<IoOp>,
    /// Chunk offset where the last data write ends (to extend it when contiguous).
    data_end: u64,
    /// The new content of every block the plan touches.
    blocks: BTreeMap<u64, Image>,
}

impl Plan {
    fn new(length: u64) -> Self {
        Self {
            length,
            data: Vec::new(),
            data_end: u64::MAX,
            blocks: BTreeMap::new(),
        }
    }

    /// Plans `data` (already checked: `offset <= self.length`) at `offset`. A block
    /// the plan has not touched and that `data` does not cover from its start to its
    /// end is read back from the replica and verified first.
    async fn put(
        &mut self,
        replica: &Replica,
        engine: &dyn IoEngine,
        offset: u64,
        data: Bytes,
        crc: Option<u32>,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        for block in checksum::block_of(offset)..=checksum::block_of(end - 1) {
            let start = checksum::block_start(block);
            let from = offset.max(start);
            let to = end.min(start + BLOCK);
            let slice = data.slice((from - offset) as usize..(to - offset) as usize);
            let at = (from - start) as usize;
            // Bytes of this block the replica holds (with the plan so far).
            let present = self.length.saturating_sub(start).min(BLOCK) as usize;
            match self.blocks.get_mut(&block) {
                Some(image) => image.patch(at, &slice),
                None if at == 0 && slice.len() >= present => {
                    let crc = crc.filter(|_| slice.len() == data.len());
                    self.blocks
                        .insert(block, Image::Shared { data: slice, crc });
                }
                None => {
                    let old = replica.read_verified_block(engine, block).await?;
                    if old.len() != present {
                        return Err(Error::Internal {
                            reason: format!(
                                "block {block} of chunk {} holds {} bytes, the plan expected {present}",
                                replica.header.handle,
                                old.len()
                            ),
                        });
                    }
                    let mut image = Image::Owned(old);
                    image.patch(at, &slice);
                    self.blocks.insert(block, image);
                }
            }
        }
        if self.data_end == offset {
            if let Some(IoOp::Writev { bufs, .. }) = self.data.last_mut() {
                bufs.push(data);
            }
        } else {
            self.data.push(IoOp::Writev {
                offset: DATA_OFFSET + offset,
                bufs: vec![data],
            });
        }
        self.data_end = end;
        self.length = self.length.max(end);
        Ok(())
    }

    /// Ops the plan's chain holds at most: its data writes and one table write per
    /// block (fewer when blocks are consecutive).
    fn ops(&self) -> usize {
        self.data.len() + self.blocks.len()
    }

    /// CRC of the partial last block after the plan (0 when block aligned): the last
    /// block's image when the plan touched it, else the replica's `tail` (the plan
    /// then left the end where it was).
    fn tail(&self, tail: u32) -> u32 {
        if self.length % BLOCK == 0 {
            return 0;
        }
        self.blocks
            .get(&checksum::block_of(self.length))
            .map_or(tail, Image::crc)
    }
}

/// The table writes of `blocks`' new entries: one per run of consecutive blocks.
fn table_writes(blocks: &BTreeMap<u64, Image>) -> Vec<IoOp> {
    let mut ops = Vec::new();
    let mut run: Option<(u64, Vec<u32>)> = None;
    for (&block, image) in blocks {
        debug_assert!(image.len() as u64 <= BLOCK);
        match &mut run {
            Some((first, crcs)) if *first + crcs.len() as u64 == block => crcs.push(image.crc()),
            _ => {
                if let Some((first, crcs)) = run.take() {
                    ops.push(entries_write(first, &crcs));
                }
                run = Some((block, vec![image.crc()]));
            }
        }
    }
    if let Some((first, crcs)) = run {
        ops.push(entries_write(first, &crcs));
    }
    ops
}

fn entries_write(first: u64, crcs: &[u32]) -> IoOp {
    IoOp::Write {
        offset: header::table_entry_offset(first),
        data: Bytes::from(checksum::encode_table(crcs)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_patched_image_grows_only_at_its_end_and_keeps_other_bytes() {
        let mut i = Image::Shared {
            data: Bytes::from_static(b"abcdef"),
            crc: None,
        };
        i.patch(2, b"XY");
        i.patch(6, b"gh");
        match &i {
            Image::Owned(v) => assert_eq!(v, b"abXYefgh"),
            other => panic!("patched image stays shared: {other:?}"),
        }
        assert_eq!(i.crc(), crc32fast::hash(b"abXYefgh"));
    }

    #[test]
    fn a_shared_image_uses_the_packet_crc_it_was_given() {
        let i = Image::Shared {
            data: Bytes::from_static(b"abc"),
            crc: Some(7),
        };
        assert_eq!(i.crc(), 7);
    }

    #[test]
    fn table_writes_go_one_per_run_of_consecutive_blocks() {
        let mut blocks = BTreeMap::new();
        for b in [0u64, 1, 2, 5, 7, 8] {
            blocks.insert(b, Image::Owned(vec![b as u8; 10]));
        }
        let ops = table_writes(&blocks);
        let got: Vec<(u64, usize)> = ops
            .iter()
            .map(|op| match op {
                IoOp::Write { offset, data } => (*offset, data.len()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (header::table_entry_offset(0), 12),
                (header::table_entry_offset(5), 4),
                (header::table_entry_offset(7), 8),
            ]
        );
    }

    #[test]
    fn blocks_touched_counts_partial_blocks_at_both_ends() {
        assert_eq!(blocks_touched(0, 0), 0);
        assert_eq!(blocks_touched(0, 1), 1);
        assert_eq!(blocks_touched(0, BLOCK), 1);
        assert_eq!(blocks_touched(BLOCK - 1, 2), 2);
        assert_eq!(blocks_touched(10, 3 * BLOCK), 4);
    }

    #[test]
    fn the_plan_tail_is_the_last_blocks_image_or_the_replicas() {
        let mut p = Plan::new(BLOCK + 10);
        assert_eq!(p.tail(42), 42);
        p.blocks.insert(1, Image::Owned(vec![1; 10]));
        assert_eq!(p.tail(42), crc32fast::hash(&[1; 10]));
        p.length = 2 * BLOCK;
        assert_eq!(p.tail(42), 0);
    }
}
