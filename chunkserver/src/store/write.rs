//! The write path of a replica: packets checked (gate included) and planned under the
//! per-chunk lock, contiguous appends issued as one chain, and the repair of the table
//! after a chain that failed part-way. A batch is written in one of two modes
//! ([`WriteMode`]): an append stream's (bytes below the length are an idempotent
//! retry) or an overwrite stream's (bytes below the length are written in place, see
//! `store::overwrite`); the checks, the chain and its durable tail are the same.

use super::replica::{stale_table_entries, Replica};
use super::{Error, Result};
use crate::checksum::{self, TableRun};
use crate::gate;
use crate::header::{self, DATA_OFFSET, MAX_CHUNK_SIZE};
use crate::io::{sparse, IoEngine, IoOp};
use bytes::Bytes;
use stampfs_proto::{ChunkVersion, ReplicaState};

impl Replica {
    /// The checks every packet passes under the lock before it is written: the version
    /// gate, the replica still open for writing, the chunk limit, no gap after
    /// `length` (the replica's length including packets planned before this one).
    pub(super) fn check_write(
        &self,
        version: ChunkVersion,
        offset: u64,
        len: u64,
        length: u64,
    ) -> Result<()> {
        let handle = self.header.handle;
        gate::check(handle, version, self.header.version)?;
        if self.header.state != ReplicaState::Writing {
            return Err(Error::ReplicaFinalized {
                handle,
                length: self.length,
            });
        }
        let end = offset.saturating_add(len);
        if end > MAX_CHUNK_SIZE {
            return Err(Error::bad_request(format!(
                "write ending at {end} exceeds the chunk limit of {MAX_CHUNK_SIZE} bytes"
            )));
        }
        if offset > length {
            return Err(Error::ReplicaShort {
                handle,
                offset,
                length,
            });
        }
        Ok(())
    }

    /// Packets in order under one hold of the lock (see [`Store::write_batch`]). Each
    /// packet is checked (gate included) in turn; contiguous appends are planned into
    /// one vectored data write plus one checksum-table write, issued as one chain, and
    /// when any packet asks for `sync` the chain ends with fdatasync, then the header
    /// (holding the new length) and fsync.
    ///
    /// In [`WriteMode::Overwrite`], packets are planned by `overwrite_packets`
    /// instead (bytes below the length written in place), through the same checks and
    /// the same chain.
    ///
    /// Also returns a write-behind hint once `write_behind` bytes (if not zero) have
    /// been appended since the last hint or sync, for the caller to run unawaited.
    pub(super) async fn write_batch(
        &mut self,
        engine: &dyn IoEngine,
        mode: WriteMode,
        packets: Vec<PacketWrite>,
        write_behind: u64,
    ) -> (BatchOutcome, Option<IoOp>) {
        let outcome = match mode {
            WriteMode::Append => self.write_packets(engine, packets).await,
            WriteMode::Overwrite => self.overwrite_packets(engine, packets).await,
        };
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
                .write_overlapping(engine, p.offset, p.data, p.sync)
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
    pub(super) async fn run_ops(&self, engine: &dyn IoEngine, ops: Vec<IoOp>) -> Result<()> {
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
        let ops = run.take_ops(self.disk.sparse);
        self.commit_ops(engine, ops, run.length, run.tail_crc(), sync)
            .await
    }

    /// Runs a chain of data and table writes that take the replica to `length` (tail
    /// CRC `tail`), with the durable-length tail when `sync`, then makes that the
    /// replica's state; a chain that fails leaves the state as it was (and the table
    /// put back, see [`Replica::forget_failed_write`]).
    pub(super) async fn commit_ops(
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

    /// A packet that overlaps the replica's end (a resend after a pipeline recovery
    /// that reopened below it): its first block's entry is recomputed from the bytes on
    /// disk before `offset` and the packet's, and the packet is written whole (the
    /// bytes it shares with the replica are its own earlier copy).
    async fn write_overlapping(
        &mut self,
        engine: &dyn IoEngine,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        let end = offset + data.len() as u64;
        let first = checksum::block_of(offset);
        let start = checksum::block_start(first);
        let old = self.read_verified_block(engine, first).await?;
        let mut joined = Vec::with_capacity((offset - start) as usize + data.len());
        joined.extend_from_slice(&old[..(offset - start) as usize]);
        joined.extend_from_slice(&data);
        let mut table = TableRun::at(self.length, self.tail_crc);
        table.put(first, &checksum::block_crcs(&joined), end);
        let ops = vec![
            IoOp::Write {
                offset: DATA_OFFSET + offset,
                data,
            },
            IoOp::Write {
                offset: header::table_entry_offset(table.first()),
                data: Bytes::from(table.encode()),
            },
        ];
        self.commit_ops(engine, ops, end, table.tail(), sync)
            .await?;
        Ok(end)
    }
}

/// How a [`Store::write_batch`] treats a packet's bytes below the replica's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode {
    /// An append stream (`WriteSetup`): bytes below the length are an idempotent retry
    /// of bytes already written, and are skipped.
    Append,
    /// An overwrite stream (`OverwriteSetup`): bytes below the length are written in
    /// place (their blocks' checksums recomputed, their regions marked first), the
    /// rest appended.
    Overwrite,
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

/// Most data ops a chain's data write becomes once its zeros are holes: with the table
/// write and a sync's four ops, well inside the io_uring engine's 255 per chain.
pub(super) const MAX_DATA_OPS: usize = 64;

/// Contiguous appends planned under the lock and not yet issued.
struct AppendRun {
    /// Chunk offset of the first planned byte.
    start: u64,
    bufs: Vec<Bytes>,
    /// The new checksum entries of every block the planned bytes touch.
    table: TableRun,
    /// The replica's length once the run is issued.
    length: u64,
}

impl AppendRun {
    fn new(length: u64, tail_crc: u32) -> Self {
        Self {
            start: length,
            bufs: Vec::new(),
            table: TableRun::at(length, tail_crc),
            length,
        }
    }

    /// Plans `data` (non-empty) at the current end.
    fn push(&mut self, data: Bytes, crc: Option<u32>) {
        self.table.append(self.length, &data, crc);
        self.length += data.len() as u64;
        self.bufs.push(data);
    }

    /// CRC of the partial last block after the run (0 when block aligned).
    fn tail_crc(&self) -> u32 {
        self.table.tail()
    }

    /// The data write and the table write of everything planned (none if nothing is);
    /// runs of zeros as holes when `sparse`.
    fn take_ops(&mut self, sparse: bool) -> Vec<IoOp> {
        if self.bufs.is_empty() {
            return Vec::with_capacity(3);
        }
        let mut ops = Vec::with_capacity(5);
        ops.push(IoOp::Writev {
            offset: DATA_OFFSET + self.start,
            bufs: std::mem::take(&mut self.bufs),
        });
        if sparse {
            ops = sparse::elide_zeros(ops, MAX_DATA_OPS);
        }
        ops.push(IoOp::Write {
            offset: header::table_entry_offset(self.table.first()),
            data: Bytes::from(self.table.encode()),
        });
        ops
    }
}
