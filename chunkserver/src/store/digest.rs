//! A replica's digest: its report and the XXH3-64 hash of each 64 KiB block of its
//! data up to its length, as lease recovery compares the replicas of a chunk (DESIGN.md,
//! "Writes at any offset", "Lease recovery compares content").
//!
//! The digest reads the data, verifying each block against its checksum (the partial
//! last block against the tail CRC, as [`Store::read`] does), and hashes it. Not the
//! checksum table: CRC32 is linear, so a block made of fixed-length records that each
//! end with their own CRC32 (a common log layout; the nemesis's slot file is one) has
//! the same CRC32 whatever the records say. Two replicas holding different records in
//! such a chunk had equal tables, lease recovery took them for identical, and they
//! stayed different at one version (found by the nemesis, seed 9037). A digest now
//! costs a read of the replica, once per replica per recovery.
//!
//! A block that fails its checksum fails the digest with `ChecksumMismatch`, and the
//! replica is moved aside as a failed read would move it.

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
        let mut blocks = Vec::with_capacity(block_count(r.length) as usize);
        for block in 0..block_count(r.length) {
            match r.read_verified_block(self.engine.as_ref(), block).await {
                Ok(data) => blocks.push(block_hash(&data)),
                Err(err @ Error::ChecksumMismatch { .. }) => {
                    let id = r.id;
                    drop(guard);
                    let mut guard = slot.write().await;
                    if matches!(&*guard, SlotState::Live(r) if r.id == id) {
                        self.quarantine(handle, &slot, &mut guard, &err).await;
                    }
                    return Err(err);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(ReplicaDigest {
            replica: r.report(),
            blocks,
        })
    }
}

/// Blocks of data, the partial last one included, in `length` bytes.
pub(super) fn block_count(length: u64) -> u64 {
    length.div_ceil(BLOCK)
}

/// The digest entry of one block's bytes.
pub fn block_hash(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// The digest entries of `data` cut into blocks (what [`Store::digest`] answers for a
/// replica holding exactly `data`).
pub fn block_hashes(data: &[u8]) -> Vec<u64> {
    data.chunks(BLOCK as usize).map(block_hash).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;

    /// Fixed-length records, each ending with the CRC32 of what precedes it in the
    /// record (the nemesis's slot records are such).
    fn records(tags: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for tag in tags {
            let mut r: Vec<u8> = (0..508u32).map(|i| (i as u8) ^ tag).collect();
            let crc = crc32fast::hash(&r);
            r.extend_from_slice(&crc.to_le_bytes());
            out.extend(r);
        }
        out
    }

    #[test]
    fn self_checksummed_records_have_one_crc_but_different_digests() {
        let (a, b) = (records(&[1, 2, 3, 4]), records(&[1, 9, 3, 4]));
        assert_ne!(a, b);
        assert_eq!(
            crc32fast::hash(&a),
            crc32fast::hash(&b),
            "CRC32 cannot tell them apart"
        );
        assert_ne!(block_hashes(&a), block_hashes(&b), "the digest can");
        assert_eq!(checksum::block_crcs(&a), checksum::block_crcs(&b));
    }

    #[test]
    fn blocks_are_counted_with_the_partial_last_one() {
        assert_eq!(block_count(0), 0);
        assert_eq!(block_count(BLOCK), 1);
        assert_eq!(block_count(BLOCK + 1), 2);
        assert_eq!(block_hashes(&[]), Vec::<u64>::new());
        let data = vec![7u8; BLOCK as usize + 10];
        let h = block_hashes(&data);
        assert_eq!(h.len(), 2);
        assert_eq!(h[1], block_hash(&data[BLOCK as usize..]));
    }
}
