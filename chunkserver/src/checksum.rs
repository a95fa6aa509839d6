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

/// The checksum entries of consecutive blocks from [`TableRun::first`] on, as a
/// replica's data grows, and the tail CRC of its end: what an append plans under the
/// lock, what a received copy builds, and what an overlapping write rewrites, with one
/// set of rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRun {
    first: u64,
    crcs: Vec<u32>,
    /// CRC of the partial block at the end (0 when the end is block aligned).
    tail: u32,
}

impl TableRun {
    /// An empty run at a replica's end `length` whose partial block's CRC is `tail`.
    pub fn at(length: u64, tail: u32) -> Self {
        Self {
            first: block_of(length),
            crcs: Vec::new(),
            tail,
        }
    }

    /// The block of the first entry.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// The entries, from [`TableRun::first`] on.
    pub fn entries(&self) -> &[u32] {
        &self.crcs
    }

    /// The CRC of the partial block at the end (0 when block aligned).
    pub fn tail(&self) -> u32 {
        self.tail
    }

    /// Whether no entry was put.
    pub fn is_empty(&self) -> bool {
        self.crcs.is_empty()
    }

    /// Appends `data` at `offset` (the end so far, whose partial block's CRC is the
    /// run's tail). `crc` is `crc32(data)` when the caller verified it already: a
    /// block-aligned `data` of at most one block then needs no second pass.
    pub fn append(&mut self, offset: u64, data: &[u8], crc: Option<u32>) {
        let (first, crcs) = match crc {
            Some(c) if offset % BLOCK == 0 && data.len() as u64 <= BLOCK => {
                (block_of(offset), vec![c])
            }
            _ => append_crcs(offset, self.tail, data),
        };
        self.put(first, &crcs, offset + data.len() as u64);
    }

    /// Puts `crcs`, the entries of the blocks from `block` on, in place of the run's
    /// entries from `block` on, the data now ending at `end`.
    pub fn put(&mut self, block: u64, crcs: &[u32], end: u64) {
        if self.crcs.is_empty() {
            self.first = block;
        }
        self.crcs
            .truncate(block.saturating_sub(self.first) as usize);
        self.crcs.extend_from_slice(crcs);
        self.tail = if end % BLOCK == 0 {
            0
        } else {
            crcs.last().copied().unwrap_or(0)
        };
    }

    /// The entries, encoded as the table stores them.
    pub fn encode(&self) -> Vec<u8> {
        encode_table(&self.crcs)
    }
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

    #[test]
    fn a_table_run_matches_the_whole_data_checksummed_at_once() {
        let data = bytes(3 * BLOCK as usize + 1234, 9);
        // Appended in uneven pieces (some with their CRC given), from an unaligned start.
        let start = 5000usize;
        let mut run = TableRun::at(start as u64, crc32fast::hash(&data[..start]));
        let mut at = start;
        for (i, n) in [100usize, BLOCK as usize - 5100, BLOCK as usize, 70_000, 1]
            .into_iter()
            .cycle()
            .enumerate()
        {
            if at >= data.len() {
                break;
            }
            let n = n.min(data.len() - at);
            let piece = &data[at..at + n];
            let crc = (i % 2 == 0).then(|| crc32fast::hash(piece));
            run.append(at as u64, piece, crc);
            at += n;
        }
        let whole = block_crcs(&data);
        assert_eq!(run.first(), block_of(start as u64));
        assert_eq!(run.entries(), &whole[run.first() as usize..]);
        assert_eq!(run.tail(), *whole.last().expect("entries"));
        assert_eq!(run.encode(), encode_table(run.entries()));
        // Block aligned at the end: no tail.
        let aligned = &data[..2 * BLOCK as usize];
        let mut run = TableRun::at(0, 0);
        run.append(0, aligned, None);
        assert_eq!(run.tail(), 0);
        assert_eq!(run.entries(), &block_crcs(aligned)[..]);
    }

    #[test]
    fn put_replaces_the_entries_from_its_block_on() {
        let mut run = TableRun::at(0, 0);
        run.put(0, &[1, 2, 3], 3 * BLOCK - 1);
        assert_eq!((run.entries(), run.tail()), (&[1, 2, 3][..], 3));
        run.put(1, &[7], BLOCK + 10);
        assert_eq!((run.entries(), run.tail()), (&[1, 7][..], 7));
        // An empty run takes the first block of what is put.
        let mut run = TableRun::at(10 * BLOCK, 0);
        assert!(run.is_empty());
        run.put(4, &[5, 6], 6 * BLOCK);
        assert_eq!(
            (run.first(), run.entries(), run.tail()),
            (4, &[5, 6][..], 0)
        );
    }
}
