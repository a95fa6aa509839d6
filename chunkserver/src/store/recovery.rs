//! Start-up recovery of one replica file: which header counts, how long the data
//! really is, and finishing what a crash interrupted (see the store's durability rules
//! and DESIGN.md, "On-disk chunk replica").
//!
//! - both header slots invalid, a header naming another chunk, a finalized replica
//!   shorter on disk than its length, or a `Writing` replica whose data does not bear
//!   out its header: corrupt (the caller moves it aside);
//! - a `Writing` replica's length goes past its header to the longest sync record of
//!   the same chunk and version that the data bears out, then block by block as far
//!   as the checksum table vouches (never past a capped header or the file's end);
//!   what lies past the recovered length is dropped;
//! - an interrupted cut (capped header) is completed; a finalized replica is cut to
//!   its length;
//! - in a `Writing` replica whose header has overwrite marks, a block of a marked
//!   region below the header's length whose CRC does not match its table entry (or
//!   the partial last block, its tail CRC) is an in-place write torn by a crash, not
//!   corruption: its entry is recomputed from the data and the replica kept (logged
//!   with a count). Outside marked regions, and for sync records, the rules above
//!   are unchanged. Such a replica (and one a sync record carried past its header)
//!   then gets a durable header at its recovered length, without marks.

use super::{stale_table_entries, Disk, Replica};
use crate::checksum::{self, BlockCheck};
use crate::error::{Error, Result};
use crate::fdcache;
use crate::header::{
    self, Header, Marks, SyncRecord, BLOCK, DATA_OFFSET, HEAD_LEN, MAX_CHUNK_SIZE, RECORD_LEN,
    SLOT_SIZE, TABLE_LEN,
};
use stampfs_proto::{ChunkHandle, ReplicaState};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Loads the replica of `handle` at `path` at start-up (blocking), recovering its
/// length (see the module docs). The file is closed again when it returns: the replica
/// reopens it through the store's cache.
///
/// A finalized replica costs one read of its two header sectors; only a `Writing` one
/// has its sync records, checksum table and data read.
pub(super) fn load_replica(path: &Path, handle: ChunkHandle, disk: &Arc<Disk>) -> Result<Replica> {
    let io = |op| move |e| Error::io(op, path, e);
    let file = fdcache::open_replica(path).map_err(io("open"))?;
    // No readahead: a header read would otherwise pull in (and, in a sparse file,
    // zero-fill) up to 128 KiB per replica, most of the scan's cost.
    let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random);
    let file_len = file.metadata().map_err(io("stat"))?.len();
    // Both slots' header sectors in one read (slot 0's page, then slot 1's head).
    let mut heads = vec![0u8; SLOT_SIZE as usize + HEAD_LEN];
    let got = read_full_at(&file, &mut heads, 0).map_err(io("read header"))?;
    heads[got..].fill(0);
    let (s0, s1) = heads.split_at(SLOT_SIZE as usize);
    let header = Header::newest(&s0[..HEAD_LEN], s1)?;
    if header.handle != handle {
        return Err(Error::CorruptHeader {
            reason: format!("header names chunk {}", header.handle),
        });
    }
    let on_disk = file_len.saturating_sub(DATA_OFFSET).min(MAX_CHUNK_SIZE);
    let mut table = Vec::new();
    let mut repairs = Repairs::new(header.marks);
    // Whether a sync record carried the length past the header.
    let mut from_record = false;
    let (length, tail_crc) = match header.state {
        ReplicaState::Finalized => {
            if on_disk < header.length {
                return Err(Error::CorruptHeader {
                    reason: format!(
                        "finalized at {} bytes but the file holds {on_disk}",
                        header.length
                    ),
                });
            }
            let tail = match header.tail_crc {
                _ if header.length % BLOCK == 0 => 0,
                Some(t) => t,
                // A header written before tail CRCs: the table entry of its last block.
                None => {
                    let mut entry = [0u8; 4];
                    let at = header::table_entry_offset(checksum::block_of(header.length));
                    let got = read_full_at(&file, &mut entry, at).map_err(io("read checksums"))?;
                    entry[got..].fill(0);
                    u32::from_le_bytes(entry)
                }
            };
            (header.length, tail)
        }
        ReplicaState::Writing => {
            let mut slots = vec![0u8; 2 * SLOT_SIZE as usize];
            let got = read_full_at(&file, &mut slots, 0).map_err(io("read header"))?;
            slots[got..].fill(0);
            let mut table_bytes = vec![0u8; TABLE_LEN as usize];
            let got = read_full_at(&file, &mut table_bytes, header::TABLE_OFFSET)
                .map_err(io("read checksums"))?;
            table_bytes[got..].fill(0);
            table = checksum::parse_table(&table_bytes);
            // Every header's length was synced before the header was written, so data
            // that does not bear it out is corruption, never a torn write; except in a
            // region the header marks, where an in-place write may have been torn
            // between a block's data and its table entry: there the data wins.
            let Some(base_tail) =
                vouches(&file, &table, on_disk, &header, 0, &mut repairs).map_err(io("read"))?
            else {
                return Err(Error::CorruptHeader {
                    reason: format!(
                        "the data does not bear out the header's {} bytes at version {}",
                        header.length, header.version
                    ),
                });
            };
            for &(block, crc) in &repairs.entries {
                if let Some(e) = table.get_mut(block as usize) {
                    *e = crc;
                }
            }
            if header.capped {
                (header.length, base_tail)
            } else {
                let (length, tail) =
                    past_header(&file, &table, on_disk, &header, base_tail, &slots)
                        .map_err(io("read"))?;
                from_record = length > header.length;
                extend_length(&file, on_disk, &table, length, tail).map_err(io("read"))?
            }
        }
    };
    let mut replica = Replica {
        disk: disk.clone(),
        id: disk.cache.next_id(),
        header,
        header_durable: true,
        durable_length: header.length,
        length,
        tail_crc,
        behind: length,
        padded: on_disk,
    };
    if header.capped {
        replica
            .finish_cut(&file)
            .map_err(io("finish an interrupted cut"))?;
    }
    if header.state == ReplicaState::Writing && !header.capped {
        replica
            .forget_past_end(&file, &table, file_len)
            .map_err(io("drop what lies past the recovered length"))?;
    }
    if header.state == ReplicaState::Writing
        && !header.capped
        && (!header.marks.is_empty() || from_record)
    {
        replica
            .settle_at_load(&file, &repairs, from_record)
            .map_err(io("settle an interrupted overwrite or hsync"))?;
    }
    if header.state == ReplicaState::Finalized && file_len > DATA_OFFSET + header.length {
        // A crash between finalize's header and its cut left zeros (or a recovered
        // tail) past the final length: finish the cut.
        file.set_len(DATA_OFFSET + header.length)
            .and_then(|()| file.sync_all())
            .map_err(io("cut a finalized replica to its length"))?;
        replica.padded = header.length;
    }
    Ok(replica)
}

impl Replica {
    /// After start-up recovery of a `Writing` replica: checksum entries past the
    /// recovered length (left by appends a crash cut short) are zeroed and the file is
    /// cut to the length, so no later write can end up next to an old entry that
    /// vouches for bytes nobody wrote at this length (zeros written ahead by a later
    /// small hsync could otherwise match one). Writes only when something is there.
    fn forget_past_end(
        &mut self,
        file: &File,
        table: &[u32],
        file_len: u64,
    ) -> std::io::Result<()> {
        let first = checksum::block_of(self.length) as usize;
        let tail_stale =
            self.length % BLOCK != 0 && table.get(first).is_some_and(|e| *e != self.tail_crc);
        let later = if self.length % BLOCK == 0 {
            first
        } else {
            first + 1
        };
        let stale = tail_stale || table.iter().skip(later).any(|e| *e != 0);
        if stale {
            if let Some((offset, entries)) = stale_table_entries(self.length, self.tail_crc) {
                file.write_all_at(&entries, offset)?;
                file.sync_data()?;
            }
        }
        if file_len > DATA_OFFSET + self.length {
            file.set_len(DATA_OFFSET + self.length)?;
            self.padded = self.length;
        }
        if stale || file_len > DATA_OFFSET + self.length {
            file.sync_all()?;
            tracing::info!(chunk = %self.header.handle, length = self.length, "dropped what lay past the recovered length");
        }
        Ok(())
    }

    /// After start-up recovery of a `Writing` replica whose header has overwrite marks
    /// or whose length a sync record carried past its header: the table entries of
    /// marked blocks recomputed from their data are written, the file flushed, and a
    /// header with the recovered length and no marks written and flushed (blocking,
    /// at start-up). From then on the replica is as if its last stream had closed
    /// cleanly: a later in-place write marks its regions again, and no byte it
    /// counts is vouched for by a sync record alone (an in-place write could make the
    /// record's check fail after a crash).
    fn settle_at_load(
        &mut self,
        file: &File,
        repairs: &Repairs,
        from_record: bool,
    ) -> std::io::Result<()> {
        for &(block, crc) in &repairs.entries {
            file.write_all_at(&crc.to_le_bytes(), header::table_entry_offset(block))?;
        }
        file.sync_data()?;
        let next = self
            .header
            .next(self.header.version, ReplicaState::Writing, self.length)
            .with_tail(self.tail_crc)
            .unmarked();
        file.write_all_at(&next.encode_head(), next.slot_offset())?;
        file.sync_all()?;
        let recomputed = repairs.entries.len() + usize::from(repairs.tail);
        if recomputed > 0 {
            tracing::warn!(
                chunk = %next.handle,
                blocks = recomputed,
                marked_regions = self.header.marks.count(),
                length = self.length,
                "blocks torn by an interrupted overwrite recomputed from their data; replica kept"
            );
        } else {
            tracing::info!(
                chunk = %next.handle,
                marked_regions = self.header.marks.count(),
                from_record,
                length = self.length,
                "overwrite marks cleared at start-up"
            );
        }
        self.header = next;
        self.durable_length = next.length;
        self.behind = self.length;
        Ok(())
    }

    /// Completes a cut that a crash interrupted after its capped header (see
    /// [`Replica::cut_to`]): the data ends at the header's length; the bytes and
    /// checksums past it are removed and the header is rewritten uncapped (blocking,
    /// at start-up).
    fn finish_cut(&mut self, file: &File) -> std::io::Result<()> {
        let length = self.header.length;
        let in_block = length % BLOCK;
        let tail = if in_block == 0 {
            0
        } else {
            let start = checksum::block_start(checksum::block_of(length));
            let mut buf = vec![0u8; in_block as usize];
            let got = read_full_at(file, &mut buf, DATA_OFFSET + start)?;
            crc32fast::hash(&buf[..got])
        };
        if let Some((offset, entries)) = stale_table_entries(length, tail) {
            file.write_all_at(&entries, offset)?;
        }
        for seq in 0..2 {
            file.write_all_at(&[0; RECORD_LEN], SyncRecord::offset(seq))?;
        }
        file.sync_data()?;
        file.set_len(DATA_OFFSET + length)?;
        file.sync_all()?;
        let next = self
            .header
            .next(self.header.version, self.header.state, length)
            .with_tail(tail)
            .unmarked();
        file.write_all_at(&next.encode_head(), next.slot_offset())?;
        file.sync_all()?;
        tracing::info!(chunk = %next.handle, length, "finished a cut interrupted by a crash");
        self.header = next;
        self.durable_length = length;
        self.length = length;
        self.tail_crc = tail;
        self.behind = length;
        self.padded = length;
        Ok(())
    }
}

pub(super) fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Blocks of a header's claim that its overwrite marks let start-up recovery
/// recompute from their data (see [`vouches`]).
struct Repairs {
    /// The regions the header marks (none: every block must match).
    marks: Marks,
    /// Whole blocks whose table entry did not match, with the CRC of their data.
    entries: Vec<(u64, u32)>,
    /// Whether the partial last block did not match the header's tail CRC.
    tail: bool,
}

impl Repairs {
    fn new(marks: Marks) -> Self {
        Self {
            marks,
            entries: Vec::new(),
            tail: false,
        }
    }
}

/// Whether the data bears out `h`'s length: every whole block below it matches its
/// checksum entry, and the partial block matches the header's tail CRC (or, for a
/// header written without one, the entry covers at least that much). Returns the CRC
/// of the partial block (0 when aligned).
///
/// A block in a region `repairs` marks that does not match is taken as the data of an
/// in-place write torn by a crash: it counts as borne out, and its CRC is noted in
/// `repairs` (the bytes are all present, since a header never claims bytes that were
/// not flushed; they are, byte by byte, old or new).
///
/// Whole blocks below `checked` are taken as verified already (a claim past a header
/// that was itself borne out need not read them again).
fn vouches(
    file: &File,
    table: &[u32],
    on_disk: u64,
    h: &Header,
    checked: u64,
    repairs: &mut Repairs,
) -> std::io::Result<Option<u32>> {
    if h.length > on_disk {
        return Ok(None);
    }
    let last = checksum::block_of(h.length);
    let mut buf = vec![0u8; BLOCK as usize];
    for block in checksum::block_of(checked).min(last)..last {
        let start = checksum::block_start(block);
        let got = read_full_at(file, &mut buf, DATA_OFFSET + start)?;
        let stored = table.get(block as usize).copied().unwrap_or(0);
        if got < buf.len() {
            return Ok(None);
        }
        let crc = crc32fast::hash(&buf);
        if crc != stored {
            if !repairs.marks.covers(start) {
                return Ok(None);
            }
            repairs.entries.push((block, crc));
        }
    }
    let rem = (h.length % BLOCK) as usize;
    if rem == 0 {
        return Ok(Some(0));
    }
    let start = checksum::block_start(last);
    let want = ((on_disk - start).min(BLOCK)) as usize;
    let got = read_full_at(file, &mut buf[..want], DATA_OFFSET + start)?;
    if got < rem {
        return Ok(None);
    }
    let tail = crc32fast::hash(&buf[..rem]);
    let ok = match h.tail_crc {
        Some(t) if t == tail => true,
        Some(_) if repairs.marks.covers(start) => {
            repairs.tail = true;
            true
        }
        Some(_) => false,
        None => {
            match checksum::check_block(&buf[..got], table.get(last as usize).copied().unwrap_or(0))
            {
                BlockCheck::Full => true,
                BlockCheck::Prefix(n) => n >= rem,
                BlockCheck::Bad => false,
            }
        }
    };
    Ok(ok.then_some(tail))
}

/// How far a `Writing` replica's sync records take it past its (vouched) header: the
/// longest record of the same chunk and version that the data bears out, else the
/// header's own length. Returns the length and its tail CRC.
fn past_header(
    file: &File,
    table: &[u32],
    on_disk: u64,
    header: &Header,
    tail: u32,
    slots: &[u8],
) -> std::io::Result<(u64, u32)> {
    let mut records: Vec<SyncRecord> = SyncRecord::both(slots)
        .into_iter()
        .filter(|r| {
            r.handle == header.handle && r.version == header.version && r.length > header.length
        })
        .collect();
    records.sort_by_key(|r| std::cmp::Reverse(r.length));
    for r in records {
        let claim = header
            .next(r.version, ReplicaState::Writing, r.length)
            .with_tail(r.tail_crc);
        // Strict, marks or not: no in-place write touches bytes a record alone vouches
        // for without first making a header durable past them (see
        // `Replica::needs_durable_header`), so a record the data does not bear out is
        // one whose flush did not complete.
        let mut strict = Repairs::new(Marks::NONE);
        if let Some(t) = vouches(file, table, on_disk, &claim, header.length, &mut strict)? {
            tracing::info!(chunk = %r.handle, length = r.length, header = header.length, "an hsync's record carries the replica past its header");
            return Ok((r.length, t));
        }
    }
    Ok((header.length, tail))
}

/// The length of a `Writing` replica's valid data past a vouched `length` (with tail
/// CRC `tail`): blocks from the one holding `length` are checked in order against the
/// checksum table (appends after the last durable header); the first block that does
/// not match in full ends it at the longest prefix its entry covers, and nothing after
/// it counts. Never shorter than `length`. Returns the length and its tail CRC.
fn extend_length(
    file: &File,
    on_disk: u64,
    table: &[u32],
    length: u64,
    tail: u32,
) -> std::io::Result<(u64, u32)> {
    let mut best = (length, tail);
    let mut block = checksum::block_of(length);
    let mut buf = vec![0u8; BLOCK as usize];
    loop {
        let start = checksum::block_start(block);
        if start >= on_disk {
            return Ok(best);
        }
        let end = (start + BLOCK).min(on_disk);
        let want = (end - start) as usize;
        let got = read_full_at(file, &mut buf[..want], DATA_OFFSET + start)?;
        let stored = table.get(block as usize).copied().unwrap_or(0);
        let (found, more) = match checksum::check_block(&buf[..got], stored) {
            BlockCheck::Full if got == want && end % BLOCK == 0 => ((end, 0), true),
            BlockCheck::Full => ((start + got as u64, stored), false),
            BlockCheck::Prefix(n) => ((start + n as u64, stored), false),
            BlockCheck::Bad => return Ok(best),
        };
        if found.0 > best.0 {
            best = found;
        }
        if !more {
            return Ok(best);
        }
        block += 1;
    }
}
