//! Per-block CRC32 arithmetic for replica data (pure functions, no I/O).
//!
//! Data is checksummed per [`BLOCK`] (64 KiB). The entry of a partial last block covers
//! only the bytes present, so an append into it *extends* the CRC
//! ([`crc32fast::Hasher::new_with_initial_len`]) instead of re-reading the block.

use crate::header::BLOCK;

/// The block holding byte `offset`.
pub fn block_of(offset: u64) -> u64 {
    offset / BLOCK
}

/// First byte of `block`.
pub fn block_start(block: u64) -> u64 {
    block * BLOCK
}

/// CRCs of consecutive blocks whose data starts at a block boundary (the last one may
/// be partial).
pub fn block_crcs(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK as usize).map(crc32fast::hash).collect()
}

/// Checksum entries after appending `data` at `offset`, where `tail_crc` is the CRC of
/// the `offset % BLOCK` bytes of the partial block before `offset` (ignored when
/// `offset` is block aligned). Returns the first block touched and the new entries of
/// every touched block, in order; the last entry is the new tail CRC.
pub fn append_crcs(offset: u64, tail_crc: u32, data: &[u8]) -> (u64, Vec<u32>) {
    let first = block_of(offset);
    let mut out = Vec::with_capacity(data.len() / BLOCK as usize + 2);
    let mut pos = offset;
    let mut rest = data;
    let mut prev = tail_crc;
    while !rest.is_empty() {
        let in_block = pos % BLOCK;
        let n = ((BLOCK - in_block) as usize).min(rest.len());
        let (part, tail) = rest.split_at(n);
        let crc = if in_block == 0 {
            crc32fast::hash(part)
        } else {
            let mut h = crc32fast::Hasher::new_with_initial_len(prev, in_block);
            h.update(part);
            h.finalize()
        };
        out.push(crc);
        prev = crc;
        pos += n as u64;
        rest = tail;
    }
    (first, out)
}

/// Index (within `table`) of the first block of `data` whose CRC does not match, where
/// `data` starts at the boundary of the block `table[0]` describes.
pub fn first_mismatch(data: &[u8], table: &[u32]) -> Option<usize> {
    data.chunks(BLOCK as usize)
        .zip(table.iter().chain(std::iter::repeat(&0)))
        .position(|(chunk, &crc)| crc32fast::hash(chunk) != crc)
}

/// How much of one block's bytes its stored CRC vouches for (start-up recovery of a
/// replica that was being written when the process stopped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockCheck {
    /// Every byte present matches.
    Full,
    /// Only the first `n` bytes match (a later append reached the disk, its table
    /// entry did not; or a truncate wrote the entry first).
    Prefix(usize),
    /// No prefix matches.
    Bad,
}

/// Checks `data` (a block's bytes from its start, as found in the file) against its
/// stored CRC, and otherwise finds the longest prefix the CRC matches.
pub fn check_block(data: &[u8], stored: u32) -> BlockCheck {
    if crc32fast::hash(data) == stored {
        return BlockCheck::Full;
    }
    let mut h = crc32fast::Hasher::new();
    let mut best = None;
    for (i, byte) in data.iter().enumerate() {
        h.update(std::slice::from_ref(byte));
        if h.clone().finalize() == stored {
            best = Some(i + 1);
        }
    }
    match best {
        Some(n) => BlockCheck::Prefix(n),
        None => BlockCheck::Bad,
    }
}

/// Table bytes (little endian) as entries.
pub fn parse_table(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Entries as table bytes (little endian).
pub fn encode_table(entries: &[u32]) -> Vec<u8> {
    entries.iter().flat_map(|c| c.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn appends_extend_the_tail_crc_exactly_like_a_full_recompute() {
        let b = BLOCK as usize;
        let all = bytes(3 * b + 1234, 5);
        // Append the data in irregular pieces, tracking the table like the store does.
        let mut table: Vec<u32> = Vec::new();
        let mut tail = 0u32;
        let mut pos = 0usize;
        for piece in [1usize, 700, b - 701, 5, b + 3, 100_000, all.len()] {
            let end = (pos + piece).min(all.len());
            if end == pos {
                break;
            }
            let (first, crcs) = append_crcs(pos as u64, tail, &all[pos..end]);
            for (i, c) in crcs.iter().enumerate() {
                let idx = first as usize + i;
                if idx == table.len() {
                    table.push(*c);
                } else {
                    table[idx] = *c;
                }
            }
            tail = if end % b == 0 {
                0
            } else {
                *crcs.last().expect("some")
            };
            pos = end;
        }
        assert_eq!(table, block_crcs(&all));
        assert_eq!(first_mismatch(&all, &table), None);
    }

    #[test]
    fn a_flipped_byte_is_found_in_its_block() {
        let b = BLOCK as usize;
        let mut data = bytes(2 * b + 10, 1);
        let table = block_crcs(&data);
        data[b + 17] ^= 1;
        assert_eq!(first_mismatch(&data, &table), Some(1));
    }

    #[test]
    fn check_block_finds_the_prefix_the_crc_covers() {
        let data = bytes(5000, 9);
        assert_eq!(check_block(&data, crc32fast::hash(&data)), BlockCheck::Full);
        assert_eq!(
            check_block(&data, crc32fast::hash(&data[..1234])),
            BlockCheck::Prefix(1234)
        );
        assert_eq!(check_block(&data, 0xdead_beef), BlockCheck::Bad);
    }

    #[test]
    fn table_bytes_round_trip() {
        let t = vec![1u32, 0xffff_ffff, 42];
        assert_eq!(parse_table(&encode_table(&t)), t);
    }
}
