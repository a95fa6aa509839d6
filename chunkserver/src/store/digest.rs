//! A replica's digest: its report and the CRC32 of each 64 KiB block of its data up to
//! its length, as lease recovery compares the replicas of a chunk (DESIGN.md, "Writes
//! at any offset", "Lease recovery compares content").
//!
//! The digest is read from the replica's checksum table, never from its data: every
//! block below the length has its entry in the table (every read verifies against
//! it), so two replicas with equal lengths and equal digests hold the same bytes, and
//! a digest of a 1 GiB replica costs one 64 KiB read. The partial last block is the
//! exception: its table entry moves on with appends and a write that failed half-way
//! may leave one that vouches for bytes past the length, so its CRC is the one the
//! replica holds for its length (the header's tail CRC), as [`Store::read`] checks it.

use super::{SlotState, Store};
use crate::error::{Error, Result};
use crate::gate;
use crate::header::BLOCK;
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaDigest};

impl Store {
    /// The digest of the replica of `handle`, which must be at exactly `version`
    /// (the gate: lower is [`Error::StaleToken`], higher [`Error::ReplicaStale`]),
    /// read under the shared per-chunk lock, so no write, cut or bump interleaves
    /// with it. [`Error::NotFound`] when this store holds no such replica.
    #[tracing::instrument(skip_all, fields(chunk = %handle, version = %version))]
    pub async fn digest(
        &self,
        handle: ChunkHandle,
        version: ChunkVersion,
    ) -> Result<ReplicaDigest> {
        let slot = self.slot(handle).ok_or(Error::NotFound { handle })?;
        let guard = slot.read().await;
        let SlotState::Live(r) = &*guard else {
            return Err(Error::NotFound { handle });
        };
        gate::check(handle, version, r.header.version)?;
        let count = block_count(r.length);
        let table = if count == 0 {
            Vec::new()
        } else {
            r.read_table(self.engine.as_ref(), 0, count).await?
        };
        Ok(ReplicaDigest {
            replica: r.report(),
            blocks: digest_blocks(r.length, table, r.tail_crc),
        })
    }
}

/// Blocks of data, the partial last one included, in `length` bytes.
pub(super) fn block_count(length: u64) -> u64 {
    length.div_ceil(BLOCK)
}

/// The digest of a replica of `length` bytes from the first [`block_count`] entries
/// of its checksum table: those entries, the last one replaced by `tail_crc` (the
/// CRC of its bytes up to the length) when the last block is partial.
pub(super) fn digest_blocks(length: u64, mut table: Vec<u32>, tail_crc: u32) -> Vec<u32> {
    table.truncate(block_count(length) as usize);
    if length % BLOCK != 0 {
        if let Some(last) = table.last_mut() {
            *last = tail_crc;
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_replica_has_an_empty_digest() {
        assert_eq!(block_count(0), 0);
        assert_eq!(digest_blocks(0, vec![], 0), Vec::<u32>::new());
    }

    #[test]
    fn whole_blocks_are_their_table_entries() {
        assert_eq!(block_count(2 * BLOCK), 2);
        assert_eq!(digest_blocks(2 * BLOCK, vec![1, 2], 99), vec![1, 2]);
    }

    #[test]
    fn a_partial_last_block_is_its_tail_crc_not_its_table_entry() {
        assert_eq!(block_count(BLOCK + 1), 2);
        assert_eq!(digest_blocks(BLOCK + 1, vec![1, 2], 7), vec![1, 7]);
        assert_eq!(digest_blocks(10, vec![5], 7), vec![7]);
    }

    #[test]
    fn entries_past_the_length_are_not_part_of_the_digest() {
        assert_eq!(digest_blocks(BLOCK, vec![1, 2, 3], 0), vec![1]);
    }
}
