//! The segment files of the group's log: their names, header (magic and the log id
//! before the first entry), the records in the operation log's framing, and reading
//! one back whole (`scan`) or one entry at a time (`Seg::read`).

use crate::error::{Error, Result};
use crate::oplog::zeros::ZeroAhead;
use crate::oplog::MAX_RECORD_LEN;
use crate::raft::disk::decode_entry;
use crate::raft::{Entry, NodeId};
use openraft::LogId;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// First bytes of every segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"STMPRLG1";
/// A segment is sealed and the next one started once it holds this many bytes.
pub const SEGMENT_BYTES: u64 = 64 << 20;
pub(super) const SEGMENT_PREFIX: &str = "log.";
/// Magic, previous log id (flag, term, node, index), CRC.
pub(super) const HEADER_LEN: usize = 8 + 1 + 24 + 4;
/// Bytes before a record's payload: len, crc, index.
pub(super) const RECORD_HEADER: usize = 16;

/// Where one entry is: its offset in its segment and its log id.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rec {
    pub(super) offset: u64,
    pub(super) len: u32,
    pub(super) log_id: LogId<NodeId>,
}

/// One segment file, open for reading and writing.
#[derive(Debug)]
pub(super) struct Seg {
    /// The file, its records ending at `z.pos`, zeros after them.
    pub(super) z: ZeroAhead,
    /// The index of its first entry (in its name).
    pub(super) first: u64,
    /// The log id of the entry before its first; `None` for the oldest segment of a log
    /// that starts at 0 or after a point not known (openraft may start a log anywhere).
    pub(super) prev: Option<LogId<NodeId>>,
    pub(super) recs: Vec<Rec>,
}

impl Seg {
    pub(super) fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.recs.last().map(|r| r.log_id).or(self.prev)
    }

    /// Cuts the file to `at` (dropping every record from there), writes zeros ahead
    /// again and syncs, size included.
    pub(super) fn cut(&mut self, at: u64) -> Result<()> {
        self.z.cut(at)?;
        self.recs.retain(|r| r.offset < at);
        Ok(())
    }

    /// Reads and decodes entry `i` of this segment, its CRC checked.
    pub(super) fn read(&self, i: usize) -> Result<Entry> {
        let r = self.recs[i];
        let mut buf = vec![0u8; r.len as usize];
        self.z
            .file
            .read_exact_at(&mut buf, r.offset)
            .map_err(self.z.io("read"))?;
        let crc = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
        if crc32fast::hash(&buf[8..]) != crc {
            return Err(Error::CorruptLog {
                path: self.z.path.clone(),
                offset: r.offset,
                reason: "CRC mismatch in an entry read back".into(),
            });
        }
        decode_entry(&buf[RECORD_HEADER..])
    }
}

pub(super) fn segment_name(first: u64) -> String {
    format!("{SEGMENT_PREFIX}{first:020}")
}

pub(super) fn encode_log_id(id: Option<LogId<NodeId>>) -> [u8; 25] {
    let mut out = [0u8; 25];
    if let Some(id) = id {
        out[0] = 1;
        out[1..9].copy_from_slice(&id.leader_id.term.to_be_bytes());
        out[9..17].copy_from_slice(&id.leader_id.node_id.to_be_bytes());
        out[17..25].copy_from_slice(&id.index.to_be_bytes());
    }
    out
}

/// Decodes what [`encode_log_id`] wrote; `None` inside for "no log id", `Err(reason)`
/// for a bad flag.
pub(super) fn decode_log_id(b: &[u8; 25]) -> std::result::Result<Option<LogId<NodeId>>, String> {
    let u = |at: usize| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[at..at + 8]);
        u64::from_be_bytes(x)
    };
    match b[0] {
        0 if b[1..].iter().all(|&x| x == 0) => Ok(None),
        1 => Ok(Some(LogId::new(
            openraft::CommittedLeaderId::new(u(1), u(9)),
            u(17),
        ))),
        f => Err(format!("bad log id flag {f}")),
    }
}

pub(super) fn segment_header(prev: Option<LogId<NodeId>>) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..8].copy_from_slice(SEGMENT_MAGIC);
    out[8..33].copy_from_slice(&encode_log_id(prev));
    let crc = crc32fast::hash(&out[..33]);
    out[33..].copy_from_slice(&crc.to_be_bytes());
    out
}

/// The segments in `dir`, oldest first, with the first index in their name.
pub(super) fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let list = |e| Error::io(format!("list {}", dir.display()), e);
    for entry in std::fs::read_dir(dir).map_err(list)? {
        let entry = entry.map_err(list)?;
        let name = entry.file_name();
        let Some(num) = name.to_str().and_then(|n| n.strip_prefix(SEGMENT_PREFIX)) else {
            continue;
        };
        if num.len() == 20 {
            if let Ok(first) = num.parse::<u64>() {
                out.push((first, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What reading one segment found.
pub(super) struct Scanned {
    pub(super) prev: Option<LogId<NodeId>>,
    pub(super) recs: Vec<Rec>,
    /// Where the good records end.
    pub(super) good: u64,
    /// Why the rest (from `good`) cannot be used, unless it is only zeros.
    pub(super) torn: Option<String>,
}

/// Reads segment `path` (first index `first`) whole.
pub(super) fn scan(path: &Path, first: u64) -> Result<Scanned> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let corrupt = |offset: u64, reason: String| Error::CorruptLog {
        path: path.to_path_buf(),
        offset,
        reason,
    };
    let unwritten = |why: &str| Scanned {
        prev: None,
        recs: Vec::new(),
        good: 0,
        torn: Some(why.into()),
    };
    if bytes.len() < HEADER_LEN {
        return Ok(unwritten("segment header cut short"));
    }
    let crc = u32::from_be_bytes([bytes[33], bytes[34], bytes[35], bytes[36]]);
    let header_ok = &bytes[..8] == SEGMENT_MAGIC && crc32fast::hash(&bytes[..33]) == crc;
    if !header_ok {
        // A crash inside `create_segment` before its sync can leave the file's size
        // without its bytes: a bad header over nothing but zeros was never used.
        if bytes[HEADER_LEN..].iter().all(|&b| b == 0)
            && (bytes[..HEADER_LEN].iter().all(|&b| b == 0) || &bytes[..8] == SEGMENT_MAGIC)
        {
            return Ok(unwritten("segment header never written"));
        }
        return Err(corrupt(
            0,
            "not a stampfs group log segment, or its header is damaged".into(),
        ));
    }
    let mut id = [0u8; 25];
    id.copy_from_slice(&bytes[8..33]);
    let prev = decode_log_id(&id).map_err(|r| corrupt(8, r))?;
    if let Some(p) = prev.filter(|p| p.index.checked_add(1) != Some(first)) {
        return Err(corrupt(
            8,
            format!("named for index {first} but follows index {}", p.index),
        ));
    }
    let mut recs = Vec::new();
    let mut at = HEADER_LEN;
    let mut torn = None;
    let mut next = first;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.iter().all(|&b| b == 0) {
            break; // the zeros written ahead
        }
        if rest.len() < RECORD_HEADER {
            torn = Some(format!("record header cut short at {at}"));
            break;
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if !(8..=MAX_RECORD_LEN + 8).contains(&len) || RECORD_HEADER + len - 8 > rest.len() {
            torn = Some(format!("record of {len} bytes at {at} runs past the end"));
            break;
        }
        let body = &rest[8..RECORD_HEADER + len - 8];
        if crc32fast::hash(body) != crc {
            torn = Some(format!("CRC mismatch at {at}"));
            break;
        }
        let mut ix = [0u8; 8];
        ix.copy_from_slice(&rest[8..16]);
        let index = u64::from_be_bytes(ix);
        if index != next {
            return Err(corrupt(
                at as u64,
                format!("entry {index} where {next} belongs"),
            ));
        }
        let entry = decode_entry(&body[8..])
            .map_err(|e| corrupt(at as u64, format!("entry {index}: {e}")))?;
        if entry.log_id.index != index {
            return Err(corrupt(
                at as u64,
                format!("entry {} framed as {index}", entry.log_id.index),
            ));
        }
        recs.push(Rec {
            offset: at as u64,
            len: (RECORD_HEADER + len - 8) as u32,
            log_id: entry.log_id,
        });
        at += RECORD_HEADER + len - 8;
        next = next
            .checked_add(1)
            .ok_or_else(|| corrupt(at as u64, "entries past the last index".into()))?;
    }
    let good = recs
        .last()
        .map_or(HEADER_LEN as u64, |r| r.offset + u64::from(r.len));
    Ok(Scanned {
        prev,
        recs,
        good,
        torn,
    })
}
