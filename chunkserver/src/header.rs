//! The replica file layout and its header.
//!
//! ```text
//! offset 0        header slot 0          4 KiB
//! offset 4 KiB    header slot 1          4 KiB
//! offset 8 KiB    checksum table         64 KiB: CRC32 (little endian) per 64 KiB data block,
//!                                        16384 entries, enough for a 1 GiB chunk
//! offset 72 KiB   data                   (4 KiB aligned), up to MAX_CHUNK_SIZE bytes
//! ```
//!
//! A header slot holds (little endian; format 2, written by this version):
//!
//! ```text
//! 0..8    magic "STAMPCHK"
//! 8..12   format version (2)
//! 12..16  checksum block size (65536)
//! 16..24  chunk handle
//! 24..32  chunk version
//! 32..40  length: bytes of data known durable (exact for finalized replicas)
//! 40..48  sequence number
//! 48      state: 1 = Writing, 2 = Finalized
//! 49      flags: bit 0 = capped (the data ends at `length` exactly, see below),
//!         bit 1 = bytes 50..54 hold the tail CRC
//! 50..54  tail CRC: CRC32 of the data of the block that holds `length`, up to `length`
//! 54..56  zero
//! 56..88  overwrite marks: 256 bits, one per 4 MiB region of the data (bit `r % 8`
//!         of byte `56 + r / 8` is region `r`, bytes `r * 4 MiB .. (r + 1) * 4 MiB`)
//! 88..92  CRC32 of bytes 0..88
//! ```
//!
//! Format 1 (written by older chunkservers, still read) is the same up to byte 56 and
//! ends there with the CRC32 of bytes 0..56 at 56..60; it has no overwrite marks (a
//! format-1 header decodes with none set). The CRC's place follows from the format
//! field, which the CRC covers.
//!
//! Header writes alternate between the two slots by sequence number (`seq % 2`), and each
//! is followed by an fsync, so a write torn by a crash leaves the other slot, holding the
//! previous durable header, intact. [`Header::newest`] picks the valid slot with the
//! highest sequence number.
//!
//! A `Writing` replica's length is normally recovered at start-up by checking the data
//! past `length` against the checksum table (hsynced data may be ahead of the last
//! durable header). A *capped* header forbids that: it is written first when a replica
//! is cut shorter, while the cut-off bytes and their checksums may still be in the
//! file, so a crash in the middle of the cut can never bring them back.
//!
//! The *tail CRC* lets a header vouch for its own partial last block: the checksum
//! table's entry for that block moves on with every later append (and may reach the
//! disk before the appended bytes do), so after a crash only the header still knows
//! the CRC of the data up to its length.
//!
//! An hsync's header is written after its flush and reaches the disk with the next
//! one, so each hsync also writes a [`SyncRecord`] (length and tail CRC) *inside* its
//! flush, at byte 2048 of the slot page of the header *before* it (the page that
//! flush carries anyway, since that header was written after the previous flush; so
//! the record costs no extra page):
//!
//! ```text
//! 0..8    magic "STAMPSYN"
//! 8..16   chunk handle
//! 16..24  chunk version
//! 24..32  length made durable by the hsync
//! 32..40  sequence number (of the hsync's header)
//! 40..44  tail CRC of that length
//! 44..48  CRC32 of bytes 0..44
//! ```
//!
//! Start-up recovery may extend a replica past its header to a record's length when
//! the data bears the record out; a record never shortens a replica.
//!
//! *Overwrite marks* ([`Marks`]) make in-place writes (an overwrite stream, DESIGN.md
//! "Writes at any offset") crash safe: such a write changes a block's data and its
//! table entry in two places, and a crash may persist one without the other. Before
//! the first in-place write into a region whose mark is not durable yet, the store
//! writes and flushes a header with the mark set; start-up recovery then recomputes a
//! marked block whose CRC does not match instead of calling the replica corrupt. Marks
//! stay set in every header until one is written after a flush of the whole file
//! (end of the overwrite stream, finalize, bump, truncate, cut): [`Header::next`] keeps
//! them, [`Header::unmarked`] clears them. An hsync's header keeps them.

use crate::error::{Error, Result};
use stampfs_proto::{ChunkHandle, ChunkVersion, ReplicaState, CHECKSUM_BLOCK};

/// Size of one header slot.
pub const SLOT_SIZE: u64 = 4096;
/// Where the checksum table starts.
pub const TABLE_OFFSET: u64 = 2 * SLOT_SIZE;
/// Largest chunk a replica file can hold.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// Checksum block size as a `u64`.
pub const BLOCK: u64 = CHECKSUM_BLOCK as u64;
/// Bytes of the checksum table.
pub const TABLE_LEN: u64 = (MAX_CHUNK_SIZE / BLOCK) * 4;
/// Where data starts (4 KiB aligned).
pub const DATA_OFFSET: u64 = TABLE_OFFSET + TABLE_LEN;
/// Format version written into every header.
pub const FORMAT_VERSION: u32 = 2;
/// The format before overwrite marks (still read).
pub const FORMAT_V1: u32 = 1;
/// Bytes of data per overwrite mark.
pub const REGION: u64 = 4 << 20;
/// Overwrite marks of a header (one per region of the largest chunk).
pub const REGIONS: usize = (MAX_CHUNK_SIZE / REGION) as usize;

const MAGIC: &[u8; 8] = b"STAMPCHK";
/// Where the header CRC sits in format 1 (and where the marks start in format 2).
const CRC_AT_V1: usize = 56;
const MARKS_AT: usize = 56;
const MARKS_LEN: usize = REGIONS / 8;
/// Where the header CRC sits in format 2.
const CRC_AT: usize = MARKS_AT + MARKS_LEN;
const STATE_WRITING: u8 = 1;
const STATE_FINALIZED: u8 = 2;
const FLAG_CAPPED: u8 = 1;
const FLAG_TAIL: u8 = 2;

const _: () = assert!(DATA_OFFSET % 4096 == 0);
const _: () = assert!(CRC_AT == 88 && CRC_AT + 4 <= HEAD_LEN);
const _: () = assert!(REGION % BLOCK == 0 && REGIONS == 256);
const _: () = assert!(HEAD_LEN as u64 <= RECORD_AT && RECORD_AT + RECORD_LEN as u64 <= SLOT_SIZE);

/// Bytes of a header write (one sector; see [`Header::encode_head`]).
pub const HEAD_LEN: usize = 512;
/// Where a sync record sits inside a header slot page.
pub const RECORD_AT: u64 = 2048;
/// Bytes of an encoded sync record.
pub const RECORD_LEN: usize = 48;
const RECORD_MAGIC: &[u8; 8] = b"STAMPSYN";

/// What one hsync made durable, written inside its own flush (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncRecord {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub length: u64,
    /// The sequence number of the header the hsync writes after its flush.
    pub seq: u64,
    pub tail_crc: u32,
}

impl SyncRecord {
    /// File offset of the record of the hsync whose header has sequence `seq`: in the
    /// slot page of header `seq - 1`.
    pub fn offset(seq: u64) -> u64 {
        (seq.wrapping_add(1) % 2) * SLOT_SIZE + RECORD_AT
    }

    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[0..8].copy_from_slice(RECORD_MAGIC);
        out[8..16].copy_from_slice(&self.handle.0.to_le_bytes());
        out[16..24].copy_from_slice(&self.version.0.to_le_bytes());
        out[24..32].copy_from_slice(&self.length.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        out[40..44].copy_from_slice(&self.tail_crc.to_le_bytes());
        let crc = crc32fast::hash(&out[..44]);
        out[44..48].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The record in `bytes`, or `None` when there is none (zeros, torn, garbage).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let b = bytes.get(..RECORD_LEN)?;
        if &b[0..8] != RECORD_MAGIC {
            return None;
        }
        let u64_at = |at: usize| {
            let mut v = [0u8; 8];
            v.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(v)
        };
        let u32_at = |at: usize| {
            let mut v = [0u8; 4];
            v.copy_from_slice(&b[at..at + 4]);
            u32::from_le_bytes(v)
        };
        if u32_at(44) != crc32fast::hash(&b[..44]) {
            return None;
        }
        let length = u64_at(24);
        (length <= MAX_CHUNK_SIZE).then(|| Self {
            handle: ChunkHandle(u64_at(8)),
            version: ChunkVersion(u64_at(16)),
            length,
            seq: u64_at(32),
            tail_crc: u32_at(40),
        })
    }

    /// The records in the two slot pages (`slots`: the file's first 8 KiB).
    pub fn both(slots: &[u8]) -> Vec<Self> {
        (0..2u64)
            .filter_map(|seq| {
                let at = Self::offset(seq) as usize;
                slots.get(at..).and_then(Self::decode)
            })
            .collect()
    }
}

/// Offset in the file of checksum table entry `block`.
pub fn table_entry_offset(block: u64) -> u64 {
    TABLE_OFFSET + 4 * block
}

/// The overwrite marks of a header: one bit per [`REGION`] of the data (see the
/// module overview). A mark set means an in-place write into that region may have
/// been interrupted by a crash; start-up recovery trusts the region's data over its
/// checksum table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Marks([u8; MARKS_LEN]);

impl Marks {
    /// No region marked.
    pub const NONE: Marks = Marks([0; MARKS_LEN]);

    /// The region holding data byte `offset` (clamped to the last region).
    pub fn region_of(offset: u64) -> usize {
        ((offset / REGION) as usize).min(REGIONS - 1)
    }

    /// The marks of every region that the data bytes `start..end` touch (none when the
    /// range is empty).
    pub fn of_range(start: u64, end: u64) -> Marks {
        let mut m = Marks::NONE;
        if end > start {
            for r in Self::region_of(start)..=Self::region_of(end - 1) {
                m.set(r);
            }
        }
        m
    }

    /// Sets the mark of region `r`.
    pub fn set(&mut self, r: usize) {
        if let Some(b) = self.0.get_mut(r / 8) {
            *b |= 1 << (r % 8);
        }
    }

    /// Whether region `r` is marked.
    pub fn contains(&self, r: usize) -> bool {
        self.0.get(r / 8).is_some_and(|b| b & (1 << (r % 8)) != 0)
    }

    /// Whether the region of data byte `offset` is marked.
    pub fn covers(&self, offset: u64) -> bool {
        self.contains(Self::region_of(offset))
    }

    /// Whether no region is marked.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|b| *b == 0)
    }

    /// Every region marked here or in `other`.
    #[must_use]
    pub fn union(self, other: Marks) -> Marks {
        let mut out = self;
        for (a, b) in out.0.iter_mut().zip(other.0) {
            *a |= b;
        }
        out
    }

    /// The regions marked in `self` but not in `other`.
    #[must_use]
    pub fn minus(self, other: Marks) -> Marks {
        let mut out = self;
        for (a, b) in out.0.iter_mut().zip(other.0) {
            *a &= !b;
        }
        out
    }

    /// How many regions are marked.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|b| b.count_ones()).sum()
    }

    /// The encoded marks (bit `r % 8` of byte `r / 8` is region `r`).
    pub fn to_bytes(self) -> [u8; MARKS_LEN] {
        self.0
    }
}

/// One replica header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub handle: ChunkHandle,
    pub version: ChunkVersion,
    pub state: ReplicaState,
    /// Data bytes made durable when this header was written.
    pub length: u64,
    /// Increases with every header write; picks the slot.
    pub seq: u64,
    /// The data ends at `length` exactly: start-up recovery must not look past it.
    pub capped: bool,
    /// CRC32 of the data from the start of the block holding `length` up to `length`
    /// (0 when `length` is block aligned); `None` in headers written without it.
    pub tail_crc: Option<u32>,
    /// Regions an in-place write may have left torn (see [`Marks`]).
    pub marks: Marks,
}

impl Header {
    /// The first header of a new replica.
    pub fn new(
        handle: ChunkHandle,
        version: ChunkVersion,
        state: ReplicaState,
        length: u64,
    ) -> Self {
        Self {
            handle,
            version,
            state,
            length,
            seq: 1,
            capped: false,
            tail_crc: None,
            marks: Marks::NONE,
        }
    }

    /// The header that replaces this one (next sequence number, so the other slot).
    /// It keeps the overwrite marks: only a header written after a flush of the whole
    /// file may drop them ([`Header::unmarked`]).
    #[must_use]
    pub fn next(&self, version: ChunkVersion, state: ReplicaState, length: u64) -> Self {
        Self {
            handle: self.handle,
            version,
            state,
            length,
            seq: self.seq.wrapping_add(1),
            capped: false,
            tail_crc: None,
            marks: self.marks,
        }
    }

    /// This header with `marks` set as well.
    #[must_use]
    pub fn with_marks(self, marks: Marks) -> Self {
        Self {
            marks: self.marks.union(marks),
            ..self
        }
    }

    /// This header without overwrite marks: for a header written after a flush of the
    /// whole file, which made every in-place write before it whole.
    #[must_use]
    pub fn unmarked(self) -> Self {
        Self {
            marks: Marks::NONE,
            ..self
        }
    }

    /// This header with the tail CRC of its length.
    #[must_use]
    pub fn with_tail(self, tail_crc: u32) -> Self {
        Self {
            tail_crc: Some(tail_crc),
            ..self
        }
    }

    /// This header with the cap set (see the module overview).
    #[must_use]
    pub fn capped(self) -> Self {
        Self {
            capped: true,
            ..self
        }
    }

    /// File offset of the slot this header is written to.
    pub fn slot_offset(&self) -> u64 {
        (self.seq % 2) * SLOT_SIZE
    }

    /// The slot's bytes (a whole 4 KiB slot, zero padded).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; SLOT_SIZE as usize];
        out[0..8].copy_from_slice(MAGIC);
        out[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(CHECKSUM_BLOCK as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.handle.0.to_le_bytes());
        out[24..32].copy_from_slice(&self.version.0.to_le_bytes());
        out[32..40].copy_from_slice(&self.length.to_le_bytes());
        out[40..48].copy_from_slice(&self.seq.to_le_bytes());
        out[48] = match self.state {
            ReplicaState::Writing => STATE_WRITING,
            ReplicaState::Finalized => STATE_FINALIZED,
        };
        out[49] =
            (u8::from(self.capped) * FLAG_CAPPED) | (u8::from(self.tail_crc.is_some()) * FLAG_TAIL);
        out[50..54].copy_from_slice(&self.tail_crc.unwrap_or(0).to_le_bytes());
        out[MARKS_AT..MARKS_AT + MARKS_LEN].copy_from_slice(&self.marks.to_bytes());
        let crc = crc32fast::hash(&out[..CRC_AT]);
        out[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The bytes a store writes for this header: the first 512-byte sector of its
    /// slot (the header proper is 92 bytes), so a header write never touches the sync
    /// record further into the same slot page.
    pub fn encode_head(&self) -> Vec<u8> {
        let mut out = self.encode();
        out.truncate(HEAD_LEN);
        out
    }

    /// Checks a slot's magic and CRC without interpreting its fields (other than the
    /// format, which says where the CRC is). Returns the format.
    pub fn verify(slot: &[u8]) -> Result<u32> {
        if slot.len() < CRC_AT_V1 + 4 {
            return Err(corrupt(format!(
                "slot of {} bytes is too short",
                slot.len()
            )));
        }
        if &slot[0..8] != MAGIC {
            return Err(corrupt("bad magic".into()));
        }
        let format = u32::from_le_bytes([slot[8], slot[9], slot[10], slot[11]]);
        let crc_at = match format {
            FORMAT_V1 => CRC_AT_V1,
            FORMAT_VERSION => CRC_AT,
            other => return Err(corrupt(format!("unsupported format version {other}"))),
        };
        let Some(stored) = slot.get(crc_at..crc_at + 4) else {
            return Err(corrupt(format!(
                "slot of {} bytes is too short for format {format}",
                slot.len()
            )));
        };
        let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
        let computed = crc32fast::hash(&slot[..crc_at]);
        if stored != computed {
            return Err(corrupt(format!(
                "header CRC {stored:#010x} does not match {computed:#010x}"
            )));
        }
        Ok(format)
    }

    /// Decodes and validates a slot.
    pub fn decode(slot: &[u8]) -> Result<Self> {
        let format = Self::verify(slot)?;
        let u32_at = |at: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&slot[at..at + 4]);
            u32::from_le_bytes(b)
        };
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&slot[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let block = u32_at(12);
        if block as usize != CHECKSUM_BLOCK {
            return Err(corrupt(format!("unsupported checksum block size {block}")));
        }
        let state = match slot[48] {
            STATE_WRITING => ReplicaState::Writing,
            STATE_FINALIZED => ReplicaState::Finalized,
            other => return Err(corrupt(format!("unknown replica state {other}"))),
        };
        let flags = slot[49];
        if flags & !(FLAG_CAPPED | FLAG_TAIL) != 0 {
            return Err(corrupt(format!("unknown header flags {flags:#04x}")));
        }
        let length = u64_at(32);
        if length > MAX_CHUNK_SIZE {
            return Err(corrupt(format!("length {length} exceeds the chunk limit")));
        }
        Ok(Self {
            handle: ChunkHandle(u64_at(16)),
            version: ChunkVersion(u64_at(24)),
            state,
            length,
            seq: u64_at(40),
            capped: flags & FLAG_CAPPED != 0,
            tail_crc: (flags & FLAG_TAIL != 0).then(|| u32_at(50)),
            marks: if format == FORMAT_V1 {
                Marks::NONE
            } else {
                let mut m = [0u8; MARKS_LEN];
                m.copy_from_slice(&slot[MARKS_AT..MARKS_AT + MARKS_LEN]);
                Marks(m)
            },
        })
    }

    /// The newest valid header of the two slots, or why neither is valid.
    pub fn newest(slot0: &[u8], slot1: &[u8]) -> Result<Self> {
        match (Self::decode(slot0), Self::decode(slot1)) {
            (Ok(a), Ok(b)) => Ok(if b.seq > a.seq { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            (Err(a), Err(b)) => Err(corrupt(format!("slot 0: {a}; slot 1: {b}"))),
        }
    }
}

fn corrupt(reason: String) -> Error {
    Error::CorruptHeader { reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header::new(
            ChunkHandle(0xabc),
            ChunkVersion(7),
            ReplicaState::Writing,
            123_456,
        )
    }

    #[test]
    fn layout_constants() {
        assert_eq!(TABLE_LEN, 64 << 10);
        assert_eq!(DATA_OFFSET, 72 << 10);
        assert_eq!(table_entry_offset(1), TABLE_OFFSET + 4);
    }

    #[test]
    fn round_trip() {
        let h = header();
        let bytes = h.encode();
        assert_eq!(bytes.len(), SLOT_SIZE as usize);
        assert_eq!(Header::decode(&bytes).expect("decodes"), h);
        let f = h.next(ChunkVersion(8), ReplicaState::Finalized, 99);
        assert_eq!(Header::decode(&f.encode()).expect("decodes"), f);
        assert_ne!(f.slot_offset(), h.slot_offset());
    }

    #[test]
    fn the_cap_round_trips_and_the_next_header_drops_it() {
        let h = header().capped();
        assert!(h.capped);
        let bytes = h.encode();
        assert_eq!(bytes[49], FLAG_CAPPED);
        assert_eq!(Header::decode(&bytes).expect("decodes"), h);
        assert!(!h.next(ChunkVersion(7), ReplicaState::Writing, 1).capped);
        // Headers written before the flag existed (byte 49 zero) decode uncapped.
        assert!(!Header::decode(&header().encode()).expect("decodes").capped);
    }

    #[test]
    fn the_tail_crc_round_trips() {
        let h = header().with_tail(0xdead_beef);
        let bytes = h.encode();
        assert_eq!(bytes[49], FLAG_TAIL);
        assert_eq!(Header::decode(&bytes).expect("decodes"), h);
        assert_eq!(
            Header::decode(&h.capped().encode())
                .expect("decodes")
                .tail_crc,
            Some(0xdead_beef)
        );
        assert_eq!(
            h.next(ChunkVersion(7), ReplicaState::Writing, 1).tail_crc,
            None
        );
    }

    #[test]
    fn sync_records_round_trip_and_anything_else_is_none() {
        let r = SyncRecord {
            handle: ChunkHandle(9),
            version: ChunkVersion(4),
            length: 123_456,
            seq: 7,
            tail_crc: 0xabcd,
        };
        let bytes = r.encode();
        assert_eq!(SyncRecord::decode(&bytes), Some(r));
        for i in 0..RECORD_LEN {
            let mut b = bytes;
            b[i] ^= 0x10;
            assert_eq!(SyncRecord::decode(&b), None, "flip at {i}");
        }
        assert_eq!(SyncRecord::decode(&[0u8; RECORD_LEN]), None);
        assert_eq!(SyncRecord::decode(&bytes[..10]), None);
        // Records alternate between the two slot pages, away from the header bytes.
        assert_eq!(SyncRecord::offset(7), RECORD_AT);
        assert_eq!(SyncRecord::offset(8), SLOT_SIZE + RECORD_AT);
        // ...in the page of the header before it, not of its own header.
        let h = header();
        assert_ne!(
            SyncRecord::offset(h.seq) / SLOT_SIZE,
            h.slot_offset() / SLOT_SIZE
        );
        let mut slots = vec![0u8; 2 * SLOT_SIZE as usize];
        let at = SyncRecord::offset(r.seq) as usize;
        slots[at..at + RECORD_LEN].copy_from_slice(&bytes);
        assert_eq!(SyncRecord::both(&slots), vec![r]);
    }

    /// A format-1 slot, byte for byte as chunkservers before overwrite marks wrote it.
    fn format_1_slot(h: &Header) -> Vec<u8> {
        let mut out = vec![0u8; SLOT_SIZE as usize];
        out[0..8].copy_from_slice(b"STAMPCHK");
        out[8..12].copy_from_slice(&1u32.to_le_bytes());
        out[12..16].copy_from_slice(&65536u32.to_le_bytes());
        out[16..24].copy_from_slice(&h.handle.0.to_le_bytes());
        out[24..32].copy_from_slice(&h.version.0.to_le_bytes());
        out[32..40].copy_from_slice(&h.length.to_le_bytes());
        out[40..48].copy_from_slice(&h.seq.to_le_bytes());
        out[48] = 1;
        out[49] = if h.tail_crc.is_some() { 2 } else { 0 };
        out[50..54].copy_from_slice(&h.tail_crc.unwrap_or(0).to_le_bytes());
        let crc = crc32fast::hash(&out[..56]);
        out[56..60].copy_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn format_1_headers_still_decode_without_marks() {
        let h = header().with_tail(0x1234_5678);
        let old = format_1_slot(&h);
        assert_eq!(Header::decode(&old).expect("format 1 decodes"), h);
        assert!(Header::decode(&old).expect("decodes").marks.is_empty());
        assert_eq!(Header::verify(&old).expect("valid"), FORMAT_V1);
        // Every byte of a format-1 header is still covered by its CRC.
        for i in 0..60 {
            let mut b = old.clone();
            b[i] ^= 0x40;
            assert!(Header::decode(&b).is_err(), "flip at {i} went unnoticed");
        }
        // A newer header in the other slot wins over a format-1 one, and the reverse.
        let new = h.next(ChunkVersion(8), ReplicaState::Writing, 5);
        assert_eq!(Header::newest(&old, &new.encode()).expect("valid"), new);
        assert_eq!(
            Header::verify(&new.encode()).expect("valid"),
            FORMAT_VERSION
        );
    }

    #[test]
    fn marks_round_trip_and_only_next_keeps_them() {
        let mut m = Marks::NONE;
        for r in [0, 7, 8, 100, 255] {
            m.set(r);
        }
        let h = header().with_marks(m);
        let bytes = h.encode();
        assert_eq!(bytes[56], 0b1000_0001);
        assert_eq!(bytes[57], 0b0000_0001);
        assert_eq!(bytes[56 + 31], 0b1000_0000);
        let back = Header::decode(&bytes).expect("decodes");
        assert_eq!(back, h);
        assert_eq!(back.marks.count(), 5);
        assert!(back.marks.contains(100) && !back.marks.contains(101));
        let next = h.next(ChunkVersion(7), ReplicaState::Writing, 1);
        assert_eq!(next.marks, m, "the next header keeps the marks");
        assert!(next.unmarked().marks.is_empty());
        assert!(!h.with_tail(1).capped().marks.is_empty());
    }

    #[test]
    fn marks_cover_the_regions_a_range_touches() {
        assert!(Marks::of_range(5, 5).is_empty());
        let m = Marks::of_range(REGION - 1, REGION + 1);
        assert_eq!(m.count(), 2);
        assert!(m.covers(0) && m.covers(REGION) && !m.covers(2 * REGION));
        let all = Marks::of_range(0, MAX_CHUNK_SIZE);
        assert_eq!(all.count(), 256);
        assert!(all.covers(MAX_CHUNK_SIZE - 1));
        assert_eq!(Marks::region_of(MAX_CHUNK_SIZE + 5), REGIONS - 1);
        let a = Marks::of_range(0, 1);
        let b = Marks::of_range(REGION, REGION + 1);
        assert_eq!(a.union(b).minus(a), b);
        assert!(a.minus(a.union(b)).is_empty());
    }

    #[test]
    fn unknown_flags_are_rejected() {
        let mut b = header().encode();
        b[49] = 0x84;
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(Header::decode(&b).is_err());
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let bytes = header().encode();
        for i in 0..CRC_AT + 4 {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(Header::decode(&b).is_err(), "flip at {i} went unnoticed");
        }
    }

    #[test]
    fn torn_newest_slot_falls_back_to_the_previous_header() {
        let old = header();
        let new = old.next(ChunkVersion(8), ReplicaState::Writing, 0);
        let mut slots = [vec![0u8; 4096], vec![0u8; 4096]];
        slots[(old.slot_offset() / SLOT_SIZE) as usize] = old.encode();
        slots[(new.slot_offset() / SLOT_SIZE) as usize] = new.encode();
        assert_eq!(Header::newest(&slots[0], &slots[1]).expect("valid"), new);
        // Tear the newest slot: only its first 512 bytes reached the disk.
        let i = (new.slot_offset() / SLOT_SIZE) as usize;
        let mut torn = vec![0u8; 4096];
        torn[..20].copy_from_slice(&new.encode()[..20]);
        slots[i] = torn;
        let got = Header::newest(&slots[0], &slots[1]).expect("previous slot");
        assert_eq!(got, old);
        assert_eq!(got.version, ChunkVersion(7));
    }

    #[test]
    fn two_bad_slots_are_an_error() {
        let err = Header::newest(&[0u8; 4096], &[7u8; 4096]).unwrap_err();
        assert!(matches!(err, Error::CorruptHeader { .. }), "{err}");
    }

    #[test]
    fn garbage_fields_are_rejected_even_with_a_valid_crc() {
        let mut b = header().encode();
        b[48] = 9;
        let crc = crc32fast::hash(&b[..CRC_AT]);
        b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        assert!(Header::decode(&b).is_err());
    }
}
