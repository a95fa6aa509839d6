//! The operation log and checkpoints: how the master's metadata survives a crash.
//!
//! ```text
//! DIR/oplog.<first lsn, 20 digits>   segment := magic "STMPLOG1" | record*
//! record  := len:u32be | crc:u32be | lsn:u64be | payload[len - 8]
//! crc     := crc32(lsn | payload)
//! DIR/checkpoint := magic "STMPCKP1" | lsn:u64be | len:u64be | crc:u32be | payload[len]
//! ```
//!
//! Records are numbered by a log sequence number (LSN), contiguous from 1. Appending
//! and group commit are in `oplog/commit.rs`: the requests waiting for their records take
//! turns writing everything queued with one `fdatasync`, and each waits
//! ([`Oplog::wait_durable`]) before it is acknowledged.
//!
//! **Records overwrite zeros.** An `fdatasync` that grows a file must also commit the
//! new size (a journal commit on ext4); one that overwrites blocks already allocated
//! and written does not, and costs about half as much on this kind of disk (`stampfs
//! bench mount-metadata` measures both). A single-threaded client gets no batching, so
//! that is the cost of every namespace mutation it waits for. Segments are therefore
//! written ahead with zeros ([`PREALLOC`] at a time, synced) and records are written
//! over them: only the padding itself, once per [`PREALLOC`] of log, changes the size.
//! Replay reads a zero record header as the end of the written log
//! ([`ReplayStats::preallocated_bytes`]) and cuts the zeros of the newest segment
//! away, as it cuts a torn tail; a rotation and a clean close cut them too, so only
//! the newest segment of a crashed master ever has them.
//!
//! A checkpoint holds the whole state up to an LSN. It is written to a temp file,
//! fsynced, renamed over `DIR/checkpoint`, and the directory is fsynced. Before the
//! state is captured the log is rotated to a new segment starting at LSN+1
//! ([`Oplog::rotate`]), so once the checkpoint is durable every older segment can be
//! deleted ([`trim`]).
//!
//! [`replay`] reads the segments in order and hands every record after the checkpoint
//! to the caller. A torn tail (a short record or a CRC mismatch in the newest segment,
//! left by a crash in the middle of a write that was never acknowledged) is truncated
//! away with a warning; damage anywhere else is an error.
//!
//! One master at a time: [`DirLock`] holds an exclusive `flock` on `DIR/LOCK` for as
//! long as a master serves from `DIR`, so a second one fails at start
//! ([`Error::DirLocked`]) before it reads, truncates or appends to anything.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The one-master-per-directory lock, shared with the chunkserver (see
/// [`stampfs_proto::dirlock`]); [`Error`] maps its failure to [`Error::DirLocked`].
pub use stampfs_proto::dirlock::{DirLock, LOCK_FILE};

/// First bytes of every log segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"STMPLOG1";
/// First bytes of the checkpoint file.
pub const CHECKPOINT_MAGIC: &[u8; 8] = b"STMPCKP1";
/// Largest record payload accepted (checked before allocating on replay).
pub const MAX_RECORD_LEN: usize = 16 << 20;
/// Bytes before a record's payload: len, crc, lsn.
const RECORD_HEADER: usize = 16;
const SEGMENT_PREFIX: &str = "oplog.";
pub const CHECKPOINT_FILE: &str = "checkpoint";
const CHECKPOINT_TMP: &str = "checkpoint.tmp";
const CHECKPOINT_HEADER: usize = 8 + 8 + 8 + 4;
/// Zeros written ahead of the records at a time (see the module doc).
pub const PREALLOC: u64 = 1 << 20;
/// A batch that would come closer than this to the end of the zeros first writes
/// [`PREALLOC`] more.
const PREALLOC_MARGIN: u64 = 256 << 10;

/// Locks a mutex, recovering the data if a panicking thread poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fsyncs a directory, so that files created or renamed in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format!("fsync directory {}", dir.display()), e))
}

/// One record as it is written to a segment.
pub fn encode_record(lsn: u64, payload: &[u8]) -> Result<Vec<u8>> {
    if payload.len() > MAX_RECORD_LEN {
        return Err(Error::Codec {
            reason: format!(
                "log record of {} bytes exceeds {MAX_RECORD_LEN}",
                payload.len()
            ),
        });
    }
    let len = (8 + payload.len()) as u32;
    let lsn_bytes = lsn.to_be_bytes();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn_bytes);
    crc.update(payload);
    let mut out = Vec::with_capacity(RECORD_HEADER + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc.finalize().to_be_bytes());
    out.extend_from_slice(&lsn_bytes);
    out.extend_from_slice(payload);
    Ok(out)
}

fn segment_name(first_lsn: u64) -> String {
    format!("{SEGMENT_PREFIX}{first_lsn:020}")
}

/// The log segments in `dir`, oldest first, with the first LSN in their name.
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(num) = name.strip_prefix(SEGMENT_PREFIX) else {
            continue;
        };
        if let Ok(first) = num.parse::<u64>() {
            out.push((first, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// What [`replay`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// The highest LSN in the checkpoint or the log.
    pub last_lsn: u64,
    /// Records handed to the caller (after the checkpoint).
    pub applied: u64,
    /// Bytes cut off a torn tail.
    pub truncated_bytes: u64,
    /// Preallocated zeros cut off the newest segment (a master that stopped without
    /// closing its log; nothing torn).
    pub preallocated_bytes: u64,
    pub segments: usize,
}

/// Reads into `buf` until it is full or the file ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Replays every record with an LSN above `after_lsn` (the checkpoint's), in order.
/// A torn tail in the newest segment is truncated away and logged.
pub fn replay(
    dir: &Path,
    after_lsn: u64,
    mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<ReplayStats> {
    let segs = segments(dir)?;
    let mut stats = ReplayStats {
        last_lsn: after_lsn,
        segments: segs.len(),
        ..Default::default()
    };
    let mut prev: Option<u64> = None;
    for (i, (first, path)) in segs.iter().enumerate() {
        let last_segment = i + 1 == segs.len();
        let corrupt = |offset: u64, reason: String| Error::CorruptLog {
            path: path.clone(),
            offset,
            reason,
        };
        let file =
            File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let file_len = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        let mut r = BufReader::with_capacity(1 << 20, file);
        let mut magic = [0u8; 8];
        let n = read_full(&mut r, &mut magic)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        let mut offset = n as u64;
        // Why the rest of the segment (from `good`) cannot be used, if it cannot.
        let mut torn: Option<(u64, String)> = None;
        if n < magic.len() {
            torn = Some((0, "segment header is cut short".into()));
        } else if &magic != SEGMENT_MAGIC {
            return Err(corrupt(0, "not a stampfs log segment".into()));
        }
        let mut good = offset;
        let mut first_in_segment = true;
        // Where the preallocated zeros start, if the segment ends in them.
        let mut zeros: Option<u64> = None;
        while torn.is_none() {
            let mut head = [0u8; RECORD_HEADER];
            let n = read_full(&mut r, &mut head)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            if n == 0 {
                break;
            }
            if head.iter().all(|&b| b == 0) && rest_is_zero(&mut r)? {
                // The zeros written ahead of the records: the end of the written log.
                zeros = Some(good);
                break;
            }
            if n < RECORD_HEADER {
                torn = Some((good, format!("record header cut short after {n} bytes")));
                break;
            }
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            let mut lsn_bytes = [0u8; 8];
            lsn_bytes.copy_from_slice(&head[8..16]);
            let lsn = u64::from_be_bytes(lsn_bytes);
            if !(8..=MAX_RECORD_LEN + 8).contains(&len) {
                torn = Some((good, format!("impossible record length {len}")));
                break;
            }
            let payload_len = len - 8;
            if offset + RECORD_HEADER as u64 + payload_len as u64 > file_len {
                torn = Some((good, format!("record of {len} bytes runs past the end")));
                break;
            }
            let mut payload = vec![0u8; payload_len];
            let n = read_full(&mut r, &mut payload)
                .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
            if n < payload_len {
                torn = Some((good, "record payload cut short".into()));
                break;
            }
            let mut h = crc32fast::Hasher::new();
            h.update(&lsn_bytes);
            h.update(&payload);
            if h.finalize() != crc {
                torn = Some((good, "record checksum mismatch".into()));
                break;
            }
            offset += (RECORD_HEADER + payload_len) as u64;
            // Sequence checks: a well-framed record in the wrong place is corruption.
            if first_in_segment && lsn != *first {
                return Err(corrupt(
                    good,
                    format!("segment named for LSN {first} starts with LSN {lsn}"),
                ));
            }
            first_in_segment = false;
            match prev {
                Some(p) if lsn != p + 1 => {
                    return Err(corrupt(good, format!("LSN {lsn} follows LSN {p}")));
                }
                None if lsn > after_lsn + 1 => {
                    return Err(corrupt(
                        good,
                        format!(
                            "the log starts at LSN {lsn} but the checkpoint ends at {after_lsn}: records are missing"
                        ),
                    ));
                }
                _ => {}
            }
            prev = Some(lsn);
            if lsn > after_lsn {
                apply(lsn, &payload)?;
                stats.applied += 1;
                stats.last_lsn = lsn;
            }
            good = offset;
        }
        if let Some((at, reason)) = torn {
            if !last_segment {
                return Err(corrupt(at, reason));
            }
            let cut = file_len.saturating_sub(at);
            tracing::warn!(
                segment = %path.display(),
                offset = at,
                bytes = cut,
                %reason,
                "torn record at the tail of the operation log (never acknowledged); truncating it"
            );
            cut_at(path, at)?;
            stats.truncated_bytes += cut;
        } else if let Some(at) = zeros {
            if !last_segment {
                return Err(corrupt(
                    at,
                    "zeros where records should follow (only the newest segment may end in \
                     preallocated space)"
                        .into(),
                ));
            }
            tracing::debug!(segment = %path.display(), offset = at, "cutting the log's preallocated zeros");
            cut_at(path, at)?;
            stats.preallocated_bytes += file_len.saturating_sub(at);
        }
    }
    Ok(stats)
}

/// True when everything left in `r` is zero bytes (consumes it).
fn rest_is_zero(r: &mut impl Read) -> Result<bool> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = r
            .read(&mut buf)
            .map_err(|e| Error::io("read the operation log", e))?;
        if n == 0 {
            return Ok(true);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

/// Truncates a segment to `at` bytes, durably.
fn cut_at(path: &Path, at: u64) -> Result<()> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    f.set_len(at)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("truncate {}", path.display()), e))
}

/// Deletes the segments whose first LSN is below `keep_from` (they hold only records
/// a durable checkpoint covers), then fsyncs the directory.
pub fn trim(dir: &Path, keep_from: u64) -> Result<usize> {
    let mut removed = 0;
    for (first, path) in segments(dir)? {
        if first < keep_from {
            std::fs::remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            removed += 1;
        }
    }
    if removed > 0 {
        sync_dir(dir)?;
    }
    Ok(removed)
}

/// Writes the checkpoint durably: temp file, fsync, rename, directory fsync.
pub fn write_checkpoint(dir: &Path, lsn: u64, payload: &[u8]) -> Result<()> {
    let head = checkpoint_header(lsn, payload);
    write_durably(dir, CHECKPOINT_FILE, CHECKPOINT_TMP, &[&head, payload])
}

/// The header a checkpoint's payload follows (magic, LSN, length, CRC): the checkpoint
/// file is the two, and so is the master group's snapshot after its own header.
pub fn checkpoint_header(lsn: u64, payload: &[u8]) -> Vec<u8> {
    let mut head = Vec::with_capacity(CHECKPOINT_HEADER);
    head.extend_from_slice(CHECKPOINT_MAGIC);
    head.extend_from_slice(&lsn.to_be_bytes());
    head.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    head.extend_from_slice(&crc32fast::hash(payload).to_be_bytes());
    head
}

/// Writes `dir/name` as the concatenation of `parts`, durably: `dir/tmp` written and
/// fsynced, renamed over `name`, the directory fsynced.
pub fn write_durably(dir: &Path, name: &str, tmp: &str, parts: &[&[u8]]) -> Result<()> {
    let tmp = dir.join(tmp);
    let dst = dir.join(name);
    let io = |what: &str, e| Error::io(format!("{what} {}", tmp.display()), e);
    let mut f = File::create(&tmp).map_err(|e| io("create", e))?;
    for part in parts {
        f.write_all(part).map_err(|e| io("write", e))?;
    }
    f.sync_all().map_err(|e| io("write", e))?;
    drop(f);
    std::fs::rename(&tmp, &dst).map_err(|e| io("rename", e))?;
    sync_dir(dir)
}

/// Reads the checkpoint: `None` when there is none. A damaged checkpoint is an error
/// (the log before it may already be trimmed).
pub fn read_checkpoint(dir: &Path) -> Result<Option<(u64, Vec<u8>)>> {
    let path = dir.join(CHECKPOINT_FILE);
    let tmp = dir.join(CHECKPOINT_TMP);
    if tmp.exists() {
        // A checkpoint that never got renamed into place: the log still covers it.
        std::fs::remove_file(&tmp)
            .map_err(|e| Error::io(format!("remove {}", tmp.display()), e))?;
    }
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    if bytes == RAFT_MARKER {
        return Err(Error::CorruptCheckpoint {
            path,
            reason: "this directory was moved to the master group's log (DIR/raft); \
                     start the master with --log group"
                .into(),
        });
    }
    let (lsn, payload) = parse_checkpoint(&bytes, &path)?;
    Ok(Some((lsn, payload.to_vec())))
}

/// What `DIR/checkpoint` holds once the directory moved to the master group's log:
/// a binary that knows only the operation log stops on it (a damaged checkpoint)
/// instead of starting with an empty namespace.
pub const RAFT_MARKER: &[u8; 8] = b"STMPRAFT";

/// Checks a checkpoint's header against its payload: its LSN and payload.
pub fn parse_checkpoint<'a>(bytes: &'a [u8], path: &Path) -> Result<(u64, &'a [u8])> {
    let corrupt = |reason: &str| Error::CorruptCheckpoint {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    if bytes.len() < CHECKPOINT_HEADER || &bytes[..8] != CHECKPOINT_MAGIC {
        return Err(corrupt("missing or wrong header"));
    }
    let num = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&bytes[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let lsn = num(8);
    let len = num(16);
    let crc = u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
    let payload = &bytes[CHECKPOINT_HEADER..];
    if payload.len() as u64 != len {
        return Err(corrupt("length does not match the file size"));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    Ok((lsn, payload))
}

mod commit;
pub(crate) mod zeros;
pub use commit::{Durable, LogStats, Oplog};

/// Histograms of the log's durable writes, served as metrics: how long each write +
/// `fdatasync` took, and how many records each carried (group commit's batches).
/// Clones share them.
#[derive(Clone, Debug)]
pub struct LogTimings {
    pub sync_seconds: stampfs_metrics::prometheus_client::metrics::histogram::Histogram,
    pub batch_records: stampfs_metrics::prometheus_client::metrics::histogram::Histogram,
}

impl Default for LogTimings {
    fn default() -> Self {
        use stampfs_metrics::prometheus_client::metrics::histogram::{
            exponential_buckets, Histogram,
        };
        Self {
            // 20 µs to about 0.65 s.
            sync_seconds: Histogram::new(exponential_buckets(20e-6, 2.0, 16)),
            // 1 to 2048 records.
            batch_records: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
        }
    }
}

impl LogTimings {
    /// One durable write of `records` records that took `took`.
    pub fn observe(&self, records: u64, took: std::time::Duration) {
        self.sync_seconds.observe(took.as_secs_f64());
        self.batch_records.observe(records as f64);
    }
}

#[cfg(test)]
mod tests;
