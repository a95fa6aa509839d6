//! The store's entry points for write streams: a stream's set-up (an append stream's
//! cuts the unacknowledged tail, an overwrite stream's never cuts), the one write
//! path ([`Store::write_batch`], in either [`WriteMode`]) and the end of an overwrite
//! stream. Each takes the per-chunk lock; all but the stream's end (which changes no
//! version, length or state) run the gate under it.

use super::{BatchOutcome, Error, PacketWrite, Result, SlotState, Store, WriteMode};
use bytes::Bytes;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaReport};

impl Store {
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

    /// Opens an overwrite stream at `offset` after the gate: the replica must be
    /// `Writing` and hold at least `offset` bytes (`ReplicaShort` otherwise). Unlike
    /// [`Store::open_for_write`] it never cuts: the bytes past `offset` are the
    /// writer's to overwrite.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version, offset))]
    pub async fn open_for_overwrite(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
    ) -> Result<ReplicaReport> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.read().await;
        match &*guard {
            SlotState::Live(r) => r.check_overwrite_setup(version, offset),
            _ => Err(Error::NotFound { handle }),
        }
    }

    /// Ends an overwrite stream: when the replica's header carries overwrite marks,
    /// flushes the whole file and writes the header without them (see
    /// [`crate::header`]), so start-up recovery checks every block strictly again.
    /// No gate: it changes no version, length or state, and a flush followed by a
    /// header is safe whoever writes the replica now (a later in-place write marks
    /// its region again).
    #[tracing::instrument(skip_all, fields(chunk = %handle))]
    pub async fn close_overwrite(&self, handle: ChunkHandle) -> Result<()> {
        let (slot, mut guard) = self.lock_live(handle).await?;
        let result = match &mut *guard {
            SlotState::Live(r) => r.clear_marks(self.engine.as_ref()).await,
            _ => Err(Error::NotFound { handle }),
        };
        self.settle(handle, &slot, &mut guard, result).await
    }

    /// Writes one packet: [`Store::write_batch`] of that packet alone (the one write
    /// path) as an append, returning the replica's length after it.
    pub async fn write(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        self.write_one(handle, WriteMode::Append, version, offset, data, sync)
            .await
    }

    /// Writes one packet at any offset up to the replica's length: [`Store::write_batch`]
    /// of that packet alone as an overwrite, returning the replica's length after it.
    pub async fn overwrite(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        self.write_one(handle, WriteMode::Overwrite, version, offset, data, sync)
            .await
    }

    async fn write_one(
        &self,
        handle: ChunkHandle,
        mode: WriteMode,
        version: ChunkVersion,
        offset: u64,
        data: Bytes,
        sync: bool,
    ) -> Result<u64> {
        let packet = PacketWrite {
            version,
            offset,
            data,
            crc: None,
            sync,
        };
        let outcome = self.write_batch(handle, mode, vec![packet]).await;
        match (outcome.error, outcome.lengths.last()) {
            (Some(e), _) => Err(e),
            (None, Some(&length)) => Ok(length),
            (None, None) => Err(Error::Internal {
                reason: format!(
                    "a batch of one packet to chunk {handle} applied nothing and reported no error"
                ),
            }),
        }
    }

    /// Writes consecutive packets of one stream under a single hold of the per-chunk
    /// lock: each packet passes the version gate and the write checks in turn (as
    /// [`Store::write`] would), the batch goes to disk as one chain (an append
    /// batch's contiguous appends; an overwrite batch's writes at their own offsets,
    /// see [`WriteMode`]), and a `sync` anywhere in the batch makes the whole batch
    /// durable before returning.
    pub async fn write_batch(
        &self,
        handle: ChunkHandle,
        mode: WriteMode,
        packets: Vec<PacketWrite>,
    ) -> BatchOutcome {
        let bytes: u64 = packets.iter().map(|p| p.data.len() as u64).sum();
        crate::counters::add(&crate::counters::BYTES_WRITTEN, bytes);
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
                    .write_batch(self.engine.as_ref(), mode, packets, self.write_behind)
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
}
